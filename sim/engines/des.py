"""Discrete-event engine: the plan replayed on SimPy processes, queues and a link.

Model (the timing contract of :mod:`sim.plan`, played out in simulated time):

* **one SimPy process per queue**: the host thread issuing in program order, each GPU's
  compute and copy stream, the CPU backend. A process takes its ops in plan order (CUDA
  stream FIFO / program order), so an op never starts before its queue predecessor ended;
* **op completion is a SimPy event**: the op's own ``Timeout``; an op waits on the events of
  its dependencies before it starts. An op whose dependency has not started yet waits on a
  placeholder event that the dependency's process fires when it ends (created only then);
* **one H2D link per GPU** (:class:`PlanOrderLink`), granted in plan order: an H2D op holds
  it for its whole duration, and the next H2D op of that link gets it only after every earlier
  one released it, whatever the order in which their queues reach them.

Events per op: one ``Timeout``, plus a placeholder event only when a dependant got ahead of a
dependency that had not started, plus a grant event only when a copy waits for the link.
Dependencies on the op's own queue are implied by FIFO order and not waited on; of several
dependencies on another queue only the latest is waited on (end times never decrease along
a queue), so most ops wait on zero or one event.

What does not depend on the durations (the waits, which ops are waited on, the queues' and
links' op lists) is computed once per plan and cached on it (:func:`_structure`), so that the
per-event work of a run is the queue loop alone.

The result agrees with :mod:`sim.engines.analytic` to rounding (both compute every end as
``start + duration`` with ``start`` the end of the latest predecessor).
"""

from __future__ import annotations

import numpy as np
import simpy

from ..plan import Plan, Schedule
from .analytic import check_durations

ENGINE_NAME = "des"


class PlanOrderLink:
    """A one-at-a-time resource granted in a fixed order (the plan order of its H2D ops).

    ``simpy.Resource`` grants in request time order; a PCIe direction in the plan contract is
    granted in *plan* order instead (the order the host enqueued the copies), so an H2D op that
    reaches the link early still waits for every earlier copy of the link to finish.

    Args:
        env: the simulation environment.
        op_ids: ids of the ops that use the link, in plan order.
    """

    __slots__ = ("env", "_pos", "_released", "_waiting")

    def __init__(self, env: simpy.Environment, op_ids: list[int], positions: dict[int, int] | None = None):
        self.env = env
        #: op id -> position in the link's plan order (``positions``: the same, precomputed)
        self._pos = positions if positions is not None else {op: p for p, op in enumerate(op_ids)}
        self._released = 0  # ops at positions < _released have released the link
        self._waiting: dict[int, simpy.Event] = {}

    def request(self, op_id: int) -> simpy.Event | None:
        """Ask for the link for ``op_id``: ``None`` if granted now, else an event to yield."""
        p = self._pos[op_id]
        if p == self._released:
            return None
        ev = self.env.event()
        self._waiting[p] = ev
        return ev

    def release(self, op_id: int) -> None:
        """``op_id`` finished its transfer; grant the link to the next op if it is waiting."""
        self._released = self._pos[op_id] + 1
        ev = self._waiting.pop(self._released, None)
        if ev is not None:
            ev.succeed()


_STRUCT_KEY = "_sim_engines_des_struct"


class _Structure:
    """What a run needs of a plan apart from its durations, computed once per plan (cached on
    it like :func:`sim.engines.analytic.compile_plan`, and rebuilt when ops were added).

    Attributes:
        waits: per op, the deps it waits on: not on its own queue, only the latest per queue.
        watched: per op, whether some op of another queue waits on it (only those fire a
            placeholder when they end).
        queue_ops: per queue, its op ids in plan order.
        link_ops: per H2D link, its op ids in plan order; link_pos: op id -> position there.
    """

    __slots__ = ("n", "waits", "watched", "queue_ops", "link_ops", "link_pos")

    def __init__(self, plan: Plan):
        a = plan.arrays
        n = self.n = a.n
        queue = a.queue
        ptr = a.dep_ptr
        waits: list[tuple[int, ...]] = [()] * n
        watched = [False] * n
        if a.dep_idx.size:
            op = np.repeat(np.arange(n, dtype=np.int64), np.diff(ptr))
            cand = a.dep_idx
            q = queue[cand]
            other = q != queue[op]
            op, cand, q = op[other], cand[other], q[other]
            # the latest dep per (op, queue): sort by (op, queue, dep), keep the last of each run
            order = np.lexsort((cand, q, op))
            op, cand, q = op[order], cand[order], q[order]
            last = np.ones(op.size, dtype=bool)
            if op.size > 1:
                last[:-1] = (op[1:] != op[:-1]) | (q[1:] != q[:-1])
            op, cand = op[last], cand[last]
            for i, j in zip(op.tolist(), cand.tolist()):
                w = waits[i]
                waits[i] = (*w, j) if w else (j,)
                watched[j] = True
        self.waits = waits
        self.watched = watched
        self.queue_ops: dict[int, list[int]] = {}
        for i, qi in enumerate(queue.tolist()):
            self.queue_ops.setdefault(qi, []).append(i)
        self.link_ops: dict[int, list[int]] = {}
        for i, lk in enumerate(a.link.tolist()):
            if lk >= 0:
                self.link_ops.setdefault(lk, []).append(i)
        self.link_pos = {lk: {op: p for p, op in enumerate(ops)} for lk, ops in self.link_ops.items()}


