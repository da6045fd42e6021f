"""The stress tier (`pytest --stress`): asynchronous-pipeline races get other timings to show in.

V4 and V5 are rebuilt with pseudo-random pauses at every pipeline hand-over (DG_STRESS = the
run's seed, printed in the header; `--stress-seed` repeats a run) and V5 also with its stage-release
ledger (DG_PIPE_CHECK), then run long-K integer-exact problems many times while another stream
keeps the GPU busy, each result compared bit for bit with the exact product. V5's C loader, which
refills the epilogue's staging tiles with the next tile's residual, is run the same way, and so are
V5's thread-block clusters (split-K, B shared by multicast). The
planted-bug tests put premature stage releases, waits one group too shallow, early staging
hand-overs and rewrites, a split-K rank that leaves before its partial sums are read and a split-K
consumer that parks its sums while the ring is still read into V5, and must see each flagged, so
the tier is known to be able to fail.
(The ledgers alone, without pauses, run in the quick tier too: tests/gpu/test_v5_ledgers.py.)
"""
import contextlib

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


@contextlib.contextmanager
def _stress_build(like, tmp_path, **kw):
    """A stress variant of `like` (stress.register_variant's options), unregistered after use."""
    name = stress.register_variant(like, tmp_path, **kw)
    try:
        yield name
    finally:
        registry.unregister(name)
        cupy.cuda.Device().synchronize()


@pytest.fixture(scope="module")
def co_runner():
    return _CoRunner()


@pytest.mark.parametrize("like", stress.STRESSED_KERNELS)
def test_long_k_is_bitwise_exact_under_perturbed_timing(like, tmp_path, stress_seed, stress_reps, co_runner):
    _skip_unless_this_gpu_runs(like)
    with _stress_build(like, tmp_path, seed=stress_seed, pipe_check=like == "v5") as name:
        bad = _mismatches(name, SHAPES, LAYOUTS, stress_reps, co_runner, np.random.default_rng(stress_seed))
    assert not bad, f"{like} with DG_STRESS={stress_seed}:\n" + "\n".join(bad)


