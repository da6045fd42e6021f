"""Every tool in scripts/ and .ci/ starts and explains itself on a machine without a GPU (`--help`,
exit 0, nothing written): a Python tool's imports at the top resolve and its arguments parse; a
shell script prints its header comment before it sets anything up. Running them for real is the
GPU tier's (tests/gpu/test_scripts_run.py)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.name for p in (ROOT / "scripts").glob("*.py"))
# What a user runs from scripts/ and .ci/ (env.sh is sourced by the others, not run).
COMMANDS = sorted(f"{d}/{p.name}" for d in ("scripts", ".ci") for p in (ROOT / d).iterdir()
                  if p.is_file() and p.name != "env.sh")


def test_there_are_scripts():
    assert "profile_host.py" in SCRIPTS and len(SCRIPTS) >= 5, SCRIPTS


def _files(root: Path) -> set:
    return {p.relative_to(root) for p in root.rglob("*")}


@pytest.mark.parametrize("script", COMMANDS)
def test_script_help(script, tmp_path):
    """Run from a copy of scripts/ and .ci/ (the shell scripts work from the folder above their
    own): whatever --help wrote would land in that copy. A script that went on to env.sh anyway
    finds DEEPGEMM_PYTHON set rather than building a .venv there."""
    for d in ("scripts", ".ci"):
        shutil.copytree(ROOT / d, tmp_path / d)
    before = _files(tmp_path)
    env = dict(os.environ, DEEPGEMM_PYTHON=sys.executable, PYTHONDONTWRITEBYTECODE="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    run = [sys.executable] if script.endswith(".py") else ["bash"]
    proc = subprocess.run(run + [str(tmp_path / script), "--help"], cwd=tmp_path, capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    if script.endswith(".py"):
        assert "usage:" in proc.stdout and len(proc.stdout.splitlines()) > 3, proc.stdout
    else:   # its usage, or its header comment from the line after #!
        header = (ROOT / script).read_text().splitlines()[1].removeprefix("# ")
        first = proc.stdout.splitlines()[0] if proc.stdout else ""
        assert (first == header or first.startswith("usage:")) and not proc.stderr, proc.stdout + proc.stderr
    assert _files(tmp_path) == before


@pytest.mark.parametrize("script,needs", [("profile_host.py", None), ("profile_torch_linear.py", "torch")])
def test_a_profiling_tool_without_a_gpu_says_so_and_exits_2(script, needs):
    if needs:
        pytest.importorskip(needs)
    # CUDA_VISIBLE_DEVICES="" hides any GPU, so this runs the same on a GPU runner.
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / script)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"{script}: needs a" in proc.stderr and "nothing was measured" in proc.stderr
    assert "Traceback" not in proc.stderr
