"""Timing statistics, the device clock and the pytest-benchmark wiring, without a GPU."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from subprocess_env import child_env

import deepgemm
from deepgemm import bench, device
from deepgemm.testing import benchplugin
from fake_bench_project import FAKE_DEVICE, write_project

# The folder holding the deepgemm under test (the source tree, or site-packages under tox).
PACKAGE_ROOT = Path(deepgemm.__file__).resolve().parents[1]


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
    assert bench.timing_stats([0.25, 0.5, 0.75]).relative_iqr == pytest.approx(0.5)   # a median under 1 µs
    assert bench.timing_stats([0.0, 0.0]).relative_iqr == 0.0                          # no division by a zero median
    with pytest.raises(ValueError, match="^timing_stats needs at least one sample$"):
        bench.timing_stats([])
    for reps in (0, -3):   # refused before any device work (no GPU here)
        with pytest.raises(ValueError, match="^reps must be >= 1$"):
            bench.time_device(lambda: None, reps=reps)


def test_units_and_slug():
    assert bench.tflops(4096, 4096, 4096, 189e-6) == pytest.approx(727.2, abs=0.1)
    assert bench.gbps(4.19e12, 1.0) == pytest.approx(4190)
    assert device.gpu_slug("NVIDIA H200") == "NVIDIA_H200"
    assert device.gpu_slug(" NVIDIA A100-SXM4-80GB ") == "NVIDIA_A100-SXM4-80GB"
    assert device.gpu_slug("NVIDIA H200 MIG 1g.18gb") == "NVIDIA_H200_MIG_1g.18gb"
    assert device.gpu_slug("a/b\\c:d") == "a_b_c_d" and device.gpu_slug("..") == "unknown_gpu"


def test_throughput_extra_info():
    info = benchplugin.add_throughput_info({}, 200e-6, m=4096, n=4096, k=4096,
                                           bytes_moved=3 * 4096 * 4096 * 2, reference_seconds=180e-6)
    assert info["tflops"] == pytest.approx(bench.tflops(4096, 4096, 4096, 200e-6))
    assert info["gbps"] == pytest.approx(3 * 4096 * 4096 * 2 / 200e-6 / 1e9)
    assert info["pct_cublas"] == pytest.approx(90.0)
    assert info["median_us"] == pytest.approx(200.0) and info["device_time"] is True
    assert info["reference_us"] == pytest.approx(180.0)   # what the history reads for runs before named references
    assert (info["m"], info["n"], info["k"], info["flops"]) == (4096, 4096, 4096, 2.0 * 4096 ** 3)
    bare = benchplugin.add_throughput_info({}, 5e-6, flops=1e6)   # no sizes, bytes or reference: none of theirs
    assert bare == {"device_time": True, "median_us": pytest.approx(5.0), "flops": 1e6, "tflops": pytest.approx(0.2)}

    explicit = benchplugin.add_throughput_info({}, 1e-3, m=8, n=8, k=8, flops=3e9)   # given flops win
    assert explicit["flops"] == 3e9 and explicit["tflops"] == pytest.approx(3.0) and "m" not in explicit


def test_gate_options_become_the_rule_in_its_units():
    """--gate-min-change takes 5% or 0.05; --gate-min-diff-us is in µs (the rule keeps seconds);
    options not given keep the rule's defaults; a bad value is a usage error naming what is wrong."""
    from deepgemm.gate.verdict import Rule
    assert benchplugin._percent("5%") == pytest.approx(0.05) and benchplugin._percent("0.05") == 0.05
    with pytest.raises(pytest.UsageError, match=r"--gate-min-change: expected e\.g\. 5% or 0\.05, got 'five'"):
        benchplugin._percent("five")
    config = lambda **given: SimpleNamespace(getoption=given.get)
    rule = benchplugin._rule(config(gate_min_diff_us=2.0, gate_min_change=0.07, gate_alpha=0.05))
    assert (rule.min_diff_s, rule.min_change, rule.alpha) == (pytest.approx(2e-6), 0.07, 0.05)
    assert benchplugin._rule(config()) == Rule()
    with pytest.raises(pytest.UsageError, match=r"^gate options: alpha: must be in \(0, 1\)"):
        benchplugin._rule(config(gate_alpha=1.5))


