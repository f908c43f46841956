"""``prefetch-sim`` command line.

Subcommands: ``run`` (llama-bench-style table of every variant), ``trace`` (Chrome trace of one
test), ``calibrate`` (measure a GPU), ``validate`` (predicted vs measured on a GPU),
``crossover`` (sweeps and crossover plots), ``check`` (hazard checker). Errors in user input
print one line naming the file and field, and exit with status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import replace
from pathlib import Path

from .atomic import check_output_path, write_atomic
from .errors import PrefetchSimError, ScenarioError

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SCENARIO = "scenarios/default.toml"


def default_scenario_path() -> Path:
    """``scenarios/default.toml`` of the working directory if present, else the one shipped
    beside the package (editable install / source checkout)."""
    here = Path.cwd() / DEFAULT_SCENARIO
    return here if here.exists() else REPO_ROOT / DEFAULT_SCENARIO


def scenario_path(arg: str | None) -> Path:
    """The scenario a command names: ``arg``, or :func:`default_scenario_path` when none is given.

    Raises:
        ScenarioError: ``arg`` is an empty string (``prefetch-sim run ''``), field ``scenario``.
    """
    if arg is None:
        return default_scenario_path()
    if not arg.strip():
        raise ScenarioError("empty scenario path (leave it out for the default scenario)", field="scenario")
    return Path(arg)


#: output formats of ``run`` (llama-bench's ``-o``)
FORMATS = ("md", "csv", "json", "jsonl")


def _int_list(text: str) -> tuple[int, ...]:
    """llama-bench list syntax: ``512,1024`` or ``512-2048*2`` (start-end*mult) or ``a-b+s``
    (start-end+step), as llama-bench parses ``-p``/``-n``/``-d``.

    Raises:
        argparse.ArgumentTypeError: not integers, a negative value, a range that yields no
            value (end below start), or one that would never end (a multiplier below 2 or a
            start of 0 with ``*``, a step below 1 with ``+``).
    """
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part[1:]:
                a, rest = part.split("-", 1)
                if "*" in rest:
                    b, mul = rest.split("*")
                    start, end, m = int(a), int(b), int(mul)
                    if m < 2 or start < 1:
                        raise argparse.ArgumentTypeError(
                            f"range '{part}': a start >= 1 and a multiplier >= 2 are needed with '*' (got start "
                            f"{start}, multiplier {m}), as in 128-2048*2")
                    got = []
                    v = start
                    while v <= end:
                        got.append(v)
                        v *= m
                else:
                    step = 1
                    if "+" in rest:
                        rest, s = rest.split("+")
                        step = int(s)
                    if step < 1:
                        raise argparse.ArgumentTypeError(f"range '{part}': the step after '+' must be >= 1, got {step}")
                    got = list(range(int(a), int(rest) + 1, step))
                if not got:
                    raise argparse.ArgumentTypeError(f"range '{part}' yields no value (its end lies below its start)")
                out.extend(got)
            else:
                out.append(int(part))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected integers like 512,1024 or 128-2048*2, got '{text}'") from None
    if any(v < 0 for v in out):
        raise argparse.ArgumentTypeError(f"values must be >= 0, got '{text}'")
    return tuple(out)


def load_scenario_with_overrides(args: argparse.Namespace):
    """The scenario named on the command line (or the default), with llama-bench flag
    overrides applied and validated."""
    from .specs import load_scenario, parse_variant

    path = scenario_path(args.scenario)
    scn = load_scenario(path)
    wl = scn.workload
    changes = {}
    for flag, key in (("n_prompt", "n_prompt"), ("n_gen", "n_gen"), ("n_depth", "n_depth")):
        v = getattr(args, flag, None)
        if v is not None:
            changes[key] = v
    for flag, name in (("n_ubatch", "-ub/--ubatch-size"), ("n_batch", "-b/--batch-size"),
                       ("repetitions", "-r/--repetitions")):
        v = getattr(args, flag, None)
        if v is not None:
            if v < 1:
                raise ScenarioError(f"must be >= 1, got {v}", field=name)
            changes[flag] = v
    if changes:
        wl = replace(wl, **changes)
        if wl.n_ubatch > wl.n_batch:
            wl = replace(wl, n_ubatch=wl.n_batch)
        if not wl.tests():
            raise ScenarioError("no test to run: every -p and -n value is 0", field="-p/-n")
        scn = scn.with_(workload=wl)
    if getattr(args, "variant", None):
        vs = tuple(parse_variant(v, field_name="--variant") for v in args.variant)
        names = [v.name for v in vs]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ScenarioError(f"variant given more than once: {', '.join(dup)}", field="--variant")
        scn = scn.with_(variants=vs)
    from .metrics import fit_context_to_tests

    return fit_context_to_tests(scn)


def _add_bench_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", nargs="?", help=f"scenario TOML (default: {DEFAULT_SCENARIO})")
    p.add_argument("-p", "--n-prompt", dest="n_prompt", type=_int_list, help="prompt lengths, e.g. 512,2048")
    p.add_argument("-n", "--n-gen", dest="n_gen", type=_int_list, help="generation lengths, e.g. 128")
    p.add_argument("-d", "--n-depth", dest="n_depth", type=_int_list,
                   help="KV depths, e.g. 0,8192 (as llama-bench, the KV cache is sized to depth + tokens "
                        "when the scenario's ctx_size is smaller)")
    p.add_argument("-ub", "--ubatch-size", dest="n_ubatch", type=int, help="physical batch size")
    p.add_argument("-b", "--batch-size", dest="n_batch", type=int, help="logical batch size")
    p.add_argument("-r", "--repetitions", dest="repetitions", type=int, help="repetitions per test")
    p.add_argument("--variant", action="append",
                   help="variant to run (repeatable): baseline, prefetch_ungated, prefetch_gated_<N>, "
                        "slots<N>, cache_lru, cache_lfu, baseline_without_selective_copy, or a+b "
                        "(e.g. slots3+cache_lru)")
    p.add_argument("--engine", choices=("analytic", "des"), default="analytic",
                   help="analytic: max-plus recurrence (default); des: SimPy discrete-event model "
                        "(same results, slower)")


def rows_from_results(scn, results, ratios) -> list:
    """:class:`sim.report.BenchRow` s of a scenario's results (``ratios`` from
    :func:`sim.metrics.speedups`; the baseline row gets ``None``)."""
    from .report import BenchRow

    m, wl = scn.model, scn.workload
    base = "baseline"
    rows = []
    for r in results:
        rows.append(BenchRow(
            model=m.name, size_bytes=m.nbytes, n_params=m.n_params, backend="CUDA",
            ngl=scn.placement.ngl, n_ubatch=wl.n_ubatch, n_batch=wl.n_batch, n_cpu_moe=r.n_cpu_moe,
            variant=r.variant, test=r.test, tps_mean=r.tps_mean, tps_std=r.tps_std,
            speedup_vs_baseline=None if r.variant == base else ratios.get((r.variant, r.test)),
            ttft_s=r.ttft_s, h2d_bytes=int(r.h2d_bytes), staging_bytes=int(r.staging_bytes),
            exposed_transfer_s=r.exposed_transfer_s,
            overlap_fraction=None if r.overlap_fraction != r.overlap_fraction else r.overlap_fraction,
            cache_hit_rate=r.cache_hit_rate, peak_vram_bytes=int(r.peak_vram_bytes), engine=r.engine))
    return rows


def vram_table(results) -> str:
    """Markdown table of peak VRAM by component (GiB) per variant and GPU."""
    from .units import GiB

    lines = ["| variant | GPU | reserved | weights | KV cache | compute | staging | expert cache | total | free |",
             "| --- | --: | --: | --: | --: | --: | --: | --: | --: | --: |"]
    seen = set()
    for r in results:
        if r.variant in seen:
            continue
        seen.add(r.variant)
        for b in r.vram:
            vals = (b.reserved_bytes, b.weights_bytes, b.kv_bytes, b.compute_bytes, b.staging_bytes, b.cache_bytes,
                    b.total_bytes, b.free_bytes)
            lines.append(f"| {r.variant} | {b.device} | " + " | ".join(f"{v / GiB:.2f}" for v in vals) + " |")
    return "VRAM by component (GiB):\n\n" + "\n".join(lines) + "\n"


def cmd_run(args: argparse.Namespace) -> int:
    from .metrics import run_scenario, speedups
    from .report import format_rows
    from .specs import parse_variant

    if args.out:
        check_output_path(args.out)
        suffix = Path(args.out).suffix.lower().lstrip(".")
        if args.output is None and suffix in FORMATS:
            args.output = suffix  # --out table.csv writes csv
        elif args.output is not None and suffix in FORMATS and suffix != args.output:
            raise ScenarioError(f"'{args.out}' ends in .{suffix} but -o asks for {args.output}", field="--out")
    args.output = args.output or "md"
    scn = load_scenario_with_overrides(args)
    if not any(v.name == "baseline" for v in scn.variants):
        # "vs base" is always against the upstream scheduler: add it when not asked for
        scn = scn.with_(variants=(parse_variant("baseline"),) + scn.variants)
    progress = None
    if not args.quiet and sys.stderr.isatty():
        from tqdm import tqdm

        progress = lambda it: tqdm(it, desc="simulating", unit="cell", file=sys.stderr)  # noqa: E731
    results = run_scenario(scn, engine=args.engine, progress=progress)
    rows = rows_from_results(scn, results, speedups(results, "baseline"))
    text = format_rows(rows, args.output)
    if args.vram:
        if args.output == "md":
            text = text.rstrip("\n") + "\n\n" + vram_table(results)
        else:  # keep csv/json parseable
            sys.stderr.write(vram_table(results))
    if args.out:
        write_atomic(args.out, text)
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


def cmd_trace(args: argparse.Namespace) -> int:
    import numpy as np

    from .builder import build_plan, make_context
    from .metrics import rep_rng, time_plan
    from .trace import to_chrome_trace, to_dataframe

    out = Path(args.out)
    if out.suffix not in (".json", ".csv"):
        raise ScenarioError(f"'{out}': use a .json (Chrome trace) or .csv file name", field="--out")
    check_output_path(out)
    scn = load_scenario_with_overrides(args)
    tests = scn.workload.tests()
    if args.test:
        match = [t for t in tests if t.name == args.test]
        if not match:
            raise ScenarioError(f"no test named '{args.test}' (have: {', '.join(t.name for t in tests)}; "
                                "-p, -n and -d set the workload's tests, e.g. -p 512 -d 8192 for 'pp512 @ d8192')",
                                field="--test")
        test, ti = match[0], tests.index(match[0])
    else:
        test, ti = tests[0], 0
    import pandas as pd

    frames, lines = [], []
    for variant in scn.variants:  # every variant asked for, one timeline each, in one file
        ctx = make_context(scn, variant, rep_rng(scn.seed, -1, -1))
        plan = build_plan(scn, variant, test, rep_rng(scn.seed, ti, 0), ctx)
        sched = time_plan(plan, scn, args.engine)
        frames.append(to_dataframe(plan, sched, test=test.name, variant=variant.name))
        lines.append(f"{variant.name} / {test.name}: {len(plan.ops)} ops, makespan "
                     f"{float(np.max(sched.end_s)) * 1e3:.3f} ms")
    df = pd.concat(frames, ignore_index=True)
    if out.suffix == ".csv":
        write_atomic(out, df.to_csv(index=False))
    else:
        to_chrome_trace(df, out)
    print("\n".join(lines) + f"\n-> {out}")
    return 0


# optional subcommands contributed by other modules: (module, add_parser function name)
_PLUGINS = (
    ("sim.cli_calibrate", "add_calibrate_parser"),
    ("sim.cli_validate", "add_validate_parser"),
    ("sim.crossover", "add_crossover_parser"),
    ("sim.hazards", "add_check_parser"),
    ("sim.reproduce", "add_reproduce_parser"),
)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="prefetch-sim",
        description="What-if simulator for weight and MoE expert prefetching in llama.cpp/ggml.")
    from . import __version__

    ap.add_argument("--version", action="version", version=f"prefetch-sim {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="llama-bench-style table of every variant (default scenario if none given)")
    _add_bench_flags(run)
    run.add_argument("-o", "--output", choices=FORMATS, default=None,
                     help="output format (default md, or the --out file's extension when it is one of these)")
    run.add_argument("--out", help="write to this file instead of stdout (missing folders are created)")
    run.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    run.add_argument("--vram", action="store_true", help="also print peak VRAM by component per variant (md)")
    run.set_defaults(func=cmd_run)
    tr = sub.add_parser("trace", help="per-op trace of one test, every --variant: Chrome trace JSON (or .csv)")
    _add_bench_flags(tr)
    tr.add_argument("--test", help="test name, e.g. pp512 or 'pp512 @ d8192' (default: the first)")
    tr.add_argument("--out", default="trace.json", help="output file (.json Chrome trace, .csv table; default "
                                                        "trace.json in the current folder)")
    tr.set_defaults(func=cmd_trace)
    for mod, fn in _PLUGINS:
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name == mod:
                continue
            raise
        getattr(m, fn)(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``prefetch-sim`` console script. Returns the exit status."""
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except PrefetchSimError as exc:
        print(f"prefetch-sim: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # an output that could not be written after all
        where = f" '{exc.filename}'" if getattr(exc, "filename", None) else ""
        print(f"prefetch-sim: error: cannot write{where}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("prefetch-sim: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
