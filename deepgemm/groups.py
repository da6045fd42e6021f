"""Batched and grouped problems, before any GPU is touched: how the batch dimensions of gemm()'s
operands broadcast and collapse into one group stride, and what grouped_gemm()'s group sizes may
be. Pure functions of shapes, strides and host values (tested on the CPU); deepgemm.api builds
registry.Groups from their answers.

Strides here are in elements. An operand's batch dimensions must collapse into one stride
(G groups, stride s: group g at g * s), which holds for contiguous batches, for broadcast ones
(stride 0, torch.matmul's rule) and for most views; one that does not gets a ValueError naming it.
"""
from __future__ import annotations

import math
import numbers

import numpy as np


def broadcast_batch(shapes: dict[str, tuple]) -> tuple[int, ...]:
    """The common batch shape of operands' batch dimensions (NumPy's broadcasting rule, as
    torch.matmul): {"a": (8, 1), "b": (4,)} -> (8, 4). ValueError names the first operand that
    does not fit."""
    ndim = max((len(s) for s in shapes.values()), default=0)
    result = [1] * ndim
    for name, shape in shapes.items():
        for i, size in enumerate(shape, start=ndim - len(shape)):
            if size != 1:
                if result[i] not in (1, size):
                    raise ValueError(f"{name}: batch dimensions {tuple(shape)} do not broadcast with "
                                     f"{tuple(result)} (the other operands' batch shape)")
                result[i] = size
    return tuple(result)


def group_stride(name: str, shape: tuple, strides: tuple, batch: tuple) -> int:
    """The one stride (elements) from one group to the next of an operand whose batch dimensions
    `shape` (element `strides`) broadcast to `batch`; 0 when every group shares one matrix."""
    _check_broadcast(name, shape, batch)
    pad = len(batch) - len(shape)
    dims = [(size, stride if own == size else 0)
            for size, own, stride in zip(batch, (1,) * pad + tuple(shape), (0,) * pad + tuple(strides))
            if size != 1]
    if not dims:
        return 0
    step = dims[-1][1]
    for (size, stride), (inner_size, inner_stride) in zip(dims[:-1], dims[1:]):
        if stride != inner_stride * inner_size:
            raise ValueError(f"{name}: its batch dimensions {tuple(shape)} with element strides {tuple(strides)} "
                             f"cannot be walked with one stride (broadcast to {tuple(batch)}); pass a "
                             f"contiguous copy or reshape the batch to one dimension")
    if step < 0:
        raise ValueError(f"{name}: negative batch strides {tuple(strides)} are not supported")
    return step


def _check_broadcast(name: str, shape: tuple, batch: tuple) -> None:
    pad = len(batch) - len(shape)
    if pad < 0 or any(own not in (1, size) for own, size in zip(shape, batch[pad:])):
        raise ValueError(f"{name}: batch dimensions {tuple(shape)} do not broadcast to {tuple(batch)}")


def outer_dims(batch: tuple, operands: dict[str, tuple[tuple, tuple]]) -> int:
    """How many leading batch dimensions a call must loop over so that every operand's remaining
    batch dimensions are walked with one stride each: 0 when one launch covers the whole batch.
    operands: name -> (its batch dimensions, their element strides). An operand whose dimensions
    do not broadcast to `batch` raises ValueError by name."""
    for name, (shape, _) in operands.items():
        _check_broadcast(name, shape, batch)
    for outer in range(len(batch)):
        inner = batch[outer:]
        try:
            for name, (shape, strides) in operands.items():
                keep = min(len(shape), len(inner))   # the operand's dimensions inside `inner`
                group_stride(name, shape[len(shape) - keep:], strides[len(strides) - keep:], inner)
            return outer
        except ValueError:   # some operand needs two strides here: loop over one more dimension
            continue
    return len(batch)


# Past this many elements overlapping() does not list addresses (8 MB of them, ~50 ms).
OVERLAP_LISTING_LIMIT = 1 << 20


def overlapping(shape: tuple, strides: tuple) -> bool:
    """Whether two elements of an array (shape, element strides of any sign) share an address: what
    an output must not do, as its writes would race. Decided by the strides where the dimensions
    nest, each (by stride) stepping past all the smaller ones reach, as in contiguous, padded,
    sliced, permuted and interleaved layouts; else by listing the addresses, up to
    OVERLAP_LISTING_LIMIT elements (past that the array is taken as apart: only a view made by hand
    with as_strided gets there, and torch too lets such views pass)."""
    if 0 in shape:
        return False
    dims = sorted((abs(stride), size) for size, stride in zip(shape, strides) if size > 1)
    reach = 0   # the largest offset the dimensions so far reach
    for stride, size in dims:
        if stride <= reach:
            break
        reach += (size - 1) * stride
    else:
        return False
    if dims[0][0] == 0:   # broadcast: every element of that dimension is one
        return True
    if math.prod(shape) > OVERLAP_LISTING_LIMIT:
        return False
    offsets = np.zeros((), np.int64)
    for size, stride in zip(shape, strides):
        offsets = np.add.outer(offsets, np.arange(size, dtype=np.int64) * stride)
    return np.unique(offsets).size < offsets.size


