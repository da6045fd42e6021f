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
