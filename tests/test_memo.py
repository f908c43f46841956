"""Graph-level memoisation (sim.plan.memo) against the full plan, on every shipped scenario.

The memoised path times each distinct graph once and sums over a test's graphs; the reference
path builds and times the whole plan of every repetition (``run_variant_test(memo=False)``).
Both run here in the same process, and every number of every (scenario, variant, test) cell
must agree to a relative 1e-9; the DES on the memoised path must agree with the analytic one.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from sim.plan.builder import build_plan, make_context
from sim.errors import PlacementError
from sim.plan.memo import memo_eligible, time_test
from sim.engines.metrics import fit_context_to_tests, rep_rng, run_variant_test, time_plan, transfer_stats
from sim.plan.overlap import graph_host_edges, ubatch_overlap_s
from sim.model.specs import BenchTest, load_scenario, parse_variant
from sim.views.trace import exposed_transfer_s, overlap_fraction, to_dataframe

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = sorted((ROOT / "scenarios").glob("*.toml"))
REL = 1e-9


def _rel(a, b) -> float:
    if a is None or b is None:
        assert a is None and b is None
        return 0.0
    a, b = float(a), float(b)
    if math.isnan(a) or math.isnan(b):
        assert math.isnan(a) and math.isnan(b), (a, b)
        return 0.0
    if a == b:
        return 0.0
    return abs(a - b) / max(abs(a), abs(b))


def _compare(fast, full) -> dict[str, float]:
    out = {}
    for k in range(len(full.makespan_s)):
        out[f"makespan[{k}]"] = _rel(fast.makespan_s[k], full.makespan_s[k])
        out[f"tps[{k}]"] = _rel(fast.tps[k], full.tps[k])
    for name in ("ttft_s", "h2d_bytes", "exposed_transfer_s", "overlap_fraction", "cache_hit_rate"):
        out[name] = _rel(getattr(fast, name), getattr(full, name))
    assert fast.n_cpu_moe == full.n_cpu_moe
    assert fast.vram == full.vram
    return out


def _check_scenario(path, shorten: bool) -> None:
    scn = load_scenario(path)
    tests = scn.workload.tests()
    if shorten:
        # a few graphs per test: a full ubatch and a partial one, four decode tokens
        ub = scn.workload.n_ubatch
        tests = list(dict.fromkeys(BenchTest(min(t.n_prompt, ub + 7), min(t.n_gen, 4), t.n_depth)
                                   for t in tests))
    scn = fit_context_to_tests(scn, tests)
    checked = 0
    for v in scn.variants:
        try:
            make_context(scn, v, rep_rng(scn.seed, -1, -1))
        except PlacementError:
            continue
        for ti, t in enumerate(tests):
            fast = run_variant_test(scn, v, t, 2, memo=True)
            full = run_variant_test(scn, v, t, 2, memo=False)
            diffs = _compare(fast, full)
            worst = max(diffs, key=diffs.get)
            assert diffs[worst] <= REL, f"{path.name} {v.name} {t.name}: {worst} differs by {diffs[worst]:.2e}"
            # the DES on the memoised path agrees with the analytic engine
            des = run_variant_test(scn, v, t, 1, engine="des", memo=True)
            for k, d in _compare(des, run_variant_test(scn, v, t, 1, memo=True)).items():
                assert d <= REL, f"{path.name} {v.name} {t.name}: DES {k} differs by {d:.2e}"
            checked += 1
    assert checked > 0


@pytest.mark.slow
@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_memo_matches_full_plan_on_shipped_scenarios(path):
    """Every shipped scenario, every variant and test as shipped (about 3.5 min: slow set)."""
    _check_scenario(path, shorten=False)


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.slow) if p.stem == "laguna-2x3090" else p
                                  for p in SCENARIOS], ids=[p.stem for p in SCENARIOS])
def test_memo_matches_full_plan_on_shortened_shipped_scenarios(path):
    """The same on every shipped scenario and variant with its tests cut to a few graphs
    (laguna-2x3090, ~10 s, in the slow set, as is its full version)."""
    _check_scenario(path, shorten=True)


def test_memo_builds_one_graph_for_a_decode_test():
    """A dense decode test is one graph structure repeated: built once, every kv_len priced."""
    scn = load_scenario(ROOT / "scenarios" / "gemma3-27b-ffn-cpu.toml")
    t = BenchTest(0, 16, 0)
    scn = fit_context_to_tests(scn, [t])
    v = scn.variants[0]
    ctx = make_context(scn, v, rep_rng(scn.seed, -1, -1))
    assert memo_eligible(ctx)
    tt = time_test(ctx, t, rep_rng(scn.seed, 0, 0))
    # on a llama.cpp profile the first token also pays its share of the CUDA-graph capture
    ggml = scn.hardware.ggml
    assert (tt.n_graphs, tt.n_templates) == (16, 2 if ggml is not None and ggml.capture_per_layer_s > 0 else 1)
    plan = build_plan(scn, v, t, rep_rng(scn.seed, 0, 0), make_context(scn, v, rep_rng(scn.seed, -1, -1)))
    sched = time_plan(plan, scn)
    assert _rel(tt.makespan_s, float(sched.makespan_s)) <= REL
    assert tt.h2d_bytes == plan.meta["h2d_bytes"]


def test_memo_sees_kv_length():
    """Graphs that differ only in kv_len share a structure but not their durations: a deep
    decode test is slower than a shallow one on both paths."""
    scn = load_scenario(ROOT / "scenarios" / "gemma3-27b-ffn-cpu.toml")
    shallow, deep = BenchTest(0, 8, 0), BenchTest(0, 8, 60000)
    scn = fit_context_to_tests(scn, [deep])
    v = scn.variants[0]
    r = {}
    for t in (shallow, deep):
        for memo in (True, False):
            r[t.n_depth, memo] = run_variant_test(scn, v, t, 1, memo=memo).makespan_s[0]
    assert r[60000, True] > r[0, True]
    assert _rel(r[60000, True], r[60000, False]) <= REL and _rel(r[0, True], r[0, False]) <= REL


def test_memo_refuses_an_expert_cache():
    scn = load_scenario(ROOT / "scenarios" / "default.toml")
    v = parse_variant("cache_lru")
    scn = scn.with_(placement=replace(scn.placement, expert_cache_experts=64))
    ctx = make_context(scn, v, rep_rng(scn.seed, -1, -1))
    assert not memo_eligible(ctx)
    with pytest.raises(ValueError, match="expert cache"):
        time_test(ctx, BenchTest(0, 2, 0), rep_rng(scn.seed, 0, 0))


def test_transfer_stats_on_arrays_equal_the_trace_metrics():
    scn = load_scenario(ROOT / "scenarios" / "default.toml")
    for spec in ("baseline", "prefetch_ungated"):
        v = parse_variant(spec)
        plan = build_plan(scn, v, BenchTest(512, 0, 0), np.random.default_rng(1))
        sched = time_plan(plan, scn)
        df = to_dataframe(plan, sched)
        e, o = transfer_stats(plan, sched)
        assert e == exposed_transfer_s(df) and o == overlap_fraction(df)
        assert e > 0


def test_run_lengths_are_the_selective_copy_runs():
    """The memo keys a selective copy on its runs' lengths: those of builder._runs."""
    from sim.plan.builder import _runs
    from sim.plan.memo import mask_key, run_lengths

    rng = np.random.default_rng(3)
    for _ in range(500):
        m = rng.random(int(rng.integers(1, 70))) < rng.random()
        assert run_lengths(m) == tuple(c for _a, c in _runs(m))
    a = np.array([1, 1, 0, 1, 0, 0], dtype=bool)
    b = np.array([0, 1, 1, 0, 0, 1], dtype=bool)   # the same runs elsewhere: the same key
    c = np.array([1, 0, 1, 1, 0, 0], dtype=bool)   # the same count, other runs: another key
    layers = frozenset({0})
    assert mask_key({0: a}, layers) == mask_key({0: b}, layers) != mask_key({0: c}, layers)
    assert mask_key({0: a}, frozenset()) == mask_key({0: c}, frozenset()) == ((0, 3),)


