"""Validation grid: the same plans predicted by the simulator and measured by the GPU executor.

A *case* is (model, placement, variant, test). For each case the plan is built once with
:func:`sim.plan.builder.build_plan`; the analytic engine predicts its makespan from a hardware
profile (the measured H200 one for the committed results); :func:`calibrate.executor.execute`
runs the same plan on the GPU and measures it. :func:`compare` turns both into one row per
case (predicted, measured, relative error) and per-op-kind error summaries.

The grid (:func:`default_grid`) covers dense and MoE models, ubatch 32…8192, KV depth 0…32k,
slots 1…4, baseline / ungated / gated prefetch, pinned and pageable host memory, and the
expert cache on and off. Models are the shipped ones cut to a few layers (per-layer shapes and
bytes are the real ones; fewer layers keep the grid inside a few minutes of GPU time).

This module is pure Python (no CuPy); :func:`run_grid` imports the executor lazily.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from sim.plan.builder import build_plan, make_context
from sim.model.costs import fit_host_work_line, fit_matvec_line, plan_durations, prefixed_points
from sim.engines import analytic
from sim.plan import Plan
from sim.model.specs import (EXECUTOR_LAUNCH_KINDS, BenchTest, HardwareProfile, Placement, Scenario, Workload, load_model,
                    parse_variant)
from sim.resources import shipped_root
from sim.model.routing import RoutingSpec
from sim.wording import plural

#: the shipped files (scenarios/): the checkout, or a wheel's package data (sim.resources)
ROOT = shipped_root()

#: columns of the validation CSV (one row per case), SI units in the names
CASE_COLUMNS = (
    "case", "model", "variant", "test", "n_ubatch", "n_depth", "host_memory", "expert_slots", "cache",
    "n_ops", "predicted_s", "measured_s", "measured_min_s", "measured_max_s", "rel_error",
    "h2d_bytes", "h2d_bytes_per_s", "probes_checked", "digest", "device", "n_runs", "pass_spread",
    "predicted_host_s", "rel_error_host",
)


@dataclass(frozen=True)
class Case:
    """One validation case.

    Attributes:
        name: unique label, e.g. ``moe-pinned-ub512-d0-prefetch_ungated``.
        model: ``"moe"`` or ``"dense"`` (see :func:`case_scenario`).
        variant: variant label (:func:`sim.model.specs.parse_variant`).
        test: ``pp<N>`` (one ubatch of N tokens) or ``tg<N>``.
        n_depth: KV depth.
        pinned: host weights pinned (else pageable).
        cache: expert-cache capacity in experts (0 = none; only with a cache variant).
    """

    name: str
    model: str
    variant: str
    test: str
    n_depth: int = 0
    pinned: bool = True
    cache: int = 0

    @property
    def bench_test(self) -> BenchTest:
        n = int(self.test[2:])
        return BenchTest(n, 0, self.n_depth) if self.test.startswith("pp") else BenchTest(0, n, self.n_depth)


#: layers kept from each model for validation (the real per-layer shapes and bytes)
VALIDATION_LAYERS = 4


#: the model file (``scenarios/models/<name>.toml``) of each validation model label
VALIDATION_MODELS = {"moe": "qwen3-30b-a3b", "dense": "gemma3-27b"}


def _model_cut(name: str, n_layer: int):
    """``scenarios/models/<name>.toml`` cut to its first ``n_layer`` layers (the real per-layer
    shapes), with each tensor group's bytes as the model TOML's ``group_types`` give them (one
    type, or the group's mean bits over the model: ``quant_preset = ""``), not llama.cpp's
    per-layer types: the committed validation runs (``data/validation``) measured plans with
    those bytes, so their predictions stay reproducible.

    Raises:
        ScenarioError: the model file is missing or malformed."""
    return replace(load_model(ROOT / "scenarios" / "models" / f"{name}.toml"), n_layer=n_layer, quant_preset="")


def case_scenario(case: Case, hardware: HardwareProfile, n_layer: int = VALIDATION_LAYERS) -> Scenario:
    """The scenario of a case: Qwen3-30B-A3B (``moe``, all experts host-resident) or Gemma-3-27B
    (``dense``, ``ffn_(gate|up|down)`` host-resident), cut to ``n_layer`` layers."""
    if case.model == "moe":
        pl = Placement(n_cpu_moe=n_layer, pinned=case.pinned, ctx_size=max(4096, case.n_depth + 8192),
                       expert_cache_experts=case.cache)
    elif case.model == "dense":
        pl = Placement(override_tensor=((r"ffn_(gate|up|down)\.weight$", "CPU"),), pinned=case.pinned,
                       ctx_size=max(4096, case.n_depth + 8192))
    else:
        raise ValueError(f"unknown validation model '{case.model}' (moe or dense)")
    m = _model_cut(VALIDATION_MODELS[case.model], n_layer)
    t = case.bench_test
    ub = max(t.n_prompt, 1)
    return Scenario(name=case.name, model=m, hardware=hardware, placement=pl,
                    workload=Workload(n_prompt=(t.n_prompt,), n_gen=(t.n_gen,), n_depth=(case.n_depth,),
                                      n_ubatch=ub, n_batch=ub, repetitions=1),
                    routing=RoutingSpec(), variants=(parse_variant(case.variant),), seed=0)


#: held-out models of the executor's decode-chain probe (``calibrate.executor_costs``): MoE
#: models with every expert host-resident, neither of them in :data:`VALIDATION_MODELS`
DECODE_PROBE_MODELS = ("gpt-oss-20b", "mixtral-8x7b")


def decode_probe_plan(model: str, hardware: HardwareProfile, n_layer: int = 4, n_gen: int = 4) -> Plan:
    """Baseline batch-1 decode plan (``tg<n_gen>``) of ``scenarios/models/<model>.toml`` cut to
    ``n_layer`` layers, every expert host-resident in pinned memory (so its experts run as CPU
    matvecs between the GPU launches): the shape of validation's decode cases, on models that
    validation does not use. Routing draws from seed 0.

    Raises:
        ScenarioError: the model file is missing or malformed."""
    scn = Scenario(name=f"decode probe {model}", model=_model_cut(model, n_layer), hardware=hardware,
                   placement=Placement(n_cpu_moe=n_layer, pinned=True, ctx_size=4096),
                   workload=Workload(n_prompt=(0,), n_gen=(n_gen,), n_depth=(0,), n_ubatch=1, n_batch=1,
                                     repetitions=1),
                   routing=RoutingSpec(), variants=(parse_variant("baseline"),), seed=0)
    return _one_plan(scn, BenchTest(0, n_gen, 0))


def default_grid() -> list[Case]:
    """The committed validation grid (64 cases)."""
    cases: list[Case] = []

    def add(model, variant, test, depth=0, pinned=True, cache=0):
        mem = "pinned" if pinned else "pageable"
        name = f"{model}-{mem}-{test}-d{depth}-{variant}" + (f"-c{cache}" if cache else "")
        cases.append(Case(name, model, variant, test, depth, pinned, cache))

    for ub in (32, 128, 512, 2048, 8192):
        for v in ("baseline", "prefetch_ungated", "prefetch_gated_512", "slots2"):
            add("moe", v, f"pp{ub}")
        for v in ("baseline", "prefetch_ungated"):
            add("dense", v, f"pp{ub}")
    for n in (1, 3, 4):
        add("moe", f"slots{n}", "pp512")
        add("moe", f"slots{n}", "pp2048")
    for d in (8192, 32768):
        for v in ("baseline", "prefetch_ungated"):
            add("moe", v, "pp512", depth=d)
            add("dense", v, "pp512", depth=d)
    for ub in (128, 2048):
        for v in ("baseline", "prefetch_ungated", "slots2"):
            add("moe", v, f"pp{ub}", pinned=False)
        for v in ("baseline", "prefetch_ungated"):
            add("dense", v, f"pp{ub}", pinned=False)
    for v in ("cache_lru", "slots2+cache_lru"):
        add("moe", v, "pp512", cache=256)
        add("moe", v, "tg8", cache=256)
    for v in ("baseline", "prefetch_ungated"):
        add("moe", v, "tg8")
        add("dense", v, "tg8")
    add("moe", "prefetch_gated_512", "pp256")
    add("moe", "prefetch_gated_512", "pp1024")
    return cases


def executor_profile(hardware: HardwareProfile) -> HardwareProfile:
    """The profile with host launches priced as the CuPy executor issues them."""
    return replace(hardware, executor_mode=True)


def _one_plan(scn: Scenario, test: BenchTest) -> Plan:
    """The plan of ``scn``'s only variant for ``test``, routing drawn from the scenario's seed;
    an expert cache is warmed first by one build, as llama-bench's warm-up run would."""
    v = scn.variants[0]
    rng = np.random.default_rng([scn.seed, 0, 0])
    ctx = make_context(scn, v, rng)
    if ctx.cache is not None:
        build_plan(scn, v, test, np.random.default_rng([scn.seed, 0, 1]), ctx)
        ctx.cache.reset_stats()
    return build_plan(scn, v, test, rng, ctx)


def build_case(case: Case, hardware: HardwareProfile) -> tuple[Scenario, Plan]:
    """Build the plan of a case (routing draws from the case's fixed seed)."""
    scn = case_scenario(case, hardware)
    return scn, _one_plan(scn, case.bench_test)


def predict_s(plan: Plan, hardware: HardwareProfile) -> float:
    """Analytic makespan of a plan on a profile, seconds."""
    return float(analytic.run(plan, plan_durations(plan, hardware)).makespan_s)


def is_cost_number(v) -> bool:
    """Whether a value of a measured cost dict is a number (bools and strings such as ``gc`` or
    ``statistic`` are not; non-finite values are, callers filter them where they must)."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def aggregate_costs(measured: Sequence[dict], statistic: str = "median") -> dict[str, float]:
    """The ``statistic`` (``"median"`` or ``"mean"``) of each key over the per-round or
    per-pass cost dicts; keys missing in a dict, and non-numeric or non-finite values (a CSV's
    empty cells read back as NaN), are skipped; a key with no finite value is left out.

    The mean is the estimate to price a sum of many launches with when a cost jumps between
    levels from one measurement to the next (on the lent H200 VM the executor's GEMM launch
    cost sat at ≈ 8 or ≈ 14 µs, ``data/validation/history/diag/``): a run's total is the count
    times the expected cost, while a median of a few samples lands on one level.

    Raises:
        ValueError: an unknown ``statistic``."""
    if statistic not in ("median", "mean"):
        raise ValueError(f"statistic must be 'median' or 'mean', got {statistic!r}")
    f = np.median if statistic == "median" else np.mean
    out = {}
    for k in sorted({k for c in measured for k in c}):
        vals = [float(c[k]) for c in measured
                if is_cost_number(c.get(k)) and math.isfinite(c[k])]
        if vals:
            out[k] = float(f(vals))
    return out


def median_costs(measured: Sequence[dict]) -> dict[str, float]:
    """:func:`aggregate_costs` with the median."""
    return aggregate_costs(measured, "median")


def with_host_state(hardware: HardwareProfile, costs: dict[str, float] | None = None,
                    pageable_bytes_per_s: float | None = None) -> HardwareProfile:
    """``hardware`` conditioned on the host state measured during a validation run: the
    executor's costs (:func:`with_executor_costs`) and the pageable H2D bandwidth (the
    latency is kept). ``None`` keeps the profile's."""
    hw = with_executor_costs(hardware, costs) if costs else hardware
    if pageable_bytes_per_s:
        hw = replace(hw, h2d_pageable=replace(hw.h2d_pageable, bytes_per_s=float(pageable_bytes_per_s)))
    return hw


