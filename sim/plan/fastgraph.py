"""One graph's plan built a column at a time (the templates of :mod:`sim.plan.memo`).

:func:`sim.plan.builder.build_graph` walks a graph's items and splits and appends op after op through
the :class:`~sim.plan.builder.Emitter`. For the graphs whose ops follow a fixed pattern per item
(every item on a GPU, no staged copies: see :func:`build_graph_columns` for the exact class) the
same plan is made here without a per-op Python loop:

1. the graph's items as columns (:func:`graph_item_columns`): the model's items are laid out
   once per model (:func:`_static_items`: the order, names, tensors and the shapes' fixed parts
   that :func:`sim.plan.builder.graph_items` gives them), their residency and devices once per
   context, and a graph only fills in its tokens, KV length and used-expert counts (shapes are
   shared between the items that have equal ones: equal values, one tuple);
2. the splits from the items' devices and host residency (``ggml_backend_sched``'s cut, as
   :func:`sim.plan.builder.cut_splits`);
3. each item's block of ops (the split's host overhead when it opens one, the synchronous copy
   of a host input, its launch and GPU op, the prefetch machinery's done event), its length
   and position from a cumulative sum, and every column filled by position (numeric columns as
   numpy arrays, names, shapes and tags gathered from pools), dependencies included: within a
   block they point at the op before; a sync waits for the last compute-stream op of its GPU
   (``Emitter.last_gpu``), found by a search over those ops' positions.

The plan is the one :func:`sim.plan.builder.build_graph` builds on an empty plan, column for column
(``tests/test_fastgraph.py`` compares both on every shipped scenario); a graph outside the class
is left to it.
"""

from __future__ import annotations

from functools import partial
from operator import itemgetter

import numpy as np

from sim.plan.builder import ACT_BYTES, ID_BYTES, kq_mask_shape, overhead_shape, per_model
from sim.model.ggmlcost import MMVQ_MAX_BATCH
from sim.plan import KIND_CODE, STREAM_CODE, OpKind, Stream

#: :func:`sim.plan.memo.build_template` builds a graph it covers with :func:`build_graph_columns`;
#: False builds every graph with :func:`sim.plan.builder.build_graph` (the reference path the tests
#: compare it with)
ENABLE = True

_GEMM, _ATTN, _MOE = 0, 1, 2
_K = KIND_CODE
_S = STREAM_CODE
_HOST, _COMPUTE = _S[Stream.HOST], _S[Stream.COMPUTE]
_ROLE_KIND = (OpKind.GEMM, OpKind.ATTN, OpKind.MOE)

#: :func:`_static_items` per model (:func:`sim.plan.builder.per_model`)
_MODELS: dict[int, tuple] = {}


class _Static:
    """The items of a model's graphs in order, as far as they do not depend on the placement
    or the graph (:func:`sim.plan.builder.graph_items` without its tokens, KV length and masks).

    Attributes:
        role: (J,) int8, 0 GEMM, 1 ATTN, 2 MOE.
        names: (J,) item names; layers: (J,) int64 block (-1: the output head).
        tpos: (J, 3) int64 positions in ``model.tensors`` of the tensors each item reads (-1 pad).
        tail: (J,) int64 id of the shape's fixed part (:attr:`tails`; -1 for ATTN).
        tails: fixed parts: GEMM ``(n_out, n_in, per-tensor tuple)``, MOE ``(n_out, n_in)``
            (the ggml type and top-k are added by :func:`graph_item_columns`).
        wb: (J,) int64 weight bytes of a GEMM (sum of its tensors' bytes); bpm: (J,) bytes of
            one expert of a MOE item's tensor; copy: (J,) bytes a whole copy of its tensors moves.
        moe_row: (J,) int64 row of a MOE item's layer in the model's MoE layers (-1 others).
        m_one: (J,) bool, the output head (one row per graph, or the graph's output rows).
        ffn: (J,) bool, an item of its block's FFN (after the attention's output projection).
        kernels: (J,) int64 CUDA kernels of a GEMM (:func:`sim.model.ggmlcost.graph_kernels`).
        moe_type: per tail id of a MOE item, its ggml type; topk: experts per token.
    """

    __slots__ = ("role", "names", "layers", "tpos", "tail", "tails", "wb", "bpm", "copy", "moe_row", "m_one",
                 "ffn", "kernels", "moe_type", "topk", "n_items", "attn_rows", "moe_items")


def _static_items(model) -> _Static | None:
    """:class:`_Static` of ``model``, made once per model; None when a tensor
    :func:`sim.plan.builder.graph_items` reads is missing (that function then raises)."""
    def make(m) -> _Static | None:
        try:
            return _make_static(m)
        except KeyError:
            return None

    return per_model(_MODELS, model, make)


