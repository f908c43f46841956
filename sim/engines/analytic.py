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

Batches of scenarios that differ only in durations (the KV lengths of a prefill's ubatches,
:mod:`sim.plan.memo`) mostly share their *critical tree* (each op's start is the end of one
predecessor): :func:`_run_tree` times one scenario op by op and sums the others along its
tree with numpy, checking that the tree is theirs (exact: the same additions in the same
order; a scenario it does not fit is timed op by op).

The module also holds the textbook closed forms used in tests and docs:
:func:`sequential_makespan` and :func:`pipeline_makespan` (see its docstring for the
derivation of the 2-slot double-buffer formula).
"""

from __future__ import annotations

import numpy as np

from sim.plan import Plan, Schedule

ENGINE_NAME = "analytic"

_CACHE_KEY = "_sim_engines_compiled"

#: batches of at most this many scenarios run one scenario at a time (:func:`run`), unless the
#: compiled plan has timed a batch before (then :func:`_run_tree`)
ROWS_MAX = 8

#: :func:`run` times a batch of more than :data:`ROWS_MAX` scenarios along the critical tree
#: of its first one (:func:`_run_tree`); False runs :func:`_run_batch` (the reference path the
#: tests compare it with)
ENABLE_TREE = True
TREE_MIN_ROWS = ROWS_MAX + 1


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

    __slots__ = ("n", "queue", "pred_ptr", "pred_idx", "p0", "p1", "p2", "_preds", "_trees", "_last_tree", "_columns", "_pred_ops",
                 "_small_batches", "two")

    def __init__(self, n: int, queue: np.ndarray, pred_ptr: np.ndarray, pred_idx: np.ndarray):
        self.n, self.queue, self.pred_ptr, self.pred_idx = n, queue, pred_ptr, pred_idx
        self._preds = None
        self._trees: dict = {}      # critical-predecessor choices (bytes) -> _Tree (_tree_for)
        self._last_tree = None      # the _Tree last used (tried first by _run_tree)
        self._small_batches = 0     # batches of 2..ROWS_MAX rows timed row by row (run)
        self._columns = None        # p0, p1, p2 as int64 arrays (columns)
        self._pred_ops = None       # pred_ops
        #: no op has more than two predecessors (p2 is all -1): :func:`_run_two_choice` applies
        self.two = False
        cnt = np.diff(pred_ptr)
        if n and cnt.max() > 3:
            self.p0 = self.p1 = self.p2 = None
            return
        first = pred_ptr[:-1]
        top = max(pred_idx.size - 1, 0)
        self.two = not (n and bool(cnt.max() > 2))
        cols = []
        for k in range(2 if self.two else 3):
            # pred_idx[first + k] where the op has more than k predecessors (clipped reads elsewhere)
            col = (np.where(cnt > k, pred_idx[np.minimum(first + k, top)], -1) if pred_idx.size
                   else np.full(n, -1, dtype=np.int64))
            cols.append(col.astype(np.int64, copy=False))
        lists = [c.tolist() for c in cols]
        if self.two:   # no third predecessor anywhere
            cols.append(np.full(n, -1, dtype=np.int64))
            lists.append([-1] * n)
        self._columns = tuple(cols)
        self.p0, self.p1, self.p2 = lists

    @property
    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:attr:`p0`, :attr:`p1`, :attr:`p2` as int64 arrays (only when they are set)."""
        if self._columns is None:
            self._columns = tuple(np.array(c, dtype=np.int64) for c in (self.p0, self.p1, self.p2))
        return self._columns

    @property
    def pred_ops(self) -> np.ndarray:
        """(len(pred_idx),) int64: the op each entry of :attr:`pred_idx` is a predecessor of
        (made on first use and kept)."""
        if self._pred_ops is None:
            self._pred_ops = np.repeat(np.arange(self.n, dtype=np.int64), np.diff(self.pred_ptr))
        return self._pred_ops

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
    return plan.derived(_CACHE_KEY, _compile)


