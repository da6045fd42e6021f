"""deepgemm.testing.bounds: the error bound passes correct arithmetic and catches broken kernels.

"Kernels" here are NumPy emulations with exactly known rounding: fp32 round-to-nearest
accumulation in several orders, a truncating tensor-core block model (Fasi et al. 2021), and
broken variants (one k term dropped, fp16 accumulation, epilogue mistakes).
"""
import math

import ml_dtypes
import numpy as np
import pytest

from deepgemm.reference import ACTIVATIONS, NUMPY_DTYPES, reference_gemm, round_to
from deepgemm.testing.bounds import (ACTIVATION_DEVICE_ERROR, ACTIVATION_LIPSCHITZ, assert_bitwise_equal,
                                     assert_gemm_close, gamma, gemm_error_bound, integer_inputs, integer_range,
                                     unit_roundoff)

BF16 = ml_dtypes.bfloat16
IN_DTYPES = ["float16", "bfloat16"]
OUT_DTYPES = ["float16", "bfloat16", "float32"]


# ---- emulated kernels -----------------------------------------------------------------------

def accumulate_fp32(a, b, order=None, drop=None):
    """fp32 round-to-nearest accumulation over k in `order` (products of fp16/bf16 are exact)."""
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k in (range(a.shape[1]) if order is None else order):
        if k != drop:
            acc += np.outer(a32[:, k], b32[k])       # float32 + float32: one RNE rounding
    return acc


def accumulate_fp16(a, b):
    """fp16 accumulator rounded after every k step (what an fp16-accumulating kernel does)."""
    acc = np.zeros((a.shape[0], b.shape[1]), np.float16)
    for k in range(a.shape[1]):
        # float64 sum of an fp16 value and an fp16*fp16 product is exact: one rounding to fp16.
        acc = (acc.astype(np.float64) + np.outer(a[:, k].astype(np.float64), b[k].astype(np.float64))).astype(np.float16)
    return acc.astype(np.float32)


def _round_toward_zero_fp32(x64):
    f = x64.astype(np.float32)
    return np.where(np.abs(f.astype(np.float64)) > np.abs(x64), np.nextafter(f, np.float32(0)), f)


