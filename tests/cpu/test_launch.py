"""Replayed launches through cuLaunchKernel (deepgemm.launch), on a CPU: CuPy's binding of the
driver function is stood in for by a function that takes what the binding's typed arguments take
(ints that fit: 32 bits for the dimensions, 64 for the handles and the address of the void*[]),
refuses anything else as the binding would, and reads what each kernel-parameter pointer points at."""
import ctypes
import subprocess
import sys
import threading
import types

import numpy as np
import pytest

from deepgemm import api, arrays, jit, launch
from deepgemm.params import PARAMS_DTYPE, POINTER_FIELDS, make_params
from deepgemm.tma import TENSOR_MAP_DTYPE

N_MAPS = 3


class DriverError(Exception):
    """As CuPy's CUDADriverError: the CUresult as .status, its name in the message."""

    def __init__(self, status):
        super().__init__(f"CUDA_ERROR_{status}: a driver error")
        self.status = status


def fake_driver(status=0, on_launch=None):
    """A stand-in for CuPy's launchKernel that records each launch with the bytes behind each
    kernel-parameter pointer, and the list of launches; raises DriverError(status) when status."""
    calls = []

    def cu_launch(func, gx, gy, gz, bx, by, bz, smem, stream, argv, extra):
        for value, bits in [(func, 64), *((d, 32) for d in (gx, gy, gz, bx, by, bz, smem)),
                            (stream, 64), (argv, 64), (extra, 64)]:
            if type(value) is not int or not 0 <= value < 1 << bits:   # what size_t / unsigned int accept
                raise TypeError(f"{value!r} is not a {bits}-bit unsigned int")
        if on_launch is not None:
            on_launch()
        sizes = [PARAMS_DTYPE.itemsize] + [TENSOR_MAP_DTYPE.itemsize] * N_MAPS
        pointers = ctypes.cast(argv, ctypes.POINTER(ctypes.c_void_p))
        calls.append(dict(func=func, dims=(gx, gy, gz, bx, by, bz, smem), stream=stream, extra=extra,
                          argv=argv, thread=threading.get_ident(),
                          args=[ctypes.string_at(pointers[i], size) for i, size in enumerate(sizes)]))
        if status:
            raise DriverError(status)
    return cu_launch, calls


def tensor_map(fill: int):
    m = np.zeros((), TENSOR_MAP_DTYPE)
    m["opaque"] = np.arange(16, dtype=np.uint64) + fill
    return m


FUNC, STREAM = 0x7F12_3456_7000, 0x7F00_0000_1230   # 64-bit handles: must not arrive truncated
FIXED = dict(lda=64, ldb=32, ldd=16, m=64, n=16, k=32, alpha=0.5)   # what a replay keeps
PARAMS = make_params(a=1, b=2, d=3, bias=7, **FIXED)


def tail(maps) -> bytes:
    return b"".join(m.tobytes() for m in maps)


def launcher(cu, **kw):
    initial = [PARAMS.tobytes()] + [tensor_map(100 * i).tobytes() for i in range(N_MAPS)]
    return launch.Launcher("v5[test]", types.SimpleNamespace(ptr=FUNC), (3, 2), (384, 1, 1), 200_000, initial,
                           cu_launch=cu, **kw)


def test_parameter_pointers_point_at_the_packed_params_and_the_maps():
    cu, calls = fake_driver()
    run = launcher(cu)
    for i, pointers in enumerate([(1 << 20, 1 << 21, 1 << 22, 1 << 23, 0, 1 << 24), (16, 32, 48, 0, 64, 0)]):
        maps = [tensor_map(1000 * i + j) for j in range(N_MAPS)]
        run(STREAM, pointers, tail(maps))
        call = calls[-1]
        assert call["args"][0] == make_params(**dict(zip(POINTER_FIELDS, pointers)), **FIXED).tobytes()
        got = np.frombuffer(call["args"][0], PARAMS_DTYPE)[0]
        assert (int(got["a"]), int(got["scale"]), int(got["m"]), float(got["alpha"])) == (pointers[0], pointers[4], 64, 0.5)
        assert call["args"][1:] == [m.tobytes() for m in maps]
        assert (call["func"], call["stream"], call["extra"]) == (FUNC, STREAM, 0)
        assert call["dims"] == (3, 2, 1, 384, 1, 1, 200_000)                # padded to 3-D as CuPy does
    assert calls[0]["argv"] == calls[1]["argv"]                             # the same buffers, updated in place


