"""kernel="auto" on the CPU: shape buckets, the heuristics, the in-memory decision cache (and what
it keys on), per-GPU-model tuned tables (missing, corrupt, another GPU's, stale entries, user over shipped),
explain(), and gemm() routing a decode shape to small_m."""
import dataclasses
import json
import math
import re
import time
import warnings

import numpy as np
import pytest

import deepgemm
from deepgemm import dispatch, registry, tables as tuned
from deepgemm.arrays import Matrix
from deepgemm.registry import Epilogue, Problem
from test_api import FAKE_GPU, F, P, captured, gpus, replayable  # noqa: F401  (fakes and fixtures)

H200 = {"name": "NVIDIA H200", "cc": "9.0", "sm_count": 132}           # as a table records it
H200_FACTS = {"name": "NVIDIA H200", "cc": 90, "sm_count": 132}      # as deepgemm.device reports it


def mat(rows, cols, row_major=True, ptr=1 << 20, ld=None, device=0):
    return Matrix(ptr, rows, cols, "float16", row_major, ld or (cols if row_major else rows), device)


def prob(m, n, k, dtype="float16", cc=90, a=None, b=None, epilogue=registry.NO_EPILOGUE, device=0):
    a = a or mat(m, k, device=device)
    b = b or mat(k, n, row_major=False, device=device)
    return Problem(m, n, k, dtype, dtype, a, b, epilogue, cc)


@pytest.fixture
def tables(tmp_path, monkeypatch, gpus):
    """Device 0 is an H200; shipped and user tables live under tmp_path. Returns a writer."""
    shipped, user = tmp_path / "shipped", tmp_path / "user"
    monkeypatch.setattr(tuned, "SHIPPED_DIR", shipped)
    monkeypatch.setenv("DEEPGEMM_TUNED_DIR", str(user))
    gpus({0: dict(H200_FACTS)})
    dispatch.reload_tables()

    def write(where, entries, gpu=H200, text=None):
        folder = shipped if where == "shipped" else user
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "NVIDIA_H200.json"
        path.write_text(text if text is not None else
                        json.dumps({"format": 1, "gpu": gpu, "entries": entries}))
        dispatch.reload_tables()
        return path
    yield write
    dispatch.reload_tables()


# ---------------------------------------------------------------- buckets

@pytest.mark.parametrize("x,cls", [(1, 1), (2, 2), (3, 4), (16, 16), (17, 32), (4096, 4096), (4097, 8192),
                                   (14336, 16384), (10**6, 16384)])
def test_m_classes_are_powers_of_two_rounded_up_and_clamped(x, cls):
    assert dispatch.size_class(x, *dispatch.M_CLASS_RANGE) == cls


@pytest.mark.parametrize("x,cls", [(1, 16), (16, 16), (17, 32), (65536, 65536), (65537, 65536), (10**7, 65536)])
def test_n_and_k_classes_are_clamped_to_16_through_65536(x, cls):
    assert dispatch.size_class(x, *dispatch.NK_CLASS_RANGE) == cls


def test_bucket_key_is_coarse_and_names_every_factor():
    key = dispatch.bucket_key(prob(13, 14336, 4096, "bfloat16", cc=80))
    assert key == "m16.n16384.k4096.bfloat16.rc.epi0.sm80"
    assert dispatch.bucket_key(prob(9, 10000, 4000)) == dispatch.bucket_key(prob(16, 16384, 4096))
    with_epi = prob(16, 64, 64, epilogue=Epilogue(bias="float32", activation="gelu"))
    assert dispatch.bucket_key(with_epi).endswith(".epi1.sm90")
    rr = prob(16, 64, 64, b=mat(64, 64))
    assert ".rr." in dispatch.bucket_key(rr)
    assert dispatch.bucket_key(Problem(8, 8, 8)) == "m8.n16.k16.float16.rc.epi0.sm90"   # shape only: nn.Linear


# ---------------------------------------------------------------- heuristics

