"""Prefetch A/B: the measured gain of the prefetch patch's llama-bench rows against the gain the
simulator predicts.

The run folder is one :mod:`calibrate.llamacpp.compare` reads (``llama-bench.jsonl``,
``invocations.jsonl``), measured with a llama-bench that has the project's prefetch patch
(:mod:`calibrate.llamacpp.prefetch_patch`): its rows carry
``prefetch_weights`` (``-pw``), ``prefetch_gate`` (``-pwg``) and ``prefetch_expert_slots``
(``-pes``) (:data:`sim.views.llamabench.PATCH_FIELDS`).
A *prefetch row* has ``prefetch_weights`` 1 or ``prefetch_expert_slots`` > 0; each is paired
(:func:`pair_rows`) with a *baseline row* (both 0; a row without the fields, from an upstream
llama-bench, is one) of the same configuration (:data:`CONFIG_FIELDS`: the same GGUF, placement,
batch sizes, attention, KV types and test), preferably from the same invocation (the same model
load, measured minutes apart), then one printing the same ``prefetch_gate``, then the nearest
line. Both rows are predicted by :func:`calibrate.llamacpp.compare.compare` (each with its
own variant, :func:`sim.views.llamabench.row_variant`), and per pair (:data:`COLUMNS`):

* **measured gain** (percent) ``g_m = 100 (on_ts / off_ts - 1)`` of the two rows' ``avg_ts``,
  and its uncertainty ``sigma`` (percentage points), propagated from the rows' ``stddev_ts``:
  ``sigma = 100 (on_ts / off_ts) sqrt((s_on / on_ts)^2 + (s_off / off_ts)^2)``, with ``s`` the
  standard error of the mean ``stddev_ts / sqrt(n)`` (``n`` the row's samples; ``--uncertainty
  sd``: ``stddev_ts`` itself, the spread of one repetition);
* **predicted gain** (percent) ``g_p = 100 (pred_on / pred_off - 1)`` of the two predictions
  (same seed, same routing draws);
* **sign agreement** (:func:`sign_agrees`): with the band ``b = max(2 sigma, min_effect)``
  (``min_effect`` 0.5 points by default: a smaller change is no effect however tight the
  measurement), a measured ``|g_m| >= b`` is a significant gain or loss, and the prediction agrees
  when it has the same sign (a predicted 0 does not); a measured ``|g_m| < b`` is no significant
  effect, and the prediction agrees when ``|g_p| < b`` too;
* **gain error** ``g_p - g_m`` (points) and the prefetch row's **t/s error**
  ``100 (pred_on / on_ts - 1)`` (percent);
* **VRAM** (MiB), when the patched llama-bench's log (``logs/<invocation>.log``, or in
  ``logs.tar.gz``) has the line it prints after creating each context::

      prefetch-sim vram: model=<path> test=<n_prompt>/<n_gen>/<n_depth> ub=<n_ubatch> pw=<0|1> \
pwg=<N> pes=<N> used_mib=<float> staging_mib=<float>

  (``used``: device total minus free on the first GPU, ``staging``: the scheduler's staging
  buffers), matched to rows by invocation, test, ``-ub`` and the three flags (in order where
  several rows share them); NaN where missing; beside them the simulator's staging and VRAM
  change (:func:`sim.model.vram.account`, GPU 0).

An optional ``identity.jsonl`` in the run folder (one check per line: ``{"model", "config",
"variant", "tokens", "hash_off", "hash_on", "identical", "first_diff_step"}``: whether the
patch's output tokens are the baseline's) is summarised at the top of the report, failures
listed one by one (:func:`read_identity`).

CLI::

    python -m calibrate.llamacpp.ab RUN_DIR [--hardware H] [--out CSV] [--figure PNG]
        [--summary MD] [--jobs N] [--repetitions 3] [--uncertainty sem|sd] [--min-effect 0.5] [-q]

Errors (a folder without prefetch rows, a missing or malformed file) print one line and exit 2.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.errors import PrefetchSimError, ScenarioError
from sim.views.llamabench import FIELDS, PATCH_FIELDS, prefetch_settings, read_llama_bench
from sim.model.specs import HardwareProfile, load_hardware, load_model
from sim.wording import plural

from . import compare as cmp
from .logs import read_run_log

#: optional file of a run folder: output-identity checks of the patch
IDENTITY_FILE = "identity.jsonl"
#: the tag of the patched llama-bench's per-context VRAM line (stderr)
VRAM_TAG = "prefetch-sim vram:"
#: keys an identity record must have (``identical`` may instead follow from the two hashes)
IDENTITY_KEYS = ("model", "config", "variant", "tokens", "hash_off", "hash_on", "identical", "first_diff_step")

#: llama-bench fields that are not the configuration: the build and machine, when the row ran,
#: its timings, and the prefetch flags themselves
_NOT_CONFIG = {"build_commit", "build_number", "cpu_info", "gpu_info", "test_time", "avg_ns", "stddev_ns", "avg_ts",
               "stddev_ts", "samples_ns", "samples_ts", *PATCH_FIELDS}
#: the fields a prefetch row and its baseline row share (``model_filename`` compared by basename)
CONFIG_FIELDS: tuple[str, ...] = tuple(f.name for f in FIELDS if f.name not in _NOT_CONFIG)

#: columns of :func:`ab`'s result, in order
COLUMNS = (
    "line", "baseline_line", "invocation", "baseline_invocation", "model", "model_kind", "variant", "prefetch_flags",
    "kind", "test",
    "n_ubatch", "n_batch", "ngl", "n_cpu_moe", "prefetch_weights", "prefetch_gate", "prefetch_expert_slots",
    "baseline_ts", "baseline_stddev_ts", "prefetch_ts", "prefetch_stddev_ts",
    "measured_gain_pct", "measured_gain_sigma_pts", "measured_effect",
    "predicted_baseline_ts", "predicted_prefetch_ts", "predicted_gain_pct", "sign_agree",
    "gain_error_pts", "prefetch_ts_error_pct",
    "vram_off_mib", "vram_on_mib", "vram_delta_mib", "staging_on_mib",
    "predicted_staging_mib", "predicted_vram_delta_mib", "note",
)

#: default floor of the no-effect band (percentage points)
MIN_EFFECT_PTS = 0.5


# --------------------------------------------------------------------------------------
# arithmetic
# --------------------------------------------------------------------------------------


def gain_pct(on: float, off: float) -> float:
    """``100 (on / off - 1)``: percent change of t/s from ``off`` to ``on`` (NaN when either is
    not a positive finite number)."""
    if not (_pos(on) and _pos(off)):
        return math.nan
    return 100.0 * (on / off - 1.0)


def gain_sigma_pts(on: float, on_sd: float, off: float, off_sd: float, on_n: int = 1, off_n: int = 1, *,
                   uncertainty: str = "sem") -> float:
    """The uncertainty (one sigma, percentage points) of :func:`gain_pct`, propagated to first
    order from each row's spread: ``100 (on / off) sqrt((s_on / on)^2 + (s_off / off)^2)`` with
    ``s`` the standard error ``sd / sqrt(n)`` (``uncertainty = "sem"``) or ``sd`` itself
    (``"sd"``). A missing spread counts as 0; NaN when either t/s is not positive.

    Raises:
        ValueError: an unknown ``uncertainty``.
    """
    if uncertainty not in ("sem", "sd"):
        raise ValueError(f"uncertainty must be 'sem' or 'sd', got {uncertainty!r}")
    if not (_pos(on) and _pos(off)):
        return math.nan

    def spread(sd: float, n: int) -> float:
        sd = sd if _finite(sd) and sd > 0 else 0.0
        return sd / math.sqrt(max(int(n), 1)) if uncertainty == "sem" else sd

    return 100.0 * (on / off) * math.hypot(spread(on_sd, on_n) / on, spread(off_sd, off_n) / off)


def effect_band(sigma_pts: float, min_effect_pts: float = MIN_EFFECT_PTS) -> float:
    """Half-width (points) of the no-effect band: ``max(2 sigma, min_effect_pts)`` (a NaN sigma
    counts as 0)."""
    s = sigma_pts if _finite(sigma_pts) else 0.0
    return max(2.0 * s, float(min_effect_pts))


def measured_effect(gain: float, sigma_pts: float, min_effect_pts: float = MIN_EFFECT_PTS) -> str | None:
    """``"gain"``, ``"loss"`` or ``"none"`` (inside the band, :func:`effect_band`); None for a
    NaN gain."""
    if not _finite(gain):
        return None
    b = effect_band(sigma_pts, min_effect_pts)
    return "gain" if gain >= b else "loss" if gain <= -b else "none"


def sign_agrees(measured: float, sigma_pts: float, predicted: float,
                min_effect_pts: float = MIN_EFFECT_PTS) -> bool | None:
    """Whether the predicted gain agrees with the measured one (module docstring): a significant
    measured gain or loss (``|measured| >= band``) needs a prediction of the same sign; no
    significant effect needs ``|predicted| < band``. None when either gain is NaN."""
    if not (_finite(measured) and _finite(predicted)):
        return None
    b = effect_band(sigma_pts, min_effect_pts)
    if abs(measured) >= b:
        return bool(np.sign(predicted) == np.sign(measured))
    return abs(predicted) < b


# --------------------------------------------------------------------------------------
# pairing
# --------------------------------------------------------------------------------------


def is_prefetch_row(row: Mapping[str, Any]) -> bool:
    """``prefetch_weights`` 1 or ``prefetch_expert_slots`` > 0 (:func:`sim.views.llamabench.prefetch_settings`)."""
    pw, _, pes = prefetch_settings(row)
    return bool(pw or pes)


def config_key(row: Mapping[str, Any]) -> tuple:
    """The configuration of a row (:data:`CONFIG_FIELDS`), ``model_filename`` by basename, NaN
    and absent alike (None)."""
    out = []
    for k in CONFIG_FIELDS:
        v = row.get(k) if hasattr(row, "get") else None
        if v is None or (isinstance(v, float) and math.isnan(v)):
            v = None
        elif k == "model_filename":
            v = Path(str(v)).name
        elif isinstance(v, (bool, np.bool_)):
            v = bool(v)
        elif isinstance(v, (int, float, np.integer, np.floating)):
            v = float(v)
        out.append(v)
    return tuple(out)


def invocation_label(inv: Mapping[str, Any] | None) -> str | None:
    """An invocation's ``id``, else ``line N`` of ``invocations.jsonl``; None for no invocation."""
    if inv is None:
        return None
    if inv.get("id") is not None:
        return str(inv["id"])
    return f"line {inv['_line']}" if inv.get("_line") is not None else None


