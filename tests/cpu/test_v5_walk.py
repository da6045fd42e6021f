"""CPU tier: V5's persistent tile walk over the groups (TileWalk, dg::GroupCursor, tile_coords) and
its stage-ring arithmetic (skip_stages), compiled for the host from the kernel's own source and run
against a model (tests/cpu/harness/v5_walk.cu): every tile of every group with rows visited exactly
once across the blocks, group rows clamped as documented, the ring landing where single steps do.
The GPU tier checks the products; this sees a wrong walk without a GPU."""
import shutil
import subprocess
from pathlib import Path

import pytest

from deepgemm import jit, registry, toolchain

HARNESS = Path(__file__).parent / "harness" / "v5_walk.cu"
# The default tile (128 x 256, 3 stages) and the 64-row tile with a deep ring.
CONFIGS = {"default": None, "64-row": {"DG_BM": 64, "DG_BN": 128, "DG_STAGES": 8}}


def _build(tmp_path: Path, kernel_dir: Path, config) -> Path:
    nvcc = toolchain.find_nvcc()
    if nvcc is None:
        pytest.fail("the CPU tier needs nvcc to build V5's walk harness (CUDA toolkit or the nvidia-cuda-nvcc wheel)")
    v5 = registry.get("v5")
    defines = registry.variant_defines(v5, config, "float16", "float16", True, False, registry.NO_EPILOGUE, True)
    exe = tmp_path / "v5_walk"
    cmd = [nvcc, "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-O1", f"-I{kernel_dir}",
           f"-I{kernel_dir / 'include'}", *[f"-D{k}={v}" for k, v in defines.items()], "-o", str(exe), str(HARNESS)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, f"the walk harness did not build:\n{done.stdout}\n{done.stderr}"
    return exe


def _run(exe: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_v5_walk_visits_every_tile_of_every_group_once(tmp_path, config):
    done = _run(_build(tmp_path, jit.KERNEL_DIR, config))
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-1000:]}"
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("checked ") and last.endswith(" tiles, 0 failures"), done.stdout[-2000:]
    assert int(last.split()[1]) > 1000


# Planted bugs: (file under kernels/, what it says, what the bug makes it say, what must be reported).
PLANTED = {
    "tile-column": ("v5_wgmma.cu", "    tn = r / rows;", "    tn = r / rows + (r % 7 == 6);", "run 0 times"),
    "seek-boundary": ("v5_wgmma.cu", "while (t >= end && group.next(p)) {", "while (t > end && group.next(p)) {",
                      "tile"),
    "sizes-unclamped": ("include/deepgemm/grouped.cuh", "rows = min(max(DG_GROUP_ROWS_AT(p.group_rows + g), 0), p.m - base);",
                        "rows = min(max(DG_GROUP_ROWS_AT(p.group_rows + g), 0), p.m);", "expected"),
    "ring-parity": ("v5_wgmma.cu", "phase ^= (stage / STAGES) & 1;", "phase ^= (stage / STAGES) != 0;", "skip_stages"),
}


@pytest.mark.parametrize("bug", PLANTED.keys())
def test_the_walk_harness_fails_a_planted_bug(tmp_path, bug):
    rel, original, planted, message = PLANTED[bug]
    kernels = tmp_path / "kernels"
    shutil.copytree(jit.KERNEL_DIR, kernels)
    source = kernels / rel
    text = source.read_text()
    assert text.count(original) == 1, f"{rel} no longer reads {original!r}: update the planted bug"
    source.write_text(text.replace(original, planted))
    done = _run(_build(tmp_path, kernels, CONFIGS["64-row"]))
    assert done.returncode != 0, f"the harness passed a planted bug ({bug}):\n{done.stdout[-1500:]}"
    assert message in done.stdout, done.stdout[-1500:]
