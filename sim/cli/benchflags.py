"""llama-bench's command line for ``prefetch-sim run`` (and ``trace``/``check``): its flags, its
list and range syntax, its cartesian product of parameters, and each combination as a
simulator scenario.

Source: llama.cpp ``tools/llama-bench/llama-bench.cpp`` (``parse_cmd_params``,
``cmd_params_instance``, ``get_cmd_params_instances``, ``test::get_values``), restated here,
not copied. As there:

* every parameter takes a comma list, integers also ranges (``first-last``,
  ``first-last+step``, ``first-last*mult``), and a repeated flag adds values
  (``-p 32 -p 64`` runs both);
* the run is the product of the values, in llama-bench's loop order (model, ``-fitt``,
  ``-fitc``, ``-ngl``, ``-ncmoe``, ``-sm``, ``-lm``, ``-mg``, ``-ts``, ``-ot``, ``--no-host``,
  ``-embd``, ``-nopo``, ``-b``, ``-ub``, ``-ctk``, ``-ctv``, ``-nkvo``, ``-fa``, ``-t``, ``-d``),
  and for each combination the tests ``-p`` (pp), ``-n`` (tg) and ``-pg`` (pp+tg): one result
  row per combination and test (and variant);
* ``-ot`` takes rules ``pattern=BUFFER`` separated by ``;`` within one set and sets separated by
  ``,``: each set is its own test (``-ot 'exps=CPU;attn=CPU,ffn=CPU'`` is two). llama-cli's
  ``-ot`` separates rules by ``,``; ``--override-tensor-cli`` takes that syntax (all its rules,
  however many times it is given, form one set). As in llama-bench, an empty item of the comma
  list (``-ot ''``, a trailing ``,``) is a set without overrides, and a set is read up to its
  first empty rule (:func:`_ot_sets`). Buffers, spelt exactly as llama-bench lists them:
  ``CPU``, ``CUDA<i>`` / ``ROCm<i>`` for the profile's GPUs;
* ``--n-cpu-moe N`` adds, after the ``-ot`` rules, the rules keeping the experts of blocks
  0..N-1 on the host (:func:`sim.views.llamabench.n_cpu_moe_rules`; the simulator's
  ``Placement.n_cpu_moe``).

What is not given on the command line comes from the scenario (its placement, workload,
model, hardware and variants; ``-m`` replaces the model only). Each combination becomes a
llama-bench row (:func:`bench_values`) and, through the row helpers of :mod:`sim.views.llamabench`
(``row_terms``, ``row_placement``, ``model_with_kv``: the same mapping the comparison against
real llama-bench runs uses), the simulator's placement and workload (:func:`setting_scenario`).
Flags the simulator does not model but that leave a row's configuration what it prints (``-t``,
``--poll``, ``--repack``...) and flags a model has no use for (``-ncmoe`` on a dense model) are noted
on stderr, one line each; a setting it does not model and whose speed they change (``-nkvo 1``,
``-sm row`` over several GPUs, ``-embd 1``: :func:`unmodelled_setting`) is refused, or left out with
``--skip-unmodelled``.
"""

from __future__ import annotations

import argparse
import itertools
import math
import functools
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sim.errors import ContextRefusedError, ScenarioError
from sim.views.llamabench import KV_TYPES  # the KV cache types -ctk/-ctv accept (llama-bench's)
from sim.views.report import FORMATS  # llama-bench's -o formats

# --------------------------------------------------------------------------------------
# value syntax
# --------------------------------------------------------------------------------------

#: ASCII digits only, as ``std::stoi`` reads them (Python's ``\d`` takes any Unicode digit: ``５１２``)
_RANGE = re.compile(r"^\s*(-?\d+)\s*(?:-\s*(-?\d+)\s*(?:([+*])\s*(-?\d+))?)?\s*$", re.ASCII)


def _digits(text: str) -> bool:
    """``text`` (blanks around it ignored) is ASCII digits only, as ``std::stoi`` reads them."""
    t = text.strip()
    return t.isascii() and t.isdigit()


def ascii_int(text: str) -> int:
    """``int(text)`` for an argparse flag, ASCII digits only (Python's ``int`` also reads other
    scripts' digits, ``５１２``, which llama-bench's ``std::stoi`` refuses).

    Raises:
        argparse.ArgumentTypeError: not an integer in ASCII digits.
    """
    t = text.strip()
    if not _digits(t.removeprefix("-").removeprefix("+")):
        raise argparse.ArgumentTypeError(f"expected an integer, got '{text}'")
    return int(t)


def int_list(text: str, *, allow_negative: bool = False) -> tuple[int, ...]:
    """llama-bench list syntax (``parse_int_range``): ``512,1024``, ``512-2048*2`` (first-last*mult)
    or ``a-b+s`` (first-last+step), with one trailing ``,`` allowed (``64,``) as llama-bench's
    regex allows it; ``allow_negative``: the first number of an item may be
    negative (``-ngl -1``); a range's end and step never are (llama-bench's regex refuses them).

    Raises:
        argparse.ArgumentTypeError: not integers, a negative value, a negative range end, a
            range that yields no value (end below start), or one that would never end (a multiplier below 2 or a
            start below 1 with ``*``, a step below 1 with ``+``).
    """
    from sim.bounds import INT32_MAX, LIST_VALUES_MAX

    out: list[int] = []
    # parse_int_range's regex takes each item with its ',' or the end: one trailing ',' is fine there
    body = text[:-1] if text.endswith(",") and not text.endswith(",,") and len(text) > 1 else text
    for part in body.split(","):
        m = _RANGE.match(part)
        if not m:
            raise argparse.ArgumentTypeError(f"expected integers like 512,1024 or 128-2048*2, got '{text}'")
        nums = [g for g in (m.group(1), m.group(2), m.group(4)) if g is not None]
        if any(len(g.lstrip("+-")) > 10 or abs(int(g)) > INT32_MAX for g in nums):
            raise argparse.ArgumentTypeError(f"values must be at most {INT32_MAX} (a C int, as llama-bench reads "
                                             f"them), got '{part.strip()}'")
        first = int(m.group(1))
        if first < 0 and not allow_negative:
            raise argparse.ArgumentTypeError(f"values cannot be negative, got '{text}'")
        if m.group(2) is None:
            out.append(first)
            continue
        if m.group(2).startswith("-"):  # parse_int_range: '-?\d+' for the first number only
            raise argparse.ArgumentTypeError(
                f"range '{part.strip()}': its end cannot be negative (llama-bench reads a sign only on a "
                f"range's first number and refuses this as an invalid range format); list the values "
                f"instead, e.g. -3,-2")
        last = int(m.group(2))
        op, step = m.group(3) or "+", int(m.group(4)) if m.group(4) is not None else 1
        p = part.strip()
        if op == "*":
            if step < 2 or first < 1:
                raise argparse.ArgumentTypeError(
                    f"range '{p}': a start >= 1 and a multiplier >= 2 are needed with '*' (got start {first}, "
                    f"multiplier {step}), as in 128-2048*2")
            got, v = [], first
            while v <= last:
                got.append(v)
                v *= step
        else:
            if step < 1:
                raise argparse.ArgumentTypeError(f"range '{p}': the step after '+' must be >= 1, got {step}")
            if len(range(first, last + 1, step)) + len(out) > LIST_VALUES_MAX:
                raise argparse.ArgumentTypeError(f"range '{p}' yields {len(range(first, last + 1, step))} values, "
                                                 f"more than the limit of {LIST_VALUES_MAX}")
            got = list(range(first, last + 1, step))
        if not got:
            raise argparse.ArgumentTypeError(f"range '{p}' yields no value (its end lies below its start)")
        out.extend(got)
        if len(out) > LIST_VALUES_MAX:
            raise argparse.ArgumentTypeError(f"'{text}' gives more than the limit of {LIST_VALUES_MAX} values")
    return tuple(out)


def _signed_int_list(text: str) -> tuple[int, ...]:
    return int_list(text, allow_negative=True)


def _choice_list(choices: Sequence[str], what: str):
    def parse(text: str) -> tuple[str, ...]:
        out = []
        for v in text.split(","):
            if v not in choices:
                raise argparse.ArgumentTypeError(f"unknown {what} '{v}' (use {', '.join(choices)})")
            out.append(v)
        return tuple(out)
    parse.__name__ = what.replace(" ", "_")
    return parse


#: ``common_arg_utils::is_truthy`` / ``is_falsey`` / ``is_autoy``
_TRUTHY, _FALSEY, _AUTOY = ("on", "enabled", "true", "1"), ("off", "disabled", "false", "0"), ("auto", "-1")


def _flash_attn_list(text: str) -> tuple[int, ...]:
    """``-fa on|off|auto`` (or 1/0/-1, true/false, enabled/disabled) as llama-bench prints it:
    ``llama_flash_attn_type`` 1, 0, -1."""
    out = []
    for v in text.split(","):
        if v in _TRUTHY:
            out.append(1)
        elif v in _FALSEY:
            out.append(0)
        elif v in _AUTOY:
            out.append(-1)
        else:
            raise argparse.ArgumentTypeError(f"expected on, off or auto (or 1, 0, -1), got '{v}'")
    return tuple(out)


def _bool_list(text: str) -> tuple[bool, ...]:
    out = []
    for v in text.split(","):
        if v in _TRUTHY:
            out.append(True)
        elif v in _FALSEY:
            out.append(False)
        else:
            raise argparse.ArgumentTypeError(f"expected 0 or 1, got '{v}'")
    return tuple(out)


def _pg_pair(text: str) -> tuple[tuple[int, int], ...]:
    """``-pg pp,tg``: exactly two integers >= 0 (llama-bench takes one pair per flag)."""
    parts = text.split(",")
    if len(parts) != 2 or not all(_digits(p) for p in parts):
        raise argparse.ArgumentTypeError(f"expected two integers pp,tg such as 512,128, got '{text}'")
    return ((int(parts[0]), int(parts[1])),)


#: ``llama_lazy_mode`` names (``lazy_mode_str``)
LAZY_MODES = ("on", "auto", "off")


def _device_list(text: str) -> tuple[str, ...]:
    """``-dev``: one device set per comma-separated item (``parse_devices_arg``): ``auto``,
    ``none`` or device names joined by ``/`` (each stripped, matched to the profile's later,
    :func:`check_devices`)."""
    out = []
    for combo in text.split(","):
        trimmed = combo.strip()
        if not trimmed:
            raise argparse.ArgumentTypeError(f"no devices specified in '{text}'")
        if trimmed == "auto":
            out.append("auto")
            continue
        names = [n.strip() for n in trimmed.split("/")]
        if len(names) == 1 and names[0] == "none":
            out.append("none")
            continue
        if any(not n for n in names):
            raise argparse.ArgumentTypeError(f"invalid device specification '{trimmed}' (an empty device name)")
        out.append("/".join(names))
    return tuple(out)


def _cpu_mask_list(text: str) -> tuple[str, ...]:
    """``-C``: one hex CPU mask per comma-separated item, as given (``parse_cpu_mask``: an optional
    ``0x``, then hex digits, of which it reads the first 128)."""
    out = []
    for mask in text.split(","):
        digits = mask[2:] if mask.startswith("0x") else mask
        bad = next((c for c in digits[:128] if c not in "0123456789abcdefABCDEF"), None)
        if bad is not None:
            raise argparse.ArgumentTypeError(f"invalid hex character '{bad}' in CPU mask '{mask}' (llama-bench: "
                                             "failed to parse cpu-mask)")
        out.append(mask)
    return tuple(out)


