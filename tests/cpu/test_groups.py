"""Batched/grouped problems on the host (deepgemm.groups): batch broadcasting, one stride per
operand, the checks on group sizes, and the host model of the kernels' group walk."""
import numpy as np
import pytest

from deepgemm import groups


def test_batch_dimensions_broadcast_as_torch_matmul():
    assert groups.broadcast_batch({"a": (8, 1), "b": (4,)}) == (8, 4)
    assert groups.broadcast_batch({"a": (), "b": (3,)}) == (3,)
    assert groups.broadcast_batch({"a": (2, 3), "b": (2, 3)}) == (2, 3)
    with pytest.raises(ValueError, match=r"^b: batch dimensions \(4,\) do not broadcast with \(3,\)"):
        groups.broadcast_batch({"a": (3,), "b": (4,)})
    with pytest.raises(ValueError, match=r"^bias: batch dimensions \(2,\) do not broadcast to \(3,\)"):
        groups.group_stride("bias", (2,), (8,), (3,))


@pytest.mark.parametrize("shape, strides, batch, stride", [
    ((6,), (20,), (6,), 20),                 # a plain batch
    ((2, 3), (60, 20), (2, 3), 20),          # contiguous batch dimensions collapse
    ((), (), (5,), 0),                       # a 2-D operand shared by every batch
    ((1,), (999,), (5,), 0),                 # a size-1 batch broadcast
    ((2, 1), (20, 7), (2, 1), 20),           # size-1 dimensions have no stride to respect
    ((3,), (0,), (3,), 0),                   # an expanded (stride 0) operand
    ((1, 1), (40, 20), (1, 1), 0),           # one group: nothing to step over
])
def test_one_stride_per_operand(shape, strides, batch, stride):
    assert groups.group_stride("a", shape, strides, batch) == stride


def test_batches_that_need_two_strides_are_refused_by_name():
    # b repeats with period 3 over a (2, 3) batch: no single stride walks it.
    with pytest.raises(ValueError, match=r"^b: its batch dimensions \(1, 3\) .*cannot be walked with one stride"):
        groups.group_stride("b", (1, 3), (0, 20), (2, 3))
    # a transposed batch (heads before batch in memory)
    with pytest.raises(ValueError, match=r"^a: "):
        groups.group_stride("a", (2, 3), (20, 40), (2, 3))


def test_negative_batch_strides_are_refused_by_name():
    # One stride walks x[::-1] of a batch, but backwards: refused rather than passed to the kernel.
    with pytest.raises(ValueError, match=r"^a: negative batch strides \(-20,\) are not supported"):
        groups.group_stride("a", (3,), (-20,), (3,))
    with pytest.raises(ValueError, match=r"^c: negative batch strides \(-60, -20\)"):
        groups.group_stride("c", (2, 3), (-60, -20), (2, 3))
    assert groups.group_stride("a", (1,), (-20,), (3,)) == 0   # a size-1 batch is broadcast: no stride


def test_host_sizes_are_read_as_integers():
    assert groups.host_rows([3, 0, 5], "sizes").tolist() == [3, 0, 5]
    assert groups.host_rows(np.array([1, 2], np.int32), "sizes").dtype == np.int64
    with pytest.raises(TypeError, match=r"^sizes: expected integers"):
        groups.host_rows([1.5, 2.0], "sizes")
    with pytest.raises(ValueError, match=r"^offsets: expected a 1-D sequence"):
        groups.host_rows([[0, 1]], "offsets")
    # Booleans are integers to Python, but [True, False] is a mask, not two group sizes.
    for flags in ([True, False], np.array([True, True])):
        with pytest.raises(TypeError, match=r"^masked_m: expected integers, got dtype bool"):
            groups.host_rows(flags, "masked_m")
    # An object array of Python ints (what NumPy makes of ints past int64's range, or of a mix
    # with other objects) is still integers; only the conversion decides whether they fit.
    assert groups.host_rows(np.array([3, 4], dtype=object), "sizes").tolist() == [3, 4]
    assert groups.host_rows([], "sizes").tolist() == []
    # Values the int64 conversion cannot hold (it would raise OverflowError, or wrap uint64 around).
    for huge in ([2**64, 0], [-2**70], np.array([2**63], np.uint64)):
        with pytest.raises(ValueError, match=r"^sizes: values past the 64-bit integers"):
            groups.host_rows(huge, "sizes")
    assert groups.host_rows(np.array([2**63 - 1], np.uint64), "sizes").tolist() == [2**63 - 1]


