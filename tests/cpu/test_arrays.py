"""How deepgemm.arrays describes a 2-D operand to the kernels (deepgemm.arrays.matrix): a pointer,
row- or column-major, and a leading dimension. The description must address every element where
the array's own strides put it, whatever view the caller passes; layouts no description fits are
refused by name."""
import numpy as np
import pytest

from deepgemm import arrays
from fake_gpu import FakeDeviceArray


def describe(shape, strides, dtype="float16", **kw):
    return arrays.matrix(FakeDeviceArray(shape, dtype, strides=strides, **kw), "a")


def addresses_agree(m, arr):
    """Element (i, j) at ptr + (i * ld + j) (row-major) or ptr + (j * ld + i) elements, as the array
    puts it at ptr + i * strides[0] + j * strides[1] bytes."""
    item = arr.dtype.itemsize
    for i in range(arr.shape[0]):
        for j in range(arr.shape[1]):
            offset = (i * m.ld + j) if m.row_major else (j * m.ld + i)
            if m.ptr + offset * item != arr.data.ptr + i * arr.strides[0] + j * arr.strides[1]:
                return False
    return True


@pytest.mark.parametrize("shape, strides, row_major, ld", [
    ((4, 5), (10, 2), True, 5),            # C order
    ((4, 3), (10, 2), True, 5),            # x[:, :3]: a sliced view keeps its pitch
    ((5, 4), (2, 10), False, 5),           # w.T
    ((3, 4), (2, 12), False, 6),           # w.T of a sliced view
    ((1, 5), (1000, 2), True, 5),          # one row: its pitch is never used
    ((1, 5), (2, 20), False, 10),          # one row with strided columns: column-major, pitch 10
    ((5, 1), (20, 2), True, 10),           # one column of a wider matrix
    ((5, 1), (2, 40), True, 1),            # one column, contiguous down the rows
    ((1, 1), (6, 14), True, 1),            # one element: any strides
])
def test_layout_and_leading_dimension(shape, strides, row_major, ld):
    arr = FakeDeviceArray(shape, strides=strides, base_ptr=1 << 20)
    m = arrays.matrix(arr, "a")
    assert (m.row_major, m.ld, m.rows, m.cols, m.ptr) == (row_major, ld, shape[0], shape[1], 1 << 20)
    assert addresses_agree(m, arr)


def test_every_valid_view_is_described_at_its_own_addresses():
    rng = np.random.default_rng(0)
    for _ in range(400):
        rows, cols = (int(rng.choice([1, 2, 3, int(rng.integers(1, 9))])) for _ in range(2))
        row_major = bool(rng.integers(2))
        pad = int(rng.integers(0, 4))
        inner = cols if row_major else rows
        pitch = inner + pad
        s = (pitch * 2, 2) if row_major else (2, pitch * 2)
        if rows == 1 and rng.integers(2):
            s = (int(rng.integers(-50, 50)) * 2, s[1])     # a single row's pitch is arbitrary
        if cols == 1 and rng.integers(2):
            s = (s[0], int(rng.integers(-50, 50)) * 2)
        arr = FakeDeviceArray((rows, cols), strides=s, offset=int(rng.integers(0, 8)))
        m = arrays.matrix(arr, "a")
        assert m.ld >= max(m.cols if m.row_major else m.rows, 1)
        assert addresses_agree(m, arr), (rows, cols, s, m)


@pytest.mark.parametrize("shape, strides, pattern", [
    ((4, 5), (10, 3), r"^a: strides \(10, 3\) are not multiples of the element size 2"),
    ((4, 5), (11, 2), r"^a: strides \(11, 2\) are not multiples"),
    ((4, 5), (4, 2), r"^a: overlapping or negative strides \(2, 1\)"),         # rows overlap
    ((5, 4), (2, 4), r"^a: overlapping or negative strides \(1, 2\)"),         # columns overlap
    ((4, 5), (-10, 2), r"^a: overlapping or negative strides \(-5, 1\)"),      # x[::-1]
    ((4, 5), (0, 2), r"^a: overlapping or negative strides \(0, 1\)"),         # a broadcast row
    ((4, 5), (20, 4), r"^a: needs one unit-stride dimension"),
])
def test_layouts_no_description_fits_are_refused_by_name(shape, strides, pattern):
    with pytest.raises(ValueError, match=pattern):
        describe(shape, strides)


