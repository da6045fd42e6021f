"""A kernel against cuBLAS with a cold L2 (flushed before every call, as the benchmarks and the
ladder time) and a warm one (the same operands again, as inside a model). A gap that stays the
same warm and cold is not memory traffic: it is latency or instruction issue. Device time
(CUDA events), median; A row-major, B the transpose of a row-major [N, K] weight.

Two cold states: "read", the benchmarks' flush (a read-only pass, which leaves clean lines), and
"write", a memset (nvbench's and Triton's flush), which leaves L2 full of dirty lines that a
kernel streaming more than L2 holds writes back inside its own time. `--copy` adds a
device-to-device copy of B's bytes in each state: the bandwidth a weight stream can hope for (TB/s
counts bytes read + written), and TB/s of B for the kernels.

    python3 scripts/warm_cold.py 512x3072x768,512x768x3072 --config '{"DG_BN": 128, "DG_STAGES": 6}'
    python3 scripts/warm_cold.py 1x14336x4096,16x4096x4096 --kernel small_m --copy
"""
import argparse
import json

STATES = {"read": ("cold", "read"), "write": ("cold-write", "write"), "warm": ("warm", False)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shapes", help="comma-separated MxNxK")
    ap.add_argument("--kernel", default="v5", help="deepgemm kernel name or auto (default: v5)")
    ap.add_argument("--config", default=None, help="config JSON as gemm(config=...) takes it")
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"), help="default: float16")
    ap.add_argument("--reps", type=int, default=40, help="timed reps per entry (default: 40)")
    ap.add_argument("--states", default="read,warm",
                    help=f"comma-separated L2 states, of {', '.join(STATES)} (default: read,warm)")
    ap.add_argument("--copy", action="store_true", help="also time a device-to-device copy of B's bytes")
    args = ap.parse_args(argv)
    states = args.states.split(",")
    for s in states:
        if s not in STATES:
            ap.error(f"--states: {s!r} is not one of {', '.join(STATES)}")

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
        w = cupy.asarray(rng.standard_normal((n, k), dtype=np.float32)).astype(dt)
        b, out, w_copy = w.T, cupy.empty((m, n), dt), cupy.empty_like(w)
        runs = [(args.kernel, lambda: deepgemm.gemm(a, b, kernel=args.kernel, config=config, out=out)),
                ("cuBLAS", lambda: cupy.matmul(a, b, out=out))]
        if args.copy:
            runs.append(("copy", lambda: w_copy.data.copy_from_device_async(w.data, w.nbytes)))
        row = []
        for name, fn in runs:
            for s in states:
                label, flush = STATES[s]
                t = bench.time_device(fn, warmup=5, reps=args.reps, flush_l2=flush)
                tbps = (2 if name == "copy" else 1) * w.nbytes / t.median / 1e6
                row.append(f"{name} {label} {t.median:6.2f} us" + (f" ({tbps:.2f} TB/s)" if args.copy else ""))
        print(f"{m}x{n}x{k}: " + ", ".join(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
