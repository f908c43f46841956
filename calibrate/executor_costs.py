"""The executor's own launch cost per op kind, measured on dedicated lockstep plans.

The thin executor launches from Python; each op also records timing events and dispatches
through a small interpreter, so its host cost per op differs by kind (an attention is three
prepared launches, two cuBLAS GEMMs and a softmax kernel; a GEMM one prepared cuBLAS call).
Validation prices launches the executor's way (``executor_mode``); this module measures those
costs so that the prices come from calibration, not from the validation grid.

Method: for each kind, a plan of ``n`` ops in lockstep (launch, run on the compute stream,
host sync — as in batch-1 decode or the one-graph-copy baseline) is run by the executor
(warm-up, median of 3 repeats). The plan's makespan minus the simulator's prediction with a
zero launch cost, divided by ``n``, is that kind's launch cost. The shapes are small, so the
GPU time is a minor, table-priced part.

Busy host (decode): once the executor has run CPU-backend ops, its launches are slower (on the
lent H200 VM 1.5–4.5× per kind, ``data/validation/history/diag/``; the cause is not isolated:
the BLAS worker threads stay active after each matvec, and the matvec stream evicts the launch
path from the CPU caches), and its numpy matvecs cost more per op than in the isolated host
series. Two more probe families measure this in decode's shape:
``burst_plan`` (``per`` launches of one kind, a host sync, then ``n_cpu`` CPU matvecs — or no
CPU ops, the reference) gives each kind's extra launch cost, ``(busy makespan − the CPU ops'
measured host time − reference makespan) / launches``; ``loop_plan`` (a decode layer: GEMM,
attention, GEMM, GEMM, D2H, host sync, ``n_cpu`` CPU matvecs, H2D) at several matvec sizes
gives the executor's matvec cost, a line through the sizes of the mean (over the ops'
positions in a run) of the median host time per position, and, priced with everything measured
here, a check of the prediction of the whole loop.

Decode chain: priced with all of the above, the validation grid's batch-1 decode plans ran
≈ 11% slower against their prediction than this synthetic loop did, in the same process and
minutes (``benchmarks/bench_decode_chain.py``, ``data/validation/history/diag/decode_chain.csv``;
one shape and one probe attention per layer in the loop, the real layers' shapes in the
plans). So the busy-host costs get one factor, ``busy_scale`` (:func:`fit_busy_scale`), fitted
to builder-made decode plans of two models the grid does not use (:func:`chain_plans`).

``python -m calibrate.executor_costs --profile scenarios/hardware/NAME.toml`` adds the
``executor_*`` keys (:func:`profile_entries`) to the profile (rewritten atomically);
``prefetch-sim calibrate`` runs it at the end.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from sim.plan import OpKind, Plan, Stream

#: kind -> (op kind, shape, weight bytes) of the lockstep probe ops (Qwen3-30B-A3B geometry)
PROBES = {
    "gemm": (OpKind.GEMM, (1, 4096, 2048), 4096 * 2048 * 2),
    "moe": (OpKind.MOE, (1, 768, 2048, 8, 8), 8 * 768 * 2048 * 2),
    "attn": (OpKind.ATTN, (1, 1024, 32, 4, 128, 0, 0, 128), 0),
    "h2d": (OpKind.H2D, (), 64 * 1024),
    "d2h": (OpKind.D2H, (), 64 * 1024),
}


def lockstep_plan(kind: str, n: int = 40) -> Plan:
    """``n`` × (launch, op on compute stream 0, host sync) for one probe kind."""
    plan = Plan(label=f"executor launch probe: {kind}")
    for i in range(n):
        op = _launch(plan, kind, f"probe.{kind}.{i % 4}", (), i)
        plan.add(OpKind.HOST_SYNC, Stream.HOST, -1, f"sync {i}", (op,), split=i)
    return plan


#: router-id counts of the host-work probes (a decode token ... a 2048-token ubatch at top-8)
HOST_WORK_IDS = (64, 16384)


def host_work_plan(n_ids: int, n: int = 40) -> Plan:
    """``n`` host-work ops (building the used-expert runs from ``n_ids`` router ids)."""
    plan = Plan(label=f"executor host-work probe: {n_ids} ids")
    for i in range(n):
        plan.add(OpKind.HOST_WORK, Stream.HOST, -1, f"expert runs {i}", shape=(n_ids,), split=i)
    return plan


#: columns of the CPU matvecs of the busy-host probes (Qwen3-30B-A3B hidden size)
LOOP_K = 2048
#: CPU matvec bytes between launch bursts in :func:`burst_plan` (about one expert slice)
BURST_CPU_BYTES = 8 * 2**20
#: CPU matvec sizes of :func:`loop_plan` (bytes): expert slices of a decode token ... a dense
#: model's FFN weight
LOOP_CPU_BYTES = (4 * 2**20, 8 * 2**20, 16 * 2**20, 64 * 2**20)


def _cpu(plan: Plan, nbytes: int, name: str, deps) -> int:
    rows = max(1, nbytes // 4 // LOOP_K)
    return plan.add(OpKind.CPU_MATVEC, Stream.CPU, -1, name, deps, nbytes=rows * LOOP_K * 4,
                    shape=(1, rows, LOOP_K, 1))


def _launch(plan: Plan, kind: str, name: str, deps, split: int) -> int:
    op_kind, shape, nbytes = PROBES[kind]
    iss = plan.add(OpKind.ISSUE, Stream.HOST, -1, f"issue {name}", deps, tag=op_kind.value,
                   shape=shape if op_kind is OpKind.ATTN else (), split=split)
    return plan.add(op_kind, Stream.COMPUTE, 0, name, (iss,), nbytes=nbytes, shape=shape, split=split, pinned=True)


def burst_plan(kind: str, n: int = 24, per: int = 3, cpu_bytes: int = 0, n_cpu: int = 3) -> Plan:
    """``n`` × (``per`` launches of ``kind`` on compute stream 0, a host sync, then ``n_cpu``
    CPU matvecs of ``cpu_bytes`` each when ``cpu_bytes`` > 0): batch-1 decode's shape."""
    plan = Plan(label=f"executor busy-launch probe: {kind}{' + cpu' if cpu_bytes else ''}")
    prev: tuple = ()
    for i in range(n):
        for j in range(per):
            prev = (_launch(plan, kind, f"probe.{kind}.{j}", prev, i),)
        prev = (plan.add(OpKind.HOST_SYNC, Stream.HOST, -1, f"sync {i}", prev, split=i),)
        if cpu_bytes:
            for j in range(n_cpu):
                prev = (_cpu(plan, cpu_bytes, f"cpu.{j}", prev),)
    return plan


