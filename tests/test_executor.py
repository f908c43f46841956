"""The executor: plan -> program translation (pure), runs on the numpy stand-in for CuPy
(trace schema, plan semantics, losslessness, hazard detection), and a GPU smoke test."""

from __future__ import annotations

import numpy as np
import pytest

import calibrate._fakecupy as fakecp
from calibrate.executor import (ExecutorHazardError, LosslessnessError, attn_keys, check_lossless, execute,
                                fill_pool, moe_rows_per_expert, pool_words, translate, union_s)
from calibrate.smoke import prefetch_plan, sequential_plan
from sim.plan import OpKind, Plan, Stream
from sim.views.trace import TRACE_COLUMNS, validate_trace

SHAPE = (16, 64, 32)
WB = 64 * 1024


# ------------------------------------------------------------------ translation


def test_pool_pattern_matches_fill():
    a = np.empty(1 << 16, dtype=np.uint8)
    fill_pool(a)
    w = a.view(np.uint32)
    idx = np.array([0, 1, 777, w.size - 1])
    assert (w[idx] == pool_words(idx)).all()
    assert len(set(pool_words(np.arange(4096)).tolist())) == 4096  # distinct words: a shifted copy is visible


def test_translate_sequential_plan():
    plan = sequential_plan(3, WB, SHAPE)
    prog = translate(plan)
    h2d = [op.id for op in plan.ops if op.kind is OpKind.H2D]
    gemm = [op.id for op in plan.ops if op.kind is OpKind.GEMM]
    assert set(prog.copies) == set(h2d)
    # each GEMM consumes the copy of its own split, at offset 0 of the split input buffer
    assert prog.producers == {g: [c] for g, c in zip(gemm, h2d)}
    assert {prog.copies[c].buffer for c in h2d} == {("input", 0)}
    assert all(prog.copies[c].offset == 0 for c in h2d)
    assert prog.buffers == {("input", 0): WB}
    # every ISSUE launches the GPU op right after it
    for i, j in prog.fused_issue.items():
        assert plan.ops[i].kind is OpKind.ISSUE and j == i + 1 and i in plan.ops[j].deps
    assert len(prog.fused_issue) == len(h2d) + len(gemm)
    # host syncs wait on GPU ops
    syncs = [op.id for op in plan.ops if op.kind is OpKind.HOST_SYNC]
    assert all(prog.gpu_deps[s] == list(plan.ops[s].deps) for s in syncs)
    assert sum(bool(prog.gpu_deps[s]) for s in syncs) == len(syncs) - 1  # the first sync has nothing to wait for
    assert prog.gemm_shapes == {(SHAPE[1], SHAPE[2]): SHAPE[0]}


def test_translate_prefetch_plan_slots_and_expected_words():
    plan = prefetch_plan(5, WB, SHAPE, n_slots=3)
    prog = translate(plan, byte_scale=0.5)
    consumers = [op for op in plan.ops if op.kind is OpKind.GEMM]
    for op in consumers:
        (c,) = prog.producers[op.id]
        assert plan.ops[c].kind is OpKind.H2D and c in op.deps  # the copy it waits for
        assert prog.copies[c].buffer == ("slot", 0, op.slot, WB)
    assert len(prog.buffers) == 3
    for p in prog.copies.values():
        assert p.nbytes == WB // 2 and p.nbytes % 4 == 0
        assert p.src_offset % 4096 == 0 and p.src_offset + p.nbytes <= prog.host_pool_bytes
    # expected words are what a filled pool holds at the copy's first and last word
    pool = np.empty(prog.host_pool_bytes, dtype=np.uint8)
    fill_pool(pool)
    for p in prog.copies.values():
        src = pool[p.src_offset:p.src_offset + p.nbytes].view(np.uint32)
        assert src[0] == p.head_word and src[-1] == p.tail_word


def test_translate_split_with_several_copies_packs_them():
    p = Plan()
    a = p.add(OpKind.H2D, Stream.COMPUTE, 0, "x[0:3]", nbytes=1000, split=1, tag="selective")
    b = p.add(OpKind.H2D, Stream.COMPUTE, 0, "x[5:6]", nbytes=3000, split=1, tag="selective")
    g = p.add(OpKind.MOE, Stream.COMPUTE, 0, "x", (a, b), nbytes=4000, shape=(8, 64, 32, 4, 2), split=1)
    g2 = p.add(OpKind.GEMM, Stream.COMPUTE, 0, "y", (g,), nbytes=10, shape=(8, 16, 64), split=1)
    prog = translate(p)
    pa, pb = prog.copies[a], prog.copies[b]
    assert pa.offset == 0 and pb.offset >= pa.nbytes and pb.offset % 256 == 0
    assert prog.producers[g] == [a, b]
    assert g2 not in prog.producers  # only the split's first compute op probes
    assert prog.moe_shapes == {(64, 32): (4, moe_rows_per_expert(8, 2, 4))}


def test_translate_rejects_bad_input():
    with pytest.raises(ValueError, match="byte_scale"):
        translate(sequential_plan(1, WB, SHAPE), byte_scale=0)
    p = Plan()
    p.add(OpKind.GEMM, Stream.HOST, -1, "w", shape=(1, 2, 3))
    with pytest.raises(ValueError, match="GPU queues"):
        translate(p)


def test_shape_helpers():
    assert moe_rows_per_expert(512, 10, 200) == 26  # ceil(5120 / 200)
    assert moe_rows_per_expert(4, 2, 0) == 0
    assert attn_keys(512, 1000, 0) == 1512
    assert attn_keys(512, 1000, 1024) == 1024
    assert union_s([0, 1, 5], [2, 3, 6]) == pytest.approx(4.0)
    assert union_s([], []) == 0.0


# ------------------------------------------------------------------ execution on the stand-in


def _run(plan, **kw):
    kw.setdefault("warmup", 0)
    return execute(plan, cp=fakecp, **kw)


GPU_STREAMS = (Stream.COMPUTE, Stream.COPY)  # the event clock; host and CPU ops are on the host clock