def test_null_stream_and_wrong_arguments():
    cu, calls = fake_driver()
    run = launcher(cu)
    run(0, (1, 2, 3, 0, 0, 0), tail([tensor_map(0)] * N_MAPS))
    assert calls[-1]["stream"] == 0                                       # handle 0: the legacy default stream
    with pytest.raises(ValueError, match=r"v5\[test\]: 256 bytes of arguments after GemmParams, expected 384"):
        run(0, (1, 2, 3, 0, 0, 0), tail([tensor_map(0)] * (N_MAPS - 1)))   # a map missing: never stale bytes
    with pytest.raises(ValueError):
        run(0, (1, 2, 3, 0, 0, 0), tail([tensor_map(0)] * N_MAPS) + b"\0")   # one byte too many
    assert len(calls) == 1


def test_a_failed_launch_raises_with_the_kernel_and_the_cuda_result():
    cu, calls = fake_driver(status=700)
    with pytest.raises(RuntimeError, match=r"kernel v5\[test\]: cuLaunchKernel failed with CUresult 700: "
                                           r"CUDA_ERROR_700") as info:
        launcher(cu)(0, (1, 2, 3, 0, 0, 0), tail([tensor_map(0)] * N_MAPS))
    assert isinstance(info.value.__cause__, DriverError) and len(calls) == 1


def test_each_thread_binds_its_context_once_and_packs_its_own_buffers():
    """Two threads replaying one plan at once (both inside the launch after both have packed, as
    when the driver call of one overlaps the packing of the other) each launch their own pointers."""
    barrier = threading.Barrier(2, timeout=20)
    cu, calls = fake_driver(on_launch=lambda: threading.current_thread() is threading.main_thread() or barrier.wait())
    binds = []
    run = launcher(cu, bind_context=lambda: binds.append(threading.get_ident()))
    errors = []

    def replay(base):
        try:
            run(0, (base, base + 16, base + 32, 0, 0, 0), tail([tensor_map(base)] * N_MAPS))
        except Exception as exc:   # noqa: BLE001 (reported below)
            errors.append(exc)
    threads = [threading.Thread(target=replay, args=(base,)) for base in (1 << 30, 1 << 31)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(calls) == 2
    for call in calls:
        a = int(np.frombuffer(call["args"][0], PARAMS_DTYPE)[0]["a"])
        assert call["args"][1] == tensor_map(a).tobytes()                 # its own map with its own pointers
    assert {int(np.frombuffer(c["args"][0], PARAMS_DTYPE)[0]["a"]) for c in calls} == {1 << 30, 1 << 31}
    assert sorted(binds) == sorted(c["thread"] for c in calls)            # once per thread
    run(0, (1, 2, 3, 0, 0, 0), tail([tensor_map(0)] * N_MAPS))
    run(0, (1, 2, 3, 0, 0, 0), tail([tensor_map(0)] * N_MAPS))
    assert len(binds) == 3                                                # this thread: once, not per call


def test_torch_stream_handle_skips_the_stream_object(monkeypatch):
    arrays._torch_raw_stream.cache_clear()
    fake = types.SimpleNamespace(_C=types.SimpleNamespace(_cuda_getCurrentRawStream=lambda d: 0x1000 + d))
    monkeypatch.setitem(sys.modules, "torch", fake)
    try:
        assert arrays.stream_handle("torch", 1) == 0x1001
        arrays._torch_raw_stream.cache_clear()
        fake._C = types.SimpleNamespace()   # a torch without the binding: the public API
        fake.cuda = types.SimpleNamespace(current_stream=lambda d: types.SimpleNamespace(cuda_stream=0x2000 + d))
        assert arrays.stream_handle("torch", 1) == 0x2001
    finally:
        arrays._torch_raw_stream.cache_clear()


def test_importing_deepgemm_does_not_load_libcuda():
    code = ("import ctypes\nopened = []\nreal = ctypes.CDLL\n"
            "ctypes.CDLL = lambda name, *a, **k: opened.append(name) or real(name, *a, **k)\n"
            "import deepgemm, deepgemm.launch, deepgemm.api\n"
            "assert not [n for n in opened if 'libcuda' in str(n)], opened\nprint('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_the_argument_count_is_checked_even_when_none_are_passed():
    """A launcher built with the maps after GemmParams must be given them on every call (else the
    previous call's maps would go out with new pointers); one built without must be given none."""
    cu, calls = fake_driver()
    with pytest.raises(ValueError):
        launcher(cu)(0, (1, 2, 3, 0, 0, 0))
    plain = launch.Launcher("v0[test]", types.SimpleNamespace(ptr=FUNC), (1,), (128,), 0, [PARAMS.tobytes()],
                            cu_launch=cu)
    with pytest.raises(ValueError):
        plain(0, (1, 2, 3, 0, 0, 0), tensor_map(0).tobytes())
    assert calls == []


def test_grid_and_block_are_padded_to_three_dimensions_of_at_least_one():
    dims_seen = []

    def cu(func, gx, gy, gz, bx, by, bz, smem, stream, argv, extra):
        dims_seen.append((gx, gy, gz, bx, by, bz, smem))
    initial = [PARAMS.tobytes()]
    for grid, block, dims in [((5,), (128,), (5, 1, 1, 128, 1, 1, 0)),
                              ((7, 0), (32, 4), (7, 1, 1, 32, 4, 1, 0)),
                              ([2, 3, 4], [64, 2, 1], (2, 3, 4, 64, 2, 1, 0))]:
        launch.Launcher("v4[test]", types.SimpleNamespace(ptr=FUNC), grid, block, 0, initial, cu_launch=cu)(
            STREAM, (1, 2, 3, 0, 0, 0))
        assert dims_seen[-1] == dims


# ---- programmatic dependent launch: cuLaunchKernelEx with a CUlaunchConfig ------------------

class LaunchAttribute(ctypes.Structure):   # CUlaunchAttribute, as cuda.h lays it out
    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_char * 4), ("value", ctypes.c_char * 64)]


