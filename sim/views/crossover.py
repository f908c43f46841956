"""Crossover sweeps and plots (``prefetch-sim crossover``).

A sweep runs one llama-bench test of a scenario under several variants at every point of one
or two *axes* and reports, per point and variant, t/s, TTFT, bytes, VRAM and the speedup vs the
baseline variant. A **crossover** is where a variant's speedup vs baseline crosses 1.0: found
by linear interpolation between neighbouring sweep points (:func:`find_crossovers`). Two-axis
sweeps give a heatmap of the speedup with the 1.0 contour.

Axes (:data:`AXES`):

=======  ==============================================================================
ubatch   ``-ub``: tokens per ubatch (``n_batch`` is raised to it when smaller)
depth    ``-d``: tokens already in the KV cache
prompt   ``-p``: prompt length of a pp test
gate     MoE-batch gate threshold of the ``prefetch_gated_<N>`` variants (others unchanged); 0 is
         ungated prefetch (llama-bench's ``-pwg 0``, ``prefetch_gated_0``)
slots    staging slot count of the ``slots<N>`` variants (others unchanged)
cache    GPU expert-cache capacity in experts (``placement.expert_cache_experts``) of the
         variants with a cache; 0 runs them without a cache (others unchanged)
pcie     pinned H2D bandwidth in GB/s (10**9 B/s), latency kept (``hardware.h2d_pinned``)
ngl      ``-ngl``: layers offloaded to the GPU as llama.cpp counts them, the output layer first, then
         the blocks from the last (``placement.ngl``)
ncmoe    ``-ncmoe``: blocks whose experts stay on the host (``placement.n_cpu_moe``; turns off
         ``fit_experts``)
fa       ``-fa``: FlashAttention off (0, off) or on (1, on) (``placement.flash_attn``)
kv       ``-ctk``/``-ctv``: the KV cache type of K and V, by name (``f16,q8_0,q4_0``); the CSV
         column and the plot show its bytes per element (``model.kv_bytes_per_elem``)
=======  ==============================================================================

``ctx_size`` is raised to ``depth + tokens`` of the test when a point needs more (llama-bench
sizes its context to the test), which adds KV bytes to the VRAM accounting.

Sweep points run in parallel in worker processes (:class:`sim.cli.interrupt.WorkerPool`, a
:class:`concurrent.futures.ProcessPoolExecutor` that Ctrl-C stops at once, one task per point and
variant). Every cell is a pure function of its inputs (routing draws from
:func:`sim.engines.metrics.rep_rng` of the scenario seed), so a parallel sweep is identical to a serial
one. A point where a variant does not fit in VRAM is kept as a row with NaN metrics and the
placement error in ``error``.

``--figure`` builds the built-in figures (:data:`FIGURES`) that answer the questions reviewers
ask; ``docs/crossover.md`` shows them with the commands that made them.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import re
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from sim.errors import PlacementError, ScenarioError
from sim.cli.interrupt import WorkerPool
from sim.resources import shipped
from sim.model.specs import BenchTest, LinkSpec, Scenario, Variant, load_scenario, parse_variant
from sim.units import GB, GiB
from sim.wording import plural


# ----------------------------------------------------------------------------------------
# axes
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AxisSpec:
    """One sweepable quantity.

    Attributes:
        name: the name used on the command line (``ubatch``).
        column: CSV column of its value, with the unit in the name (``n_ubatch``).
        label: axis label for plots.
        integer: values are integers.
        min_value: smallest accepted value.
        log: plotted on a log scale when the values span a factor >= 8.
    """

    name: str
    column: str
    label: str
    integer: bool = True
    min_value: float = 1
    log: bool = True
    max_value: float = math.inf


#: the sweepable axes, by command-line name
AXES: dict[str, AxisSpec] = {a.name: a for a in (
    AxisSpec("ubatch", "n_ubatch", "ubatch (tokens)"),
    AxisSpec("depth", "n_depth", "KV depth (tokens)", min_value=0),
    AxisSpec("prompt", "n_prompt", "prompt length (tokens)"),
    # 0 (and 1): never gated, the ungated prefetch (the patch's -pwg 0), the left end of a gate sweep
    AxisSpec("gate", "gate_min_batch", "MoE batch gate threshold (tokens)", min_value=0),
    AxisSpec("slots", "expert_slots", "staging slots", log=False),
    AxisSpec("cache", "cache_experts_requested", "expert cache capacity (experts)", min_value=1, log=False),
    AxisSpec("pcie", "h2d_pinned_gb_per_s", "pinned H2D bandwidth (GB/s)", integer=False, min_value=0),
    AxisSpec("ngl", "n_gpu_layers", "-ngl (layers on the GPU)", min_value=0, log=False),
    AxisSpec("ncmoe", "n_cpu_moe_requested", "-ncmoe (blocks with host experts)", min_value=0, log=False),
    AxisSpec("fa", "flash_attn", "-fa (FlashAttention)", min_value=0, max_value=1, log=False),
    AxisSpec("kv", "kv_bytes_per_elem", "KV cache bytes per element (-ctk/-ctv)", integer=False, min_value=0,
             log=False),
)}


@dataclass(frozen=True)
class Axis:
    """An axis with its sweep values (sorted, unique).

    Attributes:
        spec: what is swept.
        values: the values, ascending (ints for integer axes; GB/s for ``pcie``).
    """

    spec: AxisSpec
    values: tuple
    #: what the values given became (``fa=auto``: on; ``ngl=-1``: every layer), said before the sweep
    note: str = ""

    @property
    def name(self) -> str:
        return self.spec.name

    def __len__(self) -> int:
        return len(self.values)


def parse_axis(text: str, flag: str = "--axis") -> Axis:
    """Parse ``NAME=V1,V2,...``. Integer axes also take llama-bench ranges (``32-2048*2``,
    ``1-6``, ``0-512+64``).

    Raises:
        ScenarioError: unknown axis name, malformed or out-of-range values; names ``flag``.
    """
    if "=" not in text:
        raise ScenarioError(f"expected NAME=V1,V2,... (axes: {', '.join(AXES)}), got '{text}'", field=flag)
    name, _, vals = text.partition("=")
    name = name.strip().lower()
    spec = AXES.get(name)
    if spec is None:
        raise ScenarioError(f"unknown axis '{name}' (use one of: {', '.join(AXES)})", field=flag)
    values: list[float] = []
    note = ""
    if spec.name == "kv":
        from sim.views.llamabench import FA_KV_UNSUPPORTED, KV_TYPES, kv_bytes_per_elem

        names = [v.strip().lower() for v in vals.split(",") if v.strip()]
        unknown = [n for n in names if n not in KV_TYPES]
        if unknown:
            raise ScenarioError(f"axis 'kv': unknown KV cache type '{unknown[0]}' (use one of: {', '.join(KV_TYPES)})",
                                field=flag)
        if any(n in FA_KV_UNSUPPORTED for n in names):  # run refuses it with -fa on: not modelled
            raise ScenarioError(f"axis 'kv': {', '.join(sorted(set(names) & set(FA_KV_UNSUPPORTED)))} is not modelled "
                                "(FlashAttention has no ggml-cuda kernel for it: llama.cpp runs the attention on "
                                "the CPU); sweep the other types", field=flag)
        values = [kv_bytes_per_elem(n, n) for n in names]
    elif spec.name == "fa":
        # llama-bench's -fa spellings (run -fa on|off|auto) as well as 0/1/-1; auto is on, as in
        # run (llama.cpp turns FlashAttention on where the GPU supports it, as a CUDA GPU does)
        words = {"on": 1, "off": 0, "auto": 1, "1": 1, "0": 0, "-1": 1}
        names = [v.strip().lower() for v in vals.split(",") if v.strip()]
        if not names:
            raise ScenarioError("axis 'fa' has no values (use on, off, auto, 0, 1 or -1)", field=flag)
        bad = [n for n in names if n not in words]
        if bad:
            raise ScenarioError(f"axis 'fa': '{bad[0]}' is not on, off, auto, 0, 1 or -1", field=flag)
        values = [words[n] for n in names]
        if any(n in ("auto", "-1") for n in names):
            note = ("axis fa: auto is simulated as on (llama.cpp turns FlashAttention on for a CUDA GPU that "
                    "supports it)" + ("; on and auto are one cell" if any(n in ("on", "1") for n in names) else ""))
    elif spec.name == "ngl" and any(v.strip().startswith("-") for v in vals.split(",")):
        # llama-bench's default -ngl -1: every layer and the output (run takes it as well)
        from sim.model.specs import sim_ngl

        try:
            values = [sim_ngl(int(v)) for v in vals.split(",") if v.strip()]
        except ValueError:
            raise ScenarioError(f"axis 'ngl': expected integers like -1,0,24,99 (a negative value: every layer, "
                                f"as llama-bench's -ngl -1), got '{vals}'", field=flag) from None
        note = "axis ngl: a negative value is every layer and the output (llama-bench's -ngl -1), the cell ngl 999"
    elif spec.integer:
        from sim.cli import _int_list

        try:
            values = list(_int_list(vals))
        except argparse.ArgumentTypeError as exc:
            raise ScenarioError(f"axis '{name}': {exc}", field=flag) from None
    else:
        try:
            values = [float(v) for v in vals.split(",") if v.strip()]
        except ValueError:
            raise ScenarioError(f"axis '{name}': expected numbers like 8,16,32, got '{vals}'", field=flag) from None
    if not values:
        raise ScenarioError(f"axis '{name}' has no values", field=flag)
    bad = [v for v in values if not (v >= spec.min_value) or (not spec.integer and v <= 0) or not math.isfinite(v)
           or v > spec.max_value]
    if bad:
        lim = f"> {spec.min_value:g}" if not spec.integer else f">= {spec.min_value:g}"
        if math.isfinite(spec.max_value):
            lim += f" and <= {spec.max_value:g}"
        raise ScenarioError(f"axis '{name}': values must be finite and {lim}, got {_fmt(bad[0])}", field=flag)
    from sim.bounds import COUNT_MAX, INT32_MAX, LIST_VALUES_MAX, TOKENS_MAX, check_kind

    if len(values) > LIST_VALUES_MAX:
        raise ScenarioError(f"axis '{name}': {len(values)} values, more than the limit of {LIST_VALUES_MAX}",
                            field=flag)
    top = {"ubatch": TOKENS_MAX, "depth": TOKENS_MAX, "prompt": TOKENS_MAX, "gate": TOKENS_MAX,
           "slots": COUNT_MAX, "cache": INT32_MAX}.get(name)
    for v in values:
        if top is not None and v > top:
            raise ScenarioError(f"axis '{name}': {_fmt(v)} is more than the limit of {top}", field=flag)
        if name == "pcie":
            check_kind(v * 1e9, "bytes_per_s", field=f"{flag} {name}")
    return Axis(spec, tuple(sorted(set(values))), note)


_TEST_RE = re.compile(r"^\s*(pp|tg)(\d+)(?:\s*@\s*d(\d+))?\s*$")


def parse_test(text: str, flag: str = "--test") -> BenchTest:
    """Parse a llama-bench test name: ``pp512``, ``tg128``, ``pp512 @ d8192``.

    Raises:
        ScenarioError: malformed name, naming ``flag``.
    """
    m = _TEST_RE.match(text.lower())
    if not m or int(m[2]) < 1:
        raise ScenarioError(f"expected a test like pp512, tg128 or 'pp512 @ d8192', got '{text}'", field=flag)
    if len(m[2]) > 12 or len(m[3] or "") > 12:
        raise ScenarioError(f"'{text}': too many tokens", field=flag)
    n, d = int(m[2]), int(m[3] or 0)
    from sim.bounds import check_tokens

    check_tokens([n], flag)
    check_tokens([d], flag)
    check_tokens([n + d], f"{flag} (depth + tokens, the context)")
    return BenchTest(n, 0, d) if m[1] == "pp" else BenchTest(0, n, d)


def check_axes(axes: Sequence[Axis], variants: Sequence[Variant], test: BenchTest,
               flags: Sequence[str] = ("--axis", "--axis2")) -> None:
    """Reject sweeps that cannot change anything: a ``gate`` axis without a gated variant,
    ``slots`` without a slots variant, ``cache`` without a cache variant, ``prompt`` on a tg
    test, the same axis twice.

    Raises:
        ScenarioError: naming the offending flag.
    """
    seen: set[str] = set()
    for ax, flag in zip(axes, flags):
        if ax.name in seen:
            raise ScenarioError(f"axis '{ax.name}' is swept twice", field=flag)
        seen.add(ax.name)
        need = {
            "gate": (lambda v: v.gate_min_batch is not None, "a gated variant (prefetch_gated_<N>)"),
            "slots": (lambda v: v.expert_slots > 0, "a slots variant (slots<N>)"),
            "cache": (lambda v: v.expert_cache != "none", "a variant with an expert cache (cache_lru)"),
        }.get(ax.name)
        if need and not any(need[0](v) for v in variants):
            raise ScenarioError(f"axis '{ax.name}' needs {need[1]} among --variant", field=flag)
        if ax.name == "prompt" and not test.n_prompt:
            raise ScenarioError(f"axis 'prompt' needs a pp test, got {test.name} (use --test pp512)", field=flag)


def apply_point(scn: Scenario, variants: Sequence[Variant], test: BenchTest,
                settings: Sequence[tuple[str, float]]) -> tuple[Scenario, list[Variant], BenchTest]:
    """The scenario, variants and test at one sweep point.

    Args:
        settings: ``(axis name, value)`` pairs, applied in order.

    Returns:
        ``(scenario, variants, test)`` with the axis values set (variant names unchanged), and
        ``ctx_size`` raised to ``n_depth + n_tokens`` of the test if it was smaller.

    Raises:
        ScenarioError: an unknown axis name.
    """
    variants = list(variants)
    for name, value in settings:
        if name == "ubatch":
            wl = scn.workload
            scn = scn.with_(workload=replace(wl, n_ubatch=int(value), n_batch=max(wl.n_batch, int(value))))
        elif name == "depth":
            test = replace(test, n_depth=int(value))
        elif name == "prompt":
            test = replace(test, n_prompt=int(value), n_gen=0)
        elif name == "gate":
            variants = [replace(v, gate_min_batch=int(value)) if v.gate_min_batch is not None else v
                        for v in variants]
        elif name == "slots":
            variants = [replace(v, expert_slots=int(value)) if v.expert_slots > 0 else v for v in variants]
        elif name == "cache":
            if int(value) == 0:
                variants = [replace(v, expert_cache="none") for v in variants]
            else:
                scn = scn.with_(placement=replace(scn.placement, expert_cache_experts=int(value)))
        elif name == "ngl":
            scn = scn.with_(placement=replace(scn.placement, ngl=int(value)))
        elif name == "ncmoe":
            model = scn.model
            if model.moe is None:
                raise ScenarioError(f"axis 'ncmoe': model '{model.name}' has no experts", field="--axis")
            # past the model's blocks every expert is on the host (llama.cpp, and prefetch-sim run)
            scn = scn.with_(placement=replace(scn.placement, n_cpu_moe=min(int(value), model.n_layer),
                                              fit_experts=False))
        elif name == "fa":
            scn = scn.with_(placement=replace(scn.placement, flash_attn=bool(int(value))))
        elif name == "kv":
            scn = scn.with_(model=replace(scn.model, kv_bytes_per_elem=float(value)))
        elif name == "pcie":
            hw = scn.hardware
            old = hw.h2d_pinned
            link = LinkSpec(bytes_per_s=float(value) * GB, latency_s=old.latency_s, host_blocking=old.host_blocking)
            scn = scn.with_(hardware=hw.with_(h2d_pinned=link))
        else:
            raise ScenarioError(f"unknown axis '{name}' (use one of: {', '.join(AXES)})", field="--axis")
    if any(n == "kv" for n, _ in settings) and scn.model.kv_bytes_per_elem < 2.0 and not scn.placement.flash_attn:
        # llama.cpp refuses a quantised V cache without FlashAttention (llama_init_from_model)
        names = [n for n, _ in settings]
        raise ScenarioError("a quantised KV cache needs FlashAttention (-fa 1): llama.cpp refuses a quantised V "
                            "cache with -fa off; sweep 'fa' with kv=f16 only",
                            field="--axis2" if names.index("kv") == 1 else "--axis")
    need_ctx = test.n_depth + test.n_tokens
    if scn.placement.ctx_size < need_ctx:
        scn = scn.with_(placement=replace(scn.placement, ctx_size=need_ctx))
    return scn, variants, test


# ----------------------------------------------------------------------------------------
# results
# ----------------------------------------------------------------------------------------

#: CSV columns after the axis columns
CSV_COLUMNS: tuple[str, ...] = (
    "variant", "test", "tps_mean", "tps_std", "speedup_vs_baseline", "ttft_s", "h2d_bytes",
    "staging_bytes", "peak_vram_bytes", "cache_experts", "cache_hit_rate", "n_cpu_moe",
    "exposed_transfer_s", "overlap_fraction", "error",
)

_NAN = float("nan")


@dataclass(frozen=True)
class CellResult:
    """One (sweep point, variant) cell. Metrics are NaN where they do not apply (``ttft_s``
    of a tg test, ``cache_hit_rate`` without a cache) or when the variant does not fit.

    Attributes:
        index: position of the point on each axis.
        point: the axis values.
        variant: variant label.
        test: test name at this point (``pp2048 @ d8192``).
        tps_mean, tps_std: t/s over repetitions (mean, sample std).
        ttft_s: time to first token, seconds.
        h2d_bytes: bytes copied host→device per run.
        staging_bytes: staging VRAM per GPU (max over GPUs), bytes.
        peak_vram_bytes: VRAM use of the fullest GPU, bytes.
        cache_experts: expert cache capacity actually allotted (all GPUs), experts.
        cache_hit_rate: expert cache hit rate.
        n_cpu_moe: ``n_cpu_moe`` of the placement (after ``fit_experts``), -1 if it did not fit.
        exposed_transfer_s: H2D time not hidden behind compute, seconds per run.
        overlap_fraction: share of H2D time overlapped by compute.
        error: the placement error when the variant does not fit at this point, else "".
    """

    index: tuple[int, ...]
    point: tuple
    variant: str
    test: str
    tps_mean: float
    tps_std: float
    ttft_s: float
    h2d_bytes: float
    staging_bytes: float
    peak_vram_bytes: float
    cache_experts: int
    cache_hit_rate: float
    n_cpu_moe: int
    exposed_transfer_s: float
    overlap_fraction: float
    error: str = ""


@dataclass(frozen=True)
class Crossover:
    """A point where a variant's speedup vs baseline crosses 1.0.

    Attributes:
        variant: the variant.
        axis: the axis along which it crosses.
        value: interpolated axis value of the crossing (linear between ``lo`` and ``hi``).
        lo, hi: the neighbouring sweep values that bracket it.
        gains_above: True if the variant beats the baseline above ``value`` (it starts to
            pay), False if it loses above it.
        fixed: ``(other axis, value)`` for two-axis sweeps, else None.
    """

    variant: str
    axis: str
    value: float
    lo: float
    hi: float
    gains_above: bool
    fixed: tuple[str, float] | None = None

    def describe(self, baseline: str = "baseline") -> str:
        side = "pays above" if self.gains_above else "pays below"
        at = f" (at {self.fixed[0]}={_fmt(self.fixed[1])})" if self.fixed else ""
        spec = AXES.get(self.axis)
        # an integer axis (tokens, layers, slots) crosses at a whole value: the interpolation, rounded
        where = (f"~{round(self.value)}" if spec is not None and spec.integer and math.isfinite(self.value)
                 else f"{self.value:.4g}")
        return (f"{self.variant} vs {baseline}: speedup crosses 1.0 at {self.axis} = {where}"
                f"{at}, between {_fmt(self.lo)} and {_fmt(self.hi)}; {side}")


def _fmt(v: float) -> str:
    """An axis value as a user typed it: an integral value in full (a depth of 16777216, not
    1.67772e+07), others in ``g`` format."""
    v = float(v)
    return str(int(v)) if v.is_integer() and abs(v) < 1e18 else f"{v:g}"


#: speedups within this share of 1.0 count as no effect in :func:`find_crossovers` (0.01 %): a
#: modelled difference far below what llama-bench can resolve (its repetitions spread by ~1 %)
#: must not make a crossover, e.g. a prefetch variant's event records on a one-token ubatch
#: (speedup 0.9999983) beside exact ties
SPEEDUP_RTOL = 1e-4


def find_crossovers(x, y, level: float = 1.0, rtol: float = SPEEDUP_RTOL) -> list[tuple[float, float, float, bool]]:
    """Where the series ``y(x)`` crosses ``level``, by linear interpolation.

    Points whose ``y`` is within ``rtol * level`` of the level count as *on* it (default
    :data:`SPEEDUP_RTOL`). A crossing is
    a change of side between two consecutive points off the level: between neighbours the
    value is ``x_a + (level - y_a) (x_b - x_a) / (y_b - y_a)``; if points on the level lie
    between them, it is the middle of those points. NaN points are skipped; a series that only
    touches the level (or stays on it) has no crossing.

    Args:
        x: (n,) axis values, ascending.
        y: (n,) values (speedups).

    Returns:
        ``(value, lo, hi, rises)`` per crossing, in ascending ``x``; ``rises`` is True when
        ``y`` goes from below to above the level.

    Raises:
        ValueError: ``x`` and ``y`` differ in length or ``x`` is not ascending.
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"x and y must be 1-D of equal length, got {x.shape} and {y.shape}")
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if np.any(np.diff(x) <= 0):
        raise ValueError("x must be strictly ascending")
    d = y - level
    side = np.where(np.abs(d) <= rtol * abs(level), 0, np.sign(d)).astype(int)
    off = np.flatnonzero(side)
    out = []
    for a, b in zip(off[:-1], off[1:]):
        if side[a] == side[b]:
            continue
        if b == a + 1:
            xc = x[a] + (level - y[a]) * (x[b] - x[a]) / (y[b] - y[a])
        else:
            xc = 0.5 * (x[a + 1] + x[b - 1])
        out.append((float(xc), float(x[a]), float(x[b]), bool(side[b] > 0)))
    return out