def test_graphs_with_shifted_expert_runs_share_a_template_and_match_the_full_plan():
    """A prefill test whose ubatches use every expert (one run per tensor) builds one graph;
    its numbers are the full plan's."""
    scn = load_scenario(ROOT / "scenarios" / "default.toml")
    t = BenchTest(2048, 0)
    scn = fit_context_to_tests(scn, [t])
    v = parse_variant("baseline")
    ctx = make_context(scn, v, rep_rng(scn.seed, -1, -1))
    tt = time_test(ctx, t, rep_rng(scn.seed, 0, 0))
    plan = build_plan(scn, v, t, rep_rng(scn.seed, 0, 0), make_context(scn, v, rep_rng(scn.seed, -1, -1)))
    sched = time_plan(plan, scn)
    # a prompt's ubatches overlap on a llama.cpp profile (sim.plan.overlap): the full plan less the same credit
    credit = ubatch_overlap_s(ctx, t, *graph_host_edges(plan, np.asarray(sched.start_s), np.asarray(sched.end_s)))
    assert tt.n_graphs == 4 and tt.n_templates < tt.n_graphs
    assert _rel(tt.makespan_s, float(sched.makespan_s) - credit) <= REL
    assert tt.h2d_bytes == plan.meta["h2d_bytes"]


@pytest.mark.parametrize("name", ["default.toml", "gpt-oss-20b-selective.toml", "h200x2-qwen3-30b-a3b.toml"])
def test_masks_drawn_for_all_graphs_at_once_time_as_graph_by_graph(name, monkeypatch):
    """time_test with the masks of every graph drawn in one call and keyed per block
    (ENABLE_BATCH_DRAWS) gives, to the bit, the timing of the graph-by-graph draws and keys
    (draw_masks, mask_key), with the same templates built; prompts with a partial last
    ubatch, a short (exact-mask) prompt and decode."""
    import sim.plan.memo as memo

    scn = load_scenario(ROOT / "scenarios" / name)
    tests = [BenchTest(2 * scn.workload.n_ubatch + 100, 0, 0), BenchTest(40, 0, 64), BenchTest(0, 3, 10)]
    scn = fit_context_to_tests(scn, tests)
    for v in scn.variants:
        try:
            make_context(scn, v, rep_rng(scn.seed, -1, -1))
        except PlacementError:
            continue
        for ti, t in enumerate(tests):
            got = {}
            for fast in (True, False):
                monkeypatch.setattr(memo, "ENABLE_BATCH_DRAWS", fast)
                ctx = make_context(scn, v, rep_rng(scn.seed, ti, -1))
                if not memo_eligible(ctx):
                    break
                got[fast] = time_test(ctx, t, rep_rng(scn.seed, ti, 0), "analytic", {})
            if got:
                assert got[True] == got[False], f"{name} {v.name} {t.name}"


