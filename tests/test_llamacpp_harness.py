"""The llama.cpp harness's CPU-side parts: source subset and patches, build errors, the grid
spec and runner (with a stand-in llama-bench), the lease's collect, the routing check."""

from __future__ import annotations

import json
import re
import math
import os
import shutil
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from calibrate.llamacpp import build as B
from calibrate.llamacpp import grid as G
from calibrate.llamacpp import patches as P
from calibrate.llamacpp.lease import collect
from sim.errors import ScenarioError

REPO = Path(__file__).resolve().parent.parent

# a stand-in for the part of ggml-backend.cpp the copy-log patch anchors on (our own text)
FAKE_BACKEND = """\
static int compute_splits() {
    std::vector<int32_t> ids;
    std::vector<ggml_bitset_t> used_ids;
    int prev_backend_id = -1;
    for (int split_id = 0; split_id < n; split_id++) {
        struct ggml_backend_sched_split * split = &splits[split_id];
        if (weights) {
                    auto copy_experts = [&](int32_t first_id, int32_t last_id) {
                        const size_t padding_end = last_id < n_expert - 1 ? padding : 0;
                    };
                    int id = 0;
                    while (!ggml_bitset_get(used_ids.data(), id)) {
                        id++;
                    }
        } else {
                    // try async copy, but if not possible, we can still use a sync copy without x
        }
        if (!sched->callback_eval) {
            compute();
        }
        // record the event of this split
        prev_backend_id = split_backend_id;
    }
    return 0;
}
"""


def fake_tree(root: Path, backend: str = FAKE_BACKEND) -> Path:
    for rel in B.REQUIRED:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("// stand-in\n")
    (root / "ggml/src/ggml-backend.cpp").write_text(backend)
    (root / "tests").mkdir(exist_ok=True)
    (root / "tests/test-backend-ops.cpp").write_text("int main() {}\n")
    (root / "tools/other").mkdir(parents=True)
    (root / "tools/other/x.cpp").write_text("unused\n")
    return root


# ---- source subset, hash, archive ----------------------------------------------------------------

def test_check_tree_names_what_is_missing(tmp_path):
    with pytest.raises(B.BuildError, match="not a folder"):
        B.check_tree(tmp_path / "nope")
    (tmp_path / "CMakeLists.txt").write_text("")
    with pytest.raises(B.BuildError, match="missing ggml/src/ggml-backend.cpp"):
        B.check_tree(tmp_path)


def test_subset_keeps_only_what_the_build_needs_and_hash_tracks_content(tmp_path):
    src = fake_tree(tmp_path / "llama.cpp")
    sub = B.make_subset(src, tmp_path / "sub")
    assert (sub / "tools/llama-bench/llama-bench.cpp").is_file()
    assert not (sub / "tools/other").exists()
    assert (sub / "tools/CMakeLists.txt").read_text() == B.TOOLS_CMAKE
    assert "test-backend-ops" in (sub / "tests/CMakeLists.txt").read_text()
    h1 = B.tree_hash(sub)
    assert h1 == B.tree_hash(sub) and len(h1) == 16
    (sub / "build-x").mkdir()
    (sub / "build-x/junk.o").write_text("ignored")
    assert B.tree_hash(sub) == h1
    (sub / "src_extra.txt").write_text("changed")
    assert B.tree_hash(sub) != h1
    arc = B.pack(sub, tmp_path / "a" / "src.tgz")
    back = B.unpack(arc, tmp_path / "back")
    assert B.tree_hash(back) == B.tree_hash(sub)
    assert not any(p.name.startswith("build") for p in back.iterdir())


def test_unpack_of_a_broken_archive_is_one_line(tmp_path):
    bad = tmp_path / "bad.tgz"
    bad.write_bytes(b"not a tar")
    with pytest.raises(B.BuildError, match="cannot unpack"):
        B.unpack(bad, tmp_path / "x")


def test_build_without_cmake_or_nvcc_fails_in_one_line(tmp_path, monkeypatch):
    tree = fake_tree(tmp_path / "t")
    monkeypatch.setattr(B.shutil, "which", lambda tool: None)
    with pytest.raises(B.BuildError, match="cmake not found"):
        B.build(tree, tmp_path / "b")
    monkeypatch.setattr(B.shutil, "which", lambda tool: "/usr/bin/cmake" if tool == "cmake" else None)
    monkeypatch.setattr(B.Path, "is_file", lambda self: False if str(self).endswith("nvcc") else os.path.isfile(self))
    with pytest.raises(B.BuildError, match="nvcc not found"):
        B.build(tree, tmp_path / "b", cuda=True)


def test_failed_configure_names_its_log_and_cached_build_is_reused(tmp_path, monkeypatch):
    tree = fake_tree(tmp_path / "t")
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    fake = bin_dir / "cmake"
    # a stand-in cmake: fails configure when FAIL is set, else "builds" the requested targets
    fake.write_text(f"""#!{sys.executable}
import os, sys, pathlib
a = sys.argv[1:]
if '-S' in a:
    sys.exit(3 if os.environ.get('FAIL') else 0)
b = pathlib.Path(a[a.index('--build') + 1]) / 'bin'
b.mkdir(parents=True, exist_ok=True)
for t in a[a.index('--target') + 1:]:
    (b / t).write_text('x')
""")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAIL", "1")
    with pytest.raises(B.BuildError, match=r"configure failed \(exit 3\); log: .*build.log"):
        B.build(tree, tmp_path / "b", cuda=False)
    monkeypatch.delenv("FAIL")
    r1 = B.build(tree, tmp_path / "b", cuda=False, source="test")
    assert not r1.cached and r1.program("llama-bench").is_file() and "-DGGML_CUDA=OFF" in r1.cmake_args
    r2 = B.build(tree, tmp_path / "b", cuda=False)
    assert r2.cached and r2.source_hash == r1.source_hash and r2.build_dir == r1.build_dir


# ---- patches ----------------------------------------------------------------------------------

def test_copy_log_patch_applies_once_in_the_right_places(tmp_path):
    tree = fake_tree(tmp_path / "t")
    assert P.apply(tree, P.COPY_LOG, "copy-log")
    text = (tree / "ggml/src/ggml-backend.cpp").read_text()
    lines = text.splitlines()
    decl = next(i for i, ln in enumerate(lines) if "static const bool psim_log" in ln)
    assert "used_ids;" in lines[decl - 2]
    count = next(i for i, ln in enumerate(lines) if "psim_expert_copied +=" in ln)
    assert "padding_end =" in lines[count - 2]
    loop = next(i for i, ln in enumerate(lines) if "while (!ggml_bitset_get" in ln)
    assert "psim_moe_splits++" in "\n".join(lines[loop - 10:loop])
    assert text.index("psim_other +=") < text.index("// try async copy")
    assert text.index("prefetch-sim copy-log: n_tokens") > text.index("prev_backend_id = split_backend_id;")
    assert not P.apply(tree, P.COPY_LOG, "copy-log")  # idempotent
    assert (tree / "ggml/src/ggml-backend.cpp").read_text() == text


def test_split_time_patch_times_every_split_and_prints_once_per_graph(tmp_path):
    tree = fake_tree(tmp_path / "t")
    assert P.apply(tree, P.SPLIT_TIME, "split-time")
    text = (tree / "ggml/src/ggml-backend.cpp").read_text()
    # the timestamps bracket the input copies and the compute call, in that order
    order = [text.index(k) for k in ("static const bool psim_st", "psim_st_ts = ggml_time_us()",
                                     "psim_st_ti = ggml_time_us()", "if (!sched->callback_eval)",
                                     "snprintf(psim_b", "// record the event of this split",
                                     "prefetch-sim split-time: graph=")]
    assert order == sorted(order)
    assert text.index("psim_st_ts = ggml_time_us()") > text.index("struct ggml_backend_sched_split * split =")
    # the early drain only where the scheduler itself would synchronise first (no events)
    assert "sched->n_copies == 1" in text
    assert not P.apply(tree, P.SPLIT_TIME, "split-time")  # idempotent
    assert P.apply(tree, P.COPY_LOG, "copy-log")           # and independent of copy-log
    assert set(P.PATCHES) >= {"copy-log", "perf-cases", "split-time"}


def test_realloc_log_patch_names_the_reason_before_the_schedulers_sync(tmp_path):
    backend = FAKE_BACKEND + """\
static bool alloc_splits() {
    if (backend_ids_changed || !ggml_gallocr_alloc_graph(sched->galloc, &sched->graph)) {
        // the re-allocation may cause the split inputs to be moved to a different address
        for (int i = 0; i < sched->n_backends; i++) { ggml_backend_synchronize(sched->backends[i]); }
    }
}
"""
    tree = fake_tree(tmp_path / "t", backend)
    alloc = tree / "ggml/src/ggml-alloc.c"
    alloc.write_text("static bool ggml_gallocr_needs_realloc(ggml_gallocr_t galloc, struct ggml_cgraph * graph) {\n"
                     "    if (galloc->n_nodes != graph->n_nodes) { return true; }\n    return false;\n}\n")
    assert P.apply(tree, P.REALLOC_LOG, "realloc-log")
    a = alloc.read_text()
    # the reasons are printed inside the check, before its own first test, behind the variable
    assert a.index('getenv("PREFETCH_SIM_REALLOC_LOG")') < a.index("if (galloc->n_nodes != graph->n_nodes) { return true; }")
    assert "gallocr nodes %d -> %d" in a and "size %zu > size_max %zu" in a
    b = (tree / "ggml/src/ggml-backend.cpp").read_text()
    # the scheduler's line comes before its synchronisation of every backend
    assert b.index("prefetch-sim realloc-log: reserve backend_ids_changed=") < b.index("ggml_backend_synchronize(sched->backends[i])")
    assert not P.apply(tree, P.REALLOC_LOG, "realloc-log")  # idempotent


def test_patch_with_a_missing_or_repeated_anchor_is_an_error(tmp_path):
    tree = fake_tree(tmp_path / "t", FAKE_BACKEND.replace("prev_backend_id = split_backend_id;", ""))
    with pytest.raises(B.BuildError, match="found 0 times"):
        P.apply(tree, P.COPY_LOG, "copy-log")
    tree2 = fake_tree(tmp_path / "t2", FAKE_BACKEND + "    std::vector<ggml_bitset_t> used_ids;\n")
    with pytest.raises(B.BuildError, match="found 2 times"):
        P.apply(tree2, P.COPY_LOG, "copy-log")


