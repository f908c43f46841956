"""A measured llama-bench grid: the spec (TOML), a time estimate, and the runner.

A grid spec (``calibrate/llamacpp/grids/h200.toml``) names models (a shipped model TOML, the
GGUF the writer makes of it, an optional layer cut) and runs, each one llama-bench invocation
with llama-bench's own flags; llama-bench takes the cartesian product of its comma lists, so
one run gives several rows. Runs are ordered so that a model loads once per parameter set
(``-m -ngl -ncmoe -ot -lm`` force a reload; ``-ub -p -n -d -fa`` do not).

The runner writes, into a run folder:

* ``llama-bench.jsonl`` — llama-bench's ``-o jsonl`` rows exactly as it printed them;
* ``invocations.jsonl`` — one record per invocation (id, model TOML, GGUF, layers, the whole
  command line, environment, exit code, wall time, rows, peak VRAM, log file);
* ``logs/<id>.log`` — llama-bench's stderr (``-v``: buffer sizes per device);
* routing runs (``kind = "routing"``) go to ``routing.jsonl`` instead, with their
  ``prefetch-sim copy-log`` lines in the log (:mod:`calibrate.llamacpp.patches`).

A run already recorded with exit code 0 is skipped, so a grid can be resumed. An invocation
that fails or times out is recorded with its exit code and log and the grid goes on; its rows
(if any) are not added to the ground truth.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sim.bounds import REPETITIONS_MAX
from sim.errors import ScenarioError
from sim.tomlio import Fields, load_toml
from sim.wording import plural

#: the repository root: a grid's model TOML paths are relative to it (the lease reads them there)
REPO = Path(__file__).resolve().parents[2]

#: flags the runner sets itself (a spec must not)
RUNNER_FLAGS = ("-m", "--model", "-o", "--output", "-r", "--repetitions", "-oe", "--output-err")
#: flags that force a model reload in llama-bench (``../shared/LLAMACPP.md``)
MODEL_FLAGS = ("-m", "-ngl", "--n-gpu-layers", "-ncmoe", "--n-cpu-moe", "-sm", "-mg", "-ts", "-lm",
               "--load-mode", "-dev", "--no-host", "-ot", "--override-tensor", "-mmp")


@dataclass(frozen=True)
class GridModel:
    """A model of the grid.

    Attributes:
        key: short name used by runs and for the GGUF file (``<key>.gguf``).
        toml: the shipped model TOML the GGUF is written from (relative to the repo root).
        n_layer: blocks written (0 = all; fewer when the full model does not fit the disk).
        seed: seed of the writer's random weights.
    """

    key: str
    toml: str
    n_layer: int = 0
    seed: int = 0

    @property
    def gguf_name(self) -> str:
        return f"{self.key}.gguf"


@dataclass(frozen=True)
class GridRun:
    """One llama-bench invocation.

    Attributes:
        id: unique name (also the log file's).
        model: a :attr:`GridModel.key`.
        args: llama-bench flags other than ``-m -o -r`` (shlex-split).
        kind: ``"bench"`` (ground truth), ``"routing"`` (copy-log check, its own file) or
            ``"identity"`` (the prefetch patch's output identity check: ``args`` are
            ``psim-decode``'s flags, :mod:`calibrate.llamacpp.identity`).
        repetitions: ``-r`` (0 = the grid's).
        env: extra environment variables.
        variants: an identity run's prefetch variants in llama-bench's flags (``"-pw 1 -pwg 0"``).
    """

    id: str
    model: str
    args: tuple[str, ...]
    kind: str = "bench"
    repetitions: int = 0
    env: tuple[tuple[str, str], ...] = ()
    variants: tuple[str, ...] = ()


@dataclass(frozen=True)
class GridSpec:
    """A whole grid (see the module docstring).

    Attributes:
        name: label.
        repetitions: llama-bench ``-r`` (>= 5 for ground truth).
        timeout_s: wall limit of one invocation.
        models, runs: the grid.
        file: the TOML it came from.
        perf: the ``test-backend-ops perf`` runs made after the grid, in order (names of
            :data:`calibrate.llamacpp.lease.PERF_RUNS`); all of them (None) when the TOML does
            not say.
        perf_first: make the perf runs before the grid instead (after the GGUF writers ended,
            so the CPU is quiet), where the kernel tables matter more than the grid's last rows.
        perf_models: the model TOMLs (repository paths) whose shapes the perf runs time; empty:
            :data:`calibrate.llamacpp.perf_cases.LEASE_MODELS` (the ground truth's three).
        perf_weights_only: time only the weight matmuls and their cold cases
            (:func:`calibrate.llamacpp.perf_cases.weight_cases`), not the attention.
        canary: measure the host's DRAM read rate (``psim-membw``, about 1 s) before each
            llama-bench invocation, into ``run/canary.jsonl``: the CPU side of a decode with
            host-resident weights follows it, and on a shared host it moves between loads.
    """

    name: str
    repetitions: int
    timeout_s: float
    models: tuple[GridModel, ...]
    runs: tuple[GridRun, ...]
    file: str = ""
    perf: tuple[str, ...] | None = None
    perf_first: bool = False
    canary: bool = False
    perf_models: tuple[str, ...] = ()
    perf_weights_only: bool = False

    def model(self, key: str) -> GridModel:
        return next(m for m in self.models if m.key == key)


#: a grid's run ids and model keys name files (``logs/<id>.log``, ``<id>.jsonl``, ``<key>.gguf``):
#: letters, digits, ``.``, ``_`` and ``-``, not starting with ``.`` or ``-``
NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}", re.ASCII)


def name_problem(v: str) -> str | None:
    """Why ``v`` cannot be part of a file's name in a run folder (a run id, a model key, a report
    label), or None when it is a plain file name (:data:`NAME_RE`): no ``/``, ``..`` or spaces
    that would put a log, a prediction, a GGUF or a comparison outside its folder."""
    if NAME_RE.fullmatch(v):
        return None
    return f"{v!r} names files: use letters, digits, '.', '_' and '-' (at most 128, not starting with '.' or '-')"


def _check_name(fields, key: str) -> str:
    """The value of ``key`` (a run id or model key), refused (naming the field) unless it is a
    plain file name (:func:`name_problem`)."""
    v = fields.str(key)
    why = name_problem(v)
    if why:
        raise fields.error(key, why)
    return v


def load_grid(path: str | Path) -> GridSpec:
    """Read a grid spec TOML.

    Raises:
        ScenarioError: naming the file and field of a missing/invalid value, a duplicate id, a
            run of an unknown model, a run that sets a flag the runner sets (``-m -o -r``), or a
            bench run's flag that ``prefetch-sim run`` would refuse (:func:`check_bench_args`:
            naming the run's id and the flag, ``-ub 0``).
    """
    data = load_toml(path)
    f = Fields(data, path)
    g = f.sub("grid", required=True)
    name = g.str("name")
    reps = g.int("repetitions", 5, min=1, max=REPETITIONS_MAX)
    timeout = g.float("timeout_s", 600.0, positive=True)
    from .lease import PERF_RUNS  # (lease imports this module)

    names = tuple(r[0] for r in PERF_RUNS)
    perf_raw = g.raw("perf", list(names))
    if (not isinstance(perf_raw, list) or not all(isinstance(x, str) and x in names for x in perf_raw)
            or len(set(perf_raw)) != len(perf_raw)):
        raise g.error("perf", f"expected a list of distinct names from {list(names)}, got {perf_raw!r}")
    perf_first = g.bool("perf_first", False)
    canary = g.bool("canary", False)
    from sim.resources import shipped_root

    weights_only = g.bool("perf_weights_only", False)
    pm_raw = g.raw("perf_models", [])
    if not isinstance(pm_raw, list) or not all(isinstance(x, str) and x for x in pm_raw):
        raise g.error("perf_models", f"expected a list of model TOML paths, got {pm_raw!r}")
    for m in pm_raw:
        if not ((REPO / m).is_file() or (shipped_root() / m).is_file()):
            raise g.error("perf_models", f"model file not found: {REPO / m}")
    g.check_unknown()

    models: list[GridModel] = []
    for i, tbl in enumerate(f.raw("model", []) or []):
        mf = Fields(tbl, path, f"model[{i}]")
        models.append(GridModel(key=_check_name(mf, "key"), toml=mf.str("toml"), n_layer=mf.int("n_layer", 0, min=0),
                                seed=mf.int("seed", 0, min=0)))
        # the lease reads it from the repository's root; an installed wheel has it in its shipped files
        if not ((REPO / models[-1].toml).is_file() or (shipped_root() / models[-1].toml).is_file()):
            raise mf.error("toml", f"model file not found: {REPO / models[-1].toml}")
        mf.check_unknown()
    if not models:
        raise ScenarioError("a grid needs at least one [[model]]", file=path, field="model")
    keys = [m.key for m in models]
    if len(set(keys)) != len(keys):
        raise ScenarioError(f"duplicate model keys: {keys}", file=path, field="model")
    runs: list[GridRun] = []
    for i, tbl in enumerate(f.raw("run", []) or []):
        rf = Fields(tbl, path, f"run[{i}]")
        rid = _check_name(rf, "id")
        model = rf.str("model", choices=tuple(keys))
        try:
            args = tuple(shlex.split(rf.str("args")))
        except ValueError as exc:
            raise rf.error("args", f"cannot split: {exc}") from None
        bad = [a for a in args if a in RUNNER_FLAGS]
        if bad:
            raise rf.error("args", f"{', '.join(bad)} is set by the runner, not the spec")
        env_raw = rf.raw("env", {}) or {}
        if not isinstance(env_raw, dict) or not all(isinstance(v, str) for v in env_raw.values()):
            raise rf.error("env", "expected a table of strings")
        kind = rf.str("kind", "bench", choices=("bench", "routing", "identity"))
        variants: tuple[str, ...] = ()
        if kind != "identity":
            try:
                check_bench_args(args)
            except ValueError as exc:
                raise rf.error("args", f"run '{rid}': {exc}") from None
        if kind == "identity":
            from .identity import check_args, variant_env

            try:
                check_args(args)
            except ValueError as exc:
                raise rf.error("args", str(exc)) from None
            raw = rf.raw("variants", None)
            if not isinstance(raw, list) or not raw or not all(isinstance(v, str) for v in raw):
                raise rf.error("variants", "an identity run needs a list of prefetch variants, e.g. [\"-pw 1 -pwg 0\"]")
            envs = []
            for v in raw:
                try:
                    env = variant_env(v)
                except ValueError as exc:
                    raise rf.error("variants", f"{v!r}: {exc}") from None
                if env["GGML_SCHED_PREFETCH_WEIGHTS"] == "0" and env["GGML_SCHED_PREFETCH_EXPERT_SLOTS"] == "0":
                    raise rf.error("variants", f"{v!r} turns no prefetch on (it would compare off with off): "
                                               "give -pw 1 or -pes N >= 1")
                if env in envs:
                    raise rf.error("variants", f"{v!r} repeats an earlier variant")
                envs.append(env)
            variants = tuple(raw)
        if kind == "bench" and not expand(args):
            raise rf.error("args", "no llama-bench test (every -p, -n and -pg is 0)")
        runs.append(GridRun(id=rid, model=model, args=args, kind=kind,
                            repetitions=rf.int("repetitions", 0, min=0, max=REPETITIONS_MAX),
                            env=tuple(sorted(env_raw.items())),
                            variants=variants))
        rf.check_unknown()
    ids = [r.id for r in runs]
    dup = sorted({x for x in ids if ids.count(x) > 1})
    if dup:
        raise ScenarioError(f"duplicate run ids: {dup}", file=path, field="run")
    f.check_unknown()
    return GridSpec(name=name, repetitions=reps, timeout_s=timeout, models=tuple(models), runs=tuple(runs),
                    file=str(path), perf=tuple(perf_raw), perf_first=perf_first,
                    canary=canary, perf_models=tuple(pm_raw), perf_weights_only=weights_only)


# --------------------------------------------------------------------------------------
# llama-bench argument expansion (for estimates and checks; llama-bench itself does the runs)
# --------------------------------------------------------------------------------------


def _refusing_parser() -> argparse.ArgumentParser:
    """``prefetch-sim run``'s flag parser (:class:`sim.cli.Parser`: whole multi-letter flags,
    ``-bogus`` is not ``-b ogus``) raising ValueError instead of exiting."""
    from sim.cli import Parser

    class _Refuse(Parser):
        def error(self, message: str):  # noqa: D102 - argparse's hook
            raise ValueError(message)

    return _Refuse(add_help=False, prog="llama-bench")


#: flags ``prefetch-sim run`` adds to llama-bench's: refused in a grid's args
SIM_ONLY_FLAGS = ("--variant", "--engine", "--max-work", "--skip-unmodelled")


def check_bench_args(args: tuple[str, ...]) -> None:
    """Check a run's llama-bench flags as ``prefetch-sim run`` parses and range-checks them
    (llama-bench's flags, lists and ranges, glued values such as ``-ub0`` refused, the prefetch
    patch's ``-pw 0|1 -pwg N -pes N``, its harness flags; ``-b``/``-ub``/``-t`` >= 1 and
    ``-p``/``-n``/``-d``/``-pg``/``-b``/``-ub`` within the simulator's token bound, by
    :func:`sim.cli.benchflags.check_values`), so a grid that llama-bench would refuse, or that
    the simulator could not predict, is refused here, before a lease.

    Raises:
        ValueError: an unknown flag, a bad or out-of-range value (naming the flag), a stray word.
    """
    from sim.cli.benchflags import check_values, given_values, prefetch_combos

    ns = _parse_bench_args(args)
    ours = [a.split("=", 1)[0] for a in args if a.split("=", 1)[0] in SIM_ONLY_FLAGS]
    if ours:
        raise ValueError(f"{ours[0]} is a flag of prefetch-sim run, not of llama-bench (it would refuse it in the "
                         "lease)")
    try:
        check_values(given_values(ns))  # -ub 0, -b 0, -t 0, -p 2**30...: as prefetch-sim run checks them
        prefetch_combos(ns)  # -pw 0|1, as prefetch-sim run checks it
    except ScenarioError as exc:
        raise ValueError(f"{exc.field}: {exc.reason}") from None


def asked_values(args: Sequence[str]) -> dict[str, tuple[str, tuple]]:
    """What a recorded llama-bench command line (an invocation's ``args``, as the runner writes
    them, or a whole command with ``-m``, ``-r``, ``-o``) asks its rows to be: row field ->
    ``(flag, values)`` for the flags it gives (:func:`sim.cli.benchflags.asked_row_values`), parsed
    as :func:`check_bench_args` parses a grid's.

    Raises:
        ValueError: an unknown flag, a bad value (naming the flag), a stray word.
    """
    from sim.cli.benchflags import asked_row_values

    return asked_row_values(_parse_bench_args(args, output=True))


def asked_repetitions(args: Sequence[str]) -> int | None:
    """The ``-r`` a recorded llama-bench command line gives (each of its rows then has that many
    samples), or None without one.

    Raises:
        ValueError: as :func:`asked_values`.
    """
    return _parse_bench_args(args, output=True).repetitions


def _parse_bench_args(args: Sequence[str], *, output: bool = False) -> argparse.Namespace:
    """llama-bench flags parsed by ``prefetch-sim run``'s flag set (:func:`_refusing_parser`);
    ``output``: ``-o`` accepted too (a whole recorded command line).

    Raises:
        ValueError: an unknown flag, a bad value (naming the flag), a stray word.
    """
    from sim.cli.benchflags import add_bench_flags

    ap = _refusing_parser()
    add_bench_flags(ap)
    if output:
        ap.add_argument("-o", "--output")  # in a whole command line (the runner sets it)
    args = list(args)
    if output and args and os.path.basename(str(args[0])) in ("llama-bench", "llama-bench.exe"):
        args = args[1:]  # a whole command line pasted with the program's own name (./build/bin/llama-bench)
    ns, rest = ap.parse_known_args(args)
    if rest:
        raise ValueError(f"unknown llama-bench flag or stray value {rest[0]!r}")
    if ns.scenario is not None:
        raise ValueError(f"stray value {ns.scenario!r} (not a flag's value)")
    return ns


def _values(text: str) -> list[str]:
    """A llama-bench comma list with ``a-b*m`` / ``a-b+s`` ranges expanded (ints), else the items."""
    from sim.cli import _int_list

    try:
        return [str(v) for v in _int_list(text)]
    except Exception:
        return text.split(",")


def expand(args: tuple[str, ...]) -> list[dict[str, str]]:
    """The parameter combinations a llama-bench invocation runs, as ``{flag: value}`` dicts
    plus a ``test`` entry (``pp512``, ``tg128``; depth as ``@ d8192``), in no particular order.
    Flags without a value (``-v``) are ignored. Only the flags that set rows are expanded:
    ``-p -n -pg -d -ub -b -fa -ncmoe -ngl -lm -ot``, and the prefetch patch's ``-pw -pwg -pes``
    (:mod:`calibrate.llamacpp.prefetch_patch`; llama-bench runs every combination of them, also
    ``-pwg`` values with ``-pw 0``).

    Raises:
        ValueError: a flag that needs a value is last.
    """
    import itertools

    vals: dict[str, list[str]] = {}
    pairs: list[tuple[int, int]] = []  # -pg PP,TG: one pp+tg test each (repeatable)
    i = 0
    alias = {"--n-prompt": "-p", "--n-gen": "-n", "--n-depth": "-d", "--ubatch-size": "-ub", "--batch-size": "-b",
             "--flash-attn": "-fa", "--n-cpu-moe": "-ncmoe", "--n-gpu-layers": "-ngl", "--load-mode": "-lm",
             "--override-tensor": "-ot", "--prefetch-weights": "-pw", "--prefetch-gate": "-pwg",
             "--prefetch-experts-slots": "-pes"}
    while i < len(args):
        a = alias.get(args[i], args[i])
        if a in ("-p", "-n", "-d", "-ub", "-b", "-fa", "-ncmoe", "-ngl", "-lm", "-ot", "-t", "-pw", "-pwg", "-pes"):
            if i + 1 >= len(args):
                raise ValueError(f"{a} needs a value")
            v = args[i + 1]
            vals.setdefault(a, []).extend(v.split(",") if a == "-ot" else _values(v))
            i += 2
        elif a == "-pg":
            if i + 1 >= len(args):
                raise ValueError(f"{a} needs a value")
            pp, _, tg = args[i + 1].partition(",")
            pairs.append((int(pp), int(tg)))
            i += 2
        else:
            i += 1
    p = vals.pop("-p", ["512"])
    n = vals.pop("-n", ["128"])
    d = vals.pop("-d", ["0"])
    keys = sorted(vals)
    out = []
    for combo in itertools.product(*(vals[k] for k in keys)):
        base = dict(zip(keys, combo))
        for depth in d:
            for pp in p:
                if int(pp) > 0:
                    out.append({**base, "-d": depth, "test": f"pp{pp}" + (f" @ d{depth}" if int(depth) else "")})
            for tg in n:
                if int(tg) > 0:
                    out.append({**base, "-d": depth, "test": f"tg{tg}" + (f" @ d{depth}" if int(depth) else "")})
            for pp, tg in pairs:
                if pp > 0 or tg > 0:
                    out.append({**base, "-d": depth, "test": f"pp{pp}+tg{tg}" + (f" @ d{depth}" if int(depth) else "")})
    return out


def count_rows(spec: GridSpec, kind: str = "bench") -> int:
    """Rows the grid's runs of ``kind`` will print."""
    return sum(len(expand(r.args)) for r in spec.runs if r.kind == kind)


# --------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------


class VramSampler:
    """Peak GPU memory used while a program runs: one ``nvidia-smi --query-gpu=memory.used
    -lms INTERVAL`` process for the whole run (one process, not one per sample, so that the
    sampling barely touches the CPU that host-side decode runs on); ``peak_mib`` is None
    without nvidia-smi or when it printed nothing."""

    def __init__(self, interval_s: float = 0.5):
        self.interval_ms = max(int(interval_s * 1000), 100)
        self.peak_mib: int | None = None
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None
        self._exe = shutil.which("nvidia-smi")

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for ln in self._proc.stdout:
            try:
                v = max(int(x) for x in ln.replace(",", " ").split())
            except ValueError:
                continue
            self.peak_mib = v if self.peak_mib is None else max(self.peak_mib, v)

    def __enter__(self) -> VramSampler:
        if self._exe:
            try:
                self._proc = subprocess.Popen([self._exe, "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                               f"-lms={self.interval_ms}"], stdout=subprocess.PIPE,
                                              stderr=subprocess.DEVNULL, text=True)
            except OSError:
                self._proc = None
            else:
                self._thread = threading.Thread(target=self._read, daemon=True)
                self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        if self._thread is not None:
            self._thread.join(timeout=5)


def read_log(run_dir: str | Path, rel: str) -> str:
    """The text of a run folder's log ``rel`` (``logs/<id>.log``): the file, or its member of
    ``logs.tar.gz`` (how a committed run keeps its logs); :func:`calibrate.llamacpp.logs.read_run_log`.

    Raises:
        FileNotFoundError: in neither place.
    """
    from .logs import read_run_log

    return read_run_log(run_dir, rel)


def pack_logs(run_dir: str | Path) -> Path:
    """Move a run folder's ``logs/`` into ``logs.tar.gz`` (how runs are committed: llama-bench's
    ``-v`` logs compress ~30x); returns the archive."""
    import tarfile

    run_dir = Path(run_dir)
    arc = run_dir / "logs.tar.gz"
    tmp = arc.with_name(arc.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tf:
        tf.add(run_dir / "logs", arcname="logs")
    tmp.replace(arc)
    shutil.rmtree(run_dir / "logs")
    return arc


def done_ids(out_dir: str | Path) -> set[str]:
    """Ids of runs recorded in ``invocations.jsonl`` with exit code 0."""
    p = Path(out_dir) / "invocations.jsonl"
    if not p.is_file():
        return set()
    ids = set()
    for ln in p.read_text().splitlines():
        try:
            rec = json.loads(ln)
        except ValueError:
            continue
        if rec.get("rc") == 0:
            ids.add(rec["id"])
    return ids


def _append(path: Path, lines: list[str]) -> None:
    with open(path, "a") as fh:
        for ln in lines:
            fh.write(ln.rstrip("\n") + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def run_one(run: GridRun, spec: GridSpec, bench: str | Path, models_dir: str | Path, out_dir: str | Path,
            *, repetitions: int | None = None, say=print, timeout_s: float | None = None) -> dict:
    """Run one invocation and record it (see the module docstring); returns its record.
    ``timeout_s`` (default: the spec's) bounds its wall time; past it the process is killed
    and the run recorded with exit code 124."""
    out = Path(out_dir)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    m = spec.model(run.model)
    gguf = Path(models_dir) / m.gguf_name
    reps = run.repetitions or repetitions or spec.repetitions
    cmd = [str(bench), "-m", str(gguf), *run.args, "-r", str(reps), "-o", "jsonl", "-v"]
    log = out / "logs" / f"{run.id}.log"
    env = {**os.environ, **dict(run.env)}
    rec = {"id": run.id, "kind": run.kind, "model": m.key, "model_toml": m.toml, "gguf": m.gguf_name,
           "n_layer": m.n_layer, "args": list(run.args), "repetitions": reps, "cmd": cmd,
           "env": dict(run.env), "log": f"logs/{run.id}.log",
           "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if not gguf.is_file():
        rec.update(rc=-1, error=f"GGUF not found: {gguf}", wall_s=0.0, rows=0)
        _append(out / "invocations.jsonl", [json.dumps(rec)])
        say(f"[grid] {run.id}: GGUF not found: {gguf}")
        return rec
    t0 = time.monotonic()
    rows: list[str] = []
    with open(log, "w") as err, VramSampler() as vram:
        err.write("$ " + shlex.join(cmd) + "\n")
        err.flush()
        try:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, env=env, text=True,
                                  timeout=timeout_s or spec.timeout_s)
            rc, stdout = proc.returncode, proc.stdout
        except subprocess.TimeoutExpired as exc:
            rc = 124
            stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
    bad = 0
    for ln in stdout.splitlines():
        ln = ln.strip()
        if not ln.startswith("{"):
            continue
        try:
            json.loads(ln)
        except ValueError:
            bad += 1
            continue
        rows.append(ln)
    rec.update(rc=rc, wall_s=round(time.monotonic() - t0, 2), rows=len(rows), malformed_lines=bad,
               peak_vram_mib=vram.peak_mib, expected_rows=len(expand(run.args)))
    if rc == 0 and rows:
        _append(out / ("routing.jsonl" if run.kind == "routing" else "llama-bench.jsonl"), rows)
    elif rc == 0:
        rec["rc"] = rc = -2
        rec["error"] = "llama-bench printed no row"
    if rc != 0:
        rec.setdefault("error", "timed out" if rc == 124 else f"llama-bench exited {rc}")
        say(f"[grid] {run.id}: {rec['error']}; log: {log}")
    else:
        say(f"[grid] {run.id}: {len(rows)} rows in {rec['wall_s']:.1f} s (peak VRAM {vram.peak_mib} MiB)")
    _append(out / "invocations.jsonl", [json.dumps(rec)])
    return rec


def run_grid(spec: GridSpec, bench: str | Path, models_dir: str | Path, out_dir: str | Path, *,
             only: set[str] | None = None, deadline_at: float | None = None, say=print,
             repetitions: int | None = None, before=None) -> list[dict]:
    """Run every run of ``spec`` not yet done (routing runs first, then in spec order), until
    ``deadline_at`` (``time.monotonic()``) if given (a run started before it is cut at it, with
    at least 30 s); returns the new records. ``before(run)``, if given, is called before each
    bench run (the lease's host-rate canary); it must not raise."""
    done = done_ids(out_dir)
    order = [r for r in spec.runs if r.kind == "routing"] + [r for r in spec.runs if r.kind != "routing"]
    recs = []
    for run in order:
        if run.id in done or (only and run.id not in only):
            continue
        if deadline_at is not None and time.monotonic() > deadline_at:
            say(f"[grid] deadline reached before {run.id}; {plural(len(recs), 'run')} done this time")
            break
        limit = None if deadline_at is None else min(spec.timeout_s, max(30.0, deadline_at - time.monotonic()))
        if run.kind == "identity":
            from .identity import run_identity

            recs.append(run_identity(run, spec, Path(bench).with_name("psim-decode"), models_dir, out_dir, say=say,
                                     timeout_s=limit))
            continue
        if before is not None and run.kind == "bench":
            before(run)
        recs.append(run_one(run, spec, bench, models_dir, out_dir, say=say, repetitions=repetitions, timeout_s=limit))
    return recs