@pytest.mark.parametrize("make", [
    lambda: sequential_plan(4, WB, SHAPE),
    lambda: sequential_plan(4, WB, SHAPE, pinned=False),
    lambda: prefetch_plan(4, WB, SHAPE, n_slots=2),
    lambda: prefetch_plan(5, WB, SHAPE, n_slots=3),
])
def test_trace_schema_and_plan_semantics(make):
    plan = make()
    r = _run(plan, test="pp16", variant="v")
    df = r.trace
    validate_trace(df)
    assert tuple(df.columns) == TRACE_COLUMNS
    assert (df.engine == "executor").all() and (df.test == "pp16").all() and (df.variant == "v").all()
    assert len(df) == len(plan.ops)
    s, e = r.schedule.start_s, r.schedule.end_s
    eps = 1e-9
    # FIFO per queue and dependencies respected
    last: dict = {}
    for op in plan.ops:
        q = op.queue
        if q in last:
            assert s[op.id] >= e[last[q]] - eps
        last[q] = op.id
        for d in op.deps:
            # a host op after a GPU op (or the reverse) is ordered on two clocks, placed on each
            # other to within the run's measured alignment (not a fixed tolerance: a busy host
            # widens the window)
            cross = (op.stream in GPU_STREAMS) != (plan.ops[d].stream in GPU_STREAMS)
            assert s[op.id] >= e[d] - eps - (r.align_s if cross else 0.0)
    assert r.makespan_s == pytest.approx(e.max())
    assert r.h2d_bytes == plan.h2d_bytes()
    assert r.probes_checked == 4 * len(translate(plan).producers)


def test_variants_are_lossless_and_scale_independent():
    plans = {"sequential": sequential_plan(4, WB, SHAPE), "pageable": sequential_plan(4, WB, SHAPE, pinned=False),
             "prefetch2": prefetch_plan(4, WB, SHAPE, n_slots=2), "prefetch3": prefetch_plan(4, WB, SHAPE, n_slots=3)}
    res = {k: _run(p, variant=k) for k, p in plans.items()}
    d = check_lossless(res)
    assert all(r.digest == d for r in res.values())
    assert _run(plans["prefetch2"], byte_scale=0.25).digest == d  # copy sizes never change the output
    assert _run(plans["prefetch2"], seed=1).digest != d  # other weights, other output


def test_check_lossless_names_the_differing_op():
    plan = sequential_plan(3, WB, SHAPE)
    a = _run(plan)
    b = _run(plan)
    key = sorted(b.outputs, key=repr)[1]
    b.outputs[key] = (0, 0)
    b.digest = "changed"
    with pytest.raises(LosslessnessError, match="blk"):
        check_lossless({"a": a, "b": b})
    other = _run(sequential_plan(2, WB, SHAPE))
    with pytest.raises(LosslessnessError, match="different compute ops"):
        check_lossless({"a": a, "c": other})


def test_slot_reused_before_its_consumer_is_detected():
    """Copy A into slot 0, then copy B into slot 0, then A's consumer: in plan order the
    consumer can only see B's bytes; the probe names the consumer and its copy."""
    p = Plan()
    ia = p.add(OpKind.ISSUE, Stream.HOST, -1, "issue a")
    a = p.add(OpKind.H2D, Stream.COPY, 0, "a (prefetch)", (ia,), nbytes=WB, slot=0, slot_bytes=WB, split=1)
    ib = p.add(OpKind.ISSUE, Stream.HOST, -1, "issue b")
    p.add(OpKind.H2D, Stream.COPY, 0, "b (prefetch)", (ib,), nbytes=WB, slot=0, slot_bytes=WB, split=2)
    ic = p.add(OpKind.ISSUE, Stream.HOST, -1, "issue consumer")
    c = p.add(OpKind.GEMM, Stream.COMPUTE, 0, "a", (ic, a), nbytes=WB, shape=SHAPE, slot=0, slot_bytes=WB, split=1)
    p.add(OpKind.HOST_SYNC, Stream.HOST, -1, "end", (c,))
    with pytest.raises(ExecutorHazardError) as ei:  # the warm-up run's probes
        _run(p, warmup=1)
    assert ei.value.mismatches[0]["op_id"] == c
    assert "a (prefetch)" in ei.value.mismatches[0]["producer"]
    # no warm-up: the timed run's event times already break the free order (b overwrote the
    # slot before a's consumer ran)
    with pytest.raises(ExecutorHazardError, match="order") as ei:
        _run(p)
    b = ei.value.mismatches[0]
    assert (b["kind"], b["op_id"], b["other"]) == ("free", a + 2, c)
    # without the check the run completes
    assert _run(p, check=False).probes_checked == 0


def test_host_ops_and_cpu_ops_run_on_the_host():
    p = Plan()
    i = p.add(OpKind.ISSUE, Stream.HOST, -1, "issue ids")
    d = p.add(OpKind.D2H, Stream.COMPUTE, 0, "ids", (i,), nbytes=4096, tag="ids")
    s = p.add(OpKind.HOST_SYNC, Stream.HOST, -1, "wait ids", (d,))
    w = p.add(OpKind.HOST_WORK, Stream.HOST, -1, "runs", (s,), shape=(2048,))
    cpu = p.add(OpKind.CPU_MATVEC, Stream.CPU, -1, "blk.0.ffn_up", (w,), nbytes=1 << 20, shape=(1, 1024, 256, 1))
    p.add(OpKind.EVENT_RECORD, Stream.HOST, -1, "rec", (cpu,))
    p.add(OpKind.EVENT_WAIT, Stream.HOST, -1, "wait")
    r = _run(p)
    validate_trace(r.trace)
    st, en = r.schedule.start_s, r.schedule.end_s
    assert st[s] >= en[d] - 1e-9 and st[cpu] >= en[w] - 1e-9
    assert any(k[1] == "blk.0.ffn_up" for k in r.outputs)  # CPU outputs are part of the digest


@pytest.mark.slow  # ~8 s: every built plan through the stand-in executor
def test_builder_plans_run_and_are_lossless():
    """The shipped tiny scenario through the real plan builder: every test, every variant."""
    from pathlib import Path

    builder = pytest.importorskip("sim.plan.builder")
    from sim.model.specs import load_scenario

    path = Path(__file__).resolve().parent.parent / "scenarios/tiny/tiny.toml"
    if not path.exists():
        pytest.skip("no tiny scenario")
    scn = load_scenario(path)
    for test in scn.workload.tests():
        res = {}
        for v in scn.variants:
            plan = builder.build_plan(scn, v, test, np.random.default_rng(scn.seed))
            r = _run(plan, test=test.name, variant=v.name)
            validate_trace(r.trace)
            assert r.h2d_bytes == plan.h2d_bytes()
            res[v.name] = r
        check_lossless(res)


