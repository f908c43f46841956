"""Validation grid and comparison (pure parts; the GPU run is `prefetch-sim validate`)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from sim.cli import main
from sim.model.specs import load_hardware
from sim.views.validation import (CASE_COLUMNS, build_case, default_grid, per_kind_errors, plot_validation,
                            predict_s, summarize)

from scenario_factory import ROOT

HW = load_hardware(ROOT / "scenarios" / "hardware" / "h200-datasheet.toml")


def test_grid_covers_what_the_issue_asks():
    g = default_grid()
    assert len(g) >= 60 and len({c.name for c in g}) == len(g)
    ubs = {c.bench_test.n_prompt for c in g if c.test.startswith("pp")}
    assert min(ubs) <= 32 and max(ubs) >= 8192
    assert {0, 32768} <= {c.n_depth for c in g}
    assert {"moe", "dense"} == {c.model for c in g}
    assert {"baseline", "prefetch_ungated", "prefetch_gated_512"} <= {c.variant for c in g}
    assert {f"slots{n}" for n in (1, 2, 3, 4)} <= {c.variant for c in g}
    assert {True, False} == {c.pinned for c in g}
    assert any("cache" in c.variant for c in g) and any("cache" not in c.variant for c in g)
    assert any(c.test.startswith("tg") for c in g)


def test_every_case_builds_and_has_a_positive_prediction():
    for c in default_grid():
        scn, plan = build_case(c, HW)
        assert scn.model.n_layer == 4
        assert predict_s(plan, HW) > 0
        if c.test.startswith("pp") and c.bench_test.n_prompt >= 32 and "cache" not in c.variant:
            assert plan.h2d_bytes() > 0, c.name


def test_cases_are_deterministic():
    c = default_grid()[3]
    a, b = build_case(c, HW)[1], build_case(c, HW)[1]
    assert [(o.kind, o.nbytes, o.deps) for o in a.ops] == [(o.kind, o.nbytes, o.deps) for o in b.ops]


def test_summary_and_plot(tmp_path):
    rng = np.random.default_rng(0)
    m = rng.uniform(1e-3, 1e-1, 20)
    err = np.linspace(-0.2, 0.2, 20)
    df = pd.DataFrame({c: [None] * 20 for c in CASE_COLUMNS})
    df["model"] = ["moe", "dense"] * 10
    df["host_memory"] = "pinned"
    df["measured_s"] = m
    df["predicted_s"] = m * (1 + err)
    df["rel_error"] = err
    s = summarize(df)
    assert s["median_abs_error"] == pytest.approx(np.median(np.abs(err)))
    assert s["p90_abs_error"] == pytest.approx(np.quantile(np.abs(err), 0.9))
    p = plot_validation(df, tmp_path / "v.png")
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_per_kind_errors_sums_durations():
    tr = pd.DataFrame({"op_id": [0, 1, 2], "kind": ["h2d", "gemm", "gemm"], "dur_s": [2e-3, 1e-3, 3e-3]})
    pred = np.array([1e-3, 1e-3, 3e-3])
    k = per_kind_errors("x", tr, pred).set_index("kind")
    assert k.loc["gemm", "measured_s"] == pytest.approx(4e-3)
    assert k.loc["h2d", "median_rel_error"] == pytest.approx(-0.5)
    assert k.loc["gemm", "n"] == 2


def test_validate_without_gpu_says_so_and_writes_nothing(tmp_path, capsys):
    pytest.importorskip("sim.cli.validate")
    try:
        import cupy  # noqa: F401
        pytest.skip("CuPy present: this test is for machines without it")
    except ImportError:
        pass
    out = tmp_path / "val"
    rc = main(["validate", "--out", str(out), "--hardware", str(ROOT / "scenarios/hardware/h200-datasheet.toml")])
    assert rc == 2
    assert "CuPy" in capsys.readouterr().err
    assert not out.exists()


def test_committed_validation_predictions_are_reproduced_by_this_code():
    """The headline figures (docs/validation.md) hold for the code as it is: every committed
    prediction is recomputed from the committed profile (``predicted_s``) and, for the
    host-conditioned diagnostic ``predicted_host_s``, with the committed per-pass host
    measurements of the same run (executor costs, pageable bandwidth). If this fails, the model
    changed: run `prefetch-sim validate` on the GPU again and commit the new results."""
    from sim.views.validation import executor_profile, median_costs, resolve_executor_costs, with_host_state

    val = ROOT / "data" / "validation"
    committed = pd.read_csv(val / "h200_validation.csv").set_index("case")
    profile = executor_profile(load_hardware(ROOT / "scenarios" / "hardware" / "h200.toml"))
    costs = median_costs(pd.read_csv(val / "h200_executor_costs.csv").drop(columns=["pass"]).to_dict("records"))
    probes = pd.read_csv(val / "h200_host_probes.csv")
    pageable = float(probes["h2d_pageable_gb_per_s"].median())
    hw = with_host_state(profile, costs, pageable * 1e9)
    meta = json.loads((val / "h200_meta.json").read_text())
    assert meta["host_conditioned"]["pageable_gb_per_s_used"] == pytest.approx(pageable)
    assert meta["host_conditioned"]["executor_costs_used"] == pytest.approx(resolve_executor_costs(costs))
    cases = {c.name: c for c in default_grid()}
    assert set(committed.index) == set(cases)
    for name, c in cases.items():
        _, plan = build_case(c, profile)
        assert predict_s(plan, profile) == pytest.approx(committed.loc[name, "predicted_s"], rel=1e-9), name
        assert predict_s(plan, hw) == pytest.approx(committed.loc[name, "predicted_host_s"], rel=1e-9), name
    s = summarize(committed)
    assert s["median_abs_error"] == pytest.approx(np.median(np.abs(committed.rel_error)))
    assert s["p90_abs_error"] == pytest.approx(meta["p90_abs_error"])
    assert summarize(committed, "rel_error_host")["p90_abs_error"] == pytest.approx(
        meta["host_conditioned"]["p90_abs_error"])


@pytest.mark.parametrize("run, host", [(15, False), (16, True), (17, True), (18, True), (19, True), (20, True),
                                       (21, True), (23, True)])
def test_earlier_validation_runs_are_reproduced_from_their_own_profiles(run, host):
    """Runs 15–21 and 23 (``data/validation/history``; run 18 only the 16 host-bound cases; run 22
    left only its console log):
    every profile prediction recomputed from
    the run's own committed calibration (``data/calibration/h200-20261130-runN``); run 16's
    host-conditioned column too (run 15's used the per-pass line medians of its time, see the
    history README), and run 18's. docs/validation.md reports these runs beside the committed one."""
    from sim.views.validation import executor_profile, median_costs, with_host_state

    hist = ROOT / "data" / "validation" / "history"
    committed = pd.read_csv(hist / f"run{run}_validation.csv").set_index("case")
    profile = executor_profile(load_hardware(ROOT / "data" / "calibration" / f"h200-20261130-run{run}" / "h200.toml"))
    meta = json.loads((hist / f"run{run}_meta.json").read_text())
    hw = None
    if host:
        costs = median_costs(pd.read_csv(hist / f"run{run}_executor_costs.csv").drop(columns=["pass"]).to_dict("records"))
        pageable = float(pd.read_csv(hist / f"run{run}_host_probes.csv")["h2d_pageable_gb_per_s"].median())
        hw = with_host_state(profile, costs, pageable * 1e9)
    cases = [c for c in default_grid() if c.name in committed.index]
    assert len(cases) == len(committed) >= 16
    for c in cases:
        _, plan = build_case(c, profile)
        assert predict_s(plan, profile) == pytest.approx(committed.loc[c.name, "predicted_s"], rel=1e-9), c.name
        if hw is not None:
            assert predict_s(plan, hw) == pytest.approx(committed.loc[c.name, "predicted_host_s"], rel=1e-9), c.name
    assert summarize(committed)["p90_abs_error"] == pytest.approx(meta["p90_abs_error"])
    if host:
        assert summarize(committed, "rel_error_host")["p90_abs_error"] == pytest.approx(
            meta["host_conditioned"]["p90_abs_error"])


