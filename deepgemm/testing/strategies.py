"""Hypothesis strategies for GEMM problems, and the code that turns a problem into real arrays.

A ``GemmProblem`` is pure description (shapes, dtypes, layouts, misalignment, epilogue); its
``make_inputs`` builds the strided, offset views a kernel must cope with, with NumPy or CuPy.
``gemm_problems()`` draws problems that shrink toward the smallest one: dims 1, row-major,
no offsets or padding, input dtype as output dtype, no epilogue. So a failure reported by
hypothesis is already minimal along every axis the kernel did not need.

hypothesis (a test dependency) is imported by the strategy functions only: the problem
description and make_inputs also serve the verification sweep and `python -m deepgemm warm-cache`.
"""
from __future__ import annotations

import dataclasses
import importlib

import numpy as np

from ..reference import NUMPY_DTYPES, dtype_name
from .bounds import integer_inputs, integer_range

TILE_EDGES = (15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129)
PRIMES = (2, 3, 5, 7, 11, 13, 37, 61, 97, 131, 193, 251, 257)
SMALL_DIMS = (1, 2, 3, 4, 5, 7, 8)
ACTIVATION_NAMES = ("relu", "gelu", "gelu_erf", "silu")
_FLOAT_DTYPES = ("float16", "bfloat16", "float32")

NO_EPILOGUE = {"alpha": 1.0, "bias": None, "activation": None, "scale": None, "residual": None, "beta": 0.0}


LDD_PAD = 3   # GemmProblem.ldd_pad's default: odd, so N's parity decides whether D's rows are pair-aligned


@dataclasses.dataclass(frozen=True)
class GemmProblem:
    """One GEMM case: D (m x n, out_dtype) = epilogue(A (m x k) @ B (k x n)), A and B in dtype.

    Layouts: a "row" A is stored row by row with leading dimension lda = k + lda_pad; a "col" A
    column by column with lda = m + lda_pad (likewise B: ldb = n + ldb_pad or k + ldb_pad).
    a_offset/b_offset: elements between the allocation's start and the view's first element,
    so a nonzero offset misaligns the base pointer. vec_offset (bias and scale vectors) and
    c_offset (C, row-major with ldc = n + ldc_pad) do the same for the epilogue's operands, which
    the kernels read in pairs, or (V5, a 16-bit C) load by TMA, only where those are aligned.
    ldd_pad: the output's rows lie n + ldd_pad apart (the sweep's poisoned output). The default,
    LDD_PAD, gives odd-N outputs even row strides and even-N outputs odd ones; V4 writes (and reads
    the chain) in pairs only where D's rows are pair-aligned too.
    epilogue: alpha (float), bias (None or dtype), activation (None or name), scale (None,
    "scalar" or dtype of a per-column vector),
    residual (None or dtype of C), beta (float; 0 when residual is None).
    """
    m: int
    n: int
    k: int
    dtype: str = "float16"
    out_dtype: str = "float16"
    a_layout: str = "row"
    b_layout: str = "row"
    a_offset: int = 0
    b_offset: int = 0
    lda_pad: int = 0
    ldb_pad: int = 0
    vec_offset: int = 0
    c_offset: int = 0
    ldc_pad: int = 0
    ldd_pad: int = LDD_PAD
    epilogue: dict = dataclasses.field(default_factory=lambda: dict(NO_EPILOGUE), hash=False)

    @property
    def lda(self) -> int:
        return _leading_dim(self.k if self.a_layout == "row" else self.m, self.lda_pad)

    @property
    def ldb(self) -> int:
        return _leading_dim(self.n if self.b_layout == "row" else self.k, self.ldb_pad)

    @property
    def has_epilogue(self) -> bool:
        return self.epilogue != NO_EPILOGUE

    def __str__(self) -> str:
        # Short enough for a test id / log line, complete enough to rebuild the problem.
        text = (f"{self.m}x{self.n}x{self.k} {self.dtype}->{self.out_dtype} A:{self.a_layout}"
                f"+{self.a_offset}/ld{self.lda} B:{self.b_layout}+{self.b_offset}/ld{self.ldb}")
        if self.has_epilogue:
            text += " " + ",".join(f"{k}={v}" for k, v in self.epilogue.items() if v != NO_EPILOGUE[k])
            text += "".join(f" {name}+{v}" for name, v in (("vec", self.vec_offset), ("C", self.c_offset)) if v)
            text += f"/ld{self.n + self.ldc_pad}" if self.ldc_pad else ""
        if self.ldd_pad != LDD_PAD:
            text += f" D/ld{self.n + self.ldd_pad}"
        return text


def _leading_dim(extent: int, pad: int) -> int:
    return max(extent + pad, 1)          # BLAS convention: ld >= max(1, extent), also for empty


