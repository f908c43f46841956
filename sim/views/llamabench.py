"""llama-bench's result fields in one place, a reader for its ``-o json`` / ``-o jsonl`` output,
and the translation of one result row into the simulator's placement and workload terms.

Source: llama.cpp ``tools/llama-bench/llama-bench.cpp``:

* ``test::get_fields()`` (the field names, in order) and ``test::get_field_type()`` (each
  field's type: ``STRING``, ``BOOL``, ``INT`` or ``FLOAT``; unlisted fields are ``STRING``);
* ``test::get_values()`` (how each value is printed: ``flash_attn`` as the integer of
  ``llama_flash_attn_type``, ``-1`` auto, ``0`` off, ``1`` on; ``load_mode`` as
  ``llama_load_mode_name``; ``tensor_buft_overrides`` as ``pattern=BUFFER`` rules joined by
  ``;``, or ``none``);
* ``json_printer`` / ``jsonl_printer`` (STRING values quoted, BOOL ``true``/``false``, INT and
  FLOAT bare, then the JSON-only ``samples_ns`` and ``samples_ts`` arrays); ``csv_printer`` and
  ``sql_printer`` print :data:`CSV_FIELDS` (no samples);
* ``markdown_printer`` (the ``test`` name: ``pp512``, ``tg128``, ``pp512+tg128`` for ``-pg``,
  with `` @ d8192`` for ``-d``).

:data:`FIELDS` is the single list of those fields for the project (the reader here and our
llama-bench writer). Nothing of llama.cpp's code is copied; the lists are restated from it.

Three of them are not upstream's: ``prefetch_weights``, ``prefetch_gate`` and
``prefetch_expert_slots`` (:data:`PATCH_FIELDS`, after ``fit_min_ctx``) come from the project's
own prefetch patch to ggml's scheduler and llama-bench (:mod:`calibrate.llamacpp.prefetch_patch`,
applied as the patch ``prefetch`` of ``calibrate/llamacpp/patches.py``; the flags ``-pw``,
``-pwg``, ``-pes``). Rows of an upstream llama-bench lack them and mean their defaults
(:data:`PREFETCH_DEFAULTS`: no prefetch); :func:`prefetch_variant` names the simulator variant a
row's values run.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sim.errors import ScenarioError
from sim.model.specs import sim_ngl

STRING, BOOL, INT, FLOAT = "STRING", "BOOL", "INT", "FLOAT"


@dataclass(frozen=True)
class BenchField:
    """One field of a llama-bench result row.

    Attributes:
        name: the field name as llama-bench prints it (``n_gpu_layers``).
        type: ``STRING``, ``BOOL``, ``INT`` or ``FLOAT`` (``test::get_field_type``); for the
            JSON-only arrays, the type of their elements.
        array: a JSON array (``samples_ns``: INT nanoseconds, ``samples_ts``: FLOAT t/s).
        json_only: printed only by the json/jsonl printers (not csv, sql or markdown).
        patch: printed only by a llama-bench with the project's prefetch patch
            (:mod:`calibrate.llamacpp.prefetch_patch`), not by upstream's: optional in a row.
        default: the value a row without the field means (llama-bench's ``cmd_params_defaults``
            of the patch), for :attr:`patch` fields.
    """

    name: str
    type: str
    array: bool = False
    json_only: bool = False
    patch: bool = False
    default: Any = None


def _f(name: str, typ: str = STRING) -> BenchField:
    return BenchField(name, typ)


#: llama-bench's result fields in ``test::get_fields()`` order with ``get_field_type()``,
#: then the JSON-only ``samples_ns`` / ``samples_ts`` (json and jsonl printers); the three
#: ``prefetch_*`` fields are the project's patch's (:data:`PATCH_FIELDS`), not upstream's.
FIELDS: tuple[BenchField, ...] = (
    _f("build_commit"), _f("build_number", INT), _f("cpu_info"), _f("gpu_info"), _f("backends"),
    _f("model_filename"), _f("model_type"), _f("model_size", INT), _f("model_n_params", INT),
    _f("n_batch", INT), _f("n_ubatch", INT), _f("n_threads", INT), _f("cpu_mask"),
    _f("cpu_strict", BOOL), _f("poll", INT), _f("type_k"), _f("type_v"), _f("n_gpu_layers", INT),
    _f("n_cpu_moe", INT), _f("split_mode"), _f("main_gpu", INT), _f("no_kv_offload", BOOL),
    _f("flash_attn", INT), _f("devices"), _f("tensor_split"), _f("tensor_buft_overrides"),
    _f("load_mode"), _f("lazy_mode"), _f("embeddings", BOOL), _f("no_op_offload", INT),
    _f("no_host", BOOL), _f("repack", BOOL), _f("fit_target", INT), _f("fit_min_ctx", INT),
    # the project's prefetch patch (-pw, -pwg, -pes): not in upstream rows
    BenchField("prefetch_weights", INT, patch=True, default=0),
    BenchField("prefetch_gate", INT, patch=True, default=512),
    BenchField("prefetch_expert_slots", INT, patch=True, default=0),
    _f("n_prompt", INT), _f("n_gen", INT), _f("n_depth", INT), _f("test_time"),
    _f("avg_ns", INT), _f("stddev_ns", INT), _f("avg_ts", FLOAT), _f("stddev_ts", FLOAT),
    BenchField("samples_ns", INT, array=True, json_only=True),
    BenchField("samples_ts", FLOAT, array=True, json_only=True),
)

#: field name -> :class:`BenchField`
FIELD_BY_NAME: Mapping[str, BenchField] = {f.name: f for f in FIELDS}
#: the fields of ``csv_printer`` / ``sql_printer`` (``test::get_fields()``), in order
CSV_FIELDS: tuple[str, ...] = tuple(f.name for f in FIELDS if not f.json_only)
#: every field of a json/jsonl row, in order
JSON_FIELDS: tuple[str, ...] = tuple(f.name for f in FIELDS)
#: the fields of the project's prefetch patch (``-pw``, ``-pwg``, ``-pes``), in order
PATCH_FIELDS: tuple[str, ...] = tuple(f.name for f in FIELDS if f.patch)
#: what a row without them means: no prefetch (the patch's defaults)
PREFETCH_DEFAULTS: Mapping[str, int] = {f.name: f.default for f in FIELDS if f.patch}
#: upstream llama-bench's fields (``test::get_fields()`` of an unpatched tree), in order
UPSTREAM_FIELDS: tuple[str, ...] = tuple(f.name for f in FIELDS if not f.patch)

#: fields a row must have to be simulated (older llama-bench versions lack some of the others,
#: e.g. ``n_cpu_moe``, ``load_mode``, and before ``-d`` ``n_depth``; those get llama-bench's
#: defaults: :data:`FIELD_DEFAULTS` in the reader, the others in :func:`row_terms`)
REQUIRED_FIELDS: tuple[str, ...] = (
    "model_filename", "model_type", "n_batch", "n_ubatch", "n_gpu_layers", "n_prompt", "n_gen", "avg_ts",
)
#: what the reader puts in a row without the field: ``n_depth`` 0 (a llama-bench before ``-d``
#: ran every test on an empty context)
FIELD_DEFAULTS: Mapping[str, Any] = {"n_depth": 0}

#: largest t/s a row may report (``avg_ts``, ``stddev_ts``, each of ``samples_ts``): 1e9 t/s, one token
#: per nanosecond. llama-bench times a test with a nanosecond clock (``get_time_ns``) around at
#: least one graph launch per ubatch (microseconds on any GPU or CPU backend), so a real row stays
#: orders of magnitude below it: the fastest committed row (data/llamacpp/*/llama-bench.jsonl:
#: gpt-oss-20b pp4096 on an H200, data/llamacpp/h200-20261201) reports 1.4e4 t/s, its fastest
#: sample 1.45e4. A larger value is a corrupt or hand-edited row (1e300 overflows the error
#: statistics: numpy's "overflow encountered in square").
TS_MAX = 1e9
#: longest time one timed repetition of a row may take (``samples_ns``, and ``(n_prompt + n_gen) /
#: avg_ts`` where a row has no samples): 7 days in ns. The slowest committed sample
#: (data/llamacpp/*/llama-bench.jsonl: Gemma 3 27B pp2048 with 31 of its 62 layers on the CPU)
#: takes seconds, and a CPU-only run of a large model at a long prompt takes hours; a sample of
#: weeks or years (a uint64 of ns holds 584 years) is a corrupt or hand-edited row.
SAMPLE_NS_MAX = 7 * 24 * 3600 * 10**9

#: ``llama_flash_attn_type`` as llama-bench prints it (``(int) flash_attn``)
FLASH_ATTN = {-1: "auto", 0: "off", 1: "on"}
#: ``llama_load_mode_name`` values whose weights are mmap'd (``llama_model_loader``: use_mmap
#: for mmap, mmap+mlock and auto; auto falls back to no mmap only on devices without mmap
#: support, e.g. iGPUs). mmap'd host weights are pageable; the others are read into the GPU
#: backend's host buffer type (``CUDA_Host``: pinned) unless ``no_host``.
MMAP_LOAD_MODES = ("auto", "mmap", "mmap+mlock")
#: load modes that read the weights into an allocated host buffer
BUFFER_LOAD_MODES = ("none", "mlock", "dio")


def bench_test_name(n_prompt: int, n_gen: int, n_depth: int = 0) -> str:
    """llama-bench's markdown ``test`` label: ``pp512``, ``tg128``, ``pp512+tg128`` (``-pg``),
    with `` @ d<N>`` appended for a KV depth ``N > 0`` (``markdown_printer::print_test``)."""
    if n_prompt > 0 and n_gen == 0:
        base = f"pp{n_prompt}"
    elif n_gen > 0 and n_prompt == 0:
        base = f"tg{n_gen}"
    else:
        base = f"pp{n_prompt}+tg{n_gen}"
    return f"{base} @ d{n_depth}" if n_depth > 0 else base


def prefetch_settings(row: Mapping[str, Any]) -> tuple[int, int, int]:
    """A row's ``(prefetch_weights, prefetch_gate, prefetch_expert_slots)``: its values, the
    patch's defaults (:data:`PREFETCH_DEFAULTS`: 0, 512, 0) where it lacks them (an upstream
    llama-bench row, or NaN in a DataFrame of mixed rows)."""
    out = []
    for name in PATCH_FIELDS:
        v = row_value(row, name, PREFETCH_DEFAULTS[name])
        out.append(int(v))
    return out[0], out[1], out[2]


def prefetch_variant(prefetch_weights: int = 0, prefetch_gate: int = 512, prefetch_expert_slots: int = 0) -> str:
    """The simulator variant (:func:`sim.model.specs.parse_variant` label) of the prefetch patch's
    llama-bench flags:

    * ``-pw 0 -pes 0`` (an upstream row too): ``baseline``;
    * ``-pw 1 -pwg N`` (weight prefetch, one split ahead, whole host weight tensors):
      ``prefetch_gated_N`` for ``N > 0`` (off in a graph with MoE ops whose ubatch has fewer
      than N tokens), ``prefetch_ungated`` for ``N == 0``; ``-pwg`` changes nothing with
      ``-pw 0`` (the row still prints it; every such row runs the same variant);
    * ``-pes N`` with ``-pw 0`` (N rotating expert staging slots): ``slots<N>``.

    The names are :func:`sim.model.specs.parse_variant` labels, the same the scenarios and
    ``--variant`` use.

    Raises:
        ValueError: ``-pw 1`` with ``-pes N > 0`` (not simulated: the simulator has no model of
            the patch running both), or a value out of range (``prefetch_weights`` not 0/1, a
            negative gate or slot count).
    """
    pw, pwg, pes = int(prefetch_weights), int(prefetch_gate), int(prefetch_expert_slots)
    if pw not in (0, 1):
        raise ValueError(f"prefetch_weights {pw}: expected 0 or 1 (-pw)")
    if pwg < 0 or pes < 0:
        raise ValueError(f"prefetch_gate {pwg} / prefetch_expert_slots {pes}: expected >= 0 (-pwg, -pes)")
    if pw and pes:
        raise ValueError(f"prefetch_weights 1 with prefetch_expert_slots {pes} (-pw 1 -pes {pes}): the patch then "
                         f"stages every host weight in max(2, {pes}) slots, which the simulator does not model (its "
                         f"prefetch_ungated+slots{pes} is another design: weights in two slots, experts in {pes} "
                         "slots of their own)")
    if pw:
        return f"prefetch_gated_{pwg}" if pwg > 0 else "prefetch_ungated"
    return f"slots{pes}" if pes else "baseline"


def row_variant(row: Mapping[str, Any]) -> str:
    """:func:`prefetch_variant` of a row's fields (:func:`prefetch_settings`).

    Raises:
        ValueError: as :func:`prefetch_variant`.
    """
    return prefetch_variant(*prefetch_settings(row))


def variant_fields(variant) -> dict[str, int]:
    """The prefetch patch's fields (:data:`PATCH_FIELDS`) a llama-bench row of ``variant`` (a
    :class:`sim.model.specs.Variant`) prints: the inverse of :func:`prefetch_variant` (``baseline``
    -> 0/512/0, ``prefetch_ungated`` -> 1/0/0, ``prefetch_gated_N`` -> 1/N/0, ``slots<N>`` ->
    0/512/N; a row of ``-pw 0 -pwg N`` prints its own ``N``, :func:`sim.cli.benchflags.prefetch_combos`).
    What the flags cannot say (an expert cache, whole-tensor copies) is not in them; a variant
    with weight prefetch and slots prints both (:func:`prefetch_variant` refuses to simulate
    such a row)."""
    pw = bool(variant.prefetch_weights)
    gate = variant.gate_min_batch
    return {"prefetch_weights": int(pw),
            "prefetch_gate": (int(gate) if gate else 0) if pw else PREFETCH_DEFAULTS["prefetch_gate"],
            "prefetch_expert_slots": int(variant.expert_slots)}


def patch_fields_note(variants) -> str | None:
    """A note when one of ``variants`` prints prefetch-patch fields (:func:`variant_fields`) that
    the patch runs as another design: weight prefetch with expert slots (``-pw 1 -pes N``,
    which the patch runs by staging every host weight in ``max(2, N)`` slots and
    :func:`prefetch_variant` refuses), so that a reader does not take its rows for the patch's.
    None when no variant does."""
    both = [v for v in variants if v.prefetch_weights and v.expert_slots]
    if not both:
        return None
    f = variant_fields(both[0])
    return (f"{', '.join(v.name for v in both)}: rows print prefetch_weights {f['prefetch_weights']}, prefetch_gate "
            f"{f['prefetch_gate']}, prefetch_expert_slots {f['prefetch_expert_slots']}, but the prefetch patch runs "
            f"-pw 1 -pes {f['prefetch_expert_slots']} as another design (every host weight staged in max(2, "
            f"{f['prefetch_expert_slots']}) slots), which the simulator does not model: tell these rows from the "
            "patch's by build_commit, not by those fields")


# --------------------------------------------------------------------------------------
# reader
# --------------------------------------------------------------------------------------

_NONFINITE = re.compile(r"-?(?:inf(?:inity)?|nan)(?:\([^)]*\))?", re.IGNORECASE)


def _decode_error(text: str, exc: json.JSONDecodeError) -> tuple[str, str | None]:
    """A message for a JSON syntax error, and the field it sits in when known (a bare ``inf`` or
    ``nan``: what ``std::to_string`` prints for a non-finite double)."""
    m = _NONFINITE.match(text, exc.pos)
    if m:
        key = re.search(r'"([^"\\]+)"\s*:\s*\[?[^\]"]*$', text[max(0, exc.pos - 2000):exc.pos])
        return f"non-finite number {m.group(0)!r}", key.group(1) if key else None
    return f"malformed JSON ({exc.msg}, column {exc.colno})", None


def _check_value(name: str, v: Any, err) -> Any:
    """Type-check one known field (llama-bench ``get_field_type``); returns the value to keep."""
    spec = FIELD_BY_NAME[name]
    typ = spec.type

    def one(x: Any, label: str) -> Any:
        if typ == STRING:
            if not isinstance(x, str):
                raise err(label, f"expected a string (llama-bench STRING field), got {x!r}")
        elif typ == BOOL:
            if not isinstance(x, bool):
                raise err(label, f"expected true or false (llama-bench BOOL field), got {x!r}")
        elif typ == INT:
            if name == "flash_attn" and isinstance(x, bool):
                return int(x)  # llama-bench before llama_flash_attn_type printed a BOOL
            if isinstance(x, bool) or not isinstance(x, int):
                raise err(label, f"expected an integer (llama-bench INT field), got {x!r}")
        else:  # FLOAT
            if isinstance(x, bool) or not isinstance(x, (int, float)):
                raise err(label, f"expected a number (llama-bench FLOAT field), got {x!r}")
            if not math.isfinite(x):
                raise err(label, f"non-finite value {x!r}")
        return x

    if spec.array:
        if not isinstance(v, list):
            raise err(name, f"expected an array, got {v!r}")
        return [one(x, name) for x in v]
    return one(v, name)


#: KV cache types llama.cpp accepts for V without flash attention (a quantised V cache needs it:
#: ``llama_init_from_model`` refuses the context otherwise)
UNQUANTISED_KV = ("f16", "bf16", "f32")


def _check_row(rec: dict, err) -> dict:
    for name in REQUIRED_FIELDS:
        if name not in rec:
            raise err(name, "missing required field (llama-bench writes it in every row)")
    out = {}
    for k, v in rec.items():
        out[k] = _check_value(k, v, err) if k in FIELD_BY_NAME else v
    for k, v in FIELD_DEFAULTS.items():
        out.setdefault(k, v)
    for k in ("n_prompt", "n_gen", "n_depth"):
        if out[k] < 0:
            raise err(k, f"must be >= 0, got {out[k]}")
    if out["n_prompt"] + out["n_gen"] <= 0:
        raise err("n_prompt", "a test needs n_prompt > 0 or n_gen > 0 (llama-bench skips 0/0)")
    for k in ("n_batch", "n_ubatch"):
        if out[k] < 1:
            raise err(k, f"must be >= 1, got {out[k]}")
    # llama-bench refuses a negative -ncmoe and -t at its command line: such a row was edited
    for k, low in (("n_cpu_moe", 0), ("n_threads", 1)):
        if k in out and out[k] is not None and out[k] < low:
            raise err(k, f"must be >= {low}, got {out[k]} (llama-bench does not run that)")
    if not out["avg_ts"] > 0:
        raise err("avg_ts", f"must be > 0 t/s, got {out['avg_ts']!r}")
    tv = out.get("type_v")
    if "flash_attn" in out and quantised_v_without_fa(out["flash_attn"], tv):
        raise err("type_v", f"{tv} with flash_attn 0: {QUANTISED_V_NEEDS_FA}, so llama-bench cannot have run it")
    if "stddev_ts" in out and out["stddev_ts"] < 0:
        raise err("stddev_ts", f"must be >= 0, got {out['stddev_ts']!r}")
    for k in ("avg_ts", "stddev_ts", "samples_ts"):  # physically absurd rates (TS_MAX)
        vals = out.get(k)
        vals = vals if isinstance(vals, list) else [] if vals is None else [vals]
        big = next((x for x in vals if x >= TS_MAX), None)
        if big is not None:
            raise err(k, f"{big:g} t/s is not physical: a llama-bench row reports below {TS_MAX:g} t/s (one token per "
                         "nanosecond); a corrupt or edited row?")
    if out.get("prefetch_weights", 0) not in (0, 1):
        raise err("prefetch_weights", f"must be 0 or 1 (-pw), got {out['prefetch_weights']}")
    for k in ("prefetch_gate", "prefetch_expert_slots"):
        if out.get(k, 0) < 0:
            raise err(k, f"must be >= 0, got {out[k]}")
    for k in ("samples_ns", "samples_ts"):
        if k in out and not out[k]:
            raise err(k, "empty: llama-bench writes one sample per repetition (-r >= 1)")
        if k in out and any(x <= 0 for x in out[k]):
            raise err(k, "every sample must be > 0")
    ns = out.get("samples_ns")
    # the longest repetition: a sample, or without samples the time the mean implies
    if ns:
        where, longest = "samples_ns", max(ns)
    else:
        where, longest = "avg_ts", 1e9 * (out["n_prompt"] + out["n_gen"]) / out["avg_ts"]
    if longest > SAMPLE_NS_MAX:
        raise err(where, f"one repetition of {longest / 86400e9:.4g} days is not a llama-bench run (at most "
                         f"{SAMPLE_NS_MAX // (86400 * 10**9)} days accepted); a corrupt or edited row?")
    _check_samples(out, err)
    return out


def _half_digit_g(x: float) -> float:
    """Half a unit in the last digit of ``x`` printed as ``%g`` (6 significant digits: an
    ``std::ostringstream``'s default, how llama-bench's ``join`` prints ``samples_ts``)."""
    return 0.5 * 10.0 ** (math.floor(math.log10(abs(x))) - 5) if x else 0.0


#: half a unit in the last digit of ``%f`` (``std::to_string``, how llama-bench prints ``avg_ts``)
_HALF_DIGIT_F = 0.5e-6


def _close(printed: float, exact: float, half_digit: float) -> bool:
    # print rounding only, plus a hair for the double arithmetic's own last bits
    return abs(printed - exact) <= half_digit * (1 + 1e-6) + 1e-12 * abs(exact)


def json_kind(val) -> str:
    """The JSON name of a decoded value's kind (``null``, ``a boolean``, ``a number``, ``a string``,
    ``an array``, ``an object``), for messages about a file's content."""
    if val is None:
        return "null"
    if isinstance(val, bool):
        return "a boolean"
    if isinstance(val, (int, float)):
        return "a number"
    if isinstance(val, str):
        return "a string"
    return "an array" if isinstance(val, list) else "an object" if isinstance(val, dict) else type(val).__name__