@pytest.mark.parametrize("name", ["", None, 3])
def test_a_reference_needs_a_name_and_a_function(name):
    with pytest.raises(ValueError, match=r"^name: a non-empty string naming the reference"):
        benchplugin.Reference(name, lambda: None)
    with pytest.raises(TypeError, match=r"^fn: must be callable, got int"):
        benchplugin.Reference("cublas[x]", 3)

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
    assert clock.hold_seconds == pytest.approx(2 * 200e-6 + 20e-6)   # twice this call's enqueue time + 20 µs
    before = clock()
    clock.run(gpu.launch, overhead=200e-6, seconds=7e-6)  # the adapted 420 µs hold covers it
    assert clock() - before == pytest.approx(7e-6)

    gpu.enqueue(5.0)  # device work queued outside run() (a flush, another kernel): not timed
    before = clock()
    clock.run(gpu.launch, 1e-3, 8e-6)
    assert clock() - before == pytest.approx(8e-6)

    clock.run(gpu.launch, 1.0, 8e-6)   # a second of launch work: the hold stays at its cap
    assert clock.hold_seconds == bench.MAX_HOLD_S


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

    def fake_flush(stream, how):
        flushes.append((stream, how))
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
    assert {how for _, how in flushes} == {"read"}   # True is the read-pass flush

    st = bench.time_device(lambda: gpu.launch(20e-6, 1e-6), warmup=0, reps=3, flush_l2=False)
    assert st.median == pytest.approx(1.0) and len(flushes) == 7

    calls = []
    st = bench.time_device(lambda: calls.append(gpu.launch(20e-6, 1e-6)), flush_l2=False)
    assert (st.n, len(calls)) == (20, 23)   # by default 3 warmups, then 20 timed reps

    st = bench.time_device(lambda: gpu.launch(20e-6, 1e-6), warmup=0, reps=2, flush_l2="write")
    assert [how for _, how in flushes[7:]] == ["write", "write"]
    with pytest.raises(ValueError, match="flush_l2"):
        bench.time_device(lambda: gpu.launch(20e-6, 1e-6), reps=1, flush_l2="clean")


def test_the_write_flush_overwrites_twice_the_l2_on_the_given_stream_from_one_buffer(monkeypatch):
    """how="write": a memset of 2 x the device's L2 (64 MiB where the attribute is missing), on the
    caller's stream (default: the current one), from one buffer per device."""
    memsets, allocations = [], []

    class Buffer:
        def __init__(self, nbytes):
            self.nbytes = nbytes
            self.data = SimpleNamespace(memset_async=lambda value, n, stream: memsets.append((value, n, stream)))
            allocations.append(nbytes)

    device = SimpleNamespace(id=0, attributes={"L2CacheSize": 50 << 20})
    fake_cupy = SimpleNamespace(uint8="uint8", empty=lambda n, dtype: Buffer(n),
                                cuda=SimpleNamespace(Device=lambda: device, get_current_stream=lambda: "current"))
    monkeypatch.setattr(bench, "_cupy", lambda: fake_cupy)
    monkeypatch.setattr(bench, "_flush_buffers", {})
    bench.flush_l2_cache("mine", how="write")
    bench.flush_l2_cache(how="write")
    assert allocations == [100 << 20]                       # one buffer for the device, 2 x its L2
    assert memsets == [(0, 100 << 20, "mine"), (0, 100 << 20, "current")]
    device.id, device.attributes = 1, {}
    bench.flush_l2_cache("mine", how="write")
    assert allocations == [100 << 20, 128 << 20]            # another device, L2 size unknown: 2 x 64 MiB
    with pytest.raises(ValueError, match="how"):
        bench.flush_l2_cache("mine", how="clean")


class NamedStream:
    """A stand-in CuPy stream: inside `with`, its name is on top of `current` (the current stream)."""

    def __init__(self, name, current):
        self.name, self._current = name, current

    def __enter__(self):
        self._current.append(self.name)

    def __exit__(self, *exc):
        self._current.pop()


