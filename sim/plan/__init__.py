"""The plan: the one intermediate representation every engine consumes.

A :class:`Plan` is an ordered list of ops, stored by column (:class:`Op` objects are made from
the columns when asked for, :attr:`Plan.ops`). Each op sits on one *queue* (a stream of
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

from dataclasses import dataclass, fields
from enum import Enum
from typing import Any

import numpy as np


class Stream(str, Enum):
    """Where an op executes."""

    HOST = "host"        #: the host thread issuing work (program order)
    COMPUTE = "compute"  #: a GPU's compute stream
    COPY = "copy"        #: a GPU's dedicated copy stream (prefetch)
    CPU = "cpu"          #: the CPU backend running ops on host weights


class OpKind(str, Enum):
    """What an op does; the cost model prices each kind (see :mod:`sim.model.costs`)."""

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


#: code of each kind and stream in the plan's columns (``Plan.kinds``, ``Plan.streams``), and back
KINDS: tuple[OpKind, ...] = tuple(OpKind)
STREAMS: tuple[Stream, ...] = tuple(Stream)
KIND_CODE: dict[OpKind, int] = {k: i for i, k in enumerate(KINDS)}
STREAM_CODE: dict[Stream, int] = {s: i for i, s in enumerate(STREAMS)}
#: kind codes of :data:`COMPUTE_KINDS`
COMPUTE_CODES: tuple[int, ...] = tuple(sorted(KIND_CODE[k] for k in COMPUTE_KINDS))

# fast construction of an Op (Plan.op, Plan.ops): the slots' descriptors set the fields
# directly, as the frozen dataclass's generated __init__ does, without its per-field lookups
_new_op = object.__new__
(_s_id, _s_kind, _s_stream, _s_device, _s_name, _s_deps, _s_nbytes, _s_shape, _s_layer, _s_split, _s_graph,
 _s_slot, _s_slot_bytes, _s_pinned, _s_tag) = (getattr(Op, f.name).__set__ for f in fields(Op))


@dataclass
class PlanArrays:
    """Flat numpy view of a plan for the engines.

    Attributes:
        n: number of ops.
        queue: (n,) int queue id per op (ids in order of first appearance).
        link: (n,) int link id per op (-1: uses no link).
        dep_ptr: (n+1,) CSR row pointers into ``dep_idx``.
        dep_idx: flattened dependency ids.
        queue_prev: (n,) id of the previous op on the same queue (-1: first).
        link_prev: (n,) id of the previous op on the same link (-1: first or none).
        queue_names: queue id -> ``"compute0"`` etc.
        kind: (n,) int8 kind code per op (:data:`KINDS` maps it back).
        stream: (n,) int8 stream code per op (:data:`STREAMS`).
        device: (n,) int64 device per op.
    """

    n: int
    queue: np.ndarray
    link: np.ndarray
    dep_ptr: np.ndarray
    dep_idx: np.ndarray
    queue_prev: np.ndarray
    link_prev: np.ndarray
    queue_names: list[str]
    kind: np.ndarray | None = None
    stream: np.ndarray | None = None
    device: np.ndarray | None = None


def _prev_in_group(group: np.ndarray, member: np.ndarray | None = None) -> np.ndarray:
    """Per position, the previous position with the same ``group`` value (-1: the first);
    positions where ``member`` is False are in no group (-1)."""
    n = group.size
    out = np.full(n, -1, dtype=np.int64)
    idx = np.arange(n, dtype=np.int64) if member is None else np.flatnonzero(member)
    if idx.size < 2:
        return out
    g = group[idx]
    o = np.argsort(g, kind="stable")
    s = idx[o]
    same = g[o][1:] == g[o][:-1]
    prev = np.full(idx.size, -1, dtype=np.int64)
    prev[1:][same] = s[:-1][same]
    out[s] = prev
    return out


def _plan_arrays(n: int, kind: np.ndarray, stream: np.ndarray, device: np.ndarray, ptr: np.ndarray,
                 idx: np.ndarray) -> PlanArrays:
    """:class:`PlanArrays` of ``n`` ops from their kind and stream codes (int8), devices,
    dependency pointers and ids (int64)."""
    i64 = np.int64
    host_like = (stream == STREAM_CODE[Stream.HOST]) | (stream == STREAM_CODE[Stream.CPU])
    qdev = np.where(host_like, -1, device)
    key = stream.astype(i64) * (1 << 33) + (qdev + 1)
    names: list[str] = []
    if n:
        # one stable sort of the keys gives the queues (np.unique's sorted keys, first
        # occurrences and inverse) and, within each queue, its ops in id order (the previous op
        # on the queue: what _prev_in_group(queue) gives)
        srt = np.argsort(key, kind="stable")
        sk = key[srt]
        brk = np.empty(n, dtype=bool)
        brk[0] = True
        np.not_equal(sk[1:], sk[:-1], out=brk[1:])
        first = srt[brk]                               # first op of each key, keys ascending
        order = np.argsort(first, kind="stable")      # queues in order of first appearance
        rank = np.empty(order.size, dtype=i64)
        rank[order] = np.arange(order.size, dtype=i64)
        queue = np.empty(n, dtype=i64)
        queue[srt] = rank[np.cumsum(brk) - 1]
        queue_prev = np.full(n, -1, dtype=i64)
        same = ~brk[1:]
        queue_prev[srt[1:][same]] = srt[:-1][same]
        for u in order.tolist():
            s = STREAMS[int(stream[first[u]])].value
            d = int(qdev[first[u]])
            names.append(f"{s}{d}" if d >= 0 else s)
    else:
        queue = np.zeros(0, dtype=i64)
        queue_prev = np.full(0, -1, dtype=i64)
    is_h2d = kind == KIND_CODE[OpKind.H2D]
    link = np.where(is_h2d, np.maximum(device, 0), -1).astype(i64)
    return PlanArrays(n, queue, link, ptr, idx, queue_prev, _prev_in_group(link, is_h2d), names,
                      kind, stream, device)


_ARRAYS_KEY = "_plan_arrays"

#: where a plan keeps the makers of the columns left to be made (:meth:`Plan.set_lazy_column`)
_LAZY_KEY = "_lazy_columns"

#: the columns :meth:`Plan.set_lazy_column` may defer: none of them is read by the engines or
#: the cost model
LAZY_COLUMNS = ("names", "layers", "splits", "slots", "slot_bytes")

#: the per-op columns of a :class:`Plan` (``dep_ptr`` has one more element)
_COLUMNS = ("kinds", "streams", "devices", "names", "dep_ptr", "dep_idx", "nbytes", "shapes", "layers", "splits",
            "graphs", "slots", "slot_bytes", "pinned", "tags")


class Plan:
    """An ordered list of ops plus what the builder knows about them, stored by column.

    Each op is a row of the columns below (one list per field, the codes and numbers as Python
    ints, which append about twice as fast as an ``array.array``; dependencies as one flat list
    with row pointers): appending an op creates no :class:`Op` and reads no Enum member, and
    the engines read typed numpy arrays made from the columns in one conversion each
    (:attr:`arrays`). :attr:`ops` gives the same rows as :class:`Op` objects, made on first use.

    Attributes:
        label: e.g. ``"prefetch_ungated / pp512"``.
        graph_tokens: tokens in each graph (ubatch), in order.
        graph_last_op: id of the last op of each graph (its output is ready when it ends).
        meta: builder statistics (bytes, cache hits, VRAM breakdown, ...).
        kinds, streams: kind and stream codes (:data:`KIND_CODE`, :data:`STREAM_CODE`).
        devices, layers, splits, graphs, slots, pinned: per op (see :class:`Op`).
        nbytes, slot_bytes: per op, bytes.
        names, shapes, tags: per op (lists).
        dep_ptr, dep_idx: dependencies of op ``i`` are ``dep_idx[dep_ptr[i]:dep_ptr[i + 1]]``.

    Args:
        ops: initial ops (:class:`Op` objects, kept as given: their deps are not normalised).
    """

    def __init__(self, ops: list[Op] | None = None, label: str = "", graph_tokens: list[int] | None = None,
                 graph_last_op: list[int] | None = None, meta: dict[str, Any] | None = None):
        self.label = label
        self.graph_tokens = [] if graph_tokens is None else graph_tokens
        self.graph_last_op = [] if graph_last_op is None else graph_last_op
        self.meta = {} if meta is None else meta
        self.kinds: list[int] = []
        self.streams: list[int] = []
        self.devices: list[int] = []
        self.names: list[str] = []
        self.dep_ptr: list[int] = [0]
        self.dep_idx: list[int] = []
        self.nbytes: list[int] = []
        self.shapes: list[tuple] = []
        self.layers: list[int] = []
        self.splits: list[int] = []
        self.graphs: list[int] = []
        self.slots: list[int] = []
        self.slot_bytes: list[int] = []
        self.pinned: list[bool] = []
        self.tags: list[str] = []
        self._bind()
        self._ops: list[Op] = []
        if ops:
            for op in ops:
                self._append_row(op.kind, op.stream, op.device, op.name, op.deps, op.nbytes, op.shape, op.layer,
                                 op.split, op.graph, op.slot, op.slot_bytes, op.pinned, op.tag)
            self._ops = list(ops)

    def __len__(self) -> int:
        return len(self.kinds)

    def __getattr__(self, name: str):
        # only for an attribute not found: a column left to be made on first read (set_lazy_column)
        lazy = self.__dict__.get(_LAZY_KEY)
        if lazy is None or name not in lazy:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        value = self.__dict__[name] = lazy.pop(name)()
        if not lazy:
            del self.__dict__[_LAZY_KEY]
        return value

    def set_lazy_column(self, name: str, make) -> None:
        """Leave the column ``name`` to be made on its first read: ``make()`` returns the whole
        column, a new list of one value per op, equal to what the column would hold (a builder
        that fills the columns from arrays defers those nothing may read: the engines and the
        cost model read none of :data:`LAZY_COLUMNS`). Appending an op, pickling, and copying
        with :meth:`with_shapes` see the column as if it had been made (the copy calls
        ``make`` again for its own list).

        Raises:
            ValueError: ``name`` is not one of :data:`LAZY_COLUMNS`.
        """
        if name not in LAZY_COLUMNS:
            raise ValueError(f"set_lazy_column: {name!r} is not one of {', '.join(LAZY_COLUMNS)}")
        self.__dict__.pop(name, None)
        self.__dict__.setdefault(_LAZY_KEY, {})[name] = make
        self._appenders = None   # made anew, from the columns made, by the next append

    def _make_lazy(self) -> None:
        """Make every column left to be made (:meth:`set_lazy_column`) and bind the appenders."""
        for name in list(self.__dict__.get(_LAZY_KEY, ())):
            getattr(self, name)
        self._bind()

    def __repr__(self) -> str:
        return f"Plan({self.label!r}, {len(self)} ops, {len(self.graph_tokens)} graphs)"

    def _bind(self) -> None:
        # the columns' append methods, in the order Plan.append fills them
        self._appenders = (self.kinds.append, self.streams.append, self.devices.append, self.names.append,
                           self.dep_ptr.append, self.nbytes.append, self.shapes.append, self.layers.append,
                           self.splits.append, self.graphs.append, self.slots.append, self.slot_bytes.append,
                           self.pinned.append, self.tags.append)

    def __getstate__(self) -> dict:
        if _LAZY_KEY in self.__dict__:
            self._make_lazy()
        d = dict(self.__dict__)
        for k in [k for k in d if k.startswith("_")]:  # derived: Op objects, caches, appenders
            del d[k]
        return d

    def __setstate__(self, d: dict) -> None:
        self.__dict__.update(d)
        self._ops = []
        self._bind()

    def _append_row(self, kind, stream, device, name, deps, nbytes, shape, layer, split, graph, slot, slot_bytes,
                    pinned, tag) -> None:
        self.kinds.append(KIND_CODE[kind])
        self.streams.append(STREAM_CODE[stream])
        self.devices.append(device)
        self.names.append(name)
        self.dep_idx.extend(deps)
        self.dep_ptr.append(len(self.dep_idx))
        self.nbytes.append(nbytes)
        self.shapes.append(shape)
        self.layers.append(layer)
        self.splits.append(split)
        self.graphs.append(graph)
        self.slots.append(slot)
        self.slot_bytes.append(slot_bytes)
        self.pinned.append(pinned)
        self.tags.append(tag)

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
        oid = len(self.kinds)
        dep_idx = self.dep_idx
        if deps:
            if len(deps) == 1:
                d0 = deps[0]
                if d0 is not None and d0 >= 0:
                    if d0 >= oid:
                        raise ValueError(f"op {oid} ({name}) depends on a later op {d0}")
                    dep_idx.append(d0)
            else:
                deps = sorted({d for d in deps if d is not None and d >= 0})
                if deps and deps[-1] >= oid:
                    raise ValueError(f"op {oid} ({name}) depends on a later op {deps[-1]}")
                dep_idx.extend(deps)
        (a_kind, a_stream, a_device, a_name, a_ptr, a_nbytes, a_shape, a_layer, a_split, a_graph, a_slot,
         a_slot_bytes, a_pinned, a_tag) = self._appenders or self._rebound()
        a_kind(KIND_CODE[kind])
        a_stream(STREAM_CODE[stream])
        a_device(device)
        a_name(name)
        a_ptr(len(dep_idx))
        a_nbytes(nbytes)
        a_shape(shape)
        a_layer(layer)
        a_split(split)
        a_graph(graph)
        a_slot(slot)
        a_slot_bytes(slot_bytes)
        a_pinned(pinned)
        a_tag(tag)
        return oid

    def _rebound(self) -> tuple:
        self._make_lazy()
        return self._appenders

    def deps_of(self, i: int) -> tuple[int, ...]:
        """Dependencies of op ``i`` (ids, ascending for ops appended with :meth:`append`)."""
        p = self.dep_ptr
        return tuple(self.dep_idx[p[i]:p[i + 1]])

    def op(self, i: int) -> Op:
        """Op ``i`` as an :class:`Op` (the one in :attr:`ops` if made already)."""
        ops = self._ops
        if i < 0:
            i += len(self.kinds)
        if i < len(ops):
            return ops[i]
        if not 0 <= i < len(self.kinds):
            raise IndexError(f"op {i} outside a plan of {len(self.kinds)} ops")
        return self._make_op(i)

    def _make_op(self, i: int) -> Op:
        p = self.dep_ptr
        op = _new_op(Op)
        _s_id(op, i)
        _s_kind(op, KINDS[self.kinds[i]])
        _s_stream(op, STREAMS[self.streams[i]])
        _s_device(op, self.devices[i])
        _s_name(op, self.names[i])
        _s_deps(op, tuple(self.dep_idx[p[i]:p[i + 1]]))
        _s_nbytes(op, self.nbytes[i])
        _s_shape(op, self.shapes[i])
        _s_layer(op, self.layers[i])
        _s_split(op, self.splits[i])
        _s_graph(op, self.graphs[i])
        _s_slot(op, self.slots[i])
        _s_slot_bytes(op, self.slot_bytes[i])
        _s_pinned(op, self.pinned[i])
        _s_tag(op, self.tags[i])
        return op

    def op_with(self, i: int, nbytes: int, shape: tuple) -> Op:
        """Op ``i`` with its ``nbytes`` and ``shape`` replaced (``dataclasses.replace(self.op(i),
        nbytes=nbytes, shape=shape)``, made from the columns directly: what :mod:`sim.plan.memo`
        prices at another KV length).

        Raises:
            IndexError: ``i`` outside the plan.
        """
        if not 0 <= i < len(self.kinds):
            raise IndexError(f"op {i} outside a plan of {len(self.kinds)} ops")
        op = self._make_op(i)
        _s_nbytes(op, nbytes)
        _s_shape(op, shape)
        return op

    def priced_op(self, i: int, nbytes: int | None = None, shape: tuple | None = None) -> Op:
        """Op ``i`` as the cost model reads it (:func:`sim.model.costs.op_duration_s` reads its
        kind, bytes, shape, pinned flag and tag): those fields and its stream and device from
        the columns, ``nbytes`` and ``shape`` replaced when given; its name, deps, layer, split,
        graph and slot are left at :class:`Op`'s defaults (no column that
        :meth:`set_lazy_column` may defer is read).

        Raises:
            IndexError: ``i`` outside the plan.
        """
        if not 0 <= i < len(self.kinds):
            raise IndexError(f"op {i} outside a plan of {len(self.kinds)} ops")
        # Op(i, kind, stream, device, "", nbytes=..., shape=..., pinned=..., tag=...), its slots set
        # directly (as _make_op: no frozen dataclass __init__)
        op = _new_op(Op)
        _s_id(op, i)
        _s_kind(op, KINDS[self.kinds[i]])
        _s_stream(op, STREAMS[self.streams[i]])
        _s_device(op, self.devices[i])
        _s_name(op, "")
        _s_deps(op, ())
        _s_nbytes(op, self.nbytes[i] if nbytes is None else nbytes)
        _s_shape(op, self.shapes[i] if shape is None else shape)
        _s_layer(op, -1)
        _s_split(op, -1)
        _s_graph(op, 0)
        _s_slot(op, -1)
        _s_slot_bytes(op, 0)
        _s_pinned(op, self.pinned[i])
        _s_tag(op, self.tags[i])
        return op

    @property
    def ops(self) -> list[Op]:
        """The ops in program order as :class:`Op` objects (made from the columns on first use
        and kept; do not modify the list)."""
        ops = self._ops
        n = len(self.kinds)
        if len(ops) < n:
            make = self._make_op
            ops.extend(make(i) for i in range(len(ops), n))
        return ops

    def derived(self, key: str, build):
        """``build(self)``, kept on the plan until an op is added: what depends only on the
        plan's structure (a compiled recurrence, the DES's waits, transfer groups, op masks),
        read from :attr:`arrays` and the other columns but never from :attr:`shapes`
        (:meth:`with_shapes` shares it with a copy whose shapes differ). ``key`` names it
        (start it with ``_``: derived state is not pickled)."""
        arrays = self.arrays
        cached = self.__dict__.get(key)
        if cached is not None and cached[0] is arrays:
            return cached[1]
        value = build(self)
        self.__dict__[key] = (arrays, value)
        return value

    def with_shapes(self, shapes: dict[int, tuple]) -> Plan:
        """A copy of the plan with the shapes of some ops replaced (``shapes``: op id -> new
        shape); every column and ``meta`` list is copied, and what the plan keeps of
        :attr:`arrays` and :meth:`derived` is shared with the copy (none of it reads shapes; a
        mutable one, such as a compiled plan's caches, is then the same object for both, until
        an op is added to either).

        Raises:
            IndexError: an op id outside the plan.
        """
        new = Plan(label=self.label, graph_tokens=list(self.graph_tokens), graph_last_op=list(self.graph_last_op),
                   meta={k: v.copy() if isinstance(v, list) else v for k, v in self.meta.items()})
        lazy = self.__dict__.get(_LAZY_KEY, {})
        for col in _COLUMNS:
            if col not in lazy:
                setattr(new, col, getattr(self, col).copy())
        new._bind()
        for col, make in lazy.items():
            new.set_lazy_column(col, make)
        n = len(self.kinds)
        for i, sh in shapes.items():
            if not 0 <= i < n:
                raise IndexError(f"op {i} outside a plan of {n} ops")
            new.shapes[i] = sh
        arrays = self.__dict__.get(_ARRAYS_KEY)
        if arrays is not None and arrays.n == n:
            new.__dict__[_ARRAYS_KEY] = arrays
            for k, v in self.__dict__.items():
                if type(v) is tuple and len(v) == 2 and v[0] is arrays:  # kept by derived()
                    new.__dict__[k] = v
        return new

    @property
    def arrays(self) -> PlanArrays:
        """The plan's :class:`PlanArrays`, from the columns without a per-op Python loop
        (cached until an op is added)."""
        cached = self.__dict__.get(_ARRAYS_KEY)
        n = len(self.kinds)
        if cached is not None and cached.n == n:
            return cached
        i64 = np.int64
        kind = np.array(self.kinds, dtype=np.int8) if n else np.zeros(0, np.int8)
        stream = np.array(self.streams, dtype=np.int8) if n else np.zeros(0, np.int8)
        device = np.array(self.devices, dtype=i64) if n else np.zeros(0, i64)
        ptr = np.array(self.dep_ptr, dtype=i64)
        idx = np.array(self.dep_idx, dtype=i64) if self.dep_idx else np.zeros(0, i64)
        arrays = _plan_arrays(n, kind, stream, device, ptr, idx)
        self.__dict__[_ARRAYS_KEY] = arrays
        return arrays

    def set_arrays(self, kind: np.ndarray, stream: np.ndarray, device: np.ndarray, dep_ptr: np.ndarray,
                   dep_idx: np.ndarray) -> PlanArrays:
        """Make :attr:`arrays` from numpy copies of the plan's ``kinds``, ``streams``,
        ``devices``, ``dep_ptr`` and ``dep_idx`` columns that the caller already has (a builder
        that fills the columns from arrays), instead of converting the lists: the same
        :class:`PlanArrays`. The arrays must equal the columns ((n,) each, ``dep_ptr`` (n+1,));
        they are converted to the dtypes :attr:`arrays` uses (int8 kinds and streams, int64 the
        others).

        Raises:
            ValueError: an array's length does not fit the plan.
        """
        n = len(self.kinds)
        if not (len(kind) == len(stream) == len(device) == n and len(dep_ptr) == n + 1
                and len(dep_idx) == len(self.dep_idx)):
            raise ValueError(f"set_arrays: arrays of lengths {len(kind)}, {len(stream)}, {len(device)}, "
                             f"{len(dep_ptr)}, {len(dep_idx)} for a plan of {n} ops and {len(self.dep_idx)} deps")
        i64 = np.int64
        arrays = _plan_arrays(n, np.asarray(kind, dtype=np.int8), np.asarray(stream, dtype=np.int8),
                              np.asarray(device, dtype=i64), np.asarray(dep_ptr, dtype=i64),
                              np.asarray(dep_idx, dtype=i64))
        self.__dict__[_ARRAYS_KEY] = arrays
        return arrays

    def h2d_bytes(self) -> int:
        """Bytes of every H2D op."""
        if not self.kinds:
            return 0
        a = self.arrays
        nb = np.array(self.nbytes, dtype=np.int64)
        return int(nb[a.kind == KIND_CODE[OpKind.H2D]].sum(dtype=np.int64))


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
