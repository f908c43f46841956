"""The fast paths of a cold memoised evaluation, each against the straightforward path in the
same run: graph templates built a column at a time (sim.plan.fastgraph) against the Emitter's
op-by-op graph, their price classes against plan_durations, the analytic engine's recorded
critical choice, the routing's stacked used-expert probabilities, and the VRAM accounting's
array sums against its loop."""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim.plan.memo as memo
from plangen import plans_with_durations
from sim.plan import fastgraph
from sim.model import vram
from sim.plan.builder import _runs, draw_masks, graph_calls, graph_items, make_context, output_rows
from sim.plan.builder import test_graphs as graphs_of
from sim.model.costs import class_durations, plan_durations
from sim.engines import analytic
from sim.errors import PlacementError
from sim.plan.memo import build_template, memo_eligible, time_test
from sim.engines.metrics import fit_context_to_tests, rep_rng
from sim.plan import Plan
from sim.model.specs import BenchTest, load_scenario, parse_variant

from scenario_factory import ROOT, make_scenario

SHIPPED = sorted((ROOT / "scenarios").glob("*.toml"))
#: every column of a plan (sim.plan.Plan)
PLAN_COLUMNS = ("kinds", "streams", "devices", "names", "dep_ptr", "dep_idx", "nbytes", "shapes", "layers",
                "splits", "graphs", "slots", "slot_bytes", "pinned", "tags")
EXTRA_VARIANTS = ("baseline", "prefetch_ungated", "prefetch_gated_512", "slots1", "slots3",
                  "baseline_without_selective_copy")


def _variants(scn):
    out = {v.name: v for v in scn.variants}
    for text in EXTRA_VARIANTS:
        v = parse_variant(text)
        out.setdefault(v.name, v)
    return list(out.values())


def _built_both(ctx, graph, masks, start_dev, call, monkeypatch, n_outputs=None) -> tuple:
    """``(column template, reference template, built by columns?)`` of one graph."""
    n, kv, off = graph
    covered = []
    real = fastgraph.build_graph_columns

    def spy(*a):
        got = real(*a)
        covered.append(got)
        return got

    monkeypatch.setattr(memo, "build_graph_columns", spy)
    monkeypatch.setattr(fastgraph, "ENABLE", True)
    fast = build_template(ctx, n, kv, off, masks, start_dev, call, n_outputs=n_outputs)
    monkeypatch.setattr(fastgraph, "ENABLE", False)
    ref = build_template(ctx, n, kv, off, masks, start_dev, call, n_outputs=n_outputs)
    monkeypatch.setattr(fastgraph, "ENABLE", True)
    return fast, ref, covered[0]


def _assert_same_template(fast, ref, what: str) -> None:
    for c in PLAN_COLUMNS:
        assert getattr(fast.plan, c) == getattr(ref.plan, c), f"{what}: column {c}"
    assert (fast.plan.graph_tokens, fast.plan.graph_last_op) == (ref.plan.graph_tokens, ref.plan.graph_last_op), what
    assert fast.plan.meta == ref.plan.meta, what
    assert (fast.kv_ops, fast.overhead_op, fast.end_device, fast.h2d_bytes) == \
        (ref.kv_ops, ref.overhead_op, ref.end_device, ref.h2d_bytes), what
    assert fast.durations.tolist() == ref.durations.tolist(), what
    assert [r.tolist() for r in fast.rows] == [r.tolist() for r in ref.rows], what
    # the plan arrays installed from the builder's arrays are those of its lists
    got = fast.plan.arrays
    fresh = Plan()
    for c in PLAN_COLUMNS:
        setattr(fresh, c, getattr(fast.plan, c))
    want = fresh.arrays
    for f in fields(got):
        x, y = getattr(got, f.name), getattr(want, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), f"{what}: arrays.{f.name}"
        else:
            assert x == y, f"{what}: arrays.{f.name}"


