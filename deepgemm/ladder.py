"""The main job on a GPU: verify every kernel on this GPU, then time the ladder against cuBLAS.

Verification: each kernel x dtype x layout on a misaligned shape, against the FP64 reference within
the forward error bound. Timing: device events, cold L2, median; cuBLAS (cupy.matmul) in the same
run and on the same inputs, so ratios are honest.
"""
from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import numpy as np

from deepgemm.reference import NUMPY_DTYPES

FP32_CUDA_CORE_PEAK_TFLOPS = {"NVIDIA H200": 66.9, "NVIDIA H100 80GB HBM3": 66.9}  # datasheet, dense FP32
VERIFY_SHAPES = ((129, 67, 45), (8, 8, 8), (1, 257, 300))


def _random(shape, dtype: str, rng, xp):
    return xp.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(NUMPY_DTYPES[dtype])


def verify(kernel_names, dtypes=("float16", "bfloat16"), log=print) -> list[dict]:
    """Check each kernel on small odd shapes in all four layouts; returns one row per check."""
    import cupy
    from deepgemm import device, gemm, registry
    from deepgemm.testing import assert_gemm_close

    rng = np.random.default_rng(0)
    rows = []
    cc = device.compute_capability(device.current())
    for name, dtype, (m, n, k), a_row, b_row in itertools.product(kernel_names, dtypes, VERIFY_SHAPES,
                                                                   (True, False), (True, False)):
        if registry.get(name).supports(registry.Problem(m, n, k, dtype, "float32", cc=cc)) is not None:
            continue   # e.g. small_m above its M limit
        a = _random((m, k) if a_row else (k, m), dtype, rng, cupy)
        b = _random((k, n) if b_row else (n, k), dtype, rng, cupy)
        a, b = (a if a_row else a.T), (b if b_row else b.T)
        out = gemm(a, b, kernel=name, out_dtype="float32")
        try:
            margin = assert_gemm_close(out, a=a, b=b, accumulate=registry.get(name).accumulate)
            ok, detail = True, f"margin {margin:.2f}"
        except AssertionError as exc:
            ok, detail = False, str(exc).splitlines()[0]
        rows.append({"kernel": name, "dtype": dtype, "shape": (m, n, k), "a_row": a_row, "b_row": b_row,
                     "ok": ok, "detail": detail})
        if not ok:
            log(f"FAIL {name} {dtype} {m}x{n}x{k} a_row={a_row} b_row={b_row}: {detail}")
    return rows


def time_ladder(kernel_names, size=4096, dtypes=("float16", "bfloat16"), log=print) -> list[dict]:
    """TFLOP/s of each kernel and of cuBLAS at size^3, row-major operands, output in the input dtype."""
    import cupy
    from deepgemm import bench, device, gemm

    rng = np.random.default_rng(1)
    name = device.name(device.current())
    peak = FP32_CUDA_CORE_PEAK_TFLOPS.get(name)
    rows = []
    for dtype in dtypes:
        a = _random((size, size), dtype, rng, cupy)
        b = _random((size, size), dtype, rng, cupy)
        out = cupy.empty((size, size), dtype=a.dtype)
        candidates = [("cuBLAS", lambda: cupy.matmul(a, b))]
        candidates += [(k, (lambda k=k: gemm(a, b, kernel=k, out=out))) for k in kernel_names]
        candidates += [("auto", lambda: gemm(a, b, out=out))]   # what a caller gets by default
        for label, fn in candidates:
            fn()
            cupy.cuda.get_current_stream().synchronize()
            t0 = time.perf_counter()
            fn()
            cupy.cuda.get_current_stream().synchronize()
            one = time.perf_counter() - t0
            reps = int(min(30, max(3, 1.0 / max(one, 1e-6))))  # about a second per entry
            stats = bench.time_device(fn, warmup=1, reps=reps, flush_l2=True)
            tf = bench.tflops(size, size, size, stats.median_seconds)
            rows.append({"kernel": label, "dtype": dtype, "size": size, "median_us": stats.median,
                         "iqr_us": stats.iqr, "reps": stats.n, "tflops": tf,
                         "pct_fp32_peak": 100 * tf / peak if peak else None})
            log(f"  {label:7} {dtype:9} {tf:8.1f} TFLOP/s  (median {stats.median:.0f} us, {stats.n} reps)")
    for row in rows:
        cublas = next(r for r in rows if r["kernel"] == "cuBLAS" and r["dtype"] == row["dtype"])
        row["pct_cublas"] = 100 * row["tflops"] / cublas["tflops"]
    return rows


def ladder_table(rows) -> str:
    lines = ["| kernel | dtype | TFLOP/s | % of cuBLAS | % of FP32 CUDA-core peak | median µs |",
             "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        peak = f"{r['pct_fp32_peak']:.0f}%" if r["pct_fp32_peak"] is not None else "n/a"
        lines.append(f"| {r['kernel']} | {r['dtype']} | {r['tflops']:.1f} | {r['pct_cublas']:.1f}% | {peak} | "
                     f"{r['median_us']:.0f} |")
    return "\n".join(lines)


def main_job(out_dir: str | None = None, size: int = 4096, kernels=None) -> int:
    from deepgemm import device, registry
    cc = device.compute_capability(device.current())
    names = [n for n in (kernels or registry.names()) if registry.get(n).min_cc <= cc]
    skipped = sorted(set(kernels or registry.names()) - set(names))
    if skipped:
        print(f"not on this GPU (compute capability {cc / 10:.1f}): {', '.join(skipped)}")
    ident = device.identity()
    print(f"GPU: {ident['name']} ({ident.get('sm_count')} SMs, driver {ident.get('driver_version')}, "
          f"CUDA runtime {ident.get('cuda_runtime_version')}, max SM clock {ident.get('sm_clock_max_mhz')} MHz)")
    print(f"verifying {', '.join(names)} against the FP64 reference ...")
    checks = verify(names)
    bad = [c for c in checks if not c["ok"]]
    print(f"  {len(checks) - len(bad)}/{len(checks)} checks passed")
    print(f"timing the ladder at {size}^3 (device events, cold L2, median) ...")
    timed = [n for n in names if registry.get(n).supports(registry.Problem(size, size, size, cc=cc)) is None]
    rows = time_ladder(timed, size=size)
    table = ladder_table(rows)
    if out_dir:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "ladder.json").write_text(json.dumps({"gpu": ident, "verify": checks, "ladder": rows}, indent=1))
        (out / "ladder.md").write_text(f"# Ladder on {ident['name']} at {size}^3\n\n{table}\n")
    print()
    print(table)
    return 1 if bad else 0