@dataclass(frozen=True)
class SweepResult:
    """All cells of a sweep.

    Attributes:
        scenario: scenario name.
        scenario_file: its file (or None).
        test: the base test name (axes may change its prompt/depth per point).
        axes: one or two axes.
        variants: variant labels, baseline first.
        baseline: the baseline's label.
        cells: point-major (first axis slowest), variant-minor.
        variant_specs: label -> the variant as given, before any axis changed it.
    """

    scenario: str
    scenario_file: str | None
    test: str
    axes: tuple[Axis, ...]
    variants: tuple[str, ...]
    baseline: str
    cells: tuple[CellResult, ...]
    variant_specs: dict = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(a) for a in self.axes)

    @property
    def test_label(self) -> str:
        """The test name with the swept parts shown as placeholders (``pp<prompt> @ d8192``)."""
        swept = {a.name for a in self.axes}
        m = _TEST_RE.match(self.test.lower())
        if not m:
            return self.test
        kind, n, d = m[1], m[2], int(m[3] or 0)
        label = f"{kind}<prompt>" if "prompt" in swept else f"{kind}{n}"
        if "depth" in swept:
            return label + " @ d<depth>"
        return f"{label} @ d{d}" if d else label

    def metric(self, variant: str | Variant, name: str) -> np.ndarray:
        """Array of shape :attr:`shape` of one :class:`CellResult` field for ``variant`` (its
        label, or the :class:`~sim.model.specs.Variant` itself).

        Raises:
            KeyError: no such variant in the sweep."""
        variant = getattr(variant, "name", variant)
        if variant not in self.variants:
            raise KeyError(f"no variant '{variant}' in this sweep (have {', '.join(self.variants)})")
        out = np.full(self.shape, np.nan)
        for c in self.cells:
            if c.variant == variant:
                out[c.index] = float(getattr(c, name))
        return out

    def speedup(self, variant: str | Variant) -> np.ndarray:
        """``tps_mean(variant) / tps_mean(baseline)`` per point, shape :attr:`shape` (``variant``:
        its label or the :class:`~sim.model.specs.Variant`)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.metric(variant, "tps_mean") / self.metric(self.baseline, "tps_mean")

    def to_dataframe(self) -> pd.DataFrame:
        """One row per cell: the axis columns (:attr:`AxisSpec.column`) then :data:`CSV_COLUMNS`."""
        sp = {v: self.speedup(v) for v in self.variants}
        rows = []
        for c in self.cells:
            row = {ax.spec.column: val for ax, val in zip(self.axes, c.point)}
            row.update(variant=c.variant, test=c.test, tps_mean=c.tps_mean, tps_std=c.tps_std,
                       speedup_vs_baseline=float(sp[c.variant][c.index]), ttft_s=c.ttft_s,
                       h2d_bytes=c.h2d_bytes, staging_bytes=c.staging_bytes,
                       peak_vram_bytes=c.peak_vram_bytes, cache_experts=c.cache_experts,
                       cache_hit_rate=c.cache_hit_rate, n_cpu_moe=c.n_cpu_moe,
                       exposed_transfer_s=c.exposed_transfer_s, overlap_fraction=c.overlap_fraction,
                       error=c.error)
            rows.append(row)
        cols = [a.spec.column for a in self.axes] + list(CSV_COLUMNS)
        return pd.DataFrame(rows, columns=cols)

    def crossovers(self) -> list[Crossover]:
        """Crossings of speedup 1.0 of every non-baseline variant, along the first axis (for
        each value of the second), then along the second axis (for each value of the first)."""
        out: list[Crossover] = []
        for v in self.variants:
            if v == self.baseline:
                continue
            s = self.speedup(v)
            if len(self.axes) == 1:
                for val, lo, hi, up in find_crossovers(self.axes[0].values, s):
                    out.append(Crossover(v, self.axes[0].name, val, lo, hi, up))
                continue
            a0, a1 = self.axes
            for j, fixed in enumerate(a1.values):
                for val, lo, hi, up in find_crossovers(a0.values, s[:, j]):
                    out.append(Crossover(v, a0.name, val, lo, hi, up, (a1.name, fixed)))
            for i, fixed in enumerate(a0.values):
                for val, lo, hi, up in find_crossovers(a1.values, s[i, :]):
                    out.append(Crossover(v, a1.name, val, lo, hi, up, (a0.name, fixed)))
        return out


# ----------------------------------------------------------------------------------------
# running a sweep
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Job:
    index: tuple[int, ...]
    point: tuple
    scn: Scenario
    variant: Variant
    test: BenchTest
    repetitions: int
    engine: str


def _run_cell(job: _Job) -> CellResult:
    """Evaluate one cell (runs in a worker process; a pure function of ``job``)."""
    from sim.engines.metrics import run_variant_test

    try:
        r = run_variant_test(job.scn, job.variant, job.test, job.repetitions, job.engine)
    except PlacementError as exc:
        text = str(exc)
        if exc.file:   # the scenario as the user named it from the working folder, not its absolute path
            try:
                text = text.replace(exc.file, str(Path(exc.file).resolve().relative_to(Path.cwd().resolve())))
            except ValueError:
                pass
        return CellResult(job.index, job.point, job.variant.name, job.test.name, _NAN, _NAN, _NAN, _NAN,
                          _NAN, _NAN, 0, _NAN, -1, _NAN, _NAN, error=text)
    return CellResult(
        index=job.index, point=job.point, variant=r.variant, test=r.test, tps_mean=r.tps_mean,
        tps_std=r.tps_std, ttft_s=_NAN if r.ttft_s is None else float(r.ttft_s),
        h2d_bytes=float(r.h2d_bytes), staging_bytes=float(r.staging_bytes),
        peak_vram_bytes=float(r.peak_vram_bytes), cache_experts=int(sum(v.cache_experts for v in r.vram)),
        cache_hit_rate=_NAN if r.cache_hit_rate is None else float(r.cache_hit_rate),
        n_cpu_moe=int(r.n_cpu_moe), exposed_transfer_s=float(r.exposed_transfer_s),
        overlap_fraction=float(r.overlap_fraction))


#: the jobs of the sweep running now, read by forked worker processes (:func:`_run_shared_cell`)
_SHARED_JOBS: list[_Job] | None = None


def _run_shared_cell(k: int) -> CellResult:
    """:func:`_run_cell` of job ``k`` of the running sweep (in a worker forked by :func:`sweep`)."""
    assert _SHARED_JOBS is not None, "a shared sweep cell outside a forked worker"
    return _run_cell(_SHARED_JOBS[k])


def _same_cells(work: Sequence[_Job]) -> list[int]:
    """Per job, the index of the first job with the same inputs (the same scenario object,
    variant, test, repetitions and engine): its cell's numbers are that job's."""
    seen: dict = {}
    out = []
    for k, j in enumerate(work):
        try:
            key = (id(j.scn), j.variant, j.test, j.repetitions, j.engine)
            out.append(seen.setdefault(key, k))
        except TypeError:  # an unhashable field: no sharing
            out.append(k)
    return out


def default_jobs() -> int:
    """Cores this process may use (``os.sched_getaffinity``, else ``os.cpu_count()``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not on Linux
        return max(1, os.cpu_count() or 1)


def with_baseline(variants: Sequence[Variant], baseline: str = "baseline") -> list[Variant]:
    """``variants`` with the one named ``baseline`` first; a plain baseline is added when none
    is named so."""
    vs = list(variants)
    base = [v for v in vs if v.name == baseline]
    if base:
        return base + [v for v in vs if v.name != baseline]
    if baseline != "baseline":
        # a plain upstream scheduler under another name would carry that name's rows and ratios
        raise ScenarioError(f"baseline '{baseline}' is none of the variants "
                            f"({', '.join(v.name for v in vs) or 'none given'})", field="baseline")
    return [Variant(name=baseline)] + vs


def cell_cost(job) -> float:
    """A rough relative cost of one sweep cell, to schedule the largest first: the graphs the
    memoised path builds (one per prompt ubatch, one for decode) or, with an expert cache (not
    memoised), every graph; times the repetitions and the layers."""
    t = job.test
    ub = max(1, job.scn.workload.n_ubatch)
    graphs = -(-t.n_prompt // ub)
    if t.n_gen:
        graphs += t.n_gen if job.variant.expert_cache != "none" else 1
    return float(graphs * job.repetitions * job.scn.model.n_layer)


def sweep(scn: Scenario, axes: Sequence[Axis], variants: Sequence[Variant], test: BenchTest, *,
          repetitions: int = 1, engine: str = "analytic", jobs: int | None = None,
          baseline: str = "baseline", progress: bool = False, max_work: int | None = None,
          prefetch_plots: bool = False) -> SweepResult:
    """Run ``test`` under every variant at every point of one or two axes.

    Args:
        scn: the scenario (its own variants are ignored; pass them as ``variants``).
        axes: one or two :class:`Axis`.
        variants: the variants; a plain ``baseline`` is added unless one is named ``baseline``.
        test: the base test (``prompt``/``depth`` axes change it per point).
        repetitions: runs per cell (routing draws), as llama-bench ``-r``.
        engine: ``"analytic"`` or ``"des"``.
        jobs: worker processes (None: every core; 1: in this process).
        baseline: label of the baseline variant.
        progress: show a tqdm progress bar on stderr.
        max_work: refuse the sweep when its cells' work (:func:`sim.bounds.work_units`) exceeds
            this budget (``--max-work``); None: no budget.
        prefetch_plots: the caller plots the result: import matplotlib in a background thread
            while worker processes run the cells (:func:`prefetch_plotting`).

    Returns:
        :class:`SweepResult`, identical whatever ``jobs``.

    Raises:
        ScenarioError: an axis that cannot apply to these variants or test (see
            :func:`check_axes`), or more than two axes.
    """
    axes = tuple(axes)
    if not 1 <= len(axes) <= 2:
        raise ScenarioError(f"sweep one or two axes, got {len(axes)}", field="--axis")
    if repetitions < 1:
        raise ScenarioError(f"must be >= 1, got {repetitions}", field="--repetitions")
    vs = with_baseline(variants, baseline)
    check_axes(axes, vs, test)
    grid = list(np.ndindex(*[len(a) for a in axes]))
    work: list[_Job] = []
    for idx in grid:
        point = tuple(a.values[i] for a, i in zip(axes, idx))
        s2, v2, t2 = apply_point(scn, vs, test, [(a.name, val) for a, val in zip(axes, point)])
        for var in v2:
            work.append(_Job(idx, point, s2, var, t2, repetitions, engine))
    if max_work is not None:
        from sim.bounds import check_work, op_by_op_variants, variant_work, work_units

        check_work(sum(work_units([j.test], j.scn.model.n_layer, j.scn.workload.n_ubatch, j.scn.workload.n_batch,
                                  repetitions, variant_work([j.variant], j.scn.hardware),
                                  moe_variants=1.0 if j.scn.model.moe is not None else None, plans=1.0,
                                  op_variants=op_by_op_variants([j.variant], j.scn.hardware))
                       for j in work), max_work)
    n_jobs = default_jobs() if jobs is None else max(1, int(jobs))
    results: list[CellResult | None] = [None] * len(work)
    # a cell whose inputs are those of an earlier one (an axis that leaves a variant as it is,
    # e.g. the baseline on a slots axis) is evaluated once: same scenario object, variant, test
    first_of = _same_cells(work)
    todo = sorted(set(first_of))
    from tqdm import tqdm

    with tqdm(total=len(work), desc="sweep", unit="cell", disable=not progress, file=sys.stderr) as bar:
        def done(k: int, res: CellResult) -> None:
            for kk in copies[k]:
                results[kk] = res if kk == k else replace(res, index=work[kk].index, point=work[kk].point)
            bar.update(len(copies[k]))

        copies: dict[int, list[int]] = {k: [] for k in todo}
        for kk, k in enumerate(first_of):
            copies[k].append(kk)
        if n_jobs == 1 or len(todo) == 1:
            for k in todo:
                done(k, _run_cell(work[k]))
        else:
            global _SHARED_JOBS
            # worker processes forked from this one read the jobs from memory instead of each
            # receiving a pickled copy: no pickling, and one scenario object per process, so
            # what is derived from it once (tables, routing, residency) serves every cell
            fork = multiprocessing.get_start_method() == "fork"
            _SHARED_JOBS = work if fork else None
            wait_plotting()  # no fork while an earlier sweep's import thread runs
            try:
                # an interruption (or a failed cell) drops the rest and stops the workers at once
                with WorkerPool(max_workers=min(n_jobs, len(todo))) as pool:
                    # largest cells first, so that the last ones to finish are short
                    order = sorted(todo, key=lambda k: -cell_cost(work[k]))
                    futs = {(pool.submit(_run_shared_cell, k) if fork else pool.submit(_run_cell, work[k])): k
                            for k in order}
                    if prefetch_plots:  # the workers are started: this process is free meanwhile
                        prefetch_plotting()
                    for f in as_completed(futs):
                        done(futs[f], f.result())
            finally:
                _SHARED_JOBS = None
    return SweepResult(
        scenario=scn.name, scenario_file=scn.file, test=test.name, axes=axes,
        variants=tuple(v.name for v in vs), baseline=vs[0].name,
        cells=tuple(r for r in results if r is not None),
        variant_specs={v.name: v for v in vs})


# ----------------------------------------------------------------------------------------
# plots (matplotlib's object API on an Agg canvas: no global backend state)
# ----------------------------------------------------------------------------------------


_PLOT_IMPORT: threading.Thread | None = None


def _import_plotting() -> None:
    try:
        import matplotlib.backends.backend_agg  # noqa: F401
        import matplotlib.colors  # noqa: F401
        import matplotlib.figure  # noqa: F401
        import matplotlib.ticker  # noqa: F401
    except Exception:  # pragma: no cover - the plot imports it again and reports the error
        pass


def prefetch_plotting() -> None:
    """Start importing matplotlib (most of a plot's time on a fresh process) in a background
    thread; the plot functions wait for it (:func:`wait_plotting`) before their own imports.
    Call it only once this process starts no more worker processes (a fork while another
    thread imports could inherit a held import lock). Does nothing if started already."""
    global _PLOT_IMPORT
    if _PLOT_IMPORT is None and "matplotlib.figure" not in sys.modules:
        _PLOT_IMPORT = threading.Thread(target=_import_plotting, name="prefetch-sim: import matplotlib", daemon=True)
        _PLOT_IMPORT.start()


def wait_plotting() -> None:
    """Wait for :func:`prefetch_plotting`'s import, if one was started."""
    t = _PLOT_IMPORT
    if t is not None:
        t.join()


def new_figure(width: float, height: float):
    """A matplotlib Figure of ``width`` x ``height`` inches on its own Agg canvas (no pyplot,
    no global backend state: safe in worker processes, scripts and notebooks)."""
    wait_plotting()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _use_log(ax_spec: AxisSpec, values: Sequence[float]) -> bool:
    vals = [v for v in values if v > 0]
    return ax_spec.log and len(vals) == len(values) and max(vals) / min(vals) >= 8


def _title(res: SweepResult) -> str:
    return f"{res.scenario}\n{res.test_label}"


_MARKERS = ("o", "s", "^", "D", "v", "P", "*")
_LINES = ("-", "-", "--", "-.", ":")


def _style(k: int) -> dict:
    """Line style of the k-th variant: colour, marker and dash vary so overlapping curves
    stay visible."""
    return dict(color=f"C{k}", marker=_MARKERS[k % len(_MARKERS)], ms=4, ls=_LINES[k % len(_LINES)])


def _log2_x(ax) -> None:
    wait_plotting()
    from matplotlib.ticker import ScalarFormatter

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(ScalarFormatter())


def plot_line(res: SweepResult):
    """One-axis sweep: t/s per variant (top) and speedup vs baseline (bottom) with the
    crossovers marked. Returns the matplotlib Figure."""
    ax_ = res.axes[0]
    x = np.asarray(ax_.values, dtype=float)
    fig = new_figure(7.0, 6.0)
    top, bot = fig.subplots(2, 1, sharex=True)
    for k, v in enumerate(res.variants):
        top.plot(x, res.metric(v, "tps_mean"), label=v, **_style(k))
    top.set_ylabel("t/s")
    top.legend(fontsize=8)
    top.set_title(_title(res), fontsize=9)
    bot.axhline(1.0, color="0.4", lw=0.8)
    for k, v in enumerate(res.variants):
        if v == res.baseline:
            continue
        bot.plot(x, res.speedup(v), label=v, **_style(k))
    for c in res.crossovers():
        k = res.variants.index(c.variant)
        bot.axvline(c.value, color=f"C{k}", ls=":", lw=1)
        bot.plot([c.value], [1.0], marker="X", ms=9, color=f"C{k}", mec="k")
        bot.annotate(f"{c.value:.4g}", (c.value, 1.0), textcoords="offset points", xytext=(4, 6),
                     fontsize=8, color=f"C{k}")
    bot.set_ylabel(f"speedup vs {res.baseline}")
    bot.set_xlabel(ax_.spec.label)
    if _use_log(ax_.spec, ax_.values):
        _log2_x(bot)
    return fig


def _interp_index(values: Sequence[float], v: float) -> float:
    """Fractional index of ``v`` on an axis (linear between sweep points: heatmap coordinates)."""
    return float(np.interp(v, np.asarray(values, dtype=float), np.arange(len(values))))


def plot_heatmap(res: SweepResult):
    """Two-axis sweep: a heatmap of speedup vs baseline per non-baseline variant (first axis
    across, second axis up), cells annotated, the 1.0 contour and crossovers marked. Returns
    the Figure."""
    wait_plotting()
    from matplotlib.colors import TwoSlopeNorm

    a0, a1 = res.axes
    others = [v for v in res.variants if v != res.baseline]
    fig = new_figure(1.2 + 5.2 * len(others), 4.6)
    axs = np.atleast_1d(fig.subplots(1, len(others), squeeze=False)[0])
    allv = np.concatenate([res.speedup(v).ravel() for v in others])
    finite = allv[np.isfinite(allv)]
    lo = float(finite.min()) if finite.size else 0.9
    hi = float(finite.max()) if finite.size else 1.1
    norm = TwoSlopeNorm(vcenter=1.0, vmin=min(lo, 0.999), vmax=max(hi, 1.001))
    cross = res.crossovers()
    im = None
    for ax, v in zip(axs, others):
        s = res.speedup(v)  # (n0, n1)
        im = ax.imshow(np.ma.masked_invalid(s.T), origin="lower", cmap="RdYlGn", norm=norm, aspect="auto")
        ax.set_facecolor("0.85")
        for i in range(len(a0)):
            for j in range(len(a1)):
                val = s[i, j]
                ax.text(i, j, "n/a" if not np.isfinite(val) else f"{val:.2f}", ha="center", va="center", fontsize=7)
        if min(s.shape) >= 2 and np.nanmin(s) < 1.0 < np.nanmax(s):
            ax.contour(np.arange(len(a0)), np.arange(len(a1)), s.T, levels=[1.0], colors="k", linewidths=1.2)
        for c in cross:
            if c.variant != v:
                continue
            if c.axis == a0.name:
                px, py = _interp_index(a0.values, c.value), a1.values.index(c.fixed[1])
            else:
                px, py = a0.values.index(c.fixed[1]), _interp_index(a1.values, c.value)
            ax.plot([px], [py], marker="X", ms=8, color="k", mfc="w")
        ax.set_xticks(range(len(a0)), [_fmt(x) for x in a0.values], fontsize=8)
        ax.set_yticks(range(len(a1)), [_fmt(y) for y in a1.values], fontsize=8)
        ax.set_xlabel(a0.spec.label)
        ax.set_ylabel(a1.spec.label)
        ax.set_title(f"{v} / {res.baseline}", fontsize=9)
    fig.suptitle(_title(res), fontsize=9)
    if im is not None:
        fig.colorbar(im, ax=list(axs), label=f"speedup vs {res.baseline} (1.0 contour: crossover)")
    return fig


def plot_sweep(res: SweepResult):
    """:func:`plot_line` for one axis, :func:`plot_heatmap` for two."""
    return plot_line(res) if len(res.axes) == 1 else plot_heatmap(res)


# ----------------------------------------------------------------------------------------
# built-in figures
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FigureSpec:
    """A built-in figure: a sweep and how to draw it.

    Attributes:
        key: short name (``a``..``d``).
        name: file stem (``a_dense_ubatch_depth``).
        question: the reviewer question it answers.
        scenario: scenario file relative to the repository root.
        variants: variant labels (baseline first).
        test: base test.
        axes: axis texts (``ubatch=32-2048*2``).
        fixed: axis settings applied before the sweep (``ubatch=2048``).
        plot: drawing function ``(SweepResult) -> Figure``.
        labels: variant label -> display name (a swept ``slots2`` shows as ``slots<N>``).
        repetitions: runs per cell when ``-r`` is not given (figure d: llama-bench's default
            ``-r 5``, over which an expert cache warms after llama-bench's one-token warm-up).
    """

    key: str
    name: str
    question: str
    scenario: str
    variants: tuple[str, ...]
    test: str
    axes: tuple[str, ...]
    fixed: tuple[str, ...] = ()
    plot: object = None
    labels: tuple[tuple[str, str], ...] = ()
    repetitions: int = 1


def _plot_prompt(res: SweepResult):
    """Figure b: TTFT and prefill t/s vs prompt length; the ungated crossover and the gate."""
    ax_ = res.axes[0]
    x = np.asarray(ax_.values, dtype=float)
    fig = new_figure(7.0, 6.2)
    top, bot = fig.subplots(2, 1, sharex=True)
    for k, v in enumerate(res.variants):
        top.plot(x, res.metric(v, "ttft_s") * 1e3, label=v, **_style(k))
        bot.plot(x, res.metric(v, "tps_mean"), label=v, **_style(k))
    reported = res.scenario_file is not None and Path(res.scenario_file).stem == "laguna-2x3090"
    for ax in (top, bot):
        if reported:
            # reported_measurements.csv, gate_crossover_moe_batch_low/high (laguna 2x RTX 3090)
            ax.axvspan(250, 1040, color="0.88", zorder=0,
                       label="reported crossover range (250-1040)" if ax is top else None)
        for k, v in enumerate(res.variants):
            g = res.variant_specs[v].gate_min_batch if v in res.variant_specs else None
            if g:
                ax.axvline(g, color=f"C{k}", ls="--", lw=0.8, label=f"gate threshold {g}" if ax is top else None)
    at: dict[float, list[str]] = {}
    for c in res.crossovers():
        at.setdefault(round(c.value, 6), []).append(c.variant)
    for n, (val, names) in enumerate(sorted(at.items())):
        k = res.variants.index(names[0])
        for ax in (top, bot):
            ax.axvline(val, color=f"C{k}", ls=":", lw=1.2)
        bot.annotate(f"{' and '.join(names)}\ncross {res.baseline} at {val:.0f} tokens", (val, 0.0),
                     xycoords=("data", "axes fraction"), textcoords="offset points", xytext=(5, 8 + 24 * n),
                     fontsize=8, color=f"C{k}")
    top.set_ylabel("TTFT (ms)")
    top.set_yscale("log")
    top.legend(fontsize=7)
    top.set_title(_title(res), fontsize=9)
    bot.set_ylabel("prefill t/s")
    bot.set_xlabel(ax_.spec.label + " = MoE batch up to the ubatch size")
    _log2_x(bot)
    return fig


def _plot_slots(res: SweepResult):
    """Figure c: prefill gain vs slot count, staging VRAM on a second y-axis."""
    ax_ = res.axes[0]
    x = np.asarray(ax_.values, dtype=float)
    fig = new_figure(7.0, 4.4)
    ax = fig.subplots()
    ax2 = ax.twinx()
    for k, v in enumerate(res.variants):
        if v == res.baseline:
            continue
        gain = (res.speedup(v) - 1.0) * 100
        stg = res.metric(v, "staging_bytes") / GiB
        swept = v in res.variant_specs and res.variant_specs[v].expert_slots > 0
        ls = "-" if swept else "--"
        ax.plot(x, gain, marker="o" if swept else None, ls=ls, color=f"C{k}", label=f"{v}: prefill gain")
        ax2.plot(x, stg, marker="s" if swept else None, ls=ls, color=f"C{k}", alpha=0.45, lw=1,
                 label=f"{v}: staging VRAM")
    ax.axhline(0.0, color="0.4", lw=0.8)
    ax.set_xlabel(ax_.spec.label)
    ax.set_ylabel(f"prefill gain vs {res.baseline} (%)")
    ax2.set_ylabel("staging VRAM per GPU (GiB, faint)")
    ax2.set_ylim(bottom=0)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="center right")
    ax.set_title(_title(res), fontsize=9)
    return fig


def _plot_cache(res: SweepResult):
    """Figure d: decode t/s (top) and hit rate (bottom) vs requested cache capacity, with and
    without staging reserved; dotted lines where each variant's cache pool is full."""
    ax_ = res.axes[0]
    x = np.asarray(ax_.values, dtype=float)
    fig = new_figure(7.0, 6.0)
    top, bot = fig.subplots(2, 1, sharex=True)
    for k, v in enumerate(res.variants):
        tps = res.metric(v, "tps_mean")
        if v == res.baseline:
            top.axhline(float(np.nanmean(tps)), color=f"C{k}", ls="--", lw=1, label=f"{v} (no cache)")
            continue
        staging = np.nanmax(res.metric(v, "staging_bytes"))
        lab = f"{v} (staging {staging / GiB:.2f} GiB reserved)" if staging > 0 else f"{v} (no staging)"
        top.plot(x, tps, label=lab, **_style(k))
        bot.plot(x, res.metric(v, "cache_hit_rate"), label=v, **_style(k))
        cap = np.nanmax(res.metric(v, "cache_experts"))
        if np.isfinite(cap) and cap < x.max():
            for ax in (top, bot):
                ax.axvline(cap, color=f"C{k}", ls=":", lw=1)
            bot.annotate(f"pool full: {cap:.0f}", (cap, 0.02), textcoords="offset points", xytext=(-4, 4),
                         rotation=90, fontsize=7, color=f"C{k}", ha="right", va="bottom")
    top.set_ylabel("decode t/s")
    top.legend(fontsize=7, loc="lower right")
    top.set_title(_title(res), fontsize=9)
    bot.set_ylabel("expert cache hit rate")
    bot.set_ylim(0, 1)
    bot.set_xlabel(ax_.spec.label + " requested")
    return fig


#: the built-in figures, by key
FIGURES: dict[str, FigureSpec] = {f.key: f for f in (
    FigureSpec("a", "a_dense_ubatch_depth",
               "Dense model, FFN on the host: where does weight prefetch pay, by ubatch and KV depth?",
               "scenarios/gemma3-27b-ffn-cpu.toml", ("baseline", "prefetch_ungated"), "pp2048",
               ("ubatch=32-2048*2", "depth=0,4096,8192,16384"), plot=plot_heatmap),
    FigureSpec("b", "b_moe_prompt_ttft",
               "MoE with host experts: TTFT and prefill t/s vs prompt length; where should the gate sit?",
               "scenarios/laguna-2x3090.toml", ("baseline", "prefetch_ungated", "prefetch_gated_512"), "pp512",
               ("prompt=34,64,128,192,256,384,512,768,1024,1536,2048,4096,8192",), plot=_plot_prompt),
    FigureSpec("c", "c_slots_vram",
               "Expert staging slots: prefill gain vs slot count, and the VRAM it costs",
               "scenarios/qwen3-30b-a3b-rtx3090.toml", ("baseline", "prefetch_ungated", "slots2"),
               "pp4096 @ d8192", ("slots=1-6",), fixed=("ubatch=2048",), plot=_plot_slots,
               labels=(("slots2", "slots<N>"),)),
    FigureSpec("d", "d_cache_decode",
               "Decode t/s vs expert-cache capacity, with and without staging reserved",
               "scenarios/qwen3-30b-a3b-rtx3090.toml", ("baseline", "cache_lru", "prefetch_gated_512+cache_lru"),
               "tg32", ("cache=32,64-640+64",), plot=_plot_cache, repetitions=5),
)}

_FIGURE_ALIASES = {f.name.split("_", 1)[1]: k for k, f in FIGURES.items()} | {f.name: k for k, f in FIGURES.items()}


def figure_spec(name: str) -> FigureSpec:
    """The built-in figure called ``name`` (``a``..``d`` or its name, e.g. ``slots_vram``).

    Raises:
        ScenarioError: unknown name, naming ``--figure``.
    """
    key = name.strip().lower()
    key = _FIGURE_ALIASES.get(key, key)
    if key not in FIGURES:
        names = ", ".join(f"{k} ({f.name})" for k, f in FIGURES.items())
        raise ScenarioError(f"unknown figure '{name}' (use one of: {names}, or all)", field="--figure")
    return FIGURES[key]


@dataclass(frozen=True)
class SweepOutput:
    """Files written for one sweep and what they contain."""

    result: SweepResult
    csv_path: Path
    png_path: Path
    crossovers: tuple[Crossover, ...]


def write_outputs(res: SweepResult, out_dir: str | Path, stem: str, fig=None, inputs: dict | None = None) -> SweepOutput:
    """Write ``<stem>.csv`` and ``<stem>.png`` (``fig``, or :func:`plot_sweep`) into ``out_dir``,
    both or neither: both are rendered and written to temporary files first, then moved into
    place (:func:`sim.atomic.write_atomic_many`); a failed write leaves older files as they were.
    ``inputs``: real path -> what it is (:func:`sim.model.specs.scenario_input_files`): a file name
    that falls on one of them, or on any existing TOML or GGUF file, is refused before anything
    is written.

    Raises:
        ScenarioError: an output would replace an input (naming ``--out``).
        OSError: a file cannot be written (after the clean-up)."""
    import io

    from sim.model.specs import replaced_input

    out_dir = Path(out_dir)
    csv_path, png_path = out_dir / f"{stem}.csv", out_dir / f"{stem}.png"
    for p in (csv_path, png_path):
        what = replaced_input(p, inputs or {})
        if what:
            # fresh-user round 10: a routing trace named as the sweep's CSV was replaced
            role = ", an input of this sweep" if os.path.realpath(p) in (inputs or {}) else ""
            raise ScenarioError(f"'{p}' is {what}{role}: writing there would replace it; "
                                "give --out another folder", field="--out")
    csv_bytes = res.to_dataframe().to_csv(index=False).encode()
    buf = io.BytesIO()
    (fig if fig is not None else plot_sweep(res)).savefig(buf, format="png")
    from sim.atomic import write_atomic_many

    write_atomic_many({csv_path: csv_bytes, png_path: buf.getvalue()})
    return SweepOutput(res, csv_path, png_path, tuple(res.crossovers()))


def run_figure(spec: FigureSpec, out_dir: str | Path, *, scenario: str | Path | None = None,
               repetitions: int | None = None, jobs: int | None = None, engine: str = "analytic",
               progress: bool = False) -> SweepOutput:
    """Build one built-in figure into ``out_dir`` (``<name>.png`` and ``<name>.csv``).

    Args:
        scenario: use this scenario file instead of the figure's own.
        repetitions: runs per cell; None: the figure's own (:attr:`FigureSpec.repetitions`).

    Raises:
        ScenarioError: the scenario cannot be loaded, or the figure's axes do not apply to it.
    """
    path = Path(scenario) if scenario else shipped(spec.scenario)
    scn = load_scenario(path)
    labels = dict(spec.labels)
    variants = [parse_variant(v, field_name="--figure") for v in spec.variants]
    variants = [replace(v, name=labels.get(v.name, v.name)) for v in variants]
    test = parse_test(spec.test)
    for text in spec.fixed:
        ax = parse_axis(text, flag="--figure")
        scn, variants, test = apply_point(scn, variants, test, [(ax.name, ax.values[0])])
    axes = [parse_axis(t, flag="--figure") for t in spec.axes]
    res = sweep(scn, axes, variants, test, repetitions=spec.repetitions if repetitions is None else repetitions,
                engine=engine, jobs=jobs, progress=progress, prefetch_plots=True)
    from sim.model.specs import scenario_input_files

    return write_outputs(res, out_dir, spec.name, spec.plot(res), inputs=scenario_input_files(scn))


# ----------------------------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------------------------


def _stem(res: SweepResult) -> str:
    scn = Path(res.scenario_file).stem if res.scenario_file else re.sub(r"\W+", "_", res.scenario)
    test = re.sub(r"\W+", "_", res.test_label).strip("_")
    return "__".join([scn, test, *[a.name for a in res.axes]])


def _report(out: SweepOutput, file=None) -> None:
    file = file or sys.stdout
    res = out.result
    print(f"{res.scenario} / {res.test_label}: {plural(len(res.cells), 'cell')} -> {out.csv_path}, {out.png_path}", file=file)
    for c in res.cells:
        if c.error:
            where = ", ".join(f"{a.name}={_fmt(v)}" for a, v in zip(res.axes, c.point))
            print(f"  does not fit: {c.variant} at {where}", file=file)
    if out.crossovers:
        for c in out.crossovers:
            print(f"  crossover: {c.describe(res.baseline)}", file=file)
    else:
        for v in res.variants:
            if v == res.baseline:
                continue
            s = res.speedup(v)
            if np.isfinite(s).any():
                print(f"  no crossover: {v} vs {res.baseline} speedup stays within "
                      f"{np.nanmin(s):.3f}..{np.nanmax(s):.3f}", file=file)


def axis_notes(axes: Sequence[Axis], test: BenchTest, scn: Scenario) -> list[str]:
    """What a sweep's axes cannot change, said before it runs: ubatch values above the test's
    prompt (a ubatch holds at most the prompt: those points repeat the last one), ``ncmoe``
    above the model's blocks (every expert on the host, as llama.cpp), ``kv`` (it sizes the KV
    cache; attention reads are priced as F16), contexts past the model's ``n_ctx_train``, and what
    values given became (:attr:`Axis.note`: ``fa=auto`` is on, ``ngl=-1`` every layer)."""
    out = [ax.note for ax in axes if ax.note]
    for ax in axes:
        if ax.name == "ubatch" and test.n_prompt and not any(a.name == "prompt" for a in axes):
            over = [v for v in ax.values if v > test.n_prompt]
            if over:
                out.append(f"axis ubatch: {plural(len(over), 'value')} above the {test.name} prompt ({test.n_prompt} tokens) "
                           f"{'runs' if len(over) == 1 else 'run'} the same graphs as ubatch = prompt; give a longer --test (e.g. pp4096)")
        if ax.name == "ncmoe" and scn.model.moe is not None and max(ax.values) > scn.model.n_layer:
            out.append(f"axis ncmoe: values above the model's {scn.model.n_layer} blocks put every expert on the host")
        if ax.name == "kv":
            out.append("axis kv: the KV cache type sizes the KV cache (VRAM, what fits); attention reads are "
                       "priced as F16")
        if ax.name == "pcie" and not scn.placement.pinned:
            # the axis sets the pinned rate; pageable host weights copy at hardware.h2d_pageable
            out.append("axis pcie: sets the pinned H2D rate, and this scenario's host memory is pageable (copies at "
                       "hardware.h2d_pageable): the axis moves almost nothing; set host_memory = \"pinned\" "
                       "(llama-bench -lm none) to sweep the link")
    # a context past the model's trained one (run says so too)
    tok = {a.name: max(a.values) for a in axes if a.name in ("depth", "prompt")}
    past = scn.model.past_trained_context(tok.get("depth", test.n_depth) + tok.get("prompt", test.n_prompt)
                                          + test.n_gen, " (the sweep's longest)")
    if past:
        out.append(past)
    return out


