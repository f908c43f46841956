"""A numpy stand-in for the small part of CuPy that :mod:`calibrate` uses.

It exists so that the calibration pipeline and the executor can be run end to end on a
machine without a GPU (the CPU tests, ``python -m calibrate --fake-gpu``). "Device" arrays
are numpy arrays in host memory, so raw pointers are real addresses and
``cudaMemcpyAsync`` is a ``memmove``; every stream executes its work immediately
(synchronously), and events read the host clock. The numbers it produces mean nothing; the
code paths, shapes, files and checks are the real ones.

Only the attributes :mod:`calibrate.measure` and :mod:`calibrate.executor` touch exist.
"""

from __future__ import annotations

import ctypes
import itertools
import time

import numpy as np

IS_FAKE = True
__version__ = "fake-numpy"

float16 = np.float16
float32 = np.float32
float64 = np.float64
int32 = np.int32
int64 = np.int64
uint8 = np.uint8
uint32 = np.uint32
uint64 = np.uint64


class _Ptr:
    __slots__ = ("ptr",)

    def __init__(self, ptr: int):
        self.ptr = ptr


class FakeArray(np.ndarray):
    """A numpy array that answers ``.data.ptr`` and ``.get()`` like a CuPy array."""

    @property
    def data(self):  # type: ignore[override]
        return _Ptr(int(self.__array_interface__["data"][0]))

    def get(self, stream=None, out=None, order="C", blocking=True):
        a = np.asarray(self)
        if out is not None:
            out[...] = a
            return out
        return a.copy()


def _wrap(a) -> FakeArray:
    return np.asarray(a).view(FakeArray)


def empty(shape, dtype=np.float32):
    return _wrap(np.empty(shape, dtype=dtype))


def zeros(shape, dtype=np.float32):
    return _wrap(np.zeros(shape, dtype=dtype))


def ones(shape, dtype=np.float32):
    return _wrap(np.ones(shape, dtype=dtype))


def empty_like(a, dtype=None):
    return _wrap(np.empty_like(np.asarray(a), dtype=dtype))


def arange(*args, **kw):
    return _wrap(np.arange(*args, **kw))


def asarray(a, dtype=None):
    return _wrap(np.array(a, dtype=dtype, copy=True))


def ascontiguousarray(a):
    return _wrap(np.ascontiguousarray(np.asarray(a)))


def asnumpy(a):
    return np.array(a, copy=True).view(np.ndarray)


def empty_pinned(nbytes: int, dtype=np.uint8) -> np.ndarray:
    """Host memory (plain numpy here; ``cupyx.empty_pinned`` on a GPU)."""
    return np.empty(nbytes, dtype=dtype)


def dot(a, b, out=None):
    res = np.dot(np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32))
    if out is None:
        return _wrap(res.astype(np.result_type(a.dtype, b.dtype)))
    np.asarray(out)[...] = res
    return out


matmul = dot


def add(x, y, out=None):
    return np.add(x, y, out=out)


def exp(x, out=None):
    return np.exp(x, out=out)


def copyto(dst, src):
    np.copyto(dst, src)


# -- runtime / streams / events -------------------------------------------------------


class _Runtime:
    memcpyHostToDevice = 1
    memcpyDeviceToHost = 2
    memcpyDeviceToDevice = 3
    CUDA_R_16F = 2
    CUDA_R_16BF = 14

    @staticmethod
    def getDeviceCount() -> int:
        return 1

    @staticmethod
    def getDeviceProperties(i: int) -> dict:
        return {"name": b"FakeGPU (numpy stand-in)", "major": 0, "minor": 0, "multiProcessorCount": 1,
                "l2CacheSize": 0}

    @staticmethod
    def memGetInfo() -> tuple[int, int]:
        return 15 * 2**30, 16 * 2**30

    @staticmethod
    def driverGetVersion() -> int:
        return 0

    @staticmethod
    def runtimeGetVersion() -> int:
        return 0

    @staticmethod
    def deviceSynchronize() -> None:
        return None

    @staticmethod
    def memcpyAsync(dst: int, src: int, size: int, kind: int, stream: int) -> None:
        if size:
            ctypes.memmove(int(dst), int(src), int(size))


