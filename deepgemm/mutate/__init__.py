"""Mutation testing for CUDA kernels: `python -m deepgemm mutate` (see deepgemm/mutate/cli.py and
docs/verification.md, "Mutation testing").

  operators.py      the mutation operators and site ids
  runner.py         the work copy, the compile step (child.py), the test run, the outcomes
  report.py         the reviewed equivalents list (equivalents.json), the Markdown/JSON report
  cli.py            the command line

Importing this package is cheap (the command's modules load when it runs), so a user's test code
can call `mutant_source` on every run.
"""
from __future__ import annotations

import os
from pathlib import Path


def mutant_source(path) -> Path:
    """The file to compile for the kernel source `path`: while `python -m deepgemm mutate --source
    path` runs your tests, the current mutant of it (DEEPGEMM_MUTANT_SOURCE); otherwise `path`.

    Register or load your kernel through it, e.g.
    ``registry.register(KernelSpec(name="mine", file=str(mutant_source(HERE / "mine.cu")), ...))``."""
    original = os.environ.get("DEEPGEMM_MUTANT_ORIGINAL")
    mutant = os.environ.get("DEEPGEMM_MUTANT_SOURCE")
    if original and mutant and Path(path).resolve() == Path(original).resolve():
        return Path(mutant)
    return Path(path)


def add_arguments(parser) -> None:
    """The `mutate` command's options (for `python -m deepgemm`'s parser)."""
    from deepgemm.mutate import cli
    cli.add_arguments(parser)


def run(args) -> int:
    """Run the `mutate` command with parsed arguments; returns the exit status."""
    from deepgemm.mutate import cli
    return cli.run(args)


__all__ = ["mutant_source", "add_arguments", "run"]
