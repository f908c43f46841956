"""calibrate.llamacpp.ab: prefetch rows paired with their baseline rows, measured against
predicted gain.

Run folders are built in tmp from the rows of tests/data/llamacpp/h200-test (the compare tests'
hand-written llama-bench rows; invented t/s), with the prefetch patch's fields added: the tiny
MoE with every expert on the host (-ot exps=CPU, pp64 @ d128, -ub 64), cheap to simulate. The
arithmetic is checked on hand-computed numbers; predictions only against compare's own, so
nothing depends on host speed.
"""

from __future__ import annotations

import io
import itertools
import json
import math
import tarfile
from pathlib import Path

import pandas as pd
import pytest

from calibrate.llamacpp import ab as AB
from calibrate.llamacpp import compare as cmp
from sim.errors import ScenarioError
from sim.views.llamabench import read_llama_bench
from sim.views.report import sample_stats
from sim.model.specs import load_hardware

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "tests" / "data" / "llamacpp" / "h200-test"
LINES = (RUN / "llama-bench.jsonl").read_text().splitlines()
TINY = json.loads(LINES[8])  # tiny-moe, -ot exps=CPU -lm none -ub 64 -b 64, pp64 @ d128
HW = load_hardware(ROOT / "scenarios" / "hardware" / "h200.toml")
TINY_INV = {"model_toml": "scenarios/tiny/tiny-moe.toml", "gguf": "tiny-moe.gguf"}


def samples_of(ts: float, sd: float | None = None) -> list[int]:
    """Five whole-nanosecond samples of a 64-token test whose t/s are ``ts + c * (-2, -1, 0, 1, 2)``,
    ``c`` giving a standard deviation of ``sd`` (default 1 % of ``ts``)."""
    c = (ts / 100 if sd is None else sd) / math.sqrt(2.5)
    return [round(64e9 / (ts + c * k)) for k in (-2, -1, 0, 1, 2)]


def ts_of(ts: float, sd: float | None = None) -> float:
    """The avg_ts :func:`row` writes for ``ts`` and ``sd``: derived from its whole-nanosecond samples
    as llama-bench does."""
    return sample_stats(samples_of(ts, sd), 64)[2]


#: the measured gain of ``row(pw=1, pwg=0, ts=60000.0)`` over ``row()`` (ts 50000): 20 % to 2e-6 pts
GAIN = 100 * (ts_of(60000.0) / ts_of(50000.0) - 1)


_ROW_TIMES = itertools.count()


def row(pw: int | None = None, pwg: int | None = None, pes: int | None = None, ts: float = 50000.0,
        sd: float | None = None, **over) -> dict:
    """The tiny row with the patch's fields and t/s: all three left out (as upstream prints it)
    when none is given, else the given ones and the patch's defaults for the others (as the
    patched llama-bench prints every one). Each row has a test_time of its own, as real rows
    do (the reader refuses a row that repeats another with its samples: a copy)."""
    r = {k: v for k, v in TINY.items() if not k.startswith("samples")}
    n = next(_ROW_TIMES)
    r["test_time"] = f"2026-12-02T{n // 3600 % 24:02d}:{n // 60 % 60:02d}:{n % 60:02d}Z"
    if (pw, pwg, pes) != (None, None, None):
        r.update(prefetch_weights=0 if pw is None else pw, prefetch_gate=512 if pwg is None else pwg,
                 prefetch_expert_slots=0 if pes is None else pes)
    ns = samples_of(ts, sd)  # t/s and the averages derived from whole-ns samples as llama-bench does
    avg_ns, sd_ns, avg_ts, sd_ts, exact = sample_stats(ns, 64)
    r.update(avg_ns=avg_ns, stddev_ns=sd_ns, avg_ts=avg_ts, stddev_ts=sd_ts, samples_ns=ns,
             samples_ts=[float(f"{x:g}") for x in exact])
    r.update(over)
    return r


