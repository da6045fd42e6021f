"""CPU tier, V4's batched/grouped build (DG_GROUPED = 1, kernels/v4_mma.cu): it compiles clean
(no spills, no local memory, V4's SASS) for both archs; its launch grid (registry._mma_grid) and a
host model of which block computes which tile of which group (registry.v4_block_map) cover every
tile of every group exactly once, whatever the group sizes; and the plain build is left as it was
(the grouped entry point and its group fields compile away)."""
import dataclasses
import random
import re

import pytest

import deepgemm
from deepgemm import api, binary, groups, jit, registry, static_checks
from deepgemm.params import GROUPED_PARAMS_DTYPE, PARAMS_DTYPE
from deepgemm.registry import Groups, Problem
from test_api import F, captured, gpus  # noqa: F401  (fakes and fixtures)

SPEC = registry.get("v4")
DEFAULT = SPEC.config_defines(None)
SMALL = SPEC.config_defines(dict(DEFAULT, DG_BM=64, DG_BN=64, DG_BK=32, DG_WM=32, DG_WN=32, DG_STAGES=4,
                                 DG_SWIZZLE=0))
ARCHS = ("sm_80", "sm_90a")


# ---------------------------------------------------------------------------------------------
# The grouped build compiles clean

@pytest.fixture(scope="module")
def builds(sweep_tier):
    """arch -> [(variant, plain build, grouped build)] for what the static checks build of the plain
    kernel: the coverage variants (f16 and bf16 in, f16, bf16 and fp32 out, all four layouts, the
    whole epilogue chain on rc); --sweep=full: every dtype and layout, and every config_space entry."""
    todo = [v for arch in ARCHS for v in static_checks.variants(SPEC, arch, full=sweep_tier == "full")]

    def both(v):
        plain = v.compile()
        grouped = registry.compile_variant(SPEC, v.arch, v.in_dtype, v.out_dtype, v.a_row, v.b_row, v.epilogue,
                                           dict(v.config) or None, grouped=True)
        return v, plain, grouped
    out = {arch: [] for arch in ARCHS}
    for v, plain, grouped in jit.compile_many([lambda v=v: both(v) for v in todo]):
        out[v.arch].append((v, plain, grouped))
    return out


def test_coverage_variants_reach_every_dtype_layout_and_the_chain():
    vs = static_checks.coverage_variants(SPEC, "sm_80")
    assert {(v.a_row, v.b_row) for v in vs} == set(static_checks.LAYOUTS)
    assert {v.in_dtype for v in vs} == {"float16", "bfloat16"} and "float32" in {v.out_dtype for v in vs}
    assert static_checks.FULL_EPILOGUE in {v.epilogue for v in vs}


@pytest.mark.parametrize("arch", ARCHS)
def test_grouped_build_passes_the_static_checks(builds, arch):
    problems = []
    for v, _, grouped in builds[arch]:
        assert ".grouped[" in grouped.name
        r = static_checks.check(dataclasses.replace(v, grouped=True), grouped)   # spills, local memory, smem, HMMA/LDSM/LDGSTS present
        problems += [f"{v} (grouped): {p}" for p in r.problems]
        assert r.resources["registers"] > 0
    assert not problems, "\n".join(problems)


def _param_reads(cubin_path, arch: str) -> set[int]:
    """Offsets into the kernel's parameter (GemmParams or GroupedGemmParams) of the constants the
    SASS reads (the parameters start at c[0x0][0x160] up to sm_89, at c[0x0][0x210] from sm_90)."""
    base = 0x160 if arch == "sm_80" else 0x210
    sass = binary.dump_sass(cubin_path)
    return {int(x, 16) - base for x in re.findall(r"c\[0x0\]\[(0x[0-9a-f]+)\]", sass)
            if 0 <= int(x, 16) - base < GROUPED_PARAMS_DTYPE.itemsize}


GROUP_FIELDS = range(GROUPED_PARAMS_DTYPE.fields["groups"][1], GROUPED_PARAMS_DTYPE.itemsize)


@pytest.mark.parametrize("arch", ARCHS)
def test_plain_build_never_reads_the_group_fields(builds, arch):
    """The plain entry point takes GemmParams alone: nothing past it in its SASS. The grouped build
    reads the group fields of GroupedGemmParams (so the check sees parameter reads where they are)."""
    assert PARAMS_DTYPE.itemsize <= GROUP_FIELDS.start
    for v, plain, grouped in builds[arch]:
        assert not _param_reads(plain.cubin_path, arch) & set(GROUP_FIELDS), v
        assert GROUPED_PARAMS_DTYPE.fields["group_mode"][1] in _param_reads(grouped.cubin_path, arch), v


