"""Command line: user errors are one line naming the flag or field, exit 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from sim.cli import main
from sim.errors import ScenarioError
from sim.model.specs import load_scenario, parse_variant
from sim.tomlio import load_toml

from scenario_factory import ROOT

TINY = str(ROOT / "scenarios" / "tiny" / "tiny.toml")


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, out, err


def test_run_csv_has_speedups_against_baseline_even_when_not_asked(capsys):
    rc, out, _ = run(capsys, "run", TINY, "-r", "1", "-q", "-o", "csv", "--variant", "slots2",
                     "--variant", "prefetch_ungated")
    assert rc == 0
    df = pd.read_csv(pd.io.common.StringIO(out))
    assert df.variant.iloc[0] == "baseline" and df[df.variant == "baseline"].speedup_vs_baseline.isna().all()
    base = df[df.variant == "baseline"].set_index("test").avg_ts
    for r in df[df.variant != "baseline"].itertuples():
        assert r.speedup_vs_baseline == pytest.approx(r.avg_ts / base[r.test])


def test_out_is_a_folder(capsys, tmp_path):
    rc, _, err = run(capsys, "run", TINY, "-r", "1", "-q", "--out", str(tmp_path))
    assert rc == 2 and "--out" in err and "folder" in err
    assert list(tmp_path.iterdir()) == []


def test_trace_rejects_unknown_extension_and_traces_every_variant(capsys, tmp_path):
    rc, _, err = run(capsys, "trace", TINY, "--out", str(tmp_path / "t.txt"))
    assert rc == 2 and "--out" in err
    rc, out, _ = run(capsys, "trace", TINY, "--variant", "baseline", "--variant", "slots2",
                     "--out", str(tmp_path / "t.json"))
    assert rc == 0 and "baseline / pp64" in out and "slots2 / pp64" in out
    doc = json.loads((tmp_path / "t.json").read_text())
    assert any(e["ph"] == "X" for e in doc["traceEvents"])


@pytest.mark.parametrize("argv,flag", [
    (["--variant", "baseline", "--variant", "baseline"], "--variant"),
    (["--variant", "slots2+slots3"], "--variant"),
    (["-ub", "0"], "-ub/--ubatch-size"),
    (["-b", "0"], "-b/--batch-size"),
])
def test_bad_flags_name_the_flag(capsys, argv, flag):
    rc, _, err = run(capsys, "run", TINY, "-r", "1", "-q", *argv)
    assert rc == 2 and flag in err


@pytest.mark.parametrize("text", ["prefetch_ungated+prefetch_gated_512", "cache_lru+cache_lfu", "slots2+slots4"])
def test_contradictory_variant_combinations(text):
    with pytest.raises(ScenarioError, match="contradict"):
        parse_variant(text)


def test_non_utf8_scenario_is_a_clean_error(tmp_path):
    p = tmp_path / "bin.toml"
    p.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ScenarioError, match="UTF-8") as exc:
        load_toml(p)
    assert str(p) in str(exc.value)


def test_depth_beyond_ctx_size_raises_the_context(capsys):
    small = load_scenario(TINY)
    rc, out, _ = run(capsys, "run", TINY, "-r", "1", "-q", "-o", "csv", "-p", "64", "-n", "0", "--vram",
                     "--variant", "baseline")
    rc2, out2, _ = run(capsys, "run", TINY, "-r", "1", "-q", "-o", "csv", "-p", "64", "-n", "0",
                       "-d", str(10 * small.placement.ctx_size), "--variant", "baseline")
    assert rc == rc2 == 0
    v1 = pd.read_csv(pd.io.common.StringIO(out)).peak_vram_bytes.iloc[0]
    v2 = pd.read_csv(pd.io.common.StringIO(out2)).peak_vram_bytes.iloc[0]
    assert v2 > v1  # the KV cache was sized for depth + tokens


def test_reproduce_rejects_zero_repetitions(capsys):
    rc, _, err = run(capsys, "reproduce", "-r", "0")
    assert rc == 2 and "-r/--repetitions" in err


def test_out_writes_through_symlinks_and_special_files(capsys, tmp_path):
    target = tmp_path / "target.md"
    target.write_text("old")
    link = tmp_path / "link.md"
    link.symlink_to(target)
    rc, _, _ = run(capsys, "run", TINY, "-r", "1", "-q", "-n", "0", "--out", str(link))
    assert rc == 0 and link.is_symlink() and "| model" in target.read_text()
    rc, _, _ = run(capsys, "run", TINY, "-r", "1", "-q", "-n", "0", "--out", "/dev/null")
    assert rc == 0 and not Path("/dev/null").is_file()


def test_a_variant_named_baseline_must_be_the_baseline(tmp_path):
    text = (ROOT / "scenarios" / "tiny" / "tiny.toml").read_text()
    text = text.replace('model = "tiny-moe.toml"', f'model = "{ROOT}/scenarios/tiny/tiny-moe.toml"')
    text = text.replace('hardware = "tiny-gpu.toml"', f'hardware = "{ROOT}/scenarios/tiny/tiny-gpu.toml"')
    text += '\n[[variant]]\nname = "baseline"\nspec = "prefetch_ungated"\n'
    text = text.replace('[[variant]]\nspec = "baseline"\n', "")
    p = tmp_path / "s.toml"
    p.write_text(text)
    with pytest.raises(ScenarioError, match="reserved") as exc:
        load_scenario(p)
    assert str(p) in str(exc.value)
    with pytest.raises(ScenarioError, match="cannot be combined"):
        parse_variant("baseline+prefetch_ungated")


@pytest.mark.parametrize("flag, value, words", [
    ("-d", "0-8192*2", "a start >= 1 and a multiplier >= 2"),
    ("-p", "32-8192*1", "a start >= 1 and a multiplier >= 2"),
    ("-p", "64-128*0", "a start >= 1 and a multiplier >= 2"),
    ("-p", "8192-32*2", "yields no value"),
    ("-p", "64-128+-1", "the step after '+' must be >= 1"),
    ("-n", "8-4", "yields no value"),
])
def test_a_range_that_never_ends_or_yields_nothing_is_an_error(capsys, flag, value, words):
    """llama-bench range syntax: a range that would loop forever (multiplier < 2, start 0, step
    < 1) or that yields no value is a one-line argument error, not a hang or a silent drop."""
    with pytest.raises(SystemExit) as info:
        main(["run", TINY, "-q", flag, value])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert words in err and value in err and "Traceback" not in err


def test_ranges_expand_as_llama_bench_does(capsys):
    from sim.cli import _int_list

    assert _int_list("128-2048*2") == (128, 256, 512, 1024, 2048)
    assert _int_list("0-8192+4096") == (0, 4096, 8192)
    assert _int_list("1,5-7") == (1, 5, 6, 7)


def test_crossover_rejects_an_unknown_baseline_and_an_infinite_axis(capsys, tmp_path):
    out = tmp_path / "cx"
    rc, _o, err = run(capsys, "crossover", TINY, "--axis", "pcie=8,16", "--baseline", "bogus", "--out", str(out))
    assert rc == 2 and "--baseline" in err and "'bogus' is not one of the variants" in err
    rc, _o, err = run(capsys, "crossover", TINY, "--axis", "pcie=8,inf", "--out", str(out))
    assert rc == 2 and "--axis" in err and "finite" in err
    assert not out.exists()


def test_run_takes_the_format_from_the_out_file_and_refuses_a_mismatch(capsys, tmp_path):
    js = tmp_path / "r.json"
    rc, _o, _e = run(capsys, "run", TINY, "-q", "-r", "1", "--out", str(js))
    assert rc == 0 and isinstance(json.loads(js.read_text()), list)
    bad = tmp_path / "s.json"
    rc, _o, err = run(capsys, "run", TINY, "-q", "-r", "1", "-o", "csv", "--out", str(bad))
    assert rc == 2 and "--out" in err and "ends in .json but -o asks for csv" in err and not bad.exists()
    txt = tmp_path / "t.txt"
    rc, _o, _e = run(capsys, "run", TINY, "-q", "-r", "1", "--out", str(txt))
    assert rc == 0 and txt.read_text().startswith("| model")
    x = tmp_path / "x.csv"
    rc, out, err = run(capsys, "run", TINY, "-q", "-r", "1", "-o", "json", "--out", str(x))
    assert rc == 2 and out == "" and err.count("\n") == 1 and "ends in .csv but -o asks for json" in err
    assert not x.exists()


def test_a_figure_path_must_end_in_png(capsys, tmp_path):
    """check_output_path(..., suffix=".png"): a figure is written as PNG, so another name is refused
    up front, in one line; crossover's --figure names a built-in figure, not a file."""
    from sim.atomic import check_output_path
    from sim.errors import ScenarioError

    with pytest.raises(ScenarioError, match=r"field '--figure': 'fig.txt' does not end in .png"):
        check_output_path("fig.txt", "--figure", suffix=".png")
    assert check_output_path(tmp_path / "fig.PNG", "--figure", suffix=".png") == tmp_path / "fig.PNG"
    rc, _o, err = run(capsys, "crossover", TINY, "--figure", "fig.txt", "--out", str(tmp_path / "cx"))
    assert rc == 2 and err.count("\n") == 1 and "unknown figure 'fig.txt'" in err and not (tmp_path / "cx").exists()