def make_run(tmp_path: Path, invocations: list[tuple[dict, list[dict]]], *, logs: dict[str, str] | None = None,
             tar: bool = False, identity: list | None = None) -> Path:
    """A run folder: per invocation its record and rows (``rows`` counted, so rows are attributed
    by order), optional logs (plain ``logs/`` or ``logs.tar.gz``) and ``identity.jsonl``."""
    run = tmp_path / "run"
    run.mkdir(parents=True)
    bench, invs = [], []
    for inv, rows in invocations:
        invs.append({**TINY_INV, **inv, "rows": len(rows), "log": f"logs/{inv['id']}.log", "rc": 0})
        bench += rows
    (run / "llama-bench.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bench))
    (run / "invocations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in invs))
    if logs:
        if tar:
            with tarfile.open(run / "logs.tar.gz", "w:gz") as tf:
                for name, text in logs.items():
                    data = text.encode()
                    info = tarfile.TarInfo(f"logs/{name}.log")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
        else:
            (run / "logs").mkdir()
            for name, text in logs.items():
                (run / "logs" / f"{name}.log").write_text(text)
    if identity is not None:
        (run / "identity.jsonl").write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n"
                                                    for x in identity))
    return run


def vram_line(pw: int, pwg: int, pes: int, used: float, staging: float, ub: int = 64) -> str:
    return (f"prefetch-sim vram: model=/root/models/tiny-moe.gguf test=64/0/128 ub={ub} pw={pw} pwg={pwg} pes={pes} "
            f"used_mib={used} staging_mib={staging}\n")


# -- arithmetic ------------------------------------------------------------------------------


def test_gain_and_its_propagated_uncertainty():
    assert AB.gain_pct(110.0, 100.0) == pytest.approx(10.0)
    assert AB.gain_pct(90.0, 100.0) == pytest.approx(-10.0)
    assert math.isnan(AB.gain_pct(110.0, 0.0)) and math.isnan(AB.gain_pct(math.nan, 100.0))
    # sd 2 over 4 samples: standard error 1 on each side; 100 * 1.1 * sqrt((1/110)^2 + (1/100)^2)
    assert AB.gain_sigma_pts(110, 2, 100, 2, 4, 4) == pytest.approx(1.486607, abs=1e-6)
    assert AB.gain_sigma_pts(110, 2, 100, 2, 4, 4, uncertainty="sd") == pytest.approx(2.973214, abs=1e-6)
    assert AB.gain_sigma_pts(110, math.nan, 100, 0.0) == 0.0  # no spread reported: no uncertainty
    with pytest.raises(ValueError, match="sem"):
        AB.gain_sigma_pts(110, 2, 100, 2, uncertainty="range")


@pytest.mark.parametrize("measured, sigma, predicted, agree, effect", [
    (10.0, 1.5, 5.0, True, "gain"),       # significant gain (band 3), predicted gain
    (10.0, 1.5, -1.0, False, "gain"),     # ... predicted loss
    (10.0, 1.5, 0.0, False, "gain"),      # ... predicted no change: not the same sign
    (-4.0, 1.0, -0.2, True, "loss"),      # significant loss, predicted (small) loss
    (1.0, 1.0, 1.9, True, "none"),        # |1| < band 2: no effect; predicted inside the band
    (1.0, 1.0, 2.5, False, "none"),       # ... predicted outside it
    (1.0, 1.0, -1.5, True, "none"),
    (0.4, 0.01, 0.3, True, "none"),       # tight measurement: the 0.5-point floor is the band
    (0.4, 0.01, 0.6, False, "none"),
    (2.0, 1.0, 0.1, True, "gain"),        # |2| >= band 2: significant (boundary included); a sign is a sign
    (2.0, 1.0, -0.1, False, "gain"),
])
def test_sign_agreement_rule(measured, sigma, predicted, agree, effect):
    assert AB.sign_agrees(measured, sigma, predicted) is agree
    assert AB.measured_effect(measured, sigma) == effect