def accumulate_tensor_core(a, b, block=4):
    """Fasi et al.'s tensor-core model: each step adds `block` exact products to the fp32
    accumulator by aligning all terms to the largest one's exponent on a 24-bit window,
    truncating what falls off, summing exactly and truncating the sum back to fp32."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    acc = np.zeros((a.shape[0], b.shape[1]))
    for k0 in range(0, a.shape[1], block):
        terms = np.stack([acc] + [np.outer(a64[:, k], b64[k]) for k in range(k0, min(k0 + block, a.shape[1]))])
        _, exp = np.frexp(np.abs(terms).max(axis=0))
        grid = np.ldexp(1.0, exp - 24)                 # ulp of the largest term, 24-bit significand
        aligned = np.trunc(terms / grid) * grid
        acc = _round_toward_zero_fp32(aligned.sum(axis=0)).astype(np.float64)
    return acc.astype(np.float32)


def epilogue_fp32(acc, alpha=1.0, bias=None, activation=None, scale=None, c=None, beta=0.0):
    """The epilogue as kernels/include/deepgemm/common.cuh computes it, in float32."""
    f32 = np.float32
    x = f32(alpha) * acc
    if bias is not None:
        x = x + bias.astype(f32)
    if activation == "relu":
        x = np.maximum(x, f32(0))
    elif activation == "gelu":   # x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): 0.5 x (1 + tanh(u)) rewritten
        k = f32(-2 * math.sqrt(2 / math.pi))
        with np.errstate(over="ignore", invalid="ignore"):
            x = x / (f32(1) + np.exp(x * (x * (x * (k * f32(0.044715))) + k)))
    elif activation == "gelu_erf":
        erf = np.vectorize(math.erf)((x * f32(0.7071067811865476)).astype(np.float64)).astype(f32)
        x = f32(0.5) * x * (f32(1) + erf)
    elif activation == "silu":
        with np.errstate(over="ignore"):
            x = x / (f32(1) + np.exp(-x))
    if scale is not None:
        x = x * (np.asarray(scale).astype(f32) if np.ndim(scale) else f32(scale))
    if c is not None and beta != 0:
        x = x + f32(beta) * c.astype(f32)
    return x


def normal(rng, shape, dtype):
    return rng.standard_normal(shape).astype(np.float32).astype(NUMPY_DTYPES[dtype])


# ---- constants and gamma --------------------------------------------------------------------

def test_unit_roundoff():
    assert unit_roundoff("fp32") == 2.0 ** -24
    assert unit_roundoff("fp32_tc") == 2.0 ** -23
    assert unit_roundoff("fp16") == 2.0 ** -11
    assert unit_roundoff("bf16") == 2.0 ** -8
    with pytest.raises(ValueError):
        unit_roundoff("fp8")


def test_gamma():
    u = 2.0 ** -24
    assert gamma(0, u) == 0.0
    assert gamma(1, u) == u / (1 - u)
    assert gamma(2 ** 23, u) == 1.0                     # n u = 1/2
    assert gamma(1000, u) > 1000 * u                    # strictly above the first-order n u
    np.testing.assert_array_equal(gamma(np.array([1, 2]), 0.25), [1 / 3, 1.0])
    for n in (2 ** 24, 2 ** 25):
        with pytest.raises(ValueError):
            gamma(n, u)


def test_lipschitz_constants_bound_the_derivatives():
    x = np.linspace(-12, 12, 240001)
    for name, f in ACTIVATIONS.items():
        slope = np.abs(np.diff(f(x)) / np.diff(x)).max()
        assert slope <= ACTIVATION_LIPSCHITZ[name], name
        assert slope >= ACTIVATION_LIPSCHITZ[name] - 0.01, name       # safe but not loose


@pytest.mark.parametrize("name", ["gelu", "gelu_erf", "silu"])
def test_activation_device_error_allowance_covers_fp32_evaluation(name):
    # Every fp32 input in a wide band, evaluated with fp32 formulas as the kernels write them.
    z = np.concatenate([np.linspace(-60, 60, 400001), -np.logspace(-30, 2, 2001), np.logspace(-30, 2, 2001)])
    z = z.astype(np.float32)
    got = epilogue_fp32(z, activation=name).astype(np.float64)
    exact = ACTIVATIONS[name](z.astype(np.float64))
    allowance = ACTIVATION_DEVICE_ERROR[name] * (np.abs(z) + np.abs(exact)) + 2.0 ** -126
    assert np.all(np.abs(got - exact) <= allowance / 2)        # a factor 2 to spare for the device


# ---- correct arithmetic passes --------------------------------------------------------------

@pytest.mark.parametrize("dtype", IN_DTYPES)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
@pytest.mark.parametrize("k", [1, 2, 17, 300])
def test_fp32_accumulation_in_any_order_passes(dtype, out_dtype, k):
    rng = np.random.default_rng(k)
    a, b = normal(rng, (24, k), dtype), normal(rng, (k, 20), dtype)
    bound = gemm_error_bound(a, b, out_dtype=out_dtype)
    ref = reference_gemm(a, b)
    for order in (None, rng.permutation(k), range(k - 1, -1, -1)):
        out = round_to(accumulate_fp32(a, b, order).astype(np.float64), out_dtype)
        margin = assert_gemm_close(out, ref, bound=bound)
        assert 0 <= margin < 1


@pytest.mark.parametrize("block", [4, 8, 16])
@pytest.mark.parametrize("data", ["normal", "positive"])
def test_tensor_core_model_passes_the_tc_bound(block, data):
    rng = np.random.default_rng(block)
    a, b = normal(rng, (16, 512), "bfloat16"), normal(rng, (512, 16), "bfloat16")
    if data == "positive":                              # truncation errors all of one sign
        a, b = np.abs(a), np.abs(b)
    out = accumulate_tensor_core(a, b, block)
    assert assert_gemm_close(out, a=a, b=b, accumulate="fp32_tc") < 1


def test_tensor_core_truncation_breaks_the_round_to_nearest_bound():
    # acc = 1, then products just below the accumulator's ulp (2^-23): round-to-nearest keeps
    # each (it rounds up to one ulp); Fasi et al.'s truncating model drops them all. The error,
    # ~K 2^-23, is twice the fp32 round-to-nearest bound, so tensor-core kernels need "fp32_tc".
    # (An H200 keeps more alignment bits and loses ~1 ulp per 4 products here: 0.48 of the bound.)
    k = 1024
    a = np.full((1, k), (1 - 2 ** -10) * 2 ** -12, np.float16)
    b = np.full((k, 1), 2.0 ** -11, np.float16)
    a[0, 0], b[0, 0] = 1, 1
    tensor_core = accumulate_tensor_core(a, b, block=8)
    assert tensor_core[0, 0] == 1.0
    assert_gemm_close(accumulate_fp32(a, b), a=a, b=b, accumulate="fp32")
    with pytest.raises(AssertionError, match="outside the error bound"):
        assert_gemm_close(tensor_core, a=a, b=b, accumulate="fp32")
    assert assert_gemm_close(tensor_core, a=a, b=b, accumulate="fp32_tc") < 0.6


def test_fp16_accumulation_passes_its_own_bound():
    rng = np.random.default_rng(5)
    a, b = normal(rng, (16, 1024), "float16"), normal(rng, (1024, 16), "float16")
    assert assert_gemm_close(accumulate_fp16(a, b), a=a, b=b, accumulate="fp16") < 1


EPILOGUES = [
    dict(alpha=0.1),
    dict(bias="float16"),
    dict(activation="relu"), dict(activation="gelu"), dict(activation="gelu_erf"), dict(activation="silu"),
    dict(scale="scalar"), dict(scale="bfloat16"),
    dict(residual="float32", beta=-0.7),
    dict(alpha=-1.7, bias="bfloat16", activation="gelu", scale="float32", residual="float16", beta=0.3),
    dict(alpha=3.0, bias="float32", activation="silu", scale="scalar", residual="bfloat16", beta=2.0),
    dict(alpha=0.37, bias="float16", activation="gelu_erf", scale="float16", residual="float32", beta=-1.0),
]


def epilogue_tensors(rng, spec, m, n, spread=1.0):
    kw = dict(alpha=spec.get("alpha", 1.0), activation=spec.get("activation"), beta=spec.get("beta", 0.0))
    if spec.get("bias"):
        kw["bias"] = normal(rng, (n,), spec["bias"]) * spread
    if spec.get("scale") == "scalar":
        kw["scale"] = -0.83
    elif spec.get("scale"):
        kw["scale"] = normal(rng, (n,), spec["scale"])
    if spec.get("residual"):
        kw["c"] = normal(rng, (m, n), spec["residual"])
    return kw


@pytest.mark.parametrize("spec", EPILOGUES, ids=str)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
def test_fp32_epilogue_passes(spec, out_dtype):
    rng = np.random.default_rng(len(str(spec)))
    a, b = normal(rng, (32, 96), "bfloat16"), normal(rng, (96, 24), "bfloat16")
    kw = epilogue_tensors(rng, spec, 32, 24, spread=10.0)
    out = epilogue_fp32(accumulate_fp32(a, b), **kw).astype(NUMPY_DTYPES[out_dtype])
    assert assert_gemm_close(out, a=a, b=b, **kw) < 1


def test_k_zero_and_tiny_values():
    a, b = np.zeros((3, 0), np.float16), np.zeros((0, 4), np.float16)
    bias = np.array([0.0, 1e-7, -3.0, 6e-8], np.float16)     # zeros and fp16 subnormals
    out = epilogue_fp32(np.zeros((3, 4), np.float32), bias=bias, activation="gelu").astype(np.float16)
    assert assert_gemm_close(out, a=a, b=b, bias=bias, activation="gelu") < 1
    zeros = np.zeros((3, 4), np.float16)
    assert assert_gemm_close(zeros, a=a, b=b) == 0.0


# ---- broken kernels fail --------------------------------------------------------------------

@pytest.mark.parametrize("dtype", IN_DTYPES)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
@pytest.mark.parametrize("accumulate", ["fp32", "fp32_tc"])
@pytest.mark.parametrize("dropped", ["first", "last"])
def test_dropping_one_k_term_fails(dtype, out_dtype, accumulate, dropped):
    k = 64
    rng = np.random.default_rng(11)
    a, b = normal(rng, (32, k), dtype), normal(rng, (k, 32), dtype)
    out = accumulate_fp32(a, b, drop=0 if dropped == "first" else k - 1).astype(NUMPY_DTYPES[out_dtype])
    with pytest.raises(AssertionError, match="outside the error bound"):
        assert_gemm_close(out, a=a, b=b, accumulate=accumulate)


@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
@pytest.mark.parametrize("accumulate", ["fp32", "fp32_tc"])
@pytest.mark.parametrize("k", [64, 1024])
def test_fp16_accumulation_fails(out_dtype, accumulate, k):
    rng = np.random.default_rng(k)
    a, b = normal(rng, (32, k), "float16"), normal(rng, (k, 32), "float16")
    out = accumulate_fp16(a, b).astype(NUMPY_DTYPES[out_dtype])
    with pytest.raises(AssertionError, match="outside the error bound"):
        assert_gemm_close(out, a=a, b=b, accumulate=accumulate)


def _bias_after_activation(acc, **kw):
    bias = kw.pop("bias")
    return epilogue_fp32(acc, **kw) + bias.astype(np.float32)


def _scale_per_row(acc, **kw):
    kw["scale"] = kw["scale"][:, None]                  # square output: rows scaled instead
    return epilogue_fp32(acc, **kw)


def _residual_ignored(acc, **kw):
    return epilogue_fp32(acc, **{**kw, "c": None})


def _wrong_gelu(acc, **kw):
    return epilogue_fp32(acc, **{**kw, "activation": "gelu_erf"})


def _alpha_after_bias(acc, **kw):
    alpha = kw.pop("alpha")
    return epilogue_fp32(acc, **kw) * np.float32(alpha)


@pytest.mark.parametrize("broken", [_bias_after_activation, _scale_per_row, _residual_ignored, _wrong_gelu,
                                    _alpha_after_bias], ids=lambda f: f.__name__.strip("_"))
def test_epilogue_mistakes_fail(broken):
    rng = np.random.default_rng(3)
    a, b = normal(rng, (24, 64), "float16"), normal(rng, (64, 24), "float16")
    kw = epilogue_tensors(rng, dict(alpha=0.5, bias="float32", activation="gelu", scale="float32",
                                    residual="float16", beta=0.5), 24, 24)
    out = broken(accumulate_fp32(a, b), **kw)
    with pytest.raises(AssertionError, match="outside the error bound"):
        assert_gemm_close(out, a=a, b=b, **kw)


def test_non_finite_outputs_fail_unless_the_reference_agrees():
    rng = np.random.default_rng(4)
    a, b = normal(rng, (4, 8), "float16"), normal(rng, (8, 6), "float16")
    good = accumulate_fp32(a, b).astype(np.float16)
    for bad_value in (np.nan, np.inf, -np.inf):
        out = good.copy()
        out[1, 2] = bad_value
        with pytest.raises(AssertionError, match=r"worst at \(1, 2\): got (nan|inf|-inf)"):
            assert_gemm_close(out, a=a, b=b)
    # A NaN input makes the reference NaN in that row: NaN out is then right, a number is not.
    a_nan = a.copy()
    a_nan[2, 3] = np.nan
    out = good.copy()
    out[2, :] = np.nan
    assert_gemm_close(out, a=a_nan, b=b)
    with pytest.raises(AssertionError):
        assert_gemm_close(good, a=a_nan, b=b)


def test_overflow_to_inf_is_allowed_only_beyond_the_range():
    a = np.array([[256.0, 256.0]], np.float16)
    b = np.array([[200.0], [100.0]], np.float16)         # 76800 > fp16 max: the right answer is inf
    assert_gemm_close(np.array([[np.inf]], np.float16), a=a, b=b)
    with pytest.raises(AssertionError):
        assert_gemm_close(np.array([[-np.inf]], np.float16), a=a, b=b)
    # 65504, fp16's largest: its bound (the output rounding's 32 alone) reaches the 65520 where
    # round-to-nearest gives inf, so a kernel's inf there is within the bound too.
    b_edge = np.array([[200.0], [55.875]], np.float16)
    assert_gemm_close(np.array([[np.inf]], np.float16), a=a, b=b_edge)
    b_small = np.array([[200.0], [30.0]], np.float16)    # 58880 fits: inf is wrong
    with pytest.raises(AssertionError):
        assert_gemm_close(np.array([[np.inf]], np.float16), a=a, b=b_small)


@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
def test_overflow_threshold_is_where_round_to_nearest_gives_inf(out_dtype):
    # max + ulp(max)/2 rounds to inf (ties to even), so an exact value there may come out as inf
    # even with no error allowance at all; the largest float64 below it may not (it rounds to max).
    info = ml_dtypes.finfo(NUMPY_DTYPES[out_dtype])
    edge = np.array([[float(info.max) + float(info.eps) * 2.0 ** (info.maxexp - 2)]])
    below = np.nextafter(edge, 0)
    assert round_to(edge, out_dtype)[0, 0] == np.inf and round_to(below, out_dtype)[0, 0] == info.max
    inf = np.array([[np.inf]], NUMPY_DTYPES[out_dtype])
    assert_gemm_close(inf, edge, bound=np.zeros((1, 1)))
    assert_gemm_close(-inf, -edge, bound=np.zeros((1, 1)))
    with pytest.raises(AssertionError):
        assert_gemm_close(inf, below, bound=np.zeros((1, 1)))


def test_failure_message_names_the_worst_element():
    rng = np.random.default_rng(6)
    a, b = normal(rng, (4, 16), "bfloat16"), normal(rng, (16, 6), "bfloat16")
    out = accumulate_fp32(a, b).astype(BF16)
    out[3, 5] += np.float32(1.0)
    out[0, 1] += np.float32(0.1)
    with pytest.raises(AssertionError) as info:
        assert_gemm_close(out, a=a, b=b, msg="v9: ")
    text = str(info.value)
    for part in ("v9: ", "2 of 24 elements", "(4, 6) bfloat16", "worst at (3, 5)", "got", "expected", "bound",
                 "error/bound"):
        assert part in text, (part, text)


def test_the_worst_element_named_is_a_failing_one_and_an_empty_output_has_no_margin():
    # An inf the reference agrees with has no finite error/bound (inf - inf), but it passes: the
    # message must point at the element that failed, not at it.
    out = np.array([[np.inf, 1.0, 2.5]], np.float32)
    ref = np.array([[np.inf, 1.0, 2.0]])
    with pytest.raises(AssertionError, match=r"1 of 3 elements outside .* worst at \(0, 2\): got 2\.5, expected 2\.0"):
        assert_gemm_close(out, ref, bound=np.full(ref.shape, 0.1))
    assert assert_gemm_close(out[:, 1:2], ref[:, 1:2], bound=np.full((1, 1), 0.1)) == 0.0
    # Nothing finite to measure (an agreeing inf alone): the margin is 0, not -inf.
    assert assert_gemm_close(out[:, :1], ref[:, :1], bound=np.full((1, 1), 0.1)) == 0.0
    empty = np.zeros((0, 3), np.float16)
    margin = assert_gemm_close(empty, a=np.zeros((0, 4), np.float16), b=np.zeros((4, 3), np.float16))
    assert margin == 0.0 and isinstance(margin, float)


def test_precomputed_bound_and_reference_are_used():
    rng = np.random.default_rng(7)
    a, b = normal(rng, (5, 9), "float16"), normal(rng, (9, 3), "float16")
    out = accumulate_fp32(a, b).astype(np.float16)
    ref = reference_gemm(a, b)
    with pytest.raises(AssertionError):
        assert_gemm_close(out, ref, bound=np.full(ref.shape, 1e-30))
    assert assert_gemm_close(out, ref, bound=np.full(ref.shape, 1.0)) < 0.01
    with pytest.raises(AssertionError):
        assert_gemm_close(out, ref + 1.0, a=a, b=b)      # the given reference, not a recomputed one
    for given in ({}, dict(a=a), dict(b=b), dict(ref=ref, a=a), dict(bound=np.full(ref.shape, 1.0), b=b)):
        with pytest.raises(TypeError, match="needs a= and b= unless both ref and bound are given"):
            assert_gemm_close(out, **given)
    # A bound (or reference) of another shape is refused, never broadcast: a (1, N) or scalar
    # bound would judge every row by one row's allowance.
    for wrong in (np.full((1, 3), 1.0), np.full((5, 1), 1.0), np.array(1.0)):
        with pytest.raises(AssertionError, match="shape mismatch"):
            assert_gemm_close(out, ref, bound=wrong)
    with pytest.raises(AssertionError, match="shape mismatch"):
        assert_gemm_close(out, ref[:, :1], bound=np.full(ref.shape, 1.0))


def test_bound_grows_with_k_and_the_kind():
    rng = np.random.default_rng(8)
    a, b = normal(rng, (4, 256), "float16"), normal(rng, (256, 4), "float16")
    exact_part = 2.0 ** -24 * np.abs(reference_gemm(a, b))
    plain = gemm_error_bound(a, b, out_dtype="float32") - exact_part
    tc = gemm_error_bound(a, b, out_dtype="float32", accumulate="fp32_tc") - exact_part
    half = gemm_error_bound(a[:, :128], b[:128], out_dtype="float32")
    np.testing.assert_allclose(tc / plain, 4.0, rtol=1e-3)            # n = 2K and u = 2^-23
    assert np.all(half < gemm_error_bound(a, b, out_dtype="float32"))
    abs_ab = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    np.testing.assert_allclose(plain, gamma(256, 2.0 ** -24) * abs_ab, rtol=1e-5)


# ---- the integer-exactness oracle -----------------------------------------------------------

@pytest.mark.parametrize("dtype", IN_DTYPES)
@pytest.mark.parametrize("k", [1, 3, 64, 1000, 4096])
def test_integer_inputs_respect_the_budget(dtype, k):
    rng = np.random.default_rng(k)
    x = integer_inputs((50, k), k, rng, dtype)
    assert x.dtype == NUMPY_DTYPES[dtype]
    values = x.astype(np.float64)
    r = np.abs(values).max()
    assert np.all(values == np.round(values))
    assert k * r * r <= 2 ** 24
    assert r <= {"float16": 2048, "bfloat16": 256}[dtype]
    assert r >= min(math.isqrt(2 ** 24 // k), {"float16": 2048, "bfloat16": 256}[dtype]) // 2   # not needlessly small


def test_integer_range_is_the_documented_r():
    # r = floor(sqrt(budget / K)), capped where the dtype stops holding every integer: float16 has
    # 11 significant bits (2049 is not a float16), bfloat16 8 (257 is not a bfloat16).
    assert float(np.float16(2049)) != 2049 and float(BF16(257)) != 257
    assert integer_range(1, "float16") == 2048 and integer_range(1, "bfloat16") == 256
    assert integer_range(1, "float32") == 4096                      # sqrt(2^24)
    assert integer_range(0, "float32") == 4096                      # K = 0: as K = 1
    assert integer_range(1024, "float16") == 128                    # sqrt(2^14)
    assert integer_range(1000, "bfloat16") == 129                   # isqrt(16777)
    assert integer_range(1000, "float16", budget=2 ** 20) == 32     # isqrt(1048)
    assert integer_range(1, "float32", budget=2 ** 60) == 2 ** 24   # float32 holds every integer to 2^24


def test_integer_inputs_reach_both_ends_of_the_range():
    k = 2 ** 22                                                     # r = 2: values -2 .. 2
    values = integer_inputs((1, 2000), k, np.random.default_rng(3), "float16").astype(np.float64)
    assert set(np.unique(values)) == {-2.0, -1.0, 0.0, 1.0, 2.0}


@pytest.mark.parametrize("k", [1, 7, 256, 4096])
def test_float32_sums_of_integer_products_are_exact_in_any_order(k):
    rng = np.random.default_rng(k)
    a = integer_inputs((8, k), k, rng, "float16")
    b = integer_inputs((k, 8), k, rng, "float16")
    products = a.astype(np.int64)[:, :, None] * b.astype(np.int64)[None, :, :]      # (8, k, 8)
    for order in (rng.permutation(k), rng.permutation(k), np.argsort(-np.abs(products[0, :, 0]))):
        ordered = products[:, order, :]
        exact_partials = np.cumsum(ordered, axis=1)
        fp32_partials = np.add.accumulate(ordered.astype(np.float32), axis=1, dtype=np.float32)
        np.testing.assert_array_equal(fp32_partials.astype(np.int64), exact_partials)
        assert np.abs(exact_partials).max() <= 2 ** 24


@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
@pytest.mark.parametrize("dtype", IN_DTYPES)
def test_integer_oracle_is_bitwise(dtype, out_dtype):
    rng = np.random.default_rng(9)
    k = 777
    a, b = integer_inputs((16, k), k, rng, dtype), integer_inputs((k, 12), k, rng, dtype)
    expected = round_to(reference_gemm(a, b), out_dtype)
    out_dt = NUMPY_DTYPES[out_dtype]
    for acc in (accumulate_fp32(a, b), accumulate_fp32(a, b, rng.permutation(k)), accumulate_tensor_core(a, b, 8)):
        with np.errstate(over="ignore"):                  # fp16 outputs overflow to inf on both sides
            assert_bitwise_equal(acc.astype(out_dt), expected)
    # The same output one ulp off in a single element is caught, with the element named.
    off = expected.copy()
    off.view(np.dtype(f"u{off.itemsize}"))[7, 4] ^= 1
    with pytest.raises(AssertionError, match=r"1 of 192 elements differ .* worst at \(7, 4\).*\(0x"):
        assert_bitwise_equal(off, expected)


def test_bitwise_equal_zeros_and_nans():
    plus, minus = np.array([0.0, np.nan], np.float16), np.array([-0.0, np.nan], np.float16)
    assert_bitwise_equal(plus, minus)
    with pytest.raises(AssertionError):
        assert_bitwise_equal(plus, minus, signed_zeros=True)
    with pytest.raises(AssertionError, match="dtype/shape"):
        assert_bitwise_equal(plus, plus.astype(np.float32))


def test_nans_of_any_payload_are_equal_bitwise():
    # A kernel's NaN need not carry the reference's bits (0x7e00 is CUDA's canonical half NaN).
    quiet, other = np.array([0x7E00, 0x7C01, 0xFE00], np.uint16), np.array([0x7E01, 0x7E00, 0x7E00], np.uint16)
    assert_bitwise_equal(quiet.view(np.float16), other.view(np.float16))
    with pytest.raises(AssertionError):
        assert_bitwise_equal(quiet.view(np.float16), np.array([0x7E00, 0x7C00, 0xFE00], np.uint16).view(np.float16))


def test_an_error_equal_to_the_bound_passes():
    ref = np.array([[1.0, -2.0]])
    bound = np.array([[0.5, 0.25]])
    assert assert_gemm_close(np.array([[1.5, -2.25]], np.float32), ref, bound=bound) == 1.0
    with pytest.raises(AssertionError, match="1 of 2 elements outside the error bound"):
        assert_gemm_close(np.array([[1.5, -2.5]], np.float32), ref, bound=bound)


def documented_bound(a, b, *, accumulate="fp32", out_dtype="float32", alpha=1.0, bias=None, activation=None,
                     scale=None, c=None, beta=0.0):
    """The bound exactly as the module docstring of deepgemm.testing.bounds states it, written out
    independently of the implementation (exact values from float64, stage by stage)."""
    inflate = 1 + 2.0 ** -20                                     # every unit roundoff, inflated
    u, eta = 2.0 ** -24 * inflate, 2.0 ** -126
    per_term, u_acc, eta_acc = {"fp32": (1, 2.0 ** -24, eta), "fp32_tc": (2, 2.0 ** -23, eta),
                                "fp16": (1, 2.0 ** -11, 2.0 ** -14), "fp16_tc": (2, 2.0 ** -10, 2.0 ** -14),
                                "bf16": (1, 2.0 ** -8, eta)}[accumulate]   # bf16: fp16acc_simt on bf16 inputs
    u_out, tiny_out = {"float16": (2.0 ** -11, 2.0 ** -24), "bfloat16": (2.0 ** -8, 2.0 ** -133),
                       "float32": (2.0 ** -24, 2.0 ** -149)}[out_dtype]
    lipschitz = {"relu": 1.0, "gelu": 1.13, "gelu_erf": 1.13, "silu": 1.10}
    eps_act = {"relu": 0.0, "gelu": 2.0 ** -20, "gelu_erf": 2.0 ** -20, "silu": 2.0 ** -20}

    def r(v):   # relative error of multiplying by the Python float v in fp32
        v = abs(float(v))
        if v == 0 or math.log2(v).is_integer():
            return 0.0
        return u if float(np.float32(v)) == v else 2 * u / (1 - 2 * u)

    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    n = per_term * a.shape[1]
    nu = n * u_acc * inflate
    e = nu / (1 - nu) * (np.abs(a64) @ np.abs(b64)) + n * eta_acc                      # e_acc
    x = a64 @ b64
    e = abs(alpha) * e + r(alpha) * abs(alpha) * (np.abs(x) + e) + eta                # e_1
    z = alpha * x
    if bias is not None:
        z = z + bias.astype(np.float64)
        e = e + u * (np.abs(z) + e) + eta                                              # e_2
    w = z
    if activation is not None:
        L, eps = lipschitz[activation], eps_act[activation]
        w = ACTIVATIONS[activation](z)
        e = L * e + eps * (np.abs(z) + e + np.abs(w) + L * e) + eta                    # e_3
    f = w
    if scale is not None:
        s = np.asarray(scale).astype(np.float64)
        rs = r(s) if s.ndim == 0 else u
        e = np.abs(s) * e + rs * np.abs(s) * (np.abs(w) + e) + eta                     # e_4
        f = w * s
    if c is not None and beta != 0:
        beta_c = beta * c.astype(np.float64)
        f = f + beta_c
        e = (1 + u) * (e + r(beta) * np.abs(beta_c)) + u * np.abs(f) + eta             # e_5
    return e + u_out * inflate * (np.abs(f) + e) + tiny_out + eta


@pytest.mark.parametrize("accumulate,out_dtype", [("fp32", "float32"), ("fp32_tc", "bfloat16"),
                                                  ("fp16", "float16"), ("fp16_tc", "float32"),
                                                  ("bf16", "float32")])
@pytest.mark.parametrize("spec", EPILOGUES + [dict(alpha=0.5, scale="scalar", residual="float16", beta=0.3)], ids=str)
def test_the_bound_is_the_documented_formula(spec, accumulate, out_dtype):
    """Stage by stage, every term: a bound larger than documented would pass wrong outputs, a
    smaller one would fail correct kernels. Zero rows of A leave only the underflow terms (eta,
    tiny_out), which the other rows' values would drown."""
    rng = np.random.default_rng(13)
    a, b = normal(rng, (6, 40), "float16"), normal(rng, (40, 5), "float16")
    a[2:4] = 0
    kw = epilogue_tensors(rng, spec, 6, 5)
    if spec.get("residual"):
        kw["c"][2] = 0
    if spec.get("bias"):
        kw["bias"][1] = 0
    got = gemm_error_bound(a, b, accumulate=accumulate, out_dtype=out_dtype, **kw)
    np.testing.assert_allclose(got, documented_bound(a, b, accumulate=accumulate, out_dtype=out_dtype, **kw),
                               rtol=1e-12, atol=0)


