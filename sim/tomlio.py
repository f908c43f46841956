"""Typed reading of TOML tables with errors that name the file and the dotted field.

One place for validation (docs/DESIGN.md, conventions): every loader reads its table through a
:class:`Fields` view, which raises :class:`~sim.errors.ScenarioError` naming ``file`` and
``field`` on a missing, mistyped, out-of-range or unknown key.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from sim.errors import ScenarioError

_MISSING = object()


def load_toml(path: str | Path) -> dict[str, Any]:
    """Parse a TOML file: a regular file of bounded size (:func:`sim.bounds.check_text_input`),
    UTF-8 with or without a byte-order mark, nested at most :data:`sim.bounds.TOML_DEPTH_MAX` deep.

    Raises:
        ScenarioError: the file is missing, unreadable, not a regular file, too large, too
            deeply nested or not valid TOML.
    """
    from sim.bounds import check_depth, check_text_input

    p = Path(path)
    check_text_input(p)
    try:
        with p.open("rb") as fh:
            raw = fh.read()
    except IsADirectoryError:
        raise ScenarioError("is a directory, expected a TOML file", file=p) from None
    except OSError as exc:
        raise ScenarioError(f"cannot read: {exc.strerror}", file=p) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ScenarioError("not valid TOML: not UTF-8 text", file=p) from None
    text = text.removeprefix("\ufeff")  # a UTF-8 byte-order mark (Windows editors write one)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"not valid TOML: {exc}", file=p) from None
    except RecursionError:
        raise ScenarioError("not valid TOML: nested too deeply", file=p) from None
    check_depth(data, file=p)
    return data


#: unit prefixes of the scales the loaders read numbers with (``_us``: 1e-6, ``_gb``: 1e9, ``l2_mb``: 2**20)
_PREFIXES = {1e-9: "n", 1e-6: "µ", 1e-3: "m", 1.0: "", 1e3: "k", 1e6: "M", 1e9: "G", 1e12: "T", 2.0**20: "Mi",
             2.0**30: "Gi"}
#: the SI units of :data:`sim.bounds.KINDS` as a prefix takes them
_UNIT_SYMBOLS = {"bytes": "B", "bytes/s": "B/s", "FLOP/s": "FLOP/s", "s": "s", "": ""}


def _unit_as_written(scale: float, si_unit: str) -> str | None:
    """The unit a number read with ``scale`` into ``si_unit`` was written in (`` µs`` for 1e-6 s,
    `` GB/s`` for 1e9 bytes/s, ``""`` for a dimensionless one); None when the scale has no prefix."""
    prefix = _PREFIXES.get(float(scale))
    symbol = _UNIT_SYMBOLS.get(si_unit)
    if prefix is None or symbol is None or (prefix and not symbol):
        return None
    return f" {prefix}{symbol}" if prefix + symbol else ""


class Fields:
    """A read-only view of one TOML table that remembers where it came from.

    Args:
        table: the parsed table.
        file: the file it was read from (for error messages).
        prefix: dotted path of the table inside the file (``"placement"``).
    """

    def __init__(self, table: Mapping[str, Any] | None, file: str | Path | None, prefix: str = ""):
        if table is not None and not isinstance(table, Mapping):
            raise ScenarioError("expected a table", file=file, field=prefix or None)
        self.table = dict(table or {})
        self.file = file
        self.prefix = prefix
        self._used: set[str] = set()
        # keys a loader asked for with has() (optional tables such as [moe], [ggml]): known here
        # even when absent, so an unknown key's message lists them too
        self._asked: set[str] = set()

    def name(self, key: str) -> str:
        """The dotted name of ``key`` in the file (``placement.ngl``)."""
        return f"{self.prefix}.{key}" if self.prefix else key

    def error(self, key: str, message: str) -> ScenarioError:
        """The ScenarioError for ``key``, naming this file and the dotted field."""
        return ScenarioError(message, file=self.file, field=self.name(key))

    def has(self, key: str) -> bool:
        """True if the table has ``key`` (``key`` counts as a known field of the table)."""
        self._asked.add(key)
        return key in self.table

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        """The raw value of ``key`` (marked as read), else ``default``; missing without a default: an error."""
        self._used.add(key)
        if key not in self.table:
            if default is _MISSING:
                raise self.error(key, "missing required field")
            return default
        return self.table[key]

    def sub(self, key: str, required: bool = False) -> Fields:
        """The sub-table ``key`` as a view (empty when absent and not ``required``)."""
        val = self.raw(key, _MISSING if required else None)
        if val is not None and not isinstance(val, Mapping):
            raise self.error(key, f"expected a table, got {type(val).__name__}")
        return Fields(val, self.file, self.name(key))

    def int(self, key: str, default: Any = _MISSING, *, min: int | None = None, max: int | None = None) -> int:
        """An integer (not a bool) within ``min``/``max``; ``max`` defaults to int64's largest."""
        val = self.raw(key, default)
        if val is None:
            return val
        if isinstance(val, bool) or not isinstance(val, int):
            raise self.error(key, f"expected an integer, got {val!r}")
        if min is not None and val < min:
            raise self.error(key, f"must be >= {min}, got {val}")
        if max is None:
            from sim.bounds import INT_MAX

            max = INT_MAX  # every integer field fits int64 (numpy's and llama.cpp's widest)
        if val > max:
            raise self.error(key, f"must be <= {max}, got {val}")
        return val

    def float(self, key: str, default: Any = _MISSING, *, min: float | None = None,
              max: float | None = None, positive: bool = False, finite: bool = True) -> float:
        """A number (an integer is accepted), not NaN, finite unless ``finite`` is false,
        ``> 0`` with ``positive``, within ``min``/``max`` when given."""
        val = self.raw(key, default)
        if val is None:
            return val
        if isinstance(val, bool) or not isinstance(val, (int, float)):
            raise self.error(key, f"expected a number, got {val!r}")
        val = float(val)
        if val != val:
            raise self.error(key, "must not be NaN")
        if finite and not math.isfinite(val):
            raise self.error(key, f"must be a finite number, got {val}")
        if positive and val <= 0:
            raise self.error(key, f"must be > 0, got {val}")
        if min is not None and val < min:
            raise self.error(key, f"must be >= {min}, got {val}")
        if max is not None and val > max:
            raise self.error(key, f"must be <= {max}, got {val}")
        return val

    def str(self, key: str, default: Any = _MISSING, *, choices: Iterable[str] | None = None) -> str:
        """A string, one of ``choices`` when given."""
        val = self.raw(key, default)
        if val is None:
            return val
        if not isinstance(val, str):
            raise self.error(key, f"expected a string, got {val!r}")
        if choices is not None:
            choices = tuple(choices)
            if val not in choices:
                raise self.error(key, f"must be one of {', '.join(choices)}; got '{val}'")
        return val

    def bool(self, key: str, default: Any = _MISSING) -> bool:
        """``true`` or ``false``."""
        val = self.raw(key, default)
        if not isinstance(val, bool):
            raise self.error(key, f"expected true or false, got {val!r}")
        return val

    def int_list(self, key: str, default: Any = _MISSING, *, min: int | None = None,
                 max: int | None = None) -> tuple[int, ...]:
        """A non-empty list of integers (a bare integer is a list of one), each within
        ``min``/``max``, at most :data:`sim.bounds.LIST_VALUES_MAX` long."""
        from sim.bounds import LIST_VALUES_MAX

        val = self.raw(key, default)
        if isinstance(val, int) and not isinstance(val, bool):
            val = [val]
        if not isinstance(val, (list, tuple)) or not val:
            raise self.error(key, f"expected a non-empty list of integers, got {val!r}")
        if len(val) > LIST_VALUES_MAX:
            raise self.error(key, f"{len(val)} values, more than the limit of {LIST_VALUES_MAX}")
        out = []
        for i, v in enumerate(val):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ScenarioError(f"expected an integer, got {v!r}", file=self.file, field=f"{self.name(key)}[{i}]")
            if min is not None and v < min:
                raise ScenarioError(f"must be >= {min}, got {v}", file=self.file, field=f"{self.name(key)}[{i}]")
            if max is not None and v > max:
                raise ScenarioError(f"must be <= {max}, got {v}", file=self.file, field=f"{self.name(key)}[{i}]")
            out.append(v)
        return tuple(out)

    def path(self, key: str, default: Any = _MISSING) -> Path | None:
        """A path relative to the file's folder (absolute paths are kept)."""
        val = self.str(key, default)
        if val is None:
            return None
        p = Path(val)
        if not p.is_absolute() and self.file is not None:
            p = Path(self.file).parent / p
        return p

    def sourced(self, key: str, default: Any = _MISSING, *, positive: bool = True, scale: float = 1.0,
                kind: str | None = None) -> tuple[float, str]:
        """A datasheet or measured number written as ``{ value = ..., source = "..." }``.

        Every hardware number carries its source (docs/DESIGN.md, conventions); a bare number is an
        error that says so. With ``kind`` (a :data:`sim.bounds.KINDS` name) the value times
        ``scale`` (its SI value) must lie within that kind's physical bounds (0 is also accepted
        when not ``positive``); the unscaled value is returned.
        """
        val = self.raw(key, default)
        if val is default and default is not _MISSING:
            return default
        if not isinstance(val, Mapping):
            raise self.error(key, "expected { value = <number>, source = \"<where it comes from>\" }")
        sub = Fields(val, self.file, self.name(key))
        num = sub.float("value", positive=positive)
        if not math.isfinite(num):
            raise sub.error("value", f"must be a finite number, got {num}")
        if kind is not None:
            from sim.bounds import KINDS, check_kind

            si = num * scale
            lo, hi, si_unit = KINDS[kind]
            u = _unit_as_written(scale, si_unit)
            # the value as the user wrote it, in the unit of the key (split_us = -84 µs), not in SI
            shown = f"{key} = {num:g}{u}" if u is not None else f"{key} = {num:g} ({si:g} {si_unit})"
            if num < 0 and not positive:
                raise self.error(key, f"{shown}: must be >= 0 (a cost; 0 when there is none)")
            if num != 0 and si == 0:  # 1e-320 us underflows to 0 s: a non-zero, non-physical value
                raise self.error(key, f"{shown} underflows to 0 after unit scaling: not physical (give 0, or a "
                                      "value within the physical range)")
            try:
                check_kind(si, kind, zero_ok=not positive, file=self.file, field=self.name(key))
            except ScenarioError:
                zero = "" if positive else "0 or "
                if u is None:
                    raise
                raise self.error(key, f"{shown} is not physical: must be {zero}{lo / scale:g}{u} to "
                                      f"{hi / scale:g}{u}") from None
        src = sub.str("source")
        if not src.strip():
            raise sub.error("source", "must say where the number comes from")
        sub.check_unknown()
        return num, src

    def check_unknown(self) -> None:
        """Raise on keys nobody read (typos such as ``n_cpu_mo``)."""
        unknown = sorted(set(self.table) - self._used)
        if unknown:
            known = sorted(self._used | self._asked)
            raise self.error(unknown[0], f"unknown field (known here: {', '.join(known) or 'none'})")
