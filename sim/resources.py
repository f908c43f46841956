"""The files shipped with prefetch-sim, and how a name finds them.

Shipped files: ``scenarios/`` (the what-if scenarios, ``models/``, ``hardware/`` profiles with
their CSV tables, ``traces/``, ``tiny/``) and ``data/reported_measurements.csv`` (what
``prefetch-sim reproduce`` compares against). In a source checkout or an editable install they
are read where they lie, at the repository root; a wheel carries copies of them as package data
under ``sim/_data/`` (``setup.py`` copies them there when it builds). :func:`shipped_root` is the
only place that tells the two apart; everything else goes through :func:`shipped`.

Rules (README, "Scenarios by name"):

* a scenario on the command line (:func:`resolve_scenario`): a path that exists relative to the
  working folder (or an absolute one) wins; else the same relative path inside the shipped
  files (``scenarios/laguna-2x3090.toml`` works from any folder); else a bare name (no ``/``, no
  ``.toml``) is looked up as ``scenarios/NAME.toml`` and ``scenarios/tiny/NAME.toml``, in the
  working folder first, then in the shipped files (``prefetch-sim run laguna-2x3090``); an
  unknown bare name is an error listing the built-in names;
* ``model =`` / ``hardware =`` in a scenario (:func:`resolve_field`): relative to the scenario's
  folder, as always; a bare name (no ``/``, no ``.toml`` or ``.gguf``) with no such file beside
  the scenario is the shipped ``scenarios/models/NAME.toml`` / ``scenarios/hardware/NAME.toml``
  (``hardware = "h200"``); an unknown one is an error listing the built-in names.
"""

from __future__ import annotations

import os
import tomllib
from importlib import resources
from pathlib import Path

from sim.errors import PrefetchSimError, ScenarioError

#: where a wheel keeps the shipped files, inside the ``sim`` package
PACKAGED_DIR = "_data"
#: the shipped files, relative to the repository root (folders are shipped whole); setup.py
#: copies exactly these into ``sim/_data/`` of a wheel
SHIPPED = ("scenarios", "data/reported_measurements.csv")
#: folders whose ``*.toml`` stems are the built-in names of each kind (a file counts as a kind
#: when it has that kind's top-level table: ``[scenario]``, ``[model]``, ``[hardware]``)
BUILTIN_DIRS = {
    "scenario": ("scenarios", "scenarios/tiny"),
    "model": ("scenarios/models", "scenarios/tiny"),
    "hardware": ("scenarios/hardware", "scenarios/tiny"),
}
#: the shipped folder of each kind a scenario names (``model = "models/NAME.toml"``)
KIND_FOLDER = {"model": "models", "hardware": "hardware"}
#: suffixes that make a value a file name rather than a built-in name
_FILE_SUFFIXES = (".toml", ".gguf")


def _package_dir() -> Path:
    pkg = resources.files("sim")
    try:
        return Path(os.fspath(pkg)).resolve()  # type: ignore[arg-type]
    except TypeError:  # a zip import: not supported, the engines read files by path
        raise PrefetchSimError(f"prefetch-sim must be installed as files, not imported from an archive ({pkg})") \
            from None


def shipped_root() -> Path:
    """The folder that holds the shipped ``scenarios/`` and ``data/``: ``sim/_data`` of an
    installed wheel, else the repository root above the ``sim`` package (checkout, editable)."""
    pkg = _package_dir()
    packaged = pkg / PACKAGED_DIR
    return packaged if packaged.is_dir() else pkg.parent


def shipped(rel: str | Path) -> Path:
    """The shipped file or folder ``rel`` (``"scenarios/default.toml"``), whether or not it
    exists (a caller that opens it reports a missing file with this path)."""
    return shipped_root() / rel


def cwd_or_shipped(rel: str | Path) -> Path:
    """``rel`` relative to the working folder if it exists there (or is absolute), else the
    shipped copy if that exists, else ``rel`` as given (so a missing-file error names it)."""
    p = Path(rel)
    if p.exists() or p.is_absolute():
        return p
    s = shipped(p)
    return s if s.exists() else p


def is_bare_name(text: str) -> bool:
    """A built-in name rather than a path: no folder separator, not ``.``/``..``, and not
    ending in ``.toml`` or ``.gguf``."""
    t = text.strip()
    return (bool(t) and t not in (".", "..") and "/" not in t and "\\" not in t
            and not t.lower().endswith(_FILE_SUFFIXES))


