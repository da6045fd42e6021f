"""V5's host side on a CPU: which operands TMA takes, the boxes and strides handed to the driver
(the encode call itself is faked), the persistent grid, staging of misaligned operands, and the
staging kernel's compile."""
import dataclasses

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


@pytest.mark.parametrize("m, block_m, rows", [
    (1, 64, 8), (8, 64, 8), (9, 128, 16), (63, 64, 64), (64, 64, 64), (100, 128, 104), (5000, 128, 128),
])
def test_a_shorter_than_a_tile_gets_a_box_of_its_rows_rounded_up_to_8(captured, fake_encode, m, block_m, rows):
    """A decode-size A: the copy engine would zero-fill a whole tile's rows in every k-block. Its
    K-major box is M rounded up to 8 (the kernel expects that many bytes); an M-major A (64 x 64
    boxes) and B keep theirs."""
    assert tma.a_box_rows(m, block_m) == rows
    config = {"DG_BM": block_m, "DG_BN": 128, "DG_STAGES": 4}
    deepgemm.gemm(F(m, 256), F(256, 512), kernel="v5", config=config)
    assert [c["box"] for c in fake_encode[:2]] == [(64, rows), (64, 64)]                 # A, B (row-major)
    if m > 1 and m % 8 == 0:   # (a one-row view is row-major either way; 16-byte columns, not staged)
        fake_encode.clear()
        deepgemm.gemm(F(256, m).T, F(256, 512), kernel="v5", config=config)              # A column-major
        assert fake_encode[0]["box"] == (64, 64)




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


def test_staged_copies_are_kept_alive_until_the_launch_is_enqueued(captured, fake_encode, monkeypatch):
    """prepare() hands back every staging buffer with the maps: dropped earlier, a buffer could go
    back to the pool (and be handed out again) before the kernel that reads it is enqueued."""
    buffers, returned = [], []

    def stage(m, dtype, arch, device, stream):
        buffers.append(object())
        return Matrix((1 << 30) * len(buffers), m.rows, m.cols, m.dtype, m.row_major, tma.staged_ld(m),
                      m.device), buffers[-1]
    monkeypatch.setattr(tma, "stage", stage)
    real = tma.prepare
    monkeypatch.setattr(tma, "prepare", lambda *a, **kw: returned.append(real(*a, **kw)) or returned[-1])
    deepgemm.gemm(F(4095, 4095), F(4095, 4095), kernel="v5")          # A and B both misaligned
    (maps, keep), = returned
    assert len(buffers) == 2 and keep == buffers
    assert [e["ptr"] for e in fake_encode[:2]] == [1 << 30, 2 << 30]


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
    monkeypatch.setattr(tma, "_plans", lambda *a: pytest.fail("encoded A/B maps for K = 0"))
    deepgemm.gemm(F(64, 0), F(0, 64), kernel="v5")
    assert len(captured[0]["args"]) == 5
    # The epilogue alone still stores a 16-bit D by TMA, where the tile is whole 64 x 64 boxes
    out = deepgemm.gemm(F(64, 0), F(0, 128), kernel="v5", config={"DG_BN": 128, "DG_STAGES": 6})
    assert [e["dims"] for e in fake_encode if e["ptr"] == out.data.ptr] == [(128, 64)]
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
    assert tma.d_store_map(mat(64, 72), "float16", 256) is not tma.NO_MAP   # 144-byte rows: whole 16 bytes
    assert fake_encode[-1]["dims"] == (72, 64) and fake_encode[-1]["stride"] == 144
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


@pytest.mark.parametrize("m, reason", [
    # Two rows are enough for the row pitch to be used: it must be a multiple of 16 bytes.
    (mat(2, 64, ld=68), "leading dimension 68 is not a multiple of 8"),
    (mat(64, 2, row_major=False, ld=68), "leading dimension 68 is not a multiple of 8"),
    # The driver takes global dimensions up to 2^32 elements; V5 stays below that.
    (mat(1, 2**32 + 8), "dimension of 2^32 elements or more"),           # the contiguous one
    (mat(2**32 + 8, 8, row_major=False), "dimension of 2^32 elements or more"),
    (mat(2**32 + 8, 8), "dimension of 2^32 elements or more"),           # the other one
    (mat(8, 2**32 + 8, row_major=False), "dimension of 2^32 elements or more"),
    (mat(1, 2**32), "dimension of 2^32 elements or more"),               # exactly 2^32: either one
    (mat(2**32, 8), "dimension of 2^32 elements or more"),
    (mat(1, 2**32 - 8), None),                                           # just under: taken
    (mat(2**32 - 1, 8), None),
    # One row or column: its pitch is never used to address anything, so any pitch is fine.
    (mat(1, 64, ld=68), None),
    (mat(64, 1, row_major=False, ld=70), None),
])
def test_operand_reason_at_the_driver_limits(m, reason):
    got = tma.operand_reason(m, "b")
    assert got is None if reason is None else (reason in got and got.startswith("b"))


