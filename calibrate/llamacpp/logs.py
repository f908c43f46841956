"""A run folder's log files, however they are kept: plain, gzipped (``.gz``), or members of the
folder's ``logs.tar.gz`` (how a committed run keeps ``logs/``: :func:`calibrate.llamacpp.grid.pack_logs`).

One reader for the harness's modules that read logs (:mod:`~calibrate.llamacpp.routing_check`,
:mod:`~calibrate.llamacpp.splittime`, :mod:`~calibrate.llamacpp.fit`, :mod:`~calibrate.llamacpp.ab`).
Text is decoded as UTF-8 with undecodable bytes replaced (a log is read for its tagged lines).
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

from sim.errors import ScenarioError

#: the archive a committed run folder keeps its ``logs/`` in
LOGS_ARCHIVE = "logs.tar.gz"


def read_text(path: str | Path) -> str:
    """The text of a log file: gunzipped when its name ends in ``.gz``, else as it is.

    Raises:
        OSError: the file cannot be read (``FileNotFoundError`` when missing).
        ScenarioError: a ``.gz`` file that is truncated or corrupt (naming it).
    """
    p = Path(path)
    if p.suffix == ".gz":
        try:
            with gzip.open(p, "rt", errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            raise
        except (EOFError, OSError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
            why = " ".join(str(exc).split())
            raise ScenarioError(f"cannot read the gzipped log ({exc.__class__.__name__}: {why})", file=p) from None
    return p.read_text(errors="replace")


def read_run_log(run_dir: str | Path, rel: str) -> str:
    """The text of a run folder's log ``rel`` (``logs/<id>.log``): the file (or its gzipped
    ``rel.gz``), else its member of ``logs.tar.gz``.

    Raises:
        FileNotFoundError: in none of these places.
        ScenarioError: ``logs.tar.gz`` is there but not a readable archive (naming it).
    """
    import tarfile

    run_dir = Path(run_dir)
    p = run_dir / rel
    for cand in (p, p.with_name(p.name + ".gz")):
        if cand.is_file():
            return read_text(cand)
    arc = run_dir / LOGS_ARCHIVE
    if arc.is_file():
        try:
            with tarfile.open(arc) as tf:
                for name in (rel, f"./{rel}"):
                    try:
                        fh = tf.extractfile(name)
                    except KeyError:
                        continue
                    if fh is not None:
                        return fh.read().decode(errors="replace")
        except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
            why = " ".join(str(exc).split())
            raise ScenarioError(f"cannot read the packed logs ({exc.__class__.__name__}: {why})", file=arc) from None
    raise FileNotFoundError(f"{p} (nor in {arc})")
