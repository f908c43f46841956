"""Tables of the ubheld lease (``scripts/h200_diag2.sh`` part ``ubheld``).

1. gpt-oss-20b and Gemma-3-27B pp256 at ubatch 1, 2, 4, 8, 16: llama-bench's t/s, the error of the
   predictions of record (``data/llamacpp/h200-ubheld-predicted``) and of the current model
   (``prefetch-sim run`` with the lease's flags, the shipped profile).
2. gpt-oss under ``ncu`` (pp8 at ubatch 1, 2, 4, 8, CUDA graphs off): GPU ms per graph by kernel
   class, each kernel less ncu's overhead (:func:`calibrate.llamacpp.smallbatch.graph_table`).

Usage: PYTHONPATH=. python scripts/ubheld_summary.py data/llamacpp/h100-20261207-ubheld
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from calibrate.llamacpp.smallbatch import graph_table

PREDICTED = Path("data/llamacpp/h200-ubheld-predicted")
MODELS = (("gpt-oss-20b", "gptoss", "bench-gptoss-pp256.jsonl", ["-ncmoe", "0"]),
          ("gemma3-27b", "gemma3", "bench-gemma-pp256.jsonl", []))


def ts_by_ubatch(lines) -> dict[int, float]:
    """``{n_ubatch: avg_ts}`` of llama-bench JSONL lines."""
    out = {}
    for ln in lines:
        if ln.strip():
            r = json.loads(ln)
            out[int(r["n_ubatch"])] = float(r["avg_ts"])
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    folder = Path(argv[0])
    print("| model | -ub | measured t/s | predicted of record | error | current model | error |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for toml, stem, bench, extra in MODELS:
        meas = ts_by_ubatch((folder / bench).read_text().splitlines())
        rec = ts_by_ubatch((PREDICTED / f"{stem}-pp256.jsonl").read_text().splitlines())
        cmd = [sys.executable, "-m", "sim", "run", "-m", f"scenarios/models/{toml}.toml", "-ngl", "99", *extra,
               "-lm", "none", "-fa", "on", "-b", "2048", "-ub", "1,2,4,8,16", "-p", "256", "-n", "0", "-r", "3",
               "--variant", "baseline", "-q", "-o", "jsonl"]
        now = ts_by_ubatch(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines())
        for ub in sorted(meas):
            print(f"| {stem} | {ub} | {meas[ub]:.1f} | {rec[ub]:.1f} | {rec[ub] / meas[ub] - 1:+.1%} | "
                  f"{now[ub]:.1f} | {now[ub] / meas[ub] - 1:+.1%} |")
    corr, _count, tot = graph_table(folder, 201088, "ncu-gptoss-pp8-ub1-8.csv.gz", "bench-gptoss-pp256.jsonl")
    print("\ngpt-oss, ncu: ms per graph by class, each kernel less ncu's overhead per kernel "
          f"({', '.join(f'{v:.2f}' for v in tot['ncu overhead us per kernel'])} us at ubatch 1, 2, 4, 8)\n")
    print("| class | " + " | ".join(str(c) for c in corr.columns) + " |")
    print("| --- |" + " ---: |" * len(corr.columns))
    for cls, row in corr.round(3).iterrows():
        print(f"| {cls} | " + " | ".join(f"{v:.3f}" for v in row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
