"""V5 whole on the host: its own source compiled as host C++ and run through gemm()'s real path under
the quick sweep's oracles, as test_host_kernels.py runs the rest of the ladder (its fixtures and
helpers; what the host models: tests/cpu/harness/grid_host.h). Its own file, so that the CPU tier's
two pytest-xdist workers (`--dist loadfile`) run it beside the other kernels' host runs.

V5's mbarriers, named barriers, TMA loads and stores (through the tensor maps' fields, which the
host fixture encodes in place of the driver) and wgmma (through its shared-memory descriptors) run
as late or as early as the PTX allows, so the planted bugs below fail here every time, the
asynchronous hand-overs among them, which a GPU shows only through its ledgers (the stress tier).
Not run here: V5's thread-block clusters (split-K, B shared by multicast).
"""
import numpy as np
import pytest

import deepgemm
from deepgemm.testing import stress, sweep
from fake_gpu import captured, gpus  # noqa: F401 (fixtures)
from test_host_kernels import ALL, grouped_sweep_on_the_host, host, host_cases, lib_dir, planted_bug_fails, quick_sweep_on_the_host  # noqa: F401

import host_harness
from deepgemm import jit, registry


# V5's 256-row configs (each consumer warpgroup two 64-row halves), as its config space lists them
TALL_CONFIGS = [dict(c) for c in registry.get("v5").config_space if c.get("DG_BM") == 256]


@pytest.mark.parametrize("kernel", ["v5"])
def test_the_quick_sweep_passes_on_the_host(host, kernel):
    quick_sweep_on_the_host(host, kernel)


@pytest.mark.parametrize("kernel", ["v5"])
def test_the_grouped_build_passes_the_grouped_sweep_on_the_host(host, monkeypatch, kernel):
    grouped_sweep_on_the_host(host, monkeypatch, kernel)


@pytest.mark.parametrize("config", [TALL_CONFIGS[0], {"DG_BN": 128, "DG_STAGES": 5, "DG_PINGPONG": 1}],
                         ids=["256x64", "ping-pong"])
def test_consumers_of_two_halves_pass_the_grouped_sweep_on_the_host(host, monkeypatch, config):
    """Every group pattern at the row tile's edges with a consumer warpgroup that stores two 64-row
    halves per tile (256-row tiles, which the rule takes for attention-sized batches; ping-pong).
    At a group's end its halves are written row by row while others went out by TMA, so a count of
    pending store groups no longer says which halves' stores may still read their staging tiles:
    with the count alone, the next half overwrote a tile a TMA store had yet to read (masked and
    contiguous groups, 5-6 of these 30 cases wrong)."""
    grouped_sweep_on_the_host(host, monkeypatch, "v5", config=config)


# (D's dtype, D's row pitch and matrix stride, C's row pitch and matrix stride, the stride between
# the batches' float16 bias rows: 0 for one shared bias) for a batch of 3 x 64 x 128 matrices: an odd
# stride leaves every other matrix (or bias row) off pair alignment, an odd pitch every other row. A
# 16-bit D goes through the staging tile (its rows stored by TMA or pair by pair), an FP32 D pair by
# pair from the registers; either must fall back to single elements there.
ODD_APART = {
    "d_and_c_matrices": ("float16", 128, 64 * 128 + 1, 128, 64 * 128 + 1, 0),
    "d_rows_beside_even_c_rows": ("float16", 129, 64 * 129, 128, 64 * 128, 0),
    "f32_d_matrices": ("float32", 128, 64 * 128 + 1, 128, 64 * 128, 0),
    "c_matrices_beside_f32_d": ("float32", 128, 64 * 128, 128, 64 * 128 + 1, 0),
    "bias_rows_beside_f32_d": ("float32", 128, 64 * 128, 128, 64 * 128, 129),
}


