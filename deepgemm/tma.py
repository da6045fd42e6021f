"""TMA tensor maps for V5: which operands TMA can take, the 128-byte CUtensorMap for each, and the
staging copy for those it cannot take.

The maps are encoded by the driver (`cuTensorMapEncodeTiled`, called through ctypes on the
libcuda.so.1 that CuPy already loaded, so nothing beyond CuPy is needed) and passed to the kernel
by value as `__grid_constant__` parameters. The box shapes here must match what
kernels/v5_wgmma.cu issues: a K-major operand is loaded as one box of 64 k-values x rows, an
M/N-major one as 64 x 64 boxes (64 16-bit values = the 128-byte swizzle span).

Batched and grouped problems (registry.Groups; V5's DG_GROUPED build) get 3-D maps: the two
dimensions of group 0's matrix, then the groups, stride_x elements apart. An operand every group
shares, and the contiguous modes' A and D (whose groups are row ranges of one matrix), get a map
of depth 1 and the kernel's third coordinate is 0 there. Nothing is staged for a grouped problem:
an operand TMA cannot read makes V5 refuse it (grouped_reason), and another kernel runs it.
"""
from __future__ import annotations

import ctypes
import dataclasses
from functools import lru_cache

import numpy as np

from deepgemm import caches
from deepgemm.device import bind_context

TMA_ALIGN_BYTES = 16       # global base address and every stride (driver requirement)
ELEMENT_BYTES = 2          # fp16 / bf16
BOX_INNER = 64             # 64 x 2 B = 128 B, the swizzle span
DATA_TYPES = {"float16": 6, "bfloat16": 9}   # CUtensorMapDataType (cuda.h)
SWIZZLE_128B = 3
L2_PROMOTION_256B = 3
CUDA_ERROR_INVALID_CONTEXT = 201   # CUresult (cuda.h)
TENSOR_MAP_DTYPE = np.dtype([("opaque", np.uint64, (16,))])   # CUtensorMap: 128 bytes


def operand_reason(mat, name: str) -> str | None:
    """Why TMA cannot read this operand directly (None if it can). mat: arrays.Matrix."""
    if mat.ptr % TMA_ALIGN_BYTES:
        return f"{name}'s base address is not {TMA_ALIGN_BYTES}-byte aligned (a sliced view)"
    inner = mat.cols if mat.row_major else mat.rows
    outer = mat.rows if mat.row_major else mat.cols
    if outer > 1 and (mat.ld * ELEMENT_BYTES) % TMA_ALIGN_BYTES:
        return (f"{name}'s leading dimension {mat.ld} is not a multiple of {TMA_ALIGN_BYTES // ELEMENT_BYTES} "
                f"elements ({TMA_ALIGN_BYTES}-byte strides)")
    if (inner * ELEMENT_BYTES) % TMA_ALIGN_BYTES:
        # TMA stores write a row's last partial 16 bytes whole (seen on the H200); loads are not
        # trusted to zero-fill inside such a chunk either: the staged copy zero-pads it.
        return (f"{name}'s contiguous extent {inner} is not a multiple of {TMA_ALIGN_BYTES // ELEMENT_BYTES} "
                f"elements")
    if inner >= 2**32 or outer >= 2**32:
        return f"{name} has a dimension of 2^32 elements or more"
    return None


