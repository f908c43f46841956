"""Cost model: the duration of each plan op on a :class:`~sim.model.specs.HardwareProfile`.

Pure functions of (op, profile). Formulas:

* H2D / D2H: ``latency_s + bytes / bytes_per_s`` of the copy path (pinned or pageable).
* GEMM / MUL_MAT_ID: roofline, ``max(FLOP / (peak * gemm_efficiency),
  bytes / (HBM * hbm_efficiency)) + kernel_s``, with FLOP = 2·m·n·k per matrix-token
  (MUL_MAT_ID: m·top-k rows) and bytes = weights read + activations in (f32) and out (f32).
  When the profile has a measured ``gemm_table`` holding the (n, k) shape, the time is
  interpolated in log(m) from it instead (measured beats roofline).
* MUL_MAT_ID with a measured profile: the roofline with the fitted rates (calibration found
  a batched grouped GEMM within ~3% of it, ``scenarios/hardware/h200/moe.csv``), reading the
  used experts' weights at ``kernel_weight_bits``.
* Attention: FLOP = 4·pairs·n_head·head_dim (QKᵀ and PV), pairs = causal (query, key)
  pairs of the ubatch against ``kv_len`` cached tokens (capped by a sliding window); bytes =
  K and V read once (F16). Linear attention: 4·tokens·n_head·head_dim·state FLOP. With a
  measured ``attn_table`` holding the head geometry: a least-squares fit per geometry of
  ``t = a + b·pairs + c·(kv_len + tokens)`` (fixed cost, score work, KV scan) to the table,
  where pairs counts the full (query, key) rectangle, as the measured kernel
  (``calibrate.measure.attention``, no causal mask) computes it.
* CPU ops (op offload rule not met): memory-bound matvec, ``max(weight bytes /
  cpu_bytes_per_s, FLOP / cpu_flops_per_s)`` (docs/DESIGN.md: decode on partially offloaded models
  is bounded by host DRAM bandwidth). In ``executor_mode`` with a measured
  ``executor_cpu_bytes_per_s``: ``executor_cpu_op_s + max(bytes / executor_cpu_bytes_per_s,
  FLOP / cpu_flops_per_s)``, the executor's numpy matvec measured in a decode-shaped loop.
* Host ops: ``host_sync_s``, ``op_issue_s``, ``event_s`` of the profile. In ``executor_mode``
  (validation against the CuPy executor) a launch costs ``executor_op_issue_s`` and an
  attention the table's ``t_host_s`` fit (the executor's attention is three prepared launches
  per chunk of query rows, two cuBLAS GEMMs and a softmax kernel); host work of building
  expert runs: :data:`HOST_WORK_PER_ITEM_S` per expert id (an assumption, documented there), or
  in ``executor_mode`` the executor's measured ``executor_host_work_s`` + per-id cost. In
  ``executor_mode`` a launch after the plan's first CPU-backend op adds the measured
  busy-host extra of its kind (:func:`plan_durations`).
"""

from __future__ import annotations

import math

import numpy as np

from sim.model.ggmlcost import attended_keys
from sim.plan import KIND_CODE, STREAM_CODE, Op, OpKind, Plan, Stream
from sim.model.specs import HardwareProfile

#: host time per router id scanned when building the set of used experts and its runs.
#: Assumption: a few ns per id for a tight C loop; 5 ns keeps it visible but negligible.
HOST_WORK_PER_ITEM_S = 5e-9

ACT_BYTES = 4  # activations are f32 in ggml graphs
#: ggml-cuda's ``GGML_OP_OFFLOAD_MIN_BATCH`` default (sim.model.specs.Placement.op_offload_min_batch)
OP_OFFLOAD_MIN_BATCH = 32


def roofline_s(hw: HardwareProfile, flops: float, nbytes: float) -> float:
    """``max(FLOP / (peak · gemm_efficiency), bytes / (HBM · hbm_efficiency)) + kernel_s``."""
    return max(flops / (hw.gpu_flops_per_s * hw.gemm_efficiency),
               nbytes / (hw.hbm_bytes_per_s * hw.hbm_efficiency)) + hw.kernel_s


def attn_keys(n_tokens: int, kv_len: int, window: int = 0) -> int:
    """Keys the last query of a ubatch attends to: ``kv_len + n_tokens``, at most ``window``."""
    return min(kv_len + n_tokens, window) if window else kv_len + n_tokens


