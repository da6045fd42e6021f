"""CPU tier, V4's config space: every entry builds for all four layouts (the swizzled and padded shared
layouts and the BK = 64 tiles differ per layout: k-major vs m/n-major tiles, .trans ldmatrix), with no
spills or local memory and the SASS V4 claims; and every entry fits both archs' shared memory.
(test_static.py covers the default config in full and each entry once, rc with the full epilogue.)"""
import functools
import itertools

import pytest

from deepgemm import jit, registry, static_checks

SPEC = registry.get("v4")
CONFIGS = [c for c in SPEC.config_space if c != SPEC.default_config]
LAYOUTS = [(True, True), (True, False), (False, True), (False, False)]


@pytest.fixture(scope="module")
def results():
    todo = [(c, static_checks.Variant(SPEC, "sm_90a", "float16", "float16", ar, br))
            for c, (ar, br) in itertools.product(CONFIGS, LAYOUTS)]
    compiled = jit.compile_many([functools.partial(registry.compile_variant, SPEC, v.arch, v.in_dtype, v.out_dtype,
                                                   v.a_row, v.b_row, v.epilogue, c) for c, v in todo])
    return [(c, static_checks.check(v, ck, c)) for (c, v), ck in zip(todo, compiled)]


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


def test_every_config_builds_for_every_layout(results):
    assert len(results) == len(CONFIGS) * len(LAYOUTS)
    problems = [f"{c} {r.variant}: {'; '.join(r.problems)}" for c, r in results if not r.ok]
    assert not problems, "\n".join(problems)
    assert all(r.resources["registers"] > 0 and r.features["HMMA"] for _, r in results)