# cuda.h: CUtensorMapDataType FLOAT16 = 6, BFLOAT16 = 9; CU_TENSOR_MAP_INTERLEAVE_NONE = 0;
# CU_TENSOR_MAP_SWIZZLE_128B = 3 (the kernels' 64 x 2-byte rows are 128-byte swizzle spans);
# CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0 (out-of-bounds elements read as zeros, which the partial
# tiles at M, N and K edges rely on).
@pytest.mark.parametrize("dtype, code", [("float16", 6), ("bfloat16", 9)])
def test_encode_hands_the_driver_the_map_the_kernel_expects(monkeypatch, dtype, code):
    import ctypes
    seen = {}

    def driver(out, data_type, rank, ptr, dims, strides, box, elem_strides, interleave, swizzle, l2, fill):
        seen.update(data_type=data_type, rank=rank, ptr=ptr.value, dims=list(dims[:rank]),
                    strides=list(strides[:rank - 1]), box=list(box[:rank]), elem=list(elem_strides[:rank]),
                    interleave=interleave, swizzle=swizzle, l2=l2, fill=fill)
        ctypes.memmove(out, bytes(range(128)), 128)   # the driver fills the caller's 128-byte map
        return 0
    monkeypatch.setattr(tma, "_encode_fn", lambda: driver)
    got = tma.encode.__wrapped__(0x7F00_0000_0100, dtype, (520, 200), (64, 256), 1040)
    assert seen == dict(data_type=code, rank=2, ptr=0x7F00_0000_0100, dims=[520, 200], strides=[1040],
                        box=[64, 256], elem=[1, 1], interleave=0, swizzle=3, l2=seen["l2"], fill=0)
    assert seen["l2"] in (0, 1, 2, 3)                      # a CUtensorMapL2promotion value
    assert got.dtype == tma.TENSOR_MAP_DTYPE and got.tobytes() == bytes(range(128))   # what the driver wrote
    # 3-D (groups as the third dimension): two byte strides, the group's box depth 1
    tma.encode.__wrapped__(0x7F00_0000_0100, dtype, (64, 128, 5), (64, 64, 1), (128, 128 * 128))
    assert (seen["rank"], seen["dims"], seen["strides"], seen["box"]) == (3, [64, 128, 5], [128, 16384], [64, 64, 1])


def test_encode_failure_raises_with_the_cuda_result_and_geometry(monkeypatch):
    monkeypatch.setattr(tma, "_encode_fn", lambda: lambda *args: 1)   # CUDA_ERROR_INVALID_VALUE
    with pytest.raises(RuntimeError, match=r"cuTensorMapEncodeTiled failed with CUresult 1 .*dims=\(520, 200\)"):
        tma.encode.__wrapped__(1 << 20, "float16", (520, 200), (64, 256), 1040)
    with pytest.raises(ValueError, match="2-D tensor map needs 2 box sizes and 1 strides"):
        tma.encode.__wrapped__(1 << 20, "float16", (520, 200), (64, 256, 1), 1040)


def test_encode_in_a_thread_without_a_context_binds_one_and_retries(monkeypatch):
    """CUDA_ERROR_INVALID_CONTEXT (201: a thread whose first CUDA work is this call) makes the
    current device's primary context current (cudaSetDevice) and encodes again, once; a second
    201 is raised like any other failure."""
    import sys
    import types
    bound, results = [], []
    runtime = types.SimpleNamespace(getDevice=lambda: 1, setDevice=bound.append)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime)))
    monkeypatch.setattr(tma, "_encode_fn", lambda: lambda *args: results.pop(0))
    results[:] = [tma.CUDA_ERROR_INVALID_CONTEXT, 0]
    assert tma.encode.__wrapped__(1 << 20, "float16", (520, 200), (64, 256), 1040).dtype == tma.TENSOR_MAP_DTYPE
    assert bound == [1] and results == []
    results[:] = [tma.CUDA_ERROR_INVALID_CONTEXT, tma.CUDA_ERROR_INVALID_CONTEXT]
    with pytest.raises(RuntimeError, match=r"failed with CUresult 201 "):
        tma.encode.__wrapped__(1 << 20, "float16", (520, 200), (64, 256), 1040)
    assert bound == [1, 1]


