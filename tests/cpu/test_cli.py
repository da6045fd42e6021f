"""`python -m deepgemm`: one parser for every command, filters that must select something, clean
usage errors (exit status 2) instead of tracebacks, repository-relative defaults, and runtime
commands that need no test-only package."""
import argparse
import subprocess
import sys
import types

import pytest

from deepgemm import __main__ as cli_main
from deepgemm import cli, registry, static_checks

COMMANDS = ("check", "static", "kernels", "explain", "warm-cache", "tune", "report", "regress", "mutate")


def _usage_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as info:
        cli_main.main(argv)
    assert info.value.code == 2
    return capsys.readouterr().err


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as info:
        cli_main.main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert f"\n    {name}" in out, name
    assert set(cli_main._commands()) == set(COMMANDS)


def test_a_typo_is_an_argparse_error_listing_every_command(capsys):
    err = _usage_error(["reprot"], capsys)
    assert "invalid choice: 'reprot'" in err
    assert all(repr(name) in err for name in COMMANDS)


@pytest.mark.parametrize("argv, message", [
    (["static", "--arch", "sm_86"], "--arch: sm_86 is not a target of any kernel; valid: sm_80, sm_90a"),
    (["static", "--kernels", "v5", "--arch", "sm_80"], "--arch: sm_80 is not a target of these kernels; valid: sm_90a"),
    (["static", "--kernels", "v9"], "unknown kernel(s) 'v9'; valid: v0, v1, v2, v3, v4, v5, small_m, fp16acc_simt"),
    (["static", "--kernels", ","], "no kernel(s) given; valid: v0"),
    (["static", "--arch", "hopper"], "'hopper' given; expected CUDA targets such as sm_80 or sm_90a"),
    (["check", "--kernels", "fp16acc_mma"], "unknown kernel(s) 'fp16acc_mma'; valid: v0, v1, v2, v3, v4, v5, small_m"),
    (["warm-cache", "--kernels", "v5", "--arch", "sm_80"], "none of these kernels builds for these archs"),
    (["tune", "--kernels", "v7"], "unknown kernel(s) 'v7'"),
    (["tune", "--dtypes", "float32"], "unknown dtype(s) 'float32'; valid: float16, bfloat16"),
    (["tune", "--shapes", "16x4096"], "shape '16x4096': expected MxNxK"),
    (["regress", "history", "--match", "("], "argument --match: '(' is not a valid regular expression"),
    (["report"], "required: report"),
    (["--size", "0"], "argument --size: expected a positive integer, got '0'"),
    (["explain", "16x4096"], "argument shape: shape '16x4096': expected MxNxK"),
    (["explain", "16x4096x4096", "--dtype", "int8"], "dtype: must be one of ('float16', 'bfloat16'), got int8"),
    (["explain", "16x4096x4096", "--kernel", "v9"], "kernel: unknown kernel 'v9'; available: v0"),
    (["explain", "100x4096x4096", "--kernel", "small_m"], "'small_m' cannot run this problem: M=100 is over"),
    (["explain", "16x4096x4096", "--epilogue", "gelu+relu"], "at most one activation"),
    (["explain", "16x4096x4096", "--layout", "rt"], "argument --layout: invalid choice: 'rt'"),
])
def test_bad_input_is_a_usage_error_naming_what_is_valid(argv, message, capsys):
    err = _usage_error(argv, capsys)
    assert message in err, err
    assert "Traceback" not in err


def test_explain_prints_what_dispatch_explains_for_the_shape_and_options(capsys):
    """The shell form of deepgemm.explain(): the same text, for the problem the options describe."""
    from deepgemm import dispatch
    from deepgemm.registry import Epilogue
    argv = ["explain", "512x768x3072", "--dtype", "bf16", "--layout", "rr", "--epilogue", "bias+gelu+residual",
            "--cc", "90", "--kernel", "v4"]
    assert cli_main.main(argv) == 0
    chain = Epilogue(bias="bfloat16", activation="gelu", residual="bfloat16")
    want = dispatch.explain(512, 768, 3072, "bfloat16", 90, layout="rr", epilogue=chain, kernel="v4")
    assert capsys.readouterr().out == want + "\n"
    assert "512x768x3072 bfloat16->bfloat16 layout rr" in want and "chosen:     v4" in want


def test_static_checks_only_the_kernels_and_archs_asked_for(monkeypatch, capsys):
    """What `static --kernels v0 --arch sm_80` compiles (test_packaging.py runs it for real)."""
    asked = []

    def run_all(specs, archs, full, progress):
        asked.append(static_checks.plan(specs, archs, full))
        return [static_checks.CheckResult(v, {"registers": 30, "smem": 0}, {}) for v in asked[-1]]
    monkeypatch.setattr(static_checks, "run_all", run_all)
    assert cli_main.main(["static", "--kernels", "v0", "--arch", "sm_80"]) == 0
    assert {(v.spec.name, v.arch) for v in asked[0]} == {("v0", "sm_80")} and len(asked[0]) == 4
    out = capsys.readouterr().out
    kernels = registry.names(purpose=None)
    rows = [line.split()[:3] for line in out.splitlines() if line.split() and line.split()[0] in kernels]
    assert rows == [["v0", "sm_80", "4"]]
    assert "4/4 variants pass the static checks" in out
    assert cli_main.main(["static", "--kernels", "v4,v5", "--all"]) == 0
    assert {(v.spec.name, v.arch) for v in asked[1]} == {("v4", "sm_80"), ("v4", "sm_90a"), ("v5", "sm_90a")}
    assert len(asked[1]) == sum(len(static_checks.variants(registry.get(k), a, full=True))
                                for k, a in (("v4", "sm_80"), ("v4", "sm_90a"), ("v5", "sm_90a")))


