"""deepgemm.testing.strategies: problems are valid, views have the promised geometry, draws shrink."""
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, find, given, settings, strategies as st
from hypothesis.errors import NoSuchExample

from deepgemm.reference import NUMPY_DTYPES, reference_gemm, round_to
from deepgemm.testing import assert_bitwise_equal
from deepgemm.testing.strategies import (LDD_PAD, NO_EPILOGUE, PRIMES, TILE_EDGES, GemmProblem, dims, gemm_problems,
                                         make_inputs, problem_is_exact, strided_matrix)

FIND = settings(database=None, derandomize=True, max_examples=5000)


def data_offset(view, allocation) -> int:
    return view.__array_interface__["data"][0] - allocation.__array_interface__["data"][0]


def check_geometry(view, rows, cols, layout, ld, offset, dtype):
    assert view.shape == (rows, cols) and view.dtype == dtype
    item = view.itemsize
    allocation = view.base
    assert allocation.ndim == 1 and allocation.flags.owndata
    if rows and cols:                                   # an empty view has no meaningful pointer
        assert view.strides == ((ld * item, item) if layout == "row" else (item, ld * item))
        assert data_offset(view, allocation) == offset * item
    outer, inner = (rows, cols) if layout == "row" else (cols, rows)
    assert allocation.size == offset + outer * ld and ld >= max(1, inner)
    # Everything in the allocation outside the view (offset gap, row/column padding) is NaN.
    assert np.isnan(allocation.astype(np.float32)).sum() == allocation.size - rows * cols
    assert np.isfinite(view.astype(np.float32)).all()


def test_strided_matrix_layout_by_hand():
    values = np.arange(24, dtype=np.float32).reshape(4, 6).astype(np.float16)
    col = strided_matrix(4, 6, "col", ld_pad=3, offset=5, values=values)
    flat = col.base
    assert flat.size == 5 + 6 * 7                       # offset + cols * (rows + pad)
    for i in range(4):
        for j in range(6):
            assert flat[5 + j * 7 + i] == values[i, j]  # column-major: element (i, j) at j*ld + i
    row = strided_matrix(4, 6, "row", ld_pad=2, offset=1, values=values)
    assert all(row.base[1 + i * 8 + j] == values[i, j] for i in range(4) for j in range(6))
    np.testing.assert_array_equal(col, values)
    np.testing.assert_array_equal(row, values)


def _owner(view):
    """The array that owns view's memory (its allocation)."""
    while getattr(view, "base", None) is not None:
        view = view.base
    return view


@pytest.mark.parametrize("layout", ["row", "col"])
def test_a_tight_end_allocation_ends_at_the_views_last_element(layout):
    values = np.arange(24, dtype=np.float32).reshape(4, 6).astype(np.float16)
    tight = strided_matrix(4, 6, layout, ld_pad=3, offset=5, values=values, tight_end=True)
    padded = strided_matrix(4, 6, layout, ld_pad=3, offset=5, values=values)
    np.testing.assert_array_equal(tight, values)
    assert tight.strides == padded.strides
    outer, inner = (4, 6) if layout == "row" else (6, 4)
    owner = _owner(tight)
    assert owner.size == 5 + (outer - 1) * (inner + 3) + inner      # the last row's padding is gone
    assert data_offset(tight, owner) == 5 * 2
    assert data_offset(tight[3:, 5:], owner) == (owner.size - 1) * 2    # (3, 5) is last in memory either way
    # The padding between rows and the offset gap keep their NaN.
    assert np.isnan(owner.astype(np.float32)).sum() == owner.size - 24


