"""sim.views.report: llama-bench's printers (md, csv, json, jsonl, sql) with its field names and types,
the statistics of its samples, the md layout and labels."""

from __future__ import annotations

import io
import json
import math
import re
import sqlite3

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.views.llamabench import CSV_FIELDS, FIELD_BY_NAME, FIELDS, PATCH_FIELDS, UPSTREAM_FIELDS
from sim.views.report import (
    COLUMNS, FORMATS, JSON_COLUMNS, PROJECT_FIELD_NAMES, bench_row, format_rows, md_columns, params_label,
    sample_stats, size_label, speedup_label, tps_label,
)

GiB = 2**30


def _values(**over) -> dict:
    v = dict(
        build_commit="sim0-baseli", build_number=0, cpu_info="simulated host", gpu_info="NVIDIA H200",
        backends="CUDA", model_filename="m.gguf", model_type="qwen3moe 30B.A3B Q4_K - Medium",
        model_size=18_554_258_718, model_n_params=30_532_122_624, n_batch=2048, n_ubatch=512, n_threads=16,
        cpu_mask="0x0", cpu_strict=False, poll=50, type_k="f16", type_v="f16", n_gpu_layers=99, n_cpu_moe=24,
        split_mode="layer", main_gpu=0, no_kv_offload=False, flash_attn=-1, devices="auto", tensor_split="0.00",
        tensor_buft_overrides="none", load_mode="none", lazy_mode="auto", embeddings=False, no_op_offload=0,
        no_host=False, repack=True, fit_target=0, fit_min_ctx=0, n_prompt=512, n_gen=0, n_depth=0,
        test_time="2026-01-01T00:00:00Z")
    v.update(over)
    return v


def _rows():
    base = bench_row(_values(), [414_000_000, 415_000_000], dict(variant="baseline", engine="analytic",
                                                                 hardware="H200 (measured)",
                                                                 hardware_file="scenarios/hardware/h200.toml"))
    pre = bench_row(_values(build_commit="sim1-prefet", build_number=1), [361_000_000, 362_000_000],
                    dict(variant="prefetch_ungated", engine="analytic", hardware="H200 (measured)",
                         hardware_file="scenarios/hardware/h200.toml", speedup_vs_baseline=1.147, ttft_ms=361.5,
                         h2d_bytes=9_876_543_210, staging_bytes=330_301_440, exposed_transfer_s=0.0123,
                         overlap_fraction=0.875, peak_vram_bytes=20 * GiB))
    return [base, pre]


def test_sample_statistics_are_llama_bench_s():
    """Two rows printed by the CPU llama-bench build of the pinned llama.cpp
    (``-p 16 -n 4 -r 2 -o jsonl`` on a tiny GGUF): the same samples give the same numbers."""
    avg_ns, std_ns, avg_ts, std_ts, ts = sample_stats([12588046, 12004840], 16)
    assert (avg_ns, std_ns) == (12296443, 412388)
    assert f"{avg_ts:f}" == "1301.921461" and f"{std_ts:f}" == "43.662869"
    assert [f"{x:.6g}" for x in ts] == ["1271.05", "1332.8"]
    avg_ns, std_ns, avg_ts, std_ts, ts = sample_stats([6335075, 5942077], 4)
    assert (avg_ns, std_ns) == (6138576, 277891)
    assert f"{avg_ts:f}" == "652.285302" and f"{std_ts:f}" == "29.528766"
    assert [f"{x:.6g}" for x in ts] == ["631.405", "673.165"]
    # identical samples: 0, never the NaN of a variance a rounding error below zero
    assert sample_stats([333333333] * 3, 512)[3] == 0.0


