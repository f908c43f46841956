"""``prefetch-sim`` command line.

Subcommands: ``run`` (llama-bench's flags and output for every variant: :mod:`sim.cli.benchflags`,
:mod:`sim.views.report`), ``trace`` (Chrome trace of one test), ``calibrate`` (measure a GPU), ``validate`` (predicted vs measured on a GPU),
``crossover`` (sweeps and crossover plots), ``check`` (hazard checker). Errors in user input
print one line naming the file and field, and exit with status 2.
"""

from __future__ import annotations

import argparse
import os
import importlib
import re
import sys
from dataclasses import replace
from pathlib import Path

from sim.atomic import check_output_path, write_atomic
from sim.errors import PlacementError, PrefetchSimError, ScenarioError
from sim.views.report import FORMATS  # run's -o formats (llama-bench's)
from sim.wording import plural

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SCENARIO = "scenarios/default.toml"


def default_scenario_path() -> Path:
    """``scenarios/default.toml`` of the working directory if present, else the shipped one
    (the checkout's in a source checkout or editable install, the wheel's package data
    otherwise; :mod:`sim.resources`)."""
    from sim.resources import shipped

    here = Path.cwd() / DEFAULT_SCENARIO
    return here if here.exists() else shipped(DEFAULT_SCENARIO)


def scenario_path(arg: str | None) -> Path:
    """The scenario a command names: ``arg``, or :func:`default_scenario_path` when none is given.
    ``arg`` is a path (relative to the working directory if it exists there, else to the
    shipped files: ``scenarios/laguna-2x3090.toml`` works from any folder) or a built-in name
    (``laguna-2x3090``); :func:`sim.resources.resolve_scenario` has the rules.

    Raises:
        ScenarioError: ``arg`` is an empty string (``prefetch-sim run ''``), or an unknown bare
            name (listing the built-in names), field ``scenario``.
    """
    if arg is None:
        return default_scenario_path()
    if not arg.strip():
        raise ScenarioError("empty scenario path (leave it out for the default scenario)", field="scenario")
    from sim.resources import resolve_scenario

    return resolve_scenario(arg)


def _int_list(text: str) -> tuple[int, ...]:
    """llama-bench list syntax: ``512,1024`` or ``512-2048*2`` (start-end*mult) or ``a-b+s``
    (start-end+step), as llama-bench parses ``-p``/``-n``/``-d`` (:func:`sim.cli.benchflags.int_list`).

    Raises:
        argparse.ArgumentTypeError: not integers, a negative value, a range that yields no
            value (end below start), or one that would never end (a multiplier below 2 or a
            start of 0 with ``*``, a step below 1 with ``+``).
    """
    from sim.cli.benchflags import int_list

    return int_list(text)


def _base_scenario(args: argparse.Namespace):
    """The scenario named on the command line (or the default) with ``--variant`` (or the prefetch
    patch's ``-pw``/``-pwg``/``-pes``: :func:`sim.cli.benchflags.prefetch_flag_variants`) applied."""
    from sim.model.specs import load_scenario, parse_variant

    scn = load_scenario(scenario_path(args.scenario))
    ctx = getattr(args, "ctx_size", None)
    if ctx is not None:
        from sim.bounds import TOKENS_MAX

        if not 0 <= ctx <= TOKENS_MAX:
            raise ScenarioError(f"must be 0 (llama-bench's own) to {TOKENS_MAX} tokens, got {ctx}", field="--ctx-size")
        # 0: the smallest; the tests raise it to their depth + tokens (fit_context_to_tests)
        scn = scn.with_(placement=replace(scn.placement, ctx_size=max(1, ctx)))
    from sim.cli.benchflags import prefetch_flag_variants

    flagged = prefetch_flag_variants(args)
    if flagged is not None:
        if getattr(args, "variant", None):
            raise ScenarioError("give the variants either with --variant or with the prefetch patch's "
                                "-pw/-pwg/-pes, not both", field="--variant")
        return scn.with_(variants=flagged)
    if getattr(args, "variant", None):
        vs = tuple(parse_variant(v, field_name="--variant") for v in args.variant)
        names = [v.name for v in vs]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ScenarioError(f"variant given more than once: {', '.join(dup)}", field="--variant")
        from sim.model.specs import check_distinct_variants

        check_distinct_variants(vs, field="--variant")
        scn = scn.with_(variants=vs)
    return scn


def _say_notes(notes) -> None:
    for line in notes.lines:
        print(f"prefetch-sim: note: {line}", file=sys.stderr)


def load_scenario_with_overrides(args: argparse.Namespace):
    """The scenario named on the command line (or the default), with llama-bench's flags applied
    and validated, for a command that simulates one setting (``trace``, ``check``): each flag
    takes one value, but ``-p``/``-n``/``-d``, which set the tests. Notes on flags the
    simulator does not model go to stderr.

    Raises:
        ScenarioError: a flag given several values (naming it), ``-pg``, or any bad value.
    """
    from sim.cli.benchflags import (Notes, load_models, ot_notes, params_from_args, setting_scenario,
                                    setting_unmodelled, threads_unmodelled, unmodelled_notes)
    from sim.engines.metrics import fit_context_to_tests

    scn = _base_scenario(args)
    params = params_from_args(args, scn)
    if params.n_pg:
        raise ScenarioError("this command takes its tests from -p, -n and -d (a pp+tg pair is a pp and a tg test)",
                            field="-pg")
    multi = params.multi()
    if multi:
        raise ScenarioError(f"this command simulates one setting: give one value of {', '.join(multi)} "
                            "(prefetch-sim run takes several)", field=multi[0])
    setting = params.settings()[0]
    notes = Notes()
    notes.extend(unmodelled_notes(args) + ot_notes(args))
    models = load_models(params, scn)
    # a setting run refuses as not modelled is refused here too: its numbers would be another
    # configuration's (fresh-user round 12: breakdown -nkvo 1 printed the -nkvo 0 time)
    why = setting_unmodelled(setting, models[setting.model], scn.hardware)
    if why is not None:
        raise ScenarioError(f"{why[1]}: its numbers would be another configuration's", field=why[0])
    sscn = setting_scenario(setting, params, scn, models[setting.model], notes)
    why_t = threads_unmodelled(setting.n_threads, sscn.model, sscn.placement, sscn.hardware)
    if why_t is not None:
        raise ScenarioError(f"{why_t}: its numbers would be the profile's thread count's", field="-t/--threads")
    _say_notes(notes)
    wl = replace(sscn.workload, n_prompt=params.n_prompt, n_gen=params.n_gen, n_depth=params.n_depth)
    return fit_context_to_tests(sscn.with_(workload=wl))


def fitting_contexts(scn, args: argparse.Namespace) -> list:
    """``[(variant, context)]`` of the scenario's variants that fit in VRAM, for the commands that
    simulate one setting (``trace``, ``breakdown``), by ``run``'s rule: a variant the command line
    asks for (``--variant``) that does not fit is an error; a scenario's own variant that does not
    fit where another fits is left out with a note on stderr.

    Raises:
        PlacementError: a ``--variant`` that does not fit, or no variant fits (the first one's
            reason), in the flags' terms (:func:`placement_error_in_flags`).
    """
    from sim.engines.metrics import make_context, rep_rng

    asked = {v.strip() for v in (getattr(args, "variant", None) or [])}
    out, failed = [], []
    for variant in scn.variants:
        try:
            out.append((variant, make_context(scn, variant, rep_rng(scn.seed, -1, -1))))
        except PlacementError as exc:
            err = placement_error_in_flags(exc, args, variant)
            if variant.name in asked:
                raise err from None
            failed.append((variant, err))
    if not out:
        raise failed[0][1]
    for variant, err in failed:
        print(f"prefetch-sim: note: variant {variant.name} left out: {getattr(err, 'reason', err)}", file=sys.stderr)
    return out


def placement_error_in_flags(exc: Exception, args: argparse.Namespace, variant=None, test_flags=()) -> Exception:
    """``exc`` (a :class:`sim.errors.PlacementError` of the one setting ``trace``/``check`` simulate,
    :func:`load_scenario_with_overrides`, under ``variant``) in the command line's terms: a VRAM
    overflow that flags given cause names them (:func:`sim.cli.benchflags.overflow_in_flags`;
    ``test_flags``: other options that set the tests, ``(flag, value)``); else ``exc``."""
    from sim.cli.benchflags import overflow_in_flags, params_from_args
    from sim.errors import VramOverflowError

    if not isinstance(exc, VramOverflowError):
        return exc
    scn = _base_scenario(args)
    params = params_from_args(args, scn)
    flag = required_variants(args, params).get(variant.name) if variant is not None else None
    return overflow_in_flags(exc, params, params.settings()[0], scn.placement.ctx_size, flag, test_flags=test_flags,
                             ctx_flag=getattr(args, "ctx_size", None) is not None)


