"""Engines: analytic vs DES agreement, theory, invariants and a hand-derived golden trace."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plangen import durations_for, golden_plan, pipeline_plan, plans, plans_with_durations
from sim import engines
from sim.engines import analytic, des
from sim.plan import KINDS, STREAMS, Op, OpKind, Plan, Schedule, Stream

from scenario_factory import ROOT

SETTINGS = settings(max_examples=100, deadline=None)


def _pred_ends(plan: Plan, end: np.ndarray) -> np.ndarray:
    """max(end of queue predecessor, link predecessor, deps) per op, from the raw plan."""
    a = plan.arrays
    out = np.zeros(a.n)
    for i in range(a.n):
        ends = [end[j] for j in a.dep_idx[a.dep_ptr[i]:a.dep_ptr[i + 1]]]
        for j in (a.queue_prev[i], a.link_prev[i]):
            if j >= 0:
                ends.append(end[j])
        out[i] = max(ends, default=0.0)
    return out


def _check_contract(plan: Plan, dur: np.ndarray, start: np.ndarray, end: np.ndarray) -> None:
    a = plan.arrays
    np.testing.assert_array_equal(end, start + dur)
    for i, op in enumerate(plan.ops):
        for j in op.deps:
            assert start[i] >= end[j], f"op {i} starts before its dep {j} ended"
        if a.queue_prev[i] >= 0:
            assert start[i] >= end[a.queue_prev[i]], f"op {i} overlaps its queue predecessor"
        if a.link_prev[i] >= 0:
            assert start[i] >= end[a.link_prev[i]], f"H2D op {i} overlaps its link predecessor"
    # earliest schedule: nothing waits without a reason
    np.testing.assert_array_equal(start, _pred_ends(plan, end))
    # no two ops of a queue overlap; no two H2D of a link overlap (sorted by start)
    for ids_of in (a.queue, a.link):
        for q in np.unique(ids_of[ids_of >= 0]):
            ids = np.flatnonzero(ids_of == q)
            o = np.argsort(start[ids], kind="stable")
            s, e = start[ids][o], end[ids][o]
            assert (s[1:] >= e[:-1]).all()


# ------------------------------------------------------------------ agreement ----------


@SETTINGS
@given(plans_with_durations(zeros=True))
def test_des_agrees_with_analytic(pd_):
    plan, dur = pd_
    a = analytic.run(plan, dur)
    d = des.run(plan, dur)
    assert a.engine == "analytic" and d.engine == "des"
    np.testing.assert_allclose(d.start_s, a.start_s, rtol=1e-9, atol=0)
    np.testing.assert_allclose(d.end_s, a.end_s, rtol=1e-9, atol=0)


@SETTINGS
@given(plans_with_durations(zeros=True))
def test_both_engines_keep_the_contract(pd_):
    plan, dur = pd_
    for eng in engines.ENGINES:
        s = engines.run(plan, dur, engine=eng)
        _check_contract(plan, dur, s.start_s, s.end_s)


@settings(max_examples=60, deadline=None)
@given(plans(), st.data())
def test_batch_equals_separate_runs(plan, data):
    n = len(plan.ops)
    S = data.draw(st.integers(2, analytic.ROWS_MAX + 4))  # row by row up to ROWS_MAX, numpy above
    batch = np.stack([data.draw(durations_for(n)) for _ in range(S)])
    got = analytic.run(plan, batch)
    vec = analytic._run_batch(analytic.compile_plan(plan).preds, batch)  # numpy, whatever S
    np.testing.assert_array_equal(vec[0], got.start_s)
    np.testing.assert_array_equal(vec[1], got.end_s)
    assert got.start_s.shape == (S, n) and got.end_s.shape == (S, n)
    for k in range(S):
        one = analytic.run(plan, batch[k])
        np.testing.assert_array_equal(got.start_s[k], one.start_s)
        np.testing.assert_array_equal(got.end_s[k], one.end_s)
    np.testing.assert_array_equal(got.makespan_s, [analytic.run(plan, b).makespan_s for b in batch])
    # the DES runs a batch row by row
    d = des.run(plan, batch)
    np.testing.assert_allclose(d.end_s, got.end_s, rtol=1e-9, atol=0)


# ------------------------------------------------------------------ invariants ---------


@SETTINGS
@given(plans_with_durations())
def test_makespan_at_least_busiest_queue_and_link(pd_):
    plan, dur = pd_
    a = plan.arrays
    ms = analytic.run(plan, dur).makespan_s
    busy_q = np.bincount(a.queue, weights=dur)
    assert ms >= busy_q.max() * (1 - 1e-12)
    if (a.link >= 0).any():
        busy_l = np.bincount(a.link[a.link >= 0], weights=dur[a.link >= 0])
        assert ms >= busy_l.max() * (1 - 1e-12)


@SETTINGS
@given(plans_with_durations(), st.floats(0.0, 1.0))
def test_faster_link_never_slows_anything(pd_, factor):
    """Shrinking every H2D duration (more bandwidth) moves no op later (max-plus is monotone)."""
    plan, dur = pd_
    h2d = np.array([op.kind is OpKind.H2D for op in plan.ops])
    faster = np.where(h2d, dur * factor, dur)
    s = analytic.run(plan, np.stack([dur, faster]))
    assert (s.end_s[1] <= s.end_s[0]).all()
    assert s.makespan_s[1] <= s.makespan_s[0]
    d = des.run(plan, faster)
    assert d.makespan_s <= des.run(plan, dur).makespan_s


# ------------------------------------------------------------------ theory -------------

_pos = st.floats(1e-6, 1e-2, allow_nan=False)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(_pos, _pos), min_size=1, max_size=30))
def test_sequential_plan_is_sum_of_durations(ct):
    """Baseline one-graph-copy: copy then compute, each op waiting for the previous one."""
    C = np.array([c for c, _ in ct])
    T = np.array([t for _, t in ct])
    plan = Plan()
    prev = None
    dur = []
    for i, (c, t) in enumerate(ct):
        prev = plan.add(OpKind.H2D, Stream.COMPUTE, 0, f"copy{i}", [prev])
        prev = plan.add(OpKind.GEMM, Stream.COMPUTE, 0, f"compute{i}", [prev])
        dur += [t, c]
    for eng in engines.ENGINES:
        ms = engines.run(plan, np.array(dur), engine=eng).makespan_s
        assert ms == pytest.approx(math.fsum(dur), rel=1e-12)
        assert ms == pytest.approx(analytic.sequential_makespan(C, T), rel=1e-12)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(_pos, _pos), min_size=1, max_size=30), st.integers(1, 6))
def test_pipeline_plan_matches_recurrence_and_closed_forms(ct, slots):
    C = np.array([c for c, _ in ct])
    T = np.array([t for _, t in ct])
    n = len(ct)
    plan, copies, computes = pipeline_plan(n, slots)
    dur = np.empty(len(plan.ops))
    dur[copies] = T
    dur[computes] = C
    a_rec, b_rec = analytic.pipeline_recurrence(C, T, slots)
    for eng in engines.ENGINES:
        s = engines.run(plan, dur, engine=eng)
        np.testing.assert_allclose(s.end_s[copies], a_rec, rtol=1e-12)
        np.testing.assert_allclose(s.end_s[computes], b_rec, rtol=1e-12)
    ms = analytic.run(plan, dur).makespan_s
    assert ms == pytest.approx(analytic.pipeline_makespan(C, T, slots), rel=1e-12)
    if slots == 1:
        assert ms == pytest.approx(analytic.sequential_makespan(C, T), rel=1e-12)
    if slots == 2:
        closed = T[0] + sum(max(C[i], T[i + 1]) for i in range(n - 1)) + C[-1]
        assert ms == pytest.approx(closed, rel=1e-12)
    if slots >= n:
        flow_shop = max(T[: j + 1].sum() + C[j:].sum() for j in range(n))
        assert ms == pytest.approx(flow_shop, rel=1e-12)
    # more slots never hurt, and the pipeline never beats its busiest stream
    assert analytic.pipeline_makespan(C, T, slots + 1) <= ms * (1 + 1e-12)
    assert ms >= max(C.sum(), T.sum()) * (1 - 1e-12)


def test_pipeline_makespan_vectorised_and_known_values():
    C = np.array([[2.0, 2.0, 2.0], [1.0, 5.0, 1.0]])
    T = np.array([[1.0, 1.0, 1.0], [3.0, 3.0, 3.0]])
    # by hand, slots=2: T1 + max(C1,T2) + max(C2,T3) + C3
    #   row 0: 1 + 2 + 2 + 2 = 7 ; row 1: 3 + max(1,3) + max(5,3) + 1 = 12
    np.testing.assert_array_equal(analytic.pipeline_makespan(C, T, 2), [7.0, 12.0])
    np.testing.assert_array_equal(analytic.pipeline_makespan(C, T, 1), [9.0, 16.0])
    np.testing.assert_array_equal(analytic.sequential_makespan(C, T), [9.0, 16.0])
    with pytest.raises(ValueError, match="slots"):
        analytic.pipeline_makespan(C, T, 0)


# ------------------------------------------------------------------ golden trace -------


def test_golden_trace_hand_derived():
    plan, dur = golden_plan()
    # Derived by hand from the contract (queue order, link order, deps), link 0 shared by
    # "prefetch w1", "pageable copy w2", "prefetch w3" in that (plan) order:
    #  0 launch attn      host   no preds                              -> [0,    1   ]
    #  1 attn             comp0  dep 0 (1)                             -> [1,    5   ]
    #  2 launch prefetch  host   host prev 0 (1)                       -> [1,    2   ]
    #  3 prefetch w1      copy0  dep 2 (2), first on link              -> [2,    5   ]
    #  4 sync compute     host   host prev 2 (2), dep 1 (5)            -> [5,    5.5 ]
    #  5 pageable copy w2 host   host prev 4 (5.5), link prev 3 (5)    -> [5.5,  7.5 ]
    #  6 wait ready       host   host prev 5 (7.5)                     -> [7.5,  7.75]
    #  7 launch ffn       host   host prev 6 (7.75)                    -> [7.75, 8.75]
    #  8 ffn              comp0  comp prev 1 (5), deps 7 (8.75), 6 (7.75), 3 (5), 5 (7.5)
    #                                                                  -> [8.75, 10.75]
    #  9 prefetch w3      copy0  copy prev 3 (5), deps 1 (5), 2 (2), link prev 5 (7.5):
    #                            its buffer is free at 5 but the pageable copy holds the link
    #                                                                  -> [7.5,  10.5]
    expected = [
        ("launch attn", 0.0, 1.0), ("attn", 1.0, 5.0), ("launch prefetch", 1.0, 2.0),
        ("prefetch w1", 2.0, 5.0), ("sync compute", 5.0, 5.5), ("pageable copy w2", 5.5, 7.5),
        ("wait ready", 7.5, 7.75), ("launch ffn", 7.75, 8.75), ("ffn", 8.75, 10.75),
        ("prefetch w3", 7.5, 10.5),
    ]
    for eng in engines.ENGINES:
        s = engines.run(plan, dur, engine=eng)
        got = [(op.name, float(s.start_s[i]), float(s.end_s[i])) for i, op in enumerate(plan.ops)]
        assert got == expected, eng
        assert s.makespan_s == 10.75


def test_link_is_granted_in_plan_order_not_request_order():
    """A later copy whose queue is free early still waits for an earlier copy of the link."""
    p = Plan()
    k = p.add(OpKind.GEMM, Stream.COMPUTE, 0, "compute")                 # [0, 5]
    p.add(OpKind.H2D, Stream.COPY, 0, "copy after compute", [k])        # [5, 6]
    p.add(OpKind.H2D, Stream.HOST, 0, "pageable copy", pinned=False)    # ready at 0, link at 6 -> [6, 8]
    p.add(OpKind.H2D, Stream.COPY, 1, "copy on gpu1")                   # other link -> [0, 1]
    dur = np.array([5.0, 1.0, 2.0, 1.0])
    for eng in engines.ENGINES:
        s = engines.run(plan=p, durations=dur, engine=eng)
        assert s.start_s.tolist() == [0.0, 5.0, 6.0, 0.0]
        assert s.end_s.tolist() == [5.0, 6.0, 8.0, 1.0]


# ------------------------------------------------------------------ errors -------------


def test_unknown_engine_names_accepted_values():
    plan, dur = golden_plan()
    with pytest.raises(ValueError, match="analytic, des"):
        engines.run(plan, dur, engine="simpy")


@pytest.mark.parametrize("engine", engines.ENGINES)
def test_bad_durations_rejected(engine):
    plan, dur = golden_plan()
    with pytest.raises(ValueError, match="shape"):
        engines.run(plan, dur[:-1], engine=engine)
    bad = dur.copy()
    bad[3] = -1.0
    with pytest.raises(ValueError, match="op 3"):
        engines.run(plan, bad, engine=engine)
    bad[3] = np.nan
    with pytest.raises(ValueError, match="op 3"):
        engines.run(plan, bad, engine=engine)


def test_compiled_plan_cache_follows_plan_changes():
    plan, dur = golden_plan()
    assert analytic.run(plan, dur).makespan_s == 10.75
    plan.add(OpKind.GEMM, Stream.COMPUTE, 0, "late", [len(plan.ops) - 1])  # after prefetch w3
    s = analytic.run(plan, np.append(dur, 1.0))
    assert s.end_s[-1] == 11.75  # max(ffn end 10.75, prefetch w3 end 10.5) + 1
    assert des.run(plan, np.append(dur, 1.0)).end_s[-1] == 11.75


def test_empty_plan():
    for eng in engines.ENGINES:
        s = engines.run(Plan(), np.zeros(0), engine=eng)
        assert s.start_s.shape == (0,) and s.makespan_s == 0.0


def test_run_scenario_serial_and_parallel_agree_with_a_warm_cache():
    """run_scenario's serial path (which reuses the contexts built for the placement check)
    and its process pool give the same results, expert-cache hit rates included."""
    from sim.engines.metrics import run_scenario
    from sim.model.specs import load_scenario, parse_variant

    scn = load_scenario(ROOT / "scenarios" / "tiny" / "tiny.toml")
    variants = [parse_variant("baseline"), parse_variant("cache_lru"), parse_variant("slots2+cache_lru")]
    a = run_scenario(scn, variants=variants, repetitions=2, jobs=1)
    b = run_scenario(scn, variants=variants, repetitions=2, jobs=3)
    assert [(r.variant, r.test) for r in a] == [(r.variant, r.test) for r in b]
    assert any(r.cache_hit_rate is not None for r in a)
    for x, y in zip(a, b):
        assert np.array_equal(x.tps, y.tps) and x.cache_hit_rate == y.cache_hit_rate and x.h2d_bytes == y.h2d_bytes


@SETTINGS
@given(plans(max_ops=60, max_deps=5))
def test_vectorised_predecessor_pruning_equals_the_loop(plan):
    """compile_plan's vectorised pruning (analytic._pruned_preds) gives the same predecessor
    lists as the straightforward per-op loop."""
    assert analytic._pruned_preds(plan.arrays) == analytic._pruned_preds_loop(plan.arrays)


@SETTINGS
@given(plans(max_ops=60, max_deps=5))
def test_des_waits_are_the_latest_dep_on_each_other_queue(plan):
    """The DES's cached structure: each op waits on exactly the latest dep of every other
    queue, and an op is watched exactly when some op waits on it."""
    st_ = des._structure(plan)
    a = plan.arrays
    q = a.queue.tolist()
    watched = [False] * a.n
    for op in plan.ops:
        best: dict[int, int] = {}
        for j in op.deps:
            if q[j] != q[op.id]:
                best[q[j]] = max(best.get(q[j], -1), j)
        assert sorted(st_.waits[op.id]) == sorted(best.values())
        for j in best.values():
            watched[j] = True
    assert st_.watched == watched
    assert des._structure(plan) is st_  # cached
    plan.add(OpKind.ISSUE, Stream.HOST, -1, "late")
    assert des._structure(plan).n == a.n + 1  # rebuilt after an op was added


# ------------------------------------------------------------------ DES runs -----------
# The DES plays consecutive ops of a queue that need not wait as one run under one timeout
# (sim.engines.des, "Runs"). These plans put the places where a run must stop (an op another
# queue waits on, a dependency that ends inside a would-be run, link ops) where a run would
# otherwise go on, and compare every start and end with the analytic engine to the bit.

H, C, K = Stream.HOST, Stream.COMPUTE, Stream.COPY


def _des_equals_analytic(plan: Plan, dur) -> Schedule:
    dur = np.asarray(dur, dtype=np.float64)
    a = analytic.run(plan, dur)
    d = des.run(plan, dur)
    np.testing.assert_array_equal(d.start_s, a.start_s)
    np.testing.assert_array_equal(d.end_s, a.end_s)
    _check_contract(plan, dur, d.start_s, d.end_s)
    return d


def _scheduled_events(plan: Plan, dur, monkeypatch) -> int:
    """SimPy events one DES run schedules (calls of ``Environment.schedule``: timeouts,
    triggered events, and the start and end of each queue process)."""
    import simpy.core

    schedule = simpy.core.Environment.schedule
    calls = [0]

    def counting(self, *args, **kw):
        calls[0] += 1
        return schedule(self, *args, **kw)

    with monkeypatch.context() as m:
        m.setattr(simpy.core.Environment, "schedule", counting)
        des.run(plan, np.asarray(dur, dtype=np.float64))
    return calls[0]


def test_des_plays_a_queue_without_waits_as_one_timeout(monkeypatch):
    plan = Plan()
    for i in range(10):
        plan.add(OpKind.HOST_WORK, H, -1, f"w{i}")
    dur = np.arange(1.0, 11.0)
    s = _des_equals_analytic(plan, dur)
    assert s.end_s.tolist() == np.cumsum(dur).tolist()
    assert _scheduled_events(plan, dur, monkeypatch) == 1 + 2  # one timeout, the process's start and end


@pytest.mark.parametrize("compute_first", [False, True])
def test_des_run_stops_at_an_op_another_queue_waits_on(compute_first):
    """h1 sits in the middle of a would-be run of the host; g waits on it, so h1 needs its own
    completion event: g starts at h1's end (3), not at the end of the host's ops (10). With
    the compute op first, the compute queue reaches g before the host scheduled h1 (a
    placeholder)."""
    plan = Plan()
    if compute_first:
        plan.add(OpKind.GEMM, C, 0, "c0")
    h0 = plan.add(OpKind.HOST_WORK, H, -1, "h0")
    h1 = plan.add(OpKind.HOST_WORK, H, -1, "h1", [h0])
    plan.add(OpKind.HOST_WORK, H, -1, "h2")
    plan.add(OpKind.HOST_WORK, H, -1, "h3")
    g = plan.add(OpKind.GEMM, C, 0, "g", [h1])
    dur = ([0.25] if compute_first else []) + [1.0, 2.0, 3.0, 4.0, 0.5]
    s = _des_equals_analytic(plan, dur)
    assert (s.start_s[g], s.end_s[g]) == (3.0, 3.5)


def test_des_placeholder_waiter_of_an_op_inside_a_run():
    """The compute queue reaches g before the host scheduled h1 (the host waits on c0); h1 is
    then in the middle of the host's run (sync, h1, h2): g resumes at h1's end."""
    plan = Plan()
    c0 = plan.add(OpKind.GEMM, C, 0, "c0")
    plan.add(OpKind.HOST_SYNC, H, -1, "sync", [c0])
    h1 = plan.add(OpKind.HOST_WORK, H, -1, "h1")
    plan.add(OpKind.HOST_WORK, H, -1, "h2")
    g = plan.add(OpKind.GEMM, C, 0, "g", [h1])
    s = _des_equals_analytic(plan, [1.0, 0.5, 0.25, 2.0, 1.0])
    assert s.start_s.tolist() == [0.0, 1.0, 1.5, 1.75, 1.75]
    assert s.end_s[g] == 2.75


@pytest.mark.parametrize("k_dur", [0.5, 1.0, 1.5, 2.0, 2.5, 5.0])
@pytest.mark.parametrize("compute_first", [False, True])
def test_des_dependency_ending_inside_a_would_be_run(k_dur, compute_first):
    """c waits on k, which ends before, at, or after the host's queue predecessor b: the run
    a, b, c, d of the host cannot take c unless k has ended; c starts at max(2, end of k)."""
    plan = Plan()
    if compute_first:
        k = plan.add(OpKind.GEMM, C, 0, "k")
    a = plan.add(OpKind.HOST_WORK, H, -1, "a")
    if not compute_first:
        k = plan.add(OpKind.GEMM, C, 0, "k")
    plan.add(OpKind.HOST_WORK, H, -1, "b", [a])
    c = plan.add(OpKind.HOST_SYNC, H, -1, "c", [k])
    plan.add(OpKind.HOST_WORK, H, -1, "d")
    dur = np.ones(len(plan))
    dur[k] = k_dur
    s = _des_equals_analytic(plan, dur)
    assert s.start_s[c] == max(2.0, k_dur)
    assert s.makespan_s == max(2.0, k_dur) + 2.0


def test_des_waits_at_once_for_a_dependency_due_after_its_run(monkeypatch):
    """a ends at 1 and nobody waits on it; s waits on k, already scheduled to end at 3: the
    host schedules no timeout for a and waits for k at once. With k due before a ends it
    cannot: a gets its timeout."""
    plan = Plan()
    k = plan.add(OpKind.GEMM, C, 0, "k")
    plan.add(OpKind.HOST_WORK, H, -1, "a")
    s_ = plan.add(OpKind.HOST_SYNC, H, -1, "s", [k])
    late = _des_equals_analytic(plan, [3.0, 1.0, 0.5])
    assert (late.start_s[s_], late.end_s[s_]) == (3.0, 3.5)
    assert _scheduled_events(plan, [3.0, 1.0, 0.5], monkeypatch) == 2 + 4  # k and s; 2 processes
    early = _des_equals_analytic(plan, [0.5, 1.0, 0.5])
    assert (early.start_s[s_], early.end_s[s_]) == (1.0, 1.5)
    assert _scheduled_events(plan, [0.5, 1.0, 0.5], monkeypatch) == 3 + 4  # k, a and s


def test_des_zero_duration_op_waited_on_ends_inside_a_run(monkeypatch):
    """i lasts 0 and ends when the host reaches it after its wait: it has ended at once, the
    placeholder g waits on is triggered, and the host's run goes on over i to w."""
    plan = Plan()
    c0 = plan.add(OpKind.GEMM, C, 0, "c0")
    plan.add(OpKind.HOST_SYNC, H, -1, "sync", [c0])
    i = plan.add(OpKind.ISSUE, H, -1, "i")
    plan.add(OpKind.HOST_WORK, H, -1, "w")
    g = plan.add(OpKind.GEMM, C, 0, "g", [i])
    dur = [1.0, 0.0, 0.0, 2.0, 1.0]
    s = _des_equals_analytic(plan, dur)
    assert s.start_s.tolist() == [0.0, 1.0, 1.0, 1.0, 1.0]
    assert s.end_s.tolist() == [1.0, 1.0, 1.0, 3.0, 2.0]
    # c0, g and the host's one run (sync, i, w); the placeholder triggered; 2 processes
    assert _scheduled_events(plan, dur, monkeypatch) == 3 + 1 + 4
    assert s.start_s[g] == 1.0


