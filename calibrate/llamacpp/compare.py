"""Predicted vs measured llama-bench t/s: the simulator against real llama.cpp runs.

A run folder (``data/llamacpp/h200-YYYYMMDD/``) holds:

* ``llama-bench.jsonl``: llama-bench's rows exactly as it printed them (``-o jsonl``; one row
  per test and parameter combination, its ``-r`` repetitions in ``samples_ns``/``samples_ts``);
* ``invocations.jsonl``: one object per llama-bench invocation, at least ``gguf`` (the GGUF's
  file name) and ``model_toml`` (the simulator's model file; relative to the run folder, the
  current folder, the repository root or the shipped files), optionally ``n_layer`` (a GGUF trimmed to fewer
  layers than the TOML), ``id``, ``args``, ``rc``, ``log``, ``rows``;
* ``meta.json``: provenance (kept in ``attrs["meta"]`` of the result).

:func:`compare` maps each measured row to its model (the basename of ``model_filename`` is an
invocation's ``gguf``), cuts the model to the GGUF's layers, builds the row's scenario (hardware
profile as given; placement, workload and test from the row through :mod:`sim.views.llamabench`;
uniform routing; the scheduler variant the row ran: ``baseline`` for an upstream llama-bench, the
prefetch patch's ``-pw``/``-pwg``/``-pes`` as :func:`sim.views.llamabench.row_variant` names them),
predicts it with
:func:`sim.engines.metrics.run_scenario` and returns one row per measured row with the relative error
``predicted / measured - 1``. Nothing is fitted to the measurements.

CLI::

    python -m calibrate.llamacpp.compare RUN_DIR [--hardware H] [--out CSV] [--figure PNG]
        [--summary MD] [--jobs N] [--repetitions 3] [--engine analytic|des] [-q]

Cost: the analytic engine spends most of a row building its plans (one graph per ubatch of a
prompt and per generated token, times the layers, times the routing draws). Measured on the
development VM (2 vCPUs that together run about one core's worth of Python), one row of a full
48-layer Qwen3-30B-A3B takes 0.4 s for pp512, 0.7 s for pp2048 and 10–14 s for tg128 (3
draws); a 62-layer Gemma-3-27B tg128 3.6 s (a dense model is simulated once: it draws no
routing; 11 s with 3 identical draws). Rows run in parallel processes (``jobs``), longest first, and each distinct
scenario once (decode rows that differ only in ``-ub``/``-b`` share one): 116 rows of those two
models (44 of them tg128) took 3 min 44 s there, jobs=2.
"""

from __future__ import annotations

import argparse
import json
import math
import numbers
import os
import sys
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PureWindowsPath
from typing import Any

import numpy as np
import pandas as pd

from sim.bounds import check_text_input
from sim.errors import PrefetchSimError, ScenarioError
from sim.cli.benchflags import (SIMULATED_CPU_INFO, check_main_gpu, default_threads, hardware_backend,
                                threads_unmodelled)
from sim.views.llamabench import (UNMODELLED, RowTerms, kv_context_error, model_with_kv, prefetch_settings,
                             read_llama_bench, row_placement, row_terms, unmodelled_kind,
                             row_variant, row_workload)
from sim.model.specs import BenchTest, HardwareProfile, ModelSpec, Placement, Scenario, load_hardware, load_model, \
    parse_variant
from sim.wording import plural

ROOT = Path(__file__).resolve().parents[2]

#: files of a run folder
BENCH_FILE, INVOCATIONS_FILE, META_FILE = "llama-bench.jsonl", "invocations.jsonl", "meta.json"
#: the default hardware profile (relative to the repository root when not found from the
#: current folder)
DEFAULT_HARDWARE = "scenarios/hardware/h200-llamacpp.toml"

#: regimes of a measured row (:func:`regime`)
REGIMES = (
    "resident",               # no host-resident weight (token_embd's get_rows aside)
    "copy_bound_prefill",     # pp test, MoE model, host-resident experts
    "host_expert_decode",     # tg test, MoE model, host-resident experts
    "dense_partial_offload",  # dense model with host weights (ngl <= n_layer or -ot ...=CPU)
    "mixed_pp_tg",            # pp+tg (-pg) test, MoE model, host-resident experts
    "other",                  # MoE model with host weights but no host expert
    "unknown",                # the row could not be simulated (see note)
)

#: columns of :func:`compare`'s result, in order
COLUMNS = (
    "line", "invocation", "model", "model_toml", "n_layer", "regime", "kind", "test", "n_prompt", "n_gen",
    "n_depth", "n_ubatch", "n_batch", "ngl", "n_cpu_moe", "ot", "load_mode", "pinned", "flash_attn",
    "type_k", "type_v", "variant", "n_threads", "host_flags", "measured_ts", "measured_stddev_ts", "n_samples", "predicted_ts",
    "predicted_stddev_ts", "rel_error", "predicted_vram_mib", "predicted_staging_mib", "note", "split",
)


# --------------------------------------------------------------------------------------
# the run folder
# --------------------------------------------------------------------------------------


def resolve(path: str | Path, *bases: Path) -> Path:
    """``path`` if absolute, else the first of ``base / path`` (in order), the current folder, the
    repository root and the shipped files (:func:`sim.resources.shipped_root`: an installed
    wheel's copy of ``scenarios/``, so ``scenarios/models/qwen3-30b-a3b.toml`` of a run folder's
    ``invocations.jsonl`` and the default profile are found from any folder) that exists
    (``path`` itself when none does)."""
    from sim.resources import shipped_root

    p = Path(path)
    if p.is_absolute():
        return p
    cands = [b / p for b in bases] + [p, ROOT / p, shipped_root() / p]
    return next((c for c in cands if c.exists()), p)


def check_run_dir(run_dir: str | Path, *, field: str | None = None) -> Path:
    """``run_dir`` as a run folder: an existing folder (it should hold ``llama-bench.jsonl`` and
    ``invocations.jsonl``; their readers report a missing one). A file given instead (say the run's
    ``llama-bench.jsonl``) is refused with the advice to give its folder.

    Raises:
        ScenarioError: (``file`` the path, ``field`` as given: ``--run``...) a missing path, a
            file, something else that is not a folder.
    """
    run = Path(run_dir)
    if run.is_dir():
        return run
    if not run.exists():
        raise ScenarioError("run folder not found", file=run, field=field)
    if run.is_file():
        parent = run.parent
        hint = (f"give its folder {parent.as_posix() or '.'}, " if (parent / BENCH_FILE).is_file() or
                run.name in (BENCH_FILE, INVOCATIONS_FILE, META_FILE) else "give ")
        raise ScenarioError(f"is a file, not a run folder: {hint}the run folder that holds {BENCH_FILE} and "
                            f"{INVOCATIONS_FILE}", file=run, field=field)
    raise ScenarioError(f"not a folder: give the run folder that holds {BENCH_FILE} and {INVOCATIONS_FILE}",
                        file=run, field=field)


def hardware_path(hardware: str | Path, field: str = "--hardware") -> Path:
    """The hardware profile file a command line names, as ``prefetch-sim`` and scenario files name
    one: a path (absolute, else relative to the current folder or the repository root:
    :func:`resolve`) that is a file, else a bare built-in name (``h200``, ``h200-llamacpp``: no
    ``/``, no ``.toml``; :func:`sim.resources.resolve_named`). A path that is neither is returned as given
    (its loader reports the missing file).

    Raises:
        ScenarioError: (``field``) a bare name that is no file and no built-in profile, listing
            the built-in names.
    """
    from sim.resources import is_bare_name, resolve_named

    p = resolve(hardware)
    if p.is_file() or not is_bare_name(str(hardware)):
        return p
    return resolve_named("hardware", str(hardware), field=field)


def jsonl_objects(path: str | Path, what: str) -> list[tuple[int, dict]]:
    """The JSON objects of a JSONL file with their 1-based lines (blank lines skipped); ``what``
    says what a line holds (in the message of a missing file or a line that is no object).

    Raises:
        ScenarioError: (``file`` the path, ``field`` ``line N``) a missing file, one that is not a
            regular text file of bounded size (a FIFO, a device: :func:`sim.bounds.check_text_input`),
            unreadable or not UTF-8, a malformed line, a line that is not an object.
    """
    p = Path(path)
    if not p.exists():
        raise ScenarioError(f"file not found ({what})", file=p)
    check_text_input(p)
    try:
        if p.suffix == ".gz":  # a packed record (host_state.jsonl.gz), its text bounded as a plain file's
            import gzip

            from sim.bounds import TEXT_INPUT_MAX_BYTES

            with gzip.open(p, "rb") as f:
                raw = f.read(TEXT_INPUT_MAX_BYTES + 1)
            if len(raw) > TEXT_INPUT_MAX_BYTES:
                raise ScenarioError(f"more than the {TEXT_INPUT_MAX_BYTES // 2**20} MiB limit of a text input once "
                                    "unpacked", file=p)
            text = raw.decode("utf-8")
        else:
            text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise ScenarioError(f"cannot read: {exc}", file=p) from None
    text = text.removeprefix("\ufeff")  # a UTF-8 byte-order mark, as the TOML and llama-bench readers take it
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ScenarioError(f"malformed JSON ({exc.msg}, column {exc.colno})", file=p, field=f"line {i}") from None
        if not isinstance(rec, dict):
            raise ScenarioError(f"expected a JSON object ({what})", file=p, field=f"line {i}")
        out.append((i, rec))
    return out


def read_invocations(path: str | Path) -> list[dict]:
    """Read ``invocations.jsonl``: one JSON object per line (blank lines skipped), each with a
    string ``gguf`` and ``model_toml`` and, if present, an integer ``n_layer >= 0`` (0, as the
    grid runner writes it, and absent both mean every layer of the model) and ``args`` (a list
    of strings: llama-bench's flags, as the runner records them, or a whole command line with
    ``-m``/``-r``/``-o``; an ``identity`` run's are ``psim-decode``'s). Other keys are kept.
    Each object gets ``_line`` (its 1-based line) and ``_asked``: what its llama-bench flags ask
    the rows to be (:func:`calibrate.llamacpp.grid.asked_values`; None without ``args`` and for
    an identity run).

    Raises:
        ScenarioError: (``file`` the path, ``field`` ``<key>, line N``) a missing or unreadable
            file, a malformed line, a missing or mistyped key, ``args`` that are not llama-bench
            flags, an ``id`` an earlier line has, no invocation.
    """
    from .grid import asked_repetitions, asked_values

    p = Path(path)
    out = []
    for i, rec in jsonl_objects(p, "one JSON object per llama-bench invocation"):
        for key in ("gguf", "model_toml"):
            if not isinstance(rec.get(key), str) or not rec[key]:
                raise ScenarioError(f"expected a non-empty string, got {rec.get(key)!r}", file=p,
                                    field=f"{key}, line {i}")
        n = rec.get("n_layer")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
            raise ScenarioError(f"expected an integer >= 0 (0: every layer), got {n!r}", file=p,
                                field=f"n_layer, line {i}")
        args = rec.get("args")
        if args is not None and (not isinstance(args, list) or not all(isinstance(a, str) for a in args)):
            raise ScenarioError(f"expected a list of strings (llama-bench's flags), got {args!r}", file=p,
                                field=f"args, line {i}")
        asked = reps = None
        if args is not None and rec.get("kind", "bench") != "identity":
            try:
                asked, reps = asked_values(args), asked_repetitions(args)
            except ValueError as exc:
                raise ScenarioError(f"not a llama-bench command line: {exc}", file=p, field=f"args, line {i}") from None
        inv_id = rec.get("id")
        if inv_id is not None:  # an id names one load: the host state, canary and rows join on it
            first = next((o["_line"] for o in out if o.get("id") == inv_id), None)
            if first is not None:
                raise ScenarioError(f"invocation id {inv_id!r} is also line {first}'s: each invocation's id once",
                                    file=p, field=f"id, line {i}")
        out.append({**rec, "n_layer": n or None, "_line": i, "_asked": asked, "_reps": reps})
    if not out:
        raise ScenarioError("no invocations", file=p)
    return out


def cut_model(model: ModelSpec, n_layer: int | None) -> ModelSpec:
    """``model`` cut to its first ``n_layer`` layers (a GGUF trimmed in layers): the real per-layer
    shapes, types and bytes (llama.cpp's type rule keeps seeing the full model's layer count,
    ``quant_n_layer``, as the writer does for a trimmed file), totals recomputed. Unchanged for
    None or the model's own count.

    Raises:
        ValueError: ``n_layer`` above the model's layers.
    """
    if n_layer is None or n_layer == model.n_layer:
        return model
    if n_layer > model.n_layer:
        raise ValueError(f"n_layer {n_layer} exceeds the model's {model.n_layer} layers")
    moe = model.moe
    if moe is not None and moe.n_layer_dense_lead > n_layer:
        moe = replace(moe, n_layer_dense_lead=n_layer)
    return replace(model, n_layer=n_layer, moe=moe, quant_n_layer=max(model.quant_n_layer, model.n_layer))


@dataclass(frozen=True)
class ModelRef:
    """The simulator model of a GGUF: the TOML and the layers kept."""

    model_toml: Path
    n_layer: int | None


