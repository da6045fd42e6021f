"""pytest-benchmark integration: store DEVICE time, per GPU model, with GPU identity.

PYTEST_DONT_REWRITE (a plugin a conftest may import before pytest registers it; no asserts here)

Load it from the root conftest::

    pytest_plugins = ["deepgemm.testing.benchplugin"]

(or ``-p deepgemm.testing.benchplugin``). It must be registered before pytest-benchmark's own
``pytest_configure`` (a ``trylast`` hook that opens the storage): the root conftest, ``-p`` or an
entry point all are; a conftest deeper in the tree is loaded too late to move the storage.

How device time gets into pytest-benchmark (checked against pytest-benchmark 5.2.3 and 5.3.1):

* A round is timed as ``timer(); target(); timer()`` and the timer is a plain callable, taken
  from ``@pytest.mark.benchmark(timer=...)`` (a documented marker argument) when the
  ``benchmark`` fixture is set up, else from ``--benchmark-timer``; the fixture keeps it in
  ``_timer``. At collection, every test that uses ``device_benchmark`` gets a copy of its
  benchmark marker (group etc. kept) with ``timer=device_clock`` prepended; other benchmarks in
  the session keep the host clock. ``device_benchmark`` checks ``_timer`` and sets it only if
  the marker could not be placed (the fixture reached through ``request.getfixturevalue``).
  ``device_benchmark`` depends on ``benchmark`` statically, so ``--benchmark-only`` and
  ``--benchmark-skip`` treat its tests as benchmarks.
* ``device_clock()`` returns seconds of device time measured so far. The target handed to
  pytest-benchmark is ``DeviceClock.run``: a short spin kernel that keeps the stream busy while
  the host queues the rest, start event, kernel, end event, synchronise, advance the clock by
  the elapsed event time. So ``end - start`` is the kernel's device time; host-side launch work
  and the synchronise are invisible (deepgemm.bench explains the spin kernel). ``fn`` must
  launch on the current stream (or the ``stream`` passed) and must not synchronise.
* It always uses ``benchmark.pedantic`` (fixed rounds and warmup rounds, no calibration): the
  calibration of ``benchmark(fn)`` measures the timer's resolution by reading it in a tight
  loop until it moves, and a device clock never moves there (5.2.3 loops forever).
* The L2 flush is pedantic's ``setup`` callable: it runs before each round (warmup rounds
  included), outside the timer reads, and is queued on the same stream before the start event.

Per-GPU storage: when ``--benchmark-storage`` was not given, it defaults to
``<rootdir>/regressions/<gpu_slug>`` (pytest-benchmark then adds its own
``<OS>-<Python>-<bits>`` folder), so ``--benchmark-compare`` only ever sees this GPU model's runs.
The GPU is only probed (CuPy imported) when runs are saved or compared. With
``--benchmark-compare-fail`` and no baseline for this GPU, the run stops at once with a usage
error naming the folder and the GPU models that do have baselines. Comparing against a run
recorded on another GPU model (an explicit ``--benchmark-storage`` shared between GPUs) is
refused with a usage error. Run pytest from the repository root: pytest-benchmark prints the
storage relative to the working directory and fails when it is not below it.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, Callable

import pytest

from deepgemm import bench

PYTEST_BENCHMARK_DEFAULT_STORAGE = "file://./.benchmarks"
DEFAULT_ROUNDS = 30
DEFAULT_WARMUP_ROUNDS = 3


# ---------------------------------------------------------------------------------------------
# The device behind the plugin; tests replace `backend` with a fake.


class CupyBackend:
    """The real device: CuPy events, CuPy's current stream, a memset L2 flush."""

    def __init__(self):
        self._availability: tuple[bool, str] | None = None
        self._identity: dict | None = None

    def unavailable_reason(self) -> str | None:
        if self._availability is None:
            self._availability = bench.gpu_available()
        ok, why = self._availability
        return None if ok else why

    def identity(self) -> dict | None:
        if self.unavailable_reason() is not None:
            return None
        if self._identity is None:
            self._identity = bench.gpu_identity()
        return self._identity

    def new_clock(self) -> bench.DeviceClock:
        return bench.DeviceClock()

    def flush_l2(self, stream=None) -> None:
        bench.flush_l2_cache(stream)


backend: Any = CupyBackend()

# One clock for the whole session: pytest-benchmark only ever subtracts two readings, but a
# single monotonic clock keeps readings meaningful across tests.
_session_clock: bench.DeviceClock | None = None


def device_clock() -> float:
    """pytest-benchmark timer: seconds of device time measured so far by `device_benchmark`."""
    return _session_clock.seconds if _session_clock is not None else 0.0


