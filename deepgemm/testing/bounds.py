"""Forward error bounds for deepgemm's GEMM, and the assertions built on them.

Two oracles:

* ``assert_gemm_close``: every element must lie within a rigorous per-element bound of the
  float64 reference (``gemm_error_bound``). A correct kernel passes on any data; a kernel that
  drops one k term or accumulates in fp16 fails on random normal data at K >= 64.
* ``integer_inputs`` + ``assert_bitwise_equal``: with small-integer inputs every partial sum is
  exact in fp32 in any order, so the output must equal the rounded reference bit for bit.

The bound (``gemm_error_bound``), elementwise, with x = A @ B, z = alpha x + bias, w = act(z),
m = w * scale, f = m + beta C (exact values; the float64 reference stands in for them),
u = 2^-24 (the fp32 epilogue arithmetic), eta = 2^-126 (one fp32 underflow or flush to zero per
operation), and r(v) the relative error of multiplying by a Python float v in fp32: 0 when v is
0 or a power of two (exact), u when v is an fp32 number (one rounding), gamma(2, u) otherwise
(v itself rounded to fp32, then the product); r(vector scale) = u:

    e_acc = gamma(n, u_acc) * (|A| @ |B|) + n * eta_acc                   accumulation, n = K or 2K
    e_1 = |alpha| e_acc + r(alpha) |alpha| (|x| + e_acc) + eta             alpha * acc
    e_2 = e_1 + u (|z| + e_1) + eta                                        + bias (exact in fp32)
    e_3 = L e_2 + eps_act (|z| + e_2 + |w| + L e_2) + eta                  act (Lipschitz + device error)
    e_4 = |s| e_3 + r(s) |s| (|w| + e_3) + eta                             * scale
    e_5 = (1 + u) (e_4 + r(beta) |beta C|) + u |f| + eta                   + beta * C
    bound = e_5 + u_out (|f| + e_5) + tiny_out + eta                       the one final cast

Stages that are absent (no bias, activation, scale or C) are skipped; e.g. a plain GEMM with a
bf16 output gets bound = e_acc + eta + 2^-8 (|x| + e_acc + eta) + 2^-133 + eta.

Sources and constants:

* Accumulation: Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., §3.1 eq. (3.5):
  a computed dot product satisfies |x^T y - fl(x^T y)| <= gamma_n |x|^T |y| in ANY summation
  order (split-K and tree reductions included); products of fp16/bf16 values are exact in fp32,
  so n = K roundings with u_acc = 2^-24 for CUDA-core fp32 FMAs (``accumulate="fp32"``).
* Tensor cores (``accumulate="fp32_tc"``): Fasi, Higham, Mikaitis, Pranesh, "Numerical behavior
  of NVIDIA tensor cores", PeerJ Comput. Sci. 7:e330 (2021): a tensor core adds a block of b
  exact products to the fp32 accumulator by aligning all terms to the largest exponent and
  truncating the bits shifted out, then normalises with truncation (round toward zero), so the
  unit roundoff is 2^-23, not 2^-24. Alignment truncation costs up to one ulp of the largest term
  for each of the other terms, so a block of j products plus the accumulator errs by at most
  (j + 1) 2^-23 times the sum of its terms' magnitudes; over the whole K this is at most
  2 rounding units per product, hence n = 2K with u_acc = 2^-23. Any block size and any
  fp32 split-K reduction fit within that count. A CUDA-core (round-to-nearest) bound can be
  exceeded by that model (tests/cpu/test_bounds.py builds such a case), hence a separate kind.
  Measured on an H200 (cuBLAS through torch, fp16/bf16 in, fp32 out, 2026-11-30): at most 0.48
  of the "fp32" bound and 0.12 of the "fp32_tc" bound, on random, all-positive and
  truncation-adversarial data up to K = 8192; with fp16/bf16 outputs the final rounding
  dominates and margins reach 0.99 (a correct round-to-nearest cast can use all of u_out).
* ``accumulate="fp16"`` (round-to-nearest fp16 accumulators, the report's variants): n = K,
  u_acc = 2^-11, eta_acc = 2^-14 (flush of fp16 subnormals). ``"fp16_tc"``: n = 2K, u_acc = 2^-10.
* Activations are Lipschitz with constant L = max |act'| (maxima found on a fine grid, then
  rounded up): relu 1; gelu (tanh) 1.12899 at x ~ 1.42 -> 1.13; gelu_erf
  Phi(sqrt 2) + sqrt 2 phi(sqrt 2) = 1.12890 at x = sqrt 2 -> 1.13; silu 1.09984 at x ~ 2.40 -> 1.10.
  So |act(z_hat) - act(z)| <= L |z_hat - z| exactly (mean value theorem), not just to first order.
* eps_act, the device's error in evaluating the activation at its (already perturbed) input,
  as kernels/include/deepgemm/common.cuh writes them. gelu_erf uses erff, within 2 ulp (CUDA C++
  Programming Guide, Mathematical Functions appendix; NVIDIA notes these come from extensive, not
  exhaustive, testing); its 1 + erf(..) cancels for negative z, so the absolute error scales with
  |z|, not |act z|. gelu (x sigmoid(2u), the tanh formula rewritten) and silu (x sigmoid(x)) are
  x / (1 + 2^t) with PTX's ex2.approx.ftz and rcp.approx.ftz (approximations within a few ulp;
  a result flushed below 2^-126 costs at most 2^-126 |x|). A relative error d in 2^t (the
  approximation's, plus |t| ln 2 times t's own rounding) moves x / (1 + 2^t) by |x| s (1 - s) d,
  s = 1 / (1 + 2^t), and s (1 - s) <= 2^-|t| keeps that to a few u |x| even where d grows with
  |t|. With the formulas' 3-6 fp32 roundings (constants included) each
  result is within about 7 u (|z| + |act z|). We allow eps_act = 16 u = 2^-20 for gelu, gelu_erf
  and silu; relu is exact (eps_act = 0). tests/gpu/test_activation_accuracy.py holds every
  kernel to this allowance on every finite bfloat16 input. NOT covered: the tanh.approx.f32
  instruction (relative error ~2^-11) that a fast-math GELU might use.
* Final cast to the output dtype (round to nearest): u_out |f_hat| with u_out = 2^-11 (fp16),
  2^-8 (bf16), 2^-24 (fp32), plus tiny_out, the smallest subnormal of the output dtype, for the
  subnormal range (so exact zeros and tiny values do not fail), plus eta for a flush to zero.
* The float64 reference and this bound are themselves rounded (relative ~K 2^-53): every unit
  roundoff above is inflated by (1 + 2^-20), which dwarfs that.
"""
from __future__ import annotations

