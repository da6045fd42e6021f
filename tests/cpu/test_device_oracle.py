"""The oracle's shared host/device code on the CPU.

* Its device branches, run on a NumPy-backed stand-in for CuPy (fake_cupy.py), give the same bits
  as the host and bring back only a verdict's few numbers; the GPU tier runs them on CuPy itself.
"""
import sys

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fake_cupy
from deepgemm.reference import NUMPY_DTYPES, reference_gemm, round_to
from deepgemm.testing import sweep
from deepgemm.testing.bounds import (_reference_and_bound, assert_bitwise_equal, assert_gemm_close, gemm_error_bound,
                                     integer_range)
from deepgemm.testing.strategies import NO_EPILOGUE, GemmProblem, gemm_problems, make_inputs, problem_is_exact

BF16 = ml_dtypes.bfloat16
OUT_DTYPES = ("float16", "bfloat16", "float32")
ACCUMULATE = ("fp32", "fp32_tc", "fp16", "fp16_tc", "bf16")
PROBLEMS = settings(max_examples=60, deadline=None, database=None, derandomize=True)


def same_bits(x, y) -> bool:
    x, y = np.asarray(x), np.asarray(y)
    if x.dtype != y.dtype or x.shape != y.shape:
        return False
    bits = np.dtype(f"u{x.dtype.itemsize}")
    return bool(np.array_equal(np.ascontiguousarray(x).view(bits), np.ascontiguousarray(y).view(bits)))


def raised(fn, *args, **kwargs) -> str | None:
    try:
        fn(*args, **kwargs)
    except AssertionError as exc:
        return str(exc)
    return None


def wrong_output(expected64, out_dtype, rng):
    """A rounded reference with a few elements pushed off by 1/16 of their size plus one (outside
    every bound but the fp16 accumulators' at long K)."""
    out = round_to(expected64, out_dtype).copy()
    if out.size:
        flat = out.reshape(-1)
        hit = rng.integers(0, out.size, size=min(3, out.size))
        flat[hit] = (flat[hit].astype(np.float64) * (1 + 2 ** -4) + 1).astype(out.dtype)
    return out


# ---- the device branches, on the stand-in ------------------------------------------------------

@pytest.fixture
def cupy(monkeypatch):
    fake_cupy.ndarray.fetched = []
    return fake_cupy.install(monkeypatch)


def _hard_values():
    """Ties and near-ties of fp16 and bf16, subnormals, the overflow edges, and the specials."""
    rng = np.random.default_rng(8)
    values = [np.ldexp(rng.uniform(-1, 1, 20000), rng.integers(-150, 130, 20000)),
              np.arange(-70000.0, 70000.0, 0.5 ** 3)[::97]]
    for dtype in (np.float16, BF16):
        grid = rng.integers(1, 0x7BFF if dtype is np.float16 else 0x7F7F, 5000).astype(np.uint16).view(dtype)
        lo = grid.astype(np.float64)
        hi = (grid.view(np.uint16) + 1).view(dtype).astype(np.float64)
        mid = (lo + hi) / 2
        values += [mid, -mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf)]
    bf16_max = float(ml_dtypes.finfo(BF16).max)
    values.append(np.array([65504.0, 65519.99, 65520.0, -65520.0, bf16_max, bf16_max + 2 ** 119,
                            bf16_max + 2 ** 119 - 2 ** 90, 2.0 ** -24, 2.0 ** -25, 2.0 ** -25 * 1.0000001,
                            2.0 ** -133, 2.0 ** -134, 2.0 ** -149, 2.0 ** -150, 1 + 2.0 ** -24 + 2.0 ** -40,
                            0.0, -0.0, np.inf, -np.inf, np.nan, 1e300, -1e300]))
    return np.concatenate(values)


@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
def test_device_rounding_gives_the_host_bits(cupy, out_dtype):
    # float16 on the device is rounded in float64 arithmetic, not by a cast: it must agree with
    # NumPy's (single-rounding) cast on ties, near-ties, subnormals and overflow.
    x = _hard_values()
    on_device = round_to(cupy.asarray(x), out_dtype)
    assert isinstance(on_device, fake_cupy.ndarray) and on_device.dtype == NUMPY_DTYPES[out_dtype]
    assert same_bits(on_device.get(), round_to(x, out_dtype))


