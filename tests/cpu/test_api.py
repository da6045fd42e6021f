"""gemm()'s argument checks and layout normalisation, on a CPU: device arrays are stood in for by
fakes with CuPy's attributes, the compile is real, and the launch is captured instead of run."""
import dataclasses
import importlib.util
import re
import types

import numpy as np
import pytest

import deepgemm
from deepgemm import api, arrays, caches, device, registry, tma
from deepgemm.params import PARAMS_DTYPE

from fake_gpu import FAKE_GPU, F, FakeDeviceArray, captured, fake_encode, gpus  # noqa: F401 (fixtures)


def P(*shape, **kw):
    """A fake array the plan cache can key (CuPy's .data.device_id): repeat calls replay."""
    x = FakeDeviceArray(shape, **kw)
    x.data.device_id = x.device.id
    return x


@pytest.fixture
def replayable(monkeypatch, captured):
    """gemm() with its repeat-call plans: a first call is captured as with `captured`, a replay
    goes to a stand-in for cuLaunchKernel (cuLaunchKernelEx's for a programmatic dependent). Returns (captured launches, replays, context binds)."""
    import ctypes
    import struct
    import sys
    from deepgemm import launch
    replays, binds = [], []

    def cu_launch(func, gx, gy, gz, bx, by, bz, smem, stream, argv, extra, pdl=False):
        first = ctypes.cast(argv, ctypes.POINTER(ctypes.c_void_p))[0]   # argv: the void*[]'s address
        replays.append(dict(func=func, grid=(gx, gy, gz), stream=stream,
                            params=ctypes.string_at(first, PARAMS_DTYPE.itemsize), argv=argv, pdl=pdl))

    def cu_launch_ex(config, func, argv, extra):   # CUlaunchConfig: 7 unsigned ints, then hStream
        dims = struct.unpack_from("<7I", ctypes.string_at(config, 28))
        stream = struct.unpack_from("<Q", ctypes.string_at(config + 32, 8))[0]
        cu_launch(func, *dims, stream, argv, extra, pdl=True)
        return 0
    monkeypatch.setattr(launch, "driver_launch", lambda: cu_launch)
    monkeypatch.setattr(launch, "driver_launch_ex", lambda: cu_launch_ex)
    monkeypatch.setattr(api.jit, "load_function", lambda compiled, dev, smem=0: types.SimpleNamespace(
        kernel=types.SimpleNamespace(ptr=0xF00)))
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDevice=lambda: 0, setDevice=binds.append),
        get_current_stream=lambda: types.SimpleNamespace(ptr=0x5))))
    monkeypatch.setattr(api, "_plans", {})
    return captured, replays, binds


def test_host_arrays_are_refused_with_the_argument_named():
    with pytest.raises(TypeError, match=r"^a: expected a GPU array .*host array"):
        deepgemm.gemm(np.zeros((4, 4), np.float16), np.zeros((4, 4), np.float16))
    torch = pytest.importorskip("torch")
    cpu = torch.zeros(4, 4, dtype=torch.float16)
    for _ in range(2):   # the second call tries the repeat-call plan first: it too names the argument
        with pytest.raises(TypeError, match=r"^a: expected a GPU array .*host array \(torch.Tensor\)"):
            deepgemm.gemm(cpu, cpu)


