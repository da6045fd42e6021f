"""CuPy / torch interop: zero-copy views, dtype names, layouts, the caller's stream.

Every GPU array is seen through a CuPy view (torch tensors through DLPack, which keeps bfloat16;
``__cuda_array_interface__`` turns torch bf16 into void, ../shared/gpu-notes.md). Results go back in
the caller's framework, allocated by that framework so its allocator and stream semantics hold.
"""
from __future__ import annotations

from dataclasses import dataclass

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
    """A zero-copy CuPy view of a CuPy array or torch CUDA tensor; a clear TypeError otherwise."""
    fw = framework_of(x)
    if fw == "cupy":
        return x
    if fw == "torch":
        import cupy
        return cupy.from_dlpack(x.detach())
    if fw == "host":
        raise TypeError(f"{name}: expected a GPU array (CuPy ndarray or torch CUDA tensor), "
                        f"got a host array ({type(x).__module__}.{type(x).__name__}); move it to the GPU first")
    raise TypeError(f"{name}: expected a CuPy ndarray or torch CUDA tensor, got {type(x).__name__}")


def dtype_name(arr) -> str:
    return str(arr.dtype)  # 'float16', 'bfloat16' (ml_dtypes), 'float32', ...


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
    """
    if arr.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D matrix, got {arr.ndim}-D with shape {tuple(arr.shape)}")
    rows, cols = (int(s) for s in arr.shape)
    item = arr.dtype.itemsize
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
    if ld < max(minimum, 1) and rows * cols > 0:
        raise ValueError(f"{name}: overlapping or negative strides {(s_row, s_col)} are not supported")
    return Matrix(int(arr.data.ptr), rows, cols, dtype_name(arr), row_major, int(max(ld, 1)), int(arr.device.id))


def stream_for(framework: str):
    """The caller's current stream as a CuPy stream object (torch's stream when torch tensors came in).

    Inside `with torch.cuda.stream(s)` CuPy's current stream is still the default one, so it must
    be taken from torch explicitly."""
    import cupy
    if framework == "torch":
        import torch
        return cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    return cupy.cuda.get_current_stream()


def empty(shape, dtype: str, framework: str, device: int):
    """A new output in the caller's framework, and its CuPy view."""
    import cupy
    if framework == "torch":
        import torch
        t = torch.empty(shape, dtype=getattr(torch, dtype), device=f"cuda:{device}")
        return t, cupy.from_dlpack(t)
    with cupy.cuda.Device(device):
        a = cupy.empty(shape, dtype=NUMPY_DTYPES[dtype])
    return a, a