def _bytes_text(n: float) -> str:
    """A size as GiB, MiB or bytes, whichever shows it (a test GGUF of 57752 bytes read 0.00 GiB)."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{int(n)} bytes"


def model_map(invocations: Sequence[dict], run_dir: Path, inv_file: Path) -> dict[str, ModelRef]:
    """GGUF basename -> :class:`ModelRef`, from the invocations.

    Raises:
        ScenarioError: a model TOML that does not exist, or one GGUF named with two different
            model files or layer counts.
    """
    from sim.resources import builtin, is_bare_name

    out: dict[str, ModelRef] = {}
    layers: dict[Path, int] = {}
    for inv in invocations:
        line = inv["_line"]
        toml = resolve(inv["model_toml"], run_dir)
        if not toml.exists() and is_bare_name(str(inv["model_toml"])):
            # a built-in model name (gemma3-27b), as a scenario file's model = takes it
            toml = builtin("model", str(inv["model_toml"]).strip()) or toml
        if toml.is_dir():
            raise ScenarioError(f"{inv['model_toml']} is a folder, not a model TOML", file=inv_file,
                                field=f"model_toml, line {line}")
        if not toml.is_file():
            raise ScenarioError(f"model file not found: {inv['model_toml']} (tried the run folder, the current "
                                "folder, the repository root and the shipped files)", file=inv_file, field=f"model_toml, line {line}")
        toml = toml.resolve()
        if toml not in layers:
            layers[toml] = load_model(toml).n_layer
        n = inv.get("n_layer")
        ref = ModelRef(toml, None if n == layers[toml] else n)
        key = gguf_name(inv["gguf"])
        if key in out and out[key] != ref:
            def cut(r: ModelRef) -> str:
                return "all layers" if r.n_layer is None else plural(r.n_layer, "layer")
            raise ScenarioError(f"GGUF '{key}' is named with two models: {out[key].model_toml} "
                                f"({cut(out[key])}) and {ref.model_toml} ({cut(ref)})",
                                file=inv_file, field=f"gguf, line {line}")
        out[key] = ref
    return out


def check_row_counts(bench: pd.DataFrame, invocations: Sequence[dict], run: Path, why: str) -> None:
    """Refuse a run folder whose bench invocations all report their ``rows`` and these do not add
    up to the rows of ``llama-bench.jsonl`` (rows removed, duplicated or appended after the lease).

    Raises:
        ScenarioError: naming ``invocations.jsonl`` and ``rows``; ``why`` says what it breaks.
    """
    counted = [inv.get("rows") for inv in invocations if inv.get("kind", "bench") == "bench"]
    if counted and all(isinstance(c, int) and not isinstance(c, bool) for c in counted) and sum(counted) != len(bench):
        raise ScenarioError(f"the bench invocations' rows add up to {sum(counted)}, {BENCH_FILE} has {len(bench)}: "
                            f"rows were removed or added ({why})", file=Path(run) / INVOCATIONS_FILE, field="rows")


def _attribute(bench: pd.DataFrame, invocations: Sequence[dict]) -> list[dict | None]:
    """The invocation of each bench row: by order when every invocation other than the routing
    runs (``kind = "routing"``) reports its ``rows`` and they add up to the
    file's rows with matching GGUFs; else the one invocation of the row's GGUF, or of several
    the one whose command line asked for the row (:func:`row_disagreements`); None when there
    are none or several such. Identity runs write no llama-bench row."""
    names = [gguf_name(f) for f in bench["model_filename"]]
    # routing runs write routing.jsonl, not llama-bench.jsonl (calibrate.llamacpp.grid)
    invocations = [inv for inv in invocations if inv.get("kind", "bench") != "routing"]
    counts = [inv.get("rows") for inv in invocations]
    if all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts) and sum(counts) == len(names):
        seq = [inv for inv, c in zip(invocations, counts) for _ in range(c)]
        if all(gguf_name(inv["gguf"]) == n for inv, n in zip(seq, names)):
            return seq
    by_gguf = _bench_invocations_by_gguf(invocations)
    out: list[dict | None] = []
    for (_, row), n in zip(bench.iterrows(), names):
        cands = by_gguf.get(n, [])
        if len(cands) > 1:
            cands = [inv for inv in cands if not row_disagreements(row, inv)]
        out.append(cands[0] if len(cands) == 1 else None)
    return out


def _bench_invocations_by_gguf(invocations: Sequence[dict]) -> dict[str, list[dict]]:
    """GGUF basename -> the invocations that may have written its llama-bench rows (not the
    routing or identity runs), in file order."""
    out: dict[str, list[dict]] = {}
    for inv in invocations:
        if inv.get("kind", "bench") not in ("routing", "identity"):
            out.setdefault(gguf_name(inv["gguf"]), []).append(inv)
    return out


def _row_field(row: Mapping[str, Any], name: str) -> Any:
    """A row's field as llama-bench printed it (None when the row lacks it: another version);
    ``load_mode`` from an older row's ``use_mmap``."""
    v = row.get(name) if hasattr(row, "get") else None
    if v is None or (isinstance(v, float) and math.isnan(v)):
        if name == "load_mode":
            mm = row.get("use_mmap") if hasattr(row, "get") else None
            if mm is not None and not (isinstance(mm, float) and math.isnan(mm)):
                return "mmap" if mm else "none"
        return None
    return v


def _same(name: str, value: Any, asked: Any) -> bool:
    """Whether a row's ``value`` of field ``name`` is the ``asked`` value (llama-bench's printed
    form, :func:`sim.cli.benchflags.asked_row_values`)."""
    from sim.views.llamabench import BOOL, FIELD_BY_NAME, INT

    typ = FIELD_BY_NAME[name].type if name in FIELD_BY_NAME else None
    try:
        if typ == INT:
            return int(value) == int(asked)
        if typ == BOOL:
            return bool(value) == bool(asked)
        if name == "tensor_split":
            def shares(x):
                v = [round(float(t), 2) for t in str(x).split("/") if t.strip()]
                while v and v[-1] == 0:
                    v.pop()
                return v
            return shares(value) == shares(asked)
    except (TypeError, ValueError):
        return False
    return str(value).strip().lower() == str(asked).strip().lower()


def _shown(v: Any) -> str:
    return str(int(v)) if isinstance(v, (bool, np.bool_)) else f"{v[0]},{v[1]}" if isinstance(v, tuple) else str(v)


#: llama-bench fields whose default has not changed in any version that has the field: a row
#: whose invocation did not give the flag must carry it (:func:`row_disagreements`); no ``-ot``
#: prints ``none`` (its ``-ncmoe`` rules are never printed)
STABLE_DEFAULTS = {"n_depth": ("-d", 0), "n_cpu_moe": ("-ncmoe", 0), "tensor_buft_overrides": ("-ot", "none")}


def row_disagreements(row: Mapping[str, Any], inv: Mapping[str, Any] | None) -> list[tuple[str, str, str]]:
    """The fields of a llama-bench row that its invocation's command line did not ask for:
    ``(field, the row's value, what was asked: flag and values)`` for each field whose flag the
    invocation's ``args`` give (``_asked`` of :func:`read_invocations`) and whose value is none
    of the flag's; the test as ``n_prompt`` (a pp row and ``-p``), ``n_gen`` (tg, ``-n``) or
    ``n_prompt+n_gen`` (a pp+tg row: one of the ``-pg`` pairs, none when no ``-pg`` is given).
    Fields the row lacks (another llama-bench version) are not compared, nor flags not given,
    whose defaults change between llama-bench versions, except those of :data:`STABLE_DEFAULTS`
    (the default every version with the field has had); and ``samples_ns`` when the row has
    another number of samples than the invocation's ``-r`` (llama-bench writes one per
    repetition). [] for an invocation without ``args``."""
    asked = (inv or {}).get("_asked")
    if not asked:
        return []
    out = []
    n_prompt, n_gen = int(row["n_prompt"]), int(row["n_gen"])
    if n_gen == 0 or n_prompt == 0:
        name, value = ("n_prompt", n_prompt) if n_gen == 0 else ("n_gen", n_gen)
        if name in asked and value not in asked[name][1]:
            out.append((name, str(value), f"{asked[name][0]} {','.join(map(str, asked[name][1]))}"))
    else:
        flag, pairs = asked.get("n_pg", ("-pg", ()))
        if (n_prompt, n_gen) not in pairs:
            out.append(("n_prompt+n_gen", f"{n_prompt}+{n_gen}",
                        " ".join(f"-pg {a},{b}" for a, b in pairs) or "no -pg test"))
    for name, (flag, values) in asked.items():
        if name in ("n_prompt", "n_gen", "n_pg"):
            continue
        v = _row_field(row, name)
        if v is not None and not any(_same(name, v, a) for a in values):
            # -mmp's values as given (1/0), the load mode it asked for beside them
            given = ",".join({"mmap": "1", "none": "0"}.get(str(a), _shown(a)) if flag == "-mmp" else _shown(a)
                             for a in values)
            out.append((name, _shown(v), f"{flag} {given}" + (f", load_mode {','.join(map(str, values))}"
                                                             if flag == "-mmp" else "")))
    for name, (flag, default) in STABLE_DEFAULTS.items():
        v = _row_field(row, name) if name not in asked else None
        if v is not None and not _same(name, v, default):
            out.append((name, _shown(v), f"no {flag}, llama-bench's default {default}"))
    reps, samples = inv.get("_reps"), row.get("samples_ns")
    if reps is not None and isinstance(samples, list) and len(samples) != reps:
        out.append(("samples_ns", f"{len(samples)} samples", f"-r {reps}"))
    return out



def _invocation_label(inv: Mapping[str, Any]) -> str:
    return (f"'{inv['id']}' ({INVOCATIONS_FILE} line {inv['_line']})" if inv.get("id") is not None
            else f"{INVOCATIONS_FILE} line {inv['_line']}")


def disagreement_error(row: Mapping[str, Any], line: int, inv: Mapping[str, Any] | None,
                       candidates: Sequence[Mapping[str, Any]], bench_file: Path) -> ScenarioError | None:
    """The one-line report of a row that its invocation (``inv``; None: not known, then each of
    ``candidates``, the invocations of the row's GGUF) did not ask for (:func:`row_disagreements`),
    naming ``llama-bench.jsonl``, the line and the first field that disagrees; None when the
    invocation (or, with several candidates, one of them) asked for the row or none has ``args``."""
    if inv is not None:
        dis, who = row_disagreements(row, inv), f"its invocation {_invocation_label(inv)}"
    else:
        cands = [c for c in candidates if c.get("_asked")]
        if not cands or len(cands) < len(candidates):
            return None  # one without args may have run it
        found = [(row_disagreements(row, c), c) for c in cands]
        if any(not d for d, _ in found):
            return None
        dis, closest = min(found, key=lambda t: len(t[0]))
        who = (f"none of the {len(cands)} invocations of its GGUF (the closest: {_invocation_label(closest)})"
               if len(cands) > 1 else f"its GGUF's one invocation {_invocation_label(closest)}")
    if not dis:
        return None
    name, value, asked = dis[0]
    more = f" (and {', '.join(d[0] for d in dis[1:])})" if len(dis) > 1 else ""
    return ScenarioError(f"the row ran {name} {value}, which {who} did not ask for ({asked}){more}: not simulated "
                         "(llama-bench's rows say what ran: a corrupt or mixed-up run folder?)",
                         file=bench_file, field=f"{name}, line {line}")


# --------------------------------------------------------------------------------------
# one row
# --------------------------------------------------------------------------------------


#: environment variables of an invocation that do not change what llama-bench runs: the timing
#: patches' switches (:mod:`calibrate.llamacpp.splittime`, ``phasetime``) and the prefetch patch's
#: settings, which the row's own prefetch fields (the ``variant`` column) already carry
NEUTRAL_ENV_PREFIXES = ("PREFETCH_SIM_", "GGML_SCHED_PREFETCH_")


def host_flags(row: Mapping[str, Any], inv: Mapping[str, Any] | None = None) -> str:
    """The host-side settings of a row that the simulator does not model but that change its
    t/s, as llama-bench flags and ``NAME=value`` assignments: ``--no-host 1`` (the CPU weights in
    a plain CPU buffer instead of the pinned ``CUDA_Host`` one), ``--repack 0``, ``--poll N``
    (not 50), ``-C MASK``, ``--cpu-strict 1``, and the invocation's environment other than
    :data:`NEUTRAL_ENV_PREFIXES` (e.g. ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``, which puts a
    ``--no-host`` buffer in 2 MiB pages: data/llamacpp/h200-20261204-tg7). ``""`` for
    llama-bench's defaults. Part of :data:`REPEAT_KEY`: rows that differ here are not repeats."""
    out = []
    if _true(row.get("no_host", False)):
        out.append("--no-host 1")
    if _false(row.get("repack", True)):
        out.append("--repack 0")
    poll = row.get("poll")
    if _finite(poll) and int(poll) != 50:
        out.append(f"--poll {int(poll)}")
    mask = str(row.get("cpu_mask", "0x0") or "0x0")
    if mask.lower() not in ("0x0", "0", "nan", "none"):
        out.append(f"-C {mask}")
    if _true(row.get("cpu_strict", False)):
        out.append("--cpu-strict 1")
    env = (inv or {}).get("env") or {}
    if isinstance(env, Mapping):
        out += [f"{k}={v}" for k, v in sorted(env.items()) if not str(k).startswith(NEUTRAL_ENV_PREFIXES)]
    return " ".join(out)


def _true(v: Any) -> bool:
    """A llama-bench boolean field that says true (``true`` in JSON, ``1`` in CSV or SQL); a
    missing value (None, NaN) is neither :func:`_true` nor :func:`_false`."""
    return str(v).strip().lower() in ("true", "1")


def _false(v: Any) -> bool:
    """A llama-bench boolean field that says false (``false``, ``0``)."""
    return str(v).strip().lower() in ("false", "0")


def bench_kind(n_prompt: int, n_gen: int) -> str:
    """``pp``, ``tg`` or ``pp+tg`` (``-pg``)."""
    return "pp" if not n_gen else "tg" if not n_prompt else "pp+tg"


def regime(model: ModelSpec, placement: Placement, kind: str) -> str:
    """The regime of a row (:data:`REGIMES`): ``resident`` when no weight is host-resident
    (``token_embd``, whose rows llama.cpp always gathers on the host, aside); on a MoE model
    with host-resident experts ``copy_bound_prefill`` (pp), ``host_expert_decode`` (tg) or
    ``mixed_pp_tg``; on a dense model with host weights ``dense_partial_offload``; else
    ``other``."""
    host = [t for t in model.tensors if t.group != "embd" and placement.host_resident(model, t)]
    if not host:
        return "resident"
    if model.moe is None:
        return "dense_partial_offload"
    if any(t.is_expert for t in host):
        return {"pp": "copy_bound_prefill", "tg": "host_expert_decode"}.get(kind, "mixed_pp_tg")
    return "other"


