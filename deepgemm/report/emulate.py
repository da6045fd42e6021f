"""Exact CPU emulation of GEMM accumulation in a given precision.

A kernel that accumulates in precision P computes, for every output element,
``acc = round_P(acc + a[i, k] * b[k, j])`` for k = 0, 1, ..., K-1.  We emulate that
with the accumulator vectorised over the whole M x N output and a Python loop over k:

* the product of two fp16/bf16 values has at most 22 significant bits, so it is exact in
  float64;
* ``acc + product`` is formed in float64 and then rounded once to P with round-to-nearest-
  even.  The float64 sum can itself be inexact only when its two terms are more than 53
  bits apart; then the smaller one is far below half an ulp of P (11 or 24 bits) and the
  double rounding cannot change the result (with fp16 accumulation the only exception
  needs a sum beyond FP16's range, which overflows either way).  So the emulation is
  bit-exact, overflow to inf included (FP16's largest finite value is 65504; sums from
  65520 up round to inf exactly as on hardware).

Tensor cores with f16 accumulators (``mma.sync``) need not round after every k: they sum a
k-block (16 for m16n8k16) internally, then add it to the accumulator and round.  The
``block_k`` argument models that: each block of ``block_k`` products is summed in float64
(exact unless the block's products span more than ~50 bits, which does not happen for the
report's data; the hardware's internal adder is not exactly specified either) and then
added with one rounding.  ``block_k=1`` is the CUDA-core ``hfma2`` model (an FMA rounds
once, so it matches bit for bit when k is visited in order).
"""

from __future__ import annotations

import numpy as np

ACCUMULATORS = ("fp16", "fp32", "bf16")

# Unit roundoff u = 2^-p of each accumulator (p = significand bits incl. the implicit one).
UNIT_ROUNDOFF = {"fp16": 2.0**-11, "bf16": 2.0**-8, "fp32": 2.0**-24, "fp64": 2.0**-53}

# Formats rounded by hand: (stored significand bits, smallest normal exponent, largest
# exponent, largest finite value).  bf16 has fp32's exponent range.
_FORMATS = {
    "fp16": (10, -14, 15, 65504.0),
    "bf16": (7, -126, 127, (2.0 - 2.0**-7) * 2.0**127),
}
_EXP_MASK = np.uint64(0x7FF0000000000000)
_CHUNK_ELEMENTS = 1 << 16  # products computed per numpy call; small enough to stay in cache


def _float_bits(value: float) -> np.uint64:
    return np.float64(value).view(np.uint64)


def _round_inplace(x: np.ndarray, fmt: str, scratch: np.ndarray) -> None:
    """Round the float64 array ``x`` in place to the nearest value of ``fmt`` (ties to even).

    Adding then subtracting ``magic = 1.5 * 2**(e + 52 - mant_bits)`` (e = the exponent of
    x) makes the float64 adder itself round x to a multiple of the format's ulp 2**(e -
    mant_bits), with ties to even; clamping e from below gives the subnormals' fixed
    spacing.  magic is built on the integer bits (mask the exponent, clamp, add the offset
    and the 0.5 significand bit), which is several times faster than numpy's float64 ->
    float16 cast, and bit-identical to it (the tests check).  ``scratch``: uint64, shaped
    like ``x``.
    """
    mant_bits, min_exp, max_exp, max_finite = _FORMATS[fmt]
    np.bitwise_and(x.view(np.uint64), _EXP_MASK, out=scratch)  # bits of 2**e (0 for 0)
    # Overflow is possible only once some |x| >= 2**max_exp (inf and nan included): one
    # cheap integer reduction lets the common case skip the inf handling.
    may_overflow = scratch.max() >= _float_bits(2.0**max_exp)
    np.maximum(scratch, _float_bits(2.0**min_exp), out=scratch)
    if may_overflow:
        np.minimum(scratch, _float_bits(2.0**max_exp), out=scratch)  # finite magic for inf
    magic_offset = np.uint64(((52 - mant_bits) << 52) | (1 << 51))  # 2**e -> 1.5*2**(e+52-m)
    np.add(scratch, magic_offset, out=scratch)
    magic = scratch.view(np.float64)
    np.add(x, magic, out=x)
    np.subtract(x, magic, out=x)
    if may_overflow:
        overflowed = np.abs(x) > max_finite
        x[overflowed] = np.copysign(np.inf, x[overflowed])