def pair_rows(bench: pd.DataFrame, owners: Sequence[dict | None]) -> list[tuple[int, int | None]]:
    """``(prefetch line, baseline line or None)`` for every prefetch row of ``bench`` (a
    :func:`sim.views.llamabench.read_llama_bench` frame, index = line), in file order. ``owners``: the
    invocation of each row (:func:`calibrate.llamacpp.compare._attribute`; None unknown).

    The baseline: a row with ``prefetch_weights`` 0 and ``prefetch_expert_slots`` 0 and the same
    :func:`config_key`; of several, the first by (another invocation, a different
    ``prefetch_gate``, distance in lines). A baseline row may serve several prefetch rows.
    """
    keys = {}
    base_by_key: dict[tuple, list[int]] = {}
    inv_of = {}
    gate_of = {}
    pre = []
    for (line, row), inv in zip(bench.iterrows(), owners):
        k = config_key(row)
        keys[line] = k
        inv_of[line] = invocation_label(inv)
        gate_of[line] = prefetch_settings(row)[1]
        if is_prefetch_row(row):
            pre.append(line)
        else:
            base_by_key.setdefault(k, []).append(line)
    out = []
    for line in pre:
        cands = base_by_key.get(keys[line], [])
        if not cands:
            out.append((line, None))
            continue
        same_inv = inv_of[line] is not None

        def rank(b: int, _l=line, _s=same_inv) -> tuple:
            return (not (_s and inv_of[b] == inv_of[_l]), gate_of[b] != gate_of[_l], abs(b - _l), b)

        out.append((line, min(cands, key=rank)))
    return out