@dataclass(frozen=True)
class RowCase:
    """One measured row made a simulator case.

    Attributes:
        scenario: the scenario (None when the row cannot be simulated; see ``notes``).
        tests: the tests to simulate (two for ``pp+tg``: the prompt, then the generation).
        terms: the row in the simulator's terms (None when it could not be read).
        model: the model as simulated (cut to the GGUF's layers, the row's KV type).
        regime: :data:`REGIMES`.
        notes: what the simulator does not represent of the row.
        variant: the simulator variant of the row's prefetch fields (:func:`sim.views.llamabench.row_variant`;
            None when they name none the simulator models).
        repetitions: routing draws to simulate: the requested ones on a MoE model, 1 on a dense
            one (no routing: its repetitions would be identical plans).
    """

    scenario: Scenario | None
    tests: tuple[BenchTest, ...]
    terms: RowTerms | None
    model: ModelSpec
    regime: str
    notes: tuple[str, ...]
    repetitions: int = 1
    variant: str | None = "baseline"


#: relative difference between a row's ``model_size`` and the model spec's bytes above which the
#: row is flagged (the spec counts exactly the GGUF's tensor bytes: sim.model.gguf / gguf_writer tests)
MODEL_SIZE_TOLERANCE = 0.01


def row_case(row: Mapping[str, Any], model: ModelSpec, hardware: HardwareProfile, *, repetitions: int = 3,
             name: str = "llama-bench row", file: str | None = None) -> RowCase:
    """The scenario of one llama-bench row on ``model`` (already cut to the GGUF's layers).

    Placement, workload and test from :mod:`sim.views.llamabench` (``row_terms``, ``row_placement``,
    ``row_workload``); KV element size from ``type_k``/``type_v``; uniform routing; the variant of
    the row's prefetch fields (:func:`sim.views.llamabench.row_variant`: ``baseline`` for a row
    without them, ``prefetch``, ``prefetch_gated_<N>``, ``slots<N>``; a variant other than
    baseline is noted); seed 0; ``repetitions`` routing draws on a MoE model, one on a dense model
    (whose plans draw nothing). A row that cannot be simulated (an unknown ``-ot`` buffer, a pattern
    Python cannot compile, an unknown load mode, ``-pw 1`` with ``-pes N > 0``, a ``main_gpu`` beyond
    the profile's GPUs, as ``prefetch-sim run`` refuses ``-mg``) gets ``scenario``
    None and says why in ``notes``; approximations (``-pg``, ``flash_attn``, quantised KV...) are
    noted too.
    """
    from sim.model.routing import RoutingSpec

    try:
        terms = row_terms(row)
    except ValueError as exc:
        return RowCase(None, (), None, model, "unknown", (f"not simulated: {exc}",), variant=None)
    notes = list(terms.notes)
    try:
        variant = row_variant(row)
    except ValueError as exc:
        return RowCase(None, terms.tests, terms, model, "unknown", tuple(notes + [f"not simulated: {exc}"]),
                       variant=None)
    if variant != "baseline":
        pw, pwg, pes = prefetch_settings(row)
        notes.append(f"variant {variant} (prefetch_weights {pw}, prefetch_gate {pwg}, prefetch_expert_slots {pes})")
    kind = bench_kind(terms.n_prompt, terms.n_gen)
    m = model_with_kv(model, terms)
    refused = kv_context_error(m, terms.flash_attn, terms.type_k, terms.type_v)
    if refused:  # llama.cpp would not have created this context: the row cannot be llama-bench's
        return RowCase(None, terms.tests, terms, m, "unknown", tuple(notes + [f"not simulated: {refused[0]} "
                                                                              f"{refused[1]}"]), variant=variant)
    try:
        check_main_gpu(_int_or(row.get("main_gpu") if hasattr(row, "get") else None, 0), hardware)
        pl, pnotes = row_placement(terms, m, hardware.n_gpu)
    except ScenarioError as exc:  # a main_gpu the profile lacks, as prefetch-sim run refuses -mg
        return RowCase(None, terms.tests, terms, m, "unknown",
                       tuple(notes + [f"not simulated: main_gpu {row.get('main_gpu')}: {exc.reason}"]), variant=variant)
    except ValueError as exc:
        return RowCase(None, terms.tests, terms, m, "unknown", tuple(notes + [f"not simulated: {exc}"]),
                       variant=variant)
    notes += pnotes
    arch = str(row.get("model_type", "") if hasattr(row, "get") else "").split(" ")[0]
    if model.arch and arch and arch != model.arch:  # llama_model::desc() starts with general.architecture
        return RowCase(None, terms.tests, terms, m, "unknown",
                       tuple(notes + [f"not simulated: the row's model_type is a {arch}, the model file it is "
                                      f"simulated with a {model.arch} ({model.name})"]), variant=variant)
    ftype = _ftype_label(row.get("model_type", "") if hasattr(row, "get") else "")
    if ftype and _ftype_label(model.name) and ftype != _ftype_label(model.name):
        return RowCase(None, terms.tests, terms, m, "unknown",
                       tuple(notes + [f"not simulated: the row's model is {ftype}, the model file it is simulated "
                                      f"with {_ftype_label(model.name)} ({model.name})"]), variant=variant)
    # settings prefetch-sim run refuses (sim.cli.benchflags.unmodelled_setting): not scored
    refused = unmodelled_kind(terms, hardware.n_gpu)
    split = refused == "split_mode"
    unmodelled = (None if refused is None else
                  f"split_mode {terms.split_mode} over {hardware.n_gpu} GPUs is not modelled" if split else
                  f"{refused} ({UNMODELLED[refused][1]}) is not modelled")
    if unmodelled is not None:
        kept = [n for n in notes if not (split and n.startswith("split_mode "))]  # row_terms' one-GPU note
        return RowCase(None, terms.tests, terms, m, "unknown", tuple(kept + [f"not simulated: {unmodelled}"]),
                       variant=variant)
    get = row.get if hasattr(row, "get") else (lambda k, d=None: d)
    fit = {k: _int_or(get(k), 0) for k in ("fit_target", "fit_min_ctx")}
    if any(fit.values()):   # llama-bench ran common_fit_params: its placement is not the row's -ngl/-ncmoe/-ot
        which = ", ".join(f"{k} {v}" for k, v in fit.items() if v)
        return RowCase(None, terms.tests, terms, m, "unknown",
                       tuple(notes + [f"not simulated: {which}: llama-bench's fit (common_fit_params) replaced the "
                                      "row's -ngl/-ncmoe/-ot/-ts with a placement it does not print; prefetch-sim run "
                                      "-fitt simulates the fit"]), variant=variant)
    size = row.get("model_size") if hasattr(row, "get") else None
    if _finite(size) and not size > 0:
        return RowCase(None, terms.tests, terms, m, "unknown",
                       tuple(notes + [f"not simulated: model_size {size}: llama-bench prints the model's bytes"]),
                       variant=variant)
    if _finite(size) and abs(m.nbytes / size - 1) > MODEL_SIZE_TOLERANCE:
        notes.append(f"model_size {_bytes_text(size)} differs from the model file's {_bytes_text(m.nbytes)}: "
                     "the GGUF is not the model the invocation names (a trimmed or --tiny GGUF, or a model_toml of "
                     "another model)")
    # only a profile that says how many threads its CPU figures were measured with
    recorded = (getattr(hardware, "measured", None) or {}).get("host_cpus") is not None
    n_threads, host_cpus = get("n_threads"), default_threads(hardware)
    threads_why = None
    if recorded and _finite(n_threads) and int(n_threads) > 0 and int(n_threads) != host_cpus:
        threads_why = threads_unmodelled(int(n_threads), m, pl, hardware)   # run's rule: not scored
        if threads_why is None:
            notes.append(f"n_threads {int(n_threads)}: the profile's CPU figures were measured with {host_cpus} "
                         "threads and are not rescaled")
    if _true(get("no_host", False)) and not _false(get("repack", True)):
        notes.append("no_host with repack: the CPU weights are repacked (CPU_REPACK), the CPU tables price "
                     "ggml-cpu's plain kernels")
    if threads_why is not None:
        return RowCase(None, terms.tests, terms, m, "unknown",
                       tuple(notes + [f"not simulated: {threads_why} (prefetch-sim run refuses such a -t)"]),
                       variant=variant)
    backend = hardware_backend(hardware)
    backends = _str_or(row.get("backends") if hasattr(row, "get") else None, backend)
    if backend not in [b.strip() for b in backends.split(",")]:
        notes.append(f"backend {backends}: simulated as the profile's GPU ({backend})")
    if kind == "pp+tg":
        a, b = terms.tests
        notes.append(f"pp+tg: simulated as {a.name} then {b.name} in one context")
    if hardware.ggml is not None:
        pass  # llama.cpp's kernel tables price -fa on and off, at every depth
    elif terms.flash_attn == "off":
        notes.append("flash_attn off: the simulator has one attention cost (the profile's) for every -fa")
    elif hardware.attn_table is not None and terms.n_depth > 0:
        notes.append("attention at depth priced by the profile's unfused attention table, not FlashAttention")
    reps = repetitions if m.moe is not None else 1
    wl = row_workload(terms, reps)
    samples = row.get("samples_ns")
    if not (isinstance(samples, (list, tuple)) and samples):
        samples = row.get("samples_ts")
    if isinstance(samples, (list, tuple)) and samples:
        wl = replace(wl, bench_repetitions=len(samples))  # llama-bench's -r of the row
    else:  # the CUDA-graph capture is spread over llama-bench's repetitions: its default -r
        wl = replace(wl, bench_repetitions=LLAMA_BENCH_REPETITIONS)
        notes.append(f"no samples_ns/samples_ts: llama-bench's default -r {LLAMA_BENCH_REPETITIONS} assumed (its "
                     "first repetition's CUDA-graph capture spread over them)")
    scn = Scenario(name=name, model=m, hardware=hardware, placement=pl, workload=wl,
                   routing=RoutingSpec(), variants=(parse_variant(variant),), seed=0, file=file)
    return RowCase(scn, terms.tests, terms, m, regime(m, pl, kind), tuple(notes), reps, variant)


#: llama-bench's default repetitions (``cmd_params_defaults.reps``), assumed for a row whose
#: samples are missing
LLAMA_BENCH_REPETITIONS = 5


def predict(scn: Scenario, tests: Sequence[BenchTest], engine: str = "analytic",
            repetitions: int = 3) -> tuple[float, float]:
    """Predicted llama-bench t/s of a row: ``(mean, sample stddev)`` over ``repetitions`` routing
    draws, from :func:`sim.engines.metrics.run_scenario` (the scenario's one variant, one process). For two tests
    (``pp+tg``) each repetition's t/s is their tokens over the sum of their times, as llama-bench
    times a ``-pg`` test. Each draw's t/s is llama-bench's mean of its repetitions' t/s
    (:func:`sim.engines.metrics.bench_mean_tps`: only the first repetition captures the CUDA
    graphs), as its ``avg_ts`` is.

    Raises:
        PlacementError: the placement does not fit in the profile's VRAM.
    """
    from sim.engines.metrics import bench_mean_tps, run_scenario

    res = run_scenario(scn, tests=list(tests), engine=engine, repetitions=repetitions, jobs=1)
    tps = bench_mean_tps(scn, tests, [r.makespan_s for r in res])
    return float(np.mean(tps)), float(np.std(tps, ddof=1)) if len(tps) > 1 else 0.0


def _predict_task(scn: Scenario, tests: tuple[BenchTest, ...], engine: str, repetitions: int):
    try:
        return (*predict(scn, tests, engine, repetitions), None)
    except ScenarioError as exc:  # PlacementError: does not fit
        return math.nan, math.nan, f"not simulated: {exc.reason}"


def _cost(case: RowCase) -> float:
    """Relative plan-building cost of a case (:func:`sim.bounds.work_units`)."""
    from sim.bounds import work_units

    wl = case.scenario.workload
    return work_units(case.tests, case.scenario.model.n_layer, wl.n_ubatch, wl.n_batch, case.repetitions, 1)


# --------------------------------------------------------------------------------------
# compare
# --------------------------------------------------------------------------------------


def build_cases(run_dir: str | Path, hardware: HardwareProfile, *, repetitions: int = 3
                ) -> tuple[pd.DataFrame, list[dict], list[RowCase | None], list[str]]:
    """Read a run folder and build every row's case.

    Returns:
        ``(bench, invocation per row (or None), case per row (None: no model, or a row its
        invocation's command line did not ask for), extra notes per row)``; ``bench.attrs
        ["disagreements"]``: line -> the one-line report of each row that disagrees with its
        invocation's ``args`` (:func:`disagreement_error`; not simulated).

    Raises:
        ScenarioError: a missing or malformed ``llama-bench.jsonl`` or ``invocations.jsonl``, row
            counts of the invocations that do not add up to the file's (:func:`check_row_counts`), a
            model TOML that is missing or malformed, an ``n_layer`` above its TOML's.
    """
    run = check_run_dir(run_dir)
    bench_file, inv_file = run / BENCH_FILE, run / INVOCATIONS_FILE
    if not bench_file.exists() and (run / "llama-bench.json").is_file():
        raise ScenarioError(f"file not found; {run / 'llama-bench.json'} is there: name it {BENCH_FILE} (a -o json "
                            "array is read as well)", file=bench_file)
    other = [f for f in ("llama-bench.csv", "llama-bench.md", "llama-bench.sql", "llama-bench.txt")
             if (run / f).is_file()]
    if not bench_file.exists() and other:
        raise ScenarioError(f"file not found; {run / other[0]} is there, but the comparison reads llama-bench -o "
                            "json or -o jsonl output (they carry the samples): rerun llama-bench with -o jsonl",
                            file=bench_file)
    bench = read_llama_bench(bench_file)
    invs = read_invocations(inv_file)
    refs = model_map(invs, run, inv_file)
    check_row_counts(bench, invs, run, "each row's model and configuration come from its invocation")
    owners = _attribute(bench, invs)
    by_gguf = _bench_invocations_by_gguf(invs)
    models: dict[tuple, ModelSpec] = {}
    cases: list[RowCase | None] = []
    extra: list[str] = []
    disagree: dict[int, str] = {}
    for (line, row), inv in zip(bench.iterrows(), owners):
        gguf = gguf_name(row["model_filename"])
        ref = refs.get(gguf)
        bad = disagreement_error(row, line, inv, by_gguf.get(gguf, []), bench_file)
        if bad is not None:  # not what the command line asked for: reported, not predicted
            disagree[line] = str(bad)
            cases.append(None)
            extra.append(f"not simulated: {bad.reason}")
            continue
        if str(row.get("devices", "auto")) == "none":
            cases.append(None)
            extra.append("not simulated: -dev none (no GPU) is not modelled")
            continue
        devs = [d for d in str(row.get("devices", "auto") or "auto").split("/") if d.strip()]
        dev_note = (f"devices {'/'.join(devs)}: more GPUs than the hardware's {hardware.n_gpu}, simulated on its "
                    f"{plural(hardware.n_gpu, 'GPU')}" if devs != ["auto"] and len(devs) > hardware.n_gpu else None)
        if ref is None:
            cases.append(None)
            extra.append(f"not simulated: no invocation names GGUF '{gguf}'")
            continue
        key = (ref.model_toml, ref.n_layer)
        if key not in models:
            base = load_model(ref.model_toml)
            try:
                models[key] = cut_model(base, ref.n_layer)
            except ValueError as exc:
                raise ScenarioError(f"GGUF '{gguf}': {exc} ({ref.model_toml})", file=inv_file,
                                    field="n_layer") from None
        label = f"{inv['id'] if inv and 'id' in inv else gguf} line {line}: {row['test']}"
        row, lm_note = row_load_mode(row, inv)
        if lm_note is not None and lm_note.startswith("not simulated"):
            cases.append(None)
            extra.append(lm_note)
            continue
        ncmoe_note = None
        if models[key].moe is not None and not _finite(row.get("n_cpu_moe")):
            ncmoe_note = ("the row has no n_cpu_moe (a llama-bench older than -ncmoe): 0 assumed, the experts "
                          "where -ngl and -ot put them")
        fa = row.get("flash_attn")
        fa_note = (None if fa is not None and not (isinstance(fa, float) and math.isnan(fa)) else
                   "the row has no flash_attn: llama-bench's default auto assumed")
        cases.append(row_case(row, models[key], hardware, repetitions=repetitions, name=label, file=str(bench_file)))
        rc = inv.get("rc") if inv else None
        extra.append("; ".join(n for n in (f"invocation exit status {rc}" if isinstance(rc, int) and rc != 0 else "",
                                          lm_note, ncmoe_note, fa_note, dev_note) if n))
    restored = restored_depth_notes(
        [row for _, row in bench.iterrows()],
        [(inv or {}).get("id") or gguf_name(row["model_filename"]) for (_, row), inv in zip(bench.iterrows(), owners)],
        [c is not None and c.scenario is not None and c.model.arch in RESTORED_DEPTH_ARCHS for c in cases])
    extra = ["; ".join(n for n in (e, r) if n) for e, r in zip(extra, restored)]
    bench.attrs["disagreements"] = disagree
    return bench, owners, cases, extra