#: keys of :func:`calibrate.executor_costs.measure` that price the executor (seconds; B/s)
EXECUTOR_COST_KEYS = (*EXECUTOR_LAUNCH_KINDS, *(f"busy_{k}" for k in EXECUTOR_LAUNCH_KINDS), "host_work",
                      "host_work_per_id", "cpu_op", "cpu_bytes_per_s", "busy_scale")


def resolve_executor_costs(costs: dict[str, float]) -> dict[str, float]:
    """The executor costs that price a prediction, from measured ones (possibly medians over
    passes): the keys of :data:`EXECUTOR_COST_KEYS`; with per-count host-work points
    (``host_work_t_<ids>``) the host-work line is refitted through them; with per-size loop points
    (``loop_t_<bytes>``) the matvec line is refitted through them — one coherent line instead of
    an intercept and a slope that may come from different passes — and when they give no rising
    line, ``cpu_bytes_per_s`` is 0 (the profile's native CPU figures price the matvecs, as
    :func:`calibrate.executor_costs.finish_loop` does). ``busy_scale`` is taken as given (the
    median of the per-pass fits), not refitted through the median decode-chain makespans: each
    pass fitted it with that pass's own line and extras, so after the refit above the pair can
    differ slightly from one fit (a limit of this diagnostic, as used for runs 20 and 21)."""
    out = {k: float(costs[k]) for k in EXECUTOR_COST_KEYS if k in costs}
    # the host-work line through its (median) points, as for the matvec below
    out.update(fit_host_work_line(prefixed_points(costs, "host_work_t_")))
    pts = prefixed_points(costs, "loop_t_")
    if pts:
        out.pop("cpu_op", None)
        out.pop("cpu_bytes_per_s", None)
        out.update(fit_matvec_line(pts) or {"cpu_op": 0.0, "cpu_bytes_per_s": 0.0})
    return out


