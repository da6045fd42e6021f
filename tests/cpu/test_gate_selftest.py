"""The gate self-test's planted slowdowns and selections, checked without a GPU: the patch on the
real kernel sources, and the -k expressions collected from tests/bench."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deepgemm.gate import selftest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("plant", selftest.PLANTS, ids=lambda p: p.kernel)
def test_planted_slowdown_patches_exactly_the_kernel_entry(plant, tmp_path):
    copy = selftest.planted_kernel_dir(REPO / "kernels", tmp_path / "k", plant, 15000)
    original = (REPO / "kernels" / plant.source).read_text()
    patched = (copy / plant.source).read_text()
    wait = selftest.planted_wait(15000)
    assert patched.count(wait) == 1 and patched.count(selftest.MARK) == 1 and "< 15000ull" in wait
    body = patched.split("deepgemm_kernel(", 1)[1]
    head, rest = body.split("{", 1)
    assert rest.lstrip().startswith(wait)  # the first statement of the kernel
    assert patched.replace(f"\n    {wait}  // {selftest.MARK}", "") == original
    # Everything else is an untouched copy (headers included: the JIT resolves them there).
    others = sorted(p.relative_to(REPO / "kernels") for p in (REPO / "kernels").rglob("*") if p.is_file())
    assert sorted(p.relative_to(copy) for p in copy.rglob("*") if p.is_file()) == others
    assert all((copy / p).read_bytes() == (REPO / "kernels" / p).read_bytes() for p in others if p.name != plant.source)


def test_plant_slowdown_rejects_bad_input():
    with pytest.raises(ValueError, match="delay_ns"):
        selftest.plant_slowdown("void deepgemm_kernel(int p) {}", 0)
    with pytest.raises(ValueError, match="exactly one"):
        selftest.plant_slowdown("__global__ void other(int p) {}", 100)


COLLECT = """
import sys, pytest
for select in sys.argv[1:]:
    print("=== " + select, flush=True)
    pytest.main(["tests/bench", "--collect-only", "-q", "-p", "no:cacheprovider", "-k", select])
