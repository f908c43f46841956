"""Unit constants. SI inside the simulator; convert only at I/O.

``GiB``/``MiB``/``KiB`` are binary (2**30, ...), ``GB``/``MB`` decimal (10**9, ...), as in
llama.cpp's output (MiB) and GPU datasheets (GB/s).
"""

KiB = 2**10
MiB = 2**20
GiB = 2**30
KB = 10**3
MB = 10**6
GB = 10**9
TB = 10**12
US = 1e-6
MS = 1e-3