def test_an_address_off_the_element_size_is_refused_by_name():
    """CuPy can view raw memory at any byte: the kernels' element loads there would be misaligned
    accesses, which end the CUDA context. An empty matrix has no element to load."""
    with pytest.raises(ValueError, match=r"^a: its address 0x100003 is not a multiple of its element size \(4 bytes\)"):
        describe((4, 5), None, dtype="float32", base_ptr=(1 << 20) + 3)
    assert describe((0, 5), None, dtype="float32", base_ptr=(1 << 20) + 3).rows == 0


def test_dtype_device_and_dimensions_pass_through():
    m = describe((3, 8), None, dtype="bfloat16", device=2)
    assert (m.dtype, m.device, m.rows, m.cols, m.ld, m.row_major) == ("bfloat16", 2, 3, 8, 8, True)
    with pytest.raises(ValueError, match=r"^a: expected a 2-D matrix, got 3-D with shape \(2, 3, 8\)"):
        describe((2, 3, 8), None)


def test_framework_of_tells_device_arrays_from_host_ones():
    assert arrays.framework_of(np.zeros(2)) == "host"
    assert arrays.framework_of([1, 2]) is None
    fake_cupy = type("ndarray", (), {"__module__": "cupy._core.core"})()
    assert arrays.framework_of(fake_cupy) == "cupy"
    cpu = type("Tensor", (), {"__module__": "torch", "is_cuda": False})()
    gpu = type("Tensor", (), {"__module__": "torch", "is_cuda": True})()
    assert (arrays.framework_of(cpu), arrays.framework_of(gpu)) == ("host", "torch")
    with pytest.raises(TypeError, match=r"^b: expected a GPU array .*got a host array \(numpy.ndarray\)"):
        arrays.as_cupy(np.zeros(2), "b")
    with pytest.raises(TypeError, match=r"^b: expected a CuPy ndarray or torch CUDA tensor, got list"):
        arrays.as_cupy([1, 2], "b")


def _cuda_tensor(torch, **attributes):
    """What arrays.as_cupy reads of a CUDA tensor, on the CPU."""
    return type("Tensor", (), {"__module__": "torch", "is_cuda": True, "layout": torch.strided,
                               "requires_grad": False} | attributes)()


def test_a_cuda_tensor_is_seen_through_its_cupy_view(monkeypatch):
    torch = pytest.importorskip("torch")
    gpu = _cuda_tensor(torch)
    view = object()
    monkeypatch.setattr(arrays, "torch_view", lambda t: view if t is gpu else None)
    assert arrays.as_cupy(gpu, "a") is view

    def unsupported(t):
        raise TypeError("dtype must be one of float16, bfloat16, float32, got torch.int8")
    monkeypatch.setattr(arrays, "torch_view", unsupported)
    with pytest.raises(TypeError, match=r"^bias: dtype must be one of .*torch\.int8"):   # named by argument
        arrays.as_cupy(gpu, "bias")


