"""The stress tier's kernel variants: timing-perturbed and pipeline-checked builds of the real
kernels, and a planted premature-release race that proves the tier can fail.

A variant is the real kernel's source with ``#define`` lines put in front (``DG_STRESS`` = a seed,
``DG_PIPE_CHECK`` = 1; see kernels/include/deepgemm/stress.cuh), optionally rewritten by a planted
bug, written to a directory of the caller's and registered as a hidden kernel that shares every
launch hook of the kernel it copies. The source is copied, not ``#include``d, so the JIT cache key
(which hashes the source file) changes whenever the real kernel does.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from deepgemm import registry

# Kernels with an asynchronous pipeline that the stress defines perturb.
STRESSED_KERNELS = ("v4", "v5")

# The planted bug: V5's consumers hand a stage back to the producer right after committing the
# wgmmas that read it, before any wgmma.wait_group covers them (the producer may then overwrite
# the operands while the tensor cores still read them).
_RELEASE_AFTER_WAIT = """            dg::wgmma_wait<1>();
            ledger.waited<1>();
            if (kb > kb_begin && threadIdx.x % 128 == 0) {
                ledger.release(prev_group);
                dg::mbar_arrive(empty(prev_stage));
            }
"""
_RELEASE_BEFORE_WAIT = """            if (threadIdx.x % 128 == 0) {   // planted bug: released before its wgmmas retire
                ledger.release(group);
                dg::mbar_arrive(empty(stage));
            }
            dg::wgmma_wait<1>();
            ledger.waited<1>();
"""
_FINAL_RELEASE = """        if (kb_end > kb_begin && threadIdx.x % 128 == 0) {
            ledger.release(prev_group);
            dg::mbar_arrive(empty(prev_stage));
        }
"""


def premature_release(source: str) -> str:
    """V5 with every stage released before the wgmmas reading it have retired (each stage still
    gets exactly one release per use, so the pipeline neither deadlocks nor stalls)."""
    for anchor in (_RELEASE_AFTER_WAIT, _FINAL_RELEASE):
        if source.count(anchor) != 1:
            raise ValueError("v5_wgmma.cu's stage release changed: update deepgemm.testing.stress")
    return source.replace(_RELEASE_AFTER_WAIT, _RELEASE_BEFORE_WAIT).replace(_FINAL_RELEASE, "")


PLANTED = {"premature_release": ("v5", premature_release)}


def variant_source(like: str, *, seed: int = 0, pipe_check: bool = False, planted: str | None = None) -> str:
    """The source text of a stress variant of kernel `like`."""
    spec = registry.get(like)
    text = spec.source.read_text()
    if planted is not None:
        if planted not in PLANTED:
            raise ValueError(f"planted: unknown planted bug {planted!r}; known: {sorted(PLANTED)}")
        kernel, rewrite = PLANTED[planted]
        if kernel != like:
            raise ValueError(f"planted: {planted!r} is a bug of kernel {kernel!r}, not {like!r}")
        text = rewrite(text)
    if seed < 0 or seed >= 2**31:
        raise ValueError(f"seed: must be in [0, 2**31), got {seed}")
    header = f"#define DG_STRESS {int(seed)}\n#define DG_PIPE_CHECK {int(bool(pipe_check))}\n"
    return header + f'#line 1 "{spec.source.name}"\n' + text


def register_variant(like: str, directory: Path, *, seed: int = 0, pipe_check: bool = False,
                     planted: str | None = None) -> str:
    """Write the variant's source under `directory`, register it as a hidden kernel with the same
    geometry, configs and launch hooks as `like`, and return its name (unregister it after)."""
    tag = "_".join(p for p in (f"s{seed}" if seed else "", "check" if pipe_check else "", planted or "") if p)
    name = f"{like}_stress_{tag or 'plain'}"
    path = Path(directory) / f"{name}.cu"
    path.write_text(variant_source(like, seed=seed, pipe_check=pipe_check, planted=planted))
    registry.register(dataclasses.replace(registry.get(like), name=name, file=str(path), public=False,
                                          summary=f"stress variant of {like}"))
    return name
