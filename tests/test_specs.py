"""Shipped scenario data and the TOML loaders.

* every shipped model, hardware profile and scenario loads;
* model files reproduce the parameter counts and file sizes llama-bench prints for the same
  GGUFs (public llama-bench tables: ``qwen3moe 30B.A3B Q4_K - Medium | 17.28 GiB | 30.53 B``,
  ``llama 8x7B Q4_K - Medium | 26.49 GiB | 46.70 B``, ``gpt-oss 20B MXFP4 MoE | 11.27 GiB |
  20.91 B``, ``gemma3 27B Q4_K - Medium | 15.40 GiB | 27.01 B``);
* tensor byte accounting against ggml block sizes;
* scenarios say what their comments claim (placement, tests, VRAM fit);
* malformed files under ``tests/data/bad/`` raise :class:`ScenarioError` naming file and field.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from sim.errors import PlacementError, ScenarioError
from sim.model.quant import bpw_of
from sim.model.specs import BenchTest, ModelSpec, load_hardware, load_model, load_scenario

ROOT = Path(__file__).resolve().parents[1]
SCEN = ROOT / "scenarios"
BAD = Path(__file__).resolve().parent / "data" / "bad"
GiB, MiB = 2**30, 2**20

MODEL_FILES = sorted((SCEN / "models").glob("*.toml")) + [SCEN / "tiny" / "tiny-moe.toml"]
HARDWARE_FILES = sorted((SCEN / "hardware").glob("*.toml")) + [SCEN / "tiny" / "tiny-gpu.toml"]
SCENARIO_FILES = sorted(SCEN.glob("*.toml")) + [SCEN / "tiny" / "tiny.toml"]


def _ids(paths):
    return [str(p.relative_to(SCEN)) for p in paths]


def _model(name: str) -> ModelSpec:
    return load_model(SCEN / "models" / f"{name}.toml")


def _scenario(name: str):
    return load_scenario(SCEN / f"{name}.toml")


# ------------------------------------------------------------------------------------------
# everything shipped loads
# ------------------------------------------------------------------------------------------


def test_the_shipped_files_exist():
    names = {p.name for p in MODEL_FILES + HARDWARE_FILES + SCENARIO_FILES}
    assert {"qwen3-30b-a3b.toml", "gpt-oss-20b.toml", "gemma3-27b.toml", "mixtral-8x7b.toml",
            "laguna-118b.toml", "rtx3090.toml", "rtx3090x2.toml", "rtx5090.toml",
            "h200-datasheet.toml", "default.toml", "laguna-2x3090.toml",
            "gpt-oss-20b-selective.toml", "gemma3-27b-ffn-cpu.toml", "mixtral-rtx5090.toml",
            "qwen3-30b-a3b-rtx3090.toml", "tiny.toml", "tiny-moe.toml", "tiny-gpu.toml"} <= names


@pytest.mark.parametrize("path", MODEL_FILES, ids=_ids(MODEL_FILES))
def test_model_loads_and_cites_a_source(path):
    m = load_model(path)
    assert m.n_params > 0 and m.nbytes > 0
    assert len(m.source) > 20  # says where the numbers come from
    assert m.file == str(path)


@pytest.mark.parametrize("path", HARDWARE_FILES, ids=_ids(HARDWARE_FILES))
def test_hardware_loads_and_every_number_is_sourced(path):
    from sim.model.specs import _with_base

    hw = load_hardware(path)
    table = _with_base(tomllib.loads(path.read_text()), path)["hardware"]  # a base profile's numbers too
    numbers = {k for k, v in table.items() if isinstance(v, dict)}
    # every number written is sourced, and no number is left to a silent loader default
    assert set(hw.sources) == numbers
    every_number = {"vram_gb", "vram_reserved_gb", "gpu_tflops", "gemm_efficiency", "hbm_gb_per_s",
                    "hbm_efficiency", "kernel_us", "h2d_pinned_gb_per_s", "h2d_pinned_latency_us",
                    "h2d_pageable_gb_per_s", "h2d_pageable_latency_us", "d2h_gb_per_s",
                    "d2h_latency_us", "host_sync_us", "op_issue_us", "event_us", "cpu_gb_per_s",
                    "cpu_tflops"}
    if not hw.measured:  # a calibrated profile may leave unmeasured numbers to defaults
        assert numbers >= every_number
    if path.parent.name == "hardware" and not hw.measured:
        for key, src in hw.sources.items():
            # a datasheet citation or a stated assumption, nothing in between
            assert src.startswith("assumption") or any(
                w in src for w in ("NVIDIA", "whitepaper", "datasheet", "PCI-SIG")), (key, src)
    assert hw.h2d_pageable.bytes_per_s < hw.h2d_pinned.bytes_per_s
    assert hw.h2d_pageable.host_blocking and not hw.h2d_pinned.host_blocking


@pytest.mark.parametrize("path", SCENARIO_FILES, ids=_ids(SCENARIO_FILES))
def test_scenario_loads(path):
    scn = load_scenario(path)
    assert scn.variants and scn.workload.tests()
    pl = scn.placement
    deepest = max(t.n_depth + t.n_tokens for t in scn.workload.tests())
    assert pl.ctx_size >= deepest, "the KV cache must hold the deepest test"
    assert pl.n_cpu_moe <= scn.model.n_layer


# ------------------------------------------------------------------------------------------
# models against llama-bench's size and params columns of the same GGUF
# ------------------------------------------------------------------------------------------

# (file, llama-bench params in B, llama-bench size in GiB). Norms and biases are not modelled
# (< 0.1% of the weights), llama-bench rounds to 0.01.
LLAMA_BENCH = [
    ("qwen3-30b-a3b", 30.53, 17.28),
    ("mixtral-8x7b", 46.70, 26.49),
    ("gpt-oss-20b", 20.91, 11.27),
]


@pytest.mark.parametrize("name, params_b, size_gib", LLAMA_BENCH)
def test_params_and_size_match_llama_bench(name, params_b, size_gib):
    m = _model(name)
    assert m.n_params / 1e9 == pytest.approx(params_b, rel=0.005)
    assert m.nbytes / GiB == pytest.approx(size_gib, rel=0.01)


def test_gemma_counts_its_tied_output_once_in_llama_bench():
    """Gemma ties output to token_embd: llama.cpp duplicates the tensor (``TENSOR_DUPLICATED``,
    same name) on the GPU but llama-bench counts it once (27.01 B, 15.40 GiB)."""
    m = _model("gemma3-27b")
    assert m.tied_embeddings
    out = m.output_tensor
    emb = next(t for t in m.tensors if t.group == "embd")
    assert out.duplicate and out.name == emb.name == "token_embd.weight"
    assert (out.n_params, out.bpw, out.ggml_type) == (emb.n_params, emb.bpw, emb.ggml_type) == (
        emb.n_params, 6.5625, "Q6_K")
    assert not any(t.name == "output.weight" for t in m.tensors)
    assert (m.n_params, m.nbytes) == (27009002240, 16539843584)   # the H200 llama-bench rows
    assert m.size_label() == "15.40 GiB" and m.params_label() == "27.01 B"


def test_laguna_dims_reproduce_reported_totals():
    """117.6 B params (reported) and 30,774 MiB of whole expert tensors for the 28 host expert
    layers of the short-prompt graph (reported baseline_without_selective_copy)."""
    scn = _scenario("laguna-2x3090")
    m = scn.model
    # ModelSpec has one head count (48, the full-attention layers); the 36 sliding layers have
    # 72 query heads in the real model: add their q/o projections back for the real total.
    extra = 36 * 2 * m.d_model * (72 - 48) * m.head_dim
    assert (m.n_params + extra) / 1e9 == pytest.approx(117.6, rel=0.002)
    assert m.n_params / 1e9 == pytest.approx(117.6, rel=0.01)
    host_exps = [t for t in m.tensors if t.is_expert and scn.placement.host_resident(m, t)]
    assert len({t.layer for t in host_exps}) == 28
    assert sum(t.nbytes for t in host_exps) / MiB == pytest.approx(30774, rel=1e-6)
    assert not m.is_moe_layer(0) and all(m.is_moe_layer(i) for i in range(1, 48))


def test_attention_layouts():
    g = _model("gpt-oss-20b")
    assert [g.attn_window(i) for i in range(4)] == [128, 0, 128, 0]
    gm = _model("gemma3-27b")
    assert [gm.attn_window(i) for i in range(6)] == [1024] * 5 + [0]
    assert sum(gm.attn_window(i) == 0 for i in range(gm.n_layer)) == 10
    lg = _model("laguna-118b")
    assert sum(lg.attn_window(i) == 0 for i in range(lg.n_layer)) == 12
    q = _model("qwen3-30b-a3b")
    assert all(q.attn_window(i) == 0 for i in range(q.n_layer))
    # KV per token per layer: 2 (K and V) x kv heads x head_dim x 2 bytes (F16)
    assert q.kv_bytes_per_token(0) == 2 * 4 * 128 * 2
    assert lg.kv_bytes_per_token(3) == 4 * 1024


# ------------------------------------------------------------------------------------------
# tensor byte accounting
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ggml_type, bytes_per_block, block", [
    ("Q4_K", 144, 256), ("Q6_K", 210, 256), ("Q5_K", 176, 256), ("Q8_0", 34, 32),
    ("IQ4_NL", 18, 32), ("MXFP4", 17, 32), ("F16", 2, 1),
])
def test_bpw_is_block_bytes_over_block_size(ggml_type, bytes_per_block, block):
    assert bpw_of(ggml_type) == bytes_per_block * 8 / block


def test_bpw_examples():
    assert bpw_of("Q4_K") == 4.5
    assert bpw_of("MXFP4") == 4.25
    assert bpw_of("IQ4_NL") == 4.5
    assert bpw_of(5.53125) == 5.53125


def test_q4_k_m_mean_widths_follow_use_more_bits():
    """attn_v / ffn_down of Q4_K_M are Q6_K on llama.cpp's use_more_bits() layers, else Q4_K."""
    def use_more_bits(i, n):  # src/llama-quant.cpp
        return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2

    for name, group in (("qwen3-30b-a3b", "exps_down"), ("mixtral-8x7b", "exps_down"),
                        ("gemma3-27b", "ffn_down"), ("gemma3-27b", "attn_v"),
                        ("qwen3-30b-a3b", "attn_v")):
        m = _model(name)
        n = m.n_layer
        mean = sum(6.5625 if use_more_bits(i, n) else 4.5 for i in range(n)) / n
        assert m.bpw(group) == pytest.approx(mean, rel=1e-12), (name, group)


