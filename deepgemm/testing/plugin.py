"""deepgemm's pytest plugin: GPU detection, the sweep tiers, --sanitize, one GPU per xdist worker,
a hung test stopped (--hang-timeout, deepgemm.testing.watchdog).

Load it from a conftest.py with ``pytest_plugins = ["deepgemm.testing.plugin"]``, or with ``-p
deepgemm.testing.plugin`` (this repository's pytest addopts). Options and markers appear in
``pytest --help`` / ``pytest --markers``.
"""
from __future__ import annotations

import os
import subprocess

import pytest

from deepgemm.testing import watchdog


def pytest_addoption(parser):
    group = parser.getgroup("deepgemm")
    group.addoption("--sweep", choices=("quick", "full"), default="quick",
                    help="verification sweep tier: quick (default; every tile edge of every kernel, "
                         "under a minute on one H200 with -n auto) or full (the whole shape list, a few minutes); the "
                         "CPU tier's static checks: each kernel's default config in the variants that reach "
                         "every code path, or (full) every dtype x layout and every tuner config")
    group.addoption("--sanitize", action="store_true", default=False,
                    help="also check a sample of problems per kernel under compute-sanitizer "
                         "(memcheck, racecheck, synccheck); fails on any report")
    group.addoption("--stress", action="store_true", default=False,
                    help="also run the stress tier: V4/V5 rebuilt with pseudo-random pauses in their "
                         "pipelines (and V5 with its stage-release check), long-K problems repeated "
                         "and compared bit for bit while another stream loads the GPU")
    group.addoption("--stress-seed", type=int, default=None,
                    help="the stress tier's seed (default: a new one per run, shown in the header)")
    group.addoption("--stress-reps", type=int, default=20,
                    help="repetitions of each stress problem (default 20)")
    group.addoption("--kernels", default=None,
                    help="comma-separated kernel names to verify (default: every registered kernel)")
    group.addoption("--hang-timeout", type=float, default=watchdog.DEFAULT_HANG_TIMEOUT_S, metavar="SECONDS",
                    help="a test still running after this many seconds (setup to teardown) is a hang: its "
                         "process prints the test and every thread's stack and exits, failing the run "
                         f"(default {watchdog.DEFAULT_HANG_TIMEOUT_S:g}; 0: never; a test may set its own "
                         "with @pytest.mark.hang_timeout(seconds))")
    group.addoption("--run-first", default=None, metavar="FILE",
                    help="run the tests FILE names (node ids, one per line) first, in that order, then the "
                         "rest in their usual order (mutate: the tests that killed earlier mutants)")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU and CuPy; skipped with the reason otherwise")
    config.addinivalue_line("markers", "sanitize: runs under compute-sanitizer; only with --sanitize")
    config.addinivalue_line("markers", "full: only in the full sweep tier (--sweep=full)")
    config.addinivalue_line("markers", "stress: the timing-perturbed stress tier; only with --stress")
    config.addinivalue_line("markers", "hang_timeout(seconds): this test's own --hang-timeout (0: never)")
    if config.getoption("--stress-seed") is None:
        # One seed per run (not per worker: xdist workers take it from the controller's options).
        import secrets
        config.option.stress_seed = secrets.randbelow(2**31 - 1) + 1
    _pin_xdist_worker_to_gpu()
    _load_hypothesis_profile(config.getoption("--sweep"))


def _load_hypothesis_profile(tier: str) -> None:
    """Fuzzing budget per tier; derandomised with no example database under CI=true, so a CI
    failure reproduces exactly."""
    try:
        from hypothesis import HealthCheck, settings
    except ImportError:
        return
    in_ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    # Built on hypothesis's own defaults, not on whichever profile is loaded now: a profile
    # loaded earlier in this process (CI's, without a database) must not leak into this one.
    base = settings.get_profile("default")
    ci_only = {"database": None} if in_ci else {}
    settings.register_profile(f"deepgemm-{tier}", parent=base, max_examples=400 if tier == "full" else 40,
                              deadline=None, derandomize=in_ci,
                              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], **ci_only)
    settings.load_profile(f"deepgemm-{tier}")