def box_plan(mat, rows_per_tile: int, k_major: bool) -> tuple[tuple[int, int], tuple[int, int], int]:
    """(global dims inner-first, box dims inner-first, stride of dim 1 in bytes) for an operand.

    K-major (k contiguous): dims (K, rows), box (64, rows_per_tile). M/N-major: dims (rows, K),
    box (64, 64). `mat` is seen as its contiguous dimension first: for A (M x K) row-major the
    contiguous one is K; for B (K x N) row-major it is N."""
    inner = mat.cols if mat.row_major else mat.rows
    outer = mat.rows if mat.row_major else mat.cols
    box = (BOX_INNER, rows_per_tile) if k_major else (BOX_INNER, BOX_INNER)
    # A dimension of size 1 has no meaningful stride; any multiple of 16 B satisfies the driver.
    stride = mat.ld * ELEMENT_BYTES if outer > 1 else -(-inner * ELEMENT_BYTES // TMA_ALIGN_BYTES) * TMA_ALIGN_BYTES
    return (inner, outer), box, stride


def a_box_rows(m: int, block_m: int) -> int:
    """Rows of a K-major A's box in the plain build: the tile's, or M rounded up to 8 where A is
    shorter than a tile (decode). A taller box would have the copy engine fill the missing rows
    with zeros in every k-block, and a 64-row box at M = 1..16 made V5 up to 50 % slower than at
    M = 64 with the same weights. kernels/v5_wgmma.cu computes the same count for the bytes each
    stage expects."""
    return min(block_m, max(8, -(-m // 8) * 8))


@lru_cache(maxsize=1)
def _encode_fn():
    lib = ctypes.CDLL("libcuda.so.1")
    fn = lib.cuTensorMapEncodeTiled
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                   ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                   ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
                   ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return fn


@lru_cache(maxsize=256)
def encode(ptr: int, dtype: str, dims: tuple, box: tuple, stride) -> np.ndarray:
    """A 2-D or 3-D tiled tensor map with 128-byte swizzle and zero fill out of bounds, as a 0-d
    NumPy record CuPy passes by value. dims and box inner-first; stride: the byte stride of dim 1
    (2-D), or of dims 1 and 2 as a pair (3-D). Cached: weights and repeated shapes reuse their maps."""
    rank = len(dims)
    strides = tuple(stride) if isinstance(stride, tuple) else (stride,)
    if rank not in (2, 3) or len(box) != rank or len(strides) != rank - 1:
        raise ValueError(f"a {rank}-D tensor map needs {rank} box sizes and {rank - 1} strides, got box={box}, "
                         f"stride={stride}")
    out = np.zeros((), dtype=TENSOR_MAP_DTYPE)

    def call():
        return _encode_fn()(
            out.ctypes.data, DATA_TYPES[dtype], rank, ctypes.c_void_p(ptr),
            (ctypes.c_uint64 * rank)(*dims), (ctypes.c_uint64 * (rank - 1))(*strides),
            (ctypes.c_uint32 * rank)(*box), (ctypes.c_uint32 * rank)(*(1,) * rank),
            0, SWIZZLE_128B, L2_PROMOTION_256B, 0)
    status = call()
    if status == CUDA_ERROR_INVALID_CONTEXT:
        bind_context()   # a thread whose first CUDA work is this call has no context yet
        status = call()
    if status != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed with CUresult {status} "
                           f"(dims={dims}, box={box}, stride={stride} B, ptr=0x{ptr:x})")
    return out


STAGE_THREADS = 256
STAGE_ROWS_PER_LAUNCH = 65535   # grid.y limit; the kernel strides over the rest


def staged_ld(mat) -> int:
    """The staging buffer's leading dimension: the contiguous extent rounded up to 8 elements."""
    inner = mat.cols if mat.row_major else mat.rows
    return -(-inner // 8) * 8


def stage_grid(inner: int, outer: int) -> tuple[int, int, int]:
    """stage_copy.cu's grid (blocks of STAGE_THREADS): x over the contiguous extent, 8 elements a
    thread; y over the rows, which the kernel strides past the grid's height."""
    return -(-inner // (8 * STAGE_THREADS)), min(outer, STAGE_ROWS_PER_LAUNCH), 1


def stage(mat, dtype: str, arch: str, device: int, stream):
    """Copy an operand TMA cannot read into a fresh 16-byte-aligned buffer with the same layout.
    Returns (the staged Matrix, the CuPy buffer that owns it). Runs on `stream`."""
    import cupy
    from deepgemm import jit

    inner = mat.cols if mat.row_major else mat.rows
    outer = mat.rows if mat.row_major else mat.cols
    ld = staged_ld(mat)
    with cupy.cuda.Device(device), stream:
        buf = cupy.cuda.alloc(max(outer * ld * ELEMENT_BYTES, 16))   # pool blocks are 256-byte aligned
        fn = jit.load_function(jit.compile_kernel("stage_copy", jit.KERNEL_DIR / "stage_copy.cu", arch, {}), device)
        fn(stage_grid(inner, outer), (STAGE_THREADS, 1, 1), (np.uint64(mat.ptr), np.int64(mat.ld), np.uint64(buf.ptr),
                                        np.int64(ld), np.int32(inner), np.int32(outer)))
    return dataclasses.replace(mat, ptr=buf.ptr, ld=ld), buf


def prepare(problem, block_m: int, block_n: int, stages_c: bool, arch: str, device: int, stream, b_share: int = 1):
    """V5's extra kernel arguments (tensor maps of A, B, D and C), staging the operands TMA cannot
    read (never for a grouped problem: see grouped_maps). stages_c: whether the config stages a
    16-bit C in shared memory (_c_plan); b_share: how many blocks share each B tile, each loading
    1/b_share of its rows (DG_CLUSTER_M: a K-major B's box is that many rows). Returns (args,
    buffers to keep alive until the launch is enqueued)."""
    if problem.groups is not None:
        return grouped_maps(problem, block_m, block_n, stages_c), []
    if problem.k == 0:   # no k-blocks: the kernel never reads A/B (and the driver refuses size 0)
        d_map = d_store_map(problem.d, problem.out_dtype, block_n)
        return (NO_MAP, NO_MAP, d_map, _c_load_map(problem, stages_c)), []
    keep = []
    a, b = problem.a, problem.b
    if operand_reason(a, "a"):
        a, buf = stage(a, problem.in_dtype, arch, device, stream)
        keep.append(buf)
    if operand_reason(b, "b"):
        b, buf = stage(b, problem.in_dtype, arch, device, stream)
        keep.append(buf)
    d, c = problem.d, problem.c
    plans = _plans(dataclasses.replace(problem, a=a, b=b), block_m, block_n, stages_c, b_share)
    ptrs = (a.ptr, b.ptr, d.ptr if d else 0, c.ptr if c else 0)
    return tuple(encode(ptr, dtype, *plan) if plan else NO_MAP for ptr, (dtype, plan) in zip(ptrs, plans)), keep


NO_MAP = np.zeros((), dtype=TENSOR_MAP_DTYPE)   # passed where the kernel will not use a map


def _d_plan(d, out_dtype: str, block_n: int):
    """(dims, box, stride) of the output's map for V5's TMA-store epilogue (64 x 64 boxes), or None
    when the kernel writes D itself: it decides under the same condition (d_by_tma in
    v5_wgmma.cu). A tile must be whole boxes (BN a multiple of 64), and the row length counts too:
    a TMA store writes a row's last partial 16 bytes whole."""
    if (d is None or out_dtype not in DATA_TYPES or block_n % BOX_INNER or d.ptr % TMA_ALIGN_BYTES
            or (d.ld * ELEMENT_BYTES) % TMA_ALIGN_BYTES or (d.cols * ELEMENT_BYTES) % TMA_ALIGN_BYTES):
        return None
    return (d.cols, d.rows), (BOX_INNER, BOX_INNER), d.ld * ELEMENT_BYTES


def d_store_map(d, out_dtype: str, block_n: int) -> np.ndarray:
    """The output's tensor map, or NO_MAP where the kernel stores D itself (see _d_plan)."""
    plan = _d_plan(d, out_dtype, block_n)
    return encode(d.ptr, out_dtype, *plan) if plan else NO_MAP


def _c_plan(problem, stages_c: bool):
    """(dims, box, stride) of the residual C's map, or None where V5 does not load C by TMA: the
    config does not stage C (stages_c: 16-bit D staged in shared memory, no split-K), C is not
    16-bit, or its base or row pitch is not a multiple of 16 bytes (c_by_tma in v5_wgmma.cu
    decides alike; a grouped C also needs a group stride TMA can take, checked by the caller).
    64 x 64 boxes land in the staging tile in the layout D leaves it in. A row's end needs no
    alignment: the kernel never stores the columns past N that a load may bring."""
    c, dtype = problem.c, problem.epilogue.residual
    if (not stages_c or c is None or dtype not in DATA_TYPES or c.ptr % TMA_ALIGN_BYTES
            or (c.ld * ELEMENT_BYTES) % TMA_ALIGN_BYTES):
        return None
    return (c.cols, c.rows), (BOX_INNER, BOX_INNER), c.ld * ELEMENT_BYTES


def _c_load_map(problem, stages_c: bool) -> np.ndarray:
    """The residual's tensor map, or NO_MAP where V5 does not load C by TMA (see _c_plan)."""
    plan = _c_plan(problem, stages_c)
    return encode(problem.c.ptr, problem.epilogue.residual, *plan) if plan else NO_MAP


# Maps kept per operand of one geometry (a replay plan's), by address. A map holds only the address
# and the geometry, so one encoded for an address that was freed and handed out again is still
# exact. Repeat calls mostly reuse addresses: a layer's weights, and the activations a caching
# allocator gives back in the same order each step; each hit saves a driver call of about 1 us.
MAPS_PER_OPERAND = 64


def _plans(problem, block_m: int, block_n: int, stages_c: bool, b_share: int = 1):
    """(dtype, plan) of A, B, D and C for calls with this problem's geometry, whose operands TMA
    can read (operand_reason is None) and K > 0; plan (dims, box, stride), None for no map."""
    a, b = problem.a, problem.b
    a_rows = a_box_rows(problem.m, block_m) if a.row_major else block_m
    return ((problem.in_dtype, box_plan(a, a_rows, k_major=a.row_major)),
            (problem.in_dtype, box_plan(b, block_n // b_share, k_major=not b.row_major)),
            (problem.out_dtype, _d_plan(problem.d, problem.out_dtype, block_n)),
            (problem.epilogue.residual, _c_plan(problem, stages_c)))


def _by_address(dtype: str, plan):
    """address -> the bytes of `plan`'s map (dims, box, stride) at that address, remembered for up
    to MAPS_PER_OPERAND addresses, then all forgotten at once (dict.clear: one step, so threads
    that share a plan never see the table half changed); NO_MAP's for every address if plan is None.
    Bytes, not the map: a replay copies them into the launch's argument buffer as they are."""
    if plan is None:
        none = NO_MAP.tobytes()
        return lambda ptr: none
    known: dict = {}

    def get(ptr):
        m = known.get(ptr)
        if m is None:
            if len(known) >= MAPS_PER_OPERAND:
                known.clear()
            m = known[ptr] = encode(ptr, dtype, *plan).tobytes()
        return m
    return get


def pointer_maps(problem, block_m: int, block_n: int, stages_c: bool, b_share: int = 1):
    """For api's plan cache: a function (a_ptr, b_ptr, d_ptr, c_ptr) -> the bytes of the maps of A,
    B, D and C, one after the other as the kernel's arguments lie (Launcher's tail); or None when
    this geometry needs staging (or has K = 0), and for grouped problems (not replayed from pointers
    yet). Pointers that break 16-byte alignment change the plan key, so a plan never sees one."""
    if (problem.groups is not None or problem.k == 0 or operand_reason(problem.a, "a")
            or operand_reason(problem.b, "b")):
        return None
    map_a, map_b, map_d, map_c = (_by_address(dtype, plan) for dtype, plan in _plans(problem, block_m, block_n, stages_c, b_share))

    def maps(pa, pb, pd, pc):   # one concatenation: ~0.5 us on a 2-core CI machine, four map copies ~1.5
        return map_a(pa) + map_b(pb) + map_d(pd) + map_c(pc)
    return maps


# ---------------------------------------------------------------------------------------------
# Batched and grouped problems

def stride_reason(stride: int, name: str) -> str | None:
    """Why TMA cannot step from one group's `name` to the next (None if it can): a map's strides
    are positive multiples of 16 bytes. 0 (one operand shared by every group) needs no stride."""
    if stride < 0:
        return f"{name}'s group stride {stride} is negative"
    if (stride * ELEMENT_BYTES) % TMA_ALIGN_BYTES:
        return (f"{name}'s group stride {stride} is not a multiple of {TMA_ALIGN_BYTES // ELEMENT_BYTES} "
                f"elements ({TMA_ALIGN_BYTES}-byte strides)")
    return None


def _whole(mat, rows: int, cols: int):
    """Group 0's matrix with the problem's extent: M is the rows per group (batch, masked) or of
    every group together (sizes, offsets: the one A and D whose row ranges the groups are), which
    the map must span whatever rows the caller's description holds."""
    return dataclasses.replace(mat, rows=rows, cols=cols)


def grouped_reason(problem) -> str | None:
    """Why V5 cannot read a grouped problem's A or B through TMA (None if it can): operand_reason
    for group 0's matrix, a group stride TMA cannot take, or a column-major A of contiguous groups.
    Such problems are refused, not staged (a copy per group, of sizes the host may not know); with
    K = 0 neither operand is read."""
    g = problem.groups
    if problem.k == 0:
        return None
    for mat, rows, cols, stride, name in ((problem.a, problem.m, problem.k, g.stride_a, "a"),
                                          (problem.b, problem.k, problem.n, g.stride_b, "b")):
        if mat is None:   # shape only (explain, the tuner's planning): nothing to check
            continue
        reason = operand_reason(_whole(mat, rows, cols), name) or stride_reason(stride, name)
        if reason:
            return reason
    if g.contiguous and problem.a is not None and not problem.a.row_major:
        # A TMA box must start 16-byte aligned along the contiguous dimension: on the H200 every
        # contiguous-group call with a column-major A at rows off that alignment (8 of 8 random
        # cases) stopped with an illegal instruction. A column-major A's contiguous dimension is
        # M, and a contiguous group's tiles start at its first row, which may be any row.
        return ("a is column-major (M-contiguous) and its groups are row ranges of it (sizes or offsets): "
                "a group starting at a row that is not a multiple of 8 would start a TMA box off its "
                "16-byte alignment; a row-major (K-contiguous) a can run on v5")
    return None


def grouped_box_plan(mat, rows: int, cols: int, stride: int, count: int, rows_per_tile: int,
                     k_major: bool) -> tuple[tuple[int, int, int], tuple[int, int, int], tuple[int, int]]:
    """(dims, box, strides in bytes) of a grouped operand's 3-D map: box_plan's two dimensions of
    the rows x cols matrix at `mat`, then `count` groups `stride` elements apart, one group per box.
    With stride 0 (shared by every group, or the groups are row ranges of this one matrix) the map
    has depth 1 and the kernel's third coordinate is always 0; its unused stride is the matrix's
    extent, the one a packed layout would have."""
    (inner, outer), box, row_stride = box_plan(_whole(mat, rows, cols), rows_per_tile, k_major)
    if stride:
        return (inner, outer, count), box + (1,), (row_stride, stride * ELEMENT_BYTES)
    return (inner, outer, 1), box + (1,), (row_stride, row_stride * outer)


def grouped_plans(problem, block_m: int, block_n: int, stages_c: bool):
    """(A's, B's, D's, C's plan) for a grouped problem whose operands TMA can read (grouped_reason
    is None); None for a map the kernel never reads: A and B at K = 0, D where the kernel stores it
    itself (_d_plan's conditions, and D's group stride a multiple of 16 bytes: d_by_tma in
    v5_wgmma.cu decides alike), C where it does not load it by TMA (_c_plan's conditions and C's
    group stride: c_by_tma)."""
    g, m, n, k = problem.groups, problem.m, problem.n, problem.k
    a_plan = b_plan = d_plan = c_plan = None
    if k > 0:
        a_plan = grouped_box_plan(problem.a, m, k, g.stride_a, g.count, block_m, k_major=problem.a.row_major)
        b_plan = grouped_box_plan(problem.b, k, n, g.stride_b, g.count, block_n, k_major=not problem.b.row_major)
    d, c = problem.d, problem.c
    if d is not None and _d_plan(_whole(d, m, n), problem.out_dtype, block_n) and not stride_reason(g.stride_d, "d"):
        d_plan = grouped_box_plan(d, m, n, g.stride_d, g.count, BOX_INNER, k_major=False)
    if _c_plan(problem, stages_c) and not stride_reason(g.stride_c, "c"):
        c_plan = grouped_box_plan(c, m, n, g.stride_c, g.count, BOX_INNER, k_major=False)
    return a_plan, b_plan, d_plan, c_plan


def grouped_maps(problem, block_m: int, block_n: int, stages_c: bool) -> tuple:
    """The maps of A, B, D and C for a grouped problem (NO_MAP where the kernel reads none). A
    problem with no rows, columns or groups has no tiles, so no map (the driver refuses a dimension
    of 0)."""
    reason = grouped_reason(problem)
    if reason:
        raise ValueError(f"V5 cannot run this grouped problem: {reason}")
    if problem.m == 0 or problem.n == 0 or problem.groups.count == 0:
        return NO_MAP, NO_MAP, NO_MAP, NO_MAP
    plans = grouped_plans(problem, block_m, block_n, stages_c)
    mats = (problem.a, problem.b, problem.d, problem.c)
    dtypes = (problem.in_dtype, problem.in_dtype, problem.out_dtype, problem.epilogue.residual)
    return tuple(encode(mat.ptr, dtype, *plan) if plan else NO_MAP for mat, dtype, plan in zip(mats, dtypes, plans))


caches.register("tensor maps", __name__, "encoded TMA tensor maps by pointer and geometry (tma.encode)",
                encode.cache_clear)
