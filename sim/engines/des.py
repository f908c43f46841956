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

    def __init__(self, env: simpy.Environment, op_ids: list[int]):
        self.env = env
        self._pos = {op: p for p, op in enumerate(op_ids)}
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


class _Sim:
    """State shared by the queue processes of one run."""

    def __init__(self, plan: Plan, dur: list[float]):
        a = plan.arrays
        n = a.n
        self.env = simpy.Environment()
        self.dur = dur
        self.start = [float("nan")] * n
        self.end = [float("nan")] * n
        self.done: list[simpy.Event | None] = [None] * n
        self.placeholders: dict[int, simpy.Event] = {}
        queue = a.queue.tolist()
        ptr = a.dep_ptr.tolist()
        idx = a.dep_idx.tolist()
        # deps to wait on: not on the op's own queue, and only the latest per queue
        waits: list[tuple[int, ...]] = []
        for i in range(n):
            q = queue[i]
            best: dict[int, int] = {}
            for j in idx[ptr[i]:ptr[i + 1]]:
                qj = queue[j]
                if qj != q and best.get(qj, -1) < j:
                    best[qj] = j
            waits.append(tuple(best.values()))
        self.waits = waits
        self.link_of: list[PlanOrderLink | None] = [None] * n
        link_ops: dict[int, list[int]] = {}
        for i, lk in enumerate(a.link.tolist()):
            if lk >= 0:
                link_ops.setdefault(lk, []).append(i)
        for ops in link_ops.values():
            link = PlanOrderLink(self.env, ops)
            for i in ops:
                self.link_of[i] = link
        self.queue_ops: dict[int, list[int]] = {}
        for i, q in enumerate(queue):
            self.queue_ops.setdefault(q, []).append(i)

    def queue_process(self, ops: list[int]):
        """One queue (stream, host thread or CPU backend): its ops one at a time, in order."""
        env = self.env
        done = self.done
        placeholders = self.placeholders
        waits = self.waits
        link_of = self.link_of
        dur = self.dur
        start = self.start
        end = self.end
        for i in ops:
            for j in waits[i]:
                ev = done[j]
                if ev is None:  # dependency not started yet: wait for it to end
                    ev = placeholders.get(j)
                    if ev is None:
                        ev = placeholders[j] = env.event()
                    yield ev
                elif not ev.processed:  # dependency running
                    yield ev
            link = link_of[i]
            if link is not None:
                grant = link.request(i)
                if grant is not None:
                    yield grant
            start[i] = env.now
            t = done[i] = env.timeout(dur[i])
            yield t
            end[i] = env.now
            if link is not None:
                link.release(i)
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