def _make_static(model) -> _Static:
    # the loop of sim.plan.builder.graph_items, recording what does not depend on the graph
    tensors = model.tensors
    tens = {t.name: t for t in tensors if not t.duplicate}   # BuildContext.tensor_by_name
    pos = {id(t): i for i, t in enumerate(tensors)}
    role, names, layers, tpos, tail, wb, bpm, copy, moe_row, m_one, kernels, ffn = ([] for _ in range(12))
    tails: dict = {}
    moe_type: dict = {}
    topk = model.moe.n_expert_used if model.moe is not None else 0

    def tail_id(key) -> int:
        got = tails.get(key)
        if got is None:
            got = tails[key] = len(tails)
        return got

    def gemm(name, layer, n_out, n_in, ts, one=False):
        pert = tuple((t.ggml_type, t.n_out, t.n_in, t.bytes_per_mat) for t in ts)
        role.append(_GEMM)
        names.append(name)
        layers.append(layer)
        tpos.append([pos[id(t)] for t in ts] + [-1] * (3 - len(ts)))
        tail.append(tail_id(("gemm", n_out, n_in, pert)))
        s = sum(t.nbytes for t in ts)
        wb.append(s)
        bpm.append(0)
        copy.append(s)
        moe_row.append(-1)
        m_one.append(one)
        kernels.append(2 * max(1, len(pert)))

    d = model.d_model
    k_moe = 0
    for i in range(model.n_layer):
        b = f"blk.{i}."
        q, k, v, o = (tens[b + n + ".weight"] for n in ("attn_q", "attn_k", "attn_v", "attn_output"))
        gemm(b + "attn_qkv", i, q.n_out + k.n_out + v.n_out, d, (q, k, v))
        role.append(_ATTN)
        names.append(b + "attn")
        layers.append(i)
        tpos.append([-1, -1, -1])
        tail.append(-1)
        wb.append(0)
        bpm.append(0)
        copy.append(0)
        moe_row.append(-1)
        m_one.append(False)
        kernels.append(0)
        gemm(o.name, i, o.n_out, o.n_in, (o,))
        ffn_from = len(names)
        if model.is_moe_layer(i):
            m = model.moe
            r = tens[b + "ffn_gate_inp.weight"]
            gemm(r.name, i, m.n_expert, d, (r,))
            exp_names = ["ffn_gate_up_exps"] if m.fused_gate_up else ["ffn_gate_exps", "ffn_up_exps"]
            exp_names.append("ffn_down_exps")
            for nm in exp_names:
                t = tens[b + nm + ".weight"]
                role.append(_MOE)
                names.append(t.name)
                layers.append(i)
                tpos.append([pos[id(t)], -1, -1])
                tid = tail_id(("moe", t.n_out, t.n_in, t.ggml_type))
                tail.append(tid)
                moe_type[tid] = t.ggml_type
                wb.append(0)
                bpm.append(t.bytes_per_mat)
                copy.append(t.nbytes)
                moe_row.append(k_moe)
                m_one.append(False)
                kernels.append(0)
            if m.n_expert_shared:
                g_, u_, dn = (tens[b + n + ".weight"] for n in ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"))
                gemm(b + "ffn_gate_up_shexp", i, g_.n_out + u_.n_out, d, (g_, u_))
                gemm(dn.name, i, dn.n_out, dn.n_in, (dn,))
            k_moe += 1
        else:
            g_, u_, dn = (tens[b + n + ".weight"] for n in ("ffn_gate", "ffn_up", "ffn_down"))
            gemm(g_.name, i, g_.n_out, d, (g_,))
            gemm(u_.name, i, u_.n_out, d, (u_,))
            gemm(dn.name, i, dn.n_out, dn.n_in, (dn,))
        ffn.extend(range(ffn_from, len(names)))
    out = model.output_tensor
    gemm(out.name, -1, out.n_out, out.n_in, (out,), one=True)
    st = _Static()
    st.role = np.array(role, dtype=np.int8)
    st.names = names
    st.layers = np.array(layers, dtype=np.int64)
    st.tpos = np.array(tpos, dtype=np.int64)
    st.tail = np.array(tail, dtype=np.int64)
    st.tails = [k[1:] if k[0] == "gemm" else k[1:3] for k in tails]
    st.wb = np.array(wb, dtype=np.int64)
    st.bpm = np.array(bpm, dtype=np.int64)
    st.copy = np.array(copy, dtype=np.int64)
    st.moe_row = np.array(moe_row, dtype=np.int64)
    st.m_one = np.array(m_one, dtype=bool)
    st.ffn = np.zeros(len(names), dtype=bool)
    st.ffn[ffn] = True
    st.kernels = np.array(kernels, dtype=np.int64)
    st.moe_type = moe_type
    st.topk = topk
    st.n_items = len(names)
    st.attn_rows = np.flatnonzero(st.role == _ATTN)
    st.moe_items = np.flatnonzero(st.role == _MOE)
    return st


def unique_index_inverse(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(key, return_index=True, return_inverse=True)[1:]`` of a 1-D int array (the
    first position of each distinct value, values ascending, and each element's rank among
    them), from one stable argsort: ``(first (U,) int64, inverse (n,) int64)``."""
    n = key.size
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    order = np.argsort(key, kind="stable")
    sk = key[order]
    brk = np.empty(n, dtype=bool)
    brk[0] = True
    np.not_equal(sk[1:], sk[:-1], out=brk[1:])
    inv = np.empty(n, dtype=np.int64)
    inv[order] = np.cumsum(brk) - 1
    return order[brk], inv


class _Resident:
    """What the placement of a context fixes about a model's items (:class:`_Static`).

    Attributes:
        host: (J,) bool, the item reads a host-resident tensor.
        dev: (J,) int64 the GPU of the item's layer (``layer_dev``; the last GPU for the
            output head; -1 for a layer left on the CPU).
        attn_layers_on_gpu: every layer is offloaded (its attention runs on its GPU).
        sig: (n_layer,) int64 id of each layer's attention signature
            (:attr:`sim.plan.builder.BuildContext.attn_layer_sig`); sig_layer: a layer of each id.
    """

    __slots__ = ("host", "dev", "attn_layers_on_gpu", "sig", "sig_layer")


def _resident(ctx, st: _Static) -> _Resident:
    """:class:`_Resident` of ``ctx`` (made once per context, kept in ``ctx.column_cache``)."""
    got = ctx.column_cache.get("_resident")
    if got is not None:
        return got
    model = ctx.scn.model
    tensors = model.tensors
    flags = np.zeros(len(tensors) + 1, dtype=bool)   # [-1]: no tensor
    given = ctx.host_flags
    if given is not None and len(given) == len(tensors):
        # the positions' flags host_ids was made from (a tensor object's flag is its own, wherever
        # it sits: the same membership as by id)
        flags[:-1] = given
    else:
        flags[:-1] = np.fromiter(map(ctx.host_ids.__contains__, map(id, tensors)), dtype=bool, count=len(tensors))
    r = _Resident()
    tf = flags[st.tpos]                      # (J, 3): each item's tensors, -1 padding reading False
    r.host = tf[:, 0] | tf[:, 1] | tf[:, 2]  # .any(axis=1), a column at a time
    ld = np.asarray(ctx.layer_dev, dtype=np.int64)
    r.dev = np.where(st.layers >= 0, ld[np.maximum(st.layers, 0)] if ld.size else -1, ctx.output_dev)
    r.attn_layers_on_gpu = bool((ld >= 0).all())
    # equal attention signatures (BuildContext.attn_layer_sig: equal model parts, both on a GPU or
    # not, the same FFN nodes on the CPU)
    key = np.asarray(ctx.attn_sig_ids, dtype=np.int64) if ld.size else np.zeros(0, dtype=np.int64)
    first, inv = unique_index_inverse(key)
    r.sig = inv
    r.sig_layer = first.tolist()
    ctx.column_cache["_resident"] = r
    return r


class ItemColumns:
    """The items of one graph as columns (what :func:`sim.plan.builder.graph_items` gives as
    :class:`sim.plan.builder.Item` objects, in the same order).

    Attributes:
        role: (J,) int8 0 GEMM, 1 ATTN, 2 MOE; names: item names; layers: (J,) int64.
        shapes: (J,) shapes (equal shapes are one tuple); shape_id: (J,) int64 naming them.
        wb: (J,) int64 weight bytes; host, cpu, expert: (J,) bool; device: (J,) int64.
        copy: (J,) bytes of a whole copy of the item's tensors; bpm: (J,) bytes of one expert.
        moved: (J,) bool an attention moved to the GPU from a layer left on the CPU.
        kernels: CUDA kernels of the graph (:func:`sim.model.ggmlcost.graph_kernels`).
    """

    __slots__ = ("role", "names", "layers", "shapes", "shape_id", "wb", "host", "cpu", "expert", "device", "copy",
                 "bpm", "moved", "kernels")


def graph_item_columns(ctx, n_tokens: int, kv_len: int, n_used: np.ndarray,
                       n_outputs: int | None = None) -> ItemColumns | None:
    """The items of one graph of ``n_tokens`` on ``kv_len`` cached tokens as columns, ``n_used``
    the used experts of each MoE layer (``ctx.moe_layers`` order; (L,) int), ``n_outputs`` the
    graph's output rows: the items of :func:`sim.plan.builder.graph_items` field for field (an
    item of no rows left out, as there). None when the model lacks a tensor that function reads
    (it raises then).

    Raises:
        ValueError: ``n_used`` does not have one entry per MoE layer.
    """
    model = ctx.scn.model
    st = _static_items(model)
    if st is None:
        return None
    n_used = np.asarray(n_used, dtype=np.int64)
    n_moe = len(ctx.moe_layers) if model.moe is not None else 0
    if n_used.shape != (n_moe,):
        raise ValueError(f"n_used: {n_used.shape} entries for {n_moe} MoE layers")
    res = _resident(ctx, st)
    pl = ctx.scn.placement
    lo = pl.op_offload_min_batch
    offload = n_tokens >= lo
    role = st.role
    is_attn = role == _ATTN
    is_moe = role == _MOE
    # rows of each item (graph_items): the head's, the output rows in the FFN of the block
    # llama.cpp runs on them only, the graph's tokens elsewhere
    head_rows = 1 if n_outputs is None else n_outputs
    out_layer = model.output_rows_layer if n_outputs is not None else -1
    last_ffn = st.ffn & (st.layers == out_layer) if out_layer >= 0 and n_outputs < n_tokens else None
    rows = np.where(st.m_one, head_rows, n_tokens)
    if last_ffn is not None:
        rows[last_ffn] = n_outputs
    c = ItemColumns()
    c.role = role
    c.names = st.names
    c.layers = st.layers
    c.expert = is_moe
    c.copy = st.copy
    c.bpm = st.bpm
    # backends: graph_items' weight_item (the op's own batch against the offload rule) and the
    # attention's placement
    host = res.host
    cpu_w = host & (rows < lo)
    if res.attn_layers_on_gpu:
        moved = np.zeros(st.n_items, dtype=bool)
        cpu = cpu_w
        dev = np.where(cpu, -1, np.maximum(res.dev, 0))
    else:
        ld = np.asarray(ctx.layer_dev, dtype=np.int64)
        lay = np.maximum(st.layers, 0)
        on_gpu = ld[lay] >= 0
        full = np.array([model.is_full_attn_layer(i) for i in range(model.n_layer)] or [True], dtype=bool)[lay]
        moved = is_attn & ~on_gpu & offload & full
        cpu = np.where(is_attn, ~(on_gpu | moved), cpu_w)
        dev = np.where(is_attn, np.where(on_gpu, ld[lay], np.where(moved, 0, -1)),
                       np.where(cpu_w, -1, np.maximum(res.dev, 0)))
    c.host = host & ~is_attn
    c.cpu = cpu
    c.device = dev
    c.moved = moved
    # shapes, one tuple per distinct value: GEMM (m, n_out, n_in, per tensor), MOE (m, n_out,
    # n_in, used, top-k, type), ATTN the context's (one per layer signature)
    pool: list = []
    n_tails = len(st.tails)
    # GEMM shapes: a group of the tails per row count (the graph's tokens first, then the head's
    # and the output rows' when they differ)
    row_vals = [n_tokens] + sorted({head_rows, n_outputs if last_ffn is not None else n_tokens} - {n_tokens})
    group = np.zeros(st.n_items, dtype=np.int64)
    for gi, rv in enumerate(row_vals[1:], 1):
        group[rows == rv] = gi
    gemm_ids = st.tail + n_tails * group
    for rv in row_vals:
        for tl in st.tails:
            pool.append((rv, *tl) if len(tl) == 3 else None)
    shape_id = np.where(role == _GEMM, gemm_ids, -1)
    used_item = np.zeros(st.n_items, dtype=np.int64)
    if st.moe_items.size:
        used_item[st.moe_items] = n_used[st.moe_row[st.moe_items]]
        key = ((st.tail[st.moe_items] * (int(used_item.max()) + 1) + used_item[st.moe_items]) * len(row_vals)
               + group[st.moe_items])
        first, inv = unique_index_inverse(key)
        base = len(pool)
        for j in st.moe_items[first].tolist():
            tl = st.tails[int(st.tail[j])]
            pool.append((int(rows[j]), tl[0], tl[1], int(used_item[j]), st.topk, st.moe_type[int(st.tail[j])]))
        shape_id[st.moe_items] = base + inv.reshape(-1)
    base = len(pool)
    for i in res.sig_layer:
        pool.append(ctx.attn_shape(i, n_tokens, kv_len))
    shape_id[st.attn_rows] = base + res.sig[st.layers[st.attn_rows]]
    c.shape_id = shape_id
    c.shapes = itemgetter(*shape_id.tolist())(pool) if st.n_items > 1 else (pool[int(shape_id[0])],)
    c.wb = np.where(is_moe, used_item * st.bpm, st.wb)
    # graph_kernels: GPU items only; an expert matmul as a matvec at MMVQ batches; an attention
    # its FlashAttention (or unfused) kernels plus the layer's elementwise ones
    kern = np.where(is_moe, np.where(rows <= MMVQ_MAX_BATCH, 2, 4), st.kernels)
    if st.attn_rows.size:
        per_sig = []
        for i in res.sig_layer:
            sh = pool[base + len(per_sig)]
            fa = sh[8] if len(sh) > 8 else 1
            per_sig.append((1 if fa else 9) + (sh[9] if len(sh) > 9 else 0))
        kern = kern.copy()
        kern[st.attn_rows] = np.asarray(per_sig, dtype=np.int64)[res.sig[st.layers[st.attn_rows]]]
    keep = rows > 0   # an op of no rows is skipped (graph_items)
    if not keep.all():
        at = np.flatnonzero(keep)
        c.role, c.layers, c.expert, c.copy, c.bpm = role[at], st.layers[at], is_moe[at], st.copy[at], st.bpm[at]
        c.names = [st.names[j] for j in at.tolist()]
        c.host, c.cpu, c.device, c.moved = c.host[at], cpu[at], dev[at], moved[at]
        c.shape_id, c.wb = shape_id[at], c.wb[at]
        c.shapes = tuple(c.shapes[j] for j in at.tolist())
        kern, cpu = kern[at], cpu[at]
    c.kernels = int(kern[~cpu].sum())
    return c


def _runs_rows(block: np.ndarray) -> list[list[tuple[int, int]]]:
    """:func:`sim.plan.builder._runs` of each row of a (k, E) bool block: per row the ``(first,
    count)`` of its runs of True, in order."""
    k, e = block.shape
    if k == 0:
        return []
    p = np.zeros((k, e + 2), dtype=np.int8)
    p[:, 1:-1] = block
    r, col = np.nonzero(p[:, 1:] != p[:, :-1])
    starts, ends, rows = col[0::2].tolist(), col[1::2].tolist(), r[0::2].tolist()
    out: list[list[tuple[int, int]]] = [[] for _ in range(k)]
    for row, a, b in zip(rows, starts, ends):
        out[row].append((a, b - a))
    return out


def _tail_list(prefix: list, tail: np.ndarray) -> list:
    """``prefix + tail.tolist()``: a column whose first ops were appended one by one."""
    return prefix + tail.tolist()


def _graph_names(prefix: list, n0: int, N: int, names: list, p_i: np.ndarray, split_ops: np.ndarray,
                 split_ids: np.ndarray, record_ops: np.ndarray, record_splits: np.ndarray, g: int, n_gpu: int,
                 host) -> list:
    """The names column of a graph :func:`build_graph_columns` built (``N`` ops, the first
    ``n0`` appended one by one, named ``prefix``): ``names`` the items' names, ``p_i`` each
    item's launch (its GPU op after it), ``split_ops`` / ``split_ids`` the splits' host-overhead
    ops and splits, ``record_ops`` / ``record_splits`` the done events, ``g`` the graph, ``n_gpu``
    end syncs; ``host``: None without host inputs, else the positions and items of their syncs,
    waits, copies (and their launches, None when the copies block the host), the pieces' items
    and selective flags, the selective items' runs of used experts, and the ids readbacks and
    their layers."""
    J = len(names)
    names_pool = ["", *names, *["issue " + nm for nm in names]]
    nm_src = np.zeros(N, dtype=np.int64)
    nm_src[p_i + 1] = np.arange(1, J + 1)
    nm_src[p_i] = np.arange(J + 1, 2 * J + 1)
    base = len(names_pool)
    names_pool += [f"split {s} host overhead" for s in split_ids.tolist()]
    nm_src[split_ops] = np.arange(base, base + split_ops.size)
    base = len(names_pool)
    names_pool += [f"record done split{s}" for s in record_splits.tolist()]
    nm_src[record_ops] = np.arange(base, base + record_ops.size)
    base = len(names_pool)
    names_pool += [f"graph {g} end sync{d}" for d in range(n_gpu)]
    nm_src[N - n_gpu:] = np.arange(base, base + n_gpu)
    if host is not None:
        sync_ops, sync_items, wait_ops, wait_items, cp, pp, piece_item, sel_piece, exp_at, runs_at, ids_ops, ids_layers = host
        hy = sync_items.tolist()
        base = len(names_pool)
        names_pool += ["sync before " + names[j] for j in hy]
        nm_src[sync_ops] = np.arange(base, base + len(hy))
        base = len(names_pool)
        hw_ = wait_items.tolist()
        names_pool += ["wait copy " + names[j] for j in hw_]
        nm_src[wait_ops] = np.arange(base, base + len(hw_))
        # a selective copy's pieces are named by their runs, a whole copy's by its tensor
        it_sel = iter([f"{names[j]}[{a}:{a + cnt}]" for j, runs in zip(exp_at, runs_at) for a, cnt in runs])
        piece_names = [next(it_sel) if s_ else names[j] for j, s_ in zip(piece_item.tolist(), sel_piece.tolist())]
        base = len(names_pool)
        names_pool += piece_names
        npc = len(piece_names)
        nm_src[cp] = np.arange(base, base + npc)
        if pp is not None:
            names_pool += ["issue " + nm for nm in piece_names]
            nm_src[pp] = np.arange(base + npc, base + 2 * npc)
        if ids_ops.size:
            lays = ids_layers.tolist()
            base = len(names_pool)
            for lay in lays:
                names_pool += [f"issue blk.{lay}.ffn_moe_topk ids", f"blk.{lay}.ffn_moe_topk ids",
                               f"wait ids blk.{lay}", f"build expert runs blk.{lay}"]
            for q in range(4):
                nm_src[ids_ops + q] = np.arange(base + q, base + 4 * len(lays), 4)
    return prefix + _take(names_pool, nm_src[n0:])


def _take(pool: list, idx: np.ndarray) -> list:
    """``[pool[i] for i in idx]`` (C-level gather)."""
    n = idx.size
    if n == 0:
        return []
    if n == 1:
        return [pool[int(idx[0])]]
    return list(itemgetter(*idx.tolist())(pool))


def build_graph_columns(em, n_tokens: int, kv_len: int, token_offset: int, masks: dict | None,
                        block: np.ndarray | None = None, n_outputs: int | None = None) -> bool:
    """Emit one graph on the empty plan of ``em`` as :func:`sim.plan.builder.build_graph` would
    (the same ops, column for column, the same ``em.kv_ops``, ``em.overhead_op``, graph lists and
    ``meta`` entries, ``ctx.stats["used_masks"]``), when the graph is of the class this module
    covers; else append nothing and return False.

    With it, ``em.price_classes``: ``(class of each op, an op of each class)`` for
    :func:`sim.model.costs.class_durations` (None when the ops' bytes are too large to key).

    The class: an empty plan (``em`` fresh from :class:`sim.plan.builder.Emitter`: the graph of a
    template), no expert cache, every layer offloaded and every item on a GPU (no CPU-backend
    split, no moved attention) and no staged copy (no host input, or neither weight prefetch
    nor expert slots on in this graph). Host inputs are copied synchronously, selectively or
    whole, pinned or pageable (on the host thread where the pageable link blocks it, CUDA, else
    queued on the compute stream). The emitter's tracking state is left as the graph's end
    leaves it (``last_gpu``, ``last_host``, ``layer``, ``split``), but the plan is meant to hold
    this one graph (:func:`sim.plan.memo.build_template`).

    ``masks``: the used-expert masks of every MoE layer, layer -> (E,) bool
    (:func:`sim.plan.builder.draw_masks`; required for a model with experts); ``block``: optionally
    the same masks as one (L, E) bool array, row ``k`` the mask of ``ctx.moe_layers[k]`` (what
    :func:`sim.plan.builder.draw_masks_graphs` draws: counted and cut into runs in one piece);
    both drawn with ``n_outputs``, the graph's output rows (:func:`sim.plan.builder.graph_items`).

    Args:
        em: the emitter (its ``graph``, ``act_device_default``, ``rebuilt``, ``call_tokens`` and
            ``capture_share`` set as :func:`sim.plan.memo.build_template` sets them).
        n_tokens, kv_len, token_offset: the graph (:func:`sim.plan.builder.test_graphs`).

    Returns:
        True when the graph was built here.
    """
    ctx = em.ctx
    plan = em.plan
    if not ENABLE or len(plan) or em.host_pending or em.last_gpu or ctx.cache is not None:
        return False
    scn, var, model = ctx.scn, ctx.variant, ctx.scn.model
    hw = scn.hardware
    moe = model.moe
    layers_moe = ctx.moe_layers if moe is not None else []
    if moe is not None:
        if masks is None or any(i not in masks for i in layers_moe):
            return False
        ms = [masks[i] for i in layers_moe]
        if block is None or block.dtype != np.bool_ or block.shape[0] != len(layers_moe):
            if any(m.dtype != np.bool_ for m in ms):
                return False
            block = None
            n_used = np.array([np.count_nonzero(m) for m in ms], dtype=np.int64)
        else:
            n_used = np.count_nonzero(block, axis=1).astype(np.int64)
    else:
        ms = []
        n_used = np.zeros(0, dtype=np.int64)
    cols = graph_item_columns(ctx, n_tokens, kv_len, n_used, n_outputs)
    if cols is None or cols.cpu.any() or cols.moved.any():
        return False
    J = len(cols.names)
    dev = cols.device
    offl = cols.host      # host input run on the GPU: heads its own split
    head = offl.copy()
    head[0] = True
    head[1:] |= dev[1:] != dev[:-1]
    has_host = bool(offl.any())
    has_moe_host = bool((offl & cols.expert).any())
    # the gate: any MoE op of the graph (sim.plan.builder.build_graph)
    prefetch_on = var.prefetch_weights and not (
        bool(cols.expert.any()) and var.gate_min_batch is not None and n_tokens < var.gate_min_batch)
    slots_on = (var.expert_slots > 0 and moe is not None and n_tokens * moe.n_expert_used >= 2 * moe.n_expert)
    if has_host:
        if prefetch_on or (slots_on and has_moe_host):
            return False   # staged copies
    # pageable copies where the link blocks the host (CUDA): each copy an op on the host
    # thread (Emitter.h2d), no launch and no wait; else a launch and a copy on the compute stream
    blocking = has_host and not (em.pinned or not hw.h2d_pageable.host_blocking)
    step = 1 if blocking else 2
    # -- the graph's lists and stats, as build_graph / graph_items leave them
    if moe is not None:
        ctx.stats.setdefault("used_masks", {}).update(zip(layers_moe, ms))
    g = em.graph
    ggml = hw.ggml
    split_on = ggml is not None and ggml.split_s > 0
    # -- preamble (a few ops, appended one by one as build_graph appends them)
    kv_ops: list = []
    last_host = -1
    overhead_op = -1
    if ggml is not None and ggml.has_graph_host_work:
        overhead_op = last_host = plan.append(
            OpKind.HOST_WORK, Stream.HOST, -1, f"graph {g} host overhead", (), 0,
            overhead_shape(cols.kernels, n_tokens, em.rebuilt, em.call_tokens, model.n_layer, em.capture_share),
            em.layer, em.split, g, -1, 0, True, "graph_overhead")
    if ggml is not None and ggml.mask_s > 0:
        on_gpu = bool((cols.role == _ATTN).any())
        oid = last_host = plan.append(OpKind.HOST_WORK, Stream.HOST, -1, f"graph {g} KQ mask", (), 0,
                                      kq_mask_shape(model, n_tokens, kv_len, scn.placement.flash_attn, on_gpu),
                                      em.layer, em.split, g, -1, 0, True, "kq_mask")
        kv_ops.append((oid, "kq_mask", int(on_gpu)))
    first_dev = int(dev[0])
    if ggml is not None and ggml.cpu_get_rows_bytes_per_s > 0:
        rows = plan.append(OpKind.CPU_MATVEC, Stream.CPU, -1, "token_embd get_rows",
                           [last_host] if last_host >= 0 else [], 0, (n_tokens, model.d_model, 0, 0, "rows", ()),
                           -1, em.split, g, -1, 0, True, "")
        iss = last_host = plan.append(OpKind.ISSUE, Stream.HOST, -1, "issue token_embd rows to device", [rows], 0,
                                      (), em.layer, em.split, g, -1, 0, True, OpKind.H2D.value)
        plan.append(OpKind.H2D, Stream.COMPUTE, first_dev, "token_embd rows to device", (iss,),
                    n_tokens * model.d_model * ACT_BYTES, (), em.layer, em.split, g, -1, 0, True, "act")
    base0 = len(plan)
    pre_comp = [base0 - 1] if base0 and plan.streams[-1] == _COMPUTE else []
    # -- per item: the ops of its block
    si = np.cumsum(head) - 1
    last = np.ones(J, dtype=bool)
    last[:-1] = head[1:]
    selective = var.selective_copy
    exp_h = offl & cols.expert & selective
    first_ids = np.zeros(J, dtype=bool)
    runs_of: dict[int, list[tuple[int, int]]] = {}
    if exp_h.any():
        cand = np.flatnonzero(exp_h)
        lay_c = cols.layers[cand]
        fi, _inv = unique_index_inverse(lay_c)
        first_ids[cand[fi]] = True
        lays = lay_c[fi].tolist()
        moe_pos = ctx.column_cache.get("_moe_pos")
        if moe_pos is None:
            moe_pos = ctx.column_cache["_moe_pos"] = {lay: k for k, lay in enumerate(layers_moe)}
        at = [moe_pos[lay] for lay in lays]
        rows = block[at] if block is not None else np.stack([ms[k] for k in at])
        runs_of = dict(zip(lays, _runs_rows(rows)))
    n_pieces = offl.astype(np.int64)
    exp_at = np.flatnonzero(exp_h).tolist()
    if exp_at:
        runs_at = [runs_of[lay] for lay in cols.layers[exp_at].tolist()]
        n_pieces[exp_at] = [len(r) for r in runs_at]
    c_s = (head & split_on).astype(np.int64)
    c_y = offl.astype(np.int64)
    c_d = 4 * first_ids.astype(np.int64)
    c_p = step * n_pieces
    c_w = (offl & (n_pieces > 0) & (not blocking)).astype(np.int64)
    c_r = (last & prefetch_on).astype(np.int64)
    blen = c_s + c_y + c_d + c_p + c_w + 2 + c_r
    o = np.empty(J, dtype=np.int64)
    o[0] = base0
    np.cumsum(blen[:-1], out=o[1:])
    o[1:] += base0
    p_y = o + c_s
    p_d = p_y + c_y
    p_p = p_d + c_d
    p_w = p_p + c_p
    p_i = p_w + c_w            # the item's ISSUE; its GPU op at p_i + 1
    p_r = p_i + 2
    n_gpu = hw.n_gpu
    N = int(o[-1] + blen[-1]) + n_gpu
    # -- numeric columns (defaults: a host op of the graph, no deps)
    kind = np.full(N, _K[OpKind.ISSUE], dtype=np.int64)
    stream = np.full(N, _HOST, dtype=np.int64)
    device = np.full(N, -1, dtype=np.int64)
    nbytes = np.zeros(N, dtype=np.int64)
    layer = np.empty(N, dtype=np.int64)
    split = np.empty(N, dtype=np.int64)
    pinned = np.ones(N, dtype=bool)
    dep1 = np.full(N, -1, dtype=np.int64)   # an op's deps: dep1 < dep2, -1 none
    dep2 = np.full(N, -1, dtype=np.int64)
    kind[:base0] = plan.kinds        # the preamble's ops, as appended
    stream[:base0] = plan.streams
    device[:base0] = plan.devices
    # every op of a block: its item's split, the layer of the split's first item (em.layer) until
    # the item's launch sets it to the item's own
    blk_of = np.repeat(np.arange(J), blen)
    split[base0:N - n_gpu] = si[blk_of]
    head_item = np.flatnonzero(head)[si]
    layer[base0:N - n_gpu] = cols.layers[head_item][blk_of]
    # the launches (ISSUE + GPU op) and the done event take the item's layer
    layer[p_i] = cols.layers
    layer[p_i + 1] = cols.layers
    r_at = np.flatnonzero(c_r)
    layer[p_r[r_at]] = cols.layers[r_at]
    # the end syncs: the last split, the last item's layer
    split[N - n_gpu:] = si[-1]
    layer[N - n_gpu:] = cols.layers[-1]
    # split overhead
    s_at = np.flatnonzero(c_s)
    kind[o[s_at]] = _K[OpKind.HOST_WORK]
    # launches
    kind[p_i + 1] = np.array([_K[k] for k in _ROLE_KIND], dtype=np.int64)[cols.role]
    stream[p_i + 1] = _COMPUTE
    device[p_i + 1] = dev
    nbytes[p_i + 1] = cols.wb
    dep1[p_i + 1] = p_i
    # host inputs: sync, ids readback, copies, wait
    y_at = np.flatnonzero(c_y)
    kind[p_y[y_at]] = _K[OpKind.HOST_SYNC]
    d_at = np.flatnonzero(first_ids)
    if d_at.size:
        pd = p_d[d_at]
        stream[pd + 1] = _COMPUTE
        kind[pd + 1] = _K[OpKind.D2H]
        device[pd + 1] = dev[d_at]
        nbytes[pd + 1] = n_tokens * moe.n_expert_used * ID_BYTES
        dep1[pd + 1] = pd
        kind[pd + 2] = _K[OpKind.HOST_SYNC]
        dep1[pd + 2] = pd + 1
        kind[pd + 3] = _K[OpKind.HOST_WORK]
    w_at = np.flatnonzero(c_w)
    kind[p_w[w_at]] = _K[OpKind.HOST_SYNC]
    dep1[p_w[w_at]] = p_w[w_at] - 1
    piece_item = np.repeat(np.arange(J), n_pieces)
    piece_k = np.arange(piece_item.size) - np.repeat(np.cumsum(n_pieces) - n_pieces, n_pieces)
    pp = p_p[piece_item] + step * piece_k       # each piece's first op (its ISSUE, async)
    cp = pp + (step - 1)                        # the copy
    kind[cp] = _K[OpKind.H2D]
    device[cp] = dev[piece_item]
    if blocking:
        pinned[cp] = False
    else:
        stream[cp] = _COMPUTE
        dep1[cp] = pp
        pinned[cp] = em.pinned
    sel_piece = np.zeros(piece_item.size, dtype=bool)
    if has_host:
        # a selective copy: one piece per run of used experts (names, bytes); else the whole tensors
        whole = ~exp_h[piece_item]
        sel_piece = ~whole
        nbytes[cp] = np.where(whole, cols.copy[piece_item], 0)
        if exp_at:
            k_sel = cp[sel_piece]
            nbytes[k_sel] = (np.array([cnt for runs in runs_at for _a, cnt in runs], dtype=np.int64)
                             * cols.bpm[piece_item[sel_piece]])
    kind[p_r[r_at]] = _K[OpKind.EVENT_RECORD]
    # the compute-stream ops, by position: a sync waits for its GPU's last one; a split whose
    # activations come from another GPU waits for that GPU's last one (Emitter._current_device)
    comp = np.sort(np.concatenate((np.asarray(pre_comp, dtype=np.int64), p_i + 1, cp[:0] if blocking else cp,
                                   p_d[d_at] + 1 if d_at.size else np.zeros(0, dtype=np.int64))))
    comp_dev = device[comp]
    # what waits for a GPU's last compute-stream op: syncs, and copies on the host thread
    syncs = np.concatenate((p_y[y_at], np.arange(N - n_gpu, N), cp if blocking else cp[:0]))
    sync_dev = np.concatenate((dev[y_at], np.arange(n_gpu), dev[piece_item] if blocking else cp[:0]))
    for d in range(n_gpu):
        on = comp[comp_dev == d]
        here = np.flatnonzero(sync_dev == d)
        if on.size and here.size:
            k = np.searchsorted(on, syncs[here]) - 1
            ok = k >= 0
            dep1[syncs[here[ok]]] = on[k[ok]]
    kind[N - n_gpu:] = _K[OpKind.HOST_SYNC]
    h_at = np.flatnonzero(head)
    k = np.searchsorted(comp, o[h_at]) - 1
    prev_op = np.where(k >= 0, comp[np.maximum(k, 0)], -1)
    prev_dev = np.where(k >= 0, device[np.maximum(prev_op, 0)], em.act_device_default)
    change = (prev_dev != dev[h_at]) & (prev_op >= 0)
    gpu_first = p_i[h_at[change]] + 1
    dep2[gpu_first] = dep1[gpu_first]
    dep1[gpu_first] = prev_op[change]
    # -- object columns, gathered from pools (the names when first read: _graph_names)
    tags_pool = ["", *[k.value for k in _ROLE_KIND], OpKind.H2D.value, "selective", "whole", OpKind.D2H.value,
                 "ids", "split_overhead"]
    tg_src = np.zeros(N, dtype=np.int64)
    tg_src[p_i] = 1 + cols.role
    tg_src[o[s_at]] = 9
    shapes_pool: list = [()]
    sh_src = np.zeros(N, dtype=np.int64)
    sh_src[p_i + 1] = np.arange(1, J + 1)
    a_at = np.flatnonzero(cols.role == _ATTN)
    sh_src[p_i[a_at]] = 1 + a_at
    shapes_pool += cols.shapes
    host_names = None
    if has_host:
        tg_src[cp] = np.where(sel_piece, 5, 6)
        if not blocking:
            tg_src[pp] = 4
        host_names = (p_y[y_at], y_at, p_w[w_at], w_at, cp, None if blocking else pp, piece_item, sel_piece,
                      exp_at, runs_at if exp_at else [], p_d[d_at], cols.layers[d_at])
        if d_at.size:
            pd = p_d[d_at]
            tg_src[pd] = 7
            tg_src[pd + 1] = 8
            shapes_pool.append((n_tokens * moe.n_expert_used,))
            sh_src[pd + 3] = len(shapes_pool) - 1
    # -- price classes: ops of equal (kind, bytes, shape, pinned, tag), the shape named by its
    # pool entry (equal shapes are one entry); each preamble op a class of its own
    shape_code = np.zeros(N, dtype=np.int64)
    shape_code[p_i + 1] = 1 + cols.shape_id
    shape_code[p_i[a_at]] = 1 + cols.shape_id[a_at]
    n_sh = int(cols.shape_id.max()) + 2
    if d_at.size:
        shape_code[p_d[d_at] + 3] = n_sh
    shape_code[:base0] = n_sh + 1 + np.arange(base0)
    em.price_classes = None
    if n_sh + 1 + base0 < 1 << 16 and int(nbytes.max()) < 1 << 38:
        key = ((((nbytes << 4 | kind) << 1 | pinned) << 4 | tg_src) << 16) | shape_code
        # classes numbered by their keys in order (a plain sort and a search, no stable argsort);
        # an op of each class: whichever the scatter leaves (the ops of a class price alike)
        sk = np.sort(key)
        brk = np.empty(N, dtype=bool)
        brk[0] = True
        np.not_equal(sk[1:], sk[:-1], out=brk[1:])
        inv = np.searchsorted(sk[brk], key)
        first = np.empty(int(brk.sum()), dtype=np.int64)
        first[inv] = np.arange(N, dtype=np.int64)
        em.price_classes = (inv, first)
    # -- the plan
    n0 = base0
    cnt = (dep1 >= 0).astype(np.int64) + (dep2 >= 0)
    ptr = np.empty(N - n0 + 1, dtype=np.int64)
    ptr[0] = len(plan.dep_idx)
    np.cumsum(cnt[n0:], out=ptr[1:])
    ptr[1:] += ptr[0]
    both = np.stack((dep1[n0:], dep2[n0:]), axis=1).ravel()
    pre_ptr = np.array(plan.dep_ptr, dtype=np.int64)
    pre_idx = np.array(plan.dep_idx, dtype=np.int64)
    dep_idx = both[both >= 0]
    plan.kinds += kind[n0:].tolist()
    plan.streams += stream[n0:].tolist()
    plan.devices += device[n0:].tolist()
    plan.dep_ptr += ptr[1:].tolist()
    plan.dep_idx += dep_idx.tolist()
    plan.nbytes += nbytes[n0:].tolist()
    plan.shapes += _take(shapes_pool, sh_src[n0:])
    plan.graphs += [g] * (N - n0)
    plan.pinned += pinned[n0:].tolist()
    plan.tags += _take(tags_pool, tg_src[n0:])
    plan.graph_last_op.append(N - 1)
    plan.graph_tokens.append(n_tokens)
    plan.meta.setdefault("rebuilt_graphs", []).append(bool(em.rebuilt))
    plan.meta.setdefault("graph_kernels", []).append(cols.kernels)
    # the columns nothing of a template reads, made when first read (Plan.set_lazy_column)
    plan.set_lazy_column("names", partial(_graph_names, plan.names, n0, N, cols.names, p_i, o[s_at], si[s_at],
                                          p_r[r_at], si[r_at], g, n_gpu, host_names))
    plan.set_lazy_column("layers", partial(_tail_list, plan.layers, layer[n0:]))
    plan.set_lazy_column("splits", partial(_tail_list, plan.splits, split[n0:]))
    plan.set_lazy_column("slots", partial(_tail_list, plan.slots, np.full(N - n0, -1, dtype=np.int64)))
    plan.set_lazy_column("slot_bytes", partial(_tail_list, plan.slot_bytes, np.zeros(N - n0, dtype=np.int64)))
    plan.set_arrays(kind, stream, device, np.concatenate((pre_ptr, ptr[1:])), np.concatenate((pre_idx, dep_idx)))
    h2d = _K[OpKind.H2D]
    em.column_h2d_bytes = (int(nbytes[n0:][kind[n0:] == h2d].sum(dtype=np.int64))
                           + sum(nb for k, nb in zip(plan.kinds[:n0], plan.nbytes[:n0]) if k == h2d))
    # -- the emitter as build_graph leaves it
    a_lay = cols.layers[a_at].tolist()
    a_iss = p_i[a_at].tolist()
    kv_ops += [x for oid, lay in zip(a_iss, a_lay) for x in ((oid, "attn", lay), (oid + 1, "attn", lay))]
    em.kv_ops.extend(kv_ops)
    em.overhead_op = overhead_op
    em.split = int(si[-1])
    em.layer = int(cols.layers[-1])
    em.last_host = N - 1
    for d in range(n_gpu):
        on = comp[comp_dev == d]
        if on.size:
            em.last_gpu[(Stream.COMPUTE.value, d)] = int(on[-1])
    em.fill_pending = False
    return True


__all__ = ["ENABLE", "ItemColumns", "graph_item_columns", "build_graph_columns"]
