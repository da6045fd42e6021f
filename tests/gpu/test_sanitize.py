"""--sanitize: a sample of problems per kernel (and per grouped build) under compute-sanitizer's memcheck, racecheck and
synccheck; any report fails the test (the tool's error exit code, and its summary line)."""
import os
import subprocess
import sys

import pytest

from deepgemm import registry
from deepgemm.testing import grouped
from deepgemm.testing.sanitize import TOOLS, find_compute_sanitizer, first_report, sample_cases, sample_done


def _sanitized(tool: str, module: str, kernel: str, cases: list) -> None:
    """compute-sanitizer `tool` over `python -m module kernel`, which must run all of `cases`."""
    assert cases, f"no sample cases for {kernel}"
    sanitizer = find_compute_sanitizer()
    assert sanitizer, "compute-sanitizer not found (PATH, /usr/local/cuda/bin)"
    proc = subprocess.run([sanitizer, "--tool", tool, "--error-exitcode", "99", "--print-limit", "20",
                           sys.executable, "-m", module, kernel],
                          capture_output=True, text=True, timeout=600, env=dict(os.environ))
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, (f"compute-sanitizer {tool} on {kernel} (exit {proc.returncode}):\n"
                                  f"{first_report(log)}\n---- the run's last lines ----\n{log[-2000:]}")
    assert "ERROR SUMMARY: 0 errors" in log or "RACECHECK SUMMARY: 0 hazards" in log, log[-2000:]
    assert sample_done(len(cases)) in proc.stdout, f"the sample did not run to its end:\n{log[-2000:]}"


# compute-sanitizer runs in a child with its own 600 s limit, which names the tool and kernel.
LONGER_THAN_THE_CHILD = pytest.mark.hang_timeout(900)


@pytest.mark.gpu
@pytest.mark.sanitize
@LONGER_THAN_THE_CHILD
@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.parametrize("kernel", registry.names())
def test_kernel_is_clean_under_compute_sanitizer(kernel, tool, selected_kernels):
    if kernel not in selected_kernels:
        pytest.skip(f"--kernels excludes {kernel}")
    _sanitized(tool, "deepgemm.testing.sanitize", kernel, sample_cases(kernel))


@pytest.mark.gpu
@pytest.mark.sanitize
@LONGER_THAN_THE_CHILD
@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.parametrize("kernel", [s.name for s in registry.specs() if s.grouped])
def test_grouped_build_is_clean_under_compute_sanitizer(kernel, tool, selected_kernels):
    """A sample of batched/grouped cases (each mode, tile edges, the buffer's end)."""
    if kernel not in selected_kernels:
        pytest.skip(f"--kernels excludes {kernel}")
    _sanitized(tool, "deepgemm.testing.grouped", kernel, grouped.sample(kernel))
