"""swap_linears(): deepgemm's layers put into an existing model, in place, with an activation that
follows a layer folded into the layer's GEMM epilogue where the model's structure shows that this
keeps the model's outputs.

Folding is safe only when the activation is the sole reader of the layer's output: the folded
layer returns act(y) instead of y, and the activation module becomes nn.Identity. Two structures
show that without running the model:

- an nn.Sequential in which the layer is directly followed by the activation (Sequential's own
  forward passes each output to the next module only);
- a module whose forward's source applies the activation straight to the layer's output, as
  ``self.act(self.fc(...))`` or ``h = self.fc(...)`` immediately followed by ``h = self.act(h)`` in
  the same block, where the module's class, with the classes it inherits from, uses each of the
  two attributes nowhere else (so no other method reads the layer's pre-activation output or calls
  the activation on something else).

Code outside the module's class that calls its layer (model.mlp.fc(x) in a user's script) cannot
be seen; swap_linears(fold_activations=False) or skip= keep such a layer's output as it was.

Anything else is left unfolded, and the report says why where a fold looked possible.
"""
from __future__ import annotations

import inspect
import io
import re
import tokenize
from dataclasses import dataclass, field
from typing import Callable

from torch import nn

from deepgemm.torch.modules import Conv1D, Linear

# ---------------------------------------------------------------------------------------------
# What a module is

# transformers' activation modules by class name (matched with their module, so transformers
# need not be imported) -> the deepgemm epilogue activation that computes the same function.
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
    """An activation module, supported or not: a layer followed by one is a fold candidate, worth
    a line in the report when it cannot be folded."""
    return type(module).__module__ in ("torch.nn.modules.activation", "transformers.activations")


def _is_conv1d_class(cls) -> bool:
    return cls.__name__ == "Conv1D" and cls.__module__ == "transformers.pytorch_utils"


def _is_transformers_conv1d(module) -> bool:
    return _is_conv1d_class(type(module))


def _swap_kind(module) -> tuple[str | None, str]:
    """('linear' | 'conv1d', '') for a layer swap_linears replaces, else (None, why not); why is
    '' for modules that are not layers at all (not worth reporting)."""
    if isinstance(module, (Linear, Conv1D)):
        return None, "already a deepgemm layer"
    # a parametrized weight is recomputed on each access; the new layer would share one value of it.
    # Checked first: parametrize makes the layer's class a subclass (ParametrizedLinear), and this
    # reason says more than the subclass one.
    if hasattr(module, "parametrizations") and (isinstance(module, nn.Linear)
                                                or any(map(_is_conv1d_class, type(module).__mro__))):
        return None, "its weight is parametrized (torch.nn.utils.parametrize)"
    t = type(module)
    if t is not nn.Linear and not _is_transformers_conv1d(module):
        if isinstance(module, nn.Linear):
            return None, f"{t.__name__} subclasses nn.Linear (its forward may differ, or be bypassed)"
        return None, ""
    if module._forward_hooks or module._forward_pre_hooks:
        return None, "it has forward hooks, which expect its own module"
    return ("linear" if t is nn.Linear else "conv1d"), ""


# ---------------------------------------------------------------------------------------------
# The report

@dataclass
class Swap:
    name: str                     # qualified module name
    kind: str                     # "nn.Linear" or "Conv1D"
    activation: str | None = None  # folded into the epilogue
    activation_module: str | None = None  # the module replaced by nn.Identity


@dataclass
class SwapReport:
    """What swap_linears() did: str() lists it, one line per layer."""
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
        for s in self.swapped:
            fold = f"+ {s.activation} ({s.activation_module} -> Identity)" if s.activation else ""
            lines.append(f"  {s.name:40} {s.kind:9} {fold}")
        lines += [f"  {n:40} not folded: {why}" for n, why in self.not_folded.items()]
        lines += [f"  {n:40} skipped: {why}" for n, why in self.skipped.items()]
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# swap_linears