def pick_tests(names, tests) -> list[tuple[int, object]]:
    """``(index, test)`` of each test named in ``names`` among the workload's ``tests``
    (:class:`sim.model.specs.BenchTest`), in the order given: ``'pp512 @ d8192'`` as llama-bench
    prints it, or without the spaces (as ``compare-llama-bench.py`` writes it).

    Raises:
        ScenarioError: a name no test has (naming ``--test`` and listing the tests).
    """
    out = []
    for name in names:
        want = "".join(name.split())
        match = [t for t in tests if "".join(t.name.split()) == want]
        if not match:
            raise ScenarioError(f"no test named '{name}' (have: {', '.join(t.name for t in tests)}; "
                                "-p, -n and -d set the workload's tests, e.g. -p 512 -d 8192 for 'pp512 @ d8192')",
                                field="--test")
        out.append((tests.index(match[0]), match[0]))
    return out


def check_plan_work(scn, tests, args, replay=()) -> None:
    """The work budget (``--max-work``, default :data:`sim.bounds.EXPANDED_WORK_MAX`) of building
    and keeping one whole plan per variant and test of ``tests`` (``trace``, ``check``: every op
    is kept, so every variant counts in full), plus the earlier tests ``replay`` that an
    expert-cache variant runs first to fill its cache as ``run`` has it
    (:func:`sim.engines.metrics.fill_cache_before`: a warm-up and ``repetitions`` runs each).

    Raises:
        ScenarioError: over the budget, naming ``--max-work``.
    """
    from sim.bounds import check_work, work_units

    wl = scn.workload
    work = work_units(tests, scn.model.n_layer, wl.n_ubatch, wl.n_batch, 1, len(scn.variants))
    n_cache = sum(1 for v in scn.variants if v.expert_cache != "none")
    if replay and n_cache:
        work += work_units(replay, scn.model.n_layer, wl.n_ubatch, wl.n_batch, wl.repetitions + 1, n_cache)
    check_work(work, getattr(args, "max_work", None), expanded=True)


def _add_bench_flags(p: argparse.ArgumentParser, one_setting: bool = False) -> None:
    """llama-bench's flags on ``p``; ``one_setting``: a command that simulates one setting
    (:func:`load_scenario_with_overrides`), whose ``-pg`` help says it is refused there."""
    from sim.cli.benchflags import add_bench_flags

    add_bench_flags(p)
    if one_setting:
        for a in p._actions:
            if a.dest == "n_pg":
                a.help = "not taken here (give the pp and tg tests with -p and -n); prefetch-sim run takes it"
            elif a.help and "refused, or left out with --skip-unmodelled" in a.help:
                # one setting: nothing else to print, so a setting not modelled is refused
                a.help = a.help.replace("refused, or left out with --skip-unmodelled", "refused here")
            elif a.help and "--vram shows the placement simulated" in a.help:
                a.help = a.help.replace("--vram shows the placement simulated", "run's --vram shows the placement "
                                        "simulated")
            elif a.dest == "skip_unmodelled":
                a.help = ("prefetch-sim run's: leaves out the settings the simulator does not model; this command "
                          "simulates one setting and refuses such a one (-nkvo 1, -embd 1, -sm row/tensor over "
                          "several GPUs, FlashAttention on an iq4_nl K/V cache, another -t with host weights)")


#: characters of the variant's name in its build id (``slots3``: the shortest shipped name)
VARIANT_ID_NAME_CHARS = 6


#: hex digits of the name's SHA-1 in a variant's build id (40 bits: two of a run's variants
#: sharing them is a chance of about 1e-12; six digits let prefetch_gated_35 and
#: prefetch_gated_4914 collide)
VARIANT_ID_HEX = 10


def variant_id(name: str) -> str:
    """A variant's ``build_commit``, 18 characters: ``s``, :data:`VARIANT_ID_HEX` hex digits of
    the SHA-1 of its full name, ``-``, the name's first :data:`VARIANT_ID_NAME_CHARS` characters
    (``-``-padded): ``sc028c3b5c7-prefet`` for ``prefetch_ungated``. The same in every run,
    whatever the other variants."""
    import hashlib

    digest = hashlib.sha1(name.encode()).hexdigest()[:VARIANT_ID_HEX]
    return f"s{digest}-{name[:VARIANT_ID_NAME_CHARS].ljust(VARIANT_ID_NAME_CHARS, '-')}"


def variant_ids(variants) -> dict[str, tuple[str, int]]:
    """``build_commit`` and ``build_number`` of each variant: where llama-bench writes the build,
    our rows name the variant, so that llama.cpp's ``scripts/compare-llama-bench.py`` compares
    variants as it compares builds (``-b <baseline's id> -c <variant's id>``, as ``-o jsonl`` prints them).

    ``build_commit`` is :func:`variant_id`: fixed by the variant alone, so runs written into one
    sqlite file or concatenated JSONL keep each variant's rows apart and never merge two variants
    under one id (ids made from a variant's position did: two runs' second variants shared one).
    That script cuts every ``build_commit`` of its data to the shortest one's length and matches
    ``-b``/``-c`` against the cut ids: every id has one length, so beside other variants alone
    nothing is cut and the id printed is the one to give; beside a real llama.cpp commit (7 or
    more hex digits) they are cut to its length: six hex digits after the ``s`` (which marks a
    simulated build: a git hash has no ``s``) then tell them apart, and :func:`variant_id_note`
    says when two of a run's do not. ``build_number`` (:func:`variant_build_number`) is fixed by
    the variant too: 0 for ``baseline`` (the lowest, the build that script takes as the base), a
    number from the same digest for any other (it was the variant's position in ``--variant``, so
    one variant's rows of two runs could carry two numbers).
    """
    return {v.name: (variant_id(v.name), variant_build_number(v.name)) for v in variants}


def variant_build_number(name: str) -> int:
    """``build_number`` of a variant's rows: 0 for ``baseline``, else 1 plus the first six hex
    digits of :func:`variant_id`'s digest read as a number (the same in every run; at most
    16,777,216)."""
    if name == "baseline":
        return 0
    return 1 + int(variant_id(name)[1:7], 16)


def variant_id_note(variants) -> str | None:
    """A note when two of ``variants`` share the first seven characters of their build ids
    (:func:`variant_id`): beside a real llama.cpp commit (seven hex digits), llama.cpp's compare
    script cuts every id to seven and would merge their rows. None when they are apart."""
    first: dict[str, str] = {}
    for v in variants:
        k = variant_id(v.name)[:7]
        if k in first and first[k] != v.name:
            return (f"variants {first[k]} and {v.name} share the first seven characters of their build ids "
                    f"({k}): beside a real llama.cpp commit, compare-llama-bench.py (which cuts every id to the "
                    "shortest) would merge them; compare them in files of their own")
        first[k] = v.name
    return None


def bench_time() -> str:
    """``test_time`` (RFC 3339, UTC) of a run: now, or ``SOURCE_DATE_EPOCH`` when set."""
    import os
    import time

    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    try:
        t = float(epoch) if epoch else time.time()
    except ValueError:
        t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def display_path(path: str | None) -> str:
    """A file as the ``build:`` line names it: relative to the shipped files (``scenarios/...``)
    or to the working folder when inside them, else as given."""
    if not path:
        return ""
    p = Path(path).resolve()
    bases = []
    try:
        from sim.resources import shipped_root

        bases.append(shipped_root().resolve())
    except Exception:  # noqa: BLE001 - no resources module, or a zip install: use the checkout
        pass
    bases += [REPO_ROOT, Path.cwd().resolve()]
    for b in bases:
        try:
            return str(p.relative_to(b))
        except ValueError:
            continue
    return str(path)


def _combine(parts, n_prompt: int) -> dict:
    """Our fields of one llama-bench test from the results of its simulator tests (two for
    pp+tg: copies and exposed time add up, VRAM is the larger, overlap is weighted by bytes)."""
    h2d = float(sum(p.h2d_bytes for p in parts))
    ovl = [(p.overlap_fraction, p.h2d_bytes) for p in parts if p.overlap_fraction == p.overlap_fraction]
    if ovl and sum(w for _, w in ovl) > 0:
        overlap = sum(o * w for o, w in ovl) / sum(w for _, w in ovl)
    else:
        overlap = ovl[0][0] if ovl else None
    hits = [p.cache_hit_rate for p in parts if p.cache_hit_rate is not None]
    return dict(
        ttft_ms=parts[0].ttft_s * 1e3 if n_prompt and parts[0].ttft_s is not None else None,
        h2d_bytes=int(round(h2d)), peak_vram_bytes=int(max(p.peak_vram_bytes for p in parts)),
        staging_bytes=int(max(p.staging_bytes for p in parts)), overlap_fraction=overlap,
        exposed_transfer_s=float(sum(p.exposed_transfer_s for p in parts)),
        cache_hit_rate=sum(hits) / len(hits) if hits else None)


