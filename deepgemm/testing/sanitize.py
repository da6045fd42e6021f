"""A sample of one kernel's sweep cases, launched under compute-sanitizer.

    compute-sanitizer --tool racecheck --error-exitcode 99 python -m deepgemm.testing.sanitize v4

tests/gpu/test_sanitize.py (pytest --sanitize) does this for every kernel and tool.
"""
from __future__ import annotations

import shutil
import sys

import numpy as np

TOOLS = ("memcheck", "racecheck", "synccheck")


def find_compute_sanitizer() -> str | None:
    for candidate in (shutil.which("compute-sanitizer"), "/usr/local/cuda/bin/compute-sanitizer",
                      "/usr/local/cuda/compute-sanitizer/compute-sanitizer"):
        if candidate and shutil.os.path.exists(candidate):
            return candidate
    return None


def first_report(log: str, lines: int = 16) -> str:
    """The first thing compute-sanitizer reported in `log` and the sample case that was running then
    (the samples print "case ..." before each case, on the stream the tool writes to): what a failure
    needs to show, since the tail of a failed run is the launch errors that follow the report. ""
    when the log holds no report."""
    out = log.splitlines()
    for i, line in enumerate(out):
        body = line[len("========="):].strip() if line.startswith("=========") else ""
        if not body or body.startswith(("COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY")):
            continue
        case = next((x for x in reversed(out[:i]) if x.startswith("case ")), "before the first case")
        block = [line]
        for x in out[i + 1:i + lines]:   # the record: its "=========   ..." lines, up to a blank one
            if not x.startswith("=========") or not x[len("========="):].strip() or "SUMMARY:" in x:
                break
            block.append(x)
        return f"first report, {case}:\n" + "\n".join(block)
    return ""


def sample_done(count: int) -> str:
    """The line a sample's main() prints after its last case. The test under compute-sanitizer
    looks for it: a child that launched nothing (no case, or main() never called) would otherwise
    pass with "0 errors"."""
    return f"sample done: {count} cases ran"


def exact_allocations() -> None:
    """Every CuPy array from its own cudaMalloc, not from CuPy's pool. memcheck knows only the
    driver's allocations: a read past an operand inside a pooled arena, where the next array lies,
    is invisible to it (seen on the H200: V0 with its row guard dropped read A's rows past M
    unflagged)."""
    import cupy
    cupy.cuda.set_allocator(None)


def sample_cases(kernel: str, count: int = 8):
    """Edge shapes, misaligned views, every layout, K = 0: a spread of the quick tier; the 16-bit
    residuals at an even N, whose C the kernels read in pairs or load into shared memory; the
    whole chain with pair-aligned operands at an odd and an even N, where a pair read at an edge
    tile's last columns would leave the bias, the scale vector or C's last row; each
    config of the quick tier's (sweep.quick_configs), once, at its own tile edges (split-K, 64-row
    tiles, ping-pong, ...); and rows padded to 16 bytes past an extent that is not, in every
    layout (sweep.aligned_cases), where a vector load past a row's end would go. main() builds
    every operand ending at its last element, so such a read leaves the allocation."""
    from deepgemm.testing import sweep
    cases = sweep.quick_cases(kernel)
    step = max(1, len(cases) // count)
    picked = cases[::step][:count]
    picked += [c for c in cases if c.problem.k == 0]   # K = 0 with the whole epilogue chain
    picked += [c for c in cases if c.problem.epilogue["residual"] == "float16" and c.problem.n % 2 == 0]
    picked += [c for c in cases if c.problem.epilogue == sweep.EPILOGUE_CASES["all"] and c.problem.k > 0]
    picked += [c for c in sweep.config_cases(kernel, sweep.quick_configs(kernel))
               if c.oracle == "exact" and c.problem.b_layout == "col"]
    picked += [c for c in sweep.aligned_cases(kernel)
               if (c.problem.lda_pad or c.problem.ldb_pad) and c.problem.dtype == "float16"]
    return picked


def main(argv=None) -> int:
    from deepgemm.testing import sweep
    kernel = (argv or sys.argv[1:])[0]
    exact_allocations()
    cases = sample_cases(kernel)
    for i, case in enumerate(cases):
        print(f"case {case}", flush=True)   # before it runs: a report names the case it came from
        # Inputs, reference and comparison on the host: under the sanitizer only deepgemm's own
        # kernels (and the poison checks) run on the device, not cuRAND's, cuBLAS's FP64 GEMM or CuPy's.
        sweep.run_case(case, np.random.default_rng(i), on_device=False, tight_end=True)
    print(sample_done(len(cases)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
