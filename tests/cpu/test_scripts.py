"""Every tool in scripts/ starts and explains itself on a machine without a GPU (`--help`): its
imports at the top resolve, and its arguments parse. Running them for real is the GPU tier's
(tests/gpu/test_scripts_run.py)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.name for p in (ROOT / "scripts").glob("*.py"))


def test_there_are_scripts():
    assert "profile_host.py" in SCRIPTS and len(SCRIPTS) >= 5, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_help(script):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / script), "--help"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "usage:" in proc.stdout and len(proc.stdout.splitlines()) > 3, proc.stdout


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