@pytest.mark.parametrize("m,mt", [(1, 1), (16, 1), (17, 2), (32, 2), (33, 4), (64, 4)])
def test_small_m_for_decode_shapes_with_one_row_block(tables, m, mt):
    """Without V5 (sm_80), small_m takes every M up to 64; beside V5, up to 16, and there not for
    x @ w.T with a weight of 4096 x 2048 or more (V5's A box is M rounded up to 8 rows), nor for
    x @ w with a row-major weight."""
    spec, cfg = dispatch.choose(prob(m, 4096, 4096, cc=80))
    assert spec.name == "small_m" and cfg["DG_SMALL_M_MT"] == mt
    assert -(-m // (16 * cfg["DG_SMALL_M_MT"])) == 1          # B streamed once
    if "v5" in registry.names():
        spec, cfg = dispatch.choose(prob(m, 4096, 4096))
        # one row block of 64 tiles of 64x64 over the whole K (48 % of the SMs: enough unsplit)
        assert spec.name == "v5" and (cfg["DG_BM"], cfg["DG_BN"], cfg["DG_SPLIT_K"]) == (64, 64, 1)
        beside_v5 = m <= dispatch.SMALL_M_BESIDE_V5
        for smaller_or_column_major_a in (prob(m, 1024, 4096), prob(m, 4096, 4096, a=mat(m, 4096, row_major=False))):
            assert dispatch.choose(smaller_or_column_major_a)[0].name == ("small_m" if beside_v5 else "v5")
        assert dispatch.choose(prob(m, 4096, 4096, b=mat(4096, 4096)))[0].name == "v5"


@pytest.mark.skipif("v5" not in registry.names(), reason="V5 is not registered")
@pytest.mark.parametrize("m", [1, 8, 16])
def test_v5_takes_decode_from_small_m_only_where_it_was_measured_faster(tables, m):
    """The rule's edges: x @ w.T (rc) with at least 4096 x 2048 weights, x @ w (rr) with at least
    768 x 2304; a column-major A (whose box V5 still zero-fills) or a weight one column short of the
    measured ones stays with small_m."""
    assert dispatch.choose(prob(m, 14336, 4096))[0].name == "v5"
    assert dispatch.choose(prob(m, 4096, 14336))[0].name == "v5"
    assert dispatch.choose(prob(m, 7168, 2048))[0].name == "v5"
    assert dispatch.choose(prob(m, 1024, 8192))[0].name == "v5"
    assert dispatch.choose(prob(m, 4096, 2048))[0].name == "v5"
    assert dispatch.choose(prob(m, 4095, 2048))[0].name == "small_m"
    assert dispatch.choose(prob(m, 2048, 2048))[0].name == "small_m"
    assert dispatch.choose(prob(m, 4096, 4096, a=mat(m, 4096, row_major=False)))[0].name == "small_m"
    assert dispatch.choose(prob(m, 2304, 768, b=mat(768, 2304)))[0].name == "v5"
    assert dispatch.choose(prob(m, 2303, 768, b=mat(768, 2303)))[0].name == "small_m"
    column_major_a = dispatch.choose(prob(m, 4096, 4096, a=mat(m, 4096, row_major=False), b=mat(4096, 4096)))
    assert column_major_a[0].name == "small_m"


@pytest.mark.skipif("v5" not in registry.names(), reason="V5 is not registered")
def test_auto_copies_a_column_major_a_only_at_decode_sizes_beside_v5(tables):
    """copies_a's edges: 2 <= M <= 16, K >= 1024, sm_90, kernel "auto" without a config, FP32
    accumulation, a single GEMM; explain() says so and decides for the row-major copy."""
    col = lambda m, k: mat(m, k, row_major=False)
    assert dispatch.copies_a(prob(8, 4096, 4096, a=col(8, 4096))) is not None
    assert dispatch.copies_a(prob(16, 4096, 1024, a=col(16, 1024), b=mat(1024, 4096))) is not None
    assert dispatch.copies_a(prob(2, 64, 1024, a=col(2, 1024))) is not None
    for no in (prob(17, 4096, 4096, a=col(17, 4096)), prob(8, 4096, 1023, a=col(8, 1023)),
               prob(1, 4096, 4096, a=col(1, 4096)),                      # one row: a vector, nothing to gain
               prob(8, 4096, 4096), prob(8, 4096, 4096, a=col(8, 4096), cc=80)):
        assert dispatch.copies_a(no) is None
    p = prob(8, 4096, 4096, a=col(8, 4096))
    assert dispatch.copies_a(p, kernel="v5") is None and dispatch.copies_a(p, accumulate="fp16") is None
    text = dispatch.explain(8, 4096, 4096, layout="cr", device=None)
    assert "a copied:   A is column-major at M=8" in text and ".rr.epi0" in text
    assert "a copied" not in dispatch.explain(8, 4096, 4096, layout="cr", kernel="small_m", device=None)


# Shape -> V5's pick by its rule, as the H200 table's every-config timings ranked them (fastest,
# or within 5 % of it).
V5_RULE_CASES = [
    ((4096, 4096, 4096, "rc"), {"DG_BM": 128, "DG_BN": 256, "DG_SPLIT_K": 1}),
    ((8192, 8192, 1024, "rr"), {"DG_BM": 128, "DG_BN": 128, "DG_SPLIT_K": 1, "DG_PINGPONG": 1}),
    ((8192, 8192, 2048, "rr"), {"DG_BM": 128, "DG_BN": 256, "DG_SPLIT_K": 1, "DG_PINGPONG": 0}),
    ((8192, 8192, 2048, "rr", "epilogue"), {"DG_BM": 128, "DG_BN": 128, "DG_PINGPONG": 1}),
    ((4096, 4096, 4096, "rr", "epilogue"), {"DG_BM": 128, "DG_BN": 256, "DG_PINGPONG": 0}),
    ((2048, 8192, 1024, "rc"), {"DG_BN": 128, "DG_PINGPONG": 1}),             # 1024 tiles of 128x128
    ((1024, 8192, 1024, "rc"), {"DG_BN": 256, "DG_PINGPONG": 0}),             # 512: too few turns
    ((4096, 768, 3072, "rc"), {"DG_BM": 128, "DG_BN": 192, "DG_SPLIT_K": 1}),   # 128 tiles, not 96
    ((128, 4096, 4096, "rc"), {"DG_BM": 64, "DG_BN": 64, "DG_SPLIT_K": 1}),     # 128 of 64x64, not 128x64 in 2 parts
    ((128, 14336, 4096, "rc"), {"DG_BM": 128, "DG_BN": 128, "DG_SPLIT_K": 1}),
    ((64, 4096, 14336, "rr"), {"DG_BM": 64, "DG_BN": 64, "DG_SPLIT_K": 1}),     # 64 tiles: 48 % of the SMs
    ((64, 3072, 4096, "rr"), {"DG_BM": 64, "DG_BN": 64, "DG_SPLIT_K": 2}),      # 48 tiles: 36 %, split
    ((16, 14336, 4096, "rr"), {"DG_BM": 64, "DG_BN": 128, "DG_SPLIT_K": 1}),
    ((1, 768, 3072, "rr"), {"DG_BM": 64, "DG_BN": 64, "DG_SPLIT_K": 4}),       # 12 tiles: none fills, 4 of 768
    ((16, 1024, 4096, "rr"), {"DG_BM": 64, "DG_BN": 64, "DG_SPLIT_K": 4}),     # 16 tiles: none fills, 4
    ((512, 512, 4096, "rr"), {"DG_BM": 64, "DG_BN": 64, "DG_SPLIT_K": 1}),     # 64 tiles: the blocks of 128x64 in 2
    ((512, 512, 4096, "rc"), {"DG_BM": 64, "DG_BN": 64, "DG_SPLIT_K": 1}),     # parts, no partial sums; not 128 x 96
    ((128, 2304, 3072, "rc"), {"DG_BM": 64, "DG_BN": 64, "DG_SPLIT_K": 1}),    # in 4 parts (slower), likewise
    ((256, 768, 3072, "rc"), {"DG_BM": 128, "DG_BN": 64, "DG_SPLIT_K": 4}),    # 48 tiles of 64x64 (36 %): split
    ((512, 3072, 768, "rr"), {"DG_BM": 128, "DG_BN": 128, "DG_SPLIT_K": 1}),
    ((512, 768, 3072, "rc"), {"DG_BM": 64, "DG_BN": 64, "DG_SPLIT_K": 1}),      # 96 tiles of 64x64 over the whole K
    ((512, 768, 3072, "rc", "epilogue"), {"DG_BM": 64, "DG_BN": 64, "DG_SPLIT_K": 1}),
    ((512, 512, 64, "rc"), {"DG_BM": 64, "DG_BN": 64, "DG_SPLIT_K": 1}),        # 64 tiles of 64x64 (K = 64)
    # Where a width's efficiency decides between widths whose waves are close:
    ((640, 10048, 4096, "rc"), {"DG_BM": 128, "DG_BN": 128, "DG_SPLIT_K": 1}),  # 395 tiles: 3 waves of 128
    ((768, 6144, 1024, "rc"), {"DG_BM": 128, "DG_BN": 96, "DG_SPLIT_K": 1}),    # 384 tiles of 96: 3 waves
]


@pytest.mark.skipif("v5" not in registry.names(), reason="the v5 kernel is not registered")
@pytest.mark.parametrize("shape,expected", V5_RULE_CASES, ids=lambda x: "x".join(map(str, x)) if isinstance(x, tuple) else None)
def test_v5_rule_sizes_tiles_and_splits_by_how_many_fill_the_sms(shape, expected):
    m, n, k, layout = shape[:4]
    epilogue = Epilogue(bias="float16", activation="gelu", residual="float16") if shape[4:] else None
    problem = dispatch.shape_problem(m, n, k, layout=layout, epilogue=epilogue)
    cfg = registry.get("v5").config_defines(dispatch.v5_config(problem, 132)[0])
    assert {key: cfg[key] for key in expected} == expected
    assert registry.get("v5").config_supports(cfg, problem) is None


@pytest.mark.parametrize("layout", ["rr", "rc", "cr", "cc"])
@pytest.mark.parametrize("m,n,k", [(37, 45, 19), (5, 3, 0), (0, 8, 16)])
def test_shape_problem_describes_aligned_tightly_packed_operands(layout, m, n, k):
    """explain() and the tuner's planning decide for what gemm() sees with 16-byte aligned bases and
    tight rows or columns (a leading dimension of at least 1, as BLAS asks, where an extent is 0)."""
    problem = dispatch.shape_problem(m, n, k, layout=layout)
    for mat, rows, cols, row_major in ((problem.a, m, k, layout[0] == "r"), (problem.b, k, n, layout[1] == "r")):
        assert (mat.rows, mat.cols, mat.row_major) == (rows, cols, row_major)
        assert mat.ptr % 16 == 0
        assert mat.ld == max(cols if row_major else rows, 1)


@pytest.mark.skipif("v5" not in registry.names(), reason="the v5 kernel is not registered")
def test_v5_rule_counts_tiles_as_enough_from_70_percent_of_the_sms():
    # 896 x 256: 7 tiles of 128x256, one wave and the fewest columns per tile when they count as
    # filling the SMs: exactly 70 % of 10 SMs does, 7 of 11 (64 %) does not.
    problem = dispatch.shape_problem(896, 256, 4096)
    widths = {sms: registry.get("v5").config_defines(dispatch.v5_config(problem, sms)[0])["DG_BN"]
              for sms in (10, 11)}
    assert widths[10] == 256 and widths[11] != 256, widths


@pytest.mark.skipif("v5" not in registry.names(), reason="the v5 kernel is not registered")
def test_v5_rule_counts_64_row_tiles_over_the_whole_k_as_enough_from_45_percent_of_the_sms():
    # 64 x 4096: 64 tiles of 64x64, unsplit where they are 45 % of the SMs or more (64 of 142 is
    # exactly 45 %), split in two where fewer (64 of 143, 44.8 %).
    problem = dispatch.shape_problem(64, 4096, 4096)
    splits = {sms: registry.get("v5").config_defines(dispatch.v5_config(problem, sms)[0])["DG_SPLIT_K"]
              for sms in (142, 143)}
    assert splits == {142: 1, 143: 2}, splits


@pytest.mark.skipif("v5" not in registry.names(), reason="the v5 kernel is not registered")
def test_v5_rule_takes_64_row_tiles_over_the_whole_k_past_64_rows_from_45_percent_of_the_sms():
    # 128 x 576: 9 tiles of 128x64 fill too few SMs; 18 of 64x64 over the whole K are exactly 45 %
    # of 40 SMs (taken), 43.9 % of 41 (split K instead).
    problem = dispatch.shape_problem(128, 576, 4096)
    partial, why = dispatch.v5_config(problem, 40)
    full = registry.get("v5").config_defines(partial)
    assert (full["DG_BM"], full["DG_BN"], full["DG_SPLIT_K"]) == (64, 64, 1)
    assert why == "9 tiles of 128 rows leave SMs idle: 18 tiles of 64x64 over the whole K"
    # Rows one past a tile edge count a whole tile more: 257 rows are 3 tiles of 128, 5 of 64, so
    # 257 x 576 makes 45 tiles of 64x64, exactly 45 % of 100 SMs (taken), not of 101.
    assert dispatch.v5_config(dispatch.shape_problem(257, 1024, 4096), 132)[1] == \
        "48 tiles of 128 rows leave SMs idle: 80 tiles of 64x64 over the whole K"
    rows = {sms: registry.get("v5").config_defines(dispatch.v5_config(dispatch.shape_problem(257, 576, 4096),
                                                                      sms)[0])["DG_BM"] for sms in (100, 101)}
    assert rows == {100: 64, 101: 128}, rows
    assert dispatch.v5_config(dispatch.shape_problem(257, 576, 4096), 101)[1] == (
        "27 tiles of 128x64 leave SMs idle and no split of K=4096 into parts of at least 768 (2, 4) fills them: "
        "the most parts that fit, up to 4: 2 (54 tiles)")
    full = registry.get("v5").config_defines(dispatch.v5_config(problem, 41)[0])
    assert (full["DG_BM"], full["DG_SPLIT_K"]) == (128, 2)


@pytest.mark.skipif("v5" not in registry.names(), reason="the v5 kernel is not registered")
def test_v5_rule_sizes_64_row_tiles_by_their_waves_up_to_exactly_64_rows():
    # At M = 64 a 128-row tile would be half zero fill: 64-row tiles, sized as whole waves of them.
    why = dispatch.v5_config(dispatch.shape_problem(64, 4096, 4096), 132)[1]
    assert why.startswith("64 tiles of 64x") and "of the widths whose tiles fill enough of 132 SMs" in why
    assert "tiles of 128 rows leave SMs idle" in dispatch.v5_config(dispatch.shape_problem(65, 4096, 4096), 132)[1]


def test_small_m_says_how_many_rows_its_block_covers():
    for limit, cfg in dispatch.SMALL_M_CONFIGS:
        partial, why = dispatch.small_m_config(dispatch.shape_problem(limit, 4096, 4096), 132)
        assert partial == cfg and why == f"{16 * cfg['DG_SMALL_M_MT']}-row blocks: one row block covers M={limit}"


def test_rule_configs_lists_every_config_a_rule_can_hand_out():
    """rule_configs is what the verification sweep runs at tile edges: it must hold each config a
    kernel's rule returns, over shapes from decode to large, every layout and SM count."""
    for kernel, rule in dispatch.CONFIG_RULES.items():
        spec, listed = registry.get(kernel), dispatch.rule_configs(kernel)
        got = set()
        for m in (1, 16, 17, 32, 33, 64, 65, 128, 512, 4096):
            for n, k in ((64, 64), (768, 3072), (4096, 4096), (14336, 4096), (512, 16384)):
                for layout in ("rr", "rc", "cr", "cc"):
                    for sms in (8, 132):
                        full = spec.config_defines(rule(dispatch.shape_problem(m, n, k, layout=layout), sms)[0])
                        assert full in listed, (kernel, m, n, k, layout, sms, full)
                        got.add(tuple(sorted(full.items())))
        assert len(got) >= 2, (kernel, got)   # the rule does choose
    # ...and no ping-pong config V5's rule never hands out (it takes ping-pong only unsplit, at
    # V5_PINGPONG_WIDTH): each listed config costs the quick sweep its tile edges.
    pingpong = [c for c in dispatch.rule_configs("v5") if c["DG_PINGPONG"]]
    assert pingpong and all((c["DG_BN"], c["DG_SPLIT_K"]) == (dispatch.V5_PINGPONG_WIDTH, 1) for c in pingpong)


def test_every_config_a_rule_hands_out_is_in_its_kernels_config_space():
    """The config space is what the tuner times, `static --all` builds and the sweep runs at tile
    edges: a rule that hands out anything else would launch a build nothing checked."""
    for kernel in dispatch.CONFIG_RULES:
        spec = registry.get(kernel)
        space = [spec.config_defines(c) for c in spec.config_space]
        for full in dispatch.rule_configs(kernel):
            assert full in space, (kernel, full)


def test_v5_splits_k_down_to_parts_of_exactly_the_minimum():
    """On 132 SMs, 256x768xK is 24 tiles of 128x64 (and 48 of 64x64, too few over the whole K):
    split 2 gives 48 (too few), split 4 gives 96 in parts of exactly V5_SPLIT_MIN_K, within the 75 %
    of the SMs clusters of 4 may take. At 256x896xK (28 tiles) 4 parts would take 112 blocks: 2.
    Where no split fills the SMs (8 tiles
    of 128x64, or parts 2 short of the minimum leaving only split 2), the most parts that fit, up
    to 4, and say why; none below K = 2 x V5_SPLIT_MIN_K."""
    cfg = lambda m, n, k: dispatch.v5_config(dispatch.shape_problem(m, n, k), 132)
    full_of = lambda partial: registry.get("v5").config_defines(partial)
    split_width = lambda partial: (full_of(partial)["DG_SPLIT_K"], full_of(partial)["DG_BN"])
    assert split_width(cfg(256, 768, 4 * dispatch.V5_SPLIT_MIN_K)[0]) == (4, 64)
    partial, why = cfg(256, 896, 4 * dispatch.V5_SPLIT_MIN_K)
    assert split_width(partial) == (2, 64) and "the most parts that fit, up to 4: 2 (56 tiles)" in why
    short = 4 * dispatch.V5_SPLIT_MIN_K - 8
    partial, why = cfg(256, 896, short)                                  # parts 2 short: only split 2, too few
    assert split_width(partial) == (2, 64)
    assert f"no split of K={short} into parts of at least {dispatch.V5_SPLIT_MIN_K} (2) fills them" in why
    partial, why = cfg(128, 512, 8 * dispatch.V5_SPLIT_MIN_K)
    assert split_width(partial) == (4, 64)
    assert (f"no split of K={8 * dispatch.V5_SPLIT_MIN_K} into parts of at least {dispatch.V5_SPLIT_MIN_K} (2, 4, 8) "
            f"fills them: the most parts that fit, up to 4: 4 (32 tiles)") in why
    for k in (2 * dispatch.V5_SPLIT_MIN_K - 8, 1000):
        partial, why = cfg(128, 512, k)
        assert full_of(partial)["DG_SPLIT_K"] == 1 and f"K={k} is too short to split" in why


def test_v5_rule_thresholds_hold_at_their_exact_values():
    """Each threshold of V5's rules taken at equality: ping-pong at exactly 7 tiles per SM, a split
    whose tiles exactly reach 70 % of the SMs, grouped 256-wide tiles exactly filling the SMs, grouped
    64-row tiles at exactly 64 rows, a grouped tile exactly as wide as N."""
    v5 = registry.get("v5")
    full = lambda rule, problem, sms: v5.config_defines(rule(problem, sms)[0])
    pp = dispatch.shape_problem(4 * 128, 7 * 128, 512)                        # 28 tiles of 128x128, K <= 1024
    assert full(dispatch.v5_config, pp, 4)["DG_PINGPONG"] == 1 and full(dispatch.v5_config, pp, 5)["DG_PINGPONG"] == 0
    # ... and at the longest K it takes: 1024 plain, 2048 with an epilogue (whose cost it hides).
    epi = Epilogue(bias="float16", activation="gelu")
    for k, epilogue, on in ((1024, None, 1), (1025, None, 0), (2048, epi, 1), (2049, epi, 0)):
        problem = dispatch.shape_problem(4 * 128, 7 * 128, k, epilogue=epilogue)
        assert full(dispatch.v5_config, problem, 4)["DG_PINGPONG"] == on, (k, epilogue)
    split = full(dispatch.v5_config, dispatch.shape_problem(64, 448, 8192), 20)    # 7 tiles of 64x64; 0.7 x 20 = 14
    assert (split["DG_SPLIT_K"], split["DG_BN"]) == (2, 64)
    # Too short a K to split: the narrowest tile, its count in the explanation.
    assert dispatch.v5_config(dispatch.shape_problem(128, 256, 64), 132)[1] == \
        "4 tiles leave SMs idle and K=64 is too short to split: 128x64 tiles"
    # ... chosen as the first split whose tiles are enough (exactly 14), not as the deepest that fits.
    assert dispatch.v5_config(dispatch.shape_problem(64, 448, 8192), 20)[1] == \
        "7 tiles of 64x64 leave SMs idle: split K in 2 (14 tiles)"
    # 6 tiles of 128x64 in 4 parts: 24 blocks, exactly 75 % of 32 SMs (a cluster of 4 fits); of 31, not.
    four = {sms: full(dispatch.v5_config, dispatch.shape_problem(128, 384, 4096), sms)["DG_SPLIT_K"] for sms in (32, 31)}
    assert four == {32: 4, 31: 2}, four
    grouped = registry.Problem(256, 512, 256, groups=registry.Groups("batch", 4))   # 8 row tiles x 2 of 256 columns
    assert full(dispatch.v5_grouped_config, grouped, 16)["DG_BN"] == 256
    assert full(dispatch.v5_grouped_config, grouped, 17)["DG_BN"] == 128
    # One row and one column past a tile: 2 x 4 groups x 2 = 16 tiles, rounded up both ways.
    edge = registry.Problem(129, 257, 256, groups=registry.Groups("batch", 4))
    assert full(dispatch.v5_grouped_config, edge, 16)["DG_BN"] == 256
    assert full(dispatch.v5_grouped_config, edge, 17)["DG_BN"] == 128
    # 64-row tiles for batches and masked groups of at most 64 rows: at 64 itself, not at 65.
    for mode in ("batch", "masked"):
        rows = {m: full(dispatch.v5_grouped_config, registry.Problem(m, 4096, 4096, groups=registry.Groups(mode, 8)),
                        132)["DG_BM"] for m in (64, 65)}
        assert rows == {64: 64, 65: 128}, (mode, rows)
    # The narrowest tile that covers N: attention's 64-wide heads in 64 columns, 65 in 128.
    widths = {n: full(dispatch.v5_grouped_config, registry.Problem(512, n, 512, groups=registry.Groups("batch", 64)),
                      132)["DG_BN"] for n in (64, 65, 128)}
    assert widths == {64: 64, 65: 128, 128: 128}, widths
    # N up to 256 is not "one tile" by itself: 8 tiles of 128x256 leave 17 SMs idle, so 128 columns.
    assert full(dispatch.v5_grouped_config, registry.Problem(256, 256, 256, groups=registry.Groups("batch", 4)),
                17)["DG_BN"] == 128
    # Every 128-row pick is its width's cooperative config, K unsplit, one block per cluster.
    narrow = registry.Problem(512, 64, 512, groups=registry.Groups("batch", 64))
    for problem, sms in ((grouped, 16), (grouped, 17), (edge, 17), (narrow, 132)):
        cfg = full(dispatch.v5_grouped_config, problem, sms)
        assert (cfg["DG_BM"], cfg["DG_SPLIT_K"], cfg["DG_PINGPONG"], cfg["DG_CLUSTER_M"]) == (128, 1, 0, 1), cfg


def test_shape_problem_defaults_and_empty_sizes():
    p = dispatch.shape_problem(0, 64, 32, in_dtype="bf16")
    assert (p.m, p.in_dtype, p.out_dtype) == (0, "bfloat16", "bfloat16")    # out_dtype: the input's by default
    assert dispatch.shape_problem(8, 8, 8, out_dtype="float32").out_dtype == "float32"
    with pytest.raises(ValueError, match="^k: expected a non-negative int, got -1"):   # a wrong value
        dispatch.shape_problem(8, 8, -1)
    with pytest.raises(TypeError, match="^k: expected a non-negative int, got 1.0"):   # a wrong type
        dispatch.shape_problem(8, 8, 1.0)


def test_v5_rule_options_are_the_plain_tma_store_configs():
    for (bm, bn, split, pp), c in dispatch._v5_rule_options().items():
        full = registry.get("v5").config_defines(c)
        assert (full["DG_BM"], full["DG_BN"], full["DG_SPLIT_K"], full["DG_PINGPONG"]) == (bm, bn, split, pp)
        assert full["DG_GROUP_M"] == 8 and full["DG_EPI_TMA"] == 1, full


@pytest.mark.skipif("v5" not in registry.names(), reason="the v5 kernel is not registered")
@pytest.mark.parametrize("layout", ["rr", "rc", "cr", "cc"])
def test_v5_rule_picks_only_configs_the_problem_allows(layout):
    """...and each of them is one the quick sweep runs at its tile edges (dispatch.rule_configs)."""
    spec = registry.get("v5")
    swept = dispatch.rule_configs("v5")
    for m in (1, 17, 64, 65, 128, 300, 512, 1000, 4096):
        for n in (8, 64, 96, 200, 768, 3072, 14336):
            for k in (8, 64, 1000, 2048, 4096, 16384):
                problem = dispatch.shape_problem(m, n, k, layout=layout)
                partial, why = dispatch.v5_config(problem, 132)
                cfg = spec.config_defines(partial)
                assert spec.config_supports(cfg, problem) is None, (m, n, k, layout, cfg, why)
                assert cfg["DG_SPLIT_K"] == 1 or k / cfg["DG_SPLIT_K"] >= dispatch.V5_SPLIT_MIN_K, (m, n, k, cfg)
                assert cfg["DG_BM"] == 64 or m > 64, (m, cfg)                     # 64-row tiles above 64
                assert cfg["DG_BM"] == 128 or m <= 64 or cfg["DG_SPLIT_K"] == 1, (m, cfg)   # rows: over the whole K
                assert cfg in swept
                assert not cfg["DG_PINGPONG"] or (k <= 1024 and m * n >= 7 * 132 * 128 * 128), (m, n, k, cfg)


@pytest.mark.skipif("v5" not in registry.names(), reason="the v5 kernel is not registered")
def test_v5_rule_stays_near_the_fastest_config_the_shipped_table_timed():
    """Against every V5 config the H200 table timed per bucket with the tile rows of the rule's pick
    (64 for M <= 64, and above where 128-row tiles leave SMs idle): the rule's pick costs at most
    3 % over the fastest on geometric mean and 10 % at worst (its default: up to 3.3x). Against every
    timed config, of either row count, at most 2 % on geometric mean and 18 % at worst. A bucket
    tuned before the rule's pick was in the config space never timed it: it cannot judge the pick,
    and is left out (the M <= 16 buckets for the 64x64 tiles over the whole K)."""
    spec = registry.get("v5")
    table = json.loads((tuned.SHIPPED_DIR / "NVIDIA_H200.json").read_text())
    sm_count = int(table["gpu"]["sm_count"])
    ratios, overall, untimed = [], [], []
    for key, e in table["entries"].items():
        m, n, k = e["shape"]
        layout = key.split(".")[4]
        problem = dispatch.shape_problem(m, n, k, layout=layout, epilogue=True if ".epi1." in key else None)
        pick_config = spec.config_defines(dispatch.v5_config(problem, sm_count)[0])
        rows = pick_config["DG_BM"]
        assert rows == 64 or m > 64, (key, pick_config)
        timed, every = {}, {}
        for label, us in e["candidates"].items():
            if label.startswith("v5") and isinstance(us, (int, float)) and label in e.get("configs", {}):
                full = spec.config_defines(e["configs"][label])
                name = json.dumps(full, sort_keys=True)
                every[name] = us
                if full["DG_BM"] == rows:
                    timed[name] = us
        if len(every) < 10:
            continue
        pick = json.dumps(pick_config, sort_keys=True)
        if pick not in every:
            untimed.append(key)
            continue
        assert pick in timed, (key, pick)
        ratios.append(timed[pick] / min(timed.values()))
        overall.append(timed[pick] / min(every.values()))
    assert len(ratios) >= 40 and len(untimed) <= len(ratios) // 2, (len(ratios), untimed)
    geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    assert geomean <= 1.03 and max(ratios) <= 1.10, (geomean, max(ratios))
    overall_geomean = math.exp(sum(math.log(r) for r in overall) / len(overall))
    assert overall_geomean <= 1.02 and max(overall) <= 1.18, (overall_geomean, max(overall))


def test_large_shapes_go_to_the_preferred_large_kernel(tables):
    spec, _ = dispatch.choose(prob(4096, 4096, 4096))
    assert spec.name == ("v5" if "v5" in registry.names() else "v4")
    assert dispatch.choose(prob(4096, 4096, 4096, cc=80))[0].name == "v4"
    assert dispatch.choose(prob(65, 4096, 4096, cc=80))[0].name == "v4"     # just past small_m's limit


def test_among_kernels_of_no_preference_the_first_candidate_is_taken():
    """A kernel registered by a user has no place in the preference order: alone, or with another
    such, auto takes the first candidate, and says why."""
    assert dispatch.heuristic(prob(4096, 4096, 4096), ["mine", "theirs"]) == ("mine", "the only kind of candidate left")
    assert dispatch.heuristic(prob(4096, 4096, 4096), ["mine", "v2"])[0] == "v2"
    assert dispatch.heuristic(prob(4, 4096, 4096), ["v4", "v3"])[0] == "v4"   # decode, small_m not a candidate


@pytest.mark.skipif("v5" not in registry.names(), reason="the v5 kernel is not registered")
def test_v5_rule_falls_back_to_the_default_config_when_none_of_its_options_fits(monkeypatch):
    problem = dispatch.shape_problem(16, 1024, 4096, layout="rr")      # few tiles: the rule would split K
    options = dispatch._v5_rule_options()
    monkeypatch.setattr(dispatch, "_v5_rule_options", lambda: {})
    assert dispatch.v5_config(problem, 132) == (None, "its default (no config_space entry suits the problem)")
    split_only = {key: c for key, c in options.items() if key[2] > 1 and key[1] > 64}   # nothing at 64 wide, unsplit
    monkeypatch.setattr(dispatch, "_v5_rule_options", lambda: split_only)
    assert dispatch.v5_config(dispatch.shape_problem(16, 64, 64, layout="rr"), 132) == (None, "its default")


def test_v4_counts_the_tiles_of_every_group(tables):
    # Batches of 512 x 512: 8 batches are 8 x 4 x 4 = 128 tiles of 128x128 (below 132 SMs: the
    # smallest tile), 9 batches 144 (the default).
    small = min(registry.get("v4").config_space, key=lambda c: c["DG_BM"] * c["DG_BN"])
    for count, want in ((8, small), (9, None)):
        p = registry.Problem(512, 512, 512, "float16", "float16", groups=registry.Groups("batch", count))
        assert dispatch.v4_grouped_config(p, 132)[0] == want, count


def test_fp16_accumulation_from_sm_80_and_a_config_must_be_a_dict(tables):
    assert dispatch.choose(prob(64, 64, 64, cc=80), accumulate="fp16")[0].name == "fp16acc_mma"
    with pytest.raises(ValueError, match=r"needs compute capability >= 8\.0 \(fp16acc_mma\), this GPU has 7\.5$"):
        dispatch.choose(prob(64, 64, 64, cc=75), accumulate="fp16")
    with pytest.raises(TypeError, match="^config: expected a dict of tile parameters, got list"):
        dispatch.choose(prob(512, 512, 512), kernel="v4", config=[("DG_BM", 64)])


def test_candidates_say_why_a_kernel_is_out():
    _, rejected = dispatch.candidates(prob(512, 512, 512, cc=80))
    assert rejected["v5"] == "needs compute capability >= 9.0"


def test_v4_takes_its_smallest_tile_when_128_tiles_cannot_fill_the_gpu(tables):
    spec, cfg = dispatch.choose(prob(512, 512, 64, cc=80))
    smallest = min(spec.config_space, key=lambda c: c["DG_BM"] * c["DG_BN"])
    assert spec.name == "v4" and cfg == smallest
    assert dispatch.choose(prob(4096, 4096, 4096, cc=80))[1] == registry.get("v4").default_config


def test_small_m_refuses_large_m_with_a_reason():
    reason = registry.get("small_m").supports(Problem(65, 8, 8))
    assert "M=65" in reason and "64" in reason
    with pytest.raises(ValueError, match=r"^kernel: 'small_m' cannot run this problem: M=100 is over"):
        dispatch.choose(prob(100, 64, 64), kernel="small_m")


def test_named_small_m_without_config_covers_m_in_one_row_block():
    assert dispatch.choose(prob(40, 64, 64), kernel="small_m")[1]["DG_SMALL_M_MT"] == 4
    assert dispatch.choose(prob(40, 64, 64), kernel="small_m", config={"DG_SMALL_M_MT": 1})[1]["DG_SMALL_M_MT"] == 1


def test_sweep_gives_small_m_only_shapes_it_supports():
    from deepgemm.testing import sweep
    cases = sweep.full_cases("small_m")
    assert cases and all(c.problem.m <= registry.SMALL_M_MAX for c in cases)
    assert {c.problem.b_layout for c in cases} == {"row", "col"} and any(c.problem.a_offset for c in cases)
    assert len(sweep.quick_cases("v4")) > len([c for c in sweep.quick_cases("v4") if c.problem.m <= 64])


# ---------------------------------------------------------------- the decision cache

def test_repeated_shapes_hit_the_cache(tables, monkeypatch):
    p = prob(4, 4096, 4096)
    first = dispatch.choose(p)
    calls = []
    monkeypatch.setattr(dispatch, "decide", lambda *a, **k: calls.append(a))
    again = prob(4, 4096, 4096, a=mat(4, 4096, ptr=1 << 30), b=mat(4096, 4096, False, ptr=1 << 32))
    assert dispatch.choose(again) is first and not calls       # other (aligned) pointers: same decision
    dispatch.clear_cache()
    assert not dispatch._decisions


def _prefer_fussy(monkeypatch, summary, supports, grouped=False) -> None:
    """Register a kernel "auto" tries first, which supports() limits to some B layouts."""
    fussy = registry.KernelSpec(
        name="fussy", file="v0_naive.cu", summary=summary, min_cc=70, tile=lambda c: (8, 32),
        block=lambda c: (32, 8, 1), default_config={}, supports=supports, grouped=grouped)
    monkeypatch.setitem(registry._REGISTRY, "fussy", fussy)
    monkeypatch.setattr(dispatch, "AUTO_PREFERENCE", ("fussy",) + dispatch.AUTO_PREFERENCE)
    dispatch.clear_cache()


def test_cache_keys_on_alignment_so_supports_is_never_stale(tables, monkeypatch):
    """A kernel whose supports() refuses a misaligned B must not be reused from the cache for it."""
    _prefer_fussy(monkeypatch, "aligned B only",
                  lambda p: None if p.b is None or p.b.ptr % 16 == 0 else "misaligned B")
    aligned = prob(256, 256, 256)
    misaligned = prob(256, 256, 256, b=mat(256, 256, False, ptr=(1 << 20) + 2))
    assert dispatch.choose(aligned)[0].name == "fussy"
    assert dispatch.choose(misaligned)[0].name != "fussy"
    assert dispatch.choose(aligned)[0].name == "fussy"
    dispatch.clear_cache()


def test_cache_keys_on_the_leading_dimensions_alignment(tables, monkeypatch):
    """Likewise a leading dimension that is not a multiple of 8 elements (16 bytes), whatever
    its other bits: 260 = 256 + 4 must not share a decision with 272 = 256 + 16."""
    _prefer_fussy(monkeypatch, "16-byte rows of B only",
                  lambda p: None if p.b is None or p.b.ld % 8 == 0 else "B's rows not 16-byte aligned")
    assert dispatch.choose(prob(256, 256, 256, b=mat(256, 256, False, ld=272)))[0].name == "fussy"
    assert dispatch.choose(prob(256, 256, 256, b=mat(256, 256, False, ld=260)))[0].name != "fussy"
    assert dispatch.choose(prob(256, 256, 256, b=mat(256, 256, False, ld=264)))[0].name == "fussy"
    dispatch.clear_cache()


def test_cache_keys_on_the_group_strides_alignment(tables, monkeypatch):
    """A batch whose A steps 12 elements per group (not 16 bytes) must not share a decision with
    one stepping 8 or 16, nor a shared operand (stride 0) with a stepped one."""
    _prefer_fussy(monkeypatch, "16-byte group strides of A only",
                  lambda p: None if p.groups is None or p.groups.stride_a % 8 == 0 else "A's groups not 16-byte apart",
                  grouped=True)

    def batch(stride_a):
        p = prob(256, 256, 256)
        return Problem(p.m, p.n, p.k, p.in_dtype, p.out_dtype, p.a, p.b, p.epilogue, p.cc,
                       groups=registry.Groups("batch", 4, stride_a=stride_a, stride_d=256 * 256))
    assert dispatch.choose(batch(8 * 256 * 256))[0].name == "fussy"
    assert dispatch.choose(batch(12))[0].name != "fussy"
    assert dispatch.choose(batch(16))[0].name == "fussy"
    assert dispatch.choose(batch(0))[0].name == "fussy"
    dispatch.clear_cache()


@pytest.mark.parametrize("change", ["dtype", "cc", "epilogue", "layout", "device", "out_dtype"])
def test_cache_key_changes_with_everything_that_matters(change):
    base = prob(16, 4096, 4096)
    other = {"dtype": prob(16, 4096, 4096, "bfloat16"), "cc": prob(16, 4096, 4096, cc=80),
             "epilogue": prob(16, 4096, 4096, epilogue=Epilogue(bias="float16")),
             "layout": prob(16, 4096, 4096, b=mat(4096, 4096)), "device": prob(16, 4096, 4096, device=1),
             "out_dtype": Problem(16, 4096, 4096, "float16", "float32", base.a, base.b, base.epilogue, 90)}[change]
    assert dispatch.cache_key(base, "auto", None, "fp32") != dispatch.cache_key(other, "auto", None, "fp32")


def test_cached_choose_is_cheap(tables):
    p = prob(1, 4096, 4096)
    dispatch.choose(p)
    n = 20000
    t = time.perf_counter()
    for _ in range(n):
        dispatch.choose(p)
    per_call_us = (time.perf_counter() - t) / n * 1e6
    assert per_call_us < 25, f"{per_call_us:.1f} us per cached choose()"   # ~1.5 us on a slow shared CPU


# ---------------------------------------------------------------- tuned tables

def entry(kernel, config=None, shape=(16, 4096, 4096), us=10.0):
    return {"kernel": kernel, "config": config or {}, "shape": list(shape), "us": us}


BUCKET = "m16.n4096.k4096.float16.rc.epi0.sm90"
NO_TABLE_PICK = "v5"   # the heuristics' kernel at BUCKET's shape: V5 beside small_m at a 4096 x 4096 weight


def test_no_table_means_heuristics_and_no_error(tables, recwarn):
    spec, _ = dispatch.choose(prob(16, 4096, 4096))
    assert spec.name == NO_TABLE_PICK
    assert any("no file" in n for n in tuned.for_device(0).notes)
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]   # a missing table is normal


