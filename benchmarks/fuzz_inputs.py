"""Fuzz benchmark: run >= 2,000 mutated inputs (tests/fuzzgen.py) through the ``prefetch-sim``
command line, each in a forked process under a time limit, and print a table of outcomes:
clean error / valid run / traceback / over time / accepted nonsense (an input labelled invalid
that ran without error, or a valid run whose markdown table is broken).

    python benchmarks/fuzz_inputs.py [--cases 2000] [--seed 0] [--limit-s 60] [--jobs 2] [-v]

Exit status 1 when any case is a traceback, over time or accepted nonsense.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import fuzzgen  # noqa: E402


def _child(case, folder: Path, res_path: Path) -> None:
    """In the forked process: run the case, write rc / stdout / stderr to ``res_path``."""
    os.cpu_count = lambda: 1  # serial engines: the benchmark runs its own processes in parallel
    try:
        fuzzgen.setup_case(case, folder)
        rc, out, err = fuzzgen.run_case(case, folder)
    except BaseException:  # noqa: BLE001 - a failure of the harness is reported, not hidden
        import traceback

        rc, out, err = None, "", traceback.format_exc()
    outcome = fuzzgen.classify(case, rc, out, err)
    res_path.write_text(f"{outcome}\n{rc}\n{err[-4000:]}")


def main(argv=None) -> int:
    """Run the benchmark; print the table; 1 if any failure."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0, help="first case seed")
    ap.add_argument("--limit-s", type=float, default=60.0, help="time limit of one case (s)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("-v", "--verbose", action="store_true", help="print every failing case")
    args = ap.parse_args(argv)
    import sim.cli  # noqa: F401 - imported once, before forking (each child starts warm)
    import sim.views.crossover  # noqa: F401
    import sim.plan.hazards  # noqa: F401

    work = Path(tempfile.mkdtemp(prefix="fuzz-inputs-"))
    pending = list(range(args.seed, args.seed + args.cases))
    running: dict[int, tuple] = {}
    counts: Counter = Counter()
    by_label: Counter = Counter()
    failures = []
    t0 = time.monotonic()
    try:
        while pending or running:
            while pending and len(running) < args.jobs:
                seed = pending.pop(0)
                case = fuzzgen.make_case(seed)
                folder, res = work / f"c{seed}", work / f"r{seed}"
                pid = os.fork()
                if pid == 0:
                    code = 0
                    try:
                        _child(case, folder, res)
                    except BaseException:  # noqa: BLE001
                        code = 3
                    os._exit(code)
                running[pid] = (case, folder, res, time.monotonic())
            time.sleep(0.005)
            for pid, (case, folder, res, start) in list(running.items()):
                done, _ = os.waitpid(pid, os.WNOHANG)
                if done == 0 and time.monotonic() - start <= args.limit_s:
                    continue
                if done == 0:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    outcome, detail = "over time", ""
                elif res.exists():
                    outcome, _, detail = res.read_text().partition("\n")
                else:
                    outcome, detail = "traceback", "(the case process died)"
                del running[pid]
                counts[outcome] += 1
                by_label[(case.label, outcome)] += 1
                if outcome in ("traceback", "over time", "accepted nonsense"):
                    failures.append((case, outcome, detail))
                shutil.rmtree(folder, ignore_errors=True)
                res.unlink(missing_ok=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    wall = time.monotonic() - t0
    lines = [f"fuzz_inputs: {args.cases} cases (seeds {args.seed}..{args.seed + args.cases - 1}), "
             f"limit {args.limit_s:g} s per case, {args.jobs} jobs, {wall:.0f} s", "",
             "| outcome | cases | labelled invalid | labelled valid | labelled either |",
             "| --- | --: | --: | --: | --: |"]
    for o in fuzzgen.OUTCOMES:
        lines.append(f"| {o} | {counts[o]} | {by_label[('invalid', o)]} | {by_label[('valid', o)]} | "
                     f"{by_label[('either', o)]} |")
    lines.append(f"| total | {sum(counts.values())} | {sum(v for (l, _), v in by_label.items() if l == 'invalid')} | "
                 f"{sum(v for (l, _), v in by_label.items() if l == 'valid')} | "
                 f"{sum(v for (l, _), v in by_label.items() if l == 'either')} |")
    print("\n".join(lines))
    for case, outcome, detail in failures[: (None if args.verbose else 20)]:
        tail = detail.strip().splitlines()[-1] if detail.strip() else ""
        print(f"\n[{outcome}] seed {case.seed} ({case.label}): {case.what}\n  argv: {case.argv}\n  {tail}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