def _compile(plan: Plan) -> CompiledPlan:
    arrays = plan.arrays
    ptr, idx = _pruned_pred_csr(arrays)
    return CompiledPlan(arrays.n, arrays.queue, ptr, idx)


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
        rows; the same arithmetic); a larger one, or any batch of two or more on a compiled
        plan that has timed a batch before (a graph template timed again), by
        :func:`_run_tree` (the scenarios along that tree, or along the tree of
        the first one timed op by op, with numpy, checked, to the bit; :data:`ENABLE_TREE`),
        or, with that off, op by op on rows of S scenarios
        (:func:`_run_batch`; then the arrays are transposed views of (n, S) arrays).

    Raises:
        ValueError: see :func:`check_durations`.
    """
    comp = plan if isinstance(plan, CompiledPlan) else compile_plan(plan)
    d = check_durations(durations, comp.n)
    if d.ndim == 1:
        start, end = _run_one(comp, d.tolist())
        return Schedule(np.asarray(start, dtype=np.float64), np.asarray(end, dtype=np.float64), ENGINE_NAME)
    # a plan timed again (a graph template): its small batches go along a critical tree too
    tree_kept = ENABLE_TREE and d.shape[0] > 1 and (comp._last_tree is not None or comp._small_batches > 0)
    if d.shape[0] <= ROWS_MAX and not tree_kept:
        comp._small_batches += d.shape[0] > 1
        rows = [_run_one(comp, r) for r in d.tolist()]
        return Schedule(np.array([r[0] for r in rows], dtype=np.float64).reshape(d.shape),
                        np.array([r[1] for r in rows], dtype=np.float64).reshape(d.shape), ENGINE_NAME)
    if tree_kept or (ENABLE_TREE and d.shape[0] >= TREE_MIN_ROWS):
        start, end = _run_tree(comp, d)
        return Schedule(start, end, ENGINE_NAME)
    start, end = _run_batch(comp.preds, d)
    return Schedule(start, end, ENGINE_NAME)


def _run_one(comp: CompiledPlan, dur: list[float], choice: bool = False):
    """One scenario: :func:`_run_three` when no op has more than three predecessors, else
    :func:`_run_scalar`: ``(start, end)``, lists of ``n`` floats. ``choice``: also each op's
    critical predecessor, ``(start, end, choice)`` with ``choice`` an (n,) int64 array or None
    (:func:`_run_three_choice`; None when some op has more than three predecessors)."""
    if comp.p0 is None:
        got = _run_scalar(comp.preds, dur)
        return (*got, None) if choice else got
    if choice:
        s, e, ch = _run_three_choice(comp.p0, comp.p1, comp.p2, dur)
        return s, e, np.array(ch, dtype=np.int64)
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


def _run_three_choice(p0: list[int], p1: list[int], p2: list[int], dur: list[float]
                      ) -> tuple[list[float], list[float], list[int]]:
    """:func:`_run_three` that also records each op's critical predecessor: the one whose end
    is its start, the lowest id among equal ends, -1 without predecessors (what
    :func:`_critical_choice` finds in the end times: the same strict comparisons in the same
    order)."""
    n = len(dur)
    start = [0.0] * n
    end = [0.0] * (n + 1)
    choice = [-1] * n
    for i, a, b, c, d in zip(range(n), p0, p1, p2, dur):
        s = end[a]
        w = a
        e = end[b]
        if e > s:
            s = e
            w = b
        e = end[c]
        if e > s:
            s = e
            w = c
        start[i] = s
        end[i] = s + d
        choice[i] = w
    del end[n]
    return start, end, choice


def _run_three_chains(p0: list[int], p1: list[int], p2: list[int], dur: list[float]
                      ) -> tuple[list[float], list[float], list[int], list[list[int]], list[int]]:
    """:func:`_run_three_choice` that also cuts the critical tree into the chains of
    :func:`_tree_of_first` as it goes (each op continues the chain of its critical predecessor
    when it is that op's first child): ``(start, end, choice, chains, level)``, the chains and
    their levels as :func:`_tree_of_first` makes them (the same comparisons in the same order
    as :func:`_run_three_choice`, so the same times and choice)."""
    n = len(dur)
    start = [0.0] * n
    end = [0.0] * (n + 1)
    choice = [-1] * n
    taken = bytearray(n + 1)
    chain_of = [0] * n
    chains: list[list[int]] = []
    level: list[int] = []
    for i, a, b, c, d in zip(range(n), p0, p1, p2, dur):
        s = end[a]
        w = a
        e = end[b]
        if e > s:
            s = e
            w = b
        e = end[c]
        if e > s:
            s = e
            w = c
        start[i] = s
        end[i] = s + d
        choice[i] = w
        if w >= 0:
            if not taken[w]:
                taken[w] = 1
                k = chain_of[w]
                chain_of[i] = k
                chains[k].append(i)
                continue
            level.append(level[chain_of[w]] + 1)
        else:
            level.append(0)
        chain_of[i] = len(chains)
        chains.append([i])
    del end[n]
    return start, end, choice, chains, level


def _run_two_choice(p0: list[int], p1: list[int], dur: list[float]) -> tuple[list[float], list[int]]:
    """:func:`_run_three_choice`'s end times and critical choice for a plan whose ops have at
    most two predecessors (``p2`` all -1): the same comparisons in the same order, without the
    third predecessor and without the start times (each op's start is the end of its critical
    predecessor, 0.0 without one: ``end[choice]`` with a 0.0 slot at -1). ``(end, choice)``,
    lists of ``n``."""
    n = len(dur)
    end = [0.0] * (n + 1)
    choice = [-1] * n
    for i, a, b, d in zip(range(n), p0, p1, dur):
        s = end[a]
        e = end[b]
        if e > s:
            s = e
            a = b
        end[i] = s + d
        choice[i] = a
    del end[n]
    return end, choice


def _first_child_cut(choice: list[int]) -> tuple[list[list[int]], list[int]]:
    """The chains and levels :func:`_run_three_chains` cuts from the critical choice ``choice``
    (each op continues the chain of its critical predecessor when it is that op's first child,
    else starts a chain one level deeper; roots at level 0): ``(chains, level)``."""
    n = len(choice)
    taken = bytearray(n + 1)
    chain_of = [0] * n
    chains: list[list[int]] = []
    level: list[int] = []
    for i, w in enumerate(choice):
        if w >= 0:
            if not taken[w]:
                taken[w] = 1
                k = chain_of[w]
                chain_of[i] = k
                chains[k].append(i)
                continue
            level.append(level[chain_of[w]] + 1)
        else:
            level.append(0)
        chain_of[i] = len(chains)
        chains.append([i])
    return chains, level


#: :func:`_run_tree` times the first row of a plan whose ops have at most two predecessors with
#: :func:`_run_two_choice` and cuts its chains after (:func:`_first_child_cut`); False uses
#: :func:`_run_three_chains` (the reference the tests compare it with: the same times, choice
#: and chains)
ENABLE_TWO = True


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


class _Tree:
    """A critical-predecessor tree of a compiled plan, cut into chains for :func:`_run_tree`.

    Attributes:
        parent: (n,) int64, the chosen predecessor of each op, ``n`` for an op without one
            (column ``n`` of the work arrays holds 0.0).
        groups: ``[(ids, heads), ...]`` in dependency order: ``ids`` (m, L) int64 op ids of
            ``m`` chains (each op's parent is the op before it in its row; the first op's
            parent is ``heads[k]``, an op of an earlier group, or ``n``), padded on the right
            with ``n + 1`` (a scratch column of zero duration).
        others: (ops, preds), int64: every pruned predecessor ``preds[k]`` of ``ops[k]`` that
            is not its parent (what :func:`_tree_ends` checks).
    """

    __slots__ = ("parent", "groups", "others")

    def __init__(self, parent: np.ndarray, groups: list, others: tuple[np.ndarray, np.ndarray]):
        self.parent, self.groups, self.others = parent, groups, others


def _tree_of(comp: CompiledPlan, choice: np.ndarray) -> _Tree:
    """Heavy-path decomposition of the tree ``choice`` ((n,) parent per op, -1 for none,
    ``choice[i] < i``): each op continues the chain of its parent when it is the parent's child
    with the largest subtree (ties: the highest id), else it starts a chain one level deeper;
    any root-to-op path crosses O(log n) chains. The chains of one level are grouped by length
    (powers of two, so padding at most doubles a group)."""
    n = choice.size
    par = choice.tolist()
    size = [1] * n
    best = [0] * n
    heavy = [-1] * n          # heavy child of each op
    for i in range(n - 1, -1, -1):   # children after parents: size[i] is final here
        p = par[i]
        if p >= 0:
            si = size[i]
            size[p] += si
            if si > best[p]:
                best[p] = si
                heavy[p] = i
    # chain heads: roots and light children; a chain follows heavy children from its head (ids
    # grow along a chain, so appending the ops in id order builds each chain in order; chains
    # are numbered by their heads' ids)
    chain_of = [0] * n
    chains: list[list[int]] = []
    level: list[int] = []       # per chain
    for i in range(n):
        p = par[i]
        if p >= 0 and heavy[p] == i:
            c = chain_of[p]
            chain_of[i] = c
            chains[c].append(i)
        else:
            chain_of[i] = len(chains)
            level.append(level[chain_of[p]] + 1 if p >= 0 else 0)
            chains.append([i])
    return _tree_from_chains(comp, choice, chains, level, par)


#: :func:`_tree_for` cuts a critical tree into chains along each op's lowest-id child
#: (:func:`_tree_of_first`: one pass, no subtree sizes) when that leaves at most this many
#: levels of chains below the roots, else along its heavy child (:func:`_tree_of`)
FIRST_CHILD_MAX_LEVEL = 8

#: :func:`_tree_for` tries :func:`_tree_of_first` before :func:`_tree_of`; False always cuts
#: along heavy children (the reference the tests compare it with: the same end times, to the bit)
ENABLE_FIRST_CHILD = True


def _tree_of_first(comp: CompiledPlan, choice: np.ndarray, max_level: int = FIRST_CHILD_MAX_LEVEL) -> _Tree | None:
    """The tree ``choice`` ((n,) parent per op, -1 for none, ``choice[i] < i``) cut into chains
    as :func:`_tree_of` cuts it, but each op continuing the chain of its parent when it is the
    parent's child of the lowest id (one pass in id order: the first child met), else starting
    a chain one level deeper; the chains of one level grouped by length (powers of two).
    Any cut into chains gives :func:`_tree_ends` the same sums (each end is its parent's end
    plus its duration, whatever chain holds it); this one needs no subtree sizes, but its
    depth is not bounded by O(log n) as the heavy-path cut's is: None when some chain lies
    more than ``max_level`` levels below a root (the caller then uses :func:`_tree_of`).

    Returns:
        :class:`_Tree`, or None (too deep).
    """
    n = choice.size
    par = choice.tolist()
    taken = bytearray(n + 1)    # taken[p]: p's first child continues its chain
    chain_of = [0] * n
    chains: list[list[int]] = []
    level: list[int] = []       # per chain
    for i, p in enumerate(par):
        if p >= 0:
            if not taken[p]:
                taken[p] = 1
                c = chain_of[p]
                chain_of[i] = c
                chains[c].append(i)
                continue
            lev = level[chain_of[p]] + 1
            if lev > max_level:
                return None
        else:
            lev = 0
        chain_of[i] = len(chains)
        level.append(lev)
        chains.append([i])
    return _tree_from_chains(comp, choice, chains, level, par)


def _tree_from_chains(comp: CompiledPlan, choice: np.ndarray, chains: list[list[int]], level: list[int],
                      par: list[int]) -> _Tree:
    """The :class:`_Tree` of the chains ``chains`` (op ids in order, each op's parent the one
    before it, a chain's first op's parent ``par[first]`` in a chain of a lower ``level``)."""
    n = choice.size
    by_group: dict = {}
    for c, lev in zip(chains, level):
        by_group.setdefault((lev, (len(c) - 1).bit_length()), []).append(c)
    groups = []
    for key in sorted(by_group):
        cs = by_group[key]
        width = max(map(len, cs))
        ids = np.array([c + [n + 1] * (width - len(c)) for c in cs] if width > 1 else cs, dtype=np.int64)
        hp = np.array([par[c[0]] for c in cs], dtype=np.int64)
        hp[hp < 0] = n
        groups.append((ids, hp))
    parent = np.where(choice >= 0, choice, n).astype(np.int64)
    ops = comp.pred_ops
    other = comp.pred_idx != parent[ops]
    return _Tree(parent, groups, (ops[other], comp.pred_idx[other]))


def _critical_choice(comp: CompiledPlan, end: np.ndarray) -> np.ndarray:
    """(n,) the predecessor whose end is the op's start in one scenario's ``end`` times (the
    lowest id among equal ends; -1 for an op without predecessors)."""
    n = comp.n
    if comp.p0 is not None and n:
        cols = comp.columns
        ez = np.append(end, 0.0)          # slot -1: a missing predecessor, end 0.0
        choice = cols[0].copy()
        best = ez[choice]
        for col in cols[1:]:
            v = ez[col]
            later = v > best
            choice[later] = col[later]
            best = np.where(later, v, best)
        return choice
    ptr, idx = comp.pred_ptr, comp.pred_idx
    choice = np.full(n, -1, dtype=np.int64)
    if idx.size == 0:
        return choice
    cnt = np.diff(ptr)
    ops = np.repeat(np.arange(n, dtype=np.int64), cnt)
    # within each op (ascending candidates), the first candidate with the largest end
    order = np.lexsort((idx, -end[idx], ops))
    first = np.ones(order.size, dtype=bool)
    first[1:] = ops[order][1:] != ops[order][:-1]
    pick = order[first]
    choice[ops[pick]] = idx[pick]
    return choice


def _tree_ends(comp: CompiledPlan, tree: _Tree, dt: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Start and end times of the scenarios ``dt`` ((n, m) durations, one column per
    scenario) summed along ``tree``, and which scenarios the tree is not the critical one of.

    Returns:
        (start (n, m), end (n, m), bad (m,) bool).
    """
    n, m = dt.shape
    dz = np.zeros((n + 2, m))
    dz[:n] = dt
    ez = np.zeros((n + 2, m))
    # rows gathered with take (the same elements as fancy indexing, copied faster)
    for ids, heads in tree.groups:
        if ids.shape[1] == 1:
            col = ids[:, 0]
            ez[col] = ez.take(heads, axis=0) + dz.take(col, axis=0)
            continue
        acc = np.empty((ids.shape[0], ids.shape[1] + 1, m))
        acc[:, 0] = ez.take(heads, axis=0)
        acc[:, 1:] = dz.take(ids, axis=0)
        np.cumsum(acc, axis=1, out=acc)   # sequential: acc[k] = acc[k - 1] + d, as the recurrence
        ez[ids] = acc[:, 1:]
    st = ez.take(tree.parent, axis=0)
    ops, preds = tree.others
    late = ez.take(preds, axis=0) > st.take(ops, axis=0)
    bad = late.any(axis=0) if late.any() else np.zeros(m, dtype=bool)
    return st, ez[:n], bad


def _tree_for(comp: CompiledPlan, end: np.ndarray, choice: np.ndarray | None = None, cut=None) -> _Tree:
    """The chain decomposition of the critical tree of one scenario's ``end`` (n,) times,
    cached on ``comp`` (a few trees) and remembered as the one to try first next time.
    ``choice``: :func:`_critical_choice` of ``end`` when the caller has it; ``cut``: the
    first-child chains of that tree and their levels (``(chains, level, choice list)``, from
    :func:`_run_three_chains`) when the caller has them."""
    if choice is None:
        choice = _critical_choice(comp, end)
    key = choice.tobytes()
    tree = comp._trees.get(key)
    if tree is None:
        if len(comp._trees) >= 10:
            comp._trees.clear()
        if not ENABLE_FIRST_CHILD:
            tree = None
        elif cut is not None:
            chains, level, par = cut
            tree = (_tree_from_chains(comp, choice, chains, level, par)
                    if not level or max(level) <= FIRST_CHILD_MAX_LEVEL else None)
        else:
            tree = _tree_of_first(comp, choice)
        if tree is None:
            tree = _tree_of(comp, choice)
        comp._trees[key] = tree
    comp._last_tree = tree
    return tree


def _run_tree(comp: CompiledPlan, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """S scenarios at once, to the bit of :func:`_run_one` on each (``d``: (S, n) float64).

    In one scenario each op's start is the end of one of its predecessors (the critical one,
    :func:`_critical_choice`), so its end times are sums along the paths of that tree, in path
    order. Scenarios that differ only in durations mostly share that tree: they are summed
    along it with numpy (one ``cumsum`` per group of chains, :func:`_tree_of`; each element
    the same IEEE addition ``end[parent] + d[op]`` the recurrence makes), then checked: the
    tree is a scenario's own iff no predecessor of any op ends later than the start the tree
    gave, and then every start and end is the recurrence's (each start is the largest of its
    predecessors' ends, by induction over the ops). The tree is the last one used on this
    plan, or that of the first scenario timed op by op; a scenario the check rejects gets the
    tree of the first rejected one, timed op by op, and then, if still rejected, is timed op
    by op.

    Returns:
        (start, end), each (S, n) float64 (transposed views of (n, S) arrays).
    """
    s_count, n = d.shape
    start = np.empty((n, s_count))
    end = np.empty((n, s_count))
    todo = np.arange(s_count)
    tree = comp._last_tree
    for attempt in range(2):
        if tree is None or attempt:
            k = int(todo[0])
            if comp.p0 is not None and comp.two and ENABLE_TWO:
                e_k, ch_l = _run_two_choice(comp.p0, comp.p1, d[k].tolist())
                ch = np.array(ch_l, dtype=np.int64)
                ez = np.empty(n + 1)
                ez[:n] = e_k
                ez[n] = 0.0
                s_k = ez[np.where(ch >= 0, ch, n)]   # each start: its critical predecessor's end
                e_k = ez[:n]
                cut = (*_first_child_cut(ch_l), ch_l)
            elif comp.p0 is not None:   # the critical tree's chains cut in the same pass
                s_k, e_k, ch_l, chains, level = _run_three_chains(comp.p0, comp.p1, comp.p2, d[k].tolist())
                cut, ch = (chains, level, ch_l), np.array(ch_l, dtype=np.int64)
            else:
                s_k, e_k, ch = _run_one(comp, d[k].tolist(), True)
                cut = None
            start[:, k], end[:, k] = s_k, e_k
            tree = _tree_for(comp, end[:, k], ch, cut)
            todo = todo[1:]
        if todo.size == 0:
            break
        lo = int(todo[0])
        contiguous = todo.size == s_count - lo
        st, en, bad = _tree_ends(comp, tree, d[lo:].T if contiguous else d[todo].T)
        if contiguous and not bad.any():
            start[:, lo:] = st
            end[:, lo:] = en
            todo = todo[:0]
            break
        good = ~bad
        start[:, todo[good]] = st[:, good]
        end[:, todo[good]] = en[:, good]
        todo = todo[bad]
        if todo.size == 0:
            break
    for k in todo.tolist():
        s_k, e_k = _run_one(comp, d[k].tolist())
        start[:, k], end[:, k] = s_k, e_k
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
