"""The thin real executor: runs a :class:`sim.plan.Plan` on a GPU with CuPy and measures it.

Two halves:

* :func:`translate` (pure Python, tested on a CPU) turns a plan into a :class:`Program`:
  where each copy lands (staging slot or split input buffer, byte offset), where its source
  bytes come from in the host pool, which copies each compute op consumes (its
  *producers*), which ``ISSUE`` op launches which GPU op, the cross-stream waits, and the
  values the staged bytes must hold when their consumer runs.
* :func:`execute` runs the program (CuPy imported lazily): ops in plan order on the host
  thread; one CUDA stream per plan queue (``compute0``, ``copy0`` ...), all non-blocking;
  CUDA events for dependencies across streams; host syncs as event synchronisation;
  pageable copies from numpy memory (the call blocks the host), pinned ones from a
  ``cupyx.empty_pinned`` pool; staging slots preallocated; GEMMs of the op's (m, n, k) in
  f16; MoE ops as one grouped (strided-batched) GEMM over ``n_used`` experts with
  ``m·top_k`` rows in total; softmax attention of the op's shape as one prepared
  :func:`calibrate.measure.attention_call` (per chunk of query rows: a QKᵀ GEMM, an in-place
  f16 row-softmax kernel, a PV GEMM, on a score buffer per stream); CPU ops as numpy matvecs
  on the host. Every op's start and end is recorded — CUDA events for GPU ops, the host clock
  for host ops — and mapped onto one time axis; the result is a trace with exactly the schema
  of :mod:`sim.views.trace` (``engine="executor"``).

Losslessness. Two checks, both schedule-independent by construction:

1. *Staging probes.* Every host byte of the source pools is a known function of its
   position, and every copy's source offset is fixed by its name, so the first and last
   32-bit word each copy writes are known in advance. Right before and right after a
   compute op that consumes staged weights, a one-thread kernel on the consumer's stream
   reads those words from the staging buffer. A consumer that ran before its copy finished
   (missing ready wait) or after another copy reused its slot (missing free wait) reads
   other words; :class:`ExecutorHazardError` names the op.
2. *Output digest.* The first and last word of every compute op's output (GEMMs on fixed
   pseudo-random weights chosen by the op's name, so the result depends only on the op,
   never on when it ran) are hashed, keyed by (graph, name, shape); variants of one scenario
   must give the same digest (:func:`check_lossless`).

Byte sizes: copies move ``round(nbytes * byte_scale)`` bytes (4-byte aligned) so that large
models fit; compute shapes are never scaled. The scale is recorded in the result.
"""

from __future__ import annotations

import gc
import hashlib
import math
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from sim.model.costs import attn_keys  # keys attended; shared with the cost model
from sim.errors import PrefetchSimError
from sim.plan import COMPUTE_KINDS, OpKind, Plan, Schedule, Stream

perf = time.perf_counter

#: kinds whose ops run on a GPU queue and are timed with CUDA events
_GPU_QUEUES = (Stream.COMPUTE, Stream.COPY)
_GPU_COMPUTE = (OpKind.GEMM, OpKind.MOE, OpKind.ATTN)
#: bytes of one random weight set per GEMM shape before a new copy is taken (L2 is 60 MB on
#: an H200; several copies keep a weight's read cold, as each layer's weight is in a model)
_WEIGHT_ROTATION_BYTES = 96 * 2**20
_MAX_WEIGHT_COPIES = 16
_ALIGN = 4096


class ExecutorHazardError(PrefetchSimError):
    """A compute op read staged bytes that were not (or no longer) the ones its copy wrote.

    Attributes:
        mismatches: list of dicts (op_id, name, when, producer, expected, got).
    """

    def __init__(self, message: str, mismatches: list[dict]):
        super().__init__(message)
        self.mismatches = mismatches


class LosslessnessError(PrefetchSimError):
    """Variants of one scenario produced different model outputs."""


# ---------------------------------------------------------------------------------------
# the host pool's byte pattern
# ---------------------------------------------------------------------------------------


def pool_words(idx) -> np.ndarray:
    """The uint32 word at word index ``idx`` of the host source pools (pinned and
    pageable hold the same pattern): ``(i * 2654435761) xor 0x5A5A5A5A`` mod 2³²."""
    i = np.asarray(idx, dtype=np.uint64)
    return (((i * np.uint64(2654435761)) & np.uint64(0xFFFFFFFF)) ^ np.uint64(0x5A5A5A5A)).astype(np.uint32)


def fill_pool(a: np.ndarray) -> None:
    """Write the pattern of :func:`pool_words` into a uint8 array (in chunks)."""
    words = a.size // 4
    w = a[: words * 4].view(np.uint32)
    chunk = 1 << 24
    for s in range(0, words, chunk):
        e = min(words, s + chunk)
        w[s:e] = pool_words(np.arange(s, e, dtype=np.uint64))


def _hash(text: str) -> int:
    return zlib.crc32(text.encode())


