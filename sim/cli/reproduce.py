"""``prefetch-sim reproduce``: its flags and command (the comparison is :mod:`sim.views.reproduce`)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from sim.cli.benchflags import ascii_int
from sim.views.reproduce import REPORTED_CSV, compare, to_frame


def add_reproduce_parser(sub) -> None:
    p = sub.add_parser("reproduce", help="simulate the published A/B figures (data/reported_measurements.csv)")
    p.add_argument("-r", "--repetitions", type=ascii_int, default=2, help="routing draws per test (default 2)")
    p.add_argument("--out", help="also write the comparison as CSV here (missing folders are created)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_reproduce)


def cmd_reproduce(args: argparse.Namespace) -> int:
    from sim.atomic import check_output_path, write_atomic
    from sim.errors import PrefetchSimError, ScenarioError

    from sim.bounds import REPETITIONS_MAX

    if not 1 <= args.repetitions <= REPETITIONS_MAX:
        raise ScenarioError(f"must be between 1 and {REPETITIONS_MAX}, got {args.repetitions}",
                            field="-r/--repetitions")
    if args.out is not None:   # "" is an error, as the other commands' (not "no output")
        check_output_path(args.out)
        suffix = Path(args.out).suffix.lower()
        if suffix not in ("", ".csv"):
            raise ScenarioError(f"'{args.out}' ends in {suffix}, but reproduce writes CSV: give a .csv name",
                                field="--out")
    if args.out and REPORTED_CSV.is_file() and os.path.realpath(args.out) == os.path.realpath(REPORTED_CSV):
        raise ScenarioError(f"'{args.out}' is the published figures reproduce reads ({REPORTED_CSV}): the table "
                            "would replace it; give --out another path", field="--out")
    if not REPORTED_CSV.is_file():
        raise PrefetchSimError(f"{REPORTED_CSV} not found: `reproduce` needs the source checkout "
                               "(pip install -e . from a clone)")

    df = to_frame(compare(args.repetitions, quiet=getattr(args, "quiet", False)))
    if args.out:
        write_atomic(args.out, df.to_csv(index=False))
    show = df[["case", "metric", "variant", "reported", "simulated", "unit", "rel_error", "sign_ok", "status",
               "criterion"]].copy()
    show["rel_error"] = show["rel_error"].map(lambda x: "" if x != x else f"{x:+.1%}")
    show["simulated"] = show["simulated"].map(lambda x: "" if x != x else f"{x:.4g}")
    print(show.to_string(index=False))
    n = df.sign_ok.notna().sum()
    ok = df.status == "ok"
    by = ", ".join(f"{int((ok & (df.criterion == c)).sum())} {'in range' if c.startswith('in range') else c}"
                   for c in dict.fromkeys(df.criterion[ok]))
    print(f"\nsign of the difference to baseline agrees on {int(df.sign_ok.fillna(False).sum())} of {n} rows; "
          f"ok: {int(ok.sum())} of {int((df.status != 'not modelled').sum())} modelled rows ({by}); "
          "'sign': the sign right, the magnitude off by more than 10%")
    return 0
