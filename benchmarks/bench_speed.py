"""Speed of the simulator (issue #17), each figure beside the reference code path, same run.

The reference is the tree of a git commit (default ``HEAD``: the last commit, i.e. the code
before an uncommitted change; after committing the change pass its parent, ``--ref HEAD~1``),
extracted read-only with ``git archive`` into a temporary folder and run with ``PYTHONPATH``
pointing at it. Figures (median of ``--repeat`` runs, wall seconds on this machine):

* ``run``: ``prefetch-sim run -q`` on scenarios/default.toml (its worker processes included).
* ``crossover``: ``prefetch-sim crossover --figure <F> -q`` for the figures of ``--figures``
  (default ``a,b,c``: figure d is a decode sweep with an expert cache, which the memoisation
  does not cover and which takes minutes on the reference; ``--figures all`` for all four).
* ``split evals/s``: splits of a pp8192 plan of the default (MoE) scenario, baseline variant,
  divided by the wall time of evaluating it end to end (build, price, time, transfer
  statistics: ``run_variant_test`` with one repetition), in one process, after a pp512 call
  (kernel tables). Two figures: the *cold* call, with the contexts kept across calls dropped
  first (``sim.engines.metrics.clear_shared_contexts``: placement, router, items, prices and graph
  templates built anew, as every call did before they were kept), and the *warm* call, a
  second call on the same scenario object that reuses the previous call's context (its
  structure and prices; the routing draws, the timing of every graph and the transfer
  statistics are done again). A reference tree without kept contexts times two cold calls.
* ``DES events/s``: plan ops per second of the DES engine on a pp512 plan of the default
  scenario (``sim.engines.des.run`` on priced durations), and the same for a raw SimPy loop
  over the same ops (one ``timeout`` per op, one process per queue, nothing else); the ratio
  is the figure of merit. "events/s" counts plan ops in both columns, whatever the number of
  SimPy events behind them: the DES plays a run of consecutive ops that need not wait under
  one timeout (see :mod:`sim.engines.des`), so the table also gives the op count and the
  SimPy events each side scheduled, counted in a separate untimed run as the calls of
  ``simpy.Environment.schedule`` (timeouts, triggered events, and each process's start and
  end: the raw loop schedules one per op plus two per queue).
* The two trees are timed in turn, the order turned round every run (new, ref, ref, new, ...), so
  that a drift in this machine's load falls on both; each figure is the median over the runs.
* ``peak RSS pp131072``: the largest resident set of the processes of
  ``prefetch-sim run -p 131072 -n 0 -r 1 --variant baseline -q`` (MB, 10**6 bytes).

Usage::

    PYTHONPATH=. python benchmarks/bench_speed.py [--ref HEAD] [--repeat 3] [--figures a,b,c] [--skip run,crossover,rss]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_INNER = r"""
import json, sys, time
import numpy as np
try:  # the layout of sim/ since the subpackages (a reference tree may predate them)
    from sim.model.specs import load_scenario, BenchTest, parse_variant
    from sim.engines import metrics as _metrics
    from sim.plan.builder import build_plan, make_context
    from sim.model.costs import plan_durations
except ImportError:
    from sim.specs import load_scenario, BenchTest, parse_variant
    from sim import metrics as _metrics
    from sim.builder import build_plan, make_context
    from sim.costs import plan_durations
fit_context_to_tests, rep_rng = _metrics.fit_context_to_tests, _metrics.rep_rng
import inspect
if "test_index" in inspect.signature(_metrics.run_variant_test).parameters:  # a tree before 1ec2293
    def run_variant_test(scn, v, t, reps):
        return _metrics.run_variant_test(scn, v, t, 0, reps)
else:
    def run_variant_test(scn, v, t, reps):
        return _metrics.run_variant_test(scn, v, t, reps)
