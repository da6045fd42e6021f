"""Naming the case a CUDA error came from.

A kernel fault (an illegal address or instruction) is sticky: the process's CUDA context is lost,
and every later CUDA call fails with the same error. Under hypothesis that includes every example
it then tries while shrinking, so the example it reports is a small one that failed only because
an earlier one broke the context. Cases are therefore run inside ``naming_case``, which prints the
case whenever it ends in an error other than an assertion; pytest shows a test's printed output
with its failure, and the first such line is the case that broke the context.
"""
import contextlib


@contextlib.contextmanager
def naming_case(case):
    """Print `case` (its repr: every field) if the block raises anything but AssertionError."""
    try:
        yield
    except AssertionError:
        raise
    except Exception as exc:
        print(f"{type(exc).__name__} in case {case!r}: {str(exc).splitlines()[0] if str(exc) else ''}", flush=True)
        raise
