"""Plan builder: the ggml scheduler's mechanics, checked against theory and invariants."""

from __future__ import annotations

import os
from pathlib import Path
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim import engines
from sim.plan.builder import _runs, build_plan, cut_splits, graph_items, make_context
from sim.model.costs import plan_durations
from sim.engines.analytic import pipeline_recurrence
from sim.errors import PlacementError
from sim.plan import OpKind, Stream
from sim.model.specs import BenchTest, LinkSpec, load_scenario, parse_variant
from sim.views.trace import overlap_fraction, to_dataframe
from sim.model.vram import account

from scenario_factory import ROOT, make_scenario, scenarios

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def plan_of(scn, variant: str, n_prompt: int = 0, n_gen: int = 0, depth: int = 0, seed: int = 0):
    v = parse_variant(variant)
    return build_plan(scn, v, BenchTest(n_prompt, n_gen, depth), np.random.default_rng(seed))


def makespan(plan, hw, engine="analytic") -> float:
    return float(engines.run(plan, plan_durations(plan, hw), engine=engine).makespan_s)


def zero_host_costs(hw):
    """The same GPU with free host calls and copy latency (isolates C and T for theory)."""
    return replace(hw, host_sync_s=0.0, op_issue_s=0.0, event_s=0.0,
                   h2d_pinned=LinkSpec(hw.h2d_pinned.bytes_per_s, 0.0),
                   d2h=LinkSpec(hw.d2h.bytes_per_s, 0.0))


def split_C_T(plan, hw, head: bool = False):
    """Per split of a one-graph plan: summed compute time C_j and copy time T_j (and, with
    ``head``, the time of the split's first compute op, the one that reads the staged weight)."""
    d = plan_durations(plan, hw)
    n_split = max(op.split for op in plan.ops) + 1
    C, T, H = np.zeros(n_split), np.zeros(n_split), np.full(n_split, np.nan)
    for op in plan.ops:
        if op.kind in (OpKind.GEMM, OpKind.MOE, OpKind.ATTN):
            C[op.split] += d[op.id]
            if np.isnan(H[op.split]):
                H[op.split] = d[op.id]
        elif op.kind is OpKind.H2D:
            T[op.split] += d[op.id]
    return (C, T, H) if head else (C, T)


def staged_pipeline_end(C, T, buffers: int, C_head=None) -> float:
    """Reference recurrence for a graph whose splits with T_j > 0 are staged: copy j waits for
    the previous copy (one link) and for the end of the consumer op (the split's head, taking
    ``C_head[j]`` of its ``C[j]``) of the staged split ``buffers`` positions earlier (free
    event); compute j waits for compute j-1 and its own copy (ready event). With every split
    staged and C_head = C this is :func:`sim.engines.analytic.pipeline_recurrence`."""
    C_head = C if C_head is None else C_head
    staged = [j for j in range(len(C)) if T[j] > 0]
    last_copy = 0.0
    b = 0.0
    head_end = {}
    for j in range(len(C)):
        start = b
        if T[j] > 0:
            pos = staged.index(j)
            free = head_end[staged[pos - buffers]] if pos >= buffers else 0.0
            last_copy = max(last_copy, free) + T[j]
            start = max(b, last_copy)
        head_end[j] = start + C_head[j]
        b = start + C[j]
    return b


def test_reference_recurrence_matches_pipeline_recurrence_when_all_staged():
    rng = np.random.default_rng(0)
    C, T = rng.random(9), rng.random(9) + 0.1
    for n in (1, 2, 3):
        assert staged_pipeline_end(C, T, n) == pytest.approx(pipeline_recurrence(C, T, n)[1][-1], rel=1e-12)


# -- splits and the op-offload rule ---------------------------------------------------------


