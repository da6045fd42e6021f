"""The host oracle as it was before the reference, the bound and the comparisons were written over
an array module (xp) to run on the GPU too: a frozen copy, so that tests/cpu/test_device_oracle.py
can check that the shared code's NumPy path still gives the same bits. Change it only together with
a deliberate change of the formulas."""
import math

import numpy as np

from deepgemm.reference import BFLOAT16, NUMPY_DTYPES, _FORMATS, _array_library, dtype_name
from deepgemm.testing.bounds import (_ACCUMULATION, _ETA32, _INFLATE, _OUTPUT_FORMATS, _U32, ACTIVATION_DEVICE_ERROR,
                                     ACTIVATION_LIPSCHITZ, _resolve_out_dtype, _scalar_rounding, gamma,
                                     unit_roundoff)


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


def _reference_and_bound(a, b, *, accumulate="fp32", out_dtype=None, alpha=1.0, bias=None, activation=None,
                         scale=None, c=None, beta=0.0):
    """(float64 reference, bound): the bound's walk through the epilogue computes the reference too."""
    out_dtype = _resolve_out_dtype(a, out_dtype)
    if accumulate not in _ACCUMULATION:
        raise ValueError(f"unknown accumulate {accumulate!r}; expected one of {sorted(_ACCUMULATION)}")
    a64, b64 = matrix_operands(a, b)
    bias64, scale64, c64 = epilogue_operands(a64.shape[0], b64.shape[1], bias, scale, c, beta)
    u_out, tiny_out, _ = _OUTPUT_FORMATS[out_dtype]
    roundings_per_term, eta_acc = _ACCUMULATION[accumulate]
    n_roundings = roundings_per_term * a64.shape[1]
    u_acc = unit_roundoff(accumulate) * _INFLATE
    u = _U32 * _INFLATE
    eta = _ETA32

    with np.errstate(invalid="ignore", over="ignore"):
        x = a64 @ b64
        error = gamma(n_roundings, u_acc) * (np.abs(a64) @ np.abs(b64)) + n_roundings * eta_acc

        # Walk the epilogue keeping the exact signed value and a bound on the error so far.
        alpha = float(alpha)
        error = abs(alpha) * error + _scalar_rounding(alpha, u) * abs(alpha) * (np.abs(x) + error) + eta
        value = alpha * x
        if bias64 is not None:
            value = value + bias64
            error = error + u * (np.abs(value) + error) + eta
        if activation is not None:
            activated = apply_activation(activation, value)
            lipschitz, eps_act = ACTIVATION_LIPSCHITZ[activation], ACTIVATION_DEVICE_ERROR[activation]
            error = (lipschitz * error
                     + eps_act * (np.abs(value) + error + np.abs(activated) + lipschitz * error) + eta)
            value = activated
        if scale64 is not None:
            # A scalar scale is rounded to fp32 like alpha; a vector scale is exact in fp32.
            rel = _scalar_rounding(float(scale64), u) if scale64.ndim == 0 else u
            error = np.abs(scale64) * error + rel * np.abs(scale64) * (np.abs(value) + error) + eta
            value = value * scale64
        if c64 is not None:
            beta_c = float(beta) * c64
            value = value + beta_c
            rel = _scalar_rounding(beta, u)                       # beta to fp32, then beta * C
            error = (1 + u) * (error + rel * np.abs(beta_c)) + u * np.abs(value) + eta
        bound = error + u_out * _INFLATE * (np.abs(value) + error) + tiny_out + eta
    return value, bound


