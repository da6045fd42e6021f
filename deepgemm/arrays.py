"""CuPy / torch interop: zero-copy views, dtype names, layouts, the caller's stream.

Every GPU array is seen through a CuPy view: torch tensors through a cached CuPy array over their
memory (torch_view: no DLPack export, whose stream handshake costs tens of microseconds and is
illegal during CUDA-graph capture; ``__cuda_array_interface__`` would turn bf16 into void). Kernels
run on torch's current stream, which orders them after the caller's work. Results go back in the
caller's framework, allocated by that framework so its allocator and stream semantics hold.

The interop caches here (torch views, stream wrappers, allocators, dtype names) are registered
with deepgemm.caches as "torch views" and "interop".
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import numpy as np

from deepgemm import caches
from deepgemm.reference import NUMPY_DTYPES


def framework_of(x) -> str | None:
    """'cupy', 'torch', 'host' (NumPy or a CPU tensor) or None for anything else."""
    mod = type(x).__module__
    if mod.startswith("cupy"):
        return "cupy"
    if mod.startswith("torch"):
        return "torch" if getattr(x, "is_cuda", False) else "host"
    if mod.startswith("numpy"):
        return "host"
    return None


def as_cupy(x, name: str):
    """A zero-copy CuPy view of a CuPy array or torch CUDA tensor; a clear TypeError otherwise (a
    ValueError for a tensor autograd tracks, see _check_tensor)."""
    fw = framework_of(x)
    if fw == "cupy":
        return x
    if fw == "torch":
        _check_tensor(x, name)
        try:
            return torch_view(x)
        except TypeError as exc:
            raise TypeError(f"{name}: {exc}") from None
    if fw == "host":
        raise TypeError(f"{name}: expected a GPU array (CuPy ndarray or torch CUDA tensor), "
                        f"got a host array ({type(x).__module__}.{type(x).__name__}); move it to the GPU first")
    raise TypeError(f"{name}: expected a CuPy ndarray or torch CUDA tensor, got {type(x).__name__}")


def _check_tensor(t, name: str) -> None:
    """What a CUDA tensor must be beyond its device: dense (a sparse one has no strided memory to
    read), and outside autograd, which sees nothing deepgemm writes: a result computed from a
    tensor that requires grad would silently carry no gradient, and an `out` written in place would
    bypass autograd's checks (torch's out= variants refuse both)."""
    import torch
    if t.layout is not torch.strided:
        raise TypeError(f"{name}: expected a dense (strided) tensor, got layout {t.layout}")
    if t.requires_grad and torch.is_grad_enabled():
        raise ValueError(f"{name}: requires grad, but deepgemm has no backward (the result would carry no "
                         f"gradient); call it under torch.no_grad() or torch.inference_mode(), or pass "
                         f"{name}.detach()")


_DTYPE_NAMES: dict = {}


def dtype_name(arr) -> str:
    """'float16', 'bfloat16' (ml_dtypes), 'float32', ... (memoised: str(dtype) costs ~10 us)."""
    dt = arr.dtype
    name = _DTYPE_NAMES.get(dt)
    if name is None:
        name = _DTYPE_NAMES[dt] = str(dt)
    return name


@dataclass(frozen=True)
class Matrix:
    """A 2-D operand as the kernels see it: base pointer, layout, leading dimension (elements)."""
    ptr: int
    rows: int
    cols: int
    dtype: str
    row_major: bool
    ld: int
    device: int


def matrix(arr, name: str) -> Matrix:
    """Describe a 2-D CuPy array as (pointer, layout, leading dimension) without copying.

    Row-major means the column index has unit stride; column-major, the row index. A dimension of
    size 1 has no meaningful stride, so any layout works there; we pick the one with a tidy ld.
    An empty matrix (a dimension of 0) has no element to address: whatever its strides (frameworks
    give such arrays 0, odd or arbitrary ones), it is described as row-major with ld = max(cols, 1).
    """
    if arr.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D matrix, got {arr.ndim}-D with shape {tuple(arr.shape)}")
    rows, cols = (int(s) for s in arr.shape)
    if rows == 0 or cols == 0:
        return Matrix(int(arr.data.ptr), rows, cols, dtype_name(arr), True, max(cols, 1), int(arr.device.id))
    item = arr.dtype.itemsize
    check_aligned(arr, name)
    s_row, s_col = arr.strides
    if s_row % item or s_col % item:
        raise ValueError(f"{name}: strides {arr.strides} are not multiples of the element size {item}")
    s_row, s_col = s_row // item, s_col // item
    if s_col == 1 or cols == 1:
        row_major, ld = True, (s_row if rows > 1 else cols)
    elif s_row == 1 or rows == 1:
        row_major, ld = False, (s_col if cols > 1 else rows)
    else:
        raise ValueError(f"{name}: needs one unit-stride dimension (row- or column-major, possibly a "
                         f"sliced view); got element strides {(s_row, s_col)} for shape {(rows, cols)}. "
                         f"Pass {name}.copy() instead")
    minimum = cols if row_major else rows
    if ld < max(minimum, 1):
        raise ValueError(f"{name}: overlapping or negative strides {(s_row, s_col)} are not supported")
    return Matrix(int(arr.data.ptr), rows, cols, dtype_name(arr), row_major, int(max(ld, 1)), int(arr.device.id))


def check_aligned(arr, name: str) -> None:
    """A ValueError unless arr's address is a multiple of its element size: the kernels load whole
    elements, and one at an odd address is a misaligned access, which ends the CUDA context (CuPy
    can make such views over raw memory; torch cannot)."""
    if arr.data.ptr % arr.dtype.itemsize:
        raise ValueError(f"{name}: its address 0x{arr.data.ptr:x} is not a multiple of its element size "
                         f"({arr.dtype.itemsize} bytes); pass an aligned copy")


def extent(m: Matrix) -> tuple[int, int]:
    """The bytes [start, end) that hold a matrix's elements (start == end when it is empty)."""
    if m.rows == 0 or m.cols == 0:
        return m.ptr, m.ptr
    outer, inner = (m.rows, m.cols) if m.row_major else (m.cols, m.rows)
    return m.ptr, m.ptr + ((outer - 1) * m.ld + inner) * np.dtype(NUMPY_DTYPES[m.dtype]).itemsize