def swap_linears(model: nn.Module, *, fold_activations: bool = True,
                 skip: Callable[[str, nn.Module], bool] | None = None) -> SwapReport:
    """Replace, in place, every nn.Linear and transformers Conv1D under `model` by deepgemm's Linear
    / Conv1D sharing the same parameters (no copies; works on CPU or meta modules, only forward
    needs CUDA for deepgemm to run), and fold an activation that follows a layer into its epilogue
    where the structure shows that nothing else reads the layer's output:

    - nn.Sequential: a layer directly followed by a supported activation module;
    - any other module whose forward's source applies a supported activation module straight to
      the layer's output, as ``self.act(self.fc(...))`` or ``h = self.fc(...)`` then
      ``h = self.act(h)`` in the same block, where the module's class (and those it inherits from)
      uses each of the two attributes nowhere else (GPT2MLP's c_fc/act, LlamaMLP's gate_proj/
      act_fn, BERT's dense/intermediate_act_fn, ...).

    The folded activation module is replaced by nn.Identity (it has no parameters, so the
    state_dict is unchanged). Residual adds are left alone: in the models this targets they live in
    a block's forward next to attention and caching code (GPT2Block), which is not rewritten;
    pass residual= to linear()/Linear.forward where you own the code.
    skip(name, module) -> True keeps a layer as it is. Prints nothing: returns a SwapReport of
    what was swapped and folded, and why not elsewhere (print it to see).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if skip is not None and not callable(skip):
        raise TypeError(f"skip: expected a function (name, module) -> bool, got {type(skip).__name__}")
    if _swap_kind(model)[0] is not None:
        raise TypeError("model: is itself a layer; use deepgemm.torch.Linear.from_linear (or "
                        "Conv1D.from_conv1d) for a lone layer, swap_linears for a model")
    report = SwapReport()
    children = _children(model)
    kinds = _layers_to_swap(children, skip, report.skipped)
    folds, not_folded = _plan_folds(model, children, kinds) if fold_activations else ({}, {})

    for key, kind in kinds.items():
        child = children[key]
        fold = folds.get(key)
        act = fold.activation if fold else None
        if kind == "linear":
            new = Linear.from_linear(child.module, act)
        else:
            new = Conv1D.from_conv1d(child.module, act)
        for parent, attr, _ in child.places:   # every reference, so a shared layer stays shared
            setattr(parent, attr, new)
        if fold:
            setattr(fold.parent, fold.attr, nn.Identity())
        report.swapped.append(Swap(child.name, "nn.Linear" if kind == "linear" else "Conv1D", act,
                                   fold.name if fold else None))
        if key in not_folded:
            report.not_folded[child.name] = not_folded[key]
    return report


@dataclass
class _Child:
    """A submodule and every place that references it (a module may be registered under several
    parents or attributes)."""
    module: nn.Module
    places: list[tuple[nn.Module, str, str]]   # (parent, attribute, qualified name)

    @property
    def name(self) -> str:
        return self.places[0][2]


@dataclass
class _Fold:
    activation: str          # the deepgemm activation
    parent: nn.Module        # where the activation module is registered ...
    attr: str                # ... under this attribute
    name: str                # its qualified name, for the report


def _children(model) -> dict[int, _Child]:
    """Every submodule by id (modules are not hashable by value), with all its places. Duplicates
    kept: a layer reachable through two parents must be replaced in both."""
    children: dict[int, _Child] = {}
    for pname, parent in model.named_modules(remove_duplicate=False):
        for attr, child in parent.named_children():
            qual = f"{pname}.{attr}" if pname else attr
            children.setdefault(id(child), _Child(child, [])).places.append((parent, attr, qual))
    return children


def _layers_to_swap(children, skip, skipped: dict[str, str]) -> dict[int, str]:
    """id -> 'linear' | 'conv1d' for the layers to replace; why not, for the others, into skipped."""
    kinds = {}
    for key, child in children.items():
        kind, why = _swap_kind(child.module)
        if kind and skip is not None and skip(child.name, child.module):
            kind, why = None, "skip() said so"
        if kind:
            kinds[key] = kind
        elif why:
            skipped[child.name] = why
    return kinds


def _plan_folds(model, children, kinds) -> tuple[dict[int, _Fold], dict[int, str]]:
    """Which swapped layer takes which activation (by layer id), and why not for the layers whose
    structure offered a candidate that cannot be folded."""
    folds: dict[int, _Fold] = {}
    not_folded: dict[int, str] = {}
    sources = _SourceReader()
    for pname, parent in model.named_modules():
        for lin_attr, act_attr, why_not in _fold_candidates(parent, sources):
            lin, act = parent._modules[lin_attr], parent._modules[act_attr]
            key = id(lin)
            if key not in kinds:
                continue   # skipped, or not swappable: it keeps its own forward
            act_name = activation_name(act)
            if why_not is None and act_name is None:
                why_not = f"{type(act).__name__} is not an activation deepgemm fuses"
            if why_not is None and len(children[key].places) > 1:
                # its other parents call it too and expect the pre-activation output
                why_not = "the layer is shared by several parents"
            if why_not is None and (act._forward_hooks or act._forward_pre_hooks):
                why_not = "the activation module has hooks"   # they would no longer run
            if why_not is None and key in folds:
                why_not = "already folded elsewhere"
            if why_not is None:
                act_qual = f"{pname}.{act_attr}" if pname else act_attr
                folds[key] = _Fold(act_name, parent, act_attr, act_qual)
                not_folded.pop(key, None)
            elif key not in folds:
                not_folded.setdefault(key, why_not)   # the first reason found
    return folds, not_folded


# ---------------------------------------------------------------------------------------------
# Fold candidates: a layer attribute and the activation attribute applied straight to its output

def _fold_candidates(parent, sources: _SourceReader) -> list[tuple[str, str, str | None]]:
    """(layer attribute, activation attribute, None or why it must not be folded) pairs that
    parent's structure offers; the layer is one swap_linears replaces, the activation any
    activation module (supported or not: the caller decides and reports)."""
    if type(parent) is nn.Sequential:
        keys = list(parent._modules)
        return [(a, b, None) for a, b in zip(keys, keys[1:])
                if _swap_kind(parent._modules[a])[0] and _looks_like_activation(parent._modules[b])]
    if isinstance(parent, (nn.Sequential, nn.ModuleList, nn.ModuleDict)):
        return []   # a Sequential subclass may override forward; the containers have none
    if "forward" in parent.__dict__:
        return []   # an instance-level forward: its source is not the class's
    cls = next((c for c in type(parent).__mro__ if "forward" in c.__dict__), None)
    if cls is None or cls.__module__.startswith("torch."):
        return []   # torch's own modules: only Sequential's forward is known to be a plain chain
    found = []
    for lin_attr, act_attr in sources.applications(cls):
        lin, act = parent._modules.get(lin_attr), parent._modules.get(act_attr)
        if not _swap_kind(lin)[0] or not _looks_like_activation(act):
            continue
        uses = sources.uses(type(parent))
        if uses is None:
            return []   # cannot show that nothing else reads the layer's output
        n_lin, n_act = uses(lin_attr), uses(act_attr)
        why = None
        if n_lin != 1 or n_act != 1:
            why = (f"{type(parent).__name__} uses self.{lin_attr} {n_lin}x and self.{act_attr} "
                   f"{n_act}x; folding needs each used once, together")
        found.append((lin_attr, act_attr, why))
    return found


class _SourceReader:
    """What a class's source shows, read once per swap_linears() call: a model repeats its blocks,
    and reading a class's source parses its whole file. A source that cannot be read (a class
    defined interactively, a compiled extension) shows nothing: no fold."""

    def __init__(self):
        self._applications: dict[type, list[tuple[str, str]]] = {}
        self._uses: dict[type, Callable[[str], int] | None] = {}

    def applications(self, cls) -> list[tuple[str, str]]:
        """(layer attr, act attr) pairs that cls's own forward applies (see _applications)."""
        if cls not in self._applications:
            try:
                pairs = _applications(_normalised_source(cls.__dict__["forward"]))
            except _SOURCE_ERRORS:
                pairs = []
            self._applications[cls] = pairs
        return self._applications[cls]

    def uses(self, cls) -> Callable[[str], int] | None:
        """A counter of `self.<attr>` reads in cls (see _attribute_uses), None if unreadable."""
        if cls not in self._uses:
            try:
                self._uses[cls] = _attribute_uses(cls)
            except _SOURCE_ERRORS:
                self._uses[cls] = None
        return self._uses[cls]