"""


def test_selftest_selections_collect_only_that_kernels_benchmarks():
    """Each planted run's -k expression, collected for real from tests/bench (collecting needs no
    GPU): it selects benchmarks of that kernel and nothing else."""
    env = dict(os.environ, PYTEST_ADDOPTS="", PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", COLLECT, *(p.select for p in selftest.PLANTS)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    blocks = proc.stdout.split("=== ")[1:]
    assert len(blocks) == len(selftest.PLANTS), proc.stdout
    for plant, block in zip(selftest.PLANTS, blocks):
        ids = [line for line in block.splitlines() if "::" in line]
        assert len(ids) >= 4, block
        tag = {"v4": "[v4-", "v5": "[v5-", "small_m": "test_small_m_decode["}[plant.kernel]
        assert all(tag in i for i in ids), ids
        assert f"({plant.select})" in selftest.union_selection()


def test_selftest_arguments_are_checked():
    with pytest.raises(SystemExit):
        selftest.main(["--kernels", "v9"])
    with pytest.raises(SystemExit):
        selftest.main(["--delay-ns", "0"])


def test_run_selftest_judges_each_step(tmp_path, monkeypatch):
    """The orchestration with pytest replaced: which runs it makes, with what, and how it reads
    their outcome (a planted run that passes, or fails on the wrong kernel, is WRONG)."""
    calls = []

    def fake_pytest(args, log, env):
        calls.append((args, env.get("DEEPGEMM_KERNEL_DIR")))
        log.write_text("log")
        verdict_arg = next((a for a in args if a.startswith("--gate-verdict=")), None)
        if verdict_arg is None:
            return 0  # the baseline recording
        planted = env.get("DEEPGEMM_KERNEL_DIR")
        kernel = Path(planted).name.split("-", 1)[1] if planted else None
        slower_name = {"v4": "test_gemm[v4-4096^3-float16]", "v5": "test_gemm[v4-8192^3-float16]"}.get(kernel)
        verdicts = [{"name": slower_name, "status": "slower"}] if slower_name else []
        result = "fail" if verdicts else "pass"
        Path(verdict_arg.split("=", 1)[1]).write_text(
            json.dumps({"result": result, "headline": result.upper(), "verdicts": verdicts}))
        return 1 if verdicts else 0

    monkeypatch.setattr(selftest, "_pytest", fake_pytest)
    plants = [p for p in selftest.PLANTS if p.kernel in ("v4", "v5")]
    steps = selftest.run_selftest(tmp_path, record=False, reruns=2, delay_ns=5000, plants=plants)
    assert [s.name for s in steps] == ["record baseline (scratch)", "rerun 1, unchanged code", "rerun 2, unchanged code",
                                       "planted: v4 waits 5 µs per block", "planted: v5 waits 5 µs per block"]
    assert [s.ok for s in steps] == [True, True, True, True, False]  # v5's run failed on a V4 benchmark
    assert "expected FAIL with a v5 benchmark slower" in steps[-1].why
    record_args, _ = calls[0]
    assert "--benchmark-save=baseline" in record_args and f"--benchmark-storage={tmp_path / 'regressions'}" in record_args
    assert record_args[record_args.index("-k") + 1] == selftest.union_selection(plants)
    planted_args, kernel_dir = calls[3]
    assert planted_args[planted_args.index("-k") + 1] == plants[0].select and "--benchmark-compare" in planted_args
    assert selftest.planted_wait(5000) in (Path(kernel_dir) / "v4_mma.cu").read_text()
    text = selftest.summary(steps)
    assert "| planted: v5 waits 5 µs per block | FAIL | 1 | WRONG |" in text and "FAILED" in text


def test_planted_copies_are_of_the_sources_the_jit_compiles(tmp_path, monkeypatch):
    """An installed deepgemm has no kernels/ beside it (the wheel ships them as deepgemm/kernels):
    the slowed copy is made from where the JIT finds its sources, here a DEEPGEMM_KERNEL_DIR."""
    sources = tmp_path / "sources"
    shutil.copytree(REPO / "kernels", sources)
    with open(sources / "v4_mma.cu", "a") as f:
        f.write("// the copy the JIT compiles\n")
    monkeypatch.setenv("DEEPGEMM_KERNEL_DIR", str(sources))
    planted = []
    monkeypatch.setattr(selftest, "_pytest", lambda args, log, env: planted.append(env.get("DEEPGEMM_KERNEL_DIR")) or 0)
    selftest.run_selftest(tmp_path / "out", record=False, reruns=0, delay_ns=5000, plants=selftest.PLANTS[:1])
    copy = Path(planted[-1]) / "v4_mma.cu"
    assert copy.parent != sources and "// the copy the JIT compiles" in copy.read_text()
    assert selftest.planted_wait(5000) in copy.read_text()


def test_a_step_without_a_verdict_is_wrong_even_with_an_old_verdict_lying_around(tmp_path, monkeypatch):
    (tmp_path / "rerun1-verdict.json").write_text(json.dumps({"result": "pass", "headline": "old", "verdicts": []}))

    def no_verdict(args, log, env):  # e.g. refused at configure: exit 4, nothing written
        log.write_text("log")
        return 0 if "--benchmark-save=baseline" in args else 4

    monkeypatch.setattr(selftest, "_pytest", no_verdict)
    steps = selftest.run_selftest(tmp_path, record=True, reruns=1, delay_ns=5000, plants=selftest.PLANTS[:1])
    assert [s.ok for s in steps] == [True, False, False]
    assert steps[1].why == "no verdict written (see the log)" and steps[1].rc == 4
    assert "gate self-test: FAILED" in (tmp_path / "selftest.md").read_text()


COMPILE = """
import sys
from deepgemm import binary, registry
for name in sys.argv[1:]:
    kernel = registry.compile_variant(registry.get(name), "sm_90a", "float16", "float16", True, False)
    sass = binary.dump_sass(kernel.cubin_path)
    print(name, sass.count("SR_GLOBALTIMER"), kernel.resources["spill_stores"])