@pytest.mark.parametrize("name", sorted(ODD_APART))
def test_a_batch_whose_matrices_lie_an_odd_number_of_elements_apart(host, name):
    """A strided batch whose D or C matrices (or D's rows) lie an odd number of elements apart:
    V5's grouped build must take its per-element chain and stores where a pair would be misaligned
    (a GPU traps on one, and so does the host). No grouped sweep case has such strides."""
    out_dtype, ld_d, stride_d, ld_c, stride_c, bias_stride = ODD_APART[name]
    rng = np.random.default_rng(7)
    g, m, n, k = 3, 64, 128, 64
    a = rng.integers(-3, 4, (g, m, k)).astype(np.float16)
    b = rng.integers(-3, 4, (g, k, n)).astype(np.float16)
    bias = rng.integers(-3, 4, n).astype(np.float16)
    if bias_stride:   # one row per batch
        rows = np.zeros(g * bias_stride, np.float16)
        bias = np.lib.stride_tricks.as_strided(rows, shape=(g, n), strides=(2 * bias_stride, 2))
        bias[...] = rng.integers(-3, 4, (g, n))

    def batch(dtype, ld, stride, fill):
        buf = np.full(g * stride + 16, fill, dtype)
        size = buf.itemsize
        return np.lib.stride_tricks.as_strided(buf, shape=(g, m, n), strides=(size * stride, size * ld, size))
    c = batch(np.float16, ld_c, stride_c, 0)
    c[...] = rng.integers(-3, 4, (g, m, n))
    out = batch(out_dtype, ld_d, stride_d, np.nan)
    host.run(deepgemm.gemm, a, b, out=out, bias=bias, c=c, beta=1.0, kernel="v5")
    per_row = bias[:, None, :] if bias.ndim == 2 else bias
    assert np.array_equal(out.astype(np.float64), a.astype(np.float64) @ b + per_row + c)


@pytest.mark.parametrize("out_dtype", ["float16", "float32"])
def test_a_residual_that_is_the_output_over_several_tiles_per_block(host, out_dtype):
    """C = out, read and then overwritten, over 6 tiles walked by the host's 3 persistent blocks: a
    tile computed twice (a block walking another block's tiles) reads its own result as C the
    second time, so the output shows it; the sweep's C = out cases are one tile each."""
    rng = np.random.default_rng(11)
    m, n, k = 300, 300, 64
    a = rng.integers(-3, 4, (m, k)).astype(np.float16)
    b = rng.integers(-3, 4, (k, n)).astype(np.float16)
    out = rng.integers(-3, 4, (m, n)).astype(out_dtype)
    want = a.astype(np.float64) @ b + out
    host(a, b, out=out, c=out, beta=1.0, kernel="v5")
    assert np.array_equal(out.astype(np.float64), want)




def _tall_tiles_stage_c_bias_and_d_by_halves(host, config):
    rng = np.random.default_rng(13)
    m, n, k = 600, 200, 128   # tile rows past M's end, a tile column past N's, more tiles than 3 blocks
    a = rng.integers(-3, 4, (m, k)).astype(np.float16)
    b = rng.integers(-3, 4, (k, n)).astype(np.float16)
    c = rng.integers(-3, 4, (m, n)).astype(np.float16)
    bias = rng.integers(-3, 4, n).astype(np.float16)
    out = np.full((m, n), np.nan, np.float16)
    host(a, b, out=out, c=c, beta=1.0, bias=bias, kernel="v5", config=config)
    assert np.array_equal(out.astype(np.float64), a.astype(np.float64) @ b + bias + c)


@pytest.mark.parametrize("config", TALL_CONFIGS, ids=lambda c: f"256x{c['DG_BN']}")
def test_256_row_tiles_stage_c_bias_and_d_by_halves(host, config):
    """256-row tiles: each consumer warpgroup computes two 64-row halves, each with its own staging
    unit, into which the loader warp brings a 16-bit C by TMA and from which D leaves by TMA; the
    bias is staged once per tile. Integer-exact, with edge tiles in M and N and several tiles per
    block: a half's C, rows of A or D from the other half or the other consumer is off by at least
    1 (the sweep's cases for these configs have an FP32 C or D, which are not staged)."""
    _tall_tiles_stage_c_bias_and_d_by_halves(host, config)


# The C loader's rows for a 256-row tile's halves, planted wrong: each consumer's second half gets
# the first's C.
def test_the_c_loaders_rows_of_the_halves_planted_wrong_fail(host, tmp_path):
    host.launcher.kernel_dir = host_harness.planted(
        tmp_path, jit.KERNEL_DIR, "v5_wgmma.cu", "const int row = walk.row(m0 + 64 * tile_block(cw, h));",
        "const int row = walk.row(m0 + 64 * tile_block(cw, 0));")
    with pytest.raises(AssertionError):
        _tall_tiles_stage_c_bias_and_d_by_halves(host, TALL_CONFIGS[0])