def test_run_22_console_log_is_reproduced_from_its_own_profile():
    """Run 22 left only its console log (the device returns at most 8 files; its CSVs were left
    behind): every predicted time it printed (ms, 3 decimals) is recomputed from its committed
    profile, and its printed median / p90 follow from the printed times."""
    import re

    from sim.views.validation import executor_profile

    text = (ROOT / "data" / "validation" / "history" / "run22_validation_log.txt").read_text()
    rows = re.findall(r"^\s*(\S+)\s+([+-]\d+\.\d)%\s+(\d+\.\d+)\s+(\d+\.\d+)\s+\d+\.\d%\s+[+-]\d+\.\d%$", text, re.M)
    cases = {c.name: c for c in default_grid()}
    assert len(rows) == len(cases) == 64 and {r[0] for r in rows} == set(cases)
    profile = executor_profile(load_hardware(ROOT / "data" / "calibration" / "h200-20261130-run22" / "h200.toml"))
    err = []
    for name, _err, pred_ms, meas_ms in rows:
        _, plan = build_case(cases[name], profile)
        assert predict_s(plan, profile) * 1e3 == pytest.approx(float(pred_ms), abs=6e-4), name
        err.append(float(pred_ms) / float(meas_ms) - 1)
    head = re.search(r"64 cases: median \|error\| ([\d.]+)%, p90 ([\d.]+)%", text)
    assert np.median(np.abs(err)) * 100 == pytest.approx(float(head.group(1)), abs=0.06)
    assert np.quantile(np.abs(err), 0.9) * 100 == pytest.approx(float(head.group(2)), abs=0.06)