# --------------------------------------------------------------------------------------
# VRAM lines
# --------------------------------------------------------------------------------------


def parse_vram_lines(text: str, name: str = "log") -> list[dict]:
    """The ``prefetch-sim vram:`` lines of a log (others ignored), in order: ``model``,
    ``n_prompt``, ``n_gen``, ``n_depth``, ``n_ubatch``, ``pw``, ``pwg``, ``pes`` (ints),
    ``used_mib``, ``staging_mib`` (floats, MiB).

    Raises:
        ValueError: a malformed line, naming ``name`` and its line number.
    """
    out = []
    for no, ln in enumerate(text.splitlines(), 1):
        if VRAM_TAG not in ln:
            continue
        try:
            kv = dict(tok.split("=", 1) for tok in ln.split(VRAM_TAG, 1)[1].split())
            pp, tg, d = (int(x) for x in kv["test"].split("/"))
            rec = dict(model=kv["model"], n_prompt=pp, n_gen=tg, n_depth=d, n_ubatch=int(kv["ub"]), pw=int(kv["pw"]),
                       pwg=int(kv["pwg"]), pes=int(kv["pes"]), used_mib=float(kv["used_mib"]),
                       staging_mib=float(kv["staging_mib"]))
        except (ValueError, KeyError) as exc:
            raise ValueError(f"{name}:{no}: malformed vram line ({exc}): {ln[:120]!r}") from None
        for key in ("used_mib", "staging_mib"):
            if not (math.isfinite(rec[key]) and rec[key] >= 0):
                raise ValueError(f"{name}:{no}: {key} must be a finite number >= 0, got {kv[key]!r}")
        out.append(rec)
    return out


def _vram_key(n_prompt, n_gen, n_depth, n_ubatch, pw, pwg, pes) -> tuple[int, ...]:
    return tuple(int(x) for x in (n_prompt, n_gen, n_depth, n_ubatch, pw, pwg, pes))


def vram_by_line(run_dir: str | Path, bench: pd.DataFrame,
                 owners: Sequence[dict | None]) -> dict[int, tuple[float, float]]:
    """``line -> (used_mib, staging_mib)`` of the rows whose invocation's log has their VRAM line:
    matched by invocation and (test, ``-ub``, ``-pw``, ``-pwg``, ``-pes``); several rows with one
    key take that key's lines in order. An invocation without a log (or with no VRAM line)
    gives nothing.

    Raises:
        ScenarioError: a malformed VRAM line (naming the log).
    """
    run = Path(run_dir)
    by_inv: dict[int, list[int]] = {}
    invs: dict[int, dict] = {}
    for line, inv in zip(bench.index, owners):
        if inv is not None:
            by_inv.setdefault(id(inv), []).append(line)
            invs[id(inv)] = inv
    out: dict[int, tuple[float, float]] = {}
    for iid, lines in by_inv.items():
        inv = invs[iid]
        rel = inv.get("log") or (f"logs/{inv['id']}.log" if inv.get("id") else None)
        if not isinstance(rel, str):
            continue
        try:
            text = read_run_log(run, rel)
        except (FileNotFoundError, OSError):
            continue
        try:
            recs = parse_vram_lines(text, rel)
        except ValueError as exc:
            raise ScenarioError(str(exc), file=run / rel) from None
        queue: dict[tuple, list[dict]] = {}
        for r in recs:
            queue.setdefault(_vram_key(r["n_prompt"], r["n_gen"], r["n_depth"], r["n_ubatch"], r["pw"], r["pwg"],
                                       r["pes"]), []).append(r)
        for line in lines:
            row = bench.loc[line]
            k = _vram_key(row["n_prompt"], row["n_gen"], row["n_depth"], row["n_ubatch"], *prefetch_settings(row))
            q = queue.get(k)
            if q:
                r = q.pop(0)
                out[line] = (r["used_mib"], r["staging_mib"])
    return out