"""


def test_planted_kernels_compile_and_wait_on_the_global_timer(tmp_path):
    """Each slowed copy compiles (NVRTC, sm_90a) with the JIT pointed at it, and its SASS reads
    %globaltimer: the self-test's slowdown is really in the binary the benchmarks would run."""
    outputs = []
    for plant in selftest.PLANTS:
        kernels = selftest.planted_kernel_dir(REPO / "kernels", tmp_path / plant.kernel, plant)
        env = dict(os.environ, DEEPGEMM_KERNEL_DIR=str(kernels), DEEPGEMM_CACHE_DIR=str(tmp_path / "cache"),
                   PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        proc = subprocess.run([sys.executable, "-c", COMPILE, plant.kernel], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        name, timer_reads, spills = proc.stdout.split()
        assert name == plant.kernel and int(timer_reads) >= 2 and spills == "0", proc.stdout
        outputs.append(name)
    assert outputs == [p.kernel for p in selftest.PLANTS]


def test_the_planted_wait_is_bounded_at_both_ends():
    source = "void deepgemm_kernel(int p) {}"
    assert selftest.planted_wait(1) in selftest.plant_slowdown(source, 1)
    assert selftest.planted_wait(1_000_000) in selftest.plant_slowdown(source, 1_000_000)
    for bad in (-5, 1_000_001, 2.5, "100"):
        with pytest.raises(ValueError, match=r"^delay_ns: an int in \(0, 1e6\] nanoseconds"):
            selftest.plant_slowdown(source, bad)


def test_a_planted_copy_replaces_whatever_an_earlier_self_test_left(tmp_path):
    dest = tmp_path / "k"
    (dest / "include").mkdir(parents=True)
    (dest / "stale.cu").write_text("// from an earlier run")
    (dest / "v4_mma.cu").write_text("// an older, unpatched copy")
    selftest.planted_kernel_dir(REPO / "kernels", dest, selftest.PLANTS[0], 5000)
    assert not (dest / "stale.cu").exists()
    assert selftest.planted_wait(5000) in (dest / "v4_mma.cu").read_text()


def test_a_step_logs_its_command_and_a_step_past_its_limit_is_exit_124(tmp_path, monkeypatch):
    seen = []

    def finishes(cmd, **kwargs):
        seen.append(cmd)
        os.write(kwargs["stdout"].fileno(), b"pytest's own output\n")   # as the child writes: to the file itself
        return subprocess.CompletedProcess(cmd, 3)

    monkeypatch.setattr(selftest.subprocess, "run", finishes)
    assert selftest._pytest(["-k", "v4"], tmp_path / "a.log", {}) == 3
    cmd = seen[0]
    assert cmd[:3] == [sys.executable, "-m", "pytest"] and cmd[-2:] == ["-k", "v4"] and "--benchmark-only" in cmd
    assert (tmp_path / "a.log").read_text() == "$ " + " ".join(cmd) + "\npytest's own output\n"

    def hangs(cmd, **kwargs):
        raise subprocess.TimeoutExpired(cmd, kwargs["timeout"])

    monkeypatch.setattr(selftest.subprocess, "run", hangs)
    assert selftest._pytest([], tmp_path / "b.log", {}) == 124
    log = (tmp_path / "b.log").read_text()
    assert log.startswith("$ ") and log.endswith(f"\nstopped after {selftest.STEP_TIMEOUT_S} s\n")


@pytest.mark.parametrize("rc, result, ok", [(0, "pass", True), (0, "fail", False), (1, "pass", False), (4, "pass", False)])
def test_an_unchanged_rerun_is_as_expected_only_when_it_exits_0_with_a_pass(rc, result, ok, tmp_path):
    verdicts = [] if result == "pass" else [{"name": "test_gemm[v4-4096^3-float16]", "status": "slower"}]
    (tmp_path / "v.json").write_text(json.dumps({"result": result, "headline": result.upper(), "verdicts": verdicts}))
    step = selftest.Step("rerun 1, unchanged code", "pass", rc=rc)
    selftest._judge_step(step, tmp_path / "v.json", None)
    assert step.ok is ok and step.headline == result.upper()
    assert step.why == ("" if ok else "expected PASS: " + ("test_gemm[v4-4096^3-float16]" if verdicts else result.upper()))


def test_main_passes_its_arguments_on_and_needs_a_gpu(tmp_path, monkeypatch, capsys):
    from deepgemm import device

    monkeypatch.setattr(device, "gpu_available", lambda: (False, "no CUDA driver"))
    assert selftest.main(["--out", str(tmp_path / "none")]) == 2
    assert "gate self-test needs a GPU: no CUDA driver" in capsys.readouterr().err

    calls = []

    def fake_run(out, *, record, reruns, delay_ns, plants):
        calls.append((out, record, reruns, delay_ns, [p.kernel for p in plants]))
        out.mkdir(parents=True, exist_ok=True)
        return [selftest.Step("record baseline", "pass", rc=0, ok=True)] * (1 + reruns + len(plants))

    monkeypatch.setattr(device, "gpu_available", lambda: (True, ""))
    monkeypatch.setattr(selftest, "run_selftest", fake_run)
    assert selftest.main(["--record", "--reruns", "1", "--delay-ns", "7000", "--kernels", "small_m,v4",
                          "--out", str(tmp_path / "o")]) == 0
    assert calls[-1] == ((tmp_path / "o").resolve(), True, 1, 7000, ["v4", "small_m"])
    assert "gate self-test: every step as expected" in (tmp_path / "o" / "selftest.md").read_text()
    assert selftest.main(["--out", str(tmp_path / "d")]) == 0   # the defaults
    assert calls[-1][1:] == (False, 3, selftest.DEFAULT_DELAY_NS, ["v4", "v5", "small_m"])
    assert selftest.main(["--reruns", "0", "--kernels", "v5", "--out", str(tmp_path / "z")]) == 0
    assert calls[-1][1:] == (False, 0, selftest.DEFAULT_DELAY_NS, ["v5"])
    capsys.readouterr()


def test_main_says_no_when_a_step_went_wrong_or_the_run_stopped_short(tmp_path, monkeypatch, capsys):
    from deepgemm import device

    with pytest.raises(SystemExit):
        selftest.main(["--reruns", "-1"])
    assert "--reruns: must be >= 0, got -1" in capsys.readouterr().err
    monkeypatch.setattr(device, "gpu_available", lambda: (True, ""))
    good = selftest.Step("rerun 1, unchanged code", "pass", rc=0, ok=True)
    wrong = selftest.Step("planted: v4 waits 20 µs per block", "fail", rc=0, why="expected FAIL", headline="PASS")
    for steps, status in (([good] * 3, 0), ([good, good, wrong], 1), ([good] * 2, 1)):   # 3 steps expected
        monkeypatch.setattr(selftest, "run_selftest", lambda out, steps=steps, **kw: out.mkdir(exist_ok=True) or steps)
        assert selftest.main(["--reruns", "1", "--kernels", "v4", "--out", str(tmp_path / "o")]) == status
        printed = capsys.readouterr().out
        assert printed == (tmp_path / "o" / "selftest.md").read_text() == selftest.summary(steps, 3) + "\n"


def test_the_summary_is_a_table_then_the_outcome():
    good = selftest.Step("rerun 1, unchanged code", "pass", rc=0, headline="PASS (3 same)", seconds=12.4, ok=True)
    assert selftest.summary([good], 1).splitlines() == [
        "| step | expected | exit | came out | verdict | s |", "|---|---|---:|---|---|---:|",
        "| rerun 1, unchanged code | PASS | 0 | as expected | PASS (3 same) | 12 |", "",
        "gate self-test: every step as expected"]
    assert selftest.summary([good], 3).endswith("\ngate self-test: 1 of 3 steps run")
