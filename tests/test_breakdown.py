"""sim.views.breakdown and ``prefetch-sim breakdown``: the critical path of a timed plan, by op
category; its total is the test's time as ``prefetch-sim run`` reports it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sim import engines
from sim.cli import main
from sim.engines.metrics import fit_context_to_tests, rep_rng, time_plan
from sim.model.specs import BenchTest, load_scenario, parse_variant
from sim.plan import OpKind, Plan, Stream
from sim.plan.builder import build_plan, make_context
from sim.views.breakdown import GAP, breakdown, category, critical_path


def _toy():
    """host issue (1) -> GEMM (5) on compute; a 10 s H2D on the copy stream; a MOE (2) after
    both the GEMM (its queue) and the copy (a dep): the copy is the critical predecessor."""
    p = Plan(label="toy")
    i = p.add(OpKind.ISSUE, Stream.HOST, -1, "issue gemm")
    g = p.add(OpKind.GEMM, Stream.COMPUTE, 0, "gemm", [i])
    c = p.add(OpKind.H2D, Stream.COPY, 0, "copy", [], nbytes=1, tag="prefetch")
    m = p.add(OpKind.MOE, Stream.COMPUTE, 0, "moe", [c])
    return p, [1.0, 5.0, 10.0, 2.0], (g, c, m)


def test_critical_path_of_a_hand_made_plan():
    p, d, (g, c, m) = _toy()
    sched = engines.run(p, d)
    ops, gaps = critical_path(p, sched)
    assert ops.tolist() == [c, m]
    assert gaps.tolist() == [0.0, 0.0]
    b = breakdown(p, sched)
    assert b.makespan_s == 12.0
    crit = {r[0]: r[1] for r in b.rows}
    busy = {r[0]: r[2] for r in b.rows}
    assert crit[category(OpKind.H2D, Stream.COPY, "prefetch")] == 10.0
    assert crit["GPU MUL_MAT_ID (experts)"] == 2.0
    assert crit["GPU MUL_MAT (dense weights)"] == 0.0 and busy["GPU MUL_MAT (dense weights)"] == 5.0
    assert b.rows[0][0] == category(OpKind.H2D, Stream.COPY, "prefetch")  # the largest first


def test_a_gap_is_its_own_row():
    """A schedule that starts an op later than its predecessors end (as a DES may): the gap is
    counted, so the rows still add up to the makespan."""
    p, d, _ = _toy()
    sched = engines.run(p, d)
    start, end = np.array(sched.start_s, dtype=float), np.array(sched.end_s, dtype=float)
    start[3] += 0.5
    end[3] += 0.5
    b = breakdown(p, type(sched)(start, end, "test"))
    rows = {r[0]: r for r in b.rows}
    assert rows[GAP][1] == 0.5
    assert sum(r[1] for r in b.rows) == pytest.approx(b.makespan_s, rel=1e-12)


def test_batched_schedule_is_refused():
    p, d, _ = _toy()
    sched = engines.run(p, d)
    bad = type(sched)(np.zeros((2, len(p))), np.zeros((2, len(p))), "analytic")
    with pytest.raises(ValueError, match="one scenario"):
        critical_path(p, bad)


@pytest.mark.parametrize("engine", ["analytic", "des"])
@pytest.mark.parametrize("variant", ["baseline", "prefetch_ungated"])
def test_rows_add_up_to_the_makespan_on_the_default_scenario(engine, variant):
    scn = load_scenario("scenarios/default.toml")
    t = BenchTest(512, 0)
    scn = fit_context_to_tests(scn, [t])
    v = parse_variant(variant)
    plan = build_plan(scn, v, t, rep_rng(scn.seed, 0, 0), make_context(scn, v, rep_rng(scn.seed, -1, -1)))
    sched = time_plan(plan, scn, engine)
    b = breakdown(plan, sched)
    assert sum(r[1] for r in b.rows) == pytest.approx(float(np.max(sched.end_s)), rel=1e-9)
    for cat, crit, busy, n, n_crit in b.rows:
        if cat != GAP:
            assert crit <= busy * (1 + 1e-12) + 1e-15 and n_crit <= n
    ops, _ = critical_path(plan, sched)
    # consecutive ops of the path: each starts when its predecessor on the path ends
    assert np.all(np.diff(ops) > 0)
    assert np.allclose(np.asarray(sched.start_s)[ops[1:]], np.asarray(sched.end_s)[ops[:-1]], rtol=0, atol=1e-12)


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_total_is_runs_time_of_each_test(capsys):
    flags = ["-p", "512", "-n", "16", "-r", "2", "--variant", "baseline,prefetch_ungated"]
    run = _json(capsys, ["run", *flags, "-q", "-o", "json"])
    bd = _json(capsys, ["breakdown", *flags, "-o", "json"])
    got = {(r["variant"], r["test"]): (r["test_ms"], r["avg_ts"]) for r in bd}
    for r in run:
        test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
        variant = "baseline" if "baseli" in r["build_commit"] else "prefetch_ungated"
        ms, ts = got[(variant, test)]
        assert abs(ms * 1e6 - r["avg_ns"]) <= 1  # avg_ns is whole nanoseconds
        assert ts == pytest.approx(r["avg_ts"], abs=5e-7)  # avg_ts is printed to 6 decimals
    # and per table the rows add up to that time
    for key, (ms, _) in got.items():
        assert sum(r["critical_ms"] for r in bd if (r["variant"], r["test"]) == key) == pytest.approx(ms, rel=1e-9)


def test_copy_bound_prefill_is_led_by_the_expert_copies(capsys):
    """Qwen3-30B-A3B with every expert on the host at pp512: the copies of the used experts are
    the largest share of the critical path, the GPU's expert matmuls the next."""
    rows = _json(capsys, ["breakdown", "-ncmoe", "48", "-p", "512", "-n", "0", "-r", "1", "--variant", "baseline",
                          "-o", "json"])
    assert rows[0]["category"].startswith("H2D experts") and rows[0]["critical_share"] > 0.5
    assert rows[1]["category"] == "GPU MUL_MAT_ID (experts)"