def _clock() -> bench.DeviceClock:
    global _session_clock
    if _session_clock is None:
        _session_clock = backend.new_clock()
    return _session_clock


# ---------------------------------------------------------------------------------------------
# Hooks


def _storage_given_by_user(config) -> bool:
    if config.getoption("benchmark_storage") != PYTEST_BENCHMARK_DEFAULT_STORAGE:
        return True
    args = list(config.invocation_params.args) + os.environ.get("PYTEST_ADDOPTS", "").split()
    return any(str(a).startswith("--benchmark-storage") for a in args)


def _storage_matters(config) -> bool:
    """Only probe the GPU when runs are saved or compared: plain test runs stay CuPy-free."""
    opt = config.getoption
    return bool(opt("benchmark_save") or opt("benchmark_autosave") or opt("benchmark_compare"))


def per_gpu_storage(rootpath, gpu_name: str) -> str:
    return str(rootpath / "regressions" / bench.gpu_slug(gpu_name))


def pytest_configure(config):
    if not hasattr(config.option, "benchmark_storage"):
        return  # pytest-benchmark not installed or disabled with -p no:benchmark
    if _storage_given_by_user(config) or not _storage_matters(config):
        return
    identity = backend.identity()
    if identity is None:
        return  # no GPU: every device benchmark skips, nothing to store per GPU
    storage = per_gpu_storage(config.rootpath, identity["name"])
    if hasattr(config, "_benchmarksession"):
        # pytest-benchmark already opened its storage: this module was loaded too late.
        warnings.warn(
            f"deepgemm.testing.benchplugin was loaded after pytest-benchmark configured itself; "
            f"results go to --benchmark-storage's default, not {storage}. Load the plugin from "
            f"the root conftest or with -p deepgemm.testing.benchplugin.",
            stacklevel=1,
        )
        return
    config.option.benchmark_storage = storage
    if config.getoption("benchmark_compare") and config.getoption("benchmark_compare_fail"):
        _require_baseline(storage, identity["name"])


def _require_baseline(storage: str, gpu_name: str) -> None:
    """Fail before running anything when the gate has nothing to compare against.

    pytest-benchmark itself would run every benchmark and only then stop with
    "--benchmark-compare-fail requires valid --benchmark-compare".
    """
    from pytest_benchmark.utils import get_machine_id

    from deepgemm import regress

    folder = Path(storage) / get_machine_id()  # where pytest-benchmark looks for runs
    if any(folder.glob("*.json")):
        return
    regressions = Path(storage).parent
    others = {name: str(path) for name, path in regress.gpus_with_runs(regressions).items()}
    raise pytest.UsageError(
        f"No benchmark baseline for GPU {gpu_name!r}: {folder} holds no runs. Baselines exist "
        f"for: {others or 'no GPU model'}. Record one on this GPU first: "
        f"pytest tests/bench --benchmark-only --benchmark-save=baseline"
    )


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(config, machine_info):
    identity = backend.identity()
    if identity is not None:
        machine_info["gpu"] = dict(identity)


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_compare_machine_info(config, benchmarksession, machine_info, compared_benchmark):
    here = (machine_info.get("gpu") or {}).get("name")
    there = (compared_benchmark.get("machine_info", {}).get("gpu") or {}).get("name")
    if here and there and here != there:
        raise pytest.UsageError(
            f"Refusing to compare benchmarks across GPU models: this run is on {here!r}, the "
            f"stored run in {benchmarksession.storage} was recorded on {there!r}. Drop "
            f"--benchmark-storage to use this GPU's own folder (regressions/{bench.gpu_slug(here)})."
        )


# ---------------------------------------------------------------------------------------------
# Fixture