def test_block_keys_are_the_mask_keys():
    """block_keys of (L, E) blocks equal mask_key of the same masks as layer dicts, for
    layers whose run lengths matter and the others, repeated blocks and graphs without experts."""
    from sim.plan.memo import block_keys, mask_key

    rng = np.random.default_rng(3)
    layers = [1, 2, 5, 7]
    blocks = [rng.random((4, 16)) < 0.6 for _ in range(3)]
    blocks = [blocks[0], blocks[1], blocks[1], np.ones((4, 16), dtype=bool), None, blocks[2]]
    mls = [frozenset(), frozenset({2, 7}), frozenset({2, 7}), frozenset({1, 2, 5, 7}), frozenset(), frozenset({5})]
    memo = {}
    for _ in range(2):  # the second time from the blocks kept in memo
        got = block_keys(blocks, layers, mls, memo)
        for blk, ml, key in zip(blocks, mls, got):
            assert key == (() if blk is None else mask_key(dict(zip(layers, blk)), ml))


def test_a_kept_context_times_as_a_fresh_one():
    """run_variant_test without a context keeps the one it made for the scenario and variant
    (shared_context) and reuses it on the next call: that warm call gives the numbers of a
    cold one (contexts dropped first) and of the full plan (memo=False), and retimes its graphs
    (no timed result is carried over); another scenario object, even an equal one, or an
    expert-cache variant, gets a context of its own."""
    import sim.engines.metrics as metrics
    from sim.plan.memo import GraphTemplate

    scn = load_scenario(ROOT / "scenarios" / "default.toml")
    t = BenchTest(1100, 0, 0)
    scn = fit_context_to_tests(scn, [t])
    v = parse_variant("baseline")
    metrics.clear_shared_contexts()
    cold = run_variant_test(scn, v, t, 2)
    ctx = metrics.shared_context(scn, v)
    tpls = [x for x in ctx.graph_memo["analytic"].values() if isinstance(x, GraphTemplate)]
    assert tpls and not any(x.results for x in tpls)  # dropped when handed out again
    warm = run_variant_test(scn, v, t, 2)
    assert metrics.shared_context(scn, v) is ctx
    full = run_variant_test(scn, v, t, 2, memo=False)
    for k in range(2):
        assert warm.makespan_s[k] == cold.makespan_s[k]
    for name in ("h2d_bytes", "exposed_transfer_s", "overlap_fraction"):
        assert getattr(warm, name) == getattr(cold, name)
    assert max(_compare(warm, full).values()) <= REL
    other = load_scenario(ROOT / "scenarios" / "default.toml")
    assert metrics.shared_context(other, v) is not ctx
    cached = parse_variant("cache_lru")
    scn_c = scn.with_(placement=replace(scn.placement, expert_cache_experts=96))
    a = metrics.shared_context(scn_c, cached)
    assert a.cache is not None and metrics.shared_context(scn_c, cached) is not a
    metrics.clear_shared_contexts()
    assert metrics.shared_context(scn, v) is not ctx
    metrics.clear_shared_contexts()


def test_first_repetition_pays_the_cuda_graph_capture():
    """llama-bench's first timed repetition captures a reused graph's CUDA graph: with ``-r 3``
    on the llama.cpp profile the first sample of a one-ubatch prompt and of a decode test is
    slower than the others, the later ones equal, the spread not zero; with llama-bench's own
    ``-r`` standing apart (``bench_repetitions``: compare) every repetition pays 1/r of it, and
    the mean time is the same either way."""
    from dataclasses import replace

    from sim.engines.metrics import run_variant_test
    from sim.model.specs import BenchTest, load_scenario, parse_variant

    scn = load_scenario(ROOT / "scenarios" / "default.toml")
    v = parse_variant("baseline")
    for test in (BenchTest(512, 0), BenchTest(0, 8)):
        r = run_variant_test(scn, v, test, 3, memo=True)
        full = run_variant_test(scn, v, test, 3, memo=False)
        np.testing.assert_allclose(r.makespan_s, full.makespan_s, rtol=1e-9)
        assert r.tps[0] < r.tps[1] and r.tps[1] == pytest.approx(r.tps[2], rel=1e-9)
        spread = scn.with_(workload=replace(scn.workload, bench_repetitions=3))
        s = run_variant_test(spread, v, test, 3, memo=True)
        assert s.tps[0] == pytest.approx(s.tps[1], rel=1e-9)
        assert np.mean(s.makespan_s) == pytest.approx(np.mean(r.makespan_s), rel=1e-9)


