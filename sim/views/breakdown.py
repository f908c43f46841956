"""Where a test's time goes: the critical path of a timed plan, by op category.

Every op's start is the end of one of its predecessors (its queue predecessor, its link
predecessor or a dependency; :mod:`sim.plan`'s timing contract), or 0 when it has none. Walking
back from the op that ends last, each step to the predecessor whose end is the op's start, gives
the *critical path*: a chain of ops whose durations add up to the makespan (plus any gap an
engine leaves between an op's start and its predecessors' ends: none for the analytic engine).
Shortening an op off that path does not shorten the test; shortening one on it does, until
another path becomes critical.

:func:`breakdown` sums, per category of op (llama.cpp's terms: ``MUL_MAT_ID`` on the GPU, H2D
copies of experts, the CPU backend's expert matmuls, the scheduler's host work per split ...,
:func:`category`), the time on the critical path and the time busy (all its ops' durations,
overlapped or not). ``busy - critical`` is the time the schedule hid behind other work.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.plan import KINDS, STREAMS, OpKind, Plan, Schedule, Stream

#: label of an H2D copy by its tag (:mod:`sim.plan.builder`'s tags)
_H2D_TAGS = {
    "whole": "H2D weights, whole tensors (op offload)",
    "selective": "H2D experts, used ones only (selective copy)",
    "cache_miss": "H2D experts, expert-cache misses",
    "cache_fill": "H2D expert-cache fills",
    "prefetch": "H2D prefetch into staging slots",
    "staged": "H2D prefetch into staging slots",
    "act": "H2D activations",
    "kq_mask": "H2D KQ mask",
}
_D2H_TAGS = {"ids": "D2H router ids (top-k)", "act": "D2H activations"}
_HOST_WORK_TAGS = {
    "graph_overhead": "host: graph build, allocation, launch overhead",
    "kq_mask": "host: KQ mask fill (set_input)",
    "split_overhead": "host: scheduler work per GPU split",
    "cpu_split_overhead": "host: CPU split (graph plan, thread pool)",
    "kv_moved": "host: KV store of a CPU layer",
    "": "host: expert runs from router ids",
}
_CPU_SUB = {
    "moe": "CPU backend: MUL_MAT_ID (host experts)",
    "mm": "CPU backend: MUL_MAT (host weights)",
    "attn": "CPU backend: attention",
    "rows": "CPU backend: GET_ROWS / SET_ROWS (one thread)",
}
_GPU_COMPUTE = {
    OpKind.GEMM: "GPU MUL_MAT (dense weights)",
    OpKind.MOE: "GPU MUL_MAT_ID (experts)",
    OpKind.ATTN: "GPU attention and the layer's elementwise ops",
}
_HOST_KINDS = {
    OpKind.ISSUE: "host: kernel launches and copy calls",
    OpKind.HOST_SYNC: "host: synchronisation wake-ups",
    OpKind.EVENT_RECORD: "host: CUDA events",
    OpKind.EVENT_WAIT: "host: CUDA events",
}
#: the category of engine gaps on the critical path (an op starting after its predecessors end)
GAP = "wait (no op on the critical path)"


def category(kind: OpKind, stream: Stream, tag: str, sub: str = "") -> str:
    """The breakdown category of an op: ``kind`` and ``stream`` (:mod:`sim.plan`), its ``tag``
    and, for a CPU-backend op, ``sub`` (the role in its shape: ``"moe"``, ``"mm"``, ``"attn"``,
    ``"rows"``). An op of an unknown tag keeps its kind and tag in the label."""
    if kind is OpKind.H2D:
        if stream is Stream.COPY:
            return "H2D prefetch on the copy stream" if tag != "cache_fill" else _H2D_TAGS["cache_fill"]
        return _H2D_TAGS.get(tag, f"H2D ({tag or 'untagged'})")
    if kind is OpKind.D2H:
        return _D2H_TAGS.get(tag, f"D2H ({tag or 'untagged'})")
    if kind in _GPU_COMPUTE:
        label = _GPU_COMPUTE[kind]
        return label + (", expert-cache hits" if tag == "cache_hit" else "")
    if kind is OpKind.CPU_MATVEC:
        return _CPU_SUB.get(sub, "CPU backend: other ops")
    if kind is OpKind.HOST_WORK:
        return _HOST_WORK_TAGS.get(tag, f"host: {tag}")
    return _HOST_KINDS.get(kind, f"{kind.value} ({tag})" if tag else kind.value)


def op_categories(plan: Plan) -> list[str]:
    """:func:`category` of every op of ``plan``, in plan order (n labels)."""
    memo: dict[tuple, str] = {}
    out = []
    for k, s, tag, shape in zip(plan.kinds, plan.streams, plan.tags, plan.shapes):
        sub = shape[4] if len(shape) > 4 and isinstance(shape[4], str) else ""
        key = (k, s, tag, sub)
        lab = memo.get(key)
        if lab is None:
            lab = memo[key] = category(KINDS[k], STREAMS[s], tag, sub)
        out.append(lab)
    return out


def critical_path(plan: Plan, schedule: Schedule) -> tuple[np.ndarray, np.ndarray]:
    """The critical path of one timed plan, in time order.

    Args:
        plan: the plan (n ops).
        schedule: its schedule from one engine, ``start_s``/``end_s`` of shape (n,).

    Returns:
        ``(ops, gaps)``: the op ids of the path (first to last), and per op the seconds between
        its critical predecessor's end (0 for the first op) and its start (0 where the engine
        starts an op as soon as it may; the analytic engine always does).

    Raises:
        ValueError: a batched schedule (S, n), or one whose length is not the plan's.
    """
    start = np.asarray(schedule.start_s, dtype=np.float64)
    end = np.asarray(schedule.end_s, dtype=np.float64)
    n = len(plan)
    if start.ndim != 1 or start.shape != (n,) or end.shape != (n,):
        raise ValueError(f"schedule of shape {start.shape} for a plan of {n} ops (one scenario's schedule needed)")
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    a = plan.arrays
    cnt = np.diff(a.dep_ptr)
    dep_ops = np.repeat(np.arange(n, dtype=np.int64), cnt)
    ops = np.concatenate([np.flatnonzero(a.queue_prev >= 0), np.flatnonzero(a.link_prev >= 0), dep_ops])
    preds = np.concatenate([a.queue_prev[a.queue_prev >= 0], a.link_prev[a.link_prev >= 0],
                            np.asarray(a.dep_idx, dtype=np.int64)])
    choice = np.full(n, -1, dtype=np.int64)
    if ops.size:
        # per op, the predecessor that ends last (the lowest id among equal ends)
        order = np.lexsort((preds, -end[preds], ops))
        first = np.ones(order.size, dtype=bool)
        first[1:] = ops[order][1:] != ops[order][:-1]
        choice[ops[order][first]] = preds[order][first]
    path = []
    cur = int(np.flatnonzero(end == end.max())[-1])
    while cur >= 0:
        path.append(cur)
        cur = int(choice[cur])
    path_ops = np.asarray(path[::-1], dtype=np.int64)
    prev_end = np.concatenate([[0.0], end[path_ops[:-1]]])
    gaps = np.maximum(start[path_ops] - prev_end, 0.0)
    return path_ops, gaps


@dataclass(frozen=True)
class Breakdown:
    """One timed plan's time by category.

    Attributes:
        makespan_s: the test's time, seconds (the schedule's last end).
        path_ops: ops on the critical path.
        rows: ``(category, critical_s, busy_s, n_ops, n_critical_ops)`` per category, the
            largest ``critical_s`` first (then the largest ``busy_s``); ``critical_s`` sums to
            ``makespan_s`` over the rows (gaps included as :data:`GAP`).
    """

    makespan_s: float
    path_ops: int
    rows: tuple[tuple[str, float, float, int, int], ...]


def breakdown(plan: Plan, schedule: Schedule) -> Breakdown:
    """Time of ``plan`` under ``schedule`` by :func:`category`: on the critical path
    (:func:`critical_path`) and busy (every op's duration).

    Raises:
        ValueError: as :func:`critical_path`.
    """
    path, gaps = critical_path(plan, schedule)
    start = np.asarray(schedule.start_s, dtype=np.float64)
    end = np.asarray(schedule.end_s, dtype=np.float64)
    dur = end - start
    cats = op_categories(plan)
    labels = sorted(set(cats))
    index = {c: i for i, c in enumerate(labels)}
    code = np.fromiter((index[c] for c in cats), dtype=np.int64, count=len(cats))
    busy = np.bincount(code, weights=dur, minlength=len(labels))
    n_ops = np.bincount(code, minlength=len(labels))
    crit = np.bincount(code[path], weights=dur[path], minlength=len(labels))
    n_crit = np.bincount(code[path], minlength=len(labels))
    rows = [(c, float(crit[i]), float(busy[i]), int(n_ops[i]), int(n_crit[i])) for i, c in enumerate(labels)]
    gap = float(gaps.sum())
    if gap > 0:
        rows.append((GAP, gap, 0.0, 0, int((gaps > 0).sum())))
    rows.sort(key=lambda r: (-r[1], -r[2], r[0]))
    makespan = float(end.max()) if end.size else 0.0
    return Breakdown(makespan, int(path.size), tuple(rows))


__all__ = ["GAP", "Breakdown", "breakdown", "category", "critical_path", "op_categories"]