def test_qwen3_expert_bytes_per_layer():
    m = _model("qwen3-30b-a3b")
    per_mat = 128 * 2048 * 768  # experts x d_model x n_ff_exp
    layer = [t for t in m.tensors if t.layer == 7 and t.is_expert]
    assert sorted(t.name for t in layer) == ["blk.7.ffn_down_exps.weight", "blk.7.ffn_gate_exps.weight",
                                             "blk.7.ffn_up_exps.weight"]
    assert all(t.n_params == per_mat for t in layer)
    # layer 7 is no use_more_bits layer of 48: all three Q4_K (ggml row size: 144 B per 256)
    assert [t.ggml_type for t in layer] == ["Q4_K"] * 3
    assert sum(t.nbytes for t in layer) == 128 * 3 * 2048 * 768 * 144 // 256
    # layer 8 is one: ffn_down_exps Q6_K (210 B per 256)
    down8 = next(t for t in m.tensors if t.name == "blk.8.ffn_down_exps.weight")
    assert down8.ggml_type == "Q6_K" and down8.nbytes == 128 * 768 * 2048 * 210 // 256
    # over the model the group's mean is the TOML's number
    exps = [t for t in m.tensors if t.group == "exps_down"]
    assert sum(t.nbytes * 8 for t in exps) / sum(t.n_params for t in exps) == m.bpw("exps_down") == 5.53125
    # an explicit type fixes the group's type
    q4 = replace(m, quant_explicit={**m.quant_explicit, "exps_down": "Q4_K"})
    assert sum(t.nbytes for t in q4.tensors if t.layer == 8 and t.is_expert) == 128 * 3 * 2048 * 768 * 4.5 / 8
    # one expert of one tensor
    assert layer[0].bytes_per_mat == 2048 * 768 * 144 // 256


def test_gpt_oss_experts_are_mxfp4_and_the_rest_q8_0():
    m = _model("gpt-oss-20b")
    exps = [t for t in m.tensors if t.is_expert]
    assert len(exps) == 72 and all(t.bpw == 4.25 for t in exps)  # 72 MXFP4 tensors in the GGUF
    q8 = [t for t in m.tensors if t.ggml_type == "Q8_0"]
    assert len(q8) == 98  # 24 x 4 attention tensors + token_embd + output
    f32 = [t for t in m.tensors if t.ggml_type == "F32"]
    assert len(f32) == 289  # norms, routers, biases, sinks (the GGUF loader log)
    assert sum(t.nbytes for t in exps) == 24 * 3 * 32 * 2880 * 2880 * 17 // 32


