"""calibrate.llamacpp.pool: a configuration's error pooled over run folders and model loads."""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibrate.llamacpp import compare as cmp
from calibrate.llamacpp import pool as P

REPO = Path(__file__).resolve().parent.parent


def _rows(measured, predicted, **cols) -> pd.DataFrame:
    """compare-like rows of one tg configuration (Qwen3 -ncmoe 24, depth 0) unless ``cols`` say."""
    n = len(measured)
    base = {k: [None] * n for k in cmp.CONFIG_KEY}
    base.update(model=["qwen3moe 30B.A3B Q4_K - Medium"] * n, model_toml=["m.toml"] * n, n_layer=[48] * n,
                n_prompt=[0] * n, n_gen=[128] * n, n_depth=[0] * n, n_ubatch=[512] * n, n_batch=[2048] * n,
                ngl=[99] * n, n_cpu_moe=[24] * n, ot=["none"] * n, load_mode=["none"] * n, flash_attn=["1"] * n,
                type_k=["f16"] * n, type_v=["f16"] * n, variant=["baseline"] * n, test=["tg128"] * n)
    base.update(kind=["tg"] * n, regime=["host_expert_decode"] * n, split=["heldout"] * n,
                invocation=[f"i{i}" for i in range(n)])
    for k, v in cols.items():
        base[k] = v if isinstance(v, list) else [v] * n
    df = pd.DataFrame(dict(base, measured_ts=measured, predicted_ts=predicted))
    df["rel_error"] = df.predicted_ts / df.measured_ts - 1
    return df


def test_a_decode_configuration_pools_over_runs_tg_lengths_and_ubatch_sizes():
    """tg32 / tg128 and -ub 512 / 2048 of one placement are one configuration; the pooled error
    is predicted / measured - 1 of the geometric means of the rows' own ratios."""
    a = _rows([60.0, 70.0], [66.0, 66.0], n_gen=[128, 32], test=["tg128", "tg32"])
    b = _rows([80.0, 50.0], [64.0, 64.0], n_ubatch=[2048, 512], n_batch=[2048, 4096])
    got = P.pool([("m1", a), ("m2", b)])
    assert len(got) == 1
    r = got.iloc[0]
    lr = np.log(np.array([60.0 / 66, 70.0 / 66, 80.0 / 64, 50.0 / 64]))
    assert r.rel_error == pytest.approx(math.exp(-lr.mean()) - 1)
    assert r.log_ratio_sd == pytest.approx(lr.std(ddof=1)) and r.log_ratio_sem == pytest.approx(lr.std(ddof=1) / 2)
    assert r.n_rows == 4 and r.n_runs == 2 and r.runs == "m1+m2"
    assert r.min_rel_error == pytest.approx(64 / 80 - 1) and r.max_rel_error == pytest.approx(64 / 50 - 1)
    assert r.config == "qwen3moe -ncmoe 24 tg"


def test_prompt_configurations_keep_their_length_ubatch_and_placement_apart():
    a = _rows([1000.0, 2000.0, 1100.0, 900.0], [1100.0, 2000.0, 1100.0, 900.0], kind="pp", regime="copy_bound_prefill",
              n_gen=0, n_prompt=[512, 512, 2048, 512], n_ubatch=[512, 2048, 512, 512], n_cpu_moe=[24, 24, 24, 12],
              test=["pp512", "pp512", "pp2048", "pp512"])
    b = _rows([1100.0], [1100.0], kind="pp", regime="copy_bound_prefill", n_gen=0, n_prompt=512, test="pp512")
    got = P.pool([("m1", a), ("m2", b)])
    assert list(got.n_rows) == [2, 1, 1, 1]
    assert got.rel_error.iloc[0] == pytest.approx(math.sqrt(1100 / 1000 * 1100 / 1100) - 1)
    assert math.isnan(got.log_ratio_sd.iloc[1]) and math.isnan(got.log_ratio_sem.iloc[1])
    assert got.config.iloc[0] == "qwen3moe -ncmoe 24 pp512 -ub 512" and "-ub 2048" in got.config.iloc[1]
    # another model, another variant, another depth: other configurations
    c = _rows([60.0, 60.0, 60.0], [60.0] * 3, model=["a", "b", "a"], variant=["baseline", "baseline", "slots3"])
    assert len(P.pool([("x", c)])) == 3


