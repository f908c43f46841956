"""Timing helper shared by the benchmark scripts."""

from __future__ import annotations

import time


def best_of(fn, repeat: int) -> float:
    """Shortest wall time (s) of ``repeat`` calls of ``fn()`` (the least disturbed run)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best
