"""GPU tier for the accuracy report's FP16-accumulating kernels.

* fp16acc_simt rounds its __hfma2 accumulator once per k (an FMA: exact product, one rounding) and
  visits k in order, so it must equal the per-k emulation emulate_gemm(..., block_k=1) BIT FOR BIT
  (fp16 inputs: fp16 accumulator; bf16 inputs: bf16 accumulator).
* fp16acc_mma: inside one mma the tensor core's order, internal precision and rounding are not
  IEEE-specified, so it is held to a rigorous rounding-error bound around the k-block-16 emulation
  (derivation at _mma_tolerance), and it must be far less accurate than V4 (>= 20x at K = 1024):
  it really accumulates in fp16.
* Both: bit-exact on small-integer inputs (every partial sum exact in the 16-bit accumulator, in any
  order) on odd, tile-crossing, misaligned problems with poisoned outputs: layouts, edges, K tail,
  K = 0 and the stores. And accumulate="fp32" calls are unchanged.
"""
import numpy as np
import pytest

import deepgemm
from deepgemm.reference import NUMPY_DTYPES
from deepgemm.report.emulate import UNIT_ROUNDOFF, emulate_gemm
from deepgemm.testing import (assert_bitwise_equal, integer_inputs, poisoned_output, reference_gemm, round_to,
                              strided_matrix)