def test_bench_mean_of_spread_draws_is_llama_bench_s_mean_of_its_repetitions():
    """compare draws fewer repetitions than llama-bench's ``-r`` and spreads the first
    repetition's CUDA-graph capture over them (``bench_repetitions``); llama-bench's ``avg_ts`` is
    the mean of its repetitions' t/s, only the first paying the capture. On a dense model (every
    draw the same graph) :func:`sim.engines.metrics.bench_mean_tps` of the spread draws equals the
    mean t/s of ``r`` repetitions simulated one by one, and the plain ``n / t`` of a spread draw
    (what compare took before) does not."""
    from dataclasses import replace

    from sim.engines.metrics import bench_mean_tps, run_variant_test, spread_capture_s
    from sim.model.specs import BenchTest, load_model, load_scenario, parse_variant

    base = load_scenario(ROOT / "scenarios" / "default.toml")   # the llama.cpp profile
    scn = base.with_(model=load_model(ROOT / "scenarios" / "models" / "gemma3-27b.toml"),
                     placement=replace(base.placement, n_cpu_moe=0))
    assert scn.hardware.ggml is not None and scn.hardware.ggml.capture_per_layer_s > 0
    v = parse_variant("baseline")
    for test in (BenchTest(64, 0), BenchTest(0, 8)):
        real = run_variant_test(scn, v, test, 4)
        assert real.tps[0] < real.tps[1]            # the first repetition captures
        spread = scn.with_(workload=replace(scn.workload, bench_repetitions=4))
        s = run_variant_test(spread, v, test, 2)
        part, whole = spread_capture_s(spread, test)
        assert whole == pytest.approx(4 * part) and part > 0
        got = bench_mean_tps(spread, [test], s.makespan_s)
        assert got.shape == (2,)
        assert got == pytest.approx(np.full(2, np.mean(real.tps)), rel=1e-9)
        assert np.mean(s.tps) < np.mean(real.tps) * (1 - 1e-6)   # n / t of the spread time: low
        # nothing spread (llama-bench's -r unknown): n / t
        assert bench_mean_tps(scn, [test], s.makespan_s) == pytest.approx(s.tps, rel=1e-12)


_PLAN_COLUMNS = ("kinds", "streams", "devices", "names", "dep_ptr", "dep_idx", "nbytes", "shapes", "layers",
                 "splits", "graphs", "slots", "slot_bytes", "pinned", "tags")


def _same_template(a, b) -> None:
    """Two graph templates hold the same graph: every plan column, the priced durations (to the
    bit), compiled predecessors, transfer groups, KV-dependent ops and launch shares."""
    for c in _PLAN_COLUMNS:
        assert getattr(a.plan, c) == getattr(b.plan, c), c
    assert (a.plan.graph_tokens, a.plan.graph_last_op) == (b.plan.graph_tokens, b.plan.graph_last_op)
    assert a.plan.meta == b.plan.meta
    assert a.durations.tolist() == b.durations.tolist()
    assert a.comp.pred_ptr.tolist() == b.comp.pred_ptr.tolist()
    assert a.comp.pred_idx.tolist() == b.comp.pred_idx.tolist()
    assert len(a.groups) == len(b.groups)
    for (h_a, c_a), (h_b, c_b) in zip(a.groups, b.groups):
        assert h_a.tolist() == h_b.tolist() and c_a.tolist() == c_b.tolist()
    assert a.kv_ops == b.kv_ops
    assert np.asarray(a.launch).tolist() == np.asarray(b.launch).tolist()
    assert (a.n_tokens, a.kv_len, a.end_device, a.h2d_bytes, a.overhead_op) == \
        (b.n_tokens, b.kv_len, b.end_device, b.h2d_bytes, b.overhead_op)


