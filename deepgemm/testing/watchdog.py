"""A test that hangs fails the run instead of stalling it (the plugin's --hang-timeout).

A deadlocked kernel (a barrier that never completes, a wait on a stage nobody fills) blocks its
process in the next synchronisation, where neither Python nor pytest can interrupt it: a GPU CI job
would sit until the runner's own limit, hours later, and then say nothing about which test hung.
So each test runs under a timer. When it fires, the process prints which test ran for how long and
every thread's Python stack, and exits at once (os._exit: a thread stuck in the driver cannot be
unwound). The driver tears the context down with the process, which stops the kernel. Under xdist
the worker's exit reports that test as failed ("worker crashed while running ...") and a fresh
worker carries on with the rest; without xdist the run ends there with a failure status. A test
stopped at a debugger prompt is left alone.
"""
from __future__ import annotations

import faulthandler
import os
import sys
import threading
from typing import Callable

# Seconds a test (setup, call and teardown) may take before it counts as hung. Far above any
# test's time: the whole quick GPU tier takes about two minutes on one H200 from a cold cache,
# the CPU tier's slowest test well under a minute. Tests that run slow tools in a child process
# with their own limit (compute-sanitizer) set a longer one with @pytest.mark.hang_timeout(s).
DEFAULT_HANG_TIMEOUT_S = 300.0

EXIT_STATUS = 1   # pytest's "tests failed": a hang is a failing test


def hang_message(nodeid: str, seconds: float) -> str:
    return (f"\ndeepgemm: {nodeid} has run for {seconds:g} s (--hang-timeout): a hang, e.g. a kernel that "
            f"never finishes (a deadlocked barrier or pipeline wait). Stopping this process; every thread's "
            f"Python stack follows.\n")


# Modules whose frames on the test's stack mean a person is at a debugger prompt (pytest --pdb,
# breakpoint(), an IDE's debugger): time spent there is not a hang.
DEBUGGERS = frozenset({"bdb", "pdb", "pydevd", "debugpy", "ipdb"})


def in_debugger(frame) -> bool:
    """Whether `frame` (a thread's innermost frame) or a caller of it runs a debugger's code."""
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).split(".")[0] in DEBUGGERS:
            return True
        frame = frame.f_back
    return False


def main_thread_in_debugger() -> bool:
    return in_debugger(sys._current_frames().get(threading.main_thread().ident))


def stop_process(message: str, fd: int = 2, exit_status: int = EXIT_STATUS) -> None:
    """Write `message` and every thread's stack to file descriptor `fd`, then exit at once."""
    try:
        os.write(fd, message.encode())
        faulthandler.dump_traceback(file=fd, all_threads=True)
    finally:
        os._exit(exit_status)


class Watchdog:
    """One timer at a time: arm(seconds, what) before a test, disarm() after it. When a timer
    runs out, on_hang(what, seconds) is called on the timer's thread."""

    def __init__(self, on_hang: Callable[[str, float], None]):
        self._on_hang = on_hang
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def arm(self, seconds: float, what: str) -> None:
        self.disarm()
        if seconds and seconds > 0:
            timer = threading.Timer(seconds, self._on_hang, args=(what, seconds))
            timer.daemon = True   # never keeps a finished run alive
            with self._lock:
                self._timer = timer
            timer.start()

    def disarm(self) -> None:
        with self._lock:
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
