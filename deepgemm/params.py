"""The host mirror of ``GemmParams`` (kernels/include/deepgemm/params.cuh).

Every kernel takes one ``GemmParams`` by value; CuPy passes a NumPy structured scalar as raw bytes,
so this dtype must match the C struct byte for byte. ``tests/cpu/test_abi.py`` compiles the header
on the host and compares offsets and size, so a field added on one side only fails the CPU tier.
"""
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

# align=True applies C's natural alignment rules, as the compiler does for the struct.
PARAMS_DTYPE = np.dtype(PARAMS_FIELDS, align=True)


def make_params(**fields) -> np.ndarray:
    """A zero-initialised GemmParams with the given fields set (pointers as ints).

    Returned as a 0-d structured array: CuPy passes a size-one NumPy array to a kernel by value,
    its raw bytes (a ``np.void`` scalar it would reject)."""
    rec = np.zeros((), dtype=PARAMS_DTYPE)
    rec["split_k"] = 1
    rec["alpha"] = 1.0
    for name, value in fields.items():
        if name not in PARAMS_DTYPE.names:
            raise KeyError(f"GemmParams has no field {name!r}")
        rec[name] = value
    return rec
