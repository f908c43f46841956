"""Which code made a measurement: recorded in validation metadata and calibration profiles."""
from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
#: the source folders whose content identifies the code when there is no git (a copy of the tree)
SOURCE_DIRS = ("sim", "calibrate")


def source_hash(root: str | Path | None = None) -> str:
    """SHA-256 (first 12 hex digits) over the paths and contents of the ``*.py`` files under
    :data:`SOURCE_DIRS` of ``root`` (default: this checkout), sorted by path; ``""`` when there
    are none. Identifies the code in a copy of the tree without ``.git``."""
    base = Path(root or _ROOT)
    h = hashlib.sha256()
    files = sorted(p for d in SOURCE_DIRS for p in (base / d).rglob("*.py") if p.is_file())
    for p in files:
        h.update(p.relative_to(base).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:12] if files else ""


def _git(where: str, *args: str) -> str | None:
    try:
        r = subprocess.run(["git", "-C", where, *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def code_version(root: str | Path | None = None) -> str:
    """The code's version for the record. Never raises.

    * ``"git <commit> (src <hash>)"`` (12 hex digits each), ``+dirty`` after the commit when
      tracked files differ from it, ``+?`` when that could not be checked — only when ``root``
      (default: this checkout) is itself the top of a git work tree (git searches parent
      folders; a copy of the tree inside some other repository must not report that
      repository's commit). The :func:`source_hash` always follows: the lent GPU machine's copy
      of the tree once carried the ``.git`` of an older commit, so the commit alone named the
      wrong code (runs 19–21, ``data/validation/history/README.md``);
    * otherwise ``"src <hash> (no git)"`` (a copy of the tree without ``.git``);
    * ``"unknown"`` when neither is available.

    Untracked files do not mark ``+dirty``; the hash covers every ``*.py`` file under
    :data:`SOURCE_DIRS`, tracked or not.
    """
    base = Path(root or _ROOT).resolve()
    try:
        h = source_hash(base)
    except OSError:
        h = ""
    top = _git(str(base), "rev-parse", "--show-toplevel")
    if top and Path(top).resolve() == base:
        head = _git(str(base), "rev-parse", "--short=12", "HEAD")
        if head:
            st = _git(str(base), "status", "--porcelain", "--untracked-files=no")
            return f"git {head}{'+?' if st is None else '+dirty' if st else ''}" + (f" (src {h})" if h else "")
    return f"src {h} (no git)" if h else "unknown"