def _c_int(text: str) -> int:
    """An integer as ``std::stoi`` reads it (leading blanks, a sign, digits; what follows is
    ignored), a C int."""
    from sim.bounds import INT32_MAX

    m = re.match(r"\s*[+-]?\d+", text, re.ASCII)
    if not m:
        raise argparse.ArgumentTypeError(f"expected an integer, got '{text}'")
    v = int(m.group(0))
    if abs(v) > INT32_MAX:
        raise argparse.ArgumentTypeError(f"'{text}' is out of range of a C int")
    return v


#: ``--numa``'s values (``""``: distribute)
NUMA_MODES = ("distribute", "isolate", "numactl", "")
#: ``-o``/``-oe`` values of llama-bench (``output_format_from_str``)
#: how the rows of ``prefetch-sim run`` begin their ``cpu_info`` (a reader tells them from
#: llama-bench's own measurements by it: ``calibrate.llamacpp.compare`` warns)
SIMULATED_CPU_INFO = "simulated host"

OUTPUT_FORMATS = tuple(sorted(FORMATS)) + ("none",)


def _numa(text: str) -> str:
    if text not in NUMA_MODES:
        raise argparse.ArgumentTypeError(f"unknown numa mode '{text}' (use distribute, isolate or numactl)")
    return text


def _output_format(text: str) -> str:
    if text not in OUTPUT_FORMATS:
        raise argparse.ArgumentTypeError(f"unknown output format '{text}' (use {', '.join(OUTPUT_FORMATS)})")
    return text


#: ``llama_max_devices()``: the most ``-ts`` shares llama-bench takes (it asserts no more)
MAX_DEVICES = 16
#: the largest finite and the smallest normal C ``float`` (``FLT_MAX``, ``FLT_MIN``)
FLT_MAX, FLT_MIN = 3.4028234663852886e38, 1.1754943508222875e-38


def _tensor_split_list(text: str) -> tuple[tuple[float, ...], ...]:
    """``-ts 3/1`` (or ``3;1``): one split per comma-separated item, shares split at ``/`` or ``;``:
    at most :data:`MAX_DEVICES` shares (llama-bench asserts it), each a C ``float`` (llama-bench's
    ``std::stof`` throws on a value out of its range)."""
    import numpy as np

    out = []
    for item in text.split(","):
        shares = []
        parts = re.split(r"[;/]+", item)
        if len(parts) > MAX_DEVICES:
            raise argparse.ArgumentTypeError(f"'{item}' gives {len(parts)} shares, more than llama.cpp's "
                                             f"{MAX_DEVICES} devices (llama_max_devices)")
        for s in parts:
            try:
                x = float(s)
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected shares like 3/1, got '{item}'") from None
            if not math.isfinite(x) or x < 0:
                raise argparse.ArgumentTypeError(f"shares must be finite and >= 0, got '{item}'")
            with np.errstate(over="ignore", under="ignore"):
                f32 = float(np.float32(x))
            if math.isinf(f32) or (x and abs(f32) < FLT_MIN):
                raise argparse.ArgumentTypeError(f"share '{s.strip()}' does not fit a C float (at most {FLT_MAX:g}, and 0 "
                                                 f"or at least {FLT_MIN:g}): llama-bench's std::stof refuses it")
            shares.append(x)
        out.append(tuple(shares))
    return tuple(out)


Rule = tuple[str, str]


def _rule(text: str, flag: str) -> Rule:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"rule '{text}' has no '=BUFFER' (expected pattern=BUFFER, e.g. "
                                         "'exps=CPU')")
    pattern, buf = text.split("=", 1)
    if not pattern or not buf:
        raise argparse.ArgumentTypeError(f"rule '{text}': empty pattern or buffer (expected pattern=BUFFER)")
    return pattern, buf


class OtSets(tuple):
    """The sets of one ``-ot`` value (a tuple of rule tuples), with its text and the rules
    llama-bench's parser skips (:attr:`ignored`: ``(set, the text skipped)``), for the notes of
    :func:`ot_notes`."""

    text: str = ""
    ignored: tuple[tuple[str, str], ...] = ()


def _ot_sets(text: str) -> OtSets:
    """llama-bench's ``-ot`` (``parse_cmd_params``): sets separated by ``,``, rules within a set
    by ``;``. As there, an empty set is a test without overrides (printed ``none``): ``''`` is
    one such set, and every empty item of the comma list is one more (``a=CPU,`` is two sets,
    ``a=CPU`` and ``none``; ``a=CPU,,b=CPU`` three). A set's rules are read up to its first empty
    rule (``a=CPU;;b=CPU`` and ``;b=CPU`` stop there: ``b=CPU`` is skipped, as llama-bench skips
    it; :func:`ot_notes` says so). A rule without ``=``, or with an empty pattern or buffer, is an
    error (llama-bench refuses the first and the last).
    """
    out, ignored = [], []
    for group in text.split(","):
        rules = group.split(";")
        upto = next((i for i, r in enumerate(rules) if not r), len(rules))
        rest = ";".join(rules[upto:])
        if rest.strip(";"):
            ignored.append((group, rest.strip(";")))
        out.append(tuple(_rule(r, "-ot") for r in rules[:upto]))
    sets = OtSets(out)
    sets.text, sets.ignored = text, tuple(ignored)
    return sets


def ot_notes(args: argparse.Namespace) -> list[str]:
    """One note per ``-ot`` value with a leading or trailing ``,`` (``exps=CPU,``: a second test,
    without overrides, as in llama-bench) and per set whose rules llama-bench stops reading at an
    empty rule."""
    out = []
    for value in getattr(args, "overrides", None) or ():
        if len(value) > 1 and (value.text.startswith(",") or value.text.endswith(",")):
            out.append(f"-ot '{value.text}': the empty item before or after a ',' is one more test, without "
                       "overrides (tensor_buft_overrides none), as llama-bench runs it")
        for group, rest in getattr(value, "ignored", ()):
            line = (f"-ot '{group}': llama-bench stops reading a set at an empty rule (';;' or a leading ';'): "
                    f"'{rest}' ignored, as llama-bench ignores it")
            if line not in out:
                out.append(line)
    return out


def _ot_cli(text: str) -> tuple[Rule, ...]:
    """llama-cli's ``-ot``: rules separated by ``,``."""
    return tuple(_rule(r, "--override-tensor-cli") for r in text.split(",") if r)


def _str_list(text: str) -> tuple[str, ...]:
    out = tuple(x for x in text.split(","))
    if any(not x.strip() for x in out):
        raise argparse.ArgumentTypeError(f"empty name in '{text}'")
    return out


def variant_names(text: str) -> list[str]:
    """``--variant``'s value: a comma list of variant names (``baseline,slots3``), as llama-bench
    takes its list flags; each name is checked later (:func:`sim.model.specs.parse_variant`, naming
    ``--variant``). With ``action="extend"`` a repeated flag adds its names.

    Raises:
        argparse.ArgumentTypeError: an empty name (``a,,b``, a trailing ``,``, ``''``).
    """
    out = [x.strip() for x in text.split(",")]
    if any(not x for x in out):
        raise argparse.ArgumentTypeError(f"empty variant name in '{text}' (expected names separated by ',', "
                                         "e.g. baseline,slots3)")
    return out


def _nonneg_list(text: str) -> tuple[int, ...]:
    out = []
    for v in text.split(","):
        if not _digits(v):
            raise argparse.ArgumentTypeError(f"expected integers >= 0, got '{text}'")
        out.append(int(v))
    return tuple(out)


SPLIT_MODES = ("none", "layer", "row", "tensor")
#: ``llama_load_mode_name`` values
LOAD_MODES = ("auto", "none", "mmap", "mlock", "mmap+mlock", "dio")

#: (dest, option strings, type, metavar, help) of the list-valued llama-bench flags
_LIST_FLAGS: tuple[tuple[str, tuple[str, ...], Any, str, str], ...] = (
    ("model", ("-m", "--model"), _str_list, "FILE",
     "model file(s): a model TOML or a GGUF (replaces the scenario's model; the rest of the scenario stays)"),
    ("n_prompt", ("-p", "--n-prompt"), int_list, "N", "prompt lengths, e.g. 512,2048 (pp tests)"),
    ("n_gen", ("-n", "--n-gen"), int_list, "N", "generation lengths, e.g. 128 (tg tests)"),
    ("n_pg", ("-pg",), _pg_pair, "PP,TG", "a prompt then a generation in one test (pp512+tg128); repeatable"),
    ("n_depth", ("-d", "--n-depth"), int_list, "N",
     "KV depths, e.g. 0,8192 (as llama-bench, the KV cache is sized to depth + tokens when the scenario's "
     "ctx_size is smaller)"),
    ("n_batch", ("-b", "--batch-size"), int_list, "N", "logical batch size"),
    ("n_ubatch", ("-ub", "--ubatch-size"), int_list, "N", "physical batch size"),
    ("type_k", ("-ctk", "--cache-type-k"), _choice_list(KV_TYPES, "KV cache type"), "TYPE",
     f"K cache type ({', '.join(KV_TYPES)}): its bytes per element size the KV cache"),
    ("type_v", ("-ctv", "--cache-type-v"), _choice_list(KV_TYPES, "KV cache type"), "TYPE", "V cache type"),
    ("n_threads", ("-t", "--threads"), int_list, "N", "CPU threads (reported; not modelled: the profile's host "
                                                       "figures price CPU ops; default the profile's host_cpus; "
                                                       "another count is refused where weights are on the host)"),
    ("n_gpu_layers", ("-ngl", "--n-gpu-layers"), _signed_int_list, "N", "layers on the GPU (any negative value, as llama-bench's default -1, or >= layers + 1: all)"),
    ("n_cpu_moe", ("-ncmoe", "--n-cpu-moe"), int_list, "N", "keep the experts of the first N blocks on the host"),
    ("split_mode", ("-sm", "--split-mode"), _choice_list(SPLIT_MODES, "split mode"), "MODE",
     "none (one GPU, -mg), layer (blocks split over GPUs); row/tensor: as layer on one GPU, not modelled over "
     "several (refused, or left out with --skip-unmodelled)"),
    ("main_gpu", ("-mg", "--main-gpu"), int_list, "I", "the GPU of -sm none"),
    ("no_kv_offload", ("-nkvo", "--no-kv-offload"), _bool_list, "0|1", "KV cache on the host (1 is not modelled: refused, or left out with --skip-unmodelled)"),
    ("flash_attn", ("-fa", "--flash-attn"), _flash_attn_list, "on|off|auto",
     "FlashAttention or the unfused attention: priced apart by a profile with llama.cpp kernel tables (h200-llamacpp), one attention cost otherwise"),
    ("load_mode", ("-lm", "--load-mode"), _choice_list(LOAD_MODES, "load mode"), "MODE",
     "auto/mmap/mmap+mlock: host weights stay in the mmap'd file (pageable); none/mlock/dio: read into "
     "pinned host buffers"),
    ("mmap", ("-mmp", "--mmap"), _bool_list, "0|1",
     "older llama-bench: 1 = -lm mmap (pageable), 0 = -lm none (pinned)"),
    ("embeddings", ("-embd", "--embeddings"), _bool_list, "0|1", "embeddings (1 is not modelled: refused, or left out with --skip-unmodelled)"),
    ("tensor_split", ("-ts", "--tensor-split"), _tensor_split_list, "TS0/TS1/...",
     "share of the layers per GPU, e.g. 3/1"),
    ("overrides", ("-ot", "--override-tensor"), _ot_sets, "PATTERN=BUFFER;...",
     "tensor buffer overrides: rules 'pattern=BUFFER' separated by ';', sets by ',' (each set a test); "
     "BUFFER, exactly as llama-bench spells it: CPU, CUDA0.. (ROCm0..)"),
    ("overrides_cli", ("--override-tensor-cli",), _ot_cli, "PATTERN=BUFFER,...",
     "llama-cli's -ot syntax (rules separated by ','); every rule given this way forms one set"),
    ("no_op_offload", ("-nopo", "--no-op-offload"), _bool_list, "0|1",
     "never move an op with host weights to the GPU"),
    ("no_host", ("--no-host",), _bool_list, "0|1",
     "host weights in plain (pageable) memory, not the GPU's host buffer"),
    ("lazy_mode", ("-lzm", "--lazy-mode"), _choice_list(LAZY_MODES, "lazy mode"), "on|auto|off",
     "llama.cpp's lazy tensor loading (printed in the rows; not modelled)"),
    ("devices", ("-dev", "--device"), _device_list, "DEV0/DEV1/...",
     "devices to use, e.g. CUDA0 or CUDA0/CUDA1, or auto (printed in the rows; not modelled: the profile's GPUs "
     "are simulated; none, CPU only, is refused)"),
    ("repack", ("--repack",), _bool_list, "0|1", "CPU weight repacking (printed in the rows; not modelled)"),
    ("cpu_mask", ("-C", "--cpu-mask"), _cpu_mask_list, "HEX",
     "CPU affinity mask of the thread pool (printed in the rows; not modelled)"),
    ("cpu_strict", ("--cpu-strict",), _bool_list, "0|1", "strict CPU placement (printed in the rows; not modelled)"),
    ("poll", ("--poll",), int_list, "0...100", "thread pool polling level (printed in the rows; not modelled)"),
    ("fit_target", ("-fitt", "--fit-target"), _nonneg_list, "MiB",
     "fit the model to VRAM with this margin per GPU (MiB): the fewest host expert layers that fit. As in "
     "llama-bench, any -fitt or -fitc other than 0 runs the fit, which replaces -ngl, -ncmoe, -ot and -ts (the "
     "row still prints the values given; --vram shows the placement simulated)"),
    ("fit_min_ctx", ("-fitc", "--fit-ctx"), _nonneg_list, "N",
     "minimum context of the fit (llama-bench: a value other than 0 runs the fit, as -fitt does; the context "
     "simulated is each test's depth + tokens)"),
)


