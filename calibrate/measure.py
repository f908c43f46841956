"""GPU measurements with CuPy: copies, GEMMs, grouped expert GEMMs, attention, overheads.

Every function here takes a :class:`Gpu` (made by :func:`open_gpu` from the ``cupy`` module,
so CuPy is only imported by the caller, lazily) and returns plain rows (dicts of numbers)
that :mod:`calibrate.run` turns into tables and fits.

How GPU time is measured (:func:`gpu_time`): after warm-up calls, a *spin kernel* holding the
stream for longer than the host needs to issue all repetitions is launched first; the timed
calls are then queued behind it with a CUDA event between consecutive calls. The GPU runs
them back to back, so ``elapsed(event_i, event_i+1)`` is the device time of call ``i``
(including the GPU-side gap between kernels, about 1 µs) and not the host's issue time. The
host's own costs (issue, event, sync) are measured separately on the host clock
(:func:`measure_overheads`).
"""

from __future__ import annotations

import math
import os
import platform
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sim.provenance import code_version

perf = time.perf_counter

KERNELS_SRC = r"""
extern "C" __global__ void spin_ns(unsigned long long ns) {
    // hold the stream for ns nanoseconds of the GPU's global timer; the iteration cap ends
    // the loop even if the timer does not advance
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    for (unsigned long long i = 0; i < ns; ++i) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t - t0 >= ns) break;
    }
}
extern "C" __global__ void noop() {}
extern "C" __global__ void probe_words(const unsigned long long* addrs, int n, unsigned int* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = *((const volatile unsigned int*)addrs[i]);
}
// f16 <-> f32 with the PTX conversions that cuda_fp16.h's __half2float / __float2half use
// (f16 values travel as their 16 bits, so no header is needed under NVRTC)
__device__ __forceinline__ float f16_to_f32(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ unsigned short f32_to_f16(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
extern "C" __global__ void softmax_rows_f16(unsigned short* s, int L, float scale) {
    // in place, one block per row: row r (gridDim.x rows of L f16 values, back to back from
    // s) becomes softmax(row * scale) in f16; math in f32. blockDim.x: a power of two <= 1024.
    __shared__ float red[1024];
    unsigned short* row = s + (unsigned long long)blockIdx.x * (unsigned long long)L;
    const int t = threadIdx.x;
    const int nt = blockDim.x;
    // pass 1: row maximum of s * scale
    float m = -3.402823466e+38f;
    for (int i = t; i < L; i += nt) m = fmaxf(m, f16_to_f32(row[i]) * scale);
    red[t] = m;
    __syncthreads();
    for (int w = nt >> 1; w > 0; w >>= 1) {
        if (t < w) red[t] = fmaxf(red[t], red[t + w]);
        __syncthreads();
    }
    m = red[0];
    __syncthreads();
    // pass 2: sum of exp(s * scale - max)
    float sum = 0.0f;
    for (int i = t; i < L; i += nt) sum += __expf(f16_to_f32(row[i]) * scale - m);
    red[t] = sum;
    __syncthreads();
    for (int w = nt >> 1; w > 0; w >>= 1) {
        if (t < w) red[t] += red[t + w];
        __syncthreads();
    }
    const float inv = 1.0f / red[0];
    // pass 3: exp(s * scale - max) / sum, rounded to f16
    for (int i = t; i < L; i += nt) row[i] = f32_to_f16(__expf(f16_to_f32(row[i]) * scale - m) * inv);
}
"""

#: threads per block of ``softmax_rows_f16`` (one block per score row)
SOFTMAX_THREADS = 256
#: default cap on one chunk's f16 score block of :func:`attention_call` (bytes)
ATTN_SCORE_BYTES = 2 * 2**30

#: cudaMemcpyKind values (CUDA runtime API)
H2D, D2H, D2D = 1, 2, 3


@dataclass
class Gpu:
    """An opened GPU: the CuPy module, two non-blocking streams, helper kernels, facts.

    Attributes:
        cp: the ``cupy`` module (or the numpy stand-in :mod:`calibrate._fakecupy`).
        stream: the compute stream.
        copy_stream: a second non-blocking stream for copies.
        spin, noop, probe: helper kernels (see :data:`KERNELS_SRC`).
        softmax: the in-place f16 row softmax of :func:`attention_call`
            (``softmax_rows_f16``; grid = rows, block = :data:`SOFTMAX_THREADS`).
        bf16: numpy dtype of bfloat16 when CuPy supports it (``ml_dtypes``), else None.
        bf16_note: why bf16 is unavailable (empty when it is).
        batched_gemm: ``cublasGemmStridedBatchedEx`` works and agrees with a loop of matmuls.
        info: device, driver, runtime and library versions.
        rng: CuPy random generator for input data.
    """

    cp: Any
    stream: Any
    copy_stream: Any
    spin: Any
    noop: Any
    probe: Any
    softmax: Any
    bf16: Any
    bf16_note: str
    batched_gemm: bool
    info: dict
    rng: Any
    log: list[str] = field(default_factory=list)

    @property
    def rt(self):
        return self.cp.cuda.runtime

    def event(self):
        return self.cp.cuda.Event()

    def elapsed_s(self, a, b) -> float:
        return float(self.cp.cuda.get_elapsed_time(a, b)) * 1e-3

    def spin_for(self, seconds: float, stream=None) -> None:
        """Hold ``stream`` busy for ``seconds`` (capped at 2 s)."""
        s = stream or self.stream
        ns = int(min(max(seconds, 0.0), 2.0) * 1e9)
        with s:
            self.spin((1,), (1,), (np.uint64(ns),))

    def note(self, msg: str) -> None:
        self.log.append(msg)

    def sync_all(self) -> None:
        """Wait for every stream of the device, including the legacy default stream on which
        CuPy fills new arrays (the non-blocking streams used for timing do not wait for it)."""
        self.cp.cuda.runtime.deviceSynchronize()


def _decode(v) -> str:
    return v.decode(errors="replace") if isinstance(v, (bytes, bytearray)) else str(v)


def _nvidia_smi() -> dict:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit,pcie.link.gen.max,pcie.link.width.max",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return {}
    line = out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""
    keys = ["smi_name", "driver", "sm_clock_max", "mem_clock_max", "power_limit", "pcie_gen_max", "pcie_width_max"]
    vals = [v.strip() for v in line.split(",")]
    return dict(zip(keys, vals)) if len(vals) == len(keys) else {}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def open_gpu(cp, *, seed: int = 0) -> Gpu:
    """Open device 0: streams, helper kernels, bf16 and batched-GEMM probes, version facts.

    Args:
        cp: the ``cupy`` module (from :func:`calibrate._gpu.require_cupy`).
        seed: seed of the input-data generator.
    """
    rt = cp.cuda.runtime
    cp.cuda.Device(0).use()
    props = rt.getDeviceProperties(0)
    free0, total = rt.memGetInfo()
    stream = cp.cuda.Stream(non_blocking=True)
    copy_stream = cp.cuda.Stream(non_blocking=True)
    spin = cp.RawKernel(KERNELS_SRC, "spin_ns")
    noop = cp.RawKernel(KERNELS_SRC, "noop")
    probe = cp.RawKernel(KERNELS_SRC, "probe_words")
    softmax = cp.RawKernel(KERNELS_SRC, "softmax_rows_f16")
    rng = cp.random.default_rng(seed)
    info = {
        "device": _decode(props.get("name", "?")),
        "compute_capability": f"{props.get('major', '?')}.{props.get('minor', '?')}",
        "multiprocessors": int(props.get("multiProcessorCount", 0)),
        "l2_bytes": int(props.get("l2CacheSize", 0)),
        "vram_total_bytes": int(total),
        "vram_free_at_start_bytes": int(free0),
        "driver_api_version": int(rt.driverGetVersion()),
        "cuda_runtime_version": int(rt.runtimeGetVersion()),
        "cupy_version": str(getattr(cp, "__version__", "?")),
        "numpy_version": np.__version__,
        "host_cpu": _cpu_model(),
        "host_cpus": os.cpu_count() or 0,
        "python": platform.python_version(),
        "hostname_kernel": platform.release(),
        "code_version": code_version(),
    }
    info.update(_nvidia_smi())
    g = Gpu(cp, stream, copy_stream, spin, noop, probe, softmax, None, "", False, info, rng)
    # kernels compile on first use: do it now, outside any timing
    g.spin_for(1e-6)
    with stream:
        noop((1,), (1,), ())
    stream.synchronize()
    _check_softmax(g)
    g.bf16, g.bf16_note = _detect_bf16(g)
    g.batched_gemm = _check_batched(g)
    return g


