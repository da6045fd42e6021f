"""Build and run the host harnesses in tests/cpu/harness/: a kernel's own source compiled for the
host (with one variant's defines) beside a model of what its code must do."""
import os
import subprocess
import threading
from pathlib import Path

import pytest

from deepgemm import registry, toolchain

HARNESS_DIR = Path(__file__).parent / "harness"


def build(tmp_path: Path, harness: str, kernel_dir: Path, defines: dict, arch: str | None) -> Path:
    """harness (a file in tests/cpu/harness) compiled with nvcc against kernel_dir's sources: as CUDA
    for `arch`, or with arch None as plain host C++ (a harness that runs a __global__ kernel's body
    itself, with its own host forms of the CUDA built-ins)."""
    nvcc = toolchain.find_nvcc()
    if nvcc is None:
        pytest.fail(f"the CPU tier needs nvcc to build {harness} (CUDA toolkit or the nvidia-cuda-nvcc wheel)")
    exe = tmp_path / Path(harness).stem
    target = [f"-gencode=arch=compute_{arch[3:]},code={arch}"] if arch else ["-x", "c++"]
    cmd = [nvcc, "-std=c++17", *target, "-O1", f"-I{kernel_dir}",
           f"-I{kernel_dir / 'include'}", f"-I{HARNESS_DIR}", *[f"-D{k}={v}" for k, v in defines.items()],
           "-o", str(exe), str(HARNESS_DIR / harness)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, f"{harness} did not build:\n{done.stdout}\n{done.stderr}"
    return exe


def run(exe: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, timeout=300)


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


def mutated(tmp_path: Path, kernel_dir: Path, rel: str, operator: str) -> Path:
    """A copy of kernel_dir with the one mutant `mutate`'s `operator` makes of rel applied."""
    from deepgemm.mutate import operators
    text = (kernel_dir / rel).read_text()
    (mutant,) = operators.mutants_of(operators.Source(rel, text), [operators.OPERATORS[operator]])
    return planted(tmp_path, kernel_dir, rel, mutant.original, mutant.replacement)


def defines(kernel: str, config, out_dtype: str, b_row: bool, grouped: bool = False,
            epilogue=registry.NO_EPILOGUE) -> dict:
    spec = registry.get(kernel)
    return registry.variant_defines(spec, config, "float16", out_dtype, True, b_row, epilogue, grouped)


# Host builds: position-independent, and nothing but dg_host_launch exported, so the scheduler's
# calls stay inside each library (every variant links its own copy of the runtime).
HOST_FLAGS = ["-std=c++17", "-O1", "-Xcompiler", "-fPIC,-fvisibility=hidden"]
_runtime_lock = threading.Lock()


def _nvcc(what: str) -> str:
    nvcc = toolchain.find_nvcc()
    if nvcc is None:
        pytest.fail(f"the CPU tier needs nvcc to build {what} for the host (CUDA toolkit or the nvidia-cuda-nvcc wheel)")
    return nvcc


def host_runtime(out_dir: Path) -> Path:
    """harness/grid_host_runtime.cpp (the coroutine scheduler and the host forms of the instructions)
    compiled once into out_dir, named by the hash of the harness's sources, to link into each kernel."""
    import hashlib
    sources = sorted(HARNESS_DIR.glob("grid_host*"))
    key = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:20]
    obj = out_dir / f"grid_host_runtime-{key}.o"
    with _runtime_lock:
        if not obj.exists():
            tmp = obj.with_suffix(f".{os.getpid()}.tmp")
            cmd = [_nvcc("the host harness"), "-x", "c++", *HOST_FLAGS, "-c", "-o", str(tmp),
                   str(HARNESS_DIR / "grid_host_runtime.cpp")]
            done = subprocess.run(cmd, capture_output=True, text=True)
            assert done.returncode == 0, f"grid_host_runtime.cpp did not build:\n{done.stdout}\n{done.stderr[-3000:]}"
            os.replace(tmp, obj)
    return obj


def build_kernel_library(out_dir: Path, source: Path, defines: dict, kernel_dir: Path | None = None) -> Path:
    """A kernel's own source compiled as host C++ into a shared library (harness/grid_host.h: its CUDA
    threads as coroutines), with one variant's defines; `dg_host_launch(params, grid, block, smem)`
    runs it. Built once per source and defines (named by their hash) in out_dir."""
    import hashlib
    import json
    kernel_dir = kernel_dir or source.parent
    key = hashlib.sha256(json.dumps([str(source), source.read_text(), sorted(defines.items())]).encode()).hexdigest()[:20]
    lib = out_dir / f"{source.stem}-{key}.so"
    if lib.exists():
        return lib
    nvcc = _nvcc(source.name)
    runtime = host_runtime(out_dir)
    unit = out_dir / f"{source.stem}-{key}.cpp"
    unit.write_text(f'#include "grid_host.h"\n#include "{source}"\n#include "grid_host_launch.h"\n')
    tmp = lib.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    cmd = [nvcc, "-x", "c++", *HOST_FLAGS, "-shared", f"-I{HARNESS_DIR}", f"-I{kernel_dir}",
           f"-I{kernel_dir / 'include'}", *[f"-D{k}={v}" for k, v in defines.items()],
           "-o", str(tmp), str(unit), "-Xlinker", str(runtime), "-lpthread"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, f"{source.name} did not build for the host:\n{done.stdout}\n{done.stderr[-3000:]}"
    os.replace(tmp, lib)
    return lib
