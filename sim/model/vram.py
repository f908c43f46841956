"""VRAM accounting per GPU: resident weights, KV cache, compute buffer, staging, cache pool.

VRAM is assigned in llama.cpp's order: resident weights (model load), KV cache (context
creation), then the compute buffer that ``llama_context::sched_reserve`` has
``ggml_backend_sched`` reserve for the worst-case graph at ``n_ubatch`` tokens, and last the
expert-cache pool from what is left. The compute buffer holds the graph's activations and the
copies of the split inputs (host weights) of one split at a time: ``ggml_backend_sched``
adds a split's input copies to the graph at the start of the split and ggml-alloc frees them
after their last use, with one graph copy (``n_copies = 1``: llama.cpp enables pipeline
parallelism, with its per-copy inputs, only with every layer on the GPUs and no tensor overrides,
so never with host weights). The worst-case graph outputs every token (``n_outputs = min(n_tokens,
n_outputs_max)``), so its end holds the head's f32 logits of every reserved token and the head's
input, ``tokens * (n_vocab + d_model) * 4`` bytes on the output layer's GPU; the compute buffer is
the larger of that and a layer's peak (checked against llama.cpp's own ``CUDA0 compute buffer
size`` in the committed lease logs: :mod:`calibrate.llamacpp.vramcheck`, median |error| 0.9 %).
Prefetch staging is reserved for the worst-case graph as well
(docs/DESIGN.md, variant 2 caveat): a gated prefetch reserves the same bytes as an ungated one,
even in graphs where it is off.

The cache pool is what VRAM leaves after those; with ``expert_cache = "fit"`` it also leaves
llama.cpp's fit target free (``-fitt``, ``placement.fit_target_mib``, 1024 MiB per GPU by default):
``pool = capacity - reserved - weights - KV - compute - staging - fit target``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable

import numpy as np

from sim.errors import PlacementError, VramOverflowError
from sim.model.specs import ModelSpec, Placement, Scenario, Tensor, Variant
from sim.units import GiB
from sim.wording import plural

#: compute buffer activations per ubatch token, in f32 elements per d_model (residual stream,
#: normed input, q/k/v/attention output, FFN hidden up to top-k experts). An estimate of
#: llama.cpp's graph allocator peak; override with ``compute_buffer_mib`` in the scenario.
ACT_ELEMS_FACTOR = 6


@dataclass(frozen=True)
class VramBreakdown:
    """Bytes per GPU by component; ``total_bytes`` must not exceed ``capacity_bytes``.

    Attributes:
        device: GPU index.
        capacity_bytes: VRAM of the GPU.
        reserved_bytes: CUDA context and driver.
        weights_bytes: resident weights of the layers on this GPU.
        kv_bytes: KV cache of those layers for ``ctx_size`` tokens.
        compute_bytes: compute buffer (activations + copies of host weights for the largest
            offloaded op).
        staging_bytes: prefetch staging buffers (2 x largest host split for weight prefetch,
            N x :attr:`expert_slot_bytes` for expert slots).
        cache_bytes: expert cache (what the cache actually holds: whole entries of the pool,
            each an equal slot the size of the model's largest expert, gate+up+down of one layer,
            :func:`expert_bytes`: any layer's expert fits any slot).
        cache_experts: cache capacity in experts (an expert = gate+up+down of one layer).
        expert_slot_bytes: bytes of one expert staging slot on this GPU
            (:func:`expert_slot_bytes`; 0 without expert slots).
        cache_pool_bytes: VRAM given to the expert-cache pool on this GPU (0 without a cache):
            what is left after the other components, minus :attr:`fit_margin_bytes`; the
            cache holds ``cache_experts`` whole entries of it.
        fit_margin_bytes: the fit target left free on this GPU (llama.cpp's ``-fitt``): for
            ``expert_cache = "fit"``, and for the ``n_cpu_moe`` fit (``placement.fit_experts``)
            where ``placement.fit_target_mib`` is given; 0 otherwise.
        cache_fit: the cache pool is sized by the fit (``expert_cache = "fit"``).
    """

    device: int
    capacity_bytes: float
    reserved_bytes: float
    weights_bytes: float
    kv_bytes: float
    compute_bytes: float
    staging_bytes: float
    cache_bytes: float = 0.0
    cache_experts: int = 0
    expert_slot_bytes: int = 0
    cache_pool_bytes: float = 0.0
    fit_margin_bytes: float = 0.0
    cache_fit: bool = False

    @property
    def total_bytes(self) -> float:
        return (self.reserved_bytes + self.weights_bytes + self.kv_bytes + self.compute_bytes
                + self.staging_bytes + self.cache_bytes)

    @property
    def free_bytes(self) -> float:
        return self.capacity_bytes - self.total_bytes


def _layer_split(model: ModelSpec, placement: Placement, n_gpu: int) -> tuple[int, int, np.ndarray]:
    """``(offloaded blocks, offloaded layers counting the output, cumulative tensor_split shares)``
    of llama.cpp's layer split (``llama_model::load_tensors``: layer ``il`` goes to the first GPU
    whose cumulative share exceeds ``(il - i_gpu_start) / act_gpu_layers``).

    Raises:
        PlacementError: ``tensor_split`` names more GPUs than the hardware has.
    """
    n_off = placement.gpu_blocks(model)
    n_act = n_off + (1 if placement.output_on_gpu() else 0)
    ts = list(placement.tensor_split) or [1.0] * n_gpu
    if len(ts) > n_gpu:
        raise PlacementError(f"{plural(len(ts), 'share')} for {n_gpu} GPU(s)", field="placement.tensor_split")
    ts += [0.0] * (n_gpu - len(ts))
    return n_off, n_act, np.cumsum(ts) / sum(ts)


def layer_devices(model: ModelSpec, placement: Placement, n_gpu: int) -> list[int]:
    """GPU of each block (-1: not offloaded), contiguous ranges as llama.cpp ``-sm layer``:
    block ``i`` of the ``n_off`` offloaded ones goes to the first GPU whose cumulative
    ``tensor_split`` share exceeds ``i / n_act``, ``n_act`` counting the output layer as the last
    offloaded one (``llama_model::load_tensors``; :func:`_layer_split`).

    Raises:
        PlacementError: ``tensor_split`` names more GPUs than the hardware has.
    """
    n_off, n_act, cum = _layer_split(model, placement, n_gpu)
    first = model.n_layer - n_off
    # block i (>= first) at fraction (i - first) / n_act of the offloaded layers
    frac = (np.arange(first, model.n_layer, dtype=np.int64) - first) / max(n_act, 1)
    return [-1] * first + np.minimum(np.searchsorted(cum, frac, side="right"), n_gpu - 1).tolist()


def output_device(model: ModelSpec, placement: Placement, n_gpu: int) -> int:
    """GPU of the output layer (its norm and head, and everything outside the blocks that is not
    on the CPU): llama.cpp puts it on the device the layer split gives index ``n_layer``
    (``llama_model::load_tensors``: ``dev_output = get_layer(n_layer)``, the output counted as
    the last offloaded layer), the last GPU with equal shares; ``-sm none`` (a ``tensor_split``
    of one GPU) the main GPU. The same rule as :func:`layer_devices` (:func:`_layer_split`).

    Raises:
        PlacementError: ``tensor_split`` names more GPUs than the hardware has.
    """
    n_off, n_act, cum = _layer_split(model, placement, n_gpu)
    return int(min(np.searchsorted(cum, n_off / max(n_act, 1), side="right"), n_gpu - 1))


def expert_bytes(model: ModelSpec, layer: int) -> int:
    """Bytes of one expert of ``layer`` (all its tensors: gate, up, down)."""
    return sum(t.bytes_per_mat for t in model.tensors if t.layer == layer and t.is_expert)


def host_expert_layers(model: ModelSpec, placement: Placement) -> list[int]:
    """The MoE layers with a host-resident expert tensor under ``placement``, ascending."""
    if model.moe is None:
        return []
    flags = host_flags(model, placement)
    return sorted({t.layer for t, host in zip(model.tensors, flags) if host and t.is_expert})


def host_experts(model: ModelSpec, placement: Placement) -> int:
    """Experts (an expert: gate+up+down of one layer) whose weights ``placement`` leaves on the
    host: ``n_expert`` for each MoE layer with a host-resident expert tensor. An expert cache
    never holds more entries than this (there is nothing else to cache)."""
    return len(host_expert_layers(model, placement)) * (model.moe.n_expert if model.moe else 0)


def cache_device(layer_dev: list[int], layer: int) -> int:
    """The GPU whose expert cache serves ``layer``'s host experts: the GPU the layer's expert
    matmuls run on (its own; a layer ``-ngl`` leaves on the CPU has them offloaded to GPU 0 at
    prefill, ggml's first backend). Experts cached on another GPU would be of no use to it."""
    d = layer_dev[layer] if 0 <= layer < len(layer_dev) else -1
    return d if d >= 0 else 0


#: per model (by id, holding the model so that the id stays its own): its weight groups, and
#: per placement the host residency of its tensors; a few models at a time
_MODEL_CACHE: dict[int, tuple[ModelSpec, dict]] = {}


def _model_cache(model: ModelSpec) -> dict:
    got = _MODEL_CACHE.get(id(model))
    if got is None or got[0] is not model:
        if len(_MODEL_CACHE) >= 8:
            _MODEL_CACHE.clear()
        got = _MODEL_CACHE[id(model)] = (model, {})
    return got[1]


def _layer_kv(model: ModelSpec) -> list[tuple[int, float]]:
    """Per layer of ``model`` (kept per model), ``(attention window, KV bytes per token)``
    (:meth:`~sim.model.specs.ModelSpec.attn_window`,
    :meth:`~sim.model.specs.ModelSpec.kv_bytes_per_token`)."""
    cache = _model_cache(model)
    got = cache.get("layer_kv")
    if got is None:
        got = cache["layer_kv"] = [(model.attn_window(i), model.kv_bytes_per_token(i)) for i in range(model.n_layer)]
    return got


def _tensor_table(model: ModelSpec) -> tuple[np.ndarray, np.ndarray, list, np.ndarray, np.ndarray] | None:
    """Per model (kept): its tensors' bytes and layers ((T,) int64 each), and its weight groups
    (:func:`weight_groups`) with their tensors' positions in ``model.tensors`` ((G, width)
    int64, -1 pad) and bytes ((G,) int64); None when a tensor object appears twice in
    ``model.tensors`` (positions would not name it) or the bytes could not be summed exactly
    as floats (2**53 or more)."""
    cache = _model_cache(model)
    if "tensor_table" not in cache:
        tensors = model.tensors
        pos = {id(t): i for i, t in enumerate(tensors)}
        nb = np.array([t.nbytes for t in tensors], dtype=np.int64)
        got = None
        if len(pos) == len(tensors) and sum(t.nbytes for t in tensors) < 2**53:
            groups = weight_groups(model)
            width = max((len(g) for g in groups), default=1)
            gpos = np.array([[pos[id(t)] for t in g] + [-1] * (width - len(g)) for g in groups],
                            dtype=np.int64).reshape(len(groups), width)
            gbytes = np.array([sum(t.nbytes for t in g) for g in groups], dtype=np.int64)
            got = (nb, np.array([t.layer for t in tensors], dtype=np.int64), groups, gpos, gbytes)
        cache["tensor_table"] = got
    return cache["tensor_table"]


def host_flags(model: ModelSpec, placement: Placement) -> tuple[bool, ...]:
    """``placement.host_resident(model, t)`` for each of ``model.tensors`` in order, computed
    once per (model, placement) and kept."""
    cache = _model_cache(model)
    key = ("host", placement)
    got = cache.get(key)
    if got is None:
        if len(cache) > 256:
            cache.clear()
        got = cache[key] = tuple(placement.host_resident(model, t) for t in model.tensors)
    return got


def weight_groups(model: ModelSpec) -> list[tuple[Tensor, ...]]:
    """The weights each weight op of a graph reads, grouped as :func:`sim.plan.builder.graph_items`
    emits them (fused q/k/v, shared-expert gate+up, one group per other matrix): a host split
    copies a whole group, so staging and split-input buffers are sized by groups. Norms, biases
    and other tensors no op reads (:attr:`sim.model.specs.Tensor.is_matrix`) are in no group.
    Computed once per model (a new list each call)."""
    cache = _model_cache(model)
    got = cache.get("groups")
    if got is None:
        got = cache["groups"] = _weight_groups(model)
    return list(got)


def _weight_groups(model: ModelSpec) -> list[tuple[Tensor, ...]]:
    out: list[tuple[Tensor, ...]] = []
    by_layer: dict[int, list[Tensor]] = {}
    for t in model.tensors:
        if t.is_matrix:
            by_layer.setdefault(t.layer, []).append(t)
    for layer, ts in by_layer.items():
        fused = {"attn_q": ("qkv", False), "attn_k": ("qkv", False), "attn_v": ("qkv", False)}
        groups: dict[tuple[str, bool], list[Tensor]] = {}
        for t in ts:
            key = fused.get(t.group, (t.name, t.duplicate))
            if t.name.endswith(("ffn_gate_shexp.weight", "ffn_up_shexp.weight")):
                key = ("shexp_gate_up", False)
            groups.setdefault(key, []).append(t)
        out.extend(tuple(g) for g in groups.values())
    return out


#: llama.cpp pads a context's size, and so its KV cache, to a multiple of this many cells
#: (``llama_context``: ``cparams.n_ctx = GGML_PAD(cparams.n_ctx, 256)``; the SWA cache of an iSWA
#: model likewise, ``llama_kv_cache_iswa``)
KV_CELLS_PAD = 256


def kv_cells(ctx_size: int, window: int, n_ubatch: int) -> int:
    """Cells of one layer's KV cache as llama.cpp allocates them: ``ctx_size`` padded to
    :data:`KV_CELLS_PAD`; a sliding-window layer (``window`` > 0) holds
    ``pad(min(that, window + n_ubatch))`` (``llama_kv_cache_iswa``: ``n_swa + n_ubatch``)."""
    pad = lambda n: -(-int(n) // KV_CELLS_PAD) * KV_CELLS_PAD  # noqa: E731
    base = pad(max(1, ctx_size))
    return pad(min(base, window + n_ubatch)) if window else base


def expert_slot_bytes(tensors: Iterable[Tensor]) -> int:
    """Bytes of one expert staging slot (``--prefetch-experts-slots``) on a GPU whose staged
    host weights are ``tensors``: the largest expert tensor among them (``Tensor.nbytes`` of a
    ``*_exps`` matrix, all its experts, each tensor with its own ggml type, so that per-layer
    types count: Q4_K_M's Q6_K ``ffn_down_exps``, the Q6_K layers of Qwen3's ``use_more_bits``
    rule). A slot holds any expert tensor it may be asked to stage. 0 without expert tensors.

    The one formula for a slot's size: :func:`staging_bytes` reserves N of these and the plan
    builder (:mod:`sim.plan.builder`) allocates its slots with it (``Op.slot_bytes``), through
    :attr:`VramBreakdown.expert_slot_bytes`."""
    return max((t.nbytes for t in tensors if t.is_expert and t.is_matrix), default=0)


def staging_bytes(variant: Variant, host_groups: list[tuple[Tensor, ...]]) -> float:
    """Staging reservation of a variant on one GPU, given the host-resident weight groups whose
    ops run there: 2 × the largest group for weight prefetch, N × :func:`expert_slot_bytes` for
    expert slots."""
    out = 0.0
    if variant.prefetch_weights:
        out += 2 * max((sum(t.nbytes for t in g) for g in host_groups), default=0)
    if variant.expert_slots:
        out += variant.expert_slots * expert_slot_bytes(t for g in host_groups for t in g)
    return float(out)


def account(scn: Scenario, variant: Variant, placement: Placement | None = None, *,
            layer_dev: list[int] | None = None) -> list[VramBreakdown]:
    """VRAM per GPU for a scenario under a variant (module docstring: the order of assignment).

    ``layer_dev``: :func:`layer_devices` of the model, placement and GPUs when the caller has
    it (not modified), else None (computed here).

    Returns:
        One :class:`VramBreakdown` per GPU. With an expert cache its pool is the VRAM left on each
        GPU (:attr:`VramBreakdown.cache_pool_bytes`), minus the fit target with
        ``expert_cache = "fit"``; the cache holds whole entries of it (an entry: one expert of one
        layer, the largest layer's, :func:`expert_bytes`), at most ``placement.expert_cache_experts``
        and at most the host-resident experts (:func:`host_experts`)
        when that is a count.

    Raises:
        VramOverflowError: the placement does not fit (names ``placement`` in the scenario file;
            carries the GPU's breakdown); PlacementError: a fitted cache has no room for one entry
            on any GPU (names ``placement.fit_target_mib``).
    """
    model, hw = scn.model, scn.hardware
    pl = placement or scn.placement
    devs = layer_devices(model, pl, hw.n_gpu) if layer_dev is None else layer_dev
    out_dev = output_device(model, pl, hw.n_gpu)
    # host residency per tensor, by position (a tied output head shares token_embd's name)
    on_host = host_flags(model, pl)
    table = _tensor_table(model)
    if table is not None:
        # the same, from the model's arrays: a group is host when one of its tensors is; the
        # weights of a GPU an integer sum (every partial float sum of the loop is exact)
        nb, t_layer, groups, gpos, gbytes = table
        flags = np.zeros(nb.size + 1, dtype=bool)     # [-1]: padding
        flags[:-1] = on_host
        g_host = flags[gpos].any(axis=1) & (t_layer[gpos[:, 0]] >= 0) if gpos.size else np.zeros(0, dtype=bool)
        at = np.flatnonzero(g_host)
        host_groups = [groups[k] for k in at.tolist()]
        dev_arr = np.asarray(devs + [-1], dtype=np.int64)
        t_dev = np.where(t_layer >= 0, dev_arr[np.where(t_layer >= 0, t_layer, -1)], -2)   # -2: outside blocks
        resident = ~flags[:-1]
        host_gpu = np.maximum(t_dev[gpos[at, 0]], 0).tolist()   # gpu_of: the group's layer's GPU
        host_bytes = gbytes[at].tolist()
    else:
        host_ids = {id(t) for t, h in zip(model.tensors, on_host) if h}
        # host weight groups whose ops may be offloaded (token_embd is read by get_rows on the
        # CPU; a host-resident output head has a batch of one row and runs on the CPU)
        host_groups = [g for g in weight_groups(model)
                       if g[0].layer >= 0 and any(id(t) in host_ids for t in g)]

    def gpu_of(group: tuple[Tensor, ...]) -> int:
        return max(devs[group[0].layer], 0)  # the layer's GPU (GPU 0 if the layer is not offloaded)
    if table is None:
        host_gpu = [gpu_of(grp) for grp in host_groups]
        host_bytes = [sum(t.nbytes for t in grp) for grp in host_groups]
    out = []
    n_ub = scn.workload.n_ubatch
    # the worst-case graph the context reserves its compute buffer (and the patch its staging)
    # on: llama_context clamps n_batch to n_ctx (before padding n_ctx) and n_ubatch to n_batch,
    # then reserves min(n_ctx, n_ubatch) tokens (llama_context::graph_reserve)
    reserve_tokens = max(1, min(n_ub, scn.workload.n_batch, pl.ctx_size))
    offloads = reserve_tokens >= pl.op_offload_min_batch   # ops with host weights run on the GPU
    for g in range(hw.n_gpu):
        w = 0.0
        kv = 0.0
        if table is not None:
            on_g = (t_dev == g) | ((t_dev == -2) & (g == out_dev))
            w = float(nb[resident & on_g].sum())
        else:
            for t, h in zip(model.tensors, on_host):
                if h:
                    continue
                if t.layer >= 0 and devs[t.layer] == g:
                    w += t.nbytes
                elif t.layer < 0 and g == out_dev:
                    w += t.nbytes
        for d_i, (win, per_tok) in zip(devs, _layer_kv(model)):
            if d_i == g:
                kv += per_tok * kv_cells(pl.ctx_size, win, min(n_ub, scn.workload.n_batch))
        idle = g != out_dev and g not in devs and g not in host_gpu   # no op of the graph runs here
        if scn.compute_buffer_bytes is not None:
            comp = scn.compute_buffer_bytes
        elif idle:
            comp = 0.0   # the scheduler reserves no compute buffer for a GPU that runs nothing (-sm none)
        else:
            widest = model.d_model
            if model.moe:
                widest = max(widest, model.moe.n_ff_exp * model.moe.n_expert_used, model.moe.n_ff_shexp)
            widest = max(widest, model.n_ff, model.n_head * model.head_dim)
            comp = 4.0 * reserve_tokens * (ACT_ELEMS_FACTOR * model.d_model + 2 * widest)
            if not pl.flash_attn and g in devs:
                # without FlashAttention a layer's f32 scores, n_kv x tokens x n_head, are a tensor
                # of the graph (one layer's at a time: the allocator reuses it)
                comp += 4.0 * kv_cells(pl.ctx_size, 0, 1) * reserve_tokens * model.n_head
            offl = [b for b, gg in zip(host_bytes, host_gpu) if gg == g]
            if offl and offloads:
                comp += max(offl)  # a copy of the largest host weight group offloaded to this GPU
            if g == (out_dev if pl.output_on_gpu() else 0 if offloads else -1):
                # the worst-case graph outputs every token (llama_context reserves n_outputs =
                # min(n_tokens, n_outputs_max = n_batch)): the head's f32 logits and its normed
                # input, live together at the graph's end, on the output layer's GPU (or, with the
                # output layer on the host, the first GPU, where the head is offloaded from the
                # op-offload batch on)
                comp = max(comp, 4.0 * reserve_tokens * (model.n_vocab + model.d_model))
        # staging lives on the GPU that runs the offloaded ops: the layer's GPU (GPU 0 for
        # layers that are not offloaded); the patch reserves it on the worst-case graph, where no
        # weight crosses below the op-offload batch, nor in any later graph (measured: Gemma tg16,
        # data/llamacpp/h200-20261202-prefetch2)
        here = [grp for grp, gg in zip(host_groups, host_gpu) if gg == g]
        stg = staging_bytes(variant, here) if offloads else 0.0
        slot = expert_slot_bytes(t for grp in here for t in grp) if variant.expert_slots else 0
        out.append(VramBreakdown(g, hw.vram_bytes, hw.vram_reserved_bytes, w, kv, comp, stg, expert_slot_bytes=slot))
    for b in out:
        if b.total_bytes > b.capacity_bytes:
            needs = _needs_text(b, variant, pl.ctx_size)
            raise VramOverflowError(
                f"{needs}; "
                + ("use fewer staging slots or no prefetch, or " if b.staging_bytes else "")
                + "raise placement.n_cpu_moe, lower placement.ngl, the context (ctx_size, or the "
                "tests' depth + tokens), or add placement.override_tensor rules (llama.cpp's -ot)",
                file=scn.file, field="placement", breakdown=b, ctx_size=pl.ctx_size, needs=needs)
    check_host_memory(scn, pl, on_host, devs)
    if pl.fit_experts and pl.fit_target_mib:
        # the n_cpu_moe fit leaves the fit target free (fit_n_cpu_moe reads it)
        out = [replace(b, fit_margin_bytes=pl.fit_margin_bytes(b.device)) for b in out]
    # expert cache pool: what is left (minus the fit target for a fitted pool), split over GPUs
    if variant.expert_cache != "none" and model.moe is not None:
        want = pl.expert_cache_experts
        eb = max((expert_bytes(model, i) for i in range(model.n_layer) if model.is_moe_layer(i)), default=0)
        fit = variant.expert_cache == "fit"
        out = [replace(b, fit_margin_bytes=pl.fit_margin_bytes(b.device) if fit else b.fit_margin_bytes,
                       cache_fit=fit) for b in out]
        out = [replace(b, cache_pool_bytes=max(b.free_bytes - (b.fit_margin_bytes if fit else 0.0), 0.0))
               for b in out]
        if fit and (not eb or all(b.cache_pool_bytes < eb for b in out)):
            raise PlacementError(_nothing_left(out, eb, variant, pl), file=scn.file, field="placement.fit_target_mib")
        if eb:
            # a GPU caches the host experts of the layers it computes, none of another GPU's
            # (each GPU's cache is its own: sim.plan.builder.make_context)
            mine = [0] * len(out)
            for layer in host_expert_layers(model, pl):
                mine[cache_device(devs, layer)] += model.moe.n_expert
            caps = [min(int(b.cache_pool_bytes // eb), mine[i]) for i, b in enumerate(out)]
            limit = host_experts(model, pl)  # nothing beyond the host-resident experts to hold
            n_cache = min(sum(caps), limit if want in (-1, 0) else min(want, limit))
            per = _fill(n_cache, caps)
            out = [replace(b, cache_experts=c, cache_bytes=c * eb) for b, c in zip(out, per)]
    return out


def _needs_text(b: VramBreakdown, variant: Variant, ctx_size: int, fit_target: bool = False) -> str:
    """The overflow of GPU ``b`` without advice (``does not fit on GPU 0: needs 56.02 GiB (weights
    ...) of 24.00 GiB``), with the fit target beside the components when ``fit_target``."""
    who = "" if variant.is_baseline else f" with variant {variant.name!r}"
    free = " with the fit target free" if fit_target else ""
    target = f" and fit target {b.fit_margin_bytes / GiB:.2f} GiB" if fit_target else ""
    return (f"does not fit{who} on GPU {b.device}{free}: needs {b.total_bytes / GiB:.2f} GiB (weights "
            f"{b.weights_bytes / GiB:.2f}, KV {b.kv_bytes / GiB:.2f} for {ctx_size} tokens, compute "
            f"{b.compute_bytes / GiB:.2f}, staging {b.staging_bytes / GiB:.2f}, reserved "
            f"{b.reserved_bytes / GiB:.2f}){target} of {b.capacity_bytes / GiB:.2f} GiB")


def check_host_memory(scn: Scenario, pl: Placement, on_host, devs) -> None:
    """Refuse a placement whose host-resident weights (``on_host``: :func:`host_flags`, the token
    embedding included) and the KV cache of the layers left on the CPU (``devs`` -1) exceed the
    host's RAM, where the profile knows it (``host_memory_gb``; llama.cpp would fail to allocate
    its host buffers, or with a mapped file read the weights from disk at every token, which is not
    modelled). Nothing when the profile has no ``host_memory_gb``.

    Raises:
        PlacementError: naming ``placement`` and the sizes.
    """
    cap = getattr(scn.hardware, "host_memory_bytes", 0.0)
    if not cap:
        return
    model = scn.model
    weights = float(sum(t.nbytes for t, h in zip(model.tensors, on_host) if h and not t.duplicate))
    kv = float(sum(per_tok * kv_cells(pl.ctx_size, win, scn.workload.n_ubatch)
                   for d, (win, per_tok) in zip(devs, _layer_kv(model)) if d < 0))
    if weights + kv > cap:
        raise PlacementError(f"the host holds {(weights + kv) / GiB:.2f} GiB (weights {weights / GiB:.2f}, KV of the "
                             f"CPU layers {kv / GiB:.2f}), more than the {cap / GiB:.2f} GiB of host memory of "
                             f"hardware '{scn.hardware.name}' (host_memory_gb): put more on the GPUs, or a smaller "
                             "model", file=scn.file, field="placement")


def _nothing_left(out: list[VramBreakdown], eb: int, variant: Variant, pl: Placement) -> str:
    """The message of a fitted expert cache with no room for one entry on any GPU."""
    per = "; ".join(f"GPU {b.device}: {b.free_bytes / 2**20:.0f} MiB free after weights "
                    f"{b.weights_bytes / GiB:.2f} GiB, KV {b.kv_bytes / GiB:.2f}, compute {b.compute_bytes / GiB:.2f}, "
                    f"staging {b.staging_bytes / GiB:.2f}, reserved {b.reserved_bytes / GiB:.2f}, "
                    f"fit target {b.fit_margin_bytes / 2**20:.0f} MiB" for b in out)
    return (f"variant {variant.name!r}: expert_cache = 'fit' leaves no room for one expert "
            f"({eb / 2**20:.2f} MiB) on any GPU ({per}); lower placement.fit_target_mib (llama.cpp's -fitt), "
            "raise placement.n_cpu_moe or use fewer staging slots")


def _fill(n: int, caps: list[int]) -> list[int]:
    """Spread ``n`` cache entries over GPUs in proportion to their free room, never above it."""
    total = sum(caps)
    if total == 0:
        return [0] * len(caps)
    per = [min(c, n * c // total) for c in caps]
    i = 0
    while sum(per) < n:
        if per[i % len(caps)] < caps[i % len(caps)]:
            per[i % len(caps)] += 1
        i += 1
    return per


def fit_n_cpu_moe(scn: Scenario, variant: Variant) -> int:
    """Smallest ``n_cpu_moe`` whose placement fits with the variant's staging reserved
    (llama.cpp ``--fit``-style automatic placement). Starts from the scenario's ``n_cpu_moe``.
    With ``placement.fit_target_mib`` given (llama-bench's ``-fitt``) every GPU must also keep
    the fit target free; for a fitted expert cache (``expert_cache = "fit"``) the placement must
    leave the fit target plus one cache entry free (:func:`account` raises otherwise).

    Raises:
        PlacementError: even all experts on the host do not fit (a
            :class:`sim.errors.VramOverflowError` naming ``placement`` where the fit target is
            what does not fit).
    """
    model = scn.model
    last_err = None
    for n in range(scn.placement.n_cpu_moe, model.n_layer + 1):
        pl = replace(scn.placement, n_cpu_moe=n)
        try:
            vram = account(scn, variant, pl)
        except PlacementError as exc:
            last_err = exc
            continue
        short = next((b for b in vram if b.free_bytes < b.fit_margin_bytes), None) if pl.fit_target_mib else None
        if short is None:
            return n
        needs = _needs_text(short, variant, pl.ctx_size, fit_target=True)
        last_err = VramOverflowError(
            f"{needs}; lower the fit target (placement.fit_target_mib, llama.cpp's -fitt), the context "
            "(ctx_size, or the tests' depth + tokens), or use fewer staging slots or no prefetch",
            file=scn.file, field="placement", breakdown=short, ctx_size=pl.ctx_size, needs=needs)
    assert last_err is not None
    raise last_err