@pytest.mark.slow  # ~10 s: a whole stand-in validation grid
def test_run_grid_passes_probes_and_traces(monkeypatch):
    """run_grid on the numpy stand-in: several passes (alternating order), the median over all
    timed runs, host probes per pass, and both engines' traces of every case."""
    import calibrate._fakecupy as fakecp
    import sim.views.validation as V
    from sim.plan.builder import build_plan
    from sim.model.specs import load_scenario

    scn = load_scenario(ROOT / "scenarios" / "tiny" / "tiny.toml")
    test = scn.workload.tests()[0]
    by_variant = {v.name: v for v in scn.variants}

    def tiny_case(case, hardware):
        v = by_variant[case.variant]
        return scn, build_plan(scn, v, test, np.random.default_rng(scn.seed))

    monkeypatch.setattr(V, "build_case", tiny_case)
    names = list(by_variant)[:2]
    cases = [V.Case(f"tiny-{n}", "moe", n, test.name) for n in names]
    seen = []
    real_execute = __import__("calibrate.executor", fromlist=["execute"]).execute

    def spy(plan, **kw):
        seen.append(kw["variant"])
        return real_execute(plan, **kw)

    monkeypatch.setattr("calibrate.executor.execute", spy)
    probes = []
    df, kinds, kept, traces = V.run_grid(cases, HW, repeats=2, passes=3, cp=fakecp, host_probes=probes,
                                         keep_trace=cases[1].name)
    assert seen == names + names[::-1] + names  # forward, reverse, forward
    assert len(probes) == 4 and probes[-1].label == "end"
    assert list(df.columns) == list(CASE_COLUMNS)
    assert (df.n_runs == 6).all() and (df.pass_spread >= 0).all()
    assert (df.measured_min_s <= df.measured_s).all() and (df.measured_s <= df.measured_max_s).all()
    assert set(traces.engine) == {"executor", "analytic"} and set(traces.case) == set(df.case)
    assert kept is not None and set(kept.engine) == {"executor", "analytic"}
    with pytest.raises(ValueError, match="passes"):
        V.run_grid(cases, HW, passes=0, cp=fakecp)