@pytest.mark.parametrize("layout", ["row", "col"])
def test_a_tight_end_view_built_on_the_device_ends_its_allocation_too(layout):
    """The device draws build the whole padded allocation first (the rows' geometry in one array) and
    cut it at the view's last element afterwards: the cut must happen there too, or an overread past
    the view lands in padding instead of outside the allocation. Run here with NumPy as the device."""
    from deepgemm.testing.strategies import _device_strided_matrix
    values = np.arange(24, dtype=np.float32).reshape(4, 6)
    tight = _device_strided_matrix(4, 6, layout, 3, 5, values, "float16", np, tight_end=True)
    loose = _device_strided_matrix(4, 6, layout, 3, 5, values, "float16", np)
    np.testing.assert_array_equal(tight, values.astype(np.float16))
    np.testing.assert_array_equal(loose, values.astype(np.float16))
    outer, inner = (4, 6) if layout == "row" else (6, 4)
    owner = _owner(tight)
    assert owner.size == 5 + (outer - 1) * (inner + 3) + inner < _owner(loose).size
    assert data_offset(tight[3:, 5:], owner) == (owner.size - 1) * 2
    one = _device_strided_matrix(1, 6, "row", 3, 5, values[:1], "float16", np, tight_end=True)   # one row
    assert _owner(one).size == 5 + 6


def test_tight_end_inputs_end_each_operand_at_its_last_element():
    p = GemmProblem(5, 7, 9, "float16", "float16", "row", "col", a_offset=1, b_offset=2, lda_pad=3, ldb_pad=4,
                    epilogue=dict(NO_EPILOGUE, residual="float16", beta=1.0), ldc_pad=2, c_offset=3)
    inputs = make_inputs(p, np.random.default_rng(0), integer=True, tight_end=True)
    loose = make_inputs(p, np.random.default_rng(0), integer=True)
    for x, y, (offset, outer, ld, inner) in ((inputs.a, loose.a, (1, 5, p.lda, 9)), (inputs.b, loose.b, (2, 7, p.ldb, 9)),
                                             (inputs.epilogue_kwargs["c"], loose.epilogue_kwargs["c"], (3, 5, 9, 7))):
        np.testing.assert_array_equal(x, y)
        assert _owner(x).size == offset + (outer - 1) * ld + inner < _owner(y).size


@settings(max_examples=80, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=gemm_problems(max_dim=70, min_dim=0, with_epilogue=True), seed=st.integers(0, 2 ** 32 - 1))
def test_problems_are_valid_and_inputs_have_the_intended_geometry(problem, seed):
    p, ep = problem, problem.epilogue
    assert all(0 <= d <= 70 for d in (p.m, p.n, p.k))
    assert p.dtype in ("float16", "bfloat16") and p.out_dtype in ("float16", "bfloat16", "float32")
    assert {p.a_layout, p.b_layout} <= {"row", "col"}
    assert 0 <= p.a_offset <= 7 and 0 <= p.b_offset <= 7 and 0 <= p.lda_pad <= 9 and 0 <= p.ldb_pad <= 9
    assert 0 <= p.ldd_pad <= 9   # the output's row padding (the sweep's poisoned output): both parities of ldd
    assert set(ep) == set(NO_EPILOGUE)
    assert (ep["residual"] is None) == (ep["beta"] == 0.0)

    inputs = make_inputs(p, np.random.default_rng(seed))
    dt = NUMPY_DTYPES[p.dtype]
    check_geometry(inputs.a, p.m, p.k, p.a_layout, p.lda, p.a_offset, dt)
    check_geometry(inputs.b, p.k, p.n, p.b_layout, p.ldb, p.b_offset, dt)
    assert p.lda == max(1, (p.k if p.a_layout == "row" else p.m) + p.lda_pad)
    assert p.ldb == max(1, (p.n if p.b_layout == "row" else p.k) + p.ldb_pad)

    kw = inputs.epilogue_kwargs
    assert kw["alpha"] == ep["alpha"] and kw["activation"] == ep["activation"] and kw["beta"] == ep["beta"]
    for name, shape in (("bias", (p.n,)), ("residual", (p.m, p.n))):
        tensor = kw["c" if name == "residual" else name]
        assert (tensor is None) == (ep[name] is None)
        if tensor is not None:
            assert tensor.shape == shape and tensor.dtype == NUMPY_DTYPES[ep[name]]
    if ep["scale"] == "scalar":
        assert isinstance(kw["scale"], float)
    elif ep["scale"] is not None:
        assert kw["scale"].shape == (p.n,) and kw["scale"].dtype == NUMPY_DTYPES[ep["scale"]]
    # The epilogue's operands are drawn as views too, where the problem has them (else left at 0).
    vectors = [kw[name] for name in ("bias", "scale") if isinstance(kw[name], np.ndarray)]
    assert 0 <= p.vec_offset <= 7 and (p.vec_offset == 0 or vectors)
    for v in vectors if p.vec_offset and p.n else ():   # an empty view has no meaningful pointer
        assert data_offset(v, v.base) == p.vec_offset * v.itemsize and np.isnan(v.base[:p.vec_offset].astype(np.float32)).all()
    assert 0 <= p.c_offset <= 7 and 0 <= p.ldc_pad <= 9 and (p.c_offset == p.ldc_pad == 0 or kw["c"] is not None)
    if kw["c"] is not None and p.m and p.n:
        check_geometry(kw["c"], p.m, p.n, "row", p.n + p.ldc_pad, p.c_offset, NUMPY_DTYPES[ep["residual"]])
    # The NaN padding never reaches the reference: it reads only the views.
    assert np.isfinite(reference_gemm(inputs.a, inputs.b, **kw)).all()


