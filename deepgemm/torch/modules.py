"""Drop-in layers computed by deepgemm.torch.linear: Linear for nn.Linear, Conv1D for transformers'
Conv1D. Same parameters and state_dict as the layers they replace, plus an optional activation
fused into the GEMM's epilogue."""
from __future__ import annotations

import torch
from torch import nn

from deepgemm.torch.op import check_activation, linear


class Linear(nn.Linear):
    """nn.Linear computed by deepgemm, with an optional activation fused into the GEMM's epilogue:
    ``act(x @ W^T + b)`` (+ an optional residual: ``forward(x, residual)``). Same parameters and
    state_dict as nn.Linear."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, *, activation=None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.activation = check_activation(activation)

    @classmethod
    def from_linear(cls, layer: nn.Linear, activation=None) -> "Linear":
        """A deepgemm Linear sharing `layer`'s parameters (no copy; tied weights stay tied)."""
        # Built on the meta device: its own parameters are replaced at once, so allocating and
        # initialising them would be wasted work (and memory, for a large layer).
        new = cls(layer.in_features, layer.out_features, bias=layer.bias is not None, device="meta",
                  activation=activation)
        new.weight = layer.weight
        if layer.bias is not None:
            new.bias = layer.bias
        new.train(layer.training)
        return new

    def forward(self, input, residual=None):
        return linear(input, self.weight, self.bias, self.activation, residual)

    def extra_repr(self):
        return super().extra_repr() + (f", activation={self.activation}" if self.activation else "")


class Conv1D(nn.Module):
    """transformers' Conv1D (GPT-2's projections: weight [in, out], ``x @ W + b``) computed by
    deepgemm, the weight read in place as a row-major K x N operand; optional fused activation.
    Same parameters and state_dict as transformers.pytorch_utils.Conv1D (nf = out, nx = in)."""

    def __init__(self, nf, nx, *, activation=None, device=None, dtype=None):
        super().__init__()
        self.nf, self.nx = nf, nx
        self.weight = nn.Parameter(torch.empty(nx, nf, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(nf, device=device, dtype=dtype))
        if self.weight.device.type != "meta":
            nn.init.normal_(self.weight, std=0.02)   # as transformers initialises it
        self.activation = check_activation(activation)

    @classmethod
    def from_conv1d(cls, layer, activation=None) -> "Conv1D":
        """A deepgemm Conv1D sharing `layer`'s parameters (no copy)."""
        new = cls(layer.nf, layer.nx, activation=activation, device="meta")   # meta: see from_linear
        new.weight, new.bias = layer.weight, layer.bias
        new.train(layer.training)
        return new

    def forward(self, x, residual=None):
        return linear(x, self.weight, self.bias, self.activation, residual, weight_layout="in_out")

    def extra_repr(self):
        return f"nf={self.nf}, nx={self.nx}" + (f", activation={self.activation}" if self.activation else "")


__all__ = ["Linear", "Conv1D"]
