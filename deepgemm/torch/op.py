"""The op ``deepgemm::linear``: linear() (the public entry point), its registration as a torch
custom op with a fake implementation for torch.compile, the CUDA path that hands torch tensors
straight to deepgemm.gemm(), and reference_linear() (the same arithmetic with torch ops, which CPU
tensors get)."""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from deepgemm import api as _api
from deepgemm import registry as _registry
from deepgemm.registry import ACTIVATION_CODES, ACTIVATIONS

WEIGHT_LAYOUTS = ("out_in", "in_out")                    # nn.Linear's [out, in]; Conv1D's [in, out]
_INPUT_DTYPES = (torch.float16, torch.bfloat16)
_EPILOGUE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def linear(x, weight, bias=None, activation=None, residual=None, *, weight_layout="out_in"):
    """``act(x @ W^T + bias) + residual`` in one deepgemm launch (FP32 accumulation and epilogue,
    one rounding to x's dtype).

    x: [..., in] float16/bfloat16 CUDA tensor, any leading dimensions; flattened to [M, in] without
    a copy where its strides allow (a transposed 2-D x is read in place; a batch view that cannot
    be flattened is copied). weight: [out, in] as nn.Linear stores it (read in place as a
    column-major K x N operand, never copied), or [in, out] with ``weight_layout="in_out"``
    (transformers' Conv1D: ``x @ W``). bias: [out]; residual: [..., out] like the result
    (float16/bfloat16/float32 both); activation: None | "relu" | "gelu" (tanh approximation) |
    "gelu_erf" | "silu".
    ``residual`` is what deepgemm.gemm() calls ``c``, added with beta = 1 (the name here follows
    its role in a network; gemm's follows the BLAS formula D = ... + beta * C).
    Returns a new [..., out] tensor in x's dtype from torch's allocator, written on torch's current
    stream with no host synchronisation, so it can be captured in a CUDA graph (warm it up first:
    the first call of a shape may compile a kernel). Inside torch.compile it is the opaque op
    ``torch.ops.deepgemm.linear``. CPU tensors get the same arithmetic from torch ops, so swapped
    modules stay usable (and testable) on the CPU.
    """
    # The hot path of every eager layer call: module globals and plain calls only (no generator
    # expressions, no torch.device objects), since its host time adds to every small GEMM.
    weight_in_out = _check_layout(weight_layout)
    if torch.compiler.is_compiling():      # first, so torch.compile traces one branch only
        return _linear_op(x, weight, bias, residual, activation, weight_in_out)
    if _direct_call_ok(x, weight, bias, residual):
        return _linear_impl(x, weight, bias, residual, activation, weight_in_out)
    check_tensors(x, weight, bias, residual)   # before the dispatcher, which refuses with a RuntimeError
    return _linear_op(x, weight, bias, residual, activation, weight_in_out)


def check_tensors(x, weight, bias=None, residual=None) -> None:
    """TypeError naming the first of x, weight (torch tensors) and bias, residual (torch tensors or
    None) that is something else."""
    for name, t in (("x", x), ("weight", weight), ("bias", bias), ("residual", residual)):
        if not isinstance(t, torch.Tensor) and (t is not None or name in ("x", "weight")):
            kind = "a torch tensor" if name in ("x", "weight") else "a torch tensor or None"
            raise TypeError(f"{name}: expected {kind}, got {type(t).__name__}")


def check_activation(activation):
    """activation itself if deepgemm's epilogue computes it (None included), else ValueError."""
    return _registry.check_activation(activation)


def _check_layout(weight_layout) -> bool:
    if weight_layout not in WEIGHT_LAYOUTS:
        raise ValueError(f"weight_layout: must be one of {WEIGHT_LAYOUTS}, got {weight_layout!r}")
    return weight_layout == "in_out"


_PLAIN_TENSORS = (torch.Tensor, nn.Parameter)
_dispatch_stack_len = getattr(torch._C, "_len_torch_dispatch_stack", None)


def _direct_call_ok(*tensors) -> bool:
    """Whether eager code may skip the dispatcher: it costs 10-25 us a call (measured, CPU op),
    as much as a small GEMM. Not when autograd must see the op (so backward raises instead of
    silently losing gradients), nor under tracing modes or tensor subclasses (they must see it).
    Plain loops: this runs on every eager call (generator expressions cost microseconds here)."""
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is not None and (type(t) not in _PLAIN_TENSORS or (grad and t.requires_grad)):
            return False
    if torch._C._is_torch_function_mode_enabled():
        return False
    return _dispatch_stack_len is None or _dispatch_stack_len() == 0