def _check_samples(out: dict, err) -> None:
    """Refuse a row whose samples and averages contradict each other, as llama-bench derives
    them (``test::get_ts``, ``avg``): ``samples_ts[i] = 1e9 * (n_prompt + n_gen) / samples_ns[i]``
    (printed ``%g``), ``avg_ns`` the integer mean of ``samples_ns``, ``avg_ts`` the mean of the
    unprinted ``samples_ts`` (``%f``), ``stddev_ns`` and ``stddev_ts`` their ``stdev``
    (:func:`stdev_ns`, exact, wrapped as llama-bench's or not; :func:`stdev_ts`, to the print
    rounding and the formula's cancellation). Only the rounding of the printed digits is allowed. A row without the arrays
    (what llama-bench's csv/md printers write) is not checked."""
    ns, ts = out.get("samples_ns"), out.get("samples_ts")
    n_tokens = out["n_prompt"] + out["n_gen"]
    if ns is not None and ts is not None and len(ns) != len(ts):
        raise err("samples_ts", f"{len(ts)} samples_ts for {len(ns)} samples_ns: llama-bench writes one t/s per "
                                "timed run")
    exact_ts = [1e9 * n_tokens / t for t in ns] if ns else None
    if exact_ts is not None and ts is not None:
        for j, (p, x) in enumerate(zip(ts, exact_ts), 1):
            if not _close(p, x, _half_digit_g(x)):
                raise err("samples_ts", f"sample {j} is {p:g} t/s but (n_prompt + n_gen) * 1e9 / samples_ns = "
                                        f"{n_tokens} * 1e9 / {ns[j - 1]} = {x:g} t/s (llama-bench derives it so)")
    if ns and "avg_ns" in out:
        mean_ns = sum(ns) // len(ns)
        if out["avg_ns"] != mean_ns:
            raise err("avg_ns", f"{out['avg_ns']} is not the integer mean of samples_ns ({mean_ns}, llama-bench's avg)")
    if exact_ts:
        mean_ts, slack = sum(exact_ts) / len(exact_ts), _HALF_DIGIT_F
    elif ts:  # samples_ts without samples_ns: the printed samples' own rounding adds up
        mean_ts = sum(ts) / len(ts)
        slack = _HALF_DIGIT_F + sum(_half_digit_g(x) for x in ts) / len(ts)
    else:
        _check_averages(out, n_tokens, err)
        return
    if not _close(out["avg_ts"], mean_ts, slack):
        src = ("samples_ts as llama-bench derives them from samples_ns (not the printed, rounded samples_ts)"
               if exact_ts else "samples_ts")
        raise err("avg_ts", f"{out['avg_ts']:f} is not the mean of {src} ({mean_ts:f}, llama-bench's avg)")
    if ns and "stddev_ns" in out and out["stddev_ns"] not in (stdev_ns(ns), stdev_ns(ns, wrap=False)):
        raise err("stddev_ns", f"{out['stddev_ns']} is not the standard deviation of samples_ns "
                               f"({stdev_ns(ns, wrap=False)}, llama-bench's stdev)")
    if exact_ts and "stddev_ts" in out and math.isfinite(out["stddev_ts"]):
        sd_ts, cancel = stdev_ts(exact_ts)
        if math.isfinite(sd_ts) and not _close(out["stddev_ts"], sd_ts, _HALF_DIGIT_F + cancel):
            raise err("stddev_ts", f"{out['stddev_ts']:f} is not the standard deviation of samples_ts ({sd_ts:f}, "
                                   "llama-bench's stdev)")


