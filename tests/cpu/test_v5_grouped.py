"""V5's batched/grouped build (DG_GROUPED = 1) on a CPU: every variant compiles clean with 3-D TMA
loads and stores, split-K has no grouped build, the tensor-map plans for batched and contiguous
operands (dims, box, strides handed to the driver), the reasons V5 refuses a grouped problem
instead of staging it, the launch grid, and the driver call for a 3-D map (faked)."""
import dataclasses
import re

import numpy as np
import pytest

from deepgemm import binary, jit, registry, static_checks, tma
from deepgemm.arrays import Matrix
from deepgemm.testing import stress

from fake_gpu import fake_encode  # noqa: F401 (fixture)

V5 = registry.get("v5")
ARCH = "sm_90a"


def mat(rows, cols, row_major=True, ld=None, ptr=1 << 20, dtype="float16"):
    return Matrix(ptr, rows, cols, dtype, row_major, ld if ld is not None else (cols if row_major else rows), 0)


def problem(mode, count, m, n, k, a=None, b=None, d=None, out_dtype="float16", c=None, **strides):
    """A grouped problem with group 0's matrices a (M x K), b (K x N), d (M x N), row-major by
    default, and a 16-bit residual c (M x N) where given."""
    epilogue = registry.Epilogue(residual=c.dtype) if c is not None else registry.NO_EPILOGUE
    return registry.Problem(m, n, k, "float16", out_dtype, a or mat(m, k), b or mat(k, n), epilogue, cc=90,
                            d=d or mat(m, n, dtype=out_dtype), c=c, groups=registry.Groups(mode, count, **strides))


def _sass(ck) -> str:
    return binary.dump_sass(ck.cubin_path)


# ---------------------------------------------------------------------------------------------
# The kernel

@pytest.mark.parametrize("variant", static_checks.coverage_variants(V5, ARCH), ids=str)
def test_grouped_variants_compile_clean_with_3d_tma(variant):
    """The four variants that reach every code path (both 16-bit inputs, rr rc cr cc, FP32 out on
    cr, the whole epilogue chain bias + GELU + scale + residual on rc) pass the static checks'
    rules (no spills, no local memory, HGMMA and UTMALDG), and every TMA copy is 3-D: the group
    is the map's third coordinate. The plain build keeps its 2-D copies."""
    ck = registry.compile_variant(V5, ARCH, variant.in_dtype, variant.out_dtype, variant.a_row, variant.b_row,
                                  variant.epilogue, grouped=True)
    result = static_checks.check(dataclasses.replace(variant, grouped=True), ck)
    assert result.ok, result.problems
    assert result.features["HGMMA"] and result.features["UTMALDG"]
    assert bool(result.features["UTMASTG"]) == (variant.out_dtype != "float32")   # D staged + TMA-stored
    sass = _sass(ck)
    assert re.search(r"\bUTMALDG\.3D\b", sass) and not re.search(r"\bUTMA(?:LDG|STG)\.2D\b", sass)
    plain = registry.compile_variant(V5, ARCH, variant.in_dtype, variant.out_dtype, variant.a_row, variant.b_row,
                                     variant.epilogue)
    assert not re.search(r"\bUTMA(?:LDG|STG)\.3D\b", _sass(plain))


def _grouped_configs():
    default = V5.config_defines(None)
    return [V5.config_defines(c) for c in V5.config_space
            if V5.config_defines(c)["DG_SPLIT_K"] == 1 and V5.config_defines(c)["DG_CLUSTER_M"] == 1
            and V5.config_defines(c) != default]


@pytest.mark.parametrize("config", _grouped_configs(), ids=lambda c: f"BM{c['DG_BM']}-BN{c['DG_BN']}-S{c['DG_STAGES']}-P{c['DG_PINGPONG']}-"
                         f"G{c['DG_GROUP_M']}-E{c['DG_EPI_TMA']}")
def test_every_tuner_config_builds_grouped(config, sweep_tier):
    """--sweep=full: each config the tuner may pick for a grouped problem (split-K has no grouped
    build) in its coverage variants; the quick tier builds its rc variant with the whole epilogue
    chain, the one with the most registers."""
    todo = static_checks.coverage_variants(V5, ARCH, config)
    if sweep_tier != "full":
        todo = [v for v in todo if v.epilogue == static_checks.FULL_EPILOGUE]
    assert todo
    for v in todo:
        ck = registry.compile_variant(V5, ARCH, v.in_dtype, v.out_dtype, v.a_row, v.b_row, v.epilogue, config,
                                      grouped=True)
        result = static_checks.check(dataclasses.replace(v, grouped=True), ck, config)
        assert result.ok, (str(v), result.problems)