import math

import numpy as np

from .. import registry
from ..reference import (NUMPY_DTYPES, apply_activation, array_module, compute_module, dtype_name, epilogue_operands,
                         is_device_array, matrix_operands, to_float64, to_host, to_module)

_INFLATE = 1.0 + 2.0 ** -20          # absorbs the float64 reference's own rounding (see module doc)
_U32 = 2.0 ** -24
_ETA32 = 2.0 ** -126                  # one fp32 underflow / flush-to-zero

_UNIT_ROUNDOFF = {"fp32": 2.0 ** -24, "fp32_tc": 2.0 ** -23, "fp16": 2.0 ** -11, "fp16_tc": 2.0 ** -10,
                  "bf16": 2.0 ** -8}
# accumulate kind -> (roundings per k term, absolute underflow error per operation)
_ACCUMULATION = {"fp32": (1, _ETA32), "fp32_tc": (2, _ETA32), "fp16": (1, 2.0 ** -14),
                 "fp16_tc": (2, 2.0 ** -14), "bf16": (1, _ETA32)}

ACTIVATION_LIPSCHITZ = {None: 1.0, "relu": 1.0, "gelu": 1.13, "gelu_erf": 1.13, "silu": 1.10}
ACTIVATION_DEVICE_ERROR = {None: 0.0, "relu": 0.0, "gelu": 16 * _U32, "gelu_erf": 16 * _U32, "silu": 16 * _U32}

# Output format -> (unit roundoff, smallest subnormal, overflow threshold of round-to-nearest:
# values at or beyond max + ulp(max)/2 round to inf).
_OUTPUT_FORMATS = {
    "float16": (2.0 ** -11, 2.0 ** -24, 65504.0 + 16.0),
    "bfloat16": (2.0 ** -8, 2.0 ** -133, (2.0 - 2.0 ** -7) * 2.0 ** 127 + 2.0 ** 119),
    "float32": (2.0 ** -24, 2.0 ** -149, (2.0 - 2.0 ** -23) * 2.0 ** 127 + 2.0 ** 103),
}


