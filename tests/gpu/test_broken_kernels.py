"""Proof that the quick sweep catches bugs: deliberately broken kernels, living in the test suite
only, are registered as hidden kernels and the quick sweep must fail on each of them.

  * v0_fp16_accumulate.cu      - FP16 accumulation                -> the error-bound oracle
  * v0_edge_guard_off_by_one.cu - `col > n` edge guard             -> the poisoned output's guards
  * V1 with its second __syncthreads() deleted (made from the real v1_smem.cu at test time)
                               - a missing barrier (a race)       -> wrong sums on multi-tile K

Each runs the quick cases its kind of bug fails first (sweep.self_test_order: a few launches of
real quick cases through the same oracles), then, only if all of those pass, the rest of the quick
sweep in order. Walking the sweep from its start took a minute for the race, which small cases
never show, and compiled dozens of variants of each broken kernel on a cold cache.
"""
import warnings
from pathlib import Path

import numpy as np
import pytest

from deepgemm import jit, registry
from deepgemm.testing import sweep

BROKEN = Path(__file__).resolve().parent.parent / "broken"
PLANTED = [  # name, the kernel it is made from, the kind of bug (sweep.FIRST_TO_FAIL)
    ("v0_fp16_accumulate", "v0", "accumulation"),
    ("v0_edge_guard_off_by_one", "v0", "store"),
    ("v1_missing_barrier", "v1", "race"),
]


def _v1_without_second_barrier(tmp_path: Path) -> Path:
    src = (jit.KERNEL_DIR / "v1_smem.cu").read_text()
    lines = src.splitlines()
    second = [i for i, line in enumerate(lines) if "__syncthreads();   // everyone done reading" in line]
    assert len(second) == 1, "v1_smem.cu changed: update the planted missing-barrier bug"
    lines[second[0]] = "        // __syncthreads() removed on purpose: the next tile's loads race with these reads"
    out = tmp_path / "v1_missing_barrier.cu"
    out.write_text("\n".join(lines) + "\n")
    return out


def _register(name: str, source: Path, like: str) -> None:
    base = registry.get(like)
    registry.register(registry.KernelSpec(
        name=name, file=str(source), summary="broken on purpose", min_cc=base.min_cc, tile=base.tile,
        block=base.block, default_config=dict(base.default_config), public=False))


@pytest.mark.gpu
@pytest.mark.parametrize("name,like,kind", PLANTED)
def test_quick_sweep_catches_planted_bug(name, like, kind, tmp_path):
    source = _v1_without_second_barrier(tmp_path) if name == "v1_missing_barrier" else BROKEN / f"{name}.cu"
    _register(name, source, like)
    try:
        first, rest = sweep.self_test_order(sweep.quick_cases(name), kind)
        for tried, case in enumerate(first + rest, start=1):
            try:
                sweep.run_case(case, np.random.default_rng(tried))
            except AssertionError as exc:
                caught = f"{case}: {str(exc).splitlines()[0][:300]}"
                break
        else:
            pytest.fail(f"the quick sweep passed the broken kernel {name} ({len(first)} first-tried cases, then "
                        f"all {len(rest)} others)")
        print(f"{name}: caught by quick case {tried} of {len(first) + len(rest)} tried in this order: {caught}")
        if tried > len(first):
            # Still a pass (the sweep catches the bug), but the fast path missed: worth a look.
            warnings.warn(f"{name}: none of the {len(first)} cases sweep.FIRST_TO_FAIL[{kind!r}] picks failed; "
                          f"the fallback's case {tried - len(first)} did ({caught})")
    finally:
        registry.unregister(name)
