"""PyTorch integration: deepgemm's fused GEMM as the op ``deepgemm::linear``, drop-in modules for
nn.Linear and transformers' Conv1D, and ``swap_linears()``, which puts them into an existing model
and folds a following activation into the GEMM's epilogue where the model's structure shows that
this keeps its outputs.

    import deepgemm.torch as dgt
    y = dgt.linear(x, layer.weight, layer.bias, activation="gelu")   # act(x @ W^T + b), one launch
    report = dgt.swap_linears(model)                                  # in place; what changed, and why not
    print(report)

This module imports torch; ``import deepgemm`` never does. Inference only: the op has no autograd
formula, so a backward pass through it raises.
"""
from __future__ import annotations

import inspect
import io
import math
import re
import tokenize
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import nn

from deepgemm import api as _api
from deepgemm.registry import ACTIVATION_CODES

ACTIVATIONS = tuple(a for a in ACTIVATION_CODES if a)   # relu, gelu (tanh), gelu_erf, silu
WEIGHT_LAYOUTS = ("out_in", "in_out")                    # nn.Linear's [out, in]; Conv1D's [in, out]
_INPUT_DTYPES = (torch.float16, torch.bfloat16)
_EPILOGUE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# ---------------------------------------------------------------------------------------------
# The op

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
    Returns a new [..., out] tensor in x's dtype from torch's allocator, written on torch's current
    stream with no host synchronisation, so it can be captured in a CUDA graph (warm it up first:
    the first call of a shape may compile a kernel). Inside torch.compile it is the opaque op
    ``torch.ops.deepgemm.linear``. CPU tensors get the same arithmetic from torch ops, so swapped
    modules stay usable (and testable) on the CPU.
    """
    weight_in_out = _check_layout(weight_layout)
    if torch.compiler.is_compiling():      # first, so torch.compile traces one branch only
        return _linear_op(x, weight, bias, residual, activation, weight_in_out)
    if _direct_call_ok(x, weight, bias, residual):
        return _linear_impl(x, weight, bias, residual, activation, weight_in_out)
    return _linear_op(x, weight, bias, residual, activation, weight_in_out)


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
    compared by index (get_device(): -1 off CUDA), building torch.device objects only to report."""
    if not isinstance(x, torch.Tensor) or not isinstance(weight, torch.Tensor):
        raise TypeError(f"x and weight: expected torch tensors, got {type(x).__name__} and {type(weight).__name__}")
    if activation not in ACTIVATION_CODES:
        raise ValueError(f"activation: must be one of {list(ACTIVATIONS)} or None, got {activation!r}")
    if x.dim() < 1:
        raise ValueError("x: expected at least 1 dimension (the input features)")
    if weight.dim() != 2:
        raise ValueError(f"weight: expected a 2-D matrix, got shape {tuple(weight.shape)}")
    k, n = (weight.shape[0], weight.shape[1]) if weight_in_out else (weight.shape[1], weight.shape[0])
    if x.shape[-1] != k:
        layout = "[in, out]" if weight_in_out else "[out, in]"
        raise ValueError(f"weight: x has {x.shape[-1]} input features, weight {tuple(weight.shape)} "
                         f"(layout {layout}) expects {k}")
    if x.dtype not in _INPUT_DTYPES and not x.is_cpu:   # CPU: torch arithmetic, any float
        raise TypeError(f"x: dtype must be float16 or bfloat16 for deepgemm, got {x.dtype}; "
                        f"cast the module (e.g. model.half())")
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


# ---------------------------------------------------------------------------------------------
# Modules

class Linear(nn.Linear):
    """nn.Linear computed by deepgemm, with an optional activation fused into the GEMM's epilogue:
    ``act(x @ W^T + b)`` (+ an optional residual: ``forward(x, residual)``). Same parameters and
    state_dict as nn.Linear."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, *, activation=None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.activation = _check_activation(activation)

    @classmethod
    def from_linear(cls, layer: nn.Linear, activation=None) -> "Linear":
        """A deepgemm Linear sharing `layer`'s parameters (no copy; tied weights stay tied)."""
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
        self.activation = _check_activation(activation)

    @classmethod
    def from_conv1d(cls, layer, activation=None) -> "Conv1D":
        new = cls(layer.nf, layer.nx, activation=activation, device="meta")
        new.weight, new.bias = layer.weight, layer.bias
        new.train(layer.training)
        return new

    def forward(self, x, residual=None):
        return linear(x, self.weight, self.bias, self.activation, residual, weight_layout="in_out")

    def extra_repr(self):
        return f"nf={self.nf}, nx={self.nx}" + (f", activation={self.activation}" if self.activation else "")