def assert_gemm_close(out, ref=None, *, a=None, b=None, accumulate="fp32", alpha=1.0, bias=None, activation=None,
                      scale=None, c=None, beta=0.0, bound=None, msg="") -> float:
    """Assert a kernel output is within the rigorous bound of the float64 reference; return the margin.

    out: the kernel's M x N output (NumPy/CuPy/torch; float16/bfloat16/float32), whose dtype is
    taken as the output dtype. ref: the float64 reference, or None to compute it from a, b and
    the epilogue. bound: a precomputed ``gemm_error_bound``, or None to compute it (needs a, b).
    A NaN or inf in out fails unless the reference is NaN there too, or the exact value could
    round beyond the output's range (then inf of the right sign is allowed).
    Returns max(|out - ref| / bound) over finite elements: < 1 passes, near 1 is normal (the
    final rounding can use the whole u_out |D| allowance).
    """
    epilogue = dict(alpha=alpha, bias=bias, activation=activation, scale=scale, c=c, beta=beta)
    out_host = to_host(out)
    out_name = dtype_name(out_host)
    got = out_host.astype(np.float64)
    if ref is None or bound is None:
        if a is None or b is None:
            raise TypeError("assert_gemm_close needs a= and b= unless both ref and bound are given")
        # One pass computes both (and copies device inputs to the host once).
        own_ref, own_bound = _reference_and_bound(a, b, accumulate=accumulate, out_dtype=out_name, **epilogue)
    expected = own_ref if ref is None else to_float64(ref)
    bound = own_bound if bound is None else to_float64(bound)
    if got.shape != expected.shape or bound.shape != expected.shape:
        raise AssertionError(f"{msg}shape mismatch: out {got.shape}, reference {expected.shape}, bound {bound.shape}")
    if got.size == 0:
        return 0.0

    with np.errstate(invalid="ignore", over="ignore"):
        error = np.abs(got - expected)
        ratio = error / bound
        overflow_at = _OUTPUT_FORMATS.get(out_name, (0, 0, math.inf))[2]
        may_overflow = np.abs(expected) + bound >= overflow_at
        ok = error <= bound
        ok |= np.isnan(got) & np.isnan(expected)
        ok |= np.isinf(got) & (got == expected)
        ok |= np.isinf(got) & may_overflow & (np.sign(got) == np.sign(expected))
    bad = ~ok
    if bad.any():
        # Worst element: any non-finite mismatch first, then the largest error/bound.
        severity = np.where(np.isfinite(ratio), ratio, np.inf)
        severity = np.where(bad, severity, -1.0)
        worst = np.unravel_index(int(np.argmax(severity)), severity.shape)
        raise AssertionError(
            f"{msg}{int(bad.sum())} of {got.size} elements outside the error bound (out {got.shape} {out_name}, "
            f"accumulate={accumulate}): worst at {tuple(int(i) for i in worst)}: got {float(got[worst])!r}, "
            f"expected {float(expected[worst])!r}, bound {bound[worst]:.3e}, error/bound {ratio[worst]:.3g}")
    finite = np.isfinite(ratio)
    return float(ratio[finite].max()) if finite.any() else 0.0


def assert_bitwise_equal(out, expected, *, msg="", signed_zeros=False) -> None:
    """Assert out and expected (same dtype) have identical bits, NaN matching NaN.

    +0 and -0 are treated as equal unless signed_zeros=True: the sign of an exact zero sum
    depends on the summation order (-0 + -0 = -0, but x + (-x) = +0), which the oracle does not fix.
    """
    got, want = to_host(out), to_host(expected)
    if got.dtype != want.dtype or got.shape != want.shape:
        raise AssertionError(f"{msg}dtype/shape mismatch: got {got.dtype}{got.shape}, expected {want.dtype}{want.shape}")
    bits = np.dtype(f"u{got.dtype.itemsize}")
    got_bits, want_bits = np.ascontiguousarray(got).view(bits), np.ascontiguousarray(want).view(bits)
    got64, want64 = got.astype(np.float64), want.astype(np.float64)
    same = got_bits == want_bits
    same |= np.isnan(got64) & np.isnan(want64)
    if not signed_zeros:
        same |= (got64 == 0) & (want64 == 0)
    if not same.all():
        with np.errstate(invalid="ignore"):                 # inf - inf: NaN sorts as the worst
            worst = np.unravel_index(int(np.argmax(np.where(same, -1.0, np.abs(got64 - want64)))), same.shape)
        raise AssertionError(
            f"{msg}{int((~same).sum())} of {same.size} elements differ (out {got.shape} {dtype_name(got)}): "
            f"worst at {tuple(int(i) for i in worst)}: got {float(got64[worst])!r} (0x{int(got_bits[worst]):x}), "
            f"expected {float(want64[worst])!r} (0x{int(want_bits[worst]):x})")
