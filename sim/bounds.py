"""Physical and size bounds on every number the simulator reads (files and flags), in one place.

Each bound is a named constant with the reason for its value. Loaders apply them through
:class:`sim.tomlio.Fields` (``Fields.sourced(..., kind=...)``, ``Fields.int(..., max=...)``) and the
command line through :func:`check_tokens` and :func:`check_work`; every error is a
:class:`~sim.errors.ScenarioError` naming the file (or flag) and field.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from sim.errors import ScenarioError

# --------------------------------------------------------------------------------------
# physical quantities, in SI units after unit scaling
# --------------------------------------------------------------------------------------

#: largest byte count (VRAM, cache, L2): 1 PB, ~7,000x the largest GPU memory sold (H200: 141 GB)
BYTES_MAX = 1e15
#: largest bandwidth: 100 TB/s, ~20x HBM3e (4.8 TB/s), far above any PCIe or DRAM link
BANDWIDTH_MAX_BYTES_PER_S = 1e14
#: smallest bandwidth: 1 kB/s; anything slower turns a weight copy into days (and 1e-320 into inf)
BANDWIDTH_MIN_BYTES_PER_S = 1e3
#: largest compute rate: 1 EFLOP/s, ~500x a B200's dense FP8 peak
FLOPS_MAX = 1e18
#: smallest compute rate: 1 MFLOP/s, slower than a 1980s CPU (a smaller one gives inf durations)
FLOPS_MIN = 1e6
#: shortest non-zero duration: 1 ps, below any clock period (a 1e-320 us latency is not physical)
DURATION_MIN_S = 1e-12
#: longest duration of one op's fixed cost (a latency, launch or sync): one hour
DURATION_MAX_S = 3600.0
#: smallest share of peak a kernel reaches (efficiencies): 0.1 % (a smaller one means a wrong peak)
EFFICIENCY_MIN = 1e-3
#: range of a dimensionless scale factor (executor_busy_scale): three orders of magnitude each way
SCALE_MIN, SCALE_MAX = 1e-3, 1e3

#: physical kinds: (smallest positive value, largest value, unit for messages)
KINDS: dict[str, tuple[float, float, str]] = {
    "bytes": (1.0, BYTES_MAX, "bytes"),
    "bytes_per_s": (BANDWIDTH_MIN_BYTES_PER_S, BANDWIDTH_MAX_BYTES_PER_S, "bytes/s"),
    "flops_per_s": (FLOPS_MIN, FLOPS_MAX, "FLOP/s"),
    "duration_s": (DURATION_MIN_S, DURATION_MAX_S, "s"),
    "efficiency": (EFFICIENCY_MIN, 1.0, ""),
    "scale": (SCALE_MIN, SCALE_MAX, ""),
}

# --------------------------------------------------------------------------------------
# sizes
# --------------------------------------------------------------------------------------

#: most tokens in one prompt, generation, depth, context or batch: 16 Mi, 16x the longest
#: context of a released model (1M); the KV cache of more would not fit in BYTES_MAX anyway
TOKENS_MAX = 2**24
#: most repetitions of a test: llama-bench's runs are averaged, 1000 is far past any use
REPETITIONS_MAX = 1000
#: most values one list flag (-p 1-1000000, --axis ubatch=1-100000000) may expand to
LIST_VALUES_MAX = 4096
#: largest integer any flag or file field takes: int64 (llama.cpp's and numpy's widest integer)
INT_MAX = 2**63 - 1
#: largest layer count, cache size or flag llama.cpp reads as a C int (-ngl, --n-cpu-moe, -t)
INT32_MAX = 2**31 - 1
#: most blocks in a model: the deepest released LLMs have < 200
LAYERS_MAX = 1024
#: llama.cpp's own limits on a model it loads (src/llama-hparams.h: LLAMA_MAX_LAYERS, LLAMA_MAX_EXPERTS;
#: llama_model::load_hparams asserts them): a GGUF past them is refused as llama-bench refuses it
LLAMA_MAX_LAYERS = 512
LLAMA_MAX_EXPERTS = 1024
#: largest model dimension (d_model, n_ff, n_vocab, ...): 2**24, 100x the widest released
DIM_MAX = 2**24
#: most heads or experts: 2**16 (released MoEs have <= 512 experts, models <= 128 heads)
COUNT_MAX = 2**16
#: largest text input (TOML, CSV table, routing trace): 256 MiB; shipped ones are < 1 MiB
TEXT_INPUT_MAX_BYTES = 256 * 2**20
#: deepest nesting of arrays/tables in a TOML input; shipped files nest 3 deep
TOML_DEPTH_MAX = 32

#: default work budget: graphs x layers x repetitions x settings that one command builds, one
#: per variant with an expert cache (or a profile in executor mode: built op by op, ~16,000
#: graph-layers/s on one core, measured with `prefetch-sim run -n 1024 -p 0 --variant cache_lru`
#: on the 2-core CI machine, 2026-12-03), 1/MEMO_WORK_DIVISOR per other variant (timed graph by
#: graph, sim.plan.memo: > 2,000,000/s, `-n 4096 -p 0 --engine des`); the budget is then about half a
#: minute either way; raised with --max-work
WORK_MAX = 500_000
#: how much cheaper a memoised variant's graph-layer is than one built op by op (see WORK_MAX;
#: the measured ratio is above 100)
MEMO_WORK_DIVISOR = 100


def check_kind(value: float, kind: str, *, zero_ok: bool = False, file=None, field: str | None = None) -> float:
    """``value`` (already in SI units) checked against the bounds of its physical ``kind``
    (:data:`KINDS`); ``zero_ok``: 0 is accepted too (a cost that can be absent).

    Raises:
        ScenarioError: naming ``file`` and ``field``: not finite, or out of the bounds.
    """
    lo, hi, unit = KINDS[kind]
    u = f" {unit}" if unit else ""
    if not math.isfinite(value):
        raise ScenarioError(f"must be finite, got {value}{u} after unit scaling", file=file, field=field)
    if value == 0 and zero_ok:
        return value
    if value < lo:
        allowed = "0 or " if zero_ok else ""
        raise ScenarioError(f"{value:g}{u} after unit scaling is not physical: must be {allowed}>= {lo:g}{u}",
                            file=file, field=field)
    if value > hi:
        raise ScenarioError(f"{value:g}{u} after unit scaling is not physical: must be <= {hi:g}{u}",
                            file=file, field=field)
    return value


def check_finite(value: float, what: str, *, file=None, field: str | None = None) -> float:
    """A derived quantity (a duration, a byte count) checked finite before use.

    Raises:
        ScenarioError: naming ``what``: the inputs give an infinite or NaN value.
    """
    if not math.isfinite(value):
        raise ScenarioError(f"{what} is not finite ({value}): the inputs are out of any physical range",
                            file=file, field=field)
    return value


def check_tokens(values: Iterable[int], flag: str, *, file=None) -> None:
    """Token counts (``-p``, ``-n``, ``-d``, ``-b``, ``-ub``, a test's size) within :data:`TOKENS_MAX`.

    Raises:
        ScenarioError: naming ``flag``.
    """
    for v in values:
        if v > TOKENS_MAX:
            raise ScenarioError(f"{v} tokens is more than the simulator's limit of {TOKENS_MAX} "
                                "(16x the longest context of a released model)", file=file, field=flag)


def check_text_input(path: str | Path, *, file=None, field: str | None = None) -> Path:
    """An input text file (TOML, CSV table, routing trace) is a regular file of bounded size
    (:data:`TEXT_INPUT_MAX_BYTES`); ``/dev/zero``, a FIFO or a folder are refused before any read.

    Raises:
        ScenarioError: naming the file (or ``file`` and ``field`` when given).
    """
    p = Path(path)
    where = dict(file=file if file is not None else p, field=field)
    pre = f"{p}: " if file is not None else ""
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise ScenarioError(f"{pre}file not found", **where) from None
    except OSError as exc:
        raise ScenarioError(f"{pre}cannot read: {exc.strerror}", **where) from None
    if stat.S_ISDIR(st.st_mode):
        raise ScenarioError(f"{pre}is a directory, expected a file", **where)
    if not stat.S_ISREG(st.st_mode):
        raise ScenarioError(f"{pre}not a regular file (a device, FIFO or socket cannot be an input)", **where)
    if st.st_size > TEXT_INPUT_MAX_BYTES:
        raise ScenarioError(f"{pre}{st.st_size} bytes is larger than the {TEXT_INPUT_MAX_BYTES // 2**20} MiB "
                            "limit of a text input", **where)
    return p


def check_depth(data, *, file=None) -> None:
    """Nesting depth of parsed TOML data at most :data:`TOML_DEPTH_MAX` (checked without recursion).

    Raises:
        ScenarioError: naming the file.
    """
    stack = [(data, 0)]
    while stack:
        obj, d = stack.pop()
        if d > TOML_DEPTH_MAX:
            raise ScenarioError(f"nested more than {TOML_DEPTH_MAX} levels deep", file=file)
        if isinstance(obj, dict):
            stack.extend((v, d + 1) for v in obj.values())
        elif isinstance(obj, list):
            stack.extend((v, d + 1) for v in obj)


#: fixed work of one plan (a variant's test, one repetition) or one build context, in
#: graph-layers built op by op (~62 us each, WORK_MAX), whether the variant is memoised or not:
#: drawing the routing, building and timing a test's graph templates and summarising it cost
#: 2.9-4.8 ms a plan whatever its length (`prefetch-sim run -m scenarios/models/qwen3-30b-a3b.toml
#: -ngl 99 -ncmoe 0 -p 1-200+1 -n 0 -r 5 --variant baseline`: 5.8 s for 1000 plans, -r 1: 1.6 s for
#: 200, on the 2-core CI machine, 2026-12-07); counted x1/MEMO_WORK_DIVISOR as the graphs are, a
#: sweep of 8192 one-graph prompts had been estimated at a tenth of the budget and ran 4 minutes
PLAN_OVERHEAD_UNITS = 80


#: an MoE prompt in ubatches of 2 to this many tokens draws a different expert count per layer in
#: nearly every graph, so the memoised path builds each of its graphs anew (:func:`work_units`):
#: at 512 tokens a 128-expert top-8 layer leaves an expert unused with probability e^-32
MOE_DISTINCT_UBATCH_MAX = 511


#: a prompt graph built op by op (a variant with an expert cache) costs about twice a decode
#: graph's graph-layer: `prefetch-sim run -p 2000 -n 0 -ub 1 -r 1 --variant cache_lru` 14.6 s
#: against `-p 0 -n 2000` 7.8 s (the same 96,000 graph-layers), on the 2-core CI machine,
#: 2026-12-07 (fresh-user round 9: `-p 10000 -ub 1 -r 1 --variant cache_lru` passed the budget
#: and ran 48-67 s in 3.7 GB)
OP_PROMPT_FACTOR = 2.0


def work_units(tests, n_layer: int, n_ubatch: int, n_batch: int, repetitions: int, n_variants: float,
               *, moe_variants: float | None = None, plans: float | None = None, op_variants: float = 0.0) -> int:
    """Work of one setting: (graphs built (a pp test: its ubatches, a tg test: one per token)
    x layers x the variants' share + :data:`PLAN_OVERHEAD_UNITS` x plans) x repetitions, plus one
    context per plan.

    ``n_variants``: the variants' share of the graphs (:func:`variant_work`); ``plans``: the
    variants themselves, each a plan per test and repetition whatever its share (default
    ``n_variants``: a command that builds every plan op by op); ``moe_variants``: given for an MoE
    model, the variant count that its prompt graphs of 2 to :data:`MOE_DISTINCT_UBATCH_MAX` tokens
    count with instead (each such graph is built anew by every variant: a prompt of 10**4 ubatches
    of 2 tokens took 27 s where its estimate was a hundredth of that); ``op_variants``: how many of
    the variants are built op by op (:func:`op_by_op_variants`), whose prompt graphs count
    :data:`OP_PROMPT_FACTOR` times."""
    ub = max(1, min(n_ubatch, n_batch))
    distinct = moe_variants is not None and 2 <= ub <= MOE_DISTINCT_UBATCH_MAX
    n_plans = max(0.0, n_variants if plans is None else plans)
    total = PLAN_OVERHEAD_UNITS * n_plans
    for t in tests:
        graphs = -(-t.n_prompt // ub) if t.n_prompt else t.n_gen
        share = moe_variants if distinct and t.n_prompt else n_variants
        if t.n_prompt:
            share += (OP_PROMPT_FACTOR - 1.0) * max(0.0, op_variants)
        total += (graphs * max(1, n_layer) * max(0.0, share) + PLAN_OVERHEAD_UNITS * n_plans) * max(1, repetitions)
    return int(math.ceil(total))


def op_by_op_variants(variants, hardware) -> float:
    """How many of ``variants`` are built op by op (an expert cache, or every variant of a profile
    in executor mode: not memoised, :func:`sim.plan.memo.memo_eligible`)."""
    if getattr(hardware, "executor_mode", False):
        return float(len(variants))
    return float(sum(1 for v in variants if getattr(v, "expert_cache", "none") != "none"))


def variant_work(variants, hardware) -> float:
    """The variants' share of a setting's work, for :func:`work_units`' ``n_variants``: 1 for a
    variant built op by op (an expert cache, or a profile in executor mode: not memoised,
    :func:`sim.plan.memo.memo_eligible`), ``1 / MEMO_WORK_DIVISOR`` for any other."""
    if getattr(hardware, "executor_mode", False):
        return float(len(variants))
    return sum(1.0 if getattr(v, "expert_cache", "none") != "none" else 1.0 / MEMO_WORK_DIVISOR for v in variants)


#: default budget of ``trace`` and ``check``, which keep every op of every plan (a trace row, a
#: hazard check's event lists: about 1.2 kB of memory per op, some 25 ops per graph-layer), in
#: graph-layers counted x1 per variant: tg1000 of a 48-layer model, about 1.2 M ops and 1.5-1.8 GB
#: (1.76 GB resident for `trace -n 1000 --test tg1000 --variant baseline`, fresh-user round 10)
#: (`trace -n 10000` took 14 GB and wrote a 2 GB JSON under the run budget); raised with --max-work
EXPANDED_WORK_MAX = 50_000


def check_work(work: int, budget: int | None, flag: str = "--max-work", *, expanded: bool = False,
               at_least: bool = False) -> None:
    """Refuse a command whose work (:func:`work_units`) exceeds ``budget`` (default
    :data:`WORK_MAX`; :data:`EXPANDED_WORK_MAX` for a command that keeps every op, ``expanded``);
    ``at_least``: ``work`` is a partial sum already over the budget (the message says "more than").

    Raises:
        ScenarioError: naming ``flag``, the estimate and the budget.
    """
    budget = (EXPANDED_WORK_MAX if expanded else WORK_MAX) if budget is None else budget
    if work > budget:
        how = ("graphs x layers x variants: every op of every plan is kept" if expanded else
               f"graphs x layers x repetitions x settings, x1 per variant with an expert cache (x2 its prompt graphs), "
               f"x1/{MEMO_WORK_DIVISOR} per other variant, plus {PLAN_OVERHEAD_UNITS} per test, repetition and "
               f"variant")
        raise ScenarioError(f"this run would cost {'more than ' if at_least else ''}{work:,} graph-layers of work "
                            f"({how}), over the budget of "
                            f"{budget:,}; shorten the tests or raise {flag}", field=flag)
