"""Mutation testing (`python -m deepgemm mutate`): the operators' rewrites, stable site ids, the
listing of every real kernel, the runner's outcome for each kind of test result (with stand-in test
commands), the equivalents list, and one real compile-only run on V0."""
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from deepgemm import jit, registry
from deepgemm.mutate import cli, mutant_source, operators, report, runner
from deepgemm.mutate.operators import Source, mutants_of, resolve_operators

KERNELS = jit.KERNEL_DIR
# The built-in GPU tier and sanitizer run are the repository's tests/gpu: an installed deepgemm
# (tox tests the wheel) has none beside it, and says so instead of building the command.
needs_repo_tests = pytest.mark.skipif(
    not (runner._package_root() / "tests" / "gpu").is_dir(),
    reason="deepgemm under test is an installed package: the built-in GPU tier needs the repository's tests/gpu")


def _mutate(snippet: str, op: str, path: str = "k.cu") -> list[str]:
    """Every mutated text operator `op` makes of `snippet`."""
    src = Source(path, textwrap.dedent(snippet))
    return [m.apply(src.text) for m in mutants_of(src, [operators.OPERATORS[op]])]


def _one(snippet: str, op: str) -> str:
    out = _mutate(snippet, op)
    assert len(out) == 1, out
    return out[0]


# ---------------------------------------------------------------------------------------------
# Operators on small snippets

def test_boundary_shifts_comparisons_but_not_templates_shifts_or_comments():
    code = "if (row < p.m) x = static_cast<int>(y) >> 2;  // a < b\nauto w = wait<N>();\n"
    assert _one(code, "boundary.lt-to-le") == code.replace("row < p.m", "row <= p.m")
    assert _mutate(code, "boundary.gt-to-ge") == []
    assert _one("if (k0 + BK <= p.k) f();", "boundary.le-to-lt") == "if (k0 + BK < p.k) f();"
    assert _one("#if DG_BIAS >= 0\n#endif\n", "boundary.ge-to-gt") == "#if DG_BIAS > 0\n#endif\n"


def test_nothing_inside_a_string_or_character_literal_is_mutated():
    """String text (an asm template, a printf format, with escaped quotes) and character literals
    are not code: only the comparison after them is mutated."""
    code = 'printf("i < n \\" j < k", \'<\'); asm("setp.lt.s32 p, a, b; // x < y"); if (a < b) f();\n'
    assert _one(code, "boundary.lt-to-le") == code.replace("a < b", "a <= b")
    code = 'printf("\\"", c < d); if (a < b) f("<");\n'          # an escaped quote just before the end
    assert _mutate(code, "boundary.lt-to-le") == [code.replace("c < d", "c <= d"), code.replace("a < b", "a <= b")]


def test_a_mutant_refuses_a_file_that_changed_since_it_was_listed():
    src = Source("k.cu", "if (i < n) f();\n")
    [m] = mutants_of(src, [operators.OPERATORS["boundary.lt-to-le"]])
    assert m.apply(src.text) == "if (i <= n) f();\n"
    with pytest.raises(ValueError, match=r"^k.cu:1:7:boundary.lt-to-le: the file changed since the mutants were listed"):
        m.apply("// a line above\nif (i < n) f();\n")


def test_static_asserts_and_launch_bounds_are_not_mutated():
    code = "static_assert(BM < 256, \"tile\");\n__launch_bounds__(THREADS < 512 ? 1 : 2) void k() { if (i < n) g(); }\n"
    assert _one(code, "boundary.lt-to-le") == code.replace("i < n", "i <= n")


def test_boundary_leaves_unrolled_constant_loops_to_the_loop_operator():
    code = "for (int i = 0; i < TM; ++i) acc[i] = 0;\nfor (int k = 0; k < p.k; ++k) s += 1;\n"
    assert _mutate(code, "boundary.lt-to-le") == [code.replace("k < p.k", "k <= p.k")]
    assert _mutate(code, "loop.bound-minus-one") == [code.replace("i < TM", "i < TM - 1"),
                                                      code.replace("k < p.k", "k < (p.k) - 1")]


def test_loop_tail_operators():
    assert _one("int t = (p.k + BK - 1) / BK;", "loop.ceil-to-floor") == "int t = (p.k) / BK;"
    assert _one("int s = (p.k + 31) / 32;", "loop.ceil-to-floor") == "int s = (p.k) / 32;"
    assert _mutate("int s = (p.k + 30) / 32;", "loop.ceil-to-floor") == []
    assert _one("int t = p.k / BK + (p.k % BK != 0);", "loop.remainder-dropped") == "int t = p.k / BK;"


def test_barrier_fence_and_wait_removals_keep_a_statement():
    code = "if (x) dg::cluster_sync();\n__syncthreads();\n// __syncthreads();\nasm volatile(\"bar.sync 1;\");\n"
    assert _mutate(code, "sync.barrier-removed") == [code.replace("dg::cluster_sync();", "(void)0;"),
                                                      code.replace("\n__syncthreads();", "\n(void)0;")]
    definition = "__device__ __forceinline__ void cluster_sync() { asm volatile(\"x\"); }\n"
    assert _mutate(definition, "sync.barrier-removed") == []
    assert _one("if (more) dg::named_barrier_arrive(4, 256);", "sync.barrier-removed") == "if (more) (void)0;"
    assert _one("dg::fence_async_shared();", "fence.removed") == "(void)0;"
    assert _one("dg::mbar_wait(full(stage), phase);", "wait.mbarrier-removed") == "(void)0;"
    assert _one("dg::cp_async_commit();", "wait.commit-removed") == "(void)0;"


def test_arrivals_one_fewer():
    op = "sync.arrivals-one-fewer"
    assert _one("dg::mbar_init(d_free(u), 128);", op) == "dg::mbar_init(d_free(u), 127);"
    count = "PINGPONG ? 1 : CONSUMERS"
    assert _one(f"dg::mbar_init(empty(s), {count});", op) == \
        f"dg::mbar_init(empty(s), (({count}) > 1 ? ({count}) - 1 : ({count})));"
    assert _mutate("dg::mbar_init(full(s), 1);", op) == []          # no barrier expects 0 arrivals
    assert _mutate("__device__ void mbar_init(unsigned bar, unsigned count) { init(bar, count); }", op) == []


def test_wait_depth_plus_one():
    assert _one("dg::cp_async_wait<STAGES - 2>();", "wait.depth-plus-one") == "dg::cp_async_wait<(STAGES - 2) + 1>();"
    assert _one("dg::wgmma_wait<0>();", "wait.depth-plus-one") == "dg::wgmma_wait<1>();"
    assert _mutate("template <int N> __device__ void bulk_wait_read() {}", "wait.depth-plus-one") == []


def test_index_swaps():
    # A bare lda becomes ldb only where ldb is in scope (the same top-level definition); a member
    # always: GemmParams holds all four.
    code = "long long a_index(int m, int k, long long lda) { return m * lda + k; }\nx = p.lda;\n"
    assert _mutate(code, "index.ld-swap") == [code.replace("p.lda", "p.ldb")]
    both = "void f(long long lda, long long ldb) {\n    x = m * lda + n * ldb;\n}\n"
    assert _mutate(both, "index.ld-swap") == [both.replace("m * lda", "m * ldb"), both.replace("n * ldb", "n * lda")]
    assert _mutate("long long lda, ldb, ldd, ldc;", "index.ld-swap") == []   # fields: renaming breaks the build
    assert _one("dg::store_d(p, row, col, acc);", "index.coordinate-swap") == "dg::store_d(p, col, row, acc);"
    assert _one("x = a[dg::a_index(row, k, p.lda)];", "index.coordinate-swap") == "x = a[dg::a_index(k, row, p.lda)];"
    assert _mutate("__device__ void store_d(const GemmParams& p, int row, int col, float acc) {}",
                   "index.coordinate-swap") == []
    assert _one("int col = blockIdx.x * 32;", "index.grid-axis-swap") == "int col = blockIdx.y * 32;"


def test_layout_negation_skips_declarations():
    assert _one("int m = DG_A_ROW ? e / BK : e % BM;", "layout.negated") == "int m = !DG_A_ROW ? e / BK : e % BM;"
    assert _mutate("template <int X, bool KCONTIG> struct T;", "layout.negated") == []
    assert _one("f<BM, dg::kAKContig>(x);", "layout.negated") == "f<BM, !dg::kAKContig>(x);"
    # In a preprocessor line only an #if/#elif condition is a use; a #define's body, a #pragma or an
    # #error message is not a condition to negate.
    assert _one("#if DG_A_ROW\n#endif\n", "layout.negated") == "#if !DG_A_ROW\n#endif\n"
    assert _one("#elif KCONTIG\n", "layout.negated") == "#elif !KCONTIG\n"
    assert _mutate("#define LOAD_ROWS (DG_A_ROW ? 1 : 2)\n", "layout.negated") == []
    assert _mutate("#error DG_B_ROW needs a K-major A\n", "layout.negated") == []
    # V5's A_TRANS / B_TRANS are 0/1 integers: negated where read as a condition, not where they
    # are template arguments or arithmetic.
    assert _one("if (A_TRANS == 0) f();", "layout.negated") == "if (!A_TRANS == 0) f();"
    assert _one("x = B_TRANS ? 1 : 2;", "layout.negated") == "x = !B_TRANS ? 1 : 2;"
    assert _mutate("dg::Wgmma<BN>::mma<A_TRANS, B_TRANS>(acc, da, db, 1);", "layout.negated") == []
    assert _mutate("int s = A_TRANS * 64;", "layout.negated") == []


def test_precision_rounds_through_fp16():
    assert _one("acc += a * b;", "precision.accumulate-fp16") == "acc = __half2float(__float2half_rn(acc + (a * b)));"
    assert _one("acc[i][j] = fmaf(x, y, acc[i][j]);", "precision.accumulate-fp16") == \
        "acc[i][j] = __half2float(__float2half_rn(fmaf(x, y, acc[i][j])));"
    assert _mutate("src += step;", "precision.accumulate-fp16") == []
    assert _one("dg::store_d(p, r, c, acc[i]);", "precision.epilogue-input-fp16") == \
        "dg::store_d(p, r, c, __half2float(__float2half_rn(acc[i])));"
    definition = "__device__ void store_d(const P& p, int r, int c, float v) {\n    d[r] = v;\n}\nstore_d(p, r, c, y);\n"
    assert _one(definition, "precision.epilogue-input-fp16") == definition.replace(
        "store_d(p, r, c, y);", "store_d(p, r, c, __half2float(__float2half_rn(y)));")   # the call, not the definition


def test_epilogue_reorders_on_the_real_chain():
    text = (KERNELS / "include/deepgemm/common.cuh").read_text()
    src = Source("include/deepgemm/common.cuh", text)
    (bias,) = mutants_of(src, [operators.OPERATORS["epilogue.bias-after-activation"]])
    body = bias.apply(text)
    chain = body[body.index("float chain_columnwise("):]      # the chain itself; load_column reads bias too
    assert chain.index("v = activate(v);") < chain.index("#if DG_BIAS >= 0") and body.count("\n") == text.count("\n")
    (scale,) = mutants_of(src, [operators.OPERATORS["epilogue.scale-before-activation"]])
    body = scale.apply(text)
    chain = body[body.index("float chain_columnwise("):]
    assert chain.index("#if DG_SCALE_MODE == 1") < chain.index("v = activate(v);")
    swaps = [m.apply(text) for m in mutants_of(src, [operators.OPERATORS["epilogue.alpha-beta-swap"]])]
    assert any("v *= p.beta;" in s for s in swaps) and any("v += p.alpha * c;" in s for s in swaps)
    removed = mutants_of(src, [operators.OPERATORS["epilogue.step-removed"]])
    assert {m.original.split()[0] + m.original.split()[1] for m in removed} >= {"v*=", "v+=", "v="}


def test_fragment_swaps():
    code = "unsigned r[4];\nbf[0][2 * np][0] = r[0];\nint t = threadIdx.x + v.x;\n"
    assert _mutate(code, "fragment.register-swap") == [code.replace("bf[0]", "bf[1]"),
                                                        code.replace("[2 * np][0] = ", "[2 * np][1] = "),
                                                        code.replace("= r[0]", "= r[1]")]
    assert _one(code, "fragment.component-swap") == code.replace("v.x", "v.y")
    wgmma = 'asm volatile("{%0, %1}" : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]));\n'
    assert _mutate(wgmma, "fragment.register-swap") == [wgmma.replace('"+f"(d[0])', '"+f"(d[1])', 1)]
    two = 'asm volatile("mma" : "=r"(c[0]), "=r"(c[1]) : "r"(a[0]), "r"(a[1]), "r"(b[2]));\n'   # first of each array
    assert _mutate(two, "fragment.register-swap") == [two.replace('"=r"(c[0])', '"=r"(c[1])'),
                                                      two.replace('"r"(a[0])', '"r"(a[1])'),
                                                      two.replace('"r"(b[2])', '"r"(b[3])')]


def test_alignment_predicates_forced_true():
    code = "const bool in_a = vec_a && bm0 + BM <= p.m, in_b = vec_b && bn0 + BN <= p.n;\nconst bool odd = x & 1;\n"
    assert _mutate(code, "align.forced-true") == [code.replace("vec_a && bm0 + BM <= p.m", "true"),
                                                   code.replace("vec_b && bn0 + BN <= p.n", "true")]
    fn = "__device__ bool aligned16(const void* p) {\n    return (reinterpret_cast<unsigned long long>(p) & 15) == 0;\n}\n"
    assert _one(fn, "align.predicate-true") == "__device__ bool aligned16(const void* p) {\n    return true;\n}\n"


def test_guard_term_dropped():
    code = "if (row < p.m && col < p.n) f();\nint v = (m < p.m && k < p.k) ? a : 0;\n"
    out = _mutate(code, "guard.term-dropped")
    assert "if (col < p.n) f();" in out[0] and "if (row < p.m) f();" in out[1]
    assert "(k < p.k) ? a : 0" in out[2] and "(m < p.m) ? a : 0" in out[3]