def test_split_k_has_no_grouped_build():
    cfg = V5.config_defines({"DG_BN": 128, "DG_STAGES": 6, "DG_SPLIT_K": 2})
    grouped = problem("batch", 4, 256, 512, 1024)
    assert "no grouped build" in V5.config_supports(cfg, grouped)
    assert V5.config_supports(cfg, registry.Problem(256, 512, 1024)) is None
    assert V5.config_supports(V5.config_defines(None), grouped) is None
    with pytest.raises(jit.CompileError, match="DG_SPLIT_K > 1 has no grouped build"):
        registry.compile_variant(V5, ARCH, "float16", "float16", True, False, config=cfg, grouped=True)


def test_grouped_stress_build_keeps_its_pauses_and_ledger(tmp_path):
    """The stress tier's hooks (DG_STRESS pauses, DG_PIPE_CHECK's stage-release ledger) compile into
    the grouped build as into the plain one."""
    name = stress.register_variant("v5", tmp_path, seed=3, pipe_check=True)
    try:
        ck = registry.compile_variant(registry.get(name), ARCH, "float16", "float16", True, False, grouped=True)
        assert ck.resources["spill_stores"] == 0 and "NANOSLEEP" in _sass(ck)
    finally:
        registry.unregister(name)


# ---------------------------------------------------------------------------------------------
# Tensor-map plans (pure Python)

def test_batched_plans_step_one_matrix_per_group():
    # 4 groups of A 300 x 200 (row-major, K-major: box 64 k x 128 rows), one shared B (row-major,
    # N-major: 64 x 64 boxes, depth 1), D 300 x 512 per group.
    p = problem("batch", 4, 300, 512, 200, stride_a=300 * 200, stride_d=300 * 512)
    a_plan, b_plan, d_plan, _ = tma.grouped_plans(p, 128, 256, True)
    assert a_plan == ((200, 300, 4), (64, 128, 1), (400, 300 * 200 * 2))
    assert b_plan == ((512, 200, 1), (64, 64, 1), (1024, 1024 * 200))
    assert d_plan == ((512, 300, 4), (64, 64, 1), (1024, 300 * 512 * 2))
    # 64-row tiles: A's box is 64 rows; B and D as before
    a64, b64, d64, _ = tma.grouped_plans(p, 64, 256, True)
    assert a64 == ((200, 300, 4), (64, 64, 1), (400, 300 * 200 * 2)) and (b64, d64) == (b_plan, d_plan)


def test_batched_plans_for_column_major_operands_and_padded_strides():
    # A column-major (M-major: 64 x 64 boxes over (M, K)), B per group as nn.Linear's w.T (K-major:
    # box 64 k x BN rows), each group's matrices padded apart.
    a = mat(300, 200, row_major=False, ld=304)
    b = mat(200, 512, row_major=False, ld=208)
    p = problem("masked", 8, 300, 512, 200, a=a, b=b, stride_a=304 * 200 + 64, stride_b=208 * 512, stride_d=300 * 512)
    a_plan, b_plan, _, _ = tma.grouped_plans(p, 128, 128, True)
    assert a_plan == ((300, 200, 8), (64, 64, 1), (608, (304 * 200 + 64) * 2))
    assert b_plan == ((200, 512, 8), (64, 128, 1), (416, 208 * 512 * 2))


def test_contiguous_plans_span_every_groups_rows():
    """sizes/offsets: A and D are one matrix of M = all groups' rows (whatever rows the caller's
    group-0 description holds); the kernel adds a group's first row to the row coordinate."""
    p = problem("sizes", 16, 1000, 768, 512, a=mat(1, 512), b=mat(512, 768, row_major=False, ld=512),
                d=mat(1, 768), stride_b=512 * 768)
    a_plan, b_plan, d_plan, _ = tma.grouped_plans(p, 128, 256, True)
    assert a_plan == ((512, 1000, 1), (64, 128, 1), (1024, 1024 * 1000))
    assert b_plan == ((512, 768, 16), (64, 256, 1), (1024, 512 * 768 * 2))
    assert d_plan == ((768, 1000, 1), (64, 64, 1), (1536, 1536 * 1000))
    a_col = mat(1000, 512, row_major=False, ld=1024)
    a_plan, _, _, _ = tma.grouped_plans(problem("offsets", 3, 1000, 768, 512, a=a_col), 128, 256, True)
    assert a_plan == ((1000, 512, 1), (64, 64, 1), (2048, 2048 * 512))