def unit_roundoff(kind: str) -> float:
    """u for 'fp32' (2^-24), 'fp32_tc' (2^-23: tensor-core fp32 accumulation truncates, Fasi et
    al. 2021), 'fp16' (2^-11), 'fp16_tc' (2^-10), 'bf16' (2^-8)."""
    try:
        return _UNIT_ROUNDOFF[kind]
    except KeyError:
        raise ValueError(f"unknown kind {kind!r}; expected one of {sorted(_UNIT_ROUNDOFF)}") from None


def gamma(n, u):
    """Higham's gamma_n = n u / (1 - n u) (Accuracy and Stability, 2nd ed., §3.1, Lemma 3.1).

    |prod (1 + d_i)^(+-1) - 1| <= gamma_n for n factors with |d_i| <= u. Needs n u < 1.
    """
    nu = np.asarray(n, dtype=np.float64) * u
    if np.any(nu >= 1):
        raise ValueError(f"gamma undefined: n*u = {np.max(nu)} >= 1")
    result = nu / (1.0 - nu)
    return float(result) if result.ndim == 0 else result


def gemm_error_bound(a, b, *, accumulate="fp32", out_dtype=None, alpha=1.0, bias=None, activation=None,
                     scale=None, c=None, beta=None, xp=None):
    """Per-element bound on |kernel output - exact result| for deepgemm's GEMM (M x N float64).

    See the module docstring for the formula and its sources. out_dtype defaults to a's dtype
    when that is float16/bfloat16. NaN where an input is NaN/inf. xp as for reference_gemm:
    None gives a NumPy array (computed on the device for CuPy operands), cupy keeps it there.
    """
    xp, to_host_after = compute_module(a, b, xp)
    bound = _reference_and_bound(a, b, accumulate=accumulate, out_dtype=out_dtype, alpha=alpha, bias=bias,
                                 activation=activation, scale=scale, c=c, beta=beta, xp=xp)[1]
    return bound.get() if to_host_after else bound


def _reference_and_bound(a, b, *, accumulate="fp32", out_dtype=None, alpha=1.0, bias=None, activation=None,
                         scale=None, c=None, beta=None, xp=np):
    """(float64 reference, bound): the bound's walk through the epilogue computes the reference too.
    Both are arrays of module xp (numpy, or cupy: the same formulas on the device)."""
    out_dtype = _resolve_out_dtype(a, out_dtype)
    beta = registry.residual_beta(beta, c)
    if accumulate not in _ACCUMULATION:
        raise ValueError(f"unknown accumulate {accumulate!r}; expected one of {sorted(_ACCUMULATION)}")
    a64, b64 = matrix_operands(a, b, xp=xp)
    bias64, scale64, c64 = epilogue_operands(a64.shape[0], b64.shape[1], bias, scale, c, beta, xp=xp)
    u_out, tiny_out, _ = _OUTPUT_FORMATS[out_dtype]
    roundings_per_term, eta_acc = _ACCUMULATION[accumulate]
    n_roundings = roundings_per_term * a64.shape[1]
    u_acc = unit_roundoff(accumulate) * _INFLATE
    u = _U32 * _INFLATE
    eta = _ETA32

    with np.errstate(invalid="ignore", over="ignore"):
        x = a64 @ b64
        error = gamma(n_roundings, u_acc) * (xp.abs(a64) @ xp.abs(b64)) + n_roundings * eta_acc

        # Walk the epilogue keeping the exact signed value and a bound on the error so far.
        alpha = float(alpha)
        error = abs(alpha) * error + _scalar_rounding(alpha, u) * abs(alpha) * (xp.abs(x) + error) + eta
        value = alpha * x
        if bias64 is not None:
            value = value + bias64
            error = error + u * (xp.abs(value) + error) + eta
        if activation is not None:
            activated = apply_activation(activation, value, xp)
            lipschitz, eps_act = ACTIVATION_LIPSCHITZ[activation], ACTIVATION_DEVICE_ERROR[activation]
            error = (lipschitz * error
                     + eps_act * (xp.abs(value) + error + xp.abs(activated) + lipschitz * error) + eta)
            value = activated
        if scale64 is not None:
            # A scalar scale is rounded to fp32 like alpha; a vector scale is exact in fp32.
            rel = _scalar_rounding(float(scale64), u) if scale64.ndim == 0 else u
            error = xp.abs(scale64) * error + rel * xp.abs(scale64) * (xp.abs(value) + error) + eta
            value = value * scale64
        if c64 is not None:
            beta_c = float(beta) * c64
            value = value + beta_c
            rel = _scalar_rounding(beta, u)                       # beta to fp32, then beta * C
            error = (1 + u) * (error + rel * xp.abs(beta_c)) + u * xp.abs(value) + eta
        bound = error + u_out * _INFLATE * (xp.abs(value) + error) + tiny_out + eta
    return value, bound


