"""The plan: the one intermediate representation every engine consumes.

A :class:`Plan` is an ordered list of :class:`Op` s. Each op sits on one *queue* (a stream of
one device: the host thread, a GPU's compute or copy stream, or the CPU backend), has a kind
and a size, and lists the ops it depends on (events, syncs, issue). The engines only give ops
durations and respect dependencies; policies differ only in the plan they build.

Timing semantics (shared by every engine, and the contract the tests check):

* ops of one queue run one at a time, in plan order (CUDA stream FIFO / host program order);
* an op starts when every op in ``deps`` has ended;
* H2D ops also hold the host→device link of their GPU (PCIe, one direction), granted in plan
  order; D2H uses the other direction and does not contend with H2D;
* ``start = max(end of queue predecessor, end of link predecessor, max end of deps)``,
  ``end = start + duration``.

Host behaviour is explicit in the plan: a kernel launch is an ``ISSUE`` op on the host queue
that the GPU op depends on; a synchronisation is a ``HOST_SYNC`` op on the host queue that
depends on the GPU ops it waits for; a pageable copy is an H2D op on the host queue (the
host thread is blocked for it).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import Enum
from functools import cached_property
from typing import Any

import numpy as np


class Stream(str, Enum):
    """Where an op executes."""

    HOST = "host"        #: the host thread issuing work (program order)
    COMPUTE = "compute"  #: a GPU's compute stream
    COPY = "copy"        #: a GPU's dedicated copy stream (prefetch)
    CPU = "cpu"          #: the CPU backend running ops on host weights


class OpKind(str, Enum):
    """What an op does; the cost model prices each kind (see :mod:`sim.costs`)."""

    H2D = "h2d"                    #: host→device copy of ``nbytes`` (one merged run or tensor)
    D2H = "d2h"                    #: device→host copy (router ids readback, activations)
    GEMM = "gemm"                  #: dense matmul, shape (m tokens, n out, k in)
    MOE = "moe"                    #: MUL_MAT_ID, shape (m tokens, n out, k in, experts used, top-k)
    ATTN = "attn"                  #: attention, shape (tokens, kv_len, n_head, n_head_kv, head_dim, window, linear)
    CPU_MATVEC = "cpu_matvec"      #: op on host weights run by the CPU backend, shape (m, bytes)
    HOST_SYNC = "host_sync"        #: host waits for a stream (cudaStreamSynchronize)
    ISSUE = "issue"                #: host launches an async op (kernel launch / async copy call)
    EVENT_RECORD = "event_record"  #: host records an event
    EVENT_WAIT = "event_wait"      #: host makes a stream wait on an event
    HOST_WORK = "host_work"        #: host bookkeeping (building expert runs from router ids)


#: kinds that execute on the GPU (their duration is device time)
GPU_KINDS = frozenset({OpKind.H2D, OpKind.D2H, OpKind.GEMM, OpKind.MOE, OpKind.ATTN})
COMPUTE_KINDS = frozenset({OpKind.GEMM, OpKind.MOE, OpKind.ATTN, OpKind.CPU_MATVEC})


@dataclass(frozen=True, slots=True)
class Op:
    """One operation of a plan.

    Attributes:
        id: index in ``Plan.ops`` (plan order = program order).
        kind: what it does.
        stream: where it runs.
        device: GPU index for GPU streams and copies, -1 for host/CPU.
        name: label, usually the GGUF tensor or split (``blk.3.ffn_up_exps.weight``, ``blk.3.ffn_up_exps.weight[0:4]``).
        deps: ids of ops that must end before this one starts (all < ``id``).
        nbytes: bytes moved (H2D/D2H), or weight bytes read (compute ops).
        shape: kind-specific shape (see :class:`OpKind`).
        layer: block index (-1 outside blocks).
        split: split index within the graph.
        graph: graph (ubatch) index within the test.
        slot: staging slot/buffer index the op writes or reads (-1: none).
        slot_bytes: bytes the slot was allocated with (for the hazard checker).
        pinned: for H2D: the source is pinned host memory.
        tag: free-form role (``"prefetch"``, ``"selective"``, ``"ids"``, ``"cache_miss"`` ...).
    """

    id: int
    kind: OpKind
    stream: Stream
    device: int
    name: str
    deps: tuple[int, ...] = ()
    nbytes: int = 0
    shape: tuple = ()
    layer: int = -1
    split: int = -1
    graph: int = 0
    slot: int = -1
    slot_bytes: int = 0
    pinned: bool = True
    tag: str = ""

    @property
    def queue(self) -> tuple[str, int]:
        """``(stream, device)``; the host thread and the CPU backend are one queue each
        whatever the device (a pageable H2D on the host queue names its GPU for the link)."""
        if self.stream in (Stream.HOST, Stream.CPU):
            return (self.stream.value, -1)
        return (self.stream.value, self.device)


# fast construction of an Op (Plan.append): the slots' descriptors set the fields directly,
# as the frozen dataclass's generated __init__ does, without its per-field global lookups
_new_op = object.__new__
(_s_id, _s_kind, _s_stream, _s_device, _s_name, _s_deps, _s_nbytes, _s_shape, _s_layer, _s_split, _s_graph,
 _s_slot, _s_slot_bytes, _s_pinned, _s_tag) = (getattr(Op, f.name).__set__ for f in fields(Op))

@dataclass
class PlanArrays:
    """Flat numpy view of a plan for the engines.

    Attributes:
        n: number of ops.
        queue: (n,) int queue id per op.
        link: (n,) int link id per op (-1: uses no link).
        dep_ptr: (n+1,) CSR row pointers into ``dep_idx``.
        dep_idx: flattened dependency ids.
        queue_prev: (n,) id of the previous op on the same queue (-1: first).
        link_prev: (n,) id of the previous op on the same link (-1: first or none).
        queue_names: queue id -> ``"compute0"`` etc.
    """

    n: int
    queue: np.ndarray
    link: np.ndarray
    dep_ptr: np.ndarray
    dep_idx: np.ndarray
    queue_prev: np.ndarray
    link_prev: np.ndarray
    queue_names: list[str]


@dataclass
class Plan:
    """An ordered list of ops plus what the builder knows about them.

    Attributes:
        ops: the ops in program order.
        label: e.g. ``"prefetch_ungated / pp512"``.
        graph_tokens: tokens in each graph (ubatch), in order.
        graph_last_op: id of the last op of each graph (its output is ready when it ends).
        meta: builder statistics (bytes, cache hits, VRAM breakdown, ...).
    """

    ops: list[Op] = field(default_factory=list)
    label: str = ""
    graph_tokens: list[int] = field(default_factory=list)
    graph_last_op: list[int] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ops)

    def add(self, kind: OpKind, stream: Stream, device: int, name: str, deps=(), **kw) -> int:
        """Append an op; returns its id. Dependencies must point to earlier ops."""
        return self.append(kind, stream, device, name, deps, **kw)

    def append(self, kind: OpKind, stream: Stream, device: int, name: str, deps=(), nbytes: int = 0,
               shape: tuple = (), layer: int = -1, split: int = -1, graph: int = 0, slot: int = -1,
               slot_bytes: int = 0, pinned: bool = True, tag: str = "") -> int:
        """:meth:`add` with the op's fields as arguments (the builder's hot path): ``deps`` are
        sorted, de-duplicated and stripped of None and negative ids; returns the new op's id.

        Raises:
            ValueError: a dependency on this op or a later one."""
        ops = self.ops
        oid = len(ops)
        if deps:
            if len(deps) == 1:
                d0 = deps[0]
                deps = (d0,) if d0 is not None and d0 >= 0 else ()
            else:
                deps = tuple(sorted({d for d in deps if d is not None and d >= 0}))
            if deps and deps[-1] >= oid:
                raise ValueError(f"op {oid} ({name}) depends on a later op {deps[-1]}")
        else:
            deps = ()
        op = _new_op(Op)
        _s_id(op, oid)
        _s_kind(op, kind)
        _s_stream(op, stream)
        _s_device(op, device)
        _s_name(op, name)
        _s_deps(op, deps)
        _s_nbytes(op, nbytes)
        _s_shape(op, shape)
        _s_layer(op, layer)
        _s_split(op, split)
        _s_graph(op, graph)
        _s_slot(op, slot)
        _s_slot_bytes(op, slot_bytes)
        _s_pinned(op, pinned)
        _s_tag(op, tag)
        ops.append(op)
        d = self.__dict__
        if "arrays" in d:
            del d["arrays"]
        return oid

    @cached_property
    def arrays(self) -> PlanArrays:
        """The plan's :class:`PlanArrays` (cached until an op is added)."""
        ops = self.ops
        n = len(ops)
        qnames: dict[tuple[str, int], int] = {}
        qid_of: dict = {}      # (stream, device) -> queue id
        queue = [0] * n
        link = [-1] * n
        queue_prev = [-1] * n
        link_prev = [-1] * n
        last_q: dict[int, int] = {}
        last_l: dict[int, int] = {}
        ptr = [0] * (n + 1)
        idx: list[int] = []
        h2d = OpKind.H2D
        for i, op in enumerate(ops):
            sd = (op.stream, op.device)
            q = qid_of.get(sd)
            if q is None:
                q = qid_of[sd] = qnames.setdefault(op.queue, len(qnames))
            queue[i] = q
            queue_prev[i] = last_q.get(q, -1)
            last_q[q] = i
            if op.kind is h2d:
                lk = op.device if op.device > 0 else 0
                link[i] = lk
                link_prev[i] = last_l.get(lk, -1)
                last_l[lk] = i
            deps = op.deps
            if deps:
                idx.extend(deps)
            ptr[i + 1] = len(idx)
        names = [f"{s}{d}" if d >= 0 else s for (s, d) in qnames]
        i64 = np.int64
        return PlanArrays(n, np.array(queue, dtype=i64), np.array(link, dtype=i64), np.array(ptr, dtype=i64),
                          np.array(idx, dtype=i64), np.array(queue_prev, dtype=i64), np.array(link_prev, dtype=i64),
                          names)

    def h2d_bytes(self) -> int:
        return sum(op.nbytes for op in self.ops if op.kind is OpKind.H2D)


@dataclass
class Schedule:
    """Start and end times (seconds) of every op of a plan, from one engine.

    Attributes:
        start_s, end_s: (n,) arrays, or (S, n) for a batch of S scenarios.
        engine: ``"analytic"``, ``"des"`` or ``"executor"``.
    """

    start_s: np.ndarray
    end_s: np.ndarray
    engine: str

    @property
    def makespan_s(self):
        return self.end_s.max(axis=-1) if self.end_s.size else 0.0
