"""The executor's attention (calibrate.measure.attention_call): two GEMMs and an in-place f16
row-softmax kernel per chunk of query rows, checked against a float64 reference on the numpy
stand-in for CuPy (which runs a numpy twin of the kernel), in the executor, and on a GPU."""

from __future__ import annotations

import math

import numpy as np
import pytest

import calibrate._fakecupy as fakecp
from calibrate import measure as M
from calibrate.executor import _Runtime, attn_keys, execute, translate
from sim.plan import OpKind, Plan, Stream


def _ref_attention(q, k, v) -> np.ndarray:
    """float64 softmax(Q·Kᵀ/√d)·V per KV head: q (H_kv, rows, d), k and v (H_kv, L, d)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    p = M.softmax_rows_ref(q @ k.transpose(0, 2, 1), 1.0 / math.sqrt(q.shape[2]))
    return p @ v


def _inputs(xp, rng, hkv, rows, L, d):
    def f16(shape):
        return xp.asarray(rng.standard_normal(shape).astype(np.float16))

    return f16((hkv, rows, d)), f16((hkv, L, d)), f16((hkv, L, d))


# ------------------------------------------------------------------ the kernel's math


def test_softmax_reference_is_softmax():
    x = np.array([[0.0, 0.0], [1.0, 3.0], [1000.0, 1000.0]])
    p = M.softmax_rows_ref(x, 0.5)
    assert np.allclose(p.sum(axis=1), 1.0)
    assert np.allclose(p[0], 0.5) and np.allclose(p[2], 0.5)
    assert p[1, 1] / p[1, 0] == pytest.approx(math.e)


@pytest.mark.parametrize("rows,L", [(5, 300), (3, 1), (1, 257), (7, 1024)])
def test_softmax_kernel_twin_in_place(rows, L):
    """The stand-in's softmax_rows_f16 (the CUDA kernel's numpy twin) rewrites exactly
    ``rows`` rows of ``L`` f16 values from the array's address, with the reference's result."""
    rng = np.random.default_rng(rows * 1000 + L)
    host = (rng.standard_normal(rows * L) * 6).astype(np.float16)
    buf = fakecp.asarray(np.concatenate([host, np.full(8, 7.0, dtype=np.float16)]))
    kern = fakecp.RawKernel(M.KERNELS_SRC, "softmax_rows_f16")
    scale = 0.3
    kern((rows,), (M.SOFTMAX_THREADS,), (buf, np.int32(L), np.float32(scale)))
    got = np.asarray(buf[: rows * L], dtype=np.float64).reshape(rows, L)
    ref = M.softmax_rows_ref(host.reshape(rows, L), scale)
    assert np.allclose(got, ref, rtol=2e-3, atol=1e-6)
    assert np.allclose(got.sum(axis=1), 1.0, atol=5e-3)
    assert (np.asarray(buf[rows * L:]) == 7.0).all()  # nothing past the rows is touched


def test_open_gpu_has_softmax_and_checks_it():
    g = M.open_gpu(fakecp)
    assert g.softmax is not None and g.softmax.name == "softmax_rows_f16"
    M._check_softmax(g)  # the self-check open_gpu runs


def test_softmax_kernel_source():
    """What a GPU will compile (there is no NVRTC here): the kernel is in KERNELS_SRC with C
    linkage and the signature the launch uses, and the block reduction is sized for it."""
    src = M.KERNELS_SRC
    assert 'extern "C" __global__ void softmax_rows_f16(unsigned short* s, int L, float scale)' in src
    assert "__shared__ float red[1024];" in src and M.SOFTMAX_THREADS <= 1024
    assert M.SOFTMAX_THREADS & (M.SOFTMAX_THREADS - 1) == 0  # a power of two (tree reduction)
    assert src.count("{") == src.count("}") and src.count("(") == src.count(")")
    assert "#include" not in src  # NVRTC needs no header path


# ------------------------------------------------------------------ the prepared attention


def test_chunk_rows_and_score_elems():
    assert M.attention_chunk_rows(4, 100, 1000, 4 * 1000 * 2 * 7) == 7
    assert M.attention_chunk_rows(4, 5, 1000, 1 << 30) == 5
    assert M.attention_chunk_rows(4, 5, 1000, 10) == 1  # at least one row
    assert M.attention_score_elems(4, 100, 1000, 4 * 1000 * 2 * 7) == 4 * 7 * 1000
    assert M.attention_score_elems(4, 0, 1000) == 0


@pytest.mark.parametrize("hkv,grp,n,L,d", [
    (2, 4, 3, 37, 16),    # grouped-query (4 query heads per KV head), 3 tokens
    (4, 1, 5, 64, 32),    # multi-head (G = 1)
    (1, 8, 1, 300, 64),   # decode: one token, 8 heads on one KV head
])
@pytest.mark.parametrize("chunk_rows", [None, 1, 3])
def test_attention_call_matches_reference(hkv, grp, n, L, d, chunk_rows):
    g = M.open_gpu(fakecp)
    rng = np.random.default_rng(hkv * 100 + L)
    rows = grp * n
    q, k, v = _inputs(fakecp, rng, hkv, rows, L, d)
    out = fakecp.zeros((hkv, rows, d), dtype=np.float16)
    cap = M.ATTN_SCORE_BYTES if chunk_rows is None else hkv * L * 2 * chunk_rows
    call = M.attention_call(g, q, k, v, out, max_score_bytes=cap)
    call()
    ref = _ref_attention(q, k, v)
    assert np.allclose(np.asarray(out, dtype=np.float64), ref, rtol=1e-2, atol=4e-3)
    # calling it again (prepared: same buffers) gives the same result
    first = np.array(out, copy=True)
    out[...] = 0
    call()
    assert np.array_equal(np.asarray(out), first)


def test_attention_chunks_agree_with_one_block_and_wrapper():
    g = M.open_gpu(fakecp)
    rng = np.random.default_rng(3)
    hkv, rows, L, d = 2, 11, 50, 8
    q, k, v = _inputs(fakecp, rng, hkv, rows, L, d)
    outs = []
    for cap in (M.ATTN_SCORE_BYTES, hkv * L * 2 * 4):  # 1 chunk; 3 chunks (4 + 4 + 3 rows)
        o = fakecp.zeros((hkv, rows, d), dtype=np.float16)
        M.attention_call(g, q, k, v, o, max_score_bytes=cap)()
        outs.append(np.asarray(o, dtype=np.float64))
    o = fakecp.zeros((hkv, rows, d), dtype=np.float16)
    M.attention(g, q, k, v, o, max_score_bytes=hkv * L * 2 * 4)
    assert np.allclose(outs[0], outs[1], rtol=2e-3, atol=2e-3)
    assert np.array_equal(np.asarray(o, dtype=np.float64), outs[1])


def test_attention_call_shared_scores_buffer():
    g = M.open_gpu(fakecp)
    rng = np.random.default_rng(4)
    a = _inputs(fakecp, rng, 2, 6, 40, 16)
    b = _inputs(fakecp, rng, 1, 9, 25, 16)
    need = max(M.attention_score_elems(2, 6, 40), M.attention_score_elems(1, 9, 25))
    scores = fakecp.zeros(need, dtype=np.float16)
    oa = fakecp.zeros((2, 6, 16), dtype=np.float16)
    ob = fakecp.zeros((1, 9, 16), dtype=np.float16)
    ca = M.attention_call(g, *a, oa, scores=scores)
    cb = M.attention_call(g, *b, ob, scores=scores)
    ca()
    cb()
    assert np.allclose(np.asarray(oa, dtype=np.float64), _ref_attention(*a), rtol=1e-2, atol=4e-3)
    assert np.allclose(np.asarray(ob, dtype=np.float64), _ref_attention(*b), rtol=1e-2, atol=4e-3)
    # the buffer holds the last chunk's probabilities: rows summing to 1
    p = np.asarray(scores[: 9 * 25], dtype=np.float64).reshape(9, 25)
    assert np.allclose(p.sum(axis=1), 1.0, atol=5e-3)
    with pytest.raises(ValueError, match="scores"):
        M.attention_call(g, *a, oa, scores=fakecp.zeros(need - 1, dtype=np.float16))
    with pytest.raises(ValueError, match="scores"):
        M.attention_call(g, *a, oa, scores=fakecp.zeros(need, dtype=np.float32))
    with pytest.raises(ValueError, match="key"):
        M.attention_call(g, a[0], a[1][:, :0], a[2][:, :0], oa)
    M.attention_call(g, a[0][:, :0], a[1], a[2], oa[:, :0])()  # no query rows: nothing to do


def test_measure_attention_rows():
    g = M.open_gpu(fakecp)
    row = M.measure_attention(g, 2, 30, 8, 2, 16, reps=2)
    assert row["n_tokens"] == 2 and row["kv_len"] == 30 and row["n_rep"] == 2
    assert row["t_s"] >= 0 and row["t_host_s"] > 0


# ------------------------------------------------------------------ in the executor


def _attn_plan() -> Plan:
    """Softmax attention ops on two GPUs' compute streams (folded onto one GPU), one of them
    sliding-window, one with no tokens, and a linear-attention op."""
    p = Plan(label="attn")
    C = Stream.COMPUTE
    shapes = [(0, (3, 20, 8, 2, 16, 0, 0, 0)), (0, (1, 40, 8, 2, 16, 0, 0, 0)), (0, (4, 100, 8, 2, 16, 32, 0, 0)),
              (1, (2, 10, 4, 4, 8, 0, 0, 0)), (1, (0, 10, 4, 4, 8, 0, 0, 0)), (0, (2, 0, 4, 4, 16, 0, 1, 8))]
    for i, (dev, shape) in enumerate(shapes):
        iss = p.add(OpKind.ISSUE, Stream.HOST, -1, f"launch attn{i}", split=i)
        op = p.add(OpKind.ATTN, C, dev, f"attn{i}", [iss], shape=shape, split=i, layer=i)
        p.add(OpKind.HOST_SYNC, Stream.HOST, -1, f"sync {i}", [op], split=i)
    return p


def test_executor_attention_is_prepared_on_a_score_buffer_per_stream():
    plan = _attn_plan()
    rt = _Runtime(fakecp, translate(plan), seed=0, fold_devices=True, probes=True)
    need: dict = {}
    for op in plan.ops:
        if op.kind is OpKind.ATTN and op.shape[0] > 0 and not op.shape[6]:
            n_tok, kv, nh, nkv, _hd, window = op.shape[:6]
            key = (op.stream.value, op.device)
            need[key] = max(need.get(key, 0), M.attention_score_elems(nkv, nh // nkv * n_tok,
                                                                      attn_keys(n_tok, kv, window)))
    assert {k: v.size for k, v in rt.scores.items()} == need
    # each softmax op's prepared body computes softmax(QKᵀ/√d)V of its shape into its output
    for op in plan.ops:
        if op.kind is not OpKind.ATTN or op.shape[0] == 0 or op.shape[6]:
            continue
        n_tok, kv, nh, nkv, hd, window = op.shape[:6]
        st, _waits, _pre, body, _post = rt.steps[op.id]
        out = rt.out_of[op.id]
        out[...] = 0
        with st:
            body()
        q, kk, vv = rt.attn_kv[(nh, nkv, hd, False, 0)]
        rows, keys = nh // nkv * n_tok, attn_keys(n_tok, kv, window)
        ref = _ref_attention(q[:, :rows], kk[:, :keys], vv[:, :keys])
        got = np.asarray(out[: nkv * rows * hd], dtype=np.float64).reshape(nkv, rows, hd)
        assert np.allclose(got, ref, rtol=1e-2, atol=4e-3), op.name
    r = execute(plan, cp=fakecp, warmup=0, repeats=2, fold_devices=True)
    assert r.probes_checked == 0 and len(r.outputs) == sum(op.kind is OpKind.ATTN for op in plan.ops)
    assert r.digest == execute(plan, cp=fakecp, warmup=0, fold_devices=True).digest


# ------------------------------------------------------------------ GPU


@pytest.mark.gpu
def test_attention_on_gpu():
    cp = pytest.importorskip("cupy")
    try:
        n = cp.cuda.runtime.getDeviceCount()
    except Exception:
        n = 0
    if n < 1:
        pytest.skip("no CUDA GPU")
    g = M.open_gpu(cp)  # compiles softmax_rows_f16 and checks it on 3 rows of 300
    rng = np.random.default_rng(0)
    # the kernel alone: a long row (41k keys), and many short rows (a large 1-D grid)
    for rows, L in ((4, 41000), (200_000, 3), (64, 256)):
        host = (rng.standard_normal(rows * L) * 5).astype(np.float16)
        dev = cp.asarray(host)
        g.sync_all()
        with g.stream:
            g.softmax((rows,), (M.SOFTMAX_THREADS,), (dev, np.int32(L), np.float32(0.125)))
        g.stream.synchronize()
        got = cp.asnumpy(dev).astype(np.float64).reshape(rows, L)
        assert np.allclose(got, M.softmax_rows_ref(host.reshape(rows, L), 0.125), rtol=4e-3, atol=1e-6), (rows, L)
    # the prepared attention (cuBLAS when batched GEMM works), GQA, with and without chunks
    for hkv, grp, n_tok, L, d, chunk_rows in ((4, 8, 1, 4097, 128, None), (2, 4, 33, 1000, 64, None),
                                              (2, 4, 33, 1000, 64, 5), (8, 8, 16, 2048, 64, 7)):
        rows = grp * n_tok
        q, k, v = _inputs(cp, rng, hkv, rows, L, d)
        out = cp.zeros((hkv, rows, d), dtype=cp.float16)
        cap = M.ATTN_SCORE_BYTES if chunk_rows is None else hkv * L * 2 * chunk_rows
        call = M.attention_call(g, q, k, v, out, max_score_bytes=cap)
        g.sync_all()
        with g.stream:
            call()
        g.stream.synchronize()
        ref = _ref_attention(cp.asnumpy(q), cp.asnumpy(k), cp.asnumpy(v))
        got = cp.asnumpy(out).astype(np.float64)
        assert np.allclose(got, ref, rtol=1e-2, atol=4e-3), (hkv, grp, n_tok, L, d, chunk_rows,
                                                             float(np.abs(got - ref).max()))
    row = M.measure_attention(g, 1, 4096, 32, 4, 128, reps=5)
    assert 0 < row["t_s"] < 1e-2 and 0 < row["t_host_s"] < 1e-2


def test_a_model_without_softmax_attention_builds_no_kq_mask_and_decodes_alike_at_any_depth():
    """attn_kind = "linear" (recurrent state, no KV cache to mask): llama.cpp builds no KQ mask,
    so the host's mask fill and its copy do not grow with the depth (fresh-user round 9: they
    did)."""
    from dataclasses import replace

    from sim.engines.metrics import run_variant_test
    from sim.model.specs import BenchTest, load_scenario, parse_variant

    from scenario_factory import ROOT
    from sim.model.ggmlcost import mask_bytes, mask_entries, mask_shapes_many

    scn = load_scenario(ROOT / "scenarios/default.toml")
    scn = scn.with_(placement=replace(scn.placement, n_cpu_moe=0))
    lin = scn.with_(model=replace(scn.model, attn_kind="linear"))
    assert mask_entries(lin.model, 1, 8192) == mask_bytes(lin.model, 1, 8192, True) == 0
    e, b = mask_shapes_many(lin.model, 4, [0, 4096, 8192], True, True)
    assert e.tolist() == b.tolist() == [0, 0, 0]
    assert mask_entries(scn.model, 1, 8192) > 0      # softmax attention: the mask grows with depth
    hybrid = replace(scn.model, attn_kind="hybrid")
    assert mask_entries(hybrid, 1, 8192) == mask_entries(scn.model, 1, 8192)
    v = parse_variant("baseline")
    t0 = run_variant_test(lin, v, BenchTest(0, 4, 0), repetitions=1).tps_mean
    t1 = run_variant_test(lin, v, BenchTest(0, 4, 8192), repetitions=1).tps_mean
    assert t1 == pytest.approx(t0, rel=1e-9)