def test_each_offloaded_host_weight_heads_its_own_split():
    scn = make_scenario()
    ctx = make_context(scn, parse_variant("baseline"), np.random.default_rng(0))
    splits = cut_splits(graph_items(ctx, 64, 0, 0))
    heads = [s.host_input.name for s in splits if s.host_input is not None]
    assert heads == [f"blk.{i}.{t}.weight" for i in range(2) for t in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")]
    # every expert split holds exactly one host weight op; resident ops ride along
    for s in splits:
        assert sum(it.host for it in s.items) == (1 if s.host_input else 0)


@pytest.mark.parametrize("n_tokens,offloaded", [(1, False), (31, False), (32, True), (64, True)])
def test_op_offload_rule_at_32_tokens(n_tokens, offloaded):
    scn = make_scenario(n_ubatch=128)
    plan = plan_of(scn, "baseline", n_prompt=n_tokens)
    weight_copies = [o for o in plan.ops if o.kind is OpKind.H2D and o.tag in ("selective", "whole")]
    cpu_expert_ops = [o for o in plan.ops if o.kind is OpKind.CPU_MATVEC and "_exps" in o.name]
    assert bool(weight_copies) == offloaded
    assert bool(cpu_expert_ops) == (not offloaded)


def test_op_offload_threshold_is_configurable():
    scn = make_scenario(n_ubatch=128)
    scn = scn.with_(placement=replace(scn.placement, op_offload_min_batch=8))
    plan = plan_of(scn, "baseline", n_prompt=16)
    assert any(o.kind is OpKind.H2D and o.tag == "selective" for o in plan.ops)


def test_dense_decode_runs_ffn_on_cpu_and_prefetch_cannot_help():
    scn = make_scenario(moe=False, ffn_on_cpu=True)
    base, pre = plan_of(scn, "baseline", n_gen=4), plan_of(scn, "prefetch_ungated", n_gen=4)
    assert not any(o.kind is OpKind.H2D and o.tag in ("whole", "prefetch") for o in pre.ops)
    assert makespan(pre, scn.hardware) >= makespan(base, scn.hardware) - 1e-15


# -- selective expert copy --------------------------------------------------------------------


@given(st.lists(st.booleans(), min_size=1, max_size=64))
def test_runs_are_maximal_and_cover_the_mask(bits):
    mask = np.array(bits)
    runs = _runs(mask)
    rebuilt = np.zeros_like(mask)
    for a, c in runs:
        assert c >= 1
        rebuilt[a:a + c] = True
    assert (rebuilt == mask).all()
    for (a1, c1), (a2, _) in zip(runs, runs[1:]):
        assert a1 + c1 < a2  # merged: no two runs touch


def test_selective_copy_moves_used_experts_once_per_tensor_and_reads_ids_once_per_layer():
    scn = make_scenario(n_expert=32, top_k=2)
    plan = plan_of(scn, "baseline", n_prompt=40)
    ids = [o for o in plan.ops if o.kind is OpKind.D2H and o.tag == "ids"]
    assert [o.layer for o in ids] == [0, 1]
    tens = {t.name: t for t in scn.model.tensors}
    for layer in range(2):
        for name in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
            full = f"blk.{layer}.{name}.weight"
            moved = sum(o.nbytes for o in plan.ops if o.kind is OpKind.H2D and o.name.startswith(full + "["))
            compute = next(o for o in plan.ops if o.kind is OpKind.MOE and o.name == full)
            n_used = compute.shape[3]
            assert moved == n_used * tens[full].bytes_per_mat
            assert 0 < n_used < 32


def test_whole_copy_control_moves_every_expert():
    scn = make_scenario(n_expert=32, top_k=2)
    plan = plan_of(scn, "baseline_without_selective_copy", n_prompt=40)
    host = sum(t.nbytes for t in scn.model.tensors if t.is_expert)
    assert plan.h2d_bytes() == host
    assert not any(o.tag == "ids" for o in plan.ops)


# -- theory --------------------------------------------------------------------------------


@pytest.mark.parametrize("moe,variant", [(False, "baseline"), (True, "baseline_without_selective_copy")])
def test_baseline_is_fully_sequential(moe, variant):
    """One graph copy: copy and compute never overlap; with free host calls the makespan is
    exactly sum(C + T) (docs/DESIGN.md: layer time C_n + T_n)."""
    scn = make_scenario(moe=moe, ffn_on_cpu=not moe, n_layer=3)
    hw = zero_host_costs(scn.hardware)
    plan = plan_of(scn, variant, n_prompt=64)
    C, T = split_C_T(plan, hw)
    assert T.sum() > 0 and C.sum() > 0
    assert makespan(plan, hw) == pytest.approx(C.sum() + T.sum(), rel=1e-12)
    sched = engines.run(plan, plan_durations(plan, scn.hardware))
    assert overlap_fraction(to_dataframe(plan, sched)) == 0.0


@pytest.mark.parametrize("moe", [False, True])
@pytest.mark.parametrize("bw", [0.5, 10.0, 200.0])
def test_ungated_prefetch_is_the_two_slot_pipeline(moe, bw):
    """Ungated prefetch with free host calls equals the 2-buffer pipeline recurrence over the
    graph's splits (copy i waits for the compute two staged splits back; compute i waits for
    copy i)."""
    scn = make_scenario(moe=moe, ffn_on_cpu=not moe, n_layer=3, h2d_gb_per_s=bw)
    hw = zero_host_costs(scn.hardware)
    plan = plan_of(scn, "prefetch_ungated", n_prompt=64)
    C, T, H = split_C_T(plan, hw, head=True)
    assert makespan(plan, hw) == pytest.approx(staged_pipeline_end(C, T, 2, H), rel=1e-12)
    # and the bounds of a pipeline
    assert makespan(plan, hw) >= max(C.sum(), T.sum()) - 1e-15
    assert makespan(plan, hw) <= C.sum() + T.sum() + 1e-15


@pytest.mark.parametrize("slots", [1, 2, 3, 4])
def test_expert_slots_are_the_n_slot_pipeline(slots):
    """With free host calls the slots plan is the N-buffer recurrence (copy j waits for the
    consumer N staged splits earlier). Since issue #18 the copies are issued one staged split
    ahead whatever N (not N-1 ahead): with a free host the issue point never binds, so the
    recurrence, which has only the free events, still gives the makespan."""
    scn = make_scenario(n_layer=3, n_expert=8, top_k=2, h2d_gb_per_s=5.0)
    hw = zero_host_costs(scn.hardware)
    plan = plan_of(scn, f"slots{slots}", n_prompt=64)
    C, T, H = split_C_T(plan, hw, head=True)
    assert makespan(plan, hw) == pytest.approx(staged_pipeline_end(C, T, slots, H), rel=1e-12)


def test_more_slots_never_slower_and_gain_saturates():
    scn = make_scenario(n_layer=4, n_expert=8, top_k=2, h2d_gb_per_s=5.0)
    t = [makespan(plan_of(scn, f"slots{n}", n_prompt=64), scn.hardware) for n in (1, 2, 3, 4, 6)]
    assert all(a >= b - 1e-15 for a, b in zip(t, t[1:]))


def _staged_ops(plan):
    """``(copies, consumers)`` of a one-graph slots plan: the staging H2D and the consumer op of
    each staged split, in pool order (by split)."""
    copies = {o.split: o for o in plan.ops if o.kind is OpKind.H2D and o.tag == "prefetch"}
    consumers = {o.split: o for o in plan.ops if o.tag == "staged"}
    assert copies.keys() == consumers.keys()
    order = sorted(copies)
    return [copies[s] for s in order], [consumers[s] for s in order]


@pytest.mark.parametrize("slots", [1, 2, 3, 4, 6])
def test_slot_copies_are_issued_one_split_ahead_whatever_the_slot_count(slots):
    """Issue #18: the lookahead is one staged split whatever N (slots bound reuse, not depth).
    In plan (host program) order, when the host launches the consumer of staged split k, the
    copies of staged splits 0..k+1 have been issued (0..k with one slot: a single slot cannot be
    refilled while it is read); copy k waits for the free event of the consumer N staged splits
    earlier and for nothing else on the GPU. (Before, N slots issued up to N-1 copies ahead.)"""
    scn = make_scenario(n_layer=3, n_expert=8, top_k=2)
    plan = plan_of(scn, f"slots{slots}", n_prompt=64)
    copies, consumers = _staged_ops(plan)
    S = len(copies)
    assert S == 9  # 3 layers x gate/up/down
    ahead = 1 if slots >= 2 else 0
    for k, cons in enumerate(consumers):
        issued = sum(1 for c in copies if c.id < cons.id)
        assert issued == min(k + 1 + ahead, S), (k, issued)
    for k, cp in enumerate(copies):
        gpu_deps = [d for d in cp.deps if plan.ops[d].stream is not Stream.HOST]
        assert gpu_deps == ([consumers[k - slots].id] if k >= slots else []), k
        assert cp.slot == k % slots


@pytest.mark.parametrize("engine", ["analytic", "des"])
@pytest.mark.parametrize("C,T", [(1.0, 3.0), (3.0, 1.0), (2.0, 2.0), (0.0, 1.0), (1.0, 0.0)])
def test_slot_pipeline_makespan_is_the_one_ahead_closed_form(C, T, engine):
    """Theory: S staged splits, every copy T and every consumer C, everything else free. The
    one-ahead pipeline ends at ``T + (S-1)·max(C, T) + C`` for every N >= 2 (copy k+1 overlaps
    consumer k; a deeper buffer cannot help when C and T are constant); N = 1 cannot refill its
    slot while it is read, so nothing overlaps: ``S·(C + T)``. The durations are set by hand, so
    this checks the plan's dependency structure alone."""
    scn = make_scenario(n_layer=4, n_expert=8, top_k=2)
    for slots in (1, 2, 3, 4, 5, 12):
        plan = plan_of(scn, f"slots{slots}", n_prompt=64)
        copies, consumers = _staged_ops(plan)
        S = len(copies)
        d = np.zeros(len(plan.ops))
        d[[c.id for c in copies]] = T
        d[[c.id for c in consumers]] = C
        got = float(engines.run(plan, d, engine=engine).makespan_s)
        want = S * (C + T) if slots == 1 else T + (S - 1) * max(C, T) + C
        assert got == pytest.approx(want, rel=1e-12, abs=1e-12), slots


def test_slot_size_is_the_largest_expert_tensor_staged_with_its_own_type():
    """Issue #18: a slot holds the largest expert tensor of any staged layer, each with its own
    ggml type (Qwen3 Q4_K_M: ffn_down_exps is Q6_K on the use_more_bits layers, Q4_K elsewhere),
    and the plan's slots (Op.slot_bytes) and the VRAM reservation use that one size."""
    scn = load_scenario(ROOT / "scenarios" / "default.toml")
    model = scn.model

    def down(i):
        return next(t for t in model.tensors if t.name == f"blk.{i}.ffn_down_exps.weight")

    # layers 6 and 7 have Q4_K experts only, layer 8 a Q6_K ffn_down_exps
    assert [down(i).ggml_type for i in (6, 7, 8)] == ["Q4_K", "Q4_K", "Q6_K"]
    for layers, big in (("6|7", down(6)), ("6|7|8", down(8))):
        pl = replace(scn.placement, n_cpu_moe=0, override_tensor=((rf"blk\.({layers})\.ffn_.*_exps", "CPU"),))
        s2 = scn.with_(placement=pl)
        staged = [t for t in model.tensors if t.is_expert and pl.host_resident(model, t)]
        want = max(t.nbytes for t in staged)
        assert want == big.nbytes
        for n in (1, 3):
            plan = build_plan(s2, parse_variant(f"slots{n}"), BenchTest(512, 0, 0), np.random.default_rng(0))
            copies, consumers = _staged_ops(plan)
            assert len(copies) == 3 * len(layers.split("|"))
            assert {o.slot_bytes for o in copies + consumers} == {want}
            assert all(o.nbytes <= o.slot_bytes for o in copies)
            assert account(s2, parse_variant(f"slots{n}"))[0].staging_bytes == n * want


# -- variants, gates, semantics -----------------------------------------------------------


def test_gate_below_threshold_is_baseline_and_above_is_ungated():
    scn = make_scenario(n_ubatch=512)
    sig = lambda p: [(o.kind, o.stream, o.nbytes, o.deps) for o in p.ops]  # noqa: E731
    assert sig(plan_of(scn, "prefetch_gated_128", n_prompt=64)) == sig(plan_of(scn, "baseline", n_prompt=64))
    assert sig(plan_of(scn, "prefetch_gated_128", n_prompt=256)) == sig(plan_of(scn, "prefetch_ungated", n_prompt=256))


def test_gate_keeps_prefetch_for_dense_graphs():
    scn = make_scenario(moe=False, ffn_on_cpu=True)
    gated = plan_of(scn, "prefetch_gated_512", n_prompt=64)
    assert any(o.tag == "prefetch" for o in gated.ops)


@pytest.mark.parametrize("n_tokens,fires", [(32, False), (40, False), (64, True)])
def test_slots_fire_only_at_prefill_scale(n_tokens, fires):
    # fires when tokens * top-k >= 2 * n_expert: 32 experts, top-1 -> 64 tokens
    scn = make_scenario(n_expert=32, top_k=1, n_ubatch=128)
    plan = plan_of(scn, "slots3", n_prompt=n_tokens)
    assert any(o.tag == "prefetch" for o in plan.ops) == fires


def test_staging_vram_is_reserved_even_when_gated():
    scn = make_scenario()
    ung = account(scn, parse_variant("prefetch_ungated"))
    gat = account(scn, parse_variant("prefetch_gated_4096"))
    base = account(scn, parse_variant("baseline"))
    assert ung[0].staging_bytes == gat[0].staging_bytes > 0 == base[0].staging_bytes
    largest_expert_tensor = max(t.nbytes for t in scn.model.tensors if t.is_expert)
    assert account(scn, parse_variant("slots3"))[0].staging_bytes == 3 * largest_expert_tensor


def test_no_staging_where_the_worst_case_graph_is_below_the_op_offload_batch():
    """The patch reserves staging while the context reserves its worst-case graph of
    min(n_ubatch, n_batch, n_ctx) tokens; below op_offload_min_batch (32) no weight crosses in it
    or in any later graph, so nothing is reserved (measured: Gemma tg16 in
    data/llamacpp/h200-20261202-prefetch2, 0 MiB where 180.9 MiB was predicted)."""
    from dataclasses import replace as rep

    scn = make_scenario()
    full = account(scn, parse_variant("slots3"))[0].staging_bytes
    assert full > 0
    for wl, pl in (({"n_ubatch": 31}, {}), ({"n_ubatch": 32}, {}), ({}, {"ctx_size": 16}), ({}, {"ctx_size": 32}),
                   ({}, {"ctx_size": 64, "op_offload_min_batch": 65})):
        s2 = scn.with_(workload=rep(scn.workload, **wl), placement=rep(scn.placement, **pl))
        tokens = min(s2.workload.n_ubatch, s2.workload.n_batch, s2.placement.ctx_size)
        want = full if tokens >= s2.placement.op_offload_min_batch else 0.0
        for v in ("slots3", "prefetch_ungated"):
            got = account(s2, parse_variant(v))[0].staging_bytes
            assert (got > 0) == (want > 0), (wl, pl, v)


def test_pageable_copies_block_the_host_thread():
    scn = make_scenario(pinned=False)
    plan = plan_of(scn, "prefetch_ungated", n_prompt=64)
    copies = [o for o in plan.ops if o.kind is OpKind.H2D and o.tag == "prefetch"]
    assert copies and all(o.stream is Stream.HOST and not o.pinned for o in copies)


def test_vram_overflow_is_a_placement_error_naming_the_placement():
    scn = make_scenario(n_cpu_moe=0, n_ff_exp=4096, d_model=1024, n_expert=32)
    scn = scn.with_(file="toy.toml")
    with pytest.raises(PlacementError) as exc:
        plan_of(scn, "baseline", n_prompt=64)
    assert "toy.toml" in str(exc.value) and "placement" in str(exc.value) and "does not fit" in str(exc.value)


def test_expert_cache_hits_skip_copies_and_decode_hits_run_on_gpu():
    scn = make_scenario(n_expert=8, top_k=2, cache=-1, variants=("baseline", "cache_lru"))
    v = parse_variant("cache_lru")
    ctx = make_context(scn, v, np.random.default_rng(0))
    assert ctx.cache is not None and ctx.cache.capacity_experts > 0
    first = build_plan(scn, v, BenchTest(64, 0), np.random.default_rng(1), ctx)
    second = build_plan(scn, v, BenchTest(64, 0), np.random.default_rng(2), ctx)
    assert second.h2d_bytes() < first.h2d_bytes()  # warm cache: hits skip the copy
    dec = build_plan(scn, v, BenchTest(0, 2), np.random.default_rng(3), ctx)
    assert any(o.tag == "cache_hit" and o.kind is OpKind.MOE for o in dec.ops)
    assert 0.0 <= ctx.cache.hit_rate <= 1.0


def test_a_decode_split_whose_experts_all_hit_the_cache_is_no_cpu_split():
    """A decode split runs its experts' misses on the CPU and its hits on the GPU; where every
    expert hits there is nothing for the CPU, so no activations go to the host and back and no
    CPU split is paid (it was: a 100 % hit rate decoded at half of fully resident); a split with a
    miss keeps its CPU split."""
    scn = make_scenario(n_expert=8, top_k=2, cache=-1, variants=("cache_lru",))
    v = parse_variant("cache_lru")
    ctx = make_context(scn, v, np.random.default_rng(0))
    assert ctx.cache.capacity_experts >= scn.model.n_layer * 8    # every expert fits
    cold = build_plan(scn, v, BenchTest(0, 1), np.random.default_rng(3), ctx)
    misses = [o for o in cold.ops if o.kind is OpKind.CPU_MATVEC]
    assert misses and any(o.tag == "act" for o in cold.ops)      # a cold cache: CPU work, its copies
    for n in range(40):                                          # warm every expert in
        build_plan(scn, v, BenchTest(0, 1), np.random.default_rng(100 + n), ctx)
    ctx.cache.reset_stats()
    warm = build_plan(scn, v, BenchTest(0, 1), np.random.default_rng(3), ctx)
    assert ctx.cache.hit_rate == 1.0
    assert not [o for o in warm.ops if o.kind is OpKind.CPU_MATVEC or o.tag in ("act", "cpu_split_overhead")]
    assert sum(o.tag == "cache_hit" for o in warm.ops) == sum(o.tag == "cache_hit" for o in warm.ops if o.kind is OpKind.MOE) > 0


# -- invariants (hypothesis) -------------------------------------------------------------------


@SETTINGS
@given(scenarios(moe=True), st.integers(1, 200))
def test_bytes_ordering_baseline_le_gated_le_ungated(scn, n_tokens):
    b = plan_of(scn, "baseline", n_prompt=n_tokens).h2d_bytes()
    g = plan_of(scn, "prefetch_gated_64", n_prompt=n_tokens).h2d_bytes()
    u = plan_of(scn, "prefetch_ungated", n_prompt=n_tokens).h2d_bytes()
    w = plan_of(scn, "baseline_without_selective_copy", n_prompt=n_tokens).h2d_bytes()
    assert b <= g <= u
    assert b <= w


@SETTINGS
@given(scenarios(), st.sampled_from(["baseline", "prefetch_ungated", "slots2", "slots3"]),
       st.integers(1, 160))
def test_makespan_does_not_grow_with_link_bandwidth(scn, variant, n_tokens):
    plan = plan_of(scn, variant, n_prompt=n_tokens)
    hw = scn.hardware
    fast = replace(hw, h2d_pinned=LinkSpec(hw.h2d_pinned.bytes_per_s * 2, hw.h2d_pinned.latency_s),
                   h2d_pageable=LinkSpec(hw.h2d_pageable.bytes_per_s * 2, hw.h2d_pageable.latency_s, True))
    assert makespan(plan, fast) <= makespan(plan, hw) * (1 + 1e-12)


@SETTINGS
@given(scenarios(), st.sampled_from(["baseline", "prefetch_ungated", "prefetch_gated_64", "slots3"]),
       st.integers(1, 160))
def test_analytic_and_des_agree_on_built_plans(scn, variant, n_tokens):
    plan = plan_of(scn, variant, n_prompt=n_tokens)
    a = makespan(plan, scn.hardware, "analytic")
    d = makespan(plan, scn.hardware, "des")
    assert d == pytest.approx(a, rel=1e-9)


@SETTINGS
@given(scenarios(moe=True), st.integers(32, 160))
def test_stream_tail_events_never_beat_record_point(scn, n_tokens):
    rp = scn.with_(hardware=replace(scn.hardware, event_semantics="record_point"))
    tail = scn.with_(hardware=replace(scn.hardware, event_semantics="stream_tail"))
    a = makespan(plan_of(rp, "slots3", n_prompt=n_tokens), rp.hardware)
    b = makespan(plan_of(tail, "slots3", n_prompt=n_tokens), tail.hardware)
    assert b >= a * (1 - 1e-12)


# -- golden trace -------------------------------------------------------------------------------

GOLDEN = ROOT / "tests" / "data" / "golden_tiny_trace.csv"


def _golden_frame() -> pd.DataFrame:
    scn = load_scenario(ROOT / "scenarios" / "tiny" / "tiny.toml")
    frames = []
    for v in scn.variants:
        for test in scn.workload.tests():
            plan = build_plan(scn, v, test, np.random.default_rng(scn.seed))
            for eng in ("analytic", "des"):
                sched = engines.run(plan, plan_durations(plan, scn.hardware), engine=eng)
                df = to_dataframe(plan, sched, test=test.name, variant=v.name)
                frames.append(df)
    df = pd.concat(frames, ignore_index=True)
    cols = ["variant", "test", "engine", "op_id", "name", "kind", "queue", "nbytes", "start_s", "end_s"]
    df = df[cols].copy()
    df["start_us"] = (df.pop("start_s") * 1e6).round(6)
    df["end_us"] = (df.pop("end_s") * 1e6).round(6)
    return df


def test_golden_trace_of_the_tiny_scenario():
    """The tiny scenario's traces (all variants, both engines) match the committed golden file.
    Regenerate after an intended change with ``UPDATE_GOLDEN=1 pytest tests/test_builder.py``
    and review the diff."""
    df = _golden_frame()
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(GOLDEN, index=False)
    want = pd.read_csv(GOLDEN)
    got = pd.read_csv(pd.io.common.StringIO(df.to_csv(index=False)))
    pd.testing.assert_frame_equal(got, want, check_exact=False, rtol=1e-9, atol=1e-6)
    # both engines produced identical timelines
    a = df[df.engine == "analytic"].reset_index(drop=True)
    d = df[df.engine == "des"].reset_index(drop=True)
    assert np.allclose(a.end_us, d.end_us, rtol=1e-12, atol=0)


@SETTINGS
@given(scenarios(), st.sampled_from(["baseline", "prefetch_ungated", "cache_lru", "slots2+cache_lru"]),
       st.sampled_from([(0, 3), (8, 0), (64, 0)]))
def test_cpu_backend_runs_on_the_host_thread(scn, variant, test):
    """The CPU backend computes on the host thread: a CPU op never overlaps a host op, starts
    after the host op before it and the host resumes only after it (so CPU time is on the
    critical path of decode with host-resident weights)."""
    scn = scn.with_(placement=replace(scn.placement, expert_cache_experts=-1))
    plan = plan_of(scn, variant, n_prompt=test[0], n_gen=test[1])
    sched = engines.run(plan, plan_durations(plan, scn.hardware))
    seq = [(o.id, o.stream) for o in plan.ops if o.stream in (Stream.HOST, Stream.CPU)]
    for (a, _), (b, _) in zip(seq, seq[1:]):
        assert sched.start_s[b] >= sched.end_s[a] - 1e-15, (plan.ops[a].name, plan.ops[b].name)


@pytest.mark.parametrize("variant", ["prefetch_ungated", "slots3", "slots2+prefetch_ungated"])
def test_vram_reserves_every_staging_buffer_the_plan_uses(variant):
    """The staging the builder allocates (slot_bytes of each distinct slot) fits in what the VRAM
    accounting reserves, also when a split copies several tensors (fused q/k/v)."""
    scn = make_scenario(n_layer=3, n_expert=8, top_k=2)
    scn = scn.with_(placement=replace(scn.placement, override_tensor=(("blk\\.1\\.attn_", "CPU"),)))
    plan = plan_of(scn, variant, n_prompt=64)
    used = {}
    for o in plan.ops:
        if o.kind is OpKind.H2D and o.tag == "prefetch":
            used[o.slot] = max(used.get(o.slot, 0), o.slot_bytes)
    assert used and sum(used.values()) <= account(scn, parse_variant(variant))[0].staging_bytes


@pytest.mark.parametrize("scenario", ["laguna-2x3090.toml", "h200x2-qwen3-30b-a3b.toml"])
@pytest.mark.parametrize("variant", ["baseline", "prefetch_ungated", "slots3"])
def test_layer_split_compute_follows_the_other_gpus_work(scenario, variant):
    """-sm layer: a split whose activations come from the other GPU starts only after that GPU's
    compute so far has ended (ggml_backend_tensor_copy_async makes the destination wait), so the
    compute ops of a graph run one after another across the GPUs, in plan order."""
    from sim.model.costs import plan_durations
    from sim.model.specs import BenchTest, load_scenario

    scn = load_scenario(Path(__file__).resolve().parent.parent / "scenarios" / scenario)
    scn = scn.with_(workload=replace(scn.workload, n_ubatch=256))
    plan = build_plan(scn, parse_variant(variant), BenchTest(512, 0, 0), np.random.default_rng(0))
    sched = engines.run(plan, plan_durations(plan, scn.hardware))
    compute = [o for o in plan.ops if o.kind in (OpKind.GEMM, OpKind.MOE, OpKind.ATTN) and o.device >= 0]
    assert len({o.device for o in compute}) == 2
    switches = 0
    for a, b in zip(compute, compute[1:]):
        if a.device != b.device and a.graph == b.graph:
            switches += 1
            assert sched.start_s[b.id] >= sched.end_s[a.id] - 1e-15, (a.name, b.name)
    assert switches >= 2  # one boundary per graph, two graphs


def test_rocm_pageable_copies_queue_on_their_stream_and_stream_tail_spares_pinned(tmp_path):
    """ROCm pins pageable pages on the fly: a pageable H2D queues on its stream (the host goes
    on) instead of blocking the host thread as on CUDA; the stream-tail event semantics bite
    only pageable copies, so a pinned plan is timed as with record-point events."""
    from sim.model.costs import plan_durations
    from sim.model.specs import BenchTest, load_hardware, load_scenario

    tiny_dir = Path(__file__).resolve().parent.parent / "scenarios" / "tiny"
    text = (tiny_dir / "tiny-gpu.toml").read_text()
    (tmp_path / "rocm.toml").write_text(text.replace("[hardware]\n", '[hardware]\nbackend = "ROCm"\n', 1))
    (tmp_path / "rocm-blocking.toml").write_text(
        text.replace("[hardware]\n", '[hardware]\nbackend = "ROCm"\nh2d_pageable_host_blocking = true\n', 1))
    cuda, rocm = load_hardware(tiny_dir / "tiny-gpu.toml"), load_hardware(tmp_path / "rocm.toml")
    assert cuda.h2d_pageable.host_blocking and not rocm.h2d_pageable.host_blocking
    assert load_hardware(tmp_path / "rocm-blocking.toml").h2d_pageable.host_blocking
    base = load_scenario(tiny_dir / "tiny.toml")
    pageable = base.with_(placement=replace(base.placement, pinned=False))
    test, var = BenchTest(64, 0, 0), parse_variant("prefetch_ungated")

    def timed(scn):
        plan = build_plan(scn, var, test, np.random.default_rng(0))
        return plan, engines.run(plan, plan_durations(plan, scn.hardware)).makespan_s

    p_cuda, t_cuda = timed(pageable)
    p_rocm, t_rocm = timed(pageable.with_(hardware=rocm))
    h2d = lambda p: [o for o in p.ops if o.kind is OpKind.H2D and o.tag == "prefetch"]
    assert h2d(p_cuda) and all(o.stream is Stream.HOST for o in h2d(p_cuda))
    assert h2d(p_rocm) and all(o.stream is Stream.COPY and not o.pinned for o in h2d(p_rocm))
    assert t_rocm < t_cuda  # the copies overlap compute once the host is not blocked
    tail = rocm.with_(event_semantics="stream_tail")
    _, t_pinned_tail = timed(base.with_(hardware=tail))
    _, t_pinned = timed(base.with_(hardware=rocm))
    assert t_pinned_tail == t_pinned
    _, t_pageable_tail = timed(pageable.with_(hardware=tail))
    assert t_pageable_tail >= t_rocm


def test_attention_shapes_cached_per_layer_signature_equal_the_direct_ones():
    """BuildContext.attn_shape (one computation per layer signature) equals attn_item_shape
    for every layer of every shipped scenario, at prefill and decode sizes."""
    from sim.plan.builder import attn_item_shape, make_context
    from sim.model.specs import load_scenario

    for path in sorted((ROOT / "scenarios").glob("*.toml")):
        scn = load_scenario(path)
        ctx = make_context(scn, scn.variants[0], np.random.default_rng(0))
        for n, kv in ((1, 0), (1, 4000), (512, 0), (96, 8192)):
            for i in range(scn.model.n_layer):
                assert ctx.attn_shape(i, n, kv) == attn_item_shape(ctx, i, n, kv), (path.name, i, n, kv)


# ---------------------------------------------------------------------------------------
# fast paths of the builder against the straightforward ones
# ---------------------------------------------------------------------------------------

#: every column of a plan (sim.plan.Plan)
PLAN_COLUMNS = ("kinds", "streams", "devices", "names", "dep_ptr", "dep_idx", "nbytes", "shapes", "layers",
                "splits", "graphs", "slots", "slot_bytes", "pinned", "tags")
SHIPPED = sorted((ROOT / "scenarios").glob("*.toml"))


def _built(scn, v, t, fast: bool, monkeypatch):
    import sim.plan.builder as B

    monkeypatch.setattr(B, "ITEM_MEMO", fast)
    monkeypatch.setattr(B, "ENABLE_BULK", fast)
    monkeypatch.setattr(B, "BULK_MIN", 1)  # every run of launches or copies a column at a time
    ctx = make_context(scn, v, np.random.default_rng(7))
    build_plan(scn, v, t, np.random.default_rng(8), ctx)  # a warm-up (an expert cache carries over)
    return build_plan(scn, v, t, np.random.default_rng(9), ctx)


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.slow) if p.stem == "laguna-2x3090" else p
                                  for p in SHIPPED], ids=[p.stem for p in SHIPPED])
