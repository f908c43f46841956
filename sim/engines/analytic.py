"""Analytic engine: the plan's max-plus recurrence, vectorised over scenarios.

The timing contract of :mod:`sim.plan` is a max-plus linear system. With ``e[j]`` the end of
op ``j`` (seconds) and ``d[i]`` the duration of op ``i``::

    start[i] = max(e[queue_prev[i]], e[link_prev[i]], max_{j in deps[i]} e[j])   (0 if none)
    end[i]   = start[i] + d[i]

Every predecessor has a smaller id than ``i`` (queue and link order are plan order, and deps
point backwards), so one pass over the ops in plan order solves it exactly. This module does
that pass once per op and, for a batch of ``S`` scenarios that share the plan's structure
(a bandwidth sweep, a seed sweep of equal-shaped plans ...), does the arithmetic on all ``S``
at once with numpy.

Predecessor pruning (exact, not an approximation): ops of one queue run in FIFO order and
durations are >= 0, so along one queue end times never decrease. Of all predecessors of an
op that sit on the same queue only the one with the largest id can be the maximum; the others
are dropped when the plan is compiled (:func:`compile_plan`). A typical op then has one or two
predecessors left.

The module also holds the textbook closed forms used in tests and docs:
:func:`sequential_makespan` and :func:`pipeline_makespan` (see its docstring for the
derivation of the 2-slot double-buffer formula).
"""

from __future__ import annotations

import numpy as np

from ..plan import Plan, Schedule

ENGINE_NAME = "analytic"

_CACHE_KEY = "_sim_engines_compiled"

#: batches of at most this many scenarios run one scenario at a time (:func:`run`)
ROWS_MAX = 8


class CompiledPlan:
    """A plan reduced to what the recurrence needs.

    Attributes:
        n: number of ops.
        queue: (n,) queue id per op (from :attr:`sim.plan.Plan.arrays`).
        pred_ptr, pred_idx: the pruned predecessors of op ``i`` (queue predecessor, link
            predecessor and deps, at most one per queue: the latest; ascending) are
            ``pred_idx[pred_ptr[i]:pred_ptr[i + 1]]`` (int64 arrays).
        p0, p1, p2: the first three predecessors of each op as lists, -1 where it has fewer
            (None when some op has more than three; the scalar recurrence then reads
            :attr:`preds`).
    """

    __slots__ = ("n", "queue", "pred_ptr", "pred_idx", "p0", "p1", "p2", "_preds")

    def __init__(self, n: int, queue: np.ndarray, pred_ptr: np.ndarray, pred_idx: np.ndarray):
        self.n, self.queue, self.pred_ptr, self.pred_idx = n, queue, pred_ptr, pred_idx
        self._preds = None
        cnt = np.diff(pred_ptr)
        if n and cnt.max() > 3:
            self.p0 = self.p1 = self.p2 = None
            return
        cols = []
        first = pred_ptr[:-1]
        for k in range(3):
            has = cnt > k
            col = np.full(n, -1, dtype=np.int64)
            col[has] = pred_idx[first[has] + k]
            cols.append(col.tolist())
        self.p0, self.p1, self.p2 = cols

    @property
    def preds(self) -> tuple[tuple[int, ...], ...]:
        """Per op, the tuple of its pruned predecessors (ascending)."""
        if self._preds is None:
            flat = self.pred_idx.tolist()
            b = self.pred_ptr.tolist()
            self._preds = tuple([tuple(flat[b[i]:b[i + 1]]) for i in range(self.n)])
        return self._preds


def compile_plan(plan: Plan) -> CompiledPlan:
    """Collect, for every op, its pruned predecessor list (see the module docstring),
    vectorised over the plan's arrays.

    The result is cached on the plan and rebuilt if ops were added since (``Plan.add``
    changes ``Plan.arrays``, which this cache is keyed on).

    Returns:
        :class:`CompiledPlan`.
    """
    arrays = plan.arrays
    cached = plan.__dict__.get(_CACHE_KEY)
    if cached is not None and cached[0] is arrays:
        return cached[1]
    ptr, idx = _pruned_pred_csr(arrays)
    comp = CompiledPlan(arrays.n, arrays.queue, ptr, idx)
    plan.__dict__[_CACHE_KEY] = (arrays, comp)
    return comp


