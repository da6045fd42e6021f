"""CPU tier: V4's operand loader (v4::load_tile) run on the host against a model of what it must do
(tests/cpu/harness/v4_loader.cu): every shared-memory slot written once with the right element or
zero, no cp.async with a byte count between 0 and 16 (memcheck counts all 16 as read), no 16-byte
copy of row padding or past the operand's end, no scalar load outside the operand (guard pages).
It sees the loader's source logic, not what nvcc makes of it on the device: the sanitizer samples
on a GPU see that."""
import shutil
import subprocess
from pathlib import Path

import pytest

from deepgemm import jit, registry, toolchain

HARNESS = Path(__file__).parent / "harness" / "v4_loader.cu"
# The default tile (256x128x64, swizzled, 256 threads) and the smallest (64x64x32, padded rows, 128).
CONFIGS = {"default": None,
           "smallest": {"DG_BM": 64, "DG_BN": 64, "DG_BK": 32, "DG_WM": 32, "DG_WN": 32, "DG_STAGES": 4,
                        "DG_GROUP_M": 8, "DG_SWIZZLE": 0}}


def _build(tmp_path: Path, kernel_dir: Path, config) -> Path:
    nvcc = toolchain.find_nvcc()
    if nvcc is None:
        pytest.fail("the CPU tier needs nvcc to build V4's loader harness (CUDA toolkit or the nvidia-cuda-nvcc wheel)")
    spec = next(s for s in registry.specs(purpose=None) if s.name == "v4")
    defines = registry.variant_defines(spec, config, "float16", "float32", True, True)
    exe = tmp_path / "v4_loader"
    cmd = [nvcc, "-std=c++17", "-arch=sm_80", "-O1", f"-I{kernel_dir}", f"-I{kernel_dir / 'include'}",
           *[f"-D{k}={v}" for k, v in defines.items()], "-o", str(exe), str(HARNESS)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, f"the loader harness did not build:\n{done.stdout}\n{done.stderr}"
    return exe


def _run(exe: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_v4_loader_loads_every_tile_exactly(tmp_path, config):
    done = _run(_build(tmp_path, jit.KERNEL_DIR, config))
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-1000:]}"
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("checked ") and last.endswith(" loads, 0 failures"), done.stdout[-2000:]
    assert int(last.split()[1]) > 100_000   # the sweep ran: every shape, edge and path


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
    original, planted, message = PLANTED[bug]
    kernels = tmp_path / "kernels"
    shutil.copytree(jit.KERNEL_DIR, kernels)
    source = kernels / "v4_mma.cu"
    text = source.read_text()
    assert text.count(original) == 1, f"the loader no longer reads {original!r}: update the planted bug"
    source.write_text(text.replace(original, planted))
    done = _run(_build(tmp_path, kernels, CONFIGS["smallest"]))
    assert done.returncode != 0, f"the harness passed a planted bug ({bug}):\n{done.stdout[-1500:]}"
    if message is None:   # a read outside the operand: the guard page stops it, or the values are wrong
        assert done.returncode < 0 or "holds" in done.stdout or "outside" in done.stdout, done.stdout[-1500:]
    else:
        assert message in done.stdout, done.stdout[-1500:]
