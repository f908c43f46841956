"""Hazard checker for staging slots (``prefetch-sim check``).

Analyses a :class:`~sim.plan.Plan` for the races and overruns that real prefetch
implementations hit (docs/DESIGN.md, variant 3, "known hazards"):

=======================  ===================================================================
``slot_overwrite``       (i) a copy into slot *s* on GPU *d* that is not ordered after every
                         reader of the slot's previous contents (the consumer may still read
                         it: missing free-event wait)
``missing_ready_wait``   (ii) a consumer of a slot that is not ordered after the copy that
                         filled it (missing ready-event wait), or that reads a slot no copy
                         filled (never filled, or freed since)
``free_while_copying``   (iii) a slot freed or reallocated (a host op tagged ``slot_free`` /
                         ``slot_realloc``) while a copy into it, or a read of it, may still be
                         outstanding (use-after-free)
``cross_device_slot``    (iv) a slot filled on one GPU consumed by a split on another (the
                         multi-GPU layer-split bug: silent wrong output)
``slot_overflow``        (v) a copy or consumer touching more bytes than the slot was allocated
                         with (``op.nbytes > op.slot_bytes``: reading padding past the end)
=======================  ===================================================================

**Which copy fills which read.** Slots are buffers named by ``(device, slot)``. A consumer
(a non-copy op with ``slot >= 0``) reads the contents of the latest copy with its slot id
before it in plan (program) order, on whatever GPU that copy ran: if that GPU is not the
consumer's, it is hazard (iv). The previous contents of ``(d, s)`` when a copy into it is
issued are those of the latest earlier copy into ``(d, s)``; their readers are the consumers
attributed to that copy.

**Ordered after** means *happens-before*: op *a* precedes op *b* if a chain of ``deps`` and
same-queue FIFO edges (ops of one queue run in plan order, :mod:`sim.plan`) leads from *a* to
*b*. Link (PCIe) order is *not* an edge: it is an artefact of bandwidth sharing, no
synchronisation guarantee. The relation is computed once with per-queue vector clocks
(:class:`HappensBefore`): ``O(n · Q)`` time and memory for *n* ops on *Q* queues.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from enum import Enum

from sim.plan import Op, OpKind, Plan, Stream

#: op tags of slot lifetime events (host ops with ``slot`` and ``device`` set)
SLOT_FREE = "slot_free"
SLOT_REALLOC = "slot_realloc"
SLOT_LIFETIME_TAGS = frozenset({SLOT_FREE, SLOT_REALLOC})


class HazardKind(str, Enum):
    """The hazards the checker reports (see the module docstring)."""

    SLOT_OVERWRITE = "slot_overwrite"
    MISSING_READY_WAIT = "missing_ready_wait"
    FREE_WHILE_COPYING = "free_while_copying"
    CROSS_DEVICE_SLOT = "cross_device_slot"
    SLOT_OVERFLOW = "slot_overflow"


@dataclass(frozen=True)
class Hazard:
    """One finding.

    Attributes:
        kind: which hazard.
        op_ids: the ops involved, offender first: (overwriting copy, unordered reader) for
            ``slot_overwrite``; (consumer, filling copy) for ``missing_ready_wait`` (just the
            consumer when no copy filled the slot) and ``cross_device_slot``; (free/realloc,
            outstanding copy or reader) for ``free_while_copying``; (op,) for ``slot_overflow``.
        names: the ops' names, same order.
        slot: slot id.
        device: GPU of the offender (-1 for a host op that names no GPU).
        detail: one-line explanation.
    """

    kind: HazardKind
    op_ids: tuple[int, ...]
    names: tuple[str, ...]
    slot: int
    device: int
    detail: str


class HappensBefore:
    """Happens-before of a plan's ops through ``deps`` and same-queue FIFO order.

    Per-queue vector clocks: ``clock[b][q]`` is the largest queue position of an op of queue
    ``q`` that precedes or is ``b``. Ops of one queue are totally ordered, so the ops of ``q``
    preceding ``b`` are a prefix and ``a`` precedes ``b`` iff ``pos[a] <= clock[b][queue[a]]``.

    Args:
        plan: the plan (deps point to earlier ops, as :meth:`Plan.add` guarantees).
    """

    def __init__(self, plan: Plan):
        arr = plan.arrays
        n, nq = arr.n, len(arr.queue_names)
        queue = arr.queue.tolist()
        qprev = arr.queue_prev.tolist()
        pos = [0] * n
        count = [0] * nq
        clocks: list[list[int]] = [[]] * n
        empty = [-1] * nq
        ptr = arr.dep_ptr.tolist()
        idx = arr.dep_idx.tolist()
        for i in range(n):
            q = queue[i]
            pos[i] = count[q]
            count[q] += 1
            preds = idx[ptr[i]:ptr[i + 1]]
            if qprev[i] >= 0:
                preds.append(qprev[i])
            if not preds:
                c = list(empty)
            else:
                c = list(clocks[preds[0]])
                for p in preds[1:]:
                    cp = clocks[p]
                    c = [x if x >= y else y for x, y in zip(c, cp)]
            c[q] = pos[i]
            clocks[i] = c
        self._queue = queue
        self._pos = pos
        self._clock = clocks

    def ordered(self, a: int, b: int) -> bool:
        """True if op ``a`` ends before op ``b`` starts in every run (``a != b``)."""
        if a == b:
            return False
        return self._pos[a] <= self._clock[b][self._queue[a]]


def _is_copy(op: Op) -> bool:
    return op.kind is OpKind.H2D and op.slot >= 0


def _is_lifetime(op: Op) -> bool:
    return op.tag in SLOT_LIFETIME_TAGS and op.slot >= 0


def _is_consumer(op: Op) -> bool:
    return op.slot >= 0 and op.kind is not OpKind.H2D and op.tag not in SLOT_LIFETIME_TAGS


def check_plan(plan: Plan) -> list[Hazard]:
    """All slot hazards of a plan, in plan order of the offending op.

    Returns:
        The findings (empty for a correct plan).
    """
    hb = HappensBefore(plan)
    ops = plan.ops
    out: list[Hazard] = []

    def add(kind: HazardKind, ids: tuple[int, ...], slot: int, device: int, detail: str) -> None:
        out.append(Hazard(kind, ids, tuple(ops[i].name for i in ids), slot, device, detail))

    last_fill_of_slot: dict[int, int] = {}                 # slot id -> latest copy (any GPU)
    last_fill: dict[tuple[int, int], int] = {}             # (device, slot) -> latest copy
    readers: dict[int, list[int]] = defaultdict(list)       # copy -> consumers of its contents
    copies_since_alloc: dict[tuple[int, int], list[int]] = defaultdict(list)
    freed_by: dict[int, int] = {}                           # slot id -> free op, until refilled
    for op in ops:
        if _is_copy(op):
            key = (op.device, op.slot)
            if op.nbytes > op.slot_bytes:
                add(HazardKind.SLOT_OVERFLOW, (op.id,), op.slot, op.device,
                    f"copy writes {op.nbytes} B into slot {op.slot} of {op.slot_bytes} B")
            prev = last_fill.get(key)
            if prev is not None:
                for r in readers[prev]:
                    if not hb.ordered(r, op.id):
                        add(HazardKind.SLOT_OVERWRITE, (op.id, r), op.slot, op.device,
                            f"copy into slot {op.slot} on GPU {op.device} may overwrite it while op {r} "
                            f"still reads the contents of copy {prev} (no free-event wait)")
            last_fill[key] = op.id
            last_fill_of_slot[op.slot] = op.id
            copies_since_alloc[key].append(op.id)
            freed_by.pop(op.slot, None)
        elif _is_lifetime(op):
            what = "freed" if op.tag == SLOT_FREE else "reallocated"
            keys = [k for k in list(copies_since_alloc) if k[1] == op.slot and (op.device < 0 or k[0] == op.device)]
            for key in keys:
                for c in copies_since_alloc[key]:
                    if not hb.ordered(c, op.id):
                        add(HazardKind.FREE_WHILE_COPYING, (op.id, c), op.slot, key[0],
                            f"slot {op.slot} on GPU {key[0]} {what} while copy {c} into it may be outstanding")
                    for r in readers.get(c, ()):
                        if not hb.ordered(r, op.id):
                            add(HazardKind.FREE_WHILE_COPYING, (op.id, r), op.slot, key[0],
                                f"slot {op.slot} on GPU {key[0]} {what} while op {r} may still read it")
                copies_since_alloc[key] = []
                if last_fill.get(key) is not None:
                    del last_fill[key]
                if last_fill_of_slot.get(op.slot) is not None and ops[last_fill_of_slot[op.slot]].device == key[0]:
                    del last_fill_of_slot[op.slot]
                    freed_by[op.slot] = op.id
        elif _is_consumer(op):
            if op.nbytes > op.slot_bytes:
                add(HazardKind.SLOT_OVERFLOW, (op.id,), op.slot, op.device,
                    f"reads {op.nbytes} B from slot {op.slot} of {op.slot_bytes} B (past the slot's end)")
            fill = last_fill_of_slot.get(op.slot)
            if fill is None:
                why = (f"after op {freed_by[op.slot]} freed it" if op.slot in freed_by
                       else "before any copy filled it")
                add(HazardKind.MISSING_READY_WAIT, (op.id,), op.slot, op.device, f"reads slot {op.slot} {why}")
                continue
            src = ops[fill]
            if src.device != op.device:
                add(HazardKind.CROSS_DEVICE_SLOT, (op.id, fill), op.slot, op.device,
                    f"split on GPU {op.device} reads slot {op.slot} filled on GPU {src.device}")
            if not hb.ordered(fill, op.id):
                add(HazardKind.MISSING_READY_WAIT, (op.id, fill), op.slot, op.device,
                    f"reads slot {op.slot} without waiting for copy {fill} to finish (no ready-event wait)")
            readers[fill].append(op.id)
    return out


# ----------------------------------------------------------------------------------------
# plan edits (slot lifetime ops, mutations for planting hazards)
# ----------------------------------------------------------------------------------------


def _copy_plan(plan: Plan, ops: list[Op]) -> Plan:
    return Plan(ops=ops, label=plan.label, graph_tokens=list(plan.graph_tokens),
                graph_last_op=list(plan.graph_last_op), meta=dict(plan.meta))


def append_slot_frees(plan: Plan, tag: str = SLOT_FREE) -> Plan:
    """A copy of ``plan`` with, at its end, one host op tagged ``tag`` per ``(device, slot)``
    that a copy used: the staging buffers freed (or reallocated) after the last graph, as a
    correct implementation does it: after synchronising the GPU (each free depends on the last
    op of every stream of its GPU). The builder does not emit these; they let the checker
    verify the slot lifetime end to end.

    Raises:
        ValueError: ``tag`` is not ``slot_free`` or ``slot_realloc``.
    """
    if tag not in SLOT_LIFETIME_TAGS:
        raise ValueError(f"tag must be one of {sorted(SLOT_LIFETIME_TAGS)}, got {tag!r}")
    out = _copy_plan(plan, list(plan.ops))
    last_on: dict[tuple[str, int], int] = {}
    for op in plan.ops:
        if op.stream in (Stream.COMPUTE, Stream.COPY):
            last_on[op.queue] = op.id
    used = sorted({(op.device, op.slot) for op in plan.ops if _is_copy(op)})
    graph = plan.ops[-1].graph if plan.ops else 0
    for dev, slot in used:
        deps = [oid for (_, d), oid in last_on.items() if d == dev]
        out.add(OpKind.HOST_WORK, Stream.HOST, dev, f"{tag} slot{slot} gpu{dev}", deps, slot=slot, tag=tag,
                graph=graph)
    return out


def insert_op(plan: Plan, at: int, kind: OpKind, stream: Stream, device: int, name: str,
              deps: tuple[int, ...] = (), **kw) -> tuple[Plan, int]:
    """A copy of ``plan`` with a new op at position ``at`` (program order); later ops move
    up by one and their deps are renumbered.

    Args:
        deps: ids (in ``plan``) of ops before ``at`` the new op depends on.

    Returns:
        ``(new plan, id of the new op)`` (= ``at``).

    Raises:
        ValueError: ``at`` out of range, or a dep not before ``at``.
    """
    if not 0 <= at <= len(plan.ops):
        raise ValueError(f"at={at} outside 0..{len(plan.ops)}")
    if any(d >= at for d in deps):
        raise ValueError(f"deps {deps} must be before position {at}")
    ops: list[Op] = []
    for op in plan.ops[:at]:
        ops.append(op)
    ops.append(Op(at, kind, stream, device, name, tuple(sorted(set(deps))), **kw))
    for op in plan.ops[at:]:
        ops.append(replace(op, id=op.id + 1, deps=tuple(d + 1 if d >= at else d for d in op.deps)))
    new = _copy_plan(plan, ops)
    new.graph_last_op = [g + 1 if g >= at else g for g in plan.graph_last_op]
    return new, at


def replace_op(plan: Plan, op_id: int, **changes) -> Plan:
    """A copy of ``plan`` with fields of one op changed (``deps``, ``device``, ``slot_bytes`` ...).

    Raises:
        ValueError: a changed dep that is not an earlier op.
    """
    op = replace(plan.ops[op_id], **changes)
    if any(d >= op_id or d < 0 for d in op.deps):
        raise ValueError(f"op {op_id}: deps must be earlier ops, got {op.deps}")
    ops = list(plan.ops)
    ops[op_id] = replace(op, deps=tuple(sorted(set(op.deps))))
    return _copy_plan(plan, ops)


# ----------------------------------------------------------------------------------------
# output and command line
# ----------------------------------------------------------------------------------------


def format_hazards(hazards: list[Hazard], max_rows: int | None = None) -> str:
    """A markdown table ``| kind | ops | names | gpu | slot | detail |`` (at most
    ``max_rows`` rows, then a count of the rest)."""
    head = ("kind", "ops", "names", "gpu", "slot", "detail")
    rows = [(h.kind.value, ", ".join(map(str, h.op_ids)), " / ".join(h.names), str(h.device), str(h.slot),
             h.detail) for h in hazards[:max_rows]]
    widths = [max(len(head[i]), *(len(r[i]) for r in rows)) if rows else len(head[i]) for i in range(len(head))]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    text = [line(head), "| " + " | ".join("-" * w for w in widths) + " |", *map(line, rows)]
    if max_rows is not None and len(hazards) > max_rows:
        text.append(f"... and {len(hazards) - max_rows} more")
    return "\n".join(text)


__all__ = [
    "HazardKind", "Hazard", "HappensBefore", "check_plan", "append_slot_frees", "insert_op", "replace_op",
    "format_hazards", "SLOT_FREE", "SLOT_REALLOC",
]