def per_test_vram(scn, base_ctx: int, tests, results) -> list:
    """``results`` (:class:`sim.engines.metrics.TestResult`) with each one's VRAM for its own
    test's context, as llama-bench makes a context per test: the KV cache of
    ``max(base_ctx, n_depth + n_prompt + n_gen)`` tokens (``base_ctx``: ``--ctx-size`` or the
    scenario's ``placement.ctx_size``, 1 with ``--ctx-size 0``), where the simulation ran every
    test on one context of ``scn``'s (the largest). The times are the simulation's (the KV cache's
    size does not enter them; an expert cache's pool is the one of ``scn``'s context)."""
    from dataclasses import replace as dc_replace

    from sim.errors import PlacementError
    from sim.model.specs import parse_variant
    from sim.model.vram import account

    ctx_of = {t.name: max(base_ctx, t.n_depth + t.n_prompt + t.n_gen) for t in tests}
    memo: dict = {}
    out = []
    for r in results:
        ctx = ctx_of.get(r.test, scn.placement.ctx_size)
        if ctx == scn.placement.ctx_size:
            out.append(r)
            continue
        key = (r.variant, ctx)
        if key not in memo:
            v = next((x for x in scn.variants if x.name == r.variant), None) or parse_variant(r.variant)
            try:
                memo[key] = tuple(account(scn.with_(placement=dc_replace(scn.placement, ctx_size=ctx)), v))
            except PlacementError:  # cannot be: a smaller KV cache than the one that fitted
                memo[key] = r.vram
        out.append(dc_replace(r, vram=memo[key]))
    return out


def setting_rows(instances, model, hw, variants, results, ids, *, engine: str, when: str, combos=None) -> list:
    """The :class:`sim.views.report.BenchRow` s of one setting, from the simulator's results of its
    tests; ``speedup_vs_baseline`` against the ``baseline`` variant's result of the same test
    (None where it was not simulated).

    Without ``combos``: per variant (in order), per llama-bench test (in order); the prefetch
    patch's fields (``prefetch_weights``, ``prefetch_gate``, ``prefetch_expert_slots``) are the
    variant's (:func:`sim.views.llamabench.variant_fields`). With ``combos`` (the ``-pw``/``-pwg``/
    ``-pes`` combinations, :class:`sim.cli.benchflags.PrefetchCombo`): per test, per combination, as
    the patched llama-bench runs them (the combinations innermost), each row printing its
    combination's values and timed by its variant's result (combinations of one variant share
    it); variants no combination names (the baseline added for ``vs base``) print no row."""
    from dataclasses import replace as dc_replace

    import numpy as np

    from sim.cli.benchflags import bench_values
    from sim.views.llamabench import variant_fields
    from sim.views.report import bench_row

    by = {(r.variant, r.test): r for r in results}
    built = {}
    for v in variants:
        bid, bnum = ids[v.name]
        for i, inst in enumerate(instances):
            if any((v.name, t.name) not in by for t in inst.tests):
                continue  # a test whose own context does not fit with this variant: no row
            parts = [by[(v.name, t.name)] for t in inst.tests]
            total = np.sum([np.asarray(p.makespan_s, dtype=float) for p in parts], axis=0)
            samples = [max(1, int(round(float(x) * 1e9))) for x in np.atleast_1d(total)]
            vals = bench_values(inst, model, hw, test_time=when)
            vals.update(build_commit=bid, build_number=bnum, **variant_fields(v))
            extra = dict(variant=v.name, engine=engine, hardware=hw.name, hardware_file=display_path(hw.file),
                         **_combine(parts, inst.n_prompt))
            built[(v.name, i)] = bench_row(vals, samples, extra)

    def with_speedup(name: str, i: int, fields=None):
        r = built[(name, i)]
        b = built.get(("baseline", i))
        s = None if name == "baseline" or b is None or not b.avg_ts else r.avg_ts / b.avg_ts
        values = r.values if fields is None else {**r.values, **fields}
        return dc_replace(r, values=values, extra={**r.extra, "speedup_vs_baseline": s})

    if combos is None:
        return [with_speedup(v.name, i) for v in variants for i in range(len(instances)) if (v.name, i) in built]
    return [with_speedup(c.variant, i, c.fields) for i in range(len(instances)) for c in combos
            if (c.variant, i) in built]


def rows_from_results(scn, results, ratios=None) -> list:
    """:class:`sim.views.report.BenchRow` s of a scenario's results (of
    :func:`sim.engines.metrics.run_scenario` on its own workload), as ``prefetch-sim run`` prints them.
    ``ratios`` is not needed (speedups are computed against the ``baseline`` variant) and kept
    for callers that pass :func:`sim.engines.metrics.speedups`."""
    from sim.cli.benchflags import params_from_args

    params = params_from_args(argparse.Namespace(), scn)
    setting = params.settings()[0]
    insts = [i for i in params.instances(setting) if all(t.name in {r.test for r in results} for t in i.tests)]
    names = {r.variant for r in results}
    variants = [v for v in scn.variants if v.name in names]
    engine = results[0].engine if results else "analytic"
    return setting_rows(insts, scn.model, scn.hardware, variants, results, variant_ids(variants), engine=engine,
                        when=bench_time())


def vram_table(results) -> str:
    """Markdown table of peak VRAM by component (GiB) per setting, variant and GPU.

    ``results``: ``(setting label, TestResult)`` pairs (:func:`run_bench`); one line per GPU for
    each setting and variant: the VRAM of its test whose context peaks highest (each test has its
    own context, as llama-bench's: :func:`per_test_vram`); a ``setting`` column when there are several."""
    from sim.views.report import md_escape
    from sim.units import GiB

    many = len({label for label, _ in results}) > 1
    # n_cpu_moe: the placement simulated (a -fitt fit chooses it per variant; the rows print -ncmoe as given)
    lines = [("| setting " if many else "") + "| variant | GPU | reserved | weights | KV cache | compute | staging | "
             "expert cache | total | free | n_cpu_moe |",
             ("| --- " if many else "") + "| --- | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: |"]
    peak: dict = {}
    for label, r in results:  # per setting and variant, the test whose largest GPU holds most
        key = (label, r.variant)
        if key not in peak or r.peak_vram_bytes > peak[key].peak_vram_bytes:
            peak[key] = r
    for (label, _v), r in peak.items():
        for b in r.vram:
            vals = (b.reserved_bytes, b.weights_bytes, b.kv_bytes, b.compute_bytes, b.staging_bytes, b.cache_bytes,
                    b.total_bytes, b.free_bytes)
            lines.append((f"| {md_escape(label)} " if many else "") + f"| {md_escape(r.variant)} | {b.device} | "
                         + " | ".join(f"{v / GiB:.2f}" for v in vals) + f" | {r.n_cpu_moe} |")
    return "VRAM by component (GiB):\n\n" + "\n".join(lines) + "\n" + cache_pool_table(results)


def cache_pool_table(results) -> str:
    """Markdown table of the expert-cache pool per setting, variant and GPU (:attr:`sim.model.vram.
    VramBreakdown.cache_pool_bytes`: what VRAM leaves for it, minus the fit target for
    ``expert_cache = "fit"``) and the entries it holds; empty when no variant has an expert cache.
    ``results`` as :func:`vram_table`'s."""
    from sim.views.report import md_escape
    from sim.units import GiB

    many = len({label for label, _ in results}) > 1
    lines = []
    seen = set()
    for label, r in results:
        if (label, r.variant) in seen or not any(b.cache_pool_bytes or b.cache_experts for b in r.vram):
            continue
        seen.add((label, r.variant))
        for b in r.vram:
            how = "fit" if b.cache_fit else "free VRAM"
            lines.append((f"| {md_escape(label)} " if many else "")
                         + f"| {md_escape(r.variant)} | {b.device} | {how} | {b.fit_margin_bytes / 2**20:.0f} | "
                         f"{b.cache_pool_bytes / GiB:.2f} | {b.cache_experts} | {b.cache_bytes / GiB:.2f} |")
    if not lines:
        return ""
    head = [("| setting " if many else "") + "| variant | GPU | pool sized by | fit target (MiB) | pool (GiB) | "
            "experts held | held (GiB) |", ("| --- " if many else "") + "| --- | --: | --- | --: | --: | --: | --: |"]
    return "\nExpert cache pool (what VRAM leaves after weights, KV cache, compute buffer and staging):\n\n" + \
        "\n".join(head + lines) + "\n"


