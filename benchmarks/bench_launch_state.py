"""Does the executor's launch cost depend on the state of the process it runs in?

In validation runs 15–17 the executor's lockstep launch costs measured at the start of each
validation pass (``<name>_executor_costs.csv``) came out 1.5–2× those the calibration measured a
minute before in its own process (GEMM 9.2–9.6 µs in the profiles, 16–18 µs as the passes'
median). This script measures the same lockstep costs (``calibrate.executor_costs.measure``,
``busy=False``) in one process, in the states a validation process passes through:

* ``fresh``: nothing but the profile loaded;
* ``plans``: after building every case of the default validation grid and predicting it, as
  ``prefetch-sim validate`` does before its first pass (the plans kept alive);
* ``plans+gc_off`` / ``plans+frozen``: the same with the cyclic garbage collector disabled
  while measuring, or with the plans moved out of its reach (``gc.freeze``);
* ``ran``: after executing the heaviest cases of the grid once (their results kept, CuPy's
  memory pools holding what they freed);
* ``new_process``: the same measurement in a new Python process (as a calibration starts),
  alternated with the states above;
* ``ran+gc_off``, ``ran+pools_freed`` (``free_all_blocks`` of the device and pinned pools),
  ``dropped`` (plans and results released, ``gc.collect``).

A ``+gc_off`` state has the collector off for the whole measurement and ``execute(gc_off=True)``;
every other state keeps it on (``gc_off=False``). The committed data
(``data/validation/history/diag/launch_state.csv``) was recorded before ``execute`` had a
``gc_off`` switch, i.e. with the collector on in every timed run except where the state says.

States that can be toggled are measured alternately, so that the host's drift from minute to
minute does not pass for an effect. Prints one row per measurement (µs per launch) and writes
``$OUT/launch_state.csv`` (or ``./launch_state.csv``).

    PYTHONPATH=. python benchmarks/bench_launch_state.py          # on a GPU
    PYTHONPATH=. python benchmarks/bench_launch_state.py fake     # numpy stand-in (numbers mean nothing)
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from calibrate import executor_costs as EC  # noqa: E402
from sim.views import validation as V  # noqa: E402
from sim.model.specs import load_hardware  # noqa: E402

FAKE = len(sys.argv) > 1 and sys.argv[1] == "fake"
if FAKE:
    import calibrate._fakecupy as CP
else:
    CP = None
N = 8 if FAKE else 40
HW = load_hardware(Path(__file__).resolve().parent.parent / "scenarios" / "hardware" / "h200.toml")
T0 = time.perf_counter()
rows: list[dict] = []


def probe(state: str, gc_off: bool = False) -> None:
    """One lockstep measurement (µs per launch per kind, host work per op) in ``state``."""
    was = gc.isenabled()
    if gc_off:
        gc.disable()
    try:
        c = EC.measure(HW, n=N, cp=CP, busy=False, gc_off=gc_off)
    finally:
        if was:
            gc.enable()
    row = {"t_s": round(time.perf_counter() - T0, 1), "state": state + ("+gc_off" if gc_off and "gc_off" not in state else ""),
           **{k: round(c[k] * 1e6, 2) for k in EC.PROBES}, "host_work": round(c["host_work"] * 1e6, 2),
           "gc_tracked": len(gc.get_objects()), "gc_frozen": gc.get_freeze_count()}
    if not FAKE:
        import cupy as cp

        row["pool_mib"] = round(cp.get_default_memory_pool().total_bytes() / 2**20)
        row["pinned_pool_mib"] = round(cp.get_default_pinned_memory_pool().total_bytes() / 2**20) \
            if hasattr(cp.get_default_pinned_memory_pool(), "total_bytes") else -1
    rows.append(row)
    print(row, flush=True)


CHILD = """
import json, sys
sys.path.insert(0, {root!r})
from calibrate import executor_costs as EC
from sim.model.specs import load_hardware
cp = None
if {fake!r}:
    import calibrate._fakecupy as cp
c = EC.measure(load_hardware({hw!r}), n={n}, cp=cp, busy=False, gc_off=False)
print(json.dumps({{k: c[k] for k in (*EC.PROBES, "host_work")}}))
"""


def probe_child() -> None:
    """The same measurement in a new Python process (the state a calibration starts from)."""
    root = Path(__file__).resolve().parent.parent
    code = CHILD.format(root=str(root), fake=FAKE, hw=str(root / "scenarios" / "hardware" / "h200.toml"), n=N)
    t = time.perf_counter() - T0
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    c = json.loads(out.stdout.strip().splitlines()[-1])
    row = {"t_s": round(t, 1), "state": "new_process", **{k: round(v * 1e6, 2) for k, v in c.items()}}
    rows.append(row)
    print(row, flush=True)


probe("fresh")
probe_child()
probe("fresh", gc_off=True)
probe("fresh")

cases = V.default_grid()
built = []
for case in cases:
    scn, plan = V.build_case(case, HW)
    built.append((case, plan, V.predict_s(plan, HW)))
for _ in range(2):
    probe("plans")
    probe("plans+gc_off", gc_off=True)
gc.freeze()
probe("plans+frozen")
gc.unfreeze()
probe("plans")

# the heaviest cases (most ops) once each, as a pass would run them
heavy = sorted(built, key=lambda b: len(b[1].ops))[:2] if FAKE else sorted(built, key=lambda b: -len(b[1].ops))[:8]
results = []
for case, plan, _p in heavy:
    from calibrate.executor import execute

    results.append(execute(plan, test=case.test, variant=case.variant, repeats=1, warmup=1, cp=CP))
for _ in range(2):
    probe("ran")
    probe_child()
    probe("ran+gc_off", gc_off=True)
probe("ran")
probe_child()
if not FAKE:
    import cupy as cp

    cp.get_default_memory_pool().free_all_blocks()
    cp.get_default_pinned_memory_pool().free_all_blocks()
probe("ran+pools_freed")
del built, results, heavy
gc.collect()
probe("dropped")
probe("dropped", gc_off=True)

df = pd.DataFrame(rows)
out = Path(os.environ.get("OUT", ".")) / "launch_state.csv"
df.to_csv(out, index=False)
cols = ["state", *EC.PROBES, "host_work"]
print(df.groupby("state", sort=False)[cols[1:]].median().round(1).to_string())