_SOURCE_ERRORS = (OSError, TypeError, tokenize.TokenError, IndentationError, SyntaxError)


def _attribute_uses(cls) -> Callable[[str], int]:
    """A counter of `self.<attr>` reads in the source of cls and every class it inherits from
    outside torch (any method may read the layer, including one a subclass adds). Assignments
    (self.fc = ...) do not count: __init__ makes them."""
    sources = [_normalised_source(c) for c in cls.__mro__
               if c is not object and not c.__module__.startswith("torch.")]

    def uses(attr: str) -> int:
        # not after a word or dot (other.self.fc), a whole name (not self.fc2), not followed by
        # a single '=' (an assignment; '==' is a read)
        pattern = re.compile(rf"(?<![\w.])self\.{re.escape(attr)}\b(?!=[^=])")
        return sum(len(pattern.findall(src)) for src in sources)
    return uses


# --- reading forward's source -----------------------------------------------------------------
# Matched on _normalised_source()'s text, in which `return self.act(self.fc(x))` reads
# ';return self.act(self.fc(x));' and a block is wrapped in '{' '}': GPT2MLP.forward reads
# ';def forward(self,hidden_states:...)->torch.Tensor:;{hidden_states=self.c_fc(hidden_states);
# hidden_states=self.act(hidden_states);...;return hidden_states;}'.