def test_an_empty_scenario_path_is_an_error_not_the_default(capsys):
    for cmd in (["run", ""], ["crossover", "", "--axis", "pcie=8"]):
        rc, _o, err = run(capsys, *cmd)
        assert rc == 2 and "empty scenario path" in err


def test_trace_test_names_match_with_or_without_spaces(tmp_path):
    """`--test pp512@d8192` (compare-llama-bench.py's spelling) names llama-bench's 'pp512 @ d8192'."""
    from sim.cli import main

    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    base = ["trace", "-p", "512", "-n", "0", "-d", "8192", "--variant", "baseline"]
    assert main(base + ["--test", "pp512@d8192", "--out", str(a)]) == 0
    assert main(base + ["--test", "pp512 @ d8192", "--out", str(b)]) == 0
    assert a.read_bytes() == b.read_bytes()
    assert main(base + ["--test", "pp51", "--out", str(a)]) == 2
    c = tmp_path / "C.CSV"  # the extension in capitals is the same format
    assert main(base + ["--test", "pp512@d8192", "--out", str(c)]) == 0
    assert c.read_bytes() == a.read_bytes()


def test_a_closed_stdout_is_one_line_not_a_traceback():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", "import os, sys; os.close(1); sys.stdout = None; "
                        "from sim.cli import main; sys.exit(main(['run', '-q']))"], capture_output=False,
                       stderr=subprocess.PIPE, text=True, cwd=str(__import__('pathlib').Path(__file__).resolve().parent.parent))
    assert r.returncode == 2 and "standard output is closed" in r.stderr and "Traceback" not in r.stderr


