"""The accuracy report's GPU backend: deepgemm's own kernels behind accuracy.py's ``gpu_runner``
contract, ``runner(a, b, accumulate) -> (C as float64 on the host, seconds per call) | None``.

* ``"fp32"``: V4 (tensor cores, FP32 accumulation), the ladder's top step;
* ``"fp16"``: fp16acc_mma (V4 with f16 accumulators) for float16 inputs; None for bfloat16
  (there is no bf16 mma with an f16 accumulator), so the report shows the emulation there.

Both write float32 outputs, so the only rounding that shows is the accumulator's: the fp16
accumulator widens to float32 exactly (inf included). Times are device-event medians with a cold
L2 (deepgemm.bench.time_device), the same measurement as the ladder's.
"""
from __future__ import annotations

import numpy as np

KERNELS = {"fp32": dict(kernel="v4"), "fp16": dict(kernel="fp16acc_mma", accumulate="fp16")}


def make_gpu_runner(*, device: int | None = None, warmup: int = 2, reps: int = 10):
    """A gpu_runner for run_accuracy_report on the current (or given) CUDA device.

    Raises RuntimeError when there is no usable GPU or it cannot run V4 (compute capability < 8.0).
    """
    import cupy

    import deepgemm
    from deepgemm import bench, device as devices, registry
    from deepgemm.reference import dtype_name

    ok, name = deepgemm.gpu_available()
    if not ok:
        raise RuntimeError(f"no GPU for the accuracy report: {name}")
    dev = cupy.cuda.Device(device)
    cc = devices.compute_capability(dev.id)
    needs = max(registry.get(kw["kernel"]).min_cc for kw in KERNELS.values())
    if cc < needs:
        raise RuntimeError(f"the report's kernels need compute capability >= {needs / 10:.1f}, "
                           f"this GPU has {cc / 10:.1f}")

    def runner(a: np.ndarray, b: np.ndarray, accumulate: str):
        if accumulate not in KERNELS:
            raise ValueError(f"accumulate: expected one of {tuple(KERNELS)}, got {accumulate!r}")
        kwargs = KERNELS[accumulate]
        if dtype_name(a) not in registry.get(kwargs["kernel"]).input_dtypes:
            return None   # bf16 with fp16 accumulation: no such kernel; the report emulates it
        with dev:
            da, db = cupy.asarray(a), cupy.asarray(b)
            out = cupy.empty((a.shape[0], b.shape[1]), dtype=cupy.float32)

            def call():
                deepgemm.gemm(da, db, out=out, **kwargs)

            call()   # the measured result (deterministic: timing reruns write the same values)
            result = cupy.asnumpy(out).astype(np.float64)
            stats = bench.time_device(call, warmup=warmup, reps=reps)
        return result, stats.median_seconds

    runner.device_name = name if device is None else devices.name(dev.id)
    return runner
