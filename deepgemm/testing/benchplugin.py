"""pytest-benchmark integration: device time, a same-run reference, GPU identity, and the gate.

PYTEST_DONT_REWRITE (a plugin a conftest may import before pytest registers it; no asserts here)

Load it from the root conftest::

    pytest_plugins = ["deepgemm.testing.benchplugin"]

(or ``-p deepgemm.testing.benchplugin``). It must be registered before pytest-benchmark's own
``pytest_configure`` (a ``trylast`` hook that reads the compare/save options): the root conftest,
``-p`` or an entry point all are; a conftest deeper in the tree is loaded too late.

The gate (docs/regression-gate.md)::

    pytest tests/bench --benchmark-only --benchmark-save=baseline   # record this GPU's baseline
    pytest tests/bench --benchmark-only --benchmark-compare         # the gate: exit 1 if slower

With ``--benchmark-compare`` the plugin loads ``regressions/<GPU>/<key>/baseline.json`` for this
device's key (GPU model, driver major, CUDA major; deepgemm.gate.runs), refusing before anything
runs when there is none, when it was recorded under another key or without raw samples. At the
end it judges every benchmark with deepgemm.gate.verdict, prints the table and sets pytest's exit
status to 1 on a "slower" verdict (``--gate-markdown``/``--gate-verdict`` write it to files).
``--benchmark-compare=FILE`` compares with that run's JSON instead. ``--gate-confirm=RUN.json``
(with ``--benchmark-compare``) runs only the benchmarks that run was found slower in and reports
its verdict with each slower one kept only if it is slower again (``deepgemm.gate.verdict.confirm``;
``.ci/gate`` does this after a failing run). pytest-benchmark's own
loading and ``--benchmark-compare-fail`` (a fixed % on medians, which cried wolf on run-to-run
drift) are switched off. ``--benchmark-save=baseline`` writes the run as the key's baseline.json
and into its history/; another name or ``--benchmark-autosave`` writes history only.
``--benchmark-storage=DIR`` moves the regressions root. The GPU is only probed (CuPy imported)
when runs are saved or compared.

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
* pedantic's ``setup`` callable runs before each round (warmup rounds included), outside the
  timer reads: it flushes L2 and, when the benchmark has a reference, times one reference call
  (its own clock, L2 flushed before it too). Kernel and reference rounds alternate, so a clock
  change during the benchmark reaches both.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

from deepgemm import bench, device

PYTEST_BENCHMARK_DEFAULT_STORAGE = "file://./.benchmarks"
DEFAULT_ROUNDS = 30
DEFAULT_WARMUP_ROUNDS = 3


# ---------------------------------------------------------------------------------------------
# The device behind the plugin; tests replace `backend` with a fake.


class CupyBackend:
    """The real device: CuPy events, CuPy's current stream, the read-pass L2 flush, NVML telemetry."""

    def __init__(self):
        self._availability: tuple[bool, str] | None = None
        self._identity: dict | None = None
        self._telemetry = None

    def unavailable_reason(self) -> str | None:
        if self._availability is None:
            self._availability = device.gpu_available()
        ok, why = self._availability
        return None if ok else why

    def identity(self) -> dict | None:
        if self.unavailable_reason() is not None:
            return None
        if self._identity is None:
            import cupy

            identity = dict(device.identity())
            try:  # the reference's library version: a change there moves every reference
                identity["cublas_version"] = cupy.cuda.cublas.getVersion(cupy.cuda.device.get_cublas_handle())
            except Exception:
                identity["cublas_version"] = None
            try:  # picks the benchmarked GPU for NVML and nvidia-smi
                identity["pci_bus_id"] = cupy.cuda.Device().pci_bus_id
            except Exception:
                identity["pci_bus_id"] = None
            self._identity = identity
        return self._identity

    def new_clock(self) -> bench.DeviceClock:
        return bench.DeviceClock()

    def flush_l2(self, stream=None) -> None:
        bench.flush_l2_cache(stream)

    def telemetry(self):
        if self._telemetry is None:
            from deepgemm.gate.telemetry import Telemetry

            identity = self.identity() or {}
            self._telemetry = Telemetry(identity.get("pci_bus_id"))
        return self._telemetry


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
# Fixture