LAYOUTS = [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")]
KS = (16, 64, 256, 1024)
M = N = 64
SIMT = dict(kernel="fp16acc_simt", accumulate="fp16")
MMA = dict(kernel="fp16acc_mma", accumulate="fp16")


def _normal(rng, shape, dtype):
    return rng.standard_normal(shape).astype(np.float32).astype(NUMPY_DTYPES[dtype])


def _device(a, b, al, bl, aligned=True):
    """a, b as device views in the given layouts. aligned: offset 0 and leading dimensions padded to
    a multiple of 8 (fp16acc_mma's 16-byte cp.async path); else odd offsets and pads (scalar path).
    Padding holds NaN, so a read outside the view shows in the output."""
    import cupy

    def view(x, layout, offset, pad):
        inner = x.shape[1] if layout == "row" else x.shape[0]
        ld_pad = (-inner) % 8 if aligned else pad
        return strided_matrix(x.shape[0], x.shape[1], layout, ld_pad, 0 if aligned else offset, x, xp=cupy)

    return view(a, al, 1, 3), view(b, bl, 1, 5)


def _run(a, b, al, bl, **kw):
    import cupy
    da, db = _device(a, b, al, bl)
    return cupy.asnumpy(deepgemm.gemm(da, db, out_dtype="float32", **kw)).astype(np.float64)


# ---------------------------------------------------------------- fp16acc_simt: the per-k model, exactly

@pytest.mark.gpu
@pytest.mark.parametrize("dtype,acc", [("float16", "fp16"), ("bfloat16", "bf16")])
@pytest.mark.parametrize("al,bl", LAYOUTS, ids=["rr", "rc", "cr", "cc"])
@pytest.mark.parametrize("k", KS)
def test_simt_equals_the_per_k_emulation_bit_for_bit(dtype, acc, al, bl, k):
    rng = np.random.default_rng([k, LAYOUTS.index((al, bl)), int(dtype == "bfloat16")])
    a, b = _normal(rng, (M, k), dtype), _normal(rng, (k, N), dtype)
    got = _run(a, b, al, bl, **SIMT)
    # hfma2 = one rounding of (acc + exact product) per k, k in order: what block_k=1 emulates.
    np.testing.assert_array_equal(got, emulate_gemm(a, b, acc, block_k=1))


# ---------------------------------------------------------------- fp16acc_mma: a bound around the k16 model

U = UNIT_ROUNDOFF["fp16"]   # 2^-11
SUB_BLOCK = 4               # smallest k-block any tensor core generation sums internally (see below)
ETA = 2.0 ** -14            # absolute error of one fp16 rounding, even if it flushes subnormals
U_INTERNAL = 2.0 ** -18     # internal adder: >= 24-bit significands, truncating; <= 17 terms


def _mma_tolerance(a, b, emu, ref):
    """Elementwise bound on |gpu - emu| for an mma.sync kernel with f16 accumulators.

    |gpu - emu| <= |gpu - ref| + |emu - ref|. The second term is known exactly. For the first, the
    model of the hardware: the accumulator is an fp16 register between mma instructions, and inside
    one m16n8k16 the tensor core adds its products to it in sub-blocks of at least SUB_BLOCK = 4 k
    (V100/T4 sum 4 products per step, A100 8: Fasi, Higham, Mikaitis, Pranesh, "Numerical behavior
    of NVIDIA tensor cores", PeerJ CS 2021), each sub-block summed exactly up to truncation in an
    internal format of >= 24 significand bits, then rounded to fp16 by round-to-nearest OR toward
    zero (either is allowed: |delta| <= 2u|x|, plus ETA should it flush subnormals). Allowed as
    well, though not expected: a separate rounding of each sub-block's sum before it meets the
    accumulator (<= 2u sum|p| of the sub-block). Writing the computed value after sub-block r as
    S_r + E_r (S_r the exact prefix sum at k = 4r), each step adds at most
        2u (|S_r| + |E_{r-1}|) + ETA + 2u sum_block|p| + U_INTERNAL (|S_{r-1}| + |E_{r-1}| + sum_block|p|),
    and summing with the growth factor for the |E_{r-1}| terms gives, over R = ceil(K/4) sub-blocks,
        |gpu - ref| <= (1 + 2u)^R [2u sum_r |S_r| + 2u sum_k |p_k| + R ETA + U_INTERNAL (sum_r |S_r| + sum_k |p_k|)].
    It is a worst case (every rounding error at its maximum, all of one sign). Checked on the CPU
    against models of the hardware on this test's data: k-blocks of 16 or 8 rounded to nearest and
    k-blocks of 4 truncated reach 0.03-0.54 of it (rounding toward zero after EVERY k, outside the
    model, 1.1-1.4); B with its columns reversed (a layout bug) reaches 40-1500. That the kernel
    accumulates in fp16 at all is the separate V4 comparison (FP32 accumulation is within this bound).
    """
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    (m, k), n = a64.shape, b64.shape[1]
    r = -(-k // SUB_BLOCK)
    pad = r * SUB_BLOCK - k
    a_blocks = np.pad(a64, ((0, 0), (0, pad))).reshape(m, r, SUB_BLOCK)
    b_blocks = np.pad(b64, ((0, pad), (0, 0))).reshape(r, SUB_BLOCK, n)
    prefix = np.cumsum(np.einsum("mrs,rsn->rmn", a_blocks, b_blocks), axis=0)   # S_r, r = 1..R
    sum_s, sum_p = np.abs(prefix).sum(axis=0), np.abs(a64) @ np.abs(b64)
    gpu_bound = (1 + 2 * U) ** r * (2 * U * (sum_s + sum_p) + r * ETA + U_INTERNAL * (sum_s + sum_p))
    return np.abs(emu - ref) + gpu_bound


@pytest.mark.gpu
@pytest.mark.parametrize("al,bl", LAYOUTS, ids=["rr", "rc", "cr", "cc"])
@pytest.mark.parametrize("k", KS)
def test_mma_agrees_with_the_k16_emulation_within_the_rounding_bound(al, bl, k):
    rng = np.random.default_rng([k, LAYOUTS.index((al, bl)), 7])
    a, b = _normal(rng, (M, k), "float16"), _normal(rng, (k, N), "float16")
    got = _run(a, b, al, bl, **MMA)
    ref = reference_gemm(a, b)
    emu = emulate_gemm(a, b, "fp16", block_k=16)
    assert np.isfinite(got).all()
    ratio = np.abs(got - emu) / _mma_tolerance(a, b, emu, ref)
    worst = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    print(f"K={k} {al}/{bl}: max|gpu-emu16|/bound = {ratio.max():.3g}, max|gpu-emu16| = "
          f"{np.abs(got - emu).max():.3g}, max|gpu-ref| = {np.abs(got - ref).max():.3g}, "
          f"max|emu16-ref| = {np.abs(emu - ref).max():.3g}, bit-equal {np.mean(got == emu):.1%}")
    assert ratio.max() <= 1, f"worst at {worst}: gpu {got[worst]!r}, emulation {emu[worst]!r}"
    if k == 1024:
        # Really fp16 accumulation: the error vs FP64 dwarfs V4's (FP32 tensor-core accumulation).
        v4 = _run(a, b, al, bl, kernel="v4")
        err16, err32 = np.abs(got - ref).max(), np.abs(v4 - ref).max()
        print(f"K=1024 {al}/{bl}: max error fp16acc_mma {err16:.3g}, V4 {err32:.3g}")
        assert err16 >= 20 * err32


# ---------------------------------------------------------------- structure: integer-exact edges

EXACT_SHAPES = [(131, 133, 100), (1, 70, 33), (67, 1, 47), (129, 65, 16), (33, 65, 0)]
KERNEL_DTYPES = [("fp16acc_simt", "float16"), ("fp16acc_simt", "bfloat16"), ("fp16acc_mma", "float16")]
# Integer inputs with every partial sum of |products| <= 2^11 (fp16) / 2^8 (bf16): exact in the
# 16-bit accumulator in any order and grouping, so the output is the exact integer.
BUDGET = {"float16": 2 ** 11, "bfloat16": 2 ** 8}


@pytest.mark.gpu
@pytest.mark.parametrize("kernel,dtype", KERNEL_DTYPES)
@pytest.mark.parametrize("al,bl", LAYOUTS, ids=["rr", "rc", "cr", "cc"])
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "misaligned"])
def test_integer_exact_on_edges_and_misaligned_views(kernel, dtype, al, bl, aligned):
    import cupy
    rng = np.random.default_rng([LAYOUTS.index((al, bl)), int(aligned), KERNEL_DTYPES.index((kernel, dtype))])
    for m, n, k in EXACT_SHAPES:
        a = integer_inputs((m, k), k, rng, dtype, budget=BUDGET[dtype])
        b = integer_inputs((k, n), k, rng, dtype, budget=BUDGET[dtype])
        da, db = _device(a, b, al, bl, aligned)
        out = poisoned_output((m, n), "float32", xp=cupy, ld=n + 3)
        deepgemm.gemm(da, db, out=out.view, kernel=kernel, accumulate="fp16")
        cupy.cuda.get_current_stream().synchronize()
        where = f"{kernel} {dtype} {m}x{n}x{k} {al}/{bl} {'aligned' if aligned else 'misaligned'}: "
        out.check()
        out.assert_all_written()
        assert_bitwise_equal(out.view, round_to(reference_gemm(a, b), "float32"), msg=where)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel,dtype", KERNEL_DTYPES)