def test_box_plan_addresses_every_element_where_the_layout_puts_it():
    """For operands TMA can read, map coordinate (x0, x1) of the plan must address the element the
    matrix layout puts there: dims are (contiguous extent, other extent), dim 1's stride is the
    leading dimension in bytes, and the driver's rules hold (strides multiples of 16 bytes and at
    least a row's bytes, box sizes 1..256, a 128-byte inner box for the 128-byte swizzle)."""
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(300):
        rows, cols = (int(rng.choice([1, 2, 3])) if rng.integers(4) == 0 else int(rng.integers(1, 700))
                      for _ in range(2))
        row_major = bool(rng.integers(2))
        if rng.integers(4):   # mostly a contiguous extent TMA can take
            rows, cols = (rows, -(-cols // 8) * 8) if row_major else (-(-rows // 8) * 8, cols)
        inner = cols if row_major else rows
        ld = inner + int(rng.integers(0, 3)) * 8 + int(rng.choice([0, 0, 0, 4]))   # padded; some not to 16 B
        m = mat(rows, cols, row_major=row_major, ld=ld)
        if tma.operand_reason(m, "a") is not None:
            continue
        checked += 1
        tile = int(rng.choice([64, 96, 128, 256]))
        k_major = bool(rng.integers(2))
        dims, box, stride = tma.box_plan(m, tile, k_major)
        assert dims == ((cols, rows) if row_major else (rows, cols))
        assert stride % 16 == 0 and stride >= dims[0] * 2
        assert all(1 <= b <= 256 for b in box) and box[0] * 2 == 128
        assert box[1] == (tile if k_major else 64)
        for _ in range(4):
            r, c = int(rng.integers(rows)), int(rng.integers(cols))
            layout = (r * ld + c) if row_major else (c * ld + r)
            x0, x1 = (c, r) if row_major else (r, c)
            if dims[1] > 1:
                assert x0 * 2 + x1 * stride == layout * 2
    assert checked > 100


def _encode_ptr_maps(monkeypatch):
    """tma.encode standing in for the driver with a map that records its pointer and dims."""
    def encode(ptr, dtype, dims, box, stride):
        out = np.zeros((), dtype=tma.TENSOR_MAP_DTYPE)
        out["opaque"][:2] = (ptr, dims[0])
        return out
    monkeypatch.setattr(tma, "encode", encode)


def test_v5_maps_go_to_a_b_d_c_in_the_kernels_parameter_order(captured, monkeypatch):
    """v5_wgmma.cu takes (params, tma_a, tma_b, tma_d, tma_c): D's map must point at the output and
    C's at the residual (swapped, the kernel would write its result over c)."""
    _encode_ptr_maps(monkeypatch)
    a, b = F(512, 256, base_ptr=1 << 21), F(256, 384, base_ptr=1 << 23)
    out, c = F(512, 384, base_ptr=1 << 25), F(512, 384, base_ptr=1 << 27)
    deepgemm.gemm(a, b, out=out, c=c, kernel="v5", config={"DG_BN": 128, "DG_STAGES": 6})
    maps = [(int(x["opaque"][0]), int(x["opaque"][1])) for x in captured[0]["args"][1:]]
    assert maps == [(a.data.ptr, 256), (b.data.ptr, 384), (out.data.ptr, 384), (c.data.ptr, 384)]


class _FakeStream:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("m", [
    mat(4095, 4100, ld=4100, ptr=(1 << 20) + 2),                  # row-major: 4100 contiguous, 4095 rows
    mat(4100, 3, row_major=False, ld=4101),                       # column-major: 4100 contiguous, 3 columns
    mat(70000, 20, ld=20),                                        # more rows than one grid.y covers
])
def test_stage_copies_every_element_into_an_aligned_padded_buffer(monkeypatch, m):
    """stage_copy.cu: each thread of a 256-thread block (its __launch_bounds__) stores 8 elements of a
    row at i0 = 8 * (blockIdx.x * blockDim.x + threadIdx.x); rows go over blockIdx.y, striding by
    gridDim.y (at most 65535). The buffer holds every row at a pitch of whole 16-byte chunks."""
    import sys
    import types

    allocs, launches, compiles = [], [], []

    def alloc(nbytes):
        allocs.append(nbytes)
        return types.SimpleNamespace(ptr=1 << 32)
    cuda = types.SimpleNamespace(alloc=alloc, Device=lambda device: _FakeStream())
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(jit, "compile_kernel", lambda name, path, arch, defines: compiles.append((path.name, arch)) or name)
    monkeypatch.setattr(jit, "load_function", lambda kernel, device: lambda grid, block, args: launches.append((grid, block, args)))

    staged, buf = tma.stage(m, "float16", "sm_90a", 0, _FakeStream())
    inner, outer = (m.cols, m.rows) if m.row_major else (m.rows, m.cols)
    (grid, block, args), = launches
    assert compiles == [("stage_copy.cu", "sm_90a")]
    assert block == (256, 1, 1)
    assert [type(x) for x in args] == [np.uint64, np.int64, np.uint64, np.int64, np.int32, np.int32]
    src, ld_src, dst, ld_dst, n_inner, n_outer = (int(x) for x in args)
    assert (src, ld_src, dst, n_inner, n_outer) == (m.ptr, m.ld, buf.ptr, inner, outer)
    assert ld_dst % 8 == 0 and inner <= ld_dst < inner + 8          # 16-byte row pitch, no more padding
    # Every 8-element chunk of a row has a thread, and no block of the x grid is idle.
    assert grid[0] * block[0] * 8 >= inner > (grid[0] - 1) * block[0] * 8
    assert 1 <= grid[1] <= min(outer, 65535) and grid[2] == 1
    assert len(allocs) == 1 and allocs[0] >= outer * ld_dst * 2
    assert staged == dataclasses.replace(m, ptr=buf.ptr, ld=ld_dst)


def _grouped(m, n, k, a, b, d, **strides):
    return registry.Problem(m, n, k, "float16", "float16", a, b, registry.NO_EPILOGUE, cc=90, d=d,
                            groups=registry.Groups("batch", 4, **strides))


def test_grouped_maps_at_one_k_and_at_no_columns(fake_encode):
    """K = 1 still reads A and B (an M-major A, an N-major B: each one k-row deep); a problem with
    no columns has no tile, so no map (the driver refuses a dimension of 0)."""
    a, b = mat(128, 1, row_major=False, ld=128), mat(1, 256)
    p = _grouped(128, 256, 1, a, b, mat(128, 256), stride_a=128, stride_b=256, stride_d=128 * 256)
    assert tma.grouped_reason(p) is None
    a_plan, b_plan, _, _ = tma.grouped_plans(p, 128, 256, False)
    assert a_plan[0] == (128, 1, 4) and b_plan[0] == (256, 1, 4)
    empty = _grouped(128, 0, 64, mat(128, 64), mat(64, 0), mat(128, 0), stride_a=128 * 64, stride_d=0)
    assert all(x is tma.NO_MAP for x in tma.grouped_maps(empty, 128, 256, False)) and not fake_encode


def test_group_strides_tma_can_step():
    """A group stride is a positive multiple of 16 bytes (8 fp16 elements) or 0 (one operand shared
    by every group); any other is refused, naming the operand."""
    for stride in (0, 8, 24, 64 * 512):
        assert tma.stride_reason(stride, "b") is None, stride
    for stride, why in ((4, "not a multiple of 8"), (12, "not a multiple of 8"), (-8, "negative")):
        assert "b's group stride" in tma.stride_reason(stride, "b") and why in tma.stride_reason(stride, "b")


def test_grouped_problem_at_k_zero_reads_neither_operand():
    """At K = 0 the kernel reads no A or B: an A that TMA could not read is no reason to refuse the
    problem, and neither operand gets a map (the driver refuses a dimension of 0)."""
    a = mat(128, 0, ptr=(1 << 20) + 2)                       # off its 16-byte alignment
    p = _grouped(128, 256, 0, a, mat(0, 256), mat(128, 256), stride_a=12, stride_b=256, stride_d=128 * 256)
    assert tma.grouped_reason(p) is None
    a_plan, b_plan, d_plan, _ = tma.grouped_plans(p, 128, 256, False)
    assert a_plan is None and b_plan is None and d_plan is not None
    read = dataclasses.replace(p, k=64, a=mat(128, 64, ptr=(1 << 20) + 2), b=mat(64, 256))
    assert "16-byte aligned" in tma.grouped_reason(read)


def test_grouped_maps_of_a_one_row_problem_are_encoded(fake_encode):
    """Only a problem with no rows, columns or groups goes without maps: one row of each group
    still reads A and B and stores D through them."""
    p = _grouped(1, 256, 64, mat(1, 64), mat(64, 256), mat(1, 256), stride_a=64, stride_b=64 * 256, stride_d=256)
    maps = tma.grouped_maps(p, 64, 256, False)
    assert all(x is not tma.NO_MAP for x in maps[:3]) and maps[3] is tma.NO_MAP
    assert [e["dims"] for e in fake_encode] == [(64, 1, 4), (256, 64, 4), (256, 1, 4)]


def test_a_one_row_operands_stride_is_its_row_rounded_up_to_16_bytes():
    """A dimension of size 1 has no stride the copy uses, but the driver still takes one: the row's
    bytes rounded up to a multiple of 16."""
    assert tma.box_plan(mat(1, 100), 64, k_major=True)[2] == 208
    assert tma.box_plan(mat(1, 96), 64, k_major=True)[2] == 192
    assert tma.box_plan(mat(100, 1, row_major=False, ld=100), 64, k_major=True)[2] == 208


@pytest.mark.parametrize("b_row", [False, True])
def test_b_shared_by_multicast_splits_a_k_major_box_between_the_pair(b_row):
    """With DG_CLUSTER_M = 2 each block of a pair loads half of the shared B tile: a K-major B's box
    is half the tile's columns (the kernel's multicast loads, and the bytes each stage expects); an
    N-major B is loaded in its 64 x 64 boxes either way. A and D keep their boxes."""
    b = mat(512, 1024) if b_row else mat(512, 1024, row_major=False, ld=512)
    p = registry.Problem(256, 1024, 512, "float16", "float16", mat(256, 512), b, registry.NO_EPILOGUE, cc=90,
                         d=mat(256, 1024))
    alone = [plan for _, plan in tma._plans(p, 128, 256, False, b_share=1)]
    shared = [plan for _, plan in tma._plans(p, 128, 256, False, b_share=2)]
    assert shared[1][1] == ((64, 64) if b_row else (64, 128)) and alone[1][1] == ((64, 64) if b_row else (64, 256))
    assert shared[0] == alone[0] and shared[2] == alone[2]


def test_a_plans_maps_are_encoded_once_per_address(fake_encode, monkeypatch):
    """pointer_maps (a replay plan's maps): each operand's map is encoded for an address it does not
    hold, and reused for one it does (the map holds only the address and the geometry); past
    MAPS_PER_OPERAND addresses an operand starts again. Every map handed out is its address's,
    in the kernel's argument order (A, B, D, C)."""
    monkeypatch.setattr(tma, "MAPS_PER_OPERAND", 3)
    problem = registry.Problem(256, 256, 128, "float16", "float16", epilogue=registry.Epilogue(residual="float16"),
                               a=mat(256, 128), b=mat(128, 256), d=mat(256, 256), c=mat(256, 256))
    maps = tma.pointer_maps(problem, 128, 128, True)
    encoded = lambda: [(e["ptr"], e["box"]) for e in fake_encode]
    base = 1 << 30
    first = maps(base, base + 0x100000, base + 0x200000, base + 0x300000)
    assert len(fake_encode) == 4                                        # A, B, D, C
    words = lambda maps: [tuple(int(w) for w in m["opaque"][:2]) for m in np.frombuffer(maps, tma.TENSOR_MAP_DTYPE)]
    assert words(first) == [(base + 0x100000 * i, i + 1) for i in range(4)]   # each its own, in argument order
    again = maps(base, base + 0x100000, base + 0x200000, base + 0x300000)
    assert len(fake_encode) == 4 and again == first
    new_a = maps(base + 0x400000, base + 0x100000, base + 0x200000, base + 0x300000)   # a new A only
    assert encoded()[4:] == [(base + 0x400000, encoded()[0][1])]
    assert words(new_a) == [(base + 0x400000, 5)] + words(first)[1:]
    maps(base + 0x500000, base + 0x100000, base + 0x200000, base + 0x300000)   # A's third address
    assert len(fake_encode) == 6
    maps(base, base + 0x100000, base + 0x200000, base + 0x300000)       # still held
    assert len(fake_encode) == 6
    maps(base + 0x600000, base + 0x100000, base + 0x200000, base + 0x300000)   # a fourth: A starts again
    maps(base, base + 0x100000, base + 0x200000, base + 0x300000)       # so this one is encoded again
    assert [e["ptr"] for e in fake_encode[6:]] == [base + 0x600000, base]
    other = tma.pointer_maps(problem, 128, 128, True)                   # another plan keeps its own
    other(base, base + 0x100000, base + 0x200000, base + 0x300000)
    assert len(fake_encode) == 12


def test_no_replay_maps_where_a_call_stages_an_operand_or_reads_none(fake_encode):
    """pointer_maps is None wherever the plan cannot be a function of the pointers alone: an operand
    TMA cannot read (staged anew per call), K = 0 (no A or B map), groups (not replayed from
    pointers)."""
    def problem(a, k=128, groups=None):
        return registry.Problem(256, 256, k, "float16", "float16", a=a, b=mat(k, 256), d=mat(256, 256),
                                groups=groups)
    assert tma.pointer_maps(problem(mat(256, 128)), 128, 128, False) is not None
    assert tma.pointer_maps(problem(mat(256, 128, ptr=(1 << 20) + 2)), 128, 128, False) is None
    assert tma.pointer_maps(problem(mat(256, 0), k=0), 128, 128, False) is None
    batch = registry.Groups("batch", 4, stride_a=256 * 128, stride_b=128 * 256, stride_d=256 * 256)
    assert tma.pointer_maps(problem(mat(256, 128), groups=batch), 128, 128, False) is None
    assert not fake_encode   # nothing is encoded before a replay asks for an address


def test_grouped_reason_names_an_operand_or_a_group_stride_tma_cannot_take():
    good = dict(stride_a=128 * 64, stride_b=64 * 256, stride_d=128 * 256)
    assert tma.grouped_reason(_grouped(128, 256, 64, mat(128, 64), mat(64, 256), mat(128, 256), **good)) is None
    misaligned = _grouped(128, 256, 64, mat(128, 64, ptr=(1 << 20) + 2), mat(64, 256), mat(128, 256), **good)
    assert "base address is not 16-byte aligned" in tma.grouped_reason(misaligned)
    odd_stride = _grouped(128, 256, 64, mat(128, 64), mat(64, 256), mat(128, 256), **dict(good, stride_b=64 * 256 + 1))
    assert tma.grouped_reason(odd_stride) == "b's group stride 16385 is not a multiple of 8 elements (16-byte strides)"


def test_grouped_d_and_c_maps_step_by_their_group_strides(fake_encode):
    """D's and a 16-bit C's 3-D maps (64 x 64 boxes, one group deep) where their group strides are
    whole 16 bytes; none where a stride is not; a shared operand (stride 0) gets depth 1; no maps
    at all without groups."""
    strides = dict(stride_a=128 * 64, stride_b=0, stride_d=128 * 256, stride_c=128 * 256)

    def problem(count=4, **over):
        return registry.Problem(128, 256, 64, "float16", "float16", mat(128, 64), mat(64, 256),
                                registry.Epilogue(residual="float16"), cc=90, d=mat(128, 256), c=mat(128, 256),
                                groups=registry.Groups("batch", count, **dict(strides, **over)))
    a_plan, b_plan, d_plan, c_plan = tma.grouped_plans(problem(), 128, 256, True)
    assert d_plan == c_plan == ((256, 128, 4), (64, 64, 1), (512, 128 * 256 * 2))
    assert b_plan[0][2] == 1 and b_plan[1][2] == 1 and b_plan[2] == (512, 512 * 64)   # shared B: depth 1
    assert a_plan[0] == (64, 128, 4)
    _, _, d_plan, c_plan = tma.grouped_plans(problem(stride_d=128 * 256 + 1, stride_c=128 * 256 + 3), 128, 256, True)
    assert d_plan is None and c_plan is None
    assert tma.grouped_plans(problem(), 128, 256, False)[3] is None          # C not staged: no map
    assert all(x is tma.NO_MAP for x in tma.grouped_maps(problem(count=0), 128, 256, True)) and not fake_encode
    assert sum(x is not tma.NO_MAP for x in tma.grouped_maps(problem(), 128, 256, True)) == 4
