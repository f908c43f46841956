"""``prefetch-sim calibrate``: measure a GPU with CuPy and write a hardware profile.

Self-contained plug-in of :mod:`sim.cli`: it only adds the subcommand; the work is done by
:mod:`calibrate.cli` (imported when the command runs; CuPy is imported later still, inside
the measurement, so ``prefetch-sim --help`` works without it).
"""

from __future__ import annotations

import argparse
import sys


def add_calibrate_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``calibrate`` subcommand to ``subparsers`` (from ``add_subparsers``)."""
    from calibrate.cli import add_arguments

    p = subparsers.add_parser(
        "calibrate", help="measure a GPU with CuPy and write a hardware profile (TOML + CSV tables)",
        description="Measure H2D/D2H copies, GEMMs, grouped expert GEMMs, attention and host overheads on "
                    "GPU 0 with CuPy, and write the profile that scenarios can name as their hardware.")
    add_arguments(p)
    p.set_defaults(func=cmd_calibrate)
    return p


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Run the calibration. Raises GPUUnavailableError (a PrefetchSimError, reported as one
    line by the CLI) when CuPy or a GPU is missing; nothing is written then."""
    from calibrate.cli import run_from_args

    return run_from_args(args, ["prefetch-sim", *sys.argv[1:]])