#: a row without samples whose ``avg_ts`` is above this many times ``1e9 * tokens / avg_ns`` is
#: refused: a mean of t/s that far above the t/s of the mean time needs repetitions a factor of
#: several apart (llama-bench prints ``avg_ts`` as the mean of its repetitions' t/s)
AVG_TS_OVER_MEAN_TIME_MAX = 2.0


def _check_averages(out: dict, n_tokens: int, err) -> None:
    """A row without ``samples_ns``/``samples_ts`` (llama-bench's csv/md): its ``avg_ts``, the
    mean of the repetitions' t/s, is at least the t/s of their mean time ``avg_ns`` (the
    arithmetic mean is at least the harmonic one; ``avg_ns`` is truncated to the ns) and not
    above :data:`AVG_TS_OVER_MEAN_TIME_MAX` times it."""
    ns, ts = out.get("avg_ns"), out.get("avg_ts")
    if not n_tokens or not isinstance(ns, int) or ns <= 0 or not isinstance(ts, (int, float)) or not math.isfinite(ts):
        return
    x = 1e9 * n_tokens / ns
    if ts < x * (1 - 1.0 / ns) - _HALF_DIGIT_F or ts > x * AVG_TS_OVER_MEAN_TIME_MAX:
        raise err("avg_ts", f"{ts:f} t/s contradicts avg_ns {ns} for {n_tokens} tokens ({x:f} t/s at the mean "
                            "time): llama-bench's avg_ts, the mean of its repetitions' t/s, is at least that "
                            f"and not {AVG_TS_OVER_MEAN_TIME_MAX:g}x above it")