def test_performance_operators_are_marked_and_keep_line_numbers():
    text = "#ifndef DG_GROUP_M\n#define DG_GROUP_M 8   // raster\n#endif\n#pragma unroll\nfor (;;) {}\n"
    perf = mutants_of(Source("k.cu", text), [op for op in operators.OPERATORS.values() if op.performance])
    assert {m.operator for m in perf} == {"performance.no-raster", "performance.no-unroll"}
    assert all(m.performance and m.apply(text).count("\n") == text.count("\n") for m in perf)
    raster = next(m for m in perf if m.operator == "performance.no-raster").apply(text)
    assert "#undef DG_GROUP_M\n#define DG_GROUP_M 1\n" in raster



def test_half_grid_leaves_half_the_blocks_all_the_work():
    """A grid-stride loop: the blocks of the first half start where they did and stride half the
    grid; the others start at the bound. V5's walk likewise, its split-K builds untouched."""
    loop = "for (int row = blockIdx.y; row < outer; row += gridDim.y) {\n"
    assert _one(loop, "performance.half-grid") == (
        "for (int row = blockIdx.y < (gridDim.y + 1) / 2 ? (int)blockIdx.y : (outer); row < outer; "
        "row += (gridDim.y + 1) / 2) {\n")
    walk = ("const int t_first = blockIdx.x / (SPLIT * CLUSTER_M), t_step = SPLIT > 1 ? walk.end : "
            "gridDim.x / CLUSTER_M;\n")
    assert _one(walk, "performance.half-grid") == (
        "const int t_first = SPLIT > 1 || blockIdx.x / (SPLIT * CLUSTER_M) < (gridDim.x / CLUSTER_M + 1) / 2 ? "
        "blockIdx.x / (SPLIT * CLUSTER_M) : (1 << 29), t_step = SPLIT > 1 ? walk.end : (gridDim.x / CLUSTER_M + 1) / 2;\n")
    assert _mutate("for (int i = threadIdx.x; i < n; i += blockDim.x) {}\n", "performance.half-grid") == []

def test_unknown_operator_names_the_argument_and_the_choices():
    with pytest.raises(ValueError, match=r"--operators: unknown operator or family 'nope'; families: boundary"):
        resolve_operators("boundary,nope")
    assert {op.family for op in resolve_operators("sync,wait.depth-plus-one")} == {"sync", "wait"}


# ---------------------------------------------------------------------------------------------
# Every real kernel file

REAL_FILES = sorted(str(p.relative_to(KERNELS)) for p in list(KERNELS.glob("*.cu")) + list(KERNELS.glob("include/deepgemm/*.cuh")))


@pytest.mark.parametrize("rel", REAL_FILES)
def test_real_mutants_are_single_line_preserving_edits_with_unique_ids(rel):
    text = (KERNELS / rel).read_text()
    src = Source(rel, text)
    mutants = mutants_of(src)
    assert len({m.site_id for m in mutants}) == len(mutants)
    lines = text.split("\n")
    for m in mutants:
        out = m.apply(text)
        assert out != text and out.count("\n") == text.count("\n"), m.site_id
        assert out[:m.start] == text[:m.start] and out[m.start + len(m.replacement):] == text[m.end:]
        # the id points at the replaced text
        assert lines[m.line - 1][m.col - 1:].startswith(m.original.split("\n")[0]), m.site_id
    # stable: the same ids from a fresh scan, and from a file with a line appended at the end
    assert [m.site_id for m in mutants_of(Source(rel, text))] == [m.site_id for m in mutants]
    appended = {m.site_id for m in mutants_of(Source(rel, text + "// appended\n"))}
    assert {m.site_id for m in mutants} <= appended


# The families each kernel's own file must offer (what its code contains).
EXPECTED_FAMILIES = {
    "v0": {"boundary", "loop", "index", "precision", "guard"},
    "v1": {"boundary", "loop", "sync", "index", "layout", "precision", "guard", "performance"},
    "v2": {"boundary", "loop", "sync", "index", "layout", "precision", "performance"},
    "v3": {"boundary", "loop", "sync", "index", "layout", "precision", "fragment", "align", "performance"},
    "v4": {"boundary", "loop", "sync", "wait", "index", "layout", "precision", "fragment", "align", "guard",
           "performance"},
    "v5": {"boundary", "loop", "sync", "fence", "wait", "index", "layout", "precision", "fragment", "align",
           "guard", "performance"},
    "small_m": {"boundary", "loop", "sync", "index", "layout", "precision", "fragment", "align", "guard",
                "performance"},
}


def _listing(capsys, *argv) -> str:
    assert cli.main(["--list", *argv]) == 0
    return capsys.readouterr().out


def _kernel_row(out: str, kernel: str) -> dict:
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("kernel (own file + headers)")).split()
    fams = header[5:-1]
    row = next(line for line in lines if line.split() and line.split()[0] == kernel).split()
    return dict(zip(fams, map(int, row[1:-1])))


@pytest.mark.parametrize("kernel", sorted(EXPECTED_FAMILIES))
def test_list_enumerates_every_operator_family_each_kernel_has(kernel, capsys):
    own = _listing(capsys, "--kernels", kernel, "--no-headers")
    counts = _kernel_row(own, kernel)
    have = {f[:5] for f, n in counts.items() if n > 0}
    assert {f[:5] for f in EXPECTED_FAMILIES[kernel]} <= have, counts
    lines = [line for line in own.splitlines() if ":" in line.split(" ")[0]]
    spec_file = registry.get(kernel).file
    assert lines and all(line.startswith((spec_file, "stage_copy.cu")) for line in lines)
    # with the headers: more mutants, and the shared epilogue chain's operators appear
    full = _kernel_row(_listing(capsys, "--kernels", kernel), kernel)
    assert sum(full.values()) > sum(counts.values()) and full["epilo"] > 0


def test_list_rejects_unknown_kernels_and_sites(capsys):
    assert cli.main(["--list", "--kernels", "v3,v9"]) == 2
    err = capsys.readouterr().err
    assert "--kernels: unknown kernel 'v9'; choose from v0, v1" in err
    assert cli.main(["--list", "--kernels", "v0", "--sites", "v0_naive.cu:1:1:boundary.lt-to-le"]) == 2
    assert "--sites: no mutant v0_naive.cu:1:1:boundary.lt-to-le" in capsys.readouterr().err
    assert cli.main(["--list", "--operators", "bogus"]) == 2
    assert "--operators: unknown operator or family 'bogus'" in capsys.readouterr().err


def test_targets_attribute_headers_to_the_kernels_that_include_them():
    t = runner.targets(KERNELS, ["v0", "v3", "v5"])
    assert t["v0_naive.cu"] == ("v0",) and t["stage_copy.cu"] == ("v5",)
    assert t["include/deepgemm/common.cuh"] == ("v0", "v3", "v5")
    assert t["include/deepgemm/tile_load.cuh"] == ("v3",) and t["include/deepgemm/hopper.cuh"] == ("v5",)
    assert list(t)[:4] == ["v0_naive.cu", "v3_padded_vec.cu", "v5_wgmma.cu", "stage_copy.cu"]
    assert set(runner.targets(KERNELS, ["v3"], headers=False)) == {"v3_padded_vec.cu"}


def test_sample_is_evenly_spaced_and_bounded():
    assert cli._sample(list(range(10)), 3) == [0, 3, 6]
    assert cli._sample(list(range(4)), 10) == [0, 1, 2, 3] and cli._sample([1, 2], 0) == []


# ---------------------------------------------------------------------------------------------
# Equivalents

def _all_mutants():
    out = []
    for rel in REAL_FILES:
        out += mutants_of(Source(rel, (KERNELS / rel).read_text()))
    return out


def test_every_bundled_equivalent_matches_a_current_mutant():
    entries = report.load_equivalents()
    assert entries, "the reviewed list is empty"
    matched, stale = report.match_equivalents(_all_mutants(), entries)
    assert not stale, [e["site"] for e in stale]
    # Every entry applies to exactly one mutant: at its recorded site, or where an edit above moved
    # that line (then the entry's "site" is out of date; the report says "reviewed as ...").
    assert len(matched) == len(entries)
    assert all(len(e["reason"]) > 20 for e in entries)


def test_the_config_space_still_makes_the_listed_tile_count_equivalents_equivalent():
    """Some listed equivalents hold because every config's tile is a multiple of its thread count
    (V2's load_tile_scalar; V1's tile loops, which the same-code check finds unchanged): a config
    that breaks that turns them into bugs."""
    for name in ("v1", "v2"):
        spec = registry.get(name)
        for config in spec.config_space or [None]:
            d = spec.config_defines(config)
            bm, bn = spec.tile(d)
            bk = int(d["DG_BK"])
            block = spec.block(d)
            threads = block[0] * block[1] * block[2] if isinstance(block, tuple) else block
            assert (bm * bk) % threads == 0 and (bn * bk) % threads == 0, (name, config, threads)
    listed = {e["site"] for e in json.loads((Path(operators.__file__).parent / "equivalents.json").read_text())["equivalents"]}
    assert "include/deepgemm/tile_load.cuh:71:29:guard.term-dropped" in listed


def test_equivalents_follow_a_moved_line_and_go_stale_when_it_changes():
    text = "int a;\nif (k0 + BK <= p.k) f();\n"
    entry = {"site": "k.cu:2:13:boundary.le-to-lt", "snippet": "if (k0 + BK <= p.k) f();", "reason": "why"}
    op = [operators.OPERATORS["boundary.le-to-lt"]]
    here = mutants_of(Source("k.cu", text), op)
    assert report.match_equivalents(here, [entry]) == ({"k.cu:2:13:boundary.le-to-lt": "why"}, [])
    moved = mutants_of(Source("k.cu", "// new line\n" + text), op)
    matched, stale = report.match_equivalents(moved, [entry])
    assert list(matched) == ["k.cu:3:13:boundary.le-to-lt"] and "reviewed as k.cu:2:13" in matched[moved[0].site_id]
    changed = mutants_of(Source("k.cu", text.replace("f();", "g();")), op)
    assert report.match_equivalents(changed, [entry]) == ({}, [entry])
    # a run of other operators on the same file (--operators) judges nothing about this entry
    other = mutants_of(Source("k.cu", "__syncthreads();\n" + text), [operators.OPERATORS["sync.barrier-removed"]])
    assert other and report.match_equivalents(other, [entry]) == ({}, [])