def test_fast_builder_paths_build_the_reference_plan(path, monkeypatch):
    """Items and splits reused across graphs (builder.graph_splits), launches and selective
    copies appended a column at a time (Emitter.launch_items, Emitter.h2d_pieces, here for runs
    of any length: BULK_MIN 1) and masks
    drawn for all layers at once build, column for column, the plan of the straightforward
    path (graph_items and cut_splits per graph, masks drawn layer by layer inside graph_items,
    one Emitter.launch per op), on every shipped scenario, variant and an expert cache."""
    from sim.engines.metrics import fit_context_to_tests

    scn = load_scenario(path)
    variants = list(scn.variants)
    if scn.model.moe is not None:
        variants += [parse_variant("cache_lru"), parse_variant("prefetch_gated_512+cache_lru")]
        scn = scn.with_(placement=replace(scn.placement, expert_cache_experts=96))
    tests = [BenchTest(scn.workload.n_ubatch + 7, 0, 0), BenchTest(40, 0, 100), BenchTest(0, 3, 300)]
    scn = fit_context_to_tests(scn, tests)
    checked = 0
    for v in variants:
        for t in tests:
            try:
                fast = _built(scn, v, t, True, monkeypatch)
            except PlacementError:
                continue
            ref = _built(scn, v, t, False, monkeypatch)
            for c in PLAN_COLUMNS:
                assert getattr(fast, c) == getattr(ref, c), f"{path.name} {v.name} {t.name}: column {c}"
            assert (fast.graph_tokens, fast.graph_last_op) == (ref.graph_tokens, ref.graph_last_op)
            for k in ("h2d_bytes", "cache_hit_rate", "n_cpu_moe"):
                assert fast.meta[k] == ref.meta[k], k
            checked += 1
    assert checked