def span(arr) -> tuple[int, int]:
    """The bytes [start, end) that hold an array's elements, any number of dimensions, any strides
    (a broadcast dimension's 0 included); start == end when it is empty."""
    start = int(arr.data.ptr)
    if 0 in arr.shape:
        return start, start
    low = sum((n - 1) * s for n, s in zip(arr.shape, arr.strides) if s < 0)
    high = sum((n - 1) * s for n, s in zip(arr.shape, arr.strides) if s > 0)
    return start + low, start + high + arr.dtype.itemsize


def stream_for(framework: str, device: int = 0):
    """The caller's current stream on `device` as a CuPy stream object (torch's stream when torch
    tensors came in).

    Inside `with torch.cuda.stream(s)` CuPy's current stream is still the default one, so it must
    be taken from torch explicitly."""
    import cupy
    if framework == "torch":
        import torch
        handle = torch.cuda.current_stream(device).cuda_stream
        stream = _external_streams.get((handle, device))
        if stream is None:   # one wrapper per torch stream handle (creating one costs microseconds)
            if len(_external_streams) > 64:   # handles of destroyed streams get reused: stay small
                _external_streams.clear()
            stream = _external_streams[(handle, device)] = cupy.cuda.ExternalStream(handle, device)
        return stream
    if cupy.cuda.runtime.getDevice() == device:
        return cupy.cuda.get_current_stream()
    with cupy.cuda.Device(device):   # CuPy's current stream is per device: `device`'s, not the current one's
        return cupy.cuda.get_current_stream()


def capturing(framework: str, device: int = 0) -> bool:
    """Whether the caller's current stream on `device` is capturing a CUDA graph (where a copy from
    host memory is refused by CUDA, and would be replayed from memory freed by then)."""
    return bool(stream_for(framework, device).is_capturing())


def stream_handle(framework: str, device: int) -> int:
    """The caller's current stream on `device` as a raw handle (cudaStream_t), after a first call
    through stream_for (which initialised torch's CUDA state). For CuPy arrays, call it with
    `device` current (CuPy's current stream is per device)."""
    return stream_getter(framework, device)()


def stream_getter(framework: str, device: int):
    """A function of no arguments giving stream_handle(framework, device), with the framework's
    lookups resolved once (api's replayed launches call it on every repeat call)."""
    if framework == "torch":
        raw = _torch_raw_stream()
        return functools.partial(raw, device)
    import cupy
    current = cupy.cuda.get_current_stream
    return lambda: current().ptr


