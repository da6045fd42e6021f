"""Batched and grouped GEMM under the same oracles as a single GEMM.

    from deepgemm.testing.grouped import GroupedCase, run_grouped_case, grouped_cases
    run_grouped_case(GroupedCase("v5", "sizes", (0, 127, 128, 129), n=72, k=40), rng)

A case is one call of deepgemm.grouped_gemm (modes "sizes", "offsets", "masked") or of a batched
deepgemm.gemm (mode "batch"). run_grouped_case draws small-integer inputs (every sum exact in
FP32, so the result must equal the float64 reference bit for bit), writes into a poisoned output
whose guard bands start right after the last group's last row, and checks, group by group:
every row a group owns is the exact product, no row it does not own was written (masked rows past
a group's count stay poison), nothing outside the output was touched. Group-size patterns cover
the cases grouped kernels get wrong: all empty, one huge, many of size 1, sizes either side of a
tile edge, a skewed MoE-like spread. ``grouped_problems`` is the hypothesis strategy; it shrinks
towards fewer and smaller groups, so a failure is reported at its smallest group pattern.
Run as ``python -m deepgemm.testing.grouped KERNEL`` it runs a sample (for compute-sanitizer).
"""
from __future__ import annotations

import dataclasses
import sys

import numpy as np

from ..reference import NUMPY_DTYPES, reference_gemm, round_to
from .bounds import assert_bitwise_equal, integer_inputs
from .errors import naming_case
from .poison import poisoned_output
from .strategies import strided_view

MODES = ("batch", "masked", "sizes", "offsets")
CONTIGUOUS = ("sizes", "offsets")   # modes whose groups are row ranges of one A and D
BIAS_DTYPES = ("float32", "float16", "bfloat16")
BLOCK_M = 128   # the row tile of the grouped kernels (V4's default and V5's); edges straddle it