def _check_activation(activation):
    if activation not in ACTIVATION_CODES:
        raise ValueError(f"activation: must be one of {list(ACTIVATIONS)} or None, got {activation!r}")
    return activation


# ---------------------------------------------------------------------------------------------
# Swapping a model's layers

# transformers' activation modules by class name (matched with their module, so transformers
# need not be imported): what deepgemm epilogue computes the same function.
_TRANSFORMERS_ACTIVATIONS = {
    "NewGELUActivation": "gelu", "GELUTanh": "gelu", "PytorchGELUTanh": "gelu",
    "FastGELUActivation": "gelu",            # the same tanh formula, factored differently
    "GELUActivation": "gelu_erf", "SiLUActivation": "silu",
}


def activation_name(module) -> str | None:
    """The deepgemm activation that computes what `module` computes, or None. Exact classes only:
    a subclass may override forward."""
    t = type(module)
    if t is nn.ReLU:
        return "relu"
    if t is nn.SiLU:
        return "silu"
    if t is nn.GELU:
        return {"none": "gelu_erf", "tanh": "gelu"}.get(module.approximate)
    if t.__module__ == "transformers.activations":
        return _TRANSFORMERS_ACTIVATIONS.get(t.__name__)
    return None


def _looks_like_activation(module) -> bool:
    """An activation module, supported or not (which fold candidates are worth reporting)."""
    return type(module).__module__ in ("torch.nn.modules.activation", "transformers.activations")


def _is_transformers_conv1d(module) -> bool:
    t = type(module)
    return t.__name__ == "Conv1D" and t.__module__ == "transformers.pytorch_utils"


def _swap_kind(module) -> tuple[str | None, str]:
    """('linear' | 'conv1d' | None, why not)."""
    if isinstance(module, (Linear, Conv1D)):
        return None, "already a deepgemm layer"
    t = type(module)
    if t is not nn.Linear and not _is_transformers_conv1d(module):
        if isinstance(module, nn.Linear):
            return None, f"{t.__name__} subclasses nn.Linear (its forward may differ, or be bypassed)"
        return None, ""
    if hasattr(module, "parametrizations"):
        return None, "its weight is parametrized (torch.nn.utils.parametrize)"
    if module._forward_hooks or module._forward_pre_hooks:
        return None, "it has forward hooks, which expect its own module"
    return ("linear" if t is nn.Linear else "conv1d"), ""


@dataclass
class Swap:
    name: str                     # qualified module name
    kind: str                     # "nn.Linear" or "Conv1D"
    activation: str | None = None  # folded into the epilogue
    activation_module: str | None = None  # the module replaced by nn.Identity


@dataclass
class SwapReport:
    swapped: list[Swap] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)   # name -> why (layers that were not swapped)
    not_folded: dict[str, str] = field(default_factory=dict)  # swapped layer -> why its activation was not

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.swapped]

    @property
    def folded(self) -> dict[str, str]:
        return {s.name: s.activation for s in self.swapped if s.activation}

    def __str__(self):
        lines = [f"deepgemm.torch.swap_linears: {len(self.swapped)} layers swapped, "
                 f"{len(self.folded)} with a folded activation, {len(self.skipped)} skipped"]
        lines += [f"  {s.name:40} {s.kind:9} {'+ ' + s.activation + ' (' + s.activation_module + ' -> Identity)' if s.activation else ''}"
                  for s in self.swapped]
        lines += [f"  {n:40} not folded: {why}" for n, why in self.not_folded.items()]
        lines += [f"  {n:40} skipped: {why}" for n, why in self.skipped.items()]
        return "\n".join(lines)