def test_the_read_flush_reads_the_zeroed_buffer_and_writes_nothing(monkeypatch):
    """The default flush (how="read"): the buffer is zeroed once when it is made (the kernel's
    guarded store relies on zeros), then every flush is one read-only pass over all of it, on the
    caller's stream."""
    calls, current = [], ["default"]

    class Buffer:
        def __init__(self, nbytes):
            self.nbytes = nbytes
            self.data = SimpleNamespace(
                memset_async=lambda value, n, stream: calls.append(("memset", value, n, stream)))

    class RawKernel:
        def __init__(self, source, name):
            assert "deepgemm_l2_read" in source and name == "deepgemm_l2_read"

        def __call__(self, grid, block, args):
            calls.append(("read", args[0].nbytes, int(args[1]), current[-1]))

    device = SimpleNamespace(id=0, attributes={"L2CacheSize": 50 << 20, "MultiProcessorCount": 132})
    fake_cupy = SimpleNamespace(uint8="uint8", uint32="uint32", uint64=int, empty=lambda n, dtype: Buffer(n),
                                zeros=lambda n, dtype: object(), RawKernel=RawKernel,
                                cuda=SimpleNamespace(Device=lambda: device,
                                                     get_current_stream=lambda: NamedStream("current", current)))
    monkeypatch.setattr(bench, "_cupy", lambda: fake_cupy)
    monkeypatch.setattr(bench, "_flush_buffers", {})
    monkeypatch.setattr(bench, "_read_kernels", {})
    mine = NamedStream("mine", current)
    bench.flush_l2_cache(mine)
    assert [c[0] for c in calls] == ["memset", "read", "read"]          # made: zeroed, read twice
    assert calls[0][1:3] == (0, 100 << 20) and calls[1][1:] == (100 << 20, (100 << 20) // 16, "mine")
    calls.clear()
    bench.flush_l2_cache(mine, how="read")
    assert calls == [("read", 100 << 20, (100 << 20) // 16, "mine")]    # then one read pass, no memset


def test_the_hold_spins_for_the_given_time_on_the_given_stream(monkeypatch):
    launches, current = [], ["default"]

    class RawKernel:
        def __init__(self, source, name):
            assert name == "deepgemm_hold" and "globaltimer" in source

        def __call__(self, grid, block, args):
            launches.append((grid, block, int(args[0]), current[-1]))

    fake_cupy = SimpleNamespace(RawKernel=RawKernel, uint64=int, cuda=SimpleNamespace(Device=lambda: SimpleNamespace(id=0)))
    monkeypatch.setattr(bench, "_cupy", lambda: fake_cupy)
    monkeypatch.setattr(bench, "_hold_kernels", {})
    bench.hold_stream(50e-6)
    bench.hold_stream(2e-3, NamedStream("mine", current))
    assert launches == [((1,), (1,), 50_000, "default"), ((1,), (1,), 2_000_000, "mine")]   # one thread, ns


# ---------------------------------------------------------------------------------------------
# pytest-benchmark for real, in a subprocess, with the fake GPU behind the plugin
# (tests/cpu/fake_bench_project.py).


@pytest.fixture
def bench_project(tmp_path):
    write_project(tmp_path)  # tmp_path is its rootdir (pytest.ini)

    def run(*args, gpu="Fake GPU X", with_pytest_benchmark=True, commit="c0ffee0000" + "0" * 30, **fake):
        # Only pytest-benchmark is loaded: no other installed plugin (hypothesis alone takes
        # seconds to import) and no deepgemm entry point interferes.
        env = child_env(FAKE_GPU_NAME=gpu, PYTEST_ADDOPTS="", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
                   DEEPGEMM_COMMIT=commit,
                   PYTHONPATH=os.pathsep.join([str(PACKAGE_ROOT), os.environ.get("PYTHONPATH", "")]),
                   **{f"FAKE_{k.upper()}": v for k, v in fake.items()})
        plugins = ["-p", "pytest_benchmark.plugin"] if with_pytest_benchmark else []
        proc = subprocess.run([sys.executable, "-m", "pytest", *plugins, "-p", "no:cacheprovider",
                               "-q", *args],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        return proc.returncode, proc.stdout + proc.stderr

    return tmp_path, run


def test_pytest_benchmark_stores_device_time_and_reference_per_key(bench_project):
    root, run = bench_project
    rc, out = run("test_fake_bench.py", "--benchmark-save=base")
    assert rc == 0, out
    [saved] = (root / "regressions").rglob("*.json")
    # <rootdir>/regressions/<GPU slug>/<key>/history/<date>_<time>_<commit>_<name>.json
    parts = saved.relative_to(root / "regressions").parts
    assert parts[:3] == ("Fake_GPU_X", "driver580-cuda13", "history"), parts
    assert saved.name.endswith("_c0ffee0000_base.json") and not (root / ".benchmarks").exists()
    assert not (saved.parents[1] / "baseline.json").exists()  # only --benchmark-save=baseline is one

    data = json.loads(saved.read_text())
    assert data["machine_info"]["gpu"]["name"] == "Fake GPU X"
    assert data["deepgemm_gate"]["key"]["folder"] == "Fake_GPU_X/driver580-cuda13"
    benches = {b["name"]: b for b in data["benchmarks"]}
    gemm = benches["test_gemm"]
    # Exactly the fake kernels' device times: no warmup rounds, no 1 ms host sleeps, no 4 ms
    # of launch work, no 1 s L2 flushes; the reference's rounds likewise, warmups dropped.
    assert gemm["stats"]["data"] == pytest.approx([10.0e-6, 10.1e-6, 10.2e-6, 10.3e-6, 10.4e-6, 10.5e-6, 10.6e-6])
    ref = gemm["extra_info"]["reference"]
    assert ref["name"] == "cublas[256^3]"
    assert ref["samples"] == pytest.approx([9.0e-6, 9.2e-6, 8.8e-6, 9.1e-6, 8.9e-6, 9.0e-6, 9.3e-6])
    assert ref["median"] == pytest.approx(9.0e-6)
    assert gemm["stats"]["median"] == pytest.approx(10.3e-6)
    assert gemm["options"]["timer"] == "device_clock"
    assert gemm["extra_info"]["tflops"] == pytest.approx(bench.tflops(256, 256, 256, 10.3e-6))
    assert gemm["extra_info"]["pct_cublas"] == pytest.approx(100 * 9 / 10.3)
    tel = gemm["extra_info"]["telemetry"]
    assert tel["source"] == "fake" and tel["before"]["sm_mhz"] > tel["after"]["sm_mhz"]
    # Also when the test asked for `benchmark` before `device_benchmark` (no reference there).
    first = benches["test_benchmark_requested_first"]
    assert first["stats"]["data"] == pytest.approx([20e-6] * 5) and "reference" not in first["extra_info"]


def test_benchmark_compare_is_the_gate(bench_project):
    """`pytest --benchmark-compare`: exit 0 on unchanged code and on machine drift, exit 1 on a
    slowdown (also one hidden inside drift), the verdict printed and written as Markdown/JSON."""
    root, run = bench_project
    rc, out = run("test_fake_gate.py", "--benchmark-only", "--benchmark-save=baseline", seed=1)
    assert rc == 0, out
    key = root / "regressions" / "Fake_GPU_X" / "driver580-cuda13"
    assert (key / "baseline.json").exists() and len(list((key / "history").glob("*.json"))) == 1

    md, verdict_json = root / "out" / "verdict.md", root / "out" / "verdict.json"
    gate = ["test_fake_gate.py", "--benchmark-only", "--benchmark-compare", f"--gate-markdown={md}",
            f"--gate-verdict={verdict_json}"]
    rc, out = run(*gate, seed=2)
    assert rc == 0 and "benchmark gate: PASS (2 same)" in out and "all 2 benchmark(s) the same" in out, out
    assert md.read_text().startswith("## ✅ Benchmark gate: PASS")
    assert json.loads(verdict_json.read_text())["result"] == "pass"

    rc, out = run(*gate, seed=3, slowdown=1.2)
    assert rc == 1 and "FAIL: 1 benchmark(s) slower" in out and "SLOWER" in out, out
    assert "| SLOWER | test_fake_gate.py::test_gemm |" in md.read_text()
    assert json.loads(verdict_json.read_text())["counts"] == {"slower": 1, "same": 1}

    rc, out = run(*gate, seed=4, drift=1.1)  # the GPU is 10 % slower today, the code is not
    assert rc == 0 and "environment drift: 2 of 2 references moved" in out, out
    assert "drift: absolute +10" in out

    rc, out = run(*gate, seed=5, drift=1.07, slowdown=1.15)  # slower than the drift explains
    assert rc == 1 and "SLOWER" in out and "environment drift" in out, out
    # Saving history while gating does not replace the baseline.
    assert len(list((key / "history").glob("*.json"))) == 1


def test_gate_confirm_times_the_slower_benchmarks_again_alone(bench_project):
    """--gate-confirm=FIRST.json runs only what FIRST.json was found slower in, and fails only if it
    is slower again; it refuses a run with nothing slower, and runs only beside --benchmark-compare."""
    root, run = bench_project
    rc, out = run("test_fake_gate.py", "--benchmark-only", "--benchmark-save=baseline", seed=1)
    assert rc == 0, out
    first, counter = root / "out" / "first.json", root / ".fake_sessions"
    first.parent.mkdir()
    gate = ["test_fake_gate.py", "--benchmark-only", "--benchmark-compare"]

    counter.unlink()
    rc, out = run(*gate, f"--benchmark-json={first}", seed=3, slowdown="1.2,1")   # slower once: a passing disturbance
    assert rc == 1 and "FAIL: 1 benchmark(s) slower" in out, out
    verdict_json = root / "out" / "again-verdict.json"
    rc, out = run(*gate, f"--gate-confirm={first}", f"--gate-verdict={verdict_json}", seed=4, slowdown="1.2,1")
    assert rc == 0 and "1 passed, 1 deselected" in out and "PASS (1 unsure, 1 same)" in out, out
    assert "not confirmed" in out and "confirmation: 1 benchmark(s) found slower timed again alone" in out
    data = json.loads(verdict_json.read_text())
    assert data["result"] == "pass" and data["again"]["benchmarks"] == ["test_fake_gate.py::test_gemm"]
    assert data["tests_ok"] is True

    counter.unlink()
    rc, out = run(*gate, f"--benchmark-json={first}", seed=5, slowdown="1.2")   # slower every time: the code
    assert rc == 1, out
    rc, out = run(*gate, f"--gate-confirm={first}", seed=6, slowdown="1.2")
    assert rc == 1 and "FAIL: 1 benchmark(s) slower" in out and "slower again alone (+19" in out, out

    rc, out = run(*gate, f"--benchmark-json={first}", seed=7)
    assert rc == 0, out
    rc, out = run(*gate, f"--gate-confirm={first}", seed=8)
    assert rc == 4 and "no benchmark of that run is slower than the baseline" in out and "nothing to confirm" in out, out
    rc, out = run("test_fake_gate.py", "--benchmark-only", "--benchmark-autosave", f"--gate-confirm={first}")
    assert rc == 4 and "--gate-confirm needs --benchmark-compare" in out, out
    rc, out = run(*gate, f"--gate-confirm={root / 'nothing.json'}")
    assert rc == 4 and "--gate-confirm=" in out and "nothing.json" in out, out


def test_gate_refuses_what_it_cannot_compare(bench_project):
    root, run = bench_project
    rc, out = run("test_fake_gate.py", "--benchmark-only", "--benchmark-save=baseline", seed=1)
    assert rc == 0, out
    baseline = root / "regressions" / "Fake_GPU_X" / "driver580-cuda13" / "baseline.json"

    # Another driver branch: its own key, no baseline there; says where it looked and what exists.
    rc, out = run("test_fake_gate.py", "--benchmark-compare", driver="575.64.05")
    assert rc == 4 and "No baseline for [Fake GPU X, driver 575, CUDA 13]" in out, out
    assert "Fake GPU X, driver 580, CUDA 13" in out and "--benchmark-save=baseline" in out
    # Pointing it at the other key's baseline explicitly is refused, naming both keys.
    rc, out = run("test_fake_gate.py", f"--benchmark-compare={baseline}", driver="575.64.05")
    assert rc == 4 and "Refusing to compare across baseline keys" in out, out
    assert "[Fake GPU X, driver 580, CUDA 13]" in out and "[Fake GPU X, driver 575, CUDA 13]" in out
    # A path that is not a file: named, with what to give instead.
    rc, out = run("test_fake_gate.py", f"--benchmark-compare={root / 'missing.json'}")
    assert rc == 4 and f"--benchmark-compare={root / 'missing.json'}: no such file. Give a run's JSON" in out, out
    # pytest-benchmark's fixed-percentage gate is not accepted in its place.
    rc, out = run("test_fake_gate.py", "--benchmark-compare", "--benchmark-compare-fail=median:5%")
    assert rc == 4 and "Drop --benchmark-compare-fail" in out, out
    # No GPU: the gate cannot run, and says so rather than passing.
    rc, out = run("test_fake_gate.py", "--benchmark-compare", gpu="")
    assert rc == 4 and "--benchmark-compare needs a GPU: no CUDA device (fake)" in out, out
    # A baseline in the old format (medians only): refused before anything runs, with the fix.
    data = json.loads(baseline.read_text())
    for b in data["benchmarks"]:
        del b["stats"]["data"]
    baseline.write_text(json.dumps(data))
    rc, out = run("test_fake_gate.py", "--benchmark-compare")
    assert rc == 4 and "holds no raw samples" in out and "pytest tests/bench --benchmark-only --benchmark-save=baseline" in out, out
    assert "passed" not in out  # nothing ran


def test_device_benchmark_skips_without_gpu(bench_project):
    root, run = bench_project
    rc, out = run("test_fake_bench.py", "-rs", "--benchmark-autosave", gpu="")
    assert rc == 0, out
    assert "2 skipped" in out and "device benchmark needs a GPU: no CUDA device (fake)" in out
    assert not list(root.rglob("*.json"))  # nothing saved
    # Without pytest-benchmark at all (the test file also asks for `benchmark`, so drop that test).
    rc, out = run("test_fake_bench.py", "-rs", "-k", "not requested_first", gpu="Fake GPU X",
                  with_pytest_benchmark=False)
    assert rc == 0 and "1 skipped" in out and "device benchmarks need pytest-benchmark" in out, out


def test_a_new_baseline_is_held_against_the_stored_runs(bench_project):
    """--benchmark-save=baseline names the benchmarks that lie outside the range of their stored runs
    (deepgemm.gate.history.outside_history) before it saves: a run at the fast edge of its code's
    range makes the gate fail later runs of unchanged code. Not before three stored runs exist."""
    root, run = bench_project
    for i in range(3):
        rc, out = run("test_fake_gate.py", "--benchmark-only", f"--benchmark-save=run{i}", seed=10 + i,
                      commit=f"{i}" * 40)
        assert rc == 0 and "against the stored runs" not in out, out
    rc, out = run("test_fake_gate.py", "--benchmark-only", "--benchmark-save=baseline", seed=20, commit="3" * 40)
    assert rc == 0 and "every benchmark with 3+ stored runs lies within 2% of the range of its last 8" in out, out
    rc, out = run("test_fake_gate.py", "--benchmark-only", "--benchmark-save=baseline", seed=21, commit="4" * 40,
                  slowdown=0.8)
    assert rc == 0 and "against the stored runs: 1 benchmark(s) lie more than 2% outside" in out, out
    assert re.search(r"test_fake_gate.py::test_gemm: ratio to its reference [\d.]+×, 2\d\.\d% below its last 4 stored runs", out), out
    key = root / "regressions" / "Fake_GPU_X" / "driver580-cuda13"
    assert (key / "baseline.json").exists() and len(list((key / "history").glob("*.json"))) == 5   # saved all the same


def test_a_stored_run_that_cannot_be_read_as_history_does_not_stop_the_recording(bench_project):
    """The stored-run check is advice: a history file it cannot use (a benchmark without stats, as
    no run of the plugin writes) is named and the baseline is saved all the same."""
    root, run = bench_project
    history = root / "regressions" / "Fake_GPU_X" / "driver580-cuda13" / "history"
    history.mkdir(parents=True)
    for i in range(3):
        (history / f"2026-11-1{i}_000000_{i}.json").write_text(json.dumps(
            {"datetime": f"2026-11-1{i}T00:00:00+00:00", "commit_info": {"id": f"{i}" * 40},
             "machine_info": {"gpu": {"name": "Fake GPU X"}},
             "benchmarks": [{"fullname": "test_fake_gate.py::test_gemm", "extra_info": {}}]}))
    rc, out = run("test_fake_gate.py", "--benchmark-only", "--benchmark-save=baseline", seed=1)
    assert rc == 0 and "against the stored runs: not checked (KeyError" in out, out
    assert (history.parent / "baseline.json").exists()


def _load(path: Path, name: str):
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dispatch_summary_names_auto_behind_the_best_kernel_and_a_benchmark_only_run_prints_it(monkeypatch):
    """test_summary is no benchmark, so the gate and a recording (--benchmark-only) skip it; the
    bench conftest then prints the same tables, the shapes where auto is > 3 % behind named."""
    bench_dir = PACKAGE_ROOT / "tests" / "bench"
    mod = _load(bench_dir / "test_bench_dispatch.py", "test_bench_dispatch")
    monkeypatch.setitem(mod.RESULTS, "model", {
        "bert_qkv": {"auto": 10e-6, "v5": 9.5e-6, "v4": 20e-6, "cublas": 9e-6},     # 5 % behind V5
        "llama_attn": {"auto": 10e-6, "v5": 9.8e-6, "cublas": 11e-6}})              # 2 %: within
    text, bad = mod.summary()
    assert bad == ["bert_qkv: auto 10.0 us vs v5 9.5 us"]
    assert "auto > 3% slower than the best single kernel:" in text and "geometric mean" in text

    conftest = _load(bench_dir / "conftest.py", "bench_conftest")
    written = []
    monkeypatch.setitem(sys.modules, "test_bench_dispatch", mod)
    reporter = SimpleNamespace(write_sep=lambda *a: written.append(a), write_line=written.append)
    for benchmark_only in (False, True):
        config = SimpleNamespace(getoption=lambda name, default=None, v=benchmark_only: v)
        conftest.pytest_terminal_summary(reporter, 0, config)
        assert (text in written) == benchmark_only


def test_the_gate_times_every_code_path_of_v5_and_small_m_at_a_shape_each_accepts():
    """test_code_paths: one benchmark per switch value in KernelSpec.path_configs (the configs the
    static checks compile beside the default), each a config its kernel accepts at its shape (its
    kernel's, or the one PATH_SHAPE_OF gives it); the switches no shipped table picks on the H200
    (B multicast, the register-store epilogue) among them."""
    from deepgemm import registry
    from deepgemm.dispatch import shape_problem
    mod = _load(PACKAGE_ROOT / "tests" / "bench" / "test_bench.py", "test_bench")
    timed = {(kernel, name, value): config for kernel, name, value, config in mod.PATH_CASES}
    for kernel in ("v5", "small_m"):
        spec = registry.get(kernel)
        paths = spec.path_configs()
        assert paths and all(timed[(kernel, name, value)] == config for name, value, config in paths)
        for name, value, config in paths:
            m, n, k = mod.SHAPES[mod.path_shape(kernel, name, value)]
            problem = shape_problem(m, n, k, "float16", None, mod.PATH_LAYOUT, None, 90, None)
            full = spec.config_defines(config)
            assert spec.supports(problem) is None and spec.config_supports(full, problem) is None, config
    switched = {(name, value) for kernel, name, value in timed if kernel == "v5"}
    assert {("DG_CLUSTER_M", 2), ("DG_EPI_TMA", 0), ("DG_PINGPONG", 1), ("DG_BM", 64), ("DG_SPLIT_K", 2)} <= switched
    assert ("small_m", "DG_SMALL_M_STAGES", 2) in timed


def test_a_device_benchmark_flushes_the_l2_before_every_round_and_interleaves_its_reference(monkeypatch):
    """DeviceBenchmark with a fake device and pytest-benchmark's pedantic loop (setup, then the
    target, once per warm-up round and per round): the L2 is flushed before every timed kernel,
    the reference's and ours, with or without a reference; without flush_l2 and a reference
    nothing runs between rounds; the reference's samples are its timed rounds only."""
    events = []

    class Clock:
        def __init__(self, name, steps):
            self.name, self.steps, self.seconds = name, list(steps), 0.0

        def run(self, fn, *args, stream=None, **kwargs):
            events.append(self.name)
            self.seconds += self.steps.pop(0)
            return fn(*args, **kwargs)

    class Telemetry:
        read = staticmethod(lambda: {})
        around = staticmethod(lambda before, after: {"clocks": "steady"})

    class Backend:
        new_clock = staticmethod(lambda: Clock("reference", [9e-6, 2e-6, 3e-6]))   # a slow warm-up round
        flush_l2 = staticmethod(lambda stream=None: events.append("flush"))
        telemetry = staticmethod(lambda: Telemetry())

    class Benchmark:
        disabled = False

        def __init__(self):
            self.extra_info = {}

        def pedantic(self, target, args=(), kwargs=None, setup=None, rounds=1, warmup_rounds=0, iterations=1):
            for _ in range(warmup_rounds + rounds):
                if setup is not None:
                    setup()
                result = target(*args, **(kwargs or {}))
            return result

    monkeypatch.setattr(benchplugin, "backend", Backend())

    def run(**kw):
        events.clear()
        bench_ = benchplugin.DeviceBenchmark(Benchmark(), Clock("kernel", [1e-6] * 3), default_rounds=2)
        assert bench_(lambda x: x + 1, 41, warmup_rounds=1, **kw) == 42
        return bench_
    run()
    assert events == ["flush", "kernel"] * 3
    run(flush_l2=False)
    assert events == ["kernel"] * 3
    done = run(reference=benchplugin.Reference("cublas[x]", lambda: None))
    assert events == ["flush", "reference", "flush", "kernel"] * 3
    assert done.reference_seconds == [pytest.approx(2e-6), pytest.approx(3e-6)]
    assert done.extra_info["reference"]["name"] == "cublas[x]" and done.extra_info["telemetry"] == {"clocks": "steady"}
    assert done.extra_info["reference"]["median"] == pytest.approx(2.5e-6)
    run(reference=benchplugin.Reference("cublas[x]", lambda: None), flush_l2=False)
    assert events == ["reference", "kernel"] * 3
    with pytest.raises(TypeError, match=r"^reference: expected a benchplugin.Reference, got function"):
        run(reference=lambda: None)


def test_the_real_backend_asks_the_device_once_and_has_no_identity_without_a_gpu(monkeypatch):
    """CupyBackend: availability asked once; no GPU, no identity (the run's machine_info gets none);
    with a GPU, the identity is the device's, with the cuBLAS version and PCI bus id where CuPy
    gives them (None where it does not), read once per process."""
    import sys
    import types
    from deepgemm import device
    from deepgemm.testing import benchplugin
    asked = []
    monkeypatch.setattr(device, "gpu_available", lambda: asked.append("gpu") or (False, "no GPU here"))
    cpu = benchplugin.CupyBackend()
    assert cpu.unavailable_reason() == "no GPU here" and cpu.identity() is None and asked == ["gpu"]
    monkeypatch.setattr(device, "gpu_available", lambda: asked.append("gpu") or (True, ""))
    monkeypatch.setattr(device, "identity", lambda: asked.append("identity") or {"name": "Fake GPU"})
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=types.SimpleNamespace(
        Device=lambda: types.SimpleNamespace(pci_bus_id="0000:19:00.0"))))   # no cublas here: None
    gpu = benchplugin.CupyBackend()
    first = gpu.identity()
    assert first == {"name": "Fake GPU", "cublas_version": None, "pci_bus_id": "0000:19:00.0"}
    assert gpu.identity() is first and asked == ["gpu", "gpu", "identity"]


def test_statistics_before_any_run_are_an_error_not_a_number():
    import types
    from deepgemm.testing import benchplugin
    unrun = benchplugin.DeviceBenchmark(types.SimpleNamespace(stats=None, extra_info={}), None, 30)
    with pytest.raises(RuntimeError, match=r"^call device_benchmark\(fn, \.\.\.\) before asking for its statistics"):
        unrun.median_seconds


def test_the_device_timer_marker_keeps_the_tests_own_benchmark_options():
    """At collection a device benchmark gets a benchmark marker with the device clock, ahead of
    its own, whose options it carries; a test that already has it gets no second one."""
    from deepgemm.testing import benchplugin

    class Node:
        def __init__(self, *marks):
            self.marks = list(marks)

        def get_closest_marker(self, name):
            return next((m for m in self.marks if m.name == name), None)

        def add_marker(self, marker, append=True):
            self.marks.insert(len(self.marks) if append else 0, marker.mark)
    own = Node(pytest.mark.benchmark(min_rounds=7).mark)
    benchplugin._use_device_timer(own)
    assert own.get_closest_marker("benchmark").kwargs == {"min_rounds": 7, "timer": benchplugin.device_clock}
    benchplugin._use_device_timer(own)
    assert len(own.marks) == 2
    bare = Node()
    benchplugin._use_device_timer(bare)
    assert [m.kwargs for m in bare.marks] == [{"timer": benchplugin.device_clock}]


@pytest.mark.parametrize("args, addopts, given", [
    ([], "", False),
    (["--benchmark-storage=file://./.benchmarks"], "", True),   # the default, but said on purpose
    ([], "-q --benchmark-storage=file://./.benchmarks", True),
])
def test_a_storage_named_on_the_command_line_counts_as_the_users_even_at_the_default(monkeypatch, args, addopts,
                                                                                       given):
    from deepgemm.testing import benchplugin
    monkeypatch.setenv("PYTEST_ADDOPTS", addopts)
    config = SimpleNamespace(getoption=lambda name: benchplugin.PYTEST_BENCHMARK_DEFAULT_STORAGE,
                             invocation_params=SimpleNamespace(args=tuple(args)))
    assert benchplugin._storage_given_by_user(config) is given
    other = SimpleNamespace(getoption=lambda name: "file:///elsewhere", invocation_params=SimpleNamespace(args=()))
    assert benchplugin._storage_given_by_user(other) is True