def broadcast_index(index: tuple, shape: tuple, batch: tuple) -> tuple:
    """The index into an operand's leading batch dimensions (`shape`, broadcast to `batch`) that an
    index into batch's leading dimensions selects: size-1 and missing dimensions stay at 0/absent."""
    pad = len(batch) - len(shape)
    out = []
    for i, position in enumerate(index):
        j = i - pad
        if j >= 0:
            out.append(position if shape[j] != 1 else 0)
    return tuple(out)


# ---- grouped_gemm's group sizes --------------------------------------------------------------

def host_rows(value, name: str) -> np.ndarray:
    """Host-side group sizes/offsets as int64 (device arrays are never read back: the caller keeps
    them out of here). Accepts sequences of ints, NumPy integer arrays and CPU torch tensors."""
    if type(value).__module__.startswith("torch"):
        if value.dtype.is_floating_point or value.dtype.is_complex:   # .numpy() fails on some (bfloat16, grad)
            raise TypeError(f"{name}: expected integers, got dtype {value.dtype}")
        value = value.numpy()
    arr = np.asarray(value)
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D sequence of integers, got shape {arr.shape}")
    if arr.size and not (np.issubdtype(arr.dtype, np.integer)
                         or all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in arr.tolist())):
        raise TypeError(f"{name}: expected integers, got dtype {arr.dtype}")
    try:   # a row count past int64 (Python ints, uint64) would wrap around in the cast
        if arr.dtype == np.uint64 and arr.size and arr.max() > np.iinfo(np.int64).max:
            raise OverflowError
        return arr.astype(np.int64)
    except OverflowError:
        raise ValueError(f"{name}: values past the 64-bit integers, got {value!r}") from None


def check_sizes(sizes: np.ndarray, groups: int, rows: int) -> None:
    """Contiguous groups given by size: G non-negative sizes that add up to the rows of a."""
    if sizes.shape[0] != groups:
        raise ValueError(f"sizes: expected {groups} group sizes (one per group of b), got {sizes.shape[0]}")
    if (sizes < 0).any():
        g = int(np.argmax(sizes < 0))
        raise ValueError(f"sizes: group {g} has a negative size {int(sizes[g])}")
    total = int(sizes.sum())
    if total != rows:
        raise ValueError(f"sizes: the group sizes add up to {total}, but a has {rows} rows")


def check_offsets(offsets: np.ndarray, groups: int, rows: int) -> None:
    """Contiguous groups given by offsets: G + 1 non-decreasing row offsets from 0 to the rows of a."""
    if offsets.shape[0] != groups + 1:
        raise ValueError(f"offsets: expected {groups + 1} row offsets (G + 1 for {groups} groups of b), "
                         f"got {offsets.shape[0]}")
    if offsets[0] != 0 or offsets[-1] != rows:
        raise ValueError(f"offsets: must start at 0 and end at a's {rows} rows, got {int(offsets[0])} ... "
                         f"{int(offsets[-1])}")
    steps = np.diff(offsets)
    if (steps < 0).any():
        g = int(np.argmax(steps < 0))
        raise ValueError(f"offsets: out of order at group {g} ({int(offsets[g])} > {int(offsets[g + 1])})")


def check_masked(counts: np.ndarray, groups: int, capacity: int) -> None:
    """Masked groups: G valid-row counts, each within the per-group capacity M_max."""
    if counts.shape[0] != groups:
        raise ValueError(f"masked_m: expected {groups} counts (one per group), got {counts.shape[0]}")
    bad = (counts < 0) | (counts > capacity)
    if bad.any():
        g = int(np.argmax(bad))
        raise ValueError(f"masked_m: group {g} has {int(counts[g])} rows, outside 0..{capacity} (a's rows per group)")


def check_rows(mode: str, rows: np.ndarray, groups: int, m: int) -> None:
    """The host-side check of a contiguous or masked split (check_sizes, check_offsets or
    check_masked by mode); m: a's rows (contiguous) or rows per group (masked)."""
    {"sizes": check_sizes, "offsets": check_offsets, "masked": check_masked}[mode](rows, groups, m)


def row_ranges(mode: str, rows: np.ndarray | None, groups: int, m: int) -> list[tuple[int, int]]:
    """(first row, row count) of each group as the kernels read GemmParams (grouped.cuh's
    GroupCursor, clamping included): the host model tests and references use."""
    out, base, count = [], 0, 0
    for g in range(groups):
        if mode == "batch":
            base, count = 0, m
        elif mode == "masked":
            base, count = 0, min(max(int(rows[g]), 0), m)
        elif mode == "sizes":
            base = 0 if g == 0 else base + count
            count = min(max(int(rows[g]), 0), m - base)
        elif mode == "offsets":
            lo = min(max(int(rows[g]), 0), m)
            base, count = lo, min(max(int(rows[g + 1]), lo), m) - lo
        else:
            raise ValueError(f"mode: unknown group mode {mode!r}")
        out.append((base, count))
    return out


def tile_bound(mode: str, groups: int, m: int, block_m: int) -> int:
    """An upper bound on the row tiles of all groups that needs no group size: what a launch sized
    on the host covers (each contiguous group adds at most one partial tile)."""
    if mode in ("batch", "masked"):
        return groups * math.ceil(m / block_m)
    return math.ceil(m / block_m) + groups
