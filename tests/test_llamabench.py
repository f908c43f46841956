"""sim.views.llamabench: llama-bench's fields, the json/jsonl reader and a row in the simulator's terms."""

from __future__ import annotations

import json
from dataclasses import replace
import math
import os
import re
import statistics
from pathlib import Path

import pandas as pd
import pytest

from sim.errors import ScenarioError
from sim.views.llamabench import (BOOL, CSV_FIELDS, FIELDS, FLOAT, INT, JSON_FIELDS, PATCH_FIELDS, PREFETCH_DEFAULTS,
                            REQUIRED_FIELDS, STRING, UPSTREAM_FIELDS, bench_test_name, flash_attn_label,
                            host_memory_pinned, kv_bytes_per_elem, n_cpu_moe_rules, parse_overrides,
                            prefetch_settings, prefetch_variant, python_regex, read_llama_bench, row_placement,
                            row_terms, row_variant, row_workload, sim_ngl, sim_overrides, sim_regex,
                            stdev_ns, stdev_ts, variant_fields)
from sim.model.specs import load_model

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "tests" / "data" / "llamacpp" / "h200-test"
BENCH = RUN / "llama-bench.jsonl"
LINES = BENCH.read_text().splitlines()


def _cut(name: str, n_layer: int):
    from calibrate.llamacpp.compare import cut_model

    return cut_model(load_model(ROOT / "scenarios" / "models" / f"{name}.toml"), n_layer)


def json_printer(lines: list[str]) -> str:
    """The jsonl rows in llama-bench's ``-o json`` layout (``json_printer``)."""
    out = "[\n"
    for i, line in enumerate(lines):
        rec = json.loads(line)
        out += (",\n" if i else "") + "  {\n"
        items = list(rec.items())
        for j, (k, v) in enumerate(items):
            if isinstance(v, list):
                val = "[ " + ", ".join(json.dumps(x) for x in v) + " ]"
            else:
                val = json.dumps(v, ensure_ascii=False)
            out += f'    "{k}": {val}' + (",\n" if j < len(items) - 1 else "\n")
        out += "  }"
    return out + "\n]\n"


def write(tmp_path: Path, text: str, name: str = "bench.jsonl") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# -- the field list ------------------------------------------------------------------------


def test_fields_restate_get_fields_and_types():
    names = [f.name for f in FIELDS]
    # upstream's 44, plus the three of the project's prefetch patch (calibrate/llamacpp/patches.py)
    assert len(names) == len(set(names)) == 47
    assert PATCH_FIELDS == ("prefetch_weights", "prefetch_gate", "prefetch_expert_slots")
    assert names[names.index("fit_min_ctx") + 1:names.index("n_prompt")] == list(PATCH_FIELDS)
    assert len(UPSTREAM_FIELDS) == 44 and not set(UPSTREAM_FIELDS) & set(PATCH_FIELDS)
    assert PREFETCH_DEFAULTS == {"prefetch_weights": 0, "prefetch_gate": 512, "prefetch_expert_slots": 0}
    assert not set(PATCH_FIELDS) & set(REQUIRED_FIELDS)  # upstream rows lack them
    assert names[:6] == ["build_commit", "build_number", "cpu_info", "gpu_info", "backends", "model_filename"]
    assert names[-6:] == ["avg_ns", "stddev_ns", "avg_ts", "stddev_ts", "samples_ns", "samples_ts"]
    assert CSV_FIELDS == tuple(names[:-2]) and JSON_FIELDS == tuple(names)
    types = {f.name: f.type for f in FIELDS}
    ints = {"build_number", "n_batch", "n_ubatch", "n_threads", "poll", "model_size", "model_n_params",
            "n_gpu_layers", "main_gpu", "n_prompt", "n_gen", "n_depth", "avg_ns", "stddev_ns", "no_op_offload",
            "n_cpu_moe", "fit_target", "fit_min_ctx", "flash_attn", *PATCH_FIELDS}
    bools = {"no_kv_offload", "cpu_strict", "embeddings", "no_host", "repack"}
    assert {n for n, t in types.items() if t == INT} == ints | {"samples_ns"}
    assert {n for n, t in types.items() if t == BOOL} == bools
    assert {n for n, t in types.items() if t == FLOAT} == {"avg_ts", "stddev_ts", "samples_ts"}
    assert types["load_mode"] == types["tensor_buft_overrides"] == types["tensor_split"] == STRING
    assert set(REQUIRED_FIELDS) <= set(names)


def test_fields_match_llama_bench_source():
    """With LLAMA_CPP_DIR pointing at a llama.cpp tree: FIELDS is test::get_fields() in order, the
    prefetch patch's three fields aside in an upstream tree (they are the project's own); a tree
    with the patch applied lists them too."""
    src = os.environ.get("LLAMA_CPP_DIR")
    path = Path(src or "/nonexistent") / "tools" / "llama-bench" / "llama-bench.cpp"
    if not path.is_file():
        pytest.skip("set LLAMA_CPP_DIR to a llama.cpp tree to check FIELDS against llama-bench.cpp")
    text = path.read_text()
    body = re.search(r"get_fields\(\)\s*\{.*?fields\s*=\s*\{(.*?)\};", text, re.S).group(1)
    listed = re.findall(r'"(\w+)"', body)
    ours = [f.name for f in FIELDS if not f.json_only and (not f.patch or f.name in listed)]
    assert ours == listed
    types = re.search(r"get_field_type\(const std::string & field\)\s*\{(.*?)\n    \}", text, re.S).group(1)
    for block in re.finditer(r"if \((.*?)\)\s*\{\s*return (\w+);", types, re.S):
        for name in re.findall(r'field == "(\w+)"', block.group(1)):
            if name in {f.name for f in FIELDS}:
                assert {f.name: f.type for f in FIELDS}[name] == block.group(2), name


