"""The CUDA-core ladder (V0-V3) run on the CPU from its own source, through the real gemm() path.

Each call goes through deepgemm.gemm() on fake device arrays over NumPy memory (argument checks,
dispatch, the variant's defines, GemmParams and the grid, all as on a GPU); the launch is then
run by the kernel's source compiled as host C++ (tests/cpu/harness/grid_host.h: each CUDA thread
a coroutine, __syncthreads() where the next one runs), in a forked child, and the quick sweep's oracles judge
the output (integer-exact, error bounds, poisoned guard bands). The child reads copies of the
operands placed against an inaccessible page (alignment to 16 bytes kept, so at most 14 bytes
lie between an operand's end and that page): a read past an operand kills it with SIGSEGV, and the
test names the case. So a wrong index, guard, tile loop, epilogue step or store in these kernels,
or in the epilogue chain they share with V4 and V5 (kernels/include/deepgemm/common.cuh), fails the
CPU tier, and so does a missing barrier (the threads between two barriers run one after another,
in order and then in reverse). What this cannot see: a race that no such order of whole threads
shows, and anything of V4, V5 and small_m beyond the shared chain (tensor-core and async-copy PTX).
"""
import ctypes
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

HOST_KERNELS = ("v0", "v1", "v2", "v3")   # no PTX: their whole source compiles for the host
PAGE = mmap.PAGESIZE
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
# Work per case: the host runs one CUDA thread after another on one core, so the large cases stay on the GPU.
MAX_MACS = 1 << 23
try:
    from numpy.lib.array_utils import byte_bounds   # NumPy 2
except ImportError:
    byte_bounds = np.byte_bounds


def _macs(case) -> int:
    return case.problem.m * case.problem.n * max(case.problem.k, 1)


def host_cases(kernel: str) -> list:
    """The GPU tier's sweep cases of `kernel` small enough for the host: the quick cases (every
    dtype, layout, epilogue and oracle kind, at the default config's tile edges) and the other
    configs the quick tier runs, at their own tile edges (up to twice the work: one tile row
    more than two, 323 k values)."""
    quick = [c for c in sweep.quick_cases(kernel) if _macs(c) <= MAX_MACS]
    configs = sweep.config_cases(kernel, sweep.quick_configs(kernel))
    return quick + [c for c in configs if _macs(c) <= 2 * MAX_MACS]


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

    def run(self, compiled, grid, block, params, inputs, out):
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
                for field in POINTER_FIELDS:
                    if int(p[field]):
                        p[field] = guarded.translate(int(p[field]))
                raw = ctypes.create_string_buffer(p.tobytes())
                status = lib.dg_host_launch(raw, *[ctypes.c_uint(v) for v in (*grid, *block)])
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(status)
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            why = {signal.SIGSEGV: ": a read or write outside an operand",
                   signal.SIGBUS: ": a misaligned 16-byte load (a GPU traps on it too)"}.get(sig, "")
            raise AssertionError(f"the host build of {compiled.name} died with {signal.Signals(sig).name}{why}")
        assert os.WEXITSTATUS(status) == 0, (f"the host launch of {compiled.name} failed (status {os.WEXITSTATUS(status)}: "
                                             f"1 = its threads met different barriers, 3 = the launch did not start)")
        ctypes.memmove(lo, shared_base, hi - lo)
        self.launches += 1


@pytest.fixture(scope="session")
def lib_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("host-kernels")


@pytest.fixture
def host(monkeypatch, captured, lib_dir):
    """gemm() on NumPy arrays through the fakes, each launch run by the host build of its variant."""
    from deepgemm import api
    launcher = HostLauncher(lib_dir)
    monkeypatch.setattr(jit, "compile_kernel", launcher.compile_kernel)
    pending = []
    monkeypatch.setattr(api, "launch", lambda compiled, dev, grid, block, smem, args, stream:
                        pending.append((compiled, grid, block, args[0])))

    def gemm(a, b, *, kernel, out, **kw):
        arrays = [x for x in (a, b, *kw.values()) if isinstance(x, np.ndarray)]
        deepgemm.gemm(as_fake(a), as_fake(b), kernel=kernel, out=as_fake(out), **{k: as_fake(v) for k, v in kw.items()})
        assert len(pending) == 1, f"{len(pending)} launches for one call"
        compiled, grid, block, params = pending.pop()
        if gemm.asked is not None:   # prebuild's pass: note the variant; the reference stands in for its output
            gemm.asked[(str(compiled.path), tuple(sorted(compiled.defines.items())))] = compiled
            epilogue = {k: v for k, v in kw.items() if k != "config"}
            out[...] = round_to(reference_gemm(a, b, **epilogue), str(out.dtype))
            return
        launcher.run(compiled, tuple(grid), tuple(block), params, arrays, out)
    gemm.launcher, gemm.asked = launcher, None
    return gemm


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
    cases = host_cases(kernel)
    assert prebuild(host, cases) >= 24
    kinds = {c.oracle for c in cases}
    assert kinds == {"bound", "exact", "cublas"} and len(cases) >= 100, (kinds, len(cases))
    configs = {c.config for c in sweep.config_cases(kernel, sweep.quick_configs(kernel))}
    assert {c.config for c in cases if c.config} == configs   # every config the quick tier runs
    assert {name for name, epi in sweep.EPILOGUE_CASES.items()
            if any(c.problem.epilogue == epi for c in cases)} == set(sweep.EPILOGUE_CASES)
    with np.errstate(over="ignore"):   # a 16-bit output past its range is inf, as the kernel's
        for i, case in enumerate(cases):
            sweep.run_case(case, np.random.default_rng(i), xp=np, gemm_fn=host, tight_end=True)
    assert host.launcher.launches == sum(1 for c in cases if c.problem.m * c.problem.n)


# Planted bugs: (kernel, file, the text, the bug, which of the kernel's host cases to run: the
# main test runs them all on the real sources, these only the ones the bug's kind needs, to keep
# the CPU tier short). Each must fail.
ALL = None
PLANTED = {
    "v0_row_guard_dropped": ("v0", "v0_naive.cu", "if (row >= p.m || col >= p.n) return;", "if (col >= p.n) return;", ALL),
    "v1_missing_barrier": ("v1", "v1_smem.cu", "__syncthreads();   // tiles complete before anyone reads them", "", ALL),
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
}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_a_planted_bug_fails_the_host_sweep(host, tmp_path, name):
    kernel, rel, original, bug, which = PLANTED[name]
    host.launcher.kernel_dir = host_harness.planted(tmp_path, jit.KERNEL_DIR, rel, original, bug)
    cases = [c for c in host_cases(kernel) if which is None or which(c)]
    assert cases
    with np.errstate(over="ignore"), pytest.raises(AssertionError):
        for i, case in enumerate(cases):
            sweep.run_case(case, np.random.default_rng(i), xp=np, gemm_fn=host, tight_end=True)