#: the architectures whose tg at a restored depth was measured slower after a multi-token pp test
#: at that depth (:func:`restored_depth_notes`): gpt-oss, not qwen3moe or gemma3
#: (``data/llamacpp/h100-20261207-pform``, ``-pform2``)
RESTORED_DEPTH_ARCHS = ("gpt-oss",)


def restored_depth_notes(rows: Sequence[Mapping[str, Any]], runs: Sequence[Any],
                         affected: Sequence[bool]) -> list[str | None]:
    """The note of each tg row at a depth that llama-bench restored after a pp test of two or
    more tokens at that depth had run in the same invocation, on a model of an architecture where
    that was measured to slow decode (:data:`RESTORED_DEPTH_ARCHS`); None for the other rows.

    llama-bench keeps one saved depth state across the tests of an invocation (``cstate`` in
    ``llama-bench.cpp``): ``-p 512 -n 128 -d 8192`` fills the depth in pp512 @ d8192, saves it,
    runs pp512 on it, and tg128 @ d8192 restores it. Measured on gpt-oss-20b
    (``data/llamacpp/h100-20261207-pform``, one H100): after a pp test of 64 to 4096 tokens at the
    depth, tg128 @ d8192 cost 246–325 µs per token more than at depth 0, against 154–197 µs after
    ``-p 0`` or ``-p 1`` (3–4 % of t/s); not the clocks, not the FlashAttention kernels, cause not
    found, not modelled (the simulator prices the faster forms). On the same kind of machine
    Qwen3-30B-A3B (no sliding window) and Gemma-3-27B (a 1024-token window on 5 of 6 layers) decode
    alike after ``-p 512`` and ``-p 1`` (``data/llamacpp/h100-20261207-pform2``: the mean depth cost
    differs by −18 and −15 µs per token). With ggml-cuda's programmatic dependent launch off
    (``GGML_CUDA_PDL=0``) or its op fusion off, gpt-oss's two forms decode alike
    (``data/llamacpp/h100-20261207-pform3``).

    Args:
        rows: llama-bench rows in file order (``n_prompt``, ``n_gen``, ``n_depth``).
        runs: per row, what identifies its llama-bench process (the invocation id, or the GGUF name
            when the row has no invocation).
        affected: per row, whether its model is of such an architecture (and it is simulated).
    """
    pp_at: dict[tuple, int] = {}   # (run, depth) -> the largest pp test seen so far at that depth
    out: list[str | None] = []
    for row, run, hit in zip(rows, runs, affected):
        n_p, n_g, d = int(row["n_prompt"]), int(row["n_gen"]), int(row["n_depth"])
        note = None
        if d > 0 and n_p == 0 and n_g > 0 and hit and pp_at.get((run, d)):
            note = (f"depth {d} restored after a pp test of {pp_at[(run, d)]} tokens at that depth in this "
                    "invocation: gpt-oss-20b decoded so about 100 µs per token slower than after -p 0 or -p 1 "
                    "(data/llamacpp/h100-20261207-pform), not modelled")
        if d > 0 and n_p >= 2:
            pp_at[(run, d)] = max(pp_at.get((run, d), 0), n_p)
        out.append(note)
    return out


def gguf_name(path: Any) -> str:
    """The file name of a GGUF path as llama-bench prints ``model_filename`` (the last part after
    ``/`` or ``\\``: a row written on Windows names ``C:\\models\\x.gguf``)."""
    return PureWindowsPath(str(path)).name


def row_load_mode(row: pd.Series, inv: Mapping[str, Any] | None) -> tuple[pd.Series, str | None]:
    """A row with the ``load_mode`` it ran, and a note. A row without the field (a llama-bench
    older than ``-lm``) takes its invocation's ``-lm`` (one value; ``-mmp`` as ``mmap``/``none``),
    else its own ``use_mmap`` (:func:`sim.views.llamabench.host_memory_pinned` reads it), else
    llama-bench's default ``auto`` (mmap: pageable host weights), which the note says was assumed.

    Returns:
        ``(row, note)``: the row (a copy with ``load_mode`` set when it comes from the invocation)
        and None, the note of the default assumed, or a note starting ``not simulated`` when the
        invocation gives several load modes and the row says neither which nor ``use_mmap``.
    """
    def has(key: str) -> bool:
        v = row.get(key) if hasattr(row, "get") else None
        return v is not None and not (isinstance(v, float) and math.isnan(v))

    if has("load_mode"):
        return row, None
    asked = ((inv or {}).get("_asked") or {}).get("load_mode")
    if asked and len(set(asked[1])) == 1:
        row = row.copy()
        row["load_mode"] = asked[1][0]
        return row, None
    if has("use_mmap"):
        return row, None
    if asked:
        return row, (f"not simulated: the row has no load_mode (nor use_mmap) and its invocation gives {asked[0]} "
                     f"{','.join(map(str, asked[1]))}: which one it ran is unknown")
    return row, ("the row has no load_mode (nor use_mmap) and its invocation no -lm: llama-bench's default auto "
                 "assumed (mmap: pageable host weights)")


def _case_key(case: RowCase) -> tuple:
    """Rows with equal keys get the same prediction. A decode-only row's plans do not depend on
    ``-ub``/``-b`` (one-token graphs; the ubatch enters only the VRAM check, done per row by
    :func:`_fit`), so those are left out of its key."""
    s = case.scenario
    m = s.model
    wl = s.workload
    if all(not t.n_prompt for t in case.tests):
        wl = replace(wl, n_ubatch=1, n_batch=1)
    return (m.file, m.n_layer, m.kv_bytes_per_elem, s.placement, wl, case.tests, case.repetitions, s.variants)


def _fit(scn: Scenario) -> tuple[str | None, float, float]:
    """``(note, vram MiB, staging MiB)`` of a row's placement under its variant on GPU 0
    (:func:`sim.model.vram.account`, as ``run_scenario`` checks it): note None when it fits the
    profile's VRAM, else the note saying why not (and NaN MiB)."""
    from sim.model.vram import account

    try:
        b = account(scn, scn.variants[0])[0]
    except ScenarioError as exc:  # PlacementError
        return f"not simulated: {exc.reason}", math.nan, math.nan
    return None, b.total_bytes / 2**20, b.staging_bytes / 2**20