# --------------------------------------------------------------------------------------
# identity checks
# --------------------------------------------------------------------------------------


def read_identity(path: str | Path) -> pd.DataFrame | None:
    """Read ``identity.jsonl`` (one JSON object per check; blank lines skipped): None when the
    file does not exist. ``identical`` (true/false) may be left out when ``hash_off`` and
    ``hash_on`` are both given (then it is their equality); a check is ``ok`` when identical and
    its hashes, if both given, are equal (a record saying identical with different hashes
    fails, as ``inconsistent``).

    Returns:
        One row per check: :data:`IDENTITY_KEYS` (missing ones None), ``ok`` and ``line``.

    Raises:
        ScenarioError: (``file``, ``field`` ``<key>, line N``) a malformed line, a record that is
            not an object, ``identical`` not a boolean, or neither ``identical`` nor both hashes.
    """
    p = Path(path)
    if not p.exists():
        return None
    rows = []
    for i, rec in cmp.jsonl_objects(p, "one identity check"):
        ident = rec.get("identical")
        hashes = [rec.get("hash_off"), rec.get("hash_on")]
        both = all(isinstance(h, str) and h for h in hashes)
        if ident is None:
            if not both:
                raise ScenarioError("needs 'identical' (true/false) or both 'hash_off' and 'hash_on'", file=p,
                                    field=f"identical, line {i}")
            ident = hashes[0] == hashes[1]
        elif not isinstance(ident, bool):
            raise ScenarioError(f"expected true or false, got {ident!r}", file=p, field=f"identical, line {i}")
        first = rec.get("first_diff_step")
        if first is not None and (isinstance(first, bool) or not isinstance(first, int) or first < -1):
            raise ScenarioError(f"expected null or an integer >= -1, got {first!r}", file=p,
                                field=f"first_diff_step, line {i}")
        if ident and first is not None:
            raise ScenarioError(f"identical is true but first_diff_step is {first}: a check that differs is not "
                                "identical", file=p, field=f"first_diff_step, line {i}")
        tokens = rec.get("tokens")
        if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1):
            raise ScenarioError(f"expected an integer >= 1 (tokens decoded), got {tokens!r}", file=p,
                                field=f"tokens, line {i}")
        inconsistent = both and ident and hashes[0] != hashes[1]
        r = {k: rec.get(k) for k in IDENTITY_KEYS}
        r.update(identical=ident, ok=bool(ident and not inconsistent), inconsistent=bool(inconsistent), line=i)
        rows.append(r)
    return pd.DataFrame(rows, columns=list(IDENTITY_KEYS) + ["ok", "inconsistent", "line"])


def identity_markdown(ident: pd.DataFrame | None) -> str:
    """The identity section of the report: ``N of M checks identical`` and, when any failed, a
    prominent list of the failures (model, config, variant, tokens, first differing step)."""
    if ident is None:
        return f"Output identity: no {IDENTITY_FILE} in the run folder (not checked).\n"
    n, ok = len(ident), int(ident.ok.sum()) if len(ident) else 0
    if n == 0:
        return f"Output identity: {IDENTITY_FILE} holds no check.\n"
    if ok == n:
        return f"Output identity: {ok} of {n} checks identical (prefetch on = off, token for token).\n"
    lines = [f"**Output identity FAILED: {n - ok} of {n} checks differ** ({ok} of {n} identical):", ""]
    for r in ident[~ident.ok].itertuples(index=False):
        step = "" if r.first_diff_step is None or (isinstance(r.first_diff_step, float)
                                                   and math.isnan(r.first_diff_step)) else r.first_diff_step
        why = "identical but the hashes differ" if r.inconsistent else f"first differing step {step}".rstrip()
        lines.append(f"- **{r.model}** {r.config} variant {r.variant}, {r.tokens} tokens: {why} "
                     f"(line {r.line}: {r.hash_off} vs {r.hash_on})")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------
# the A/B
# --------------------------------------------------------------------------------------


def _flags(pw: int, pwg: int, pes: int) -> str:
    return f"-pw {pw} -pwg {pwg} -pes {pes}"


