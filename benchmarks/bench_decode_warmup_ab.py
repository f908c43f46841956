"""Decode cases of the validation grid with one warm-up run (``w1``) vs warm-up runs for at least
0.5 s (``w05``, ``execute(warmup_s=0.5)``), alternating, ``PASSES`` times (default 3): does a
short plan's timed run suffer from starting right after the setup of its host buffers? On the
lent H200 (``data/validation/history/diag/ab.json``) it did not (differences of either sign,
within the noise), so ``validate`` keeps one warm-up run.

    PYTHONPATH=. PASSES=3 python benchmarks/bench_decode_warmup_ab.py [fake]
"""
import os, sys, json
import numpy as np
sys.path.insert(0, ".")
from sim.model.specs import load_hardware
from sim.views.validation import default_grid, build_case, executor_profile
from calibrate.executor import execute
from sim.plan import OpKind
CP = None
if len(sys.argv) > 1 and sys.argv[1] == "fake":
    import calibrate._fakecupy as CP
hw = executor_profile(load_hardware("scenarios/hardware/h200.toml"))
cases = {c.name: c for c in default_grid()}
order = ["moe-pinned-tg8-d0-baseline", "dense-pinned-tg8-d0-baseline", "moe-pinned-tg8-d0-prefetch_ungated",
         "dense-pinned-tg8-d0-prefetch_ungated", "moe-pinned-tg8-d0-cache_lru-c256"]
rows = []
passes = int(os.environ.get("PASSES", "3"))
for p in range(passes):
    for mode in ("w1", "w05"):
        for name in (order if p % 2 == 0 else order[::-1]):
            _, plan = build_case(cases[name], hw)
            r = execute(plan, warmup=1, warmup_s=0.5 if mode == "w05" else 0.0, repeats=3, probes=False, cp=CP)
            ids = [o.id for o in plan.ops if o.kind is OpKind.CPU_MATVEC]
            rows.append(dict(p=p, mode=mode, case=name, ms=r.makespan_s * 1e3,
                             cpu_us=float(np.nanmedian(r.host_op_s[ids])) * 1e6))
            print(rows[-1], flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "ab.json"), "w"))
import pandas as pd
d = pd.DataFrame(rows)
print(d.groupby(["case", "mode"])[["ms", "cpu_us"]].median().round(2).to_string())
