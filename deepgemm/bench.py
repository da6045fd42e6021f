"""Device-event timing: cold L2, median/IQR, TFLOP/s and GB/s.

Importable without CuPy or a GPU: CuPy is imported only by the functions that touch the device,
so the statistics and the device-clock logic can be tested on a CPU machine.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

# The device facts live in deepgemm.device; these names stay for bench's callers.


def _cupy():
    import cupy  # deferred: the package must import on machines without CuPy

    return cupy


# ---------------------------------------------------------------------------------------------
# Statistics (pure Python)


@dataclass(frozen=True)
class TimingStats:
    """Per-repetition device times in microseconds."""

    median: float
    q1: float
    q3: float
    iqr: float
    min: float
    max: float
    mean: float
    n: int
    samples: tuple[float, ...]

    @property
    def median_seconds(self) -> float:
        return self.median * 1e-6

    @property
    def relative_iqr(self) -> float:
        """IQR / median: the run's noise, robust to the odd slow outlier (clock dip, preemption)."""
        return self.iqr / self.median if self.median > 0 else 0.0


def timing_stats(samples_us) -> TimingStats:
    """Median and quartiles (linear interpolation between order statistics, as numpy's default)."""
    data = sorted(float(x) for x in samples_us)
    if not data:
        raise ValueError("timing_stats needs at least one sample")
    if len(data) == 1:
        q1 = q3 = data[0]
    else:
        q1, _, q3 = statistics.quantiles(data, n=4, method="inclusive")
    return TimingStats(
        median=statistics.median(data),
        q1=q1,
        q3=q3,
        iqr=q3 - q1,
        min=data[0],
        max=data[-1],
        mean=statistics.fmean(data),
        n=len(data),
        samples=tuple(float(x) for x in samples_us),
    )


def tflops(m: int, n: int, k: int, seconds: float) -> float:
    """Dense GEMM throughput: 2*M*N*K floating-point operations (one multiply + one add)."""
    return 2.0 * m * n * k / seconds / 1e12


def gbps(nbytes: float, seconds: float) -> float:
    return nbytes / seconds / 1e9


# ---------------------------------------------------------------------------------------------
# Cold L2

_flush_buffers: dict[int, Any] = {}
FLUSH_MODES = ("read", "write")

# A read-only pass over the flush buffer (zeros: the guarded store never happens): the flush.
_READ_SOURCE = r"""
extern "C" __global__ void deepgemm_l2_read(const uint4* p, unsigned long long n, unsigned* sink) {
    unsigned x = 0;
    for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const uint4 v = p[i];
        x ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (x == 0x9e3779b9u) *sink = x;
}
"""
_read_kernels: dict[int, Any] = {}


def flush_l2_cache(stream=None, how: str = "read") -> None:
    """Evict L2 on `stream` (default: the current one) so the next kernel reads its inputs from HBM.

    how="read" (every benchmark's and the tuner's cold L2): a read-only pass over a buffer of 2x the
    L2 size, which leaves only clean lines, as a model's previous layer leaves L2 after reading its
    weights. how="write": a memset of the same buffer (nvbench's and Triton's flush). That leaves
    L2 full of dirty lines, which the next kernel that streams more than L2 holds writes back to
    HBM inside its own time: on the H200 a 117 MB weight stream took 40 us after it and 32 us after
    the read pass (cuBLAS), and the write-back hid a register-bound kernel's deficit
    (docs/performance.md). The buffer is allocated once per device.
    """
    if how not in FLUSH_MODES:
        raise ValueError(f"how: one of {', '.join(FLUSH_MODES)}, got {how!r}")
    cupy = _cupy()
    dev = cupy.cuda.Device()
    if stream is None:
        stream = cupy.cuda.get_current_stream()
    buf = _flush_buffers.get(dev.id)
    if buf is None:
        l2_bytes = dev.attributes.get("L2CacheSize") or (64 << 20)
        buf = _flush_buffers[dev.id] = cupy.empty(2 * l2_bytes, dtype=cupy.uint8)
        if how == "read":
            buf.data.memset_async(0, buf.nbytes, stream)   # zeros, which the read pass relies on
            _read_pass(buf, stream)                          # its own dirty lines written back
    if how == "write":
        buf.data.memset_async(0, buf.nbytes, stream)
    else:
        _read_pass(buf, stream)