def loop_plan(cpu_bytes: int, n: int = 24, n_cpu: int = 3) -> Plan:
    """``n`` decode-shaped layers: GEMM, attention, GEMM, GEMM, D2H launched back to back, a
    host sync, ``n_cpu`` CPU matvecs of ``cpu_bytes`` each, an H2D of the activations."""
    plan = Plan(label=f"executor decode-loop probe: {cpu_bytes} B matvecs")
    prev: tuple = ()
    for i in range(n):
        for j, kind in enumerate(("gemm", "attn", "gemm", "gemm", "d2h")):
            prev = (_launch(plan, kind, f"layer.{kind}.{j}", prev, i),)
        prev = (plan.add(OpKind.HOST_SYNC, Stream.HOST, -1, f"sync {i}", prev, split=i),)
        for j in range(n_cpu):
            prev = (_cpu(plan, cpu_bytes, f"cpu.{j}", prev),)
        prev = (_launch(plan, "h2d", "act", prev, i),)
    return plan


def _cpu_host_s(plan: Plan, r) -> tuple[float, np.ndarray]:
    """Total measured host time of the CPU ops of ``plan`` in run ``r``, and the median per
    position in a run (``cpu.0``, ``cpu.1``, …)."""
    names = sorted({op.name for op in plan.ops if op.kind is OpKind.CPU_MATVEC})
    ids = {nm: [op.id for op in plan.ops if op.name == nm] for nm in names}
    total = float(sum(np.nansum(r.host_op_s[v]) for v in ids.values()))
    per_pos = np.array([float(np.nanmedian(r.host_op_s[ids[nm]])) for nm in names])
    return total, per_pos