def _check_graphs(scn, tests, monkeypatch, graphs_per_test: int = 3) -> tuple[int, int]:
    """Build every graph (the first few of each test) both ways on every start GPU; returns
    (graphs compared, graphs the columns built)."""
    scn = fit_context_to_tests(scn, tests)
    compared = covered = 0
    for v in _variants(scn):
        try:
            ctx = make_context(scn, v, np.random.default_rng(0))
        except PlacementError:
            continue
        if not memo_eligible(ctx):
            continue
        for t in tests:
            ctx.rng = np.random.default_rng(5)
            graphs = graphs_of(scn, t)
            calls = graph_calls(scn, t, 0)
            outs = output_rows(scn, t, graphs)
            for gi, (g, call) in enumerate(list(zip(graphs, calls))[:graphs_per_test]):
                # the graph's own output rows, and the other counts a llama-bench graph has (none,
                # one: the block that runs on them only, the head)
                for n_out in dict.fromkeys([outs[gi], 0, 1]):
                    masks = draw_masks(ctx, g[0], g[2], n_out)
                    for dev in range(scn.hardware.n_gpu):
                        fast, ref, was = _built_both(ctx, g, masks, dev, call, monkeypatch, n_out)
                        _assert_same_template(fast, ref, f"{scn.name} {v.name} {t.name} graph {g} outputs {n_out} "
                                                         f"GPU {dev}")
                        compared += 1
                        covered += was
    return compared, covered


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.slow) if p.stem == "laguna-2x3090" else p
                                  for p in SHIPPED], ids=[p.stem for p in SHIPPED])   # laguna: 4 s, in the slow run
def test_column_templates_build_the_reference_graphs(path, monkeypatch):
    """build_template with the column builder gives, column for column, the plan, KV ops,
    overhead op, durations and KV rows of the Emitter's graph, on every shipped scenario,
    its variants and a few more, at a full and a partial ubatch (partial masks: selective
    copies of several runs), at depth, with a prompt of several ubatches and at decode, on
    each GPU as the start device (graphs outside its class are built by the Emitter on both)."""
    scn = load_scenario(path)
    ub = scn.workload.n_ubatch
    tests = [BenchTest(ub + 7, 0, 0), BenchTest(40, 0, 100), BenchTest(3 * ub, 0, 4096), BenchTest(0, 2, 300)]
    compared, covered = _check_graphs(scn, tests, monkeypatch)
    assert compared and covered


def test_column_templates_cover_the_default_prefill_graph(monkeypatch):
    """The graph of the speed figure (issue #17: the default scenario's pp8192, baseline) is
    one the column builder builds."""
    scn = load_scenario(ROOT / "scenarios" / "default.toml")
    ctx = make_context(scn, parse_variant("baseline"), rep_rng(scn.seed, 0, -1))
    ctx.rng = np.random.default_rng(0)
    masks = draw_masks(ctx, 512, 0)
    fast, ref, was = _built_both(ctx, (512, 0, 0), masks, 0, (True, 2048, 0.0), monkeypatch)
    assert was
    _assert_same_template(fast, ref, "default pp512")
    # the masks also given as the (L, E) block time_test has (counted and cut in one piece)
    block = np.stack([masks[i] for i in ctx.moe_layers])
    with_block = build_template(ctx, 512, 0, 0, masks, 0, (True, 2048, 0.0), block)
    _assert_same_template(with_block, ref, "default pp512, block")