def test_test_names():
    assert bench_test_name(512, 0) == "pp512"
    assert bench_test_name(0, 128) == "tg128"
    assert bench_test_name(512, 0, 8192) == "pp512 @ d8192"
    assert bench_test_name(512, 128) == "pp512+tg128"
    assert bench_test_name(64, 8, 128) == "pp64+tg8 @ d128"


def test_prefetch_fields_name_the_simulator_variant():
    assert prefetch_variant() == prefetch_variant(0, 512, 0) == "baseline"
    assert prefetch_variant(0, 0, 0) == prefetch_variant(0, 128, 0) == "baseline"  # -pwg does nothing with -pw 0
    assert prefetch_variant(1, 0, 0) == "prefetch_ungated"
    assert prefetch_variant(1, 512, 0) == "prefetch_gated_512"
    assert prefetch_variant(0, 512, 3) == prefetch_variant(0, 0, 3) == "slots3"
    with pytest.raises(ValueError, match="which the simulator does not model"):
        prefetch_variant(1, 512, 2)
    with pytest.raises(ValueError, match="0 or 1"):
        prefetch_variant(2, 0, 0)
    with pytest.raises(ValueError, match=">= 0"):
        prefetch_variant(0, 0, -1)
    # a row: its values, or the defaults where it lacks them (upstream) or has NaN (mixed DataFrame)
    up = json.loads(LINES[0])
    assert prefetch_settings(up) == (0, 512, 0) and row_variant(up) == "baseline"
    assert row_variant(up | {"prefetch_weights": 1, "prefetch_gate": 0}) == "prefetch_ungated"
    assert row_variant(up | {"prefetch_weights": 1}) == "prefetch_gated_512"
    assert row_variant(pd.Series(up | {"prefetch_weights": math.nan, "prefetch_expert_slots": 4.0})) == "slots4"
    # the writer's inverse; every name parses as a simulator variant with those settings
    from sim.model.specs import parse_variant

    for pw, pwg, pes in [(0, 512, 0), (1, 0, 0), (1, 512, 0), (1, 64, 0), (0, 512, 2)]:
        v = parse_variant(prefetch_variant(pw, pwg, pes))
        assert variant_fields(v) == dict(prefetch_weights=pw, prefetch_gate=pwg, prefetch_expert_slots=pes)
    assert variant_fields(parse_variant("prefetch_ungated+slots3")) == dict(prefetch_weights=1, prefetch_gate=0,
                                                                            prefetch_expert_slots=3)
    assert variant_fields(parse_variant("cache_lru")) == PREFETCH_DEFAULTS


def test_ungated_weight_prefetch_has_one_name_everywhere():
    """-pw 1 -pwg 0 is the variant the default scenario and --variant call prefetch_ungated."""
    from sim.model.specs import DEFAULT_VARIANTS, load_scenario, parse_variant

    name = prefetch_variant(1, 0, 0)
    assert name == "prefetch_ungated" and name in DEFAULT_VARIANTS
    scn = load_scenario(ROOT / "scenarios" / "default.toml")
    ungated = [v for v in scn.variants if v.prefetch_weights and v.gate_min_batch is None and not v.expert_slots]
    assert [v.name for v in ungated] == [name]
    assert parse_variant(name) == replace(ungated[0], name=name)


def test_reader_takes_rows_with_and_without_the_prefetch_fields(tmp_path):
    up = json.loads(LINES[0])
    pw = {k: v for k, v in up.items() if not k.startswith("samples")}
    i = list(pw).index("n_prompt")
    items = list(pw.items())
    patched = dict(items[:i] + [("prefetch_weights", 1), ("prefetch_gate", 0), ("prefetch_expert_slots", 0)]
                   + items[i:])
    df = read_llama_bench(write(tmp_path, json.dumps(up) + "\n" + json.dumps(patched) + "\n"))
    cols = list(df.columns)
    assert cols.index("fit_min_ctx") + 1 == cols.index("prefetch_weights") < cols.index("n_prompt")
    assert math.isnan(df.prefetch_weights.iloc[0]) and df.prefetch_weights.iloc[1] == 1
    assert list(df.apply(row_variant, axis=1)) == ["baseline", "prefetch_ungated"]
    only = read_llama_bench(write(tmp_path, json.dumps(patched) + "\n", "p.jsonl"))
    assert only.prefetch_gate.dtype.kind == "i" and only.prefetch_gate.iloc[0] == 0
    for bad, msg in [({"prefetch_weights": 2}, "0 or 1"), ({"prefetch_gate": -1}, ">= 0"),
                     ({"prefetch_expert_slots": "3"}, "integer"), ({"prefetch_weights": True}, "integer")]:
        with pytest.raises(ScenarioError, match=msg) as ei:
            read_llama_bench(write(tmp_path, json.dumps(patched | bad) + "\n", "bad.jsonl"))
        assert f"{next(iter(bad))}, line 1" in str(ei.value)


# -- the reader ----------------------------------------------------------------------------


def test_read_jsonl_keeps_every_field_and_adds_test():
    df = read_llama_bench(BENCH)
    assert len(df) == len(LINES) == 10
    # upstream rows: every field but the prefetch patch's
    assert list(df.columns) == [f for f in JSON_FIELDS if f not in PATCH_FIELDS] + ["test"]
    assert df.index.name == "line" and list(df.index) == list(range(1, 11))
    assert df.attrs["format"] == "jsonl" and df.attrs["file"] == str(BENCH)
    assert list(df.test) == ["pp512", "tg32", "pp512", "pp512 @ d4096", "pp512", "tg16", "tg16", "pp512",
                             "pp64 @ d128", "pp64+tg8 @ d128"]
    r = df.loc[1]
    assert r.n_cpu_moe == 48 and r.load_mode == "none" and r.flash_attn == -1 and r.n_gpu_layers == -1
    assert r.samples_ns == [61234567, 60123456, 62345678, 61111111, 60987654] and len(r.samples_ts) == 5
    assert df.loc[9, "tensor_buft_overrides"] == r"blk\.[0-9]+\.ffn_.*_exps\.weight=CPU"
    assert df.n_prompt.dtype.kind == "i" and df.avg_ts.dtype.kind == "f" and df.no_host.dtype == bool