def with_executor_costs(hardware: HardwareProfile, costs: dict[str, float]) -> HardwareProfile:
    """``hardware`` with the executor's costs replaced by ``costs`` (seconds, the keys of
    :func:`calibrate.executor_costs.measure`: ``<kind>`` launch costs, ``host_work``,
    ``host_work_per_id``, ``busy_<kind>``, ``cpu_op``, ``cpu_bytes_per_s``, ``busy_scale``, or the loop points
    ``loop_t_<bytes>`` through which the matvec line is then refitted); keys absent from
    ``costs`` keep the profile's value, except ``busy_scale``: with busy extras but no scale the
    profile's scale (fitted over other extras) is stale and becomes 1."""
    costs = resolve_executor_costs(costs)
    kinds = EXECUTOR_LAUNCH_KINDS
    kw: dict = {}
    if any(k in costs for k in kinds):
        kw["executor_issue_s_by_kind"] = {**hardware.executor_issue_s_by_kind,
                                          **{k: costs[k] for k in kinds if k in costs}}
    if any(f"busy_{k}" in costs for k in kinds):
        kw["executor_busy_issue_s_by_kind"] = {**hardware.executor_busy_issue_s_by_kind,
                                               **{k: costs[f"busy_{k}"] for k in kinds if f"busy_{k}" in costs}}
        if "busy_scale" not in costs:  # a scale fitted over other extras is stale (update_profile drops it too)
            kw["executor_busy_scale"] = 1.0
    for key, fld in (("host_work", "executor_host_work_s"), ("host_work_per_id", "executor_host_work_per_id_s"),
                     ("cpu_op", "executor_cpu_op_s"), ("cpu_bytes_per_s", "executor_cpu_bytes_per_s"),
                     ("busy_scale", "executor_busy_scale")):
        if key in costs:
            kw[fld] = costs[key]
    return replace(hardware, **kw)


