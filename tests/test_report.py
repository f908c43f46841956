"""sim.report: llama-bench markdown layout, machine-readable formats, speedup labels."""

from __future__ import annotations

import io
import json
from dataclasses import replace

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.report import (
    COLUMNS, FORMATS, BenchRow, format_rows, params_label, size_label, speedup_label, tps_label,
    with_speedups,
)

GiB = 2**30


def _rows() -> list[BenchRow]:
    common = dict(model="qwen3moe 30B.A3B Q4_K - Medium", size_bytes=18_554_258_718,
                  n_params=30_532_122_624, backend="CUDA", ngl=99, n_ubatch=512, n_batch=2048,
                  n_cpu_moe=24, test="pp512")
    base = BenchRow(variant="baseline", tps_mean=1234.5612, tps_std=7.891, **common)
    pre = BenchRow(variant="prefetch_ungated", tps_mean=1416.0, tps_std=3.2, ttft_s=0.3616,
                   h2d_bytes=9_876_543_210, staging_bytes=330_301_440, exposed_transfer_s=0.0123,
                   overlap_fraction=0.875, peak_vram_bytes=20 * GiB, engine="des", **common)
    return with_speedups([base, replace(pre, engine=None)])


EXPECTED_MD = """\
| model                          |       size |     params | backend    | ngl |   n_ubatch |  n_cpu_moe | variant          |            test |                  t/s |    vs base |
| ------------------------------ | ---------: | ---------: | ---------- | --: | ---------: | ---------: | ---------------- | --------------: | -------------------: | ---------: |
| qwen3moe 30B.A3B Q4_K - Medium |  17.28 GiB |    30.53 B | CUDA       |  99 |        512 |         24 | baseline         |           pp512 |       1234.56 ± 7.89 |            |
| qwen3moe 30B.A3B Q4_K - Medium |  17.28 GiB |    30.53 B | CUDA       |  99 |        512 |         24 | prefetch_ungated |           pp512 |       1416.00 ± 3.20 |     +14.7% |
"""


def test_markdown_exact():
    assert format_rows(_rows(), "md") == EXPECTED_MD


def test_markdown_default_format_is_md():
    assert format_rows(_rows()) == EXPECTED_MD


def test_markdown_columns_widen_for_long_values():
    r = replace(_rows()[0], model="m" * 40, test="pp512 @ d1234567890")
    lines = format_rows([r], "md").splitlines()
    # every line has the same length and the same '|' positions: the table stays aligned
    assert len({len(line) for line in lines}) == 1
    assert len({tuple(i for i, ch in enumerate(line) if ch == "|") for line in lines}) == 1


def test_csv_round_trips_through_pandas():
    rows = _rows()
    df = pd.read_csv(io.StringIO(format_rows(rows, "csv")))
    assert tuple(df.columns) == COLUMNS
    assert len(df) == 2
    assert list(df["tps_mean"]) == [r.tps_mean for r in rows]
    assert list(df["size_bytes"]) == [r.size_bytes for r in rows]
    assert df["speedup_vs_baseline"].isna()[0]
    assert df["speedup_vs_baseline"][1] == pytest.approx(1416.0 / 1234.5612, rel=1e-12)
    assert df["h2d_bytes"][1] == 9_876_543_210
    assert df["ttft_s"][1] == pytest.approx(0.3616)
    assert df["variant"].tolist() == ["baseline", "prefetch_ungated"]


def test_json_and_jsonl_are_valid_and_agree():
    rows = _rows()
    as_json = json.loads(format_rows(rows, "json"))
    lines = format_rows(rows, "jsonl").splitlines()
    as_jsonl = [json.loads(line) for line in lines]
    assert as_json == as_jsonl
    assert len(as_json) == 2
    assert set(as_json[0]) == set(COLUMNS)
    assert as_json[0]["speedup_vs_baseline"] is None
    assert as_json[1]["tps_std"] == 3.2
    assert as_json[1]["staging_bytes"] == 330_301_440
    assert BenchRow(**as_json[1]) == rows[1]


def test_json_has_no_nan():
    r = replace(_rows()[0], tps_std=float("nan"))
    rec = json.loads(format_rows([r], "json"))[0]
    assert rec["tps_std"] is None


def test_unknown_format_names_choices():
    with pytest.raises(ValueError, match="md, csv, json, jsonl"):
        format_rows(_rows(), "xml")
    assert FORMATS == ("md", "csv", "json", "jsonl")


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


def test_with_speedups_ratio_of_means_per_setup():
    rows = _rows()
    other_test = [replace(r, test="tg128", tps_mean=r.tps_mean / 10) for r in rows]
    no_base = replace(rows[1], test="pp2048")
    out = with_speedups(rows + other_test + [no_base])
    assert out[0].speedup_vs_baseline is None
    assert out[1].speedup_vs_baseline == pytest.approx(1416.0 / 1234.5612)
    assert out[3].speedup_vs_baseline == pytest.approx((1416.0 / 10) / (1234.5612 / 10))
    assert out[4].speedup_vs_baseline is None  # no baseline row for pp2048


def test_labels_follow_llama_bench():
    assert size_label(17.28 * GiB) == "17.28 GiB"
    assert params_label(20_914_757_184) == "20.91 B"
    assert tps_label(38.3449, 0.051) == "38.34 ± 0.05"