def round_to_format(x, fmt: str) -> np.ndarray:
    """Correctly rounded (RNE) float64 -> fp16 / bf16, returned as float64.

    For bf16 this matters: ml_dtypes converts float64 -> bfloat16 through float32, i.e.
    with two roundings, which can be off by one ulp.
    """
    out = np.array(x, dtype=np.float64, copy=True)
    with np.errstate(over="ignore", invalid="ignore"):
        _round_inplace(out, fmt, np.empty(out.shape, np.uint64))
    return out


def round_to_bf16(x) -> np.ndarray:
    return round_to_format(x, "bf16")


def _as_float64(x) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype.kind not in "fiu" and x.dtype.name != "bfloat16":
        raise TypeError(f"unsupported input dtype {x.dtype}")
    return x.astype(np.float64)


def emulate_gemm(a, b, accumulate: str = "fp16", block_k: int = 1) -> np.ndarray:
    """A @ B as computed by a kernel whose accumulator has precision ``accumulate``.

    ``a`` is M x K and ``b`` is K x N (or a batch: B x M x K and B x K x N, which amortises
    numpy's per-call cost over several small problems), of any float dtype (fp16 / bf16
    inputs make every product exact).  Returns float64 holding exactly the accumulator's
    final values (inf / nan where it overflowed).  ``block_k`` > 1: each block of that many
    k values is summed in float64 and then added with one rounding (the tensor-core model,
    see the module docstring).
    """
    if accumulate not in ACCUMULATORS:
        raise ValueError(f"accumulate must be one of {ACCUMULATORS}, got {accumulate!r}")
    if block_k < 1:
        raise ValueError("block_k must be >= 1")
    a64, b64 = _as_float64(a), _as_float64(b)
    batched = a64.ndim == 3
    if not batched:
        a64, b64 = a64[None], b64[None]
    if a64.ndim != 3 or b64.ndim != 3 or a64.shape[::2] != b64.shape[:2]:
        raise ValueError(f"shapes {np.shape(a)} and {np.shape(b)} do not multiply")
    batch, m, k = a64.shape
    n = b64.shape[2]

    # k-major layout (blocks, block_k, batch, M|N), zero-padded to whole blocks: the padding
    # adds exact zeros, so it changes no block sum.
    n_blocks = -(-k // block_k)
    pad = ((0, n_blocks * block_k - k), (0, 0), (0, 0))
    a_blocks = np.pad(a64.transpose(2, 0, 1), pad).reshape(n_blocks, block_k, batch, m)
    b_blocks = np.pad(b64.transpose(1, 0, 2), pad).reshape(n_blocks, block_k, batch, n)

    shape = (batch, m, n)
    acc = np.zeros(shape)  # float64 holding values of the accumulator's format
    acc32 = np.zeros(shape, np.float32) if accumulate == "fp32" else None
    scratch = np.empty(shape, np.uint64)
    blocks_per_chunk = max(1, _CHUNK_ELEMENTS // max(1, batch * m * n))
    with np.errstate(over="ignore", invalid="ignore"):
        for c0 in range(0, n_blocks, blocks_per_chunk):
            a_chunk = a_blocks[c0 : c0 + blocks_per_chunk]
            b_chunk = b_blocks[c0 : c0 + blocks_per_chunk]
            # (blocks, batch, M, N): exact products, each block summed in float64.
            if block_k == 1:
                block_sums = a_chunk[:, 0, :, :, None] * b_chunk[:, 0, :, None, :]
            else:
                block_sums = a_chunk.transpose(0, 2, 3, 1) @ b_chunk.transpose(0, 2, 1, 3)
            for block_sum in block_sums:
                if acc32 is not None:
                    # numpy's float64 -> float32 cast is one correct RNE rounding.
                    np.add(block_sum, acc32, out=acc)
                    np.copyto(acc32, acc, casting="same_kind")
                else:
                    np.add(acc, block_sum, out=acc)
                    _round_inplace(acc, accumulate, scratch)
    out = acc32.astype(np.float64) if acc32 is not None else acc
    return out if batched else out[0]


def gamma(n, u: float):
    """Higham's gamma_n = n*u / (1 - n*u) (Accuracy and Stability, §3.1); inf when n*u >= 1,
    where the classical bound says nothing."""
    nu = np.asarray(n, dtype=np.float64) * u
    with np.errstate(divide="ignore"):
        return np.where(nu < 1, nu / (1 - nu), np.inf)