def _scalar_rounding(v, u) -> float:
    """Relative error of multiplying by the Python float v in fp32: v is rounded to fp32 (exact
    when it fits) and the product rounded (exact for powers of two, barring underflow)."""
    v = abs(float(v))
    if v == 0 or math.frexp(v)[0] == 0.5:                  # 0 or a power of two
        return 0.0
    return u if float(np.float32(v)) == v else gamma(2, u)


def _resolve_out_dtype(a, out_dtype) -> str:
    if out_dtype is None:
        name = dtype_name(to_host(a) if not hasattr(a, "dtype") else a)
        if name not in ("float16", "bfloat16"):
            raise ValueError("out_dtype is required when the inputs are not float16/bfloat16")
        return name
    name = dtype_name(out_dtype)
    if name not in _OUTPUT_FORMATS:
        raise ValueError(f"out_dtype must be float16, bfloat16 or float32, got {name}")
    return name


def assert_gemm_close(out, ref=None, *, a=None, b=None, accumulate="fp32", alpha=1.0, bias=None, activation=None,
                      scale=None, c=None, beta=None, bound=None, msg="", xp=None) -> float:
    """Assert a kernel output is within the rigorous bound of the float64 reference; return the margin.

    out: the kernel's M x N output (NumPy/CuPy/torch; float16/bfloat16/float32), whose dtype is
    taken as the output dtype. ref: the float64 reference, or None to compute it from a, b and
    the epilogue. bound: a precomputed ``gemm_error_bound``, or None to compute it (needs a, b).
    A NaN or inf in out fails unless the reference is NaN there too, or the exact value could
    round beyond the output's range (then inf of the right sign is allowed).
    Returns max(|out - ref| / bound) over finite elements: < 1 passes, near 1 is normal (the
    final rounding can use the whole u_out |D| allowance).
    xp: where to check. None: on the device when out is a CuPy array (the reference, the bound and
    the comparison run there and only the verdict's few numbers come back), else on the host;
    numpy forces the host.
    """
    xp = array_module(out) if xp is None else xp
    epilogue = dict(alpha=alpha, bias=bias, activation=activation, scale=scale, c=c, beta=beta)
    out_here = to_module(out, xp)
    out_name = dtype_name(out_here)
    got = out_here.astype(np.float64)
    if ref is None or bound is None:
        if a is None or b is None:
            raise TypeError("assert_gemm_close needs a= and b= unless both ref and bound are given")
        # One pass computes both (and copies operands that live elsewhere once).
        own_ref, own_bound = _reference_and_bound(a, b, accumulate=accumulate, out_dtype=out_name, xp=xp,
                                                  **epilogue)
    expected = own_ref if ref is None else to_float64(ref, xp)
    bound = own_bound if bound is None else to_float64(bound, xp)
    if got.shape != expected.shape or bound.shape != expected.shape:
        raise AssertionError(f"{msg}shape mismatch: out {got.shape}, reference {expected.shape}, bound {bound.shape}")
    if got.size == 0:
        return 0.0

    with np.errstate(invalid="ignore", over="ignore"):
        error = xp.abs(got - expected)
        ratio = error / bound
        overflow_at = _OUTPUT_FORMATS.get(out_name, (0, 0, math.inf))[2]
        may_overflow = xp.abs(expected) + bound >= overflow_at
        ok = error <= bound
        ok |= xp.isnan(got) & xp.isnan(expected)
        ok |= xp.isinf(got) & (got == expected)
        ok |= xp.isinf(got) & may_overflow & (xp.sign(got) == xp.sign(expected))
        bad = ~ok
        finite = xp.isfinite(ratio)
        # The verdict in one copy: how many elements fail, and the largest finite error/bound.
        n_bad, margin = (float(v) for v in to_host(xp.stack([bad.sum().astype(np.float64),
                                                              xp.where(finite, ratio, -xp.inf).max()])))
    if n_bad:
        # Worst element: any non-finite mismatch first, then the largest error/bound.
        severity = xp.where(finite, ratio, xp.inf)
        severity = xp.where(bad, severity, -1.0)
        worst = tuple(int(i) for i in np.unravel_index(int(xp.argmax(severity)), severity.shape))
        raise AssertionError(
            f"{msg}{int(n_bad)} of {got.size} elements outside the error bound (out {got.shape} {out_name}, "
            f"accumulate={accumulate}): worst at {worst}: got {float(got[worst])!r}, "
            f"expected {float(expected[worst])!r}, bound {float(bound[worst]):.3e}, "
            f"error/bound {float(ratio[worst]):.3g}")
    return margin if margin > -math.inf else 0.0


