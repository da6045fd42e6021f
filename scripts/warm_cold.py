"""A kernel against cuBLAS with a cold L2 (flushed before every call, as the benchmarks and the
ladder time) and a warm one (the same operands again, as inside a model). A gap that stays the
same warm and cold is not memory traffic: it is latency or instruction issue. Device time
(CUDA events), median; A row-major, B the transpose of a row-major [N, K] weight.

    python3 scripts/warm_cold.py 512x3072x768,512x768x3072 --config '{"DG_BN": 128, "DG_STAGES": 6}'
"""
import argparse
import json


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shapes", help="comma-separated MxNxK")
    ap.add_argument("--kernel", default="v5", help="deepgemm kernel name or auto (default: v5)")
    ap.add_argument("--config", default=None, help="config JSON as gemm(config=...) takes it")
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"), help="default: float16")
    ap.add_argument("--reps", type=int, default=40, help="timed reps per entry (default: 40)")
    args = ap.parse_args(argv)

    import cupy
    import numpy as np

    import deepgemm
    from deepgemm import bench

    config = json.loads(args.config) if args.config else None
    dt = cupy.float16 if args.dtype == "float16" else cupy.dtype("bfloat16")
    rng = np.random.default_rng(0)
    for shape in args.shapes.split(","):
        m, n, k = (int(x) for x in shape.split("x"))
        a = cupy.asarray(rng.standard_normal((m, k), dtype=np.float32)).astype(dt)
        b = cupy.asarray(rng.standard_normal((n, k), dtype=np.float32)).astype(dt).T
        out = cupy.empty((m, n), dt)
        row = []
        for name, fn in ((args.kernel, lambda: deepgemm.gemm(a, b, kernel=args.kernel, config=config, out=out)),
                         ("cuBLAS", lambda: cupy.matmul(a, b, out=out))):
            for flush in (True, False):
                t = bench.time_device(fn, warmup=5, reps=args.reps, flush_l2=flush)
                row.append(f"{name} {'cold' if flush else 'warm'} {t.median:6.2f} us")
        print(f"{m}x{n}x{k}: " + ", ".join(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
