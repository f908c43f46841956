"""Build hook: ship the scenarios and the reported measurements as package data.

Everything else is declared in pyproject.toml. ``scenarios/`` and
``data/reported_measurements.csv`` stay at the repository root (where users edit them and the
docs link to them); a wheel carries copies under ``sim/_data/``, where ``sim.resources`` finds
them (in a checkout or an editable install it reads the root instead). The list below must match
``sim.resources.SHIPPED`` (tests/test_packaging.py checks both against a built wheel).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
#: = sim.resources.SHIPPED (not imported: the build must not import the package)
SHIPPED = ("scenarios", "data/reported_measurements.csv")
PACKAGED_DIR = Path("sim") / "_data"


def shipped_files() -> list[Path]:
    """The shipped files, relative to the repository root (folders walked, caches skipped)."""
    out: list[Path] = []
    for rel in SHIPPED:
        p = HERE / rel
        if p.is_dir():
            out += sorted(f.relative_to(HERE) for f in p.rglob("*")
                          if f.is_file() and "__pycache__" not in f.parts and not f.name.startswith("."))
        elif p.is_file():
            out.append(Path(rel))
        else:
            raise FileNotFoundError(f"shipped file missing from the source tree: {rel}")
    return out


class build_py_with_data(build_py):
    """build_py that also copies :data:`SHIPPED` into ``sim/_data/`` of the build (not for an
    editable install, which reads them in place)."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for rel in shipped_files():
            dest = Path(self.build_lib) / PACKAGED_DIR / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(HERE / rel, dest)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outs = super().get_outputs(include_bytecode)
        if getattr(self, "editable_mode", False):
            return outs
        return outs + [str(Path(self.build_lib) / PACKAGED_DIR / rel) for rel in shipped_files()]


setup(cmdclass={"build_py": build_py_with_data})