def test_des_links_stop_runs_and_are_granted_in_plan_order():
    """Copies of one link from the copy stream and the host (pageable): each is a run of its
    own, granted in plan order; the host's ops around its copy still run."""
    plan = Plan()
    plan.add(OpKind.D2H, K, 0, "d2h")                                     # [0, 5], no link
    plan.add(OpKind.H2D, K, 0, "c1")                                      # [5, 6]
    plan.add(OpKind.HOST_WORK, H, -1, "x")                                # [0, 0.5]
    p_ = plan.add(OpKind.H2D, H, 0, "pageable", pinned=False)             # ready 0.5, link at 6 -> [6, 7]
    plan.add(OpKind.HOST_WORK, H, -1, "y")                                # [7, 7.5]
    plan.add(OpKind.HOST_WORK, H, -1, "z")                                # [7.5, 8]
    c2 = plan.add(OpKind.H2D, K, 0, "c2")                                 # copy queue free at 6, link at 7 -> [7, 8]
    g = plan.add(OpKind.GEMM, C, 0, "g", [c2])                            # [8, 9]
    plan.add(OpKind.HOST_SYNC, H, -1, "sync", [g])                        # [9, 9]
    dur = [5.0, 1.0, 0.5, 1.0, 0.5, 0.5, 1.0, 1.0, 0.0]
    s = _des_equals_analytic(plan, dur)
    assert s.start_s.tolist() == [0.0, 5.0, 0.0, 6.0, 7.0, 7.5, 7.0, 8.0, 9.0]
    assert (s.start_s[p_], s.end_s[g]) == (6.0, 9.0)