@dataclass(frozen=True)
class Reference:
    """What a benchmark is normalised by: `fn` (cuBLAS on the same operands) under `name`.

    The name pairs benchmarks with their reference across runs ("cublas[4096^3-float16]"): every
    benchmark naming it contributes its reference samples to the drift check of that name, so
    one name must always mean the same work. `fn` follows the kernel's rules (launch on
    `stream`, default the current one; do not synchronise).
    """

    name: str
    fn: Callable[[], Any]
    stream: Any = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name: a non-empty string naming the reference, got {self.name!r}")
        if not callable(self.fn):
            raise TypeError(f"fn: must be callable, got {type(self.fn).__name__}")


def reference_record(name: str, seconds: list[float]) -> dict:
    """extra_info['reference']: the name, the per-round samples (s) and their median."""
    return {"name": name, "samples": list(seconds),
            "median": bench.timing_stats(seconds).median if seconds else None}


class DeviceBenchmark:
    """Runs a GPU callable under pytest-benchmark with device-event timing.

    ``device_benchmark(fn, *args, reference=Reference(...), rounds=30, warmup_rounds=3,
    flush_l2=True, stream=None)`` returns fn's result; pytest-benchmark's stats (and the stored
    JSON) then hold the per-round device time in seconds, extra_info['reference'] the reference's
    interleaved samples and extra_info['telemetry'] the GPU's clocks before and after. ``fn``
    must launch on ``stream`` (default: the current stream) and must not synchronise. Warmup
    rounds also size the spin kernel that hides launch work.
    """

    def __init__(self, benchmark, clock: bench.DeviceClock, default_rounds: int):
        self.benchmark = benchmark
        self._clock = clock
        self._default_rounds = default_rounds
        self.reference_seconds: list[float] = []

    @property
    def extra_info(self) -> dict:
        return self.benchmark.extra_info

    def __call__(self, fn: Callable, *args, reference: Reference | None = None,
                 rounds: int | None = None, warmup_rounds: int = DEFAULT_WARMUP_ROUNDS,
                 flush_l2: bool = True, stream=None, **kwargs):
        if reference is not None and not isinstance(reference, Reference):
            raise TypeError(f"reference: expected a benchplugin.Reference, got {type(reference).__name__}")
        rounds = rounds or self._default_rounds
        ref_clock = backend.new_clock() if reference is not None else None
        ref_times: list[float] = []

        def setup():
            if reference is not None:
                if flush_l2:
                    backend.flush_l2(reference.stream)
                before = ref_clock.seconds
                ref_clock.run(reference.fn, stream=reference.stream)
                ref_times.append(ref_clock.seconds - before)
            if flush_l2:
                backend.flush_l2(stream)

        def timed(*a, **kw):
            return self._clock.run(fn, *a, stream=stream, **kw)

        telemetry = backend.telemetry()
        before = telemetry.read()
        result = self.benchmark.pedantic(
            timed, args=args, kwargs=kwargs,
            setup=setup if (flush_l2 or reference is not None) else None,
            rounds=rounds, warmup_rounds=warmup_rounds, iterations=1,
        )
        if self.benchmark.disabled:  # --benchmark-disable: ran once, measured nothing
            return result
        self.extra_info["telemetry"] = telemetry.around(before, telemetry.read())
        if reference is not None:
            # setup ran once per warmup round, then once per round.
            self.reference_seconds = ref_times[warmup_rounds:warmup_rounds + rounds]
            self.extra_info["reference"] = reference_record(reference.name, self.reference_seconds)
        return result

    @property
    def median_seconds(self) -> float:
        stats = self.benchmark.stats
        if stats is None:
            raise RuntimeError("call device_benchmark(fn, ...) before asking for its statistics")
        return stats.stats.median

    @property
    def reference_median_seconds(self) -> float | None:
        ref = self.extra_info.get("reference") or {}
        return ref.get("median")

    def record_throughput(self, *, m: int | None = None, n: int | None = None,
                          k: int | None = None, flops: float | None = None,
                          bytes_moved: float | None = None,
                          reference_seconds: float | None = None) -> dict:
        """TFLOP/s, GB/s and % of the reference (cuBLAS) into ``benchmark.extra_info``.

        reference_seconds defaults to the median of this benchmark's reference rounds."""
        if self.benchmark.disabled:
            return {}
        if reference_seconds is None:
            reference_seconds = self.reference_median_seconds
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