def test_a_sites_run_judges_the_other_entries_against_the_whole_file(tmp_path, capsys):
    """--sites narrows what runs, not what an entry is matched against: the entries beside the
    chosen site (same file, same operator) are neither stale nor run."""
    entries = report.load_equivalents()
    by_key: dict = {}
    for e in entries:
        f, _, _, op = e["site"].split(":")
        by_key.setdefault((f, op), []).append(e["site"])
    owner = {Path(registry.get(k).file).name: k for k in registry.names()}
    f, op = next(k for k, v in by_key.items() if len(v) > 1 and k[0] in owner)
    kernel, site = owner[f], by_key[(f, op)][0]
    code = cli.main(["--kernels", kernel, "--static-only", "--variants", "minimal", "--sites", site,
                     "--out", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    assert "no longer match" not in captured.out + captured.err
    data = json.loads((tmp_path / "out" / "mutants.json").read_text())
    assert [(m["site"], m["outcome"]) for m in data["mutants"]] == [(site, "equivalent")]
    assert data["stale_equivalents"] == []


# ---------------------------------------------------------------------------------------------
# The runner, with stand-in test commands

def _fake_mutant(tmp_path: Path) -> tuple[Path, operators.Mutant]:
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / "k.cu").write_text("if (row < p.m) f();\n")
    (m,) = mutants_of(Source("k.cu", (kernels / "k.cu").read_text()), [operators.OPERATORS["boundary.lt-to-le"]])
    return kernels, m


def _runner(tmp_path, kernels, cmd, timeout=60.0, **kw) -> runner.Runner:
    ws = runner.Workspace(kernels, root=tmp_path / "work")
    settings = runner.Settings(test_cmd=cmd, compile_check=False, timeout=timeout, repo_root=tmp_path,
                               log_dir=tmp_path / "logs", **kw)
    return runner.Runner(ws, settings)


PY = f'"{sys.executable}" -c'


def _touch_cmd(marker: Path) -> str:
    """A test command that only creates `marker`: whether the tests ran at all."""
    return f'{PY} "open(r\'{marker}\', \'w\').close()"'


def test_command_sees_the_mutant_through_the_kernel_dir_and_the_original_is_restored(tmp_path):
    kernels, m = _fake_mutant(tmp_path)
    # exits 1 (killed) when the copy it is pointed at holds the mutated line
    check = ("import os,sys; t=open(os.path.join(os.environ['DEEPGEMM_KERNEL_DIR'],'k.cu')).read(); "
             "print('FAILED tests/t.py::test_k[1] - AssertionError: saw ' + os.environ.get('DEEPGEMM_MUTANT_ID','-')) "
             "if '<=' in t else None; sys.exit(1 if '<=' in t else 0)")
    r = _runner(tmp_path, kernels, f'{PY} "{check}"')
    assert r.evaluate(None, kernels=()).outcome == "survived"
    res = r.evaluate(m)
    assert res.outcome == "killed" and res.killer == "tests/t.py::test_k[1]"
    assert res.detail == f"AssertionError: saw {m.site_id}" and res.seconds > 0 and res.test_seconds > 0
    assert Path(res.log).read_text().startswith("FAILED")
    assert (r.ws.kernels / "k.cu").read_text() == (kernels / "k.cu").read_text() == "if (row < p.m) f();\n"
    # The mutant's own file is named too (deepgemm's kernels: the mutated file in the copy).
    env = r.env(m)
    assert (env["DEEPGEMM_KERNEL_DIR"], env["DEEPGEMM_MUTANT_SOURCE"], env["DEEPGEMM_MUTANT_ID"]) == \
        (str(r.ws.kernels), str(r.ws.kernels / "k.cu"), m.site_id)


def test_a_survivor_of_the_tests_runs_the_sanitizer_command_and_can_die_there(tmp_path):
    """--sanitize: what the tests leave alive runs the sanitizer command too (a guard mutant that
    only reads outside an operand); a mutant the tests kill does not."""
    kernels, m = _fake_mutant(tmp_path)
    marker = tmp_path / "sanitized"
    sanitize = ("import os,sys; open(r'" + str(marker) + "','a').write('x'); "
                "t=open(os.path.join(os.environ['DEEPGEMM_KERNEL_DIR'],'k.cu')).read(); "
                "print('FAILED tests/gpu/test_sanitize.py::test_k[memcheck-v0] - Invalid __global__ read') "
                "if '<=' in t else None; sys.exit(1 if '<=' in t else 0)")
    r = _runner(tmp_path, kernels, f'{PY} "import sys; sys.exit(0)"', sanitize_cmd=f'{PY} "{sanitize}"')
    assert r.evaluate(None, kernels=()).outcome == "survived" and marker.read_text() == "x"
    res = r.evaluate(m)
    assert res.outcome == "killed" and res.killer == "tests/gpu/test_sanitize.py::test_k[memcheck-v0]"
    assert res.detail == "Invalid __global__ read" and "---- compute-sanitizer ----" in Path(res.log).read_text()
    marker.unlink()
    killed_by_tests = _runner(tmp_path, kernels, f'{PY} "import sys; sys.exit(3)"', sanitize_cmd=f'{PY} "{sanitize}"')
    assert killed_by_tests.evaluate(m).outcome == "killed" and not marker.exists()


@needs_repo_tests
def test_builtin_sanitize_command_runs_every_tool_on_the_sanitizer_samples(capsys):
    cmd = runner.builtin_sanitize_command(runner._package_root())
    assert "tests/gpu/test_sanitize.py" in cmd and "--sanitize" in cmd and "-x" in cmd
    assert "-k" not in cmd   # memcheck, racecheck and synccheck: no tool selected away
    assert cli.main(["--sanitize", "--test-cmd", "true", "--kernels", "v0"]) == 2
    assert "--sanitize: runs deepgemm's sanitizer samples after its GPU tier" in capsys.readouterr().err


@pytest.mark.parametrize("script,outcome,killer", [
    ("import sys; sys.exit(0)", "survived", None),
    ("import sys; sys.exit(3)", "killed", "exit status 3"),
    ("import sys; print('=== no tests ran in 0.01s ==='); sys.exit(5)", "error", "no tests ran"),
    ("import sys; print('=== 3 passed in 1.0s ==='); sys.exit(2)", "error", "pytest exit status 2 with no failing test"),
    ("import sys; print('E   deepgemm.jit.CompileError: compiling kernel v0[float16->float16] (arch sm_90a) failed:'); "
     "print('k.cu(1): error: expected a ;'); sys.exit(1)", "did-not-compile", "v0[float16->float16]"),
])
def test_outcome_of_each_kind_of_test_result(tmp_path, script, outcome, killer):
    kernels, m = _fake_mutant(tmp_path)
    res = _runner(tmp_path, kernels, f'{PY} "{script}"').evaluate(m)
    assert (res.outcome, res.killer) == (outcome, killer)
    if outcome == "did-not-compile":
        assert "error: expected a ;" in res.detail


def _with_grandchild(marker: Path) -> str:
    """A test command that starts a grandchild (which would outlive a plain kill of the shell),
    writes its pid to `marker`, then sleeps."""
    script = (f"import subprocess,sys,time; p=subprocess.Popen([sys.executable,'-c','import time; time.sleep(60)']); "
              f"open(r'{marker}','w').write(str(p.pid)); time.sleep(60)")
    return f'{PY} "{script}"'


def _assert_gone(marker: Path, when: str) -> None:
    import time
    pid = int(marker.read_text())
    for _ in range(50):   # reaped by init shortly after the group is killed
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    pytest.fail(f"the grandchild survived {when}")


def test_a_hang_is_killed_with_its_children_at_the_time_limit(tmp_path):
    kernels, m = _fake_mutant(tmp_path)
    marker = tmp_path / "child.pid"
    res = _runner(tmp_path, kernels, _with_grandchild(marker), timeout=2.0).evaluate(m)
    assert res.outcome == "timeout" and res.killer == "timeout after 2 s" and res.seconds < 30
    _assert_gone(marker, "the time limit")


def test_an_interrupt_kills_the_test_command_with_its_children_and_goes_on_up(tmp_path, monkeypatch):
    """Ctrl-C reaches the campaign's process only (the tests run in a session of their own): the
    running command's whole group is killed, and the interrupt still ends the campaign."""
    import time
    import types
    marker = tmp_path / "child.pid"

    def monotonic():   # the interrupt arrives once the command's child is running
        if marker.exists() and marker.read_text():
            raise KeyboardInterrupt
        return time.monotonic()
    monkeypatch.setattr(runner, "time", types.SimpleNamespace(monotonic=monotonic))
    with pytest.raises(KeyboardInterrupt):
        runner.run_process(_with_grandchild(marker), dict(os.environ), tmp_path, timeout=30.0)
    _assert_gone(marker, "the interrupt")


def test_a_command_that_exits_before_reading_its_input_is_reported_not_raised(tmp_path):
    """More input than a pipe holds, to a process that never reads it: the write meets a closed pipe
    every time (a compile step that crashes at start does so only sometimes, under load)."""
    done = runner.run_process([sys.executable, "-c", "print('gone'); raise SystemExit(3)"], dict(os.environ),
                              tmp_path, timeout=30.0, stdin="x" * (1 << 20))
    assert done.returncode == 3 and done.output == "gone\n"


def test_silence_is_a_hang_killed_before_the_time_limit(tmp_path):
    kernels, m = _fake_mutant(tmp_path)
    script = "import sys,time; print('.', flush=True); time.sleep(60)"
    res = _runner(tmp_path, kernels, f'{PY} "{script}"', timeout=50.0, stall_timeout=1.0).evaluate(m)
    assert res.outcome == "timeout" and res.killer == "no output for 1 s (a hang)" and res.test_seconds < 20


def test_junit_report_names_the_first_failing_test(tmp_path):
    (tmp_path / "tests" / "gpu").mkdir(parents=True)
    (tmp_path / "tests" / "gpu" / "test_sweep.py").write_text("")
    junit = tmp_path / "j.xml"
    junit.write_text('<testsuites><testsuite><testcase classname="tests.gpu.test_sweep" name="test_sweep[v3-1-bound]"/>'
                     '<testcase classname="tests.gpu.test_sweep" name="test_sweep[v3-7-exact]">'
                     '<failure message="AssertionError: [v3:exact] 12 elements differ&#10;more">tb</failure></testcase>'
                     '<testcase classname="tests.gpu.test_sweep" name="test_sweep[v3-9-bound]"><failure message="x"/>'
                     '</testcase></testsuite></testsuites>')
    done = runner.Completed(1, "", 3.0)
    assert runner.classify(done, junit, tmp_path, 10) == (
        "killed", "tests/gpu/test_sweep.py::test_sweep[v3-7-exact]", "AssertionError: [v3:exact] 12 elements differ")
    assert runner.junit_slowest(junit) == 0.0 and runner.junit_slowest(tmp_path / "missing.xml") is None


@needs_repo_tests
def test_builtin_tier_runs_the_sweep_first_without_the_framework_self_tests():
    cmd = runner.builtin_tier_command(runner._package_root(), xdist=4)
    files = [c for c in cmd if c.startswith("tests/gpu/")]
    assert files[:2] == ["tests/gpu/test_sweep.py", "tests/gpu/test_fuzz.py"]
    assert not any(f.endswith(runner.FRAMEWORK_SELF_TESTS) for f in files)
    assert cmd[-2:] == ["-n", "4"] and "-x" in cmd


@needs_repo_tests
def test_builtin_tier_runs_under_pytest_with_the_kernels_and_a_junit_report(tmp_path):
    """The GPU tier's command as the runner builds it, narrowed to one sweep case: here it is
    skipped (no GPU) and passes, on a GPU it runs that one case; either way JUnit is read back."""
    cmd = runner.builtin_tier_command(runner._package_root()) + ["-k", "v0-0-bound"]
    ws = runner.Workspace(KERNELS, root=tmp_path / "work")
    settings = runner.Settings(test_cmd=cmd, builtin_tier=True, compile_check=False, timeout=600)
    r = runner.Runner(ws, settings)
    assert r.test_command(("v0", "v1"), tmp_path / "j.xml")[-2:] == ["--kernels=v0,v1", f"--junitxml={tmp_path / 'j.xml'}"]
    res = r.evaluate(None, kernels=("v0",))
    assert res.outcome == "survived", res.detail
    assert res.slowest_test is not None and res.test_seconds > 0


@needs_repo_tests
def test_host_tier_selects_each_kernels_host_runs_and_nothing_else(tmp_path):
    """--host's command as the runner narrows it to the mutated kernels collects each one's quick
    sweep on the host, the grouped sweep where the kernel has a grouped build, and for V4 its
    f16-accumulator build (the report's kernel from V4's file): no other kernel's runs and none of
    the planted-bug self-tests."""
    root = runner._package_root()
    r = runner.Runner(runner.Workspace(KERNELS, root=tmp_path / "work"),
                      runner.Settings(test_cmd=runner.builtin_host_command(root), host_tier=True))

    def collected(kernels):
        done = subprocess.run(r.test_command(kernels, None) + ["--collect-only"], cwd=root, capture_output=True,
                              text=True, env=runner._python_env(dict(os.environ)))
        return {line.split("::")[1] for line in done.stdout.splitlines() if "::" in line}
    quick, grouped = "test_the_quick_sweep_passes_on_the_host", "test_the_grouped_build_passes_the_grouped_sweep_on_the_host"
    f16 = "test_the_f16_accumulator_build_matches_the_report_s_emulation_bit_for_bit"
    f16_runs = {t for t in collected(("v4",)) if t.startswith(f16 + "[")}
    assert len(f16_runs) >= 2
    assert collected(("v4",)) == {f"{quick}[v4]", f"{grouped}[v4]"} | f16_runs
    assert collected(("v5",)) == {f"{quick}[v5]", f"{grouped}[v5]"}
    every = collected(tuple(registry.names()))
    assert every == {f"{quick}[{k}]" for k in registry.names()} | {f"{grouped}[v4]", f"{grouped}[v5]"} | f16_runs


@needs_repo_tests
def test_host_run_on_v0_kills_a_dropped_row_guard_without_a_gpu(tmp_path, capsys):
    """mutate --host judges a mutant by the CPU tier's host run of its kernel: V0 with its row guard
    shifted past M writes a row past the output's end, which the host run catches."""
    out = tmp_path / "out"
    code = cli.main(["--host", "--kernels", "v0", "--no-headers", "--variants", "minimal", "--arch", "sm_80",
                     "--sites", "v0_naive.cu:16:13:boundary.ge-to-gt", "--private-cache", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    data = json.loads((out / "mutants.json").read_text())
    assert data["mode"] == "host" and data["baseline"]["outcome"] == "survived"
    [m] = data["mutants"]
    assert m["outcome"] == "killed", m
    assert m["killer"] == "tests/cpu/test_host_kernels.py::test_the_quick_sweep_passes_on_the_host[v0]"


def _code_lines_marked(text: str, lines_of) -> list[str]:
    """The code lines (not directives) of `text` that lines_of(text) marks, sorted."""
    numbered = dict(enumerate(text.splitlines(), start=1))
    return sorted(numbered[i] for i in lines_of(text) if not numbered[i].startswith("#"))


def test_device_only_lines_are_the_branches_a_device_compilation_takes():
    text = textwrap.dedent("""\
        a();
        #ifdef __CUDA_ARCH__
        dev();
        #if DG_X
        dev_x();
        #else
        dev_not_x();
        #endif
        #else
        host();
        #endif
        #ifndef __CUDA_ARCH__   // the host's first
        host2();
        #elif 0
        never();
        #else
        dev2();
        #endif
        #if defined(__CUDA_ARCH__) && DG_Y
        both();
        #endif
        #if defined(__CUDA_ARCH__)
        dev3();
        #endif
        #if DG_Z
        #ifdef __CUDA_ARCH__
        dev4();
        #endif
        z();
        #endif
        """)
    device = _code_lines_marked(text, operators.device_only_lines)
    assert device == sorted(["dev();", "dev_x();", "dev_not_x();", "never();", "dev2();", "dev3();", "dev4();"])
    # A compound condition is not device-only as a whole (it may be written for the host too): left to the runs.
    assert "both();" not in device


def test_host_mode_leaves_device_only_mutants_for_a_gpu():
    """hopper.cuh's inline PTX sits in #ifdef __CUDA_ARCH__ branches whose #else the host build
    compiles: mutants there would survive the host runs unseen, so --host leaves them out."""
    hopper = "include/deepgemm/hopper.cuh"
    found = mutants_of(Source(hopper, (KERNELS / hopper).read_text()), resolve_operators("fragment,loop"))
    kept, device_only = cli._host_judgeable(KERNELS, found)
    assert "include/deepgemm/hopper.cuh:344:62:fragment.component-swap" in device_only   # ld.shared.v2's outputs
    assert kept and all(m.site_id not in device_only for m in kept)
    assert len(kept) + len(device_only) == len(found)
    host_side = KERNELS / hopper
    for site in device_only:
        line = host_side.read_text().splitlines()[int(site.split(":")[1]) - 1]
        assert "dg_host_" not in line


def test_host_refuses_what_it_cannot_combine_with(capsys):
    for extra in (["--test-cmd", "true"], ["--static-only"], ["--gate"], ["--sanitize"]):
        assert cli.main(["--host", "--kernels", "v0", *extra]) == 2
        assert "--host: runs deepgemm's host tier" in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["--source", "{src}"], "--source: give --test-cmd (the command that tests your kernel), or --static-only"),
    (["--source", "{missing}", "--test-cmd", "true"], "--source: no such file"),
    (["--kernels", "v0", "--define", "DG_X=1", "--list"], "--define: only with --source"),
    (["--source", "{src}", "--test-cmd", "true", "--define", "DG_X"], "--define: expected NAME=VALUE, got 'DG_X'"),
])
def test_a_user_kernel_run_refuses_arguments_that_cannot_judge_it(argv, message, tmp_path, capsys, monkeypatch):
    """With a GPU present (stood in for), a --source run still needs the command that tests the
    kernel; a missing file and defines for deepgemm's own kernels are named, before anything runs."""
    monkeypatch.setattr(cli, "_gpu_arch", lambda: ("sm_90a", "a stand-in GPU"))
    src = tmp_path / "mine.cu"
    src.write_text(JOBS_SOURCE)
    argv = [a.format(src=src, missing=tmp_path / "absent.cu") for a in argv]
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("build,needs", [
    (runner.builtin_tier_command, "the built-in GPU tier needs the repository's tests/gpu"),
    (runner.builtin_sanitize_command, "--sanitize needs the repository's tests/gpu/test_sanitize.py"),
    (runner.builtin_host_command, "--host needs the repository's tests/cpu/test_host_kernels.py"),
    (runner.builtin_bench_command, "--gate needs the repository's tests/bench"),
])
def test_the_builtin_commands_name_the_tests_an_installed_package_lacks(build, needs, tmp_path):
    """deepgemm installed from a wheel has no tests beside it: each built-in test command says which
    of the repository's files it needs, instead of running pytest on nothing."""
    with pytest.raises(FileNotFoundError, match=re.escape(needs) + ".*not found under " + re.escape(str(tmp_path))):
        build(tmp_path)


