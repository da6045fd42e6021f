"""On the GPU: empty operands behave as torch.mm (K = 0 writes the epilogue of a zero product, for
every kernel; empty M or N give an empty result of the right shape, dtype and framework); dtypes
in any spelling; deepgemm.clear_caches() and dispatch.reload_tables() leave gemm() working and
correct (kernels reloaded, the shared-memory opt-in redone); device facts match CuPy's own."""
import numpy as np
import pytest

import deepgemm
from deepgemm import device, dispatch, registry
from deepgemm.reference import NUMPY_DTYPES, reference_gemm

cupy = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

RTOL, ATOL = 1e-5, 1e-6   # float32 output of an epilogue on zeros: only the epilogue's own rounding


def _rand(shape, seed, dtype="float32"):
    return cupy.asarray(np.random.default_rng(seed).standard_normal(shape).astype(np.float32)).astype(
        NUMPY_DTYPES[dtype])


def _runs_here(name, m, n, k, dtype):
    spec = registry.get(name)
    cc = device.compute_capability(cupy.cuda.Device().id)
    return spec.min_cc <= cc and dtype in spec.input_dtypes and \
        spec.supports(registry.Problem(m, n, k, dtype, "float32", cc=cc)) is None


def _k_zero_operands(dtype, layout):
    """Fresh empty operands as CuPy makes them (zero or odd strides), in the given layout."""
    a = cupy.ones((5, 0), NUMPY_DTYPES[dtype]) if layout[0] == "r" else cupy.ones((0, 5), NUMPY_DTYPES[dtype]).T
    b = cupy.ones((0, 3), NUMPY_DTYPES[dtype]) if layout[1] == "r" else cupy.ones((3, 0), NUMPY_DTYPES[dtype]).T
    return a, b


@pytest.mark.parametrize("kernel", ["auto", *registry.names()])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["rr", "rc", "cr", "cc"])
def test_k_zero_is_the_epilogue_of_zeros(kernel, dtype, layout):
    if kernel != "auto" and not _runs_here(kernel, 5, 3, 0, dtype):
        pytest.skip(f"{kernel} does not run this problem here")
    a, b = _k_zero_operands(dtype, layout)
    bias, c = _rand(3, 1), _rand((5, 3), 2)
    d = deepgemm.gemm(a, b, out_dtype="float32", bias=bias, activation="gelu", scale=2.0, c=c, beta=0.5, kernel=kernel)
    ref = reference_gemm(a, b, bias=bias, activation="gelu", scale=2.0, c=c, beta=0.5)
    assert d.shape == (5, 3) and d.dtype == cupy.float32
    np.testing.assert_allclose(cupy.asnumpy(d), ref, rtol=RTOL, atol=ATOL)
    plain = deepgemm.gemm(a, b, kernel=kernel)             # no epilogue: zeros in the input dtype
    assert plain.dtype == a.dtype and not bool(cupy.any(plain.astype(cupy.float32)))