def test_des_run_whose_end_no_single_delay_reaches():
    """From now = 2**-53 no delay d gives now + d == 1 + 2**-52 in float64 (the run b, c ends
    there: b ends at 1.0, c 2**-52 later); the DES then plays the run op by op, so z, which
    waits on c, starts at c's end to the bit."""
    plan = Plan()
    a = plan.add(OpKind.HOST_WORK, H, -1, "a")
    plan.add(OpKind.HOST_WORK, H, -1, "b")
    c = plan.add(OpKind.HOST_WORK, H, -1, "c")
    plan.add(OpKind.GEMM, C, 0, "y", [a])
    z = plan.add(OpKind.GEMM, C, 0, "z", [c])
    now, end = 2.0**-53, 1.0 + 2.0**-52
    assert all(now + d != end for d in (end - now, math.nextafter(end - now, 2), math.nextafter(end - now, 0)))
    s = _des_equals_analytic(plan, [now, 1.0, 2.0**-52, 0.0, 1.0])
    assert s.start_s[z] == end == s.end_s[c]


def test_des_stall_names_the_first_op_never_run():
    """A plan that breaks the contract (built from Op objects, a dep on a later op): after a
    run of the host, op 1 and op 3 wait on each other forever."""
    ops = [Op(0, OpKind.HOST_WORK, H, -1, "x"), Op(1, OpKind.HOST_SYNC, H, -1, "sync", deps=(3,)),
           Op(2, OpKind.HOST_WORK, H, -1, "y"), Op(3, OpKind.GEMM, C, 0, "g", deps=(1,))]
    with pytest.raises(RuntimeError, match=r"op 1 \(sync\) never ran"):
        des.run(Plan(ops=ops), np.ones(4))


