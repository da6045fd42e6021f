"""PyTorch integration: deepgemm's fused GEMM as the op ``deepgemm::linear``, drop-in modules for
nn.Linear and transformers' Conv1D, and ``swap_linears()``, which puts them into an existing model
and folds a following activation into the GEMM's epilogue where the model's structure shows that
this keeps its outputs.

    import deepgemm.torch as dgt
    y = dgt.linear(x, layer.weight, layer.bias, activation="gelu")   # act(x @ W^T + b), one launch
    report = dgt.swap_linears(model)                                  # in place; what changed, and why not
    y = dgt.grouped_linear(tokens, experts_w, sizes=counts)           # one linear per expert, one launch
    print(report)

Modules: op (linear(), the registered op, reference_linear()), grouped (grouped_linear(), the op
``deepgemm::grouped_linear``), modules (Linear, Conv1D), surgery
(swap_linears() and the activation folding). Importing this package registers the op, once.

This package imports torch; ``import deepgemm`` never does. Inference only: the op has no autograd
formula, so a backward pass through it raises.
"""
# Absolute imports throughout: inside this package, `import torch` must reach PyTorch itself.
from deepgemm.torch.grouped import grouped_linear, reference_grouped_linear
from deepgemm.torch.modules import Conv1D, Linear
from deepgemm.torch.op import ACTIVATIONS, WEIGHT_LAYOUTS, linear, reference_linear
from deepgemm.torch.surgery import Swap, SwapReport, activation_name, swap_linears

__all__ = ["linear", "reference_linear", "grouped_linear", "reference_grouped_linear", "Linear", "Conv1D", "swap_linears", "SwapReport", "Swap",
           "activation_name", "ACTIVATIONS"]