def _exact_kernel(a, b, alpha, bias, activation, scale, c, beta):
    """A correct fp32 kernel (sequential fp32 accumulation, fp32 epilogue) for exact problems."""
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k in range(a.shape[1]):
        acc += np.outer(a[:, k].astype(np.float32), b[k].astype(np.float32))
    x = np.float32(alpha) * acc
    if bias is not None:
        x = x + bias.astype(np.float32)
    if activation == "relu":
        x = np.maximum(x, np.float32(0))
    if scale is not None:
        x = x * (np.float32(scale) if np.ndim(scale) == 0 else scale.astype(np.float32))
    if c is not None and beta != 0:
        x = x + np.float32(beta) * c.astype(np.float32)
    return x


@settings(max_examples=60, deadline=None, database=None)
@given(problem=gemm_problems(max_dim=48, with_epilogue=True).filter(problem_is_exact), seed=st.integers(0, 99))
def test_integer_inputs_make_exact_problems_bitwise(problem, seed):
    inputs = make_inputs(problem, np.random.default_rng(seed), integer=True)
    assert all(np.all(x.astype(np.float64) == np.round(x.astype(np.float64))) for x in (inputs.a, inputs.b))
    kw = inputs.epilogue_kwargs
    expected = round_to(reference_gemm(inputs.a, inputs.b, **kw), problem.out_dtype)
    with np.errstate(over="ignore"):
        out = _exact_kernel(inputs.a, inputs.b, **kw).astype(NUMPY_DTYPES[problem.out_dtype])
    assert_bitwise_equal(out, expected, msg=f"{problem}: ")