def test_parse_copy_log():
    text = ("llama_context: blah\nprefetch-sim copy-log: n_tokens=32 moe_splits=144 used_experts=100 "
            "expert_slots=200 expert_bytes_copied=5 expert_bytes_total=10 other_bytes=0\n")
    assert P.parse_copy_log(text) == [{"n_tokens": 32, "moe_splits": 144, "used_experts": 100, "expert_slots": 200,
                                       "expert_bytes_copied": 5, "expert_bytes_total": 10, "other_bytes": 0}]
    with pytest.raises(ValueError, match="malformed"):
        P.parse_copy_log("prefetch-sim copy-log: n_tokens")


# ---- grid spec ---------------------------------------------------------------------------------

def test_shipped_grid_has_the_issue_coverage():
    spec = G.load_grid(REPO / "calibrate/llamacpp/grids/h200.toml")
    assert spec.repetitions >= 5
    assert G.count_rows(spec) >= 100
    for m in spec.models:
        assert (REPO / m.toml).is_file()
    combos = [(r, c) for r in spec.runs if r.kind == "bench" for c in G.expand(r.args)]
    # the default scenario's exact configuration is measured (NOTES: ncmoe 24, -lm none, ub 512)
    default = {c["test"] for r, c in combos if r.model == "qwen3-30b-a3b" and c.get("-ncmoe") == "24"
               and c.get("-lm") == "none" and c.get("-ub") == "512" and c.get("-b") == "2048"}
    assert {"pp64", "pp512", "pp2048", "tg128"} <= default
    ncmoe = {c.get("-ncmoe") for r, c in combos if r.model == "qwen3-30b-a3b"}
    assert {"0", "48"} <= ncmoe and len(ncmoe) >= 4
    assert {c.get("-lm") for r, c in combos} == {"none", "mmap"}
    assert {c.get("-fa") for r, c in combos} == {"on", "off"}
    assert any(int(c["-d"]) >= 8192 for r, c in combos if r.model != "gemma3-27b")
    assert any("-ot" in c for r, c in combos if r.model == "gemma3-27b")
    ubs = {int(c["-ub"]) for r, c in combos}
    assert min(ubs) <= 128 and max(ubs) >= 4096


def test_tg4_grid_times_the_cpu_kernels_first_and_repeats_every_tg_run_four_times():
    """grids/h200-tg4.toml: the CPU kernel table before the grid (perf_first), then the 13 tg
    runs of h200-tg.toml in four passes with the same flags."""
    spec = G.load_grid(REPO / "calibrate/llamacpp/grids/h200-tg4.toml")
    tg = G.load_grid(REPO / "calibrate/llamacpp/grids/h200-tg.toml")
    assert spec.perf == ("cpu",) and spec.perf_first and not tg.perf_first
    base = {r.id[2:]: r.args for r in tg.runs if r.id.startswith("a-")}
    assert len(base) == 13 and len(spec.runs) == 52
    for p in "abcd":
        assert {r.id[2:]: r.args for r in spec.runs if r.id.startswith(p + "-")} == base


def test_perf_first_must_be_a_boolean(tmp_path):
    f = tmp_path / "g.toml"
    f.write_text('[grid]\nname = "g"\nperf_first = "yes"\n[[model]]\nkey = "q"\n'
                 'toml = "scenarios/models/qwen3-30b-a3b.toml"\n')
    with pytest.raises(ScenarioError, match="perf_first"):
        G.load_grid(f)


def test_prefetch_grid_pairs_every_prefetch_row_with_a_baseline_in_its_own_run():
    """grids/h200-prefetch.toml: every run lists off and on in one invocation (one model load),
    so each prefetch row (-pw 1 or -pes > 0) has its baseline (-pw 0 -pes 0) in the same run."""
    spec = G.load_grid(REPO / "calibrate/llamacpp/grids/h200-prefetch.toml")
    assert spec.repetitions == 5 and spec.perf == () and G.count_rows(spec) == 54
    assert {m.key for m in spec.models} == {"qwen3-30b-a3b", "gemma3-27b"}
    for m in spec.models:
        assert (REPO / m.toml).is_file()
    # output identity on both models, ungated, and with slots on the MoE model
    ident = {(r.model, v) for r in spec.runs if r.kind == "identity" for v in r.variants}
    assert {("qwen3-30b-a3b", "-pw 1 -pwg 0"), ("qwen3-30b-a3b", "-pes 3"), ("gemma3-27b", "-pw 1 -pwg 0")} <= ident
    keys = ("-ngl", "-ncmoe", "-ub", "-b", "-fa", "-lm", "test")
    bench = [r for r in spec.runs if r.kind == "bench"]
    for r in bench:
        assert {"-lm", "none", "-fa", "on", "-b", "2048"} <= set(r.args), r.id
        combos = G.expand(r.args)
        base = {tuple(c.get(k) for k in keys) for c in combos if c.get("-pw", "0") == "0" and c.get("-pes", "0") == "0"}
        pre = [c for c in combos if c.get("-pw", "0") == "1" or c.get("-pes", "0") != "0"]
        assert pre and all(tuple(c.get(k) for k in keys) in base for c in pre), r.id
    tests = {(r.model, c["test"], c.get("-pw"), c.get("-pwg"), c.get("-pes")) for r in bench for c in G.expand(r.args)}
    for t in ("pp64", "pp512", "pp2048"):  # ungated at short and long prompts
        assert ("qwen3-30b-a3b", t, "1", "0", None) in tests
    for t in ("pp64", "pp512"):  # the gate: below it and at it
        assert ("qwen3-30b-a3b", t, "1", "512", None) in tests
    assert {("qwen3-30b-a3b", "pp2048", None, None, n) for n in "123"} <= tests
    # decode with each flag value: the control (no effect expected)
    assert ("qwen3-30b-a3b", "tg32", "1", "0", None) in tests and ("qwen3-30b-a3b", "tg32", "1", "512", None) in tests
    assert {("qwen3-30b-a3b", "tg32", None, None, n) for n in "0123"} <= tests
    assert ("gemma3-27b", "tg16", "1", "0", None) in tests
    assert {("gemma3-27b", t, "1", "0", None) for t in ("pp512", "pp2048")} <= tests  # dense -ngl


def test_expand_counts_the_prefetch_flags():
    rows = G.expand(("-p", "512", "-n", "0", "-pw", "0,1", "-pwg", "0,512", "--prefetch-experts-slots", "0,3"))
    assert len(rows) == 8 and {r["-pes"] for r in rows} == {"0", "3"}


def test_expand_is_llama_benchs_cartesian_product():
    rows = G.expand(("-ub", "128,512", "-p", "64,512", "-n", "128", "-d", "0,8192", "-fa", "on,off"))
    assert len(rows) == 2 * 2 * 2 * (2 + 1)
    assert {r["test"] for r in rows} == {"pp64", "pp512", "tg128", "pp64 @ d8192", "pp512 @ d8192", "tg128 @ d8192"}
    assert len(G.expand(("-p", "0", "-n", "16"))) == 1
    pg = G.expand(("-p", "0", "-n", "0", "-pg", "512,128", "-pg", "64,8", "-d", "0,4096"))
    assert sorted(r["test"] for r in pg) == ["pp512+tg128", "pp512+tg128 @ d4096", "pp64+tg8", "pp64+tg8 @ d4096"]
    assert len(G.expand(("-ub", "128-512*2", "-n", "0"))) == 3
    assert G.expand(("-ot", "a=CPU,b=CPU", "-n", "0"))[0]["-ot"] in ("a=CPU", "b=CPU")