def test_json_is_llama_bench_s_object_then_ours():
    rows = _rows()
    text = format_rows(rows, "json")
    data = json.loads(text)
    assert [list(d) for d in data] == [list(JSON_COLUMNS)] * 2
    assert text.startswith("[\n  {\n    \"build_commit\": \"sim0-baseli\",\n")
    assert text.endswith("\n  }\n]\n")
    assert re.search(r'"avg_ts": \d+\.\d{6},\n', text) and re.search(r'"stddev_ts": \d+\.\d{6},\n', text)
    d = data[0]
    for f in FIELDS:  # llama-bench's JSON types
        want = {"STRING": (str,), "BOOL": (bool,), "INT": (int,), "FLOAT": (float,)}[f.type]
        if f.array and f.type == "FLOAT":
            want = (int, float)  # a C++ stream prints 415000000.0 ns -> 1233.73 t/s, 152093 without a point
        vals = d[f.name] if f.array else [d[f.name]]
        assert all(type(x) in want for x in vals), f.name
    assert d["samples_ns"] == [414_000_000, 415_000_000] and d["avg_ns"] == 414_500_000
    assert d["speedup_vs_baseline"] is None and data[1]["speedup_vs_baseline"] == 1.147
    assert data[1]["h2d_bytes"] == 9_876_543_210 and data[1]["ttft_ms"] == 361.5


def test_jsonl_lines_agree_with_json_and_keep_the_printer_s_spacing():
    rows = _rows()
    lines = format_rows(rows, "jsonl").splitlines()
    assert [json.loads(line) for line in lines] == json.loads(format_rows(rows, "json"))
    assert '"stddev_ts": ' in lines[0] and '],"samples_ts": [ ' in lines[0]
    assert lines[0].startswith('{"build_commit": "sim0-baseli", "build_number": 0, ')


def test_csv_quotes_every_value_and_reads_back():
    rows = _rows()
    text = format_rows(rows, "csv")
    head, first = text.splitlines()[:2]
    assert head == ",".join(COLUMNS) and tuple(COLUMNS[:len(CSV_FIELDS)]) == CSV_FIELDS
    assert first.startswith('"sim0-baseli","0","simulated host",')
    df = pd.read_csv(io.StringIO(text))
    assert list(df.columns) == list(COLUMNS) and len(df) == 2
    assert df.avg_ts[0] == pytest.approx(rows[0].avg_ts, rel=1e-6)
    assert df.cpu_strict[0] == 0 and df.repack[0] == 1  # BOOL as 0/1
    assert math.isnan(df.speedup_vs_baseline[0]) and df.speedup_vs_baseline[1] == pytest.approx(1.147)


def test_sql_is_llama_bench_s_table_plus_ours_linked_by_rowid():
    rows = _rows()
    text = format_rows(rows, "sql")
    assert text.startswith("CREATE TABLE IF NOT EXISTS llama_bench (\n  build_commit TEXT,\n  build_number INTEGER,\n")
    assert "INSERT INTO llama_bench (build_commit, build_number, cpu_info," in text
    con = sqlite3.connect(":memory:")
    con.executescript(text)
    cols = [r[1] for r in con.execute("PRAGMA table_info(llama_bench)")]
    assert cols == list(CSV_FIELDS)
    got = con.execute("SELECT b.build_commit, b.avg_ts, b.n_prompt, s.variant, s.speedup_vs_baseline, s.h2d_bytes "
                      "FROM llama_bench b JOIN prefetch_sim s ON s.llama_bench_rowid = b.rowid "
                      "ORDER BY b.rowid").fetchall()
    assert [g[0] for g in got] == ["sim0-baseli", "sim1-prefet"] and got[0][2] == 512
    assert got[0][1] == pytest.approx(rows[0].avg_ts, rel=1e-6)
    assert got[0][4] is None and got[1][4] == pytest.approx(1.147) and got[1][5] == 9_876_543_210
    # upstream's columns only: the INSERTs name none of the patch's
    up = format_rows(rows, "sql", prefetch_columns=False)
    con2 = sqlite3.connect(":memory:")
    con2.executescript(up)
    upstream = [f for f in CSV_FIELDS if f in UPSTREAM_FIELDS]
    assert [r[1] for r in con2.execute("PRAGMA table_info(llama_bench)")] == upstream
    assert not any(f in up for f in PATCH_FIELDS)
    assert con2.execute("SELECT COUNT(*) FROM prefetch_sim").fetchone() == (len(rows),)
    # a quote inside a value is doubled, so the statement still parses
    q = bench_row(_values(model_type="it's"), [1000], {"variant": "baseline"})
    con.executescript(format_rows([q], "sql"))
    assert con.execute("SELECT model_type FROM llama_bench ORDER BY rowid DESC LIMIT 1").fetchone() == ("it's",)


