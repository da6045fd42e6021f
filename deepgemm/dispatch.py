"""Which kernel and config run a given problem: the one place that holds selection heuristics.

A named kernel is validated here (exists, runs on this GPU); "auto" picks the best kernel the
registry has for the device. Shape-bucketed, tuned choices (issue 5) plug in here too.
"""
from __future__ import annotations

from deepgemm import registry

# Fastest first: the first registered, public kernel that runs on the device wins "auto".
AUTO_PREFERENCE = ("v5", "v4", "v3", "v2", "v1", "v0")


def choose(m, n, k, in_dtype, out_dtype, a, b, epilogue, cc, *, kernel="auto", config=None):
    """Return (KernelSpec, config dict) for the problem; raise ValueError naming `kernel` if impossible."""
    if kernel == "auto":
        for name in AUTO_PREFERENCE:
            if name in registry.names() and registry.get(name).min_cc <= cc:
                spec = registry.get(name)
                break
        else:
            raise ValueError(f"kernel: no registered kernel runs on compute capability {cc / 10:.1f}")
        if config is not None:
            raise ValueError("config: only meaningful with a named kernel (kernel='auto' picks its own)")
    else:
        if not isinstance(kernel, str):
            raise TypeError(f"kernel: expected a kernel name or 'auto', got {type(kernel).__name__}")
        spec = registry.get(kernel)
        if spec.min_cc > cc:
            raise ValueError(f"kernel: {kernel!r} needs compute capability >= {spec.min_cc / 10:.1f}, "
                             f"this GPU has {cc / 10:.1f}")
    return spec, spec.config_defines(config)


def explain(m, n, k, in_dtype="float16", cc=90, **kw) -> str:
    """A one-line account of what "auto" would run for this problem and why."""
    spec, cfg = choose(m, n, k, in_dtype, in_dtype, None, None, None, cc, **kw)
    return (f"{m}x{n}x{k} {in_dtype} on sm_{cc}: {spec.name} ({spec.summary}) with {cfg}: "
            f"the fastest registered kernel for this compute capability")
