"""Small scenarios built in code, for builder tests and hypothesis strategies."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hypothesis import strategies as st

from sim.model.routing import RoutingSpec
from sim.model.specs import (LinkSpec, MoESpec, ModelSpec, Placement, Scenario, Workload, load_hardware,
                       parse_variant)

ROOT = Path(__file__).resolve().parent.parent
TINY_HW = load_hardware(ROOT / "scenarios" / "tiny" / "tiny-gpu.toml")


def make_scenario(*, n_layer: int = 2, moe: bool = True, n_expert: int = 8, top_k: int = 2,
                  n_ff_exp: int = 32, d_model: int = 64, n_ff: int = 128, n_cpu_moe: int | None = None,
                  ffn_on_cpu: bool = False, pinned: bool = True, n_ubatch: int = 64,
                  h2d_gb_per_s: float = 10.0, event_semantics: str = "record_point",
                  n_gpu: int = 1, cache: int = 0, routing: RoutingSpec | None = None,
                  variants=("baseline", "prefetch_ungated", "prefetch_gated_512", "slots2"),
                  seed: int = 0) -> Scenario:
    """A toy model on the tiny GPU (1 TFLOP/s, 10 GB/s PCIe) with host-resident experts (MoE)
    or FFN weights (dense, ``ffn_on_cpu``)."""
    model = ModelSpec(
        name="toy", n_layer=n_layer, d_model=d_model, n_head=4, n_head_kv=2, head_dim=d_model // 4,
        n_vocab=256, n_ff=n_ff,
        moe=MoESpec(n_expert, top_k, n_ff_exp) if moe else None,
        group_types={"norm": "F32", "router": "F32"})
    hw = replace(TINY_HW, n_gpu=n_gpu, event_semantics=event_semantics,
                 h2d_pinned=LinkSpec(h2d_gb_per_s * 1e9, TINY_HW.h2d_pinned.latency_s),
                 h2d_pageable=LinkSpec(h2d_gb_per_s * 0.5e9, TINY_HW.h2d_pageable.latency_s, True))
    rules = ((r"ffn_(gate|up|down)\.weight$", "CPU"),) if ffn_on_cpu else ()
    placement = Placement(n_cpu_moe=n_layer if (moe and n_cpu_moe is None) else (n_cpu_moe or 0),
                          override_tensor=rules, pinned=pinned, ctx_size=4096,
                          expert_cache_experts=cache)
    return Scenario(name="toy", model=model, hardware=hw, placement=placement,
                    workload=Workload(n_prompt=(256,), n_gen=(4,), n_ubatch=n_ubatch, n_batch=max(n_ubatch, 2048),
                                      repetitions=2),
                    routing=routing or RoutingSpec(), variants=tuple(parse_variant(v) for v in variants),
                    seed=seed)


@st.composite
def scenarios(draw, moe: bool | None = None) -> Scenario:
    """Random small valid scenarios (MoE or dense with FFN on the CPU)."""
    is_moe = draw(st.booleans()) if moe is None else moe
    n_expert = draw(st.sampled_from([4, 8, 16, 32]))
    return make_scenario(
        n_layer=draw(st.integers(1, 3)), moe=is_moe, n_expert=n_expert,
        top_k=draw(st.integers(1, min(4, n_expert))), n_ff_exp=draw(st.sampled_from([16, 32, 64])),
        d_model=draw(st.sampled_from([32, 64, 128])), ffn_on_cpu=not is_moe,
        pinned=draw(st.booleans()), n_ubatch=draw(st.sampled_from([16, 32, 64, 128])),
        h2d_gb_per_s=draw(st.floats(1.0, 50.0)),
        event_semantics=draw(st.sampled_from(["record_point", "stream_tail"])),
        seed=draw(st.integers(0, 1000)))
