"""GPU tier: the verification sweep over every registered kernel (quick tier by default,
--sweep=full for the whole size list; --kernels=v3,v4 to narrow it)."""
import zlib

import numpy as np
import pytest

from deepgemm import registry
from deepgemm.testing import sweep


def _cases(tier):
    out = []
    for name in registry.names():
        cases = sweep.quick_cases(name)
        out += [pytest.param(c, id=f"{name}-{i}-{c.oracle}") for i, c in enumerate(cases)]
        if tier:
            extra = sweep.full_cases(name)[len(cases):]
            out += [pytest.param(c, id=f"{name}-full{i}-{c.oracle}", marks=pytest.mark.full)
                    for i, c in enumerate(extra)]
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("case", _cases(tier="full"))
def test_sweep(case, selected_kernels):
    if case.kernel not in selected_kernels:
        pytest.skip(f"--kernels excludes {case.kernel}")
    # Fresh, reproducible inputs per case: the seed is derived from the case itself.
    rng = np.random.default_rng(zlib.crc32(str(case).encode()))
    margin = sweep.run_case(case, rng)
    assert margin < 1.0