def test_d_map_only_where_the_kernel_stores_with_tma():
    """D's plan exists under d_by_tma's conditions (16-bit, whole 64-column boxes, 16-byte base,
    ld, row length) and a group stride of whole 16 bytes; else the kernel stores D itself."""
    def d_plan(block_n=256, **kw):
        args = dict(mode="batch", count=2, m=128, n=256, k=64, stride_d=128 * 256)
        args.update(kw)
        return tma.grouped_plans(problem(**args), 128, block_n, True)[2]
    assert d_plan() is not None
    assert d_plan(out_dtype="float32") is None
    assert d_plan(stride_d=128 * 256 + 4) is None
    assert d_plan(stride_d=-128 * 256) is None
    assert d_plan(d=mat(128, 256, ld=260)) is None
    assert d_plan(n=250, b=mat(64, 250), d=mat(128, 250, ld=256)) is None   # a row's last 16 bytes
    assert d_plan(block_n=96) is None                                        # not whole 64-column boxes
    assert d_plan(stride_d=0) == ((256, 128, 1), (64, 64, 1), (512, 512 * 128))   # depth 1: z is always 0


def test_c_map_only_where_the_kernel_loads_c_with_tma():
    """C's plan: _c_plan's conditions (a config that stages C, 16-bit, 16-byte base and ld) and a
    group stride of whole 16 bytes (c_by_tma); boxes of 64 x 64 like D's, whatever the tile width."""
    def c_plan(stages_c=True, c=None, **kw):
        args = dict(mode="batch", count=2, m=128, n=256, k=64, stride_c=128 * 264, c=c or mat(128, 256, ld=264))
        args.update(kw)
        return tma.grouped_plans(problem(**args), 128, 96, stages_c)[3]
    assert c_plan() == ((256, 128, 2), (64, 64, 1), (528, 128 * 264 * 2))
    assert c_plan(stride_c=0) == ((256, 128, 1), (64, 64, 1), (528, 528 * 128))    # shared: depth 1
    assert c_plan(stages_c=False) is None
    assert c_plan(stride_c=128 * 264 + 4) is None
    assert c_plan(c=mat(128, 256, ld=260)) is None
    assert c_plan(c=mat(128, 256, dtype="float32")) is None
    p = problem("sizes", 4, 1000, 768, 512, c=mat(1, 768, ld=776))
    assert tma.grouped_plans(p, 128, 256, True)[3] == ((768, 1000, 1), (64, 64, 1), (1552, 1552 * 1000))


def test_k_zero_needs_no_operand_maps():
    assert tma.grouped_plans(problem("batch", 2, 128, 256, 0), 128, 256, True)[:2] == (None, None)


# ---------------------------------------------------------------------------------------------
# supports(): refused, not staged

@pytest.mark.parametrize("kw, reason", [
    (dict(stride_a=300 * 200 + 4), "a's group stride 60004 is not a multiple of 8 elements"),
    (dict(stride_b=200 * 512 + 2), "b's group stride 102402 is not a multiple of 8 elements"),
    (dict(stride_a=-300 * 200), "a's group stride -60000 is negative"),
    (dict(a=mat(300, 200, ptr=(1 << 20) + 2)), "a's base address is not 16-byte aligned"),
    (dict(b=mat(200, 512, ld=514)), "b's leading dimension 514 is not a multiple of 8"),
    (dict(k=203, a=mat(300, 203, ld=208), b=mat(203, 512)), "a's contiguous extent 203 is not a multiple of 8"),
])
def test_grouped_operands_tma_cannot_read_are_refused_with_a_reason(kw, reason):
    args = dict(mode="batch", count=4, m=300, n=512, k=200, stride_a=300 * 200, stride_b=200 * 512)
    args.update(kw)
    got = V5.supports(problem(**args))
    assert got is not None and reason in got