def compare(run_dir: str | Path, hardware: str | Path | HardwareProfile = DEFAULT_HARDWARE,
            engine: str = "analytic", *, repetitions: int = 3, jobs: int | None = None,
            progress: Callable[[Iterable], Iterable] | None = None,
            lines: Collection[int] | None = None, max_work: int | None = None) -> pd.DataFrame:
    """Predicted vs measured t/s of every row of a run folder (see the module docstring).

    Args:
        run_dir: the run folder (``llama-bench.jsonl``, ``invocations.jsonl``, ``meta.json``).
        hardware: a hardware profile TOML (relative to the current folder or the repository
            root), a built-in profile name (``h200``: :func:`hardware_path`) or a loaded profile.
        engine: ``analytic`` or ``des`` (the same schedule; des is slower).
        repetitions: routing draws per row of a MoE model (the predicted t/s is their mean; a
            dense model's rows are simulated once: they draw nothing).
        jobs: parallel processes (default: all cores); 1 runs in this process. The result does
            not depend on it.
        progress: wraps the iterable of pending predictions (e.g. ``tqdm``).
        lines: only the rows of these ``llama-bench.jsonl`` lines are predicted and returned
            (default: every row); e.g. :mod:`calibrate.llamacpp.ab`'s pairs.
        max_work: refuse (ScenarioError) when the predictions would build more graph-layers
            than this (:func:`sim.bounds.check_work`; default :data:`sim.bounds.WORK_MAX`).

    Returns:
        One row per measured row, in file order, with :data:`COLUMNS`: ``line`` (in
        ``llama-bench.jsonl``), ``invocation`` (its id when known), ``model`` (llama-bench's
        ``model_type``), ``model_toml``, ``n_layer`` (of the GGUF), ``regime``
        (:data:`REGIMES`), ``kind`` (pp, tg, pp+tg), ``test`` (llama-bench's name), the row's
        settings as llama-bench printed them (``ngl`` is ``n_gpu_layers``, ``ot``
        ``tensor_buft_overrides``), ``pinned`` (as simulated), ``measured_ts`` (``avg_ts``),
        ``variant`` (the simulator variant of the row's prefetch fields, None when it has none),
        ``measured_stddev_ts``, ``n_samples``, ``predicted_ts`` and ``predicted_stddev_ts``
        (t/s; NaN when not simulated), ``rel_error`` (``predicted_ts / measured_ts - 1``),
        ``predicted_vram_mib`` and ``predicted_staging_mib`` (GPU 0's VRAM and the variant's
        staging buffers as :func:`sim.model.vram.account` sizes them, MiB; NaN when not simulated) and
        ``note`` (``; ``-joined; what the simulator did not represent). ``attrs``: ``meta``
        (``meta.json``, or {}), ``hardware`` (profile name), ``engine``, ``run_dir``,
        ``disagreements`` (line -> the one-line report of each row that its invocation's
        ``args`` did not ask for: not simulated, :func:`disagreement_error`).

    Raises:
        ScenarioError: a missing or malformed run file or model/hardware file (one line,
            naming the file and field).
        ValueError: an unknown engine.
    """
    if engine not in ("analytic", "des"):
        raise ValueError(f"engine must be 'analytic' or 'des', got {engine!r}")
    hw = hardware if isinstance(hardware, HardwareProfile) else load_hardware(hardware_path(hardware))
    bench, owners, cases, extra = build_cases(run_dir, hw, repetitions=repetitions)
    disagree = dict(bench.attrs.get("disagreements", {}))
    if lines is not None:
        keep = [ln in set(lines) for ln in bench.index]
        bench = bench[keep]
        owners = [o for o, k in zip(owners, keep) if k]
        cases = [c for c, k in zip(cases, keep) if k]
        extra = [e for e, k in zip(extra, keep) if k]
    # placements that do not fit are not simulated; the others once per key, longest first
    # (the pool balances better)
    vram = [_fit(c.scenario) if c is not None and c.scenario is not None else (None, math.nan, math.nan)
            for c in cases]
    fit = [v[0] for v in vram]
    todo: dict[tuple, RowCase] = {}
    for c, f in zip(cases, fit):
        if c is not None and c.scenario is not None and f is None:
            todo.setdefault(_case_key(c), c)
    order = sorted(todo, key=lambda k: -_cost(todo[k]))
    from sim.bounds import check_work
    from sim.cli.progress import closed_after

    check_work(int(sum(_cost(todo[k]) for k in order)), max_work)  # before any work: a clear refusal, not hours
    results: dict[tuple, tuple] = {}
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(order)))
    if jobs == 1:
        with closed_after(progress(order) if progress else order) as it:
            for k in it:
                c = todo[k]
                results[k] = _predict_task(c.scenario, c.tests, engine, c.repetitions)
    else:
        from concurrent.futures import as_completed

        from sim.cli.interrupt import WorkerPool

        with WorkerPool(max_workers=jobs) as ex:  # an interruption stops the workers at once
            futs = {ex.submit(_predict_task, todo[k].scenario, todo[k].tests, engine, todo[k].repetitions): k
                    for k in order}
            done = _Sized(as_completed(futs), len(futs))
            with closed_after(progress(done) if progress else done) as it:
                for f in it:
                    results[futs[f]] = f.result()

    rows = []
    for (line, row), inv, case, ex_note, (fit_note, vram_mib, staging_mib) in zip(bench.iterrows(), owners, cases,
                                                                                   extra, vram):
        terms = case.terms if case is not None else None
        pred = (math.nan, math.nan, fit_note)
        if case is not None and case.scenario is not None and fit_note is None:
            pred = results[_case_key(case)]
        notes = ([ex_note] if ex_note else []) + (list(case.notes) if case else []) + ([pred[2]] if pred[2] else [])
        measured = float(row["avg_ts"])
        samples = row.get("samples_ns")
        if not isinstance(samples, list):
            samples = row.get("samples_ts")
        std = row.get("stddev_ts")
        m = case.model if case is not None else None
        rows.append(dict(
            line=line, invocation=(inv or {}).get("id"), model=row["model_type"],
            model_toml=_rel(m.file) if m is not None else None, n_layer=m.n_layer if m is not None else None,
            regime=case.regime if case is not None else "unknown",
            kind=bench_kind(int(row["n_prompt"]), int(row["n_gen"])), test=row["test"],
            n_prompt=int(row["n_prompt"]), n_gen=int(row["n_gen"]), n_depth=int(row["n_depth"]),
            n_ubatch=int(row["n_ubatch"]), n_batch=int(row["n_batch"]), ngl=int(row["n_gpu_layers"]),
            n_cpu_moe=_int_or(row.get("n_cpu_moe"), 0), ot=_str_or(row.get("tensor_buft_overrides"), "none"),
            load_mode=terms.load_mode if terms else _str_or(row.get("load_mode"), "auto"),
            pinned=terms.pinned if terms else None, flash_attn=terms.flash_attn if terms else None,
            type_k=_str_or(row.get("type_k"), "f16"), type_v=_str_or(row.get("type_v"), "f16"),
            variant=case.variant if case is not None else _row_variant_or_none(row),
            n_threads=_int_or(row.get("n_threads"), 0) or None, host_flags=host_flags(row, inv),
            measured_ts=measured, measured_stddev_ts=float(std) if _finite(std) else math.nan,
            n_samples=len(samples) if isinstance(samples, list) else None,
            predicted_ts=pred[0], predicted_stddev_ts=pred[1],
            rel_error=pred[0] / measured - 1.0 if _finite(pred[0]) else math.nan,
            predicted_vram_mib=vram_mib if fit_note is None else math.nan,
            predicted_staging_mib=staging_mib if fit_note is None else math.nan,
            note="; ".join(notes),
            # the held-out split (calibrate.llamacpp.split): a calibration may fit only "fit" rows
            split="fit" if _fit_label(row) else "heldout",
        ))
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    for col in ("n_layer", "n_samples"):
        df[col] = df[col].astype("Int64")
    meta_path = Path(run_dir) / META_FILE
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.is_file() else {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ScenarioError(f"cannot read: {exc}", file=meta_path) from None
    gpus = sorted({str(g) for g in bench["gpu_info"].dropna()}) if "gpu_info" in bench.columns else []
    gpu_rows = (bench["gpu_info"].dropna().astype(str).value_counts().to_dict()
                if "gpu_info" in bench.columns else {})
    backends = sorted({str(b) for b in bench["backends"].dropna()}) if "backends" in bench.columns else []

    def over(r) -> bool:   # split over more GPUs than the profile has (llama-bench's default uses all it sees)
        seen = len([g for g in str(r.get("gpu_info", "") or "").split(",") if g.strip()])
        devs = [d for d in str(r.get("devices", "auto") or "auto").split("/") if d.strip()]
        return (seen > hw.n_gpu and str(r.get("split_mode", "layer")) != "none"
                and (devs == ["auto"] or len(devs) > hw.n_gpu))

    df.attrs.update(over_gpu_rows=int(sum(over(r) for _, r in bench.iterrows())))
    df.attrs.update(meta=meta, hardware=hw.name, hardware_file=hw.file, engine=engine, run_dir=str(run_dir),
                    repetitions=repetitions, gpu_name=hw.gpu_name, gpu_info=gpus, gpu_rows=gpu_rows, n_gpu=hw.n_gpu,
                    backend=hardware_backend(hw), kernel_tables=hw.ggml is not None,
                    backends=backends,
                    simulated=int(bench["cpu_info"].astype(str).str.startswith(SIMULATED_CPU_INFO).sum())
                    if "cpu_info" in bench.columns else 0,
                    disagreements={ln: m for ln, m in disagree.items() if ln in set(df.line)})
    return df


def other_gpus(gpu_info: Iterable[Any], gpu_name: str) -> list[str]:
    """The distinct ``gpu_info`` values (llama-bench's field) that do not name the profile's
    ``gpu_name`` (case-insensitive), in order; empty when ``gpu_name`` is unknown. Blank values
    say nothing and are left out."""
    if not gpu_name:
        return []
    return sorted({str(g) for g in gpu_info if str(g).strip() and gpu_name.lower() not in str(g).lower()})


def warnings(df: pd.DataFrame) -> list[str]:
    """What a user should know about :func:`compare`'s result before reading its errors, one line
    each: the rows were measured on another GPU than the profile's (``gpu_info`` against the
    profile's ``gpu_name``), on a machine of fewer GPUs than the profile has (the names
    ``gpu_info`` lists against ``n_gpu``), on another backend (``backends`` without the profile's,
    :func:`sim.cli.benchflags.hardware_backend`: ``ROCm`` rows against a CUDA profile), and each invocation whose rows' ``model_size`` differs from the model
    file the row is simulated with (the GGUF is not the model it names: a trimmed or other file);
    first, a profile without llama.cpp kernel tables (``[ggml]``), whose absolute t/s are not
    llama.cpp's."""
    out = []
    if df.attrs.get("kernel_tables") is False:
        out.append(f"profile '{df.attrs.get('hardware')}' has no llama.cpp kernel tables ([ggml]): its matmuls are "
                   "priced at its dense GEMM rate and roofline, not ggml's kernels (the CuPy H200 profile is off a "
                   "median 108 % on data/llamacpp/h200-20261201; MoE pp512 about 7x): give --hardware a "
                   "llama.cpp-calibrated profile (h200-llamacpp) for absolute t/s")
    if df.attrs.get("simulated"):
        n_sim = df.attrs["simulated"]
        out.append(f"{plural(n_sim, 'row')} of {df.attrs.get('run_dir')} {'is' if n_sim == 1 else 'are'} prefetch-sim's own output "
                   f"(cpu_info '{SIMULATED_CPU_INFO}...'), not llama-bench measurements: their errors compare the "
                   "simulator with itself")
    name = str(df.attrs.get("gpu_name") or "")
    other = other_gpus(df.attrs.get("gpu_info", []), name)
    if other:
        rows_of = df.attrs.get("gpu_rows") or {}
        n_other = sum(rows_of.get(g, 0) for g in other)
        n_all = sum(rows_of.values())
        if rows_of and (len(other) > 1 or n_other < n_all):   # a folder of several GPUs: which rows
            where = ", ".join(f"{rows_of.get(g, 0)} on {g}" for g in other)
            out.append(f"{n_other} of the {n_all} rows were measured on another GPU than the {name} of profile "
                       f"'{df.attrs.get('hardware')}' ({where}): their errors compare two GPUs (give "
                       "--hardware the profile of those rows' GPU, or compare each GPU's rows apart)")
        else:
            out.append(f"the rows were measured on {', '.join(other)}, the profile '{df.attrs.get('hardware')}' is "
                       f"{name}: the errors compare two GPUs (give --hardware the profile of the rows' GPU)")
    # llama-bench's gpu_info joins the names of the machine's GPUs with ", " (get_gpu_info): a
    # profile of more GPUs than the machine had cannot be the rows' (fewer can: -dev, -sm none)
    counts = [len([x for x in str(g).split(",") if x.strip()]) for g in df.attrs.get("gpu_info", [])]
    n_gpu = df.attrs.get("n_gpu")
    if counts and n_gpu and n_gpu > max(counts):
        out.append(f"the rows' machine had {max(counts)} GPU(s) (gpu_info), the profile "
                   f"'{df.attrs.get('hardware')}' has {n_gpu}: its VRAM and layer split are another machine's "
                   "(give --hardware a profile with the rows' GPU count)")
    elif counts and n_gpu and max(counts) > n_gpu and df.attrs.get("over_gpu_rows"):
        out.append(f"{df.attrs['over_gpu_rows']} of the rows ran on a machine of {max(counts)} GPUs (gpu_info) with "
                   f"their model split over them (split_mode not none, devices not narrowed), the profile "
                   f"'{df.attrs.get('hardware')}' has {n_gpu}: they ran on more GPUs than are simulated (give "
                   "--hardware a profile with the rows' GPU count)")
    backend = str(df.attrs.get("backend") or "")
    other = [b for b in df.attrs.get("backends", []) if backend and backend not in [x.strip() for x in b.split(",")]]
    if other:
        out.append(f"the rows ran on backend {', '.join(other)}, the profile '{df.attrs.get('hardware')}' is "
                   f"{backend}: the errors compare two backends (give --hardware a profile of the rows' backend)")
    if len(df) and "note" in df.columns:
        seen = set()
        for _, r in df.iterrows():
            note = next((n for n in str(r["note"] or "").split("; ") if n.startswith("model_size ")), None)
            key = (r["invocation"], note)
            if note and key not in seen:
                seen.add(key)
                where = f"invocation {r['invocation']}" if isinstance(r["invocation"], str) else f"line {r['line']}"
                out.append(f"{where}: {note}")
    return out


class _Sized:
    """An iterator with a length (for a progress bar)."""

    def __init__(self, it: Iterable, n: int):
        self._it, self._n = it, n

    def __iter__(self):
        return iter(self._it)

    def __len__(self) -> int:
        return self._n


def _row_variant_or_none(row) -> str | None:
    try:
        return row_variant(row)
    except (ValueError, TypeError):
        return None


def _ftype_label(model_type) -> str:
    """The file type of a llama.cpp model description (``llama_model::desc()``: architecture, size
    class, file type, e.g. ``qwen3moe 30B.A3B Q4_K - Medium`` -> ``Q4_K - Medium``), without
    llama_ftype_name's ``(guessed)``; "" when there is none."""
    parts = str(model_type or "").split(" ", 2)
    return parts[2].replace("(guessed)", "").strip() if len(parts) == 3 else ""


def _finite(v: Any) -> bool:
    """A finite number, numpy's scalars included (a row read with ``.loc`` holds them), not a bool."""
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) and math.isfinite(v)


def _int_or(v: Any, default: int) -> int:
    return int(v) if _finite(v) else default


def _str_or(v: Any, default: str) -> str:
    return default if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def _rel(path: str | None) -> str | None:
    if path is None:
        return None
    p = Path(path)
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


# --------------------------------------------------------------------------------------
# summary and figure
# --------------------------------------------------------------------------------------

SUMMARY_COLUMNS = ("group", "n_rows", "n_predicted", "median_abs_rel_error", "p90_abs_rel_error", "median_rel_error")


def _fit_label(row) -> bool:
    """:func:`calibrate.llamacpp.split.is_fit_row`, False for a row it cannot read."""
    from .split import is_fit_row

    try:
        return bool(is_fit_row(row))
    except (KeyError, TypeError, ValueError):
        return False


def _groups(df: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """:func:`summarize`'s groups of ``df``'s rows: all, by test kind, by regime; with a
    ``split`` column the same for the held-out rows (and by regime and kind), then the fit rows."""
    groups = [("all", df)]
    groups += [(k, df[df.kind == k]) for k in ("pp", "tg", "pp+tg") if (df.kind == k).any()]
    groups += [(f"regime: {r}", df[df.regime == r]) for r in REGIMES if (df.regime == r).any()]
    if "split" in df.columns and (df.split == "heldout").any():
        h = df[df.split == "heldout"]
        groups += [("held-out", h)]
        groups += [(f"held-out {k}", h[h.kind == k]) for k in ("pp", "tg", "pp+tg") if (h.kind == k).any()]
        groups += [(f"held-out regime: {r}", h[h.regime == r]) for r in REGIMES if (h.regime == r).any()]
        groups += [(f"held-out {r} {k}", h[(h.regime == r) & (h.kind == k)]) for r in REGIMES
                   for k in ("pp", "tg") if ((h.regime == r) & (h.kind == k)).any()]
        groups += [("fit", df[df.split == "fit"])]
    return groups


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Error summary of :func:`compare`'s result: overall (``all``), by test kind (``pp``,
    ``tg``, ``pp+tg``) and by regime (in :data:`REGIMES` order; groups without rows omitted);
    with a ``split`` column, then the same for the ``held-out`` rows (the accuracy that
    counts: :mod:`calibrate.llamacpp.split`) and the ``fit`` rows in all.

    Returns:
        :data:`SUMMARY_COLUMNS`: rows, rows with a prediction, median and 90th percentile
        (linear interpolation) of ``|rel_error|``, and the median signed ``rel_error`` (bias),
        over the predicted rows (NaN when none).
    """
    out = []
    for name, g in _groups(df):
        e = g.rel_error.dropna()
        out.append(dict(group=name, n_rows=len(g), n_predicted=len(e),
                        median_abs_rel_error=float(e.abs().median()) if len(e) else math.nan,
                        p90_abs_rel_error=float(e.abs().quantile(0.9)) if len(e) else math.nan,
                        median_rel_error=float(e.median()) if len(e) else math.nan))
    return pd.DataFrame(out, columns=list(SUMMARY_COLUMNS))


#: the columns that identify a row's configuration across run folders of one grid (a repeat on
#: another machine): :func:`reproducibility` matches rows on them; the model's among them (two
#: folders may give one invocation id to different models: fresh-user round 7 had a Qwen3 row
#: matched to gpt-oss's t/s)
REPEAT_KEY = ("invocation", "model", "model_toml", "n_layer", "test", "n_prompt", "n_gen", "n_depth", "n_ubatch", "n_batch", "ngl", "n_cpu_moe", "ot",
              "load_mode", "flash_attn", "type_k", "type_v", "variant", "n_threads", "host_flags")

#: the columns that identify a configuration whatever the invocation that measured it: the
#: model and :data:`REPEAT_KEY` less ``invocation`` (a run that measures one configuration in
#: separate invocations, i.e. separate model loads; a repeat from another grid)
CONFIG_KEY = tuple(k for k in REPEAT_KEY if k != "invocation")

#: columns of :func:`reproducibility`
REPRO_COLUMNS = ("group", "n_matched", "median_abs_repeat_diff", "p90_abs_repeat_diff", "median_abs_rel_error",
                 "p90_abs_rel_error", "median_abs_pooled_error", "p90_abs_pooled_error")


def _config_keys(frame: pd.DataFrame, key: Sequence[str]) -> pd.Series:
    """Each row's configuration (the columns ``key``) as one string, missing values alike
    whatever the column's dtype."""
    cols = frame[list(key)].astype(object)
    return cols.where(cols.notna(), "").astype(str).agg("\x1f".join, axis=1)