def test_a_tuned_entry_overrides_the_heuristic(tables):
    tables("shipped", {BUCKET: entry("v4", {"DG_STAGES": 3})})
    spec, cfg = dispatch.choose(prob(16, 4096, 4096))
    default = registry.get("v4").default_config
    assert spec.name == "v4" and cfg["DG_STAGES"] == 3 and cfg["DG_BM"] == default["DG_BM"]   # the rest: defaults
    assert dispatch.choose(prob(16, 4096, 4096, device=None))[0].name == NO_TABLE_PICK   # no device, no table


def test_user_table_wins_over_the_shipped_one(tables):
    tables("shipped", {BUCKET: entry("v4")})
    tables("user", {BUCKET: entry("small_m", {"DG_SMALL_M_WARPS": 16, "DG_SMALL_M_UNROLL": 2})})
    spec, cfg = dispatch.choose(prob(16, 4096, 4096))
    assert spec.name == "small_m" and cfg["DG_SMALL_M_WARPS"] == 16


@pytest.mark.parametrize("content,why", [
    (b'{"format": 1, "gpu": {"name": "NVIDIA H2', "corrupt JSON"),                       # cut off mid-write
    (b"[1, 2, 3]", "not a format-1 deepgemm tuning table"),                                # another schema
    (b'{"format": 2, "gpu": {}, "entries": {}}', "format 2"),
    (b'{"format": 1, "gpu": {"name": "NVIDIA H200"}, "entries": []}', "'entries' is not an object"),
    (b"\xff\xfe{", "unreadable"),                                                          # not text
])
def test_a_corrupt_table_warns_naming_the_file_and_falls_back(tables, content, why):
    path = tables("user", {})
    path.write_bytes(content)
    dispatch.reload_tables()
    with pytest.warns(RuntimeWarning, match=r"tuning table .*NVIDIA_H200\.json: ignored, .*" + why):
        assert dispatch.choose(prob(16, 4096, 4096))[0].name == NO_TABLE_PICK