# ------------------------------------------------------------------ GPU


@pytest.mark.gpu
def test_executor_on_gpu():
    cp = pytest.importorskip("cupy")
    try:
        n = cp.cuda.runtime.getDeviceCount()
    except Exception:
        n = 0
    if n < 1:
        pytest.skip("no CUDA GPU")
    shape = (2048, 4096, 4096)
    res = {k: execute(p, repeats=2) for k, p in {
        "sequential": sequential_plan(4, 16 << 20, shape), "prefetch2": prefetch_plan(4, 16 << 20, shape)}.items()}
    check_lossless(res)
    for r in res.values():
        validate_trace(r.trace)
        assert r.probes_checked > 0
    with pytest.raises(ExecutorHazardError):
        execute(prefetch_plan(6, 64 << 20, (8192, 14336, 4096), drop_free_wait=True), warmup=0)


@pytest.mark.slow  # ~6 s: a stand-in executor calibration
def test_executor_costs_on_the_stand_in_round_trip_through_a_profile(tmp_path):
    """calibrate.executor_costs measures every launch kind and the host work, writes them into
    a profile, and the profile loads them; in executor_mode host work is priced by them."""
    import shutil
    from dataclasses import replace
    from pathlib import Path

    from calibrate.executor_costs import PROBES, measure, update_profile
    from sim.model.costs import HOST_WORK_PER_ITEM_S, op_duration_s
    from sim.plan import OpKind, Plan, Stream
    from sim.model.specs import load_hardware

    root = Path(__file__).resolve().parent.parent
    src = root / "scenarios" / "hardware" / "h200.toml"
    dst = tmp_path / "h200.toml"
    shutil.copy(src, dst)
    shutil.copytree(root / "scenarios" / "hardware" / "h200", tmp_path / "h200")
    costs = measure(load_hardware(dst), n=4, cp=fakecp, busy=False)
    assert set(costs) == set(PROBES) | {"host_work", "host_work_per_id", "host_work_t_64", "host_work_t_16384", "gc"}
    assert costs["gc"] == "off" and all(v >= 0 for k, v in costs.items() if k != "gc")
    costs = {**costs, "host_work": 2e-6, "host_work_per_id": 3e-9}
    update_profile(dst, costs, "fake")
    hw = load_hardware(dst)
    assert hw.executor_host_work_s == pytest.approx(2e-6)
    assert hw.executor_host_work_per_id_s == pytest.approx(3e-9)
    hw_op = Plan()
    hw_op.add(OpKind.HOST_WORK, Stream.HOST, -1, "runs", shape=(1000,))
    o = hw_op.ops[0]
    assert op_duration_s(o, replace(hw, executor_mode=True)) == pytest.approx(2e-6 + 3e-9 * 1000)
    assert op_duration_s(o, hw) == pytest.approx(HOST_WORK_PER_ITEM_S * 1000)
    update_profile(dst, costs, "fake")  # replaces, never duplicates
    assert dst.read_text().count("executor_host_work_us") == 1


def test_check_order_flags_a_consumer_that_starts_before_its_copy_ends():
    from calibrate.executor import check_order

    prog = translate(prefetch_plan(4, WB, SHAPE))
    n = len(prog.plan.ops)
    start, end = np.arange(n, dtype=float), np.arange(n, dtype=float) + 0.5  # plan order, no overlap
    assert check_order(prog, start, end) == []
    j, cs = next(iter(prog.producers.items()))
    end[cs[0]] = start[j] + 1e-3  # the copy ends 1 ms after its consumer started
    bad = check_order(prog, start, end)
    assert {"kind": "ready", "op_id": j, "other": cs[0]} == {k: bad[0][k] for k in ("kind", "op_id", "other")}
    assert bad[0]["by_s"] == pytest.approx(1e-3)


def test_check_order_gives_mixed_clock_pairs_the_measured_alignment_slack():
    from calibrate.executor import ORDER_TOL_S, check_order

    prog = translate(prefetch_plan(4, WB, SHAPE))
    n = len(prog.plan.ops)
    start, end = np.arange(n, dtype=float), np.arange(n, dtype=float) + 0.5
    j, cs = next(iter(prog.producers.items()))
    end[cs[0]] = start[j] + ORDER_TOL_S + 3e-6  # 3 us past the event-clock slack
    same = np.zeros(n, dtype=bool)
    mixed = same.copy()
    mixed[cs[0]] = True  # the copy timed on the host clock, its consumer by events
    assert check_order(prog, start, end, host_clock=same, align_s=4e-6)  # one clock: no extra slack
    assert check_order(prog, start, end, host_clock=mixed, align_s=4e-6) == []
    assert check_order(prog, start, end, host_clock=mixed, align_s=2e-6)  # alignment too good to explain it


def test_busy_probe_plans_have_decode_shape():
    from calibrate.executor_costs import burst_plan, loop_plan

    ref = burst_plan("gemm", n=2, per=3)
    busy = burst_plan("gemm", n=2, per=3, cpu_bytes=8 << 20, n_cpu=3)
    kinds = [op.kind for op in busy.ops]
    assert [op.kind for op in ref.ops].count(OpKind.GEMM) == kinds.count(OpKind.GEMM) == 6
    assert kinds.count(OpKind.CPU_MATVEC) == 6 and OpKind.CPU_MATVEC not in [op.kind for op in ref.ops]
    # every CPU op follows the host sync of its burst, and the next burst waits for the CPU ops
    first_cpu = kinds.index(OpKind.CPU_MATVEC)
    assert kinds[first_cpu - 1] is OpKind.HOST_SYNC and kinds[first_cpu + 3] is OpKind.ISSUE
    assert busy.ops[first_cpu + 3].deps == (first_cpu + 2,)
    loop = loop_plan(4 << 20, n=2, n_cpu=3)
    launched = [op.kind for op in loop.ops if op.stream is Stream.COMPUTE]
    assert launched == [OpKind.GEMM, OpKind.ATTN, OpKind.GEMM, OpKind.GEMM, OpKind.D2H, OpKind.H2D] * 2
    assert all(op.nbytes == 4 << 20 for op in loop.ops if op.kind is OpKind.CPU_MATVEC)


