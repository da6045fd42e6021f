"""Facts about CUDA devices, asked of the driver once per device and remembered here (the cache
"device" of deepgemm.caches; deepgemm.clear_caches() forgets them).

Names: `cc` is a compute capability as an int (90 for 9.0); `arch` a compile target ('sm_90a');
`sm_count` the number of streaming multiprocessors.

  gpu_available()           (True, name of device 0) or (False, why not); never raises
  current()                 the current device's id, or None without a usable GPU
  compute_capability(dev)   90
  sm_count(dev)             132
  name(dev)                 'NVIDIA H200'
  summary(dev)              {'name', 'cc': '9.0', 'sm_count'}: what a tuned table must match; None without a GPU
  identity(dev)             summary plus driver/CUDA/CuPy versions, clocks, L2 and memory size: what
                            benchmark results and tuned tables record
  arch_for_cc(cc)           'sm_90a' for 90, else 'sm_XX'
  gpu_slug(name)            'NVIDIA_H200': a file name for a GPU model

Importable without CuPy: CuPy is imported only when a device is asked about.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

from deepgemm import caches

_lock = threading.Lock()
_facts: dict[int, dict] = {}          # device -> {"name", "cc", "sm_count"}
_identities: dict[int, dict] = {}     # device -> identity()
_available: list = []                 # [gpu_available()'s answer], once asked


def _cupy():
    import cupy  # deferred: the package must import on machines without CuPy
    return cupy


def arch_for_cc(cc: int) -> str:
    """The exact compile target for a device: Hopper gets sm_90a so wgmma/setmaxnreg are allowed."""
    return "sm_90a" if cc == 90 else f"sm_{cc}"


def cc_for_arch(arch: str) -> int:
    """The compute capability a compile target is for ('sm_90a' -> 90); ValueError naming `arch`
    for anything else."""
    m = re.fullmatch(r"sm_(\d+)a?", str(arch))
    if not m:
        raise ValueError(f"arch: {arch!r} is not a CUDA target such as 'sm_80' or 'sm_90a'")
    return int(m.group(1))


def gpu_slug(name: str) -> str:
    """A filesystem-safe folder/file name for a GPU model: 'NVIDIA H200' -> 'NVIDIA_H200'."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", name.strip()).strip("._")
    return slug or "unknown_gpu"


def _decode(name) -> str:
    return name.decode() if isinstance(name, bytes) else str(name)


def gpu_available() -> tuple[bool, str]:
    """(True, the name of device 0) when CuPy sees a CUDA device, else (False, why not)."""
    if not _available:
        _available.append(_probe())
    return _available[0]


# Where an NVIDIA driver shows itself (Linux, containers given a GPU, WSL); nvidia-smi elsewhere.
_DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/dxg")


def _cupy_hint() -> str:
    """What to do about a missing CuPy: nothing on a machine without an NVIDIA driver; else the
    pip line for a source checkout, or for an installed package (where `-e .` means nothing)."""
    if not (shutil.which("nvidia-smi") or any(os.path.exists(p) for p in _DRIVER_PATHS)):
        return "no NVIDIA driver here either"
    from deepgemm import cli
    return "pip install -e '.[cuda13]'" if cli.repo_path() is not None else "pip install 'deepgemm[cuda13]'"


def _probe() -> tuple[bool, str]:
    try:
        cupy = _cupy()
    except Exception as exc:  # ImportError, or a broken CUDA install raising on import
        return False, f"CuPy is not importable ({exc.__class__.__name__}: {exc}); {_cupy_hint()}"
    try:
        if not cupy.cuda.is_available():
            return False, "no CUDA device visible to CuPy"
        return True, _decode(cupy.cuda.runtime.getDeviceProperties(0)["name"])
    except Exception as exc:
        return False, f"CUDA is not usable ({exc.__class__.__name__}: {exc})"


def current() -> int | None:
    """The id of CuPy's current device (not remembered: it is per thread and changes), or None
    when there is no usable GPU."""
    if not gpu_available()[0]:
        return None
    try:
        return _cupy().cuda.Device().id
    except Exception:
        return None


