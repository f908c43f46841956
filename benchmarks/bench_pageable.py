"""What sets the speed of a pageable H2D copy on this host, and how fast does it change?

Validation's pageable cases measure 20–80% apart from pass to pass on the lent H200 VM, and the
calibration's 1 MiB…1 GiB sweep shows steps between two or three levels (e.g. 7.0 and 8.8 GB/s)
that last a few seconds. A CUDA pageable copy is staged by the calling host thread through the
driver's pinned bounce buffers, so its speed can hang on (a) where the source pages lie in host
memory, (b) which CPU the calling thread runs on, (c) whether the source is backed by transparent
huge pages, or (d) the host's state at that moment (other tenants, the hypervisor). This script
separates them, on one GPU, in about two minutes:

* ``region``: a 1 GiB numpy buffer cut into 16 windows of 64 MiB, each copied twice per cycle,
  ``CYCLES`` cycles. A window that is slow in every cycle points at (a); cycles that are slow in
  every window point at (d).
* ``memcpy``: in the same cycles, a host ``numpy.copyto`` of each window into pinned memory
  (what the driver's staging does), to see whether the copy follows the host's memcpy speed.
  It runs right before the window's H2D copies and leaves part of the window in the CPU caches
  (300 MiB of L3 on the lent H200 VM), so the two speeds are comparable in how they move, not
  in level (the copies ran faster than the memcpy there).
* ``affinity``: the calling thread pinned to single CPUs in turn (b), the same window each time.
* ``thp``: two 256 MiB anonymous mappings, ``MADV_HUGEPAGE`` and ``MADV_NOHUGEPAGE`` (c),
  alternated.
* ``series``: one window copied back to back for ``SERIES_S`` seconds: how long a level lasts.

Writes ``pageable_diag.csv`` and ``pageable_facts.txt`` to ``$OUT`` (or ``out/`` in the checkout, which git
ignores) and prints a short
table per part last.

    PYTHONPATH=. python benchmarks/bench_pageable.py [CYCLES] [SERIES_S]     # on a GPU
    FAKE_GPU=1 PYTHONPATH=. python benchmarks/bench_pageable.py 1 1          # on a CPU (numbers meaningless)
"""
from __future__ import annotations

import mmap
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from calibrate import measure as M  # noqa: E402
from calibrate._gpu import require_cupy  # noqa: E402
from sim.errors import GPUUnavailableError  # noqa: E402

MiB = 2**20
WIN = 64 * MiB


def _facts() -> str:
    """THP and NUMA-balancing settings, a few /proc/meminfo lines and ``nvidia-smi topo -m``, as
    text (a line saying why where one cannot be read)."""
    lines = []
    for p in ("/sys/kernel/mm/transparent_hugepage/enabled", "/sys/kernel/mm/transparent_hugepage/defrag",
              "/proc/sys/kernel/numa_balancing"):
        try:
            lines.append(f"{p}: {Path(p).read_text().strip()}")
        except OSError as e:
            lines.append(f"{p}: ({e})")
    try:
        mi = Path("/proc/meminfo").read_text().splitlines()
        lines += [ln for ln in mi if ln.split(":")[0] in ("MemTotal", "MemFree", "AnonHugePages", "HugePages_Total",
                                                         "Hugepagesize", "Cached")]
    except OSError:
        pass
    for cmd in (["nvidia-smi", "topo", "-m"], ["nvidia-smi", "-q", "-d", "PCIE"]):
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False).stdout
            lines.append("$ " + " ".join(cmd))
            lines += out.strip().splitlines()[:40]
        except (OSError, subprocess.SubprocessError) as e:
            lines.append(f"$ {' '.join(cmd)}: ({e})")
    return "\n".join(lines)


def _anon_huge_kb(addr: int) -> int:
    """AnonHugePages (KiB) of the mapping that holds ``addr``, from /proc/self/smaps."""
    try:
        text = Path("/proc/self/smaps").read_text()
    except OSError:
        return -1
    cur = None
    for ln in text.splitlines():
        head = ln.split()[0] if ln else ""
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            cur = lo <= addr < hi
        elif cur and ln.startswith("AnonHugePages:"):
            return int(ln.split()[1])
    return -1