def _pruned_pred_csr(arrays) -> tuple[np.ndarray, np.ndarray]:
    """Per op, its deps, queue predecessor and link predecessor, only the latest per queue,
    sorted (vectorised: one lexsort over every (op, candidate) pair), as CSR arrays
    ``(pointers (n+1,), ids)``."""
    n = arrays.n
    if n == 0:
        return np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64)
    ptr = arrays.dep_ptr
    dep_op = np.repeat(np.arange(n, dtype=np.int64), np.diff(ptr))
    ops = np.concatenate((dep_op, np.arange(n, dtype=np.int64), np.arange(n, dtype=np.int64)))
    cand = np.concatenate((arrays.dep_idx, arrays.queue_prev, arrays.link_prev))
    keep = cand >= 0
    ops, cand = ops[keep], cand[keep]
    q = arrays.queue[cand]
    # sort by (op, queue of the candidate, candidate): the last of each (op, queue) is the latest
    order = np.lexsort((cand, q, ops))
    ops, cand, q = ops[order], cand[order], q[order]
    last = np.ones(ops.size, dtype=bool)
    if ops.size > 1:
        last[:-1] = (ops[1:] != ops[:-1]) | (q[1:] != q[:-1])
    ops, cand = ops[last], cand[last]
    # sorted by candidate id within each op
    order = np.lexsort((cand, ops))
    ops, cand = ops[order], cand[order]
    return np.searchsorted(ops, np.arange(n + 1, dtype=np.int64)), cand


def _pruned_preds(arrays) -> list[tuple[int, ...]]:
    """:func:`_pruned_pred_csr` as a list of tuples (what :func:`_pruned_preds_loop` gives)."""
    b, cand = _pruned_pred_csr(arrays)
    bounds, flat = b.tolist(), cand.tolist()
    return [tuple(flat[bounds[i]:bounds[i + 1]]) for i in range(arrays.n)]


def _pruned_preds_loop(arrays) -> list[tuple[int, ...]]:
    """The straightforward loop that :func:`_pruned_preds` vectorises (kept for tests)."""
    queue = arrays.queue.tolist()
    qprev = arrays.queue_prev.tolist()
    lprev = arrays.link_prev.tolist()
    ptr = arrays.dep_ptr.tolist()
    idx = arrays.dep_idx.tolist()
    preds: list[tuple[int, ...]] = []
    for i in range(arrays.n):
        best: dict[int, int] = {}
        cands = idx[ptr[i]:ptr[i + 1]]
        cands.append(qprev[i])
        cands.append(lprev[i])
        for j in cands:
            if j < 0:
                continue
            q = queue[j]
            if best.get(q, -1) < j:
                best[q] = j
        preds.append(tuple(sorted(best.values())))
    return preds


def check_durations(durations, n: int, *, allow_batch: bool = True) -> np.ndarray:
    """Validate op durations and return them as float64.

    Args:
        durations: (n,) or, if ``allow_batch``, (S, n) seconds; finite and >= 0.
        n: number of ops in the plan.

    Raises:
        ValueError: wrong shape, NaN/inf, or a negative duration (naming the first bad op).
    """
    d = np.asarray(durations, dtype=np.float64)
    ok_ndim = (1, 2) if allow_batch else (1,)
    if d.ndim not in ok_ndim or d.shape[-1] != n:
        want = "(n,) or (S, n)" if allow_batch else "(n,)"
        raise ValueError(f"durations: shape {d.shape} does not fit a plan of {n} ops; expected {want}")
    bad = ~np.isfinite(d) | (d < 0)
    if bad.any():
        where = np.argwhere(bad)[0]
        op = int(where[-1])
        raise ValueError(f"durations: op {op} has duration {d[tuple(where)]!r}; durations must be finite and >= 0 s")
    return d


def run(plan: Plan | CompiledPlan, durations) -> Schedule:
    """Earliest start/end of every op (the plan's timing contract), for one or S scenarios.

    Args:
        plan: a :class:`~sim.plan.Plan` (or a :class:`CompiledPlan` from :func:`compile_plan`,
            to skip compilation in a tight loop).
        durations: (n,) or (S, n) float seconds, finite and >= 0.

    Returns:
        :class:`~sim.plan.Schedule` with ``start_s``/``end_s`` of the same shape as
        ``durations``, ``engine="analytic"``. A batch of up to :data:`ROWS_MAX` scenarios
        is run one scenario at a time with Python floats (faster than numpy calls on short
        rows; the same arithmetic); for a larger batch they are transposed views of (n, S)
        arrays (column-major (S, n)): the engine works op by op on rows of S scenarios, and a
        transposing copy would double its memory traffic.

    Raises:
        ValueError: see :func:`check_durations`.
    """
    comp = plan if isinstance(plan, CompiledPlan) else compile_plan(plan)
    d = check_durations(durations, comp.n)
    if d.ndim == 1:
        start, end = _run_one(comp, d.tolist())
        return Schedule(np.asarray(start, dtype=np.float64), np.asarray(end, dtype=np.float64), ENGINE_NAME)
    if d.shape[0] <= ROWS_MAX:
        rows = [_run_one(comp, r) for r in d.tolist()]
        return Schedule(np.array([r[0] for r in rows], dtype=np.float64).reshape(d.shape),
                        np.array([r[1] for r in rows], dtype=np.float64).reshape(d.shape), ENGINE_NAME)
    start, end = _run_batch(comp.preds, d)
    return Schedule(start, end, ENGINE_NAME)


