"""calibrate.llamacpp.compare: measured llama-bench rows against the simulator, untuned.

The run folder tests/data/llamacpp/h200-test holds hand-written llama-bench rows (its jsonl
layout; invented t/s) for Qwen3-30B-A3B and Gemma-3-27B GGUFs trimmed to 2 layers and the tiny
MoE. Every prediction is checked against run_scenario on a scenario built by hand, so nothing
depends on host speed.
"""

from __future__ import annotations

import json
import re
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibrate.llamacpp import compare as cmp
from sim.errors import ScenarioError
from sim.views.llamabench import read_llama_bench, stdev_ns
from sim.engines.metrics import run_scenario
from sim.model.routing import RoutingSpec
from sim.model.specs import BenchTest, Placement, Scenario, Workload, load_hardware, load_model, parse_variant

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "tests" / "data" / "llamacpp" / "h200-test"


def _model_cut(name: str, n_layer: int):
    """A shipped model cut as the comparison cuts it (the full file's first blocks)."""
    return cmp.cut_model(load_model(ROOT / "scenarios" / "models" / f"{name}.toml"), n_layer)
#: the note of a -ncmoe 48 row on the test folder's 2-block GGUF (sim.views.llamabench.row_placement)
CUT_NOTE = "n_cpu_moe 48: the model has 2 blocks; every expert is on the host"
HW = load_hardware(ROOT / "scenarios" / "hardware" / "h200.toml")


@pytest.fixture(scope="module")
def result() -> pd.DataFrame:
    return cmp.compare(RUN, HW, jobs=1)


def by_hand(model, placement: Placement, tests, n_ubatch: int, n_batch: int = 2048, repetitions: int = 3,
            variant: str = "baseline") -> list:
    t0 = tests[0]
    scn = Scenario(name="by hand", model=model, hardware=HW, placement=placement,
                   workload=Workload(n_prompt=(t0.n_prompt,), n_gen=(t0.n_gen,), n_depth=(t0.n_depth,),
                                     n_ubatch=n_ubatch, n_batch=n_batch, repetitions=repetitions),
                   routing=RoutingSpec(kind="uniform"), variants=(parse_variant(variant),), seed=0)
    return run_scenario(scn, tests=list(tests), repetitions=repetitions, jobs=1)


def subset(tmp_path: Path, lines: list[int], invocations: list[dict] | None = None) -> Path:
    """A run folder with some rows of the test folder (1-based lines)."""
    run = tmp_path / "run"
    run.mkdir(parents=True)
    rows = (RUN / "llama-bench.jsonl").read_text().splitlines()
    (run / "llama-bench.jsonl").write_text("".join(rows[i - 1] + "\n" for i in lines))
    if invocations is None:  # a subset of rows: the invocations' row counts no longer hold
        invocations = [{k: v for k, v in json.loads(x).items() if k != "rows"}
                       for x in (RUN / "invocations.jsonl").read_text().splitlines() if x.strip()]
        if lines == list(range(1, len(rows) + 1)):
            shutil.copy(RUN / "invocations.jsonl", run / "invocations.jsonl")
            return run
    (run / "invocations.jsonl").write_text("".join(json.dumps(x) + "\n" for x in invocations))
    return run


def test_one_row_per_measured_row(result):
    assert list(result.columns) == list(cmp.COLUMNS) and len(result) == 10
    assert list(result.line) == list(range(1, 11))
    assert list(result.invocation) == ["qwen3-ncmoe48"] * 2 + ["qwen3-resident"] * 2 + ["gemma3-ffn-cpu"] * 2 + [
        "gemma3-ngl1-fa0", "gemma3-cuda1", "tiny-ot-exps", "tiny-ot-exps"]
    assert list(result.regime) == ["copy_bound_prefill", "host_expert_decode", "resident", "resident",
                                   "dense_partial_offload", "dense_partial_offload", "dense_partial_offload",
                                   "unknown", "copy_bound_prefill", "mixed_pp_tg"]
    assert list(result.kind) == ["pp", "tg", "pp", "pp", "pp", "tg", "tg", "pp", "pp", "pp+tg"]
    assert list(result.n_layer) == [2] * 10
    assert result.model_toml.iloc[0] == "scenarios/models/qwen3-30b-a3b.toml"
    bench = pd.read_json(RUN / "llama-bench.jsonl", lines=True)
    assert np.allclose(result.measured_ts, bench.avg_ts) and np.allclose(result.measured_stddev_ts, bench.stddev_ts)
    assert (result.n_samples == 5).all()
    assert list(result.pinned) == [True, True, False, False, False, False, False, False, True, True]
    assert list(result.ot[4:6]) == ["ffn_(gate|up|down)=CPU"] * 2 and result.ot.iloc[0] == "none"
    ok = result.predicted_ts.notna()
    assert list(ok) == [True] * 7 + [False] + [True] * 2
    assert np.allclose(result.rel_error[ok], result.predicted_ts[ok] / result.measured_ts[ok] - 1)
    assert (result.predicted_ts[ok] > 0).all()


def test_notes_say_what_is_not_represented(result):
    note = dict(zip(result.line, result.note))
    assert "not simulated" in note[8] and "CUDA1" in note[8]
    assert "flash_attn off" in note[7]
    assert "pp64 @ d128 then tg8 @ d192" in note[10]
    assert "FlashAttention" in note[4]  # depth 4096 with the profile's unfused attention table
    # lines 1 and 2 are -ncmoe 48 on the test's 2-block GGUF: said, as run says it
    assert note[1] == note[2] == CUT_NOTE and note[3] == note[5] == ""


def test_prediction_equals_run_scenario_by_hand(result):
    q = _model_cut("qwen3-30b-a3b", 2)
    # line 1: -ncmoe 48 -lm none pp512 on the 2-layer GGUF: every expert host-resident, pinned
    r = by_hand(q, Placement(n_cpu_moe=2, pinned=True, ctx_size=512), [BenchTest(512, 0, 0)], 512)[0]
    assert result.predicted_ts.iloc[0] == r.tps_mean and result.predicted_stddev_ts.iloc[0] == r.tps_std
    # line 2: the same placement, tg32
    r = by_hand(q, Placement(n_cpu_moe=2, pinned=True, ctx_size=32), [BenchTest(0, 32, 0)], 512)[0]
    assert result.predicted_ts.iloc[1] == r.tps_mean
    # line 4: resident, pageable (-lm auto), pp512 @ d4096
    r = by_hand(q, Placement(pinned=False, ctx_size=4608), [BenchTest(512, 0, 4096)], 512)[0]
    assert result.predicted_ts.iloc[3] == r.tps_mean
    g = _model_cut("gemma3-27b", 2)
    # line 6: -ot ffn_(gate|up|down)=CPU -lm mmap tg16; a dense model draws no routing: one repetition
    pl = Placement(override_tensor=(("ffn_(gate|up|down)", "CPU"),), pinned=False, ctx_size=16)
    r = by_hand(g, pl, [BenchTest(0, 16, 0)], 512, repetitions=1)[0]
    assert result.predicted_ts.iloc[5] == r.tps_mean and result.predicted_stddev_ts.iloc[5] == 0
    r3 = by_hand(g, pl, [BenchTest(0, 16, 0)], 512, repetitions=3)[0]
    assert np.ptp(r3.tps) == 0 and r3.tps_mean == pytest.approx(r.tps_mean, rel=1e-14)
    # line 7: -ngl 1 tg16
    r = by_hand(g, Placement(ngl=1, pinned=False, ctx_size=16), [BenchTest(0, 16, 0)], 512, repetitions=1)[0]
    assert result.predicted_ts.iloc[6] == r.tps_mean
    # line 10: tiny MoE, -ot experts -pg 64,8 -d 128 -ub 64 -b 64 (the rule as llama.cpp has it)
    tiny = load_model(ROOT / "scenarios" / "tiny" / "tiny-moe.toml")
    pl = Placement(override_tensor=((r"blk\.[0-9]+\.ffn_.*_exps\.weight", "CPU"),), pinned=True, ctx_size=200)
    pp, tg = by_hand(tiny, pl, [BenchTest(64, 0, 128), BenchTest(0, 8, 192)], 64, 64)
    tps = 72 / (pp.makespan_s + tg.makespan_s)
    assert result.predicted_ts.iloc[9] == pytest.approx(float(np.mean(tps)), rel=1e-12)


def test_prefetch_rows_are_predicted_with_their_variant(tmp_path):
    """Rows of the prefetch patch's llama-bench (-pw/-pwg/-pes fields) are simulated under the
    variant they name; -pw 1 with -pes > 0 is not simulated, and says so."""
    base = json.loads((RUN / "llama-bench.jsonl").read_text().splitlines()[0])  # -ncmoe 48 -lm none pp512

    def patched(pw, pwg, pes):
        return json.dumps({**base, "prefetch_weights": pw, "prefetch_gate": pwg, "prefetch_expert_slots": pes})

    run = subset(tmp_path, [1])
    with open(run / "llama-bench.jsonl", "a") as fh:
        fh.write("".join(patched(*f) + "\n" for f in [(0, 0, 0), (1, 0, 0), (1, 512, 0), (0, 512, 3), (1, 0, 3)]))
    inv = json.loads((RUN / "invocations.jsonl").read_text().splitlines()[0]) | {"rows": 6}
    (run / "invocations.jsonl").write_text(json.dumps(inv) + "\n")
    df = cmp.compare(run, HW, jobs=1)
    assert df.variant.tolist()[:5] == ["baseline", "baseline", "prefetch_ungated", "prefetch_gated_512", "slots3"]
    assert pd.isna(df.variant[5]) and df.predicted_ts.isna().tolist() == [False] * 5 + [True]
    assert "not simulated" in df.note[5] and "prefetch_expert_slots 3" in df.note[5]
    assert df.note[0] == df.note[1] == CUT_NOTE and "variant prefetch_ungated (prefetch_weights 1, prefetch_gate 0" in df.note[2]
    assert df.predicted_ts[0] == df.predicted_ts[1]  # an upstream row and -pw 0: the same baseline
    q = _model_cut("qwen3-30b-a3b", 2)
    pl = Placement(n_cpu_moe=2, pinned=True, ctx_size=512)
    for i, v in ((2, "prefetch_ungated"), (3, "prefetch_gated_512"), (4, "slots3")):
        r = by_hand(q, pl, [BenchTest(512, 0, 0)], 512, variant=v)[0]
        assert df.predicted_ts[i] == r.tps_mean, v
    assert df.predicted_staging_mib[0] == 0 and (df.predicted_staging_mib[2:5] > 0).all()
    assert (df.predicted_vram_mib[:5] > 0).all()


def test_row_case_places_what_the_row_says():
    df = cmp.read_llama_bench(RUN / "llama-bench.jsonl")
    q = cmp.cut_model(load_model(ROOT / "scenarios" / "models" / "qwen3-30b-a3b.toml"), 2)
    case = cmp.row_case(df.loc[2], q, HW)
    scn = case.scenario
    assert {t.name for t in q.tensors if scn.placement.host_resident(q, t)} == (
        {t.name for t in q.tensors if t.is_expert} | {"token_embd.weight"})
    assert case.tests == (BenchTest(0, 32, 0),) and case.regime == "host_expert_decode"
    assert [v.name for v in scn.variants] == ["baseline"] and scn.routing.kind == "uniform"
    assert (scn.workload.n_ubatch, scn.workload.n_batch) == (512, 2048)
    g = cmp.cut_model(load_model(ROOT / "scenarios" / "models" / "gemma3-27b.toml"), 2)
    case = cmp.row_case(df.loc[5], g, HW)
    host = {t.name for t in g.tensors if case.scenario.placement.host_resident(g, t)}
    assert host == {f"blk.{i}.ffn_{p}.weight" for i in range(2) for p in ("gate", "up", "down")} | {
        "token_embd.weight"}
    assert not case.scenario.placement.pinned and case.regime == "dense_partial_offload"
    # quantised KV: the model's KV element size follows type_k/type_v
    case = cmp.row_case(df.loc[3].to_dict() | {"type_k": "q8_0", "type_v": "q8_0"}, q, HW)
    assert case.scenario.model.kv_bytes_per_elem == 34 / 32 and "q8_0" in "; ".join(case.notes)


