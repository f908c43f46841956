"""Command line of the calibration: ``python -m calibrate --out scenarios/hardware/NAME.toml``
(also ``prefetch-sim calibrate``, through :mod:`sim.cli.calibrate`)."""

from __future__ import annotations

import argparse
import datetime as _dt
import shlex
import sys
import time
from pathlib import Path

from sim.errors import PrefetchSimError


def _nonneg_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got '{text}'") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The calibration's options, shared by both entry points."""
    p.add_argument("--out", required=True,
                   help="profile to write, e.g. scenarios/hardware/h200.toml; its tables go to the folder "
                        "named like the file without .toml (scenarios/hardware/h200/)")
    p.add_argument("--name", help="profile name (default: the file name without .toml)")
    p.add_argument("--raw-dir", help="folder for the raw logs (default: data/calibration/NAME-YYYYMMDD; "
                                     "'none' to skip)")
    p.add_argument("--rounds", type=int, default=3,
                   help="repeat the key numbers (copy sweeps, a reference GEMM) this many times (default 3); "
                        "the executor's cost probes: --executor-rounds")
    p.add_argument("--executor-rounds", type=int, default=6,
                   help="rounds of the executor's own cost probes (launch, host work, busy host, matvec), "
                        "2 s apart, priced by their mean (default 6; about 12 s each)")
    p.add_argument("--quick", action="store_true", help="a tiny sweep (seconds; for checking the setup)")
    p.add_argument("--seed", type=_nonneg_int, default=0, help="seed of the input data and routing draws (>= 0)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar (the stage timings and the summary still print)")
    p.add_argument("--fake-gpu", action="store_true",
                   help="use a numpy stand-in for CuPy (runs on a CPU; the numbers are meaningless)")


#: ``[hardware] gpu_name`` of a profile written with ``--fake-gpu`` (:mod:`calibrate._fakecupy`)
FAKE_GPU_NAME = "FakeGPU (numpy stand-in)"


def _refuse_fake_over_measured(out: Path) -> None:
    """Refuse a ``--fake-gpu`` calibration whose ``--out`` holds a profile measured on a GPU (a
    shipped one such as ``scenarios/hardware/h200.toml``, or a user's): its numbers are
    meaningless and every scenario that names the profile would run on them. Replacing an
    earlier ``--fake-gpu`` profile is fine.

    Raises:
        PrefetchSimError: ``out`` exists and is not a ``--fake-gpu`` profile.
    """
    if not out.exists():
        return
    import tomllib  # noqa: PLC0415

    try:
        hw = tomllib.loads(out.read_text(encoding="utf-8")).get("hardware")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        hw = None
    gpu = hw.get("gpu_name") if isinstance(hw, dict) else None
    if gpu != FAKE_GPU_NAME:
        what = f"a profile measured on {gpu}" if isinstance(gpu, str) and gpu else "a file that is no --fake-gpu profile"
        raise PrefetchSimError(f"--out: '{out}' holds {what}; --fake-gpu's numbers are meaningless and would replace "
                               "it (and its tables): write the stand-in's profile to another file")


def run_from_args(args: argparse.Namespace, argv_for_record: list[str] | None = None) -> int:
    """Run the calibration described by parsed ``args``; prints a summary table last.

    Returns the exit status (0).

    Raises:
        GPUUnavailableError: no CuPy or no GPU (nothing is written).
    """
    from .run import Sweep, dump_raw, fit_calibration, run_calibration, summary_table, write_calibration  # noqa: PLC0415

    if args.rounds < 1:
        raise PrefetchSimError(f"--rounds must be >= 1, got {args.rounds}")
    if args.executor_rounds < 1:
        raise PrefetchSimError(f"--executor-rounds must be >= 1, got {args.executor_rounds}")
    out = Path(args.out)
    if out.suffix != ".toml":
        raise PrefetchSimError(f"--out must name a .toml file, got '{args.out}'")
    from sim.atomic import check_output_path  # noqa: PLC0415

    check_output_path(out)
    if args.fake_gpu:
        _refuse_fake_over_measured(out)
    name = out.stem if args.name is None else args.name
    if name in ("", ".", "..") or Path(name).name != name or "\\" in name:
        # the raw logs' folder is data/calibration/NAME-YYYYMMDD: a name is one path component
        raise PrefetchSimError(f"--name must be one file-name component (no '/', '\\' or '..'), got {name!r}")
    day = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d")
    if args.raw_dir is None:
        raw = Path("data/calibration") / f"{name}-{day}"
    elif args.raw_dir.lower() == "none":
        raw = None
    else:
        raw = Path(args.raw_dir)
    # fail before a minute of measuring, not after: the tables folder and the raw folder
    check_output_path(out.with_suffix(""), "--out (its tables folder)", directory=True)
    if raw is not None:
        check_output_path(raw, "--raw-dir", directory=True)
        if raw.is_dir() and any(raw.iterdir()):
            # another run's raw logs (fresh-user round 12: --raw-dir over the shipped H200 logs
            # replaced them with the stand-in's): two runs' files would mix
            raise PrefetchSimError(f"--raw-dir: '{raw}' already holds files (another calibration's raw logs?); "
                                   "give an empty or new folder")
    cp = None
    if args.fake_gpu:
        from . import _fakecupy as cp  # noqa: PLC0415
    command = " ".join(shlex.quote(a) for a in (argv_for_record if argv_for_record is not None else sys.argv))
    t0 = time.perf_counter()
    cal = run_calibration(name, sweep=Sweep.quick() if args.quick else Sweep.full(), rounds=args.rounds, cp=cp,
                          seed=args.seed, progress=not args.quiet, command=command)
    try:
        paths = write_calibration(cal, out, raw)
    except Exception:
        rescue = raw if raw is not None else out.parent / f"{name}-unfitted"
        try:
            dump_raw(cal, rescue)
            print(f"calibrate: writing the profile failed; raw tables saved to {rescue}", file=sys.stderr)
        except OSError as exc:
            print(f"calibrate: writing the profile failed, and saving the raw tables to {rescue} too ({exc})",
                  file=sys.stderr)
        raise
    if not args.quick:
        # the executor's launch cost per op kind, priced with the profile just written
        from sim.model.specs import load_hardware  # noqa: PLC0415

        from .executor_costs import measure, rounds_frame, summary, update_profile  # noqa: PLC0415

        costs = measure(load_hardware(out), cp=cp, rounds=args.executor_rounds)
        update_profile(out, costs, cal.info.get("device", ""))
        print("executor costs:\n" + summary(costs), file=sys.stderr)
        if raw is not None:
            from sim.atomic import write_atomic  # noqa: PLC0415

            write_atomic(Path(raw) / "executor_costs.txt", summary(costs) + "\n")
            per_round = rounds_frame(costs)
            if per_round is not None:
                write_atomic(Path(raw) / "executor_costs_rounds.csv", per_round.to_csv(index=False))
    for p in paths:
        print(f"wrote {p}", file=sys.stderr)
    print(summary_table(cal, fit_calibration(cal)))
    print(f"elapsed: {time.perf_counter() - t0:.1f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m calibrate``."""
    ap = argparse.ArgumentParser(prog="python -m calibrate",
                                 description="Measure a GPU and its host with CuPy and write a hardware profile.")
    add_arguments(ap)
    args = ap.parse_args(argv)
    try:
        return run_from_args(args, ["python", "-m", "calibrate", *(sys.argv[1:] if argv is None else argv)])
    except PrefetchSimError as exc:
        print(f"calibrate: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"calibrate: error: cannot write '{exc.filename}': {exc.strerror or exc}", file=sys.stderr)
        return 2