def test_another_gpus_table_warns_and_is_not_applied(tables):
    with pytest.warns(RuntimeWarning, match=r"NVIDIA_H200\.json: not applied, recorded on sm_count=114"):
        tables("user", {BUCKET: entry("v4")}, gpu={"name": "NVIDIA H200", "cc": "9.0", "sm_count": 114})
        assert dispatch.choose(prob(16, 4096, 4096))[0].name == NO_TABLE_PICK
    assert any("not applied" in n and "sm_count" in n for n in tuned.for_device(0).notes)


@pytest.mark.parametrize("bad,why", [
    (entry("no_such_kernel"), "names kernel 'no_such_kernel', which is not a registered gemm kernel"),
    (entry("fp16acc_mma"), "names kernel 'fp16acc_mma', which is not a registered gemm kernel"),   # report-only
    (entry("v0", {"DG_NOPE": 1}), r"kernel 'v0' has no parameter\(s\) \['DG_NOPE'\]"),            # stale config
    (entry("v0", [1, 2]), "its config is list"),
    ("v4", "entry is a str"),
])
def test_stale_entries_warn_and_fall_back_to_the_heuristic(tables, bad, why):
    with pytest.warns(RuntimeWarning, match=r"NVIDIA_H200\.json: 1 unusable entry ignored \(m16.*" + why):
        tables("user", {BUCKET: bad, "m1.n4096.k4096.float16.rc.epi0.sm90": entry("v4", shape=(1, 4096, 4096))})
        assert dispatch.choose(prob(16, 4096, 4096))[0].name == NO_TABLE_PICK
    assert dispatch.choose(prob(1, 4096, 4096))[0].name == "v4"            # the table's good entries still apply
    assert "ignored" in deepgemm.explain(16, 4096, 4096, device=0)
    assert any(n.endswith("NVIDIA_H200.json: 1 entry, 1 ignored") for n in tuned.for_device(0).notes)