def test_k_zero_takes_a_tile_config_that_needs_a_k_major_b():
    """V5's 96-wide tiles refuse a row-major b, but an empty one has nothing to read: it runs."""
    if not _runs_here("v5", 5, 96, 0, "float16"):
        pytest.skip("v5 does not run here")
    a, b = cupy.ones((5, 0), cupy.float16), cupy.ones((0, 96), cupy.float16)
    bias, c = _rand(96, 3), _rand((5, 96), 4)
    d = deepgemm.gemm(a, b, out_dtype="float32", bias=bias, activation="gelu", c=c, beta=0.5, kernel="v5",
                      config={"DG_BN": 96})
    ref = reference_gemm(a, b, bias=bias, activation="gelu", c=c, beta=0.5)
    np.testing.assert_allclose(cupy.asnumpy(d), ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("a_shape,b_shape", [((0, 7), (7, 3)), ((4, 7), (7, 0)), ((0, 0), (0, 0)), ((0, 7), (7, 0))])
def test_empty_m_or_n_gives_an_empty_result(a_shape, b_shape):
    a, b = cupy.ones(a_shape, cupy.float16), cupy.ones(b_shape, cupy.float16)
    d = deepgemm.gemm(a, b, out_dtype="bfloat16", bias=cupy.ones(b_shape[1], cupy.float32), activation="relu")
    assert isinstance(d, cupy.ndarray) and d.shape == (a_shape[0], b_shape[1]) and d.dtype == NUMPY_DTYPES["bfloat16"]
    out = cupy.empty((a_shape[0], b_shape[1]), cupy.float32)
    assert deepgemm.gemm(a, b, out=out) is out


def test_torch_empty_operands_behave_as_torch_mm():
    torch = pytest.importorskip("torch")
    dev = "cuda"
    a = torch.ones(5, 0, device=dev, dtype=torch.float16)
    b = torch.empty(3, 0, device=dev, dtype=torch.float16).t()           # a K x N view of an empty tensor
    bias = torch.randn(3, device=dev)
    c = torch.randn(5, 3, device=dev)
    d = deepgemm.gemm(a, b, out_dtype=torch.float32, bias=bias, activation="relu", c=c, beta=2.0)
    torch.cuda.synchronize()
    want = torch.relu(torch.mm(a.float(), b.float()) + bias) + 2.0 * c
    assert isinstance(d, torch.Tensor) and d.dtype == torch.float32 and d.shape == (5, 3)
    torch.testing.assert_close(d, want, rtol=RTOL, atol=ATOL)
    e = deepgemm.gemm(torch.ones(0, 8, device=dev, dtype=torch.bfloat16),
                      torch.ones(8, 4, device=dev, dtype=torch.bfloat16))
    assert isinstance(e, torch.Tensor) and e.shape == (0, 4) and e.dtype == torch.bfloat16 and e.is_cuda


def test_out_dtype_in_any_spelling():
    a, b = _rand((64, 32), 3, "float16"), _rand((32, 48), 4, "float16")
    ref = reference_gemm(a, b)
    for spelling in (np.float32, cupy.float32, "fp32", np.dtype("float32")):
        d = deepgemm.gemm(a, b, out_dtype=spelling)
        assert d.dtype == cupy.float32
        np.testing.assert_allclose(cupy.asnumpy(d), ref, rtol=2e-3, atol=1e-3)
    import ml_dtypes
    assert deepgemm.gemm(a, b, out_dtype=ml_dtypes.bfloat16).dtype == NUMPY_DTYPES["bfloat16"]


@pytest.mark.parametrize("kernel", ["v4", "auto"])
def test_gemm_after_clear_caches_reloads_and_opts_in_again(kernel):
    """V4's default tile needs over 48 KB of dynamic shared memory: after the loaded kernels are
    forgotten, the reloaded one must be opted in again (the opt-in belongs to the loaded kernel)."""
    if not _runs_here("v4", 256, 256, 256, "float16"):
        pytest.skip("v4 does not run here")
    a, b = _rand((256, 256), 5, "float16"), _rand((256, 256), 6, "float16")
    ref = reference_gemm(a, b)
    cfg = registry.get("v4").default_config
    for _ in range(2):
        d = deepgemm.gemm(a, b, kernel=kernel, config=cfg if kernel == "v4" else None, out_dtype="float32")
        np.testing.assert_allclose(cupy.asnumpy(d), ref, rtol=2e-3, atol=2e-3)
        deepgemm.gemm(a, b, kernel=kernel, config=cfg if kernel == "v4" else None, out_dtype="float32")  # replay
        cleared = deepgemm.clear_caches()
        assert {"kernels", "modules", "plans", "decisions", "device"} <= set(cleared)
    dispatch.reload_tables()
    d = deepgemm.gemm(a, b, kernel=kernel, out_dtype="float32")
    np.testing.assert_allclose(cupy.asnumpy(d), ref, rtol=2e-3, atol=2e-3)


def test_device_facts_match_cupy():
    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    assert device.compute_capability(dev.id) == int(dev.compute_capability)
    assert device.sm_count(dev.id) == dev.attributes["MultiProcessorCount"]
    summary = device.summary(dev.id)
    ident = device.identity(dev.id)
    assert {k: ident[k] for k in summary} == summary and summary["cc"] == f"{props['major']}.{props['minor']}"
    assert device.gpu_available()[0] and device.current() == dev.id