def test_sign_agreement_without_both_gains_is_unknown():
    assert AB.sign_agrees(math.nan, 1.0, 2.0) is None and AB.sign_agrees(2.0, 1.0, math.nan) is None
    assert AB.effect_band(math.nan) == AB.MIN_EFFECT_PTS and AB.effect_band(3.0, 0.5) == 6.0
    assert AB.measured_effect(math.nan, 1.0) is None


# -- pairing ---------------------------------------------------------------------------------


def test_pairs_prefer_the_same_invocation_then_the_same_gate_then_the_nearest_line(tmp_path):
    rows_a = [row(), row(pw=1, pwg=0), row(pw=0, pwg=0), row(pes=2)]
    rows_b = [row(pw=0, pwg=0, pes=0), row(pw=1, pwg=512), row(pw=1, pwg=0, n_ubatch=32), row(pw=1, pwg=0)]
    run = make_run(tmp_path, [({"id": "a"}, rows_a), ({"id": "b"}, rows_b)])
    bench = read_llama_bench(run / "llama-bench.jsonl")
    owners = cmp._attribute(bench, cmp.read_invocations(run / "invocations.jsonl"))
    pairs = dict(AB.pair_rows(bench, owners))
    # line 2 (-pw 1 -pwg 0, invocation a): the baseline printing pwg 0 in a (line 3), not line 1
    # (pwg 512, an upstream row without the fields) nor line 5 (pwg 0, invocation b)
    assert pairs[2] == 3
    # line 4 (-pes 2, pwg 512 by default): line 1 prints the same (absent = 512)
    assert pairs[4] == 1
    # line 6 (-pw 1 -pwg 512, invocation b): b's only baseline, line 5
    assert pairs[6] == 5
    # line 7: -ub 32, no baseline of that configuration anywhere
    assert pairs[7] is None
    # line 8: b's baseline (line 5) over a's nearer pwg-0 row
    assert pairs[8] == 5
    assert list(pairs) == [2, 4, 6, 7, 8]  # prefetch rows in file order; baselines are not listed
    assert AB.is_prefetch_row(row(pes=3)) and not AB.is_prefetch_row(row(pwg=0)) and not AB.is_prefetch_row(row())


def test_config_key_ignores_timings_build_and_prefetch_flags():
    a = row(ts=100.0, build_commit="x", test_time="t1", model_filename="/a/tiny-moe.gguf")
    b = row(pw=1, pwg=0, ts=200.0, build_commit="y", test_time="t2", model_filename="/b/tiny-moe.gguf")
    assert AB.config_key(a) == AB.config_key(b)
    assert AB.config_key(a) != AB.config_key(row(n_depth=0)) != AB.config_key(row(flash_attn=1))
    assert "prefetch_gate" not in AB.CONFIG_FIELDS and "n_ubatch" in AB.CONFIG_FIELDS


# -- the A/B of a run folder ----------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_ab(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ab")
    rows = [row(ts=50000.0, sd=500.0), row(pw=1, pwg=0, ts=60000.0, sd=600.0), row(pes=2, ts=50100.0, sd=500.0),
            row(pw=1, pwg=0, pes=2, ts=61000.0, sd=600.0), row(pw=1, pwg=0, ts=55000.0, n_ubatch=32, n_batch=32)]
    log = "llama-bench noise\n" + vram_line(0, 512, 0, 1000.0, 0.0) + vram_line(1, 0, 0, 1010.5, 10.25) + \
        vram_line(0, 512, 2, 1003.0, 3.0)
    ident = [{"model": "tiny-moe", "config": "-ot exps=CPU", "variant": "prefetch", "tokens": 512, "hash_off": "aa",
              "hash_on": "aa", "identical": True, "first_diff_step": None},
             {"model": "tiny-moe", "config": "-ot exps=CPU", "variant": "slots2", "tokens": 512, "hash_off": "aa",
              "hash_on": "bb", "identical": False, "first_diff_step": 17}]
    run = make_run(tmp, [({"id": "tiny-ab"}, rows)], logs={"tiny-ab": log}, identity=ident)
    return run, AB.ab(run, HW, jobs=1), cmp.compare(run, HW, jobs=1).set_index("line")


