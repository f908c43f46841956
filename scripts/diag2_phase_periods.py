"""Per-token decode periods of the diag2 lease's phase-timed llama-bench runs.

Reads ``logs/phase-gptoss-{gt,tg}.log`` from a diag2 folder's ``logs.tar.gz`` (the phase-time
patch's ``prefetch-sim phase-time:`` lines, one per llama_decode call) and prints, for each run
of at least 100 one-token calls (a tg128 test's warm-up and five repetitions), the median and
mean period between consecutive calls' starts (t0, microseconds), the graphs rebuilt, and the
median of each host phase (apply, build, alloc, inputs, the compute call's return).

Usage: python scripts/diag2_phase_periods.py data/llamacpp/h100-20261207-diag2
"""

from __future__ import annotations

import re
import statistics as st
import sys
import tarfile
from pathlib import Path

KEYS = ("apply_us", "build_us", "alloc_us", "inputs_us", "compute_us")


def decode_runs(text: str) -> list[list[dict]]:
    """Runs of consecutive one-token calls, each call its phase fields as ints."""
    runs, cur = [], []
    for ln in text.splitlines():
        if "phase-time:" not in ln:
            continue
        r = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", ln)}
        if r.get("n_tokens") == 1:
            cur.append(r)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return [x for x in runs if len(x) >= 100]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    with tarfile.open(Path(argv[0]) / "logs.tar.gz") as tar:
        for form in ("gt", "tg"):
            text = tar.extractfile(f"logs/phase-gptoss-{form}.log").read().decode()
            for i, run in enumerate(decode_runs(text)):
                per = [b["t0"] - a["t0"] for a, b in zip(run, run[1:])]
                med = {k: st.median(r[k] for r in run[1:]) for k in KEYS}
                print(f"{form} run {i}: {len(run)} calls, period median {st.median(per):.0f} us, mean "
                      f"{st.mean(per):.0f} us, rebuilt {sum(r['reused'] == 0 for r in run)}, "
                      + ", ".join(f"{k} {v:g}" for k, v in med.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