def _write_grid(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "g.toml"
    p.write_text('[grid]\nname = "t"\n\n[[model]]\nkey = "m"\ntoml = "scenarios/models/qwen3-30b-a3b.toml"\n\n' + body)
    return p


def test_a_grid_model_file_that_does_not_exist_is_named(tmp_path):
    p = tmp_path / "g.toml"
    p.write_text('[grid]\nname = "t"\n\n[[model]]\nkey = "m"\ntoml = "scenarios/models/nope.toml"\n\n'
                 '[[run]]\nid = "a"\nmodel = "m"\nargs = "-p 64"\n')
    with pytest.raises(ScenarioError) as ei:
        G.load_grid(p)
    assert ei.value.field == "model[0].toml" and "nope.toml" in str(ei.value) and str(p) in str(ei.value)


@pytest.mark.parametrize("body, field", [
    ('[[run]]\nid = "a"\nmodel = "m"\nargs = "-p 1"\n[[run]]\nid = "a"\nmodel = "m"\nargs = "-p 2"\n', "run"),
    ('[[run]]\nid = "a"\nmodel = "x"\nargs = "-p 1"\n', "run[0].model"),
    ('[[run]]\nid = "a"\nmodel = "m"\nargs = "-m other.gguf -p 1"\n', "run[0].args"),
    ('[[run]]\nid = "a"\nmodel = "m"\nargs = "-p \'1"\n', "run[0].args"),
    ('[[run]]\nid = "a"\nmodel = "m"\nargs = "-pw 2"\n', "run[0].args"),
    ('[[run]]\nid = "a"\nmodel = "m"\nargs = "-ub abc"\n', "run[0].args"),
    ('[[run]]\nid = "a"\nmodel = "m"\nargs = "--frobnicate 3"\n', "run[0].args"),
    ('[[run]]\nid = "a"\nmodel = "m"\nargs = "-p 128-2048*1 -n 0"\n', "run[0].args"),
    ('[[run]]\nid = "a"\nmodel = "m"\nargs = "-p 512 stray"\n', "run[0].args"),
    ('[[run]]\nid = "a"\nmodel = "m"\nargs = "-bogus 4"\n', "run[0].args"),
    ('[[run]]\nid = "a"\nmodel = "m"\nargs = "-p 0 -n 0"\n', "run[0].args"),
    ('[[run]]\nid = "a"\nmodel = "m"\nargs = "-ngl99"\n', "run[0].args"),
    ('[[run]]\nid = "a"\nmodel = "m"\nargs = "-p 1"\nkind = "timing"\n', "run[0].kind"),
    ('[[run]]\nid = "a"\nmodel = "m"\nargs = "-p 1"\ncolour = 1\n', "run[0].colour"),
])
def test_bad_grid_specs_name_file_and_field(tmp_path, body, field):
    p = _write_grid(tmp_path, body)
    with pytest.raises(ScenarioError) as ei:
        G.load_grid(p)
    assert ei.value.field == field and str(p) in str(ei.value)
    assert "'ogus'" not in str(ei.value) and "'gl99'" not in str(ei.value)  # not read as -b ogus, -n gl99


@pytest.mark.parametrize("args, flag, words", [
    ("-ngl 99 -ub 0 -p 512 -n 0", "-ub/--ubatch-size", "must be >= 1, got 0"),
    ("-b 0 -p 512", "-b/--batch-size", "must be >= 1, got 0"),
    ("-t 0 -p 512", "-t/--threads", "must be >= 1, got 0"),
    ("-p 20000000 -n 0", "-p/--n-prompt", "more than the simulator's limit"),
    ("-n 20000000", "-n/--n-gen", "more than the simulator's limit"),
    ("-d 16777216 -p 512", "-p/-n/-d (depth + tokens, the context)", "more than the simulator's limit"),
    ("-pg 512,20000000", "-pg", "more than the simulator's limit"),
    ("-ub 64,20000000 -p 512", "-ub/--ubatch-size", "more than the simulator's limit"),
    ("-ncmoe -1 -p 512", "-ncmoe/--n-cpu-moe", "values cannot be negative"),
    ("-ngl 99999999999 -p 512", "-ngl/--n-gpu-layers", "at most 2147483647"),
    ("-ub0 -p 512", "-ub0", "write -ub 0"),
    ("-p 512 --variant slots3", "--variant", "not of llama-bench"),
    ("-p 512 --engine=des", "--engine", "not of llama-bench"),
    ("-p 512 --max-work 5", "--max-work", "not of llama-bench"),
    ("-p 512 --skip-unmodelled", "--skip-unmodelled", "not of llama-bench"),
])
def test_grid_args_are_range_checked_as_prefetch_sim_run_checks_them(tmp_path, capsys, args, flag, words):
    """A grid run's llama-bench flags get prefetch-sim run's own range checks (one implementation,
    sim.cli.benchflags.check_values): the error names the grid file, the run's id and the flag, as
    `plan --grid` prints it in one line (before: -ub 0 was listed as a run)."""
    from calibrate.llamacpp.__main__ import main

    p = _write_grid(tmp_path, f'[[run]]\nid = "good"\nmodel = "m"\nargs = "-p 64 -n 0"\n\n'
                              f'[[run]]\nid = "bad-one"\nmodel = "m"\nargs = "{args}"\n')
    with pytest.raises(ScenarioError) as ei:
        G.load_grid(p)
    msg = str(ei.value)
    assert ei.value.field == "run[1].args" and str(p) in msg and "run 'bad-one'" in msg
    assert flag in msg and words in msg, msg
    assert main(["plan", "--grid", str(p)]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.count("\n") == 1 and "run 'bad-one'" in cap.err and flag in cap.err


def test_grid_and_run_refuse_an_out_of_range_flag_with_the_same_words(tmp_path, capsys):
    from sim.cli import main as sim_main

    p = _write_grid(tmp_path, '[[run]]\nid = "a"\nmodel = "m"\nargs = "-ub 0 -p 64"\n')
    with pytest.raises(ScenarioError) as ei:
        G.load_grid(p)
    assert sim_main(["run", str(REPO / "scenarios/tiny/tiny.toml"), "-q", "-ub", "0", "-p", "64"]) == 2
    err = capsys.readouterr().err
    assert "field '-ub/--ubatch-size': must be >= 1, got 0" in err
    assert str(ei.value).endswith("run 'a': -ub/--ubatch-size: must be >= 1, got 0")


def test_every_shipped_grid_loads():
    """Every shipped grid loads and measures something: llama-bench runs, or perf runs (a kernel
    lease such as h200-dense4 has no llama-bench run)."""
    for g in sorted((REPO / "calibrate" / "llamacpp" / "grids").glob("*.toml")):
        spec = G.load_grid(g)
        assert spec.runs or spec.perf, g


# ---- grid runner with a stand-in llama-bench -----------------------------------------------------

ROW = {"build_commit": "unknown", "model_filename": "", "model_type": "qwen3moe 30B.A3B Q4_K - Medium",
       "n_prompt": 512, "n_gen": 0, "n_depth": 0, "avg_ts": 1000.0}


def fake_bench(tmp_path: Path) -> Path:
    p = tmp_path / "llama-bench"
    p.write_text(f"""#!{sys.executable}
import json, os, sys, time
a = sys.argv[1:]
print("ggml_cuda_init: stand-in", file=sys.stderr)
mode = os.environ.get("FAKE_MODE", "ok")
if mode == "fail":
    print("error: failed to load model", file=sys.stderr); sys.exit(1)
if mode == "hang":
    time.sleep(30)
if mode == "copylog":
    print("prefetch-sim copy-log: n_tokens=32 moe_splits=3 used_experts=2 expert_slots=4 expert_bytes_copied=1 expert_bytes_total=2 other_bytes=0", file=sys.stderr)
row = dict({json.dumps(ROW)}, model_filename=a[a.index("-m") + 1], args=a)
print(json.dumps(row)); print("{{not json"); print(json.dumps(row))
""")
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return p


def test_runner_records_rows_failures_timeouts_and_resumes(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    (models / "m.gguf").write_bytes(b"GGUF")
    spec = G.load_grid(_write_grid(tmp_path, """
[[run]]
id = "ok"
model = "m"
args = "-ngl 99 -p 512 -n 0"
[[run]]
id = "fails"
model = "m"
args = "-p 512"
env = { FAKE_MODE = "fail" }
[[run]]
id = "hangs"
model = "m"
args = "-p 512"
env = { FAKE_MODE = "hang" }
[[run]]
id = "route"
model = "m"
kind = "routing"
repetitions = 1
args = "-p 512"
env = { FAKE_MODE = "copylog" }
"""))
    spec = G.GridSpec(**{**spec.__dict__, "timeout_s": 2.0})
    out = tmp_path / "run"
    said: list[str] = []
    recs = G.run_grid(spec, fake_bench(tmp_path), models, out, say=said.append)
    by = {r["id"]: r for r in recs}
    assert [r["id"] for r in recs] == ["route", "ok", "fails", "hangs"]  # routing first
    assert by["ok"]["rc"] == 0 and by["ok"]["rows"] == 2 and by["ok"]["malformed_lines"] == 1
    assert by["ok"]["cmd"][-5:] == ["-r", "5", "-o", "jsonl", "-v"]
    assert by["route"]["cmd"][by["route"]["cmd"].index("-r") + 1] == "1"
    assert by["fails"]["rc"] == 1 and "exited 1" in by["fails"]["error"]
    assert by["hangs"]["rc"] == 124 and by["hangs"]["error"] == "timed out"
    lines = (out / "llama-bench.jsonl").read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(ln)["model_filename"].endswith("m.gguf") for ln in lines)
    assert len((out / "routing.jsonl").read_text().splitlines()) == 2
    assert "failed to load model" in (out / "logs/fails.log").read_text()
    assert any("fails: llama-bench exited 1; log:" in s for s in said)
    assert G.done_ids(out) == {"ok", "route"}
    again = G.run_grid(spec, fake_bench(tmp_path), models, out, say=said.append, only={"ok", "route"})
    assert again == []  # resumed: nothing left to do among those


def test_runner_calls_before_for_bench_runs_only(tmp_path):
    """The canary hook runs before each bench invocation, not before a routing run."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "m.gguf").write_bytes(b"GGUF")
    spec = G.load_grid(_write_grid(tmp_path, """
[[run]]
id = "b1"
model = "m"
args = "-p 512 -n 0"
[[run]]
id = "route"
model = "m"
kind = "routing"
repetitions = 1
args = "-p 512"
[[run]]
id = "b2"
model = "m"
args = "-p 64 -n 0"
"""))
    seen: list[str] = []
    G.run_grid(spec, fake_bench(tmp_path), models, tmp_path / "run", say=lambda s: None,
               before=lambda run: seen.append(run.id))
    assert seen == ["b1", "b2"]


def test_canary_records_the_probe_line_or_its_failure(tmp_path):
    from calibrate.llamacpp import lease as L

    lease = L.Lease(tmp_path)
    (lease.run_dir).mkdir(parents=True)
    good = tmp_path / "good"
    good.write_text('#!/bin/sh\necho "warming"\necho \'{"threads": 4, "gb_per_s": 81.5, "best_gb_per_s": 90.0}\'\n')
    bad = tmp_path / "bad"
    bad.write_text('#!/bin/sh\necho "psim-membw: cannot allocate 1024 MiB" >&2\nexit 2\n')
    for p in (good, bad):
        p.chmod(p.stat().st_mode | stat.S_IEXEC)
    run = G.GridRun(id="a-x", model="m", args=("-p", "1"))
    L.make_canary(lease, good)(run)
    L.make_canary(lease, bad)(run)
    L.make_canary(lease, tmp_path / "missing")(run)
    recs = [json.loads(ln) for ln in (lease.run_dir / "canary.jsonl").read_text().splitlines()]
    assert [r["before"] for r in recs] == ["a-x"] * 3
    assert recs[0]["rc"] == 0 and recs[0]["gb_per_s"] == 81.5
    assert recs[1]["rc"] == 2 and "cannot allocate" in recs[1]["error"]
    assert recs[2]["rc"] is None and "error" in recs[2]


@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")
def test_membw_probe_compiles_runs_and_refuses_bad_arguments(tmp_path):
    from calibrate.llamacpp import lease as L

    lease = L.Lease(tmp_path)
    exe = L.compile_canary(lease, tmp_path / "psim-membw")
    assert exe is not None
    r = subprocess.run([str(exe), "--threads", "2", "--mib", "8", "--seconds", "0.01"], capture_output=True,
                       text=True, timeout=60)
    rec = json.loads(r.stdout)
    assert r.returncode == 0 and rec["threads"] == 2 and rec["bytes"] == 8 * 2**20 and rec["passes"] >= 1
    assert rec["gb_per_s"] > 0 and rec["best_gb_per_s"] >= rec["gb_per_s"] * 0.999
    for bad in (["--threads", "0"], ["--mib", "x"], ["--seconds"], ["--what", "1"]):
        r = subprocess.run([str(exe), *bad], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and r.stderr.startswith("psim-membw: ") and not r.stdout
    assert L.compile_canary(lease, tmp_path / "x", compiler=str(tmp_path / "no-such-c++")) is None
    assert "canary: not compiled" in (tmp_path / "progress.log").read_text()


def test_runner_records_a_missing_gguf(tmp_path):
    spec = G.load_grid(_write_grid(tmp_path, '[[run]]\nid = "a"\nmodel = "m"\nargs = "-p 1"\n'))
    rec = G.run_one(spec.runs[0], spec, fake_bench(tmp_path), tmp_path / "nomodels", tmp_path / "run", say=lambda s: None)
    assert rec["rc"] == -1 and "GGUF not found" in rec["error"]
    assert not (tmp_path / "run" / "llama-bench.jsonl").exists()


def test_collect_packs_the_run_folder(tmp_path):
    work = tmp_path / "w"
    (work / "run" / "logs").mkdir(parents=True)
    (work / "run" / "llama-bench.jsonl").write_text("{}\n")
    (work / "progress.log").write_text("step 1\n")
    (work / "status.json").write_text(json.dumps({"step": "grid"}))
    assert collect(work, tmp_path / "out", wait_s=0) == 3
    (work / "status.json").write_text(json.dumps({"step": "done"}))
    assert collect(work, tmp_path / "out", wait_s=5) == 0
    with tarfile.open(tmp_path / "out" / "run.tgz") as tf:
        names = tf.getnames()
    assert "run/llama-bench.jsonl" in names and "run/progress.log" in names
    assert collect(tmp_path / "absent", tmp_path / "out2", wait_s=0) == 2


# ---- routing check ------------------------------------------------------------------------------

def test_counted_routing_check_against_uniform(tmp_path):
    from calibrate.llamacpp.routing_check import counted
    from sim.model.routing import expected_distinct_uniform

    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    # qwen3: 128 experts, top-8; 48 layers x 3 expert tensors = 144 splits per graph
    slots = 144 * 128
    lines = [f"prefetch-sim copy-log: n_tokens=32 moe_splits=144 used_experts={u} expert_slots={slots} "
             f"expert_bytes_copied={u * 1000} expert_bytes_total={slots * 1000} other_bytes=0" for u in (12000, 12200)]
    lines.append("prefetch-sim copy-log: n_tokens=1 moe_splits=0 used_experts=0 expert_slots=0 expert_bytes_copied=0 "
                 "expert_bytes_total=0 other_bytes=0")
    (run / "logs" / "r.log").write_text("\n".join(lines) + "\n")
    (run / "invocations.jsonl").write_text(json.dumps({
        "id": "r", "kind": "routing", "rc": 0, "model": "qwen3-30b-a3b", "gguf": "q.gguf", "n_layer": 48,
        "model_toml": "scenarios/models/qwen3-30b-a3b.toml", "log": "logs/r.log"}) + "\n")
    df = counted(run, repo=REPO)
    assert len(df) == 1
    r = df.iloc[0]
    assert r["graphs"] == 2 and r["n_tokens"] == 32
    assert r["used_share"] == pytest.approx(12100 / slots)
    assert r["uniform_share"] == pytest.approx(expected_distinct_uniform(128, 8, 32) / 128)
    assert r["predicted_gib"] == pytest.approx(r["uniform_share"] * slots * 1000 / 2**30)


def test_vram_sampler_keeps_the_peak_of_one_nvidia_smi_process(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nfor v in 100 900 300; do echo $v; done\nexec sleep 30\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    import time as _time

    with G.VramSampler() as v:
        t_end = _time.monotonic() + 10
        while v.peak_mib != 900 and _time.monotonic() < t_end:
            _time.sleep(0.05)
    assert v.peak_mib == 900
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with G.VramSampler() as v:
        pass
    assert v.peak_mib is None


def test_logs_are_read_from_the_folder_or_the_packed_archive(tmp_path):
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "a.log").write_text("hello copy-log\n")
    assert G.read_log(run, "logs/a.log") == "hello copy-log\n"
    arc = G.pack_logs(run)
    assert arc.is_file() and not (run / "logs").exists()
    assert G.read_log(run, "logs/a.log") == "hello copy-log\n"
    with pytest.raises(FileNotFoundError):
        G.read_log(run, "logs/missing.log")


def test_one_log_reader_for_plain_gzipped_and_archived_logs(tmp_path):
    import gzip

    from calibrate.llamacpp.logs import read_run_log, read_text

    (tmp_path / "a.log").write_text("plain\n")
    (tmp_path / "b.log.gz").write_bytes(gzip.compress(b"zipped \xff\n"))
    assert read_text(tmp_path / "a.log") == "plain\n" and read_text(tmp_path / "b.log.gz") == "zipped \ufffd\n"
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "c.log.gz").write_bytes(gzip.compress(b"gz beside\n"))
    assert read_run_log(run, "logs/c.log") == "gz beside\n"
    with pytest.raises(FileNotFoundError):
        read_text(tmp_path / "none.log")


def test_committed_run_reads_and_its_routing_check_holds():
    """The committed H200 run: every invocation succeeded with the rows it should print, and the
    scheduler's own count of copied experts matches uniform routing (the synthetic GGUFs route
    near-uniformly, which is what the simulator assumes for them)."""
    from calibrate.llamacpp.routing_check import counted
    from sim.views.llamabench import read_llama_bench

    run = REPO / "data/llamacpp/h200-20261201"
    inv = [json.loads(ln) for ln in (run / "invocations.jsonl").read_text().splitlines()]
    assert all(r["rc"] == 0 and r["rows"] == r["expected_rows"] for r in inv)
    df = read_llama_bench(run / "llama-bench.jsonl")
    assert len(df) >= 100 and (df["samples_ts"].map(len) >= 5).all()
    c = counted(run, repo=REPO)
    assert len(c) == 6
    assert (c["share_error"].abs() < 0.01).all()


def test_h2d_probe_without_a_gpu_is_one_line(tmp_path, monkeypatch):
    from calibrate._gpu import gpu_available
    from calibrate.llamacpp import h2d_probe

    if gpu_available():
        pytest.skip("a GPU is present (the gpu-marked test covers it)")
    assert h2d_probe.main([str(tmp_path / "h2d.json")]) == 2
    assert not (tmp_path / "h2d.json").exists()


@pytest.mark.gpu
def test_h2d_probe_on_a_gpu(tmp_path):
    from calibrate._gpu import gpu_available
    from calibrate.llamacpp import h2d_probe

    if not gpu_available():
        pytest.skip("needs an NVIDIA GPU and CuPy")
    rec = h2d_probe.probe(tmp_path / "h2d.json")
    assert rec["pinned_bytes_per_s"] > 1e9 and rec["pageable_bytes_per_s"] > 1e8
    assert json.loads((tmp_path / "h2d.json").read_text())["medians"]


# ---- test-backend-ops perf at the models' shapes --------------------------------------------------

FAKE_TBO = """\
static std::vector<std::unique_ptr<test_case>> make_test_cases_perf() {
    std::vector<std::unique_ptr<test_case>> test_cases;
    return test_cases;
}
bool eval_perf() {
        int64_t total_time_us = 0;
        int total_runs = 0;
        do {
            total_time_us += 1;
            reinit_perf_iter(ctx.get());
        } while (total_time_us < 1000*1000);
}
int main() {
        if (ggml_backend_set_n_threads_fn) {
            ggml_backend_set_n_threads_fn(backend.get(), std::max<int>(1, N_THREADS/2));
        }
}
"""


def test_perf_cases_patch_reads_the_case_file_first(tmp_path):
    (tmp_path / "tests").mkdir()
    f = tmp_path / "tests/test-backend-ops.cpp"
    f.write_text(FAKE_TBO)
    assert P.apply(tmp_path, P.PERF_CASES, "perf-cases")
    text = f.read_text()
    assert text.index('getenv("PREFETCH_SIM_PERF_CASES")') < text.index("std::vector<std::unique_ptr<test_case>> test_cases;")
    assert text.index('getenv("PREFETCH_SIM_THREADS")') > text.index("N_THREADS/2")
    # the shorter minimum time: read once before the loop, tested after each timed run
    assert text.index('getenv("PREFETCH_SIM_PERF_MIN_US")') < text.index("do {")
    assert text.index("total_time_us >= psim_min_us") > text.index("reinit_perf_iter")
    for op in ("MUL_MAT_B", "SOFT_MAX", "FLASH_ATTN_EXT", "MUL_MAT_ID"):
        assert f'op == "{op}"' in text
    assert not P.apply(tmp_path, P.PERF_CASES, "perf-cases")
    assert set(P.PATCHES) == {"copy-log", "perf-cases", "split-time", "phase-time", "realloc-log", "node-time", "prefetch"}


def test_model_cases_cover_every_weight_shape_with_its_type():
    from calibrate.llamacpp.perf_cases import TOKENS, model_cases

    cases = model_cases(REPO / "scenarios/models/qwen3-30b-a3b.toml")
    mm = {c.args[:2] + c.args[3:] for c in cases if c.op == "MUL_MAT"}
    # attention q (Q4_K, 4096 x 2048), attn_v on both Q4_K and Q6_K layers, output Q6_K
    assert ("Q4_K", 4096, 2048) in mm and ("Q6_K", 512, 2048) in mm and ("Q4_K", 512, 2048) in mm
    assert ("Q6_K", 151936, 2048) in mm
    ids = {c.args for c in cases if c.op == "MUL_MAT_ID"}
    assert ("Q4_K", 128, 8, 768, 512, 2048) in ids and ("Q6_K", 128, 8, 2048, 512, 768) in ids
    assert {c.args[4] for c in cases if c.op == "MUL_MAT_ID"} == set(TOKENS)
    fa = [c for c in cases if c.op == "FLASH_ATTN_EXT"]
    assert fa and all(c.args[:3] == (128, 32, 4) for c in fa)
    dense = model_cases(REPO / "scenarios/models/gemma3-27b.toml")
    assert not any(c.op == "MUL_MAT_ID" for c in dense)
    assert any(c.op == "MUL_MAT" and c.args[1] == 262144 for c in dense)  # the tied output projection


def test_write_cases_selects_ops_and_tokens(tmp_path):
    from calibrate.llamacpp.perf_cases import write_cases

    cases = write_cases(tmp_path / "c.txt", [REPO / "scenarios/models/gpt-oss-20b.toml"], tokens=(1, 8),
                        ops=("MUL_MAT_ID",))
    lines = (tmp_path / "c.txt").read_text().splitlines()
    assert lines[0].startswith("#") and len(lines) == len(cases) + 1
    assert all(ln.startswith("MUL_MAT_ID MXFP4 32 4 ") for ln in lines[1:])
    assert {ln.split()[5] for ln in lines[1:]} == {"1", "8"}


def test_parse_perf_reads_timings_and_backends():
    from calibrate.llamacpp.perf_cases import parse_perf

    log = ("Backend 1/2: CUDA0\n  Device description: NVIDIA H200\n"
           "  MUL_MAT(type_a=q4_K,type_b=f32,m=768,n=8,k=2048,bs=[1,1],nr=[1,1],per=[0,1,2,3],k_v=0,o=1,"
           "src_overlap=0,m_v=0,pad=0):   318 runs -  31.70 us/run -  25.17 MFLOP/run - \x1b[1;34m  7.94 GFLOPS\x1b[0m\n"
           "ggml_backend_cuda_graph_compute: CUDA graph warmup complete\n"
           "Backend 2/2: CPU\n"
           "  MUL_MAT_ID(type_a=q4_K,type_b=f32,n_mats=128,n_used=8,b=0,m=768,n=32,k=2048,amax=1.000000,m_v=0):"
           "   40 runs - 29897.08 us/run - 805.31 MFLOP/run - 26.94 GFLOPS\n")
    df = parse_perf(log)
    assert list(df["backend"]) == ["CUDA0", "CPU"] and list(df["op"]) == ["MUL_MAT", "MUL_MAT_ID"]
    assert df["us_per_run"].tolist() == [31.70, 29897.08]
    assert df.loc[0, "type_a"] == "q4_K" and df.loc[0, "m"] == 768 and df.loc[1, "n_mats"] == 128
    assert df.loc[0, "bs"] == "[1,1]"


def test_committed_perf_logs_parse():
    from calibrate.llamacpp.perf_cases import parse_perf

    for name, op in (("MUL_MAT", "MUL_MAT"), ("MUL_MAT_ID", "MUL_MAT_ID")):
        df = parse_perf((REPO / f"data/llamacpp/h200-20261201/perf/{name}.txt").read_text())
        assert len(df) >= 10 and set(df["op"]) == {op} and set(df["backend"]) == {"CUDA0"}
        assert (df["us_per_run"] > 0).all()


def test_heldout_split_is_fixed_and_covers_every_regime_on_unseen_configurations():
    from calibrate.llamacpp.split import is_fit_row, label
    from sim.views.llamabench import read_llama_bench

    df = read_llama_bench(REPO / "data/llamacpp/h200-20261201/llama-bench.jsonl")
    lab = label(df)
    fit, held = df[lab == "fit"], df[lab == "heldout"]
    assert len(fit) == 40 and len(held) == 86
    assert not held.empty and not fit["model_filename"].str.contains("gpt-oss").any()
    assert set(fit["n_ubatch"]) <= {128, 512, 4096} and 2048 in set(held["n_ubatch"])
    # the default scenario's configuration is never fitted on
    assert not fit["n_cpu_moe"].isin([12, 24, 36]).any()
    row = {"model_filename": "/x/qwen3-30b-a3b.gguf", "load_mode": "none", "n_ubatch": 512, "n_gpu_layers": 99,
           "n_cpu_moe": 48, "tensor_buft_overrides": "none"}
    assert is_fit_row(row)
    assert not is_fit_row({**row, "n_cpu_moe": 24}) and not is_fit_row({**row, "load_mode": "mmap"})
    assert not is_fit_row({**row, "model_filename": "gpt-oss-20b.gguf", "n_cpu_moe": 24})
    # the project's prefetch patch on: held out (the fit is of the baseline scheduler); off: as upstream
    assert not is_fit_row({**row, "prefetch_weights": 1}) and not is_fit_row({**row, "prefetch_expert_slots": 3})
    assert is_fit_row({**row, "prefetch_weights": 0, "prefetch_gate": 512, "prefetch_expert_slots": 0})
    assert is_fit_row({**row, "prefetch_weights": float("nan")})


def test_committed_rows_are_attributed_to_their_invocations():
    """Routing runs write routing.jsonl, so they must not count towards llama-bench.jsonl's rows."""
    from calibrate.llamacpp import compare as cmp
    from sim.views.llamabench import read_llama_bench

    run = REPO / "data/llamacpp/h200-20261201"
    inv = cmp.read_invocations(run / "invocations.jsonl")
    owners = cmp._attribute(read_llama_bench(run / "llama-bench.jsonl"), inv)
    assert len(owners) == 126 and all(o is not None and o["kind"] == "bench" for o in owners)
    assert owners[0]["id"] == "qwen3-ncmoe24-default" and owners[-1]["id"] == "gemma3-ngl31-mmap"


def test_a_gguf_that_is_not_the_named_model_is_noted():
    from calibrate.llamacpp import compare as cmp
    from sim.views.llamabench import read_llama_bench
    from sim.model.specs import load_hardware, load_model

    run = REPO / "data/llamacpp/h200-20261201"
    row = read_llama_bench(run / "llama-bench.jsonl").iloc[0].to_dict()
    model = load_model(REPO / "scenarios/models/qwen3-30b-a3b.toml")
    hw = load_hardware(REPO / "scenarios/hardware/h200.toml")
    assert not any("model_size" in n for n in cmp.row_case(row, model, hw).notes)
    tiny = cmp.row_case({**row, "model_size": 31790336}, model, hw)
    assert any(re.search(r"model_size \d+\.\d\d MiB differs from the model file's 17\.28 GiB", n) for n in tiny.notes)


def test_harness_commands_check_their_inputs_first(tmp_path, capsys):
    from calibrate.llamacpp.__main__ import main
    from calibrate.llamacpp.perf_cases import main as perf_main

    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "llama-bench.jsonl").write_text("{}\n")
    (run / "logs" / "a.log").write_text("x")
    assert main(["report", str(run), "--hardware", str(tmp_path / "nope.toml")]) == 2
    assert (run / "logs" / "a.log").is_file() and not (run / "logs.tar.gz").exists()  # nothing packed
    assert main(["grid", "--bench", sys.executable, "--models", str(tmp_path / "none"), "--out", str(tmp_path / "o")]) == 2
    (tmp_path / "m").mkdir()
    assert main(["grid", "--bench", sys.executable, "--models", str(tmp_path / "m"), "--out", str(tmp_path / "o")]) == 2
    assert not (tmp_path / "o").exists()
    err = capsys.readouterr().err
    assert "is not a folder" in err and "lacks gemma3-27b.gguf" in err
    assert perf_main(["write", str(tmp_path)]) == 2
    assert perf_main(["parse", str(REPO / "README.md")]) == 2
    assert "is a folder" in capsys.readouterr().err