def test_read_json_array_equals_jsonl(tmp_path):
    p = write(tmp_path, json_printer(LINES), "bench.json")
    a, b = read_llama_bench(p), read_llama_bench(BENCH)
    assert a.attrs["format"] == "json" and a.index.name == "row"
    pd.testing.assert_frame_equal(a.rename_axis("line"), b, check_like=False)


def test_unknown_fields_are_kept(tmp_path):
    lines = list(LINES[:2])
    lines[1] = lines[1][:-1] + ', "my_tag": "rerun", "n_fancy": 3}'
    df = read_llama_bench(write(tmp_path, "\n".join(lines) + "\n\n"))
    assert list(df.columns[-3:]) == ["my_tag", "n_fancy", "test"]
    assert df.my_tag.isna().iloc[0] and df.my_tag.iloc[1] == "rerun"


def test_older_rows_without_optional_fields(tmp_path):
    rec = {k: v for k, v in json.loads(LINES[0]).items()
           if k not in ("n_cpu_moe", "load_mode", "lazy_mode", "no_host", "repack", "fit_target", "fit_min_ctx")}
    rec["flash_attn"] = True  # llama-bench printed a BOOL before llama_flash_attn_type
    rec["use_mmap"] = False
    df = read_llama_bench(write(tmp_path, json.dumps(rec) + "\n"))
    assert df.flash_attn.iloc[0] == 1 and "load_mode" not in df.columns
    t = row_terms(df.iloc[0])
    assert t.n_cpu_moe == 0 and t.pinned and t.load_mode == "none" and t.flash_attn == "on"
    del rec["samples_ns"]  # rows of two versions in one file: what one lacks is NaN/None there
    df = read_llama_bench(write(tmp_path, LINES[1] + "\n" + json.dumps(rec) + "\n"))
    assert df.n_cpu_moe.isna().tolist() == [False, True] and df.samples_ns.iloc[1] is None
    assert row_terms(df.loc[2]).n_cpu_moe == 0 and row_terms(df.loc[1]).n_cpu_moe == 48


def _bad(lines: list[str], i: int, old: str, new: str) -> list[str]:
    assert old in lines[i], old
    lines = list(lines)
    lines[i] = lines[i].replace(old, new, 1)
    return lines


@pytest.mark.parametrize("edit, field, words", [
    (lambda L: _bad(L, 2, '"n_prompt": 512', '"n_prompt": "512"'), "n_prompt, line 3", "integer"),
    (lambda L: _bad(L, 1, '"avg_ts": ', '"avg_tps": '), "avg_ts, line 2", "missing"),
    (lambda L: _bad(L, 0, '"model_type": "qwen3moe ?B Q4_K - Medium", ', ""), "model_type, line 1", "missing"),
    (lambda L: _bad(L, 3, '"n_ubatch": 512', '"n_ubatch": 0'), "n_ubatch, line 4", ">= 1"),
    (lambda L: _bad(L, 0, '"avg_ts": 8372.540517', '"avg_ts": inf'), "avg_ts, line 1", "non-finite"),
    (lambda L: _bad(L, 0, '"avg_ts": 8372.540517', '"avg_ts": -nan'), "avg_ts, line 1", "non-finite"),
    (lambda L: _bad(L, 0, '"avg_ts": 8372.540517', '"avg_ts": NaN'), "avg_ts, line 1", "non-finite"),
    (lambda L: _bad(L, 4, '"avg_ts": ', '"avg_ts": -'), "avg_ts, line 5", "> 0"),
    (lambda L: _bad(L, 1, '"cpu_strict": false', '"cpu_strict": 0'), "cpu_strict, line 2", "true or false"),
    (lambda L: _bad(L, 1, '"load_mode": "none"', '"load_mode": 0'), "load_mode, line 2", "string"),
    (lambda L: _bad(L, 0, '"samples_ts": [ 8361.29', '"samples_ts": [ "8361.29"'), "samples_ts, line 1", "number"),
    (lambda L: _bad(L, 0, '"n_prompt": 512', '"n_prompt": 0'), "n_prompt, line 1", "n_gen > 0"),
    # physically absurd rates (TS_MAX): 1e300 t/s overflowed the comparison's statistics
    (lambda L: _bad(L, 0, '"avg_ts": 8372.540517', '"avg_ts": 1e300'), "avg_ts, line 1", "not physical"),
    (lambda L: _bad(L, 1, '"avg_ts": ', '"avg_ts": 1e9, "x": '), "avg_ts, line 2", "1e+09 t/s"),
    (lambda L: _bad(L, 0, '"samples_ts": [ 8361.29', '"samples_ts": [ 8e12'), "samples_ts, line 1", "not physical"),
    (lambda L: _bad(L, 0, '"stddev_ts": ', '"stddev_ts": 1e200, "y": '), "stddev_ts, line 1", "not physical"),
    # a repetition of weeks or years (SAMPLE_NS_MAX: 7 days) is no llama-bench run
    (lambda L: _bad(L, 0, '"samples_ns": [ ', '"samples_ns": [ 978307200000000000, '), "samples_ns, line 1",
     "days is not a llama-bench run"),
    # llama-bench writes one sample per repetition (-r >= 1): an empty array is no llama-bench row
    (lambda L: _bad(L, 2, L[2][L[2].index('"samples_ns": ['):L[2].index("]", L[2].index('"samples_ns": [')) + 1],
                    '"samples_ns": [ ]'), "samples_ns, line 3", "empty"),
    (lambda L: _bad(L, 3, L[3][L[3].index('"samples_ts": ['):L[3].index("]", L[3].index('"samples_ts": [')) + 1],
                    '"samples_ts": []'), "samples_ts, line 4", "one sample per repetition"),
    (lambda L: L[:5] + [L[5][:300]] + L[6:], "line 6", "malformed"),
    (lambda L: L[:2] + ["[1, 2]"], "line 3", "object"),
])
def test_bad_jsonl_is_one_line_error(tmp_path, edit, field, words):
    p = write(tmp_path, "\n".join(edit(LINES)) + "\n")
    with pytest.raises(ScenarioError) as ei:
        read_llama_bench(p)
    msg = str(ei.value)
    assert "\n" not in msg and str(p) in msg and f"'{field}'" in msg and words in msg, msg
    assert ei.value.file == str(p) and ei.value.field == field


