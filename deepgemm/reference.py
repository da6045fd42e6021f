"""FP64 reference for deepgemm's GEMM, and exact rounding to the low-precision formats.

``reference_gemm`` evaluates ``D = act(alpha * (A @ B) + bias) * scale + beta * C`` in float64.
Inputs in float16/bfloat16/float32 convert to float64 exactly and their products are exact, so
the reference carries only float64 rounding (relative ~K * 2^-53), which ``deepgemm.testing.bounds``
absorbs.

Every formula here is written once, over an array module ``xp`` (numpy, or cupy for CuPy arrays),
so the host and the device evaluate the same expressions. Where it runs:
  * NumPy operands (and torch tensors, copied to the host): on the host, as NumPy;
  * CuPy operands: on the device (cuBLAS FP64 GEMM, CuPy elementwise kernels); the result comes
    back as a NumPy array unless ``xp=cupy`` asks to keep it on the device. A verification run
    that keeps inputs, reference and comparison on the GPU copies back only a few numbers, where
    copying A and B to the host and multiplying there made the GPU tier wait on the CPU.
On the device, the FP64 product sums in another order than the host BLAS: still float64 rounding
(relative ~K * 2^-53), exact for the integer-exact oracle (all partial sums are integers below
2^53), and far inside the error bounds. erf/tanh/exp come from CUDA's libm (within 2 ulp) rather
than the host's: again ~2^-52 relative, which the bounds' (1 + 2^-20) inflation absorbs.
cupy/torch are never imported here unless such an array is passed (an object is recognised by the
module its type comes from), so this module works without them.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from deepgemm import dtypes, registry

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


def is_device_array(x) -> bool:
    """Whether x is a CuPy array (recognised without importing cupy)."""
    return _array_library(x) == "cupy"


def _cupy():
    import cupy
    return cupy


def array_module(x):
    """cupy for a CuPy array, numpy for anything else."""
    return _cupy() if is_device_array(x) else np


def compute_module(a, b, xp=None):
    """(module to compute with, whether to copy the result to the host) for operands a and b.

    xp=None: on the device when both operands are CuPy arrays, with a NumPy result (callers that
    predate the device path get what they always got); else on the host. xp=numpy or xp=cupy:
    there, with the result left there."""
    if xp is not None:
        return xp, False
    if is_device_array(a) and is_device_array(b):
        return _cupy(), True
    return np, False


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


def to_float64(x, xp=np):
    """float64 copy of a float16/bfloat16/float32/float64 array (exact for all four): a NumPy array,
    or with xp=cupy a CuPy array (a CuPy input is converted where it is, anything else copied up)."""
    if xp is not np and is_device_array(x):
        dtype_name(x)                                    # rejects ints, complex, ...
        return x.astype(xp.float64)
    host = to_host(x)
    dtype_name(host)
    host = host.astype(np.float64)
    return host if xp is np else xp.asarray(host)


def to_module(x, xp):
    """x (any array) as an array of module xp, same dtype: moved only when it is elsewhere."""
    if xp is np:
        return to_host(x)
    return x if is_device_array(x) else xp.asarray(to_host(x))


def _gelu_tanh(x, xp=np):
    inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)
    return 0.5 * x * (1.0 + xp.tanh(inner))


_host_erf = np.frompyfunc(math.erf, 1, 1)                # NumPy has no erf; math.erf is ~1 ulp


def _erf(x, xp):
    if xp is np:
        return _host_erf(x).astype(np.float64)
    from cupyx.scipy.special import erf                  # CUDA's erf, within 2 ulp
    return erf(x)


def _gelu_erf(x, xp=np):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0), xp))


def _silu(x, xp=np):
    # x * sigmoid(x) written so that exp never overflows: sigmoid(x) = e^x / (1 + e^x) for x < 0.
    e = xp.exp(-xp.abs(x))
    return xp.where(x >= 0, x / (1.0 + e), x * e / (1.0 + e))


def _relu(x, xp=np):
    return xp.maximum(x, 0.0)


ACTIVATIONS = {"relu": _relu, "gelu": _gelu_tanh, "gelu_erf": _gelu_erf, "silu": _silu}
"""name -> float64 function f(x, xp=numpy) (pass xp=cupy for a CuPy array). 'gelu' is the tanh
approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) as in cuBLASLt; 'gelu_erf' is
0.5 x (1 + erf(x/sqrt 2))."""


def apply_activation(name, x, xp=None):
    """act(x) in float64, on the host or (x a CuPy array, or xp=cupy) on the device."""
    if name is None:
        return x
    try:
        fn = ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; expected None or one of {sorted(ACTIVATIONS)}") from None
    return fn(x, array_module(x) if xp is None else xp)


def reference_gemm(a, b, *, alpha=1.0, bias=None, activation=None, scale=None, c=None, beta=None, xp=None):
    """float64 ``act(alpha * (a @ b) + bias) * scale + beta * c`` (an M x N float64 array).

    a: M x K, b: K x N, any strides, NumPy/CuPy/torch, float16/bfloat16/float32/float64.
    bias: length N (per column) or None; scale: None, a scalar, or length N; c: M x N or None.
    beta: as deepgemm.gemm takes it (1 with c, when not given; an error without c).
    As in BLAS, c is not read when beta == 0 (so NaNs in an unused c do not leak in).
    K == 0 gives the epilogue applied to zeros; M == 0 or N == 0 gives an empty result.
    xp: None (a NumPy result; computed on the device when a and b are CuPy arrays), numpy (on the
    host), or cupy (on the device, returned as a CuPy array: nothing is copied back).
    """
    xp, to_host_after = compute_module(a, b, xp)
    beta = registry.residual_beta(beta, c)
    a64, b64 = matrix_operands(a, b, xp=xp)
    bias64, scale64, c64 = epilogue_operands(a64.shape[0], b64.shape[1], bias, scale, c, beta, xp=xp)
    d = float(alpha) * (a64 @ b64)
    if bias64 is not None:
        d = d + bias64
    d = apply_activation(activation, d, xp)
    if scale64 is not None:
        d = d * scale64
    if c64 is not None:
        d = d + float(beta) * c64
    return d.get() if to_host_after else d


def matrix_operands(a, b, xp=np):
    """float64 copies of A (M x K) and B (K x N) as arrays of module xp, shapes checked."""
    a64, b64 = to_float64(a, xp), to_float64(b, xp)
    if a64.ndim != 2 or b64.ndim != 2 or a64.shape[1] != b64.shape[0]:
        raise ValueError(f"need a (M x K) and b (K x N), got {a64.shape} and {b64.shape}")
    return a64, b64


def epilogue_operands(m, n, bias, scale, c, beta, xp=np):
    """float64 bias (N,), scale (scalar array or (N,)) and c (M x N), each None when unused."""
    bias64 = None if bias is None else _vector(bias, n, "bias", xp)
    scale64 = None
    if scale is not None:
        scale64 = to_float64(scale, xp)
        if scale64.ndim != 0:
            scale64 = _vector(scale, n, "scale", xp)
    c64 = None
    if c is not None and beta != 0:
        c64 = to_float64(c, xp)
        if c64.shape != (m, n):
            raise ValueError(f"residual c must be {(m, n)}, got {c64.shape}")
    return bias64, scale64, c64


def _vector(v, n, what, xp=np):
    v64 = to_float64(v, xp)
    if v64.shape != (n,):
        raise ValueError(f"{what} must have shape ({n},), got {v64.shape}")
    return v64


# Significand bits (with the implicit one), smallest normal exponent, largest finite value.
_FORMATS = {
    "float16": (11, -14, 65504.0),
    "bfloat16": (8, -126, float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)),
}


def round_to(x64, dtype):
    """Round float64 values to float16/bfloat16/float32 ONCE, to nearest, ties to even.

    float32 and float16 use NumPy's casts, which round once. bfloat16 does not go through
    ml_dtypes' float64 cast because before ml_dtypes 0.7 that rounds twice (float64 -> float32 ->
    bfloat16: a value just above a bf16 tie becomes the tie in float32, then ties-to-even rounds it
    down), and every version deepgemm accepts must give the same reference. Instead it
    rounds in float64 arithmetic, which is exact: with q the bf16 quantum (ulp) at x's binade,
    x/q is an exact power-of-two scaling, np.rint rounds it half-to-even to an integer below 2^9,
    and that times q is exact again and representable in bf16, so the final cast is exact.
    Values that round beyond the largest finite value become inf, as IEEE round-to-nearest does.

    A CuPy array is rounded on the device, to the same bits (NaN payloads aside: CUDA produces its
    canonical NaN; assert_bitwise_equal matches NaN to NaN): float32 by CUDA's float64 -> float32
    conversion (one rounding, to nearest even); float16 like bfloat16, in float64 arithmetic,
    because CuPy's float64 -> float16 conversion may go through float32 (two roundings);
    tests/cpu/test_reference.py checks that this arithmetic agrees with NumPy's float16 cast, and
    tests/gpu/test_sweep.py that the GPU gives NumPy's bits on ties, near-ties, subnormals, overflow.
    """
    name = dtype_name(dtype)
    if is_device_array(x64):
        xp = array_module(x64)
        x64 = x64.astype(xp.float64, copy=False)
        if name == "float64":
            return x64.copy()
        if name == "float32":
            with np.errstate(over="ignore"):             # (CuPy does not warn; NumPy-backed arrays would)
                out = x64.astype(np.float32)
        else:
            out = _round_via_float64(x64, name, xp).astype(xp.float32).astype(NUMPY_DTYPES[name])   # exact casts
        return _host_rounds_float32_subnormals(x64, out, name, xp)
    x64 = np.asarray(x64, dtype=np.float64)
    if name in ("float32", "float64", "float16"):
        with np.errstate(over="ignore"):                 # overflow to inf is the IEEE answer
            return x64.astype(NUMPY_DTYPES[name])
    return _round_via_float64(x64, name).astype(np.float32).astype(BFLOAT16)   # exact casts


def _host_rounds_float32_subnormals(x64, out, name: str, xp):
    """CuPy's float64 -> float32 conversion flushes float32 subnormals to zero (seen on the H200),
    and float32 and bfloat16 results below 2^-126 are such subnormals: those few elements (none in
    most references) are rounded on the host instead and their bits written back."""
    if name not in ("float32", "bfloat16"):
        return out
    flat_in = x64.reshape(-1)
    tiny = xp.nonzero((xp.abs(flat_in) < 2.0 ** -126) & (flat_in != 0))[0]
    if tiny.size == 0:
        return out
    out = xp.ascontiguousarray(out)
    bits = np.dtype(f"u{out.dtype.itemsize}")
    few = flat_in[tiny]
    host = round_to(few.get() if hasattr(few, "get") else np.asarray(few), name)
    out.view(bits).reshape(-1)[tiny] = xp.asarray(host.view(bits))
    return out


def _round_via_float64(x64, name: str, xp=np):
    precision, emin, max_finite = _FORMATS[name]
    finite = xp.isfinite(x64)
    x = xp.where(finite, x64, 0.0)
    _, exp = xp.frexp(x)                       # x = f * 2^exp with 0.5 <= |f| < 1: binade is exp-1
    binade = xp.maximum(exp - 1, emin)         # below the normal range the spacing stays fixed
    quantum = xp.ldexp(xp.ones_like(x), binade - (precision - 1))
    rounded = xp.rint(x / quantum) * quantum
    rounded = xp.where(xp.abs(rounded) > max_finite, xp.copysign(xp.inf, rounded), rounded)
    return xp.where(finite, rounded, x64)