def test_check_options_may_come_without_the_command(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr("deepgemm.gpu_available", lambda: (False, "no CUDA device visible to CuPy"))
    monkeypatch.setattr(cli_main, "_static", lambda args: seen.append(args) or 0)
    assert cli_main.main(["--kernels", "v0,v3", "--arch", "sm_80"]) == 0
    assert seen[0].command == "check" and seen[0].kernels == ["v0", "v3"] and seen[0].arch == ["sm_80"]
    assert "No GPU here" in capsys.readouterr().out


def test_without_a_gpu_out_says_that_no_ladder_is_written(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr("deepgemm.gpu_available", lambda: (False, "no CUDA device visible to CuPy"))
    monkeypatch.setattr(cli_main, "_static", lambda args: 0)
    assert cli_main.main(["--out", str(tmp_path / "ladder")]) == 0
    out = capsys.readouterr().out
    assert f"--out {tmp_path / 'ladder'}: no ladder is written without a GPU; the static checks" in out
    assert not (tmp_path / "ladder").exists()


def test_repository_paths_are_the_defaults_in_a_checkout():
    root = cli.repo_path()
    if root is None:
        pytest.skip("deepgemm under test is an installed package (test_packaging covers that case)")
    assert (root / "kernels").is_dir()
    parser = cli_main.build_parser()
    assert parser.parse_args(["report", "accuracy"]).out is None      # resolved to docs/accuracy when run
    assert (root / "docs" / "accuracy" / "report.md").is_file()      # where the committed report lives
    assert parser.parse_args(["regress", "history"]).regressions == root / "regressions"
    assert parser.parse_args(["regress", "compare", "run.json"]).regressions == root / "regressions"


def test_runtime_commands_import_no_test_only_package(tmp_path):
    """warm-cache builds the verification sweep's variants: its case lists must not need hypothesis
    or pytest (compiles counted, not run)."""
    code = ("import sys\n"
            "sys.modules['hypothesis'] = None; sys.modules['pytest'] = None\n"
            "from deepgemm import jit\n"
            "counted = []\n"
            "jit.compile_many = lambda jobs, workers=None, progress=None: counted.append(len(jobs))\n"
            "from deepgemm.__main__ import main\n"
            "assert main(['warm-cache', '--arch', 'sm_80', '--kernels', 'v0']) == 0\n"
            "assert main(['kernels']) == 0\n"
            "print('compiles', counted[0])\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.split("compiles")[-1]) > 8


def test_progress_prints_plain_lines_in_a_log(capsys):
    bar = cli.Progress(3, "static checks", every_s=3600)
    for done in (1, 2, 3):
        bar.update(done, f"item {done}")
    bar.close()
    lines = capsys.readouterr().err.splitlines()
    assert lines == [lines[0]] and lines[0].startswith("static checks: 3/3 after ") and "\r" not in lines[0]


def test_repo_path_only_inside_a_checkout(tmp_path, monkeypatch):
    package = tmp_path / "deepgemm"
    package.mkdir()
    monkeypatch.setattr(cli, "__file__", str(package / "cli.py"))
    assert cli.repo_path("regressions") is None                          # an installed package
    (tmp_path / "pyproject.toml").write_text("")
    assert cli.repo_path("regressions") is None                          # not ours: no kernels/
    (tmp_path / "kernels").mkdir()
    assert cli.repo_path("regressions") == tmp_path / "regressions"
    (tmp_path / "pyproject.toml").unlink()
    assert cli.repo_path() is None


def test_positive_integers_only():
    assert cli.positive_int("1") == 1 and cli.positive_int("12") == 12
    for bad in ("0", "-3", "x", "1.5", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="expected a positive integer"):
            cli.positive_int(bad)


def test_progress_in_a_log_prints_every_period_and_at_the_end(capsys, monkeypatch):
    now = [100.0]
    monkeypatch.setattr(cli.time, "monotonic", lambda: now[0])
    bar = cli.Progress(5, "tune", every_s=10.0)
    for done, t in ((1, 105.0), (2, 110.0), (3, 119.0), (4, 125.0), (5, 126.0)):
        now[0] = t
        bar.update(done, "last" if done == 4 else "")
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["tune: 2/5 after 10 s", "tune: 4/5 after 25 s  last", "tune: 5/5 after 26 s"]


def test_progress_on_a_terminal_moves_a_bar_and_closes_it_when_done(monkeypatch):
    events = []

    class FakeBar:
        def __init__(self, total, desc, **kw):
            self.n = 0
            events.append(("open", total, desc))

        def update(self, step):
            self.n += step
            events.append(("update", step))

        def set_postfix_str(self, text, refresh=True):
            events.append(("text", text))

        def close(self):
            events.append(("close",))

    class Terminal:
        def isatty(self):
            return True
    monkeypatch.setitem(sys.modules, "tqdm", types.SimpleNamespace(tqdm=FakeBar))
    bar = cli.Progress(3, "compile", stream=Terminal())
    bar.update(2, "v4")
    bar.update(3)                        # the last one closes the bar
    assert events == [("open", 3, "compile"), ("update", 2), ("text", "v4"), ("update", 1), ("close",)]
    bar.close()                          # and closing again does nothing
    assert events[-1] == ("close",) and events.count(("close",)) == 1


def test_warm_cache_without_a_gpu_needs_an_arch(capsys, monkeypatch):
    import deepgemm
    monkeypatch.setattr(deepgemm, "gpu_available", lambda: (False, "no CUDA driver"))
    err = _usage_error(["warm-cache", "--kernels", "v0"], capsys)
    assert "--arch: no GPU here to take the arch from (no CUDA driver); name one, e.g. --arch sm_90a" in err
