"""Error types. Every user-facing error names the file and the field it comes from."""

from __future__ import annotations

from pathlib import Path


class PrefetchSimError(Exception):
    """Base class of all errors the CLI reports as a clean one-line message (no traceback)."""


class ScenarioError(PrefetchSimError):
    """A malformed scenario, model, hardware or trace file.

    Attributes:
        file: the file the bad value came from (``None`` for values built in code).
        field: dotted name of the offending field, e.g. ``placement.n_cpu_moe``.
    """

    def __init__(self, message: str, *, file: str | Path | None = None, field: str | None = None):
        self.file = None if file is None else str(file)
        self.field = field
        self.reason = message
        where = []
        if self.file:
            where.append(self.file)
        if field:
            where.append(f"field '{field}'")
        prefix = ": ".join(where)
        super().__init__(f"{prefix}: {message}" if prefix else message)


class PlacementError(ScenarioError):
    """A placement that cannot run: VRAM overflow, impossible layer counts, bad override rule."""


class GPUUnavailableError(PrefetchSimError):
    """No CUDA GPU, or CuPy is not installed (``pip install -e '.[gpu]'`` in the checkout, CUDA 13;
    ``'.[gpu-cuda12]'`` for CUDA 12)."""
