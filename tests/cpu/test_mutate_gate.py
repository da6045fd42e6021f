"""`python -m deepgemm mutate --gate`: performance mutants judged by the benchmark gate, with a
stand-in benchmark command that writes pytest-benchmark JSON the way tests/bench does (raw samples,
a same-run reference, the GPU's identity). The gate's own rule decides; a slowdown must show twice."""
import json
import sys
from pathlib import Path

import pytest

from deepgemm.mutate import cli, operators, runner
from deepgemm.mutate.operators import Source, mutants_of

# The stand-in benchmarks: two kernels' benchmarks (each with a cuBLAS reference timed beside it),
# 40 rounds of a deterministic jitter. Run on a copy whose k.cu holds the mutated line ('<='), the
# benchmarks named in SLOW take FACTOR x as long; in "once" mode only in the first such run.
BENCH = """\
import json, os, sys
path, select, node_ids = sys.argv[1], sys.argv[2], sys.argv[3:]
conf = json.load(open(sys.argv[0] + ".json"))
names = ["tests/bench/test_b.py::test_gemm[v4-big]", "tests/bench/test_b.py::test_gemm[v4-small]",
         "tests/bench/test_b.py::test_gemm[v5-big]"]
chosen = node_ids or [n for n in names if select in n]
with open(sys.argv[0] + ".calls", "a") as calls:
    calls.write(json.dumps({"select": select, "node_ids": node_ids}) + "\\n")
mutated = "<=" in open(os.path.join(os.environ["DEEPGEMM_KERNEL_DIR"], "k.cu")).read()
slow_runs = os.path.join(os.path.dirname(path), "slow-runs")
slow = mutated and not (conf["once"] and os.path.exists(slow_runs))
if mutated:
    open(slow_runs, "a").write("x")
if conf.get("fail") and mutated:
    print("FAILED " + names[0] + " - AssertionError: the output is wrong")
    sys.exit(1)

def rounds(us, factor=1.0):
    return [us * factor * 1e-6 * (1 + 0.002 * (i % 7)) for i in range(40)]

benchmarks = []
for name in chosen:
    factor = conf["factor"] if slow and name in conf["slow"] else 1.0
    data, ref = rounds(100.0, factor), rounds(90.0)
    benchmarks.append({"fullname": name, "name": name.split("::")[1], "stats": {"data": data, "median": sorted(data)[20]},
                       "extra_info": {"reference": {"name": "cublas " + name, "samples": ref, "median": sorted(ref)[20]}}})
json.dump({"machine_info": {"gpu": {"name": "Fake GPU", "driver_version": "580.1", "cuda_runtime_version": "13.0"}},
           "commit_info": {"id": "abc"}, "datetime": "2026-01-01T00:00:00", "benchmarks": benchmarks}, open(path, "w"))
"""


def _gate_runner(tmp_path, slow=(), factor=1.3, once=False, fail=False, select=None):
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / "k.cu").write_text("if (row < p.m) f();\n")
    (m,) = mutants_of(Source("k.cu", (kernels / "k.cu").read_text()), [operators.OPERATORS["boundary.lt-to-le"]])
    script = tmp_path / "bench.py"
    script.write_text(BENCH)
    Path(str(script) + ".json").write_text(json.dumps({"slow": list(slow), "factor": factor, "once": once, "fail": fail}))

    def command(json_path, sel, node_ids):
        return [sys.executable, str(script), str(json_path), sel or "", *(node_ids or [])]
    gate = runner.Gate(command, select=select)
    settings = runner.Settings(compile_check=False, timeout=60.0, repo_root=tmp_path, log_dir=tmp_path / "logs", gate=gate)
    r = runner.Runner(runner.Workspace(kernels, root=tmp_path / "work"), settings)
    calls = lambda: [json.loads(line) for line in Path(str(script) + ".calls").read_text().splitlines()]
    return r, m, calls