def _structure(plan: Plan) -> _Structure:
    """The plan's cached :class:`_Structure`."""
    arrays = plan.arrays
    cached = plan.__dict__.get(_STRUCT_KEY)
    if cached is not None and cached[0] is arrays:
        return cached[1]
    st = _Structure(plan)
    plan.__dict__[_STRUCT_KEY] = (arrays, st)
    return st


class _Sim:
    """State shared by the queue processes of one run."""

    def __init__(self, plan: Plan, dur: list[float]):
        st = _structure(plan)
        n = st.n
        self.env = simpy.Environment()
        self.dur = dur
        self.start = [float("nan")] * n
        self.end = [float("nan")] * n
        self.done: list[simpy.Event | None] = [None] * n
        self.placeholders: dict[int, simpy.Event] = {}
        self.waits = st.waits
        self.watched = st.watched
        self.link_of: list[PlanOrderLink | None] = [None] * n
        for lk, ops in st.link_ops.items():
            link = PlanOrderLink(self.env, ops, st.link_pos[lk])
            for i in ops:
                self.link_of[i] = link
        self.queue_ops = st.queue_ops

    def queue_process(self, ops: list[int]):
        """One queue (stream, host thread or CPU backend): its ops one at a time, in order."""
        env = self.env
        timeout = env.timeout
        done = self.done
        placeholders = self.placeholders
        waits = self.waits
        watched = self.watched
        link_of = self.link_of
        dur = self.dur
        start = self.start
        end = self.end
        for i in ops:
            w = waits[i]
            if w:
                for j in w:
                    ev = done[j]
                    if ev is None:  # dependency not started yet: wait for it to end
                        ev = placeholders.get(j)
                        if ev is None:
                            ev = placeholders[j] = env.event()
                        yield ev
                    elif end[j] != end[j]:  # dependency running (its end is still NaN)
                        yield ev
            link = link_of[i]
            if link is not None:
                grant = link.request(i)
                if grant is not None:
                    yield grant
            now = env.now
            start[i] = now
            dt = dur[i]
            t = done[i] = timeout(dt)
            yield t
            # the timeout was scheduled at now + dt (simpy.Environment.schedule): this is
            # env.now, to the bit
            end[i] = now + dt
            if link is not None:
                link.release(i)
            if watched[i]:
                ev = placeholders.pop(i, None)
                if ev is not None:
                    ev.succeed()


def run(plan: Plan, durations) -> Schedule:
    """Simulate the plan with SimPy and return when every op started and ended.

    Args:
        plan: the plan.
        durations: (n,) seconds, finite and >= 0. A (S, n) batch is run scenario by scenario
            (use the analytic engine for large batches).

    Returns:
        :class:`~sim.plan.Schedule` with ``engine="des"`` and arrays of the shape of
        ``durations``.

    Raises:
        ValueError: bad durations (see :func:`sim.engines.analytic.check_durations`).
        RuntimeError: the simulation stalled with ops not run (a plan that breaks the
            contract, e.g. deps on later ops built by hand without ``Plan.add``).
    """
    d = check_durations(durations, len(plan.ops))
    if d.ndim == 2:
        rows = [run(plan, row) for row in d]
        if not rows:
            empty = np.zeros((0, d.shape[1]))
            return Schedule(empty, empty.copy(), ENGINE_NAME)
        return Schedule(np.stack([r.start_s for r in rows]), np.stack([r.end_s for r in rows]), ENGINE_NAME)
    sim = _Sim(plan, d.tolist())
    for ops in sim.queue_ops.values():
        sim.env.process(sim.queue_process(ops))
    sim.env.run()
    end = np.asarray(sim.end, dtype=np.float64)
    if np.isnan(end).any():
        stuck = int(np.flatnonzero(np.isnan(end))[0])
        raise RuntimeError(f"DES stalled: op {stuck} ({plan.ops[stuck].name}) never ran; the plan breaks the "
                           "ordering contract of sim.plan")
    return Schedule(np.asarray(sim.start, dtype=np.float64), end, ENGINE_NAME)


__all__ = ["run", "PlanOrderLink", "ENGINE_NAME"]
