"""V5's pipeline ledgers in the quick tier (the stress tier adds pauses and repetitions).

V5 built with DG_PIPE_CHECK keeps, in each consumer, a ledger of its wgmma groups and of its TMA
stores out of the staging units (kernels/include/deepgemm/stress.cuh). The waits note their own
depth in it (`dg::wgmma_wait<N>(ledger)`, `dg::bulk_wait_read<N>(staging)`), and every hand-over
is checked against it: a stage released before a wait covered its wgmmas, a staging unit handed to
the C loader or written again before the stores reading it are known to be done. A violation turns
the consumer's outputs into NaN. A split-K build checks its ranks' hand-over the same way: a
rank that leaves its tile before the owner of the rows has read its parked partial sums is seen
by the owner, whose outputs turn NaN, and so is a consumer that parks its sums in the ring while
the other consumer may still read it (the other consumer holds its last stage release back, so the
parking one finds that stage's barrier open unless it waited). That needs no luck with timing,
so one run of each build settles it: a wait one group too shallow fails here on every run, where
the same race passes a timing test almost always (the wgmma or the store is usually done long
before the next write lands).

Each build runs one integer-exact problem whose blocks walk two or more tiles (every hand-over is
exercised; split-K: one tile per cluster), with a 16-bit D (stored by TMA through the staging
units), with and without a residual (the C loader's hand-over, or the consumer's own rewrite of its
units). One planted bug of each kind of hand-over shows here that the checks can fail; the stress
tier runs every planted bug, under perturbed timing too.
"""
import numpy as np
import pytest

import deepgemm
from deepgemm import registry
from deepgemm.testing import stress

cupy = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

# 2304 x 2304: 162 tiles of 128 x 256 and 324 of 128 x 128, over at most 132 blocks.
M = N = 2304
K = 1024   # 16 k-blocks through the ring; |A B| <= K and |C| <= 8 stay exact in float16
BUILDS = {
    "cooperative": ({"DG_BN": 256, "DG_STAGES": 3}, False),
    "cooperative-residual": ({"DG_BN": 256, "DG_STAGES": 3}, True),
    "ping-pong": ({"DG_BN": 128, "DG_STAGES": 5, "DG_PINGPONG": 1}, False),
    # One tile per cluster of two: each rank parks one consumer's partial sums for the other.
    "split-k": (stress.SPLIT_K_CONFIG, False),
}


def _skip_unless_v5_runs(selected_kernels):
    if "v5" not in selected_kernels:
        pytest.skip("--kernels excludes v5")
    if int(cupy.cuda.Device().compute_capability) < registry.get("v5").min_cc:
        pytest.skip("V5 needs compute capability 9.0")


def _run(build, tmp_path, planted=None):
    """The build's problem through a DG_PIPE_CHECK variant of V5: (out, the exact result)."""
    config, residual = BUILDS[build]
    rng = np.random.default_rng(7)
    a = cupy.asarray(rng.integers(-1, 2, size=(M, K)).astype(np.float16))
    b = cupy.asarray(rng.integers(-1, 2, size=(K, N)).astype(np.float16))
    c = cupy.asarray(rng.integers(-8, 9, size=(M, N)).astype(np.float16)) if residual else None
    exact = a.astype(cupy.float64) @ b.astype(cupy.float64)
    if residual:
        exact += c
    name = stress.register_variant("v5", tmp_path, pipe_check=True, planted=planted)
    try:
        out = deepgemm.gemm(a, b, kernel=name, config=config, c=c)
    finally:
        registry.unregister(name)
    assert out.dtype == cupy.float16
    return out, exact


@pytest.mark.parametrize("build", BUILDS)
def test_v5_pipeline_ledgers_pass(build, tmp_path, selected_kernels):
    _skip_unless_v5_runs(selected_kernels)
    out, exact = _run(build, tmp_path)
    nan = int(cupy.isnan(out).sum())
    assert nan == 0, f"the ledger flagged a hand-over: {nan} of {M * N} outputs are NaN"
    wrong = int((out.astype(cupy.float64) != exact).sum())
    assert wrong == 0, f"{wrong} of {M * N} outputs differ from the exact product"


# The ledgers must be able to fail here too, not only in the stress tier (which runs every planted
# bug, under perturbed timing as well): one planted bug of each kind of hand-over, in a build that has it.
PLANTED = {"stage_wait_too_shallow": "cooperative", "unit_freed_before_store_read": "cooperative-residual",
           "unit_rewritten_before_store_read": "cooperative", "rank_leaves_before_its_sums_are_read": "split-k",
           "consumer_parks_while_the_ring_is_read": "split-k"}


def nan_per_thread(out, bn):
    """NaN outputs per consumer thread and 64-row half of each 64 x bn tile, as the wgmma m64nNk16
    accumulator layout places them: thread (warp w, lane l) of a half holds rows 16 w + l / 4 and
    that + 8, columns 8 u + 2 (l % 4) and that + 1 for each u < bn / 8 (bn / 2 values)."""
    m, n = out.shape
    mask = cupy.asnumpy(cupy.isnan(out))
    # rows: 64 b + 16 w + 8 s + g; columns: bn t + 8 u + 2 q + e; a thread is (b, w, g, t, q).
    return mask.reshape(m // 64, 4, 2, 8, n // bn, bn // 8, 4, 2).sum(axis=(2, 5, 7))


@pytest.mark.parametrize("planted", PLANTED)
def test_v5_pipeline_ledgers_flag_a_planted_bug(planted, tmp_path, selected_kernels):
    """A flag turns every accumulator of the flagged thread into NaN (BN / 2 per 64-row half of a
    tile, from the flag on): each thread's count is 0 or the whole set. A count in between would be
    a check that poisons some values and lets others through (a split-K owner that finds a rank's
    mark only through the one parked word it read as a sum, say, with its own poisoning cut short)."""
    _skip_unless_v5_runs(selected_kernels)
    build = PLANTED[planted]
    out, _ = _run(build, tmp_path, planted=planted)
    assert int(cupy.isnan(out).sum()) > 0, f"DG_PIPE_CHECK did not flag {planted} ({build})"
    bn = BUILDS[build][0]["DG_BN"]
    counts = nan_per_thread(out, bn)
    partial = counts[(counts != 0) & (counts != bn // 2)]
    assert partial.size == 0, (f"{planted}: {partial.size} threads with some but not all of their {bn // 2} "
                               f"accumulators NaN (counts {sorted(set(partial.tolist()))[:8]})")