def test_one_row_per_prefetch_row_with_gains_from_compare_s_predictions(tiny_ab):
    run, df, full = tiny_ab
    assert list(df.columns) == list(AB.COLUMNS) and list(df.line) == [2, 3, 4, 5]
    assert df.baseline_line.tolist()[:3] == [1, 1, 1] and pd.isna(df.baseline_line.iloc[3])
    assert df.variant.isna().tolist() == [False, False, True, False]  # None: no variant the simulator models
    assert df.variant[[0, 1, 3]].tolist() == ["prefetch_ungated", "slots2", "prefetch_ungated"]
    assert list(df.prefetch_flags) == ["-pw 1 -pwg 0 -pes 0", "-pw 0 -pwg 512 -pes 2", "-pw 1 -pwg 0 -pes 2",
                              "-pw 1 -pwg 0 -pes 0"]
    r = df.iloc[0]
    assert r.measured_gain_pct == pytest.approx(GAIN) and GAIN == pytest.approx(20.0, abs=1e-4)
    # standard error of 5 samples: 100 * on/off * sqrt((sd_on/sqrt5/on)^2 + (sd_off/sqrt5/off)^2), ~ 0.76 pts
    on, off = row(pw=1, pwg=0, ts=60000.0, sd=600.0), row(ts=50000.0, sd=500.0)
    assert r.measured_gain_sigma_pts == pytest.approx(100 * on["avg_ts"] / off["avg_ts"] * math.hypot(
        on["stddev_ts"] / on["avg_ts"], off["stddev_ts"] / off["avg_ts"]) / math.sqrt(5))
    assert r.measured_gain_sigma_pts == pytest.approx(120 * math.hypot(0.01, 0.01) / math.sqrt(5), rel=1e-3)
    assert r.measured_effect == "gain"
    # the predictions are compare's, each row with its own variant
    assert r.predicted_prefetch_ts == full.loc[2, "predicted_ts"]
    assert r.predicted_baseline_ts == full.loc[1, "predicted_ts"]
    assert full.loc[2, "variant"] == "prefetch_ungated" and full.loc[1, "variant"] == "baseline"
    assert r.predicted_gain_pct == pytest.approx(100 * (full.loc[2, "predicted_ts"] / full.loc[1, "predicted_ts"] - 1))
    assert r.gain_error_pts == pytest.approx(r.predicted_gain_pct - GAIN)
    assert r.prefetch_ts_error_pct == pytest.approx(100 * (full.loc[2, "predicted_ts"] / ts_of(60000.0) - 1))
    assert bool(r.sign_agree) == AB.sign_agrees(GAIN, r.measured_gain_sigma_pts, r.predicted_gain_pct)
    # slots2: +0.2 % measured, inside the band
    assert df.iloc[1].measured_effect == "none"
    # -pw 1 -pes 2: measured, not simulated (and noted)
    n = df.iloc[2]
    assert n.measured_gain_pct == pytest.approx(100 * (ts_of(61000.0, 600.0) / ts_of(50000.0) - 1))  # 22 %
    assert math.isnan(n.predicted_gain_pct) and pd.isna(n.sign_agree)
    assert "not simulated" in n.note and "which the simulator does not model" in n.note
    # no baseline at -ub 32
    u = df.iloc[3]
    assert math.isnan(u.measured_gain_pct) and "no baseline row" in u.note and not math.isnan(u.predicted_prefetch_ts)


