"""The sweep machinery on the CPU: with NumPy arrays and stand-in kernels, a correct kernel passes
every quick case of a kernel's tile geometry, and typical bugs are caught by the intended oracle;
and the planted-bug self-test's choice of the cases to try first (sweep.self_test_order)."""
import dataclasses
import importlib.util
import math
import types
from pathlib import Path

import numpy as np
import pytest

import deepgemm
from deepgemm import registry
from deepgemm.reference import reference_gemm, round_to
from deepgemm.report.emulate import emulate_gemm
from deepgemm.testing import sweep
from deepgemm.testing.strategies import problem_is_exact
from fake_gpu import as_fake, captured, fake_encode, gpus  # noqa: F401 (fixtures)


def correct_kernel(a, b, *, kernel, out, **epilogue):
    out[...] = round_to(reference_gemm(a, b, **epilogue), str(out.dtype))


def test_cases_cover_every_combination_and_edge():
    cases = sweep.quick_cases("v4")
    bm, bn, bk = sweep.tile_of("v4")
    combos = {(c.problem.dtype, c.problem.out_dtype, c.problem.a_layout, c.problem.b_layout) for c in cases}
    assert len(combos) == 2 * 3 * 4
    shapes = {(c.problem.m, c.problem.n, c.problem.k) for c in cases}
    assert {(1, bn + 1, 2 * bk + 1), (bm + 1, 1, bk), (bm - 1, bn + 1, bk // 2)} <= shapes
    assert any(c.problem.k == 0 for c in cases) and any(c.oracle == "exact" for c in cases)
    assert any(c.problem.a_offset for c in cases) and any(c.problem.lda_pad for c in cases)
    assert {name for name in sweep.EPILOGUE_CASES} and sum(c.problem.has_epilogue for c in cases) >= 20


@pytest.mark.parametrize("kernel", registry.names())
def test_every_tile_edge_shape_runs_with_every_dtype_and_layout(kernel):
    """The quick tier's promise, derived from the kernel's own tile: one row or column past a tile,
    one short of it (and of two), M or N = 1, K below one K-step, exactly one K-step and one past
    a K-step boundary, whole tiles only, and a small aligned problem inside one tile, each with
    every input dtype, output dtype and layout."""
    bm, bn, bk = sweep.tile_of(kernel)
    cases = sweep.quick_cases(kernel)
    combos = {}
    for c in cases:
        p = c.problem
        if c.oracle == "bound" and not p.has_epilogue:
            combos.setdefault((p.m, p.n, p.k), set()).add((p.dtype, p.out_dtype, p.a_layout, p.b_layout))
    every = {(d, o, a, b) for d in registry.INPUT_DTYPES for o in registry.OUTPUT_DTYPES for a, b in sweep.LAYOUTS}
    shapes = [shape for shape, seen in combos.items() if seen == every]
    limit = registry.SMALL_M_MAX if kernel == "small_m" else math.inf      # small_m refuses larger M
    wanted = {
        "M = 1": lambda m, n, k: m == 1,
        "N = 1": lambda m, n, k: n == 1,
        "one row past a tile": lambda m, n, k: m == bm + 1,
        "one row short of a tile": lambda m, n, k: m == bm - 1,
        "one row past two tiles": lambda m, n, k: m == 2 * bm + 1 or 2 * bm + 1 > limit,
        "one column past a tile": lambda m, n, k: n == bn + 1,
        "one column short of two tiles": lambda m, n, k: n == 2 * bn - 1,
        "K below one K-step": lambda m, n, k: 0 < k < bk,
        "K of exactly one K-step": lambda m, n, k: k == bk,
        "K one past a K-step boundary": lambda m, n, k: k > bk and k % bk == 1,
        "whole tiles, several in each dimension": lambda m, n, k: (m % bm == n % bn == k % bk == 0
                                                                   and min(m // bm, n // bn, k // bk) >= 2),
        "16-byte aligned, inside one tile": lambda m, n, k: (m % 8 == n % 8 == k % 8 == 0
                                                             and m <= bm and n <= bn and k <= bk),
    }
    missing = [what for what, holds in wanted.items() if not any(holds(*shape) for shape in shapes)]
    assert not missing, (kernel, (bm, bn, bk), sorted(shapes))


@pytest.mark.parametrize("kernel", registry.names())
def test_oracle_cases_have_edge_tiles_in_every_dimension(kernel):
    bm, bn, bk = sweep.tile_of(kernel)
    cases = sweep.quick_cases(kernel)
    # The integer-exact oracle (fp32 out) and cuBLAS (the input dtype out), each for every dtype
    # and layout, past two tiles in M and N with a partial tile and a partial K-step.
    # Their own tests: both operands aligned, whole tiles too; one operand's rows off 16 bytes.
    aligned = set(sweep.aligned_cases(kernel)) | set(sweep.one_operand_aligned_cases(kernel))
    for oracle in ("exact", "cublas"):
        plain = [c.problem for c in cases if c.oracle == oracle and not c.problem.has_epilogue and c not in aligned]
        assert {(p.dtype, p.a_layout, p.b_layout) for p in plain} >= \
            {(d, a, b) for d in registry.INPUT_DTYPES for a, b in sweep.LAYOUTS}, oracle
        for p in plain:
            assert p.m > 2 * bm or kernel == "small_m", (oracle, p)
            assert p.n > 2 * bn and p.k > bk and p.m % bm and p.n % bn and p.k % bk, (oracle, p)
            assert p.out_dtype == ("float32" if oracle == "exact" else p.dtype)
    # K = 0 with the whole epilogue over edge tiles in both dimensions (more than one tile).
    [k_zero] = [c.problem for c in cases if c.problem.k == 0]
    assert k_zero.m > bm and k_zero.n > bn and k_zero.epilogue == sweep.EPILOGUE_CASES["all"]
    # Around 1024 with odd N and K (every vector path's tail), one per input dtype, where M fits.
    if kernel != "small_m":
        large = [c.problem for c in cases if c.problem.m * c.problem.n * c.problem.k >= 1000 ** 3]
        assert {p.dtype for p in large} == set(registry.INPUT_DTYPES)
        assert all(p.n % 2 and p.k % 2 for p in large)


def test_full_tier_adds_every_size_square_and_skinny_and_the_large_cuBLAS_checks():
    quick, full = sweep.quick_cases("v4"), sweep.full_cases("v4")
    assert full[:len(quick)] == quick                                    # the quick tier first, unchanged
    shapes = {(c.problem.m, c.problem.n, c.problem.k) for c in full[len(quick):]}
    for s in sweep.FULL_SIZES:
        assert {(s, s, s), (1, s, s), (s, 1, 3 * s)} <= shapes, s       # square, a row (GEMV), a column
    large = {(c.problem.m, c.problem.n, c.problem.k): c for c in full if c.oracle == "cublas"}
    assert set(sweep.FULL_LARGE) <= set(large)
    assert len({(c.problem.dtype, c.problem.a_layout, c.problem.b_layout) for c in
                (large[shape] for shape in sweep.FULL_LARGE)}) == len(sweep.FULL_LARGE)   # each another way


def test_the_full_tiers_sizes_are_edges_and_primes_and_its_large_shapes_reach_4096():
    """What FULL_SIZES and FULL_LARGE are for (CUTLASS-testbed style): 1, every power of two from 8 to
    1024 with both neighbours, primes past 128, and the alignment edges 512 - k*a for alignments of
    1, 2, 4 and 8 elements; 4096^3, and large shapes one off a power of two in every dimension, on
    both sides, with one misaligned in all three."""
    sizes = set(sweep.FULL_SIZES)
    assert 1 in sizes
    for p in (2 ** i for i in range(3, 11)):
        assert {p - 1, p, p + 1} <= sizes, p
    primes = [s for s in sizes if s > 128 and all(s % d for d in range(2, int(s ** 0.5) + 1))]
    assert len(primes) >= 4 and max(primes) > 2048
    assert {512 - k * a for a in (1, 2, 4, 8) for k in (1, 2, 3)} <= sizes
    assert (4096, 4096, 4096) in sweep.FULL_LARGE
    near = lambda d, side: any(d == 2 ** i + side for i in (11, 12))
    for dim in range(3):
        dims = [shape[dim] for shape in sweep.FULL_LARGE]
        assert any(near(d, -1) or near(d, +1) for d in dims), dim
    assert {-1, +1} <= {side for shape in sweep.FULL_LARGE for d in shape for side in (-1, 1) if near(d, side)}
    assert any(all(d % 8 for d in shape) for shape in sweep.FULL_LARGE)   # no dimension a whole vector


def test_misalignment_alternates_within_each_group_of_cases():
    # Base offsets on A and on B independently, and odd leading-dimension pads (rows that are not
    # even 4-byte aligned), among the plain tile-edge cases and among the epilogue chains.
    cases = sweep.quick_cases("v4")
    plain = [c.problem for c in cases if c.oracle == "bound" and not c.problem.has_epilogue and c.problem.k]
    chains = [c.problem for c in cases if c.problem.has_epilogue and c.problem.k]
    for group in (plain, chains):
        assert {(p.a_offset, p.b_offset) for p in group} == {(0, 0), (0, 1), (1, 0), (1, 1)}
        assert any(p.lda_pad % 2 for p in group) and any(p.ldb_pad % 2 for p in group)
        assert any(p.lda_pad and not p.ldb_pad for p in group) and any(p.ldb_pad and not p.lda_pad for p in group)
    bm, _, _ = sweep.tile_of("v4")
    exact = [c.problem for c in cases if c.oracle == "exact" and not c.problem.has_epilogue and c.problem.m == 2 * bm + 3]
    assert len(exact) == 8 and {(p.a_offset, p.b_offset) for p in exact} == {(0, 0), (0, 1), (1, 0), (1, 1)}


def test_every_epilogue_chain_runs_at_odd_and_even_n_with_misaligned_operands():
    """The kernels read C, bias and scale in pairs only for an even N (at edge tiles) and aligned
    operands: each chain must reach both paths, and each alignment check must matter somewhere."""
    cases = [c for c in sweep.quick_cases("v5") if c.problem.has_epilogue and c.problem.k]
    bm, bn, bk = sweep.tile_of("v5")
    for epi in sweep.EPILOGUE_CASES.values():
        ns = {c.problem.n % 2 for c in cases if c.problem.epilogue == epi}
        assert ns == {0, 1}, epi
    even = [c.problem for c in cases if c.problem.n % 2 == 0]
    # D's rows pair-aligned there too, or V4 takes the per-element path whatever the operands; and
    # an even N with odd D rows elsewhere (plain cases), so D's own alignment check is needed
    for epi in sweep.EPILOGUE_CASES.values():
        assert any(p.epilogue == epi and (p.n + p.ldd_pad) % 2 == 0 for p in even), epi
    even = [p for p in even if (p.n + p.ldd_pad) % 2 == 0]
    plain_even = [c.problem for c in sweep.quick_cases("v4") if not c.problem.has_epilogue and c.problem.n % 2 == 0
                  and c.problem.m > sweep.tile_of("v4")[0] and c.problem.n > sweep.tile_of("v4")[1]]
    assert any((p.n + p.ldd_pad) % 2 for p in plain_even)
    # Every bias element size once misaligned: a pair check that skips one dtype (a 2-byte bias
    # read as 4-byte pairs) is a misaligned-address fault only that dtype shows.
    bias_size = {None: 0, "float16": 2, "bfloat16": 2, "float32": 4}
    for size in (2, 4):
        assert any(p.vec_offset % 2 and bias_size[p.epilogue["bias"]] == size and not p.epilogue["residual"]
                   for p in even), size
    # the vector scale and C one element off pair alignment (an even offset would leave pairs aligned)
    assert any(p.vec_offset % 2 and p.epilogue["scale"] not in (None, "scalar") for p in even)
    assert any(p.c_offset % 2 and p.epilogue["residual"] for p in even)
    aligned_all = [p for p in even if p.epilogue == sweep.EPILOGUE_CASES["all"]]
    assert aligned_all and not any(p.vec_offset or p.c_offset for p in aligned_all)
    # At the odd N the whole chain has C's rows padded to an even length: every operand pair-aligned,
    # so the kernels take pairs inside and must not at the last column (a pair there reads past C).
    odd_all = [c.problem for c in cases if c.problem.n % 2 and c.problem.epilogue == sweep.EPILOGUE_CASES["all"]]
    assert odd_all and all((p.n + p.ldc_pad) % 2 == 0 and not (p.vec_offset or p.c_offset) for p in odd_all)
    assert all(p.m > bm and p.n > bn for p in even)   # an interior tile and edge tiles
    # A 16-bit C that V5 copies 16 bytes at a time: with whole 16-byte rows (a padded row past an N
    # that is not), and 8 bytes off (pairs aligned, chunks not).
    staged = [c.problem for c in cases if c.problem.epilogue["residual"] == "float16" and c.problem.n % 2 == 0]
    assert any(p.ldc_pad and (p.n + p.ldc_pad) % 8 == 0 and p.n % 8 and not p.c_offset for p in staged)
    assert any(p.c_offset == 4 and p.n % 8 == 0 for p in staged)


def test_epilogue_operand_offsets_misalign_the_views():
    from deepgemm.testing.strategies import GemmProblem, make_inputs
    epi = dict(sweep.EPILOGUE_CASES["all"], bias="float16", scale="float16", residual="float16")
    p = GemmProblem(5, 6, 3, epilogue=epi, vec_offset=1, c_offset=1, ldc_pad=2)
    kw = make_inputs(p, np.random.default_rng(0)).epilogue_kwargs
    for name in ("bias", "scale", "c"):
        view = kw[name]
        assert view.__array_interface__["data"][0] % 4 == 2, name          # one fp16 past an aligned start
        assert not np.isnan(view).any() and np.isnan(view.base.ravel()[0]), name   # the gap holds NaN
    assert kw["c"].shape == (5, 6) and kw["c"].strides == (16, 2)
    assert "vec+1" in str(p) and "C+1/ld8" in str(p)


@pytest.mark.parametrize("kernel", ["v0", "v3"])
def test_a_correct_kernel_passes_every_quick_case(kernel):
    cases = [c for c in sweep.quick_cases(kernel) if c.problem.m * c.problem.k < 500_000]
    for i, case in enumerate(cases):
        assert sweep.run_case(case, np.random.default_rng(i), xp=np, gemm_fn=correct_kernel) < 1.0


def test_unwritten_edge_is_caught():
    def skips_last_row(a, b, *, kernel, out, **epilogue):
        correct_kernel(a[:-1], b, kernel=kernel, out=out[:-1], **epilogue)
    case = sweep.quick_cases("v0")[4]
    with pytest.raises(AssertionError, match="never written"):
        sweep.run_case(case, np.random.default_rng(0), xp=np, gemm_fn=skips_last_row)


def test_a_fault_names_its_case_and_a_wrong_result_does_not_repeat_it(capsys):
    """A CUDA fault is sticky (every later example fails too, and hypothesis reports the smallest of
    those): run_case prints the case a non-assertion error came from; an assertion already names it."""
    def faults(a, b, **kw):
        raise RuntimeError("cudaErrorIllegalInstruction: an illegal instruction was encountered\nmore")
    case = sweep.quick_cases("v0")[4]
    with pytest.raises(RuntimeError, match="illegal instruction"):
        sweep.run_case(case, np.random.default_rng(0), xp=np, gemm_fn=faults)
    printed = capsys.readouterr().out
    assert printed.startswith("RuntimeError in case Case(") and repr(case.problem) in printed
    assert printed.rstrip().endswith("an illegal instruction was encountered")   # the first line of the error only
    with pytest.raises(AssertionError):
        sweep.run_case(case, np.random.default_rng(0), xp=np, gemm_fn=lambda a, b, **kw: None)
    assert capsys.readouterr().out == ""


def test_a_wrong_vendor_result_is_blamed_on_the_vendor(monkeypatch):
    """The cuBLAS oracle checks the vendor's product against the FP64 reference first, so a broken
    library (or a driver or dtype mix-up under it) is reported as such, not as deepgemm's error."""
    case = next(c for c in sweep.quick_cases("v0") if c.oracle == "cublas")
    assert sweep.run_case(case, np.random.default_rng(0), xp=np, gemm_fn=correct_kernel) < 1.0
    true_matmul = np.matmul
    monkeypatch.setattr(np, "matmul", lambda a, b: true_matmul(a, b) * np.float32(1.01))
    with pytest.raises(AssertionError, match="cuBLAS vs reference"):
        sweep.run_case(case, np.random.default_rng(0), xp=np, gemm_fn=correct_kernel)


def test_fp16_accumulation_is_caught():
    def fp16_accumulating(a, b, *, kernel, out, **epilogue):
        out[...] = round_to(emulate_gemm(a.astype(np.float64), b.astype(np.float64), "fp16"), str(out.dtype))
    case = next(c for c in sweep.quick_cases("v0") if c.problem.k >= 64 and c.oracle == "bound"
                and c.problem.out_dtype == "float32")
    with pytest.raises(AssertionError, match="outside the error bound"):
        sweep.run_case(case, np.random.default_rng(0), xp=np, gemm_fn=fp16_accumulating)


def test_epilogue_dropped_is_caught():
    def ignores_bias(a, b, *, kernel, out, bias=None, **epilogue):
        correct_kernel(a, b, kernel=kernel, out=out, **epilogue)
    case = next(c for c in sweep.quick_cases("v0") if c.problem.epilogue["bias"])
    with pytest.raises(AssertionError):
        sweep.run_case(case, np.random.default_rng(0), xp=np, gemm_fn=ignores_bias)


def _quick_sweep_on_fakes(monkeypatch, kernel):
    """Every quick case of `kernel` through the real argument checks and dispatch on fake device
    arrays (configs a named kernel picks by shape, an empty B read as K-major, V5's staging
    included), the compile stood in for: (the builds asked for, the cases)."""
    from deepgemm import jit, tma
    built = set()

    def record(name, path, arch, defines):
        built.add((name, arch, tuple(sorted(defines.items()))))
        return types.SimpleNamespace(name=name, key=name, resources={"smem": 0, "registers": 0})
    monkeypatch.setattr(jit, "compile_kernel", record)
    monkeypatch.setattr(tma, "stage", lambda mat, dtype, arch, device, stream: (
        dataclasses.replace(mat, ptr=1 << 36, ld=tma.staged_ld(mat)), None))

    def through_gemm(a, b, *, kernel, out, **kw):
        deepgemm.gemm(as_fake(a), as_fake(b), kernel=kernel, out=as_fake(out), **{k: as_fake(v) for k, v in kw.items()})
        correct_kernel(a, b, kernel=kernel, out=out, **{k: v for k, v in kw.items() if k != "config"})
    cases = sweep.quick_cases(kernel)
    with np.errstate(over="ignore"):   # a 16-bit output past its range is inf, as the kernel's
        for i, case in enumerate(cases):
            sweep.run_case(case, np.random.default_rng(i), xp=np, gemm_fn=through_gemm)
    return built, cases


@pytest.mark.parametrize("kernel", registry.names())
def test_compile_jobs_are_the_builds_the_sweep_asks_for(monkeypatch, captured, fake_encode, kernel):
    """warm-cache's list is what the quick sweep's gemm() calls build, no more, no less."""
    from deepgemm import jit
    by_the_sweep, cases = _quick_sweep_on_fakes(monkeypatch, kernel)
    built = set()
    monkeypatch.setattr(jit, "compile_kernel", lambda name, path, arch, defines: built.add(
        (name, arch, tuple(sorted(defines.items())))))
    jobs = sweep.compile_jobs(cases, "sm_90a", dev=0)
    for job in jobs:
        job()
    assert len(jobs) == len(built)                                          # each build once
    assert built == by_the_sweep and len(built) >= 24, (sorted(by_the_sweep - built)[:3], sorted(built - by_the_sweep)[:3])


@pytest.mark.parametrize("kernel", registry.names())
def test_each_operands_vector_path_is_decided_apart_from_the_others(monkeypatch, captured, fake_encode, kernel):
    """The launches the quick sweep makes (after every swap and view the API applies) include an
    operand with a 16-byte aligned base and rows off 16 bytes beside the other operand's whole
    rows, for A and for B: a kernel deciding one operand's 16-byte loads by the other's pitch
    (V3's `a_vec` testing ldb, say) reads misaligned vectors there and fails."""
    _quick_sweep_on_fakes(monkeypatch, kernel)
    seen = set()
    for launch in captured:
        p = launch["params"]
        seen.add((int(p["a"]) % 16 == 0, int(p["lda"]) % 8 == 0, int(p["b"]) % 16 == 0, int(p["ldb"]) % 8 == 0))
    assert any(a_base and not a_rows and b_rows for a_base, a_rows, _, b_rows in seen), sorted(seen)
    assert any(b_base and not b_rows and a_rows for _, a_rows, b_base, b_rows in seen), sorted(seen)


# ---- which cases the planted bugs meet first -----------------------------------------------------

def _planted():
    """The planted bugs as tests/gpu/test_broken_kernels.py declares them (that module imports no cupy)."""
    path = Path(__file__).resolve().parent.parent / "gpu" / "test_broken_kernels.py"
    spec = importlib.util.spec_from_file_location("planted_bugs_of_the_gpu_tier", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_planted_bug_has_a_kind_with_first_cases():
    module = _planted()
    assert {kind for _, _, kind in module.PLANTED} == set(sweep.FIRST_TO_FAIL)
    for name, like, kind in module.PLANTED:
        registry.get(like)
        assert name == "v1_missing_barrier" or (module.BROKEN / f"{name}.cu").is_file()
        cases = sweep.quick_cases(like)
        first, rest = sweep.self_test_order(cases, kind)
        assert 1 <= len(first) <= 6, f"{name}: a few cases first, not {len(first)}"
        assert all(c in cases for c in first)
        # The fallback is every other quick case, once each, in sweep order.
        assert rest == [c for c in cases if c not in first]
        assert set(map(str, first)) | set(map(str, rest)) == set(map(str, cases))


def test_first_cases_are_the_ones_each_kind_of_bug_fails():
    bm, bn, bk = sweep.tile_of("v1")
    first, _ = sweep.self_test_order(sweep.quick_cases("v1"), "race")
    assert len(first) == 6 and len(set(map(str, first))) == 2                  # two cases, three times each
    for c in first:
        m, n, k = c.problem.m, c.problem.n, c.problem.k
        assert k / bk >= 32 and math.ceil(m / bm) * math.ceil(n / bn) >= 1000     # many K tiles, many blocks
    first, _ = sweep.self_test_order(sweep.quick_cases("v0"), "accumulation")
    assert first and all(c.oracle == "bound" and c.problem.out_dtype == "float32" and c.problem.k >= 1024
                         for c in first)
    cases = sweep.quick_cases("v0")
    assert sweep.self_test_order(cases, "store")[0] == cases[:1]
    with pytest.raises(ValueError, match="unknown planted-bug kind"):
        sweep.self_test_order(cases, "typo")


def test_the_accumulation_bug_is_tried_first_on_fp32_bound_cases_only():
    """An exact case's integers, or a 16-bit output's rounding, can hide an fp16 accumulator: the
    first cases are the longest-K error-bound cases with an fp32 output, even where others are longer."""
    def case(k, out_dtype, oracle):
        return sweep.Case("v0", sweep.GemmProblem(8, 8, k, "float16", out_dtype, "row", "col"), oracle)
    cases = [case(4096, "float32", "exact"), case(2048, "float16", "bound"), case(1024, "float32", "bound"),
             case(512, "float32", "bound"), case(1024, "float32", "bound")]
    first, rest = sweep.self_test_order(cases, "accumulation")
    assert first == [cases[2], cases[4]] and cases[0] in rest


def test_the_exact_oracle_draws_integers_so_any_summation_order_matches():
    """The integer-exact cases hold a kernel to the FP64 result bit for bit, which is only fair if
    every partial sum is exact: integer inputs within the accumulation budget. A kernel that sums K
    in another order in FP32 must pass them."""
    def reversed_fp32(a, b, *, kernel, out, **epilogue):
        acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
        for kk in reversed(range(a.shape[1])):
            acc += np.outer(a[:, kk].astype(np.float32), b[kk, :].astype(np.float32))
        out[...] = round_to(acc.astype(np.float64), str(out.dtype))   # no epilogue in these cases
    exact = [c for c in sweep.quick_cases("v0") if c.oracle == "exact" and not c.problem.has_epilogue]
    assert exact
    for i, c in enumerate(exact[:4]):
        sweep.run_case(c, np.random.default_rng(i), xp=np, gemm_fn=reversed_fp32)


def one_column_too_many(a, b, *, kernel, out, **epilogue):
    """The planted `col > n` edge guard: every row also writes the element just right of the view."""
    correct_kernel(a, b, kernel=kernel, out=out, **epilogue)
    if out.shape[0]:
        np.lib.stride_tricks.as_strided(out, shape=(out.shape[0], out.shape[1] + 1), strides=out.strides)[:, -1] = 0


def test_the_first_store_case_fails_a_one_past_the_edge_store():
    # The planted edge-guard bug, emulated on the host: the very first case must fail it.
    first, _ = sweep.self_test_order(sweep.quick_cases("v0"), "store")
    with pytest.raises(AssertionError, match="out-of-bounds write"):
        sweep.run_case(first[0], np.random.default_rng(1), xp=np, gemm_fn=one_column_too_many)


def test_sanitizer_sample_reaches_k_zero_and_the_paired_and_staged_residuals():
    from deepgemm.testing.sanitize import sample_cases
    picked = [c.problem for c in sample_cases("v5")]
    assert any(p.k == 0 and p.has_epilogue for p in picked)
    c16 = [p for p in picked if p.epilogue["residual"] == "float16" and p.n % 2 == 0]
    assert any(p.ldc_pad for p in c16) and any(p.c_offset == 4 for p in c16) and any(p.c_offset == 1 for p in c16)


@pytest.mark.parametrize("kernel", registry.names())
def test_the_sanitizer_sample_holds_every_case_of_each_kind_it_promises(kernel):
    """sample_cases' contract, group by group: a spread of the quick tier, then every quick case
    with K = 0, every one with a 16-bit residual at an even N, every whole-chain case with K > 0,
    every quick config at its own tile edges (the exact cases, B column-major), and every padded
    fp16 aligned case. A group lost from the sample is a class of out-of-bounds read memcheck
    stops looking for."""
    from deepgemm.testing.sanitize import sample_cases
    picked = sample_cases(kernel)
    quick = sweep.quick_cases(kernel)
    groups = {
        "spread": quick[::max(1, len(quick) // 8)][:8],
        "k = 0": [c for c in quick if c.problem.k == 0],
        "16-bit residual, even n": [c for c in quick if c.problem.epilogue["residual"] == "float16"
                                    and c.problem.n % 2 == 0],
        "whole chain, k > 0": [c for c in quick if c.problem.epilogue == sweep.EPILOGUE_CASES["all"] and c.problem.k > 0],
        "configs at their edges": [c for c in sweep.config_cases(kernel, sweep.quick_configs(kernel))
                                   if c.oracle == "exact" and c.problem.b_layout == "col"],
        "padded fp16 rows": [c for c in sweep.aligned_cases(kernel)
                             if (c.problem.lda_pad or c.problem.ldb_pad) and c.problem.dtype == "float16"],
    }
    keys = [repr(c) for c in picked]
    for name, group in groups.items():
        assert group, f"{name}: the quick tier has no such case for {kernel}"
        missing = [c for c in group if repr(c) not in keys]
        assert not missing, f"{name}: {len(missing)} of {len(group)} not sampled, e.g. {missing[0]!r}"
    assert len(picked) == sum(len(g) for g in groups.values())      # nothing else


MEMCHECK_LOG = """\
========= COMPUTE-SANITIZER
case Case(kernel='v4', m=5)
case Case(kernel='v4', m=7)
========= Invalid __global__ read of size 16 bytes
=========     at void gemm_kernel<(int)0>(Params)+0x1f20
=========     by thread (96,0,0) in block (0,1,0)
=========     Address 0x7f3a00000ffe is out of bounds
=========     and is 2 bytes after the nearest allocation at 0x7f3a00000000 of size 4094 bytes
========= 
Traceback (most recent call last):
cupy_backends.cuda.api.driver.CUDADriverError: CUDA_ERROR_LAUNCH_FAILED: unspecified launch failure
========= ERROR SUMMARY: 1 error
"""


def test_compute_sanitizer_is_found_on_the_path_then_in_cudas_folders(tmp_path, monkeypatch):
    import shutil
    from deepgemm.testing import sanitize
    on_path = tmp_path / "compute-sanitizer"
    on_path.write_text("")
    present = {str(on_path)}
    monkeypatch.setattr(shutil.os.path, "exists", lambda p: p in present)
    monkeypatch.setattr(shutil, "which", lambda name: str(on_path) if name == "compute-sanitizer" else None)
    assert sanitize.find_compute_sanitizer() == str(on_path)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert sanitize.find_compute_sanitizer() is None                       # nowhere
    present.add("/usr/local/cuda/compute-sanitizer/compute-sanitizer")      # only in CUDA's own folder
    assert sanitize.find_compute_sanitizer() == "/usr/local/cuda/compute-sanitizer/compute-sanitizer"


@pytest.mark.parametrize("module", ["kernel_sample", "grouped_sample"])
def test_each_sanitizer_sample_runs_every_case_then_says_so(module, monkeypatch, capsys):
    """The child under compute-sanitizer prints each case before running it and one last line after
    all of them, which tests/gpu/test_sanitize.py requires: a child that ran nothing would pass the
    tool's "0 errors" too."""
    from deepgemm.testing import grouped as tg
    from deepgemm.testing import sanitize
    ran = []
    monkeypatch.setattr(sanitize, "exact_allocations", lambda: ran.append("exact allocations"))
    if module == "kernel_sample":
        monkeypatch.setattr(sweep, "run_case", lambda case, rng, **kw: ran.append(case))
        main, cases = sanitize.main, sanitize.sample_cases("v4")
    else:
        monkeypatch.setattr(tg, "run_grouped_case", lambda case, rng, **kw: ran.append(case))
        main, cases = tg.main, tg.sample("v4")
    assert cases and main(["v4"]) == 0
    assert ran == ["exact allocations"] + cases
    printed = capsys.readouterr().out.splitlines()
    assert printed == [f"case {c}" for c in cases] + [sanitize.sample_done(len(cases))]
    assert sanitize.sample_done(len(cases)) != sanitize.sample_done(len(cases) - 1)


def test_a_sanitizer_failure_names_its_case_and_first_report():
    from deepgemm.testing.sanitize import first_report
    report = first_report(MEMCHECK_LOG)
    assert report.startswith("first report, case Case(kernel='v4', m=7):")
    assert "Invalid __global__ read of size 16 bytes" in report and "2 bytes after the nearest allocation" in report
    assert "Traceback" not in report and "ERROR SUMMARY" not in report
    race = ("========= COMPUTE-SANITIZER\ncase A\n========= Error: Race reported between Write access at k+0x10\n"
            "=========     and Read access at k+0x40 [4 hazards]\n========= RACECHECK SUMMARY: 1 hazard displayed\n")
    assert first_report(race) == ("first report, case A:\n========= Error: Race reported between Write access at k+0x10\n"
                                  "=========     and Read access at k+0x40 [4 hazards]")
    assert first_report("========= COMPUTE-SANITIZER\ncase A\n========= ERROR SUMMARY: 0 errors\n") == ""
    assert first_report("========= Invalid __shared__ write\n").startswith("first report, before the first case:")


@pytest.mark.parametrize("kernel", registry.names())
def test_quick_cases_take_every_operands_aligned_path_at_once(kernel):
    """Every dtype and layout with A and B both 16-byte aligned, once unpadded past whole tiles
    and once with rows padded to 16 bytes past extents that are not (where a 16-byte load without
    its edge test would read past a row); the padded float16 ones are in the sanitizer sample."""
    from deepgemm.testing.sanitize import sample_cases
    bm, bn, bk = sweep.tile_of(kernel)
    aligned = [c for c in sweep.quick_cases(kernel) if c.problem.a_offset == c.problem.b_offset == 0
               and c.problem.lda % 8 == 0 and c.problem.ldb % 8 == 0 and c.problem.out_dtype == "float32"]
    extents = lambda p: (p.k if p.a_layout == "row" else p.m, p.n if p.b_layout == "row" else p.k)
    padded = [c for c in aligned if all(e % 8 for e in extents(c.problem))]
    whole = [c for c in aligned if not any(e % 8 for e in extents(c.problem))
             and c.problem.m > 2 * bm and c.problem.n > 2 * bn and c.problem.k > 2 * bk]
    combos = {(d, al, bl) for d in registry.INPUT_DTYPES for al, bl in sweep.LAYOUTS}
    for found in (padded, whole):
        assert {(c.problem.dtype, c.problem.a_layout, c.problem.b_layout) for c in found} == combos
        assert all(c.oracle == "exact" and problem_is_exact(c.problem) for c in found)
    assert {c for c in padded if c.problem.dtype == "float16"} <= set(sample_cases(kernel))
    # A 16-bit output V5 can store by TMA (N and the row pitch whole 16 bytes, padding past N and
    # rows past M at a tile edge), per dtype; the other quick cases' outputs are not TMA-storable
    storable = {c.problem.dtype for c in sweep.quick_cases(kernel)
                if c.problem.out_dtype != "float32" and c.problem.n % 8 == 0 and c.problem.ldd_pad % 8 == 0
                and c.problem.ldd_pad and c.problem.m % bm and c.problem.n % bn and c.problem.m > bm}
    assert storable == set(registry.INPUT_DTYPES)
    # ... beside a 16-bit residual whose rows are whole 16 bytes (V5 stages C by TMA) and one whose
    # rows are only pair-aligned (C read from global memory): C's own pitch decides
    residual_pitch = {(c.problem.n + c.problem.ldc_pad) % 8 for c in sweep.quick_cases(kernel)
                      if c.problem.epilogue["residual"] == "float16" and c.problem.ldd_pad % 8 == 0
                      and c.problem.ldd_pad and c.problem.n % 8 == 0 and c.problem.c_offset == 0}
    assert residual_pitch >= {0, 2}, residual_pitch


@pytest.mark.parametrize("kernel", [k for k in registry.names() if registry.get(k).config_space])
def test_each_quick_config_beyond_the_dispatched_ones_brings_a_new_tuning_value(kernel):
    """The quick tier adds a config_space entry only for a (define, value) no config before it has:
    every value of every parameter runs, and the tier does not grow with the config space."""
    from deepgemm import dispatch
    spec = registry.get(kernel)
    chosen = sweep.quick_configs(kernel)
    dispatched = [c for c in sweep.shipped_configs(kernel) + dispatch.rule_configs(kernel)
                  if c != spec.config_defines(None)]
    seen = {(k, v) for c in [spec.config_defines(None)] + dispatched for k, v in c.items()}
    for full in chosen:
        if full in dispatched:
            continue
        assert any(pair not in seen for pair in full.items()), (kernel, full)
        seen |= set(full.items())
    every = {(k, v) for c in spec.config_space for k, v in spec.config_defines(c).items()}
    assert every <= seen


def test_config_cases_put_each_config_at_its_own_tile_edges():
    spec = registry.get("v5")
    cases = sweep.config_cases("v5")
    configs = {c.config for c in cases}
    others = [spec.config_defines(c) for c in spec.config_space if spec.config_defines(c) != spec.config_defines(None)]
    assert configs == {tuple(sorted(c.items())) for c in others}             # every non-default config, once
    for case in cases:
        bm, bn = spec.tile(dict(case.config))
        p = case.problem
        if case.oracle == "exact" and p.m > 2 * bm + 1:
            assert -(-p.m // bm) * -(-p.n // bn) >= 2 * 132 + 1                # two tiles per block on 132 SMs
        elif case.oracle == "exact":
            assert (p.m, p.n) == (2 * bm + 1, 2 * bn - 1) and p.k > 5 * 64     # past two tile rows, 6 k-blocks
        elif p.k == 0:                                                        # no k-block on any of 315 tiles
            assert -(-p.m // bm) * -(-p.n // bn) >= 2 * 132 + 1 and p.has_epilogue and p.b_layout == "row"
        else:
            assert (p.m, p.n) == (bm - 1, bn + 2) and p.has_epilogue and p.n % 2 == 0
    # Every config meets every kind of case (96-wide tiles read B K-major only, and a K = 0 B is
    # read row-major: no row-major B case and no K = 0 case for them).
    kinds = {}
    for case in cases:
        bm, bn = spec.tile(dict(case.config))
        p = case.problem
        kind = ("k0" if p.k == 0 else "chain" if case.oracle == "bound" else
                "many tiles" if p.m > 2 * bm + 1 else "edges")
        kinds.setdefault(case.config, set()).add(kind)
    for config, seen in kinds.items():
        assert seen == {"edges", "many tiles", "chain"} | ({"k0"} if dict(config)["DG_BN"] != 96 else set()), config
    assert not [c for c in cases if dict(c.config)["DG_BN"] == 96 and c.problem.b_layout == "row"]
    assert {dict(c.config)["DG_BM"] for c in cases} == {64, 128, 256}


def test_config_cases_meet_the_vector_loads_edges_where_the_kernel_loads_without_tma():
    """small_m's ring copies and V4's cp.async loaders take 16-byte chunks of B, cut by K at the end
    and impossible for a misaligned B: every config of theirs meets 16-byte rows with K 8 past a
    multiple of 32 (B's pitch apart from A's), aligned and one element off; V5 (TMA) does not."""
    for kernel in ("small_m", "v4"):
        spec = registry.get(kernel)
        cases = sweep.config_cases(kernel)
        for config in {c.config for c in cases}:
            bm, bn = spec.tile(dict(config))
            edges = [c.problem for c in cases if c.config == config and c.oracle == "exact" and c.problem.m == bm - 1]
            assert sorted(p.b_offset for p in edges) == [0, 1], (kernel, config)
            for p in edges:
                assert (p.n, p.k % 8, p.k % 32, p.ldb - p.lda) == (bn + 2, 0, 8, 8)   # 8 elements: 16 bytes
    assert not [c for c in sweep.config_cases("v5") if c.problem.b_offset]


def test_a_case_runs_its_config_and_names_it():
    seen = []

    def kernel(a, b, *, kernel, out, config=None, **epilogue):
        seen.append(config)
        correct_kernel(a, b, kernel=kernel, out=out, **epilogue)

    case = sweep.config_cases("v4")[0]
    assert sweep.run_case(case, np.random.default_rng(0), xp=np, gemm_fn=kernel) < 1.0
    from deepgemm import tuner
    assert seen == [dict(case.config)] and str(case).startswith(tuner.label(registry.get("v4"), dict(case.config)) + ":")
    assert str(case).startswith("v4[")


def test_quick_configs_take_every_tuning_value_once_at_least():
    for kernel in registry.names():
        spec = registry.get(kernel)
        quick = sweep.quick_configs(kernel) + [spec.config_defines(None)]
        values = {(k, v) for c in spec.config_space for k, v in spec.config_defines(c).items()}
        assert values <= {(k, v) for c in quick for k, v in c.items()}, kernel
    assert any(c["DG_PINGPONG"] for c in sweep.quick_configs("v5"))


def test_quick_tier_covers_the_configs_shipped_tables_use():
    import json
    from deepgemm import tables
    used = {(e["kernel"], json.dumps(registry.get(e["kernel"]).config_defines(e["config"]), sort_keys=True))
            for path in tables.SHIPPED_DIR.glob("*.json") for e in json.loads(path.read_text())["entries"].values()}
    for kernel, config in used:
        full = json.loads(config)
        if full != registry.get(kernel).config_defines(None):
            assert any(dict(c.config) == full for c in sweep.config_cases(kernel, sweep.quick_configs(kernel))), \
                (kernel, full)


def test_quick_tier_covers_every_config_a_rule_hands_out():
    """Where no tuned table decides (another GPU, another layout), dispatch's config rules pick:
    each config they can return runs at its own tile edges in the quick tier."""
    from deepgemm import dispatch
    for kernel in registry.names():
        default = registry.get(kernel).config_defines(None)
        cases = sweep.config_cases(kernel, sweep.quick_configs(kernel))
        for full in dispatch.rule_configs(kernel):
            assert full == default or any(dict(c.config) == full for c in cases), (kernel, full)


@pytest.mark.parametrize("kernel", registry.names())
def test_the_edge_shapes_straddle_the_kernels_own_tile_edges(kernel):
    """The quick sweep's edge shapes, by the kernel's own tile and K step: in M and in N one past an
    edge, one short of one, a size of 1 and several whole tiles; in K one past a step, a K below one
    step where a step is longer than 1, and several whole steps."""
    bm, bn, bk = sweep.tile_of(kernel)
    ms, ns, ks = (set(x) for x in zip(*sweep.edge_shapes(kernel)))
    for sizes, tile, dim in ((ms, bm, "M"), (ns, bn, "N")):
        assert any(s > tile and s % tile == 1 for s in sizes), (dim, "one past an edge", sorted(sizes), tile)
        assert any(s % tile == tile - 1 for s in sizes), (dim, "one short of an edge", sorted(sizes), tile)
        assert 1 in sizes and any(s >= 2 * tile and s % tile == 0 for s in sizes), (dim, sorted(sizes), tile)
    assert any(k > bk and k % bk == 1 for k in ks), ("K one past a step", sorted(ks), bk)
    assert bk == 1 or any(k < bk for k in ks), ("K below one step", sorted(ks), bk)
    assert any(k >= 2 * bk and k % bk == 0 for k in ks), ("K over whole steps", sorted(ks), bk)


def test_the_gpu_tier_skips_what_the_gpu_cannot_run_and_runs_the_rest():
    """A Hopper kernel on an A100, a config whose blocks need more shared memory than the GPU gives
    one (V4's 144 KB tiles on an 8.9 GPU, 99 KB), are skipped with the reason; on the H200
    every case runs."""
    from deepgemm.testing.grouped import GroupedCase
    v4 = registry.get("v4")
    smem = {c: v4.dynamic_smem(v4.config_defines(dict(c.config))) for c in sweep.config_cases("v4")}
    big = next(c for c, need in smem.items() if need == 147456)     # 128 x 256 x 64 tiles, 3 stages
    small = next(c for c, need in smem.items() if need <= 99 * 1024)
    v5 = sweep.config_cases("v5")[0]
    assert sweep.not_on_this_gpu(v5, 80) == "v5 needs compute capability 9.0, this GPU has 8.0"
    assert sweep.not_on_this_gpu(big, 89) == ("v4's 128 x 256 tiles in this config need 147456 bytes of shared "
                                              "memory, over the 101376 a block may have on compute capability "
                                              "8.9: smaller tiles or fewer stages")
    assert sweep.not_on_this_gpu(big, 80) is None and sweep.not_on_this_gpu(small, 89) is None
    assert all(sweep.not_on_this_gpu(c, 90) is None for k in registry.names() for c in sweep.config_cases(k))
    assert sweep.not_on_this_gpu(GroupedCase("auto", "sizes", (3, 5), 16, 32), 80) is None
    assert "needs compute capability 9.0" in sweep.not_on_this_gpu(GroupedCase("v5", "sizes", (3, 5), 16, 32), 86)


def test_the_grouped_strategy_draws_every_mode_and_shrinks_to_the_smallest_group_pattern():
    """deepgemm.testing.grouped.grouped_problems (the GPU tier's grouped fuzzer): valid cases of every
    mode, empty groups among them, within its bounds; a failing pattern shrinks to the fewest,
    smallest groups that still fail."""
    from hypothesis import find, given, settings
    from deepgemm.testing.grouped import MODES, grouped_problems
    seen = set()

    @settings(max_examples=300, derandomize=True, database=None, deadline=None)
    @given(case=grouped_problems(max_groups=5, max_rows=40, max_dim=24))
    def drawn(case):
        seen.add(case.mode)
        assert 1 <= len(case.sizes) <= 5 and all(0 <= s <= 40 for s in case.sizes)
        assert 1 <= case.n <= 24 and 1 <= case.k <= 24
        if case.mode == "batch":
            assert len(set(case.sizes)) == 1
        if 0 in case.sizes:
            seen.add("empty group")
    drawn()
    assert seen == set(MODES) | {"empty group"}
    fails = find(grouped_problems(max_rows=300), lambda c: c.mode != "batch" and len(c.sizes) >= 2 and sum(c.sizes) > 150,
                 settings=settings(database=None, derandomize=True, max_examples=2000))
    assert len(fails.sizes) == 2 and sum(fails.sizes) == 151 and 0 in fails.sizes