def test_layouts_and_leading_dimensions_reach_the_kernel(captured):
    a = F(64, 48)                               # row-major, lda 48
    b = F(80, 48).T                             # column-major view of a K x N operand, ldb 48
    deepgemm.gemm(a, b, kernel="v0", out_dtype="float32")
    (launch,) = captured
    p = launch["params"]
    assert (int(p["m"]), int(p["n"]), int(p["k"])) == (64, 80, 48)
    assert (int(p["lda"]), int(p["ldb"]), int(p["ldd"])) == (48, 48, 80)
    assert "[float16->float32,rc," in launch["compiled"].name      # A row-major, B column-major
    assert launch["grid"] == (-(-80 // 32), -(-64 // 8), 1)


def test_sliced_view_keeps_its_leading_dimension_and_offset(captured):
    big = F(33, 40, dtype="bfloat16")
    view = FakeDeviceArray((33, 39), "bfloat16", big.strides, offset=1, base_ptr=big.data.ptr)   # x[:, 1:]
    deepgemm.gemm(view, F(39, 7, dtype="bfloat16"), kernel="v0")
    p = captured[0]["params"]
    assert int(p["lda"]) == 40 and int(p["a"]) == big.data.ptr + 2  # misaligned by one element


def test_a_one_column_b_sliced_from_a_wider_matrix_keeps_its_row_stride(captured):
    """b = w[:, 2:3] of a row-major 7 x 40 w: one column, 40 elements between its rows. Only an
    empty b may be described afresh (nothing of it is read); this one is read in place, row-major
    with ldb 40, never as a column-major K x 1 matrix with ldb 7 (which would read w's first row)."""
    w = F(7, 40)
    col = FakeDeviceArray((7, 1), "float16", w.strides, offset=2, base_ptr=w.data.ptr)
    deepgemm.gemm(F(4, 7), col, kernel="v0")
    p = captured[0]["params"]
    assert (int(p["ldb"]), int(p["b"])) == (40, w.data.ptr + 4)
    assert ",rr," in captured[0]["compiled"].name


@pytest.mark.parametrize("a,b,exc,pattern", [
    (F(5), F(5, 4), ValueError, r"^a: expected a 2-D matrix, got 1-D"),
    (F(4, 5), F(6, 4), ValueError, r"^b: inner dimensions differ: a is 4x5, b is 6x4"),
    (F(4, 5, dtype="float32"), F(5, 4, dtype="float32"), TypeError, r"^a: dtype must be one of"),
    (F(4, 5), F(5, 4, dtype="bfloat16"), TypeError, r"^b: dtype must match a \(float16\)"),
    (F(4, 5), F(5, 4, device=1), ValueError, r"^b: is on device 1"),
    (FakeDeviceArray((4, 5), strides=(20, 4)), F(5, 4), ValueError, r"^a: needs one unit-stride dimension"),
    (FakeDeviceArray((4, 5), base_ptr=(1 << 33) + 1), F(5, 4), ValueError,
     r"^a: its address 0x200000001 is not a multiple of its element size \(2 bytes\)"),
])
def test_operand_errors(captured, a, b, exc, pattern):
    with pytest.raises(exc, match=pattern):
        deepgemm.gemm(a, b)
    assert not captured


@pytest.mark.parametrize("kwargs,exc,pattern", [
    (dict(out=F(4, 5)), ValueError, r"^out: expected shape \(M, N\)=\(4, 3\)"),
    (dict(out=F(4, 3, dtype="float32"), out_dtype="float16"), TypeError, r"^out: dtype float32 differs"),
    (dict(out=F(3, 4).T), ValueError, r"^out: must be row-major"),
    (dict(out=F(4, 3, device=1)), ValueError, r"^out: is on device 1"),
    (dict(out_dtype="int8"), TypeError, r"^out_dtype: must be one of"),
    (dict(kernel="v9"), ValueError, r"^kernel: unknown kernel 'v9'; available: v0"),
    (dict(kernel=5), TypeError, r"^kernel: expected a kernel name or 'auto', got int"),
    (dict(out=F(4, 3, dtype="int32")), TypeError, r"^out: dtype must be one of \('float16', 'bfloat16', 'float32'\), got int32"),
    (dict(c=F(4, 3, dtype="int32"), beta=1.0), TypeError, r"^c: dtype "),
    (dict(bias=F(3, device=1)), ValueError, r"^bias: is on device 1, the operands on device 0"),
    (dict(scale=F(3, device=1)), ValueError, r"^scale: is on device 1, the operands on device 0"),
    (dict(kernel="v0", config={"DG_BM": 3}), ValueError, r"^config: kernel 'v0' has no parameter"),
    (dict(config={"DG_BX": 16}), ValueError, r"^config: only meaningful with a named kernel"),
    (dict(bias=F(4)), ValueError, r"^bias: expected a vector of length N=3"),
    (dict(bias=F(3, dtype="int32")), TypeError, r"^bias: dtype must be one of"),
    (dict(activation="tanh"), ValueError, r"^activation: must be one of"),
    (dict(scale=F(2)), ValueError, r"^scale: expected a vector of length N=3"),
    (dict(c=F(3, 4)), ValueError, r"^c: expected shape \(M, N\)=\(4, 3\)"),
    (dict(beta=0.5), ValueError, r"^beta: given without a residual c"),
    (dict(alpha=float("nan")), TypeError, r"^alpha: expected a finite real number"),
    (dict(scale=float("inf")), TypeError, r"^scale: expected a finite real number or a length-N vector"),
    (dict(scale=float("nan")), TypeError, r"^scale: expected a finite real number or a length-N vector"),
    (dict(c=F(4, 3), beta=float("inf")), TypeError, r"^beta: expected a finite real number, got inf"),
    (dict(c=F(4, 3), beta="0.5"), TypeError, r"^beta: expected a finite real number, got '0.5'"),
    (dict(alpha="2"), TypeError, r"^alpha: expected a finite real number"),
    (dict(bias=FakeDeviceArray((3,), "float32", strides=(8,))), ValueError, r"^bias: must be contiguous \(stride 1\), got a stride of 2"),
    (dict(bias=FakeDeviceArray((3,), "float32", base_ptr=(1 << 33) + 2)), ValueError,
     r"^bias: its address 0x200000002 is not a multiple of its element size \(4 bytes\)"),
    (dict(activation=["relu"]), ValueError, r"^activation: must be one of .* got \['relu'\]"),
    (dict(alpha=1e300), ValueError, r"^alpha: 1e\+300 is outside float32's range"),
    (dict(alpha=10**400), ValueError, r"^alpha: 1000.* is outside float32's range"),
    (dict(c=F(4, 3), beta=-4e38), ValueError, r"^beta: -4e\+38 is outside float32's range"),
    (dict(scale=2**128), ValueError, r"^scale: 3402.* is outside float32's range"),
    (dict(kernel="v0", config={"DG_BX": 0}), ValueError, r"^config: .* gives 8 x 0 tiles and \(0, 8, 1\) blocks: every size must be at least 1"),
    (dict(kernel="v1", config={"DG_BM": -16}), ValueError, r"^config: .* every size must be at least 1 \(kernel 'v1'\)"),
    (dict(kernel="v2", config={"DG_TM": 0}), ValueError, r"^config: .* divides by zero in kernel 'v2'"),
    (dict(kernel="v3", config={"DG_BM": 4096}), ValueError, r"^config: .* gives blocks of 8192 threads, over CUDA's 1024"),
    (dict(kernel="v0", config={1: 2, "DG_X": 3}), ValueError, r"^config: kernel 'v0' has no parameter\(s\) \[1, 'DG_X'\]"),
])
def test_argument_errors(captured, kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        deepgemm.gemm(F(4, 7), F(7, 3), **kwargs)
    assert not captured


def test_a_block_of_exactly_1024_threads_is_launched_and_one_thread_more_is_refused(captured):
    deepgemm.gemm(F(40, 7), F(7, 40), kernel="v0", config={"DG_BX": 32, "DG_BY": 32})
    assert [launch["block"] for launch in captured] == [(32, 32, 1)]
    with pytest.raises(ValueError, match=r"^config: .* gives blocks of 1056 threads, over CUDA's 1024"):
        deepgemm.gemm(F(40, 7), F(7, 40), kernel="v0", config={"DG_BX": 32, "DG_BY": 33})


def test_scalars_as_numbers_of_any_real_type(captured):
    """alpha, beta and a scalar scale may be any real number FP32 holds: NumPy scalars, fractions,
    and bools (1 and 0, as in Python and torch); they reach GemmParams as floats."""
    import fractions
    deepgemm.gemm(F(4, 7), F(7, 3), alpha=np.float16(0.5), scale=fractions.Fraction(1, 4), c=F(4, 3),
                  beta=np.int64(-3))
    deepgemm.gemm(F(4, 7), F(7, 3), alpha=True, scale=3.4e38)
    first, second = (launch["params"] for launch in captured)
    assert (float(first["alpha"]), float(first["scale_scalar"]), float(first["beta"])) == (0.5, 0.25, -3.0)
    assert (float(second["alpha"]), float(second["scale_scalar"])) == (1.0, np.float32(3.4e38))


def test_a_config_the_kernel_cannot_build_is_refused_naming_its_static_assert(captured):
    """A caller's config that breaks one of the kernel's static_asserts is a bad argument: a
    ValueError naming config and the assertion, the compiler's log chained to it."""
    with pytest.raises(ValueError, match=r"^config: kernel 'v4' does not build with \{.*'DG_BK': 128.*\}: "
                                         r".*DG_SMEM_BYTES assumes the k-contiguous tiles are the larger ones") as info:
        deepgemm.gemm(F(64, 64), F(64, 64), kernel="v4", config={"DG_BM": 64, "DG_WM": 32, "DG_BK": 128})
    assert isinstance(info.value.__cause__, deepgemm.CompileError)
    assert not captured


def test_a_config_deepgemm_chose_that_does_not_build_is_its_own_error_not_the_callers(captured, monkeypatch):
    """When the config deepgemm picked (no config= given) fails to compile, that is deepgemm's bug: the
    CompileError with the whole log reaches the caller, not a ValueError blaming a config argument."""
    from deepgemm import registry

    def broken(*args, **kwargs):
        raise deepgemm.CompileError("error: static assertion failed with \"planted\"")
    monkeypatch.setattr(registry, "compile_variant", broken)
    with pytest.raises(deepgemm.CompileError, match="planted"):
        deepgemm.gemm(F(64, 64), F(64, 64), kernel="v4")
    with pytest.raises(ValueError, match=r"^config: kernel 'v4' does not build with .*: planted$"):
        deepgemm.gemm(F(64, 64), F(64, 64), kernel="v4", config={"DG_BM": 64})
    assert not captured


def test_a_tensor_without_storage_is_named_not_a_runtime_error(captured):
    """The repeat-call key reads data_ptr(), which a sparse tensor raises RuntimeError for: the
    full path then names the argument."""
    class SparseTensor:
        __module__ = "torch"
        is_cuda, requires_grad, shape, dtype = True, False, (7, 3), "torch.float16"

        def stride(self):
            return (3, 1)

        def data_ptr(self):
            raise RuntimeError("Cannot access data pointer of Tensor that doesn't have storage")
    with pytest.raises(TypeError, match=r"^a: "):
        deepgemm.gemm(SparseTensor(), F(7, 3))


def test_a_tensor_autograd_tracks_is_never_replayed():
    """The repeat-call key refuses a tensor that requires grad while grad mode is on, so the full
    path refuses it by name (arrays.as_cupy) on every call, not only the first."""
    torch = pytest.importorskip("torch")

    class CudaTensor:   # what _array_key reads of a CUDA tensor
        __module__ = "torch"
        is_cuda, requires_grad, shape, dtype = True, True, (4, 4), torch.float16

        def data_ptr(self):
            return 1 << 32

        def stride(self):
            return (4, 1)

        def get_device(self):
            return 0
    with pytest.raises(TypeError):
        api._array_key(CudaTensor())
    with torch.no_grad():
        assert api._array_key(CudaTensor())[0] == "torch"


def test_the_repeat_call_key_holds_each_operands_16_byte_class():
    """A plan is replayed only for operands whose addresses share their offset within 16 bytes with
    the call that made it (the vector paths were chosen for that offset): torch tensors (data_ptr)
    and CuPy arrays (.data.ptr) alike. An address 2 bytes on, or 16 bytes on plus 2, gets another
    key; one 16 or 4096 bytes on gets the same."""
    class CudaTensor:   # what _array_key reads of a CUDA tensor
        __module__ = "torch"
        is_cuda, requires_grad, shape, dtype = True, False, (4, 4), "float16"

        def __init__(self, ptr):
            self.ptr = ptr

        def data_ptr(self):
            return self.ptr

        def stride(self):
            return (4, 1)

        def get_device(self):
            return 0

    def cupy_like(ptr):
        return types.SimpleNamespace(shape=(4, 4), strides=(8, 2), dtype="float16",
                               data=types.SimpleNamespace(ptr=ptr, device_id=0))
    for make in (CudaTensor, cupy_like):
        key = lambda ptr: api._array_key(make(ptr))
        base = 1 << 32
        assert key(base) == key(base + 16) == key(base + 4096), make
        assert len({key(base), key(base + 2), key(base + 8), key(base + 18)}) == 3, make


def test_a_length_one_vector_may_have_any_stride(captured):
    """With N = 1 a bias or scale vector has one element, so its stride says nothing (a column of a
    wider array): accepted."""
    column = FakeDeviceArray((1,), "float32", strides=(64,))
    deepgemm.gemm(F(4, 7), F(7, 1), kernel="v0", bias=column, scale=column)
    assert len(captured) == 1


@pytest.mark.parametrize("config,pattern", [
    ({"DG_BM": 96}, r"DG_BM=96 is not one of \[64, 128, 256\]"),
    ({"DG_BM": 256, "DG_BN": 256}, r"DG_BM=256 takes tiles at most 128 wide, cooperative, without split-K or multicast"),
    ({"DG_BM": 256, "DG_BN": 128, "DG_PINGPONG": 1}, r"DG_PINGPONG=1 takes 128-row tiles .* not DG_BM=256"),
    ({"DG_BM": 256, "DG_BN": 64, "DG_SPLIT_K": 2, "DG_STAGES": 4}, r"DG_BM=256 takes tiles at most 128 wide, cooperative, "
                                                                     r"without split-K"),
    ({"DG_BM": 256, "DG_BN": 64, "DG_STAGES": 5}, r"v5's 256 x 64 tiles in this config need \d+ bytes of shared memory"),
    ({"DG_BN": 100}, r"DG_BN=100 is not one of"),
    ({"DG_STAGES": 9}, r"v5's 128 x 256 tiles in this config need \d+ bytes of shared memory, over the 232448 a block may "
                        r"have on compute capability 9.0"),
    ({"DG_STAGES": 1}, r"DG_STAGES=1: the ring needs at least 2 stages"),
    ({"DG_PINGPONG": 1}, r"DG_PINGPONG=1 takes 128-row tiles at most 128 wide"),
    ({"DG_SPLIT_K": 16}, r"DG_SPLIT_K=16 is not one of"),
    ({"DG_PINGPONG": True}, r"DG_PINGPONG must be an integer, got True"),
    ({"DG_BN": "128"}, r"DG_BN must be an integer, got '128'"),
    ({"DG_BN": 128.0}, r"DG_BN must be an integer, got 128.0"),
    ({"DG_BN": 192, "DG_SPLIT_K": 2, "DG_STAGES": 2}, r"DG_SPLIT_K=2: the ring of DG_STAGES=2 is too small to park a 128 x 192 tile's FP32 partial sums"),
    ({"DG_CLUSTER_M": 4}, r"DG_CLUSTER_M=4 is not one of \[1, 2\]"),
    ({"DG_CLUSTER_M": 2, "DG_SPLIT_K": 2, "DG_BN": 128, "DG_STAGES": 6}, r"DG_CLUSTER_M=2 and DG_SPLIT_K=2: each uses the cluster"),
    ({"DG_CLUSTER_M": 2, "DG_BN": 192, "DG_STAGES": 4}, r"DG_CLUSTER_M=2 with DG_BN=192 and a row-major b: each block loads whole 64-column blocks"),
])
def test_v5_configs_it_cannot_build_are_refused_by_name(captured, config, pattern):
    """Before any compile: a ValueError naming the parameter, not a compiler log."""
    with pytest.raises(ValueError, match=r"^config: " + pattern):
        deepgemm.gemm(F(256, 64), F(64, 256), kernel="v5", config=config)
    assert not captured


def test_kernel_that_cannot_run_on_this_gpu(captured, gpus):
    gpus({0: dict(FAKE_GPU, cc=61)})
    with pytest.raises(ValueError, match=r"^kernel: 'v0' needs compute capability >= 7.0, this GPU has 6.1"):
        deepgemm.gemm(F(4, 7), F(7, 3), kernel="v0")


def test_a_config_over_the_gpus_shared_memory_is_refused_by_name(captured, gpus):
    """V4's default tiles fit sm_80's 163 KB but not the 99 KB of an L4 or an RTX 4090 (8.9): a
    caller's config asking for them there is a ValueError before any compile, not a driver error."""
    gpus({0: dict(FAKE_GPU, cc=89)})
    with pytest.raises(ValueError, match=r"^config: v4's 256 x 128 tiles in this config need 147456 bytes of shared "
                                         r"memory, over the 101376 a block may have on compute capability 8.9"):
        deepgemm.gemm(F(4, 7), F(7, 3), kernel="v4", config={"DG_STAGES": 3})
    assert not captured


def test_empty_m_or_n_launches_nothing_and_k_zero_launches(captured):
    assert deepgemm.gemm(F(0, 7), F(7, 3)).shape == (0, 3)
    assert deepgemm.gemm(F(4, 7), F(7, 0)).shape == (4, 0)
    assert not captured
    deepgemm.gemm(F(4, 0), F(0, 3))   # K = 0: the epilogue of zeros still has to be written
    assert int(captured[0]["params"]["k"]) == 0


# Strides frameworks give empty arrays: C order over a zero extent (0 or the element size), the
# transposes of those, and odd ones from slicing.
EMPTY_STRIDES = [(0, 2), (2, 2), (0, 0), (2, 0), (14, 6), (-2, 3), (6, 14)]


@pytest.mark.parametrize("strides", EMPTY_STRIDES)
def test_an_empty_matrix_takes_any_strides(strides):
    for shape in ((4, 0), (0, 4), (0, 0)):
        mat = arrays.matrix(FakeDeviceArray(shape, strides=strides), "a")
        assert mat.row_major and mat.ld == max(shape[1], 1) and (mat.rows, mat.cols) == shape


@pytest.mark.parametrize("a_strides,b_strides", [(s, t) for s in EMPTY_STRIDES for t in EMPTY_STRIDES[:3]])
def test_k_zero_with_any_strides_runs_the_epilogue_on_zeros(captured, a_strides, b_strides):
    """As torch.mm: K = 0 with fresh empty operands (cupy.ones((4, 0)): strides that are 0 or odd)
    gives act(bias) * scale + beta * c, so the kernel runs with k = 0 and the whole epilogue."""
    a = FakeDeviceArray((4, 0), strides=a_strides)
    b = FakeDeviceArray((0, 3), strides=b_strides)
    c = F(4, 3, dtype="float32")
    out = deepgemm.gemm(a, b, out_dtype="float32", bias=F(3, dtype="float32"), activation="gelu", scale=2.0,
                        c=c, beta=0.5)
    (launch,) = captured
    p = launch["params"]
    assert out.shape == (4, 3) and str(out.dtype) == "float32"
    assert (int(p["m"]), int(p["n"]), int(p["k"])) == (4, 3, 0)
    assert int(p["c"]) == c.data.ptr and float(p["beta"]) == 0.5 and float(p["scale_scalar"]) == 2.0
    assert "epi=bias:float32+gelu+scale:scalar+C:float32" in launch["compiled"].name
    assert int(p["lda"]) >= 1 and int(p["ldb"]) >= 1 and int(p["ldd"]) == 3


@pytest.mark.parametrize("b", [F(0, 96), F(96, 0).T, FakeDeviceArray((0, 96), strides=(0, 0))],
                         ids=["row-major", "transposed", "zero-strides"])
def test_k_zero_takes_a_config_that_needs_a_k_major_b(captured, b):
    """An empty b has no layout to honour: it is described K-major, so V5's 96-wide tiles (which
    refuse a row-major b) still run the epilogue at K = 0, and a row-major b with K > 0 is still refused."""
    deepgemm.gemm(F(4, 0), b, kernel="v5", config={"DG_BN": 96}, bias=F(96))
    (launch,) = captured
    assert ",rc," in launch["compiled"].name and int(launch["params"]["k"]) == 0
    with pytest.raises(ValueError, match="DG_BN=96 needs a column-major"):
        deepgemm.gemm(F(4, 8), F(8, 96), kernel="v5", config={"DG_BN": 96})


@pytest.mark.parametrize("a_shape,b_shape,strides", [((0, 7), (7, 3), (0, 0)), ((0, 7), (7, 3), (3, 5)),
                                                      ((4, 7), (7, 0), (0, 2)), ((0, 0), (0, 0), (2, 2))])
def test_empty_m_or_n_gives_an_empty_result_of_the_right_shape_and_dtype(captured, a_shape, b_shape, strides):
    a = FakeDeviceArray(a_shape, strides=strides if 0 in a_shape else None)
    b = FakeDeviceArray(b_shape, strides=strides if 0 in b_shape else None)
    d = deepgemm.gemm(a, b, out_dtype="bfloat16")
    assert d.shape == (a_shape[0], b_shape[1]) and str(d.dtype) == "bfloat16"
    out = FakeDeviceArray((a_shape[0], b_shape[1]), dtype="float32", strides=(7, 0))   # odd strides: empty
    assert deepgemm.gemm(a, b, out=out, bias=F(b_shape[1], dtype="float32"), activation="relu") is out
    assert not captured


def test_empty_operands_still_check_the_other_arguments(captured):
    with pytest.raises(ValueError, match=r"^b: inner dimensions differ"):
        deepgemm.gemm(F(0, 7), F(6, 3))
    with pytest.raises(ValueError, match=r"^bias: expected a vector of length N=3"):
        deepgemm.gemm(F(0, 7), F(7, 3), bias=F(4))
    with pytest.raises(ValueError, match=r"^c: expected shape \(M, N\)=\(0, 3\)"):
        deepgemm.gemm(F(0, 7), F(7, 3), c=F(1, 3))
    with pytest.raises(ValueError, match=r"^out: expected shape"):
        deepgemm.gemm(F(4, 0), F(0, 3), out=F(3, 4))
    with pytest.raises(ValueError, match=r"^accumulate: "):
        deepgemm.gemm(F(0, 7), F(7, 3), accumulate="fp64")
    assert not captured



def test_a_strided_vector_of_two_is_refused_and_one_element_has_no_stride(captured):
    """bias and scale are read as contiguous: any vector longer than one element must be."""
    for name in ("bias", "scale"):
        with pytest.raises(ValueError, match=rf"^{name}: must be contiguous \(stride 1\), got a stride of 2"):
            deepgemm.gemm(F(4, 7), F(7, 2), **{name: FakeDeviceArray((2,), "float32", strides=(8,))})
    assert not captured
    deepgemm.gemm(F(4, 7), F(7, 1), bias=FakeDeviceArray((1,), "float32", strides=(8,)))
    assert len(captured) == 1

def test_sizes_near_2_31_are_refused_before_a_tile_count_wraps(captured):
    """The kernels round M, N and K up to whole tiles and k-steps in 32 bits: a size within a tile
    of 2^31 (K = 2^31 - 1: k0 + BK wraps) is refused, by name; the largest size allowed launches."""
    from deepgemm import api
    for k in (2**31, 2**31 - 1, api.MAX_SIZE + 1):
        with pytest.raises(ValueError, match=rf"^a, b: K={k} exceeds the supported maximum {api.MAX_SIZE}"):
            deepgemm.gemm(F(1, k), F(k, 1))
    with pytest.raises(ValueError, match=rf"^a: M={api.MAX_SIZE + 1} exceeds"):
        deepgemm.gemm(F(api.MAX_SIZE + 1, 1), F(1, 1))
    with pytest.raises(ValueError, match=rf"^b: N={api.MAX_SIZE + 1} exceeds"):
        deepgemm.grouped_gemm(F(4, 1), F(1, 1, api.MAX_SIZE + 1), offsets=[0, 4], kernel="v4")
    assert not captured
    deepgemm.gemm(F(1, api.MAX_SIZE), F(api.MAX_SIZE, 1), kernel="v0")
    assert len(captured) == 1 and int(captured[0]["params"]["k"]) == api.MAX_SIZE


def test_default_epilogue_is_the_plain_product_everywhere(captured):
    # gemm(), batched gemm() and grouped_gemm() without epilogue arguments: D = A @ B exactly
    # (alpha 1, no bias, scale 1, no C), compiled without an epilogue.
    deepgemm.gemm(F(4, 7), F(7, 3))
    deepgemm.gemm(F(2, 4, 7), F(2, 7, 3))
    deepgemm.grouped_gemm(F(300, 64), F(4, 64, 128), sizes=F(4, dtype="int32"), kernel="v4")
    assert len(captured) == 3
    for launch in captured:
        p = launch["params"]
        assert (float(p["alpha"]), float(p["beta"]), float(p["scale_scalar"])) == (1.0, 0.0, 1.0)
        assert int(p["bias"]) == int(p["scale"]) == int(p["c"]) == 0
        assert "epi=none" in launch["compiled"].name


def test_empty_batches_and_groups_launch_nothing_and_one_row_does(captured):
    # As torch.matmul: no batch, no rows or no columns give an empty result and launch nothing;
    # a single row is a GEMM like any other.
    for a, b, shape in (((0, 4, 7), (0, 7, 3), (0, 4, 3)), ((2, 0, 7), (2, 7, 3), (2, 0, 3)),
                        ((2, 4, 7), (2, 7, 0), (2, 4, 0))):
        assert deepgemm.gemm(F(*a), F(*b)).shape == shape and not captured
    assert deepgemm.grouped_gemm(F(0, 16), F(0, 16, 8), sizes=F(0, dtype="int32"), kernel="v4").shape == (0, 8)
    for rows in (7, 1):   # rows left unwritten
        with pytest.raises(ValueError, match=rf"^b: has no groups \(G = 0\) to take a's {rows} rows"):
            deepgemm.grouped_gemm(F(rows, 16), F(0, 16, 8), sizes=F(0, dtype="int32"), kernel="v4")
    assert deepgemm.grouped_gemm(F(0, 16), F(3, 16, 8), sizes=F(3, dtype="int32"), kernel="v4").shape == (0, 8)
    # nothing to compute, but the epilogue's vectors are still checked: N values each, a 0-d one refused
    assert deepgemm.gemm(F(0, 4, 7), F(0, 7, 3), bias=F(3), scale=F(3)).shape == (0, 4, 3)
    with pytest.raises(ValueError, match=r"^bias: expected N=3 values along its last dimension, got shape \(\)"):
        deepgemm.gemm(F(0, 4, 7), F(0, 7, 3), bias=F())
    assert deepgemm.grouped_gemm(F(5, 16), F(3, 16, 0), sizes=F(3, dtype="int32"), kernel="v4").shape == (5, 0)
    assert not captured
    assert deepgemm.gemm(F(2, 1, 7), F(2, 7, 3)).shape == (2, 1, 3) and len(captured) == 1
    assert deepgemm.grouped_gemm(F(1, 16), F(3, 16, 8), sizes=F(3, dtype="int32"), kernel="v4").shape == (1, 8)
    assert len(captured) == 2


def test_a_shared_bias_does_not_step_between_batches(captured):
    # [N] bias for every batch: back to back batches with a shared weight stay one tall GEMM, and
    # batches with their own weights step the operands but read the same bias row (stride 0).
    deepgemm.gemm(F(2, 4, 7), F(7, 3), bias=F(3))
    deepgemm.gemm(F(2, 4, 7), F(2, 7, 3), bias=F(3))
    tall, grouped = (launch["params"] for launch in captured)
    assert int(tall["m"]) == 2 * 4 and "groups" not in tall.dtype.names
    assert (int(grouped["groups"]), int(grouped["stride_b"]), int(grouped["stride_bias"])) == (2, 7 * 3, 0)


def test_batched_residual_steps_one_output_matrix_per_batch(captured):
    deepgemm.gemm(F(2, 4, 7), F(2, 7, 3), c=F(2, 4, 3))
    p = captured[0]["params"]
    assert int(p["groups"]) == 2
    assert (int(p["stride_a"]), int(p["stride_b"]), int(p["stride_d"]), int(p["stride_c"])) == (4 * 7, 7 * 3, 4 * 3, 4 * 3)


def test_epilogue_arguments_reach_the_kernel(captured):
    out = F(4, 3, dtype="float32")
    deepgemm.gemm(F(4, 7), F(7, 3), out=out, alpha=0.5, bias=F(3, dtype="float32"), activation="gelu",
                  scale=2.0, c=out, beta=0.25)
    p = captured[0]["params"]
    assert (float(p["alpha"]), float(p["beta"]), float(p["scale_scalar"])) == (0.5, 0.25, 2.0)
    assert int(p["c"]) == int(p["d"]) and int(p["ldc"]) == 3      # residual aliases the output
    assert "epi=alpha+bias:float32+gelu+scale:scalar+C:float32" in captured[0]["compiled"].name



def test_a_residual_without_beta_is_added_once_and_beta_needs_a_residual(captured):
    """beta defaults to 1 when c is given (D = A B + C, as torch.addmm); without c, beta = 0 (what
    an absent residual contributes) is accepted and any other beta is refused, 1 included."""
    deepgemm.gemm(F(4, 7), F(7, 3), c=F(4, 3))
    deepgemm.gemm(F(4, 7), F(7, 3), beta=0.0)
    with pytest.raises(ValueError, match=r"^beta: given without a residual c"):
        deepgemm.gemm(F(4, 7), F(7, 3), beta=1.0)
    with_c, without = (launch["params"] for launch in captured)
    assert (float(with_c["alpha"]), float(with_c["beta"])) == (1.0, 1.0) and int(with_c["c"]) != 0
    assert (float(without["beta"]), int(without["c"])) == (0.0, 0)


def test_scalars_up_to_float32s_largest_are_accepted(captured):
    top = float(np.finfo(np.float32).max)
    deepgemm.gemm(F(4, 7), F(7, 3), alpha=top, scale=-top)
    assert float(captured[0]["params"]["alpha"]) == top and float(captured[0]["params"]["scale_scalar"]) == -top
    with pytest.raises(ValueError, match=r"^alpha: .* is outside float32's range"):
        deepgemm.gemm(F(4, 7), F(7, 3), alpha=np.nextafter(top, np.inf))

def test_kernels_lists_what_each_supports():
    ks = {k["name"]: k for k in deepgemm.kernels()}
    assert "v0" in ks and ks["v0"]["input_dtypes"] == ["float16", "bfloat16"]
    assert len(ks["v0"]["layouts"]) == 4
    assert {k for k, v in ks.items() if v["grouped"]} == {"v4", "v5"}
    # what a caller checks against its GPU: compute capability as the major.minor number
    assert {k: v["min_compute_capability"] for k, v in ks.items()} == {
        "v0": 7.0, "v1": 7.0, "v2": 7.0, "v3": 7.0, "v4": 8.0, "v5": 9.0, "small_m": 8.0}


def test_plan_key_separates_everything_a_plan_depends_on():
    """The repeat-call cache key (api._plan_key): same geometry, dtype, device, alignment class and
    scalars -> same key; any of them different -> a different key; unhashable arguments -> no key
    (invalid hashable ones get a key, but only the full path stores plans, and it rejects them)."""
    def arr(shape, offset=0, dtype="float16", strides=None):
        x = FakeDeviceArray(shape, dtype, strides=strides, offset=offset)
        x.data.device_id = 0
        return x

    def key(a, b, **kw):
        args = dict(out=None, out_dtype=None, kernel="auto", config=None, alpha=1.0, bias=None,
                    activation=None, scale=None, c=None, beta=None, accumulate="fp32")
        args.update(kw)
        try:
            k = api._plan_key(a, b, *args.values())
            hash(k)   # what gemm()'s dict lookup does
            return k
        except (TypeError, AttributeError):
            return None

    base = key(arr((64, 32)), arr((32, 16)))
    assert base is not None and base == key(arr((64, 32), offset=8), arr((32, 16)))   # 16 B moved: same class
    assert base != key(arr((64, 32), offset=1), arr((32, 16)))                        # 2 B off: new class
    assert base != key(arr((64, 32)), arr((32, 16), dtype="bfloat16"))
    assert base != key(arr((64, 32)), arr((32, 16), strides=(2, 64)))                  # layout
    assert base != key(arr((64, 32)), arr((32, 16)), alpha=2.0)
    assert base != key(arr((64, 32)), arr((32, 16)), activation="gelu")
    assert base != key(arr((64, 32)), arr((32, 16)), config={"DG_BM": 64})
    assert key(arr((64, 32)), arr((32, 16)), config={"DG_BM": [1]}) is None            # unhashable
    a, b = arr((64, 32)), arr((32, 16))
    assert key(a, b, alpha=float("nan")) != key(a, b, alpha=float("nan"))             # NaN: never replayed


def test_repeat_calls_replay_a_plan_with_new_pointers(replayable):
    """A second call with the same geometry skips the full path (no second dispatch or compile
    lookup) and launches the cached kernel through cuLaunchKernel with the new pointers and the same
    everything else."""
    captured, replays, binds = replayable
    out1, out2 = P(64, 16, base_ptr=1 << 24), P(64, 16, base_ptr=1 << 25)
    deepgemm.gemm(P(64, 32, base_ptr=1 << 20), P(32, 16, base_ptr=1 << 21), kernel="v4", out=out1)
    assert len(captured) == 1 and len(api._plans) == 1 and not replays          # full path, plan stored
    assert deepgemm.gemm(P(64, 32, base_ptr=1 << 22), P(32, 16, base_ptr=1 << 23), kernel="v4", out=out2) is out2
    assert len(captured) == 1 and len(replays) == 1 and binds == [0]             # replayed, context bound
    first, again = captured[0]["params"], np.frombuffer(replays[0]["params"], PARAMS_DTYPE)[0]
    assert (int(again["a"]), int(again["b"]), int(again["d"])) == (1 << 22, 1 << 23, 1 << 25)
    for field in ("m", "n", "k", "lda", "ldb", "ldd", "alpha", "split_k", "bias", "c"):
        assert again[field] == first[field]
    assert replays[0]["grid"] == captured[0]["grid"] and (replays[0]["func"], replays[0]["stream"]) == (0xF00, 0x5)


def test_a_column_major_a_at_decode_sizes_runs_on_a_row_major_copy(replayable, monkeypatch):
    """auto runs a column-major A at 2 <= M <= 16 (K >= 1024) on a row-major copy made on the
    caller's stream: the kernel is the row-major-A build reading the copy, a replay copies the new
    A again, and an out overlapping the caller's A (not the copy) is refused on both paths."""
    captured, replays, _ = replayable
    copies = []

    def copy(a):
        assert a.strides == (2, 2 * a.shape[0])          # the caller's column-major A
        copies.append(P(*a.shape))
        return copies[-1]
    monkeypatch.setattr(api, "_row_major_copier", lambda fw: copy)
    w = P(2048, 2048)
    x1, x2 = P(2048, 8).T, P(2048, 8).T                 # 8 x 2048, column-major
    deepgemm.gemm(x1, w.T)
    (first,) = captured
    assert "small_m[float16->float16,rc," in first["compiled"].name                   # A row-major
    assert int(first["params"]["a"]) == copies[0].data.ptr and int(first["params"]["lda"]) == 2048
    deepgemm.gemm(x2, w.T)
    again = np.frombuffer(replays[0]["params"], PARAMS_DTYPE)[0]
    assert len(copies) == 2 and int(again["a"]) == copies[1].data.ptr
    over_a = FakeDeviceArray((8, 2048), base_ptr=x2.data.ptr)
    for _ in range(2):                                   # the replay, then (no plan for out) the full path
        with pytest.raises(ValueError, match=r"^out: overlaps a in memory"):
            deepgemm.gemm(x2, w.T, out=over_a)
        api._plans.clear()
    assert len(copies) == 2
    for named_or_short in (dict(a=x1, kernel="small_m"), dict(a=P(1000, 8).T, b=P(1000, 2048))):
        args = {"b": w.T, **named_or_short}
        deepgemm.gemm(args.pop("a"), args.pop("b"), **args)
        assert re.search(r"->float16,c[rc],", captured[-1]["compiled"].name) and len(copies) == 2   # read in place


def test_an_out_sharing_memory_with_an_operand_is_refused(captured):
    """Tiles write out while other tiles still read the operands: an out that overlaps one would
    give a result that depends on the order the tiles run in."""
    a, b = F(64, 64), F(64, 64)
    for bad, name in ((a, "a"), (b, "b"), (FakeDeviceArray((64, 64), base_ptr=a.data.ptr + 64 * 2 * 63), "a")):
        with pytest.raises(ValueError, match=rf"^out: overlaps {name} in memory"):
            deepgemm.gemm(a, b, kernel="v0", out=bad)
    out = F(64, 64, dtype="float32")
    inside = FakeDeviceArray((64,), "float32", base_ptr=out.data.ptr + 4 * 64 * 10)   # row 10 of out
    with pytest.raises(ValueError, match=r"^out: overlaps bias"):
        deepgemm.gemm(a, b, kernel="v0", out=out, bias=inside)
    with pytest.raises(ValueError, match=r"^out: overlaps scale"):
        deepgemm.gemm(a, b, kernel="v0", out=out, scale=inside)
    shifted = FakeDeviceArray((64, 64), "float32", base_ptr=out.data.ptr + 4 * 64)   # out one row down
    with pytest.raises(ValueError, match=r"^out: overlaps c .*c=out itself"):
        deepgemm.gemm(a, b, kernel="v0", out=out, c=shifted)
    assert not captured
    deepgemm.gemm(a, b, kernel="v0", out=out, c=out)                                 # in place: supported
    both = F(128, 64)                                                                # a and out in one buffer:
    top, bottom = (FakeDeviceArray((64, 64), base_ptr=both.data.ptr + 64 * 64 * 2 * i) for i in (0, 1))
    deepgemm.gemm(top, b, kernel="v0", out=bottom)                                   # adjacent, not overlapping
    assert len(captured) == 2


def test_the_plan_cache_holds_at_most_its_size(replayable, monkeypatch):
    """Past PLAN_CACHE_SIZE geometries the plans are dropped all at once (one step: threads that
    share them never see a half-cleared table), and a repeat call replans."""
    captured, replays, _ = replayable
    monkeypatch.setattr(api, "PLAN_CACHE_SIZE", 3)
    sizes = []
    for n in (8, 16, 24, 32, 40):
        deepgemm.gemm(P(16, 64), P(64, n), kernel="v4")
        sizes.append(len(api._plans))
    assert sizes == [1, 2, 3, 1, 2] and not replays
    deepgemm.gemm(P(16, 64), P(64, 40), kernel="v4")
    assert len(replays) == 1


def test_a_replay_into_an_out_that_overlaps_an_operand_is_refused(replayable):
    """A repeat call has the plan's geometry but new pointers: out = a there is refused as the
    full path refuses it, and nothing is launched; c = out still replays."""
    captured, replays, _ = replayable
    a, b = P(64, 64, base_ptr=1 << 22), P(64, 64, base_ptr=1 << 23)
    deepgemm.gemm(a, b, kernel="v4", out=P(64, 64, base_ptr=1 << 24))
    assert len(api._plans) == 1
    with pytest.raises(ValueError, match=r"^out: overlaps a in memory"):
        deepgemm.gemm(a, b, kernel="v4", out=P(64, 64, base_ptr=(1 << 22) + 2 * 64))
    with pytest.raises(ValueError, match=r"^out: overlaps b in memory"):
        deepgemm.gemm(a, b, kernel="v4", out=P(64, 64, base_ptr=(1 << 23) - 2))
    assert len(captured) == 1 and not replays
    deepgemm.gemm(a, b, kernel="v4", out=P(64, 64, base_ptr=1 << 25))
    assert len(replays) == 1
    for i in range(2):                                  # c = out: the first call plans, the second replays
        out = P(64, 64, base_ptr=(1 << 26) * (i + 1))
        deepgemm.gemm(a, b, kernel="v4", out=out, c=out)
    assert len(captured) == 2 and len(replays) == 2
    with pytest.raises(ValueError, match=r"^out: overlaps c"):
        out = P(64, 64, base_ptr=1 << 28)
        deepgemm.gemm(a, b, kernel="v4", out=out, c=P(64, 64, base_ptr=(1 << 28) + 2))
    assert len(replays) == 2


def test_a_replay_checks_every_operand_at_aligned_addresses(replayable):
    """Overlaps the replay itself must catch (the pointers keep the plan's 16-byte classes, so the
    call does replay): out over the second half of b is refused; a C that starts right where out
    ends touches it without overlapping and still replays."""
    captured, replays, _ = replayable
    a, b = P(64, 64, base_ptr=1 << 22), P(64, 64, base_ptr=1 << 23)
    deepgemm.gemm(a, b, kernel="v4", out=P(64, 64, base_ptr=1 << 24), c=P(64, 64, base_ptr=1 << 25))
    with pytest.raises(ValueError, match=r"^out: overlaps b in memory"):
        deepgemm.gemm(a, b, kernel="v4", out=P(64, 64, base_ptr=(1 << 23) + 2 * 64 * 32),
                      c=P(64, 64, base_ptr=1 << 25))
    assert len(captured) == 1 and not replays
    out_base = 1 << 26
    deepgemm.gemm(a, b, kernel="v4", out=P(64, 64, base_ptr=out_base), c=P(64, 64, base_ptr=out_base + 2 * 64 * 64))
    assert len(captured) == 1 and len(replays) == 1


@pytest.mark.parametrize("name", ["a", "b", "bias", "scale", "c"])
def test_a_replay_tells_touching_from_overlapping_for_every_operand(replayable, name):
    """Each operand the replay checks, placed to end where out starts or to start where it ends,
    touches out without sharing a byte and replays; moved one 16-byte step into out, it is refused
    by name (the step keeps the plan's alignment classes, so the call still takes the replay path)."""
    captured, replays, _ = replayable
    out_base, out_bytes = 1 << 30, 64 * 64 * 2
    sizes = {"a": 64 * 64 * 2, "b": 64 * 64 * 2, "bias": 64 * 4, "scale": 64 * 4, "c": 64 * 64 * 2}
    homes = {"a": 1 << 22, "b": 1 << 23, "bias": 1 << 24, "scale": 1 << 25, "c": 1 << 26}

    def call(out_ptr, moved=None, at=None):
        ptrs = dict(homes, **({moved: at} if moved else {}))
        vec = lambda key: P(64, dtype="float32", base_ptr=ptrs[key])
        return deepgemm.gemm(P(64, 64, base_ptr=ptrs["a"]), P(64, 64, base_ptr=ptrs["b"]), kernel="v4",
                             out=P(64, 64, base_ptr=out_ptr), bias=vec("bias"), scale=vec("scale"),
                             c=P(64, 64, base_ptr=ptrs["c"]))
    call(1 << 29)                                                           # the plan
    for at in (out_base - sizes[name], out_base + out_bytes):               # ends where out starts / starts where it ends
        call(out_base, name, at)
    assert len(captured) == 1 and len(replays) == 2
    for at in (out_base - sizes[name] + 16, out_base + out_bytes - 16):     # one 16-byte step into out
        with pytest.raises(ValueError, match=rf"^out: overlaps {name} in memory"):
            call(out_base, name, at)
    assert len(captured) == 1 and len(replays) == 2


def test_a_replayed_v5_plan_maps_the_new_residual(replayable, fake_encode):
    """V5 loads a 16-bit residual through its own tensor map: a replay encodes it for the new C."""
    captured, replays, _ = replayable
    cfg = {"DG_BN": 128, "DG_STAGES": 6}
    for i in range(2):
        c = P(512, 512, base_ptr=(1 << 26) * (i + 1))
        out = deepgemm.gemm(P(512, 256, base_ptr=1 << 22), P(256, 512, base_ptr=1 << 23), kernel="v5", config=cfg, c=c)
        assert [(e["box"], e["stride"]) for e in fake_encode if e["ptr"] == c.data.ptr] == [((64, 64), 1024)]
    assert len(captured) == 1 and len(replays) == 1
    import ctypes
    argv = ctypes.cast(replays[0]["argv"], ctypes.POINTER(ctypes.c_void_p))   # the void*[]: GemmParams, then the maps
    maps = np.frombuffer(b"".join(ctypes.string_at(argv[i], 128) for i in range(1, 5)), tma.TENSOR_MAP_DTYPE)
    assert [int(m["opaque"][0]) for m in maps] == [1 << 22, 1 << 23, out.data.ptr, 1 << 27]   # A, B, D, C


def test_v5_and_small_m_go_out_as_programmatic_dependents_on_sm90_only(replayable, fake_encode, gpus, monkeypatch):
    """The kernels whose every global access follows griddepcontrol.wait (KernelSpec.pdl) launch
    with the PDL attribute on sm_90, on the full path and on replays; the others never, nor
    anything with DEEPGEMM_PDL=0 or on sm_80."""
    captured, replays, _ = replayable
    calls = [dict(a=P(16, 4096), b=P(4096, 4096).T, kernel="small_m"),
             dict(a=P(512, 256), b=P(256, 512), kernel="v5", config={"DG_BN": 128, "DG_STAGES": 6}),
             dict(a=P(64, 32), b=P(32, 16), kernel="v4")]

    def run_twice(calls):   # a full path, then a replay, of each
        captured.clear(), replays.clear()
        for kw in calls + calls:
            deepgemm.gemm(**kw)
        assert len(captured) == len(replays) == len(calls)
        return [c["pdl"] for c in captured], [r["pdl"] for r in replays]
    monkeypatch.delenv("DEEPGEMM_PDL", raising=False)
    assert run_twice(calls) == ([True, True, False], [True, True, False])
    monkeypatch.setenv("DEEPGEMM_PDL", "0")
    deepgemm.clear_caches()                     # plans made before keep their launch: forget them
    assert run_twice(calls) == ([False] * 3, [False] * 3)
    monkeypatch.delenv("DEEPGEMM_PDL")
    gpus({0: {"name": "Fake A100", "cc": 80, "sm_count": 108}})
    assert run_twice([calls[0], calls[2]]) == ([False] * 2, [False] * 2)


def test_clear_caches_forgets_everything_held_in_memory(replayable, gpus):
    """deepgemm.clear_caches() empties every registered cache: plans, decisions, tuned tables,
    compiled and loaded kernels, device facts (what is on disk stays)."""
    from deepgemm import dispatch, jit, tables
    captured, replays, _ = replayable
    x, w = P(16, 64), P(64, 64)
    deepgemm.gemm(x, w.T)
    deepgemm.gemm(x, w.T)
    held = {"plans": api._plans, "decisions": dispatch._decisions, "tables": tables._loaded,
            "kernels": jit._compiled, "device": device._facts}
    assert all(held.values()), {k: len(v) for k, v in held.items()}
    # The interop caches are filled only by torch tensors on a GPU: one entry each stands in.
    interop = {"torch views": arrays._views, "streams": arrays._external_streams,
               "allocators": arrays._torch_allocators, "dtype names": arrays._DTYPE_NAMES}
    for name, cache in interop.items():
        cache.setdefault(("stand-in", name), object())
    if importlib.util.find_spec("torch"):
        arrays._torch_raw_stream()
    assert len(replays) == 1
    cleared = deepgemm.clear_caches()
    assert set(held) | {"modules", "dtype names", "torch views", "interop", "tensor maps"} <= set(cleared)
    assert not any(held.values()), {k: len(v) for k, v in held.items() if v}
    assert not any(interop.values()) and arrays._torch_raw_stream.cache_info().currsize == 0
    deepgemm.gemm(x, w.T)                       # the full path again: nothing replayed from before
    assert len(captured) == 2 and len(replays) == 1


def test_a_kernel_registered_again_under_its_name_is_the_one_the_next_call_runs(replayable):
    """register() and unregister() forget the plans and decisions made with the kernel table as it
    was: a kernel replaced under the same name (as a mutant of a user's kernel is) runs from the next
    call on, never a replay of the old one, and an unregistered name is refused."""
    captured, replays, _ = replayable
    name = "v0_registered_by_this_test"
    x, w, out = P(16, 64), P(64, 64), P(16, 64)
    old = registry.register(dataclasses.replace(registry.get("v0"), name=name, public=False))
    try:
        assert registry.lookup(name) is old and name in registry.names(include_hidden=True)
        deepgemm.gemm(x, w.T, kernel=name, out=out)
        deepgemm.gemm(x, w.T, kernel=name, out=out)
        assert len(captured) == 1 and len(replays) == 1
        new = registry.register(dataclasses.replace(old, defines={"DG_BUILT_FOR_THIS_TEST": 1}))
        deepgemm.gemm(x, w.T, kernel=name, out=out)
        assert len(captured) == 2 and len(replays) == 1                 # the full path, the new build
        assert captured[1]["compiled"].key != captured[0]["compiled"].key and new is registry.get(name)
    finally:
        registry.unregister(name)
    assert registry.lookup(name) is None and name not in registry.names(include_hidden=True)
    with pytest.raises(ValueError, match=f"unknown kernel '{name}'"):
        deepgemm.gemm(x, w.T, kernel=name, out=out)


def test_each_cache_has_one_owner_and_a_description():
    names = [c.name for c in caches.registered()]
    assert len(names) == len(set(names))
    for c in caches.registered():
        assert c.owner.startswith("deepgemm.") and c.doc and callable(c.clear)
    assert set(caches.clear("device")) == {"device", "tables", "decisions", "plans"}    # and what derives from it
    assert set(caches.clear("kernels")) == {"kernels", "modules", "sass features", "plans"}


def test_default_grid_names_the_m_limit(captured):
    """Kernels without a grid hook get one block per tile (registry.tile_grid), whose row count
    must fit CUDA's grid.y."""
    with pytest.raises(ValueError, match=r"^a: M=524288 needs 65536 row tiles for kernel 'v0', over CUDA's "
                                         r"grid limit of 65535; split the call along M$"):
        deepgemm.gemm(F(8 * 65536, 8), F(8, 8), kernel="v0")
    assert captured == []


def test_config_values_are_plain_integers():
    import numpy as np
    from deepgemm import registry
    cfg = registry.get("v5").config_defines({"DG_BN": np.int64(128)})
    assert cfg["DG_BN"] == 128 and type(cfg["DG_BN"]) is int


def test_span_covers_every_element_whatever_the_strides():
    x = FakeDeviceArray((2, 3, 4), base_ptr=1000)                               # contiguous float16
    assert arrays.span(x) == (1000, 1000 + 24 * 2)
    bcast = FakeDeviceArray((5, 3, 4), strides=(0, 8, 2), base_ptr=1000)          # a broadcast batch
    assert arrays.span(bcast) == (1000, 1000 + 12 * 2)
    flipped = FakeDeviceArray((3, 4), strides=(-8, 2), base_ptr=1000 + 16)        # rows in reverse order
    assert arrays.span(flipped) == (1000, 1000 + 16 + 4 * 2)
    assert arrays.span(FakeDeviceArray((0, 4), base_ptr=1000)) == (1000, 1000)
    # empty, whatever the other dimensions' extents and strides (a batch of empty matrices)
    assert arrays.span(FakeDeviceArray((3, 0, 5), base_ptr=1000)) == (1000, 1000)
    assert arrays.span(FakeDeviceArray((3, 4, 0), strides=(-16, 4, 2), base_ptr=1000)) == (1000, 1000)


def test_a_multicast_v5_config_is_refused_for_a_grouped_problem_by_name(captured):
    """B shared by multicast has no grouped build: a ValueError naming DG_CLUSTER_M before any compile."""
    with pytest.raises(ValueError, match=r"^config: DG_CLUSTER_M=2 has no grouped build"):
        deepgemm.grouped_gemm(F(256, 64), F(2, 64, 256), sizes=F(2, dtype="int32"), kernel="v5", config={"DG_CLUSTER_M": 2})
    assert not captured


def test_a_multicast_v5_config_launches_whole_clusters_with_half_of_b_per_block(captured, monkeypatch):
    """DG_CLUSTER_M = 2: an even grid of at most one block per SM, no more clusters than tile pairs,
    and a column-major (K-major) B's tensor map boxes half the tile's 256 columns (each block of a
    pair loads half of the stage it shares); A's box is the whole tile's 128 rows."""
    from deepgemm import tma
    boxes = []
    monkeypatch.setattr(tma, "encode", lambda ptr, dtype, dims, box, stride: boxes.append(tuple(box)) or tma.NO_MAP)
    b = F(512, 256).T   # 256 x 512, column-major
    deepgemm.gemm(F(1024, 256), b, kernel="v5", config={"DG_CLUSTER_M": 2})
    (launch,) = captured
    assert launch["grid"] == (2 * (1024 // 256) * (512 // 256), 1, 1)
    assert boxes[:2] == [(64, 128), (64, 128)]   # A: 64 k x 128 rows; B: 64 k x 256 / 2 columns
    boxes.clear()
    captured.clear()
    deepgemm.gemm(F(1024, 256), b, kernel="v5", config={"DG_CLUSTER_M": 1})
    assert boxes[:2] == [(64, 128), (64, 256)] and captured[0]["grid"] == ((1024 // 128) * (512 // 256), 1, 1)
