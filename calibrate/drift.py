"""Host-state probes: how fast the host-dependent paths are *right now*.

Pageable H2D copies (a host memcpy into the CUDA driver's staging buffers), the CPU backend's
matvec (host DRAM bandwidth) and a Python-issued kernel launch all depend on the host, and on
a shared or virtualised host they drift while a calibration or validation runs. A probe takes
about 0.1–0.3 s and measures each once (median of a few repeats), so that a validation can log
the host's state next to its measurements and a separate run can chart the drift over time.

The headline predictions of ``prefetch-sim validate`` (``predicted_s``) come from one hardware
profile for the whole grid; only its host-conditioned diagnostic (``predicted_host_s``,
``--host-state per-pass``) uses the median pageable bandwidth of these probes over the run.

``python -m calibrate.drift --seconds 60 --out drift.csv`` samples the probes for a minute
(one row per probe) and prints the spread of each column.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass
from time import perf_counter as perf
from typing import Any

import numpy as np

#: CSV columns of a probe series (SI units in the names)
PROBE_COLUMNS = ("t_s", "label", "h2d_pinned_gb_per_s", "h2d_pageable_gb_per_s", "cpu_matvec_gb_per_s",
                 "launch_us")


@dataclass(frozen=True)
class HostProbe:
    """One probe of the host-dependent paths.

    Attributes:
        t_s: seconds since the prober was created (host clock).
        label: what ran just before (free text, e.g. ``pass 1 start``).
        h2d_pinned_gb_per_s: 64 MiB pinned ``cudaMemcpyAsync``, device time, GB/s (10⁹ B/s).
        h2d_pageable_gb_per_s: 64 MiB pageable copy (its source moving through 256 MiB), device
            time, GB/s.
        cpu_matvec_gb_per_s: numpy float32 matvec over a 256 MiB matrix, GB/s of matrix read.
        launch_us: host time of one empty RawKernel launch from Python, µs (median of 200).
    """

    t_s: float
    label: str
    h2d_pinned_gb_per_s: float
    h2d_pageable_gb_per_s: float
    cpu_matvec_gb_per_s: float
    launch_us: float


class HostProber:
    """Buffers for repeated :class:`HostProbe` s (allocated once: 256 MiB pinned, 256 MiB
    pageable and 256 MiB device memory, a 256 MiB host matrix).

    Args:
        g: an opened GPU (:func:`calibrate.measure.open_gpu`).
        copy_bytes: bytes per probe copy.
        matvec_bytes: bytes of the probe matrix.
    """

    def __init__(self, g: Any, *, copy_bytes: int = 64 * 2**20, matvec_bytes: int = 256 * 2**20):
        from . import measure as M  # noqa: PLC0415

        self.g = g
        self.M = M
        self.copy_bytes = int(copy_bytes)
        self.bufs = M.alloc_copy_buffers(g, 4 * self.copy_bytes)
        cols = 4096
        self.a = np.full((max(1, matvec_bytes // 4 // cols), cols), 0.25, dtype=np.float32)
        self.x = np.linspace(-1.0, 1.0, cols, dtype=np.float32)
        self.t0 = perf()
        self.a @ self.x  # page faults, BLAS threads

    def probe(self, label: str = "", reps: int = 3) -> HostProbe:
        """Measure once (median of ``reps`` for copies and matvec)."""
        M, g, b = self.M, self.g, self.bufs
        nb = self.copy_bytes
        dev = int(b.device.data.ptr)
        pin, _ = M.copy_series(g, dev, M._ptr_host(b.pinned), nb, M.H2D, reps, spin=True, warmup=1)
        # the pageable source moves through its buffer (not in the CPU caches, as in calibration)
        page, _ = M.copy_series(g, dev, M._ptr_host(b.pageable), nb, M.H2D, reps, spin=False, warmup=1,
                                host_span=self.bufs.nbytes)
        tm = M._host_samples(lambda: self.a @ self.x, reps)
        g.stream.synchronize()
        noop = g.noop
        with g.stream:
            tl = M._host_samples(lambda: noop((1,), (1,), ()), 200)
        g.stream.synchronize()
        return HostProbe(t_s=perf() - self.t0, label=label,
                         h2d_pinned_gb_per_s=nb / float(np.median(pin)) / 1e9,
                         h2d_pageable_gb_per_s=nb / float(np.median(page)) / 1e9,
                         cpu_matvec_gb_per_s=self.a.nbytes / float(np.median(tm)) / 1e9,
                         launch_us=float(np.median(tl)) * 1e6)


def probes_frame(probes: list[HostProbe]):
    """A pandas DataFrame with :data:`PROBE_COLUMNS`, one row per probe."""
    import pandas as pd  # noqa: PLC0415

    return pd.DataFrame([asdict(p) for p in probes], columns=list(PROBE_COLUMNS))


def spread_table(df) -> str:
    """Median, min, max and (max/min − 1) of each probe column, as text."""
    rows = []
    for c in PROBE_COLUMNS[2:]:
        v = df[c].to_numpy(float)
        if not v.size:
            continue
        ratio = f"{v.max() / v.min() - 1:6.1%}" if v.min() > 0 else "   n/a"
        rows.append(f"{c:24s} median {np.median(v):9.3f}  min {v.min():9.3f}  max {v.max():9.3f}  "
                    f"max/min-1 {ratio}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibrate.drift",
                                 description="sample the host-dependent paths over time")
    ap.add_argument("--seconds", type=float, default=60.0, help="how long to sample (default 60)")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between probes (default 1)")
    ap.add_argument("--out", help="CSV to write (one row per probe)")
    args = ap.parse_args(argv)
    import math

    if not (math.isfinite(args.seconds) and args.seconds > 0):
        print(f"calibrate.drift: error: --seconds must be a positive number, got {args.seconds}", file=sys.stderr)
        return 2
    if not (math.isfinite(args.interval) and args.interval >= 0):
        print(f"calibrate.drift: error: --interval must be >= 0, got {args.interval}", file=sys.stderr)
        return 2
    from sim.atomic import check_output_path, write_atomic  # noqa: PLC0415
    from sim.errors import PrefetchSimError  # noqa: PLC0415

    from ._gpu import require_cupy  # noqa: PLC0415
    from .measure import open_gpu  # noqa: PLC0415

    try:
        if args.out:
            check_output_path(args.out, "--out")
        cp = require_cupy()
    except PrefetchSimError as exc:
        print(f"calibrate.drift: error: {exc}", file=sys.stderr)
        return 2
    prober = HostProber(open_gpu(cp))
    probes = []
    end = time.monotonic() + args.seconds
    while True:  # at least one probe
        probes.append(prober.probe(f"sample {len(probes)}"))
        if time.monotonic() >= end:
            break
        time.sleep(max(0.0, args.interval - 0.2))
    df = probes_frame(probes)
    if args.out:
        write_atomic(args.out, df.to_csv(index=False))
    print(spread_table(df))
    return 0


if __name__ == "__main__":
    from sim.cli.interrupt import run_interruptible

    sys.exit(run_interruptible("calibrate.drift", main))  # Ctrl-C / SIGTERM: one line, 130 / 143