_U64 = (1 << 64) - 1


def stdev_ns(v: Sequence[int], *, wrap: bool = True) -> int:
    """llama-bench's ``stdev`` of ``samples_ns`` (integer ns) in its ``uint64_t`` arithmetic:
    ``sqrt(sq_sum / (n - 1) - mean * mean * n / (n - 1))`` with integer divisions, ``mean`` the
    integer mean, ``sqrt`` of the value as a double, truncated; 0 for fewer than two samples
    (``tools/llama-bench/llama-bench.cpp``, ``stdev``). ``wrap``: as llama-bench, modulo 2**64
    (its sum of squares overflows once the samples reach ~1.9 s at ``-r 5``, and the printed
    value is then garbage); ``wrap=False``: the exact integers (what our rows print)."""
    n = len(v)
    if n <= 1:
        return 0
    m = _U64 if wrap else -1
    mean = (sum(v) & m) // n
    sq = sum(x * x for x in v) & m
    x = (sq // (n - 1) - ((mean * mean & m) * n & m) // (n - 1)) & m
    return int(math.sqrt(float(x)))


def stdev_ts(v: Sequence[float]) -> tuple[float, float]:
    """llama-bench's ``stdev`` of the t/s samples (doubles, the one-pass formula of
    :func:`stdev_ns`) and how far that formula's cancellation may move it between two correct
    implementations (t/s): ``sq_sum / (n - 1)`` is exact to a few ulps of itself, and an error
    ``e`` in the variance moves the root by ``e / (2 sd)`` (``sqrt(e)`` near sd = 0). The
    standard deviation is NaN when the variance comes out below zero by more than that
    (llama-bench prints ``nan``), 0 when within it, and 0 for fewer than two samples."""
    n = len(v)
    if n <= 1:
        return 0.0, 0.0
    mean = sum(v) / n
    sq = sum(x * x for x in v)
    var = sq / (n - 1) - mean * mean * n / (n - 1)
    e = 16 * n * 2.0 ** -52 * sq / (n - 1)
    if var <= 0:
        return (math.nan if var < -e else 0.0), math.sqrt(e)
    sd = math.sqrt(var)
    return sd, min(math.sqrt(e), e / (2 * sd))


def read_llama_bench(path: str | Path):
    """Read llama-bench results written with ``-o json`` (one array) or ``-o jsonl`` (one object
    per line), e.g. a user's own runs.

    Every known field (:data:`FIELDS`) is type-checked as llama-bench prints it; unknown extra
    fields (other llama-bench versions, a wrapper's own keys) are kept unchecked. Required:
    :data:`REQUIRED_FIELDS`; ``avg_ts`` finite and > 0; ``avg_ts``, ``stddev_ts`` and each of
    ``samples_ts`` below :data:`TS_MAX` (1e9 t/s); ``n_prompt + n_gen > 0``. The patch's
    fields (:data:`PATCH_FIELDS`) are optional, as every other one: ``prefetch_weights`` 0 or 1,
    ``prefetch_gate`` and ``prefetch_expert_slots`` >= 0 when present. Where a row carries
    ``samples_ns``/``samples_ts`` they must not be empty (one sample per repetition) and agree with each other and with ``avg_ns``,
    ``avg_ts``, ``stddev_ns`` and ``stddev_ts`` as llama-bench derives them, to the printed
    digits' rounding (:func:`_check_samples`).

    Args:
        path: the file. Its format is told by its first character (``[``: json, ``{``: jsonl).

    Returns:
        A ``pandas.DataFrame``, one row per llama-bench row, in file order, with every field as a
        column (known fields in :data:`FIELDS` order, then the others in first-seen order;
        ``samples_ns``/``samples_ts`` as lists; a field some rows lack is NaN there) plus
        ``test`` (:func:`bench_test_name`). The index is the 1-based position in the file: the line
        for jsonl (index name ``line``), the array element for json (``row``).
        ``attrs["file"]`` is the path and ``attrs["format"]`` ``json`` or ``jsonl``.

    Raises:
        ScenarioError: (one line, ``file`` = the path, ``field`` = ``<field>, line N`` for jsonl or
            ``<field>, row N`` for json) an unreadable or empty file, a malformed line, a row
            that is not an object, a missing required field, a wrongly typed or non-finite
            value, samples or averages that contradict each other.
    """
    import pandas as pd

    from sim.bounds import check_text_input

    p = Path(path)
    if p.exists() and not p.is_dir():
        check_text_input(p)  # a regular file of bounded size: a FIFO or a device would hang the read
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError("file not found", file=p) from None
    except IsADirectoryError:
        raise ScenarioError("is a folder, expected a llama-bench -o json or -o jsonl file", file=p) from None
    except UnicodeDecodeError:
        raise ScenarioError("not UTF-8 text (expected llama-bench -o json or -o jsonl output)", file=p) from None
    except OSError as exc:
        raise ScenarioError(f"cannot read: {exc.strerror}", file=p) from None
    text = text.removeprefix("\ufeff")  # a UTF-8 byte-order mark (Windows editors write one), as the TOML reader
    body = text.lstrip()
    if not body:
        raise ScenarioError("empty file: no llama-bench rows", file=p)

    head = body.split("\n", 1)[0]
    # -o csv's header starts with build_commit in every version (older ones: build_commit,
    # build_number,cuda,...), -o md's with | model, -o sql with CREATE TABLE
    if (head.startswith(('"build_commit"', "build_commit,")) or body.startswith("| model")
            or head.upper().startswith("CREATE TABLE")):
        kind = "csv" if body[0] not in "|Cc" else "markdown" if body[0] == "|" else "sql"
        raise ScenarioError(f"this is llama-bench -o {kind} output: the reader takes -o json or -o jsonl "
                            "(they carry the samples)", file=p)
    records: list[tuple[int, dict]] = []
    if body[0] == "[":
        fmt, unit = "json", "row"
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            first = text.lstrip().split("\n", 1)[0]
            if exc.msg == "Extra data":  # a whole value on line 1, more after it: jsonl whose line 1 is no row
                lead = len(text) - len(text.lstrip())
                try:  # a whole -o json array and another after it: llama-bench -o json run twice into one file
                    val0, end = json.JSONDecoder().raw_decode(text, lead)
                except json.JSONDecodeError:
                    val0, end = None, 0
                if isinstance(val0, list) and text[end:].lstrip().startswith("["):
                    line2 = text.count("\n", 0, end + len(text[end:]) - len(text[end:].lstrip())) + 1
                    raise ScenarioError("a second JSON array after the first: llama-bench -o json writes one array per "
                                        "run, so this file holds two runs; give each its own file, or use -o jsonl "
                                        "(its lines append)", file=p, field=f"line {line2}") from None
                try:
                    val = json.loads(first)
                except json.JSONDecodeError:
                    val = None
                rest = [ln for ln in text.lstrip().split("\n")[1:] if ln.strip()]
                try:
                    jsonl_after = bool(rest) and isinstance(json.loads(rest[0]), dict)
                except json.JSONDecodeError:
                    jsonl_after = False
                if isinstance(val, list) and not jsonl_after:  # an -o json array, then something else
                    raise ScenarioError("a JSON array on line 1 and more after it: llama-bench -o json writes one "
                                        "array and nothing else, -o jsonl one object per line", file=p,
                                        field="line 2") from None
                if val is not None:
                    raise ScenarioError(f"expected a JSON object (a llama-bench -o jsonl row), got "
                                        f"{json_kind(val)}", file=p, field="line 1") from None
            msg, key = _decode_error(text, exc)
            raise ScenarioError(f"{msg} at line {exc.lineno}",
                                file=p, field=f"{key}, line {exc.lineno}" if key else f"line {exc.lineno}") from None
        if not isinstance(data, list):
            raise ScenarioError("expected a JSON array of llama-bench rows", file=p)
        for i, rec in enumerate(data, 1):
            if not isinstance(rec, dict):
                raise ScenarioError(f"expected an object, got {json_kind(rec)}", file=p, field=f"row {i}")
            records.append((i, rec))
    else:
        fmt, unit = "jsonl", "line"
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                msg, key = _decode_error(line, exc)
                raise ScenarioError(msg, file=p, field=f"{key}, line {i}" if key else f"line {i}") from None
            if not isinstance(rec, dict):
                raise ScenarioError(f"expected a JSON object, got {json_kind(rec)}", file=p, field=f"line {i}")
            records.append((i, rec))
    if not records:
        raise ScenarioError("no llama-bench rows", file=p)

    rows = []
    for i, rec in records:
        def err(fld: str, msg: str, _i=i) -> ScenarioError:
            return ScenarioError(msg, file=p, field=f"{fld}, {unit} {_i}")
        rows.append(_check_row(rec, err))
    known = [f.name for f in FIELDS if any(f.name in r for r in rows)]
    extra: list[str] = []
    for r in rows:
        extra += [k for k in r if k not in FIELD_BY_NAME and k not in extra and k != "test"]
    df = pd.DataFrame([{k: r.get(k) for k in known + extra} for r in rows], columns=known + extra,
                      index=pd.Index([i for i, _ in records], name=unit))
    for k in known:  # a number some rows lack: NaN there, like pandas' own readers
        f = FIELD_BY_NAME[k]
        if not f.array and f.type in (INT, FLOAT) and df[k].isna().any():
            df[k] = pd.to_numeric(df[k])
    df["test"] = [bench_test_name(r["n_prompt"], r["n_gen"], r["n_depth"]) for r in rows]
    _refuse_copied_rows(records, p, unit)
    df.attrs.update(file=str(p), format=fmt)
    return df


def _refuse_copied_rows(records: list[tuple[int, dict]], path: Path, unit: str) -> None:
    """Refuse a row that repeats an earlier one with its samples (``samples_ns``): two runs of a
    test never time the same nanoseconds, so it is a copy (a file appended to itself, a row
    pasted twice), which would count one measurement twice.

    Raises:
        ScenarioError: naming both rows (``line``/``row`` numbers).
    """
    seen: dict[str, int] = {}
    for i, rec in records:
        if not rec.get("samples_ns"):
            continue  # without samples two rows may agree by chance
        key = json.dumps(rec, sort_keys=True, default=str)
        if key in seen:
            raise ScenarioError(f"{unit} {i} repeats {unit} {seen[key]} with the same samples: a copy, not another "
                                "measurement (each llama-bench run times its own); keep one", file=path,
                                field=f"samples_ns, {unit} {i}")
        seen[key] = i


# --------------------------------------------------------------------------------------
# a row in the simulator's terms
# --------------------------------------------------------------------------------------


def parse_overrides(text: Any) -> tuple[tuple[str, str], ...]:
    """llama-bench's printed ``tensor_buft_overrides`` as ``(regex, buffer)`` pairs, in order.

    llama-bench prints each rule as ``pattern=BUFFER`` (``BUFFER`` a device's buffer type name:
    ``CPU``, ``CUDA0`` ...) joined by ``;``, and ``none`` when there is none (also for an empty
    rule). llama-bench's ``-ot`` parser cuts a rule at its first ``=`` and rules at ``;`` (groups
    at ``,``), so a printed pattern never holds ``=`` or ``;`` and the split is exact.

    Args:
        text: the field's value; ``None``, NaN, ``""`` and ``"none"`` mean no rule.

    Raises:
        ValueError: a rule without ``=`` or with an empty pattern or buffer.
    """
    if text is None or (isinstance(text, float) and math.isnan(text)):
        return ()
    s = str(text).strip()
    out = []
    for rule in s.split(";"):
        rule = rule.strip()
        if not rule or rule == "none":
            continue
        if "=" not in rule:
            raise ValueError(f"override rule {rule!r} has no '=BUFFER'")
        regex, buf = rule.split("=", 1)
        if not regex or not buf:
            raise ValueError(f"override rule {rule!r}: empty pattern or buffer")
        out.append((regex, buf))
    return tuple(out)


def n_cpu_moe_rules(n_cpu_moe: int) -> tuple[tuple[str, str], ...]:
    """The ``-ot`` rules llama-bench appends, after the row's own, for ``--n-cpu-moe N``
    (``cmd_params_instance::to_llama_mparams``, with ``common.h``'s ``llm_ffn_block_regex`` and
    ``LLM_FFN_EXPS_REGEX``): the expert tensors of blocks ``0..N-1`` to ``CPU``. llama-bench does
    not print them in ``tensor_buft_overrides``; the simulator's ``Placement.n_cpu_moe`` does the
    same thing."""
    return tuple((rf"blk\.{i}\.ffn_(up|down|gate|gate_up)_(ch|)exps", "CPU") for i in range(max(0, n_cpu_moe)))


#: ECMAScript (``std::regex``) POSIX classes inside brackets and their Python ``re`` spelling
_POSIX_CLASSES = {"digit": "0-9", "alpha": "A-Za-z", "alnum": "0-9A-Za-z", "upper": "A-Z", "lower": "a-z",
                  "space": r"\s", "xdigit": "0-9A-Fa-f", "w": r"\w", "d": "0-9", "s": r"\s",
                  "punct": r"!-/:-@\[-`{-~"}


def python_regex(regex: str) -> str:
    """A llama.cpp ``-ot`` pattern (ECMAScript ``std::regex``, as ``llama_model_loader`` compiles
    it) in Python ``re`` syntax: POSIX bracket classes (``[[:digit:]]``) spelled out; everything
    else is the same in both for the patterns ``-ot`` sees.

    Raises:
        ValueError: a POSIX class Python has no spelling for here, a group repeated without
            bound inside a repetition without bound (:func:`sim.model.specs.nested_repeat`:
            exponential matching time), or syntax that ``std::regex`` refuses
            (:func:`sim.model.specs.ot_regex_problem`).
    """
    from sim.model.specs import ot_regex_problem

    def sub(m: re.Match) -> str:
        if m.group(1) not in _POSIX_CLASSES:
            raise ValueError(f"POSIX class [:{m.group(1)}:] in '{regex}' not supported")
        return _POSIX_CLASSES[m.group(1)]

    out = re.sub(r"\[:(\w+):\]", sub, regex)
    problem = ot_regex_problem(out)
    if problem:
        raise ValueError(f"'{regex}' {problem}")
    return out


def sim_regex(regex: str) -> str:
    """A llama.cpp ``-ot`` pattern as the simulator's ``Placement.override_tensor`` uses it.

    The simulator names tensors as GGUF does (``blk.7.ffn_up_exps.weight``,
    :class:`sim.model.specs.Tensor`), so a pattern matches (``re.search``, as llama.cpp's
    ``std::regex_search``) the same tensors in both: only the ECMAScript POSIX classes are
    spelled out (:func:`python_regex`). ``ffn_up_exps$`` matches nothing, in llama.cpp too.

    Raises:
        ValueError: an unsupported POSIX class.
    """
    return python_regex(regex)


def sim_overrides(rules: Sequence[tuple[str, str]], model=None) -> tuple[tuple[str, str], ...]:
    """``-ot`` rules as the simulator's ``Placement.override_tensor``: each pattern through
    :func:`sim_regex`, buffers upper-cased (``CPU``, ``CUDA0``), order kept (first match wins).
    They match exactly the tensors llama.cpp's rules match (the names agree); ``model`` is
    accepted for callers that pass it and not needed.

    Raises:
        re.error: a pattern Python's ``re`` cannot compile (llama.cpp uses ECMAScript
            ``std::regex``; :func:`python_regex` translates its POSIX classes).
        ValueError: an unsupported POSIX class.
    """
    out = []
    for regex, buf in rules:
        rx = sim_regex(regex)
        re.compile(rx)
        out.append((rx, buf.upper()))
    return tuple(out)


def load_mode_of(row) -> str:
    """A row's ``load_mode`` as printed, or for a llama-bench version without it (``-mmp``) what
    its ``use_mmap`` ran: ``mmap`` when true, ``none`` (weights read into host buffers) when
    false; ``auto`` (the default) with neither."""
    lm, mm = row_value(row, "load_mode"), row_value(row, "use_mmap")
    return str(lm) if lm is not None else "auto" if mm is None else "mmap" if mm else "none"


def host_memory_pinned(load_mode: Any = "auto", no_host: Any = False, use_mmap: Any = None) -> bool:
    """Whether a row's host-resident weights sit in pinned memory.

    ``load_mode`` ``auto`` (llama-bench's default; mmap on CUDA devices), ``mmap`` and
    ``mmap+mlock`` mmap the file: host weights stay in the mapping (pageable; llama.cpp swaps the
    host buffer type for the CPU one under mmap). ``none``, ``mlock`` and ``dio`` read them into
    the GPU backend's host buffer type (``CUDA_Host``, pinned), also for ``-ot ...=CPU`` rules,
    unless ``no_host``. Rows of llama-bench versions without ``load_mode`` carry ``use_mmap``
    (``true``: pageable).

    Raises:
        ValueError: an unknown load mode.
    """
    if no_host is True or no_host == 1:
        return False
    if load_mode is None or (isinstance(load_mode, float) and math.isnan(load_mode)):
        if use_mmap is not None and not (isinstance(use_mmap, float) and math.isnan(use_mmap)):
            return not bool(use_mmap)
        load_mode = "auto"
    lm = str(load_mode).strip().lower()
    if lm in MMAP_LOAD_MODES:
        return False
    if lm in BUFFER_LOAD_MODES:
        return True
    raise ValueError(f"unknown load_mode {load_mode!r} (llama_load_mode_name: auto, none, mmap, mlock, "
                     "mmap+mlock, dio)")


def flash_attn_label(value: Any) -> str:
    """``flash_attn`` as printed (``-1``/``0``/``1``, or an older version's bool) -> ``auto``,
    ``off`` or ``on`` (``llama_flash_attn_type``). Missing -> ``auto`` (the default)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "auto"
    if isinstance(value, bool):
        return "on" if value else "off"
    try:
        return FLASH_ATTN[int(value)]
    except (KeyError, ValueError, TypeError):
        raise ValueError(f"unknown flash_attn {value!r} (-1 auto, 0 off, 1 on)") from None


#: ``ggml_type_from_name`` of llama-bench: the KV cache types ``-ctk``/``-ctv`` accept, and so the
#: only ``type_k``/``type_v`` a llama-bench row can print
KV_TYPES = ("f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")


def kv_bytes_per_elem(type_k: Any = "f16", type_v: Any = "f16") -> float:
    """Mean bytes per K/V cache element of ``type_k``/``type_v`` (ggml type names as printed,
    ``f16``, ``q8_0``...), from :data:`sim.model.quant.GGML_TYPE_BPW`: the simulator's
    ``ModelSpec.kv_bytes_per_elem``.

    Raises:
        KeyError: a type the simulator does not know.
    """
    from sim.model.quant import bpw_of

    def one(t: Any) -> float:
        if t is None or (isinstance(t, float) and math.isnan(t)):
            t = "f16"
        return bpw_of(str(t)) / 8

    return (one(type_k) + one(type_v)) / 2


def row_value(row: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """``row[key]`` of a llama-bench row (a mapping or a pandas row), or ``default`` where the row
    lacks it or holds NaN (a field another llama-bench version did not print)."""
    v = row.get(key, default) if hasattr(row, "get") else default
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return default
    return v


@dataclass(frozen=True)
class RowTerms:
    """One llama-bench row in the simulator's terms.

    Attributes:
        ngl: ``Placement.ngl`` (:func:`sim_ngl`).
        n_cpu_moe: ``--n-cpu-moe``.
        overrides: the row's ``-ot`` rules as printed (llama.cpp patterns; :func:`parse_overrides`).
        pinned: host weights pinned (:func:`host_memory_pinned`).
        load_mode: as printed (``auto`` when the row lacks it).
        flash_attn: ``auto``, ``off`` or ``on``.
        n_ubatch: ``-ub``, clamped to ``n_batch`` as llama.cpp does.
        n_batch: ``-b``.
        n_prompt, n_gen, n_depth: the test (``-p``/``-n``/``-pg``, ``-d``).
        type_k, type_v: KV cache types as printed.
        kv_bytes_per_elem: their mean bytes per element (None: a type the simulator lacks).
        no_op_offload: ``-nopo``: ops with host weights never move to the GPU.
        tensor_split: ``-ts`` shares (empty: llama.cpp's default split).
        test: llama-bench's test name.
        notes: what of the row the simulator does not represent.
    """

    ngl: int
    n_cpu_moe: int
    overrides: tuple[tuple[str, str], ...]
    pinned: bool
    load_mode: str
    flash_attn: str
    n_ubatch: int
    n_batch: int
    n_prompt: int
    n_gen: int
    n_depth: int
    type_k: str
    type_v: str
    kv_bytes_per_elem: float | None
    no_op_offload: bool
    tensor_split: tuple[float, ...]
    test: str
    notes: tuple[str, ...] = field(default=())
    no_kv_offload: bool = False
    embeddings: bool = False
    split_mode: str = "layer"

    @property
    def tests(self):
        """The simulator tests of the row (:class:`sim.model.specs.BenchTest`): one for ``pp``/``tg``;
        for ``-pg`` (``pp512+tg128``) the prompt at the row's depth, then the generation at depth
        + prompt, as llama-bench runs them in one context."""
        from sim.model.specs import BenchTest

        pp = BenchTest(self.n_prompt, 0, self.n_depth)
        if not self.n_gen:
            return (pp,)
        if not self.n_prompt:
            return (BenchTest(0, self.n_gen, self.n_depth),)
        return (pp, BenchTest(0, self.n_gen, self.n_depth + self.n_prompt))

    @property
    def ctx_size(self) -> int:
        """llama-bench's context: ``n_prompt + n_gen + n_depth``."""
        return max(1, self.n_prompt + self.n_gen + self.n_depth)


def clamped_ubatch(n_ubatch: int, n_batch: int) -> int:
    """The physical batch llama.cpp runs: ``-ub`` clamped to ``-b`` (``llama_context``:
    ``n_ubatch = std::min(n_batch, n_ubatch)``). llama-bench prints the ``-ub`` given; the
    simulator runs this one (:func:`row_terms`, which ``prefetch-sim run`` and
    ``calibrate.llamacpp.compare`` both go through)."""
    return min(int(n_ubatch), int(n_batch))


def row_terms(row: Mapping[str, Any]) -> RowTerms:
    """Translate one llama-bench row (a mapping or a DataFrame row of :func:`read_llama_bench`)
    into :class:`RowTerms`. Fields an older llama-bench lacks take llama-bench's defaults
    (``n_cpu_moe`` 0, no overrides, ``load_mode`` auto, ``flash_attn`` auto, f16 KV).

    Raises:
        ValueError: an override rule, load mode or flash_attn value that cannot be read; a value
            llama-bench never prints: a KV type that is no ggml type, a ``split_mode`` other than
            ``none``/``layer``/``row``/``tensor`` (``split_mode_str``), a ``tensor_split`` that is
            not ``/``-separated numbers.
    """
    notes: list[str] = []
    n_batch = int(row_value(row, "n_batch", 2048))
    n_ubatch = clamped_ubatch(int(row_value(row, "n_ubatch", 512)), n_batch)
    type_k, type_v = str(row_value(row, "type_k", "f16")), str(row_value(row, "type_v", "f16"))
    for name, t in (("type_k", type_k), ("type_v", type_v)):
        # llama-bench parses -ctk/-ctv with ggml_type_from_name and prints ggml_type_name: lower case
        if t not in KV_TYPES:
            raise ValueError(f"{name} {t!r}: not a KV cache type llama-bench takes ({', '.join(KV_TYPES)}); "
                             "no llama-bench row prints it")
    try:
        kvb = kv_bytes_per_elem(type_k, type_v)
    except KeyError:
        raise ValueError(f"type_k/type_v {type_k}/{type_v}: not a ggml type llama-bench prints") from None
    fa_row = flash_attn_label(row_value(row, "flash_attn"))
    fa_on = fa_row != "off" and not fa_auto_off(fa_row, type_k, type_v)
    note = kv_note(type_k, type_v, fa_on) if kvb is not None else None
    if note:
        notes.append(note)
    if fa_auto_off(fa_row, type_k, type_v):
        notes.append(f"flash_attn auto with K {type_k}: llama.cpp turns FlashAttention off (ggml-cuda has no "
                     "kernel for that K cache), as simulated")
    ts_text = str(row_value(row, "tensor_split", "") or "")
    try:
        shares = tuple(float(x) for x in ts_text.split("/") if x.strip()) if ts_text else ()
    except ValueError:
        raise ValueError(f"tensor_split {ts_text!r}: not shares as llama-bench prints them (0.00 or 3.00/1.00)") from None
    if shares and not any(shares):
        shares = ()
    sm = str(row_value(row, "split_mode", "layer"))
    if sm not in ("layer", "none", "row", "tensor"):
        raise ValueError(f"split_mode {sm!r}: llama-bench prints none, layer, row or tensor")
    if sm not in ("layer", "none"):
        notes.append(f"split_mode {sm}: not modelled (layer split simulated)")
    if str(row_value(row, "lazy_mode", "auto")) == "on":
        notes.append("lazy_mode on: on-demand tensor reads are not modelled")
    n_prompt, n_gen, n_depth = int(row["n_prompt"]), int(row["n_gen"]), int(row["n_depth"])
    return RowTerms(
        ngl=sim_ngl(int(row_value(row, "n_gpu_layers", -1))),
        n_cpu_moe=int(row_value(row, "n_cpu_moe", 0)),
        overrides=parse_overrides(row_value(row, "tensor_buft_overrides", "none")),
        pinned=host_memory_pinned(row_value(row, "load_mode"), row_value(row, "no_host", False), row_value(row, "use_mmap")),
        load_mode=load_mode_of(row),
        flash_attn=flash_attn_label(row_value(row, "flash_attn")),
        n_ubatch=n_ubatch, n_batch=n_batch, n_prompt=n_prompt, n_gen=n_gen, n_depth=n_depth,
        type_k=type_k, type_v=type_v, kv_bytes_per_elem=kvb,
        no_op_offload=bool(row_value(row, "no_op_offload", 0)),
        tensor_split=shares, test=bench_test_name(n_prompt, n_gen, n_depth), notes=tuple(notes),
        no_kv_offload=bool(row_value(row, "no_kv_offload", False)), embeddings=bool(row_value(row, "embeddings", False)),
        split_mode=sm,
    )


#: ``Placement.op_offload_min_batch`` that never offloads (``-nopo 1``)
NO_OP_OFFLOAD_MIN_BATCH = 2**31 - 1

#: buffer names the simulator places tensors in (``CPU``, ``CUDA<n>``; ``GPU<n>`` as the specs)
_SIM_BUFFER = re.compile(r"CPU|CUDA\d+|GPU\d*")


#: the K/V cache type pairs ggml-cuda's FlashAttention vector kernel is compiled for by default
#: (ggml/CMakeLists.txt: GGML_CUDA_FA_QUANTS "q4_0-q4_0;q8_0-q8_0;f16-f16;bf16-bf16"); another
#: pair of supported types is converted to F16 in every call (fattn.cu: "slow")
FA_KV_COMPILED = (("q4_0", "q4_0"), ("q8_0", "q8_0"), ("f16", "f16"), ("bf16", "bf16"))
#: K/V cache types ggml-cuda's FlashAttention has no kernel for at all
#: (``ggml_cuda_fattn_kv_type_supported``): the op then runs on the CPU
FA_KV_UNSUPPORTED = ("iq4_nl",)
#: block size of every quantised KV cache type llama-bench takes (32-element blocks)
KV_BLOCK = 32


def _fa(value: Any) -> str:
    """A flash-attention setting (``-1``/``0``/``1``, a bool, or a label) as ``auto``/``off``/``on``."""
    return value if value in ("auto", "on", "off") else flash_attn_label(value)


#: why llama.cpp refuses a quantised V cache without FlashAttention (``llama_init_from_model``)
QUANTISED_V_NEEDS_FA = "llama.cpp refuses this context (V cache quantization requires flash_attn)"


def quantised_v_without_fa(flash_attn: Any, type_v: Any) -> bool:
    """Whether llama.cpp refuses the context for a quantised V cache with FlashAttention off
    (``llama_init_from_model``: "V cache quantization requires flash_attn"; ``-fa auto`` turns it
    on instead). ``flash_attn``: ``-1``/``0``/``1``, a bool or a label; ``type_v``: a ggml type
    name or None (not given: f16)."""
    return type_v is not None and _fa(flash_attn) == "off" and str(type_v).lower() not in UNQUANTISED_KV


def fa_auto_off(flash_attn: Any, type_k: Any, type_v: Any) -> bool:
    """Whether llama.cpp's ``-fa auto`` turns FlashAttention off for these KV types: an auto
    setting resolves by where the FlashAttention op would run (``llama_context``:
    ``resolve(llm_fused_op_flash_attn_probe)``, "not supported, set to disabled"), and with a K
    cache type ggml-cuda has no FlashAttention kernel for (:data:`FA_KV_UNSUPPORTED`) it would
    run on the CPU; a quantised V forces it on first (``llama_init_from_model``: "enabling
    flash_attn since it is required for quantized V cache")."""
    return (_fa(flash_attn) == "auto" and str(type_k).lower() in FA_KV_UNSUPPORTED
            and str(type_v).lower() in UNQUANTISED_KV)


def kv_context_error(model, flash_attn: Any, type_k: Any, type_v: Any) -> tuple[str, str] | None:
    """``(field, reason)`` when llama.cpp refuses the context (``llama_init_from_model`` returns
    no context and llama-bench stops there) for its KV types: with FlashAttention not disabled
    (on or auto), a quantised K or V cache whose 32-element block does not divide the model's
    head size ("K cache type q8_0 with block size 32 does not divide n_embd_head_k=80"). A
    quantised V with FlashAttention off is refused by the callers already. None when it loads."""
    if _fa(flash_attn) == "off":
        return None
    for field, t in (("type_k", type_k), ("type_v", type_v)):
        if str(t).lower() not in UNQUANTISED_KV and model.head_dim % KV_BLOCK:
            return field, (f"{t} with FlashAttention ({_fa(flash_attn)}): llama.cpp refuses this context ("
                           f"{'K' if field == 'type_k' else 'V'} cache type {t} with block size {KV_BLOCK} does "
                           f"not divide the head size {model.head_dim} of '{model.name}')")
    return None


def kv_note(type_k: str, type_v: str, fa_on: bool) -> str | None:
    """The note of a quantised KV cache (what VRAM and the attention price take from it), or
    None for f16/f16: the attention reads are priced as F16; with FlashAttention on, ggml-cuda's
    prefill kernels convert any quantised K/V to F16 in every call, and a pair its default build
    has no vector kernel for (:data:`FA_KV_COMPILED`) converts in decode too (fattn.cu: "slow"):
    neither conversion is priced."""
    k, v = type_k.lower(), type_v.lower()
    if (k, v) == ("f16", "f16"):
        return None
    note = f"KV {type_k}/{type_v}: VRAM counts its size; attention reads are priced as F16"
    if fa_on and (k not in UNQUANTISED_KV or v not in UNQUANTISED_KV):
        note += ("; FlashAttention's prefill kernels convert the quantised K/V to F16 in every call"
                 + ("" if (k, v) in FA_KV_COMPILED else
                    f", and decode's too (the default build has no kernel for {type_k}/{type_v}: GGML_CUDA_FA_QUANTS "
                    f"{';'.join('-'.join(p) for p in FA_KV_COMPILED)})")
                 + ", which is not priced")
    return note

#: the settings llama.cpp runs in a way the simulator does not model and whose speed they would
#: change (:func:`unmodelled_kind`), each with llama-bench's flag and JSON field and what it does
UNMODELLED = {
    "fa_kv_type": ("-ctk/-ctv", "FlashAttention on an iq4_nl K/V cache, which ggml-cuda has no kernel for "
                                "(ggml_cuda_fattn_kv_type_supported): llama.cpp runs every layer's attention on the CPU"),
    "no_kv_offload": ("-nkvo/--no-kv-offload", "the KV cache and attention on the host"),
    "split_mode": ("-sm/--split-mode", "each matmul split across the GPUs"),
    "embeddings": ("-embd/--embeddings", "embeddings output: no output head, pooled"),
}


def unmodelled_kind(setting, n_gpu: int) -> str | None:
    """The key of :data:`UNMODELLED` that ``setting`` (anything with ``no_kv_offload``,
    ``split_mode`` and ``embeddings``: a :class:`RowTerms`, a ``prefetch-sim run`` setting) hits,
    else None: FlashAttention on an iq4_nl K or V cache (no ggml-cuda kernel: the attention runs
    on the CPU; ``-fa auto`` with an iq4_nl K and an unquantised V turns it off instead,
    :func:`fa_auto_off`), the KV cache on the host (every layer's attention on the CPU), a
    row or tensor split over several GPUs (``-sm layer`` and ``none``, and any split on one GPU,
    are modelled), or embeddings output (no output head, pooling). ``run`` refuses such a setting
    (:func:`sim.cli.benchflags.unmodelled_setting`) and ``compare`` does not score such a row:
    the one rule for both."""
    fa = _fa(getattr(setting, "flash_attn", -1))
    tk, tv = getattr(setting, "type_k", "f16"), getattr(setting, "type_v", "f16")
    if (fa != "off" and not fa_auto_off(fa, tk, tv)
            and any(str(t).lower() in FA_KV_UNSUPPORTED for t in (tk, tv))):
        return "fa_kv_type"
    if setting.no_kv_offload:
        return "no_kv_offload"
    if setting.split_mode in ("row", "tensor") and n_gpu > 1:
        return "split_mode"
    if setting.embeddings:
        return "embeddings"
    return None


def gguf_names(model) -> list[str]:
    """The model's tensor names as a GGUF has them (``blk.3.ffn_up_exps.weight``); a model whose
    names lack the suffix (an older :class:`sim.model.specs.Tensor` naming) gets ``.weight`` added."""
    names = [t.name for t in model.tensors]
    if any(n.endswith((".weight", ".bias")) for n in names):
        return names
    return [n + ".weight" for n in names]


def _norm_names(model) -> list[str]:
    """Names of the norm tensors a GGUF has and the simulator leaves out (< 0.01% of bytes)."""
    out = ["output_norm.weight"]
    for i in range(model.n_layer):
        out += [f"blk.{i}.attn_norm.weight", f"blk.{i}.ffn_norm.weight", f"blk.{i}.post_attention_norm.weight",
                f"blk.{i}.post_ffw_norm.weight", f"blk.{i}.attn_q_norm.weight", f"blk.{i}.attn_k_norm.weight"]
    return out


def rule_match_note(pattern: str, buf: str, model) -> str | None:
    """The note of an ``-ot`` rule (a pattern that compiles) that matches no tensor of ``model``
    (llama.cpp's ``regex_search`` on GGUF names), with the nearest tensor names: it has no
    effect, as in llama.cpp, whose loader tries each rule on each tensor and silently skips a
    rule that matches none (``llama_model_loader::create_tensor``, ``tensor_buft_overrides``);
    or of one that matches only norm tensors (which the simulator leaves out). None when the
    rule matches a simulated tensor."""
    import difflib

    cre = re.compile(python_regex(pattern))
    names = gguf_names(model)
    if any(cre.search(n) for n in names):
        return None
    if any(cre.search(n) for n in _norm_names(model)):
        return f"-ot rule '{pattern}={buf}' matches only norm tensors, which the simulator leaves out"
    plain = re.sub(r"\\(.)", r"\1", pattern)
    near = difflib.get_close_matches(plain, names, n=3, cutoff=0.0)
    return (f"-ot rule '{pattern}={buf}' matches no tensor of model '{model.name}' (nearest: "
            f"{', '.join(near)}); llama.cpp ignores such a rule, and so does the simulation")


def row_placement(terms: RowTerms, model, n_gpu: int = 1):
    """The simulator ``Placement`` of a row on ``model`` (a ``ModelSpec`` already cut to the
    GGUF's layers) and a machine of ``n_gpu`` GPUs, and notes on what it could not carry.

    ``ngl``, ``n_cpu_moe`` (clamped to the model's layers; 0 on a dense model), the ``-ot``
    rules (:func:`sim_overrides`; the simulator's tensor names are llama.cpp's), pinned or pageable host
    memory, ``-nopo``, ``-ts`` and the context of the test (``n_prompt + n_gen + n_depth``).

    Returns:
        ``(Placement, notes)``.

    Raises:
        ValueError: an ``-ot`` rule with a buffer the simulator does not know (not ``CPU`` or
            ``CUDA<n>`` of an existing GPU), or a pattern Python's ``re`` cannot compile; the
            message names the rule.
    """
    from sim.model.specs import Placement

    notes: list[str] = []
    for regex, buf in terms.overrides:
        b = buf.upper()
        dev = re.fullmatch(r"(?:CUDA|GPU)(\d*)", b)
        if not _SIM_BUFFER.fullmatch(b) or (dev and int(dev.group(1) or 0) >= n_gpu):
            known = "CPU or CUDA0" if n_gpu == 1 else f"CPU, CUDA0..CUDA{n_gpu - 1}"
            raise ValueError(f"-ot rule '{regex}={buf}': buffer '{buf}' is not one the simulator places tensors in "
                             f"on this hardware ({known})")
        try:
            re.compile(python_regex(regex))
        except (re.error, ValueError) as exc:
            raise ValueError(f"-ot rule '{regex}={buf}': pattern not understood by Python re ({exc})") from None
        note = rule_match_note(regex, buf, model)
        if note:
            notes.append(note)
    ncm = min(terms.n_cpu_moe, model.n_layer) if model.moe is not None else 0
    if model.moe is not None and terms.n_cpu_moe > model.n_layer:
        # llama.cpp's -ncmoe names blocks 0..N-1: past the last block every expert is on the host
        notes.append(f"n_cpu_moe {terms.n_cpu_moe}: the model has {model.n_layer} blocks; every expert is on the host")
    shares = terms.tensor_split
    if len(shares) > n_gpu:
        # llama.cpp reads the first n_devices shares (llama_model::load_tensors: std::copy of
        # tensor_split over n_devices(); all of them zero: its default split)
        if any(shares[n_gpu:]):
            kept = "/".join(f"{x:g}" for x in shares[:n_gpu])
            notes.append(f"tensor_split {'/'.join(f'{x:g}' for x in shares)} for more GPUs than the "
                         f"hardware's {n_gpu}: llama.cpp reads the first {n_gpu} ({kept}"
                         f"{'' if any(shares[:n_gpu]) else ': all zero, its default split'})")
        shares = shares[:n_gpu]
    pl = Placement(
        ngl=terms.ngl, n_cpu_moe=ncm, override_tensor=sim_overrides(terms.overrides, model),
        pinned=terms.pinned, ctx_size=terms.ctx_size,
        op_offload_min_batch=NO_OP_OFFLOAD_MIN_BATCH if terms.no_op_offload else 32,
        # llama-bench prints shares up to the last non-zero one: "1.00" on two GPUs is 1/0 (all
        # on the first); no share above zero ("0.00") is llama.cpp's default split
        tensor_split=tuple(shares) + (0.0,) * (n_gpu - len(shares)) if any(shares) and n_gpu > 1 else (),
        flash_attn=terms.flash_attn != "off" and not fa_auto_off(terms.flash_attn, terms.type_k, terms.type_v),
    )
    return pl, tuple(notes)


def row_workload(terms: RowTerms, repetitions: int = 3):
    """The simulator ``Workload`` of a row: its ``n_ubatch``/``n_batch`` and its test(s) (see
    :attr:`RowTerms.tests`), ``repetitions`` routing draws."""
    from sim.model.specs import Workload

    ts = terms.tests
    return Workload(
        n_prompt=tuple(t.n_prompt for t in ts if t.n_prompt) or (0,),
        n_gen=tuple(t.n_gen for t in ts if t.n_gen) or (0,),
        n_depth=tuple(sorted({t.n_depth for t in ts})),
        n_ubatch=terms.n_ubatch, n_batch=terms.n_batch, repetitions=repetitions,
    )


def model_with_kv(model, terms: RowTerms):
    """``model`` with the row's KV cache element size (``type_k``/``type_v``), unchanged when it
    is the model's already or the types are unknown."""
    if terms.kv_bytes_per_elem is None or terms.kv_bytes_per_elem == model.kv_bytes_per_elem:
        return model
    return replace(model, kv_bytes_per_elem=terms.kv_bytes_per_elem)