def test_regimes():
    q = cmp.cut_model(load_model(ROOT / "scenarios" / "models" / "qwen3-30b-a3b.toml"), 2)
    g = cmp.cut_model(load_model(ROOT / "scenarios" / "models" / "gemma3-27b.toml"), 2)
    assert cmp.regime(q, Placement(), "pp") == "resident"
    assert cmp.regime(q, Placement(ngl=3), "tg") == "resident"
    # -ngl n_layer: the output layer takes one of the n_layer + 1, block 0 stays on the host
    assert cmp.regime(q, Placement(ngl=2), "tg") == "host_expert_decode"
    assert cmp.regime(q, Placement(override_tensor=(("output", "CPU"),)), "tg") == "other"  # the head alone
    assert cmp.regime(q, Placement(n_cpu_moe=1), "pp") == "copy_bound_prefill"
    assert cmp.regime(q, Placement(n_cpu_moe=1), "tg") == "host_expert_decode"
    assert cmp.regime(q, Placement(n_cpu_moe=1), "pp+tg") == "mixed_pp_tg"
    assert cmp.regime(q, Placement(ngl=1), "pp") == "copy_bound_prefill"  # a host block holds experts
    assert cmp.regime(q, Placement(override_tensor=(("attn_q", "CPU"),)), "tg") == "other"
    assert cmp.regime(g, Placement(), "tg") == "resident"
    assert cmp.regime(g, Placement(ngl=1), "tg") == "dense_partial_offload"
    assert cmp.regime(g, Placement(override_tensor=(("ffn_up", "CPU"),)), "pp") == "dense_partial_offload"


def test_decode_rows_share_a_prediction_across_ubatch(tmp_path):
    """-ub/-b do not enter a decode plan (only its VRAM check): rows that differ only in them
    are simulated once, and each still equals run_scenario."""
    rows = (RUN / "llama-bench.jsonl").read_text().splitlines()
    run = subset(tmp_path, [2])
    extra = rows[1].replace('"n_ubatch": 512', '"n_ubatch": 64').replace('"n_batch": 2048', '"n_batch": 64')
    with open(run / "llama-bench.jsonl", "a") as fh:
        fh.write(extra + "\n")
    df = cmp.compare(run, HW, jobs=1)
    q = _model_cut("qwen3-30b-a3b", 2)
    r = by_hand(q, Placement(n_cpu_moe=2, pinned=True, ctx_size=32), [BenchTest(0, 32, 0)], 64, 64)[0]
    assert list(df.n_ubatch) == [512, 64] and (df.predicted_ts == r.tps_mean).all()


def test_parallel_equals_serial(tmp_path, result):
    run = subset(tmp_path, [6, 9, 10])
    df = cmp.compare(run, HW, jobs=2)
    assert list(df.predicted_ts) == list(result.predicted_ts.iloc[[5, 8, 9]])


def _invocations_without_args() -> list[dict]:
    """The test folder's invocations without their row counts and command lines (nothing to
    check a row against: every row is taken as asked for)."""
    return [{k: v for k, v in json.loads(x).items() if k not in ("rows", "args")}
            for x in (RUN / "invocations.jsonl").read_text().splitlines() if x.strip()]


def test_rows_that_do_not_fit_or_map_are_noted(tmp_path):
    rows = (RUN / "llama-bench.jsonl").read_text().splitlines()
    run = subset(tmp_path, [9], _invocations_without_args())  # the rows added below: no invocation's args
    big = rows[2].replace('"n_gen": 0, "n_depth": 0', '"n_gen": 0, "n_depth": 100000000')  # 400 GB of KV
    other = rows[0].replace("qwen3-30b-a3b-2l.gguf", "unknown.gguf")
    with open(run / "llama-bench.jsonl", "a") as fh:
        fh.write(big + "\n" + other + "\n")
    df = cmp.compare(run, HW, jobs=1)
    assert df.predicted_ts.isna().tolist() == [False, True, True]
    assert "does not fit" in df.note[1] and "unknown.gguf" in df.note[2] and df.regime[2] == "unknown"
    assert df.model_toml.isna()[2] and pd.isna(df.n_layer[2])


def test_invocation_errors(tmp_path):
    inv = [{"id": "t", "model_toml": "scenarios/tiny/tiny-moe.toml", "gguf": "tiny-moe.gguf", "n_layer": 3}]
    with pytest.raises(ScenarioError, match="exceeds the model's 2 layers"):
        cmp.compare(subset(tmp_path / "a", [9], inv), HW)
    inv = [{"id": "t", "model_toml": "scenarios/tiny/nope.toml", "gguf": "tiny-moe.gguf"}]
    with pytest.raises(ScenarioError) as ei:
        cmp.compare(subset(tmp_path / "b", [9], inv), HW)
    assert "model_toml, line 1" in str(ei.value) and "invocations.jsonl" in str(ei.value)
    inv = [{"id": "t", "model_toml": "scenarios/tiny/tiny-moe.toml", "gguf": "x.gguf"},
           {"id": "u", "model_toml": "scenarios/models/qwen3-30b-a3b.toml", "gguf": "/other/x.gguf"}]
    with pytest.raises(ScenarioError, match="two models"):
        cmp.compare(subset(tmp_path / "c", [9], inv), HW)
    run = subset(tmp_path / "d", [9])
    (run / "invocations.jsonl").write_text('{"id": "t", "gguf": 3}\n')
    with pytest.raises(ScenarioError, match="gguf, line 1"):
        cmp.compare(run, HW)
    (run / "invocations.jsonl").unlink()
    with pytest.raises(ScenarioError, match="invocations.jsonl"):
        cmp.compare(run, HW)
    with pytest.raises(ScenarioError, match="run folder not found"):
        cmp.compare(tmp_path / "none", HW)


def test_invocations_are_attributed_by_gguf_without_counts(tmp_path):
    inv = [{"id": "t", "model_toml": "scenarios/tiny/tiny-moe.toml", "gguf": "tiny-moe.gguf", "rc": 1}]
    df = cmp.compare(subset(tmp_path, [9], inv), HW, jobs=1)
    assert df.invocation[0] == "t" and "exit status 1" in df.note[0]


def test_cut_model():
    q = load_model(ROOT / "scenarios" / "models" / "qwen3-30b-a3b.toml")
    c = cmp.cut_model(q, 2)
    assert c.n_layer == 2 and max(t.layer for t in c.tensors) == 1
    # the full file's first blocks, their per-layer types (use_more_bits of 48) and bytes included
    assert c.tensors[:-2] == tuple(t for t in q.tensors if 0 <= t.layer < 2 or t.group == "embd")
    assert c.tensors[-2:] == q.tensors[-2:]  # output_norm, output
    assert c.nbytes == sum(t.nbytes for t in c.tensors) < q.nbytes
    assert cmp.cut_model(q, None) is q and cmp.cut_model(q, 48) is q
    with pytest.raises(ValueError):
        cmp.cut_model(q, 49)


def test_summary():
    df = pd.DataFrame(dict(kind=["pp", "pp", "tg", "tg"], regime=["resident", "copy_bound_prefill",
                                                                    "host_expert_decode", "unknown"],
                           rel_error=[0.1, -0.3, 0.2, math.nan]))
    s = cmp.summarize(df).set_index("group")
    assert list(s.index) == ["all", "pp", "tg", "regime: resident", "regime: copy_bound_prefill",
                             "regime: host_expert_decode", "regime: unknown"]
    assert s.loc["all", "n_rows"] == 4 and s.loc["all", "n_predicted"] == 3
    assert s.loc["all", "median_abs_rel_error"] == pytest.approx(0.2)
    assert s.loc["all", "p90_abs_rel_error"] == pytest.approx(0.28)
    assert s.loc["pp", "median_rel_error"] == pytest.approx(-0.1)
    assert math.isnan(s.loc["regime: unknown", "median_abs_rel_error"])
    md = cmp.summary_markdown(s.reset_index(), "title")
    assert md.startswith("title\n\n| group |") and "| all | 4 | 3 | 20.0% | 28.0% | +10.0% |" in md
    assert "| regime: unknown | 1 | 0 |  |  |  |" in md


