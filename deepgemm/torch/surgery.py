"""swap_linears(): deepgemm's layers put into an existing model, in place, with an activation that
follows a layer folded into the layer's GEMM epilogue where the model's structure shows that this
keeps the model's outputs."""
from __future__ import annotations

import inspect
import io
import re
import tokenize
from dataclasses import dataclass, field
from typing import Callable

from torch import nn

from deepgemm.torch.modules import Conv1D, Linear

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


__all__ = ["swap_linears", "SwapReport", "Swap", "activation_name"]