@pytest.mark.parametrize("arch", ARCHS)
def test_both_builds_run_the_same_main_loop(builds, arch):
    """block_tile is inlined once into either entry point: the same tensor-core, ldmatrix and
    cp.async instructions, so the grouped build's main loop is the plain one's."""
    for v, plain, grouped in builds[arch]:
        fp, fg = jit.sass_features(plain.cubin_path), jit.sass_features(grouped.cubin_path)
        for name in ("HMMA", "LDSM", "LDGSTS"):
            assert fp[name] == fg[name] > 0, (v, name, fp[name], fg[name])


def test_report_variant_stays_ungrouped():
    spec = registry.get("fp16acc_mma")
    assert not spec.grouped and spec.grid is None and SPEC.grouped
    with pytest.raises(ValueError, match="has no batched/grouped build"):
        registry.compile_variant(spec, "sm_80", "float16", "float16", True, False, grouped=True)


# ---------------------------------------------------------------------------------------------
# The launch grid

def _problem(m, n, groups=None):
    return Problem(m, n, 64, groups=groups)


def test_plain_grid_is_one_block_per_tile():
    assert registry._mma_grid(DEFAULT, _problem(1000, 300), 132) == (3, 4, 1)   # 256 x 128 tiles
    assert registry._mma_grid(SMALL, _problem(64, 65), 132) == (2, 1, 1)
    assert registry._mma_grid(DEFAULT, _problem(256 * 65535, 1), 132) == (1, 65535, 1)


def test_plain_grid_keeps_the_m_limit_message():
    with pytest.raises(ValueError, match=r"^a: M=16777216 needs 65536 row tiles for kernel 'v4', over CUDA's "
                                         r"grid limit of 65535; split the call along M$"):
        registry._mma_grid(DEFAULT, _problem(256 * 65536, 8), 132)


def test_launch_uses_the_grid_hook_and_its_m_limit(captured):
    deepgemm.gemm(F(1000, 48), F(300, 48).T, kernel="v4", config=DEFAULT)
    assert captured[0]["grid"] == (3, 4, 1) and captured[0]["block"] == (256, 1, 1)
    with pytest.raises(ValueError, match=r"^a: M=16777216 needs 65536 row tiles for kernel 'v4', over CUDA's "
                                         rf"grid limit of {registry.GRID_YZ_MAX}; split the call along M$"):
        deepgemm.gemm(F(256 * 65536, 8), F(8, 8), kernel="v4", config=DEFAULT)
    assert len(captured) == 1


@pytest.mark.parametrize("mode", ["batch", "masked"])
def test_batched_grid_has_one_slice_per_group(mode):
    assert registry._mma_grid(DEFAULT, _problem(1000, 300, Groups(mode, 7)), 132) == (3, 4, 7)
    assert registry._mma_grid(SMALL, _problem(1, 64, Groups(mode, 65535)), 132) == (1, 1, 65535)
    with pytest.raises(ValueError, match=r"^a: 65536 groups need 65536 grid slices \(grid.z\) for kernel 'v4', "
                                         r"over CUDA's grid limit of 65535"):
        registry._mma_grid(SMALL, _problem(1, 64, Groups(mode, 65536)), 132)
    with pytest.raises(ValueError, match=r"^a: M=16777216 rows per group need 65536 row tiles"):
        registry._mma_grid(DEFAULT, _problem(256 * 65536, 64, Groups(mode, 2)), 132)


@pytest.mark.parametrize("mode", ["sizes", "offsets"])
def test_contiguous_grid_adds_a_tile_row_per_group(mode):
    assert registry._mma_grid(DEFAULT, _problem(1000, 300, Groups(mode, 7)), 132) == (3, 4 + 7, 1)
    assert registry._mma_grid(DEFAULT, _problem(0, 300, Groups(mode, 3)), 132) == (3, 3, 1)
    assert registry._mma_grid(SMALL, _problem(64 * 65000, 64, Groups(mode, 535)), 132) == (1, 65535, 1)
    with pytest.raises(ValueError, match=r"^a: M=4160000 rows in 536 groups need 65536 row tiles"):
        registry._mma_grid(SMALL, _problem(64 * 65000, 64, Groups(mode, 536)), 132)


# ---------------------------------------------------------------------------------------------
# Which block computes which tile (the host model of the grouped entry point)

def _spans(mode, rows, m):
    """Each group's (first row, rows) from plain group sizes, as the device sees them."""
    if mode == "offsets":
        offsets = [0]
        for r in rows:
            offsets.append(offsets[-1] + r)
        return offsets, groups.row_ranges(mode, offsets, len(rows), m)
    return rows, groups.row_ranges(mode, rows, len(rows), m)