def test_run_with_a_capitalised_baseline_prints_one_baseline(capsys):
    from sim.cli import main

    assert main(["run", "--variant", "Baseline", "-p", "64", "-n", "0", "-r", "1", "-q"]) == 0
    out = capsys.readouterr().out
    assert out.count("| baseline ") == 1 and "Baseline" not in out


def test_vram_table_has_a_line_for_every_setting_and_variant(capsys):
    """--vram with a list flag: one line per setting and variant (a setting column names the
    setting), not only the first setting's."""
    rc, out, _ = run(capsys, "run", "-r", "1", "-q", "-p", "512", "-n", "0", "-ncmoe", "0,48", "--variant",
                     "baseline,prefetch_ungated", "--vram")
    assert rc == 0
    table = out[out.index("VRAM by component"):].splitlines()
    assert table[2].startswith("| setting | variant | GPU |")
    lines = [ln for ln in table if ln.startswith("| -ncmoe")]
    assert [ln.split("|")[1:3] for ln in lines] == [[" -ncmoe 0 ", " baseline "], [" -ncmoe 0 ", " prefetch_ungated "],
                                                    [" -ncmoe 48 ", " baseline "], [" -ncmoe 48 ", " prefetch_ungated "]]
    weights = [float(ln.split("|")[5]) for ln in lines]
    assert weights[0] > weights[2]  # every expert on the host: fewer weights on the GPU
    assert table[2].endswith("| free | n_cpu_moe |") and [ln.split("|")[-2].strip() for ln in lines] == [
        "0", "0", "48", "48"]  # the placement simulated
    rc, out, _ = run(capsys, "run", "-r", "1", "-q", "-p", "512", "-n", "0", "--variant", "baseline", "--vram")
    assert rc == 0 and "| setting |" not in out and "| baseline | 0 |" in out