_TIES = st.sampled_from([0.0, 2.0**-53, 2.0**-52, 0.5, 1.0, 3.0])


@SETTINGS
@given(plans(max_ops=60, max_deps=5), st.data())
def test_des_equals_analytic_to_the_bit(plan, data):
    """Both engines do the same float additions: equal times, also with durations that make
    ties, zero-duration ops and runs no single delay reaches (2**-53 beside 1.0) common."""
    n = len(plan)
    dur = np.array(data.draw(st.lists(_TIES, min_size=n, max_size=n)), dtype=np.float64)
    _des_equals_analytic(plan, dur)
    _des_equals_analytic(plan, data.draw(durations_for(n, zeros=True)))


def test_plan_add_normalises_dependencies():
    plan = Plan()
    a = plan.add(OpKind.ISSUE, Stream.HOST, -1, "a")
    b = plan.add(OpKind.ISSUE, Stream.HOST, -1, "b", (None, -1))
    c = plan.add(OpKind.GEMM, Stream.COMPUTE, 0, "c", (b, a, b, None), nbytes=3, tag="t")
    d = plan.add(OpKind.GEMM, Stream.COMPUTE, 0, "d", (c,))
    assert plan.ops[b].deps == () and plan.ops[c].deps == (a, b) and plan.ops[d].deps == (c,)
    assert plan.ops[c] == plan.ops[c].__class__(c, OpKind.GEMM, Stream.COMPUTE, 0, "c", (a, b), nbytes=3, tag="t")
    with pytest.raises(ValueError, match="later op"):
        plan.add(OpKind.ISSUE, Stream.HOST, -1, "e", (d + 1,))
    with pytest.raises(ValueError, match="later op"):
        plan.add(OpKind.ISSUE, Stream.HOST, -1, "f", (0, d + 1))


