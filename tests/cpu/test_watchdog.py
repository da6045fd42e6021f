"""--hang-timeout (deepgemm.testing.watchdog): a test that runs past its limit stops its process with
the test's name and every thread's stack, failing the run, with and without xdist; a test's own
hang_timeout marker wins; the mutation campaign keeps its own limits instead."""
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from deepgemm.mutate import runner
from deepgemm.testing import watchdog
from test_plugin import run_with_plugin

REPO = Path(__file__).resolve().parents[2]

HANGING = '''
import time
import pytest

def test_before():
    pass

def test_hangs():
    time.sleep(120)

@pytest.mark.hang_timeout(0)
def test_slow_but_exempt():
    time.sleep(3)

def test_after():
    pass
'''


def run_pytest(tmp_path, *extra):
    (tmp_path / "test_hang.py").write_text(HANGING)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "test_hang.py", "-q", "-p", "no:cacheprovider",
                           "-o", "addopts=", "-p", "deepgemm.testing.plugin", "--hang-timeout", "2", *extra],
                          cwd=tmp_path, capture_output=True, text=True, timeout=110)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started


def test_a_hung_test_stops_the_run_with_its_name_and_the_stacks(tmp_path):
    rc, out, seconds = run_pytest(tmp_path)
    assert rc == watchdog.EXIT_STATUS == 1 and seconds < 60, out
    assert "deepgemm: test_hang.py::test_hangs has run for 2 s (--hang-timeout): a hang" in out
    assert 'File "' in out and "test_hang.py\", line 9 in test_hangs" in out     # where it was stuck


def test_under_xdist_the_hung_test_fails_and_the_others_run(tmp_path):
    pytest.importorskip("xdist")
    rc, out, seconds = run_pytest(tmp_path, "-n", "2")
    assert rc == 1 and seconds < 60, out
    assert "crashed while running 'test_hang.py::test_hangs'" in out
    assert "1 failed, 3 passed" in out, out                                       # the exempt 3 s test too


def test_the_limit_ends_with_its_test_so_a_slow_end_of_session_is_no_hang(tmp_path):
    (tmp_path / "conftest.py").write_text("import time\n\n\ndef pytest_sessionfinish(session):\n    time.sleep(3)\n")
    (tmp_path / "test_quick.py").write_text("def test_quick():\n    pass\n")
    proc = run_with_plugin(tmp_path, "test_quick.py", "-q", "--hang-timeout", "1")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "a hang" not in out, out


def test_the_timer_fires_once_per_arming_and_never_after_disarm():
    fired, event = [], threading.Event()

    def on_hang(what, seconds):
        fired.append((what, seconds))
        event.set()
    dog = watchdog.Watchdog(on_hang)
    dog.arm(0.2, "a")
    dog.disarm()
    dog.arm(0.05, "b")
    dog.arm(0.1, "c")            # re-arming replaces the running timer
    assert event.wait(5)
    time.sleep(0.3)
    assert fired == [("c", 0.1)]
    dog.arm(0, "never")          # 0: no timer
    dog.arm(None, "never")
    time.sleep(0.1)
    assert fired == [("c", 0.1)]


def test_the_message_names_the_test_and_the_limit():
    text = watchdog.hang_message("tests/gpu/test_v5.py::test_x[1]", 300.0)
    assert "tests/gpu/test_v5.py::test_x[1] has run for 300 s (--hang-timeout)" in text


def test_a_mutants_tests_leave_hangs_to_the_campaigns_own_limits():
    assert "--hang-timeout=0" in runner.builtin_tier_command(REPO)
    assert "--hang-timeout=0" in runner.builtin_sanitize_command(REPO)


def test_a_test_at_a_debugger_prompt_is_not_a_hang():
    seen = {}
    debugger = {"__name__": "pdb", "capture": lambda: seen.setdefault("frame", sys._getframe())}
    exec("def interaction():\n    return capture()\n", debugger)
    debugger["interaction"]()
    assert watchdog.in_debugger(seen["frame"])                       # called from pdb's code
    assert not watchdog.in_debugger(sys._getframe())                 # an ordinary test frame
    assert not watchdog.main_thread_in_debugger()


def test_breakpoint_holds_the_timer_off(tmp_path):
    """A test stopped in pdb (here fed commands on stdin) outlives --hang-timeout and still passes."""
    (tmp_path / "test_debug.py").write_text("def test_stepped():\n    breakpoint()\n    x = 1\n")
    proc = subprocess.run([sys.executable, "-c",
                           "import sys, time, pytest\n"
                           "class SlowStdin:\n"
                           "    def __init__(self): self.lines = ['p 1\\n', 'c\\n']\n"
                           "    def readline(self):\n"
                           "        time.sleep(1.5); return self.lines.pop(0) if self.lines else ''\n"
                           "sys.stdin = SlowStdin()\n"
                           "sys.exit(pytest.main(['test_debug.py', '-q', '-s', '-p', 'no:cacheprovider', '-o', 'addopts=',"
                           " '-p', 'deepgemm.testing.plugin', '--hang-timeout', '1']))\n"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "1 passed" in out and "has run for" not in out, out
