"""Writing a measured hardware profile: the TOML that :func:`sim.model.specs.load_hardware` reads,
its CSV tables beside it, and the raw logs.

Every file is first written to a temporary file in its target folder and then moved into
place with :func:`os.replace`; the TOML is moved last, so a reader never sees a profile whose
tables are missing, and an interrupted run leaves no partial file.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

# ---------------------------------------------------------------------------------------
# a small TOML writer (tables of scalars, lists of scalars and inline tables)
# ---------------------------------------------------------------------------------------


def _toml_scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        r = repr(float(f"{v:.6g}"))
        return r
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=True)
    if hasattr(v, "item") and not isinstance(v, (list, tuple, dict)):  # numpy scalar
        return _toml_scalar(v.item())
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_scalar(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_scalar(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _toml_key(k: str) -> str:
    if k and all(c.isalnum() or c in "_-" for c in k):
        return k
    return json.dumps(k, ensure_ascii=True)


def dumps_toml(doc: Mapping[str, Mapping[str, Any]], header: str = "") -> str:
    """Serialise ``{table: {key: value}}`` to TOML text.

    Values may be bool, int, float, str, lists of those, or inline tables of those
    (``{ value = 1.0, source = "..." }``). Floats are written with 6 significant digits.

    Raises:
        TypeError: a value of another type.
    """
    lines = [f"# {h}" if h else "#" for h in header.splitlines()] if header else []
    for table, body in doc.items():
        if lines:
            lines.append("")
        lines.append(f"[{_toml_key(table)}]")
        for k, v in body.items():
            lines.append(f"{_toml_key(k)} = {_toml_scalar(v)}")
    return "\n".join(lines) + "\n"


def sourced(value: float, source: str) -> dict[str, Any]:
    """``{ value = ..., source = ... }`` as the hardware loader expects."""
    return {"value": float(value), "source": source}


# ---------------------------------------------------------------------------------------
# atomic file writing
# ---------------------------------------------------------------------------------------


def _tmp_for(path: Path, made: list[Path] | None = None) -> Path:
    """A new empty temporary file beside ``path``, creating missing folders (appended to
    ``made``, outermost first, so a failed write can remove them again)."""
    missing = [d for d in (path.parent, *path.parent.parents) if not d.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    if made is not None:
        made.extend(reversed(missing))
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    return Path(tmp)


def write_files_atomically(files: Mapping[Path, str | bytes | pd.DataFrame]) -> list[Path]:
    """Write several files so that each is either absent/old or complete.

    All contents are first written to temporary files beside their targets; only when all of
    them succeeded are they moved into place, in the given order (put the file that refers
    to the others last). On error every temporary file is removed, and so is every folder
    this call created that is left empty.

    Args:
        files: target path -> text, bytes, or a DataFrame (written as CSV without index).

    Returns:
        the paths written.

    Raises:
        OSError: a file cannot be written (its ``filename`` is the target path).
    """
    tmps: list[tuple[Path, Path]] = []
    made: list[Path] = []
    try:
        for path, content in files.items():
            # write through a symlink; refuse to replace a device or other special file
            path = Path(os.path.realpath(path))
            if path.exists() and not path.is_file():
                raise OSError(21, "not a regular file", str(path))
            tmp = _tmp_for(path, made)
            tmps.append((tmp, path))
            try:
                if isinstance(content, pd.DataFrame):
                    content.to_csv(tmp, index=False, float_format="%.6g")
                elif isinstance(content, bytes):
                    tmp.write_bytes(content)
                else:
                    tmp.write_text(content, encoding="utf-8")
            except OSError as exc:  # name the target (a failed write() names no file)
                raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        umask = os.umask(0)
        os.umask(umask)
        for tmp, path in tmps:
            os.chmod(tmp, 0o666 & ~umask)  # the permissions a plain open() would give
            os.replace(tmp, path)
    except BaseException:
        for tmp, _ in tmps:
            try:
                tmp.unlink()
            except FileNotFoundError:
                pass
        for d in reversed(made):  # the folders this call created, innermost first, if empty
            try:
                d.rmdir()
            except OSError:
                pass
        raise
    return [p for _, p in tmps]