@dataclasses.dataclass
class GemmInputs:
    """The arrays for one problem. ``epilogue_kwargs`` is what reference_gemm, gemm_error_bound
    and assert_gemm_close take (alpha, bias, activation, scale, c, beta)."""
    a: object
    b: object
    epilogue_kwargs: dict


def strided_matrix(rows, cols, layout, ld_pad, offset, values, xp=np, fill=np.nan, tight_end=False):
    """A rows x cols view of ``values`` stored in `layout` with leading dim (contiguous extent +
    ld_pad), starting `offset` elements into a fresh flat allocation. Padding and the offset gap
    hold `fill` (NaN by default), so a kernel that reads outside the view gets NaN in its output.

    Row-major: the allocation is rows rows of ld elements (ld >= cols) and the view their first
    cols columns. Column-major: the same for the transpose (cols rows of ld >= rows elements),
    then transposed back, i.e. strides (1, ld) in elements.

    tight_end: the allocation ends at the view's last element (the last row has no padding), as
    a view into a buffer of exactly its span does. A read past the view's end then lies outside
    the allocation, where compute-sanitizer's memcheck reports it, and not in padding, whose NaN
    reaches only outputs that are never stored when the read is past N (a 16-byte load across
    the end of a row).
    """
    outer, inner = (rows, cols) if layout == "row" else (cols, rows)
    ld = _leading_dim(inner, ld_pad)
    flat = np.full(offset + outer * ld, fill, dtype=np.float32).astype(values.dtype)
    flat[offset:].reshape(outer, ld)[:, :inner] = values if layout == "row" else values.T
    if tight_end and outer and inner:   # cut on the host (a copy: its own allocation), so a device
        flat = flat[:offset + (outer - 1) * ld + inner].copy()   # gets only what it keeps
    return _view(xp.asarray(flat) if xp is not np else flat, offset, outer, inner, ld, layout, xp, tight_end)


def strided_view(flat, shape, element_strides, xp):
    """A view of the 1-D array `flat` with `shape` and strides counted in elements (NumPy's or
    CuPy's as_strided): how the tight-end operands keep padding between rows but none after the
    last element."""
    as_strided = importlib.import_module(xp.__name__ + ".lib.stride_tricks").as_strided
    item = flat.dtype.itemsize
    return as_strided(flat, shape=tuple(shape), strides=tuple(s * item for s in element_strides))


def _view(flat, offset, outer, inner, ld, layout, xp, tight_end):
    """The outer x inner rows of ld elements from `offset` in flat, transposed back for "col";
    with tight_end (and a non-empty view) in an array that ends at the view's last element (flat
    itself when it already does, else a copy of its start)."""
    if not tight_end or outer == 0 or inner == 0:
        stored = flat[offset:].reshape(outer, ld)[:, :inner]
    else:
        end = offset + (outer - 1) * ld + inner
        if flat.size != end:
            flat = flat[:end].copy()
        stored = strided_view(flat[offset:], (outer, inner), (ld, 1), xp)
    return stored if layout == "row" else stored.T


def _device_strided_matrix(rows, cols, layout, ld_pad, offset, values, dtype, xp, fill=np.nan, tight_end=False):
    """strided_matrix's geometry for values already on the device (float32, exact for the
    integers, or about to be rounded once for normal values): built there in float32, then the
    whole allocation (fill included) cast to dtype, as the host path casts its float32 draws."""
    outer, inner = (rows, cols) if layout == "row" else (cols, rows)
    ld = _leading_dim(inner, ld_pad)
    flat = xp.full(offset + outer * ld, fill, dtype=np.float32)
    flat[offset:].reshape(outer, ld)[:, :inner] = values if layout == "row" else values.T
    return _view(flat.astype(NUMPY_DTYPES[dtype_name(dtype)]), offset, outer, inner, ld, layout, xp, tight_end)


class _DeviceDraws:
    """The large draws (A, B, C) made on the device by a CuPy generator seeded from the host rng:
    no host generation, no host-to-device copy. Same distributions as the host draws, other values.

    Philox, because its state needs no set-up pass (cuRAND's default, XORWOW, runs one per
    generator before its first draw, and the sweep makes a generator per case). Integers come from
    uniform doubles u in [0, 1) as floor(u (2r + 1)) - r, clamped at r because the product can round
    up to 2r + 1 for u just below 1: uniform on [-r, r] up to a negligible bias, and, unlike
    RandomState.randint, without device-to-host syncs (its rejection sampling counts the rejects)."""

    def __init__(self, xp, seed: int):
        self.xp = xp
        # The seed as numpy.uint64: CuPy 13.0-13.2 with NumPy 2 reject a Python int (a signed-to-unsigned
        # "safe" cast).
        self.state = xp.random.RandomState(np.uint64(seed), method=xp.cuda.curand.CURAND_RNG_PSEUDO_PHILOX4_32_10)

    def normal(self, shape):
        if 0 in shape:                                 # cuRAND is not asked for nothing
            return self.xp.zeros(shape, np.float32)
        return self.state.standard_normal(shape, dtype=np.float32)

    def integers(self, shape, r: int):
        if 0 in shape:
            return self.xp.zeros(shape, np.float32)
        u = self.state.random_sample(shape, dtype=np.float64)
        return (self.xp.minimum(self.xp.floor(u * (2 * r + 1)), 2 * r) - r).astype(np.float32)