#: llama-bench flags that set up the benchmark harness, not what is run: accepted (a copied
#: llama-bench command line works) and noted as not modelled, but ``--no-warmup`` (it drops the
#: warm-up run an expert cache keeps: :attr:`BenchParams.warmup`). (flags, takes a value)
HARNESS_FLAGS: tuple[tuple[tuple[str, ...], bool], ...] = (
    (("-v", "--verbose"), False), (("--progress",), False), (("--no-warmup",), False),
    (("--delay",), True), (("--prio",), True), (("--numa",), True), (("-oe", "--output-err"), True),
    (("-rpc", "--rpc"), True),
)
#: the value check of a harness flag that takes one, as llama-bench's: ``std::stoi`` for
#: ``--delay``/``--prio`` (any C int: ``--prio 99`` runs, at normal priority), ``--numa``'s and
#: ``-oe``'s names
HARNESS_TYPES = {"--delay": _c_int, "--prio": _c_int, "--numa": _numa, "--output-err": _output_format}
#: the llama-bench flags the rows print (:data:`_LIST_FLAGS`) that set up the harness or the
#: loader, not what the simulator runs: printed as given, noted as not modelled
#: (:func:`harness_notes`)
UNMODELLED_ROW_FLAGS = ("lazy_mode", "devices", "repack", "cpu_mask", "cpu_strict", "poll")


#: the project's prefetch patch's llama-bench flags (:mod:`calibrate.llamacpp.prefetch_patch`):
#: (dest, option strings, metavar, help). As the patched llama-bench, every test runs once per
#: combination of their values (:func:`prefetch_combos`), each combination a row.
PREFETCH_FLAGS: tuple[tuple[str, tuple[str, ...], str, str], ...] = (
    ("prefetch_weights", ("-pw", "--prefetch-weights"), "0|1",
     "prefetch patch: 1 = weight prefetch one split ahead, gated by -pwg (default 512: variant "
     "prefetch_gated_512; -pwg 0: ungated, variant prefetch_ungated)"),
    ("prefetch_gate", ("-pwg", "--prefetch-gate"), "N",
     "prefetch patch: with -pw 1, no prefetch in a graph with MoE ops (MUL_MAT_ID) whose ubatch has fewer than "
     "N tokens; a graph without them (a dense model, decode included) is prefetched at any batch (default 512; "
     "0 = ungated); with -pw 0 it changes nothing (the rows print it)"),
    ("prefetch_expert_slots", ("-pes", "--prefetch-experts-slots"), "N",
     "prefetch patch: N rotating expert staging slots (variant slots<N>; default 0 = off; not simulated "
     "together with -pw 1)"),
)


@dataclass(frozen=True)
class PrefetchCombo:
    """One combination of ``-pw``/``-pwg``/``-pes``: the values a row prints and the simulator
    variant that runs it (:func:`sim.views.llamabench.prefetch_variant`; None: not modelled)."""

    prefetch_weights: int
    prefetch_gate: int
    prefetch_expert_slots: int
    variant: str | None

    @property
    def fields(self) -> dict[str, int]:
        """The row's fields (:data:`sim.views.llamabench.PATCH_FIELDS`)."""
        return {"prefetch_weights": self.prefetch_weights, "prefetch_gate": self.prefetch_gate,
                "prefetch_expert_slots": self.prefetch_expert_slots}

    @property
    def flags(self) -> str:
        """The combination as llama-bench flags (``-pw 1 -pwg 0 -pes 0``)."""
        return f"-pw {self.prefetch_weights} -pwg {self.prefetch_gate} -pes {self.prefetch_expert_slots}"


def prefetch_combos(args: argparse.Namespace) -> tuple[PrefetchCombo, ...] | None:
    """Every combination of ``-pw``/``-pwg``/``-pes`` (lists; a repeated flag adds values), or
    None when none is given: their full product in the patched llama-bench's order (``-pw``
    outermost, then ``-pwg``, then ``-pes``; an absent flag takes its default), duplicates
    included, as llama-bench runs and prints them. Combinations that name the same variant
    (``-pw 0`` with any ``-pwg``) share one simulation; a combination the simulator does not
    model (``-pw 1`` with ``-pes N > 0``) has ``variant`` None.

    Raises:
        ScenarioError: ``-pw`` other than 0/1.
    """
    from sim.views.llamabench import PREFETCH_DEFAULTS, prefetch_variant

    lists = {dest: _flat(args, dest) for dest, *_ in PREFETCH_FLAGS}
    if all(v is None for v in lists.values()):
        return None
    bad = [v for v in lists["prefetch_weights"] or () if v not in (0, 1)]
    if bad:
        raise ScenarioError(f"must be 0 or 1, got {bad[0]}", field="-pw/--prefetch-weights")
    out = []
    for pw, pwg, pes in itertools.product(*(lists[d] or (PREFETCH_DEFAULTS[d],) for d, *_ in PREFETCH_FLAGS)):
        try:
            name: str | None = prefetch_variant(pw, pwg, pes)
        except ValueError:
            name = None
        out.append(PrefetchCombo(pw, pwg, pes, name))
    return tuple(out)


def prefetch_flag_variants(args: argparse.Namespace) -> tuple | None:
    """The distinct simulator variants of ``-pw``/``-pwg``/``-pes`` (:func:`prefetch_combos`), in
    order of first use, or None when none is given. ``--skip-unmodelled`` leaves out the
    combinations the simulator does not model (their rows are not printed; noted by the caller,
    :func:`unmodelled_notes`).

    Raises:
        ScenarioError: ``-pw`` other than 0/1; a combination that is not modelled (``-pw 1``
            with ``-pes N > 0``) without ``--skip-unmodelled``; none left to simulate.
    """
    from sim.model.specs import parse_variant

    combos = prefetch_combos(args)
    if combos is None:
        return None
    off = [c for c in combos if c.variant is None]
    if off and not getattr(args, "skip_unmodelled", False):
        c = off[0]
        n = c.prefetch_expert_slots
        raise ScenarioError(f"{c.flags}: with -pw 1 the patch's -pes {n} stages every host weight in max(2, {n}) "
                            "slots, which the simulator does not model, so it has no row to print for it (--variant "
                            f"prefetch_ungated+slots{n} is another design: weights in two slots, experts in {n} of "
                            "their own); drop one of the two, or give --skip-unmodelled to leave those rows out",
                            field="-pw/-pes")
    names = list(dict.fromkeys(c.variant for c in combos if c.variant is not None))
    if not names:
        raise ScenarioError("no combination of -pw/-pwg/-pes the simulator models (-pw 1 with -pes > 0 is not "
                            "modelled)", field="-pw/-pes")
    return tuple(parse_variant(n, field_name="-pw/-pwg/-pes") for n in names)


def unmodelled_setting(setting, hw) -> tuple[str, str] | None:
    """``(flag, reason)`` when ``setting`` runs llama.cpp in a way the simulator does not model
    and whose speed it would change, else None: FlashAttention on an iq4_nl K/V cache (``-ctk``/
    ``-ctv iq4_nl``: no ggml-cuda kernel, the attention runs on the CPU), the KV cache on the
    host (``-nkvo 1``: every layer's attention on the CPU), a row or tensor split over several
    GPUs (``-sm row|tensor``: each matmul split across the GPUs), embeddings output (``-embd 1``:
    no output head, pooling).
    Such a row would print the numbers of another configuration under its values; ``run``
    refuses it unless ``--skip-unmodelled`` leaves it out."""
    from sim.views.llamabench import UNMODELLED, unmodelled_kind

    kind = unmodelled_kind(setting, hw.n_gpu)
    if kind is None:
        return None
    flag, what = UNMODELLED[kind]
    if kind == "fa_kv_type":
        return flag, f"{what}; not modelled (-fa 0, or another K/V type, is)"
    if kind == "split_mode":
        return flag, f"-sm {setting.split_mode} over {hw.n_gpu} GPUs is not modelled (-sm layer and none are)"
    return flag, f"{flag.split('/')[0]} 1 ({what}) is not modelled"


def setting_unmodelled(setting, model, hw) -> tuple[str, str] | None:
    """:func:`unmodelled_setting`, and llama-bench's ``-fitt``/``-fitc`` fit of a dense model
    (it lowers ``-ngl`` until the target is free: another placement than the row prints; only the
    ``n_cpu_moe`` fit is modelled): ``(flag, reason)`` or None. The one rule of ``run`` (which
    leaves such a setting out with ``--skip-unmodelled``) and of the commands that simulate one
    setting (``trace``, ``breakdown``, ``check``: refused)."""
    why = unmodelled_setting(setting, hw)
    if why is None and (setting.fit_target or setting.fit_min_ctx) and model.moe is None:
        why = ("-fitt/--fit-target", f"-fitt/-fitc on a dense model ('{model.name}'): llama-bench's fit lowers "
                                     "-ngl until the target is free, which is not modelled (-ngl as given, "
                                     "without -fitt, is)")
    return why