def test_unknown_accumulate_and_output_dtypes_are_refused():
    a = np.ones((2, 3), np.float16)
    # out_dtype defaults to the inputs' 16-bit dtype.
    for dtype in ("float16", "bfloat16"):
        x = a.astype(NUMPY_DTYPES[dtype])
        np.testing.assert_array_equal(gemm_error_bound(x, x.T), gemm_error_bound(x, x.T, out_dtype=dtype))
    with pytest.raises(ValueError, match="unknown accumulate 'tf32'"):
        gemm_error_bound(a, a.T, accumulate="tf32")
    with pytest.raises(ValueError, match="out_dtype must be float16, bfloat16 or float32"):
        gemm_error_bound(a, a.T, out_dtype="float64")
    with pytest.raises(ValueError, match="out_dtype is required"):
        gemm_error_bound(a.astype(np.float32), a.T.astype(np.float32))


@pytest.mark.parametrize("spec", EPILOGUES, ids=str)
def test_the_bound_walk_computes_exactly_the_reference(spec):
    # assert_gemm_close takes its reference from the bound's walk: it must be reference_gemm's.
    from deepgemm.testing.bounds import _reference_and_bound
    rng = np.random.default_rng(12)
    a, b = normal(rng, (6, 40), "float16"), normal(rng, (40, 5), "float16")
    kw = epilogue_tensors(rng, spec, 6, 5)
    walked, _ = _reference_and_bound(a, b, accumulate="fp32", out_dtype="float32", **kw)
    np.testing.assert_array_equal(walked, reference_gemm(a, b, **kw))


