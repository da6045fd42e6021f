"""The CI definition (.github/workflows/ci.yml) and the scripts it runs, checked without a runner:
the workflow's wiring parsed from the YAML, the GPU scripts run here, on a machine without a GPU,
where they must fail loudly (a GPU job that passes without a GPU tests nothing)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from subprocess_env import child_env

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "ci.yml"


@pytest.fixture(scope="module")
def workflow():
    yaml = pytest.importorskip("yaml", reason="PyYAML (pip install -e '.[test]') parses the workflow")
    data = yaml.safe_load(WORKFLOW.read_text())
    # YAML 1.1 reads the key `on` as the boolean True.
    data["on"] = data.pop(True, data.get("on"))
    return data


def script_of(step) -> str | None:
    run = step.get("run", "")
    return run.split()[1] if run.startswith("bash ") else None


def test_triggers_and_manual_baseline_recording(workflow):
    on = workflow["on"]
    assert "pull_request" in on and on["push"]["branches"] == ["main"]
    record = on["workflow_dispatch"]["inputs"]["record-baseline"]
    assert record["type"] == "boolean" and record["default"] is False


def test_cpu_tier_on_hosted_runners(workflow):
    cpu = workflow["jobs"]["cpu"]
    assert cpu["runs-on"] == "ubuntu-latest"
    assert [script_of(s) for s in cpu["steps"] if script_of(s)] == [".ci/run"]


def test_gpu_job_runs_the_quick_tier_then_the_gate_with_cache_and_artifacts(workflow):
    gpu = workflow["jobs"]["gpu"]
    assert gpu["runs-on"] == ["self-hosted", "gpu"] and gpu["needs"] == "cpu"
    steps = gpu["steps"]
    assert [script_of(s) for s in steps if script_of(s)] == [".ci/gpu-tier", ".ci/gate"]
    uses = [s.get("uses", "").split("@")[0] for s in steps]
    assert uses.index("actions/cache") < uses.index("actions/upload-artifact")
    assert uses.index("actions/cache") < [script_of(s) for s in steps].index(".ci/gpu-tier")
    env = gpu["env"]
    # The cache is what the JIT writes to.
    cache = steps[uses.index("actions/cache")]["with"]
    assert env["DEEPGEMM_CACHE_DIR"] == "${{ github.workspace }}/" + cache["path"]
    assert "hashFiles('kernels/**'" in cache["key"]
    # The artifact holds what .ci/gate writes, also when the gate failed.
    upload = steps[uses.index("actions/upload-artifact")]
    assert upload["if"] == "always()"
    paths = upload["with"]["path"].split()
    assert env["GATE_OUT"] + "/" in paths and "regressions/" in paths
    assert "inputs.record-baseline" in env["GATE_RECORD"]
    assert "pull_request.head.sha" in env["DEEPGEMM_COMMIT"]


def test_every_script_the_workflow_runs_exists_and_is_executable(workflow):
    scripts = [script_of(s) for job in workflow["jobs"].values() for s in job["steps"] if script_of(s)]
    assert scripts
    for script in scripts:
        path = REPO / script
        assert path.is_file() and os.access(path, os.X_OK), script
        assert path.read_text().startswith("#!/usr/bin/env bash\n")


def run_script(script, tmp_path, **env):
    full = child_env(PYTEST_ADDOPTS="")
    full.pop("GITHUB_STEP_SUMMARY", None)
    full.update(env)
    return subprocess.run(["bash", str(REPO / script)], cwd=tmp_path, env=full, capture_output=True,
                          text=True, timeout=600)


def test_gate_script_without_gpu_fails_with_the_reason_in_the_summary(tmp_path):
    summary, out = tmp_path / "summary.md", tmp_path / "gate"
    proc = run_script(".ci/gate", tmp_path, GITHUB_STEP_SUMMARY=str(summary), GATE_OUT=str(out))
    assert proc.returncode == 4, proc.stdout + proc.stderr  # pytest's usage error
    text = summary.read_text()
    assert text.startswith("## ❌ Benchmark gate: no verdict (exit 4)")
    assert "--benchmark-compare needs a GPU" in text
    assert "--benchmark-compare needs a GPU" in (out / "gate.log").read_text()


def test_gpu_tier_script_without_gpu_fails(tmp_path):
    proc = run_script(".ci/gpu-tier", tmp_path)
    assert proc.returncode != 0 and "no GPU on this runner" in proc.stderr, proc.stdout + proc.stderr


def test_gate_script_end_to_end_on_a_fake_gpu(tmp_path):
    """.ci/gate as CI runs it, on a fake GPU's benchmarks (tests/cpu/fake_bench_project.py):
    record a baseline, then gate an unchanged run (exit 0), a slowed one (exit 1: slower again when
    timed alone) and one slowed in its first session only (exit 0), with the Markdown verdict
    appended to the job summary and the runs and verdict left for the artifact."""
    from fake_bench_project import write_project

    project = write_project(tmp_path / "project")
    summary, out = tmp_path / "summary.md", tmp_path / "gate"
    env = dict(GITHUB_STEP_SUMMARY=str(summary), GATE_OUT=str(out), FAKE_GPU_NAME="Fake GPU X",
               GATE_TESTS=str(project / "test_fake_gate.py"), DEEPGEMM_COMMIT="0123456789" * 4,
               PYTHONPATH=os.pathsep.join([str(project), str(REPO), os.environ.get("PYTHONPATH", "")]))

    proc = run_script(".ci/gate", tmp_path, GATE_RECORD="1", FAKE_SEED="1", **env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    baseline = project / "regressions" / "Fake_GPU_X" / "driver580-cuda13" / "baseline.json"
    text = summary.read_text()
    assert text.startswith("## Benchmark baseline recorded (exit 0)") and f"saved {baseline}" in text

    summary.write_text("")
    proc = run_script(".ci/gate", tmp_path, FAKE_SEED="2", **env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert summary.read_text().startswith("## ✅ Benchmark gate: PASS (2 same)")

    summary.write_text("")
    proc = run_script(".ci/gate", tmp_path, FAKE_SEED="3", FAKE_SLOWDOWN="1.2", **env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    text = summary.read_text()
    assert text.startswith("## ❌ Benchmark gate: FAIL: 1 benchmark(s) slower")
    assert "| SLOWER | test_fake_gate.py::test_gemm |" in text
    assert "slower again alone" in text   # the slower benchmark was timed again, and was slower again
    assert {p.name for p in out.iterdir()} == {"bench.json", "again.json", "verdict.json", "verdict.md", "gate.log"}
    assert json.loads((out / "verdict.json").read_text())["result"] == "fail"
    assert len(json.loads((out / "bench.json").read_text())["benchmarks"][0]["stats"]["data"]) == 20
    assert [b["name"] for b in json.loads((out / "again.json").read_text())["benchmarks"]] == ["test_gemm"]

    # Slower in the first run only (a passing disturbance): timed again, the gate passes and says so.
    (project / ".fake_sessions").unlink()
    summary.write_text("")
    proc = run_script(".ci/gate", tmp_path, FAKE_SEED="4", FAKE_SLOWDOWN="1.2,1", **env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = summary.read_text()
    assert text.startswith("## ✅ Benchmark gate: PASS (1 unsure, 1 same)") and "not confirmed" in text
    # GATE_CONFIRM=0 keeps the first run's verdict.
    (project / ".fake_sessions").unlink()
    proc = run_script(".ci/gate", tmp_path, FAKE_SEED="4", FAKE_SLOWDOWN="1.2,1", GATE_CONFIRM="0", **env)
    assert proc.returncode == 1 and not (out / "again.json").exists(), proc.stdout + proc.stderr


def test_test_file_names_are_unique_across_the_tiers():
    """pytest imports test files by basename (the test folders are not packages): two files of
    one name in tests/cpu and tests/gpu make the second an import-mismatch error at collection, which
    only shows where both tiers are collected."""
    root = Path(__file__).resolve().parents[1]
    names = [p.name for p in root.rglob("test_*.py")]
    assert len(names) == len(set(names)), sorted(n for n in set(names) if names.count(n) > 1)


def _tier_ran(*args):
    return subprocess.run([sys.executable, str(REPO / ".ci" / "tier_ran.py"), *map(str, args)], capture_output=True,
                          text=True, timeout=60)


def test_tier_ran_names_each_skip_under_its_folder_and_an_empty_tier(tmp_path):
    junit = tmp_path / "j.xml"
    junit.write_text("""<?xml version="1.0"?><testsuites><testsuite>
      <testcase classname="tests.cpu.test_a" name="test_one"/>
      <testcase classname="tests.cpu.test_a.TestB" name="test_two"/>
      <testcase classname="tests.gpu.test_c" name="test_three"><skipped message="GPU tier skipped: no GPU"/></testcase>
      <testcase classname="" name="tests.gpu.test_d"><skipped message="could not import 'cupy': nope"/></testcase>
      <testcase classname="tests.gpu.test_e" name="test_four"><skipped message="needs --sanitize"/></testcase>
      <testcase classname="tests.gpu.test_e" name="test_five"/>
      <testcase classname="tests.cpuish.test_f" name="test_six"><skipped message="x"/></testcase>
    </testsuite></testsuites>""")
    ok = _tier_ran(junit, "tests/cpu")
    assert ok.returncode == 0 and "2 test(s) under tests/cpu ran, none skipped" in ok.stdout, ok.stderr
    every = _tier_ran(junit, "tests/gpu")
    assert every.returncode == 1 and "3 test(s) under tests/gpu skipped" in every.stderr
    assert "tests.gpu.test_d::tests.gpu.test_d: could not import 'cupy': nope" in every.stderr   # a module skipped whole
    chosen = _tier_ran(junit, "tests/gpu", "--forbid-reason", "GPU tier skipped", "--forbid-reason", "could not import 'cupy'")
    assert chosen.returncode == 1 and "2 test(s) under tests/gpu skipped" in chosen.stderr
    assert "needs --sanitize" not in chosen.stderr
    assert _tier_ran(junit, "tests/gpu", "--forbid-reason", "stress tier only").returncode == 0
    empty = _tier_ran(junit, "tests/bench")
    assert empty.returncode == 1 and "no test under tests/bench ran" in empty.stderr


def test_tier_ran_every_file_fails_a_file_with_nothing_run_unless_exempt(tmp_path):
    """--every-file: a selection bug that skips every test for an allowed reason ("needs --sanitize")
    leaves files with nothing run; a file of another tier, or whose every skip is a hardware reason, may."""
    junit = tmp_path / "j.xml"
    def write(*cases):
        junit.write_text('<?xml version="1.0"?><testsuites><testsuite>' + "".join(cases) + "</testsuite></testsuites>")
    ran = '<testcase classname="tests.gpu.{}" name="{}"/>'.format
    skip = '<testcase classname="tests.gpu.{}" name="{}"><skipped message="{}"/></testcase>'.format
    every = ("--every-file", "--may-skip-whole", "tests/gpu/test_sanitize.py", "--hardware-reason", "V5 needs")
    write(ran("test_sweep", "a"), skip("test_sweep", "b", "needs --sanitize"),
          skip("test_sanitize", "c", "needs --sanitize"), skip("test_v5.TestK", "d", "V5 needs sm_90 (Hopper)"),
          skip("test_v5", "e", "V5 needs compute capability 9.0"),
          skip("test_pdl", "f", "needs --sanitize"), ran("test_pdl", "g"))
    ok = _tier_ran(junit, "tests/gpu", "--forbid-reason", "GPU tier skipped", *every)
    assert ok.returncode == 0 and "2 of 4 file(s) had a test that ran" in ok.stdout, ok.stderr
    # the bug: every test of test_sweep skipped with the sanitizer's reason
    write(skip("test_sweep", "a", "needs --sanitize"), skip("test_sweep", "b", "needs --sanitize"),
          skip("test_sanitize", "c", "needs --sanitize"), ran("test_pdl", "g"))
    bad = _tier_ran(junit, "tests/gpu", "--forbid-reason", "GPU tier skipped", *every)
    assert bad.returncode == 1 and "1 file(s) under tests/gpu had no test run" in bad.stderr
    assert "tests/gpu/test_sweep.py: 2 skipped, e.g. 'needs --sanitize'" in bad.stderr
    assert _tier_ran(junit, "tests/gpu", "--forbid-reason", "GPU tier skipped").returncode == 0   # without the rule
    # one hardware skip beside a reason that is not one does not exempt a file; a module skipped whole counts
    write(skip("test_v5", "d", "V5 needs sm_90"), skip("test_v5", "e", "needs --sanitize"), ran("test_pdl", "g"),
          '<testcase classname="" name="tests.gpu.test_mod"><skipped message="stress tier only"/></testcase>')
    mixed = _tier_ran(junit, "tests/gpu", "--forbid-reason", "GPU tier skipped", *every)
    assert mixed.returncode == 1 and "2 file(s)" in mixed.stderr
    assert "tests/gpu/test_v5.py" in mixed.stderr and "tests/gpu/test_mod.py" in mixed.stderr


def test_a_tier_whose_every_test_skips_passes_pytest_and_fails_tier_ran(tmp_path):
    """The failure .ci/tier_ran.py exists for: a conftest (as a tier-selection bug would) skipping every
    test leaves pytest's exit status 0; the same tests unskipped pass both."""
    tests = tmp_path / "tests" / "cpu"
    tests.mkdir(parents=True)
    (tmp_path / "tests" / "__init__.py").write_text("")
    (tests / "__init__.py").write_text("")
    (tests / "test_x.py").write_text("def test_a():\n    assert 1 + 1 == 2\n\ndef test_b():\n    assert True\n")
    def run(conftest):
        (tmp_path / "conftest.py").write_text(conftest)
        junit = tmp_path / "junit.xml"
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                               f"--junitxml={junit}", "tests/cpu"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=120, env=child_env(PYTEST_ADDOPTS=""))
        return proc.returncode, _tier_ran(junit, "tests/cpu").returncode
    skip_all = ("import pytest\n\ndef pytest_collection_modifyitems(config, items):\n"
                "    for item in items:\n        item.add_marker(pytest.mark.skip(reason='GPU tier skipped: x'))\n")
    assert run(skip_all) == (0, 1)
    assert run("") == (0, 0)