def _read_pass(buf, stream) -> None:
    cupy = _cupy()
    dev = cupy.cuda.Device()
    kernel = _read_kernels.get(dev.id)
    if kernel is None:
        kernel = _read_kernels[dev.id] = (cupy.RawKernel(_READ_SOURCE, "deepgemm_l2_read"), cupy.zeros(1, cupy.uint32))
    fn, sink = kernel
    with stream:
        fn((4 * dev.attributes["MultiProcessorCount"],), (512,), (buf, cupy.uint64(buf.nbytes // 16), sink))


# ---------------------------------------------------------------------------------------------
# Event timing
#
# CUDA events time the GPU's queue, not the kernel: if the host is still preparing the launch
# when the GPU reaches the start event, the GPU idles and the idle time is measured. For a
# Python call into a µs-scale kernel that is most of the measurement (seen on the H200: a 512^3
# fp16 cupy matmul reads 26 µs this way, 5.4 µs when the stream is kept busy). So each timed
# call is queued behind a one-thread spin kernel ("hold") that outlasts the host's enqueue
# time: the start event, the kernel and the end event then reach the GPU back to back. The hold
# length adapts to the enqueue time measured on the previous call (warmups calibrate it).

MIN_HOLD_S = 50e-6
MAX_HOLD_S = 20e-3

_HOLD_SOURCE = r"""
extern "C" __global__ void deepgemm_hold(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
"""
_hold_kernels: dict[int, Any] = {}


def hold_stream(seconds: float, stream=None) -> None:
    """Keep `stream` (default: the current one) busy for `seconds` with a one-thread spin kernel."""
    cupy = _cupy()
    dev = cupy.cuda.Device().id
    kernel = _hold_kernels.get(dev)
    if kernel is None:
        kernel = _hold_kernels[dev] = cupy.RawKernel(_HOLD_SOURCE, "deepgemm_hold")
    args = (cupy.uint64(int(seconds * 1e9)),)
    if stream is None:
        kernel((1,), (1,), args)
    else:
        with stream:  # RawKernel launches on the current stream
            kernel((1,), (1,), args)


class DeviceClock:
    """A clock that advances only by GPU time measured between two CUDA events.

    `run(fn)` queues a hold (see above), records a start event, calls `fn` (which must launch
    on the same stream and must not synchronise), records an end event, waits for it and adds
    the elapsed device time to `seconds`. Reading the clock around `run` therefore yields the
    kernel's device time: pytest-benchmark's timer reads it (deepgemm.testing.benchplugin).

    CuPy's events, elapsed time and `hold_stream` by default; tests pass fakes (hold=None: no
    hold, `host_clock` measures the enqueue time).
    """

    def __init__(self, new_event: Callable[[], Any] | None = None,
                 elapsed_ms: Callable[[Any, Any], float] | None = None,
                 hold: Callable[[float, Any], None] | None | str = "cupy",
                 host_clock: Callable[[], float] = time.perf_counter):
        if new_event is None or elapsed_ms is None:
            cupy = _cupy()
            new_event = new_event or cupy.cuda.Event
            elapsed_ms = elapsed_ms or cupy.cuda.get_elapsed_time
        self.seconds = 0.0
        self.hold_seconds = MIN_HOLD_S
        self._start = new_event()
        self._end = new_event()
        self._elapsed_ms = elapsed_ms
        self._hold = hold_stream if hold == "cupy" else hold
        self._host_clock = host_clock

    def __call__(self) -> float:
        return self.seconds

    def run(self, fn: Callable, *args, stream=None, **kwargs):
        if self._hold is not None:
            self._hold(self.hold_seconds, stream)
        queued_at = self._host_clock()
        self._start.record(stream)
        result = fn(*args, **kwargs)
        self._end.record(stream)
        enqueue_s = self._host_clock() - queued_at
        self._end.synchronize()
        self.seconds += self._elapsed_ms(self._start, self._end) * 1e-3
        # Twice the host's enqueue time plus slack, so jitter in it stays covered next time.
        self.hold_seconds = min(MAX_HOLD_S, max(MIN_HOLD_S, 2 * enqueue_s + 20e-6))
        return result


def time_device(fn: Callable[[], Any], *, warmup: int = 3, reps: int = 20, flush_l2: bool | str = True,
                stream=None) -> TimingStats:
    """Time `fn()` (which launches GPU work) with CUDA events; microsecond statistics.

    `fn` runs with `stream` (a CuPy stream; default the current one) made current, so CuPy
    launches inside it land there. With `flush_l2` (True: "read"; or "write"), flush_l2_cache
    precedes every call (warmups included), outside the events. Warmup calls also calibrate the
    hold (see above).
    """
    if reps < 1:
        raise ValueError("reps must be >= 1")
    how = "read" if flush_l2 is True else flush_l2
    if how and how not in FLUSH_MODES:
        raise ValueError(f"flush_l2: True, False or one of {', '.join(FLUSH_MODES)}, got {flush_l2!r}")
    cupy = _cupy()
    if stream is None:
        stream = cupy.cuda.get_current_stream()
    clock = DeviceClock()
    samples = []
    with stream:
        for i in range(warmup + reps):
            if how:
                flush_l2_cache(stream, how=how)
            before = clock.seconds
            clock.run(fn, stream=stream)
            if i >= warmup:
                samples.append((clock.seconds - before) * 1e6)
    return timing_stats(samples)