def test_a_moe_run_on_a_profile_without_llamacpp_kernel_tables_says_what_its_numbers_are(capsys):
    """No [ggml] tables (a datasheet or CuPy profile) and a MoE model: one note that its expert
    matmuls are priced at the dense GEMM rate; none on the llama.cpp-calibrated default, none
    for a dense model."""
    from sim.cli import no_kernel_tables_note
    from sim.model.specs import load_scenario

    rc, _, err = run(capsys, "run", "qwen3-30b-a3b-rtx3090", "-r", "1", "-q", "-p", "64", "-n", "0",
                     "--variant", "baseline")
    assert rc == 0 and err.count("no llama.cpp kernel tables") == 1 and "'RTX 3090'" in err
    rc, _, err = run(capsys, "run", "-r", "1", "-q", "-p", "64", "-n", "0", "--variant", "baseline")
    assert rc == 0 and "kernel tables" not in err
    assert no_kernel_tables_note(load_scenario("scenarios/gemma3-27b-ffn-cpu.toml")) is None  # dense


def test_trace_and_check_keep_every_op_so_their_default_budget_counts_every_variant(capsys, tmp_path):
    """trace/check materialise every op of every plan: a decode trace that run's budget would let
    through (10,000 graphs of 48 layers, 14 GB seen) is refused in one line naming --max-work,
    and --max-work raises it."""
    out = str(tmp_path / "t.json")
    rc, _, err = run(capsys, "trace", "--test", "tg2000", "-n", "2000", "--variant", "baseline", "--out", out)
    assert rc == 2 and "--max-work" in err and "every op of every plan is kept" in err
    assert len(err.strip().splitlines()) == 1 and not Path(out).exists()
    rc, _, err = run(capsys, "check", "--test", "tg2000", "-n", "2000", "--variant", "slots3")
    assert rc == 2 and "--max-work" in err
    rc, _, _ = run(capsys, "trace", TINY, "--test", "tg4", "--out", out)
    assert rc == 0 and Path(out).stat().st_size > 0


def test_trace_refuses_several_tests_rather_than_keep_the_last(capsys, tmp_path):
    """A trace is one test's timeline: --test given twice is a one-line error naming --test, not
    the last of them traced without a word (fresh-user round 10)."""
    out = tmp_path / "t.json"
    rc, _, err = run(capsys, "trace", TINY, "--test", "tg4", "--test", "tg4 @ d0", "--out", str(out))
    assert rc == 2 and "field '--test'" in err and "2 tests given" in err and not out.exists()
    assert len(err.strip().splitlines()) == 1