def _detect_bf16(g: Gpu):
    cp = g.cp
    try:
        import ml_dtypes  # noqa: PLC0415

        dt = np.dtype(ml_dtypes.bfloat16)
        a = cp.ones((64, 64), dtype=cp.float32).astype(dt)
        c = cp.dot(a, a)
        val = float(cp.asnumpy(c.astype(cp.float32))[0, 0])
        if abs(val - 64.0) > 0.5:
            return None, f"bf16 matmul gave {val}, expected 64"
        return dt, ""
    except Exception as exc:  # ImportError, TypeError (dtype not supported), CUDA errors
        return None, f"bf16 unavailable in this CuPy: {type(exc).__name__}: {exc}"


# ---------------------------------------------------------------------------------------
# batched GEMM (cuBLAS strided batched; CuPy's own 3-D matmul upcasts f16 to f32)
# ---------------------------------------------------------------------------------------


def _cuda_dtype(g: Gpu, dtype) -> int:
    rt = g.rt
    if np.dtype(dtype) == np.float16:
        return int(rt.CUDA_R_16F)
    if g.bf16 is not None and np.dtype(dtype) == g.bf16:
        return int(rt.CUDA_R_16BF)
    raise TypeError(f"batched GEMM supports float16/bfloat16, got {dtype}")


#: alpha and beta of the cuBLAS calls (host pointers must stay valid)
_ONE = np.array(1.0, dtype=np.float32)
_ZERO = np.array(0.0, dtype=np.float32)


def bgemm_call(g: Gpu, a, b, c, *, trans_b: bool = False):
    """A ready-to-run ``cublasGemmStridedBatchedEx`` for ``c[i] = a[i] @ b[i]`` (see
    :func:`bgemm`): returns a no-argument callable that issues it on the current stream.
    Building the argument list once and calling it many times costs less host time than
    ``cupy.dot`` (used by the executor's launch path).

    Raises:
        ValueError: a matrix not C-contiguous in its last two axes.
    """
    from cupy.cuda import device  # noqa: PLC0415
    from cupy_backends.cuda.libs import cublas  # noqa: PLC0415

    nb, r, k = a.shape
    n = c.shape[2]
    it = a.itemsize
    for x in (a, b, c):
        if x.strides[2] != it or x.strides[1] != x.shape[2] * it:
            raise ValueError("bgemm: each matrix must be C-contiguous in its last two axes")
    dt = _cuda_dtype(g, a.dtype)
    # row-major C = A·B'  <=>  column-major Cᵀ = B'ᵀ·Aᵀ (see docs/calibration.md)
    args = (device.get_cublas_handle(),
            cublas.CUBLAS_OP_T if trans_b else cublas.CUBLAS_OP_N, cublas.CUBLAS_OP_N,
            n, r, k, _ONE.ctypes.data,
            b.data.ptr, dt, k if trans_b else n, b.strides[0] // it,
            a.data.ptr, dt, k, a.strides[0] // it,
            _ZERO.ctypes.data,
            c.data.ptr, dt, n, c.strides[0] // it,
            nb, cublas.CUBLAS_COMPUTE_32F, cublas.CUBLAS_GEMM_DEFAULT)
    fn = cublas.gemmStridedBatchedEx
    return lambda: fn(*args)


def bgemm(g: Gpu, a, b, c, *, trans_b: bool = False, use_batched: bool | None = None) -> None:
    """``c[i] = a[i] @ b[i]`` (or ``a[i] @ b[i].T`` with ``trans_b``) for 3-D f16/bf16 arrays
    on the current stream.

    Shapes: ``a`` (B, r, k); ``b`` (B, k, n), or (B, n, k) with ``trans_b``; ``c`` (B, r, n).
    Each matrix must be C-contiguous in its last two axes (the batch stride is free). One
    ``cublasGemmStridedBatchedEx`` call (f32 accumulation) when :attr:`Gpu.batched_gemm`,
    else a loop of 2-D ``cupy.dot`` calls.
    """
    cp = g.cp
    batched = g.batched_gemm if use_batched is None else use_batched
    if not batched or getattr(cp, "IS_FAKE", False):
        for i in range(a.shape[0]):
            cp.dot(a[i], b[i].T if trans_b else b[i], out=c[i])
        return
    bgemm_call(g, a, b, c, trans_b=trans_b)()


def _check_batched(g: Gpu) -> bool:
    """Run the strided-batched path on a small problem and compare with 2-D matmuls."""
    cp = g.cp
    if getattr(cp, "IS_FAKE", False):
        g.note("numpy stand-in: batched GEMM runs as a loop")
        return False
    try:
        a = g.rng.standard_normal((3, 40, 24), dtype=cp.float32).astype(cp.float16)
        b = g.rng.standard_normal((3, 24, 56), dtype=cp.float32).astype(cp.float16)
        bt = cp.ascontiguousarray(b.transpose(0, 2, 1))
        c1 = cp.empty((3, 40, 56), dtype=cp.float16)
        c2 = cp.empty_like(c1)
        c3 = cp.empty_like(c1)
        g.sync_all()
        with g.stream:
            bgemm(g, a, b, c1, use_batched=False)
            bgemm(g, a, b, c2, use_batched=True)
            bgemm(g, a, bt, c3, trans_b=True, use_batched=True)
        g.stream.synchronize()
        r1, r2, r3 = (cp.asnumpy(x).astype(np.float64) for x in (c1, c2, c3))
        ok = bool(np.allclose(r1, r2, rtol=2e-2, atol=2e-2) and np.allclose(r1, r3, rtol=2e-2, atol=2e-2))
        if not ok:
            g.note("batched GEMM disagrees with 2-D matmuls; using the loop")
        return ok
    except Exception as exc:  # cuBLAS binding missing in this CuPy, or the fake
        g.note(f"batched GEMM unavailable ({type(exc).__name__}: {exc}); using a loop of 2-D matmuls")
        return False


# ---------------------------------------------------------------------------------------
# timing helper
# ---------------------------------------------------------------------------------------


