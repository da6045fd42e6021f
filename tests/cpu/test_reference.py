"""deepgemm.reference: the float64 reference GEMM and single rounding to fp16/bf16/fp32."""
import math
import subprocess
import sys
import warnings

import ml_dtypes
import numpy as np
import pytest

from deepgemm.reference import ACTIVATIONS, _round_via_float64, dtype_name, reference_gemm, round_to

BF16 = ml_dtypes.bfloat16


def hand_gelu_tanh(x):
    return 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


HAND = {
    "relu": lambda x: max(x, 0.0),
    "gelu": hand_gelu_tanh,
    "gelu_erf": lambda x: 0.5 * x * (1 + math.erf(x / math.sqrt(2))),
    "silu": lambda x: x / (1 + math.exp(-x)) if x > -700 else 0.0,
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_matches_hand_formula(name):
    xs = np.array([-800.0, -30.0, -3.0, -1.0, -1e-3, 0.0, 1e-3, 0.5, 1.0, 2.4, 7.0, 30.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")                   # no overflow warnings at the extremes
        got = ACTIVATIONS[name](xs)
    expected = np.array([HAND[name](x) for x in xs])
    np.testing.assert_allclose(got, expected, rtol=1e-14, atol=1e-300)


def test_activation_landmarks():
    # Known values, independent of the formulas above.
    assert ACTIVATIONS["gelu_erf"](np.array([1.0]))[0] == pytest.approx(0.8413447460685429, rel=1e-15)
    assert ACTIVATIONS["silu"](np.array([1.0]))[0] == pytest.approx(0.7310585786300049, rel=1e-15)
    assert ACTIVATIONS["gelu"](np.array([1.0]))[0] == pytest.approx(0.8411919906082768, rel=1e-15)
    assert ACTIVATIONS["relu"](np.array([-2.0, 3.0])).tolist() == [0.0, 3.0]


A = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float16)
B = np.array([[1, -1], [0.5, 2], [-2, 0.25]], dtype=np.float16)
AB = np.array([[-4.0, 3.75], [-5.5, 7.5]])              # worked by hand


def test_plain_product_by_hand():
    got = reference_gemm(A, B)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, AB)


@pytest.mark.parametrize("part, kwargs, expected", [
    ("alpha", dict(alpha=2.0), [[-8.0, 7.5], [-11.0, 15.0]]),
    ("bias per column", dict(bias=np.array([1, -2], np.float32)), [[-3.0, 1.75], [-4.5, 5.5]]),
    ("relu", dict(activation="relu"), [[0.0, 3.75], [0.0, 7.5]]),
    ("scalar scale", dict(scale=0.5), [[-2.0, 1.875], [-2.75, 3.75]]),
    ("vector scale per column", dict(scale=np.array([2, -1], BF16)), [[-8.0, -3.75], [-11.0, -7.5]]),
    ("residual", dict(c=np.array([[1, 2], [3, 4]], np.float16), beta=-1.0), [[-5.0, 1.75], [-8.5, 3.5]]),
])
def test_each_epilogue_part_by_hand(part, kwargs, expected):
    np.testing.assert_array_equal(reference_gemm(A, B, **kwargs), expected)


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_applied_elementwise_after_bias(name):
    bias = np.array([0.25, -0.5], np.float16)
    expected = [[HAND[name](AB[i, j] * 0.5 + bias[j]) for j in range(2)] for i in range(2)]
    np.testing.assert_allclose(reference_gemm(A, B, alpha=0.5, bias=bias, activation=name), expected, rtol=1e-14)


def test_whole_chain_by_hand():
    # acc*0.5 = [[-2, 1.875], [-2.75, 3.75]]; +bias -> [[-1, -0.125], [-1.75, 1.75]];
    # relu -> [[0, 0], [0, 1.75]]; *[2, -1] -> [[0, 0], [0, -1.75]]; -1*C -> below.
    got = reference_gemm(A, B, alpha=0.5, bias=np.array([1, -2], np.float32), activation="relu",
                         scale=np.array([2, -1], BF16), c=np.array([[1, 2], [3, 4]], np.float16), beta=-1.0)
    np.testing.assert_array_equal(got, [[-1.0, -2.0], [-3.0, -5.75]])


def test_beta_zero_does_not_read_c():
    c = np.full((2, 2), np.nan, np.float32)
    np.testing.assert_array_equal(reference_gemm(A, B, c=c, beta=0.0), AB)


def test_a_residual_without_beta_is_added_once_as_gemm_adds_it():
    # The testing API reads beta as deepgemm.gemm() does: a reference that dropped a c given
    # without beta would agree with a kernel that never reads C.
    from deepgemm import api
    from deepgemm.testing import assert_gemm_close, gemm_error_bound
    c = np.array([[1, 2], [3, 4]], np.float16)
    np.testing.assert_array_equal(reference_gemm(A, B, c=c), AB + c)
    assert api._epilogue_scalars(1.0, None, None, None, c)[2] == 1.0
    bound = gemm_error_bound(A, B, c=c)
    np.testing.assert_array_equal(bound, gemm_error_bound(A, B, c=c, beta=1.0))
    assert_gemm_close((AB + c).astype(np.float16), a=A, b=B, c=c)
    with pytest.raises(AssertionError):                 # an output that ignored C
        assert_gemm_close(AB.astype(np.float16), a=A, b=B, c=c)


@pytest.mark.parametrize("call", ["reference_gemm", "gemm_error_bound", "assert_gemm_close"])
def test_beta_without_a_residual_is_refused_by_name(call):
    from deepgemm import testing
    run = {"reference_gemm": lambda **kw: testing.reference_gemm(A, B, **kw),
           "gemm_error_bound": lambda **kw: testing.gemm_error_bound(A, B, **kw),
           "assert_gemm_close": lambda **kw: testing.assert_gemm_close(AB.astype(np.float16), a=A, b=B, **kw)}[call]
    with pytest.raises(ValueError, match=r"^beta: given without a residual c"):
        run(beta=0.5)
    run(beta=0.0)   # zero names no residual: fine


def test_k_zero_is_epilogue_of_zeros():
    a, b = np.zeros((3, 0), np.float16), np.zeros((0, 2), np.float16)
    bias = np.array([1.0, -2.0], np.float32)
    c = np.arange(6, dtype=np.float32).reshape(3, 2)
    got = reference_gemm(a, b, bias=bias, activation="gelu", scale=3.0, c=c, beta=0.5)
    row = [3 * hand_gelu_tanh(1.0), 3 * hand_gelu_tanh(-2.0)]
    np.testing.assert_allclose(got, np.array([row] * 3) + 0.5 * c, rtol=1e-15)


@pytest.mark.parametrize("m, n", [(0, 4), (3, 0), (0, 0)])
def test_empty_result(m, n):
    got = reference_gemm(np.zeros((m, 5), np.float16), np.zeros((5, n), np.float16), bias=np.zeros(n, np.float16))
    assert got.shape == (m, n)


@pytest.mark.parametrize("dtype", [np.float16, BF16, np.float32, np.float64])
def test_strided_views_match_contiguous(dtype):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((7, 9)).astype(dtype)
    b = rng.standard_normal((9, 5)).astype(dtype)
    a_col = np.asfortranarray(a)                       # column-major
    big = np.zeros((12, 20), dtype)
    big[1:10:1, 2:17:3] = b                            # strided view with gaps
    b_view = big[1:10, 2:17:3]
    assert not b_view.flags.c_contiguous and not a_col.flags.c_contiguous
    expected = a.astype(np.float64) @ b.astype(np.float64)
    # fp32/fp64 products round in float64 sums whose order BLAS picks per layout: not bit-exact.
    np.testing.assert_allclose(reference_gemm(a_col, b_view), expected, rtol=1e-13)
    np.testing.assert_allclose(reference_gemm(b_view.T, a_col.T), expected.T, rtol=1e-13)


def test_rejects_bad_inputs():
    with pytest.raises(TypeError):
        reference_gemm(np.ones((2, 2), np.int32), np.ones((2, 2), np.int32))
    with pytest.raises(ValueError, match=r"need a \(M x K\) and b \(K x N\), got \(2, 3\) and \(2, 3\)"):
        reference_gemm(np.ones((2, 3), np.float16), np.ones((2, 3), np.float16))
    with pytest.raises(ValueError, match="need a"):
        reference_gemm(np.ones(3, np.float16), np.ones((3, 2), np.float16))
    with pytest.raises(ValueError):
        reference_gemm(A, B, bias=np.ones(3, np.float16))
    # Operands that NumPy would broadcast are refused: a one-element bias or scale, or a single
    # row of C, stands for a wrong call, not for a value repeated over the output.
    for kw, what in ((dict(bias=np.ones(1, np.float16)), "bias must have shape"),
                     (dict(bias=np.ones((1, 2), np.float16)), "bias must have shape"),
                     (dict(scale=np.ones(1, np.float32)), "scale must have shape"),
                     (dict(c=np.ones((1, 2), np.float32), beta=1.0), "residual c must be"),
                     (dict(c=np.ones(2, np.float32), beta=1.0), "residual c must be")):
        with pytest.raises(ValueError, match=what):
            reference_gemm(A, B, **kw)
    with pytest.raises(ValueError):
        reference_gemm(A, B, activation="tanh")
    # A dtype that is no dtype is named as given (not as the dtype attribute it lacks).
    for bad, shown in (("fp8", "'fp8'"), (3, "got 3"), (np.int8, "int8")):
        with pytest.raises(TypeError, match=shown):
            dtype_name(bad)


class FakeCupyArray:
    """Stands in for cupy.ndarray: recognised by its module, copied to the host with .get()."""
    __module__ = "cupy._core.core"

    def __init__(self, host):
        self.host, self.dtype = host, host.dtype

    def get(self):
        return self.host.copy()


class FakeTorchDtype:
    __module__ = "torch"

    def __str__(self):
        return "torch.bfloat16"


class FakeTorchBf16Tensor:
    """Stands in for a CUDA torch.bfloat16 tensor: NumPy cannot take it, float() widens exactly."""
    __module__ = "torch"
    dtype = FakeTorchDtype()

    def __init__(self, values):
        self.values = values.astype(BF16)

    def detach(self):
        return self

    def float(self):
        return FakeTorchFloatTensor(self.values.astype(np.float32))


class FakeTorchFloatTensor:
    __module__ = "torch"

    def __init__(self, values):
        self.values = values

    def cpu(self):
        return self

    def numpy(self):
        return self.values


def test_device_arrays_are_brought_to_the_host():
    got = reference_gemm(FakeCupyArray(A), FakeTorchBf16Tensor(B.astype(np.float32)))
    np.testing.assert_array_equal(got, AB)
    assert dtype_name(FakeTorchBf16Tensor(B)) == "bfloat16"


def test_import_needs_neither_cupy_nor_torch():
    code = ("import sys; sys.modules['cupy'] = None; sys.modules['torch'] = None\n"
            "import numpy as np, deepgemm.reference as r\n"
            "print(r.reference_gemm(np.ones((2, 3), np.float16), np.ones((3, 1), np.float16)).ravel())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[3. 3.]"


# ---- round_to -----------------------------------------------------------------------------

BF16_MAX = float(ml_dtypes.finfo(BF16).max)


@pytest.mark.parametrize("x, single", [
    (1 + 2 ** -8 + 2 ** -30, 1 + 2 ** -7),               # just above a tie: float32 makes it the tie
    (-(1 + 2 ** -8 + 2 ** -30), -(1 + 2 ** -7)),
    (2 ** -8 + 2 ** -16 + 2 ** -40, 2 ** -8 + 2 ** -15),  # same one binade lower
    (2 ** -134 + 2 ** -160, 2 ** -133),                  # bf16 subnormal range: tie-plus-tiny rounds up
    (BF16_MAX + 2 ** 119 - 2 ** 90, BF16_MAX),           # below the overflow threshold stays finite
])
def test_bf16_single_rounding_where_double_rounding_differs(x, single):
    # Rounding twice, through float32 first (what ml_dtypes' own float64 cast did before 0.7):
    # the case is one where that gives another value.
    double = float(np.array(x).astype(np.float32).astype(BF16).astype(np.float64))
    got = round_to(np.array([x]), "bfloat16")
    assert got.dtype == np.dtype(BF16)
    assert float(got[0]) == single
    assert double != single


def _bf16_neighbours(r):
    bits = r.view(np.uint16).astype(np.int32)
    up = np.where(r.astype(np.float64) >= 0, bits + 1, bits - 1).astype(np.uint16).view(BF16)
    down = np.where(r.astype(np.float64) > 0, bits - 1, bits + 1).astype(np.uint16).view(BF16)
    return up.astype(np.float64), down.astype(np.float64)


def test_bf16_rounding_is_nearest_even_everywhere():
    rng = np.random.default_rng(1)
    # Random values over the whole bf16 range, plus exact midpoints and midpoints +- a hair.
    base = rng.integers(0x0001, 0x7F7F, size=20000).astype(np.uint16).view(BF16).astype(np.float64)
    base *= rng.choice([-1.0, 1.0], size=base.size)
    up, _ = _bf16_neighbours(base.astype(BF16))
    mid = (base + up) / 2                                # exact in float64
    values = np.concatenate([np.ldexp(rng.uniform(0.5, 1, 20000), rng.integers(-140, 128, 20000)),
                             mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf)])
    r = round_to(values, "bfloat16")
    r64 = r.astype(np.float64)
    finite = np.isfinite(r64)
    up, down = _bf16_neighbours(r[finite])
    x = values[finite]
    err = np.abs(x - r64[finite])
    assert np.all(err <= np.abs(x - up)) and np.all(err <= np.abs(x - down))
    tie = (err == np.abs(x - up)) | (err == np.abs(x - down))
    assert np.all(r[finite][tie].view(np.uint16) % 2 == 0)          # ties went to the even one
    assert tie.sum() > 1000                                          # and the test saw many ties
    assert np.all(np.abs(values[~finite]) >= BF16_MAX)


def test_bf16_overflow_and_specials():
    got = round_to(np.array([BF16_MAX + 2 ** 119, -np.inf, np.nan, -0.0, 2 ** -200]), "bfloat16").astype(np.float64)
    assert got[0] == np.inf and got[1] == -np.inf and np.isnan(got[2])
    assert got[3] == 0 and np.signbit(got[3]) and got[4] == 0


def test_float16_single_rounding_agrees_with_the_generic_algorithm():
    rng = np.random.default_rng(2)
    x = np.concatenate([np.ldexp(rng.uniform(-1, 1, 50000), rng.integers(-30, 18, 50000)),
                        np.arange(-70000.0, 70000.0, 0.5 ** 3)[::97]])
    via_numpy = round_to(x, "float16")
    assert via_numpy.dtype == np.float16
    np.testing.assert_array_equal(via_numpy.astype(np.float64), _round_via_float64(x, "float16"))


def test_float32_rounding():
    x = np.array([1 + 2 ** -24, 1 + 2 ** -24 + 2 ** -40, 1e300])
    got = round_to(x, "fp32")
    assert got.dtype == np.float32
    assert got.tolist() == [1.0, 1 + 2 ** -23, np.inf]


def test_to_host_reads_torch_tensors_with_their_dtype_and_values():
    torch = pytest.importorskip("torch")
    from deepgemm.reference import to_host
    values = [1.5, -2.25, 65504.0, 2.0 ** -24]
    for dtype, expect in ((torch.float16, np.float16), (torch.float32, np.float32), (torch.bfloat16, ml_dtypes.bfloat16)):
        t = torch.tensor(values, dtype=dtype)
        got = to_host(t)
        assert isinstance(got, np.ndarray) and got.dtype == expect
        np.testing.assert_array_equal(got.astype(np.float64), t.double().numpy())


def test_an_activation_without_xp_computes_where_its_input_lives():
    from deepgemm.reference import apply_activation
    x = np.linspace(-4, 4, 33)
    for name in ACTIVATIONS:
        np.testing.assert_array_equal(apply_activation(name, x), apply_activation(name, x, np))
    assert apply_activation(None, x) is x