def gemm_s(hw: HardwareProfile, m: int, n: int, k: int, weight_bytes: float, rows: int | None = None) -> float:
    """Time of a (m×k)·(k×n) matmul whose weights take ``weight_bytes``.

    Args:
        m: tokens. rows: matmul rows if different from m (MUL_MAT_ID: m·top-k).

    Returns seconds (> 0).
    """
    rows = m if rows is None else rows
    tab = _table_lookup(hw, n, k, rows)
    if tab is not None:
        return tab  # measured kernels (their own weight format, see kernel_weight_bits)
    if hw.kernel_weight_bits:
        weight_bytes = n * k * hw.kernel_weight_bits / 8
    return roofline_s(hw, 2.0 * rows * n * k, weight_bytes + ACT_BYTES * rows * (n + k))


def _table_lookup(hw: HardwareProfile, n: int, k: int, m: int) -> float | None:
    if hw.gemm_table is None:
        return None
    curves = _gemm_curves(id(hw.gemm_table), hw.gemm_table)
    curve = curves.get((int(n), int(k)))
    if curve is None:
        return None
    ms, ts = curve
    lm = math.log(max(m, 1))
    if lm <= ms[0]:
        return float(math.exp(ts[0]))
    if lm >= ms[-1]:
        # beyond the table: compute-bound, time scales with m
        return float(math.exp(ts[-1]) * math.exp(lm - ms[-1]))
    return float(math.exp(np.interp(lm, ms, ts)))


_CURVE_CACHE: dict[int, dict] = {}


def _gemm_curves(key: int, table) -> dict:
    got = _CURVE_CACHE.get(key)
    if got is not None and got[0] is table:  # the cache holds the table: its id cannot be reused
        return got[1]
    curves = {}
    for (n, k), grp in table.groupby(["n", "k"]):
        g = grp.groupby("m")["t_s"].median().sort_index()
        curves[(int(n), int(k))] = (np.log(g.index.to_numpy(float)), np.log(g.to_numpy(float)))
    _CURVE_CACHE[key] = (table, curves)
    return curves


def attn_s(hw: HardwareProfile, n_tokens: int, kv_len: int, n_head: int, n_head_kv: int,
           head_dim: int, window: int = 0, linear: bool = False, state_dim: int = 128) -> float:
    """Time of one layer's attention for ``n_tokens`` new tokens on ``kv_len`` cached ones."""
    if linear:
        flops = 4.0 * n_tokens * n_head * head_dim * state_dim
        nbytes = ACT_BYTES * n_tokens * n_head * head_dim * 3
    else:
        pairs = attn_pairs(n_tokens, kv_len, window)
        flops = 4.0 * pairs * n_head * head_dim
        kv_read = attn_keys(n_tokens, kv_len, window)
        nbytes = kv_read * n_head_kv * head_dim * 2 * 2 + ACT_BYTES * n_tokens * n_head * head_dim * 2
    return roofline_s(hw, flops, nbytes)


def attn_pairs(n_tokens: int, kv_len: int, window: int = 0) -> float:
    """Causal (query, key) pairs: token i of the ubatch sees ``kv_len + i + 1`` keys, at most
    ``window`` of them when a sliding window is set."""
    n = n_tokens
    if not window:
        return n * kv_len + n * (n + 1) / 2
    # sum_{i=1..n} min(kv_len + i, window)
    full_from = max(0, min(n, window - kv_len))  # i < full_from: below the window
    below = full_from * kv_len + full_from * (full_from + 1) / 2
    return below + (n - full_from) * window


_ATTN_FITS: dict[tuple, dict] = {}


