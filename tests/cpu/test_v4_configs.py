"""CPU tier, V4's config space: every entry fits both archs' shared memory, and the full tier
(--sweep=full, `python -m deepgemm static --all`) builds every entry for all four layouts (the
swizzled and padded shared layouts and the BK = 64 tiles differ per layout: k-major vs m/n-major
tiles, .trans ldmatrix), which test_static.py then checks for spills, local memory and V4's SASS."""
import pytest

from deepgemm import registry, static_checks

SPEC = registry.get("v4")
CONFIGS = [c for c in SPEC.config_space if c != SPEC.default_config]


def test_config_space_has_the_variants_to_time():
    keys = {(c["DG_BM"], c["DG_BN"], c["DG_BK"], c["DG_SWIZZLE"]) for c in SPEC.config_space}
    assert {(128, 128, 64, 1), (128, 256, 64, 1), (256, 128, 64, 1), (128, 128, 32, 1)} <= keys
    assert all(set(c) == set(SPEC.default_config) for c in SPEC.config_space), "entries are full configs"


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_every_config_fits_shared_memory(arch):
    for c in SPEC.config_space:
        assert SPEC.dynamic_smem(c) <= static_checks.DYNAMIC_SMEM_LIMIT[arch], c


def test_swizzle_drops_the_padding():
    c = dict(SPEC.default_config, DG_BM=128, DG_BN=128, DG_BK=32, DG_STAGES=4)
    assert SPEC.dynamic_smem(dict(c, DG_SWIZZLE=0)) == 4 * 256 * 40 * 2   # rows of 32 + 8 halves
    assert SPEC.dynamic_smem(dict(c, DG_SWIZZLE=1)) == 4 * 256 * 32 * 2


def test_full_tier_builds_every_config_for_every_layout():
    full = static_checks.variants(SPEC, "sm_90a", full=True)
    for c in CONFIGS:
        built = {(v.a_row, v.b_row) for v in full if dict(v.config) == SPEC.config_defines(c)}
        assert built == set(static_checks.LAYOUTS), c
