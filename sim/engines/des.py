"""Discrete-event engine: the plan replayed on SimPy processes, queues and a link.

Model (the timing contract of :mod:`sim.plan`, played out in simulated time):

* **one SimPy process per queue**: the host thread issuing in program order, each GPU's
  compute and copy stream, the CPU backend. A process takes its ops in plan order (CUDA
  stream FIFO / program order), so an op never starts before its queue predecessor ended;
* **ops wait for their dependencies**: an op whose dependency on another queue has not ended
  waits on that dependency's completion event (a SimPy ``Timeout``) before it starts. An op
  whose dependency has not been scheduled yet waits on a placeholder event whose waiters move
  onto the dependency's completion event when it is scheduled;
* **one H2D link per GPU** (:class:`PlanOrderLink`), granted in plan order: an H2D op holds
  it for its whole duration, and the next H2D op of that link gets it only after every earlier
  one released it, whatever the order in which their queues reach them.

**Runs.** A process plays consecutive ops of its queue that need not wait as one *run* under
one ``Timeout``. The run's first op waits for what it needs (its dependencies that have not
ended, the link); the run then takes the next ops as long as each has no link and every
dependency it waits on has already ended at the current simulated time. An op that another
queue waits on (*watched*) needs its own completion event, so the run ends with it, its
timeout being that op's completion event; unless the watched op ends at the current time
(zero durations since the run's start): it has then already ended, is marked so, wakes the
placeholder's waiters if a dependant got ahead of it, and the run goes on. An H2D op is a run
of its own (it holds the link for its duration). Within a run every start is the end of the
queue predecessor and every end is ``start + duration``, the analytic engine's arithmetic;
the run's delay is chosen so that SimPy's clock lands on the run's last end to the bit (where
no single delay does, which needs a run long compared with the current time, the run is
played as one timeout per op). A run that does not end with a watched op still to end, and
whose next op waits for a dependency already scheduled to end no earlier than the run ends,
schedules no timeout: the queue waits for that dependency's completion event at once (it
resumes at the dependency's end, the next op's start).

Events: one ``Timeout`` per run, at most one per op (none for a run that ends at the
current time or is followed by a wait as above), plus a placeholder event (scheduled only
when its dependency ends at the time it is reached) only when a dependant got ahead of a
dependency not yet scheduled, plus a grant event only when a copy waits for the link.
``benchmarks/bench_speed.py`` counts the events scheduled on a pp512 plan of the default
scenario (about 0.4 per op; up to one per op where every op is watched or a copy, as in
lock-step plans with synchronous copies).
Dependencies on the op's own queue are implied by FIFO order and not waited on; of several
dependencies on another queue only the latest is waited on (end times never decrease along
a queue), so most ops wait on zero or one event.

What does not depend on the durations (the waits, which ops are waited on, the queues' and
links' op lists) is computed once per plan and cached on it (:func:`_structure`), so that the
per-event work of a run is the queue loop alone.

The result agrees with :mod:`sim.engines.analytic`: both compute every end as
``start + duration`` with ``start`` the end of the latest predecessor (the same float
operations, so the same times to the bit).
"""

from __future__ import annotations

import numpy as np
import simpy

from sim.plan import Plan, Schedule
from sim.engines.analytic import check_durations

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
        watched: per op, whether some op of another queue waits on it (only those end a run
            that ends after the current time, and look for a placeholder's waiters when they
            are scheduled).
        queue_ops: per queue, its op ids in plan order (queue_idx: the same as int64 arrays).
        link_ops: per H2D link, its op ids in plan order; link_pos: op id -> position there.
        programs: per queue, ``(op id, waits, link id or -1, watched)`` of its ops in order (what
            a queue process reads per op).
    """

    __slots__ = ("n", "waits", "watched", "queue_ops", "queue_idx", "link_ops", "link_pos", "programs")

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
        self.queue_idx = {q: np.array(ops, dtype=np.int64) for q, ops in self.queue_ops.items()}
        self.link_ops: dict[int, list[int]] = {}
        for i, lk in enumerate(a.link.tolist()):
            if lk >= 0:
                self.link_ops.setdefault(lk, []).append(i)
        self.link_pos = {lk: {op: p for p, op in enumerate(ops)} for lk, ops in self.link_ops.items()}
        link = a.link.tolist()
        self.programs = {q: [(i, waits[i], link[i], watched[i]) for i in ops] for q, ops in self.queue_ops.items()}


def _structure(plan: Plan) -> _Structure:
    """The plan's :class:`_Structure`, kept on it (:meth:`sim.plan.Plan.derived`)."""
    return plan.derived(_STRUCT_KEY, _Structure)