def test_an_output_name_ending_in_a_slash_is_a_folder_not_a_file(tmp_path):
    """--out d/ (the folder does not exist) is refused, not written as a file named d."""
    from sim.atomic import check_output_path

    with pytest.raises(ScenarioError, match="ends in /") as info:
        check_output_path(str(tmp_path / "d") + "/")
    assert info.value.field == "--out" and not (tmp_path / "d").exists()
    assert check_output_path(str(tmp_path / "d" / "t.md")) == tmp_path / "d" / "t.md"
    assert check_output_path(str(tmp_path / "x") + "/", directory=True) == tmp_path / "x"


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_an_existing_folder_that_refuses_files_is_named_as_such_not_as_missing(capsys):
    """/proc exists but takes no new file (mkstemp there says ENOENT): the error names the file
    and says the folder does not accept it, before any work; not "No such file or directory"."""
    from sim.atomic import check_output_path, write_atomic

    with pytest.raises(ScenarioError) as info:
        check_output_path("/proc/x.csv", "--out")
    msg = str(info.value)
    assert "'/proc/x.csv'" in msg and "folder '/proc' does not accept new files" in msg
    assert "No such file" not in msg and info.value.field == "--out"
    with pytest.raises(OSError) as oinfo:  # a writer that goes straight to the write says the same
        write_atomic("/proc/x.csv", "a")
    assert oinfo.value.filename == "/proc/x.csv" and "does not accept new files" in oinfo.value.strerror
    rc, out, err = run(capsys, "run", "--out", "/proc/x.md")
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "'/proc/x.md'" in err and "does not accept new files" in err


def test_a_read_only_folder_is_said_to_be_read_only(tmp_path, monkeypatch):
    """A folder whose file system refuses new files (EROFS; os.access passes, as for root): the
    message names the file and says read-only file system; nothing is created."""
    import errno
    import tempfile

    from sim.atomic import check_output_path

    def refuse(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    with pytest.raises(ScenarioError, match=r"cannot write '.*t\.csv': folder '.*' does not accept new files "
                                            r"\(read-only file system\)"):
        check_output_path(tmp_path / "t.csv", "--out")
    with pytest.raises(ScenarioError, match=r"cannot write folder '.*sub': .*\(read-only file system\)"):
        check_output_path(tmp_path / "sub", "--out", directory=True)
    assert list(tmp_path.iterdir()) == []


def test_a_device_or_fifo_output_is_checked_itself_not_its_folder(tmp_path, monkeypatch):
    """write_atomic writes a device or FIFO (/dev/null, /dev/stdout) in place, so check_output_path
    asks whether that file is writable, not its folder (/dev is not writable for a user)."""
    import os

    from sim.atomic import check_output_path

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) == tmp_path else real_access(path, mode))
    assert check_output_path(fifo, "--out") == fifo
    with pytest.raises(ScenarioError, match="not writable"):
        check_output_path(tmp_path / "new.csv", "--out")
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(ScenarioError, match=r"cannot write '.*pipe': not writable"):
        check_output_path(fifo, "--out")


def test_dev_stdout_on_a_pipe_is_written_through_its_link():
    """/dev/stdout on a pipe links to /proc/<pid>/fd/1, whose real path ('pipe:[n]') names
    nothing: write_atomic had taken it for a new file in /proc/<pid>/fd and failed ("does not
    accept new files", fresh-user round 4). The link itself is opened and written."""
    import os
    import sys as _sys

    from sim.atomic import write_atomic

    if not _sys.platform.startswith("linux"):
        pytest.skip("/proc/self/fd is Linux's")
    r, w = os.pipe()
    try:
        link = Path(f"/proc/self/fd/{w}")
        assert not Path(os.path.realpath(link)).exists()
        write_atomic(link, "row\n")
        os.close(w)
        w = -1
        assert os.read(r, 100) == b"row\n"
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def test_a_read_only_output_file_is_refused_not_replaced(tmp_path, monkeypatch, capsys):
    """A file the user may not write (os.access says so: a read-only file of another user) is
    refused naming --out, before any simulation and by write_atomic itself, and stays as it was;
    replacing it by a new file renamed over it would succeed in a writable folder."""
    import os

    from sim.atomic import check_output_path, write_atomic

    f = tmp_path / "t.md"
    f.write_text("precious")
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) == f else real_access(path, mode))
    with pytest.raises(ScenarioError, match=r"'.*t\.md': the file exists and is read-only") as info:
        check_output_path(f, "--out")
    assert info.value.field == "--out"
    with pytest.raises(OSError, match="read-only"):
        write_atomic(f, "new")
    rc, out, err = run(capsys, "run", "-r", "1", "-p", "64", "-n", "0", "-q", "--out", str(f))
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and "--out" in err and "read-only" in err
    assert f.read_text() == "precious" and sorted(p.name for p in tmp_path.iterdir()) == ["t.md"]