def swap_linears(model: nn.Module, *, fold_activations: bool = True,
                 skip: Callable[[str, nn.Module], bool] | None = None) -> SwapReport:
    """Replace, in place, every nn.Linear and transformers Conv1D under `model` by deepgemm's Linear
    / Conv1D sharing the same parameters (no copies; works on CPU or meta modules, only forward
    needs CUDA for deepgemm to run), and fold an activation that follows a layer into its epilogue
    where the structure shows that nothing else reads the layer's output:

    - nn.Sequential: a layer directly followed by a supported activation module;
    - any other module whose forward's source (the class that defines it) applies a supported
      activation module straight to the layer's output, as ``self.act(self.fc(...))`` or
      ``h = self.fc(...)`` then ``h = self.act(h)``, where the class uses each of the two
      attributes nowhere else (GPT2MLP's c_fc/act, LlamaMLP's gate_proj/act_fn, BERT's dense/
      intermediate_act_fn, ...).

    The folded activation module is replaced by nn.Identity (it has no parameters, so the
    state_dict is unchanged). Residual adds are left alone: in the models this targets they live in
    a block's forward next to attention and caching code (GPT2Block), which is not rewritten;
    pass residual= to linear()/Linear.forward where you own the code.
    skip(name, module) -> True keeps a layer as it is. Returns a SwapReport (print it).
    """
    if _swap_kind(model)[0] is not None:
        raise TypeError("model: is itself a layer; use deepgemm.torch.Linear.from_linear (or "
                        "Conv1D.from_conv1d) for a lone layer, swap_linears for a model")
    report = SwapReport()
    parents: dict[int, list] = {}          # id(child) -> [(parent, attribute, qualified name)]
    modules: dict[int, nn.Module] = {}
    for pname, parent in model.named_modules(remove_duplicate=False):
        for attr, child in parent.named_children():
            qual = f"{pname}.{attr}" if pname else attr
            parents.setdefault(id(child), []).append((parent, attr, qual))
            modules[id(child)] = child

    kinds = {}
    for key, child in modules.items():
        name = parents[key][0][2]
        kind, why = _swap_kind(child)
        if kind and skip is not None and skip(name, child):
            kind, why = None, "skip() said so"
        if kind:
            kinds[key] = kind
        elif why:
            report.skipped[name] = why

    folds: dict[int, tuple[str, nn.Module, str, str]] = {}   # layer -> (act, parent, act attr, act name)
    not_folded: dict[int, str] = {}
    if fold_activations:
        for pname, parent in model.named_modules():
            for lin_attr, act_attr, why_not in _fold_candidates(parent):
                lin, act = parent._modules.get(lin_attr), parent._modules.get(act_attr)
                if lin is None or id(lin) not in kinds:
                    continue
                act_name = activation_name(act) if act is not None else None
                if why_not is None and act_name is None:
                    why_not = f"{type(act).__name__} is not an activation deepgemm fuses"
                if why_not is None and len(parents[id(lin)]) > 1:
                    why_not = "the layer is shared by several parents"
                if why_not is None and (act._forward_hooks or act._forward_pre_hooks):
                    why_not = "the activation module has hooks"
                if why_not is None and id(lin) in folds:
                    why_not = "already folded elsewhere"
                if why_not is None:
                    act_qual = f"{pname}.{act_attr}" if pname else act_attr
                    folds[id(lin)] = (act_name, parent, act_attr, act_qual)
                    not_folded.pop(id(lin), None)
                elif id(lin) not in folds:
                    not_folded.setdefault(id(lin), why_not)

    for key, kind in kinds.items():
        old = modules[key]
        act_name, act_parent, act_attr, act_qual = folds.get(key, (None, None, None, None))
        new = (Linear.from_linear(old, act_name) if kind == "linear" else Conv1D.from_conv1d(old, act_name))
        for parent, attr, _ in parents[key]:
            setattr(parent, attr, new)
        if act_parent is not None:
            setattr(act_parent, act_attr, nn.Identity())
        name = parents[key][0][2]
        report.swapped.append(Swap(name, "nn.Linear" if kind == "linear" else "Conv1D", act_name, act_qual))
        if key in not_folded:
            report.not_folded[name] = not_folded[key]
    return report