def _cpu_now() -> int:
    """The CPU this thread last ran on (field 39 of /proc/thread-self/stat), -1 if unknown."""
    try:
        text = Path("/proc/thread-self/stat").read_text()
        return int(text.rsplit(")", 1)[1].split()[36])
    except (OSError, ValueError, IndexError):
        return -1


def main() -> int:
    """Run the four parts, write the CSV and facts to ``$OUT`` (or ``out/`` in the checkout) and print the tables.
    Returns the exit status (2 with a one-line message for bad arguments)."""
    try:
        cycles = int(sys.argv[1]) if len(sys.argv) > 1 else 4
        series_s = float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
        if cycles < 1 or not series_s > 0:
            raise ValueError
    except ValueError:
        print("bench_pageable: CYCLES must be an integer >= 1 and SERIES_S a number of seconds > 0", file=sys.stderr)
        return 2
    out = Path(os.environ.get("OUT", ROOT / "out"))
    out.mkdir(parents=True, exist_ok=True)
    if os.environ.get("FAKE_GPU"):  # a numpy stand-in: checks the script on a CPU (numbers meaningless)
        from calibrate import _fakecupy as cp  # noqa: PLC0415
    else:
        try:
            cp = require_cupy()
        except GPUUnavailableError as exc:
            print(f"bench_pageable: {exc}", file=sys.stderr)
            return 2
    g = M.open_gpu(cp)
    (out / "pageable_facts.txt").write_text(_facts() + "\n")
    dev = cp.empty(WIN, dtype=cp.uint8)
    dptr = int(dev.data.ptr)
    buf = np.empty(16 * WIN, dtype=np.uint8)
    buf.view(np.uint32)[:] = np.arange(buf.size // 4, dtype=np.uint32) * np.uint32(2654435761)
    pinned = M.alloc_pinned(g, WIN)
    src0 = M._ptr_host(buf)
    t_start = time.perf_counter()

    def h2d(ptr: int, reps: int = 1) -> list[float]:
        d, _ = M.copy_series(g, dptr, ptr, WIN, M.H2D, reps, spin=False, warmup=0)
        return [WIN / float(x) / 1e9 for x in d]

    rows = []
    for c in range(cycles):
        for r in range(16):
            src = buf[r * WIN:(r + 1) * WIN]
            t0 = time.perf_counter()
            np.copyto(pinned, src)
            mc = WIN / (time.perf_counter() - t0) / 1e9
            for bw in h2d(src0 + r * WIN, 2):
                rows.append({"part": "region", "cycle": c, "region": r, "t_s": time.perf_counter() - t_start,
                             "h2d_gb_per_s": bw, "memcpy_gb_per_s": mc})
    # affinity: single CPUs in turn, same window
    orig = os.sched_getaffinity(0)
    cpus = sorted(orig)
    try:
        for c in range(cycles):
            for cpu in (cpus if c % 2 == 0 else cpus[::-1]):
                os.sched_setaffinity(0, {cpu})
                t0 = time.perf_counter()
                np.copyto(pinned, buf[:WIN])
                mc = WIN / (time.perf_counter() - t0) / 1e9
                for bw in h2d(src0 + WIN, 2):
                    rows.append({"part": "affinity", "cycle": c, "cpu": cpu, "t_s": time.perf_counter() - t_start,
                                 "h2d_gb_per_s": bw, "memcpy_gb_per_s": mc})
        aff = pd.DataFrame([r for r in rows if r["part"] == "affinity"]).groupby("cpu").h2d_gb_per_s.median()
        # a series pinned to the fastest and to the slowest CPU of that table, then unpinned
        for label, cpu in (("pinned_fast", int(aff.idxmax())), ("pinned_slow", int(aff.idxmin()))):
            os.sched_setaffinity(0, {cpu})
            t_end = time.perf_counter() + series_s / 2
            i = 0
            while time.perf_counter() < t_end:
                bw = h2d(src0 + (i % 2) * WIN)[0]
                rows.append({"part": label, "cycle": i, "cpu": cpu, "t_s": time.perf_counter() - t_start,
                             "h2d_gb_per_s": bw})
                i += 1
    finally:
        os.sched_setaffinity(0, orig)
    # transparent huge pages on and off
    maps = {}
    for name, adv in (("huge", mmap.MADV_HUGEPAGE), ("nohuge", mmap.MADV_NOHUGEPAGE)):
        m = mmap.mmap(-1, 4 * WIN)
        m.madvise(adv)
        a = np.frombuffer(m, dtype=np.uint8)
        a.view(np.uint32)[:] = 7
        maps[name] = (m, a)
    huge_kb = {k: _anon_huge_kb(M._ptr_host(a)) for k, (_m, a) in maps.items()}
    for c in range(6):
        for name, (_m, a) in maps.items():
            for bw in h2d(M._ptr_host(a) + (c % 4) * WIN, 2):
                rows.append({"part": "thp", "cycle": c, "mapping": name, "t_s": time.perf_counter() - t_start,
                             "h2d_gb_per_s": bw, "anon_huge_kb": huge_kb[name]})
    # a series of one window
    t_end = time.perf_counter() + series_s
    i = 0
    while time.perf_counter() < t_end:
        bw = h2d(src0 + (i % 2) * WIN)[0]
        rows.append({"part": "series", "cycle": i, "cpu": _cpu_now(), "t_s": time.perf_counter() - t_start,
                     "h2d_gb_per_s": bw})
        i += 1
    df = pd.DataFrame(rows)
    df.to_csv(out / "pageable_diag.csv", index=False)

    pd.set_option("display.width", 200)
    reg = df[df.part == "region"]
    tab = reg.groupby(["region", "cycle"]).h2d_gb_per_s.median().unstack()
    print("H2D GB/s of 64 MiB windows (rows) by cycle (columns):")
    print(tab.round(2).to_string())
    by_cycle = reg.groupby("cycle").h2d_gb_per_s
    by_region = reg.groupby("region").h2d_gb_per_s
    print(f"spread of cycle medians {by_cycle.median().min():.2f}..{by_cycle.median().max():.2f}; "
          f"of region medians {by_region.median().min():.2f}..{by_region.median().max():.2f}")
    r = np.corrcoef(reg.h2d_gb_per_s, reg.memcpy_gb_per_s)[0, 1]
    print(f"host memcpy GB/s median {reg.memcpy_gb_per_s.median():.2f} "
          f"(p10 {reg.memcpy_gb_per_s.quantile(.1):.2f}, p90 {reg.memcpy_gb_per_s.quantile(.9):.2f}); "
          f"correlation with H2D {r:+.2f}")
    aff = df[df.part == "affinity"].groupby(["cpu", "cycle"]).h2d_gb_per_s.median().unstack()
    print("\nH2D GB/s with the thread on one CPU (rows) by cycle:")
    print(aff.round(2).to_string())
    for label in ("pinned_fast", "pinned_slow"):
        x = df[df.part == label]
        if len(x):
            print(f"{label} (CPU {int(x.cpu.iloc[0])}): {len(x)} copies, p10 {x.h2d_gb_per_s.quantile(.1):.2f} "
                  f"p50 {x.h2d_gb_per_s.median():.2f} p90 {x.h2d_gb_per_s.quantile(.9):.2f} GB/s")
    thp = df[df.part == "thp"].groupby(["mapping", "cycle"]).h2d_gb_per_s.median().unstack()
    print(f"\nH2D GB/s from THP mappings (AnonHugePages KiB: {huge_kb}):")
    print(thp.round(2).to_string())
    ser = df[df.part == "series"].reset_index(drop=True)
    v = ser.h2d_gb_per_s.to_numpy()
    lo, hi = np.quantile(v, [0.1, 0.9])
    level = v > (lo + hi) / 2
    runs = np.diff(np.flatnonzero(np.diff(np.r_[-1, level.astype(int), -1]) != 0))
    dt = float(np.median(np.diff(ser.t_s))) if len(ser) > 1 else float("nan")
    print(f"\nseries: {len(v)} copies over {series_s:.0f} s, p10 {lo:.2f} p50 {np.median(v):.2f} p90 {hi:.2f} GB/s; "
          f"runs above/below the midpoint: median {np.median(runs):.0f} copies, max {runs.max()} "
          f"({dt * 1e3:.1f} ms per copy)")
    by_cpu = ser.groupby("cpu").h2d_gb_per_s.agg(["size", "median"])
    print("series by the CPU the thread ran on:", "; ".join(f"{int(c)}: {int(r['size'])} x {r['median']:.2f}"
                                                           for c, r in by_cpu.iterrows()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
