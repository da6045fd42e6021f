"""--sanitize: a sample of problems per kernel under compute-sanitizer's memcheck, racecheck and
synccheck; any report fails the test (the tool's error exit code, and its summary line)."""
import os
import subprocess
import sys

import pytest

from deepgemm import registry
from deepgemm.testing.sanitize import TOOLS, find_compute_sanitizer


@pytest.mark.gpu
@pytest.mark.sanitize
@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.parametrize("kernel", registry.names())
def test_kernel_is_clean_under_compute_sanitizer(kernel, tool, selected_kernels):
    if kernel not in selected_kernels:
        pytest.skip(f"--kernels excludes {kernel}")
    sanitizer = find_compute_sanitizer()
    assert sanitizer, "compute-sanitizer not found (PATH, /usr/local/cuda/bin)"
    proc = subprocess.run([sanitizer, "--tool", tool, "--error-exitcode", "99", "--print-limit", "20",
                           sys.executable, "-m", "deepgemm.testing.sanitize", kernel],
                          capture_output=True, text=True, timeout=600, env=dict(os.environ))
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"compute-sanitizer {tool} on {kernel} (exit {proc.returncode}):\n{log[-4000:]}"
    assert "ERROR SUMMARY: 0 errors" in log or "RACECHECK SUMMARY: 0 hazards" in log, log[-2000:]