class LaunchConfig(ctypes.Structure):      # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("smem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(LaunchAttribute)), ("n_attrs", ctypes.c_uint)]


def fake_driver_ex(status=0):
    """A stand-in for cuLaunchKernelEx (through ctypes: the config's address, the function, the
    void*[]'s address, extra) that reads the config as the driver would; returns `status`."""
    calls = []

    def cu_launch_ex(config, func, argv, extra):
        cfg = LaunchConfig.from_address(config)
        attrs = [(cfg.attrs[i].id, int.from_bytes(cfg.attrs[i].value[:4], "little", signed=True))
                 for i in range(cfg.n_attrs)]
        sizes = [PARAMS_DTYPE.itemsize] + [TENSOR_MAP_DTYPE.itemsize] * N_MAPS
        pointers = ctypes.cast(argv, ctypes.POINTER(ctypes.c_void_p))
        calls.append(dict(func=func, dims=(*cfg.grid, *cfg.block, cfg.smem), stream=cfg.stream or 0, attrs=attrs,
                          extra=extra, args=[ctypes.string_at(pointers[i], size) for i, size in enumerate(sizes)]))
        return status
    return cu_launch_ex, calls


def test_a_programmatic_dependent_goes_out_through_launch_kernel_ex_with_its_attribute():
    cu, calls = fake_driver_ex()
    run = launcher(cu, pdl=True)
    assert run.pdl
    run.launch_as_built(STREAM)                                         # the full path's launch
    maps = [tensor_map(7 + j) for j in range(N_MAPS)]
    run(STREAM + 16, (16, 32, 48, 0, 64, 0), tail(maps))                # a replay on another stream
    first, replay = calls
    assert first["args"] == [PARAMS.tobytes()] + [tensor_map(100 * i).tobytes() for i in range(N_MAPS)]
    assert replay["args"][1:] == [m.tobytes() for m in maps]
    assert int(np.frombuffer(replay["args"][0], PARAMS_DTYPE)[0]["d"]) == 48
    for call, stream in ((first, STREAM), (replay, STREAM + 16)):
        assert (call["func"], call["stream"], call["extra"]) == (FUNC, stream, None)
        assert call["dims"] == (3, 2, 1, 384, 1, 1, 200_000)
        assert call["attrs"] == [(6, 1)]   # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, allowed