def test_a_tensor_autograd_tracks_or_without_strided_memory_is_refused_by_name(monkeypatch):
    """deepgemm has no backward: a result from a tensor that requires grad would silently carry no
    gradient (and an out written in place would bypass autograd), so such tensors are refused
    while grad mode is on, as torch's out= variants refuse them; a sparse tensor has no strided
    memory to read."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(arrays, "torch_view", lambda t: "view")
    tracked = _cuda_tensor(torch, requires_grad=True)
    with pytest.raises(ValueError, match=r"^b: requires grad, but deepgemm has no backward .* b\.detach\(\)"):
        arrays.as_cupy(tracked, "b")
    with torch.no_grad():
        assert arrays.as_cupy(tracked, "b") == "view"
    with torch.inference_mode():
        assert arrays.as_cupy(tracked, "b") == "view"
    with pytest.raises(TypeError, match=r"^a: expected a dense \(strided\) tensor, got layout torch.sparse_coo"):
        arrays.as_cupy(_cuda_tensor(torch, layout=torch.sparse_coo), "a")


def test_a_tensor_of_any_numpy_dtype_is_viewed_as_it_is(monkeypatch):
    """So that each argument's own check names what it takes ("sizes: ... must be int32, got
    int64", "a: dtype must be one of ('float16', 'bfloat16'), got float64"), not a generic list."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(arrays, "_cupy_array", lambda ptr, nbytes, shape, dtype, strides, device: dtype)
    monkeypatch.setattr(arrays, "_views", {})
    for dtype in (torch.int64, torch.float64, torch.bool, torch.uint8, torch.complex64):
        assert arrays.torch_view(torch.zeros(2, dtype=dtype)) == np.dtype(str(dtype).removeprefix("torch."))
    with pytest.raises(TypeError, match=r"^dtype must be one of float16, bfloat16, float32 .*got torch.float8_e4m3fn"):
        arrays.torch_view(torch.zeros(2).to(torch.float8_e4m3fn))


def test_the_cupy_stream_is_the_arrays_devices(monkeypatch):
    """CuPy keeps a current stream per device: a call on device 1's arrays launches on device 1's
    current stream, whichever device is current (what a replayed call does too)."""
    import sys
    import types
    current = [0]

    class Device:
        def __init__(self, dev):
            self.dev = dev

        def __enter__(self):
            self.previous, current[0] = current[0], self.dev

        def __exit__(self, *exc):
            current[0] = self.previous
    cuda = types.SimpleNamespace(Device=Device, runtime=types.SimpleNamespace(getDevice=lambda: current[0]),
                                 get_current_stream=lambda: f"stream of device {current[0]}")
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    assert arrays.stream_for("cupy", 1) == "stream of device 1" and current == [0]
    assert arrays.stream_for("cupy", 0) == "stream of device 0"


def test_a_torch_view_covers_exactly_the_tensors_elements_and_is_reused(monkeypatch):
    """torch_view hands CuPy the memory from the tensor's first element to its last (no more: a
    view past the allocation would let a read there go unnoticed), in the matching NumPy dtype, and
    one view serves every call with the same address and geometry."""
    torch = pytest.importorskip("torch")
    import ml_dtypes
    made = []

    def cupy_array(ptr, nbytes, shape, dtype, strides, device):
        made.append(dict(ptr=ptr, nbytes=nbytes, shape=shape, dtype=dtype, strides=strides, device=device))
        return len(made)
    monkeypatch.setattr(arrays, "_cupy_array", cupy_array)
    monkeypatch.setattr(arrays, "_views", {})
    base = torch.zeros(64, dtype=torch.float16)
    t = base.as_strided((3, 4), (8, 2), 5)                 # rows 8 apart, every other element
    assert arrays.torch_view(t) == 1 and arrays.torch_view(t) == 1 and len(made) == 1
    assert made[0] == dict(ptr=t.data_ptr(), nbytes=(2 * 8 + 3 * 2 + 1) * 2, shape=(3, 4), dtype=np.dtype(np.float16),
                           strides=(16, 4), device=0)
    assert arrays.torch_view(t.t()) == 2 and made[1]["strides"] == (4, 16)   # another geometry, another view
    arrays.torch_view(torch.zeros((2, 5), dtype=torch.bfloat16))
    arrays.torch_view(torch.zeros(7, dtype=torch.int32))
    arrays.torch_view(torch.zeros((0, 4), dtype=torch.float32))
    assert [m["dtype"] for m in made[2:]] == [np.dtype(ml_dtypes.bfloat16), np.dtype(np.int32), np.dtype(np.float32)]
    assert [m["nbytes"] for m in made[2:]] == [20, 28, 0]
    assert arrays.torch_view(None) is None


