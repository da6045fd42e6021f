"""Device facts in one place (deepgemm.device): asked of the driver once per device, remembered
until deepgemm.clear_caches(), and the names other modules used to export still answer."""
import types

import pytest

import deepgemm
from deepgemm import bench, caches, cli, device, dispatch, registry


@pytest.fixture
def queries(monkeypatch):
    asked = []

    def query(dev):
        asked.append(dev)
        if dev == 0:
            return {"name": "NVIDIA H200", "cc": 90, "sm_count": 132}
        if dev == 1:
            return {"name": "NVIDIA A100-SXM4-80GB", "cc": 80, "sm_count": 108}
        raise RuntimeError("invalid device ordinal")
    monkeypatch.setattr(device, "_query", query)
    caches.clear("device")
    yield asked
    caches.clear("device")


def test_facts_are_asked_once_per_device(queries):
    assert (device.compute_capability(0), device.sm_count(0), device.name(0)) == (90, 132, "NVIDIA H200")
    assert device.summary(0) == {"name": "NVIDIA H200", "cc": "9.0", "sm_count": 132}
    assert device.compute_capability(1) == 80 and device.sm_count(1) == 108
    assert queries == [0, 1]
    deepgemm.clear_caches()
    device.sm_count(0)
    assert queries == [0, 1, 0]


def test_no_device_means_no_summary_but_a_clear_error_for_facts(queries):
    assert device.summary(None) is None and device.summary(7) is None
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        device.compute_capability(7)
    assert dispatch._sm_count(7) == dispatch.SM_COUNT_GUESS      # the heuristics still answer


def test_arch_names_and_slugs():
    assert (device.arch_for_cc(90), device.arch_for_cc(80), device.arch_for_cc(89)) == ("sm_90a", "sm_80", "sm_89")
    assert [device.cc_for_arch(device.arch_for_cc(cc)) for cc in (90, 80, 89)] == [90, 80, 89]
    for bad in ("sm_9x", "compute_90", "90", None):
        with pytest.raises(ValueError, match=r"^arch: .* is not a CUDA target such as 'sm_80' or 'sm_90a'"):
            device.cc_for_arch(bad)
    assert device.gpu_slug("NVIDIA H200") == "NVIDIA_H200"
    assert deepgemm.gpu_available is device.gpu_available          # the public name of the one probe
    for module in (bench, registry):                                # device facts have one home
        assert not {"gpu_available", "gpu_identity", "gpu_slug", "arch_for_cc", "cc_for_arch"} & set(vars(module))


def test_gpu_available_is_asked_once(monkeypatch):
    calls = []
    monkeypatch.setattr(device, "_probe", lambda: calls.append(1) or (False, "no CUDA device visible to CuPy"))
    caches.clear("device")
    try:
        assert device.gpu_available() == (False, "no CUDA device visible to CuPy") == device.gpu_available()
        assert device.current() is None and len(calls) == 1
    finally:
        caches.clear("device")


def test_without_cupy_gpu_available_says_why():
    caches.clear("device")
    ok, why = device.gpu_available()
    if ok:
        pytest.skip("a GPU is visible here")
    assert "CuPy" in why or "CUDA" in why



def test_without_cupy_the_hint_fits_the_machine_and_the_install(monkeypatch, tmp_path):
    """No pip line where no NVIDIA driver could use CuPy; else one spelled for a source checkout
    or for an installed package (where `pip install -e .` means nothing)."""
    def no_cupy():
        raise ModuleNotFoundError("No module named 'cupy'")
    monkeypatch.setattr(device, "_cupy", no_cupy)
    monkeypatch.setattr(device.shutil, "which", lambda name: None)
    monkeypatch.setattr(device, "_DRIVER_PATHS", (str(tmp_path / "absent"),))
    assert device._probe() == (False, "CuPy is not importable (ModuleNotFoundError: No module named 'cupy'); "
                                      "no NVIDIA driver here either")
    monkeypatch.setattr(device, "_DRIVER_PATHS", (str(tmp_path),))     # a driver shows itself
    monkeypatch.setattr(cli, "repo_path", lambda *parts: None)          # an installed package
    assert device._probe()[1].endswith("); pip install 'deepgemm[cuda13]'")
    monkeypatch.setattr(cli, "repo_path", lambda *parts: tmp_path)      # a source checkout
    assert device._probe()[1].endswith("); pip install -e '.[cuda13]'")