def test_a_kernel_built_from_outside_the_kernel_folder_is_sent_to_source(tmp_path):
    """A kernel a user registered from their own file is not deepgemm's to mutate through
    --kernels: the error names the file and the --source run that mutates it."""
    import dataclasses
    mine = tmp_path / "mine.cu"
    mine.write_text(JOBS_SOURCE)
    registry.register(dataclasses.replace(registry.get("v0"), name="mine_outside", file=str(mine), public=False))
    try:
        with pytest.raises(ValueError, match=f"--kernels: 'mine_outside' is built from {re.escape(str(mine))}, "
                                             f"outside the kernel folder; mutate it with --source"):
            runner.targets(KERNELS, ["mine_outside"])
    finally:
        registry.unregister("mine_outside")


def test_without_a_gpu_a_run_says_it_only_compiles_and_why(capsys, monkeypatch):
    monkeypatch.setattr(cli, "_gpu_arch", lambda: (None, "no CUDA device"))
    assert cli.main(["--kernels", "v0", "--max", "0"]) == 0
    assert "No GPU here (no CUDA device): compiling and static-checking the mutants only" in capsys.readouterr().err
    assert cli.main(["--kernels", "v0", "--max", "0", "--static-only"]) == 0   # asked for: nothing to explain
    assert "No GPU here" not in capsys.readouterr().err


def test_a_seeded_cache_is_linked_in_and_never_pruned(tmp_path):
    """The JIT's own cache may be in use by other processes: the run links its entries into the
    work folder and prunes there only."""
    shared = tmp_path / "jit-cache"
    shared.mkdir()
    (shared / "old.json").write_text(json.dumps({"name": "v3[float16->float16]"}))
    (shared / "old.cubin").write_bytes(b"\x7fELF")
    ws = runner.Workspace(KERNELS, root=tmp_path / "work", seed_cache=shared)
    assert ws.cache != shared and ws.cache_entries() == {"old.json", "old.cubin"}
    before = ws.cache_entries()
    (shared / "other-process.json").write_text(json.dumps({"name": "v3[float16->float16]"}))   # made meanwhile
    (ws.cache / "mutant.json").write_text(json.dumps({"name": "v3[float16->float16]"}))
    (ws.cache / "mutant.cubin").write_bytes(b"\x7fELF")
    ws.prune(before, set())
    assert ws.cache_entries() == {"old.json", "old.cubin"}
    assert sorted(p.name for p in shared.iterdir()) == ["old.cubin", "old.json", "other-process.json"]
    ws.close()
    assert (shared / "old.cubin").read_bytes() == b"\x7fELF"


def test_function_spans_find_functions_and_methods_not_control_flow():
    text = ("__device__ int f(int a) { if (a) { return g(a); } return 0; }\n"
            "struct S { __device__ bool next(const P& p) const { for (;;) {} } S(int x) : v(x) { h(); } };\n"
            "auto l = [&](int h) { return h; };\n")
    names = [name for name, start, end in runner.function_spans(text)]
    assert names == ["f", "next"]
    (f_start, f_end), = [(s, e) for n, s, e in runner.function_spans(text) if n == "f"]
    assert text[f_start] == "{" and text[f_end] == "}" and "return g(a);" in text[f_start:f_end]


def _header_mutants(kernel_dir, kernels):
    files = runner.targets(kernel_dir, kernels)
    out = []
    for rel, users in files.items():
        out += mutants_of(Source(rel, (kernel_dir / rel).read_text()), kernels=users)
    return out


def test_header_mutants_go_to_the_kernels_that_reach_their_function(tmp_path):
    """load_a is called by V1 alone: its mutants run V1's tier, not V0's or V4's; a mutant outside
    any function keeps every kernel; a function reached only through a macro still counts."""
    kernels = tmp_path / "kernels"
    shutil.copytree(KERNELS, kernels)
    common = kernels / "include" / "deepgemm" / "common.cuh"
    common.write_text(common.read_text().replace(
        "namespace dg {\n",
        "namespace dg {\n__device__ __forceinline__ int only_via_macro(int x) { return x < 3 ? x : 3; }\n"
        "#define DG_ONLY_VIA_MACRO(x) dg::only_via_macro(x)\n", 1))
    v0 = kernels / "v0_naive.cu"
    v0.write_text(v0.read_text().replace("float acc = 0.0f;", "float acc = 0.0f * DG_ONLY_VIA_MACRO(1);"))
    mutants = _header_mutants(kernels, ["v0", "v1", "v4"])
    kept, unreached = runner.attribute_to_callers(kernels, mutants)
    assert len(kept) + len(unreached) == len(mutants)
    by_snippet = lambda ms, text: {m.kernels for m in ms if text in m.snippet and m.file.endswith("common.cuh")}
    assert by_snippet(kept, "return (m < p.m && k < p.k)") == {("v1",)}                  # load_a
    assert by_snippet(kept, "return x < 3 ? x : 3;") == {("v0",)}                        # through the macro
    assert {m.kernels for m in kept if m.file == "v0_naive.cu"} == {("v0",)}             # own file: as it was
    outside = [m for m in kept if m.file.endswith("common.cuh") and m.line < 60]        # the #if/#define preamble
    assert all(m.kernels == ("v0", "v1", "v4") for m in outside)
    only_v0, dropped = runner.attribute_to_callers(kernels, _header_mutants(kernels, ["v0"]))
    assert any("return (m < p.m && k < p.k)" in m.snippet for m in dropped)            # V0 never calls load_a
    assert not any("return (m < p.m && k < p.k)" in m.snippet for m in only_v0)


def test_the_listing_leaves_out_header_mutants_the_selected_kernels_never_reach(capsys):
    """The command line narrows shared headers' mutants as attribute_to_callers does, and says how
    many it left out: V0 lists common.cuh's epilogue but not load_a, which only V1 calls."""
    kernels = jit.KERNEL_DIR
    kept, unreached = runner.attribute_to_callers(kernels, _header_mutants(kernels, ["v0"]))
    assert unreached
    assert cli.main(["--list", "--kernels", "v0"]) == 0
    out, err = capsys.readouterr()
    listed = {line.split()[0] for line in out.splitlines() if line.startswith("include/") and ":" in line.split()[0]}
    assert listed == {m.site_id for m in kept if m.file.startswith("include/")}
    assert not listed & {m.site_id for m in unreached}
    assert f"{len(unreached)} mutants of shared headers lie in functions the selected kernels never call" in err


def test_a_shared_constant_s_mutants_go_to_the_kernels_that_name_it(tmp_path):
    """A namespace-level constexpr counts as a function: common.cuh's HAS_EPILOGUE is read by V5
    alone, so its mutants (a float16 bias's `DG_BIAS >= 0` made `> 0`) judge V5, and for V4 they are
    code V4 never runs; a constant named through another constant still counts."""
    kernels = tmp_path / "kernels"
    shutil.copytree(KERNELS, kernels)
    common = kernels / "include" / "deepgemm" / "common.cuh"
    common.write_text(common.read_text().replace(
        "namespace dg {\n", "namespace dg {\nconstexpr int INNER_C = DG_BIAS >= 0 ? 2 : 1;\n"
        "constexpr int OUTER_C = INNER_C + 1;\n", 1))
    v0 = kernels / "v0_naive.cu"
    v0.write_text(v0.read_text().replace("float acc = 0.0f;", "float acc = 0.0f * dg::OUTER_C;"))
    text = Source("include/deepgemm/common.cuh", common.read_text()).nocomment
    assert [name for name, _, _ in runner.constant_spans(text)] == ["INNER_C", "OUTER_C", "HAS_EPILOGUE"]
    kept, unreached = runner.attribute_to_callers(kernels, _header_mutants(kernels, ["v0", "v4", "v5"]))
    in_line = lambda ms, text: {m.kernels for m in ms if m.file.endswith("common.cuh") and text in m.snippet}
    assert in_line(kept, "constexpr bool HAS_EPILOGUE") == {("v5",)}
    assert in_line(kept, "constexpr int INNER_C") == {("v0",)}                            # through OUTER_C
    v4_only, dropped = runner.attribute_to_callers(kernels, _header_mutants(kernels, ["v4"]))
    assert in_line(dropped, "constexpr bool HAS_EPILOGUE") and not in_line(v4_only, "constexpr bool HAS_EPILOGUE")


def test_cache_pruning_keeps_only_unaffected_kernels(tmp_path):
    ws = runner.Workspace(KERNELS, root=tmp_path / "work")
    before = ws.cache_entries()
    for key, name in (("a", "v3[float16->float16]"), ("b", "v0[float16->float16]"), ("c", "stage_copy")):
        (ws.cache / f"{key}.json").write_text(json.dumps({"name": name}))
        (ws.cache / f"{key}.cubin").write_bytes(b"\x7fELF")
    users = runner.kernel_users(KERNELS)
    assert "v3_padded_vec.cu" in users["v3"] and "include/deepgemm/common.cuh" in users["v0"]
    ws.prune(before, {k for k, files in users.items() if "v3_padded_vec.cu" not in files})
    assert sorted(ws.cache_entries()) == ["b.cubin", "b.json", "c.cubin", "c.json"]
    ws.close()
    assert not ws.root.exists()


def test_mutant_source_points_at_the_mutant_only_for_its_own_file(tmp_path, monkeypatch):
    mine, other = tmp_path / "mine.cu", tmp_path / "other.cu"
    assert mutant_source(mine) == mine
    monkeypatch.setenv("DEEPGEMM_MUTANT_ORIGINAL", str(mine))
    monkeypatch.setenv("DEEPGEMM_MUTANT_SOURCE", str(tmp_path / "work" / "mine.cu"))
    assert mutant_source(mine) == tmp_path / "work" / "mine.cu" and mutant_source(other) == other


