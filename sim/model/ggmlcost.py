"""llama.cpp's own kernel times: the cost model of a profile calibrated on ggml.

A hardware profile with a ``[ggml]`` table (``scenarios/hardware/h200-llamacpp.toml``) prices
the plan's compute ops from ``test-backend-ops perf`` tables measured with llama.cpp itself
(the models' own shapes and ggml types, :mod:`calibrate.llamacpp.perf_cases`) instead of a
cuBLAS f16 roofline and numpy matvecs. The formulas, with their sources:

* **Weight matmul** (``MUL_MAT``) of ``n`` tokens on a weight of type ``T`` and shape
  ``(m, k)``:

  - ``n > MMVQ_MAX_BATCH`` (8; ggml-cuda's ``MMVQ_MAX_BATCH_SIZE``: above it MMQ runs): the
    measured time of that (type, m, k) at ``n``, interpolated log-log between the measured token
    counts (linear in ``n`` beyond the largest). A shape the table lacks is scaled from the
    nearest measured shape of the same type by ``m·k`` among those measured above 8 tokens
    (the output heads' cases hold one token: a matvec, not the MMQ kernel).
  - ``n <= 8`` (a matvec): ``2 · floor`` (its q8_1 activation quantisation and the MMVQ kernel,
    two kernels) ``+ max(0, bytes / cold_rate(T) - floor)``. ``test-backend-ops`` repeats one op
    on one weight, which then stays in the 50 MB L2 and is launch-bound; in a decode graph
    every layer reads other weights from HBM and the kernels run back to back in a CUDA graph.
    ``cold_rate(T)`` is measured on cold cases (a ``MUL_MAT`` at one token over ``bs`` distinct
    matrices, enough to exceed the L2); ``floor`` is the per-kernel time in a decode graph, fitted on the fit rows
    (``calibrate.llamacpp.fit``). A weight larger than the L2 is read cold by the table's
    repetitions too: its measured time is used when it is larger (the matvec's rate depends on
    the shape as well as the type), from the table's matvec cases alone (1 and 4 tokens: log-log
    between them, beyond 4 linear in ``n`` along their slope, :func:`_at_matvec`); the 16-token
    case is MMQ's, another kernel, and interpolating towards it priced Gemma's 8-token FFNs a
    quarter below ``mul_mat_vec_q``'s (``data/llamacpp/h100-20261207-ubheld``).
* **Expert matmul** (``MUL_MAT_ID``), ``n`` tokens, top-k: the measured curve of (type, m, k) as
  above (the test draws router ids uniformly, as the routing check found llama.cpp's copies to
  be); ``n <= 8``: ``2 · floor + max(0, used-expert bytes / cold_rate - floor)``. Another
  model's shape is scaled by ``m·k·top-k``.
* **A weight type the tables have no case of** (:meth:`GgmlKernels.proxy_mix`): priced from
  measured types of its family, not from the generic roofline (which put a Q5_K or Q8_0 MoE
  prefill 2-2.5x above Q4_K's): a K-quant from Q4_K and Q6_K, log-interpolated on bits per
  weight (Q2_K and Q3_K as Q4_K); the legacy block types (Q4_0 ... Q5_1) from Q8_0; i-quants
  and ternary types from Q4_K. An expert matmul of a type whose family has no ``MUL_MAT_ID``
  case (Q8_0's) is Q4_K's expert curve times the family's dense ``MUL_MAT`` over Q4_K's at the
  same shape and tokens. Among the measured types the time per weight at one shape differs by
  up to 25 % (MMQ at 512-4096 tokens: Q6_K 1.14-1.25x Q4_K, Q8_0 0.78-0.91x), the size of error
  to expect from a proxy; float weights (F16, BF16) keep the roofline (cuBLAS runs them).
* **Attention**: FlashAttention (``-fa 1``) from the ``FLASH_ATTN_EXT`` table of the head
  geometry, or the unfused ``KQ``, ``SOFT_MAX`` and ``KQV`` of ``-fa 0`` (plus two permute
  copies of the output priced as elementwise passes), at ``kv`` = keys attended (cached plus
  new, a sliding window capped at window + ubatch) padded to 256 (llama.cpp's KV padding);
  linear in ``kv`` at a measured token count, log-log between token counts
  (:func:`interp_nb_kv`). Another geometry is scaled by ``n_head · head_dim``.
* **Elementwise kernels of a layer** (norms, RoPE, KV store, residual adds, the GLU, the
  router's top-k and the weighted sum of the experts): ``kernels · max(floor, bytes / (kernels ·
  ew_rate))`` with the kernel count and f32 bytes from the architecture (:func:`layer_elementwise`);
  ``ew_rate`` is measured: the elementwise kernels' time in an ``ncu`` profile of a real
  llama-bench prefill over their bytes. They are priced with the layer's attention op.
* **CPU backend** (ops on host weights below the op-offload batch, layers ``-ngl`` leaves on the
  CPU): ``cpu_op + max(bytes / (cpu_rate_scale · cpu_cold_rate(T)), 2·n·m·k / cpu_flops)``, the
  cold rate measured on cold cases over matrices totalling 2 GiB with llama-bench's thread
  count. ``cpu_rate_scale`` is the CPU backend's throughput inside a llama-bench decode graph
  relative to that isolated case, fitted on the fit rows: timed split by split in llama-bench
  itself (the ``split-time`` patch, ``data/llamacpp/h200-20261202-splits``), the CPU splits of
  decode take 1.6–2.1x what the cold rates give, on every model. CPU attention from the CPU
  ``FLASH_ATTN_EXT`` table (dense models' geometry), else the FLOP roofline.
* **Single-threaded CPU ops**: ggml-cpu runs ``GET_ROWS`` and ``SET_ROWS`` on one thread
  (``ggml_graph_plan``: ``n_tasks = 1``). The token embedding's ``GET_ROWS`` (llama.cpp keeps
  ``token_embd`` on the CPU whatever ``-ngl``) costs ``n_tokens · d_model · 4 /
  cpu_get_rows_rate`` per graph, then its rows cross to the GPU (pinned); a layer left on the
  CPU writes its new K/V into its CPU KV cache with ``SET_ROWS`` at ``cpu_set_rows_rate`` (f32
  bytes), both rates measured with the ``split-time`` patch (:mod:`calibrate.llamacpp.splittime`).
* **Cold K/V**: a ``FLASH_ATTN_EXT`` case repeats one layer's attention with its K/V in the L2
  (when they fit); a graph reads each layer's from HBM: ``kv_bytes / attn_kv_cold_rate`` more
  (:meth:`GgmlKernels.kv_cold_s`), added to each such measured case before interpolating
  between cases (so the price rises through the L2's size), the rate measured from ``ncu`` of
  llama-bench decode at depth 8192 (``data/llamacpp/h200-20261202-depth``: 19.1 µs per layer in
  the graph against the table's 12.4).
* **2-8 tokens on the GPU** (:mod:`calibrate.llamacpp.smallbatch`: ``ncu`` of llama-bench
  prompts at ubatch 1, 2, 4 and 8, each kernel in the graph): ggml-cuda changes kernels between
  one token and a few, which the tables (1 and 64 tokens for attention, no f32 case) do not see.
  FlashAttention's vector kernel runs one query token only (``ggml_cuda_get_best_fattn_kernel``
  on Hopper with f16 K/V); from two the mma kernel and its stream-k fixup run: at ``n`` tokens
  the price is at least the one-token price at the same keys plus ``fa_extra(n)`` (measured at
  2, 4 and 8, linear between, scaled by ``n_head * head_dim / 4096``; measured on Qwen3, whose
  grouped-query ratio is 8: the kernel packs a KV head's query heads into its columns, and Gemma's,
  at ratio 2, is 2.8-3.3 µs at 2-8 tokens, ``data/llamacpp/h100-20261207-gemmancu``, so keying it
  on tokens x ratio is the better rule, not yet made). An f32 weight (the MoE
  router) runs ``mul_mat_vec_f`` up to :data:`MMVF_MAX_COLS_F32` columns and ``mul_mat_f`` above
  (``ggml_cuda_should_use_mmvf``): from 4 to 8 tokens ``f32_mmf`` per matmul, measured. A
  quantised matvec whose weight fits the L2 (a larger one takes the table's time at ``n``, which
  holds the same growth) adds ``(n - 2) * m * k / matvec_column_rate`` to its weight read: each
  column beyond the second adds its dot products (flat from one to two in the graph). Without
  these numbers (0) the prices are those of one token's kernels.
* **CPU attention** skips masked cells (ggml-cpu's FlashAttention loop tests each mask value):
  the table's full-rectangle time times the share of causal (query, key) pairs.
* **Scheduler overheads**: ``graph`` seconds of host time per graph (ubatch), ``mask`` seconds
  per KQ-mask entry the host fills for it (:func:`mask_entries`) and ``split`` seconds per
  split, fitted on llama-bench's fit rows (``calibrate.llamacpp.fit``).

Units: seconds and bytes unless a name says otherwise.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from pathlib import Path
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Mapping

import numpy as np
import pandas as pd
from sim.wording import plural

#: ggml-cuda's ``MMVQ_MAX_BATCH_SIZE``: MUL_MAT / MUL_MAT_ID with at most this many tokens run
#: the matvec kernel (``mmvq.cu``), larger batches MMQ
MMVQ_MAX_BATCH = 8

#: the measured types an untabled quantised type is priced from, by family (module docstring,
#: :meth:`GgmlKernels.proxy_mix`): K-quants, the legacy 32-weight block types, the rest
PROXY_K = ("Q4_K", "Q6_K")
PROXY_LEGACY = ("Q8_0",)
PROXY_OTHER = ("Q4_K",)
LEGACY_TYPES = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1"})
#: float types: no proxy (ggml-cuda runs them through cuBLAS / its float kernels: the roofline)
FLOAT_TYPES = frozenset({"F32", "F16", "BF16", "F64"})
#: llama.cpp pads the KV cells a graph attends to a multiple of 256 (``llama_kv_cache::get_padding``
#: with flash attention; the grid's every row uses it)
KV_PAD = 256
#: ops of a kernel table and the columns each needs (>= 1)
TABLE_OPS = {"MUL_MAT": ("m", "n", "k", "bs", "nr"), "MUL_MAT_ID": ("m", "n", "k"),
             "MUL_MAT_B": ("m", "n", "k", "bs", "nr"), "FLASH_ATTN_EXT": ("hd", "nh", "nkv", "kv", "nb"),
             "SOFT_MAX": ("kv", "nb", "nh")}
#: columns of a kernel table (one row per timed case; blank where a case has no such field)
TABLE_COLUMNS = ("backend", "op", "type", "m", "n", "k", "bs", "nr", "hd", "nh", "nkv", "kv", "nb", "t_us")


@dataclass(frozen=True)
class GgmlKernels:
    """Measured llama.cpp kernel tables and the fitted scheduler overheads of a profile.

    Attributes:
        gpu: GPU kernel table (:data:`TABLE_COLUMNS`).
        cpu: CPU-backend kernel table (same columns), or None.
        l2_bytes: the GPU's L2 cache (bytes; H200: 50 MiB, NVIDIA's datasheet).
        floor_s: time of one small kernel in a graph (s), fitted.
        ew_bytes_per_s: elementwise kernels' rate (bytes/s), measured (ncu).
        cpu_op_s: fixed time of one CPU-backend op (s), measured (CPU table intercept).
        cpu_ew_bytes_per_s: CPU elementwise rate (bytes/s).
        graph_s: host time per graph (s), fitted.
        launch_s: GPU time per kernel of a graph llama.cpp builds anew (s): such a graph runs
            without a CUDA graph (ggml-cuda captures one only after two calls of the same graph),
            its kernels launched one by one with the GPU idle between them; fitted, times
            :func:`graph_kernels`, paid on the graph's GPU ops. A reused graph replays its CUDA
            graph (0).
        mask_s: host time per KQ-mask entry visited (s), measured with the ``phase-time`` patch
            (:func:`mask_entries`, :mod:`calibrate.llamacpp.phasetime`).
        call_s, call_per_token_s: host time of one ``llama_decode`` call before its first ubatch
            (batch checks, the memory's ubatch split and slot search): ``call_s + call_per_token_s
            * tokens`` (s), measured (phase-time).
        apply_per_token_s: the memory context's apply per ubatch token (s), measured (phase-time).
        build_per_layer_s: graph build and the scheduler's split and allocation of a graph
            llama.cpp does not reuse, per model layer (s), measured (phase-time).
        capture_per_layer_s: host time of capturing and instantiating a reused graph's CUDA
            graph, per model layer (s), measured (phase-time: the first timed repetition of a
            one-ubatch prompt against the later ones). ggml-cuda captures a graph on its second
            call with unchanged properties: llama-bench's warm-up runs it directly, its first
            repetition captures it, the later ones replay it. Priced on a test's first graph,
            spread over llama-bench's repetitions.
        split_s: host time per split (s): the scheduler's work per split (its inputs' copy
            calls, events, the backend switch) and, for a split on a GPU, the launch of its graph;
            measured on llama-bench's GPU splits (split timing:
            :func:`calibrate.llamacpp.splittime.gpu_split_host`) or fitted (``fit --params
            split_us``). A CPU split's is :attr:`cpu_split_host_s`.
        cpu_split_s: host time per split on the CPU backend (s), fitted, or None: ``split_s``
            (:attr:`cpu_split_host_s`). Besides the scheduler's work, ggml-cpu plans the split's
            graph and wakes its thread pool, whose threads meet at a barrier after every node
            (``ggml_graph_compute``), so a CPU split's fixed cost is not a GPU split's: the split
            timing of llama-bench shows GPU splits' host time at 11-36 us in decode and prefill
            (``data/llamacpp/h200-20261201-splits``), while the decode rows with every layer's
            experts on the CPU need more per CPU split.
        cpu_rate_scale: CPU matvec throughput in a llama-bench graph relative to the cold
            rates of the CPU table (dimensionless), fitted; 1 when the profile does not say.
        cpu_get_rows_bytes_per_s: one-thread GET_ROWS rate (f32 bytes out per s), measured; 0:
            the token embedding is not priced.
        cpu_set_rows_bytes_per_s: one-thread SET_ROWS rate (f32 bytes in per s), measured; 0: not
            priced.
        attn_kv_cold_bytes_per_s: rate of the cold K/V read a graph's attention pays on top of the
            table's L2-hot case (bytes/s), measured (:meth:`kv_cold_s`); 0: not priced.
        fa_extra_s: FlashAttention's time per layer above its one-token time at 2, 4 and 8 query
            tokens (s, for a query :data:`FA_EXTRA_WIDTH` wide), measured in a graph
            (:mod:`calibrate.llamacpp.smallbatch`); zeros: not priced (module docstring).
        f32_mmf_s: one f32 matmul at :data:`MMVF_MAX_COLS_F32` + 1 to 8 columns (ggml-cuda's
            ``mul_mat_f``), s, measured; 0: the generic matmul price.
        matvec_column_macs_per_s: multiply-adds per second of each column of a quantised matvec
            beyond the second, in a graph, measured; 0: a matvec below the L2 does not grow with
            its columns.
        cpu_node_s: time of one weightless node of a CPU split in a llama-bench graph (s: its
            work and the thread pool's barrier after it), measured with the ``node-time`` patch
            (:mod:`calibrate.llamacpp.nodetime`: gpt-oss's expert bias ``ADD_ID`` and Qwen3's
            ``SWIGLU``, less their bytes at ``cpu_ew_bytes_per_s``); None: ``cpu_op_s`` (the
            CPU table's per-op intercept, measured on single matvecs outside a graph).
        cpu_glu_oai_elem_s: ``SWIGLU_OAI``'s time per output element on one thread beyond a
            plain node (s), measured (node-time: gpt-oss's GLU, whose clamped, scaled sigmoid
            ggml-cpu computes element by element); ggml-cpu splits a GLU's rows (``top-k x
            tokens``) over its threads. 0: not priced.
        sources: field -> where the number came from.
    """

    gpu: pd.DataFrame
    cpu: pd.DataFrame | None
    l2_bytes: float
    floor_s: float
    ew_bytes_per_s: float
    cpu_op_s: float
    cpu_ew_bytes_per_s: float
    graph_s: float
    split_s: float
    mask_s: float = 0.0
    launch_s: float = 0.0
    call_s: float = 0.0
    call_per_token_s: float = 0.0
    apply_per_token_s: float = 0.0
    build_per_layer_s: float = 0.0
    capture_per_layer_s: float = 0.0
    cpu_rate_scale: float = 1.0
    cpu_get_rows_bytes_per_s: float = 0.0
    cpu_set_rows_bytes_per_s: float = 0.0
    attn_kv_cold_bytes_per_s: float = 0.0
    fa_extra_s: tuple[float, float, float] = (0.0, 0.0, 0.0)
    f32_mmf_s: float = 0.0
    matvec_column_macs_per_s: float = 0.0
    cpu_split_s: float | None = None
    cpu_node_s: float | None = None
    cpu_glu_oai_elem_s: float = 0.0
    sources: Mapping[str, str] = field(default_factory=dict)

    @property
    def cpu_split_host_s(self) -> float:
        """Host time of one split on the CPU backend (s): ``cpu_split_s``, else ``split_s``."""
        return self.split_s if self.cpu_split_s is None else self.cpu_split_s

    @property
    def has_graph_host_work(self) -> bool:
        """Whether the profile prices any of llama.cpp's host work per graph (the builder then
        emits the graph's ``graph_overhead`` op, priced in :func:`sim.model.costs.ggml_duration_s`)."""
        return any(v > 0 for v in (self.graph_s, self.call_s, self.call_per_token_s, self.apply_per_token_s,
                                   self.build_per_layer_s, self.capture_per_layer_s))

    # ---------------------------------------------------------------- derived tables
    @cached_property
    def _curves(self) -> dict:
        """(backend, op, type, m, k) -> (log n, log t) of the weight and expert matmuls."""
        out = {}
        for name, tab in (("gpu", self.gpu), ("cpu", self.cpu)):
            if tab is None:
                continue
            t = tab[tab["op"].isin(["MUL_MAT", "MUL_MAT_ID"]) & (tab["bs"].fillna(1) == 1)]
            for (op, ty, m, k), g in t.groupby(["op", "type", "m", "k"]):
                g = g.groupby("n")["t_us"].median().sort_index()
                out[(name, op, ty.upper(), int(m), int(k))] = (np.log(g.index.to_numpy(float)),
                                                               np.log(g.to_numpy(float) * 1e-6))
        return out

    @cached_property
    def _cold(self) -> dict:
        """(backend, type) -> bytes/s of a matvec over weights that are not in the cache."""
        from sim.model.quant import ggml_nbytes

        out = {}
        for name, tab in (("gpu", self.gpu), ("cpu", self.cpu)):
            if tab is None:
                continue
            t = tab[(tab["op"] == "MUL_MAT") & (tab["bs"].fillna(1) > 1) & (tab["n"] == 1)]
            for _, r in t.iterrows():
                b = ggml_nbytes(str(r["type"]).upper(), int(r["m"]) * int(r["k"])) * int(r["bs"])
                out[(name, str(r["type"]).upper())] = b / (r["t_us"] * 1e-6)
        return out

    def cold_rate(self, backend: str, ggml_type: str) -> float:
        """Cold matvec rate (bytes/s) of a type; a type not measured gets the median of those
        measured on that backend.

        Raises:
            ValueError: no cold case was measured on ``backend``.
        """
        got = self._cold.get((backend, ggml_type.upper()))
        if got is not None:
            return got
        same = [v for (b, _t), v in self._cold.items() if b == backend]
        if not same:
            raise ValueError(f"the {backend} kernel table has no cold case (MUL_MAT at 1 token, bs > 1)")
        return float(np.median(same))

    @cached_property
    def _attn(self) -> dict:
        """:attr:`_attn_raw` with the GPU's attention cases made cold: each measured case whose
        K/V fit in the L2 (``test-backend-ops`` repeats it with its K/V hot there) gets the cold
        read a graph pays (:meth:`kv_cold_s` of its own geometry and key count; a ``KQ`` case the
        K half, a ``KQV`` case the V half), a case whose K/V exceed the L2 was read cold already.
        Interpolated between such points, the price rises with the keys through the L2's size:
        adding the cold read after interpolating the L2-hot and cold cases dropped it there
        (tg32 of Qwen3 at depth 25344 → 25600: 180 → 215 t/s). A hot case made dearer by its
        cold read than a later case measured cold is dropped (the correction is measured at 8448
        cells; at 16384 it overshoots Qwen3's and gpt-oss's cold 32768-cell cases, and lifting
        those to it made decode from 16k to 32k keys nearly free). Along the keys the prices are
        made non-decreasing, and one point is added a span beyond the last case so that the
        extrapolation to more keys costs at least their K/V at the cold rate (it had been flat
        past 32768 cells, where the last two cases' slope is not positive). The CPU's tables are
        as measured."""
        out = dict(self._attn_raw)
        if self.attn_kv_cold_bytes_per_s <= 0:
            return out
        for key, rows in self._attn_raw.items():
            backend, op = key[:2]
            if backend != "gpu" or op not in ("FA", "KQ", "KQV"):
                continue
            hd, _nh, nkv = key[2:]
            share = 1.0 if op == "FA" else 0.5
            cold = {}
            for nb, (kvs, ts) in rows.items():
                add = share * self.kv_cold_s(kvs, nkv, hd)
                t = ts + add
                # a hot case whose cold read makes it dearer than a case of more keys measured cold
                # is dropped: the direct measurement wins over the correction, which was measured at
                # 8448 cells (Qwen3 at 16384 cells 27.7 us against 26.9 measured at 32768: lifting
                # the later cases to it instead left decode from 16k to 32k keys nearly free)
                cold_after = np.minimum.accumulate(np.where(add > 0, np.inf, t)[::-1])[::-1]
                later = np.append(cold_after[1:], np.inf)
                keep = (add <= 0) | (t <= later)
                if keep.sum() >= 2:
                    kvs, t = kvs[keep], t[keep]
                # more keys never cost less (what is left of the tables' noise)
                t = np.maximum.accumulate(t)
                if len(kvs) >= 2:
                    # beyond the last case each further cell's K/V is read at the cold rate at least:
                    # a point one span further on, so the extrapolation's slope is never below it
                    span = float(kvs[-1] - kvs[-2])
                    floor = share * kv_cache_bytes(span, nkv, hd) / self.attn_kv_cold_bytes_per_s
                    kvs = np.append(kvs, kvs[-1] + span)
                    t = np.append(t, t[-1] + max(floor, t[-1] - t[-2]))
                cold[nb] = (kvs, t)
            out[key] = cold
        return out

    @cached_property
    def _attn_raw(self) -> dict:
        """(backend, op, hd, nh, nkv) -> {nb: (kv array, t array)} of the attention tables, as
        measured (the GPU's cases at up to the L2's size of K/V L2-hot)."""
        out: dict = {}
        for name, tab in (("gpu", self.gpu), ("cpu", self.cpu)):
            if tab is None:
                continue
            fa = tab[tab["op"] == "FLASH_ATTN_EXT"]
            for key, g in fa.groupby(["hd", "nh", "nkv"]):
                out[(name, "FA", *map(int, key))] = _rows(g["nb"], g["kv"], g["t_us"])
            sm = tab[tab["op"] == "SOFT_MAX"]
            for nh, g in sm.groupby("nh"):
                out[(name, "SOFT_MAX", int(nh))] = _rows(g["nb"], g["kv"], g["t_us"])
            mb = tab[(tab["op"] == "MUL_MAT_B") & (tab["type"].str.upper() == "F16")]
            if not mb.empty:
                # KQ: a (hd x kv) per KV head, m = kv, k = hd; KQV: m = hd, k = kv. A row is KQ when
                # its k is a head size and its m varies with kv (m == kv of its pair): both
                # roles are told apart by which of m/k repeats across the rows of a geometry
                for (bs, nr), g in mb.groupby(["bs", "nr"]):
                    hd_kq = g["k"].mode().iloc[0]
                    kq = g[g["k"] == hd_kq]
                    kqv = g[g["m"] == hd_kq]
                    nkv, nh = int(bs), int(bs * nr)
                    out[(name, "KQ", int(hd_kq), nh, nkv)] = _rows(kq["n"], kq["m"], kq["t_us"])
                    out[(name, "KQV", int(hd_kq), nh, nkv)] = _rows(kqv["n"], kqv["k"], kqv["t_us"])
        return out

    # ---------------------------------------------------------------- prices
    def matmul_s(self, backend: str, ggml_type: str, m: int, k: int, n: int, nbytes: float,
                 cpu_flops_per_s: float = 1e12) -> float | None:
        """Seconds of a weight matmul (module docstring); None when the type has no measured
        curve on the GPU at all (the caller falls back to its roofline)."""
        ty = ggml_type.upper()
        if backend == "cpu":
            return self.cpu_op_s + max(nbytes / (self.cpu_rate_scale * self.cold_rate("cpu", ty)),
                                       2.0 * n * m * k / cpu_flops_per_s)
        curve = self._curve("gpu", "MUL_MAT", ty, m, k, n=n)
        if n <= MMVQ_MAX_BATCH:
            if not self._has_type("gpu", ty):
                if ty == "F32" and n > MMVF_MAX_COLS_F32 and self.f32_mmf_s > 0:
                    return self.f32_mmf_s  # mul_mat_f (module docstring)
                rate = self._matvec_rate(ty)
                if rate is None:
                    return None
            else:
                rate = self.cold_rate("gpu", ty)
            t = 2 * self.floor_s + max(0.0, nbytes / rate - self.floor_s)
            column_s = float(m) * k / self.matvec_column_macs_per_s if self.matvec_column_macs_per_s > 0 else 0.0
            if curve is not None and nbytes > self.l2_bytes and self._measured_cold(ty, m, k, nbytes, n):
                # larger than the L2: the table's repetitions read it cold too (its matvec cases only)
                t = max(t, _at_matvec(curve, n, column_s))
            elif n > 2:
                t += (n - 2) * column_s
            return t
        if curve is not None:
            return _at(curve, n)
        return self._proxy_at("MUL_MAT", ty, m, k, n)

    def moe_s(self, backend: str, ggml_type: str, m: int, k: int, n: int, topk: int, used_bytes: float,
              cpu_flops_per_s: float = 1e12) -> float | None:
        """Seconds of one expert matmul (MUL_MAT_ID) over ``n`` tokens (module docstring)."""
        ty = ggml_type.upper()
        if backend == "cpu":
            return self.cpu_op_s + max(used_bytes / (self.cpu_rate_scale * self.cold_rate("cpu", ty)),
                                       2.0 * n * topk * m * k / cpu_flops_per_s)
        if n <= MMVQ_MAX_BATCH:
            rate = self._matvec_rate(ty)
            if rate is None:
                return None
            return 2 * self.floor_s + max(0.0, used_bytes / rate - self.floor_s)
        curve = self._curve("gpu", "MUL_MAT_ID", ty, m, k, topk=topk, n=n)
        if curve is not None:
            return _at(curve, n)
        got = self._proxy_at("MUL_MAT_ID", ty, m, k, n, topk=topk)
        if got is not None:
            return got
        # no expert case in the family (Q8_0, the legacy types): Q4_K's expert curve times the
        # family's dense time over Q4_K's at the same shape and tokens
        base = self._curve("gpu", "MUL_MAT_ID", "Q4_K", m, k, topk=topk, n=n)
        dense = self._curve("gpu", "MUL_MAT", ty, m, k, n=n)
        dense_t = _at(dense, n) if dense is not None else self._proxy_at("MUL_MAT", ty, m, k, n)
        ref = self._curve("gpu", "MUL_MAT", "Q4_K", m, k, n=n)
        if base is None or dense_t is None or ref is None:
            return None
        return _at(base, n) * dense_t / _at(ref, n)

    def _matvec_rate(self, ty: str) -> float | None:
        """GPU cold matvec rate (bytes/s) of type ``ty``: its own cold case, else the geometric
        mix of its :meth:`proxy_mix` types' (None for a float type without a case)."""
        if self._has_type("gpu", ty):
            return self.cold_rate("gpu", ty)
        mix = self.proxy_mix("MUL_MAT", ty)
        if not mix:
            return None
        return math.exp(sum(w * math.log(self.cold_rate("gpu", p)) for p, w in mix))

    def _measured_cold(self, ty: str, m: int, k: int, nbytes: float, n: int = 1) -> bool:
        """Whether the GPU curve a ``(m, k)`` weight of ``nbytes`` bytes and type ``ty`` is priced
        from was measured on a weight larger than the L2 (read cold by the table's repetitions):
        its own shape, or a measured shape whose bytes (``nbytes`` scaled by the shapes' ``m·k``)
        exceed the L2. A smaller case stayed in the L2 and ran launch-bound: scaled by ``m·k`` to
        a larger weight it gave no HBM read (Llama-8B's Q8_0 FFN matvecs at 1.4 TB/s from
        gpt-oss's 12.5 MB 2880x4096 case, below the 3 TB/s of Q8_0's cold case, and F16's
        roofline above them: fresh-user round 5)."""
        shape = self._curve_shape("gpu", "MUL_MAT", ty, m, k, n)
        return shape is not None and nbytes * shape[0] * shape[1] / (float(m) * k) > self.l2_bytes

    def proxy_mix(self, op: str, ggml_type: str) -> tuple[tuple[str, float], ...]:
        """The measured types (and log-time weights, summing to 1) a GPU ``op`` (``MUL_MAT`` or
        ``MUL_MAT_ID``) of an unmeasured ``ggml_type`` is priced from (module docstring): a K-quant
        from Q4_K and Q6_K on bits per weight (below Q4_K's 4.5: Q4_K alone; Q5_K's 5.5: 0.52 and
        0.48), a legacy block type from Q8_0, another quantised type from Q4_K. Only types with
        a case of ``op`` (``MUL_MAT_ID``: an expert curve; ``MUL_MAT``: a cold matvec case) count. Empty for a float type, a measured type, or a family with no measured
        member."""
        from sim.model.quant import bpw_of

        ty = ggml_type.upper()
        if ty in FLOAT_TYPES:
            return ()
        # an expert type needs an expert curve; a dense type a cold matvec case (the matvecs it
        # prices: a type with MMQ cases alone, gpu_kernels_extra's, still needs one for them)
        have = self.curve_types("gpu", op) if op == "MUL_MAT_ID" else self.measured_types("gpu")
        if ty in have:
            return ()
        fam = PROXY_K if ty.endswith("_K") else PROXY_LEGACY if ty in LEGACY_TYPES else PROXY_OTHER
        got = [t for t in fam if t in have]
        if not got:
            return ()
        if len(got) == 1:
            return ((got[0], 1.0),)
        lo, hi = got  # Q4_K, Q6_K
        b, b_lo, b_hi = bpw_of(ty), bpw_of(lo), bpw_of(hi)
        w = min(max((b - b_lo) / (b_hi - b_lo), 0.0), 1.0)
        return tuple((t, x) for t, x in ((lo, 1.0 - w), (hi, w)) if x > 0)

    def _proxy_at(self, op: str, ty: str, m: int, k: int, n: int, topk: int = 0) -> float | None:
        """Seconds of ``op`` at ``n`` tokens on an unmeasured type from its :meth:`proxy_mix`
        (the geometric mean of the proxies' times at the same shape), or None without one."""
        mix = self.proxy_mix(op, ty)
        parts = []
        for p, w in mix:
            c = self._curve("gpu", op, p, m, k, topk=topk, n=n)
            if c is None:
                return None
            parts.append(w * math.log(_at(c, n)))
        return math.exp(sum(parts)) if parts else None

    def attn_s(self, backend: str, n_tokens: int, keys: int, n_head: int, n_head_kv: int, head_dim: int,
               flash: bool) -> float | None:
        """Seconds of one layer's attention core: ``n_tokens`` queries on ``keys`` keys (padded
        here to :data:`KV_PAD`); None when no table holds an attention of that backend."""
        kv = pad_cells(keys)
        if flash or backend == "cpu":
            t = self._attn_op(backend, "FA", n_tokens, kv, n_head, n_head_kv, head_dim)
            extra = self.fa_extra_at(n_tokens, n_head * head_dim) if backend == "gpu" else 0.0
            if t is not None and extra > 0:
                t = max(t, self._attn_op(backend, "FA", 1, kv, n_head, n_head_kv, head_dim) + extra)
            return t
        kq = self._attn_op(backend, "KQ", n_tokens, kv, n_head, n_head_kv, head_dim)
        kqv = self._attn_op(backend, "KQV", n_tokens, kv, n_head, n_head_kv, head_dim)
        sm = self._softmax(backend, n_tokens, kv, n_head)
        if kq is None or kqv is None or sm is None:
            return None
        # the output's permute + cont and the score's copy: two elementwise passes
        perm = 2 * max(self.floor_s, 2 * 4 * n_tokens * n_head * head_dim / self.ew_bytes_per_s)
        return kq + sm + kqv + perm

    def flash_attn_gpu_many(self, n_tokens: int, keys: np.ndarray, n_head: int, n_head_kv: int,
                            head_dim: int) -> np.ndarray | None:
        """:meth:`attn_s` of a flash attention on the GPU at several key counts at once: ``keys``
        (K,) int, returns (K,) seconds, each element the float :meth:`attn_s` gives (the same
        operations: :func:`interp_nb_kv_many`), or None when no table holds a GPU flash
        attention (as :meth:`attn_s`)."""
        kv = np.maximum(KV_PAD, -(-np.asarray(keys, dtype=np.int64) // KV_PAD) * KV_PAD)   # pad_cells
        got = self._attn.get(("gpu", "FA", head_dim, n_head, n_head_kv))
        scale = 1.0
        if got is None:
            cands = [(kk, v) for kk, v in self._attn.items() if kk[:2] == ("gpu", "FA")]
            if not cands:
                return None
            kk, got = min(cands, key=lambda c: (abs(math.log(c[0][3] * c[0][2] / (n_head * head_dim))),
                                                abs(c[0][4] - n_head_kv)))
            scale = n_head * head_dim / (kk[3] * kk[2])
        t = interp_nb_kv_many(got, n_tokens, kv) * scale
        extra = self.fa_extra_at(n_tokens, n_head * head_dim)
        if extra > 0:
            t = np.maximum(t, interp_nb_kv_many(got, 1, kv) * scale + extra)
        return t

    def fa_extra_at(self, n_tokens: int, width: int) -> float:
        """FlashAttention's time per layer above one token's at ``n_tokens`` query tokens (s) for
        a query ``width`` (n_head * head_dim) wide: ``fa_extra_s`` at 2, 4 and 8 tokens, linear
        between, 0 at one token and beyond 8 (module docstring)."""
        if not 2 <= n_tokens <= FA_EXTRA_TOKENS[-1] or not any(self.fa_extra_s):
            return 0.0
        return float(np.interp(n_tokens, (1, *FA_EXTRA_TOKENS), (0.0, *self.fa_extra_s))) * width / FA_EXTRA_WIDTH

    def kv_cold_s(self, cells, n_head_kv: int, head_dim: int):
        """The cold read of one layer's K/V (f16, ``cells`` padded cells: an int, or an array for
        one value per element) that a repeated ``test-backend-ops`` case does not pay: it keeps a
        layer's K/V in the L2 when they fit, while a graph reads every layer's from HBM.
        ``kv_bytes / attn_kv_cold_rate`` when the K/V fit in the L2 (a larger K/V was read cold by
        the table's case too) and the profile has the rate
        (:func:`calibrate.llamacpp.fit.kv_cold_rate`, ncu of llama-bench decode at depth); else 0.
        :attr:`_attn` adds it to each measured case, before any interpolation."""
        if self.attn_kv_cold_bytes_per_s <= 0:
            return 0.0 if np.ndim(cells) == 0 else np.zeros(np.shape(cells))
        nbytes = kv_cache_bytes(np.asarray(cells, dtype=float), n_head_kv, head_dim)
        out = np.where(nbytes <= self.l2_bytes, nbytes / self.attn_kv_cold_bytes_per_s, 0.0)
        return float(out) if out.ndim == 0 else out

    def set_rows_s(self, nbytes: float) -> float:
        """Seconds of ggml-cpu's one-thread ``SET_ROWS`` reading ``nbytes`` of f32 rows (a CPU
        layer's new K/V into its cache); 0 without a measured rate."""
        if self.cpu_set_rows_bytes_per_s <= 0 or nbytes <= 0:
            return 0.0
        return nbytes / self.cpu_set_rows_bytes_per_s

    def get_rows_s(self, elements: int) -> float:
        """Seconds of ggml-cpu's one-thread ``GET_ROWS`` writing ``elements`` f32 values (the
        token embedding of a ubatch: ``n_tokens · d_model``); 0 without a measured rate."""
        if self.cpu_get_rows_bytes_per_s <= 0 or elements <= 0:
            return 0.0
        return 4.0 * elements / self.cpu_get_rows_bytes_per_s

    def cpu_nodes_s(self, nodes: int, nbytes: float, oai_elems_per_thread: float = 0.0) -> float:
        """``nodes`` weightless nodes of a CPU split in a graph moving ``nbytes`` in all, of which
        a ``SWIGLU_OAI`` computes ``oai_elems_per_thread`` output elements on its busiest thread
        (:func:`sim.plan.builder.ffn_cpu_nodes`): ``nodes * cpu_node_s + nbytes /
        cpu_ew_bytes_per_s + oai_elems_per_thread * cpu_glu_oai_elem_s`` (``cpu_op_s`` per node
        when the profile has no in-graph node time)."""
        if nodes <= 0:
            return 0.0
        node_s = self.cpu_op_s if self.cpu_node_s is None else self.cpu_node_s
        return nodes * node_s + nbytes / self.cpu_ew_bytes_per_s + oai_elems_per_thread * self.cpu_glu_oai_elem_s

    def elementwise_s(self, backend: str, kernels: int, nbytes: float) -> float:
        """``kernels`` elementwise kernels moving ``nbytes`` in all (module docstring)."""
        if kernels <= 0:
            return 0.0
        if backend == "cpu":
            return kernels * self.cpu_op_s + nbytes / self.cpu_ew_bytes_per_s
        return kernels * max(self.floor_s, nbytes / kernels / self.ew_bytes_per_s)

    # ---------------------------------------------------------------- helpers
    def _has_type(self, backend: str, ty: str) -> bool:
        return (backend, ty) in self._cold

    def measured_types(self, backend: str) -> frozenset[str]:
        """The ggml types (upper case) whose matvecs the ``backend`` table measured cold: the
        types it prices from its own cases (another quantised type is priced from its family's,
        :meth:`proxy_mix`, a float type by the caller's roofline on the GPU; on the CPU the median
        cold rate)."""
        return frozenset(ty for (b, ty) in self._cold if b == backend)

    def curve_types(self, backend: str, op: str) -> frozenset[str]:
        """The ggml types (upper case) with a measured token curve of ``op`` (``MUL_MAT``,
        ``MUL_MAT_ID``) on ``backend``."""
        return frozenset(t for (b, o, t, _m, _k) in self._curves if b == backend and o == op)

    @cached_property
    def _shape_memo(self) -> dict:
        """:meth:`_curve_shape`'s answers, by its arguments (the tables do not change)."""
        return {}

    def _covers(self, key: tuple, n: int) -> bool:
        """Whether the curve ``key`` of :attr:`_curves` prices ``n`` tokens: a matvec (up to
        :data:`MMVQ_MAX_BATCH` tokens, ggml-cuda's ``mul_mat_vec_q``) needs a matvec case (a
        curve of one goes on by the column cost, :func:`_at_matvec`; the MMQ cases of
        ``gpu_kernels_extra`` price no matvec); more tokens need a case of the MMQ kernel
        (beyond its last case the time grows linearly in ``n``). A curve of one
        token alone (the output heads' cases) extrapolated linearly had priced a 512-token
        matmul as 512 matvecs (Llama-70B's Q8_0 FFN at 3 TFLOP/s: fresh-user round 7)."""
        ln = self._curves[key][0]
        if n <= MMVQ_MAX_BATCH:  # a matvec case (a curve of MMQ cases only, gpu_kernels_extra, has none)
            return bool(ln[0] <= math.log(MMVQ_MAX_BATCH) + 1e-9)
        return bool(ln[-1] > math.log(MMVQ_MAX_BATCH) + 1e-9)

    def _curve_shape(self, backend: str, op: str, ty: str, m: int, k: int, n: int = 1) -> tuple[int, int] | None:
        """The measured ``(m, k)`` that :meth:`_curve` takes the curve of ``(m, k)`` at ``n``
        tokens from: the same shape, else the type's nearest in ``m·k`` among the curves of more
        than one case that price ``n`` tokens (:meth:`_covers`); None without one."""
        memo_key = (backend, op, ty, int(m), int(k), n > MMVQ_MAX_BATCH)
        got = self._shape_memo.get(memo_key, False)
        if got is not False:
            return got
        key = (backend, op, ty, int(m), int(k))
        if key in self._curves and self._covers(key, n):
            got = int(m), int(k)
        else:
            # another shape's one-case curve (an output head, measured at one token) is not taken:
            # its matvec ran at 1.72 TB/s for Q8_0 (201088 rows of 2880) where a dense FFN's reads
            # at the cold case's 3.0 (h100-20261207-dense3: Mistral-Small-24B Q8_0 decoded at
            # 2.3 TB/s on an H100, which the head's rate had put 27 % slow on an H200)
            cands = [kk[3:] for kk in self._curves if kk[:3] == (backend, op, ty) and self._covers(kk, n)
                     and self._curves[kk][0].size > 1]
            got = min(cands, key=lambda mk: abs(math.log(mk[0] * mk[1] / (m * k)))) if cands else None
        self._shape_memo[memo_key] = got
        return got

    def _curve(self, backend: str, op: str, ty: str, m: int, k: int, topk: int = 0, n: int = 1):
        """The (log n, log t) curve that prices a ``(m, k)`` weight of type ``ty`` at ``n`` tokens:
        its own, else that of :meth:`_curve_shape` scaled by ``m·k`` (and, for experts, by
        ``topk`` over the case's); None without one."""
        got = self._curves.get((backend, op, ty, int(m), int(k)))
        if got is not None and self._covers((backend, op, ty, int(m), int(k)), n):
            return got
        shape = self._curve_shape(backend, op, ty, m, k, n)
        if shape is None:
            return None
        m0, k0 = shape
        ln, lt = self._curves[(backend, op, ty, m0, k0)]
        scale = (m * k) / (m0 * k0)
        if op == "MUL_MAT_ID" and topk:
            scale *= topk / self._topk_of(ty, m0, k0, topk)
        return ln, lt + math.log(scale)

    def _topk_of(self, ty: str, m: int, k: int, default: int) -> int:
        t = self.gpu
        r = t[(t["op"] == "MUL_MAT_ID") & (t["type"].str.upper() == ty) & (t["m"] == m) & (t["k"] == k)]
        return int(r["nr"].iloc[0]) if not r.empty and r["nr"].notna().any() else default

    def _attn_op(self, backend, op, n_tokens, kv, n_head, n_head_kv, head_dim, *, raw: bool = False):
        """Seconds of one attention table op (``FA``, ``KQ``, ``KQV``) at ``n_tokens`` queries and
        ``kv`` keys, from the nearest geometry scaled by its heads × head size; the cases cold
        (:attr:`_attn`), or as measured with ``raw`` (:attr:`_attn_raw`). None without a table."""
        tabs = self._attn_raw if raw else self._attn
        got = tabs.get((backend, op, head_dim, n_head, n_head_kv))
        scale = 1.0
        if got is None:
            cands = [(kk, v) for kk, v in tabs.items() if kk[:2] == (backend, op)]
            if not cands:
                return None
            kk, got = min(cands, key=lambda c: (abs(math.log(c[0][3] * c[0][2] / (n_head * head_dim))),
                                                abs(c[0][4] - n_head_kv)))
            scale = n_head * head_dim / (kk[3] * kk[2])
        return interp_nb_kv(got, n_tokens, kv) * scale

    def _softmax(self, backend, n_tokens, kv, n_head):
        got = self._attn.get((backend, "SOFT_MAX", n_head))
        scale = 1.0
        if got is None:
            cands = [(kk, v) for kk, v in self._attn.items() if kk[:2] == (backend, "SOFT_MAX")]
            if not cands:
                return None
            kk, got = min(cands, key=lambda c: abs(math.log(c[0][2] / n_head)))
            scale = n_head / kk[2]
        return interp_nb_kv(got, n_tokens, kv) * scale


#: columns of an f32 matvec that ``mul_mat_vec_f`` takes on NVIDIA GPUs from Ampere on
#: (``ggml_cuda_should_use_mmvf`` in the pinned tree's ``ggml-cuda/mmvf.cu``: ``ne11 <= 3``);
#: more run ``mul_mat_f``
MMVF_MAX_COLS_F32 = 3
#: token counts at which a profile's ``fa_extra_us_N`` are measured
FA_EXTRA_TOKENS = (2, 4, 8)
#: the query width (n_head * head_dim) the ``fa_extra`` numbers are given for
FA_EXTRA_WIDTH = 4096


def _rows(nb, kv, t_us) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    df = pd.DataFrame({"nb": nb.to_numpy(float), "kv": kv.to_numpy(float), "t": t_us.to_numpy(float) * 1e-6})
    df = df.groupby(["nb", "kv"], as_index=False)["t"].median()
    return {int(n): (g["kv"].to_numpy(float), g["t"].to_numpy(float)) for n, g in df.sort_values("kv").groupby("nb")}


def _at(curve, n: int) -> float:
    """Log-log interpolation of a (log n, log t) curve; below its first point the first time,
    beyond its last linear in ``n``."""
    ln, lt = curve
    x = math.log(max(n, 1))
    if x <= ln[0]:
        return float(math.exp(lt[0]))
    if x >= ln[-1]:
        return float(math.exp(lt[-1] + x - ln[-1]))
    return float(math.exp(np.interp(x, ln, lt)))


def _at_matvec(curve, n: int, column_s: float = 0.0) -> float:
    """:func:`_at` of a weight's measured curve at ``n <= MMVQ_MAX_BATCH`` tokens from its matvec
    cases alone (ggml-cuda's ``mul_mat_vec_q``; above 8 tokens MMQ, another kernel, runs): log-log
    between them, and beyond the last one linear in ``n`` along the slope of the last two (each
    column adds the same dot products). With one matvec case (an output head's, measured at
    one token), beyond it ``column_s`` seconds per further token (the weight is read once);
    the time at or below the first case is that case's."""
    ln, lt = curve
    keep = ln <= math.log(MMVQ_MAX_BATCH) + 1e-9
    if int(keep.sum()) < 2:
        n1 = math.exp(ln[0])
        return float(math.exp(lt[0]) + max(0.0, n - n1) * column_s)
    ln, lt = ln[keep], lt[keep]
    if math.log(max(n, 1)) <= ln[-1]:
        return _at((ln, lt), n)
    n1, n0 = math.exp(ln[-1]), math.exp(ln[-2])
    t1, t0 = math.exp(lt[-1]), math.exp(lt[-2])
    return float(t1 + (n - n1) * max(0.0, (t1 - t0) / (n1 - n0)))


def interp_nb_kv(rows: Mapping[int, tuple[np.ndarray, np.ndarray]], nb: int, kv: float) -> float:
    """Attention time at ``nb`` queries and ``kv`` keys from measured rows ``{nb: (kv, t)}``.

    At a measured ``nb``: linear in ``kv`` between the points (the work is one score row of
    ``kv`` keys per query), extrapolated beyond the last two with their slope (>= 0), and
    proportional below a row's only point. Between measured ``nb``: log-log (a power law
    between neighbouring grid points); below the smallest ``nb`` its row; above the largest,
    linear in ``nb`` (each query is independent work).
    """
    def along(n: int) -> float:
        kvs, ts = rows[n]
        if len(kvs) == 1:
            return float(ts[0] * max(kv, 1.0) / kvs[0]) if kv > kvs[0] else float(ts[0])
        if kv > kvs[-1]:
            slope = max((ts[-1] - ts[-2]) / (kvs[-1] - kvs[-2]), 0.0)
            return float(ts[-1] + slope * (kv - kvs[-1]))
        if kv < kvs[0]:
            return float(ts[0])
        return float(np.interp(kv, kvs, ts))

    ns = sorted(rows)
    if nb <= ns[0]:
        return along(ns[0])
    if nb >= ns[-1]:
        return along(ns[-1]) * nb / ns[-1]
    i = bisect_left(ns, nb)   # np.searchsorted's index, without making an array of ns
    if ns[i] == nb:
        return along(nb)
    n0, n1 = ns[i - 1], ns[i]
    t0, t1 = along(n0), along(n1)
    f = (math.log(nb) - math.log(n0)) / (math.log(n1) - math.log(n0))
    return float(math.exp((1 - f) * math.log(t0) + f * math.log(t1)))


def interp_nb_kv_many(rows: Mapping[int, tuple[np.ndarray, np.ndarray]], nb: int, kv: np.ndarray) -> np.ndarray:
    """:func:`interp_nb_kv` at several key counts ``kv`` ((K,) int) at once: (K,) float64, each
    element the float :func:`interp_nb_kv` gives (the same IEEE operations element by element,
    ``np.interp`` on the array; between measured ``nb`` the log-log step is made per element by
    :func:`interp_nb_kv` itself)."""
    kv = np.asarray(kv)

    def along(n: int) -> np.ndarray:
        kvs, ts = rows[n]
        if len(kvs) == 1:
            return np.where(kv > kvs[0], ts[0] * np.maximum(kv, 1.0) / kvs[0], ts[0])
        slope = max((ts[-1] - ts[-2]) / (kvs[-1] - kvs[-2]), 0.0)
        return np.where(kv > kvs[-1], ts[-1] + slope * (kv - kvs[-1]),
                        np.where(kv < kvs[0], ts[0], np.interp(kv, kvs, ts)))

    ns = sorted(rows)
    if nb <= ns[0]:
        return along(ns[0])
    if nb >= ns[-1]:
        return along(ns[-1]) * nb / ns[-1]
    i = bisect_left(ns, nb)
    if ns[i] == nb:
        return along(nb)
    return np.array([interp_nb_kv(rows, nb, x) for x in kv.tolist()], dtype=np.float64)


def layer_elementwise(model, layer: int) -> tuple[int, float]:
    """``(kernels, f32 elements read + written per token)`` of one layer's elementwise kernels
    as llama.cpp's CUDA backend runs them (counted in an ``ncu`` profile of Qwen3-30B-A3B, one
    kernel per fused group): attention norm (1), RoPE on Q and K (2, with the Q/K norms fused),
    KV store (1), two residual adds (2), FFN norm (1), the GLU (1); MoE layers add the router's
    softmax/top-k (1) and the weighted sum of the experts (1); Gemma 3 its two post-norms (2).

    Elements per token: norms ``2·d``, RoPE ``2·(q + kv)``, KV store ``1.5·2·kv`` (f32 in, f16
    out), adds ``3·d`` each, the GLU ``3·ff`` (gate and up in, one out; MoE: ``top-k·ff_exp``
    plus the shared expert's), router ``3·n_expert``, weighted sum ``(top-k + 1)·d``.
    """
    d = model.d_model
    q = model.n_head * model.head_dim
    kvd = model.n_head_kv * model.head_dim
    kernels = 8
    elems = 2 * d + 2 * (q + kvd) + 3 * kvd + 6 * d + 2 * d
    if model.moe is not None and model.is_moe_layer(layer):
        m = model.moe
        ff = m.n_expert_used * m.n_ff_exp + (m.n_ff_shexp if m.n_expert_shared else 0)
        elems += 3 * ff + 3 * m.n_expert + (m.n_expert_used + 1) * d
        kernels += 2
    else:
        elems += 3 * model.n_ff
    if getattr(model, "arch", "") == "gemma3":
        elems += 4 * d
        kernels += 2
    if getattr(model, "arch", "") == "gpt-oss":
        # biases: Q, K, V, output (2 elements each: in and out) and the experts' gate, up and
        # down (ADD_ID on the top-k rows)
        elems += 2 * (q + 2 * kvd + d)
        if model.moe is not None:
            elems += 2 * model.moe.n_expert_used * (2 * model.moe.n_ff_exp + d)
        kernels += 7
    return kernels, float(elems)


def layer_norm_weights(model, layer: int) -> int:
    """Norm weights of one layer (each a split input when the layer's weights are on the host):
    attention and FFN norms, Q/K norms (Qwen3, Gemma 3), Gemma 3's two post-norms."""
    arch = getattr(model, "arch", "")
    return 2 + (2 if arch in ("qwen3moe", "gemma3") else 0) + (2 if arch == "gemma3" else 0)


def graph_kernels(items) -> int:
    """CUDA kernels of one graph's GPU ops, as ggml-cuda launches them at prefill (counted in the
    ncu profile of Qwen3-30B-A3B pp512, ``data/llamacpp/h200-20261201-kernels/ncu``: 33 per
    layer): a weight matmul 2 (q8_1 quantisation and MMQ; a matvec: quantisation and MMVQ), an
    expert matmul 4 (ids helper, quantisation, MMQ, stream-k fix-up; 2 as a matvec),
    FlashAttention 1 (unfused: 9 — KQ, softmax, KQV and their copies and conversions, counted in
    the ``-fa 0`` profile), plus the layer's elementwise kernels (:func:`layer_elementwise`,
    carried in the attention op's shape). ``items``: the graph's :class:`sim.plan.builder.Item` list;
    CPU-backend items launch nothing."""
    from sim.plan import OpKind

    n = 0
    for it in items:
        if it.cpu:
            continue
        mv = it.shape[0] <= MMVQ_MAX_BATCH
        if it.kind is OpKind.GEMM:
            n += 2 * max(1, len(it.shape[3]) if len(it.shape) > 3 else 1)
        elif it.kind is OpKind.MOE:
            n += 2 if mv else 4
        elif it.kind is OpKind.ATTN:
            fa = it.shape[8] if len(it.shape) > 8 else 1
            n += (1 if fa else 9) + (it.shape[9] if len(it.shape) > 9 else 0)
    return n


def kv_cache_bytes(cells: int, n_head_kv: int, head_dim: int, bytes_per_elem: float = 2.0) -> float:
    """Bytes of one layer's K and V over ``cells`` cache cells (f16 by default: the kernel
    tables' type)."""
    return 2.0 * bytes_per_elem * cells * n_head_kv * head_dim


def pad_cells(cells: int) -> int:
    """KV cells a graph attends to, padded as llama.cpp pads them (:data:`KV_PAD`, at least one pad)."""
    return max(KV_PAD, -(-int(cells) // KV_PAD) * KV_PAD)


def attended_keys(n_tokens: int, kv_len: int, window: int = 0) -> int:
    """Keys a ubatch of ``n_tokens`` on ``kv_len`` cached ones attends (unpadded): all of them, or
    with a sliding window the window plus the ubatch (llama.cpp's SWA cache holds both)."""
    return min(kv_len + n_tokens, window + n_tokens) if window else kv_len + n_tokens


#: cells before the ubatch's first position that ``set_input_kq_mask`` keeps revisiting beyond
#: the window (``p0 + n_swa + 32 >= pos_min``: llama-kv-cache.cpp, ggml-org/llama.cpp#18842)
MASK_REVISIT_MARGIN = 32


def _mask_loop(n_tokens: int, kv_len: int, window: int) -> tuple[int, int]:
    """``(entries, cells)`` of one KQ mask: the cells it spans (``n_kv``, padded) and the entries
    ``set_input_kq_mask`` visits. The first query row walks every cell; each later row of the
    same sequence copies that row and revisits only the cells whose position is within the
    window plus :data:`MASK_REVISIT_MARGIN` of the ubatch's first position (the ubatch's own
    cells and up to ``window + 32`` cached ones)."""
    filled = attended_keys(n_tokens, kv_len, window)
    cells = pad_cells(filled)
    recent = min(filled, n_tokens + min(kv_len, window + MASK_REVISIT_MARGIN))
    return cells + (n_tokens - 1) * recent, cells


def mask_entries(model, n_tokens: int, kv_len: int) -> int:
    """KQ-mask entries llama.cpp's host visits for one graph (``set_input_kq_mask`` in
    llama-kv-cache.cpp, :func:`_mask_loop`): the full-attention mask, plus the sliding-window
    cache's when some layers use a window. A prompt ubatch from position 0 visits about
    ``n_tokens**2`` entries; one at depth ``kv_len`` about ``n_kv + n_tokens * (n_tokens + 32)``;
    a decode token ``n_kv``. 0 for a model without a softmax-attention layer (``attn_kind =
    "linear"``: llama.cpp's recurrent-state models build no KQ mask)."""
    if getattr(model, "attn_kind", "full") == "linear":
        return 0
    n = _mask_loop(n_tokens, kv_len, 0)[0]
    if model.sliding_window and model.swa_interval:
        n += _mask_loop(n_tokens, kv_len, model.sliding_window)[0]
    return int(n)


def mask_bytes(model, n_tokens: int, kv_len: int, flash_attn: bool) -> int:
    """Bytes of the KQ masks of one graph (``n_kv x n_tokens``, f16 with FlashAttention, else
    f32: ``build_attn_inp_kq_mask`` in llama-graph.cpp). They are graph inputs in a pinned host
    buffer that the scheduler copies to the GPU, synchronously, before the first split. 0 for a
    model without a softmax-attention layer (:func:`mask_entries`)."""
    if getattr(model, "attn_kind", "full") == "linear":
        return 0
    elem = 2 if flash_attn else 4
    n = _mask_loop(n_tokens, kv_len, 0)[1]
    if model.sliding_window and model.swa_interval:
        n += _mask_loop(n_tokens, kv_len, model.sliding_window)[1]
    return int(n * n_tokens * elem)


def _mask_loop_many(n_tokens: int, kv_len: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_mask_loop` at each of the KV lengths ``kv_len`` ((K,) int64): ``(entries, cells)``,
    (K,) int64 each (the same integer arithmetic)."""
    filled = np.minimum(kv_len + n_tokens, window + n_tokens) if window else kv_len + n_tokens
    cells = np.maximum(KV_PAD, -(-filled // KV_PAD) * KV_PAD)
    recent = np.minimum(filled, n_tokens + np.minimum(kv_len, window + MASK_REVISIT_MARGIN))
    return cells + (n_tokens - 1) * recent, cells


def mask_shapes_many(model, n_tokens: int, kv_lens, flash_attn: bool, on_gpu: bool) -> tuple[np.ndarray, np.ndarray]:
    """:func:`mask_entries` and :func:`mask_bytes` (0 when ``on_gpu`` is False, as
    :func:`sim.plan.builder.kq_mask_shape`) of a graph of ``n_tokens`` at each of ``kv_lens``
    ((K,) ints >= 0): ``(entries, bytes)``, (K,) int64 each, element for element the integers
    those functions give."""
    kv = np.asarray(kv_lens, dtype=np.int64)
    if getattr(model, "attn_kind", "full") == "linear":
        return np.zeros(kv.size, dtype=np.int64), np.zeros(kv.size, dtype=np.int64)
    entries, cells = _mask_loop_many(n_tokens, kv, 0)
    if model.sliding_window and model.swa_interval:
        e2, c2 = _mask_loop_many(n_tokens, kv, model.sliding_window)
        entries = entries + e2
        cells = cells + c2
    nbytes = cells * n_tokens * (2 if flash_attn else 4) if on_gpu else np.zeros(kv.size, dtype=np.int64)
    return entries, nbytes


def _first_row(mask) -> int:
    """The 1-based data row (the header not counted) of the first True of ``mask``."""
    return int(np.asarray(mask).nonzero()[0][0]) + 1


def _cell(v) -> str:
    """A table cell as an error message shows it: text quoted, a blank as ``blank``."""
    if isinstance(v, str):
        return repr(v)
    return "blank" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{float(v):g}"


def shape_text(r, columns) -> str:
    """``c=v`` for each of ``columns`` of the row ``r`` that has a value (blanks left out), whole
    numbers without a decimal point: ``m=512 n=1 k=2048``."""
    parts = []
    for c in columns:
        v = r[c]
        if v is not None and not (isinstance(v, float) and math.isnan(v)):
            parts.append(f"{c}={int(v) if float(v).is_integer() else v}")
    return " ".join(parts)


def table_key(r) -> str:
    """A kernel table row's key (every column but ``t_us``, blanks left out):
    ``gpu MUL_MAT Q4_K m=512 n=1 k=2048 bs=1 nr=1``."""
    parts = [str(r[c]) for c in ("backend", "op", "type") if isinstance(r[c], str) and r[c]]
    shape = shape_text(r, TABLE_COLUMNS[3:-1])
    return " ".join(parts + ([shape] if shape else []))


def duplicate_rows(df: pd.DataFrame, key) -> tuple[int, int] | None:
    """The first case of ``df`` timed twice: the 1-based data rows (the header not counted) of
    the first row whose ``key`` columns another row repeats and of the next such row, or None.
    Blanks compare equal to blanks."""
    dup = df.duplicated(subset=list(key), keep=False).to_numpy()
    if not dup.any():
        return None
    rows = dup.nonzero()[0]
    k = df[list(key)]
    first = k.iloc[rows[0]]
    for j in rows[1:]:
        other = k.iloc[j]
        if all((a == b) or (pd.isna(a) and pd.isna(b)) for a, b in zip(first, other)):
            return int(rows[0]) + 1, int(j) + 1
    raise AssertionError("pandas marked a duplicate with no twin")  # pragma: no cover


def read_table(path) -> pd.DataFrame:
    """A kernel table CSV (:data:`TABLE_COLUMNS`).

    Raises:
        ValueError: a missing column, no rows, a bad value (naming its data row: 1 = the first
            row after the header), or a case timed twice (the same key, :func:`table_key`,
            in two rows: naming both).
    """
    from sim.bounds import DURATION_MAX_S, DURATION_MIN_S, INT32_MAX, check_text_input

    if isinstance(path, (str, Path)):
        if not Path(path).exists():
            raise FileNotFoundError(2, "No such file or directory", str(path))
        check_text_input(path)
    df = pd.read_csv(path)
    missing = [c for c in TABLE_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"kernel table lacks columns {', '.join(missing)}")
    if df.empty:
        raise ValueError("kernel table has no rows")
    t = pd.to_numeric(df["t_us"], errors="coerce")
    bad_t = ~(np.isfinite(t) & (t > 0))
    if bad_t.any():
        i = _first_row(bad_t)
        raise ValueError(f"kernel table has a non-positive, missing or infinite t_us {_cell(df['t_us'].iloc[i - 1])} "
                         f"(data row {i})")
    out_t = (t * 1e-6 < DURATION_MIN_S) | (t * 1e-6 > DURATION_MAX_S)
    if out_t.any():
        i = _first_row(out_t)
        raise ValueError(f"kernel table has a t_us ({t.iloc[i - 1]:g}, data row {i}) outside "
                         f"[{DURATION_MIN_S * 1e6:g}, {DURATION_MAX_S * 1e6:g}] us (not physical for one kernel)")
    df["t_us"] = t
    for c in ("m", "n", "k", "bs", "nr", "hd", "nh", "nkv", "kv", "nb"):
        raw = df[c]
        df[c] = pd.to_numeric(raw, errors="coerce")
        bad = (df[c].isna() & raw.notna()) | (df[c].notna() & ~(np.isfinite(df[c]) & (df[c] >= 0) & (df[c] <= INT32_MAX)))
        if bad.any():
            i = _first_row(bad)
            raise ValueError(f"kernel table column {c} has a non-numeric, negative, infinite or too large value "
                             f"{_cell(raw.iloc[i - 1])} (data row {i}; a shape must be <= {INT32_MAX})")
    df["type"] = df["type"].fillna("").astype(str).str.upper()
    bad_b = ~df["backend"].isin(["gpu", "cpu"])
    if bad_b.any():
        raise ValueError(f"kernel table: backend {df['backend'][bad_b].iloc[0]!r} in data row "
                         f"{_first_row(bad_b)} (gpu or cpu)")
    bad_op = ~df["op"].isin(list(TABLE_OPS))
    if bad_op.any():
        raise ValueError(f"kernel table: op {df['op'][bad_op].iloc[0]!r} (data row {_first_row(bad_op)}) is not one "
                         f"of {', '.join(TABLE_OPS)}")
    from sim.model.quant import GGML_BLOCK

    typed = df["op"].isin(["MUL_MAT", "MUL_MAT_ID", "MUL_MAT_B"])
    unknown = typed & ~df["type"].isin(list(GGML_BLOCK) + ["F16", "F32", "BF16"])
    if unknown.any():
        raise ValueError(f"kernel table: unknown ggml type {df['type'][unknown].iloc[0]!r} "
                         f"(data row {_first_row(unknown)})")
    for op, cols in TABLE_OPS.items():
        rows = df[df["op"] == op]
        for c in cols:
            v = rows[c]
            if (v.isna() | (v < 1)).any():
                raise ValueError(f"kernel table: {op} rows need {c} >= 1 (data row "
                                 f"{int(rows.index[(v.isna() | (v < 1)).to_numpy()][0]) + 1})")
    dup = duplicate_rows(df, [c for c in TABLE_COLUMNS if c != "t_us"])
    if dup is not None:
        raise ValueError(f"kernel table: the case {table_key(df.iloc[dup[0] - 1])} is timed twice (data rows "
                         f"{dup[0]} and {dup[1]}); keep one row per case")
    return df


def check_coverage(tab: pd.DataFrame, backend: str) -> None:
    """A kernel table a profile can price with: every row of ``backend``, and (GPU) weight and
    expert matmul curves, FlashAttention and at least one cold matvec case (``MUL_MAT`` with
    ``bs > 1``); (CPU) a cold case.

    Raises:
        ValueError: naming what is missing.
    """
    other = tab[tab["backend"] != backend]
    if not other.empty:
        raise ValueError(f"{plural(len(other), 'row')} of backend {other['backend'].iloc[0]!r} in the {backend} table "
                         f"(the first: data row {int(other.index[0]) + 1}; one table per backend: perf_cases table "
                         "writes each log's own)")
    ops = set(tab["op"])
    need = ["MUL_MAT", "MUL_MAT_ID", "FLASH_ATTN_EXT"] if backend == "gpu" else ["MUL_MAT"]
    missing = [o for o in need if o not in ops]
    if missing:
        raise ValueError(f"the {backend} kernel table has no {', '.join(missing)} rows")
    if not ((tab["op"] == "MUL_MAT") & (tab["bs"].fillna(1) > 1) & (tab["n"] == 1)).any():
        raise ValueError(f"the {backend} kernel table has no cold case (MUL_MAT at 1 token over bs > 1 "
                         "distinct matrices)")


def table_from_perf(perf: pd.DataFrame) -> pd.DataFrame:
    """Normalise a parsed ``test-backend-ops perf`` frame (:func:`calibrate.llamacpp.perf_cases.parse_perf`)
    into :data:`TABLE_COLUMNS`: ``MUL_MAT`` with batch ``bs > 1`` and F16/F32 weights becomes
    ``MUL_MAT_B``; FlashAttention's ``nh`` (the program's KV heads) becomes ``nkv`` and ``nh``
    the query heads (``nkv · nr23[0]``); MUL_MAT_ID's ``nr`` holds its ``n_used``."""
    def first(v, default=1):
        if isinstance(v, str) and v.startswith("["):
            return int(v.strip("[]").split(",")[0])
        return default if v is None or (isinstance(v, float) and math.isnan(v)) else int(v)

    rows = []
    for _, r in perf.iterrows():
        op = r["op"]
        rec: dict[str, Any] = {c: None for c in TABLE_COLUMNS}
        rec["backend"] = "cpu" if str(r["backend"]).upper().startswith("CPU") else "gpu"
        rec["t_us"] = float(r["us_per_run"])
        if op == "MUL_MAT":
            bs, nr = first(r.get("bs")), first(r.get("nr"))
            ta = str(r["type_a"]).upper()
            rec.update(op="MUL_MAT_B" if (bs > 1 or nr > 1) and ta in ("F16", "F32", "BF16") else "MUL_MAT",
                       type=ta, m=r["m"], n=r["n"], k=r["k"], bs=bs, nr=nr)
        elif op == "MUL_MAT_ID":
            rec.update(op=op, type=str(r["type_a"]).upper(), m=r["m"], n=r["n"], k=r["k"], bs=1,
                       nr=r.get("n_used"), nkv=r.get("n_mats"))
        elif op == "FLASH_ATTN_EXT":
            nkv = int(r["nh"])
            rec.update(op=op, hd=r["hsk"], nkv=nkv, nh=nkv * first(r.get("nr23")), kv=r["kv"], nb=r["nb"])
        elif op == "SOFT_MAX":
            ne = [int(x) for x in str(r["ne"]).strip("[]").split(",")]
            rec.update(op=op, kv=ne[0], nb=ne[1], nh=ne[2] * first(r.get("nr23")))
        else:
            continue
        rows.append(rec)
    return pd.DataFrame(rows, columns=list(TABLE_COLUMNS))
