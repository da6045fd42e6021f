"""The host mirror of ``GemmParams`` (kernels/include/deepgemm/params.cuh).

Every kernel takes one ``GemmParams`` by value; CuPy passes a NumPy structured scalar as raw bytes,
so this dtype must match the C struct byte for byte. ``tests/cpu/test_abi.py`` compiles the header
on the host and compares offsets and size, so a field added on one side only fails the CPU tier.
"""
import struct

import numpy as np

PARAMS_FIELDS = [
    ("a", np.uint64), ("b", np.uint64), ("d", np.uint64),
    ("bias", np.uint64), ("scale", np.uint64), ("c", np.uint64),
    ("lda", np.int64), ("ldb", np.int64), ("ldd", np.int64), ("ldc", np.int64),
    ("m", np.int32), ("n", np.int32), ("k", np.int32),
    ("alpha", np.float32), ("beta", np.float32), ("scale_scalar", np.float32),
    ("workspace", np.uint64), ("workspace_elems", np.int64),
    ("split_k", np.int32), ("flags", np.int32),
]
# GroupedGemmParams (the batched/grouped builds' argument): GemmParams, then these.
GROUP_FIELDS = [
    ("groups", np.int32), ("group_mode", np.int32), ("group_rows", np.uint64),
    ("stride_a", np.int64), ("stride_b", np.int64), ("stride_d", np.int64), ("stride_c", np.int64),
    ("stride_bias", np.int64),
]

# align=True applies C's natural alignment rules, as the compiler does for the struct.
PARAMS_DTYPE = np.dtype(PARAMS_FIELDS, align=True)
GROUPED_PARAMS_DTYPE = np.dtype(PARAMS_FIELDS + GROUP_FIELDS, align=True)


_DEFAULTS = {name: 0 for name in GROUPED_PARAMS_DTYPE.names} | {"split_k": 1, "alpha": 1.0, "groups": 1}
_CODES = {np.dtype(np.uint64): "Q", np.dtype(np.int64): "q", np.dtype(np.int32): "i", np.dtype(np.float32): "f"}


def _packer(dtype: np.dtype) -> struct.Struct:
    """A struct.Struct with dtype's exact offsets (padding as pad bytes): packing is ~20x faster
    than assigning the fields of a structured array, and gemm() builds one per call."""
    fmt, pos = "<", 0
    for name in sorted(dtype.names, key=lambda n: dtype.fields[n][1]):
        dt, offset = dtype.fields[name][:2]
        fmt += "x" * (offset - pos) + _CODES[dt]
        pos = offset + dt.itemsize
    return struct.Struct(fmt + "x" * (dtype.itemsize - pos))


_LAYOUTS = {dt: (_packer(dt), sorted(dt.names, key=lambda n: dt.fields[n][1])) for dt in (PARAMS_DTYPE, GROUPED_PARAMS_DTYPE)}
_GROUP_NAMES = frozenset(name for name, _ in GROUP_FIELDS)


def make_params(**fields) -> np.ndarray:
    """A zero-initialised GemmParams with the given fields set (pointers as ints); a
    GroupedGemmParams when any group field is given.

    Returned as a 0-d structured array: CuPy passes a size-one NumPy array to a kernel by value,
    its raw bytes (a ``np.void`` scalar it would reject)."""
    unknown = fields.keys() - _DEFAULTS.keys()
    if unknown:
        raise KeyError(f"GemmParams has no field {sorted(unknown)[0]!r}")
    dtype = GROUPED_PARAMS_DTYPE if _GROUP_NAMES & fields.keys() else PARAMS_DTYPE
    pack, order = _LAYOUTS[dtype]
    values = _DEFAULTS | fields
    return np.frombuffer(pack.pack(*(values[n] for n in order)), dtype=dtype).reshape(())


POINTER_FIELDS = ("a", "b", "d", "bias", "scale", "c")   # what a replayed call changes (deepgemm/launch.py)
