"""Timing statistics, the device clock and the pytest-benchmark wiring, without a GPU."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import deepgemm
from deepgemm import bench
from deepgemm.testing import benchplugin

# The folder holding the deepgemm under test (the source tree, or site-packages under tox).
PACKAGE_ROOT = Path(deepgemm.__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------
# A fake device, also written into the subprocess projects below: one stream whose operations
# run in order, each starting once the host has queued it and the previous one has finished.
# Host time is simulated too, so launch work (host time before a kernel is queued) is explicit.

FAKE_DEVICE = '''
from deepgemm.bench import DeviceClock


class FakeGPU:
    def __init__(self):
        self.host = 0.0  # simulated host time, s
        self.free_at = 0.0  # when the stream's last queued operation finishes, s

    def enqueue(self, seconds):
        start = max(self.host, self.free_at)
        self.free_at = start + seconds
        return start

    def launch(self, overhead, seconds):
        """A kernel call: `overhead` of host work (Python, argument checks), then the kernel."""
        self.host += overhead
        self.enqueue(seconds)

    def event(self):
        gpu = self

        class Event:
            def record(self, stream=None):
                self.t = gpu.enqueue(0.0)  # stamped when the GPU reaches it

            def synchronize(self):
                gpu.host = max(gpu.host, self.t)

        return Event()

    @staticmethod
    def elapsed_ms(start, end):
        return (end.t - start.t) * 1e3

    def hold(self, seconds, stream=None):
        self.enqueue(seconds)

    def clock(self, hold=True):
        return DeviceClock(self.event, self.elapsed_ms, hold=self.hold if hold else None,
                           host_clock=lambda: self.host)


GPU = FakeGPU()


class FakeBackend:
    def __init__(self, name):
        self.name = name

    def unavailable_reason(self):
        return None if self.name else "no CUDA device (fake)"

    def identity(self):
        if not self.name:
            return None
        return {"name": self.name, "sm_count": 132, "cc": "9.0", "driver_version": "580.159.04",
                "cuda_runtime_version": "13.0", "sm_clock_max_mhz": 1980, "l2_bytes": 62914560}

    def new_clock(self):
        return GPU.clock()

    def flush_l2(self, stream=None):
        GPU.enqueue(1.0)  # a flush lasting a whole second: it must never be timed
'''

_fake = {}
exec(FAKE_DEVICE, _fake)
FakeGPU = _fake["FakeGPU"]


# ---------------------------------------------------------------------------------------------
# Statistics and units


def test_timing_stats_median_and_quartiles_match_numpy():
    rng = np.random.default_rng(0)
    for n in (2, 3, 4, 7, 20, 31):
        samples = rng.uniform(10, 20, n)
        st = bench.timing_stats(samples)
        q1, med, q3 = np.percentile(samples, [25, 50, 75])
        assert (st.q1, st.median, st.q3) == pytest.approx((q1, med, q3))
        assert st.iqr == pytest.approx(q3 - q1)
        assert (st.min, st.max, st.mean, st.n) == pytest.approx((samples.min(), samples.max(), samples.mean(), n))
        assert st.samples == tuple(samples)  # in measurement order, not sorted


def test_timing_stats_small_cases():
    st = bench.timing_stats([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert (st.median, st.q1, st.q3, st.iqr) == (5, 3, 7, 4)
    assert st.relative_iqr == pytest.approx(0.8) and st.median_seconds == pytest.approx(5e-6)
    one = bench.timing_stats([42.0])
    assert (one.median, one.iqr, one.n) == (42.0, 0.0, 1)
    with pytest.raises(ValueError):
        bench.timing_stats([])


def test_units_and_slug():
    assert bench.tflops(4096, 4096, 4096, 189e-6) == pytest.approx(727.2, abs=0.1)
    assert bench.gbps(4.19e12, 1.0) == pytest.approx(4190)
    assert bench.gpu_slug("NVIDIA H200") == "NVIDIA_H200"
    assert bench.gpu_slug(" NVIDIA A100-SXM4-80GB ") == "NVIDIA_A100-SXM4-80GB"
    assert bench.gpu_slug("NVIDIA H200 MIG 1g.18gb") == "NVIDIA_H200_MIG_1g.18gb"
    assert bench.gpu_slug("a/b\\c:d") == "a_b_c_d" and bench.gpu_slug("..") == "unknown_gpu"


def test_throughput_extra_info():
    info = benchplugin.add_throughput_info({}, 200e-6, m=4096, n=4096, k=4096,
                                           bytes_moved=3 * 4096 * 4096 * 2, reference_seconds=180e-6)
    assert info["tflops"] == pytest.approx(bench.tflops(4096, 4096, 4096, 200e-6))
    assert info["gbps"] == pytest.approx(3 * 4096 * 4096 * 2 / 200e-6 / 1e9)
    assert info["pct_cublas"] == pytest.approx(90.0)
    assert info["median_us"] == pytest.approx(200.0) and info["device_time"] is True


# ---------------------------------------------------------------------------------------------
# Device clock and time_device


def test_bare_events_measure_the_launch_gap():
    """Why the hold exists: with an idle GPU, host work after the start event gets timed."""
    gpu = FakeGPU()
    clock = gpu.clock(hold=False)
    clock.run(gpu.launch, 30e-6, 6e-6)
    assert clock() == pytest.approx(36e-6)


def test_device_clock_hold_hides_host_launch_work():
    gpu = FakeGPU()
    clock = gpu.clock()
    assert clock.run(lambda: gpu.launch(30e-6, 6e-6) or "result") == "result"
    assert clock() == pytest.approx(6e-6)  # the initial 50 µs hold covers 30 µs of launch work
    assert clock.hold_seconds == pytest.approx(2 * 30e-6 + 20e-6)

    before = clock()
    clock.run(gpu.launch, 200e-6, 6e-6)  # launch work outgrew the 80 µs hold: 120 µs leak once
    assert clock() - before == pytest.approx(120e-6 + 6e-6)
    before = clock()
    clock.run(gpu.launch, overhead=200e-6, seconds=7e-6)  # the adapted 420 µs hold covers it
    assert clock() - before == pytest.approx(7e-6)

    gpu.enqueue(5.0)  # device work queued outside run() (a flush, another kernel): not timed
    before = clock()
    clock.run(gpu.launch, 1e-3, 8e-6)
    assert clock() - before == pytest.approx(8e-6)


def test_time_device_flushes_outside_the_timed_region(monkeypatch):
    gpu = FakeGPU()
    flushes = []

    class Stream:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    fake_cupy = SimpleNamespace(cuda=SimpleNamespace(
        Event=gpu.event, get_elapsed_time=gpu.elapsed_ms, get_current_stream=Stream))

    def fake_flush(stream):
        flushes.append(stream)
        gpu.enqueue(1.0)  # a (slow) flush: must not be in any sample

    monkeypatch.setattr(bench, "_cupy", lambda: fake_cupy)
    monkeypatch.setattr(bench, "flush_l2_cache", fake_flush)
    monkeypatch.setattr(bench, "hold_stream", gpu.hold)
    durations = iter([9.0] * 2 + [10e-6, 12e-6, 11e-6, 30e-6, 11e-6])  # 2 warmups, then 5 reps

    def kernel():
        gpu.launch(20e-6, next(durations))

    st = bench.time_device(kernel, warmup=2, reps=5)
    assert st.samples == pytest.approx((10, 12, 11, 30, 11))  # µs; warmups excluded
    assert (st.median, st.n) == (pytest.approx(11), 5)
    assert len(flushes) == 7  # before every call, warmups included

    st = bench.time_device(lambda: gpu.launch(20e-6, 1e-6), warmup=0, reps=3, flush_l2=False)
    assert st.median == pytest.approx(1.0) and len(flushes) == 7


# ---------------------------------------------------------------------------------------------
# pytest-benchmark for real, in a subprocess, with the fake GPU behind the plugin.

CONFTEST = '''
import os
import deepgemm.testing.benchplugin as benchplugin
import fakedevice

benchplugin.backend = fakedevice.FakeBackend(os.environ["FAKE_GPU_NAME"])
pytest_plugins = ["deepgemm.testing.benchplugin"]
'''

TEST_FILE = '''
import os
import time
from fakedevice import GPU

SLOWDOWN = float(os.environ.get("FAKE_SLOWDOWN", "1"))
WARMUP = [0.25e-3, 0.25e-3]
ROUNDS = [10.0e-6, 10.1e-6, 10.2e-6, 10.3e-6, 10.4e-6, 10.5e-6, 10.6e-6]


def make_kernel(durations):
    durations = iter(durations)

    def kernel(x):
        time.sleep(0.001)  # real host time, 100x the device time: what a host timer would store
        GPU.launch(4e-3, next(durations) * SLOWDOWN)  # 4 ms of launch work before the kernel
        return x + 1

    return kernel


def test_gemm(device_benchmark):
    assert device_benchmark(make_kernel(WARMUP + ROUNDS), 41, rounds=7, warmup_rounds=2) == 42
    device_benchmark.record_throughput(m=256, n=256, k=256, reference_seconds=9e-6)


def test_benchmark_requested_first(benchmark, device_benchmark):
    device_benchmark(make_kernel([20e-6] * 6), 0, rounds=5, warmup_rounds=1, flush_l2=False)
'''


@pytest.fixture
def bench_project(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # makes tmp_path the rootdir
    (tmp_path / "fakedevice.py").write_text(FAKE_DEVICE)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_fake_bench.py").write_text(TEST_FILE)

    def run(*args, gpu="Fake GPU X", slowdown=1.0, with_pytest_benchmark=True):
        # Only pytest-benchmark is loaded: no other installed plugin (hypothesis alone takes
        # seconds to import) and no deepgemm entry point interferes.
        # Not an xdist worker, even when this test runs in one (pytest-benchmark saves nothing there).
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
        env.update(FAKE_GPU_NAME=gpu, FAKE_SLOWDOWN=str(slowdown), PYTEST_ADDOPTS="",
                   PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
                   PYTHONPATH=os.pathsep.join([str(PACKAGE_ROOT), os.environ.get("PYTHONPATH", "")]))
        plugins = ["-p", "pytest_benchmark.plugin"] if with_pytest_benchmark else []
        proc = subprocess.run([sys.executable, "-m", "pytest", *plugins, "-p", "no:cacheprovider",
                               "-q", *args],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        return proc.returncode, proc.stdout + proc.stderr

    return tmp_path, run


def test_pytest_benchmark_stores_device_time_per_gpu(bench_project):
    root, run = bench_project
    rc, out = run("--benchmark-save=base", "--benchmark-save-data")
    assert rc == 0, out
    [saved] = (root / "regressions").rglob("*.json")
    # <rootdir>/regressions/<gpu slug>/<OS-Python-bits>/0001_base.json
    assert saved.relative_to(root / "regressions").parts[0] == "Fake_GPU_X"
    assert saved.name == "0001_base.json" and not (root / ".benchmarks").exists()

    data = json.loads(saved.read_text())
    assert data["machine_info"]["gpu"]["name"] == "Fake GPU X"
    assert data["machine_info"]["gpu"]["sm_count"] == 132
    benches = {b["name"]: b for b in data["benchmarks"]}
    gemm = benches["test_gemm"]
    # Exactly the fake kernels' device times: no warmup rounds, no 1 ms host sleeps, no 4 ms
    # of launch work, no 1 s L2 flushes.
    assert gemm["stats"]["data"] == pytest.approx([10.0e-6, 10.1e-6, 10.2e-6, 10.3e-6, 10.4e-6, 10.5e-6, 10.6e-6])
    assert gemm["stats"]["median"] == pytest.approx(10.3e-6)
    assert gemm["options"]["timer"] == "device_clock"
    assert gemm["extra_info"]["tflops"] == pytest.approx(bench.tflops(256, 256, 256, 10.3e-6))
    assert gemm["extra_info"]["pct_cublas"] == pytest.approx(100 * 9 / 10.3)
    # Also when the test asked for `benchmark` before `device_benchmark`.
    assert benches["test_benchmark_requested_first"]["stats"]["data"] == pytest.approx([20e-6] * 5)

    # The gate: 20% slower device times fail pytest-benchmark's own compare on this GPU...
    rc, out = run("--benchmark-only", "--benchmark-compare", "--benchmark-compare-fail=median:5%",
                  slowdown=1.2)
    assert rc != 0 and "Performance has regressed" in out, out
    rc, out = run("--benchmark-only", "--benchmark-compare", "--benchmark-compare-fail=median:5%",
                  slowdown=1.01)
    assert rc == 0 and "2 passed" in out, out  # --benchmark-only counts them as benchmarks

    # ...while another GPU model never sees this baseline.
    rc, out = run("--benchmark-compare", "--benchmark-compare-fail=median:5%", gpu="Fake GPU Y")
    assert rc == 4 and "No benchmark baseline for GPU 'Fake GPU Y'" in out, out
    assert "Fake_GPU_Y" in out and "'Fake GPU X'" in out  # where it looked, what exists
    # Pointing it at the other GPU's folder explicitly is refused outright.
    rc, out = run(f"--benchmark-storage={root / 'regressions' / 'Fake_GPU_X'}", "--benchmark-compare",
                  gpu="Fake GPU Y")
    assert rc != 0 and "Refusing to compare benchmarks across GPU models" in out, out


def test_device_benchmark_skips_without_gpu(bench_project):
    root, run = bench_project
    rc, out = run("-rs", "--benchmark-autosave", gpu="")
    assert rc == 0, out
    assert "2 skipped" in out and "device benchmark needs a GPU: no CUDA device (fake)" in out
    assert not (root / "regressions").exists()
    # Without pytest-benchmark at all (the test file also asks for `benchmark`, so drop that test).
    rc, out = run("-rs", "-k", "not requested_first", gpu="Fake GPU X", with_pytest_benchmark=False)
    assert rc == 0 and "1 skipped" in out and "device benchmarks need pytest-benchmark" in out, out
