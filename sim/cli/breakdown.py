"""``prefetch-sim breakdown``: where each test's time goes, by op category, on the critical path.

One table per (variant, test): for each category of op (:func:`sim.views.breakdown.category`:
GPU ``MUL_MAT_ID``, H2D copies of experts, the CPU backend's expert matmuls, the scheduler's
host work per split ...) the milliseconds it holds on the critical path of the test, their share
of the test's time, the milliseconds it is busy in all, and how much of that the schedule hides
behind other work. Each repetition (``-r``) is simulated whole, as ``prefetch-sim run`` times
it, and the table gives their mean: its total is ``run``'s time of the test.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sim.atomic import check_output_path, write_atomic
from sim.errors import PlacementError, ScenarioError

#: output formats of ``-o``
BREAKDOWN_FORMATS = ("md", "csv", "json")

#: the columns of the csv and json outputs, in order
COLUMNS = ("variant", "test", "category", "critical_ms", "critical_share", "busy_ms", "hidden_ms", "n_ops",
           "n_critical_ops", "test_ms", "avg_ts")


#: the row of the next ubatch's host work that llama.cpp runs while the GPU finishes this one
#: (:func:`sim.plan.overlap.ubatch_overlap_s`): the plan's makespan counts it, the test's time not
OVERLAP = "overlap: next ubatch's host work behind the GPU (subtracted)"


def breakdown_rows(args: argparse.Namespace) -> tuple[list[dict], list[tuple[str, str, str]]]:
    """The rows (:data:`COLUMNS`) of every asked (variant, test), and per table ``(variant, test,
    header line)``: the mean over the workload's repetitions (``-r``) of each category's times,
    each repetition built and timed whole as ``prefetch-sim run`` times it
    (:func:`sim.engines.metrics.full_repetition`: its routing draw, the first one's CUDA-graph
    capture, the expert cache's warm-up), so ``test_ms`` is ``run``'s ``avg_ns``.

    Raises:
        ScenarioError, PlacementError: bad flags, tests or placements, in the flags' terms.
    """
    from sim.cli import _check_out_spares_inputs, check_plan_work, load_scenario_with_overrides, pick_tests

    scn = load_scenario_with_overrides(args)
    _check_out_spares_inputs(args, scn, "the tables")
    tests = scn.workload.tests()
    # in the workload's order (llama-bench's), each once: an expert cache carries over the tests
    chosen = (sorted(dict(pick_tests(args.test, tests)).items()) if args.test else list(enumerate(tests)))
    last = chosen[-1][0] if chosen else -1
    picked = {ti for ti, _ in chosen}
    check_plan_work(scn, [t for _, t in chosen], args,
                    replay=[t for ti, t in enumerate(tests[:last]) if ti not in picked])
    reps = scn.workload.repetitions
    rows, heads = [], []
    from sim.cli.progress import bar, closed_after

    with closed_after(bar(total=len(scn.variants) * len(chosen), desc="simulating", unit="test",
                          quiet=getattr(args, "quiet", False))) as progress:
        _tables(scn, args, chosen, reps, rows, heads, progress)
    return rows, heads


def _tables(scn, args, chosen, reps, rows, heads, progress) -> None:
    """:func:`breakdown_rows`'s loop: append each (variant, test)'s rows and header line; one
    step of ``progress`` (a tqdm bar) per table."""
    from sim.cli import fitting_contexts
    from sim.engines.metrics import fill_cache_before, full_repetition
    from sim.views.breakdown import breakdown
    from sim.views.report import sample_stats

    tests = scn.workload.tests()
    for variant, ctx in fitting_contexts(scn, args):
        done = 0  # the tests before this one already run on ctx
        for ti, test in chosen:
            # an expert cache as run has it: the tests left out of the table run first, then
            # this test's warm-up (nothing without a cache)
            fill_cache_before(scn, variant, tests[done:ti + 1], ti - done, ctx, args.engine)
            done = ti + 1
            acc: dict[str, list[float]] = {}
            total = path = ops = 0.0
            samples = []
            for r in range(reps):
                plan, sched, t = full_repetition(scn, variant, test, r, ctx, args.engine)
                b = breakdown(plan, sched)
                for cat, crit, busy, n, n_crit in b.rows:
                    a = acc.setdefault(cat, [0.0, 0.0, 0.0, 0.0])
                    a[0] += crit; a[1] += busy; a[2] += n; a[3] += n_crit
                if b.makespan_s - t > 0:
                    acc.setdefault(OVERLAP, [0.0, 0.0, 0.0, 0.0])[0] -= b.makespan_s - t
                total += t; path += b.path_ops; ops += len(plan)
                samples.append(max(1, int(round(t * 1e9))))  # as run's samples_ns
            test_s = total / reps
            ts = sample_stats(samples, test.n_tokens)[2]  # llama-bench's avg_ts, as run prints it
            heads.append((variant.name, test.name,
                          f"{variant.name} / {test.name}: {test_s * 1e3:.3f} ms, {ts:.2f} t/s; critical path "
                          f"{path / reps:.0f} of {ops / reps:.0f} ops ({args.engine} engine, mean of {reps} "
                          f"repetition{'s' if reps > 1 else ''})"))
            order = sorted(acc.items(), key=lambda kv: (kv[0] == OVERLAP, -kv[1][0], -kv[1][1], kv[0]))
            for cat, (crit, busy, n, n_crit) in order:
                crit, busy = crit / reps, busy / reps
                rows.append({"variant": variant.name, "test": test.name, "category": cat, "critical_ms": crit * 1e3,
                             "critical_share": crit / test_s if test_s > 0 else 0.0, "busy_ms": busy * 1e3,
                             "hidden_ms": max(busy - crit, 0.0) * 1e3, "n_ops": round(n / reps),
                             "n_critical_ops": round(n_crit / reps), "test_ms": test_s * 1e3, "avg_ts": ts})
            progress.update(1)


def format_md(rows: list[dict], heads: list[tuple[str, str, str]]) -> str:
    """One markdown table per (variant, test) under its header line (:func:`breakdown_rows`)."""
    out, i = [], 0
    for variant, test, head in heads:
        out += [head, "", "| category | critical path, ms | share | busy, ms | hidden, ms | ops | on path |",
                "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        while i < len(rows) and rows[i]["variant"] == variant and rows[i]["test"] == test:
            r = rows[i]
            out.append(f"| {r['category']} | {r['critical_ms']:.3f} | {100 * r['critical_share']:.1f}% | "
                       f"{r['busy_ms']:.3f} | {r['hidden_ms']:.3f} | {r['n_ops']} | {r['n_critical_ops']} |")
            i += 1
        out.append("")
    return "\n".join(out)


def cmd_breakdown(args: argparse.Namespace) -> int:
    """``prefetch-sim breakdown``: print (or write to ``--out``) the tables."""
    fmt = args.output
    if args.out is not None:
        suffix = Path(args.out).suffix.lower().lstrip(".")
        if fmt is None:
            fmt = suffix if suffix in BREAKDOWN_FORMATS else "md"
        elif suffix in BREAKDOWN_FORMATS and suffix != fmt:
            raise ScenarioError(f"'{args.out}' has the extension of another format than -o {fmt}", field="--out")
        check_output_path(args.out)
    fmt = fmt or "md"
    rows, heads = breakdown_rows(args)
    if fmt == "md":
        text = format_md(rows, heads)
    elif fmt == "csv":
        import pandas as pd

        text = pd.DataFrame(rows, columns=list(COLUMNS)).to_csv(index=False)
    else:
        text = json.dumps(rows, indent=1) + "\n"
    if args.out is not None:
        write_atomic(args.out, text)
        print(f"-> {args.out}")
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


def add_breakdown_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``prefetch-sim breakdown`` on an argparse subparsers object."""
    from sim.cli import _add_bench_flags, _out_path

    p = subparsers.add_parser(
        "breakdown", help="where each test's time goes: op categories on the critical path (md, csv, json)",
        description="Simulate one setting of llama-bench's flags and print, per variant and test, the time each "
                    "category of op (GPU MUL_MAT / MUL_MAT_ID / attention, H2D copies of weights and experts, the "
                    "CPU backend, the scheduler's host work) holds on the critical path, its busy time, and how "
                    "much of it the schedule hides.")
    _add_bench_flags(p, one_setting=True)
    p.add_argument("--test", action="append", help="test name (repeatable), e.g. pp512 or 'pp512 @ d8192' "
                                                   "(default: every test); tables follow the workload's order")
    p.add_argument("-o", "--output", choices=BREAKDOWN_FORMATS, default=None,
                   help="output format (default md, or the --out file's extension)")
    p.add_argument("--out", type=_out_path, help="write to this file instead of stdout")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_breakdown)
    return p


__all__ = ["BREAKDOWN_FORMATS", "COLUMNS", "add_breakdown_parser", "breakdown_rows", "cmd_breakdown", "format_md"]