def run_grid(cases: Sequence[Case], hardware: HardwareProfile, *, repeats: int = 3, warmup: int = 1,
             passes: int = 1, progress: Callable[[Iterable], Iterable] | None = None, cp=None,
             keep_trace: str | None = None, partial: str | Path | None = None,
             host_probes: list | None = None, failures: list | None = None,
             cost_probe: Callable[[], dict] | None = None, cost_log: list | None = None,
             pageable_from_probes: bool = False, host_state_used: dict | None = None,
             gc_off: bool = True,
             ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame | None, pd.DataFrame]:
    """Predict and measure every case on the GPU.

    The grid is measured ``passes`` times, in plan order on even passes and in reverse order on
    odd ones, so that a slow drift of the host (pageable copies and the CPU backend depend on
    it) spreads over all cases instead of following their position in the grid. Each pass runs
    ``warmup`` untimed and ``repeats`` timed executions of each case; a case's measured time is
    the median over all ``passes × repeats`` timed makespans, and ``pass_spread`` is the
    largest over the smallest per-pass median, minus one (the case's repeatability).

    Args:
        host_probes: when a list, a :class:`calibrate.drift.HostProbe` is appended at the start
            of every pass and at the end (the host's state during the run; recorded only).
        failures: when a list, losslessness failures are appended to it as messages and the
            results are still returned (so a caller can write them before failing); when None
            they raise.
        cost_probe: when given, called at the start of every pass; it measures the executor's
            own costs and returns them as :func:`calibrate.executor_costs.measure` does (seconds;
            non-numeric and non-finite values ignored; a probe that raises is logged as
            ``error`` in ``cost_log`` and the run goes on). ``predicted_host_s`` then prices
            the executor with the median of each cost over the passes
            (:func:`with_executor_costs`): on the lent H200 VM those costs changed up to 2×
            between machines and minutes. The probes run their own plans, never the cases.
        cost_log: when a list, each pass's measured costs are appended to it (a dict with
            ``pass`` and the numeric keys, or ``error``).
        pageable_from_probes: (with ``host_probes``) ``predicted_host_s`` also prices pageable
            H2D copies with the median of the host probes' pageable bandwidth over the run (on
            the lent H200 VM it drifted ±20% within minutes).
        host_state_used: when a dict, filled with what ``predicted_host_s`` used:
            ``executor_costs`` (:func:`resolve_executor_costs` of the medians) and
            ``pageable_bytes_per_s`` (or None).
        gc_off: the executor's ``gc_off`` for every case (:func:`calibrate.executor.execute`:
            Python's garbage collector off in the timed runs); pass the same to ``cost_probe``.

    ``predicted_s`` / ``rel_error`` are the prediction from ``hardware`` (the headline);
    ``predicted_host_s`` / ``rel_error_host`` the same with the host state measured during the
    run (equal to them without ``cost_probe`` and ``pageable_from_probes``): a diagnostic that
    separates the model's error from the host's drift between calibration and run. Traces and
    the per-kind frame use the ``hardware`` prediction.

    Returns:
        (cases frame with :data:`CASE_COLUMNS`, per-op-kind error frame, the measured and
        predicted traces of every case — ``engine`` ``executor`` or ``analytic``, a ``case``
        column first; the measured one is the median-makespan timed run of the pass whose
        median lies closest to the case's median over all passes).

    Raises:
        GPUUnavailableError: no CuPy or GPU.
        LosslessnessError: (``failures`` None) variants of one (model, test, memory) group, or
            passes of one case, produced different outputs.
        ValueError: ``passes`` or ``repeats`` below 1.
    """
    from calibrate.executor import LosslessnessError, check_lossless, execute  # noqa: PLC0415 - needs CuPy
    from sim.views.trace import to_dataframe

    if passes < 1 or repeats < 1:
        raise ValueError(f"passes and repeats must be >= 1, got {passes} and {repeats}")
    hardware = executor_profile(hardware)
    prober = None
    if host_probes is not None:
        from calibrate.drift import HostProber  # noqa: PLC0415
        from calibrate.measure import open_gpu  # noqa: PLC0415

        if cp is None:
            from calibrate._gpu import require_cupy  # noqa: PLC0415

            cp = require_cupy()
        prober = HostProber(open_gpu(cp))
    if pageable_from_probes and host_probes is None:
        raise ValueError("pageable_from_probes needs host_probes")
    built = {}
    for case in cases:
        scn, plan = build_case(case, hardware)
        pred_d = plan_durations(plan, hardware)
        built[case.name] = (scn, plan, pred_d, analytic.run(plan, pred_d))
    results: dict[str, list] = {c.name: [] for c in cases}
    measured_costs: list[dict] = []
    for p in range(passes):
        if prober is not None:
            host_probes.append(prober.probe(f"pass {p + 1} start"))
        if cost_probe is not None:
            try:
                raw = cost_probe()
            except Exception as exc:  # noqa: BLE001 - a failed probe must not lose the passes measured
                if cost_log is not None:
                    cost_log.append({"pass": p + 1, "error": f"{type(exc).__name__}: {exc}"})
            else:
                c = {k: float(v) for k, v in raw.items()
                     if is_cost_number(v) and math.isfinite(v)}
                measured_costs.append(c)
                if cost_log is not None:
                    cost_log.append({"pass": p + 1, **c})
        order = list(cases) if p % 2 == 0 else list(reversed(cases))
        it = progress(order) if progress else order
        for case in it:
            _scn, plan, _d, _sched = built[case.name]
            r = execute(plan, test=case.test, variant=case.variant, repeats=repeats, warmup=warmup, cp=cp,
                        gc_off=gc_off)
            results[case.name].append(r)
            if partial is not None:  # a log that survives an interrupted run (not the result file)
                pd.DataFrame([dict(pass_=p + 1, case=case.name, predicted_s=float(_sched.makespan_s),
                                   measured_s=r.makespan_s)]).to_csv(
                    partial, mode="a", header=not Path(partial).exists(), index=False)
    if prober is not None:
        host_probes.append(prober.probe("end"))
    pageable = None
    if pageable_from_probes:
        vals = [p.h2d_pageable_gb_per_s for p in host_probes if p.h2d_pageable_gb_per_s > 0]
        pageable = float(np.median(vals)) * 1e9 if vals else None
    med_costs = median_costs(measured_costs) if measured_costs else None
    if host_state_used is not None:
        host_state_used.update(executor_costs=resolve_executor_costs(med_costs) if med_costs else None,
                               pageable_bytes_per_s=pageable)
    host_pred = {name: float(b[3].makespan_s) for name, b in built.items()}
    if med_costs or pageable:  # the same plans with the host state measured during the run
        hw_host = with_host_state(hardware, med_costs, pageable)
        host_pred = {name: predict_s(plan, hw_host) for name, (_scn, plan, _d, _s) in built.items()}
    rows, kinds, traces, kept = [], [], [], None
    problems: list[str] = []
    groups: dict[tuple, dict] = {}
    for case in cases:
        scn, plan, pred_d, pred_sched = built[case.name]
        rs = results[case.name]
        digests = {r.digest for r in rs}
        if len(digests) > 1:
            problems.append(f"case {case.name}: passes produced {len(digests)} different output digests")
        all_mk = np.concatenate([np.asarray(r.makespans_s, float) for r in rs])
        med = float(np.median(all_mk))
        per_pass = [float(np.median(r.makespans_s)) for r in rs]
        r = min(rs, key=lambda x: abs(x.makespan_s - med))  # its trace stands for the case
        pred = float(pred_sched.makespan_s)
        rows.append(dict(
            case=case.name, model=case.model, variant=case.variant, test=case.test,
            n_ubatch=scn.workload.n_ubatch, n_depth=case.n_depth, host_memory="pinned" if case.pinned else "pageable",
            expert_slots=scn.variants[0].expert_slots, cache=case.cache, n_ops=len(plan), predicted_s=pred,
            measured_s=med, measured_min_s=float(all_mk.min()), measured_max_s=float(all_mk.max()),
            rel_error=pred / med - 1.0, h2d_bytes=r.h2d_bytes, h2d_bytes_per_s=r.h2d_bytes_per_s,
            probes_checked=r.probes_checked, digest=r.digest, device=r.device, n_runs=int(all_mk.size),
            pass_spread=max(per_pass) / min(per_pass) - 1.0, predicted_host_s=host_pred[case.name],
            rel_error_host=host_pred[case.name] / med - 1.0))
        kinds.append(per_kind_errors(case.name, r.trace, pred_d))
        both = pd.concat([r.trace, to_dataframe(plan, pred_sched, test=case.test, variant=case.variant)],
                         ignore_index=True)
        both.insert(0, "case", case.name)
        traces.append(both)
        groups.setdefault((case.model, case.test, case.n_depth, case.pinned), {})[case.variant] = r
        if keep_trace == case.name:
            kept = both.drop(columns=["case"])
    for key, res in groups.items():
        # variants without a cache share the plan's computation; cache variants share theirs
        # (cached experts run as separate grouped GEMMs, so the two sets are compared apart)
        plain = {k: v for k, v in res.items() if "cache" not in k}
        cached = {k: v for k, v in res.items() if "cache" in k}
        for part in (plain, cached):
            if len(part) > 1:
                try:
                    check_lossless(part)
                except LosslessnessError as exc:
                    problems.append(str(exc))
    if problems:
        if failures is None:
            raise LosslessnessError("; ".join(problems))
        failures.extend(problems)
    return (pd.DataFrame(rows, columns=list(CASE_COLUMNS)), pd.concat(kinds, ignore_index=True), kept,
            pd.concat(traces, ignore_index=True))