@pytest.mark.parametrize("name", ["default.toml", "h200x2-qwen3-30b-a3b.toml", "gemma3-27b-ffn-cpu.toml"])
def test_a_derived_template_is_the_template_built_for_its_call(name):
    """derive_template makes, from a graph's template, the template of the same graph in another
    llama_decode call (call tokens, capture share: only the host-overhead op's shape and price
    change): column by column, duration by duration (to the bit) and row by row at other KV
    lengths, the template build_template makes for that call; the source is left as it was, and a
    call of the other ``rebuilt`` flag is refused. On llama.cpp profiles (the overhead op) and one
    without it (a copy), prompt and decode graphs, every variant."""
    from sim.plan.builder import draw_masks
    from sim.plan.memo import _row_at, build_template, derive_template

    scn = load_scenario(ROOT / "scenarios" / name)
    scn = fit_context_to_tests(scn, [BenchTest(4096, 0, 0)])
    calls = {True: [(True, 2048, 0.0), (True, 0, 0.0), (True, 700, 0.0)],
             False: [(False, 1, 1.0), (False, 1, 0.0), (False, 512, 0.25)]}
    checked = 0
    for v in scn.variants:
        try:
            ctx = make_context(scn, v, rep_rng(scn.seed, -1, -1))
        except PlacementError:
            continue
        if not memo_eligible(ctx):
            continue
        for n, kv, start in ((scn.workload.n_ubatch, 512, 0), (1, 300, scn.hardware.n_gpu - 1)):
            ctx.rng = rep_rng(scn.seed, 0, 0)
            masks = draw_masks(ctx, n, 0)
            for rebuilt, (first, *others) in calls.items():
                src = build_template(ctx, n, kv, 0, masks, start, first)
                before = list(src.plan.shapes), src.durations.tolist()
                for call in others:
                    got = derive_template(src, ctx, call)
                    ref = build_template(ctx, n, kv, 0, masks, start, call)
                    _same_template(got, ref)
                    assert got.comp is src.comp  # the structure is shared
                    for at in (kv, kv + 777, 3 * kv + 5):
                        assert got.rows[_row_at(got, ctx, at)].tolist() == ref.rows[_row_at(ref, ctx, at)].tolist()
                    ggml = ctx.scn.hardware.ggml
                    if ggml is not None and ggml.has_graph_host_work:
                        oid = got.overhead_op
                        assert oid >= 0 and got.plan.shapes[oid] != src.plan.shapes[oid]
                    with pytest.raises(ValueError, match="rebuild"):
                        derive_template(src, ctx, calls[not rebuilt][0])
                assert (list(src.plan.shapes), src.durations.tolist()) == before
                checked += 1
    assert checked


@pytest.mark.parametrize("name", ["default.toml", "h200x2-qwen3-30b-a3b.toml"])
@pytest.mark.parametrize("engine", ["analytic", "des"])
def test_time_test_with_derived_templates_times_as_with_built_ones(name, engine, monkeypatch):
    """time_test deriving the templates of graphs that differ only in their llama_decode call
    (ENABLE_DERIVE; the analytic engine then times the rows of templates that share a compiled
    plan as one batch) gives, to the bit, the timing of building every template: prompts of
    several calls (n_batch) and ubatches, a partial last ubatch, decode with the CUDA-graph
    capture of the first repetition and of a later one."""
    import sim.plan.memo as memo

    scn = load_scenario(ROOT / "scenarios" / name)
    ub, nb = scn.workload.n_ubatch, scn.workload.n_batch
    tests = [BenchTest(2 * nb + 3 * ub + 100, 0, 0), BenchTest(0, 4, 10)]
    scn = fit_context_to_tests(scn, tests)
    v = parse_variant("baseline")
    for t in tests:
        for rep in (0, 1):
            got = {}
            for derive in (True, False):
                monkeypatch.setattr(memo, "ENABLE_DERIVE", derive)
                ctx = make_context(scn, v, rep_rng(scn.seed, -1, -1))
                ctx.rep = rep
                got[derive] = time_test(ctx, t, rep_rng(scn.seed, 0, rep), engine, {})
            assert got[True] == got[False], f"{name} {t.name} rep {rep}"
            assert got[True].n_templates == got[False].n_templates


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_primed_attention_prices_time_as_priced_one_by_one(path, monkeypatch):
    """time_test pricing a new template's attentions at the test's KV lengths in one call
    (ENABLE_PRIME, sim.model.costs.attn_durations_s) gives, to the bit, the timing of pricing
    them one KV length at a time, on every shipped scenario (a prompt over several ubatches at
    a depth, and decode)."""
    import sim.plan.memo as memo

    scn = load_scenario(path)
    ub = scn.workload.n_ubatch
    tests = [BenchTest(3 * ub + 100, 0, 700), BenchTest(0, 3, 300)]
    scn = fit_context_to_tests(scn, tests)
    v = scn.variants[0]
    try:
        make_context(scn, v, rep_rng(scn.seed, -1, -1))
    except PlacementError:
        pytest.skip("the placement does not fit")
    for t in tests:
        got = {}
        for prime in (True, False):
            monkeypatch.setattr(memo, "ENABLE_PRIME", prime)
            ctx = make_context(scn, v, rep_rng(scn.seed, -1, -1))
            if not memo_eligible(ctx):
                pytest.skip("not memoised")
            got[prime] = time_test(ctx, t, rep_rng(scn.seed, 0, 0), "analytic", {})
        assert got[True] == got[False], f"{path.stem} {t.name}"


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_attention_prices_at_once_are_the_op_prices(path):
    """attn_durations_s prices an attention at many KV lengths as op_duration_s prices each
    (the same floats), or answers None (then the caller prices one by one): tokens on and off
    the tables' rows, with and without a window, KV lengths from 0 past the tables."""
    from sim.model.costs import attn_durations_s, op_duration_s
    from sim.plan import Op, OpKind, Stream

    scn = load_scenario(path)
    hw, m = scn.hardware, scn.model
    kvs = list(range(0, 70000, 997)) + [1, 255, 256, 257, 131072, 400000]
    for n in (1, 7, 32, 100, 512, 2048, 3000):
        for win in (0, 1024):
            for fa in (0, 1):
                shapes = [(n, kv, m.n_head, m.n_head_kv, m.head_dim, win, 0, 0, fa, 8, 123.0, 0, 0, 0) for kv in kvs]
                op = Op(0, OpKind.ATTN, Stream.COMPUTE, 0, "attn", shape=shapes[0])
                got = attn_durations_s(op, hw, shapes)
                if got is None:
                    assert hw.ggml is None or not fa
                    continue
                assert got.tolist() == [op_duration_s(replace(op, shape=sh), hw) for sh in shapes], (n, win)
    with pytest.raises(ValueError):
        attn_durations_s(op, hw, [shapes[0], (n + 1, *shapes[0][1:])])


