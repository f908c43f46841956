"""Atomic file output: nothing is ever left half-written.

Every file the CLI writes goes through a temporary file in the target folder and
``os.replace``; on any error the temporary file is removed and the old file (if any) stays.
"""

from __future__ import annotations

import errno
import io
import os
import tempfile
from pathlib import Path


#: why an existing file the user may not write is not replaced (a new file renamed over it would
#: succeed in a writable folder; the shell's '>' refuses)
READ_ONLY = "the file exists and is read-only (not writable by you)"


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write ``data`` (text or bytes) to ``path`` atomically, with the permissions a plain
    ``open`` would give (``mkstemp`` creates 0600 files). Creates missing parent folders.

    Raises:
        OSError: the folder cannot be created or written.
    """
    target = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    # a symlink is written through (its target is replaced, not the link); a device, FIFO or
    # other special file (/dev/null, /dev/stdout) is written in place, never replaced
    path = Path(os.path.realpath(target))
    # decided on the name as given (stat follows the links): /dev/stdout's real path on a pipe is
    # /proc/<pid>/fd/pipe:[n], which names nothing, while opening /dev/stdout writes the pipe
    if target.exists() and not target.is_file():
        try:
            with open(target, "wb") as fh:
                fh.write(payload)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror or str(exc), str(target)) from None
        return target
    if path.is_file() and not os.access(path, os.W_OK):  # never replace a file the user may not write
        raise OSError(errno.EACCES, READ_ONLY, str(target))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:  # name the user's path, not a temporary one
        raise _creation_error(exc, path.parent, target) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise OSError(exc.errno, exc.strerror or str(exc), str(target)) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


#: file name endings that a folder output (``directory=True``) that does not exist yet may not have:
#: ``--out /tmp/cx.csv`` means a file, and would silently become a folder named ``cx.csv``
FILE_SUFFIXES = (".csv", ".png", ".json", ".jsonl", ".md", ".txt", ".svg", ".pdf", ".html", ".toml", ".sql", ".gz")


#: file name endings that name a format: an output named with one of them but written in another
#: is refused (:func:`check_output_path`'s ``writes``)
FORMAT_SUFFIXES = tuple(s for s in FILE_SUFFIXES if s != ".gz")   # (.gz names a compression, not a format)


def check_output_path(path: str | Path, flag: str = "--out", *, directory: bool = False,
                      suffix: str | None = None, writes: str | None = None) -> Path:
    """Fail early (before any simulation) on an output path that cannot be written. Creates
    nothing. ``suffix`` (``".png"``): the only file name ending the output may have (a figure
    written as PNG under another name would mislead). ``writes`` (``".csv"``): the format written;
    a name ending in another format's suffix (:data:`FORMAT_SUFFIXES`: ``x.md`` for a CSV) is
    refused, any other name taken.

    Raises:
        ScenarioError: naming ``flag``: the path is empty or ``-`` (not standard output), a folder
            or a name ending in ``/`` (for a file output), a file (for a folder output), a folder output
            that does not exist yet named like a file (:data:`FILE_SUFFIXES`: ``cx.csv``), its folder
            cannot be created or written, or it does not end in ``suffix``.
    """
    from sim.errors import ScenarioError

    p = Path(path)
    if str(path) == "":
        raise ScenarioError("empty path", field=flag)
    if str(path) == "-":
        raise ScenarioError("'-' would be a file named '-', not standard output; give a file name", field=flag)
    if suffix is not None and p.suffix.lower() != suffix.lower():
        raise ScenarioError(f"'{p}' does not end in {suffix} (the file is written as {suffix.lstrip('.').upper()})",
                            field=flag)
    if writes is not None and p.suffix.lower() in FORMAT_SUFFIXES and p.suffix.lower() != writes.lower():
        raise ScenarioError(f"'{p}' ends in {p.suffix}, but the file is written as {writes.lstrip('.').upper()}: "
                            f"give a {writes} name", field=flag)
    if not directory and (p.is_dir() or str(path).endswith(("/", os.sep))):
        raise ScenarioError(f"'{path}' is a folder{'' if p.is_dir() else ' name (it ends in /)'}; give a file name",
                            field=flag)
    if directory and p.exists() and not p.is_dir():
        raise ScenarioError(f"'{p}' exists and is not a folder", field=flag)
    if directory and not p.exists() and p.suffix.lower() in FILE_SUFFIXES:
        raise ScenarioError(f"'{p}' ends in {p.suffix}, as a file name does, but {flag} names a folder (the outputs are "
                            f"written into it): give a folder name, e.g. '{p.with_suffix('')}'", field=flag)
    if not directory and p.is_file() and not os.access(p, os.W_OK):
        raise ScenarioError(f"cannot write '{p}': {READ_ONLY}; remove it or give another name", field=flag)
    if not directory and p.exists() and not p.is_file():  # a device or FIFO (/dev/null) is written in place
        if not os.access(p, os.W_OK):
            raise ScenarioError(f"cannot write '{p}': not writable (permission denied)", field=flag)
        return p
    folder = (p if directory else p.parent).absolute()
    existing = folder
    while not existing.exists():  # the folder will be created under its nearest ancestor
        existing = existing.parent
    if not existing.is_dir():
        raise ScenarioError(f"cannot create folder '{folder}': '{existing}' is not a folder", field=flag)
    what = f"folder '{p}'" if directory else f"'{p}'"
    if not os.access(existing, os.W_OK | os.X_OK):
        why = "permission denied"
        try:
            if os.statvfs(existing).f_flag & os.ST_RDONLY:
                why = "a read-only file system"
        except (OSError, AttributeError):
            pass
        raise ScenarioError(f"cannot write {what}: folder '{existing}' is not writable ({why})", field=flag)
    try:  # a real probe: /proc or a read-only mount pass os.access for root
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".prefetch-sim-probe.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ScenarioError(f"cannot write {what}: folder '{existing}' {refusal(exc)}", field=flag) from None
    return p


def flag_of(args, filename) -> str:
    """The command-line flag whose value is the path ``filename`` (an ``OSError``'s file), as
    ``" (--out)"``, for an error message; ``""`` when no flag of ``args`` (an argparse namespace)
    names it."""
    if not filename:
        return ""
    want = os.path.realpath(str(filename))
    for dest, value in sorted(vars(args).items()):
        if isinstance(value, (str, Path)) and str(value) and os.path.realpath(str(value)) == want:
            return f" (--{dest.replace('_', '-')})"
    return ""


def refusal(exc: OSError) -> str:
    """Why an existing folder refused a new file, from the ``OSError`` of creating one in it:
    ``does not accept new files (read-only file system)``, ``(permission denied)``, or, for the
    ``ENOENT`` a virtual file system such as ``/proc`` gives for a folder that does exist,
    ``(a read-only or virtual file system)`` instead of "No such file or directory"."""
    import errno

    reason = {errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
              errno.EPERM: "permission denied", errno.ENOENT: "a read-only or virtual file system",
              errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded"}.get(
        exc.errno, exc.strerror or str(exc))
    return f"does not accept new files ({reason})"


def _creation_error(exc: OSError, folder: Path, target: Path) -> OSError:
    """The ``OSError`` to raise for a failed temporary-file creation in ``folder``: naming the
    user's ``target``; where ``folder`` exists, saying it refuses new files (:func:`refusal`)
    rather than a bare "No such file or directory" from a virtual file system."""
    if folder.is_dir() and exc.errno is not None:
        return OSError(exc.errno, f"cannot be written there: folder '{folder}' {refusal(exc)}", str(target))
    return OSError(exc.errno, exc.strerror or str(exc), str(target))


def drawn_bytes(draw, name: str = "figure.png") -> bytes:
    """The bytes of a file that ``draw(path)`` writes (a figure: matplotlib writes by path),
    drawn into a temporary folder, so that it can go into place with the other outputs of a
    command (:func:`write_atomic_many`) instead of half-way through them.

    Raises:
        whatever ``draw`` raises (nothing is left behind).
    """
    with tempfile.TemporaryDirectory(prefix="prefetch-sim-figure.") as tmp:
        path = Path(tmp) / name
        draw(path)
        return path.read_bytes()


def write_atomic_many(files: dict[str | Path, str | bytes]) -> list[Path]:
    """Write several files as one: every payload goes to a temporary file beside its target
    first; only when all are written are they moved into place. A failed write (a full disk)
    leaves every earlier file of those names as it was and no temporary file behind.

    Raises:
        OSError: a file cannot be written (naming it).
    """
    staged: list[tuple[str, Path, Path]] = []
    try:
        for target, data in files.items():
            target = Path(target)
            path = Path(os.path.realpath(target))
            if path.exists() and not path.is_file():
                raise OSError(21, "not a regular file", str(target))
            payload = data.encode() if isinstance(data, str) else data
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            except OSError as exc:
                raise _creation_error(exc, path.parent, target) from None
            try:
                staged.append((tmp, path, target))
                with os.fdopen(fd, "wb") as fh:
                    fh.write(payload)
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror or str(exc), str(target)) from None
        umask = os.umask(0)
        os.umask(umask)
        for tmp, path, target in staged:
            os.chmod(tmp, 0o666 & ~umask)
        for tmp, path, target in staged:
            os.replace(tmp, path)
    except BaseException:
        for tmp, _, _ in staged:
            Path(tmp).unlink(missing_ok=True)
        raise
    return [t for _, _, t in staged]


def save_figure(fig, path: str | Path) -> Path:
    """Write a matplotlib figure as PNG atomically; returns the path."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return write_atomic(path, buf.getvalue())