@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
def test_device_rounding_survives_a_conversion_that_flushes_float32_subnormals(cupy, monkeypatch, out_dtype):
    # CuPy's float64 -> float32 conversion flushes float32 subnormals to zero on the H200; the
    # float32 and bfloat16 results below 2^-126 must still come out as the host rounds them.
    plain = fake_cupy.ndarray.astype

    def flushing(self, dtype, *args, **kwargs):
        out = plain(self, dtype, *args, **kwargs)
        if self.dtype == np.float64 and np.dtype(dtype) == np.float32:
            tiny = np.abs(out) < np.float32(2.0 ** -126)
            out[tiny] = np.copysign(np.float32(0), out[tiny])
        return out

    monkeypatch.setattr(fake_cupy.ndarray, "astype", flushing)
    x = _hard_values()
    assert (np.abs(round_to(x, out_dtype).astype(np.float64)) < 2.0 ** -126).any()   # subnormal results exist
    assert same_bits(round_to(cupy.asarray(x), out_dtype).get(), round_to(x, out_dtype))
    one = np.array([1.0, -2.0 ** -133, 3.0])                    # a single subnormal result
    assert same_bits(round_to(cupy.asarray(one), out_dtype).get(), round_to(one, out_dtype))


def test_device_conversions_keep_their_module_and_refuse_integers(cupy):
    from deepgemm.reference import to_float64
    x = _hard_values()
    x = x[np.abs(x) <= 65504]                                   # finite in every width below (no cast warnings)
    # float64 asked of a device array: a float64 device copy, from any float input width.
    for width in (np.float64, np.float32):
        src = cupy.asarray(x.astype(width))
        got = round_to(src, "float64")
        assert isinstance(got, fake_cupy.ndarray) and got.dtype == np.float64
        assert same_bits(got.get(), x.astype(width).astype(np.float64)) and got is not src
    # A host array asked for on the device is copied up; a device array stays where it is.
    up = to_float64(x.astype(np.float16), xp=cupy)
    assert isinstance(up, fake_cupy.ndarray) and same_bits(up.get(), x.astype(np.float16).astype(np.float64))
    assert isinstance(to_float64(cupy.asarray(x.astype(np.float32)), xp=cupy), fake_cupy.ndarray)
    with pytest.raises(TypeError):
        to_float64(cupy.asarray(np.arange(4, dtype=np.int32)), xp=cupy)


@pytest.mark.usefixtures("cupy")   # installed once for all examples (hypothesis reruns only the body)
@PROBLEMS
@given(problem=gemm_problems(max_dim=30, min_dim=0, with_epilogue=True), seed=st.integers(0, 2 ** 32 - 1),
       accumulate=st.sampled_from(ACCUMULATE))
def test_device_reference_and_bound_give_the_host_bits(problem, seed, accumulate):
    cupy = sys.modules["cupy"]
    x = make_inputs(problem, np.random.default_rng(seed))
    kw = x.epilogue_kwargs
    host_ref = reference_gemm(x.a, x.b, **kw)
    host_bound = gemm_error_bound(x.a, x.b, accumulate=accumulate, out_dtype=problem.out_dtype, **kw)
    dev = {name: cupy.asarray(v) if isinstance(v, np.ndarray) else v for name, v in kw.items()}
    da, db = cupy.asarray(x.a), cupy.asarray(x.b)
    ref = reference_gemm(da, db, xp=cupy, **dev)
    bound = gemm_error_bound(da, db, accumulate=accumulate, out_dtype=problem.out_dtype, xp=cupy, **dev)
    assert isinstance(ref, fake_cupy.ndarray) and isinstance(bound, fake_cupy.ndarray)
    assert same_bits(ref.get(), host_ref) and same_bits(bound.get(), host_bound)
    # Device operands without xp: computed there, handed back as NumPy (what older callers expect).
    for got in (reference_gemm(da, db, **dev), gemm_error_bound(da, db, accumulate=accumulate,
                                                                out_dtype=problem.out_dtype, **dev)):
        assert type(got) is np.ndarray
    assert same_bits(reference_gemm(da, db, **dev), host_ref)