def _setting_label(params, setting) -> str:
    from sim.cli.benchflags import FLAG_OF, overrides_text, tensor_split_text

    parts = []
    for k in ("model",) + tuple(k for k in params.values if k not in ("model", "poll")):  # poll: each test's
        if len(params.values[k]) > 1:
            v = getattr(setting, k)
            text = (overrides_text(v) if k == "overrides" else tensor_split_text(v) if k == "tensor_split"
                    else int(v) if isinstance(v, bool) else v)   # -nkvo 1, as given (not True)
            parts.append(f"{FLAG_OF[k]} {text}")
    return " ".join(parts) or "the setting"


def bench_work(scn, params, models, stop_above: int | None = None) -> tuple[int, bool]:
    """The work of a run (:func:`sim.bounds.work_units` summed over its settings) and whether it
    is the whole sum: with ``stop_above``, the sum stops at the first setting that takes it past
    that (a run far over the budget is refused at once, not after summing a million tests)."""
    from sim.cli.benchflags import sim_tests
    from sim.bounds import op_by_op_variants, variant_work, work_units

    total = 0
    share = variant_work(scn.variants, scn.hardware)
    op_share = op_by_op_variants(scn.variants, scn.hardware)
    seen = set()
    settings = params.settings()
    for i, setting in enumerate(settings):
        key = setting.simulated()
        if key in seen:  # simulated once (run_bench)
            continue
        seen.add(key)
        model = models[setting.model]
        tests = sim_tests(params.instances(setting))
        total += work_units(tests, model.n_layer, setting.n_ubatch, setting.n_batch, params.repetitions, share,
                            moe_variants=float(len(scn.variants)) if model.moe is not None else None,
                            plans=float(len(scn.variants)), op_variants=op_share)
        if stop_above is not None and total > stop_above and i < len(settings) - 1:
            return total, False
    return total, True


def run_bench(scn, params, *, engine: str = "analytic", progress=None, notes=None, max_work: int | None = None,
              required=None, ctx_flag: bool = False, skip_unmodelled: bool = False):
    """Simulate every setting of ``params`` over ``scn`` under the scenario's variants.

    A setting the simulator does not model (:func:`sim.cli.benchflags.unmodelled_setting`:
    ``-nkvo 1``, ``-sm row`` over several GPUs, ``-embd 1``) is refused naming its flag, or left
    out with a note with ``skip_unmodelled`` (``--skip-unmodelled``).

    ``ctx_flag``: ``--ctx-size`` set the scenario's context (a VRAM overflow's advice names it).

    ``max_work``: the work budget (:func:`sim.bounds.check_work`; default
    :data:`sim.bounds.WORK_MAX`), checked before anything is simulated.

    ``required``: the variants the command line asked for, ``{name: (flag, value)}`` (the
    ``-pw``/``-pwg``/``-pes`` combinations' or ``--variant``'s): one that does not fit a setting
    where another variant fits is an error naming the flag and the value. Any other variant (the
    scenario's own, the baseline added for ``vs base``) that does not fit is left out of the
    setting (noted). A setting where no variant fits, or whose context llama.cpp refuses
    (:class:`sim.errors.ContextRefusedError`: ``-ctv q4_0 -fa 0``), is left out (noted) when other
    settings give rows, and counted in ``unfit`` (``run`` then exits 1 after printing the others'
    rows, as llama-bench exits 1 on a model or context it cannot load); when none does, the first
    setting's reason is the error, said once. Settings that differ
    only in flags the simulator does not model (``-C``, ``-dev``, ``--repack``...:
    :meth:`sim.cli.benchflags.Setting.simulated`) are simulated once, each printing its own values.

    Returns:
        ``(rows, results, unfit)``: the :class:`sim.views.report.BenchRow` s in llama-bench's order
        (setting, then variant, then test; with ``-pw``/``-pwg``/``-pes``: setting, test,
        combination), every :class:`sim.engines.metrics.TestResult` with its setting's label
        (``(label, result)``; ``-ncmoe 48``, "the setting" when the flags give one), and one line per
        setting left out because no variant fits (its flags and the reason).

    Raises:
        PlacementError: no setting fits at all (the first one's reason; a VRAM overflow names the
            flags given that size what overflows, :func:`sim.cli.benchflags.overflow_in_flags`).
        ScenarioError: a bad flag value (``-ot`` rule, ``-mg``, a model file), a required variant
            that does not fit (naming its flag), or a run over the work budget (naming
            ``--max-work``).
    """
    from sim.cli.benchflags import (Notes, load_models, overflow_in_flags, setting_scenario, setting_unmodelled,
                                    sim_tests, threads_unmodelled)
    from sim.bounds import LIST_VALUES_MAX, WORK_MAX, check_work
    from sim.plan.builder import make_context
    from sim.errors import ContextRefusedError, PlacementError
    from sim.engines.metrics import fit_context_to_tests, rep_rng, run_scenario

    notes = notes if notes is not None else Notes()
    required = dict(required or {})
    models = load_models(params, scn)
    n_settings = 1
    for k, v in params.values.items():
        n_settings *= len(v)
    if n_settings > LIST_VALUES_MAX:
        raise ScenarioError(f"the flags give {n_settings:,} combinations, more than the limit of "
                            f"{LIST_VALUES_MAX}", field="-p/-n/-ub/...")
    work, whole = bench_work(scn, params, models, stop_above=WORK_MAX if max_work is None else max_work)
    check_work(work, max_work, at_least=not whole)
    ids = variant_ids(scn.variants)
    when = bench_time()
    rows, all_results, first_err, unfit = [], [], None, []
    settings = params.settings()
    done = {}  # Setting.simulated() -> (scenario, variants, results): settings that differ in unmodelled flags only
    skipped = 0
    for si, setting in enumerate(settings):
        model = models[setting.model]
        insts = params.instances(setting)
        label = _setting_label(params, setting)
        why = setting_unmodelled(setting, model, scn.hardware)
        if why is not None:
            if not skip_unmodelled:
                raise ScenarioError(f"{why[1]}: its rows would print another configuration's numbers; give "
                                    "--skip-unmodelled to leave them out", field=why[0])
            notes.add(f"{label}: left out (--skip-unmodelled): {why[1]}")
            skipped += 1
            continue
        key = setting.simulated()
        if key in done:
            sscn, variants, results = done[key]
            all_results += [(label, r) for r in results]
            rows += setting_rows(insts, sscn.model, scn.hardware, variants, results, ids, engine=engine, when=when,
                                 combos=params.prefetch)
            continue
        try:
            sscn = setting_scenario(setting, params, scn, model, notes)
        except ContextRefusedError as err:
            # llama-bench prints the rows before it and stops with status 1: left out as a
            # setting that does not fit
            first_err = first_err or err
            unfit.append((label, f"{label}: left out: {err.reason}" if len(settings) > 1 else err.reason))
            continue
        why = threads_unmodelled(setting.n_threads, sscn.model, sscn.placement, sscn.hardware)
        if why is not None:
            if not skip_unmodelled:
                raise ScenarioError(f"{why}: its rows would print the profile's thread count's numbers; give "
                                    "--skip-unmodelled to leave them out", field="-t/--threads")
            notes.add(f"{label}: left out (--skip-unmodelled): {why}")
            skipped += 1
            continue
        if sscn.model.moe is None:
            for v in sscn.variants:
                if v.expert_slots and not v.prefetch_weights:
                    notes.add(f"variant {v.name}: {sscn.model.name} has no experts: expert slots stage nothing, "
                              "its rows are the baseline's")
        tests = sim_tests(insts)
        past = sscn.model.past_trained_context(max((t.n_prompt + t.n_gen + t.n_depth for t in tests), default=0),
                                               " (-p + -n + -d)")
        if past:
            notes.add(past)
        base_ctx = sscn.placement.ctx_size
        prog = None
        if progress is not None:
            prog = (lambda it, _d=f"simulating {si + 1}/{len(settings)}": progress(it, _d))
        # one context for every test (the largest depth + tokens); where it does not fit, each
        # group of tests of one context size on its own (llama-bench makes a context per test)
        groups = [tests]
        if len(tests) > 1 and fit_context_to_tests(sscn, tests).placement.ctx_size != base_ctx:
            try:
                for v in sscn.variants:
                    make_context(fit_context_to_tests(sscn, tests), v, rep_rng(sscn.seed, -1, -1))
            except PlacementError:
                need = {}
                for t in tests:
                    need.setdefault(max(base_ctx, t.n_depth + t.n_prompt + t.n_gen), []).append(t)
                groups = [need[c] for c in sorted(need)]
        variants, results, left = [], [], 0
        for gtests in groups:
            gscn = fit_context_to_tests(sscn, gtests)
            names = ", ".join(t.name for t in gtests)
            glabel = label if len(groups) == 1 else (names if len(settings) == 1 else f"{label}: {names}")
            gvariants = list(sscn.variants)
            try:
                got = run_scenario(gscn, variants=gvariants, tests=gtests, engine=engine, progress=prog)
            except PlacementError as exc:
                ok, bad = [], []
                for v in gvariants:
                    try:
                        make_context(gscn, v, rep_rng(gscn.seed, -1, -1))
                        ok.append(v)
                    except PlacementError as e:
                        bad.append((v, e))
                if not ok:  # the setting itself does not fit: one reason, said once (in flags when they cause it)
                    v0, err = bad[0] if bad else (None, exc)
                    err = overflow_in_flags(err, params, setting, scn.placement.ctx_size,
                                            required.get(v0.name) if v0 is not None else None, ctx_flag=ctx_flag)
                    first_err = first_err or err
                    reason = err.reason[len(label) + 2:] if err.reason.startswith(label + ": ") else err.reason
                    unfit.append((glabel, f"{glabel}: left out, no variant fits: {reason}"))
                    left += 1
                    continue
                for v, e in bad:
                    if v.name in required and len(groups) == 1:
                        flag, value = required[v.name]
                        where = f" ({label})" if len(settings) > 1 else ""
                        mapped = overflow_in_flags(e, params, setting, scn.placement.ctx_size, required[v.name],
                                                   where=where, ctx_flag=ctx_flag)
                        if mapped is not e:
                            raise mapped from None
                        raise ScenarioError(f"{value}{where}: {e.reason}", field=flag) from None
                    notes.add(f"{glabel}: variant {v.name} left out: {e.reason}")
                got = run_scenario(gscn, variants=ok, tests=gtests, engine=engine, progress=prog)
            results += per_test_vram(gscn, base_ctx, gtests, got)
            variants += [v for v in gscn.variants if v not in variants and any(r.variant == v.name for r in got)]
        if left == len(groups):
            continue
        variants = [v for v in sscn.variants if v in variants]  # the scenario's order
        done[key] = (sscn, variants, results)
        all_results += [(label, r) for r in results]
        rows += setting_rows(insts, sscn.model, scn.hardware, variants, results, ids, engine=engine, when=when,
                             combos=params.prefetch)
    if not rows and first_err is None and skipped:
        raise ScenarioError("every setting is one the simulator does not model (left out by --skip-unmodelled): "
                            "nothing to print", field="--skip-unmodelled")
    if not rows:
        assert first_err is not None
        if len(unfit) > 1:  # every setting left out: the first one's reason, the others named
            others = [label for label, _line in unfit[1:]]
            shown = ", ".join(others[:8]) + (f" and {len(others) - 8} more" if len(others) > 8 else "")
            verb = "does" if len(others) == 1 else "do"
            what = "fit" if isinstance(first_err, PlacementError) else "run"
            raise type(first_err)(f"{first_err.reason}; {shown} {verb} not {what} either", file=first_err.file,
                                  field=first_err.field) from None
        raise first_err
    if notes is not None:   # on a run that gives rows only (an error stays one line)
        for m in models.values():
            note = untabled_types_note(m, scn.hardware)
            if note:
                notes.add(note)
    return rows, all_results, [line for _label, line in unfit]