def threads_unmodelled(n_threads: int, model, placement, hardware) -> str | None:
    """Why ``-t n_threads`` cannot be simulated for ``model`` under ``placement`` on ``hardware``,
    else None (the one rule of ``run`` and ``compare``): the profile records the
    thread count its CPU figures were measured with (``[measured] host_cpus``), ``n_threads``
    differs, and the placement keeps weights other than the token embedding on the host (their
    matmuls run on the CPU in decode and in ubatches under the op-offload batch, at a speed the
    thread count changes and the profile does not rescale). A fully resident setting's CPU does
    no weight's work (its one-thread ``GET_ROWS`` and the host's graph work do not use the pool),
    so its ``-t`` is only printed."""
    from sim.model.vram import host_flags

    raw = (getattr(hardware, "measured", None) or {}).get("host_cpus")
    try:
        measured = int(str(raw))
    except (TypeError, ValueError):
        return None
    if measured <= 0 or n_threads == measured:
        return None
    flags = host_flags(model, placement)
    if not any(f for t, f in zip(model.tensors, flags) if not t.name.startswith("token_embd.")):
        return None
    return (f"-t {n_threads} with weights on the host: the profile's CPU figures were measured with "
            f"{measured} threads and are not rescaled")


def unmodelled_notes(args: argparse.Namespace) -> list[str]:
    """One note per combination of ``-pw``/``-pwg``/``-pes`` left out by ``--skip-unmodelled``."""
    out: list[str] = []
    for c in prefetch_combos(args) or ():
        if c.variant is None and getattr(args, "skip_unmodelled", False):
            line = f"{c.flags}: left out (--skip-unmodelled): the simulator does not model -pw 1 with -pes N > 0"
            if line not in out:
                out.append(line)
    return out


def device_list(hw) -> str:
    """llama-bench's ``--list-devices`` (``common_print_available_devices``) for a profile's GPUs:
    ``  CUDA0: NVIDIA H200 (143358 MiB, 142830 MiB free)`` per GPU, free as the profile's VRAM less
    its reserved part (what a process sees after creating its CUDA context)."""
    mib = 2 ** 20
    lines = ["Available devices:"]
    for i in range(hw.n_gpu):
        lines.append(f"  {hardware_backend(hw)}{i}: {hw.gpu_name} ({int(hw.vram_bytes // mib)} MiB, "
                     f"{int((hw.vram_bytes - hw.vram_reserved_bytes) // mib)} MiB free)")
    return "\n".join(lines)


def harness_notes(args: argparse.Namespace) -> list[str]:
    """One note per harness-only flag given (:data:`HARNESS_FLAGS`) and per flag of
    :data:`UNMODELLED_ROW_FLAGS` given (its rows print its values)."""
    out = []
    for opts, _ in HARNESS_FLAGS:
        v = getattr(args, "harness_" + opts[-1].lstrip("-").replace("-", "_"), None)
        if v not in (None, False) and opts[0] == "-rpc":
            out.append("-rpc: RPC devices are not modelled (the profile's GPUs only)")
        elif v not in (None, False) and opts[0] != "--no-warmup":  # modelled: BenchParams.warmup
            out.append(f"{opts[0]}: accepted, not modelled (a llama-bench harness setting)")
    for dest, opts, *_ in _LIST_FLAGS:
        if dest in UNMODELLED_ROW_FLAGS and getattr(args, dest, None) is not None:
            out.append(f"{opts[0]}: accepted, not modelled (the rows print its values, as llama-bench's)")
    return out


@functools.cache
def llama_bench_long_flags() -> frozenset[str]:
    """The long spellings of llama-bench's own flags (``--n-gpu-layers``, ``--repetitions``, the
    prefetch patch's ``--prefetch-weights`` ...): llama-bench reads each with its value as the next
    word and refuses ``--n-gpu-layers=99`` (``invalid parameter``), so the CLI does as well
    (:class:`sim.cli.Parser`); the simulator's own long flags (``--out``,
    ``--variant``) keep argparse's ``--flag=value``."""
    longs = [o for _d, opts, *_ in _LIST_FLAGS for o in opts] + [o for _d, opts, *_ in PREFETCH_FLAGS for o in opts]
    longs += [o for opts, _v in HARNESS_FLAGS for o in opts] + ["--repetitions"]
    return frozenset(o for o in longs if o.startswith("--"))


def add_bench_flags(p: argparse.ArgumentParser) -> None:
    """llama-bench's flags (lists and ranges; a repeated flag adds values), the prefetch patch's
    ``-pw``/``-pwg``/``-pes`` (:data:`PREFETCH_FLAGS`), the scenario, and
    ``--variant``/``--engine``/``--max-work``."""
    from sim.bounds import EXPANDED_WORK_MAX, MEMO_WORK_DIVISOR, REPETITIONS_MAX, WORK_MAX

    p.add_argument("scenario", nargs="?", help="scenario TOML (default: scenarios/default.toml)")
    for dest, opts, typ, metavar, help_ in _LIST_FLAGS:
        p.add_argument(*opts, dest=dest, type=typ, action="append", metavar=metavar, help=help_)
    for dest, opts, metavar, help_ in PREFETCH_FLAGS:
        p.add_argument(*opts, dest=dest, type=int_list, action="append", metavar=metavar, help=help_)
    for opts, takes_value in HARNESS_FLAGS:
        dest = "harness_" + opts[-1].lstrip("-").replace("-", "_")
        if takes_value:
            p.add_argument(*opts, dest=dest, metavar="X", type=HARNESS_TYPES.get(opts[-1]),
                           help="llama-bench harness setting: accepted, not modelled")
        else:
            p.add_argument(*opts, dest=dest, action="store_true",
                           help=("skip llama-bench's untimed warm-up run before each test (modelled: an expert "
                                 "cache then starts cold)" if opts[0] == "--no-warmup"
                                 else "llama-bench harness setting: accepted, not modelled"))
    p.add_argument("--list-devices", dest="list_devices", action="store_true",
                   help="list the profile's devices as llama-bench lists a machine's (name, description, MiB "
                        "total and free) and exit")
    p.add_argument("-r", "--repetitions", dest="repetitions", type=ascii_int,
                   help=f"repetitions per test (1 to {REPETITIONS_MAX}, as the TOML's repetitions)")
    p.add_argument("--max-work", dest="max_work", type=ascii_int, default=None, metavar="N",
                   help=f"refuse a run that would cost more than N graph-layers of work (graphs x layers x "
                        f"repetitions x settings, x1 per variant with an expert cache (x2 its prompt graphs), x1/{MEMO_WORK_DIVISOR} per "
                        f"other variant; default {WORK_MAX:,}, about half a minute; trace and check keep every op: "
                        f"x1 per variant, default {EXPANDED_WORK_MAX:,}, about 2 GB)")
    p.add_argument("--ctx-size", dest="ctx_size", type=ascii_int, default=None, metavar="N",
                   help="the context the KV cache is sized to, in tokens, in place of the scenario's "
                        "placement.ctx_size (a server's context: a what-if); 0: llama-bench's own, the tests' "
                        "n_prompt + n_gen + n_depth, each test its own (N below a test's tokens: raised to them, as "
                        "llama-bench sizes n_ctx)")
    p.add_argument("--variant", action="extend", type=variant_names, metavar="V[,V...]",
                   help="variants to run, a comma list (repeatable: a repeated flag adds, as llama-bench's list "
                        "flags): baseline, prefetch_ungated, prefetch_gated_<N>, slots<N>, cache_lru, cache_lfu, "
                        "cache_fit, baseline_without_selective_copy, or a+b (e.g. slots3+cache_lru); run adds "
                        "baseline when it is not listed (vs_base compares against it)")
    p.add_argument("--skip-unmodelled", dest="skip_unmodelled", action="store_true",
                   help="leave out, with a note, the settings the simulator does not model instead of refusing "
                        "the run (their rows are not printed): -pw 1 with -pes N > 0, -nkvo 1, -sm row/tensor "
                        "over several GPUs, -embd 1")
    p.add_argument("--engine", choices=("analytic", "des"), default="analytic",
                   help="analytic: max-plus recurrence (default); des: SimPy discrete-event model "
                        "(same results, slower)")


def _flat(args: argparse.Namespace, dest: str) -> list | None:
    v = getattr(args, dest, None)
    if v is None:
        return None
    return [x for item in v for x in item]


# --------------------------------------------------------------------------------------
# parameters, settings, instances
# --------------------------------------------------------------------------------------


def default_threads(hw=None) -> int:
    """``-t``'s default: llama-bench's on the machine simulated, its math cores. The host CPU
    count a calibrated profile records (``[measured] host_cpus``: the machine whose CPU figures
    price the CPU ops, measured with all its threads) when ``hw`` has one, else this machine's
    CPUs."""
    raw = (getattr(hw, "measured", None) or {}).get("host_cpus") if hw is not None else None
    try:
        n = int(str(raw))
    except (TypeError, ValueError):
        n = 0
    return n if n > 0 else (os.cpu_count() or 1)


#: kinds of tests (llama-bench's order within one setting: prompts, generations, pairs)
PP, TG, PG = "pp", "tg", "pg"


@dataclass(frozen=True)
class Setting:
    """One combination of llama-bench's parameters (all but the test), as printed."""

    model: str | None          # -m as given; None: the scenario's model
    fit_target: int
    fit_min_ctx: int
    n_gpu_layers: int
    n_cpu_moe: int
    split_mode: str
    load_mode: str
    main_gpu: int
    tensor_split: tuple[float, ...]
    overrides: tuple[Rule, ...]
    no_host: bool
    embeddings: bool
    no_op_offload: bool
    n_batch: int
    n_ubatch: int
    type_k: str
    type_v: str
    no_kv_offload: bool
    flash_attn: int
    n_threads: int
    # printed, not modelled (UNMODELLED_ROW_FLAGS); poll is the Instance's
    lazy_mode: str = "auto"
    devices: str = "auto"
    repack: bool = True
    cpu_mask: str = "0x0"
    cpu_strict: bool = False

    def simulated(self) -> "Setting":
        """This setting with the fields the simulator does not model (:data:`UNMODELLED_ROW_FLAGS`)
        at their defaults: settings that differ only there simulate alike (one simulation)."""
        return replace(self, lazy_mode="auto", devices="auto", repack=True, cpu_mask="0x0", cpu_strict=False)


@dataclass(frozen=True)
class Instance:
    """One llama-bench test: a setting, ``n_prompt``/``n_gen``/``n_depth`` and ``--poll`` (which
    llama-bench loops over inside the depths: printed, not modelled)."""

    setting: Setting
    n_prompt: int
    n_gen: int
    n_depth: int
    poll: int = 50

    @property
    def kind(self) -> str:
        return PP if not self.n_gen else TG if not self.n_prompt else PG

    @property
    def tests(self):
        """The simulator tests of this test (:class:`sim.model.specs.BenchTest`): one, or for pp+tg the
        prompt at the depth then the generation at depth + prompt (one context, as llama-bench)."""
        from sim.model.specs import BenchTest

        if self.kind == PP:
            return (BenchTest(self.n_prompt, 0, self.n_depth),)
        if self.kind == TG:
            return (BenchTest(0, self.n_gen, self.n_depth),)
        return (BenchTest(self.n_prompt, 0, self.n_depth), BenchTest(0, self.n_gen, self.n_depth + self.n_prompt))


