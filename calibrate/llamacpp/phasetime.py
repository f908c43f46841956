"""Read the ``phase-time`` patch's lines (:data:`calibrate.llamacpp.patches.PHASE_TIME`): where
llama.cpp's host time goes around each graph compute of a llama-bench run, and the host figures
the profile takes from them.

``python -m calibrate.llamacpp.phasetime RUN_DIR`` reads a phase-timing lease
(``calibrate/llamacpp/grids/h200-phase.toml``; llama-bench's stderr in ``logs/<id>.log`` or
``logs.tar.gz``), puts every ``llama_decode`` call on the llama-bench row and step it belongs to
(warm-up, depth fill, prompt, generation: :func:`expected_calls`, llama-bench's own order), and
prints the median per test of each phase, then the measured host figures (:func:`host_figures`).

Phases of one ``llama_decode`` call (microseconds in the log, seconds here):

* ``pre``: from the entry of ``llama_decode`` to the first ubatch (the batch allocator's
  checks, the memory's ubatch split and slot search);
* per ubatch: ``apply`` (the memory context's apply), ``build`` and ``alloc`` (graph build and
  the scheduler's split and allocation; both 0 when llama.cpp reuses the previous graph),
  ``inputs`` (``set_input`` of every graph input; ``mask`` is the KQ masks' share), ``compute``
  (``ggml_backend_sched_graph_compute_async``: CPU splits run in it, GPU splits are launched);
* ``wait``: ``llama_synchronize``'s wait for the backends (prompt: once after the last call of a
  ``test_prompt``; generation: after every token);
* ``period``: entry to the next call's entry.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from sim.errors import PrefetchSimError
from sim.wording import plural

TAGS = ("decode-time", "phase-time", "input-time", "sync-time")
_LINE = re.compile(r"^prefetch-sim (decode-time|phase-time|input-time|sync-time): (.*)$")
_KV = re.compile(r"(\w+)=(\S+)")
#: ``set_input`` classes of the KQ masks (``typeid(...).name()`` as the patch prints them)
MASK_INPUTS = ("llm_graph_input_attn_kv", "llm_graph_input_attn_kv_iswa", "llm_graph_input_attn_no_cache")
#: prompt ubatches with fewer tokens than this are not used for the per-entry mask price
MIN_MASK_TOKENS = 256


@dataclass
class Call:
    """One ``llama_decode`` call and what the patch printed inside it.

    Attributes:
        t0_us: entry time (``ggml_time_us``).
        ubatches: the phase lines' fields (ints), one dict per ubatch; ``mask_us`` added from the
            matching input line (the KQ masks' ``set_input``).
        wait_us: the first ``llama_synchronize`` wait after it (None without one).
    """

    t0_us: int
    ubatches: list = field(default_factory=list)
    wait_us: int | None = None


def _int_field(obj: dict, key: str, where: str, default: int | None = None, minimum: int = 0) -> int:
    """``obj[key]`` as an int >= ``minimum`` (``default`` when absent and given).

    Raises:
        PrefetchSimError: missing, not an integer, or below ``minimum``, naming ``where`` and the field.
    """
    v = obj.get(key, default) if isinstance(obj, dict) else None
    if v is None:
        raise PrefetchSimError(f"{where}: field '{key}' missing")
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise PrefetchSimError(f"{where}: field '{key}' must be an integer, got {v!r}")
    try:
        n = int(v)
    except ValueError:
        raise PrefetchSimError(f"{where}: field '{key}' must be an integer, got {v!r}") from None
    if n != float(v) or n < minimum:
        raise PrefetchSimError(f"{where}: field '{key}' must be an integer >= {minimum}, got {v!r}")
    return n


def _ints(text: str) -> dict:
    return {k: int(v) for k, v in _KV.findall(text) if re.fullmatch(r"-?\d+", v)}


def _mask_us(inputs: str) -> int:
    tot = 0
    for part in inputs.split(","):
        name, _, us = part.rpartition(":")
        if any(name.endswith(m) and name[: len(name) - len(m)].isdigit() for m in MASK_INPUTS):
            tot += int(us)
    return tot


def parse_phase_time(text: str, name: str = "log") -> list[Call]:
    """The calls of a stderr log, in order (lines of other kinds are ignored).

    Raises:
        ValueError: a malformed phase line (naming ``name`` and the line number), or a phase
            line before any ``decode-time`` line.
    """
    calls: list[Call] = []
    pending_mask: int | None = None
    for no, ln in enumerate(text.splitlines(), 1):
        m = _LINE.match(ln.strip())
        if not m:
            continue
        tag, rest = m.groups()
        try:
            if tag == "decode-time":
                t0 = _ints(rest).get("t0")
                if t0 is None:
                    raise ValueError("no integer t0")
                calls.append(Call(t0))
            elif tag == "input-time":
                pending_mask = _mask_us(rest.split("inputs=", 1)[1])
            elif tag == "phase-time":
                if not calls:
                    raise ValueError("phase line before any decode-time line")
                d = _ints(rest)
                for k in ("n_tokens", "reused", "t0", "apply_us", "build_us", "alloc_us", "inputs_us", "compute_us"):
                    if k not in d:
                        raise ValueError(f"no integer {k}")
                d["mask_us"] = pending_mask if pending_mask is not None else 0
                pending_mask = None
                calls[-1].ubatches.append(d)
            elif tag == "sync-time" and calls and calls[-1].wait_us is None:
                w = _ints(rest).get("wait_us")
                if w is None:
                    raise ValueError("no integer wait_us")
                calls[-1].wait_us = w
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"{name}:{no}: malformed {tag} line ({exc}): {ln[:120]!r}") from None
    return calls


def expected_calls(rows: list[dict], reps: int, where: str = "llama-bench.jsonl"
                   ) -> list[tuple[int, str, int, int, int]]:
    """llama-bench's ``llama_decode`` calls for an invocation's rows, in its order:
    ``(row, step, rep, n_tokens, kv_before)`` with ``step`` one of ``warmup``, ``depth``,
    ``prompt``, ``gen``. Per row (``tools/llama-bench``): a warm-up prompt of ``n_prompt`` tokens
    and one warm-up token, then per repetition the depth fill (only the first time a depth is
    seen: later ones restore the saved state), the prompt in ``n_batch`` calls and ``n_gen``
    single-token calls.

    Raises:
        PrefetchSimError: a row lacks ``n_prompt``, ``n_gen`` or ``n_batch`` or has one that is
            not a non-negative integer (``n_batch`` >= 1), naming ``where`` and the row.
    """
    out = []
    seen_depth = 0
    for i, r in enumerate(rows):
        w = f"{where} row {i + 1}"
        p, g = _int_field(r, "n_prompt", w), _int_field(r, "n_gen", w)
        d, b = _int_field(r, "n_depth", w, 0), _int_field(r, "n_batch", w, minimum=1)
        for done in range(0, p, b):
            out.append((i, "warmup", -1, min(b, p - done), done))
        if g:
            out.append((i, "warmup", -1, 1, 0))
        for rep in range(reps):
            if d and d != seen_depth:
                for done in range(0, d, b):
                    out.append((i, "depth", rep, min(b, d - done), done))
                seen_depth = d
            for done in range(0, p, b):
                out.append((i, "prompt", rep, min(b, p - done), d + done))
            for j in range(g):
                out.append((i, "gen", rep, 1, d + p + j))
    return out


def call_table(run_dir: str | Path) -> pd.DataFrame:
    """One row per ubatch of every phase-timed invocation of a run folder: the invocation, the
    llama-bench row (its ``n_prompt``, ``n_gen``, ``n_depth``, ``n_ubatch``), step and rep of
    its call (:func:`expected_calls`), the ubatch's index in the call and KV cells before it, and
    the phases (seconds; call-level ``pre_s``, ``wait_s``, ``period_s`` on the call's first
    ubatch, NaN on the others).

    Raises:
        PrefetchSimError: no invocation with ``PREFETCH_SIM_PHASE_TIME``, or a log whose calls do
            not match llama-bench's order for its rows (named).
    """
    from .compare import jsonl_objects, read_invocations
    from .grid import read_log

    run = Path(run_dir)
    if run.exists() and not run.is_dir():
        raise PrefetchSimError(f"{run}: not a folder (give a phase-timing lease's run folder)")
    invs = read_invocations(run / "invocations.jsonl")
    rows = [r for _no, r in jsonl_objects(run / "llama-bench.jsonl", "llama-bench row")]
    out = []
    at = 0
    for k_inv, inv in enumerate(invs, 1):
        where = f"{run / 'invocations.jsonl'}:{k_inv}"
        n_rows = _int_field(inv, "rows", where, 0)
        inv_rows, at = rows[at:at + n_rows], at + n_rows
        env = inv.get("env") or {}
        if not isinstance(env, dict):
            raise PrefetchSimError(f"{where}: field 'env' must be a table of variables, got {env!r}")
        if "PREFETCH_SIM_PHASE_TIME" not in env:
            continue
        if not isinstance(inv.get("id"), str) or not inv["id"]:
            raise PrefetchSimError(f"{where}: field 'id' missing or not a string")
        log = inv.get("log", f"logs/{inv['id']}.log")
        if not isinstance(log, str):
            raise PrefetchSimError(f"{where}: field 'log' must be a path, got {log!r}")
        try:
            text = read_log(run, log)
        except FileNotFoundError:
            raise PrefetchSimError(f"{run}/{log}: log not found (nor in {run}/logs.tar.gz); named by {where}") from None
        except IsADirectoryError:
            raise PrefetchSimError(f"{run}/{log}: a folder, not a log; named by {where}") from None
        calls = parse_phase_time(text, f"{run}/{log}")
        exp = expected_calls(inv_rows, _int_field(inv, "repetitions", where, 1, minimum=1),
                             f"{run / 'llama-bench.jsonl'} (invocation {inv['id']})")
        if len(calls) != len(exp):
            raise PrefetchSimError(f"{run}/{log}: {plural(len(calls), 'llama_decode call')}, llama-bench's order "
                                   "for the "
                                   f"{plural(len(inv_rows), 'row')} gives {len(exp)}")
        for c, (ri, step, rep, n_tok, kv) in zip(calls, exp):
            got = sum(u["n_tokens"] for u in c.ubatches)
            if got != n_tok:
                raise PrefetchSimError(f"{run}/{log}: a {step} call of row {ri} has {got} tokens, llama-bench's "
                                       f"order gives {n_tok}")
        for k, (c, (ri, step, rep, n_tok, kv)) in enumerate(zip(calls, exp)):
            r = inv_rows[ri]
            nxt = calls[k + 1].t0_us if k + 1 < len(calls) else None
            done = 0
            for j, u in enumerate(c.ubatches):
                out.append({
                    "invocation": inv["id"], "model_toml": inv.get("model_toml", ""), "row": ri,
                    "n_prompt": int(r["n_prompt"]), "n_gen": int(r["n_gen"]), "n_depth": int(r.get("n_depth", 0)),
                    "n_ubatch": int(r["n_ubatch"]), "n_cpu_moe": int(r.get("n_cpu_moe", 0)),
                    "flash_attn": r.get("flash_attn"),
                    "n_gpu_layers": int(r.get("n_gpu_layers", 99)), "step": step, "rep": rep, "call": k,
                    "call_tokens": n_tok, "ubatch": j, "n_tokens": u["n_tokens"], "kv_before": kv + done,
                    "reused": u["reused"],
                    "pre_s": (u["t0"] - c.t0_us) * 1e-6 if j == 0 else math.nan,
                    "apply_s": u["apply_us"] * 1e-6, "build_s": u["build_us"] * 1e-6,
                    "alloc_s": u["alloc_us"] * 1e-6, "inputs_s": u["inputs_us"] * 1e-6,
                    "mask_s": u["mask_us"] * 1e-6, "compute_s": u["compute_us"] * 1e-6,
                    "wait_s": c.wait_us * 1e-6 if j == 0 and c.wait_us is not None else math.nan,
                    "period_s": (nxt - c.t0_us) * 1e-6 if j == 0 and nxt is not None else math.nan,
                })
                done += u["n_tokens"]
    if not out:
        raise PrefetchSimError(f"{run}: no invocation ran with PREFETCH_SIM_PHASE_TIME (grid env)")
    return pd.DataFrame(out)


def summary(tab: pd.DataFrame) -> pd.DataFrame:
    """Per invocation, llama-bench row and step (prompt, gen), the median over its calls of the
    call's phases summed over its ubatches (ms); ``reused`` 1 when every ubatch reused its graph."""
    t = tab[tab["step"].isin(["prompt", "gen"])]
    keys = ["invocation", "row", "n_prompt", "n_gen", "n_depth", "n_ubatch", "step"]
    phases = ["apply_s", "build_s", "alloc_s", "inputs_s", "mask_s", "compute_s"]
    rows = []
    for key, g in t.groupby(keys, sort=False):
        calls = []
        for _k, c in g.groupby("call", sort=False):
            first = c.iloc[0]
            rec = {p: c[p].sum() for p in phases}
            rec.update(pre_s=first["pre_s"], wait_s=first["wait_s"], period_s=first["period_s"],
                       ubatches=len(c), reused=int(c["reused"].min()))
            calls.append(rec)
        cd = pd.DataFrame(calls)
        rec = dict(zip(keys, key))
        rec["calls"] = len(cd)
        for col in ["pre_s", *phases, "wait_s", "period_s"]:
            rec[col[:-2] + "_ms"] = float(cd[col].median()) * 1e3
        rec["ubatches"] = int(cd["ubatches"].median())
        rec["reused"] = int(cd["reused"].min())
        rows.append(rec)
    return pd.DataFrame(rows)


def host_figures(tab: pd.DataFrame, run_label: str) -> dict[str, tuple[float, str]]:
    """The host figures a profile takes from a phase-timing lease, ``{key: (value, source)}``:

    * ``mask_ns``: ns per KQ-mask entry llama.cpp's host visits (:func:`sim.model.ggmlcost.mask_entries`
      of the ubatch's model, tokens and KV cells before it): the median over prompt ubatches of at
      least :data:`MIN_MASK_TOKENS` tokens of ``mask_s / entries``;
    * ``call_us``, ``call_ns_per_token``: a ``llama_decode`` call's ``pre`` phase, a least-squares
      line in the call's tokens over every prompt and generation call;
    * ``apply_ns_per_token``: the memory apply per ubatch token, the median of ``apply_s /
      n_tokens`` over prompt ubatches of at least :data:`MIN_MASK_TOKENS` tokens;
    * ``capture_us_per_layer``: capturing and instantiating a reused graph's CUDA graph, per
      model layer: per one-ubatch prompt row, the first timed repetition's ``compute_s`` less the
      median of the later ones' (the warm-up ran the graph directly, the first repetition
      captures it), the median over rows;
    * ``build_us_per_layer``: graph build plus the scheduler's allocation of a graph llama.cpp
      does not reuse, per model layer: the median over such ubatches whose allocation did not
      wait for the GPU (``alloc_s`` below 5 ms: a re-plan synchronises every backend first).

    Raises:
        PrefetchSimError: no prompt ubatch to measure a figure on.
    """
    from sim.model.ggmlcost import mask_entries
    from sim.model.specs import load_model

    from .compare import resolve

    models: dict[str, object] = {}

    def model(p):
        if p not in models:
            try:
                models[p] = load_model(resolve(p, Path(run_label), Path.cwd()))
            except (OSError, PrefetchSimError) as exc:
                raise PrefetchSimError(f"{run_label}/invocations.jsonl: field 'model_toml' {p!r}: {exc}") from None
        return models[p]

    big = tab[(tab["step"] == "prompt") & (tab["n_tokens"] >= MIN_MASK_TOKENS)]
    if big.empty:
        raise PrefetchSimError(f"{run_label}: no prompt ubatch of >= {MIN_MASK_TOKENS} tokens with phase timing")
    ent = np.array([mask_entries(model(r.model_toml), int(r.n_tokens), int(r.kv_before)) for r in big.itertuples()])
    mask_ns = float(np.median(big["mask_s"].to_numpy() / ent) * 1e9)
    calls = tab[tab["step"].isin(["prompt", "gen"]) & tab["pre_s"].notna()]
    slope, icpt = np.polyfit(calls["call_tokens"].to_numpy(float), calls["pre_s"].to_numpy(float), 1)
    apply_ns = float(np.median(big["apply_s"] / big["n_tokens"]) * 1e9)
    nr = tab[(tab["reused"] == 0) & (tab["alloc_s"] < 5e-3) & (tab["step"] == "prompt")]
    if nr.empty:
        raise PrefetchSimError(f"{run_label}: no prompt ubatch whose graph llama.cpp rebuilt")
    per_layer = [(r.build_s + r.alloc_s) / model(r.model_toml).n_layer for r in nr.itertuples()]
    # the CUDA-graph capture: a one-ubatch prompt's first timed repetition against its later ones
    one = tab[(tab["step"] == "prompt") & (tab["n_prompt"] <= tab["n_ubatch"]) & (tab["n_prompt"] > 0)]
    cap = []
    for (_inv, _row), g in one.groupby(["invocation", "row"]):
        first = g[g["rep"] == 0]["compute_s"]
        later = g[g["rep"] > 0]["compute_s"]
        if len(first) and len(later):
            cap.append((float(first.iloc[0]) - float(later.median())) / model(g["model_toml"].iloc[0]).n_layer)
    if not cap:
        raise PrefetchSimError(f"{run_label}: no one-ubatch prompt with several repetitions")
    src = f"measured: llama-bench with the phase-time patch ({run_label}, calibrate.llamacpp.phasetime)"
    return {
        "mask_ns": (mask_ns, f"{src}: the KQ masks' set_input per entry visited, median of "
                             f"{plural(len(big), 'prompt ubatch', 'prompt ubatches')} of >= {MIN_MASK_TOKENS} tokens"),
        "call_us": (max(float(icpt), 0.0) * 1e6, f"{src}: llama_decode's work before the first ubatch, intercept of a "
                                                 f"line in the call's tokens over {plural(len(calls), 'call')}"),
        "call_ns_per_token": (float(slope) * 1e9, f"{src}: the same line's slope"),
        "apply_ns_per_token": (apply_ns, f"{src}: the memory context's apply per ubatch token, median of "
                                         f"{plural(len(big), 'prompt ubatch', 'prompt ubatches')}"),
        "capture_us_per_layer": (max(float(np.median(cap)), 0.0) * 1e6,
                                 f"{src}: capturing a reused graph's CUDA graph, per model layer: the first "
                                 f"timed repetition's compute call less the later ones', median of "
                                 f"{plural(len(cap), 'one-ubatch prompt row')}"),
        "build_us_per_layer": (float(np.median(per_layer)) * 1e6,
                               f"{src}: graph build and scheduler allocation of a graph not reused, per model "
                               f"layer, median of {plural(len(nr), 'ubatch', 'ubatches')} whose allocation did not "
                               "wait for the GPU"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibrate.llamacpp.phasetime", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", help="phase-timing lease folder (invocations.jsonl, llama-bench.jsonl, logs)")
    args = ap.parse_args(argv)
    try:
        tab = call_table(args.run_dir)
        figures = host_figures(tab, args.run_dir)  # before printing: nothing half-way
        with pd.option_context("display.width", 250, "display.max_columns", 40):
            print(summary(tab).round(3).to_string(index=False))
        for k, (v, src) in figures.items():
            print(f"{k} = {v:.4g}   ({src})")
    except (PrefetchSimError, OSError, ValueError) as exc:
        print(f"phasetime: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    from sim.cli.interrupt import run_interruptible

    sys.exit(run_interruptible("phasetime", main))  # Ctrl-C / SIGTERM: one line, 130 / 143