@pytest.mark.slow
def test_busy_costs_on_the_stand_in_round_trip_through_a_profile(tmp_path, monkeypatch):
    """measure_busy returns every kind's busy extra, a matvec line, the loop check and the
    decode-chain scale; the keys land in a profile, load back, and are priced in executor_mode
    only."""
    import shutil
    from dataclasses import replace
    from pathlib import Path

    import calibrate.executor_costs as EC
    from calibrate.executor_costs import PROBES, measure_busy, summary, update_profile

    monkeypatch.setattr(EC, "CHAIN_LAYERS", 1)  # the stand-in is slow; the chain's shape is what counts
    monkeypatch.setattr(EC, "CHAIN_TOKENS", 1)
    from sim.model.costs import plan_durations
    from sim.model.specs import load_hardware

    root = Path(__file__).resolve().parent.parent
    dst = tmp_path / "h200.toml"
    shutil.copy(root / "scenarios" / "hardware" / "h200.toml", dst)
    shutil.copytree(root / "scenarios" / "hardware" / "h200", tmp_path / "h200")
    hw = load_hardware(dst)
    with pytest.raises(ValueError, match="two matvec sizes"):
        measure_busy(hw, n=1, sizes=(1 << 20,), cp=fakecp)
    costs = measure_busy(hw, n=1, per=1, sizes=(1 << 20, 4 << 20), cp=fakecp, repeats=1)
    from sim.model.specs import EXECUTOR_LAUNCH_KINDS

    assert tuple(PROBES) == EXECUTOR_LAUNCH_KINDS  # every probed kind is a profile key the loader reads
    assert {f"busy_{k}" for k in PROBES} <= set(costs) and all(costs[f"busy_{k}"] >= 0 for k in PROBES)
    assert len(costs["loop_check"]) == 2 and len(costs["loop_sizes"]) == 2
    assert EC.BUSY_SCALE_RANGE[0] <= costs["busy_scale"] <= EC.BUSY_SCALE_RANGE[1]
    assert {f"chain_mk_{m}" for m in ("gpt-oss-20b", "mixtral-8x7b")} <= set(costs)
    text = summary(costs)
    assert "decode-loop probe, 1 MiB matvecs" in text and "decode-chain probe mixtral-8x7b" in text
    costs = {**costs, "busy_gemm": 7e-6, "busy_attn": 11e-6, "cpu_op": 20e-6, "cpu_bytes_per_s": 50e9,
             "busy_scale": 1.0}
    update_profile(dst, costs, 'dev "x"')
    update_profile(dst, costs, 'dev "x"\nline2\\')  # replaces, never duplicates; any device name is escaped
    assert dst.read_text().count("executor_busy_issue_gemm_us") == 1
    # a non-finite value is not written, and a busy measurement without a matvec line removes the old one
    update_profile(dst, {**{k: v for k, v in costs.items() if not k.startswith("cpu_")},
                         "busy_attn": float("nan")}, "dev")
    text = dst.read_text()
    assert "executor_busy_issue_attn_us" not in text and "executor_cpu_gb_per_s" not in text
    assert load_hardware(dst).executor_cpu_bytes_per_s == 0.0
    update_profile(dst, costs, "dev")
    hw = load_hardware(dst)
    assert hw.executor_busy_issue_s_by_kind["gemm"] == pytest.approx(7e-6)
    assert hw.executor_cpu_op_s == pytest.approx(20e-6) and hw.executor_cpu_bytes_per_s == pytest.approx(50e9)

    plan = Plan()
    g0 = plan.add(OpKind.ISSUE, Stream.HOST, -1, "issue g0", tag="gemm")
    plan.add(OpKind.GEMM, Stream.COMPUTE, 0, "g0", (g0,), nbytes=1 << 20, shape=(1, 256, 2048))
    c = plan.add(OpKind.CPU_MATVEC, Stream.CPU, -1, "cpu", nbytes=10**8, shape=(1, 12207, 2048, 1))
    g1 = plan.add(OpKind.ISSUE, Stream.HOST, -1, "issue g1", (c,), tag="gemm")
    plan.add(OpKind.GEMM, Stream.COMPUTE, 0, "g1", (g1,), nbytes=1 << 20, shape=(1, 256, 2048))
    ex = replace(hw, executor_mode=True)
    d_ex, d_native = plan_durations(plan, ex), plan_durations(plan, hw)
    # a launch after the first CPU op costs the busy extra of its kind; one before it does not
    assert d_ex[g1] - d_ex[g0] == pytest.approx(7e-6)
    assert d_native[g1] == d_native[g0]
    # a measured launch cost of 0 is a price of 0, not "unknown"
    zero = replace(ex, executor_issue_s_by_kind={**ex.executor_issue_s_by_kind, "gemm": 0.0})
    assert plan_durations(plan, zero)[g0] == 0.0
    # the executor's matvec line in executor_mode, the native CPU figures otherwise
    assert d_ex[c] == pytest.approx(20e-6 + 10**8 / 50e9)
    assert d_native[c] == pytest.approx(hw.cpu_op_s + 10**8 / hw.cpu_bytes_per_s)