def test_the_torch_view_cache_holds_1024_views_then_starts_again(monkeypatch):
    """A long-running process that meets ever new tensors must not keep a view of each forever."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(arrays, "_cupy_array", lambda *args: object())
    monkeypatch.setattr(arrays, "_views", {})
    base = torch.zeros(2048, dtype=torch.float16)
    views = [arrays.torch_view(base[i:i + 1]) for i in range(1024)]
    assert len(arrays._views) == 1024 and arrays.torch_view(base[0:1]) is views[0]   # all held, and hit
    arrays.torch_view(base[1024:1025])
    assert len(arrays._views) == 1


def test_an_empty_matrix_spans_no_bytes_whatever_its_leading_dimension():
    for m in (arrays.Matrix(1 << 20, 0, 5, "float16", True, 8, 0), arrays.Matrix(1 << 20, 5, 0, "float16", False, 8, 0)):
        assert arrays.extent(m) == (1 << 20, 1 << 20)
    assert arrays.extent(arrays.Matrix(1 << 20, 3, 5, "float16", True, 8, 0)) == (1 << 20, (1 << 20) + (2 * 8 + 5) * 2)


def test_a_torch_call_allocates_through_torch_once_per_device(monkeypatch):
    """Staged operands and workspace of a torch call come from torch's caching allocator (inside a
    CUDA-graph capture, CuPy's own pool would cudaMalloc): one allocator per device, built once; a
    zero-byte request still gets a real block; a CuPy call keeps CuPy's allocator."""
    torch = pytest.importorskip("torch")
    import sys
    import types
    used, requested = [], []

    class UnownedMemory:
        def __init__(self, ptr, size, owner, device):
            self.ptr, self.size, self.owner, self.device = ptr, size, owner, device

    def using_allocator(alloc):
        used.append(alloc)
        return "context"
    cuda = types.SimpleNamespace(using_allocator=using_allocator, UnownedMemory=UnownedMemory,
                                 MemoryPointer=lambda mem, offset: (mem, offset))
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(arrays, "_torch_allocators", {})
    real_empty = torch.empty

    def empty(n, dtype, device):
        requested.append((n, dtype, device))
        return real_empty(n, dtype=dtype)             # a host tensor stands in for the device's
    monkeypatch.setattr(torch, "empty", empty)
    assert arrays.allocations_for("cupy", 0) is not None and used == []
    assert arrays.allocations_for("torch", 3) == "context" and arrays.allocations_for("torch", 3) == "context"
    assert arrays.allocations_for("torch", 1) == "context"
    assert len(used) == 3 and used[0] is used[1] and used[0] is not used[2] and callable(used[0])
    mem, offset = used[0](1000)
    assert offset == 0 and requested == [(1000, torch.uint8, torch.device("cuda", 3))]
    assert mem.size == 1000 and mem.device == 3 and mem.ptr == mem.owner.data_ptr() and mem.owner.numel() == 1000
    mem, _ = used[2](0)
    assert requested[-1] == (1, torch.uint8, torch.device("cuda", 1)) and mem.size == 0


def test_a_torch_stream_is_wrapped_once_per_handle_and_device(monkeypatch):
    """A torch call launches on torch's current stream, wrapped for CuPy once per (handle, device)
    (a wrapper costs microseconds); destroyed streams' handles get reused, so past 64 the wrappers
    are dropped and made anew."""
    torch = pytest.importorskip("torch")
    import sys
    import types
    made, handle = [], [0x100]

    def external(h, dev):
        made.append((h, dev))
        return f"wrapper {len(made)}"
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=types.SimpleNamespace(ExternalStream=external)))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda dev: types.SimpleNamespace(cuda_stream=handle[0] + dev))
    monkeypatch.setattr(arrays, "_external_streams", {})
    assert arrays.stream_for("torch", 0) == "wrapper 1" and arrays.stream_for("torch", 0) == "wrapper 1"
    assert arrays.stream_for("torch", 2) == "wrapper 2" and made == [(0x100, 0), (0x102, 2)]
    for h in range(0x200, 0x200 + 63):
        handle[0] = h
        arrays.stream_for("torch", 0)
    assert len(arrays._external_streams) == 65
    handle[0] = 0x100
    assert arrays.stream_for("torch", 2) == "wrapper 2"          # a known handle is reused, no clearing
    handle[0] = 0x300
    assert arrays.stream_for("torch", 0) == "wrapper 66" and len(arrays._external_streams) == 1