class DeviceBenchmark:
    """Runs a GPU callable under pytest-benchmark with device-event timing.

    ``device_benchmark(fn, *args, rounds=30, warmup_rounds=3, flush_l2=True, stream=None)``
    returns fn's result; pytest-benchmark's stats (and the stored JSON) then hold the per-round
    device time in seconds. ``fn`` must launch on ``stream`` (default: the current stream) and
    must not synchronise. Warmup rounds also size the spin kernel that hides launch work.
    For % of cuBLAS, time the reference with ``deepgemm.bench.time_device`` and pass its
    ``median_seconds`` to ``record_throughput(reference_seconds=...)``.
    """

    def __init__(self, benchmark, clock: bench.DeviceClock, default_rounds: int):
        self.benchmark = benchmark
        self._clock = clock
        self._default_rounds = default_rounds

    @property
    def extra_info(self) -> dict:
        return self.benchmark.extra_info

    def __call__(self, fn: Callable, *args, rounds: int | None = None,
                 warmup_rounds: int = DEFAULT_WARMUP_ROUNDS, flush_l2: bool = True, stream=None,
                 **kwargs):
        def timed(*a, **kw):
            return self._clock.run(fn, *a, stream=stream, **kw)

        return self.benchmark.pedantic(
            timed, args=args, kwargs=kwargs,
            setup=(lambda: backend.flush_l2(stream)) if flush_l2 else None,
            rounds=rounds or self._default_rounds, warmup_rounds=warmup_rounds, iterations=1,
        )

    @property
    def median_seconds(self) -> float:
        stats = self.benchmark.stats
        if stats is None:
            raise RuntimeError("call device_benchmark(fn, ...) before asking for its statistics")
        return stats.stats.median

    def record_throughput(self, *, m: int | None = None, n: int | None = None,
                          k: int | None = None, flops: float | None = None,
                          bytes_moved: float | None = None,
                          reference_seconds: float | None = None) -> dict:
        """Put TFLOP/s, GB/s and % of a reference (cuBLAS) time into ``benchmark.extra_info``."""
        if self.benchmark.disabled:  # --benchmark-disable: ran once, measured nothing
            return {}
        return add_throughput_info(self.benchmark.extra_info, self.median_seconds, m=m, n=n, k=k,
                                   flops=flops, bytes_moved=bytes_moved,
                                   reference_seconds=reference_seconds)


def add_throughput_info(extra_info: dict, median_seconds: float, *, m=None, n=None, k=None,
                        flops=None, bytes_moved=None, reference_seconds=None) -> dict:
    """Fill extra_info with throughput derived from a median device time (seconds)."""
    if flops is None and None not in (m, n, k):
        flops = 2.0 * m * n * k
        extra_info.update(m=m, n=n, k=k)
    extra_info["device_time"] = True
    extra_info["median_us"] = median_seconds * 1e6
    if flops is not None:
        extra_info["flops"] = flops
        extra_info["tflops"] = flops / median_seconds / 1e12
    if bytes_moved is not None:
        extra_info["bytes"] = bytes_moved
        extra_info["gbps"] = bench.gbps(bytes_moved, median_seconds)
    if reference_seconds:
        extra_info["reference_us"] = reference_seconds * 1e6
        extra_info["pct_cublas"] = 100.0 * reference_seconds / median_seconds
    return extra_info


def _use_device_timer(node) -> None:
    """Prepend a benchmark marker carrying timer=device_clock, keeping the test's own kwargs."""
    own = node.get_closest_marker("benchmark")
    if own is not None and own.kwargs.get("timer") is device_clock:
        return
    kwargs = dict(own.kwargs) if own else {}
    kwargs["timer"] = device_clock
    node.add_marker(pytest.mark.benchmark(**kwargs), append=False)


def pytest_collection_modifyitems(config, items):
    benchmarks_active = hasattr(config, "_benchmarksession")
    no_benchmarks = pytest.mark.skip(
        reason="device benchmarks need pytest-benchmark (not installed, or -p no:benchmark)")
    for item in items:
        if "device_benchmark" not in getattr(item, "fixturenames", ()):
            continue
        if benchmarks_active:
            # At collection, before any fixture exists: `benchmark` reads the marker at setup.
            _use_device_timer(item)
        else:
            item.add_marker(no_benchmarks)  # skips before the missing `benchmark` is looked up


@pytest.fixture
def device_benchmark(request, benchmark) -> DeviceBenchmark:
    # `benchmark` is a static dependency so that pytest-benchmark counts these tests as
    # benchmarks (--benchmark-only / --benchmark-skip look at each test's fixture names).
    why = backend.unavailable_reason()
    if why:
        pytest.skip(f"device benchmark needs a GPU: {why}")
    if benchmark._timer is not device_clock:
        # Only when the marker could not be placed at collection (device_benchmark reached
        # through request.getfixturevalue): set the fixture's timer directly.
        benchmark._timer = device_clock
    min_rounds = request.config.getoption("benchmark_min_rounds") or 0
    return DeviceBenchmark(benchmark, _clock(), max(DEFAULT_ROUNDS, min_rounds))


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_commit_info(config, commit_info):
    """DEEPGEMM_COMMIT, when set, names the commit being measured: a GPU runner may get a copy of
    the tree without .git, or with a stale one (seen on the device machine: its copy reported the
    previous session's HEAD), so the explicit value wins, and runs line up per commit in
    `regress history`."""
    commit = os.environ.get("DEEPGEMM_COMMIT")
    if commit:
        commit_info.update(id=commit, dirty=False, project="deepgemm")