# ------------------------------------------------------------------ columnar plan ------


def _arrays_loop(plan: Plan):
    """The straightforward per-op loop over ``plan.ops`` that Plan.arrays vectorises:
    (queue, link, queue_prev, link_prev, dep_ptr, dep_idx, queue names)."""
    qnames: dict = {}
    queue, link, qprev, lprev, ptr, idx = [], [], [], [], [0], []
    last_q: dict = {}
    last_l: dict = {}
    for i, op in enumerate(plan.ops):
        q = qnames.setdefault(op.queue, len(qnames))
        queue.append(q)
        qprev.append(last_q.get(q, -1))
        last_q[q] = i
        if op.kind is OpKind.H2D:
            lk = max(op.device, 0)
            link.append(lk)
            lprev.append(last_l.get(lk, -1))
            last_l[lk] = i
        else:
            link.append(-1)
            lprev.append(-1)
        idx.extend(op.deps)
        ptr.append(len(idx))
    names = [f"{s}{d}" if d >= 0 else s for (s, d) in qnames]
    return queue, link, qprev, lprev, ptr, idx, names


def _check_arrays(plan: Plan) -> None:
    a = plan.arrays
    queue, link, qprev, lprev, ptr, idx, names = _arrays_loop(plan)
    assert a.queue.tolist() == queue and a.link.tolist() == link
    assert a.queue_prev.tolist() == qprev and a.link_prev.tolist() == lprev
    assert a.dep_ptr.tolist() == ptr and a.dep_idx.tolist() == idx and a.queue_names == names
    assert [KINDS[k] for k in a.kind.tolist()] == [op.kind for op in plan.ops]
    assert [STREAMS[k] for k in a.stream.tolist()] == [op.stream for op in plan.ops]