class _Sim:
    """State shared by the queue processes of one run: per op its start and end (seconds,
    NaN until set), its completion event ``done`` and its due end ``due`` (watched ops that
    end a run), the placeholders by op id, the links."""

    def __init__(self, plan: Plan):
        st = self.structure = _structure(plan)
        n = st.n
        self.env = simpy.Environment()
        self.start = [float("nan")] * n
        self.end = [float("nan")] * n
        self.done: list[simpy.Event | None] = [None] * n
        self.due = [0.0] * n
        self.placeholders: dict[int, simpy.Event] = {}
        self.links = {lk: PlanOrderLink(self.env, ops, st.link_pos[lk]) for lk, ops in st.link_ops.items()}

    def queue_process(self, program: list[tuple], durations: list[float]):
        """One queue (stream, host thread or CPU backend): its ops in plan order, in runs of
        consecutive ops under one ``Timeout`` (the module docstring's *Runs*; ``program``:
        :attr:`_Structure.programs` of the queue; ``durations``: its ops', seconds).

        An op ended when its end is set (not NaN); only watched ops' ends are read while the
        simulation runs, and a watched op's end is set only once it has ended (the ends of the
        other ops of a run are set when the run is scheduled). The first op of a run waits for
        each dependency that has not ended, on the dependency's timeout in ``done`` or, if it
        is not scheduled yet, on a placeholder event; when the dependency is scheduled, the
        placeholder's waiters are moved onto its timeout (``Event.callbacks``), so they resume
        when it ends without a second event. ``due`` holds the end a scheduled watched op will
        end at. The clock is read from SimPy only after a wait (it is then the end of what was
        waited for, to the bit); after the run's own timeout it is the run's last end."""
        env = self.env
        timeout = env.timeout
        done = self.done
        due = self.due
        placeholders = self.placeholders
        links = self.links
        start = self.start
        end = self.end
        now = env.now
        m = len(program)
        p = 0

        def arm(i: int, t: simpy.Timeout, e: float) -> None:
            """Watched op ``i`` ends at ``e`` with timeout ``t``: its completion event, its due
            end, and the waiters of its placeholder moved onto ``t``."""
            done[i] = t
            due[i] = e
            if placeholders:
                ph = placeholders.pop(i, None)
                if ph is not None:  # its waiters resume when this op ends
                    t.callbacks.extend(ph.callbacks)
                    ph.callbacks = []
        while p < m:
            i, w, lk, watched = program[p]
            for j in w:
                if end[j] != end[j]:  # not ended
                    ev = done[j]
                    if ev is None:  # dependency not scheduled yet: wait for it to end
                        ev = placeholders.get(j)
                        if ev is None:
                            ev = placeholders[j] = env.event()
                    yield ev
                    now = env.now
            if lk >= 0:  # an H2D op holds its link: a run of its own
                grant = links[lk].request(i)
                if grant is not None:
                    yield grant
                    now = env.now
                start[i] = now
                dt = durations[p]
                p += 1
                t = timeout(dt)
                if watched:
                    arm(i, t, now + dt)
                yield t
                # the timeout was scheduled at now + dt (simpy.Environment.schedule): this
                # is env.now, to the bit
                now = end[i] = now + dt
                links[lk].release(i)
                continue
            # the run: op i, then the ops after it that need not wait
            first = p
            start[i] = now
            e = now + durations[p]
            p += 1
            while True:
                if watched:
                    if e != now:
                        break  # ends later: its completion event ends the run
                    end[i] = e  # ended at the current time
                    if placeholders:
                        ph = placeholders.pop(i, None)
                        if ph is not None:
                            ph.succeed()
                else:
                    end[i] = e
                if p == m:
                    break
                k, w, lk, wk = program[p]
                if lk >= 0:
                    break
                for j in w:
                    if end[j] != end[j]:
                        break  # a dependency not ended at the current time
                else:
                    i = k
                    watched = wk
                    start[k] = e
                    e = e + durations[p]
                    p += 1
                    continue
                if done[j] is not None and due[j] >= e:
                    # op k waits for j, due no earlier than the run's end: no timeout for the
                    # run, the queue waits for j at once (the wait below reads the clock)
                    now = e
                break
            if e == now:
                continue  # the run ended at the current time, or the queue waits for a dependency
            if p - first == 1:
                delay = durations[first]
            else:
                delay = e - now
                if now + delay != e:  # no single delay lands on e: one timeout per op
                    for dt in durations[first:p - 1]:
                        yield timeout(dt)
                    delay = durations[p - 1]
            t = timeout(delay)
            if watched:
                arm(i, t, e)
                yield t
                now = end[i] = e
            else:
                yield t
                now = e


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
    d = check_durations(durations, len(plan))
    if d.ndim == 2:
        rows = [run(plan, row) for row in d]
        if not rows:
            empty = np.zeros((0, d.shape[1]))
            return Schedule(empty, empty.copy(), ENGINE_NAME)
        return Schedule(np.stack([r.start_s for r in rows]), np.stack([r.end_s for r in rows]), ENGINE_NAME)
    sim = _Sim(plan)
    st = sim.structure
    take = d.take
    for q, program in st.programs.items():
        sim.env.process(sim.queue_process(program, take(st.queue_idx[q]).tolist()))
    sim.env.run()
    n = st.n
    end = np.fromiter(sim.end, dtype=np.float64, count=n)
    if np.isnan(end).any():
        stuck = int(np.flatnonzero(np.isnan(end))[0])
        raise RuntimeError(f"DES stalled: op {stuck} ({plan.names[stuck]}) never ran; the plan breaks the "
                           "ordering contract of sim.plan")
    return Schedule(np.fromiter(sim.start, dtype=np.float64, count=n), end, ENGINE_NAME)


__all__ = ["run", "PlanOrderLink", "ENGINE_NAME"]