def test_busy_scale_multiplies_cpu_ops_and_the_launches_after_the_first_cpu_op_in_executor_mode_only():
    from dataclasses import replace
    from pathlib import Path

    from sim.model.costs import busy_mask, plan_durations
    from sim.model.specs import load_hardware

    hw = load_hardware(Path(__file__).resolve().parent.parent / "scenarios" / "hardware" / "h200.toml")
    plan = Plan()
    g0 = plan.add(OpKind.ISSUE, Stream.HOST, -1, "issue g0", tag="gemm")
    k0 = plan.add(OpKind.GEMM, Stream.COMPUTE, 0, "g0", (g0,), nbytes=1 << 20, shape=(1, 256, 2048))
    c = plan.add(OpKind.CPU_MATVEC, Stream.CPU, -1, "cpu", (k0,), nbytes=10**8, shape=(1, 12207, 2048, 1))
    g1 = plan.add(OpKind.ISSUE, Stream.HOST, -1, "issue g1", (c,), tag="gemm")
    k1 = plan.add(OpKind.GEMM, Stream.COMPUTE, 0, "g1", (g1,), nbytes=1 << 20, shape=(1, 256, 2048))
    assert busy_mask(plan).tolist() == [False, False, True, True, False]
    ex = replace(hw, executor_mode=True, executor_busy_scale=1.0)
    d1 = plan_durations(plan, ex)
    d2 = plan_durations(plan, replace(ex, executor_busy_scale=1.5))
    assert d2[c] == pytest.approx(1.5 * d1[c]) and d2[g1] == pytest.approx(1.5 * d1[g1])
    assert d2[g0] == d1[g0] and d2[k0] == d1[k0] and d2[k1] == d1[k1]
    native = replace(hw, executor_busy_scale=1.5)  # not in executor_mode: no effect
    assert plan_durations(plan, native).tolist() == plan_durations(plan, hw).tolist()


def test_fit_busy_scale_recovers_a_known_factor_and_lands_in_the_profile(tmp_path):
    """fit_busy_scale on decode-chain makespans simulated with a known busy scale returns that
    scale (batch-1 decode: every busy op on the critical path), clips broken fits, ignores
    unknown models; finish_loop fits it from chain_mk_<model> keys and the profile carries it."""
    import shutil
    from dataclasses import replace
    from pathlib import Path

    import calibrate.executor_costs as EC
    from sim.model.costs import plan_durations
    from sim.engines import analytic
    from sim.model.specs import load_hardware
    from sim.views.validation import DECODE_PROBE_MODELS, VALIDATION_MODELS, default_grid, with_executor_costs

    root = Path(__file__).resolve().parent.parent
    hw = replace(load_hardware(root / "scenarios" / "hardware" / "h200.toml"), executor_mode=True)
    # held out: no probe model is a model the grid loads
    assert {c.model for c in default_grid()} == set(VALIDATION_MODELS)
    assert len(DECODE_PROBE_MODELS) == 2 and not set(DECODE_PROBE_MODELS) & set(VALIDATION_MODELS.values())

    def makespans(scale):
        hs = replace(hw, executor_busy_scale=scale)
        return {m: float(analytic.run(p, plan_durations(p, hs)).makespan_s) for m, p in EC.chain_plans(hw).items()}

    s, rows = EC.fit_busy_scale(hw, {**makespans(1.3), "no-such-model": 1.0})
    assert s == pytest.approx(1.3, rel=1e-9) and [r[0] for r in rows] == list(DECODE_PROBE_MODELS)
    # exact also where the makespan is not linear in the scale (busy ops off the critical path)
    for true in (0.6, 0.8, 2.0):
        assert EC.fit_busy_scale(hw, makespans(true))[0] == pytest.approx(true, rel=1e-9), true
    old = replace(load_hardware(root / "data" / "calibration" / "h200-20261130-run21" / "h200.toml"), executor_mode=True)
    mk_old = {m: float(analytic.run(p, plan_durations(p, replace(old, executor_busy_scale=0.8))).makespan_s)
              for m, p in EC.chain_plans(old).items()}
    assert EC.fit_busy_scale(old, mk_old)[0] == pytest.approx(0.8, rel=1e-9)  # the linear step alone: 0.8004
    assert all(pr == pytest.approx(me, rel=1e-9) and pr1 < me for _m, me, pr1, pr in rows)
    assert EC.fit_busy_scale(hw, {m: 100 * v for m, v in makespans(1.0).items()})[0] == EC.BUSY_SCALE_RANGE[1]
    assert EC.fit_busy_scale(hw, {}) == (None, [])
    assert EC.fit_busy_scale(hw, {m: float("inf") for m in DECODE_PROBE_MODELS}) == (None, [])
    broken = EC.finish_loop(hw, {f"chain_mk_{m}": float("nan") for m in DECODE_PROBE_MODELS})
    assert "busy_scale" not in broken and "no busy scale fitted" in EC.summary(broken)
    assert "executor_busy_scale" not in {k for k, _v, _s in EC.profile_entries(broken)}
    clipped = EC.finish_loop(hw, {f"chain_mk_{m}": 100 * v for m, v in makespans(1.0).items()})
    assert clipped["busy_scale"] == EC.BUSY_SCALE_RANGE[1] and "WARNING: the busy scale was clipped" in EC.summary(clipped)
    # the profile's own scale does not leak into the fit
    assert EC.fit_busy_scale(replace(hw, executor_busy_scale=2.0), makespans(1.3))[0] == pytest.approx(1.3)
    # the profile's own matvec line and busy extras as the measured points: finish_loop prices as hw
    costs = {**{f"loop_t_{b}": hw.executor_cpu_op_s + b / hw.executor_cpu_bytes_per_s for b in (1 << 20, 4 << 20)},
             **{f"busy_{k}": v for k, v in hw.executor_busy_issue_s_by_kind.items()}, "busy_scale": 9.0,
             **{f"chain_mk_{m}": v for m, v in makespans(1.25).items()}}
    out = EC.finish_loop(hw, costs)
    assert out["busy_scale"] == pytest.approx(1.25, rel=1e-6) and len(out["chain_check"]) == 2
    assert "decode-chain probe gpt-oss-20b" in EC.summary(out)
    dst = tmp_path / "h200.toml"
    shutil.copy(root / "scenarios" / "hardware" / "h200.toml", dst)
    shutil.copytree(root / "scenarios" / "hardware" / "h200", tmp_path / "h200")
    EC.update_profile(dst, out, "dev")
    assert load_hardware(dst).executor_busy_scale == pytest.approx(1.25, rel=1e-5)
    assert "held-out models" in dst.read_text()
    EC.update_profile(dst, {"busy_gemm": 1e-6}, "dev")  # a busy measurement without a scale removes it
    assert load_hardware(dst).executor_busy_scale == 1.0
    assert with_executor_costs(hw, {"busy_scale": 1.2}).executor_busy_scale == 1.2
    # new busy extras without a scale make the profile's scale stale: reset, as update_profile does
    assert with_executor_costs(replace(hw, executor_busy_scale=1.2), {"busy_gemm": 1e-6}).executor_busy_scale == 1.0
    # a scale-only update keeps the busy extras and the matvec line
    EC.update_profile(dst, out, "dev")
    EC.update_profile(dst, {"busy_scale": 1.1}, "dev")
    reloaded = load_hardware(dst)
    assert reloaded.executor_busy_scale == pytest.approx(1.1) and reloaded.executor_busy_issue_s_by_kind
    assert reloaded.executor_cpu_bytes_per_s > 0