def measure_busy(hw, *, n: int = 24, per: int = 3, sizes: tuple[int, ...] = LOOP_CPU_BYTES, cp=None,
                 repeats: int = 3, gc_off: bool = True) -> dict:
    """The executor's busy-host costs, given the profile ``hw`` and its measured lockstep
    launch costs (see the module docstring).

    Raises:
        ValueError: fewer than two distinct ``sizes``.

    Returns:
        dict with ``busy_<kind>`` (seconds of extra launch cost per kind, clamped at 0),
        ``busy_per``: ``per``; per loop size ``loop_t_<bytes>`` (the mean over a layer's matvec
        positions of the median host time per position, seconds) and ``loop_mk_<bytes>`` (the
        loop's measured makespan), ``loop_n``: ``n``; per held-out model ``chain_mk_<model>``
        (the measured makespan of its :func:`chain_plans` decode plan, seconds); and
        :func:`finish_loop`'s ``cpu_op``, ``cpu_bytes_per_s``, ``loop_sizes``, ``loop_check``,
        ``busy_scale``, ``chain_check``.
    """
    from .executor import execute  # noqa: PLC0415

    def run(plan):
        return execute(plan, test="probe", variant="busy", warmup=1, repeats=repeats, probes=False, cp=cp,
                       gc_off=gc_off)

    if len(set(sizes)) < 2:
        raise ValueError(f"measure_busy needs at least two matvec sizes, got {sizes}")
    out: dict = {"busy_per": per}
    for kind in PROBES:
        ref = run(burst_plan(kind, n, per))
        plan = burst_plan(kind, n, per, cpu_bytes=BURST_CPU_BYTES)
        r = run(plan)
        cpu_total, _ = _cpu_host_s(plan, r)
        out[f"busy_{kind}"] = max((r.makespan_s - cpu_total - ref.makespan_s) / (n * per), 0.0)
    for nb in sizes:
        plan = loop_plan(nb, n)
        r = run(plan)
        _, per_pos = _cpu_host_s(plan, r)
        b = int(next(op.nbytes for op in plan.ops if op.kind is OpKind.CPU_MATVEC))
        out[f"loop_t_{b}"] = float(np.mean(per_pos))  # mean over positions of the median per position
        out[f"loop_mk_{b}"] = float(r.makespan_s)
    out["loop_n"] = n
    for model, plan in chain_plans(hw).items():
        out[f"chain_mk_{model}"] = float(run(plan).makespan_s)
    return finish_loop(hw, out)


#: layers and decode tokens of the held-out decode-chain probes (:func:`chain_plans`)
CHAIN_LAYERS, CHAIN_TOKENS = 4, 4


def chain_plans(hw) -> dict:
    """The decode-chain probes: model name -> :func:`sim.views.validation.decode_probe_plan` of each
    of :data:`sim.views.validation.DECODE_PROBE_MODELS` (``CHAIN_LAYERS`` layers, ``tg<CHAIN_TOKENS>``)."""
    from sim.views.validation import DECODE_PROBE_MODELS, decode_probe_plan  # noqa: PLC0415

    return {m: decode_probe_plan(m, hw, CHAIN_LAYERS, CHAIN_TOKENS) for m in DECODE_PROBE_MODELS}


#: bounds of a fitted busy-host scale: outside them the fit is broken, not a measurement
BUSY_SCALE_RANGE = (0.25, 4.0)
#: Gauss-Newton steps after the first (linearised) busy-scale fit (:func:`fit_busy_scale`); a
#: makespan is piecewise linear in the scale, so one step from the right segment is exact and
#: the fits of the tests (0.6–2.0 on the run-21 and run-24 profiles) converge in one or two.
BUSY_SCALE_REFINE = 4
#: the scale step of the finite-difference makespan slope in those steps (the makespans are
#: sums of µs-scale op times: 1e-4 of a 40-ms plan's busy time moves it by ≈ 1–4 µs, far above
#: float rounding, and crosses a kink only when the fit sits within 1e-4 of one).
BUSY_SCALE_FD_STEP = 1e-4


