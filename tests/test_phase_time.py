"""llama.cpp's host work around each graph: the ``phase-time`` patch, its reader, and how the
simulator prices what it measured (the llama_decode call, the memory apply, a rebuilt graph's
build and direct launches, the next ubatch's host work behind the previous ubatch's GPU work)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from calibrate.llamacpp import patches as P
from calibrate.llamacpp import phasetime as PT
from sim.plan.builder import build_plan, graph_calls, graph_keys, make_context
from sim.model.costs import plan_durations
from sim.errors import PrefetchSimError
from sim.engines.metrics import rep_rng, run_variant_test, time_plan
from sim.plan.overlap import graph_host_edges, ubatch_overlap_s
from sim.model.specs import BenchTest, load_scenario

REPO = Path(__file__).resolve().parent.parent
PHASE_RUN = REPO / "data/llamacpp/h200-20261202-phase"

# stand-ins for the parts of llama-context.cpp and llama-graph.cpp the patch anchors on (our own text)
FAKE_CONTEXT = """\
void llama_context::synchronize() {
    if (!sched) {
        return;
    }

    ggml_backend_sched_synchronize(sched.get());

    // FIXME: if multiple single tokens are evaluated without a synchronization,
}

llm_graph_result * llama_context::process_ubatch(const llama_ubatch & ubatch, llm_graph_type gtype, void * mctx) {
    auto * res = get_gf_res_prev();
    const auto gparams = graph_params(res, ubatch, mctx, gtype);
    if (res->can_reuse(gparams)) {
        ggml_backend_sched_synchronize(sched.get());
    } else {
        gf = model.build_graph(gparams);
        gf_res_prev_active = res;
    }
    // set the input data for the input tensors
    {
        res->set_inputs(&ubatch);
    }
    const auto status = graph_compute(res->get_gf(), ubatch.n_tokens > 1);
    return res;
}

int llama_context::decode(const llama_batch_ext & batch_inp) {
    return 0;
}

void other() {
    res->set_inputs(&ubatch);
    auto * gf = model.build_graph(gparams);
}
"""
FAKE_GRAPH = """\
#include "llama-graph.h"

