"""CPU tier for the stress tier's builds: the defines really change the code (pauses in the SASS,
the planted release really moved), and a normal build carries none of it."""
import dataclasses
import re

import pytest

from deepgemm import binary, registry
from deepgemm.testing import stress


def _compile(name, arch, in_dtype="float16", epilogue=registry.NO_EPILOGUE, config=None):
    return registry.compile_variant(registry.get(name), arch, in_dtype, in_dtype, True, False, epilogue, config)


def _sass(name, arch):
    return binary.dump_sass(_compile(name, arch).cubin_path)


def _loop(src):
    return src[src.index("dg::wgmma_commit();"):src.index("dg::wgmma_wait<0>(ledger);")]


def test_planted_releases_move_a_release_before_the_wait():
    loop = _loop(stress.variant_source("v5", planted="premature_release"))
    assert loop.index("    release(prev_stage)") < loop.index("dg::wgmma_wait<1>(ledger)")
    src = stress.variant_source("v5", planted="release_in_flight")
    assert _loop(src).index("    release(stage)") < _loop(src).index("dg::wgmma_wait<1>(ledger)")
    assert " release(prev_stage)" not in src      # one release per stage use, no more
    assert "planted" not in stress.variant_source("v5")
    with pytest.raises(ValueError, match="planted"):
        stress.variant_source("v4", planted="premature_release")
    with pytest.raises(ValueError, match="unknown planted bug"):
        stress.variant_source("v5", planted="nope")


def test_planted_staging_bug_drops_the_wait_for_the_stores_reads():
    real = stress.variant_source("v5")
    early = stress.variant_source("v5", planted="unit_freed_before_store_read")
    assert real.count("bulk_wait_read<0>(staging)") == early.count("bulk_wait_read<0>(staging)") + 1
    assert early.count("mbar_arrive(d_free(") == real.count("mbar_arrive(d_free(") == 1   # still handed over
    assert set(stress.STAGE_RELEASE_BUGS) | set(stress.STAGING_BUGS) | set(stress.REWRITE_BUGS) | \
        set(stress.SPLIT_K_BUGS) == set(stress.PLANTED)


def test_planted_split_k_bug_drops_only_the_barrier_that_holds_a_rank_for_the_owner():
    real = stress.variant_source("v5")
    early = stress.variant_source("v5", planted="rank_leaves_before_its_sums_are_read")
    assert early.count("dg::cluster_sync();") == real.count("dg::cluster_sync();") - 1
    assert early.replace("            // planted bug: no barrier for the owner's reads\n", "") == \
        real.replace("            dg::cluster_sync();\n            if (rank != owner) {", "            if (rank != owner) {")
    # The rank still marks its sums left and the owner still looks for the mark.
    assert "dg::parked_sums_left(part)" in early and "dg::parked_sums_read(acc.v, remote" in early


def test_planted_ring_bug_drops_only_the_barrier_before_the_parking():
    real = stress.variant_source("v5")
    early = stress.variant_source("v5", planted="consumer_parks_while_the_ring_is_read")
    assert early.count("dg::named_barrier(3,") == real.count("dg::named_barrier(3,") - 1 == 0
    assert early.replace("/* planted bug: no barrier for the other consumer */", "") == \
        real.replace("dg::named_barrier(3, 128 * CONSUMERS);", "")
    # The other consumer still holds its last release back and the parking one still tests the ring.
    assert "dg::parked_ring_hold(" in early and "dg::parked_ring_idle<STAGES>(acc.v, empty(0), stage, phase)" in early


def test_split_k_check_build_marks_and_lingers_and_a_normal_build_does_not(tmp_path):
    """The parked-sums check exists only in a DG_PIPE_CHECK build: its linger is the one pause a
    split-K check build without DG_STRESS has, and the normal build has none of it."""
    name = stress.register_variant("v5", tmp_path, pipe_check=True)
    try:
        check = _compile(name, "sm_90a", config=stress.SPLIT_K_CONFIG)
        assert "NANOSLEEP" in binary.dump_sass(check.cubin_path)
        assert check.resources["spill_stores"] == 0
    finally:
        registry.unregister(name)
    normal = _compile("v5", "sm_90a", config=stress.SPLIT_K_CONFIG)
    assert "NANOSLEEP" not in binary.dump_sass(normal.cubin_path)


def test_planted_shallow_waits_change_only_the_depth_the_ledger_is_told():
    """The waits note their depth in the ledgers themselves, so a wait one group short is one edit
    (the depth) and the ledger sees it: nothing else of the release or the rewrite moves."""
    real = stress.variant_source("v5")
    short = stress.variant_source("v5", planted="stage_wait_too_shallow")
    assert real.count("dg::wgmma_wait<1>(ledger);") == 1 and "dg::wgmma_wait<2>(ledger);" in short
    assert _loop(short).replace("dg::wgmma_wait<2>(ledger);   // planted bug: one group short", "") == \
        _loop(real).replace("dg::wgmma_wait<1>(ledger);", "")
    rewrite = stress.variant_source("v5", planted="unit_rewritten_before_store_read")
    assert "dg::bulk_wait_read<HALVES>(staging);" in rewrite and "bulk_wait_read<HALVES - 1>" not in rewrite
    hopper = (registry.get("v5").source.parent / "include" / "deepgemm" / "hopper.cuh").read_text()
    assert "ledger.template waited<N>();" in hopper and "ledger.template reads_waited<N>();" in hopper


