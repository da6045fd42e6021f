"""The op ``deepgemm::grouped_linear``: one linear layer per group of rows (mixture-of-experts
experts) in one deepgemm launch, registered as a torch custom op (with a fake implementation for
torch.compile); CPU tensors get the same arithmetic from torch ops (reference_grouped_linear)."""
from __future__ import annotations

import itertools
from typing import Optional

import torch

from deepgemm import api as _api
from deepgemm import groups as _groups
from deepgemm.torch.op import _INPUT_DTYPES, _TORCH_ACTIVATIONS, _check_layout, check_activation, check_tensors


def grouped_linear(x, weight, *, sizes=None, offsets=None, bias=None, activation=None, weight_layout="out_in"):
    """``act(x[rows of g] @ W_g^T + bias_g)`` for every group g, in one launch.

    x: [M, in] float16/bfloat16 CUDA tensor, the groups' rows one after another (tokens sorted by
    expert). weight: [G, out, in] (nn.Linear's layout per expert, read in place) or [G, in, out]
    with ``weight_layout="in_out"``. Exactly one of sizes (G row counts) or offsets (G + 1 row
    offsets): an int32 CUDA tensor (never read on the host: CUDA-graph safe, values clamped by the
    kernel) or a host sequence / CPU tensor (checked: non-negative, in order, adding up to M).
    bias: [G, out] (one per expert) or [out]. Returns a new [M, out] tensor in x's dtype.
    """
    weight_in_out = _check_layout(weight_layout)
    check_activation(activation)
    check_tensors(x, weight, bias)   # before the dispatcher, which refuses with a RuntimeError
    if (sizes is None) == (offsets is None):
        raise ValueError("sizes, offsets: give exactly one (how x's rows split into groups)")
    rows = sizes if sizes is not None else offsets
    if not isinstance(rows, torch.Tensor):   # checked as grouped_gemm checks them (torch.tensor would truncate 1.5)
        rows = torch.from_numpy(_groups.host_rows(rows, "sizes" if sizes is not None else "offsets"))
    return _grouped_op(x, weight, rows, sizes is None, bias, activation, weight_in_out)


def _check(x, weight, bias, weight_in_out):
    if not isinstance(x, torch.Tensor) or not isinstance(weight, torch.Tensor):
        check_tensors(x, weight)   # raises, naming it
    if x.dim() != 2:
        raise ValueError(f"x: expected [M, in] (the groups' rows one after another), got shape {tuple(x.shape)}")
    if weight.dim() != 3:
        raise ValueError(f"weight: expected one matrix per group, [G, out, in] or [G, in, out], got shape "
                         f"{tuple(weight.shape)}")
    k, n = (weight.shape[1], weight.shape[2]) if weight_in_out else (weight.shape[2], weight.shape[1])
    if x.shape[1] != k:
        raise ValueError(f"weight: x has {x.shape[1]} input features, weight {tuple(weight.shape)} expects {k}")
    # In this op's names (grouped_gemm would name them a and b), as linear() checks them.
    if x.dtype not in _INPUT_DTYPES and (not x.is_cpu or not x.dtype.is_floating_point):   # CPU: any float
        raise TypeError(f"x: dtype must be float16 or bfloat16 for deepgemm (any floating type on the CPU), "
                        f"got {x.dtype}")
    if weight.dtype != x.dtype:
        raise TypeError(f"weight: dtype {weight.dtype} differs from x's {x.dtype}")
    for t, name in ((weight, "weight"), (bias, "bias")):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name}: is on {t.device}, x on {x.device}")
    if bias is not None and tuple(bias.shape) not in ((n,), (weight.shape[0], n)):
        raise ValueError(f"bias: expected ({n},) or ({weight.shape[0]}, {n}), got {tuple(bias.shape)}")
    return n


@torch.library.custom_op("deepgemm::grouped_linear", mutates_args=())
def _grouped_op(x: torch.Tensor, weight: torch.Tensor, rows: torch.Tensor, rows_are_offsets: bool,
                bias: Optional[torch.Tensor], activation: Optional[str], weight_in_out: bool) -> torch.Tensor:
    _check(x, weight, bias, weight_in_out)
    if not x.is_cuda:
        return reference_grouped_linear(x, weight, rows, rows_are_offsets, bias, activation, weight_in_out)
    return _grouped_cuda(x, weight, rows, rows_are_offsets, bias, activation, weight_in_out)


def _grouped_cuda(x, weight, rows, rows_are_offsets, bias, activation, weight_in_out):
    """The op on CUDA tensors: one grouped_gemm over views (weight as [G, K, N], never copied);
    rows on the device stay there (never read on the host), host rows go as a list."""
    w = weight if weight_in_out else weight.transpose(1, 2)   # [G, K, N]: a view
    kind = "offsets" if rows_are_offsets else "sizes"
    value = rows if rows.is_cuda else rows.tolist()
    return _api.grouped_gemm(x, w, **{kind: value}, bias=bias, activation=activation)


@_grouped_op.register_fake
def _grouped_fake(x, weight, rows, rows_are_offsets, bias, activation, weight_in_out):
    return x.new_empty((x.shape[0], _check(x, weight, bias, weight_in_out)))


def reference_grouped_linear(x, weight, rows, rows_are_offsets=False, bias=None, activation=None,
                             weight_in_out=False):
    """grouped_linear's arithmetic with torch ops, group by group (FP32, one cast to x's dtype).
    The row split is checked as gemm's host path checks it (deepgemm.groups): sizes that do not
    add up to M, or offsets out of order, would leave rows of the result unwritten."""
    mode = "offsets" if rows_are_offsets else "sizes"
    host = _groups.host_rows(rows.cpu() if isinstance(rows, torch.Tensor) else rows, mode)
    _groups.check_rows(mode, host, weight.shape[0], x.shape[0])
    rows = host.tolist()
    offsets = rows if rows_are_offsets else [0, *itertools.accumulate(rows)]
    out = x.new_empty((x.shape[0], weight.shape[2] if weight_in_out else weight.shape[1]))
    for g in range(weight.shape[0]):
        lo, hi = offsets[g], offsets[g + 1]
        w = weight[g] if weight_in_out else weight[g].t()
        y = x[lo:hi].float() @ w.float()
        if bias is not None:
            y = y + (bias[g] if bias.dim() == 2 else bias).float()
        if activation is not None:
            y = _TORCH_ACTIVATIONS[activation](y)
        out[lo:hi] = y.to(x.dtype)
    return out


__all__ = ["grouped_linear", "reference_grouped_linear"]