def _attn_table_s(hw: HardwareProfile, n_tokens: int, kv_len: int, n_head: int, n_head_kv: int,
                  head_dim: int, window: int, column: str = "t_s") -> float | None:
    """Attention time from the measured table (None: geometry not in it, or too few points).

    The table is first cleaned: non-positive or non-finite times dropped, repeated
    ``(n_tokens, kv_len)`` points replaced by their median. Within the table's token range the
    time is interpolated: along the KV axis linearly at each measured token count (at a fixed
    token count the work is linear in the keys: one score row per query over
    ``L = kv + tokens`` keys), extrapolated linearly from the row's last two points beyond its
    largest KV length; between the two bracketing token counts geometrically (log t linear in
    log tokens: the cost goes from a fixed launch cost to quadratic in the tokens, a power law
    between neighbouring grid points). Only token counts measured at two KV lengths or more are
    interpolated between. A sliding window shorter than the ubatch (``keys < n_tokens``: the
    kernel computes n queries × ``keys`` keys, a shape no table row has) is priced as the
    ``keys``-token, KV-0 point scaled by ``n_tokens / keys`` (the score work is linear in the
    queries at fixed keys). Outside the token range a least-squares fit per geometry of
    ``t = a + b·pairs + c·keys`` (fixed cost, score work, KV scan) over the whole table,
    weighted by 1/t, where pairs counts the full (query, key) rectangle, as the measured kernel
    (``calibrate.measure.attention``, no causal mask) computes it. ``column="t_host_s"``: the
    host time to launch its kernels.
    """
    got = _ATTN_FITS.get((id(hw.attn_table), column))
    fits = got[1] if got is not None and got[0] is hw.attn_table else None
    if fits is None:
        fits = {}
        tab = hw.attn_table
        ok = np.isfinite(tab[column].to_numpy(float)) & (tab[column].to_numpy(float) > 0)
        tab = tab[ok].groupby(["n_head", "n_head_kv", "head_dim", "n_tokens", "kv_len"], as_index=False)[column].median()
        for key, g in tab.groupby(["n_head", "n_head_kv", "head_dim"]):
            coef = None
            if len(g) >= 3:
                n = g["n_tokens"].to_numpy(float)
                kv = g["kv_len"].to_numpy(float)
                X = np.column_stack([np.ones_like(n), n * (kv + n), kv + n])
                # relative least squares: weight rows by 1/t so short and long times count alike
                t = g[column].to_numpy(float)
                w = 1.0 / t
                coef, *_ = np.linalg.lstsq(X * w[:, None], t * w, rcond=None)
                coef = np.maximum(coef, 0.0)
            rows = {}
            for nt, gr in g.groupby("n_tokens"):
                if len(gr) >= 2:
                    gr = gr.sort_values("kv_len")
                    rows[int(nt)] = (gr["kv_len"].to_numpy(float), gr[column].to_numpy(float))
            fits[tuple(int(x) for x in key)] = (coef, rows)
        _ATTN_FITS[(id(hw.attn_table), column)] = (hw.attn_table, fits)
    got = fits.get((int(n_head), int(n_head_kv), int(head_dim)))
    if got is None:
        return None
    coef, rows = got
    keys = attn_keys(n_tokens, kv_len, window)
    ns = sorted(rows)

    def along_kv(nt: int, kv_eff: float) -> float:
        kvs, ts = rows[nt]
        if kv_eff > kvs[-1]:
            slope = (ts[-1] - ts[-2]) / (kvs[-1] - kvs[-2])
            return float(ts[-1] + max(slope, 0.0) * (kv_eff - kvs[-1]))
        return float(np.interp(kv_eff, kvs, ts))

    def interp(nt: int, kv_eff: float) -> float:
        i = int(np.searchsorted(ns, nt))
        if ns[min(i, len(ns) - 1)] == nt:
            return along_kv(nt, kv_eff)
        n0, n1 = ns[i - 1], ns[i]
        t0, t1 = along_kv(n0, kv_eff), along_kv(n1, kv_eff)
        f = (math.log(nt) - math.log(n0)) / (math.log(n1) - math.log(n0))
        return float(math.exp((1 - f) * math.log(t0) + f * math.log(t1)))

    if ns and keys >= n_tokens and ns[0] <= n_tokens <= ns[-1]:
        return interp(n_tokens, keys - n_tokens)
    if ns and 0 < keys < n_tokens and ns[0] <= keys <= ns[-1]:
        return interp(keys, 0.0) * n_tokens / keys
    if coef is None:
        return None
    return float(coef[0] + coef[1] * n_tokens * keys + coef[2] * keys)


def cpu_s(hw: HardwareProfile, weight_bytes: float, flops: float) -> float:
    """Time of an op run by the CPU backend on host weights (memory- or compute-bound), plus
    its fixed dispatch cost ``cpu_op_s``."""
    return hw.cpu_op_s + max(weight_bytes / hw.cpu_bytes_per_s, flops / hw.cpu_flops_per_s)


#: kinds :func:`op_duration_s` prices from the profile alone, outside ``executor_mode``: a
#: launch, a sync and an event cost the same whatever their shape, bytes and tag
SHAPE_FREE_KINDS = frozenset({OpKind.ISSUE, OpKind.HOST_SYNC, OpKind.EVENT_RECORD, OpKind.EVENT_WAIT})


def price_reads_shape(kind: OpKind, hw: HardwareProfile) -> bool:
    """Whether :func:`op_duration_s` may price an op of ``kind`` differently for another shape
    or byte count on ``hw`` (False: the kinds of :data:`SHAPE_FREE_KINDS`, outside
    ``executor_mode``, where a launch's price reads its tag and the attention table)."""
    return hw.executor_mode or kind not in SHAPE_FREE_KINDS