@pytest.mark.parametrize("dtype,k", [("float16", 4096), ("float16", 16384), ("bfloat16", 16)])
def test_integer_inputs_of_a_plain_gemm_use_float32s_whole_exact_budget(dtype, k):
    """Without an epilogue every partial sum must stay exact in float32 (2^24): K r^2 <= 2^24, with
    r as large as that and the dtype allow (bfloat16 holds integers up to 256 exactly)."""
    inputs = make_inputs(GemmProblem(64, 64, k, dtype=dtype), np.random.default_rng(1), integer=True)
    r = max(np.abs(inputs.a.astype(np.float64)).max(), np.abs(inputs.b.astype(np.float64)).max())
    assert k * r * r <= 2 ** 24
    assert r == min(math.isqrt(2 ** 24 // k), 256 if dtype == "bfloat16" else 2048)   # 64 x 64 draws reach r


def test_problems_stay_within_max_elements():
    with pytest.raises(NoSuchExample):   # no problem whose operands and output together exceed it
        find(gemm_problems(max_dim=160, max_elements=2000),
             lambda p: p.m * p.n + p.m * p.k + p.k * p.n > 2000, settings=settings(FIND, max_examples=300))


class FakeDeviceModule:
    """Stands in for cupy: asarray copies to a 'device' (another host allocation)."""
    @staticmethod
    def asarray(x):
        return np.array(x, copy=True)


def test_device_inputs_have_the_same_geometry():
    p = GemmProblem(m=9, n=5, k=13, dtype="bfloat16", out_dtype="float32", a_layout="col", b_layout="row",
                    a_offset=3, b_offset=1, lda_pad=4, ldb_pad=2,
                    epilogue=dict(NO_EPILOGUE, bias="float16", scale="bfloat16", residual="float32", beta=1.0))
    host = make_inputs(p, np.random.default_rng(0))
    device = make_inputs(p, np.random.default_rng(0), xp=FakeDeviceModule)
    for h, d in ((host.a, device.a), (host.b, device.b)):
        assert d.base is not h.base and d.strides == h.strides
        assert data_offset(d, d.base) == data_offset(h, h.base)
        np.testing.assert_array_equal(d, h)
    assert device.epilogue_kwargs["c"].shape == (9, 5)


def test_problem_is_hashable_and_prints_compactly():
    p = GemmProblem(m=17, n=1, k=3, epilogue=dict(NO_EPILOGUE, activation="silu"))
    assert hash(p) == hash(GemmProblem(m=17, n=1, k=3, epilogue=dict(NO_EPILOGUE)))
    assert str(p) == "17x1x3 float16->float16 A:row+0/ld3 B:row+0/ld1 activation=silu"
    # Every offset and padding that differs from the default is in the text, so a logged case rebuilds.
    chain = GemmProblem(m=4, n=6, k=5, a_layout="col", a_offset=1, lda_pad=2, b_offset=3, ldb_pad=1, vec_offset=1,
                        c_offset=2, ldc_pad=3, ldd_pad=LDD_PAD + 1,
                        epilogue=dict(NO_EPILOGUE, bias="float32", residual="float16", beta=0.5))
    assert str(chain) == ("4x6x5 float16->float16 A:col+1/ld6 B:row+3/ld7 bias=float32,residual=float16,beta=0.5"
                          f" vec+1 C+2/ld9 D/ld{6 + LDD_PAD + 1}")


# ---- shrinking ------------------------------------------------------------------------------

def assert_minimal_apart_from(problem, **expected):
    minimal = dict(m=1, n=1, k=1, dtype="float16", out_dtype="float16", a_layout="row", b_layout="row",
                   a_offset=0, b_offset=0, lda_pad=0, ldb_pad=0, ldd_pad=0, vec_offset=0, c_offset=0, ldc_pad=0,
                   epilogue=NO_EPILOGUE)
    minimal.update(expected)
    for field, value in minimal.items():
        assert getattr(problem, field) == value, (field, problem)


def test_shrinks_to_the_boundary_of_a_failing_dimension():
    found = find(gemm_problems(), lambda p: p.m >= 17, settings=FIND)
    assert_minimal_apart_from(found, m=17)


def test_shrinks_every_axis_it_does_not_need():
    found = find(gemm_problems(), lambda p: p.k >= 100 and p.a_layout == "col" and p.b_offset > 0, settings=FIND)
    assert_minimal_apart_from(found, k=100, a_layout="col", b_offset=1)


def test_shrinks_the_epilogue_to_the_part_that_matters():
    found = find(gemm_problems(with_epilogue=True), lambda p: p.epilogue["activation"] == "silu"
                 and p.epilogue["residual"] is not None, settings=FIND)
    assert_minimal_apart_from(found, epilogue=dict(NO_EPILOGUE, activation="silu", residual="float16", beta=1.0))


def test_draws_and_shrinks_misaligned_epilogue_operands():
    found = find(gemm_problems(with_epilogue=True), lambda p: p.vec_offset % 2 == 1, settings=FIND)
    assert found.vec_offset == 1 and (found.epilogue["bias"] or found.epilogue["scale"] not in (None, "scalar"))
    # either vector alone is misaligned too: a bias without a vector scale, a vector scale without a bias
    found = find(gemm_problems(with_epilogue=True), lambda p: p.vec_offset % 2 == 1 and p.epilogue["scale"]
                 in (None, "scalar"), settings=FIND)
    assert found.epilogue["bias"] is not None
    found = find(gemm_problems(with_epilogue=True), lambda p: p.vec_offset % 2 == 1 and p.epilogue["bias"] is None,
                 settings=FIND)
    assert found.epilogue["scale"] not in (None, "scalar")
    found = find(gemm_problems(with_epilogue=True), lambda p: p.c_offset > 0 and p.ldc_pad > 0, settings=FIND)
    assert_minimal_apart_from(found, epilogue=dict(NO_EPILOGUE, residual="float16", beta=1.0), c_offset=1, ldc_pad=1)


def test_the_special_dimensions_are_tile_edges_primes_and_an_odd_padding():
    """What dims() draws as often as a plain integer: every power of two from 16 to 128 with both
    neighbours (one short of a tile, whole, one past), primes only (no tile divides them), small
    and up past 256; and D's default padding is odd, so N's parity decides D's pair alignment."""
    assert set(TILE_EDGES) == {p + d for p in (16, 32, 64, 128) for d in (-1, 0, 1)}
    assert all(n > 1 and all(n % f for f in range(2, int(n ** 0.5) + 1)) for n in PRIMES)
    assert {2, 3, 5, 7} <= set(PRIMES) and max(PRIMES) > 256 and len(PRIMES) >= 10
    assert LDD_PAD % 2 == 1


def test_dims_reach_tile_edges_and_respect_limits():
    for edge in (TILE_EDGES[0], TILE_EDGES[-1]):
        assert find(dims(1, 160), lambda d, edge=edge: d == edge, settings=FIND) == edge
    assert find(dims(0, 160), lambda d: d < 1, settings=FIND) == 0
    with pytest.raises(Exception):                      # never above max_dim
        find(dims(1, 20), lambda d: d > 20, settings=settings(FIND, max_examples=300))


def test_problems_carry_an_epilogue_only_when_asked():
    @settings(max_examples=40, database=None, suppress_health_check=list(HealthCheck))
    @given(gemm_problems(max_dim=16))
    def plain(problem):
        assert problem.epilogue == NO_EPILOGUE and not problem.has_epilogue
    plain()
    chained = find(gemm_problems(max_dim=16, with_epilogue=True), lambda p: p.has_epilogue,
                   settings=settings(database=None))
    assert chained.epilogue != NO_EPILOGUE


@pytest.mark.parametrize("changes, exact", [
    ({}, True),
    ({"alpha": -0.5}, True), ({"alpha": 0.75}, False), ({"alpha": 4.0}, False),
    ({"activation": "relu"}, True), ({"activation": "gelu"}, False), ({"activation": "silu"}, False),
    ({"residual": "float16", "beta": 2.0}, True), ({"residual": "float16", "beta": 0.3}, False),
    ({"residual": None, "beta": 0.3}, True),                     # beta unused without a residual
    ({"bias": "float16", "scale": "scalar"}, True),               # integer inputs make both exact
])
def test_which_problems_the_bitwise_oracle_may_judge(changes, exact):
    """Only problems whose integer-valued inputs give an output every correct kernel must match bit for
    bit go to the exact oracle: a non-power-of-two factor or a transcendental activation rounds."""
    p = GemmProblem(m=8, n=8, k=8, dtype="float16", out_dtype="float32", epilogue=dict(NO_EPILOGUE, **changes))
    assert problem_is_exact(p) is exact
