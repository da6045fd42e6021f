"""Build and run the host harnesses in tests/cpu/harness/: a kernel's own source compiled for the
host (with one variant's defines) beside a model of what its code must do."""
import subprocess
from pathlib import Path

import pytest

from deepgemm import registry, toolchain

HARNESS_DIR = Path(__file__).parent / "harness"


def build(tmp_path: Path, harness: str, kernel_dir: Path, defines: dict, arch: str) -> Path:
    """harness (a file in tests/cpu/harness) compiled with nvcc against kernel_dir's sources."""
    nvcc = toolchain.find_nvcc()
    if nvcc is None:
        pytest.fail(f"the CPU tier needs nvcc to build {harness} (CUDA toolkit or the nvidia-cuda-nvcc wheel)")
    exe = tmp_path / Path(harness).stem
    cmd = [nvcc, "-std=c++17", f"-gencode=arch=compute_{arch[3:]},code={arch}", "-O1", f"-I{kernel_dir}",
           f"-I{kernel_dir / 'include'}", f"-I{HARNESS_DIR}", *[f"-D{k}={v}" for k, v in defines.items()],
           "-o", str(exe), str(HARNESS_DIR / harness)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, f"{harness} did not build:\n{done.stdout}\n{done.stderr}"
    return exe


def run(exe: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)


def assert_passes(done: subprocess.CompletedProcess, what: str, at_least: int) -> None:
    """The harness found nothing wrong and checked at least `at_least` of `what`."""
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-1000:]}"
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("checked ") and last.endswith(f" {what}, 0 failures"), done.stdout[-2000:]
    assert int(last.split()[1]) > at_least


def planted(tmp_path: Path, kernel_dir: Path, rel: str, original: str, bug: str) -> Path:
    """A copy of kernel_dir with `original` in rel replaced by `bug` (which must occur once)."""
    import shutil
    copy = tmp_path / "kernels"
    shutil.copytree(kernel_dir, copy)
    source = copy / rel
    text = source.read_text()
    assert text.count(original) == 1, f"{rel} no longer reads {original!r}: update the planted bug"
    source.write_text(text.replace(original, bug))
    return copy


def defines(kernel: str, config, out_dtype: str, b_row: bool, grouped: bool = False) -> dict:
    spec = registry.get(kernel)
    return registry.variant_defines(spec, config, "float16", out_dtype, True, b_row, registry.NO_EPILOGUE, grouped)