def test_device_comparisons_bring_back_only_the_verdict(cupy):
    rng = np.random.default_rng(5)
    p = GemmProblem(37, 29, 300, "bfloat16", "bfloat16", "col", "row",
                    epilogue=dict(NO_EPILOGUE, bias="float16", activation="silu", scale="float32"))
    x = make_inputs(p, rng)
    kw = x.epilogue_kwargs
    ref = reference_gemm(x.a, x.b, **kw)
    good, bad = round_to(ref, "bfloat16"), wrong_output(ref, "bfloat16", rng)
    dev = dict(kw, bias=cupy.asarray(kw["bias"]), scale=cupy.asarray(kw["scale"]))
    da, db = cupy.asarray(x.a), cupy.asarray(x.b)

    fake_cupy.ndarray.fetched = []
    margin = assert_gemm_close(cupy.asarray(good), a=da, b=db, accumulate="fp32_tc", **dev)
    assert margin == assert_gemm_close(good, a=x.a, b=x.b, accumulate="fp32_tc", **kw)
    assert_bitwise_equal(cupy.asarray(good), cupy.asarray(good.copy()))
    assert max(fake_cupy.ndarray.fetched) <= 2          # the verdict, never an M x N array

    # Failures: the same message as on the host; worst element fetched alone.
    on_device = raised(assert_gemm_close, cupy.asarray(bad), a=da, b=db, accumulate="fp32_tc", msg="[c] ", **dev)
    on_host = raised(assert_gemm_close, bad, a=x.a, b=x.b, accumulate="fp32_tc", msg="[c] ", **kw)
    assert on_device == on_host and on_host is not None
    assert raised(assert_bitwise_equal, cupy.asarray(bad), good) == raised(assert_bitwise_equal, bad, good)
    assert max(fake_cupy.ndarray.fetched) <= 2
    # A precomputed reference and bound may live on either side.
    bound = gemm_error_bound(x.a, x.b, accumulate="fp32_tc", out_dtype="bfloat16", **kw)
    assert assert_gemm_close(cupy.asarray(good), ref=ref, bound=cupy.asarray(bound)) == margin
    # xp=numpy forces the host.
    fake_cupy.ndarray.fetched = []
    assert assert_gemm_close(cupy.asarray(good), a=da, b=db, accumulate="fp32_tc", xp=np, **dev) == margin
    assert sorted(fake_cupy.ndarray.fetched)[-3:] == sorted([good.size, da.size, db.size])   # out, A and B copied


def test_device_draws_have_the_geometry_ranges_and_reproducibility(cupy):
    p = GemmProblem(m=9, n=5, k=13, dtype="bfloat16", out_dtype="float32", a_layout="col", b_layout="row",
                    a_offset=3, b_offset=1, lda_pad=4, ldb_pad=2,
                    epilogue=dict(NO_EPILOGUE, bias="float16", scale="bfloat16", residual="float32", beta=1.0))
    host = make_inputs(p, np.random.default_rng(0))
    for integer in (False, True):
        dev = make_inputs(p, np.random.default_rng(0), xp=cupy, integer=integer, device_draws=True)
        again = make_inputs(p, np.random.default_rng(0), xp=cupy, integer=integer, device_draws=True)
        for h, d, d2 in ((host.a, dev.a, again.a), (host.b, dev.b, again.b)):
            assert isinstance(d, fake_cupy.ndarray) and d.dtype == h.dtype and d.strides == h.strides
            allocation = d.base
            while allocation.base is not None:
                allocation = allocation.base
            assert allocation.size == h.base.size                       # offset + padding included
            assert np.isnan(allocation.astype(np.float32)).sum() == allocation.size - d.size
            assert np.isfinite(d.astype(np.float32)).all()
            assert same_bits(d, d2)                                      # reproducible from the seed
        c = dev.epilogue_kwargs["c"]
        assert isinstance(c, fake_cupy.ndarray) and c.shape == (9, 5) and c.dtype == np.float32
        if integer:
            values = np.concatenate([v.astype(np.float64).ravel() for v in (dev.a, dev.b)])
            r = integer_range(p.k, p.dtype, 2 ** 20)
            assert np.all(values == np.round(values)) and np.abs(values).max() <= r
            assert np.abs(c).max() <= integer_range(1, "float32", 2 ** 20) and np.all(c == np.round(c))
    # Empty operands draw nothing.
    empty = make_inputs(GemmProblem(0, 4, 3), np.random.default_rng(0), xp=cupy, device_draws=True)
    assert empty.a.shape == (0, 3) and empty.b.shape == (3, 4)
    from deepgemm.testing.strategies import _DeviceDraws
    draws = _DeviceDraws(cupy, 7)
    for drawn in (draws.normal((0, 5)), draws.integers((5, 0), 3)):
        assert isinstance(drawn, cupy.ndarray) and drawn.dtype == np.float32 and 0 in drawn.shape
    # One row or column is no empty draw: its values come from cuRAND.
    for drawn in (draws.normal((1, 64)), draws.integers((64, 1), 3)):
        assert drawn.shape in ((1, 64), (64, 1)) and np.count_nonzero(np.asarray(drawn)) > 32


