"""The verification sweep: which problems each kernel must pass, and how one problem is checked.

Problems derive from each kernel's own tile (from the registry), so adding a kernel adds its edge
cases: one row or column past a tile, one short of it, K below one K-step, M or N = 1, K = 0.
Every problem runs with a poisoned, guarded output (unwritten elements and stray stores fail),
misaligned operand views on alternate problems, and one of three oracles:
  * "bound":   random normal inputs within the forward error bound of the FP64 reference;
  * "exact":   small-integer inputs, bit-exact against the rounded FP64 reference;
  * "cublas":  the bound check, plus cuBLAS (cupy.matmul) as a second reference: cuBLAS must itself
               pass the bound, and the two outputs may differ by at most the sum of both bounds.
"""
from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from deepgemm import arrays, registry
from deepgemm.testing.errors import naming_case
from deepgemm.testing.strategies import NO_EPILOGUE, GemmProblem, problem_is_exact

LAYOUTS = (("row", "row"), ("row", "col"), ("col", "row"), ("col", "col"))
# Each part alone, then all together (the integer-exact friendly values). The bias alone is a
# float16 one, nn.Linear's: its dtype code is 0, and a chain with nothing else must still run (a
# `DG_BIAS > 0` for `>= 0` would skip it); the float32 and bfloat16 biases come with other parts.
EPILOGUE_CASES = {
    "alpha": dict(NO_EPILOGUE, alpha=2.0),
    "bias": dict(NO_EPILOGUE, bias="float16"),
    "relu": dict(NO_EPILOGUE, activation="relu"),
    "gelu": dict(NO_EPILOGUE, bias="float32", activation="gelu"),
    "gelu_erf": dict(NO_EPILOGUE, activation="gelu_erf"),
    "silu": dict(NO_EPILOGUE, activation="silu"),
    "scale_scalar": dict(NO_EPILOGUE, scale="scalar"),
    "scale_vector": dict(NO_EPILOGUE, scale="bfloat16"),
    "residual": dict(NO_EPILOGUE, residual="float16", beta=1.0),
    "all": dict(alpha=0.5, bias="bfloat16", activation="relu", scale="float32", residual="float32", beta=-1.0),
}
# Sizes for the full tier (CUTLASS-testbed style): powers of two and neighbours, primes, and
# alignment edges A and 512 - k*A for alignments of 1, 2, 4 and 8 elements.
FULL_SIZES = sorted({1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 511, 512, 513,
                     1023, 1024, 1025, 131, 257, 521, 1031, 2053}
                    | {512 - k * a for a in (1, 2, 4, 8) for k in (1, 2, 3)})
FULL_LARGE = ((2047, 2049, 2048), (4096, 4096, 4096), (4095, 4097, 4095))


@dataclasses.dataclass(frozen=True)
class Case:
    kernel: str
    problem: GemmProblem
    oracle: str = "bound"        # bound | exact | cublas
    config: tuple = ()           # sorted (define, value) pairs of a config_space entry; () = the default

    def __str__(self) -> str:
        from deepgemm import tuner
        name = tuner.label(registry.get(self.kernel), dict(self.config)) if self.config else self.kernel
        return f"{name}:{self.oracle}:{self.problem}"


def not_on_this_gpu(case, cc: int) -> str | None:
    """Why a GPU of compute capability `cc` cannot run `case` (a Case, or a grouped one: what names
    a kernel and a config), or None: its kernel needs a newer GPU (V5 on an A100), or its config's
    blocks need more shared memory than that GPU gives one (V4's 144 KB tiles on an L4). The GPU
    tier skips such a case, saying so, instead of failing it. "auto" runs everywhere."""
    if case.kernel == "auto":
        return None
    spec = registry.get(case.kernel)
    if spec.min_cc > cc:
        return f"{case.kernel} needs compute capability {spec.min_cc / 10:.1f}, this GPU has {cc / 10:.1f}"
    if case.config:   # the case's own shape was checked at sm_90's limits: only cc may refuse it now
        return spec.config_reason(spec.config_defines(dict(case.config)), registry.Problem(1, 1, 1, cc=cc))
    return None