def _run_one(comp: CompiledPlan, dur: list[float]) -> tuple[list[float], list[float]]:
    """One scenario: :func:`_run_three` when no op has more than three predecessors, else
    :func:`_run_scalar`."""
    if comp.p0 is None:
        return _run_scalar(comp.preds, dur)
    return _run_three(comp.p0, comp.p1, comp.p2, dur)


def _run_three(p0: list[int], p1: list[int], p2: list[int], dur: list[float]) -> tuple[list[float], list[float]]:
    """One scenario, every op with at most three predecessors ``p0[i], p1[i], p2[i]`` (-1:
    none): ``end`` has one extra slot, ``end[-1] = 0.0``, that a missing predecessor reads (ends
    are >= 0, so it never raises a start: the same maxima as :func:`_run_scalar`)."""
    n = len(dur)
    start = [0.0] * n
    end = [0.0] * (n + 1)
    for i, a, b, c, d in zip(range(n), p0, p1, p2, dur):
        s = end[a]
        e = end[b]
        if e > s:
            s = e
        e = end[c]
        if e > s:
            s = e
        start[i] = s
        end[i] = s + d
    del end[n]
    return start, end


def _run_scalar(preds, dur: list[float]) -> tuple[list[float], list[float]]:
    """One scenario with plain Python floats (faster than numpy for S = 1)."""
    n = len(dur)
    start = [0.0] * n
    end = [0.0] * n
    for i in range(n):
        p = preds[i]
        k = len(p)
        if k == 0:
            s = 0.0
        elif k == 1:
            s = end[p[0]]
        elif k == 2:
            s = end[p[0]]
            b = end[p[1]]
            if b > s:
                s = b
        else:
            s = max([end[j] for j in p])
        start[i] = s
        end[i] = s + dur[i]
    return start, end