def test_measure_rounds_refit_the_busy_scale_from_the_mean_chain_makespans(monkeypatch):
    """With chain probes in every round, measure(rounds=N) drops the rounds' own scales and
    refits one from the mean makespans (not the mean of the per-round scales)."""
    from dataclasses import replace
    from pathlib import Path

    import calibrate.executor_costs as EC
    from sim.model.costs import plan_durations
    from sim.engines import analytic
    from sim.model.specs import load_hardware

    hw = replace(load_hardware(Path(__file__).resolve().parent.parent / "scenarios" / "hardware" / "h200.toml"),
                 executor_mode=True)
    base = {**{k: v for k, v in hw.executor_issue_s_by_kind.items()},
            **{f"loop_t_{b}": hw.executor_cpu_op_s + b / hw.executor_cpu_bytes_per_s for b in (1 << 20, 4 << 20)},
            **{f"busy_{k}": v for k, v in hw.executor_busy_issue_s_by_kind.items()}}

    def makespans(scale):
        hs = replace(hw, executor_busy_scale=scale)
        return {f"chain_mk_{m}": float(analytic.run(p, plan_durations(p, hs)).makespan_s)
                for m, p in EC.chain_plans(hw).items()}

    lo, hi = makespans(1.0), makespans(1.6)
    # per-round scales that no refit gives: the aggregate must not be their mean (9.0)
    rounds = iter([{**base, **lo, "busy_scale": 9.0}, {**base, **hi, "busy_scale": 9.0},
                   {**base, **lo, "busy_scale": 9.0}])
    monkeypatch.setattr(EC, "_measure_once", lambda hw, **kw: next(rounds))
    c = EC.measure(hw, rounds=3, round_gap_s=0.0)
    mean_mk = {k[len("chain_mk_"):]: (2 * lo[k] + hi[k]) / 3 for k in lo}
    assert c["busy_scale"] == pytest.approx(EC.fit_busy_scale(hw, mean_mk)[0], rel=1e-12)
    # near 1.2: the makespans are close to linear in the scale between 1.0 and 1.6 (not exactly:
    # on the shipped run-24 profile some busy ops leave the critical path)
    assert c["busy_scale"] == pytest.approx(1.2, rel=1e-3)
    assert all(k in EC.rounds_frame(c).columns for k in ("busy_scale", "chain_mk_gpt-oss-20b"))


def test_warmup_s_keeps_warming_up_until_the_time_has_passed(monkeypatch):
    import calibrate.executor as ex

    calls = []
    real = ex._run_once

    def counting(rt, probes=True):
        calls.append(probes)
        return real(rt, probes)

    monkeypatch.setattr(ex, "_run_once", counting)
    plan = sequential_plan(2, WB, SHAPE)
    execute(plan, warmup=1, repeats=1, probes=False, cp=fakecp)
    n_plain = len(calls)
    calls.clear()
    clock = iter(np.arange(0.0, 1e4, 0.005))  # every perf() call advances 5 ms
    monkeypatch.setattr(ex, "perf", lambda: float(next(clock)))
    execute(plan, warmup=1, warmup_s=0.55, repeats=1, probes=False, cp=fakecp)
    assert n_plain == 2  # one warm-up, one timed run
    assert len(calls) > n_plain  # more warm-ups until 0.55 s of (fake) clock had passed


def test_executor_costs_cli_and_profiles_without_a_measured_table(tmp_path, capsys):
    """-n below 4 is refused before measuring; the keys go into a datasheet profile (no
    [measured] table) as well, and it still loads."""
    import shutil
    from pathlib import Path

    from calibrate.executor_costs import main as ec_main
    from calibrate.executor_costs import update_profile
    from sim.model.specs import load_hardware

    with pytest.raises(SystemExit) as exc:
        ec_main(["--profile", "x.toml", "-n", "0"])
    assert exc.value.code == 2 and "-n must be >= 4" in capsys.readouterr().err
    root = Path(__file__).resolve().parent.parent
    dst = tmp_path / "rtx3090.toml"
    shutil.copy(root / "scenarios" / "hardware" / "rtx3090.toml", dst)
    update_profile(dst, {"gemm": 1e-5, "busy_gemm": 2e-6, "cpu_op": 1e-5, "cpu_bytes_per_s": 9e10}, "dev")
    hw = load_hardware(dst)
    assert hw.executor_busy_issue_s_by_kind == {"gemm": pytest.approx(2e-6)}
    assert hw.executor_cpu_bytes_per_s == pytest.approx(9e10)