def test_a_plan_with_other_shapes_shares_its_structure_only():
    """Plan.with_shapes copies every column with the shapes given replaced, shares what the plan
    keeps of its structure (arrays, compiled predecessors, transfer groups) and nothing else: the
    original is unchanged, an op appended to the copy is the copy's alone (and its structure is
    then computed anew); an op id outside the plan is refused."""
    from sim.engines.analytic import compile_plan
    from sim.plan import OpKind, Stream
    from sim.views.trace import plan_transfer_groups

    scn = load_scenario(ROOT / "scenarios" / "default.toml")
    plan = build_plan(scn, parse_variant("baseline"), BenchTest(600, 0, 0), np.random.default_rng(1))
    comp, groups = compile_plan(plan), plan_transfer_groups(plan)
    i = len(plan) // 2
    copy = plan.with_shapes({i: ("other",)})
    assert copy.shapes[i] == ("other",) and plan.shapes[i] != ("other",)
    for c in _PLAN_COLUMNS:
        if c != "shapes":
            assert getattr(copy, c) == getattr(plan, c) and getattr(copy, c) is not getattr(plan, c), c
    assert [s for k, s in enumerate(copy.shapes) if k != i] == [s for k, s in enumerate(plan.shapes) if k != i]
    assert copy.meta == plan.meta and copy.meta["rebuilt_graphs"] is not plan.meta["rebuilt_graphs"]
    assert compile_plan(copy) is comp and plan_transfer_groups(copy) is groups and copy.arrays is plan.arrays
    n = len(plan)
    copy.append(OpKind.HOST_WORK, Stream.HOST, -1, "extra", (n - 1,))
    assert len(plan) == n and len(copy) == n + 1
    assert compile_plan(copy) is not comp and compile_plan(copy).n == n + 1 and compile_plan(plan) is comp
    with pytest.raises(IndexError):
        plan.with_shapes({n: ()})


def _lazy_copy(plan):
    """A copy of ``plan`` whose LAZY_COLUMNS are left to be made from the original's lists."""
    import pickle
    from sim.plan import LAZY_COLUMNS

    lazy = pickle.loads(pickle.dumps(plan))
    for c in LAZY_COLUMNS:
        lazy.set_lazy_column(c, (lambda col: lambda: list(col))(getattr(plan, c)))
    return lazy


def test_lazy_columns_read_as_the_columns_they_stand_for():
    """A plan whose columns are left to be made on first read (Plan.set_lazy_column) reads
    column for column as the plan it stands for: its length, arrays and ops without making
    them, each column on its first read, every column after an appended op (which lands at the
    end of each), after pickling, and in a with_shapes copy (made there from the maker again);
    a column the engines read cannot be deferred."""
    import pickle
    from sim.plan import LAZY_COLUMNS, OpKind, Stream

    scn = load_scenario(ROOT / "scenarios" / "default.toml")
    plan = build_plan(scn, parse_variant("baseline"), BenchTest(600, 0, 0), np.random.default_rng(1))
    n = len(plan)
    lazy = _lazy_copy(plan)
    assert len(lazy) == n and all(c not in lazy.__dict__ for c in LAZY_COLUMNS)
    assert lazy.priced_op(n - 1) == plan.priced_op(n - 1)
    assert all(c not in lazy.__dict__ for c in LAZY_COLUMNS)
    assert lazy.names == plan.names and "names" in lazy.__dict__ and "layers" not in lazy.__dict__
    assert lazy.ops == plan.ops
    for c in _PLAN_COLUMNS:
        assert getattr(lazy, c) == getattr(plan, c), c
    # appending makes what is left and binds the appenders to the columns made
    for make_first in (False, True):
        lazy = _lazy_copy(plan)
        if make_first:
            lazy.names
        oid = lazy.append(OpKind.HOST_WORK, Stream.HOST, -1, "extra", (n - 1,), layer=7, split=3, slot=2, slot_bytes=5)
        assert oid == n and len(lazy) == n + 1
        for c in _PLAN_COLUMNS:
            col = getattr(lazy, c)
            assert len(col) == len(getattr(plan, c)) + 1 and col[:-1] == getattr(plan, c), c
        assert lazy.op(n) == replace(lazy.op(n), name="extra", layer=7, split=3, slot=2, slot_bytes=5)
    # pickling and with_shapes
    back = pickle.loads(pickle.dumps(_lazy_copy(plan)))
    copy = _lazy_copy(plan).with_shapes({0: ("other",)})
    assert all(c not in copy.__dict__ for c in LAZY_COLUMNS)
    for c in _PLAN_COLUMNS:
        assert getattr(back, c) == getattr(plan, c), c
        if c != "shapes":
            assert getattr(copy, c) == getattr(plan, c), c
    with pytest.raises(ValueError):
        plan.set_lazy_column("kinds", list)


