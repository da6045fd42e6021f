"""A NumPy-backed stand-in for CuPy, so that the CPU tier can run the oracle's device branches.

deepgemm recognises a CuPy array by the module its type comes from and then imports cupy; here
`install(monkeypatch)` puts this stand-in in sys.modules as cupy (and cupyx.scipy.special), and its
arrays are NumPy arrays of a subclass that says it comes from cupy. The arithmetic is NumPy's, so
a device branch must give exactly the host's bits: what this checks is the branching, the choice
of formula (e.g. float16 rounded in float64 arithmetic rather than by a cast) and that only a few
numbers are brought back with .get(). CUDA's own numerics (cuBLAS's summation order, libm's erf)
are only exercised on a GPU.
"""
import math
import types

import numpy as np

NAME = "cupy"


class ndarray(np.ndarray):
    """A 'device' array: any operation on it gives another; .get() is the copy to the host."""
    __module__ = "cupy._core.core"
    fetched = []                               # the size of every copy to the host (class-wide)

    def get(self):
        ndarray.fetched.append(self.size)
        return np.array(self, copy=True, subok=False)


def _device(x):
    if isinstance(x, np.ndarray) and not isinstance(x, ndarray):
        return x.view(ndarray)
    if isinstance(x, tuple):
        return tuple(_device(v) for v in x)
    return x


def _lift(fn):
    def on_device(*args, **kwargs):
        return _device(fn(*args, **kwargs))
    return on_device


def _asarray(x, dtype=None):
    """A copy 'to the device'; a host array is never shared with it."""
    if isinstance(x, ndarray):
        return x if dtype is None else x.astype(dtype)
    return np.array(x, dtype=dtype, copy=True).view(ndarray)


def _matmul(a, b):
    # cuBLAS with 16-bit operands accumulates in fp32 and rounds to the operand dtype (run_case's
    # vendor reference); NumPy would sum in the 16-bit type.
    if a.dtype.itemsize == 2 and a.dtype == b.dtype:
        return _device(np.matmul(np.asarray(a, np.float32), np.asarray(b, np.float32)).astype(a.dtype))
    return _device(np.matmul(a, b))


class RandomState:
    """cupy.random.RandomState's two methods that deepgemm uses, from a NumPy Philox stream."""

    def __init__(self, seed, method=None):
        self.rng = np.random.Generator(np.random.Philox(seed))
        self.method = method

    def standard_normal(self, size, dtype=float):
        return self.rng.standard_normal(size, dtype=dtype).view(ndarray)

    def random_sample(self, size, dtype=float):
        return self.rng.random(size, dtype=dtype).view(ndarray)


class _Stream:
    def synchronize(self):
        pass


def _module():
    cupy = types.ModuleType(NAME)
    cupy.ndarray = ndarray
    cupy.asarray = _asarray
    cupy.matmul = _matmul
    cupy.random = types.SimpleNamespace(RandomState=RandomState)
    cupy.cuda = types.SimpleNamespace(curand=types.SimpleNamespace(CURAND_RNG_PSEUDO_PHILOX4_32_10=7),
                                      get_current_stream=_Stream)

    def __getattr__(name):
        value = getattr(np, name)
        return _lift(value) if callable(value) and not isinstance(value, type) else value
    cupy.__getattr__ = __getattr__
    return cupy


def _erf_module():
    special = types.ModuleType("cupyx.scipy.special")
    host_erf = np.frompyfunc(math.erf, 1, 1)
    special.erf = lambda x: _device(host_erf(x).astype(np.float64))
    return special


def install(monkeypatch):
    """Put the stand-in in sys.modules as cupy and cupyx.scipy.special; returns the cupy module."""
    cupy, special = _module(), _erf_module()
    cupyx = types.ModuleType("cupyx")
    cupyx.scipy = types.ModuleType("cupyx.scipy")
    cupyx.scipy.special = special
    for name, module in (("cupy", cupy), ("cupyx", cupyx), ("cupyx.scipy", cupyx.scipy),
                         ("cupyx.scipy.special", special)):
        monkeypatch.setitem(__import__("sys").modules, name, module)
    return cupy


def to_device(x):
    """A host array's copy as a stand-in device array."""
    return _asarray(x)


def module_of(x):
    """The installed stand-in for a stand-in array, numpy for anything else."""
    return __import__("sys").modules[NAME] if isinstance(x, ndarray) else np
