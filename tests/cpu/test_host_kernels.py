"""The whole ladder (V0-V5) and small_m run on the CPU from their own source, through the real gemm() path
(V5's tests: test_host_v5.py, with this file's fixtures and helpers).

Each call goes through deepgemm.gemm() on fake device arrays over NumPy memory (argument checks,
dispatch, the variant's defines, GemmParams, the grid and the dynamic shared memory, V5's tensor
maps, all as on a GPU); the launch is then run by the kernel's source compiled as host C++
(tests/cpu/harness/grid_host.h: each CUDA thread a coroutine, __syncthreads() where the next one
runs, V4's ldmatrix and mma.sync computed for a warp once all 32 lanes have handed in their
operands, and its cp.async copies landing in shared memory only when a cp.async.wait_group forces
them; V5's mbarriers, named barriers, TMA loads and stores through the maps' fields, and wgmma
through its shared-memory descriptors, each as late or as early as the PTX allows), in a forked
child, and the quick sweep's oracles judge the output (integer-exact, error bounds, cuBLAS,
poisoned guard bands). The child reads copies of the operands placed against an inaccessible page
(alignment to 16 bytes kept, so at most 14 bytes lie between an operand's end and that page): a
read past an operand kills it with SIGSEGV, a misaligned 16-byte load or cp.async with SIGBUS, and
the test names the case. So a wrong index, guard, tile loop, fragment, descriptor, box coordinate,
epilogue step or store in these kernels fails the CPU tier, and so does a missing barrier, a
cp.async wait one group too shallow (the warps between two barriers run one after another, in
order and then in reverse, and a copy not waited for has not landed), or a V5 stage or staging tile
handed back before the wgmma or TMA store reading it is known to be done (a thread that completes
an mbarrier phase hands off to its waiters at once, TMA loads land when issued, wgmma and TMA stores
read shared memory at the wait that covers them). What this cannot see: a race that no such order
shows, the asm operand lists (the host replaces each instruction whole), and V5's thread-block
clusters (split-K, B shared by multicast: GPU only).
"""
import ctypes
import dataclasses
import faulthandler
import mmap
import os
import signal
import traceback
import types
import warnings
from pathlib import Path

import numpy as np
import pytest

import deepgemm
from deepgemm import jit
from deepgemm.params import POINTER_FIELDS
from deepgemm.reference import reference_gemm, round_to
from deepgemm.testing import sweep
from fake_gpu import as_fake, captured, gpus  # noqa: F401 (fixtures)
import host_harness

HOST_KERNELS = ("v0", "v1", "v2", "v3", "v4", "small_m")   # and V5: test_host_v5.py
PAGE = mmap.PAGESIZE
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
# Work per case: the host runs one CUDA thread after another on one core, so the large cases stay on the GPU.
MAX_MACS = 1 << 23
# V4's multiply-adds are done 2048 at a time (one mma.sync, computed for the whole warp at once), far
# cheaper on the host than the ladder's, thread by thread: it takes cases up to 6 x 2^23, so that its
# 16-byte cp.async path and the cuBLAS oracle run too (at V4's 256 x 128 tile, the quick sweep's
# 16-byte aligned operands come in problems of 2-3 x 2^23, its cuBLAS cases at 4.2 x 2^23).
KERNEL_MAX_MACS = {"v4": 6 << 23, "v5": 6 << 23}
# V5's persistent grid on the host: at most this many blocks (the kernel walks any grid), so that a
# block walks several tiles as on a GPU with more tiles than SMs: stages, staging units and the
# bias slots are used again, ping-pong consumers take turns, a TMA store of one tile is still
# pending while the next is staged.
HOST_PERSISTENT_BLOCKS = 3
try:
    from numpy.lib.array_utils import byte_bounds   # NumPy 2
except ImportError:
    byte_bounds = np.byte_bounds


def _macs(case) -> int:
    return case.problem.m * case.problem.n * max(case.problem.k, 1)


def on_the_host(config: tuple) -> bool:
    """Whether the host build runs this config: not V5's thread-block clusters (split-K, B shared by
    multicast), which only a GPU has."""
    c = dict(config)
    return c.get("DG_SPLIT_K", 1) == 1 and c.get("DG_CLUSTER_M", 1) == 1