def _fold_candidates(parent) -> list[tuple[str, str, str | None]]:
    """(layer attribute, activation attribute, None or why it must not be folded) pairs that
    parent's structure offers."""
    if type(parent) is nn.Sequential:
        keys = list(parent._modules)
        return [(a, b, None) for a, b in zip(keys, keys[1:])
                if _swap_kind(parent._modules[a])[0] and _looks_like_activation(parent._modules[b])]
    if isinstance(parent, nn.Sequential) or isinstance(parent, (nn.ModuleList, nn.ModuleDict)):
        return []
    if "forward" in parent.__dict__:
        return []   # an instance-level forward: its source is not the class's
    cls = next((c for c in type(parent).__mro__ if "forward" in c.__dict__), None)
    if cls is None or cls.__module__.startswith("torch."):
        return []
    try:
        forward_src = _normalised_source(cls.__dict__["forward"])
        class_src = _normalised_source(cls)
    except (OSError, TypeError, tokenize.TokenError, IndentationError, SyntaxError):
        return []
    children = set(parent._modules)
    found = []
    for lin_attr, act_attr in _applications(forward_src):
        if lin_attr not in children or act_attr not in children:
            continue
        if not _swap_kind(parent._modules[lin_attr])[0] or not _looks_like_activation(parent._modules[act_attr]):
            continue
        uses = {a: len(re.findall(rf"(?<![\w.])self\.{re.escape(a)}\b(?!=[^=])", class_src))
                for a in (lin_attr, act_attr)}
        why = None
        if any(u != 1 for u in uses.values()):
            why = (f"{cls.__name__} uses self.{lin_attr} {uses[lin_attr]}x and self.{act_attr} "
                   f"{uses[act_attr]}x; folding needs each used once, together")
        found.append((lin_attr, act_attr, why))
    return found


_NESTED = re.compile(r"(?<![\w.])self\.(\w+)\((?=self\.(\w+)\()")   # lookahead: matches may overlap
_SEQUENTIAL = re.compile(r";(\w+)=self\.(\w+)\(([^;]*)\);\1=self\.(\w+)\(\1\);")


def _applications(src: str) -> list[tuple[str, str]]:
    """(layer attr, act attr) where src applies self.<act> directly to self.<layer>(...)'s result."""
    pairs = []
    for m in _NESTED.finditer(src):
        end = _matching_paren(src, m.end(2))   # the layer call's closing parenthesis
        if end is not None and src[end + 1:end + 2] == ")":   # nothing between: act(layer(...))
            pairs.append((m.group(2), m.group(1)))
    for m in _SEQUENTIAL.finditer(src):
        if _matching_paren(src, m.start(3) - 1) == m.end(3):   # the layer's argument list is whole
            pairs.append((m.group(2), m.group(4)))
    return pairs


def _matching_paren(src: str, open_at: int) -> int | None:
    depth = 0
    for i in range(open_at, len(src)):
        depth += {"(": 1, ")": -1}.get(src[i], 0)
        if depth == 0:
            return i
    return None


def _normalised_source(obj) -> str:
    """obj's source without comments, docstrings' line breaks or whitespace; statements end in ';'
    (so 'a=b(c);' patterns can be matched whatever the formatting)."""
    src = inspect.getsource(obj)
    lines = src.splitlines(keepends=True)
    indent = len(lines[0]) - len(lines[0].lstrip())
    src = "".join(line[indent:] if len(line) >= indent else line for line in lines)
    out, prev = [";"], None
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING,
            tokenize.ENDMARKER}
    words = {tokenize.NAME, tokenize.NUMBER, tokenize.STRING}
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type in skip:
            continue
        if tok.type in words and prev in words:
            out.append(" ")                     # keep 'return self' two words
        out.append(";" if tok.type == tokenize.NEWLINE else tok.string)
        prev = tok.type
    return "".join(out)


__all__ = ["linear", "reference_linear", "Linear", "Conv1D", "swap_linears", "SwapReport", "Swap",
           "activation_name", "ACTIVATIONS"]