def test_user_source_with_a_test_command(tmp_path, capsys):
    """--source: the user's folder is copied, the command gets the mutant's path, the report is written."""
    src = tmp_path / "mine" / "mine.cu"
    src.parent.mkdir()
    src.write_text("__global__ void k(int n, float* d) {\n    if (threadIdx.x < n) d[threadIdx.x] = 1.0f;\n}\n")
    check = ("import os,sys; from deepgemm.mutate import mutant_source; "
             "t=open(mutant_source(os.environ.get('DEEPGEMM_MUTANT_ORIGINAL', 'x'))).read(); sys.exit(1 if '<=' in t else 0)")
    out = tmp_path / "out"
    code = cli.main(["--source", str(src), "--test-cmd", f'{PY} "{check}"', "--out", str(out), "--operators", "boundary,guard"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    data = json.loads((out / "mutants.json").read_text())
    outcomes = {m["site"]: m["outcome"] for m in data["mutants"]}
    assert outcomes == {"mine.cu:2:21:boundary.lt-to-le": "killed"}
    assert data["complete"] is True and data["summary"]["score"] == 1.0 and data["mode"] == "command"
    assert "Mutation score 100.0 %" in printed and (out / "mutants.md").read_text().startswith("# Mutation testing report")
    assert src.read_text().count("<=") == 0   # the user's file is never touched


# --jobs: several mutants at once, each in its own copy of the sources

JOBS_SOURCE = ("__global__ void k(int n, int m, float* d) {\n"
               "    if (threadIdx.x < n && threadIdx.y < m) d[threadIdx.x] = 1.0f;\n"
               "    if (blockIdx.x >= n) return;\n"
               "    for (int i = 0; i < n; ++i) d[i] += 1.0f;\n"
               "}\n")

# The stand-in tests: a mutant with `<=` is killed, the others survive. Each run logs what it saw
# (its mutant, the copy it was pointed at, that copy's text when it started and when it ended) and
# its start and end times; killed mutants take longer, so the jobs finish out of site order.
JOBS_CHECK = """\
import json, os, sys, time
mutant = os.environ.get("DEEPGEMM_MUTANT_ID")
if mutant is None:
    sys.exit(0)   # the baseline
path = os.environ["DEEPGEMM_MUTANT_SOURCE"]
start, first = time.time(), open(path).read()
time.sleep(float(sys.argv[2]) * (2 if "<=" in first else 1))
last = open(path).read()
with open(sys.argv[1], "a") as log:
    log.write(json.dumps({"mutant": mutant, "dir": os.path.dirname(path), "first": first, "last": last,
                          "start": start, "end": time.time()}) + "\\n")
sys.exit(1 if "<=" in first else 0)
"""


def _run_jobs(tmp_path, name: str, jobs: int, seconds: float, *extra) -> tuple[int, dict, list[dict]]:
    """A --source run of JOBS_SOURCE's boundary and guard mutants: (exit status, mutants.json, the runs' log)."""
    src = tmp_path / "mine" / "mine.cu"
    if not src.exists():
        src.parent.mkdir()
        src.write_text(JOBS_SOURCE)
        (tmp_path / "check.py").write_text(JOBS_CHECK)
    log, out = tmp_path / f"{name}.jsonl", tmp_path / name
    cmd = f'"{sys.executable}" "{tmp_path / "check.py"}" "{log}" {seconds}'
    code = cli.main(["--source", str(src), "--test-cmd", cmd, "--operators", "boundary,guard", "--out", str(out),
                     "--jobs", str(jobs), *extra])
    runs = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return code, json.loads((out / "mutants.json").read_text()), runs


def test_a_baseline_that_fails_stops_the_run_and_says_how(tmp_path, capsys):
    """The tests must pass on the unmutated sources first: otherwise every mutant would count as
    killed. The run stops, exit 2, naming the baseline's outcome and what failed."""
    src = tmp_path / "mine.cu"
    src.write_text(JOBS_SOURCE)
    script = tmp_path / "fails.py"
    script.write_text("import sys; print('the unmutated kernel is wrong'); sys.exit(1)\n")
    code = cli.main(["--source", str(src), "--test-cmd", f'"{sys.executable}" "{script}"', "--operators", "boundary"])
    out, err = capsys.readouterr()
    assert code == 2
    assert "error: the unmutated sources do not pass; fix that first" in err
    line = next(x for x in out.splitlines() if x.startswith("baseline (unmutated): "))
    assert "killed" in line and "(" in line.split(" s ", 1)[1], line   # the outcome and its killer/detail


def test_jobs_judge_each_mutant_as_one_job_does(tmp_path, capsys):
    code, one, _ = _run_jobs(tmp_path, "one", 1, 0.05)
    printed = capsys.readouterr().out
    assert code == 0, printed
    code, three, runs = _run_jobs(tmp_path, "three", 3, 0.05)
    printed = capsys.readouterr().out
    assert code == 0, printed
    outcomes = [(m["site"], m["outcome"]) for m in one["mutants"]]
    assert [(m["site"], m["outcome"]) for m in three["mutants"]] == outcomes   # site order, whatever finished first
    assert {o for _, o in outcomes} == {"killed", "survived"} and len(outcomes) == 6 == len(runs)
    assert (one["jobs"], three["jobs"], three["complete"]) == (1, 3, True)
    assert sorted(line.split("]")[0] for line in printed.splitlines() if line.startswith("[")) == \
        [f"[{i}/6" for i in range(1, 7)]   # the counter counts completions


def test_jobs_run_side_by_side_each_in_its_own_copy(tmp_path, capsys):
    code, data, runs = _run_jobs(tmp_path, "two", 2, 0.5)
    assert code == 0, capsys.readouterr().out
    assert len(runs) == 6
    expected = {m.site_id: m.apply(JOBS_SOURCE)
                for m in mutants_of(Source("mine.cu", JOBS_SOURCE), resolve_operators("boundary,guard"))}
    for run in runs:   # a copy shared with another job would show that job's mutant
        assert run["first"] == run["last"] == expected[run["mutant"]], run["mutant"]
    overlapping = [(a, b) for i, a in enumerate(runs) for b in runs[i + 1:]
                   if a["start"] < b["end"] and b["start"] < a["end"]]
    assert overlapping, "no two mutants were judged at the same time"
    assert all(a["dir"] != b["dir"] for a, b in overlapping)
    assert len({run["dir"] for run in runs}) == 2


def test_a_user_kernel_is_copied_with_its_local_includes_and_nothing_else(tmp_path, capsys, monkeypatch):
    """The work folder holds the kernel and the headers it includes from its folder, for every job.
    The folder may hold anything else, the temporary folder itself included (copying it whole once
    copied the work folder into itself until the disk was full)."""
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))   # the work folder inside the kernel's folder
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "tile.cuh").write_text('#pragma once\n#include "../consts.cuh"\n')
    (tmp_path / "consts.cuh").write_text("#pragma once\nconstexpr int N = 4;\n")
    (tmp_path / "unused.cuh").write_text("#error not included\n")
    (tmp_path / "data.bin").write_bytes(bytes(4096))
    src = tmp_path / "mine.cu"
    src.write_text('#include "sub/tile.cuh"\n#include <cuda_fp16.h>\n' + JOBS_SOURCE)
    check = tmp_path / "check.py"
    check.write_text("import os, pathlib, sys\n"
                     "folder = pathlib.Path(os.environ['DEEPGEMM_MUTANT_SOURCE']).parent\n"
                     "print(sorted(p.relative_to(folder).as_posix() for p in folder.rglob('*') if p.is_file()))\n")
    code = cli.main(["--source", str(src), "--test-cmd", f'"{sys.executable}" "{check}"', "--operators", "guard",
                     "--jobs", "2", "--keep-work", "--out", str(tmp_path / "out")])
    assert code == 0, capsys.readouterr().out
    work = Path(json.loads((tmp_path / "out" / "mutants.json").read_text())["work_dir"])
    for copy in (work / "src", work / "job-2" / "src"):
        assert sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*") if p.is_file()) == \
            ["consts.cuh", "mine.cu", "sub/tile.cuh"]
    assert runner.source_files(src) == ["mine.cu", "sub/tile.cuh", "consts.cuh"]


def test_a_symlinked_header_is_the_kernels_own_include(tmp_path, monkeypatch):
    """A header linked in from elsewhere is named by its place in the kernel's folder, and copied
    (resolving it first would put it outside the folder and leave the copy unable to compile)."""
    if not hasattr(os, "symlink"):
        pytest.skip("this platform has no symlinks")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "shared.cuh").write_text("#pragma once\nconstexpr int K = 8;\n")
    kernel = tmp_path / "kernel"
    kernel.mkdir()
    (kernel / "shared.cuh").symlink_to(tmp_path / "elsewhere" / "shared.cuh")
    src = kernel / "mine.cu"
    src.write_text('#include "shared.cuh"\n' + JOBS_SOURCE)
    assert runner.source_files(src) == ["mine.cu", "shared.cuh"]
    # a relative kernel folder names the same files
    monkeypatch.chdir(tmp_path)
    assert runner.source_files(Path("kernel/mine.cu")) == ["mine.cu", "shared.cuh"]


def test_jobs_keep_every_copy_with_keep_work(tmp_path, capsys, monkeypatch):
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))   # the kept work folder goes with tmp_path
    code, data, _ = _run_jobs(tmp_path, "kept", 2, 0.0, "--keep-work")
    assert code == 0, capsys.readouterr().out
    work = Path(data["work_dir"])
    assert work.parent == tmp_path
    assert (work / "src" / "mine.cu").read_text() == (work / "job-2" / "src" / "mine.cu").read_text() == JOBS_SOURCE


def test_jobs_max_and_resume_are_checked(tmp_path, capsys):
    src = tmp_path / "mine.cu"
    src.write_text(JOBS_SOURCE)
    assert cli.main(["--source", str(src), "--test-cmd", "true", "--jobs", "0"]) == 2
    assert "error: --jobs: must be >= 1" in capsys.readouterr().err
    assert cli.main(["--source", str(src), "--test-cmd", "true", "--max", "-1"]) == 2
    assert "error: --max: must be >= 0, got -1" in capsys.readouterr().err
    assert cli.main(["--source", str(src), "--static-only", "--resume"]) == 2
    assert "error: --resume: needs --out (the folder of the interrupted run)" in capsys.readouterr().err


@pytest.mark.parametrize("text, says", [
    ("{nope", "not a JSON file"),
    ('{"equivalents": 3}', 'expected a list of entries, or {"equivalents": [...]}'),
    ("[1]", "entry 0 is not an object"),
    ('[{"site": "mine.cu:3:20:boundary.ge-to-gt"}]', "entry 0 lacks ['reason']"),
    ('[{"site": 3, "reason": "r"}]', "entry 0: site must be text"),
    (None, "cannot be read (No such file or directory)"),
])
def test_a_bad_equivalents_file_stops_the_run_naming_the_file_and_entry(tmp_path, capsys, text, says):
    src = tmp_path / "mine.cu"
    src.write_text(JOBS_SOURCE)
    eq = tmp_path / "eq.json"
    if text is not None:
        eq.write_text(text)
    assert cli.main(["--source", str(src), "--test-cmd", "true", "--equivalents", str(eq)]) == 2
    assert f"error: --equivalents: {eq}: {says}" in capsys.readouterr().err