# ------------------------------------------------------------------------------------------
# scenarios say what they claim
# ------------------------------------------------------------------------------------------


def test_default_scenario():
    scn = _scenario("default")
    # the H200 priced with llama.cpp's own kernels (sim.model.ggmlcost)
    assert Path(scn.hardware.file).name == "h200-llamacpp.toml" and scn.hardware.ggml is not None
    assert scn.model.name.startswith("qwen3moe 30B.A3B")
    assert scn.placement.n_cpu_moe == 24 and scn.placement.pinned
    assert [v.name for v in scn.variants] == ["baseline", "prefetch_ungated", "prefetch_gated_512", "slots3"]
    assert scn.workload.repetitions == 5  # llama-bench's default -r
    assert {"pp64", "pp512", "tg128", "pp2048"} <= {t.name for t in scn.workload.tests()}


def test_laguna_scenario():
    scn = _scenario("laguna-2x3090")
    pl, wl = scn.placement, scn.workload
    assert scn.hardware.n_gpu == 2 and pl.pinned and pl.ctx_size == 262144
    assert (wl.n_ubatch, wl.n_batch) == (2048, 2048)
    assert [t.name for t in wl.tests()] == ["pp34", "pp5000", "pp10000", "pp90000", "tg32"]
    assert [v.name for v in scn.variants] == ["baseline", "prefetch_ungated", "prefetch_gated_512",
                                             "baseline_without_selective_copy"]
    assert scn.variants[3].selective_copy is False and scn.variants[2].gate_min_batch == 512
    assert scn.routing.kind == "skewed"


def test_gpt_oss_selective_scenario_puts_exactly_the_experts_on_the_host():
    scn = _scenario("gpt-oss-20b-selective")
    m, pl = scn.model, scn.placement
    host = {t.name for t in m.tensors if pl.host_resident(m, t)}
    # -ot exps=CPU also takes the experts' biases (blk.N.ffn_up_exps.bias), as in llama.cpp
    assert host == {t.name for t in m.tensors if t.is_expert} | {"token_embd.weight"} | {
        f"blk.{i}.ffn_{p}_exps.bias" for i in range(24) for p in ("gate", "up", "down")}
    assert scn.workload.n_ubatch == 128 and [t.name for t in scn.workload.tests()] == ["pp2048"]
    assert [v.selective_copy for v in scn.variants] == [True, False]


def test_gemma_scenario_puts_exactly_the_ffn_on_the_host():
    scn = _scenario("gemma3-27b-ffn-cpu")
    m, pl = scn.model, scn.placement
    host = {t.group for t in m.tensors if pl.host_resident(m, t)}
    assert host == {"ffn_gate", "ffn_up", "ffn_down", "embd"}
    assert {t.name for t in scn.workload.tests()} == {
        "pp512", "pp2048", "pp512 @ d16384", "pp2048 @ d16384", "tg128", "tg128 @ d16384"}


def _min_free_bytes(scn, placement=None) -> float:
    from sim.model.vram import account
    return min(min(b.free_bytes for b in account(scn, v, placement)) for v in scn.variants)


FITTING = ["default", "gpt-oss-20b-selective", "gemma3-27b-ffn-cpu", "mixtral-rtx5090",
           "qwen3-30b-a3b-rtx3090"]


@pytest.mark.parametrize("name", FITTING)
def test_scenario_fits_in_vram_for_every_variant(name):
    assert _min_free_bytes(_scenario(name)) >= 0


def test_laguna_fits_in_vram():
    assert _min_free_bytes(_scenario("laguna-2x3090")) >= 0


@pytest.mark.parametrize("name", ["qwen3-30b-a3b-rtx3090", "mixtral-rtx5090"])
def test_n_cpu_moe_is_the_smallest_leaving_the_fit_target(name):
    """The files claim: the smallest n_cpu_moe leaving >= 1 GiB free for every variant
    (llama.cpp --fit's default --fit-target of 1024 MiB)."""
    scn = _scenario(name)
    n = scn.placement.n_cpu_moe
    assert n > 0
    assert _min_free_bytes(scn) >= 1 * GiB
    fewer = replace(scn.placement, n_cpu_moe=n - 1)
    try:
        left = _min_free_bytes(scn, fewer)
    except PlacementError:
        left = -1.0
    assert left < 1 * GiB


def test_tiny_scenario_is_tiny():
    scn = load_scenario(SCEN / "tiny" / "tiny.toml")
    m = scn.model
    assert m.n_layer == 2 and m.moe is not None
    exps = [t for t in m.tensors if t.is_expert]
    assert all(t.nbytes == 32 * 1024 for t in exps)  # 8 x 64 x 32 x 2 B
    assert all(scn.placement.host_resident(m, t) for t in exps)
    # prompt ops run on the GPU (>= 32 tokens), decode ops on the CPU (< 32)
    assert scn.workload.n_ubatch >= scn.placement.op_offload_min_batch > max(scn.workload.n_gen)


# ------------------------------------------------------------------------------------------
# malformed files name the file and the field
# ------------------------------------------------------------------------------------------

