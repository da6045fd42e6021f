"""CPU tier: V5's persistent tile walk over the groups (TileWalk, dg::GroupCursor, tile_coords) and
its stage-ring arithmetic (skip_stages), compiled for the host from the kernel's own source and run
against a model (tests/cpu/harness/v5_walk.cu): every tile of every group with rows visited exactly
once across the blocks, group rows clamped as documented, the ring landing where single steps do.
The GPU tier checks the products; this sees a wrong walk without a GPU."""
import pytest

from deepgemm import jit
from host_harness import assert_passes, build, defines, planted, run

# The default tile (128 x 256, 3 stages) and the 64-row tile with a deep ring.
CONFIGS = {"default": None, "64-row": {"DG_BM": 64, "DG_BN": 128, "DG_STAGES": 8}}


def _walk(tmp_path, kernel_dir, config):
    return run(build(tmp_path, "v5_walk.cu", kernel_dir, defines("v5", config, "float16", False, grouped=True),
                     "sm_90a"))


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_v5_walk_visits_every_tile_of_every_group_once(tmp_path, config):
    assert_passes(_walk(tmp_path, jit.KERNEL_DIR, config), "tiles", 1000)


# Planted bugs: (file under kernels/, what it says, what the bug makes it say, what must be reported).
PLANTED = {
    "tile-column": ("v5_wgmma.cu", "    tn = r / rows;", "    tn = r / rows + (r % 7 == 6);", "run 0 times"),
    "seek-boundary": ("v5_wgmma.cu", "while (t >= end && group.next(p)) {", "while (t > end && group.next(p)) {",
                      "tile"),
    "sizes-unclamped": ("include/deepgemm/grouped.cuh",
                        "rows = min(max(DG_GROUP_ROWS_AT(p.group_rows + g), 0), p.m - base);",
                        "rows = min(max(DG_GROUP_ROWS_AT(p.group_rows + g), 0), p.m);", "expected"),
    "ring-parity": ("v5_wgmma.cu", "phase ^= (stage / STAGES) & 1;", "phase ^= (stage / STAGES) != 0;", "skip_stages"),
}


@pytest.mark.parametrize("bug", PLANTED.keys())
def test_the_walk_harness_fails_a_planted_bug(tmp_path, bug):
    rel, original, wrong, message = PLANTED[bug]
    done = _walk(tmp_path, planted(tmp_path, jit.KERNEL_DIR, rel, original, wrong), CONFIGS["64-row"])
    assert done.returncode != 0, f"the harness passed a planted bug ({bug}):\n{done.stdout[-1500:]}"
    assert message in done.stdout, done.stdout[-1500:]
