"""Where the CUDA tools are: nvcc, NVRTC, nvdisasm, and the CUDA headers NVRTC needs.

Two compile routes, both producing a cubin for one exact arch (sm_80, sm_90a, ...):
  * ``nvcc``  - the toolkit compiler, run as a subprocess. The default where it exists, and the
    only route found safe for every kernel (NVRTC 13.0 crashed inside the process on one wgmma
    kernel).
  * ``nvrtc`` - the runtime compiler from pip (``nvidia-cuda-nvrtc``), for machines with CuPy
    but no toolkit. It too runs in a child process, so a compiler crash cannot kill the caller.
``DEEPGEMM_COMPILER=nvcc|nvrtc`` forces a route.
"""
from __future__ import annotations

import functools
import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from deepgemm import caches


class ToolchainError(RuntimeError):
    pass


def _site_nvidia_dirs() -> list[Path]:
    """The ``nvidia/`` namespace folders of pip's CUDA wheels on sys.path (cu12 and cu13 layouts)."""
    dirs = []
    for entry in sys.path:
        d = Path(entry) / "nvidia"
        if d.is_dir():
            dirs.append(d)
    return dirs


@functools.lru_cache(maxsize=None)
def find_nvcc() -> str | None:
    env = os.environ.get("DEEPGEMM_NVCC")
    if env:
        return env
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and Path(root, "bin", "nvcc").exists():
            return str(Path(root, "bin", "nvcc"))
    return None


@functools.lru_cache(maxsize=None)
def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"release (\d+\.\d+), V([\d.]+)", out)
    if not m:
        raise ToolchainError(f"cannot read the version of {nvcc}: {out!r}")
    return m.group(2)


@functools.lru_cache(maxsize=None)
def find_nvrtc_library() -> str | None:
    """Path of libnvrtc.so from pip's wheel (preferred: a known version) or the system."""
    env = os.environ.get("DEEPGEMM_NVRTC")
    if env:
        return env
    for d in _site_nvidia_dirs():
        for pattern in ("cu13/lib/libnvrtc.so.*", "cuda_nvrtc/lib/libnvrtc.so.*"):
            hits = sorted(p for p in glob.glob(str(d / pattern)) if "builtins" not in p and ".alt." not in p)
            if hits:
                return hits[0]
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root:
            hits = sorted(glob.glob(os.path.join(root, "lib64", "libnvrtc.so.*")))
            if hits:
                return hits[0]
    return None


@functools.lru_cache(maxsize=None)
def cuda_include_dir() -> str | None:
    """A folder holding cuda_fp16.h (NVRTC has no system headers; nvcc finds its own)."""
    for d in _site_nvidia_dirs():
        for sub in ("cu13/include", "cuda_runtime/include"):
            if (d / sub / "cuda_fp16.h").exists():
                return str(d / sub)
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root and Path(root, "include", "cuda_fp16.h").exists():
            return str(Path(root, "include"))
    return None


@functools.lru_cache(maxsize=None)
def find_nvdisasm() -> str | None:
    """The SASS disassembler: $DEEPGEMM_NVDISASM, PATH, the toolkit, or pip's nvidia-cuda-nvdisasm."""
    candidates = [os.environ.get("DEEPGEMM_NVDISASM"), shutil.which("nvdisasm")]
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root:
            candidates.append(os.path.join(root, "bin", "nvdisasm"))
    for d in _site_nvidia_dirs():
        candidates += [str(d / "cu13" / "bin" / "nvdisasm"), str(d / "cuda_nvdisasm" / "bin" / "nvdisasm")]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def compiler_route() -> str:
    forced = os.environ.get("DEEPGEMM_COMPILER")
    if forced:
        if forced not in ("nvcc", "nvrtc"):
            raise ToolchainError(f"DEEPGEMM_COMPILER must be 'nvcc' or 'nvrtc', got {forced!r}")
        return forced
    if find_nvcc():
        return "nvcc"
    if find_nvrtc_library():
        return "nvrtc"
    raise ToolchainError(
        "no CUDA compiler found: install the CUDA toolkit (nvcc) or `pip install nvidia-cuda-nvrtc "
        "nvidia-cuda-runtime` (set DEEPGEMM_NVCC / DEEPGEMM_NVRTC to point at one)")


@functools.lru_cache(maxsize=None)
def compiler_identity(route: str) -> str:
    """A string that changes whenever the compiler would produce different code (part of the cache key)."""
    if route == "nvcc":
        nvcc = find_nvcc()
        if not nvcc:
            raise ToolchainError("DEEPGEMM_COMPILER=nvcc but nvcc was not found (PATH, CUDA_HOME, DEEPGEMM_NVCC)")
        return f"nvcc-{nvcc_version(nvcc)}"
    lib = find_nvrtc_library()
    if not lib:
        raise ToolchainError("NVRTC not found: pip install nvidia-cuda-nvrtc (or set DEEPGEMM_NVRTC)")
    from deepgemm import _nvrtc_child
    return f"nvrtc-{_nvrtc_child.version(lib)}"


def _clear_found() -> None:
    for found in (find_nvcc, nvcc_version, find_nvrtc_library, cuda_include_dir, find_nvdisasm, compiler_identity):
        getattr(found, "cache_clear", lambda: None)()   # (tests stand in plain functions)


caches.register("toolchain", __name__, "the compiler, NVRTC, nvdisasm and CUDA headers found, and their versions",
                _clear_found)