def _check(x, weight, bias, residual, activation, weight_in_out) -> tuple[int, int]:
    """Argument checks in linear()'s names; returns (N, K). Runs on fake tensors too. Devices are
    compared by index (get_device(): -1 off CUDA), building torch.device objects only to report.
    The activation check is written out rather than calling check_activation(): one call less on
    every eager call."""
    if not isinstance(x, torch.Tensor) or not isinstance(weight, torch.Tensor):   # inline: every eager call
        check_tensors(x, weight)   # raises, naming it
    try:
        known = activation in ACTIVATION_CODES
    except TypeError:   # unhashable: no activation's name either
        known = False
    if not known:
        check_activation(activation)   # raises, naming it
    if x.dim() < 1:
        raise ValueError("x: expected at least 1 dimension (the input features)")
    if weight.dim() != 2:
        raise ValueError(f"weight: expected a 2-D matrix, got shape {tuple(weight.shape)}")
    k, n = (weight.shape[0], weight.shape[1]) if weight_in_out else (weight.shape[1], weight.shape[0])
    if x.shape[-1] != k:
        layout = "[in, out]" if weight_in_out else "[out, in]"
        raise ValueError(f"weight: x has {x.shape[-1]} input features, weight {tuple(weight.shape)} "
                         f"(layout {layout}) expects {k}")
    if x.dtype not in _INPUT_DTYPES and (not x.is_cpu or not x.dtype.is_floating_point):   # CPU: any float
        raise TypeError(f"x: dtype must be float16 or bfloat16 for deepgemm (any floating type on the CPU), "
                        f"got {x.dtype}; cast the module (e.g. model.half())")
    if weight.dtype != x.dtype:
        raise TypeError(f"weight: dtype {weight.dtype} differs from x's {x.dtype}")
    device = x.get_device()
    for t, name in ((bias, "bias"), (residual, "residual")):
        if t is None:
            continue
        if t.dtype not in _EPILOGUE_DTYPES and not x.is_cpu:
            raise TypeError(f"{name}: dtype must be float16, bfloat16 or float32, got {t.dtype}")
        if t.get_device() != device or t.is_cpu != x.is_cpu:
            raise ValueError(f"{name}: is on {t.device}, x on {x.device}")
    if weight.get_device() != device or weight.is_cpu != x.is_cpu:
        raise ValueError(f"weight: is on {weight.device}, x on {x.device}")
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"bias: expected shape ({n},) (one value per output feature), got {tuple(bias.shape)}")
    if residual is not None and tuple(residual.shape) != (*x.shape[:-1], n):
        raise ValueError(f"residual: expected the output's shape {(*x.shape[:-1], n)}, got {tuple(residual.shape)}")
    return n, k


def _linear_impl(x, weight, bias, residual, activation, weight_in_out):
    n, _ = _check(x, weight, bias, residual, activation, weight_in_out)
    if x.is_cuda:
        return _linear_cuda(x, weight, bias, residual, activation, weight_in_out, n)
    return reference_linear(x, weight, bias, activation, residual,
                            weight_layout="in_out" if weight_in_out else "out_in")


# Registered once, when deepgemm.torch is first imported (Python imports a module once).
@torch.library.custom_op("deepgemm::linear", mutates_args=())
def _linear_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
               residual: Optional[torch.Tensor], activation: Optional[str], weight_in_out: bool) -> torch.Tensor:
    return _linear_impl(x, weight, bias, residual, activation, weight_in_out)


@_linear_op.register_fake
def _linear_fake(x, weight, bias, residual, activation, weight_in_out):
    n, _ = _check(x, weight, bias, residual, activation, weight_in_out)
    return x.new_empty((*x.shape[:-1], n))   # contiguous, like the real output


def reference_linear(x, weight, bias=None, activation=None, residual=None, *, weight_layout="out_in"):
    """linear()'s arithmetic with torch ops: FP32 product and epilogue, one cast to x's dtype.
    What CPU tensors get, and a reference for tests."""
    w = weight if _check_layout(weight_layout) else weight.t()
    y = torch.matmul(x.float(), w.float())
    if bias is not None:
        y = y + bias.float()
    if activation is not None:
        y = _TORCH_ACTIVATIONS[activation](y)
    if residual is not None:
        y = y + residual.float()
    return y.to(x.dtype)


_TORCH_ACTIVATIONS = {
    "relu": torch.relu,
    "gelu": lambda y: torch.nn.functional.gelu(y, approximate="tanh"),
    "gelu_erf": torch.nn.functional.gelu,
    "silu": torch.nn.functional.silu,
}


# --- the CUDA path: torch tensors straight into deepgemm.gemm --------------------------------

def _linear_cuda(x, weight, bias, residual, activation, weight_in_out, n):
    flat = x.dim() == 2
    m = x.shape[0] if flat else math.prod(x.shape[:-1])
    out = x.new_empty((m, n))   # torch's allocator, x's dtype and device
    shaped = out if flat else out.view(*x.shape[:-1], n)
    if m == 0 or n == 0:
        return shaped
    x2 = _as_matrix(x if flat else x.reshape(m, x.shape[-1]))   # reshape: a view where possible
    w2 = _as_matrix(weight if weight_in_out else weight.t())   # K x N; .t() is a view
    r2 = None
    if residual is not None:
        r2 = residual.reshape(m, n)
        if (r2.stride(-1) != 1 and n > 1) or (r2.shape[0] > 1 and r2.stride(0) < n):
            r2 = r2.contiguous()   # gemm reads the residual row-major (any leading dimension >= N)
    b1 = bias.contiguous() if bias is not None else None   # a no-op for a parameter
    # torch tensors straight in: gemm launches on torch's current stream of x's device, takes any
    # scratch (staged operands) from torch's allocator (CUDA-graph safe), and replays a cached plan
    # for a repeated geometry without making CuPy views.
    _api.gemm(x2, w2, bias=b1, activation=activation, c=r2, out=out)
    return shaped


def _as_matrix(t):
    """t itself when one dimension has unit stride and the other a stride that does not overlap
    it (what gemm reads in place), else a row-major copy (broadcast/strided views)."""
    rows, cols = t.shape
    s_row, s_col = t.stride()
    if (s_col == 1 or cols == 1) and (s_row >= cols or rows == 1):
        return t
    if (s_row == 1 or rows == 1) and (s_col >= rows or cols == 1):
        return t
    return t.contiguous()


__all__ = ["linear", "reference_linear", "check_activation", "ACTIVATIONS", "WEIGHT_LAYOUTS"]
