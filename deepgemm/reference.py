"""FP64 reference for deepgemm's GEMM, and exact rounding to the low-precision formats.

``reference_gemm`` evaluates ``D = act(alpha * (A @ B) + bias) * scale + beta * C`` in float64.
Inputs in float16/bfloat16/float32 convert to float64 exactly and their products are exact, so
the reference carries only float64 rounding (relative ~K * 2^-53), which ``deepgemm.testing.bounds``
absorbs. CuPy arrays and torch tensors are copied to the host; cupy/torch are never imported here
(an object is recognised by the module its type comes from), so this module works without them.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from deepgemm import dtypes

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)

NUMPY_DTYPES = {
    "float16": np.dtype(np.float16), "bfloat16": BFLOAT16,
    "float32": np.dtype(np.float32), "float64": np.dtype(np.float64),
}


def dtype_name(x) -> str:
    """'float16' | 'bfloat16' | 'float32' | 'float64' for a dtype in any spelling deepgemm.dtypes
    accepts, or for an array/tensor (its dtype)."""
    try:
        return dtypes.canonical(x, "dtype", dtypes.REFERENCE_DTYPES)
    except TypeError:
        dt = getattr(x, "dtype", None)
        if dt is None or isinstance(x, (str, type)) or dt is x:
            raise
        return dtypes.canonical(dt, "dtype", dtypes.REFERENCE_DTYPES)


def _array_library(x) -> str:
    return type(x).__module__.split(".")[0]


def to_host(x) -> np.ndarray:
    """A NumPy array with the values (and dtype, bf16 as ml_dtypes) of a NumPy/CuPy/torch array."""
    lib = _array_library(x)
    if lib == "cupy":
        return x.get()                                   # CuPy keeps bf16 as ml_dtypes.bfloat16
    if lib == "torch":
        t = x.detach()
        if str(t.dtype) == "torch.bfloat16":
            # NumPy has no bf16 that torch knows; widening to fp32 is exact, then narrow back.
            return t.float().cpu().numpy().astype(BFLOAT16)
        return t.cpu().numpy()
    return np.asarray(x)


def to_float64(x) -> np.ndarray:
    """Host float64 copy of a float16/bfloat16/float32/float64 array (exact for all four)."""
    host = to_host(x)
    dtype_name(host)                                     # rejects ints, complex, ...
    return host.astype(np.float64)


def _gelu_tanh(x):
    inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)
    return 0.5 * x * (1.0 + np.tanh(inner))


_erf = np.frompyfunc(math.erf, 1, 1)                     # NumPy has no erf; math.erf is ~1 ulp


def _gelu_erf(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(np.float64))


def _silu(x):
    # x * sigmoid(x) written so that exp never overflows: sigmoid(x) = e^x / (1 + e^x) for x < 0.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, x / (1.0 + e), x * e / (1.0 + e))


def _relu(x):
    return np.maximum(x, 0.0)


ACTIVATIONS = {"relu": _relu, "gelu": _gelu_tanh, "gelu_erf": _gelu_erf, "silu": _silu}
"""name -> float64 NumPy function. 'gelu' is the tanh approximation
0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) as in cuBLASLt; 'gelu_erf' is 0.5 x (1 + erf(x/sqrt 2))."""


def apply_activation(name, x: np.ndarray) -> np.ndarray:
    if name is None:
        return x
    try:
        return ACTIVATIONS[name](x)
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; expected None or one of {sorted(ACTIVATIONS)}") from None


def reference_gemm(a, b, *, alpha=1.0, bias=None, activation=None, scale=None, c=None, beta=0.0) -> np.ndarray:
    """float64 ``act(alpha * (a @ b) + bias) * scale + beta * c`` (an M x N float64 NumPy array).

    a: M x K, b: K x N, any strides, NumPy/CuPy/torch, float16/bfloat16/float32/float64.
    bias: length N (per column) or None; scale: None, a scalar, or length N; c: M x N or None.
    As in BLAS, c is not read when beta == 0 (so NaNs in an unused c do not leak in).
    K == 0 gives the epilogue applied to zeros; M == 0 or N == 0 gives an empty result.
    """
    a64, b64 = matrix_operands(a, b)
    bias64, scale64, c64 = epilogue_operands(a64.shape[0], b64.shape[1], bias, scale, c, beta)
    d = float(alpha) * (a64 @ b64)
    if bias64 is not None:
        d = d + bias64
    d = apply_activation(activation, d)
    if scale64 is not None:
        d = d * scale64
    if c64 is not None:
        d = d + float(beta) * c64
    return d


def matrix_operands(a, b):
    """Host float64 copies of A (M x K) and B (K x N), shapes checked."""
    a64, b64 = to_float64(a), to_float64(b)
    if a64.ndim != 2 or b64.ndim != 2 or a64.shape[1] != b64.shape[0]:
        raise ValueError(f"need a (M x K) and b (K x N), got {a64.shape} and {b64.shape}")
    return a64, b64


def epilogue_operands(m, n, bias, scale, c, beta):
    """float64 bias (N,), scale (scalar array or (N,)) and c (M x N), each None when unused."""
    bias64 = None if bias is None else _vector(bias, n, "bias")
    scale64 = None
    if scale is not None:
        scale64 = to_float64(scale)
        if scale64.ndim != 0:
            scale64 = _vector(scale, n, "scale")
    c64 = None
    if c is not None and beta != 0:
        c64 = to_float64(c)
        if c64.shape != (m, n):
            raise ValueError(f"residual c must be {(m, n)}, got {c64.shape}")
    return bias64, scale64, c64


def _vector(v, n, what) -> np.ndarray:
    v64 = to_float64(v)
    if v64.shape != (n,):
        raise ValueError(f"{what} must have shape ({n},), got {v64.shape}")
    return v64


# Significand bits (with the implicit one), smallest normal exponent, largest finite value.
_FORMATS = {
    "float16": (11, -14, 65504.0),
    "bfloat16": (8, -126, float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)),
}


def round_to(x64, dtype) -> np.ndarray:
    """Round float64 values to float16/bfloat16/float32 ONCE, to nearest, ties to even.

    float32 and float16 use NumPy's casts, which round once. bfloat16 does not go through
    ml_dtypes' float64 cast because that rounds twice (float64 -> float32 -> bfloat16: a value just
    above a bf16 tie becomes the tie in float32, then ties-to-even rounds it down). Instead it
    rounds in float64 arithmetic, which is exact: with q the bf16 quantum (ulp) at x's binade,
    x/q is an exact power-of-two scaling, np.rint rounds it half-to-even to an integer below 2^9,
    and that times q is exact again and representable in bf16, so the final cast is exact.
    Values that round beyond the largest finite value become inf, as IEEE round-to-nearest does.
    """
    name = dtype_name(dtype)
    x64 = np.asarray(x64, dtype=np.float64)
    if name in ("float32", "float64", "float16"):
        with np.errstate(over="ignore"):                 # overflow to inf is the IEEE answer
            return x64.astype(NUMPY_DTYPES[name])
    return _round_via_float64(x64, name).astype(np.float32).astype(BFLOAT16)   # exact casts


def _round_via_float64(x64: np.ndarray, name: str) -> np.ndarray:
    precision, emin, max_finite = _FORMATS[name]
    finite = np.isfinite(x64)
    x = np.where(finite, x64, 0.0)
    _, exp = np.frexp(x)                       # x = f * 2^exp with 0.5 <= |f| < 1: binade is exp-1
    binade = np.maximum(exp - 1, emin)         # below the normal range the spacing stays fixed
    quantum = np.ldexp(1.0, binade - (precision - 1))
    rounded = np.rint(x / quantum) * quantum
    rounded = np.where(np.abs(rounded) > max_finite, np.copysign(np.inf, rounded), rounded)
    return np.where(finite, rounded, x64)
