"""Where gemm()'s host time goes on a repeat call (the plan-cache path): cProfile over many calls
of a tiny problem, top entries by own time. `python3 scripts/profile_host.py [cupy|torch]`."""
import cProfile
import pstats
import sys
import time

import cupy

import deepgemm

fw = sys.argv[1] if len(sys.argv) > 1 else "cupy"
a = cupy.random.standard_normal((1, 64)).astype(cupy.float16)
b = cupy.random.standard_normal((64, 64)).astype(cupy.float16)
out = cupy.empty((1, 64), cupy.float16)
if fw == "torch":
    import torch
    a, b, out = (torch.from_dlpack(x) for x in (a, b, out))
for _ in range(100):
    deepgemm.gemm(a, b, out=out)
cupy.cuda.Device().synchronize()
n = 3000
t = time.perf_counter()
for _ in range(n):
    deepgemm.gemm(a, b, out=out)
print(f"{fw}: {(time.perf_counter() - t) / n * 1e6:.1f} us per call (no profiler)")
t = time.perf_counter()
for _ in range(n):
    cupy.cuda.get_current_stream()
print(f"reference: get_current_stream {(time.perf_counter() - t) / n * 1e6:.2f} us")
prof = cProfile.Profile()
prof.enable()
for _ in range(n):
    deepgemm.gemm(a, b, out=out)
prof.disable()
pstats.Stats(prof).sort_stats("tottime").print_stats(18)
