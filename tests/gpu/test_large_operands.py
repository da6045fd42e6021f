"""On the GPU: operands that span more than 2^31 elements (4 GiB of float16).

Every kernel addresses A, B, C and D with 64-bit element offsets: GemmParams' leading dimensions
are `long long`, and dg::a_index, op_index and the epilogue's loads and stores multiply in 64 bits.
An offset computed in 32 bits (an `int` row offset, a leading dimension narrowed to save a
register) wraps once it passes 2^31, which no other test reaches: their operands are far smaller.
Each problem here puts one operand past that offset, A along its rows, B along its columns
(K-major), or D and the residual C along their rows, and checks exactly the rows or columns that
lie past it, and the first ones: integer operands in {-1, 0, 1} (C in [-8, 8]), an FP64 reference
of those rows or columns on the GPU.

The problems hold 4.3-8.6 GB each; one runs at a time on a machine (a file lock across pytest-xdist
workers), and CuPy's pool hands the memory back after each.
"""
import fcntl
import os
import tempfile

import numpy as np
import pytest

import deepgemm
from deepgemm import device, registry

cupy = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

SPAN = 2**31     # elements: the first offset a 32-bit signed product cannot hold
# 8192, not 4096: A's 2^31 / K + EDGE rows must fit every kernel's grid (V0's 8-row tiles along grid.y,
# at most 65535 of them; with K = 4096 it needed 65568 and gemm() refused the call, rightly).
K_LONG = 8192
EDGE = 256       # rows or columns checked at each end; the last EDGE lie past SPAN
D_ROWS = 65536

# kind -> (m, n, k, out dtype, residual): the operand that spans more than SPAN elements.
PROBLEMS = {
    "a": (SPAN // K_LONG + EDGE, 16, K_LONG, "float32", False),    # A row-major: row * lda
    "b": (16, SPAN // K_LONG + EDGE, K_LONG, "float32", False),    # B K-major: column * ldb
    "d": (D_ROWS, SPAN // D_ROWS + 8, 16, "float16", True),        # D and C: row * ldd, row * ldc
}


# Integers in [low, low + span) from a hash of the element's index, written in place: no temporary
# as large as the operand (a random generator's would be 2-4 times its size).
_FILL = cupy.ElementwiseKernel(
    "int64 seed, int32 low, int32 span", "T x",
    "unsigned long long h = ((unsigned long long)i + (unsigned long long)seed) * 0x9E3779B97F4A7C15ull;"
    " h ^= h >> 29; x = T((float)((int)(h % (unsigned long long)span) + low));",
    "deepgemm_test_fill_ints")


def _ints(shape, low, high, seed):
    x = cupy.empty(shape, cupy.float16)
    _FILL(np.int64(seed), np.int32(low), np.int32(high - low + 1), x)
    return x


def _runs_here(name, m, n, k, out_dtype):
    if name == "auto":
        return True
    spec = registry.get(name)
    cc = device.compute_capability(cupy.cuda.Device().id)
    return spec.min_cc <= cc and spec.accumulate != "fp16" and \
        spec.supports(registry.Problem(m, n, k, "float16", out_dtype, cc=cc)) is None


@pytest.fixture
def one_at_a_time():
    """A lock held for the test (other xdist workers' large problems wait), and the memory returned."""
    path = os.path.join(tempfile.gettempdir(), f"deepgemm-large-operands-{os.getuid()}.lock")
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            cupy.cuda.Device().synchronize()
            cupy.get_default_memory_pool().free_all_blocks()
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.mark.hang_timeout(600)
@pytest.mark.parametrize("kind", PROBLEMS)
@pytest.mark.parametrize("kernel", ["auto", *registry.names()])
def test_offsets_past_2_31_elements(kernel, kind, selected_kernels, one_at_a_time):
    if kernel != "auto" and kernel not in selected_kernels:
        pytest.skip("--kernels excludes it")
    m, n, k, out_dtype, residual = PROBLEMS[kind]
    if not _runs_here(kernel, m, n, k, out_dtype):
        pytest.skip(f"{kernel} does not run {m}x{n}x{k} here")
    free, _ = cupy.cuda.runtime.memGetInfo()
    if free < 10 * 2**30:
        pytest.skip(f"needs about 10 GiB of free GPU memory, {free / 2**30:.1f} GiB free")
    a = _ints((m, k), -1, 1, 1)
    b = _ints((n, k), -1, 1, 2).T if kind == "b" else _ints((k, n), -1, 1, 2)   # K-major B: column n at n * ldb
    c = _ints((m, n), -8, 8, 3) if residual else None
    assert max(x.size for x in (a, b) + ((c,) if residual else ())) > SPAN
    d = deepgemm.gemm(a, b, kernel=kernel, out_dtype=out_dtype, c=c)
    assert d.shape == (m, n) and d.dtype == cupy.dtype(out_dtype)
    f64 = cupy.float64
    ends = [slice(0, EDGE), slice((m if kind != "b" else n) - EDGE, None)]
    for end in ends:
        if kind == "b":   # columns
            got, ref = d[:, end], a.astype(f64) @ b[:, end].astype(f64)
        else:             # rows
            got, ref = d[end], a[end].astype(f64) @ b.astype(f64)
            if residual:
                ref += c[end].astype(f64)
        wrong = int((got.astype(f64) != ref).sum())
        span = "columns" if kind == "b" else "rows"
        assert wrong == 0, (f"{kernel}, {kind} past 2^31 elements ({m}x{n}x{k}): {wrong} of {ref.size} outputs "
                            f"wrong in {span} {end.start}..{(end.stop or (n if kind == 'b' else m)) - 1}")