def test_a_row_without_samples_whose_mean_implies_weeks_is_refused(tmp_path):
    """-o csv rows carry no samples: the time per repetition their avg_ts implies is bounded."""
    import json

    rec = json.loads(LINES[0])
    for k in ("samples_ns", "samples_ts", "avg_ns", "stddev_ns", "stddev_ts"):
        rec.pop(k, None)
    n = rec["n_prompt"] + rec["n_gen"]
    rec["avg_ts"] = n / (8 * 86400.0)  # 8 days per repetition
    p = write(tmp_path, json.dumps(rec) + "\n")
    with pytest.raises(ScenarioError, match="8 days is not a llama-bench run") as ei:
        read_llama_bench(p)
    assert ei.value.field == "avg_ts, line 1"
    rec["avg_ts"] = n / (6 * 86400.0)  # 6 days: a slow CPU run, accepted
    assert len(read_llama_bench(write(tmp_path, json.dumps(rec) + "\n"))) == 1


@pytest.mark.parametrize("path", sorted((ROOT / "data" / "llamacpp").glob("*/llama-bench.jsonl")),
                         ids=lambda p: p.parent.name)
def test_no_committed_row_exceeds_the_rate_bound(path):
    from sim.views.llamabench import SAMPLE_NS_MAX, TS_MAX

    df = read_llama_bench(path)  # refuses a row at or above TS_MAX
    assert len(df) and df.avg_ts.max() < TS_MAX / 1e4  # the bound leaves four orders of magnitude
    assert max(max(s) for s in df.samples_ns) < SAMPLE_NS_MAX / 1e4  # and so does the sample bound


@pytest.mark.parametrize("text, words", [("", "empty"), ("  \n\n", "empty"), ("[\n]\n", "no llama-bench rows"),
                                         ('{"a": 1}', "missing required"), ("[\n  3\n]", "object"),
                                         ("[\n  {\n", "malformed"),
                                         (",".join(CSV_FIELDS) + "\n", "-o csv"),
                                         ("| model | size |\n", "-o markdown"),
                                         # an older -o csv header, -o sql (fresh-user round 7: "malformed JSON")
                                         ("build_commit,build_number,cuda,vulkan,kompute,metal\n", "-o csv"),
                                         ("CREATE TABLE IF NOT EXISTS llama_bench (\n", "-o sql")])
def test_bad_files(tmp_path, text, words):
    p = write(tmp_path, text)
    with pytest.raises(ScenarioError, match=words) as ei:
        read_llama_bench(p)
    assert "\n" not in str(ei.value) and str(p) in str(ei.value)


def test_truncated_json_names_the_line(tmp_path):
    text = json_printer(LINES[:2])
    p = write(tmp_path, text.replace('"avg_ts": 316.344558', '"avg_ts": inf'), "bench.json")
    with pytest.raises(ScenarioError, match="non-finite") as ei:
        read_llama_bench(p)
    line = next(i for i, s in enumerate(p.read_text().splitlines(), 1) if '"avg_ts": inf' in s)
    assert ei.value.field == f"avg_ts, line {line}"
    p = write(tmp_path, text[:-4], "cut.json")  # an interrupted run: no closing bracket
    with pytest.raises(ScenarioError, match="malformed JSON"):
        read_llama_bench(p)


def test_missing_file(tmp_path):
    with pytest.raises(ScenarioError, match="not found"):
        read_llama_bench(tmp_path / "nope.jsonl")
    with pytest.raises(ScenarioError, match="folder"):
        read_llama_bench(tmp_path)


# -- a row in the simulator's terms ----------------------------------------------------------


def test_parse_overrides():
    assert parse_overrides("none") == parse_overrides("") == parse_overrides(None) == parse_overrides(math.nan) == ()
    assert parse_overrides(r"blk\.[0-9]+\.ffn_.*=CPU") == ((r"blk\.[0-9]+\.ffn_.*", "CPU"),)
    assert parse_overrides("ffn_up=CPU;attn_.*=CUDA0") == (("ffn_up", "CPU"), ("attn_.*", "CUDA0"))
    assert parse_overrides("none;ffn_down=CPU") == (("ffn_down", "CPU"),)
    with pytest.raises(ValueError, match="no '=BUFFER'"):
        parse_overrides("ffn_up")
    with pytest.raises(ValueError, match="empty"):
        parse_overrides("=CPU")


