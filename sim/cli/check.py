"""``prefetch-sim check``: its flags and command (the hazard checker is :mod:`sim.plan.hazards`)."""

from __future__ import annotations

import argparse

from sim.cli.benchflags import ascii_int
from sim.errors import PlacementError, ScenarioError
from sim.plan.hazards import HazardKind, append_slot_frees, check_plan, format_hazards
from sim.wording import plural


def cmd_check(args: argparse.Namespace) -> int:
    """``prefetch-sim check``: build each (variant, test) plan, report its hazards. Exit
    status 1 if any hazard, else 0. A variant that does not fit in VRAM is reported and skipped.

    Raises:
        PlacementError: no variant fits (naming the flags that cause a VRAM overflow, else the
            scenario's placement).
    """
    from sim.plan.builder import build_plan, make_context
    from sim.cli import check_plan_work, load_scenario_with_overrides, placement_error_in_flags
    from sim.views.crossover import parse_test
    from sim.engines.metrics import fit_context_to_tests, rep_rng

    if args.max_rows < 0:
        raise ScenarioError(f"must be >= 0, got {args.max_rows}", field="--max-rows")
    scn = load_scenario_with_overrides(args)
    tests = scn.workload.tests()
    chosen = []
    for name in dict.fromkeys(args.test or []):  # a test given twice is checked once
        match = [t for t in tests if t.name == name]
        t = match[0] if match else parse_test(name)
        chosen.append((tests.index(t) if t in tests else len(tests), t))
    if not chosen:
        chosen = list(enumerate(tests))
    # the context fits every chosen test, and the VRAM check of make_context sees it (as run's)
    scn = fit_context_to_tests(scn, [t for _, t in chosen] + list(tests))
    check_plan_work(scn, [t for _, t in chosen], args)
    total = 0
    built = 0
    first_err = None
    test_flags = [("--test", ",".join(args.test))] if args.test else []
    for variant in scn.variants:
        try:
            ctx = make_context(scn, variant, rep_rng(scn.seed, -1, -1))
        except PlacementError as exc:
            exc = placement_error_in_flags(exc, args, variant, test_flags)  # the flags that cause it, if any
            first_err = first_err or exc
            print(f"{variant.name}: skipped, {exc}")
            continue
        built += 1
        for ti, test in chosen:
            plan = build_plan(scn, variant, test, rep_rng(scn.seed, test, 0), ctx)
            if args.slot_frees:
                plan = append_slot_frees(plan)
            found = check_plan(plan)
            total += len(found)
            n_slot = sum(1 for op in plan.ops if op.slot >= 0)
            status = "no hazards" if not found else f"{len(found)} hazard(s)"
            print(f"{variant.name} / {test.name}: {plural(len(plan.ops), 'op')}, {plural(n_slot, 'slot op')}: {status}")
            if found:
                print(format_hazards(found, args.max_rows))
    if not built:
        if first_err is not None and first_err.file is None:  # caused by flags: name them
            raise PlacementError(f"no variant fits in VRAM, nothing to check: {first_err.reason}",
                                 field=first_err.field)
        raise PlacementError("no variant fits in VRAM: nothing to check", file=scn.file, field="placement")
    return 1 if total else 0


def add_check_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``prefetch-sim check`` on an argparse subparsers object."""
    from sim.cli import _add_bench_flags

    p = subparsers.add_parser(
        "check", help="hazard checker: staging-slot races, missing waits, use-after-free, cross-GPU slots, overruns",
        description="Build the plans of a scenario's variants and tests and report staging-slot hazards: "
                    + ", ".join(k.value for k in HazardKind) + ". Exit status 1 if any hazard is found.")
    _add_bench_flags(p, one_setting=True)
    p.add_argument("--test", action="append", help="test name (repeatable), e.g. pp512 or 'pp512 @ d8192', also one "
                                                   "that the scenario's workload does not list "
                                                   "(default: every test of the scenario)")
    p.add_argument("--slot-frees", action="store_true",
                   help="append a free of every staging slot after the last graph and check it too")
    p.add_argument("--max-rows", type=ascii_int, default=50, help="findings listed per plan (default 50)")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="accepted as the other commands take it; does nothing here: check draws no progress bar "
                        "(it prints a line per plan as it checks it)")
    p.set_defaults(func=cmd_check)
    return p