def test_vram_lines_are_matched_to_rows(tiny_ab):
    _, df, full = tiny_ab
    r = df.iloc[0]
    assert (r.vram_off_mib, r.vram_on_mib, r.staging_on_mib) == (1000.0, 1010.5, 10.25)
    assert r.vram_delta_mib == pytest.approx(10.5)
    assert df.iloc[1].vram_on_mib == 1003.0 and df.iloc[1].staging_on_mib == 3.0
    assert math.isnan(df.iloc[2].vram_on_mib)  # no line for -pw 1 -pes 2: NaN
    # the simulator's staging and VRAM change beside them (GPU 0)
    assert r.predicted_staging_mib == full.loc[2, "predicted_staging_mib"] > 0
    assert r.predicted_vram_delta_mib == pytest.approx(full.loc[2, "predicted_vram_mib"]
                                                       - full.loc[1, "predicted_vram_mib"])


def test_summary_and_identity_report(tiny_ab):
    _, df, _ = tiny_ab
    s = AB.summarize(df).set_index("group")
    assert s.loc["all", "n_pairs"] == 4 and s.loc["all", "n_predicted"] == 2
    assert s.loc["variant: not simulated (-pw 1 -pwg 0 -pes 2)", "n_predicted"] == 0
    assert {"variant: prefetch_ungated", "variant: slots2", "kind: pp"} <= set(s.index)
    both = df.iloc[:2]
    assert s.loc["all", "n_sign_agree"] == int(both.sign_agree.sum())
    assert s.loc["all", "median_abs_gain_error_pts"] == pytest.approx(both.gain_error_pts.abs().median())
    assert s.loc["all", "median_abs_prefetch_ts_error_pct"] == pytest.approx(
        df.prefetch_ts_error_pct.dropna().abs().median())
    md = AB.summary_markdown(df, title="T")
    assert md.startswith("T\n\n**Output identity FAILED: 1 of 2 checks differ** (1 of 2 identical):")
    assert "variant slots2, 512 tokens: first differing step 17" in md
    assert "| all | 4 | 2 |" in md and "1 prefetch row(s) without a baseline row, 1 not simulated" in md
    ident = df.attrs["identity"]
    assert list(ident.ok) == [True, False] and list(ident.line) == [1, 2]


def test_identity_file(tmp_path):
    p = tmp_path / "identity.jsonl"
    assert AB.read_identity(p) is None
    assert "no identity.jsonl" in AB.identity_markdown(None)
    p.write_text(json.dumps({"model": "m", "hash_off": "a", "hash_on": "a"}) + "\n\n"
                 + json.dumps({"model": "m", "identical": True, "hash_off": "a", "hash_on": "b"}) + "\n")
    d = AB.read_identity(p)
    assert list(d.identical) == [True, True] and list(d.ok) == [True, False] and list(d.inconsistent) == [False, True]
    assert "identical but the hashes differ" in AB.identity_markdown(d)
    p.write_text(json.dumps({"model": "m", "identical": True}) + "\n")
    assert AB.identity_markdown(AB.read_identity(p)).startswith("Output identity: 1 of 1 checks identical")
    for text, msg in [("{nope\n", "line 1"), ("[1]\n", "expected a JSON object"),
                      (json.dumps({"identical": "yes"}) + "\n", "identical, line 1"),
                      (json.dumps({"hash_off": "a"}) + "\n", "needs 'identical'")]:
        p.write_text(text)
        with pytest.raises(ScenarioError, match=msg):
            AB.read_identity(p)


