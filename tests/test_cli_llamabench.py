"""``prefetch-sim run`` speaks llama-bench: its flags (lists, ranges, repeated flags, the
cartesian product in its order, ``-ot`` sets, ``-m``), its output (field names, JSON types,
csv/sql/md layouts) and what llama.cpp's ``scripts/compare-llama-bench.py`` makes of it.

Fast: the tiny scenarios (``scenarios/tiny``), one repetition unless the spread matters, mostly
the baseline variant alone (no worker processes)."""

from __future__ import annotations

import argparse
import io
import json
import re
import sqlite3
from pathlib import Path

import pandas as pd
import pytest

from sim.cli import build_parser, load_scenario_with_overrides, main, variant_ids
from sim.views.llamabench import CSV_FIELDS, FIELDS, UPSTREAM_FIELDS, read_llama_bench, row_terms, row_variant
from sim.views.report import COLUMNS, JSON_COLUMNS
from sim.model.specs import load_model, parse_variant

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "scenarios" / "tiny" / "tiny.toml")
TINY_MOE = str(ROOT / "scenarios" / "tiny" / "tiny-moe.toml")
QUICK = ("-r", "1", "-q", "--variant", "baseline")


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, out, err


def jsonl(capsys, *argv) -> list[dict]:
    rc, out, err = run(capsys, "run", TINY, *QUICK, "-o", "jsonl", *argv)
    assert rc == 0, err
    return [json.loads(line) for line in out.splitlines()]


def args_of(*argv):
    return build_parser().parse_args(["trace", TINY, *argv])


def scn_of(*argv):
    """The scenario ``trace``/``check`` simulate for these flags."""
    return load_scenario_with_overrides(args_of(*argv))


def _dense_model(tmp_path: Path) -> Path:
    p = tmp_path / "dense.toml"
    p.write_text('[model]\nname = "tiny-dense 2L F16"\nsource = "test"\nn_layer = 2\nd_model = 64\nn_head = 4\n'
                 'n_head_kv = 2\nhead_dim = 16\nn_vocab = 256\nn_ff = 128\n\n[quant]\npreset = "F16"\n')
    return p


def _scenario_on(tmp_path: Path, **hw_changes) -> str:
    """The tiny scenario on a copy of the tiny GPU with some profile fields changed."""
    hw = (ROOT / "scenarios" / "tiny" / "tiny-gpu.toml").read_text()
    for key, value in hw_changes.items():
        if re.search(rf"^{key} = .*$", hw, re.M):
            hw = re.sub(rf"^{key} = .*$", f'{key} = "{value}"', hw, flags=re.M)
        else:
            hw = hw.replace("n_gpu = 1", f'n_gpu = 1\n{key} = "{value}"')
    (tmp_path / "gpu.toml").write_text(hw)
    s = (ROOT / "scenarios" / "tiny" / "tiny.toml").read_text()
    s = s.replace('model = "tiny-moe.toml"', f'model = "{TINY_MOE}"').replace('hardware = "tiny-gpu.toml"',
                                                                             'hardware = "gpu.toml"')
    (tmp_path / "s.toml").write_text(s)
    return str(tmp_path / "s.toml")


# --------------------------------------------------------------------------------------
# argparse took llama-bench's multi-letter flags apart
# --------------------------------------------------------------------------------------


def test_ngl_99_is_n_gpu_layers_not_n_gen_gl():
    a = args_of("-ngl", "99")
    assert a.n_gpu_layers == [(99,)] and a.n_gen is None
    assert scn_of("-ngl", "99").placement.ngl == 99
    assert args_of("-ngl", "-1").n_gpu_layers == [(-1,)]  # llama-bench's default: every layer
    assert scn_of("-ngl", "-1").placement.ngl == 999


def test_any_negative_ngl_is_every_layer_as_in_llama_cpp_and_a_negative_range_end_is_refused(capsys):
    """llama-bench reads -ngl with parse_int_range(allow_negative) and llama_model::n_gpu_layers
    takes any n_gpu_layers < 0 as n_layer + 1: -ngl -2 is every layer, printed as given (-2);
    parse_int_range's regex signs only a range's first number, so -5--3 is refused."""
    assert args_of("-ngl", "-2").n_gpu_layers == [(-2,)]
    assert scn_of("-ngl", "-2").placement.ngl == scn_of("-ngl", "-1").placement.ngl == 999
    assert args_of("-ngl", "-2-1").n_gpu_layers == [(-2, -1, 0, 1)]  # llama-bench: -2,-1,0,1
    rc, out, _ = run(capsys, "run", TINY, *QUICK, "-ngl", "-2,-1", "-o", "json")
    rows = json.loads(out)
    assert rc == 0 and sorted({r["n_gpu_layers"] for r in rows}) == [-2, -1]
    by = {ngl: [r["avg_ts"] for r in rows if r["n_gpu_layers"] == ngl] for ngl in (-2, -1)}
    assert by[-2] == by[-1]
    with pytest.raises(SystemExit):
        args_of("-ngl", "-5--3")
    err = capsys.readouterr().err
    assert "'-5--3': its end cannot be negative" in err and len(err.strip().splitlines()) == 1


def test_ot_is_override_tensor_not_output_t():
    a = build_parser().parse_args(["run", TINY, "-ot", "exps=CPU"])
    assert a.overrides == [((("exps", "CPU"),),)] and a.output is None


def test_pg_is_a_pair_not_prompt_g(capsys):
    a = args_of("-pg", "16,4")
    assert a.n_pg == [((16, 4),)] and a.n_prompt is None
    rows = jsonl(capsys, "-p", "0", "-n", "0", "-pg", "16,4")
    assert [(r["n_prompt"], r["n_gen"], r["test"]) for r in rows] == [(16, 4, "pp16+tg4")]


def test_ub_takes_a_list(capsys):
    assert args_of("-ub", "256,512").n_ubatch == [(256, 512)]
    rows = jsonl(capsys, "-ub", "32,64", "-p", "64", "-n", "0")
    assert [r["n_ubatch"] for r in rows] == [32, 64] and rows[0]["avg_ts"] < rows[1]["avg_ts"]


def test_unrecognized_arguments_point_to_the_subcommands_help(capsys):
    for cmd in (["run", TINY, *QUICK], ["trace", TINY]):
        with pytest.raises(SystemExit) as info:
            main([*cmd, "--bogus", "1"])
        err = capsys.readouterr().err
        assert info.value.code == 2 and len(err.strip().splitlines()) == 1, err
        assert err.startswith(f"prefetch-sim {cmd[0]}: error: unrecognized arguments: --bogus 1") and \
            err.rstrip().endswith(f"(see 'prefetch-sim {cmd[0]} --help')"), err


def test_no_abbreviations_and_no_glued_letters(capsys):
    for argv, words in ((["--n-pr", "64"], "unrecognized arguments: --n-pr"),
                        (["-nope", "1"], "unrecognized flag '-nope'"),
                        (["-ngl99x"], "unrecognized flag '-ngl99x'"),
                        (["-vq"], "unrecognized flag '-vq'")):  # short flags are not run together either
        with pytest.raises(SystemExit) as info:
            main(["run", TINY, *QUICK, *argv])
        err = capsys.readouterr().err
        assert info.value.code == 2 and words in err and len(err.strip().splitlines()) == 1, err


def test_long_flags_may_spell_dashes_as_underscores_as_in_llama_bench(capsys):
    """llama-bench's parse_cmd_params replaces '_' by '-' in a word starting with '--':
    --n_prompt 256 is --n-prompt 256 (and --n_gen=0 is refused as --n-gen=0 is); a value keeps its
    '_'; a short flag does not change, nor a word after '--'."""
    # (-fa 0: the tiny model's head size, 16, is no multiple of q8_0's block, which llama.cpp refuses
    # under FlashAttention)
    dashed = jsonl(capsys, "--n-prompt", "16", "--n-gen", "0", "--cache-type-k", "q8_0", "--no-warmup", "-fa", "0")
    under = jsonl(capsys, "--n_prompt", "16", "--n_gen", "0", "--cache_type_k", "q8_0", "--no_warmup", "-fa", "0")
    assert under == [r | {"test_time": under[0]["test_time"]} for r in dashed] and dashed[0]["type_k"] == "q8_0"
    a = build_parser().parse_args(["run", TINY, "--override_tensor", "blk_x=CPU"])
    assert a.overrides == [((("blk_x", "CPU"),),)]  # the value keeps its '_'
    with pytest.raises(SystemExit):
        main(["run", TINY, *QUICK, "--n_promp", "16"])
    assert "unrecognized arguments: --n_promp" in capsys.readouterr().err


@pytest.mark.parametrize("glued, spaced", [
    ("-d8192", "-d 8192"), ("-ngl99", "-ngl 99"), ("-p512", "-p 512"), ("-ub0", "-ub 0"), ("-ncmoe4", "-ncmoe 4"),
    ("-d=8192", "-d 8192"), ("-ngl=-1,99", "-ngl -1,99"), ("-r1", "-r 1"), ("-ojson", "-o json"),
    ("-ctkq8_0", "-ctk q8_0"), ("-devCUDA0", "-dev CUDA0"), ("-pes2", "-pes 2"),
])
def test_a_value_glued_to_a_flag_is_refused_as_llama_bench_refuses_it(capsys, glued, spaced):
    """llama-bench matches each flag whole (argv[i] == "-d") and takes the next word as its value:
    -d8192 is no flag there. argparse alone took -d8192 as -d 8192 but -ngl99 as -n gl99 (refused):
    now every glued form is refused alike, in one line saying how to write it (exit 2, no output)."""
    with pytest.raises(SystemExit) as info:
        main(["run", TINY, *QUICK, "-p", "16", "-n", "0", glued])
    out, err = capsys.readouterr()
    assert info.value.code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert f"error: {glued}: write {spaced}; llama-bench takes a flag and its value as two words" in err
    if not glued.startswith("-o"):  # trace and check share the parser (not run's -o)
        with pytest.raises(SystemExit):
            args_of(glued)
        assert f"{glued}: write {spaced}" in capsys.readouterr().err
    # the spaced forms and a flag's negative value are read as before
    assert args_of("-d", "8192").n_depth == [(8192,)] and args_of("-ngl", "-1,99").n_gpu_layers == [(-1, 99)]


@pytest.mark.parametrize("word, spaced", [("--n-depth=64", "--n-depth 64"), ("--n-gpu-layers=99", "--n-gpu-layers 99"),
                                          ("--n_gpu_layers=99", "--n-gpu-layers 99"), ("--repetitions=2", "--repetitions 2"),
                                          ("--prefetch-gate=0", "--prefetch-gate 0")])
def test_a_llama_bench_long_flag_joined_to_its_value_is_refused_as_llama_bench_refuses_it(capsys, word, spaced):
    """llama-bench reads '--n-gpu-layers=99' as an unknown flag ("invalid parameter"): so does
    run, saying how to write it; the simulator's own long flags keep argparse's --flag=value."""
    with pytest.raises(SystemExit) as info:
        main(["run", TINY, *QUICK, "-p", "16", "-n", "0", word])
    out, err = capsys.readouterr()
    assert info.value.code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert f"write {spaced}; llama-bench takes a flag and its value as two words" in err
    rc, out, err = run(capsys, "run", TINY, *QUICK, "-p", "16", "-n", "0", "--max-work=100000000", "-o", "jsonl")
    assert rc == 0 and len(out.splitlines()) == 1