def test_predict_writes_one_llamabench_jsonl_per_run(tmp_path):
    from calibrate.llamacpp.predict import main as predict_main

    root = Path(__file__).resolve().parent.parent
    grid = tmp_path / "g.toml"
    grid.write_text(f'''[grid]
name = "t"
perf = []
[[model]]
key = "tiny"
toml = "{root / 'scenarios/tiny/tiny-moe.toml'}"
[[run]]
id = "a"
model = "tiny"
args = "-ngl 99 -ncmoe 1,2 -p 64 -n 4 -ub 32"
''')
    assert predict_main([str(grid), "--scenario", str(root / "scenarios/tiny/tiny.toml"), "--out",
                         str(tmp_path / "out"), "-r", "1"]) == 0
    rows = [json.loads(x) for x in (tmp_path / "out" / "a.jsonl").read_text().splitlines()]
    assert sorted((r["n_cpu_moe"], r["n_prompt"], r["n_gen"]) for r in rows) == [(1, 0, 4), (1, 64, 0), (2, 0, 4), (2, 64, 0)]
    assert all(r["avg_ts"] > 0 for r in rows)
    # more blocks with host experts: prefill no faster
    pp = {r["n_cpu_moe"]: r["avg_ts"] for r in rows if r["n_prompt"]}
    assert pp[2] <= pp[1]
    # a run with the prefetch patch's flags: its rows are those variants, with their fields
    pf = tmp_path / "pf.toml"
    pf.write_text(grid.read_text().replace("-ncmoe 1,2 -p 64 -n 4", "-ncmoe 2 -p 64 -n 0 -pw 0,1 -pwg 0 -pes 0,2"))
    assert predict_main([str(pf), "--scenario", str(root / "scenarios/tiny/tiny.toml"), "--out",
                         str(tmp_path / "pfout"), "-r", "1"]) == 0
    got = [json.loads(x) for x in (tmp_path / "pfout" / "a.jsonl").read_text().splitlines()]
    assert [(r["variant"], r["prefetch_weights"], r["prefetch_gate"], r["prefetch_expert_slots"]) for r in got] == [
        ("baseline", 0, 0, 0), ("slots2", 0, 0, 2), ("prefetch_ungated", 1, 0, 0)]  # -pw 1 -pes 2: not simulated
    assert got[0]["speedup_vs_baseline"] is None and all(r["speedup_vs_baseline"] > 1 for r in got[1:])
    bad = tmp_path / "bad.toml"
    bad.write_text(grid.read_text().replace("-ncmoe 1,2", "-ncmoe 1 -fa 0 -ctv q8_0"))  # llama.cpp refuses it
    assert predict_main([str(bad), "--scenario", str(root / "scenarios/tiny/tiny.toml"), "--out",
                         str(tmp_path / "out2")]) == 2
    assert not (tmp_path / "out2").exists()
    # a good run then a refused one: nothing written (not the good run's file either), no work folder left
    two = tmp_path / "two.toml"
    two.write_text(grid.read_text() + '[[run]]\nid = "b"\nmodel = "tiny"\nargs = "-ngl 99 -ot exps=CUDA1 -p 64 -n 0"\n')
    assert predict_main([str(two), "--scenario", str(root / "scenarios/tiny/tiny.toml"), "--out",
                         str(tmp_path / "out3")]) == 2
    assert sorted(p.name for p in tmp_path.iterdir() if "out3" in p.name) == []
    assert predict_main([str(grid), "--scenario", str(root / "scenarios/tiny/tiny.toml"), "--out",
                         str(tmp_path / "out4"), "-r", "0"]) == 2 and not (tmp_path / "out4").exists()
    # without -r: llama-bench's -r as the grid gives it (5 by default, a run's own when set)
    assert predict_main([str(grid), "--scenario", str(root / "scenarios/tiny/tiny.toml"), "--out",
                         str(tmp_path / "out5")]) == 0
    rows = [json.loads(x) for x in (tmp_path / "out5" / "a.jsonl").read_text().splitlines()]
    assert {len(r["samples_ts"]) for r in rows} == {5}
    grid.write_text(grid.read_text().replace('args = "-ngl', 'repetitions = 2\nargs = "-ngl'))
    assert predict_main([str(grid), "--scenario", str(root / "scenarios/tiny/tiny.toml"), "--out",
                         str(tmp_path / "out6")]) == 0
    rows = [json.loads(x) for x in (tmp_path / "out6" / "a.jsonl").read_text().splitlines()]
    assert {len(r["samples_ts"]) for r in rows} == {2}