# ---------------------------------------------------------------------------------------------
# Identity and commit in every run pytest-benchmark writes


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(config, machine_info):
    identity = backend.identity()
    if identity is not None:
        machine_info["gpu"] = dict(identity)


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_commit_info(config, commit_info):
    """DEEPGEMM_COMMIT, when set, names the commit being measured: a GPU runner may get a copy of
    the tree without .git, or with a stale one, so the explicit value wins, and runs line up per
    commit in `regress history`."""
    commit = os.environ.get("DEEPGEMM_COMMIT")
    if commit:
        commit_info.update(id=commit, dirty=False, project="deepgemm")


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_json(config, benchmarks, output_json):
    from deepgemm.gate import runs

    output_json["deepgemm_gate"] = {"format": runs.FORMAT_VERSION}
    gpu = (output_json.get("machine_info") or {}).get("gpu")
    if gpu:
        key = runs.GateKey.from_identity(gpu)
        output_json["deepgemm_gate"]["key"] = {"gpu": key.gpu, "driver_major": key.driver_major,
                                               "cuda_major": key.cuda_major, "folder": str(key.folder)}
    gate = config.pluginmanager.get_plugin(GATE_PLUGIN)
    if gate is not None:
        gate.output_json = output_json  # what --benchmark-json wrote is what gets judged


# ---------------------------------------------------------------------------------------------
# The gate

GATE_PLUGIN = "deepgemm-gate"


def _percent(text: str) -> float:
    try:
        value = float(text.rstrip("%")) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise pytest.UsageError(f"--gate-min-change: expected e.g. 5% or 0.05, got {text!r}") from None
    return value


def pytest_addoption(parser):
    group = parser.getgroup("deepgemm-gate", "deepgemm benchmark gate (with --benchmark-compare)")
    group.addoption("--gate-markdown", metavar="FILE", default=None,
                    help="also write the verdict as Markdown (e.g. for $GITHUB_STEP_SUMMARY)")
    group.addoption("--gate-verdict", metavar="FILE", default=None,
                    help="also write the verdict as JSON")
    group.addoption("--gate-confirm", metavar="RUN_JSON", default=None,
                    help="time again only the benchmarks RUN_JSON (an earlier --benchmark-json of "
                         "this gate) was found slower in; one fails only if it is slower again")
    group.addoption("--gate-alpha", type=float, default=None,
                    help="significance level of the Mann-Whitney U test (default 0.01)")
    group.addoption("--gate-min-change", type=_percent, default=None,
                    help="smallest median change that counts, e.g. 5%% (default)")
    group.addoption("--gate-min-diff-us", type=float, default=None,
                    help="smallest median change that counts, in µs (default 1)")


def _storage_given_by_user(config) -> bool:
    if config.getoption("benchmark_storage") != PYTEST_BENCHMARK_DEFAULT_STORAGE:
        return True
    args = list(config.invocation_params.args) + os.environ.get("PYTEST_ADDOPTS", "").split()
    return any(str(a).startswith("--benchmark-storage") for a in args)


def regressions_root(config) -> Path:
    if _storage_given_by_user(config):
        storage = str(config.getoption("benchmark_storage"))
        return Path(storage[len("file://"):] if storage.startswith("file://") else storage)
    return config.rootpath / "regressions"