_ids = itertools.count(1)
_stream_stack: list = []


class Stream:
    def __init__(self, null: bool = False, non_blocking: bool = False, ptds: bool = False, priority: int = 0):
        self.ptr = 0 if null else next(_ids)

    def synchronize(self) -> None:
        return None

    def wait_event(self, event) -> None:
        return None

    def record(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def use(self):
        return self

    def __enter__(self):
        _stream_stack.append(self)
        return self

    def __exit__(self, *exc):
        _stream_stack.pop()
        return False


class Event:
    def __init__(self, block: bool = False, disable_timing: bool = False, interprocess: bool = False):
        self.t = None
        self.ptr = next(_ids)

    def record(self, stream=None) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        return None

    @property
    def done(self) -> bool:
        return True


def get_elapsed_time(start: Event, end: Event) -> float:
    if start.t is None or end.t is None:
        raise RuntimeError("event not recorded")
    return (end.t - start.t) * 1e3


class Device:
    def __init__(self, i: int = 0):
        self.id = i
        self.compute_capability = "00"

    def use(self):
        return None

    def synchronize(self):
        return None


class _Cuda:
    runtime = _Runtime
    Stream = Stream
    Event = Event
    Device = Device
    get_elapsed_time = staticmethod(get_elapsed_time)


cuda = _Cuda


# -- kernels ----------------------------------------------------------------------------


def _probe_words(grid, block, args):
    addrs, n, out = args
    o = np.asarray(out)
    for i in range(int(n)):
        o[i] = ctypes.c_uint32.from_address(int(addrs[i])).value


def _softmax_rows_f16(grid, block, args):
    """numpy twin of ``softmax_rows_f16``: ``grid[0]`` rows of ``L`` f16 values back to back
    from the array's address become ``softmax(row * scale)`` in f16, in place; f32 math in the
    kernel's order (max of the scaled row, sum of exponentials, exponential / sum)."""
    s, n_cols, scale = args
    rows, n_cols = int(grid[0]), int(n_cols)
    ptr = s.data.ptr if isinstance(s, FakeArray) else int(s.ctypes.data)
    a = np.ctypeslib.as_array((ctypes.c_uint16 * (rows * n_cols)).from_address(ptr)).view(np.float16)
    a = a.reshape(rows, n_cols)
    x = a.astype(np.float32) * np.float32(scale)
    x -= x.max(axis=1, keepdims=True)
    np.exp(x, out=x)
    x *= np.float32(1.0) / x.sum(axis=1, keepdims=True, dtype=np.float32)
    a[...] = x.astype(np.float16)


_KERNELS = {"spin_ns": lambda grid, block, args: None, "noop": lambda grid, block, args: None,
            "probe_words": _probe_words, "softmax_rows_f16": _softmax_rows_f16}


class RawKernel:
    def __init__(self, code: str, name: str, options=(), **kw):
        if name not in _KERNELS:
            raise NotImplementedError(f"fake RawKernel has no '{name}'")
        self.name = name
        self._fn = _KERNELS[name]

    def __call__(self, grid, block, args, **kw):
        self._fn(grid, block, args)


# -- random -----------------------------------------------------------------------------


class _Generator:
    def __init__(self, seed):
        self._g = np.random.default_rng(seed)

    def standard_normal(self, size=None, dtype=np.float64):
        return _wrap(self._g.standard_normal(size, dtype=dtype))

    def random(self, size=None, dtype=np.float64):
        return _wrap(self._g.random(size, dtype=dtype))


class _Random:
    @staticmethod
    def default_rng(seed=None):
        return _Generator(seed)


random = _Random