@st.composite
def _toy(draw):
    moe = draw(st.booleans())
    n_expert = draw(st.sampled_from([4, 8, 16]))
    scn = make_scenario(
        n_layer=draw(st.integers(1, 4)), moe=moe, n_expert=n_expert, top_k=draw(st.integers(1, min(3, n_expert))),
        d_model=draw(st.sampled_from([32, 64])), ffn_on_cpu=not moe, pinned=draw(st.booleans()),
        n_ubatch=draw(st.sampled_from([16, 32, 64])), n_gpu=draw(st.integers(1, 2)),
        n_cpu_moe=draw(st.integers(0, 4)) if moe else None,
        variants=("baseline", "prefetch_ungated", "prefetch_gated_512", "slots2", "baseline_without_selective_copy"),
        seed=draw(st.integers(0, 100)))
    if draw(st.booleans()):  # ROCm-like: pageable copies queue on their stream
        hw = scn.hardware
        scn = scn.with_(hardware=replace(hw, h2d_pageable=replace(hw.h2d_pageable, host_blocking=False)))
    return scn


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(scn=_toy(), n_prompt=st.sampled_from([8, 33, 64, 130]))
def test_column_templates_on_random_toy_scenarios(scn, n_prompt, monkeypatch):
    """The same on random toy scenarios: MoE or dense with host FFN weights, one or two GPUs
    (layers split between them: activations crossing GPUs), pinned or pageable copies (on the
    host thread or queued), prompts below and above the op-offload batch."""
    _check_graphs(scn, [BenchTest(n_prompt, 0, 0), BenchTest(0, 1, 10)], monkeypatch, graphs_per_test=2)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_item_columns_equal_graph_items(path):
    """graph_item_columns gives graph_items' items field for field (backends, devices, shapes,
    bytes, host residency, moved attentions), at prefill, below the offload batch and at
    decode."""
    scn = fit_context_to_tests(load_scenario(path), [BenchTest(0, 1, 8192)])
    for v in scn.variants:
        try:
            ctx = make_context(scn, v, np.random.default_rng(0))
        except PlacementError:
            continue
        for n, kv in ((scn.workload.n_ubatch, 0), (20, 100), (1, 8192)):
            ctx.rng = np.random.default_rng(3)
            masks = draw_masks(ctx, n, 0)
            items = graph_items(ctx, n, kv, 0, masks)
            used = np.array([int(masks[i].sum()) for i in ctx.moe_layers], dtype=np.int64)
            cols = fastgraph.graph_item_columns(ctx, n, kv, used)
            assert cols is not None
            assert cols.names == [it.name for it in items]
            assert cols.layers.tolist() == [it.layer for it in items]
            assert list(cols.shapes) == [it.shape for it in items]
            assert cols.wb.tolist() == [it.weight_bytes for it in items]
            assert cols.host.tolist() == [it.host for it in items]
            assert cols.cpu.tolist() == [it.cpu for it in items]
            assert cols.device.tolist() == [it.device for it in items]
            assert cols.expert.tolist() == [it.expert for it in items]
            assert cols.moved.tolist() == [bool(it.kind.value == "attn" and it.device >= 0 and
                                                ctx.layer_dev[it.layer] < 0) for it in items]
            from sim.model.ggmlcost import graph_kernels
            assert cols.kernels == graph_kernels(items)
            # equal shapes share their id
            ids = {}
            for sid, sh in zip(cols.shape_id.tolist(), cols.shapes):
                assert ids.setdefault(sid, sh) is sh


@given(st.integers(0, 6), st.integers(1, 40), st.integers(0, 2**32 - 1))
@settings(max_examples=60, deadline=None)
def test_runs_of_rows_equal_runs(k, e, seed):
    """_runs_rows gives builder._runs of each row of a block."""
    block = np.random.default_rng(seed).random((k, e)) < 0.5
    assert fastgraph._runs_rows(block) == [_runs(r) for r in block]


def test_class_durations_equal_plan_durations_and_refuse_a_wrong_length():
    """class_durations (one price per class) equals plan_durations on a column-built template;
    in executor_mode it is plan_durations; a class array of another length is refused."""
    scn = load_scenario(ROOT / "scenarios" / "default.toml")
    ctx = make_context(scn, parse_variant("baseline"), rep_rng(scn.seed, 0, -1))
    ctx.rng = np.random.default_rng(0)
    tpl = build_template(ctx, 512, 0, 0, draw_masks(ctx, 512, 0), 0, (True, 2048, 0.0))
    from sim.plan.builder import Emitter

    em = Emitter(Plan(label="graph"), ctx)
    em.rebuilt, em.call_tokens = True, 2048
    assert fastgraph.build_graph_columns(em, 512, 0, 0, draw_masks(ctx, 512, 0))
    classes, first = em.price_classes
    hw = scn.hardware
    assert class_durations(em.plan, hw, classes, first).tolist() == plan_durations(em.plan, hw).tolist()
    ex = replace(hw, executor_mode=True)
    assert class_durations(em.plan, ex, classes, first).tolist() == plan_durations(em.plan, ex).tolist()
    with pytest.raises(ValueError, match="classes"):
        class_durations(em.plan, hw, classes[1:], first)
    assert tpl.durations.size == len(em.plan)


@settings(max_examples=100, deadline=None)
@given(plans_with_durations(zeros=True))
def test_recorded_critical_choice_equals_the_one_found_from_the_ends(pd_):
    """_run_one with the critical choice recorded gives _run_one's times and
    _critical_choice's choice (the lowest id among equal ends)."""
    plan, dur = pd_
    comp = analytic.compile_plan(plan)
    s, e = analytic._run_one(comp, dur.tolist())
    s2, e2, ch = analytic._run_one(comp, dur.tolist(), True)
    assert (s2, e2) == (s, e)
    if comp.p0 is None:
        assert ch is None
    else:
        assert ch.tolist() == analytic._critical_choice(comp, np.asarray(e)).tolist()


