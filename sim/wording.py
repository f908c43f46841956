"""Wording of the messages: counts in the singular for one (``1 run``, ``2 runs``)."""

from __future__ import annotations


def plural(n, noun: str, nouns: str | None = None) -> str:
    """``n`` and ``noun``, the noun in the singular for one: ``plural(1, "run")`` is ``'1 run'``,
    ``plural(0, "run")`` and ``plural(3, "run")`` ``'0 runs'`` and ``'3 runs'``; ``nouns`` is the
    plural when it is not ``noun + "s"``. ``n`` is shown as ``f"{n}"`` shows it."""
    return f"{n} {noun if n == 1 else (nouns or noun + 's')}"