def required_variants(args: argparse.Namespace, params) -> dict[str, tuple[str, str]]:
    """The variants a ``run`` command line asks for, ``{name: (flag, value as given)}``: each
    ``-pw``/``-pwg``/``-pes`` combination's variant (the flags that differ from the patch's
    defaults, ``-pwg`` only with ``-pw 1``: ``-pes 1000``, ``-pw 1 -pwg 0``) or each ``--variant``."""
    from sim.cli.benchflags import PREFETCH_FLAGS
    from sim.views.llamabench import PREFETCH_DEFAULTS

    out: dict[str, tuple[str, str]] = {}
    for c in params.prefetch or ():
        if c.variant in out:
            continue
        given = [f"{opts[0]} {c.fields[name]}" for name, opts, *_ in PREFETCH_FLAGS
                 if c.fields[name] != PREFETCH_DEFAULTS[name] and (name != "prefetch_gate" or c.prefetch_weights)]
        flag = "-pes/--prefetch-experts-slots" if c.prefetch_expert_slots else "-pw/--prefetch-weights"
        out[c.variant] = (flag, " ".join(given) or c.flags)
    for name in getattr(args, "variant", None) or ():
        out.setdefault(name.strip(), ("--variant", f"--variant {name}"))
    return out


def no_kernel_tables_note(scn) -> str | None:
    """The note a MoE run on a profile without llama.cpp kernel tables (``[ggml]``) gets: its
    expert matmuls are priced at the profile's dense GEMM rate and its roofline, not llama.cpp's
    MUL_MAT_ID kernels; on the H200 the datasheet profile predicts resident Qwen3-30B-A3B at
    52.8k t/s pp512 and 454 t/s tg128 where llama-bench measured 7.06k and 305
    (data/llamacpp/h200-20261201). None for a dense model or a profile with ``[ggml]``."""
    if scn.hardware.ggml is not None or scn.model.moe is None:
        return None
    return (f"profile '{scn.hardware.name}' has no llama.cpp kernel tables: expert matmuls are priced at its dense "
            "GEMM rate, not llama.cpp's MUL_MAT_ID (on the H200 that overstates MoE pp512 about 7x and tg128 1.5x); "
            "read the variants' ratios, not the absolute t/s")


def untabled_types_note(model, hw) -> str | None:
    """The note a run gets when ``model`` has GPU weight types that the profile's llama.cpp kernel
    tables (``[ggml] gpu_kernels``) have no case of. A quantised type is priced from measured
    types of its family (:meth:`sim.model.ggmlcost.GgmlKernels.proxy_mix`: Q5_K from Q4_K and
    Q6_K, Q4_0 from Q8_0 ...), and an expert tensor whose type has no ``MUL_MAT_ID`` case (Q8_0)
    from Q4_K's expert kernels scaled by the dense ratio; the note names them and the size of
    error to expect. A float type (F16, BF16) falls back to the generic roofline (cuBLAS runs
    it). f32 weights (norms, the MoE router) are priced apart and left out. None when every type
    has a case, or the profile has no tables."""
    g = hw.ggml
    if g is None:
        return None
    have = g.measured_types("gpu")
    types = {t.ggml_type.upper() for t in model.tensors
             if t.ggml_type and t.ggml_type.upper() != "F32" and not t.name.startswith("token_embd")}
    experts = {t.ggml_type.upper() for t in model.tensors if t.ggml_type and "_exps" in t.name}
    proxied = {ty: g.proxy_mix("MUL_MAT", ty) for ty in sorted(types - have)}
    roofline = sorted(ty for ty, mix in proxied.items() if not mix)
    by_proxy = {ty: mix for ty, mix in proxied.items() if mix}
    # an expert type measured for dense matmuls only: from its family's expert curve, else from
    # Q4_K's scaled by the dense ratio (GgmlKernels.moe_s)
    id_missing = sorted(ty for ty in experts if ty in have and ty not in g.curve_types("gpu", "MUL_MAT_ID"))
    id_proxy = {ty: mix for ty in id_missing if (mix := g.proxy_mix("MUL_MAT_ID", ty))}
    id_dense = [ty for ty in id_missing if ty not in id_proxy]
    parts = []
    if by_proxy or id_proxy:
        said = ", ".join(f"{ty} from {' and '.join(p for p, _w in mix)}" for ty, mix in {**by_proxy, **id_proxy}.items())
        parts.append(f"weight type(s) with no case of their own priced from measured types of their family ({said})")
    if id_dense:
        parts.append(f"expert matmuls of {', '.join(id_dense)} (no MUL_MAT_ID case) from Q4_K's scaled by the dense "
                     f"{'/'.join(id_dense)}-to-Q4_K ratio")
    if parts:
        low = sorted(t for t in {**by_proxy, **id_proxy} if t.startswith(("IQ", "TQ", "Q2_", "Q3_")))
        parts[-1] += (": the measured types differ by up to 25 % at one shape, the error to expect on those "
                      "matmuls" + (f"; {', '.join(low)} unpack at more cost per weight than any measured type, so "
                                   "expect more, their prefill priced too fast" if low else ""))
    if roofline:
        parts.append(f"weight type(s) {', '.join(roofline)} priced by the generic roofline, which can be off "
                     "several times"
                     + (f" (expert matmuls of {', '.join(t for t in roofline if t in experts)} most: llama.cpp does "
                        "not run MUL_MAT_ID as one cuBLAS GEMM, so their prefill is likely priced too fast)"
                        if any(t in experts for t in roofline) else ""))
    # types whose prefill has MMQ cases of its own (gpu_kernels_extra, timed on another GPU of the
    # same SMs): what the parts above say prices their matvecs
    mmq = sorted(t for t in (set(by_proxy) | set(roofline)) if t in g.curve_types("gpu", "MUL_MAT"))
    if mmq:
        parts.append(f"{', '.join(mmq)} prefill (above 8 tokens) priced from kernel cases of {'its' if len(mmq) == 1 else 'their'} "
                     "own timed on an H100 (gpu_kernels_extra; the matvecs as said)")
    if not parts:
        return None
    return (f"model '{model.name}' on profile '{hw.name}' (its kernel tables measured {', '.join(sorted(have))}): "
            + "; ".join(parts) + "; measure them (docs/llamacpp.md, \"Kernel tables and the llama.cpp profile\") "
            "before trusting those rows")


