"""Programmatic dependent launch (deepgemm.launch): V5 and small_m go out while the previous kernel
on the stream may still run, and must read that kernel's output only once it has completed.

The producer below lets its dependents start at once (griddepcontrol.launch_dependents), spins for
about 100 us, and only then writes A. A GEMM that read A before its griddepcontrol.wait would see
the zeros A held before; one that waits sees the producer's values. Small integers make every
product exact, so the check is equality."""
import numpy as np
import pytest

import deepgemm
from deepgemm import api

cupy = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

PRODUCER = r"""
extern "C" __global__ void produce(unsigned short* dst, const unsigned short* src, long long n, long long spin) {
    asm volatile("griddepcontrol.launch_dependents;");
    const long long start = clock64();
    while (clock64() - start < spin) { }
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        dst[i] = src[i];
}
"""
SPIN_CYCLES = 200_000   # ~100 us at the H200's clocks: ten GEMMs of these sizes


@pytest.fixture(scope="module")
def producer():
    if int(cupy.cuda.Device().compute_capability) < 90:
        pytest.skip("programmatic dependent launch needs sm_90 or later")
    return cupy.RawKernel(PRODUCER, "produce", options=("-std=c++17",))


def _ints(shape, seed, dtype):
    """Small integers as a CuPy array of `dtype` (made from their 16-bit patterns: bfloat16 needs no
    CuPy arithmetic), and the same values on the host in float64."""
    from deepgemm.reference import NUMPY_DTYPES
    host = np.random.default_rng(seed).integers(-2, 3, shape)
    return cupy.asarray(host.astype(NUMPY_DTYPES[dtype]).view(np.uint16)), host.astype(np.float64)


def _produce(kernel, dst, src):
    """dst[...] = src (16-bit words), written ~100 us after the launch, with dependents let in at once."""
    kernel((8,), (256,), (dst, src, np.int64(dst.size), np.int64(SPIN_CYCLES)))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("m, n, k, kernel", [(8, 4096, 1024, "small_m"), (256, 512, 512, "v5"),
                                             (200, 384, 320, "auto")])
def test_a_dependent_gemm_reads_what_the_previous_kernel_wrote(producer, monkeypatch, m, n, k, kernel, dtype):
    from deepgemm.reference import NUMPY_DTYPES
    monkeypatch.delenv("DEEPGEMM_PDL", raising=False)
    deepgemm.clear_caches()
    w_bits, w_host = _ints((n, k), 1, dtype)
    w = w_bits.view(NUMPY_DTYPES[dtype])
    a_bits = cupy.zeros((m, k), cupy.uint16)
    a = a_bits.view(NUMPY_DTYPES[dtype])
    for call in range(3):   # the full path, then two replays of its plan
        src, src_host = _ints((m, k), 10 + call, dtype)
        a_bits[...] = 0
        _produce(producer, a_bits, src)
        d = deepgemm.gemm(a, w.T, kernel=kernel, out_dtype="float32")
        np.testing.assert_array_equal(cupy.asnumpy(d), src_host @ w_host.T,
                                      err_msg=f"call {call} (0: the full path, then replays)")
    (plan,) = api._plans.values()
    assert plan.launcher.pdl   # it went out as a programmatic dependent


def test_a_captured_chain_of_dependent_gemms_replays_the_eager_results():
    """An MLP's three layers captured in a torch CUDA graph (programmatic edges between its
    kernels) give, on new inputs, the eager chain's bits."""
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("programmatic dependent launch needs sm_90 or later")
    deepgemm.clear_caches()
    g = torch.Generator("cuda").manual_seed(0)
    dims = [256, 1024, 1024, 256]
    ws = [torch.randn(o, i, device="cuda", dtype=torch.float16, generator=g) / i ** 0.5 for i, o in zip(dims, dims[1:])]
    bs = [torch.randn(o, device="cuda", dtype=torch.float16, generator=g) for o in dims[1:]]

    def forward(x):
        for i, (w, b) in enumerate(zip(ws, bs)):
            x = deepgemm.gemm(x, w.T, bias=b, activation="gelu" if i < 2 else None)
        return x
    for m in (16, 512):   # small_m, then V5
        x = torch.randn(m, dims[0], device="cuda", dtype=torch.float16, generator=g)
        forward(x)   # plans first: capture then replays them
        static_x = x.clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = forward(static_x)
        for _ in range(3):
            new = torch.randn(m, dims[0], device="cuda", dtype=torch.float16, generator=g)
            static_x.copy_(new)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(static_y, forward(new))
    assert all(plan.launcher.pdl for plan in api._plans.values())


def test_a_chain_captured_by_cupy_replays_the_eager_results():
    """The same chain with CuPy arrays, captured on a CuPy stream (cuLaunchKernelEx inside stream
    capture), into outputs made before the capture."""
    if int(cupy.cuda.Device().compute_capability) < 90:
        pytest.skip("programmatic dependent launch needs sm_90 or later")
    deepgemm.clear_caches()
    rng = np.random.default_rng(0)
    dims = [256, 1024, 1024, 256]

    def randn(*shape, scale=1.0):
        return cupy.asarray(rng.standard_normal(shape, dtype=np.float32) * scale).astype(cupy.float16)
    ws = [randn(o, i, scale=i ** -0.5) for i, o in zip(dims, dims[1:])]
    bs = [randn(o) for o in dims[1:]]
    for m in (16, 512):   # small_m, then V5
        outs = [cupy.empty((m, o), cupy.float16) for o in dims[1:]]

        def forward(x):
            for i, (w, b, out) in enumerate(zip(ws, bs, outs)):
                x = deepgemm.gemm(x, w.T, bias=b, activation="gelu" if i < 2 else None, out=out)
            return x
        stream = cupy.cuda.Stream(non_blocking=True)
        static_x = randn(m, dims[0])
        with stream:
            forward(static_x)   # plans first: the capture replays them
            stream.synchronize()
            stream.begin_capture()
            forward(static_x)
            graph = stream.end_capture()
        for _ in range(3):
            new = randn(m, dims[0])
            static_x[...] = new
            cupy.cuda.Device().synchronize()
            graph.launch(stream)
            stream.synchronize()
            captured = outs[-1].copy()
            assert cupy.array_equal(captured, forward(new))   # eager, into the same outputs
    assert all(plan.launcher.pdl for plan in api._plans.values())