@given(plans_with_durations(zeros=True))
def test_chains_cut_in_the_run_are_the_first_child_chains(pd_):
    """_run_three_chains gives _run_three_choice's times and choice, and the chains and levels
    _tree_of_first cuts from that choice (the same groups)."""
    plan, dur = pd_
    comp = analytic.compile_plan(plan)
    if comp.p0 is None:
        return
    s, e, ch = analytic._run_three_choice(comp.p0, comp.p1, comp.p2, dur.tolist())
    s2, e2, ch2, chains, level = analytic._run_three_chains(comp.p0, comp.p1, comp.p2, dur.tolist())
    assert (s2, e2, ch2) == (s, e, ch)
    choice = np.array(ch, dtype=np.int64)
    want = analytic._tree_of_first(comp, choice, max_level=comp.n + 1)
    got = analytic._tree_from_chains(comp, choice, chains, level, ch)
    assert [(g[0].tolist(), g[1].tolist()) for g in got.groups] == [(g[0].tolist(), g[1].tolist()) for g in want.groups]
    assert got.parent.tolist() == want.parent.tolist()


@settings(max_examples=150, deadline=None)
@given(plans_with_durations(zeros=True, max_ops=60))
def test_two_predecessor_run_and_the_cut_after_it_are_the_three_predecessor_ones(pd_):
    """On plans whose ops have at most two predecessors, _run_two_choice gives
    _run_three_choice's end times and choice (its starts: each op's critical predecessor's end),
    and _first_child_cut the chains and levels _run_three_chains cuts; _run_tree along either
    path gives the same arrays."""
    plan, dur = pd_
    comp = analytic.compile_plan(plan)
    if comp.p0 is None:
        return
    assert comp.two == all(x < 0 for x in comp.p2)
    if not comp.two:
        return
    s, e, ch = analytic._run_three_choice(comp.p0, comp.p1, comp.p2, dur.tolist())
    e2, ch2 = analytic._run_two_choice(comp.p0, comp.p1, dur.tolist())
    assert e2 == e and ch2 == ch
    ends = e + [0.0]
    assert [ends[c] for c in ch2] == s
    _s, _e, _ch, chains, level = analytic._run_three_chains(comp.p0, comp.p1, comp.p2, dur.tolist())
    assert analytic._first_child_cut(ch2) == (chains, level)


def test_two_predecessor_path_on_a_memo_template(monkeypatch):
    """The default scenario's pp512 graph has at most two predecessors per op: _run_tree on its
    16 KV lengths along the two-predecessor path equals the three-predecessor path (ENABLE_TWO
    off) to the bit."""
    scn = load_scenario(ROOT / "scenarios" / "default.toml")
    ctx = make_context(scn, parse_variant("baseline"), rep_rng(scn.seed, 0, -1))
    ctx.rng = np.random.default_rng(0)
    tpl = build_template(ctx, 512, 0, 0, draw_masks(ctx, 512, 0), 0)
    rows = np.stack([tpl.rows[memo._row_at(tpl, ctx, kv)] for kv in range(0, 8192, 512)])
    assert tpl.comp.two
    got = {}
    for flag in (True, False):
        monkeypatch.setattr(analytic, "ENABLE_TWO", flag)
        comp = analytic._compile(tpl.plan)
        got[flag] = analytic.run(comp, rows)
    np.testing.assert_array_equal(got[True].start_s, got[False].start_s)
    np.testing.assert_array_equal(got[True].end_s, got[False].end_s)


def _tree_of_loops(comp, choice):
    """The heavy-path chains of _tree_of written with separate loops (heads, then chains)."""
    n = choice.size
    par = choice.tolist()
    size, best, heavy = [1] * n, [0] * n, [-1] * n
    for i in range(n - 1, -1, -1):
        p = par[i]
        if p >= 0:
            size[p] += size[i]
            if size[i] > best[p]:
                best[p], heavy[p] = size[i], i
    level, heads = [0] * n, []
    for i in range(n):
        p = par[i]
        if p < 0:
            heads.append(i)
        elif heavy[p] != i:
            level[i] = level[p] + 1
            heads.append(i)
        else:
            level[i] = level[p]
    out = []
    for h in heads:
        c, x = [h], heavy[h]
        while x >= 0:
            c.append(x)
            x = heavy[x]
        out.append((level[h], c))
    return out