def _busy_loop(plan) -> np.ndarray:
    """The per-op loop that sim.model.costs.busy_mask vectorises."""
    out = np.zeros(len(plan.ops), dtype=bool)
    busy = False
    for op in plan.ops:
        if op.kind is OpKind.CPU_MATVEC:
            out[op.id] = busy = True
        elif busy and op.kind is OpKind.ISSUE:
            out[op.id] = True
    return out


def _durations_loop(plan, hw) -> np.ndarray:
    """plan_durations the straightforward way: op_duration_s of every Op."""
    from sim.model.costs import op_duration_s

    mask = _busy_loop(plan) if hw.executor_mode else np.zeros(len(plan.ops), dtype=bool)
    extras = hw.executor_mode and bool(hw.executor_busy_issue_s_by_kind)
    out = np.array([op_duration_s(op, hw, host_busy=extras and bool(mask[op.id]) and op.kind is OpKind.ISSUE)
                    for op in plan.ops])
    if hw.executor_mode and hw.executor_busy_scale != 1.0:
        out[mask] *= hw.executor_busy_scale
    return out


def test_plan_durations_equal_op_duration_s_of_each_op():
    """plan_durations (priced once per distinct op, read from the plan's columns) and the
    vectorised busy mask equal pricing every Op on its own, on built plans with CPU-backend
    ops, in and out of executor_mode."""
    from sim.model.costs import busy_mask, direct_launch_s

    for name, variant, test in (("default.toml", "baseline", BenchTest(600, 2)),
                                ("gemma3-27b-ffn-cpu.toml", "prefetch_ungated", BenchTest(40, 2, 64)),
                                ("mixtral-rtx5090.toml", "slots3", BenchTest(0, 3, 10))):
        scn = load_scenario(ROOT / "scenarios" / name)
        plan = build_plan(scn, parse_variant(variant), test, np.random.default_rng(0))
        assert busy_mask(plan).tolist() == _busy_loop(plan).tolist()
        hw = scn.hardware
        ex = replace(hw, executor_mode=True, executor_busy_scale=1.25,
                     executor_busy_issue_s_by_kind={"gemm": 3e-6, "moe": 1e-6})
        for h in (hw, ex, replace(ex, executor_busy_issue_s_by_kind={})):
            # plus the launch share of a graph llama.cpp rebuilds (sim.model.costs.direct_launch_s)
            ref = np.asarray(_durations_loop(plan, h)) + direct_launch_s(plan, h)
            assert plan_durations(plan, h).tolist() == ref.tolist(), name


