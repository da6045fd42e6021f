"""GPU tier: the verification sweep over every registered kernel (quick tier by default,
--sweep=full for the whole size list; --kernels=v3,v4 to narrow it); and the oracle's device path
(which the sweep uses) against its host path on real CuPy: rounding bits, references, verdicts, draws;
and every kernel with its residual C as the output itself."""
import zlib

import numpy as np
import pytest

import deepgemm
from deepgemm import device, registry
from deepgemm.testing import sweep


def _cases(tier):
    out = []
    for name in registry.names():
        cases = sweep.quick_cases(name)
        out += [pytest.param(c, id=f"{name}-{i}-{c.oracle}") for i, c in enumerate(cases)]
        if tier:
            extra = sweep.full_cases(name)[len(cases):]
            out += [pytest.param(c, id=f"{name}-full{i}-{c.oracle}", marks=pytest.mark.full)
                    for i, c in enumerate(extra)]
    return out


def _config_cases():
    """Quick tier: sweep.quick_configs (the shipped tables' configs, and every tuning value once);
    full: every config_space entry."""
    out = []
    for name in registry.names():
        quick = sweep.config_cases(name, sweep.quick_configs(name))
        out += [pytest.param(c, id=f"{name}-cfg{i}-{c.oracle}") for i, c in enumerate(quick)]
        out += [pytest.param(c, id=f"{name}-fullcfg{i}-{c.oracle}", marks=pytest.mark.full)
                for i, c in enumerate(c for c in sweep.config_cases(name) if c not in quick)]
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("case", _cases(tier="full") + _config_cases())
def test_sweep(case, selected_kernels):
    if case.kernel not in selected_kernels:
        pytest.skip(f"--kernels excludes {case.kernel}")
    why = sweep.not_on_this_gpu(case, device.compute_capability(0))
    if why:
        pytest.skip(why)
    # Fresh, reproducible inputs per case: the seed is derived from the case itself.
    rng = np.random.default_rng(zlib.crc32(str(case).encode()))
    margin = sweep.run_case(case, rng)
    assert margin < 1.0


# ---- the oracle's device path against its host path, on the real CuPy ---------------------------

def _hard_values():
    """Ties and near-ties of fp16 and bf16, subnormals, the overflow edges and the specials."""
    import ml_dtypes
    rng = np.random.default_rng(8)
    values = [np.ldexp(rng.uniform(-1, 1, 20000), rng.integers(-150, 130, 20000))]
    for dtype in (np.float16, ml_dtypes.bfloat16):
        top = 0x7BFF if dtype is np.float16 else 0x7F7F
        grid = rng.integers(1, top, 5000).astype(np.uint16)
        lo, hi = grid.view(dtype).astype(np.float64), (grid + 1).view(dtype).astype(np.float64)
        mid = (lo + hi) / 2
        values += [mid, -mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf)]
    values.append(np.array([65504.0, 65519.99, 65520.0, -65520.0, 3.3961e38, 3.4e38, 2.0 ** -24, 2.0 ** -25,
                            2.0 ** -133, 2.0 ** -134, 2.0 ** -149, 2.0 ** -150, 0.0, -0.0, np.inf, -np.inf, np.nan]))
    return np.concatenate(values)


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", ["float16", "bfloat16", "float32"])
def test_device_rounding_gives_the_host_bits(out_dtype):
    # The bit-exact oracle rounds its reference on the GPU: CUDA's casts and the float64 arithmetic
    # there must give exactly NumPy's round-to-nearest-even bits.
    import cupy
    from deepgemm.testing import round_to
    x = _hard_values()
    host, device = round_to(x, out_dtype), cupy.asnumpy(round_to(cupy.asarray(x), out_dtype))
    bits = np.dtype(f"u{host.dtype.itemsize}")
    assert device.dtype == host.dtype
    nan = np.isnan(x)              # NaN payloads differ (CUDA's canonical NaN); the oracle matches NaN to NaN
    np.testing.assert_array_equal(np.isnan(device.astype(np.float64)), nan)
    np.testing.assert_array_equal(device.view(bits)[~nan], host.view(bits)[~nan])