def test_device_integer_draws_are_uniform_over_the_whole_range(cupy):
    """floor(u (2r + 1)) - r, clamped: every integer of [-r, r] about equally often, nothing outside,
    so the exact oracle's inputs reach the range integer_range allows and no further."""
    from deepgemm.testing.strategies import _DeviceDraws
    for r in (1, 3, 8):
        values = np.asarray(_DeviceDraws(cupy, 7).integers((200, 100), r)).astype(np.int64).ravel()
        counts = np.bincount(values + r, minlength=2 * r + 1)
        assert len(counts) == 2 * r + 1 and counts.min() > 0, (r, counts)     # nothing outside [-r, r]
        expected = values.size / (2 * r + 1)
        assert np.all(np.abs(counts - expected) < 0.1 * expected), (r, counts)


# ---- run_case on the device branches -------------------------------------------------------------

def correct_kernel(a, b, *, kernel, out, **epilogue):
    # Computed where the operands are, so that what comes back to the host is the oracle's doing.
    xp = fake_cupy.module_of(a)
    out[...] = round_to(reference_gemm(a, b, xp=xp, **epilogue), str(out.dtype))


def one_column_too_many(a, b, *, kernel, out, **epilogue):
    """The planted `col > n` edge guard: every row also writes the element just right of the view."""
    correct_kernel(a, b, kernel=kernel, out=out, **epilogue)
    if out.shape[0]:
        np.lib.stride_tricks.as_strided(out, shape=(out.shape[0], out.shape[1] + 1), strides=out.strides)[:, -1] = 0


def test_run_case_on_the_device_path_passes_a_correct_kernel(cupy):
    cases = [c for c in sweep.quick_cases("v0") if c.problem.m * c.problem.n * c.problem.k < 300_000]
    assert {c.oracle for c in cases} == {"bound", "exact", "cublas"}
    for i, case in enumerate(cases):
        assert sweep.run_case(case, np.random.default_rng(i), xp=cupy, gemm_fn=correct_kernel) < 1.0
    # Nothing large came back: per case, the verdicts' numbers only.
    assert max(fake_cupy.ndarray.fetched) <= 2


def test_run_case_on_the_device_path_catches_wrong_kernels(cupy):
    from deepgemm.report.emulate import emulate_gemm

    def fp16_accumulating(a, b, *, kernel, out, **epilogue):
        out[...] = round_to(emulate_gemm(a.get().astype(np.float64), b.get().astype(np.float64), "fp16"),
                            str(out.dtype))

    long_k = next(c for c in sweep.quick_cases("v0") if c.problem.k >= 64 and c.oracle == "bound"
                  and c.problem.out_dtype == "float32")
    with pytest.raises(AssertionError, match="outside the error bound"):
        sweep.run_case(long_k, np.random.default_rng(0), xp=cupy, gemm_fn=fp16_accumulating)
    exact = next(c for c in sweep.quick_cases("v0") if c.oracle == "exact")
    with pytest.raises(AssertionError, match="elements differ"):
        sweep.run_case(exact, np.random.default_rng(0), xp=cupy,
                       gemm_fn=lambda a, b, **kw: correct_kernel(a, b * 2, **kw))
    with pytest.raises(AssertionError, match="out-of-bounds write in the row padding"):
        sweep.run_case(sweep.quick_cases("v0")[0], np.random.default_rng(0), xp=cupy, gemm_fn=one_column_too_many)


def test_run_case_can_keep_everything_on_the_host(cupy):
    case = next(c for c in sweep.quick_cases("v0") if c.oracle == "cublas")
    fake_cupy.ndarray.fetched = []
    assert sweep.run_case(case, np.random.default_rng(0), xp=cupy, gemm_fn=correct_kernel, on_device=False) < 1.0
    assert max(fake_cupy.ndarray.fetched) >= case.problem.m * case.problem.n     # compared on the host


def test_a_cublas_case_holds_cublas_to_its_own_bound(cupy, monkeypatch):
    """cuBLAS is the second reference only once it passes the bound itself: a vendor result off the
    FP64 reference fails the case, naming cuBLAS, though deepgemm's output is right."""
    case = next(c for c in sweep.quick_cases("v0") if c.oracle == "cublas")
    right = cupy.matmul
    monkeypatch.setattr(cupy, "matmul", lambda a, b: right(a, b * 2))
    with pytest.raises(AssertionError, match=r"\] cuBLAS vs reference: "):
        sweep.run_case(case, np.random.default_rng(0), xp=cupy, gemm_fn=correct_kernel)


def test_exact_epilogue_cases_stay_exact_with_device_draws(cupy):
    # With device draws the integer budget (and so exactness) must hold for every exact quick case.
    for case in (c for c in sweep.quick_cases("v0") if c.oracle == "exact" and c.problem.has_epilogue):
        assert problem_is_exact(case.problem)
        assert sweep.run_case(case, np.random.default_rng(3), xp=cupy, gemm_fn=correct_kernel) == 0.0