def test_sim_regex_and_overrides_follow_llama_cpp_names():
    """The simulator's tensor names are llama.cpp's: patterns are used as they are (POSIX
    classes spelled out), buffers upper-cased, order kept."""
    m = _cut("qwen3-30b-a3b", 2)
    assert sim_regex(r"ffn_up_exps\.weight$") == r"ffn_up_exps\.weight$"
    assert sim_regex(r"blk\.[[:digit:]]+\.ffn_.*") == r"blk\.[0-9]+\.ffn_.*"
    rules = sim_overrides([(r"blk\.1\.ffn_up_exps\.weight$", "cpu"), (r"ffn_down_exps$", "CPU"),
                           (r"exps.weight", "CUDA0")], m)
    assert rules == ((r"blk\.1\.ffn_up_exps\.weight$", "CPU"), (r"ffn_down_exps$", "CPU"), (r"exps.weight", "CUDA0"))
    names = [t.name for t in m.tensors]
    hits = [[n for n in names if re.search(rx, n)] for rx, _ in rules]
    assert hits[0] == ["blk.1.ffn_up_exps.weight"]
    assert hits[1] == []  # names end in .weight: '...exps$' matches nothing, in llama.cpp too
    assert hits[2] == [n for n in names if n.endswith("_exps.weight")]


def test_n_cpu_moe_rules_are_llama_bench_patterns():
    rules = n_cpu_moe_rules(2)
    assert rules == ((r"blk\.0\.ffn_(up|down|gate|gate_up)_(ch|)exps", "CPU"),
                     (r"blk\.1\.ffn_(up|down|gate|gate_up)_(ch|)exps", "CPU"))
    m = _cut("qwen3-30b-a3b", 3)
    pl, _ = row_placement(row_terms(json.loads(LINES[0]) | {"n_cpu_moe": 2}), m)
    ot, _ = row_placement(row_terms(json.loads(LINES[0]) | {"n_cpu_moe": 0, "tensor_buft_overrides":
                                                             ";".join(f"{r}={b}" for r, b in rules)}), m)
    assert ([t.name for t in m.tensors if pl.host_resident(m, t)]
            == [t.name for t in m.tensors if ot.host_resident(m, t)])


@pytest.mark.parametrize("mode, pinned", [("none", True), ("mlock", True), ("dio", True), ("auto", False),
                                          ("mmap", False), ("mmap+mlock", False)])
def test_load_mode_to_host_memory(mode, pinned):
    assert host_memory_pinned(mode) is pinned
    assert host_memory_pinned(mode, no_host=True) is False


def test_small_translations():
    assert host_memory_pinned(None, use_mmap=False) and not host_memory_pinned(None, use_mmap=True)
    assert not host_memory_pinned(None)
    with pytest.raises(ValueError, match="load_mode"):
        host_memory_pinned("fast")
    assert sim_ngl(-1) == 999 and sim_ngl(99) == 99 and sim_ngl(0) == 0
    assert [flash_attn_label(v) for v in (-1, 0, 1, True, False, None)] == ["auto", "off", "on", "on", "off", "auto"]
    with pytest.raises(ValueError):
        flash_attn_label(2)
    assert kv_bytes_per_elem() == 2.0 and kv_bytes_per_elem("q8_0", "q8_0") == 34 / 32
    assert kv_bytes_per_elem("q8_0", "f16") == (34 / 32 + 2) / 2


def test_row_terms_and_workload():
    df = read_llama_bench(BENCH)
    t = row_terms(df.loc[10])
    assert (t.n_prompt, t.n_gen, t.n_depth, t.n_ubatch, t.n_batch) == (64, 8, 128, 64, 64)
    assert [x.name for x in t.tests] == ["pp64 @ d128", "tg8 @ d192"] and t.ctx_size == 200
    assert t.overrides == ((r"blk\.[0-9]+\.ffn_.*_exps\.weight", "CPU"),) and t.pinned and t.test == "pp64+tg8 @ d128"
    wl = row_workload(t, repetitions=3)
    assert (wl.n_ubatch, wl.n_batch, wl.repetitions) == (64, 64, 3)
    t = row_terms(json.loads(LINES[0]) | {"n_ubatch": 4096, "type_k": "q8_0", "type_v": "q8_0", "no_op_offload": 1})
    assert t.n_ubatch == 2048  # clamped to n_batch, as llama.cpp does
    assert t.kv_bytes_per_elem == 34 / 32 and any("q8_0" in n for n in t.notes) and t.no_op_offload
    assert row_terms(df.loc[7]).flash_attn == "off" and row_terms(df.loc[7]).ngl == 1


def test_placement_ncmoe_puts_every_expert_on_the_host():
    m = _cut("qwen3-30b-a3b", 2)
    pl, notes = row_placement(row_terms(json.loads(LINES[0])), m)  # -ncmoe 48 on a 2-layer GGUF, -lm none
    host = {t.name for t in m.tensors if pl.host_resident(m, t)}
    assert host == {t.name for t in m.tensors if t.is_expert} | {"token_embd.weight"}
    assert pl.n_cpu_moe == 2 and pl.ngl == 999 and pl.pinned and pl.ctx_size == 512
    assert notes == ("n_cpu_moe 48: the model has 2 blocks; every expert is on the host",)
    pl, notes = row_placement(row_terms(json.loads(LINES[0]) | {"n_cpu_moe": 2}), m)
    assert pl.n_cpu_moe == 2 and notes == ()  # at the model's blocks: nothing to say


