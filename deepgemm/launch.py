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

Programmatic dependent launch (PDL): a kernel whose every global access follows
griddepcontrol.wait (KernelSpec.pdl) is launched through cuLaunchKernelEx with the
programmatic-stream-serialization attribute, on sm_90 and later. It may then start while the
previous kernel on the stream is finishing: its blocks' set-up overlaps that kernel's exit and the
flush of its writes, and the wait inside returns once that kernel has completed and its writes are
visible. Chains of GEMMs (an MLP's layers, a decode step's projections) lose part of the gap between
kernels (docs/performance.md, programmatic dependent launch). Stream capture keeps the dependency as
a programmatic edge of the graph. DEEPGEMM_PDL=0 launches every kernel the plain way (read when a
launch is planned: after deepgemm.clear_caches() it counts for shapes already seen too).
"""
from __future__ import annotations

import ctypes
import itertools
import os
import struct
import threading
from functools import lru_cache

from deepgemm.params import PARAMS_DTYPE, POINTER_FIELDS

_OFFSETS = [PARAMS_DTYPE.fields[name][1] for name in POINTER_FIELDS]
# The operand pointers are consecutive uint64 fields of GemmParams: one pack_into updates them all.
assert _OFFSETS == list(range(_OFFSETS[0], _OFFSETS[0] + 8 * len(_OFFSETS), 8)), _OFFSETS
_POINTERS = struct.Struct(f"<{len(_OFFSETS)}Q")
_U64 = struct.Struct("<Q")


PDL_ENV = "DEEPGEMM_PDL"

# CUlaunchConfig (cuda.h, 64-bit): grid x, y, z, block x, y, z, sharedMemBytes (unsigned int each),
# then hStream, attrs (pointers, 8-aligned) and numAttrs. CUlaunchAttribute: the id (an enum) padded
# to 8 bytes, then a 64-byte value union; CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION is
# 6, its value an int (1: allowed).
_CONFIG = struct.Struct("<7I4xQQI4x")
_CONFIG_STREAM = 32   # hStream's offset: the one field a replay changes
_ATTRIBUTE = struct.Struct("<I4xi60x")
_PROGRAMMATIC_STREAM_SERIALIZATION = 6
assert (_CONFIG.size, _ATTRIBUTE.size) == (56, 72)


def pdl_enabled() -> bool:
    """Whether kernels that support it are launched as programmatic dependents (the default;
    DEEPGEMM_PDL=0 turns it off)."""
    return os.environ.get(PDL_ENV, "1") != "0"


@lru_cache(maxsize=1)
def driver_launch_ex():
    """cuLaunchKernelEx(const CUlaunchConfig*, CUfunction, void** kernelParams, void** extra) from
    the libcuda.so.1 CuPy loaded, through ctypes (CuPy binds no cuLaunchKernelEx); returns the
    CUresult."""
    lib = ctypes.CDLL("libcuda.so.1")
    fn = lib.cuLaunchKernelEx
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p] * 4
    return fn


def driver_error_name(status: int) -> str:
    """The CUresult's name (cuGetErrorName), or its number where the driver has none."""
    try:
        name = ctypes.c_char_p()
        if ctypes.CDLL("libcuda.so.1").cuGetErrorName(int(status), ctypes.byref(name)) == 0 and name.value:
            return name.value.decode()
    except OSError:
        pass
    return f"CUresult {status}"


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

    __slots__ = ("name", "function", "pdl", "_handle", "_dims", "_initial", "_starts", "_tail", "_bind_context",
                 "_cu", "_local")

    def __init__(self, name: str, function, grid, block, smem: int, initial: list[bytes],
                 bind_context=None, cu_launch=None, pdl: bool = False):
        """function: the CUfunction's owner (a CuPy Function: `.ptr`; kept to keep its module
        loaded). initial: each argument's bytes as launched by the full path (GemmParams or
        GroupedGemmParams first).
        bind_context: called once per thread before its first launch, with the kernel's device
        current. pdl: launch as a programmatic dependent (cuLaunchKernelEx, see above).
        cu_launch: the driver call's stand-in, for tests (cuLaunchKernelEx's where pdl)."""
        self.name, self.function, self._handle, self.pdl = name, function, int(function.ptr), bool(pdl)
        pad = lambda dims: [max(1, int(x)) for x in (tuple(dims) + (1, 1))[:3]]   # as CuPy's launch does
        self._dims = (*pad(grid), *pad(block), int(smem))
        self._initial = b"".join(initial)
        self._starts = [0] + list(itertools.accumulate(map(len, initial)))[:-1]
        # GemmParams, or the grouped builds' GroupedGemmParams (GemmParams' fields first, at the same offsets)
        assert len(initial[0]) >= PARAMS_DTYPE.itemsize, "the first argument must be GemmParams"
        self._tail = len(self._initial) - len(initial[0])   # bytes of the arguments after it
        self._bind_context = bind_context
        self._cu = cu_launch or (driver_launch_ex() if self.pdl else driver_launch())
        self._local = threading.local()

    def _buffers(self):
        """This thread's argument bytes, a view of them, the void*[] of where each argument starts
        in them, that array's address (what the driver call takes), and with pdl the launch config
        (stream 0 until a launch sets it; its attribute array kept alive with it)."""
        if self._bind_context is not None:
            self._bind_context()
        buf = ctypes.create_string_buffer(self._initial, len(self._initial))
        base = ctypes.addressof(buf)
        argv = (ctypes.c_void_p * len(self._starts))(*(base + s for s in self._starts))
        config = None
        if self.pdl:
            attribute = ctypes.create_string_buffer(_ATTRIBUTE.pack(_PROGRAMMATIC_STREAM_SERIALIZATION, 1),
                                                    _ATTRIBUTE.size)
            config = ctypes.create_string_buffer(_CONFIG.pack(*self._dims, 0, ctypes.addressof(attribute), 1),
                                                 _CONFIG.size)
            config = (config, ctypes.addressof(config), attribute)
        state = self._local.state = (buf, memoryview(buf).cast("B"), argv, ctypes.addressof(argv), config)
        return state

    def launch_as_built(self, stream: int) -> None:
        """Launch with the arguments as the full path built them (`initial`): a full-path call;
        replays then repack this thread's buffers."""
        self._launch(stream, self._buffers())

    def __call__(self, stream: int, pointers, tail: bytes = b"") -> None:
        """Launch on `stream` (a raw handle) with GemmParams' operand pointers (a, b, d, bias,
        scale, c) and `tail`, the bytes of every later argument one after the other (V5's maps:
        what the kernel's parameters after GemmParams hold, each as long as in `initial`)."""
        try:
            state = self._local.state
        except AttributeError:
            state = self._buffers()
        buf, view = state[0], state[1]
        _POINTERS.pack_into(buf, _OFFSETS[0], *pointers)
        if tail or self._tail:
            if len(tail) != self._tail:   # never launch with stale bytes
                raise ValueError(f"kernel {self.name}: {len(tail)} bytes of arguments after GemmParams, "
                                 f"expected {self._tail}")
            view[len(view) - self._tail:] = tail
        self._launch(stream, state)

    def _launch(self, stream: int, state) -> None:
        argv_address, config = state[3], state[4]
        if config is not None:
            _U64.pack_into(config[0], _CONFIG_STREAM, stream)
            status = self._cu(config[1], self._handle, argv_address, None)
            if status:
                raise RuntimeError(f"launching kernel {self.name}: cuLaunchKernelEx failed with CUresult {status}: "
                                   f"{driver_error_name(status)}")
            return
        try:
            self._cu(self._handle, *self._dims, stream, argv_address, 0)
        except Exception as exc:   # the driver's error, with the kernel it was launching
            status = getattr(exc, "status", None)   # CuPy's CUDADriverError carries the CUresult
            code = f" with CUresult {status}" if status is not None else ""
            raise RuntimeError(f"launching kernel {self.name}: cuLaunchKernel failed{code}: {exc}") from exc