def check_patch_fields(bench: pd.DataFrame, file: Path) -> None:
    """A row has all three of the patch's fields (:data:`sim.views.llamabench.PATCH_FIELDS`) or none (an
    upstream llama-bench's row): the patched llama-bench prints every one, so a partial set is a
    damaged or hand-made row, not one to fill with defaults.

    Raises:
        ScenarioError: naming the first missing field and the row's line.
    """
    cols = [f for f in PATCH_FIELDS if f in bench.columns]
    if not cols:
        return
    have = bench[cols].notna()
    for f in PATCH_FIELDS:
        if f not in have:
            have[f] = False
    partial = have.any(axis=1) & ~have[list(PATCH_FIELDS)].all(axis=1)
    if partial.any():
        line = partial[partial].index[0]
        missing = [f for f in PATCH_FIELDS if not have.loc[line, f]]
        raise ScenarioError(f"has {', '.join(f for f in PATCH_FIELDS if f not in missing)} but not {missing[0]}: the "
                            "patched llama-bench prints all three prefetch fields", file=file,
                            field=f"{missing[0]}, line {line}")


def ab(run_dir: str | Path, hardware: str | Path | HardwareProfile = cmp.DEFAULT_HARDWARE, engine: str = "analytic",
       *, repetitions: int = 3, jobs: int | None = None, progress: Callable[[Iterable], Iterable] | None = None,
       uncertainty: str = "sem", min_effect_pts: float = MIN_EFFECT_PTS, max_work: int | None = None) -> pd.DataFrame:
    """Measured against predicted gain of every prefetch row of a run folder (module docstring).

    Args:
        run_dir: the run folder (``llama-bench.jsonl``, ``invocations.jsonl``; optional
            ``logs/`` or ``logs.tar.gz``, ``identity.jsonl``).
        hardware, engine, repetitions, jobs, progress: as :func:`calibrate.llamacpp.compare.compare`
            (only the rows of the pairs are predicted).
        uncertainty: ``sem`` (standard error of each row's mean, default) or ``sd`` (its
            repetitions' standard deviation) for the measured gain's sigma.
        min_effect_pts: floor of the no-effect band (points; :func:`effect_band`).

    Returns:
        One row per prefetch row, in file order, with :data:`COLUMNS`: ``line`` /
        ``baseline_line`` (in ``llama-bench.jsonl``; ``baseline_line`` NA without a baseline
        row), their invocations, ``model`` (the GGUF's stem), ``variant`` (simulator variant;
        None when the flags name none it models), ``prefetch_flags`` (``-pw 1 -pwg 0 -pes 0``), ``kind``,
        ``test``, the settings, the measured t/s (``avg_ts``, ``stddev_ts``) of both rows, the
        measured gain (percent), its sigma (points) and ``measured_effect`` (gain / loss /
        none), the predictions (t/s) and predicted gain (percent), ``sign_agree``, ``gain_error_pts``
        (predicted - measured gain, points), ``prefetch_ts_error_pct`` (the prefetch row's
        predicted over measured t/s, minus 1, percent), the measured VRAM (MiB; NaN without
        VRAM lines: ``vram_off_mib``, ``vram_on_mib``, their difference, ``staging_on_mib``) and the
        simulator's staging and VRAM difference (MiB), and ``note``. ``attrs``: ``identity`` (the
        :func:`read_identity` frame or None), ``run_dir``, ``hardware``, ``engine``, ``uncertainty``,
        ``min_effect_pts``, ``n_rows`` (rows in the file).

    Raises:
        ScenarioError: a missing or malformed run file, no prefetch row in the folder (one line
            naming the file), a malformed VRAM line or identity record.
        ValueError: an unknown engine or uncertainty.
    """
    if uncertainty not in ("sem", "sd"):
        raise ValueError(f"uncertainty must be 'sem' or 'sd', got {uncertainty!r}")
    run = cmp.check_run_dir(run_dir)
    bench_file = run / cmp.BENCH_FILE
    bench = read_llama_bench(bench_file)
    check_patch_fields(bench, bench_file)
    invs = cmp.read_invocations(run / cmp.INVOCATIONS_FILE)
    cmp.check_row_counts(bench, invs, run, "an A/B pairs each prefetch row with its own invocation's baseline")
    owners = cmp._attribute(bench, invs)
    pairs = pair_rows(bench, owners)
    if not pairs:
        raise ScenarioError("no prefetch row (prefetch_weights 1 or prefetch_expert_slots > 0): an A/B needs rows of "
                            "a llama-bench with the project's prefetch patch (-pw / -pes)", file=bench_file)
    if all(b is None for _, b in pairs):
        raise ScenarioError("no prefetch row has a baseline row of its configuration (prefetch_weights 0, "
                            "prefetch_expert_slots 0): run -pw 0,1 / -pes 0,N", file=bench_file)
    ident = read_identity(run / IDENTITY_FILE)
    hw = hardware if isinstance(hardware, HardwareProfile) else load_hardware(cmp.hardware_path(hardware))
    wanted = sorted({ln for p in pairs for ln in p if ln is not None})
    pred = cmp.compare(run, hw, engine, repetitions=repetitions, jobs=jobs, progress=progress, lines=wanted,
                       max_work=max_work)
    pred = pred.set_index("line")
    vram = vram_by_line(run, bench, owners)
    inv_id = {line: invocation_label(inv) for line, inv in zip(bench.index, owners)}

    kind_of: dict[str, str] = {}

    def model_kind(toml) -> str | None:
        """``moe`` or ``dense`` from the row's model TOML (None when it cannot be read)."""
        if not isinstance(toml, str) or not toml:
            return None
        if toml not in kind_of:
            try:
                kind_of[toml] = "moe" if load_model(cmp.resolve(toml)).moe is not None else "dense"
            except (PrefetchSimError, OSError):
                kind_of[toml] = None
        return kind_of[toml]

    rows = []
    for line, bline in pairs:
        row = bench.loc[line]
        on = pred.loc[line]
        pw, pwg, pes = prefetch_settings(row)
        notes = []
        if bline is None:
            notes.append("no baseline row of the same configuration (prefetch_weights 0, prefetch_expert_slots 0)")
            off = None
        else:
            off = pred.loc[bline]
            if inv_id.get(bline) != inv_id.get(line):
                notes.append(f"baseline from another invocation ({inv_id.get(bline)})")
        if isinstance(on["note"], str) and on["note"]:
            notes.append(on["note"])
        if off is not None and isinstance(off["note"], str) and off["note"]:
            notes.append(f"baseline: {off['note']}")
        m_on, m_off = float(on["measured_ts"]), float(off["measured_ts"]) if off is not None else math.nan
        sd_on, sd_off = on["measured_stddev_ts"], off["measured_stddev_ts"] if off is not None else math.nan
        n_on = _n(on["n_samples"])
        n_off = _n(off["n_samples"]) if off is not None else 1
        g_m = gain_pct(m_on, m_off)
        sig = gain_sigma_pts(m_on, sd_on, m_off, sd_off, n_on, n_off, uncertainty=uncertainty)
        p_on = float(on["predicted_ts"])
        p_off = float(off["predicted_ts"]) if off is not None else math.nan
        g_p = gain_pct(p_on, p_off)
        v_on = vram.get(line, (math.nan, math.nan))
        v_off = vram.get(bline, (math.nan, math.nan)) if bline is not None else (math.nan, math.nan)
        pv_on = float(on["predicted_vram_mib"])
        pv_off = float(off["predicted_vram_mib"]) if off is not None else math.nan
        rows.append(dict(
            line=line, baseline_line=bline, invocation=inv_id.get(line),
            baseline_invocation=inv_id.get(bline) if bline is not None else None,
            model=Path(str(row["model_filename"])).stem, model_kind=model_kind(on.get("model_toml")),
            variant=on["variant"] if isinstance(on["variant"], str) else None, prefetch_flags=_flags(pw, pwg, pes),
            kind=on["kind"], test=on["test"], n_ubatch=int(on["n_ubatch"]), n_batch=int(on["n_batch"]),
            ngl=int(on["ngl"]), n_cpu_moe=int(on["n_cpu_moe"]), prefetch_weights=pw, prefetch_gate=pwg,
            prefetch_expert_slots=pes, baseline_ts=m_off, baseline_stddev_ts=_float(sd_off), prefetch_ts=m_on,
            prefetch_stddev_ts=_float(sd_on), measured_gain_pct=g_m, measured_gain_sigma_pts=sig,
            measured_effect=measured_effect(g_m, sig, min_effect_pts), predicted_baseline_ts=p_off,
            predicted_prefetch_ts=p_on, predicted_gain_pct=g_p,
            sign_agree=sign_agrees(g_m, sig, g_p, min_effect_pts),
            gain_error_pts=g_p - g_m if _finite(g_p) and _finite(g_m) else math.nan,
            prefetch_ts_error_pct=gain_pct(p_on, m_on),
            vram_off_mib=v_off[0], vram_on_mib=v_on[0], vram_delta_mib=v_on[0] - v_off[0], staging_on_mib=v_on[1],
            predicted_staging_mib=float(on["predicted_staging_mib"]), predicted_vram_delta_mib=pv_on - pv_off,
            note="; ".join(notes),
        ))
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    df["baseline_line"] = df["baseline_line"].astype("Int64")
    df["sign_agree"] = df["sign_agree"].astype("boolean")
    df.attrs.update(identity=ident, run_dir=str(run_dir), hardware=hw.name, engine=engine, uncertainty=uncertainty,
                    min_effect_pts=min_effect_pts, n_rows=len(bench), repetitions=repetitions)
    return df