def _pin_xdist_worker_to_gpu():
    """Under pytest-xdist, worker gwN sees only GPU N mod #GPUs, so `-n <#GPUs>` spreads the sweep.

    Must run before CuPy initialises CUDA in this process, hence at configure time."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        gpus = [g for g in visible.split(",") if g]
    else:
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.SubprocessError):
            return
        gpus = [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]
    if len(gpus) > 1:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus[int(worker[2:]) % len(gpus)]
        os.environ["DEEPGEMM_PINNED_GPU"] = f"{worker}->{os.environ['CUDA_VISIBLE_DEVICES']} of {len(gpus)}"


_gpu_status = None


def gpu_status() -> tuple[bool, str]:
    global _gpu_status
    if _gpu_status is None:
        from deepgemm import gpu_available
        _gpu_status = gpu_available()
    return _gpu_status


def pytest_collection_modifyitems(config, items):
    first = config.getoption("--run-first")
    if first:
        try:
            wanted = [line.strip() for line in open(first, encoding="utf-8") if line.strip()]
        except OSError as exc:
            raise pytest.UsageError(f"--run-first: cannot read {first}: {exc}") from exc
        rank = {nodeid: i for i, nodeid in enumerate(wanted)}
        items.sort(key=lambda item: rank.get(item.nodeid, len(rank)))   # stable: the rest keep their order
    ok, why = gpu_status()
    skip_gpu = pytest.mark.skip(reason=f"GPU tier skipped: {why}")
    skip_sanitize = pytest.mark.skip(reason="needs --sanitize")
    skip_full = pytest.mark.skip(reason="full sweep tier only (--sweep=full)")
    skip_stress = pytest.mark.skip(reason="stress tier only (--stress)")
    for item in items:
        if "gpu" in item.keywords and not ok:
            item.add_marker(skip_gpu)
        if "sanitize" in item.keywords and not config.getoption("--sanitize"):
            item.add_marker(skip_sanitize)
        if "full" in item.keywords and config.getoption("--sweep") != "full":
            item.add_marker(skip_full)
        if item.get_closest_marker("stress") and not config.getoption("--stress"):
            item.add_marker(skip_stress)


_WATCHDOG = pytest.StashKey[watchdog.Watchdog]()


def _watchdog(config) -> watchdog.Watchdog:
    dog = config.stash.get(_WATCHDOG, None)
    if dog is None:
        def on_hang(nodeid, seconds):
            if watchdog.main_thread_in_debugger():   # someone is stepping through it
                return
            capture = config.pluginmanager.getplugin("capturemanager")
            if capture is not None:   # give the message the real stderr, not this test's capture
                try:
                    capture.suspend_global_capture(in_=False)
                except Exception:
                    pass
            watchdog.stop_process(watchdog.hang_message(nodeid, seconds))
        dog = config.stash[_WATCHDOG] = watchdog.Watchdog(on_hang)
    return dog


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    marker = item.get_closest_marker("hang_timeout")
    seconds = float(marker.args[0]) if marker and marker.args else item.config.getoption("--hang-timeout")
    dog = _watchdog(item.config)
    dog.arm(seconds, item.nodeid)
    yield
    dog.disarm()


def pytest_report_header(config):
    ok, why = gpu_status()
    stress = f", stress seed {config.getoption('--stress-seed')}" if config.getoption("--stress") else ""
    return f"deepgemm: sweep={config.getoption('--sweep')}{stress}, GPU: {why if ok else 'none (' + why + ')'}"


@pytest.fixture(scope="session")
def sweep_tier(request) -> str:
    return request.config.getoption("--sweep")


@pytest.fixture(scope="session")
def stress_seed(request) -> int:
    return request.config.getoption("--stress-seed")


@pytest.fixture(scope="session")
def stress_reps(request) -> int:
    reps = request.config.getoption("--stress-reps")
    if reps < 1:
        raise pytest.UsageError(f"--stress-reps: must be >= 1, got {reps}")
    return reps


@pytest.fixture(scope="session")
def selected_kernels(request) -> list[str]:
    from deepgemm import registry
    wanted = request.config.getoption("--kernels")
    if not wanted:
        return registry.names()
    names = [n.strip() for n in wanted.split(",") if n.strip()]
    for n in names:
        registry.get(n)  # a clear error for unknown names
    return names
