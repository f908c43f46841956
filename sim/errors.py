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


class ContextRefusedError(ScenarioError):
    """A setting whose context llama.cpp refuses to create (``llama_init_from_model`` returns
    none: a quantised V cache without FlashAttention, a quantised KV block that does not divide
    the head size). llama-bench prints the rows before it and exits 1; ``run`` leaves such a
    setting out as it leaves out one that does not fit (:func:`sim.cli.run_bench`)."""


class PlacementError(ScenarioError):
    """A placement that cannot run: VRAM overflow, impossible layer counts, bad override rule."""


class VramOverflowError(PlacementError):
    """A placement whose VRAM on one GPU exceeds the GPU's memory (:func:`sim.model.vram.account`).

    Attributes:
        breakdown: that GPU's :class:`sim.model.vram.VramBreakdown` (bytes by component: what the
            command line maps back to the flags that size each component,
            :func:`sim.cli.benchflags.overflow_in_flags`); None when not known (an error rebuilt
            from its text).
        ctx_size: the context (tokens) the KV cache is sized for.
        needs: the overflow without the advice (``does not fit on GPU 0: needs 56.02 GiB (weights
            ...) of 24.00 GiB``), for a caller that words the advice in its own terms.
    """

    def __init__(self, message: str, *, file: str | Path | None = None, field: str | None = None,
                 breakdown=None, ctx_size: int = 0, needs: str = ""):
        super().__init__(message, file=file, field=field)
        self.breakdown = breakdown
        self.ctx_size = ctx_size
        self.needs = needs or message


class GPUUnavailableError(PrefetchSimError):
    """No CUDA GPU, or CuPy is not installed (``pip install -e '.[gpu]'`` in the checkout, CUDA 13;
    ``'.[gpu-cuda12]'`` for CUDA 12)."""