def gpu_time(g: Gpu, fn: Callable[[int], Any], reps: int, *, warmup: int = 2, stream=None) -> np.ndarray:
    """Device time of ``fn(i)`` for ``i`` in ``range(reps)``, seconds, shape (reps,).

    ``fn`` issues work on the current stream (it is called inside ``with stream``). See the
    module docstring for the spin-kernel method.
    """
    s = stream or g.stream
    g.sync_all()
    with s:
        for i in range(warmup):
            fn(i % max(reps, 1))
    s.synchronize()
    t0 = perf()
    with s:
        fn(0)
    host_one = perf() - t0
    s.synchronize()
    evs = [g.event() for _ in range(reps + 1)]
    g.spin_for(host_one * reps * 1.5 + 200e-6, s)
    with s:
        evs[0].record(s)
        for i in range(reps):
            fn(i)
            evs[i + 1].record(s)
    evs[-1].synchronize()
    return np.array([g.elapsed_s(evs[i], evs[i + 1]) for i in range(reps)])


def _reps_for(est_s: float, budget_s: float, lo: int, hi: int) -> int:
    return int(min(max(budget_s / max(est_s, 1e-9), lo), hi))


# ---------------------------------------------------------------------------------------
# copies
# ---------------------------------------------------------------------------------------

COPY_SIZES = tuple(2**p for p in range(12, 31))          # 4 KiB .. 1 GiB
COPY_SIZES_QUICK = tuple(2**p for p in (12, 16, 20, 24, 26))


@dataclass
class HostBuffers:
    """Host memory for copies: ``pinned`` (cupyx.empty_pinned) and ``pageable`` (numpy),
    both ``nbytes`` of uint8, filled with a non-zero pattern, and a device buffer as large."""

    pinned: Any
    pageable: np.ndarray
    device: Any
    nbytes: int


def alloc_copy_buffers(g: Gpu, nbytes: int) -> HostBuffers:
    cp = g.cp
    pinned = alloc_pinned(g, nbytes)
    pageable = np.empty(nbytes, dtype=np.uint8)
    words = nbytes // 4
    pat = (np.arange(words, dtype=np.uint32) * np.uint32(2654435761)) ^ np.uint32(0x5A5A5A5A)
    pageable[: words * 4].view(np.uint32)[:] = pat
    pinned[: words * 4].view(np.uint32)[:] = pat
    dev = cp.empty(nbytes, dtype=cp.uint8)
    return HostBuffers(pinned, pageable, dev, nbytes)


def _ptr_host(a) -> int:
    return int(a.ctypes.data)


