"""V5's host side on a CPU: which operands TMA takes, the boxes and strides handed to the driver
(the encode call itself is faked), the persistent grid, staging of misaligned operands, and the
staging kernel's compile."""
import numpy as np
import pytest

import deepgemm
from deepgemm import jit, registry, tma
from deepgemm.arrays import Matrix
from fake_gpu import FAKE_GPU, F, captured, fake_encode, gpus  # noqa: F401  (fakes and fixtures)


def mat(rows, cols, row_major=True, ld=None, ptr=1 << 20):
    return Matrix(ptr, rows, cols, "float16", row_major, ld if ld is not None else (cols if row_major else rows), 0)


@pytest.mark.parametrize("m, reason", [
    (mat(64, 64), None),
    (mat(64, 64, ptr=(1 << 20) + 2), "base address is not 16-byte aligned"),
    (mat(64, 4095), "leading dimension 4095 is not a multiple of 8"),
    (mat(4095, 64, row_major=False), "leading dimension 4095 is not a multiple of 8"),
    (mat(1, 4096), None),                  # one row: its stride is never used
    (mat(64, 517, ld=520), "contiguous extent 517 is not a multiple of 8"),
])
def test_operand_reason(m, reason):
    got = tma.operand_reason(m, "a")
    assert (got is None) if reason is None else (reason in got)


def test_box_plan_matches_the_kernel_loads():
    # A row-major (K-major): dims (K, M), one box of 64 k x 128 rows.
    assert tma.box_plan(mat(300, 200), 128, k_major=True) == ((200, 300), (64, 128), 400)
    # B row-major (N-major): dims (N, K), 64 x 64 boxes.
    assert tma.box_plan(mat(200, 520), 256, k_major=False) == ((520, 200), (64, 64), 1040)
    # B column-major (w.T, K-major): dims (K, N), box 64 k x BN rows, stride = ld.
    assert tma.box_plan(mat(200, 520, row_major=False, ld=208), 256, k_major=True) == ((200, 520), (64, 256), 416)




def test_v5_launch_gets_its_tensor_maps_and_a_persistent_grid(captured, fake_encode):
    default = registry.get("v5").default_config        # 128x256 tiles (by shape, named v5 would pick its own)
    deepgemm.gemm(F(4096, 1024), F(1024, 4096), kernel="v5", config=default)
    (launch,) = captured
    assert len(launch["args"]) == 5 and all(arg.dtype == tma.TENSOR_MAP_DTYPE for arg in launch["args"][1:])
    assert not launch["args"][4].tobytes().strip(b"\0")                     # no residual: C's map is empty
    assert launch["grid"] == (132, 1, 1) and launch["block"] == (384, 1, 1)   # 32 x 16 tiles > 132 SMs
    assert [c["box"] for c in fake_encode] == [(64, 128), (64, 64), (64, 64)]   # A, B, D
    deepgemm.gemm(F(200, 64), F(64, 304), kernel="v5", config=default)
    assert captured[1]["grid"] == (2 * 2, 1, 1)                              # fewer tiles than SMs


def test_v5_64_row_tiles_and_ping_pong_launch_their_own_geometry(captured, fake_encode):
    """64-row tiles: one consumer warpgroup (256 threads), A boxes of 64 rows, twice the tile rows;
    ping-pong: the cooperative block and grid, a whole tile's D staging per consumer."""
    v5 = registry.get("v5")
    short = {"DG_BM": 64, "DG_BN": 128, "DG_STAGES": 8}
    deepgemm.gemm(F(100, 256), F(256, 512), kernel="v5", config=short)
    launch = captured[-1]
    assert launch["block"] == (256, 1, 1) and launch["grid"] == (2 * 4, 1, 1)     # ceil(100/64) x 512/128
    assert fake_encode[0]["box"] == (64, 64)                                      # A: 64 k x 64 rows
    assert launch["smem"] == registry.get("v5").dynamic_smem(v5.config_defines(short)) \
        == 1024 + 8 * (64 + 128) * 128 + 2 * 8192 + 16 * 8 + 16 * 1 + 8 + 128 * 4   # + one unit's c_full / d_free, c_start, a bias slot
    pp = {"DG_BN": 128, "DG_STAGES": 5, "DG_PINGPONG": 1}
    deepgemm.gemm(F(4096, 256), F(256, 4096), kernel="v5", config=pp)
    launch = captured[-1]
    assert launch["block"] == (384, 1, 1) and launch["grid"] == (132, 1, 1)
    assert launch["smem"] == 1024 + 5 * (128 + 128) * 128 + 2 * 2 * 2 * 8192 + 16 * 5 + 16 * 4 + 8 + 2 * 128 * 4   # 2 consumers x 2 halves


