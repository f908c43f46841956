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

``python -m calibrate.executor_costs --profile scenarios/hardware/NAME.toml`` adds
``executor_issue_<kind>_us`` keys to the profile (rewritten atomically); ``prefetch-sim
calibrate`` runs it at the end.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

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
    op_kind, shape, nbytes = PROBES[kind]
    plan = Plan(label=f"executor launch probe: {kind}")
    for i in range(n):
        iss = plan.add(OpKind.ISSUE, Stream.HOST, -1, f"issue {kind}{i}", tag=op_kind.value,
                       shape=shape if op_kind is OpKind.ATTN else (), split=i)
        op = plan.add(op_kind, Stream.COMPUTE, 0, f"probe.{kind}.{i % 4}", (iss,), nbytes=nbytes, shape=shape,
                      split=i, pinned=True)
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


def measure(hw, *, n: int = 40, cp=None) -> dict[str, float]:
    """Launch cost (seconds) per probe kind on the executor, given the profile ``hw``, and
    the executor's host work of building expert runs: ``host_work`` (seconds per op) and
    ``host_work_per_id`` (seconds per router id), a line through :data:`HOST_WORK_IDS`."""
    from sim.costs import plan_durations  # noqa: PLC0415
    from sim.engines import analytic  # noqa: PLC0415

    from .executor import execute  # noqa: PLC0415

    out = {}
    base = replace(hw, executor_mode=True, executor_op_issue_s=1e-12, executor_issue_s_by_kind={},
                   attn_table=None if hw.attn_table is None else hw.attn_table.drop(columns=["t_host_s"],
                                                                                     errors="ignore"))
    for kind in PROBES:
        plan = lockstep_plan(kind, n)
        r = execute(plan, test="probe", variant=kind, warmup=1, repeats=3, probes=False, cp=cp)
        pred0 = float(analytic.run(plan, plan_durations(plan, base)).makespan_s)
        out[kind] = max((r.makespan_s - pred0) / n, 0.0)
    per_op = []
    for n_ids in HOST_WORK_IDS:
        r = execute(host_work_plan(n_ids, n), test="probe", variant="host_work", warmup=1, repeats=3, probes=False,
                    cp=cp)
        per_op.append(r.makespan_s / n)
    lo, hi = HOST_WORK_IDS
    slope = max((per_op[1] - per_op[0]) / (hi - lo), 0.0)
    out["host_work"] = max(per_op[0] - slope * lo, 0.0)
    out["host_work_per_id"] = slope
    return out


def update_profile(path: str | Path, costs: dict[str, float], device: str = "") -> Path:
    """Add (or replace) ``executor_issue_<kind>_us`` keys (and ``executor_host_work_us``,
    ``executor_host_work_ns_per_id``) in the ``[hardware]`` table of a profile TOML, atomically."""
    from sim.atomic import write_atomic  # noqa: PLC0415

    p = Path(path)
    lines = p.read_text().splitlines()
    replaced = tuple(f"executor_issue_{k}_us" for k in costs if not k.startswith("host_work"))
    if "host_work" in costs:
        replaced += ("executor_host_work_us", "executor_host_work_ns_per_id")
    lines = [ln for ln in lines if ln.split("=", 1)[0].strip() not in replaced]
    device = device.replace("\\", "\\\\").replace('"', '\\"')  # a TOML basic string
    at = next(i for i, ln in enumerate(lines) if ln.startswith("[measured]"))
    while at > 0 and not lines[at - 1].strip():
        at -= 1
    new = [f'executor_issue_{k}_us = {{ value = {v * 1e6:.6g}, source = "measured: the executor\'s host cost '
           f'per {k} op in lockstep (launch + op + sync) beyond the simulated op, python -m '
           f'calibrate.executor_costs{(" (" + device + ")") if device else ""}" }}' for k, v in costs.items()
           if not k.startswith("host_work")]
    dev = f" ({device})" if device else ""
    if "host_work" in costs:
        new.append(f'executor_host_work_us = {{ value = {costs["host_work"] * 1e6:.6g}, source = "measured: the '
                   f'executor\'s host time per op building used-expert runs (numpy), intercept of a line through '
                   f'{HOST_WORK_IDS[0]} and {HOST_WORK_IDS[1]} router ids, python -m calibrate.executor_costs{dev}" }}')
        new.append(f'executor_host_work_ns_per_id = {{ value = {costs["host_work_per_id"] * 1e9:.6g}, source = '
                   f'"measured: slope of the same line, per router id, python -m calibrate.executor_costs{dev}" }}')
    lines[at:at] = new
    return write_atomic(p, "\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    from sim.errors import PrefetchSimError  # noqa: PLC0415
    from sim.specs import load_hardware  # noqa: PLC0415

    ap = argparse.ArgumentParser(prog="python -m calibrate.executor_costs", description=__doc__.split("\n")[0])
    ap.add_argument("--profile", required=True, help="profile TOML to measure with and update")
    ap.add_argument("-n", type=int, default=40, help="ops per probe plan")
    args = ap.parse_args(argv)
    try:
        hw = load_hardware(args.profile)
        costs = measure(hw, n=args.n)
        update_profile(args.profile, costs, hw.gpu_name)
    except PrefetchSimError as exc:
        print(f"calibrate.executor_costs: error: {exc}", file=sys.stderr)
        return 2
    for k, v in costs.items():
        if k == "host_work_per_id":
            print(f"executor host work per router id: {v * 1e9:8.2f} ns")
        else:
            print(f"executor {'launch cost ' + k if not k.startswith('host') else 'host work per op'}: "
                  f"{v * 1e6:8.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