def _tma_stored(case) -> bool:
    """A case whose D V5 stores by TMA: 16-bit, with rows of whole 16 bytes (sweep.aligned_cases)."""
    return case.problem.out_dtype != "float32" and case in sweep.aligned_cases("v5")


def _tall(case) -> bool:
    """A case of 256-row tiles (two 64-row halves per consumer warpgroup)."""
    return dict(case.config).get("DG_BM") == 256


# Planted bugs: (file, the text, the bug, which of V5's host cases to run). A wgmma descriptor's k
# step and an M/N-major one's strides, the K tail, the accumulator rows a thread stages, the
# row-by-row store's guard and its pairs taken at any alignment (a misaligned 4-byte store traps on
# the host as on a GPU), a stage's announced bytes (a hang), the proxy fence before the TMA store
# reads the staged tile, the barrier before the warps read each other's staged rows, the chain's
# vector scale read one pair past N (values never stored: only the host's read check sees it), the
# __syncthreads that makes thread 0's mbarrier inits visible to the other threads.
PLANTED = {
    "v5_b_k_step_halved": ("v5_wgmma.cu", "? dg::smem_desc(b_s + ks * 32, 16, 1024)",
                           "? dg::smem_desc(b_s + ks * 16, 16, 1024)", lambda c: c.problem.b_layout != "row"),
    "v5_mn_major_strides_exchanged": ("v5_wgmma.cu", "return dg::smem_desc(addr, block_bytes, 1024);",
                                      "return dg::smem_desc(addr, 1024, block_bytes);", ALL),
    "v5_k_remainder_skipped": ("v5_wgmma.cu", "const int ktiles = (p.k + BK - 1) / BK;",
                               "const int ktiles = p.k / BK;", ALL),
    "v5_staged_row_of_the_other_half": ("v5_wgmma.cu", "const int r = 16 * warp + lane / 4 + 8 * ((i / 2) % 2);",
                                        "const int r = 16 * warp + lane / 4 + 8 * (i % 2);", ALL),
    "v5_row_store_guard_past_n": ("v5_wgmma.cu", "if (col0 + col + 1 < p.n) {", "if (col0 + col + 1 <= p.n) {", ALL),
    "v5_stage_bytes_short": ("v5_wgmma.cu", "dg::mbar_arrive_expect_tx(full(stage), stage_tx);",
                             "dg::mbar_arrive_expect_tx(full(stage), stage_tx - B_STAGE_BYTES);", ALL),
    # A decode-size A comes in a box of its rows rounded up to 8 (tma.a_box_rows): a stage that
    # expects a whole tile's rows of A waits for bytes that never come (a hang).
    "v5_stage_bytes_of_a_whole_a_tile": ("v5_wgmma.cu", "const unsigned stage_tx = STAGE_BYTES - (BM - a_rows) * BK * 2;",
                                         "const unsigned stage_tx = STAGE_BYTES;", ALL),
    "v5_fence_before_tma_store_removed": ("v5_wgmma.cu", "dg::fence_async_shared();\n", "\n", _tma_stored),
    "v5_row_store_pairs_at_any_alignment": ("v5_wgmma.cu", "dg::pairs_aligned<dg::out_t>(p.d, p.ldd);", "true;", ALL),
    "v5_scale_read_past_n": ("v5_wgmma.cu", "column_pair(col, col < q.n, cols[2 * j], cols[2 * j + 1]);",
                             "column_pair(col, col <= q.n, cols[2 * j], cols[2 * j + 1]);",
                             lambda c: c.problem.epilogue.get("scale") not in (None, "scalar")),
    "v5_barrier_after_mbarrier_inits_removed": ("v5_wgmma.cu", "        dg::mbar_fence_init();\n    }\n    __syncthreads();\n",
                                                "        dg::mbar_fence_init();\n    }\n", ALL),
    # 256-row tiles: a consumer's second half computed from, or stored to, its first half's rows
    "v5_tall_tile_a_rows_of_the_first_half": ("v5_wgmma.cu", "const int r = tile_block(c, h);",
                                              "const int r = tile_block(c, 0);", _tall),
    "v5_tall_tile_halves_overlap": ("v5_wgmma.cu", "return PINGPONG ? h : c * HALVES + h; }",
                                    "return PINGPONG ? h : c + h; }", _tall),
    "v5_barrier_before_row_stores_removed": ("v5_wgmma.cu",
                                             "dg::named_barrier(1 + c, 128);\n                    store_rows_coalesced(",
                                             "store_rows_coalesced(", ALL),
}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_a_planted_bug_fails_the_host_sweep(host, tmp_path, name):
    planted_bug_fails(host, tmp_path, "v5", *PLANTED[name])



