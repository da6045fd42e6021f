"""The stress tier (`pytest --stress`): asynchronous-pipeline races get other timings to show in.

V4 and V5 are rebuilt with pseudo-random pauses at every pipeline hand-over (DG_STRESS = the
run's seed, printed in the header; `--stress-seed` repeats a run) and V5 also with its stage-release
ledger (DG_PIPE_CHECK), then run long-K integer-exact problems many times while another stream
keeps the GPU busy, each result compared bit for bit with the exact product. The last test plants
premature stage releases in V5 and must see each fail, so the tier is known to be able to fail.
"""
import numpy as np
import pytest

import deepgemm
from deepgemm import registry
from deepgemm.testing import stress

cupy = pytest.importorskip("cupy")
pytestmark = [pytest.mark.gpu, pytest.mark.stress]

# Long K (hundreds of k-blocks through the ring), several tiles, tails in M and N; integers in
# [-3, 3] keep every partial sum exact in FP32 (|sum| <= 9 * K < 2**24).
SHAPES = [(256, 512, 16384), (200, 300, 8200), (1024, 768, 4096)]
LAYOUTS = ["rc", "rr"]


def _exact_problem(m, n, k, layout, rng):
    a = cupy.asarray(rng.integers(-3, 4, size=(m, k)).astype(np.float16))
    b = cupy.asarray(rng.integers(-3, 4, size=(k, n)).astype(np.float16))
    ref = a.astype(cupy.float64) @ b.astype(cupy.float64)      # exact: small integers
    if layout[1] == "c":
        b = cupy.asfortranarray(b)
    return a, b, ref.astype(cupy.float32)


class _CoRunner:
    """Keeps the GPU busy from another stream while the kernel under test runs."""

    def __init__(self):
        self.stream = cupy.cuda.Stream(non_blocking=True)
        with self.stream:
            self.x = cupy.random.standard_normal((2048, 2048), dtype=cupy.float32)

    def load(self, launches=8):
        with self.stream:
            for _ in range(launches):
                self.x = self.x @ self.x * 1e-3


def _skip_unless_this_gpu_runs(like):
    cc = int(cupy.cuda.Device().compute_capability)
    if cc < registry.get(like).min_cc:
        pytest.skip(f"{like} needs compute capability {registry.get(like).min_cc / 10:.1f}")


# V5's ping-pong consumers take turns only where a block walks two or more tiles: 324 tiles of
# 128 x 128 over at most 132 blocks.
PING_PONG = {"DG_BN": 128, "DG_STAGES": 5, "DG_PINGPONG": 1}
PING_PONG_SHAPES = [(2304, 2304, 2048), (2200, 2300, 1100)]


def _mismatches(name, shapes, layouts, reps, co_runner, rng, config=None) -> list[str]:
    bad = []
    for m, n, k in shapes:
        for layout in layouts:
            a, b, ref = _exact_problem(m, n, k, layout, rng)
            for rep in range(reps):
                co_runner.load()
                out = deepgemm.gemm(a, b, kernel=name, config=config, out_dtype="float32")
                if not bool(cupy.array_equal(out, ref)):
                    wrong = int((out != ref).sum())
                    bad.append(f"{m}x{n}x{k} {layout} rep {rep}: {wrong} of {m * n} elements differ")
                    break
    return bad


@pytest.fixture(scope="module")
def co_runner():
    return _CoRunner()


@pytest.mark.parametrize("like", stress.STRESSED_KERNELS)
def test_long_k_is_bitwise_exact_under_perturbed_timing(like, tmp_path, stress_seed, stress_reps, co_runner):
    _skip_unless_this_gpu_runs(like)
    name = stress.register_variant(like, tmp_path, seed=stress_seed, pipe_check=like == "v5")
    try:
        bad = _mismatches(name, SHAPES, LAYOUTS, stress_reps, co_runner, np.random.default_rng(stress_seed))
    finally:
        registry.unregister(name)
        cupy.cuda.Device().synchronize()
    assert not bad, f"{like} with DG_STRESS={stress_seed}:\n" + "\n".join(bad)


def test_ping_pong_turns_are_bitwise_exact_under_perturbed_timing(tmp_path, stress_seed, stress_reps, co_runner):
    """The ping-pong consumers' turn-taking (the order barriers and the ring positions each skips)
    under the same pauses and the release ledger, with many tiles per block."""
    _skip_unless_this_gpu_runs("v5")
    assert registry.get("v5").config_defines(PING_PONG) in [registry.get("v5").config_defines(c)
                                                            for c in registry.get("v5").config_space]
    name = stress.register_variant("v5", tmp_path, seed=stress_seed, pipe_check=True)
    try:
        bad = _mismatches(name, PING_PONG_SHAPES, LAYOUTS, max(1, stress_reps // 4), co_runner,
                          np.random.default_rng(stress_seed), config=PING_PONG)
    finally:
        registry.unregister(name)
        cupy.cuda.Device().synchronize()
    assert not bad, f"v5 ping-pong with DG_STRESS={stress_seed}:\n" + "\n".join(bad)


@pytest.mark.parametrize("planted", sorted(stress.PLANTED))
def test_the_tier_kills_a_premature_stage_release(planted, tmp_path, stress_seed, stress_reps, co_runner):
    """A stage handed back before its wgmmas retire: the release ledger must flag it on every run.
    The same bug is also run with timing perturbation alone and with neither, and the outcome is
    reported: those need luck, which is why the ledger exists."""
    _skip_unless_this_gpu_runs("v5")
    checked = stress.register_variant("v5", tmp_path, seed=stress_seed, pipe_check=True, planted=planted)
    timing_only = stress.register_variant("v5", tmp_path, seed=stress_seed, planted=planted)
    plain = stress.register_variant("v5", tmp_path, planted=planted)
    rng = np.random.default_rng(stress_seed)
    try:
        caught_by_ledger = _mismatches(checked, SHAPES[:1], LAYOUTS[:1], 1, co_runner, rng)
        caught = {label: _mismatches(name, SHAPES, LAYOUTS, stress_reps, co_runner, rng)
                  for label, name in (("timing alone", timing_only), ("neither", plain))}
    finally:
        for name in (checked, timing_only, plain):
            registry.unregister(name)
        cupy.cuda.Device().synchronize()
    print(f"{planted} (seed {stress_seed}): ledger {'caught it' if caught_by_ledger else 'missed it'}; "
          + "; ".join(f"{label}: {bad[0] if bad else 'passed'}" for label, bad in caught.items()))
    assert caught_by_ledger, f"DG_PIPE_CHECK did not flag {planted}"
