"""GPU side of prefetch-sim: calibration (measure a GPU, write a hardware profile) and the
thin real executor that runs a :class:`sim.plan.Plan` on the GPU.

Importing this package never imports CuPy; functions that need the GPU import it lazily and
raise :class:`sim.errors.GPUUnavailableError` when CuPy or a GPU is missing.
"""