def trace_wrap_note(scn, params) -> str | None:
    """A note when a routing trace (``routing.kind = "trace"``) holds fewer tokens than the
    run's largest prompt ubatch (``min(-p, -ub, -b)``): the ubatch replays the trace's tokens
    more than once (:mod:`sim.model.routing`, the trace wraps around), so it uses no more
    distinct experts than the trace's tokens do and copies less than a real prompt of that
    length would (laguna-2x3090 with the shipped 64-token trace: 59 % of the expert bytes at
    2048-token ubatches against the fitted 84 %, and ungated prefetch's gain at 90k tokens went
    from +16.3 % to +0.5 %: fresh-user round 8). None otherwise."""
    r = scn.routing
    if getattr(r, "kind", "uniform") != "trace" or scn.model.moe is None:
        return None
    # only where some setting runs the scenario's own model: a -m model gets the trace only if it
    # fits it, else uniform routing (benchflags says so); a dense -m model has no routing at all
    # (fresh-user round 10: the note came with -m llama3-8b)
    own = getattr(scn.model, "file", None)
    if None not in params.values["model"] and not (
            own and any(os.path.realpath(str(m)) == os.path.realpath(own) for m in params.values["model"])):
        return None
    from sim.model.routing import load_trace

    moe = scn.model.moe
    try:
        t = load_trace(r.trace_file, n_expert=moe.n_expert, top_k=moe.n_expert_used, n_layer=scn.model.n_layer,
                       first_moe_layer=moe.n_layer_dense_lead)
    except Exception:  # noqa: BLE001 - the scenario's loader reports a bad trace
        return None
    sizes = [p for p in params.n_prompt if p] + [p for p, _g in params.n_pg if p]
    if not sizes:
        return None
    ub = max(min(max(sizes), u, b) for u in params.values["n_ubatch"] for b in params.values["n_batch"])
    if ub <= t.n_tokens:
        return None
    return (f"routing trace {t.file} holds {t.n_tokens} tokens; a ubatch of {ub} replays them "
            f"{ub / t.n_tokens:.3g} times (the trace wraps around), so it uses no more experts than "
            f"{t.n_tokens} tokens do and copies less than a real {ub}-token ubatch would: record a trace of at "
            "least the ubatch's tokens, or use skewed routing")


def kv_context_notes(scn, params, ctx_flag: bool = False) -> list[str]:
    """A note when the VRAM figures (``peak_vram_bytes``, ``--vram``) size the KV cache to the
    scenario's ``placement.ctx_size`` while llama-bench would size it smaller: llama-bench makes
    each test's context ``n_prompt + n_gen + n_depth`` tokens (``cmd_params_instance::to_llama_cparams``),
    the simulator the larger of that and ``ctx_size`` (a what-if of a server's context). ``params``:
    the run's :class:`sim.cli.benchflags.BenchParams`; ``ctx_flag``: ``--ctx-size`` set the context
    (the note names the flag, not the scenario)."""
    sizes = [p for p in params.n_prompt if p] + [g for g in params.n_gen if g] + [p + g for p, g in params.n_pg]
    if not sizes:
        return []
    need = max(sizes) + max(params.n_depth or (0,))
    ctx = scn.placement.ctx_size
    if ctx <= need:
        return []
    where = f" ({scn.file})" if getattr(scn, "file", None) else ""
    source = "--ctx-size" if ctx_flag else "the scenario's placement.ctx_size"
    where = "" if ctx_flag else where
    from sim.model.specs import PLACEMENT_CTX_DEFAULT

    if not ctx_flag and ctx == PLACEMENT_CTX_DEFAULT:
        where += " (its default where a scenario sets none)"
    return [f"peak_vram_bytes: the KV cache is sized to {source}, {ctx} tokens{where}; "
            f"llama-bench sizes it to each test's n_prompt + n_gen + n_depth (at most {need} here), which needs "
            "less VRAM (--ctx-size 0 sizes it so)"]


def _check_out_spares_inputs(args: argparse.Namespace, scn, writes: str = "the rows") -> None:
    """Refuse ``--out`` naming one of the command's inputs: the scenario, its model and hardware
    files, the hardware profile's kernel tables, a routing trace, a ``-m`` model (TOML or GGUF),
    or any other existing TOML or GGUF file (an output of this tool is neither). What it writes
    would replace it (fresh-user round 8: ``--out`` the ``-m`` GGUF left a 3 kB CSV where the
    model had been; round 9: ``breakdown``, ``trace`` and ``--list-devices`` had no such check, and
    ``run``'s missed the kernel tables). Used by ``run``, ``breakdown``, ``trace`` and
    ``--list-devices``.

    Raises:
        ScenarioError: naming ``--out`` and the input.
    """
    out = getattr(args, "out", None)
    if not out:
        return
    from sim.model.specs import replaced_input, scenario_input_files

    ins = scenario_input_files(scn)
    for item in getattr(args, "model", None) or ():   # -m lists: tuples of paths, one per flag
        for m in (item if isinstance(item, (list, tuple)) else str(item).split(",")):
            if str(m).strip():
                ins.setdefault(os.path.realpath(str(m).strip()), f"-m {str(m).strip()}")
    what = replaced_input(out, ins)
    if what:
        role = ", an input of this run" if os.path.realpath(out) in ins else ""
        raise ScenarioError(f"'{out}' is {what}{role}: {writes} would replace it; give --out "
                            "another path", field="--out")