def test_parse_split_time_lines_and_their_errors():
    from calibrate.llamacpp.splittime import graph_table, kv_store_splits, parse_split_time

    line = ("prefetch-sim split-time: graph=3 ne1=512 n_splits=3 gap_us=40 total_us=900 "
            "splits=0:CPU:0:0:0:0:100,1:CUDA0:1:4096:5:20:30,2:CPU:2:%d:7:9:300\n" % (2 * 512 * 8))
    gs = parse_split_time("noise\n" + line + line.replace("graph=3", "graph=4").replace("gap_us=40", "gap_us=-1"))
    assert len(gs) == 2 and gs[0].ne1 == 512 and gs[0].gap_s == pytest.approx(40e-6) and math.isnan(gs[1].gap_s)
    s = gs[0].splits
    assert [x.backend for x in s] == ["CPU", "CUDA0", "CPU"] and s[2].compute_s == pytest.approx(300e-6)
    tab = graph_table(gs)
    assert tab.loc[0, "embd_s"] == pytest.approx(100e-6) and tab.loc[0, "cpu_compute_s"] == pytest.approx(300e-6)
    assert tab.loc[0, "gpu_copy_s"] == pytest.approx(20e-6) and tab.loc[0, "n_cpu"] == 1
    # one such split per graph is not a KV store (one per CPU layer)
    assert kv_store_splits(gs).empty
    with pytest.raises(ValueError, match=r"log:1: malformed split-time line"):
        parse_split_time("prefetch-sim split-time: graph=1 ne1=2 splits=0:CPU:0")