void llm_graph_result::set_inputs(const llama_ubatch * ubatch) {
    for (auto & input : inputs) {
        input->set_input(ubatch);
    }
}
"""


def _tree(root: Path) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "src/llama-context.cpp").write_text(FAKE_CONTEXT)
    (root / "src/llama-graph.cpp").write_text(FAKE_GRAPH)
    return root


def test_phase_time_patch_brackets_each_phase_in_order(tmp_path):
    tree = _tree(tmp_path / "t")
    assert P.apply(tree, P.PHASE_TIME, "phase-time")
    ctx = (tree / "src/llama-context.cpp").read_text()
    pu = ctx[ctx.index("llama_context::process_ubatch"):ctx.index("int llama_context::decode")]
    order = [pu.index(k) for k in ("psim_pt0 = psim_pt ? ggml_time_us()", "psim_pta = ggml_time_us()",
                                   "const auto gparams", "gf = model.build_graph", "psim_ptb = ggml_time_us()",
                                   "psim_ptp = ggml_time_us()", "res->set_inputs(&ubatch);",
                                   "psim_pti = ggml_time_us()", "graph_compute(res->get_gf()",
                                   "prefetch-sim phase-time: n_tokens")]
    assert order == sorted(order)
    # the sync wait is bracketed inside synchronize(), not the pipeline-parallel one of process_ubatch
    sy = ctx[:ctx.index("llama_context::process_ubatch")]
    assert sy.index("psim_pts0 =") < sy.index("ggml_backend_sched_synchronize") < sy.index("prefetch-sim sync-time")
    assert "prefetch-sim decode-time" in ctx[ctx.index("int llama_context::decode"):]
    assert ctx[ctx.index("void other()"):].count("psim") == 0
    gr = (tree / "src/llama-graph.cpp").read_text()
    assert gr.index("psim_it0 =") < gr.index("input->set_input(ubatch);") < gr.index("prefetch-sim input-time")
    assert "#include <typeinfo>" in gr
    assert not P.apply(tree, P.PHASE_TIME, "phase-time")  # idempotent
    assert "phase-time" in P.PATCHES


LOG = """\
llama_context: something
prefetch-sim decode-time: t0=1000
prefetch-sim input-time: n_tokens=4 inputs=19llm_graph_input_pos:1,23llm_graph_input_attn_kv:50
prefetch-sim phase-time: n_tokens=4 reused=0 t0=1010 apply_us=2 build_us=3 alloc_us=4 inputs_us=51 compute_us=9
prefetch-sim sync-time: t0=1100 wait_us=400
prefetch-sim decode-time: t0=1600
prefetch-sim input-time: n_tokens=1 inputs=28llm_graph_input_attn_kv_iswa:7,20llm_graph_input_embd:1
prefetch-sim phase-time: n_tokens=1 reused=1 t0=1605 apply_us=1 build_us=0 alloc_us=1 inputs_us=8 compute_us=2
prefetch-sim sync-time: t0=1620 wait_us=30
"""


def test_parse_phase_time_groups_lines_by_call():
    calls = PT.parse_phase_time(LOG)
    assert [c.t0_us for c in calls] == [1000, 1600]
    assert calls[0].ubatches[0]["mask_us"] == 50 and calls[1].ubatches[0]["mask_us"] == 7  # masks only
    assert calls[0].wait_us == 400 and calls[1].wait_us == 30
    with pytest.raises(ValueError, match="log:2: malformed phase-time"):
        PT.parse_phase_time("prefetch-sim decode-time: t0=1\nprefetch-sim phase-time: n_tokens=4 reused=0\n")


def test_expected_calls_follow_llama_bench_order():
    rows = [{"n_prompt": 4096, "n_gen": 0, "n_depth": 0, "n_batch": 2048},
            {"n_prompt": 0, "n_gen": 2, "n_depth": 512, "n_batch": 2048}]
    exp = PT.expected_calls(rows, reps=2)
    steps = [(r, s, rep, n) for r, s, rep, n, _kv in exp]
    assert steps == [(0, "warmup", -1, 2048), (0, "warmup", -1, 2048),
                     (0, "prompt", 0, 2048), (0, "prompt", 0, 2048), (0, "prompt", 1, 2048), (0, "prompt", 1, 2048),
                     (1, "warmup", -1, 1), (1, "depth", 0, 512), (1, "gen", 0, 1), (1, "gen", 0, 1),
                     (1, "gen", 1, 1), (1, "gen", 1, 1)]  # the depth is filled once, then restored
    assert [kv for *_x, kv in exp][2:4] == [0, 2048] and [kv for *_x, kv in exp][-2:] == [512, 513]


def test_the_committed_phase_lease_aligns_and_gives_the_host_figures():
    tab = PT.call_table(PHASE_RUN)
    invs = [json.loads(ln) for ln in (PHASE_RUN / "invocations.jsonl").read_text().splitlines()]
    assert set(tab["invocation"]) == {i["id"] for i in invs}
    prompt = tab[(tab["step"] == "prompt")]
    # a prompt of 2048 tokens at -ub 512 is four ubatches of one call, every one rebuilt
    multi = prompt[(prompt["n_prompt"] == 2048) & (prompt["n_ubatch"] == 512)]
    assert set(multi["ubatch"]) == {0, 1, 2, 3} and (multi["reused"] == 0).all()
    one = prompt[(prompt["n_prompt"] == 2048) & (prompt["n_ubatch"] == 2048)]
    assert (one["reused"] == 1).all()
    fig = PT.host_figures(tab, str(PHASE_RUN))
    assert set(fig) == {"mask_ns", "call_us", "call_ns_per_token", "apply_ns_per_token", "build_us_per_layer",
                        "capture_us_per_layer"}
    assert all(v >= 0 and src.startswith("measured: ") for v, src in fig.values())


def test_a_log_that_does_not_match_the_rows_is_refused(tmp_path):
    import shutil
    import tarfile

    run = tmp_path / "run"
    shutil.copytree(PHASE_RUN, run)
    with tarfile.open(run / "logs.tar.gz") as tf:
        tf.extractall(run, filter="data")
    (run / "logs.tar.gz").unlink()
    log = run / "logs/pt-qwen3-res-tg.log"
    lines = log.read_text().splitlines(keepends=True)
    drop = [i for i, ln in enumerate(lines) if ln.startswith("prefetch-sim decode-time")][10]
    log.write_text("".join(lines[:drop] + lines[drop + 1:]))
    with pytest.raises(PrefetchSimError, match="pt-qwen3-res-tg.log: .*llama_decode calls"):
        PT.call_table(run)


@pytest.mark.parametrize("edit, match", [
    (lambda inv, rows: inv[0].pop("id"), r"invocations.jsonl:1: field 'id' missing"),
    (lambda inv, rows: inv[0].update(env=5), r"invocations.jsonl:1: field 'env' must be a table"),
    (lambda inv, rows: inv[0].update(repetitions=None), r"invocations.jsonl:1: field 'repetitions' missing"),
    (lambda inv, rows: inv[0].update(rows="four"), r"invocations.jsonl:1: field 'rows' must be an integer"),
    (lambda inv, rows: rows[0].pop("n_prompt"), r"llama-bench.jsonl \(invocation pt-gptoss-res-pp\) row 1: field 'n_prompt'"),
    (lambda inv, rows: rows[0].update(n_batch=0), r"row 1: field 'n_batch' must be an integer >= 1"),
])
def test_bad_run_records_are_one_line_errors_naming_the_field(tmp_path, edit, match):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(PHASE_RUN, run)
    inv = [json.loads(ln) for ln in (run / "invocations.jsonl").read_text().splitlines()]
    rows = [json.loads(ln) for ln in (run / "llama-bench.jsonl").read_text().splitlines()]
    edit(inv, rows)
    (run / "invocations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in inv))
    (run / "llama-bench.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(PrefetchSimError, match=match):
        PT.call_table(run)


def test_phasetime_cli_refuses_a_file_and_prints_nothing_half_way(tmp_path, capsys):
    assert PT.main([str(PHASE_RUN / "meta.json")]) == 2
    out = capsys.readouterr()
    assert out.out == "" and "not a folder" in out.err


# ---- the simulator's side ---------------------------------------------------------------------

def _scenario(ub: int):
    scn = load_scenario(REPO / "scenarios/default.toml")
    from dataclasses import replace
    return replace(scn, workload=replace(scn.workload, n_ubatch=ub),
                   placement=replace(scn.placement, n_cpu_moe=0))


def test_graph_calls_rules():
    scn = _scenario(512)
    pp = BenchTest(n_prompt=2048, n_gen=0)
    r = scn.workload.repetitions
    assert graph_calls(scn, pp)[0] == (True, 2048, 0.0) and graph_calls(scn, pp)[1] == (True, 0, 0.0)
    assert graph_calls(scn, BenchTest(n_prompt=512, n_gen=0)) == [(False, 512, 1.0 / r)]
    assert graph_calls(scn, BenchTest(n_prompt=0, n_gen=8))[0] == (False, 1, 1.0 / r)
    assert graph_calls(scn, BenchTest(n_prompt=0, n_gen=8))[3] == (False, 1, 0.0)
    from dataclasses import replace
    scn7 = replace(scn, workload=replace(scn.workload, bench_repetitions=7))
    assert graph_calls(scn7, BenchTest(n_prompt=512, n_gen=0))[0][2] == 1.0 / 7


def test_a_rebuilt_graph_pays_its_launches_and_a_reused_one_does_not():
    scn = _scenario(512)
    hw = scn.hardware
    assert hw.ggml is not None and hw.ggml.launch_s > 0
    var = scn.variants[0]
    for n_prompt, expect in ((2048, True), (512, False)):
        test = BenchTest(n_prompt=n_prompt, n_gen=0)
        plan = build_plan(scn, var, test, rep_rng(scn.seed, 0, 0), make_context(scn, var, rep_rng(scn.seed, 0, -1)))
        d = plan_durations(plan, hw)
        from dataclasses import replace

        from sim.plan import KIND_CODE, STREAM_CODE, OpKind, Stream
        ctx = make_context(scn, var, rep_rng(scn.seed, 0, -1))
        plain = plan_durations(plan, hw.with_(ggml=replace(hw.ggml, launch_s=0.0)))
        gpu = (plan.arrays.kind != KIND_CODE[OpKind.H2D]) & (plan.arrays.stream == STREAM_CODE[Stream.COMPUTE])
        extra = d - plain
        # a rebuilt graph's GPU ops pay launch_s per kernel, nothing else moves
        assert np.allclose(extra[~gpu], 0.0)
        if expect:
            assert extra[gpu].sum() == pytest.approx(hw.ggml.launch_s * sum(plan.meta["graph_kernels"]))
        else:
            assert np.allclose(extra, 0.0)
        assert plan.meta["rebuilt_graphs"] == [expect] * len(plan.graph_tokens)


def test_prompt_ubatches_overlap_and_the_memo_path_agrees():
    scn = _scenario(512)
    var = scn.variants[0]
    test = BenchTest(n_prompt=2048, n_gen=0)
    ctx = make_context(scn, var, rep_rng(scn.seed, 0, -1))
    plan = build_plan(scn, var, test, rep_rng(scn.seed, 0, 0), ctx)
    sched = time_plan(plan, scn)
    H, F = graph_host_edges(plan, np.asarray(sched.start_s), np.asarray(sched.end_s))
    assert len(H) == 4 and (H[1:] > 0).all() and (F[:-1] > 0).all()
    credit = ubatch_overlap_s(ctx, test, H, F)
    assert credit == pytest.approx(float(np.minimum(F[:-1], H[1:]).sum())) and credit > 0
    full = run_variant_test(scn, var, test, repetitions=1, memo=False)
    fast = run_variant_test(scn, var, test, repetitions=1, memo=True)
    assert full.makespan_s[0] == pytest.approx(float(sched.makespan_s) - credit, rel=1e-12)
    assert fast.makespan_s[0] == pytest.approx(full.makespan_s[0], rel=1e-9)
    # decode synchronises every token: nothing overlaps
    tg = BenchTest(n_prompt=0, n_gen=4)
    assert ubatch_overlap_s(ctx, tg, np.ones(4), np.ones(4)) == 0.0


def test_graph_reuse_follows_the_256_cell_window_and_the_outputs():
    """llama.cpp reuses the previous graph while the ubatch's tokens, its KV length padded to 256
    cells and its output count stay the same: a prompt at ubatch 64 rebuilds the first graph of
    each 256-cell window and the call's last ubatch (its one output), and reuses the rest; a
    ubatch of 256 or more opens a window each time; decode rebuilds where it crosses into a new
    window. Only a test's first reused graph pays the capture (a window's re-capture updates the
    executable graph: priced as a replay)."""
    from dataclasses import replace
    scn = _scenario(64)
    scn = replace(scn, workload=replace(scn.workload, n_batch=2048))
    calls = graph_calls(scn, BenchTest(n_prompt=1024, n_gen=0), 0)
    rebuilt = [c[0] for c in calls]
    assert len(calls) == 16 and rebuilt == [True, False, False, False] * 3 + [True, False, False, True]
    assert [c[2] for c in calls] == [0.0] * 16 and [c[1] for c in calls] == [1024] + [0] * 15
    assert [k[1] for k in graph_keys(scn, BenchTest(n_prompt=1024, n_gen=0))] == [256] * 4 + [512] * 4 + \
        [768] * 4 + [1024] * 4
    assert all(c[0] for c in graph_calls(_scenario(256), BenchTest(n_prompt=1024, n_gen=0), 0))
    tg = graph_calls(scn, BenchTest(n_prompt=0, n_gen=8, n_depth=252), 0)
    # cells 253..260: the 4th token (cell 256) still in the first window, the 5th opens the next
    assert [c[0] for c in tg] == [False, False, False, False, True, False, False, False]
    assert tg[0][2] > 0 and all(c[2] == 0 for c in tg[1:])


def test_a_prompt_is_split_into_ubatches_call_by_call():
    """llama-bench decodes a prompt in calls of n_batch tokens and llama.cpp splits each call
    into ubatches: with -b 96 -ub 64 a 192-token prompt is 64+32, 64+32, not 64+64+64."""
    from dataclasses import replace
    scn = _scenario(64)
    scn = replace(scn, workload=replace(scn.workload, n_batch=96))
    from sim.plan.builder import test_graphs as graphs_of
    assert [n for n, _kv, _o in graphs_of(scn, BenchTest(n_prompt=192, n_gen=0))] == [64, 32, 64, 32]
    keys = graph_keys(scn, BenchTest(n_prompt=192, n_gen=0))
    assert [k[2] for k in keys] == [0, 1, 0, 1]