def test_rows_without_a_measurement_or_a_prediction_are_left_out():
    a = _rows([60.0, 0.0, 70.0], [66.0, 66.0, float("nan")])
    got = P.pool([("m1", a)])
    assert len(got) == 1 and got.n_rows.iloc[0] == 1 and got.rel_error.iloc[0] == pytest.approx(0.1)
    assert P.pool([("m1", a.iloc[:0])]).empty and list(P.pool([]).columns) == list(P.POOL_COLUMNS)


def test_the_summary_counts_configurations_and_shows_the_spread():
    held = _rows([60.0, 70.0], [66.0, 66.0])
    fit = _rows([40.0, 40.0], [40.0, 44.0], n_cpu_moe=48, split="fit")
    pooled = P.pool([("m", pd.concat([held, fit], ignore_index=True))])
    md = P.pooled_markdown(pooled, "T")
    assert md.startswith("T\n")
    line = next(ln for ln in md.splitlines() if ln.startswith("| held-out |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[1:3] == ["1", "2"]  # one configuration of two rows
    assert cells[6] == f"{abs(math.log(60 / 70)) / math.sqrt(2) * 100:.1f}%"  # sd of two log ratios
    assert "| qwen3moe -ncmoe 48 tg | fit | 2 | 1 |" in md
    only = P.pooled_markdown(pooled, "T", min_rows=3)
    assert "qwen3moe -ncmoe 24 tg" not in only


def test_pool_of_two_committed_runs_end_to_end(tmp_path, capsys):
    out, md, png = tmp_path / "p.csv", tmp_path / "p.md", tmp_path / "p.png"
    runs = [REPO / "data/llamacpp/h200-20261203-tg5a", REPO / "data/llamacpp/h200-20261203-tg5b"]
    assert P.main([*map(str, runs), "--kind", "tg", "-q", "--jobs", "1", "--out", str(out), "--summary", str(md),
                   "--figure", str(png)]) == 0
    got = pd.read_csv(out)
    a = cmp.compare(runs[0], jobs=1)
    b = cmp.compare(runs[1], jobs=1)
    assert got.n_rows.sum() == int(((a.kind == "tg") & a.predicted_ts.notna()).sum()
                                   + ((b.kind == "tg") & b.predicted_ts.notna()).sum())
    assert (got.n_runs == 2).all() and md.read_text() == capsys.readouterr().out and png.stat().st_size > 0


def test_pool_refuses_bad_inputs_in_one_line(tmp_path, capsys):
    run = REPO / "data/llamacpp/h200-20261203-tg5a"
    twin = tmp_path / "twin"
    for argv, words in (([str(run), str(run)], "given twice"),
                        ([str(run), str(tmp_path / "nope")], "nope"),
                        ([str(run), "--min-rows", "0"], "--min-rows"),
                        ([str(run), "--hardware", str(tmp_path / "hw.toml")], "hw.toml")):
        assert P.main(argv + ["-q"]) == 2
        err = capsys.readouterr().err
        assert words in err and err.startswith("pool: error:") and len(err.strip().splitlines()) == 1, err
    # one folder under other spellings (relative with ./ and a trailing /, absolute with .., a link):
    # the same run, refused before any work, naming the second spelling
    link = tmp_path / "link"
    link.symlink_to(run, target_is_directory=True)
    rel = "./" + os.path.relpath(run) + "/"
    for other in (rel, f"{run}/../{run.name}", str(link)):
        assert P.main([str(run), other, "-q"]) == 2
        err = capsys.readouterr().err
        assert f"'{other}' is given twice (also as '{run}')" in err and len(err.strip().splitlines()) == 1, err
    shutil.copytree(run, twin)
    (twin / "llama-bench.jsonl").write_text("")
    assert P.main([str(twin), "-q", "--kind", "pp"]) == 2
    assert "pool: error:" in capsys.readouterr().err


def test_a_min_rows_no_configuration_reaches_is_a_one_line_error(tmp_path, capsys):
    """--min-rows above every configuration's rows: an error as the other empty cases, no empty table."""
    run = REPO / "data/llamacpp/h200-20261203-tg5a"
    out = tmp_path / "p.csv"
    assert P.main([str(run), "-q", "--min-rows", "99", "--out", str(out)]) == 2
    cap = capsys.readouterr()
    assert cap.err.startswith("pool: error:") and len(cap.err.strip().splitlines()) == 1, cap.err
    assert "'--min-rows'" in cap.err and "no configuration has 99 or more rows" in cap.err
    assert cap.out == "" and not out.exists()


def test_the_title_counts_one_run_folder_in_the_singular(capsys):
    run = REPO / "data/llamacpp/h200-20261203-tg5a"
    assert P.main([str(run), "-q", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Pooled over 1 run folder ({run.name}) on profile") and "folders" not in out.splitlines()[0]


def test_pool_says_which_rows_it_leaves_out_and_refuses_a_copy_of_a_folder(tmp_path, capsys):
    """A row compare cannot simulate is named on stderr, folder and line, as compare names it; a
    folder whose llama-bench.jsonl is another's is refused (its rows are not other loads); two
    folders of one name stay two runs."""
    import json

    run = REPO / "data/llamacpp/h200-20261203-tg5b"
    bad = tmp_path / "bad"
    shutil.copytree(run, bad)
    lines = (bad / "llama-bench.jsonl").read_text().splitlines()
    row = json.loads(lines[0])
    row["n_cpu_moe"] = 30
    lines[0] = json.dumps(row)
    (bad / "llama-bench.jsonl").write_text("\n".join(lines) + "\n")
    assert P.main([str(bad), "-q", "--kind", "tg", "--jobs", "1"]) == 0
    err = capsys.readouterr().err
    assert f"pool: {bad}: " in err and "n_cpu_moe, line 1" in err and f"{bad}: 1 of 12 rows not simulated" in err
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    assert P.main([str(run), str(copy), "-q"]) == 2
    assert "holds the same llama-bench.jsonl" in capsys.readouterr().err
    # an edited copy (one test_time changed): its rows still time the same nanoseconds
    lines = (copy / "llama-bench.jsonl").read_text().splitlines()
    row = json.loads(lines[0])
    row["test_time"] = "2026-12-09T00:00:00Z"
    lines[0] = json.dumps(row)
    (copy / "llama-bench.jsonl").write_text("\n".join(lines) + "\n")
    assert P.main([str(run), str(copy), "-q"]) == 2
    err = capsys.readouterr().err
    assert f"'{copy}' shares {len(lines)} row(s) with '{run}'" in err and len(err.strip().splitlines()) == 1
    from calibrate.llamacpp import compare as C
    assert C.main([str(run), "--repeat", str(copy), "-q"]) == 2
    assert "field '--repeat'" in capsys.readouterr().err
    twin = tmp_path / "x" / run.name
    shutil.copytree(REPO / "data/llamacpp/h200-20261203-tg5a", twin)
    out = tmp_path / "p.csv"
    assert P.main([str(run), str(twin), "-q", "--kind", "tg", "--jobs", "1", "--out", str(out)]) == 0
    got = pd.read_csv(out)
    assert got.n_runs.max() == 2 and any(r.endswith("#2") for r in got.runs)
    assert P.main([str(run), "-q", "--out", ""]) == 2 and "empty path" in capsys.readouterr().err


def test_a_configuration_with_a_bar_in_its_flags_keeps_the_table_whole():
    """-ot ffn_(gate|up|down)=CPU: the label's | are escaped, every table line has the header's cells."""
    a = _rows([60.0, 70.0], [66.0, 66.0], ot="ffn_(gate|up|down)=CPU", n_cpu_moe=0)
    md = P.pooled_markdown(P.pool([("m", a)]), "T")
    table = [ln for ln in md.splitlines() if ln.startswith("| qwen3moe")]
    assert len(table) == 1 and "ffn_(gate\\|up\\|down)" in table[0]
    assert table[0].replace("\\|", "").count("|") == md.splitlines()[-2].count("|") == 9


def test_configurations_apart_by_their_thread_count_say_minus_t_in_their_labels():
    """Rows of different n_threads are different configurations (CONFIG_KEY); the label says
    -t N as llama-bench's flag when N is not the default (given, else the most common)."""
    a = _rows([60.0, 61.0, 40.0], [66.0, 66.0, 45.0], n_threads=[16, 16, 8])
    got = P.pool([("m1", a)], default_threads=16)
    assert list(got.config) == ["qwen3moe -ncmoe 24 tg", "qwen3moe -ncmoe 24 -t 8 tg"]
    assert list(P.pool([("m1", a)]).config) == list(got.config)  # default: the most common, 16
    assert list(P.pool([("m1", a)], default_threads=8).config) == ["qwen3moe -ncmoe 24 -t 16 tg",
                                                                   "qwen3moe -ncmoe 24 tg"]
    assert P.config_label(a.iloc[2]) == "qwen3moe -ncmoe 24 tg" and P.config_label(a.iloc[2], 16).endswith("-t 8 tg")