BAD_CASES = [
    # (fixture, loader, field named in the error)
    ("model_missing_field.toml", load_model, "model.n_layer"),
    ("model_wrong_type.toml", load_model, "model.n_layer"),
    ("model_unknown_field.toml", load_model, "model.n_layers"),
    ("model_negative_number.toml", load_model, "model.d_model"),
    ("model_topk_exceeds_experts.toml", load_model, "moe.n_expert_used"),
    ("model_unknown_quant_type.toml", load_model, "quant.attn_q"),
    ("model_unknown_arch.toml", load_model, "model.arch"),
    ("hardware_no_source.toml", load_hardware, "hardware.hbm_gb_per_s"),
    ("hardware_negative_number.toml", load_hardware, "hardware.vram_gb.value"),
    ("hardware_infinite_number.toml", load_hardware, "hardware.h2d_pinned_gb_per_s.value"),
    ("hardware_zero_busy_scale.toml", load_hardware, "hardware.executor_busy_scale.value"),
    ("hardware_empty_source.toml", load_hardware, "hardware.vram_gb.source"),
    ("hardware_efficiency_above_one.toml", load_hardware, "hardware.gemm_efficiency"),
    ("scenario_unknown_field.toml", load_scenario, "placement.n_cpu_mo"),
    ("scenario_bad_regex.toml", load_scenario, "placement.override_tensor[0]"),
    ("scenario_n_cpu_moe_too_large.toml", load_scenario, "placement.n_cpu_moe"),
    ("scenario_wrong_type.toml", load_scenario, "placement.ctx_size"),
    ("scenario_negative_number.toml", load_scenario, "workload.n_ubatch"),
    ("scenario_unknown_variant.toml", load_scenario, "variant[0].spec"),
    ("scenario_bad_host_memory.toml", load_scenario, "placement.host_memory"),
    ("scenario_missing_field.toml", load_scenario, "scenario.hardware"),
    ("scenario_missing_model_file.toml", load_scenario, "scenario.model"),
    ("scenario_tensor_split_too_long.toml", load_scenario, "placement.tensor_split"),
    ("scenario_tensor_split_inf.toml", load_scenario, "placement.tensor_split"),
    ("scenario_override_missing_gpu.toml", load_scenario, "placement.override_tensor[1]"),
    ("scenario_fit_target_negative.toml", load_scenario, "placement.fit_target_mib[0]"),
    ("scenario_fit_target_too_long.toml", load_scenario, "placement.fit_target_mib"),
    ("scenario_bad_expert_cache.toml", load_scenario, "variant[0].expert_cache"),
    ("scenario_cache_too_large.toml", load_scenario, "placement.expert_cache_experts"),
    ("hardware_reserved_exceeds_vram.toml", load_hardware, "hardware.vram_reserved_gb"),
    ("scenario_variant_without_spec.toml", load_scenario, "variant[0].spec"),
]