def repeat_key(df: pd.DataFrame, repeat: pd.DataFrame) -> tuple[str, ...]:
    """The key :func:`attach_repeat` matches on: :data:`REPEAT_KEY` when the two frames share an
    invocation id (runs of one grid) and matching on it finds every row that the configuration
    alone finds, else :data:`CONFIG_KEY` (runs of different grids, which may reuse an id for
    another configuration: the configuration alone)."""
    shared = set(df.get("invocation", pd.Series(dtype=str))) & set(repeat.get("invocation", pd.Series(dtype=str)))
    if not shared:
        return CONFIG_KEY
    by_inv = attach_repeat(df, repeat, REPEAT_KEY).repeat_ts.notna().sum()
    by_cfg = attach_repeat(df, repeat, CONFIG_KEY).repeat_ts.notna().sum()
    return REPEAT_KEY if by_inv >= by_cfg else CONFIG_KEY


def attach_repeat(df: pd.DataFrame, repeat: pd.DataFrame, key: Sequence[str] = REPEAT_KEY) -> pd.DataFrame:
    """``df`` (:func:`compare` of one run folder) with ``repeat_ts``: the measured t/s of the
    same configuration (the columns ``key``, default :data:`REPEAT_KEY`) in ``repeat`` (the same
    grid run on another machine, read the same way), NaN where it has none. A configuration the
    repeat measured twice (a duplicated key) is matched to the mean of its rows."""
    means = (repeat.groupby(_config_keys(repeat, key))["measured_ts"].mean() if len(repeat)
             else pd.Series(dtype=float))
    out = df.copy()
    out["repeat_ts"] = _config_keys(df, key).map(means).astype(float) if len(df) else pd.Series(dtype=float)
    return out


def attach_within_repeat(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` (:func:`compare` of one run folder) with ``repeat_ts``: for a configuration
    (:data:`CONFIG_KEY`) that the run measured in more than one invocation, i.e. after separate
    model loads, the mean measured t/s of its rows from the *other* invocations; NaN for a
    configuration measured by one invocation only. :func:`reproducibility` then gives how well
    llama-bench repeats itself on one machine between loads, the floor under any prediction's
    error on that machine (llama-bench's own ``stddev_ts`` spans one load's repetitions only)."""
    out = df.copy()
    out["repeat_ts"] = math.nan
    if not len(df):
        return out
    keys = _config_keys(df, CONFIG_KEY)
    for _k, idx in df.groupby(keys).groups.items():
        g = df.loc[idx]
        if g["invocation"].nunique() < 2:
            continue
        for i in idx:
            other = g[g["invocation"] != df.at[i, "invocation"]]["measured_ts"].dropna()
            if len(other):
                out.at[i, "repeat_ts"] = float(other.mean())
    return out


def mean_over_loads(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` (:func:`compare` of one run folder) with the rows of each configuration
    (:data:`CONFIG_KEY`) that the run measured in separate invocations (model loads) merged into
    one row: ``measured_ts`` the mean of their t/s, ``measured_stddev_ts`` the standard deviation
    between the loads (ddof 1), ``predicted_ts`` the mean of their predictions (one configuration
    is predicted alike but for the routing draws), ``rel_error`` recomputed, ``n_loads`` the
    number of invocations, ``invocation`` their ids joined by ``+``; a configuration measured
    once keeps its row (``n_loads`` 1). The rows keep ``df``'s order (first occurrence).

    A llama-bench t/s moves between model loads by more than between the repetitions of one
    load (``data/llamacpp/README.md``, ``h200-20261203-tg4``): the mean over loads is the
    quantity a prediction of the configuration is a prediction of.
    """
    if not len(df):
        out = df.copy()
        out["n_loads"] = pd.Series(dtype=int)
        return out
    keys = _config_keys(df, CONFIG_KEY)
    rows = []
    for _k, idx in df.groupby(keys, sort=False).groups.items():
        g = df.loc[idx]
        r = g.iloc[0].copy()
        r["n_loads"] = int(g["invocation"].nunique())
        if len(g) > 1:
            r["invocation"] = "+".join(dict.fromkeys(g["invocation"].astype(str)))
            r["measured_ts"] = float(g["measured_ts"].mean())
            r["measured_stddev_ts"] = float(g["measured_ts"].std(ddof=1))
            r["n_samples"] = int(g["n_samples"].sum()) if "n_samples" in g else r.get("n_samples")
            pred = g["predicted_ts"].dropna()
            r["predicted_ts"] = float(pred.mean()) if len(pred) else math.nan
            r["rel_error"] = (r["predicted_ts"] / r["measured_ts"] - 1 if len(pred) and r["measured_ts"] > 0
                              else math.nan)
        rows.append(r)
    out = pd.DataFrame(rows).reset_index(drop=True)
    out.attrs = dict(df.attrs)
    return out


def attach_canary(df: pd.DataFrame, run_dir: str | Path) -> pd.DataFrame:
    """``df`` with ``host_read_gb_per_s``: the host's DRAM read rate that the lease measured just
    before each row's invocation (``run_dir/canary.jsonl``, written by a grid with ``canary =
    true``: :func:`calibrate.llamacpp.lease.make_canary`); NaN where none was measured. ``df``
    unchanged when the run has no canary file.

    Raises:
        ScenarioError: a line of the file is not a JSON object (naming the file and line).
    """
    path = Path(run_dir) / "canary.jsonl"
    if not path.is_file():
        return df
    rate = {}
    for _line, rec in jsonl_objects(path, "canary"):
        v = rec.get("gb_per_s")
        if rec.get("rc") == 0 and isinstance(v, (int, float)) and math.isfinite(v) and v > 0:
            rate[str(rec.get("before"))] = float(v)
    out = df.copy()
    out["host_read_gb_per_s"] = out["invocation"].astype(str).map(rate).astype(float) if len(out) else math.nan
    return out


def _utc_seconds(text: Any) -> float:
    """An ISO-8601 UTC time (``2026-12-04T19:00:57Z``) as POSIX seconds; NaN when unreadable."""
    import datetime as dt

    try:
        return dt.datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc).timestamp()
    except ValueError:
        return math.nan


#: the lease's host sampler record in a run folder, plain or as a data folder packs it
HOST_STATE_FILES = ("host_state.jsonl", "host_state.jsonl.gz")


def invocation_steal(run_dir: str | Path, pad_s: float = 2.5) -> dict[str, float] | None:
    """Per invocation id, the share of the guest's CPU time that the hypervisor gave to others
    (``/proc/stat``'s steal, percent of all CPU time) while it ran, from the lease's host sampler
    (``run_dir/host_state.jsonl`` or its ``.gz``, every 5 s:
    :func:`calibrate.llamacpp.lease.start_host_sampler`) between the samples within ``pad_s`` (s)
    of the invocation's start and end (``invocations.jsonl``: ``started_at``, ``wall_s``); an
    invocation with fewer than two samples there is absent. None without the sampler's file.

    Raises:
        ScenarioError: a line of either file is not a JSON object (naming the file and line).
    """
    samples = host_samples(run_dir)
    if samples is None:
        return None
    inv_file = Path(run_dir) / INVOCATIONS_FILE
    invs = [inv for _line, inv in jsonl_objects(inv_file, "invocation")] if inv_file.is_file() else []
    return steal_over(samples, invs, pad_s)


def host_samples(run_dir: str | Path) -> list[tuple[float, list[float]]] | None:
    """The host sampler's ``/proc/stat`` samples of a run folder (:func:`invocation_steal`), as
    ``(UTC seconds, cpu counters)`` in time order; None without the sampler's file.

    Raises:
        ScenarioError: a line that is not a JSON object, a counter that is not a number, a sample
            earlier than the one before it or a counter that fell (naming the file and line).
    """
    from .lease import STAT_FIELDS

    path = Path(run_dir) / HOST_STATE_FILES[0]
    if not path.is_file():
        path = path.with_name(HOST_STATE_FILES[1])  # as a data folder packs it
        if not path.is_file():
            return None
    samples: list[tuple[float, list[float]]] = []
    for line, rec in jsonl_objects(path, "host state"):
        stat = rec.get("stat_cpu")
        at = _utc_seconds(rec.get("at"))
        if isinstance(stat, list) and len(stat) == len(STAT_FIELDS) and math.isfinite(at):
            try:
                vals = [float(x) for x in stat]
            except (TypeError, ValueError):
                raise ScenarioError("stat_cpu holds a value that is not a number", file=str(path),
                                    field=f"line {line}") from None
            if samples and (at < samples[-1][0] or any(b < a for a, b in zip(samples[-1][1], vals))):
                # /proc/stat's counters only grow, and the sampler writes in time order
                raise ScenarioError(f"the sample at {rec.get('at')} is earlier than the one before it, or one of its "
                                    "/proc/stat counters (cumulative) fell: not the host sampler's record",
                                    file=str(path), field=f"line {line}")
            samples.append((at, vals))
    return samples


def steal_over(samples: list[tuple[float, list[float]]], invocations, pad_s: float = 2.5) -> dict[str, float]:
    """:func:`invocation_steal` from :func:`host_samples` and the invocation records (the objects
    of ``invocations.jsonl``), for a caller that has read them already."""
    from .lease import STAT_FIELDS

    window = {}
    for inv in invocations:
        t0, wall = _utc_seconds(inv.get("started_at")), inv.get("wall_s")
        if math.isfinite(t0) and isinstance(wall, (int, float)) and math.isfinite(wall):
            window[str(inv.get("id"))] = (t0 - pad_s, t0 + float(wall) + pad_s)
    steal = {}
    for inv_id, (a, b) in window.items():
        inside = [s for at, s in samples if a <= at <= b]
        if len(inside) >= 2:
            d = np.subtract(inside[-1], inside[0])
            if d.sum() > 0:
                steal[inv_id] = float(100.0 * d[STAT_FIELDS.index("steal")] / d.sum())
    return steal


def attach_steal(df: pd.DataFrame, run_dir: str | Path, pad_s: float = 2.5) -> pd.DataFrame:
    """``df`` with ``host_steal_pct``: :func:`invocation_steal` of each row's invocation (NaN where
    it has none); ``df`` unchanged without the host sampler's file.

    ggml-cpu's threads meet at a barrier after every graph node, so one vCPU taken away stalls
    them all: on ``data/llamacpp/h200-20261204-tg6`` the six loads with 0.3-1.1 % steal decoded
    3-18 % below their configuration's mean, the twelve with 0.02-0.10 % before them -0.1..+10 % about
    it (r = -0.60 over the 20 loads).

    Raises:
        ScenarioError: a line of either file is not a JSON object (naming the file and line).
    """
    steal = invocation_steal(run_dir, pad_s)
    if steal is None:
        return df
    out = df.copy()
    out["host_steal_pct"] = out["invocation"].astype(str).map(steal).astype(float) if len(out) else math.nan
    return out


def steal_gate(df: pd.DataFrame, max_steal_pct: float, run_dir: str | Path) -> pd.Series:
    """Boolean mask of ``df``'s rows (:func:`attach_steal`'s column) whose model load ran while the
    hypervisor took more than ``max_steal_pct`` percent of the CPU time, or whose steal is unknown
    (the load had fewer than two host samples): the loads ``--max-steal`` leaves out of the figures.

    Raises:
        ScenarioError: ``run_dir`` has no host sampler record (``host_state.jsonl``), so no load
            can be judged (field ``--max-steal``).
    """
    if "host_steal_pct" not in df.columns:
        raise ScenarioError(f"{run_dir} has no host_state.jsonl (the lease's host sampler record): no load's steal "
                            "time is known", field="--max-steal")
    st = df["host_steal_pct"]
    return ~(st <= max_steal_pct)


def non_negative_pct(text: str) -> float:
    """argparse type of ``--max-steal``: a finite percentage >= 0."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage, got {text!r}") from None
    if not (math.isfinite(v) and v >= 0):
        raise argparse.ArgumentTypeError(f"expected a finite percentage >= 0, got {text!r}")
    return v


def _host_side_r(df: pd.DataFrame, col: str) -> tuple[float, int] | None:
    """Pearson r of each host-side row's measured t/s over its configuration's mean
    (:data:`CONFIG_KEY`) against ``df[col]``, and the rows used, over the configurations measured
    in two or more invocations (model loads); None with fewer than 3 such rows or no spread."""
    host = df[df.regime.isin(("host_expert_decode", "dense_partial_offload")) & df.measured_ts.notna()
              & df[col].notna()].copy()
    if host.empty:
        return None
    keys = _config_keys(host, CONFIG_KEY)
    # only configurations measured in two or more loads: a lone row's t/s over its mean is 1
    loads = host.groupby(keys)["invocation"].transform("nunique")
    host, keys = host[loads >= 2], keys[loads >= 2]
    if host.empty:
        return None
    host["rel_ts"] = host.measured_ts / host.groupby(keys)["measured_ts"].transform("mean")
    if len(host) < 3 or not (host.rel_ts.std() > 0 and host[col].std() > 0):
        return None
    return float(np.corrcoef(host.rel_ts, host[col])[0, 1]), len(host)


def steal_line(df: pd.DataFrame) -> str:
    """One markdown line on :func:`attach_steal`'s column: its median and range over the
    invocations and :func:`_host_side_r`; '' without the column or any value."""
    if "host_steal_pct" not in df.columns or df.host_steal_pct.notna().sum() == 0:
        return ""
    per_inv = df.groupby("invocation")["host_steal_pct"].first().dropna()
    text = (f"Steal time while each invocation ran (/proc/stat, host_state.jsonl): median {per_inv.median():.2f} % "
            f"of the CPU time, {per_inv.min():.2f}..{per_inv.max():.2f} % over {plural(len(per_inv), 'invocation')}")
    r = _host_side_r(df, "host_steal_pct")
    if r is not None:
        text += (f"; host-side rows' t/s (over their configuration's mean) against it: Pearson r = {r[0]:+.2f} "
                 f"({plural(r[1], 'row')})")
    return text + "\n"