def test_placement_gemma_ffn_override_and_ngl():
    m = _cut("gemma3-27b", 2)
    pl, _ = row_placement(row_terms(json.loads(LINES[4])), m)  # -ot ffn_(gate|up|down)=CPU -lm mmap
    host = {t.name for t in m.tensors if pl.host_resident(m, t)}
    assert host == {f"blk.{i}.ffn_{p}.weight" for i in range(2) for p in ("gate", "up", "down")} | {
        "token_embd.weight"}
    assert not pl.pinned
    # -ngl 1 offloads only the output layer: llama.cpp counts it as the last of n_layer + 1 layers
    # (llama_model::load_tensors: i_gpu_start = n_layer + 1 - ngl), so both blocks stay on the host
    pl, _ = row_placement(row_terms(json.loads(LINES[6])), m)
    assert pl.ngl == 1 and not pl.layer_on_gpu(m, 0) and not pl.layer_on_gpu(m, 1)
    host = [t for t in m.tensors if pl.host_resident(m, t)]
    # gemma3's output head is token_embd.weight duplicated (tied): its offloaded copy is on the GPU
    assert {t.name for t in host} == {t.name for t in m.tensors if t.layer >= 0} | {"token_embd.weight"}
    assert m.output_tensor not in host and m.output_tensor.duplicate
    # -ngl 2 adds the last block; -ngl 3 = n_layer + 1 offloads everything but token_embd
    for ngl, on in ((2, [False, True]), (3, [True, True]), (0, [False, False])):
        p2 = replace(pl, ngl=ngl)
        assert [p2.layer_on_gpu(m, i) for i in range(2)] == on
        assert p2.host_resident(m, m.output_tensor) == (ngl == 0)


def test_placement_refuses_unknown_buffers():
    m = _cut("gemma3-27b", 2)
    with pytest.raises(ValueError, match="CUDA1"):
        row_placement(row_terms(json.loads(LINES[7])), m)  # -ot ffn_down=CUDA1 on one GPU
    pl, notes = row_placement(row_terms(json.loads(LINES[7])), m, n_gpu=2)
    assert pl.override_tensor == (("ffn_down", "CUDA1"),) and pl.tensor_split == (1.0, 1.0)
    with pytest.raises(ValueError, match="BLAS"):
        row_placement(row_terms(json.loads(LINES[7]) | {"tensor_buft_overrides": "ffn_down=BLAS"}), m)
    with pytest.raises(ValueError, match="Python re"):
        row_placement(row_terms(json.loads(LINES[7]) | {"tensor_buft_overrides": "ffn_(up=CPU"}), m)


def test_posix_classes_of_std_regex():
    m = _cut("qwen3-30b-a3b", 12)
    assert python_regex(r"blk\.[[:digit:]]+\.ffn") == r"blk\.[0-9]+\.ffn"
    pl, _ = row_placement(row_terms(json.loads(LINES[0]) | {
        "n_cpu_moe": 0, "tensor_buft_overrides": r"blk\.1[[:digit:]]\.ffn_(up|down)_exps=CPU"}), m)
    assert {t.name for t in m.tensors if pl.host_resident(m, t)} == {
        "token_embd.weight", "blk.10.ffn_up_exps.weight", "blk.10.ffn_down_exps.weight", "blk.11.ffn_up_exps.weight",
        "blk.11.ffn_down_exps.weight"}


def test_real_llama_bench_output():
    """Files printed by llama-bench itself (a CPU build of llama.cpp's tools/llama-bench, on a
    synthetic 8-block Qwen3-MoE GGUF from ``calibrate.llamacpp.gguf_writer --tiny``):
    ``-p 64 -n 8 -pg 32,4 -d 0,64 -ub 32 -r 2 -ncmoe 4 -ot 'blk\\.[0-9]+\\.attn_q\\.weight=CPU'
    -lm none -fa 0,1 -o jsonl`` and ``-p 64 -n 0 -r 2 -o json``."""
    data = ROOT / "tests" / "data" / "llamacpp"
    a = read_llama_bench(data / "llama-bench-cpu.jsonl")
    assert list(a.columns) == list(UPSTREAM_FIELDS) + ["test"] and len(a) == 12
    assert (a.apply(row_variant, axis=1) == "baseline").all()  # upstream rows: no prefetch
    assert list(a.test[:6]) == ["pp64", "tg8", "pp32+tg4", "pp64 @ d64", "tg8 @ d64", "pp32+tg4 @ d64"]
    assert list(a.flash_attn) == [0] * 6 + [1] * 6 and (a.n_cpu_moe == 4).all()
    assert (a.samples_ns.map(len) == 2).all()
    t = row_terms(a.iloc[0])
    assert t.overrides == ((r"blk\.[0-9]+\.attn_q\.weight", "CPU"),) and t.pinned and t.flash_attn == "off"
    m = _cut("qwen3-30b-a3b", 8)
    pl, _ = row_placement(t, m)
    host = {t.name for t in m.tensors if pl.host_resident(m, t)}
    assert host == ({f"blk.{i}.attn_q.weight" for i in range(8)} | {"token_embd.weight"}
                    | {t.name for t in m.tensors if t.is_expert and t.layer < 4})
    b = read_llama_bench(data / "llama-bench-cpu.json")
    assert b.attrs["format"] == "json" and list(b.test) == ["pp64"] and b.samples_ts.iloc[0][0] > 0


@pytest.mark.parametrize("ts, shares", [("1.00", (1.0, 0.0)), ("0.00/1.00", (0.0, 1.0)), ("3.00/1.00", (3.0, 1.0)),
                                        ("0.00", ()), ("", ())])
def test_tensor_split_as_llamabench_prints_it(ts, shares):
    # llama-bench prints -ts 1/0 as "1.00" (shares up to the last non-zero one): every layer on
    # the first GPU, not the default split
    m = _cut("qwen3-30b-a3b", 4)
    pl, _ = row_placement(row_terms(json.loads(LINES[0]) | {"tensor_split": ts}), m, n_gpu=2)
    assert pl.tensor_split == shares