@SETTINGS
@given(plans(max_ops=60, max_deps=5))
def test_plan_arrays_equal_the_per_op_loop(plan):
    """Plan.arrays (numpy on the plan's columns) equals the loop over Op objects; a plan made
    from those Op objects (Plan(ops=...)) has the same columns, and a pickled plan too."""
    import pickle

    _check_arrays(plan)
    copy = Plan(ops=list(plan.ops), label=plan.label)
    again = pickle.loads(pickle.dumps(plan))
    for other in (copy, again):
        for c in ("kinds", "streams", "devices", "names", "dep_ptr", "dep_idx", "nbytes", "shapes", "layers",
                  "splits", "graphs", "slots", "slot_bytes", "pinned", "tags"):
            assert getattr(other, c) == getattr(plan, c), c
        assert other.ops == plan.ops
        _check_arrays(other)


def test_plan_columns_of_built_plans_equal_their_ops():
    """On built plans (every kind of op, pageable copies on the host queue, two GPUs): the
    arrays equal the loop, and each Op made from the columns holds the fields appended."""
    from sim.plan.builder import build_plan
    from sim.model.specs import BenchTest, load_scenario, parse_variant

    for name in ("default.toml", "h200x2-qwen3-30b-a3b.toml", "gemma3-27b-ffn-cpu.toml"):
        scn = load_scenario(ROOT / "scenarios" / name)
        for v in ("baseline", "prefetch_ungated", "slots3"):
            for t in (BenchTest(600, 0), BenchTest(0, 2)):
                plan = build_plan(scn, parse_variant(v), t, np.random.default_rng(0))
                _check_arrays(plan)
                assert [plan.op(i) for i in range(len(plan))] == plan.ops
                assert plan.h2d_bytes() == sum(op.nbytes for op in plan.ops if op.kind is OpKind.H2D)


