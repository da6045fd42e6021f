"""deepgemm.testing: helpers to verify a GEMM (deepgemm's or your own) from your own pytest suite.

Three oracles, one input generator, one output guard::

    import numpy as np, cupy
    from hypothesis import given, settings
    from deepgemm.testing import (assert_gemm_close, assert_bitwise_equal, gemm_problems,
                                  make_inputs, poisoned_output, problem_is_exact, round_to,
                                  reference_gemm)

    @settings(max_examples=200, deadline=None)
    @given(problem=gemm_problems(max_dim=300, with_epilogue=True))
    def test_my_gemm(problem):
        inputs = make_inputs(problem, np.random.default_rng(0), xp=cupy)   # strided, offset views
        out = my_gemm(inputs.a, inputs.b, out_dtype=problem.out_dtype, **inputs.epilogue_kwargs)
        # Every element within a rigorous forward error bound of the float64 reference.
        # accumulate="fp32_tc" for tensor-core kernels (truncating fp32 accumulation).
        assert_gemm_close(out, a=inputs.a, b=inputs.b, accumulate="fp32_tc", **inputs.epilogue_kwargs)

    def test_my_gemm_exact():                 # small-integer inputs: the sum is exact in any order
        problem = ...                         # a GemmProblem; problem_is_exact(problem) must hold
        inputs = make_inputs(problem, np.random.default_rng(1), xp=cupy, integer=True)
        out = my_gemm(inputs.a, inputs.b, out_dtype=problem.out_dtype, **inputs.epilogue_kwargs)
        expected = round_to(reference_gemm(inputs.a, inputs.b, **inputs.epilogue_kwargs), problem.out_dtype)
        assert_bitwise_equal(out, expected)

    def test_writes_exactly_the_output():
        out = poisoned_output((m, n), "bfloat16", xp=cupy, ld=n + 8)
        my_gemm(a, b, out=out.view)
        out.check()                           # no store outside the view (guards before/after/padding)
        out.assert_all_written()              # no element of the view left unwritten

``assert_gemm_close`` returns the margin (max error/bound; a correct kernel stays below 1) and on
failure names the count of violating elements and the worst one. The bound and its sources are
documented in ``deepgemm.testing.bounds``. Inputs may be NumPy, CuPy or torch arrays; with a CuPy
output (and operands) the reference, the bound and the comparison run on the GPU and only the
verdict comes back (``xp=numpy`` forces the host).
The hypothesis strategies (``gemm_problems``, ``GemmProblem``, ``make_inputs``, ...) are imported
on first use, so the rest of this package works without hypothesis installed.
"""
from ..reference import ACTIVATIONS, reference_gemm, round_to
from .bounds import (assert_bitwise_equal, assert_gemm_close, gamma, gemm_error_bound, integer_inputs,
                     unit_roundoff)
from .poison import PoisonedOutput, poisoned_output

_STRATEGY_NAMES = ("GemmProblem", "GemmInputs", "gemm_problems", "epilogues", "dims", "make_inputs",
                   "problem_is_exact", "strided_matrix")

__all__ = ["ACTIVATIONS", "reference_gemm", "round_to", "assert_bitwise_equal", "assert_gemm_close", "gamma",
           "gemm_error_bound", "integer_inputs", "unit_roundoff", "PoisonedOutput", "poisoned_output",
           *_STRATEGY_NAMES]


def __getattr__(name):
    # hypothesis is a test-only dependency: load the strategies module only when asked for.
    if name in _STRATEGY_NAMES:
        from . import strategies
        return getattr(strategies, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
