"""CPU tier: V4's operand loader (v4::load_tile) run on the host against a model of what it must do
(tests/cpu/harness/v4_loader.cu): every shared-memory slot written once with the right element or
zero, no cp.async with a byte count between 0 and 16 (memcheck counts all 16 as read), no 16-byte
copy of row padding, past the operand's end or from a misaligned address, no scalar load outside
the operand (guard pages), and the block raster's tiles one block each. It sees the loader's source
logic, not what nvcc makes of it on the device: the sanitizer samples on a GPU see that."""
import pytest

from deepgemm import jit
from host_harness import assert_passes, build, defines, planted, run

# The default tile (256x128x64, swizzled, 256 threads) and the smallest (64x64x32, padded rows, 128).
CONFIGS = {"default": None,
           "smallest": {"DG_BM": 64, "DG_BN": 64, "DG_BK": 32, "DG_WM": 32, "DG_WN": 32, "DG_STAGES": 4,
                        "DG_GROUP_M": 8, "DG_SWIZZLE": 0}}


def _loader(tmp_path, kernel_dir, config):
    return run(build(tmp_path, "v4_loader.cu", kernel_dir, defines("v4", config, "float32", True), "sm_80"))


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_v4_loader_loads_every_tile_exactly(tmp_path, config):
    assert_passes(_loader(tmp_path, jit.KERNEL_DIR, config), "loads", 100_000)   # every shape, edge and path


# Planted bugs: (what the source says, what the bug makes it say, what the harness must report).
PLANTED = {
    # a chunk across the inner edge copied by cp.async with its in-range byte count
    "straddling-chunk-by-cp-async": ("if (path == EDGE && !straddles) {", "if (path == EDGE) {", "cp.async of"),
    # the scalar path's element test one too wide: a read past a row's last element
    "scalar-element-guard": ("const unsigned lo = (row_ok && e < n_in)", "const unsigned lo = (row_ok && e <= n_in)",
                             None),
    # the EDGE path's row test one too wide: the row past the last one copied
    "edge-row-guard": ("const int n = (o + j * RSTEP < o_ext) ? n_in : 0;",
                       "const int n = (o + j * RSTEP <= o_ext) ? n_in : 0;", "outside the operand"),
}


@pytest.mark.parametrize("bug", PLANTED.keys())
def test_the_loader_harness_fails_a_planted_bug(tmp_path, bug):
    original, wrong, message = PLANTED[bug]
    done = _loader(tmp_path, planted(tmp_path, jit.KERNEL_DIR, "v4_mma.cu", original, wrong), CONFIGS["smallest"])
    assert done.returncode != 0, f"the harness passed a planted bug ({bug}):\n{done.stdout[-1500:]}"
    if message is None:   # a read outside the operand: the guard page stops it, or the values are wrong
        assert done.returncode < 0 or "holds" in done.stdout or "outside" in done.stdout, done.stdout[-1500:]
    else:
        assert message in done.stdout, done.stdout[-1500:]