#: Setting field -> the flag that sets it (for messages)
FLAG_OF = {"model": "-m", "fit_target": "-fitt", "fit_min_ctx": "-fitc", "n_gpu_layers": "-ngl",
           "n_cpu_moe": "-ncmoe", "split_mode": "-sm", "load_mode": "-lm", "main_gpu": "-mg",
           "tensor_split": "-ts", "overrides": "-ot", "no_host": "--no-host", "embeddings": "-embd",
           "no_op_offload": "-nopo", "n_batch": "-b", "n_ubatch": "-ub", "type_k": "-ctk", "type_v": "-ctv",
           "no_kv_offload": "-nkvo", "flash_attn": "-fa", "n_threads": "-t", "n_depth": "-d",
           "n_prompt": "-p", "n_gen": "-n", "n_pg": "-pg", "lazy_mode": "-lzm", "devices": "-dev",
           "repack": "--repack", "cpu_mask": "-C", "cpu_strict": "--cpu-strict", "poll": "--poll"}
#: Setting fields in llama-bench's loop order (outermost first; ``get_cmd_params_instances``),
#: then the depths and ``--poll`` (:meth:`BenchParams.instances`)
LOOP_ORDER = ("model", "fit_target", "fit_min_ctx", "n_gpu_layers", "n_cpu_moe", "split_mode", "load_mode",
              "lazy_mode", "main_gpu", "devices", "tensor_split", "overrides", "no_host", "repack", "embeddings",
              "no_op_offload", "n_batch", "n_ubatch", "type_k", "type_v", "no_kv_offload", "flash_attn", "n_threads",
              "cpu_mask", "cpu_strict")


def kv_type_of(bytes_per_elem: float) -> str:
    """The KV cache type name of a model's ``kv_bytes_per_elem`` (``f16`` when none matches)."""
    from sim.model.quant import bpw_of

    for t in KV_TYPES:
        if abs(bpw_of(t) / 8 - bytes_per_elem) < 1e-9:
            return t
    return "f16"


@dataclass(frozen=True)
class BenchParams:
    """llama-bench's ``cmd_params``: the values of every parameter (the command line's, else the
    scenario's), the repetitions, and which flags were given.

    Attributes:
        values: Setting field -> tuple of values, for every field of :class:`Setting`, and
            ``poll`` (``--poll``: each :class:`Instance`'s).
        n_prompt, n_gen, n_depth: the tests' values; n_pg the ``-pg`` pairs.
        repetitions: ``-r``.
        given: the :class:`Setting` fields (and ``n_prompt``, ``n_gen``, ``n_depth``, ``n_pg``)
            set on the command line.
        prefetch: the ``-pw``/``-pwg``/``-pes`` combinations (:func:`prefetch_combos`), each test
            once per combination (innermost, as the patched llama-bench), those the simulator
            does not model left out (``--skip-unmodelled``); None: not given (the rows are the
            scenario's or ``--variant``'s variants).
        warmup: llama-bench's untimed warm-up run before each test (False: ``--no-warmup``;
            only an expert cache keeps anything of it, :func:`sim.engines.metrics.run_variant_test`).
    """

    values: dict[str, tuple]
    n_prompt: tuple[int, ...]
    n_gen: tuple[int, ...]
    n_depth: tuple[int, ...]
    n_pg: tuple[tuple[int, int], ...]
    repetitions: int
    given: frozenset[str]
    prefetch: tuple[PrefetchCombo, ...] | None = None
    warmup: bool = True

    def settings(self) -> list[Setting]:
        """Every combination, in llama-bench's loop order."""
        lists = [self.values[k] for k in LOOP_ORDER]
        return [Setting(**dict(zip(LOOP_ORDER, combo))) for combo in itertools.product(*lists)]

    def instances(self, setting: Setting) -> list[Instance]:
        """The tests of one setting, as llama-bench orders them: per depth, per ``--poll`` value,
        the prompts, then the generations, then the ``-pg`` pairs (0 values and 0,0 pairs
        skipped)."""
        out = []
        for d in self.n_depth:
            for pl in self.values.get("poll", (50,)):
                out += [Instance(setting, p, 0, d, pl) for p in self.n_prompt if p > 0]
                out += [Instance(setting, 0, n, d, pl) for n in self.n_gen if n > 0]
                out += [Instance(setting, p, n, d, pl) for p, n in self.n_pg if p or n]
        return out

    def multi(self) -> list[str]:
        """The flags given several values (a product of more than one setting, or ``--poll``)."""
        return [FLAG_OF[k] for k in LOOP_ORDER + ("poll",) if len(self.values.get(k, ())) > 1]


def given_values(args: argparse.Namespace) -> dict[str, tuple]:
    """The values of the llama-bench list flags given on a command line (:data:`_LIST_FLAGS`'
    ``dest`` -> the values, lists flattened, a repeated flag's values added; flags not given are
    left out), for :func:`check_values` without a scenario (the grid loader,
    :mod:`calibrate.llamacpp.grid`)."""
    out = {}
    for dest, *_ in _LIST_FLAGS:
        v = _flat(args, dest)
        if v is not None:
            out[dest] = tuple(v)
    return out


def asked_row_values(args: argparse.Namespace) -> dict[str, tuple[str, tuple]]:
    """What a llama-bench command line (parsed by :func:`add_bench_flags`' flags) asks its rows to
    be: llama-bench row field -> ``(flag, the values it may print)``, in llama-bench's printed
    form (:func:`bench_values`: ``flash_attn`` -1/0/1, ``load_mode`` a name, ``-mmp 1`` as
    ``mmap``, ``tensor_split`` ``1.00/1.00``, ``tensor_buft_overrides`` ``pattern=BUFFER;...`` or
    ``none``, ``no_op_offload`` 0/1), for the flags given only: a flag left out takes
    llama-bench's default, which changes between versions (``-ngl`` 99, then -1). The tests:
    ``n_prompt`` (``-p``), ``n_gen`` (``-n``), ``n_depth`` (``-d``) and ``n_pg`` (``-pg``: the
    ``(pp, tg)`` pairs; a row with both a prompt and a generation is a ``-pg`` test, whatever
    ``-p``/``-n`` say). Used to check a run folder's rows against the invocation they are
    attributed to (:mod:`calibrate.llamacpp.compare`)."""
    out: dict[str, tuple[str, tuple]] = {}
    for dest, opts, *_ in _LIST_FLAGS:
        v = _flat(args, dest)
        if v is None or dest in ("model", "mmap", "overrides", "overrides_cli", "load_mode"):
            continue
        if dest == "tensor_split":
            v = [tensor_split_text(x) for x in v]
        elif dest == "no_op_offload":
            v = [int(x) for x in v]
        out[dest] = (opts[0], tuple(v))
    lm, mmp = _flat(args, "load_mode"), _flat(args, "mmap")
    if lm is not None or mmp is not None:
        out["load_mode"] = ("-lm" if lm is not None else "-mmp",
                            tuple(lm or ()) + tuple("mmap" if x else "none" for x in mmp or ()))
    ot, otc = _flat(args, "overrides"), _flat(args, "overrides_cli")
    if ot is not None or otc is not None:
        sets = list(ot or []) + ([tuple(otc)] if otc else [])
        out["tensor_buft_overrides"] = ("-ot", tuple(overrides_text(st) for st in sets))
    for dest, opts, *_ in PREFETCH_FLAGS:
        v = _flat(args, dest)
        if v is not None:
            out[dest] = (opts[0], tuple(v))
    return out


def check_values(values: dict[str, Sequence], *, repetitions: int | None = None, max_work: int | None = None) -> None:
    """The range checks of llama-bench's flags (``-b``, ``-ub``, ``-t`` >= 1; ``-b``, ``-ub``,
    ``-fitc``, ``-p``, ``-n``, ``-d``, ``-pg`` and depth + tokens within
    :data:`sim.bounds.TOKENS_MAX`; ``-fitt`` within 1 PB; ``-r`` 1 to
    :data:`sim.bounds.REPETITIONS_MAX`; ``--max-work`` >= 1) on ``values`` (:class:`Setting`
    field or test -> its values; a field left out is not checked): the one place ``prefetch-sim
    run`` (:func:`params_from_args`) and a grid's runs (:func:`calibrate.llamacpp.grid.check_bench_args`)
    check them. What the argument types check (integers, >= 0, a C int) is done when parsing.

    Raises:
        ScenarioError: a value out of range (``-b 0``, ``-ub 0``, ``-r 0``), naming the flag.
    """
    from sim.bounds import REPETITIONS_MAX, TOKENS_MAX, check_tokens

    for dest, flag in (("n_batch", "-b/--batch-size"), ("n_ubatch", "-ub/--ubatch-size"),
                       ("n_threads", "-t/--threads")):
        bad = [v for v in values.get(dest, ()) if v < 1]
        if bad:
            raise ScenarioError(f"must be >= 1, got {bad[0]}", field=flag)
    if repetitions is not None and not 1 <= repetitions <= REPETITIONS_MAX:
        raise ScenarioError(f"must be between 1 and {REPETITIONS_MAX} (as the TOML's repetitions), got "
                            f"{repetitions}", field="-r/--repetitions")
    if max_work is not None and max_work < 1:
        raise ScenarioError(f"must be >= 1, got {max_work}", field="--max-work")
    for dest, flag in (("n_batch", "-b/--batch-size"), ("n_ubatch", "-ub/--ubatch-size"),
                       ("fit_min_ctx", "-fitc/--fit-ctx")):
        check_tokens(values.get(dest, ()), flag)
    if any(v > TOKENS_MAX * 64 for v in values.get("fit_target", ())):  # MiB: 64 x 16 Mi MiB = 1 PB (BYTES_MAX)
        raise ScenarioError(f"must be at most {TOKENS_MAX * 64} MiB", field="-fitt/--fit-target")
    n_prompt, n_gen = values.get("n_prompt", ()), values.get("n_gen", ())
    n_depth, n_pg = values.get("n_depth", ()), values.get("n_pg", ())
    check_tokens(n_prompt, "-p/--n-prompt")
    check_tokens(n_gen, "-n/--n-gen")
    check_tokens(n_depth, "-d/--n-depth")
    check_tokens([x for pg in n_pg for x in pg], "-pg")
    longest = max([*n_prompt, *n_gen, *(a + b for a, b in n_pg), 0])
    check_tokens([max(n_depth, default=0) + longest], "-p/-n/-d (depth + tokens, the context)")