def test_host_sizes_as_cpu_tensors():
    torch = pytest.importorskip("torch")
    assert groups.host_rows(torch.tensor([3, 4], dtype=torch.int32), "sizes").tolist() == [3, 4]
    # Named, where .numpy() would raise its own error (bfloat16) or a RuntimeError (grad)
    for floats in (torch.ones(2, dtype=torch.bfloat16), torch.ones(2, requires_grad=True)):
        with pytest.raises(TypeError, match=r"^offsets: expected integers, got dtype torch\."):
            groups.host_rows(floats, "offsets")


@pytest.mark.parametrize("shape, strides", [
    ((3, 4, 5), (20, 5, 1)),            # contiguous
    ((3, 4, 5), (64, 8, 1)),            # padded rows and batches
    ((3, 4, 5), (5, 15, 1)),            # batches interleaved within the rows ([B, M, N] of [M, B, N])
    ((3, 4, 5), (-20, 5, 1)),           # walked backwards
    ((2, 3, 4, 5), (20, 40, 5, 1)),     # permuted batch dimensions
    ((3, 1, 5), (5, 0, 1)),             # a size-1 dimension's stride means nothing
    ((3, 2), (2, 3)),                   # apart, but not nested: decided by listing the addresses
    ((0, 4), (0, 0)),                   # empty
])
def test_layouts_whose_elements_are_apart(shape, strides, monkeypatch):
    if shape != (3, 2):   # nested strides decide alone: no address is listed (an output's check per call)
        monkeypatch.setattr(groups, "np", _NoListing())
    assert groups.overlapping(shape, strides) is False


class _NoListing:
    def __getattr__(self, name):
        raise AssertionError(f"overlapping() listed the addresses (np.{name}) where the strides decide")


@pytest.mark.parametrize("shape, strides", [
    ((3, 4, 5), (0, 5, 1)),             # broadcast batches
    ((3, 4, 5), (5, 5, 1)),             # batches one row apart
    ((3, 4, 5), (20, 4, 1)),            # rows overlap
    ((2, 2), (1, 1)),                   # equal strides
    ((4, 3), (2, 3)),                   # 0 + 6 == 3 * 2: only the listing tells
    ((5000, 300), (0, 1)),              # broadcast, too many elements to list
])
def test_layouts_whose_elements_overlap(shape, strides):
    assert groups.overlapping(shape, strides) is True


def test_addresses_are_listed_up_to_the_limit_and_no_further():
    # Rows 512 apart, 1024 wide: rows overlap, which only the listing tells (the strides do not nest).
    rows = groups.OVERLAP_LISTING_LIMIT // 1024
    assert groups.overlapping((rows, 1024), (512, 1))
    assert groups.overlapping((rows + 1, 1024), (512, 1)) is False   # past the limit: taken as apart


@pytest.mark.parametrize("check, values, groups_, rows, message", [
    (groups.check_sizes, [3, 4], 3, 7, r"^sizes: expected 3 group sizes"),
    (groups.check_sizes, [3, -1, 5], 3, 7, r"^sizes: group 1 has a negative size -1"),
    (groups.check_sizes, [3, 4, 5], 3, 11, r"^sizes: the group sizes add up to 12, but a has 11 rows"),
    (groups.check_offsets, [0, 4, 2, 7], 3, 7, r"^offsets: out of order at group 1 \(4 > 2\)"),
    # the first bad group, past empty ones (a size or step of 0 is allowed)
    (groups.check_sizes, [0, 2, 0, -3, 8], 5, 7, r"^sizes: group 3 has a negative size -3"),
    (groups.check_offsets, [0, 0, 4, 4, 3, 7], 5, 7, r"^offsets: out of order at group 3 \(4 > 3\)"),
    (groups.check_masked, [0, 8, 0, 9], 4, 8, r"^masked_m: group 3 has 9 rows"),
    (groups.check_offsets, [1, 4, 7], 2, 7, r"^offsets: must start at 0 and end at a's 7 rows, got 1 \.\.\. 7$"),
    (groups.check_offsets, [0, 4, 6], 2, 7, r"^offsets: must start at 0 and end at a's 7 rows, got 0 \.\.\. 6$"),
    (groups.check_masked, [3], 2, 8, r"^masked_m: expected 2 counts \(one per group\), got 1$"),
    (groups.check_offsets, [0, 7], 2, 7, r"^offsets: expected 3 row offsets"),
    (groups.check_masked, [3, 9], 2, 8, r"^masked_m: group 1 has 9 rows, outside 0..8"),
    (groups.check_masked, [-1, 0], 2, 8, r"^masked_m: group 0 has -1 rows"),
])
def test_bad_group_sizes_name_the_argument_and_the_group(check, values, groups_, rows, message):
    with pytest.raises(ValueError, match=message):
        check(np.array(values, np.int64), groups_, rows)