def op_duration_s(op: Op, hw: HardwareProfile, *, host_busy: bool = False) -> float:
    """Duration of one op in seconds.

    ``host_busy``: the plan ran a CPU-backend op before this one (see :func:`plan_durations`);
    in ``executor_mode`` a launch then also costs the profile's
    ``executor_busy_issue_s_by_kind`` for its kind.

    Raises:
        ValueError: an op kind the cost model does not know.
    """
    k = op.kind
    if hw.ggml is not None and not hw.executor_mode:
        t = ggml_duration_s(op, hw)
        if t is not None:
            return t
    if k is OpKind.H2D:
        return hw.h2d(op.pinned).time_s(op.nbytes)
    if k is OpKind.D2H:
        return hw.d2h.time_s(op.nbytes)
    if k is OpKind.GEMM:
        m, n, kk = op.shape[:3]
        return gemm_s(hw, m, n, kk, op.nbytes)
    if k is OpKind.MOE:
        m, n, kk, n_used, topk = op.shape[:5]
        wb = n_used * n * kk * hw.kernel_weight_bits / 8 if hw.kernel_weight_bits else op.nbytes
        # one grouped kernel over the used experts: never the dense table (it would count
        # one expert's weights), always the roofline on all used experts' bytes
        rows = m * topk
        return roofline_s(hw, 2.0 * rows * n * kk, wb + ACT_BYTES * rows * (n + kk))
    if k is OpKind.ATTN:
        n_tok, kv, nh, nkv, hd, window, linear, state = op.shape[:8]
        if not linear and hw.attn_table is not None:
            t = _attn_table_s(hw, n_tok, kv, nh, nkv, hd, window)
            if t is not None:
                return t + kv_copies_s(op.shape, hw)
        return attn_s(hw, n_tok, kv, nh, nkv, hd, window, bool(linear), state) + kv_copies_s(op.shape, hw)
    if k is OpKind.CPU_MATVEC:
        m, n, kk, mult = op.shape[:4]
        if hw.executor_mode and hw.executor_cpu_bytes_per_s > 0:
            return hw.executor_cpu_op_s + max(op.nbytes / hw.executor_cpu_bytes_per_s,
                                              2.0 * m * mult * n * kk / hw.cpu_flops_per_s)
        return cpu_s(hw, op.nbytes, 2.0 * m * mult * n * kk)
    if k is OpKind.HOST_SYNC:
        return hw.host_sync_s
    if k is OpKind.ISSUE:
        if not hw.executor_mode:
            return hw.op_issue_s
        issue = hw.executor_issue_s_by_kind.get(op.tag)  # a measured 0 is a price, not "unknown"
        if issue is None:
            issue = hw.executor_op_issue_s or hw.op_issue_s
        busy = hw.executor_busy_issue_s_by_kind.get(op.tag, 0.0) if host_busy else 0.0
        if op.tag == "attn" and op.shape and hw.attn_table is not None and "t_host_s" in hw.attn_table.columns:
            n_tok, kv, nh, nkv, hd, window, linear, _state = op.shape[:8]
            if not linear:
                t = _attn_table_s(hw, n_tok, kv, nh, nkv, hd, window, column="t_host_s")
                if t is not None:
                    return max(issue, t) + busy
        return issue + busy
    if k in (OpKind.EVENT_RECORD, OpKind.EVENT_WAIT):
        return hw.event_s
    if k is OpKind.HOST_WORK and op.tag == "kv_moved":
        # a profile without [ggml] figures: the copies only (no one-thread SET_ROWS rate, no
        # per-split host time: sim.plan.builder._launch_split_items)
        return kv_copies_s(op.shape, hw)
    if k is OpKind.HOST_WORK:
        n_ids = op.shape[0] if op.shape else 0
        if hw.executor_mode and (hw.executor_host_work_s or hw.executor_host_work_per_id_s):
            return hw.executor_host_work_s + hw.executor_host_work_per_id_s * n_ids
        return HOST_WORK_PER_ITEM_S * n_ids
    raise ValueError(f"no cost for op kind {k}")


def attn_durations_s(op: Op, hw: HardwareProfile, shapes: list[tuple]) -> np.ndarray | None:
    """:func:`op_duration_s` of the attention op ``op`` with each of ``shapes`` (K shapes that
    differ from one another only in the KV length, element 1) at once: (K,) float64 seconds,
    each the float :func:`op_duration_s` gives for ``op`` with that shape (the same operations,
    :meth:`sim.model.ggmlcost.GgmlKernels.flash_attn_gpu_many`), or None where that path does not
    price them (no ``[ggml]`` tables, ``executor_mode``, a linear or non-flash attention, no flash
    table: the caller prices them one by one).

    Raises:
        ValueError: ``op`` is not an attention, or the shapes differ beyond their KV length.
    """
    if op.kind is not OpKind.ATTN:
        raise ValueError(f"attn_durations_s: op {op.id} is a {op.kind.value}, not an attention")
    if not shapes:
        return np.zeros(0)
    sh0 = shapes[0]
    if any(len(sh) != len(sh0) or sh[0] != sh0[0] or sh[2:11] != sh0[2:11] for sh in shapes):
        raise ValueError("attn_durations_s: the shapes differ beyond their KV length")
    g = hw.ggml
    if g is None or hw.executor_mode or len(sh0) <= 10 or sh0[6] or not sh0[8]:
        return None
    return _flash_attn_kv_s(g, sh0, np.array([sh[1] for sh in shapes], dtype=np.int64))