def patterns(block_m: int = BLOCK_M) -> dict[str, tuple[int, ...]]:
    """Named group-size patterns (rows per group)."""
    return {
        "all_empty": (0, 0, 0),
        "one_huge": (0, 5 * block_m + 7, 0),
        "many_ones": (1,) * 37,
        "tile_edges": (block_m - 1, block_m, block_m + 1, 0, 2 * block_m - 1, 1, 2 * block_m + 1),
        "skewed": (3 * block_m + 17, 5, 0, 64, 0, block_m // 2, 1, 2 * block_m),
    }


@dataclasses.dataclass(frozen=True)
class GroupedCase:
    kernel: str                  # "auto" or a kernel with a grouped build
    mode: str                    # MODES
    sizes: tuple                 # rows per group (mode "batch": every entry the same)
    n: int
    k: int
    dtype: str = "float16"
    out_dtype: str = "float32"
    a_layout: str = "row"        # each group's A: "row" (k contiguous) or "col"
    b_layout: str = "col"        # each group's B: "col" (nn.Linear's weight.T) or "row"
    bias: bool = False           # one bias row per group
    bias_dtype: str = "float32"
    bias_pad: int = 0            # elements between one group's bias row and the next past N (odd: the
                                 # odd groups' rows start off pair alignment)
    residual: bool = False       # c, one per group's rows
    c_pad: int = 0               # extra elements per row of c (not a multiple of 8: rows no TMA reads,
                                 # so the chain reads c through each group's view, its pitch not d's)
    activation: str | None = None   # None or "relu": the exact oracle needs integer results
    device_sizes: bool = True    # sizes as an int32 device array (else a host list)
    pad: int = 0                 # extra elements per output row (0: TMA-storable rows)
    capacity: int | None = None  # masked: rows per group's buffer (default max(sizes) + 3)
    config: tuple = ()           # sorted (define, value) pairs of a config; () = the dispatch rule's

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode: one of {MODES}, got {self.mode!r}")
        if self.mode == "batch" and len(set(self.sizes)) > 1:
            raise ValueError("mode 'batch': every batch has the same rows")

    @property
    def groups(self) -> int:
        return len(self.sizes)

    @property
    def rows(self) -> int:
        """Rows of each group's buffer (batch, masked) or of a (sizes, offsets)."""
        if self.mode == "batch":
            return self.sizes[0] if self.sizes else 0
        if self.mode == "masked":
            return self.capacity if self.capacity is not None else max(self.sizes, default=0) + 3
        return sum(self.sizes)

    def __str__(self) -> str:
        sizes = self.sizes if len(self.sizes) <= 8 else f"{self.sizes[:6]}...({len(self.sizes)} groups)"
        bias = f"bias:{self.bias_dtype}" + (f"/ld{self.n + self.bias_pad}" if self.bias_pad else "")
        extras = "".join(f"+{x}" for x, on in ((bias, self.bias), ("C", self.residual),
                                                (str(self.activation), self.activation)) if on)
        from deepgemm import registry, tuner
        name = tuner.label(registry.get(self.kernel), dict(self.config)) if self.config else self.kernel
        return (f"{name} {self.mode} sizes={sizes} n={self.n} k={self.k} {self.dtype}->{self.out_dtype} "
                f"{self.a_layout[0]}{self.b_layout[0]}{extras} {'dev' if self.device_sizes else 'host'}-sizes"
                + (f" pad={self.pad}" if self.pad else "") + (f" c_pad={self.c_pad}" if self.c_pad else ""))


def _matrices(count, rows, cols, row_major, dtype, k, rng, xp, budget):
    """count x rows x cols integer inputs; row_major False gives the column-major view of each, its
    leading dimension rounded up to 8 elements (what TMA kernels need: 16-byte strides). Either
    way the allocation ends at the last matrix's last element (no padding after its last column),
    so a read past it leaves the allocation, where compute-sanitizer's memcheck sees it."""
    if row_major:
        return xp.asarray(integer_inputs((count, rows, cols), k, rng, dtype, budget))
    ld = max(8, -(-rows // 8) * 8)
    host = integer_inputs((count, cols, ld), k, rng, dtype, budget)
    if count * cols * rows == 0:
        return xp.asarray(host)[:, :, :rows].transpose(0, 2, 1)
    flat = xp.asarray(host.reshape(-1)[:(count * cols - 1) * ld + rows].copy())
    return strided_view(flat, (count, rows, cols), (cols * ld, 1, ld), xp)


def run_grouped_case(case: GroupedCase, rng: np.random.Generator, *, xp=None) -> None:
    """Run one case; raise AssertionError naming the case and the group on any failure (any other
    error, e.g. a CUDA fault, is raised as it is, with the case printed: errors.naming_case)."""
    with naming_case(case):
        _run_grouped_case(case, rng, xp)


def _run_grouped_case(case: GroupedCase, rng: np.random.Generator, xp) -> None:
    import deepgemm
    if xp is None:
        import cupy as xp
    g, n, k, rows = case.groups, case.n, case.k, case.rows
    epilogue = case.bias or case.residual
    budget = 2 ** 20 if epilogue else 2 ** 24          # headroom for an exact bias + residual
    batched = case.mode in ("batch", "masked")
    a = _matrices(g if batched else 1, rows, k, case.a_layout == "row", case.dtype, k, rng, xp, budget)
    if not batched:
        a = a[0]
    b = _matrices(g, k, n, case.b_layout == "row", case.dtype, k, rng, xp, budget)
    bias = None
    if case.bias:   # integers within +-32: exact in every bias dtype
        rows_of_bias = integer_inputs((g, n + case.bias_pad), 1, rng, "float16", 2 ** 10)
        bias = xp.asarray(rows_of_bias.astype(NUMPY_DTYPES[case.bias_dtype]))[:, :n]
    out_rows = g * rows if batched else rows
    out = poisoned_output((out_rows, n), case.out_dtype, xp=xp, ld=n + case.pad)
    view = out.view.reshape(g, rows, n) if batched else out.view
    c = None
    if case.residual:   # in the output dtype (a model's residual stream), FP32 beside an FP32 D
        c_dtype = case.out_dtype
        padded = view.shape[:-1] + (n + case.c_pad,)
        c = xp.asarray(integer_inputs(padded, 1, rng, "float16" if c_dtype == "float32" else c_dtype,
                                      2 ** 10).astype(NUMPY_DTYPES[c_dtype]))[..., :n]
    sizes = np.asarray(case.sizes, dtype=np.int32)
    kwargs = dict(kernel=case.kernel, out=view, bias=bias, c=c, activation=case.activation)
    if case.config:
        kwargs["config"] = dict(case.config)
    if case.mode == "batch":
        deepgemm.gemm(a, b, **kwargs)
    else:
        given = {"masked": sizes, "sizes": sizes, "offsets": np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)}
        value = given[case.mode]
        value = xp.asarray(value) if case.device_sizes else value.tolist()
        deepgemm.grouped_gemm(a, b, **{"masked_m" if case.mode == "masked" else case.mode: value}, **kwargs)
    if xp.__name__ == "cupy":
        xp.cuda.get_current_stream().synchronize()
    where = f"[{case}] "
    out.check()   # guards before and after (the last group ends at the buffer's end), row padding
    base = 0
    for grp, size in enumerate(case.sizes):
        first = 0 if batched else base
        a_g = a[grp] if batched else a
        d_g = view[grp] if batched else view
        rows_g = slice(first, first + size)
        if size:
            c_g = (c[grp] if batched else c)[rows_g] if c is not None else None
            expected = round_to(reference_gemm(a_g[rows_g], b[grp], bias=bias[grp] if bias is not None else None,
                                               activation=case.activation, c=c_g, beta=1.0 if c is not None else 0.0),
                                case.out_dtype)
            assert_bitwise_equal(d_g[rows_g], expected, msg=f"{where}group {grp} (rows {first}..{first + size - 1}): ")
        if case.mode == "masked" and size < rows:
            untouched = out.bits[out.guard:out.guard + out_rows * out.ld].reshape(g, rows, out.ld)[grp, size:, :n]
            written = int((untouched != out.poison).sum())
            assert written == 0, f"{where}group {grp}: {written} elements written past its {size} valid rows"
        base += size
    if case.mode != "masked":
        out.assert_all_written()


def grouped_cases(kernel: str, tier: str = "quick", config: dict | None = None) -> list[GroupedCase]:
    """The sweep: every pattern in every mode, both layouts of each operand, both dtypes, the
    epilogue per group (each bias dtype, its rows N or N + 1 apart), padded and TMA-storable output
    rows, host and device sizes. The quick tier takes a spread of the combinations (each dimension
    still reaches every value). With `config` (a kernel config, e.g. V5's 64-row tiles), every case
    runs it, and the patterns straddle its row tile."""
    from deepgemm import registry
    cases = []
    layouts = [("row", "col"), ("col", "row"), ("row", "row"), ("col", "col")]
    key, block_m = (), BLOCK_M
    if config is not None:
        full = registry.get(kernel).config_defines(config)
        key, block_m = tuple(sorted(full.items())), registry.get(kernel).tile(full)[0]
    i = biased = 0   # biased: cases with a bias and rows, which step through the bias dtypes and row strides
    for mode in MODES:
        for name, sizes in patterns(block_m).items():
            if mode == "batch":
                sizes = (max(sizes[:3]),) * min(len(sizes), 4)
            for a_l, b_l in layouts if tier == "full" else [layouts[i % 4]]:
                i += 1
                cases.append(GroupedCase(kernel, mode, tuple(sizes), n=72 + 64 * (i % 3), k=40 + 24 * (i % 4),
                                         dtype=("float16", "bfloat16")[i % 2],
                                         out_dtype=("float32", "float16", "bfloat16")[i % 3],
                                         a_layout=a_l, b_layout=b_l, bias=i % 3 == 0,
                                         bias_dtype=BIAS_DTYPES[biased % 3], bias_pad=biased // 3 % 2,
                                         residual=i % 4 == 1,
                                         activation="relu" if i % 5 == 2 else None, device_sizes=i % 2 == 0,
                                         pad=8 * (i % 2), config=key))
                biased += i % 3 == 0 and sum(sizes) > 0
    if _needs_tma(kernel):
        # TMA reads a column-major A only when its contiguous extent (the rows) is whole 16 bytes,
        # and not for contiguous groups, whose first rows may start a box off that alignment
        cases = [dataclasses.replace(c, a_layout="row") if c.a_layout == "col" and (c.rows % 8 or c.mode in CONTIGUOUS)
                 else c for c in cases]
    return cases + extra_cases(kernel, key, block_m)


def extra_cases(kernel: str, key: tuple = (), block_m: int = BLOCK_M) -> list[GroupedCase]:
    """The cases grouped_cases adds beside the patterns (all of them in the sanitizer's sample):
    a wide N, K = 0, and per kernel the layouts and sizes the patterns cannot give it. key: the
    sorted config defines of every case; block_m: its row tile."""
    cases = []
    if _needs_tma(kernel):
        # The patterns then have no column-major A with rows: batched and masked ones whose rows
        # are whole 16 bytes, a row count either side of the row tile, each B layout
        for b_layout in ("row", "col"):
            cases.append(GroupedCase(kernel, "batch", (block_m + 8,) * 3, n=200, k=72, out_dtype="float16",
                                     a_layout="col", b_layout=b_layout, bias=True, config=key))
            cases.append(GroupedCase(kernel, "masked", (0, block_m + 1, block_m + 8, 7), n=72, k=88, a_layout="col",
                                     b_layout=b_layout, capacity=block_m + 8, residual=True, device_sizes=False,
                                     config=key))
    # a 16-bit bias whose rows lie N + 1 apart: the odd groups' rows start off pair alignment
    for dtype in BIAS_DTYPES[1:]:
        cases.append(GroupedCase(kernel, "masked", (3, block_m + 1, 0, 70), n=72, k=40, bias=True, bias_dtype=dtype,
                                 bias_pad=1, out_dtype="float16", config=key))
    # contiguous groups with a residual read through each group's view (its rows start `base` rows
    # into C, at C's pitch, not D's): a 16-bit C whose rows TMA cannot read (pitch N + 2) and an FP32
    # C, each beside a D of another pitch
    for mode, out_dtype in (("sizes", "float16"), ("offsets", "float32")):
        cases.append(GroupedCase(kernel, mode, (3, block_m + 1, 0, 70), n=72, k=40, out_dtype=out_dtype,
                                 residual=True, c_pad=2, pad=8, device_sizes=mode == "sizes", config=key))
    # a wide N (several 256-column tiles) and K over several k-blocks; K = 0 (the epilogue alone)
    cases.append(GroupedCase(kernel, "sizes", (200, 0, 300, 129), n=520, k=296, out_dtype="float16", config=key))
    cases.append(GroupedCase(kernel, "batch", (77,) * 3, n=64, k=0, bias=True, config=key))
    if not _needs_tma(kernel):   # N and K that are not multiples of 8 (TMA kernels refuse them)
        cases.append(GroupedCase(kernel, "masked", (5, 64, 0, 130), n=33, k=17, a_layout="col", config=key))
        # A column-major A whose rows are whole 16 bytes, cut into groups that start off that
        # alignment: V5 refuses it (its TMA boxes would start unaligned), so "auto" must choose
        # another kernel; each B layout whose other dimensions V5 could take
        cases.append(GroupedCase(kernel, "offsets", (1, 46, 1, 0, 24), n=40, k=24, a_layout="col", config=key))
        cases.append(GroupedCase(kernel, "sizes", (41, 39), n=88, k=16, out_dtype="float16", a_layout="col",
                                 b_layout="row", residual=True, config=key))
    return cases


def _needs_tma(kernel: str) -> bool:
    from deepgemm import registry
    return kernel != "auto" and registry.get(kernel).loads_by_tma


def grouped_problems(kernel: str = "auto", max_groups: int = 8, max_rows: int = 300, max_dim: int = 300):
    """A hypothesis strategy of GroupedCase: mode, group sizes (shrinking to fewer, smaller groups),
    N, K, layouts, dtypes, epilogue, where the sizes live."""
    from hypothesis import strategies as st

    @st.composite
    def build(draw):
        mode = draw(st.sampled_from(MODES))
        sizes = draw(st.lists(st.integers(0, max_rows), min_size=1, max_size=max_groups))
        if mode == "batch":
            sizes = [sizes[0]] * len(sizes)
        return GroupedCase(kernel, mode, tuple(sizes), n=draw(st.integers(1, max_dim)), k=draw(st.integers(1, max_dim)),
                           dtype=draw(st.sampled_from(["float16", "bfloat16"])),
                           out_dtype=draw(st.sampled_from(["float32", "float16", "bfloat16"])),
                           a_layout=draw(st.sampled_from(["row", "col"])), b_layout=draw(st.sampled_from(["row", "col"])),
                           bias=draw(st.booleans()), bias_dtype=draw(st.sampled_from(BIAS_DTYPES)),
                           bias_pad=draw(st.sampled_from([0, 0, 1, 2])), residual=draw(st.booleans()),
                           activation=draw(st.sampled_from([None, "relu"])), device_sizes=draw(st.booleans()),
                           pad=draw(st.sampled_from([0, 0, 3, 8])))
    return build()


def sample(kernel: str) -> list[GroupedCase]:
    """A few cases for compute-sanitizer: each mode, edges of tiles and of the buffer; for V5 also
    with the 64-row tiles its dispatch rule takes for short groups."""
    from deepgemm import dispatch
    extras = extra_cases(kernel)
    picked = [c for c in grouped_cases(kernel) if c not in extras][::4][:8] + extras
    if kernel == "v5":
        picked += grouped_cases(kernel, config=dispatch.v5_short_config())[1::6]   # 20 cases in all: a sanitizer run's share
    return picked


def main(argv=None) -> int:
    from deepgemm.testing.sanitize import exact_allocations, sample_done
    kernel = (argv or sys.argv[1:])[0]
    exact_allocations()
    cases = sample(kernel)
    for i, case in enumerate(cases):
        print(f"case {case}", flush=True)   # before it runs: a report names the case it came from
        run_grouped_case(case, np.random.default_rng(i))
    print(sample_done(len(cases)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