def test_markdown_layout():
    rows = _rows()
    text = format_rows(rows, "md", n_threads_default=16)
    lines = text.splitlines()
    assert lines[0] == ("| model                          |       size |     params | backend    | ngl |  n_cpu_moe |"
                        "         lm | variant          |            test |                  t/s |    vs base |")
    assert lines[1].startswith("| ------------------------------ | ---------: | ---------: | ---------- | --: |")
    assert "|  17.28 GiB |    30.53 B | CUDA       |  99 |         24 |       none | prefetch_ungated |" in lines[3]
    assert lines[3].endswith("|           pp512 |       1416.32 ± 2.77 |     +14.7% |")
    assert lines[-2] == "" and lines[-1] == ("build: simulated (prefetch-sim 0.1.0, analytic engine, profile "
                                             "'H200 (measured)' scenarios/hardware/h200.toml)")
    # every table line has the '|' at the same places
    table = lines[:-2]
    assert len({tuple(i for i, c in enumerate(x) if c == "|") for x in table}) == 1


def test_markdown_shows_the_fields_llama_bench_shows():
    r = _rows()[0]
    assert md_columns([r], 16) == ["model", "size", "params", "backend", "n_gpu_layers", "n_cpu_moe", "load_mode",
                                   "variant", "test", "t/s", "vs_base"]
    many = [r, bench_row(_values(n_ubatch=256, n_threads=4), [1000], {})]
    assert md_columns(many, 16)[5:9] == ["n_cpu_moe", "n_threads", "n_ubatch", "load_mode"]
    cpu = bench_row(_values(backends="CPU"), [1000], {})
    assert "n_gpu_layers" not in md_columns([cpu], 16) and "n_threads" in md_columns([cpu], 16)


def test_bench_row_checks_fields_and_types():
    with pytest.raises(KeyError, match="n_depth"):
        bench_row({k: v for k, v in _values().items() if k != "n_depth"}, [1], {})
    with pytest.raises(TypeError, match="cpu_strict"):
        bench_row(_values(cpu_strict=0), [1], {})
    with pytest.raises(KeyError, match="nonsense"):
        bench_row(_values(), [1], {"nonsense": 1})
    with pytest.raises(ValueError):
        bench_row(_values(), [0], {})
    assert set(PROJECT_FIELD_NAMES) >= {"variant", "engine", "hardware", "ttft_ms", "h2d_bytes", "peak_vram_bytes",
                                        "staging_bytes", "overlap_fraction", "exposed_transfer_s", "cache_hit_rate"}
    assert bench_row(_values(), [1], {"overlap_fraction": float("nan")}).extra["overlap_fraction"] is None


def test_unknown_format_names_choices():
    with pytest.raises(ValueError, match="md, csv, json, jsonl, sql"):
        format_rows(_rows(), "xml")
    assert FORMATS == ("md", "csv", "json", "jsonl", "sql")


@pytest.mark.parametrize("ratio, label", [
    (1.147, "+14.7%"), (0.952, "-4.8%"), (1.0, "+0.0%"), (0.99996, "+0.0%"),
    (1.63, "+63.0%"), (0.5, "-50.0%"), (None, ""), (float("inf"), "n/a"),
])
def test_speedup_label(ratio, label):
    assert speedup_label(ratio) == label


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=1e-3, max_value=1e3, allow_nan=False))
def test_speedup_label_sign_matches_ratio(ratio):
    label = speedup_label(ratio)
    value = float(label.rstrip("%"))
    assert label[0] in "+-"
    assert value == pytest.approx((ratio - 1) * 100, abs=0.05 + 1e-9)
    if label[0] == "-":
        assert ratio < 1
    elif value > 0:
        assert ratio > 1


def test_labels_follow_llama_bench():
    assert size_label(17.28 * GiB) == "17.28 GiB"
    assert size_label(31_790_336) == "30.32 MiB"  # llama-bench's size of the tiny GGUF
    assert params_label(20_914_757_184) == "20.91 B"
    assert params_label(52_105_984) == "52.11 M"
    assert tps_label(38.3449, 0.051) == "38.34 ± 0.05"
    assert FIELD_BY_NAME["flash_attn"].type == "INT"
