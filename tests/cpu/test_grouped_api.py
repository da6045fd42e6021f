"""Batched gemm() and grouped_gemm() on a CPU: what reaches the kernel (group fields, strides,
the grouped build, the grid) and every argument error, with fake device arrays; and the grouped
oracle itself (deepgemm.testing.grouped) passing a correct NumPy implementation and failing
planted bugs."""
import itertools
import types

import numpy as np
import pytest

import deepgemm
from deepgemm import api, arrays, dispatch, registry
from deepgemm.testing import grouped as tg

from fake_gpu import F, FakeDeviceArray, as_fake, captured, fake_encode, gpus  # noqa: F401 (fixtures)


def I32(*shape):
    return FakeDeviceArray(shape, dtype="int32", base_ptr=7 << 30)


@pytest.fixture
def uploads(monkeypatch, captured):
    """Host group sizes 'copied to the device': recorded, at a fake address."""
    seen = []

    def upload(host, fw, dev):
        seen.append(host.tolist())
        return types.SimpleNamespace(data=types.SimpleNamespace(ptr=9 << 30))
    monkeypatch.setattr(api, "_upload_rows", upload)
    return seen


def field(launch, name):
    return int(launch["params"][name])


def test_strided_batch_is_one_grouped_launch(captured):
    deepgemm.gemm(F(6, 100, 72), F(6, 72, 40), kernel="v4")
    (launch,) = captured
    assert ".grouped[" in launch["compiled"].name
    assert (field(launch, "groups"), field(launch, "group_mode")) == (6, registry.GROUP_MODES["batch"])
    assert (field(launch, "stride_a"), field(launch, "stride_b"), field(launch, "stride_d")) == (7200, 2880, 4000)
    assert (field(launch, "m"), field(launch, "n"), field(launch, "k")) == (100, 40, 72)


def test_shared_weight_over_back_to_back_batches_is_one_tall_gemm(captured):
    deepgemm.gemm(F(6, 100, 72), F(72, 40), kernel="v4")
    (launch,) = captured
    assert ".grouped[" not in launch["compiled"].name
    assert field(launch, "m") == 600 and "groups" not in launch["params"].dtype.names


def test_shared_weight_with_column_major_batches_stays_grouped(captured):
    a = FakeDeviceArray((6, 100, 72), strides=(2 * 7200, 2, 200))   # each matrix column-major
    deepgemm.gemm(a, F(72, 40), kernel="v4")
    (launch,) = captured
    assert field(launch, "groups") == 6 and field(launch, "stride_b") == 0 and field(launch, "stride_a") == 7200


def test_a_batched_call_takes_a_scalar_scale_and_absent_operands(captured):
    """A given out is checked apart from each operand array; a scalar scale, and no bias or c, are
    skipped, not taken for arrays."""
    deepgemm.gemm(F(3, 16, 8), F(3, 8, 24), kernel="v4", scale=0.5, out=F(3, 16, 24))
    deepgemm.gemm(F(3, 16, 8), F(3, 8, 24), kernel="v4", scale=2, bias=F(3, 24, dtype="float32"), out=F(3, 16, 24))
    assert len(captured) == 2 and all(field(x, "groups") == 3 for x in captured)


def test_a_batched_out_may_touch_an_operand_but_not_share_a_byte(captured):
    a_base, a_bytes = 1 << 30, 3 * 16 * 8 * 2
    a = F(3, 16, 8, base_ptr=a_base)
    deepgemm.gemm(a, F(3, 8, 24), kernel="v4", out=F(3, 16, 24, base_ptr=a_base + a_bytes))          # right after a
    deepgemm.gemm(a, F(3, 8, 24), kernel="v4", out=F(3, 16, 24, base_ptr=a_base - 3 * 16 * 24 * 2))   # right before
    assert len(captured) == 2
    for at in (a_base + a_bytes - 2, a_base - 3 * 16 * 24 * 2 + 2):                                   # one element in
        with pytest.raises(ValueError, match=r"^out: overlaps a in memory"):
            deepgemm.gemm(a, F(3, 8, 24), kernel="v4", out=F(3, 16, 24, base_ptr=at))