def fit_busy_scale(hw, measured: dict) -> tuple[float, list]:
    """The factor ``s`` on the busy-host costs (:func:`sim.model.costs.busy_mask`) that best predicts
    the decode-chain probes, given the profile ``hw`` (priced with everything else measured,
    ``executor_busy_scale`` 1) and ``measured`` (model -> measured makespan, seconds).

    With every busy-host op on the plan's critical path (batch-1 decode: launches, host sync,
    CPU matvecs in one chain) a plan's makespan is ``pred + (s - 1) * H``, ``H`` the busy ops'
    predicted time; ``s`` is the least-squares solution over the probes (absolute residuals, so
    the probe with the most busy time weighs most: mixtral-8x7b's ``H`` is about 3× gpt-oss-20b's),
    clipped to :data:`BUSY_SCALE_RANGE` (:func:`summary` flags a clipped fit). One linearisation:
    when some busy ops are off the critical path the makespan grows by a little less than
    ``(s - 1) * H`` (by 0.96–1.0 of it on the run-19 profile; with ``s`` < 1 GPU work can turn
    critical), so that first ``s`` is then slightly off (a fit to makespans simulated at 0.8 on
    the run-21 profile returned 0.8004, at 1.3 on the run-24 profile 1.29989). Up to
    :data:`BUSY_SCALE_REFINE` Gauss-Newton steps follow, each with every probe's makespan slope
    in ``s`` taken from the engine (a forward difference of :data:`BUSY_SCALE_FD_STEP`); a
    makespan is piecewise linear in ``s``, so a step from the right segment lands on the
    least-squares ``s``. A step that would fit worse (across a kink) is halved up to four
    times, then the refinement stops at the best ``s`` so far.
    Non-finite or non-positive makespans and unknown models are ignored.

    Returns:
        (``s``, rows ``(model, measured_s, predicted_s at s = 1, predicted_s at s)``);
        ``(None, [])`` when no probe is usable (no fit: nothing to write)."""
    from sim.model.costs import busy_mask, plan_durations  # noqa: PLC0415
    from sim.views.validation import predict_s  # noqa: PLC0415

    hw1 = replace(hw, executor_mode=True, executor_busy_scale=1.0)
    plans = chain_plans(hw1)
    pts = []
    for model, mk in measured.items():
        if model not in plans or not (math.isfinite(mk) and mk > 0):
            continue
        busy_s = float(plan_durations(plans[model], hw1)[busy_mask(plans[model])].sum())
        pts.append((model, float(mk), predict_s(plans[model], hw1), busy_s))
    den = sum(h * h for *_x, h in pts)
    if not pts or den <= 0:
        return None, []
    lo, hi = BUSY_SCALE_RANGE

    def makespans(scale: float) -> list[float]:
        hws = replace(hw1, executor_busy_scale=scale)
        return [predict_s(plans[m], hws) for m, *_r in pts]

    measured_s = [mk for _m, mk, _pr, _h in pts]

    def sse(at: list[float]) -> float:
        return sum((mk - a) ** 2 for mk, a in zip(measured_s, at))

    s = min(max(1.0 + sum((mk - pr) * h for _m, mk, pr, h in pts) / den, lo), hi)
    at = makespans(s)
    for _ in range(BUSY_SCALE_REFINE):
        if s in (lo, hi):
            break
        slope = [(b - a) / BUSY_SCALE_FD_STEP for a, b in zip(at, makespans(s + BUSY_SCALE_FD_STEP))]
        jj = sum(j * j for j in slope)
        if jj <= 0:
            break
        ds = sum(j * (mk - a) for j, mk, a in zip(slope, measured_s, at)) / jj
        for _half in range(4):  # a step across a kink that fits worse is halved, then given up
            s_new = min(max(s + ds, lo), hi)
            at_new = makespans(s_new)
            if sse(at_new) <= sse(at):
                break
            ds /= 2
        else:
            break
        converged = abs(s_new - s) <= 1e-12 * max(abs(s), 1.0)
        s, at = s_new, at_new
        if converged:
            break
    rows = [(m, mk, pr, fit) for (m, mk, pr, _h), fit in zip(pts, at)]
    return s, rows