def cmd_run(args: argparse.Namespace) -> int:
    from sim.cli.benchflags import Notes, default_threads, harness_notes, ot_notes, params_from_args, unmodelled_notes
    from sim.views.report import format_rows
    from sim.model.specs import parse_variant

    if args.out is not None:
        if args.output == "none":
            raise ScenarioError("-o none prints no rows (as llama-bench's): there is nothing to write to --out; give "
                                "another -o or leave out --out", field="--out")
        check_output_path(args.out)
        suffix = Path(args.out).suffix.lower().lstrip(".")
        if args.output is None and suffix in FORMATS:
            args.output = suffix  # --out table.csv writes csv
        elif args.output is None and suffix not in ("", "txt", "markdown"):
            # llama-bench has no --out: a name that looks like another format gets md, said so
            print(f"prefetch-sim: note: --out '{args.out}': .{suffix} is none of the formats "
                  f"({', '.join(FORMATS)}); writing markdown (-o md); give -o to choose", file=sys.stderr)
        elif args.output is not None and suffix in FORMATS and suffix != args.output:
            raise ScenarioError(f"'{args.out}' ends in .{suffix} but -o asks for {args.output}", field="--out")
    args.output = args.output or "md"
    scn = _base_scenario(args)
    if args.out is not None:
        _check_out_spares_inputs(args, scn)
    added_base = not any(v.name == "baseline" for v in scn.variants)
    if added_base:
        # "vs base" is always against the upstream scheduler: add it when not asked for
        scn = scn.with_(variants=(parse_variant("baseline"),) + scn.variants)
    params = params_from_args(args, scn)
    from sim.cli.progress import bar, progress_enabled

    progress = None
    if progress_enabled(args.quiet):
        progress = lambda it, desc: bar(it, desc=desc, unit="variant")  # noqa: E731
    notes = Notes()
    notes.extend(harness_notes(args) + unmodelled_notes(args) + ot_notes(args))
    if added_base and params.prefetch and not any(c.variant == "baseline" for c in params.prefetch):
        notes.add("vs base: against the upstream scheduler (-pw 0 -pes 0), simulated but not printed "
                  "(-pw 0,1 prints it)")
    for v in scn.variants:
        if v.expert_cache != "none" and (v.prefetch_weights or v.expert_slots):
            notes.add(f"variant {v.name}: a prefill that copies whole expert tensors (weight prefetch, expert "
                      "slots) bypasses the expert cache: no hits, no insertions; the cache is filled by decode "
                      "misses only (docs/model.md, \"Expert cache\")")
        if v.prefetch_weights and v.expert_slots:
            notes.add(f"variant {v.name}: weight prefetch (two slots) with {v.expert_slots} expert slots of its own "
                      f"is a design of the simulator; its rows print -pw 1 -pes {v.expert_slots}, which the prefetch "
                      f"patch runs as weight prefetch in max(2, {v.expert_slots}) slots")
    ctx_flag = args.ctx_size is not None   # --ctx-size, not the scenario, sized the KV cache
    try:
        rows, results, unfit = run_bench(scn, params, engine=args.engine, progress=progress, notes=notes,
                                         max_work=args.max_work, required=required_variants(args, params),
                                         ctx_flag=ctx_flag, skip_unmodelled=getattr(args, "skip_unmodelled", False))
    except KeyboardInterrupt:  # interrupted: only the one line that says so
        raise
    except BaseException:
        _say_notes(notes)
        raise
    if args.vram or args.output not in ("md", "none"):
        notes.extend(kv_context_notes(scn, params, ctx_flag))
    from sim.views.llamabench import patch_fields_note

    for note in (no_kernel_tables_note(scn), variant_id_note(scn.variants), trace_wrap_note(scn, params),
                 patch_fields_note(scn.variants)):  # on rows only
        if note:
            notes.add(note)
    _say_notes(notes)
    # sql: upstream's llama_bench columns unless the prefetch patch's flags are given (an upstream db takes the rows)
    text = "" if args.output == "none" else format_rows(  # -o none: no rows, as llama-bench's (no printer)
        rows, args.output, n_threads_default=default_threads(scn.hardware), prefetch_columns=params.prefetch is not None)
    if args.vram:
        if args.output == "md":
            text = text.rstrip("\n") + "\n\n" + vram_table(results)
        else:  # keep csv/json/sql parseable
            sys.stderr.write(vram_table(results))
    if args.out is not None:
        write_atomic(args.out, text)
    elif text:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    # llama-bench exits 1 on a model or context it cannot load (after the rows before it): a
    # setting left out for not fitting does the same here, after the rows of those that fit
    for line in unfit:
        print(f"prefetch-sim: error: {line}", file=sys.stderr)
    return 1 if unfit else 0


def cmd_trace(args: argparse.Namespace) -> int:
    import numpy as np

    from sim.plan.builder import build_plan, make_context
    from sim.engines.metrics import fill_cache_before, rep_rng, time_plan
    from sim.views.trace import to_chrome_trace, to_dataframe

    out = Path(args.out)
    if out.suffix.lower() not in (".json", ".csv"):
        raise ScenarioError(f"'{out}': use a .json (Chrome trace) or .csv file name", field="--out")
    check_output_path(out)
    scn = load_scenario_with_overrides(args)
    _check_out_spares_inputs(args, scn, "the trace")
    tests = scn.workload.tests()
    if args.test is not None and len(args.test) > 1:
        # fresh-user round 10: the last of several was traced without a word
        raise ScenarioError(f"{len(args.test)} tests given ({', '.join(args.test)}): a trace is one test's timeline; "
                            "trace them one at a time (breakdown takes several)", field="--test")
    ti, test = pick_tests(args.test, tests)[0] if args.test is not None else (0, tests[0])
    check_plan_work(scn, [test], args, replay=tests[:ti])
    import pandas as pd

    from sim.cli.progress import bar, closed_after

    frames, lines = [], []
    # a long test (tg128 of four variants: seconds) prints nothing until the file is written: a
    # bar, one step per variant, on a terminal unless -q
    fitting = fitting_contexts(scn, args)  # a scenario variant that does not fit: left out, noted
    with closed_after(bar(fitting, desc="simulating", unit="variant", quiet=args.quiet)) as pairs:
        for variant, ctx in pairs:  # every variant that fits, one timeline each, in one file
            # an expert cache carries over llama-bench's runs: filled first as run has it
            fill_cache_before(scn, variant, tests, ti, ctx, args.engine)
            # llama-bench's first timed repetition: its routing draw and its CUDA-graph capture
            # (graph_calls), whatever -r is (the mean over -r is breakdown's and run's)
            ctx.rep = 0
            plan = build_plan(scn, variant, test, rep_rng(scn.seed, test, 0), ctx)
            sched = time_plan(plan, scn, args.engine)
            frames.append(to_dataframe(plan, sched, test=test.name, variant=variant.name))
            mk = float(np.max(sched.end_s))
            line = f"{variant.name} / {test.name}: {plural(len(plan), 'op')}, makespan {mk * 1e3:.3f} ms"
            # run's and llama-bench's time of the test leaves out the next ubatch's host work that
            # overlaps the GPU's (sim.engines.metrics.full_repetition); the timeline shows it
            from sim.plan.overlap import graph_host_edges, ubatch_overlap_s

            ov = ubatch_overlap_s(ctx, test, *graph_host_edges(plan, np.asarray(sched.start_s, dtype=float),
                                                               np.asarray(sched.end_s, dtype=float)))
            if ov > 0:
                line += (f" (llama-bench's time {(mk - ov) * 1e3:.3f} ms: the next ubatch's host work, "
                         f"{ov * 1e3:.3f} ms, overlaps the GPU's)")
            reps = scn.workload.bench_repetitions or scn.workload.repetitions
            if reps > 1:   # run's and breakdown's figure is the mean over -r
                line += (f"; llama-bench's first timed repetition, its CUDA-graph capture included (run and "
                         f"breakdown give the mean of {reps})")
            lines.append(line)
    df = pd.concat(frames, ignore_index=True)
    if out.suffix.lower() == ".csv":
        write_atomic(out, df.to_csv(index=False))
    else:
        to_chrome_trace(df, out)
    print("\n".join(lines) + f"\n-> {out}")
    return 0


# optional subcommands contributed by other modules: (module, add_parser function name)
_PLUGINS = (
    ("sim.cli.calibrate", "add_calibrate_parser"),
    ("sim.cli.validate", "add_validate_parser"),
    ("sim.cli.crossover", "add_crossover_parser"),
    ("sim.cli.check", "add_check_parser"),
    ("sim.cli.reproduce", "add_reproduce_parser"),
    ("sim.cli.breakdown", "add_breakdown_parser"),
)


def _bench_long_flags() -> frozenset[str]:
    from sim.cli.benchflags import llama_bench_long_flags

    return llama_bench_long_flags()


