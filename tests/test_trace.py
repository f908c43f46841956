"""Trace schema, Chrome-trace export and the overlap metrics."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plangen import golden_plan, pipeline_plan, plans_with_durations
from sim import engines
from sim.views import trace
from sim.engines import analytic
from sim.plan import COMPUTE_KINDS, OpKind, Stream


def _golden_df(engine="des", **kw):
    plan, dur = golden_plan()
    return plan, trace.to_dataframe(plan, engines.run(plan, dur, engine=engine), **kw)


def test_dataframe_schema_and_content():
    plan, df = _golden_df(test="pp512", variant="prefetch")
    assert tuple(df.columns) == trace.TRACE_COLUMNS
    trace.validate_trace(df)
    assert len(df) == len(plan.ops)
    assert {c: str(t) for c, t in df.dtypes.items()} == trace.TRACE_DTYPES
    row = df.set_index("name").loc["pageable copy w2"]
    assert tuple(row[["kind", "stream", "device", "queue", "nbytes", "tag"]]) == \
        ("h2d", "host", 0, "host", 2 << 20, "selective")
    assert tuple(row[["start_s", "end_s", "dur_s"]]) == (5.5, 7.5, 2.0)
    assert set(df.queue) == {"host", "compute0", "copy0"}  # host queue whatever the device
    assert (df.engine == "des").all() and (df.test == "pp512").all() and (df.variant == "prefetch").all()


def test_batch_schedule_needs_a_scenario():
    plan, dur = golden_plan()
    s = analytic.run(plan, np.stack([dur, 2 * dur]))
    with pytest.raises(ValueError, match="scenario"):
        trace.to_dataframe(plan, s)
    df = trace.to_dataframe(plan, s, scenario=1)
    assert df.end_s.max() == 2 * 10.75


@pytest.mark.parametrize("breakage", ["drop", "extra", "reorder", "int_as_float", "time_as_str", "backwards"])
def test_validate_trace_rejects_wrong_schema(breakage):
    _, df = _golden_df()
    if breakage == "drop":
        df = df.drop(columns=["slot"])
    elif breakage == "extra":
        df = df.assign(extra=1)
    elif breakage == "reorder":
        cols = list(trace.TRACE_COLUMNS)
        cols[0], cols[1] = cols[1], cols[0]
        df = df[cols]
    elif breakage == "int_as_float":
        df["nbytes"] = df["nbytes"].astype(float)
    elif breakage == "time_as_str":
        df["start_s"] = df["start_s"].astype(str)
    elif breakage == "backwards":
        df.loc[3, "end_s"] = df.loc[3, "start_s"] - 1.0
    with pytest.raises(ValueError, match="trace"):
        trace.validate_trace(df)


# ------------------------------------------------------------------ Chrome trace -------


def test_chrome_trace_round_trip(tmp_path):
    plan, df = _golden_df(test="pp512", variant="v")
    out = trace.to_chrome_trace(df, tmp_path / "sub" / "golden.json")
    doc = json.loads(out.read_text())
    assert sorted(p.name for p in out.parent.iterdir()) == ["golden.json"]  # no temp file left
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == len(plan.ops)
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    pname = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    tname = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert set(pname.values()) == {"host", "gpu0"}
    by_id = {e["args"]["op_id"]: e for e in xs}
    for r in df.itertuples():
        e = by_id[r.op_id]
        assert e["name"] == r.name
        assert e["ts"] == pytest.approx(r.start_s * 1e6, rel=1e-12)
        assert e["dur"] == pytest.approx(r.dur_s * 1e6, rel=1e-12)
        assert tname[(e["pid"], e["tid"])] == r.queue
        assert pname[e["pid"]] == ("host" if r.stream in ("host", "cpu") else f"gpu{r.device}")
        assert (e["args"]["bytes"], e["args"]["layer"], e["args"]["tag"]) == (r.nbytes, r.layer, r.tag)
    # hand check: "ffn" runs [8.75 s, 10.75 s]
    ffn = next(e for e in xs if e["name"] == "ffn")
    assert (ffn["ts"], ffn["dur"]) == (8.75e6, 2.0e6)


def test_chrome_trace_several_runs_get_separate_processes(tmp_path):
    _, a = _golden_df("analytic", variant="a")
    _, b = _golden_df("des", variant="b")
    doc = json.loads(trace.to_chrome_trace(pd.concat([a, b], ignore_index=True), tmp_path / "t.json").read_text())
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert names == {"host [analytic a ]", "gpu0 [analytic a ]", "host [des b ]", "gpu0 [des b ]"}


def test_chrome_trace_write_is_atomic(tmp_path, monkeypatch):
    _, df = _golden_df()
    path = tmp_path / "t.json"
    path.write_text("old")

    def boom(*a, **k):
        raise OSError("disk full")

    import sim.atomic

    monkeypatch.setattr(sim.atomic.os, "replace", boom)  # fail at the last step of the write
    with pytest.raises(OSError, match="disk full"):
        trace.to_chrome_trace(df, path)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]


# ------------------------------------------------------------------ overlap metrics ----


def test_overlap_metrics_golden_by_hand():
    _, df = _golden_df()
    # H2D on gpu0: [2,5] ∪ [5.5,7.5] ∪ [7.5,10.5] -> 3 + 5 = 8 s.
    # compute0: attn [1,5], ffn [8.75,10.75]; hidden: [2,5] (3 s) + [8.75,10.5] (1.75 s) = 4.75 s.
    assert trace.exposed_transfer_s(df) == 8.0 - 4.75
    assert trace.overlap_fraction(df) == 4.75 / 8.0


def test_overlap_metrics_on_pipelines():
    C = np.array([2.0, 2.0, 2.0, 2.0])
    T = np.array([1.0, 1.0, 1.0, 1.0])
    for slots, exposed in ((1, 4.0), (2, 1.0)):
        # slots=1: nothing overlaps; slots=2: only the first copy (T_1) is exposed
        plan, copies, computes = pipeline_plan(len(C), slots)
        dur = np.empty(len(plan.ops))
        dur[copies], dur[computes] = T, C
        df = trace.to_dataframe(plan, analytic.run(plan, dur))
        assert trace.exposed_transfer_s(df) == exposed
        assert trace.overlap_fraction(df) == (4.0 - exposed) / 4.0


def test_overlap_metrics_reject_mixed_runs_and_handle_no_copies():
    _, a = _golden_df("analytic")
    _, b = _golden_df("des")
    with pytest.raises(ValueError, match="several runs"):
        trace.exposed_transfer_s(pd.concat([a, b], ignore_index=True))
    no_h2d = a[a.kind != "h2d"].reset_index(drop=True)
    assert trace.exposed_transfer_s(no_h2d) == 0.0
    assert np.isnan(trace.overlap_fraction(no_h2d))


def _reference_exposed(df: pd.DataFrame) -> tuple[float, float]:
    """Plain-Python reference: elementary segments between all boundaries."""
    comp = {k.value for k in COMPUTE_KINDS}
    total = hidden = 0.0
    for dev in sorted(set(df.device[df.kind == "h2d"])):
        h = [(r.start_s, r.end_s) for r in df.itertuples() if r.kind == "h2d" and r.device == dev]
        c = [(r.start_s, r.end_s) for r in df.itertuples()
             if r.kind in comp and (r.stream == "cpu" or (r.stream == "compute" and r.device == dev))]
        pts = sorted({p for iv in h + c for p in iv})
        for lo, hi in zip(pts, pts[1:]):
            # the boundaries hold every end point, so a segment lies wholly inside an interval or
            # outside it (a zero-length interval at a segment's midpoint covers none of it)
            if any(s <= lo and hi <= e for s, e in h):
                total += hi - lo
                if any(s <= lo and hi <= e for s, e in c):
                    hidden += hi - lo
    return total - hidden, total


@settings(max_examples=100, deadline=None)
@given(plans_with_durations(zeros=True))
def test_overlap_metrics_match_reference(pd_):
    plan, dur = pd_
    df = trace.to_dataframe(plan, analytic.run(plan, dur))
    exposed, total = _reference_exposed(df)
    got = trace.exposed_transfer_s(df)
    assert got == pytest.approx(exposed, rel=1e-9, abs=1e-15)
    assert 0.0 <= got <= total * (1 + 1e-12)
    frac = trace.overlap_fraction(df)
    if total > 0:
        assert frac == pytest.approx(1 - exposed / total, rel=1e-9, abs=1e-12)
        assert 0.0 <= frac <= 1.0
    else:
        assert np.isnan(frac)


def test_kinds_used_by_metrics_exist():
    # the metrics key on these enum values; a rename in sim.plan must break this test
    assert OpKind.H2D.value == "h2d" and Stream.CPU.value == "cpu" and Stream.COMPUTE.value == "compute"


def test_plan_transfer_groups_equal_the_groups_of_its_ops():
    """plan_transfer_groups (the plan's kind/stream/device columns, cached) equals
    transfer_groups of the ops' kind, stream and device values, on built plans of one and two
    GPUs with pageable copies on the host queue."""
    from dataclasses import replace
    from pathlib import Path

    from sim.plan.builder import build_plan
    from sim.model.specs import BenchTest, load_scenario, parse_variant
    from sim.views.trace import plan_transfer_groups, transfer_groups

    root = Path(__file__).resolve().parents[1] / "scenarios"
    for name in ("default.toml", "h200x2-qwen3-30b-a3b.toml", "gemma3-27b-ffn-cpu.toml"):
        scn = load_scenario(root / name)
        for pinned in (True, False):
            s = scn.with_(placement=replace(scn.placement, pinned=pinned))
            plan = build_plan(s, parse_variant("prefetch_ungated"), BenchTest(600, 1), np.random.default_rng(0))
            ref = transfer_groups([o.kind.value for o in plan.ops], [o.stream.value for o in plan.ops],
                                  [o.device for o in plan.ops])
            got = plan_transfer_groups(plan)
            assert len(got) == len(ref) and got is plan_transfer_groups(plan)
            for (a, b), (c, d) in zip(got, ref):
                assert a.tolist() == c.tolist() and b.tolist() == d.tolist()


@settings(max_examples=60, deadline=None)
@given(plans_with_durations(zeros=True), st.integers(1, 6), st.booleans())
def test_busy_hidden_of_many_runs_equals_each_run(pd_, s_count, same_order):
    """h2d_busy_hidden_rows (S runs at once: one sort tried on every run, row-wise sums) gives
    each run's h2d_busy_hidden_s to the bit, whether the runs' boundaries sort alike (scaled
    durations) or not (fresh durations), in C or Fortran memory order."""
    plan, dur = pd_
    rng = np.random.default_rng(s_count)
    rows = [dur * (1.0 + 0.5 * k) if same_order else dur * rng.random(dur.size) for k in range(s_count)]
    sched = analytic.run(plan, np.stack(rows))
    start, end = np.atleast_2d(sched.start_s), np.atleast_2d(sched.end_s)
    groups = trace.plan_transfer_groups(plan)
    for s_, e_ in ((np.ascontiguousarray(start), np.ascontiguousarray(end)),
                   (np.asfortranarray(start), np.asfortranarray(end))):
        tot, hid = trace.h2d_busy_hidden_rows(groups, s_, e_)
        for k in range(s_count):
            t1, h1 = trace.h2d_busy_hidden_s(groups, np.ascontiguousarray(start[k]), np.ascontiguousarray(end[k]))
            assert (tot[k], hid[k]) == (t1, h1)


@settings(max_examples=60, deadline=None)
@given(plans_with_durations(zeros=True), st.integers(1, 5), st.booleans())
def test_busy_hidden_with_kept_permutation_equals_each_run(pd_, s_count, same_order):
    """h2d_busy_hidden_rows with a memo kept across calls (the permutation of the first call
    tried first on the next: it fits runs that sort alike, and must be dropped for runs that do
    not) gives each run's h2d_busy_hidden_s to the bit on every call."""
    plan, dur = pd_
    rng = np.random.default_rng(s_count)
    groups = trace.plan_transfer_groups(plan)
    memo: dict = {}
    for call in range(3):
        rows = [dur * (1.0 + 0.5 * k + call) if same_order else dur * rng.random(dur.size) for k in range(s_count)]
        sched = analytic.run(plan, np.stack(rows))
        start, end = np.atleast_2d(sched.start_s), np.atleast_2d(sched.end_s)
        tot, hid = trace.h2d_busy_hidden_rows(groups, start, end, memo)
        for k in range(s_count):
            t1, h1 = trace.h2d_busy_hidden_s(groups, np.ascontiguousarray(start[k]), np.ascontiguousarray(end[k]))
            assert (tot[k], hid[k]) == (t1, h1)
    if groups and any(a.size for a, _b in groups):
        assert any("order" in m for m in memo.values())


@settings(max_examples=80, deadline=None)
@given(plans_with_durations(zeros=True), st.integers(1, 5))
def test_host_edges_at_queue_ends_equal_extrema_over_every_op(pd_, s_count):
    """template_host_edges and template_makespans read the first/last op of each queue
    (sim.plan.overlap._queue_ends); they equal the straightforward extrema over every op (the
    reference below) exactly, for random plans and durations (zeros included)."""
    from sim.plan.overlap import _edge_masks, template_host_edges, template_makespans

    plan, dur = pd_
    rng = np.random.default_rng(s_count)
    sched = analytic.run(plan, np.stack([dur * rng.random(dur.size) for _ in range(s_count)]))
    start, end = np.atleast_2d(sched.start_s), np.atleast_2d(sched.end_s)
    gpu, busy = _edge_masks(plan)
    g0, g1 = start.min(axis=1), end.max(axis=1)
    H_ref = start[:, gpu].min(axis=1) - g0 if gpu.any() else np.zeros(s_count)
    F_ref = np.maximum(g1 - end[:, busy].max(axis=1), 0.0) if busy.any() else np.zeros(s_count)
    H, F = template_host_edges(plan, start, end)
    assert H.tolist() == H_ref.tolist() and F.tolist() == F_ref.tolist()
    assert template_makespans(plan, end).tolist() == g1.tolist()


def test_the_trace_is_the_first_timed_repetition_whatever_r(tmp_path, capsys):
    """trace draws llama-bench's first timed repetition (its routing draw and its CUDA-graph
    capture): -r changes breakdown's and run's mean, not the trace."""
    from sim.cli import main

    lines = []
    for r in ("1", "7"):
        out = tmp_path / f"t{r}.csv"
        assert main(["trace", "-p", "512", "-n", "0", "--variant", "baseline", "-r", r, "-q", "--out", str(out)]) == 0
        lines.append(capsys.readouterr().out.splitlines()[0])
    # the same timeline; the -r 7 line says run's figure is the mean of 7
    assert lines[1].startswith(lines[0].rstrip(")")) and "makespan" in lines[0]
    assert lines[0].split("makespan")[1].split(" ms")[0] == lines[1].split("makespan")[1].split(" ms")[0]
    assert "the mean of 7" in lines[1] and "the mean of" not in lines[0]