def attn_durations_kv_s(op: Op, hw: HardwareProfile, kv_lens) -> np.ndarray | None:
    """:func:`attn_durations_s` of the attention op ``op`` at each of ``kv_lens`` ((K,) ints):
    its own shape with the KV length (element 1) replaced, without making the shapes (the
    same floats); None where that function answers None.

    Raises:
        ValueError: ``op`` is not an attention.
    """
    if op.kind is not OpKind.ATTN:
        raise ValueError(f"attn_durations_kv_s: op {op.id} is a {op.kind.value}, not an attention")
    sh0 = op.shape
    g = hw.ggml
    if g is None or hw.executor_mode or len(sh0) <= 10 or sh0[6] or not sh0[8]:
        return None
    kv = np.asarray(kv_lens, dtype=np.int64)
    if not kv.size:
        return np.zeros(0)
    return _flash_attn_kv_s(g, sh0, kv)


def _flash_attn_kv_s(g, sh0: tuple, kv: np.ndarray) -> np.ndarray | None:
    """The flash attention of shape ``sh0`` (its KV length aside) on the GPU at each KV length
    of ``kv`` ((K,) int64), plus its elementwise kernels: what :func:`ggml_duration_s` gives
    (:meth:`sim.model.ggmlcost.GgmlKernels.flash_attn_gpu_many`), or None without a flash table."""
    n_tok, _kv, nh, nkv, hd, window = sh0[:6]
    ew_k, ew_e = sh0[9:11]
    keys = np.minimum(kv + n_tok, window + n_tok) if window else kv + n_tok      # attended_keys
    t = g.flash_attn_gpu_many(n_tok, keys, nh, nkv, hd)
    if t is None:
        return None
    return t + g.elementwise_s("gpu", ew_k, 4.0 * ew_e * n_tok)


def kq_mask_durations_s(hw: HardwareProfile, entries: np.ndarray, nbytes: np.ndarray) -> np.ndarray | None:
    """:func:`op_duration_s` of a graph's KQ-mask host op (``HOST_WORK``, tag ``kq_mask``) at
    several shapes ``(entries[k], nbytes[k])`` ((K,) int64 each) at once: (K,) float64 seconds,
    each the float that function gives (the same operations: the ``[ggml]`` mask fill and the
    pinned copy of :func:`ggml_duration_s`), or None where that path does not price it (no
    ``[ggml]`` tables, ``executor_mode``: the caller prices them one by one)."""
    g = hw.ggml
    if g is None or hw.executor_mode:
        return None
    link = hw.h2d(True)
    nb = np.asarray(nbytes, dtype=np.int64)
    copy = np.where(nb != 0, link.latency_s + nb / link.bytes_per_s, 0.0)
    return g.mask_s * np.asarray(entries, dtype=np.int64) + copy


def kv_copies_s(shape: tuple, hw: HardwareProfile) -> float:
    """Copies of an attention op moved to the GPU from a layer on the CPU: elements 11 and 12
    of its shape (bytes); 0 for a layer on the GPU.

    * the layer's KV cache view in (element 11): H2D at the **pageable** rate: llama.cpp
      allocates the KV cache of a layer left on the CPU in the CPU backend's plain buffer type
      (``llama_kv_cache``: ``ggml_backend_dev_buffer_type`` of the layer's device), not in pinned
      memory;
    * the new K/V out (element 12, f32): D2H into the CPU backend's compute buffer, which is
      pinned (``llama_context``: the first GPU's host buffer type), then ggml-cpu's ``SET_ROWS``
      into the cache on **one thread** (``ggml_graph_plan``: ``n_tasks = 1`` for GET_ROWS and
      SET_ROWS) at the profile's ``[ggml] cpu_set_rows_gb_per_s`` (f32 bytes read), when the
      profile has one.
    """
    if len(shape) < 13 or not (shape[11] or shape[12]):
        return 0.0
    set_rows = hw.ggml.set_rows_s(shape[12]) if hw.ggml is not None else 0.0
    return hw.h2d(False).time_s(shape[11]) + hw.d2h.time_s(shape[12]) + set_rows