def per_kind_errors(case: str, measured: pd.DataFrame, predicted_dur_s: np.ndarray) -> pd.DataFrame:
    """Per op kind of one case: summed measured and predicted op durations (s), op count and
    median relative error per op (ops of at least 1 µs measured)."""
    m = measured.sort_values("op_id")
    d = m["dur_s"].to_numpy()
    p = predicted_dur_s[m["op_id"].to_numpy()]
    df = pd.DataFrame({"kind": m["kind"].to_numpy(), "measured_s": d, "predicted_s": p})
    ok = df.measured_s >= 1e-6
    df["rel"] = np.where(ok, df.predicted_s / df.measured_s.where(ok, 1.0) - 1.0, np.nan)
    g = df.groupby("kind").agg(n=("kind", "size"), measured_s=("measured_s", "sum"),
                               predicted_s=("predicted_s", "sum"), median_rel_error=("rel", "median"))
    g.insert(0, "case", case)
    return g.reset_index()


def summarize(df: pd.DataFrame, column: str = "rel_error") -> dict[str, float]:
    """Median, 90th percentile (linear interpolation) and maximum of |relative error| of the
    predicted total time (``column``: ``rel_error``, or ``rel_error_host`` for the
    host-conditioned predictions)."""
    e = df[column].abs()
    return {"n_cases": int(len(df)), "median_abs_error": float(e.median()),
            "p90_abs_error": float(e.quantile(0.9)), "max_abs_error": float(e.max())}