# self.<act>(self.<layer>( -- a lookahead, so that matches may overlap: self.a(self.b(self.c(x)))
# yields both a(b(...)) and b(c(...))
_NESTED = re.compile(r"(?<![\w.])self\.(\w+)\((?=self\.(\w+)\()")
# h=self.<layer>(args);h=self.<act>(h); -- two consecutive statements of one block, the first
# starting one (after ';', or '{' at the block's start)
_SEQUENTIAL = re.compile(r"[;{](\w+)=self\.(\w+)\(([^;]*)\);\1=self\.(\w+)\(\1\);")


def _applications(src: str) -> list[tuple[str, str]]:
    """(layer attr, act attr) where src applies self.<act> directly to self.<layer>(...)'s result."""
    pairs = []
    for m in _NESTED.finditer(src):
        end = _matching_paren(src, m.end(2))   # the layer call's closing parenthesis
        if end is not None and src[end + 1:end + 2] == ")":   # nothing between: act(layer(...))
            pairs.append((m.group(2), m.group(1)))
    for m in _SEQUENTIAL.finditer(src):
        # the statement is exactly one call: its argument list closes where the statement ends
        # (not `h = self.fc(x)[0]` or `h = self.fc(x) + y`)
        if _matching_paren(src, m.start(3) - 1) == m.end(3):
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
    """obj's source as one line of tokens, so patterns match whatever the formatting: no comments,
    line breaks inside brackets or whitespace (a space kept only between two words: 'return self');
    each statement ends in ';', and an indented block is wrapped in '{' '}' so that statements on
    either side of a block boundary are not taken for consecutive ones."""
    lines = inspect.getsource(obj).splitlines(keepends=True)
    # a method's source is indented as in its class; tokenize wants it at column 0
    indent = len(lines[0]) - len(lines[0].lstrip())
    src = "".join(line[indent:] if len(line) >= indent else line for line in lines)
    dropped = {tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER}
    words = {tokenize.NAME, tokenize.NUMBER, tokenize.STRING}
    marks = {tokenize.NEWLINE: ";", tokenize.INDENT: "{", tokenize.DEDENT: "}"}
    out, prev = [";"], None
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type in dropped:
            continue
        if tok.type in words and prev in words:
            out.append(" ")
        out.append(marks.get(tok.type, tok.string))
        prev = tok.type
    return "".join(out)


__all__ = ["swap_linears", "SwapReport", "Swap", "activation_name"]
