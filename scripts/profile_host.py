"""Host time of deepgemm.gemm() on a repeat call (the plan-cache path), the part of a layer call
that a CUDA graph would remove: time per call, the parts it is made of (the bare replayed launch
through cuLaunchKernel, the stream lookup), then cProfile over many calls, top entries by own time.

Measures host time only: the GPU work is tiny and the launch queue is drained between batches
(untimed), so a launch never waits for the GPU.

    python3 scripts/profile_host.py                  # CuPy arrays, a 1x64x64 call (small_m)
    python3 scripts/profile_host.py torch v5         # torch tensors, a 128x256x64 call on V5
"""
import argparse
import cProfile
import pstats
import sys
import time

CASES = {   # name -> (m, n, k, kernel); v5's plan also carries three TMA tensor maps
    "small": (1, 64, 64, "auto"),
    "v5": (128, 256, 64, "v5"),
}


def per_call(fn, calls: int, sync, batch: int = 200) -> float:
    """Host µs per call. Synchronising between batches (untimed) keeps the launch queue from
    filling up, which would make a launch wait for the GPU's kernels instead."""
    total = 0.0
    for _ in range(calls // batch):
        sync()
        t = time.perf_counter()
        for _ in range(batch):
            fn()
        total += time.perf_counter() - t
    return total / (calls // batch * batch) * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("framework", nargs="?", default="cupy", choices=("cupy", "torch"),
                    help="array type passed to gemm() (default: cupy)")
    ap.add_argument("case", nargs="?", default="small", choices=tuple(CASES),
                    help="small: 1x64x64 on kernel='auto' (small_m); v5: 128x256x64 on V5 (default: small)")
    ap.add_argument("--calls", type=int, default=3000, help="calls per measurement (default: 3000)")
    ap.add_argument("--top", type=int, default=18, help="cProfile entries to print (default: 18)")
    args = ap.parse_args(argv)

    import deepgemm
    ok, why = deepgemm.gpu_available()
    if not ok:
        print(f"profile_host.py: needs a GPU ({why}); nothing was measured", file=sys.stderr)
        return 2
    import cupy

    from deepgemm import api, arrays

    m, n, k, kernel = CASES[args.case]
    a = cupy.random.standard_normal((m, k)).astype(cupy.float16)
    b = cupy.random.standard_normal((k, n)).astype(cupy.float16)
    out = cupy.empty((m, n), cupy.float16)
    if args.framework == "torch":
        import torch
        a, b, out = (torch.from_dlpack(x) for x in (a, b, out))
    sync = cupy.cuda.Device().synchronize
    api._plans.clear()
    for _ in range(100):   # compile, then fill the plan cache
        deepgemm.gemm(a, b, out=out, kernel=kernel)

    call = lambda: deepgemm.gemm(a, b, out=out, kernel=kernel)   # noqa: E731
    print(f"{args.framework}, {m}x{n}x{k} on {kernel}: {per_call(call, args.calls, sync):.1f} us per call (no profiler)")
    (plan,) = api._plans.values()
    pa, pb, pd = (api._pointer(x) for x in (a, b, out))
    launch_args = ((pa, pb, pd, 0, 0, 0), plan.pointer_args(pa, pb, pd, 0))   # no bias, scale or residual
    launch = lambda: plan.launcher(arrays.stream_handle(args.framework, 0), *launch_args)   # noqa: E731
    stream = lambda: arrays.stream_handle(args.framework, 0)   # noqa: E731
    print(f"  of which the launch alone (packing the arguments, cuLaunchKernel): "
          f"{per_call(launch, args.calls, sync):.2f} us, stream handle {per_call(stream, args.calls, sync):.2f} us")
    sync()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.calls):
        call()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