class Parser(argparse.ArgumentParser):
    """argparse as llama-bench reads its flags: each flag is a word of its own, matched whole
    (``argv[i] == "-d"``), its value the next word. Multi-letter single-dash flags (``-ngl``,
    ``-ub``, ``-ot``, ``-pg``) are never an abbreviation (``allow_abbrev=False``), and no
    single-dash flag takes its value glued on: ``-d8192``, ``-ngl99``, ``-d=8192`` are errors
    that say to write ``-d 8192`` (argparse alone reads ``-d8192`` as ``-d 8192`` but ``-ngl99``
    as ``-n gl99``), as are short flags run together (``-vq``) and a word that is no flag but
    starts with one (``-bogus``: not ``-b ogus``). ``--long=value`` stays for the simulator's own
    flags (``--out=x``); llama-bench's long flags refuse it as llama-bench does
    (``--n-gpu-layers=99``: :func:`sim.cli.benchflags.llama_bench_long_flags`). An error is one
    line and exit status 2."""

    def __init__(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def _get_option_tuples(self, option_string):
        # no prefix matching at all: Python 3.11's argparse still matches a single-dash word as
        # a prefix with allow_abbrev off ("-o" in trace: "ambiguous option: -o could match -ot,
        # -oe"), where llama-bench matches whole words only
        return []

    #: a value that argparse would take for a flag: a comma list (or range, or ``-ts`` shares) starting
    #: with a negative number, as llama-bench accepts after a flag (``-ngl -1,99``, ``-ts -1/2``)
    _NEGATIVE_LIST = re.compile(r"^-\d[\d.]*([,/\-+*][-\d.]*)*$", re.ASCII)

    def parse_known_args(self, args=None, namespace=None):
        args = self._dashes(list(sys.argv[1:] if args is None else args))
        acts = self._option_string_actions
        joined: list[str] = []
        i = 0
        while i < len(args):
            tok = args[i]
            act = acts.get(tok) if tok.startswith("-") and "=" not in tok else None
            if (act is not None and act.nargs is None and i + 1 < len(args)
                    and self._NEGATIVE_LIST.match(args[i + 1]) and not self._negative_number_matcher.match(args[i + 1])):
                joined.append(f"{tok}={args[i + 1]}")  # '-ngl -1,99' -> '-ngl=-1,99'
                i += 2
                continue
            joined.append(tok)
            i += 1
        self._refuse_glued(args)
        return super().parse_known_args(joined, namespace)

    def _dashes(self, args: list[str]) -> list[str]:
        """Long flags as llama-bench reads them (``parse_cmd_params``: ``_`` replaced by ``-`` in a
        word starting with ``--``): ``--n_prompt 256`` is ``--n-prompt 256``. Only a word whose
        name (before a ``=``) is then a flag of this parser changes; nothing after ``--``."""
        acts = self._option_string_actions
        out = []
        for i, tok in enumerate(args):
            if tok == "--":
                return out + args[i:]
            name, eq, value = tok.partition("=")
            alt = name.replace("_", "-")
            if tok.startswith("--") and alt != name and alt in acts and name not in acts:
                tok = alt + eq + value
            out.append(tok)
        return out

    def _refuse_glued(self, args: list[str]) -> None:
        """Refuse (:meth:`error`) a single-dash word that is not a flag of this parser but starts
        with one: a value glued on (``-d8192``, ``-d=8192``: "write -d 8192"), short flags run
        together (``-vq``) or an unknown flag (``-bogus``). A flag's value (the word after a flag
        that takes one, ``-ngl -1``) and what follows ``--`` are not looked at; in a parser with
        subcommands, neither is anything from the subcommand on (its own parser checks it)."""
        acts = self._option_string_actions
        shorts = sorted((o for o in acts if o[:1] == "-" and o[1:2] != "-"), key=len, reverse=True)
        i = 0
        while i < len(args):
            tok = args[i]
            i += 1
            if tok == "--":
                return
            act = acts.get(tok)
            if act is not None:
                if act.nargs is None or act.nargs == 1:
                    i += 1  # its value, whatever it looks like
                continue
            if tok[:1] != "-" and self._subparsers is not None:
                return  # the subcommand: its parser checks the rest
            if tok[:2] == "--" and "=" in tok:
                name, _, value = tok.partition("=")
                if name in acts and name in _bench_long_flags():
                    self.error(f"{tok}: write {name} {value}; llama-bench takes a flag and its value as two words")
                continue  # the simulator's own long flag ('--out=x')
            if tok[:1] != "-" or tok[1:2] in ("", "-") or self._negative_number_matcher.match(tok):
                continue  # a positional, '-', a long flag, a negative number
            name, _, value = tok.partition("=")
            flag = name if name in acts else next((o for o in shorts if tok.startswith(o)), None)
            if flag is None:
                continue  # not like any flag of ours: argparse says it is unrecognized
            act = acts[flag]
            rest = value if flag == name else tok[len(flag):].removeprefix("=")
            if flag == name and "=" in tok and act.nargs == 0:
                self.error(f"{tok}: {flag} takes no value")
            if flag == name and tok.endswith("=") and not rest:
                # '-p=': the flag with '=' and no value (fresh-user round 12: said it was no flag)
                self.error(f"{tok}: write {flag} VALUE; llama-bench takes a flag and its value as two words")
            if act.nargs == 0 or not rest or not self._takes(act, rest):
                self.error(f"unrecognized flag '{name if flag == name else tok}' (not a flag of '{self.prog}')")
            self.error(f"{tok}: write {flag} {rest}; llama-bench takes a flag and its value as two words")

    @staticmethod
    def _takes(act: argparse.Action, text: str) -> bool:
        """Whether ``text`` is a value ``act`` takes (its type and choices)."""
        try:
            v = act.type(text) if callable(act.type) else text
        except (argparse.ArgumentTypeError, TypeError, ValueError):
            return False
        return act.choices is None or v in act.choices

    def parse_args(self, args=None, namespace=None):
        """As argparse's, but words no parser took are reported by the subcommand's parser (its
        ``--help``: ``prefetch-sim run --help``), not the top-level one."""
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            sub = next((a.choices.get(getattr(ns, a.dest, None)) for a in self._actions
                        if isinstance(a, argparse._SubParsersAction)), None)
            (sub or self).error(f"unrecognized arguments: {' '.join(extras)}")
        return ns

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _out_path(text: str) -> str:
    """``--out``'s value: a file name, not empty (checked as each is given: a repeated ``--out``
    with an empty one is refused, not overridden by the last)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty path")
    return text


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(
        prog="prefetch-sim",
        description="What-if simulator for weight and MoE expert prefetching in llama.cpp/ggml.")
    from sim import __version__

    ap.add_argument("--version", action="version", version=f"prefetch-sim {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, parser_class=Parser)
    run = sub.add_parser(
        "run", help="llama-bench's table of every variant (default scenario if none given)",
        description="Simulate llama-bench: its flags (comma lists, ranges, a repeated flag adds values; the run "
                    "is their product, one row per combination, test and variant) over a scenario, printed as "
                    "llama-bench prints (-o md|csv|json|jsonl|sql, its field names).")
    _add_bench_flags(run)
    run.add_argument("-o", "--output", choices=FORMATS + ("none",), default=None,
                     help="output format, as llama-bench's -o (default md, or the --out file's extension when it is "
                          "one of these; none: no rows, as llama-bench's)")
    run.add_argument("--out", type=_out_path, help="write to this file instead of stdout (missing folders are created)")
    run.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    run.add_argument("--vram", action="store_true", help="also print peak VRAM by component per variant (md)")
    run.set_defaults(func=cmd_run)
    tr = sub.add_parser("trace", help="per-op trace of one test, every --variant: Chrome trace JSON (or .csv); the "
                                      "timeline of llama-bench's first timed repetition (its routing draw, its "
                                      "CUDA-graph capture), whatever -r")
    _add_bench_flags(tr, one_setting=True)
    tr.add_argument("--test", action="append", help="test name, e.g. pp512 or 'pp512 @ d8192' (default: the first); "
                                                    "one: a trace is one test's timeline")
    tr.add_argument("--out", type=_out_path, default="trace.json", help="output file (.json Chrome trace, .csv table; default "
                                                        "trace.json in the current folder)")
    tr.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    tr.set_defaults(func=cmd_trace)
    for mod, fn in _PLUGINS:
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name == mod:
                continue
            raise
        getattr(m, fn)(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``prefetch-sim`` console script. Returns the exit status."""
    if sys.stdout is None or sys.stderr is None:  # started with >&- (Python sets them to None)
        if sys.stderr is not None:
            print("prefetch-sim: error: standard output is closed (redirect it, e.g. > /dev/null)", file=sys.stderr)
        return 2
    from sim.cli.interrupt import run_interruptible

    # Ctrl-C or SIGTERM: one line, status 130/143, worker processes stopped, nothing half-written
    return run_interruptible("prefetch-sim", _main, argv)


def _main(argv: list[str] | None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        if getattr(args, "list_devices", False):   # llama-bench's --list-devices: the devices, then exit
            from sim.cli.benchflags import device_list

            scn = _base_scenario(args)
            text = device_list(scn.hardware)
            # the list goes where the rows would have gone (run, breakdown); a trace's --out (a
            # default name when not given) is for a trace: the list is printed
            if getattr(args, "out", None) and getattr(args, "func", None) is not cmd_trace:
                from sim.atomic import check_output_path, write_atomic

                check_output_path(args.out)
                _check_out_spares_inputs(args, scn, "the device list")
                write_atomic(args.out, text + "\n")
            else:
                print(text)
            sys.stdout.flush()
            return 0
        rc = int(args.func(args) or 0)
        sys.stdout.flush()   # inside the try: a closed pipe is met here, not at the interpreter's exit
        return rc
    except PrefetchSimError as exc:
        print(f"prefetch-sim: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader of stdout went away (| head): quiet 141, whatever the command (fresh-user
        # round 10: run exited 0 and the others 2 with an error line)
        from sim.cli.interrupt import closed_pipe

        return closed_pipe()
    except OSError as exc:  # an output that could not be written after all
        from sim.atomic import flag_of

        where = f" '{exc.filename}'{flag_of(args, exc.filename)}" if getattr(exc, "filename", None) else ""
        print(f"prefetch-sim: error: cannot write{where}: {exc.strerror or exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
