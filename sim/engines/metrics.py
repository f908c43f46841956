"""Run a scenario's tests under its variants and summarise them as llama-bench would.

Repetitions differ by routing draws. Variants of one repetition share the same draws
(common random numbers: the rng of (seed, test, repetition) does not depend on the variant),
so a difference between variants is the policy's, not the dice's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from sim import engines
from sim.plan.builder import BuildContext, build_plan, make_context
from sim.model.costs import plan_durations
from sim.plan import Plan, Schedule
from sim.model.specs import BenchTest, Scenario, Variant, parse_variant
from sim.model.vram import VramBreakdown


@dataclass(frozen=True)
class TestResult:
    """One (variant, test) cell, aggregated over repetitions.

    Attributes:
        variant, test: labels (``prefetch_ungated``, ``pp512 @ d8192``).
        n_tokens: tokens of the test (prompt or generated).
        tps: (repetitions,) tokens per second of each repetition.
        makespan_s: (repetitions,) simulated time of each repetition.
        ttft_s: time to first token of a pp test (end of the last prompt ubatch; the first
            token is sampled from its logits), mean over repetitions; None for tg.
        h2d_bytes: mean bytes copied host→device per repetition.
        exposed_transfer_s: mean H2D time not hidden behind compute.
        overlap_fraction: mean share of H2D time overlapped by compute over the repetitions that
            copied (NaN when none did).
        cache_hit_rate: expert cache hit rate (None without a cache).
        vram: per-GPU VRAM breakdown of the variant.
        n_cpu_moe: the placement's ``n_cpu_moe`` after ``fit_experts``.
        engine: engine that timed it.
    """

    variant: str
    test: str
    n_tokens: int
    tps: np.ndarray
    makespan_s: np.ndarray
    ttft_s: float | None
    h2d_bytes: float
    exposed_transfer_s: float
    overlap_fraction: float
    cache_hit_rate: float | None
    vram: tuple[VramBreakdown, ...]
    n_cpu_moe: int
    engine: str

    @property
    def tps_mean(self) -> float:
        return float(np.mean(self.tps))

    @property
    def tps_std(self) -> float:
        """Sample standard deviation over repetitions (0 for one repetition), as llama-bench."""
        return float(np.std(self.tps, ddof=1)) if len(self.tps) > 1 else 0.0

    @property
    def peak_vram_bytes(self) -> float:
        return max(v.total_bytes for v in self.vram)

    @property
    def staging_bytes(self) -> float:
        return max(v.staging_bytes for v in self.vram)


def fit_context_to_tests(scn: Scenario, tests: Sequence[BenchTest] | None = None) -> Scenario:
    """The scenario with ``placement.ctx_size`` raised to the largest ``depth + tokens`` of its
    tests (llama-bench sizes its context per test as n_prompt + n_gen + n_depth); unchanged
    when it is large enough."""
    from dataclasses import replace

    need = max((t.n_depth + t.n_prompt + t.n_gen for t in (tests or scn.workload.tests())), default=0)
    if need > scn.placement.ctx_size:
        return scn.with_(placement=replace(scn.placement, ctx_size=need))
    return scn


#: the ``rep`` index of :func:`rep_rng` that draws the routing of a test's warm-up run
WARMUP_REP = 10_000


def warmup_test(test: BenchTest) -> BenchTest:
    """The untimed warm-up llama-bench runs before a test's repetitions (unless
    ``--no-warmup``; ``tools/llama-bench/llama-bench.cpp``, "warmup run"): one prompt of the
    test's ``n_prompt`` tokens for a pp test, **one** generated token for a tg test, on an empty
    KV cache (no ``-d`` depth; llama-bench has no flag for a longer generation warm-up). Only
    an expert cache keeps anything of it (:func:`run_variant_test`)."""
    if test.n_prompt:
        return BenchTest(test.n_prompt, 0, 0)
    return BenchTest(0, min(test.n_gen, 1), 0)


#: First word after the seed of a test's routing stream (:func:`rep_rng`); the integer streams
#: (``-1`` context set-up, the fixed streams of :mod:`sim.views.reproduce`) have 3 words, so no
#: test stream can equal one.
_TEST_STREAM = 0x7E57


def rep_rng(seed: int, test: BenchTest | int, rep: int) -> np.random.Generator:
    """The routing rng of one repetition of one test (shared by all variants).

    Seeded by the test itself (``n_prompt``, ``n_gen``, ``n_depth``), not by its place in a
    list: a test draws the same routing whether it runs alone or after others, in ``run``,
    ``trace``, ``breakdown``, ``compare`` or ``reproduce``. An integer ``test`` names a fixed
    stream instead (``-1``: context set-up; :mod:`sim.views.reproduce`'s own streams).

    Args:
        seed: the scenario's ``seed``.
        test: the test, or an integer stream number.
        rep: the repetition (``-1`` and :data:`WARMUP_REP` are streams of their own).
    """
    if isinstance(test, BenchTest):
        return np.random.default_rng([seed, _TEST_STREAM, test.n_prompt, test.n_gen, test.n_depth, rep + 1])
    return np.random.default_rng([seed, int(test) + 1, rep + 1])


def time_plan(plan: Plan, scn: Scenario, engine: str = "analytic") -> Schedule:
    """Durations from the cost model (checked finite and >= 0 before use), then the engine's schedule.

    Raises:
        ScenarioError: a duration is infinite, NaN or negative (inputs outside any physical range).
    """
    from sim.errors import ScenarioError

    dur = plan_durations(plan, scn.hardware)
    arr = np.asarray(dur, dtype=float)
    if arr.size and not (np.isfinite(arr).all() and (arr >= 0).all()):
        i = int(np.argmax(~np.isfinite(arr) | (arr < 0)))
        raise ScenarioError(f"op {i} ({plan.names[i]}) gets a duration of {arr.flat[i]} s: the inputs are outside "
                            "any physical range", file=scn.file)
    return engines.run(plan, dur, engine=engine)


def transfer_stats(plan: Plan, sched: Schedule) -> tuple[float, float]:
    """(exposed H2D seconds, overlap fraction) of one timed plan: the metrics of
    :func:`sim.views.trace.exposed_transfer_s` and :func:`sim.views.trace.overlap_fraction`, computed on the
    plan's arrays (no DataFrame, no trace validation: the schedule comes from an engine)."""
    from sim.views.trace import exposed_from_busy, h2d_busy_hidden_s, overlap_from_busy, plan_transfer_groups

    start = np.asarray(sched.start_s, dtype=np.float64)
    end = np.asarray(sched.end_s, dtype=np.float64)
    total, hidden = h2d_busy_hidden_s(plan_transfer_groups(plan), start, end)
    return float(exposed_from_busy(total, hidden)), float(overlap_from_busy(total, hidden))


#: :func:`run_variant_test` called without a context keeps the contexts it makes for a few
#: (scenario, variant) pairs and reuses them (:func:`shared_context`); False makes a new one
#: per call
ENABLE_SHARED_CONTEXTS = True

#: how many contexts :func:`shared_context` keeps (least recently used dropped first)
SHARED_MAX = 2

_SHARED: dict = {}   # (id(scn), variant) -> (scn, ctx), in least-recently-used order


def clear_shared_contexts() -> None:
    """Drop the contexts kept by :func:`shared_context` (the next call of
    :func:`run_variant_test` without a context builds everything anew: a cold evaluation)."""
    _SHARED.clear()


def shared_context(scn: Scenario, variant: Variant) -> BuildContext:
    """The context :func:`run_variant_test` uses when given none: the one an earlier call made
    for the same scenario object (``scn`` itself, not an equal copy: a scenario is frozen)
    and an equal variant, if it was kept, else a new one (:func:`sim.plan.builder.make_context`,
    with the context stream of :func:`rep_rng`), kept when the memoised path can time it
    (:func:`sim.plan.memo.memo_eligible`: no expert cache, so the context carries no state from
    one test to the next but its caches).

    What a kept context carries over is what determines the structure and the prices of a
    graph: the resolved placement, VRAM and router, the items and splits, op prices and the
    graph templates (ops, compiled predecessors, duration rows of the KV lengths seen). No
    timing is: the templates' timed results are dropped here, so each call times its graphs
    again (the same numbers: the engines are deterministic), as a fresh context would.

    Raises:
        PlacementError: the placement does not fit (a failing context is not kept).
    """
    from sim.plan.memo import GraphTemplate, memo_eligible

    key = (id(scn), variant)
    got = _SHARED.pop(key, None)
    if got is not None and got[0] is scn:
        ctx = got[1]
        for per_engine in ctx.graph_memo.values():
            for tpl in per_engine.values():
                if isinstance(tpl, GraphTemplate):
                    tpl.results.clear()
        _SHARED[key] = got
        return ctx
    ctx = make_context(scn, variant, rep_rng(scn.seed, -1, -1))
    if memo_eligible(ctx):
        while len(_SHARED) >= SHARED_MAX:
            _SHARED.pop(next(iter(_SHARED)))
        _SHARED[key] = (scn, ctx)
    return ctx


def warm_up(scn: Scenario, variant: Variant, test: BenchTest, ctx: BuildContext) -> None:
    """llama-bench's untimed warm-up run (:func:`warmup_test`) on ``ctx`` when it has an expert
    cache (the warm-up warms it; its hits are not counted) and ``scn.workload.warmup`` is on."""
    if ctx.cache is not None and scn.workload.warmup:
        build_plan(scn, variant, warmup_test(test), rep_rng(scn.seed, test, WARMUP_REP), ctx)
        ctx.cache.reset_stats()


def fill_cache_before(scn: Scenario, variant: Variant, tests: Sequence[BenchTest], test_index: int,
                      ctx: BuildContext, engine: str = "analytic") -> None:
    """Bring ``ctx``'s expert cache to where ``run`` has it when test ``test_index`` of ``tests``
    starts its first timed repetition: the earlier tests' warm-ups and repetitions
    (:func:`run_variant_test`, ``scn.workload.repetitions`` each), then this test's warm-up
    (:func:`warm_up`). Nothing without a cache (the routing draws depend on no earlier run)."""
    if ctx.cache is None:
        return
    for earlier in tests[:test_index]:
        run_variant_test(scn, variant, earlier, scn.workload.repetitions, engine, ctx)
    warm_up(scn, variant, tests[test_index], ctx)


def full_repetition(scn: Scenario, variant: Variant, test: BenchTest, rep: int,
                    ctx: BuildContext, engine: str = "analytic") -> tuple[Plan, Schedule, float]:
    """Repetition ``rep`` of one test built and timed as a whole plan (the reference path of
    :func:`run_variant_test`): ``(plan, schedule, seconds)``, the seconds as llama-bench times
    the test (the makespan less the next ubatch's host work that overlaps the GPU's,
    :func:`sim.plan.overlap.ubatch_overlap_s`). The first timed repetition (``rep`` 0) captures
    the CUDA graphs (``ctx.rep``, :func:`sim.plan.builder.graph_calls`)."""
    from sim.plan.overlap import graph_host_edges, ubatch_overlap_s

    prev, ctx.rep = ctx.rep, rep
    try:
        plan = build_plan(scn, variant, test, rep_rng(scn.seed, test, rep), ctx)
    finally:
        ctx.rep = prev
    sched = time_plan(plan, scn, engine)
    edges = graph_host_edges(plan, np.asarray(sched.start_s, dtype=float), np.asarray(sched.end_s, dtype=float))
    return plan, sched, float(sched.makespan_s) - ubatch_overlap_s(ctx, test, *edges)


def run_variant_test(scn: Scenario, variant: Variant, test: BenchTest,
                     repetitions: int, engine: str = "analytic",
                     ctx: BuildContext | None = None, *, memo: bool = True) -> TestResult:
    """Build, time and summarise ``repetitions`` runs of one test under one variant.

    With an expert cache, llama-bench's warm-up run (:func:`warmup_test`) is built first on the
    same context (its hits are not counted; not with ``scn.workload.warmup`` False: ``--no-warmup``); the cache then carries over the repetitions, as
    in llama-bench's context, and over the tests of the variant that share ``ctx``.

    Args:
        ctx: the variant's context; None: :func:`shared_context` (with ``memo``; a new one
            from :func:`sim.plan.builder.make_context` without, or with
            :data:`ENABLE_SHARED_CONTEXTS` off).
        memo: time each distinct graph once and sum over the test's graphs
            (:mod:`sim.plan.memo`; the same numbers to rounding) where that is exact; False builds
            and times the full plan of every repetition (the reference path).

    Raises:
        PlacementError: the placement does not fit with this variant.
        ValueError: ``repetitions`` below 1 (no t/s to report).
    """
    from sim.plan.memo import memo_eligible, time_test

    if repetitions < 1:
        raise ValueError(f"repetitions: {repetitions} is below 1 (no run to time)")

    if ctx is None:
        ctx = (shared_context(scn, variant) if memo and ENABLE_SHARED_CONTEXTS
               else make_context(scn, variant, rep_rng(scn.seed, -1, -1)))
    warm_up(scn, variant, test, ctx)
    fast = memo and memo_eligible(ctx)
    templates = ctx.graph_memo.setdefault(engine, {})  # shared by the tests and repetitions of this context
    tps, mk, h2d, exp, ovl = [], [], [], [], []
    try:
        for r in range(repetitions):
            ctx.rep = r  # the first timed repetition captures the CUDA graphs (graph_calls)
            if fast:
                tt = time_test(ctx, test, rep_rng(scn.seed, test, r), engine, templates)
                t, nb, e, o = tt.makespan_s, tt.h2d_bytes, tt.exposed_transfer_s, tt.overlap_fraction
            else:
                plan, sched, t = full_repetition(scn, variant, test, r, ctx, engine)
                nb = plan.meta["h2d_bytes"]
                e, o = transfer_stats(plan, sched)
            mk.append(t)
            tps.append(test.n_tokens / t)
            h2d.append(nb)
            exp.append(e)
            ovl.append(o)
    finally:
        ctx.rep = None
    return TestResult(
        variant=variant.name, test=test.name, n_tokens=test.n_tokens, tps=np.asarray(tps),
        makespan_s=np.asarray(mk), ttft_s=float(np.mean(mk)) if test.n_prompt else None,
        h2d_bytes=float(np.mean(h2d)), exposed_transfer_s=float(np.mean(exp)),
        # the repetitions that copied (a repetition that copies nothing has no share: NaN; fresh-user
        # round 12: one such repetition made the whole test's share NaN)
        overlap_fraction=float(np.nanmean(ovl)) if not np.isnan(ovl).all() else float("nan"),
        # None without a cache or when the test never consulted it (prefetch copies whole tensors)
        cache_hit_rate=ctx.cache.hit_rate if ctx.cache is not None and ctx.cache.n_accesses else None,
        vram=tuple(ctx.vram), n_cpu_moe=ctx.n_cpu_moe, engine=engine,
    )


def spread_capture_s(scn: Scenario, test: BenchTest) -> tuple[float, float]:
    """``(spread, whole)`` seconds of the CUDA-graph capture in a test's simulated time when
    :attr:`~sim.model.specs.Workload.bench_repetitions` spreads it over llama-bench's ``-r``
    (:func:`sim.plan.builder.graph_calls`): ``spread`` is what each simulated repetition carries
    (``whole / r``), ``whole`` what llama-bench's first timed repetition pays alone
    (``capture_per_layer_s * n_layer``, the profile's ``[ggml]``). ``(0, 0)`` when the test's
    first graph is rebuilt or reuses no capture, or the profile prices none. The capture is host
    work before the first graph's launch, so it adds to the test's time whole."""
    from sim.plan.builder import graph_calls

    g = scn.hardware.ggml
    r = scn.workload.bench_repetitions
    if g is None or g.capture_per_layer_s <= 0 or r <= 0:
        return 0.0, 0.0
    share = graph_calls(scn, test)[0][2]
    spread = g.capture_per_layer_s * scn.model.n_layer * share
    return spread, spread * r


def bench_mean_tps(scn: Scenario, tests: Sequence[BenchTest], makespans_s) -> np.ndarray:
    """llama-bench's ``avg_ts`` of a row from simulated repetitions, one per routing draw:
    llama-bench averages the t/s of its ``-r`` repetitions (``samples_ts``), and only its first
    one captures the CUDA graphs, so with the capture spread over the simulated repetitions
    (:attr:`~sim.model.specs.Workload.bench_repetitions` ``r``) the draw's mean of ``r``
    repetitions is ``(n / (t0 + C) + (r - 1) * n / t0) / r``, ``t0`` the draw's time without the
    capture and ``C`` the whole capture (:func:`spread_capture_s`), not ``n / (t0 + C / r)``.

    Args:
        tests: the row's tests (one, or a ``-pg`` prompt and generation timed as one).
        makespans_s: (len(tests), D) or (D,) seconds of each test in each of D draws.

    Returns:
        (D,) t/s, one per draw: ``n / t`` when nothing is spread (``r`` 0 or no capture).
    """
    t = np.atleast_2d(np.asarray(makespans_s, dtype=float))
    n = float(sum(x.n_tokens for x in tests))
    total = t.sum(axis=0)
    caps = [spread_capture_s(scn, x) for x in tests]
    spread = sum(c[0] for c in caps)
    r = scn.workload.bench_repetitions
    if spread <= 0 or r <= 1:
        return n / total
    whole = sum(c[1] for c in caps)
    t0 = total - spread
    return (n / (t0 + whole) + (r - 1) * n / t0) / r


def _run_variant(scn: Scenario, v: Variant, tests: Sequence[BenchTest], reps: int, engine: str,
                 ctx: BuildContext | None = None) -> list[TestResult]:
    ctx = ctx or make_context(scn, v, rep_rng(scn.seed, -1, -1))
    return [run_variant_test(scn, v, t, reps, engine, ctx) for t in tests]


def run_scenario(scn: Scenario, *, variants: Sequence[Variant] | None = None,
                 tests: Sequence[BenchTest] | None = None, engine: str = "analytic",
                 repetitions: int | None = None,
                 progress: Callable[[Iterable], Iterable] | None = None,
                 jobs: int | None = None) -> list[TestResult]:
    """All (variant, test) cells of a scenario, variant-major.

    ``variants``: :class:`~sim.model.specs.Variant` objects or labels (``"slots3"``,
    :func:`~sim.model.specs.parse_variant`), or one of either; None: the scenario's.

    Variants run in parallel processes (``jobs``, default: all cores); the tests of one variant
    run in order in one process so that an expert cache stays warm across them. Results do not
    depend on ``jobs`` (every repetition has its own seeded rng).

    Raises:
        PlacementError: a variant's placement does not fit (names the scenario file).
        ValueError: ``repetitions`` below 1, or no variant or no test to run (given empty, or the
            scenario has none).
        ScenarioError: an unknown variant label.
        TypeError: a variant that is neither a Variant nor a label.
    """
    import os

    from sim.cli.interrupt import WorkerPool
    from sim.cli.progress import closed_after

    # None means the scenario's; an empty list or 0 is refused, not read as "the default"
    # (fresh-user round 10: repetitions=0 ran the scenario's, variants=() returned [])
    if isinstance(variants, (str, Variant)):   # one variant, by label or object
        variants = [variants]
    variants = [parse_variant(v) if isinstance(v, str) else v
                for v in (scn.variants if variants is None else variants)]
    if any(not isinstance(v, Variant) for v in variants):
        raise TypeError("variants: expected Variant objects or variant labels (sim.model.specs.parse_variant)")
    tests = list(scn.workload.tests() if tests is None else tests)
    if repetitions is not None and repetitions < 1:
        raise ValueError(f"repetitions: {repetitions} is below 1 (no run to time)")
    if not variants or not tests:
        raise ValueError(f"nothing to run: {'no variant' if not variants else 'no test'}")
    scn = fit_context_to_tests(scn, tests)
    reps = scn.workload.repetitions if repetitions is None else repetitions
    jobs = min(jobs or os.cpu_count() or 1, len(variants))
    # fail fast, in this process, on a placement that does not fit (the serial path reuses these
    # contexts; worker processes build their own from the same seeded rng)
    ctxs = [make_context(scn, v, rep_rng(scn.seed, -1, -1)) for v in variants]
    if jobs <= 1:
        pairs = list(zip(variants, ctxs))
        with closed_after(progress(pairs) if progress else pairs) as it:
            per = [_run_variant(scn, v, tests, reps, engine, ctx) for v, ctx in it]
    else:
        del ctxs  # the workers build their own
        with WorkerPool(max_workers=jobs) as ex:  # an interruption stops the workers at once
            # largest first: a variant with an expert cache builds every graph (not memoised)
            order = sorted(range(len(variants)), key=lambda k: variants[k].expert_cache == "none")
            by_k = {k: ex.submit(_run_variant, scn, variants[k], tests, reps, engine) for k in order}
            futs = [by_k[k] for k in range(len(variants))]
            with closed_after(progress(futs) if progress else futs) as it:
                per = [f.result() for f in it]
    return [r for rs in per for r in rs]


def speedups(results: Sequence[TestResult], baseline: str = "baseline") -> dict[tuple[str, str], float | None]:
    """``(variant, test) -> mean t/s ratio vs the baseline variant`` (None for a test the
    baseline did not run).

    Raises:
        ValueError: ``baseline`` is none of the results' variants (every ratio would be None).
    """
    names = {r.variant for r in results}
    if results and baseline not in names:
        raise ValueError(f"baseline: '{baseline}' is none of the results' variants ({', '.join(sorted(names))})")
    base = {r.test: r.tps_mean for r in results if r.variant == baseline}
    return {(r.variant, r.test): (r.tps_mean / base[r.test] if r.test in base else None) for r in results}
