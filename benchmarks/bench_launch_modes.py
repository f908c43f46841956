"""Why do the executor's lockstep launch costs jump between a fast and a slow mode?

``bench_launch_state.py`` found the lockstep costs (``calibrate.executor_costs.measure``,
``busy=False``) flipping from one measurement to the next, a second apart and in any process
state, between about 8 µs and 14 µs per GEMM launch (attention 14 µs and 25 µs). This script
repeats that measurement in three conditions, interleaved, and records with each the GPU's SM
clock just before (``nvidia-smi``; not for ``gpu_warm``, whose GEMMs run right before), the CPU
the main thread was on before and after:

* ``plain``: as calibration and validation run it;
* ``gpu_warm``: right after ~0.1 s of large GEMMs (the GPU out of its idle clocks);
* ``one_core``: the main thread pinned to one CPU (``os.sched_setaffinity``).

Restoring the affinity does not move the thread back: in the committed run
(``data/validation/history/diag/launch_modes.csv``) it stayed on CPU 0 after the first pinned
measurement, so ``plain`` and ``one_core`` barely differ after round 0.

Prints one row per measurement and the median per condition, and writes
``$OUT/launch_modes.csv`` (or ``./launch_modes.csv``).

    PYTHONPATH=. python benchmarks/bench_launch_modes.py [ROUNDS]     # on a GPU
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from calibrate import executor_costs as EC  # noqa: E402
from sim.model.specs import load_hardware  # noqa: E402

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 12
HW = load_hardware(Path(__file__).resolve().parent.parent / "scenarios" / "hardware" / "h200.toml")


def cpu_now() -> int:
    """The CPU this process last ran on (field 39 of /proc/self/stat)."""
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])


def sm_clock_mhz() -> float:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=5)
        return float(out.stdout.strip().splitlines()[0])
    except Exception:  # noqa: BLE001 - a diagnostic: no clock is a missing column, not a failure
        return float("nan")


def main() -> None:
    import cupy as cp

    a = cp.ones((8192, 8192), dtype=cp.float16)
    all_cpus = os.sched_getaffinity(0)
    t0 = time.perf_counter()
    rows = []
    for r in range(ROUNDS):
        for cond in ("plain", "gpu_warm", "one_core"):
            try:
                if cond == "one_core":
                    os.sched_setaffinity(0, {min(all_cpus)})
                if cond == "gpu_warm":
                    for _ in range(60):
                        a @ a
                    cp.cuda.Device().synchronize()
                clk = sm_clock_mhz() if cond != "gpu_warm" else float("nan")
                c0 = cpu_now()
                c = EC.measure(HW, n=40, busy=False, gc_off=False)  # as recorded (before the gc switch)
                c1 = cpu_now()
            finally:
                if cond == "one_core":
                    os.sched_setaffinity(0, all_cpus)
            row = {"t_s": round(time.perf_counter() - t0, 2), "round": r, "cond": cond, "sm_mhz_before": clk,
                   "cpu_before": c0, "cpu_after": c1,
                   **{k: round(c[k] * 1e6, 2) for k in EC.PROBES}, "host_work": round(c["host_work"] * 1e6, 2)}
            rows.append(row)
            print(row, flush=True)
    df = pd.DataFrame(rows)
    df.to_csv(Path(os.environ.get("OUT", ".")) / "launch_modes.csv", index=False)
    print(df.groupby("cond")[[*EC.PROBES, "host_work"]].median().round(1).to_string())
    print(df.groupby("cond")[["gemm", "attn"]].agg(lambda s: f"{s.min():.1f}-{s.max():.1f}").to_string())


if __name__ == "__main__":
    main()
