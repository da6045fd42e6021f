"""V5's Hopper-only pieces on the GPU: the staging copy for operands TMA cannot read (every
misalignment of the source, row tails around the vector path's edge, zero padding), and V5 on the
issue's misaligned shapes against cuBLAS (the sweep covers V5's layouts, tails and epilogue)."""
import numpy as np
import pytest

import deepgemm
from deepgemm import arrays, device, registry, tma

cupy = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu


def _hopper():
    if int(cupy.cuda.Device().compute_capability) != 90:
        pytest.skip("V5 needs sm_90 (Hopper)")


@pytest.mark.parametrize("offset", range(8))
@pytest.mark.parametrize("inner", [1, 7, 15, 16, 17, 23, 24, 31, 263, 4097])
def test_staging_copy_is_exact_and_zero_pads(offset, inner):
    rows, ld = 5, inner + 9
    base = cupy.arange(rows * ld + offset + 8, dtype=cupy.uint16).view(cupy.float16)
    view = base[offset:offset + rows * ld].reshape(rows, ld)[:, :inner]
    mat = arrays.matrix(view, "a")
    staged, buf = tma.stage(mat, "float16", device.arch_for_cc(device.compute_capability(device.current())),
                            0, cupy.cuda.get_current_stream())
    out = cupy.ndarray((rows, staged.ld), cupy.float16, buf)   # buf: the MemoryPointer stage() allocated
    assert staged.ld % 8 == 0 and staged.ptr % 16 == 0
    assert cupy.array_equal(out[:, :inner].view(cupy.uint16), view.view(cupy.uint16))
    assert not out[:, inner:].view(cupy.uint16).any()


@pytest.mark.parametrize("m, n, k", [(4095, 4095, 4095), (4097, 4097, 4097), (777, 1234, 555)])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_v5_on_the_misaligned_benchmark_shapes(m, n, k, dtype):
    _hopper()
    from deepgemm.reference import NUMPY_DTYPES
    # Drawn on the device: 2 x 16.8M host normals and their copy took longer than the GEMMs.
    rng = cupy.random.RandomState(np.uint64(0))        # (uint64: CuPy 13.0-13.2 with NumPy 2 reject an int)
    a = rng.standard_normal((m, k), dtype=cupy.float32).astype(NUMPY_DTYPES[dtype])
    b = rng.standard_normal((k, n), dtype=cupy.float32).astype(NUMPY_DTYPES[dtype])
    d = deepgemm.gemm(a, b, kernel="v5", out_dtype="float32")
    ref = a.astype(cupy.float32) @ b.astype(cupy.float32)          # cuBLAS, FP32: a differential check
    # Both accumulate in FP32: at k ~ 4096 on normal data they differ by ~1e-6 of max|ref|; a wrong
    # tile, a stale or misplaced staged operand, or an unwritten edge is O(1).
    err = float(cupy.abs(d - ref).max() / cupy.abs(ref).max())
    assert err < 1e-3, f"V5 vs cuBLAS at {m}x{n}x{k} {dtype}: max |diff| / max |ref| = {err:.2e}"


# Each config's staging units: cooperative 128 x 256 and 128 x 128 (two consumers, one unit each),
# ping-pong (two halves per consumer), 64-row tiles (one consumer), 256-row tiles (two consumers of
# two halves each).
RESIDUAL_CONFIGS = [{"DG_BN": 256, "DG_STAGES": 3}, {"DG_BN": 128, "DG_STAGES": 6},
                    {"DG_BN": 128, "DG_STAGES": 5, "DG_PINGPONG": 1}, {"DG_BM": 64, "DG_BN": 128, "DG_STAGES": 8},
                    {"DG_BM": 256, "DG_BN": 64, "DG_STAGES": 4}, {"DG_BM": 256, "DG_BN": 128, "DG_STAGES": 3}]


@pytest.mark.parametrize("config", RESIDUAL_CONFIGS, ids=lambda c: "-".join(f"{k[3:]}{v}" for k, v in c.items()))
@pytest.mark.parametrize("out_dtype", ["float16", "bfloat16"])
def test_v5_residual_through_shared_memory_is_exact_even_as_the_output(config, out_dtype):
    """A 16-bit residual C reaches the epilogue through TMA loads into the staging tiles, issued by
    a loader thread once a unit's previous D has left it. Many tiles per block (so every unit is
    reused), edge tiles in M and N, a C with a padded pitch, and C = out (each tile's C is read
    before the same tile's D is written), all integer-exact: any C from the wrong tile, rows or
    time is off by at least 1."""
    _hopper()
    from deepgemm.reference import NUMPY_DTYPES
    m, n, k = 2200, 2104, 192
    rng = np.random.default_rng(7)
    dt = NUMPY_DTYPES[out_dtype]
    a = cupy.asarray(rng.integers(-1, 2, size=(m, k)).astype(dt))
    b = cupy.asarray(rng.integers(-1, 2, size=(k, n)).astype(dt))
    c_host = rng.integers(-48, 49, size=(m, n))
    exact = a.astype(cupy.float64) @ b.astype(cupy.float64) + cupy.asarray(c_host)   # |.| <= 240: exact in bf16
    padded = cupy.zeros((m, n + 24), dt)
    padded[:, :n] = cupy.asarray(c_host.astype(dt))
    c = padded[:, :n]
    d = deepgemm.gemm(a, b, kernel="v5", config=config, c=c)
    assert bool(cupy.array_equal(d.astype(cupy.float64), exact)), "C given apart from the output"
    out = cupy.asarray(c_host.astype(dt))
    assert deepgemm.gemm(a, b, kernel="v5", config=config, c=out, out=out) is out
    assert bool(cupy.array_equal(out.astype(cupy.float64), exact)), "C = out"