def test_mapped_h2d_probe_copies_from_a_file_mapping_and_cleans_up(tmp_path, monkeypatch):
    """The mapped probe with a stand-in for CuPy: every copy reads the mapping's bytes at its
    offset into the device buffer, one record per size, the temporary file removed."""
    import tempfile
    import types

    import numpy as np

    from calibrate.llamacpp import h2d_probe

    copies = []

    class Buf:
        def __init__(self, n):
            self.a = np.zeros(n, dtype=np.uint8)
            self.data = types.SimpleNamespace(ptr=self.a.ctypes.data)

    def memcpy(dst, src, n, kind):
        import ctypes
        ctypes.memmove(dst, src, n)
        copies.append((n, kind))

    fake = types.SimpleNamespace(
        uint8=np.uint8, empty=lambda n, dtype=None: Buf(n),
        cuda=types.SimpleNamespace(Device=lambda: types.SimpleNamespace(synchronize=lambda: None),
                                   runtime=types.SimpleNamespace(memcpy=memcpy, memcpyHostToDevice=1)))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    recs = h2d_probe.measure_mapped(fake, [4096, 3 * 4096], reps=3)
    assert [(r["memory"], r["nbytes"], r["n"]) for r in recs] == [("mapped", 4096, 3), ("mapped", 3 * 4096, 3)]
    assert all(r["gb_per_s"] > 0 for r in recs) and len(copies) == 6 and {k for _, k in copies} == {1}
    assert not list(tmp_path.glob("psim-mapped-*"))


@pytest.mark.parametrize("where", ["grid", "run"])
def test_grid_repetitions_are_bounded(tmp_path, where):
    """A grid's ``repetitions`` (the grid's and a run's) is bounded as ``-r`` is
    (sim.bounds.REPETITIONS_MAX), naming the field."""
    from sim.bounds import REPETITIONS_MAX

    big = REPETITIONS_MAX + 1
    grid = f"repetitions = {big}\n" if where == "grid" else ""
    run = f"repetitions = {big}\n" if where == "run" else ""
    p = tmp_path / "g.toml"
    p.write_text(f'[grid]\nname = "t"\n{grid}\n[[model]]\nkey = "m"\ntoml = "scenarios/models/qwen3-30b-a3b.toml"\n\n'
                 f'[[run]]\nid = "a"\nmodel = "m"\nargs = "-p 64"\n{run}')
    with pytest.raises(ScenarioError) as ei:
        G.load_grid(p)
    assert "repetitions" in str(ei.value.field) and str(p) in str(ei.value)


