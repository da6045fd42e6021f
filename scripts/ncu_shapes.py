"""One profiled launch per (kernel, config) on one shape, for Nsight Compute: everything is compiled
and warmed up first, and only the launches between cudaProfilerStart/Stop are profiled, so run it as

    ncu --profile-from-start off --section SpeedOfLight --section MemoryWorkloadAnalysis \
        python3 scripts/ncu_shapes.py 512x3072x768 'v5' 'v5:{"DG_BN": 128, "DG_STAGES": 6}' cublas
"""
from __future__ import annotations

import json
import sys

import cupy
import numpy as np

import deepgemm


def main(shape: str, *runs: str) -> None:
    m, n, k = (int(x) for x in shape.split("x"))
    rng = np.random.default_rng(0)
    a = cupy.asarray(rng.standard_normal((m, k), dtype=np.float32)).astype(cupy.float16)
    b = cupy.asarray(rng.standard_normal((n, k), dtype=np.float32)).astype(cupy.float16).T   # rc, as nn.Linear
    out = cupy.empty((m, n), cupy.float16)
    calls = []
    for run in runs:
        if run == "cublas":
            calls.append((run, lambda: cupy.matmul(a, b, out=out)))
        else:
            name, _, cfg = run.partition(":")
            config = json.loads(cfg) if cfg else None
            calls.append((run, lambda name=name, config=config: deepgemm.gemm(a, b, kernel=name, config=config, out=out)))
    for _, call in calls:   # compile and warm up outside the profiled range
        for _ in range(3):
            call()
    cupy.cuda.Device().synchronize()
    cupy.cuda.profiler.start()
    for label, call in calls:
        call()
        cupy.cuda.Device().synchronize()
        print("profiled", label, flush=True)
    cupy.cuda.profiler.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