def make_inputs(problem: GemmProblem, rng: np.random.Generator, xp=np, integer=False, device_draws=False,
                tight_end=False) -> GemmInputs:
    """Build A, B (strided, offset views) and the epilogue tensors with xp (numpy or cupy).

    Values: standard normal rounded to the dtype, or with integer=True small integers (see
    ``integer_inputs``: exact accumulation). With an epilogue the accumulation budget drops to
    2^20, bias and C hold integers up to 2^10, a scale vector holds +-{1/2, 1, 2} and a scalar
    scale is 2; then with alpha, beta in {+-1/2, +-1, +-2} and activation None/relu
    (``problem_is_exact``) every intermediate fits 24 significant bits (below 2^23 on a grid of
    1/2, or below 2^20 on a grid of 1/4), so the output must equal the rounded reference bit for bit.

    By default every value is drawn from rng on the host, so a seed gives the same inputs with
    NumPy and CuPy. device_draws=True (xp must be cupy) draws A, B and C on the device instead,
    from a generator seeded by rng: the same distributions and integer ranges, reproducible for a
    given seed on the device, but other values than the host draws. The small bias and scale
    vectors and the scalars still come from rng. tight_end: A, B and C end at their last element
    (strided_matrix), for the sanitizer.
    """
    p, ep = problem, problem.epilogue
    dt = NUMPY_DTYPES[dtype_name(p.dtype)]
    budget = 2 ** 20 if p.has_epilogue else 2 ** 24
    device = _DeviceDraws(xp, int(rng.integers(2 ** 63))) if device_draws else None

    def values(shape, dtype=dt, k=p.k):
        if integer:
            return integer_inputs(shape, k, rng, dtype, budget=budget)
        return rng.standard_normal(shape).astype(np.float32).astype(NUMPY_DTYPES[dtype_name(dtype)])

    def matrix(rows, cols, layout, ld_pad, offset, dtype=dt, k=p.k):
        if device is None:
            return strided_matrix(rows, cols, layout, ld_pad, offset, values((rows, cols), dtype, k), xp,
                                  tight_end=tight_end)
        drawn = (device.integers((rows, cols), integer_range(k, dtype, budget)) if integer
                 else device.normal((rows, cols)))
        return _device_strided_matrix(rows, cols, layout, ld_pad, offset, drawn, dtype, xp, tight_end=tight_end)

    a = matrix(p.m, p.k, p.a_layout, p.lda_pad, p.a_offset)
    b = matrix(p.k, p.n, p.b_layout, p.ldb_pad, p.b_offset)

    bias = scale = c = None
    def vector(host):   # the view starts vec_offset elements into its allocation
        if not p.vec_offset:
            return xp.asarray(host)
        flat = np.full(p.vec_offset + host.size, np.nan, dtype=np.float32).astype(host.dtype)
        flat[p.vec_offset:] = host
        return xp.asarray(flat)[p.vec_offset:]

    if ep["bias"] is not None:
        bias = vector(values((p.n,), ep["bias"], k=1))
    if ep["scale"] == "scalar":
        scale = 2.0 if integer else float(rng.uniform(0.25, 2.0) * rng.choice((-1, 1)))
    elif ep["scale"] is not None:
        if integer:
            magnitudes = np.ldexp(1.0, rng.integers(-1, 1, size=p.n, endpoint=True))
        else:
            magnitudes = rng.uniform(0.25, 2.0, size=p.n)
        signed = (magnitudes * rng.choice((-1.0, 1.0), size=p.n)).astype(np.float32)
        scale = vector(signed.astype(NUMPY_DTYPES[dtype_name(ep["scale"])]))
    if ep["residual"] is not None:
        if device is None:
            c = strided_matrix(p.m, p.n, "row", p.ldc_pad, p.c_offset, values((p.m, p.n), ep["residual"], k=1), xp,
                               tight_end=tight_end)
        else:
            drawn = (device.integers((p.m, p.n), integer_range(1, ep["residual"], budget)) if integer
                     else device.normal((p.m, p.n)))
            c = _device_strided_matrix(p.m, p.n, "row", p.ldc_pad, p.c_offset, drawn, ep["residual"], xp,
                                       tight_end=tight_end)
    kwargs = dict(alpha=ep["alpha"], bias=bias, activation=ep["activation"], scale=scale, c=c, beta=ep["beta"])
    return GemmInputs(a=a, b=b, epilogue_kwargs=kwargs)