class FakeCupyDevices:
    """CuPy's device calls as deepgemm.device uses them, for one H200-like device 0."""
    __version__ = "14.0.0"

    def __init__(self, available=True, props_error=None):
        fake = self
        self.props = {"name": b"NVIDIA H200", "major": 9, "minor": 0, "multiProcessorCount": 132,
                      "totalGlobalMem": 150_000_000_000, "l2CacheSize": 62_914_560}

        class Device:
            def __init__(self, dev=None):
                self.id = 0 if dev is None else dev
                self.attributes = {"MultiProcessorCount": 132, "ComputeCapabilityMajor": 9,
                                   "ComputeCapabilityMinor": 0, "ClockRate": 1_980_000,
                                   "MemoryClockRate": 3_201_000, "L2CacheSize": 62_914_560}

        def properties(dev):
            if props_error:
                raise props_error
            return fake.props
        runtime = type("runtime", (), {"getDeviceProperties": staticmethod(properties),
                                       "driverGetVersion": staticmethod(lambda: 13000),
                                       "runtimeGetVersion": staticmethod(lambda: 12090)})
        self.cuda = type("cuda", (), {"is_available": staticmethod(lambda: available), "Device": Device,
                                      "runtime": runtime})


@pytest.fixture
def fake_cupy(monkeypatch):
    def use(cupy):
        monkeypatch.setattr(device, "_cupy", lambda: cupy)
        caches.clear("device")
        return cupy
    yield use
    caches.clear("device")


def test_the_probe_names_the_gpu_or_says_why_not(fake_cupy):
    fake_cupy(FakeCupyDevices())
    assert device.gpu_available() == (True, "NVIDIA H200") and device.current() == 0
    fake_cupy(FakeCupyDevices(available=False))
    assert device.gpu_available() == (False, "no CUDA device visible to CuPy") and device.current() is None
    fake_cupy(FakeCupyDevices(props_error=RuntimeError("cudaErrorNoDevice")))
    ok, why = device.gpu_available()
    assert not ok and why == "CUDA is not usable (RuntimeError: cudaErrorNoDevice)"


def test_facts_from_the_driver(fake_cupy):
    cupy = fake_cupy(FakeCupyDevices())
    assert device.summary(0) == {"name": "NVIDIA H200", "cc": "9.0", "sm_count": 132}
    cupy.props.update(name="NVIDIA A100", major=8, minor=6, multiProcessorCount=84)
    caches.clear("device")
    assert (device.compute_capability(0), device.name(0), device.sm_count(0)) == (86, "NVIDIA A100", 84)


def test_identity_records_versions_clocks_and_sizes(fake_cupy, monkeypatch):
    fake_cupy(FakeCupyDevices())
    monkeypatch.setattr(device, "_nvidia_driver_version", lambda: "580.159.04")
    ident = device.identity()
    assert ident == {"name": "NVIDIA H200", "sm_count": 132, "cc": "9.0", "driver_version": "580.159.04",
                     "cuda_driver_version": "13.0", "cuda_runtime_version": "12.9", "sm_clock_max_mhz": 1980,
                     "mem_clock_max_mhz": 3201, "l2_bytes": 62_914_560, "memory_bytes": 150_000_000_000,
                     "cupy_version": "14.0.0"}
    ident["name"] = "changed by the caller"
    assert device.identity(0)["name"] == "NVIDIA H200"          # a copy each time


@pytest.mark.parametrize("text,version", [
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder)\n", "580.159.04"),
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n", "535.104.05"),
])
def test_the_driver_version_is_read_from_the_kernel_module(monkeypatch, text, version):
    monkeypatch.setattr(device, "Path", lambda p: type("F", (), {"read_text": lambda self: text})())
    assert device._nvidia_driver_version() == version
    assert device._cuda_version_string(12080) == "12.8" and device._cuda_version_string(13000) == "13.0"


@pytest.mark.parametrize("stdout,version", [("580.159.04\n", "580.159.04"), ("580.159.04\n580.159.04\n", "580.159.04"),
                                            ("", None)])
def test_without_the_kernel_modules_file_the_driver_version_comes_from_nvidia_smi(monkeypatch, stdout, version):
    """A container without /proc/driver/nvidia/version: nvidia-smi's first line (one per GPU), or
    None when it prints nothing. The baselines' key folder is named by this version."""
    class NoFile:
        def __init__(self, path):
            self.path = path

        def read_text(self):
            raise FileNotFoundError(self.path)
    monkeypatch.setattr(device, "Path", NoFile)
    monkeypatch.setattr(device.subprocess, "run", lambda *a, **k: types.SimpleNamespace(stdout=stdout))
    assert device._nvidia_driver_version() == version