@pytest.mark.parametrize("count", [4, 5])
def test_a_table_with_many_unusable_entries_lists_three_in_its_warning(tables, count):
    bad = {f"m{m}.n4096.k4096.float16.rc.epi0.sm90": entry("no_such_kernel", shape=(m, 4096, 4096))
           for m in (2, 4, 8, 16, 32)[:count]}
    with pytest.warns(RuntimeWarning, match=rf"{count} unusable entries ignored \((m\d+[^;]*; ){{3}}\.\.\.\)"):
        tables("user", bad)
        dispatch.choose(prob(16, 4096, 4096))
    assert sum(n.startswith("  ignored m") for n in tuned.for_device(0).notes) == count



def test_exactly_three_unusable_entries_are_all_listed_and_each_warning_comes_once(tables, recwarn):
    bad = {f"m{m}.n4096.k4096.float16.rc.epi0.sm90": entry("no_such_kernel", shape=(m, 4096, 4096))
           for m in (2, 4, 8)}
    tables("user", bad)
    dispatch.choose(prob(16, 4096, 4096))
    dispatch.choose(prob(4096, 4096, 4096))             # another decision from the same loaded table
    [w] = [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
    assert "3 unusable entries ignored (" in str(w.message) and "..." not in str(w.message)


def test_a_bucket_key_of_another_form_is_reported(tables):
    with pytest.warns(RuntimeWarning, match=r"'m16-n4096' is not a shape bucket"):
        tables("user", {"m16-n4096": entry("v4")})
        dispatch.choose(prob(16, 4096, 4096))


def test_an_entry_naming_a_config_the_kernel_refuses_for_the_problem_warns(tables):
    """v5's 96-wide tiles need a K-major B: an entry for a row-major-B bucket naming one is a bad
    table, not a crash: a warning, and the heuristic."""
    bucket = "m512.n4096.k4096.float16.rr.epi0.sm90"
    with pytest.warns(RuntimeWarning, match=r"entry m512\.n4096.*rr.* ignored: DG_BN=96 needs a column-major"):
        tables("user", {bucket: entry("v5", {"DG_BN": 96, "DG_STAGES": 6}, shape=(512, 3072, 3072))})
        spec, cfg = dispatch.choose(prob(512, 3072, 3072, b=mat(3072, 3072)))
    assert spec.name == "v5" and cfg["DG_BN"] % 64 == 0
    with warnings.catch_warnings():   # another shape of the bucket meets the entry again: no second warning
        warnings.simplefilter("error", RuntimeWarning)
        dispatch.choose(prob(500, 3072, 3072, b=mat(3072, 3072)))


def test_an_entry_the_problem_cannot_use_is_skipped(tables):
    with pytest.warns(RuntimeWarning, match="small_m"):
        tables("user", {"m128.n4096.k4096.float16.rc.epi0.sm90": entry("small_m", shape=(128, 4096, 4096))})
        assert dispatch.choose(prob(100, 4096, 4096))[0].name != "small_m"      # small_m refuses M=100
    text = deepgemm.explain(100, 4096, 4096, device=0)
    assert "(tuned entry m128.n4096.k4096.float16.rc.epi0.sm90 ignored: " in text, text


def test_epilogue_and_dtype_fall_back_to_the_nearest_tuned_bucket(tables):
    tables("user", {BUCKET: entry("v4")})
    assert dispatch.choose(prob(16, 4096, 4096, epilogue=Epilogue(bias="float16")))[0].name == "v4"
    assert dispatch.choose(prob(16, 4096, 4096, "bfloat16"))[0].name == "v4"


def test_the_same_dtype_without_the_epilogue_stands_in_before_the_other_dtype(tables):
    """Of two stand-ins for a bucket the table lacks, the same input dtype without the epilogue comes
    first (the same data movement and instructions plus a per-element tail), then the other 16-bit
    dtype: whichever order the entries are given in."""
    fp16_plain, bf16_epi = BUCKET, "m16.n4096.k4096.bfloat16.rc.epi1.sm90"
    bf16_plain, fp16_epi = "m16.n4096.k4096.bfloat16.rc.epi0.sm90", "m16.n4096.k4096.float16.rc.epi1.sm90"
    tables("user", {bf16_epi: entry("v5"), fp16_plain: entry("v4"), fp16_epi: entry("v5"), bf16_plain: entry("v4")})
    with_bias = Epilogue(bias="float32")
    assert dispatch.choose(prob(16, 4096, 4096, "float16", epilogue=with_bias))[0].name == "v5"   # its own bucket
    tables("user", {bf16_epi: entry("v5"), fp16_plain: entry("v4")})
    assert dispatch.choose(prob(16, 4096, 4096, "float16", epilogue=with_bias))[0].name == "v4"
    tables("user", {fp16_epi: entry("v5"), bf16_plain: entry("v4")})
    assert dispatch.choose(prob(16, 4096, 4096, "bfloat16", epilogue=with_bias))[0].name == "v4"


def test_tables_are_shared_with_the_tuner_and_written_atomically(tmp_path):
    path = tmp_path / "t.json"
    table = {"format": tuned.FORMAT, "gpu": H200, "entries": {BUCKET: entry("v4")}}
    tuned.write(path, table)
    assert tuned.read(path) == (table, None) and [p.name for p in tmp_path.iterdir()] == ["t.json"]
    assert path.read_text().endswith("}\n")                                        # a whole last line
    assert tuned.mismatch(H200, dict(H200, driver_version="1")) is None            # drivers do not matter
    assert "sm_count" in tuned.mismatch(H200, dict(H200, sm_count=114))
    assert tuned.read(tmp_path / "none.json") == (None, "no file")


# ---------------------------------------------------------------- a named kernel without a config

V4_SMALL = {"DG_BM": 64, "DG_BN": 64, "DG_BK": 32, "DG_WM": 32, "DG_WN": 32, "DG_STAGES": 4, "DG_SWIZZLE": 0}


@pytest.mark.parametrize("m,n,k,small", [(16, 4096, 4096, True), (1, 14336, 4096, True), (512, 768, 768, True),
                                         (512, 3072, 768, True), (4096, 4096, 4096, False), (2048, 2048, 512, False),
                                         # at the edge: 11 x 11 = 121 tiles of 128x128 do not fill 132 SMs,
                                         # 12 x 11 = 132 do (a partial tile counts as a tile)
                                         (1408, 1408, 512, True), (1536, 1408, 512, False), (1409, 1408, 512, False),
                                         (1408, 1409, 512, False)])
def test_named_v4_fits_its_tile_to_the_shape_as_auto_does(tables, m, n, k, small):
    """V4's 256x128 default leaves SMs idle on decode and BERT shapes: named without a config it
    takes its small tile where 128x128 tiles cannot fill the SMs, as "auto" configures it."""
    spec, cfg = dispatch.choose(prob(m, n, k), kernel="v4")
    want = dict(spec.default_config, **V4_SMALL) if small else spec.default_config
    assert cfg == want
    auto_v4 = dispatch.choose(prob(m, n, k, cc=80))        # off Hopper "auto" picks v4: the same config
    if auto_v4[0].name == "v4":
        assert auto_v4[1] == cfg


def test_named_v4_counts_this_gpus_sms(tables, gpus):
    gpus({0: dict(H200_FACTS, sm_count=16)})
    assert dispatch.choose(prob(512, 768, 768), kernel="v4")[1] == registry.get("v4").default_config   # 24 >= 16


def test_a_named_kernel_takes_its_fastest_tuned_config_for_the_bucket(tables):
    v4_mid = dict(registry.get("v4").default_config, DG_BM=128, DG_BN=128)
    bucket = "m512.n1024.k1024.float16.rc.epi0.sm90"
    tables("user", {bucket: entry("v5", {"DG_BN": 64, "DG_STAGES": 8}, shape=(512, 768, 768), us=7.9)
                    | {"candidates": {"v5[BN=64,STAGES=8]": 7.9, "v4": 12.0, "v4[BM=128,BN=128]": 9.0,
                                      "small_m": "error: M too large"},
                       "configs": {"v5[BN=64,STAGES=8]": {}, "v4": registry.get("v4").default_config,
                                   "v4[BM=128,BN=128]": v4_mid}}})
    assert dispatch.choose(prob(512, 768, 768))[0].name == "v5"                     # auto: the winner
    assert dispatch.choose(prob(512, 768, 768), kernel="v4")[1] == v4_mid           # named: its own best
    text = deepgemm.explain(512, 768, 768, kernel="v4", device=0)
    assert "chosen:     v4" in text and "'DG_BM': 128, 'DG_BN': 128" in text and "user table" in text
    assert "bucket:     m512.n1024.k1024" in text
    v5 = dispatch.choose(prob(512, 768, 768), kernel="v5")[1]
    assert v5["DG_BN"] == 64 and v5["DG_STAGES"] == 8                                # the winner's own config
    assert dispatch.choose(prob(512, 768, 768), kernel="v3")[1] == registry.get("v3").default_config


def test_a_named_kernel_with_a_config_keeps_it_and_small_m_takes_its_tuned_config(tables):
    tables("user", {BUCKET: entry("small_m", {"DG_SMALL_M_WARPS": 16, "DG_SMALL_M_UNROLL": 2})})
    assert dispatch.choose(prob(16, 4096, 4096), kernel="small_m")[1]["DG_SMALL_M_WARPS"] == 16
    cfg = dispatch.choose(prob(16, 4096, 4096), kernel="small_m", config={"DG_SMALL_M_WARPS": 4})[1]
    assert cfg["DG_SMALL_M_WARPS"] == 4 and cfg["DG_SMALL_M_UNROLL"] == 4             # the rest: defaults
    assert dispatch.choose(prob(16, 4096, 4096), kernel="v4", config={"DG_STAGES": 4})[1]["DG_BM"] == 256
    text = deepgemm.explain(16, 4096, 4096, kernel="v4", config={"DG_STAGES": 4}, device=0)
    assert "named: the caller's config" in text and "bucket:" not in text


def test_a_named_kernel_skips_a_tuned_config_the_problem_refuses(tables):
    tables("user", {"m512.n4096.k4096.float16.rr.epi0.sm90":
                    entry("v4", shape=(512, 3072, 3072)) | {"candidates": {"v5[BN=96]": 5.0},
                                                            "configs": {"v5[BN=96]": {"DG_BN": 96}}}})
    problem = prob(512, 3072, 3072, b=mat(3072, 3072))
    cfg = dispatch.choose(problem, kernel="v5")[1]   # row-major b: no BN=96
    assert cfg["DG_BN"] != 96
    assert cfg == registry.get("v5").config_defines(dispatch.v5_config(problem, dispatch.SM_COUNT_GUESS)[0])
    text = deepgemm.explain(512, 3072, 3072, layout="rr", kernel="v5", device=0)
    assert "(tuned config {'DG_BN': 96} of m512.n4096.k4096.float16.rr.epi0.sm90 ignored: DG_BN=96 needs" in text, text


def test_a_named_kernel_skips_a_tuned_config_with_a_parameter_it_no_longer_has(tables):
    """A candidate recorded by an older deepgemm (a parameter since removed) is skipped, never a
    crash: the kernel's next candidate serves, and explain() names its timing."""
    tables("user", {BUCKET: entry("v4") | {"candidates": {"v5[NOPE=1]": 5.0, "v5[BN=64]": 6.0},
                                           "configs": {"v5[NOPE=1]": {"DG_NOPE": 1},
                                                       "v5[BN=64]": {"DG_BN": 64, "DG_STAGES": 8}}}})
    spec, cfg = dispatch.choose(prob(16, 4096, 4096), kernel="v5")
    assert spec.name == "v5" and (cfg["DG_BN"], cfg["DG_STAGES"]) == (64, 8)
    text = deepgemm.explain(16, 4096, 4096, kernel="v5", device=0)
    assert "measured at 16x4096x4096, 6.0 us" in text, text


def test_a_named_kernel_refuses_an_input_dtype_it_does_not_take():
    """Checked in dispatch itself, not only by gemm(): explain() and the tuner reach it directly."""
    with pytest.raises(TypeError, match=r"kernel: 'fp16acc_mma' takes float16 inputs only, got bfloat16"):
        dispatch.choose(prob(64, 64, 64, dtype="bfloat16"), kernel="fp16acc_mma", accumulate="fp16")


@pytest.mark.parametrize("m,n,kernel", [(16, 1024, "small_m"), (17, 1024, "v5"), (64, 1024, "v5"),
                                         (16, 2048, "v5"), (1, 2048, "v5"), (1, 1024, "small_m")])
def test_without_a_table_small_m_keeps_up_to_16_rows_of_a_small_weight(tables, m, n, kernel):
    """Beside V5, small_m keeps M <= 16 only, and not x @ w.T with a weight of 4096 x 2048 or more
    (here N x 4096)."""
    assert dispatch.choose(prob(m, n, 4096))[0].name == kernel


# ---------------------------------------------------------------- reload and caches

def test_reload_tables_makes_gemm_decide_again(replayable, tables):
    """dispatch.reload_tables() forgets the decisions made from the old table, and so must gemm()'s
    repeat-call plans built on them: a replayed plan would keep running the old choice."""
    captured, replays, _ = replayable
    x, w = P(16, 4096), P(4096, 4096)
    tables("user", {BUCKET: entry("v4")})
    deepgemm.gemm(x, w.T)
    deepgemm.gemm(x, w.T)
    assert len(captured) == 1 and len(replays) == 1 and captured[0]["compiled"].name.startswith("v4[")
    tables("user", {BUCKET: entry("small_m")})            # writes the table, then dispatch.reload_tables()
    deepgemm.gemm(x, w.T)
    assert len(captured) == 2 and captured[1]["compiled"].name.startswith("small_m[")
    tables("user", {BUCKET: entry("v4")})
    deepgemm.clear_caches()
    deepgemm.gemm(x, w.T)
    assert len(captured) == 3 and captured[2]["compiled"].name.startswith("v4[")


# ---------------------------------------------------------------- explain and gemm()

def test_explain_says_bucket_candidates_choice_and_source(tables):
    text = deepgemm.explain(16, 14336, 4096, device=0)
    assert "bucket:     m16.n16384.k4096.float16.rc.epi0.sm90" in text
    assert "candidates:" in text and "small_m" in text and "heuristic" in text
    tables("user", {"m16.n16384.k4096.float16.rc.epi0.sm90": entry("v4", shape=(16, 14336, 4096), us=40.0)})
    text = deepgemm.explain(16, 14336, 4096, device=0)
    assert "chosen:     v4" in text and "user table" in text
    assert "bucket m16.n16384.k4096.float16.rc.epi0.sm90, tuned at 16x14336x4096, 40.0 us" in text
    bare = {"kernel": "v4", "config": {}}   # an entry without the shape it was tuned at, or its time
    tables("user", {"m16.n16384.k4096.float16.rc.epi0.sm90": bare})
    assert re.search(r"tuned at \?$", deepgemm.explain(16, 14336, 4096, device=0), re.M)
    text = deepgemm.explain(4096, 4096, 4096, cc=80, device=None)
    assert "not small_m: M=4096 is over" in text and "no GPU" in text


def test_explain_without_a_gpu_and_other_layouts():
    text = deepgemm.explain(1, 4096, 4096, layout="rr", epilogue=True, device=None)
    assert ".rr.epi1." in text and "small_m" in text
    with pytest.raises(ValueError, match="layout"):
        deepgemm.explain(1, 8, 8, layout="xx")
    for bad, error in ((dict(m=-1), ValueError), (dict(n=2.0), TypeError), (dict(k=True), TypeError)):
        sizes = dict(dict(m=1, n=8, k=8), **bad)
        [(arg, value)] = bad.items()
        with pytest.raises(error, match=f"^{arg}: expected a non-negative int, got {value!r}"):
            deepgemm.explain(**sizes, device=None)
    # what gemm() refuses, explain() refuses too, rather than pick a kernel for it
    limit = registry.MAX_SIZE
    for arg in ("m", "n", "k"):
        sizes = dict(dict(m=1, n=8, k=8), **{arg: limit + 1})
        with pytest.raises(ValueError, match=f"^{arg}: {limit + 1} exceeds the supported maximum {limit}"):
            deepgemm.explain(**sizes, device=None)
    assert "chosen:" in deepgemm.explain(1, 8, limit, device=None)
    # sizes read off arrays' shapes are often NumPy ints: taken as the ints they are
    assert (deepgemm.explain(np.int64(1), np.int32(4096), 4096, layout="rr", device=None)
            == deepgemm.explain(1, 4096, 4096, layout="rr", device=None))
    for cc in ("90", 9.0, True, 0):
        with pytest.raises(TypeError, match=r"^cc: expected a compute capability as a positive int"):
            deepgemm.explain(64, 64, 64, cc=cc, device=None)
    for epilogue in ("gelu", 1, False, {"bias": True}):
        with pytest.raises(TypeError, match=r"^epilogue: expected None, True or a deepgemm.registry.Epilogue, got "):
            deepgemm.explain(64, 64, 64, cc=90, device=None, epilogue=epilogue)
    for dev in (-1, "0", 1.0, True, "cuda:0"):
        with pytest.raises(TypeError, match=r"^device: expected a device id, 'current' or None, got "):
            deepgemm.explain(64, 64, 64, cc=90, device=dev)
    with pytest.raises(ValueError, match=r"^kernel: no registered kernel runs this problem on compute capability 6\.0: "
                                         r"v0: needs compute capability >= 7\.0"):
        deepgemm.explain(64, 64, 64, cc=60, device=None)
    with pytest.raises(ValueError, match=r"^accumulate: must be one of \('fp32', 'fp16'\), got 'fp8'"):
        deepgemm.explain(64, 64, 64, accumulate="fp8", device=None)
    # A named kernel: where its config came from, said once.
    why = lambda **kw: deepgemm.explain(512, 3072, 768, device=None, **kw).splitlines()[-1]
    assert why(kernel="v4") == "  why:        named: config: 96 tiles of 128x128 cannot fill 132 SMs: v4 with its smallest tile"
    assert why(kernel="v4", config={"DG_BM": 64}) == "  why:        named: the caller's config"
    assert why(kernel="fp16acc_simt", accumulate="fp16") == "  why:        named: its default config"


def test_gemm_routes_decode_to_small_m(captured, tables):
    x, w = F(4, 2048), F(2048, 2048)               # below 4096 x 2048 (there V5, its A box 8 rows)
    deepgemm.gemm(x, w.T)
    (launch,) = captured
    assert "small_m[float16->float16,rc," in launch["compiled"].name
    assert launch["grid"] == (2048 // 16, 1, 1) and launch["block"] == (256, 1, 1)
    assert launch["smem"] == 8 * 16 * 16 * 4


SMEM_SHAPES = [(4096, 4096, 4096), (8192, 8192, 1024), (512, 3072, 768), (777, 1234, 555), (64, 4096, 4096),
               (16, 14336, 4096), (1, 4096, 4096)]


@pytest.mark.parametrize("cc", sorted(registry.SMEM_OPTIN))
def test_no_choice_needs_more_shared_memory_than_the_gpu_gives_a_block(cc):
    """auto, a kernel named without a config and the batched rule pick configs that fit the GPU:
    on compute capability 8.6, 8.9 and 12.0 a block may have 99 KB, and V4's default 256x128 tiles
    need 144 KB (the launch would fail in the driver). Where the default fits, it stays."""
    limit = registry.smem_limit(cc)
    for m, n, k in SMEM_SHAPES:
        for layout in ("rc", "rr", "cr", "cc"):
            problem = dispatch.shape_problem(m, n, k, "float16", None, layout, None, cc, None)
            chosen = [dispatch.decide(problem)]
            for name in ("v4", "small_m"):
                if registry.get(name).supports(problem) is None:
                    chosen.append(dispatch._decide_any(problem, name, None, "fp32"))
            for d in chosen:
                assert d.spec.dynamic_smem(d.config) <= limit, (cc, m, n, k, layout, d.spec.name, d.config)
    batched = dispatch.shape_problem(4096, 4096, 4096, "float16", None, "rr", None, cc, None)
    v4 = registry.get("v4")
    partial, _ = dispatch.v4_grouped_config(dataclasses.replace(batched, groups=registry.Groups("batch", 8)), 132)
    assert v4.dynamic_smem(v4.config_defines(partial)) <= limit
    big, why = dispatch.v4_config(batched, 132)
    assert (big is None) == (v4.dynamic_smem(v4.config_defines(None)) <= limit)
    if big is not None:   # the largest tile that fits, swizzled, the deeper ring
        assert (big["DG_BM"] * big["DG_BN"], big["DG_SWIZZLE"], big["DG_STAGES"]) == (128 * 256, 1, 4)
        assert why.endswith(f"v4's default config needs 147456 bytes of shared memory, over the {limit} a block "
                            f"may have on compute capability {cc / 10:.1f}; the largest tile that fits"), why


def test_the_shared_memory_limits_are_the_gpus_and_an_unknown_gpu_gets_the_smallest():
    assert registry.smem_limit(80) == registry.smem_limit(87) == 163 * 1024
    assert registry.smem_limit(90) == registry.DYNAMIC_SMEM_LIMIT["sm_90a"] == registry.smem_limit(100) == 232448
    assert registry.smem_limit(86) == registry.smem_limit(89) == registry.smem_limit(120) == 99 * 1024
    assert registry.smem_limit(110) == registry.smem_limit(75) == 99 * 1024
    v4 = registry.get("v4")
    cfg = v4.config_defines(None)
    assert v4.config_reason(cfg, Problem(256, 256, 64, cc=80)) is None
    assert v4.config_reason(cfg, Problem(256, 256, 64, cc=89)) == (
        "v4's 256 x 128 tiles in this config need 147456 bytes of shared memory, over the 101376 a block may have "
        "on compute capability 8.9: smaller tiles or fewer stages")


def test_v5_launches_one_cluster_per_split_tile_and_at_most_one_block_per_sm_otherwise():
    v5 = registry.get("v5")
    problem = Problem(1000, 1000, 4096)   # 8 x 16 tiles of 128 x 64, 16 x 16 of 64 x 64
    for split in (2, 4):
        cfg = v5.config_defines({"DG_BN": 64, "DG_STAGES": 8, "DG_SPLIT_K": split})
        assert v5.grid(cfg, problem, 132) == (8 * 16 * split, 1, 1)
    assert v5.grid(v5.config_defines({"DG_BN": 64, "DG_STAGES": 8}), problem, 132) == (128, 1, 1)
    assert v5.grid(v5.config_defines({"DG_BM": 64, "DG_BN": 64, "DG_STAGES": 12}), problem, 132) == (132, 1, 1)


def test_v5_cluster_and_grouped_grids_cover_the_tiles_with_at_most_one_block_per_sm():
    v5 = registry.get("v5")
    pairs = v5.config_defines({"DG_BN": 256, "DG_STAGES": 3, "DG_CLUSTER_M": 2})   # 128 x 256 tiles, 2-row clusters
    assert v5.grid(pairs, Problem(1000, 1000, 4096), 132) == (2 * 4 * 4, 1, 1)      # ceil(1000 / 256) x 4 pairs
    assert v5.grid(pairs, Problem(100, 200, 64), 132) == (2, 1, 1)                 # one pair: one cluster
    assert v5.grid(pairs, Problem(8192, 8192, 64), 132) == (132, 1, 1)             # 1024 pairs on 66 clusters
    grouped = v5.config_defines({"DG_BN": 128, "DG_STAGES": 6})                      # 128 x 128 tiles
    for mode, rows, expected in (("batch", 300, 4 * 3 * 2), ("sizes", 300, (3 + 4) * 2), ("batch", 4096, 132)):
        problem = Problem(rows, 256, 64, groups=registry.Groups(mode, 4))
        assert v5.grid(grouped, problem, 132) == (expected, 1, 1), (mode, rows)


def test_v5_configs_outside_its_static_asserts_are_refused_before_compiling():
    v5 = registry.get("v5")
    problem = Problem(256, 256, 4096)
    base = v5.config_defines({"DG_BN": 64, "DG_STAGES": 8})
    assert v5.config_reason(dict(base, DG_SPLIT_K=8), problem) is None
    assert v5.config_reason(dict(base, DG_SPLIT_K=9), problem).startswith("DG_SPLIT_K=9 is not one of [1, 2,")
    row_major_b = prob(256, 256, 4096, b=mat(4096, 256))
    wide = v5.config_defines({"DG_BN": 128, "DG_STAGES": 4, "DG_CLUSTER_M": 2})
    assert v5.config_reason(wide, row_major_b) is None                              # two 64-column blocks
    why = v5.config_reason(dict(wide, DG_BN=192, DG_STAGES=3), row_major_b)
    assert why.startswith("DG_CLUSTER_M=2 with DG_BN=192 and a row-major b"), why

def test_split_k_may_park_its_partial_sums_in_exactly_the_ring():
    """The kernel's static_assert takes a ring of exactly a tile's FP32 partial sums (128 x 128 tiles
    in 2 stages: 2 x 256 x 64 x 2 = 128 x 128 x 4 bytes); the host's check agrees at that edge."""
    v5 = registry.get("v5")
    edge = v5.config_defines({"DG_BN": 128, "DG_SPLIT_K": 2, "DG_STAGES": 2})
    assert v5.config_reason(edge, Problem(256, 256, 4096)) is None
    assert "too small to park a 128 x 192 tile" in v5.config_reason(dict(edge, DG_BN=192), Problem(256, 256, 4096))