def bind_context() -> None:
    """Make the current device's primary context current on this thread (cudaSetDevice does, from
    CUDA 12 on). The runtime binds a thread's context lazily, at its first runtime call, so a thread
    whose first CUDA work is a driver call (a replayed launch, encoding V5's tensor maps) has none;
    CuPy binds it before its own launches."""
    cupy = _cupy()
    cupy.cuda.runtime.setDevice(cupy.cuda.runtime.getDevice())


def _query(device: int) -> dict:
    """Name, compute capability and SM count, from the driver (one call)."""
    props = _cupy().cuda.runtime.getDeviceProperties(device)
    return {"name": _decode(props["name"]), "cc": int(props["major"]) * 10 + int(props["minor"]),
            "sm_count": int(props["multiProcessorCount"])}


def _get(device: int) -> dict:
    facts = _facts.get(device)
    if facts is None:
        with _lock:
            facts = _facts.get(device)
            if facts is None:
                facts = _facts[device] = dict(_query(device))
    return facts


def compute_capability(device: int) -> int:
    """The device's compute capability as an int: 90 for 9.0."""
    return _get(device)["cc"]


def sm_count(device: int) -> int:
    """How many streaming multiprocessors the device has."""
    return _get(device)["sm_count"]


def name(device: int) -> str:
    return _get(device)["name"]


def summary(device: int | None) -> dict | None:
    """{'name', 'cc': '9.0', 'sm_count'} of a device: the identity a tuned table must match.
    None for device None or when the device cannot be asked (no GPU)."""
    if device is None:
        return None
    try:
        facts = _get(device)
    except Exception:
        return None
    cc = facts["cc"]
    return {"name": facts["name"], "cc": f"{cc // 10}.{cc % 10}", "sm_count": facts["sm_count"]}


def _cuda_version_string(version: int) -> str:
    return f"{version // 1000}.{(version % 1000) // 10}"  # 13000 -> '13.0'


def _nvidia_driver_version() -> str | None:
    """The kernel driver's version ('580.159.04'); the CUDA API only reports its CUDA level."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
        match = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?([0-9][0-9.]+)", text)
        if match:
            return match.group(1)
    except OSError:
        pass
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.split()
        return out[0] if out else None
    except (OSError, subprocess.SubprocessError):
        return None


def identity(device: int | None = None) -> dict[str, Any]:
    """Identity of a GPU (default: CuPy's current device), for storing next to benchmark results
    and tuned tables: name, sm_count, cc ('9.0'), driver and CUDA versions, clocks, L2 and memory."""
    cupy = _cupy()
    dev = cupy.cuda.Device(device)
    found = _identities.get(dev.id)
    if found is not None:
        return dict(found)
    runtime = cupy.cuda.runtime
    props = runtime.getDeviceProperties(dev.id)
    attrs = dev.attributes

    def mhz(key):  # attributes are in kHz; CUDA 13 dropped the clock fields from cudaDeviceProp
        value = attrs.get(key)
        return round(value / 1000) if value else None

    found = {
        "name": _decode(props["name"]),
        "sm_count": attrs.get("MultiProcessorCount", props.get("multiProcessorCount")),
        "cc": f"{attrs.get('ComputeCapabilityMajor', props.get('major'))}."
              f"{attrs.get('ComputeCapabilityMinor', props.get('minor'))}",
        "driver_version": _nvidia_driver_version(),
        "cuda_driver_version": _cuda_version_string(runtime.driverGetVersion()),
        "cuda_runtime_version": _cuda_version_string(runtime.runtimeGetVersion()),
        "sm_clock_max_mhz": mhz("ClockRate"),
        "mem_clock_max_mhz": mhz("MemoryClockRate"),
        "l2_bytes": attrs.get("L2CacheSize", props.get("l2CacheSize")),
        "memory_bytes": props.get("totalGlobalMem"),
        "cupy_version": cupy.__version__,
    }
    _identities[dev.id] = found
    return dict(found)


def clear() -> None:
    """Forget every device fact (the next question asks the driver again)."""
    with _lock:
        _facts.clear()
        _identities.clear()
        _available.clear()


caches.register("device", __name__, "device facts per device: name, compute capability, SM count, "
                "identity; whether a GPU is available", clear)
