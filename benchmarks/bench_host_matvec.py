"""Host matvec speed by matrix shape and size: what the CPU backend's ops cost on this host.

The executor runs CPU-backend ops as numpy float32 matvecs on cold windows of host memory
(``calibrate.executor``); calibration prices them with a line through 8 and 64 MiB windows of
2048 columns (``calibrate.measure.measure_host_series``). This benchmark times cold windows of
several sizes and column counts (the shapes of the validation models' expert and FFN tensors)
with the BLAS threads awake, and prints the median time and bandwidth of each, so the
shape-dependence of that price can be seen.

    python benchmarks/bench_host_matvec.py [--pool-mib 2048] [--reps 15]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from time import perf_counter as perf

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import int_at_least  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pool-mib", type=int_at_least(256), default=2048,
                    help="matrix pool, MiB, >= 256 (cold windows rotate through it)")
    ap.add_argument("--reps", type=int_at_least(1), default=15, help="timed matvecs per shape")
    args = ap.parse_args()
    pool = np.empty(args.pool_mib * 2**20 // 4, dtype=np.float32)
    pool[:] = 0.25
    rows = []
    for o in range(0, pool.size - 2**24, 2**24):  # untimed: first touches, BLAS threads
        pool[o: o + 2**24].reshape(-1, 2048) @ np.ones(2048, dtype=np.float32)
    for k in (768, 2048, 5376, 21504):
        x = np.linspace(-1, 1, k, dtype=np.float32)
        wake = np.full((max(1, 2**20 // k), k), 0.5, dtype=np.float32)  # 4 MiB: BLAS uses all threads
        for mib in (2, 8, 32, 64, 128):
            r = mib * 2**20 // 4 // k
            n_win = max(1, pool.size // (r * k))
            ts = []
            for i in range(args.reps):
                o = (i % n_win) * r * k
                a = pool[o: o + r * k].reshape(r, k)
                wake @ x
                t0 = perf()
                a @ x
                ts.append(perf() - t0)
            t = float(np.median(ts))
            rows.append(dict(k=k, mib=mib, t_us=round(t * 1e6, 1), gb_per_s=round(r * k * 4 / t / 1e9, 1),
                             p10_gb_per_s=round(r * k * 4 / float(np.quantile(ts, 0.9)) / 1e9, 1),
                             p90_gb_per_s=round(r * k * 4 / float(np.quantile(ts, 0.1)) / 1e9, 1)))
    df = pd.DataFrame(rows)
    for k, g in df.groupby("k"):
        t = g.t_us.to_numpy() * 1e-6
        b = g.mib.to_numpy() * 2**20
        slope, icpt = np.polyfit(b, t, 1)
        df.loc[g.index, "line_gb_per_s"] = round(1 / slope / 1e9, 1)
        df.loc[g.index, "line_icpt_us"] = round(icpt * 1e6, 1)
    print(df.to_string(index=False))


if __name__ == "__main__":
    main()