@pytest.mark.slow
def test_run_grid_prices_the_host_conditioned_prediction_with_the_per_pass_medians(monkeypatch):
    """With a cost probe and per-pass host probes: each pass's costs are logged (a failing probe
    as an error, the run going on), ``predicted_host_s`` uses the medians of the costs and of the
    probes' pageable bandwidth, ``predicted_s`` and the traces the profile alone."""
    import dataclasses

    import calibrate._fakecupy as fakecp
    import sim.views.validation as V
    from sim.plan.builder import build_plan
    from sim.model.specs import load_scenario

    scn0 = load_scenario(ROOT / "scenarios" / "tiny" / "tiny.toml")
    pageable = scn0.with_(placement=dataclasses.replace(scn0.placement, pinned=False))
    pp, tg = scn0.workload.tests()[:2]
    v0 = scn0.variants[0]
    which = {"tiny-pp-pageable": (pageable, pp), "tiny-tg": (scn0, tg)}

    def tiny_case(case, hw):
        scn, test = which[case.name]
        return scn, build_plan(scn, v0, test, np.random.default_rng(scn.seed))

    monkeypatch.setattr(V, "build_case", tiny_case)
    cases = [V.Case("tiny-pp-pageable", "moe", v0.name, pp.name), V.Case("tiny-tg", "moe", v0.name, tg.name)]
    # medians differ from the first, the last and the mean pass; one pass lacks keys, one fails
    per_pass = iter([{"gemm": 1e-3, "cpu_op": 2e-5, "busy_gemm": 1e-3, "loop_check": [(1, 2.0, 3.0)]},
                     {"gemm": 2e-3, "cpu_op": 9e-5, "busy_gemm": float("nan")},
                     {"gemm": 9e-3}, RuntimeError("probe broke"),
                     {"gemm": 6e-3, "cpu_op": 5e-5, "busy_gemm": 2e-3}])

    def probe():
        x = next(per_pass)
        if isinstance(x, Exception):
            raise x
        return x

    log: list = []
    probes: list = []
    used: dict = {}
    df, _kinds, _t, traces = V.run_grid(cases, HW, repeats=1, passes=5, cp=fakecp, cost_probe=probe,
                                        cost_log=log, host_probes=probes, pageable_from_probes=True,
                                        host_state_used=used)
    assert [e["pass"] for e in log] == [1, 2, 3, 4, 5] and "error" in log[3] and "loop_check" not in log[0]
    assert "busy_gemm" not in log[1]  # NaN dropped
    med = {"gemm": 4e-3, "cpu_op": 5e-5, "busy_gemm": 1.5e-3}  # not the mean, first or last pass
    assert used["executor_costs"] == pytest.approx(med)
    pg = float(np.median([p.h2d_pageable_gb_per_s for p in probes])) * 1e9
    assert used["pageable_bytes_per_s"] == pytest.approx(pg)
    hw_host = V.with_host_state(V.executor_profile(HW), med, pg)
    for name in df.case:
        _, plan = V.build_case(V.Case(name, "moe", v0.name, ""), HW)
        row = df.set_index("case").loc[name]
        assert row.predicted_host_s == pytest.approx(V.predict_s(plan, hw_host), rel=1e-12)
        assert row.predicted_s == pytest.approx(V.predict_s(plan, V.executor_profile(HW)), rel=1e-12)
        assert row.predicted_host_s != pytest.approx(row.predicted_s, rel=1e-6)  # the host state moved it
        assert row.rel_error_host == pytest.approx(row.predicted_host_s / row.measured_s - 1)
        pred = traces[(traces.engine == "analytic") & (traces.case == name)]
        assert pred.end_s.max() == pytest.approx(row.predicted_s, rel=1e-9)  # traces: the profile's


def test_with_host_state_replaces_the_pageable_bandwidth_and_keeps_its_latency():
    import sim.views.validation as V

    hw = V.with_host_state(HW, None, 9e9)
    assert hw.h2d_pageable.bytes_per_s == 9e9 and hw.h2d_pageable.latency_s == HW.h2d_pageable.latency_s
    assert hw.h2d_pinned == HW.h2d_pinned and V.with_host_state(HW) == HW
    with pytest.raises(ValueError, match="host_probes"):
        V.run_grid([], HW, pageable_from_probes=True)


@pytest.mark.parametrize("args, field", [(["--passes", "0"], "--passes"), (["--cases", "no-such-case"], "--cases"),
                                         (["--cases", "("], "--cases"),
                                         (["--hardware", "nonexist"], "unknown hardware 'nonexist' (built-in hardware "
                                                                      "names: h200")])