def ggml_duration_s(op: Op, hw: HardwareProfile) -> float | None:
    """Duration of ``op`` from the profile's llama.cpp kernel tables (:mod:`sim.model.ggmlcost`), or
    None for an op they do not price (copies, syncs, launches: the generic formulas; a weight
    whose ggml type has no measured kernel: the roofline)."""
    g = hw.ggml
    k = op.kind
    sh = op.shape
    if k is OpKind.GEMM and len(sh) > 3:
        m = sh[0]
        total = 0.0
        for ty, n_out, n_in, nb in sh[3]:
            t = g.matmul_s("gpu", ty, n_out, n_in, m, nb) if ty else None
            total += t if t is not None else gemm_s(hw, m, n_out, n_in, nb)
        return total
    if k is OpKind.MOE and len(sh) > 5 and sh[5]:
        m, n, kk, _n_used, topk = sh[:5]
        return g.moe_s("gpu", sh[5], n, kk, m, topk, op.nbytes)
    if k is OpKind.ATTN and len(sh) > 10 and not sh[6]:
        n_tok, kv, nh, nkv, hd, window = sh[:6]
        fa, ew_k, ew_e = sh[8:11]
        keys = attended_keys(n_tok, kv, window)
        t = g.attn_s("gpu", n_tok, keys, nh, nkv, hd, bool(fa))
        if t is None:
            t = attn_s(hw, n_tok, kv, nh, nkv, hd, window)
        # a moved attention's KV copies and extra splits are the host's (kv_moved, below)
        return t + g.elementwise_s("gpu", ew_k, 4.0 * ew_e * n_tok)
    if k is OpKind.CPU_MATVEC and len(sh) > 5 and g.cpu is not None:
        m, n, kk, mult, tag, inner = sh[:6]
        flops = hw.cpu_flops_per_s
        # the weightless nodes the scheduler keeps on the CPU beside the op (a bias add, the GLU
        # before a down projection: sim.plan.builder.ffn_cpu_nodes)
        ew = g.cpu_nodes_s(sh[6], sh[7], sh[8] if len(sh) > 8 else 0.0) if len(sh) > 7 else 0.0
        if tag == "mm":
            total = ew
            for ty, n_out, n_in, nb in inner[3]:
                total += (g.matmul_s("cpu", ty, n_out, n_in, m, nb, flops) if ty
                          else cpu_s(hw, nb, 2.0 * m * n_out * n_in))
            return total
        if tag == "moe" and inner[5]:
            t = g.moe_s("cpu", inner[5], n, kk, m, mult, op.nbytes, flops)
            return None if t is None else t + ew
        if tag == "rows":  # the token embedding's GET_ROWS: one thread, f32 rows out
            return g.get_rows_s(m * n)
        if tag == "attn" and len(inner) > 10 and not inner[6]:
            n_tok, kv, nh, nkv, hd, window = inner[:6]
            fa, ew_k, ew_e = inner[8:11]
            keys = attended_keys(n_tok, kv, window)
            t = g.attn_s("cpu", n_tok, keys, nh, nkv, hd, bool(fa))
            if t is None:
                t = cpu_s(hw, op.nbytes, float(n))
            else:  # ggml-cpu skips masked cells: the causal share of the rectangle
                t *= min(1.0, attn_pairs(n_tok, kv, window) / (n_tok * keys))
            # at and above the op-offload batch the scheduler runs the layer's weightless ops
            # next to its offloaded matmuls on the GPU; only the KV-bound ones stay on the CPU
            ew_on = "gpu" if n_tok >= OP_OFFLOAD_MIN_BATCH else "cpu"
            return t + g.elementwise_s(ew_on, ew_k, 4.0 * ew_e * n_tok)
        return None
    if k is OpKind.HOST_WORK and op.tag == "graph_overhead":  # sim.plan.builder.build_graph
        _kernels, n_tok, rebuilt, call_tok, n_layer, capture = sh
        t = g.graph_s + g.apply_per_token_s * n_tok + g.capture_per_layer_s * n_layer * capture
        if rebuilt:
            t += g.build_per_layer_s * n_layer
        if call_tok:
            t += g.call_s + g.call_per_token_s * call_tok
        return t
    if k is OpKind.HOST_WORK and op.tag == "split_overhead":
        return g.split_s
    if k is OpKind.HOST_WORK and op.tag == "cpu_split_overhead":
        return g.cpu_split_host_s
    if k is OpKind.HOST_WORK and op.tag == "kv_moved":  # sim.plan.builder._launch_split_items
        # the layer's extra splits: one on the CPU (the KV store's SET_ROWS), the rest on the GPU
        n = sh[13] if len(sh) > 13 else 0
        return kv_copies_s(sh, hw) + (((n - 1) * g.split_s + g.cpu_split_host_s) if n else 0.0)
    if k is OpKind.HOST_WORK and op.tag == "kq_mask":
        entries = sh[0] if sh else 0
        copy = hw.h2d(True).time_s(sh[1]) if len(sh) > 1 and sh[1] else 0.0
        return g.mask_s * entries + copy
    return None