def test_host_expert_decode_is_led_by_the_cpu_backend(capsys):
    rows = _json(capsys, ["breakdown", "-p", "0", "-n", "4", "-r", "1", "--variant", "baseline", "-o", "json"])
    assert rows[0]["category"] == "CPU backend: MUL_MAT_ID (host experts)"


def test_markdown_and_csv(capsys, tmp_path):
    assert main(["breakdown", "-p", "64", "-n", "0", "-r", "1", "--variant", "baseline"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("baseline / pp64: ") and "| category | critical path, ms |" in out
    f = tmp_path / "b.csv"
    assert main(["breakdown", "-p", "64", "-n", "0", "-r", "1", "--variant", "baseline", "--out", str(f)]) == 0
    head = f.read_text().splitlines()[0]
    assert head.startswith("variant,test,category,critical_ms")


@pytest.mark.parametrize("argv, what", [
    (["breakdown", "--test", "pp999"], "no test named 'pp999'"),
    (["breakdown", "-o", "csv", "--out", "x.json"], "another format"),
    (["breakdown", "-ub", "256,512"], "one setting"),
])
def test_bad_input_is_one_line(capsys, tmp_path, monkeypatch, argv, what):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and what in err[0] and "Traceback" not in err[0]
    assert not (tmp_path / "x.json").exists()


def test_a_scenario_variant_that_does_not_fit_is_left_out_with_a_note_as_run_does(capsys):
    """breakdown and trace follow run's rule: a scenario's own variant that does not fit where
    another fits is left out with a note; a --variant that does not fit is an error."""
    from sim.cli import main

    rc = main(["breakdown", "laguna-2x3090", "-ncmoe", "21", "-p", "512", "-n", "0", "-r", "1", "-q"])
    out, err = capsys.readouterr()
    assert rc == 0 and "baseline / pp512" in out and "prefetch_ungated / pp512" not in out
    assert "note: variant prefetch_ungated left out: -ncmoe 21: does not fit" in err
    rc = main(["breakdown", "laguna-2x3090", "-ncmoe", "21", "-p", "512", "-n", "0", "-r", "1", "-q",
               "--variant", "prefetch_ungated"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and "does not fit with variant 'prefetch_ungated'" in err
