"""``prefetch-sim validate``: predicted vs measured on a GPU, over the validation grid.

Writes into ``--out DIR``: ``<name>_validation.csv`` (one row per case, predicted and measured
total time, relative error), ``<name>_per_kind.csv`` (per case and op kind, summed predicted and
measured op time), ``<name>_validation.png`` (scatter + one overlaid timeline),
``<name>_timeline.csv`` (that timeline's two traces), ``<name>_traces.csv.gz`` (every case's
measured and predicted per-op trace), ``<name>_host_probes.csv`` (the host's pageable-copy,
CPU-matvec and launch speed at the start of every pass, :mod:`calibrate.drift`) and
``<name>_executor_costs.csv`` (the executor's own costs measured at the start of every pass,
``--host-state per-pass``, whose medians, with the host probes' median pageable bandwidth,
price the host in the diagnostic ``predicted_host_s``; ``predicted_s`` uses the profile alone) and
``<name>_meta.json`` (device, driver, CUDA/CuPy versions, date, command, summary). Every file is
written atomically; without a GPU or CuPy the command says so and writes nothing.
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import re
import sys
import time
from pathlib import Path

from sim.cli.benchflags import ascii_int
from sim.errors import ScenarioError
from sim.provenance import code_version
from sim.wording import plural

GRIDS = ("default", "smoke")


def add_validate_parser(sub) -> None:
    p = sub.add_parser("validate", help="run the validation grid on a GPU: predicted vs measured")
    p.add_argument("--grid", choices=GRIDS, default="default",
                   help="default: the 64-case grid; smoke: 6 quick cases")
    p.add_argument("--hardware", default=None,
                   help="profile the predictions use: a TOML file or a built-in name such as h200 (default: the "
                        "measured H200 profile)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--name", default="h200", help="file name prefix (default: h200)")
    p.add_argument("--repeats", type=ascii_int, default=3, help="timed runs per case and pass (default 3)")
    p.add_argument("--passes", type=ascii_int, default=5,
                   help="passes over the grid, alternating forward and reverse order; a case's measured time "
                        "is the median over passes x repeats timed runs (default 5)")
    p.add_argument("--cases", metavar="REGEX", help="only the cases whose name matches this regular expression")
    p.add_argument("--timeline-case", help="case whose timeline is plotted (default: a prefetch case)")
    p.add_argument("--host-state", choices=("per-pass", "profile"), default="per-pass",
                   help="per-pass (default): also measure the host-dependent figures at the start of every pass -- "
                        "the executor's own launch, host-work, busy-host and matvec costs (calibrate.executor_costs) "
                        "and the pageable H2D bandwidth (calibrate.drift) -- and report, beside the prediction from "
                        "--hardware (predicted_s, the headline), the prediction with their medians "
                        "(predicted_host_s, a diagnostic of host drift). profile: skip those probes")
    p.add_argument("--partial-log", action="store_true",
                   help="also append each case's row to <name>_partial.csv as it finishes")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_validate)


def _grid(name: str):
    from sim.views.validation import default_grid

    g = default_grid()
    if name == "smoke":
        keep = {"moe-pinned-pp512-d0-baseline", "moe-pinned-pp512-d0-prefetch_ungated",
                "moe-pinned-pp512-d0-slots2", "dense-pinned-pp512-d0-baseline",
                "dense-pinned-pp512-d0-prefetch_ungated", "moe-pageable-pp128-d0-baseline"}
        g = [c for c in g if c.name in keep]
    return g


def cmd_validate(args: argparse.Namespace) -> int:
    from calibrate._gpu import require_cupy  # noqa: PLC0415

    from sim.atomic import drawn_bytes, write_atomic_many
    from sim.model.specs import load_hardware
    from sim.views.validation import plot_validation, run_grid, summarize

    if args.repeats < 1:
        raise ScenarioError(f"must be >= 1, got {args.repeats}", field="--repeats")
    if args.passes < 1:
        raise ScenarioError(f"must be >= 1, got {args.passes}", field="--passes")
    from sim.atomic import check_output_path

    check_output_path(args.out, "--out", directory=True)
    if args.hardware is None:  # the shipped measured profile, from any working folder
        from sim.resources import cwd_or_shipped

        args.hardware = str(cwd_or_shipped("scenarios/hardware/h200.toml"))
    else:  # a path, or a built-in name (an unknown one: the built-in names listed), as other --hardware options
        from calibrate.llamacpp.compare import hardware_path

        args.hardware = str(hardware_path(args.hardware))
    if not args.name or not re.fullmatch(r"[A-Za-z0-9._-]+", args.name) or args.name in (".", ".."):
        raise ScenarioError(f"'{args.name}' is not a file name prefix (letters, digits, '.', '_', '-')",
                            field="--name")
    hw = load_hardware(args.hardware)
    cases = _grid(args.grid)
    if args.cases:
        try:
            pat = re.compile(args.cases)
        except re.error as exc:
            raise ScenarioError(f"not a regular expression ({exc})", field="--cases") from None
        cases = [c for c in cases if pat.search(c.name)]
        if not cases:
            raise ScenarioError(f"no case of grid '{args.grid}' matches '{args.cases}'", field="--cases")
    timeline = args.timeline_case or "moe-pinned-pp2048-d0-prefetch_ungated"
    if args.timeline_case and args.timeline_case not in {c.name for c in cases}:
        raise ScenarioError(f"'{args.timeline_case}' is not a case of this run (see the case names in "
                            "docs/validation.md or the CSV)", field="--timeline-case")
    if timeline not in {c.name for c in cases}:
        timeline = cases[0].name
    cp = require_cupy()  # clear error, nothing written, when there is no GPU
    from sim.cli.progress import bar, progress_enabled

    progress = None
    if progress_enabled(args.quiet):
        progress = lambda it: bar(it, desc="validating", unit="case")  # noqa: E731
    t0 = time.time()
    out = Path(args.out)
    partial = None
    if args.partial_log:
        out.mkdir(parents=True, exist_ok=True)
        partial = out / f"{args.name}_partial.csv"
        partial.unlink(missing_ok=True)  # a log of this run only (an older one may have other columns)
    probes: list = []
    failures: list[str] = []
    cost_log: list[dict] = []
    cost_probe = None
    gc_off = True  # the executor's garbage collector off in timed runs, cases and probes alike
    if args.host_state == "per-pass":
        from calibrate.executor_costs import measure as measure_costs  # noqa: PLC0415

        cost_probe = lambda: measure_costs(hw, cp=cp, gc_off=gc_off)  # noqa: E731
    used: dict = {}
    df, kinds, trace, traces = run_grid(cases, hw, repeats=args.repeats, passes=args.passes, progress=progress,
                                        cp=cp, keep_trace=timeline, partial=partial, host_probes=probes,
                                        failures=failures, cost_probe=cost_probe, cost_log=cost_log,
                                        pageable_from_probes=args.host_state == "per-pass", host_state_used=used,
                                        gc_off=gc_off)
    from calibrate.drift import probes_frame

    probe_df = probes_frame(probes)
    summ = summarize(df)
    dev = cp.cuda.runtime.getDeviceProperties(0)
    meta = {
        "device": dev["name"].decode() if isinstance(dev["name"], bytes) else str(dev["name"]),
        "driver_api_version": int(cp.cuda.runtime.driverGetVersion()),
        "cuda_runtime_version": int(cp.cuda.runtime.runtimeGetVersion()),
        "cupy_version": cp.__version__, "python": platform.python_version(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": "prefetch-sim " + " ".join(sys.argv[1:]), "hardware_profile": str(args.hardware),
        "code_version": code_version(), "executor_gc": "off" if gc_off else "on",
        "grid": args.grid,
        "repeats": args.repeats, "passes": args.passes, "n_cases": len(cases),
        "wall_s": round(time.time() - t0, 1), **summ,
        "pass_spread_median": float(df["pass_spread"].median()),
        "pass_spread_p90": float(df["pass_spread"].quantile(0.9)),
        "lossless_failures": failures,
        "host_state": args.host_state,
        "host_conditioned": {**summarize(df, "rel_error_host"),
                             "executor_costs_used": used.get("executor_costs"),
                             "pageable_gb_per_s_used": (used["pageable_bytes_per_s"] / 1e9
                                                        if used.get("pageable_bytes_per_s") else None),
                             "cost_probe_errors": [c for c in cost_log if "error" in c]},
        "host_probe_spread": {c: float(probe_df[c].max() / probe_df[c].min() - 1.0)
                              for c in probe_df.columns[2:] if len(probe_df) and probe_df[c].min() > 0},
    }
    # every file rendered first, then all moved into place together: an interruption or a failed
    # write leaves the folder's earlier files of those names as they were
    files: dict[Path, str | bytes] = {
        out / f"{args.name}_validation.csv": df.to_csv(index=False),
        out / f"{args.name}_per_kind.csv": kinds.to_csv(index=False)}
    if trace is not None:
        files[out / f"{args.name}_timeline.csv"] = trace.to_csv(index=False)
    files[out / f"{args.name}_traces.csv.gz"] = gzip.compress(traces.to_csv(index=False).encode(), mtime=0)
    files[out / f"{args.name}_host_probes.csv"] = probe_df.to_csv(index=False)
    if cost_log:
        import pandas as pd  # noqa: PLC0415

        files[out / f"{args.name}_executor_costs.csv"] = pd.DataFrame(cost_log).to_csv(index=False)
    files[out / f"{args.name}_validation.png"] = drawn_bytes(lambda path: plot_validation(df, path, trace))
    files[out / f"{args.name}_meta.json"] = json.dumps(meta, indent=2) + "\n"
    write_atomic_many(files)
    show = df[["case", "predicted_s", "measured_s", "rel_error", "pass_spread"]].copy()
    show["predicted_ms"] = (show.pop("predicted_s") * 1e3).round(3)
    show["measured_ms"] = (show.pop("measured_s") * 1e3).round(3)
    show["rel_error"] = show["rel_error"].map(lambda x: f"{x:+.1%}")
    show["pass_spread"] = show.pop("pass_spread").map(lambda x: f"{x:.1%}")
    if args.host_state == "per-pass":
        show["host_conditioned_error"] = df["rel_error_host"].map(lambda x: f"{x:+.1%}")
    if len(probe_df):
        print(probe_df.round(3).to_string(index=False), file=sys.stderr)
    print(show.to_string(index=False))
    hc = meta["host_conditioned"]
    print(f"\n{plural(summ['n_cases'], 'case')}: median |error| {summ['median_abs_error']:.1%}, "
          f"p90 {summ['p90_abs_error']:.1%}, max {summ['max_abs_error']:.1%}; pass-to-pass spread of the "
          f"measurement median {meta['pass_spread_median']:.1%}, p90 {meta['pass_spread_p90']:.1%}  -> {out}")
    if args.host_state == "per-pass":
        print(f"with the host state measured during the run (diagnostic): median |error| "
              f"{hc['median_abs_error']:.1%}, p90 {hc['p90_abs_error']:.1%}, max {hc['max_abs_error']:.1%}")
    for c in hc["cost_probe_errors"]:
        print(f"prefetch-sim: warning: executor cost probe of pass {c['pass']} failed: {c['error']}", file=sys.stderr)
    if failures:  # written above, for the record; the run still fails
        for msg in failures:
            print(f"prefetch-sim: error: losslessness: {msg}", file=sys.stderr)
        return 3
    return 0