def _pos(v: Any) -> bool:
    return _finite(v) and v > 0


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) and math.isfinite(v)


def _float(v: Any) -> float:
    return float(v) if _finite(v) else math.nan


def _n(v: Any) -> int:
    return int(v) if v is not None and not pd.isna(v) and int(v) > 0 else 1


# --------------------------------------------------------------------------------------
# summary and figure
# --------------------------------------------------------------------------------------

SUMMARY_COLUMNS = ("group", "n_pairs", "n_predicted", "n_sign_agree", "sign_agree_pct",
                   "median_abs_gain_error_pts", "median_abs_prefetch_ts_error_pct", "median_measured_gain_pct",
                   "median_predicted_gain_pct")


def _variant_label(df: pd.DataFrame) -> pd.Series:
    return df["variant"].where(df["variant"].notna(), "not simulated (" + df["prefetch_flags"] + ")")


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """The A/B summary of :func:`ab`'s result: ``all``, then by variant (rows whose flags name no
    simulated variant as ``not simulated (<flags>)``), by kind (pp, tg, pp+tg) and by variant
    and kind.

    Returns:
        :data:`SUMMARY_COLUMNS`: pairs (prefetch rows), pairs with both gains (``n_predicted``),
        pairs whose signs agree and their share of ``n_predicted`` (percent), the medians of
        ``|gain_error_pts|`` (points) and ``|prefetch_ts_error_pct|`` (percent), and the median
        measured and predicted gains (percent); NaN where a group has nothing to take them of.
    """
    lab = _variant_label(df) if len(df) else pd.Series([], dtype=object)
    groups: list[tuple[str, pd.DataFrame]] = [("all", df)]
    order = list(dict.fromkeys(lab))
    groups += [(f"variant: {v}", df[lab == v]) for v in order]
    kinds = [k for k in ("pp", "tg", "pp+tg") if (df.kind == k).any()]
    groups += [(f"kind: {k}", df[df.kind == k]) for k in kinds]
    if "model_kind" in df and df.model_kind.nunique() > 1:
        mks = [mk for mk in ("moe", "dense") if (df.model_kind == mk).any()]
        groups += [(f"model: {'MoE' if mk == 'moe' else mk}", df[df.model_kind == mk]) for mk in mks]
        if len(kinds) > 1:
            groups += [(f"model: {'MoE' if mk == 'moe' else mk} {k}", df[(df.model_kind == mk) & (df.kind == k)])
                       for mk in mks for k in kinds if ((df.model_kind == mk) & (df.kind == k)).any()]
    if len(order) > 1 or len(kinds) > 1:
        groups += [(f"{v} {k}", df[(lab == v) & (df.kind == k)]) for v in order for k in kinds
                   if ((lab == v) & (df.kind == k)).any()]
    out = []
    for name, g in groups:
        both = g[g.measured_gain_pct.notna() & g.predicted_gain_pct.notna()]
        agree = int(both.sign_agree.fillna(False).sum())
        ge = both.gain_error_pts.abs()
        te = g.prefetch_ts_error_pct.dropna().abs()
        out.append(dict(group=name, n_pairs=len(g), n_predicted=len(both), n_sign_agree=agree,
                        sign_agree_pct=100.0 * agree / len(both) if len(both) else math.nan,
                        median_abs_gain_error_pts=float(ge.median()) if len(ge) else math.nan,
                        median_abs_prefetch_ts_error_pct=float(te.median()) if len(te) else math.nan,
                        median_measured_gain_pct=float(both.measured_gain_pct.median()) if len(both) else math.nan,
                        median_predicted_gain_pct=float(both.predicted_gain_pct.median()) if len(both) else math.nan))
    return pd.DataFrame(out, columns=list(SUMMARY_COLUMNS))