def finish_loop(hw, costs: dict) -> dict:
    """Add to ``costs`` (the numeric keys of :func:`measure_busy`, possibly aggregated over
    rounds) the matvec line through its ``loop_t_<bytes>`` points (``cpu_op``,
    ``cpu_bytes_per_s``; absent when the time does not grow with the bytes: the profile's
    native CPU figures then price the executor's matvecs), ``loop_sizes`` and ``loop_check``
    (each loop probe predicted with every cost in ``costs``, against its ``loop_mk_<bytes>``),
    and with ``chain_mk_<model>`` makespans :func:`fit_busy_scale`'s ``busy_scale`` and
    ``chain_check``."""
    from sim.model.costs import fit_matvec_line, plan_durations, prefixed_points  # noqa: PLC0415
    from sim.engines import analytic  # noqa: PLC0415

    out = {k: v for k, v in costs.items() if k not in ("cpu_op", "cpu_bytes_per_s", "busy_scale")}
    pts = prefixed_points(out, "loop_t_")
    out.update(fit_matvec_line(pts))
    out["loop_sizes"] = pts
    priced = replace(hw, executor_mode=True, executor_busy_scale=1.0, executor_cpu_op_s=out.get("cpu_op", 0.0),
                     executor_cpu_bytes_per_s=out.get("cpu_bytes_per_s", 0.0),
                     executor_busy_issue_s_by_kind={k: out[f"busy_{k}"] for k in PROBES if f"busy_{k}" in out})
    n = int(out.get("loop_n", 24))
    out["loop_check"] = [(b, mk, float(analytic.run(p, plan_durations(p, priced)).makespan_s))
                         for b, mk in prefixed_points(out, "loop_mk_") for p in (loop_plan(b, n),)]
    chain = {k[len("chain_mk_"):]: float(v) for k, v in out.items() if k.startswith("chain_mk_")}
    if chain:
        scale, out["chain_check"] = fit_busy_scale(priced, chain)
        if scale is not None:  # no usable probe: no scale (a profile then prices with 1, unrecorded)
            out["busy_scale"] = scale
    return out