def canary_line(df: pd.DataFrame) -> str:
    """One markdown line on :func:`attach_canary`'s column: the rate's median and range over
    the invocations, and :func:`_host_side_r` of the rate (each host-side row's measured t/s
    relative to its configuration's mean over loads); '' without the column."""
    if "host_read_gb_per_s" not in df.columns or df.host_read_gb_per_s.notna().sum() == 0:
        return ""
    per_inv = df.groupby("invocation")["host_read_gb_per_s"].first().dropna()
    text = (f"Host DRAM read rate before each invocation (psim-membw, canary.jsonl): median "
            f"{per_inv.median():.1f} GB/s, {per_inv.min():.1f}..{per_inv.max():.1f} over "
            f"{plural(len(per_inv), 'invocation')}")
    r = _host_side_r(df, "host_read_gb_per_s")  # the rate's scale does not change r
    if r is not None:
        text += (f"; host-side rows' t/s (over their configuration's mean) against it: Pearson r = {r[0]:+.2f} "
                 f"({plural(r[1], 'row')})")
    return text + "\n"


def sample_keys(run_dir: str | Path) -> set[tuple]:
    """The ``(n_prompt, n_gen, n_depth, samples_ns)`` of every row of a run folder's
    ``llama-bench.jsonl`` that carries its samples: two real model loads never time the same
    nanoseconds, so a key two folders share marks a copied row (:func:`check_distinct_runs`)."""
    bench = read_llama_bench(Path(run_dir) / BENCH_FILE)
    if "samples_ns" not in bench.columns:
        return set()
    out = set()
    for _, r in bench.iterrows():
        ns = r["samples_ns"]
        if isinstance(ns, list) and ns:
            out.add((int(r["n_prompt"]), int(r["n_gen"]), int(r["n_depth"]), tuple(int(x) for x in ns)))
    return out


def check_distinct_runs(run_dirs: Sequence[str | Path], field: str = "RUN_DIR") -> None:
    """Refuse run folders that share a measured row (the same test and ``samples_ns``): a copy of
    another folder's rows (even edited elsewhere) would count as another machine or model load.

    Raises:
        ScenarioError: naming the two folders, how many rows they share and ``field``.
    """
    keys = [(d, sample_keys(d)) for d in run_dirs]
    for i, (a, ka) in enumerate(keys):
        for b, kb in keys[i + 1:]:
            both = ka & kb
            if both:
                raise ScenarioError(f"'{b}' shares {len(both)} row(s) with '{a}' (the same test and samples_ns, "
                                    "which two model loads never time): a copy, not another measurement",
                                    field=field)


def reproducibility(df: pd.DataFrame) -> pd.DataFrame:
    """How well llama-bench reproduces itself on another machine, beside the simulator's error on
    the same rows, in :func:`summarize`'s groups: rows of ``df`` (:func:`attach_repeat`) with a
    repeat and a prediction; median and 90th percentile of ``|repeat_ts / measured_ts - 1|``,
    of the simulator's ``|rel_error|`` on those rows, and of its error against the mean of the two
    measurements (``|predicted / mean - 1|``: the ground truth with the machines' variation halved).

    Returns:
        :data:`REPRO_COLUMNS` (fractions; NaN where a group has no matched row).
    """
    m = df[df.repeat_ts.notna() & df.predicted_ts.notna() & df.measured_ts.notna()]
    diff = (m.repeat_ts / m.measured_ts - 1).abs()
    err = (m.predicted_ts / m.measured_ts - 1).abs()
    pooled = (m.predicted_ts / ((m.measured_ts + m.repeat_ts) / 2) - 1).abs()
    out = []
    for name, g in _groups(m):
        i = g.index

        def q(x, p):
            return float(x.loc[i].quantile(p)) if len(i) else math.nan

        out.append(dict(group=name, n_matched=len(i), median_abs_repeat_diff=q(diff, 0.5),
                        p90_abs_repeat_diff=q(diff, 0.9), median_abs_rel_error=q(err, 0.5), p90_abs_rel_error=q(err, 0.9),
                        median_abs_pooled_error=q(pooled, 0.5), p90_abs_pooled_error=q(pooled, 0.9)))
    return pd.DataFrame(out, columns=list(REPRO_COLUMNS))