def integer_inputs(shape, k, rng, dtype="float16", budget=2 ** 24) -> np.ndarray:
    """Random small integers, exact in dtype, for the bit-exact oracle (returned as dtype).

    Values are uniform in [-r, r] with r = floor(sqrt(budget / k)), so for A (M x K) and B (K x N)
    drawn this way every product and every partial sum of products is an integer of magnitude
    <= K r^2 <= budget = 2^24. All integers up to 2^24 are fp32 numbers, so the fp32 accumulation
    is EXACT in any summation order (tiles, split-K, tensor-core blocks: truncating alignment drops
    no bits either, as every term sits on the integer grid of a <= 2^24 maximum). The exact integer
    then goes through one round-to-nearest-even cast on both sides, so the kernel's output must
    equal ``round_to(reference_gemm(a, b), out_dtype)`` bit for bit (``assert_bitwise_equal``).
    r is also capped so the inputs are exact: 2048 in float16, 256 in bfloat16.
    Pass a smaller budget (e.g. 2^20) to leave headroom for an exact epilogue (bias/residual).
    """
    r = integer_range(k, dtype, budget)
    values = rng.integers(-r, r, size=shape, endpoint=True)
    return values.astype(np.float32).astype(NUMPY_DTYPES[dtype_name(dtype)])


def integer_range(k, dtype="float16", budget=2 ** 24) -> int:
    """r for ``integer_inputs``: values in [-r, r] keep K r^2 <= budget and are exact in dtype."""
    exact_limit = {"float16": 2048, "bfloat16": 256}.get(dtype_name(dtype), 2 ** 24)
    return min(math.isqrt(budget // max(k, 1)), exact_limit)


def assert_bitwise_equal(out, expected, *, msg="", signed_zeros=False, xp=None) -> None:
    """Assert out and expected (same dtype) have identical bits, NaN matching NaN.

    +0 and -0 are treated as equal unless signed_zeros=True: the sign of an exact zero sum
    depends on the summation order (-0 + -0 = -0, but x + (-x) = +0), which the oracle does not fix.
    xp: where to compare. None: on the device when either array is a CuPy array (only the count
    and the worst element come back on failure), else on the host; numpy forces the host.
    """
    if xp is None:
        xp = array_module(out) if is_device_array(out) else array_module(expected)
    got, want = to_module(out, xp), to_module(expected, xp)
    if got.dtype != want.dtype or got.shape != want.shape:
        raise AssertionError(f"{msg}dtype/shape mismatch: got {got.dtype}{got.shape}, expected {want.dtype}{want.shape}")
    bits = np.dtype(f"u{got.dtype.itemsize}")
    # On the device a same-size view of the strided output is enough (no bf16 copy kernel needed).
    contiguous = np.ascontiguousarray if xp is np else (lambda x: x)
    got_bits, want_bits = contiguous(got).view(bits), contiguous(want).view(bits)
    got64, want64 = got.astype(np.float64), want.astype(np.float64)
    same = got_bits == want_bits
    same |= xp.isnan(got64) & xp.isnan(want64)
    if not signed_zeros:
        same |= (got64 == 0) & (want64 == 0)
    if not bool(same.all()):
        with np.errstate(invalid="ignore"):                 # inf - inf: NaN sorts as the worst
            flat = int(xp.argmax(xp.where(same, -1.0, xp.abs(got64 - want64))))
        worst = tuple(int(i) for i in np.unravel_index(flat, same.shape))
        raise AssertionError(
            f"{msg}{int((~same).sum())} of {same.size} elements differ (out {got.shape} {dtype_name(got)}): "
            f"worst at {worst}: got {float(got64[worst])!r} (0x{int(got_bits[worst]):x}), "
            f"expected {float(want64[worst])!r} (0x{int(want_bits[worst]):x})")