@pytest.mark.gpu
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_erf", "silu"])
def test_device_oracle_reaches_the_host_verdicts(activation):
    import cupy
    from deepgemm.testing import assert_bitwise_equal, assert_gemm_close, gemm_error_bound, reference_gemm, round_to
    from deepgemm.testing.strategies import NO_EPILOGUE, GemmProblem, make_inputs
    rng = np.random.default_rng(1)
    epilogue = dict(NO_EPILOGUE, alpha=0.7, bias="float16", activation=activation, scale="bfloat16",
                    residual="float32", beta=-0.5)
    x = make_inputs(GemmProblem(67, 45, 700, "bfloat16", "bfloat16", "col", "row", epilogue=epilogue), rng)
    kw = x.epilogue_kwargs
    dev = {k: cupy.asarray(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    da, db = cupy.asarray(x.a), cupy.asarray(x.b)

    # Reference and bound: float64 rounding apart (summation order: up to K 2^-53 of |A||B|; CUDA's
    # libm: a few ulp), nothing like a formula slip, which would be O(1).
    ref, ref_dev = reference_gemm(x.a, x.b, **kw), reference_gemm(da, db, xp=cupy, **dev)
    bound = gemm_error_bound(x.a, x.b, accumulate="fp32_tc", out_dtype="bfloat16", **kw)
    bound_dev = gemm_error_bound(da, db, accumulate="fp32_tc", out_dtype="bfloat16", xp=cupy, **dev)
    size = np.abs(x.a.astype(np.float64)) @ np.abs(x.b.astype(np.float64)) + 1
    assert np.max(np.abs(cupy.asnumpy(ref_dev) - ref) / size) < 2 ** -36
    assert np.max(np.abs(cupy.asnumpy(bound_dev) / bound - 1)) < 2 ** -30

    # Verdicts: a correct output passes with the host's margin; wrong ones fail with the host's message.
    good = round_to(ref, "bfloat16")
    margin = assert_gemm_close(cupy.asarray(good), a=da, b=db, accumulate="fp32_tc", **dev)
    assert margin == pytest.approx(assert_gemm_close(good, a=x.a, b=x.b, accumulate="fp32_tc", **kw), rel=1e-6)
    bad = good.copy()
    bad[5, 7] = np.float32(bad[5, 7]) + 64                    # far outside any bound here
    bad[60, 40] = np.nan
    messages = []
    for out, where in ((cupy.asarray(bad), dict(a=da, b=db, **dev)), (bad, dict(a=x.a, b=x.b, **kw))):
        with pytest.raises(AssertionError) as err:
            assert_gemm_close(out, accumulate="fp32_tc", **where)
        messages.append(str(err.value).split(": got")[0])
    assert messages[0] == messages[1] and "2 of 3015 elements" in messages[0] and "(60, 40)" in messages[0]
    off = good.copy()
    off.view(np.uint16)[3, 4] ^= 1
    with pytest.raises(AssertionError, match=r"1 of 3015 elements differ .* worst at \(3, 4\)"):
        assert_bitwise_equal(cupy.asarray(off), round_to(ref_dev, "bfloat16"))
    assert_bitwise_equal(cupy.asarray(good), round_to(cupy.asarray(ref), "bfloat16"))


@pytest.mark.gpu
def test_device_draws_have_the_promised_values():
    import cupy
    from deepgemm.testing.bounds import integer_range
    from deepgemm.testing.strategies import GemmProblem, make_inputs
    p = GemmProblem(300, 200, 100, "float16", "float32", "col", "row", a_offset=1, lda_pad=3)
    ints = make_inputs(p, np.random.default_rng(2), xp=cupy, integer=True, device_draws=True)
    r = integer_range(p.k, p.dtype)
    values = cupy.asnumpy(ints.a.astype(cupy.float64)).ravel()
    assert np.all(values == np.round(values)) and values.min() == -r and values.max() == r
    assert ints.a.strides == (2, 2 * (p.m + 3))
    normal = cupy.asnumpy(make_inputs(p, np.random.default_rng(2), xp=cupy, device_draws=True).b.astype(cupy.float64))
    assert abs(normal.mean()) < 0.05 and abs(normal.std() - 1) < 0.05         # 20000 draws: 7 and 10 sigma
    again = make_inputs(p, np.random.default_rng(2), xp=cupy, integer=True, device_draws=True)
    assert bool(cupy.array_equal(again.a, ints.a))            # reproducible from the seed


def _in_place_cases():
    """Each kernel's quick residual cases whose C could be the output itself (C in the output's
    dtype): N odd, C's rows padded to 16 bytes, and C 8 bytes off."""
    out = []
    for name in registry.names():
        cases = [c for c in sweep.quick_cases(name) if c.problem.epilogue == sweep.EPILOGUE_CASES["residual"]
                 and c.problem.out_dtype == c.problem.epilogue["residual"] and c.oracle == "exact"]
        out += [pytest.param(c, id=f"{name}-{i}") for i, c in enumerate(cases)]
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("case", _in_place_cases())
def test_the_residual_may_be_the_output_itself(case, selected_kernels):
    """c = out, an in-place residual add (what a model's residual stream does): every element's C
    must be read before its D is written over it, whatever order the kernel stores in."""
    import cupy
    from deepgemm.testing import assert_bitwise_equal, make_inputs, reference_gemm, round_to
    if case.kernel not in selected_kernels:
        pytest.skip(f"--kernels excludes {case.kernel}")
    p = case.problem
    x = make_inputs(p, np.random.default_rng(zlib.crc32(str(case).encode())), xp=cupy, integer=True)
    kw = dict(x.epilogue_kwargs)
    expected = round_to(reference_gemm(x.a, x.b, xp=cupy, **kw), p.out_dtype)
    out = kw["c"]   # the view itself: its padded rows and offset are the output's
    got = deepgemm.gemm(x.a, x.b, kernel=case.kernel, out=out, **kw)
    assert got is out
    assert_bitwise_equal(out, expected, msg=f"[{case}] with c = out: ")