@settings(max_examples=60, deadline=None)
@given(plans_with_durations(zeros=True))
def test_tree_chains_equal_the_separate_loops(pd_):
    """_tree_of's one-pass chain building gives the chains, levels and groups of the
    heads-then-chains loops."""
    plan, dur = pd_
    comp = analytic.compile_plan(plan)
    _s, e = analytic._run_one(comp, dur.tolist())
    choice = analytic._critical_choice(comp, np.asarray(e))
    tree = analytic._tree_of(comp, choice)
    n = comp.n
    by_group: dict = {}
    for lev, c in _tree_of_loops(comp, choice):
        by_group.setdefault((lev, (len(c) - 1).bit_length()), []).append(c)
    want = []
    for key in sorted(by_group):
        cs = by_group[key]
        width = max(map(len, cs))
        want.append([c + [n + 1] * (width - len(c)) for c in cs])
    assert [g[0].tolist() for g in tree.groups] == want


def _check_chains(comp, choice, tree):
    """Every op in exactly one chain of ``tree``; within a row each op's parent is the op
    before it, a row's first op's parent its head, computed in an earlier group (or none)."""
    n = comp.n
    done = np.zeros(n + 1, dtype=bool)
    done[n] = True            # column n: no parent
    seen = []
    for ids, heads in tree.groups:
        assert done[heads].all()
        for row, h in zip(ids.tolist(), heads.tolist()):
            row = [i for i in row if i != n + 1]
            assert row and (choice[row[0]] if choice[row[0]] >= 0 else n) == h
            for a, b in zip(row, row[1:]):
                assert choice[b] == a
            seen += row
        done[ids[ids < n]] = True
    assert sorted(seen) == list(range(n))


@settings(max_examples=60, deadline=None)
@given(plans_with_durations(zeros=True), st.data())
def test_first_child_chains_give_the_heavy_path_sums(pd_, data):
    """_tree_of_first (each op continues its parent's chain when it is the parent's first
    child) cuts the critical tree into valid chains, and _tree_ends along them gives the end
    times, start times and rejections of the heavy-path cut (_tree_of) to the bit, on rows
    that differ from the tree's own in a few durations and on fresh ones; with a level bound
    it cannot meet it answers None."""
    plan, dur = pd_
    comp = analytic.compile_plan(plan)
    n = comp.n
    _s, e = analytic._run_one(comp, dur.tolist())
    choice = analytic._critical_choice(comp, np.asarray(e))
    first = analytic._tree_of_first(comp, choice, max_level=n + 1)
    heavy = analytic._tree_of(comp, choice)
    _check_chains(comp, choice, first)
    _check_chains(comp, choice, heavy)
    rows = [dur]
    for _ in range(4):
        r = dur.copy()
        if n:
            r[data.draw(st.integers(0, n - 1))] = data.draw(st.floats(0.0, 1e-2))
        rows.append(r)
    rows.append(np.asarray(data.draw(st.lists(st.floats(0.0, 1e-2), min_size=n, max_size=n)), dtype=float))
    dt = np.stack(rows).T
    for a, b in zip(analytic._tree_ends(comp, first, dt), analytic._tree_ends(comp, heavy, dt)):
        np.testing.assert_array_equal(a, b)
    deepest = 0
    lev = {}
    for i in range(n):   # the first-child cut's deepest level, counted directly
        p = int(choice[i])
        if p < 0:
            lev[i] = 0
        else:
            is_first = int(np.flatnonzero(choice == p)[0]) == i
            lev[i] = lev[p] + (0 if is_first else 1)
        deepest = max(deepest, lev[i])
    if deepest > 0:
        assert analytic._tree_of_first(comp, choice, max_level=deepest - 1) is None
    assert analytic._tree_of_first(comp, choice, max_level=deepest) is not None


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_stacked_used_probabilities_equal_the_rows(path):
    """used_masks_graphs' (L, E) stack of used-expert probabilities, computed in one call,
    equals the rows of _used_p_cached, and its masks those of used_masks graph by graph."""
    scn = load_scenario(path)
    if scn.model.moe is None:
        pytest.skip("no experts")
    ctx = make_context(scn, scn.variants[0], np.random.default_rng(0))
    r = ctx.router
    layers = ctx.moe_layers
    graphs = [(512, 0), (512, 512), (300, 1024), (1, 2048), (512, 2049)]
    got = r.used_masks_graphs(layers, graphs, np.random.default_rng(4))
    rng = np.random.default_rng(4)
    for (n, off), m in zip(graphs, got):
        assert np.array_equal(m, np.stack(r.used_masks(layers, n, rng, off)))
    if r.trace is None:
        for n in (512, 300):
            stack = r._used_p_stacks[(tuple(layers), n)]
            assert np.array_equal(stack, np.stack([r._used_p_cached(i, n) for i in layers]))


