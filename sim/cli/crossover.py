"""``prefetch-sim crossover``: its flags and command (the sweeps and figures are
:mod:`sim.views.crossover`)."""

from __future__ import annotations

import argparse
import sys

import numpy as np

from sim.cli.benchflags import ascii_int
from sim.errors import ScenarioError
from sim.model.specs import BenchTest, load_scenario, parse_variant
from sim.views.crossover import (
    AXES, FIGURES, _report, _stem, axis_notes, figure_spec, parse_axis, parse_test, run_figure, sweep, write_outputs,
)


def cmd_crossover(args: argparse.Namespace) -> int:
    """``prefetch-sim crossover``: a sweep or a built-in figure. Returns the exit status."""
    from sim.cli import scenario_path

    from sim.bounds import LIST_VALUES_MAX, REPETITIONS_MAX, WORK_MAX

    if args.repetitions is not None and not 1 <= args.repetitions <= REPETITIONS_MAX:
        raise ScenarioError(f"must be between 1 and {REPETITIONS_MAX}, got {args.repetitions}", field="--repetitions")
    if args.max_work is not None and args.max_work < 1:
        raise ScenarioError(f"must be >= 1, got {args.max_work}", field="--max-work")
    if args.jobs is not None and args.jobs < 1:
        raise ScenarioError(f"must be >= 1, got {args.jobs}", field="--jobs")
    # an empty path is an error here too, also with --figure; a built-in name is its file
    scenario = None if args.scenario is None else scenario_path(args.scenario)
    from sim.atomic import check_output_path

    check_output_path(args.out, "--out", directory=True)
    from sim.cli.progress import progress_enabled

    progress = progress_enabled(args.quiet)
    if args.figure:
        if args.axis or args.axis2 or args.variant or args.test or args.baseline != "baseline":
            raise ScenarioError("--figure builds a fixed sweep; drop --axis/--axis2/--variant/--test/--baseline",
                                field="--figure")
        keys = list(FIGURES) if args.figure.strip().lower() == "all" else [figure_spec(args.figure).key]
        for k in keys:
            out = run_figure(FIGURES[k], args.out, scenario=scenario, repetitions=args.repetitions,
                             jobs=args.jobs, engine=args.engine, progress=progress)
            _report(out)
        return 0
    if not args.axis:
        raise ScenarioError("give an axis to sweep, e.g. --axis ubatch=128,256,512 (or --figure NAME)",
                            field="--axis")
    axes = [parse_axis(args.axis, "--axis")]
    if args.axis2:
        axes.append(parse_axis(args.axis2, "--axis2"))
    scn = load_scenario(scenario_path(args.scenario))  # (None: the default scenario)
    variants = ([parse_variant(v, field_name="--variant") for v in args.variant] if args.variant
                else list(scn.variants))
    names = [v.name for v in variants]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ScenarioError(f"variant given more than once: {', '.join(dup)}", field="--variant")
    if args.test is not None:   # "" is a test name too (parse_test refuses it), not "the default"
        test = parse_test(args.test)
    else:
        tests = scn.workload.tests()
        test = tests[0]
        if any(a.name == "prompt" for a in axes):
            test = next((t for t in tests if t.n_prompt), BenchTest(512, 0, 0))
    if args.baseline != "baseline" and args.baseline not in {v.name for v in variants}:
        raise ScenarioError(f"'{args.baseline}' is not one of the variants ({', '.join(v.name for v in variants)}); "
                            "name one of them, or leave --baseline out to compare against the plain baseline",
                            field="--baseline")
    n_cells = int(np.prod([len(a) for a in axes]))
    if n_cells > LIST_VALUES_MAX:
        raise ScenarioError(f"{n_cells:,} sweep points, more than the limit of {LIST_VALUES_MAX}", field="--axis2")
    for note in axis_notes(axes, test, scn):
        print(f"prefetch-sim: note: {note}", file=sys.stderr)
    res = sweep(scn, axes, variants, test, repetitions=args.repetitions or 1, engine=args.engine, jobs=args.jobs,
                baseline=args.baseline, progress=progress,
                max_work=WORK_MAX if args.max_work is None else args.max_work, prefetch_plots=True)
    if res.cells and all(c.error for c in res.cells):
        # nothing fits anywhere: an error, as run's when no setting fits (a sweep where some points
        # fit keeps the others as rows that say why, and exits 0: the VRAM boundary is its answer)
        from sim.errors import PlacementError

        raise PlacementError(f"no point of the sweep fits; the first: {res.cells[0].error}",
                             field="--axis" if len(axes) == 1 else "--axis/--axis2")
    if {v.name for v in variants} == {args.baseline}:
        print(f"prefetch-sim: note: --variant {args.baseline} is the baseline itself: the sweep has no other variant "
              "to compare, so no crossing is looked for (the CSV and figure hold its t/s alone)", file=sys.stderr)
    if args.repetitions is None and scn.workload.repetitions > 1:   # after the sweep: an error stays one line
        print(f"prefetch-sim: note: -r 1 (crossover's default): each cell is llama-bench's first timed repetition "
              f"(the CUDA-graph capture included) on one routing draw, where run averages the scenario's "
              f"{scn.workload.repetitions}; give -r {scn.workload.repetitions} for run's numbers", file=sys.stderr)
    from sim.model.specs import scenario_input_files

    _report(write_outputs(res, args.out, _stem(res), inputs=scenario_input_files(scn)))
    return 0


