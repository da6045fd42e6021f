"""CPU tier: V5's persistent tile walk over the groups (TileWalk, dg::GroupCursor, tile_coords) and
its stage-ring arithmetic (skip_stages), compiled for the host from the kernel's own source and run
against a model (tests/cpu/harness/v5_walk.cu): every tile of every group with rows visited exactly
once across the blocks, group rows clamped as documented, the ring landing where single steps do.
And the walk of tile pairs with B shared by multicast (DG_CLUSTER_M = 2, harness/v5_cluster_walk.cu):
each cluster's two blocks on one tile column, one row apart, every tile once, a tile past M only
as the partner of an odd last row; and the host's grid for it (whole clusters, at most one block
per SM). The GPU tier checks the products; this sees a wrong walk without a GPU."""
import pytest

from deepgemm import jit, registry
from host_harness import assert_passes, build, defines, planted, run

# (config, epilogue): the default tile (128 x 256, 3 stages), and the 64-row tile with a deep ring
# built with a float16 bias and C, so that the groups' views of those are compiled and checked too
# (dtype code 0, where a `>= 0` test made `> 0` would drop them).
BUILDS = {"default": (None, registry.NO_EPILOGUE),
          "64-row": ({"DG_BM": 64, "DG_BN": 128, "DG_STAGES": 8}, registry.Epilogue(bias="float16", residual="float16"))}


def _walk(tmp_path, kernel_dir, build_name):
    config, epilogue = BUILDS[build_name]
    return run(build(tmp_path, "v5_walk.cu", kernel_dir,
                     defines("v5", config, "float16", False, grouped=True, epilogue=epilogue), "sm_90a"))


@pytest.mark.parametrize("build_name", BUILDS)
def test_v5_walk_visits_every_tile_of_every_group_once(tmp_path, build_name):
    assert_passes(_walk(tmp_path, jit.KERNEL_DIR, build_name), "tiles", 1000)


# Planted bugs: (file under kernels/, what it says, what the bug makes it say, what must be reported).
PLANTED = {
    "tile-column": ("v5_wgmma.cu", "    tn = r / rows;", "    tn = r / rows + (r % 7 == 6);", "run 0 times"),
    "seek-boundary": ("v5_wgmma.cu", "while (t >= end && group.next(p)) {", "while (t > end && group.next(p)) {",
                      "tile"),
    "batch-group-end": ("v5_wgmma.cu", "end = first + per;", "end = first + per - 1;", "run 0 times"),
    "batch-group-index": ("v5_wgmma.cu", "const int g = per > 0 ? t / per : p.groups;",
                          "const int g = per > 0 ? t / tiles_n : p.groups;", "tile"),
    "sizes-unclamped": ("include/deepgemm/grouped.cuh",
                        "rows = min(max(DG_GROUP_ROWS_AT(p.group_rows + g), 0), p.m - base);",
                        "rows = min(max(DG_GROUP_ROWS_AT(p.group_rows + g), 0), p.m);", "expected"),
    "ring-parity": ("v5_wgmma.cu", "phase ^= (stage / STAGES) & 1;", "phase ^= (stage / STAGES) != 0;", "skip_stages"),
    "view-a-row": ("include/deepgemm/grouped.cuh", "a_index(base, 0, p.lda)", "a_index(0, base, p.lda)", "view's A"),
    "view-c-dropped": ("include/deepgemm/grouped.cuh", "#if DG_C >= 0\n    q.c", "#if DG_C > 0\n    q.c", "view's C"),
}


@pytest.mark.parametrize("bug", PLANTED.keys())
def test_the_walk_harness_fails_a_planted_bug(tmp_path, bug):
    rel, original, wrong, message = PLANTED[bug]
    done = _walk(tmp_path, planted(tmp_path, jit.KERNEL_DIR, rel, original, wrong), "64-row")
    assert done.returncode != 0, f"the harness passed a planted bug ({bug}):\n{done.stdout[-1500:]}"
    assert message in done.stdout, done.stdout[-1500:]


# Multicast pairs: the default tile and 128-wide tiles (the plain build).
CLUSTER_CONFIGS = {"cluster-128x256": {"DG_CLUSTER_M": 2}, "cluster-128x128": {"DG_BN": 128, "DG_STAGES": 6, "DG_CLUSTER_M": 2}}


def _cluster_walk(tmp_path, kernel_dir, config):
    return run(build(tmp_path, "v5_cluster_walk.cu", kernel_dir, defines("v5", config, "float16", False), "sm_90a"))


@pytest.mark.parametrize("config", CLUSTER_CONFIGS.values(), ids=CLUSTER_CONFIGS.keys())
def test_v5_multicast_walk_gives_each_cluster_one_tile_column_and_every_tile_once(tmp_path, config):
    assert_passes(_cluster_walk(tmp_path, jit.KERNEL_DIR, config), "tiles", 5000)


CLUSTER_PLANTED = {
    "pair-rows": ("m0 = (tm * CLUSTER_M + cluster_row()) * BM;", "m0 = (tm + cluster_row()) * BM;", "run 2 times"),
    "pair-count": ("tiles_m(((p.m + BM - 1) / BM + CLUSTER_M - 1) / CLUSTER_M)", "tiles_m((p.m + BM - 1) / BM)",
                   "past M"),
}


@pytest.mark.parametrize("bug", CLUSTER_PLANTED.keys())
def test_the_multicast_walk_harness_fails_a_planted_bug(tmp_path, bug):
    original, wrong, message = CLUSTER_PLANTED[bug]
    done = _cluster_walk(tmp_path, planted(tmp_path, jit.KERNEL_DIR, "v5_wgmma.cu", original, wrong),
                         CLUSTER_CONFIGS["cluster-128x128"])
    assert done.returncode != 0, f"the harness passed a planted bug ({bug}):\n{done.stdout[-1500:]}"
    assert message in done.stdout, done.stdout[-1500:]


@pytest.mark.parametrize("m, n", [(1, 1), (128, 256), (129, 256), (4096, 4096), (512, 3072), (8192, 8192), (777, 1234)])
def test_the_multicast_grid_is_whole_clusters_at_most_one_block_per_sm(m, n):
    """registry's V5 grid with DG_CLUSTER_M = 2: an even number of blocks, no more than the SMs, and
    no more clusters than tile pairs (a cluster without a pair would walk nothing)."""
    from deepgemm import registry
    spec = registry.get("v5")
    cfg = spec.config_defines({"DG_CLUSTER_M": 2})
    grid = spec.grid(cfg, registry.Problem(m, n, 64), 132)
    pairs = -(-m // (2 * cfg["DG_BM"])) * -(-n // cfg["DG_BN"])
    assert grid[1:] == (1, 1) and grid[0] % 2 == 0 and 2 <= grid[0] <= 132 and grid[0] // 2 <= pairs
    assert grid[0] == 2 * min(pairs, 66)