@SETTINGS
@given(plans(max_ops=60, max_deps=3))
def test_compiled_predecessor_columns_are_the_first_three_predecessors(plan):
    """CompiledPlan's p0, p1, p2 (lists) and columns (arrays) are each op's first three pruned
    predecessors, -1 where it has fewer (None when some op has more), and ``two`` tells that no
    op has a third."""
    comp = analytic.compile_plan(plan)
    preds = comp.preds
    if any(len(p) > 3 for p in preds):
        assert comp.p0 is None and not comp.two
        return
    want = [[p[k] if len(p) > k else -1 for p in preds] for k in range(3)]
    assert [comp.p0, comp.p1, comp.p2] == want
    assert [c.tolist() for c in comp.columns] == want and all(c.dtype == np.int64 for c in comp.columns)
    assert comp.two == all(len(p) <= 2 for p in preds)


@SETTINGS
@given(plans_with_durations(zeros=True))
def test_three_predecessor_recurrence_equals_the_general_one(pd_):
    """The scalar recurrence on the first three predecessors (-1 reading a 0.0 slot) gives the
    general per-tuple recurrence's start and end times, to the bit."""
    plan, dur = pd_
    comp = analytic.compile_plan(plan)
    ref = analytic._run_scalar(comp.preds, dur.tolist())
    if comp.p0 is not None:
        assert analytic._run_three(comp.p0, comp.p1, comp.p2, dur.tolist()) == ref
    s = analytic.run(plan, dur)
    assert s.start_s.tolist() == ref[0] and s.end_s.tolist() == ref[1]


