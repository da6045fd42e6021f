"""What the commands of `python -m deepgemm` share: argument types that name the valid choices,
the repository's folders (defaults for commands that read or write them), usage errors, and the
progress display of long commands.

Each command module provides ``add_arguments(parser)`` (its options, on its own subparser) and
``run(args) -> int`` (its exit status); deepgemm/__main__.py puts them under one parser. A ``run``
raises UsageError for bad input that argparse alone cannot see (a filter that selects nothing);
the parser turns it into the command's usage message and exit status 2.
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path


class UsageError(ValueError):
    """Bad command-line input found after parsing; the message names the option and what is valid."""


def repo_path(*parts: str) -> Path | None:
    """A path inside the repository when deepgemm runs from a source checkout (or an editable
    install), else None: an installed package has no repository around it."""
    root = Path(__file__).resolve().parent.parent
    if not ((root / "pyproject.toml").is_file() and (root / "kernels").is_dir()):
        return None
    return root.joinpath(*parts)


def comma_list(valid, what: str):
    """An argparse type: a comma-separated subset of `valid` (use with action="extend", so the
    option may also be repeated); anything else is an error naming the valid choices."""
    def parse(text: str) -> list[str]:
        choices = list(valid() if callable(valid) else valid)
        items = [t.strip() for t in text.split(",") if t.strip()]
        unknown = [t for t in items if t not in choices]
        if not items or unknown:
            got = f"unknown {what} {', '.join(map(repr, unknown))}" if unknown else f"no {what} given"
            raise argparse.ArgumentTypeError(f"{got}; valid: {', '.join(choices)}")
        return list(dict.fromkeys(items))
    return parse


def kernel_names(purpose: str | None = "gemm"):
    """--kernels: registered public kernels of one purpose (registry.names)."""
    from deepgemm import registry
    return comma_list(lambda: registry.names(purpose=purpose), "kernel(s)")


def cuda_archs(text: str) -> list[str]:
    """--arch for compiling: exact CUDA targets such as sm_80 or sm_90a (comma-separated)."""
    archs = [t.strip() for t in text.split(",") if t.strip()]
    bad = [a for a in archs if not re.fullmatch(r"sm_\d{2,3}a?", a)]
    if not archs or bad:
        raise argparse.ArgumentTypeError(f"{', '.join(map(repr, bad)) or 'nothing'} given; expected CUDA "
                                         f"targets such as sm_80 or sm_90a (comma-separated)")
    return archs


def regex(text: str) -> str:
    """A regular expression, checked when parsed (the value stays the text)."""
    try:
        re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a valid regular expression: {exc}") from None
    return text


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


class Progress:
    """Progress of a long job: a tqdm bar on a terminal; in a log (CI, a pipe) a plain line at most
    every `every_s` seconds and one at the end, so the log stays readable."""

    def __init__(self, total: int, desc: str, stream=None, every_s: float = 15.0):
        self.total, self.desc, self.every_s = total, desc, every_s
        self.stream = stream or sys.stderr
        self.start = self.last = time.monotonic()
        self.bar = None
        if self.stream.isatty():
            from tqdm import tqdm
            self.bar = tqdm(total=total, desc=desc, file=self.stream, dynamic_ncols=True, leave=True)

    def update(self, done: int, text: str = "") -> None:
        """`done` of `total` finished; `text` says what finished last."""
        if self.bar is not None:
            self.bar.update(done - self.bar.n)
            if text:
                self.bar.set_postfix_str(text, refresh=False)
            if done >= self.total:
                self.close()
            return
        now = time.monotonic()
        if done >= self.total or now - self.last >= self.every_s:
            self.last = now
            print(f"{self.desc}: {done}/{self.total} after {now - self.start:.0f} s" + (f"  {text}" if text else ""),
                  file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