def test_epilogue_and_output_cast_still_apply(kernel, dtype):
    import cupy
    rng = np.random.default_rng(11)
    m, n, k = 131, 133, 100
    a = integer_inputs((m, k), k, rng, dtype, budget=BUDGET[dtype])
    b = integer_inputs((k, n), k, rng, dtype, budget=BUDGET[dtype])
    bias = cupy.asarray(rng.integers(-64, 64, n).astype(np.float32))
    da, db = _device(a, b, "row", "col", aligned=False)
    got = deepgemm.gemm(da, db, kernel=kernel, accumulate="fp16", alpha=2.0, bias=bias, activation="relu")
    expected = round_to(reference_gemm(a, b, alpha=2.0, bias=bias, activation="relu"), dtype)
    assert_bitwise_equal(got, expected, msg=f"{kernel} {dtype}: ")


# ---------------------------------------------------------------- fp32 unchanged; the report's runner

@pytest.mark.gpu
def test_accumulate_fp32_is_the_unchanged_default():
    rng = np.random.default_rng(5)
    a, b = _normal(rng, (200, 300), "float16"), _normal(rng, (300, 150), "float16")
    da, db = _device(a, b, "row", "col")
    for kw in ({}, {"kernel": "v4"}):
        default = deepgemm.gemm(da, db, out_dtype="float32", **kw)
        explicit = deepgemm.gemm(da, db, out_dtype="float32", accumulate="fp32", **kw)
        assert_bitwise_equal(explicit, default, signed_zeros=True)


@pytest.mark.gpu
def test_gpu_runner_feeds_the_accuracy_report(tmp_path):
    from deepgemm.report import accuracy
    from deepgemm.report.gpu_runner import make_gpu_runner

    runner = make_gpu_runner()
    assert runner.device_name
    rng = np.random.default_rng(9)
    a, b = _normal(rng, (32, 1024), "float16"), _normal(rng, (1024, 32), "float16")
    (out16, t16), (out32, t32) = runner(a, b, "fp16"), runner(a, b, "fp32")
    assert out16.dtype == out32.dtype == np.float64 and out16.shape == (32, 32) and t16 > 0 and t32 > 0
    ref = reference_gemm(a, b)
    assert np.abs(out16 - ref).max() >= 20 * np.abs(out32 - ref).max()
    bf = NUMPY_DTYPES["bfloat16"]
    assert runner(a.astype(bf), b.astype(bf), "fp16") is None        # no bf16 mma with f16 accumulators
    assert runner(a.astype(bf), b.astype(bf), "fp32") is not None

    result = accuracy.run_accuracy_report(tmp_path, ks=(16, 1024), dists=("normal",), m=32, n=32,
                                          gpu_runner=runner, progress=False)
    assert result.backend == "gpu" and result.device == runner.device_name
    row = result.row("float16", "normal", 1024)
    assert row.errors["fp16"].source == row.errors["fp32"].source == "gpu"
    assert row.fp16_over_fp32 >= 20
    assert result.row("bfloat16", "normal", 1024).errors["fp16"].source == "emulated"