def test_misaligned_operands_are_staged_not_refused(captured, fake_encode, monkeypatch):
    staged = []

    def stage(m, dtype, arch, device, stream):
        staged.append(m)
        return Matrix(1 << 30, m.rows, m.cols, m.dtype, m.row_major, tma.staged_ld(m), m.device), object()
    monkeypatch.setattr(tma, "stage", stage)
    deepgemm.gemm(F(4095, 4095), F(4095, 4096), kernel="v5")
    assert len(staged) == 1 and staged[0].ld == 4095                          # only A is misaligned
    a_map = fake_encode[0]
    assert a_map["ptr"] == 1 << 30 and a_map["stride"] == 4096 * 2


def test_v5_is_refused_off_hopper_with_a_reason():
    reason = registry.get("v5").supports(registry.Problem(64, 64, 64, cc=100))
    assert "sm_90a" in reason
    with pytest.raises(ValueError, match="needs compute capability >= 9.0"):
        registry.compile_variant(registry.get("v5"), "sm_80", "float16", "float16", True, True)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_stage_copy_compiles_with_16_byte_stores_and_no_local_memory(arch):
    ck = jit.compile_kernel("stage_copy", jit.KERNEL_DIR / "stage_copy.cu", arch, {})
    features = jit.sass_features(ck.cubin_path)
    assert ck.resources["spill_stores"] == 0 and not features["LOCAL"]
    assert features["STG.128"] and features["LDG.128"]   # the aligned-chunk path


def test_k_zero_needs_no_tensor_map(captured, fake_encode, monkeypatch):
    monkeypatch.setattr(tma, "_maps_for", lambda *a: pytest.fail("encoded A/B maps for K = 0"))
    deepgemm.gemm(F(64, 0), F(0, 64), kernel="v5")
    assert len(captured[0]["args"]) == 5
    c = F(64, 64, base_ptr=1 << 26)   # the epilogue still runs: a 16-bit residual still gets its map
    deepgemm.gemm(F(64, 0), F(0, 64), kernel="v5", c=c)
    assert [e["box"] for e in fake_encode if e["ptr"] == c.data.ptr] == [(64, 64)]


def test_v5_launch_passes_the_residual_map(captured, fake_encode):
    c = F(512, 512, base_ptr=1 << 26)
    deepgemm.gemm(F(512, 256), F(256, 512), kernel="v5", config={"DG_BN": 128, "DG_STAGES": 6}, c=c)
    assert [(e["dims"], e["box"], e["stride"]) for e in fake_encode if e["ptr"] == c.data.ptr] == \
        [((512, 512), (64, 64), 1024)]
    assert len(captured[0]["args"]) == 5


def _c_problem(c, out_dtype="float16", residual="float16"):
    epi = registry.Epilogue(residual=residual)
    return registry.Problem(c.rows, c.cols, 64, "float16", out_dtype, epilogue=epi, c=c)


