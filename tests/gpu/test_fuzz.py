"""GPU tier: hypothesis fuzzing of the problem space (shapes, layouts, misaligned views, dtypes,
and in the full tier epilogues) for every kernel; failures shrink to the smallest failing problem.
The example budget follows --sweep (profiles in deepgemm.testing.plugin); derandomised when CI=true.
The quick tier fuzzes without epilogues: the sweep already covers each epilogue part, and every
random epilogue combination is a fresh compile."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from deepgemm import registry
from deepgemm.testing import gemm_problems, problem_is_exact
from deepgemm.testing.sweep import Case, run_case


def _fuzz(kernel, problem, seed, selected_kernels):
    if kernel not in selected_kernels:
        return
    if registry.get(kernel).supports(registry.Problem(problem.m, problem.n, problem.k, problem.dtype,
                                                      problem.out_dtype)) is not None:
        return   # outside what the kernel takes by design (small_m: M <= 64); the sweep checks the refusal
    oracle = "exact" if problem_is_exact(problem) and seed % 3 == 0 else "bound"
    assert run_case(Case(kernel, problem, oracle), np.random.default_rng(seed)) < 1.0


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", registry.names())
@given(problem=gemm_problems(max_dim=300), seed=st.integers(0, 2**32 - 1))
def test_fuzz(kernel, problem, seed, selected_kernels):
    _fuzz(kernel, problem, seed, selected_kernels)


@pytest.mark.gpu
@pytest.mark.full
@pytest.mark.parametrize("kernel", registry.names())
@settings(max_examples=30)   # each new epilogue combination is a compile: bounded, unlike the quick fuzz
@given(problem=gemm_problems(max_dim=300, with_epilogue=True), seed=st.integers(0, 2**32 - 1))
def test_fuzz_with_epilogue(kernel, problem, seed, selected_kernels):
    _fuzz(kernel, problem, seed, selected_kernels)
