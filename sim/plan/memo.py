"""Graph-level memoisation: time each distinct graph structure of a test once.

Every graph (ubatch) of a plan ends in a full host synchronisation of every GPU (both streams),
and every op of the next graph depends, directly or through the host queue, on the host op that
opens it. So the next graph starts when the previous one has ended, and the makespan of a test
is the sum of its graphs' makespans, each timed on its own (the graph's ops shifted by the end
of the previous graph: exact in real arithmetic, equal to rounding in floating point). The same
holds for the overlap metrics: a graph's H2D and compute intervals lie inside its own time
window, so the H2D busy time and the hidden part of it add up over graphs.

A test is then evaluated as (:func:`time_test`):

1. draw the used-expert masks of every graph from the test's rng, in the builder's order
   (:func:`sim.plan.builder.draw_masks`), so that the draws are those of the full plan (all
   graphs in one call: :func:`sim.plan.builder.draw_masks_graphs`, the same draws);
2. key each graph on what determines its ops (:func:`graph_key`): tokens, the GPU holding the
   activations when it starts, and per MoE layer either the lengths of the mask's runs of used
   experts (when a selective copy of host experts reads it: one copy per run, priced by its
   bytes; where the runs sit changes only the ops' names) or only the count of used experts
   (everything else prices experts by count);
3. build each distinct key once as a one-graph plan (a :class:`GraphTemplate`: a column at a
   time by :func:`sim.plan.fastgraph.build_graph_columns` where that covers the graph, priced once
   per class of equal ops with :func:`sim.model.costs.class_durations`; else op by op by
   :func:`sim.plan.builder.build_graph`, priced with :func:`sim.model.costs.plan_durations`; the same
   plan and prices either way) and compiled once; a graph that differs from one built in
   the same call only in its ``llama_decode`` call (the first ubatch of a call carries the call's
   tokens, a test's first reused graph its CUDA-graph capture: :func:`sim.plan.builder.graph_calls`)
   gets that template with its host-overhead op re-priced (:func:`derive_template`), the same
   structure;
4. the KV length changes only the durations of a few ops (attention, its launch, the KQ mask
   fill: ``Emitter.kv_ops``), not the structure: each graph's duration row is the template's
   with those ops re-priced, identical rows are evaluated once, the others (with those of the
   templates derived from the same one) as one (S, n) batch of the analytic engine (summed
   along the critical tree of one of them, :func:`sim.engines.analytic._run_tree`; transfer
   statistics of all rows at once, :func:`sim.views.trace.h2d_busy_hidden_rows`) or one DES run each;
5. sum makespans, H2D bytes and the H2D busy/hidden seconds over the graphs.

Not memoised (the full plan is built instead, :func:`memo_eligible`): plans with an expert
cache (its state carries across graphs and its background fills cross the graph end) and
``executor_mode`` profiles (a launch's price depends on whether any earlier graph ran a CPU op).
Traces and timelines always use the full plan (:func:`sim.plan.builder.build_plan`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sim import engines
from sim.plan.builder import (BuildContext, Emitter, build_graph, cpu_attn_args, draw_masks, per_model,
                      draw_masks_graphs, graph_calls, kq_mask_shape, output_rows, overhead_shape, test_graphs)
from sim.model.costs import (attn_durations_kv_s, attn_durations_s, class_durations, direct_launch_s,
                             kq_mask_durations_s, op_duration_s, plan_durations, price_reads_shape)
from sim.model.ggmlcost import mask_shapes_many
from sim.engines.analytic import CompiledPlan, compile_plan
from sim.errors import PlacementError
from sim.plan.fastgraph import build_graph_columns
from sim.plan.overlap import template_host_edges, template_makespans, ubatch_overlap_s
from sim.plan import KINDS, STREAM_CODE, OpKind, Plan, Stream
from sim.model.specs import BenchTest
from sim.views.trace import exposed_from_busy, h2d_busy_hidden_rows, h2d_busy_hidden_s, overlap_from_busy, plan_transfer_groups

#: templates kept across the repetitions of a test hold at most this many ops in all
KEEP_OPS = 200_000

_EXPERT_NAMES = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_up_exps")


@dataclass
class GraphTemplate:
    """One graph built and compiled on its own (graph index 0 of a one-graph plan).

    Attributes:
        plan: the one-graph plan (its ops' shapes are those of ``kv_len``).
        comp: its compiled predecessor lists (:func:`sim.engines.analytic.compile_plan`).
        durations: (n,) seconds of its ops at ``kv_len``.
        n_tokens, kv_len: the graph it was built from.
        end_device: GPU of its last compute-stream op (where the activations are at its end).
        h2d_bytes: bytes it copies host→device.
        groups: :func:`sim.views.trace.transfer_groups` of its ops.
        rows: distinct duration rows seen so far, (n,) each; ``row_of`` maps a KV length to its
            row, ``row_key`` the re-priced durations to a row.
        results: row index -> (makespan, H2D busy s, hidden s, host prefix s, host idle tail s)
            (:func:`sim.plan.overlap.template_host_edges`), once timed.
        kv_ops: the ops whose price depends on the KV length (``Emitter.kv_ops``);
            kv_groups: the same grouped by what the price depends on (:func:`_kv_groups`);
            kv_index: the op ids of each group, an int64 array per group (made with the
            first row that re-prices them).
        launch: :func:`sim.model.costs.direct_launch_s` of the plan (added to a re-priced op).
        overhead_op: id of the graph's host-overhead op (``Emitter.overhead_op``), -1 without one.
    """

    plan: Plan
    comp: CompiledPlan
    durations: np.ndarray
    n_tokens: int
    kv_len: int
    end_device: int
    h2d_bytes: int
    groups: list
    rows: list = field(default_factory=list)
    row_of: dict = field(default_factory=dict)
    row_key: dict = field(default_factory=dict)
    results: dict = field(default_factory=dict)   # row index -> (makespan, h2d busy, hidden, H, F)
    kv_ops: list = field(default_factory=list)
    kv_groups: list | None = None
    kv_index: list | None = None
    launch: np.ndarray | float = 0.0
    overhead_op: int = -1


@dataclass(frozen=True)
class TestTiming:
    """One repetition of one test, timed.

    Attributes:
        makespan_s: simulated time of the test, seconds.
        h2d_bytes: bytes copied host→device.
        exposed_transfer_s: H2D seconds not hidden behind compute.
        overlap_fraction: share of H2D time hidden (NaN without H2D).
        n_graphs: graphs of the test; n_templates: distinct graphs built.
    """

    makespan_s: float
    h2d_bytes: int
    exposed_transfer_s: float
    overlap_fraction: float
    n_graphs: int = 0
    n_templates: int = 0


def memo_eligible(ctx: BuildContext) -> bool:
    """Whether a test of ``ctx`` can be timed graph by graph (see the module docstring)."""
    return ctx.cache is None and not ctx.scn.hardware.executor_mode


#: :func:`_expert_tensors` per model (:func:`sim.plan.builder.per_model`)
_EXPERT_TENSORS: dict[int, tuple] = {}


def _expert_tensors(model) -> list[tuple[int, object]]:
    """``(layer, tensor)`` of the model's expert tensors by name (``blk.<i>.<name>.weight`` for
    the names of :data:`_EXPERT_NAMES`, as ``BuildContext.tensor_by_name`` holds them: not the
    duplicates), computed once per model."""
    def make(m) -> list:
        tens = {t.name: t for t in m.tensors if not t.duplicate}
        found = [(i, tens.get(f"blk.{i}.{nm}.weight")) for i in range(m.n_layer) for nm in _EXPERT_NAMES]
        return [(i, t) for i, t in found if t is not None]

    return per_model(_EXPERT_TENSORS, model, make)


def _host_expert_layers(ctx: BuildContext) -> frozenset[int]:
    """MoE layers with a host-resident expert tensor."""
    host = ctx.host_ids
    return frozenset(i for i, t in _expert_tensors(ctx.scn.model) if id(t) in host)


def _masks_matter(ctx: BuildContext, n_tokens: int, host_layers: frozenset[int]) -> bool:
    """Whether some layer's plan reads its mask beyond the count: a selective copy of host
    experts run on the GPU (a conservative test: staged or gated splits do not read it)."""
    return (bool(host_layers) and ctx.variant.selective_copy
            and n_tokens >= ctx.scn.placement.op_offload_min_batch)


def run_lengths(mask: np.ndarray) -> tuple[int, ...]:
    """Lengths of the contiguous runs of used experts in ``mask``, in order: the selective copy
    copies one H2D op of ``length x bytes per expert`` per run (:func:`sim.plan.builder._runs`), so
    these lengths, not where the runs sit, determine its ops and their durations."""
    n = mask.shape[0]
    p = np.zeros(n + 2, dtype=np.int8)
    p[1:-1] = mask
    e = np.flatnonzero(p[1:] != p[:-1])
    return tuple((e[1::2] - e[::2]).tolist())


def mask_key(masks: dict[int, np.ndarray], mask_layers: frozenset[int], seen: dict | None = None) -> tuple:
    """Per MoE layer ``(layer, run lengths)`` (:func:`run_lengths`) for the layers in
    ``mask_layers`` (their selective copies read the mask), ``(layer, used count)`` for the
    others (everything else prices experts by count). ``seen``: mask bytes -> run lengths
    already computed (kept by the caller across graphs)."""
    if seen is None:
        seen = {}
    out = []
    for i, m in masks.items():
        if i in mask_layers:
            b = m.tobytes()
            r = seen.get(b)
            if r is None:
                r = seen[b] = run_lengths(m)
            out.append((i, r))
        else:
            out.append((i, int(np.count_nonzero(m))))
    return tuple(out)


#: :func:`time_test` draws the masks of a test's graphs in one call and keys them per graph
#: (:func:`sim.plan.builder.draw_masks_graphs`, :func:`block_keys`); False draws and keys them graph
#: by graph (:func:`sim.plan.builder.draw_masks`, :func:`mask_key`: the reference path the tests
#: compare it with)
ENABLE_BATCH_DRAWS = True

#: at most this many distinct mask blocks are kept (:func:`block_keys`)
_BLOCKS_MAX = 256
#: graphs whose masks :func:`time_test` draws at once (their blocks then dropped but each new key's)
_DRAW_CHUNK = 4096


def block_keys(blocks: list, layers: list[int], mask_layers: list[frozenset[int]], memo: dict) -> list[tuple]:
    """:func:`mask_key` of each graph's masks given as one (L, E) bool block (row ``k``: layer
    ``layers[k]``; None: a graph without experts, key ``()``), with that graph's
    ``mask_layers``. Equal blocks (the same object, or the same bytes) are keyed once; the
    keys of blocks seen before are kept in ``memo["_blocks"]``, their run lengths in
    ``memo["_runs"]`` (as :func:`mask_key`'s ``seen``).

    Returns:
        one key per block, each equal to ``mask_key(dict(zip(layers, block)), ...)``.
    """
    seen = memo.setdefault("_runs", {})
    known = memo.setdefault("_blocks", {})
    if len(known) > _BLOCKS_MAX:
        known.clear()
    out: list[tuple] = []
    last_obj = last_key = last_ml = None
    for blk, ml in zip(blocks, mask_layers):
        if blk is None:
            out.append(())
            continue
        if blk is last_obj and ml is last_ml:
            out.append(last_key)
            continue
        bk = (ml, blk.tobytes())
        key = known.get(bk)
        if key is None:
            # mask_key(dict(zip(layers, blk)), ml, seen), the counts of the block's rows at once
            counts = np.count_nonzero(blk, axis=1).tolist() if blk.ndim == 2 else None
            if counts is None or len(counts) != len(layers):
                key = mask_key(dict(zip(layers, blk)), ml, seen)
            else:
                parts = []
                for i, m, c in zip(layers, blk, counts):
                    if i in ml:
                        b = m.tobytes()
                        r = seen.get(b)
                        if r is None:
                            r = seen[b] = run_lengths(m)
                        parts.append((i, r))
                    else:
                        parts.append((i, c))
                key = tuple(parts)
            known[bk] = key
        out.append(key)
        last_obj, last_ml, last_key = blk, ml, key
    return out


def graph_key(n_tokens: int, masks: dict[int, np.ndarray], start_device: int,
              mask_layers: frozenset[int], n_outputs: int | None = None) -> tuple:
    """What determines a graph's ops apart from the KV length: tokens, the GPU holding the
    activations at its start, :func:`mask_key` and the output rows
    (:func:`sim.plan.builder.output_rows`). ``key[::2]`` drops the device and the output rows."""
    return (n_tokens, start_device, mask_key(masks, mask_layers), n_outputs)


def build_template(ctx: BuildContext, n_tokens: int, kv_len: int, token_offset: int,
                   masks: dict[int, np.ndarray], start_device: int, call: tuple[bool, int, float] = (False, 0, 0.0),
                   block: np.ndarray | None = None, n_outputs: int | None = None) -> GraphTemplate:
    """Build, price and compile one graph on its own (see :class:`GraphTemplate`); ``call``:
    :func:`sim.plan.builder.graph_calls` of the graph; ``block``: optionally the masks as the (L, E)
    bool array whose rows ``masks`` holds (layers ``ctx.moe_layers``: what
    :func:`sim.plan.builder.draw_masks_graphs` draws), read by the column builder in one piece;
    ``n_outputs``: the graph's output rows (:func:`sim.plan.builder.output_rows`; the masks drawn
    with them)."""
    hw = ctx.scn.hardware
    plan = Plan(label="graph")
    em = Emitter(plan, ctx)
    em.act_device_default = start_device
    em.graph = 0
    em.token_offset = token_offset
    em.rebuilt, em.call_tokens, em.capture_share = call
    ctx.stats["used_masks"] = {}
    em.cache_split = {}
    if not build_graph_columns(em, n_tokens, kv_len, token_offset, masks, block, n_outputs):
        build_graph(em, n_tokens, kv_len, token_offset, masks, n_outputs)
    end_device = start_device
    on_compute = np.flatnonzero(plan.arrays.stream == STREAM_CODE[Stream.COMPUTE])
    if on_compute.size:
        end_device = int(plan.devices[int(on_compute[-1])])
    launch = direct_launch_s(plan, hw)
    if em.price_classes is None:
        dur = plan_durations(plan, hw)
    else:
        dur = class_durations(plan, hw, *em.price_classes, launch=launch)
    h2d = plan.h2d_bytes() if em.column_h2d_bytes is None else em.column_h2d_bytes
    tpl = GraphTemplate(plan, compile_plan(plan), dur, n_tokens, kv_len, end_device, h2d,
                        plan_transfer_groups(plan), kv_ops=list(em.kv_ops), launch=launch,
                        overhead_op=em.overhead_op)
    _row_at(tpl, ctx, kv_len)
    return tpl


#: :func:`time_test` makes the template of a graph that differs from one it has only in its
#: ``llama_decode`` call (:func:`sim.plan.builder.graph_calls`'s call tokens and capture share) from
#: that one (:func:`derive_template`); False builds every template (the reference path the tests
#: compare it with)
ENABLE_DERIVE = True


def derive_template(src: GraphTemplate, ctx: BuildContext, call: tuple[bool, int, float]) -> GraphTemplate:
    """The template :func:`build_template` would build, at ``src.kv_len``, for the graph of
    ``src`` with another ``call`` (:func:`sim.plan.builder.graph_calls`) of the same ``rebuilt`` flag:
    such graphs differ only in the shape, hence the duration, of their host-overhead op (the
    only op that reads the call tokens and the capture share), so the template is ``src``'s with
    that op re-shaped and re-priced (:meth:`sim.plan.Plan.with_shapes`, sharing the compiled
    plan and the transfer groups). Its rows are made anew, from its own durations.

    Raises:
        ValueError: ``call`` is of another ``rebuilt`` flag than ``src``'s graph.
    """
    plan = src.plan
    rebuilt = plan.meta.get("rebuilt_graphs", [False])[0]
    if bool(call[0]) != bool(rebuilt):
        raise ValueError("derive_template: a graph llama.cpp rebuilds and a reused one differ beyond their call")
    oid = src.overhead_op
    if oid < 0:
        new_plan, dur = plan.with_shapes({}), src.durations.copy()
    else:
        kernels, n_tok, _rebuilt, _call, n_layer, _share = plan.shapes[oid]
        sh = overhead_shape(kernels, n_tok, call[0], call[1], n_layer, call[2])
        new_plan = plan.with_shapes({oid: sh})
        dur = src.durations.copy()
        dur[oid] = _price(ctx, src, oid, plan.nbytes[oid], sh)
    tpl = GraphTemplate(new_plan, src.comp, dur, src.n_tokens, src.kv_len, src.end_device, src.h2d_bytes,
                        src.groups, kv_ops=list(src.kv_ops), kv_groups=src.kv_groups, kv_index=src.kv_index,
                        launch=src.launch,
                        overhead_op=oid)
    _row_at(tpl, ctx, src.kv_len)
    return tpl


def _kv_groups(tpl: GraphTemplate, ctx: BuildContext) -> list:
    """The template's KV-dependent ops (``Emitter.kv_ops``) grouped by what their price at
    another KV length depends on: the role, the layer's attention signature
    (:attr:`sim.plan.builder.BuildContext.attn_layer_sig`: the attention shape is a function of it,
    the tokens and the KV length) or the mask flag, and the op's kind, bytes, pinned flag and
    tag. Each group is priced once per KV length. An op whose kind is priced whatever its
    shape (:func:`sim.model.costs.price_reads_shape`: an attention's launch) is left out: its price at
    any KV length is the template's. ``[(key, [first op, layer or flag, other ops...]), ...]``,
    computed once per template."""
    if tpl.kv_groups is not None:
        return tpl.kv_groups
    plan = tpl.plan
    sig = ctx.attn_sig_ids    # names the layers' attention signatures (equal iff equal)
    hw = ctx.scn.hardware
    kinds = plan.kinds
    reads = {k: price_reads_shape(KINDS[k], hw) for k in set(kinds[oid] for oid, _role, _arg in tpl.kv_ops)}
    by_key: dict = {}
    for oid, role, arg in tpl.kv_ops:
        if not reads[kinds[oid]]:
            continue
        what = arg if role == "kq_mask" else sig[arg]
        key = (role, what, plan.kinds[oid], plan.nbytes[oid], plan.pinned[oid], plan.tags[oid])
        got = by_key.get(key)
        if got is None:
            by_key[key] = [oid, arg]
        else:
            got.append(oid)
    tpl.kv_groups = [((k[0], k[1] if k[0] == "kq_mask" else None, *k[2:]), v) for k, v in by_key.items()]
    return tpl.kv_groups


def _price(ctx: BuildContext, tpl: GraphTemplate, oid: int, nbytes: int, shape: tuple) -> float:
    """Seconds of the template's op ``oid`` with ``nbytes`` and ``shape`` instead of its own:
    what :func:`sim.model.costs.plan_durations` would price it at (kept in ``ctx.price_cache`` on
    what it keys its prices on), plus the op's launch share (``tpl.launch``)."""
    plan = tpl.plan
    cache = ctx.price_cache
    if len(cache) > 65536:
        cache.clear()
    key = (plan.kinds[oid], nbytes, shape, plan.pinned[oid], plan.tags[oid])
    d = cache.get(key)
    if d is None:
        d = cache[key] = op_duration_s(plan.priced_op(oid, nbytes, shape), ctx.scn.hardware)
    if not isinstance(tpl.launch, float):  # a rebuilt graph's GPU op: its launch share
        d += float(tpl.launch[oid])
    return d


#: :func:`time_test` prices a new template's attentions at the KV lengths of the test's graphs
#: in one call per layer signature (:func:`_prime_kv_prices`); False prices them one KV length
#: at a time as :func:`_row_at` needs them (the reference path the tests compare it with)
ENABLE_PRIME = True


def _prime_kv_prices(tpl: GraphTemplate, ctx: BuildContext, kv_lens) -> None:
    """Put in ``ctx.price_cache`` the prices :func:`_price` would compute for the template's
    attention groups (:func:`_kv_groups`, role ``"attn"``) at each of ``kv_lens`` (KV lengths
    of graphs of ``tpl.n_tokens``), computed at once where
    :func:`sim.model.costs.attn_durations_s` covers them (the same floats as
    :func:`sim.model.costs.op_duration_s`); prices already kept, and groups it does not cover,
    are left to :func:`_row_at`."""
    cache = ctx.price_cache
    if len(cache) > 65536:
        cache.clear()
    plan = tpl.plan
    n = tpl.n_tokens
    hw = ctx.scn.hardware
    kvs = [kv for kv in dict.fromkeys(kv_lens) if kv != tpl.kv_len]
    for (role, _arg, kind, nb, pinned, tag), oids in _kv_groups(tpl, ctx):
        if role != "attn" or KINDS[kind] is not OpKind.ATTN:
            continue
        keys = [(kind, nb, ctx.attn_shape(oids[1], n, kv), pinned, tag) for kv in kvs]
        keys = [k for k in keys if k not in cache]
        if len(keys) < 2:
            continue
        vals = attn_durations_s(plan.priced_op(oids[0]), hw, [k[2] for k in keys])
        if vals is not None:
            cache.update(zip(keys, vals.tolist()))


def _row_at(tpl: GraphTemplate, ctx: BuildContext, kv_len: int) -> int:
    """Index of the duration row of ``tpl`` at ``kv_len`` (the template's ops with the
    KV-dependent ones re-priced), created on first use."""
    got = tpl.row_of.get(kv_len)
    if got is not None:
        return got
    model = ctx.scn.model
    n = tpl.n_tokens
    groups = _kv_groups(tpl, ctx)
    fa = ctx.scn.placement.flash_attn
    if kv_len == tpl.kv_len:
        vals = [float(tpl.durations[oids[0]]) for _key, oids in groups]
    else:
        vals = []
        for (role, arg, _kind, nb, _pinned, _tag), oids in groups:
            if role == "kq_mask":
                sh = kq_mask_shape(model, n, kv_len, fa, bool(arg))
            else:
                sh = ctx.attn_shape(oids[1], n, kv_len)  # equal for every layer of the signature
                if role == "cpu_attn":
                    nb, sh = cpu_attn_args(sh)
            vals.append(_price(ctx, tpl, oids[0], nb, sh))
    rk = tuple(vals)
    idx = tpl.row_key.get(rk)
    if idx is None:
        row = tpl.durations.copy()
        if tpl.kv_index is None:   # each group's ops: its first and the others (_kv_groups)
            tpl.kv_index = [np.array([oids[0], *oids[2:]], dtype=np.int64) for _key, oids in groups]
        for at, d in zip(tpl.kv_index, vals):
            row[at] = d
        idx = tpl.row_key[rk] = len(tpl.rows)
        tpl.rows.append(row)
    tpl.row_of[kv_len] = idx
    return idx


#: :func:`time_test` makes the duration rows of a template's graphs together (:func:`_rows_at`:
#: the KV-dependent prices at every KV length at once, :func:`_kv_prices`); False makes them one
#: KV length at a time (:func:`_row_at`: the reference path the tests compare it with)
ENABLE_BATCH_ROWS = True


def _kv_prices(tpl: GraphTemplate, ctx: BuildContext, kv_lens: list[int], own: bool = True) -> np.ndarray:
    """The values :func:`_row_at` puts in the template's KV-dependent groups (:func:`_kv_groups`)
    at each of ``kv_lens``: (K, groups) float64, row ``k`` the list :func:`_row_at` makes at
    ``kv_lens[k]`` (the template's own durations at its own KV length; elsewhere a group's
    price as :func:`_price` gives it). The KQ-mask fill and the flash attentions are priced at
    every KV length at once (:func:`sim.model.costs.kq_mask_durations_s`,
    :func:`sim.model.costs.attn_durations_kv_s`: the same floats), the others one by one
    (:func:`_price`). ``own`` False prices the template's own KV length too (for templates that
    share the prices, :func:`_rows_at_many`)."""
    model = ctx.scn.model
    n = tpl.n_tokens
    hw = ctx.scn.hardware
    groups = _kv_groups(tpl, ctx)
    fa = ctx.scn.placement.flash_attn
    plan = tpl.plan
    out = np.empty((len(kv_lens), len(groups)))
    own = [k for k, kv in enumerate(kv_lens) if kv == tpl.kv_len] if own else []
    kv = np.asarray(kv_lens, dtype=np.int64)
    for gi, ((role, arg, kind, nb, _pinned, _tag), oids) in enumerate(groups):
        col = None
        if role == "kq_mask":
            col = kq_mask_durations_s(hw, *mask_shapes_many(model, n, kv, fa, bool(arg)))
        elif role == "attn" and KINDS[kind] is OpKind.ATTN:
            col = attn_durations_kv_s(plan.priced_op(oids[0]), hw, kv)
        if col is None:
            col = []
            for k in kv_lens:
                if role == "kq_mask":
                    nb_, sh = nb, kq_mask_shape(model, n, k, fa, bool(arg))
                else:
                    sh = ctx.attn_shape(oids[1], n, k)
                    nb_, sh = cpu_attn_args(sh) if role == "cpu_attn" else (nb, sh)
                col.append(_price(ctx, tpl, oids[0], nb_, sh))
        elif not isinstance(tpl.launch, float):   # a rebuilt graph's GPU op: its launch share (_price)
            col = col + float(tpl.launch[oids[0]])
        out[:, gi] = col
        if own:
            out[own, gi] = float(tpl.durations[oids[0]])
    return out


def _rows_at_many(items: list[tuple[GraphTemplate, list[int]]], ctx: BuildContext) -> list[list[int]]:
    """``[_rows_at(tpl, ctx, kv_lens) for tpl, kv_lens in items]``, the KV-dependent prices
    computed once for the templates that share them (:func:`derive_template`'s: the same KV
    groups and launch shares; each template's own KV length still reads its own durations)."""
    if not ENABLE_BATCH_ROWS or len(items) < 2:
        return [_rows_at(tpl, ctx, kvs) for tpl, kvs in items]

    def share(t: GraphTemplate) -> tuple:
        _kv_groups(t, ctx)
        return id(t.kv_groups), id(t.launch), t.n_tokens

    shared: dict = {}
    for tpl, kvs in items:
        shared.setdefault(share(tpl), [tpl, {}])[1].update(dict.fromkeys(kv for kv in kvs if kv not in tpl.row_of))
    vals_of = {key: dict(zip(kvs, _kv_prices(tpl, ctx, list(kvs), own=False)))
               for key, (tpl, kvs) in shared.items() if len(kvs) > 1}
    out = []
    for tpl, kvs in items:
        got = vals_of.get(share(tpl))
        new = [kv for kv in dict.fromkeys(kvs) if kv not in tpl.row_of]
        if got is None or len(new) < 2:
            out.append(_rows_at(tpl, ctx, kvs))
            continue
        vals = np.array([got[kv] for kv in new])
        for k, kv in enumerate(new):
            if kv == tpl.kv_len:     # its own durations (_kv_prices)
                vals[k] = [float(tpl.durations[oids[0]]) for _key, oids in tpl.kv_groups]
        out.append(_rows_at(tpl, ctx, kvs, vals))
    return out


def _rows_at(tpl: GraphTemplate, ctx: BuildContext, kv_lens: list[int], vals: np.ndarray | None = None) -> list[int]:
    """``[_row_at(tpl, ctx, kv) for kv in kv_lens]``: the same rows, indices and template state,
    the rows not made yet made together (:func:`_kv_prices`, one (K, n) block of rows; with
    :data:`ENABLE_BATCH_ROWS` off, or for one new KV length, by :func:`_row_at`). ``vals``: the
    :func:`_kv_prices` of the KV lengths of ``kv_lens`` without a row yet, in order, when the
    caller has them."""
    row_of = tpl.row_of
    new = [kv for kv in dict.fromkeys(kv_lens) if kv not in row_of]
    if ENABLE_BATCH_ROWS and len(new) > 1:
        if vals is None:
            vals = _kv_prices(tpl, ctx, new)
        groups = _kv_groups(tpl, ctx)
        if tpl.kv_index is None:   # each group's ops: its first and the others (_kv_groups)
            tpl.kv_index = [np.array([oids[0], *oids[2:]], dtype=np.int64) for _key, oids in groups]
        fresh: dict = {}       # row key -> position among the new rows
        at: list[int] = []     # per new KV length: its row, or -1 - its position among the new rows
        for rk in map(tuple, vals.tolist()):
            idx = tpl.row_key.get(rk)
            if idx is None:
                idx = -1 - fresh.setdefault(rk, len(fresh))
            at.append(idx)
        if fresh:
            first = [at.index(-1 - j) for j in range(len(fresh))]
            block = np.repeat(tpl.durations[None, :], len(fresh), axis=0)
            sel = vals[first]
            for gi, ops in enumerate(tpl.kv_index):
                block[:, ops] = sel[:, gi:gi + 1]
            base = len(tpl.rows)
            for j, rk in enumerate(fresh):
                tpl.row_key[rk] = base + j
                tpl.rows.append(block[j])
            at = [base - 1 - a if a < 0 else a for a in at]
        for kv, idx in zip(new, at):
            row_of[kv] = idx
    return [row_of[kv] if kv in row_of else _row_at(tpl, ctx, kv) for kv in kv_lens]


#: what :func:`sim.views.trace.h2d_busy_hidden_rows` keeps on a template's plan across calls
_COVER_KEY = "_memo_h2d_cover"


def _new_memo(_plan) -> dict:
    return {}


def _evaluate(batch: list[tuple[GraphTemplate, list[int]]], engine: str) -> None:
    """Time the rows not timed yet of each ``(template, rows)`` of ``batch``:
    ``tpl.results[row] = (makespan, H2D busy s, hidden s, host prefix s, host idle tail s)``.
    With the analytic engine, the rows of templates that share a compiled plan (derived ones,
    :func:`derive_template`) are timed as one batch (the same numbers, to the bit)."""
    if engine != "analytic":
        for tpl, rows in batch:
            for r in rows:
                if r in tpl.results:
                    continue
                sched = engines.run(tpl.plan, tpl.rows[r], engine=engine)
                tot, hid = h2d_busy_hidden_s(tpl.groups, sched.start_s, sched.end_s)
                h, f = template_host_edges(tpl.plan, np.asarray(sched.start_s), np.asarray(sched.end_s))
                tpl.results[r] = (float(sched.makespan_s), tot, hid, float(h[0]), float(f[0]))
        return
    by_comp: dict[int, list[tuple[GraphTemplate, int]]] = {}
    for tpl, rows in batch:
        by_comp.setdefault(id(tpl.comp), []).extend((tpl, r) for r in rows if r not in tpl.results)
    for todo in by_comp.values():
        if not todo:
            continue
        tpl = todo[0][0]   # what the templates of one compiled plan share: their structure
        d = np.stack([t.rows[r] for t, r in todo]) if len(todo) > 1 else tpl.rows[todo[0][1]]
        sched = engines.analytic.run(tpl.comp, d)
        start, end = np.atleast_2d(sched.start_s), np.atleast_2d(sched.end_s)
        tot, hid = h2d_busy_hidden_rows(tpl.groups, start, end, tpl.plan.derived(_COVER_KEY, _new_memo))
        mk = template_makespans(tpl.plan, end).tolist()
        h, f = template_host_edges(tpl.plan, start, end)
        for k, (t, r) in enumerate(todo):
            t.results[r] = (mk[k], float(tot[k]), float(hid[k]), float(h[k]), float(f[k]))


def time_test(ctx: BuildContext, test: BenchTest, rng: np.random.Generator, engine: str = "analytic",
              memo: dict | None = None) -> TestTiming:
    """One repetition of ``test`` timed graph by graph (see the module docstring); the same
    numbers as building the full plan with :func:`sim.plan.builder.build_plan` and timing it
    (:func:`sim.engines.metrics.time_plan`, :func:`sim.engines.metrics.transfer_stats`), to rounding.

    Args:
        ctx: the variant's context; must be :func:`memo_eligible`.
        test: the test.
        rng: the repetition's routing rng (consumed as the full plan would).
        engine: ``"analytic"`` or ``"des"``.
        memo: templates kept across calls (the tests and repetitions of one context: a
            template is keyed on what determines its graph): pass the
            same dict for the same ``ctx`` and engine (``ctx.graph_memo``).

    Raises:
        PlacementError: no GPU (as :func:`sim.plan.builder.build_plan`).
        ValueError: ``ctx`` is not eligible, or an unknown engine.
    """
    if not memo_eligible(ctx):
        raise ValueError("time_test: plans with an expert cache or an executor_mode profile need the full plan")
    if engine not in engines.ENGINES:
        raise ValueError(f"engine: unknown engine {engine!r}; accepted values: {', '.join(engines.ENGINES)}")
    scn = ctx.scn
    if scn.hardware.n_gpu < 1:
        raise PlacementError("n_gpu must be >= 1", file=scn.hardware.file, field="hardware.n_gpu")
    ctx.rng = rng
    memo = {} if memo is None else memo
    if "_host_layers" not in memo:
        memo["_host_layers"] = _host_expert_layers(ctx)
    host_layers = memo["_host_layers"]
    graphs = test_graphs(scn, test)
    outputs = output_rows(scn, test, graphs)
    router = ctx.router
    # masks: drawn as the full plan draws them; when no graph reads more than the count and the
    # count is fixed (decode, or a prompt in one-token ubatches: one token, its output or none),
    # the first graph of each (tokens, outputs) stands for all of that pair (the rng is the test's
    # own: no later draw of this test is left to depend on the ones skipped)
    matter = [_masks_matter(ctx, n, host_layers) for n, _kv, _off in graphs]
    fixed = router is None or (not any(matter) and all(
        router.fixed_count(n) is not None and (o is None or o >= n or router.fixed_count(o) is not None)
        for (n, _kv, _off), o in zip(graphs, outputs)))
    if ENABLE_BATCH_DRAWS:
        layers = ctx.moe_layers if router is not None else []
        if fixed:
            first: dict = {}
            for g, ((n, _kv, _off), o) in enumerate(zip(graphs, outputs)):
                first.setdefault((n, o), g)
            drawn = draw_masks_graphs(ctx, [graphs[g] for g in first.values()], [outputs[g] for g in first.values()])
            by_pair = dict(zip(first, drawn))
            masks: list = [by_pair[(n, o)] for (n, _kv, _off), o in zip(graphs, outputs)]
            mkeys = block_keys(masks, layers, [host_layers if m else frozenset() for m in matter], memo)
        else:
            # drawn in chunks (the same draws in the same order); each graph keeps the first block
            # of its key (blocks of one key make the same template): memory bounded by the chunk
            # and the distinct keys, not by the graphs (a prompt of 10**6 one-token ubatches)
            masks = []
            mkeys = []
            block_of: dict = {}
            for c0 in range(0, len(graphs), _DRAW_CHUNK):
                c1 = min(len(graphs), c0 + _DRAW_CHUNK)
                blocks = draw_masks_graphs(ctx, graphs[c0:c1], outputs[c0:c1])
                keys = block_keys(blocks, layers, [host_layers if m else frozenset() for m in matter[c0:c1]], memo)
                masks.extend(block_of.setdefault(k, blk) for blk, k in zip(blocks, keys))
                mkeys.extend(keys)
    else:
        masks = []
        for g, (n, _kv, off) in enumerate(graphs):
            masks.append(masks[0] if fixed and g else draw_masks(ctx, n, off, outputs[g]))
        mkeys = []
        seen = memo.setdefault("_runs", {})
        for g in range(len(graphs)):
            mkeys.append(mkeys[0] if fixed and g else mask_key(masks[g], host_layers if matter[g] else frozenset(), seen))
    # each distinct mask key named by a small int for this call's dicts (a mask key is a tuple of
    # one entry per MoE layer: hashed once per graph here, not at every lookup); the kept
    # templates (``memo``) stay keyed on the mask key itself
    kid_of: dict = {}
    kids: list[int] = []
    prev_mk = prev_kid = None
    for mk in mkeys:
        if mk is not prev_mk:
            prev_mk, prev_kid = mk, kid_of.setdefault(mk, len(kid_of))
        kids.append(prev_kid)
    base = [(n, kids[g], outputs[g]) for g, (n, _kv, _off) in enumerate(graphs)]
    remaining: dict = {}
    for b in base:
        remaining[b] = remaining.get(b, 0) + 1
    work: dict = {}          # key -> template, for the graphs of this call (key: mask key named by its int)
    full_of: dict = {}       # key -> the key of ``memo`` (the mask key itself)
    pending: dict = {}       # key -> [(graph, row)]
    res = np.zeros((len(graphs), 5))
    h2d = 0
    start_dev = 0
    built = 0
    kept_ops = memo.get("_kept_ops", 0)
    family: dict = {}        # (tokens, start device, mask key, rebuilt) -> a template of this call
    calls = graph_calls(scn, test, ctx.rep)
    for g, (n, kv, off) in enumerate(graphs):
        call = calls[g]
        kid = kids[g]
        n_out = outputs[g]
        key = (n, start_dev, kid, call, n_out)
        tpl = work.get(key)
        if tpl is None:
            full = full_of.get(key)
            if full is None:
                full = full_of[key] = (n, start_dev, mkeys[g], call, n_out)
            tpl = memo.get(full)
        if tpl is None:
            fkey = (n, start_dev, kid, call[0], n_out)
            src = family.get(fkey) if ENABLE_DERIVE else None
            if src is not None:
                tpl = derive_template(src, ctx, call)
            else:
                m = blk = masks[g]
                if not isinstance(m, dict):
                    m = {} if m is None else dict(zip(ctx.moe_layers, m))
                tpl = build_template(ctx, n, kv, off, m, start_dev, call,
                                     blk if isinstance(blk, np.ndarray) else None, n_out)
                if ENABLE_PRIME and not ENABLE_BATCH_ROWS:   # batch rows price every KV length at once
                    _prime_kv_prices(tpl, ctx, [kv_ for n_, kv_, _o in graphs[g + 1:] if n_ == n])
            built += 1
            family.setdefault(fkey, tpl)
        elif key not in work:
            family.setdefault((n, start_dev, kid, call[0], n_out), tpl)
        work[key] = tpl
        pending.setdefault(key, []).append((g, kv))   # its row made with the others' (_rows_at)
        h2d += tpl.h2d_bytes
        start_dev = tpl.end_device
        b = base[g]
        remaining[b] -= 1
        if remaining[b] == 0:
            # no later graph of this call shares the key: time its rows now, then let it go
            done = [(k, work.pop(k), pending.pop(k)) for k in [k for k in work if (k[0], k[2], k[4]) == b]]
            for fk in [fk for fk in family if (fk[0], fk[2], fk[4]) == b]:
                del family[fk]   # no later graph derives from it (memory: one template per live key)
            rows = _rows_at_many([(t, [kv_ for _g, kv_ in lst]) for _k, t, lst in done], ctx)
            done = [(k, t, list(zip([g_ for g_, _kv in lst], r))) for (k, t, lst), r in zip(done, rows)]
            _evaluate([(t, sorted({r for _g, r in lst})) for _k, t, lst in done], engine)
            for k, t, lst in done:
                for gg, r in lst:
                    res[gg] = t.results[r]
                full = full_of[k]
                if full not in memo and kept_ops + len(t.plan) <= KEEP_OPS:
                    memo[full] = t
                    kept_ops += len(t.plan)
    memo["_kept_ops"] = kept_ops
    makespan = float(res[:, 0].sum()) - ubatch_overlap_s(ctx, test, res[:, 3], res[:, 4])
    total = float(res[:, 1].sum())
    hidden = float(res[:, 2].sum())
    return TestTiming(makespan, int(h2d), exposed_from_busy(total, hidden), overlap_from_busy(total, hidden),
                      len(graphs), built)


__all__ = ["GraphTemplate", "TestTiming", "memo_eligible", "graph_key", "build_template", "derive_template",
           "time_test", "KEEP_OPS", "run_lengths", "mask_key", "block_keys", "ENABLE_BATCH_DRAWS", "ENABLE_DERIVE",
           "ENABLE_PRIME", "ENABLE_BATCH_ROWS"]
