"""Pinned and pageable H2D bandwidth of this machine, measured with CuPy in the same lease as
the llama-bench grid (for the routing check's time-implied bytes,
:mod:`calibrate.llamacpp.routing_check`).

``python -m calibrate.llamacpp.h2d_probe OUT.json``: copies of 64 MiB, 256 MiB and 1 GiB from
a 1 GiB host buffer (each copy at a new place, so none is served from the CPU caches;
:func:`calibrate.measure.measure_copies`), timed with CUDA events. ``pinned_bytes_per_s`` and
``pageable_bytes_per_s`` are the 1 GiB copies' bytes over their median time.

``mapped_bytes_per_s``: the same copies from a read-only file mapping (``np.memmap`` of a 1 GiB
file in the temporary folder, read once first so its pages are in the page cache, as llama.cpp's
``-lm mmap`` weights are after the warm-up run), synchronous ``cudaMemcpy`` timed on the host;
None with the reason in ``mapped_error`` when it cannot be measured. (llama.cpp copies a host weight
of a ``CPU_Mapped`` buffer into a GPU split this way; the pageable probe's freshly allocated
anonymous memory need not behave the same.)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def probe(out: str | Path) -> dict:
    """Measure and write ``out`` (JSON); returns the record.

    Raises:
        GPUUnavailableError: no CuPy or no GPU.
    """
    from calibrate._gpu import require_cupy
    from calibrate.measure import alloc_copy_buffers, measure_copies, open_gpu

    cp = require_cupy()
    g = open_gpu(cp)
    bufs = alloc_copy_buffers(g, 2**30)
    sizes = [64 * 2**20, 256 * 2**20, 2**30]
    rows = measure_copies(g, bufs, sizes, 0, budget_s=0.5)
    rec: dict = {"measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": g.info.get("device"),
                 "cuda_runtime_version": g.info.get("cuda_runtime_version"), "cupy_version": g.info.get("cupy_version"),
                 "method": __doc__.split("\n\n")[1].replace("\n", " "), "medians": []}
    for direction in ("h2d", "d2h"):
        for memory in ("pinned", "pageable"):
            for nb in sizes:
                t = [r["t_s"] for r in rows if r["direction"] == direction and r["memory"] == memory and r["nbytes"] == nb]
                if t:
                    rec["medians"].append({"direction": direction, "memory": memory, "nbytes": nb, "n": len(t),
                                           "median_s": float(np.median(t)), "gb_per_s": nb / float(np.median(t)) / 1e9})
    for memory in ("pinned", "pageable"):
        m = [r for r in rec["medians"] if r["direction"] == "h2d" and r["memory"] == memory and r["nbytes"] == 2**30]
        rec[f"{memory}_bytes_per_s"] = m[0]["gb_per_s"] * 1e9 if m else None
    try:
        rec["mapped"] = measure_mapped(cp, sizes)
        rec["mapped_bytes_per_s"] = next(m["gb_per_s"] * 1e9 for m in rec["mapped"] if m["nbytes"] == 2**30)
    except Exception as exc:  # noqa: BLE001 - a probe of its own: the pinned/pageable figures stand without it
        rec["mapped_bytes_per_s"] = None
        rec["mapped_error"] = f"{exc.__class__.__name__}: {exc}"
    Path(out).write_text(json.dumps(rec, indent=1))
    return rec


def measure_mapped(cp, sizes: list[int], reps: int = 5) -> list[dict]:
    """H2D copies of each of ``sizes`` bytes from a read-only mapping of a 1 GiB file (module
    docstring), ``reps`` each at rotating offsets; one record per size with the median time and
    GB/s. The file is removed afterwards."""
    total = max(sizes)
    fd, name = tempfile.mkstemp(suffix=".bin", prefix="psim-mapped-")
    try:
        with os.fdopen(fd, "wb") as fh:
            chunk = np.random.default_rng(0).integers(0, 255, min(64 * 2**20, total), dtype=np.uint8).tobytes()
            for _ in range(-(-total // len(chunk))):
                fh.write(chunk)
        mm = np.memmap(name, dtype=np.uint8, mode="r")
        int(mm[::4096].sum())  # read once: the pages are in the page cache and mapped
        dst = cp.empty(total, dtype=cp.uint8)
        out = []
        for nb in sizes:
            times = []
            for k in range(reps):
                off = (k * nb) % (total - nb + 1)
                src = mm[off:off + nb]
                cp.cuda.Device().synchronize()
                t0 = time.perf_counter()
                cp.cuda.runtime.memcpy(dst.data.ptr, src.ctypes.data, nb, cp.cuda.runtime.memcpyHostToDevice)
                times.append(time.perf_counter() - t0)
            med = float(np.median(times))
            out.append({"direction": "h2d", "memory": "mapped", "nbytes": nb, "n": reps, "median_s": med,
                        "gb_per_s": nb / med / 1e9})
        del mm
        return out
    finally:
        os.unlink(name)


def main(argv: list[str] | None = None) -> int:
    from sim.errors import PrefetchSimError

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m calibrate.llamacpp.h2d_probe OUT.json", file=sys.stderr)
        return 2
    try:
        rec = probe(argv[0])
    except PrefetchSimError as exc:
        print(f"h2d_probe: error: {exc}", file=sys.stderr)
        return 2
    for m in rec["medians"] + rec.get("mapped", []):
        print(f"{m['direction']} {m['memory']:8s} {m['nbytes'] / 2**20:6.0f} MiB: {m['gb_per_s']:.2f} GB/s (n={m['n']})")
    if rec.get("mapped_error"):
        print(f"h2d mapped: not measured ({rec['mapped_error']})")
    return 0


if __name__ == "__main__":
    from sim.cli.interrupt import run_interruptible

    sys.exit(run_interruptible("h2d_probe", main))  # Ctrl-C / SIGTERM: one line, 130 / 143