def _run_batch(preds, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """S scenarios at once: rows of ``(n, S)`` arrays, one numpy call or two per op.

    Returns (S, n) views (transposes) of the (n, S) start and end arrays."""
    n = d.shape[1]
    s_count = d.shape[0]
    dt = np.ascontiguousarray(d.T)
    start = np.zeros((n, s_count))
    end = np.empty((n, s_count))
    maximum = np.maximum
    add = np.add
    for i in range(n):
        p = preds[i]
        k = len(p)
        si = start[i]
        if k == 1:
            si[:] = end[p[0]]
        elif k >= 2:
            maximum(end[p[0]], end[p[1]], out=si)
            for j in p[2:]:
                maximum(si, end[j], out=si)
        add(si, dt[i], out=end[i])
    return start.T, end.T


# --------------------------------------------------------------------------------------
# Textbook closed forms
# --------------------------------------------------------------------------------------


def sequential_makespan(C, T):
    """Makespan of splits run one after the other: copy, then compute, no overlap.

    This is the baseline ggml scheduler with one graph copy (docs/DESIGN.md: layer time
    ``C_n + T_n``): ``makespan = sum_i (C_i + T_i)``.

    Args:
        C: (..., n) compute time of each split, seconds.
        T: (..., n) copy (H2D) time of each split, seconds.

    Returns:
        float, or an array of the leading shape.
    """
    C = np.asarray(C, dtype=np.float64)
    T = np.asarray(T, dtype=np.float64)
    out = (C + T).sum(axis=-1)
    return float(out) if out.ndim == 0 else out


def pipeline_recurrence(C, T, slots: int):
    """End times of a copy/compute pipeline with ``slots`` staging buffers (the recurrence).

    Model (docs/DESIGN.md, variants 1 and 3): split ``i`` (1-based) first copies ``T_i`` into
    staging slot ``i mod slots`` on the copy stream (one link, FIFO), then computes ``C_i``
    on the compute stream after the copy's ready event. A slot is overwritten only after the
    compute that read it finished (free event), so copy ``i`` also waits for compute
    ``i - slots``. With ``a_i`` the end of copy ``i`` and ``b_i`` the end of compute ``i``
    (``a_0 = 0``, ``b_j = 0`` for ``j <= 0``)::

        a_i = max(a_{i-1}, b_{i-slots}) + T_i
        b_i = max(b_{i-1}, a_i) + C_i          makespan = b_n

    Args:
        C, T: (..., n) seconds, broadcast against each other.
        slots: number of staging slots, >= 1.

    Returns:
        (a, b): arrays of shape (..., n).

    Raises:
        ValueError: ``slots < 1``.
    """
    if int(slots) != slots or slots < 1:
        raise ValueError(f"slots: must be an integer >= 1, got {slots!r}")
    slots = int(slots)
    C, T = np.broadcast_arrays(np.asarray(C, dtype=np.float64), np.asarray(T, dtype=np.float64))
    n = C.shape[-1]
    a = np.zeros(C.shape)
    b = np.zeros(C.shape)
    zero = np.zeros(C.shape[:-1])
    for i in range(n):
        a_prev = a[..., i - 1] if i >= 1 else zero
        b_prev = b[..., i - 1] if i >= 1 else zero
        b_free = b[..., i - slots] if i - slots >= 0 else zero
        a[..., i] = np.maximum(a_prev, b_free) + T[..., i]
        b[..., i] = np.maximum(b_prev, a[..., i]) + C[..., i]
    return a, b


def pipeline_makespan(C, T, slots: int = 2):
    """Makespan of a copy/compute pipeline with ``slots`` staging buffers.

    The model and its recurrence are given in :func:`pipeline_recurrence`. Closed forms:

    * ``slots == 1`` (one buffer): copy ``i`` waits for compute ``i-1``, so nothing overlaps
      and ``makespan = sum_i (C_i + T_i)`` = :func:`sequential_makespan`.
    * ``slots == 2`` (double buffering)::

          makespan = T_1 + sum_{i=1}^{n-1} max(C_i, T_{i+1}) + C_n

      Proof by induction. Let ``P_i = T_1 + sum_{j=1}^{i-1} max(C_j, T_{j+1})`` (the start
      of compute ``i``). Claim: ``a_{i+1} = P_i + T_{i+1}`` and ``b_i = P_i + C_i``.
      Base: ``a_1 = T_1``, ``b_1 = T_1 + C_1 = P_1 + C_1``, ``a_2 = max(a_1, b_0) + T_2 =
      T_1 + T_2 = P_1 + T_2``. Step: ``a_{i+1} = max(a_i, b_{i-1}) + T_{i+1}
      = P_{i-1} + max(T_i, C_{i-1}) + T_{i+1} = P_i + T_{i+1}``, then
      ``b_{i+1} = max(b_i, a_{i+1}) + C_{i+1} = P_i + max(C_i, T_{i+1}) + C_{i+1}
      = P_{i+1} + C_{i+1}``. So ``b_n = P_n + C_n``, the formula above: per split the
      layer time is ``max(C_i, T_{i+1})`` (docs/DESIGN.md, variant 1), plus the first copy and
      the last compute that nothing hides.
    * ``slots >= n`` (never waits for a free slot): copies run back to back,
      ``a_i = sum_{j<=i} T_j``, and ``b_n = max_j (sum_{i<=j} T_i + sum_{i>=j} C_i)``
      (two-machine flow shop; the maximising ``j`` is the split where the copy stream
      stops being the bottleneck).
    * otherwise the recurrence is evaluated.

    Args:
        C, T: (..., n) seconds (n >= 1), broadcast against each other.
        slots: staging slots, >= 1.

    Returns:
        float, or an array of the leading shape.

    Raises:
        ValueError: ``slots < 1`` or ``n == 0``.
    """
    if int(slots) != slots or slots < 1:
        raise ValueError(f"slots: must be an integer >= 1, got {slots!r}")
    C, T = np.broadcast_arrays(np.asarray(C, dtype=np.float64), np.asarray(T, dtype=np.float64))
    n = C.shape[-1]
    if n == 0:
        raise ValueError("pipeline_makespan: need at least one split")
    if slots == 1:
        out = (C + T).sum(axis=-1)
    elif slots == 2:
        out = T[..., 0] + np.maximum(C[..., :-1], T[..., 1:]).sum(axis=-1) + C[..., -1]
    elif slots >= n:
        t_cum = np.cumsum(T, axis=-1)
        c_tail = np.cumsum(C[..., ::-1], axis=-1)[..., ::-1]
        out = (t_cum + c_tail).max(axis=-1)
    else:
        out = pipeline_recurrence(C, T, slots)[1][..., -1]
    return float(out) if np.ndim(out) == 0 else out