@pytest.mark.parametrize("mode", ["sizes", "offsets"])
def test_a_column_major_a_of_contiguous_groups_is_refused(mode):
    """A contiguous group's tiles start at its first row: along a column-major A's contiguous
    dimension, so a TMA box could start off its 16-byte alignment (an illegal instruction). A
    batched or masked column-major A starts each group at row 0 of its own matrix, and a row-major A
    puts K (stepped in whole boxes) along the contiguous dimension: both are taken."""
    a_col = mat(1000, 512, row_major=False, ld=1000)
    b = mat(512, 768, row_major=False, ld=512)
    got = V5.supports(problem(mode, 3, 1000, 768, 512, a=a_col, b=b, stride_b=512 * 768))
    assert got is not None and "a is column-major" in got and "16-byte" in got
    assert V5.supports(problem(mode, 3, 1000, 768, 512, a=mat(1000, 512), b=b, stride_b=512 * 768)) is None
    assert V5.supports(problem(mode, 3, 1000, 768, 0, a=a_col, b=b, stride_b=0)) is None   # K = 0 reads no A
    batched = problem("batch", 3, 1000, 768, 512, a=a_col, b=b, stride_a=1000 * 512, stride_b=512 * 768)
    assert V5.supports(batched) is None


def test_what_grouped_v5_takes():
    assert V5.grouped
    ok = dict(mode="batch", count=4, m=300, n=512, k=200, stride_a=300 * 200, stride_d=300 * 512)
    assert V5.supports(problem(**ok)) is None
    # D is never a reason: the kernel stores a D TMA cannot take itself
    assert V5.supports(problem(**ok, d=mat(300, 512, ptr=(1 << 20) + 2))) is None
    assert V5.supports(problem(**dict(ok, stride_d=7))) is None
    # K = 0 reads neither operand; a shape-only problem (no matrices) has nothing to check
    assert V5.supports(problem(**dict(ok, k=0, stride_a=3))) is None
    shape_only = registry.Problem(300, 512, 200, groups=registry.Groups("sizes", 8))
    assert V5.supports(shape_only) is None
    assert "sm_90a" in V5.supports(registry.Problem(300, 512, 200, cc=100, groups=registry.Groups("sizes", 8)))


# ---------------------------------------------------------------------------------------------
# Launch hooks

@pytest.mark.parametrize("mode, count, m, n, bn, sms, grid", [
    ("batch", 4, 300, 512, 256, 132, 4 * 3 * 2),        # every group: ceil(300 / 128) x 2 tiles
    ("masked", 4, 300, 512, 256, 132, 4 * 3 * 2),       # counts unknown: each group's capacity
    ("batch", 64, 4096, 4096, 256, 132, 132),           # persistent: one block per SM
    ("sizes", 16, 1000, 512, 256, 132, (8 + 16) * 2),   # ceil(M / 128) + one partial tile row per group
    ("offsets", 3, 1000, 768, 128, 132, (8 + 3) * 6),
    ("batch", 4, 0, 512, 256, 132, 1),                  # no tiles: one block that finds none
    ("sizes", 4, 100, 0, 256, 132, 1),
])
def test_grouped_grid_bounds_the_tiles_without_reading_sizes(mode, count, m, n, bn, sms, grid):
    cfg = V5.config_defines({"DG_BN": bn, "DG_STAGES": 6} if bn == 128 else None)
    p = registry.Problem(m, n, 64, groups=registry.Groups(mode, count, rows_ptr=1 << 30))
    assert V5.grid(cfg, p, sms) == (grid, 1, 1)




def test_extra_args_encode_3d_maps_and_stage_nothing(fake_encode, monkeypatch):
    monkeypatch.setattr(tma, "stage", lambda *a: pytest.fail("staged an operand of a grouped problem"))
    p = problem("batch", 4, 300, 512, 200, a=mat(300, 200, ptr=1 << 21), b=mat(200, 512, ptr=1 << 22),
                d=mat(300, 512, ptr=1 << 23), c=mat(300, 512, ptr=1 << 24), stride_a=300 * 200,
                stride_d=300 * 512, stride_c=300 * 512)
    cfg = V5.config_defines(None)
    args, keep = V5.extra_args(cfg, p, 0, None)
    assert len(args) == 4 and keep == [] and all(a.dtype == tma.TENSOR_MAP_DTYPE for a in args)
    assert [c["ptr"] for c in fake_encode] == [1 << 21, 1 << 22, 1 << 23, 1 << 24]
    assert [len(c["dims"]) for c in fake_encode] == [3, 3, 3, 3]
    assert V5.pointer_args(cfg, p) is None                          # no plan-cache replay for groups
    # An operand TMA cannot read is an error here (supports() refuses the problem first).
    with pytest.raises(ValueError, match="a's group stride"):
        V5.extra_args(cfg, problem("batch", 4, 300, 512, 200, stride_a=5), 0, None)