def summary_markdown(df: pd.DataFrame, summary: pd.DataFrame | None = None, title: str | None = None) -> str:
    """The report: the title, the identity section (:func:`identity_markdown`: failures first and
    prominent), the summary table (:func:`summarize`), the rule of the sign agreement, and the
    counts of unpaired and unsimulated prefetch rows."""
    summary = summarize(df) if summary is None else summary

    def num(x: float, fmt: str, unit: str = "") -> str:
        return "" if not _finite(x) else format(x, fmt) + unit

    lines = [title, ""] if title else []
    lines += [identity_markdown(df.attrs.get("identity")).rstrip("\n"), ""]
    lines += ["| group | pairs | predicted | sign agrees | median abs(gain err) | median abs(t/s err) | "
              "median measured gain | median predicted gain |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in summary.itertuples(index=False):
        agree = f"{r.n_sign_agree} ({num(r.sign_agree_pct, '.0f', '%')})" if r.n_predicted else ""
        lines.append(f"| {r.group} | {r.n_pairs} | {r.n_predicted} | {agree} | "
                     f"{num(r.median_abs_gain_error_pts, '.1f', ' pts')} | "
                     f"{num(r.median_abs_prefetch_ts_error_pct, '.1f', '%')} | "
                     f"{num(r.median_measured_gain_pct, '+.1f', '%')} | {num(r.median_predicted_gain_pct, '+.1f', '%')} |")
    me = df.attrs.get("min_effect_pts", MIN_EFFECT_PTS)
    unc = "standard error of each row's mean" if df.attrs.get("uncertainty", "sem") == "sem" else \
        "each row's repetition standard deviation"
    lines += ["", f"Gain = 100 (prefetch t/s / baseline t/s - 1); sigma propagated from the {unc}. Sign agreement: "
              f"a measured |gain| >= max(2 sigma, {me:g} pts) needs a predicted gain of the same sign; below it "
              "(no significant effect) the predicted |gain| must be below the same band. Gain error = predicted - "
              "measured gain (points); t/s error = the prefetch row's predicted / measured t/s - 1."]
    unpaired = int(df.baseline_line.isna().sum()) if len(df) else 0
    unsim = int(df.predicted_prefetch_ts.isna().sum()) if len(df) else 0
    if unpaired or unsim:
        lines += ["", f"{unpaired} prefetch row(s) without a baseline row, {unsim} not simulated "
                      "(see the note column)."]
    return "\n".join(lines) + "\n"


def plot_ab(df: pd.DataFrame, path: str | Path) -> Path:
    """Predicted against measured gain (percent), the measured 2-sigma as horizontal error bars,
    the y = x line, coloured by variant (marker by kind); pairs without both gains left out.
    Written atomically.

    Raises:
        ValueError: no pair has both gains.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from sim.atomic import save_figure

    d = df[df.measured_gain_pct.notna() & df.predicted_gain_pct.notna()]
    if d.empty:
        raise ValueError("no pair has both a measured and a predicted gain to plot")
    fig = Figure(figsize=(7, 6), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    err = 2 * d.measured_gain_sigma_pts.fillna(0)
    lo = float(min((d.measured_gain_pct - err).min(), d.predicted_gain_pct.min(), 0.0))
    hi = float(max((d.measured_gain_pct + err).max(), d.predicted_gain_pct.max(), 0.0))
    pad = max(1.0, 0.08 * (hi - lo))
    lo, hi = lo - pad, hi + pad
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="y = x", zorder=1)
    ax.axhline(0, color="0.7", lw=0.6, zorder=0)
    ax.axvline(0, color="0.7", lw=0.6, zorder=0)
    markers = {"pp": "o", "tg": "^", "pp+tg": "s"}
    lab = _variant_label(d)
    for i, v in enumerate(dict.fromkeys(lab)):
        for kind, mk in markers.items():
            g = d[(lab == v) & (d.kind == kind)]
            if len(g):
                ax.errorbar(g.measured_gain_pct, g.predicted_gain_pct, xerr=2 * g.measured_gain_sigma_pts.fillna(0),
                            fmt=mk, ms=5, color=f"C{i}", ecolor=f"C{i}", elinewidth=0.8, capsize=2, alpha=0.85,
                            zorder=2, label=f"{v} ({kind})")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured gain over baseline (%, bars: 2 sigma)")
    ax.set_ylabel(f"predicted gain (%, {df.attrs.get('engine', 'analytic')} engine)")
    s = summarize(d).iloc[0]
    ax.set_title(f"{plural(int(s.n_predicted), 'pair')}: sign agrees {int(s.n_sign_agree)} ({s.sign_agree_pct:.0f}%), "
                 f"median |gain err| {s.median_abs_gain_error_pts:.1f} pts")
    ax.legend(fontsize=7)
    return save_figure(fig, path)


# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m calibrate.llamacpp.ab",
                                 description="Prefetch A/B: measured vs predicted gain of the prefetch patch's "
                                             "llama-bench rows over their baseline rows; prints a summary as markdown.")
    cmp.add_common_args(ap, out_help="write one row per pair", figure_help="write the predicted-vs-measured gain scatter",
                        summary_help="write the report (markdown)")
    ap.add_argument("--uncertainty", choices=("sem", "sd"), default="sem",
                    help="a row's spread in the gain's sigma: standard error of its mean (default) or its "
                         "repetitions' standard deviation")
    ap.add_argument("--min-effect", type=float, default=MIN_EFFECT_PTS, metavar="PTS",
                    help=f"floor of the no-effect band, percentage points (default {MIN_EFFECT_PTS})")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (2 with a one-line message on a bad input)."""
    args = build_parser().parse_args(argv)
    prog = "ab"

    def body() -> int:
        progress = cmp.check_common_args(args)
        if not (math.isfinite(args.min_effect) and args.min_effect >= 0):
            raise ScenarioError(f"must be a number >= 0, got {args.min_effect}", field="--min-effect")
        cmp.check_run_dir(args.run_dir)
        cmp.check_outputs_spare_inputs({"--out": args.out, "--figure": args.figure, "--summary": args.summary},
                                       [args.run_dir], [cmp.hardware_path(args.hardware)])
        df = ab(args.run_dir, args.hardware, args.engine, repetitions=args.repetitions, jobs=args.jobs,
                progress=progress, uncertainty=args.uncertainty, min_effect_pts=args.min_effect, max_work=args.max_work)
        title = (f"Prefetch A/B: {args.run_dir} on profile '{df.attrs['hardware']}' ({args.engine} engine, "
                 f"{args.repetitions} routing draws per MoE row): {len(df)} prefetch rows of {df.attrs['n_rows']}")
        cmp.write_outputs(args, prog, df, summary_markdown(df, title=title), plot_ab)
        ident = df.attrs.get("identity")
        if ident is not None and len(ident) and not ident.ok.all():
            print(f"{prog}: warning: {int((~ident.ok).sum())} of {len(ident)} output-identity checks FAILED "
                  f"({IDENTITY_FILE})", file=sys.stderr)
        return 0

    return cmp.run_cli(prog, body, args)


if __name__ == "__main__":
    sys.exit(main())
