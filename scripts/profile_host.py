"""Where gemm()'s host time goes on a repeat call (the plan-cache path): time per call, the parts
it is made of (the bare replayed launch through cuLaunchKernel, the stream lookup), then cProfile
over many calls, top entries by own time.

`python3 scripts/profile_host.py [cupy|torch] [small|v5]`: small (default) is a 1x64x64 call
(small_m: GemmParams only); v5 a 128x256x64 one on V5 (GemmParams and three tensor maps)."""
import cProfile
import pstats
import sys
import time

import cupy

import deepgemm
from deepgemm import api, arrays

fw = sys.argv[1] if len(sys.argv) > 1 else "cupy"
case = sys.argv[2] if len(sys.argv) > 2 else "small"
m, n, k, kernel = (1, 64, 64, "auto") if case == "small" else (128, 256, 64, "v5")
a = cupy.random.standard_normal((m, k)).astype(cupy.float16)
b = cupy.random.standard_normal((k, n)).astype(cupy.float16)
out = cupy.empty((m, n), cupy.float16)
if fw == "torch":
    import torch
    a, b, out = (torch.from_dlpack(x) for x in (a, b, out))
for _ in range(100):
    deepgemm.gemm(a, b, out=out, kernel=kernel)
n_calls = 3000


def per_call(fn, batch: int = 200) -> float:
    """Host time per call in us. Synchronising between batches (untimed) keeps the launch queue
    from filling up, which would make a launch wait for the GPU's kernels instead."""
    total = 0.0
    for _ in range(n_calls // batch):
        cupy.cuda.Device().synchronize()
        t = time.perf_counter()
        for _ in range(batch):
            fn()
        total += time.perf_counter() - t
    return total / (n_calls // batch * batch) * 1e6


print(f"{fw}, {case}: {per_call(lambda: deepgemm.gemm(a, b, out=out, kernel=kernel)):.1f} us per call (no profiler)")
(plan,) = api._plans.values()
pa, pb, pd = (api._pointer(x) for x in (a, b, out))
launch_args = ((pa, pb, pd, 0, 0, 0), plan.pointer_args(pa, pb, pd))
print(f"  of which the launch alone (packing the arguments, cuLaunchKernel): "
      f"{per_call(lambda: plan.launcher(arrays.stream_handle(fw, 0), *launch_args)):.2f} us, "
      f"stream handle {per_call(lambda: arrays.stream_handle(fw, 0)):.2f} us")
cupy.cuda.Device().synchronize()
prof = cProfile.Profile()
prof.enable()
for _ in range(n_calls):
    deepgemm.gemm(a, b, out=out, kernel=kernel)
prof.disable()
pstats.Stats(prof).sort_stats("tottime").print_stats(18)
