"""CPU tier: V3's chunk loader (dg::ChunkTile in tile_load.cuh: 16-byte loads where a chunk lies
whole inside an aligned operand, guarded 2-byte loads elsewhere, then the store into the padded
k-major float tile) run on the host for every thread of a block against a model
(tests/cpu/harness/v3_chunks.cu): no load of padding, past the operand or misaligned, every tile
slot written once with its element or zero."""
import pytest

from deepgemm import jit
from host_harness import assert_passes, build, defines, planted, run

# The default tile (128 x 128 x 16, 256 threads) and a 64-row one from the tuner's space.
CONFIGS = {"default": None, "64x128": {"DG_BM": 64, "DG_BN": 128, "DG_BK": 16, "DG_TM": 4, "DG_TN": 8}}


def _chunks(tmp_path, kernel_dir, config):
    return run(build(tmp_path, "v3_chunks.cu", kernel_dir, defines("v3", config, "float32", True), "sm_80"))


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_v3_chunk_loader_fills_every_tile_exactly(tmp_path, config):
    assert_passes(_chunks(tmp_path, jit.KERNEL_DIR, config), "chunks", 10_000)


# Planted bugs: (what tile_load.cuh says, what the bug makes it say, what the harness must report).
PLANTED = {
    "vector-past-k": ("const bool full = KCONTIG ? (gx < X && gk + 8 <= K) : (gk < K && gx + 8 <= X);",
                      "const bool full = KCONTIG ? (gx < X && gk < K) : (gk < K && gx + 8 <= X);", "16-byte load"),
    "scalar-guard": ("h[e] = (ex < X && ek < K) ?", "h[e] = (ex <= X && ek < K) ?", "2-byte load"),
    "store-rotation": ("s[(k + ((t + rot) & 7)) * LDS + x] = f[t];", "s[(k + t) * LDS + x] = f[t];", "holds"),
}


@pytest.mark.parametrize("bug", PLANTED.keys())
def test_the_chunk_harness_fails_a_planted_bug(tmp_path, bug):
    original, wrong, message = PLANTED[bug]
    kernels = planted(tmp_path, jit.KERNEL_DIR, "include/deepgemm/tile_load.cuh", original, wrong)
    done = _chunks(tmp_path, kernels, CONFIGS["default"])
    assert done.returncode != 0, f"the harness passed a planted bug ({bug}):\n{done.stdout[-1500:]}"
    assert message in done.stdout, done.stdout[-1500:]