def test_ping_pong_turns_are_bitwise_exact_under_perturbed_timing(tmp_path, stress_seed, stress_reps, co_runner):
    """The ping-pong consumers' turn-taking (the order barriers and the ring positions each skips)
    under the same pauses and the release ledger, with many tiles per block."""
    _skip_unless_this_gpu_runs("v5")
    assert registry.get("v5").config_defines(PING_PONG) in [registry.get("v5").config_defines(c)
                                                            for c in registry.get("v5").config_space]
    with _stress_build("v5", tmp_path, seed=stress_seed, pipe_check=True) as name:
        bad = _mismatches(name, PING_PONG_SHAPES, LAYOUTS, max(1, stress_reps // 4), co_runner,
                          np.random.default_rng(stress_seed), config=PING_PONG)
    assert not bad, f"v5 ping-pong with DG_STRESS={stress_seed}:\n" + "\n".join(bad)


# V5's thread-block clusters, with the ledgers: split-K's ranks exchange partial sums through the
# cluster (the planted split-K bugs' config), and with B shared by multicast (the config space's
# multicast config) each block's producer fills half of both blocks' stages, which are refilled only
# once both blocks' consumers have released them. Their producer warpgroup leaves without the
# consumers' cluster barriers (an exited thread counts as arrived).
CLUSTER_CONFIGS = {"split-k": stress.SPLIT_K_CONFIG, "multicast": {"DG_BN": 256, "DG_STAGES": 3, "DG_CLUSTER_M": 2}}


@pytest.mark.parametrize("kind", CLUSTER_CONFIGS)
def test_cluster_builds_are_bitwise_exact_under_perturbed_timing(kind, tmp_path, stress_seed, stress_reps, co_runner):
    _skip_unless_this_gpu_runs("v5")
    with _stress_build("v5", tmp_path, seed=stress_seed, pipe_check=True) as name:
        bad = _mismatches(name, SHAPES, LAYOUTS, max(1, stress_reps // 4), co_runner,
                          np.random.default_rng(stress_seed), config=CLUSTER_CONFIGS[kind])
    assert not bad, f"v5 {kind} with DG_STRESS={stress_seed}:\n" + "\n".join(bad)


@pytest.mark.parametrize("planted", stress.STAGE_RELEASE_BUGS)
def test_the_tier_kills_a_premature_stage_release_in_the_multicast_build(planted, tmp_path, stress_seed, co_runner):
    """The same planted releases in the build whose stages both blocks of a pair read: the ledger
    must flag each in every shape, so the cluster test above can fail there too."""
    _skip_unless_this_gpu_runs("v5")
    with _stress_build("v5", tmp_path, seed=stress_seed, pipe_check=True, planted=planted) as name:
        bad = _mismatches(name, SHAPES, LAYOUTS[:1], 1, co_runner, np.random.default_rng(stress_seed),
                          config=CLUSTER_CONFIGS["multicast"])
    assert len(bad) == len(SHAPES), f"the ledger missed {planted} with multicast in some shapes: {bad}"


@pytest.mark.parametrize("planted", stress.STAGE_RELEASE_BUGS)
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


@pytest.mark.parametrize("planted", stress.SPLIT_K_BUGS)
def test_the_tier_kills_the_planted_split_k_hand_overs(planted, tmp_path, stress_seed, co_runner):
    """A split-K rank that moves on before the owner of the rows has read its parked partial sums,
    or a consumer that parks its sums in the ring while the other consumer may still read it: the
    check build (which keeps the rank's shared memory alive a while after it leaves, and holds the
    other consumer's last stage release back) must flag it on every run. Without the check the owner
    may read shared memory of a block that has exited, which no test should run, so there is no
    timing-only comparison here."""
    _skip_unless_this_gpu_runs("v5")
    with _stress_build("v5", tmp_path, seed=stress_seed, pipe_check=True, planted=planted) as name:
        bad = _mismatches(name, SHAPES, LAYOUTS[:1], 1, co_runner, np.random.default_rng(stress_seed),
                          config=stress.SPLIT_K_CONFIG)
    print(f"{planted} (seed {stress_seed}): flagged in {len(bad)} of {len(SHAPES)} shapes")
    assert len(bad) == len(SHAPES), f"the split-K check missed {planted} in some shapes: {bad}"


# V5's staging hand-over (a 16-bit D and residual C): the loader refills each unit many times per
# block. C = out too, where each tile's C is read just before its own D is written. Integers:
# |A B| <= K and |C| <= 8 keep every value exact in float16.
RESIDUAL_SHAPES = [(2304, 2304, 1024), (2200, 2104, 256)]
RESIDUAL_CONFIGS = {"cooperative": {"DG_BN": 256, "DG_STAGES": 3}, "ping-pong": PING_PONG}


def _staging_mismatches(name, config, reps, co_runner, rng, residual=True) -> list[str]:
    """Exact problems whose 16-bit D goes through V5's staging units, with a residual C (the C
    loader refills the units; every other rep with C = out) or, residual=False, without one."""
    bad = []
    for m, n, k in RESIDUAL_SHAPES:
        a = cupy.asarray(rng.integers(-1, 2, size=(m, k)).astype(np.float16))
        b = cupy.asarray(rng.integers(-1, 2, size=(k, n)).astype(np.float16))
        c = cupy.asarray(rng.integers(-8, 9, size=(m, n)).astype(np.float16))
        exact = (a.astype(cupy.float64) @ b.astype(cupy.float64) + (c if residual else 0)).astype(cupy.float16)
        for rep in range(reps):
            co_runner.load()
            if not residual:
                out = deepgemm.gemm(a, b, kernel=name, config=config)
            elif rep % 2:
                out = c.copy()
                deepgemm.gemm(a, b, kernel=name, config=config, c=out, out=out)
            else:
                out = deepgemm.gemm(a, b, kernel=name, config=config, c=c)
            if not bool(cupy.array_equal(out, exact)):
                bad.append(f"{m}x{n}x{k} rep {rep}{' (C = out)' if residual and rep % 2 else ''}: "
                           f"{int((out != exact).sum())} of {m * n} elements differ")
                break
    return bad


@pytest.mark.parametrize("kind", RESIDUAL_CONFIGS)
def test_residual_staging_is_bitwise_exact_under_perturbed_timing(kind, tmp_path, stress_seed, stress_reps, co_runner):
    _skip_unless_this_gpu_runs("v5")
    with _stress_build("v5", tmp_path, seed=stress_seed, pipe_check=True) as name:
        bad = _staging_mismatches(name, RESIDUAL_CONFIGS[kind], max(2, stress_reps // 4), co_runner,
                                   np.random.default_rng(stress_seed))
    assert not bad, f"v5 {kind} with a residual, DG_STRESS={stress_seed}:\n" + "\n".join(bad)


@pytest.mark.parametrize("planted", stress.STAGING_BUGS + stress.REWRITE_BUGS)
def test_the_tier_kills_an_early_staging_hand_over(planted, tmp_path, stress_seed, stress_reps, co_runner):
    """A staging unit handed to the C loader before the TMA stores have read it (with a residual),
    or written again by its own consumer before then (a 16-bit D without C, where no hand-over to the
    loader waits for the stores first): the staging ledger must flag it on every run, in both kinds
    of consumer. Timing perturbation alone is run as well and its outcome reported (it needs a
    store's read to be slower than the next write)."""
    _skip_unless_this_gpu_runs("v5")
    residual = planted in stress.STAGING_BUGS
    checked = stress.register_variant("v5", tmp_path, seed=stress_seed, pipe_check=True, planted=planted)
    timing_only = stress.register_variant("v5", tmp_path, seed=stress_seed, planted=planted)
    rng = np.random.default_rng(stress_seed)
    try:
        by_ledger = {kind: _staging_mismatches(checked, config, 1, co_runner, rng, residual)
                     for kind, config in RESIDUAL_CONFIGS.items()}
        by_timing = {kind: _staging_mismatches(timing_only, config, max(2, stress_reps // 4), co_runner, rng, residual)
                     for kind, config in RESIDUAL_CONFIGS.items()}
    finally:
        for name in (checked, timing_only):
            registry.unregister(name)
        cupy.cuda.Device().synchronize()
    print(f"{planted} (seed {stress_seed}): ledger caught it in {[k for k, bad in by_ledger.items() if bad]}; "
          "timing alone: " + "; ".join(f"{k}: {bad[0] if bad else 'passed'}" for k, bad in by_timing.items()))
    assert all(by_ledger.values()), f"the staging ledger missed {planted} in {[k for k, b in by_ledger.items() if not b]}"
