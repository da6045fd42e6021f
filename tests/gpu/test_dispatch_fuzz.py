"""GPU tier: kernel="auto" across the dispatch's bucket boundaries. Hypothesis draws M, N and K at
powers of two and one either side (where a shape changes bucket, and so maybe kernel or config:
small_m at M <= 64, the tuned table's entries, the heuristics past its edges), both layouts of each
operand, fp16 and bf16, with or without a bias; every result must equal the exact product bit for
bit (small-integer inputs, FP32 output, the FP64 reference computed on the GPU). The CPU tier
checks that every tuned entry compiles and that explain() agrees (tests/cpu/test_dispatch_coverage.py);
this checks that what auto runs computes the right thing."""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import deepgemm
from deepgemm.testing import poisoned_output
from deepgemm.testing.errors import naming_case

cupy = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

EDGES = sorted({e for j in range(0, 13) for e in (2**j - 1, 2**j, 2**j + 1) if 1 <= e <= 4097})
MAX_WORK = 2**31   # m * n * k: keeps each example well under a second


def _operand(rows, cols, row_major, dtype, rng):
    host = rng.integers(-2, 3, size=(rows, cols)).astype(np.float32)   # |sum| <= 4 K < 2**24: exact
    dev = cupy.asarray(host).astype(dtype)
    return dev if row_major else cupy.asfortranarray(dev)


@settings(max_examples=25, deadline=None)
@given(m=st.sampled_from(EDGES), n=st.sampled_from(EDGES), k=st.sampled_from(EDGES),
       a_row=st.booleans(), b_row=st.booleans(), dtype=st.sampled_from(["float16", "bfloat16"]),
       bias=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_auto_is_exact_across_bucket_boundaries(m, n, k, a_row, b_row, dtype, bias, seed):
    if m * n * k > MAX_WORK:
        m = max(1, MAX_WORK // (n * k))
    rng = np.random.default_rng(seed)
    dt = cupy.float16 if dtype == "float16" else ml_dtypes.bfloat16
    a, b = _operand(m, k, a_row, dt, rng), _operand(k, n, b_row, dt, rng)
    bias_vec = cupy.asarray(rng.integers(-64, 65, size=n).astype(np.float32)) if bias else None
    out = poisoned_output((m, n), "float32", xp=cupy, ld=n + 3)
    with naming_case(dict(m=m, n=n, k=k, a_row=a_row, b_row=b_row, dtype=dtype, bias=bias)):
        deepgemm.gemm(a, b, bias=bias_vec, out=out.view)
        cupy.cuda.get_current_stream().synchronize()
    out.check()
    out.assert_all_written()
    expected = a.astype(cupy.float64) @ b.astype(cupy.float64)
    if bias:
        expected += bias_vec.astype(cupy.float64)[None, :]
    got = out.view.astype(cupy.float64)
    if not bool(cupy.array_equal(got, expected)):
        layout = ("r" if a_row else "c") + ("r" if b_row else "c")
        wrong = int((got != expected).sum())
        pytest.fail(f"auto at {m}x{n}x{k} {layout} {dtype} bias={bias}: {wrong} of {m * n} elements differ\n"
                    + deepgemm.explain(m, n, k, in_dtype=dtype, out_dtype="float32", layout=layout))