def test_an_output_that_fails_at_the_write_is_named_by_its_flag(capsys):
    """An output refused only when written (a full device: /dev/full) names its flag."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    rc, out, err = run(capsys, "run", "-r", "1", "-p", "64", "-n", "0", "-q", "--out", "/dev/full")
    assert rc == 2 and err.strip() == "prefetch-sim: error: cannot write '/dev/full' (--out): No space left on device"


@pytest.mark.parametrize("flag, value", [("-p", "５１２"), ("-ub", "٥١٢"), ("-r", "５"), ("-pg", "５１２,128"),
                                         ("--max-work", "１０")])
def test_digits_of_other_scripts_are_refused_as_llama_bench_refuses_them(capsys, flag, value):
    """std::stoi reads ASCII digits only; Python's int() and \\d take any script's."""
    with pytest.raises(SystemExit) as info:
        main(["run", flag, value])
    out, err = capsys.readouterr()
    assert info.value.code == 2 and out == "" and value in err and "Traceback" not in err


def test_a_model_that_is_not_a_regular_file_is_named_by_the_flag(capsys):
    rc, out, err = run(capsys, "run", "-m", "/dev/null", "-r", "1")
    assert rc == 2 and "-m/--model" in err and "not a regular file" in err and len(err.strip().splitlines()) == 1


def test_the_vram_table_shows_the_placement_a_fit_chose_per_variant(capsys):
    """-fitt fits n_cpu_moe per variant (staging needs room): the rows print -ncmoe as given, the
    --vram table the n_cpu_moe each variant was simulated with."""
    rc, out, _ = run(capsys, "run", "qwen3-30b-a3b-rtx3090", "-p", "512", "-n", "0", "-fitt", "1024", "--variant",
                     "baseline,slots3", "--vram", "-r", "1", "-q")
    assert rc == 0
    got = {ln.split("|")[1].strip(): int(ln.split("|")[-2]) for ln in out.splitlines()
           if ln.startswith(("| baseline |", "| slots3 |"))}
    assert got["slots3"] > got["baseline"] >= 0


def test_an_out_name_of_no_known_format_is_written_as_markdown_and_said(capsys, tmp_path):
    """--out x.db / x.csv.gz had been written as markdown with nothing said (fresh-user round 4):
    a note names the extension and the format written; a known extension and a plain name stay
    quiet."""
    out = tmp_path / "x.db"
    rc, _, err = run(capsys, "run", TINY, "-r", "1", "-q", "-n", "0", "--out", str(out))
    assert rc == 0 and out.read_text().startswith("| model")
    assert ".db is none of the formats (md, csv, json, jsonl, sql); writing markdown" in err
    for name in ("x.csv", "table"):
        rc, _, err = run(capsys, "run", TINY, "-r", "1", "-q", "-n", "0", "--out", str(tmp_path / name))
        assert rc == 0 and "none of the formats" not in err


@pytest.mark.parametrize("cmd", [["run", "-p", "64", "-n", "0", "-r", "1", "--variant", "baseline", "-o", "json"],
                                 ["check", "--variant", "slots3", "-p", "64", "-n", "0"], ["run", "--list-devices"]])
def test_a_closed_stdout_pipe_ends_every_command_alike_and_quietly(cmd):
    """The reader of stdout gone (| head): status 141 (SIGPIPE's, 128 + 13) and no error line,
    whatever the command (fresh-user round 10: run exited 0, the others 2 with 'cannot write:
    Broken pipe', check's 2 beside its documented 1 for hazards)."""
    import os
    import subprocess
    import sys

    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run([sys.executable, "-m", "sim", *cmd], stdout=w, stderr=subprocess.PIPE, cwd=ROOT,
                           timeout=120)
    finally:
        os.close(w)
    err = p.stderr.decode()
    assert p.returncode == 141 and "error" not in err and "Traceback" not in err


@pytest.mark.parametrize("cmd", [
    ["calibrate.llamacpp.splittime", "data/llamacpp/h200-20261201-splits"],
    ["calibrate.llamacpp.splittime", "data/llamacpp/h200-20261201-splits", "--cpu"],
    ["calibrate.llamacpp.nodetime", "data/llamacpp/h100-20261207-nodetime"],
    ["calibrate.llamacpp.vramcheck", "data/llamacpp/h200-20261202-prefetch2"],
    ["calibrate.llamacpp.compare", "data/llamacpp/h200-20261201-splits", "-q", "--jobs", "1"],
])
def test_the_llamacpp_tools_end_quietly_on_a_closed_stdout_pipe(cmd):
    """As prefetch-sim's commands: 141 and no line (fresh-user round 12: vramcheck a
    BrokenPipeError traceback, splittime 'error: [Errno 32] Broken pipe' and 2)."""
    import os
    import subprocess
    import sys

    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run([sys.executable, "-m", *cmd], stdout=w, stderr=subprocess.PIPE, cwd=ROOT, timeout=300)
    finally:
        os.close(w)
    err = p.stderr.decode()
    assert p.returncode == 141 and "error" not in err and "Traceback" not in err, err[-300:]


def test_round_12_command_line_details(capsys, tmp_path, monkeypatch):
    """Fresh-user round 12: '-p=' was called no flag; reproduce --out= wrote nothing with status
    0; crossover --figure ignored --baseline; a bare FIFO name was an unknown scenario; compare
    --out x.md wrote CSV and fit --out x.csv a TOML; vramcheck did not take a built-in profile."""
    import os

    from calibrate.llamacpp import compare as cmp
    from calibrate.llamacpp import fit as fit_mod
    from calibrate.llamacpp import vramcheck

    for argv, words in ((["run", "-p="], "-p=: write -p VALUE"), (["run", "-q=1"], "-q=1: -q takes no value")):
        with pytest.raises(SystemExit):
            main(argv)
        assert words in capsys.readouterr().err
    rc, _, err = run(capsys, "reproduce", "-q", "--out=")
    assert rc == 2 and "empty path" in err
    rc, _, err = run(capsys, "crossover", "--figure", "b", "--baseline", "prefetch_ungated", "--out", str(tmp_path / "cx"))
    assert rc == 2 and "--baseline" in err and not (tmp_path / "cx").exists()
    monkeypatch.chdir(tmp_path)
    os.mkfifo("fifo")
    rc, _, err = run(capsys, "run", "fifo", "-q")
    assert rc == 2 and "not a regular file" in err
    monkeypatch.chdir(ROOT)
    assert cmp.main(["data/llamacpp/h200-20261203-tg", "-q", "--out", str(tmp_path / "x.md")]) == 2
    assert "written as CSV" in capsys.readouterr().err
    assert fit_mod.main(["--params", "cpu_split_us", "--out", str(tmp_path / "x.csv")]) == 2
    assert "written as TOML" in capsys.readouterr().err
    assert vramcheck.main(["data/llamacpp/h200-20261202-prefetch2", "--hardware", "h200-llamacpp"]) == 0
    assert "compute buffer" in capsys.readouterr().out
    assert not list(tmp_path.glob("x.*"))
