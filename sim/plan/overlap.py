"""The next ubatch's host work behind the previous ubatch's GPU work (llama.cpp prompts).

llama.cpp does not synchronise between the ubatches of a prompt: ``llama_decode`` returns after
launching a ubatch's GPU splits, and the host goes on with the next ubatch (the call's batch
checks, the memory apply, the graph build and allocation, the KQ masks, the token embedding's
GET_ROWS on the CPU backend) while the GPU still runs the previous one. It waits for the GPU only
where the scheduler copies the next ubatch's inputs to the GPU (``ggml_backend_sched_compute_
splits`` synchronises the split's backend before copying graph inputs when it has no events: one
GPU, ``n_copies == 1``). llama-bench synchronises once, after the last ubatch of the prompt
(``test_prompt``), and after every decode token (``test_gen``). Measured with the ``phase-time``
patch (``data/llamacpp/h200-20261202-phase``): gpt-oss pp2048 at ``-ub 512`` builds the next
ubatch (4.6 ms of host work) during the previous one's 40 ms of GPU work.

The simulator times each graph on its own, ending in a full synchronisation (:mod:`sim.plan.memo`).
For a prompt on a llama.cpp profile (a ``[ggml]`` table) the test's time is then the sum of the
graphs' makespans less, for each pair of consecutive ubatches, ``min(F_k, H_{k+1})``
(:func:`ubatch_overlap_s`): ``H`` is a graph's host prefix, the time from its start to its first
GPU op (the host work before the scheduler's first wait for the GPU), ``F`` the host's idle tail,
from the end of its last host or CPU-backend op to the graph's end (:func:`graph_host_edges`).
This is exact when every op after the next graph's first GPU op depends on that op or on the
host work after it (the scheduler's wait orders them), so that the rest of the graph shifts as
one; the trace and timeline still show the graphs one after the other.
"""

from __future__ import annotations

import numpy as np

from sim.plan import KIND_CODE, STREAM_CODE, OpKind, Plan, Stream

_GPU_STREAMS = (STREAM_CODE[Stream.COMPUTE], STREAM_CODE[Stream.COPY])
_HOST_STREAMS = (STREAM_CODE[Stream.HOST], STREAM_CODE[Stream.CPU])
_WAITS = (KIND_CODE[OpKind.HOST_SYNC], KIND_CODE[OpKind.EVENT_WAIT])


_MASKS_KEY = "_sim_overlap_edge_masks"


