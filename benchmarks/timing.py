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


def int_at_least(lo: int):
    """An argparse ``type`` accepting integers >= ``lo`` (a clear message otherwise)."""
    import argparse

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got '{text}'") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {v}")
        return v

    return parse