def test_priced_op_prices_as_the_op():
    """Plan.priced_op carries what the cost model reads (kind, bytes, shape, pinned, tag) of the
    op, with bytes and shape replaced when given, and prices as the op (and as op_with) on every
    op of a built plan."""
    from sim.model.costs import op_duration_s
    from sim.plan import Op

    scn = load_scenario(ROOT / "scenarios" / "default.toml")
    hw = scn.hardware
    plan = build_plan(scn, parse_variant("prefetch_ungated"), BenchTest(600, 0, 0), np.random.default_rng(1))
    for i, op in enumerate(plan.ops):
        p = plan.priced_op(i)
        assert (p.kind, p.stream, p.device, p.nbytes, p.shape, p.pinned, p.tag) == \
            (op.kind, op.stream, op.device, op.nbytes, op.shape, op.pinned, op.tag)
        # the op as the dataclass's own constructor makes it (the other fields at their defaults)
        assert p == Op(i, op.kind, op.stream, op.device, "", nbytes=op.nbytes, shape=op.shape, pinned=op.pinned,
                       tag=op.tag)
        assert op_duration_s(p, hw) == op_duration_s(op, hw)
        q = plan.priced_op(i, 4096, op.shape)
        assert q.nbytes == 4096 and op_duration_s(q, hw) == op_duration_s(plan.op_with(i, 4096, op.shape), hw)
    with pytest.raises(IndexError):
        plan.priced_op(len(plan))


def test_column_templates_leave_the_names_unmade():
    """A template built a column at a time leaves the columns nothing of a memoised evaluation
    reads unmade (Plan.set_lazy_column) through its timing; read, they are the columns."""
    from sim.plan import LAZY_COLUMNS

    scn = fit_context_to_tests(load_scenario(ROOT / "scenarios" / "default.toml"), [BenchTest(2048, 0)])
    v = parse_variant("baseline")
    ctx = make_context(scn, v, rep_rng(scn.seed, -1, -1))
    memo_d: dict = {}
    time_test(ctx, BenchTest(2048, 0), rep_rng(scn.seed, 0, 0), "analytic", memo_d)
    tpls = [t for t in memo_d.values() if hasattr(t, "plan")]
    assert tpls and all(c not in t.plan.__dict__ for t in tpls for c in LAZY_COLUMNS)
    assert all(len(t.plan.names) == len(t.plan) for t in tpls)