def test_a_mutant_slower_twice_is_killed_by_the_gate(tmp_path):
    r, m, calls = _gate_runner(tmp_path, slow=["tests/bench/test_b.py::test_gemm[v4-big]"])
    base = r.evaluate(None, kernels=("v4",))
    assert base.outcome == "survived" and len(r.settings.gate.baseline.benchmarks) == 2
    res = r.evaluate(m, kernels=("v4",))
    assert res.outcome == "killed" and res.killer == "the gate: tests/bench/test_b.py::test_gemm[v4-big]"
    assert res.detail.startswith("100.") and res.detail.endswith(", 1 slower twice")
    assert "+30.0%" in res.detail and "---- the slower benchmarks once more ----" in Path(res.log).read_text()
    # The mutated kernels' benchmarks by name, then only the slower one again, by node id.
    assert [c["select"] for c in calls()] == ["v4", "v4", ""]
    assert calls()[-1]["node_ids"] == ["tests/bench/test_b.py::test_gemm[v4-big]"]
    assert (r.ws.kernels / "k.cu").read_text() == "if (row < p.m) f();\n"   # the original is back


def test_a_mutant_the_benchmarks_cannot_see_survives_with_the_gates_headline(tmp_path):
    r, m, calls = _gate_runner(tmp_path)
    assert r.evaluate(None, kernels=("v4",)).outcome == "survived"
    res = r.evaluate(m, kernels=("v4",))
    assert res.outcome == "survived" and res.detail == "the gate: PASS (2 same)"
    assert len(calls()) == 2   # no second run without a slower benchmark


def test_a_change_under_the_gates_floor_is_not_a_kill(tmp_path):
    r, m, _ = _gate_runner(tmp_path, slow=["tests/bench/test_b.py::test_gemm[v4-big]"], factor=1.03)
    r.evaluate(None, kernels=("v4",))
    assert r.evaluate(m, kernels=("v4",)).outcome == "survived"   # 3 %: under the 5 % floor


def test_slower_once_but_not_again_is_not_a_kill(tmp_path):
    r, m, _ = _gate_runner(tmp_path, slow=["tests/bench/test_b.py::test_gemm[v4-small]"], once=True)
    r.evaluate(None, kernels=("v4",))
    res = r.evaluate(m, kernels=("v4",))
    assert res.outcome == "survived"
    assert res.detail == "slower once, not again: tests/bench/test_b.py::test_gemm[v4-small]"


def test_a_failing_benchmark_kills_like_a_failing_test(tmp_path):
    r, m, calls = _gate_runner(tmp_path, fail=True)
    r.evaluate(None, kernels=("v4",))
    res = r.evaluate(m, kernels=("v4",))
    assert (res.outcome, res.killer) == ("killed", "tests/bench/test_b.py::test_gemm[v4-big]")
    assert res.detail == "AssertionError: the output is wrong"


def test_a_given_selection_replaces_the_kernels_names(tmp_path):
    r, _, calls = _gate_runner(tmp_path, select="v5")
    assert r.evaluate(None, kernels=("v4",)).outcome == "survived"
    assert calls()[0]["select"] == "v5" and list(r.settings.gate.baseline.benchmarks) == [
        "tests/bench/test_b.py::test_gemm[v5-big]"]


def test_a_selection_without_benchmarks_cannot_be_a_baseline(tmp_path):
    r, _, _ = _gate_runner(tmp_path, select="nothing-matches")
    base = r.evaluate(None, kernels=("v4",))
    assert (base.outcome, base.killer) == ("error", "no benchmark ran")


def test_a_run_the_gate_cannot_read_is_an_error_not_a_verdict(tmp_path):
    r, m, _ = _gate_runner(tmp_path)
    r.evaluate(None, kernels=("v4",))
    r.settings.gate.command = lambda json_path, sel, node_ids: [sys.executable, "-c",
                                                                 f"open(r'{json_path}', 'w').write('not json')"]
    res = r.evaluate(m, kernels=("v4",))
    assert (res.outcome, res.killer) == ("error", "the gate could not compare the runs") and "not JSON" in res.detail