def params_from_args(args: argparse.Namespace, scn) -> BenchParams:
    """The parameters of a command line over a scenario's defaults.

    Raises:
        ScenarioError: a value out of range (``-b 0``, ``-ub 0``, ``-r 0``), naming the flag,
            or no test left to run.
    """
    pl, wl, m = scn.placement, scn.workload, scn.model
    given: set[str] = set()

    def pick(dest: str, default: Sequence) -> tuple:
        v = _flat(args, dest)
        if v is None:
            return tuple(default)
        given.add(dest)
        return tuple(v)

    vals: dict[str, tuple] = {}
    vals["model"] = pick("model", [None])
    vals["fit_target"] = pick("fit_target", [0])
    vals["fit_min_ctx"] = pick("fit_min_ctx", [0])
    vals["n_gpu_layers"] = pick("n_gpu_layers", [pl.ngl])
    vals["n_cpu_moe"] = pick("n_cpu_moe", [pl.n_cpu_moe])
    vals["split_mode"] = pick("split_mode", ["layer"])
    lm = _flat(args, "load_mode")
    mmp = _flat(args, "mmap")
    if lm is None and mmp is None:
        vals["load_mode"] = ("none" if pl.pinned else "auto",)
    else:
        given.add("load_mode")
        vals["load_mode"] = tuple(lm or []) + tuple("mmap" if x else "none" for x in (mmp or []))
    vals["main_gpu"] = pick("main_gpu", [0])
    vals["tensor_split"] = pick("tensor_split", [tuple(pl.tensor_split)])
    ot = _flat(args, "overrides")
    otc = _flat(args, "overrides_cli")
    if ot is None and otc is None:
        vals["overrides"] = (tuple(pl.override_tensor),)
    else:
        given.add("overrides")
        sets = tuple(ot or []) + ((tuple(otc),) if otc else ())
        # buffers as llama-bench prints them (CUDA0, CPU), checked against the profile's GPUs
        vals["overrides"] = tuple(tuple((p, canonical_buffer(b, scn.hardware)) for p, b in st) for st in sets)
    vals["no_host"] = pick("no_host", [False])
    vals["embeddings"] = pick("embeddings", [False])
    vals["no_op_offload"] = pick("no_op_offload", [False])
    vals["n_batch"] = pick("n_batch", [wl.n_batch])
    # the TOML's n_ubatch as given (llama.cpp clamps it), while the workload is still the one it was clamped in
    given_ub = wl.n_ubatch_given if wl.n_ubatch_given and min(wl.n_ubatch_given, wl.n_batch) == wl.n_ubatch else 0
    vals["n_ubatch"] = pick("n_ubatch", [given_ub or wl.n_ubatch])
    kv = kv_type_of(m.kv_bytes_per_elem)
    vals["type_k"] = pick("type_k", [kv])
    vals["type_v"] = pick("type_v", [kv])
    vals["no_kv_offload"] = pick("no_kv_offload", [False])
    vals["flash_attn"] = pick("flash_attn", [-1])
    vals["n_threads"] = pick("n_threads", [default_threads(scn.hardware)])
    vals["lazy_mode"] = pick("lazy_mode", ["auto"])
    vals["devices"] = tuple(check_devices(d, scn.hardware) for d in pick("devices", ["auto"]))
    vals["repack"] = pick("repack", [True])
    vals["cpu_mask"] = pick("cpu_mask", ["0x0"])
    vals["cpu_strict"] = pick("cpu_strict", [False])
    vals["poll"] = pick("poll", [50])
    reps = getattr(args, "repetitions", None)
    n_prompt = tuple(_flat(args, "n_prompt") or wl.n_prompt)
    n_gen = tuple(_flat(args, "n_gen") or wl.n_gen)
    n_depth = tuple(_flat(args, "n_depth") or wl.n_depth)
    n_pg = tuple(_flat(args, "n_pg") or ())
    check_values({**vals, "n_prompt": n_prompt, "n_gen": n_gen, "n_depth": n_depth, "n_pg": n_pg},
                 repetitions=reps, max_work=getattr(args, "max_work", None))
    for k in ("n_prompt", "n_gen", "n_depth", "n_pg"):
        if _flat(args, k) is not None:
            given.add(k)
    if not any(p > 0 for p in n_prompt) and not any(n > 0 for n in n_gen) and not any(a or b for a, b in n_pg):
        raise ScenarioError("no test to run: every -p and -n value is 0", field="-p/-n")
    combos = prefetch_combos(args)
    if combos is not None:
        combos = tuple(c for c in combos if c.variant is not None)
    return BenchParams(vals, n_prompt, n_gen, n_depth, n_pg, reps or wl.repetitions, frozenset(given), combos,
                       warmup=not getattr(args, "harness_no_warmup", False))


# --------------------------------------------------------------------------------------
# buffers and -ot rules
# --------------------------------------------------------------------------------------


def hardware_backend(hw) -> str:
    """llama-bench's ``backends`` of a profile: its ``backend`` field, else
    :func:`sim.model.specs.default_backend` of its GPU (``CUDA`` for NVIDIA, ``ROCm`` for AMD, the
    profile's name otherwise)."""
    from sim.model.specs import default_backend

    return getattr(hw, "backend", "") or default_backend(hw.gpu_name, hw.name)


def buffer_names(hw) -> list[str]:
    """The buffer names ``-ot`` takes on a profile, in its backend's spelling: llama-bench's
    (and llama-cli's) list of the devices' buffer types, ``CPU``, ``CUDA0``... (``ROCm0``... on
    ROCm); the pinned host buffer (``CUDA_Host``) is not a device's and is not in it
    (``parse_cmd_params``, ``ggml_backend_dev_buffer_type``)."""
    fam = "ROCm" if hardware_backend(hw) == "ROCm" else "CUDA"
    return ["CPU"] + [f"{fam}{i}" for i in range(hw.n_gpu)]


def canonical_buffer(buf: str, hw) -> str:
    """``buf`` if it is one of :func:`buffer_names`, matched exactly as llama-bench matches it.

    Raises:
        ScenarioError: any other name, with a hint for a name that differs only in case
            (``cpu``), the pinned host buffer (``CUDA_Host``) and another backend's GPU buffer.
    """
    names = buffer_names(hw)
    if buf in names:
        return buf
    hint = ""
    exact = {n.lower(): n for n in names}
    if buf.strip().lower() in exact:
        hint = f"; llama-bench matches buffer names exactly: '{exact[buf.strip().lower()]}'"
    elif buf.strip().lower().endswith("_host"):
        hint = ("; llama-bench's -ot takes the devices' buffer types only: host weights are in the pinned "
                "host buffer already, unless -lm mmap/auto or --no-host 1")
    raise ScenarioError(f"unrecognized buffer type '{buf}' (available on profile '{hw.name}': "
                        f"{', '.join(names)}){hint}", field="-ot/--override-tensor")


def check_devices(devices: str, hw) -> str:
    """One ``-dev`` value (:func:`_device_list`) as llama-bench prints it (``devices_to_string``):
    ``auto``, or the profile's GPU names (matched without regard to case, as
    ``ggml_backend_dev_by_name``) joined by ``/``.

    Raises:
        ScenarioError: ``none`` (CPU only: this simulator prices GPU offload, it has no CPU-only
            run) or a name that is not one of the profile's GPUs (llama-bench refuses an unknown
            device and the CPU), naming ``-dev``.
    """
    if devices == "auto":
        return devices
    if devices == "none":
        raise ScenarioError("-dev none runs on the CPU only (no GPU), which this GPU offload simulator cannot "
                            "simulate; give auto or the profile's GPUs", field="-dev/--device")
    gpus = buffer_names(hw)[1:]
    by_lower = {g.lower(): g for g in gpus}
    out = []
    for name in devices.split("/"):
        if name.lower() not in by_lower:
            raise ScenarioError(f"invalid device: {name} (the devices of profile '{hw.name}': {', '.join(gpus)})",
                                field="-dev/--device")
        out.append(by_lower[name.lower()])
    return "/".join(out)


def sim_buffer(canon: str) -> str:
    """A printed buffer name (:func:`canonical_buffer`) as the simulator's placement has it:
    ``CPU``, a GPU's ``CUDA<i>``."""
    if canon == "CPU":
        return "CPU"
    return "CUDA" + re.sub(r"\D", "", canon)


def check_rule(pattern: str, buf: str) -> None:
    """An ``-ot`` rule must compile (as llama.cpp's ECMAScript regex, in Python's ``re``). One that
    matches no tensor of the model, or only norm tensors, is noted where the placement is made
    (:func:`sim.views.llamabench.row_placement`, :func:`sim.views.llamabench.rule_match_note`),
    for run and compare alike.

    Raises:
        ScenarioError: the pattern does not compile.
    """
    from sim.views.llamabench import python_regex

    try:
        re.compile(python_regex(pattern))
    except (re.error, ValueError) as exc:
        raise ScenarioError(f"rule '{pattern}={buf}': pattern not understood ({exc})", field="-ot") from None
    # one that matches no tensor is noted by row_placement (sim.views.llamabench.rule_match_note),
    # as compare notes it


# --------------------------------------------------------------------------------------
# a setting as a llama-bench row and as a scenario
# --------------------------------------------------------------------------------------


def tensor_split_text(shares: Sequence[float], precise: bool = False) -> str:
    """``tensor_split`` as llama-bench prints it: ``%.2f`` shares up to the last non-zero one,
    joined by ``/`` (``0.00`` for the default); ``precise``: full precision (for the simulator)."""
    s = list(shares) or [0.0]
    last = max([i for i, x in enumerate(s) if x > 0], default=0)
    fmt = repr if precise else (lambda x: f"{x:.2f}")
    return "/".join(fmt(float(x)) for x in s[:last + 1])


def overrides_text(rules: Sequence[Rule]) -> str:
    """``tensor_buft_overrides`` as llama-bench prints it: ``pattern=BUFFER`` joined by ``;``, or
    ``none``."""
    return ";".join(f"{p}={b}" for p, b in rules) if rules else "none"