class _Once(argparse.Action):
    """An option that may be given once (``--axis`` twice would silently keep the last)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if getattr(namespace, self.dest, None) is not None:
            parser.error(f"{option_string} given twice (sweep a second axis with --axis2)")
        setattr(namespace, self.dest, values)


def add_crossover_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``prefetch-sim crossover`` on an argparse subparsers object."""
    p = subparsers.add_parser(
        "crossover", help="sweep one or two axes for several variants; CSV + PNG with crossovers marked",
        description="Sweep one or two axes (" + ", ".join(AXES) + ") for several variants, write CSV and "
                    "PNG, and print where each variant's speedup vs baseline crosses 1.0. "
                    "--figure builds a built-in figure: " + "; ".join(f"{k} = {f.name}" for k, f in FIGURES.items())
                    + ".")
    p.add_argument("scenario", nargs="?", help="scenario TOML (default: scenarios/default.toml; with "
                                               "--figure: the figure's own)")
    p.add_argument("--axis", action=_Once, help="NAME=V1,V2,... (ranges as llama-bench: 32-2048*2); NAME one of " + ", ".join(AXES))
    p.add_argument("--axis2", action=_Once, help="second axis: a heatmap of speedup vs baseline")
    from sim.cli.benchflags import variant_names

    p.add_argument("--variant", action="extend", type=variant_names, metavar="V[,V...]",
                   help="variants, a comma list (repeatable: a repeated flag adds; default: the scenario's variants)")
    p.add_argument("--test", help="base test, e.g. pp512, tg128, 'pp512 @ d8192' (default: the scenario's first)")
    p.add_argument("--baseline", default="baseline",
                   help="the variant the others are compared against: one of the variants, or 'baseline' (the "
                        "plain baseline, added if absent; default)")
    p.add_argument("-r", "--repetitions", type=ascii_int, default=None,
                   help="repetitions per cell (default 1; --figure: the figure's own, 5 for d)")
    p.add_argument("-j", "--jobs", type=ascii_int, default=None, help="worker processes (default: all cores)")
    p.add_argument("--engine", choices=("analytic", "des"), default="analytic")
    p.add_argument("--figure", help="build a built-in figure: " + ", ".join(FIGURES) + ", their names, or all")
    p.add_argument("--out", default="out/crossover", help="output directory (default out/crossover)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    from sim.bounds import MEMO_WORK_DIVISOR, WORK_MAX

    p.add_argument("--max-work", dest="max_work", type=ascii_int, default=None, metavar="N",
                   help=f"refuse a sweep that would cost more than N graph-layers of work (x1 per variant with an "
                        f"expert cache, x1/{MEMO_WORK_DIVISOR} per other; default {WORK_MAX:,})")
    p.set_defaults(func=cmd_crossover)
    return p