def _rule(config):
    from deepgemm.gate.verdict import Rule

    given = {name: config.getoption(opt) for name, opt in
             (("alpha", "gate_alpha"), ("min_change", "gate_min_change"), ("min_diff_s", "gate_min_diff_us"))}
    if given["min_diff_s"] is not None:
        given["min_diff_s"] *= 1e-6
    try:
        return Rule(**{k: v for k, v in given.items() if v is not None})
    except ValueError as exc:
        raise pytest.UsageError(f"gate options: {exc}") from None


def pytest_configure(config):
    if not hasattr(config.option, "benchmark_storage"):
        return  # pytest-benchmark not installed or disabled with -p no:benchmark
    opt = config.option
    compare, save, autosave = opt.benchmark_compare, opt.benchmark_save, opt.benchmark_autosave
    if compare and opt.benchmark_compare_fail:
        raise pytest.UsageError(
            "--benchmark-compare-fail is not the gate here: with --benchmark-compare, deepgemm's "
            "drift-aware verdict decides (docs/regression-gate.md). Drop --benchmark-compare-fail.")
    if not (compare or save or autosave):
        return
    if hasattr(config, "_benchmarksession"):
        warnings.warn("deepgemm.testing.benchplugin was loaded after pytest-benchmark configured "
                      "itself, so the gate is not active. Load it from the root conftest or with "
                      "-p deepgemm.testing.benchplugin.", stacklevel=1)
        return
    # pytest-benchmark would load and save runs in its own layout: the gate does it per key.
    # Its storage (which it creates even unused) is pointed at the same root.
    root = regressions_root(config)
    opt.benchmark_compare, opt.benchmark_save, opt.benchmark_autosave = [], None, None
    opt.benchmark_storage = f"file://{root}"
    rule = _rule(config)
    identity = backend.identity()
    if identity is None:
        if compare:
            raise pytest.UsageError(f"--benchmark-compare needs a GPU: {backend.unavailable_reason()}")
        return  # every device benchmark skips: nothing to save

    from deepgemm.gate import runs

    key = runs.GateKey.from_identity(identity)
    baseline = None
    if compare:
        try:
            if compare is True:
                baseline = runs.find_baseline(root, key)
            else:
                path = Path(str(compare))
                if not path.is_file():
                    raise runs.BaselineNotFound(
                        f"--benchmark-compare={compare}: no such file. Give a run's JSON, or no "
                        f"value for this key's baseline ({runs.baseline_path(root, key)})")
                baseline = runs.load_run(path)
                runs.check_baseline(baseline, key)
        except (runs.BaselineNotFound, runs.KeyMismatch, runs.BaselineFormatError, OSError, ValueError) as exc:
            raise pytest.UsageError(str(exc)) from None
    first = _first_run_to_confirm(config, baseline, rule)
    label = "baseline" if save == "baseline" else (save or None)
    config.pluginmanager.register(GateSession(config, key, root, baseline, rule, save_label=label,
                                              save=bool(save or autosave), first=first), GATE_PLUGIN)


def _first_run_to_confirm(config, baseline, rule):
    """--gate-confirm: the earlier run's verdict against the same baseline, which must hold a slower one."""
    path = config.getoption("gate_confirm")
    if path is None:
        return None
    from deepgemm.gate import runs, verdict

    if baseline is None:
        raise pytest.UsageError("--gate-confirm needs --benchmark-compare: it re-judges a run against the baseline")
    try:
        first = verdict.compare(baseline, runs.load_run(path), rule)
    except (runs.KeyMismatch, runs.BaselineFormatError, OSError, ValueError) as exc:
        raise pytest.UsageError(f"--gate-confirm={path}: {exc}") from None
    if not first.slower:
        raise pytest.UsageError(f"--gate-confirm={path}: no benchmark of that run is slower than the "
                                f"baseline ({first.headline()}); nothing to confirm")
    return first