def test_a_scalar_costs_no_rounding_when_exact_one_when_an_fp32_number_and_two_otherwise():
    """The bound's r(v) for alpha, beta and a scalar scale: multiplying by 0 or a power of two is
    exact in fp32; by an fp32 number, one rounding of the product; by any other Python float, its
    own rounding to fp32 as well. Measured on the public bound: an fp32 output of integer inputs
    (the accumulation exact) has, for alpha = 2, only the output's rounding; for alpha = 3, one
    more u of |alpha x|."""
    from deepgemm.testing.bounds import _scalar_rounding
    u = unit_roundoff("fp32")
    for v in (0.0, 1.0, 2.0, -4.0, 0.25, 2.0 ** -20, 2.0 ** 40):
        assert _scalar_rounding(v, u) == 0.0, v
    for v in (3.0, -1.5, 0.75, float(np.float32(0.1))):
        assert _scalar_rounding(v, u) == u, v
    for v in (0.1, 1 / 3, -2.2):
        assert _scalar_rounding(v, u) == gamma(2, u), v
    a = np.array([[1, 2], [3, 4]], np.float16)
    b = np.array([[1, 0], [2, 1]], np.float16)
    exact2 = gemm_error_bound(a, b, out_dtype="float32", alpha=2.0)
    exact1 = gemm_error_bound(a, b, out_dtype="float32", alpha=1.0)
    inexact = gemm_error_bound(a, b, out_dtype="float32", alpha=3.0)
    assert np.all(exact2 > 0) and np.all(exact2 <= 2 * exact1 * (1 + 1e-6) + 1e-30)
    assert np.all(inexact > 1.5 * exact2)
