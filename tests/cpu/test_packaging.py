"""The wheel carries every kernel source and header and the tuned tables, and an installed copy,
with no repository around it, finds its kernels and compiles one."""
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from deepgemm import registry

REPO = Path(__file__).resolve().parents[2]


def _can_build_wheels() -> bool:
    """pip, and setuptools >= 70.1 (bdist_wheel built in) or the wheel package; looked up, not
    imported (importing setuptools here would fight pytest's own distutils)."""
    from importlib import metadata
    try:
        metadata.version("pip")
        major, minor = (int(x) for x in metadata.version("setuptools").split(".")[:2])
    except (metadata.PackageNotFoundError, ValueError):
        return False
    if (major, minor) >= (70, 1):
        return True
    try:
        return bool(metadata.version("wheel"))
    except metadata.PackageNotFoundError:
        return False


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    if not _can_build_wheels():   # .[test] brings both; a bare image may lack them
        pytest.skip("building the wheel needs pip and setuptools>=70.1 (or the wheel package): pip install -e .[test]")
    # Built from a copy, so setuptools' build/ and egg-info never land in the repository.
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for name in ("deepgemm", "kernels"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           str(src), "-w", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (built,) = out.glob("deepgemm-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "-q",
                           "--target", str(target), str(wheel)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return target


def test_wheel_holds_every_kernel_source_header_and_table(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {f"deepgemm/kernels/{spec.file}" for spec in registry.specs(purpose=None)}
    on_disk = {"deepgemm/kernels/" + p.relative_to(REPO / "kernels").as_posix()
               for p in (REPO / "kernels").rglob("*") if p.suffix in (".cu", ".cuh")}
    headers = {n for n in on_disk if n.startswith("deepgemm/kernels/include/deepgemm/")}
    tables = {f"deepgemm/configs/{p.name}" for p in (REPO / "deepgemm" / "configs").glob("*.json")}
    assert sources and headers and tables and "deepgemm/kernels/stage_copy.cu" in on_disk
    missing = (sources | on_disk | tables) - names
    assert not missing, f"not in {wheel.name}: {sorted(missing)}"


def _run_installed(installed: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "DEEPGEMM_KERNEL_DIR"}
    env.update(PYTHONPATH=str(installed), DEEPGEMM_CACHE_DIR=str(cwd / "cache"))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env)


def test_an_installed_copy_compiles_a_kernel_from_its_own_files(installed, tmp_path):
    where = _run_installed(installed, tmp_path, "-c",
                           "import deepgemm, deepgemm.jit as j; print(deepgemm.__file__); print(j.KERNEL_DIR)")
    assert where.returncode == 0, where.stderr
    package, kernels = where.stdout.split()
    assert Path(package).is_relative_to(installed) and Path(kernels) == installed / "deepgemm" / "kernels"
    # A fresh compile cache: the cubins come from the installed sources, not from earlier builds.
    proc = _run_installed(installed, tmp_path, "-m", "deepgemm", "static", "--kernels", "v0", "--arch", "sm_80")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4/4 variants pass the static checks" in proc.stdout
    assert len(list((tmp_path / "cache").glob("*.cubin"))) == 4


def test_an_installed_copy_asks_for_the_repository_folders_it_lacks(installed, tmp_path):
    proc = _run_installed(installed, tmp_path, "-m", "deepgemm", "regress", "history")
    assert proc.returncode == 2 and "no regressions folder" in proc.stderr and "--regressions" in proc.stderr
    proc = _run_installed(installed, tmp_path, "-m", "deepgemm", "report", "accuracy", "--quick")
    assert proc.returncode == 2 and "required: --out" in proc.stderr