def test_defines_lead_the_source_and_the_seed_is_checked():
    src = stress.variant_source("v4", seed=7, pipe_check=True)
    assert src.startswith("#define DG_STRESS 7\n#define DG_PIPE_CHECK 1\n")
    with pytest.raises(ValueError, match="seed"):
        stress.variant_source("v4", seed=-1)
    with pytest.raises(ValueError, match=r"^seed: must be in \[0, 2\*\*31\), got 2147483648"):
        stress.variant_source("v4", seed=2 ** 31)
    assert stress.variant_source("v4", seed=2 ** 31 - 1).startswith("#define DG_STRESS 2147483647\n")


def test_a_planted_bug_refuses_a_source_whose_anchor_moved():
    """A rewrite that found nothing to rewrite would plant nothing, and the stress tier's proof that
    it can fail would prove nothing: each planted bug refuses a source without its anchor."""
    real = registry.get("v5").source.read_text()
    for name, (kernel, rewrite) in stress.PLANTED.items():
        assert rewrite(real) != real, name
    releases = (stress._RELEASE_AFTER_WAIT, stress._FINAL_RELEASE)
    anchors = {"premature_release": releases, "release_in_flight": releases,
               "stage_wait_too_shallow": (stress._MAIN_LOOP_WAIT,),
               "unit_freed_before_store_read": (stress._UNIT_HAND_OVER,),
               "unit_rewritten_before_store_read": (stress._UNIT_REWRITE_WAIT,),
               "rank_leaves_before_its_sums_are_read": (stress._PARKED_SUMS_HELD,),
               "consumer_parks_while_the_ring_is_read": (stress._RING_IDLE,)}
    assert sorted(anchors) == sorted(stress.PLANTED)
    for name, (kernel, rewrite) in stress.PLANTED.items():
        for anchor in anchors[name]:
            assert real.count(anchor) == 1
            moved = real.replace(anchor, anchor.replace("(", " (", 1))
            with pytest.raises(ValueError, match="changed: update deepgemm.testing.stress"):
                rewrite(moved)


def test_each_stress_variant_has_its_own_name(tmp_path):
    names = set()
    try:
        for kw in (dict(), dict(seed=3), dict(pipe_check=True), dict(seed=3, pipe_check=True),
                   dict(pipe_check=True, planted="premature_release")):
            names.add(stress.register_variant("v5", tmp_path, **kw))
        assert names == {"v5_stress_plain", "v5_stress_s3", "v5_stress_check", "v5_stress_s3_check",
                         "v5_stress_check_premature_release"}
    finally:
        for name in names:
            registry.unregister(name)


@pytest.mark.parametrize("like,arch", [("v4", "sm_80"), ("v5", "sm_90a")])
def test_stress_build_pauses_and_normal_build_does_not(like, arch, tmp_path):
    name = stress.register_variant(like, tmp_path, seed=12345, pipe_check=like == "v5")
    try:
        assert "NANOSLEEP" in _sass(name, arch)
    finally:
        registry.unregister(name)
    assert "NANOSLEEP" not in _sass(like, arch)


@pytest.mark.parametrize("planted", sorted(stress.PLANTED))
def test_planted_races_build_with_the_ledger(planted, tmp_path):
    name = stress.register_variant("v5", tmp_path, seed=1, pipe_check=True, planted=planted)
    residual = registry.Epilogue(residual="float16")   # the staging hand-over exists with a 16-bit C
    try:
        compiled = _compile(name, "sm_90a", epilogue=residual if planted in stress.STAGING_BUGS else registry.NO_EPILOGUE,
                            config=stress.SPLIT_K_CONFIG if planted in stress.SPLIT_K_BUGS else None)   # split-K: DG_SPLIT_K > 1
        assert compiled.resources["registers"] > 0 and compiled.resources["spill_stores"] == 0
    finally:
        registry.unregister(name)


def test_an_accumulator_row_past_the_last_traps_in_a_check_build(tmp_path):
    """Split-K has one row of accumulators (no ping-pong), so `acc[1]` in its parking store is
    undefined behaviour, which no output need show (nvcc 13.0 compiles the normal build to the very
    code of `acc[0]`). A DG_PIPE_CHECK build (the quick tier's split-K ledger case) traps there,
    and has no trap for rows in range."""
    store = "make_float4(acc[0][4 * j], acc[0][4 * j + 1], acc[0][4 * j + 2], acc[0][4 * j + 3])"
    names, registered = {}, []
    try:
        for check in (False, True):
            real = stress.variant_source("v5", pipe_check=check)
            assert real.count(store) == 1
            for label, text in (("real", real), ("past", real.replace(store, store.replace("acc[0][4 * j + 2]", "acc[1][4 * j + 2]")))):
                name = f"v5_rows_{label}_{int(check)}"
                path = tmp_path / f"{name}.cu"
                path.write_text(text)
                registry.register(dataclasses.replace(registry.get("v5"), name=name, file=str(path), public=False))
                registered.append(name)
                names[label, check] = _compile(name, "sm_90a", config=stress.SPLIT_K_CONFIG)
    finally:
        for name in registered:
            registry.unregister(name)
    traps = {key: len(re.findall(r"\bBPT\.TRAP\b", binary.dump_sass(c.cubin_path))) for key, c in names.items()}
    assert traps["real", False] == traps["past", False] == 0
    assert traps["past", True] == traps["real", True] + 1, traps
