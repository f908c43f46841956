"""The weightless nodes of an FFN whose weight ops run on the CPU (sim.plan.builder.ffn_cpu_nodes):
gpt-oss's expert bias adds and the GLU are priced on the CPU beside the host matmuls of a decode
split, and leave the layer's GPU elementwise kernels; nothing moves at prefill or on the CuPy
executor's profile."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sim.model.costs import op_duration_s
from sim.model.ggmlcost import layer_elementwise
from sim.model.specs import BenchTest, load_hardware, load_model, load_scenario, parse_variant
from sim.plan import OpKind
from sim.plan.builder import build_plan, ffn_cpu_nodes, make_context

from scenario_factory import ROOT

GPTOSS = ROOT / "scenarios/models/gpt-oss-20b.toml"
QWEN3 = ROOT / "scenarios/models/qwen3-30b-a3b.toml"
GEMMA = ROOT / "scenarios/models/gemma3-27b.toml"


def _scn(model_path, n_cpu_moe=0, ot=(), hardware=None):
    scn = load_scenario(ROOT / "scenarios/default.toml")
    scn = scn.with_(model=load_model(model_path),
                    placement=replace(scn.placement, n_cpu_moe=n_cpu_moe, override_tensor=tuple(ot), ngl=99))
    if hardware is not None:
        scn = scn.with_(hardware=load_hardware(hardware))
    return scn


def scn_model_ff(path):
    return load_model(path).moe.n_ff_exp


def _nodes(scn, layer=0):
    ctx = make_context(scn, parse_variant("baseline"), np.random.default_rng(0))
    return ctx.ffn_cpu[layer]


@pytest.mark.parametrize("model, n_cpu_moe, ot, biased, glu, nodes", [
    # every expert tensor on the host: three matmuls; gpt-oss's three bias adds; the GLU
    (GPTOSS, 24, (), 3, True, 4),
    (QWEN3, 48, (), 0, True, 1),
    # the gate alone: its bias add; the GLU stays on the GPU (the down projection is there)
    (GPTOSS, 0, ((r"ffn_gate_exps", "CPU"),), 1, False, 1),
    (QWEN3, 0, ((r"ffn_gate_exps", "CPU"),), 0, False, 0),
    # the down projection alone: the GLU's producer (the gate) is on the GPU, so is the GLU
    (GPTOSS, 0, ((r"ffn_down_exps", "CPU"),), 1, False, 1),
    # gate and up without the down projection
    (GPTOSS, 0, ((r"ffn_(up|gate)_exps", "CPU"),), 2, False, 2),
    # a dense FFN on the CPU by -ot: its GLU, no bias
    (GEMMA, 0, ((r"ffn_(gate|up|down)", "CPU"),), 0, True, 1),
    # fully resident: nothing
    (GPTOSS, 0, (), 0, False, 0),
])
def test_ffn_cpu_nodes_follow_the_placement(model, n_cpu_moe, ot, biased, glu, nodes):
    b, g, n, e, per = _nodes(_scn(model, n_cpu_moe, ot))
    assert (len(b), g is not None, n) == (biased, glu, nodes)
    assert g is None or g.endswith(("ffn_down_exps.weight", "ffn_down.weight"))
    assert (e > 0) == (nodes > 0)
    # per weight: the nodes beside each weight's op, summing to the layer's
    assert (sum(p[1] for p in per), sum(p[2] for p in per)) == (n, e)
    assert {p[0] for p in per} >= set(b) | ({g} if g else set())
    # SWIGLU_OAI's row (gpt-oss's GLU) rides on the weight it runs before; others' GLU has none
    rows = [p[3] for p in per if p[3]]
    assert rows == ([scn_model_ff(model)] if g is not None and model == GPTOSS else [])


def test_gptoss_decode_prices_bias_adds_and_glu_on_the_cpu_and_not_on_the_gpu():
    scn = _scn(GPTOSS, 24)
    m = scn.model
    hw = scn.hardware
    g = hw.ggml
    plan = build_plan(scn, parse_variant("baseline"), BenchTest(0, 1, 0), np.random.default_rng(0))
    cpu = [i for i, k in enumerate(plan.kinds) if plan.op(i).kind is OpKind.CPU_MATVEC and plan.layers[i] == 5]
    assert len(cpu) == 3                        # gate, up, down of layer 5
    extra = [plan.shapes[i][6] for i in cpu]
    assert extra == [1, 1, 2]                   # a bias add each; the GLU on the down projection
    topk, ff, d = m.moe.n_expert_used, m.moe.n_ff_exp, m.d_model
    assert plan.shapes[cpu[2]][7] == pytest.approx(4.0 * (2 * topk * d + 3 * topk * ff))
    # the GLU (SWIGLU_OAI, on the down projection) computes one 2880-element row on each of four
    # threads (top-k 4 rows of one token, 16 threads)
    assert [plan.shapes[i][8] for i in cpu] == [0, 0, ff]
    for i in cpu:   # each op: its matmul plus the nodes' measured in-graph price
        sh = plan.shapes[i]
        bare = op_duration_s(plan.priced_op(i, plan.nbytes[i], (*sh[:6], 0, 0.0, 0)), hw)
        want = sh[6] * g.cpu_node_s + sh[7] / g.cpu_ew_bytes_per_s + sh[8] * g.cpu_glu_oai_elem_s
        assert op_duration_s(plan.op(i), hw) - bare == pytest.approx(want)
    # the measured node times (node-time lease): an ADD_ID ~4-5 us, the SWIGLU_OAI ~28 us
    add_id = g.cpu_nodes_s(1, 4.0 * 2 * topk * d)
    glu = g.cpu_nodes_s(1, 4.0 * 3 * topk * ff, ff)
    assert 3e-6 < add_id < 6e-6 and 25e-6 < glu < 31e-6
    # the layer's attention on the GPU carries four elementwise kernels fewer
    attn = [plan.shapes[i] for i in range(len(plan.kinds))
            if plan.op(i).kind is OpKind.ATTN and plan.layers[i] == 5]
    k0, e0 = layer_elementwise(m, 5)
    assert attn and all(sh[9] == k0 - 4 for sh in attn)
    assert all(sh[10] == pytest.approx(e0 - (2 * topk * (2 * ff + d) + 3 * topk * ff)) for sh in attn)


def test_prefill_and_the_executor_profile_keep_the_nodes_on_the_gpu():
    scn = _scn(GPTOSS, 24)
    plan = build_plan(scn, parse_variant("baseline"), BenchTest(64, 0, 0), np.random.default_rng(0))
    assert not any(plan.op(i).kind is OpKind.CPU_MATVEC and plan.tags[i] != "rows" and len(plan.shapes[i]) > 6
                   and plan.shapes[i][6] for i in range(len(plan.kinds)))
    k0, _ = layer_elementwise(scn.model, 5)
    attn = [plan.shapes[i] for i in range(len(plan.kinds)) if plan.op(i).kind is OpKind.ATTN]
    assert attn and all(sh[9] == k0 for sh in attn if len(sh) > 9)
    # the CuPy executor's profile (no [ggml] section) has no llama.cpp scheduler: nothing moves
    cupy = _scn(GPTOSS, 24, hardware=ROOT / "scenarios/hardware/h200.toml")
    assert _nodes(cupy) == (frozenset(), None, 0, 0.0, ())


def test_oai_rows_spread_over_the_cpu_threads():
    """ggml-cpu gives each thread a contiguous share of a GLU's rows (dr = ceil(nr / nth)): a
    token's four gpt-oss rows take one row per thread; 31 tokens (124 rows) eight on 16 threads."""
    from sim.plan.builder import oai_elems_per_thread

    assert oai_elems_per_thread(2880, 4, 16) == 2880
    assert oai_elems_per_thread(2880, 124, 16) == 8 * 2880
    assert oai_elems_per_thread(2880, 124, None) == 2880   # no thread count: one row a thread
    assert oai_elems_per_thread(0, 124, 16) == 0 and oai_elems_per_thread(2880, 0, 16) == 0
    scn = _scn(GPTOSS, 24)
    g = scn.hardware.ggml
    plan = build_plan(scn, parse_variant("baseline"), BenchTest(0, 1, 0), np.random.default_rng(0))
    assert any(len(sh) > 8 and sh[8] == 2880 for sh in plan.shapes)
    # a profile without the in-graph node time prices a node at the CPU table's per-op intercept
    from dataclasses import replace as _r
    g0 = _r(g, cpu_node_s=None, cpu_glu_oai_elem_s=0.0)
    assert g0.cpu_nodes_s(2, 1000.0, 2880) == pytest.approx(2 * g.cpu_op_s + 1000.0 / g.cpu_ew_bytes_per_s)

