"""Poisoned output buffers: catch unwritten elements and out-of-bounds writes.

    out = poisoned_output((m, n), "float16", xp=cupy, ld=n + 8)
    gemm(a, b, out=out.view)            # the kernel writes into the M x N view
    out.check()                         # nothing outside the view was touched
    out.assert_all_written()            # every element of the view was

The view (row-major, leading dimension ld >= N) lies inside one flat allocation: `guard`
elements before it, `guard` after it, and the ld - N padding elements of every row. The view is
filled with a NaN whose payload a GPU never produces (CUDA's canonical NaNs are 0x7fff /
0x7fffffff), so "still poison" means "never written"; the guards hold a different bit pattern,
so a stray store of anything, even of the poison NaN, shows up. Everything compares raw bits on
the device (xp = numpy or cupy); only counts and first indices come back to the host.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..reference import NUMPY_DTYPES, dtype_name

# itemsize -> (poison pattern for the view, sentinel pattern for the guards). The 2-byte poison
# 0x7fa5 is a NaN both as float16 (exponent 0x1f) and as bfloat16 (exponent 0xff).
_PATTERNS = {
    2: (0x7FA5, 0xFF5A),
    4: (0x7FA5A55A, 0xFF5A5AA5),
    8: (0x7FF5A5A5A5A5A55A, 0xFFFA5A5A5A5A5AA5),
    1: (0x5A, 0xA5),
}


def _resolve_dtype(dtype) -> np.dtype:
    try:
        return NUMPY_DTYPES[dtype_name(dtype)]
    except TypeError:
        return np.dtype(dtype)                # integer outputs: poison is just a bit pattern


@dataclasses.dataclass
class PoisonedOutput:
    buffer: object        # the whole flat allocation, in the output dtype
    bits: object          # the same memory as unsigned integers
    view: object          # the M x N output view
    shape: tuple
    ld: int
    guard: int
    poison: int
    sentinel: int
    xp: object

    def _rows(self):
        """The M x ld block between the guards, as bits."""
        m = self.shape[0]
        return self.bits[self.guard:self.guard + m * self.ld].reshape(m, self.ld)

    def check(self) -> None:
        """Raise AssertionError naming the first guard region written to (before / after / row padding)."""
        m, n = self.shape
        end = self.guard + m * self.ld
        regions = [("before the output", self.bits[:self.guard], lambda i: f"buffer index {i} "
                    f"({self.guard - i} elements before the view)"),
                   ("after the output", self.bits[end:], lambda i: f"{i} elements past the view's end")]
        if self.ld > n and m > 0:
            padding = self._rows()[:, n:]
            regions.append(("in the row padding", padding, lambda i: f"row {i // (self.ld - n)}, "
                            f"column {n + i % (self.ld - n)}"))
        for where, region, describe in regions:
            overwritten = region != self.sentinel
            count = int(overwritten.sum())
            if count:
                first = int(self.xp.argmax(overwritten.ravel().astype(np.uint8)))
                raise AssertionError(f"out-of-bounds write {where}: {count} guard element(s) overwritten, "
                                     f"first at {describe(first)} (output {m}x{n}, ld {self.ld})")

    def assert_all_written(self) -> None:
        """Raise AssertionError when any element of the view still holds the poison (never written)."""
        m, n = self.shape
        unwritten = self._rows()[:, :n] == self.poison
        count = int(unwritten.sum())
        if count:
            first = int(self.xp.argmax(unwritten.ravel().astype(np.uint8)))
            raise AssertionError(f"{count} of {m * n} output elements never written, first at "
                                 f"({first // n}, {first % n}) (output {m}x{n}, ld {self.ld})")


def poisoned_output(shape, dtype, xp=np, guard=64, ld=None) -> PoisonedOutput:
    """An M x N row-major output view (leading dimension ld >= N, default N) pre-filled with poison,
    inside an allocation with `guard` sentinel elements before and after it and in the row padding."""
    m, n = (int(d) for d in shape)
    ld = n if ld is None else int(ld)
    if ld < n or guard < 0:
        raise ValueError(f"need ld >= N and guard >= 0, got ld={ld}, N={n}, guard={guard}")
    dt = _resolve_dtype(dtype)
    bits_dtype = np.dtype(f"u{dt.itemsize}")
    poison, sentinel = _PATTERNS[dt.itemsize]
    bits = xp.full(guard + m * ld + guard, sentinel, dtype=bits_dtype)
    rows = bits[guard:guard + m * ld].reshape(m, ld)
    rows[:, :n] = poison
    buffer = bits.view(dt)
    view = buffer[guard:guard + m * ld].reshape(m, ld)[:, :n]
    return PoisonedOutput(buffer=buffer, bits=bits, view=view, shape=(m, n), ld=ld, guard=guard,
                          poison=poison, sentinel=sentinel, xp=xp)