def busy_mask(plan: Plan) -> np.ndarray:
    """The ops of ``plan`` priced in the executor's busy-host state: every CPU-backend op, and
    every launch (ISSUE) after the plan's first CPU-backend op (plan order). An ``(n,)`` bool
    array (from the plan's kind column)."""
    kind = plan.arrays.kind
    cpu = kind == KIND_CODE[OpKind.CPU_MATVEC]
    out = cpu.copy()
    if cpu.any():
        first = int(np.argmax(cpu))
        out[first:] |= kind[first:] == KIND_CODE[OpKind.ISSUE]
    return out


def direct_launch_s(plan: Plan, hw: HardwareProfile) -> np.ndarray | float:
    """``(n,)`` seconds each op of ``plan`` pays for being in a graph llama.cpp builds anew
    (0.0 when none is, or without ``[ggml]`` ``launch_s``): such a graph runs without a CUDA
    graph, its kernels launched one by one with the GPU idle between them for ``launch_s`` per
    kernel (:class:`sim.model.ggmlcost.GgmlKernels`), paid on the graph's GPU compute ops (the
    graph's kernels, :func:`sim.model.ggmlcost.graph_kernels`, spread evenly over its GPU ops: an item
    of the plan may be several kernels). A reused graph replays its CUDA graph: nothing."""
    rebuilt = plan.meta.get("rebuilt_graphs")
    if hw.ggml is None or hw.ggml.launch_s <= 0 or not rebuilt or not any(rebuilt) or not len(plan):
        return 0.0
    a = plan.arrays
    # one graph (a memo template): every op's graph is 0 (the graphs column is not read)
    graph = np.zeros(len(plan), dtype=np.int64) if len(rebuilt) == 1 else np.asarray(plan.graphs, dtype=np.int64)
    direct = np.asarray(rebuilt, dtype=bool)[graph]
    gpu = (a.stream == STREAM_CODE[Stream.COMPUTE]) & (a.kind != KIND_CODE[OpKind.H2D]) & direct
    per_graph = np.bincount(graph[gpu], minlength=len(rebuilt)).astype(float)
    kernels = np.asarray(plan.meta.get("graph_kernels", per_graph), dtype=float)
    share = np.divide(kernels, per_graph, out=np.zeros_like(per_graph), where=per_graph > 0)
    out = np.zeros(len(plan))
    out[gpu] = hw.ggml.launch_s * share[graph[gpu]]
    return out


def plan_durations(plan: Plan, hw: HardwareProfile) -> np.ndarray:
    """Durations (seconds) of every op of ``plan``: an ``(n,)`` float64 array.

    Ops are priced once per distinct ``(kind, bytes, shape, pinned, tag)``, read from the plan's
    columns (an :class:`~sim.plan.Op` is made only for the first op of each).

    In ``executor_mode`` the launches that come after the plan's first CPU-backend op (plan
    order) are priced with the profile's busy-host extra (``executor_busy_issue_s_by_kind``):
    from then on the executor's launches were measured slower (``calibrate.executor_costs``;
    likely the host's BLAS worker threads, which OpenBLAS keeps spinning for a while after each
    call, and the CPU caches the matvecs flushed). Those launches and the CPU-backend ops
    (:func:`busy_mask`) are then multiplied by ``executor_busy_scale``."""
    cache: dict = {}
    n = len(plan)
    mask = busy_mask(plan) if hw.executor_mode else None
    extras = hw.executor_mode and bool(hw.executor_busy_issue_s_by_kind)
    busy = mask & (plan.arrays.kind == KIND_CODE[OpKind.ISSUE]) if extras else None
    vals = []
    put = vals.append
    get = cache.get
    op_at = plan.op
    if not extras:
        # first by the shape object's id (a plan's ops share their items' shape tuples; every
        # shape is alive in the plan meanwhile, so an id names one shape), then by value
        by_id: dict = {}
        get_id = by_id.get
        for i, (k, nb, sh, pin, tag) in enumerate(zip(plan.kinds, plan.nbytes, plan.shapes, plan.pinned, plan.tags)):
            fk = (k, nb, id(sh), pin, tag)
            d = get_id(fk)
            if d is None:
                key = (k, nb, sh, pin, tag)
                d = get(key)
                if d is None:
                    d = cache[key] = op_duration_s(op_at(i), hw)
                by_id[fk] = d
            put(d)
    else:
        for i, key in enumerate(zip(plan.kinds, plan.nbytes, plan.shapes, plan.pinned, plan.tags)):
            hb = bool(busy[i])
            key = (*key, hb)  # tag: launched kind (executor_mode)
            d = get(key)
            if d is None:
                d = cache[key] = op_duration_s(op_at(i), hw, host_busy=hb)
            put(d)
    out = np.array(vals, dtype=np.float64) if n else np.empty(0, dtype=np.float64)
    if n:
        out += direct_launch_s(plan, hw)
    if hw.executor_mode and hw.executor_busy_scale != 1.0:
        out[mask] *= hw.executor_busy_scale
    return out