def test_good_group_sizes_pass():
    groups.check_sizes(np.array([0, 0, 7, 0]), 4, 7)
    groups.check_offsets(np.array([0, 0, 3, 7]), 3, 7)
    groups.check_masked(np.array([0, 8]), 2, 8)


def test_row_ranges_model_the_kernels_clamping():
    assert groups.row_ranges("batch", None, 2, 5) == [(0, 5), (0, 5)]
    assert groups.row_ranges("masked", np.array([3, -2, 9]), 3, 8) == [(0, 3), (0, 0), (0, 8)]
    assert groups.row_ranges("sizes", np.array([2, 0, 3]), 3, 5) == [(0, 2), (2, 0), (2, 3)]
    # sizes past the rows are cut at the end of a; negative ones count as empty
    assert groups.row_ranges("sizes", np.array([4, -1, 4]), 3, 6) == [(0, 4), (4, 0), (4, 2)]
    assert groups.row_ranges("offsets", np.array([0, 2, 2, 9]), 3, 6) == [(0, 2), (2, 0), (2, 4)]
    assert groups.row_ranges("offsets", np.array([5, 3]), 1, 6) == [(5, 0)]   # out of order: empty
    with pytest.raises(ValueError, match=r"^mode: unknown group mode 'experts'"):
        groups.row_ranges("experts", np.array([1]), 1, 6)


@pytest.mark.parametrize("seed", range(20))
def test_tile_bound_covers_every_group_pattern(seed):
    rng = np.random.default_rng(seed)
    g = int(rng.integers(1, 40))
    sizes = rng.choice([0, 1, 127, 128, 129, 1000], size=g)
    m = int(sizes.sum())
    tiles = sum(-(-count // 128) for _, count in groups.row_ranges("sizes", sizes, g, m))
    assert tiles <= groups.tile_bound("sizes", g, m, 128)


@pytest.mark.parametrize("mode", ["batch", "masked"])
def test_tile_bound_of_groups_with_their_own_buffers(mode):
    # m: the rows of each group's buffer; every group may fill it, so every group counts whole
    g, m = 3, 300
    counts = np.full(g, m)
    tiles = sum(-(-count // 128) for _, count in groups.row_ranges(mode, counts, g, m))
    assert tiles == 9 and groups.tile_bound(mode, g, m, 128) == 9
    assert groups.tile_bound(mode, g, 0, 128) == 0


def test_outer_dimensions_to_loop_over():
    # b shared over the first dimension, batched over the second: loop over the first
    assert groups.outer_dims((2, 3), {"a": ((2, 3), (1920, 640)), "b": ((3,), (64,))}) == 1
    assert groups.outer_dims((2, 3), {"a": ((2, 3), (1920, 640)), "b": ((), ())}) == 0
    assert groups.outer_dims((4,), {"a": ((4,), (64,))}) == 0
    with pytest.raises(ValueError, match=r"^c: batch dimensions \(5,\) do not broadcast"):
        groups.outer_dims((2, 3), {"a": ((2, 3), (1920, 640)), "c": ((5,), (64,))})
    assert groups.broadcast_index((1,), (3,), (2, 3)) == ()
    assert groups.broadcast_index((1,), (1, 3), (2, 3)) == (0,)
    assert groups.broadcast_index((1, 2), (2, 3), (2, 3)) == (1, 2)