def _edge_masks(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """``(gpu, busy)`` op masks of a plan: ops on a GPU stream; host-thread and CPU-backend ops
    other than waits and syncs (kept on the plan, :meth:`sim.plan.Plan.derived`)."""
    return plan.derived(_MASKS_KEY, _build_edge_masks)


def _build_edge_masks(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    a = plan.arrays
    stream = np.asarray(a.stream)
    kind = np.asarray(a.kind)
    gpu = _any_of(stream, _GPU_STREAMS)
    busy = _any_of(stream, _HOST_STREAMS) & ~_any_of(kind, _WAITS)
    return gpu, busy


def _any_of(codes: np.ndarray, values: tuple[int, ...]) -> np.ndarray:
    """``np.isin(codes, values)`` for a few values: one comparison per value."""
    out = np.zeros(codes.shape, dtype=bool)
    for v in values:
        out |= codes == v
    return out


_ENDS_KEY = "_sim_overlap_queue_ends"


def _queue_ends(plan: Plan) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(first, last, gpu_first, busy_last)`` op ids of a plan (kept on the plan,
    :meth:`sim.plan.Plan.derived`): the first and the last op of every queue, the first op of
    every GPU queue (compute or copy) and the last host-thread or CPU-backend op of every host
    queue that is not a wait or a sync (:func:`_edge_masks`).

    Every op starts after the end of the op before it on its queue (the engines' queue order),
    and durations are >= 0, so along a queue starts and ends never decrease: the smallest start
    of a set of ops on one queue is that of its first op, the largest end that of its last one.
    The extrema over these few ops are then those over all ops, exactly."""
    return plan.derived(_ENDS_KEY, _build_queue_ends)


def _build_queue_ends(plan: Plan) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    a = plan.arrays
    gpu, busy = _edge_masks(plan)
    n_q = int(a.queue.max()) + 1 if a.n else 0
    ids = np.arange(a.n, dtype=np.int64)
    first = np.flatnonzero(np.asarray(a.queue_prev) < 0)
    last = np.full(n_q, -1, dtype=np.int64)
    np.maximum.at(last, a.queue, ids)
    busy_last = np.full(n_q, -1, dtype=np.int64)
    np.maximum.at(busy_last, a.queue[busy], ids[busy])
    return first, last[last >= 0], first[gpu[first]], busy_last[busy_last >= 0]


def template_makespans(plan: Plan, end: np.ndarray) -> np.ndarray:
    """``end.max(axis=1)`` of ``(S, n)`` op end times of a plan, from the last op of each
    queue (:func:`_queue_ends`; the same values): ``(S,)`` seconds."""
    end = np.atleast_2d(end)
    if not end.shape[1]:
        return np.zeros(end.shape[0])
    return end[:, _queue_ends(plan)[1]].max(axis=1)


def template_host_edges(plan: Plan, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`graph_host_edges` of a one-graph plan for several schedules at once: ``start`` and
    ``end`` ``(S, n)``, returns ``(H, F)`` ``(S,)`` each, read at the ends of the plan's queues
    (:func:`_queue_ends`: the same extrema as over every op, exactly)."""
    start, end = np.atleast_2d(start), np.atleast_2d(end)
    S = start.shape[0]
    if not start.shape[1]:
        return np.zeros(S), np.zeros(S)
    first, last, gpu_first, busy_last = _queue_ends(plan)
    g0, g1 = start[:, first].min(axis=1), end[:, last].max(axis=1)
    H = start[:, gpu_first].min(axis=1) - g0 if gpu_first.size else np.zeros(S)
    F = np.maximum(g1 - end[:, busy_last].max(axis=1), 0.0) if busy_last.size else np.zeros(S)
    return H, F


def graph_host_edges(plan: Plan, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(H, F)`` of each graph of a timed plan, seconds, ``(n_graphs,)`` each.

    ``H``: from the graph's start (its first op's start) to the start of its first op on a GPU
    stream (compute or copy); 0 for a graph without one (nothing for the next host work to hide
    behind). ``F``: from the end of its last host-thread or CPU-backend op (waits and syncs
    excluded) to the graph's end; 0 without such an op.

    Args:
        plan: the plan (its ``graph`` and ``stream`` columns).
        start, end: ``(n,)`` op start and end times of one schedule.
    """
    graph = np.asarray(plan.graphs, dtype=np.int64)
    n_g = int(graph.max()) + 1 if graph.size else 0
    H = np.zeros(n_g)
    F = np.zeros(n_g)
    if not n_g:
        return H, F
    gpu, busy = _edge_masks(plan)
    g_start = np.full(n_g, np.inf)
    g_end = np.full(n_g, -np.inf)
    np.minimum.at(g_start, graph, start)
    np.maximum.at(g_end, graph, end)
    first_gpu = np.full(n_g, np.inf)
    np.minimum.at(first_gpu, graph[gpu], start[gpu])
    host_end = np.full(n_g, -np.inf)
    np.maximum.at(host_end, graph[busy], end[busy])
    ok = np.isfinite(first_gpu)
    H[ok] = first_gpu[ok] - g_start[ok]
    ok = np.isfinite(host_end)
    F[ok] = np.maximum(g_end[ok] - host_end[ok], 0.0)
    return H, F


def ubatch_overlap_s(ctx, test, H: np.ndarray, F: np.ndarray) -> float:
    """Seconds the test's graphs overlap (module docstring): ``sum_k min(F_k, H_{k+1})`` over
    consecutive graphs of a prompt on a llama.cpp profile; 0 for decode (llama-bench synchronises
    after every token) and for profiles without a ``[ggml]`` table (the CuPy executor
    synchronises every graph)."""
    if ctx.scn.hardware.ggml is None or not test.n_prompt or len(H) < 2:
        return 0.0
    return float(np.minimum(np.asarray(F[:-1]), np.asarray(H[1:])).sum())


__all__ = ["graph_host_edges", "template_host_edges", "template_makespans", "ubatch_overlap_s"]
