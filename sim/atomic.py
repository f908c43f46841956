"""Atomic file output: nothing is ever left half-written.

Every file the CLI writes goes through a temporary file in the target folder and
``os.replace``; on any error the temporary file is removed and the old file (if any) stays.
"""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write ``data`` (text or bytes) to ``path`` atomically, with the permissions a plain
    ``open`` would give (``mkstemp`` creates 0600 files). Creates missing parent folders.

    Raises:
        OSError: the folder cannot be created or written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def save_figure(fig, path: str | Path) -> Path:
    """Write a matplotlib figure as PNG atomically; returns the path."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return write_atomic(path, buf.getvalue())