def test_vram_lines_from_logs_tar_and_their_errors(tmp_path):
    rows = [row(), row(pw=1, pwg=0), row(), row(pw=1, pwg=0)]  # the same key twice: lines in order
    log = vram_line(0, 512, 0, 1.0, 0.0) + vram_line(1, 0, 0, 2.0, 0.5) + vram_line(0, 512, 0, 3.0, 0.0) + \
        vram_line(1, 0, 0, 4.0, 0.5)
    run = make_run(tmp_path / "a", [({"id": "x"}, rows)], logs={"x": log}, tar=True)
    bench = read_llama_bench(run / "llama-bench.jsonl")
    owners = cmp._attribute(bench, cmp.read_invocations(run / "invocations.jsonl"))
    assert AB.vram_by_line(run, bench, owners) == {1: (1.0, 0.0), 2: (2.0, 0.5), 3: (3.0, 0.0), 4: (4.0, 0.5)}
    recs = AB.parse_vram_lines(log)
    assert recs[1] == dict(model="/root/models/tiny-moe.gguf", n_prompt=64, n_gen=0, n_depth=128, n_ubatch=64, pw=1,
                           pwg=0, pes=0, used_mib=2.0, staging_mib=0.5)
    with pytest.raises(ValueError, match="x.log:2: malformed vram line"):
        AB.parse_vram_lines("ok\nprefetch-sim vram: model=m test=64/0 ub=64\n", "x.log")
    bad = make_run(tmp_path / "b", [({"id": "x"}, rows)], logs={"x": "prefetch-sim vram: used_mib=1\n"})
    with pytest.raises(ScenarioError, match="malformed vram line"):
        AB.vram_by_line(bad, bench, owners)
    none = make_run(tmp_path / "c", [({"id": "x"}, rows)])  # no logs at all: nothing, no error
    assert AB.vram_by_line(none, bench, owners) == {}


# -- CLI ---------------------------------------------------------------------------------------


def test_cli_writes_csv_summary_and_figure(tmp_path, capsys):
    run = make_run(tmp_path, [({"id": "t"}, [row(), row(pw=1, pwg=0, ts=60000.0)])],
                   identity=[{"model": "m", "identical": False, "first_diff_step": 3}])
    out, md, fig = tmp_path / "o" / "ab.csv", tmp_path / "o" / "ab.md", tmp_path / "o" / "ab.png"
    rc = AB.main([str(run), "--hardware", str(ROOT / "scenarios/hardware/h200.toml"), "--out", str(out),
                  "--summary", str(md), "--figure", str(fig), "-q", "--jobs", "1"])
    cap = capsys.readouterr()
    assert rc == 0 and "| all | 1 | 1 |" in cap.out and "1 of 1 output-identity checks FAILED" in cap.err
    df = pd.read_csv(out)
    assert list(df.columns) == list(AB.COLUMNS) and len(df) == 1 and df.measured_gain_pct[0] == pytest.approx(GAIN)
    assert md.read_text() == cap.out and fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_partial_set_of_the_patch_fields_is_refused(tmp_path):
    r = row(pw=1, pwg=0)
    del r["prefetch_expert_slots"]
    run = make_run(tmp_path, [({"id": "a"}, [row(pw=0, pwg=0), r])])
    with pytest.raises(ScenarioError) as ei:
        AB.ab(run, HW, repetitions=1, jobs=1)
    assert ei.value.field == "prefetch_expert_slots, line 2"


