"""Hazard checker: happens-before against brute force, each hazard planted in a correct plan
(hand-built pipeline and builder plans of the tiny scenario) and reported with its op ids,
correct variants of the shipped scenarios clean, the command line's table and exit status."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plangen import pipeline_plan, plans
from sim.plan import builder
from sim import cli
from sim.plan.builder import build_plan, make_context
from sim.errors import PlacementError
from sim.plan.hazards import (
    SLOT_FREE, SLOT_REALLOC, HappensBefore, HazardKind, append_slot_frees, check_plan, format_hazards,
    insert_op, replace_op,
)
from sim.engines.metrics import rep_rng
from sim.plan import OpKind, Plan, Stream
from sim.model.specs import BenchTest, load_scenario, parse_variant

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "scenarios" / "tiny" / "tiny.toml"
CORRECT_VARIANTS = ("baseline", "prefetch_ungated", "prefetch_gated_512", "slots2", "slots3", "slots4")


def found(plan: Plan) -> set[tuple[HazardKind, tuple[int, ...]]]:
    return {(h.kind, h.op_ids) for h in check_plan(plan)}


# ---------------------------------------------------------------------------------------
# happens-before
# ---------------------------------------------------------------------------------------


def _brute_force_before(plan: Plan) -> list[set[int]]:
    """Ancestors of every op through deps and same-queue predecessors (transitive closure)."""
    last: dict = {}
    anc: list[set[int]] = []
    for op in plan.ops:
        preds = set(op.deps)
        if op.queue in last:
            preds.add(last[op.queue])
        last[op.queue] = op.id
        s: set[int] = set()
        for p in preds:
            s |= anc[p] | {p}
        anc.append(s)
    return anc


@settings(max_examples=80, deadline=None)
@given(plans(max_ops=30))
def test_happens_before_equals_transitive_closure(plan):
    hb = HappensBefore(plan)
    anc = _brute_force_before(plan)
    for b in range(len(plan.ops)):
        for a in range(len(plan.ops)):
            assert hb.ordered(a, b) == (a in anc[b]), (a, b)


def test_link_order_is_not_synchronisation():
    """Two H2D copies of one GPU on different streams share the link (the engines serialise
    them) but neither is ordered before the other."""
    p = Plan()
    a = p.add(OpKind.H2D, Stream.COPY, 0, "copy", nbytes=1, slot=0, slot_bytes=1)
    b = p.add(OpKind.H2D, Stream.COMPUTE, 0, "copy2", nbytes=1)
    hb = HappensBefore(p)
    assert not hb.ordered(a, b) and not hb.ordered(b, a)


# ---------------------------------------------------------------------------------------
# hand-built pipelines (tests/plangen.pipeline_plan): copy i -> slot i % slots
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("slots", [1, 2, 3, 4])
def test_correct_pipeline_is_clean(slots):
    plan, _, _ = pipeline_plan(9, slots)
    assert check_plan(plan) == []
    assert check_plan(append_slot_frees(plan)) == []
    assert check_plan(append_slot_frees(plan, SLOT_REALLOC)) == []


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 12), slots=st.integers(1, 4), data=st.data())
def test_dropped_free_wait_is_an_overwrite(n, slots, data):
    plan, copies, computes = pipeline_plan(n, slots)
    if n <= slots:
        return
    i = data.draw(st.integers(slots, n - 1))
    bad = replace_op(plan, copies[i], deps=())
    assert found(bad) == {(HazardKind.SLOT_OVERWRITE, (copies[i], computes[i - slots]))}


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 12), slots=st.integers(1, 4), data=st.data())
def test_dropped_ready_wait_is_reported(n, slots, data):
    plan, copies, computes = pipeline_plan(n, slots)
    i = data.draw(st.integers(0, n - 1))
    bad = replace_op(plan, computes[i], deps=())
    assert found(bad) == {(HazardKind.MISSING_READY_WAIT, (computes[i], copies[i]))}


def test_two_gpu_pipelines_are_clean_and_a_crossed_consumer_is_caught():
    """Layer split over two GPUs, each with its own slots: clean. A consumer on GPU 1 handed
    the slot GPU 0 just filled is the multi-GPU layer-split bug."""
    p = Plan()
    k0 = p.add(OpKind.H2D, Stream.COPY, 0, "copy L0", nbytes=8, slot=0, slot_bytes=8)
    c0 = p.add(OpKind.GEMM, Stream.COMPUTE, 0, "L0", [k0], nbytes=8, slot=0, slot_bytes=8)
    k1 = p.add(OpKind.H2D, Stream.COPY, 1, "copy L1", nbytes=8, slot=0, slot_bytes=8)
    c1 = p.add(OpKind.GEMM, Stream.COMPUTE, 1, "L1", [k1, c0], nbytes=8, slot=0, slot_bytes=8)
    assert check_plan(p) == []
    crossed = replace_op(p, k1, device=0, deps=(c0,))  # GPU 0 refills slot 0 for GPU 1's split
    assert found(crossed) == {(HazardKind.CROSS_DEVICE_SLOT, (c1, k1))}


# ---------------------------------------------------------------------------------------
# hazards planted in builder plans of the tiny scenario
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    return load_scenario(TINY)


def tiny_plan(scn, variant: str, test=BenchTest(64, 0, 0)) -> Plan:
    var = parse_variant(variant)
    ctx = make_context(scn, var, rep_rng(scn.seed, -1, -1))
    return build_plan(scn, var, test, rep_rng(scn.seed, 0, 0), ctx)


def _copies(plan):
    return [op for op in plan.ops if op.kind is OpKind.H2D and op.slot >= 0]


def _consumer_of(plan, copy_id):
    """The op reading the contents of ``copy_id`` (the next non-copy op with its slot)."""
    slot = plan.ops[copy_id].slot
    return next(op for op in plan.ops[copy_id + 1:] if op.slot == slot and op.kind is not OpKind.H2D)


@pytest.mark.parametrize("variant", ["prefetch_ungated", "slots2", "slots3"])
def test_tiny_plans_are_clean(tiny, variant):
    plan = tiny_plan(tiny, variant)
    assert len(_copies(plan)) >= 4  # 2 layers x 3 expert tensors are staged at pp64
    assert check_plan(plan) == []
    assert check_plan(append_slot_frees(plan)) == []


@pytest.mark.parametrize("variant", ["prefetch_ungated", "slots2", "slots3"])
def test_planted_missing_ready_wait(tiny, variant):
    plan = tiny_plan(tiny, variant)
    for cp in _copies(plan):
        cons = _consumer_of(plan, cp.id)
        assert cp.id in cons.deps
        bad = replace_op(plan, cons.id, deps=tuple(d for d in cons.deps if d != cp.id))
        assert found(bad) == {(HazardKind.MISSING_READY_WAIT, (cons.id, cp.id))}


@pytest.mark.parametrize("variant", ["prefetch_ungated", "slots2", "slots3"])
def test_planted_overwrite(tiny, variant):
    """Drop the free-event dependency of every copy that has one (a slot being reused)."""
    plan = tiny_plan(tiny, variant)
    planted = 0
    for cp in _copies(plan):
        readers = [d for d in cp.deps if plan.ops[d].slot == cp.slot and plan.ops[d].kind is not OpKind.H2D]
        if not readers:
            continue
        (reader,) = readers
        bad = replace_op(plan, cp.id, deps=tuple(d for d in cp.deps if d != reader))
        assert found(bad) == {(HazardKind.SLOT_OVERWRITE, (cp.id, reader))}
        planted += 1
    assert planted >= 1


def test_planted_cross_device_consumer(tiny):
    plan = tiny_plan(tiny, "prefetch_ungated")
    for cp in _copies(plan):
        cons = _consumer_of(plan, cp.id)
        bad = replace_op(plan, cons.id, device=1)  # the split runs on GPU 1, the slot is GPU 0's
        assert found(bad) == {(HazardKind.CROSS_DEVICE_SLOT, (cons.id, cp.id))}


def test_planted_overflow(tiny):
    plan = tiny_plan(tiny, "slots2")
    cp = _copies(plan)[0]
    cons = _consumer_of(plan, cp.id)
    assert 0 < cons.nbytes <= cp.nbytes <= cp.slot_bytes
    assert found(replace_op(plan, cp.id, slot_bytes=cp.nbytes - 1)) == {(HazardKind.SLOT_OVERFLOW, (cp.id,))}
    assert found(replace_op(plan, cons.id, slot_bytes=cons.nbytes - 1)) == {
        (HazardKind.SLOT_OVERFLOW, (cons.id,))}


@pytest.mark.parametrize("tag", [SLOT_FREE, SLOT_REALLOC])
def test_planted_premature_free(tiny, tag):
    """A free right after the first copy into a slot is issued: the copy may be in flight
    (use-after-free), and its consumer then reads a freed slot."""
    plan = tiny_plan(tiny, "prefetch_ungated")
    cp = _copies(plan)[0]
    cons = _consumer_of(plan, cp.id)
    bad, fid = insert_op(plan, cp.id + 1, OpKind.HOST_WORK, Stream.HOST, cp.device, f"{tag} early",
                         slot=cp.slot, tag=tag)
    shifted = cons.id + 1
    assert found(bad) == {(HazardKind.FREE_WHILE_COPYING, (fid, cp.id)),
                          (HazardKind.MISSING_READY_WAIT, (shifted,))}
    # a free that waits for the copy (host sync) is fine for the copy; the later read of the
    # freed slot is still reported
    sync_bad, sid = insert_op(plan, cp.id + 1, OpKind.HOST_SYNC, Stream.HOST, -1, "sync copy", (cp.id,))
    fixed, fid2 = insert_op(sync_bad, sid + 1, OpKind.HOST_WORK, Stream.HOST, cp.device, tag, slot=cp.slot, tag=tag)
    assert found(fixed) == {(HazardKind.MISSING_READY_WAIT, (cons.id + 2,))}


def test_frees_after_every_graph_are_clean_on_multi_graph_plans(tiny):
    scn = tiny.with_(workload=replace(tiny.workload, n_ubatch=32))
    for v in ("prefetch_ungated", "slots2"):
        plan = tiny_plan(scn, v)
        assert len(plan.graph_tokens) == 2
        assert check_plan(append_slot_frees(plan)) == []


def test_insert_op_renumbers():
    plan, copies, computes = pipeline_plan(4, 2)
    new, at = insert_op(plan, 2, OpKind.HOST_WORK, Stream.HOST, -1, "x", (0,))
    assert at == 2 and len(new.ops) == len(plan.ops) + 1
    assert [op.id for op in new.ops] == list(range(len(new.ops)))
    for old in plan.ops:
        moved = new.ops[old.id + (old.id >= 2)]
        assert moved.name == old.name
        assert moved.deps == tuple(d + (d >= 2) for d in old.deps)
    with pytest.raises(ValueError):
        insert_op(plan, 2, OpKind.HOST_WORK, Stream.HOST, -1, "x", (2,))


# ---------------------------------------------------------------------------------------
# shipped scenarios: correct variants report none
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario, test", [
    ("tiny/tiny.toml", BenchTest(64, 0, 0)),
    ("default.toml", BenchTest(512, 0, 0)),
    ("gemma3-27b-ffn-cpu.toml", BenchTest(512, 0, 0)),
    ("laguna-2x3090.toml", BenchTest(34, 0, 0)),
    ("laguna-2x3090.toml", BenchTest(5000, 0, 0)),   # 3 graphs on 2 GPUs
    ("qwen3-30b-a3b-rtx3090.toml", BenchTest(512, 0, 0)),
    ("mixtral-rtx5090.toml", BenchTest(512, 0, 0)),
    ("gpt-oss-20b-selective.toml", BenchTest(512, 0, 0)),
])
def test_shipped_scenarios_correct_variants_have_no_hazards(scenario, test):
    scn = load_scenario(ROOT / "scenarios" / scenario)
    checked = 0
    for v in CORRECT_VARIANTS:
        var = parse_variant(v)
        try:
            ctx = make_context(scn, var, rep_rng(scn.seed, -1, -1))
        except PlacementError:
            continue  # e.g. slots3 does not fit laguna's GPU 1
        plan = append_slot_frees(build_plan(scn, var, test, rep_rng(scn.seed, 0, 0), ctx))
        assert check_plan(plan) == [], (scenario, v)
        checked += 1
    assert checked >= 3


# ---------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------


def test_cli_clean_scenario_exits_0(capsys):
    rc = cli.main(["check", str(TINY), "--slot-frees"])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.count("no hazards") == len(load_scenario(TINY).variants) * 2  # pp64 and tg4


def test_cli_reports_a_hazard_table_and_exits_1(monkeypatch, capsys):
    real = builder.build_plan
    planted = {}

    def build_with_hazard(scn, variant, test, rng, ctx=None):
        plan = real(scn, variant, test, rng, ctx)
        cps = _copies(plan)
        if not cps:
            return plan
        cons = _consumer_of(plan, cps[0].id)
        planted[variant.name] = (cons.id, cps[0].id)
        return replace_op(plan, cons.id, deps=tuple(d for d in cons.deps if d != cps[0].id))

    monkeypatch.setattr(builder, "build_plan", build_with_hazard)
    rc = cli.main(["check", str(TINY), "--variant", "slots2", "--test", "pp64"])
    out = capsys.readouterr().out
    assert rc == 1
    cons, cp = planted["slots2"]
    assert "slots2 / pp64" in out and "1 hazard(s)" in out
    row = next(line for line in out.splitlines() if line.startswith("| missing_ready_wait"))
    assert f"{cons}, {cp}" in row


def test_cli_bad_test_name_is_one_line(capsys):
    rc = cli.main(["check", str(TINY), "--test", "nonsense"])
    err = capsys.readouterr().err
    assert rc == 2 and "--test" in err and len(err.strip().splitlines()) == 1


def test_cli_negative_max_rows_is_one_line(capsys):
    rc = cli.main(["check", str(TINY), "--max-rows", "-1"])
    err = capsys.readouterr().err
    assert rc == 2 and "'--max-rows'" in err and len(err.strip().splitlines()) == 1


def test_format_hazards_table():
    plan, copies, computes = pipeline_plan(3, 1)
    hz = check_plan(replace_op(plan, computes[1], deps=()))
    text = format_hazards(hz)
    lines = text.splitlines()
    assert [c.strip() for c in lines[0].strip("|").split("|")] == ["kind", "ops", "names", "gpu", "slot", "detail"]
    assert f"{computes[1]}, {copies[1]}" in lines[2] and "compute1 / copy1" in lines[2]
    assert format_hazards(hz * 3, max_rows=1).endswith("... and 2 more")
