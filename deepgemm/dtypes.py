"""Dtypes as callers write them, to the one spelling used inside deepgemm: 'float16', 'bfloat16'
or 'float32' (NumPy's names; ml_dtypes' for bfloat16).

Accepted wherever deepgemm takes a dtype (gemm's out_dtype, explain's in_dtype/out_dtype, an
Epilogue's bias/scale/residual dtypes, the tuner's dtypes):
  - strings: NumPy's names and codes ('float16', 'half', 'f2', 'float32', 'single', 'f4', ...),
    'bfloat16', and the short forms 'fp16', 'bf16', 'fp32' (any case); 'torch.float16' etc.
  - numpy.dtype objects and scalar types: numpy.float16, numpy.float32 (the same objects as
    cupy.float16 / cupy.float32), ml_dtypes.bfloat16, numpy.dtype('float16')
  - torch.float16 / torch.half, torch.bfloat16, torch.float32 / torch.float (recognised by type,
    so torch is never imported for it)
Anything else raises TypeError naming the argument and listing what is accepted.
"""
from __future__ import annotations

from deepgemm import caches

FLOAT16, BFLOAT16, FLOAT32, FLOAT64 = "float16", "bfloat16", "float32", "float64"
INPUT_DTYPES = (FLOAT16, BFLOAT16)
OUTPUT_DTYPES = (FLOAT16, BFLOAT16, FLOAT32)
REFERENCE_DTYPES = OUTPUT_DTYPES + (FLOAT64,)   # what deepgemm.reference also takes

_SHORT = {"fp16": FLOAT16, "bf16": BFLOAT16, "fp32": FLOAT32, "fp64": FLOAT64, "half": FLOAT16,
          "float16": FLOAT16, "bfloat16": BFLOAT16, "float32": FLOAT32, "float64": FLOAT64,
          "single": FLOAT32, "double": FLOAT64}
ACCEPTED = ("'float16' ('fp16', numpy.float16, torch.float16), 'bfloat16' ('bf16', ml_dtypes.bfloat16, "
            "torch.bfloat16), 'float32' ('fp32', numpy.float32, torch.float32)")

_memo: dict = {}   # spelling -> canonical name or None (not a dtype); see canonical()


def _torch_dtype_name(x) -> str | None:
    """'float16' for torch.float16 etc., without importing torch (a torch dtype prints as
    'torch.float16'; torch.half and torch.float are the same objects as float16 and float32)."""
    if type(x).__module__.split(".")[0] == "torch":
        text = str(x)
        if text.startswith("torch."):
            return text.removeprefix("torch.")
    return None


def _resolve(x) -> str | None:
    """The dtype's NumPy-style name (possibly one deepgemm does not support, e.g. 'float64'), or
    None if x is not a dtype at all."""
    if isinstance(x, str):
        text = x.strip()
        short = _SHORT.get(text.lower().removeprefix("torch."))
        if short is not None:
            return short
        try:
            import numpy as np
            return np.dtype(text).name
        except (TypeError, ValueError):
            return None
    torch_name = _torch_dtype_name(x)
    if torch_name is not None:
        return torch_name
    import numpy as np
    # A dtype object's class need not live in numpy: ml_dtypes 0.7 gives np.dtype(bfloat16) a
    # class of its own module (ml_dtypes), so isinstance, not the module name, says it is a dtype.
    if isinstance(x, (type, np.dtype)) or type(x).__module__.startswith("numpy"):
        try:
            import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy, so np.dtype knows its name)
        except ImportError:
            pass
        try:
            return np.dtype(x).name
        except (TypeError, ValueError):
            return None
    return None


def canonical(x, arg: str = "dtype", allowed=OUTPUT_DTYPES) -> str:
    """x as 'float16', 'bfloat16' or 'float32' (one of `allowed`); a TypeError naming `arg`
    otherwise. Memoised: a repeated spelling costs one dict lookup."""
    try:
        name = _memo.get(x)
    except TypeError:   # unhashable: not a dtype spelling
        name = ""
    if name is None:
        name = _resolve(x)
        if name is not None:   # only dtype spellings are remembered, never arrays passed by mistake
            _memo[x] = name
    if not name:
        raise TypeError(f"{arg}: expected a dtype, one of {ACCEPTED}; got {x!r}")
    if name not in allowed:
        raise TypeError(f"{arg}: must be one of {tuple(allowed)}, got {name}")
    return name


def optional(x, arg: str = "dtype", allowed=OUTPUT_DTYPES) -> str | None:
    """canonical(x), with None passed through."""
    return None if x is None else canonical(x, arg, allowed)


caches.register("dtype names", __name__, "dtype spellings already resolved to their canonical name",
                _memo.clear)