def test_the_kq_mask_is_copied_to_the_gpu_only_when_some_attention_runs_there():
    """llama.cpp copies the KQ masks (graph inputs) to a GPU only for attention that runs there:
    with every layer on the CPU (-ngl 0, decode below the op-offload batch) the mask op moves no
    bytes; with the layers offloaded it moves the mask's."""
    from sim.model.specs import load_model

    scn = load_scenario("scenarios/default.toml")    # the llama.cpp-calibrated H200 profile
    scn = scn.with_(model=load_model("scenarios/models/gemma3-27b.toml"))
    def mask_bytes(ngl: int) -> int:
        s = scn.with_(placement=replace(scn.placement, ngl=ngl, n_cpu_moe=0, override_tensor=()))
        plan = build_plan(s, parse_variant("baseline"), BenchTest(0, 2, 0), np.random.default_rng(0))
        ops = [i for i in range(len(plan.tags)) if plan.tags[i] == "kq_mask"]
        assert ops
        return int(plan.shapes[ops[0]][1])

    assert mask_bytes(0) == 0 and mask_bytes(999) > 0


@pytest.mark.parametrize("model_name, restricted", [("qwen3-30b-a3b", True), ("gemma3-27b", True),
                                                    ("gpt-oss-20b", False)])
def test_the_last_block_runs_its_ffn_on_the_output_rows_only(model_name, restricted):
    """llama.cpp selects a ubatch's output rows (inp_out_ids) before the last block's FFN in
    qwen3moe, gemma3 and llama, after the last block in gpt-oss: the FFN items of that block
    and the output head compute the output rows (none in a prompt's ubatches before the one
    that ends a llama_decode call); every other item keeps the ubatch's tokens."""
    from sim.model.specs import load_model
    from sim.plan.builder import draw_masks

    scn = load_scenario(ROOT / "scenarios" / "default.toml")
    model = load_model(ROOT / "scenarios" / "models" / f"{model_name}.toml")
    scn = scn.with_(model=model, placement=replace(scn.placement, n_cpu_moe=0))
    assert (model.output_rows_layer == model.n_layer - 1) == restricted
    last, head = model.n_layer - 1, model.output_tensor.name
    ctx = make_context(scn, parse_variant("baseline"), np.random.default_rng(0))

    def items(n_out):
        ctx.rng = np.random.default_rng(3)
        return graph_items(ctx, 512, 0, 0, draw_masks(ctx, 512, 0, n_out), n_out)

    def ffn(its):
        names = [it.name for it in its]
        o = names.index(f"blk.{last}.attn_output.weight")
        return [it for it in its[o + 1:] if it.layer == last]

    every, one, none = items(None), items(1), items(0)
    n_ffn = len(ffn(every))
    assert n_ffn >= 3 and all(it.shape[0] == 512 for it in ffn(every))
    for its in (every, one, none):   # the blocks before the last are the ubatch's
        assert [(it.name, it.shape) for it in its if 0 <= it.layer < last] == \
               [(it.name, it.shape) for it in every if 0 <= it.layer < last]
    assert [it.shape[0] for it in every if it.name == head] == [1]
    assert [it.shape[0] for it in one if it.name == head] == [1]
    assert not [it for it in none if it.name == head]
    if restricted:
        assert len(ffn(one)) == n_ffn and all(it.shape[0] == 1 for it in ffn(one))
        assert not ffn(none)
        if model.moe is not None:
            assert {it.shape[3] for it in ffn(one) if it.kind is OpKind.MOE} == {model.moe.n_expert_used}
            assert ctx.stats["used_masks"][last].sum() == 0
    else:
        for its in (one, none):
            assert [(it.name, it.shape) for it in ffn(its)] == [(it.name, it.shape) for it in ffn(every)]