what = sys.argv[1]
scn = load_scenario("scenarios/default.toml")
if what == "splits":
    t = BenchTest(8192, 0)
    scn = fit_context_to_tests(scn, [t])
    v = parse_variant("baseline")
    plan = build_plan(scn, v, t, rep_rng(scn.seed, 0, 0), make_context(scn, v, rep_rng(scn.seed, -1, -1)))
    n_splits = len({(o.graph, o.split) for o in plan.ops})
    # a tree without contexts kept across calls: every call is cold
    clear = getattr(_metrics, "clear_shared_contexts", lambda: None)
    # warm the kernel tables; one timed repetition, checked (a call that timed none would be free)
    assert len(run_variant_test(scn, v, BenchTest(512, 0), 1).tps) == 1
    times, warm = [], []
    for _ in range(int(sys.argv[2])):
        clear()  # cold: nothing of this scenario kept from an earlier call
        t0 = time.perf_counter()
        run_variant_test(scn, v, t, 1)
        times.append(time.perf_counter() - t0)
    for _ in range(int(sys.argv[2])):
        t0 = time.perf_counter()  # warm: the context of the previous call of the same scenario
        run_variant_test(scn, v, t, 1)
        warm.append(time.perf_counter() - t0)
    print(json.dumps({"splits": n_splits, "s": sorted(times)[len(times) // 2],
                      "warm_s": sorted(warm)[len(warm) // 2]}))
elif what == "des":
    import simpy
    from sim.engines import des
    v = parse_variant("baseline")
    t = BenchTest(512, 0)
    plan = build_plan(scn, v, t, rep_rng(scn.seed, 0, 0))
    d = plan_durations(plan, scn.hardware)
    queues = {}
    for o in plan.ops:
        queues.setdefault(o.queue, []).append(float(d[o.id]))
    def raw():
        env = simpy.Environment()
        def proc(ds):
            for x in ds:
                yield env.timeout(x)
        for ds in queues.values():
            env.process(proc(ds))
        env.run()
    # SimPy events scheduled by each (untimed): every call of Environment.schedule
    import simpy.core
    schedule = simpy.core.Environment.schedule
    scheduled = [0]
    def counting(self, *args, **kw):
        scheduled[0] += 1
        return schedule(self, *args, **kw)
    simpy.core.Environment.schedule = counting
    try:
        des.run(plan, d)
        des_events, scheduled[0] = scheduled[0], 0
        raw()
        raw_events = scheduled[0]
    finally:
        simpy.core.Environment.schedule = schedule
    des_t, raw_t = [], []
    for _ in range(int(sys.argv[2])):
        t0 = time.perf_counter(); des.run(plan, d); des_t.append(time.perf_counter() - t0)
        t0 = time.perf_counter(); raw(); raw_t.append(time.perf_counter() - t0)
    n = len(plan.ops)
    print(json.dumps({"events": n, "des_events": des_events, "raw_events": raw_events,
                      "des_s": sorted(des_t)[len(des_t) // 2], "raw_s": sorted(raw_t)[len(raw_t) // 2]}))
"""

_RSS = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")


def _env(tree: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)
    return env


def _wall(tree: Path, args: list[str], repeat: int) -> float:
    """Median wall seconds of ``python -m sim <args>`` run in ``tree``."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "sim", *args], cwd=tree, env=_env(tree), check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _alternating(fn, trees: dict, rounds: int) -> dict:
    """``fn(tree)`` for each tree, ``rounds`` times, the trees taken in turn and the order turned
    round every round (new, ref, ref, new, ...), so that a drift in the machine's load falls on
    both trees alike; per tree key, the list of results in run order."""
    out = {k: [] for k in trees}
    keys = list(trees)
    for i in range(rounds):
        for k in (keys if i % 2 == 0 else keys[::-1]):
            out[k].append(fn(trees[k]))
    return out


def _inner_alternating(trees: dict, what: str, rounds: int, calls: int = 5) -> dict:
    """:func:`_inner` per tree in alternating rounds (:func:`_alternating`), ``calls`` timed calls
    per round; per tree, every figure the median over the rounds (counts: the first round's)."""
    runs = _alternating(lambda t: _inner(t, what, calls), trees, rounds)
    out = {}
    for k, rs in runs.items():
        out[k] = {f: (statistics.median(r[f] for r in rs) if f.endswith("_s") or f == "s" else rs[0][f])
                  for f in rs[0]}
    return out


def _inner(tree: Path, what: str, repeat: int) -> dict:
    out = subprocess.run([sys.executable, "-c", _INNER, what, str(repeat)], cwd=tree, env=_env(tree), check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _rss_mb(tree: Path, args: list[str]) -> float:
    out = subprocess.run([sys.executable, "-c", _RSS, sys.executable, "-m", "sim", *args], cwd=tree, env=_env(tree),
                         check=True, capture_output=True, text=True)
    return int(out.stdout.strip().splitlines()[-1]) * 1024 / 1e6  # ru_maxrss is KiB on Linux


def extract(ref: str, dest: Path) -> Path:
    """The tree of commit ``ref`` under ``dest`` (``git archive``: the repository is not touched)."""
    arc = subprocess.run(["git", "archive", ref], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=arc, check=True)
    return dest


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ref", default="HEAD", help="reference commit (default HEAD)")
    p.add_argument("--repeat", type=int, default=3, help="runs per figure, median (default 3)")
    p.add_argument("--figures", default="a,b,c", help="crossover figures timed (default a,b,c; 'all')")
    p.add_argument("--skip", default="", help="comma list of rows to skip: run,crossover,splits,des,rss")
    args = p.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    figs = ["a", "b", "c", "d"] if args.figures == "all" else args.figures.split(",")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_speed_ref_") as tmp:
        ref = extract(args.ref, Path(tmp))
        trees = {"new": ROOT, "ref": ref}
        if "run" not in skip:
            r = {k: statistics.median(v) for k, v in
                 _alternating(lambda t: _wall(t, ["run", "scenarios/default.toml", "-q"], 1), trees, args.repeat).items()}
            rows.append(("prefetch-sim run (default scenario), s", r["new"], r["ref"], "<= 2.5"))
        if "crossover" not in skip:
            r = {}
            for k, t in trees.items():
                r[k] = sum(_wall(t, ["crossover", "--figure", f, "--out", str(Path(tmp) / f"xo_{k}"), "-q"],
                                 1 if k == "ref" else args.repeat) for f in figs)
            rows.append((f"crossover --figure {','.join(figs)}, s", r["new"], r["ref"],
                         "<= 20 (all four)"))
        if "splits" not in skip:
            r = _inner_alternating(trees, "splits", args.repeat)
            rows.append(("pp8192 MoE plan, split evals/s, cold call", r["new"]["splits"] / r["new"]["s"],
                         r["ref"]["splits"] / r["ref"]["s"], ">= 1e6"))
            rows.append(("pp8192 MoE plan, split evals/s, warm call", r["new"]["splits"] / r["new"]["warm_s"],
                         r["ref"]["splits"] / r["ref"]["warm_s"], ">= 1e6"))
        if "des" not in skip:
            r = _inner_alternating(trees, "des", args.repeat)
            for k in r:
                r[k]["ratio"] = r[k]["raw_s"] / r[k]["des_s"]
            rows.append(("DES plan ops (pp512, default scenario)", r["new"]["events"], r["ref"]["events"], ""))
            rows.append(("DES SimPy events scheduled", r["new"]["des_events"], r["ref"]["des_events"], ""))
            rows.append(("raw SimPy events scheduled", r["new"]["raw_events"], r["ref"]["raw_events"], ""))
            rows.append(("DES events/s (plan ops/s)", r["new"]["events"] / r["new"]["des_s"],
                         r["ref"]["events"] / r["ref"]["des_s"], ""))
            rows.append(("raw SimPy events/s (plan ops/s)", r["new"]["events"] / r["new"]["raw_s"],
                         r["ref"]["events"] / r["ref"]["raw_s"], ""))
            rows.append(("DES / raw SimPy", r["new"]["ratio"], r["ref"]["ratio"], ">= 0.6"))
        if "rss" not in skip:
            cmd = ["run", "scenarios/default.toml", "-p", "131072", "-n", "0", "-r", "1", "--variant", "baseline", "-q"]
            r = {k: _rss_mb(t, cmd) for k, t in trees.items()}
            rows.append(("pp131072 run, peak RSS, MB", r["new"], r["ref"], "<= 300"))
    print(f"reference: {args.ref}; median of {args.repeat} runs, the two trees in alternating order (run, split "
          "evals and DES: each run the median of 5 calls; crossover reference: 1 run)")
    print(f"| {'figure':44s} | {'this tree':>12s} | {'reference':>12s} | {'ratio':>7s} | {'target':>16s} |")
    print(f"|{'-' * 46}|{'-' * 14}|{'-' * 14}|{'-' * 9}|{'-' * 18}|")
    for name, new, old, target in rows:
        print(f"| {name:44s} | {new:12.4g} | {old:12.4g} | {new / old:7.3g} | {target:>16s} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