def measure(hw, *, n: int = 40, cp=None, busy: bool = True, rounds: int = 1,
            round_gap_s: float = 2.0, gc_off: bool = True, statistic: str = "mean") -> dict:
    """Launch cost (seconds) per probe kind on the executor, given the profile ``hw``, and
    the executor's host work of building expert runs: ``host_work`` (seconds per op) and
    ``host_work_per_id`` (seconds per router id), a line through :data:`HOST_WORK_IDS`; with
    ``busy``, also :func:`measure_busy`'s keys, priced with the launch costs measured here.

    ``rounds`` > 1 repeats the whole measurement, ``round_gap_s`` apart, and returns the
    ``statistic`` (:func:`sim.views.validation.aggregate_costs`: ``"mean"``, the default, or
    ``"median"``) of every numeric key over the rounds, the host-work and matvec lines refitted
    through the aggregated points and the loop check redone with them (:func:`finish_loop`):
    one sample of a drifting host is not a measurement (a single 64 MiB loop point once spoiled
    the line, ``docs/calibration.md``). The mean is the default because every one of these
    costs is summed over many ops and the launch costs jump between two levels from one
    measurement to the next (``docs/validation.md``): a median of a few rounds lands on one
    level, the mean estimates the expected cost per op.

    Raises:
        ValueError: ``rounds`` < 1 or an unknown ``statistic``."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if statistic not in ("mean", "median"):
        raise ValueError(f"statistic must be 'mean' or 'median', got {statistic!r}")
    if rounds > 1:
        import time  # noqa: PLC0415

        from sim.views.validation import aggregate_costs  # noqa: PLC0415

        each = []
        for i in range(rounds):
            if i:
                time.sleep(round_gap_s)
            each.append(_measure_once(hw, n=n, cp=cp, busy=busy, gc_off=gc_off))
        med = aggregate_costs(each, statistic)
        med.update(host_work_line(med))  # one line through the aggregated points
        med["rounds"] = rounds
        med["statistic"] = statistic  # strings: aggregates over rounds and passes skip them
        med["gc"] = "off" if gc_off else "on"
        med["per_round"] = each  # non-numeric: the spread, for the record (summary, raw logs)
        if not busy:
            return med
        return finish_loop(replace(hw, executor_issue_s_by_kind={k: med[k] for k in PROBES if k in med}), med)
    return _measure_once(hw, n=n, cp=cp, busy=busy, gc_off=gc_off)


def _measure_once(hw, *, n: int, cp, busy: bool, gc_off: bool = True) -> dict:
    """One round of :func:`measure`."""
    from sim.model.costs import plan_durations  # noqa: PLC0415
    from sim.engines import analytic  # noqa: PLC0415

    from .executor import execute  # noqa: PLC0415

    out = {}
    base = replace(hw, executor_mode=True, executor_op_issue_s=1e-12, executor_issue_s_by_kind={},
                   attn_table=None if hw.attn_table is None else hw.attn_table.drop(columns=["t_host_s"],
                                                                                     errors="ignore"))
    for kind in PROBES:
        plan = lockstep_plan(kind, n)
        r = execute(plan, test="probe", variant=kind, warmup=1, repeats=3, probes=False, cp=cp, gc_off=gc_off)
        pred0 = float(analytic.run(plan, plan_durations(plan, base)).makespan_s)
        out[kind] = max((r.makespan_s - pred0) / n, 0.0)
    for n_ids in HOST_WORK_IDS:  # the points, so that aggregates over rounds refit one line
        r = execute(host_work_plan(n_ids, n), test="probe", variant="host_work", warmup=1, repeats=3, probes=False,
                    cp=cp, gc_off=gc_off)
        out[f"host_work_t_{n_ids}"] = r.makespan_s / n
    out.update(host_work_line(out))
    out["gc"] = "off" if gc_off else "on"  # a string: aggregates over rounds and passes skip it
    if busy:
        out.update(measure_busy(replace(hw, executor_issue_s_by_kind={k: out[k] for k in PROBES}),
                                n=max(4, min(n, 24)), cp=cp, gc_off=gc_off))
    return out


def host_work_line(costs: dict) -> dict[str, float]:
    """:func:`sim.model.costs.fit_host_work_line` through the ``host_work_t_<ids>`` points of
    ``costs`` (per-op times at :data:`HOST_WORK_IDS`), or ``{}`` without them."""
    from sim.model.costs import fit_host_work_line, prefixed_points  # noqa: PLC0415

    return fit_host_work_line(prefixed_points(costs, "host_work_t_"))


def profile_entries(costs: dict, device: str = "") -> list[tuple[str, float, str]]:
    """``(key, value, source)`` of the profile keys for the measured ``costs`` (the keys of
    :func:`measure`), values in the key's unit."""
    dev = f" ({device})" if device else ""
    cmd = f"python -m calibrate.executor_costs{dev}"
    how = (f" ({costs.get('statistic', 'median')} of {int(costs['rounds'])} rounds)"
           if costs.get("rounds", 1) > 1 else "")
    if costs.get("gc") in ("on", "off"):
        how += f" (timed runs with Python's garbage collector {costs['gc']})"
    out = []
    for k in PROBES:
        if k in costs:
            out.append((f"executor_issue_{k}_us", costs[k] * 1e6, f"measured: the executor's host cost per {k} op in "
                        f"lockstep (launch + op + sync) beyond the simulated op{how}, {cmd}"))
    if "host_work" in costs:
        out.append(("executor_host_work_us", costs["host_work"] * 1e6, "measured: the executor's host time per op "
                    f"building used-expert runs (numpy), intercept of a line through {HOST_WORK_IDS[0]} and "
                    f"{HOST_WORK_IDS[1]} router ids{how}, {cmd}"))
        out.append(("executor_host_work_ns_per_id", costs["host_work_per_id"] * 1e9,
                    f"measured: slope of the same line, per router id, {cmd}"))
    for k in PROBES:
        if f"busy_{k}" in costs:
            out.append((f"executor_busy_issue_{k}_us", costs[f"busy_{k}"] * 1e6, f"measured: extra cost of a {k} "
                        f"launch between runs of CPU matvecs ({BURST_CPU_BYTES >> 20} MiB), bursts of "
                        f"{int(costs.get('busy_per', 3))} launches + sync + 3 matvecs vs the same bursts without "
                        f"matvecs{how}, {cmd}"))
    if "cpu_bytes_per_s" in costs:
        check = "; ".join(f"{nb >> 20} MiB {pr * 1e3:.3f}/{me * 1e3:.3f} ms"
                          for nb, me, pr in costs.get("loop_check", []))
        sizes = [b for b, _t in costs.get("loop_sizes", [])] or list(LOOP_CPU_BYTES)
        src = (f"measured: the executor's numpy matvec in a decode-shaped loop (5 launches, sync, 3 matvecs, "
               f"H2D), line through {', '.join(f'{b / 2**20:g}' for b in sizes)} MiB{how}, {cmd}")
        out.append(("executor_cpu_op_us", costs["cpu_op"] * 1e6, src))
        out.append(("executor_cpu_gb_per_s", costs["cpu_bytes_per_s"] / 1e9,
                    src + (f"; whole-loop check predicted/measured: {check}" if check else "")))
    if "busy_scale" in costs:
        check = "; ".join(f"{m} {pr1 * 1e3:.3f} -> {pr * 1e3:.3f}/{me * 1e3:.3f} ms"
                          for m, me, pr1, pr in costs.get("chain_check", []))
        out.append(("executor_busy_scale", costs["busy_scale"],
                    f"measured: factor on the executor's busy-host costs (its CPU matvecs, and its launches after "
                    f"a plan's first CPU matvec) "
                    f"fitted (least squares) to batch-1 decode plans of held-out models ({CHAIN_LAYERS} layers, "
                    f"tg{CHAIN_TOKENS}, experts on the CPU){how}, {cmd}"
                    + (f"; predicted at 1 -> fitted / measured: {check}" if check else "")))
    return out


