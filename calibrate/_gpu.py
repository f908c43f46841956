"""Access to CuPy and the GPU, imported lazily.

Nothing in :mod:`sim` imports this module; code in :mod:`calibrate` calls
:func:`require_cupy` inside the functions that need the GPU, so importing ``calibrate``
works on a machine without CuPy or without a GPU.
"""

from __future__ import annotations

from types import ModuleType

from sim.errors import GPUUnavailableError


def require_cupy() -> ModuleType:
    """Import CuPy and check that at least one CUDA GPU is visible.

    Returns:
        the ``cupy`` module.

    Raises:
        GPUUnavailableError: CuPy is not installed, its CUDA libraries cannot be loaded, or
            no GPU is visible (the message says which).
    """
    try:
        import cupy  # noqa: PLC0415  (lazy by design)
    except ImportError as exc:
        raise GPUUnavailableError(
            f"CuPy is not installed or cannot be imported ({exc}); install the GPU extra, e.g. "
            "pip install -e '.[gpu]' in the checkout (cupy-cuda13x, for a CUDA 13 driver; '.[gpu-cuda12]' installs "
            "cupy-cuda12x for a CUDA 12 driver)"
        ) from None
    try:
        n = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # CUDARuntimeError, missing driver library, ...
        raise GPUUnavailableError(f"CuPy is installed but no CUDA GPU is usable: {exc}") from None
    if n < 1:
        raise GPUUnavailableError("CuPy is installed but no CUDA GPU is visible (device count 0)")
    return cupy


def gpu_available() -> bool:
    """True when :func:`require_cupy` would succeed (for pytest skips and CLI hints)."""
    try:
        require_cupy()
    except GPUUnavailableError:
        return False
    return True
