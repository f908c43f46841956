"""Engines: turn a :class:`~sim.plan.Plan` plus op durations into a :class:`~sim.plan.Schedule`.

* ``"analytic"`` (:mod:`sim.engines.analytic`): the max-plus recurrence, vectorised over a
  batch of scenarios; the default.
* ``"des"`` (:mod:`sim.engines.des`): a SimPy discrete-event model (queue processes, a link
  per GPU, completion events). Agrees with the analytic engine to rounding; it exists as an
  independent check and as the base for behaviour a recurrence cannot express.

The real executor (``calibrate/``) produces the same :class:`~sim.plan.Schedule` and trace.
"""

from __future__ import annotations

from sim.plan import Plan, Schedule
from sim.engines import analytic

#: accepted values of ``engine``
ENGINES: tuple[str, ...] = ("analytic", "des")


def _des_run(plan: Plan, durations) -> Schedule:
    from sim.engines import des  # SimPy is imported only when the DES is used

    return des.run(plan, durations)


_RUN = {"analytic": analytic.run, "des": _des_run}


def run(plan: Plan, durations, engine: str = "analytic") -> Schedule:
    """Schedule ``plan`` with op ``durations`` on the named engine.

    Args:
        plan: the plan.
        durations: (n,) or (S, n) seconds, finite and >= 0.
        engine: one of :data:`ENGINES`.

    Returns:
        :class:`~sim.plan.Schedule` with arrays shaped like ``durations``.

    Raises:
        ValueError: unknown engine (the message lists :data:`ENGINES`), or bad durations.
    """
    fn = _RUN.get(engine)
    if fn is None:
        raise ValueError(f"engine: unknown engine {engine!r}; accepted values: {', '.join(ENGINES)}")
    return fn(plan, durations)


__all__ = ["ENGINES", "run", "analytic"]
