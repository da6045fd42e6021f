"""Replayed launches (api's plan cache) straight through the driver's cuLaunchKernel.

CuPy's kernel call converts every argument (GemmParams, V5's 128-byte tensor maps) on every launch:
~15 us of a 17.6 us repeat gemm() on the H200 machine's host (cProfile). A plan's arguments have
fixed sizes and only the six operand pointers in GemmParams (and the maps built from them) change,
so the argument bytes live in a buffer updated in place, which cuLaunchKernel reads through a
prebuilt void*[].

The call goes through CuPy's binding of cuLaunchKernel (`cupy.cuda.driver.launchKernel`, compiled
Cython with typed arguments): 4.7-4.9 us per call on the H200 machine's host, against 5.8-6.1 us for
the same call through ctypes, same function and argument buffer, one run. CuPy is imported at the
first Launcher, never at import.
"""
from __future__ import annotations

import ctypes
import itertools
import struct
import threading
from functools import lru_cache

from deepgemm.params import PARAMS_DTYPE, POINTER_FIELDS

_OFFSETS = [PARAMS_DTYPE.fields[name][1] for name in POINTER_FIELDS]
# The operand pointers are consecutive uint64 fields of GemmParams: one pack_into updates them all.
assert _OFFSETS == list(range(_OFFSETS[0], _OFFSETS[0] + 8 * len(_OFFSETS), 8)), _OFFSETS
_POINTERS = struct.Struct(f"<{len(_OFFSETS)}Q")


@lru_cache(maxsize=1)
def driver_launch():
    """cuLaunchKernel as CuPy binds it: launchKernel(function, grid x, y, z, block x, y, z,
    sharedMemBytes, stream, kernelParams, extra), every argument an int (the handles and the address
    of the void*[] as size_t); raises CuPy's CUDADriverError, which names the CUresult, on failure."""
    from cupy.cuda import driver
    return driver.launchKernel


class Launcher:
    """One kernel launch with fixed grid, block and dynamic shared memory, whose arguments are
    GemmParams (with new operand pointers per call) and then arguments of fixed sizes (V5's maps).

    Thread safety: the binding may release the GIL while cuLaunchKernel runs, so a buffer shared
    between threads could be repacked by another thread before the driver has copied it. Each thread
    has its own buffers (threading.local: one attribute lookup per call, no lock held across a driver
    call that can block when the launch queue is full)."""

    __slots__ = ("name", "function", "_handle", "_dims", "_initial", "_starts", "_tail", "_bind_context", "_cu",
                 "_local")

    def __init__(self, name: str, function, grid, block, smem: int, initial: list[bytes],
                 bind_context=None, cu_launch=None):
        """function: the CUfunction's owner (a CuPy Function: `.ptr`; kept to keep its module
        loaded). initial: each argument's bytes as launched by the full path (GemmParams first).
        bind_context: called once per thread before its first launch, with the kernel's device
        current. cu_launch: cuLaunchKernel's stand-in, for tests."""
        self.name, self.function, self._handle = name, function, int(function.ptr)
        pad = lambda dims: [max(1, int(x)) for x in (tuple(dims) + (1, 1))[:3]]   # as CuPy's launch does
        self._dims = (*pad(grid), *pad(block), int(smem))
        self._initial = b"".join(initial)
        self._starts = [0] + list(itertools.accumulate(map(len, initial)))[:-1]
        self._tail = len(self._initial) - PARAMS_DTYPE.itemsize   # bytes of the arguments after GemmParams
        assert len(initial[0]) == PARAMS_DTYPE.itemsize, "the first argument must be GemmParams"
        self._bind_context, self._cu = bind_context, cu_launch or driver_launch()
        self._local = threading.local()

    def _buffers(self):
        """This thread's argument bytes, a view of them, the void*[] of where each argument starts
        in them, and that array's address (what the driver call takes)."""
        if self._bind_context is not None:
            self._bind_context()
        buf = ctypes.create_string_buffer(self._initial, len(self._initial))
        base = ctypes.addressof(buf)
        argv = (ctypes.c_void_p * len(self._starts))(*(base + s for s in self._starts))
        state = self._local.state = (buf, memoryview(buf).cast("B"), argv, ctypes.addressof(argv))
        return state

    def ready(self) -> None:
        """Bind this thread's context (first use per thread) before other driver calls made for a
        launch, e.g. encoding V5's tensor maps, which fails in a thread without a context."""
        if not hasattr(self._local, "state"):
            self._buffers()

    def __call__(self, stream: int, pointers, tail: bytes = b"") -> None:
        """Launch on `stream` (a raw handle) with GemmParams' operand pointers (a, b, d, bias,
        scale, c) and `tail`, the bytes of every later argument one after the other (V5's maps:
        what the kernel's parameters after GemmParams hold, each as long as in `initial`)."""
        try:
            buf, view, _, argv_address = self._local.state
        except AttributeError:
            buf, view, _, argv_address = self._buffers()
        _POINTERS.pack_into(buf, _OFFSETS[0], *pointers)
        if tail or self._tail:
            if len(tail) != self._tail:   # never launch with stale bytes
                raise ValueError(f"kernel {self.name}: {len(tail)} bytes of arguments after GemmParams, "
                                 f"expected {self._tail}")
            view[PARAMS_DTYPE.itemsize:] = tail
        try:
            self._cu(self._handle, *self._dims, stream, argv_address, 0)
        except Exception as exc:   # the driver's error, with the kernel it was launching
            status = getattr(exc, "status", None)   # CuPy's CUDADriverError carries the CUresult
            code = f" with CUresult {status}" if status is not None else ""
            raise RuntimeError(f"launching kernel {self.name}: cuLaunchKernel failed{code}: {exc}") from exc
