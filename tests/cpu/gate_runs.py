"""Synthetic pytest-benchmark runs for the gate's tests (shaped like what the plugin writes)."""

import random

from deepgemm.bench import timing_stats

H200, A100 = "NVIDIA H200", "NVIDIA A100-SXM4-80GB"


def noisy(median_s, rel=0.01, n=30, seed=0, outliers=0):
    """n samples around median_s with relative scatter `rel` (deterministic per seed); a few
    `outliers` rounds 30-60 % slow, as a clock dip or a preempting process makes them."""
    rng = random.Random(seed)
    data = [median_s * (1 + rng.gauss(0, rel)) for _ in range(n)]
    for i in rng.sample(range(n), outliers):
        data[i] = median_s * rng.uniform(1.3, 1.6)
    return data


def entry(fullname, samples_s=None, *, ref=None, ref_samples=None, extra=None, telemetry=None,
          stats_median=None):
    """A benchmark entry; samples_s=None stores medians only (the older format)."""
    st = timing_stats(samples_s if samples_s else [stats_median or 1e-4])
    stats = {"min": st.min, "max": st.max, "mean": st.mean, "stddev": 0.0, "rounds": st.n,
             "median": st.median, "iqr": st.iqr, "q1": st.q1, "q3": st.q3, "iterations": 1}
    if samples_s:
        stats["data"] = list(samples_s)
    info = dict(extra or {})
    if ref is not None:
        info["reference"] = {"name": ref, "samples": list(ref_samples),
                             "median": timing_stats(ref_samples).median}
    if telemetry is not None:
        info["telemetry"] = telemetry
    return {"group": None, "name": fullname.rsplit("::", 1)[-1], "fullname": fullname,
            "params": None, "param": None, "extra_info": info,
            "options": {"timer": "device_clock"}, "stats": stats}


def make_run(benchmarks, *, gpu=H200, driver="580.159.04", cuda="13.2", commit="a" * 40,
             when="2026-11-30T10:00:00+00:00", dirty=False):
    identity = {"name": gpu, "sm_count": 132, "driver_version": driver,
                "cuda_driver_version": "13.0", "cuda_runtime_version": cuda}
    return {"machine_info": {"node": "ci", "gpu": identity},
            "commit_info": {"id": commit, "dirty": dirty, "branch": "main"},
            "benchmarks": list(benchmarks), "datetime": when, "version": "5.2.3"}


def gemm_pair(name, kernel_s, ref_s, *, rel=0.01, seed=0, ref_name=None, n=30):
    """A kernel benchmark with its interleaved reference (both with scatter `rel`)."""
    return entry(f"tests/bench/test_bench.py::{name}", noisy(kernel_s, rel, n, seed),
                 ref=ref_name or f"cublas[{name}]", ref_samples=noisy(ref_s, rel, n, seed + 1000))
