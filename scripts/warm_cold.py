"""V5 vs cuBLAS with a cold L2 (flushed before every call, as the benchmarks time) and a warm one
(the same operands again, as inside a model), to tell memory-bound from latency-bound shapes.

    python3 scripts/warm_cold.py 512x3072x768,512x768x3072 '{"DG_BN": 128, "DG_STAGES": 6}'"""
import json
import sys

import cupy
import numpy as np

import deepgemm
from deepgemm import bench

shapes = [tuple(int(x) for x in s.split("x")) for s in sys.argv[1].split(",")]
config = json.loads(sys.argv[2]) if len(sys.argv) > 2 else None
rng = np.random.default_rng(0)
for m, n, k in shapes:
    a = cupy.asarray(rng.standard_normal((m, k), dtype=np.float32)).astype(cupy.float16)
    b = cupy.asarray(rng.standard_normal((n, k), dtype=np.float32)).astype(cupy.float16).T
    out = cupy.empty((m, n), cupy.float16)
    row = []
    for name, fn in (("v5", lambda: deepgemm.gemm(a, b, kernel="v5", config=config, out=out)),
                     ("cuBLAS", lambda: cupy.matmul(a, b, out=out))):
        for flush in (True, False):
            t = bench.time_device(fn, warmup=5, reps=40, flush_l2=flush)
            row.append(f"{name} {'cold' if flush else 'warm'} {t.median:6.2f} us")
    print(f"{m}x{n}x{k}: " + ", ".join(row), flush=True)