def plt_null_formatter():
    from matplotlib.ticker import NullFormatter

    return NullFormatter()


def plot_validation(df: pd.DataFrame, path: str | Path, trace: pd.DataFrame | None = None) -> Path:
    """Predicted-vs-measured scatter (log-log, coloured by model/memory) and, if given, one
    overlaid timeline (executor vs analytic). Written atomically."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from sim.atomic import save_figure

    ncols = 2 if trace is not None else 1
    fig = Figure(figsize=(6.5 * ncols, 5.5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols)
    ax = axes[0] if ncols == 2 else axes
    lo = min(df.measured_s.min(), df.predicted_s.min()) * 1e3 * 0.8
    hi = max(df.measured_s.max(), df.predicted_s.max()) * 1e3 * 1.25
    xs = np.array([lo, hi])
    ax.fill_between(xs, xs * 0.9, xs * 1.1, color="0.88", label="±10%", zorder=0)
    ax.plot(xs, xs, "k-", lw=0.8, zorder=1)
    for i, ((model, mem), g) in enumerate(df.groupby(["model", "host_memory"])):
        ax.scatter(g.measured_s * 1e3, g.predicted_s * 1e3, s=22, label=f"{model}, {mem}", alpha=0.85,
                   marker="os^D"[i % 4], zorder=2)
    ax.set_xscale("log")
    ax.set_yscale("log")
    from matplotlib.ticker import LogLocator, ScalarFormatter

    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(ScalarFormatter())
        axis.set_minor_formatter(plt_null_formatter())
    ax.set_xlabel("measured on GPU (ms)")
    ax.set_ylabel("predicted, analytic engine (ms)")
    s = summarize(df)
    ax.set_title(f"{plural(s['n_cases'], 'case')}: median |err| {s['median_abs_error']:.1%}, p90 {s['p90_abs_error']:.1%}")
    ax.legend(fontsize=8)
    if trace is not None:
        ax2 = axes[1]
        queues = sorted(trace["queue"].unique())
        for i, (eng, g) in enumerate(trace.groupby("engine")):
            off = 0.2 if eng == "executor" else -0.2
            for q in queues:
                gq = g[(g.queue == q) & (g.dur_s > 0)]
                y = queues.index(q) + off
                ax2.broken_barh(list(zip(gq.start_s * 1e3, gq.dur_s * 1e3)), (y - 0.15, 0.3),
                                color="C0" if eng == "executor" else "C1", alpha=0.8,
                                label=eng if q == queues[0] else None)
        ax2.set_yticks(range(len(queues)), queues)
        ax2.set_xlabel("time (ms)")
        ax2.set_title(f"timeline: {trace['variant'].iloc[0]} / {trace['test'].iloc[0]} (executor vs analytic)")
        ax2.legend(fontsize=8)
    return save_figure(fig, path)