def test_a_users_equivalents_file_marks_its_sites_equivalent_and_they_are_not_run(tmp_path, capsys):
    """A --source run takes its reviewed list from --equivalents (deepgemm's own list is not
    applied to a user's kernel): a listed site is reported with the reason and its tests never
    run; an entry whose line changed is reported stale."""
    src = tmp_path / "mine.cu"
    src.write_text(JOBS_SOURCE)
    eq = tmp_path / "eq.json"
    eq.write_text(json.dumps({"equivalents": [
        {"site": "mine.cu:3:20:boundary.ge-to-gt", "snippet": "if (blockIdx.x >= n) return;", "reason": "grid is n"},
        {"site": "mine.cu:4:23:boundary.lt-to-le", "snippet": "for (int i = 0; i < m; ++i) d[i] += 1.0f;",
         "reason": "judged on an older line"},
        {"site": "mine.cu:2:21:boundary.lt-to-le", "snippet": None, "reason": "no snippet: by site alone"}]}))
    seen = tmp_path / "seen.txt"
    check = tmp_path / "check.py"
    check.write_text("import os\n"
                     f"open(r'{seen}', 'a').write(os.environ.get('DEEPGEMM_MUTANT_ID', 'baseline') + '\\n')\n")
    out = tmp_path / "out"
    code = cli.main(["--source", str(src), "--test-cmd", f'"{sys.executable}" "{check}"', "--operators", "boundary",
                     "--equivalents", str(eq), "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    data = json.loads((out / "mutants.json").read_text())
    outcomes = {m["site"]: m["outcome"] for m in data["mutants"]}
    assert outcomes["mine.cu:3:20:boundary.ge-to-gt"] == "equivalent"
    assert outcomes["mine.cu:4:23:boundary.lt-to-le"] == "survived"
    assert outcomes["mine.cu:2:21:boundary.lt-to-le"] == "equivalent"
    assert "mine.cu:3:20:boundary.ge-to-gt" not in seen.read_text().split()
    assert "mine.cu:4:23:boundary.lt-to-le" in seen.read_text().split()
    assert [e["site"] for e in data["stale_equivalents"]] == ["mine.cu:4:23:boundary.lt-to-le"]
    md = (out / "mutants.md").read_text()
    assert "grid is n" in md and "judged on an older line" in md
    assert re.search(r"Baseline \(unmutated sources\): survived in [0-9.]+ s \(tests [0-9.]+ s\)", md) and "## Equivalent (reviewed; not run) (2)" in md


def _ended(pid: int) -> bool:
    """Killed: gone, or a zombie that init has not reaped yet."""
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def test_ctrl_c_stops_every_job_kills_their_tests_and_removes_the_work_folders(tmp_path):
    import signal
    import time
    src = tmp_path / "mine" / "mine.cu"
    src.parent.mkdir()
    src.write_text(JOBS_SOURCE)
    pids, work = tmp_path / "pids", tmp_path / "work"
    work.mkdir()
    hang = ("import os,sys,time; os.environ.get('DEEPGEMM_MUTANT_ID') or sys.exit(0); "   # the baseline passes
            f"open(r'{pids}','a').write(f'{{os.getpid()}}\\n'); time.sleep(60)")
    main = ("import signal,sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "from deepgemm.mutate import cli; sys.exit(cli.main(sys.argv[1:]))")
    proc = subprocess.Popen([sys.executable, "-c", main, "--source", str(src), "--test-cmd", f'{PY} "{hang}"',
                             "--jobs", "2", "--out", str(tmp_path / "out")],
                            env={**os.environ, "TMPDIR": str(work), "PYTHONPATH": str(runner._package_root())},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (pids.exists() and len(pids.read_text().split()) == 2) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pids.exists() and len(pids.read_text().split()) == 2, "two tests never ran at once"
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "Traceback" not in out, out
    assert "interrupted: the mutants judged so far are in" in out and "--resume" in out
    for _ in range(50):
        if all(_ended(int(pid)) for pid in pids.read_text().split()):
            break
        time.sleep(0.1)
    else:
        pytest.fail("a job's test outlived the interrupted run")
    assert list(work.iterdir()) == []   # every job's copy removed
    assert not (tmp_path / "out" / "mutants.json").exists()   # the killed tests judged nothing


def test_a_failing_job_stops_the_others_and_kills_their_tests(tmp_path):
    """An exception in one job ends the run: the other jobs take no more mutants, their running
    tests are killed (not left behind, nor recorded as timeouts), and the exception is raised."""
    import threading
    import time
    kernels, m = _fake_mutant(tmp_path)
    marker = tmp_path / "test.pid"
    script = f"import os,time; open(r'{marker}','w').write(str(os.getpid())); time.sleep(60)"
    stop = threading.Event()
    slow = _runner(tmp_path, kernels, f'{PY} "{script}"')
    slow.stop = stop

    class Failing:
        def evaluate(self, mutant):
            while not marker.exists():
                time.sleep(0.05)
            raise RuntimeError("job failed")

    recorded = []
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="job failed"):
        cli._judge([slow, Failing()], [m, m, m, m], recorded.append, stop)
    assert recorded == [] and time.monotonic() - started < 20
    for _ in range(50):
        if _ended(int(marker.read_text())):
            break
        time.sleep(0.1)
    else:
        pytest.fail("the other job's test outlived the failure")


def test_the_package_imports_no_test_tools():
    code = ("import sys; import deepgemm.mutate, deepgemm.mutate.cli, deepgemm.mutate.runner, "
            "deepgemm.mutate.report, deepgemm.mutate.operators, deepgemm.mutate.child; "
            "assert not {'pytest', 'hypothesis'} & set(sys.modules), sorted({'pytest', 'hypothesis'} & set(sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(runner._package_root())})
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------------------------------------
# Real compiles (V0, a few variants: seconds, not minutes)

def test_static_only_run_on_v0_compiles_each_mutant_and_reports(tmp_path, capsys):
    out = tmp_path / "out"
    sites = "v0_naive.cu:16:13:boundary.ge-to-gt,v0_naive.cu:22:20:index.coordinate-swap"
    code = cli.main(["--kernels", "v0", "--no-headers", "--static-only", "--variants", "minimal", "--arch", "sm_80",
                     "--sites", sites, "--private-cache", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    data = json.loads((out / "mutants.json").read_text())
    assert data["baseline"]["outcome"] == "passed-static" and data["mode"] == "static"
    assert [(m["site"], m["outcome"]) for m in data["mutants"]] == [
        ("v0_naive.cu:16:13:boundary.ge-to-gt", "passed-static"), ("v0_naive.cu:22:20:index.coordinate-swap", "passed-static")]
    assert data["summary"]["counts"]["passed-static"] == 2
    assert "2 compile and pass the static checks (need the GPU tier)" in printed


def test_a_mutant_that_does_not_compile_is_reported_with_the_compiler_error(tmp_path):
    text = (KERNELS / "v0_naive.cu").read_text()
    start = text.index("acc = 0.0f;")
    broken = operators.Mutant("v0_naive.cu", 0, 0, "test.broken", start, start + len("acc = 0.0f;"),
                              "acc = undeclared_name;", "acc = 0.0f;", "", kernels=("v0",))
    ws = runner.Workspace(KERNELS, root=tmp_path / "work")
    settings = runner.Settings(static_archs=["sm_80"], variants="minimal")
    res = runner.Runner(ws, settings, runner.kernel_users(KERNELS)).evaluate(broken)
    assert res.outcome == "did-not-compile" and res.killer.startswith("v0-sm_80-float16-float16-rr")
    assert "undeclared_name" in res.detail and "error" in res.detail
    assert (ws.kernels / "v0_naive.cu").read_text() == text


def test_a_mutant_in_grouped_only_code_is_compiled_in_the_grouped_build(tmp_path):
    """V4's group walk compiles only with DG_GROUPED = 1: a mutant there that breaks the build is
    reported as not compiling, by the grouped variant, not passed as if it compiled."""
    text = (KERNELS / "v4_mma.cu").read_text()
    old = "dg::GroupCursor group;"
    start = text.index(old)
    broken = operators.Mutant("v4_mma.cu", 0, 0, "test.broken", start, start + len(old),
                              "dg::GroupCursor group = undeclared_name;", old, "", kernels=("v4",))
    ws = runner.Workspace(KERNELS, root=tmp_path / "work")
    res = runner.Runner(ws, runner.Settings(static_archs=["sm_80"], variants="minimal")).evaluate(broken)
    assert res.outcome == "did-not-compile" and res.killer.startswith("v4.grouped-sm_80"), (res.outcome, res.killer)
    assert "undeclared_name" in res.detail


def test_a_v4_mutant_is_also_built_as_the_kernels_sharing_its_file(tmp_path):
    """fp16acc_mma is v4_mma.cu built with DG_ACC_F16, code no V4 build compiles. Its accumulator
    zeroing not unrolled puts the accumulators in local memory: the static checks see that only in
    fp16acc_mma's build, which a V4 campaign now compiles too."""
    assert runner.static_kernels(["v4"]) == ["v4", "fp16acc_mma"]
    assert runner.static_kernels(["v5", "small_m"]) == ["v5", "small_m"]
    text = (KERNELS / "v4_mma.cu").read_text()
    found = mutants_of(Source("v4_mma.cu", text), [operators.OPERATORS["performance.no-unroll"]], kernels=("v4",))
    zeroing = text.index("unsigned acc[MT][NT][2];")
    (mutant,) = [m for m in found if m.start > zeroing][:1]
    assert text[zeroing:mutant.start].count("\n") == 1   # the loop right below the f16 accumulators
    ws = runner.Workspace(KERNELS, root=tmp_path / "work")
    res = runner.Runner(ws, runner.Settings(static_archs=["sm_80"], variants="minimal")).evaluate(mutant)
    assert res.outcome == "killed-static" and res.detail.startswith("fp16acc_mma-sm_80"), (res.outcome, res.detail)
    assert "stack frame" in res.detail


def test_performance_mutants_of_the_stress_tiers_code_are_left_out(capsys):
    """Code inside `#if DG_PIPE_CHECK` / `#if DG_STRESS` branches compiles only into the stress
    tier's builds, which no benchmark times: its performance mutants are left out (and said so),
    its test-tier mutants stay."""
    text = textwrap.dedent("""\
        a();
        #if DG_PIPE_CHECK && defined(__CUDA_ARCH__)
        check();
        #if DG_X
        check_x();
        #endif
        #else
        normal();
        #endif
        #if DG_STRESS
        pause();
        #elif DG_Y
        y();
        #endif
        #if DG_PIPE_CHECK || DG_Z
        either();
        #endif
        #ifndef DG_STRESS
        default_seed();
        #endif
        """)
    assert _code_lines_marked(text, operators.check_build_lines) == ["check();", "check_x();", "pause();"]
    stress = (KERNELS / "include/deepgemm/stress.cuh").read_text()
    inside = operators.check_build_lines(stress)
    perf = mutants_of(Source("include/deepgemm/stress.cuh", stress), resolve_operators("performance"))
    assert perf and all(m.line in inside for m in perf)   # every #pragma unroll there is check-build code
    assert cli.main(["--kernels", "v5", "--list"]) == 0
    captured = capsys.readouterr()
    listed = [line.split()[0] for line in captured.out.splitlines() if line.startswith("include/deepgemm/stress.cuh:")]
    assert listed and not any(":performance." in site for site in listed)
    assert f"{len(perf)} performance mutants lie in code only the stress tier's builds compile" in captured.err


def test_static_checks_kill_a_mutant_that_breaks_a_sass_claim(tmp_path):
    """V0 forbids 128-bit loads: a mutant that reads A as uint4 is killed by the static checks."""
    text = (KERNELS / "v0_naive.cu").read_text()
    old = "dg::to_f32(a[dg::a_index(row, k, p.lda)])"
    start = text.index(old)
    new = ("[&] { const uint4 v = __ldg(reinterpret_cast<const uint4*>(a) + k); "
           "return (float)(v.x + v.y + v.z + v.w); }()")
    mutant = operators.Mutant("v0_naive.cu", 0, 0, "test.vector", start, start + len(old), new, old, "", kernels=("v0",))
    ws = runner.Workspace(KERNELS, root=tmp_path / "work")
    res = runner.Runner(ws, runner.Settings(static_archs=["sm_80"], variants="minimal")).evaluate(mutant)
    assert res.outcome == "killed-static" and "SASS has" in res.detail and "LDG.128" in res.detail


def test_minimal_variants_build_each_code_path_switch_so_its_claims_are_checked(tmp_path):
    """small_m's cp.async ring compiles only in a config with DG_SMALL_M_STAGES >= 2: a mutant that
    switches the ring off for two stages leaves a correct kernel that lacks the ring's LDGSTS. The
    minimal variant set builds that path's config too, so the static checks kill it (they did not
    when it built the plain variant alone, and a GPU tier passed the slower kernel)."""
    text = (KERNELS / "small_m.cu").read_text()
    old = "constexpr bool RING = B_KCONTIG && S >= 2;"
    start = text.index(old) + old.index("S >= 2")
    mutant = operators.Mutant("small_m.cu", 0, 0, "test.ring-off", start, start + len("S >= 2"), "S > 2", "S >= 2", "",
                              kernels=("small_m",))
    ws = runner.Workspace(KERNELS, root=tmp_path / "work")
    res = runner.Runner(ws, runner.Settings(static_archs=["sm_90a"], variants="minimal")).evaluate(mutant)
    assert res.outcome == "killed-static" and "LDGSTS" in res.detail, (res.outcome, res.detail)


BUILD_V0 = """
from deepgemm import registry, static_checks
for v in static_checks.variants(registry.get("v0"), "sm_90a")[:2]:
    v.compile()
"""


@pytest.mark.parametrize("same_code", [True, False])
def test_a_mutant_whose_builds_keep_their_machine_code_is_same_code_and_not_run(tmp_path, capsys, same_code):
    """The tests (here a command that builds two V0 variants through deepgemm.jit) log their builds;
    dropping `row < p.m` from store_d changes the text but not V0's sm_90a code (V0 returned early
    for those rows): same-code, its tests never run. A changed guard differs in the static-check
    build, a removed alpha step only in the tests' full-epilogue build: both are tested."""
    check = tmp_path / "check.py"
    check.write_text(BUILD_V0 + "open(%r, 'a').write('ran\\n')\n" % str(tmp_path / "ran.txt"))
    out = tmp_path / "out"
    sites = ["include/deepgemm/common.cuh:228:9:guard.term-dropped", "v0_naive.cu:16:13:boundary.ge-to-gt",
             "include/deepgemm/common.cuh:178:5:epilogue.step-removed"]   # the plain build keeps its code, the
                                                                          # tests' full-epilogue build does not
    code = cli.main(["--kernels", "v0", "--variants", "minimal", "--arch", "sm_90a", "--test-cmd", f'"{sys.executable}" "{check}"',
                     "--sites", ",".join(sites), "--out", str(out)] + ([] if same_code else ["--no-same-code"]))
    printed = capsys.readouterr().out
    assert code == 0, printed
    data = json.loads((out / "mutants.json").read_text())
    outcomes = {m["site"]: m["outcome"] for m in data["mutants"]}
    if same_code:
        assert outcomes == {sites[0]: "same-code", sites[1]: "survived", sites[2]: "survived"}
        assert len(data["tier_builds"]) == 2 and {(b["source"], b["arch"]) for b in data["tier_builds"]} == {
            ("v0_naive.cu", "sm_90a")}
        [same] = [m for m in data["mutants"] if m["outcome"] == "same-code"]
        assert "all 2 builds of the tests that use include/deepgemm/common.cuh" in same["detail"]
        assert "1 with the unmutated machine code" in printed
        assert (tmp_path / "ran.txt").read_text().count("ran") == 3     # the baseline and the survivors only
        assert "Same machine code as the unmutated sources" in (out / "mutants.md").read_text()
    else:
        assert set(outcomes.values()) == {"survived"} and data["tier_builds"] is None
        assert (tmp_path / "ran.txt").read_text().count("ran") == 4


def test_a_resumed_run_builds_the_baselines_logged_builds_once_before_the_jobs_start(tmp_path, capsys):
    """A reused baseline leaves this run's kernel cache empty; the logged builds are compiled once,
    with every core, before any mutant is judged (not by each job's same-code check and tests on
    its share of the cores), and the mutants are judged as in one run."""
    check = tmp_path / "check.py"
    check.write_text(BUILD_V0)
    out = tmp_path / "out"
    sites = ["include/deepgemm/common.cuh:228:9:guard.term-dropped", "v0_naive.cu:16:13:boundary.ge-to-gt"]
    args = ["--kernels", "v0", "--variants", "minimal", "--arch", "sm_90a", "--test-cmd",
            f'"{sys.executable}" "{check}"', "--out", str(out), "--jobs", "2"]
    assert cli.main(args + ["--sites", sites[0]]) == 0
    first = capsys.readouterr().out
    assert "kernel cache:" not in first                     # the baseline's own tests built them
    assert cli.main(args + ["--sites", ",".join(sites), "--resume"]) == 0
    printed = capsys.readouterr().out
    assert "baseline: reused" in printed
    warm = printed.index("kernel cache: the 2 builds the baseline's tests made")
    assert warm < printed.index("[1/1]")
    outcomes = {m["site"]: m["outcome"] for m in json.loads((out / "mutants.json").read_text())["mutants"]}
    assert outcomes == {sites[0]: "same-code", sites[1]: "survived"}


def test_tests_that_never_build_the_mutated_file_leave_the_mutant_to_the_tests(tmp_path):
    """No logged build uses the mutated file: nothing to compare, so the tests judge (and a survivor
    there is a gap, not an equivalent)."""
    ws = runner.Workspace(KERNELS, root=tmp_path / "work")
    settings = runner.Settings(static_archs=["sm_90a"], variants="minimal", test_cmd="true", same_code=True,
                               tier_builds=[{"name": "x", "source": "v1_smem.cu", "arch": "sm_90a", "defines": {}}])
    [m] = [m for m in operators.mutants_of(Source("v0_naive.cu", (KERNELS / "v0_naive.cu").read_text()),
                                           [operators.OPERATORS["boundary.ge-to-gt"]]) if m.line == 16][:1]
    res = runner.Runner(ws, settings, runner.kernel_users(KERNELS)).evaluate(m)
    assert res.outcome == "survived"


@pytest.mark.parametrize("reply", [{"compile_error": {"variant": "a", "log": "k.cu(1): error: expected a ;"}},
                                   {}])                                  # a reply without the digests asked for
def test_unmutated_sources_that_do_not_build_for_the_same_code_check_are_an_error_not_a_verdict(tmp_path, monkeypatch, reply):
    """The same-code check compares a mutant's builds with the unmutated ones; when those do not
    build, there is nothing to compare with: the mutant is an error naming the step, its tests do
    not run, and the copy is left unmutated."""
    kernels, m = _fake_mutant(tmp_path)
    ran = tmp_path / "tests-ran"
    r = _runner(tmp_path, kernels, _touch_cmd(ran), same_code=True,
                tier_builds=[{"name": "a", "source": "k.cu", "arch": "sm_90a", "defines": {}}])
    r.settings.compile_check = True
    calls = []
    monkeypatch.setattr(r, "compile_step", lambda *a, **k: calls.append(k) or reply)
    res = r.evaluate(m)
    assert (res.outcome, res.killer) == ("error", "the same-code check failed")
    assert "the unmutated sources did not build for the same-code check" in res.detail
    if reply:
        assert "expected a ;" in res.detail
    assert calls and all(k.get("digests") for k in calls) and not ran.exists()
    assert (r.ws.kernels / "k.cu").read_text() == "if (row < p.m) f();\n"


def test_the_build_log_lists_each_build_once_in_a_stable_order(tmp_path, monkeypatch):
    log = tmp_path / "builds.jsonl"
    monkeypatch.setenv("DEEPGEMM_BUILD_LOG", str(log))
    monkeypatch.setattr(jit, "_compiled", {})
    def fake(*a, **k):
        raise RuntimeError("compiled")      # stop after the log line: no compiler needed
    monkeypatch.setattr(jit, "_read_entry", fake)
    for defines in ({"B": 2, "A": 1}, {"A": 1, "B": 2}, {"A": 3}):
        with pytest.raises(RuntimeError, match="compiled"):
            jit.compile_kernel("v0-x", KERNELS / "v0_naive.cu", "sm_90a", defines)
    with open(log, "a") as f:
        f.write('{"name": "cut sh')                                      # a writer killed mid-line
    builds = runner.read_build_log(log)
    assert builds == [{"arch": "sm_90a", "defines": {"A": 1, "B": 2}, "name": "v0-x", "source": "v0_naive.cu"},
                      {"arch": "sm_90a", "defines": {"A": 3}, "name": "v0-x", "source": "v0_naive.cu"}]
    assert runner.read_build_log(tmp_path / "none.jsonl") == []


def test_a_derived_copy_of_a_kernel_file_is_logged_by_its_origin_and_rebuilt_from_the_mutated_file(tmp_path, monkeypatch):
    """The stress tier's check builds compile a copy of v5_wgmma.cu with #define lines in front, so
    code that only they compile (DG_PIPE_CHECK's ledgers) is invisible to the normal builds. The
    build log names such a copy by its origin and prefix; the same-code check counts it as a build of
    the origin (and of what the origin includes) and rebuilds it from the mutated kernel folder."""
    from deepgemm.mutate import child
    from deepgemm.testing import stress

    variant = tmp_path / "a" / "v5_stress_check.cu"
    variant.parent.mkdir()
    variant.write_text(stress.variant_source("v5", pipe_check=True))
    assert jit.derived_origin(variant) == ("v5_wgmma.cu", "#define DG_STRESS 0\n#define DG_PIPE_CHECK 1\n")
    assert jit.derived_source(*jit.derived_origin(variant)) == variant.read_text()
    assert jit.derived_origin(KERNELS / "v0_naive.cu") is None           # no #line directive
    other = tmp_path / "b.cu"
    other.write_text('#define X 1\n#line 1 "no_such_kernel.cu"\n')
    assert jit.derived_origin(other) is None                                # names no kernel file

    log = tmp_path / "builds.jsonl"
    monkeypatch.setenv("DEEPGEMM_BUILD_LOG", str(log))
    copies = [variant, tmp_path / "c" / "v5_stress_check.cu"]                # two tests, two copies
    copies[1].parent.mkdir()
    copies[1].write_text(variant.read_text())
    for path in copies:
        jit._log_build("v5_stress_check-x", path, "sm_90a", {"DG_BN": 128})
    [build] = runner.read_build_log(log)
    assert build["origin"] == "v5_wgmma.cu" and build["prefix"].endswith("#define DG_PIPE_CHECK 1\n")
    ws = runner.Workspace(KERNELS, root=tmp_path / "work")
    settings = runner.Settings(static_archs=["sm_90a"], variants="minimal", test_cmd="true", same_code=True,
                               tier_builds=[build])
    r = runner.Runner(ws, settings, runner.kernel_users(KERNELS))
    for used in ("v5_wgmma.cu", "include/deepgemm/stress.cuh", "include/deepgemm/hopper.cuh"):
        assert r._builds_using(used) == [build]
    assert r._builds_using("v4_mma.cu") == []

    # Rebuilt from the kernel folder the child sees: a change there changes the derived build's code.
    v0 = {"name": "v0_derived", "source": str(tmp_path / "gone.cu"), "origin": "v0_naive.cu",
          "prefix": "#define DG_PROBE 1\n", "arch": "sm_90a", "defines": {}}
    before = child.handle({"kernels": [], "static": False, "builds": [v0], "digests": True})["digests"]
    mutated = tmp_path / "kernels"
    shutil.copytree(KERNELS, mutated)
    text = (mutated / "v0_naive.cu").read_text()
    assert text.count("acc += ") == 1
    (mutated / "v0_naive.cu").write_text(text.replace("acc += ", "acc -= "))
    monkeypatch.setattr(jit, "KERNEL_DIR", mutated)
    after = child.handle({"kernels": [], "static": False, "builds": [v0], "digests": True})["digests"]
    assert list(before) == list(after) == [child.build_label(v0)] and before != after


def test_site_ids_quoted_in_the_docs_exist():
    import re
    doc = (Path(__file__).resolve().parents[2] / "docs" / "verification.md").read_text()
    quoted = set(re.findall(r"([\w/.]+\.cuh?:\d+:\d+:[\w.-]+)", doc))
    assert quoted, "the mutation-testing section quotes no site id"
    current = {m.site_id for m in _all_mutants()}
    assert quoted <= current, sorted(quoted - current)


@needs_repo_tests
def test_with_jobs_the_baseline_tier_takes_every_jobs_xdist_workers(monkeypatch, tmp_path):
    """The baseline runs alone: with --jobs 4 --xdist 2 its GPU tier gets -n 8, each mutant's -n 2."""
    seen = []

    def evaluate(self, mutant, kernels=None):
        seen.append((mutant is None, list(self.settings.test_cmd)))
        return runner.Result(mutant, "survived" if mutant is None else "killed", killer="t", test_seconds=1.0)

    monkeypatch.setattr(cli, "_gpu_arch", lambda: ("sm_90a", "a stand-in GPU"))
    monkeypatch.setattr(runner.Runner, "evaluate", evaluate)
    sites = [m.site_id for m in mutants_of(Source("v0_naive.cu", (KERNELS / "v0_naive.cu").read_text()),
                                           resolve_operators("boundary"), kernels=("v0",))][:2]
    rc = cli.main(["--kernels", "v0", "--sites", ",".join(sites), "--jobs", "4", "--xdist", "2",
                   "--out", str(tmp_path / "out")])
    assert rc == 0
    (is_base, base_cmd), *rest = seen
    assert is_base and base_cmd[-2:] == ["-n", "8"]
    assert len(rest) == 2 and all(not b and cmd[-2:] == ["-n", "2"] for b, cmd in rest)


# --resume: the interrupted run's baseline is reused only while what it ran is unchanged

RESUME_CHECK = """\
import os, sys
if os.environ.get("DEEPGEMM_MUTANT_ID") is None:
    with open(sys.argv[1], "a") as log:
        log.write("baseline\\n")
    sys.exit(0)
sys.exit(1 if "<=" in open(os.environ["DEEPGEMM_MUTANT_SOURCE"]).read() else 0)
"""


def _resume_run(tmp_path, *extra) -> tuple[int, int]:
    """A --source run into tmp_path/out: (exit status, baselines run so far)."""
    src, log = tmp_path / "mine" / "mine.cu", tmp_path / "baselines.log"
    cmd = f'"{sys.executable}" "{tmp_path / "check.py"}" "{log}"'
    code = cli.main(["--source", str(src), "--test-cmd", cmd, "--operators", "boundary,guard",
                     "--out", str(tmp_path / "out"), *extra])
    return code, len(log.read_text().splitlines()) if log.exists() else 0


def test_resume_reuses_the_baseline_only_for_the_same_sources_and_command(tmp_path, capsys):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "mine.cu").write_text('#include "consts.cuh"\n' + JOBS_SOURCE)
    (tmp_path / "mine" / "consts.cuh").write_text("constexpr int N = 4;\n")
    (tmp_path / "check.py").write_text(RESUME_CHECK)
    assert _resume_run(tmp_path, "--max", "2") == (0, 1)
    data = json.loads((tmp_path / "out" / "mutants.json").read_text())
    assert data["fingerprint"] and data["baseline"]["outcome"] == "survived"
    capsys.readouterr()
    assert _resume_run(tmp_path, "--resume") == (0, 1)   # reused: no second baseline
    assert "baseline: reused from the interrupted run" in capsys.readouterr().out
    assert len(json.loads((tmp_path / "out" / "mutants.json").read_text())["mutants"]) == 6
    assert _resume_run(tmp_path) == (0, 2)   # without --resume the baseline always runs
    (tmp_path / "mine" / "notes.txt").write_text("a file the kernel does not include is not copied: no change\n")
    assert _resume_run(tmp_path, "--resume") == (0, 2)
    (tmp_path / "mine" / "consts.cuh").write_text("constexpr int N = 8;\n")   # one it includes is
    assert _resume_run(tmp_path, "--resume") == (0, 3)
    assert _resume_run(tmp_path, "--resume") == (0, 3)
    data = json.loads((tmp_path / "out" / "mutants.json").read_text())
    data["baseline"]["outcome"] = "killed"   # an interrupted run whose baseline failed is never trusted
    (tmp_path / "out" / "mutants.json").write_text(json.dumps(data))
    assert _resume_run(tmp_path, "--resume") == (0, 4)
    (tmp_path / "check.py").write_text(RESUME_CHECK + "\n")   # a different command file: same command line,
    assert _resume_run(tmp_path, "--resume") == (0, 4)   # so reused (the user's files: the kernel and its includes)


def test_tree_digest_follows_paths_and_bytes_but_not_caches(tmp_path):
    root = tmp_path / "k"
    (root / "include").mkdir(parents=True)
    (root / "a.cu").write_text("x")
    (root / "include" / "h.cuh").write_text("y")
    first = runner.tree_digest(root)
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "m.pyc").write_bytes(b"z")
    assert runner.tree_digest(root) == first
    (root / "a.cu").write_text("x ")
    assert runner.tree_digest(root) != first
    (root / "a.cu").write_text("x")
    (root / "include" / "h.cuh").rename(root / "h.cuh")
    assert runner.tree_digest(root) != first
    assert runner.tree_digest(root, tmp_path / "absent") == runner.tree_digest(root)


def test_a_run_with_tests_resumes_a_static_run_without_its_untested_passes(tmp_path):
    """A static-only run (a machine without a GPU) leaves kills and compile errors, which a later
    run with tests keeps, and passes, which it must test: compiled and clean is not a verdict."""
    found = mutants_of(Source("mine.cu", JOBS_SOURCE), resolve_operators("boundary,guard"))[:4]
    outcomes = ["killed-static", "passed-static", "did-not-compile", "passed-static"]
    (tmp_path / "mutants.json").write_text(json.dumps({"mutants": [
        {"site": m.site_id, "outcome": o, "killer": None, "detail": None, "seconds": 1.0}
        for m, o in zip(found, outcomes)]}))
    to_run = {m.site_id: m for m in found}
    earlier = cli._previous_run(tmp_path)
    kept = cli._previous_results(earlier, to_run, static_only=False)
    assert [(r.mutant.site_id, r.outcome) for r in kept] == [(found[0].site_id, "killed-static"),
                                                              (found[2].site_id, "did-not-compile")]
    assert [r.outcome for r in cli._previous_results(earlier, to_run, static_only=True)] == outcomes
    assert cli._previous_run(tmp_path / "absent") == {}


def test_a_resumed_run_judges_the_survivors_again_after_its_sources_or_tests_changed(tmp_path):
    """Survivors are what a new test is written for: resuming after one (another fingerprint) must
    run them again, where kills stand. With the same fingerprint, or none recorded, both stand."""
    found = mutants_of(Source("mine.cu", JOBS_SOURCE), resolve_operators("boundary,guard"))[:3]
    outcomes = ["killed", "survived", "did-not-compile"]
    (tmp_path / "mutants.json").write_text(json.dumps({"fingerprint": "before", "mutants": [
        {"site": m.site_id, "outcome": o, "killer": "t" if o == "killed" else None, "detail": None, "seconds": 1.0}
        for m, o in zip(found, outcomes)]}))
    to_run = {m.site_id: m for m in found}
    earlier = cli._previous_run(tmp_path)
    for fingerprint in ("before", None):
        assert [r.outcome for r in cli._previous_results(earlier, to_run, False, fingerprint)] == outcomes
    kept = cli._previous_results(earlier, to_run, False, "after")
    assert [(r.mutant.site_id, r.outcome) for r in kept] == [(found[0].site_id, "killed"),
                                                              (found[2].site_id, "did-not-compile")]


def _gone(pid: int, wait: float = 5.0) -> bool:
    """The process has ended: no such process, or a zombie (killed, not yet reaped by its new
    parent, which a container's init may never do)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def test_a_mutants_sweep_variants_warm_beside_its_tests_and_stop_with_them(tmp_path, monkeypatch):
    """The baseline warms the sweep's variants before its tests; a mutant's compile step does not,
    and its warm-up runs beside the tests instead: a mutant killed early is not held up by it, and
    the warm-up (with its children) is killed once the tests end, its half-written files removed."""
    kernels, m = _fake_mutant(tmp_path)
    pid_file, child_pid_file = tmp_path / "warm.pid", tmp_path / "warm-child.pid"
    # the stand-in warm-up: records its request, starts a grandchild, leaves a temporary entry, sleeps
    warm = ("import json,os,subprocess,sys,time; req=json.load(sys.stdin); "
            f"open(r'{pid_file}','w').write(str(os.getpid())+' '+json.dumps(req)); "
            "c=subprocess.Popen([sys.executable,'-c','import time; time.sleep(60)']); "
            f"open(r'{child_pid_file}','w').write(str(c.pid)); "
            "d=os.environ['DEEPGEMM_CACHE_DIR']; open(os.path.join(d,'x.cubin.abc.tmp'),'w').close(); "
            "os.makedirs(os.path.join(d,'tmpq1'),exist_ok=True); time.sleep(60)")
    monkeypatch.setattr(runner, "CHILD", [sys.executable, "-c", warm])
    r = _runner(tmp_path, kernels, f'{PY} "import time,sys; time.sleep(1.5); sys.exit(1)"')
    r.settings.compile_check, r.settings.warm_arch = True, "sm_90a"
    steps = []
    monkeypatch.setattr(r, "compile_step", lambda kernels, mutated_file, warm=True: steps.append(warm) or {})
    started = time.monotonic()
    res = r.evaluate(m)
    assert res.outcome == "killed" and time.monotonic() - started < 20
    assert steps == [False]                                     # the compile step left the warm-up out
    pid, request = pid_file.read_text().split(" ", 1)
    request = json.loads(request)
    assert request["static"] is False and request["warm_arch"] == "sm_90a" and request["low_priority"] is True
    for p in (int(pid), int(child_pid_file.read_text())):      # killed with the tests' end, grandchild too
        assert _gone(p), p
    assert not [p.name for p in r.ws.cache.iterdir() if p.name.endswith(".tmp") or p.name.startswith("tmp")]
    pid_file.unlink()
    r.evaluate(None, kernels=())
    assert steps == [False, True] and not pid_file.exists()    # the baseline warms first, in its compile step


@pytest.mark.parametrize("child, status", [
    ("import os,signal,sys; print('cicc: internal error'); sys.stdout.flush(); os.kill(os.getpid(), signal.SIGKILL)",
     "-9"),                                                              # the compiler's process killed
    ("print('no reply')", "0"),                                          # exited without its JSON reply
])
def test_a_compile_step_that_dies_is_that_mutants_error_and_its_tests_do_not_run(tmp_path, monkeypatch, child, status):
    """A crash of the compile step's own process is no verdict on the mutant: it is reported as an
    error with the exit status and the process's last output, the tests are not run on a kernel
    that was never checked, and the copy gets its unmutated source back for the next mutant."""
    kernels, m = _fake_mutant(tmp_path)
    ran = tmp_path / "tests-ran"
    monkeypatch.setattr(runner, "CHILD", [sys.executable, "-c", child])
    r = _runner(tmp_path, kernels, _touch_cmd(ran))
    r.settings.compile_check = True
    res = r.evaluate(m)
    assert (res.outcome, res.killer) == ("error", "the compile step failed")
    assert f"exit status {status}" in res.detail
    if status != "0":
        assert "cicc: internal error" in res.detail
    else:
        assert "no reply" in res.detail
    assert not ran.exists()
    assert (r.ws.kernels / "k.cu").read_text() == "if (row < p.m) f();\n"


def test_with_the_baselines_build_log_a_mutant_warms_exactly_the_builds_that_use_its_file(tmp_path, monkeypatch):
    kernels, m = _fake_mutant(tmp_path)
    (kernels / "other.cu").write_text('#include "k.cu"\n')
    (kernels / "apart.cu").write_text("int x;\n")
    logged = [{"name": n, "source": f, "arch": "sm_90a", "defines": {}} for n, f in
              (("a", "k.cu"), ("b", "other.cu"), ("c", "apart.cu"))]
    request_file = tmp_path / "warm.json"
    monkeypatch.setattr(runner, "CHILD", [sys.executable, "-c",
                                          f"import sys; open(r'{request_file}','w').write(sys.stdin.read())"])
    r = _runner(tmp_path, kernels, "true", tier_builds=logged)
    r.settings.compile_check, r.settings.warm_arch = True, "sm_90a"
    proc = r.start_warm(("v0",), "k.cu")
    proc.wait(timeout=60)                                           # the stand-in exits once it has the request
    r.stop_warm(proc)
    request = json.loads(request_file.read_text())
    assert [b["name"] for b in request["builds"]] == ["a", "b"]        # its own file, and one that includes it
    assert request["warm_arch"] is None and request["static"] is False and request["low_priority"] is True


def test_the_warm_up_compiles_the_ladder_kernels_sweep_variants_and_skips_the_others(monkeypatch):
    """The quick sweep covers the ladder's kernels; a kernel outside it (the accuracy report's) has
    no sweep variants to warm and is passed over, not an error."""
    from deepgemm import device
    from deepgemm.mutate import child
    from deepgemm.testing import sweep
    seen = []
    monkeypatch.setattr(child, "_compile_all", lambda jobs, workers, stop_after=None: seen.extend(jobs) or ([], None))
    reply = child.handle({"kernels": ["v0", "fp16acc_mma"], "static": False, "warm_arch": "sm_90a", "workers": 1})
    assert reply["compile_error"] is None and reply["compiled"] == 0
    expected = len(sweep.compile_jobs(sweep.quick_cases("v0"), "sm_90a", device.current()))
    assert expected > 0
    assert [label for label, _ in seen] == [f"v0-sweep-variant-{i}" for i in range(expected)]


def test_a_low_priority_compile_step_lowers_its_own_priority_first(monkeypatch):
    """The warm-up's request asks for the lowest CPU priority; the child takes it before any
    compile starts (its compilers inherit it), and a plain compile step keeps its priority."""
    import io
    from deepgemm.mutate import child
    events = []
    monkeypatch.setattr(child.os, "nice", lambda inc: events.append(("nice", inc)))
    monkeypatch.setattr(child, "handle", lambda request: events.append(("handle", request.get("low_priority"))) or {})
    for low in (True, False):
        monkeypatch.setattr(child.sys, "stdin", io.StringIO(json.dumps({"kernels": [], "low_priority": low})))
        monkeypatch.setattr(child.sys, "stdout", io.StringIO())
        assert child.main() == 0
    assert events == [("nice", 19), ("handle", True), ("handle", False)]


@pytest.mark.parametrize("limits, stopped_by, outcome", [
    (dict(timeout=1.5, fair_timeout=60.0), "timeout", "unfinished"),          # a given limit below the fair one
    (dict(timeout=1.5, fair_timeout=1.5), "timeout", "timeout"),              # at the fair limit: a crawl, killed
    (dict(timeout=1.5), "timeout", "timeout"),                                # no baseline to judge by: as given
    (dict(timeout=50.0, stall_timeout=1.0, fair_stall_timeout=30.0), "stall", "unfinished"),
    (dict(timeout=50.0, stall_timeout=1.0, fair_stall_timeout=1.0), "stall", "timeout"),   # a hang
])
def test_a_stop_counts_as_a_kill_only_under_the_limits_the_baseline_allows(tmp_path, limits, stopped_by, outcome):
    """Eight jobs sharing a machine with a short --timeout stopped correct mutants that were still
    passing test after test: a stop by a limit shorter than the baseline's time allows is no
    evidence, so the mutant is unfinished (not killed, not survived) and a resumed run tries again."""
    kernels, m = _fake_mutant(tmp_path)
    script = "import sys,time; [print('.', flush=True) or time.sleep(0.2) for _ in range(300)]" if stopped_by == "timeout" \
        else "import sys,time; print('.', flush=True); time.sleep(60)"
    res = _runner(tmp_path, kernels, f'{PY} "{script}"', **limits).evaluate(m)
    assert res.outcome == outcome and res.test_seconds < 20
    if outcome == "unfinished":
        assert "shorter than the" in res.killer and "not a kill" in res.killer
        assert outcome not in runner.KILLED
        summary = report.summarize([res])
        assert summary["killed"] == 0 and summary["score"] is None and summary["counts"]["unfinished"] == 1
        assert "1 unfinished" in report.summary_line(summary)
        earlier = {"mutants": [res.as_dict()]}
        assert cli._previous_results(earlier, {m.site_id: m}, static_only=False) == []   # run again


@needs_repo_tests
def test_short_limits_are_warned_about_and_the_fair_ones_derived_from_the_baseline(tmp_path, monkeypatch, capsys):
    """The baseline's time sets the fair limits (times --jobs); given limits shorter than those are
    used, with a warning that what they stop is unfinished."""
    seen = []

    def evaluate(self, mutant, kernels=None):
        seen.append((self.settings.timeout, self.settings.fair_timeout, self.settings.stall_timeout,
                     self.settings.fair_stall_timeout))
        return runner.Result(mutant, "survived" if mutant is None else "killed", killer="t", test_seconds=10.0,
                             slowest_test=2.0)

    monkeypatch.setattr(cli, "_gpu_arch", lambda: ("sm_90a", "a stand-in GPU"))
    monkeypatch.setattr(runner.Runner, "evaluate", evaluate)
    sites = [m.site_id for m in mutants_of(Source("v0_naive.cu", (KERNELS / "v0_naive.cu").read_text()),
                                           resolve_operators("boundary"), kernels=("v0",))][:1]
    assert cli.main(["--kernels", "v0", "--sites", ",".join(sites), "--jobs", "2", "--timeout", "30",
                     "--stall-timeout", "500"]) == 0
    assert seen[-1] == (30.0, 2 * (3 * 10 + 60), 500.0, 2 * 120)
    out = capsys.readouterr().out
    assert "warning: --timeout 30 s is shorter than the 180 s the baseline allows at --jobs 2" in out
    assert out.count("warning:") == 1   # the stall limit given is above the fair one


def test_killers_rank_by_kills_then_by_first_kill_and_skip_what_is_not_a_test():
    k = runner.Killers(limit=3)
    for killer in ["t.py::a", "exit status 1", "t.py::b", "t.py::c", "t.py::b", None, "t.py::d", "t.py::c"]:
        k.add(killer)
    assert k.first() == ["t.py::b", "t.py::c", "t.py::a"]   # two kills each (b first), then the earliest


def test_run_first_puts_the_listed_tests_first_and_keeps_the_rest_in_order(tmp_path):
    (tmp_path / "test_a.py").write_text("def test_1(): pass\ndef test_2(): pass\ndef test_3(): pass\n")
    (tmp_path / "test_b.py").write_text("import pytest\n@pytest.mark.parametrize('x', [1, 2])\ndef test_p(x): pass\n")
    order = tmp_path / "first.txt"
    order.write_text("test_b.py::test_p[2]\ntest_a.py::test_3\ntest_a.py::gone\n\n")
    def collect(*extra):
        proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                               "-o", "addopts=", "-p", "deepgemm.testing.plugin", "test_a.py", "test_b.py", *extra],
                              cwd=tmp_path, capture_output=True, text=True)
        return proc.returncode, [line for line in proc.stdout.splitlines() if "::" in line], proc.stdout + proc.stderr
    rc, ids, out = collect(f"--run-first={order}")
    assert rc == 0, out
    assert ids == ["test_b.py::test_p[2]", "test_a.py::test_3", "test_a.py::test_1", "test_a.py::test_2",
                   "test_b.py::test_p[1]"]
    assert collect()[1][:2] == ["test_a.py::test_1", "test_a.py::test_2"]          # without it: as collected
    rc, _, out = collect(f"--run-first={tmp_path / 'absent.txt'}")
    assert rc != 0 and "--run-first: cannot read" in out


def test_a_mutants_tier_starts_with_the_earlier_killers_and_its_kill_joins_them(tmp_path):
    """The built-in tier gets --run-first with the campaign's killers (not the baseline, whose
    order is the tier's own); a kill by a test adds that test."""
    kernels, m = _fake_mutant(tmp_path)
    seen = tmp_path / "seen.txt"
    # a stand-in tier: records its arguments and the order file's lines; fails as pytest reports a test
    script = ("import sys; args=sys.argv[1:]; first=[a.split('=',1)[1] for a in args if a.startswith('--run-first=')]; "
              f"open(r'{seen}','a').write(repr((args, open(first[0]).read().split() if first else None))+'\\n'); "
              "import os; sys.exit(0) if os.environ.get('DEEPGEMM_MUTANT_ID') is None else "
              "(print('FAILED tests/t.py::test_new - AssertionError: x'), sys.exit(1))")
    r = _runner(tmp_path, kernels, [sys.executable, "-c", script], builtin_tier=True, killers=runner.Killers())
    assert r.evaluate(None, kernels=()).outcome == "survived"
    r.settings.killers.add("tests/t.py::test_old")
    res = r.evaluate(m)
    assert (res.outcome, res.killer) == ("killed", "tests/t.py::test_new")
    base, mutant = [eval(line) for line in seen.read_text().splitlines()]
    assert base[1] is None and not any(a.startswith("--run-first") for a in base[0])
    assert mutant[1] == ["tests/t.py::test_old"]
    assert r.settings.killers.first() == ["tests/t.py::test_old", "tests/t.py::test_new"]


@needs_repo_tests
def test_a_resumed_campaign_starts_with_the_interrupted_runs_killers(tmp_path, monkeypatch):
    seen = []

    def evaluate(self, mutant, kernels=None):
        seen.append(self.settings.killers.first())
        return runner.Result(mutant, "survived" if mutant is None else "killed", killer="t", test_seconds=1.0)

    monkeypatch.setattr(cli, "_gpu_arch", lambda: ("sm_90a", "a stand-in GPU"))
    monkeypatch.setattr(runner.Runner, "evaluate", evaluate)
    sites = [m.site_id for m in mutants_of(Source("v0_naive.cu", (KERNELS / "v0_naive.cu").read_text()),
                                           resolve_operators("boundary"), kernels=("v0",))][:2]
    out = tmp_path / "out"
    out.mkdir()
    (out / "mutants.json").write_text(json.dumps({"mutants": [
        {"site": sites[0], "outcome": "killed", "killer": "tests/gpu/test_sweep.py::test_sweep[v0-7-exact]",
         "seconds": 1.0},
        {"site": "elsewhere.cu:1:1:boundary.lt-to-le", "outcome": "killed", "killer": "tests/gpu/test_fuzz.py::test_fuzz[v0]",
         "seconds": 1.0},
        {"site": "elsewhere.cu:2:1:boundary.lt-to-le", "outcome": "killed-static", "killer": "static checks"}]}))
    assert cli.main(["--kernels", "v0", "--sites", ",".join(sites), "--out", str(out), "--resume"]) == 0
    assert seen[0] == ["tests/gpu/test_sweep.py::test_sweep[v0-7-exact]", "tests/gpu/test_fuzz.py::test_fuzz[v0]"]