@pytest.mark.parametrize("fixture, loader, field", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_file_names_file_and_field(fixture, loader, field):
    path = BAD / fixture
    with pytest.raises(ScenarioError) as info:
        loader(path)
    err = info.value
    assert err.file == str(path)
    assert err.field == field
    assert str(path) in str(err) and f"'{field}'" in str(err)


def test_unknown_arch_is_refused_listing_the_accepted_values():
    from sim.model.specs import TOML_ARCHS

    with pytest.raises(ScenarioError) as info:
        load_model(BAD / "model_unknown_arch.toml")
    msg = str(info.value)
    assert "'qwen9'" in msg and all(a in msg for a in TOML_ARCHS) and "\n" not in msg
    for p in MODEL_FILES:  # every shipped model still loads, arch given or not
        assert load_model(p).arch in ("", *TOML_ARCHS)


def test_bad_toml_syntax_names_file_and_line():
    path = BAD / "bad_syntax.toml"
    for loader in (load_model, load_hardware, load_scenario):
        with pytest.raises(ScenarioError) as info:
            loader(path)
        assert info.value.file == str(path)
        assert "not valid TOML" in str(info.value) and "line 3" in str(info.value)


def test_every_bad_fixture_is_tested():
    tested = {c[0] for c in BAD_CASES} | {"bad_syntax.toml"}
    assert {p.name for p in BAD.glob("*.toml")} == tested


@pytest.mark.parametrize("content, words", [
    ("m,n,k,t_s\n1,2,3,abc\n", "column t_s has a non-numeric value 'abc' (data row 1)"),
    ("m,n,k,t_s\nx,2,3,1e-5\n", "column m has a non-numeric value 'x'"),
    ("m,n,k,t_s\n-1,2,3,1e-5\n", "negative, infinite or missing values in m, n, k"),
    ("m,n,k,t_s\n1,2,3,inf\n", "non-positive, infinite or missing t_s"),
    ("m,n,k,t_s\n1,2,3,0\n", "non-positive, infinite or missing t_s"),
    ("m,n,k,t_s\n0,2,3,1e-5\n", "column m must be >= 1"),
    ("m,n,k,t_s\n1,inf,3,1e-5\n", "negative, infinite or missing values in m, n, k"),
    ("m,n,k,t_s\n", "has no rows"),
    # a bad row after a good one is named by its data row (the header and comments not counted)
    ("m,n,k,t_s\n1,2,3,1e-5\n# note\n4,5,6,0\n", "non-positive, infinite or missing t_s 0 (data row 2)"),
    ("m,n,k,t_s\n1,2,3,1e-5\n4,5,6,\n", "non-positive, infinite or missing t_s blank (data row 2)"),
    ("m,n,k,t_s\n1,2,3,1e-5\n4,-5,6,1e-5\n", "negative, infinite or missing values in m, n, k: n is -5 in data row 2"),
    ("m,n,k,t_s\n1,2,3,1e-5\n4,,6,1e-5\n", "negative, infinite or missing values in m, n, k: n is blank in data row 2"),
    ("m,n,k,t_s\n1,2,3,1e-5\n4,5,0,1e-5\n", "column k must be >= 1 (data row 2;"),
    ("m,n,k,t_s\n1,2,3,1e-5\n1,2,4,1e-5\n1,2,3,2e-5\n",
     "the shape m=1 n=2 k=3 is timed twice (data rows 1 and 3); keep one row per shape"),
])
def test_a_bad_measured_table_names_the_profile_field_and_the_table(tmp_path, content, words):
    """A profile's gemm table with text, negative, zero or infinite dimensions, an infinite or
    zero time, or no rows is a one-line error naming the profile, the field and the table file,
    not a traceback."""
    import shutil

    root = Path(__file__).resolve().parent.parent
    dst = tmp_path / "h200.toml"
    shutil.copy(root / "scenarios" / "hardware" / "h200.toml", dst)
    shutil.copytree(root / "scenarios" / "hardware" / "h200", tmp_path / "h200")
    (tmp_path / "h200" / "gemm.csv").write_text(content)
    with pytest.raises(ScenarioError) as info:
        load_hardware(dst)
    assert info.value.file == str(dst) and info.value.field == "hardware.gemm_table"
    assert words in str(info.value) and "gemm.csv" in str(info.value)


def test_an_attention_table_accepts_kv_len_zero_but_no_zero_heads(tmp_path):
    """kv_len 0 is a measured point (no KV cache yet); a zero head count is not a shape."""
    import shutil

    root = Path(__file__).resolve().parent.parent
    dst = tmp_path / "h200.toml"
    shutil.copy(root / "scenarios" / "hardware" / "h200.toml", dst)
    shutil.copytree(root / "scenarios" / "hardware" / "h200", tmp_path / "h200")
    attn = tmp_path / "h200" / "attn.csv"
    assert (load_hardware(dst).attn_table.kv_len == 0).any()
    attn.write_text("n_tokens,kv_len,n_head,n_head_kv,head_dim,t_s\n1,0,0,4,128,1e-5\n")
    with pytest.raises(ScenarioError) as info:
        load_hardware(dst)
    assert info.value.field == "hardware.attn_table" and "column n_head must be >= 1" in str(info.value)


def test_an_attention_table_refuses_a_shape_timed_twice_naming_both_rows(tmp_path):
    """The same (n_tokens, kv_len, heads, head_dim) timed in two rows is refused, naming both
    data rows, not silently merged; the extra columns (t_host_s, model) are not part of the key."""
    import shutil

    root = Path(__file__).resolve().parent.parent
    dst = tmp_path / "h200.toml"
    shutil.copy(root / "scenarios" / "hardware" / "h200.toml", dst)
    shutil.copytree(root / "scenarios" / "hardware" / "h200", tmp_path / "h200")
    attn = tmp_path / "h200" / "attn.csv"
    lines = attn.read_text().splitlines()
    attn.write_text("\n".join(lines + [lines[3].replace("qwen3-30b-a3b", "other")]) + "\n")
    with pytest.raises(ScenarioError) as info:
        load_hardware(dst)
    n_tok, kv, nh, nkv, hd = lines[3].split(",")[:5]
    assert info.value.file == str(dst) and info.value.field == "hardware.attn_table"
    assert (f"the shape n_tokens={n_tok} kv_len={kv} n_head={nh} n_head_kv={nkv} head_dim={hd} is timed twice "
            f"(data rows 3 and {len(lines)})") in str(info.value)


def test_every_shipped_hardware_profile_loads():
    """The table readers' checks refuse none of the shipped profiles (nor their tables)."""
    root = Path(__file__).resolve().parent.parent / "scenarios" / "hardware"
    profiles = sorted(root.glob("*.toml"))
    assert len(profiles) >= 5
    for p in profiles:
        assert load_hardware(p).name


def test_a_hardware_profile_can_derive_from_a_base_in_its_folder(tmp_path):
    from sim.model.specs import load_hardware

    shipped_dir = Path(__file__).resolve().parent.parent / "scenarios" / "hardware"
    one = load_hardware(shipped_dir / "h200-llamacpp.toml")
    two = load_hardware(shipped_dir / "h200x2-llamacpp.toml")
    assert (one.n_gpu, two.n_gpu) == (1, 2)
    assert two.name == "2x H200 (llama.cpp kernels)"
    assert two.h2d_pinned == one.h2d_pinned and two.vram_bytes == one.vram_bytes
    assert two.ggml is not None and two.ggml.mask_s == one.ggml.mask_s
    (tmp_path / "a.toml").write_text('[hardware]\nbase = "b.toml"\nname = "a"\n')
    (tmp_path / "b.toml").write_text('[hardware]\nbase = "a.toml"\nname = "b"\n')
    with pytest.raises(ScenarioError, match="cycle") as ei:
        load_hardware(tmp_path / "a.toml")
    assert ei.value.field == "hardware.base"
    (tmp_path / "c.toml").write_text('[hardware]\nbase = "../x/h200.toml"\n')
    with pytest.raises(ScenarioError, match="same folder"):
        load_hardware(tmp_path / "c.toml")
    (tmp_path / "d.toml").write_text('[hardware]\nbase = "missing.toml"\n')
    with pytest.raises(ScenarioError, match="not found"):
        load_hardware(tmp_path / "d.toml")


def test_a_variant_label_is_case_blind_and_printed_in_its_canonical_form():
    """``--variant Baseline`` is the baseline (one row, not a second 'Baseline' beside it)."""
    from sim.model.specs import parse_variant

    assert parse_variant("Baseline").name == "baseline"
    assert parse_variant(" Prefetch_Gated_512+SLOTS3 ") == parse_variant("prefetch_gated_512+slots3")


def test_tensor_split_errors_word_one_split_as_llama_bench_writes_it():
    """One split's shares are ``/``-separated on llama-bench's command line (``-ts 3/2``);
    ``-ts 3,2`` would be two tests."""
    with pytest.raises(ScenarioError) as info:
        load_scenario(BAD / "scenario_tensor_split_inf.toml")
    msg = str(info.value)
    assert "-ts 3/2" in msg and "-ts 3,2" not in msg and info.value.field == "placement.tensor_split"


def test_an_unknown_table_lists_every_known_one(tmp_path):
    """A typo for an optional table (``[mo]`` for ``[moe]``) lists the optional tables too, also
    when the file does not have them."""
    p = tmp_path / "m.toml"
    p.write_text('[model]\nname = "m"\nn_layer = 2\nd_model = 64\nn_head = 4\nn_vocab = 100\nn_ff = 128\n'
                 '[mo]\nn_expert = 4\nn_expert_used = 2\nn_ff_exp = 32\n')
    with pytest.raises(ScenarioError) as info:
        load_model(p)
    assert info.value.field == "mo" and "known here: model, moe, quant" in str(info.value)
    hw = (SCEN / "tiny" / "tiny-gpu.toml").read_text() + "\n[ggm]\n"
    (tmp_path / "hw.toml").write_text(hw)
    with pytest.raises(ScenarioError) as info:
        load_hardware(tmp_path / "hw.toml")
    assert info.value.field == "ggm" and "ggml" in str(info.value) and "measured" in str(info.value)


def _llamacpp_profile(tmp_path: Path, old: str, new: str) -> Path:
    """A copy of the shipped h200-llamacpp profile (beside its kernel tables) with one line edited."""
    import shutil

    src = SCEN / "hardware" / "h200-llamacpp.toml"
    shutil.copytree(SCEN / "hardware" / "h200-llamacpp", tmp_path / "h200-llamacpp")
    text = src.read_text()
    assert old in text, old
    dst = tmp_path / "h200-llamacpp.toml"
    dst.write_text(text.replace(old, new, 1))
    return dst


def test_a_kernel_table_that_is_a_folder_names_the_field_and_the_profile(tmp_path):
    p = _llamacpp_profile(tmp_path, 'gpu_kernels = "h200-llamacpp/kernels-cuda.csv"', 'gpu_kernels = "h200-llamacpp"')
    with pytest.raises(ScenarioError) as info:
        load_hardware(p)
    err = info.value
    assert err.file == str(p) and err.field == "ggml.gpu_kernels"
    assert str(p) in str(err) and "'ggml.gpu_kernels'" in str(err) and "is a directory" in str(err)
    assert "\n" not in str(err)


@pytest.mark.parametrize("value, words", [
    ("-84", "split_us = -84 µs: must be >= 0"),
    ("1e12", "split_us = 1e+12 µs is not physical: must be 0 or 1e-06 µs to 3.6e+09 µs"),
])
def test_a_bad_cost_is_reported_as_written_with_its_unit(tmp_path, value, words):
    p = _llamacpp_profile(tmp_path, "split_us = { value = 13,", f"split_us = {{ value = {value},")
    with pytest.raises(ScenarioError) as info:
        load_hardware(p)
    assert info.value.field == "ggml.split_us" and words in str(info.value), str(info.value)
    assert "after unit scaling" not in str(info.value) and "e-05 s" not in str(info.value)


def test_an_out_of_range_rate_is_reported_in_the_unit_of_its_key(tmp_path):
    base = (SCEN / "tiny" / "tiny-gpu.toml").read_text()
    lines = [ln for ln in base.splitlines() if not ln.startswith("hbm_gb_per_s ")]
    p = tmp_path / "hw.toml"
    p.write_text("\n".join(lines).replace("[hardware]", "[hardware]\nhbm_gb_per_s = {value = 1e9, source = 'x'}", 1))
    with pytest.raises(ScenarioError) as info:
        load_hardware(p)
    assert info.value.field == "hardware.hbm_gb_per_s"
    assert "hbm_gb_per_s = 1e+09 GB/s is not physical: must be 1e-06 GB/s to 100000 GB/s" in str(info.value)


def test_a_variant_table_may_set_gate_0_the_ungated_prefetch_as_its_label_does(tmp_path):
    """[[variant]] gate_min_batch = 0 (the patch's -pwg 0: never gated) loads as prefetch_gated_0
    does; -1 is refused naming the field."""
    text = (Path("scenarios/tiny/tiny.toml").read_text().replace('[[variant]]\nspec = "prefetch_ungated"\n', "")
            + '\n[[variant]]\nname = "g0"\ngate_min_batch = 0\n')
    p = tmp_path / "s.toml"
    p.write_text(text.replace('model = "', 'model = "' + str(Path("scenarios/tiny").resolve()) + "/")
                 .replace('hardware = "', 'hardware = "' + str(Path("scenarios/tiny").resolve()) + "/"))
    g0 = next(v for v in load_scenario(p).variants if v.name == "g0")
    from sim.model.specs import parse_variant

    named = parse_variant("prefetch_gated_0")
    # one policy: the ungated prefetch, whatever the spelling
    assert (g0.prefetch_weights, g0.gate_min_batch) == (named.prefetch_weights, named.gate_min_batch) == (True, None)
    assert named == parse_variant("prefetch_ungated")
    # beside the ungated prefetch itself it is the same policy twice: refused
    p.write_text(p.read_text() + '\n[[variant]]\nspec = "prefetch_ungated"\n')
    with pytest.raises(ScenarioError, match="same policy"):
        load_scenario(p)
    p.write_text(p.read_text().replace('\n[[variant]]\nspec = "prefetch_ungated"\n', ""))
    p.write_text(p.read_text().replace("gate_min_batch = 0", "gate_min_batch = -1"))
    with pytest.raises(ScenarioError, match="gate_min_batch"):
        load_scenario(p)


def test_a_negative_ngl_in_a_scenario_offloads_every_layer_as_llama_bench_reads_it(tmp_path):
    """``ngl = -1`` (llama-bench's default) in a scenario is every layer on the GPU, as ``-ngl -1``
    on the command line and a llama-bench row's ``n_gpu_layers`` -1; 0 keeps them on the host."""
    text = (ROOT / "scenarios" / "default.toml").read_text()
    assert "\nngl = 999 " in text
    (tmp_path / "models").symlink_to(ROOT / "scenarios" / "models")
    (tmp_path / "hardware").symlink_to(ROOT / "scenarios" / "hardware")
    for value, expect in (("-1", 999), ("-7", 999), ("0", 0)):
        p = tmp_path / f"ngl{value}.toml"
        p.write_text(text.replace("\nngl = 999 ", f"\nngl = {value} "))
        assert load_scenario(p).placement.ngl == expect


def test_a_model_with_an_empty_name_is_refused(tmp_path):
    """The name is the rows' model column (llama-bench's model_type is never blank)."""
    from sim.model.specs import load_model

    src = (ROOT / "scenarios" / "models" / "gemma3-27b.toml").read_text()
    p = tmp_path / "m.toml"
    p.write_text(re.sub(r'(?m)^name = .*$', 'name = "  "', src, count=1))
    with pytest.raises(ScenarioError, match="must not be empty") as ei:
        load_model(p)
    assert ei.value.field == "model.name"


@pytest.mark.parametrize("key", ["name", "gpu_name"])
def test_a_hardware_profile_with_an_empty_name_is_refused(tmp_path, key):
    """A profile's name and GPU name are the rows' backend/gpu_info and the build line's profile:
    blank, the footer had named no profile (fresh-user round 11)."""
    from sim.model.specs import load_hardware

    src = (ROOT / "scenarios" / "hardware" / "rtx3090.toml").read_text()
    p = tmp_path / "h.toml"
    text = re.sub(rf'(?m)^{key} = .*$', f'{key} = ""', src, count=1)
    if key not in src.split("[hardware]", 1)[1].split("\n[", 1)[0]:
        text = text.replace("[hardware]\n", f'[hardware]\n{key} = ""\n', 1)
    p.write_text(text)
    with pytest.raises(ScenarioError, match="must not be empty") as ei:
        load_hardware(p)
    assert ei.value.field == f"hardware.{key}"


def test_a_scenario_with_an_empty_name_is_refused(tmp_path):
    src = (ROOT / "scenarios" / "default.toml").read_text()
    p = tmp_path / "s.toml"
    p.write_text(re.sub(r'(?m)^name = .*$', 'name = " "', src, count=1)
                 .replace('model = "models/', f'model = "{ROOT}/scenarios/models/', 1)
                 .replace('hardware = "hardware/', f'hardware = "{ROOT}/scenarios/hardware/', 1))
    with pytest.raises(ScenarioError, match="must not be empty") as ei:
        load_scenario(p)
    assert ei.value.field == "scenario.name"


@pytest.mark.parametrize("edit,field,match", [
    (lambda s: s[:s.index("[moe]")] + s[s.index("\n[", s.index("[moe]") + 1):] if "\n[" in s[s.index("[moe]") + 1:]
     else s[:s.index("[moe]")], "model.arch", "needs its \\[moe\\] table"),
    (lambda s: s.replace("[moe]\n", "[moe]\nn_layer_dense_lead = 48\n", 1), "moe.n_layer_dense_lead", "<= 47"),
    (lambda s: s.replace("[model]\n", "[model]\nsliding_window = 1024\n", 1), "model.swa_interval", "go together"),
])
def test_model_tomls_that_would_silently_become_another_model_are_refused(tmp_path, edit, field, match):
    """A MoE architecture without its [moe] table, every block a leading dense one, or a window
    without the layers that use it: each was simulated as another model (dense, or full
    attention) without a word."""
    p = tmp_path / "m.toml"
    p.write_text(edit((ROOT / "scenarios" / "models" / "qwen3-30b-a3b.toml").read_text()))
    with pytest.raises(ScenarioError, match=match) as ei:
        load_model(p)
    assert ei.value.field == field


def test_a_variant_with_an_empty_name_is_refused(tmp_path):
    """A variant's name is the rows' variant column and its build id: not empty."""
    src = (ROOT / "scenarios" / "default.toml").read_text()
    p = tmp_path / "s.toml"
    p.write_text(src.replace('spec = "slots3"', 'spec = "slots3"\nname = " "', 1)
                 .replace('model = "models/', f'model = "{ROOT}/scenarios/models/', 1)
                 .replace('hardware = "hardware/', f'hardware = "{ROOT}/scenarios/hardware/', 1))
    with pytest.raises(ScenarioError, match="must not be empty") as ei:
        load_scenario(p)
    assert ei.value.field.endswith("name")


@pytest.mark.parametrize("spelling, label", [
    ("gated512", "prefetch_gated_512"), ("GATED_0512", "prefetch_gated_512"), ("prefetch_gated_0", "prefetch_ungated"),
    ("prefetch", "prefetch_ungated"), ("slots03", "slots3"), ("cache_lru+slots3", "slots3+cache_lru"),
    ("whole_copy", "baseline_without_selective_copy"), (" Slots2 + prefetch_weights ", "prefetch_ungated+slots2"),
])
def test_one_policy_has_one_label_and_build_id(spelling, label):
    from sim.cli import variant_ids
    from sim.model.specs import parse_variant

    v, std = parse_variant(spelling), parse_variant(label)
    assert v == std and v.name == label
    assert variant_ids([v]) == {label: variant_ids([std])[label]}


@pytest.mark.parametrize("label", ["slots\uff12", "prefetch_gated_\uff15\uff11\uff12", "slots\u0662"])
def test_a_variant_label_takes_ascii_digits_only(label):
    """Python's \\d takes any Unicode digit: "slots２" (full width) ran as slots2 (fresh-user
    round 11); the counts are ASCII digits, as the flags' (std::stoi)."""
    from sim.model.specs import parse_variant

    with pytest.raises(ScenarioError, match="unknown variant"):
        parse_variant(label)


def _tiny_with_variant(tmp_path, body: str) -> Path:
    text = Path("scenarios/tiny/tiny.toml").read_text() + "\n[[variant]]\n" + body + "\n"
    p = tmp_path / "s.toml"
    p.write_text(text.replace('model = "', 'model = "' + str(Path("scenarios/tiny").resolve()) + "/")
                 .replace('hardware = "', 'hardware = "' + str(Path("scenarios/tiny").resolve()) + "/"))
    return p


@pytest.mark.parametrize("body, words", [
    ('name = "slots3"\nspec = "prefetch_ungated"', "standard label of another policy (slots3)"),
    ('name = "prefetch_gated_512"\nexpert_slots = 2', "standard label of another policy (prefetch_gated_512)"),
    ('name = "mine "\nspec = "slots2"', "no spaces around it"),
    ('name = "a\\nb"\nspec = "slots2"', "control characters"),
])
def test_a_variant_table_may_not_take_a_standard_label_of_another_policy_or_an_ambiguous_name(tmp_path, body, words):
    p = _tiny_with_variant(tmp_path, body)
    with pytest.raises(ScenarioError, match=re.escape(words)) as exc:
        load_scenario(p)
    assert "name" in str(exc.value.field) and str(p) in str(exc.value)


def test_a_variant_table_with_a_name_alone_is_refused_and_a_named_baseline_says_so(tmp_path):
    """A [[variant]] with a name and no spec nor policy field was the upstream scheduler under that
    name, its rows at +0.0 % (fresh-user round 11): refused, naming spec; a name with a spec, or
    with one policy field, still loads."""
    p = _tiny_with_variant(tmp_path, 'name = "x"')
    with pytest.raises(ScenarioError, match="neither spec nor a policy field") as exc:
        load_scenario(p)
    assert str(exc.value.field).endswith("spec") and str(p) in str(exc.value)
    names = [v.name for v in load_scenario(_tiny_with_variant(tmp_path, 'name = "x"\nspec = "slots5"')).variants]
    assert "x" in names
    v = [v for v in load_scenario(_tiny_with_variant(tmp_path, 'name = "x"\nexpert_slots = 5')).variants if v.name == "x"]
    assert v and v[0].expert_slots == 5


def test_a_variant_table_named_by_its_own_policy_in_another_spelling_gets_the_canonical_label(tmp_path):
    p = _tiny_with_variant(tmp_path, 'name = "gated512"\ngate_min_batch = 512')
    assert "prefetch_gated_512" in [v.name for v in load_scenario(p).variants]


def test_the_python_api_refuses_what_the_files_and_flags_refuse():
    """Fresh-user round 9: Workload and Placement built in Python took a ubatch of 0 tokens,
    0 repetitions (a NaN t/s), a negative n_cpu_moe, and ngl -1 as no layer offloaded (the CLI
    and a scenario read it as every layer, llama-bench's default)."""
    from dataclasses import replace as dc_replace

    from sim.engines.metrics import run_variant_test
    from sim.model.specs import Placement, Workload, parse_variant

    for kw in ({"n_ubatch": 0}, {"n_batch": 0}, {"repetitions": 0}, {"bench_repetitions": -1}):
        with pytest.raises(ValueError, match=f"Workload.{next(iter(kw))}"):
            Workload(**kw)
    with pytest.raises(ValueError, match="Placement.n_cpu_moe"):
        Placement(n_cpu_moe=-2)
    assert Placement(ngl=-1).ngl == 999 == Placement().ngl
    scn = load_scenario("scenarios/default.toml")
    with pytest.raises(ValueError, match="repetitions"):
        run_variant_test(scn, parse_variant("baseline"), BenchTest(0, 1, 0), repetitions=0)
    assert dc_replace(scn.placement, ngl=-5).ngl == 999


def test_a_sweep_names_its_baseline_among_its_variants_and_takes_variant_objects():
    from sim.model.specs import parse_variant
    from sim.views.crossover import parse_axis, sweep, with_baseline

    with pytest.raises(ScenarioError, match="baseline 'nope' is none of the variants"):
        with_baseline([parse_variant("slots2")], "nope")
    scn = load_scenario("scenarios/tiny/tiny.toml")
    v = parse_variant("prefetch_ungated")
    res = sweep(scn, [parse_axis("prompt=32,64")], [v], BenchTest(32, 0, 0), jobs=1)
    assert (res.speedup(v) == res.speedup("prefetch_ungated")).all()
    with pytest.raises(KeyError, match="no variant 'slots9'"):
        res.speedup(parse_variant("slots9"))


def test_the_python_api_round_10():
    """Fresh-user round 10: run_scenario(repetitions=0) ran the scenario's repetitions and
    variants=() returned []; Workload(n_prompt=(1.5,)) failed far away; Placement(ctx_size=-1)
    was taken; load_scenario("default") did not know the built-in names the CLI takes."""
    from sim.engines.metrics import run_scenario
    from sim.model.specs import Placement, Workload

    tiny = load_scenario("scenarios/tiny/tiny.toml")
    with pytest.raises(ValueError, match="repetitions: 0"):
        run_scenario(tiny, repetitions=0)
    with pytest.raises(ValueError, match="no variant"):
        run_scenario(tiny, variants=())
    with pytest.raises(ValueError, match="no test"):
        run_scenario(tiny, tests=[])
    with pytest.raises(ValueError, match="not a whole number of tokens"):
        Workload(n_prompt=(1.5,))
    with pytest.raises(ValueError, match="Placement.ctx_size"):
        Placement(ctx_size=-1)
    assert Placement(ctx_size=0).ctx_size == 0    # --ctx-size 0: each test its own context
    assert load_scenario("default").model.name == load_scenario("scenarios/default.toml").model.name
    with pytest.raises(ScenarioError, match="built-in scenario names"):
        load_scenario("no-such-scenario")


def test_the_python_api_round_11(tmp_path, monkeypatch):
    """Fresh-user round 11: load_model / load_hardware did not take the built-in names that
    load_scenario and the scenario files take; run_scenario(variants="baseline") raised an
    AttributeError; replace(scn, seed=-1) failed in numpy without naming the seed."""
    from dataclasses import replace

    from sim.engines.metrics import run_scenario
    from sim.model.specs import load_hardware, load_model, parse_variant

    monkeypatch.chdir(tmp_path)   # not the checkout: the names resolve to the shipped files
    assert load_model("qwen3-30b-a3b") == load_model(ROOT / "scenarios/models/qwen3-30b-a3b.toml")
    assert load_hardware("h200").name == load_hardware(ROOT / "scenarios/hardware/h200.toml").name
    with pytest.raises(ScenarioError, match="built-in model names") as exc:
        load_model("no-such-model")
    assert exc.value.field == "model"
    with pytest.raises(ScenarioError, match="built-in hardware names"):
        load_hardware("no-such-gpu")
    with pytest.raises(ScenarioError, match="file not found"):
        load_hardware(str(tmp_path / "missing.toml"))   # a path stays a path
    tiny = load_scenario(ROOT / "scenarios/tiny/tiny.toml")
    one = run_scenario(tiny, variants="slots2", repetitions=1, jobs=1)
    assert {r.variant for r in one} == {"slots2"}
    both = run_scenario(tiny, variants=["baseline", parse_variant("slots2")], repetitions=1, jobs=1)
    assert [r.tps.tolist() for r in both if r.variant == "slots2"] == [r.tps.tolist() for r in one]
    with pytest.raises(ScenarioError):
        run_scenario(tiny, variants=["no-such-policy"], repetitions=1)
    with pytest.raises(TypeError, match="variant labels"):
        run_scenario(tiny, variants=[3], repetitions=1)
    for bad in (-1, 1.5, True):
        with pytest.raises(ScenarioError, match="integer >= 0") as exc:
            replace(tiny, seed=bad)
        assert exc.value.field == "scenario.seed"


def test_the_python_api_round_12():
    """Fresh-user round 12: Placement took NaN, 24.7 and True for n_cpu_moe (and ran them as 0,
    25, 1), NaN for ngl; speedups() against a baseline none of the results ran gave all None;
    load_scenario("") said '. : is a directory'."""
    from dataclasses import replace

    import numpy as np

    from sim.engines.metrics import run_scenario, speedups

    scn = load_scenario("scenarios/tiny/tiny.toml")
    for field, bad in (("n_cpu_moe", float("nan")), ("n_cpu_moe", 24.7), ("n_cpu_moe", True), ("n_cpu_moe", "24"),
                       ("ngl", float("nan")), ("ngl", 10.5), ("ctx_size", 4096.0)):
        with pytest.raises(ValueError, match=f"Placement.{field}: expected an integer"):
            replace(scn.placement, **{field: bad})
    assert replace(scn.placement, n_cpu_moe=np.int64(2)).n_cpu_moe == 2
    res = run_scenario(scn, variants=["baseline", "slots2"], repetitions=1, jobs=1)
    assert all(v is not None for v in speedups(res).values())
    with pytest.raises(ValueError, match="'nope' is none of the results' variants"):
        speedups(res, "nope")
    with pytest.raises(ScenarioError, match="empty path"):
        load_scenario("")


@pytest.mark.parametrize("given, want", [("rocm", "ROCm"), ("ROCM", "ROCm"), ("cuda", "CUDA"), ("vulkan", "Vulkan"),
                                         ("Vulkn", None), ("", None)])
def test_a_profile_backend_is_one_of_llama_cpps_in_any_case(tmp_path, given, want):
    """Fresh-user round 13: backend = "rocm" ran with CUDA's pageable-copy semantics (the code
    compared with "ROCm") and listed its device as rocm0; "Vulkn" was printed as given. The name
    is matched in any case and printed as llama.cpp spells it; an unknown one is refused."""
    src = (ROOT / "scenarios" / "hardware" / "rtx3090.toml").read_text()
    p = tmp_path / "h.toml"
    p.write_text(src.replace("[hardware]\n", f'[hardware]\nbackend = "{given}"\n', 1))
    if want is None:
        with pytest.raises(ScenarioError, match="unknown backend") as exc:
            load_hardware(p)
        assert exc.value.field == "hardware.backend"
        return
    hw = load_hardware(p)
    assert hw.backend == want
    assert hw.h2d_pageable.host_blocking == (want != "ROCm")