@functools.lru_cache(maxsize=1)
def _torch_raw_stream():
    """torch's current stream on a device as a raw handle, without building a torch.cuda.Stream
    (the private binding inductor's generated code uses; current_stream() costs microseconds)."""
    import torch
    return getattr(torch._C, "_cuda_getCurrentRawStream", None) or (lambda d: torch.cuda.current_stream(d).cuda_stream)


def allocations_for(framework: str, device: int):
    """A context in which CuPy allocations made for a call (staged operands, workspace) come from
    the caller's allocator: for torch, its caching allocator on the current stream, so that inside
    CUDA-graph capture they come from the graph's private pool (CuPy's own pool would cudaMalloc
    during capture, an error, and later hand a block the graph still uses to other work)."""
    if framework != "torch":
        return contextlib.nullcontext()
    import cupy
    alloc = _torch_allocators.get(device)
    if alloc is None:
        import torch
        where = torch.device("cuda", device)

        def alloc(nbytes):
            t = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=where)   # 512-byte aligned
            return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(t.data_ptr(), nbytes, t, device), 0)
        _torch_allocators[device] = alloc
    return cupy.cuda.using_allocator(alloc)


_torch_allocators: dict = {}
_external_streams: dict = {}


def empty(shape, dtype: str, framework: str, device: int):
    """A new output in the caller's framework, and its CuPy view."""
    import cupy
    if framework == "torch":
        import torch
        t = torch.empty(shape, dtype=getattr(torch, dtype), device=f"cuda:{device}")
        return t, torch_view(t)
    with cupy.cuda.Device(device):
        a = cupy.empty(shape, dtype=NUMPY_DTYPES[dtype])
    return a, a


def _numpy_dtype(dtype):
    """The NumPy dtype CuPy uses for a torch dtype (bfloat16: ml_dtypes'). Every dtype NumPy has
    too is viewed as it is, so that the argument's own check says what it takes (group sizes:
    int32; a: float16 or bfloat16) rather than a generic list."""
    text = str(dtype).removeprefix("torch.")
    if text == "bfloat16":
        return NUMPY_DTYPES[text]
    if text not in _VIEWABLE:   # float8_*, complex32, ...: no CuPy dtype to view them as
        raise TypeError(f"dtype must be one of float16, bfloat16, float32 (int32 for group sizes), got {dtype}")
    return np.dtype(text)


_VIEWABLE = ("float16", "float32", "float64", "complex64", "complex128", "bool", "uint8", "int8", "int16", "int32",
             "int64")

_views: dict = {}


def torch_view(t):
    """A CuPy array over t's memory (no copy, no DLPack: exporting through DLPack makes torch record
    an event on the current stream and make CuPy's stream wait for it, which is illegal on the
    legacy default stream during CUDA-graph capture; it also costs more per call).

    Views own nothing (the caller's tensor is alive for the whole call), so one is reused for any
    tensor with the same address and geometry: weights and, with torch's caching allocator, most
    activations hit, which saves ~10 us of Python per operand."""
    if t is None:
        return None
    key = (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t.device.index)
    view = _views.get(key)
    if view is None:
        item = t.element_size()
        span = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride())) if t.numel() else 0
        view = _cupy_array(key[0], span * item, key[1], _numpy_dtype(t.dtype),
                           tuple(s * item for s in key[2]), t.device.index or 0)
        if len(_views) >= 1024:
            _views.clear()
        _views[key] = view
    return view


def _cupy_array(ptr, nbytes, shape, dtype, strides, device):
    """A CuPy array over device memory it does not own."""
    import cupy
    mem = cupy.cuda.UnownedMemory(ptr, nbytes, None, device)
    return cupy.ndarray(shape, dtype, cupy.cuda.MemoryPointer(mem, 0), strides=strides)


def _clear_views() -> None:
    _views.clear()


def _clear_interop() -> None:
    _external_streams.clear()
    _torch_allocators.clear()
    _DTYPE_NAMES.clear()
    _torch_raw_stream.cache_clear()


caches.register("torch views", __name__, "CuPy views of torch tensors' memory, by address and geometry",
                _clear_views)
caches.register("interop", __name__, "CuPy wrappers of torch streams, torch-backed allocators, dtype names",
                _clear_interop)