@settings(max_examples=80, deadline=None)
@given(plans(), st.data())
def test_tree_batch_equals_each_row_run_alone(plan, data):
    """_run_tree (one row op by op, the others summed along its critical tree and checked,
    rows the tree does not fit op by op) gives each row's scalar recurrence to the bit: rows
    that differ from the first in a few durations (mostly the same tree), rows with fresh
    durations (mostly another tree: the fallbacks) and zeros; and run() with the tree path off
    (the op-by-op numpy batch) gives the same arrays."""
    n = len(plan.ops)
    base = data.draw(durations_for(n, zeros=True))
    S = data.draw(st.integers(analytic.TREE_MIN_ROWS, analytic.TREE_MIN_ROWS + 6))
    rows = []
    for _ in range(S):
        if data.draw(st.booleans()):
            r = base.copy()
            k = data.draw(st.integers(0, n - 1))
            r[k] = data.draw(st.floats(0.0, 1e-2))
            rows.append(r)
        else:
            rows.append(data.draw(durations_for(n, zeros=True)))
    batch = np.stack(rows)
    comp = analytic.compile_plan(plan)
    for _ in range(2):  # the second time starts from the tree the first one left
        start, end = analytic._run_tree(comp, batch)
        for k in range(S):
            s1, e1 = analytic._run_one(comp, batch[k].tolist())
            assert start[k].tolist() == s1 and end[k].tolist() == e1
    ref = analytic._run_batch(comp.preds, batch)
    np.testing.assert_array_equal(ref[0], start)
    np.testing.assert_array_equal(ref[1], end)


@SETTINGS
@given(plans(), st.data())
def test_small_batch_after_a_kept_tree_equals_each_row_run_alone(plan, data):
    """Once a compiled plan holds a critical tree (an earlier batch), run() times a batch of
    2..ROWS_MAX scenarios along it: each row equals its own scalar recurrence to the bit,
    with no tree, with a fitting tree and with one that does not fit (fresh durations)."""
    n = len(plan.ops)
    comp = analytic.compile_plan(plan)
    first = np.stack([data.draw(durations_for(n, zeros=True)) for _ in range(analytic.TREE_MIN_ROWS)])
    for _ in range(2):
        S = data.draw(st.integers(2, analytic.ROWS_MAX))
        batch = np.stack([data.draw(durations_for(n, zeros=True)) for _ in range(S)])
        kept = comp._last_tree is not None
        got = analytic.run(comp, batch)
        for k in range(S):
            s1, e1 = analytic._run_one(comp, batch[k].tolist())
            assert got.start_s[k].tolist() == s1 and got.end_s[k].tolist() == e1
        if not kept:
            analytic.run(comp, first)  # leaves a tree for the next round
            assert n == 0 or comp._last_tree is not None


def test_tree_batch_on_a_memo_template_equals_the_op_by_op_batch(monkeypatch):
    """On a built graph (the default scenario's pp512 graph) timed at 16 KV lengths, as
    sim.plan.memo does for a pp8192 test: the tree path equals the op-by-op numpy batch to the
    bit, and fits every row without a fallback."""
    from sim.plan.builder import make_context
    from sim.plan.memo import _row_at, build_template
    from sim.engines.metrics import rep_rng
    from sim.model.specs import BenchTest, load_scenario, parse_variant

    scn = load_scenario(ROOT / "scenarios" / "default.toml")
    v = parse_variant("baseline")
    ctx = make_context(scn, v, rep_rng(scn.seed, 0, -1))
    ctx.rng = np.random.default_rng(0)
    from sim.plan.builder import draw_masks
    tpl = build_template(ctx, 512, 0, 0, draw_masks(ctx, 512, 0), 0)
    rows = [tpl.rows[_row_at(tpl, ctx, kv)] for kv in range(0, 8192, 512)]
    batch = np.stack(rows)
    calls = []
    real, real_chains, real_two = analytic._run_one, analytic._run_three_chains, analytic._run_two_choice
    monkeypatch.setattr(analytic, "_run_one", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(analytic, "_run_three_chains", lambda *a: calls.append(1) or real_chains(*a))
    monkeypatch.setattr(analytic, "_run_two_choice", lambda *a: calls.append(1) or real_two(*a))
    got = analytic.run(tpl.comp, batch)
    assert len(calls) == 1  # the first row, op by op; the other 15 along its tree
    ref = analytic._run_batch(tpl.comp.preds, batch)
    np.testing.assert_array_equal(got.start_s, ref[0])
    np.testing.assert_array_equal(got.end_s, ref[1])
    monkeypatch.setattr(analytic, "ENABLE_TREE", False)
    off = analytic.run(tpl.comp, batch)
    np.testing.assert_array_equal(off.end_s, got.end_s)