def test_measure_rounds_take_medians_and_refit_the_matvec_line(monkeypatch, tmp_path):
    """measure(rounds=3): the median of every numeric key over the rounds, the matvec line
    refitted through the median time per size (not the median of the per-round lines), and the
    loop check redone with the medians."""
    import calibrate.executor_costs as EC
    from sim.model.costs import fit_matvec_line
    from sim.model.specs import load_hardware
    from pathlib import Path

    b1, b2 = 4 << 20, 16 << 20
    rounds = iter([
        {**{k: 1e-5 for k in EC.PROBES}, "host_work": 1e-5, "host_work_per_id": 1e-8, "busy_gemm": 1e-6,
         f"loop_t_{b1}": 100e-6, f"loop_t_{b2}": 200e-6, f"loop_mk_{b1}": 1e-2, f"loop_mk_{b2}": 2e-2, "loop_n": 2,
         "loop_check": [(0, 0.0, 0.0)]},
        {**{k: 3e-5 for k in EC.PROBES}, "host_work": 3e-5, "host_work_per_id": 3e-8, "busy_gemm": 9e-6,
         f"loop_t_{b1}": 60e-6, f"loop_t_{b2}": 400e-6, f"loop_mk_{b1}": 3e-2, f"loop_mk_{b2}": 4e-2, "loop_n": 2},
        {**{k: 2e-5 for k in EC.PROBES}, "host_work": 2e-5, "host_work_per_id": 2e-8, "busy_gemm": 2e-6,
         f"loop_t_{b1}": 80e-6, f"loop_t_{b2}": 250e-6, f"loop_mk_{b1}": 2e-2, f"loop_mk_{b2}": 3e-2, "loop_n": 2},
    ])
    monkeypatch.setattr(EC, "_measure_once", lambda hw, **kw: next(rounds))
    hw = load_hardware(Path(__file__).resolve().parent.parent / "scenarios" / "hardware" / "h200.toml")
    c = EC.measure(hw, rounds=3, round_gap_s=0.0, statistic="median")
    assert c["rounds"] == 3 and c["gemm"] == pytest.approx(2e-5) and c["busy_gemm"] == pytest.approx(2e-6)
    assert c["statistic"] == "median"
    assert c["loop_sizes"] == [(b1, pytest.approx(80e-6)), (b2, pytest.approx(250e-6))]
    line = fit_matvec_line([(b1, 80e-6), (b2, 250e-6)])
    assert c["cpu_op"] == pytest.approx(line["cpu_op"])
    assert c["cpu_bytes_per_s"] == pytest.approx(line["cpu_bytes_per_s"])
    assert len(c["per_round"]) == 3 and "round 2: launch gemm 30.0 us" in EC.summary(c)
    assert [(b, mk) for b, mk, _p in c["loop_check"]] == [(b1, pytest.approx(2e-2)), (b2, pytest.approx(3e-2))]
    assert all(p > 0 for _b, _mk, p in c["loop_check"])
    with pytest.raises(ValueError, match="rounds"):
        EC.measure(hw, rounds=0)
    with pytest.raises(ValueError, match="statistic"):
        EC.measure(hw, rounds=2, statistic="mode")


def test_measure_rounds_default_to_the_mean_of_a_two_level_cost(monkeypatch, tmp_path):
    """measure(rounds=N) prices with the mean over the rounds by default: with a launch cost at
    8 µs in two rounds and 14 µs in one, the median says 8 and the mean 10 (the expected cost of
    a launch); the host-work and matvec lines go through the mean points; the profile's sources
    say "mean of 3 rounds"; rounds_frame tabulates every round."""
    import calibrate.executor_costs as EC
    from sim.model.costs import fit_host_work_line, fit_matvec_line
    from sim.model.specs import load_hardware
    from pathlib import Path

    b1, b2 = 4 << 20, 16 << 20

    def one(launch_us, t1, t2, hw_t):
        return {**{k: launch_us * 1e-6 for k in EC.PROBES}, "busy_gemm": launch_us * 1e-7,
                "host_work_t_64": hw_t, "host_work_t_16384": 10 * hw_t,
                f"loop_t_{b1}": t1, f"loop_t_{b2}": t2, f"loop_mk_{b1}": 1e-2, f"loop_mk_{b2}": 2e-2,
                "loop_n": 2, "gc": "off"}

    each = [one(8, 100e-6, 220e-6, 1e-5), one(14, 130e-6, 400e-6, 4e-5), one(8, 70e-6, 240e-6, 1e-5)]
    it = iter(each)
    monkeypatch.setattr(EC, "_measure_once", lambda hw, **kw: next(it))
    hw = load_hardware(Path(__file__).resolve().parent.parent / "scenarios" / "hardware" / "h200.toml")
    c = EC.measure(hw, rounds=3, round_gap_s=0.0)
    assert c["statistic"] == "mean" and c["gemm"] == pytest.approx(10e-6) and c["attn"] == pytest.approx(10e-6)
    assert c["busy_gemm"] == pytest.approx(1e-6)
    assert c["loop_sizes"] == [(b1, pytest.approx(100e-6)), (b2, pytest.approx(860e-6 / 3))]
    line = fit_matvec_line([(b1, 100e-6), (b2, 860e-6 / 3)])
    assert c["cpu_op"] == pytest.approx(line["cpu_op"]) and c["cpu_bytes_per_s"] == pytest.approx(line["cpu_bytes_per_s"])
    hwl = fit_host_work_line([(64, 2e-5), (16384, 2e-4)])
    assert c["host_work"] == pytest.approx(hwl["host_work"]) and c["host_work_per_id"] == pytest.approx(hwl["host_work_per_id"])
    src = dict((k, s) for k, _v, s in EC.profile_entries(c))
    assert "(mean of 3 rounds)" in src["executor_issue_gemm_us"]
    tab = EC.rounds_frame(c)
    assert list(tab["round"]) == [1, 2, 3] and tab["gemm"].tolist() == pytest.approx([8e-6, 14e-6, 8e-6])
    assert "gc" not in tab.columns and EC.rounds_frame({"gemm": 1e-5}) is None


def test_aggregate_costs_mean_median_and_bad_statistic():
    from sim.views.validation import aggregate_costs, median_costs

    rows = [{"a": 1.0, "b": "x", "c": float("nan")}, {"a": 2.0, "c": True}, {"a": 6.0, "d": 4}]
    assert aggregate_costs(rows, "mean") == {"a": 3.0, "d": 4.0}
    assert aggregate_costs(rows) == median_costs(rows) == {"a": 2.0, "d": 4.0}
    with pytest.raises(ValueError, match="statistic"):
        aggregate_costs(rows, "max")