def _account_loop(scn, variant, placement=None):
    """vram.account with its tensor loop (no model table)."""
    real = vram._tensor_table
    vram._tensor_table = lambda model: None
    try:
        return vram.account(scn, variant, placement)
    finally:
        vram._tensor_table = real


def _layer_devices_loop(model, placement, n_gpu):
    n_off = placement.gpu_blocks(model)
    first = model.n_layer - n_off
    n_act = n_off + (1 if placement.output_on_gpu() else 0)
    ts = list(placement.tensor_split) or [1.0] * n_gpu
    ts += [0.0] * (n_gpu - len(ts))
    cum = np.cumsum(ts) / sum(ts)
    return [-1 if i < first else int(min(np.searchsorted(cum, (i - first) / max(n_act, 1), side="right"), n_gpu - 1))
            for i in range(model.n_layer)]


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_vram_array_sums_equal_the_loops(path):
    """account's weights per GPU from the model's arrays, layer_devices vectorised and the
    memoised path's host expert layers equal their loops, for each variant, a few -ngl and
    --n-cpu-moe settings and tensor splits."""
    scn = load_scenario(path)
    model = scn.model
    pls = [scn.placement, replace(scn.placement, ngl=model.n_layer // 2), replace(scn.placement, ngl=0),
           replace(scn.placement, n_cpu_moe=model.n_layer // 3)]
    if scn.hardware.n_gpu > 1:
        pls.append(replace(scn.placement, tensor_split=(3.0, 1.0)))
    for pl in pls:
        assert vram.layer_devices(model, pl, scn.hardware.n_gpu) == _layer_devices_loop(model, pl, scn.hardware.n_gpu)
        for v in scn.variants:
            try:
                want = _account_loop(scn, v, pl)
            except PlacementError as exc:
                with pytest.raises(type(exc)):
                    vram.account(scn, v, pl)
                continue
            assert vram.account(scn, v, pl) == want
        s2 = scn.with_(placement=pl)
        try:
            ctx = make_context(s2, scn.variants[0], np.random.default_rng(0))
        except PlacementError:
            continue
        want = set()
        for i in range(model.n_layer):
            for nm in memo._EXPERT_NAMES:
                t = ctx.tensor_by_name.get(f"blk.{i}.{nm}.weight")
                if t is not None and id(t) in ctx.host_ids:
                    want.add(i)
        assert memo._host_expert_layers(ctx) == frozenset(want)


@pytest.mark.parametrize("path", [p for p in SHIPPED if p.stem != "laguna-2x3090"], ids=lambda p: p.stem)
def test_memoised_timings_equal_without_column_templates(path, monkeypatch):
    """time_test gives the same numbers, to the bit, with and without the column builder, on
    both engines, for every variant: a prompt of several ubatches, a decode test and, in
    ubatches of 40 tokens, an 80-token prompt (partial masks: selective copies of several runs).
    (laguna-2x3090 is left out for time: its DES runs take seconds; the templates test covers
    its graphs.)"""
    scn0 = load_scenario(path)
    ub = scn0.workload.n_ubatch
    cases = [(scn0, [BenchTest(2 * ub + 5, 0, 64), BenchTest(0, 3, 100)]),
             (scn0.with_(workload=replace(scn0.workload, n_ubatch=40)), [BenchTest(80, 0, 100)])]
    for scn, tests in cases:
        scn = fit_context_to_tests(scn, tests)
        for v in scn.variants:
            for engine in ("analytic", "des"):
                got = []
                for on in (True, False):
                    monkeypatch.setattr(fastgraph, "ENABLE", on)
                    try:
                        ctx = make_context(scn, v, rep_rng(scn.seed, -1, -1))
                    except PlacementError:
                        break
                    if not memo_eligible(ctx):
                        break
                    got.append([time_test(ctx, t, rep_rng(scn.seed, k, 0), engine, {}) for k, t in enumerate(tests)])
                if len(got) == 2:
                    assert got[0] == got[1], f"{path.name} {v.name} {engine}"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-(1 << 40), 1 << 40), max_size=80), st.integers(1, 5))
