"""deepgemm's pytest plugin on the CPU: which marked tests a run skips and why, xdist workers pinned
one GPU each, and the fuzzing profile per tier (derandomised under CI)."""
import json
import os
import subprocess
import sys

import pytest

from deepgemm.testing import plugin

MARKED = '''
import pytest

def test_plain():
    pass

@pytest.mark.sanitize
def test_sanitize():
    pass

@pytest.mark.full
def test_full():
    pass

@pytest.mark.stress
def test_stress():
    pass

@pytest.mark.gpu
def test_gpu():
    pass
'''


def run_with_plugin(tmp_path, test_file, *options):
    """pytest on test_file in tmp_path with deepgemm's plugin alone (no project addopts)."""
    return subprocess.run([sys.executable, "-m", "pytest", test_file, "-p", "no:cacheprovider", "-o", "addopts=",
                           "-p", "deepgemm.testing.plugin", *options],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)


def outcomes(tmp_path, *options):
    (tmp_path / "test_marked.py").write_text(MARKED)
    proc = run_with_plugin(tmp_path, "test_marked.py", "-v", "-rs", *options)
    out = proc.stdout + proc.stderr
    got = {}
    for line in proc.stdout.splitlines():
        if line.startswith("test_marked.py::") and (" PASSED" in line or " SKIPPED" in line):
            got[line.split("::")[1].split()[0]] = "passed" if " PASSED" in line else "skipped"
    return got, out


def test_marked_tests_run_only_in_their_tier(tmp_path):
    if plugin.gpu_status()[0]:
        pytest.skip("a GPU is visible here: the gpu marker runs")
    got, out = outcomes(tmp_path)
    assert got == {"test_plain": "passed", "test_sanitize": "skipped", "test_full": "skipped",
                   "test_stress": "skipped", "test_gpu": "skipped"}, out
    assert "needs --sanitize" in out and "full sweep tier only (--sweep=full)" in out
    assert "stress tier only (--stress)" in out and "GPU tier skipped: " in out
    got, out = outcomes(tmp_path, "--sanitize", "--sweep=full", "--stress")
    assert got == {"test_plain": "passed", "test_sanitize": "passed", "test_full": "passed",
                   "test_stress": "passed", "test_gpu": "skipped"}, out
    assert "stress seed" in out                                  # the header shows the run's seed


@pytest.mark.parametrize("worker,visible,pinned", [
    ("gw0", "0,1", "0"), ("gw3", "0,1", "1"), ("gw5", "4,5,6", "6"),
    ("gw2", "3", "3"),            # one GPU: left as it is
    ("", "0,1", "0,1"),           # not an xdist worker
    ("master", "0,1", "0,1"),
])
def test_each_xdist_worker_sees_one_gpu(monkeypatch, worker, visible, pinned):
    env = {k: v for k, v in os.environ.items() if k != "DEEPGEMM_PINNED_GPU"}
    env.update(PYTEST_XDIST_WORKER=worker, CUDA_VISIBLE_DEVICES=visible)
    monkeypatch.setattr(os, "environ", env)        # this process's own environment stays as it was
    plugin._pin_xdist_worker_to_gpu()
    assert env["CUDA_VISIBLE_DEVICES"] == pinned
    assert ("DEEPGEMM_PINNED_GPU" in env) == (pinned != visible)


@pytest.mark.parametrize("tier,ci,examples,derandomized", [
    ("quick", "", 40, False), ("full", "", 400, False), ("quick", "true", 40, True), ("full", "1", 400, True),
])
def test_the_fuzzing_budget_per_tier_and_ci(monkeypatch, tier, ci, examples, derandomized):
    from hypothesis import settings
    monkeypatch.setenv("CI", ci)
    before = settings._current_profile
    try:
        plugin._load_hypothesis_profile(tier)
        assert settings.default.max_examples == examples and settings.default.derandomize == derandomized
        assert settings.default.deadline is None
        assert (settings.default.database is None) == derandomized
    finally:
        settings.load_profile(before)


def test_stress_repetitions_below_one_are_a_usage_error(tmp_path):
    """--stress-reps 0 would let a stress test pass having run nothing: refused as a usage error."""
    (tmp_path / "test_reps.py").write_text("import pytest\n\n@pytest.mark.stress\ndef test_r(stress_reps):\n"
                                           "    assert stress_reps >= 1\n")
    proc = run_with_plugin(tmp_path, "test_reps.py", "--stress", "--stress-reps", "0")
    assert proc.returncode != 0 and "--stress-reps: must be >= 1, got 0" in proc.stdout + proc.stderr


FIXTURES = '''
import json, os
from hypothesis import settings

def test_values(sweep_tier, stress_seed, stress_reps, selected_kernels):
    with open(os.environ["PLUGIN_SEEN"], "w") as f:
        json.dump(dict(tier=sweep_tier, seed=stress_seed, reps=stress_reps, kernels=selected_kernels,
                       examples=settings.default.max_examples, visible=os.environ.get("CUDA_VISIBLE_DEVICES")), f)
'''


def seen_by_a_test(tmp_path, monkeypatch, *options):
    """What the plugin's fixtures, hypothesis profile and GPU pinning hand a test, run with options."""
    (tmp_path / "test_fixtures.py").write_text(FIXTURES)
    seen = tmp_path / "seen.json"
    seen.unlink(missing_ok=True)
    monkeypatch.setenv("PLUGIN_SEEN", str(seen))
    proc = run_with_plugin(tmp_path, "test_fixtures.py", *options)
    return (json.loads(seen.read_text()) if seen.exists() else None), proc


def test_the_fixtures_take_the_options_and_their_defaults(tmp_path, monkeypatch):
    from deepgemm import registry
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")       # configure pins an xdist worker to one GPU
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    got, proc = seen_by_a_test(tmp_path, monkeypatch)
    assert got is not None, proc.stdout + proc.stderr
    assert got["tier"] == "quick" and got["reps"] == 20 and got["kernels"] == registry.names()
    assert isinstance(got["seed"], int) and got["seed"] >= 1 and got["examples"] == 40 and got["visible"] == "1"
    got, proc = seen_by_a_test(tmp_path, monkeypatch, "--sweep=full", "--stress-seed", "7", "--stress-reps", "1",
                               "--kernels", "v0, v3,")
    assert got is not None, proc.stdout + proc.stderr
    assert (got["tier"], got["seed"], got["reps"], got["kernels"], got["examples"]) == ("full", 7, 1, ["v0", "v3"], 400)
    got, proc = seen_by_a_test(tmp_path, monkeypatch, "--kernels", "v0,nope")
    assert got is None and "nope" in proc.stdout + proc.stderr


def test_the_markers_are_registered(tmp_path):
    proc = run_with_plugin(tmp_path, "--markers")
    for marker in ("gpu:", "sanitize:", "full:", "stress:", "hang_timeout(seconds):"):
        assert f"@pytest.mark.{marker}" in proc.stdout, marker