def summary(costs: dict) -> str:
    """The measured costs as ``key = value`` lines in the profile's units, then the decode-loop
    check (predicted / measured)."""
    lines = [f"{k} = {v:.4g}" for k, v, _s in profile_entries(costs)]
    for nb, t in costs.get("loop_sizes", []):
        lines.append(f"executor matvec in the decode-loop probe, {nb / 2**20:g} MiB: {t * 1e6:.1f} us per op "
                     f"({nb / t / 1e9:.1f} GB/s)")
    for i, r in enumerate(costs.get("per_round", [])):
        line = f"round {i + 1}: launch gemm {r.get('gemm', float('nan')) * 1e6:.1f} us, attn " \
               f"{r.get('attn', float('nan')) * 1e6:.1f} us"
        if "busy_gemm" in r:
            line += f", busy gemm +{r['busy_gemm'] * 1e6:.1f} us, attn +{r.get('busy_attn', float('nan')) * 1e6:.1f} us"
        if "cpu_bytes_per_s" in r:
            line += f", matvec {r.get('cpu_op', 0.0) * 1e6:.1f} us + bytes / {r['cpu_bytes_per_s'] / 1e9:.1f} GB/s"
        if "busy_scale" in r:
            line += f", busy scale {r['busy_scale']:.3f}"
        lines.append(line)
    for nb, me, pr in costs.get("loop_check", []):
        lines.append(f"decode-loop probe, {nb >> 20} MiB matvecs: predicted {pr * 1e3:.3f} ms, measured "
                     f"{me * 1e3:.3f} ms ({(pr - me) / me:+.1%})")
    for m, me, pr1, pr in costs.get("chain_check", []):
        lines.append(f"decode-chain probe {m}: predicted {pr1 * 1e3:.3f} ms unscaled ({(pr1 - me) / me:+.1%}), "
                     f"{pr * 1e3:.3f} ms with the busy scale ({(pr - me) / me:+.1%}), measured {me * 1e3:.3f} ms")
    if costs.get("busy_scale") in BUSY_SCALE_RANGE:
        lines.append(f"WARNING: the busy scale was clipped to {costs['busy_scale']:g} "
                     f"(range {BUSY_SCALE_RANGE}): a broken fit, check the decode-chain probes")
    n_chain = sum(k.startswith("chain_mk_") for k in costs)
    if n_chain and len(costs.get("chain_check", [])) < n_chain:
        lines.append(f"WARNING: {n_chain - len(costs.get('chain_check', []))} of {n_chain} decode-chain probes "
                     f"unusable (non-finite or unknown)" + ("; no busy scale fitted" if "busy_scale" not in costs
                                                           else ""))
    return "\n".join(lines)


def rounds_frame(costs: dict):
    """The numeric keys of every round of a multi-round :func:`measure` as a table (one row per
    round, ``round`` first, the keys' own units: seconds, B/s, counts, the unitless
    ``busy_scale``), or ``None`` for a single round: the spread behind the aggregated profile
    keys, for the raw logs."""
    import pandas as pd  # noqa: PLC0415

    from sim.views.validation import is_cost_number  # noqa: PLC0415

    each = costs.get("per_round") or []
    if not each:
        return None
    rows = [{"round": i + 1, **{k: v for k, v in r.items() if is_cost_number(v)}} for i, r in enumerate(each)]
    return pd.DataFrame(rows)


