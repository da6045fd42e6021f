"""Proof that the quick sweep catches bugs: deliberately broken kernels, living in the test suite
only, are registered as hidden kernels and the quick sweep must fail on each of them.

  * v0_fp16_accumulate.cu      - FP16 accumulation                -> the error-bound oracle
  * v0_edge_guard_off_by_one.cu - `col > n` edge guard             -> the poisoned output's guards
  * V1 with its second __syncthreads() deleted (made from the real v1_smem.cu at test time)
                               - a missing barrier (a race)       -> wrong sums on multi-tile K
"""
from pathlib import Path

import numpy as np
import pytest

from deepgemm import jit, registry
from deepgemm.testing import sweep

BROKEN = Path(__file__).resolve().parent.parent / "broken"


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
@pytest.mark.parametrize("name,like", [("v0_fp16_accumulate", "v0"), ("v0_edge_guard_off_by_one", "v0"),
                                       ("v1_missing_barrier", "v1")])
def test_quick_sweep_catches_planted_bug(name, like, tmp_path):
    source = _v1_without_second_barrier(tmp_path) if name == "v1_missing_barrier" else BROKEN / f"{name}.cu"
    _register(name, source, like)
    try:
        caught, checked = [], 0
        for case in sweep.quick_cases(name):
            checked += 1
            try:
                sweep.run_case(case, np.random.default_rng(checked))
            except AssertionError as exc:
                caught.append(f"{case}: {str(exc).splitlines()[0][:300]}")
                if len(caught) >= 3:
                    break
        print(f"{name}: caught by {len(caught)} of the first {checked} quick cases; first: {caught[:1]}")
        assert caught, f"the quick sweep passed the broken kernel {name} ({checked} cases)"
    finally:
        registry.unregister(name)