def test_the_half_grid_performance_mutant_passes_the_host_sweep(host, tmp_path):
    """`mutate`'s performance.half-grid on V5's persistent walk is a slowdown and nothing else: with
    half the blocks walking every tile (the host's grid is 3 blocks: 2 walk, 1 idles), the problems
    of several tiles per block are still right (else it would be a bug for the test tier, not a
    performance mutant for the gate)."""
    host.launcher.kernel_dir = host_harness.mutated(tmp_path, jit.KERNEL_DIR, "v5_wgmma.cu", "performance.half-grid")
    cases = [c for c in host_cases("v5") if not c.config and c.problem.k
             and -(-c.problem.m // 128) * -(-c.problem.n // 256) >= 4][::6]   # the default 128 x 256 tiles
    assert len(cases) >= 12 and {c.oracle for c in cases} >= {"bound", "exact"}
    with np.errstate(over="ignore"):
        for i, case in enumerate(cases):
            sweep.run_case(case, np.random.default_rng(i), xp=np, gemm_fn=host, tight_end=True)

# V5's asynchronous hand-overs broken as the stress tier plants them (deepgemm.testing.stress): stages
# released before their wgmmas retire, staging units handed over or rewritten before the TMA stores
# have read them. On the host a wgmma reads its stage at the wait that covers it and a TMA store its
# unit at its wait (or the block's end), while TMA loads land when issued: every one shows, on the
# cases that exercise the hand-over (a residual C for the hand-over to the C loader, a 16-bit D for
# a rewrite of the staging tile).
ASYNC_CASES = {**{name: ALL for name in stress.STAGE_RELEASE_BUGS},
               **{name: lambda c: _tma_stored(c) and c.problem.epilogue["residual"] is not None
                  for name in stress.STAGING_BUGS},
               **{name: _tma_stored for name in stress.REWRITE_BUGS}}


def test_every_planted_hand_over_bug_runs_on_the_host_or_needs_clusters():
    """A new planted bug is run here unless it lives in split-K's hand-over between the blocks of a
    cluster, which the host does not run (the GPU's ledger tests and stress tier run those)."""
    assert set(ASYNC_CASES) | set(stress.SPLIT_K_BUGS) == set(stress.PLANTED)
    assert not set(ASYNC_CASES) & set(stress.SPLIT_K_BUGS)


@pytest.mark.parametrize("name", sorted(ASYNC_CASES))
def test_a_planted_hand_over_bug_fails_the_host_sweep(host, tmp_path, name):
    kernel, rewrite = stress.PLANTED[name]
    original = (jit.KERNEL_DIR / "v5_wgmma.cu").read_text()
    planted_bug_fails(host, tmp_path, kernel, "v5_wgmma.cu", original, rewrite(original), ASYNC_CASES[name])


# Planted bugs in V5's grouped build only: a TMA store of a group's last rows that runs into the next
# group's (contiguous modes) or past a masked group's count, and B's map read at group 0 for every
# group. Each must fail the grouped sweep on the host.
GROUPED_PLANTED = {
    "v5_group_tail_stored_by_tma": ("v5_wgmma.cu",
                                    "by_tma = by_tma && (p.group_mode == DG_GROUP_BATCH || m0 + rb + 64 <= q.m);", ""),
    "v5_group_b_at_group_0": ("v5_wgmma.cu",
                              "int z_b(const dg::KernelParams& p) const { return p.stride_b ? group.g : 0; }",
                              "int z_b(const dg::KernelParams& p) const { return 0 * p.stride_b; }"),
}


@pytest.mark.parametrize("name", sorted(GROUPED_PLANTED))
def test_a_planted_grouped_bug_fails_the_grouped_sweep_on_the_host(host, monkeypatch, tmp_path, name):
    rel, original, bug = GROUPED_PLANTED[name]
    host.launcher.kernel_dir = host_harness.planted(tmp_path, jit.KERNEL_DIR, rel, original, bug)
    with pytest.raises(AssertionError) as failure:
        grouped_sweep_on_the_host(host, monkeypatch, "v5")
    assert "did not build" not in str(failure.value), "the planted bug must compile, and fail when run"