def host_cases(kernel: str) -> list:
    """The GPU tier's sweep cases of `kernel` small enough for the host: the quick cases (every
    dtype, layout, epilogue and oracle kind, at the default config's tile edges) and the other
    configs the quick tier runs, at their own tile edges (up to twice the work: one tile row
    more than two, 323 k values; not the 315-tile problem)."""
    limit = KERNEL_MAX_MACS.get(kernel, MAX_MACS)
    quick = [c for c in sweep.quick_cases(kernel) if _macs(c) <= limit]
    configs = sweep.config_cases(kernel, sweep.quick_configs(kernel))
    return quick + [c for c in configs if _macs(c) <= 2 * limit and on_the_host(c.config)]


class _Guarded:
    """Copies of arrays in fresh mappings, each ending as close to an inaccessible page as its
    address modulo 16 allows, and the translation of pointers into them."""

    def __init__(self):
        self.ranges = []   # (lo, hi, new_lo)
        self._maps = []

    def add(self, x: np.ndarray) -> None:
        lo, hi = byte_bounds(x)
        n = hi - lo
        pages = max(1, -(-(n + 16) // PAGE))
        m = mmap.mmap(-1, (pages + 2) * PAGE)
        base = ctypes.addressof(ctypes.c_char.from_buffer(m))
        end = base + (pages + 1) * PAGE                       # the inaccessible page after the data
        start = end - n
        start -= (start - lo) % 16                            # same address modulo 16 as the original
        ctypes.memmove(start, lo, n)
        for guard in (base, end):
            assert _LIBC.mprotect(guard, PAGE, 0) == 0, os.strerror(ctypes.get_errno())
        self._maps.append(m)
        self.ranges.append((lo, hi, start))

    def translate(self, ptr: int) -> int:
        for lo, hi, new in self.ranges:
            if lo <= ptr < hi or ptr == lo:
                return new + (ptr - lo)
        return ptr


def _root(x: np.ndarray) -> np.ndarray:
    while isinstance(x.base, np.ndarray):
        x = x.base
    return x


class HostLauncher:
    """Stands in for the compile and the launch of gemm(): records the variant's source and defines,
    and runs each launch with the host build of that variant."""

    def __init__(self, lib_dir):
        self.lib_dir = lib_dir
        self.launches = 0
        self.kernel_dir = None   # a copy of kernels/ with a planted bug, instead of deepgemm's own

    def compile_kernel(self, name, path, arch, defines):
        if self.kernel_dir is not None:
            path = self.kernel_dir / Path(path).relative_to(jit.KERNEL_DIR)
        return types.SimpleNamespace(name=name, key=name, path=path, defines=dict(defines),
                                     resources={"smem": 0, "registers": 0})

    def run(self, compiled, grid, block, smem, args, inputs, out):
        """args: the launch's arguments, GemmParams first (V5: then its tensor maps, as the host
        encodes them: _host_encode)."""
        params, maps = args[0], args[1:]
        if maps:   # V5
            grid = (min(grid[0], HOST_PERSISTENT_BLOCKS), *grid[1:])
        lib = ctypes.CDLL(str(host_harness.build_kernel_library(self.lib_dir, compiled.path, compiled.defines,
                                                                self.kernel_dir)))
        root = _root(out)
        lo, hi = byte_bounds(root)
        shared = mmap.mmap(-1, max(hi - lo, 1))               # the output, shared with the child
        shared_base = ctypes.addressof(ctypes.c_char.from_buffer(shared))
        ctypes.memmove(shared_base, lo, hi - lo)
        with warnings.catch_warnings():   # Python 3.12+ warns about fork() beside threads; the child runs no Python threads
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:   # the child: operands against inaccessible pages, then the kernel
            status = 3
            try:
                faulthandler.disable()   # the child's death by a signal is the finding, not a crash to report
                guarded = _Guarded()
                for x in inputs:
                    if x.size and not np.shares_memory(x, root):   # a C inside the output is read there
                        guarded.add(x)
                guarded.ranges.append((lo, hi, shared_base))
                p = params.copy()
                for field in POINTER_FIELDS + ("group_rows",) * ("group_rows" in p.dtype.names):
                    if int(p[field]):
                        p[field] = guarded.translate(int(p[field]))
                spans = [v for lo_, hi_, new in guarded.ranges if hi_ > lo_ for v in (new, new + hi_ - lo_)]
                lib.dg_host_operands((ctypes.c_ulonglong * len(spans))(*spans), ctypes.c_uint(len(spans) // 2))
                lib.dg_host_blocks_backwards(ctypes.c_int(self.launches % 2))   # every other launch
                blob = p.tobytes()
                if maps:   # each map at the next multiple of 64 bytes (grid_host_launch.h), its base translated
                    blob += bytes(-len(blob) % 64)
                    for m in maps:
                        m = np.frombuffer(m.tobytes()[:HOST_MAP.itemsize], HOST_MAP).copy()
                        if m["magic"][0] == HOST_MAP_MAGIC:
                            m["base"] = guarded.translate(int(m["base"][0]))
                        blob += m.tobytes() + bytes(128 - HOST_MAP.itemsize)
                raw = ctypes.create_string_buffer(blob)
                status = lib.dg_host_launch(raw, *[ctypes.c_uint(v) for v in (*grid, *block, smem)])
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(status)
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            why = {signal.SIGSEGV: ": a read or write outside an operand or the block's shared memory",
                   signal.SIGBUS: ": a misaligned 16-byte load or copy (a GPU traps on it too)",
                   signal.SIGILL: ": an instruction used as the PTX does not allow (its message above)",
                   signal.SIGABRT: ": an instruction the host does not model (its message above)"}.get(sig, "")
            raise AssertionError(f"the host build of {compiled.name} died with {signal.Signals(sig).name}{why}")
        assert os.WEXITSTATUS(status) == 0, (f"the host launch of {compiled.name} failed (status {os.WEXITSTATUS(status)}: "
                                             f"1 = its threads met different barriers, 2 = a warp's lanes met different "
                                             f"warp-collective instructions or part of a warp met one, 3 = the launch "
                                             f"did not start, 4 = its threads waited for each other forever: a hang)")
        ctypes.memmove(lo, shared_base, hi - lo)
        self.launches += 1


@pytest.fixture(scope="session")
def lib_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("host-kernels")


# V5's tensor maps as the host build reads them (grid_host_runtime.cpp's HostTensorMap): the fields
# deepgemm/tma.py hands cuTensorMapEncodeTiled, in the 128 bytes of the map.
HOST_MAP = np.dtype([("magic", "<u4"), ("rank", "<u4"), ("base", "<u8"), ("dims", "<u8", (3,)),
                     ("strides", "<u8", (2,)), ("box", "<u4", (3,)), ("elem_bytes", "<u4"), ("swizzle_bytes", "<u4")])
HOST_MAP_MAGIC = 0x4D544744


def _host_encode(out, data_type, rank, ptr, dims, strides, box, elem_strides, interleave, swizzle, l2_promotion, oob_fill):
    """cuTensorMapEncodeTiled's stand-in: the arguments tma.encode passes, as a HostTensorMap. The
    host build models 16-bit elements, unit element strides, 128-byte swizzle and zero fill."""
    from deepgemm import tma
    assert data_type in tma.DATA_TYPES.values() and swizzle == tma.SWIZZLE_128B and interleave == 0 and oob_fill == 0
    assert all(elem_strides[i] == 1 for i in range(rank)), "element strides other than 1 are not modelled"
    m = np.zeros((), HOST_MAP)
    m["magic"], m["rank"], m["base"] = HOST_MAP_MAGIC, rank, ptr.value or 0
    m["dims"][:rank] = [dims[i] for i in range(rank)]
    m["strides"][:rank - 1] = [strides[i] for i in range(rank - 1)]
    m["box"][:rank] = [box[i] for i in range(rank)]
    m["elem_bytes"], m["swizzle_bytes"] = tma.ELEMENT_BYTES, 128
    ctypes.memmove(out, m.tobytes(), HOST_MAP.itemsize)
    return 0


@pytest.fixture
def host(monkeypatch, captured, lib_dir):
    """gemm() on NumPy arrays through the fakes, each launch run by the host build of its variant."""
    from deepgemm import api, tma
    launcher = HostLauncher(lib_dir)
    monkeypatch.setattr(jit, "compile_kernel", launcher.compile_kernel)
    pending = []
    monkeypatch.setattr(api, "launch", lambda compiled, dev, grid, block, smem, args, stream, pdl=False:
                        pending.append((compiled, grid, block, smem, args)))
    # V5: its tensor maps encoded for the host build, and the operands TMA cannot read staged by a
    # NumPy copy (stage_copy.cu itself runs on the host in test_stage_copy.py)
    tma.encode.cache_clear()
    monkeypatch.setattr(tma, "_encode_fn", lambda: _host_encode)
    staged = []

    def stage(mat, dtype, arch, device, stream):
        inner, outer = (mat.cols, mat.rows) if mat.row_major else (mat.rows, mat.cols)
        ld = tma.staged_ld(mat)
        raw = np.zeros(outer * ld + 8, np.uint16)
        buf = raw[(-raw.ctypes.data % 16) // 2:][:outer * ld]   # 16-byte aligned, as a pool block
        for r in range(outer):
            ctypes.memmove(buf.ctypes.data + 2 * r * ld, mat.ptr + 2 * r * mat.ld, 2 * inner)
        staged.append(buf)
        return dataclasses.replace(mat, ptr=buf.ctypes.data, ld=ld), buf
    monkeypatch.setattr(tma, "stage", stage)

    real_gemm = deepgemm.gemm

    def launched(api_call, a, b, out, kw, empty_ok=False):
        """api_call(a, b, out=out, **kw) on fakes: its one launch (None for an empty problem where
        empty_ok), and the arrays it reads."""
        arrays = [x for x in (a, b, *kw.values()) if isinstance(x, np.ndarray)]
        api_call(as_fake(a), as_fake(b), out=as_fake(out), **{k: as_fake(v) for k, v in kw.items()})
        arrays += staged   # V5's staged copies of operands TMA cannot read
        staged.clear()
        assert len(pending) == 1 or (empty_ok and not pending), f"{len(pending)} launches for one call"
        return (pending.pop() if pending else None), arrays

    def gemm(a, b, *, kernel, out, **kw):
        (compiled, grid, block, smem, args), arrays = launched(real_gemm, a, b, out, dict(kw, kernel=kernel))
        if gemm.asked is not None:   # prebuild's pass: note the variant; the reference stands in for its output
            gemm.asked[(str(compiled.path), tuple(sorted(compiled.defines.items())))] = compiled
            epilogue = {k: v for k, v in kw.items() if k != "config"}
            out[...] = round_to(reference_gemm(a, b, **epilogue), str(out.dtype))
            return
        launcher.run(compiled, tuple(grid), tuple(block), int(smem), args, arrays, out)

    def run(api_call, a, b, *, out, **kw):   # any other API call with at most one launch (grouped_gemm)
        launch, arrays = launched(api_call, a, b, out, kw, empty_ok=True)
        arrays += gemm.uploaded   # what the call copied to the "device" (host group sizes)
        gemm.uploaded = []
        if launch is not None:
            compiled, grid, block, smem, args = launch
            launcher.run(compiled, tuple(grid), tuple(block), int(smem), args, arrays, out)
    gemm.launcher, gemm.asked, gemm.run, gemm.uploaded = launcher, None, run, []
    yield gemm
    tma.encode.cache_clear()   # no host map outlives the test


def prebuild(host, cases) -> int:
    """Build the host libraries of every variant the cases launch, in parallel (one build is about
    half a second of the compiler's time; a kernel's quick cases ask for about 45): the cases run
    once through gemm() with the reference as the output, to learn the variants."""
    from concurrent.futures import ThreadPoolExecutor
    host.asked = {}
    try:
        with np.errstate(over="ignore"):
            for i, case in enumerate(cases):
                sweep.run_case(case, np.random.default_rng(i), xp=np, gemm_fn=host)
        asked = list(host.asked.values())
    finally:
        host.asked = None
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(lambda c: host_harness.build_kernel_library(host.launcher.lib_dir, c.path, c.defines,
                                                                  host.launcher.kernel_dir), asked))
    return len(asked)


@pytest.mark.parametrize("kernel", HOST_KERNELS)
def test_the_quick_sweep_passes_on_the_host(host, kernel):
    quick_sweep_on_the_host(host, kernel)


def quick_sweep_on_the_host(host, kernel):
    """Every host case of `kernel` (host_cases) through gemm() on the host, under the sweep's oracles."""
    cases = host_cases(kernel)
    assert prebuild(host, cases) >= 24
    kinds = {c.oracle for c in cases}
    assert kinds == {"bound", "exact", "cublas"} and len(cases) >= 100, (kinds, len(cases))
    configs = {c.config for c in sweep.config_cases(kernel, sweep.quick_configs(kernel)) if on_the_host(c.config)}
    assert {c.config for c in cases if c.config} == configs   # every config the quick tier runs (that a host can)
    assert {name for name, epi in sweep.EPILOGUE_CASES.items()
            if any(c.problem.epilogue == epi for c in cases)} == set(sweep.EPILOGUE_CASES)
    with np.errstate(over="ignore"):   # a 16-bit output past its range is inf, as the kernel's
        for i, case in enumerate(cases):
            sweep.run_case(case, np.random.default_rng(i), xp=np, gemm_fn=host, tight_end=True)
    assert host.launcher.launches == sum(1 for c in cases if c.problem.m * c.problem.n)


@pytest.mark.parametrize("kernel", ["v4"])
def test_the_grouped_build_passes_the_grouped_sweep_on_the_host(host, monkeypatch, kernel):
    grouped_sweep_on_the_host(host, monkeypatch, kernel)


def grouped_sweep_on_the_host(host, monkeypatch, kernel, config=None):
    """V4's and V5's batched and grouped builds (DG_GROUPED = 1: the group walk, V4's early exits of
    tiles past a group's rows, V5's 3-D tensor maps and its TMA stores only where a group's rows end
    inside the map, each group's view of A, B, C, D and the bias) on the host: the quick tier's
    grouped cases (deepgemm.testing.grouped: every mode over every group-size pattern, sizes on the
    host and on the device), each group bit for bit against its FP64 product, guard bands and a
    masked group's rows past its count checked; the group sizes, like the operands, end against an
    inaccessible page. With `config`, every case runs that config, its patterns at its row tile."""
    from deepgemm import api
    from deepgemm.testing import grouped

    def upload(sizes, fw, dev):   # host group sizes "copied to the device": read, like the operands, from a guarded copy
        host.uploaded.append(np.ascontiguousarray(sizes, dtype=np.int32))
        return types.SimpleNamespace(data=types.SimpleNamespace(ptr=host.uploaded[-1].ctypes.data))
    monkeypatch.setattr(api, "_upload_rows", upload)
    real_gemm, real_grouped = deepgemm.gemm, deepgemm.grouped_gemm   # a batch of equal groups goes through gemm()
    monkeypatch.setattr(deepgemm, "gemm", lambda a, b, **kw: host.run(real_gemm, a, b, **kw))
    monkeypatch.setattr(deepgemm, "grouped_gemm", lambda a, b, **kw: host.run(real_grouped, a, b, **kw))
    cases = grouped.grouped_cases(kernel, config=config)
    assert {c.mode for c in cases} == set(grouped.MODES) and len(cases) >= 20
    for i, case in enumerate(cases):
        grouped.run_grouped_case(case, np.random.default_rng(i), xp=np)
    assert host.launcher.launches >= sum(1 for c in cases if any(c.sizes) and c.n)


# Planted bugs: (kernel, file, the text, the bug, which of the kernel's host cases to run: the
# main test runs them all on the real sources, these only the ones the bug's kind needs, to keep
# the CPU tier short). Each must fail.
ALL = None
PLANTED = {
    "v0_row_guard_dropped": ("v0", "v0_naive.cu", "if (row >= p.m || col >= p.n) return;", "if (col >= p.n) return;", ALL),
    "v1_missing_barrier": ("v1", "v1_smem.cu", "__syncthreads();   // tiles complete before anyone reads them", "", ALL),
    # each row's last thread also stores its value into the first column of the next block's tile:
    # wrong only where the neighbour ran first, which the host's alternating block order makes happen
    "v1_store_into_the_next_tile": ("v1", "v1_smem.cu", "    dg::store_d(p, m0 + ty, n0 + tx, acc);\n",
                                    "    dg::store_d(p, m0 + ty, n0 + tx, acc);\n"
                                    "    if (tx == BN - 1) dg::store_d(p, m0 + ty, n0 + tx + 1, acc);\n", ALL),
    "v2_k_remainder_skipped": ("v2", "v2_regtile.cu", "const int ktiles = p.k / BK + (p.k % BK != 0);",
                               "const int ktiles = p.k / BK;", ALL),
    "v3_a_vector_by_bs_pitch": ("v3", "v3_padded_vec.cu", "const bool a_vec = dg::aligned16(p.a) && (p.lda % 8 == 0);",
                                "const bool a_vec = dg::aligned16(p.a) && (p.ldb % 8 == 0);",
                                lambda c: c in sweep.one_operand_aligned_cases(c.kernel)),
    "residual_scaled_by_alpha": ("v1", "include/deepgemm/common.cuh", "v += p.beta * c;", "v += p.alpha * c;",
                                 lambda c: c.problem.epilogue["residual"] is not None),
    "bias_after_activation": ("v2", "include/deepgemm/common.cuh", "    v = activate(v);\n#if DG_SCALE_MODE == 1",
                              "    v = activate(v - cv.bias) + cv.bias;\n#if DG_SCALE_MODE == 1",
                              lambda c: c.problem.epilogue["bias"] is not None),
    # V4: its pipeline (the copies of tile kt+1 not yet waited for when they are read), a barrier,
    # the ldmatrix form, the accumulator fragments, and the store guard of its edge tiles
    "v4_cp_async_wait_one_too_deep": ("v4", "v4_mma.cu", "dg::cp_async_wait<STAGES - 2>();   // tile kt+1",
                                      "dg::cp_async_wait<STAGES - 1>();   // tile kt+1",
                                      lambda c: c in sweep.aligned_cases(c.kernel)),
    "v4_missing_barrier": ("v4", "v4_mma.cu", "__syncthreads();                   // ... everyone's", "//", ALL),
    "v4_b_ldmatrix_trans_flipped": ("v4", "v4_mma.cu", "dg::ldsm_x4_t<!B_KMAJ>(r,", "dg::ldsm_x4_t<B_KMAJ>(r,", ALL),
    "v4_accumulator_fragments_swapped": ("v4", "v4_mma.cu", "dg::mma_16816<dg::in_t>(acc[mt][nt],",
                                         "dg::mma_16816<dg::in_t>(acc[mt][nt ^ 1],", ALL),
    "v4_store_guard_past_m": ("v4", "include/deepgemm/common.cuh", "if (row < p.m && col < p.n)",
                              "if (row <= p.m && col < p.n)", ALL),
    # small_m: the barrier between the warps' partial sums and their reduction, the reduction one
    # warp short, and a K-contiguous B's fragment registers swapped
    "small_m_reduction_barrier_removed": ("small_m", "small_m.cu", "    __syncthreads();\n    for (int idx = threadIdx.x;",
                                          "    for (int idx = threadIdx.x;", ALL),
    "small_m_reduction_one_warp_short": ("small_m", "small_m.cu", "for (int w = 0; w < WARPS; ++w) v +=",
                                         "for (int w = 0; w < WARPS - 1; ++w) v +=", ALL),
    "small_m_b_fragment_swapped": ("small_m", "small_m.cu", "bf[0][j][0] = rb[u][j].x; bf[0][j][1] = rb[u][j].y;",
                                   "bf[0][j][0] = rb[u][j].y; bf[0][j][1] = rb[u][j].x;", ALL),
    "small_m_staging_syncwarp_removed": ("small_m", "small_m.cu", "                __syncwarp();\n                // Matrices",
                                         "                // Matrices", ALL),
}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_a_planted_bug_fails_the_host_sweep(host, tmp_path, name):
    planted_bug_fails(host, tmp_path, *PLANTED[name])


def planted_bug_fails(host, tmp_path, kernel, rel, original, bug, which):
    """`bug` in place of `original` in kernels/rel fails the host sweep on the cases `which` selects."""
    host.launcher.kernel_dir = host_harness.planted(tmp_path, jit.KERNEL_DIR, rel, original, bug)
    cases = [c for c in host_cases(kernel) if which is None or which(c)]
    assert cases
    with np.errstate(over="ignore"), pytest.raises(AssertionError) as failure:
        for i, case in enumerate(cases):
            sweep.run_case(case, np.random.default_rng(i), xp=np, gemm_fn=host, tight_end=True)
    assert "did not build" not in str(failure.value), "the planted bug must compile, and fail when run"


# ---------------------------------------------------------------------------------------------
# The host forms of V4's instructions, against the layouts and semantics mma.cuh and cp_async.cuh
# state (tests/cpu/harness/warp_probe.cu: one probe per p.flags). The V4 sweep above checks that the
# kernel and these forms agree with each other; these check each form on its own, so that a form
# wrong in the same way as the kernel's use of it cannot pass.

PROBES = ("LDMATRIX", "MMA_F16", "MMA_BF16", "MMA_F16_ACC", "CP_ASYNC", "CP_ASYNC_NO_READ", "CP_ASYNC_PAST_END",
          "CP_ASYNC_PARTIAL_PAST_END", "CP_ASYNC_MISALIGNED", "CP_ASYNC_OUTSIDE", "PART_OF_A_WARP", "DIFFERENT_KINDS",
          "DIFFERENT_SITES")


def _probe(lib_dir, name, out, a=None, b=None, c=None, k=0, threads=32, smem=2048):
    """Runs warp_probe.cu's probe `name` as one block; its output in `out`."""
    from deepgemm.params import make_params
    launcher = HostLauncher(lib_dir)
    launcher.kernel_dir = jit.KERNEL_DIR   # its includes; the probe itself is in the harness
    compiled = types.SimpleNamespace(name=f"warp_probe {name}", path=host_harness.HARNESS_DIR / "warp_probe.cu",
                                     defines={})
    inputs = [x for x in (a, b, c) if x is not None]
    params = make_params(a=0 if a is None else a.ctypes.data, b=0 if b is None else b.ctypes.data,
                         c=0 if c is None else c.ctypes.data, d=out.ctypes.data, k=k, flags=PROBES.index(name))
    launcher.run(compiled, (1, 1, 1), (threads, 1, 1), smem, (params,), inputs, out)


def test_ldmatrix_delivers_the_documented_fragments(lib_dir):
    out = np.zeros((32, 8), np.uint32)
    _probe(lib_dir, "LDMATRIX", out)
    row = [(l * 7 + 3) % 32 for l in range(32)]                     # lane l's row address (ROW in the probe)
    m = 1 + 8 * np.arange(32)[:, None] + np.arange(8)[None, :]      # shared row r, element c

    def matrix(i):                                                   # matrix i: the rows lanes 8i..8i+7 point at
        return m[[row[8 * i + j] for j in range(8)]]
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for i in range(4):
            mi = matrix(i)
            assert out[lane, i] == mi[g, 2 * t] | mi[g, 2 * t + 1] << 16, (lane, i)
            assert out[lane, 4 + i] == mi[2 * t, g] | mi[2 * t + 1, g] << 16, (lane, i, "trans")


@pytest.mark.parametrize("name", ["MMA_F16", "MMA_BF16", "MMA_F16_ACC"])
def test_mma_computes_a_times_b_plus_c_from_the_documented_fragments(lib_dir, name):
    rng = np.random.default_rng(3)
    a = rng.integers(-8, 9, (16, 16)).astype(np.float32)             # small integers: every sum exact
    b = rng.integers(-8, 9, (16, 8)).astype(np.float32)
    c = rng.integers(-64, 65, (16, 8)).astype(np.float32)

    def bits(x):
        if name == "MMA_BF16":
            return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        return x.astype(np.float16).view(np.uint16)
    if name == "MMA_F16_ACC":
        out = np.zeros((16, 8), np.uint16)
        _probe(lib_dir, name, out, bits(a), bits(b), bits(c))
        np.testing.assert_array_equal(out.view(np.float16).astype(np.float32), a @ b + c)
    else:
        out = np.zeros((16, 8), np.float32)
        _probe(lib_dir, name, out, bits(a), bits(b), c)
        np.testing.assert_array_equal(out, a @ b + c)


def test_cp_async_lands_at_its_wait_with_the_zero_fill(lib_dir):
    """A copy lands when a wait_group of its thread leaves at most N newer groups, not at its issue
    nor at a barrier; the bytes past src_bytes are zeros; a copy never committed is not waited for."""
    a = (np.arange(32 * 8) + 1).astype(np.uint16)
    out = np.zeros((7, 32, 4), np.uint32)
    _probe(lib_dir, "CP_ASYNC", out, a)
    data = a.reshape(32, 8).view(np.uint32)                          # thread t's 16 bytes, as words
    poison = np.full((32, 4), 0xFFFFFFFF, np.uint32)
    filled = data.view(np.uint8).reshape(32, 16).copy()
    for t in range(16):
        filled[t, t:] = 0                                            # thread t copied min(t, 16) bytes
    np.testing.assert_array_equal(out[0], poison)                    # before its wait
    np.testing.assert_array_equal(out[1], filled.view(np.uint32))    # after wait_group 0
    np.testing.assert_array_equal(out[2], data)                      # the older group, after wait_group 1
    np.testing.assert_array_equal(out[3], poison)                    # the newer one, still in flight
    np.testing.assert_array_equal(out[4], poison)                    # never committed
    np.testing.assert_array_equal(out[5], np.roll(data, -1, 0))      # the next thread's older group
    np.testing.assert_array_equal(out[6], poison)                    # ... its newer one: a barrier lands nothing


@pytest.mark.parametrize("name, error", [
    ("CP_ASYNC_NO_READ", None),                      # src_bytes 0 reads nothing, even at the guard page
    ("CP_ASYNC_PAST_END", "SIGSEGV"),                # 2 bytes of it do not
    ("CP_ASYNC_PARTIAL_PAST_END", "SIGSEGV"),        # 8 bytes before the end, whose 16 pass it (memcheck's rule)
    ("CP_ASYNC_MISALIGNED", "SIGBUS"),
    ("CP_ASYNC_OUTSIDE", "SIGSEGV"),                 # past the block's shared memory
    ("PART_OF_A_WARP", "status 2"),
    ("DIFFERENT_KINDS", "status 2"),
    ("DIFFERENT_SITES", "status 2"),
])
def test_what_a_gpu_traps_on_or_leaves_undefined_is_an_error(lib_dir, name, error):
    a = np.arange(64, dtype=np.uint16)                               # 128 bytes: ends where its page does
    if name == "CP_ASYNC_PARTIAL_PAST_END":
        a = a[:60]                                                   # 120 bytes: 8 before its page
    out = np.zeros((32, 4), np.uint32)
    if error is None:
        _probe(lib_dir, name, out, a, k=a.size, smem=1024)
        return
    with pytest.raises(AssertionError, match=error):
        _probe(lib_dir, name, out, a, k=a.size, smem=1024)


@pytest.mark.parametrize("a_row, b_row, out_dtype", [(True, False, "float32"), (False, True, "float16")])
def test_the_f16_accumulator_build_matches_the_report_s_emulation_bit_for_bit(host, a_row, b_row, out_dtype):
    """V4's DG_ACC_F16 build (the accuracy report's fp16acc_mma) on the host: every output equals
    deepgemm.report.emulate's model of f16-accumulator mma.sync (each k16 block summed exactly, then
    added to the fp16 accumulator with one rounding), over several k-tiles and edge tiles, both
    ldmatrix forms. Values in [0, 1) make the accumulator's roundings show from the first tiles."""
    from deepgemm.report.emulate import emulate_gemm
    rng = np.random.default_rng(11)
    m, n, k = 131, 70, 300
    a = rng.random((m, k)).astype(np.float16)
    b = rng.random((k, n)).astype(np.float16)
    a = a if a_row else np.asfortranarray(a)
    b = b if b_row else np.asfortranarray(b)
    out = np.zeros((m, n), out_dtype)
    host(a, b, kernel="fp16acc_mma", out=out, accumulate="fp16")
    expected = emulate_gemm(a, b, "fp16", block_k=16)
    assert not np.array_equal(expected, emulate_gemm(a, b, "fp32", block_k=16))   # the roundings matter here
    np.testing.assert_array_equal(out, expected.astype(out_dtype))