def test_a_fifo_or_a_broken_log_archive_is_one_line(tmp_path, capsys):
    import os

    run = make_run(tmp_path, [({"id": "a"}, [row(pw=0, pwg=0), row(pw=1, pwg=0)])])
    (run / "logs.tar.gz").write_bytes(b"junk")
    assert AB.main([str(run), "-q", "--jobs", "1", "--repetitions", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "logs.tar.gz" in err and "cannot read the packed logs" in err
    (run / "logs.tar.gz").unlink()
    (run / "llama-bench.jsonl").unlink()
    os.mkfifo(run / "llama-bench.jsonl")
    assert AB.main([str(run), "-q"]) == 2
    assert "not a regular file" in capsys.readouterr().err
    assert AB.main([str(tmp_path / "run"), "-q", "--repetitions", "5000"]) == 2
    assert "--repetitions" in capsys.readouterr().err


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert AB.main([str(tmp_path / "missing"), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run folder not found" in err
    # a folder of upstream rows only: no prefetch row
    run = make_run(tmp_path / "a", [({"id": "t"}, [row(), row(n_depth=0)])])
    assert AB.main([str(run), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no prefetch row" in err and "llama-bench.jsonl" in err
    (run / "invocations.jsonl").unlink()
    assert AB.main([str(run), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invocations.jsonl" in err and "file not found" in err
    run = make_run(tmp_path / "b", [({"id": "t"}, [row(), row(pw=1, pwg=0)])], identity=["{broken"])
    assert AB.main([str(run), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "identity.jsonl" in err and "line 1" in err
    for flag in (["--repetitions", "0"], ["--min-effect", "-1"], ["--jobs", "0"]):
        assert AB.main([str(run), "-q", *flag]) == 2
        assert flag[0] in capsys.readouterr().err


def test_damaged_folders_are_refused_not_paired_wrongly(tmp_path):
    """Rows removed (the invocations' counts no longer add up), no baseline at all, an impossible
    VRAM figure, a contradictory identity check: each one ScenarioError naming the field."""
    base = [({"id": "a"}, [row(pw=0, pwg=0), row(pw=1, pwg=0)])]
    run = make_run(tmp_path / "1", base)
    lines = (run / "llama-bench.jsonl").read_text().splitlines()
    (run / "llama-bench.jsonl").write_text(lines[1] + "\n")
    with pytest.raises(ScenarioError) as ei:
        AB.ab(run, HW, repetitions=1, jobs=1)
    assert ei.value.field == "rows" and "add up to 2" in str(ei.value)
    run = make_run(tmp_path / "2", [({"id": "a"}, [row(pw=1, pwg=0)])])
    with pytest.raises(ScenarioError, match="no prefetch row has a baseline"):
        AB.ab(run, HW, repetitions=1, jobs=1)
    with pytest.raises(ValueError, match="used_mib must be a finite number"):
        AB.parse_vram_lines("prefetch-sim vram: model=m test=64/0/0 ub=64 pw=1 pwg=0 pes=0 used_mib=-5 staging_mib=1\n")
    run = make_run(tmp_path / "3", base, identity=[{"model": "m", "variant": "-pw 1", "identical": True,
                                                    "first_diff_step": 3, "tokens": 500}])
    with pytest.raises(ScenarioError) as ei:
        AB.read_identity(run / "identity.jsonl")
    assert ei.value.field == "first_diff_step, line 1"


def test_summary_groups_by_model_kind_and_test_kind_together():
    """With MoE and dense pairs of prefill and decode, the summary has a group per model kind
    and test kind (the README's table), each counting only its own pairs."""
    df = pd.DataFrame(dict(
        variant=["prefetch_ungated"] * 4, prefetch_flags=["-pw 1 -pwg 0"] * 4,
        kind=["pp", "tg", "pp", "tg"], model_kind=["moe", "moe", "dense", "dense"],
        measured_gain_pct=[20.0, 1.0, 10.0, -2.0], predicted_gain_pct=[22.0, 0.0, 13.0, 0.0],
        sign_agree=[True, True, True, False], gain_error_pts=[2.0, -1.0, 3.0, 2.0],
        prefetch_ts_error_pct=[1.0, 2.0, 3.0, 4.0]))
    s = AB.summarize(df).set_index("group")
    for name, pts, agree in (("model: MoE pp", 2.0, 1), ("model: MoE tg", 1.0, 1), ("model: dense pp", 3.0, 1),
                             ("model: dense tg", 2.0, 0)):
        assert s.loc[name, "n_pairs"] == 1 and s.loc[name, "median_abs_gain_error_pts"] == pts, name
        assert s.loc[name, "n_sign_agree"] == agree, name
    assert s.loc["model: MoE", "n_pairs"] == 2 and s.loc["kind: tg", "n_sign_agree"] == 1