def test_the_ci_scripts_check_the_tier_they_ran():
    """.ci/run hands pytest a JUnit path and holds tests/cpu to no skip at all; .ci/gpu-tier holds
    tests/gpu to no skip for want of a GPU or of CuPy, and every file but the other tiers' to a test run."""
    run = (REPO / ".ci" / "run").read_text()
    assert "--junitxml=out/ci/cpu-junit.xml" in run and "\npython3 .ci/tier_ran.py out/ci/cpu-junit.xml tests/cpu\n" in run
    assert run.index("--junitxml") < run.index("\npython3 .ci/tier_ran.py")
    gpu = (REPO / ".ci" / "gpu-tier").read_text()
    assert "--junitxml=out/ci/gpu-junit.xml" in gpu
    assert ('.ci/tier_ran.py out/ci/gpu-junit.xml tests/gpu --forbid-reason "GPU tier skipped" '
            "--forbid-reason \"could not import 'cupy'\" \\\n    --every-file") in gpu
    exempt = re.findall(r"--may-skip-whole (\S+)", gpu)
    assert sorted(exempt) == ["tests/gpu/test_multi_gpu.py", "tests/gpu/test_sanitize.py", "tests/gpu/test_stress.py"]
    assert all((REPO / f).is_file() for f in exempt)
    assert os.access(REPO / ".ci" / "tier_ran.py", os.X_OK)