def _against_stored_runs(root: Path, key, data: dict) -> list[str]:
    """A new baseline held against the key's stored runs before it is saved (deepgemm.gate.history
    .outside_history): the benchmarks outside their range, named in the session's summary."""
    from deepgemm.gate import history, runs
    try:
        stored = history.load_history(runs.key_folder(root, key))
    except runs.BaselineNotFound:
        return []
    try:
        return history.outside_lines(history.outside_history(runs.Run(data), stored))
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:   # a stored run of another shape:
        return [f"against the stored runs: not checked ({type(exc).__name__}: {exc})"]   # the save goes on


class GateSession:
    """Saves the run per key and/or judges it against the baseline at the end of the session."""

    def __init__(self, config, key, root: Path, baseline, rule, *, save_label, save: bool, first=None):
        self.config, self.key, self.root, self.baseline, self.rule = config, key, root, baseline, rule
        self.save, self.save_label = save, save_label
        self.first = first  # --gate-confirm: the earlier run's Report, whose slower benchmarks run again
        self.output_json: dict | None = None
        self.report = None
        self.lines: list[str] = []

    def pytest_collection_modifyitems(self, config, items):
        if self.first is None:
            return
        wanted = {v.name for v in self.first.slower}
        keep = [item for item in items if item.nodeid in wanted]
        if len(keep) < len(items):
            config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in wanted])
            items[:] = keep

    def _run_json(self) -> dict | None:
        if self.output_json is not None:
            return self.output_json
        bs = self.config._benchmarksession
        if not bs.benchmarks:
            return None
        hook = self.config.hook
        commit_info = hook.pytest_benchmark_generate_commit_info(config=self.config)
        hook.pytest_benchmark_update_commit_info(config=self.config, commit_info=commit_info)
        output = hook.pytest_benchmark_generate_json(
            config=self.config, benchmarks=bs.benchmarks, include_data=True,
            machine_info=bs.get_machine_info(), commit_info=commit_info)
        hook.pytest_benchmark_update_json(config=self.config, benchmarks=bs.benchmarks, output_json=output)
        return output

    def pytest_sessionfinish(self, session, exitstatus):
        from deepgemm.gate import runs, verdict

        data = self._run_json()
        if self.save:
            if data is None:
                self.lines.append("nothing saved: no benchmark ran")
            else:
                if self.save_label == "baseline":
                    self.lines += _against_stored_runs(self.root, self.key, data)
                try:
                    written = runs.save_run(self.root, data, as_baseline=self.save_label == "baseline",
                                            label=None if self.save_label == "baseline" else self.save_label)
                    self.lines += [f"saved {p}" for p in written]
                except (runs.BaselineFormatError, runs.KeyMismatch) as exc:
                    self.lines.append(f"not saved: {exc}")
                    session.exitstatus = session.exitstatus or pytest.ExitCode.TESTS_FAILED
        if self.baseline is None:
            return
        if data is None:
            data = {"machine_info": {"gpu": dict(backend.identity() or {})}, "benchmarks": []}
        # pytest-benchmark opens --benchmark-json itself (an argparse.FileType): its name is the path.
        json_out = self.config.getoption("benchmark_json")
        json_path = getattr(json_out, "name", json_out)
        current = runs.Run(data, Path(json_path) if json_path else None)
        self.report = verdict.compare(self.baseline, current, self.rule)
        if self.first is not None:
            self.report = verdict.confirm(self.first, self.report)
        # tests_ok: no test failed before the verdict; a failing gate may then be confirmed (.ci/gate).
        as_json = dict(self.report.to_dict(), tests_ok=exitstatus == 0)
        for option, render in (("gate_markdown", self.report.to_markdown),
                               ("gate_verdict", lambda: json.dumps(as_json, indent=1) + "\n")):
            target = self.config.getoption(option)
            if target:
                Path(target).parent.mkdir(parents=True, exist_ok=True)
                Path(target).write_text(render())
        if self.report.failed and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter):
        if self.report is None and not self.lines:
            return
        terminalreporter.write_sep("=", "deepgemm benchmark gate")
        for line in self.lines:
            terminalreporter.write_line(line)
        if self.report is not None:
            verbose = self.config.getoption("verbose") > 0
            terminalreporter.write_line(self.report.to_text(all_rows=verbose))
