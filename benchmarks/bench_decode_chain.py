"""Is the decode bias in the validation plans, or in the time between calibration and run?

Validation has predicted the batch-1 decode cases (``tg8``) 10–40% too fast from the profile,
and still 5–20% too fast with the executor's costs measured during the run, while the
calibration's own decode-shaped loop probe (``calibrate.executor_costs.loop_plan``) came out
only 1–10% too fast. This script runs, interleaved in one process and so in the same host
state, the calibration's loop probe and the validation grid's decode cases, ``ROUNDS`` times,
and splits each measured makespan (the median of ``repeats`` timed runs) into

* the CPU matvecs' measured host time, against their predicted time, and
* everything else (launches, host syncs, GPU work, the executor's own gaps between ops) per
  launch (ISSUE op), against its prediction,

both priced with the profile given (default: the shipped one) with its busy-host scale set to 1
(the loop's own costs, as in the committed run, whose profile had none). A plan whose "everything else"
per launch is off by much more than the loop probe's in the same rounds has a structural
cause; equal offsets point at the host's state.

Prints one row per execution and the median per plan, and writes ``$OUT/decode_chain.csv`` (or
``out/decode_chain.csv`` in the checkout, a folder git ignores).

    PYTHONPATH=. python benchmarks/bench_decode_chain.py [ROUNDS] [PROFILE]     # on a GPU
    FAKE_GPU=1 PYTHONPATH=. python benchmarks/bench_decode_chain.py 1            # on a CPU: minutes
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from calibrate import executor_costs as EC  # noqa: E402
from sim.model.costs import plan_durations  # noqa: E402
from sim.engines import analytic  # noqa: E402
from sim.plan import OpKind  # noqa: E402
from sim.model.specs import load_hardware  # noqa: E402
from sim.views.validation import build_case, default_grid, executor_profile  # noqa: E402

DEFAULT_PROFILE = ROOT / "scenarios" / "hardware" / "h200.toml"
CASES = ("moe-pinned-tg8-d0-baseline", "moe-pinned-tg8-d0-cache_lru-c256", "dense-pinned-tg8-d0-baseline")


def split(plan, dur_s: np.ndarray, makespan_s: float, cpu_s: float | None = None) -> dict:
    """Makespan split into the CPU matvecs (measured host time when given, else ``dur_s``) and
    the rest, per launch."""
    is_cpu = np.array([op.kind is OpKind.CPU_MATVEC for op in plan.ops])
    n_issue = sum(op.kind is OpKind.ISSUE for op in plan.ops)
    cpu = float(np.sum(dur_s[is_cpu])) if cpu_s is None else cpu_s
    return {"cpu_s": cpu, "rest_s": makespan_s - cpu, "n_issue": n_issue, "n_cpu": int(is_cpu.sum())}


def main(argv: list[str]) -> None:
    from calibrate.executor import execute  # noqa: PLC0415 - needs CuPy

    rounds = int(argv[0]) if argv else 6
    profile = Path(argv[1]) if len(argv) > 1 else DEFAULT_PROFILE
    cp = None
    if os.environ.get("FAKE_GPU"):  # a numpy stand-in: checks the script on a CPU (numbers meaningless)
        from calibrate import _fakecupy as cp  # noqa: PLC0415
    # the busy-host scale off: the diagnostic compares the loop's own costs with the plans
    hw = replace(executor_profile(load_hardware(profile)), executor_busy_scale=1.0)
    grid = {c.name: c for c in default_grid()}
    plans = {"loop8": EC.loop_plan(8 * 2**20, 24), "loop64": EC.loop_plan(64 * 2**20, 24)}
    for name in CASES:
        plans[name] = build_case(grid[name], hw)[1]
    pred = {}
    for name, plan in plans.items():
        d = plan_durations(plan, hw)
        mk = float(analytic.run(plan, d).makespan_s)
        sp = split(plan, d, mk)
        pred[name] = {"pred_s": mk, "pred_cpu_s": sp["cpu_s"], "pred_rest_s": sp["rest_s"]}
    t0 = time.perf_counter()
    rows = []
    for r in range(rounds):
        for name, plan in plans.items():
            res = execute(plan, test="diag", variant=name, warmup=1, repeats=3, probes=False, gc_off=True, cp=cp)
            is_cpu = [op.id for op in plan.ops if op.kind is OpKind.CPU_MATVEC]
            cpu_meas = float(np.nansum(np.asarray(res.host_op_s)[is_cpu]))
            m = split(plan, np.zeros(len(plan.ops)), res.makespan_s, cpu_meas)
            p = pred[name]
            rows.append({
                "t_s": round(time.perf_counter() - t0, 2), "round": r, "plan": name,
                "measured_ms": res.makespan_s * 1e3, "predicted_ms": p["pred_s"] * 1e3,
                "rel_error": p["pred_s"] / res.makespan_s - 1.0,
                "cpu_meas_ms": m["cpu_s"] * 1e3, "cpu_pred_ms": p["pred_cpu_s"] * 1e3,
                "cpu_rel_error": p["pred_cpu_s"] / m["cpu_s"] - 1.0 if m["cpu_s"] > 0 else float("nan"),
                "rest_meas_us_per_launch": m["rest_s"] / m["n_issue"] * 1e6,
                "rest_pred_us_per_launch": p["pred_rest_s"] / m["n_issue"] * 1e6,
                "n_issue": m["n_issue"], "n_cpu": m["n_cpu"]})
            print(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in rows[-1].items()),
                  flush=True)
    df = pd.DataFrame(rows)
    df["rest_extra_us_per_launch"] = df.rest_meas_us_per_launch - df.rest_pred_us_per_launch
    out = Path(os.environ.get("OUT", ROOT / "out")) / "decode_chain.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(out, index=False)
    cols = ["rel_error", "cpu_rel_error", "rest_meas_us_per_launch", "rest_pred_us_per_launch",
            "rest_extra_us_per_launch"]
    print(f"\nprofile {profile}; {rounds} rounds; medians per plan -> {out}")
    print(df.groupby("plan", sort=False)[cols].median().round(3).to_string())


if __name__ == "__main__":
    from sim.errors import GPUUnavailableError

    try:
        main(sys.argv[1:])
    except GPUUnavailableError as exc:
        print(f"bench_decode_chain: {exc}", file=sys.stderr)
        sys.exit(2)