def _is_kind(path: Path, kind: str) -> bool:
    """Whether the TOML file ``path`` has the top-level table ``[kind]`` (False if unreadable)."""
    try:
        with path.open("rb") as fh:
            return isinstance(tomllib.load(fh).get(kind), dict)
    except (OSError, tomllib.TOMLDecodeError):
        return False


def builtin_names(kind: str) -> tuple[str, ...]:
    """The built-in names of ``kind`` (``"scenario"``, ``"model"`` or ``"hardware"``), sorted."""
    names = {p.stem for d in BUILTIN_DIRS[kind] for p in shipped(d).glob("*.toml")
             if p.is_file() and _is_kind(p, kind)}
    return tuple(sorted(names))


def unknown_name_message(kind: str, name: str) -> str:
    return f"unknown {kind} '{name}' (built-in {kind} names: {', '.join(builtin_names(kind)) or 'none found'})"


def builtin(kind: str, name: str, *, cwd_first: bool = False) -> Path | None:
    """The file of the built-in ``kind`` called ``name``, or None. ``cwd_first``: the same
    relative path under the working folder wins over the shipped copy."""
    rels = [Path(d) / f"{name}.toml" for d in BUILTIN_DIRS[kind]]
    bases = ([Path()] if cwd_first else []) + [shipped_root()]
    for base in bases:
        for rel in rels:
            if (base / rel).is_file() and _is_kind(base / rel, kind):
                return base / rel
    return None


def resolve_scenario(arg: str) -> Path:
    """The scenario file a command-line argument names (rules in the module docstring).

    Raises:
        ScenarioError: ``arg`` is an unknown bare name (field ``scenario``), listing the
            built-in names.
    """
    p = Path(arg)
    bare = is_bare_name(arg)
    # a folder of a bare name (``tiny`` inside scenarios/) does not hide the built-in scenario
    if p.is_absolute() or p.is_file() or (p.exists() and not bare):
        return p
    s = shipped(p)
    if s.exists() and not (bare and s.is_dir()):
        return s
    if bare:
        found = builtin("scenario", arg.strip(), cwd_first=True)
        if found is None:
            raise ScenarioError(f"no such file, and {unknown_name_message('scenario', arg.strip())}",
                                field="scenario")
        return found
    return p


def resolve_named(kind: str, arg: str | Path) -> Path:
    """The file a Python caller's ``arg`` names for ``kind`` (``"model"`` or ``"hardware"``): the
    file itself when it exists or ``arg`` is a path (its loader reports a missing one), else the
    built-in of that bare name (the working folder's copy first), as
    :func:`resolve_scenario` does for scenarios: ``load_model("qwen3-30b-a3b")``,
    ``load_hardware("h200")``.

    Raises:
        ScenarioError: ``arg`` is a bare name that is neither a file nor built in (field
            ``kind``), listing the built-in names.
    """
    p = Path(arg)
    if not isinstance(arg, str) or p.is_file() or not is_bare_name(arg):
        return p
    found = builtin(kind, arg.strip(), cwd_first=True)
    if found is None:
        raise ScenarioError(f"no such file, and {unknown_name_message(kind, arg.strip())}", field=kind)
    return found


def resolve_field(kind: str, value: str, beside: Path, *, file: str | Path | None = None,
                  field: str | None = None) -> Path:
    """The file a scenario's ``model =`` or ``hardware =`` (``kind``) names: ``beside`` (the
    value relative to the scenario's folder) if that file exists; else, for a relative path
    whose folder is the kind's shipped one (``models/qwen3-30b-a3b.toml``, as the shipped
    scenarios write it: a copied scenario keeps working), the shipped file of that name when
    there is one; else, for a bare name, the built-in file of that name; else ``beside`` (its
    loader reports the missing file).

    Raises:
        ScenarioError: a bare name that is neither a file beside the scenario nor built in,
            listing the built-in names (naming ``file`` and ``field``).
    """
    if beside.is_file():
        return beside
    if not is_bare_name(value):
        # a shipped scenario's own relative path (models/NAME.toml, hardware/NAME.toml,
        # ../models/...) when the scenario was copied elsewhere: the shipped file of that name
        rel = Path(value)
        if not rel.is_absolute() and rel.parent.name == KIND_FOLDER[kind]:
            shipped_file = shipped(f"scenarios/{KIND_FOLDER[kind]}/{rel.name}")
            if shipped_file.is_file():
                return shipped_file
        return beside
    found = builtin(kind, value.strip())
    if found is None:
        raise ScenarioError(f"no file '{value}' beside the scenario, and {unknown_name_message(kind, value.strip())}",
                            file=file, field=field)
    return found
