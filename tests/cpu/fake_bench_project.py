"""A pytest project around a fake GPU, for running pytest-benchmark and the gate for real in a
subprocess without a GPU (tests/cpu/test_bench_logic.py, tests/cpu/test_ci.py)."""

# ---------------------------------------------------------------------------------------------
# A fake device, written into the subprocess projects as fakedevice.py: one stream whose operations
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


class FakeTelemetry:
    """Clock readings that count up, so before/after can be told apart."""

    def __init__(self):
        self.reads = 0

    def read(self):
        self.reads += 1
        return {"sm_mhz": 1980 - self.reads, "temp_c": 40, "reasons": ["gpu_idle"]}

    def around(self, before, after):
        return {"source": "fake", "before": before, "after": after}


class FakeBackend:
    def __init__(self, name, driver="580.159.04"):
        self.name = name
        self.driver = driver
        self.tel = FakeTelemetry()

    def unavailable_reason(self):
        return None if self.name else "no CUDA device (fake)"

    def identity(self):
        if not self.name:
            return None
        return {"name": self.name, "sm_count": 132, "cc": "9.0", "driver_version": self.driver,
                "cuda_runtime_version": "13.0", "sm_clock_max_mhz": 1980, "l2_bytes": 62914560}

    def new_clock(self):
        return GPU.clock()

    def flush_l2(self, stream=None):
        GPU.enqueue(1.0)  # a flush lasting a whole second: it must never be timed

    def telemetry(self):
        return self.tel
'''

CONFTEST = '''
import os
import deepgemm.testing.benchplugin as benchplugin
import fakedevice

benchplugin.backend = fakedevice.FakeBackend(os.environ["FAKE_GPU_NAME"],
                                             os.environ.get("FAKE_DRIVER", "580.159.04"))
pytest_plugins = ["deepgemm.testing.benchplugin"]
'''

TEST_FILE = '''
import time
from fakedevice import GPU
from deepgemm.testing.benchplugin import Reference

WARMUP = [0.25e-3, 0.25e-3]
ROUNDS = [10.0e-6, 10.1e-6, 10.2e-6, 10.3e-6, 10.4e-6, 10.5e-6, 10.6e-6]
REF_ROUNDS = [9.0e-6, 9.2e-6, 8.8e-6, 9.1e-6, 8.9e-6, 9.0e-6, 9.3e-6]


def make_kernel(durations):
    durations = iter(durations)

    def kernel(x=0):
        time.sleep(0.001)  # real host time, 100x the device time: what a host timer would store
        GPU.launch(4e-3, next(durations))  # 4 ms of launch work before the kernel
        return x + 1

    return kernel


def test_gemm(device_benchmark):
    cublas = Reference("cublas[256^3]", make_kernel(WARMUP + REF_ROUNDS))
    assert device_benchmark(make_kernel(WARMUP + ROUNDS), 41, reference=cublas, rounds=7, warmup_rounds=2) == 42
    device_benchmark.record_throughput(m=256, n=256, k=256)


def test_benchmark_requested_first(benchmark, device_benchmark):
    device_benchmark(make_kernel([20e-6] * 6), 0, rounds=5, warmup_rounds=1, flush_l2=False)
'''


GATE_TEST_FILE = '''
"""Two benchmarks with their references; FAKE_SLOWDOWN slows the kernel of test_gemm only,
FAKE_DRIFT slows everything, kernels and references alike (the machine, not the code).
FAKE_SLOWDOWN may list one factor per pytest session in this folder ("1.2,1": slower in the
first session only, as a passing disturbance is), counted in .fake_sessions; the last one stays."""
import os
import random
from pathlib import Path
from fakedevice import GPU
from deepgemm.testing.benchplugin import Reference

_counter = Path(__file__).with_name(".fake_sessions")
_session = int(_counter.read_text()) if _counter.exists() else 0
_counter.write_text(str(_session + 1))
_factors = os.environ.get("FAKE_SLOWDOWN", "1").split(",")
SLOWDOWN = float(_factors[min(_session, len(_factors) - 1)])
DRIFT = float(os.environ.get("FAKE_DRIFT", "1"))
rng = random.Random(int(os.environ.get("FAKE_SEED", "0")))


def kernel(seconds):
    def run():
        GPU.launch(1e-3, seconds * (1 + rng.gauss(0, 0.01)))  # 1 % scatter per round

    return run


def test_gemm(device_benchmark):
    device_benchmark(kernel(100e-6 * SLOWDOWN * DRIFT), rounds=20, warmup_rounds=2,
                     reference=Reference("cublas[big]", kernel(80e-6 * DRIFT)))


def test_other(device_benchmark):
    device_benchmark(kernel(50e-6 * DRIFT), rounds=20, warmup_rounds=2,
                     reference=Reference("cublas[small]", kernel(40e-6 * DRIFT)))
'''




def write_project(root):
    """The fake project in `root` (its own rootdir): fakedevice.py, conftest.py, two test files."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "fakedevice.py").write_text(FAKE_DEVICE)
    (root / "conftest.py").write_text(CONFTEST)
    (root / "test_fake_bench.py").write_text(TEST_FILE)
    (root / "test_fake_gate.py").write_text(GATE_TEST_FILE)
    return root