def test_validate_rejects_bad_options_before_touching_the_gpu(tmp_path, capsys, args, field):
    out = tmp_path / "val"
    rc = main(["validate", "--out", str(out), *args])
    assert rc == 2
    assert field in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.slow  # ~6 s: a stand-in grid with a failing plan
def test_run_grid_reports_lossless_failures_without_losing_the_results(monkeypatch):
    import dataclasses

    import calibrate._fakecupy as fakecp
    import sim.views.validation as V
    from calibrate.executor import LosslessnessError
    from sim.plan.builder import build_plan
    from sim.model.specs import load_scenario

    scn = load_scenario(ROOT / "scenarios" / "tiny" / "tiny.toml")
    test = scn.workload.tests()[0]
    by_variant = {v.name: v for v in scn.variants}
    monkeypatch.setattr(V, "build_case", lambda case, hw: (scn, build_plan(scn, by_variant[case.variant], test,
                                                                           np.random.default_rng(scn.seed))))
    real = __import__("calibrate.executor", fromlist=["execute"]).execute
    calls = []

    def flaky(plan, **kw):  # the second pass of the first case computes something else
        calls.append(kw["variant"])
        r = real(plan, **kw)
        return dataclasses.replace(r, digest="0" * 64) if len(calls) == 3 else r

    monkeypatch.setattr("calibrate.executor.execute", flaky)
    names = list(by_variant)[:2]
    cases = [V.Case(f"tiny-{n}", "moe", n, test.name) for n in names]
    failures = []
    df, *_ = V.run_grid(cases, HW, repeats=1, passes=2, cp=fakecp, failures=failures)
    assert len(df) == 2 and len(failures) == 1 and "different output digests" in failures[0]
    calls.clear()
    with pytest.raises(LosslessnessError):
        V.run_grid(cases, HW, repeats=1, passes=2, cp=fakecp)


def test_code_version_names_the_commit_and_the_sources_or_says_there_is_no_git(tmp_path):
    """sim.provenance.code_version: ``git <12 hex>[+dirty] (src <12 hex>)`` at the top of a git
    work tree — ``+dirty`` once a tracked file changes, and the source hash with it —;
    ``unknown`` for a folder without sources outside any work tree's top."""
    import re
    import shutil
    import subprocess

    from sim.provenance import code_version, source_hash

    if (ROOT / ".git").exists():
        assert re.fullmatch(r"git [0-9a-f]{12}(\+dirty|\+\?)? \(src [0-9a-f]{12}\)", code_version(ROOT))
    assert code_version(tmp_path) == "unknown"  # no sources, and not the top of a work tree
    if not shutil.which("git"):
        return
    repo = tmp_path / "repo"
    (repo / "sim").mkdir(parents=True)
    (repo / "sim" / "a.py").write_text("x = 1\n")
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    head = subprocess.run([*git, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip()
    clean = code_version(repo)
    assert clean == f"git {head} (src {source_hash(repo)})"
    (repo / "sim" / "a.py").write_text("x = 2\n")
    dirty = code_version(repo)
    assert dirty == f"git {head}+dirty (src {source_hash(repo)})" and dirty.split("(src ")[1] != clean.split("(src ")[1]


def test_code_version_never_raises_and_ignores_an_enclosing_repository(tmp_path, monkeypatch):
    """Without git (subprocess raising) a tree is named by its source hash; a copy of the tree
    inside another repository does not report that repository's commit; the hash changes with
    the sources."""
    import shutil
    import subprocess

    import sim.provenance as P

    copy = tmp_path / "outer" / "copy"
    (copy / "sim").mkdir(parents=True)
    (copy / "sim" / "a.py").write_text("x = 1\n")
    h1 = P.source_hash(copy)
    assert len(h1) == 12
    if shutil.which("git"):
        subprocess.run(["git", "init", "-q", str(tmp_path / "outer")], check=True)
        assert P.code_version(copy) == f"src {h1} (no git)"
    (copy / "sim" / "a.py").write_text("x = 2\n")
    assert P.source_hash(copy) != h1

    def boom(*a, **k):
        raise OSError("no git here")

    monkeypatch.setattr(P.subprocess, "run", boom)
    assert P.code_version(copy) == f"src {P.source_hash(copy)} (no git)"
    assert P.code_version(tmp_path / "empty") == "unknown"