H200_BENCH = ROOT / "data" / "llamacpp" / "h200-20261201" / "llama-bench.jsonl"


@pytest.mark.parametrize("old, new, field, words", [
    # the fresh-user test's edit: avg_ts x10, its samples untouched (was scored as a -90 % error)
    ('"avg_ts": 320.638570', '"avg_ts": 3206.38570', "avg_ts, line 1",
     "not the mean of samples_ts as llama-bench derives them from samples_ns (not the printed, rounded samples_ts) "
     "(320.638570"),
    ('"avg_ts": 320.638570', '"avg_ts": 320.638572', "avg_ts, line 1", "not the mean"),  # past %f rounding
    ('"samples_ts": [ 303.044, 323.969, 325.063, 325.849, 325.268 ]', '"samples_ts": [ 1.0, 2.0 ]',
     "samples_ts, line 1", "2 samples_ts for 5 samples_ns"),
    ('323.969', '323.970', "samples_ts, line 1", "sample 2 is 323.97 t/s but (n_prompt + n_gen) * 1e9 / samples_ns"),
    ('"avg_ns": 199759200', '"avg_ns": 199759201', "avg_ns, line 1", "integer mean of samples_ns (199759200"),
    ('"n_prompt": 64', '"n_prompt": 65', "samples_ts, line 1", "65 * 1e9 / 211190140"),
    ('"stddev_ns": 6403429', '"stddev_ns": 6403430', "stddev_ns, line 1", "standard deviation of samples_ns (6403429"),
    ('"stddev_ts": 9.858958', '"stddev_ts": 9.858960', "stddev_ts, line 1", "standard deviation of samples_ts (9.858958"),
    ('"stddev_ts": 9.858958', '"stddev_ts": 0.000000', "stddev_ts, line 1", "standard deviation of samples_ts"),
])
def test_samples_and_averages_must_agree(tmp_path, old, new, field, words):
    lines = _bad(H200_BENCH.read_text().splitlines(), 0, old, new)
    p = write(tmp_path, "\n".join(lines) + "\n")
    with pytest.raises(ScenarioError) as ei:
        read_llama_bench(p)
    msg = str(ei.value)
    assert "\n" not in msg and str(p) in msg and f"'{field}'" in msg and words in msg, msg