def repro_markdown(repro: pd.DataFrame, title: str | None = None) -> str:
    """:func:`reproducibility` as a markdown table (percent), with an optional title line."""
    def pct(x: float) -> str:
        return "" if not math.isfinite(x) else f"{x * 100:.1f}%"

    lines = [title, ""] if title else []
    lines += ["| group | rows in both | repeat vs run: median | p90 | simulator vs run: median | p90 | "
              "simulator vs their mean: median | p90 |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in repro.itertuples(index=False):
        lines.append(f"| {r.group} | {r.n_matched} | {pct(r.median_abs_repeat_diff)} | {pct(r.p90_abs_repeat_diff)} | "
                     f"{pct(r.median_abs_rel_error)} | {pct(r.p90_abs_rel_error)} | {pct(r.median_abs_pooled_error)} | "
                     f"{pct(r.p90_abs_pooled_error)} |")
    return "\n".join(lines) + "\n"


def summary_markdown(summary: pd.DataFrame, title: str | None = None) -> str:
    """The summary as a markdown table (errors in percent), with an optional title line."""
    def pct(x: float, signed: bool = False) -> str:
        return "" if not math.isfinite(x) else f"{x * 100:+.1f}%" if signed else f"{x * 100:.1f}%"

    lines = [title, ""] if title else []
    lines += ["| group | rows | predicted | median abs(err) | p90 abs(err) | median err |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in summary.itertuples(index=False):
        lines.append(f"| {r.group} | {r.n_rows} | {r.n_predicted} | {pct(r.median_abs_rel_error)} | "
                     f"{pct(r.p90_abs_rel_error)} | {pct(r.median_rel_error, signed=True)} |")
    return "\n".join(lines) + "\n"


def plot_compare(df: pd.DataFrame, path: str | Path) -> Path:
    """Predicted vs measured t/s, log-log, coloured by regime (marker by test kind), with the
    y = x line and a ±10 % band; rows without a prediction are left out. Written atomically.

    Raises:
        ValueError: no row has a prediction.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from sim.atomic import save_figure

    d = df[np.isfinite(df.predicted_ts.astype(float))]
    if d.empty:
        raise ValueError("no row has a prediction to plot")
    fig = Figure(figsize=(7, 6), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    lo = min(d.measured_ts.min(), d.predicted_ts.min()) * 0.7
    hi = max(d.measured_ts.max(), d.predicted_ts.max()) * 1.4
    xs = np.array([lo, hi])
    ax.fill_between(xs, xs * 0.9, xs * 1.1, color="0.9", label="±10%", zorder=0)
    ax.plot(xs, xs, "k-", lw=0.8, label="y = x", zorder=1)
    markers = {"pp": "o", "tg": "^", "pp+tg": "s"}
    for i, r in enumerate(REGIMES):
        for kind, mk in markers.items():
            g = d[(d.regime == r) & (d.kind == kind)]
            if len(g):
                ax.scatter(g.measured_ts, g.predicted_ts, s=26, marker=mk, color=f"C{i}", alpha=0.85, zorder=2,
                           label=f"{r} ({kind})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured llama-bench t/s")
    ax.set_ylabel(f"predicted t/s ({df.attrs.get('engine', 'analytic')})")
    s = summarize(d).iloc[0]
    ax.set_title(f"{plural(int(s.n_predicted), 'row')}: median |err| {s.median_abs_rel_error:.1%}, "
                 f"p90 {s.p90_abs_rel_error:.1%}")
    ax.legend(fontsize=7)
    return save_figure(fig, path)


# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------


def add_common_args(ap: argparse.ArgumentParser, *, out_help: str, figure_help: str, summary_help: str,
                    many: bool = False) -> None:
    """The arguments ``compare``, ``ab`` and ``pool`` share: the run folder (``many``: one or more,
    ``args.run_dirs``), the profile, the engine, routing draws, jobs, the three outputs and ``-q``."""
    if many:
        ap.add_argument("run_dirs", metavar="RUN_DIR", nargs="+",
                        help="run folders with llama-bench.jsonl and invocations.jsonl")
    else:
        ap.add_argument("run_dir", metavar="RUN_DIR", help="run folder with llama-bench.jsonl and invocations.jsonl")
    ap.add_argument("--hardware", default=DEFAULT_HARDWARE,
                    help=f"hardware profile: a TOML or a built-in name such as h200 (default {DEFAULT_HARDWARE})")
    ap.add_argument("--engine", choices=("analytic", "des"), default="analytic")
    ap.add_argument("--repetitions", type=int, default=3, help="routing draws per row (default 3)")
    ap.add_argument("--jobs", type=int, default=None, help="parallel processes (default: all cores)")
    ap.add_argument("--out", metavar="CSV", help=out_help)
    ap.add_argument("--figure", metavar="PNG", help=figure_help)
    ap.add_argument("--summary", metavar="MD", help=summary_help)
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    ap.add_argument("--max-work", dest="max_work", type=int, default=None, metavar="N",
                    help="refuse a comparison that would build more than N graph-layers (default as prefetch-sim "
                         "run's --max-work; the shipped run folders need about 3e5 at --repetitions 3)")


def check_common_args(args: argparse.Namespace):
    """Check :func:`add_common_args`' values before any work; returns the progress wrapper (None
    with ``-q`` or when stderr is not a terminal).

    Raises:
        ScenarioError: ``--repetitions`` or ``--jobs`` below 1, an output path that cannot be
            written (naming the flag).
    """
    from sim.atomic import check_output_path
    from sim.bounds import REPETITIONS_MAX

    if not 1 <= args.repetitions <= REPETITIONS_MAX:
        raise ScenarioError(f"must be 1 to {REPETITIONS_MAX}, got {args.repetitions}", field="--repetitions")
    if args.jobs is not None and args.jobs < 1:
        raise ScenarioError(f"must be >= 1, got {args.jobs}", field="--jobs")
    seen: dict[str, str] = {}
    # the table is CSV, the summary markdown, the figure PNG: a name that says otherwise misleads
    # (the table's and the summary's names: check_outputs_spare_inputs, after what they would replace)
    for flag, suffix in (("out", None), ("figure", ".png"), ("summary", None)):
        if getattr(args, flag) is not None:  # an empty path is refused, not taken as no output
            check_output_path(getattr(args, flag), f"--{flag}", **({"suffix": suffix} if suffix else {}))
            real = os.path.realpath(getattr(args, flag))
            if real in seen:
                raise ScenarioError(f"'{getattr(args, flag)}' is also {seen[real]}'s file; give each output its own",
                                    field=f"--{flag}")
            seen[real] = f"--{flag}"
    from sim.cli.progress import bar, progress_enabled

    if not progress_enabled(args.quiet):  # -q, or stderr not a terminal (a pipe, a file, a CI log)
        return None
    return lambda it: bar(it, desc="simulating", unit="scenario")


#: what a run folder's measurements are kept in (llama-bench.jsonl, invocations.jsonl, the host
#: sampler's and the build's records, packed logs): never an output's place
RUN_DATA_SUFFIXES = (".jsonl", ".json", ".gz", ".tgz", ".tar", ".txt", ".log", ".csv.gz")


#: the format of each output flag of the llama.cpp tools (compare, ab, pool, vramcheck, nodetime:
#: tables as CSV, summaries as markdown); ``fit --out`` writes TOML
OUTPUT_FORMATS = {"--out": ".csv", "--summary": ".md"}


def check_outputs_spare_inputs(outputs: dict[str, str | None], run_dirs=(), files=(), toml_ok: bool = False,
                               formats: dict[str, str] | None = None) -> None:
    """Refuse an output path that is one of the command's inputs: a measurement file of a run
    folder (an existing file under ``run_dirs`` whose name ends in :data:`RUN_DATA_SUFFIXES`,
    ``llama-bench.jsonl`` and ``invocations.jsonl`` among them; the outputs that tools write
    beside them, ``compare_*.csv``/``.md``/``.png``, stay writable; its ``grid.toml``, kernel
    tables and ``perf/``, ``logs/`` do not) or one of ``files`` (a hardware profile, a CPU table);
    a shipped input or document (:func:`sim.resources.shipped_input`: ``scenarios/``, the published
    measurements, ``README.md``...); and, unless ``toml_ok``, any existing ``.toml`` file (a table or
    figure over a model or grid file). A hardware profile among ``files`` brings its kernel tables (fresh-user round 10: ``compare
    --summary`` over ``kernels-cuda.csv`` broke every later run). ``outputs``: flag -> path (None:
    not given). Then each output's name against its format (``formats``, default
    :data:`OUTPUT_FORMATS`): a name ending in another format's suffix (``--out x.md`` for a CSV)
    is refused (:func:`sim.atomic.check_output_path`'s ``writes``).

    Raises:
        ScenarioError: naming the output's flag and the input it would overwrite (the
            measurements would be lost: fresh-user round 7 replaced llama-bench.jsonl by CSV), or
            a name of another format.
    """
    ins: dict[str, str] = {}
    for d in run_dirs:
        for f in Path(d).rglob("*"):
            rel = f.relative_to(d).parts
            if f.is_file() and (f.name.endswith(RUN_DATA_SUFFIXES) or f.name == "grid.toml"
                                or f.name.startswith("kernels-") or rel[0] in ("perf", "logs")):
                ins.setdefault(os.path.realpath(f), f"a measurement file of run folder {d}")
    from sim.model.specs import profile_kernel_tables

    for f in files:
        if f:
            ins.setdefault(os.path.realpath(f), "an input of this command")
            if str(f).lower().endswith(".toml"):   # a hardware profile: its kernel tables are inputs too
                for t in profile_kernel_tables(f):
                    ins.setdefault(os.path.realpath(t), f"a kernel table of the hardware profile {f}, an input of "
                                                        "this command")
    from sim.resources import shipped_input

    for flag, path in outputs.items():
        what = (ins.get(os.path.realpath(path)) or shipped_input(path)) if path else None
        if what:
            raise ScenarioError(f"'{path}' is {what}: writing there would replace it; give "
                                "the output another path", field=flag)
        if path and not toml_ok and Path(path).suffix.lower() == ".toml" and Path(path).is_file():
            # a table or a figure over a TOML is never wanted: a model, hardware or grid file
            noun = {"--out": "table", "--summary": "summary", "--figure": "figure"}.get(flag, "file")
            raise ScenarioError(f"'{path}' is a TOML file (a model, hardware profile or grid?): the {noun} written "
                                "there would replace it; give the output another path", field=flag)
    from sim.atomic import check_output_path

    for flag, path in outputs.items():
        fmt = (OUTPUT_FORMATS if formats is None else formats).get(flag)
        if path and fmt:
            check_output_path(path, flag, writes=fmt)


def write_outputs(args: argparse.Namespace, prog: str, df: pd.DataFrame, md: str, plot,
                  table: pd.DataFrame | None = None) -> None:
    """Write ``--out`` (``table``, default ``df``), ``--summary`` (``md``) and ``--figure``
    (``plot(df, path)``; a figure that cannot be drawn is a warning), then print ``md``. All or none: the figure is
    drawn first (into a temporary folder), then the files are moved into place together
    (:func:`sim.atomic.write_atomic_many`), so an interruption or a failed write leaves every
    earlier file of those names as it was."""
    from sim.atomic import drawn_bytes, write_atomic, write_atomic_many

    files: dict[str, str | bytes] = {}
    if args.out:
        files[args.out] = (df if table is None else table).to_csv(index=False)
    if args.summary:
        files[args.summary] = md
    if args.figure:
        try:
            files[args.figure] = drawn_bytes(lambda path: plot(df, path))
        except ValueError as exc:
            print(f"{prog}: warning: no figure: {exc}", file=sys.stderr)
    # a device or FIFO (/dev/stdout) is written in place, after the files (write_atomic)
    special = {p: d for p, d in files.items() if os.path.exists(p) and not os.path.isfile(os.path.realpath(p))}
    write_atomic_many({p: d for p, d in files.items() if p not in special})
    for p, d in special.items():
        write_atomic(p, d)
    sys.stdout.write(md)


#: a row whose measured t/s is this many times above or below the prediction is named in a warning
#: (:func:`say_unsimulated`): every committed row is within 5.6x (the untuned CuPy profile's worst); a
#: unit mix-up is 1000x
FAR_OFF = 10.0


def say_unsimulated(prog: str, df: pd.DataFrame, *, where: str = "", run: str = "") -> None:
    """On stderr: each row of ``df`` (:func:`compare`'s) its invocation's command line did not ask
    for, one line each; a warning naming the rows measured over :data:`FAR_OFF` times away from
    their prediction; up to five other rows without a prediction with their note; then the count
    (``run``: the folder, when a tool reads several)."""
    of = f"{run}: " if run else ""
    disagree = df.attrs.get("disagreements", {})
    for ln in sorted(disagree):  # each row the command line did not ask for, one line each
        print(f"{prog}: {of}{disagree[ln]}", file=sys.stderr)
    approx = approximations(df)
    if approx:
        what = ", ".join(f"{k} ({v})" for k, v in approx.items())
        print(f"{prog}: {of}{df.attrs['n_approximated']} of {int(df.predicted_ts.notna().sum())} predicted rows rest "
              f"on an approximation of what llama.cpp ran: {what}{where}", file=sys.stderr)
    # a measured t/s ten times off the prediction is a unit or a file mix-up sooner than a miss
    # (samples_ns written in microseconds gave 2.2 M t/s for a 30B model, -99.9 %)
    ratio = df.measured_ts / df.predicted_ts
    far = df[(ratio > FAR_OFF) | (ratio < 1 / FAR_OFF)]
    if len(far):
        lines = ", ".join(str(x) for x in far.line.head(8)) + (f" and {len(far) - 8} more" if len(far) > 8 else "")
        print(f"{prog}: {of}warning: {len(far)} row(s) measure over {FAR_OFF:g}x away from the prediction (line "
              f"{lines}): check avg_ns/samples_ns are nanoseconds and the rows are of this model and GPU",
              file=sys.stderr)
    n_bad = int(df.predicted_ts.isna().sum())
    if n_bad:
        bad = df[df.predicted_ts.isna() & ~df.line.isin(list(disagree))]
        for _, r in bad.head(5).iterrows():
            note = str(r["note"])
            print(f"{prog}: {of}line {r['line']} ({r['test']}) "
                  + (note if note.startswith("not simulated") else f"not simulated: {note}"), file=sys.stderr)
        more = f"; {n_bad - 5} more" if n_bad > 5 else ""
        print(f"{prog}: {of}{n_bad} of {len(df)} rows not simulated{more}{where}", file=sys.stderr)


#: what a predicted row's note says when the simulator priced something other than what llama.cpp ran
#: (:func:`approximations`): (text the clause starts with, text it contains, the kind's label). A
#: variant's settings and pp+tg's two tests describe the row; they are not approximations.
_APPROXIMATIONS = (
    ("no_kv_offload", "", "no_kv_offload"), ("split_mode", "not modelled", "split_mode"),
    ("lazy_mode", "not modelled", "lazy_mode on"), ("embeddings", "not modelled", "embeddings"),
    ("KV ", "VRAM counts its size", "quantised KV"), ("tensor_split", "", "tensor_split"),
    ("model_size", "differs", "model_size"), ("n_threads", "", "n_threads"), ("no_host with repack", "", "repack"),
    ("backend", "simulated as", "backend"), ("flash_attn off", "", "flash_attn off"),
    ("attention at depth", "unfused", "unfused attention at depth"),
    # a field the row lacks, its llama-bench default assumed (build_cases)
    ("the row has no n_cpu_moe", "assumed", "n_cpu_moe missing: 0 assumed"),
    ("the row has no load_mode", "assumed", "load_mode missing: auto (mmap) assumed"),
    ("the row has no flash_attn", "assumed", "flash_attn missing: auto assumed"),
    ("no samples_ns/samples_ts", "assumed", "samples missing: -r 5 assumed"),
    # llama-bench's saved depth state (restored_depth_notes)
    ("depth ", "restored after a pp test", "tg at depth restored after a pp test"),
)


def approximations(df: pd.DataFrame) -> dict[str, int]:
    """Of ``df``'s predicted rows (:func:`compare`'s; ``predicted_ts`` not NaN), how many carry each
    kind of approximation in their ``note`` (clauses separated by ``; ``, matched against
    ``_APPROXIMATIONS``), most frequent first; sets ``df.attrs["n_approximated"]`` to the number of
    rows with at least one. ``{}`` for a frame without a ``note`` column."""
    counts: dict[str, int] = {}
    n_rows = 0
    if "note" in df.columns:
        for note in df.loc[df.predicted_ts.notna(), "note"].dropna():
            kinds = {label for c in str(note).split("; ") for start, has, label in _APPROXIMATIONS
                     if c.startswith(start) and has in c}
            n_rows += bool(kinds)
            for k in kinds:
                counts[k] = counts.get(k, 0) + 1
    df.attrs["n_approximated"] = n_rows
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def run_cli(prog: str, body, args=None) -> int:
    """Run ``body()`` (returns the exit status); a bad input or an unwritable output is one line
    on stderr and exit status 2; Ctrl-C or SIGTERM stops the worker processes and is one line
    and exit status 130 / 143 (:func:`sim.cli.interrupt.run_interruptible`). ``args``: the parsed
    flags, so that an unwritable output is named by its flag (``--out``, ``--figure``)."""
    from sim.cli.interrupt import run_interruptible

    def guarded() -> int:
        try:
            return body()
        except PrefetchSimError as exc:
            print(f"{prog}: error: {exc}", file=sys.stderr)
            return 2
        except BrokenPipeError:
            raise   # a closed stdout: run_interruptible's quiet 141
        except OSError as exc:
            from sim.atomic import flag_of

            name = getattr(exc, "filename", None)
            where = f" '{name}'{flag_of(args, name) if args is not None else ''}" if name else ""
            print(f"{prog}: error: cannot write{where}: {exc.strerror or exc}", file=sys.stderr)
            return 2

    return run_interruptible(prog, guarded)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m calibrate.llamacpp.compare",
                                 description="Predicted (simulator) vs measured (llama-bench) t/s of a run "
                                             "folder; prints an error summary as markdown.")
    add_common_args(ap, out_help="write one row per measured row", figure_help="write the predicted-vs-measured scatter",
                    summary_help="write the summary table (markdown)")
    ap.add_argument("--repeat", metavar="RUN_DIR", default=None,
                    help="the same grid measured on another machine: adds a repeat_ts column and a table of "
                         "llama-bench's machine-to-machine differences beside the simulator's error on those rows")
    ap.add_argument("--max-steal", dest="max_steal", type=non_negative_pct, default=None, metavar="PCT",
                    help="leave out of the figures the rows of model loads during which the hypervisor took more "
                         "than PCT %% of the CPU time (/proc/stat steal, from the lease's host_state.jsonl), or whose "
                         "steal is unknown; they stay in --out with a note (a --repeat folder's such loads are left "
                         "out of its table alike). A host-side decode's t/s falls with steal: docs/llamacpp.md")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (2 with a one-line message on a bad input)."""
    args = build_parser().parse_args(argv)
    prog = "compare"

    def body() -> int:
        progress = check_common_args(args)
        # the inputs first (a --repeat folder is read only after the whole first comparison)
        check_run_dir(args.run_dir)
        if args.repeat:
            check_run_dir(args.repeat, field="--repeat")
            if os.path.realpath(args.repeat) == os.path.realpath(args.run_dir):
                raise ScenarioError(f"'{args.repeat}' is the run folder itself; give the same grid measured on "
                                    "another machine", field="--repeat")
            check_distinct_runs([args.run_dir, args.repeat], field="--repeat")
        check_outputs_spare_inputs({"--out": args.out, "--figure": args.figure, "--summary": args.summary},
                                   [args.run_dir] + ([args.repeat] if args.repeat else []),
                                   [hardware_path(args.hardware)])
        df = compare(args.run_dir, args.hardware, args.engine, repetitions=args.repetitions, jobs=args.jobs,
                     progress=progress, max_work=args.max_work)
        title = (f"Predicted vs measured: {args.run_dir} on profile '{df.attrs['hardware']}' ({args.hardware}) "
                 f"({args.engine} engine, {args.repetitions} routing draws per MoE row)")
        df = attach_canary(df, args.run_dir)
        try:
            df = attach_steal(df, args.run_dir)
        except ScenarioError as exc:
            # the host sampler's record only adds the steal columns: a bad one loses them, unless
            # --max-steal needs them (another file's error, invocations.jsonl's, stays an error)
            if args.max_steal is not None or Path(exc.file or "").name not in HOST_STATE_FILES:
                raise
            print(f"{prog}: warning: {exc}; the steal columns are left out (only --max-steal needs them)",
                  file=sys.stderr)
        full = df
        if args.max_steal is not None:  # the figures are of the loads the hypervisor left alone
            gated = steal_gate(df, args.max_steal, args.run_dir)
            why = df.host_steal_pct.map(lambda v: f"left out of the figures (--max-steal {args.max_steal:g}): "
                                        + (f"steal {v:.2f} % during its load" if v == v else "steal unknown"))
            full = df.copy()
            full.loc[gated, "note"] = [f"{n}; {w}" if isinstance(n, str) and n else w
                                       for n, w in zip(full.note[gated], why[gated])]
            df = df[~gated.to_numpy()]
            title += (f"; loads with steal <= {args.max_steal:g} % only: {len(df)} of {len(full)} rows "
                      f"({df.invocation.nunique()} of {full.invocation.nunique()} loads)")
            if not len(df):
                known = full.host_steal_pct.notna().any()
                raise ScenarioError(f"no load of {args.run_dir} ran with steal <= {args.max_steal:g} %" if known else
                                    f"the steal of no load of {args.run_dir} is known (host_state.jsonl has fewer than "
                                    "two samples inside any invocation's run)", field="--max-steal")
        md = summary_markdown(summarize(df), title)
        for line in (canary_line(df), steal_line(df)):
            if line:
                md += "\n" + line
        within = attach_within_repeat(df)
        if within.repeat_ts.notna().any():
            md += "\n" + repro_markdown(
                reproducibility(within), f"Repeatability within {args.run_dir}: each configuration measured in "
                "separate invocations (model loads) against the mean of its other invocations")
            means = mean_over_loads(df)
            loads = means.n_loads
            md += "\n" + summary_markdown(
                summarize(means), f"Averaged over model loads: {args.run_dir}, one row per configuration, "
                f"measured t/s the mean of its invocations ({int(loads.min())}..{int(loads.max())} loads, "
                f"{plural(len(means), 'configuration')})")
        if args.repeat:
            rep = compare(args.repeat, args.hardware, args.engine, repetitions=args.repetitions, jobs=args.jobs,
                          progress=progress, max_work=args.max_work)
            if args.max_steal is not None:  # the repeat's disturbed loads are left out alike
                rep = attach_steal(rep, args.repeat)
                rep = rep[~steal_gate(rep, args.max_steal, args.repeat).to_numpy()]
            key = repeat_key(df, rep)
            df = attach_repeat(df, rep, key)
            how = "invocation and configuration" if key == REPEAT_KEY else "configuration (the grids differ)"
            md += "\n" + repro_markdown(reproducibility(df), f"Reproducibility: {args.run_dir} against its repeat "
                                                              f"{args.repeat} (|error| on the rows both have, "
                                                              f"matched by {how})")
            if not df.repeat_ts.notna().any():
                print(f"{prog}: warning: --repeat {args.repeat} shares no row with {args.run_dir} (matched by "
                      f"{how}): its table is empty", file=sys.stderr)
        if len(df) and df.predicted_ts.isna().all():  # nothing to compare: no table, no files
            first = df.iloc[0]
            print(f"{prog}: error: none of the {len(df)} rows of {args.run_dir} could be simulated on this profile "
                  f"(line {first['line']}: {first['note']})", file=sys.stderr)
            return 2
        table = None
        if len(full) != len(df):  # --max-steal: every row in --out, those left out with their note
            table = pd.concat([df, full[~full.line.isin(df.line)]]).sort_values("line", kind="stable")
        write_outputs(args, prog, df, md, plot_compare, table=table)
        for w in warnings(df):
            print(f"{prog}: warning: {w}", file=sys.stderr)
        say_unsimulated(prog, df, where=f" (the note column of {args.out})" if args.out else
                        " (--out CSV: a note per row)")
        return 0

    return run_cli(prog, body, args)


if __name__ == "__main__":
    sys.exit(main())