def test_c_map_only_where_v5_loads_c_by_tma():
    """The residual's map (64 x 64 boxes into the staging tile) exists exactly where the kernel
    loads C with TMA (c_by_tma in v5_wgmma.cu): a config that stages C, a 16-bit C, a 16-byte-
    aligned base and row pitch. The row length is free (the columns past N are never stored)."""
    assert tma._c_plan(_c_problem(mat(259, 517, ld=520)), True) == ((517, 259), (64, 64), 1040)
    assert tma._c_plan(_c_problem(mat(259, 517, ld=520)), False) is None          # split-K, FP32 D, no staging
    assert tma._c_plan(_c_problem(mat(64, 64, ptr=(1 << 20) + 2)), True) is None  # misaligned base
    assert tma._c_plan(_c_problem(mat(64, 60, ld=60)), True) is None              # 120-byte rows
    assert tma._c_plan(_c_problem(mat(64, 64), residual="float32"), True) is None
    assert tma._c_plan(registry.Problem(64, 64, 64), True) is None                # no residual
    v5 = registry.get("v5")
    stages_c = registry._v5_stages_c
    assert stages_c(v5.default_config, _c_problem(mat(64, 64)))
    assert not stages_c(v5.default_config, _c_problem(mat(64, 64), out_dtype="float32"))
    assert not stages_c(v5.config_defines({"DG_BN": 128, "DG_STAGES": 6, "DG_SPLIT_K": 2}), _c_problem(mat(64, 64)))
    assert not stages_c(v5.config_defines({"DG_BN": 256, "DG_STAGES": 4, "DG_EPI_TMA": 0}), _c_problem(mat(64, 64)))



def test_d_map_only_for_aligned_16_bit_outputs(fake_encode):
    assert tma.d_store_map(mat(64, 64), "float16", 256) is not tma.NO_MAP
    assert fake_encode[-1]["box"] == (64, 64) and fake_encode[-1]["dims"] == (64, 64)
    assert tma.d_store_map(mat(64, 64), "float32", 256) is tma.NO_MAP
    assert tma.d_store_map(mat(64, 4095), "float16", 256) is tma.NO_MAP
    assert tma.d_store_map(mat(64, 64, ptr=(1 << 20) + 4), "bfloat16", 256) is tma.NO_MAP
    assert tma.d_store_map(mat(64, 64), "float16", 96) is tma.NO_MAP   # a 96-wide tile is not whole boxes
    # Row length 517 (ld 520): a TMA store would overwrite columns 517-519 (seen on the H200).
    assert tma.d_store_map(mat(259, 517, ld=520), "float16", 256) is tma.NO_MAP


def test_v5_split_k_is_a_cluster_kernel_with_one_cluster_per_tile(captured, fake_encode):
    """DG_SPLIT_K > 1 builds a cluster kernel (barrier.cluster in its SASS; none without split-K)
    and launches one cluster of DG_SPLIT_K blocks per 128 x BN tile, not a persistent grid."""
    cfg = {"DG_BN": 128, "DG_STAGES": 6, "DG_SPLIT_K": 4}
    spec = registry.get("v5")
    split = registry.compile_variant(spec, "sm_90a", "float16", "float16", True, False, config=cfg)
    plain = registry.compile_variant(spec, "sm_90a", "float16", "float16", True, False)
    assert jit.sass_features(split.cubin_path)["CLUSTER_BAR"] > 0
    assert jit.sass_features(plain.cubin_path)["CLUSTER_BAR"] == 0
    deepgemm.gemm(F(512, 3072), F(3072, 768), kernel="v5", config=cfg)
    assert captured[-1]["grid"] == (4 * 6 * 4, 1, 1)     # 4 x 6 tiles of 128 x 128, 4 blocks each
    deepgemm.gemm(F(4096, 1024), F(1024, 4096), kernel="v5", config=cfg)
    assert captured[-1]["grid"] == (32 * 32 * 4, 1, 1)


def test_v5_96_wide_tiles_need_a_k_major_b(captured, fake_encode):
    """BN = 96 (wgmma n96: 128 tiles at M = 512, N = 3072) reads B in K-major rows only: with a
    row-major b the config is refused by name before anything compiles; with nn.Linear's w.T it
    runs, and D goes out row by row (no D map: a 96-wide tile is not whole 64-column TMA boxes)."""
    cfg = {"DG_BN": 96, "DG_STAGES": 6}
    with pytest.raises(ValueError, match="DG_BN=96 needs a column-major"):
        deepgemm.gemm(F(512, 768), F(768, 3072), kernel="v5", config=cfg)
    deepgemm.gemm(F(512, 768), F(3072, 768).T, kernel="v5", config=cfg)
    assert captured[-1]["grid"] == (min(4 * 32, 132), 1, 1)
    assert captured[-1]["args"][3] is tma.NO_MAP
    assert [c["box"] for c in fake_encode[-2:]] == [(64, 128), (64, 96)]
