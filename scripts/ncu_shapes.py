"""One launch per (kernel, config) on one shape, bracketed for Nsight Compute: every run is
compiled and warmed up first, and only the launches between cudaProfilerStart/Stop are profiled,
so ncu measures exactly one launch of each and nothing of the compiles. A is row-major, B is the
transpose of a row-major [N, K] weight (nn.Linear's layout; `--layout rr`: B row-major [K, N]);
output in the input dtype; `--epilogue bias+gelu+residual` (or any of its parts) fuses that chain
into deepgemm's runs. A shape BxMxNxK is a strided batch of B products (cuBLAS: torch.bmm, as the
benchmarks time it; needs torch).

    ncu --profile-from-start off --section SpeedOfLight --section MemoryWorkloadAnalysis \\
        python3 scripts/ncu_shapes.py 512x3072x768 v5 'v5:{"DG_BN": 128, "DG_STAGES": 6}' cublas

Each RUN is `cublas`, a kernel name, or `NAME:CONFIG_JSON` (a config as gemm(config=...) takes it).
For a warp-stall breakdown per SASS line, profile with `--set full` and summarise the source page
with scripts/ncu_stalls.py (its --help shows the commands).
"""
from __future__ import annotations

import argparse
import json


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shape", help="MxNxK, e.g. 512x3072x768, or BxMxNxK for a strided batch")
    ap.add_argument("runs", nargs="+", metavar="RUN", help="cublas | KERNEL | KERNEL:CONFIG_JSON")
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"), help="default: float16")
    ap.add_argument("--layout", default="rc", choices=("rc", "rr"), help="B column-major (rc, default) or row-major")
    ap.add_argument("--epilogue", default="none", metavar="PARTS",
                    help="the fused chain of deepgemm's runs: none (default) or parts of bias, gelu and residual "
                         "joined by '+' (cuBLAS runs plain)")
    args = ap.parse_args(argv)
    parts = set() if args.epilogue == "none" else set(args.epilogue.split("+"))
    if not parts <= {"bias", "gelu", "residual"}:
        ap.error(f"--epilogue: parts of bias, gelu and residual joined by '+', got {args.epilogue!r}")

    import cupy
    import numpy as np

    import deepgemm

    dims = [int(x) for x in args.shape.split("x")]
    if len(dims) not in (3, 4):
        ap.error(f"shape: expected MxNxK or BxMxNxK, got {args.shape!r}")
    batch, (m, n, k) = tuple(dims[:-3]), dims[-3:]
    dt = cupy.float16 if args.dtype == "float16" else cupy.dtype("bfloat16")
    rng = np.random.default_rng(0)

    def randn(*shape):
        return cupy.asarray(rng.standard_normal(batch + shape, dtype=np.float32)).astype(dt)

    a = randn(m, k)
    b = randn(n, k).swapaxes(-1, -2) if args.layout == "rc" else randn(k, n)
    out = cupy.empty(batch + (m, n), dt)
    chain = {}
    if "bias" in parts:
        chain["bias"] = randn(n)   # a batch's: one bias row per product
    if "gelu" in parts:
        chain["activation"] = "gelu"
    if "residual" in parts:
        chain.update(c=randn(m, n), beta=1.0)
    calls = []
    for run in args.runs:
        if run == "cublas" and batch:   # CuPy runs fp16 batches in FP32 (a SIMT GEMM); torch.bmm is cuBLAS's
            import torch
            ta, tb, tout = (torch.from_dlpack(x) for x in (a, b, out))
            calls.append((run, lambda: torch.matmul(ta, tb, out=tout)))
        elif run == "cublas":
            calls.append((run, lambda: cupy.matmul(a, b, out=out)))
        else:
            name, _, cfg = run.partition(":")
            config = json.loads(cfg) if cfg else None
            calls.append((run, lambda name=name, config=config: deepgemm.gemm(a, b, kernel=name, config=config, out=out,
                                                                              **chain)))
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
