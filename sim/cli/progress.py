"""Progress bars of the long-running commands (``run``, ``trace``, ``breakdown``, ``crossover``,
``reproduce``, ``validate``): tqdm on stderr, shown only when stderr is a terminal and ``-q`` is not
given. ``calibrate`` draws its own (``calibrate.run``; ``-q`` hides it) and ``check``, which prints a
line per plan as it goes, none: it accepts ``-q`` and does nothing with it."""

from __future__ import annotations

import contextlib
import sys


def progress_enabled(quiet: bool = False, stream=None) -> bool:
    """Whether to draw a progress bar: not ``quiet`` and ``stream`` (default ``sys.stderr``)
    is a terminal (a pipe, a file or a CI log gets no bar)."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return not quiet and bool(isatty and isatty())


def bar(iterable=None, *, desc: str, unit: str, total: int | None = None, quiet: bool = False):
    """A tqdm bar on stderr over ``iterable`` (or a manual one with ``total``), disabled unless
    :func:`progress_enabled`."""
    from tqdm import tqdm

    return tqdm(iterable, desc=desc, unit=unit, total=total, file=sys.stderr,
                disable=not progress_enabled(quiet))


@contextlib.contextmanager
def closed_after(iterable):
    """``with closed_after(bar) as it:`` yields ``iterable`` and closes it afterwards when it can
    be closed (a tqdm bar), also when the loop is left by an exception: the bar's last line is
    drawn before what follows (an error, an interruption's message), not when it is collected."""
    try:
        yield iterable
    finally:
        close = getattr(iterable, "close", None)
        if close is not None:
            close()
