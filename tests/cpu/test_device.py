"""Device facts in one place (deepgemm.device): asked of the driver once per device, remembered
until deepgemm.clear_caches(), and the names other modules used to export still answer."""
import pytest

import deepgemm
from deepgemm import bench, caches, device, dispatch, registry


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
    assert device.gpu_slug("NVIDIA H200") == "NVIDIA_H200"
    assert deepgemm.gpu_available is device.gpu_available          # the public name of the one probe
    for module in (bench, registry):                                # device facts have one home
        assert not {"gpu_available", "gpu_identity", "gpu_slug", "arch_for_cc"} & set(vars(module))


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