def test_no_rows_or_columns_need_no_map(fake_encode):
    cfg = V5.config_defines(None)
    args, _ = V5.extra_args(cfg, problem("sizes", 4, 0, 512, 64, a=mat(1, 64), d=mat(1, 512)), 0, None)
    assert all(a is tma.NO_MAP for a in args) and not fake_encode
    args, _ = V5.extra_args(cfg, problem("batch", 0, 128, 512, 64, stride_a=128 * 64), 0, None)
    assert all(a is tma.NO_MAP for a in args) and not fake_encode
    args, _ = V5.extra_args(cfg, problem("batch", 4, 128, 512, 0, stride_d=128 * 512), 0, None)
    assert args[0] is tma.NO_MAP and args[1] is tma.NO_MAP and len(fake_encode) == 1   # D's map only


def test_encode_passes_three_dims_and_two_strides_to_the_driver(monkeypatch):
    seen = {}

    def driver(out, dtype, rank, ptr, dims, strides, box, elem_strides, interleave, swizzle, l2, fill):
        seen.update(rank=rank, ptr=ptr.value, dims=list(dims), strides=list(strides), box=list(box),
                    elem=list(elem_strides), swizzle=swizzle)
        return 0
    monkeypatch.setattr(tma, "_encode_fn", lambda: driver)
    encode = tma.encode.__wrapped__   # the uncached function: no map of a fake driver is kept
    encode(1 << 20, "bfloat16", (200, 300, 4), (64, 128, 1), (400, 120000))
    assert seen == dict(rank=3, ptr=1 << 20, dims=[200, 300, 4], strides=[400, 120000], box=[64, 128, 1],
                        elem=[1, 1, 1], swizzle=tma.SWIZZLE_128B)
    encode(1 << 20, "float16", (200, 300), (64, 128), 400)            # the plain 2-D map as before
    assert seen["rank"] == 2 and seen["strides"] == [400] and seen["elem"] == [1, 1]
    with pytest.raises(ValueError, match="3-D tensor map needs 3 box sizes and 2 strides"):
        encode(1 << 20, "float16", (200, 300, 4), (64, 128), (400, 1))


@pytest.mark.parametrize("mode,m,bm", [("masked", 64, 64), ("batch", 32, 64), ("masked", 65, 128),
                                       ("sizes", 64, 128), ("offsets", 40, 128)])
def test_groups_of_at_most_64_rows_take_64_row_tiles(mode, m, bm):
    """Only where every group has at most 64 rows (masked capacity or batch rows); contiguous
    groups share M rows, any one of which may hold them all."""
    from deepgemm import dispatch
    p = registry.Problem(m, 14336, 4096, "float16", "float16", groups=registry.Groups(mode, 8))
    config, why = dispatch.v5_grouped_config(p, 132)
    assert V5.config_defines(config)["DG_BM"] == bm, why
    assert V5.config_defines(config)["DG_SPLIT_K"] == 1


@pytest.mark.parametrize("mode,m,n,bn", [("sizes", 4096, 64, 64), ("sizes", 4096, 100, 128),
                                         ("sizes", 1024, 200, 128),     # 8 x 1 tiles of 128x256: SMs idle
                                         ("batch", 1024, 4096, 256),    # 8 x 8 x 16 tiles fill 132 SMs
                                         ("sizes", 512, 4096, 128),     # 4 x 16 do not
                                         ("masked", 256, 4096, 256)])   # 8 x 2 x 16 do
def test_grouped_tile_width_covers_small_n_else_fills_the_sms(mode, m, n, bn):
    """The narrowest width covering a small N; else 256 columns where the groups' 128x256 tiles
    fill the SMs, else 128. Always a 128-row cooperative config without split-K."""
    from deepgemm import dispatch
    p = registry.Problem(m, n, 4096, "float16", "float16", groups=registry.Groups(mode, 8))
    config, why = dispatch.v5_grouped_config(p, 132)
    full = V5.config_defines(config)
    assert full["DG_BN"] == bn, why
    assert (full["DG_BM"], full["DG_SPLIT_K"], full["DG_PINGPONG"]) == (128, 1, 0), full
