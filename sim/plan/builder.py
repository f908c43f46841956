"""Plan builder: mirrors the ggml scheduler for one llama-bench test under one variant.

``build_plan(scenario, variant, test, rng)`` turns a model, placement and workload into the ops
of :mod:`sim.plan`. What it models (docs/DESIGN.md, "The mechanics being modelled"):

* **Graphs and ubatches.** A ``ppN`` test is cut into ubatches of ``n_ubatch`` tokens; each
  ubatch is one graph, attending to the KV cache filled so far (``-d`` depth plus earlier
  ubatches). A ``tgN`` test is N graphs of one token.
* **Splits.** Inside a graph, ops run on the backend of their weight; an op whose weight is
  host-resident runs on the GPU only when its batch is at least ``op_offload_min_batch``
  tokens (ggml-cuda's offload rule; MUL_MAT_ID counts tokens, not tokens x top-k), and then it
  heads its own split whose input (the weight) is copied H2D first. Below the threshold the
  op runs on the CPU backend (no copy; CPU time, activations cross the bus D2H and back).
  The rule reads the op's ``ne[1]``, which for the per-head Q/K norm of a layer left on the
  CPU is the head count: with 32 or more heads that norm (and Q's RoPE after it) runs on the GPU
  even at one token, a split of its own per CPU layer (:func:`offloaded_head_norms`).
* **Baseline (one graph copy).** Before a split with host inputs: host sync; for the first
  expert split of a layer, router ids readback (D2H + sync) and building the used-expert runs;
  then the copies (selective: used experts only, contiguous runs merged) and a wait; then the
  compute launch. Copy and compute never overlap.
* **Ungated weight prefetch.** A copy stream loads the next host split's *whole* weights into
  one of two staging buffers while the current split computes; the consumer waits on the copy's
  ready event; a buffer is overwritten only after its last consumer finished (free event). With
  pageable host memory each copy blocks the host thread.
* **MoE-batch gate.** In a graph with MoE ops (``MUL_MAT_ID``, on any backend), prefetch is off
  when the ubatch has fewer tokens than ``gate_min_batch``; staging stays reserved (see
  :mod:`sim.model.vram`).
* **Expert staging slots.** When tokens x top-k >= 2 x n_expert, expert splits are copied
  whole into N rotating slots, one staged split ahead whatever N (the copy feeding staged split
  k+1 is issued when the host reaches staged split k); N bounds reuse, not depth: a slot is
  refilled only after the consumer N staged splits earlier finished (free event). One slot
  cannot be refilled while it is read: with N = 1 each copy is issued at its own split, after
  the previous consumer, and nothing overlaps. A slot holds the largest expert tensor staged on
  its GPU (:func:`sim.model.vram.expert_slot_bytes`, per-layer ggml types).
* **Expert cache.** Used experts that hit the cache are not copied; misses are copied and
  inserted. At decode, hits run on the GPU and misses on the CPU (their insertion is copied in
  the background on the copy stream).
* **Event semantics.** With ``stream_tail`` (ROCm + pageable), a wait on a copy's ready event
  releases only when every copy issued so far on that copy stream has finished; pinned copies
  keep record-point semantics.
* **Pageable copies.** On CUDA a pageable H2D blocks the host thread; on ROCm
  (``h2d_pageable_host_blocking = false``, the ROCm default) it queues on its stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from itertools import compress
from typing import Sequence

import numpy as np

from sim.plan.cache import DeviceCaches, ExpertCache
from sim.model.costs import attn_keys, attn_pairs
from sim.errors import PlacementError
from sim.model.ggmlcost import (MMVQ_MAX_BATCH, graph_kernels, layer_elementwise, layer_norm_weights, mask_bytes, mask_entries,
                                pad_cells)
from sim.plan import KIND_CODE, STREAM_CODE, OpKind, Plan, Stream
from sim.model.routing import Router, make_router
from sim.model.specs import BenchTest, Scenario, Tensor, Variant
from sim.model.vram import (VramBreakdown, account, cache_device, fit_n_cpu_moe, host_flags, layer_devices,
                            output_device)

ACT_BYTES = 4  # f32 activations
_HOST = Stream.HOST
_ISSUE = OpKind.ISSUE
_ATTN = OpKind.ATTN
#: GPU streams -> the stream name that keys ``Emitter.last_gpu`` (no Enum ``.value`` reads)
_GPU_STREAM_KEY = {Stream.COMPUTE: Stream.COMPUTE.value, Stream.COPY: Stream.COPY.value}
_KIND_VALUE = {k: k.value for k in OpKind}
ID_BYTES = 4   # int32 router ids


# ----------------------------------------------------------------------------------------
# graph items: the weight ops of one graph, before they are cut into splits
# ----------------------------------------------------------------------------------------


@dataclass
class Item:
    """One compute op of a graph (before split assignment).

    Attributes:
        kind: GEMM, MOE or ATTN.
        name: label: the GGUF tensor name for an op on one weight (``blk.3.ffn_up_exps.weight``),
            ``blk.N.attn_qkv`` / ``blk.N.ffn_gate_up_shexp`` for fused ones, ``blk.N.attn``.
        layer: block index.
        shape: cost-model shape (see :class:`sim.plan.OpKind`).
        weight_bytes: bytes of the weight read by the op (MOE: used experts only).
        tensors: weight tensors read (for host-resident ones: what must be copied).
        host: the weight is host-resident.
        cpu: the op runs on the CPU backend.
        device: GPU of the op (-1 for CPU ops).
    """

    kind: OpKind
    name: str
    layer: int
    shape: tuple
    weight_bytes: int
    tensors: tuple[Tensor, ...] = ()
    host: bool = False
    cpu: bool = False
    device: int = 0
    expert: bool = False


@dataclass
class Split:
    """A run of items on one backend. ``host_input`` is the host weight the split copies."""

    items: list[Item]
    device: int              # GPU index, or -1 for the CPU backend
    host_input: Item | None  # the offloaded op heading the split, if any

    @property
    def cpu(self) -> bool:
        return self.device < 0


@dataclass
class BuildContext:
    """Per-test state shared by the graphs of one plan (router, cache, VRAM)."""

    scn: Scenario
    variant: Variant
    router: Router | None
    cache: ExpertCache | DeviceCaches | None
    rng: np.random.Generator
    vram: list[VramBreakdown]
    n_cpu_moe: int
    host_ids: frozenset   # id() of the model's host-resident tensors (a tied head shares its name)
    layer_dev: list[int]
    stats: dict = field(default_factory=dict)
    #: per position of ``scn.model.tensors``, whether it is host-resident (what ``host_ids`` holds
    #: the ids of: :func:`sim.model.vram.host_flags`), or None when not given
    host_flags: tuple | None = None
    #: llama-bench repetition being built (0 = the first timed one), None when not one of a
    #: run of repetitions (:func:`graph_calls`'s capture share)
    rep: int | None = None

    @cached_property
    def output_dev(self) -> int:
        """GPU of the output layer (:func:`sim.model.vram.output_device`)."""
        return output_device(self.scn.model, self.scn.placement, self.scn.hardware.n_gpu)

    @cached_property
    def ffn_cpu(self) -> list[tuple[frozenset, str | None, int, float, tuple]]:
        """Per layer, :func:`ffn_cpu_nodes` under this placement (llama.cpp's scheduler: a
        profile with a ``[ggml]`` section; the CuPy executor's plans have none)."""
        model = self.scn.model
        if self.scn.hardware.ggml is None:
            return [_NO_CPU_NODES] * model.n_layer
        return [ffn_cpu_nodes(model, self.tensor_by_name, self.host_ids, i) for i in range(model.n_layer)]

    @cached_property
    def cpu_threads(self) -> int | None:
        """Threads of the CPU backend: the profile's ``[measured] host_cpus`` (the machine whose
        CPU figures price the CPU ops, measured with all its threads, as llama-bench's default
        ``-t``), None when the profile does not say."""
        raw = (getattr(self.scn.hardware, "measured", None) or {}).get("host_cpus")
        try:
            n = int(str(raw))
        except (TypeError, ValueError):
            return None
        return n if n > 0 else None

    @cached_property
    def ffn_cpu_off_gpu(self) -> list[tuple[int, float]]:
        """Per layer, the ``(nodes, elements per token)`` of :attr:`ffn_cpu` that leave the
        layer's GPU elementwise kernels below the op-offload batch (:func:`attn_item_shape`).
        With an expert cache none of a MoE layer's do: the experts that hit run on the GPU with
        their bias adds and GLU there (a decode whose experts all hit is priced as fully
        resident), the misses' nodes are priced with them on the CPU (:func:`_emit_cpu_split`)."""
        model = self.scn.model
        cached = self.cache is not None and model.moe is not None
        return [(0, 0.0) if cached and model.is_moe_layer(i) else f[2:4] for i, f in enumerate(self.ffn_cpu)]

    @cached_property
    def attn_layer_sig(self) -> list[tuple]:
        """Per layer, everything of the layer that :func:`attn_item_shape` reads (window,
        linear or full attention, elementwise kernels, on a GPU or not, norm weights, the FFN's
        weightless nodes on the CPU): layers with equal signatures have equal attention shapes
        at every (tokens, KV length)."""
        parts = layer_attn_parts(self.scn.model)
        return [(w, full, ew, d >= 0, nw, f) for (w, full, ew, nw), d, f in zip(parts, self.layer_dev, self.ffn_cpu_off_gpu)]

    @cached_property
    def attn_sig_ids(self) -> list[int]:
        """Per layer, a small int naming its :attr:`attn_layer_sig` (equal ids iff equal
        signatures), numbered in order of first appearance."""
        ids: dict = {}
        return [ids.setdefault(sig, len(ids)) for sig in self.attn_layer_sig]

    def attn_shape(self, layer: int, n_tokens: int, kv_len: int) -> tuple:
        """:func:`attn_item_shape`, computed once per layer signature (:attr:`attn_layer_sig`),
        tokens and KV length."""
        cache = self._attn_shapes
        key = (self.attn_layer_sig[layer], n_tokens, kv_len)
        sh = cache.get(key)
        if sh is None:
            if len(cache) > 65536:
                cache.clear()
            sh = cache[key] = attn_item_shape(self, layer, n_tokens, kv_len)
        return sh

    @cached_property
    def _attn_shapes(self) -> dict:
        return {}

    @cached_property
    def price_cache(self) -> dict:
        """Scratch prices kept by :mod:`sim.plan.memo` for this context (its hardware is fixed):
        ``(kind, nbytes, shape, pinned, tag) -> seconds``."""
        return {}

    @cached_property
    def graph_memo(self) -> dict:
        """Per engine, the graph templates :func:`sim.plan.memo.time_test` keeps for this context
        (shared by every test and repetition timed with it: a template is keyed on what
        determines its graph, whatever the test)."""
        return {}

    @cached_property
    def item_cache(self) -> dict:
        """Items and splits of the graphs built so far (:func:`graph_splits`): ``(tokens, used
        experts per MoE layer) -> (items, kv_len, attention item positions, split bounds)``."""
        return {}

    @cached_property
    def column_cache(self) -> dict:
        """What :mod:`sim.plan.fastgraph` derives once per context (the residency and devices of
        the model's items)."""
        return {}

    @cached_property
    def moe_layers(self) -> list[int]:
        """The model's MoE layers, in order."""
        model = self.scn.model
        return [i for i in range(model.n_layer) if model.is_moe_layer(i)]

    @cached_property
    def tensor_by_name(self) -> dict[str, Tensor]:
        """GGUF name -> tensor of the model's blocks and ``token_embd`` (built once per
        context; the output head is ``model.output_tensor``)."""
        return {t.name: t for t in self.scn.model.tensors if not t.duplicate}


#: most models a per-model store (:func:`per_model`) holds before it is emptied
PER_MODEL_MAX = 8


def per_model(store: dict, model, make):
    """``make(model)``, computed once per model and kept in ``store`` (keyed by ``id(model)``,
    holding the model so that the id stays its own; emptied when it holds
    :data:`PER_MODEL_MAX` models). The value is shared: not to be modified."""
    got = store.get(id(model))
    if got is not None and got[0] is model:
        return got[1]
    value = make(model)
    if len(store) >= PER_MODEL_MAX:
        store.clear()
    store[id(model)] = (model, value)
    return value


#: :func:`layer_attn_parts` per model (:func:`per_model`)
_ATTN_PARTS: dict[int, tuple] = {}
#: :func:`bias_tensors` per model (:func:`per_model`)
_BIASES: dict[int, dict] = {}


def bias_tensors(model) -> dict[str, Tensor]:
    """The bias of each weight that has one, by the weight's GGUF name
    (``blk.3.ffn_gate_exps.weight`` -> the tensor ``blk.3.ffn_gate_exps.bias``; gpt-oss's experts
    and attention), computed once per model (not to be modified)."""
    def make(m):
        names = {t.name: t for t in m.tensors}
        return {n[:-5] + ".weight": t for n, t in names.items() if n.endswith(".bias") and n[:-5] + ".weight" in names}
    return per_model(_BIASES, model, make)


def ffn_cpu_nodes(model, tens: dict, host_ids: frozenset, layer: int
                  ) -> tuple[frozenset, str | None, int, float, tuple]:
    """The weightless nodes of block ``layer``'s FFN that ggml's scheduler keeps on the CPU when
    the FFN's host-resident weight ops run there (below the op-offload batch), as ``(weights
    whose bias add runs beside them, the weight whose op the GLU runs before (the down
    projection) or None, nodes, f32 elements read and written per token, per weight)``, the
    last a tuple of ``(weight name, nodes, elements per token, SWIGLU_OAI row length or 0, GLU
    rows per token (top-k))`` for each weight with nodes beside it (what :func:`_emit_cpu_split`
    prices with that weight's op; the nodes and elements are their sums):

    * the bias add of a host-resident matmul whose bias is host-resident too (gpt-oss's
      experts: llama.cpp's ``build_moe_ffn`` adds each expert's bias with ``ggml_add_id`` right
      after its ``ggml_mul_mat_id``; the bias is a CPU weight of the op: ``2 · top-k · n_out``
      elements per token);
    * the GLU, when the down projection and the gate projection (or the fused gate/up) are
      host-resident: ``build_moe_ffn`` / ``build_ffn`` compute up, then gate, then the GLU, and
      ``ggml_backend_sched_split_graph``'s expansion passes give a weightless op the GPU of the
      GPU op before it ("expand gpu down", which the CPU's gate op interrupts) or after it
      ("expand gpu up", which the CPU's down op interrupts), else the backend of the op before
      it (the gate's CPU): ``3 · top-k · n_ff_exp`` elements per token (dense FFN: ``3 · n_ff``).
      With the down projection on the GPU the GLU runs on the GPU.

    So a host-expert decode split computes four nodes on Qwen3 (three ``MUL_MAT_ID``, the GLU)
    and seven on gpt-oss (and three ``ADD_ID``); ``calibrate/llamacpp/grids/h200-nodetime.toml``
    lists them in the graph (the ``node-time`` patch). The CPU split prices them beside its
    matmuls (:func:`_emit_cpu_split`, ``elementwise_s("cpu", ...)``: the profile's per-op CPU
    cost each) and the layer's GPU elementwise kernels (:func:`sim.model.ggmlcost.layer_elementwise`)
    lose them (:func:`attn_item_shape`). A block left on the CPU by ``-ngl`` prices every
    elementwise op with its attention instead. ``tens``: the model's tensors by GGUF name
    (:attr:`BuildContext.tensor_by_name`); ``host_ids``: ``id()`` of the host-resident ones."""
    ffn = _ffn_weights(model, tens)[layer]
    if ffn is None:
        return _NO_CPU_NODES
    weights, down, gate, topk, ff = ffn
    glu = down.name if id(down) in host_ids and gate is not None and id(gate) in host_ids else None
    oai = model.arch in GLU_OAI_ARCHS
    biased, per = [], []
    for w, b in weights:
        k, e, row = 0, 0.0, 0
        if id(w) in host_ids and b is not None and id(b) in host_ids:
            biased.append(w.name)
            k, e = 1, 2.0 * topk * w.n_out       # ADD_ID: the matmul's output in, the sum out
        if w.name == glu:
            k, e = k + 1, e + 3.0 * topk * ff    # GLU: gate and up in, the product out
            row = ff if oai else 0               # SWIGLU_OAI's elements per row (top-k rows a token)
        if k:
            per.append((w.name, k, e, row, topk))
    if not per:
        return _NO_CPU_NODES
    return (frozenset(biased), glu, sum(p[1] for p in per), sum(p[2] for p in per), tuple(per))


_NO_CPU_NODES: tuple = (frozenset(), None, 0, 0.0, ())
#: architectures whose FFN gates with ``SWIGLU_OAI`` (llama.cpp's ``llm_build_openai_moe_iswa``:
#: ``build_moe_ffn(..., LLM_FFN_SWIGLU_OAI_MOE, ...)``; the others' GLU is a ``SWIGLU`` or
#: ``GEGLU``, priced as a plain node)
GLU_OAI_ARCHS = frozenset({"gpt-oss"})


def oai_elems_per_thread(row_elems: int, rows: int, threads: int | None) -> int:
    """Output elements of a ``SWIGLU_OAI`` on its busiest CPU thread: ggml-cpu's GLU gives each
    of its ``threads`` a contiguous share of the ``rows`` (``ggml_compute_forward_swiglu_oai``:
    ``dr = (nr + nth - 1) / nth``), each row ``row_elems`` long. ``threads`` None (a profile
    without ``[measured] host_cpus``): one row per thread."""
    if row_elems <= 0 or rows <= 0:
        return 0
    per = 1 if not threads else -(-rows // threads)
    return per * row_elems


#: :func:`_ffn_weights` per model (:func:`per_model`)
_FFN_WEIGHTS: dict[int, list] = {}


def _ffn_weights(model, tens: dict) -> list:
    """Per layer of ``model``, what :func:`ffn_cpu_nodes` reads, looked up once per model: ``((weight,
    its bias or None) for the gate/up and down projections, the down projection, the GLU's
    producer (the fused gate/up, else the gate), top-k (1 for a dense FFN), the GLU's width)``,
    or None for a layer without the tensors."""
    def make(m):
        by_name = bias_tensors(m)
        out = []
        for i in range(m.n_layer):
            moe = m.moe is not None and m.is_moe_layer(i)
            names = ("ffn_gate_up_exps", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps") if moe else \
                ("ffn_gate", "ffn_up", "ffn_down")
            ts = {n: tens.get(f"blk.{i}.{n}.weight") for n in names}
            down = ts[names[-1]]
            if down is None:
                out.append(None)
                continue
            gate = next((ts[n] for n in names[:2] if ts[n] is not None), None)
            weights = tuple((t, by_name.get(t.name)) for t in ts.values() if t is not None)
            out.append((weights, down, gate, m.moe.n_expert_used if moe else 1,
                        m.moe.n_ff_exp if moe else m.n_ff))
        return out
    return per_model(_FFN_WEIGHTS, model, make)


def layer_attn_parts(model) -> list[tuple]:
    """Per layer of ``model``, the part of :attr:`BuildContext.attn_layer_sig` that depends on
    the model alone: ``(window, full attention, elementwise kernels and elements, norm
    weights)`` (:meth:`~sim.model.specs.ModelSpec.attn_window`,
    :meth:`~sim.model.specs.ModelSpec.is_full_attn_layer`, :func:`sim.model.ggmlcost.layer_elementwise`,
    :func:`sim.model.ggmlcost.layer_norm_weights`), computed once per model (a list of
    ``n_layer`` tuples, not to be modified)."""
    return per_model(_ATTN_PARTS, model, lambda m: [
        (m.attn_window(i), m.is_full_attn_layer(i), layer_elementwise(m, i), layer_norm_weights(m, i))
        for i in range(m.n_layer)])


def make_context(scn: Scenario, variant: Variant, rng: np.random.Generator) -> BuildContext:
    """Resolve the placement (``fit_experts``), VRAM and the router/cache for a variant.

    Raises:
        PlacementError: the placement does not fit.
    """
    model = scn.model
    placement = scn.placement
    if placement.fit_experts and model.moe is not None:
        n = fit_n_cpu_moe(scn, variant)
        placement = replace(placement, n_cpu_moe=n)
    devs = layer_devices(model, placement, scn.hardware.n_gpu)
    vram = account(scn, variant, placement, layer_dev=devs)
    scn2 = scn.with_(placement=placement)
    # the scenario-seeded generator draws skewed routing's per-layer permutations; the other kinds
    # never read it (not made)
    router = (make_router(scn.routing, model, np.random.default_rng(scn.seed) if scn.routing.kind == "skewed" else None)
              if model.moe else None)
    cache = None
    if variant.expert_cache != "none" and model.moe is not None:
        if len(vram) > 1:  # each GPU's cache serves the layers it computes (sim.model.vram.cache_device)
            layers = [i for i in range(model.n_layer) if model.is_moe_layer(i)]
            cache = DeviceCaches([v.cache_experts for v in vram], {i: cache_device(devs, i) for i in layers},
                                 variant.cache_policy)
        else:
            cache = ExpertCache(sum(v.cache_experts for v in vram), variant.cache_policy)
    flags = host_flags(model, placement)
    host = frozenset(map(id, compress(model.tensors, flags)))
    return BuildContext(scn2, variant, router, cache, rng, vram, placement.n_cpu_moe, host, devs, host_flags=flags)


# ----------------------------------------------------------------------------------------
# items of one graph
# ----------------------------------------------------------------------------------------


def attn_item_shape(ctx: BuildContext, layer: int, n_tokens: int, kv_len: int) -> tuple:
    """The cost-model shape of layer ``layer``'s attention item for a ubatch of ``n_tokens`` on
    ``kv_len`` cached tokens (see :class:`sim.plan.OpKind` ``ATTN``; elements 11-13 are the KV
    bytes copied in and out for a layer moved to the GPU, and its extra splits). The only part
    of a graph's items that depends on ``kv_len``."""
    scn, model = ctx.scn, ctx.scn.model
    pl = scn.placement
    i = layer
    win = model.attn_window(i)
    linear = not model.is_full_attn_layer(i)
    ew_kernels, ew_elems = layer_elementwise(model, i)
    on_gpu = ctx.layer_dev[i] >= 0
    cpu_k, cpu_e = ctx.ffn_cpu_off_gpu[i]
    if cpu_k and on_gpu and n_tokens < pl.op_offload_min_batch:
        # the FFN's weightless nodes run on the CPU beside its host matmuls (ffn_cpu_nodes)
        ew_kernels, ew_elems = max(ew_kernels - cpu_k, 0), max(ew_elems - cpu_e, 0.0)
    # a layer -ngl left on the CPU, at a batch the op-offload rule offloads: ggml's scheduler
    # runs its attention on the GPU next to the offloaded matmuls, copying the layer's KV
    # cache view in and the new K/V back to the CPU cache (SET_ROWS stays on the CPU), one
    # split per weight input (GGML_SCHED_DEBUG of Gemma-3 -ngl 31 pp512,
    # data/llamacpp/h200-20261201-kernels/diag)
    moved = not on_gpu and n_tokens >= pl.op_offload_min_batch and not linear
    kv_in = kv_out = extra_splits = 0
    if moved:
        keys = pad_cells(attn_keys(n_tokens, kv_len, win))
        kvd = model.n_head_kv * model.head_dim
        kv_in = int(2 * keys * kvd * model.kv_bytes_per_elem)
        kv_out = int(2 * n_tokens * kvd * 4)
        extra_splits = layer_norm_weights(model, i) + 4  # q/k/v apart, the CPU KV store, attention
    return (n_tokens, kv_len, model.n_head, model.n_head_kv, model.head_dim, win, int(linear),
            model.linear_state_dim, int(pl.flash_attn), ew_kernels, ew_elems, kv_in, kv_out, extra_splits)


def _output_layer(ctx: BuildContext, n_tokens: int, n_outputs: int | None) -> int:
    """The MoE layer whose mask is that of the graph's output rows (:func:`output_rows`), -1
    when none is (every row an output, ``n_outputs`` None, or that block without experts)."""
    if n_outputs is None or n_outputs >= n_tokens:
        return -1
    last = ctx.scn.model.output_rows_layer
    return last if last >= 0 and ctx.scn.model.is_moe_layer(last) else -1


def draw_masks(ctx: BuildContext, n_tokens: int, token_offset: int,
               n_outputs: int | None = None) -> dict[int, np.ndarray]:
    """The used-expert masks of one graph, layer -> bool (E,), drawn from ``ctx.rng`` in the
    order :func:`graph_items` draws them (MoE layers in layer order); ``{}`` without experts.
    ``n_outputs``: the graph's output rows (:func:`output_rows`): the block llama.cpp runs on
    them only gets their experts (:meth:`sim.model.routing.Router.output_mask`, no draw)."""
    model = ctx.scn.model
    if model.moe is None or ctx.router is None:
        return {}
    layers = ctx.moe_layers
    out = dict(zip(layers, ctx.router.used_masks(layers, n_tokens, ctx.rng, token_offset)))
    last = _output_layer(ctx, n_tokens, n_outputs)
    if last >= 0:
        out[last] = ctx.router.output_mask(last, out[last], n_tokens, n_outputs, token_offset)
    return out


def draw_masks_graphs(ctx: BuildContext, graphs: Sequence[tuple[int, int, int]],
                      outputs: Sequence[int | None] | None = None) -> list[np.ndarray | None]:
    """The used-expert masks of several graphs ``[(n_tokens, kv_len, token_offset), ...]``
    in order, each an (L, E) bool array over ``ctx.moe_layers`` (row ``k``: layer
    ``ctx.moe_layers[k]``): the draws :func:`draw_masks` makes graph after graph, from
    ``ctx.rng`` (:meth:`sim.model.routing.Router.used_masks_graphs`), with ``outputs`` (one
    ``n_outputs`` per graph, as :func:`draw_masks` takes it; None: every row an output); None
    per graph without experts."""
    model = ctx.scn.model
    if model.moe is None or ctx.router is None:
        return [None] * len(graphs)
    out = ctx.router.used_masks_graphs(ctx.moe_layers, [(n, off) for n, _kv, off in graphs], ctx.rng)
    if outputs is not None:
        row = len(ctx.moe_layers) - 1
        for g, ((n, _kv, off), n_out) in enumerate(zip(graphs, outputs)):
            last = _output_layer(ctx, n, n_out)
            if last >= 0:
                blk = out[g].copy()
                blk[row] = ctx.router.output_mask(last, blk[row], n, n_out, off)
                out[g] = blk
    return out


#: :meth:`Emitter.launch_items` (and :meth:`Emitter.h2d_pieces`) append their ops to the plan's
#: columns in one loop; False makes them call :meth:`Emitter.launch` / :meth:`Emitter.h2d` per op
#: (the reference path the tests compare them with)
ENABLE_BULK = True

#: :meth:`Emitter.launch_items` and :meth:`Emitter.h2d_pieces` append a run of fewer launches or
#: copies than this op by op (:meth:`Emitter.launch`, :meth:`Emitter.h2d`): on a few ops, a column
#: at a time costs more than it saves
BULK_MIN = 6

#: :func:`build_graph` reuses the items and splits of an earlier graph of its context with the
#: same tokens and used-expert counts (:func:`graph_splits`); False calls :func:`graph_items` and
#: :func:`cut_splits` for every graph (the reference path the tests compare it with)
ITEM_MEMO = True


def graph_splits(ctx: BuildContext, n_tokens: int, kv_len: int, token_offset: int,
                 masks: dict[int, np.ndarray] | None = None,
                 n_outputs: int | None = None) -> tuple[list[Item], list[Split]]:
    """``(items, cut_splits(items))`` of one graph, with ``items`` = :func:`graph_items`, both
    built once per context for each ``(tokens, used experts per MoE layer)`` and reused: a
    graph's items depend on its KV length only through the attention items' shapes
    (:func:`attn_item_shape`), re-made for ``kv_len``, and on the masks only through the count of
    used experts (the masks are recorded in ``ctx.stats["used_masks"]`` as :func:`graph_items`
    does); the cut depends on the items' backends only. ``masks`` None draws them first
    (:func:`draw_masks`: the draws :func:`graph_items` would make). ``n_outputs``: the graph's
    output rows (:func:`graph_items`). Items are shared between graphs: not to be modified."""
    if not ITEM_MEMO:
        items = graph_items(ctx, n_tokens, kv_len, token_offset, masks, n_outputs)
        return items, cut_splits(items)
    if masks is None:
        masks = draw_masks(ctx, n_tokens, token_offset, n_outputs)
    key = (n_tokens, n_outputs, tuple([int(np.count_nonzero(m)) for m in masks.values()]))
    cache = ctx.item_cache
    got = cache.get(key)
    if got is None:
        if len(cache) > 4096:
            cache.clear()
        items = graph_items(ctx, n_tokens, kv_len, token_offset, masks, n_outputs)
        splits = cut_splits(items)
        bounds, a = [], 0
        for sp in splits:
            bounds.append((a, a + len(sp.items), sp.device, sp.host_input is not None))
            a += len(sp.items)
        attn = [j for j, it in enumerate(items) if it.kind is OpKind.ATTN]
        cache[key] = (items, kv_len, attn, bounds)
        return items, splits
    items, kv0, attn, bounds = got
    ctx.stats.setdefault("used_masks", {}).update(masks)
    items = list(items)
    if kv_len != kv0:
        shape_at = ctx.attn_shape
        for j in attn:
            it = items[j]
            items[j] = Item(it.kind, it.name, it.layer, shape_at(it.layer, n_tokens, kv_len), it.weight_bytes,
                            it.tensors, it.host, it.cpu, it.device, it.expert)
    return items, [Split(items[a:b], dev, items[a] if head else None) for a, b, dev, head in bounds]


#: the per-head norms whose ``MUL`` the op-offload rule looks at, and the head count that is
#: that op's ``ne[1]``: ``(tensor suffix, ModelSpec attribute)``
HEAD_NORMS = (("attn_q_norm", "n_head"), ("attn_k_norm", "n_head_kv"))


def offloaded_head_norms(ctx: BuildContext, layer: int, n_tokens: int) -> list[tuple[Tensor, int]]:
    """The per-head norm weights of layer ``layer`` whose ``MUL`` ggml's scheduler runs on the
    GPU although the layer is left on the CPU and the batch is below the op-offload one, each
    with its head count: ``[(tensor, heads), ...]``.

    The rule (``ggml_backend_sched``'s op offload, CUDA's ``offload_op``): an op on a host
    weight goes to the GPU when its batch, ``op->ne[1]``, is at least ``op_offload_min_batch``.
    For the norm of Q reshaped to ``(head_dim, n_head, n_tokens)`` that ``ne[1]`` is the head
    count, not the tokens: at one token, Gemma-3-27B's Q norm (32 heads) runs on the GPU, with
    Q's ``ROPE`` and ``SCALE`` after it, and Q comes back for the CPU's attention; its K norm (16
    KV heads) stays on the CPU. Seen in ggml's split assignment (``GGML_SCHED_DEBUG=2``) of a
    Gemma ``-ngl 31`` decode, ``data/llamacpp/h200-20261204-sched``: two splits per CPU layer.
    Empty at and above the op-offload batch (the whole layer is offloaded then), for a layer on
    a GPU, and for a model without those norms."""
    pl, model = ctx.scn.placement, ctx.scn.model
    lo = pl.op_offload_min_batch
    if n_tokens >= lo or ctx.layer_dev[layer] >= 0:
        return []
    tens = ctx.tensor_by_name
    out = []
    for suffix, attr in HEAD_NORMS:
        t = tens.get(f"blk.{layer}.{suffix}.weight")
        heads = getattr(model, attr)
        if t is not None and heads >= lo and id(t) in ctx.host_ids:
            out.append((t, heads))
    return out


def graph_items(ctx: BuildContext, n_tokens: int, kv_len: int, token_offset: int,
                masks: dict[int, np.ndarray] | None = None, n_outputs: int | None = None) -> list[Item]:
    """The compute ops of one graph of ``n_tokens`` on ``kv_len`` cached tokens, in order.

    ``masks``: used-expert masks drawn beforehand (:func:`draw_masks`, with the same
    ``n_outputs``); None draws them here from ``ctx.rng``. ``n_outputs``: the graph's output
    rows (:func:`output_rows`): the output head computes that many rows (none: no head) and the
    block llama.cpp runs on the output rows only (:attr:`sim.model.specs.ModelSpec.output_rows_layer`)
    its FFN on them (none: no FFN items for it); None: the FFN on every token, the head on one
    row (the CuPy executor's plans)."""
    scn, model = ctx.scn, ctx.scn.model
    pl = scn.placement
    tens = ctx.tensor_by_name
    items: list[Item] = []
    out_layer = model.output_rows_layer if n_outputs is not None else -1
    head_rows = 1 if n_outputs is None else n_outputs

    def weight_item(kind, name, layer, shape, tensors, weight_bytes=None, expert=False):
        if shape[0] == 0:
            return  # llama.cpp skips an op of no rows (ggml_is_empty)
        host = any(id(t) in ctx.host_ids for t in tensors)
        dev = ctx.layer_dev[layer] if layer >= 0 else ctx.output_dev
        wb = sum(t.nbytes for t in tensors) if weight_bytes is None else weight_bytes
        # ggml-cuda's offload rule looks at the op's own batch (ne[1] of MUL_MAT, tokens of
        # MUL_MAT_ID): the output head computes one row per graph
        cpu = host and not (shape[0] >= pl.op_offload_min_batch)
        if kind is OpKind.GEMM:
            # the ggml ops the fused op stands for: (ggml type, n_out, n_in, bytes) per weight
            shape = (*shape, tuple((t.ggml_type, t.n_out, t.n_in, t.bytes_per_mat) for t in tensors))
        else:
            shape = (*shape, tensors[0].ggml_type)
        items.append(Item(kind, name, layer, shape, wb, tuple(tensors), host, cpu,
                          -1 if cpu else max(dev, 0), expert))

    d = model.d_model
    for i in range(model.n_layer):
        b = f"blk.{i}."
        q, k, v, o = (tens[b + n + ".weight"] for n in ("attn_q", "attn_k", "attn_v", "attn_output"))
        # q/k/v projections: one GEMM per tensor group residency (fused when all resident)
        weight_item(OpKind.GEMM, b + "attn_qkv", i, (n_tokens, q.n_out + k.n_out + v.n_out, d), (q, k, v))
        # a CPU layer's per-head norm the op-offload rule sends to the GPU (offloaded_head_norms):
        # a split of its own that copies the norm weight, priced as a matmul of head_dim·heads
        # outputs on one input (the MUL, and the ROPE / SCALE after it, are a few small kernels)
        for t, heads in offloaded_head_norms(ctx, i, n_tokens):
            n_out = t.n_in * heads
            items.append(Item(OpKind.GEMM, t.name, i, (n_tokens, n_out, 1, ((t.ggml_type, n_out, 1, t.nbytes),)),
                              t.nbytes, (t,), True, False, 0))
        # attention core: KV cache lives with the layer; not-offloaded layers attend on the CPU
        # (a layer left on the CPU at an offloaded batch runs it on the GPU: attn_item_shape)
        on_gpu = ctx.layer_dev[i] >= 0
        moved = not on_gpu and n_tokens >= pl.op_offload_min_batch and model.is_full_attn_layer(i)
        shape = ctx.attn_shape(i, n_tokens, kv_len)
        items.append(Item(OpKind.ATTN, b + "attn", i, shape, 0, (), False, not (on_gpu or moved),
                          ctx.layer_dev[i] if on_gpu else 0 if moved else -1))
        weight_item(OpKind.GEMM, o.name, i, (n_tokens, o.n_out, o.n_in), (o,))
        # the FFN's rows: the output rows in the block llama.cpp runs on them only
        rows = n_outputs if i == out_layer else n_tokens
        if model.is_moe_layer(i):
            m = model.moe
            assert m is not None and ctx.router is not None
            r = tens[b + "ffn_gate_inp.weight"]
            weight_item(OpKind.GEMM, r.name, i, (rows, m.n_expert, d), (r,))
            if masks is not None:
                mask = masks[i]
            else:
                mask = ctx.router.used_mask(i, n_tokens, ctx.rng, token_offset)
                if i == out_layer:
                    mask = ctx.router.output_mask(i, mask, n_tokens, rows, token_offset)
            n_used = int(mask.sum())
            ctx.stats.setdefault("used_masks", {})[i] = mask
            names = ["ffn_gate_up_exps"] if m.fused_gate_up else ["ffn_gate_exps", "ffn_up_exps"]
            names.append("ffn_down_exps")
            for nm in names:
                t = tens[b + nm + ".weight"]
                weight_item(OpKind.MOE, t.name, i, (rows, t.n_out, t.n_in, n_used, m.n_expert_used),
                            (t,), weight_bytes=n_used * t.bytes_per_mat, expert=True)
            if m.n_expert_shared:
                g_, u_, dn = (tens[b + n + ".weight"] for n in ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"))
                weight_item(OpKind.GEMM, b + "ffn_gate_up_shexp", i, (rows, g_.n_out + u_.n_out, d), (g_, u_))
                weight_item(OpKind.GEMM, dn.name, i, (rows, dn.n_out, dn.n_in), (dn,))
        else:
            g_, u_, dn = (tens[b + n + ".weight"] for n in ("ffn_gate", "ffn_up", "ffn_down"))
            # gate and up are separate ops in ggml: each host-resident one heads its own split
            weight_item(OpKind.GEMM, g_.name, i, (rows, g_.n_out, d), (g_,))
            weight_item(OpKind.GEMM, u_.name, i, (rows, u_.n_out, d), (u_,))
            weight_item(OpKind.GEMM, dn.name, i, (rows, dn.n_out, dn.n_in), (dn,))
    out = model.output_tensor
    # llama-bench's graphs compute the logits of their output rows only: a prompt's last token,
    # in the ubatch that ends its llama_decode call; a decode graph's one token
    weight_item(OpKind.GEMM, out.name, -1, (head_rows, out.n_out, out.n_in), (out,))
    return items


def cut_splits(items: Sequence[Item]) -> list[Split]:
    """Cut items into splits as ``ggml_backend_sched`` does: a new split when the backend
    changes, and at every GPU op whose weight is host-resident (it heads its own split)."""
    splits: list[Split] = []
    for it in items:
        dev = -1 if it.cpu else it.device
        offloaded = it.host and not it.cpu
        if splits and splits[-1].device == dev and not offloaded:
            splits[-1].items.append(it)
        else:
            splits.append(Split([it], dev, it if offloaded else None))
    return splits


# ----------------------------------------------------------------------------------------
# emission
# ----------------------------------------------------------------------------------------


class Emitter:
    """Appends ops to a plan while tracking host and stream state."""

    def __init__(self, plan: Plan, ctx: BuildContext):
        self.plan = plan
        self.ctx = ctx
        self.pinned = ctx.scn.placement.pinned
        self.host_pending: list[int] = []   # ops the next host op must wait for (CPU backend)
        self.last_gpu: dict[tuple[str, int], int] = {}
        self.graph = 0
        self.split = 0
        self.layer = -1
        self.token_offset = 0
        self.cache_split: dict[int, tuple[int, int]] = {}
        #: CUDA kernels the expert-cache hits of the graph being built launched (a host-resident
        #: expert op that :func:`sim.model.ggmlcost.graph_kernels` counted as CPU work)
        self.hit_kernels = 0
        self.last_host = -1                  # the host thread's last op
        self.fill_of: dict[int, int] = {}    # layer -> last background cache-fill copy
        self.fill_pending = False
        #: GPU holding the activations before this plan's first compute op (a graph built on
        #: its own by sim.plan.memo starts where the previous graph left them)
        self.act_device_default = 0
        #: the graph is one llama.cpp builds anew (not reused: a prompt of several ubatches,
        #: whose KV length changes the graph from one ubatch to the next)
        self.rebuilt = False
        #: tokens of the llama_decode call this graph opens (0: not the first ubatch of a call)
        self.call_tokens = 0
        #: share of a CUDA-graph capture this graph pays (1 / llama-bench's repetitions on a
        #: test's first reused graph, else 0: :func:`graph_calls`)
        self.capture_share = 0.0
        #: id of the last graph's host-overhead op (``graph_overhead``: the only op that reads
        #: ``call_tokens`` and ``capture_share``), -1 without one
        self.overhead_op = -1
        #: ``(op id, role, layer or flag)`` of the ops whose cost depends on the graph's KV
        #: length: ``"attn"`` (an attention and its launch), ``"cpu_attn"`` (attention on the
        #: CPU backend), ``"kq_mask"`` (the mask fill; flag: the masks are copied to a GPU)
        self.kv_ops: list[tuple[int, str, int]] = []
        #: ``(class of each op, an op of each class)`` of ops with equal prices, when the graph
        #: was built by :func:`sim.plan.fastgraph.build_graph_columns` (:func:`sim.model.costs.class_durations`)
        self.price_classes: tuple[np.ndarray, np.ndarray] | None = None
        #: bytes the graph copies host→device, when it was built by
        #: :func:`sim.plan.fastgraph.build_graph_columns` (what :meth:`sim.plan.Plan.h2d_bytes`
        #: gives for a one-graph plan), else None
        self.column_h2d_bytes: int | None = None

    # -- primitives ------------------------------------------------------------------
    # (op and launch append to the plan's columns directly: they run once or twice per op)
    def op(self, kind, stream, device, name, deps=(), nbytes=0, shape=(), layer=None, slot=-1, slot_bytes=0,
           pinned=True, tag="") -> int:
        """Append an op of the current graph, split and layer (``layer`` overrides it); returns
        its id."""
        oid = self.plan.append(kind, stream, device, name, deps, nbytes, shape, self.layer if layer is None else layer,
                               self.split, self.graph, slot, slot_bytes, pinned, tag)
        sv = _GPU_STREAM_KEY.get(stream)
        if sv is not None:
            self.last_gpu[(sv, device)] = oid
        return oid

    def host(self, kind, name, deps=(), **kw) -> int:
        """Append an op on the host thread after the CPU-backend ops it must wait for."""
        if self.host_pending:
            deps = list(deps) + self.host_pending
            self.host_pending = []
        if kw:
            self.last_host = self.op(kind, _HOST, -1, name, deps, **kw)
        else:
            self.last_host = self.plan.append(kind, _HOST, -1, name, deps, 0, (), self.layer, self.split, self.graph)
        return self.last_host

    def launch(self, kind, stream, device, name, deps=(), **kw) -> int:
        """Host issues an async GPU op; returns the GPU op's id. The ISSUE op carries the
        launched kind in its tag (and an attention's shape: an attention made of several
        kernels costs the host more than one launch, see :mod:`sim.model.costs`)."""
        is_attn = kind is _ATTN
        append = self.plan.append
        layer, split, graph = self.layer, self.split, self.graph
        # the ISSUE op on the host thread (Emitter.host), after the CPU-backend ops pending
        pend = self.host_pending
        if pend:
            self.host_pending = []
        iss = self.last_host = append(_ISSUE, _HOST, -1, "issue " + name, pend, 0,
                                      kw.get("shape", ()) if is_attn else (), layer, split, graph, -1, 0, True,
                                      _KIND_VALUE[kind])
        gdeps = (iss, *deps) if deps else (iss,)
        if kw:
            lay = kw.get("layer")
            oid = append(kind, stream, device, name, gdeps, kw.get("nbytes", 0), kw.get("shape", ()),
                         layer if lay is None else lay, split, graph, kw.get("slot", -1), kw.get("slot_bytes", 0),
                         kw.get("pinned", True), kw.get("tag", ""))
        else:
            oid = append(kind, stream, device, name, gdeps, 0, (), layer, split, graph)
        sv = _GPU_STREAM_KEY.get(stream)
        if sv is not None:
            self.last_gpu[(sv, device)] = oid
        if is_attn:
            self.kv_ops.append((iss, "attn", layer))
            self.kv_ops.append((oid, "attn", layer))
        return oid

    def launch_items(self, items: Sequence[Item], stream: Stream, device: int, first_deps=()) -> None:
        """``launch(it.kind, stream, device, it.name, deps, nbytes=it.weight_bytes,
        shape=it.shape)`` for each item in order, with ``layer`` set to the item's, ``deps`` =
        ``first_deps`` for the first item and none for the others: the same ops, appended to the
        plan's columns a column at a time (from :data:`BULK_MIN` items; a first launch with extra
        deps or pending host dependencies goes through :meth:`launch`)."""
        if not items:
            return
        if not ENABLE_BULK or len(items) < BULK_MIN:
            for j, it in enumerate(items):
                self.layer = it.layer
                self.launch(it.kind, stream, device, it.name, first_deps if j == 0 else (), nbytes=it.weight_bytes,
                            shape=it.shape)
            return
        if first_deps or self.host_pending:  # the first launch waits on more than its ISSUE
            it = items[0]
            self.layer = it.layer
            self.launch(it.kind, stream, device, it.name, first_deps, nbytes=it.weight_bytes, shape=it.shape)
            items = items[1:]
            if not items:
                return
        plan = self.plan
        k = len(items)
        base = len(plan.names)
        p = len(plan.dep_idx)
        # op base + 2j: the ISSUE of item j on the host thread (no deps); base + 2j + 1: the
        # GPU op, after its ISSUE
        kinds = [KIND_CODE[it.kind] for it in items]
        names = [it.name for it in items]
        shapes = [it.shape for it in items]
        layers = [it.layer for it in items]
        attn = [j for j, it in enumerate(items) if it.kind is _ATTN]
        issue_shapes = [()] * k
        for j in attn:
            issue_shapes[j] = shapes[j]
        plan.kinds.extend(_interleave([KIND_CODE[_ISSUE]] * k, kinds))
        plan.streams.extend([STREAM_CODE[_HOST], STREAM_CODE[stream]] * k)
        plan.devices.extend([-1, device] * k)
        plan.names.extend(_interleave(["issue " + nm for nm in names], names))
        plan.dep_idx.extend(range(base, base + 2 * k, 2))
        plan.dep_ptr.extend(_interleave(range(p, p + k), range(p + 1, p + k + 1)))
        plan.nbytes.extend(_interleave([0] * k, [it.weight_bytes for it in items]))
        plan.shapes.extend(_interleave(issue_shapes, shapes))
        plan.layers.extend(_interleave(layers, layers))
        plan.splits.extend([self.split] * (2 * k))
        plan.graphs.extend([self.graph] * (2 * k))
        plan.slots.extend([-1] * (2 * k))
        plan.slot_bytes.extend([0] * (2 * k))
        plan.pinned.extend([True] * (2 * k))
        plan.tags.extend(_interleave([_KIND_VALUE[it.kind] for it in items], [""] * k))
        for j in attn:
            self.kv_ops.append((base + 2 * j, "attn", layers[j]))
            self.kv_ops.append((base + 2 * j + 1, "attn", layers[j]))
        self.layer = layers[-1]
        self.last_host = base + 2 * k - 2
        sv = _GPU_STREAM_KEY.get(stream)
        if sv is not None:
            self.last_gpu[(sv, device)] = base + 2 * k - 1

    def sync(self, device: int, name="sync", streams=(Stream.COMPUTE, Stream.COPY)) -> int:
        """Host waits for everything issued on ``device``'s ``streams``."""
        keep = {s.value for s in streams}
        deps = [v for (s, d), v in self.last_gpu.items() if d == device and s in keep]
        return self.host(OpKind.HOST_SYNC, name, deps)

    def h2d(self, name, device, nbytes, *, stream=Stream.COMPUTE, deps=(), slot=-1, slot_bytes=0, tag=""):
        """A host→device copy; pageable copies run on (and block) the host thread where the
        profile's pageable link blocks the host (CUDA), else they queue on ``stream`` like a
        pinned copy at the pageable rate (ROCm: ``h2d_pageable_host_blocking``)."""
        if self.pinned or not self.ctx.scn.hardware.h2d_pageable.host_blocking:
            return self.launch(OpKind.H2D, stream, device, name, deps, nbytes=int(nbytes), slot=slot,
                               slot_bytes=int(slot_bytes), pinned=self.pinned, tag=tag)
        # pageable: cudaMemcpyAsync syncs the destination stream, stages through a bounce
        # buffer and returns when the data left host memory: the host is blocked meanwhile
        stream_deps = [v for (s, d), v in self.last_gpu.items() if d == device and s == stream.value]
        deps = list(deps) + stream_deps + self.host_pending
        self.host_pending = []
        # on the host queue (the thread is blocked), holding the H2D link of ``device``
        oid = self.op(OpKind.H2D, Stream.HOST, device, name, deps, nbytes=int(nbytes), slot=slot,
                      slot_bytes=int(slot_bytes), pinned=False, tag=tag)
        return oid

    def h2d_pieces(self, pieces: Sequence[tuple[str, int]], device: int, *, stream=Stream.COMPUTE,
                   tag: str = "") -> int | None:
        """``h2d(name, device, nbytes, stream=stream, tag=tag)`` for each ``(name, nbytes)`` in
        order; returns the last copy's id (None without pieces). Async copies (pinned, or a
        pageable link that does not block the host) are appended to the plan's columns a
        column at a time (from :data:`BULK_MIN` pieces)."""
        if (not ENABLE_BULK or len(pieces) < BULK_MIN
                or not (self.pinned or not self.ctx.scn.hardware.h2d_pageable.host_blocking)):
            last = None
            for name, nb in pieces:
                last = self.h2d(name, device, nb, stream=stream, tag=tag)
            return last
        oid = None
        if self.host_pending:  # the first copy's ISSUE waits for the CPU-backend ops pending
            name, nb = pieces[0]
            oid = self.h2d(name, device, nb, stream=stream, tag=tag)
            pieces = pieces[1:]
        k = len(pieces)
        if not k:
            return oid
        plan = self.plan
        base = len(plan.names)
        p = len(plan.dep_idx)
        names = [nm for nm, _nb in pieces]
        # op base + 2j: the ISSUE of copy j on the host thread; base + 2j + 1: the copy
        plan.kinds.extend([KIND_CODE[_ISSUE], KIND_CODE[OpKind.H2D]] * k)
        plan.streams.extend([STREAM_CODE[_HOST], STREAM_CODE[stream]] * k)
        plan.devices.extend([-1, device] * k)
        plan.names.extend(_interleave(["issue " + nm for nm in names], names))
        plan.dep_idx.extend(range(base, base + 2 * k, 2))
        plan.dep_ptr.extend(_interleave(range(p, p + k), range(p + 1, p + k + 1)))
        plan.nbytes.extend(_interleave([0] * k, [int(nb) for _nm, nb in pieces]))
        plan.shapes.extend([()] * (2 * k))
        plan.layers.extend([self.layer] * (2 * k))
        plan.splits.extend([self.split] * (2 * k))
        plan.graphs.extend([self.graph] * (2 * k))
        plan.slots.extend([-1] * (2 * k))
        plan.slot_bytes.extend([0] * (2 * k))
        plan.pinned.extend([True, self.pinned] * k)
        plan.tags.extend([_KIND_VALUE[OpKind.H2D], tag] * k)
        self.last_host = base + 2 * k - 2
        sv = _GPU_STREAM_KEY.get(stream)
        if sv is not None:
            self.last_gpu[(sv, device)] = base + 2 * k - 1
        return base + 2 * k - 1


def _interleave(a, b) -> list:
    """``[a[0], b[0], a[1], b[1], ...]`` (equal lengths)."""
    out = [None] * (2 * len(a))
    out[0::2] = a
    out[1::2] = b
    return out


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """Contiguous runs ``(first, count)`` of True in a boolean mask (the selective copy merges
    adjacent used experts into one copy)."""
    if not mask.any():
        return []
    m = np.concatenate(([False], mask.astype(bool), [False]))
    edges = np.flatnonzero(m[1:] != m[:-1])
    starts, ends = edges[::2], edges[1::2]
    return [(int(s), int(e - s)) for s, e in zip(starts, ends)]


def cpu_attn_args(item_shape: tuple) -> tuple[int, tuple]:
    """``(nbytes, shape)`` of the CPU_MATVEC op that runs an attention item of shape
    ``item_shape`` (:func:`attn_item_shape`) on the CPU backend: the K/V bytes read and
    ``(1, 2 * score pairs, 1, 1, "attn", item_shape)``."""
    n_tok, kv, nh, nkv, hd, win, linear, state = item_shape[:8]
    pairs = n_tok * nh * hd * state if linear else attn_pairs(n_tok, kv, win) * nh * hd
    kv_read = 0 if linear else attn_keys(n_tok, kv, win) * nkv * hd * 4
    return int(kv_read), (1, int(2 * pairs), 1, 1, "attn", item_shape)


def overhead_shape(n_kernels: int, n_tokens: int, rebuilt: bool, call_tokens: int, n_layer: int,
                   capture_share: float) -> tuple:
    """Shape of a graph's host-overhead op (``graph_overhead``, priced by
    :func:`sim.model.costs.ggml_duration_s`): ``(kernels, tokens, rebuilt 0/1, call tokens, layers,
    capture share)``; ``rebuilt``, ``call_tokens`` and ``capture_share`` as :func:`graph_calls`."""
    return (n_kernels, n_tokens, int(rebuilt), int(call_tokens), n_layer, capture_share)


def kq_mask_shape(model, n_tokens: int, kv_len: int, flash_attn: bool, on_gpu: bool) -> tuple[int, int]:
    """Shape of a graph's KQ-mask host op: ``(entries the host fills, bytes copied to the GPU)``,
    the bytes 0 when no attention runs on a GPU."""
    return (mask_entries(model, n_tokens, kv_len),
            mask_bytes(model, n_tokens, kv_len, flash_attn) if on_gpu else 0)


def build_graph(em: Emitter, n_tokens: int, kv_len: int, token_offset: int,
                masks: dict[int, np.ndarray] | None = None, n_outputs: int | None = None) -> None:
    """Emit the ops of one graph (ubatch). ``masks``: pre-drawn used-expert masks
    (:func:`draw_masks`, with the same ``n_outputs``), None to draw them from the context's rng;
    ``n_outputs``: the graph's output rows (:func:`output_rows`, :func:`graph_items`)."""
    ctx = em.ctx
    scn, var, model = ctx.scn, ctx.variant, ctx.scn.model
    hw = scn.hardware
    items, splits = graph_splits(ctx, n_tokens, kv_len, token_offset, masks, n_outputs)
    # the gate looks at the graph's MoE ops on any backend (the prefetch patch: any MUL_MAT_ID node
    # of any split, its tokens against the gate), not only at the host-resident experts' splits: a
    # decode whose experts run on the CPU is gated off too
    has_moe = any(it.kind is OpKind.MOE for it in items)
    prefetch_on = var.prefetch_weights and not (
        has_moe and var.gate_min_batch is not None and n_tokens < var.gate_min_batch)
    slots_on = (var.expert_slots > 0 and model.moe is not None
                and n_tokens * model.moe.n_expert_used >= 2 * model.moe.n_expert)
    # which splits get their host input staged on the copy stream, and into how many buffers:
    # split index -> (buffer pool, buffers in the pool)
    staged: dict[int, tuple[str, int]] = {}
    for si, s in enumerate(splits):
        if s.host_input is None:
            continue
        if s.host_input.expert and slots_on:
            staged[si] = ("slots", var.expert_slots)
        elif prefetch_on:
            staged[si] = ("weights", 2)
    # one pool per (kind, GPU): as the patch keeps its staging per device (its own copy stream,
    # slots and events), each GPU's staged splits chain among themselves, and the first of each
    # is fired at the graph's start
    pools: dict[tuple[str, int], list[int]] = {}
    for si in sorted(staged):
        pools.setdefault((staged[si][0], splits[si].device), []).append(si)
    pool_pos = {si: pos for members in pools.values() for pos, si in enumerate(members)}
    # slot ids are unique per graph, a range per pool, GPU by GPU (the weight-prefetch pair
    # first, expert slots after it): a slot id names one buffer on one GPU
    slot_base: dict[tuple[str, int], int] = {}
    for key in sorted(pools, key=lambda k: (k[1], k[0] != "weights")):
        slot_base[key] = sum(staged[pools[k][0]][1] for k in slot_base)
    # issue point of each staged copy: one staged split ahead in its pool whatever the number
    # of buffers (the buffers bound reuse, not depth): the copy feeding staged split k+1 is
    # issued when the host reaches staged split k, the graph's first staged copy at the graph's
    # first split. A single buffer cannot be refilled while it is read: each copy is then issued
    # at its own split, after the previous consumer's free event was recorded (no overlap).
    issue_at: dict[int, int] = {}
    for pool, members in pools.items():
        for pos, si in enumerate(members):
            la = min(staged[si][1] - 1, 1)
            issue_at[si] = members[pos - la] if pos >= la else 0
    # copies are issued when their issue point comes (pools independent of each other)
    staged_order = sorted(staged, key=lambda si: (issue_at[si], si))
    copy_of: dict[int, int] = {}       # split -> H2D op into its staging buffer
    consumer_of: dict[int, int] = {}   # split -> compute op reading the staging buffer
    issued_upto = -1                   # index into staged_order of the last issued copy
    # layers whose router ids were read back this graph -> the runs of the experts their copies
    # move (the used ones, or the cache's misses)
    ids_read: dict[int, list[tuple[int, int]]] = {}

    def issue_staged_copy(k: int) -> None:
        si = staged_order[k]
        s = splits[si]
        pool_name, nbuf = staged[si]
        t = s.host_input
        assert t is not None
        # the buffer was last read by the consumer nbuf positions earlier in the same pool
        dev = s.device
        pool = pools[(pool_name, dev)]
        pos = pool_pos[si]
        free_dep = consumer_of.get(pool[pos - nbuf]) if pos >= nbuf else None
        slot = slot_base[(pool_name, dev)] + pos % nbuf
        nbytes = sum(tt.nbytes for tt in t.tensors)
        saved = em.layer, em.split
        em.layer, em.split = t.layer, si  # the copy belongs to the split it feeds
        deps = [free_dep] if free_dep is not None else []
        if free_dep is not None:
            em.host(OpKind.EVENT_WAIT, f"wait free slot{slot}")
        # an expert slot is allocated for the largest expert tensor staged on its GPU (the VRAM
        # accounting's figure), a weight buffer for the largest host split of its pool
        sb = ctx.vram[dev].expert_slot_bytes if pool_name == "slots" else slot_bytes[(pool_name, dev)]
        copy_of[si] = em.h2d(f"{t.name} (prefetch)", dev, nbytes, stream=Stream.COPY, deps=deps,
                             slot=slot, slot_bytes=sb, tag="prefetch")
        em.host(OpKind.EVENT_RECORD, f"record ready {t.name}")
        em.layer, em.split = saved

    # a weight-prefetch buffer is allocated for the largest host split it may hold (worst-case
    # graph)
    slot_bytes = {name: max(sum(tt.nbytes for tt in splits[si].host_input.tensors) for si in members)
                  for name, members in pools.items() if name[0] != "slots"}
    ggml = hw.ggml
    n_kernels = graph_kernels(items)
    if ggml is not None and ggml.has_graph_host_work:
        # llama.cpp's host work per graph before its compute (sim.model.ggmlcost): the llama_decode
        # call's batch checks and ubatch split (first ubatch of a call), the memory apply, for
        # a graph it does not reuse the graph build and the scheduler's allocation (its kernels
        # then run without a CUDA graph: sim.model.costs.direct_launch_s prices that on its GPU ops),
        # for a reused one its share of the CUDA-graph capture
        em.overhead_op = em.host(OpKind.HOST_WORK, f"graph {em.graph} host overhead", tag="graph_overhead",
                                 shape=overhead_shape(n_kernels, n_tokens, em.rebuilt, em.call_tokens, model.n_layer,
                                                      em.capture_share))
    else:
        em.overhead_op = -1
    if ggml is not None and ggml.mask_s > 0:
        # the host fills the KQ masks, then the scheduler copies them (graph inputs, pinned) to
        # the GPU when some attention runs there
        on_gpu = any(it.kind is OpKind.ATTN and not it.cpu for it in items)
        oid = em.host(OpKind.HOST_WORK, f"graph {em.graph} KQ mask", tag="kq_mask",
                      shape=kq_mask_shape(model, n_tokens, kv_len, scn.placement.flash_attn, on_gpu))
        em.kv_ops.append((oid, "kq_mask", int(on_gpu)))
    if ggml is not None and ggml.cpu_get_rows_bytes_per_s > 0:
        # llama.cpp keeps token_embd on the CPU whatever -ngl: its GET_ROWS runs on the CPU
        # backend (one thread, sim.model.ggmlcost) and, when the first split is on a GPU, the rows
        # cross to it from the CPU backend's pinned compute buffer as that split's input
        rows = em.op(OpKind.CPU_MATVEC, Stream.CPU, -1, "token_embd get_rows",
                     [em.last_host] if em.last_host >= 0 else [], shape=(n_tokens, model.d_model, 0, 0, "rows", ()),
                     layer=-1)
        em.host_pending = [rows]
        if splits and not splits[0].cpu:
            em.launch(OpKind.H2D, Stream.COMPUTE, splits[0].device, "token_embd rows to device",
                      nbytes=n_tokens * model.d_model * ACT_BYTES, tag="act", pinned=True)
    for si, s in enumerate(splits):
        em.split = si
        em.layer = s.items[0].layer
        split_cost = ggml is not None and ggml.split_s > 0
        if split_cost and not s.cpu:
            # the scheduler's host work per split (inputs, events, backend switch)
            em.host(OpKind.HOST_WORK, f"split {si} host overhead", tag="split_overhead")
        # prefetch lookahead: issue the staged copies whose issue point has come
        while issued_upto + 1 < len(staged_order) and issue_at[staged_order[issued_upto + 1]] <= si:
            issue_staged_copy(issued_upto + 1)
            issued_upto += 1
        if s.cpu:
            _emit_cpu_split(em, s, n_tokens, overhead=split_cost, llama_copies=ggml is not None)
            continue
        dev = s.device
        first = s.items[0]
        deps_first: list[int] = []
        # the split's activations come from another GPU (-sm layer boundary): ggml's scheduler
        # copies them with ggml_backend_tensor_copy_async, which makes this GPU's stream wait
        # for the source GPU's work so far (an event; the peer copy's own time is not priced)
        prev = _current_device(em)
        if prev != dev and (Stream.COMPUTE.value, prev) in em.last_gpu:
            deps_first.append(em.last_gpu[(Stream.COMPUTE.value, prev)])
        if s.host_input is not None:
            t = s.host_input
            if si in staged:
                # consumer waits on the ready event of its copy
                ready = copy_of[si]
                if hw.event_semantics == "stream_tail" and not em.pinned:  # pageable copies only
                    ready = em.last_gpu.get((Stream.COPY.value, dev), ready)
                em.host(OpKind.EVENT_WAIT, f"wait ready {t.name}")
                deps_first.append(ready)
            else:
                _emit_sync_copy(em, ctx, s, n_tokens, ids_read)
        rest = s.items
        if s.host_input is not None and si in staged:
            em.layer = first.layer
            cp = copy_of[si]
            oid = em.launch(first.kind, Stream.COMPUTE, dev, first.name, deps_first, nbytes=first.weight_bytes,
                            shape=first.shape, slot=em.plan.slots[cp], slot_bytes=em.plan.slot_bytes[cp],
                            tag="staged")
            consumer_of[si] = oid
            em.host(OpKind.EVENT_RECORD, f"record free {first.name}")
            rest, deps_first = rest[1:], []
        if rest:
            _launch_split_items(em, rest, dev, deps_first)
        if prefetch_on and si not in staged:
            # the prefetch machinery records a done event per split so that buffers can be
            # released; it costs host time even when nothing is copied
            em.host(OpKind.EVENT_RECORD, f"record done split{si}")
    # end of graph: the host synchronises every GPU before the next ubatch
    # background cache fills (decode) are not waited for here: the hits that need them wait
    # on their fill's event instead (Emitter.fill_of)
    streams = (Stream.COMPUTE,) if em.fill_pending else (Stream.COMPUTE, Stream.COPY)
    for g in range(hw.n_gpu):
        em.sync(g, f"graph {em.graph} end sync{g}", streams)
    em.fill_pending = False
    em.plan.graph_last_op.append(len(em.plan) - 1)
    em.plan.graph_tokens.append(n_tokens)
    em.plan.meta.setdefault("rebuilt_graphs", []).append(bool(em.rebuilt))
    # the expert-cache hits ran on the GPU: their kernels are launched one by one too
    em.plan.meta.setdefault("graph_kernels", []).append(n_kernels + em.hit_kernels)
    em.hit_kernels = 0


def moved_attn(it: Item) -> bool:
    """Whether ``it`` is the attention of a layer ``-ngl`` left on the CPU that the op-offload
    rule moved to the GPU (its shape carries the KV bytes copied in and out: elements 11, 12)."""
    sh = it.shape
    return it.kind is OpKind.ATTN and len(sh) > 12 and bool(sh[11] or sh[12])


def _launch_split_items(em: Emitter, items: Sequence[Item], dev: int, first_deps=()) -> None:
    """Launch a GPU split's items on ``dev``'s compute stream (:meth:`Emitter.launch_items`).

    A moved attention (:func:`moved_attn`) is preceded by
    what ggml's scheduler does on the host between the layer's V projection and its attention
    (``ggml_backend_sched_compute_splits``, timed split by split in
    ``data/llamacpp/h200-20261201-splits``): the CPU split storing the new K/V (their copy to the
    host needs the GPU's work so far: the host waits for the compute stream; one-thread
    ``SET_ROWS``) and the attention split's input copy of the layer's KV-cache view, a
    non-weight input the scheduler copies synchronously from the plain (pageable) CPU buffer
    after synchronising the GPU backend, plus the host overhead of the layer's extra splits
    (norm weights, q/k/v apart). One host-blocking op (``HOST_WORK``, tag ``kv_moved``, priced by
    :func:`sim.model.costs.kv_copies_s` and, with a llama.cpp-calibrated profile, ``[ggml]``'s
    ``split_us`` and one-thread ``SET_ROWS`` rate); the GPU op then prices the attention alone.
    The host cannot run ahead of it, so a prefetch copy fired one split ahead is issued only once
    the host is past it."""
    if not any(moved_attn(it) for it in items):
        em.launch_items(items, Stream.COMPUTE, dev, first_deps)
        return
    deps = tuple(first_deps)
    j0 = 0
    for j, it in enumerate(items):
        if not moved_attn(it):
            continue
        if j > j0:
            em.launch_items(items[j0:j], Stream.COMPUTE, dev, deps)
            deps = ()
        em.layer = it.layer
        em.sync(dev, f"wait k/v {it.name}", (Stream.COMPUTE,))
        oid = em.host(OpKind.HOST_WORK, f"{it.name} KV store and view", tag="kv_moved", shape=it.shape)
        em.kv_ops.append((oid, "attn", it.layer))
        j0 = j
    em.launch_items(items[j0:], Stream.COMPUTE, dev, deps)


def _emit_sync_copy(em: Emitter, ctx: BuildContext, s: Split, n_tokens: int,
                    ids_read: dict[int, list[tuple[int, int]]]) -> None:
    """Baseline (one graph copy) handling of a split's host input: sync, ids readback for
    the first expert split of a layer, selective or whole copy, wait (the split's compute is
    then ordered after the copies by the stream, or by the host for pageable copies).
    ``ids_read``: the graph's layers whose ids were read back -> the runs ``(first, count)`` of
    the experts their selective copies move (:func:`_runs` of the used experts, or of the
    cache's misses), filled here."""
    var, model = ctx.variant, ctx.scn.model
    t = s.host_input
    assert t is not None
    dev = s.device
    em.sync(dev, f"sync before {t.name}")
    tensor = t.tensors[0]
    if t.expert and var.selective_copy:
        runs = ids_read.get(t.layer)
        if runs is None:
            rows = t.shape[0]  # the op's tokens (the output rows in the block that runs on them only)
            d2h = em.launch(OpKind.D2H, Stream.COMPUTE, dev, f"blk.{t.layer}.ffn_moe_topk ids",
                            nbytes=rows * model.moe.n_expert_used * ID_BYTES, tag="ids")
            em.host(OpKind.HOST_SYNC, f"wait ids blk.{t.layer}", (d2h,))
            em.host(OpKind.HOST_WORK, f"build expert runs blk.{t.layer}",
                    shape=(rows * model.moe.n_expert_used,))
            copy_mask = ctx.stats["used_masks"][t.layer]
            if ctx.cache is not None:
                res = ctx.cache.access(t.layer, np.flatnonzero(copy_mask))
                copy_mask = np.zeros_like(copy_mask)
                copy_mask[np.asarray(res.misses, dtype=int)] = True
            runs = ids_read[t.layer] = _runs(copy_mask)
        pieces = [(f"{t.name}[{a}:{a + c}]", c * tensor.bytes_per_mat) for a, c in runs]
        tag = "cache_miss" if ctx.cache is not None else "selective"
    else:
        pieces = [(t.name, sum(tt.nbytes for tt in t.tensors))]
        tag = "whole"
    last = em.h2d_pieces(pieces, dev, stream=Stream.COMPUTE, tag=tag)
    if last is not None and (em.pinned or not ctx.scn.hardware.h2d_pageable.host_blocking):  # async copies
        em.host(OpKind.HOST_SYNC, f"wait copy {t.name}", (last,))


def _emit_cache_hits(em: Emitter, cache_gpu_items, fill_reqs, gpu: int) -> None:
    """The expert-cache hits of a decode split, on the GPU (``(item, hits)`` each), then the
    background insertion of its misses on the copy stream (``(layer, tensor, misses)``): after the
    hits were launched (the hits read experts filled by earlier tokens); later hits wait for these
    fills (fill event), the graph does not."""
    for it, hits in cache_gpu_items:
        em.layer = it.layer
        m_, n_, k_, _, topk = it.shape[:5]
        em.hit_kernels += 2 if m_ <= MMVQ_MAX_BATCH else 4   # as graph_kernels counts an expert matmul
        # conservatively wait for the layer's last fill (it may hold an expert hit now)
        fill = em.fill_of.get(it.layer)
        em.launch(OpKind.MOE, Stream.COMPUTE, gpu, f"{it.name} (cached)", (fill,) if fill is not None else (),
                  nbytes=hits * it.tensors[0].bytes_per_mat, shape=(m_, n_, k_, hits, min(topk, hits), *it.shape[5:6]),
                  tag="cache_hit")
    for layer, t, misses in fill_reqs:
        em.fill_of[layer] = em.launch(OpKind.H2D, Stream.COPY, gpu, f"{t.name} cache fill",
                                      nbytes=misses * t.bytes_per_mat, pinned=True, tag="cache_fill")
        em.fill_pending = True


def _emit_cpu_split(em: Emitter, s: Split, n_tokens: int, overhead: bool = False, llama_copies: bool = False) -> None:
    """A split on the CPU backend: activations D2H, CPU compute on the host thread, H2D back.

    ``overhead``: the split's host cost (``[ggml] cpu_split_us``: the scheduler's work and
    ggml-cpu's graph plan and thread-pool start) comes after the host has waited for the
    activations, as in ``ggml_backend_sched_compute_splits``: the CPU backend has no async copy,
    so the input copy synchronises the GPU (``ggml_backend_synchronize(input_backend)``) before
    ``ggml_backend_graph_compute_async`` plans and runs the split; the GPU work queued before a
    CPU split is therefore not hidden behind that cost (the split timing's ``cpu_drain``:
    1.5 ms per gpt-oss ``-ncmoe 24`` token, ``data/llamacpp/h100-20261206-tg9``).

    ``llama_copies`` (a profile with a ``[ggml]`` section: llama.cpp's scheduler; without it the
    plan is the CuPy executor's, which copies the inputs as one D2H and the output back
    asynchronously): the input copies are synchronous, one per input: ``ggml_backend_tensor_copy`` into the CPU
    backend's (pinned) compute buffer is ``ggml_backend_tensor_get``, a ``cudaMemcpyAsync`` on
    ``cudaStreamPerThread`` and a stream synchronise, so each input costs the host the copy and a
    wake-up; a MoE split has two, the activations and the router ids. The output goes back to
    the GPU the same way when the next GPU split copies its input (CUDA's ``cpy_tensor_async``
    takes only CUDA buffers, so the scheduler falls back to ``ggml_backend_tensor_copy``: a
    ``cudaMemcpyAsync`` and a synchronise), and the GPU split is launched only after it: a MoE
    split's output is ``MUL_MAT_ID``'s ``[d_model, n_expert_used, n_tokens]`` f32, weighted and
    summed on the GPU. The split timing measured these copies at 17–22 µs per CPU split (two
    inputs) and 14–24 µs per GPU split after it (one input) on an H200
    (``data/llamacpp/h200-20261204-tg6``, ``copy_us``).

    With an expert cache at decode, experts that hit run on the GPU; only misses run on the CPU
    (their insertion into the cache is copied in the background on the copy stream). A split
    whose experts all hit has nothing to run on the CPU and is no CPU split: no activations to
    the host and back, no CPU split cost."""
    ctx = em.ctx
    model = ctx.scn.model
    d = model.d_model
    # the split's rows: the graph's tokens, or the output rows of a split that holds only the
    # FFN of the block llama.cpp runs on them (graph_items)
    rows = min(n_tokens, max(it.shape[0] for it in s.items))
    act = rows * d * ACT_BYTES
    gpu = _current_device(em)  # the GPU holding the activations
    moe = any(it.expert for it in s.items)
    ids = rows * model.moe.n_expert_used * ID_BYTES if moe else 0
    blk = s.items[0].layer
    # what runs on the CPU (the cache read first: hits run on the GPU, only misses on the CPU)
    cache_gpu_items = []
    fill_reqs: list = []
    cpu_work: list = []
    read_layers: set[int] = set()
    attn_layers = {it.layer for it in s.items if it.kind is OpKind.ATTN}
    for it in s.items:
        # the weightless nodes beside the op (ffn_cpu_nodes): its bias add; the GLU, on the down
        # projection (not in a block -ngl left on the CPU: its attention item prices them)
        ew_nodes, ew_bytes = 0, 0.0
        oai = 0
        if it.kind is not OpKind.ATTN and it.layer not in attn_layers and it.tensors:
            name = it.tensors[0].name
            for nm, k, e, row, rows_per_token in ctx.ffn_cpu[it.layer][4]:
                if nm == name:
                    ew_nodes, ew_bytes = k, 4.0 * e * it.shape[0]   # f32 elements of the op's rows
                    oai = oai_elems_per_thread(row, rows_per_token * it.shape[0], ctx.cpu_threads)
        nbytes, shape = it.weight_bytes, None
        if it.kind is OpKind.ATTN:
            nbytes, shape = cpu_attn_args(it.shape)
        elif it.kind is OpKind.MOE:
            m_, n_, k_, n_used, topk = it.shape[:5]
            if ctx.cache is not None:
                mask = ctx.stats["used_masks"][it.layer]
                if it.layer not in read_layers:
                    read_layers.add(it.layer)
                    res = ctx.cache.access(it.layer, np.flatnonzero(mask))
                    em.cache_split[it.layer] = (len(res.hits), len(res.misses))
                hits, misses = em.cache_split[it.layer]
                t = it.tensors[0]
                if hits:
                    cache_gpu_items.append((it, hits))
                if misses:
                    fill_reqs.append((it.layer, t, misses))
                n_used = misses
                nbytes = misses * t.bytes_per_mat
            shape = (m_, n_, k_, min(topk, n_used) if n_used else 0, "moe", it.shape, ew_nodes, ew_bytes, oai)
        else:
            m_, n_, k_ = it.shape[:3]
            shape = (m_, n_, k_, 1, "mm", it.shape, ew_nodes, ew_bytes, oai)
        if nbytes == 0 and shape[3] == 0:
            continue
        cpu_work.append((it, nbytes, shape))
    if not cpu_work:
        # every expert of the split hit the cache: nothing runs on the CPU, so there is no CPU
        # split (no activations to the host, no thread pool); the hits run on the GPU
        _emit_cache_hits(em, cache_gpu_items, fill_reqs, gpu)
        return
    # llama.cpp: one synchronous copy per input (the first also waits for the GPU's queued work);
    # the CuPy executor: the inputs in one copy
    for what, nbytes in (("act", act), ("ids", ids)) if llama_copies else (("act", act + ids),):
        if nbytes:
            d2h = em.launch(OpKind.D2H, Stream.COMPUTE, gpu, f"{what} to host blk.{blk}", nbytes=nbytes, tag="act")
            em.host(OpKind.HOST_SYNC, f"wait {what}", (d2h,))
    if overhead:
        em.host(OpKind.HOST_WORK, f"split {em.split} host overhead", tag="cpu_split_overhead")
    last_cpu = None
    for it, nbytes, shape in cpu_work:
        em.layer = it.layer
        # the CPU backend runs on the host thread: it starts after the host's last op (the
        # wait for the activations) and the host continues only when it is done
        deps = [em.last_host] + ([last_cpu] if last_cpu is not None else [])
        last_cpu = em.op(OpKind.CPU_MATVEC, Stream.CPU, -1, it.name, deps, nbytes=int(nbytes), shape=shape)
        if it.kind is OpKind.ATTN:
            em.kv_ops.append((last_cpu, "cpu_attn", it.layer))
        em.host_pending = [last_cpu]
    # the output back to the GPU, synchronously, before anything after the split is launched; a
    # MoE split (ending in the experts' down MUL_MAT_ID) hands over one row per used expert
    if llama_copies:
        out = act * model.moe.n_expert_used if moe and s.items[-1].kind is OpKind.MOE else act
        h2d = em.launch(OpKind.H2D, Stream.COMPUTE, gpu, f"act to device blk.{s.items[-1].layer}", nbytes=out,
                        tag="act", pinned=True)
        em.host(OpKind.HOST_SYNC, "wait act to device", (h2d,))
    _emit_cache_hits(em, cache_gpu_items, fill_reqs, gpu)
    if not llama_copies:  # the CuPy executor: the activations back asynchronously (pinned host memory)
        em.launch(OpKind.H2D, Stream.COMPUTE, gpu, f"act to device blk.{s.items[-1].layer}", nbytes=act,
                  tag="act", pinned=True)


def _current_device(em: Emitter) -> int:
    """GPU that ran the most recent compute op (activations live there)."""
    best, dev = -1, em.act_device_default
    for (st, dv), oid in em.last_gpu.items():
        if st == Stream.COMPUTE.value and oid > best:
            best, dev = oid, dv
    return dev


# ----------------------------------------------------------------------------------------
# public entry point
# ----------------------------------------------------------------------------------------


def test_graphs(scn: Scenario, test: BenchTest, n_ubatch: int | None = None) -> list[tuple[int, int, int]]:
    """``(n_tokens, kv_len, token_offset)`` of each graph of a test.

    A prompt goes to ``llama_decode`` in calls of ``n_batch`` tokens (llama-bench's ``test_prompt``)
    and each call is split into ubatches of ``n_ubatch`` (the last one of a call may be shorter);
    a decode token is a graph of its own."""
    ub = max(1, n_ubatch or scn.workload.n_ubatch)
    nb = max(1, scn.workload.n_batch)
    out = []
    if test.n_prompt:
        done = 0
        while done < test.n_prompt:
            end = min(test.n_prompt, (done // nb + 1) * nb)  # the end of this llama_decode call
            n = min(ub, end - done)
            out.append((n, test.n_depth + done, done))
            done += n
    else:
        for j in range(test.n_gen):
            out.append((1, test.n_depth + j, j))
    return out


#: llama.cpp pads the KV length a graph attends over to this many cells (``llama_kv_cache::get_n_kv``,
#: ``n_pad_cur = max(n_pad, 256)``), so that consecutive ubatches keep one graph
KV_PAD_CELLS = 256


def graph_keys(scn: Scenario, test: BenchTest,
               graphs: Sequence[tuple[int, int, int]] | None = None) -> list[tuple[int, int, int]]:
    """``(n_tokens, n_kv, n_outputs)`` of each graph of a test (:func:`test_graphs`' order): what
    decides whether llama.cpp can reuse the previous graph (``llm_graph_params::allow_reuse``: the
    ubatch's tokens and output count; the inputs' ``can_reuse``: the KQ mask's KV length).

    ``n_kv`` is the cells the graph attends over, ``max(256, pad(kv_len + n_tokens, 256))``
    (``get_n_kv``; the cap at the cache's size never makes two different windows equal). A prompt
    outputs the last token of each ``llama_decode`` call (``llama_batch_get_one`` has no logits
    array: ``llama_batch_allocr`` marks the last token), so only a call's last ubatch has an
    output; a decode token has one. ``graphs``: the test's :func:`test_graphs`, when at hand."""
    nb = max(1, scn.workload.n_batch)
    pad = KV_PAD_CELLS
    out = []
    for n, kv, off in (test_graphs(scn, test) if graphs is None else graphs):
        n_kv = max(pad, -(-(kv + n) // pad) * pad)
        end = off + n
        outputs = 1 if (not test.n_prompt or end == test.n_prompt or end % nb == 0) else 0
        out.append((n, n_kv, outputs))
    return out


def output_rows(scn: Scenario, test: BenchTest,
                graphs: Sequence[tuple[int, int, int]] | None = None) -> list[int | None]:
    """The output rows of each graph of a test (:func:`test_graphs`' order), as
    :func:`graph_items` takes them: on a profile that prices llama.cpp (``[ggml]``), the
    ``n_outputs`` of :func:`graph_keys` (1 in the ubatch that ends a ``llama_decode`` call and in a
    decode graph, 0 in a prompt's other ubatches); on the CuPy executor's profiles None (its plans
    run every block on every token and the head on one row, as it executes them)."""
    graphs = test_graphs(scn, test) if graphs is None else graphs
    if scn.hardware.ggml is None:
        return [None] * len(graphs)
    return [k[2] for k in graph_keys(scn, test, graphs)]


def graph_calls(scn: Scenario, test: BenchTest, rep: int | None = None) -> list[tuple[bool, int, float]]:
    """``(rebuilt, call_tokens, capture_share)`` of each graph of a test (:func:`test_graphs`'
    order), as llama.cpp's ``llama_context::decode`` and ``process_ubatch`` and ggml-cuda's
    CUDA graphs handle them under llama-bench:

    * ``rebuilt``: llama.cpp reuses the previous graph when its :func:`graph_keys` (tokens, the
      256-cell KV window, outputs) are the same, and builds it anew otherwise. The first graph
      of a one-ubatch prompt and of decode reuses the warm-up's (llama-bench's warm-up ran the
      same graph); that of a prompt of several ubatches follows the previous repetition's last
      ubatch, which has the output, and is rebuilt. A later graph is rebuilt where its key
      differs from the one before: a prompt's ubatches of 256 tokens or more each open a new
      window, smaller ones share a window of 256 cells (and each call's last ubatch, with its
      output, differs from the others);
    * ``call_tokens``: a prompt is decoded in ``llama_decode`` calls of ``n_batch`` tokens, a
      decode token in a call of its own; the first ubatch of a call carries the call's tokens,
      the others 0;
    * ``capture_share``: ggml-cuda runs a graph whose node properties changed directly and
      captures its CUDA graph on the next call with unchanged properties (its warm-up), then
      replays it. The first graph of a one-ubatch prompt or of decode is captured in
      llama-bench's first repetition (the warm-up ran it directly) and replayed after: it pays a
      whole capture (``capture_per_layer_s``, which instantiates the executable graph) in
      repetition ``rep`` 0 and none later; where the simulated repetitions stand for a different
      number of llama-bench's (``rep`` None, or :attr:`sim.model.specs.Workload.bench_repetitions`
      set: ``compare`` draws fewer), every repetition pays ``1 / r`` of it (``r``: llama-bench's
      repetitions), the same mean time. Every other graph 0: a reused graph after a rebuilt one
      inside a prompt captures again, but into the executable graph that exists
      (``cudaGraphExecUpdate``), and is priced as a replay: the prompts at ubatch 1–128 of
      ``data/llamacpp/h100-20261206-ubsmall`` fit that, not a whole capture per 256-cell window
      (docs/llamacpp.md, "Graph reuse inside a prompt of small ubatches").
    """
    wl = scn.workload
    g = scn.hardware.ggml
    captures = g is not None and g.capture_per_layer_s > 0
    graphs = test_graphs(scn, test)
    keys = graph_keys(scn, test, graphs)
    nb = max(1, wl.n_batch)
    if not captures:
        first_share = 0.0
    elif rep is None or wl.bench_repetitions:
        first_share = 1.0 / max(1, wl.bench_repetitions or wl.repetitions)
    else:
        first_share = 1.0 if rep == 0 else 0.0
    out = []
    for i, ((n, _kv, off), key) in enumerate(zip(graphs, keys)):
        if test.n_prompt:
            call = min(nb, test.n_prompt - off) if off % nb == 0 else 0
        else:
            call = 1
        if i == 0:
            rebuilt = bool(test.n_prompt) and len(graphs) > 1
            share = 0.0 if rebuilt else first_share
        else:
            rebuilt, share = key != keys[i - 1], 0.0
        out.append((rebuilt, call, share))
    return out


def build_plan(scn: Scenario, variant: Variant, test: BenchTest, rng: np.random.Generator,
               ctx: BuildContext | None = None) -> Plan:
    """Build the plan of one llama-bench test under one variant.

    Args:
        scn: the scenario (model, hardware, placement, workload, routing).
        variant: the scheduler policy.
        test: ``pp``/``tg`` test with depth.
        rng: routing draws (one repetition of the test).
        ctx: reuse a context (e.g. to keep an expert cache warm across tests).

    Returns:
        The plan, with ``meta`` holding ``h2d_bytes``, ``vram`` (list of
        :class:`~sim.model.vram.VramBreakdown`), ``n_cpu_moe``, ``cache_hit_rate``.

    Raises:
        PlacementError: the placement does not fit in VRAM.
    """
    ctx = ctx or make_context(scn, variant, rng)
    ctx.rng = rng
    if scn.hardware.n_gpu < 1:
        raise PlacementError("n_gpu must be >= 1", file=scn.hardware.file, field="hardware.n_gpu")
    plan = Plan(label=f"{variant.name} / {test.name}")
    em = Emitter(plan, ctx)
    graphs = test_graphs(scn, test)
    calls = graph_calls(scn, test, ctx.rep)
    outputs = output_rows(scn, test, graphs)
    for gi, (n, kv, off) in enumerate(graphs):
        em.graph = gi
        em.token_offset = off
        em.rebuilt, em.call_tokens, em.capture_share = calls[gi]
        ctx.stats["used_masks"] = {}
        em.cache_split = {}
        build_graph(em, n, kv, off, n_outputs=outputs[gi])
    plan.meta.update(
        h2d_bytes=plan.h2d_bytes(),
        vram=ctx.vram,
        n_cpu_moe=ctx.n_cpu_moe,
        cache_hit_rate=ctx.cache.hit_rate if ctx.cache is not None else None,
        test=test.name,
        variant=variant.name,
        n_tokens=test.n_tokens,
    )
    return plan