@pytest.mark.parametrize("cmd", ["lease", "start"])
def test_a_missing_source_archive_is_refused_before_anything_is_written(tmp_path, capsys, cmd):
    """lease/start with a --src that does not exist stop at once (before the GGUFs, tens of GB),
    in one line naming --src, and create no work folder."""
    from calibrate.llamacpp.__main__ import main

    work = tmp_path / "w"
    assert main([cmd, "--src", str(tmp_path / "nope.tgz"), "--work", str(work)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--src" in err and "nope.tgz" in err
    assert not work.exists()


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _report_run(tmp_path: Path) -> Path:
    """Two rows (tiny MoE) of the compare tests' run folder, with a plain logs/ folder."""
    run = tmp_path / "run"
    run.mkdir()
    src = REPO / "tests" / "data" / "llamacpp" / "h200-test"
    rows = (src / "llama-bench.jsonl").read_text().splitlines()
    (run / "llama-bench.jsonl").write_text(rows[8] + "\n" + rows[9] + "\n")
    invs = [{k: v for k, v in json.loads(x).items() if k != "rows"}
            for x in (src / "invocations.jsonl").read_text().splitlines() if x.strip()]
    (run / "invocations.jsonl").write_text("".join(json.dumps(x) + "\n" for x in invs))
    (run / "logs").mkdir()
    (run / "logs" / "tiny-ot-exps.log").write_text("a log\n")
    return run


@pytest.mark.parametrize("edit, words", [
    # a malformed row: read before anything is packed (it used to fail in the routing check, logs/ gone)
    (lambda run: (run / "llama-bench.jsonl").write_text(
        (run / "llama-bench.jsonl").read_text().replace('"n_prompt"', '"n_promptx"', 1)),
     "field 'n_prompt, line 1': missing required field"),
    (lambda run: (run / "invocations.jsonl").write_text("{not json\n"), "invocations.jsonl: field 'line 1': malformed"),
    (lambda run: (run / "llama-bench.jsonl").write_text(
        (run / "llama-bench.jsonl").read_text().replace('"avg_ts": ', '"avg_ts": 1e300, "x": ')),
     "field 'avg_ts, line 1'"),
])
def test_a_failing_report_leaves_the_run_folder_as_it_was(tmp_path, capsys, edit, words):
    from calibrate.llamacpp.__main__ import main

    run = _report_run(tmp_path)
    edit(run)
    before = _tree(run)
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert _tree(run) == before and (run / "logs").is_dir() and not (run / "logs.tar.gz").exists()


def test_a_report_whose_comparison_fails_writes_nothing(tmp_path, capsys, monkeypatch):
    """The last step failing (here: no row can be simulated on the profile) leaves no routing check
    files and logs/ unpacked: the logs are packed only once everything else is written."""
    from calibrate.llamacpp import compare as cmp
    from calibrate.llamacpp.__main__ import main

    run = _report_run(tmp_path)
    before = _tree(run)
    monkeypatch.setattr(cmp, "main", lambda argv: 2)
    assert main(["report", str(run)]) == 2
    assert _tree(run) == before and (run / "logs").is_dir()


def test_a_report_writes_its_files_then_packs_the_logs(tmp_path, capsys):
    from calibrate.llamacpp.__main__ import main

    run = _report_run(tmp_path)
    assert main(["report", str(run), "--hardware", "h200-llamacpp"]) == 0
    names = {p.name for p in run.iterdir()}
    assert {"compare_llamacpp.csv", "compare_llamacpp.md", "compare_llamacpp.png", "routing_check.txt",
            "routing_check_counted.csv", "routing_check_timed.csv", "logs.tar.gz"} <= names
    assert not (run / "logs").exists() and G.read_log(run, "logs/tiny-ot-exps.log") == "a log\n"
    out = capsys.readouterr().out
    assert "Counted by the scheduler" in out and (run / "routing_check.txt").read_text() in out


@pytest.mark.slow  # reads ten split-timed logs (6-9 s): in the slow run
def test_cpu_decomposition_splits_a_machines_cpu_side_into_a_cost_per_split_and_a_throughput(capsys, tmp_path):
    """On the committed tg6 lease (Qwen3 -ncmoe 48: 48 small CPU splits per token; gpt-oss -ncmoe
    24: 24 large ones) the least squares recovers the per-invocation times it was given within the
    load-to-load spread, the profile's parts add up to the profile's own price, and one model at
    several -ncmoe (a single ratio of splits to bytes) is refused."""
    from calibrate.llamacpp import splittime as ST
    from sim.model.specs import load_hardware
    from calibrate.llamacpp.compare import DEFAULT_HARDWARE

    run = REPO / "data" / "llamacpp" / "h200-20261204-tg6"
    df, a, scale = ST.cpu_decomposition(run)
    assert len(df) == 10 and set(df["cpu_splits"]) == {24, 48}
    assert 0.0 <= a < 50e-6 and 0.6 < scale < 0.9          # this machine: a small cost per split
    assert df["residual"].abs().max() < 0.15
    g = load_hardware(DEFAULT_HARDWARE).ggml
    q = df[df["cpu_splits"] == 48].iloc[0]
    assert q["profile_ms"] == pytest.approx(48 * g.cpu_split_host_s * 1e3 + q["fixed_ms"] + q["scaled_ms"] / g.cpu_rate_scale)
    with pytest.raises(ST.PrefetchSimError, match="cannot be told apart"):
        ST.cpu_decomposition(_only(run, ("a-st-qwen3", "b-st-qwen3"), tmp_path / "q"))
    # the command line, on the first pass's two loads (a copy: two logs to read, not ten)
    assert ST.main(["--cpu", str(_only(run, ("a-st-",), tmp_path / "a"))]) == 0
    assert "cpu_split_us" in capsys.readouterr().out


@pytest.mark.slow  # reads ten split-timed logs (6-9 s): in the slow run
def test_cpu_decomposition_refuses_a_log_with_no_cpu_time_or_a_negative_fit(monkeypatch, tmp_path):
    """A split-timed invocation whose CPU splits took no time (a log of another run, an edited
    backend name), or times that only a negative cost per split or rate fits, give no figure."""
    from calibrate.llamacpp import splittime as ST

    run = _only(REPO / "data" / "llamacpp" / "h200-20261204-tg6", ("a-st-",), tmp_path / "a")
    real = ST.summary

    def edited(scale_q, scale_g):
        def f(run_dir):
            t = real(run_dir).copy()
            q = t["invocation"].str.contains("qwen3")
            t.loc[q, "cpu_compute_ms"] *= scale_q
            t.loc[~q, "cpu_compute_ms"] *= scale_g
            return t
        return f

    monkeypatch.setattr(ST, "summary", edited(0.0, 1.0))
    with pytest.raises(ST.PrefetchSimError, match="a-st-qwen3-ncmoe48: its decode graphs' CPU splits took 0 ms"):
        ST.cpu_decomposition(run)
    monkeypatch.setattr(ST, "summary", edited(0.3, 1.0))  # Qwen3's 48 splits far faster than gpt-oss's 24:
    df, a, scale = ST.cpu_decomposition(run)               # a free fit's cost per split is negative; bounded at 0
    y = df["measured_ms"] - df["fixed_ms"]
    assert a == 0.0 and 1 / scale == pytest.approx(float((df["scaled_ms"] * y).sum() / (df["scaled_ms"] ** 2).sum()))
    monkeypatch.setattr(ST, "summary", edited(0.01, 0.01))  # times below the profile's fixed part: no rate fits
    with pytest.raises(ST.PrefetchSimError, match="no throughput fits"):
        ST.cpu_decomposition(run)


def _only(run: Path, keys: tuple[str, ...], out: Path) -> Path:
    """``out`` made a copy of ``run`` whose invocations (and their llama-bench rows) are those whose id has one of
    ``keys``."""
    out.mkdir(parents=True, exist_ok=True)
    for f in ("gguf.jsonl", "meta.json", "logs.tar.gz"):
        if (run / f).exists():
            shutil.copy(run / f, out / f)
    invs = [json.loads(ln) for ln in (run / "invocations.jsonl").read_text().splitlines() if ln.strip()]
    rows = [ln for ln in (run / "llama-bench.jsonl").read_text().splitlines() if ln.strip()]
    keep_inv, keep_rows, i = [], [], 0
    for inv in invs:
        n = inv.get("rows", 0)
        if any(k in inv["id"] for k in keys):
            keep_inv.append(json.dumps(inv))
            keep_rows += rows[i:i + n]
        i += n
    (out / "invocations.jsonl").write_text("\n".join(keep_inv) + "\n")
    (out / "llama-bench.jsonl").write_text("\n".join(keep_rows) + "\n")
    return out


def test_a_cpu_layers_q_norm_runs_on_the_gpu_in_decode_as_llama_cpp_splits_it():
    """A Gemma -ngl 31 decode: llama.cpp runs two splits per CPU layer (the q-norm MUL, Q's ROPE
    and SCALE on the GPU: the op-offload rule reads ne[1] = 32 heads; h200-20261204-sched), 66
    per one-token graph in -splits' timing. The simulator's plan has the same count, one q-norm
    item per CPU layer, none for the GPU layers, none at an offloaded batch and none with -nopo."""
    from dataclasses import replace as dc_replace

    from calibrate.llamacpp import splittime as ST
    from calibrate.llamacpp.compare import DEFAULT_HARDWARE, build_cases
    from sim.plan.builder import build_plan, graph_items, make_context, offloaded_head_norms
    from sim.engines.metrics import fit_context_to_tests, rep_rng
    from sim.model.specs import load_hardware

    run = REPO / "data" / "llamacpp" / "h200-20261201-splits"
    tab = ST.summary(run)
    measured = tab[(tab.invocation == "st-gemma3-ngl31-tg") & (tab.n_tokens == 1)]["n_splits"].iloc[0]
    hw = load_hardware(DEFAULT_HARDWARE)
    bench, owners, cases, _ = build_cases(run, hw, repetitions=1)
    case = next(c for (_l, r), inv, c in zip(bench.iterrows(), owners, cases)
                if inv and inv["id"] == "st-gemma3-ngl31-tg" and r["n_prompt"] == 0)
    scn = fit_context_to_tests(case.scenario, list(case.tests))
    v, t = scn.variants[0], case.tests[0]
    ctx = make_context(scn, v, rep_rng(0, -1, -1))
    plan = build_plan(scn, v, t, rep_rng(0, 0, 0), ctx)
    assert len({o.split for o in plan.ops if o.graph == 0}) == measured == 66
    cpu_layers = [i for i, d in enumerate(ctx.layer_dev) if d < 0]
    items = graph_items(ctx, 1, 0, 0)
    norms = [it for it in items if it.name.endswith("attn_q_norm.weight")]
    assert [it.layer for it in norms] == cpu_layers and all(it.host and not it.cpu for it in norms)
    assert not any(it.name.endswith("attn_k_norm.weight") for it in items)   # 16 KV heads < 32
    assert offloaded_head_norms(ctx, cpu_layers[0], 32) == []               # the whole layer is offloaded
    nopo = dc_replace(scn, placement=dc_replace(scn.placement, op_offload_min_batch=2**31 - 1))
    assert offloaded_head_norms(make_context(nopo, v, rep_rng(0, -1, -1)), cpu_layers[0], 1) == []


def test_a_truncated_gzipped_log_is_one_error_naming_it(tmp_path):
    import gzip as _gzip

    from calibrate.llamacpp.logs import read_text

    p = tmp_path / "x.err.gz"
    p.write_bytes(_gzip.compress(b"prefetch-sim split-time: line\n" * 200)[:40])
    with pytest.raises(ScenarioError, match="cannot read the gzipped log") as ei:
        read_text(p)
    assert str(p) in str(ei.value)


def test_fit_adds_up_repeated_params_and_names_a_bad_cpu_table(tmp_path, capsys):
    from calibrate.llamacpp import fit as F

    run = str(REPO / "data" / "llamacpp" / "h200-20261203-tg4")
    rc = F.main(["--run", run, "--params", "cpu_split_us,bogus", "--params", "cpu_rate_scale",
                 "--out", str(tmp_path / "o.toml")])
    err = capsys.readouterr().err
    assert rc == 2 and "'cpu_split_us,bogus,cpu_rate_scale'" in err and "'bogus' unknown" in err
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2,3\n")
    rc = F.main(["--run", run, "--cpu-table", str(bad), "--params", "cpu_split_us", "--out", str(tmp_path / "o.toml")])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and f"--cpu-table {bad}" in err and ".fit-" not in err
    assert not (tmp_path / "o.toml").exists()


def test_fit_names_the_timed_invocations_of_a_run_it_fits_on():
    from calibrate.llamacpp.fit import timed_invocations

    assert timed_invocations(REPO / "data" / "llamacpp" / "h200-20261201") == []
    got = timed_invocations(REPO / "data" / "llamacpp" / "h200-20261204-tg6")
    assert len(got) == 10 and all("-st-" in g for g in got)


def test_fit_rows_leave_out_the_invocations_named_with_their_reason(capsys):
    """fit --untimed: the split-timed loads of a run (their syncs cost Qwen3 up to 20 % of its t/s)
    are not fit rows; the plain loads of the same configurations are."""
    from calibrate.llamacpp.fit import fit_rows, timed_invocations
    from sim.model.specs import load_hardware

    run = REPO / "data" / "llamacpp" / "h100-20261206-tg9"
    hw = load_hardware(REPO / "scenarios" / "hardware" / "h200-llamacpp.toml")
    timed = timed_invocations(run)
    assert sorted(timed) == ["a-st-gemma3-ffn-cpu", "a-st-gptoss-ncmoe24", "a-st-qwen3-ncmoe48",
                             "b-st-gemma3-ffn-cpu", "b-st-gptoss-ncmoe24", "b-st-qwen3-ncmoe48"]
    cases, t_all, rows_all = fit_rows(run, hw)
    capsys.readouterr()
    cases, t_plain, rows_plain = fit_rows(run, hw, skip_invocations=timed)
    err = capsys.readouterr().err
    assert len(rows_all) == 8 and len(rows_plain) == 4 and len(cases) == 4
    assert err.count("ran with a timing patch on (--untimed)") == 4
    assert set(t_plain) <= set(t_all)  # the plain loads' test times, unchanged
    assert set(rows_plain.index) == {line for line in rows_all.index if line not in (1, 2, 23, 24)}


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_harness_writers_refuse_a_folder_that_takes_no_file_before_any_work(capsys):
    """prepare, collect, routing_check, predict and gguf_writer: an --out in /proc (a folder that
    exists and refuses new files) is one line naming the file, before the work, no traceback."""
    from calibrate.llamacpp import __main__ as H
    from calibrate.llamacpp import gguf_writer, predict, routing_check

    calls = [
        (H.main, ["prepare", "--out", "/proc/x.tgz"], "'/proc/x.tgz'"),
        (H.main, ["collect", "--work", "/nonexistent-work", "--out", "/proc/x", "--wait", "0"], "folder '/proc/x'"),
        (routing_check.main, ["/nonexistent-run", "--out", "/proc/x"], "'/proc/x_counted.csv'"),
        (predict.main, ["/nonexistent-grid.toml", "--scenario", "s.toml", "--out", "/proc/p"], "folder '/proc/p'"),
        (gguf_writer.main, ["--model", "qwen3-30b-a3b", "--tiny", "--out", "/proc/x.gguf"], "'/proc/x.gguf'"),
    ]
    for fn, argv, named in calls:
        rc = fn(argv)
        err = capsys.readouterr().err
        assert rc == 2, argv
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert named in err and "does not accept new files" in err, err


def test_the_harness_counts_one_run_in_the_singular(tmp_path, capsys, monkeypatch):
    """plan, predict and a grid cut by its deadline said '1 runs', '1 bench rows': a count of
    one is singular, other counts (0, 2) stay plural."""
    from calibrate.llamacpp.__main__ import main
    from calibrate.llamacpp.predict import main as predict_main
    from sim.wording import plural

    assert (plural(1, "run"), plural(0, "run"), plural(2, "copy", "copies")) == ("1 run", "0 runs", "2 copies")
    p = _write_grid(tmp_path, '[[run]]\nid = "a"\nmodel = "m"\nargs = "-p 64 -n 0"\n')
    assert main(["plan", "--grid", str(p)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "1 run, 1 bench row, 0 routing rows"
    assert " 1 row   -p 64 -n 0" in out[0]
    two = _write_grid(tmp_path, '[[run]]\nid = "a"\nmodel = "m"\nargs = "-p 64,128 -n 0"\n'
                                '[[run]]\nid = "b"\nmodel = "m"\nargs = "-p 64 -n 0"\n')
    assert main(["plan", "--grid", str(two)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "2 runs, 3 bench rows, 0 routing rows" and " 2 rows  -p 64,128 -n 0" in out[0]

    root = Path(__file__).resolve().parent.parent
    grid = tmp_path / "tiny.toml"
    grid.write_text(f'[grid]\nname = "t"\nperf = []\n[[model]]\nkey = "tiny"\n'
                    f'toml = "{root / "scenarios/tiny/tiny-moe.toml"}"\n'
                    '[[run]]\nid = "a"\nmodel = "tiny"\nargs = "-ngl 99 -p 64 -n 0 -ub 32"\n')
    assert predict_main([str(grid), "--scenario", str(root / "scenarios/tiny/tiny.toml"), "--out",
                         str(tmp_path / "out"), "-r", "1"]) == 0
    assert capsys.readouterr().out == f"1 run predicted -> {tmp_path / 'out'}\n"

    now = [0.0]  # the grid's clock: the first run outlasts the deadline

    def one(run, *a, **k):
        now[0] = 200.0
        return {"id": run.id, "rc": 0, "rows": 1}

    monkeypatch.setattr(G, "run_one", one)
    monkeypatch.setattr(G.time, "monotonic", lambda: now[0])
    said = []
    recs = G.run_grid(G.load_grid(two), "llama-bench", tmp_path, tmp_path / "grid", deadline_at=100.0,
                      say=said.append)
    assert len(recs) == 1 and said == ["[grid] deadline reached before b; 1 run done this time"]


def test_predict_gives_a_run_llama_bench_s_placement_defaults_not_the_scenarios(tmp_path):
    """A grid run that leaves out -ngl, -ncmoe or -lm runs llama-bench with its defaults (-ngl -1,
    -ncmoe 0, -lm auto); its prediction does too, whatever the scenario's placement."""
    from calibrate.llamacpp.predict import main as predict_main

    root = Path(__file__).resolve().parent.parent
    grid = tmp_path / "g.toml"
    grid.write_text(f'''[grid]
name = "t"
perf = []
[[model]]
key = "q"
toml = "{root / 'scenarios/models/qwen3-30b-a3b.toml'}"
[[run]]
id = "a"
model = "q"
args = "-p 64 -n 0"
[[run]]
id = "b"
model = "q"
args = "-ngl 99 -ncmoe 24 -lm none -p 64 -n 0"
''')
    assert predict_main([str(grid), "--scenario", str(root / "scenarios/default.toml"), "--out",
                         str(tmp_path / "out"), "-r", "1"]) == 0
    a = json.loads((tmp_path / "out" / "a.jsonl").read_text().splitlines()[0])
    b = json.loads((tmp_path / "out" / "b.jsonl").read_text().splitlines()[0])
    assert (a["n_gpu_layers"], a["n_cpu_moe"], a["load_mode"]) == (-1, 0, "auto")
    assert (b["n_gpu_layers"], b["n_cpu_moe"], b["load_mode"]) == (99, 24, "none")


@pytest.mark.parametrize("label", ["a/b", "../escaped", ".hidden"])
def test_a_report_label_that_names_files_elsewhere_is_refused(tmp_path, capsys, label):
    """--label is part of the comparison files' names: one that would leave the run folder (or
    hide the files) is refused before anything is written."""
    from calibrate.llamacpp.__main__ import main

    run = _report_run(tmp_path)
    before = _tree(run)
    assert main(["report", str(run), "--label", label]) == 2
    err = capsys.readouterr().err
    assert "--label" in err and len(err.strip().splitlines()) == 1, err
    assert _tree(run) == before and not list(tmp_path.rglob("compare_*"))


# a stand-in of ggml-cpu.c's compute loop: the node-time patch's anchors, in the pinned tree's order,
# with just enough around them to compile and run
FAKE_CPU_LOOP = r"""
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <time.h>
struct ggml_tensor { const char * name; const char * op; int empty; };
struct ggml_cgraph { int n_nodes; struct ggml_tensor ** nodes; };
struct tp_t { int abort; };
struct ggml_compute_state { int ith; struct tp_t * threadpool; };
struct params_t { int nth; };
static int64_t ggml_time_us(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return (int64_t) t.tv_sec * 1000000 + t.tv_nsec / 1000; }
static const char * ggml_op_desc(const struct ggml_tensor * t) { return t->op; }
static int barriers = 0;
static void ggml_barrier(struct tp_t * tp) { (void) tp; barriers++; }
static void work(const struct ggml_tensor * t) { volatile double x = 0; for (int i = 0; i < 20000; i++) { x += i; } (void) t; }
static void compute_thread(struct ggml_compute_state * state, struct ggml_cgraph * cgraph) {
    struct params_t params = { 16 };
    struct tp_t * tp = state->threadpool;
    GGML_PRINT_DEBUG("thread #%d compute-start cplan %p last-graph %d\n", state->ith, (const void *)cplan, state->last_graph);
    for (int node_n = 0; node_n < cgraph->n_nodes && atomic_load_explicit(&tp->abort, memory_order_relaxed) != node_n; node_n++) {
        struct ggml_tensor * node = cgraph->nodes[node_n];
        if (node->empty) {
            continue;
        }
        work(node);
        if (node_n + 1 < cgraph->n_nodes) {
            ggml_barrier(state->threadpool);
        }
    }
    GGML_PRINT_DEBUG("thread #%d compute-done cplan %p last-graph %d\n", state->ith, (const void *)cplan, state->last_graph);

    ggml_barrier(state->threadpool);
}
int main(void) {
    struct ggml_tensor a = {"ffn_moe_gate-3", "MUL_MAT_ID", 0}, b = {"ffn_moe_gate_biased-3", "ADD_ID", 0},
                       v = {"view-3", "VIEW", 1}, c = {"ffn_moe_down-3", "MUL_MAT_ID", 0};
    struct ggml_tensor * nodes[] = {&a, &b, &c, &v};
    struct ggml_cgraph g = {4, nodes};
    struct tp_t tp = {-1};
    for (int ith = 0; ith < 2; ith++) { struct ggml_compute_state s = {ith, &tp}; compute_thread(&s, &g); }
    return 0;
}
"""


def test_node_time_patch_times_each_cpu_node_on_thread_zero_and_the_parser_reads_it(tmp_path):
    import shutil
    import subprocess

    from calibrate.llamacpp import nodetime

    src = tmp_path / "ggml/src/ggml-cpu/ggml-cpu.c"
    src.parent.mkdir(parents=True)
    src.write_text(FAKE_CPU_LOOP)
    assert P.apply(tmp_path, P.NODE_TIME, "node-time")
    text = src.read_text()
    assert not P.apply(tmp_path, P.NODE_TIME, "node-time")  # idempotent
    # read once, before the loop; a node's time taken after its barrier; the line after the last barrier
    assert text.index('getenv("PREFETCH_SIM_NODE_TIME")') < text.index("for (int node_n = 0;")
    loop_barrier = text.index("ggml_barrier(state->threadpool);")
    assert loop_barrier < text.index("psim_us[psim_cnt] = psim_now - psim_prev") < text.index("compute-done")
    assert text.rindex("ggml_barrier(state->threadpool);") < text.index('"prefetch-sim node-time: threads %d nodes %d"')
    assert "node-time" in P.PATCHES
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to run the patched stand-in")
    prog = "#include <stdatomic.h>\n#define GGML_PRINT_DEBUG(...)\n" + text
    (tmp_path / "t.c").write_text(prog)
    subprocess.run([cc, "-std=gnu11", "-O0", "-o", str(tmp_path / "t"), str(tmp_path / "t.c")], check=True)
    quiet = subprocess.run([str(tmp_path / "t")], capture_output=True, text=True, check=True)
    assert "node-time" not in quiet.stderr  # unset: nothing printed
    out = subprocess.run([str(tmp_path / "t")], capture_output=True, text=True, check=True,
                         env={**os.environ, "PREFETCH_SIM_NODE_TIME": "1"})
    nodes = nodetime.parse(out.stderr)
    # one line (thread 0 only), the three computed nodes in order (the trailing view skipped), no
    # node twice though the last computed node is not the graph's last
    assert out.stderr.count("prefetch-sim node-time:") == 1
    assert [(n.op, n.name) for n in nodes] == [("MUL_MAT_ID", "ffn_moe_gate-3"), ("ADD_ID", "ffn_moe_gate_biased-3"),
                                               ("MUL_MAT_ID", "ffn_moe_down-3")]
    assert all(n.us >= 0 and n.threads == 16 for n in nodes)
    s = nodetime.summary(nodetime.frame(nodes))
    assert s.iloc[-1]["median_us"] == pytest.approx(sum(n.us for n in nodes))


@pytest.mark.parametrize("line, msg", [
    ("prefetch-sim node-time: threads x nodes 1 | ADD_ID a-0 1.0", "is not 'threads N nodes M'"),
    ("prefetch-sim node-time: threads 4 nodes 2 | ADD_ID a-0 1.0", "1 nodes listed for nodes 2"),
    ("prefetch-sim node-time: threads 4 nodes 1 | ADD_ID a-0", "is not 'OP NAME US'"),
    ("prefetch-sim node-time: threads 4 nodes 1 | ADD_ID a-0 -3", "is negative"),
    ("prefetch-sim node-time: threads 4 nodes 1 | ADD_ID a-0 nan", "is negative"),
])
def test_node_time_parser_refuses_malformed_lines(line, msg):
    from calibrate.llamacpp import nodetime

    with pytest.raises(ValueError, match=msg):
        nodetime.parse("other\n" + line)
    assert nodetime.kind_of("ffn_moe_gate-17") == "ffn_moe_gate" and nodetime.kind_of("norm") == "norm"