def _check_cover(cfg, mode, rows, m, n):
    """Every tile of every group is computed by exactly one block of the grid; every other block
    exits; no tile reaches past its group's rows, M or N."""
    bm, bn = cfg["DG_BM"], cfg["DG_BN"]
    device_rows, spans = _spans(mode, rows, m)
    problem = _problem(m, n, Groups(mode, len(rows)))
    tiles = [t for t in registry.v4_block_map(cfg, problem, device_rows).values() if t is not None]
    want = [(g, r, c) for g, (_, count) in enumerate(spans) for r in range(-(-count // bm))
            for c in range(-(-n // bn))]
    assert sorted(tiles) == want, (mode, rows, m)
    for g, r, _ in tiles:
        base, count = spans[g]
        assert r * bm < count and base + r * bm < m
    return tiles


def _patterns(rng, bm):
    """Group sizes (rows per group): all empty, one huge, many of size 1, sizes around the tile
    edge, and random mixes."""
    yield [0, 0, 0]
    yield [0] * 9 + [7 * bm + 3] + [0] * 5
    yield [1] * 70
    yield [bm - 1, bm, bm + 1, 2 * bm - 1, 2 * bm, 2 * bm + 1, 1]
    yield [bm] * 5
    for _ in range(30):
        g = rng.randint(1, 40)
        yield [rng.choice([0, 1, bm - 1, bm, bm + 1, rng.randint(0, 3 * bm)]) for _ in range(g)]


@pytest.mark.parametrize("cfg", [SMALL, DEFAULT, dict(SMALL, DG_GROUP_M=3), dict(SMALL, DG_GROUP_M=1)],
                         ids=["64x64", "256x128", "group_m3", "group_m1"])
@pytest.mark.parametrize("mode", ["sizes", "offsets"])
def test_contiguous_groups_are_covered_once(cfg, mode):
    rng = random.Random(f"{mode}{cfg['DG_BM']}{cfg['DG_GROUP_M']}")
    for rows in _patterns(rng, cfg["DG_BM"]):
        m = sum(rows)
        n = rng.choice([1, cfg["DG_BN"], 3 * cfg["DG_BN"] + 5])
        _check_cover(cfg, mode, rows, m, n)
        # the host may pass more rows than the groups hold (a buffer with spare rows): same tiles
        _check_cover(cfg, mode, rows, m + rng.randint(1, 2 * cfg["DG_BM"]), n)


@pytest.mark.parametrize("n", [64, 3 * 64 + 5])
def test_the_contiguous_bound_is_reached(n):
    """ceil(M/BM) + G - 1 tile rows are needed when every group straddles a tile edge: the grid's
    ceil(M/BM) + G is one row more, never less. 19 tile rows in GROUP_M = 8 leave the raster's
    last group 3 rows high, two of them real tiles: with 4 tile columns, a raster that took that
    group as 8 rows high would leave columns uncomputed."""
    bm = SMALL["DG_BM"]
    rows = [bm + 1] * 9
    tiles = _check_cover(SMALL, "sizes", rows, sum(rows), n)
    assert len(tiles) == 2 * 9 * -(-n // 64) and 2 * 9 == -(-sum(rows) // bm) + 9 - 1


@pytest.mark.parametrize("mode", ["sizes", "offsets", "masked"])
def test_sizes_past_m_are_clamped_not_trusted(mode):
    """Device values the host never checked (negative, past M, offsets out of order): every block
    still stays inside the grid and computes only rows of its clamped group inside M."""
    rng = random.Random(mode)
    bm = SMALL["DG_BM"]
    for _ in range(40):
        g, m = rng.randint(1, 12), rng.randint(0, 6 * bm)
        values = [rng.randint(-bm, 4 * bm) for _ in range(g + 1)]
        problem = _problem(m, 130, Groups(mode, g))
        spans = groups.row_ranges(mode, values, g, m)
        for (x, y, z), tile in registry.v4_block_map(SMALL, problem, values).items():
            if tile is not None:
                group, r, c = tile
                base, count = spans[group]
                assert 0 <= r * bm < count and 0 <= base + r * bm < m and c * 64 < 130


@pytest.mark.parametrize("cfg", [SMALL, DEFAULT], ids=["64x64", "256x128"])
@pytest.mark.parametrize("mode", ["batch", "masked"])
def test_batched_groups_are_covered_once(cfg, mode):
    rng = random.Random(mode)
    bm, bn = cfg["DG_BM"], cfg["DG_BN"]
    for _ in range(20):
        g, m, n = rng.randint(1, 9), rng.randint(1, 4 * bm), rng.randint(1, 3 * bn)
        counts = [rng.choice([0, 1, bm - 1, bm, bm + 1, m, m + 5, rng.randint(0, m)]) for _ in range(g)]
        problem = _problem(m, n, Groups(mode, g))
        tiles = [t for t in registry.v4_block_map(cfg, problem, counts).values() if t is not None]
        rows = [m if mode == "batch" else min(c, m) for c in counts]
        assert sorted(tiles) == [(z, r, c) for z in range(g) for r in range(-(-rows[z] // bm))
                                 for c in range(-(-n // bn))]
