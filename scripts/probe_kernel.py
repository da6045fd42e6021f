"""Bring-up probe for one kernel and config: correctness on a few shapes and layouts (relative
error against an FP32 cupy.matmul, plus the fused bias + GELU + C chain on an odd shape), or
TFLOP/s against cuBLAS (cupy.matmul) timed in the same process on the same inputs. Each check is
small and prints one line as it finishes, so a hang or a crash (run it under `timeout`, or under
compute-sanitizer) still leaves the lines before it. Quicker than the quick tier when trying a
new config; the tests remain the proof.

    python3 scripts/probe_kernel.py check [--kernel v5] [--config JSON] [--layouts rc,rr,cr,cc]
    python3 scripts/probe_kernel.py time  [--kernel v5] [--config JSON] [--sizes 4096,8192x8192x1024]

Exit status of `check`: 1 if any relative error reaches 1e-3.
"""
from __future__ import annotations

import argparse
import json
import sys


def operand(rows, cols, row_major, dtype, rng):
    x = cupy.asarray(rng.standard_normal((rows, cols) if row_major else (cols, rows)).astype(np.float32))
    x = x.astype(dtype)
    return x if row_major else x.T


def check(kernel, config, layouts, dtypes):
    rng = np.random.default_rng(0)
    shapes = [(128, 256, 64), (256, 512, 256), (264, 520, 200), (8, 8, 8), (1000, 776, 1032), (64, 3072, 768),
              (255, 263, 129), (777, 1234, 555)]   # the last two: leading dims TMA cannot take (staged)
    worst = 0.0
    for dtype in dtypes:
        dt = cupy.float16 if dtype == "float16" else cupy.dtype("bfloat16")
        for layout in layouts:
            for m, n, k in shapes:
                a = operand(m, k, layout[0] == "r", dt, rng)
                b = operand(k, n, layout[1] == "r", dt, rng)
                ref = a.astype(cupy.float32) @ b.astype(cupy.float32)
                d = deepgemm.gemm(a, b, kernel=kernel, config=config, out_dtype="float32")
                err = float(cupy.abs(d - ref).max() / (cupy.abs(ref).max() + 1e-30))
                ok = err < 1e-3
                worst = max(worst, err)
                print(f"check {kernel} {dtype} {layout} {m}x{n}x{k}: rel max err {err:.2e} {'ok' if ok else 'FAIL'}",
                      flush=True)
    # The fused chain on one odd shape: bias + gelu + residual, fp16 out.
    m, n, k = 264, 520, 200
    a, b = operand(m, k, True, cupy.float16, rng), operand(k, n, False, cupy.float16, rng)
    bias = cupy.asarray(rng.standard_normal(n).astype(np.float32))
    c = cupy.asarray(rng.standard_normal((m, n)).astype(np.float16))
    x = a.astype(cupy.float32) @ b.astype(cupy.float32) + bias
    ref = 0.5 * x * (1 + cupy.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3))) + c.astype(cupy.float32)
    d = deepgemm.gemm(a, b, kernel=kernel, config=config, bias=bias, activation="gelu", c=c)
    err = float(cupy.abs(d.astype(cupy.float32) - ref).max() / cupy.abs(ref).max())
    print(f"check {kernel} epilogue bias+gelu+C: rel max err {err:.2e} {'ok' if err < 2e-3 else 'FAIL'}")
    return worst


def time_sizes(kernel, config, sizes, dtypes, layouts):
    rng = np.random.default_rng(1)
    rows = []
    for dtype in dtypes:
        dt = cupy.float16 if dtype == "float16" else cupy.dtype("bfloat16")
        for layout in layouts:
            for (m, n, k) in sizes:
                a = operand(m, k, layout[0] == "r", dt, rng)
                b = operand(k, n, layout[1] == "r", dt, rng)
                out = cupy.empty((m, n), dt)
                t_dg = bench.time_device(lambda: deepgemm.gemm(a, b, kernel=kernel, config=config, out=out),
                                         warmup=5, reps=30)
                t_cb = bench.time_device(lambda: cupy.matmul(a, b, out=out), warmup=5, reps=30)
                f_dg, f_cb = bench.tflops(m, n, k, t_dg.median_seconds), bench.tflops(m, n, k, t_cb.median_seconds)
                rows.append((dtype, layout, f"{m}x{n}x{k}", f_dg, f_cb))
                print(f"time {kernel} {dtype} {layout} {m}x{n}x{k}: {f_dg:.1f} TFLOP/s ({t_dg.median:.1f} us) "
                      f"cuBLAS {f_cb:.1f} ({t_cb.median:.1f} us) ratio {f_dg / f_cb:.3f}", flush=True)
    return rows


def parser():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("check", "time"), help="check: correctness; time: TFLOP/s vs cuBLAS")
    ap.add_argument("--kernel", default="v5", help="kernel name (default: v5)")
    ap.add_argument("--config", default=None, help="config JSON as gemm(config=...) takes it")
    ap.add_argument("--layouts", default="rc,rr,cr,cc",
                    help="A and B layouts, r = row-major, c = column-major (default: all four)")
    ap.add_argument("--dtypes", default="float16,bfloat16", help="default: float16,bfloat16")
    ap.add_argument("--sizes", default="4096", help="time: comma-separated N (for N^3) or MxNxK (default: 4096)")
    return ap


def main(args):
    config = json.loads(args.config) if args.config else None
    layouts, dtypes = args.layouts.split(","), args.dtypes.split(",")
    if args.what == "check":
        return 0 if check(args.kernel, config, layouts, dtypes) < 1e-3 else 1
    sizes = [tuple(int(x) for x in s.split("x")) if "x" in s else (int(s),) * 3 for s in args.sizes.split(",")]
    time_sizes(args.kernel, config, sizes, dtypes, layouts)
    return 0


if __name__ == "__main__":
    arguments = parser().parse_args()   # --help works on a machine without CuPy
    import cupy
    import numpy as np

    import deepgemm
    from deepgemm import bench
    sys.exit(main(arguments))