def update_profile(path: str | Path, costs: dict, device: str = "") -> Path:
    """Add (or replace) the executor's measured keys (:func:`profile_entries`: launch costs,
    host work, busy-host launch extras, CPU matvec line, busy-host scale) in the ``[hardware]``
    table of a profile TOML, atomically. A busy-host measurement (any ``busy_<kind>``) replaces
    that whole family — extras, matvec line and scale — also the keys it did not measure.

    Raises:
        ValueError: the file has no ``[hardware]`` table.
        tomllib.TOMLDecodeError: the result would not parse (nothing written).
        OSError: the file cannot be read or written."""
    import json  # noqa: PLC0415
    import tomllib  # noqa: PLC0415

    from sim.atomic import write_atomic  # noqa: PLC0415

    p = Path(path)
    lines = p.read_text().splitlines()
    every = profile_entries(costs, device)
    entries = [(k, v, src) for k, v, src in every if math.isfinite(v)]
    replaced = {k for k, _v, _s in every}
    if any(f"busy_{k}" in costs for k in PROBES):  # a busy-host measurement replaces its whole family,
        replaced |= {f"executor_busy_issue_{k}_us" for k in PROBES}  # also keys it could not measure
        replaced |= {"executor_cpu_op_us", "executor_cpu_gb_per_s", "executor_busy_scale"}
    lines = [ln for ln in lines if ln.split("=", 1)[0].strip() not in replaced]
    # at the end of the [hardware] table: before the next table ([measured] in a calibrated
    # profile), or at the end of the file
    hw_at = next((i for i, ln in enumerate(lines) if ln.strip() == "[hardware]"), None)
    if hw_at is None:
        raise ValueError(f"{p}: no [hardware] table to add the executor's costs to")
    at = next((i for i in range(hw_at + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines))
    while at > hw_at + 1 and not lines[at - 1].strip():
        at -= 1
    # json.dumps escapes quotes, backslashes and control characters as a TOML basic string does
    lines[at:at] = [f"{k} = {{ value = {v:.6g}, source = {json.dumps(src, ensure_ascii=False)} }}"
                    for k, v, src in entries]
    text = "\n".join(lines) + "\n"
    tomllib.loads(text)  # never replace a profile with one that does not parse
    return write_atomic(p, text)


def main(argv: list[str] | None = None) -> int:
    from sim.errors import PrefetchSimError  # noqa: PLC0415
    from sim.model.specs import load_hardware  # noqa: PLC0415

    ap = argparse.ArgumentParser(prog="python -m calibrate.executor_costs", description=__doc__.split("\n")[0])
    ap.add_argument("--profile", required=True, help="profile TOML to measure with and update")
    ap.add_argument("-n", type=int, default=40, help="ops per lockstep probe plan (>= 4)")
    ap.add_argument("--rounds", type=int, default=6,
                    help="whole measurements, 2 s apart, aggregated with --statistic (default 6)")
    ap.add_argument("--statistic", choices=("mean", "median"), default="mean",
                    help="aggregate over the rounds (default mean: the costs are summed over many ops)")
    args = ap.parse_args(argv)
    if args.n < 4:
        ap.error(f"-n must be >= 4, got {args.n}")
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    try:
        hw = load_hardware(args.profile)
        costs = measure(hw, n=args.n, rounds=args.rounds, statistic=args.statistic)
        update_profile(args.profile, costs, hw.gpu_name)
    except (PrefetchSimError, ValueError) as exc:
        print(f"calibrate.executor_costs: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"calibrate.executor_costs: error: cannot write '{args.profile}': {exc.strerror or exc}", file=sys.stderr)
        print(summary(costs))  # the measurement is not lost
        return 2
    print(summary(costs))
    return 0


if __name__ == "__main__":
    from sim.cli.interrupt import run_interruptible

    sys.exit(run_interruptible("calibrate.executor_costs", main))  # Ctrl-C / SIGTERM: one line, 130 / 143