def class_durations(plan: Plan, hw: HardwareProfile, classes: np.ndarray, first: np.ndarray, *,
                    launch: np.ndarray | float | None = None) -> np.ndarray:
    """:func:`plan_durations` of a plan whose ops come partitioned into price classes by the
    builder (:func:`sim.plan.fastgraph.build_graph_columns`): ``classes`` (n,) int the class of each
    op, ``first`` (C,) int an op of each class; the ops of a class have equal ``(kind, bytes,
    shape, pinned, tag)``, so one :func:`op_duration_s` per class prices them all (the same
    numbers). ``launch``: :func:`direct_launch_s` of the plan when the caller has it. In
    ``executor_mode`` (busy-host prices depend on the op's position): :func:`plan_durations`.

    Returns:
        (n,) float64 seconds.

    Raises:
        ValueError: ``classes`` does not have one entry per op.
    """
    n = len(plan)
    if classes.shape != (n,):
        raise ValueError(f"classes: {classes.shape} entries for a plan of {n} ops")
    if hw.executor_mode or not n:
        return plan_durations(plan, hw)
    op_at = plan.priced_op
    prices = np.array([op_duration_s(op_at(i), hw) for i in first.tolist()], dtype=np.float64)
    out = prices[classes]
    out += direct_launch_s(plan, hw) if launch is None else launch
    return out


def prefixed_points(costs: dict, prefix: str) -> list[tuple[int, float]]:
    """``(x, value)`` of the keys ``<prefix><x>`` of ``costs`` (measured points such as
    ``loop_t_<bytes>`` or ``host_work_t_<ids>``), sorted by ``x``."""
    return sorted((int(k[len(prefix):]), float(v)) for k, v in costs.items() if k.startswith(prefix))


#: a host matvec line faster than this is a broken fit, not a measurement (10 TB/s: several times
#: the DRAM bandwidth of any current CPU socket)
MAX_HOST_BYTES_PER_S = 1e13


def fit_matvec_line(points) -> dict[str, float]:
    """Least-squares line ``t = cpu_op + bytes / cpu_bytes_per_s`` through ``(bytes, seconds)``
    points (at least two distinct sizes): ``{"cpu_op": s (clamped at 0), "cpu_bytes_per_s":
    B/s}``, or ``{}`` when the time does not grow with the bytes, or grows so little that the
    bandwidth would exceed :data:`MAX_HOST_BYTES_PER_S` (a disturbed measurement); a negative
    intercept is replaced by the line through the origin.
    Used for the executor's decode-loop matvec (``calibrate.executor_costs``)."""
    pts = sorted((float(b), float(t)) for b, t in points)
    if len({b for b, _t in pts}) < 2:
        return {}
    b = np.array([b for b, _t in pts])
    t = np.array([t for _b, t in pts])
    slope, icpt = np.polyfit(b, t, 1)
    if icpt < 0:  # a negative fixed cost is not physical: the line through the origin instead
        slope, icpt = float(b @ t / (b @ b)), 0.0
    if not slope > 0 or 1.0 / slope > MAX_HOST_BYTES_PER_S:
        return {}
    return {"cpu_op": float(icpt), "cpu_bytes_per_s": float(1.0 / slope)}


def fit_host_work_line(points) -> dict[str, float]:
    """``{"host_work": s per op, "host_work_per_id": s per router id}`` (both clamped at 0):
    the line through the smallest and the largest of ``(router ids, seconds per op)`` points,
    or ``{}`` with fewer than two distinct counts. Used for the executor's host work of
    building expert runs (``calibrate.executor_costs``)."""
    pts = sorted((int(n), float(t)) for n, t in points)
    if len({n for n, _t in pts}) < 2:
        return {}
    (lo, t_lo), (hi, t_hi) = pts[0], pts[-1]
    slope = max((t_hi - t_lo) / (hi - lo), 0.0)
    return {"host_work": max(t_lo - slope * lo, 0.0), "host_work_per_id": slope}