def model_filename(setting: Setting, model) -> str:
    """llama-bench's ``model_filename``: the ``-m`` path as given; without ``-m``, the scenario's
    model file relative to the working folder when it lies below it (as a scenario named by its
    path writes it), else its absolute path, whichever way the scenario was found (a built-in
    name or a path); the model's name when it has no file."""
    if setting.model is not None:
        return setting.model
    if not model.file:
        return model.name
    p = Path(model.file).resolve()
    try:
        return str(p.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def bench_values(inst: Instance, model, hw, *, test_time: str, overrides: Sequence[Rule] | None = None) -> dict:
    """Every llama-bench field of one test but the build and the timings (``avg_ns``... come from
    the samples: :func:`sim.views.report.bench_row`), as llama-bench prints them: ``model_type`` is the
    model's label, ``backends`` the profile's backend, ``gpu_info`` its GPU per device,
    ``cpu_info`` says the host is simulated; ``cpu_mask``, ``cpu_strict``, ``poll``, ``devices``,
    ``lazy_mode`` and ``repack`` as given (the setting's and ``inst.poll``; not modelled)."""
    s = inst.setting
    rules = s.overrides if overrides is None else overrides
    return {
        "cpu_info": f"{SIMULATED_CPU_INFO} of profile '{hw.name}'",
        "gpu_info": ", ".join([hw.gpu_name] * hw.n_gpu),
        "backends": hardware_backend(hw),
        "model_filename": model_filename(s, model),
        "model_type": model.name,
        "model_size": int(model.nbytes),
        "model_n_params": int(model.n_params),
        "n_batch": s.n_batch, "n_ubatch": s.n_ubatch, "n_threads": s.n_threads,
        "cpu_mask": s.cpu_mask, "cpu_strict": s.cpu_strict, "poll": inst.poll,
        "type_k": s.type_k, "type_v": s.type_v,
        "n_gpu_layers": s.n_gpu_layers, "n_cpu_moe": s.n_cpu_moe, "split_mode": s.split_mode,
        "main_gpu": s.main_gpu, "no_kv_offload": s.no_kv_offload, "flash_attn": s.flash_attn,
        "devices": s.devices, "tensor_split": tensor_split_text(s.tensor_split),
        "tensor_buft_overrides": overrides_text(rules), "load_mode": s.load_mode, "lazy_mode": s.lazy_mode,
        "embeddings": s.embeddings, "no_op_offload": int(s.no_op_offload), "no_host": s.no_host, "repack": s.repack,
        "fit_target": s.fit_target, "fit_min_ctx": s.fit_min_ctx,
        "n_prompt": inst.n_prompt, "n_gen": inst.n_gen, "n_depth": inst.n_depth, "test_time": test_time,
    }


def model_path(text: str) -> Path:
    """The file ``-m`` names: a path (relative to the working folder, else to the shipped files),
    or a built-in model name (``qwen3-30b-a3b``)."""
    p = Path(text)
    if p.exists() or p.is_absolute():
        return p
    try:
        from sim import resources
    except ImportError:  # pragma: no cover - older layout
        return p
    if resources.is_bare_name(text):
        found = resources.builtin("model", text.strip(), cwd_first=True)
        if found is not None:
            return found
    return resources.cwd_or_shipped(p)


@dataclass
class Notes:
    """One-line remarks for stderr, each said once, in order."""

    lines: list[str] = field(default_factory=list)

    def add(self, text: str) -> None:
        if text not in self.lines:
            self.lines.append(text)

    def extend(self, texts: Iterable[str]) -> None:
        for t in texts:
            self.add(t)


def _routing_for(scn, model, notes: Notes):
    """The scenario's routing on another model: kept when it fits the model, else uniform (noted)."""
    from sim.model.routing import RoutingSpec, load_trace

    r = scn.routing
    if model is scn.model or model.moe is None or getattr(r, "kind", "uniform") == "uniform":
        return r
    moe = model.moe
    try:
        if r.kind == "trace":
            load_trace(r.trace_file, n_expert=moe.n_expert, top_k=moe.n_expert_used, n_layer=model.n_layer,
                       first_moe_layer=moe.n_layer_dense_lead)
        elif r.kind == "skewed" and r.cold_share > 1 - moe.n_expert_used / moe.n_expert + 1e-12:
            raise ValueError("cold_share too large for this model")
        return r
    except (ScenarioError, ValueError) as exc:
        notes.add(f"-m: the scenario's {r.kind} routing does not fit model '{model.name}' ({exc}): uniform routing")
        return RoutingSpec()


def setting_scenario(setting: Setting, params: BenchParams, scn, model, notes: Notes):
    """The simulator scenario of one setting, over the base scenario ``scn`` with ``model``.

    The setting's llama-bench row goes through :func:`sim.views.llamabench.row_terms`,
    :func:`~sim.views.llamabench.model_with_kv` (when ``-ctk``/``-ctv`` are given) and
    :func:`~sim.views.llamabench.row_placement`; the scenario's own placement settings that a
    llama-bench row does not carry stay (``expert_cache_experts``, ``op_offload_min_batch``
    unless ``-nopo 1``, ``fit_experts``, ``fit_target_mib``, its ``ctx_size`` as the least
    context). ``-fitt M``: the fewest host expert layers that fit with M MiB left free per GPU
    (llama-bench's fit replaces ``-ngl``, ``-ncmoe``, ``-ts`` and ``-ot``); the M MiB are held as
    reserved VRAM, and a fitted expert cache (``expert_cache = "fit"``) leaves them free instead
    of ``placement.fit_target_mib``. ``-sm none``: every layer on ``-mg``.

    Raises:
        ScenarioError: an ``-ot`` rule with an unknown buffer or a pattern that does not
            compile (one that matches no tensor is noted: :func:`check_rule`); ``-mg`` beyond
            the profile's GPUs.
    """
    from sim.views.llamabench import (QUANTISED_V_NEEDS_FA, fa_auto_off, kv_context_error, model_with_kv,
                                      quantised_v_without_fa, row_placement, row_terms)
    from sim.model.specs import Workload

    hw = scn.hardware
    given = params.given
    check_main_gpu(setting.main_gpu, hw)
    canon = tuple((p, canonical_buffer(b, hw)) for p, b in setting.overrides)
    if "overrides" in given:
        for p, b in canon:
            check_rule(p, b)
    moe = model.moe is not None
    ncmoe = setting.n_cpu_moe
    if not moe and ncmoe:
        if "n_cpu_moe" in given:
            notes.add(f"-ncmoe/--n-cpu-moe {ncmoe}: model '{model.name}' has no experts; it has no effect")
        else:
            notes.add(f"the scenario's n_cpu_moe {ncmoe} does not apply to model '{model.name}' (no experts)")
        ncmoe = 0
    first = params.instances(setting)[0]
    row = {
        "n_gpu_layers": setting.n_gpu_layers, "n_cpu_moe": ncmoe,
        "tensor_buft_overrides": overrides_text([(p, sim_buffer(b)) for p, b in canon]),
        "load_mode": setting.load_mode, "no_host": setting.no_host, "no_op_offload": int(setting.no_op_offload),
        "tensor_split": tensor_split_text(setting.tensor_split, precise=True), "split_mode": setting.split_mode,
        "no_kv_offload": setting.no_kv_offload, "embeddings": setting.embeddings,
        "n_batch": setting.n_batch, "n_ubatch": setting.n_ubatch,
        "type_k": setting.type_k, "type_v": setting.type_v,
        # the flash attention the setting runs (-fa, else the scenario's)
        "flash_attn": setting.flash_attn if (setting.flash_attn != -1 or "flash_attn" in given)
        else int(bool(scn.placement.flash_attn)),
        "n_prompt": first.n_prompt, "n_gen": first.n_gen, "n_depth": first.n_depth,
    }
    terms = row_terms(row)
    refused = kv_context_error(model, row["flash_attn"], setting.type_k, setting.type_v)
    if refused:  # llama.cpp creates no context (before any note: the error is the one line)
        flag = "-ctk" if refused[0] == "type_k" else "-ctv"
        raise ContextRefusedError(f"{flag} {refused[1]}", field=flag)
    notes.extend(terms.notes)
    if setting.n_ubatch > setting.n_batch:
        ub = "-ub" if "n_ubatch" in given else "the scenario's n_ubatch"
        b = "-b" if "n_batch" in given else "its n_batch" if "n_ubatch" not in given else "the scenario's n_batch"
        where = f" ({scn.file})" if not {"n_ubatch", "n_batch"} <= given and getattr(scn, "file", None) else ""
        notes.add(f"{ub} {setting.n_ubatch} is above {b} {setting.n_batch}{where}: llama.cpp clamps the ubatch to "
                  f"the batch, so {terms.n_ubatch}-token ubatches are simulated; the rows print n_ubatch "
                  f"{setting.n_ubatch}, as llama-bench's")
    m = model_with_kv(model, terms) if ({"type_k", "type_v"} & given) else model
    if setting.fit_target or setting.fit_min_ctx:
        terms = replace(terms, ngl=999, n_cpu_moe=0, overrides=(), tensor_split=())
    try:
        pl, pnotes = row_placement(terms, m, hw.n_gpu)
    except ValueError as exc:
        raise ScenarioError(str(exc), field="-ot") from None
    # the row's note on n_cpu_moe past the blocks is said below in the flag's terms (-ncmoe)
    notes.extend(n for n in pnotes if not n.startswith("n_cpu_moe "))
    base = scn.placement
    if "model" in given:
        kept = [f"{flag} {val}" for dest, flag, val in (
            ("n_gpu_layers", "-ngl", base.ngl), ("n_cpu_moe", "-ncmoe", base.n_cpu_moe),
            ("load_mode", "-lm", "none" if base.pinned else "mmap"),
            ("overrides", "-ot", ";".join(f"{rx}={buf}" for rx, buf in base.override_tensor) or "none"))
            if dest not in given and not (dest == "n_cpu_moe" and (not moe or base.n_cpu_moe == 0))
            and not (dest == "overrides" and not base.override_tensor)]
        if kept:
            notes.add(f"-m: the placement comes from the scenario ({', '.join(kept)}); llama-bench's own defaults "
                      "are -ngl -1 -ncmoe 0 -lm auto: give the flags to override")
        if not {"n_prompt", "n_gen", "n_pg"} & given:
            # fresh-user round 10: the tests came from the scenario with nothing said
            wl = scn.workload
            notes.add(f"-m: the tests come from the scenario ({', '.join(t.name for t in wl.tests())}); llama-bench's "
                      "own default is -p 512 -n 128: give -p/-n/-pg to override")
    if moe and setting.n_cpu_moe > m.n_layer:
        notes.add(f"-ncmoe {setting.n_cpu_moe}: '{m.name}' has {m.n_layer} blocks; every expert is on the host")
    pl = replace(pl, expert_cache_experts=base.expert_cache_experts, ctx_size=base.ctx_size,
                 fit_experts=base.fit_experts, fit_target_mib=base.fit_target_mib,
                 op_offload_min_batch=pl.op_offload_min_batch if setting.no_op_offload else base.op_offload_min_batch)
    if "overrides" not in given:
        # the scenario's own rules are already in the simulator's terms: keep them as written
        pl = replace(pl, override_tensor=tuple(base.override_tensor))
    if setting.split_mode == "none" and hw.n_gpu > 1:
        pl = replace(pl, tensor_split=tuple(1.0 if i == setting.main_gpu else 0.0 for i in range(hw.n_gpu)))
    if setting.fit_target or setting.fit_min_ctx:
        if setting.fit_target:
            check_fit_target(setting.fit_target, hw)
        replaced = [f for f, k in (("-ngl", "n_gpu_layers"), ("-ncmoe", "n_cpu_moe"), ("-ot", "overrides"),
                                   ("-ts", "tensor_split")) if k in given]
        # the scenario's own placement, where the flags left it, is replaced as well
        own = [f"{f} {v}" for f, k, v, default in (
            ("-ngl", "n_gpu_layers", base.ngl, (999, -1)), ("-ncmoe", "n_cpu_moe", base.n_cpu_moe, (0,)),
            ("-ot", "overrides", ";".join(f"{rx}={buf}" for rx, buf in base.override_tensor), ("",)))
            if k not in given and v not in default and not (k == "n_gpu_layers" and v > m.n_layer)]
        if replaced or own:
            what = ", ".join(replaced + [f"the scenario's {o}" for o in own])
            notes.add(f"-fitt/-fitc: llama-bench's fit (common_fit_params) replaces {what}; "
                      "the row prints them as given, as llama-bench does (--vram: the placement simulated)")
        if moe:
            pl = replace(pl, fit_experts=True)
        else:
            notes.add(f"-fitt: fitting a dense model ('{m.name}') by layers is not modelled; -ngl as given")
        if setting.fit_target:
            # the margin the n_cpu_moe fit and a fitted expert cache pool leave free on every GPU
            # (sim.model.vram.fit_n_cpu_moe, account)
            pl = replace(pl, fit_target_mib=(setting.fit_target,))
        if setting.fit_min_ctx:
            notes.add("-fitc: the context is each test's depth + tokens (at least the scenario's ctx_size)")
    if quantised_v_without_fa(setting.flash_attn, setting.type_v):
        raise ContextRefusedError(f"-ctv {setting.type_v} with -fa off: {QUANTISED_V_NEEDS_FA}", field="-ctv")
    if setting.flash_attn != -1 or "flash_attn" in given:
        pl = replace(pl, flash_attn=setting.flash_attn != 0 and not fa_auto_off(setting.flash_attn, setting.type_k,
                                                                                setting.type_v))
        if hw.ggml is None:
            notes.add(f"-fa: profile '{hw.name}' has one attention cost for every -fa (a profile with llama.cpp "
                      "kernel tables, such as h200-llamacpp, prices both)")
    else:
        pl = replace(pl, flash_attn=base.flash_attn)
    if "n_threads" in given:
        notes.add("-t: the thread count is not modelled (CPU ops are priced by the profile's host figures; a -t "
                  "other than the profile's is refused where weights are on the host)")
    if "tensor_split" in given and hw.n_gpu > 1:
        notes.add("-ts: sets each GPU's layers (placement, VRAM); the activations crossing between the GPUs are "
                  "not priced, nor llama.cpp's pipelining of a batch's ubatches over the GPUs (n_batch > n_ubatch), "
                  "so with every weight on the GPUs the t/s is the one GPU's whatever the split")
    elif hw.n_gpu > 1 and setting.split_mode != "none":
        notes.add(f"-sm {setting.split_mode} over {hw.n_gpu} GPUs: each GPU holds its share of the layers (placement, "
                  "VRAM); the activations crossing between the GPUs are not priced, nor llama.cpp's pipelining of a "
                  "batch's ubatches over them, so with every weight on the GPUs the t/s is one GPU's")
    insts = params.instances(setting)
    wl = Workload(
        n_prompt=tuple(dict.fromkeys(i.n_prompt for i in insts if i.n_prompt)) or (0,),
        n_gen=tuple(dict.fromkeys(i.n_gen for i in insts if i.n_gen)) or (0,),
        n_depth=tuple(dict.fromkeys(i.n_depth for i in insts)) or (0,),
        n_ubatch=terms.n_ubatch, n_batch=terms.n_batch, repetitions=params.repetitions, warmup=params.warmup)
    return scn.with_(model=m, hardware=hw, placement=pl, workload=wl, routing=_routing_for(scn, m, notes))


def check_main_gpu(main_gpu: int, hw) -> None:
    """``-mg`` must name one of the profile's GPUs (``prefetch-sim run``; ``calibrate.llamacpp.compare``
    refuses a row's ``main_gpu`` alike).

    Raises:
        ScenarioError: naming ``-mg``, the profile and its GPU count.
    """
    if main_gpu >= hw.n_gpu:
        raise ScenarioError(f"main GPU {main_gpu} does not exist: profile '{hw.name}' has {hw.n_gpu} GPU(s)",
                            field="-mg/--main-gpu")


def check_fit_target(fit_target_mib: int, hw) -> None:
    """``-fitt M`` must leave room for something: M MiB kept free per GPU, with the profile's
    reserved VRAM, below the GPU's memory (else no placement fits, whatever the fit moves to the
    host).

    Raises:
        ScenarioError: naming ``-fitt``, the margin and the GPU's memory, suggesting a smaller
            ``-fitt``.
    """
    margin = fit_target_mib * 2**20
    if margin + hw.vram_reserved_bytes < hw.vram_bytes:
        return
    room = max(0, int((hw.vram_bytes - hw.vram_reserved_bytes) // 2**20))
    reserved = f", {hw.vram_reserved_bytes / 2**20:.0f} MiB of it reserved" if hw.vram_reserved_bytes else ""
    raise ScenarioError(f"-fitt {fit_target_mib}: the margin alone leaves no room on a GPU ({hw.gpu_name} of "
                        f"profile '{hw.name}': {hw.vram_bytes / 2**20:.0f} MiB{reserved}), so nothing fits, whatever "
                        f"the fit moves to the host; give a smaller -fitt (below {room} MiB, leaving room "
                        "for the weights, KV cache and compute buffer)", field="-fitt/--fit-target")


#: the :class:`Setting` fields that size each VRAM component of :class:`sim.model.vram.VramBreakdown`
#: (weights: what is on the GPU; KV cache: its layers there and element types, the context is
#: the tests'; compute buffer: the ubatch's activations; reserved: ``-fitt``'s margin, held as
#: reserved VRAM), in the order :func:`overflow_in_flags` names them
VRAM_SIZED_BY: dict[str, tuple[str, ...]] = {
    "weights": ("model", "n_gpu_layers", "n_cpu_moe", "overrides", "tensor_split", "split_mode", "main_gpu"),
    "kv": ("model", "n_gpu_layers", "tensor_split", "split_mode", "main_gpu", "type_k", "type_v"),
    "compute": ("model", "n_ubatch", "n_batch"),
    "staging": (),
    "reserved": ("fit_target",),
}
#: what to change, per VRAM component, in flag terms
_VRAM_ADVICE = {
    "weights": "fewer weights on the GPU (lower -ngl, raise -ncmoe, or -ot ...=CPU rules)",
    "kv": "a smaller KV cache (a shorter context: -d plus -p/-n, fewer layers on the GPU, or -ctk/-ctv q8_0)",
    "compute": "a smaller compute buffer (a smaller -ub)",
    "staging": "fewer staging slots or no prefetch",
    "reserved": "a smaller -fitt margin",
}
#: a flag's option strings (``-d/--n-depth``) by :class:`Setting` field or test
_OPTS_OF = {dest: "/".join(opts) for dest, opts, *_ in _LIST_FLAGS}


def overflow_in_flags(exc: Exception, params: BenchParams, setting: Setting, base_ctx_size: int,
                      variant_flag: tuple[str, str] | None = None, *, test_flags: Sequence[tuple[str, str]] = (),
                      where: str = "", ctx_flag: bool = False) -> Exception:
    """A VRAM overflow (:class:`sim.errors.VramOverflowError` of :func:`sim.model.vram.account`) of one
    setting in the terms of the command line: the error names the flags given that size the
    component(s) that overflow, with their values, and says what to change in flag terms.

    The components that overflow are those whose removal alone would make the GPU fit (when
    none would, the largest ones that together would): weights, KV cache, compute buffer,
    staging, and with ``-fitt`` the reserved VRAM it adds to. The flags that size each are
    :data:`VRAM_SIZED_BY`'s (with ``-fitt``/``-fitc``, llama-bench's fit
    replaces ``-ngl``, ``-ncmoe``, ``-ot``, ``-ts``: those are named instead); the KV cache's
    also ``-d``/``-p``/``-n``/``-pg`` (and ``test_flags``: ``(flag, value)`` of other options
    that set the tests, ``check --test``) when the tests raised the context above the
    scenario's ``base_ctx_size``; staging's ``variant_flag`` (``(flag, value as given)`` of
    the variant's ``-pes``/``-pw``/``--variant``; None: the scenario's own variant).

    Returns:
        A :class:`sim.errors.PlacementError` whose field is the flag(s) (``-d/--n-depth``, or
        ``-m/-ngl/-ncmoe`` for several) and whose message starts with their values (then
        ``where``, e.g. the setting); ``exc`` itself when it is no VRAM overflow or no flag
        given sizes what overflows (the scenario's field stays named).
    """
    from sim.errors import PlacementError, VramOverflowError

    b = getattr(exc, "breakdown", None)
    if not isinstance(exc, VramOverflowError) or b is None:
        return exc
    comps = {"weights": b.weights_bytes, "kv": b.kv_bytes, "compute": b.compute_bytes, "staging": b.staging_bytes}
    if setting.fit_target:  # the profile's own reserved VRAM is no flag's; -fitt's margin is
        comps["reserved"] = b.reserved_bytes
    excess = b.total_bytes - b.capacity_bytes
    over = [k for k, v in comps.items() if v > 0 and v >= excess]
    if not over:  # no one component: the largest ones that together would
        for k in sorted(comps, key=comps.get, reverse=True):
            over.append(k)
            if sum(comps[c] for c in over) >= excess:
                break
    fit = bool(setting.fit_target or setting.fit_min_ctx)
    raised = exc.ctx_size > base_ctx_size
    named: list[tuple[str, str, str]] = []  # (field, short flag, text with the value)

    def add(key: str, short: str, text: str) -> None:
        if all(n[0] != key for n in named):
            named.append((key, short, text))

    for comp in over:
        for dest in VRAM_SIZED_BY[comp]:
            if fit and dest in ("n_gpu_layers", "n_cpu_moe", "overrides", "tensor_split"):
                dest = "fit_target" if setting.fit_target else "fit_min_ctx"
            if dest not in params.given:
                continue
            v = getattr(setting, dest)
            text = overrides_text(v) if dest == "overrides" else tensor_split_text(v) if dest == "tensor_split" else v
            add(dest, FLAG_OF[dest], f"{FLAG_OF[dest]} {text}")
        if comp == "kv" and raised:
            for dest in ("n_depth", "n_prompt", "n_gen", "n_pg"):
                vals = getattr(params, dest)
                if dest in params.given and any(vals):
                    text = ",".join(str(x) for x in vals) if dest != "n_pg" else " -pg ".join(f"{a},{c}" for a, c in vals)
                    add(dest, FLAG_OF[dest], f"{FLAG_OF[dest]} {text}")
            for flag, value in test_flags:
                add(flag, flag, f"{flag} {value}")
        if comp == "staging" and variant_flag is not None:
            flag, value = variant_flag
            add("variant", flag.split("/")[0], value)
    if not named:
        return exc
    field = _OPTS_OF.get(named[0][0], named[0][1]) if len(named) == 1 else "/".join(n[1] for n in named)
    if len(named) == 1 and named[0][0] == "variant":
        field = variant_flag[0]
    advice = dict(_VRAM_ADVICE)
    if not raised:
        # the scenario's context sizes the KV cache, not the tests: shorter tests change nothing
        if ctx_flag:   # --ctx-size N sized it
            advice["kv"] = (f"a smaller KV cache (--ctx-size {base_ctx_size} sizes it here, where llama-bench sizes "
                            "it to each test's -p + -n + -d: a smaller --ctx-size, 0 for llama-bench's own; or "
                            "fewer layers on the GPU, or -ctk/-ctv q8_0)")
        else:
            advice["kv"] = (f"a smaller KV cache (the scenario's placement.ctx_size, {base_ctx_size} tokens, sizes "
                            f"it here, where llama-bench sizes it to each test's -p + -n + -d: lower ctx_size in the "
                            f"scenario or give --ctx-size (0: llama-bench's own); or fewer layers on the GPU, or "
                            f"-ctk/-ctv q8_0)")
    text = ", or ".join(advice[c] for c in over)
    return PlacementError(f"{' '.join(n[2] for n in named)}{where}: {exc.needs}; to fit: {text}", field=field)


def sim_tests(instances: Sequence[Instance]) -> list:
    """The distinct simulator tests of some instances, in order of first use (a dict's keys:
    linear in the tests, where a list's membership test made a 4096-prompt sweep quadratic)."""
    return list(dict.fromkeys(t for inst in instances for t in inst.tests))


def load_models(params: BenchParams, scn) -> dict[str | None, Any]:
    """Each ``-m`` model (loaded once), or the scenario's for None.

    Raises:
        ScenarioError: a model file that is missing or not a model (naming it).
    """
    from sim.model.specs import load_model

    out: dict[str | None, Any] = {}
    for name in params.values["model"]:
        if name in out:
            continue
        if name is None:
            out[name] = scn.model
            continue
        p = model_path(name)
        if p.is_dir():
            raise ScenarioError("is a folder, expected a model TOML or GGUF file", file=p, field="-m/--model")
        if not p.exists():
            from sim import resources

            if resources.is_bare_name(name):  # a name, not a path: say which names there are
                raise ScenarioError(resources.unknown_name_message("model", name.strip()), field="-m/--model")
            raise ScenarioError("model file not found", file=p, field="-m/--model")
        if not p.is_file():  # /dev/null, a FIFO: named by the flag, as a folder or a missing file is
            raise ScenarioError("not a regular file (a device, FIFO or socket cannot be a model)", file=p,
                                field="-m/--model")
        out[name] = load_model(p)
    return out