def test_a_failed_launch_kernel_ex_raises_with_the_kernel_and_the_cuda_result(monkeypatch):
    monkeypatch.setattr(launch, "driver_error_name", lambda status: f"CUDA_ERROR_{status}")
    cu, calls = fake_driver_ex(status=1)
    with pytest.raises(RuntimeError, match=r"kernel v5\[test\]: cuLaunchKernelEx failed with CUresult 1: "
                                           r"CUDA_ERROR_1"):
        launcher(cu, pdl=True)(0, (1, 2, 3, 0, 0, 0), tail([tensor_map(0)] * N_MAPS))
    assert len(calls) == 1


class FakeLibcuda:
    """libcuda.so.1's cuGetErrorName: for a status it knows, CUDA_SUCCESS (0) and its name (999: an
    empty one); for any other, CUDA_ERROR_INVALID_VALUE (1) and no name."""
    NAMES = {700: b"CUDA_ERROR_ILLEGAL_ADDRESS", 999: b""}

    def cuGetErrorName(self, status, name_ref):
        if status not in self.NAMES:
            return 1
        ctypes.cast(name_ref, ctypes.POINTER(ctypes.c_char_p))[0] = self.NAMES[status] or None
        return 0


@pytest.mark.parametrize("status,name", [(700, "CUDA_ERROR_ILLEGAL_ADDRESS"),
                                         (12345, "CUresult 12345"),    # the driver knows no such status
                                         (999, "CUresult 999")])       # success, but no name
def test_a_driver_error_is_named_by_the_driver_or_by_its_number(monkeypatch, status, name):
    monkeypatch.setattr(ctypes, "CDLL", lambda path: FakeLibcuda() if path == "libcuda.so.1" else None)
    assert launch.driver_error_name(status) == name


def test_a_driver_error_without_a_driver_library_is_named_by_its_number(monkeypatch):
    def missing(path):
        raise OSError(f"{path}: cannot open shared object file")
    monkeypatch.setattr(ctypes, "CDLL", missing)
    assert launch.driver_error_name(700) == "CUresult 700"


def test_pdl_is_on_unless_the_environment_turns_it_off(monkeypatch):
    monkeypatch.delenv(launch.PDL_ENV, raising=False)
    assert launch.pdl_enabled()
    for value, on in (("0", False), ("1", True)):
        monkeypatch.setenv(launch.PDL_ENV, value)
        assert launch.pdl_enabled() is on


@pytest.mark.parametrize("pdl", [False, True])
def test_the_full_path_launches_a_programmatic_dependent_only_where_asked(monkeypatch, pdl):
    """api.launch: with pdl, one launch through a Launcher built for it (cuLaunchKernelEx with the
    attribute), returned for the plan's replays; without, one launch through CuPy's kernel call on
    the caller's stream, and nothing returned (the plan builds its own Launcher)."""
    launches = []

    class FakeLauncher:
        def __init__(self, *args, pdl=False):
            self.args, self.pdl = args, pdl

        def launch_as_built(self, stream):
            launches.append(("launcher", self.pdl, stream))

    def cupy_call(grid, block, args, shared_mem, stream):
        launches.append(("cupy", grid, block, shared_mem, stream))

    monkeypatch.setattr(api, "_launcher", lambda compiled, dev, grid, block, smem, args, pdl=False:
                        FakeLauncher(compiled, dev, grid, block, smem, args, pdl=pdl))
    monkeypatch.setattr(jit, "load_function", lambda compiled, dev, smem: cupy_call)
    monkeypatch.setattr(api, "_on_device", lambda dev, call, *args: call(*args))
    stream = types.SimpleNamespace(ptr=0x5000)
    got = api.launch("compiled", 0, (3, 2, 1), (384, 1, 1), 200_000, ("params",), stream, pdl)
    if pdl:
        assert isinstance(got, FakeLauncher) and got.pdl is True
        assert launches == [("launcher", True, 0x5000)]
    else:
        assert got is None
        assert launches == [("cupy", (3, 2, 1), (384, 1, 1), 200_000, stream)]