# The gate's benchmarks are the repository's tests/bench: an installed deepgemm (tox tests the
# wheel) has none beside it.
@pytest.mark.skipif(not (runner._package_root() / "tests" / "bench").is_dir(),
                    reason="deepgemm under test is an installed package: --gate needs the repository's tests/bench")
def test_builtin_bench_command_runs_the_gates_benchmarks_into_one_json():
    command = runner.builtin_bench_command(runner._package_root())
    cmd = command(Path("/tmp/x.json"), "v4", None)
    assert cmd[1:5] == ["-m", "pytest", "tests/bench", "-k"] and cmd[5] == "v4"
    assert "--benchmark-only" in cmd and "--benchmark-json=/tmp/x.json" in cmd
    again = command(Path("/tmp/y.json"), None, ["tests/bench/test_bench.py::test_gemm[v4-4096^3-float16]"])
    assert again[3] == "tests/bench/test_bench.py::test_gemm[v4-4096^3-float16]" and "-k" not in again


@pytest.mark.parametrize("argv,message", [
    (["--gate", "--kernels", "v4", "--jobs", "2"], "--gate: one job"),
    (["--gate", "--kernels", "v4", "--test-cmd", "true"], "--gate: runs deepgemm's benchmarks"),
    (["--gate", "--kernels", "v4", "--static-only"], "--gate: runs deepgemm's benchmarks"),
    (["--kernels", "v4", "--bench-select", "v4"], "--bench-select: only with --gate"),
    (["--gate", "--kernels", "v0", "--sites", "v0_naive.cu:16:9:guard.term-dropped"], "--gate judges performance mutants only"),
])
def test_gate_arguments_are_checked(argv, message, capsys):
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_gate_without_a_gpu_says_why_it_cannot_run(capsys, monkeypatch):
    monkeypatch.setattr(cli, "_gpu_arch", lambda: (None, "no CUDA device"))
    assert cli.main(["--gate", "--kernels", "v4"]) == 2
    assert "--gate: needs a GPU to run the benchmarks on (no CUDA device)" in capsys.readouterr().err


def test_gate_lists_and_selects_only_the_performance_mutants(capsys):
    assert cli.main(["--gate", "--kernels", "v4", "--list"]) == 0
    out = capsys.readouterr().out
    assert "(0 for the test tier, " in out and "performance mutants for the regression gate" in out


# The command line end to end, on a machine without a GPU: the GPU check, the compile step and the
# benchmark command stood in for; every mutated copy of deepgemm's kernels runs 30 % slower.
SLOW_WHEN_MUTATED = """\
import filecmp, json, os, sys
path, select = sys.argv[1], sys.argv[2]
mine, pristine = os.environ["DEEPGEMM_KERNEL_DIR"], sys.argv[3]
same = not filecmp.dircmp(mine, pristine).diff_files and all(
    not filecmp.dircmp(os.path.join(mine, d), os.path.join(pristine, d)).diff_files for d in ("include/deepgemm",))
factor = 1.0 if same else 1.3
name = "tests/bench/test_bench.py::test_gemm[v4-4096^3-float16]"
data = [100e-6 * factor * (1 + 0.002 * (i % 7)) for i in range(40)]
ref = [90e-6 * (1 + 0.002 * (i % 7)) for i in range(40)]
json.dump({"machine_info": {"gpu": {"name": "Fake GPU", "driver_version": "580.1", "cuda_runtime_version": "13.0"}},
           "benchmarks": [{"fullname": name, "stats": {"data": data, "median": sorted(data)[20]},
                           "extra_info": {"reference": {"name": "cublas", "samples": ref, "median": sorted(ref)[20]}}}]},
          open(path, "w"))
"""