def test_cli_writes_csv_summary_and_figure(tmp_path, capsys):
    run = subset(tmp_path, [9, 10, 8])
    out, md, fig = tmp_path / "o" / "cmp.csv", tmp_path / "o" / "summary.md", tmp_path / "o" / "cmp.png"
    rc = cmp.main([str(run), "--out", str(out), "--summary", str(md), "--figure", str(fig), "-q", "--jobs", "1"])
    cap = capsys.readouterr()
    assert rc == 0 and "| all | 3 | 2 |" in cap.out and "1 of 3 rows not simulated" in cap.err
    df = pd.read_csv(out)
    assert list(df.columns) == list(cmp.COLUMNS) and len(df) == 3
    assert md.read_text() == cap.out and fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert cmp.main([str(tmp_path / "missing"), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run folder not found" in err
    run = subset(tmp_path, [9])
    bench = run / "llama-bench.jsonl"
    bench.write_text(bench.read_text().replace('"n_gen": 0', '"n_gen": "0"'))
    assert cmp.main([str(run), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "n_gen, line 1" in err
    assert cmp.main([str(run), "-q", "--repetitions", "0"]) == 2
    assert "--repetitions" in capsys.readouterr().err


def _repro_rows(measured, predicted, kinds, splits, invs=None):
    n = len(measured)
    base = {k: [None] * n for k in cmp.REPEAT_KEY + cmp.CONFIG_KEY}
    base.update(invocation=invs or [f"r{i}" for i in range(n)], test=["pp512"] * n, ot=[None] * n, variant=["baseline"] * n)
    return pd.DataFrame(dict(base, measured_ts=measured, predicted_ts=predicted, kind=kinds, regime=["resident"] * n,
                             split=splits, rel_error=[p / m - 1 for p, m in zip(predicted, measured)]))


def test_repeat_rows_are_matched_by_configuration_and_summarised():
    a = _repro_rows([100.0, 200.0, 50.0], [110.0, 200.0, 55.0], ["pp", "pp", "tg"], ["heldout", "fit", "heldout"])
    # the repeat lacks r1, has r0 twice (matched to their mean) and an extra configuration
    b = _repro_rows([90.0, 110.0, 40.0, 7.0], [0.0] * 4, ["pp"] * 4, ["fit"] * 4, invs=["r0", "r0", "r2", "zz"])
    m = cmp.attach_repeat(a, b)
    assert list(m.index) == list(a.index) and m.repeat_ts.iloc[0] == 100.0 and math.isnan(m.repeat_ts.iloc[1])
    assert m.repeat_ts.iloc[2] == 40.0 and list(m.ot) == list(a.ot)
    r = cmp.reproducibility(m).set_index("group")
    assert r.loc["all", "n_matched"] == 2
    assert r.loc["tg", "median_abs_repeat_diff"] == pytest.approx(0.2)       # 40 vs 50
    assert r.loc["tg", "median_abs_rel_error"] == pytest.approx(0.1)         # 55 vs 50
    assert r.loc["tg", "median_abs_pooled_error"] == pytest.approx(55 / 45 - 1)
    assert r.loc["held-out", "n_matched"] == 2 and r.loc["fit", "n_matched"] == 0
    assert math.isnan(r.loc["fit", "median_abs_repeat_diff"])
    assert "| all | 2 |" in cmp.repro_markdown(cmp.reproducibility(m), "T")


def test_a_folder_whose_row_counts_do_not_add_up_is_refused(tmp_path):
    """Row counts in invocations.jsonl that the file's rows do not add up to are refused with one
    line naming the file and the field, not compared silently (a row pasted twice with its samples
    is refused before, as a copy: test_a_row_repeated_with_its_samples_is_refused_as_a_copy)."""
    invs = [json.loads(x) for x in (RUN / "invocations.jsonl").read_text().splitlines() if x.strip()]
    n = sum(1 for x in (RUN / "llama-bench.jsonl").read_text().splitlines() if x.strip())
    counted = [dict(inv, rows=1) for inv in invs]  # counts that cannot match the 10 rows
    run = subset(tmp_path / "a", list(range(1, n + 1)), counted)
    with pytest.raises(ScenarioError, match=r"rows add up to .* has 10 .*invocations.jsonl|invocations.jsonl.*rows"):
        cmp.compare(run, jobs=1)


def test_cli_refuses_a_folder_of_which_no_row_simulates(tmp_path, capsys):
    """Every row not simulated (the committed decode lease on a 2 GB card): exit 2 with one line
    naming the folder and the first row's reason, and no output written."""
    run = ROOT / "data" / "llamacpp" / "h200-20261202-decode"
    prof = tmp_path / "tiny.toml"
    src = ROOT / "scenarios" / "hardware" / "h200-llamacpp.toml"
    text = src.read_text().replace('"h200-llamacpp/kernels-', '"' + str(src.parent / "h200-llamacpp") + "/kernels-")
    prof.write_text("\n".join('vram_gb = { value = 2.0, source = "test" }' if ln.startswith("vram_gb =") else ln
                              for ln in text.splitlines()))
    out = tmp_path / "o.csv"
    assert cmp.main([str(run), "--hardware", str(prof), "--out", str(out), "-q", "--jobs", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "none of the 31 rows" in err and "does not fit" in err
    assert not out.exists()


# --------------------------------------------------------------------------------------
# rows that their invocation's command line did not ask for
# --------------------------------------------------------------------------------------


def _mixed_up(tmp_path: Path, changes: dict[int, tuple[str, str]]) -> Path:
    """The whole test folder (row counts kept: rows attributed by order) with some rows edited
    (1-based line -> (old text, new text)): rows that no longer are what their invocation ran."""
    run = subset(tmp_path, list(range(1, 11)))
    bench = run / "llama-bench.jsonl"
    rows = bench.read_text().splitlines()
    for line, (old, new) in changes.items():
        assert old in rows[line - 1]
        rows[line - 1] = rows[line - 1].replace(old, new)
    bench.write_text("\n".join(rows) + "\n")
    return run


def test_a_row_its_invocation_did_not_ask_for_is_reported_and_not_predicted(tmp_path, result):
    """llama-bench's rows say what ran; a row whose n_cpu_moe / load_mode / flash_attn is not among
    the values its invocation's args asked for (a mixed-up folder) is not simulated (no prediction
    of a configuration never asked for), its note says why, and the other rows are predicted as
    before. A flag the invocation left out is not checked (llama-bench's defaults vary)."""
    run = _mixed_up(tmp_path, {2: ('"n_cpu_moe": 48', '"n_cpu_moe": 12'),      # qwen3-ncmoe48: -ncmoe 48
                               5: ('"load_mode": "mmap"', '"load_mode": "none"'),  # gemma3-ffn-cpu: -lm mmap
                               7: ('"flash_attn": 0', '"flash_attn": 1'),        # gemma3-ngl1-fa0: -fa 0
                               8: ('"n_ubatch": 512', '"n_ubatch": 256')})       # gemma3-cuda1: no -ub given
    df = cmp.compare(run, HW, jobs=1)
    bad = [2, 5, 7]
    assert df.predicted_ts.isna().tolist() == [ln in bad or ln == 8 for ln in range(1, 11)]  # 8: CUDA1, as before
    assert sorted(df.attrs["disagreements"]) == bad
    ok = [ln not in bad + [8] for ln in range(1, 11)]
    assert list(df.predicted_ts[ok]) == list(result.predicted_ts[ok])
    assert list(df.invocation) == list(result.invocation)  # still attributed by order
    d = df.attrs["disagreements"]
    assert f"{run / 'llama-bench.jsonl'}: field 'n_cpu_moe, line 2': the row ran n_cpu_moe 12, which its " \
        "invocation 'qwen3-ncmoe48' (invocations.jsonl line 1) did not ask for (-ncmoe 48)" in d[2]
    assert "field 'load_mode, line 5'" in d[5] and "(-lm mmap)" in d[5]
    assert "field 'flash_attn, line 7'" in d[7] and "(-fa 0)" in d[7]
    assert df.note[1].startswith("not simulated: the row ran n_cpu_moe 12") and df.regime[1] == "unknown"


def test_cli_reports_each_such_row_in_one_line(tmp_path, capsys):
    run = _mixed_up(tmp_path, {2: ('"n_cpu_moe": 48', '"n_cpu_moe": 12'), 9: ('"n_ubatch": 64', '"n_ubatch": 32')})
    out = tmp_path / "o.csv"
    assert cmp.main([str(run), "--hardware", str(ROOT / "scenarios/hardware/h200.toml"), "--out", str(out), "-q",
                     "--jobs", "1"]) == 0
    err = capsys.readouterr().err.splitlines()
    lines = [ln for ln in err if "did not ask for" in ln]
    assert len(lines) == 2 and all(ln.startswith(f"compare: {run / 'llama-bench.jsonl'}: field '") for ln in lines)
    assert "field 'n_cpu_moe, line 2'" in lines[0] and "field 'n_ubatch, line 9'" in lines[1]
    assert "(-ub 64)" in lines[1] and "'tiny-ot-exps' (invocations.jsonl line 6)" in lines[1]
    assert err[-1].startswith("compare: 3 of 10 rows not simulated")  # those two and the CUDA1 row (line 8)
    assert sum("line 2" in ln for ln in err) == 1  # said once, not again among the other rows not simulated
    assert pd.read_csv(out).predicted_ts.isna().sum() == 3


def test_every_row_disagreeing_is_one_error_and_writes_nothing(tmp_path, capsys):
    run = subset(tmp_path, [1, 2])
    (run / "invocations.jsonl").write_text(json.dumps(
        {"id": "q", "model_toml": "scenarios/models/qwen3-30b-a3b.toml", "gguf": "qwen3-30b-a3b-2l.gguf",
         "n_layer": 2, "args": ["-ncmoe", "24", "-p", "512", "-n", "32"], "rows": 2}) + "\n")
    out = tmp_path / "o.csv"
    assert cmp.main([str(run), "--out", str(out), "-q", "--jobs", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "none of the 2 rows" in err and "the row ran n_cpu_moe 48" in err
    assert not out.exists()


def test_rows_of_a_gguf_with_several_invocations_are_attributed_by_their_args(tmp_path):
    """Without row counts, a row of a GGUF that several invocations name goes to the one whose
    command line asked for it (before: to none); a row none of them asked for is reported,
    naming the closest."""
    rows = (RUN / "llama-bench.jsonl").read_text().splitlines()
    run = subset(tmp_path, [1, 2, 3, 4])  # qwen3-ncmoe48 (-ncmoe 48 -n 32) and qwen3-resident (-n 0 -d 0,4096)
    with open(run / "llama-bench.jsonl", "a") as fh:  # decode with -ncmoe 12: neither asked for it
        fh.write(rows[1].replace('"n_cpu_moe": 48', '"n_cpu_moe": 12') + "\n")
    bench = read_llama_bench(run / "llama-bench.jsonl")
    owners = cmp._attribute(bench, cmp.read_invocations(run / "invocations.jsonl"))
    # line 1 (pp512 @ d0, -ncmoe 48): resident gives no -ncmoe, whose default is 0 in every
    # llama-bench (STABLE_DEFAULTS): only qwen3-ncmoe48 can have run it
    assert [o and o["id"] for o in owners] == ["qwen3-ncmoe48", "qwen3-ncmoe48", "qwen3-resident", "qwen3-resident",
                                               None]
    df = cmp.compare(run, HW, jobs=1)
    assert list(df.attrs["disagreements"]) == [5] and df.predicted_ts.isna().tolist() == [False] * 4 + [True]
    assert df.attrs["disagreements"][5].endswith(
        "field 'n_cpu_moe, line 5': the row ran n_cpu_moe 12, which none of the 2 invocations of its GGUF (the "
        "closest: 'qwen3-ncmoe48' (invocations.jsonl line 1)) did not ask for (-ncmoe 48): not simulated "
        "(llama-bench's rows say what ran: a corrupt or mixed-up run folder?)")


def test_invocation_args_must_be_llama_bench_flags(tmp_path):
    for i, (args, words) in enumerate(((["-p", "512", 3], "expected a list of strings"),
                                       ("-p 512", "expected a list of strings"),
                                       (["--frobnicate", "3"], "not a llama-bench command line"),
                                       (["-ngl99"], "-ngl99: write -ngl 99"))):
        run = subset(tmp_path / str(i), [9], [
            {"id": "t", "model_toml": "scenarios/tiny/tiny-moe.toml", "gguf": "tiny-moe.gguf", "args": args}])
        with pytest.raises(ScenarioError) as ei:
            cmp.compare(run, HW, jobs=1)
        assert ei.value.field == "args, line 1" and "invocations.jsonl" in str(ei.value) and words in str(ei.value)


def test_committed_rows_all_agree_with_their_invocations():
    """Every committed run folder's rows are what their invocations asked for (the check raises
    no false alarm on llama-bench's own printing of -fa, -lm, -ot, -ts, -pw...)."""
    for run in sorted((ROOT / "data" / "llamacpp").iterdir()):
        if not (run / "llama-bench.jsonl").is_file():
            continue
        bench = read_llama_bench(run / "llama-bench.jsonl")
        invs = cmp.read_invocations(run / "invocations.jsonl")
        owners = cmp._attribute(bench, invs)
        assert all(o is not None and o["_asked"] for o in owners), run
        assert not [ln for (ln, row), o in zip(bench.iterrows(), owners) if cmp.row_disagreements(row, o)], run


def test_within_run_repeats_pair_each_load_with_the_other_loads():
    """A configuration measured by two invocations (two model loads) gets the other load's mean;
    one measured once gets none; rows of one invocation are never paired with each other."""
    a = _repro_rows([100.0, 80.0, 50.0, 52.0], [110.0, 80.0, 55.0, 55.0], ["tg"] * 4, ["heldout"] * 4,
                    invs=["a-x", "b-x", "a-y", "a-y"])
    a["model"], a["model_toml"], a["n_layer"] = "m", "m.toml", 48
    a.loc[2:3, "n_gen"] = [128, 128]         # the two a-y rows: one configuration, one invocation
    a.loc[0:1, "n_gen"] = [64, 64]           # a-x and b-x: one configuration, two invocations
    m = cmp.attach_within_repeat(a)
    assert m.repeat_ts.iloc[0] == 80.0 and m.repeat_ts.iloc[1] == 100.0
    assert m.repeat_ts.iloc[2:].isna().all()
    r = cmp.reproducibility(m).set_index("group")
    assert r.loc["all", "n_matched"] == 2
    assert r.loc["all", "median_abs_repeat_diff"] == pytest.approx(((100 / 80 - 1) + (1 - 80 / 100)) / 2)
    # another model with the same fields is another configuration
    b = a.copy()
    b.loc[1, "model"] = "other"
    assert cmp.attach_within_repeat(b).repeat_ts.isna().all()


def test_mean_over_loads_merges_each_configurations_loads_into_one_row():
    """Rows of one configuration from separate invocations become one row whose measured t/s is
    their mean and whose error is recomputed from it; a configuration measured once keeps its
    row; another model is another configuration."""
    a = _repro_rows([100.0, 80.0, 50.0, 52.0], [110.0, 80.0, 55.0, 55.0], ["tg"] * 4, ["heldout"] * 4,
                    invs=["a-x", "b-x", "a-y", "a-z"])
    a["model"], a["model_toml"], a["n_layer"] = "m", "m.toml", 48
    a.loc[0:1, "n_gen"] = [64, 64]           # a-x and b-x: one configuration, two loads
    a.loc[2:3, "n_gen"] = [128, 256]         # two configurations, one load each
    a["predicted_ts"] = [90.0, 90.0, 50.0, 40.0]
    a["rel_error"] = a.predicted_ts / a.measured_ts - 1
    m = cmp.mean_over_loads(a)
    assert len(m) == 3 and list(m.n_loads) == [2, 1, 1]
    assert m.measured_ts.iloc[0] == 90.0 and m.rel_error.iloc[0] == 0.0
    assert m.measured_stddev_ts.iloc[0] == pytest.approx(np.std([100.0, 80.0], ddof=1))
    assert m.invocation.iloc[0] == "a-x+b-x"
    assert m.rel_error.iloc[1] == a.rel_error.iloc[2] and m.rel_error.iloc[2] == a.rel_error.iloc[3]
    s = cmp.summarize(m).set_index("group")
    assert s.loc["all", "n_rows"] == 3
    b = a.copy()
    b.loc[1, "model"] = "other"
    assert list(cmp.mean_over_loads(b).n_loads) == [1, 1, 1, 1]
    assert len(cmp.mean_over_loads(a.iloc[:0])) == 0


def _host_side_loads() -> pd.DataFrame:
    """Four host-expert decode rows: two configurations (tg64, tg128), each in two loads
    (invocations a-x / b-x and a-y / b-y), measured 100, 80, 50 and 40 t/s, predicted 90."""
    a = _repro_rows([100.0, 80.0, 50.0, 40.0], [90.0] * 4, ["tg"] * 4, ["heldout"] * 4,
                    invs=["a-x", "b-x", "a-y", "b-y"])
    a["model"], a["model_toml"], a["n_layer"] = "m", "m.toml", 48
    a["regime"] = "host_expert_decode"
    a.loc[0:1, "n_gen"] = [64, 64]
    a.loc[2:3, "n_gen"] = [128, 128]
    return a


def test_canary_rates_join_rows_by_invocation_and_correlate(tmp_path):
    a = _host_side_loads()
    assert cmp.attach_canary(a, tmp_path) is a and cmp.canary_line(a) == ""   # no canary file
    (tmp_path / "canary.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"before": "a-x", "rc": 0, "gb_per_s": 100.0}, {"before": "b-x", "rc": 0, "gb_per_s": 80.0},
        {"before": "a-y", "rc": 0, "gb_per_s": 110.0}, {"before": "b-y", "rc": 2, "error": "x"}]) + "\n")
    m = cmp.attach_canary(a, tmp_path)
    assert list(m.host_read_gb_per_s.iloc[:3]) == [100.0, 80.0, 110.0] and math.isnan(m.host_read_gb_per_s.iloc[3])
    line = cmp.canary_line(m)
    # only a-x / b-x are one configuration measured in two loads with a rate: 2 rows, no r
    assert "median 100.0 GB/s, 80.0..110.0 over 3 invocations" in line and "Pearson" not in line
    m.loc[3, "host_read_gb_per_s"] = 70.0
    r = np.corrcoef([100 / 90, 80 / 90, 50 / 45, 40 / 45], [100.0, 80.0, 110.0, 70.0])[0, 1]  # t/s over its mean
    assert f"r = {r:+.2f} (4 rows)" in cmp.canary_line(m)
    # a configuration measured once tells nothing of the loads: its row is not counted
    one = m.copy()
    one.loc[3, "n_gen"] = 256
    assert "Pearson" not in cmp.canary_line(one)
    (tmp_path / "canary.jsonl").write_text("not json\n")
    with pytest.raises(ScenarioError, match="canary"):
        cmp.attach_canary(a, tmp_path)


def test_steal_time_joins_rows_by_their_invocations_window_and_correlates(tmp_path):
    """Each invocation's steal share of the CPU time between the host samples inside its window
    (started_at .. + wall_s, padded); an invocation with fewer than two samples there has none;
    a packed host_state.jsonl.gz reads alike; a bad line names the file."""
    import gzip

    a = _host_side_loads()
    assert cmp.attach_steal(a, tmp_path) is a and cmp.steal_line(a) == ""   # no host sampler
    starts = {"a-x": "2026-12-04T19:00:00Z", "b-x": "2026-12-04T19:01:00Z", "a-y": "2026-12-04T19:02:00Z",
              "b-y": "2026-12-04T19:03:00Z"}
    (tmp_path / "invocations.jsonl").write_text("\n".join(json.dumps({"id": k, "started_at": v, "wall_s": 10.0})
                                                          for k, v in starts.items()) + "\n")
    # samples every 5 s; the cumulative steal grows by 1 jiffy per 1000 (0.1 %) in a-x, 10 (1 %) in b-x, 0 in a-y
    recs, stat, t0 = [], [0] * 8, 1796410800  # 2026-12-04T19:00:00Z
    import datetime as dt
    for k, share in (("a-x", 1), ("b-x", 10), ("a-y", 0)):
        base = dt.datetime.strptime(starts[k], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc).timestamp()
        for step in range(3):
            at = dt.datetime.fromtimestamp(base + 5 * step, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            recs.append({"at": at, "stat_cpu": list(stat)})
            stat[0] += 1000 - share
            stat[7] += share
    recs.insert(0, {"at": "2026-12-04T18:59:00Z", "transparent_hugepage": {}})  # a line without stat_cpu
    (tmp_path / "host_state.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    m = cmp.attach_steal(a, tmp_path)
    assert m.host_steal_pct.iloc[:3].tolist() == pytest.approx([0.1, 1.0, 0.0]) and math.isnan(m.host_steal_pct.iloc[3])
    line = cmp.steal_line(m)
    assert "median 0.10 % of the CPU time, 0.00..1.00 % over 3 invocations" in line and "Pearson" not in line
    m.loc[3, "host_steal_pct"] = 0.5
    r = np.corrcoef([100 / 90, 80 / 90, 50 / 45, 40 / 45], [0.1, 1.0, 0.0, 0.5])[0, 1]
    assert f"r = {r:+.2f} (4 rows)" in cmp.steal_line(m)
    packed = tmp_path / "host_state.jsonl.gz"
    packed.write_bytes(gzip.compress((tmp_path / "host_state.jsonl").read_bytes()))
    (tmp_path / "host_state.jsonl").unlink()
    assert cmp.attach_steal(a, tmp_path).host_steal_pct.iloc[:3].tolist() == pytest.approx([0.1, 1.0, 0.0])
    packed.write_bytes(gzip.compress(b"not json\n"))
    with pytest.raises(ScenarioError, match="host_state.jsonl.gz"):
        cmp.attach_steal(a, tmp_path)


def test_committed_tg4_run_averages_three_or_four_loads_per_configuration():
    """data/llamacpp/h200-20261203-tg4 measures each of its 18 tg configurations in 3 or 4
    separate invocations (the passes a..d); its load-averaged table has one row each."""
    bench = read_llama_bench(ROOT / "data/llamacpp/h200-20261203-tg4/llama-bench.jsonl")
    invs = cmp.read_invocations(ROOT / "data/llamacpp/h200-20261203-tg4/invocations.jsonl")
    assert len(bench) == sum(int(i["rows"]) for i in invs) == 63
    passes = {}
    for i in invs:
        passes.setdefault(i["id"][2:], set()).add(i["id"][0])
    assert len(passes) == 13 and all(len(p) >= 3 for p in passes.values())


def test_repeat_key_is_the_configuration_when_the_grids_differ():
    a = _repro_rows([1.0], [1.0], ["tg"], ["fit"], invs=["a-x"])
    assert cmp.repeat_key(a, _repro_rows([1.0], [1.0], ["tg"], ["fit"], invs=["a-x"])) == cmp.REPEAT_KEY
    assert cmp.repeat_key(a, _repro_rows([1.0], [1.0], ["tg"], ["fit"], invs=["gt-x"])) == cmp.CONFIG_KEY
    assert "invocation" not in cmp.CONFIG_KEY and "model" in cmp.CONFIG_KEY
    # grids that reuse an id for another configuration: the id would match nothing, the configuration does
    b = _repro_rows([1.0, 1.0], [1.0, 1.0], ["tg", "tg"], ["fit", "fit"], invs=["a-x", "b-y"])
    b.loc[0, "test"], b.loc[1, "invocation"] = "tg32", "b-y"
    a2 = _repro_rows([1.0], [1.0], ["tg"], ["fit"], invs=["a-x"])
    assert cmp.attach_repeat(a2, b, cmp.REPEAT_KEY).repeat_ts.isna().all()
    assert cmp.repeat_key(a2, b) == cmp.CONFIG_KEY and cmp.attach_repeat(a2, b, cmp.CONFIG_KEY).repeat_ts.notna().all()


def test_repeat_rows_of_another_model_never_match():
    """Two folders that give one invocation id (or none) to the same settings on different
    models: no row is matched, by either key (fresh-user round 7: a Qwen3 pp512 row had been
    paired with gpt-oss's t/s, a 167 % repeat difference)."""
    a = _repro_rows([3011.0], [3000.0], ["pp"], ["fit"], invs=["bench1"])
    b = _repro_rows([8031.0], [8000.0], ["pp"], ["fit"], invs=["bench1"])
    a["model"], a["model_toml"], a["n_layer"] = "qwen3moe 30B.A3B Q4_K - Medium", "qwen3-30b-a3b.toml", 48
    b["model"], b["model_toml"], b["n_layer"] = "gpt-oss 20B MXFP4 MoE", "gpt-oss-20b.toml", 24
    for key in (cmp.REPEAT_KEY, cmp.CONFIG_KEY, cmp.repeat_key(a, b)):
        assert cmp.attach_repeat(a, b, key).repeat_ts.isna().all()
    b[["model", "model_toml", "n_layer"]] = a[["model", "model_toml", "n_layer"]]
    assert cmp.attach_repeat(a, b, cmp.repeat_key(a, b)).repeat_ts.tolist() == [8031.0]


@pytest.mark.slow
def test_the_decode_ground_truth_prints_its_repeatability_between_model_loads(tmp_path, capsys):
    """data/llamacpp/h200-20261203-tg measures every configuration in two invocations: compare
    prints the within-run table, each of its 36 rows paired with the other load."""
    md = tmp_path / "s.md"
    assert cmp.main(["data/llamacpp/h200-20261203-tg", "-q", "--jobs", "1", "--summary", str(md)]) == 0
    text = md.read_text()
    assert "Repeatability within data/llamacpp/h200-20261203-tg" in text
    assert "| all | 36 |" in text.split("Repeatability within")[1]
    averaged = text.split("Averaged over model loads")[1]
    assert "(2..2 loads, 18 configurations)" in averaged and "| all | 18 | 18 |" in averaged


@pytest.mark.parametrize("extra, what", [
    (["--out", "{t}/same", "--summary", "{t}/same"], "is also --out's file"),
    (["--out", "-"], "not standard output"),
    (["--repeat", "data/llamacpp/h200-20261203-tg"], "is the run folder itself"),
])
def test_compare_refuses_outputs_that_would_clobber_each_other(tmp_path, extra, what, capsys):
    args = [a.format(t=tmp_path) for a in extra]
    assert cmp.main(["data/llamacpp/h200-20261203-tg", "-q", "--jobs", "1"] + args) == 2
    err = capsys.readouterr().err
    assert what in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_warnings_name_another_gpu_and_each_invocation_with_another_model_size():
    df = pd.DataFrame({"invocation": ["a-x", "a-x", "b-y", None], "line": [1, 2, 3, 4],
                       "note": ["model_size 1.00 GiB differs from the model file's 2.00 GiB: trimmed",
                                "flash_attn on; model_size 1.00 GiB differs from the model file's 2.00 GiB: trimmed",
                                math.nan, "model_size 3.00 GiB differs: x"]})
    df.attrs.update(gpu_name="NVIDIA H200", hardware="H200 (llama.cpp kernels)",
                    gpu_info=["NVIDIA H200", "NVIDIA GeForce RTX 4090"])
    w = cmp.warnings(df)
    assert len(w) == 3
    assert "NVIDIA GeForce RTX 4090" in w[0] and "NVIDIA H200" in w[0] and "--hardware" in w[0]
    assert w[1].startswith("invocation a-x: model_size 1.00 GiB") and w[2].startswith("line 4: model_size 3.00")
    df.attrs["gpu_info"] = ["NVIDIA H200/NVIDIA H200"]
    assert len(cmp.warnings(df)) == 2
    # a two-GPU profile against one-GPU rows: the machine had fewer GPUs than the profile
    df.attrs.update(gpu_info=["NVIDIA H200"], n_gpu=2)
    w = cmp.warnings(df)
    assert len(w) == 3 and "had 1 GPU(s)" in w[0] and "has 2" in w[0]
    df.attrs.update(gpu_info=["NVIDIA H200, NVIDIA H200"], n_gpu=1)   # -sm none on a two-GPU machine: fine
    assert len(cmp.warnings(df)) == 2


def _one_line(err: str) -> str:
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_a_file_given_for_the_run_folder_says_to_give_its_folder(tmp_path, capsys):
    """Each tool that takes a run folder (compare, ab, fit --run, report) refuses the run's
    llama-bench.jsonl given instead, naming the folder to give, in one line, before any work."""
    from calibrate.llamacpp import ab
    from calibrate.llamacpp import fit as F
    from calibrate.llamacpp.__main__ import main as harness

    bench = RUN / "llama-bench.jsonl"
    for call in (lambda: cmp.main([str(bench), "-q"]), lambda: ab.main([str(bench), "-q"]),
                 lambda: F.main(["--run", str(bench), "--params", "split_us"]), lambda: harness(["report", str(bench)])):
        assert call() == 2
        err = _one_line(capsys.readouterr().err)
        assert f"{bench}: " in err and "is a file, not a run folder" in err and f"give its folder {RUN}" in err
        assert "llama-bench.jsonl and invocations.jsonl" in err and "not found" not in err
    assert F.main(["--run", str(tmp_path / "none")]) == 2
    assert "field '--run': run folder not found" in _one_line(capsys.readouterr().err)
    with pytest.raises(ScenarioError, match="is a file, not a run folder"):
        cmp.compare(bench, HW)
    # --repeat is checked before the (long) first comparison
    assert cmp.main([str(RUN), "--repeat", str(bench), "-q"]) == 2
    assert "field '--repeat'" in _one_line(capsys.readouterr().err)


def test_hardware_takes_the_built_in_names_of_the_rest_of_the_tool(tmp_path, capsys, monkeypatch):
    """--hardware h200 is the shipped profile, as in a scenario file (sim.resources); an unknown
    name lists the known ones; compare, ab, report and fit --profile alike."""
    from calibrate.llamacpp import ab
    from calibrate.llamacpp import fit as F
    from calibrate.llamacpp.__main__ import main as harness
    from sim.resources import builtin_names

    monkeypatch.chdir(tmp_path)  # from any folder
    assert cmp.hardware_path("h200") == ROOT / "scenarios" / "hardware" / "h200.toml"
    assert cmp.hardware_path("tiny-gpu") == ROOT / "scenarios" / "tiny" / "tiny-gpu.toml"
    run = subset(tmp_path, [9])
    df = cmp.compare(run, "h200", jobs=1)
    assert df.attrs["hardware"] == HW.name and df.predicted_ts.notna().all()
    names = builtin_names("hardware")
    assert "h200" in names and "h200-llamacpp" in names
    for call in (lambda: cmp.main([str(run), "--hardware", "h20", "-q"]),
                 lambda: ab.main([str(run), "--hardware", "h20", "-q"]),
                 lambda: harness(["report", str(run), "--hardware", "h20"]),
                 lambda: F.main(["--profile", "h20", "--run", str(run), "--params", "split_us"])):
        assert call() == 2
        err = _one_line(capsys.readouterr().err)
        assert "unknown hardware 'h20'" in err and f"built-in hardware names: {', '.join(names)}" in err
        assert "file not found" not in err
    assert not (run / "compare_llamacpp.csv").exists() and not (run / "routing_check.txt").exists()
    # fit --profile by name is the shipped file (so --out onto it is refused as the profile itself)
    assert F.main(["--profile", "h200-llamacpp", "--out", str(ROOT / "scenarios/hardware/h200-llamacpp.toml"),
                   "--run", str(run), "--params", "split_us"]) == 2
    assert "is --profile itself" in _one_line(capsys.readouterr().err)
    assert F.main(["--profile", str(tmp_path / "none.toml"), "--run", str(run)]) == 2
    assert "none.toml: field '--profile': file not found" in _one_line(capsys.readouterr().err)


def test_an_absurd_rate_is_refused_before_any_statistics(tmp_path, capsys):
    """avg_ts = 1e300 (a corrupt or edited row) is one line naming the file, line and field, not
    numpy's overflow warning."""
    import warnings

    run = subset(tmp_path, [9, 10])
    bench = run / "llama-bench.jsonl"
    rows = bench.read_text().splitlines()
    r = json.loads(rows[1])
    r["avg_ts"] = 1e300
    rows[1] = json.dumps(r)
    bench.write_text("\n".join(rows) + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning would fail here
        assert cmp.main([str(run), "-q", "--jobs", "1"]) == 2
    err = _one_line(capsys.readouterr().err)
    assert f"{bench}: field 'avg_ts, line 2': 1e+300 t/s is not physical" in err


def test_an_invocation_id_given_twice_is_refused_naming_both_lines(tmp_path):
    """Rows, canary rates and host state join on the invocation id: two invocations of one id
    would swap one load's host state for another's."""
    inv = tmp_path / "invocations.jsonl"
    rec = {"gguf": "m.gguf", "model_toml": "m.toml"}
    inv.write_text("\n".join(json.dumps({**rec, "id": i}) for i in ("a", "b", "a")) + "\n")
    with pytest.raises(ScenarioError, match="also line 1") as info:
        cmp.read_invocations(inv)
    assert info.value.field == "id, line 3"
    inv.write_text("\n".join(json.dumps(rec) for _ in range(2)) + "\n")  # no ids at all: fine
    assert len(cmp.read_invocations(inv)) == 2


def test_host_flags_name_the_unmodelled_host_settings_and_split_configurations():
    """``host_flags`` writes llama-bench's non-default host settings and the invocation's
    environment (not the timing patches' switches); rows that differ there are separate
    configurations when loads are merged."""
    base = {"no_host": False, "repack": True, "poll": 50, "cpu_mask": "0x0", "cpu_strict": False}
    assert cmp.host_flags(base) == ""
    assert cmp.host_flags(base, {"env": {"PREFETCH_SIM_SPLIT_TIME": "1", "GGML_SCHED_PREFETCH_WEIGHTS": "1"}}) == ""
    got = cmp.host_flags(base | {"no_host": True, "repack": False, "poll": 0, "cpu_mask": "0xff", "cpu_strict": True},
                         {"env": {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}})
    assert got == "--no-host 1 --repack 0 --poll 0 -C 0xff --cpu-strict 1 GLIBC_TUNABLES=glibc.malloc.hugetlb=1"
    a = _repro_rows([40.0, 42.0, 44.0], [37.0, 37.0, 37.0], ["tg"] * 3, ["fit"] * 3, invs=["a-pin", "b-pin", "a-2m"])
    a["model"], a["model_toml"], a["n_layer"] = "m", "m.toml", 48
    a["n_threads"], a["host_flags"] = 16, ["", "", "--no-host 1 --repack 0 GLIBC_TUNABLES=glibc.malloc.hugetlb=1"]
    m = cmp.mean_over_loads(a)
    assert list(m.n_loads) == [2, 1] and m.measured_ts.iloc[0] == 41.0


def test_rows_note_a_thread_count_and_a_repack_the_tables_do_not_price():
    df = cmp.read_llama_bench(RUN / "llama-bench.jsonl")
    q = cmp.cut_model(load_model(ROOT / "scenarios" / "models" / "qwen3-30b-a3b.toml"), 2)
    row = df.loc[2].to_dict()
    plain = "; ".join(cmp.row_case(row, q, HW).notes)
    assert "n_threads" not in plain and "repack" not in plain
    # this row keeps experts on the host: another thread count is not scored (prefetch-sim run's rule)
    notes = "; ".join(cmp.row_case(row | {"n_threads": 8, "no_host": True}, q, HW).notes)
    assert "not simulated: -t 8 with weights on the host" in notes and "16 threads" in notes and "CPU_REPACK" in notes
    assert "CPU_REPACK" not in "; ".join(cmp.row_case(row | {"no_host": True, "repack": False}, q, HW).notes)
    # a profile that does not record its thread count (a datasheet) says nothing of threads
    sheet = load_hardware(ROOT / "scenarios" / "hardware" / "h200-datasheet.toml")
    assert "n_threads" not in "; ".join(cmp.row_case(row | {"n_threads": 8}, q, sheet).notes)


def test_a_row_at_a_depth_its_invocation_did_not_give_is_not_simulated(tmp_path):
    """An invocation without -d ran depth 0 (llama-bench's default in every version): a row of it
    at another depth is reported and not predicted, as a flag given with other values is."""
    run = tmp_path / "run"
    shutil.copytree(RUN, run, ignore=shutil.ignore_patterns("logs.tar.gz", "compare_*", "routing*"))
    lines = (run / "llama-bench.jsonl").read_text().splitlines()
    invs = cmp.read_invocations(run / "invocations.jsonl")
    owners = cmp._attribute(read_llama_bench(run / "llama-bench.jsonl"), invs)
    k = next(i for i, (o, ln) in enumerate(zip(owners, lines))
             if o and "-d" not in o["args"] and '"n_depth": 0' in ln)
    lines[k] = lines[k].replace('"n_depth": 0', '"n_depth": 12345')
    (run / "llama-bench.jsonl").write_text("\n".join(lines) + "\n")
    inv = owners[k]
    row = read_llama_bench(run / "llama-bench.jsonl").iloc[k]
    got = cmp.row_disagreements(row, inv)
    assert got == [("n_depth", "12345", "no -d, llama-bench's default 0")]


def test_a_row_without_load_mode_takes_its_invocations_lm_else_a_noted_default(tmp_path, result):
    """A row without load_mode (a llama-bench older than -lm) ran the invocation's -lm (line 1:
    -lm none, pinned, as with the field), else llama-bench's default auto (line 3: no -lm; the
    note says so); its use_mmap, when it has one, speaks for it."""
    run = _mixed_up(tmp_path, {1: ('"load_mode": "none", ', ''), 3: ('"load_mode": "auto", ', '')})
    df = cmp.compare(run, HW, jobs=1)
    assert list(df.pinned) == list(result.pinned) and list(df.load_mode) == list(result.load_mode)
    assert df.predicted_ts.equals(result.predicted_ts)  # NaN where not simulated, as before
    assert "llama-bench's default auto assumed (mmap: pageable host weights)" in df.note[2]
    assert "default auto assumed" not in df.note[0]
    run = _mixed_up(tmp_path / "mm", {1: ('"load_mode": "none", ', '"use_mmap": false, ')})
    invs = [json.loads(x) for x in (run / "invocations.jsonl").read_text().splitlines()]
    invs[0]["args"] = [a for a in invs[0]["args"] if a not in ("-lm", "none")]  # an older llama-bench: no -lm
    (run / "invocations.jsonl").write_text("".join(json.dumps(x) + "\n" for x in invs))
    df = cmp.compare(run, HW, jobs=1)
    assert df.pinned[0] and "assumed" not in df.note[0] and df.predicted_ts[0] == result.predicted_ts[0]


def test_a_row_with_overrides_its_invocation_did_not_give_is_not_simulated(tmp_path, result):
    """llama-bench prints tensor_buft_overrides none without -ot in every version (its -ncmoe rules
    are not printed): a row of an invocation without -ot that has rules is reported and not
    predicted, as n_depth and n_cpu_moe are (STABLE_DEFAULTS)."""
    run = _mixed_up(tmp_path, {1: ('"tensor_buft_overrides": "none"', '"tensor_buft_overrides": "exps=CPU"')})
    df = cmp.compare(run, HW, jobs=1)
    assert list(df.attrs["disagreements"]) == [1] and math.isnan(df.predicted_ts[0])
    assert "field 'tensor_buft_overrides, line 1': the row ran tensor_buft_overrides exps=CPU" in \
        df.attrs["disagreements"][1] and "(no -ot, llama-bench's default none)" in df.attrs["disagreements"][1]
    assert df.predicted_ts[1:].equals(result.predicted_ts[1:])


def test_a_main_gpu_the_profile_lacks_is_not_simulated_as_run_refuses_mg(tmp_path, result):
    """split_mode none, main_gpu 3 on a one-GPU profile: llama.cpp ran it on a fourth GPU, which
    the profile lacks; reported as prefetch-sim run reports -mg 3 (the same words), not simulated."""
    from sim.cli.benchflags import check_main_gpu

    run = _mixed_up(tmp_path, {1: ('"split_mode": "layer", "main_gpu": 0', '"split_mode": "none", "main_gpu": 3')})
    df = cmp.compare(run, HW, jobs=1)
    with pytest.raises(ScenarioError) as ei:
        check_main_gpu(3, HW)
    assert math.isnan(df.predicted_ts[0]) and df.regime[0] == "unknown"
    assert f"not simulated: main_gpu 3: {ei.value.reason}" in df.note[0] and "has 1 GPU(s)" in df.note[0]
    assert df.predicted_ts[1:].equals(result.predicted_ts[1:])


def test_rows_of_another_backend_than_the_profiles_are_warned_once(tmp_path, result):
    """ROCm rows against a CUDA profile: one warning, as for another GPU (gpu_info), and each row's
    note says it is simulated as the profile's GPU; the rows of the profile's backend get neither."""
    assert not any("backend" in w for w in cmp.warnings(result))
    run = _mixed_up(tmp_path, {i: ('"backends": "CUDA"', '"backends": "ROCm"') for i in (1, 2, 3)})
    df = cmp.compare(run, HW, jobs=1)
    w = [x for x in cmp.warnings(df) if "backend" in x]
    assert len(w) == 1 and "the rows ran on backend ROCm, the profile 'H200" in w[0] and "is CUDA" in w[0]
    assert all("backend ROCm: simulated as the profile's GPU (CUDA)" in n for n in df.note[:3])
    assert not any("backend" in n for n in df.note[3:])


@pytest.mark.parametrize("field, value, words", [
    ("model_type", "gemma3 27B Q4_K - Medium", "model_type is a gemma3, the model file it is simulated with a qwen3moe"),
    ("model_size", -1, "model_size -1"),
    ("type_k", "q9_9", "type_k 'q9_9': not a KV cache type llama-bench takes"),
    ("split_mode", "diagonal", "split_mode 'diagonal'"),
    ("tensor_split", "abc", "tensor_split 'abc'"),
])
def test_a_row_llama_bench_could_not_have_printed_for_its_model_is_not_simulated(field, value, words):
    """A row whose model_type names another architecture than the model file it is simulated with
    (an invocation naming another model's TOML), or a value llama-bench never prints, is not
    simulated (and so not counted), saying why; a legal value of the same field still is."""
    df = cmp.read_llama_bench(RUN / "llama-bench.jsonl")
    q = cmp.cut_model(load_model(ROOT / "scenarios" / "models" / "qwen3-30b-a3b.toml"), 2)
    case = cmp.row_case(df.loc[2].to_dict() | {field: value}, q, HW)
    assert case.scenario is None and any(n.startswith("not simulated") and words in n for n in case.notes), case.notes
    legal = {"model_type": "qwen3moe 30B.A3B Q4_K - Medium", "model_size": int(q.nbytes), "type_k": "q8_0",
             "split_mode": "row", "tensor_split": "1.00/1.00"}[field]
    assert cmp.row_case(df.loc[2].to_dict() | {field: legal}, q, HW).scenario is not None


def test_routing_check_names_a_malformed_or_impossible_copy_log_line():
    from calibrate.llamacpp.patches import parse_copy_log

    ok = "noise\nprefetch-sim copy-log: n_tokens=32 moe_splits=3 used_experts=100 expert_slots=128\n"
    assert parse_copy_log(ok) == [{"n_tokens": 32, "moe_splits": 3, "used_experts": 100, "expert_slots": 128}]
    for bad, words in [("moe_splits=abc", "line 2: moe_splits='abc' is not an integer"),
                       ("used_experts=999", "used_experts=999 is more than expert_slots=128"),
                       ("moe_splits=-3", "moe_splits=-3 is negative"), ("n_tokens=0", "n_tokens=0 for a graph"),
                       ("junk", "token 'junk' is not key=value")]:
        k = bad.split("=")[0]
        line = " ".join(t if not t.startswith(k + "=") else bad for t in ok.splitlines()[1].split(" "))
        if "=" not in bad:
            line += " " + bad
        with pytest.raises(ValueError, match=re.escape(words)):
            parse_copy_log("noise\n" + line + "\n")


def test_approximations_counts_each_kind_once_per_predicted_row():
    df = pd.DataFrame(dict(
        predicted_ts=[1.0, 2.0, math.nan, 3.0, 4.0],
        note=["no_kv_offload: KV cache on the host is not modelled (simulated on the GPU); "
              "embeddings: not modelled (logits graph simulated)",
              "KV q8_0/q8_0: VRAM counts its size; attention reads are priced as F16",
              "not simulated: no_kv_offload: whatever",            # not predicted: not counted
              "pp+tg: simulated as pp512 then tg128 in one context; variant prefetch (prefetch_weights 1, "
              "prefetch_gate 0, prefetch_expert_slots 0)",         # describes the row
              math.nan]))
    assert cmp.approximations(df) == {"embeddings": 1, "no_kv_offload": 1, "quantised KV": 1}
    assert df.attrs["n_approximated"] == 2
    assert cmp.approximations(df.drop(columns="note")) == {} and cmp.approximations(df.iloc[3:]) == {}


def test_cli_says_approximated_rows(tmp_path, capsys):
    run = _mixed_up(tmp_path, {3: ('"n_threads": 16', '"n_threads": 4')})   # line 3: fully resident
    assert cmp.main([str(run), "-q", "--jobs", "1"]) == 0
    err = capsys.readouterr().err.splitlines()
    said = [ln for ln in err if "rest on an approximation" in ln]
    assert len(said) == 1 and "(--out CSV: a note per row)" in said[0]


def test_rows_of_settings_run_refuses_are_not_scored(tmp_path, capsys):
    """Rows of settings prefetch-sim run refuses as not modelled (embeddings, no_kv_offload) and a
    row of another file type than the model file (Q8_0 against Q4_K - Medium) are not simulated:
    left out of the figures, each said once (they were scored as the modelled setting)."""
    for old, new, said in (('"embeddings": false', '"embeddings": true', "embeddings (embeddings output: no output head, pooled) is not modelled"),
                           ('"no_kv_offload": false', '"no_kv_offload": true', "no_kv_offload"),
                           ("Q4_K - Medium", "Q8_0", "the row's model is Q8_0")):
        d = tmp_path / str(abs(hash(new)))
        d.mkdir()
        run = _mixed_up(d, {1: (old, new)})
        assert cmp.main([str(run), "-q", "--jobs", "1"]) == 0
        err = capsys.readouterr().err
        line = [ln for ln in err.splitlines() if ln.startswith("compare: line 1 ")]
        assert len(line) == 1 and "not simulated" in line[0] and said in line[0], err
        assert "logits graph simulated" not in line[0]


def test_max_steal_leaves_loads_out_of_the_figures_and_keeps_them_in_out(tmp_path, capsys):
    """compare --max-steal: the rows of loads with more steal (or none known) are not in the tables,
    the title says how many are; --out keeps every row, those with a note; a folder without the
    host sampler's record, or a negative share, is one line naming --max-steal."""
    run = ROOT / "data" / "llamacpp" / "h100-20261206-tg11"
    steal = cmp.invocation_steal(run)
    out = tmp_path / "o.csv"
    assert cmp.main([str(run), "--max-steal", "0.1", "--out", str(out), "-q", "--jobs", "1"]) == 0
    cap = capsys.readouterr()
    df = pd.read_csv(out)
    n_ok = sum(steal.get(i, 99) <= 0.1 for i in df.invocation)
    loads_ok = sum(v <= 0.1 for v in steal.values())
    assert len(df) == 37 and df.line.is_monotonic_increasing
    assert f"loads with steal <= 0.1 % only: {n_ok} of 37 rows ({loads_ok} of 27 loads)" in cap.out
    assert f"| all | {n_ok} | {n_ok} |" in cap.out
    gated = df.invocation.map(lambda i: steal.get(i, 99) > 0.1)
    assert df.note[gated].str.contains(r"left out of the figures \(--max-steal 0.1\): steal \d", regex=True).all()
    assert not df.note[~gated].fillna("").str.contains("left out").any()
    tg9 = ROOT / "data" / "llamacpp" / "h100-20261206-tg9"   # a repeat with the host sampler: gated alike
    assert cmp.main([str(run), "--max-steal", "0.1", "--repeat", str(tg9), "-q", "--jobs", "1"]) == 0
    assert "Reproducibility" in capsys.readouterr().out
    tg = ROOT / "data" / "llamacpp" / "h200-20261203-tg"    # one without it: said, not ungated
    assert cmp.main([str(run), "--max-steal", "0.1", "--repeat", str(tg), "-q", "--jobs", "1"]) == 2
    assert f"{tg} has no host_state.jsonl" in capsys.readouterr().err
    for argv, what in (([str(RUN), "--max-steal", "0.1"], "no host_state.jsonl"),
                       ([str(run), "--max-steal", "-1"], "--max-steal")):
        rc = cmp.main(argv + ["-q", "--jobs", "1"]) if "-1" not in argv else None
        if rc is None:
            with pytest.raises(SystemExit):
                cmp.main(argv)
        else:
            assert rc == 2
        err = capsys.readouterr().err
        assert what in err and "Traceback" not in err


def test_a_garbage_host_record_loses_only_the_steal_columns_without_max_steal(tmp_path, capsys):
    """A host_state.jsonl that does not read: without --max-steal the comparison is the one of a
    folder without it, with one warning naming the file and line; with --max-steal an error."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(ROOT / "data" / "llamacpp" / "h100-20261206-tg11", run)
    lines = (run / "host_state.jsonl").read_text().splitlines()
    lines[2] = "garbage{{"
    (run / "host_state.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "o.csv"
    assert cmp.main([str(run), "-q", "--jobs", "1", "--out", str(out)]) == 0
    cap = capsys.readouterr()
    said = [ln for ln in cap.err.splitlines() if "host_state" in ln]
    assert len(said) == 1 and said[0].startswith("compare: warning:") and f"{run / 'host_state.jsonl'}" in said[0]
    assert "'line 3'" in said[0] and "Traceback" not in cap.err
    assert "host_steal_pct" not in pd.read_csv(out).columns and "Steal time" not in cap.out
    assert cmp.main([str(run), "--max-steal", "0.1", "-q", "--jobs", "1"]) == 2
    err = capsys.readouterr().err
    assert "compare: error:" in err and "host_state.jsonl" in err and "'line 3'" in err and "Traceback" not in err
    (run / "host_state.jsonl").unlink()   # the same tables as a folder without the record
    assert cmp.main([str(run), "-q", "--jobs", "1"]) == 0
    assert capsys.readouterr().out == cap.out


def test_a_host_record_whose_counters_fall_or_time_runs_back_is_refused(tmp_path, capsys):
    """/proc/stat's counters only grow and the sampler writes in time order: a record where either
    is not so is one line naming the file and line, not a negative steal that passes --max-steal;
    a record covering no load says so under --max-steal."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(ROOT / "data" / "llamacpp" / "h200-20261203-tg5a", run)
    import gzip
    recs = [json.loads(ln) for ln in gzip.decompress((run / "host_state.jsonl.gz").read_bytes()).decode().splitlines()
            if ln.strip()]
    (run / "host_state.jsonl.gz").unlink()
    stat_lines = [i for i, r in enumerate(recs) if "stat_cpu" in r]
    bad = [dict(r) for r in recs]
    k = stat_lines[5]
    bad[k] = dict(bad[k], stat_cpu=list(bad[k]["stat_cpu"]))
    bad[k]["stat_cpu"][7] = -1                                        # steal counter falls
    (run / "host_state.jsonl").write_text("\n".join(json.dumps(r) for r in bad) + "\n")
    with pytest.raises(ScenarioError, match=f"line {k + 1}"):
        cmp.invocation_steal(run)
    assert cmp.main([str(run), "--max-steal", "0.1", "-q", "--jobs", "1"]) == 2
    err = capsys.readouterr().err
    assert "host_state.jsonl" in err and "fell" in err and "Traceback" not in err
    (run / "host_state.jsonl").write_text("\n".join(json.dumps(r) for r in recs[::-1]) + "\n")   # time runs back
    with pytest.raises(ScenarioError, match="earlier than the one before it"):
        cmp.invocation_steal(run)
    (run / "host_state.jsonl").write_text("\n".join(json.dumps(r) for r in recs[:2]) + "\n")     # covers no load
    assert cmp.invocation_steal(run) == {}
    assert cmp.main([str(run), "--max-steal", "5", "-q", "--jobs", "1"]) == 2
    assert "the steal of no load" in capsys.readouterr().err


def test_a_moe_row_without_n_cpu_moe_says_that_0_was_assumed(tmp_path, result):
    """A llama-bench older than -ncmoe prints no n_cpu_moe: 0 is what it ran (its experts where
    -ngl and -ot put them), and the note says it was assumed; the prediction is the same."""
    run = _mixed_up(tmp_path, {3: ('"n_cpu_moe": 0, ', '')})
    df = cmp.compare(run, HW, jobs=1)
    assert "no n_cpu_moe" in df.note[2] and "0 assumed" in df.note[2]
    assert df.predicted_ts[2] == result.predicted_ts[2] and "n_cpu_moe" not in str(result.note[2])


def test_a_row_without_flash_attn_says_that_auto_was_assumed(tmp_path, result):
    """A row without flash_attn is simulated at llama-bench's default (auto), and its note says so."""
    run = _mixed_up(tmp_path, {3: ('"flash_attn": -1, ', '')})
    df = cmp.compare(run, HW, jobs=1)
    assert "no flash_attn" in df.note[2] and "auto assumed" in df.note[2]
    assert "flash_attn" not in str(result.note[2]) and df.predicted_ts.notna()[2]


@pytest.mark.parametrize("old, new, field", [('"n_cpu_moe": 0', '"n_cpu_moe": -3', "n_cpu_moe"),
                                             ('"n_threads": 16', '"n_threads": -4', "n_threads")])
def test_a_row_llama_bench_would_not_run_is_refused(tmp_path, old, new, field):
    run = _mixed_up(tmp_path, {3: (old, new)})
    with pytest.raises(ScenarioError, match=f"must be >= ") as info:
        read_llama_bench(run / "llama-bench.jsonl")
    assert info.value.field == f"{field}, line 3"


def test_a_row_repeated_with_its_samples_is_refused_as_a_copy(tmp_path):
    """Two runs never time the same nanoseconds: a row pasted twice (or a file appended to
    itself) would count one measurement twice."""
    run = subset(tmp_path, [1, 2, 3, 2])
    with pytest.raises(ScenarioError, match=r"line 4 repeats line 2 with the same samples: a copy") as info:
        read_llama_bench(run / "llama-bench.jsonl")
    assert info.value.field == "samples_ns, line 4"


def test_a_folder_with_llama_bench_json_is_told_the_name_compare_reads(tmp_path, capsys):
    run = subset(tmp_path, list(range(1, 11)))
    (run / "llama-bench.jsonl").rename(run / "llama-bench.json")
    assert cmp.main([str(run), "-q"]) == 2
    err = capsys.readouterr().err
    assert "llama-bench.json is there: name it llama-bench.jsonl" in err and len(err.strip().splitlines()) == 1


def test_a_windows_model_filename_is_matched_by_its_file_name(tmp_path, result):
    """llama-bench on Windows prints ``C:\\models\\x.gguf``: the file name after the last
    backslash names the GGUF, as after the last slash."""
    rows = (RUN / "llama-bench.jsonl").read_text().splitlines()
    name = json.loads(rows[2])["model_filename"].rsplit("/", 1)[1]
    run = _mixed_up(tmp_path, {3: (json.dumps(json.loads(rows[2])["model_filename"]),
                                   json.dumps("C:\\models\\" + name))})
    df = cmp.compare(run, HW, jobs=1)
    assert df.predicted_ts[2] == result.predicted_ts[2]
    assert cmp.gguf_name("C:\\models\\" + name) == name == cmp.gguf_name("/root/models/" + name)


def test_a_row_naming_more_devices_than_the_profile_has_gets_a_note(tmp_path, result):
    run = _mixed_up(tmp_path, {3: ('"devices": "auto"', '"devices": "CUDA0/CUDA1"')})
    df = cmp.compare(run, HW, jobs=1)
    assert "devices CUDA0/CUDA1" in df.note[2] and "more GPUs than the hardware's 1" in df.note[2]
    assert df.predicted_ts[2] == result.predicted_ts[2] and "devices" not in str(result.note[2])


def test_a_quantised_v_cache_without_flash_attention_is_refused_as_llama_cpp_does(tmp_path):
    """llama.cpp refuses a quantised V cache without flash attention (``llama_init_from_model``
    fails), so llama-bench prints no such row: one is refused as edited, naming the field."""
    run = _mixed_up(tmp_path, {3: ('"type_v": "f16"', '"type_v": "q8_0"')})
    row3 = (run / "llama-bench.jsonl").read_text().splitlines()[2]
    (run / "llama-bench.jsonl").write_text((run / "llama-bench.jsonl").read_text().replace(
        row3, row3.replace('"flash_attn": -1', '"flash_attn": 0')))
    with pytest.raises(ScenarioError, match="V cache quantization requires flash_attn") as info:
        read_llama_bench(run / "llama-bench.jsonl")
    assert info.value.field.startswith("type_v")


def test_a_row_with_other_than_its_invocations_repetitions_is_reported(tmp_path, result):
    """llama-bench writes one sample per repetition: a row with 2 samples from an invocation
    that asked for ``-r 5`` is not what it ran (a mixed-up folder), reported and not predicted."""
    row = json.loads((RUN / "llama-bench.jsonl").read_text().splitlines()[2])
    assert len(row["samples_ns"]) == 5
    ns = row["samples_ns"][:2]
    ts = [1e9 * (row["n_prompt"] + row["n_gen"]) / x for x in ns]
    two = dict(row, samples_ns=ns, samples_ts=ts, avg_ns=sum(ns) // 2, stddev_ns=stdev_ns(ns),
               avg_ts=sum(ts) / 2, stddev_ts=abs(ts[0] - ts[1]) / 2 ** 0.5)
    run = _mixed_up(tmp_path, {3: ((RUN / "llama-bench.jsonl").read_text().splitlines()[2], json.dumps(two))})
    df = cmp.compare(run, HW, jobs=1)
    assert df.predicted_ts.isna()[2] and "samples_ns" in df.note[2] and "-r 5" in df.note[2]
    assert df.predicted_ts.drop(index=2).equals(result.predicted_ts.drop(index=2))


def test_compare_warns_that_simulated_rows_are_not_measurements(tmp_path, capsys):
    """prefetch-sim run's own rows (cpu_info 'simulated host ...') fed to compare: a warning says
    the errors compare the simulator with itself; the rows are still compared."""
    from sim.cli import main as sim_main
    from calibrate.llamacpp.compare import main as compare_main

    run = tmp_path / "self"
    run.mkdir()
    assert sim_main(["run", "-r", "1", "-q", "-p", "64", "-n", "0", "--variant", "baseline", "-m",
                     str(ROOT / "scenarios/models/qwen3-30b-a3b.toml"), "-ngl", "99", "-ncmoe", "0", "-lm", "none",
                     "-o", "jsonl", "--out", str(run / "llama-bench.jsonl")]) == 0
    (run / "invocations.jsonl").write_text(json.dumps({"gguf": "qwen3-30b-a3b.toml",
                                                       "model_toml": "scenarios/models/qwen3-30b-a3b.toml"}) + "\n")
    capsys.readouterr()
    assert compare_main([str(run), "-q"]) == 0
    err = capsys.readouterr().err
    assert "1 row of" in err and "is prefetch-sim's own output" in err


def test_a_row_ten_times_off_its_prediction_is_named_in_a_warning(tmp_path, capsys):
    """A row whose times are in microseconds (consistent with themselves, 1000x the t/s) is named
    in one warning that says to check the units; the folder's other rows are not."""
    run = subset(tmp_path, list(range(1, 11)))
    bench = run / "llama-bench.jsonl"
    rows = [json.loads(x) for x in bench.read_text().splitlines()]
    r = rows[2]
    for k in ("avg_ns", "stddev_ns"):
        r[k] = r[k] // 1000
    r["samples_ns"] = [x // 1000 for x in r["samples_ns"]]
    r["samples_ts"] = [r["n_prompt" if r["n_prompt"] else "n_gen"] * 1e9 / x for x in r["samples_ns"]]
    import statistics
    r["avg_ts"] = statistics.mean(r["samples_ts"])
    r["stddev_ts"] = statistics.stdev(r["samples_ts"]) if len(r["samples_ts"]) > 1 else 0.0
    r["avg_ns"] = int(statistics.mean(r["samples_ns"]))
    r["stddev_ns"] = int(statistics.stdev(r["samples_ns"])) if len(r["samples_ns"]) > 1 else 0
    bench.write_text("".join(json.dumps(x) + "\n" for x in rows))
    assert cmp.main([str(run), "-q", "--jobs", "1"]) == 0
    err = capsys.readouterr().err
    warned = [ln for ln in err.splitlines() if "away from the prediction" in ln]
    assert len(warned) == 1 and "1 row(s)" in warned[0] and "(line 3)" in warned[0] and "nanoseconds" in warned[0]


def test_a_field_the_row_lacks_and_the_default_assumed_are_counted_as_approximations():
    """A row without n_cpu_moe, load_mode or flash_attn is predicted with llama-bench's default
    assumed (+223 % and -83 % errors from such rows were said only in the CSV's note column): the
    summary's approximation line counts them."""
    df = pd.DataFrame(dict(
        predicted_ts=[1.0, 2.0, 3.0],
        note=["the row has no n_cpu_moe (a llama-bench older than -ncmoe): 0 assumed, the experts where -ngl "
              "and -ot put them",
              "the row has no load_mode (nor use_mmap) and its invocation no -lm: llama-bench's default auto "
              "assumed (mmap: pageable host weights)",
              "the row has no flash_attn: llama-bench's default auto assumed"]))
    assert cmp.approximations(df) == {"flash_attn missing: auto assumed": 1,
                                      "load_mode missing: auto (mmap) assumed": 1, "n_cpu_moe missing: 0 assumed": 1}


def test_a_folder_of_several_gpus_says_which_rows_ran_on_another():
    """One warning line either way: all rows on another GPU names it; a folder mixing GPUs says how
    many rows ran on each other GPU (it named one GPU as if every row had run there)."""
    df = pd.DataFrame({"x": [1]})
    df.attrs.update(gpu_name="NVIDIA H200", hardware="H200 (llama.cpp kernels)", n_gpu=1,
                    gpu_info=["NVIDIA H100 80GB HBM3"], gpu_rows={"NVIDIA H100 80GB HBM3": 4})
    got = [w for w in cmp.warnings(df) if "GPU" in w]
    assert len(got) == 1 and got[0].startswith("the rows were measured on NVIDIA H100 80GB HBM3")
    df.attrs.update(gpu_info=["NVIDIA H100 80GB HBM3", "NVIDIA H200"],
                    gpu_rows={"NVIDIA H100 80GB HBM3": 1, "NVIDIA H200": 3})
    got = [w for w in cmp.warnings(df) if "another GPU" in w]
    assert len(got) == 1 and got[0].startswith("1 of the 4 rows were measured on another GPU")
    assert "1 on NVIDIA H100 80GB HBM3" in got[0]


def test_a_tg_row_at_a_depth_restored_after_a_multi_token_pp_test_is_noted():
    """llama-bench restores one saved depth state across an invocation's tests; on gpt-oss a tg row
    at a depth after a pp test of >= 2 tokens at that depth (same invocation) is noted
    (h100-20261207-pform), and counted as an approximation. Not after pp1, not at another depth,
    not in another invocation, not on another architecture (h100-20261207-pform2), not before the
    pp test."""
    rows = [dict(n_prompt=512, n_gen=0, n_depth=8192), dict(n_prompt=0, n_gen=128, n_depth=8192),   # a: noted
            dict(n_prompt=1, n_gen=0, n_depth=8192), dict(n_prompt=0, n_gen=128, n_depth=8192),     # b: pp1
            dict(n_prompt=0, n_gen=128, n_depth=4096), dict(n_prompt=64, n_gen=0, n_depth=4096),    # c: tg first
            dict(n_prompt=256, n_gen=0, n_depth=8192), dict(n_prompt=0, n_gen=32, n_depth=8192),    # d: other arch
            dict(n_prompt=0, n_gen=128, n_depth=8192)]                                              # e: other run
    runs = ["a", "a", "b", "b", "c", "c", "d", "d", "e"]
    affected = [True] * 6 + [False, False, True]
    got = cmp.restored_depth_notes(rows, runs, affected)
    assert cmp.RESTORED_DEPTH_ARCHS == ("gpt-oss",)
    assert [n is not None for n in got] == [False, True] + [False] * 7
    assert got[1].startswith("depth 8192 restored after a pp test of 512 tokens")
    df = pd.DataFrame(dict(predicted_ts=[1.0], note=[got[1]]))
    assert cmp.approximations(df) == {"tg at depth restored after a pp test": 1}


def test_run_and_compare_refuse_the_same_settings():
    """One rule (sim.views.llamabench.unmodelled_kind) for prefetch-sim run's refusal and
    compare's unscored rows: each setting hits the same kind through both (the rule was written
    twice), a -sm row on one GPU hits neither."""
    from types import SimpleNamespace

    from sim.cli.benchflags import unmodelled_setting
    from sim.views.llamabench import UNMODELLED, unmodelled_kind

    base = dict(no_kv_offload=False, split_mode="layer", embeddings=False)
    for kind, change in (("no_kv_offload", {"no_kv_offload": True}), ("split_mode", {"split_mode": "row"}),
                         ("embeddings", {"embeddings": True})):
        s = SimpleNamespace(**{**base, **change})
        assert unmodelled_kind(s, 2) == kind
        assert unmodelled_setting(s, SimpleNamespace(n_gpu=2))[0] == UNMODELLED[kind][0]
    assert unmodelled_kind(SimpleNamespace(**{**base, "split_mode": "row"}), 1) is None
    assert unmodelled_setting(SimpleNamespace(**{**base, "split_mode": "tensor"}), SimpleNamespace(n_gpu=1)) is None


def test_rows_of_a_machine_with_more_gpus_than_the_profile_are_warned_about():
    """Rows from a two-GPU machine (gpu_info lists two) against a one-GPU profile: llama-bench split
    the model over both unless told otherwise; this was said only when the profile had more GPUs."""
    df = pd.DataFrame({"x": [1]})
    df.attrs.update(gpu_name="NVIDIA H200", hardware="H200 (llama.cpp kernels)", n_gpu=1,
                    gpu_info=["NVIDIA H200, NVIDIA H200"], gpu_rows={"NVIDIA H200, NVIDIA H200": 3}, over_gpu_rows=3)
    got = [w for w in cmp.warnings(df) if "GPUs (gpu_info)" in w]
    assert len(got) == 1 and got[0].startswith("3 of the rows ran on a machine of 2 GPUs (gpu_info)") and "has 1" in got[0]
    df.attrs.update(over_gpu_rows=0)   # -sm none, or -dev naming one GPU: fine
    assert not [w for w in cmp.warnings(df) if "gpu_info" in w]


def test_a_repeat_that_shares_no_row_is_warned_about(tmp_path, capsys):
    """compare --repeat with a folder of other configurations printed an empty reproducibility
    table and said nothing."""
    a = subset(tmp_path / "a", [1, 2])
    b = subset(tmp_path / "b", [5, 6])
    assert cmp.main([str(a), "-q", "--jobs", "1", "--repeat", str(b)]) == 0
    err = capsys.readouterr().err
    assert len([ln for ln in err.splitlines() if "shares no row" in ln]) == 1


def test_a_row_that_ran_llama_bench_s_fit_is_not_scored(tmp_path, capsys):
    """A row with fit_target (or fit_min_ctx) other than 0 ran llama-bench's fit, whose placement
    the row does not print: it was predicted on the row's -ncmoe (2.7x off for -fitt 1024 on
    the default configuration) with nothing said. Not simulated, said once."""
    run = _mixed_up(tmp_path, {1: ('"fit_target": 0', '"fit_target": 1024')})
    assert cmp.main([str(run), "-q", "--jobs", "1"]) == 0
    err = capsys.readouterr().err
    line = [ln for ln in err.splitlines() if ln.startswith("compare: line 1 ")]
    assert len(line) == 1 and "not simulated: fit_target 1024" in line[0] and "-fitt" in line[0], err


def test_a_row_of_another_thread_count_with_host_weights_is_not_scored(tmp_path, capsys):
    """prefetch-sim run refuses a -t other than the profile's where weights are on the host; compare
    scored such rows (a note only). Now one rule: not simulated there; a fully resident row of
    another thread count is still predicted, with its note."""
    run = _mixed_up(tmp_path, {1: ('"n_threads": 16', '"n_threads": 4'), 3: ('"n_threads": 16', '"n_threads": 4')})
    df = cmp.compare(run, HW, jobs=1)
    host, resident = df[df.line == 1].iloc[0], df[df.line == 3].iloc[0]
    assert math.isnan(host.predicted_ts) and "not simulated: -t 4 with weights on the host" in host.note
    assert resident.regime == "resident" and resident.predicted_ts > 0 and "n_threads 4" in resident.note


def test_a_kv_type_llama_bench_cannot_print_is_refused_and_missing_samples_assume_its_default_r(tmp_path, capsys):
    """Fresh-user round 4: a row with type_k 'q3_k' (llama-bench's -ctk takes f16, bf16, q8_0,
    q4_0, q4_1, q5_0, q5_1, iq4_nl: no row can print another) had been predicted with a note;
    now it is left out naming type_k. A row without samples_ns/samples_ts had been predicted
    with its CUDA-graph capture spread over the routing draws (3) instead of llama-bench's -r, with
    nothing said: now llama-bench's default -r 5 is assumed, noted and counted as an approximation,
    and its prediction is that of the same row with five samples."""
    run = subset(tmp_path, [1])
    bench = run / "llama-bench.jsonl"
    row = json.loads(bench.read_text())
    assert len(row["samples_ns"]) == 5
    out = tmp_path / "a.csv"
    assert cmp.main([str(run), "-q", "--jobs", "1", "--out", str(out)]) == 0
    with_samples = pd.read_csv(out)["predicted_ts"].iloc[0]
    bench.write_text(json.dumps({k: v for k, v in row.items() if k not in ("samples_ns", "samples_ts")}) + "\n")
    capsys.readouterr()
    assert cmp.main([str(run), "-q", "--jobs", "1", "--out", str(out)]) == 0
    got = pd.read_csv(out)
    assert got["predicted_ts"].iloc[0] == pytest.approx(with_samples, rel=1e-12)
    assert "default -r 5 assumed" in got["note"].iloc[0]
    assert "samples missing: -r 5 assumed (1)" in capsys.readouterr().err
    bench.write_text(json.dumps({**row, "type_k": "q3_k"}) + "\n")
    assert cmp.main([str(run), "-q", "--jobs", "1"]) == 2
    err = capsys.readouterr().err
    assert "type_k 'q3_k': not a KV cache type llama-bench takes" in err and err.count("\n") == 1
    # llama-bench prints ggml_type_name, lower case: an upper-case Q8_0 was edited (round 6)
    bench.write_text(json.dumps({**row, "type_k": "Q8_0"}) + "\n")
    assert cmp.main([str(run), "-q", "--jobs", "1"]) == 2
    assert "type_k 'Q8_0': not a KV cache type llama-bench takes" in capsys.readouterr().err


@pytest.mark.parametrize("tool, flag, name", [
    ("compare", "--out", "llama-bench.jsonl"), ("compare", "--summary", "invocations.jsonl"),
    ("ab", "--summary", "meta.json"), ("pool", "--out", "llama-bench.jsonl"), ("ab", "--out", "invocations.jsonl"),
    ("fit", "--out", "llama-bench.jsonl"),
])
def test_an_output_never_replaces_the_measurements_it_reads(tmp_path, capsys, tool, flag, name):
    """An output path that is a run folder's measurement file is refused before any work,
    naming the flag, and the file is left as it was (fresh-user round 7: --out
    RUN/llama-bench.jsonl replaced the rows by CSV); a compare_*.csv beside them is written."""
    import importlib

    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    before = (run / name).read_bytes()
    mod = importlib.import_module(f"calibrate.llamacpp.{tool}")
    args = ([f"--run={run}", "--params", "cpu_split_us"] if tool == "fit" else [str(run), "-q", "--jobs", "1"])
    assert mod.main(args + [flag, str(run / name)]) == 2
    err = capsys.readouterr().err
    assert f"'{flag}'" in err and "measurement file of run folder" in err and "replace it" in err
    assert (run / name).read_bytes() == before


def test_an_output_never_replaces_the_hardware_profile_it_reads(tmp_path, capsys):
    prof = tmp_path / "h.toml"
    shutil.copy(ROOT / "scenarios" / "hardware" / "h200.toml", prof)
    before = prof.read_bytes()
    assert cmp.main([str(RUN), "--hardware", str(prof), "--out", str(prof), "-q"]) == 2
    assert "is an input of this command" in capsys.readouterr().err and prof.read_bytes() == before


def test_a_profile_without_kernel_tables_is_said_to_price_other_kernels(result):
    """compare on a profile without [ggml] (the CuPy H200 profile here) warns first that its t/s
    are not llama.cpp's kernels' (run says so; compare had been silent: fresh-user round 7); a
    profile with the tables gets no such line."""
    w = cmp.warnings(result)
    assert w and "has no llama.cpp kernel tables" in w[0] and "h200-llamacpp" in w[0]
    tabled = result.copy()
    tabled.attrs = dict(result.attrs, kernel_tables=True)
    assert not any("kernel tables" in x for x in cmp.warnings(tabled))


def test_a_run_folder_with_csv_output_only_says_what_to_rerun(tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    (run / "llama-bench.jsonl").rename(run / "llama-bench.csv")
    assert cmp.main([str(run), "-q"]) == 2
    err = capsys.readouterr().err
    assert "llama-bench.csv is there" in err and "-o jsonl" in err


def test_an_invocation_may_name_a_built_in_model_and_paste_the_whole_command(tmp_path, result):
    """invocations.jsonl's model_toml takes a built-in model name, as a scenario's model = does,
    and args may start with the program's own path (a pasted command line); both had been
    refused (fresh-user round 7). The first invocation's rows predict as with the TOML path."""
    invs = [json.loads(x) for x in (RUN / "invocations.jsonl").read_text().splitlines() if x.strip()]
    invs[0] = invs[0] | {"model_toml": "qwen3-30b-a3b", "args": ["./build/bin/llama-bench"] + invs[0]["args"]}
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    (run / "invocations.jsonl").write_text("".join(json.dumps(x) + "\n" for x in invs))
    df = cmp.compare(run, HW, jobs=1)
    assert df.predicted_ts[:2].tolist() == result.predicted_ts[:2].tolist()
    assert cmp._bytes_text(57752) == "57752 bytes" and cmp._bytes_text(3 * 2**20) == "3.00 MiB"
    assert cmp._bytes_text(17.28 * 2**30) == "17.28 GiB"


def test_an_output_never_replaces_a_model_or_grid_toml_nor_a_run_folders_tables(tmp_path, capsys):
    """compare --out over a model TOML, a run folder's kernel table or grid.toml is refused (fresh-user
    round 8: each had been replaced); fit --out over a TOML that is no hardware profile too."""
    from calibrate.llamacpp import fit as F

    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    (run / "kernels-cuda-h100.csv").write_text("backend,op\n")
    (run / "grid.toml").write_text("[grid]\nname = 'x'\n")
    model = tmp_path / "m.toml"
    model.write_text((ROOT / "scenarios" / "models" / "llama3-8b.toml").read_text())
    for target in (model, run / "kernels-cuda-h100.csv", run / "grid.toml"):
        before = target.read_bytes()
        assert cmp.main([str(run), "-q", "--jobs", "1", "--out", str(target)]) == 2
        assert "would replace it" in capsys.readouterr().err and target.read_bytes() == before
    before = model.read_bytes()
    assert F.main(["--run", str(RUN), "--params", "cpu_split_us", "--out", str(model)]) == 2
    assert "no hardware profile" in capsys.readouterr().err and model.read_bytes() == before


@pytest.mark.parametrize("tool, flag, table", [
    ("compare", "--summary", "kernels-cuda.csv"), ("compare", "--out", "kernels-cpu.csv"),
    ("ab", "--out", "kernels-cuda-extra-h100.csv"), ("pool", "--summary", "kernels-cuda.csv"),
    ("vramcheck", "--out", "kernels-cpu.csv"), ("fit", "--out", "kernels-cuda.csv"),
])
def test_an_output_never_replaces_a_kernel_table_of_the_profile(tmp_path, capsys, tool, flag, table):
    """The profile's kernel tables are inputs of every tool that reads the profile (fresh-user
    round 10: compare --summary over kernels-cuda.csv exited 0 and broke every later run)."""
    import importlib

    hw = tmp_path / "hw"
    shutil.copytree(ROOT / "scenarios" / "hardware" / "h200-llamacpp", hw / "h200-llamacpp")
    shutil.copy(ROOT / "scenarios" / "hardware" / "h200-llamacpp.toml", hw / "p.toml")
    target = hw / "h200-llamacpp" / table
    before = target.read_bytes()
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    mod = importlib.import_module(f"calibrate.llamacpp.{tool}")
    if tool == "fit":
        args = [f"--run={run}", "--params", "cpu_split_us", "--profile", str(hw / "p.toml")]
    elif tool == "vramcheck":
        args = [str(run), "--hardware", str(hw / "p.toml")]
    else:
        args = [str(run), "-q", "--jobs", "1", "--hardware", str(hw / "p.toml")]
    rc = mod.main(args + [flag, str(target)])
    err = capsys.readouterr().err
    assert rc != 0 and "kernel table of the hardware profile" in err and "replace it" in err
    assert target.read_bytes() == before
