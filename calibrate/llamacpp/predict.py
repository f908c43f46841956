"""Predict a llama-bench grid before it runs: ``python -m calibrate.llamacpp.predict GRID
--scenario SCENARIO --out DIR``.

Every ``[[run]]`` of a grid spec (:mod:`calibrate.llamacpp.grid`) is one ``prefetch-sim run``
of ``SCENARIO`` with the run's model TOML (``-m``) and its llama-bench arguments, written as
llama-bench JSONL to ``DIR/<run id>.jsonl`` (the rows the grid will measure, in llama-bench's
fields). The variants are the ones the run's prefetch-patch flags ask for (``-pw``, ``-pwg``,
``-pes``: :func:`sim.cli.benchflags.prefetch_combos`, one row per combination and test with its
``prefetch_*`` fields and ``speedup_vs_baseline``; the combinations the simulator does not model,
``-pw 1`` with ``-pes N``, are left out with a note: ``--skip-unmodelled``), else the baseline
only. Used for grids whose hardware is
not lent yet, e.g. the two-GPU grid (``grids/h200x2.toml`` on
``scenarios/h200x2-qwen3-30b-a3b.toml``), and for a prefetch grid before the patch is measured
(``grids/h200-prefetch.toml``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sim.errors import PrefetchSimError

from sim.cli.benchflags import PREFETCH_FLAGS
from sim.wording import plural

from .grid import load_grid

#: the prefetch patch's llama-bench options (a run with any of them names its own variants)
PREFETCH_OPTIONS = frozenset(o for _, opts, *_ in PREFETCH_FLAGS for o in opts)
#: the placement flags llama-bench runs with when a grid run leaves them out (its defaults:
#: ``cmd_params_defaults``), given to the prediction so that it is the run's, not the scenario's
#: placement: ``(options that set it, the default's words)``
LLAMA_BENCH_PLACEMENT_DEFAULTS = ((("-ngl", "--n-gpu-layers"), ("-ngl", "-1")),
                                  (("-ncmoe", "--n-cpu-moe"), ("-ncmoe", "0")),
                                  (("-lm", "--load-mode", "-mmp", "--mmap"), ("-lm", "auto")))


def predict_grid(grid: str | Path, scenario: str | Path, out: str | Path, *,
                 repetitions: int | None = None) -> list[Path]:
    """Write ``out/<run id>.jsonl`` for every bench run of ``grid``; returns the files. A placement
    flag a run leaves out takes llama-bench's default (:data:`LLAMA_BENCH_PLACEMENT_DEFAULTS`: the
    lease's llama-bench runs with it); the scenario gives the hardware and the rest, but the KV
    cache is sized as llama-bench sizes it (``--ctx-size 0``: the tests' depth + tokens). Each run is
    simulated at the ``-r`` llama-bench will run it with (the run's ``repetitions``, else the
    grid's: the first repetition captures the CUDA graphs, the rows' ``avg_ts`` is the mean of
    the repetitions' t/s), or at ``repetitions`` when given. Nothing is written unless every run
    is predicted: the files are made in a folder beside ``out`` and moved in at the end.

    Raises:
        ScenarioError: a bad grid or scenario, ``repetitions`` below 1, or a run the simulator
            refuses (naming the run).
    """
    import shutil
    import tempfile

    from sim import cli

    if repetitions is not None and repetitions < 1:
        raise PrefetchSimError(f"-r/--repetitions {repetitions}: at least 1")
    spec = load_grid(grid)
    repo = Path(__file__).resolve().parents[2]  # the checkout the grid's model paths are relative to
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        made = []
        for run in spec.runs:
            if run.kind != "bench":
                continue
            model = spec.model(run.model)
            path = work / f"{run.id}.jsonl"
            toml = Path(model.toml)
            if not toml.is_absolute() and not toml.is_file():
                toml = repo / model.toml
            variants = ["--skip-unmodelled"] if PREFETCH_OPTIONS & set(run.args) else ["--variant", "baseline"]
            defaults = [w for opts, words in LLAMA_BENCH_PLACEMENT_DEFAULTS if not set(opts) & set(run.args)
                        for w in words]
            reps = repetitions or run.repetitions or spec.repetitions
            # the KV cache sized as llama-bench sizes it (each test's depth + tokens), not to the
            # scenario's what-if context
            argv = ["run", str(scenario), "-m", str(toml), *run.args, *defaults, "-r", str(reps), "-o", "jsonl",
                    *variants, "--ctx-size", "0", "-q", "--out", str(path)]
            if cli.main(argv) != 0:
                raise PrefetchSimError(f"run '{run.id}' of {grid}: prefetch-sim refused it (message above); "
                                       f"nothing written to {out}")
            made.append(path)
        out.mkdir(exist_ok=True)
        files = []
        for path in made:
            dest = out / path.name
            path.replace(dest)
            files.append(dest)
        return files
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point; 2 with a one-line message on a bad input."""
    ap = argparse.ArgumentParser(prog="python -m calibrate.llamacpp.predict", description=__doc__.split("\n\n")[0])
    ap.add_argument("grid", help="grid spec TOML (calibrate/llamacpp/grids/*.toml)")
    ap.add_argument("--scenario", required=True,
                    help="scenario TOML giving the hardware (a placement flag a run leaves out takes llama-bench's "
                         "default, -ngl -1 -ncmoe 0 -lm auto, as the lease's llama-bench runs it)")
    ap.add_argument("--out", required=True, help="folder for <run id>.jsonl")
    ap.add_argument("-r", "--repetitions", type=int, default=None,
                    help="llama-bench repetitions to simulate per row (default: each run's -r as the grid gives it, "
                         "as the lease will run it)")
    args = ap.parse_args(argv)
    try:
        from sim.atomic import check_output_path

        check_output_path(args.out, "--out", directory=True)  # before any prediction
        files = predict_grid(args.grid, args.scenario, args.out, repetitions=args.repetitions)
    except PrefetchSimError as exc:
        print(f"predict: error: {exc}", file=sys.stderr)
        return 2
    print(f"{plural(len(files), 'run')} predicted -> {args.out}")
    return 0


if __name__ == "__main__":
    from sim.cli.interrupt import run_interruptible

    sys.exit(run_interruptible("predict", main))  # Ctrl-C / SIGTERM: one line, 130 / 143