def test_the_command_line_judges_performance_mutants_and_writes_the_report(tmp_path, monkeypatch, capsys):
    from deepgemm import jit
    script = tmp_path / "bench.py"
    script.write_text(SLOW_WHEN_MUTATED)
    monkeypatch.setattr(cli, "_gpu_arch", lambda: ("sm_90a", "a stand-in GPU"))
    monkeypatch.setattr(runner.Runner, "compile_step", lambda self, kernels, mutated_file, warm=True: {})
    monkeypatch.setattr(runner, "builtin_bench_command", lambda repo_root: (
        lambda json_path, select, node_ids: [sys.executable, str(script), str(json_path), select or "",
                                             str(jit.KERNEL_DIR)]))
    out = tmp_path / "out"
    assert cli.main(["--gate", "--kernels", "v4", "--max", "2", "--out", str(out)]) == 0, capsys.readouterr()
    data = json.loads((out / "mutants.json").read_text())
    assert data["mode"] == "gate" and data["complete"] is True
    assert data["test_cmd"].endswith(f" <run>.json <the mutated kernels> {jit.KERNEL_DIR}")
    judged = [m for m in data["mutants"] if m["outcome"] != "performance"]
    assert len(judged) == 2 and all(m["family"] == "performance" for m in judged)
    assert {m["outcome"] for m in judged} == {"killed"}
    assert all(m["killer"] == "the gate: tests/bench/test_bench.py::test_gemm[v4-4096^3-float16]" for m in judged)
    assert data["summary"]["score"] == 1.0 and data["baseline"]["outcome"] == "survived"


# The baseline's benchmarks log what they build (as the tier's tests do): here V0's default variant
# for sm_80, compiled from the campaign's copy of the kernels, then a run's JSON as tests/bench
# writes it. A performance mutant whose builds keep their machine code is the same speed by
# construction: reported same-code, with no benchmark run.
BUILDS_V0 = """\
import json, sys
from deepgemm import registry, static_checks
path = sys.argv[1]
static_checks.variants(registry.get("v0"), "sm_80")[0].compile()
with open(path + ".calls", "a") as calls:
    calls.write("x\\n")
name = "tests/bench/test_bench.py::test_gemm[v0-4096^3-float16]"
data = [100e-6 * (1 + 0.002 * (i % 7)) for i in range(40)]
ref = [90e-6 * (1 + 0.002 * (i % 7)) for i in range(40)]
json.dump({"machine_info": {"gpu": {"name": "Fake GPU", "driver_version": "580.1", "cuda_runtime_version": "13.0"}},
           "benchmarks": [{"fullname": name, "stats": {"data": data, "median": sorted(data)[20]},
                           "extra_info": {"reference": {"name": "cublas", "samples": ref, "median": sorted(ref)[20]}}}]},
          open(path, "w"))
"""


def test_a_performance_mutant_that_keeps_the_benchmarked_code_is_same_code_without_a_run(tmp_path):
    from deepgemm import jit
    script = tmp_path / "bench.py"
    script.write_text(BUILDS_V0)
    runs = []

    def command(json_path, select, node_ids):
        runs.append(json_path)
        return [sys.executable, str(script), str(json_path)]
    settings = runner.Settings(static_archs=["sm_80"], variants="minimal", timeout=120.0, repo_root=tmp_path,
                               log_dir=tmp_path / "logs", gate=runner.Gate(command), same_code=True)
    r = runner.Runner(runner.Workspace(jit.KERNEL_DIR, root=tmp_path / "work"), settings)
    assert r.evaluate(None, kernels=("v0",)).outcome == "survived"
    assert [(b["name"].split("[")[0], b["source"], b["arch"]) for b in settings.tier_builds] == [
        ("v0", "v0_naive.cu", "sm_80")]
    text = (jit.KERNEL_DIR / "v0_naive.cu").read_text()
    start = text.index("acc = 0.0f;")

    def mutant(new):
        return operators.Mutant("v0_naive.cu", 0, 0, "test.edit", start, start + len("acc = 0.0f;"), new,
                                "acc = 0.0f;", "", performance=True, kernels=("v0",))
    same = r.evaluate(mutant("acc = 0.0f ;"), kernels=("v0",))   # a blank: the compiler's output is unchanged
    assert same.outcome == "same-code" and "builds of the tests that use v0_naive.cu" in same.detail
    assert len(runs) == 1   # the baseline's only
    other = r.evaluate(mutant("acc = 1.0f;"), kernels=("v0",))   # other code: the benchmarks judge
    assert other.outcome == "survived" and len(runs) == 2