def test_fit_matvec_line_and_the_refit_from_loop_points():
    import sim.views.validation as V
    from sim.model.costs import fit_matvec_line
    from sim.model.specs import load_hardware
    from pathlib import Path

    pts = [(b, 20e-6 + b / 90e9) for b in (4 << 20, 8 << 20, 64 << 20)]
    line = fit_matvec_line(pts)
    assert line["cpu_op"] == pytest.approx(20e-6) and line["cpu_bytes_per_s"] == pytest.approx(90e9)
    assert fit_matvec_line([(1, 2e-4), (2, 1e-4)]) == {} and fit_matvec_line([(1, 1e-4)]) == {}
    assert fit_matvec_line([(1 << 20, 1e-3), (2 << 20, 1e-3 + 1e-15)]) == {}  # flat: no bandwidth
    through_origin = fit_matvec_line([(1 << 20, 5e-6), (64 << 20, 800e-6)])  # the fit's intercept < 0
    assert through_origin["cpu_op"] == 0.0 and through_origin["cpu_bytes_per_s"] > 0
    # loop points without a rising line: the native CPU figures price the executor's matvecs
    assert V.resolve_executor_costs({"cpu_op": 1e-5, "cpu_bytes_per_s": 9e10, "loop_t_1": 2e-4,
                                     "loop_t_2": 1e-4})["cpu_bytes_per_s"] == 0.0
    hw = load_hardware(Path(__file__).resolve().parent.parent / "scenarios" / "hardware" / "h200.toml")
    # loop points win over a separately given intercept and slope
    got = V.with_executor_costs(hw, {"cpu_op": 1.0, "cpu_bytes_per_s": 1.0, **{f"loop_t_{b}": t for b, t in pts}})
    assert got.executor_cpu_op_s == pytest.approx(20e-6) and got.executor_cpu_bytes_per_s == pytest.approx(90e9)


def test_host_work_line_is_refitted_through_median_points():
    import sim.views.validation as V
    from calibrate.executor_costs import host_work_line
    from sim.model.costs import fit_host_work_line

    line = fit_host_work_line([(64, 10e-6 + 64 * 2e-8), (16384, 10e-6 + 16384 * 2e-8)])
    assert line["host_work"] == pytest.approx(10e-6) and line["host_work_per_id"] == pytest.approx(2e-8)
    assert fit_host_work_line([(64, 1e-5)]) == {}
    pts = {"host_work_t_64": 10e-6 + 64 * 2e-8, "host_work_t_16384": 10e-6 + 16384 * 2e-8}
    assert host_work_line(pts) == line
    # the points win over a separately given intercept and slope
    got = V.resolve_executor_costs({"host_work": 1.0, "host_work_per_id": 1.0, **pts})
    assert got["host_work"] == pytest.approx(10e-6) and got["host_work_per_id"] == pytest.approx(2e-8)


@pytest.mark.parametrize("gc_off, gc_before", [(True, True), (True, False), (False, True)])
def test_timed_runs_keep_the_garbage_collector_off_and_restore_it(monkeypatch, gc_off, gc_before):
    """With ``gc_off`` (the default) the cyclic collector is off during every timed run and
    on during the probe runs; afterwards it is as it was before, also when it was off."""
    import gc

    import calibrate.executor as ex

    seen = []
    real = ex._run_once

    def spy(rt, probes=True):
        seen.append((probes, gc.isenabled()))
        return real(rt, probes)

    monkeypatch.setattr(ex, "_run_once", spy)
    was = gc.isenabled()
    try:
        (gc.enable if gc_before else gc.disable)()
        execute(sequential_plan(2, WB, SHAPE), warmup=1, repeats=3, probes=True, cp=fakecp, gc_off=gc_off)
        after = gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
    timed = [on for probes, on in seen if not probes]
    assert len(timed) == 3 and len(seen) == 5  # 1 warm-up, 3 timed, 1 probe run
    assert timed == [gc_before and not gc_off] * 3
    assert [on for probes, on in seen if probes] == [gc_before] * 2
    assert after == gc_before


def test_timed_runs_restore_the_collector_when_a_run_raises_and_collect_once(monkeypatch):
    """A timed run that raises leaves the collector as it was; one gc.collect() per call."""
    import gc

    import calibrate.executor as ex

    n_timed, collects = [], []
    real = ex._run_once

    def failing(rt, probes=True):
        if not probes:
            n_timed.append(1)
            if len(n_timed) == 2:
                raise RuntimeError("boom")
        return real(rt, probes)

    monkeypatch.setattr(ex.gc, "collect", lambda *a: collects.append(1) or 0)
    monkeypatch.setattr(ex, "_run_once", failing)
    was = gc.isenabled()
    try:
        gc.enable()
        with pytest.raises(RuntimeError, match="boom"):
            execute(sequential_plan(2, WB, SHAPE), warmup=0, repeats=3, probes=False, cp=fakecp)
        assert gc.isenabled()
        assert len(collects) == 1
        collects.clear()
        monkeypatch.setattr(ex, "_run_once", real)
        execute(sequential_plan(2, WB, SHAPE), warmup=0, repeats=2, probes=False, cp=fakecp, gc_off=False)
        assert collects == []
    finally:
        (gc.enable if was else gc.disable)()


@pytest.mark.slow
@pytest.mark.parametrize("gc_off", [True, False])
def test_executor_cost_probes_pass_the_collector_setting_and_record_it(monkeypatch, gc_off):
    """measure(gc_off=...) runs every probe with that setting, records it as ``gc`` (a string,
    so that medians skip it) and the profile's sources say it."""
    from pathlib import Path

    import calibrate.executor as ex
    import calibrate.executor_costs as EC
    from sim.model.specs import load_hardware

    seen = []
    real = ex.execute

    def spy(plan, **kw):
        seen.append(kw.get("gc_off"))
        return real(plan, **kw)

    monkeypatch.setattr(ex, "execute", spy)
    hw = load_hardware(Path(__file__).resolve().parent.parent / "scenarios" / "hardware" / "h200.toml")
    c = EC.measure(hw, n=2, cp=fakecp, busy=False, rounds=2, round_gap_s=0.0, gc_off=gc_off)
    assert seen and all(s is gc_off for s in seen)
    assert c["gc"] == ("off" if gc_off else "on")
    src = dict((k, s) for k, _v, s in EC.profile_entries(c))["executor_issue_gemm_us"]
    assert f"garbage collector {'off' if gc_off else 'on'}" in src
    busy_kw = []
    monkeypatch.setattr(EC, "measure_busy", lambda hw, **kw: busy_kw.append(kw) or {})
    EC.measure(hw, n=2, cp=fakecp, busy=True, gc_off=gc_off)
    assert len(busy_kw) == 1 and busy_kw[0]["gc_off"] is gc_off