def test_unique_index_inverse_is_numpy_unique_s(values, spread):
    """fastgraph.unique_index_inverse gives np.unique's first positions and inverse (few and
    many distinct values, repeats, empty)."""
    key = np.array([v // spread for v in values], dtype=np.int64)
    _u, first, inv = np.unique(key, return_index=True, return_inverse=True)
    got_first, got_inv = fastgraph.unique_index_inverse(key)
    assert got_first.tolist() == first.tolist() and got_inv.tolist() == inv.reshape(-1).tolist()


def test_launch_shares_of_a_one_graph_plan_read_no_graph_column():
    """direct_launch_s of a one-graph template (its graph ids taken as 0, the graphs column not
    read) equals the same computation on the plan's graphs column, on a rebuilt graph."""
    from sim.model.costs import direct_launch_s
    from sim.plan import KIND_CODE, STREAM_CODE, OpKind, Stream

    scn = load_scenario(ROOT / "scenarios" / "default.toml")
    ctx = make_context(scn, parse_variant("baseline"), rep_rng(scn.seed, 0, -1))
    ctx.rng = np.random.default_rng(0)
    tpl = build_template(ctx, 512, 0, 0, draw_masks(ctx, 512, 0), 0, (True, 2048, 0.0))
    plan, hw = tpl.plan, scn.hardware
    got = direct_launch_s(plan, hw)
    graph = np.asarray(plan.graphs, dtype=np.int64)
    a = plan.arrays
    gpu = (a.stream == STREAM_CODE[Stream.COMPUTE]) & (a.kind != KIND_CODE[OpKind.H2D])
    per_graph = np.bincount(graph[gpu], minlength=1).astype(float)
    kernels = np.asarray(plan.meta["graph_kernels"], dtype=float)
    share = np.divide(kernels, per_graph, out=np.zeros_like(per_graph), where=per_graph > 0)
    want = np.zeros(len(plan))
    want[gpu] = hw.ggml.launch_s * share[graph[gpu]]
    assert isinstance(got, np.ndarray) and got.tolist() == want.tolist() and got.any()


def test_price_classes_partition_the_ops_by_what_prices_them():
    """build_graph_columns' price classes: ops of one class have equal (kind, bytes, shape,
    pinned, tag) and each class's representative is one of its ops (on the default scenario's
    pp512 graph, rebuilt and reused)."""
    from sim.plan.builder import Emitter

    scn = load_scenario(ROOT / "scenarios" / "default.toml")
    ctx = make_context(scn, parse_variant("baseline"), rep_rng(scn.seed, 0, -1))
    ctx.rng = np.random.default_rng(0)
    for rebuilt in (True, False):
        em = Emitter(Plan(label="graph"), ctx)
        em.rebuilt, em.call_tokens = rebuilt, 2048
        assert fastgraph.build_graph_columns(em, 512, 0, 0, draw_masks(ctx, 512, 0))
        classes, first = em.price_classes
        p = em.plan
        what = [(k, nb, sh, pin, tag) for k, nb, sh, pin, tag in zip(p.kinds, p.nbytes, p.shapes, p.pinned, p.tags)]
        assert classes.shape == (len(p),) and first.size == classes.max() + 1
        assert (classes[first] == np.arange(first.size)).all()
        by_class: dict = {}
        for c, w in zip(classes.tolist(), what):
            by_class.setdefault(c, set()).add(w)
        assert all(len(ws) == 1 for ws in by_class.values())


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_residency_from_the_context_s_flags_is_the_residency_by_id(path):
    """_resident reading the context's positional host flags (make_context's) gives the host
    column it gives from the ids of host tensors (a context without those flags), every variant."""
    from dataclasses import replace as dc_replace

    scn = load_scenario(path)
    st = fastgraph._static_items(scn.model)
    if st is None:
        pytest.skip("model not covered")
    for v in scn.variants:
        try:
            ctx = make_context(scn, v, np.random.default_rng(0))
        except PlacementError:
            continue
        assert ctx.host_flags is not None
        by_id = dc_replace(ctx, host_flags=None)
        a, b = fastgraph._resident(ctx, st), fastgraph._resident(by_id, st)
        assert a.host.tolist() == b.host.tolist() and a.dev.tolist() == b.dev.tolist()
