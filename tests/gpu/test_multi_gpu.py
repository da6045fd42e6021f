"""Scale-out: under pytest-xdist on a machine with several GPUs, each worker sees exactly one GPU
(worker gwN -> GPU N mod #GPUs, set by deepgemm.testing.plugin before CUDA starts)."""
import os
import subprocess

import pytest


def _gpus_on_machine() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU ") for line in out.splitlines())


@pytest.mark.gpu
@pytest.mark.parametrize("copy", range(8))   # several items, so every worker runs one
def test_each_xdist_worker_has_its_own_gpu(record_property, copy):
    import cupy
    worker, pinned = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("DEEPGEMM_PINNED_GPU")
    if not pinned:
        pytest.skip(f"no pinning to check: needs pytest -n N with several visible GPUs "
                    f"(worker={worker}, GPUs on this machine={_gpus_on_machine()})")
    record_property("worker_gpu", f"{pinned}, PCI {cupy.cuda.Device(0).pci_bus_id}")
    assert cupy.cuda.runtime.getDeviceCount() == 1
    n_visible = int(pinned.rsplit(" of ", 1)[1])
    assert pinned.startswith(f"{worker}->") and os.environ["CUDA_VISIBLE_DEVICES"] == str(int(worker[2:]) % n_visible)