def host_offset(i: int, nbytes: int, span: int) -> int:
    """Offset (bytes, 4 KiB aligned) of the ``i``-th copy of ``nbytes`` that walks through a host
    buffer of ``span`` bytes, so that consecutive copies do not find their host memory in the
    CPU caches; 0 when the buffer holds only one copy. Always ``0 <= offset <= span - nbytes``."""
    room = max(span - nbytes, 0)
    if not room:
        return 0
    step = max(nbytes // 4096 * 4096, 4096)
    off = (i * step) % (room + 1)
    return off - off % 4096


def copy_series(g: Gpu, dst: int, src: int, nbytes: int, kind: int, reps: int, *, stream=None,
                spin: bool = True, warmup: int = 2, host_span: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Time ``reps`` copies of ``nbytes``: device time (events) and host time of each
    ``cudaMemcpyAsync`` call returning, seconds, each shape (reps,).

    With ``spin`` the stream is held busy while the calls are issued, so event times are
    pure device time and host times pure issue cost. Without it (pageable memory, where the
    call itself blocks), each call starts on an idle stream.

    With ``host_span`` > ``nbytes``, the host side of each copy (source of an H2D,
    destination of a D2H) moves on by ``nbytes`` (4 KiB aligned) within a buffer of
    ``host_span`` bytes, so repeated copies do not find their host memory in the CPU caches
    (a model's weights are read once per token batch).
    """
    s = stream or g.stream
    g.sync_all()
    memcpy = g.rt.memcpyAsync
    h2d = kind == H2D

    def place(i: int) -> tuple[int, int]:
        off = host_offset(i, nbytes, host_span)
        return (dst, src + off) if h2d else (dst + off, src)

    for i in range(warmup):
        memcpy(*place(reps + i), nbytes, kind, s.ptr)
    s.synchronize()
    host = np.empty(reps)
    if spin:
        evs = [g.event() for _ in range(reps + 1)]
        g.spin_for(reps * 30e-6 + 200e-6, s)
        evs[0].record(s)
        for i in range(reps):
            d, sr = place(i)
            t0 = perf()
            memcpy(d, sr, nbytes, kind, s.ptr)
            host[i] = perf() - t0
            evs[i + 1].record(s)
        evs[-1].synchronize()
        dev = np.array([g.elapsed_s(evs[i], evs[i + 1]) for i in range(reps)])
        return dev, host
    starts = [g.event() for _ in range(reps)]
    ends = [g.event() for _ in range(reps)]
    for i in range(reps):
        d, sr = place(i)
        s.synchronize()
        starts[i].record(s)
        t0 = perf()
        memcpy(d, sr, nbytes, kind, s.ptr)
        host[i] = perf() - t0
        ends[i].record(s)
    s.synchronize()
    dev = np.array([g.elapsed_s(starts[i], ends[i]) for i in range(reps)])
    return dev, host


def measure_copies(g: Gpu, bufs: HostBuffers, sizes: Sequence[int], round_idx: int, *,
                   budget_s: float = 0.03) -> list[dict]:
    """H2D pinned, H2D pageable and D2H pinned copies of each size, the host side of each
    copy at a new place in the host buffer (see :func:`copy_series`).

    Returns rows ``{round, direction, memory, nbytes, rep, t_s, t_host_s}``; ``t_s`` is the
    device time (events), ``t_host_s`` the time the ``cudaMemcpyAsync`` call took to return.
    """
    rows = []
    dptr = int(bufs.device.data.ptr)
    for nb in sizes:
        if nb > bufs.nbytes:
            continue
        series = [
            ("h2d", "pinned", dptr, _ptr_host(bufs.pinned), H2D, True, 5e-6 + nb / 50e9),
            ("h2d", "pageable", dptr, _ptr_host(bufs.pageable), H2D, False, 10e-6 + nb / 10e9),
            ("d2h", "pinned", _ptr_host(bufs.pinned), dptr, D2H, True, 5e-6 + nb / 50e9),
        ]
        for direction, memory, dst, src, kind, spin, est in series:
            if direction == "d2h" and nb > 256 * 2**20:
                continue
            reps = _reps_for(est, budget_s, 5 if nb >= 2**26 else 10, 30)
            dev, host = copy_series(g, dst, src, nb, kind, reps, spin=spin, host_span=bufs.nbytes)
            for i in range(reps):
                rows.append({"round": round_idx, "direction": direction, "memory": memory, "nbytes": int(nb),
                             "rep": i, "t_s": float(dev[i]), "t_host_s": float(host[i])})
    return rows


def measure_host_blocking(g: Gpu, bufs: HostBuffers, nbytes: int = 64 * 2**20, reps: int = 5) -> dict:
    """Does the host wait for the copy? Host time of the ``cudaMemcpyAsync`` call returning
    over the copy's device time, for pinned and pageable sources on an idle stream (~0:
    asynchronous; ~1: the host is blocked for the copy)."""
    nbytes = min(nbytes, bufs.nbytes)
    dptr = int(bufs.device.data.ptr)
    out = {"nbytes": nbytes}
    for memory, src in (("pinned", _ptr_host(bufs.pinned)), ("pageable", _ptr_host(bufs.pageable))):
        dev, host = copy_series(g, dptr, src, nbytes, H2D, reps, spin=False)
        out[f"{memory}_t_s"] = float(np.median(dev))
        out[f"{memory}_host_return_s"] = float(np.median(host))
        out[f"{memory}_host_block_ratio"] = float(np.median(host) / np.median(dev))
    return out


def measure_ids_readback(g: Gpu, n_tokens: int = 2048, top_k: int = 10, reps: int = 50) -> dict:
    """Router ids readback: D2H of an (n_tokens × top_k) int32 tensor plus stream sync, on
    the host clock (what the host waits), into pinned memory and into a new numpy array
    (``ndarray.get``: pageable)."""
    cp = g.cp
    s = g.stream
    with s:
        ids = (g.rng.random((n_tokens, top_k)) * 128).astype(cp.int32)
    s.synchronize()
    nbytes = int(ids.nbytes)
    host = np.empty((n_tokens, top_k), dtype=np.int32)
    pinned = alloc_pinned(g, nbytes)
    t_pin, t_page, t_dev = [], [], []
    for i in range(reps + 3):
        e0, e1 = g.event(), g.event()
        t0 = perf()
        e0.record(s)
        g.rt.memcpyAsync(_ptr_host(pinned), int(ids.data.ptr), nbytes, D2H, s.ptr)
        e1.record(s)
        s.synchronize()
        t1 = perf()
        ids.get(stream=s, out=host)
        s.synchronize()
        t2 = perf()
        if i >= 3:
            t_pin.append(t1 - t0)
            t_page.append(t2 - t1)
            t_dev.append(g.elapsed_s(e0, e1))
    return {"n_tokens": n_tokens, "top_k": top_k, "nbytes": nbytes,
            "pinned_host_s": float(np.median(t_pin)), "pinned_host_min_s": float(np.min(t_pin)),
            "pinned_host_max_s": float(np.max(t_pin)),
            "pageable_get_host_s": float(np.median(t_page)), "device_s": float(np.median(t_dev)), "n": reps}


def alloc_pinned(g: Gpu, nbytes: int) -> np.ndarray:
    """A numpy uint8 array of ``nbytes`` in page-locked (pinned) host memory."""
    if getattr(g.cp, "IS_FAKE", False):
        return g.cp.empty_pinned(nbytes, np.uint8)
    import cupyx  # noqa: PLC0415

    return cupyx.empty_pinned((nbytes,), dtype=np.uint8)


# ---------------------------------------------------------------------------------------
# copy/compute concurrency and event semantics
# ---------------------------------------------------------------------------------------


def measure_concurrency(g: Gpu, bufs: HostBuffers, *, copy_bytes: int = 256 * 2**20, n_copies: int = 8,
                        gemm_n: int = 8192) -> dict:
    """A pinned copy on a dedicated non-blocking stream concurrent with compute.

    Three runs each for two kinds of compute (an f16 GEMM ``gemm_n``³, compute-bound, and an
    elementwise f16 kernel reading and writing ``copy_bytes`` each, memory-bound): copies alone, compute alone, both
    released together by one event. Returns the device times and the slowdown ratios
    (concurrent / alone) of each side: 1.0 means no interference.
    """
    cp = g.cp
    nb = min(copy_bytes, bufs.nbytes)
    dptr = int(bufs.device.data.ptr)
    src = _ptr_host(bufs.pinned)
    out: dict[str, float] = {"copy_bytes": nb, "n_copies": n_copies}
    a = (g.rng.standard_normal((gemm_n, gemm_n), dtype=cp.float32) * 0.1).astype(cp.float16)
    c = cp.empty_like(a)
    x = (g.rng.standard_normal(max(nb, 4096) // 2, dtype=cp.float32)).astype(cp.float16)
    y = cp.empty_like(x)

    def run(do_copy: bool, compute: str | None, n_compute: int):
        g.sync_all()
        gate = g.event()
        g.spin_for(6e-3, g.stream)
        gate.record(g.stream)
        g.copy_stream.wait_event(gate)
        c0, c1, p0, p1 = g.event(), g.event(), g.event(), g.event()
        with g.stream:
            c0.record(g.stream)
            for _ in range(n_compute if compute else 0):
                if compute == "gemm":
                    cp.dot(a, a, out=c)
                else:
                    cp.add(x, 1, out=y)
            c1.record(g.stream)
        p0.record(g.copy_stream)
        for _ in range(n_copies if do_copy else 0):
            g.rt.memcpyAsync(dptr, src, nb, H2D, g.copy_stream.ptr)
        p1.record(g.copy_stream)
        g.stream.synchronize()
        g.copy_stream.synchronize()
        return g.elapsed_s(p0, p1), g.elapsed_s(c0, c1)

    run(True, "gemm", 2)  # warm-up (cuBLAS heuristics, elementwise kernel compilation)
    run(True, "elementwise", 2)
    t_copy, _ = run(True, None, 0)
    for kind in ("gemm", "elementwise"):
        _, t1 = run(False, kind, 4)
        per = max(t1 / 4, 1e-6)
        n_compute = max(4, int(math.ceil(t_copy / per)))
        _, t_comp = run(False, kind, n_compute)
        tc, tk = run(True, kind, n_compute)
        out[f"{kind}_n"] = n_compute
        out[f"{kind}_alone_s"] = t_comp
        out[f"{kind}_concurrent_s"] = tk
        out[f"{kind}_copy_alone_s"] = t_copy
        out[f"{kind}_copy_concurrent_s"] = tc
        out[f"{kind}_compute_slowdown"] = tk / t_comp
        out[f"{kind}_copy_slowdown"] = tc / t_copy
    out["copy_alone_gb_per_s"] = nb * n_copies / t_copy / 1e9
    return out


def measure_event_semantics(g: Gpu, bufs: HostBuffers) -> dict:
    """When does a stream waiting on an event recorded between two copies get released?

    Copy A (64 MiB), record ``ready``, copy B (512 MiB) on the copy stream; the compute stream
    waits on ``ready`` and records ``go``. ``record_point`` (CUDA semantics): ``go`` follows
    A's end; ``stream_tail`` (seen on ROCm with pageable memory): ``go`` follows B's end.
    Done for pinned and pageable sources.
    """
    dptr = int(bufs.device.data.ptr)
    na = min(64 * 2**20, bufs.nbytes // 2)
    nbb = min(512 * 2**20, bufs.nbytes - na)
    out: dict[str, Any] = {}
    for memory, host in (("pinned", bufs.pinned), ("pageable", bufs.pageable)):
        src = _ptr_host(host)
        t0, ready, b_end, go = g.event(), g.event(), g.event(), g.event()
        g.stream.synchronize()
        g.copy_stream.synchronize()
        t0.record(g.copy_stream)
        g.rt.memcpyAsync(dptr, src, na, H2D, g.copy_stream.ptr)
        ready.record(g.copy_stream)
        g.stream.wait_event(ready)
        with g.stream:
            g.noop((1,), (1,), ())
        go.record(g.stream)
        g.rt.memcpyAsync(dptr + na, src + na, nbb, H2D, g.copy_stream.ptr)
        b_end.record(g.copy_stream)
        g.stream.synchronize()
        g.copy_stream.synchronize()
        ta, tb, tg = g.elapsed_s(t0, ready), g.elapsed_s(t0, b_end), g.elapsed_s(t0, go)
        out[f"{memory}_a_end_s"] = ta
        out[f"{memory}_b_end_s"] = tb
        out[f"{memory}_released_s"] = tg
        out[f"{memory}_semantics"] = "record_point" if tg < (ta + tb) / 2 else "stream_tail"
    return out


# ---------------------------------------------------------------------------------------
# GEMM sweep
# ---------------------------------------------------------------------------------------


@dataclass
class GemmPools:
    """Random inputs for the GEMM sweep. Weights are taken at rotating offsets of a pool
    several times the L2 cache, so each timed matmul reads its weight from HBM, as a model's
    layers do; activations and output are reused."""

    w: dict
    x: dict
    out: Any
    w_elems: int


def alloc_gemm_pools(g: Gpu, max_mk: int, max_mn: int, w_pool_bytes: int, dtypes: Sequence[str]) -> GemmPools:
    cp = g.cp
    w_elems = w_pool_bytes // 2
    w16 = (g.rng.standard_normal(w_elems, dtype=cp.float32) * 0.05).astype(cp.float16)
    x16 = (g.rng.standard_normal(max_mk, dtype=cp.float32) * 0.5).astype(cp.float16)
    w = {"f16": w16}
    x = {"f16": x16}
    if "bf16" in dtypes and g.bf16 is not None:
        w["bf16"] = w16.astype(g.bf16)
        x["bf16"] = x16.astype(g.bf16)
    out = cp.empty(max_mn, dtype=cp.float16)
    return GemmPools(w, x, out, w_elems)


def _dtype_of(g: Gpu, name: str):
    return g.cp.float16 if name == "f16" else g.bf16


def measure_gemm(g: Gpu, pools: GemmPools, m: int, n: int, k: int, dtype: str, *, budget_s: float = 0.02) -> dict:
    """Median device time of ``(m×k)·(k×n)`` in ``dtype`` (``cupy.dot``, f32 accumulation).

    Returns ``{m, n, k, dtype, t_s, t_min_s, t_max_s, n_rep}``.
    """
    cp = g.cp
    dt = _dtype_of(g, dtype)
    wpool = pools.w[dtype]
    x = pools.x[dtype][: m * k].reshape(m, k)
    out = pools.out[: m * n]
    if dtype != "f16":
        out = out.view(dt)
    out = out.reshape(m, n)
    kn = k * n
    n_slots = max(1, (pools.w_elems - kn) // max(kn, 1) + 1)
    est = max(2.0 * m * n * k / 600e12, 2.0 * kn / 3e12) + 6e-6
    reps = _reps_for(est, budget_s, 3, 20)
    ws = []
    for i in range(reps):
        off = (i % n_slots) * kn
        off -= off % 128
        ws.append(wpool[off: off + kn].reshape(k, n))
    t = gpu_time(g, lambda i: cp.dot(x, ws[i], out=out), reps, warmup=2)
    return {"m": m, "n": n, "k": k, "dtype": dtype, "t_s": float(np.median(t)), "t_min_s": float(t.min()),
            "t_max_s": float(t.max()), "n_rep": reps}


# ---------------------------------------------------------------------------------------
# grouped expert GEMM (MUL_MAT_ID)
# ---------------------------------------------------------------------------------------


def route_uniform(rng: np.random.Generator, n_tokens: int, n_expert: int, top_k: int) -> np.ndarray:
    """Rows per expert when each token picks ``top_k`` distinct experts uniformly at random:
    (n_expert,) int counts summing to ``n_tokens * top_k``."""
    picks = np.argsort(rng.random((n_tokens, n_expert)), axis=1)[:, :top_k]
    return np.bincount(picks.ravel(), minlength=n_expert)


def measure_moe(g: Gpu, model: str, n_expert: int, top_k: int, n: int, k: int, n_tokens: int,
                rng: np.random.Generator, *, reps: int = 3) -> list[dict]:
    """Grouped expert GEMM of ``n_tokens`` routed uniformly to ``top_k`` of ``n_expert``
    experts, each expert an (k → n) f16 matmul over its rows.

    Two methods: ``loop`` (one 2-D matmul per used expert with its own rows, as ggml-cuda's
    MUL_MAT_ID does for large batches) and ``batched`` (one strided-batched GEMM over the used
    experts, rows padded to the largest share ``ceil(tokens·top_k / n_used)``).
    """
    cp = g.cp
    counts = route_uniform(rng, n_tokens, n_expert, top_k)
    used = np.flatnonzero(counts)
    n_used = int(used.size)
    rows_total = int(counts.sum())
    r_pad = int(math.ceil(rows_total / n_used))
    w = (g.rng.standard_normal((n_used, k, n), dtype=cp.float32) * 0.05).astype(cp.float16)
    x = (g.rng.standard_normal((n_used, r_pad, k), dtype=cp.float32) * 0.5).astype(cp.float16)
    c = cp.empty((n_used, r_pad, n), dtype=cp.float16)
    cnt = counts[used]

    def loop(_i):
        for e in range(n_used):
            r = int(cnt[e])
            cp.dot(x[e, :r], w[e], out=c[e, :r])

    rows = []
    t = gpu_time(g, loop, reps, warmup=1)
    base = {"model": model, "n_expert": n_expert, "top_k": top_k, "n_tokens": n_tokens, "n_used": n_used,
            "rows": rows_total, "n": n, "k": k, "dtype": "f16"}
    rows.append({**base, "method": "loop", "t_s": float(np.median(t)), "t_min_s": float(t.min()),
                 "t_max_s": float(t.max()), "n_rep": reps})
    if g.batched_gemm:
        t = gpu_time(g, lambda _i: bgemm(g, x, w, c), reps, warmup=1)
        rows.append({**base, "method": "batched", "t_s": float(np.median(t)), "t_min_s": float(t.min()),
                     "t_max_s": float(t.max()), "n_rep": reps})
    return rows


# ---------------------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------------------


def softmax_rows_ref(s, scale: float) -> np.ndarray:
    """Float64 reference of ``softmax_rows_f16``: ``softmax(s * scale)`` along the last axis
    of a host array (any float dtype), returned as float64."""
    x = np.asarray(s, dtype=np.float64) * float(scale)
    x -= x.max(axis=-1, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x


def _check_softmax(g: Gpu) -> None:
    """Compile ``softmax_rows_f16`` (outside any timing) and check it on 3 rows of 300 keys
    (more than one block's width, not a multiple of it) against :func:`softmax_rows_ref`.

    Raises:
        RuntimeError: the kernel's result differs from the reference.
    """
    cp = g.cp
    rows, L, scale = 3, 300, 0.37
    host = (np.random.default_rng(1).standard_normal((rows, L)) * 4).astype(np.float16)
    dev = cp.asarray(host.ravel())
    g.sync_all()
    with g.stream:
        g.softmax((rows,), (SOFTMAX_THREADS,), (dev, np.int32(L), np.float32(scale)))
    g.stream.synchronize()
    got = cp.asnumpy(dev).reshape(rows, L).astype(np.float64)
    ref = softmax_rows_ref(host, scale)
    if not np.allclose(got, ref, rtol=4e-3, atol=1e-6):
        raise RuntimeError(f"softmax_rows_f16 disagrees with the reference (max abs error "
                           f"{float(np.abs(got - ref).max()):.3g})")


def attention_chunk_rows(n_batch: int, rows: int, L: int, max_score_bytes: int = ATTN_SCORE_BYTES) -> int:
    """Query rows per chunk of :func:`attention_call`: the most (at least 1, at most
    ``rows``) for which the f16 score block (n_batch, chunk, L) fits in ``max_score_bytes``."""
    return max(1, min(rows, max_score_bytes // max(n_batch * L * 2, 1)))


def attention_score_elems(n_batch: int, rows: int, L: int, max_score_bytes: int = ATTN_SCORE_BYTES) -> int:
    """Elements (f16) of the score buffer :func:`attention_call` needs for these shapes."""
    if n_batch <= 0 or rows <= 0 or L <= 0:
        return 0
    return n_batch * attention_chunk_rows(n_batch, rows, L, max_score_bytes) * L


def attention_call(g: Gpu, q, k, v, out, *, scores=None, max_score_bytes: int = ATTN_SCORE_BYTES):
    """A prepared softmax(Q·Kᵀ/√d)·V for grouped-query attention: returns a no-argument
    callable that issues it on the current stream (see :func:`attention`).

    Shapes: ``q`` (H_kv, G·n, d) — the G query heads sharing a KV head stacked with the n
    tokens; ``k``, ``v`` (H_kv, L, d); ``out`` (H_kv, G·n, d); all f16, each C-contiguous in
    its last two axes. Query rows are taken in chunks of :func:`attention_chunk_rows` so that
    one chunk's f16 score block S (H_kv, chunk, L) stays under ``max_score_bytes``; per chunk
    three launches: ``S = Q·Kᵀ`` (strided-batched cuBLAS GEMM, f32 accumulation, f16 out),
    ``softmax_rows_f16`` on S in place (one block per row, f32 math, scale 1/√d), and
    ``out = S·V`` (the same GEMM). No causal mask: every query sees all L keys (the cost of
    the full rectangle).

    Args:
        scores: a 1-D f16 device array of at least :func:`attention_score_elems` elements
            for S, reused by every chunk and every call (calls on one stream may share it);
            None allocates one here, once.
        max_score_bytes: cap on one chunk's score block, bytes.

    Everything (argument lists, views, the score buffer) is built here, once; a call only
    launches. On the numpy stand-in, or without :attr:`Gpu.batched_gemm`, the GEMMs run as
    loops of 2-D matmuls (:func:`bgemm`); the softmax is always the kernel (the stand-in
    runs a numpy twin of it).

    Raises:
        ValueError: no keys, or ``scores`` not a large enough 1-D f16 array.
    """
    cp = g.cp
    hkv, rows, d = (int(x) for x in q.shape)
    L = int(k.shape[1])
    if hkv == 0 or rows == 0:
        return lambda: None
    if L <= 0:
        raise ValueError("attention needs at least one key")
    chunk = attention_chunk_rows(hkv, rows, L, max_score_bytes)
    need = hkv * chunk * L
    if scores is None:
        scores = cp.empty(need, dtype=cp.float16)
    elif scores.ndim != 1 or scores.dtype != np.float16 or scores.size < need:
        raise ValueError(f"attention scores: need a 1-D float16 array of >= {need} elements, got "
                         f"{scores.dtype} {tuple(scores.shape)}")
    prepared = bool(g.batched_gemm) and not getattr(cp, "IS_FAKE", False)

    def gemm(a, b, c, trans_b=False):
        if prepared:
            return bgemm_call(g, a, b, c, trans_b=trans_b)
        return lambda: bgemm(g, a, b, c, trans_b=trans_b, use_batched=False)

    kern, block = g.softmax, (SOFTMAX_THREADS,)
    len_arg, scale = np.int32(L), np.float32(1.0 / math.sqrt(d))
    steps = []
    for r0 in range(0, rows, chunk):
        r1 = min(rows, r0 + chunk)
        s = scores[: hkv * (r1 - r0) * L].reshape(hkv, r1 - r0, L)
        steps.append((gemm(q[:, r0:r1], k, s, trans_b=True), (hkv * (r1 - r0),), (s, len_arg, scale),
                      gemm(s, v, out[:, r0:r1])))
    def run_chunks() -> None:
        for qk_, grid_, args_, pv_ in steps:
            qk_()
            kern(grid_, block, args_)
            pv_()

    return run_chunks


def attention(g: Gpu, q, k, v, out, *, max_score_bytes: int = ATTN_SCORE_BYTES) -> None:
    """softmax(Q·Kᵀ/√d)·V for grouped-query attention, on the current stream: prepares
    :func:`attention_call` (shapes and method there; its score buffer allocated here) and
    runs it once."""
    attention_call(g, q, k, v, out, max_score_bytes=max_score_bytes)()


def measure_attention(g: Gpu, n_tokens: int, kv_len: int, n_head: int, n_head_kv: int, head_dim: int, *,
                      reps: int = 3) -> dict:
    """Device time (``t_s``) and host issue time (``t_host_s``) of one prepared
    :func:`attention_call` — the executor's attention — for ``n_tokens`` new tokens over
    ``kv_len`` cached ones (L = kv_len + n_tokens keys), seconds."""
    cp = g.cp
    grp = n_head // n_head_kv
    L = kv_len + n_tokens
    q = (g.rng.standard_normal((n_head_kv, grp * n_tokens, head_dim), dtype=cp.float32)).astype(cp.float16)
    kk = (g.rng.standard_normal((n_head_kv, L, head_dim), dtype=cp.float32)).astype(cp.float16)
    vv = (g.rng.standard_normal((n_head_kv, L, head_dim), dtype=cp.float32)).astype(cp.float16)
    out = cp.empty_like(q)
    call = attention_call(g, q, kk, vv, out)
    t = gpu_time(g, lambda _i: call(), reps, warmup=1)
    # host time to issue the prepared launches (two cuBLAS calls and the softmax kernel per
    # chunk), as the executor does: when it exceeds the device time, the op spans the launches
    th = []
    for _ in range(reps):
        g.stream.synchronize()
        with g.stream:
            t0 = perf()
            call()
            th.append(perf() - t0)
    g.stream.synchronize()
    return {"n_tokens": n_tokens, "kv_len": kv_len, "n_head": n_head, "n_head_kv": n_head_kv,
            "head_dim": head_dim, "t_s": float(np.median(t)), "t_min_s": float(t.min()),
            "t_max_s": float(t.max()), "n_rep": reps, "t_host_s": float(np.median(th))}


# ---------------------------------------------------------------------------------------
# HBM and host-side overheads
# ---------------------------------------------------------------------------------------


def measure_hbm(g: Gpu, nbytes: int = 2 * 2**30, reps: int = 5) -> dict:
    """Device-memory bandwidth: a device-to-device ``cudaMemcpyAsync`` and an elementwise
    copy kernel of ``nbytes``, counting bytes read plus bytes written."""
    cp = g.cp
    a = cp.empty(nbytes, dtype=cp.uint8)
    a.view(cp.uint32)[:] = 7
    b = cp.empty_like(a)
    t_memcpy = gpu_time(g, lambda _i: g.rt.memcpyAsync(int(b.data.ptr), int(a.data.ptr), nbytes, D2D, g.stream.ptr),
                        reps, warmup=1)
    af, bf = a.view(cp.float32), b.view(cp.float32)
    t_kernel = gpu_time(g, lambda _i: cp.copyto(bf, af), reps, warmup=1)
    return {"nbytes": nbytes,
            "memcpy_d2d_gb_per_s": 2 * nbytes / float(np.median(t_memcpy)) / 1e9,
            "kernel_copy_gb_per_s": 2 * nbytes / float(np.median(t_kernel)) / 1e9,
            "memcpy_d2d_t_s": float(np.median(t_memcpy)), "kernel_copy_t_s": float(np.median(t_kernel))}


def _host_samples(fn: Callable[[], Any], n: int) -> np.ndarray:
    """Host wall time (s) of each of ``n`` calls of ``fn()``, shape (n,)."""
    out = np.empty(n)
    for i in range(n):
        t0 = perf()
        fn()
        out[i] = perf() - t0
    return out


def _host_loop(fn: Callable[[], Any], n: int) -> float:
    t0 = perf()
    for _ in range(n):
        fn()
    return (perf() - t0) / n


def measure_overheads(g: Gpu, n: int = 2000) -> dict:
    """Host costs, seconds per call, on the host clock: event record, stream wait on a
    completed event, stream synchronize on an idle stream, launches (empty kernel, a small
    ``cupy.dot``, the same GEMM as a prepared cuBLAS call — the executor's path —, a 4 KiB
    pinned ``cudaMemcpyAsync``), an empty Python call (the floor of any call from Python),
    and the host's wake-up after a kernel it synchronised on."""
    cp = g.cp
    s = g.stream
    ev = g.event()
    ev.record(s)
    s.synchronize()
    out: dict[str, float] = {"n_calls": n}
    out["python_call_s"] = _host_loop(lambda: None, n)
    out["event_record_s"] = _host_loop(lambda: ev.record(s), n)
    s.synchronize()
    out["stream_wait_event_s"] = _host_loop(lambda: g.copy_stream.wait_event(ev), n)
    g.copy_stream.synchronize()
    out["stream_sync_idle_s"] = _host_loop(s.synchronize, n)
    with s:
        out["launch_noop_s"] = _host_loop(lambda: g.noop((1,), (1,), ()), n)
    s.synchronize()
    a = cp.ones((64, 64), dtype=cp.float16)
    c = cp.empty_like(a)
    with s:
        cp.dot(a, a, out=c)
        out["launch_dot_s"] = _host_loop(lambda: cp.dot(a, a, out=c), n // 4)
    s.synchronize()
    if g.batched_gemm:
        a3, c3 = a.reshape(1, 64, 64), c.reshape(1, 64, 64)
        call = bgemm_call(g, a3, a3, c3)
        with s:
            call()
            out["launch_cublas_s"] = _host_loop(call, n // 4)
        s.synchronize()
    pinned = alloc_pinned(g, 4096)
    dst = cp.empty(4096, dtype=cp.uint8)
    out["issue_memcpy_pinned_s"] = _host_loop(
        lambda: g.rt.memcpyAsync(int(dst.data.ptr), _ptr_host(pinned), 4096, H2D, s.ptr), n // 4)
    s.synchronize()
    # wake-up: host time of (launch spin of known device time; sync) minus device time and launch
    wake = []
    for _ in range(20):
        e0, e1 = g.event(), g.event()
        t0 = perf()
        e0.record(s)
        g.spin_for(200e-6, s)
        e1.record(s)
        s.synchronize()
        host = perf() - t0
        wake.append(host - g.elapsed_s(e0, e1))
    wake_arr = np.array(wake)
    # host - device time = (t0 .. the GPU executing e0) + (the GPU executing e1 .. return);
    # the first part is about one event-record call
    out["sync_wake_s"] = float(np.median(wake_arr) - out["event_record_s"])
    out["sync_wake_raw_s"] = float(np.median(wake_arr))
    out["sync_wake_max_s"] = float(wake_arr.max())
    return out


def measure_spin_accuracy(g: Gpu, seconds: float = 1e-3) -> float:
    """Device time of a spin kernel asked to hold ``seconds`` (checks the timer it uses)."""
    t = gpu_time(g, lambda _i: g.spin((1,), (1,), (np.uint64(int(seconds * 1e9)),)), 3, warmup=1)
    return float(np.median(t))


# ---------------------------------------------------------------------------------------
# CPU (host) side
# ---------------------------------------------------------------------------------------


def measure_cpu(nbytes: int = 2**30, reps: int = 5, gemm_n: int = 4096) -> dict:
    """Host DRAM bandwidth of a numpy float32 matrix-vector product over ``nbytes`` of
    matrix (the CPU backend's decode matvec is memory-bound), and numpy float32 GEMM FLOP/s.
    Runs on the host only (no GPU)."""
    cols = 16384
    rows = max(1, nbytes // 4 // cols)
    a = np.empty((rows, cols), dtype=np.float32)
    a[:] = 0.25
    x = np.linspace(-1.0, 1.0, cols, dtype=np.float32)
    a @ x  # warm-up: page faults, BLAS threads
    tm = _host_samples(lambda: a @ x, reps)
    a = None  # free the 1 GiB matrix
    rng = np.random.default_rng(0)
    b = rng.standard_normal((gemm_n, gemm_n), dtype=np.float32)
    b @ b
    tg = _host_samples(lambda: b @ b, 3)
    flops = 2.0 * gemm_n**3
    # small matvecs (decode-sized expert slices): per-call cost = intercept of t vs bytes
    small_b, small_t = [], []
    for nb in (2**18, 2**20, 2**22, 2**24):
        k = 2048
        r = max(1, nb // 4 // k)
        m_ = np.full((r, k), 0.5, dtype=np.float32)
        v = np.linspace(-1, 1, k, dtype=np.float32)
        m_ @ v
        small_b.append(r * k * 4)
        small_t.append(float(np.median(_host_samples(lambda: m_ @ v, 9))))
    slope, icpt = np.polyfit(np.array(small_b, float), np.array(small_t), 1)
    return {"matvec_small_bytes": small_b, "matvec_small_t_s": small_t, "matvec_call_s": float(max(icpt, 0.0)),
            "matvec_bytes": int(rows * cols * 4), "matvec_t_s": float(np.median(tm)),
            "matvec_gb_per_s": rows * cols * 4 / float(np.median(tm)) / 1e9,
            "matvec_gb_per_s_min": rows * cols * 4 / float(tm.max()) / 1e9,
            "matvec_gb_per_s_max": rows * cols * 4 / float(tm.min()) / 1e9,
            "sgemm_n": gemm_n, "sgemm_tflops": flops / float(np.median(tg)) / 1e12, "threads": os.cpu_count() or 0}


class PageableSampler:
    """Pageable H2D copies sampled at intervals through a calibration run.

    On the lent H200 VM the speed of a pageable copy follows the host's memcpy speed (a
    ``numpy.copyto`` of the same 64 MiB window just before it correlates with it at +0.89 and
    +0.72 in two runs of ``benchmarks/bench_pageable.py``), and it moves between levels (e.g.
    ≈ 6.3 and ≈ 8.6 GB/s) that lasted from under a second to 9 s, whatever CPU the thread was
    pinned to and whichever part of the buffer was read (``data/validation/history/diag/``).
    A window of a few seconds can sit in one level; samples spread over the run see several.
    Each sample is ``reps`` back-to-back copies of ``copy_bytes`` (device time; the source moves
    through the buffer, :func:`host_offset`, so it is not in the CPU caches), as a run's copies
    follow one another, and not after an idle pause: the host series' copies, each after a
    0.25 s sleep and two matvecs, read 3–20% below the same calibration's back-to-back sweep
    copies of 32 MiB and more in 12 of 13 calibrations (runs 12–24, ``data/calibration``).

    Args:
        g: the opened GPU; bufs: the copy buffers (pageable source, device destination).
        copy_bytes: bytes per copy (capped at the buffer), > 0.
        interval_s: least time between samples, seconds, >= 0; :meth:`maybe_sample` does
            nothing sooner (0: a sample at every call).
        reps: copies per sample, >= 1.

    Raises:
        ValueError: ``copy_bytes`` or the buffer is empty, ``reps`` < 1 or ``interval_s`` < 0.
    """

    def __init__(self, g: Gpu, bufs: HostBuffers, *, copy_bytes: int = 64 * 2**20, interval_s: float = 1.0,
                 reps: int = 2):
        if copy_bytes <= 0 or bufs.nbytes <= 0 or reps < 1 or not interval_s >= 0:
            raise ValueError(f"PageableSampler needs copy_bytes > 0 (got {copy_bytes}), a non-empty buffer "
                             f"(got {bufs.nbytes} bytes), reps >= 1 (got {reps}) and interval_s >= 0 "
                             f"(got {interval_s})")
        self.g, self.bufs = g, bufs
        self.nbytes = int(min(copy_bytes, bufs.nbytes))
        self.interval_s, self.reps = float(interval_s), int(reps)
        self.t0 = perf()
        self.last_at = -math.inf
        self.t_at_s: list[float] = []
        self.t_s: list[float] = []
        self._i = 0

    def sample(self) -> None:
        """Take one sample now: ``reps`` copies, appended to ``t_s`` (device time of each,
        seconds) with their time since the sampler was made in ``t_at_s`` (seconds)."""
        src, dst = _ptr_host(self.bufs.pageable), int(self.bufs.device.data.ptr)
        for _ in range(self.reps):
            off = host_offset(self._i, self.nbytes, self.bufs.nbytes)
            self._i += 1
            d, _h = copy_series(self.g, dst, src + off, self.nbytes, H2D, 1, spin=False, warmup=0)
            self.t_s.append(float(d[0]))
            self.t_at_s.append(perf() - self.t0)
        self.last_at = perf()

    def maybe_sample(self) -> None:
        """:meth:`sample` if ``interval_s`` has passed since the last one."""
        if perf() - self.last_at >= self.interval_s:
            self.sample()

    def result(self) -> dict:
        """``{"t_s": [...], "t_at_s": [...], "page_bytes": int, "interval_s": float, "reps": int}``:
        copy device times and their times since the start (seconds), bytes per copy, the least
        interval between samples (seconds) and copies per sample."""
        return {"t_s": list(self.t_s), "t_at_s": list(self.t_at_s), "page_bytes": self.nbytes,
                "interval_s": self.interval_s, "reps": self.reps}


def measure_host_series(g: Gpu, bufs: HostBuffers, *, seconds: float = 15.0, copy_bytes: int = 64 * 2**20,
                        small_bytes: int = 8 * 2**20, big_bytes: int = 64 * 2**20, k: int = 2048,
                        pool_bytes: int = 2**30, interval_s: float = 0.25) -> dict:
    """The host-dependent paths sampled repeatedly over ``seconds``, for medians that do not
    hang on one moment of a noisy host.

    On a shared or virtualised host the pageable-copy bandwidth and the CPU matvec bandwidth
    change from one second to the next (on the lent H200 VM, probes 0.35 s apart spread
    5.8–9.6 GB/s and 68–123 GB/s, ``data/validation/*_drift.csv``); a figure taken from a few
    samples at one moment can sit 10–20% off the typical. Each sample here, ``interval_s``
    apart, is: one pageable H2D copy of ``copy_bytes`` (device time; its host source moves
    through the buffer so it is not in the CPU caches) and two float32 matvecs of ``small_bytes``
    and ``big_bytes`` on windows of a ``pool_bytes`` matrix pool (the small windows in one half,
    the large ones in the other), ``k`` columns, each window
    read once per pass as the executor's CPU ops read a model's weights (cold, from DRAM),
    right after two untimed matvecs on a 4 MiB cache-resident matrix that wake the BLAS worker
    threads (parked after the pause: parked threads added ~200 µs to the first matvec on the
    H200 VM, which is not the cost of an op in a run of CPU-backend ops; a 256 KiB matvec did
    not wake them, BLAS runs it on one thread).

    Returns:
        dict of sample lists (seconds): ``page_t_s`` (copy), ``mv_small_t_s``, ``mv_big_t_s``,
        and the sizes used.
    """
    t_end = perf() + seconds
    # the small windows in the first half of the pool, the large ones in the second: a small
    # window never lies inside a large one read a moment before (it would be cache-warm)
    half = pool_bytes // 2
    n_win_small = max(1, half // small_bytes)
    n_win_big = max(1, half // big_bytes)
    pool = np.empty(pool_bytes // 4, dtype=np.float32)
    pool[:] = 0.25
    x = np.linspace(-1.0, 1.0, k, dtype=np.float32)
    rows_s, rows_b = small_bytes // 4 // k, big_bytes // 4 // k
    # a matvec large enough for BLAS to use all its threads, small enough to stay in the caches
    wake = np.full((max(1, min(small_bytes, 4 * 2**20) // 4 // k), k), 0.5, dtype=np.float32)
    page, small, big = [], [], []
    dev = int(bufs.device.data.ptr)
    src = _ptr_host(bufs.pageable)
    i = 0
    while perf() < t_end or i < 5:
        nb = min(copy_bytes, bufs.nbytes)
        d, _h = copy_series(g, dev, src + host_offset(i, nb, bufs.nbytes), nb, H2D, 1, spin=False, warmup=0)
        page.append(float(d[0]))
        # after the copy and the pause the BLAS worker threads are parked; the CPU backend's
        # ops of one layer run back to back, so wake them first (untimed; a small matvec runs
        # single-threaded and would not)
        wake @ x
        wake @ x
        o = (i % n_win_small) * rows_s * k
        a = pool[o: o + rows_s * k].reshape(rows_s, k)
        small.append(float(_host_samples(lambda: a @ x, 1)[0]))
        o = half // 4 + (i % n_win_big) * rows_b * k
        b = pool[o: o + rows_b * k].reshape(rows_b, k)
        big.append(float(_host_samples(lambda: b @ x, 1)[0]))
        i += 1
        time.sleep(interval_s)
    return {"page_t_s": page, "page_bytes": int(min(copy_bytes, bufs.nbytes)), "mv_small_t_s": small,
            "mv_big_t_s": big, "mv_small_bytes": int(rows_s * k * 4), "mv_big_bytes": int(rows_b * k * 4),
            "seconds": seconds, "n": i, "pool_bytes": int(pool_bytes)}