@pytest.mark.parametrize("path", sorted((ROOT / "scenarios").glob("*.toml")), ids=lambda p: p.stem)
def test_shape_free_kinds_are_priced_whatever_their_shape(path):
    """The kinds sim.plan.memo does not re-price at another KV length (price_reads_shape False: a
    launch, a sync, an event outside executor_mode) cost the same for any shape, bytes and tag,
    on every shipped scenario's hardware."""
    from sim.model.costs import SHAPE_FREE_KINDS, op_duration_s, price_reads_shape
    from sim.plan import Op, OpKind, Stream

    hw = load_scenario(path).hardware
    attn_shape = (512, 4096, 32, 4, 128, 0, 0, 0, 1, 10, 1e5, 0, 0, 0)
    for kind in OpKind:
        if price_reads_shape(kind, hw):
            assert hw.executor_mode or kind not in SHAPE_FREE_KINDS
            continue
        prices = {op_duration_s(Op(0, kind, Stream.HOST, -1, "x", nbytes=nb, shape=sh, tag=tag), hw)
                  for nb in (0, 1 << 20) for sh in ((), attn_shape, (7,)) for tag in ("", "attn", "h2d")}
        assert len(prices) == 1, kind


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_rows_made_together_are_the_rows_made_one_by_one(path, monkeypatch):
    """time_test making a template's duration rows together (ENABLE_BATCH_ROWS: _rows_at, the
    KQ-mask and flash-attention prices of every KV length at once) gives, to the bit, the
    timing of making them one KV length at a time (_row_at), and the same rows, row indices
    and row keys on every template, on every shipped scenario (prompts over several ubatches
    from 0 and at a depth, decode)."""
    import sim.plan.memo as memo
    from sim.plan.memo import GraphTemplate

    scn = load_scenario(path)
    ub = scn.workload.n_ubatch
    tests = [BenchTest(5 * ub + 100, 0, 0), BenchTest(3 * ub, 0, 700), BenchTest(0, 5, 300)]
    scn = fit_context_to_tests(scn, tests)
    for v in scn.variants[:2]:
        try:
            make_context(scn, v, rep_rng(scn.seed, -1, -1))
        except PlacementError:
            continue
        got, tpls = {}, {}
        for batch in (True, False):
            monkeypatch.setattr(memo, "ENABLE_BATCH_ROWS", batch)
            ctx = make_context(scn, v, rep_rng(scn.seed, -1, -1))
            if not memo_eligible(ctx):
                pytest.skip("not memoised")
            kept: dict = {}
            got[batch] = [time_test(ctx, t, rep_rng(scn.seed, ti, 0), "analytic", kept) for ti, t in enumerate(tests)]
            tpls[batch] = [t for t in kept.values() if isinstance(t, GraphTemplate)]
        assert got[True] == got[False], f"{path.stem} {v.name}"
        assert len(tpls[True]) == len(tpls[False])
        for a, b in zip(tpls[True], tpls[False]):
            assert a.row_of == b.row_of and a.row_key == b.row_key
            assert len(a.rows) == len(b.rows)
            for x, y in zip(a.rows, b.rows):
                assert x.tobytes() == y.tobytes()


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_kv_prices_at_once_are_the_op_prices(path):
    """mask_shapes_many gives kq_mask_shape at each KV length, kq_mask_durations_s prices those
    shapes as op_duration_s prices the KQ-mask op (the same floats), and attn_durations_kv_s
    gives attn_durations_s (or both None): tokens on and off the tables' rows, windows, KV
    lengths from 0 past the tables."""
    from sim.model.costs import attn_durations_kv_s, attn_durations_s, kq_mask_durations_s, op_duration_s
    from sim.model.ggmlcost import mask_shapes_many
    from sim.plan import Op, OpKind, Stream
    from sim.plan.builder import kq_mask_shape

    scn = load_scenario(path)
    hw, m = scn.hardware, scn.model
    kvs = list(range(0, 70000, 997)) + [1, 31, 32, 33, 255, 256, 257, 131072, 400000]
    for n in (1, 7, 32, 100, 512, 2048, 3000):
        for fa in (False, True):
            for on_gpu in (False, True):
                e, b = mask_shapes_many(m, n, kvs, fa, on_gpu)
                shapes = [kq_mask_shape(m, n, kv, fa, on_gpu) for kv in kvs]
                assert list(zip(e.tolist(), b.tolist())) == shapes
                op = Op(0, OpKind.HOST_WORK, Stream.HOST, -1, "mask", shape=shapes[0], tag="kq_mask")
                got = kq_mask_durations_s(hw, e, b)
                if got is None:
                    assert hw.ggml is None or hw.executor_mode
                else:
                    assert got.tolist() == [op_duration_s(replace(op, shape=sh), hw) for sh in shapes], (n, fa)
        for win in (0, 1024):
            for fa in (0, 1):
                shapes = [(n, kv, m.n_head, m.n_head_kv, m.head_dim, win, 0, 0, fa, 8, 123.0, 0, 0, 0) for kv in kvs]
                op = Op(0, OpKind.ATTN, Stream.COMPUTE, 0, "attn", shape=shapes[3])
                want = attn_durations_s(op, hw, shapes)
                got = attn_durations_kv_s(op, hw, kvs)
                assert (got is None) == (want is None)
                if got is not None:
                    assert got.tolist() == want.tolist()
    with pytest.raises(ValueError):
        attn_durations_kv_s(replace(op, kind=OpKind.GEMM), hw, kvs)


@pytest.mark.parametrize("ub", [1, 2])
def test_prompts_in_small_ubatches_draw_bounded_masks_and_time_as_the_full_plan(ub, monkeypatch):
    """An MoE prompt in one-token ubatches draws one block per (tokens, outputs) pair, not one per
    graph (a prompt of 10**5 one-token ubatches held 1.8 GB of masks); in two-token ubatches the
    masks are drawn in chunks, each graph keeping the first block of its key. Either way the
    timing is the full plan's, and a chunk of 3 graphs times as one chunk of all."""
    import sim.plan.memo as memo
    from sim.plan import builder

    scn = load_scenario(ROOT / "scenarios" / "default.toml")
    t = BenchTest(40, 0, 0)
    scn = fit_context_to_tests(replace(scn, workload=replace(scn.workload, n_ubatch=ub)), [t])
    v = parse_variant("baseline")
    drawn = []
    real = builder.draw_masks_graphs
    monkeypatch.setattr(memo, "draw_masks_graphs", lambda ctx, g, o=None: drawn.append(len(g)) or real(ctx, g, o))
    got = time_test(make_context(scn, v, rep_rng(scn.seed, -1, -1)), t, rep_rng(scn.seed, t, 0), "analytic", {})
    assert sum(drawn) == (2 if ub == 1 else 20)     # ub 1: (1 token, no output) and (1 token, its output)
    plan = build_plan(scn, v, t, rep_rng(scn.seed, t, 0), make_context(scn, v, rep_rng(scn.seed, -1, -1)))
    sched = time_plan(plan, scn)
    edges = graph_host_edges(plan, np.asarray(sched.start_s, dtype=float), np.asarray(sched.end_s, dtype=float))
    ctx = make_context(scn, v, rep_rng(scn.seed, -1, -1))
    full = float(sched.makespan_s) - ubatch_overlap_s(ctx, t, *edges)
    assert _rel(got.makespan_s, full) <= REL and got.h2d_bytes == plan.meta["h2d_bytes"]
    if ub == 2:
        monkeypatch.setattr(memo, "_DRAW_CHUNK", 3)
        drawn.clear()
        small = time_test(make_context(scn, v, rep_rng(scn.seed, -1, -1)), t, rep_rng(scn.seed, t, 0), "analytic", {})
        assert drawn == [3] * 6 + [2] and small == got