def tile_of(kernel: str, config: dict | None = None) -> tuple[int, int, int]:
    spec = registry.get(kernel)
    cfg = spec.config_defines(config)
    rows, cols = spec.tile(cfg)
    return rows, cols, spec.k_step(cfg)


def _misaligned(i: int) -> dict:
    """Alternate problems get odd base offsets and padded leading dimensions (scalar tails)."""
    return dict(a_offset=i % 2, b_offset=(i // 2) % 2, lda_pad=(i % 3) * 3, ldb_pad=((i + 1) % 3) * 5)


def _epilogue_offsets(name: str) -> dict:
    """One-element misalignments of the epilogue operands for the even-N epilogue cases: a 16-bit
    and a 32-bit bias (the kernels' pair checks test each dtype's own size), the vector scale, C."""
    return {"bias": dict(vec_offset=1), "gelu": dict(vec_offset=1), "scale_vector": dict(vec_offset=1),
            "residual": dict(c_offset=1)}.get(name, {})


def edge_shapes(kernel: str) -> list[tuple[int, int, int]]:
    bm, bn, bk = tile_of(kernel)
    return [(8, 8, 8), (1, bn + 1, 2 * bk + 1), (bm + 1, 1, bk), (bm - 1, bn + 1, max(1, bk // 2)),
            (2 * bm + 1, 2 * bn - 1, 3 * bk + 1), (3 * bm, 2 * bn, 8 * bk)]


def quick_cases(kernel: str) -> list[Case]:
    """Every dtype x output dtype x layout on every tile-edge shape, plus the epilogue chain,
    the integer-exact oracle and cuBLAS: a few hundred small problems per kernel."""
    cases, i = [], 0
    combos = itertools.product(registry.INPUT_DTYPES, registry.OUTPUT_DTYPES, LAYOUTS)
    for (dtype, out_dtype, (al, bl)), shape in itertools.product(combos, edge_shapes(kernel)):
        m, n, k = shape
        cases.append(Case(kernel, GemmProblem(m, n, k, dtype, out_dtype, al, bl, **_misaligned(i))))
        i += 1
    bm, bn, bk = tile_of(kernel)
    m, n, k = 2 * bm + 3, 2 * bn + 5, 4 * bk + 3
    for dtype, (al, bl) in itertools.product(registry.INPUT_DTYPES, LAYOUTS):
        cases.append(Case(kernel, GemmProblem(m, n, k, dtype, "float32", al, bl, **_misaligned(i)), "exact"))
        cases.append(Case(kernel, GemmProblem(m, n, k, dtype, dtype, al, bl), "cublas"))
        i += 1
    for (t, dtype), (name, epi) in itertools.product(enumerate(registry.INPUT_DTYPES), EPILOGUE_CASES.items()):
        # Every chain once with an odd N (C's rows odd-length: the per-element path at the edges)
        # and once with an even N, where the kernels read C, bias and scale in pairs, edge tiles
        # included (D's rows pair-aligned too, which V4 also needs for pairs); there the
        # single-part cases also misalign the vectors or C by one element, so each alignment
        # check is needed, and "all" takes the paired path with every operand. At the odd N,
        # "all" pads C's rows to an even length: every operand is pair-aligned, so the kernels
        # read pairs in the interior tiles and must not at the edge tiles, where a pair at column
        # N - 1 would read one element past the vectors and past C's last row.
        even = t % 2 == 1
        offsets = dict(_epilogue_offsets(name), ldd_pad=2) if even else {}
        if name == "all" and not even:
            offsets = dict(ldc_pad=1)
        problem = GemmProblem(bm + 7, bn + 9 + even, 2 * bk + 5, dtype, dtype, "row", "col", epilogue=dict(epi),
                              **_misaligned(i), **offsets)
        cases.append(Case(kernel, problem, "exact" if problem_is_exact(problem) else "bound"))
        i += 1
    # A 16-bit C with whole 16-byte rows is copied into shared memory during the main loop (V5):
    # rows padded to 16 bytes past an N that is not (the last chunk of a row copied in part), and
    # a base 8 bytes off (pairs aligned, 16-byte chunks not).
    for n, extra in ((bn + 10, dict(ldc_pad=6)), (bn + 16, dict(c_offset=4))):
        cases.append(Case(kernel, GemmProblem(bm + 7, n, 2 * bk + 5, "float16", "float16", "row", "col",
                                              epilogue=dict(EPILOGUE_CASES["residual"]), **extra), "exact"))
    cases.append(Case(kernel, GemmProblem(bm + 1, bn + 1, 0, "float16", "float32",
                                          epilogue=dict(EPILOGUE_CASES["all"]))))    # K = 0
    for dtype in registry.INPUT_DTYPES:                                               # ~1024, odd
        cases.append(Case(kernel, GemmProblem(1024, 1023, 1025, dtype, "float32", "row", "col", **_misaligned(1))))
    return _supported(cases) + aligned_cases(kernel) + one_operand_aligned_cases(kernel)


def one_operand_aligned_cases(kernel: str) -> list[Case]:
    """Both bases 16-byte aligned and every extent a multiple of 8, with one operand's rows padded
    off 16 bytes (3 or 5 elements) and the other's whole: each operand's vector path is decided by
    its own pitch alone. Elsewhere in the quick cases an aligned base with rows off 16 bytes never
    meets whole rows in the other operand, so a kernel that tested A's pitch for B's vector loads
    (or the reverse) passed them all."""
    bm, bn, bk = tile_of(kernel)
    cases = []
    for (al, bl), (lda_pad, ldb_pad) in itertools.product(LAYOUTS, ((3, 0), (0, 5))):
        cases.append(Case(kernel, GemmProblem(2 * bm + 8, 2 * bn + 8, 2 * bk + 8, "float16", "float32", al, bl,
                                              lda_pad=lda_pad, ldb_pad=ldb_pad), "exact"))
    return _supported(cases)


def aligned_cases(kernel: str) -> list[Case]:
    """A and B both 16-byte aligned (base and leading dimension), every dtype and layout: the
    zero-copy path of every operand at once (V5's TMA on both, the vector loads of V3, V4 and
    small_m), which the other quick cases, each misaligning an operand, never take together.
    Twice: extents that are multiples of 8 elements, past whole tiles; and rows padded to 16 bytes
    past extents that are not, where the last chunk of each row is partly past the view, so a
    vector load that skips its edge test reads outside it (the sanitizer sample builds these
    operands ending at their last element, where that read leaves the allocation).
    And a 16-bit output whose rows are whole 16 bytes (N a multiple of 8, rows padded with poison
    past it), per dtype: what V5 stores by TMA, 64 x 64 boxes clipped at M and N by the output's
    tensor map (every other quick case's output rows lie N + 3 apart, which V5 stores itself);
    with a 16-bit residual beside it, once staged by TMA and once not."""
    bm, bn, bk = tile_of(kernel)
    cases = []
    for dtype, (al, bl) in itertools.product(registry.INPUT_DTYPES, LAYOUTS):
        cases.append(Case(kernel, GemmProblem(2 * bm + 8, 2 * bn + 8, 2 * bk + 8, dtype, "float32", al, bl), "exact"))
        m, n, k = 2 * bm + 1, 2 * bn + 3, 2 * bk + 5
        a_extent, b_extent = (k if al == "row" else m), (n if bl == "row" else k)
        cases.append(Case(kernel, GemmProblem(m, n, k, dtype, "float32", al, bl, lda_pad=-a_extent % 8,
                                              ldb_pad=-b_extent % 8), "exact"))
    for dtype in registry.INPUT_DTYPES:
        cases.append(Case(kernel, GemmProblem(2 * bm + 1, 2 * bn + 8, 2 * bk + 8, dtype, dtype, "row", "col",
                                              ldd_pad=8)))
    # The same output with a 16-bit residual: C's rows whole 16 bytes too (both C and D by TMA in
    # V5), and C's rows pair-aligned but not whole 16 bytes (C read from global memory, D stored
    # by TMA): only C's own pitch may decide how C is read.
    for ldc_pad in (8, 2):
        cases.append(Case(kernel, GemmProblem(2 * bm + 1, 2 * bn + 8, 2 * bk + 8, "float16", "float16", "row", "col",
                                              epilogue=dict(EPILOGUE_CASES["residual"]), ldc_pad=ldc_pad,
                                              ldd_pad=8), "exact"))
    return _supported(cases)


def _supported(cases: list[Case]) -> list[Case]:
    """Only the shapes the kernel's supports() accepts (small_m refuses large M by design)."""
    return [c for c in cases if registry.get(c.kernel).supports(
        registry.Problem(c.problem.m, c.problem.n, c.problem.k, c.problem.dtype, c.problem.out_dtype)) is None]


def shipped_configs(kernel: str) -> list[dict]:
    """The configs of `kernel` that a shipped tuned table (deepgemm/configs) hands to "auto"."""
    from deepgemm import tables
    out = []
    for path in sorted(tables.SHIPPED_DIR.glob("*.json")):
        table, _ = tables.read(path)
        for entry in (table or {}).get("entries", {}).values():
            if entry.get("kernel") == kernel:
                full = registry.get(kernel).config_defines(entry.get("config"))
                if full not in out:
                    out.append(full)
    return out


def quick_configs(kernel: str) -> list[dict]:
    """The configs the quick tier runs besides the default: those a shipped tuned table hands to
    "auto", those the kernel's config rule can hand out where no table decides
    (dispatch.rule_configs), then config_space entries in order wherever one sets a define to a
    value no config so far has (so every value of every tuning parameter, and with it every code
    path a config selects, e.g. V5's ping-pong consumers, runs in the quick tier)."""
    from deepgemm import dispatch
    spec = registry.get(kernel)
    chosen = [spec.config_defines(None)]
    for c in shipped_configs(kernel) + dispatch.rule_configs(kernel):
        if c not in chosen:
            chosen.append(c)
    seen = {(k, v) for c in chosen for k, v in c.items()}
    for config in spec.config_space:
        full = spec.config_defines(config)
        if full not in chosen and any((k, v) not in seen for k, v in full.items()):
            chosen.append(full)
            seen |= set(full.items())
    return chosen[1:]


def config_cases(kernel: str, configs=None) -> list[Case]:
    """Each non-default config (default: every config_space entry) at its own tile edges: the
    integer-exact oracle on a problem one row past two tile rows and one column short of two tile
    columns, over 323 k values (6 k-blocks of 64: split-K ranks get unequal slices, some of eight
    none), or past two of the config's k steps where those are longer (small_m's: every warp's turn,
    twice), with B column- and row-major where the config takes it, and on one of 315 tiles (two or
    more per block of a persistent grid); past two k steps and 8 more k values (16-byte rows whose
    last chunk is cut by K), with B aligned and one element off its base, where the kernel loads
    without TMA; and the whole epilogue chain, with an even N (paired
    operands, edge tiles included) and with K = 0 over the 315 tiles, under the error bound. Every
    output poisoned and guarded, as in every case."""
    spec = registry.get(kernel)
    out = []
    for config in (spec.config_space if configs is None else configs):
        full = spec.config_defines(config)
        if full == spec.config_defines(None):
            continue
        key = tuple(sorted(full.items()))
        bm, bn, bk = tile_of(kernel, full)
        k = max(323, 2 * bk + 3)
        problems = [(GemmProblem(2 * bm + 1, 2 * bn - 1, k, "bfloat16", "float32", "row", bl), "exact")
                    for bl in ("col", "row")]
        # 21 x 15 = 315 tiles: every block of a persistent grid (one per SM, 132 on an H200) walks
        # two or more, so a ping-pong build's second consumer and its turn-taking run too
        problems.append((GemmProblem(20 * bm + 1, 15 * bn - 1, k, "float16", "float32", "row", "col"), "exact"))
        # The vector loads' edges: rows of whole 16 bytes with K 8 past a multiple of 32 (a 16-byte
        # load or copy must stop at K: the last chunk is the scalar path's), B's rows 16 bytes
        # longer than A's (each operand read at its own pitch), and B one element off its base (no
        # 16-byte access to B at all). Not for a kernel that loads by TMA (V5: see loads_by_tma).
        if not spec.loads_by_tma:
            k_tail = 2 * bk + 40
            problems += [(GemmProblem(bm - 1, bn + 2, k_tail, "float16", "float32", "row", "col",
                                      b_offset=b_offset, ldb_pad=8), "exact") for b_offset in (0, 1)]
        problems.append((GemmProblem(bm - 1, bn + 2, 197, "float16", "float16", "row", "col",
                                     epilogue=dict(EPILOGUE_CASES["all"])), "bound"))
        # K = 0 over the 315 tiles: no k-block anywhere (split-K ranks and ping-pong turns with an
        # empty main loop), the epilogue of a zero product on every tile. B row-major: a 0 x N
        # operand is contiguous both ways and gemm() reads it as row-major, so configs that need a
        # column-major B (96-wide tiles) never take K = 0.
        problems.append((GemmProblem(20 * bm + 1, 15 * bn - 1, 0, "float16", "float16", "row", "row",
                                     epilogue=dict(EPILOGUE_CASES["all"])), "bound"))
        for p, oracle in problems:
            row_b = p.b_layout == "row"
            b = arrays.Matrix(0, p.k, p.n, p.dtype, row_b, p.n if row_b else p.k, 0)
            problem = registry.Problem(p.m, p.n, p.k, p.dtype, p.out_dtype, b=b)
            if spec.supports(problem) is None and spec.config_reason(full, problem) is None:
                out.append(Case(kernel, p, oracle, key))
    return out


def full_cases(kernel: str) -> list[Case]:
    """The quick cases plus the size list (square and skinny) and a few large, misaligned ones."""
    quick = quick_cases(kernel)
    cases = list(quick)
    combos = list(itertools.product(registry.INPUT_DTYPES, LAYOUTS))
    for i, s in enumerate(FULL_SIZES):
        dtype, (al, bl) = combos[i % len(combos)]
        cases.append(Case(kernel, GemmProblem(s, s, s, dtype, dtype, al, bl, **_misaligned(i))))
        cases.append(Case(kernel, GemmProblem(1, s, s, dtype, "float32", al, bl)))
        cases.append(Case(kernel, GemmProblem(s, 1, 3 * s, dtype, "float32", bl, al)))
    for i, (m, n, k) in enumerate(FULL_LARGE):
        dtype, (al, bl) = combos[(3 * i) % len(combos)]
        cases.append(Case(kernel, GemmProblem(m, n, k, dtype, "float32", al, bl, **_misaligned(i)), "cublas"))
    return cases[:len(quick)] + _supported(cases[len(quick):])


def _largest_k_fp32_bound(cases: list[Case]) -> list[Case]:
    """The error-bound cases with an fp32 output (no output rounding to hide behind) at the longest K."""
    pool = [c for c in cases if c.oracle == "bound" and c.problem.out_dtype == "float32"]
    k = max((c.problem.k for c in pool), default=None)
    return [c for c in pool if c.problem.k == k]


def _most_work(cases: list[Case]) -> list[Case]:
    """The cases with the most M x N x K: the most thread blocks, each running the most K steps."""
    work = max(c.problem.m * c.problem.n * c.problem.k for c in cases)
    return [c for c in cases if c.problem.m * c.problem.n * c.problem.k == work]


# Which quick cases a planted bug of each kind fails first, and how often to run them before the
# rest (tests/gpu/test_broken_kernels.py). Walking the sweep in its own order until the bug shows
# took a minute for a missing barrier, which the small cases never expose.
#   accumulation: an fp16 accumulator rounds every partial sum to 11 bits: on normal data its
#                 error grows like K 2^-12 while the bound grows like K^2 2^-24, so at K ~ 1024, with
#                 an fp32 output whose rounding hides nothing, most elements exceed the bound.
#   race:         a missing __syncthreads() shows only when warps drift apart: many blocks, many K
#                 tiles. Still a matter of timing, so those cases run three times (fresh inputs).
#   store:        a store outside the output (or a missing one) shows on any case: every output is
#                 poisoned and guarded, with padded rows.
FIRST_TO_FAIL = {
    "accumulation": (_largest_k_fp32_bound, 1),
    "race": (_most_work, 3),
    "store": (lambda cases: cases[:1], 1),
}


def self_test_order(cases: list[Case], kind: str) -> tuple[list[Case], list[Case]]:
    """(first, rest): the cases to try first against a planted bug of `kind` (repeated as
    FIRST_TO_FAIL says), and every other case in sweep order, the fallback should those pass."""
    try:
        pick, repeats = FIRST_TO_FAIL[kind]
    except KeyError:
        raise ValueError(f"unknown planted-bug kind {kind!r}; expected one of {sorted(FIRST_TO_FAIL)}") from None
    first = pick(cases)
    return first * repeats, [c for c in cases if c not in first]


def run_case(case: Case, rng: np.random.Generator, *, xp=None, gemm_fn=None, on_device=None,
             tight_end=False) -> float:
    """Run one case; raise AssertionError on any failure; return the error margin.

    xp/gemm_fn default to CuPy and deepgemm.gemm; the CPU tier passes NumPy and stand-in kernels
    to prove this machinery passes a correct kernel and fails a wrong one.
    on_device (default: whenever xp is CuPy): draw A, B and C on the device (seeded from rng), and
    compute the FP64 reference and the bound and compare there, so that only the verdict comes back
    to the host; the GPU tier was bound by host-side generation and FP64 GEMMs, not by the kernels.
    on_device=False keeps all of that on the host, with inputs drawn from rng and copied up (what
    the sanitizer sample does: only deepgemm's kernels then run under compute-sanitizer).
    tight_end: operands that end at their last element (make_inputs), for the sanitizer.
    An error other than an assertion (e.g. a CUDA fault) is raised as it is, with the case printed
    (errors.naming_case)."""
    with naming_case(case):
        return _run_case(case, rng, xp, gemm_fn, on_device, tight_end)


def _run_case(case: Case, rng: np.random.Generator, xp, gemm_fn, on_device, tight_end) -> float:
    from deepgemm.testing import (assert_bitwise_equal, assert_gemm_close, make_inputs, poisoned_output,
                                  reference_gemm, round_to)
    from deepgemm.testing.bounds import gemm_error_bound

    if xp is None:
        import cupy as xp
    if gemm_fn is None:
        from deepgemm import gemm as gemm_fn
    if on_device is None:
        on_device = xp is not np
    check = xp if on_device else np                      # where the reference and the comparison run

    p = case.problem
    spec = registry.get(case.kernel)
    inputs = make_inputs(p, rng, xp=xp, integer=case.oracle == "exact", device_draws=on_device, tight_end=tight_end)
    out = poisoned_output((p.m, p.n), p.out_dtype, xp=xp, ld=p.n + p.ldd_pad)
    gemm_fn(inputs.a, inputs.b, kernel=case.kernel, out=out.view, **({"config": dict(case.config)} if case.config else {}),
            **inputs.epilogue_kwargs)
    if xp.__name__ == "cupy":
        xp.cuda.get_current_stream().synchronize()
    where = f"[{case}] "
    out.check()
    out.assert_all_written()
    if case.oracle == "exact":
        expected = round_to(reference_gemm(inputs.a, inputs.b, xp=check, **inputs.epilogue_kwargs), p.out_dtype)
        assert_bitwise_equal(out.view, expected, msg=where, xp=check)
        return 0.0
    margin = assert_gemm_close(out.view, a=inputs.a, b=inputs.b, accumulate=spec.accumulate, msg=where, xp=check,
                               **inputs.epilogue_kwargs)
    if case.oracle == "cublas":
        # cuBLAS accumulates on tensor cores (truncating FP32) and rounds to the input dtype.
        vendor = xp.matmul(inputs.a.astype(xp.float32), inputs.b.astype(xp.float32)) if xp is np \
            else xp.matmul(inputs.a, inputs.b).astype(xp.float32)
        theirs = gemm_error_bound(inputs.a, inputs.b, accumulate="fp32_tc", out_dtype=p.dtype, xp=check)
        assert_gemm_close(vendor, a=inputs.a, b=inputs.b, bound=theirs, msg=where + "cuBLAS vs reference: ", xp=check)
        ours = gemm_error_bound(inputs.a, inputs.b, accumulate=spec.accumulate, out_dtype=p.out_dtype, xp=check)
        assert_gemm_close(out.view, ref=vendor, bound=ours + theirs, msg=where + "deepgemm vs cuBLAS: ", xp=check)
    return margin


def _seen_as_row_major(layout: str, rows: int, cols: int, ld: int) -> bool:
    """How deepgemm.arrays.matrix() will classify a view built by strided_matrix() (an empty one is
    row-major whatever its strides)."""
    return layout == "row" or cols == 1 or ld == 1 or rows == 0 or cols == 0


def compile_jobs(cases, arch: str, dev: int | None = None) -> list:
    """Zero-argument compile callables for every kernel variant the cases launch (for warm-cache):
    the build gemm() asks for, config included: the case's own, else the one the named kernel
    picks by shape (dispatch, with device dev's tuned table; None: the heuristics)."""
    from deepgemm import device, dispatch
    cc = device.cc_for_arch(arch)
    seen, jobs = set(), []
    for case in cases:
        p, ep = case.problem, case.problem.epilogue
        a_row = _seen_as_row_major(p.a_layout, p.m, p.k, p.lda)
        # gemm() reads an empty b (nothing to read) as K-major, the layout every config takes
        b_row = _seen_as_row_major(p.b_layout, p.k, p.n, p.ldb) and p.k > 0 and p.n > 0
        epilogue = registry.Epilogue.of(ep["alpha"], ep["bias"], ep["activation"], ep["scale"], ep["residual"],
                                        ep["beta"])
        spec = registry.get(case.kernel)
        if case.config:
            config = spec.config_defines(dict(case.config))
        else:
            layout = ("r" if a_row else "c") + ("r" if b_row else "c")
            problem = dispatch.shape_problem(p.m, p.n, p.k, p.dtype, p.out_dtype, layout, epilogue, cc, dev)
            config = dict(dispatch.choose(problem, kernel=case.kernel, accumulate=spec.accumulation)[1])
        variant = (case.kernel, p.dtype, p.out_dtype, a_row, b_row, epilogue, tuple(sorted(config.items())))
        if variant not in seen:
            seen.add(variant)
            jobs.append(lambda spec=spec, v=variant: registry.compile_variant(spec, arch, *v[1:6], config=dict(v[6])))
    return jobs