def dims(min_dim=1, max_dim=160):
    """One GEMM dimension: any value in range, or (as often) 1..8, a prime or a tile edge.

    The plain integer range comes first so that shrinking lands on the exact boundary value."""
    from hypothesis import strategies as st
    special = sorted({d for d in SMALL_DIMS + PRIMES + TILE_EDGES if min_dim <= d <= max_dim})
    parts = [st.integers(min_dim, max_dim), st.integers(min_dim, max(min_dim, min(8, max_dim)))]
    if special:
        parts.append(st.sampled_from(special))
    return st.one_of(parts)


# First entries are the "nothing" choices: hypothesis shrinks sampled_from toward index 0.
_ALPHAS = (1.0, -1.0, 2.0, 0.5, 0.1, -1.7, 3.0)
_BETAS = (1.0, -1.0, 0.5, 2.0, 0.3, -0.25)


def epilogues(dtypes=_FLOAT_DTYPES):
    """An epilogue dict; every part independently on or off (shrinks to all off)."""
    from hypothesis import strategies as st
    alpha_st = st.sampled_from(_ALPHAS)
    bias_st = residual_st = st.sampled_from((None,) + tuple(dtypes))
    activation_st = st.sampled_from((None,) + ACTIVATION_NAMES)
    scale_st = st.sampled_from((None, "scalar") + tuple(dtypes))
    beta_st = st.sampled_from(_BETAS)

    @st.composite
    def epilogue(draw):
        alpha, bias, activation, scale = draw(alpha_st), draw(bias_st), draw(activation_st), draw(scale_st)
        residual = draw(residual_st)
        beta = draw(beta_st) if residual is not None else 0.0
        return dict(alpha=alpha, bias=bias, activation=activation, scale=scale, residual=residual, beta=beta)

    return epilogue()


def gemm_problems(max_dim=160, min_dim=1, dtypes=("float16", "bfloat16"), out_dtypes=None,
                  with_epilogue=False, layouts=("row", "col"), max_offset=7, max_pad=9, max_elements=None):
    """A strategy for GemmProblem.

    out_dtypes: None means the input dtype first (the default), then the others.
    max_offset/max_pad bound the misalignment and leading-dimension padding (elements).
    max_elements: optional cap on m*n + m*k + k*n, to keep host references cheap.
    """
    from hypothesis import assume, strategies as st
    # Sub-strategies are built once here, not per draw: building them dominates draw time.
    dtype_st = st.sampled_from(tuple(dtypes))
    out_st = {d: st.sampled_from(tuple(out_dtypes or (d,) + tuple(o for o in _FLOAT_DTYPES if o != d)))
              for d in dtypes}
    dim_st = dims(min_dim, max_dim)
    layout_st = st.sampled_from(tuple(layouts))
    offset_st, pad_st = st.integers(0, max_offset), st.integers(0, max_pad)
    epilogue_st = epilogues() if with_epilogue else st.just(NO_EPILOGUE)

    @st.composite
    def problems(draw):
        dtype = draw(dtype_st)
        out_dtype = draw(out_st[dtype])
        m, n, k = draw(dim_st), draw(dim_st), draw(dim_st)
        if max_elements is not None:
            assume(m * n + m * k + k * n <= max_elements)
        problem = GemmProblem(m=m, n=n, k=k, dtype=dtype, out_dtype=out_dtype,
                              a_layout=draw(layout_st), b_layout=draw(layout_st),
                              a_offset=draw(offset_st), b_offset=draw(offset_st),
                              lda_pad=draw(pad_st), ldb_pad=draw(pad_st), ldd_pad=draw(pad_st),
                              epilogue=dict(draw(epilogue_st)))
        # The epilogue's operands are views too: the kernels read them in pairs (V5: a 16-bit C by
        # TMA) only where they are aligned, so their offsets and C's padding are drawn like A's.
        ep, extra = problem.epilogue, {}
        if ep["bias"] is not None or ep["scale"] not in (None, "scalar"):
            extra["vec_offset"] = draw(offset_st)
        if ep["residual"] is not None:
            extra.update(c_offset=draw(offset_st), ldc_pad=draw(pad_st))
        return dataclasses.replace(problem, **extra) if extra else problem

    return problems()


def problem_is_exact(problem: GemmProblem) -> bool:
    """True when make_inputs(..., integer=True) gives an output that must match bit for bit:
    alpha, beta and a scalar scale powers of two (or beta unused), activation None or relu."""
    ep = problem.epilogue

    def small_power_of_two(v):
        return abs(v) in (0.5, 1.0, 2.0)

    return (small_power_of_two(ep["alpha"]) and ep["activation"] in (None, "relu")
            and (ep["residual"] is None or small_power_of_two(ep["beta"])))