def test_a_negative_tensor_split_is_refused_by_its_own_check_not_taken_for_a_flag(capsys):
    """'-ts -1/2': llama-bench reads the word after -ts as its value; so does run, whose check of
    the shares then refuses it (argparse alone says the flag lacks a value)."""
    with pytest.raises(SystemExit) as info:
        main(["run", TINY, *QUICK, "-p", "16", "-n", "0", "-ts", "-1/2"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "-ts/--tensor-split: shares must be finite and >= 0, got '-1/2'" in err


# --------------------------------------------------------------------------------------
# lists, ranges, the product and its order
# --------------------------------------------------------------------------------------


def test_the_run_is_the_product_in_llama_bench_s_order(capsys):
    rows = jsonl(capsys, "-ngl", "1,99", "-ub", "32-64*2", "-p", "64", "-p", "16", "-n", "2", "-d", "0,8",
                 "-pg", "8,2")
    per = [(r["n_prompt"], r["n_gen"], r["n_depth"]) for r in rows[:8]]
    # per setting: per depth, the prompts (as given, -p repeated adds), the generations, the pairs
    assert per == [(64, 0, 0), (16, 0, 0), (0, 2, 0), (8, 2, 0), (64, 0, 8), (16, 0, 8), (0, 2, 8), (8, 2, 8)]
    settings = [(r["n_gpu_layers"], r["n_ubatch"]) for r in rows[::8]]
    assert settings == [(1, 32), (1, 64), (99, 32), (99, 64)] and len(rows) == 32


def test_ranges_and_bad_values_are_one_line_errors(capsys):
    from sim.cli.benchflags import int_list

    assert int_list("1-3") == (1, 2, 3) and int_list("128-1024*2") == (128, 256, 512, 1024)
    assert int_list("-1,8", allow_negative=True) == (-1, 8)
    # llama-bench's parse_int_range takes each item with its ',' or the end: one trailing ',' is fine
    assert int_list("64,") == (64,) and int_list("64,128-256*2,") == (64, 128, 256)
    for bad in (",", "64,,", ",64", "64,,128"):
        with pytest.raises(argparse.ArgumentTypeError):
            int_list(bad)
    for argv in (["-ub", "0"], ["-b", "0"], ["-pg", "512"], ["-fa", "maybe"], ["-ctk", "q3_k"], ["-sm", "diag"],
                 ["-lm", "fast"], ["-ncmoe", "-1"], ["-ts", "a/b"], ["-ot", "exps"], ["-ot", "=CPU"],
                 ["-nopo", "2"], ["-m", "nope.toml"], ["-mg", "1"], ["-ot", "exps=CUDA7"], ["-t", "0"],
                 ["-ot", "blk\\.(=CPU"]):
        try:
            rc, out, err = run(capsys, "run", TINY, *QUICK, *argv)
        except SystemExit as exc:
            rc, err = exc.code, capsys.readouterr().err
            out = ""
        assert rc == 2 and not out, argv
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, (argv, err)


# --------------------------------------------------------------------------------------
# each flag reaches the simulation
# --------------------------------------------------------------------------------------


def test_load_mode_and_mmap_set_pinned_or_pageable(capsys):
    assert scn_of("-lm", "none").placement.pinned and scn_of("-lm", "mlock").placement.pinned
    assert not scn_of("-lm", "mmap").placement.pinned and not scn_of("-lm", "auto").placement.pinned
    assert not scn_of("-mmp", "1").placement.pinned and scn_of("-mmp", "0").placement.pinned
    assert not scn_of("-lm", "none", "--no-host", "1").placement.pinned
    rows = jsonl(capsys, "-lm", "mmap,none", "-mmp", "1", "-p", "64", "-n", "0")
    assert [r["load_mode"] for r in rows] == ["mmap", "none", "mmap"]
    assert rows[0]["avg_ts"] == rows[2]["avg_ts"] != rows[1]["avg_ts"]


def test_override_tensor_sets_buffers_and_rules(capsys):
    pl = scn_of("-ot", r"blk\.0\.ffn_(up|down|gate)_exps=CUDA0").placement  # n_cpu_moe 2 in the scenario
    m = load_model(TINY_MOE)
    host = {t.name for t in m.tensors if pl.host_resident(m, t)}
    assert not any(n.startswith("blk.0.ffn_") and "_exps" in n for n in host)
    assert any(n.startswith("blk.1.ffn_") and "_exps" in n for n in host)  # --n-cpu-moe's rules come after
    pl = scn_of("-ot", "attn_q=CPU").placement
    assert all(pl.host_resident(m, t) for t in m.tensors if "attn_q" in t.name)
    # ';' between the rules of a set, ',' between sets (each a test), an empty set: no override
    rows = jsonl(capsys, "-ot", r"attn_q=CPU;attn_k=CPU,,blk\.1\.ffn_up_exps=CUDA0", "-p", "64", "-n", "0")
    assert [r["tensor_buft_overrides"] for r in rows] == ["attn_q=CPU;attn_k=CPU", "none",
                                                          r"blk\.1\.ffn_up_exps=CUDA0"]
    # llama-cli's ',' between rules: one set
    rows = jsonl(capsys, "--override-tensor-cli", "attn_q=CPU,attn_k=CPU", "-p", "64", "-n", "0")
    assert [r["tensor_buft_overrides"] for r in rows] == ["attn_q=CPU;attn_k=CPU"]
    assert row_terms(rows[0]).overrides == (("attn_q", "CPU"), ("attn_k", "CPU"))


def test_a_rule_that_matches_nothing_is_ignored_as_llama_cpp_ignores_it_naming_the_nearest_tensors(capsys):
    """llama.cpp's loader skips an -ot rule that matches no tensor (no error, no effect): run
    simulates the same placement as without the rule, and notes the rule with the nearest names."""
    rc, out, err = run(capsys, "run", TINY, *QUICK, "-ot", r"blk\.0\.ffn_up_exp\.weight=CPU", "-o", "jsonl")
    assert rc == 0
    assert r"rule 'blk\.0\.ffn_up_exp\.weight=CPU' matches no tensor" in err and "llama.cpp ignores" in err
    assert "blk.0.ffn_up_exps" in err.split("nearest:")[1]
    with_rule = [json.loads(line) for line in out.splitlines() if line.strip()]
    rc, out, _ = run(capsys, "run", TINY, *QUICK, "-o", "jsonl")
    without = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert [r["tensor_buft_overrides"] for r in with_rule] == [r"blk\.0\.ffn_up_exp\.weight=CPU"] * len(with_rule)
    assert [r["avg_ts"] for r in with_rule] == [r["avg_ts"] for r in without]
    rc, _, err = run(capsys, "run", TINY, *QUICK, "-ot", "exps=CUDA3")
    assert rc == 2 and "unrecognized buffer type 'CUDA3'" in err and "CPU, CUDA0)" in err


@pytest.mark.parametrize("buf, hint", [("cpu", "exactly: 'CPU'"), ("cuda0", "exactly: 'CUDA0'"),
                                       ("CUDA_Host", "devices' buffer types only")])
def test_a_buffer_llama_bench_would_not_recognise_is_refused_with_a_hint(capsys, buf, hint):
    """llama-bench matches -ot buffer names exactly against the devices' buffer types (CPU,
    CUDA0...; no host buffer): so does run, saying what it would take."""
    rc, _, err = run(capsys, "run", TINY, *QUICK, "-ot", f"exps={buf}")
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert f"unrecognized buffer type '{buf}'" in err and hint in err


def test_kv_types_threads_flash_attn_fit_and_split(capsys):
    # the tiny model's head size (16) is no multiple of a quantised KV type's block: llama.cpp
    # refuses that under FlashAttention, so its quantised K runs with -fa 0
    f16 = scn_of()
    q8 = scn_of("-ctk", "q8_0", "-fa", "0")
    assert q8.model.kv_bytes_per_elem == pytest.approx((8.5 / 8 + 2) / 2) and f16.model.kv_bytes_per_elem == 2.0
    rows = jsonl(capsys, "-ctk", "f16", "-fa", "on,off,auto,1,0", "-t", "3", "-p", "64", "-n", "0")
    assert [r["flash_attn"] for r in rows] == [1, 0, -1, 1, 0] and rows[0]["type_v"] == "f16"
    rows = jsonl(capsys, "-ctk", "f16,q8_0", "-fa", "0", "-t", "3", "-p", "64", "-n", "0")
    assert [r["type_k"] for r in rows] == ["f16", "q8_0"]
    assert rows[1]["peak_vram_bytes"] < rows[0]["peak_vram_bytes"]  # q8_0 K cache
    assert {r["n_threads"] for r in rows} == {3}
    err = capsys.readouterr().err
    rows = jsonl(capsys, "-fitt", "0,100", "-ts", "3/1", "-sm", "row", "-p", "64", "-n", "0")
    assert [r["fit_target"] for r in rows] == [0, 100] and rows[0]["tensor_split"] == "3.00/1.00"
    assert rows[0]["split_mode"] == "row"
    assert scn_of("-fitt", "100").placement.fit_experts
    # the margin is the placement's fit target (left free by the fit), not reserved VRAM
    assert scn_of("-fitt", "100").placement.fit_target_mib == (100,)
    assert scn_of("-fitt", "100").hardware.vram_reserved_bytes == scn_of().hardware.vram_reserved_bytes
    del err


def test_split_mode_none_puts_every_layer_on_the_main_gpu(capsys, tmp_path):
    scn = _scenario_on(tmp_path)
    gpu = tmp_path / "gpu.toml"
    gpu.write_text(gpu.read_text().replace("n_gpu = 1", "n_gpu = 2"))

    def placement(*argv):
        return load_scenario_with_overrides(build_parser().parse_args(["trace", scn, *argv])).placement

    assert placement("-sm", "none", "-mg", "1").tensor_split == (0.0, 1.0)
    assert placement("-ts", "3/1").tensor_split == (3.0, 1.0)
    assert placement("-ot", "attn_q=CUDA1").override_tensor == (("attn_q", "CUDA1"),)
    rc, _, err = run(capsys, "run", scn, *QUICK, "-mg", "2")
    assert rc == 2 and "-mg" in err and "2 GPU(s)" in err


def test_flags_the_model_does_not_use_say_so_in_one_line(capsys, tmp_path):
    dense = _dense_model(tmp_path)
    rc, out, err = run(capsys, "run", TINY, *QUICK, "-m", str(dense), "-ncmoe", "4", "-p", "64", "-n", "0",
                       "-o", "jsonl")
    assert rc == 0
    notes = [line for line in err.splitlines() if "n-cpu-moe" in line]
    assert len(notes) == 1 and "has no experts" in notes[0]
    row = json.loads(out)
    assert row["model_type"] == "tiny-dense 2L F16" and row["n_cpu_moe"] == 4
    rc, _, err = run(capsys, "run", TINY, *QUICK, "-t", "2", "-fa", "0", "-p", "64", "-n", "0")
    assert rc == 0 and "-t: " in err and "-fa: " in err


def test_a_setting_the_simulator_does_not_model_is_refused_or_left_out(capsys):
    """-nkvo 1, -sm row over two GPUs and -embd 1 change llama.cpp's speed and are not modelled:
    their rows would print another configuration's numbers, so run refuses them naming the flag,
    and --skip-unmodelled leaves their rows out with a note (the modelled settings print)."""
    for flags, flag in ((("-nkvo", "0,1"), "-nkvo"), (("-embd", "0,1"), "-embd")):
        rc, out, err = run(capsys, "run", TINY, *QUICK, *flags, "-p", "64", "-n", "0")
        assert rc == 2 and f"field '{flag}/" in err and "--skip-unmodelled" in err and out == ""
        rc, out, err = run(capsys, "run", TINY, *QUICK, *flags, "-p", "64", "-n", "0", "--skip-unmodelled",
                           "-o", "jsonl")
        rows = [json.loads(x) for x in out.splitlines()]
        assert rc == 0 and rows and "left out (--skip-unmodelled)" in err
        assert not any(r.get("no_kv_offload") or r.get("embeddings") for r in rows)
    rc, out, err = run(capsys, "run", "h200x2-qwen3-30b-a3b", "-sm", "row", "-p", "64", "-n", "0", "-r", "1", "-q")
    assert rc == 2 and "-sm row over 2 GPUs is not modelled" in err
    rc, out, err = run(capsys, "run", TINY, *QUICK, "-sm", "row", "-p", "64", "-n", "0")  # one GPU: as layer
    assert rc == 0


def test_m_replaces_the_model_and_keeps_the_rest(capsys, tmp_path):
    dense = _dense_model(tmp_path)
    rows = jsonl(capsys, "-m", f"{TINY_MOE},{dense}", "-p", "64", "-n", "0")
    assert [r["model_type"] for r in rows] == ["tiny-moe 2L F16", "tiny-dense 2L F16"]
    assert [r["model_filename"] for r in rows] == [TINY_MOE, str(dense)]
    assert {r["hardware"] for r in rows} == {"tiny-gpu"}  # the scenario's hardware stays
    assert scn_of("-m", str(dense)).model.name == "tiny-dense 2L F16"
    assert [v.name for v in scn_of("-m", str(dense)).variants] == ["baseline", "prefetch_ungated", "slots2"]


def test_m_takes_a_gguf(capsys, tmp_path):
    gw = pytest.importorskip("calibrate.llamacpp.gguf_writer")
    pytest.importorskip("gguf")
    spec = gw.tiny_variant(load_model(ROOT / "scenarios" / "models" / "qwen3-30b-a3b.toml"), n_layer=2)
    path = gw.write_gguf(spec, tmp_path / "tiny.gguf", tiny=True).path
    try:
        model = load_model(path)
    except Exception as exc:  # noqa: BLE001 - load_model without GGUF support
        pytest.skip(f"load_model does not read GGUF yet: {exc}")
    rows = jsonl(capsys, "-m", str(path), "-ngl", "99", "-ncmoe", "1", "-p", "64", "-n", "0")
    assert rows[0]["model_filename"] == str(path) and rows[0]["model_type"] == model.name
    assert rows[0]["model_size"] == model.nbytes and rows[0]["n_cpu_moe"] == 1
    rows = jsonl(capsys, "-m", str(path), "-ot", r"blk\.1\.ffn_down_exps\.weight=CPU", "-p", "64", "-n", "0")
    assert rows[0]["tensor_buft_overrides"] == r"blk\.1\.ffn_down_exps\.weight=CPU"


def test_trace_and_check_take_one_setting(capsys, tmp_path):
    rc, out, _ = run(capsys, "check", TINY, "-ngl", "99", "-ub", "32", "--variant", "slots2")
    assert rc == 0 and "slots2 / pp64" in out
    rc, _, err = run(capsys, "check", TINY, "-ub", "32,64")
    assert rc == 2 and "-ub" in err and "one value" in err
    rc, out, _ = run(capsys, "trace", TINY, "-ot", "attn_q=CPU", "--variant", "baseline", "--out",
                     str(tmp_path / "t.json"))
    assert rc == 0 and "baseline / pp64" in out


# --------------------------------------------------------------------------------------
# output: llama-bench's fields, types and layouts
# --------------------------------------------------------------------------------------


def test_json_and_jsonl_carry_llama_bench_s_fields_with_its_types(capsys, tmp_path):
    rc, out, _ = run(capsys, "run", TINY, "-r", "2", "-q", "--variant", "baseline", "-o", "json")
    assert rc == 0
    data = json.loads(out)
    assert [list(d) for d in data] == [list(JSON_COLUMNS)] * len(data)
    py = {"STRING": str, "BOOL": bool, "INT": int, "FLOAT": float}
    for d in data:
        for f in FIELDS:
            vals = d[f.name] if f.array else [d[f.name]]
            # samples_ts as a C++ stream prints a double: six digits, 152093 without a point
            want = (int, float) if f.array and f.type == "FLOAT" else (py[f.type],)
            assert all(type(x) in want for x in vals), (f.name, d[f.name])
        assert len(d["samples_ns"]) == 2 and d["avg_ns"] == sum(d["samples_ns"]) // 2
    assert re.search(r'\n    "avg_ts": \d+\.\d{6},\n', out)
    assert data[0]["build_commit"] == "s01bada1524-baseli" and data[0]["variant"] == "baseline"
    # our reader takes it as a llama-bench file
    p = tmp_path / "r.json"
    p.write_text(out)
    df = read_llama_bench(p)
    assert list(df.test) == ["pp64", "tg4"] and list(df.variant) == ["baseline", "baseline"]
    js = tmp_path / "r.jsonl"
    assert main(["run", TINY, "-r", "2", "-q", "--variant", "baseline", "--out", str(js)]) == 0
    assert read_llama_bench(js).avg_ts.tolist() == df.avg_ts.tolist()


def _pf(rows):
    return [(r["test"], r["variant"], r["prefetch_weights"], r["prefetch_gate"], r["prefetch_expert_slots"])
            for r in rows]


def test_prefetch_patch_flags_run_their_variants_and_round_trip(capsys, tmp_path):
    """-pw/-pwg/-pes (the project's llama.cpp prefetch patch) name the variants; every row prints
    the flags of its combination, and our reader maps them back to its variant."""
    rc, out, err = run(capsys, "run", TINY, "-r", "1", "-q", "-p", "64", "-n", "0", "-pw", "0,1", "-pwg", "0",
                       "-pes", "0,2", "-o", "jsonl", "--skip-unmodelled")
    assert rc == 0 and "-pw 1 -pwg 0 -pes 2: left out (--skip-unmodelled)" in err
    data = [json.loads(x) for x in out.splitlines()]
    assert [d["variant"] for d in data] == ["baseline", "slots2", "prefetch_ungated"]
    names = list(data[0])
    assert names[names.index("fit_min_ctx") + 1:names.index("n_prompt")] == [
        "prefetch_weights", "prefetch_gate", "prefetch_expert_slots"]
    p = tmp_path / "r.jsonl"
    p.write_text(out)
    df = read_llama_bench(p)
    assert list(df.apply(row_variant, axis=1)) == list(df.variant)
    assert df.prefetch_gate.tolist() == [0, 0, 0] and df.prefetch_expert_slots.tolist() == [0, 2, 0]
    # the scenario's own variants print theirs too (csv: one column each)
    rc, out, _ = run(capsys, "run", TINY, "-r", "1", "-q", "-p", "64", "-n", "0", "-o", "csv")
    csv = pd.read_csv(io.StringIO(out))
    assert {(v, a, b, c) for v, a, b, c in zip(csv.variant, csv.prefetch_weights, csv.prefetch_gate,
                                                  csv.prefetch_expert_slots)} >= {("baseline", 0, 512, 0)}
    assert all(row_variant(r) == r["variant"] for _, r in csv.iterrows())
    for argv, msg in [(("-pw", "2"), "0 or 1"), (("-pw", "1", "--variant", "slots3"), "not both")]:
        rc, _, err = run(capsys, "run", TINY, "-r", "1", "-q", "-p", "64", "-n", "0", *argv)
        assert rc == 2 and msg in err and err.count("\n") == 1, argv


def test_every_prefetch_combination_is_a_row_printing_its_own_values(capsys, tmp_path, monkeypatch):
    """As the patched llama-bench: the full product of -pw x -pwg x -pes, innermost (per test),
    every combination a row with the values it was given (-pw 0 rows print their -pwg too);
    combinations of one variant share one simulation."""
    import sim.engines.metrics

    simulated = []
    real = sim.engines.metrics.run_scenario

    def spy(scn, *, variants=None, **kw):
        simulated.extend(v.name for v in variants)
        return real(scn, variants=variants, **kw)

    monkeypatch.setattr(sim.engines.metrics, "run_scenario", spy)

    def rows(*argv):
        rc, out, err = run(capsys, "run", TINY, "-r", "1", "-q", "-p", "64", "-n", "4", "-o", "jsonl", *argv)
        assert rc == 0, err
        return [json.loads(x) for x in out.splitlines()]

    got = rows("-pw", "0", "-pwg", "128")
    assert _pf(got) == [("pp64", "baseline", 0, 128, 0), ("tg4", "baseline", 0, 128, 0)]
    simulated.clear()
    got = rows("-pw", "0,1", "-pwg", "0,512")
    assert _pf(got) == [(t, v, pw, g, 0) for t in ("pp64", "tg4") for v, pw, g in (
        ("baseline", 0, 0), ("baseline", 0, 512), ("prefetch_ungated", 1, 0), ("prefetch_gated_512", 1, 512))]
    assert sorted(simulated) == ["baseline", "prefetch_gated_512", "prefetch_ungated"]  # each variant once
    assert got[0]["samples_ns"] == got[1]["samples_ns"] and got[0]["speedup_vs_baseline"] is None
    assert got[2]["speedup_vs_baseline"] == pytest.approx(got[2]["avg_ts"] / got[0]["avg_ts"])
    got = rows("-pes", "0,2", "-pwg", "0,512")
    assert _pf(got)[:4] == [("pp64", "baseline", 0, 0, 0), ("pp64", "slots2", 0, 0, 2),
                            ("pp64", "baseline", 0, 512, 0), ("pp64", "slots2", 0, 512, 2)]
    assert len(got) == 8
    # a repeated flag adds values
    assert _pf(rows("-pw", "0", "-pwg", "0", "-pwg", "512")) == [
        ("pp64", "baseline", 0, 0, 0), ("pp64", "baseline", 0, 512, 0),
        ("tg4", "baseline", 0, 0, 0), ("tg4", "baseline", 0, 512, 0)]
    # only the combinations asked for print: the baseline is simulated for vs base, not printed
    got = rows("-pw", "1", "-pwg", "0")
    assert _pf(got) == [("pp64", "prefetch_ungated", 1, 0, 0), ("tg4", "prefetch_ungated", 1, 0, 0)]
    assert got[0]["speedup_vs_baseline"] is not None
    # the reader maps every row back to its variant
    p = tmp_path / "r.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows("-pw", "0,1", "-pwg", "0,64", "-pes", "0")))
    df = read_llama_bench(p)
    assert list(df.apply(row_variant, axis=1)) == list(df.variant)


def test_a_requested_variant_that_does_not_fit_is_an_error(capsys):
    """-pes N (or --variant) that does not fit the GPU: exit 2, one line naming the flag and the
    value, no rows (before: left out with a note, baseline rows only, exit 0)."""
    base = ("run", TINY, "-r", "1", "-q", "-p", "64", "-n", "0", "-o", "jsonl")
    rc, out, err = run(capsys, *base, "-pes", "0,100000")
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert "field '-pes/--prefetch-experts-slots': -pes 100000: does not fit with variant 'slots100000'" in err
    rc, out, err = run(capsys, *base, "--variant", "baseline", "--variant", "slots100000")
    assert rc == 2 and out == "" and err.count("\n") == 1 and "field '--variant': --variant slots100000" in err
    # -pw 1 with -pes N is not modelled: no row can be printed for it
    rc, out, err = run(capsys, *base, "-pw", "0,1", "-pes", "0,2")
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert "-pw 1 -pwg 512 -pes 2: with -pw 1 the patch's -pes 2 stages every host weight in max(2, 2) slots" in err
    assert "prefetch_ungated+slots2 is another design" in err
    assert "--skip-unmodelled" in err
    rc, _, err = run(capsys, *base, "-pw", "1", "-pes", "3", "--skip-unmodelled")
    assert rc == 2 and "no combination" in err


def test_weight_prefetch_with_slots_says_its_patch_fields_are_another_design(capsys):
    """--variant prefetch_ungated+slots2 runs (the simulator's own design) and its rows print the
    patch's fields 1/0/2, which the patch runs as another design (refused as -pw 1 -pes 2 above):
    a note says to tell the rows apart by build_commit; no note without such a variant."""
    base = ("run", TINY, "-r", "1", "-q", "-p", "64", "-n", "0", "-o", "jsonl")
    rc, out, err = run(capsys, *base, "--variant", "prefetch_ungated+slots2")
    rows = [json.loads(x) for x in out.splitlines()]
    both = [r for r in rows if r["prefetch_expert_slots"] == 2]
    assert rc == 0 and both and all(r["prefetch_weights"] == 1 and r["prefetch_gate"] == 0 for r in both)
    assert "prefetch_ungated+slots2: rows print prefetch_weights 1, prefetch_gate 0, prefetch_expert_slots 2" in err
    assert "by build_commit" in err
    for variant in ("prefetch_ungated", "slots2"):
        rc, _out, err = run(capsys, *base, "--variant", variant)
        assert rc == 0 and "another design" not in err


def test_a_vram_overflow_names_the_flags_that_cause_it(capsys, tmp_path):
    """A VRAM overflow caused by flags names them (their values, what to change in flag terms),
    not the scenario file; one line, exit 2, nothing printed. Without a flag that sizes what
    overflows, the scenario's field is named as before."""
    base = ("-r", "1", "-q", "-p", "16", "-n", "0")

    def one_error(*argv) -> str:
        rc, out, err = run(capsys, *argv)
        lines = err.splitlines()
        assert rc == 2 and out == "" and err.count("error:") == 1 and lines[-1].startswith("prefetch-sim: error:"), err
        assert all(ln.startswith("prefetch-sim: note:") for ln in lines[:-1]), err  # notes, then the one error
        return lines[-1]

    # the KV cache of a -d too deep: -d and -p set the context
    err = one_error("run", TINY, *base, "--variant", "baseline", "-d", "16000000")
    assert "error: field '-d/-p': -d 16000000 -p 16: does not fit on GPU 0: needs" in err
    assert "KV 3.81 for 16000016 tokens" in err and "a shorter context: -d plus -p/-n" in err
    assert "tiny.toml" not in err and "placement" not in err
    # weights: -m, -ngl, -ncmoe
    err = one_error("run", TINY, *base, "--variant", "baseline", "-m", "qwen3-30b-a3b", "-ngl", "99", "-ncmoe", "0")
    assert "field '-m/-ngl/-ncmoe': -m qwen3-30b-a3b -ngl 99 -ncmoe 0: does not fit on GPU 0" in err
    assert "lower -ngl, raise -ncmoe" in err and "placement.n_cpu_moe" not in err
    # one flag: its whole name, as other flag errors
    err = one_error("run", TINY, "-r", "1", "-q", "--variant", "baseline", "-d", "16000000", "-p", "0", "-n", "4")
    assert "field '-d/-n': -d 16000000 -n 4: does not fit" in err  # -p 0 adds nothing to the context
    err = one_error("run", TINY, "-r", "1", "-q", "--variant", "baseline", "-d", "16000000")  # the scenario's tests
    assert "field '-d/--n-depth': -d 16000000: does not fit" in err
    # staging slots of a -pes that the baseline beside it fits
    err = one_error("run", TINY, *base, "-pes", "100000")
    assert "field '-pes/--prefetch-experts-slots': -pes 100000: does not fit with variant 'slots100000'" in err
    assert "fewer staging slots or no prefetch" in err
    # trace and check: the same flags named
    err = one_error("trace", TINY, "-p", "16", "-n", "0", "--variant", "baseline", "-d", "16000000", "--out",
                    str(tmp_path / "t.json"))
    assert "field '-d/-p': -d 16000000 -p 16: does not fit" in err and not (tmp_path / "t.json").exists()
    rc, out, err = run(capsys, "check", TINY, "-p", "16", "-n", "0", "-d", "16000000")
    assert rc == 2 and err.count("\n") == 1 and "field '-d/-p': no variant fits in VRAM, nothing to check: -d " \
        "16000000 -p 16: does not fit" in err
    assert out.count("skipped, field '-d/-p'") == 3  # each variant's line says it too
    # the scenario's own depth: no flag sizes the KV cache, the scenario file and field are named
    deep = tmp_path / "deep.toml"
    deep.write_text((ROOT / "scenarios" / "tiny" / "tiny.toml").read_text()
                    .replace('model = "tiny-moe.toml"', f'model = "{TINY_MOE}"')
                    .replace('hardware = "tiny-gpu.toml"', f'hardware = "{ROOT / "scenarios/tiny/tiny-gpu.toml"}"')
                    .replace("n_depth = [0]", "n_depth = [16000000]"))
    for extra in ((), ("-ub", "32")):  # a flag that does not size what overflows changes nothing
        err = one_error("run", str(deep), "-r", "1", "-q", "--variant", "baseline", *extra)
        assert f"{deep}: field 'placement': does not fit on GPU 0" in err and "raise placement.n_cpu_moe" in err


def test_variant_takes_a_comma_list_and_repeats(capsys):
    """--variant a,b as llama-bench's list flags (a repeated flag adds), each name checked as
    one --variant is."""
    rows = jsonl(capsys, "-p", "16", "-n", "0", "--variant", "prefetch_ungated,slots2", "--variant", "cache_lru")
    assert [r["variant"] for r in rows] == ["baseline", "prefetch_ungated", "slots2", "cache_lru"]
    assert [v.name for v in scn_of("--variant", "baseline, slots2").variants] == ["baseline", "slots2"]
    for argv, words in ((["--variant", "baseline,nope"], "field '--variant': unknown variant 'nope'"),
                        (["--variant", "slots2,slots2"], "field '--variant': variant given more than once: slots2"),
                        (["--variant", "slots2", "--variant", "cache_lru,slots2"], "more than once: slots2"),
                        (["--variant", "baseline,"], "argument --variant: empty variant name in 'baseline,'"),
                        (["--variant", "slots100000,slots2"], "field '--variant': --variant slots100000: does not fit")):
        try:
            rc, out, err = run(capsys, "run", TINY, "-r", "1", "-q", "-p", "16", "-n", "0", *argv)
        except SystemExit as exc:
            rc, (out, err) = exc.code, capsys.readouterr()
        assert rc == 2 and out == "" and err.count("\n") == 1 and words in err, (argv, err)


def test_a_fit_target_beyond_the_gpu_is_one_error_asking_for_a_smaller_one(capsys):
    rc, out, err = run(capsys, "run", TINY, *QUICK, "-p", "64", "-n", "0", "-fitt", "999999")
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert "field '-fitt/--fit-target': -fitt 999999: the margin alone leaves no room on a GPU" in err
    assert "smaller -fitt" in err and "n_cpu_moe" not in err
    # nothing fits for another reason: the reason once, as the error
    rc, out, err = run(capsys, "run", TINY, *QUICK, "-p", "64", "-n", "0", "-m", "qwen3-30b-a3b", "-ngl", "99",
                       "-ncmoe", "0")
    assert rc == 2 and out == "" and err.count("does not fit") == 1 and "error:" in err.splitlines()[-1]
    # no setting of several fits: the first one's reason, the others named in the same line
    rc, out, err = run(capsys, "run", TINY, *QUICK, "-p", "64", "-n", "0", "-m", "qwen3-30b-a3b", "-ngl", "98,99",
                       "-ncmoe", "0")
    assert rc == 2 and out == "" and err.count("does not fit") == 2 and "error:" in err.splitlines()[-1]
    assert err.rstrip().endswith("-ngl 99 does not fit either")
    # a setting that does not fit beside one that does: the rows of the one that fits, one error
    # line for the other and status 1, as llama-bench exits 1 on a model it cannot load
    rc, out, err = run(capsys, "run", TINY, *QUICK, "-p", "64", "-n", "0", "-m", "qwen3-30b-a3b", "-ngl", "0,99",
                       "-ncmoe", "0", "-ub", "64")
    assert rc == 1 and len(out.splitlines()) == 5  # md: header, rule, the -ngl 0 row, build line
    assert err.count("does not fit") == 1
    assert err.splitlines()[-1].startswith("prefetch-sim: error: -ngl 99: left out, no variant fits")


def test_the_ubatch_is_clamped_to_the_batch_and_printed_as_given(capsys):
    """llama.cpp runs min(-b, -ub); llama-bench prints the -ub given."""
    def rows(*argv):
        return jsonl(capsys, "-p", "256", "-n", "0", *argv)

    big, clamped, larger = rows("-ub", "99999", "-b", "128"), rows("-ub", "128", "-b", "128"), rows("-ub", "256",
                                                                                                   "-b", "256")
    assert big[0]["n_ubatch"] == 99999 and big[0]["n_batch"] == 128
    for k in ("samples_ns", "peak_vram_bytes"):
        assert big[0][k] == clamped[0][k], k
    assert larger[0]["peak_vram_bytes"] != big[0]["peak_vram_bytes"]
    assert scn_of("-ub", "99999", "-b", "128").workload.n_ubatch == 128


def test_pw_help_says_it_is_gated_by_default():
    helps = {a.dest: a.help for a in build_parser()._subparsers._group_actions[0].choices["run"]._actions}
    assert "ungated" not in helps["prefetch_weights"].split("(")[0]
    assert "gated by -pwg (default 512" in helps["prefetch_weights"]


def test_ot_trailing_comma_and_empty_value_as_llama_bench(capsys):
    """llama-bench's -ot parser (tools/llama-bench/llama-bench.cpp): every empty item of the comma
    list is a set without overrides (a trailing ',' adds one; '' is one); a set is read up to its
    first empty rule."""
    rc, out, err = run(capsys, "run", TINY, *QUICK, "-p", "64", "-n", "0", "-o", "jsonl", "-ot", "exps=CPU,")
    assert rc == 0 and [json.loads(x)["tensor_buft_overrides"] for x in out.splitlines()] == ["exps=CPU", "none"]
    assert "-ot 'exps=CPU,': the empty item before or after a ',' is one more test" in err
    assert [r["tensor_buft_overrides"] for r in jsonl(capsys, "-p", "64", "-n", "0", "-ot", "")] == ["none"]
    rc, out, err = run(capsys, "run", TINY, *QUICK, "-p", "64", "-n", "0", "-o", "jsonl", "-ot",
                       "exps=CPU;;attn_q=CPU,;attn_k=CPU")
    assert rc == 0 and [json.loads(x)["tensor_buft_overrides"] for x in out.splitlines()] == ["exps=CPU", "none"]
    assert "'attn_q=CPU' ignored, as llama-bench ignores it" in err and "'attn_k=CPU' ignored" in err


def test_csv_and_sql_layouts(capsys):
    rc, out, _ = run(capsys, "run", TINY, *QUICK, "-o", "csv")
    assert rc == 0 and out.splitlines()[0] == ",".join(COLUMNS)
    assert all(line.startswith('"s01bada1524-baseli","0",') for line in out.splitlines()[1:])
    df = pd.read_csv(io.StringIO(out))
    assert list(df.test) == ["pp64", "tg4"]
    rc, out, _ = run(capsys, "run", TINY, *QUICK, "-o", "sql")
    assert rc == 0 and out.startswith("CREATE TABLE IF NOT EXISTS llama_bench (\n")
    con = sqlite3.connect(":memory:")
    con.executescript(out)
    upstream = [f for f in CSV_FIELDS if f in UPSTREAM_FIELDS]  # no -pw/-pwg/-pes: upstream's columns
    assert [r[1] for r in con.execute("PRAGMA table_info(llama_bench)")] == upstream
    assert con.execute("SELECT COUNT(*) FROM llama_bench b JOIN prefetch_sim s ON s.llama_bench_rowid = b.rowid "
                       "WHERE s.variant = 'baseline'").fetchone() == (2,)


def _upstream_db() -> sqlite3.Connection:
    """A llama_bench table laid out as an upstream llama-bench's -o sql creates it: the columns of
    a real upstream row (data/llamacpp/h200-20261201, no prefetch fields) in its order, typed as
    sql_printer types them."""
    from sim.views.llamabench import FIELD_BY_NAME

    first = json.loads((ROOT / "data/llamacpp/h200-20261201/llama-bench.jsonl").read_text().splitlines()[0])
    cols = [k for k in first if k not in ("samples_ns", "samples_ts")]
    assert not any(k.startswith("prefetch_") for k in cols)
    sql = {"STRING": "TEXT", "BOOL": "INTEGER", "INT": "INTEGER", "FLOAT": "REAL"}
    con = sqlite3.connect(":memory:")
    con.execute(f"CREATE TABLE llama_bench ({', '.join(f'{c} {sql[FIELD_BY_NAME[c].type]}' for c in cols)})")
    return con


def test_sql_goes_into_an_upstream_llama_bench_db_unless_the_prefetch_flags_ask_for_the_patch_columns(capsys):
    """Without -pw/-pwg/-pes the llama_bench table is upstream's (every variant's rows INSERT into a
    db an upstream llama-bench created; the variant is in prefetch_sim); with them it is the
    patched llama-bench's, whose prefetch_* columns an upstream db lacks, as the patched
    llama-bench's own rows would."""
    rc, out, err = run(capsys, "run", TINY, "-r", "1", "-q", "--variant", "prefetch_ungated", "-o", "sql")
    assert rc == 0, err
    con = _upstream_db()
    con.executescript(out)
    got = con.execute("SELECT s.variant, b.n_prompt, b.n_gen FROM llama_bench b JOIN prefetch_sim s "
                      "ON s.llama_bench_rowid = b.rowid ORDER BY b.rowid").fetchall()
    assert [g[0] for g in got] == ["baseline"] * 2 + ["prefetch_ungated"] * 2
    rc, out, err = run(capsys, "run", TINY, "-r", "1", "-q", "-pw", "0,1", "-pwg", "0", "-o", "sql")
    assert rc == 0, err
    with pytest.raises(sqlite3.OperationalError, match="no column named prefetch_weights"):
        _upstream_db().executescript(out)
    con = sqlite3.connect(":memory:")
    con.executescript(out)
    assert [r[1] for r in con.execute("PRAGMA table_info(llama_bench)")] == list(CSV_FIELDS)
    assert sorted({r[0] for r in con.execute("SELECT prefetch_weights FROM llama_bench")}) == [0, 1]


def test_o_none_runs_and_prints_no_rows_as_llama_bench(capsys, tmp_path):
    """llama-bench's -o none has no printer: the tests run, stdout stays empty; the flags are
    still checked. With --out there is nothing to write: refused in one line, no file."""
    rc, out, err = run(capsys, "run", TINY, *QUICK, "-o", "none")
    assert rc == 0 and out == "" and "error" not in err
    rc, out, err = run(capsys, "run", TINY, *QUICK, "-o", "none", "-ub", "0")
    assert rc == 2 and "-ub" in err
    rc, out, err = run(capsys, "run", TINY, *QUICK, "-o", "none", "--out", str(tmp_path / "r.csv"))
    assert rc == 2 and "field '--out': -o none prints no rows" in err and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_markdown_is_llama_bench_s_table_with_a_simulated_build_line(capsys):
    rc, out, _ = run(capsys, "run", TINY, *QUICK, "-ub", "32")
    lines = out.splitlines()
    assert rc == 0
    assert lines[0].startswith("| model                          |       size |     params | backend    | ngl |")
    assert lines[0].endswith("| variant    |            test |                  t/s |    vs base |")
    assert "n_ubatch" in lines[0] and "n_batch" in lines[0] and "threads" not in lines[0]
    assert "|   0.30 MiB |     0.16 M | tiny-gpu   | 999 |" in lines[2]
    assert lines[-1] == ("build: simulated (prefetch-sim 0.1.0, analytic engine, profile 'tiny-gpu' "
                         "scenarios/tiny/tiny-gpu.toml)")


@pytest.mark.parametrize("changes, backend, buffer", [
    ({"gpu_name": "NVIDIA GeForce RTX 3090"}, "CUDA", "CUDA0"),
    ({"gpu_name": "AMD Instinct MI300X"}, "ROCm", "ROCm0"),
    ({"gpu_name": "AMD Instinct MI300X", "backend": "Vulkan"}, "Vulkan", "CUDA0"),
    ({}, "tiny-gpu", "CUDA0"),
])
def test_backend_comes_from_the_profile(capsys, tmp_path, changes, backend, buffer):
    scn = _scenario_on(tmp_path, **changes)
    rc, out, err = run(capsys, "run", scn, *QUICK, "-o", "jsonl", "-p", "64", "-n", "0", "-ot", f"attn_q={buffer}")
    assert rc == 0, err
    row = json.loads(out)
    assert row["backends"] == backend and row["tensor_buft_overrides"] == f"attn_q={buffer}"
    rc, out, _ = run(capsys, "run", scn, *QUICK, "-p", "64", "-n", "0")
    assert f"| {backend:<10} |" in out.splitlines()[2]


# --------------------------------------------------------------------------------------
# what compare-llama-bench.py makes of it
# --------------------------------------------------------------------------------------

#: the llama-bench table of llama.cpp's scripts/compare-llama-bench.py (the version of the
#: pinned llama.cpp): its columns and SQL types, the key properties it joins two builds on, and
#: the keys a json/jsonl row must have
COMPARE_DB = (
    ("build_commit", "TEXT"), ("build_number", "INTEGER"), ("cpu_info", "TEXT"), ("gpu_info", "TEXT"),
    ("backends", "TEXT"), ("model_filename", "TEXT"), ("model_type", "TEXT"), ("model_size", "INTEGER"),
    ("model_n_params", "INTEGER"), ("n_batch", "INTEGER"), ("n_ubatch", "INTEGER"), ("n_threads", "INTEGER"),
    ("cpu_mask", "TEXT"), ("cpu_strict", "INTEGER"), ("poll", "INTEGER"), ("type_k", "TEXT"), ("type_v", "TEXT"),
    ("n_gpu_layers", "INTEGER"), ("split_mode", "TEXT"), ("main_gpu", "INTEGER"), ("no_kv_offload", "INTEGER"),
    ("flash_attn", "INTEGER"), ("tensor_split", "TEXT"), ("tensor_buft_overrides", "TEXT"), ("load_mode", "TEXT"),
    ("embeddings", "INTEGER"), ("no_op_offload", "INTEGER"), ("n_prompt", "INTEGER"), ("n_gen", "INTEGER"),
    ("n_depth", "INTEGER"), ("test_time", "TEXT"), ("avg_ns", "INTEGER"), ("stddev_ns", "INTEGER"),
    ("avg_ts", "REAL"), ("stddev_ts", "REAL"), ("n_cpu_moe", "INTEGER"), ("fit_target", "INTEGER"),
    ("fit_min_ctx", "INTEGER"),
)
COMPARE_KEYS = (
    "cpu_info", "gpu_info", "backends", "n_gpu_layers", "n_cpu_moe", "tensor_buft_overrides", "model_filename",
    "model_type", "n_batch", "n_ubatch", "embeddings", "cpu_mask", "cpu_strict", "poll", "n_threads", "type_k",
    "type_v", "load_mode", "no_kv_offload", "split_mode", "main_gpu", "tensor_split", "flash_attn", "n_prompt",
    "n_gen", "n_depth", "fit_target", "fit_min_ctx",
)


class CompareLoad:
    """What llama.cpp's ``scripts/compare-llama-bench.py`` does when it loads llama-bench data,
    restated (its classes ``LlamaBenchDataSQLite3File``, ``LlamaBenchDataJSONL`` and
    ``LlamaBenchDataJSON``; ``LlamaBenchDataSQLite3._builds_init`` and ``get_rows``):

    * sql: ``llama-bench -o sql | sqlite3 db``, then it reads the table ``llama_bench``;
    * json / jsonl: it creates ``llama_bench`` with its own column list (:data:`COMPARE_DB`),
      drops every key of a row that is not a column, refuses a row that lacks a key property
      (:data:`COMPARE_KEYS`) or ``build_commit``, ``test_time``, ``avg_ts``, and inserts the rest
      by name;
    * then, when the ``build_commit`` lengths differ, it cuts every one to the shortest length,
      lists ``SELECT DISTINCT build_commit``, and compares a baseline and a compared build by
      joining their rows on every key property (averaging ``avg_ts`` per test).
    """

    def __init__(self):
        self.con = sqlite3.connect(":memory:")

    @classmethod
    def from_sql(cls, text: str) -> "CompareLoad":
        c = cls()
        c.con.executescript(text)
        tables = [r[0] for r in c.con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        assert "llama_bench" in tables
        return c

    @classmethod
    def from_rows(cls, rows: list[dict]) -> "CompareLoad":
        c = cls()
        c.con.execute(f"CREATE TABLE llama_bench({', '.join(f'{n} {t}' for n, t in COMPARE_DB)})")
        cols = {n for n, _ in COMPARE_DB}
        need = set(COMPARE_KEYS) | {"build_commit", "test_time", "avg_ts"}
        for i, row in enumerate(rows):
            kept = {k: v for k, v in row.items() if k in cols}
            missing = need - set(kept)
            assert not missing, f"row {i + 1} lacks {sorted(missing)}"
            c.con.execute(f"INSERT INTO llama_bench({', '.join(kept)}) VALUES({', '.join('?' * len(kept))})",
                          tuple(kept.values()))
        return c

    def builds(self) -> list[str]:
        lo, hi = self.con.execute("SELECT MIN(LENGTH(build_commit)), MAX(LENGTH(build_commit)) FROM llama_bench"
                                  ).fetchone()
        if lo != hi:
            self.con.execute(f"UPDATE llama_bench SET build_commit = SUBSTRING(build_commit, 1, {lo})")
        return [r[0] for r in self.con.execute("SELECT DISTINCT build_commit FROM llama_bench")]

    def compare(self, baseline: str, other: str) -> list[tuple]:
        on = " AND ".join([f"tb.{k} = tc.{k}" for k in COMPARE_KEYS]
                          + [f"tb.build_commit = '{baseline}'", f"tc.build_commit = '{other}'"])
        return self.con.execute(
            f"SELECT tb.model_type, tb.n_prompt, tb.n_gen, tb.n_depth, AVG(tb.avg_ts), AVG(tc.avg_ts) "
            f"FROM llama_bench tb JOIN llama_bench tc ON {on} GROUP BY tb.model_type, tb.n_gen, tb.n_prompt, "
            f"tb.n_depth ORDER BY tb.model_type, tb.n_gen, tb.n_prompt, tb.n_depth").fetchall()


VARIANTS = ("--variant", "prefetch_ungated", "--variant", "prefetch_gated_32", "--variant", "slots2")


@pytest.fixture(scope="module")
def bench_outputs(tmp_path_factory):
    """One 4-variant run (two variants share the prefix 'prefetch_') in json, jsonl and sql."""
    d = tmp_path_factory.mktemp("cmp")
    out = {}
    for fmt in ("json", "jsonl", "sql"):
        p = d / f"r.{fmt}"
        assert main(["run", TINY, "-r", "2", "-q", *VARIANTS, "-ub", "32,64", "--out", str(p)]) == 0
        out[fmt] = p.read_text()
    return out


@pytest.mark.parametrize("fmt", ["json", "jsonl", "sql"])
def test_compare_llama_bench_loads_our_output_and_compares_variants_as_builds(bench_outputs, fmt):
    text = bench_outputs[fmt]
    rows = json.loads(text) if fmt == "json" else [json.loads(x) for x in bench_outputs["jsonl"].splitlines()]
    load = CompareLoad.from_sql(text) if fmt == "sql" else CompareLoad.from_rows(rows)
    builds = load.builds()
    ids = {r["variant"]: r["build_commit"] for r in rows}
    assert sorted(builds) == sorted(ids.values()) and len(builds) == 4  # no two collide
    base = ids["baseline"]
    for variant in ("prefetch_ungated", "prefetch_gated_32", "slots2"):
        got = load.compare(base, ids[variant])
        assert len(got) == 2  # pp64 and tg4, each over both -ub (averaged, as the script does)
        for model, p, n, d, tb, tc in got:
            mine = [r for r in rows if (r["n_prompt"], r["n_gen"], r["n_depth"]) == (p, n, d)]
            assert tb == pytest.approx(sum(r["avg_ts"] for r in mine if r["variant"] == "baseline") / 2, rel=1e-6)
            assert tc == pytest.approx(sum(r["avg_ts"] for r in mine if r["variant"] == variant) / 2, rel=1e-6)


def test_variant_ids_stay_distinct_beside_real_builds(bench_outputs):
    rows = [json.loads(x) for x in bench_outputs["jsonl"].splitlines()]
    real = [{**r, "build_commit": "4b3f1a9c", "build_number": 7000} for r in rows if r["variant"] == "baseline"]
    load = CompareLoad.from_rows(rows + real)
    builds = load.builds()  # cut to 8 characters
    assert len(builds) == 5 and "4b3f1a9c" in builds
    assert len(load.compare("4b3f1a9c", builds[0] if builds[0] != "4b3f1a9c" else builds[1])) == 2


def test_variant_ids_are_equal_length_distinct_when_cut_and_fixed_by_the_variant():
    names = ["baseline", "prefetch_ungated", "prefetch_gated_512", "prefetch_gated_32", "slots3", "slots3+cache_lru",
             "cache_lru", "cache_lfu", "slots2", "slots4", "prefetch_ungated+cache_lru",
             "baseline_without_selective_copy"]
    ids = variant_ids([parse_variant(n) for n in names])
    assert len({len(b) for b, _ in ids.values()}) == 1
    nums = [n for _, n in ids.values()]
    assert len(set(nums)) == len(names) and min(nums) == ids["baseline"][1] == 0
    for cut in range(6, 20):
        assert len({b[:cut] for b, _ in ids.values()}) == len(names)
    # an id is the variant's own: the same alone, in another set or in another order
    alone = variant_ids([parse_variant("baseline")])
    assert alone["baseline"][0] == ids["baseline"][0] and alone["baseline"][1] == 0
    again = variant_ids([parse_variant(n) for n in reversed(names)])
    assert {k: b for k, (b, _) in again.items()} == {k: b for k, (b, _) in ids.items()}
    assert all(b.startswith("s") and b[11] == "-" for b, _ in ids.values())
    # two of a run's variants whose first seven characters meet (prefetch_gated_35 and
    # prefetch_gated_4914) are apart in full and the run says so
    from sim.cli import variant_id_note

    pair = [parse_variant("prefetch_gated_35"), parse_variant("prefetch_gated_4914")]
    a, b = (i for i, _ in variant_ids(pair).values())
    assert a[:7] == b[:7] and a != b
    assert "share the first seven characters" in variant_id_note(pair)
    assert variant_id_note([parse_variant(n) for n in names]) is None


def test_the_real_compare_llama_bench_script_when_given(bench_outputs, tmp_path):
    """Opt-in: ``COMPARE_LLAMA_BENCH=/path/to/llama.cpp/scripts/compare-llama-bench.py`` (and
    ``COMPARE_LLAMA_BENCH_PYTHON``, a Python with GitPython and tabulate, default this one) runs the
    script itself on our jsonl output and compares two variants."""
    import os
    import subprocess
    import sys

    script = os.environ.get("COMPARE_LLAMA_BENCH")
    if not script:
        pytest.skip("COMPARE_LLAMA_BENCH (llama.cpp's scripts/compare-llama-bench.py) not set")
    py = os.environ.get("COMPARE_LLAMA_BENCH_PYTHON", sys.executable)
    if subprocess.run([py, "-c", "import git, tabulate"], capture_output=True).returncode:
        pytest.skip(f"{py} lacks GitPython or tabulate")
    p = tmp_path / "r.jsonl"
    p.write_text(bench_outputs["jsonl"])
    ids = {json.loads(x)["variant"]: json.loads(x)["build_commit"] for x in bench_outputs["jsonl"].splitlines()}
    r = subprocess.run([py, script, "-t", "llama-bench", "-i", str(p), "-b", ids["baseline"], "-c",
                        ids["prefetch_ungated"]], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"t/s {ids['baseline']}" in r.stdout and f"t/s {ids['prefetch_ungated']}" in r.stdout
    assert "pp64" in r.stdout and "tg4" in r.stdout


def test_harness_flags_of_a_copied_llama_bench_command_are_accepted_with_a_note(capsys):
    """A llama-bench command line as the grid records it (``-r 5 -o jsonl -v``) runs; each flag
    that only sets up llama-bench's harness says in one line that it is not modelled."""
    assert main(["run", TINY, *QUICK, "-v", "--no-warmup", "--delay", "1", "-dev", "CUDA0", "--poll", "50",
                 "-o", "jsonl"]) == 0
    cap = capsys.readouterr()
    for flag in ("-v", "--delay", "-dev", "--poll"):
        assert f"note: {flag}: accepted, not modelled" in cap.err
    assert "--no-warmup: accepted" not in cap.err   # modelled (an expert cache starts cold)
    assert cap.out.count("\n") >= 1 and cap.out.lstrip().startswith("{")


def test_harness_flags_that_rows_print_carry_the_given_values_in_llama_benchs_loop_order(capsys):
    """llama-bench loops over -lzm, -dev, --repack, -C, --cpu-strict and --poll
    (get_cmd_params_instances: ... lm, lzm, mg, devs, ts, ot, noh, rpk, ..., nt, cm, cs, nd, pl) and
    prints each test's values: so do our rows (a comma list one row per value, -C outside the
    depths, --poll inside them), with md columns for values other than the defaults; the
    simulation is the one without the flags."""
    plain = jsonl(capsys, "-p", "16", "-n", "0", "-d", "0,8")
    flags = ("-C", "0x3,ff", "--poll", "0,50", "-dev", "cuda0", "--cpu-strict", "1", "--repack", "0", "-lzm", "on")
    rows = jsonl(capsys, "-p", "16", "-n", "0", "-d", "0,8", *flags)
    got = [(r["cpu_mask"], r["n_depth"], r["poll"]) for r in rows]
    assert got == [(m, d, pl) for m in ("0x3", "ff") for d in (0, 8) for pl in (0, 50)]
    assert {(r["devices"], r["cpu_strict"], r["repack"], r["lazy_mode"]) for r in rows} == {("CUDA0", True, False, "on")}
    by_depth = {r["n_depth"]: r["avg_ts"] for r in plain}
    assert all(r["avg_ts"] == by_depth[r["n_depth"]] for r in rows)  # not modelled: the same simulation
    assert [(r["cpu_mask"], r["poll"], r["devices"], r["repack"]) for r in plain] == [("0x0", 50, "auto", True)] * 2
    rc, out, err = run(capsys, "run", TINY, *QUICK, "-p", "16", "-n", "0", *flags)
    head = out.splitlines()[0]
    assert rc == 0 and all(f" {c} " in head for c in ("cpu_mask", "cpu_strict", "poll", "dev", "lazy_mode", "rpk"))
    assert "note: -C: accepted, not modelled" in err and "note: --poll: accepted, not modelled" in err


@pytest.mark.parametrize("argv, words", [
    (["-dev", "none"], "-dev none runs on the CPU only"),
    (["-dev", "CUDA1"], "invalid device: CUDA1"),
    (["-dev", "CPU"], "invalid device: CPU"),
    (["-dev", "CUDA0/"], "invalid device specification"),
    (["-C", "zz"], "invalid hex character 'z'"),
    (["--numa", "bogus"], "unknown numa mode 'bogus'"),
    (["--prio", "high"], "expected an integer"),
    (["-lzm", "maybe"], "unknown lazy mode 'maybe'"),
    (["--cpu-strict", "2"], "expected 0 or 1"),
    (["--poll", "-1"], "cannot be negative"),
    (["-oe", "xml"], "unknown output format 'xml'"),
])
def test_harness_flag_values_llama_bench_refuses_are_refused_in_one_line(capsys, argv, words):
    """As llama-bench: an unknown device (or the CPU), a CPU mask that parse_cpu_mask refuses,
    --numa other than distribute/isolate/numactl, --prio that std::stoi cannot read, ...; and
    -dev none (CPU only), which this GPU simulator cannot run."""
    try:
        rc = main(["run", TINY, *QUICK, "-p", "16", "-n", "0", *argv])
    except SystemExit as exc:
        rc = exc.code
    out, err = capsys.readouterr()
    assert rc == 2 and words in err and len(err.strip().splitlines()) == 1 and not out, err
    assert argv[0] in err


def test_harness_values_llama_bench_runs_are_accepted(capsys):
    """llama-bench takes --prio 99 (std::stoi; set_process_priority leaves an unknown level at
    normal priority), --numa isolate, -C with an 0x prefix and upper-case digits, -dev auto."""
    rows = jsonl(capsys, "-p", "16", "-n", "0", "--prio", "99", "--numa", "isolate", "-C", "0xFF", "-dev", "auto")
    assert [(r["cpu_mask"], r["devices"]) for r in rows] == [("0xFF", "auto")]


def test_an_ubatch_above_the_batch_prints_as_given_and_notes_the_clamp_from_a_toml_as_from_flags(capsys, tmp_path):
    """llama-bench prints the -ub given and llama.cpp clamps it to -b: a scenario's n_ubatch above
    its n_batch prints and simulates as -ub/-b on the command line do, each noting the clamp."""
    text = Path(TINY).read_text()
    ub, b = re.search(r"^n_ubatch = (\d+)", text, re.M).group(1), re.search(r"^n_batch = (\d+)", text, re.M).group(1)
    big = str(2 * int(b))
    text = re.sub(r"^n_ubatch = \d+", f"n_ubatch = {big}", text, flags=re.M)
    text = text.replace('"tiny-moe.toml"', f'"{TINY_MOE}"').replace('"tiny-gpu.toml"',
                                                                   f'"{ROOT / "scenarios/tiny/tiny-gpu.toml"}"')
    (tmp_path / "s.toml").write_text(text)
    rc, toml_out, toml_err = run(capsys, "run", str(tmp_path / "s.toml"), *QUICK, "-o", "jsonl")
    assert rc == 0, toml_err
    rc, flag_out, flag_err = run(capsys, "run", TINY, *QUICK, "-o", "jsonl", "-ub", big, "-b", b)
    assert rc == 0, flag_err
    key = lambda out: [(r["n_ubatch"], r["n_batch"], r["avg_ts"]) for r in map(json.loads, out.splitlines())]
    assert key(toml_out) == key(flag_out) and {r[0] for r in key(toml_out)} == {int(big)}
    assert f"the scenario's n_ubatch {big} is above its n_batch {b}" in toml_err
    assert f"-ub {big} is above -b {b}" in flag_err
    for err in (toml_err, flag_err):
        assert f"so {b}-token ubatches are simulated; the rows print n_ubatch {big}" in err
    rc, out, err = run(capsys, "run", TINY, *QUICK, "-o", "jsonl", "-ub", ub, "-b", b)
    assert "clamps" not in err
    # a workload changed since (a sweep's own ubatch) prints its own n_ubatch, not the TOML's
    import argparse
    from dataclasses import replace

    from sim.cli.benchflags import params_from_args
    from sim.model.specs import load_scenario

    scn = load_scenario(tmp_path / "s.toml")
    assert params_from_args(argparse.Namespace(), scn).values["n_ubatch"] == (int(big),)
    swept = scn.with_(workload=replace(scn.workload, n_ubatch=int(b) // 2))
    assert params_from_args(argparse.Namespace(), swept).values["n_ubatch"] == (int(b) // 2,)


@pytest.mark.parametrize("value, words", [
    ("/".join(["1"] * 17), "gives 17 shares, more than llama.cpp's 16 devices"),
    ("1e39/1", "share '1e39' does not fit a C float"),
    ("1/1e-50", "share '1e-50' does not fit a C float"),
])
def test_ts_refuses_what_llama_bench_refuses_in_one_line(capsys, value, words):
    """llama-bench asserts at most llama_max_devices() (16) shares and reads each with std::stof,
    which throws out of a float's range."""
    with pytest.raises(SystemExit) as info:
        main(["run", TINY, *QUICK, "-ts", value])
    err = capsys.readouterr().err
    assert info.value.code == 2 and words in err and "-ts" in err and len(err.strip().splitlines()) == 1, err


def test_ts_takes_what_a_float_holds():
    assert args_of("-ts", "/".join(["1"] * 16)).tensor_split == [(tuple([1.0] * 16),)]
    assert args_of("-ts", "3.4028235e38/0").tensor_split == [((3.4028235e38, 0.0),)]  # rounds to FLT_MAX


def test_m_says_where_the_placement_comes_from(capsys):
    import tempfile

    from calibrate.llamacpp.gguf_writer import tiny_variant, write_gguf
    from sim.model.specs import load_model

    with tempfile.TemporaryDirectory() as d:
        g = Path(d) / "q.gguf"
        write_gguf(tiny_variant(load_model(ROOT / "scenarios/models/qwen3-30b-a3b.toml")), g, tiny=True)
        assert main(["run", "-m", str(g), "-p", "64", "-n", "0", "-r", "1", "--variant", "baseline", "-q"]) == 0
        err = capsys.readouterr().err
        assert "-m: the placement comes from the scenario (-ngl 999, -ncmoe 24, -lm none)" in err
        assert "-ncmoe 24: 'qwen3moe ?B Q4_K - Medium' has 8 blocks; every expert is on the host" in err
        assert err.count("every expert is on the host") == 1   # said once, in the flag's terms
        assert main(["run", "-m", str(g), "-ngl", "99", "-ncmoe", "0", "-lm", "none", "-p", "64", "-n", "0",
                     "-r", "1", "--variant", "baseline", "-q"]) == 0
        assert "placement comes from the scenario" not in capsys.readouterr().err


def test_a_list_starting_with_a_negative_number_is_a_flag_value_as_in_llama_bench(capsys):
    # llama-bench reads '-ngl -1,99' as two values; argparse alone would take '-1,99' for a flag
    rc, out, err = run(capsys, "run", TINY, *QUICK, "-o", "jsonl", "-p", "64", "-n", "0", "-ngl", "-1,99")
    assert rc == 0, err
    rows = [json.loads(ln) for ln in out.splitlines()]
    assert sorted({r["n_gpu_layers"] for r in rows}) == [-1, 99]
    with pytest.raises(SystemExit) as exc:  # a negative value still gets its own one-line error
        run(capsys, "run", TINY, *QUICK, "-p", "64", "-n", "0", "-d", "-5")
    assert exc.value.code == 2 and "-d/--n-depth: values cannot be negative" in capsys.readouterr().err


def test_another_backends_buffer_is_refused(capsys):
    rc, _, err = run(capsys, "run", TINY, *QUICK, "-p", "64", "-n", "0", "-ot", "attn_q=ROCm0")
    assert rc == 2 and "unrecognized buffer type 'ROCm0'" in err and "CUDA0" in err


def test_default_threads_are_the_simulated_hosts(capsys, monkeypatch):
    """Without -t a row prints llama-bench's default on the machine simulated: the profile's
    recorded host_cpus (the H200 profile's 16, whatever this machine has), else this machine's
    CPUs; the markdown table then has no threads column."""
    from sim.cli.benchflags import default_threads
    from sim.model.specs import load_hardware

    monkeypatch.setattr("os.cpu_count", lambda: 3)
    assert default_threads(load_hardware("scenarios/hardware/h200-llamacpp.toml")) == 16
    assert default_threads(load_hardware("scenarios/hardware/rtx3090.toml")) == 3 == default_threads()
    assert {r["n_threads"] for r in jsonl(capsys, "-p", "64", "-n", "0")} == {3}   # tiny: a datasheet profile
    rc, out, _ = run(capsys, "run", *QUICK, "-p", "64", "-n", "0", "-o", "jsonl")   # the default: the H200's
    assert rc == 0 and {json.loads(ln)["n_threads"] for ln in out.splitlines()} == {16}
    rc, out, _ = run(capsys, "run", "-q", "-p", "64", "-n", "0")
    assert rc == 0 and "threads" not in out.splitlines()[0]


def test_the_work_budget_counts_memoised_variants_at_a_hundredth(capsys):
    """A variant timed graph by graph (no expert cache) costs 1/MEMO_WORK_DIVISOR of one built op
    by op: a 16k-token decode of the baseline is within the default budget, the same with an
    expert cache is refused, naming --max-work and the estimate."""
    from sim.bounds import MEMO_WORK_DIVISOR, WORK_MAX, variant_work, work_units
    from sim.model.specs import BenchTest, load_hardware, parse_variant

    hw = load_hardware("scenarios/hardware/h200-llamacpp.toml")
    base, lru = parse_variant("baseline"), parse_variant("cache_lru")
    assert variant_work([base, lru], hw) == 1 + 1 / MEMO_WORK_DIVISOR
    assert variant_work([base], hw.with_(executor_mode=True)) == 1.0
    tg = [BenchTest(0, 16384)]
    assert work_units(tg, 48, 512, 2048, 3, variant_work([base], hw)) < WORK_MAX
    assert work_units(tg, 48, 512, 2048, 3, variant_work([lru], hw)) > WORK_MAX
    rc, _, err = run(capsys, "run", "-n", "16384", "-p", "0", "-r", "1", "-q", "--variant", "cache_lru")
    assert rc == 2 and "field '--max-work'" in err and "x1/100 per other variant" in err
    assert err.count("\n") == 1


def test_the_work_budget_counts_an_op_by_op_prompt_graph_twice(capsys):
    """An expert-cache variant's prompt graphs cost about twice its decode graphs (OP_PROMPT_FACTOR):
    -p 10000 -ub 1 -r 1 with cache_lru had passed the budget and run a minute in 3.7 GB (fresh-user
    round 9); now refused at once, naming --max-work; the memoised variants are not counted twice."""
    from sim.bounds import OP_PROMPT_FACTOR, op_by_op_variants, variant_work, work_units
    from sim.model.specs import BenchTest, load_hardware, parse_variant

    hw = load_hardware("scenarios/hardware/h200-llamacpp.toml")
    base, lru = parse_variant("baseline"), parse_variant("cache_lru")
    assert op_by_op_variants([base, lru], hw) == 1.0 and op_by_op_variants([base], hw) == 0.0
    pp, tg = [BenchTest(1000, 0)], [BenchTest(0, 1000)]
    one = dict(n_layer=48, n_ubatch=1, n_batch=2048, repetitions=1, plans=0.0)
    w_pp = work_units(pp, n_variants=variant_work([lru], hw), op_variants=1.0, **one)
    w_tg = work_units(tg, n_variants=variant_work([lru], hw), op_variants=1.0, **one)
    assert w_pp == OP_PROMPT_FACTOR * w_tg
    assert work_units(pp, n_variants=variant_work([base], hw), op_variants=0.0, **one) == \
        work_units(tg, n_variants=variant_work([base], hw), op_variants=0.0, **one)
    rc, _, err = run(capsys, "run", "-p", "10000", "-n", "0", "-ub", "1", "-r", "1", "-q", "--variant", "cache_lru")
    assert rc == 2 and "field '--max-work'" in err and "x2 its prompt graphs" in err


def test_a_sweep_of_many_short_tests_counts_each_plan_s_fixed_cost(capsys):
    """Each test costs a few milliseconds per repetition and variant whatever its length (its
    routing draws, templates and summary); counted a hundredth like the memoised graphs, a
    -p 1-4096+1 -fa on,off sweep was estimated at a tenth of the budget and ran 4 minutes
    (fresh-user round 4). Now refused at once, naming --max-work; a short sweep runs."""
    from sim.bounds import PLAN_OVERHEAD_UNITS, work_units
    from sim.model.specs import BenchTest

    tests = [BenchTest(n, 0) for n in range(1, 201)]
    # 200 one-graph prompts x 5 repetitions x 1 variant: the plans' fixed cost dominates
    w = work_units(tests, 48, 512, 2048, 5, 0.01, plans=1.0)
    assert w >= 200 * 5 * PLAN_OVERHEAD_UNITS
    assert work_units(tests, 48, 512, 2048, 5, 0.01, plans=2.0) - w >= 200 * 5 * PLAN_OVERHEAD_UNITS
    rc, _, err = run(capsys, "run", "-m", "scenarios/models/qwen3-30b-a3b.toml", "-ngl", "99", "-ncmoe", "0",
                     "-p", "1-4096+1", "-fa", "on,off", "-n", "0", "--variant", "baseline", "-q", "-o", "none")
    assert rc == 2 and "field '--max-work'" in err and "per test, repetition and variant" in err
    rc, _, err = run(capsys, "run", "-m", "scenarios/models/qwen3-30b-a3b.toml", "-ngl", "99", "-ncmoe", "0",
                     "-p", "1-8+1", "-n", "0", "-r", "1", "--variant", "baseline", "-q", "-o", "none")
    assert rc == 0, err


def test_an_moe_prompt_in_small_ubatches_counts_every_graph_as_built(capsys):
    """An MoE prompt of 2-511-token ubatches builds nearly every graph anew (its expert counts
    differ per graph), so its graphs count x1 per variant, not a hundredth: -p 1000000 -ub 2 is
    refused at once (it was accepted and ran for tens of minutes), one-token ubatches and dense
    models as before."""
    from sim.bounds import MEMO_WORK_DIVISOR, work_units
    from sim.model.specs import BenchTest

    pp = [BenchTest(100_000, 0)]
    share = 1 / MEMO_WORK_DIVISOR
    one = dict(plans=1.0)  # one variant: one plan per test and repetition, whatever its share
    assert work_units(pp, 48, 2, 2048, 1, share, moe_variants=1.0, **one) == work_units(pp, 48, 2, 2048, 1, 1.0, **one)
    assert work_units(pp, 48, 1, 2048, 1, share, moe_variants=1.0, **one) == work_units(pp, 48, 1, 2048, 1, share, **one)
    assert (work_units(pp, 48, 512, 2048, 1, share, moe_variants=1.0, **one)
            == work_units(pp, 48, 512, 2048, 1, share, **one))
    assert work_units(pp, 48, 2, 2048, 1, share, **one) * MEMO_WORK_DIVISOR <= work_units(pp, 48, 2, 2048, 1, 1.0, **one) * 1.01
    rc, _, err = run(capsys, "run", "-p", "1000000", "-n", "0", "-ub", "2", "-r", "1", "-q", "--variant", "baseline")
    assert rc == 2 and "field '--max-work'" in err and err.count("\n") == 1


def test_no_warmup_drops_the_warm_up_an_expert_cache_keeps(capsys):
    """--no-warmup is modelled: an expert cache starts cold (llama-bench's warm-up run no longer
    fills it), the baseline (which keeps nothing of the warm-up) is unchanged, and no
    'not modelled' note is printed for it."""
    def rows(*extra):
        rc, out, err = run(capsys, "run", "-p", "512", "-n", "0", "-r", "1", "-q", "-o", "jsonl",
                           "--variant", "baseline,cache_lru", *extra)
        assert rc == 0, err
        return {json.loads(ln)["variant"]: json.loads(ln)["avg_ns"] for ln in out.splitlines()}, err

    warm, _ = rows()
    cold, err = rows("--no-warmup")
    assert "--no-warmup" not in err
    base = next(k for k in warm if "baseline" in k)
    lru = next(k for k in warm if "cache" in k)
    assert cold[base] == warm[base] and cold[lru] > warm[lru]


def test_notes_say_what_ts_and_a_composite_prefetch_variant_do_not_mean(capsys):
    rc, _, err = run(capsys, "run", "h200x2-qwen3-30b-a3b", "-p", "64", "-n", "0", "-r", "1", "-q",
                     "--variant", "baseline", "-ts", "3/1")
    assert rc == 0 and "note: -ts: sets each GPU's layers" in err and "not priced" in err
    rc, _, err = run(capsys, "run", "-p", "64", "-n", "0", "-r", "1", "-q", "--variant", "prefetch_ungated+slots2")
    assert rc == 0 and "variant prefetch_ungated+slots2: weight prefetch (two slots) with 2 expert slots" in err
    assert "max(2, 2) slots" in err
    rc, _, err = run(capsys, "run", "-p", "64", "-n", "0", "-r", "1", "-q", "--variant", "slots2")
    assert rc == 0 and "design of the simulator" not in err


def test_a_model_toml_given_as_the_scenario_and_the_reverse_say_which_is_which(capsys):
    rc, _, err = run(capsys, "run", "scenarios/tiny/tiny-moe.toml", *QUICK)
    assert rc == 2 and "is a model TOML" in err and "-m/--model" in err
    rc, _, err = run(capsys, "run", TINY, "-m", "scenarios/default.toml", *QUICK)
    assert rc == 2 and "is a scenario TOML" in err
    for hw in ("scenarios/hardware/h200.toml", "scenarios/tiny/tiny-gpu.toml"):  # was "missing required field"
        rc, _, err = run(capsys, "run", TINY, "-m", hw, *QUICK)
        assert rc == 2 and f"{hw}: field 'model': is a hardware profile TOML ([hardware]), not a model" in err, err
        assert len(err.strip().splitlines()) == 1
        rc, _, err = run(capsys, "run", hw, *QUICK)  # as the scenario: was "field 'scenario': missing required field"
        assert rc == 2 and f"{hw}: field 'scenario': is a hardware profile TOML ([hardware]), not a scenario" in err
    rc, _, err = run(capsys, "run", TINY, "-m", "nosuchname", *QUICK)
    assert rc == 2 and "unknown model 'nosuchname'" in err and "qwen3-30b-a3b" in err


def test_a_failed_llama_bench_insert_leaves_no_prefetch_sim_row_linked_to_another(capsys):
    """sqlite3's shell runs every statement of a script and reports the ones that fail: a -pw
    run loaded into an upstream database fails each llama_bench INSERT (no prefetch_* columns);
    its prefetch_sim rows must not go in linked to the rows of an earlier run."""
    rc, first, _ = run(capsys, "run", TINY, *QUICK, "-o", "sql")
    assert rc == 0
    rc, patched, _ = run(capsys, "run", TINY, "-r", "1", "-q", "-pw", "0,1", "-pwg", "0", "-o", "sql")
    assert rc == 0
    con = _upstream_db()
    failed = 0
    for script in (first, patched):
        for stmt in (x.strip() for x in script.split(";\n") if x.strip()):
            try:  # as the sqlite3 shell does: report a failed statement, go on
                con.execute(stmt)
            except sqlite3.OperationalError:
                failed += 1
    assert failed == 4  # the -pw run's four llama_bench rows
    links = [r[0] for r in con.execute("SELECT llama_bench_rowid FROM prefetch_sim")]
    assert con.execute("SELECT COUNT(*) FROM llama_bench").fetchone() == (2,)
    assert sorted(links) == [r[0] for r in con.execute("SELECT rowid FROM llama_bench ORDER BY rowid")]


def test_the_kv_advice_names_the_scenario_context_when_it_sizes_the_cache(capsys, tmp_path):
    """Where the scenario's placement.ctx_size, not the tests, sizes the KV cache that overflows,
    shorter -p/-n/-d cannot help: the advice says to lower ctx_size in the scenario."""
    rc, out, err = run(capsys, "run", "laguna-2x3090", "-ncmoe", "20,28", "-p", "512", "-n", "0", *QUICK)
    assert rc == 1 and "-ncmoe 20: left out" in err
    assert "placement.ctx_size, 262144 tokens, sizes it here" in err and "a shorter context" not in err
    # where the tests raise the context, the flags that do are the advice; as llama-bench makes a
    # context per test, the test that fits (depth 0) prints its row, the one that does not is
    # left out (status 1, as for a setting that does not fit)
    rc, out, err = run(capsys, "run", "laguna-2x3090", "-ncmoe", "28", "-p", "512", "-n", "0", "-d", "0,2000000",
                       *QUICK)
    assert rc == 1 and "pp512 @ d2000000: left out, no variant fits: -d 0,2000000 -p 512: does not fit" in err
    assert "a shorter context: -d plus -p/-n" in err and "placement.ctx_size" not in err
    assert "|           pp512 |" in out and "d2000000 |" not in out


def test_a_scenario_naming_a_device_as_its_model_says_so(tmp_path, capsys):
    scn = tmp_path / "s.toml"
    scn.write_text('[scenario]\nname = "x"\nmodel = "/dev/zero"\nhardware = "h200"\n')
    rc, out, err = run(capsys, "run", str(scn), *QUICK)
    assert rc == 2 and "field 'scenario.model': not a regular file" in err


def test_model_filename_is_the_same_path_whichever_way_the_scenario_is_named(capsys, monkeypatch, tmp_path):
    """Without -m, model_filename is the scenario's model file relative to the working folder when
    below it, absolute otherwise, whether the scenario is a built-in name or a path."""
    monkeypatch.chdir(ROOT)
    names = []
    for scn in ("default", "scenarios/default.toml", str(ROOT / "scenarios" / "default.toml")):
        rc, out, err = run(capsys, "run", scn, *QUICK, "-p", "16", "-n", "0", "-o", "jsonl")
        assert rc == 0
        names.append(json.loads(out.splitlines()[0])["model_filename"])
    assert names == ["scenarios/models/qwen3-30b-a3b.toml"] * 3
    monkeypatch.chdir(tmp_path)
    rc, out, err = run(capsys, "run", "default", *QUICK, "-p", "16", "-n", "0", "-o", "jsonl")
    assert json.loads(out.splitlines()[0])["model_filename"] == str((ROOT / "scenarios/models/qwen3-30b-a3b.toml").resolve())


def test_ctx_size_replaces_the_scenario_s_context(capsys):
    """--ctx-size N sizes the KV cache to N tokens instead of the scenario's placement.ctx_size;
    0 is llama-bench's own sizing (the tests' n_prompt + n_gen + n_depth): a placement refused
    for the scenario's 64k context fits, as llama-bench runs it; a bad value is one line."""
    argv = ("run", "qwen3-30b-a3b-rtx3090", "-ncmoe", "0", "-p", "512", "-n", "0", "-b", "4096", "-ub", "4096",
            "-r", "1", "-q", "--variant", "baseline", "-o", "jsonl")
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and "KV 6.00 for 65536 tokens" in err and "--ctx-size" in err
    rc, out, err = run(capsys, *argv, "--ctx-size", "0")
    assert rc == 0, err
    small = json.loads(out)["peak_vram_bytes"]
    rc, out, err = run(capsys, *argv, "--ctx-size", "4096")
    assert rc == 0, err
    # Qwen3-30B-A3B: 48 layers x 4 KV heads x 128 x 2 (K, V) x 2 bytes = 96 KiB per token; and the
    # compute buffer, reserved on min(n_ctx, n_batch, n_ubatch) tokens (512 -> 4096): the worst-case
    # graph's f32 logits of every token and the head's input (151936 + 2048 a token), larger
    # than a layer's activations (ACT_ELEMS_FACTOR residual rows and two of the widest, 8 x 768)
    from sim.model.vram import ACT_ELEMS_FACTOR

    assert 151936 + 2048 > ACT_ELEMS_FACTOR * 2048 + 2 * 8 * 768
    head = 4 * (4096 - 512) * (151936 + 2048)
    assert json.loads(out)["peak_vram_bytes"] - small == pytest.approx((4096 - 512) * 96 * 1024 + head)
    rc, out, err = run(capsys, *argv, "--ctx-size", "65536")   # the flag's context, named as the flag's
    assert rc == 2 and "--ctx-size 65536 sizes it here" in err and "placement.ctx_size" not in err
    rc, out, err = run(capsys, *argv, "--ctx-size", "-3")
    assert rc == 2 and err.count("\n") == 1 and "--ctx-size" in err


def test_list_devices_prints_the_profile_s_gpus_as_llama_bench_and_rpc_is_noted(capsys, tmp_path):
    rc, out, err = run(capsys, "run", "h200x2-qwen3-30b-a3b", "--list-devices")
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "Available devices:" and len(lines) == 3
    assert re.fullmatch(r"  CUDA1: NVIDIA H200 \(\d+ MiB, \d+ MiB free\)", lines[2])
    dest = tmp_path / "sub" / "devices.txt"  # --out takes the list instead of stdout
    rc, out2, err = run(capsys, "run", "h200x2-qwen3-30b-a3b", "--list-devices", "--out", str(dest))
    assert rc == 0 and out2 == "" and dest.read_text() == out
    rc, out, err = run(capsys, "run", TINY, *QUICK, "-p", "16", "-n", "0", "-rpc", "10.0.0.2:50052")
    assert rc == 0 and "-rpc: RPC devices are not modelled" in err


def test_trace_of_a_cache_variant_is_run_s_first_repetition(capsys, tmp_path):
    """An expert cache carries over llama-bench's runs: trace fills it as run does (the earlier
    tests and this test's warm-up), so its makespan is run's first sample of the test."""
    base = ("qwen3-30b-a3b-rtx3090", "-p", "512", "-n", "8", "--variant", "cache_lru", "-q")
    rc, out, err = run(capsys, "run", *base, "-r", "2", "-o", "json")
    assert rc == 0, err
    first = {r["test"]: r["samples_ns"][0] * 1e-6 for r in json.loads(out) if r["variant"] == "cache_lru"}
    for test in ("pp512", "tg8"):
        rc, _out, err = run(capsys, "trace", *base, "--test", test, "--out", str(tmp_path / f"{test}.json"))
        assert rc == 0, err
        got = float(re.search(r"cache_lru / \S+: \d+ ops, makespan ([0-9.]+) ms", err + _out).group(1))
        assert got == pytest.approx(first[test], abs=1e-3)


def test_breakdown_of_one_test_with_a_cache_is_run_s_mean(capsys):
    """breakdown --test X of an expert-cache variant runs the tests before X first, as run does,
    so its test_ms is run's avg_ns of X (it started from a cold cache: a longer time)."""
    base = ("qwen3-30b-a3b-rtx3090", "-p", "512", "-n", "8", "--variant", "cache_lru", "-q", "-r", "2")
    rc, out, err = run(capsys, "run", *base, "-o", "json")
    assert rc == 0, err
    avg = {r["test"]: r["avg_ns"] * 1e-6 for r in json.loads(out) if r["variant"] == "cache_lru"}
    rc, out, err = run(capsys, "breakdown", *base, "--test", "tg8", "-o", "json")
    assert rc == 0, err
    got = {r["test_ms"] for r in json.loads(out) if r["variant"] == "cache_lru"}
    assert len(got) == 1 and got.pop() == pytest.approx(avg["tg8"], abs=1e-6)  # avg_ns: whole ns
    # tables follow the workload's order whatever the order of --test
    rc, out, err = run(capsys, "breakdown", *base, "--test", "tg8", "--test", "pp512", "-o", "json")
    assert rc == 0, err
    order = list(dict.fromkeys(r["test"] for r in json.loads(out)))
    assert order == ["pp512", "tg8"]


def test_a_test_draws_the_same_routing_wherever_it_stands_in_the_list(capsys):
    """The routing draws are seeded by the test, not by its place: pp64 alone and pp64 after
    pp512 give the same samples (they differed by 0.06 % when seeded by position)."""
    base = ("qwen3-30b-a3b-rtx3090", "-n", "0", "--variant", "baseline", "-q", "-r", "3", "-o", "json")
    got = {}
    for p in ("64", "512,64"):
        rc, out, err = run(capsys, "run", *base, "-p", p)
        assert rc == 0, err
        got[p] = [r["samples_ns"] for r in json.loads(out) if r["n_prompt"] == 64]
    assert got["64"] == got["512,64"] and len(got["64"]) == 1


def test_each_row_s_vram_is_its_own_test_s_context(capsys):
    """llama-bench makes a context per test (n_ctx = n_prompt + n_gen + n_depth): with --ctx-size 0 a
    row's peak_vram_bytes is its own test's, whatever deeper tests run beside it (the d0 rows were
    sized for the deepest test's KV cache)."""
    base = ("-ncmoe", "0", "-p", "512", "-n", "32", "--ctx-size", "0", "-r", "1", "--variant", "baseline",
            "-q", "-o", "json")
    rc, out, err = run(capsys, "run", *base, "-d", "0")
    assert rc == 0, err
    alone = {r["test"]: r["peak_vram_bytes"] for r in json.loads(out)}
    rc, out, err = run(capsys, "run", *base, "-d", "0,16384")
    assert rc == 0, err
    both = {r["test"]: r["peak_vram_bytes"] for r in json.loads(out)}
    assert both["pp512"] == alone["pp512"] and both["tg32"] == alone["tg32"]
    # the KV cache grows with the test's context, padded to 256 cells as llama.cpp pads n_ctx:
    # f16 K and V of the 48 layers, 4 KV heads of 128
    per_token = 48 * 2 * 4 * 128 * 2
    assert both["pp512 @ d16384"] - both["pp512"] == 16384 * per_token
    # and the compute buffer is reserved on min(n_ctx, n_batch, n_ubatch) tokens, 512 against 32,
    # every one an output: the f32 logits and the head's input (151936 + 2048 a token)
    head = 4 * (512 - 32) * (151936 + 2048)
    assert both["pp512"] - both["tg32"] == pytest.approx((512 - 256) * per_token + head)


def test_without_flash_attention_the_compute_buffer_holds_a_layer_s_scores(capsys):
    """-fa 0 keeps a layer's f32 KQ scores (n_kv cells x tokens x n_head) in the compute buffer:
    Qwen3 at depth 8192 with -p 512 (a context of 8704 cells, reserved whole): a layer's peak of
    8704 x 512 x 32 x 4 B = 544 MiB of scores and its activations, where -fa 1's peak is the
    worst-case graph's logits (512 x (151936 + 2048) f32, 300.75 MiB). llama.cpp's own compute
    buffers of tg128 at depth 8192 (8448 cells, h200-20261203-tg's logs): 591.29 MiB with -fa 0,
    341.54 with -fa 1; the simulator 576.0 and 300.75."""
    rc, out, err = run(capsys, "run", "-ncmoe", "0", "-p", "512", "-n", "0", "-d", "8192", "-fa", "1,0",
                       "--ctx-size", "0", "-r", "1", "--variant", "baseline", "-q", "-o", "json")
    assert rc == 0, err
    vram = {r["flash_attn"]: r["peak_vram_bytes"] for r in json.loads(out)}
    from sim.model.vram import ACT_ELEMS_FACTOR

    act = 4 * 512 * (ACT_ELEMS_FACTOR * 2048 + 2 * 8 * 768)
    assert vram[0] - vram[1] == pytest.approx(8704 * 512 * 32 * 4 + act - 4 * 512 * (151936 + 2048))


def test_the_vram_table_shows_the_peak_test_whatever_the_order_of_d(capsys):
    """--vram prints, per variant, the test whose VRAM peaks (each test has its own context): the
    same table for -d 0,65536 and -d 65536,0 (it showed the first test's)."""
    tables = []
    for d in ("0,65536", "65536,0"):
        rc, out, err = run(capsys, "run", "-p", "512", "-n", "0", "-d", d, "--ctx-size", "0", "--vram", "-r", "1",
                           "-q", "--variant", "baseline")
        assert rc == 0, err
        tables.append(out[out.index("VRAM by component"):])
    assert tables[0] == tables[1] and "| baseline | 0 | 0.51 | 8.94 | 6.05 |" in tables[0]


def test_trace_of_a_prompt_in_several_ubatches_gives_run_s_time_too(capsys, tmp_path):
    """A prompt of several ubatches: the timeline's makespan holds the next ubatch's host work that
    overlaps the GPU, which run's (llama-bench's) time leaves out; trace prints both, the latter
    equal to run's first sample."""
    base = ("-p", "2048", "-n", "0", "-d", "4096", "--variant", "slots3", "-r", "2")
    rc, out, err = run(capsys, "run", *base, "-q", "-o", "json")
    assert rc == 0, err
    first = {r["variant"]: r["samples_ns"][0] * 1e-6 for r in json.loads(out)}
    rc, out, err = run(capsys, "trace", *base, "--test", "pp2048 @ d4096", "--out", str(tmp_path / "t.json"), "-q")
    assert rc == 0, err
    m = re.search(r"slots3 / pp2048 @ d4096: \d+ ops, makespan ([0-9.]+) ms \(llama-bench's time ([0-9.]+) ms",
                  err + out)
    assert m and float(m.group(1)) > float(m.group(2)) == pytest.approx(first["slots3"], abs=1e-3)


def test_a_sweep_far_over_the_work_budget_is_refused_from_a_partial_sum(capsys, monkeypatch):
    """The work of a run is summed setting by setting and stops once past the budget, so a sweep
    of thousands of prompts over hundreds of ubatches is refused without summing every test (it
    took minutes); the message then says "more than". The distinct tests keep their order."""
    import sim.bounds as bounds
    from sim.cli.benchflags import Instance, sim_tests

    calls = []
    real = bounds.work_units
    monkeypatch.setattr(bounds, "work_units", lambda *a, **k: calls.append(1) or real(*a, **k))
    rc, out, err = run(capsys, "run", TINY, *QUICK, "-p", "1-4096+1", "-ub", "1-64+1", "-n", "0", "--max-work", "1000")
    assert rc == 2 and "--max-work" in err and "more than" in err and out == ""
    # the first setting (4096 prompts at ubatch 1) alone passes the budget: the sum stops there,
    # where it had summed all 64 settings
    assert len(calls) == 1
    rc, _out, err = run(capsys, "run", TINY, *QUICK, "-p", "1-16+1", "-n", "0", "--max-work", "1")
    assert rc == 2 and "would cost " in err and "more than" not in err   # one setting: the whole sum
    t = [Instance(None, p, 0, 0, 50) for p in (4, 2, 4, 1, 2)]
    assert [x.n_prompt for x in sim_tests(t)] == [4, 2, 1]


def test_a_cache_with_whole_tensor_prefetch_notes_that_its_prefill_bypasses_the_cache(capsys):
    """slots3+cache_lru prefilled 2.7x slower than cache_lru with nothing said: its prefill copies
    whole expert tensors and bypasses the cache (docs/model.md); run says so, for that variant only."""
    rc, _out, err = run(capsys, "run", TINY, "-p", "64", "-n", "0", "-r", "1", "-q",
                        "--variant", "cache_lru,slots2+cache_lru")
    assert rc == 0, err
    lines = [ln for ln in err.splitlines() if "bypasses the expert cache" in ln]
    assert len(lines) == 1 and "slots2+cache_lru" in lines[0]


def test_a_weight_type_the_kernel_tables_lack_is_noted():
    """A model whose GPU weights are of a type the llama.cpp profile never measured (Q2_K, IQ4_XS,
    BF16...) had been priced by the generic roofline, which put a Q2_K prefill 3x above Q4_K with
    nothing said: run notes the types and what prices them (a quantised type its family's measured
    types, a float type the roofline, experts of a type without an expert case the dense ratio);
    the shipped models (Q4_K, Q6_K, Q8_0, MXFP4, f32 routers) get none."""
    from dataclasses import replace as _replace

    from sim.cli import untabled_types_note
    from sim.model.specs import load_hardware

    hw = load_hardware(ROOT / "scenarios" / "hardware" / "h200-llamacpp.toml")
    for name in ("qwen3-30b-a3b", "gpt-oss-20b", "gemma3-27b"):
        assert untabled_types_note(load_model(ROOT / "scenarios" / "models" / f"{name}.toml"), hw) is None
    m = load_model(ROOT / "scenarios" / "models" / "qwen3-30b-a3b.toml")
    from types import SimpleNamespace

    q2 = SimpleNamespace(name=m.name, tensors=[_replace(t, ggml_type="Q2_K") if t.name.endswith("attn_q.weight")
                                                else t for t in m.tensors])
    note = untabled_types_note(q2, hw)
    # a quantised type is priced from its family's measured types, and the note says from which
    assert note and "Q2_K from Q4_K" in note and "25 %" in note and "roofline" not in note
    assert "Q2_K unpack at more cost per weight" in note  # a 2-bit type: its error is not bounded so
    bf = SimpleNamespace(name=m.name, tensors=[_replace(t, ggml_type="BF16") if t.name.endswith("attn_q.weight")
                                                else t for t in m.tensors])
    note = untabled_types_note(bf, hw)
    assert note and "BF16 priced by the generic roofline" in note and "MUL_MAT_ID" not in note
    bfx = SimpleNamespace(name=m.name, tensors=[_replace(t, ggml_type="BF16") if "_exps" in t.name else t
                                                 for t in m.tensors])
    note = untabled_types_note(bfx, hw)
    assert note and "expert matmuls of BF16 most" in note and "likely priced too fast" in note
    # Q8_0 experts: Q8_0 has dense cases but no MUL_MAT_ID case (priced silently by the roofline before)
    q8 = SimpleNamespace(name=m.name, tensors=[_replace(t, ggml_type="Q8_0") if "_exps" in t.name else t
                                                for t in m.tensors])
    note = untabled_types_note(q8, hw)
    assert note and "expert matmuls of Q8_0 (no MUL_MAT_ID case)" in note
    assert untabled_types_note(q2, load_hardware(ROOT / "scenarios" / "hardware" / "h200.toml")) is None


def test_trace_says_which_repetition_it_shows(capsys, tmp_path):
    """trace draws llama-bench's first timed repetition (its CUDA-graph capture included), where
    run and breakdown give the mean over -r: with -r above 1 its line says so (the two disagreed
    with nothing said), with -r 1 there is nothing to tell apart."""
    out = str(tmp_path / "t.json")
    rc, o, err = run(capsys, "trace", TINY, "-p", "64", "-n", "0", "-r", "3", "--variant", "baseline", "--out", out)
    assert rc == 0, err
    assert "first timed repetition" in err + o and "the mean of 3" in err + o
    rc, o, err = run(capsys, "trace", TINY, "-p", "64", "-n", "0", "-r", "1", "--variant", "baseline", "--out", out)
    assert rc == 0, err
    assert "first timed repetition" not in err + o


def test_a_thread_count_other_than_the_profile_s_is_refused_where_weights_are_on_the_host(capsys):
    """-t changes the CPU's speed, which the profile's CPU figures (measured with its host_cpus
    threads) do not follow: with experts on the host a -t 1,4,16,64 sweep printed four identical
    rows under four labels. Refused there (one line naming -t), left out with --skip-unmodelled;
    the profile's own count, and any count on a fully resident setting, run."""
    rc, _, err = run(capsys, "run", "-t", "4", "-p", "64", "-n", "0", "-r", "1", "-q", "--variant", "baseline")
    assert rc == 2 and "field '-t/--threads'" in err and "measured with 16 threads" in err
    assert len([ln for ln in err.splitlines() if "error" in ln]) == 1
    rc, out, err = run(capsys, "run", "-t", "4,16", "-p", "64", "-n", "0", "-r", "1", "-q", "--variant", "baseline",
                       "-o", "jsonl", "--skip-unmodelled")
    assert rc == 0 and [json.loads(ln)["n_threads"] for ln in out.splitlines()] == [16]
    assert "-t 4: left out (--skip-unmodelled)" in err
    rc, out, _ = run(capsys, "run", "-t", "4", "-ncmoe", "0", "-p", "64", "-n", "0", "-r", "1", "-q",
                     "--variant", "baseline", "-o", "jsonl")
    assert rc == 0 and json.loads(out.splitlines()[0])["n_threads"] == 4


def test_the_fit_says_it_replaces_the_scenario_s_own_placement(capsys):
    """-fitt without -ncmoe on the command line replaced the default scenario's -ncmoe 24 (the fit
    put every expert on the GPU) with no note, the row printing n_cpu_moe 24: the note names it."""
    rc, out, err = run(capsys, "run", "-fitt", "1024", "-p", "64", "-n", "0", "-r", "1", "-q", "--variant", "baseline",
                       "-o", "jsonl")
    assert rc == 0 and json.loads(out.splitlines()[0])["n_cpu_moe"] == 24
    assert "replaces the scenario's -ncmoe 24" in err


def test_a_variant_s_build_number_is_the_same_in_every_run(capsys):
    """build_number was the variant's position in --variant: slots3 printed 1 or 0 by the order
    given. Now fixed by the variant (baseline 0, the lowest), as build_commit."""
    got = []
    for order in ("baseline,slots3", "slots3,baseline"):
        rc, out, _ = run(capsys, "run", "--variant", order, "-p", "64", "-n", "0", "-r", "1", "-q", "-o", "jsonl")
        assert rc == 0
        got.append({json.loads(ln)["variant"]: (json.loads(ln)["build_number"], json.loads(ln)["build_commit"])
                    for ln in out.splitlines()})
    assert got[0] == got[1] and got[0]["baseline"][0] == 0 and got[0]["slots3"][0] > 0


def test_a_context_past_the_trained_one_is_noted(capsys):
    """-d 65536 on Qwen3-30B-A3B (trained for 40960 tokens) ran with no word of it, where llama.cpp
    warns: one note, naming n_ctx_train; none within the trained context."""
    rc, _, err = run(capsys, "run", "-p", "0", "-n", "16", "-d", "65536", "-r", "1", "-q", "--variant", "baseline")
    assert rc == 0 and err.count("n_ctx_train") == 1 and "65,552 tokens" in err and "40,960" in err
    rc, _, err = run(capsys, "run", "-p", "512", "-n", "16", "-r", "1", "-q", "--variant", "baseline")
    assert rc == 0 and "n_ctx_train" not in err


def test_a_two_gpu_scenario_says_the_crossing_between_gpus_is_not_priced(capsys):
    """The activations crossing between GPUs are not priced: said with -ts (as before) and now
    also for a two-GPU scenario's own split (a -ts-free run said nothing); not on one GPU."""
    rc, _, err = run(capsys, "run", "h200x2-qwen3-30b-a3b", "-p", "64", "-n", "0", "-r", "1", "-q",
                     "--variant", "baseline")
    assert rc == 0 and "-sm layer over 2 GPUs" in err and "not priced" in err
    rc, _, err = run(capsys, "run", "-p", "64", "-n", "0", "-r", "1", "-q", "--variant", "baseline")
    assert rc == 0 and "not priced" not in err


def test_the_fit_margin_is_left_free_not_counted_as_used(capsys):
    """-fitt M holds M MiB as reserved VRAM to size the fit, but llama.cpp leaves them free: the
    same placement printed 17.97, 18.97 and 25.97 GiB at -fitt 0, 1024 and 8192. Now one figure."""
    peaks = []
    for extra in ([], ["-fitt", "1024"], ["-fitt", "8192"]):
        rc, out, _ = run(capsys, "run", "-ncmoe", "0", "--ctx-size", "0", *extra, "-p", "64", "-n", "0", "-r", "1",
                         "-q", "--variant", "baseline", "-o", "jsonl")
        assert rc == 0
        peaks.append(json.loads(out.splitlines()[0])["peak_vram_bytes"])
    assert peaks[0] == peaks[1] == peaks[2]


def test_an_iq4_nl_kv_cache_under_flash_attention_is_not_modelled_and_other_pairs_say_their_conversion(capsys):
    """ggml-cuda's FlashAttention has no kernel for an iq4_nl K or V cache
    (ggml_cuda_fattn_kv_type_supported): llama.cpp runs every layer's attention on the CPU, where
    the simulator had printed the f16 row's numbers (fresh-user round 5). run refuses it naming
    -ctk/-ctv (--skip-unmodelled leaves it out), -fa 0 runs; a pair of supported types that the
    default build has no kernel for (q5_1/f16) is converted to F16 in every call, said in the
    note; a compiled pair (q8_0/q8_0) is not; crossover's kv axis refuses iq4_nl."""
    from sim.errors import ScenarioError
    from sim.views.crossover import parse_axis

    common = ("-ngl", "99", "-ncmoe", "0", "-p", "64", "-n", "0", "-r", "1", "--variant", "baseline", "-q")
    rc, _, err = run(capsys, "run", *common, "-fa", "1", "-ctk", "iq4_nl", "-ctv", "f16")
    assert rc == 2 and "field '-ctk/-ctv'" in err and "no kernel for" in err and err.count("\n") == 1
    rc, out, err = run(capsys, "run", *common, "-fa", "1", "-ctk", "f16,iq4_nl", "--skip-unmodelled")
    assert rc == 0 and out.count("pp64 |") == 1
    rc, _, err = run(capsys, "run", *common, "-fa", "0", "-ctk", "iq4_nl", "-ctv", "f16")
    assert rc == 0, err
    rc, _, err = run(capsys, "run", *common, "-fa", "1", "-ctk", "q5_1", "-ctv", "f16")
    assert rc == 0 and "and decode's too (the default build has no kernel for q5_1/f16" in err
    rc, _, err = run(capsys, "run", *common, "-fa", "1", "-ctk", "q8_0", "-ctv", "q8_0")
    assert rc == 0 and "prefill kernels convert the quantised K/V to F16" in err and "decode's too" not in err
    with pytest.raises(ScenarioError, match="iq4_nl is not modelled"):
        parse_axis("kv=f16,iq4_nl")
    # -fa auto: an iq4_nl K with an unquantised V turns FlashAttention off (llama_context's
    # resolve of the FA probe: "not supported, set to disabled"), priced as -fa 0, said; an iq4_nl
    # V forces it on (quantised V) and is refused; -fa 0 says nothing of FlashAttention
    # (fresh-user round 6: auto had been refused, -fa 0 had carried the FlashAttention note)
    rc, out_auto, err = run(capsys, "run", *common, "-fa", "auto", "-ctk", "iq4_nl", "-ctv", "f16", "-o", "jsonl")
    assert rc == 0 and "llama.cpp turns FlashAttention off" in err
    rc, out_off, err = run(capsys, "run", *common, "-fa", "0", "-ctk", "iq4_nl", "-ctv", "f16", "-o", "jsonl")
    assert rc == 0 and "FlashAttention" not in err
    import json as _json

    auto, off = _json.loads(out_auto.splitlines()[0]), _json.loads(out_off.splitlines()[0])
    assert auto["avg_ts"] == off["avg_ts"] and auto["flash_attn"] == -1 and off["flash_attn"] == 0
    rc, _, err = run(capsys, "run", *common, "-fa", "auto", "-ctk", "f16", "-ctv", "iq4_nl")
    assert rc == 2 and "field '-ctk/-ctv'" in err


def test_a_setting_whose_context_llama_cpp_refuses_is_left_out_after_the_others_rows(capsys):
    """llama-bench runs its settings in order and stops with status 1 at a context it cannot
    create, after the rows before it: -ctv q4_0 -fa 1,0 prints the -fa 1 rows, then one error line
    for -fa 0, exit 1 (fresh-user round 11: the whole run had been refused, exit 2). Alone, the
    refused setting is the error (exit 2, naming -ctv), as before; two refused name both."""
    common = ("-ngl", "99", "-ncmoe", "0", "-p", "64", "-n", "0", "-r", "1", "--variant", "baseline", "-q", "-o", "jsonl")
    rc, out, err = run(capsys, "run", *common, "-ctv", "q4_0", "-fa", "1,0")
    rows = [json.loads(x) for x in out.splitlines()]
    assert rc == 1 and [r["flash_attn"] for r in rows] == [1]
    errors = [x for x in err.splitlines() if "error:" in x]
    assert errors == ["prefetch-sim: error: -fa 0: left out: -ctv q4_0 with -fa off: llama.cpp refuses this context "
                      "(V cache quantization requires flash_attn)"]
    rc, out, err = run(capsys, "run", *common, "-ctv", "q4_0", "-fa", "0")
    assert rc == 2 and out == "" and "field '-ctv'" in err and "requires flash_attn" in err
    rc, out, err = run(capsys, "run", *common, "-ctv", "q4_0,q8_0", "-fa", "0")
    assert rc == 2 and out == "" and "-ctv q8_0 does not run either" in err


def test_a_quantised_kv_whose_block_does_not_divide_the_head_size_is_refused_with_flash_attention(capsys, tmp_path):
    """llama.cpp refuses a context with FlashAttention on or auto and a quantised K (or V) cache
    whose 32-element block does not divide the head size ("K cache type q8_0 with block size 32
    does not divide n_embd_head_k=80"): a head size of 80 had printed t/s (fresh-user round 6).
    run refuses it naming -ctk; -fa 0 with a quantised K runs; compare does not score such a row."""
    from sim.model.specs import load_model
    from sim.views.llamabench import kv_context_error

    src = (ROOT / "scenarios" / "models" / "qwen3-30b-a3b.toml").read_text()
    f = tmp_path / "hd80.toml"
    f.write_text(src.replace("head_dim = 128", "head_dim = 80"))
    common = ("-m", str(f), "-ngl", "99", "-ncmoe", "0", "-p", "64", "-n", "0", "-r", "1", "--variant", "baseline",
              "-q")
    rc, _, err = run(capsys, "run", *common, "-fa", "on", "-ctk", "q8_0")
    assert rc == 2 and "field '-ctk'" in err and "does not divide the head size 80" in err and err.count("\n") == 1
    rc, _, err = run(capsys, "run", *common, "-fa", "auto", "-ctk", "f16", "-ctv", "q8_0")
    assert rc == 2 and "field '-ctv'" in err
    rc, _, err = run(capsys, "run", *common, "-fa", "0", "-ctk", "q8_0")
    assert rc == 0, err
    m = load_model(f)
    assert kv_context_error(m, "on", "q4_0", "f16")[0] == "type_k"
    assert kv_context_error(m, "off", "q4_0", "f16") is None
    assert kv_context_error(load_model(ROOT / "scenarios" / "models" / "qwen3-30b-a3b.toml"), "on", "q4_0",
                            "q4_0") is None


def test_a_routing_trace_shorter_than_the_ubatch_is_noted(tmp_path, capsys):
    """A trace of 64 tokens under 512-token ubatches is replayed 8 times and copies what 64 tokens
    use: said on stderr (fresh-user round 8: silent, and prefetch's gain moved from +16 % to +0.5 %);
    ubatches within the trace say nothing."""
    src = (ROOT / "scenarios" / "laguna-2x3090.toml").read_text()
    trace = (ROOT / "scenarios" / "traces" / "example_skewed_256x10.csv").as_posix()
    i = src.index("[routing]")
    j = src.find("\n[", i + 1)
    src = src[:i] + f'[routing]\nkind = "trace"\ntrace_file = "{trace}"\n' + (src[j:] if j >= 0 else "")
    scn = tmp_path / "laguna-trace.toml"
    scn.write_text(src)
    rc, _out, err = run(capsys, "run", str(scn), "-p", "512", "-n", "0", "-r", "1", "--variant", "baseline", "-q")
    assert rc == 0 and "holds 64 tokens; a ubatch of 512 replays them 8 times" in err
    rc, _out, err = run(capsys, "run", str(scn), "-p", "64", "-n", "0", "-r", "1", "--variant", "baseline", "-q")
    assert rc == 0 and "routing trace" not in err
    # a -m model the trace does not serve (dense; or another MoE: uniform routing) gets no note on
    # it (fresh-user round 10)
    for m in ("llama3-8b.toml", "qwen3-30b-a3b.toml"):
        rc, _out, err = run(capsys, "run", str(scn), "-m", str(ROOT / "scenarios" / "models" / m), "-p", "512",
                            "-n", "0", "-r", "1", "--variant", "baseline", "-q", "--ctx-size", "0")
        assert rc == 0 and "replays them" not in err


def test_run_out_never_replaces_an_input(tmp_path, capsys):
    """run --out naming the -m model or the scenario is refused before any work (fresh-user round 8:
    the model TOML, the scenario and a GGUF had been replaced by the rows)."""
    model = tmp_path / "m.toml"
    model.write_text((ROOT / "scenarios" / "models" / "llama3-8b.toml").read_text())
    before = model.read_bytes()
    rc, _out, err = run(capsys, "run", TINY, "-m", str(model), "-p", "64", "-n", "0", "-r", "1", "-q", "--out", str(model))
    assert rc == 2 and "an input of this run" in err and "--out" in err and model.read_bytes() == before
    scn = tmp_path / "s.toml"
    scn.write_text(Path(TINY).read_text().replace('"tiny-', f'"{(Path(TINY).parent).as_posix()}/tiny-'))
    before = scn.read_bytes()
    rc, _out, err = run(capsys, "run", str(scn), "-p", "64", "-n", "0", "-r", "1", "-q", "--out", str(scn))
    assert rc == 2 and "is the scenario" in err and scn.read_bytes() == before


def test_breakdown_trace_and_list_devices_never_replace_an_input(tmp_path, capsys):
    """breakdown, trace and --list-devices refuse an --out that names an input (the scenario, a -m
    model, a routing trace), a kernel table of the profile or any existing TOML or GGUF; trace
    --list-devices prints the list and leaves its --out alone (fresh-user round 9: each had been
    replaced, a GGUF by a markdown table, the shipped kernel table by the rows)."""
    scn = tmp_path / "s.toml"
    scn.write_text(Path(TINY).read_text().replace('"tiny-', f'"{(Path(TINY).parent).as_posix()}/tiny-'))
    before = scn.read_bytes()
    rc, _out, err = run(capsys, "breakdown", str(scn), "-p", "64", "-n", "0", "-r", "1", "-q", "--out", str(scn))
    assert rc == 2 and "is the scenario" in err and "--out" in err and scn.read_bytes() == before
    rc, _out, err = run(capsys, "trace", str(scn), "-p", "64", "-n", "0", "-q", "--out", str(scn))
    assert rc == 2 and scn.read_bytes() == before   # .toml: not a trace name either
    gguf = tmp_path / "m.json"
    gguf.write_bytes(b"GGUF" + b"\0" * 60)          # a GGUF under another name: still refused
    rc, _out, err = run(capsys, "breakdown", str(scn), "-p", "64", "-n", "0", "-r", "1", "-q", "-o", "json", "--out", str(gguf))
    assert rc == 2 and "existing GGUF" in err and gguf.read_bytes()[:4] == b"GGUF"
    other = tmp_path / "other.toml"
    other.write_text("x = 1\n")
    rc, _out, err = run(capsys, "run", str(scn), "--list-devices", "--out", str(other))
    assert rc == 2 and "existing TOML" in err and other.read_text() == "x = 1\n"
    # the shipped profile's kernel table, named from another folder
    table = ROOT / "scenarios" / "hardware" / "h200-llamacpp" / "kernels-cpu.csv"
    tb = table.read_bytes()
    rc, _out, err = run(capsys, "run", "-p", "64", "-n", "0", "-r", "1", "-q", "-o", "csv", "--out", str(table))
    assert rc == 2 and "kernel table" in err and table.read_bytes() == tb
    trace_out = tmp_path / "trace.json"
    trace_out.write_text("{}")
    rc, out, _err = run(capsys, "trace", str(scn), "--list-devices", "--out", str(trace_out))
    assert rc == 0 and "Available devices" in out and trace_out.read_text() == "{}"


def test_fitt_on_a_dense_model_is_refused_or_left_out(capsys):
    """llama-bench's fit lowers -ngl on a dense model: not modelled, so run refuses it naming -fitt
    (it had printed -ngl as given under the row's -fitt, a note only: fresh-user round 8) and
    --skip-unmodelled leaves it out while a MoE model in the same list is fitted."""
    dense = str(ROOT / "scenarios" / "models" / "llama3-8b.toml")
    moe = str(ROOT / "scenarios" / "models" / "qwen3-30b-a3b.toml")
    rc, _out, err = run(capsys, "run", "-m", dense, "-fitt", "1024", "-p", "64", "-n", "0", "-r", "1", "-q")
    assert rc == 2 and "-fitt/--fit-target" in err and "dense model" in err
    rc, out, err = run(capsys, "run", "-m", f"{dense},{moe}", "-fitt", "1024", "-p", "64", "-n", "0", "-r", "1", "-q",
                       "--skip-unmodelled", "--variant", "baseline", "-o", "jsonl")
    rows = [json.loads(x) for x in out.splitlines()]
    assert rc == 0 and rows and all("qwen3moe" in r["model_type"] for r in rows) and "left out" in err


def test_reproduce_out_never_replaces_the_published_figures(capsys):
    """reproduce --out naming data/reported_measurements.csv is refused before any work (fresh-user
    round 9: it was replaced by the table, and the next reproduce died with a KeyError)."""
    from sim.views.reproduce import REPORTED_CSV

    before = REPORTED_CSV.read_bytes()
    rc, _out, err = run(capsys, "reproduce", "-r", "1", "-q", "--out", str(REPORTED_CSV))
    assert rc == 2 and "published figures" in err and REPORTED_CSV.read_bytes() == before


def test_tensor_split_with_more_shares_than_gpus_takes_the_first_as_llama_cpp_does():
    """llama.cpp copies the first n_devices shares of -ts (llama_model::load_tensors) and splits by
    free memory only when those are all zero: 3/1/5 on two GPUs is 3/1, 0/0/5 the default split."""
    from dataclasses import replace as dc_replace

    from sim.views.llamabench import row_placement

    model = load_model("scenarios/models/qwen3-30b-a3b.toml")
    row = json.loads(Path("data/llamacpp/h200-20261201/llama-bench.jsonl").read_text().splitlines()[0])
    terms = row_terms(row)
    placement = lambda shares: row_placement(dc_replace(terms, tensor_split=shares), model, 2)  # noqa: E731
    pl, notes = placement((3.0, 1.0, 5.0))
    assert pl.tensor_split == placement((3.0, 1.0))[0].tensor_split == (3.0, 1.0)
    assert any("reads the first 2 (3/1)" in n for n in notes)
    pl, notes = placement((0.0, 0.0, 5.0))
    assert pl.tensor_split == () and any("all zero, its default split" in n for n in notes)
    assert placement((3.0, 1.0, 0.0)) == (placement((3.0, 1.0))[0], placement((3.0, 1.0))[1])


@pytest.mark.parametrize("pattern, nested", [
    ("(.*.*)*X", True), ("(a+)+b", True), ("((a|b)*c)*", True), ("x(?=(a*)*)", True),
    (r"blk\.\d+\.ffn_.*_exps", False), (r"blk\.(1|2)\.ffn_(up|gate)_exps", False), ("(ab){2,5}", False),
    (r"(blk\.\d+\.)?ffn", False),
])
def test_an_ot_pattern_with_exponential_matching_is_a_one_line_error(capsys, pattern, nested):
    """-ot "(.*.*)*X=CPU" ran for minutes in the regex engine (fresh-user round 10): a group
    repeated without bound inside another such repetition is refused, naming -ot."""
    import time

    from sim.model.specs import nested_repeat

    assert (nested_repeat(pattern) is not None) == nested
    if nested and "=" not in pattern:   # llama-bench splits a rule at its first '='
        t0 = time.monotonic()
        rc, _, err = run(capsys, "run", "-p", "64", "-n", "0", "-r", "1", "-q", "--variant", "baseline",
                         "-ot", f"{pattern}=CPU")
        assert rc == 2 and "field '-ot'" in err and "exponential time" in err and len(err.strip().splitlines()) == 1
        assert time.monotonic() - t0 < 60   # a bound on a hang, not a speed figure


def test_a_scenario_ot_rule_with_exponential_matching_names_its_field(tmp_path):
    from sim.errors import ScenarioError
    from sim.model.specs import load_scenario

    src = Path("scenarios/default.toml").read_text()
    p = tmp_path / "s.toml"
    p.write_text(src.replace("[placement]", '[placement]\noverride_tensor = ["(a+)+b=CPU"]', 1)
                 .replace('model = "', f'model = "{Path("scenarios").resolve()}/').replace(
                     'hardware = "', f'hardware = "{Path("scenarios").resolve()}/'))
    with pytest.raises(ScenarioError, match="exponential time") as exc:
        load_scenario(p)
    assert "override_tensor[0]" in str(exc.value.field)


@pytest.mark.parametrize("pattern, what", [
    ("(?i)EXPS", "inline flags"), ("(?P<x>exps)", "named group"),
    (r"exps\.weight\Z", r"\Z"), ("(?x) e x p s ", "inline flags"), ("exps(?#c)", "comment"),
    ("(?<!attn_)up_exps", "lookbehind"), ("(?>ffn)_up", "atomic group"), ("ffn_u+p", None), ("_ex+ps", None),
    ("ffn_up_ex+ps", None), ("f+?n_up", None), ("blk\\.1\\.ffn_(?:up|gate)_exps(?!_)", None), ("[[:alpha:]]+_exps", None),
    ("[(?i)]", None), ("exps*+", "possessive"), ("ex{1}+ps", "possessive"),
])
def test_an_ot_pattern_that_std_regex_refuses_is_a_one_line_error(capsys, pattern, what, tmp_path):
    """llama.cpp compiles -ot with std::regex (ECMAScript): Python-only syntax such as (?i) or
    \\Z makes llama-bench throw when it loads the model; it ran here (fresh-user round 11). Now
    the rule is refused, on the CLI naming -ot and in a scenario naming override_tensor[i];
    ECMAScript's own syntax (non-capturing groups, lookahead, lazy quantifiers, POSIX classes)
    still runs."""
    from sim.errors import ScenarioError
    from sim.model.specs import load_scenario, python_only_syntax

    got = python_only_syntax(pattern)
    assert (got is None) == (what is None) and (what is None or what in got)
    assert "=" not in pattern and "," not in pattern   # llama-bench splits rules there
    rc, _, err = run(capsys, "run", "-p", "64", "-n", "0", "-r", "1", "-q", "--variant", "baseline",
                     "-ot", f"{pattern}=CPU")
    if what is None:
        assert rc == 0
        return
    assert rc == 2 and "field '-ot'" in err and "std::regex" in err and len(err.strip().splitlines()) == 1
    src = Path("scenarios/default.toml").read_text()
    p = tmp_path / "s.toml"
    rule = pattern.replace("\\", "\\\\")
    p.write_text(src.replace("[placement]", f'[placement]\noverride_tensor = ["{rule}=CPU"]', 1)
                 .replace('model = "', f'model = "{Path("scenarios").resolve()}/').replace(
                     'hardware = "', f'hardware = "{Path("scenarios").resolve()}/'))
    with pytest.raises(ScenarioError, match="std::regex") as exc:
        load_scenario(p)
    assert "override_tensor[0]" in str(exc.value.field)


def test_m_alone_says_the_tests_and_placement_come_from_the_scenario(capsys):
    """-m without -p/-n runs the scenario's tests: said, as the placement taken from it is (fresh-
    user round 10); a dense -m model is not told of the scenario's -ncmoe in that note."""
    m = str(ROOT / "scenarios" / "models" / "llama3-8b.toml")
    rc, _, err = run(capsys, "run", "-m", m, "-q", "--variant", "baseline", "-r", "1")
    assert rc == 0 and "-m: the tests come from the scenario (pp64, pp512, pp2048, tg128)" in err
    placement = next(ln for ln in err.splitlines() if "placement comes from the scenario" in ln)
    assert "-ncmoe 24" not in placement
    rc, _, err = run(capsys, "run", "-m", m, "-q", "--variant", "baseline", "-r", "1", "-p", "64", "-n", "0")
    assert rc == 0 and "tests come from the scenario" not in err


def test_the_kv_context_note_says_when_ctx_size_is_the_default(tmp_path, capsys):
    s = tmp_path / "s.toml"
    s.write_text(f'[scenario]\nname = "x"\nmodel = "{ROOT}/scenarios/models/qwen3-30b-a3b.toml"\n'
                 f'hardware = "{ROOT}/scenarios/hardware/h200-llamacpp.toml"\n[placement]\nngl = 999\n'
                 '[[variant]]\nspec = "baseline"\n')
    rc, _, err = run(capsys, "run", str(s), "-p", "64", "-n", "0", "-q", "--vram", "-r", "1")
    assert rc == 0 and "4096 tokens" in err and "its default where a scenario sets none" in err


@pytest.mark.parametrize("cmd", ["breakdown", "trace", "check"])
@pytest.mark.parametrize("flags, field", [
    (("-nkvo", "1"), "-nkvo"), (("-embd", "1"), "-embd"), (("-t", "4"), "-t/--threads"),
    (("-fa", "1", "-ctk", "iq4_nl", "-ctv", "iq4_nl"), "-ctk/-ctv"),
])
def test_one_setting_commands_refuse_what_run_refuses_as_not_modelled(capsys, tmp_path, cmd, flags, field):
    """breakdown, trace and check simulate one setting: one that run refuses as not modelled
    (it would print another configuration's numbers) is refused there too, naming the flag (fresh-
    user round 12: breakdown -nkvo 1 printed the -nkvo 0 time, exit 0); the same command without
    the flag runs."""
    out = ["--out", str(tmp_path / "t.json")] if cmd == "trace" else []
    base = (cmd, "-p", "64", "-n", "0", "--variant", "baseline", *out)
    base = base + (("-q",) if cmd != "check" else ())
    rc, _, err = run(capsys, *base, *flags)
    assert rc == 2 and f"field '{field}" in err and ("not modelled" in err or "not rescaled" in err), err
    assert not (tmp_path / "t.json").exists()
    rc, _, err = run(capsys, *base)
    assert rc == 0, err


def test_outputs_never_replace_shipped_inputs_or_the_documentation(tmp_path, monkeypatch, capsys):
    """An output may not replace a shipped input (scenarios/, the published measurements, a
    calibration's raw logs) or the documentation (fresh-user round 12: trace --out
    data/reported_measurements.csv, fit --out scenarios/hardware/h200.toml, vramcheck --out
    README.md all wrote there); docs/figures and new files stay writable. The shipped root is a
    copy in tmp_path here, so a failing guard writes nothing of the checkout."""
    import sim.resources as res
    from calibrate.llamacpp.compare import check_outputs_spare_inputs
    from sim.errors import ScenarioError

    root = tmp_path / "root"
    files = {"scenarios/traces/t.csv": "a shipped input", "data/reported_measurements.csv": "published measurements",
             "data/calibration/h200-x/copies.csv": "raw logs", "README.md": "documentation",
             "docs/model.md": "documentation", "LICENSE": "documentation"}
    for rel in [*files, "docs/figures/f.csv", "data/llamacpp/run/compare_llamacpp.md"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x\n")
    monkeypatch.setattr(res, "shipped_root", lambda: root)
    for rel, words in files.items():
        assert words in (res.shipped_input(root / rel) or ""), rel
    for rel in ("docs/figures/f.csv", "data/llamacpp/run/compare_llamacpp.md", "docs/new.md", "scenarios/new.toml"):
        assert res.shipped_input(root / rel) is None, rel
    rc, _, err = run(capsys, "run", TINY, *QUICK, "-p", "16", "-n", "0", "--out", str(root / "README.md"))
    assert rc == 2 and "the project's documentation" in err and "an input of this run" not in err
    with pytest.raises(ScenarioError, match="a shipped input"):
        check_outputs_spare_inputs({"--out": str(root / "scenarios/traces/t.csv")})
    assert all((root / rel).read_text() == "x\n" for rel in files)


def test_calibrate_raw_dir_must_be_new_or_empty(tmp_path, capsys):
    """--raw-dir over another calibration's logs mixed (or replaced) them (fresh-user round 12):
    a folder that holds files is refused before anything is measured; an empty one is taken."""
    from calibrate.cli import main as cal_main

    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "copies.csv").write_text("kept\n")
    assert cal_main(["--out", str(tmp_path / "p.toml"), "--fake-gpu", "--quick", "--rounds", "1", "-q",
                     "--raw-dir", str(raw)]) == 2
    assert "--raw-dir" in capsys.readouterr().err and (raw / "copies.csv").read_text() == "kept\n"
    assert not (tmp_path / "p.toml").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cal_main(["--out", str(tmp_path / "p.toml"), "--fake-gpu", "--quick", "--rounds", "1", "-q",
                     "--raw-dir", str(empty)]) == 0