def test_back_to_back_batches_fold_up_to_the_size_limit(captured, fake_encode):
    """The folded GEMM's M is a 32-bit field that the kernels round up to whole tiles in 32 bits:
    api.MAX_SIZE rows fold (one batch of a row each, a count only fake arrays make affordable), one
    row more stays a batch."""
    limit = api.MAX_SIZE
    assert limit + 256 <= 2**31 - 1   # a tile's rounding up stays inside int32
    deepgemm.gemm(F(limit, 1, 8), F(8, 16), kernel="v5")
    deepgemm.gemm(F(2, limit // 2 + 1, 8), F(8, 16), kernel="v5")     # limit + 2 rows: two batches
    folded, batched = captured
    assert "groups" not in folded["params"].dtype.names and field(folded, "m") == limit
    assert field(batched, "groups") == 2 and field(batched, "m") == limit // 2 + 1
    with pytest.raises(ValueError, match=rf"^a, b: {limit + 1} batches exceed the supported maximum {limit}"):
        deepgemm.gemm(F(limit + 1, 1, 8), F(8, 16), kernel="v5")
    with pytest.raises(ValueError, match=rf"^b: {limit + 1} groups exceed the supported maximum {limit}"):
        deepgemm.grouped_gemm(F(4, 8), F(limit + 1, 8, 16), offsets=[0, 4])   # counted before the offsets
    with pytest.raises(ValueError, match=r"^offsets: "):   # limit groups pass the count, and reach the offsets
        deepgemm.grouped_gemm(F(4, 8), F(limit, 8, 16), offsets=[0, 4])


def test_batch_dimensions_broadcast_and_collapse(captured):
    assert deepgemm.gemm(F(2, 3, 65, 72), F(72, 136), kernel="v4").shape == (2, 3, 65, 136)   # folded: 390 rows
    assert deepgemm.gemm(F(1, 65, 72), F(5, 72, 136), kernel="v4").shape == (5, 65, 136)      # a shared by 5 batches
    fold, shared_a = captured
    assert field(fold, "m") == 390
    assert (field(shared_a, "groups"), field(shared_a, "stride_a"), field(shared_a, "stride_b")) == (5, 0, 72 * 136)
    # as torch.matmul's [2, 3, M, K] @ [3, K, N]: no one stride walks both batch dimensions of a,
    # so one launch per index of the outer one, into the one result returned
    d = deepgemm.gemm(F(2, 3, 65, 72), F(3, 72, 136), kernel="v4")
    assert d.shape == (2, 3, 65, 136) and len(captured) == 4
    assert {field(launch, "groups") for launch in captured[2:]} == {3}


def test_a_folded_batch_is_one_tall_matrix_to_v5s_tensor_maps(captured, fake_encode):
    a = F(6, 100, 72)
    deepgemm.gemm(a, F(72, 40), kernel="v5")
    (launch,) = captured
    assert field(launch, "m") == 600 and "groups" not in launch["params"].dtype.names
    (a_map,) = [call for call in fake_encode if call["ptr"] == a.data.ptr]
    assert tuple(a_map["dims"])[:2] == (72, 600)   # K along a row, then all 600 rows


@pytest.mark.parametrize("a, b, kw, error, message", [
    (F(3, 8, 8), F(4, 8, 8), {}, ValueError, r"^b: batch dimensions \(4,\) do not broadcast"),
    (F(3, 8, 8), F(3, 9, 8), {}, ValueError, r"^b: inner dimensions differ"),
    (F(3, 8, 8), F(3, 8, 8), {"out": F(3, 8, 9)}, ValueError, r"^out: expected shape \(3, 8, 8\)"),
    (F(3, 8, 8), F(3, 8, 8), {"accumulate": "fp16"}, ValueError, r"^accumulate: 'fp16' runs single GEMMs only"),
    (F(3, 8, 8), F(3, 8, 8), {"kernel": "v3"}, ValueError, r"^kernel: 'v3' has no batched/grouped build"),
    (F(3, 8, 8), F(3, 8, 8), {"bias": F(2, 8)}, ValueError, r"^bias: batch dimensions"),
    (F(3, 8, 8), F(3, 8, 8), {"c": F(3, 8, 7)}, ValueError, r"^c: expected the output's shape"),
    (F(3, 8, 8), F(3, 8, 8, dtype="bfloat16"), {}, TypeError, r"^b: dtype must match a"),
    (F(8), F(3, 8, 8), {}, ValueError, r"^a: expected a matrix or a batch of matrices, got 1-D with shape \(8,\)"),
    (F(3, 8, 8), F(8), {}, ValueError, r"^b: expected a matrix or a batch of matrices, got 1-D with shape \(8,\)"),
])
def test_batched_errors_name_the_argument(captured, a, b, kw, error, message):
    with pytest.raises(error, match=message):
        deepgemm.gemm(a, b, **kw)


def test_a_batch_walked_backwards_runs_one_gemm_per_matrix(captured):
    # x[::-1] of a batch: one stride would walk it, but a negative one, which the grouped kernels'
    # tensor maps and group walk do not take; each matrix then runs as a plain GEMM at its address.
    a = FakeDeviceArray((3, 8, 8), strides=(-128, 16, 2), offset=128)
    bias = FakeDeviceArray((3, 8), strides=(-16, 2), offset=16)
    deepgemm.gemm(a, F(3, 8, 8), bias=bias, kernel="v4")
    assert len(captured) == 3 and all("groups" not in c["params"].dtype.names for c in captured)   # plain GEMMs
    assert [field(c, "a") - a.data.ptr for c in captured] == [0, -128, -256]
    assert [field(c, "bias") - bias.data.ptr for c in captured] == [0, -16, -32]


def test_batches_one_stride_cannot_walk_loop_over_the_leading_dimension(captured):
    # b repeats with period 3 over the (2, 3) batch (torch.matmul broadcasting): one launch per
    # index of the first batch dimension, each a batch of 3
    deepgemm.gemm(F(2, 3, 8, 8), F(3, 8, 8), kernel="v4")
    assert [(field(x, "groups"), field(x, "stride_b")) for x in captured] == [(3, 64), (3, 64)]
    assert captured[1]["params"]["a"] - captured[0]["params"]["a"] == 3 * 64 * 2   # bytes: the next 3 matrices
    captured.clear()
    # batch strides in the wrong order (a permuted tensor): a launch per matrix of the outer dimension
    deepgemm.gemm(F(2, 3, 8, 8), FakeDeviceArray((2, 3, 8, 8), strides=(128, 256, 16, 2)), kernel="v4")
    assert len(captured) == 2 and all(field(x, "stride_b") == 128 for x in captured)


@pytest.mark.parametrize("mode", ["sizes", "offsets"])
def test_a_column_major_a_of_contiguous_groups_goes_past_v5(uploads, captured, fake_encode, mode):
    """Such groups may start at any row of A's contiguous dimension, where V5's TMA boxes cannot
    start: "auto" takes V4 (a row-major A, and a batched column-major one, stay on V5), and a call
    that names V5 is refused, naming a."""
    a_col = FakeDeviceArray((72, 24), strides=(2, 2 * 72))   # 72 rows: whole 16 bytes, as TMA needs
    value = [1, 46, 1, 0, 24] if mode == "sizes" else [0, 1, 47, 48, 48, 72]
    b = FakeDeviceArray((5, 24, 40), strides=(2 * 24 * 40, 2, 2 * 24))   # each group's w.T
    deepgemm.grouped_gemm(a_col, b, **{mode: value}, out_dtype="float32")
    deepgemm.grouped_gemm(F(72, 24), b, **{mode: value}, out_dtype="float32")
    deepgemm.gemm(FakeDeviceArray((5, 72, 24), strides=(2 * 72 * 24, 2, 2 * 72)), b, out_dtype="float32")
    assert [x["compiled"].name.split("[")[0] for x in captured] == ["v4.grouped", "v5.grouped", "v5.grouped"]
    with pytest.raises(ValueError, match=r"a is column-major \(M-contiguous\).*row-major \(K-contiguous\) a"):
        deepgemm.grouped_gemm(a_col, b, **{mode: value}, kernel="v5")


def test_weights_stacked_backwards_go_past_v5_after_the_same_call_forwards(uploads, captured, fake_encode):
    """b[::-1] steps back one weight per group; TMA's strides cannot, so "auto" takes V4, also once
    the same geometry with b forwards has put V5's choice in the decision cache (the cache once
    keyed a group stride on its 16-byte alignment only, which -5760 shares with 5760)."""
    fwd = F(3, 72, 80)
    rev = FakeDeviceArray((3, 72, 80), strides=(-2 * 72 * 80, 2 * 80, 2), offset=2 * 2 * 72 * 80)
    deepgemm.grouped_gemm(F(96, 72), fwd, sizes=[40, 16, 40])
    deepgemm.grouped_gemm(F(96, 72), rev, sizes=[40, 16, 40])
    assert [x["compiled"].name.split("[")[0] for x in captured] == ["v5.grouped", "v4.grouped"]
    assert field(captured[1], "stride_b") == -72 * 80
    with pytest.raises(ValueError, match=r"b's group stride -5760 is negative"):
        deepgemm.grouped_gemm(F(96, 72), rev, sizes=[40, 16, 40], kernel="v5")


@pytest.mark.parametrize("kw", [dict(sizes=[40, 16, 40]), dict(offsets=[0, 40, 56, 96])])
def test_host_sizes_during_a_graph_capture_are_refused_by_name(uploads, captured, fake_encode, monkeypatch, kw):
    """CUDA refuses a copy from host memory while a stream captures a graph (and a replay would copy
    from memory freed by then): the call says which argument to give as a device array instead."""
    monkeypatch.setattr(arrays, "capturing", lambda fw, device=0: True)
    (name,) = kw
    with pytest.raises(ValueError, match=rf"^{name}: host values cannot be copied to the GPU while a CUDA graph "
                                         r"is being captured.*int32 device array"):
        deepgemm.grouped_gemm(F(96, 72), F(3, 72, 80), **kw)
    assert uploads == [] and captured == []
    deepgemm.grouped_gemm(F(96, 72), F(3, 72, 80), sizes=I32(3))   # device sizes: captured as they are
    assert len(captured) == 1


def test_contiguous_groups_with_device_sizes(captured):
    sizes = I32(4)
    deepgemm.grouped_gemm(F(300, 64), F(4, 64, 128), sizes=sizes, kernel="v4", bias=F(4, 128))
    (launch,) = captured
    assert (field(launch, "groups"), field(launch, "group_mode")) == (4, registry.GROUP_MODES["sizes"])
    assert field(launch, "group_rows") == sizes.data.ptr
    assert (field(launch, "stride_a"), field(launch, "stride_b"), field(launch, "stride_d")) == (0, 64 * 128, 0)
    assert field(launch, "stride_bias") == 128 and field(launch, "m") == 300


def test_host_sizes_are_checked_then_copied(uploads):
    deepgemm.grouped_gemm(F(7, 16), F(3, 16, 8), offsets=[0, 3, 3, 7], kernel="v4")
    deepgemm.grouped_gemm(F(3, 5, 16), F(3, 16, 8), masked_m=np.array([0, 5, 2]), kernel="v4")
    assert uploads == [[0, 3, 3, 7], [0, 5, 2]]


@pytest.mark.parametrize("a, b, kw, error, message", [
    (F(7, 16), F(3, 16, 8), {"sizes": [3, 4]}, ValueError, r"^sizes: expected 3 group sizes"),
    (F(7, 16), F(3, 16, 8), {"sizes": [3, -1, 5]}, ValueError, r"^sizes: group 1 has a negative size"),
    (F(7, 16), F(3, 16, 8), {"sizes": [3, 1, 1]}, ValueError, r"^sizes: the group sizes add up to 5, but a has 7"),
    (F(7, 16), F(3, 16, 8), {"offsets": [0, 5, 4, 7]}, ValueError, r"^offsets: out of order at group 1"),
    (F(7, 16), F(3, 16, 8), {"sizes": [7, 0, 0], "offsets": [0, 7, 7, 7]}, ValueError, r"^sizes, offsets, masked_m: give exactly one"),
    (F(7, 16), F(3, 16, 8), {}, ValueError, r"^sizes, offsets, masked_m: give exactly one .* got none"),
    (F(7, 16), F(16, 8), {"sizes": [7]}, ValueError, r"^b: expected the groups' weights stacked as \[G, K, N\]"),
    (F(2, 7, 16), F(2, 16, 8), {"sizes": [7, 7]}, ValueError, r"^a: sizes groups take a as \[M, K\]"),
    (F(7, 16), F(2, 16, 8), {"masked_m": [7, 7]}, ValueError, r"^a: masked groups take a as \[G, M_max, K\]"),
    (F(3, 7, 16), F(2, 16, 8), {"masked_m": [7, 7]}, ValueError, r"^a: has 3 groups, b has 2"),
    (F(2, 7, 16), F(2, 16, 8), {"masked_m": [7, 8]}, ValueError, r"^masked_m: group 1 has 8 rows, outside 0..7"),
    (F(2, 7, 16), F(2, 16, 8), {"masked_m": [7]}, ValueError, r"^masked_m: expected 2 counts \(one per group\), got 1"),
    (F(7, 16), F(3, 16, 8), {"sizes": FakeDeviceArray((3,), dtype="int64")}, TypeError, r"^sizes: a device array of group sizes must be int32"),
    (F(7, 16), F(3, 16, 8), {"offsets": I32(3)}, ValueError, r"^offsets: expected a 1-D array of 4 values"),
    (F(7, 16), F(3, 16, 8), {"sizes": [1.5, 2, 3]}, TypeError, r"^sizes: expected integers"),
    (F(7, 16), F(3, 16, 8), {"sizes": [2**64, 0, 0]}, ValueError, r"^sizes: values past the 64-bit integers"),
    (F(7, 16), F(3, 16, 8), {"sizes": [7, 0, 0], "bias": F(2, 8)}, ValueError, r"^bias: batch dimensions \(2,\)"),
    (F(7, 16), F(3, 16, 8), {"sizes": [7, 0, 0], "bias": F(3, 9)}, ValueError, r"^bias: expected \[N\] or one row of N=8 per group, got shape \(3, 9\)"),
    (F(7, 16), F(3, 16, 8), {"sizes": [7, 0, 0], "c": F(7, 9)}, ValueError, r"^c: expected the output's shape \(7, 8\)"),
    (F(7, 16), F(3, 16, 8), {"sizes": [7, 0, 0], "kernel": "v0"}, ValueError, r"^kernel: 'v0' has no batched/grouped build"),
    (F(7, 16), F(3, 15, 8), {"sizes": [7, 0, 0]}, ValueError, r"^b: inner dimensions differ"),
])
def test_grouped_errors_name_the_argument(uploads, a, b, kw, error, message):
    with pytest.raises(error, match=message):
        deepgemm.grouped_gemm(a, b, **kw)


def test_a_batched_or_grouped_out_sharing_memory_with_an_operand_is_refused(uploads, captured):
    """As for one GEMM: another batch's or group's tiles may still be reading what out overwrites."""
    a, b = F(4, 16, 16), F(4, 16, 16)
    with pytest.raises(ValueError, match=r"^out: overlaps a in memory"):
        deepgemm.gemm(a, b, kernel="v4", out=a)
    into_b = FakeDeviceArray((4, 16, 16), base_ptr=b.data.ptr + 3 * 16 * 16 * 2)      # from b's last matrix on
    with pytest.raises(ValueError, match=r"^out: overlaps b in memory"):
        deepgemm.gemm(a, b, kernel="v4", out=into_b)
    x, w, out = F(32, 16), F(2, 16, 16), F(32, 16)
    with pytest.raises(ValueError, match=r"^out: overlaps a in memory"):
        deepgemm.grouped_gemm(x, w, sizes=[16, 16], kernel="v4", out=x)
    with pytest.raises(ValueError, match=r"^out: overlaps bias in memory"):
        deepgemm.grouped_gemm(x, w, sizes=[16, 16], kernel="v4", out=out,
                              bias=FakeDeviceArray((2, 16), base_ptr=out.data.ptr + 64))
    with pytest.raises(ValueError, match=r"^out: overlaps c in memory"):
        deepgemm.grouped_gemm(x, w, sizes=[16, 16], kernel="v4", out=out,
                              c=FakeDeviceArray((32, 16), base_ptr=out.data.ptr + 32))
    assert not captured
    deepgemm.grouped_gemm(x, w, sizes=[16, 16], kernel="v4", out=out, c=out)         # in place: supported
    deepgemm.gemm(a, b, kernel="v4", out=F(4, 16, 16))
    assert len(captured) == 2


def test_no_groups_or_rows_launch_nothing(uploads, captured):
    deepgemm.grouped_gemm(F(0, 16), F(3, 16, 8), sizes=[0, 0, 0])
    deepgemm.grouped_gemm(F(0, 5, 16), F(0, 16, 8), masked_m=[])
    deepgemm.gemm(F(0, 5, 16), F(0, 16, 8))
    assert captured == []


# ---- the grouped oracle, on the CPU: it must pass a right answer and fail wrong ones ----------

def _numpy_grouped(bug=None):
    """A NumPy grouped_gemm/gemm with the API's semantics, or with a planted bug."""
    def run(a, b, *, out, bias=None, c=None, activation=None, kernel=None, sizes=None, offsets=None, masked_m=None):
        out_dtype = out.dtype
        g = b.shape[0]
        if masked_m is not None or sizes is None and offsets is None:   # masked or batch
            counts = masked_m if masked_m is not None else [a.shape[-2]] * g
            ranges = [(0, int(x)) for x in counts]
        else:
            offs = np.asarray(offsets) if offsets is not None else np.concatenate([[0], np.cumsum(sizes)])
            ranges = [(int(offs[i]), int(offs[i + 1] - offs[i])) for i in range(g)]
        for grp, (base, size) in enumerate(ranges):
            if bug == "past_count" and masked_m is not None:
                size = a.shape[1]
            if bug == "wrong_weight":
                grp_b = (grp + 1) % g
            else:
                grp_b = grp
            a_g = a[grp] if a.ndim == 3 else a
            rows = slice(base, base + size)
            d = a_g[rows].astype(np.float64) @ b[grp_b].astype(np.float64)
            if bias is not None and bug != "ignores_bias":
                d = d + bias[grp].astype(np.float64)
            if activation == "relu":
                d = np.maximum(d, 0)
            if c is not None and bug != "ignores_residual":
                d = d + (c[grp] if a.ndim == 3 else c)[rows]
            (out[grp] if a.ndim == 3 else out)[rows] = d.astype(out_dtype)
        if bug == "writes_padding":   # one element past row 0's last column, into the row's padding
            first = out[0] if out.ndim == 3 else out
            np.lib.stride_tricks.as_strided(first, (1, first.shape[1] + 1), first.strides)[0, -1] = 1
        return out
    return run


@pytest.mark.parametrize("bug", [None, "past_count", "wrong_weight", "ignores_bias", "ignores_residual",
                                 "writes_padding"])
@pytest.mark.parametrize("mode", tg.MODES)
def test_grouped_oracle_passes_right_and_fails_wrong(monkeypatch, bug, mode):
    fake = _numpy_grouped(bug)
    monkeypatch.setattr(deepgemm, "grouped_gemm", fake)
    monkeypatch.setattr(deepgemm, "gemm", lambda a, b, **kw: fake(a, b, **kw))
    sizes = (5, 5, 5) if mode == "batch" else (0, 3, 9)
    case = tg.GroupedCase("v4", mode, sizes, n=8, k=16, bias=True, residual=True, activation="relu",
                          device_sizes=False, pad=2)
    should_fail = bug in ("wrong_weight", "ignores_bias", "ignores_residual", "writes_padding") or (
        bug == "past_count" and mode == "masked")
    if should_fail:
        with pytest.raises(AssertionError):
            tg.run_grouped_case(case, np.random.default_rng(0), xp=np)
    else:
        tg.run_grouped_case(case, np.random.default_rng(0), xp=np)


def test_each_grouped_case_hands_over_operands_in_the_layouts_it_names(monkeypatch):
    """A case's a_layout and b_layout are what the call receives (each matrix of a batch or stack
    row- or column-major as named), else a layout the tier claims to cover would never run."""
    class Handed(Exception):
        pass
    seen = []

    def record(a, b, **kw):
        seen.append((a, b))
        raise Handed

    def layout(x):
        if x.shape[-2] < 2 or x.shape[-1] < 2:
            return None   # a single row or column is both
        item = x.dtype.itemsize
        return "row" if x.strides[-1] == item else "col" if x.strides[-2] == item else "neither"
    monkeypatch.setattr(deepgemm, "grouped_gemm", record)
    monkeypatch.setattr(deepgemm, "gemm", record)
    checked = set()
    for case in tg.grouped_cases("v4", "full"):
        with pytest.raises(Handed):
            tg.run_grouped_case(case, np.random.default_rng(0), xp=np)
        a, b = seen.pop()
        for x, named in ((a, case.a_layout), (b, case.b_layout)):
            if layout(x) is not None:
                assert layout(x) == named, (str(case), x.shape, x.strides)
                checked.add(named)
    assert checked == {"row", "col"}


@pytest.mark.parametrize("kernel", ["v4", "v5", "v5-bm64", "auto"])
def test_every_grouped_sweep_case_reaches_its_kernel(monkeypatch, uploads, captured, fake_encode, kernel):
    """Each case of the GPU tier's grouped sweep (quick and full), with the operands, strides and
    alignment run_grouped_case builds, passes the real argument checks and dispatch and reaches the
    kernel it names (a case the kernel refuses would fail the tier on its first run); "auto" reaches
    a kernel with a grouped build. A NumPy stand-in then writes the exact answer, so the oracle's
    checks run as well. The compile is stood in for: only the variant's name is used."""
    from deepgemm import jit
    monkeypatch.setattr(jit, "compile_kernel", lambda name, path, arch, defines: types.SimpleNamespace(name=name))
    exact = _numpy_grouped()

    def through_the_api(real):
        def call(a, b, **kw):
            real(as_fake(a), as_fake(b), **{k: as_fake(v) for k, v in kw.items()})
            with np.errstate(over="ignore"):   # a 16-bit output past its range is inf, as the kernel's
                return exact(a, b, **{k: v for k, v in kw.items() if k != "config"})
        return call
    monkeypatch.setattr(deepgemm, "grouped_gemm", through_the_api(deepgemm.grouped_gemm))
    monkeypatch.setattr(deepgemm, "gemm", through_the_api(deepgemm.gemm))
    name, config = ("v5", dispatch.v5_short_config()) if kernel == "v5-bm64" else (kernel, None)
    cases = tg.grouped_cases(name, "full", config=config)
    for i, case in enumerate(cases):
        captured.clear()
        tg.run_grouped_case(case, np.random.default_rng(i), xp=np)
        reached = {launch["compiled"].name.split("[")[0].split(".")[0] for launch in captured}
        allowed = {s.name for s in registry.specs() if s.grouped} | {"small_m"} if name == "auto" else {name}
        assert reached <= allowed and (reached or not sum(case.sizes)), (case, reached)   # no rows: no launch
    assert len(cases) > 50


@pytest.mark.parametrize("kernel", ["v4", "v5"])
def test_the_sanitizer_sample_has_every_mode_and_every_extra_case(kernel):
    picked = tg.sample(kernel)
    assert all(c in picked for c in tg.extra_cases(kernel))
    assert {c.mode for c in picked} == set(tg.MODES) and len(picked) <= 20
    if kernel == "v5":   # and the 64-row tiles its rule takes for short groups, in every mode
        short = tuple(sorted(registry.get("v5").config_defines(dispatch.v5_short_config()).items()))
        assert {c.mode for c in picked if c.config == short and sum(c.sizes)} == set(tg.MODES)


def test_a_fault_in_a_grouped_case_names_the_case(monkeypatch, capsys):
    def faults(*args, **kw):
        raise RuntimeError("cudaErrorIllegalInstruction: an illegal instruction was encountered")
    monkeypatch.setattr(deepgemm, "grouped_gemm", faults)
    case = tg.GroupedCase("v4", "offsets", (1, 46, 1), n=8, k=16, device_sizes=False)
    with pytest.raises(RuntimeError):
        tg.run_grouped_case(case, np.random.default_rng(0), xp=np)
    assert capsys.readouterr().out.startswith(f"RuntimeError in case {case!r}: cudaErrorIllegalInstruction")


def test_a_group_mode_the_kernels_do_not_know_is_refused():
    with pytest.raises(ValueError, match=r"^group mode: must be one of \('batch', 'masked', 'sizes', 'offsets'\), got 'ragged'"):
        registry.Groups("ragged", 2)


def test_a_grouped_case_refuses_what_it_cannot_describe():
    with pytest.raises(ValueError, match=r"^mode: one of \('batch', 'masked', 'sizes', 'offsets'\), got 'ragged'"):
        tg.GroupedCase("v4", "ragged", (3, 4), n=8, k=8)
    with pytest.raises(ValueError, match=r"^mode 'batch': every batch has the same rows"):
        tg.GroupedCase("v4", "batch", (3, 4), n=8, k=8)
    assert tg.GroupedCase("v4", "batch", (3, 3), n=8, k=8).rows == 3


def test_sweep_reaches_every_mode_pattern_and_layout():
    cases = tg.grouped_cases("v4", "full")
    assert {c.mode for c in cases} == set(tg.MODES)
    assert {(c.a_layout, c.b_layout) for c in cases} == {("row", "col"), ("col", "row"), ("row", "row"), ("col", "col")}
    assert any(c.k == 0 for c in cases) and any(sum(c.sizes) == 0 for c in cases)
    assert all(c.n % 8 == 0 and c.k % 8 == 0 for c in tg.grouped_cases("v5"))   # what TMA can take
    # every mode and layout pair with rows to compute, for every grouped kernel and "auto", except
    # the one V5 refuses: a column-major A of contiguous groups
    every = set(itertools.product(tg.MODES, ("row", "col"), ("row", "col")))
    for kernel, refused in (("v4", set()), ("auto", set()),
                            ("v5", {(m, "col", b) for m in tg.CONTIGUOUS for b in ("row", "col")})):
        for config in ([None, dispatch.v5_short_config()] if kernel == "v5" else [None]):
            have = {(c.mode, c.a_layout, c.b_layout) for c in tg.grouped_cases(kernel, config=config)
                    if sum(c.sizes) and c.k}
            assert have == every - refused, (kernel, config, sorted(every - refused - have))
    # Every bias dtype, with rows N apart (pairs aligned in every group) and N + 1 apart (odd groups
    # off pair alignment, where a pair check that skips a dtype or the groups' stride faults), for
    # every grouped kernel and "auto", in the quick tier
    for kernel in ("v4", "v5", "auto"):
        biased = {(c.bias_dtype, (c.n + c.bias_pad) % 2) for c in tg.grouped_cases(kernel)
                  if c.bias and c.k and len(c.sizes) > 1 and any(c.sizes[1::2])}
        assert biased == set(itertools.product(("float32", "float16", "bfloat16"), (0, 1))), (kernel, biased)
    # The quick tier's spread: every value of every other dimension, among cases with rows to compute
    for kernel in ("v4", "v5", "auto"):
        live = [c for c in tg.grouped_cases(kernel) if sum(c.sizes) and c.k]
        for attr, values in (("dtype", {"float16", "bfloat16"}), ("out_dtype", {"float32", "float16", "bfloat16"}),
                             ("bias", {True, False}), ("residual", {True, False}), ("activation", {"relu", None}),
                             ("device_sizes", {True, False}), ("pad", {0, 8})):
            assert {getattr(c, attr) for c in live} == values, (kernel, attr)
        for mode in tg.MODES:
            assert {tuple(c.sizes) for c in live if c.mode == mode} and \
                {c.residual for c in live if c.mode == mode} == {True, False}, (kernel, mode)
    # V5 never gets a column-major A of contiguous groups (it refuses one); "auto" and V4 get one
    # whose rows are whole 16 bytes but whose groups start off that alignment
    assert not [c for c in tg.grouped_cases("v5", "full") if c.a_layout == "col" and c.mode in tg.CONTIGUOUS]
    # The widest tiles (256 columns) more than twice across N with a partial last one, K over
    # several 64-deep k-blocks with a partial last one, between groups of which one is empty
    for kernel in ("v4", "v5", "auto"):
        assert any(c.n > 2 * 256 and c.n % 256 and c.k > 4 * 64 and c.k % 64 and 0 in c.sizes[1:-1]
                   and sum(c.sizes) for c in tg.grouped_cases(kernel)), kernel
    for kernel in ("auto", "v4"):
        for b_layout in ("row", "col"):
            assert any(c.a_layout == "col" and c.b_layout == b_layout and c.mode in tg.CONTIGUOUS and sum(c.sizes) % 8 == 0
                       and any(base % 8 for base in np.cumsum((0,) + c.sizes[:-1])) for c in tg.grouped_cases(kernel))
        # and N and K off every vector width (no TMA there), groups straddling a 64-row tile
        assert any(c.n % 8 and c.k % 8 and any(s > 64 for s in c.sizes) for c in tg.grouped_cases(kernel)), kernel
    # A residual read through each contiguous group's own view of C, at C's pitch: a 16-bit C and an
    # FP32 C, each with rows padded otherwise than D's
    for kernel in ("v4", "v5", "auto"):
        through_views = {c.out_dtype == "float32" for c in tg.grouped_cases(kernel)
                         if c.mode in tg.CONTIGUOUS and c.residual and c.c_pad and c.c_pad != c.pad and sum(c.sizes)}
        assert through_views == {True, False}, kernel


# ---- when a batch may be folded into one tall GEMM --------------------------------------------
# Folding reads a's and out's batches as one M = batch x rows matrix with a's leading dimension,
# applies one bias row and one residual to every row: only right when b and bias are shared and
# a, out and c hold their batches back to back, row-major, within 32-bit row counts.

def _padded(shape, pad):
    """A C-ordered batch whose matrices lie `pad` elements apart beyond their own extent."""
    _, rows, cols = shape
    return FakeDeviceArray(shape, strides=((rows * cols + pad) * 2, cols * 2, 2))


@pytest.mark.parametrize("kw, why", [
    ({"a": _padded((6, 100, 72), 8)}, "a's batches are not back to back"),
    ({"out": _padded((6, 100, 40), 8)}, "out's batches are not back to back"),
    ({"bias": F(6, 40)}, "one bias row per batch"),
    ({"c": F(100, 40)}, "one residual shared by every batch"),
    ({"c": _padded((6, 100, 40), 8)}, "c's batches are not back to back"),
    # Square column-major matrices back to back: the batch stride equals rows x ld, but stacking
    # them gives no column-major tall matrix (its ld would have to be the total row count).
    ({"a": FakeDeviceArray((6, 100, 100), strides=(100 * 100 * 2, 2, 200))}, "a is column-major"),
])
def test_a_shared_weight_batch_is_folded_only_where_the_rows_line_up(captured, kw, why):
    a = kw.pop("a", F(6, 100, 72))
    deepgemm.gemm(a, F(a.shape[2], 40), kernel="v4", **kw)
    (launch,) = captured
    assert ".grouped[" in launch["compiled"].name, why
    assert (field(launch, "groups"), field(launch, "m"), field(launch, "stride_b")) == (6, 100, 0)
    assert field(launch, "stride_a") == a.strides[0] // 2
    if "out" in kw:
        assert field(launch, "stride_d") == kw["out"].strides[0] // 2
    if "bias" in kw:
        assert field(launch, "stride_bias") == 40
    if "c" in kw:
        assert field(launch, "stride_c") == kw["c"].strides[0] // 2 if kw["c"].ndim == 3 else field(launch, "stride_c") == 0


def test_a_batch_of_one_is_one_plain_gemm(captured):
    """[1, M, K] @ [1, K, N] (or a batch dimension of 1 anywhere) is one matrix product: the plain
    build, and an out of shape [1, M, N] is written once, whatever its (unused) batch stride."""
    out = FakeDeviceArray((1, 100, 40), strides=(0, 80, 2))
    assert deepgemm.gemm(F(1, 100, 72), F(1, 72, 40), out=out, kernel="v4") is out
    deepgemm.gemm(F(1, 1, 100, 72), F(72, 40), bias=F(1, 40), kernel="v4")
    for launch in captured:
        assert ".grouped[" not in launch["compiled"].name and field(launch, "m") == 100


def test_a_fold_past_32_bit_rows_stays_a_batch(captured, fake_encode):
    a = F(3, 2**30, 64)      # 3 x 2^30 rows: one tall GEMM would need M over 2^31 - 1
    deepgemm.gemm(a, F(64, 64), kernel="v5")   # (a persistent grid: no grid limit on M)
    (launch,) = captured
    assert (field(launch, "groups"), field(launch, "m")) == (3, 2**30)


def test_a_batch_that_folds_keeps_its_residual_and_pointers(captured):
    a, out, c = F(6, 100, 72, base_ptr=1 << 21), F(6, 100, 40, base_ptr=1 << 23), F(6, 100, 40, base_ptr=1 << 25)
    deepgemm.gemm(a, F(72, 40), out=out, c=c, kernel="v4")
    (launch,) = captured
    assert ".grouped[" not in launch["compiled"].name and field(launch, "m") == 600
    assert (field(launch, "a"), field(launch, "d"), field(launch, "c")) == (a.data.ptr, out.data.ptr, c.data.ptr)
    assert (field(launch, "lda"), field(launch, "ldd"), field(launch, "ldc")) == (72, 40, 40)


# ---- outputs and device group sizes the kernel cannot use ---------------------------------------

def test_an_output_broadcast_over_groups_is_refused(uploads):
    """Every group writing one matrix (an expanded out) would race: refused by name."""
    with pytest.raises(ValueError, match=r"^out: its batch dimensions are broadcast"):
        deepgemm.gemm(F(3, 8, 8), F(3, 8, 8), out=FakeDeviceArray((3, 8, 8), strides=(0, 16, 2)))
    with pytest.raises(ValueError, match=r"^out: its group dimension is broadcast"):
        deepgemm.grouped_gemm(F(3, 8, 16), F(3, 16, 8), masked_m=[8, 8, 8],
                              out=FakeDeviceArray((3, 8, 8), strides=(0, 16, 2)))
    # One group or one batch writes its matrix once: allowed.
    deepgemm.grouped_gemm(F(1, 8, 16), F(1, 16, 8), masked_m=[8], out=FakeDeviceArray((1, 8, 8), strides=(0, 16, 2)),
                          kernel="v4")


def test_an_output_whose_batches_or_groups_overlap_is_refused(uploads):
    """Batches broadcast in a dimension the call loops over, or overlapping through their strides,
    would overwrite one another's results: refused by name. Outputs whose matrices interleave
    without sharing an element (a [B, M, N] view of an [M, B, N] buffer) are not."""
    with pytest.raises(ValueError, match=r"^out: its batch dimensions are broadcast"):   # a loop over dimension 0
        deepgemm.gemm(F(2, 3, 8, 8), F(3, 8, 8), out=FakeDeviceArray((2, 3, 8, 8), strides=(0, 128, 16, 2)))
    with pytest.raises(ValueError, match=r"^out: its elements overlap in memory \(shape \(3, 8, 8\), element "
                                         r"strides \(4, 8, 1\)\): a batch's results"):
        deepgemm.gemm(F(3, 8, 8), F(3, 8, 8), out=FakeDeviceArray((3, 8, 8), strides=(8, 16, 2)))
    with pytest.raises(ValueError, match=r"^out: its elements overlap in memory .*: a group's results"):
        deepgemm.grouped_gemm(F(3, 8, 16), F(3, 16, 8), masked_m=[8, 8, 8],
                              out=FakeDeviceArray((3, 8, 8), strides=(16, 16, 2)))
    assert uploads == []
    deepgemm.gemm(F(3, 8, 8), F(3, 8, 8), out=FakeDeviceArray((3, 8, 8), strides=(16, 48, 2)), kernel="v4")
    deepgemm.grouped_gemm(F(3, 8, 16), F(3, 16, 8), masked_m=[8, 8, 8],
                          out=FakeDeviceArray((3, 8, 8), strides=(16, 48, 2)), kernel="v4")


@pytest.mark.parametrize("call, error, message", [
    (lambda: deepgemm.gemm(F(0, 4, 7), F(0, 7, 3), activation="tanh"), ValueError, r"^activation: must be one of"),
    (lambda: deepgemm.gemm(F(2, 0, 7), F(2, 7, 3), alpha="2"), TypeError, r"^alpha: expected a finite real number"),
    (lambda: deepgemm.gemm(F(2, 4, 7), F(2, 7, 0), beta=0.5), ValueError, r"^beta: given without a residual c"),
    (lambda: deepgemm.gemm(F(0, 4, 7), F(0, 7, 3), bias=F(5)), ValueError, r"^bias: expected N=3 values"),
    (lambda: deepgemm.gemm(F(0, 4, 7), F(0, 7, 3), bias=F(3, dtype="int32")), TypeError, r"^bias: dtype must be one of"),
    (lambda: deepgemm.gemm(F(0, 4, 7), F(0, 7, 3), scale=F(2)), ValueError, r"^scale: expected N=3 values"),
    (lambda: deepgemm.gemm(F(0, 4, 7), F(0, 7, 3), c=F(4, 3, dtype="float64")), TypeError, r"^c: dtype must be one of"),
    (lambda: deepgemm.gemm(F(0, 4, 7), F(0, 7, 3), out=F(0, 4, 3, dtype="int32")), TypeError, r"^out: dtype must be one of"),
    (lambda: deepgemm.gemm(F(0, 4, 7), F(0, 7, 3), out=F(0, 4, 3), out_dtype="fp32"), TypeError, r"^out: dtype float16 differs"),
    (lambda: deepgemm.grouped_gemm(F(0, 16), F(3, 16, 8), sizes=[0, 0, 0], activation="x"), ValueError, r"^activation: "),
    (lambda: deepgemm.grouped_gemm(F(0, 16), F(3, 16, 8), sizes=[0, 0, 0], bias=F(3, 9)), ValueError, r"^bias: expected N=8"),
    (lambda: deepgemm.grouped_gemm(F(0, 16), F(3, 16, 8), sizes=[0, 0, 0], c=F(1, 8)), ValueError, r"^c: expected the output's shape \(0, 8\)"),
    (lambda: deepgemm.grouped_gemm(F(3, 0, 16), F(3, 16, 8), masked_m=[0, 0, 0], scale=float("nan")), TypeError, r"^scale: "),
    (lambda: deepgemm.grouped_gemm(F(0, 0, 16), F(0, 16, 8), masked_m=[], out=F(0, 0, 8, dtype="int8")), TypeError, r"^out: dtype"),
    (lambda: deepgemm.grouped_gemm(F(0, 16), F(3, 12, 8), sizes=[0, 0, 0]), ValueError, r"^b: inner dimensions differ"),
    (lambda: deepgemm.grouped_gemm(F(3, 0, 16), F(3, 12, 8), masked_m=[0, 0, 0]), ValueError, r"^b: inner dimensions differ"),
    (lambda: deepgemm.grouped_gemm(F(0, 16), FakeDeviceArray((3, 16, 8), device=1), sizes=[0, 0, 0]), ValueError,
     r"^b: is on device 1, a on device 0"),
    (lambda: deepgemm.grouped_gemm(F(0, 16), F(3, 16, 8), sizes=[0, 0, 0], out=FakeDeviceArray((0, 8), device=1)),
     ValueError, r"^out: is on device 1, the operands on device 0"),
    (lambda: deepgemm.gemm(F(0, 4, 7), F(0, 7, 3), out=FakeDeviceArray((0, 4, 3), device=1)), ValueError,
     r"^out: is on device 1, the operands on device 0"),
    (lambda: deepgemm.gemm(F(0, 4, 7), FakeDeviceArray((0, 7, 3), device=1)), ValueError, r"^b: is on device 1, a on device 0"),
])
def test_a_call_with_nothing_to_compute_still_checks_its_arguments(uploads, captured, call, error, message):
    """As gemm() for one empty GEMM: an argument that would be refused with rows to compute is
    refused without (a call that works only while it is empty fails later, when it is not)."""
    with pytest.raises(error, match=message):
        call()
    assert captured == []


def test_strides_that_are_no_whole_number_of_elements_are_refused(uploads):
    """A batch or group stride of 3 bytes between float16 matrices would be truncated to one element."""
    with pytest.raises(ValueError, match=r"^a: strides \(3, 14, 2\) are not multiples of the element size 2"):
        deepgemm.gemm(FakeDeviceArray((2, 4, 7), strides=(3, 14, 2)), F(2, 7, 3))
    with pytest.raises(ValueError, match=r"^b: strides \(129, 16, 2\) are not multiples of the element size 2"):
        deepgemm.grouped_gemm(F(7, 8), FakeDeviceArray((2, 8, 8), strides=(129, 16, 2)), sizes=[3, 4])


def test_device_group_sizes_must_be_contiguous_and_on_the_operands_device(captured):
    for groups in (3, 2):   # any count over one: the kernel reads them as consecutive int32
        strided = FakeDeviceArray((groups,), dtype="int32", strides=(8,), base_ptr=7 << 30)
        with pytest.raises(ValueError, match=r"^sizes: must be contiguous"):
            deepgemm.grouped_gemm(F(7, 16), F(groups, 16, 8), sizes=strided, kernel="v4")
    elsewhere = FakeDeviceArray((3,), dtype="int32", device=1, base_ptr=7 << 30)
    with pytest.raises(ValueError, match=r"^sizes: is on device 1, the operands on device 0"):
        deepgemm.grouped_gemm(F(7, 16), F(3, 16, 8), sizes=elsewhere, kernel="v4")
    misaligned = FakeDeviceArray((3,), dtype="int32", base_ptr=(7 << 30) + 2)
    with pytest.raises(ValueError, match=r"^sizes: its address 0x1c0000002 is not a multiple of its element size"):
        deepgemm.grouped_gemm(F(7, 16), F(3, 16, 8), sizes=misaligned, kernel="v4")
    assert captured == []
    deepgemm.grouped_gemm(F(7, 16), F(1, 16, 8), sizes=FakeDeviceArray((1,), dtype="int32", strides=(8,)), kernel="v4")
    assert len(captured) == 1   # one value has no stride to respect


def test_masked_groups_step_one_padded_buffer_per_group(uploads, captured):
    """masked_m: a, out and c are [G, M_max, *] buffers; each group's matrices are one group stride
    (in elements) after the last, padded or not; b's groups are its [G, K, N] stride."""
    a = FakeDeviceArray((3, 5, 16), strides=((5 * 16 + 8) * 2, 32, 2), base_ptr=1 << 21)
    out = FakeDeviceArray((3, 5, 8), strides=((5 * 8 + 24) * 2, 16, 2), base_ptr=1 << 23)
    c = FakeDeviceArray((3, 5, 8), strides=((5 * 8 + 8) * 2, 16, 2), base_ptr=1 << 25)
    deepgemm.grouped_gemm(a, F(3, 16, 8), masked_m=[5, 0, 2], out=out, c=c, kernel="v4")
    (launch,) = captured
    assert (field(launch, "groups"), field(launch, "group_mode")) == (3, registry.GROUP_MODES["masked"])
    assert (field(launch, "m"), field(launch, "n"), field(launch, "k")) == (5, 8, 16)
    assert (field(launch, "stride_a"), field(launch, "stride_b"), field(launch, "stride_d"), field(launch, "stride_c")) \
        == (88, 128, 64, 48)
    assert (field(launch, "a"), field(launch, "d"), field(launch, "c")) == (a.data.ptr, out.data.ptr, c.data.ptr)
    assert field(launch, "group_rows") == 9 << 30 and uploads == [[5, 0, 2]]


def test_contiguous_groups_read_one_residual_by_row_ranges(uploads, captured):
    """sizes/offsets: c is one [M, N] matrix like out, whose row ranges are the groups: no group
    stride (the kernel offsets the rows), as for a and out."""
    c = F(7, 8, base_ptr=1 << 25)
    deepgemm.grouped_gemm(F(7, 16), F(3, 16, 8), offsets=[0, 3, 3, 7], c=c, kernel="v4")
    (launch,) = captured
    assert field(launch, "c") == c.data.ptr and field(launch, "ldc") == 8
    assert (field(launch, "stride_a"), field(launch, "stride_d"), field(launch, "stride_c")) == (0, 0, 0)


@pytest.mark.parametrize("row_major", [True, False])
def test_grouped_inputs_end_at_their_last_element(row_major):
    """The sanitizer sample's grouped operands: column-major ones keep rows padded to 8 elements
    (16-byte strides for TMA) but nothing after the last matrix's last column, so a read past the
    operand leaves its allocation; the values are those of the padded draw."""
    from deepgemm.testing.bounds import integer_inputs
    m = tg._matrices(3, 13, 5, row_major, "float16", 4, np.random.default_rng(7), np, 2 ** 20)
    assert m.shape == (3, 13, 5)
    first = m.__array_interface__["data"][0]
    last = m[-1, -1, -1:].__array_interface__["data"][0]
    owner = m
    while owner.base is not None:   # the array that owns the memory (as_strided wraps it)
        owner = owner.base
    assert (last - first) // 2 + 1 == (3 * 13 * 5 if row_major else (3 * 5 - 1) * 16 + 13)
    if not row_major:
        draw = integer_inputs((3, 5, 16), 4, np.random.default_rng(7), "float16", 2 ** 20)
        assert np.array_equal(m, draw[:, :, :13].transpose(0, 2, 1)) and m.strides == (160, 2, 32)
        assert owner.nbytes == ((3 * 5 - 1) * 16 + 13) * 2   # the allocation ends at the last element