def test_samples_check_allows_print_rounding_only(tmp_path):
    rec = json.loads(H200_BENCH.read_text().splitlines()[0])
    ns = rec["samples_ns"]
    exact = [1e9 * 64 / t for t in ns]
    # llama-bench's own digits: %g samples, %f avg_ts, floor-mean avg_ns
    rec.update(samples_ts=[float(f"{x:g}") for x in exact], avg_ts=float(f"{sum(exact) / 5:f}"), avg_ns=sum(ns) // 5)
    assert read_llama_bench(write(tmp_path, json.dumps(rec) + "\n")).avg_ts.iloc[0] == rec["avg_ts"]
    # half a last %g digit is the allowance: one full digit off is refused
    rec["samples_ts"] = [float(f"{exact[0]:g}") + 1e-3] + rec["samples_ts"][1:]
    with pytest.raises(ScenarioError, match="sample 1 is"):
        read_llama_bench(write(tmp_path, json.dumps(rec) + "\n"))
    # rows without the arrays (csv-like sources): avg_ts, the mean of the repetitions' t/s, is at
    # least the t/s of the mean time avg_ns and not twice it; samples_ts alone: its mean
    rec = {k: v for k, v in json.loads(H200_BENCH.read_text().splitlines()[0]).items() if not k.startswith("samples")}
    at_mean = 1e9 * 64 / rec["avg_ns"]
    for ok in (at_mean, at_mean * 1.01, at_mean * 1.9):
        rec["avg_ts"] = ok
        assert read_llama_bench(write(tmp_path, json.dumps(rec) + "\n")).avg_ts.iloc[0] == ok
    for bad in (at_mean * 0.99, at_mean * 2.1, 1234.5):
        rec["avg_ts"] = bad
        with pytest.raises(ScenarioError, match="contradicts avg_ns"):
            read_llama_bench(write(tmp_path, json.dumps(rec) + "\n"))
    rec["avg_ts"] = 1234.5
    rec["samples_ts"] = [1000.0, 2000.0]
    with pytest.raises(ScenarioError, match="not the mean of samples_ts .1500.000000"):
        read_llama_bench(write(tmp_path, json.dumps(rec) + "\n"))
    rec["avg_ts"] = 1500.0
    assert read_llama_bench(write(tmp_path, json.dumps(rec) + "\n")).avg_ts.iloc[0] == 1500.0


def test_stdev_is_llama_benchs_one_pass_formula_with_its_uint64_wrap(tmp_path):
    """llama-bench's ``stdev`` (``sqrt(sq_sum/(n-1) - mean^2 n/(n-1))``, integer ns in uint64): a
    row whose samples reach ~1.9 s squares past 2**64 and may print a wrapped value, which the reader
    takes, as it takes the exact one our own rows print; t/s to the print rounding."""
    ns = [1_820_000_000, 1_920_000_000, 2_020_000_000, 1_970_000_000, 1_870_000_000]
    exact = stdev_ns(ns, wrap=False)
    assert exact == int(math.sqrt(sum(x * x for x in ns) // 4 - (sum(ns) // 5) ** 2 * 5 // 4))
    assert 79_000_000 < exact < 80_000_000  # sample sd of the five: 79.06 ms
    wrapped = stdev_ns(ns)
    # the sum of squares (1.84e19) passes 2**64 where mean^2 * n does not: llama-bench prints 3.7 s
    u = 2 ** 64
    sq, mean = sum(x * x for x in ns) % u, sum(ns) // 5
    assert sq < sum(x * x for x in ns) and mean * mean * 5 < u
    assert wrapped == int(math.sqrt((sq // 4 - mean * mean * 5 // 4) % u)) and wrapped > 10 ** 9
    assert stdev_ns([5]) == stdev_ns([]) == 0 and stdev_ns([7, 7, 7]) == 0
    ts = [1e9 * 64 / x for x in ns]
    sd, slack = stdev_ts(ts)
    assert sd == pytest.approx(statistics.stdev(ts), rel=1e-9) and 0 < slack < 1e-6
    assert stdev_ts([2.5, 2.5, 2.5]) == (0.0, stdev_ts([2.5, 2.5, 2.5])[1])
    rec = json.loads(H200_BENCH.read_text().splitlines()[0])
    rec.update(n_prompt=64, n_gen=0, samples_ns=ns, samples_ts=[float(f"{x:g}") for x in ts],
               avg_ns=sum(ns) // 5, avg_ts=sum(ts) / 5, stddev_ts=float(f"{sd:f}"))
    for value in (wrapped, exact):  # llama-bench's and ours
        rec["stddev_ns"] = value
        assert read_llama_bench(write(tmp_path, json.dumps(rec) + "\n")).stddev_ns.iloc[0] == value


#: every committed llama-bench -o jsonl file (measured runs and the h200x2-predicted ones)
COMMITTED_BENCH = [p for p in sorted(ROOT.glob("data/llamacpp/*/*.jsonl"))
                   if p.read_text().startswith('{"build_commit"')]


@pytest.mark.parametrize("path", COMMITTED_BENCH, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_committed_bench_rows_agree_with_their_samples(path):
    assert len(COMMITTED_BENCH) >= 30
    assert len(read_llama_bench(path))  # refuses a row whose samples and averages disagree


def test_a_jsonl_file_whose_first_line_is_an_array_names_line_1(tmp_path):
    """'[1,2,3]' on line 1 of a jsonl file is a line that is no row (not a malformed -o json array
    at line 2)."""
    p = write(tmp_path, "[1, 2, 3]\n" + "\n".join(LINES[1:]) + "\n")
    with pytest.raises(ScenarioError, match="expected a JSON object") as ei:
        read_llama_bench(p)
    assert ei.value.field == "line 1"


def test_a_json_array_with_more_after_it_and_non_objects_are_named_in_json_terms(tmp_path):
    """An -o json array followed by anything but jsonl rows is named as such (at line 2), and a
    line that is no object says which JSON value it is (null, a number...), not a Python type."""
    p = write(tmp_path, json.dumps([json.loads(LINES[0])]) + "\nxyz\n")
    with pytest.raises(ScenarioError, match="a JSON array on line 1 and more after it") as ei:
        read_llama_bench(p)
    assert ei.value.field == "line 2"
    for val, kind in (("null", "null"), ("3", "a number"), ('"x"', "a string"), ("true", "a boolean")):
        with pytest.raises(ScenarioError, match=f"expected a JSON object, got {kind}$"):
            read_llama_bench(write(tmp_path, LINES[0] + "\n" + val + "\n"))


def test_a_utf8_byte_order_mark_is_taken_as_the_toml_reader_takes_it(tmp_path):
    plain = read_llama_bench(write(tmp_path, LINES[0] + "\n"))
    got = read_llama_bench(write(tmp_path, "\ufeff" + LINES[0] + "\n"))
    assert got.avg_ts.iloc[0] == plain.avg_ts.iloc[0] and got.attrs["format"] == "jsonl"


def test_a_row_of_a_llama_bench_before_depth_runs_at_depth_zero(tmp_path):
    """llama-bench before -d printed no n_depth: every test ran on an empty context, so the row
    reads as depth 0 (it had been refused as "missing required field (llama-bench writes it in
    every row)": fresh-user round 7)."""
    rec = json.loads(LINES[0])
    del rec["n_depth"]
    df = read_llama_bench(write(tmp_path, json.dumps(rec) + "\n"))
    assert df.n_depth.tolist() == [0] and row_terms(df.iloc[0]).test == f"pp{rec['n_prompt']}"
    rec = json.loads(LINES[0])
    del rec["n_prompt"]   # a field every version printed is still required
    with pytest.raises(ScenarioError, match="n_prompt.*missing required"):
        read_llama_bench(write(tmp_path, json.dumps(rec) + "\n"))


def test_two_json_arrays_in_one_file_are_named_as_two_runs(tmp_path):
    """llama-bench -o json run twice into one file: the second array's line is named and the file
    said to hold two runs (it had been "malformed JSON (Extra data)")."""
    arr = json.dumps([json.loads(LINES[0])], indent=2)
    with pytest.raises(ScenarioError, match="second JSON array") as ei:
        read_llama_bench(write(tmp_path, arr + "\n" + arr + "\n"))
    assert ei.value.field == f"line {arr.count(chr(10)) + 2}"


def test_an_ot_rule_that_matches_nothing_is_noted_for_compare_too():
    """row_placement, which run and compare share, notes an -ot rule that matches no tensor (llama.cpp
    skips it); compare had simulated such a row as resident without a word (fresh-user round 7)."""
    m = _cut("qwen3-30b-a3b", 2)
    row = json.loads(LINES[0]) | {"tensor_buft_overrides": "nomatch_xyz=CPU", "n_cpu_moe": 0}
    _pl, notes = row_placement(row_terms(row), m)
    assert any("-ot rule 'nomatch_xyz=CPU' matches no tensor" in n and "llama.cpp ignores" in n for n in notes)
    row["tensor_buft_overrides"] = r"blk\.0\.ffn_up_exps=CPU"
    assert row_placement(row_terms(row), m)[1] == ()