# ---------------------------------------------------------------------------------------
# translation
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CopyPlace:
    """Where one copy goes.

    Attributes:
        op_id: the H2D or D2H op.
        buffer: staging buffer key — ``("slot", device, slot, slot_bytes)`` for staging slots,
            ``("input", device)`` for a split's input buffer (slot -1), ``("d2h", device)``
            for device-to-host copies.
        offset: byte offset in that buffer.
        nbytes: bytes copied (after ``byte_scale``).
        src_offset: byte offset in the host pool (H2D).
        pinned: source in pinned memory.
        host_queue: the copy is a host-queue op (blocks the host thread).
    """

    op_id: int
    buffer: tuple
    offset: int
    nbytes: int
    src_offset: int
    pinned: bool
    host_queue: bool

    @property
    def head_word(self) -> int:
        return int(pool_words(self.src_offset // 4))

    @property
    def tail_word(self) -> int:
        return int(pool_words((self.src_offset + self.nbytes) // 4 - 1))


@dataclass
class Program:
    """A plan translated for execution (see the module docstring).

    Attributes:
        plan: the plan.
        byte_scale: copy sizes were multiplied by this.
        copies: op id -> :class:`CopyPlace` for every H2D/D2H op with bytes to move.
        buffers: buffer key -> bytes to allocate.
        host_pool_bytes: size of each host source pool (pinned and pageable).
        producers: compute op id -> the H2D op ids whose bytes it reads.
        fused_issue: ISSUE op id -> the GPU op it launches (launched at the ISSUE).
        gpu_deps: op id -> dependencies that are GPU-queue ops (a GPU op waits on those on
            other queues with an event; a host op synchronises on all of them).
        gemm_shapes: distinct (n, k) of GEMM ops with their largest m.
        moe_shapes: (n, k) -> (largest n_used, largest padded rows per expert).
        attn_shapes: (n_head, n_head_kv, head_dim, linear, state) -> largest (tokens, keys).
        host_work_max: router ids of the largest host-work op (its id buffer).
        out_elems: largest compute output (elements).
    """

    plan: Plan
    byte_scale: float
    copies: dict[int, CopyPlace]
    buffers: dict[tuple, int]
    host_pool_bytes: int
    producers: dict[int, list[int]]
    fused_issue: dict[int, int]
    gpu_deps: dict[int, list[int]]
    gemm_shapes: dict[tuple[int, int], int]
    moe_shapes: dict[tuple[int, int], tuple[int, int]]
    attn_shapes: dict[tuple, tuple[int, int]]
    host_work_max: int
    out_elems: int
    devices: tuple[int, ...] = ()

    def probe_entries(self, op_id: int) -> list[tuple[int, str, int]]:
        """``(copy op id, "head"|"tail", expected word)`` the consumer ``op_id`` checks."""
        out = []
        for c in self.producers.get(op_id, []):
            cp = self.copies[c]
            out.append((c, "head", cp.head_word))
            out.append((c, "tail", cp.tail_word))
        return out


def _scaled(nbytes: int, scale: float) -> int:
    if nbytes <= 0:
        return 0
    return max(8, int(nbytes * scale) // 4 * 4)


def _is_gpu_queue(op) -> bool:
    return op.stream in _GPU_QUEUES


def moe_rows_per_expert(m: int, topk: int, n_used: int) -> int:
    """Rows per expert of the grouped GEMM: ``ceil(m·top_k / n_used)`` (0 if none used)."""
    if n_used <= 0 or m <= 0 or topk <= 0:
        return 0
    return math.ceil(m * topk / n_used)


def translate(plan: Plan, *, byte_scale: float = 1.0) -> Program:
    """Translate a plan into a :class:`Program` (pure; no GPU needed).

    Raises:
        ValueError: ``byte_scale`` not in (0, 1], or an op kind the executor cannot run.
    """
    if not (0 < byte_scale <= 1):
        raise ValueError(f"byte_scale must be in (0, 1], got {byte_scale}")
    ops = plan.ops
    n = len(ops)
    # -- copies: buffers and offsets -------------------------------------------------
    group_fill: dict[tuple, int] = defaultdict(int)  # (buffer, graph, split) -> bytes used
    buffers: dict[tuple, int] = defaultdict(int)
    places: dict[int, CopyPlace] = {}
    max_copy = 0
    for op in ops:
        if op.kind not in (OpKind.H2D, OpKind.D2H):
            continue
        nb = _scaled(op.nbytes, byte_scale)
        if nb == 0:
            continue
        dev = max(op.device, 0)
        if op.kind is OpKind.D2H:
            key: tuple = ("d2h", dev)
        elif op.slot >= 0:
            key = ("slot", dev, op.slot, op.slot_bytes)
        else:
            key = ("input", dev)
        g = (key, op.graph, op.split)
        off = group_fill[g]
        group_fill[g] = off + (nb + 255) // 256 * 256
        buffers[key] = max(buffers[key], off + nb)
        max_copy = max(max_copy, nb)
        places[op.id] = CopyPlace(op.id, key, off, nb, 0, bool(op.pinned), op.stream is Stream.HOST)
    pool = max_copy + 64 * 2**20 if max_copy else 0
    for oid, p in list(places.items()):
        if ops[oid].kind is OpKind.H2D:
            span = (pool - p.nbytes) // _ALIGN
            src = (_hash(ops[oid].name) % (span + 1)) * _ALIGN
            places[oid] = CopyPlace(p.op_id, p.buffer, p.offset, p.nbytes, src, p.pinned, p.host_queue)
    # -- producers of each GPU compute op ---------------------------------------------
    producers: dict[int, list[int]] = {}
    last_into: dict[tuple, int] = {}            # buffer key -> latest H2D op id
    split_copies: dict[tuple, list[int]] = defaultdict(list)  # (dev, graph, split) -> input H2Ds
    consumed_split: set[tuple] = set()
    for op in ops:
        if op.kind is OpKind.H2D and op.id in places:
            p = places[op.id]
            last_into[p.buffer] = op.id
            if p.buffer[0] == "input":
                split_copies[(p.buffer[1], op.graph, op.split)].append(op.id)
            continue
        if op.kind not in _GPU_COMPUTE or not _is_gpu_queue(op):
            continue
        dev = max(op.device, 0)
        if op.slot >= 0:
            key = ("slot", dev, op.slot, op.slot_bytes)
            direct = [d for d in op.deps if d in places and places[d].buffer == key
                      and ops[d].kind is OpKind.H2D]
            if direct:
                last = max(direct)
            elif key in last_into:
                last = last_into[key]
            else:
                continue
            # the copy it waits for, with any copies packed beside it in the slot
            producers[op.id] = sorted(
                c for c, p in places.items() if p.buffer == key and ops[c].graph == ops[last].graph
                and ops[c].split == ops[last].split and c <= last and ops[c].kind is OpKind.H2D)
        else:
            sk = (dev, op.graph, op.split)
            if sk in split_copies and sk not in consumed_split:
                consumed_split.add(sk)
                producers[op.id] = [c for c in split_copies[sk] if c < op.id]
    # -- issue fusion and GPU dependencies ---------------------------------------------
    fused: dict[int, int] = {}
    for op in ops:
        if op.kind is OpKind.ISSUE and op.id + 1 < n:
            nxt = ops[op.id + 1]
            if _is_gpu_queue(nxt) and op.id in nxt.deps:
                fused[op.id] = nxt.id
    gpu_deps = {op.id: [d for d in op.deps if _is_gpu_queue(ops[d])] for op in ops}
    # -- compute resources -------------------------------------------------------------
    gemm: dict[tuple[int, int], int] = {}
    moe: dict[tuple[int, int], tuple[int, int]] = {}
    attn: dict[tuple, tuple[int, int]] = {}
    work_max = 0
    out_elems = 1
    for op in ops:
        k = op.kind
        if k is OpKind.GEMM and _is_gpu_queue(op):
            m, nn, kk = (int(x) for x in op.shape[:3])
            gemm[(nn, kk)] = max(gemm.get((nn, kk), 0), m)
            out_elems = max(out_elems, m * nn)
        elif k is OpKind.MOE and _is_gpu_queue(op):
            m, nn, kk, n_used, topk = (int(x) for x in op.shape[:5])
            r = moe_rows_per_expert(m, topk, n_used)
            u0, r0 = moe.get((nn, kk), (0, 0))
            moe[(nn, kk)] = (max(u0, n_used), max(r0, r))
            out_elems = max(out_elems, n_used * r * nn)
        elif k is OpKind.ATTN and _is_gpu_queue(op):
            n_tok, kv, nh, nkv, hd, window, linear, state = (int(x) for x in op.shape[:8])
            keys = attn_keys(n_tok, kv, window)
            akey = (nh, nkv, hd, bool(linear), state if linear else 0)
            t0, k0 = attn.get(akey, (0, 0))
            attn[akey] = (max(t0, n_tok), max(k0, keys))
            out_elems = max(out_elems, nh * n_tok * hd)
        elif k is OpKind.HOST_WORK:
            work_max = max(work_max, int(op.shape[0]) if op.shape else 0)
        elif k not in (OpKind.H2D, OpKind.D2H, OpKind.HOST_SYNC, OpKind.ISSUE, OpKind.EVENT_RECORD,
                       OpKind.EVENT_WAIT, OpKind.CPU_MATVEC):
            if k in COMPUTE_KINDS and not _is_gpu_queue(op):
                raise ValueError(f"op {op.id} ({op.name}): {k.value} on the {op.stream.value} queue; "
                                 "the executor runs GEMM/MoE/attention on GPU queues only")
            raise ValueError(f"op {op.id} ({op.name}): the executor cannot run kind {k.value}")
    devices = tuple(sorted({max(op.device, 0) for op in ops if _is_gpu_queue(op) or op.kind in (OpKind.H2D, OpKind.D2H)}))
    return Program(plan, byte_scale, places, dict(buffers), pool, producers, fused, gpu_deps, gemm, moe, attn,
                   work_max, out_elems, devices)


# ---------------------------------------------------------------------------------------
# execution
# ---------------------------------------------------------------------------------------


@dataclass
class ExecResult:
    """One measured execution of a plan.

    Attributes:
        trace: the trace (:data:`sim.views.trace.TRACE_COLUMNS`, ``engine="executor"``).
        schedule: the same times as a :class:`sim.plan.Schedule`.
        makespan_s: end of the last op of the reported run (the median-makespan repeat).
        makespans_s: makespan of every timed repeat.
        digest: hash of the compute outputs (see :func:`check_lossless`).
        outputs: (graph, name, kind, shape, occurrence) -> output words (for diffs).
        probes_checked: staging words compared with their expected values.
        byte_scale: the copy scale used.
        h2d_bytes: bytes copied host→device in one run (after scaling).
        h2d_busy_s: measure of the union of H2D op intervals.
        h2d_bytes_per_s: ``h2d_bytes / h2d_busy_s`` (achieved while copying).
        h2d_op_bytes_per_s: median over H2D ops of ``bytes / duration`` for ops of at least
            1 MiB (NaN if none).
        host_op_s: (n,) full host time of each host op (NaN for GPU ops); an ISSUE op's
            trace interval may be shorter (see :func:`execute`).
        device: GPU name.
        notes: the runtime's log lines.
        align_s: how well the reported run placed the GPU's event clock on the host clock
            (seconds: half the host-time window around the reference event's record); a host
            op and a GPU op it depends on are ordered to within it.
    """

    trace: pd.DataFrame
    schedule: Schedule
    makespan_s: float
    makespans_s: list[float]
    digest: str
    outputs: dict
    probes_checked: int
    byte_scale: float
    h2d_bytes: int
    h2d_busy_s: float
    h2d_bytes_per_s: float
    h2d_op_bytes_per_s: float
    host_op_s: np.ndarray | None = None
    device: str = ""
    notes: list[str] = field(default_factory=list)
    align_s: float = 0.0


class _Runtime:
    """GPU resources of one program: streams, buffers, pools, weights, events, probes."""

    def __init__(self, cp, prog: Program, *, seed: int, fold_devices: bool, probes: bool):
        from . import measure as M  # noqa: PLC0415

        self.cp = cp
        self.M = M
        self.prog = prog
        plan = prog.plan
        ndev = int(cp.cuda.runtime.getDeviceCount())
        if any(d >= ndev for d in prog.devices) and not fold_devices:
            raise PrefetchSimError(
                f"the plan uses GPUs {list(prog.devices)} but {ndev} is visible; pass fold_devices=True to run every "
                "plan device's streams on GPU 0")
        cp.cuda.Device(0).use()
        props = cp.cuda.runtime.getDeviceProperties(0)
        name = props.get("name", "?")
        self.device_name = name.decode() if isinstance(name, bytes) else str(name)
        self.g = M.open_gpu(cp, seed=seed)
        self.streams: dict[tuple[str, int], Any] = {}
        for op in plan.ops:
            if _is_gpu_queue(op):
                key = (op.stream.value, op.device)
                if key not in self.streams:
                    self.streams[key] = cp.cuda.Stream(non_blocking=True)
        self.host_copy_stream = cp.cuda.Stream(non_blocking=True)
        self.default_stream = next(iter(self.streams.values()), self.host_copy_stream)
        rng = np.random.default_rng(seed)
        # buffers
        self.buf = {k: cp.empty(max(v, 8), dtype=cp.uint8) for k, v in prog.buffers.items()}
        self.pinned = M.alloc_pinned(self.g, max(prog.host_pool_bytes, 8))
        fill_pool(self.pinned)
        self.pageable = np.empty(max(prog.host_pool_bytes, 8), dtype=np.uint8)
        fill_pool(self.pageable)
        d2h_max = max([p.nbytes for p in prog.copies.values() if p.buffer[0] == "d2h"] + [8])
        self.d2h_host = M.alloc_pinned(self.g, d2h_max)
        # compute weights and inputs (f16, fixed by the seed)
        gen = self.g.rng
        f16 = cp.float16

        def randn(shape, scale):
            return (gen.standard_normal(shape, dtype=cp.float32) * scale).astype(f16)

        self.gemm_w: dict[tuple[int, int], list] = {}
        self.x: dict[int, Any] = {}
        max_rows: dict[int, int] = defaultdict(int)
        for (n, k), m in prog.gemm_shapes.items():
            copies = int(min(_MAX_WEIGHT_COPIES, max(1, math.ceil(_WEIGHT_ROTATION_BYTES / (2 * n * k)))))
            self.gemm_w[(n, k)] = [randn((k, n), 1.0 / math.sqrt(k)) for _ in range(copies)]
            max_rows[k] = max(max_rows[k], m)
        self.moe_w: dict[tuple[int, int], Any] = {}
        for (n, k), (u, r) in prog.moe_shapes.items():
            if u > 0:
                self.moe_w[(n, k)] = randn((u, k, n), 1.0 / math.sqrt(k))
                max_rows[k] = max(max_rows[k], u * r)
        for k, rows in max_rows.items():
            self.x[k] = randn((max(rows, 1) * k,), 1.0)
        self.attn_kv: dict[tuple, tuple] = {}
        for (nh, nkv, hd, linear, state), (tok, keys) in prog.attn_shapes.items():
            if linear:
                q = randn((nh, tok, hd), 1.0)
                s1 = randn((nh, hd, state), 1.0 / math.sqrt(hd))
                s2 = randn((nh, state, hd), 1.0 / math.sqrt(state))
                mid = cp.empty((nh, tok, state), dtype=f16)
                self.attn_kv[(nh, nkv, hd, linear, state)] = (q, s1, s2, mid)
            else:
                grp = nh // nkv
                q = randn((nkv, grp * tok, hd), 1.0)
                kk = randn((nkv, max(keys, 1), hd), 1.0)
                vv = randn((nkv, max(keys, 1), hd), 1.0)
                self.attn_kv[(nh, nkv, hd, linear, state)] = (q, kk, vv)
        self.out_ring = [cp.empty(max(prog.out_elems, 2), dtype=f16) for _ in range(4)]
        # one f16 score buffer per stream for its (softmax) attention ops, sized for the
        # largest chunk (capped at M.ATTN_SCORE_BYTES, the calibration's cap, so ops chunk as
        # attn_table was measured); the ops of one stream run one after another and share it
        score_elems: dict[tuple[str, int], int] = defaultdict(int)
        for op in plan.ops:
            if op.kind is OpKind.ATTN and _is_gpu_queue(op):
                n_tok, kv, nh, nkv, _hd, window, linear = (int(x) for x in op.shape[:7])
                if not linear and n_tok > 0:
                    key = (op.stream.value, op.device)
                    need = M.attention_score_elems(nkv, (nh // nkv) * n_tok, attn_keys(n_tok, kv, window))
                    score_elems[key] = max(score_elems[key], need)
        self.scores = {key: cp.empty(max(n_el, 1), dtype=f16) for key, n_el in score_elems.items()}
        # CPU-backend weights: a real model's host weights are distinct memory, read once per
        # token (a MoE layer reads other experts for every token), so re-reading one buffer
        # would run from the CPU caches. Each tensor name gets a region of ``rot`` windows of
        # its largest op and every occurrence reads the next window; ``rot`` is chosen so the
        # regions add up to at least 1 GiB (beyond any L3 cache; the profile's cpu_gb_per_s is
        # measured over 1 GiB) and at most 4 GiB, where regions wrap.
        cpu_ops = [op for op in plan.ops if op.kind is OpKind.CPU_MATVEC]
        win: dict[str, int] = {}
        for op in cpu_ops:
            win[op.name] = max(win.get(op.name, 0), max(int(op.nbytes) // 4, 1))
        total = sum(win.values())
        rot = max(1, -(-(1 << 28) // max(total, 1)))  # 2**28 f32 = 1 GiB
        cap = 1 << 30  # f32 elements (4 GiB)
        self.cpu_off: dict[int, int] = {}
        start, base_of = 0, {}
        for nm in sorted(win):
            size = win[nm] * rot
            if start + size > cap:
                start = 0
            base_of[nm] = start
            start += size
        seen: dict[str, int] = defaultdict(int)
        for op in cpu_ops:
            i = seen[op.name]
            seen[op.name] += 1
            self.cpu_off[op.id] = base_of[op.name] + (i % rot) * win[op.name]
        self.cpu_a = np.empty(max((base_of[nm] + win[nm] * rot for nm in win), default=1), dtype=np.float32)
        base = rng.standard_normal(1 << 16, dtype=np.float32)
        for s0 in range(0, self.cpu_a.size, base.size):
            chunk = self.cpu_a[s0:s0 + base.size]
            chunk[:] = base[: chunk.size]
        self.ids = rng.integers(0, 256, size=max(prog.host_work_max, 1), dtype=np.int32)
        # events
        n = len(plan.ops)
        self.ev_s = [None] * n
        self.ev_e = [None] * n
        for op in plan.ops:
            if _is_gpu_queue(op):
                self.ev_s[op.id] = cp.cuda.Event()
                self.ev_e[op.id] = cp.cuda.Event()
        self.ev0 = cp.cuda.Event()
        self.scratch_ev = cp.cuda.Event()
        self.done_ev = cp.cuda.Event()
        self.done_ev.record(self.default_stream)
        self.default_stream.synchronize()
        # probes: per consumer, the addresses of its producers' head/tail words, then (post
        # only) of its output's first and last words
        self.probes = probes
        self.pre: dict[int, tuple[int, int]] = {}
        self.post: dict[int, tuple[int, int, int]] = {}
        addrs: list[int] = []
        self.expected: list[tuple[int, int, str, int, str]] = []  # (index, op, producer, word, when)
        for op in plan.ops:
            if op.kind not in _GPU_COMPUTE or not _is_gpu_queue(op):
                continue
            ent = prog.probe_entries(op.id)
            words = []
            for c, which, word in ent:
                p = prog.copies[c]
                base = int(self.buf[p.buffer].data.ptr) + p.offset
                words.append((base if which == "head" else base + p.nbytes - 4, c, which, word))
            if ent:
                self.pre[op.id] = (len(addrs), len(words))
                for a, c, which, word in words:
                    self.expected.append((len(addrs), op.id, f"{ops_name(plan, c)} ({which})", word, "before"))
                    addrs.append(a)
            self.post[op.id] = (len(addrs), len(words) + 2, len(words))
            for a, c, which, word in words:
                self.expected.append((len(addrs), op.id, f"{ops_name(plan, c)} ({which})", word, "after"))
                addrs.append(a)
            addrs.extend([0, 0])  # output words, filled per launch (the ring buffer in use)
        # the output ring buffer of each compute op is fixed, so are its output words
        self.out_of: dict[int, Any] = {}
        ring_i = 0
        for op in plan.ops:
            if op.kind in _GPU_COMPUTE and _is_gpu_queue(op):
                buf = self.out_ring[ring_i % len(self.out_ring)]
                ring_i += 1
                self.out_of[op.id] = buf
                start, cnt, nprod = self.post[op.id]
                nel = self._out_elems(op)
                base = int(buf.data.ptr)
                addrs[start + nprod] = base
                addrs[start + nprod + 1] = base + max((nel * 2 - 4) // 4 * 4, 0)
        self.addr_host = np.array(addrs + [0], dtype=np.uint64)
        self.addr_dev = cp.asarray(self.addr_host)
        self.probe_out = cp.zeros(max(len(addrs), 1), dtype=cp.uint32)
        # each GPU op's launch, prepared once: (stream, ops to wait for, pre-probe, body,
        # post-probe); the hot loop then only calls them
        self.fast = bool(self.g.batched_gemm) and not getattr(cp, "IS_FAKE", False)
        self.steps: dict[int, tuple] = {}
        for op in plan.ops:
            if not _is_gpu_queue(op):
                continue
            st = self.streams[(op.stream.value, op.device)]
            q = (op.stream, op.device)
            waits = tuple(d for d in prog.gpu_deps[op.id] if (plan.ops[d].stream, plan.ops[d].device) != q)
            pre = self._probe_call(*self.pre[op.id]) if probes and op.id in self.pre else None
            post = self._probe_call(*self.post[op.id][:2]) if probes and op.id in self.post else None
            self.steps[op.id] = (st, waits, pre, self._body(op, st), post)
        # everything above ran on the legacy default stream, which the executor's
        # non-blocking streams do not wait for: finish it before any op runs
        cp.cuda.runtime.deviceSynchronize()

    def _probe_call(self, start: int, count: int):
        if count <= 0:
            return None
        args = (self.addr_dev[start:start + count], np.int32(count), self.probe_out[start:start + count])
        grid, kern = ((count + 127) // 128,), self.g.probe
        return lambda: kern(grid, (128,), args)

    def _body(self, op, stream):
        """A no-argument callable issuing the op's GPU work on the current stream."""
        cp = self.cp
        if op.kind in (OpKind.H2D, OpKind.D2H):
            p = self.prog.copies.get(op.id)
            if p is None:
                return lambda: None
            memcpy = cp.cuda.runtime.memcpyAsync
            if op.kind is OpKind.H2D:
                host = self.pinned if p.pinned else self.pageable
                args = (int(self.buf[p.buffer].data.ptr) + p.offset, int(host.ctypes.data) + p.src_offset,
                        p.nbytes, 1, stream.ptr)
            else:
                args = (int(self.d2h_host.ctypes.data), int(self.buf[p.buffer].data.ptr), p.nbytes, 2, stream.ptr)
            return lambda: memcpy(*args)
        if op.kind is OpKind.ATTN:
            return self._attn_call(op)
        if not self.fast:
            return lambda: self.compute(op)
        out = self.out_of[op.id]
        if op.kind is OpKind.GEMM:
            m, n, k = (int(x) for x in op.shape[:3])
            if m <= 0:
                return lambda: None
            ws = self.gemm_w[(n, k)]
            w = ws[_hash(op.name) % len(ws)]
            return self.M.bgemm_call(self.g, self.x[k][: m * k].reshape(1, m, k), w.reshape(1, k, n),
                                     out[: m * n].reshape(1, m, n))
        m, n, k, u, topk = (int(x) for x in op.shape[:5])
        r = moe_rows_per_expert(m, topk, u)
        if r == 0:
            return lambda: None
        return self.M.bgemm_call(self.g, self.x[k][: u * r * k].reshape(u, r, k), self.moe_w[(n, k)][:u],
                                 out[: u * r * n].reshape(u, r, n))

    def _attn_call(self, op):
        """Softmax attention as one prepared :func:`calibrate.measure.attention_call` (two
        cuBLAS GEMMs and the softmax kernel, per chunk of query rows) on the stream's score
        buffer; linear attention through :meth:`compute`."""
        n_tok, kv, nh, nkv, hd, window, linear, _state = (int(x) for x in op.shape[:8])
        if linear:
            return lambda: self.compute(op)
        if n_tok <= 0:
            return lambda: None
        q, kk, vv = self.attn_kv[(nh, nkv, hd, False, 0)]
        keys = attn_keys(n_tok, kv, window)
        rows = (nh // nkv) * n_tok
        out = self.out_of[op.id][: nkv * rows * hd].reshape(nkv, rows, hd)
        return self.M.attention_call(self.g, q[:, :rows], kk[:, :keys], vv[:, :keys], out,
                                     scores=self.scores[(op.stream.value, op.device)])

    # -- sizes ------------------------------------------------------------------------
    @staticmethod
    def _out_elems(op) -> int:
        if op.kind is OpKind.GEMM:
            m, n, _k = (int(x) for x in op.shape[:3])
            return m * n
        if op.kind is OpKind.MOE:
            m, n, _k, u, topk = (int(x) for x in op.shape[:5])
            return u * moe_rows_per_expert(m, topk, u) * n
        n_tok, _kv, nh, _nkv, hd = (int(x) for x in op.shape[:5])
        return nh * n_tok * hd

    # -- op bodies --------------------------------------------------------------------
    def compute(self, op) -> None:
        cp = self.cp
        out = self.out_of[op.id]
        if op.kind is OpKind.GEMM:
            m, n, k = (int(x) for x in op.shape[:3])
            if m <= 0:
                return
            ws = self.gemm_w[(n, k)]
            w = ws[_hash(op.name) % len(ws)]
            x = self.x[k][: m * k].reshape(m, k)
            cp.dot(x, w, out=out[: m * n].reshape(m, n))
        elif op.kind is OpKind.MOE:
            m, n, k, u, topk = (int(x) for x in op.shape[:5])
            r = moe_rows_per_expert(m, topk, u)
            if r == 0:
                return
            w = self.moe_w[(n, k)][:u]
            x = self.x[k][: u * r * k].reshape(u, r, k)
            self.M.bgemm(self.g, x, w, out[: u * r * n].reshape(u, r, n))
        else:
            n_tok, kv, nh, nkv, hd, window, linear, state = (int(x) for x in op.shape[:8])
            if n_tok <= 0:
                return
            res = self.attn_kv[(nh, nkv, hd, bool(linear), state if linear else 0)]
            if linear:
                q, s1, s2, mid = res
                self.M.bgemm(self.g, q[:, :n_tok], s1, mid[:, :n_tok])
                self.M.bgemm(self.g, mid[:, :n_tok], s2, out[: nh * n_tok * hd].reshape(nh, n_tok, hd))
            else:
                q, kk, vv = res
                keys = attn_keys(n_tok, kv, window)
                grp = nh // nkv
                qq = q[:, : grp * n_tok]
                self.M.attention(self.g, qq, kk[:, :keys], vv[:, :keys],
                                 out[: nkv * grp * n_tok * hd].reshape(nkv, grp * n_tok, hd))

    def copy(self, op, stream) -> None:
        p = self.prog.copies.get(op.id)
        if p is None:
            return
        rt = self.cp.cuda.runtime
        dst_buf = int(self.buf[p.buffer].data.ptr) + p.offset if p.buffer[0] != "d2h" else None
        if op.kind is OpKind.H2D:
            host = self.pinned if p.pinned else self.pageable
            rt.memcpyAsync(dst_buf, int(host.ctypes.data) + p.src_offset, p.nbytes, 1, stream.ptr)
        else:
            rt.memcpyAsync(int(self.d2h_host.ctypes.data), int(self.buf[p.buffer].data.ptr), p.nbytes, 2,
                           stream.ptr)

    def cpu_matvec(self, op) -> np.ndarray:
        nb = int(op.nbytes)
        elems = max(nb // 4, 1)
        m, _n, k = (int(x) for x in op.shape[:3]) if len(op.shape) >= 3 else (1, 1, elems)
        kk = int(max(1, min(k, elems)))
        rows = max(1, elems // kk)
        off = self.cpu_off.get(op.id, 0)
        a = self.cpu_a[off: off + rows * kk].reshape(rows, kk)
        x = np.linspace(-1, 1, kk * max(m, 1), dtype=np.float32).reshape(kk, max(m, 1))
        return a @ x


def ops_name(plan: Plan, i: int) -> str:
    return f"op {i} '{plan.ops[i].name}'"


def _run_once(rt: _Runtime, probes: bool = True) -> tuple[np.ndarray, np.ndarray, dict]:
    """One execution of the program; with ``probes`` (and a runtime built with them) the
    staging probes run around every consumer and their words are returned."""
    prog = rt.prog
    probes = probes and rt.probes
    plan = prog.plan
    ops = plan.ops
    n = len(ops)
    cp = rt.cp
    start = np.zeros(n)
    end = np.zeros(n)
    host_call = np.full(n, np.nan)
    launched = np.zeros(n, dtype=bool)
    cpu_out: dict[int, np.ndarray] = {}
    last_stream = [rt.default_stream]

    def launch(j: int) -> None:
        st, waits, pre, body, post = rt.steps[j]
        for d in waits:
            st.wait_event(rt.ev_e[d])
        with st:
            if probes and pre is not None:
                pre()
            rt.ev_s[j].record(st)
            body()
            rt.ev_e[j].record(st)
            if probes and post is not None:
                post()
        launched[j] = True
        last_stream[0] = st

    for s in rt.streams.values():
        s.synchronize()
    rt.host_copy_stream.synchronize()
    ta = perf()
    rt.ev0.record(rt.default_stream)
    rt.ev0.synchronize()
    tb = perf()
    t_ref = 0.5 * (ta + tb)
    for op in ops:
        i = op.id
        if launched[i]:
            continue
        if _is_gpu_queue(op):
            launch(i)
            continue
        t_call = perf()
        for d in prog.gpu_deps[i]:
            rt.ev_e[d].synchronize()
        k = op.kind
        if k is OpKind.ISSUE:
            j = prog.fused_issue.get(i)
            if j is not None:
                launch(j)
        elif k is OpKind.EVENT_RECORD:
            rt.scratch_ev.record(last_stream[0])
        elif k is OpKind.EVENT_WAIT:
            last_stream[0].wait_event(rt.done_ev)
        elif k is OpKind.HOST_WORK:
            cnt = int(op.shape[0]) if op.shape else 0
            np.unique(rt.ids[:cnt])
        elif k is OpKind.CPU_MATVEC:
            cpu_out[i] = rt.cpu_matvec(op)
        elif k in (OpKind.H2D, OpKind.D2H):
            rt.copy(op, rt.host_copy_stream)
            rt.host_copy_stream.synchronize()
        t_end = perf()
        host_call[i] = t_call - t_ref
        start[i] = t_call - t_ref
        end[i] = t_end - t_ref
    for s in rt.streams.values():
        s.synchronize()
    for op in ops:
        if _is_gpu_queue(op):
            start[op.id] = rt.g.elapsed_s(rt.ev0, rt.ev_s[op.id])
            end[op.id] = rt.g.elapsed_s(rt.ev0, rt.ev_e[op.id])
    # the full host time of every host op, before the adjustment below
    host_dur = np.where(np.isnan(host_call), np.nan, end - start)
    # an idle stream starts a GPU op while Python is still issuing it (an op of several
    # kernels, or a slow launch path): the GPU times are what was measured, and the ISSUE op
    # is cut at its GPU op's start so that the trace keeps the plan's ISSUE -> op order; the
    # rest of the launch call shows as host time before the next host op
    for i, j in prog.fused_issue.items():
        if end[i] > start[j]:
            end[i] = max(start[i], start[j])
    # a host op waiting on GPU work starts when that work ended (plan semantics)
    for op in ops:
        i = op.id
        if not _is_gpu_queue(op) and prog.gpu_deps[i]:
            dep_end = max(end[d] for d in prog.gpu_deps[i])
            start[i] = min(max(host_call[i], dep_end), end[i])
    probe_vals = cp.asnumpy(rt.probe_out) if probes else np.zeros(0, dtype=np.uint32)
    # the event clock is placed on the host clock at the midpoint of [ta, tb]
    host_clock = np.array([not _is_gpu_queue(op) for op in ops], dtype=bool)
    return start, end, {"cpu": cpu_out, "probes": probe_vals, "host_dur": host_dur,
                        "host_clock": host_clock, "align_s": 0.5 * (tb - ta)}


def _check_probes(rt: _Runtime, vals: np.ndarray) -> int:
    bad = []
    for idx, op_id, producer, word, when in rt.expected:
        got = int(vals[idx])
        if got != word:
            bad.append({"op_id": op_id, "name": rt.prog.plan.ops[op_id].name, "when": when,
                        "producer": producer, "expected": word, "got": got})
    if bad:
        first = bad[0]
        raise ExecutorHazardError(
            f"{len(bad)} staging probe(s) failed; first: op {first['op_id']} '{first['name']}' read "
            f"{first['producer']} {first['when']} computing: expected 0x{first['expected']:08x}, got "
            f"0x{first['got']:08x} (copy not finished, or its buffer reused too early)", bad)
    return len(rt.expected)


#: slack of the event-time order checks, seconds (CUDA event timestamps resolve ~0.5 µs)
ORDER_TOL_S = 2e-6


def check_order(prog: Program, start: np.ndarray, end: np.ndarray, tol_s: float = ORDER_TOL_S,
                host_clock: np.ndarray | None = None, align_s: float = 0.0) -> list[dict]:
    """Ready/free order of a run from its CUDA-event times (no probes needed, so it can check
    the timed runs the staging probes stay out of). A pair of ops timed on different clocks
    (``host_clock``: (n,) bool, the ops timed with the host clock, e.g. pageable copies) gets
    ``align_s`` more slack: how well the run placed the event clock on the host clock.

    * ready: a consumer starts no earlier than each copy it reads has ended;
    * free: a copy into a buffer region starts no earlier than the consumers of the previous
      copy into an overlapping region have ended (consumers as in ``prog.producers``: the
      first compute op of a split; later ops of the split follow it on its stream).

    Returns:
        one dict per violation: ``kind`` ("ready"/"free"), ``op_id``, ``other`` (op id),
        ``by_s`` (how early, seconds).
    """
    bad: list[dict] = []

    def slack(a: int, b: int) -> float:
        return tol_s + (align_s if host_clock is not None and host_clock[a] != host_clock[b] else 0.0)

    consumers: dict[int, list[int]] = defaultdict(list)
    for j, cs in prog.producers.items():
        for c in cs:
            consumers[c].append(j)
            if start[j] < end[c] - slack(j, c):
                bad.append({"kind": "ready", "op_id": j, "other": c, "by_s": float(end[c] - start[j])})
    seen: dict[tuple, list[int]] = defaultdict(list)
    for c in sorted(prog.copies):
        place = prog.copies[c]
        if place.buffer[0] == "d2h":
            continue
        lo, hi = place.offset, place.offset + place.nbytes
        for a in reversed(seen[place.buffer]):
            pa = prog.copies[a]
            if pa.offset < hi and lo < pa.offset + pa.nbytes:  # the last copy over these bytes
                for j in consumers.get(a, []):
                    if start[c] < end[j] - slack(c, j):
                        bad.append({"kind": "free", "op_id": c, "other": j, "by_s": float(end[j] - start[c])})
                break
        seen[place.buffer].append(c)
    return bad


def _outputs(rt: _Runtime, probe_vals: np.ndarray, cpu_out: dict) -> dict:
    plan = rt.prog.plan
    seen: dict[tuple, int] = defaultdict(int)
    out = {}
    for op in plan.ops:
        if op.id in rt.post and rt.probes:
            st, cnt, nprod = rt.post[op.id]
            words = tuple(int(v) for v in probe_vals[st + nprod: st + cnt])
        elif op.id in cpu_out:
            y = np.ascontiguousarray(cpu_out[op.id], dtype=np.float32).ravel()
            words = (int(y[:1].view(np.uint32)[0]), int(y[-1:].view(np.uint32)[0]))
        else:
            continue
        key = (op.graph, op.name, op.kind.value, tuple(int(x) if isinstance(x, (int, np.integer)) else x for x in op.shape))
        occ = seen[key]
        seen[key] += 1
        out[(*key, occ)] = words
    return out


def digest_of(outputs: dict) -> str:
    """SHA-256 over the sorted (key, words) pairs of an execution's outputs."""
    h = hashlib.sha256()
    for key in sorted(outputs, key=repr):
        h.update(repr((key, outputs[key])).encode())
    return h.hexdigest()


def union_s(starts, ends) -> float:
    """Measure of the union of intervals [start, end) (seconds)."""
    s = np.asarray(starts, dtype=float)
    e = np.asarray(ends, dtype=float)
    if s.size == 0:
        return 0.0
    order = np.argsort(s)
    total = 0.0
    cur_s, cur_e = s[order[0]], e[order[0]]
    for i in order[1:]:
        if s[i] > cur_e:
            total += cur_e - cur_s
            cur_s, cur_e = s[i], e[i]
        else:
            cur_e = max(cur_e, e[i])
    return float(total + cur_e - cur_s)


def execute(plan: Plan, *, test: str = "", variant: str = "", byte_scale: float = 1.0, warmup: int = 1,
            warmup_s: float = 0.0, repeats: int = 1, probes: bool = True, check: bool = True, seed: int = 0,
            fold_devices: bool = False, gc_off: bool = True, cp: Any = None) -> ExecResult:
    """Run ``plan`` on GPU 0 and measure it.

    Args:
        plan: the plan (built by :func:`sim.plan.builder.build_plan` or by hand).
        test, variant: written to the trace.
        byte_scale: copies move ``nbytes * byte_scale`` bytes (compute is never scaled).
        warmup: untimed runs first (cuBLAS heuristics, kernel compilation, page faults).
        warmup_s: keep running untimed runs (after ``warmup`` of them; none when ``warmup``
            is 0) until this many seconds have passed since the first: a short plan's timed
            runs then do not start within a moment of the setup (gigabytes of host buffers
            allocated and filled, the previous plan's freed), while the host may still be busy
            with that memory.
        repeats: timed runs; the one with the median makespan is reported.
        probes: run the staging probes and record output words (a few µs of launches per
            compute op): in the warm-up runs and in one untimed run after the timed ones, which
            run without them (so the timed runs carry none of the probes' launch cost).
        check: raise :class:`ExecutorHazardError` when a probe fails, or when a timed run's
            event times break the ready/free order (:func:`check_order`).
        seed: seed of the synthetic weights and inputs.
        fold_devices: run a multi-GPU plan's streams all on GPU 0.
        gc_off: collect garbage before the timed runs and keep Python's cyclic garbage
            collector off during each of them (as :mod:`timeit` does): a collection landing
            in a timed run would be timed as the executor's launch cost, which llama.cpp's C++
            scheduler does not have. The collector's previous state is restored after each run,
            also when it raises; warm-up and probe runs keep the caller's state. One full
            ``gc.collect()`` runs per call, untimed. The toggle is process-wide: do not run
            ``execute`` from several threads at once.
        cp: the CuPy module (default: imported lazily; ``calibrate._fakecupy`` on a CPU).

    Returns:
        :class:`ExecResult` with a trace of exactly :data:`sim.views.trace.TRACE_COLUMNS`. GPU ops
        carry their CUDA-event times; host ops their host-clock times, a host op that waited
        on GPU work starting when that work ended. When a GPU op started before the Python
        call issuing it returned (an idle stream runs the first kernels of an op while the
        rest is still being issued), its ISSUE op ends at the GPU op's start in the trace;
        its full host time is in ``host_op_s``.

    Raises:
        GPUUnavailableError: no CuPy or no GPU.
        ExecutorHazardError: a staging probe failed (with ``check``).
        ValueError: an op the executor cannot run.
    """
    from sim.views.trace import to_dataframe  # noqa: PLC0415

    if cp is None:
        from ._gpu import require_cupy  # noqa: PLC0415

        cp = require_cupy()
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    prog = translate(plan, byte_scale=byte_scale)
    rt = _Runtime(cp, prog, seed=seed, fold_devices=fold_devices, probes=probes)
    n_checked = 0
    t_warm = perf()
    done = 0
    while done < max(warmup, 0) or (done > 0 and perf() - t_warm < warmup_s):
        _s, _e, aux = _run_once(rt, probes=probes)
        done += 1
        if probes and check:
            n_checked = _check_probes(rt, aux["probes"])
    # timed runs without the probes (their launches would be timed as the executor's own
    # overhead); the probes run in the warm-up and in one more untimed run at the end
    runs = []
    if gc_off:
        gc.collect()
    for _ in range(repeats):
        was_on = gc.isenabled()
        try:
            if gc_off:
                gc.disable()
            s, e, aux = _run_once(rt, probes=False)
        finally:
            if was_on:
                gc.enable()
        bad = check_order(prog, s, e, host_clock=aux["host_clock"], align_s=aux["align_s"]) if check else []
        if bad:
            b = bad[0]
            raise ExecutorHazardError(
                f"{len(bad)} ready/free order violation(s) in a timed run; first: {ops_name(plan, b['op_id'])} "
                f"({b['kind']}) started {b['by_s'] * 1e6:.1f} us before {ops_name(plan, b['other'])} ended",
                [{**x, "name": plan.ops[x["op_id"]].name} for x in bad])
        runs.append((float(e.max()) if e.size else 0.0, s, e, aux))
    if probes:
        _s, _e, aux_p = _run_once(rt, probes=True)
        if check:
            n_checked = _check_probes(rt, aux_p["probes"])
    order = sorted(range(len(runs)), key=lambda i: runs[i][0])
    mk, s, e, aux = runs[order[len(order) // 2]]
    if probes:
        aux = {**aux, "probes": aux_p["probes"], "cpu": aux_p["cpu"]}
    sched = Schedule(start_s=s, end_s=e, engine="executor")
    trace = to_dataframe(plan, sched, test=test, variant=variant)
    outs = _outputs(rt, aux["probes"], aux["cpu"])
    is_h2d = trace["kind"].to_numpy() == OpKind.H2D.value
    h2d_ids = trace["op_id"].to_numpy()[is_h2d]
    scaled = np.array([prog.copies[i].nbytes if i in prog.copies else 0 for i in h2d_ids], dtype=float)
    hs, he = s[h2d_ids], e[h2d_ids]
    busy = union_s(hs, he)
    big = scaled >= 2**20
    per_op = scaled[big] / np.maximum(he[big] - hs[big], 1e-12)
    return ExecResult(
        trace=trace, schedule=sched, makespan_s=mk, makespans_s=[r[0] for r in runs], digest=digest_of(outs),
        outputs=outs, probes_checked=n_checked, byte_scale=byte_scale, h2d_bytes=int(scaled.sum()),
        h2d_busy_s=busy, h2d_bytes_per_s=float(scaled.sum() / busy) if busy > 0 else float("nan"),
        h2d_op_bytes_per_s=float(np.median(per_op)) if per_op.size else float("nan"),
        host_op_s=aux["host_dur"], device=rt.device_name, notes=list(rt.g.log),
        align_s=float(aux["align_s"]))


def check_lossless(results: dict[str, ExecResult]) -> str:
    """Check that every variant computed the same outputs.

    Args:
        results: variant name -> its :class:`ExecResult` (one scenario and test).

    Returns:
        the common digest.

    Raises:
        LosslessnessError: naming the variants and the first differing op. Variants whose
            compute ops differ in name or shape (e.g. an expert cache, which moves expert
            work between GPU and CPU) are reported as not comparable.
    """
    if not results:
        raise ValueError("check_lossless: no results")
    names = list(results)
    ref_name = names[0]
    ref = results[ref_name]
    for name in names[1:]:
        r = results[name]
        if r.digest == ref.digest:
            continue
        ka, kb = set(ref.outputs), set(r.outputs)
        if ka != kb:
            only = sorted(ka ^ kb, key=repr)[:3]
            raise LosslessnessError(
                f"variants '{ref_name}' and '{name}' ran different compute ops (e.g. {only}); their outputs "
                "cannot be compared")
        diff = [k for k in sorted(ka, key=repr) if ref.outputs[k] != r.outputs[k]]
        raise LosslessnessError(
            f"variant '{name}' computed different outputs than '{ref_name}' for {len(diff)} op(s); first: "
            f"graph {diff[0][0]} '{diff[0][1]}' {ref.outputs[diff[0]]} vs {r.outputs[diff[0]]}")
    return ref.digest