def test_a_prompt_of_several_ubatches_skips_the_head_and_last_ffn_before_its_call_ends():
    """On a llama.cpp profile the plan of pp512 at ubatch 128 (one llama_decode call of four
    ubatches) computes the output head once, in the last ubatch, and is faster than the plan
    that computes it in every ubatch; decode is unchanged (its one token is the output)."""
    from sim.plan import builder

    scn = load_scenario(ROOT / "scenarios" / "default.toml")
    scn = scn.with_(workload=replace(scn.workload, n_ubatch=128), placement=replace(scn.placement, n_cpu_moe=0))
    v = parse_variant("baseline")
    head = scn.model.output_tensor.name
    pp = BenchTest(512, 0)
    plan = build_plan(scn, v, pp, np.random.default_rng(0))
    assert builder.output_rows(scn, pp) == [0, 0, 0, 1]
    assert sum(name.startswith(head) for name in plan.names) == 1
    t_new = float(np.max(engines.run(plan, plan_durations(plan, scn.hardware), "analytic").end_s))
    real = builder.output_rows
    try:
        builder.output_rows = lambda s, t, g=None: [None] * len(builder.test_graphs(s, t))
        old = build_plan(scn, v, pp, np.random.default_rng(0))
        tg = BenchTest(0, 4)
        old_tg = build_plan(scn, v, tg, np.random.default_rng(0))
    finally:
        builder.output_rows = real
    assert sum(name.startswith(head) for name in old.names) == 4
    t_old = float(np.max(engines.run(old, plan_durations(old, scn.hardware), "analytic").end_s))
    assert t_new < t_old
    new_tg = build_plan(scn, v, tg, np.random.default_rng(0))
    assert new_tg.names == old_tg.names and new_tg.shapes == old_tg.shapes


def test_the_moe_gate_looks_at_moe_ops_on_any_backend():
    """The prefetch patch gates a graph on its MUL_MAT_ID nodes in every split: a partial -ngl
    decode, whose experts run on the CPU and whose CPU layers' q-norm weights cross to the GPU
    (sim.plan.builder.offloaded_head_norms), is gated off, so prefetch_gated_512 builds the
    baseline's plan there (it prefetched the q-norm weights: +1.0 % in decode); ungated
    prefetch still stages them."""
    from dataclasses import replace as _replace

    from sim.model.specs import load_scenario

    scn = load_scenario(ROOT / "scenarios" / "default.toml")
    scn = scn.with_(placement=_replace(scn.placement, ngl=20))
    plans = {}
    for name in ("baseline", "prefetch_gated_512", "prefetch_ungated"):
        v = parse_variant(name)
        plans[name] = build_plan(scn, v, BenchTest(0, 2), np.random.default_rng(1),
                                 make_context(scn, v, np.random.default_rng(0)))
    tags = {k: [o.tag for o in p.ops] for k, p in plans.items()}
    assert "prefetch" not in tags["prefetch_gated_512"] and tags["prefetch_gated_512"] == tags["baseline"]
    assert "prefetch" in tags["prefetch_ungated"]
