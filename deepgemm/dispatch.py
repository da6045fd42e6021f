"""Which kernel and config run a given problem: the one place that holds selection heuristics.

A named kernel is validated here (exists, runs on this GPU, takes these inputs, accumulates as
asked); "auto" picks the best kernel the registry has for the device. Shape-bucketed, tuned
choices (issue 5) plug in here too.

accumulate="fp32" (the default) is the ladder: purpose "gemm" kernels only. accumulate="fp16"
selects the accuracy report's FP16-accumulating variants (registry purpose "report"): "auto"
means fp16acc_mma, which takes fp16 inputs only; fp16acc_simt must be named (with bf16 inputs it
accumulates in bf16, the 16-bit format of its inputs).
"""
from __future__ import annotations

from deepgemm import registry

# Fastest first: the first registered, public kernel that runs on the device wins "auto".
AUTO_PREFERENCE = ("v5", "v4", "v3", "v2", "v1", "v0")
ACCUMULATE = ("fp32", "fp16")
# kernel="auto" with accumulate="fp16": the tensor-core variant (what the accuracy report measures).
FP16_AUTO = "fp16acc_mma"


def check_accumulate(accumulate) -> str:
    if accumulate not in ACCUMULATE:
        raise ValueError(f"accumulate: must be one of {ACCUMULATE}, got {accumulate!r}")
    return accumulate


def choose(problem: registry.Problem, *, kernel="auto", config=None, accumulate="fp32"):
    """Return (KernelSpec, config dict) for the problem; raise ValueError/TypeError naming `kernel`
    or `accumulate` if impossible."""
    check_accumulate(accumulate)
    in_dtype, cc = problem.in_dtype, problem.cc
    if kernel == "auto" and config is not None:
        raise ValueError("config: only meaningful with a named kernel (kernel='auto' picks its own)")
    if kernel == "auto" and accumulate == "fp16":
        spec = registry.get(FP16_AUTO)
        if in_dtype not in spec.input_dtypes:
            raise TypeError(f"accumulate: 'fp16' with {in_dtype} inputs: {FP16_AUTO} takes "
                            f"{'/'.join(spec.input_dtypes)} only (there is no bf16 mma with an f16 "
                            f"accumulator); kernel='fp16acc_simt' accumulates {in_dtype} inputs in "
                            f"{in_dtype} on CUDA cores")
        if spec.min_cc > cc:
            raise ValueError(f"accumulate: 'fp16' needs compute capability >= {spec.min_cc / 10:.1f} "
                             f"({FP16_AUTO}), this GPU has {cc / 10:.1f}")
    elif kernel == "auto":
        for name in AUTO_PREFERENCE:
            if name in registry.names() and registry.get(name).min_cc <= cc \
                    and registry.get(name).supports(problem) is None:
                spec = registry.get(name)
                break
        else:
            raise ValueError(f"kernel: no registered kernel runs on compute capability {cc / 10:.1f}")
    else:
        if not isinstance(kernel, str):
            raise TypeError(f"kernel: expected a kernel name or 'auto', got {type(kernel).__name__}")
        spec = registry.get(kernel)
        if spec.accumulation != accumulate:
            raise ValueError(f"accumulate: kernel {kernel!r} accumulates in {spec.accumulation}, but "
                             f"accumulate={accumulate!r}; pass accumulate={spec.accumulation!r} to run it")
        if in_dtype is not None and in_dtype not in spec.input_dtypes:
            raise TypeError(f"kernel: {kernel!r} takes {'/'.join(spec.input_dtypes)} inputs only, got "
                            f"{in_dtype}" + (" (there is no bf16 mma with an f16 accumulator)"
                                             if spec.accumulation == "fp16" else ""))
        if spec.min_cc > cc:
            raise ValueError(f"kernel: {kernel!r} needs compute capability >= {spec.min_cc / 10:.1f}, "
                             f"this GPU has {cc / 10:.1f}")
        reason = spec.supports(problem)
        if reason is not None:
            raise ValueError(f"kernel: {kernel!r} cannot run this problem: {reason}")
    return spec, spec.config_defines(config)


def explain(m, n, k, in_dtype="float16", cc=90, **kw) -> str:
    """A one-line account of what "auto" would run for this problem and why."""
    spec, cfg = choose(registry.Problem(m, n, k, in_dtype, in_dtype, cc=cc), **kw)
    why = ("the FP16-accumulating variant of the accuracy report" if spec.purpose == "report"
           else "the fastest registered kernel for this compute capability")
    return f"{m}x{n}x{k} {in_dtype} on sm_{cc}: {spec.name} ({spec.summary}) with {cfg}: {why}"
