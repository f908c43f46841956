"""prefetch-sim: what-if simulator for weight and MoE expert prefetching in hybrid CPU/GPU
LLM inference (llama.cpp / ggml style).

Pure CPU package: it never imports CuPy. GPU measurement and the real executor live in
``calibrate/`` and are imported lazily.
"""

__version__ = "0.1.0"
