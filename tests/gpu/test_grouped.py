"""GPU tier: batched and grouped GEMM (deepgemm.testing.grouped) for every kernel with a grouped
build and for "auto": group-size patterns in every mode, checked bit for bit per group with the
output's guard bands; a hypothesis search that shrinks to the smallest failing group pattern;
group sizes that change on the device between CUDA-graph replays; batched gemm() against
torch.matmul's broadcasting."""
import zlib

import numpy as np
import pytest
from hypothesis import given, settings

import deepgemm
from deepgemm import device, dispatch, registry
from deepgemm.testing import sweep
from deepgemm.testing.grouped import GroupedCase, grouped_cases, grouped_problems, run_grouped_case

cupy = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

GROUPED = [s.name for s in registry.specs() if s.grouped]


# V5's 64-row tiles, which the dispatch rule takes for groups of at most 64 rows: every pattern
# at their own row tile's edges
V5_SHORT = dispatch.v5_short_config()
# V5's consumers of two 64-row halves per tile, likewise: 256-row tiles and ping-pong (at a group's
# end some halves are stored row by row, others by TMA)
V5_TALL = next(dict(c) for c in registry.get("v5").config_space if c.get("DG_BM") == 256)
V5_PINGPONG = next(dict(c) for c in registry.get("v5").config_space if c.get("DG_PINGPONG"))


def _params():
    out = []
    for name, config in [(name, None) for name in GROUPED + ["auto"]] + [("v5", V5_SHORT), ("v5", V5_TALL),
                                                                      ("v5", V5_PINGPONG)]:
        tag = name + (("-pingpong" if config.get("DG_PINGPONG") else f"-bm{config['DG_BM']}") if config else "")
        quick = grouped_cases(name, config=config)
        out += [pytest.param(c, id=f"{tag}-{i}") for i, c in enumerate(quick)]
        extra = [c for c in grouped_cases(name, "full", config=config) if c not in quick]
        out += [pytest.param(c, id=f"{tag}-full{i}", marks=pytest.mark.full) for i, c in enumerate(extra)]
    return out


@pytest.mark.parametrize("case", _params())
def test_grouped_patterns(case, selected_kernels):
    if case.kernel != "auto" and case.kernel not in selected_kernels:
        pytest.skip(f"--kernels excludes {case.kernel}")
    why = sweep.not_on_this_gpu(case, device.compute_capability(0))
    if why:
        pytest.skip(why)
    run_grouped_case(case, np.random.default_rng(zlib.crc32(str(case).encode())))


@settings(max_examples=30, deadline=None)
@given(case=grouped_problems())
def test_auto_grouped_is_exact(case):
    run_grouped_case(case, np.random.default_rng(zlib.crc32(str(case).encode())))


def test_device_sizes_change_between_graph_replays():
    """The launch reads the sizes on the device: a captured graph replays with new sizes."""
    torch = pytest.importorskip("torch")
    g, k, n, m = 4, 64, 128, 512
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randint(-3, 4, (m, k), device="cuda", generator=gen).half()
    w = torch.randint(-3, 4, (g, n, k), device="cuda", generator=gen).half()   # nn.Linear-style [G, N, K]
    sizes = torch.tensor([128, 0, 200, 184], dtype=torch.int32, device="cuda")
    out = torch.zeros((m, n), dtype=torch.float32, device="cuda")
    deepgemm.grouped_gemm(x, w.transpose(1, 2), sizes=sizes, out=out)   # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        deepgemm.grouped_gemm(x, w.transpose(1, 2), sizes=sizes, out=out)
    for new in ([0, 512, 0, 0], [1, 1, 1, 509], [300, 100, 100, 12]):
        sizes.copy_(torch.tensor(new, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        base = 0
        for grp, size in enumerate(new):
            expected = x[base:base + size].double() @ w[grp].double().t()
            assert torch.equal(out[base:base + size].double(), expected), f"sizes {new}, group {grp}"
            base += size


def test_host_sizes_inside_a_graph_capture_are_refused_and_the_capture_survives():
    """CUDA refuses a copy from host memory while a stream captures: the call raises a ValueError
    naming the argument before it touches the stream, so the capture goes on and replays."""
    torch = pytest.importorskip("torch")
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randint(-3, 4, (96, 64), device="cuda", generator=gen).half()
    w = torch.randint(-3, 4, (3, 64, 128), device="cuda", generator=gen).half()
    out = torch.zeros((96, 128), dtype=torch.float32, device="cuda")
    sizes = torch.tensor([40, 16, 40], dtype=torch.int32, device="cuda")
    deepgemm.grouped_gemm(x, w, sizes=[40, 16, 40], out=out)   # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        with pytest.raises(ValueError, match=r"^sizes: host values cannot be copied .* CUDA graph"):
            deepgemm.grouped_gemm(x, w, sizes=[40, 16, 40], out=out)
        deepgemm.grouped_gemm(x, w, sizes=sizes, out=out)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out[40:56].double(), x[40:56].double() @ w[1].double())


@pytest.mark.parametrize("a_shape, b_shape", [
    ((6, 100, 72), (6, 72, 40)),          # strided batch
    ((6, 100, 72), (72, 40)),             # one weight for every batch: folded into one tall GEMM
    ((2, 3, 65, 72), (3, 72, 136)),       # 4-D, b broadcast over the first batch dimension
    ((1, 130, 64), (5, 64, 64)),          # a broadcast
])
def test_batched_gemm_matches_torch_matmul(a_shape, b_shape):
    torch = pytest.importorskip("torch")
    gen = torch.Generator(device="cuda").manual_seed(1)
    a = torch.randint(-4, 5, a_shape, device="cuda", generator=gen).half()
    b = torch.randint(-4, 5, b_shape, device="cuda", generator=gen).half()
    got = deepgemm.gemm(a, b, out_dtype="float32")
    assert torch.equal(got.double(), torch.matmul(a.double(), b.double()))
    # the same through transposed (column-major) views of each matrix
    at = a.transpose(-1, -2).contiguous().transpose(-1, -2)
    got_t = deepgemm.gemm(at, b, out_dtype="float32")
    assert torch.equal(got_t.double(), torch.matmul(a.double(), b.double()))


def test_a_batch_walked_backwards_matches_matmul():
    # x[::-1] views: negative batch strides, which run one GEMM per matrix (tensor maps take none)
    rng = np.random.default_rng(4)
    a = cupy.asarray(rng.integers(-4, 5, (4, 100, 72)).astype(np.float16))[::-1]
    b = cupy.asarray(rng.integers(-4, 5, (4, 72, 40)).astype(np.float16))[::-1]
    bias = cupy.asarray(rng.integers(-4, 5, (4, 40)).astype(np.float32))[::-1]
    assert a.strides[0] < 0 and b.strides[0] < 0 and bias.strides[0] < 0
    got = deepgemm.gemm(a, b, bias=bias, out_dtype="float32")
    want = cupy.matmul(a.astype(cupy.float64), b.astype(cupy.float64)) + bias[:, None, :]
    assert bool(cupy.array_equal(got.astype(cupy.float64), want))


def test_masked_rows_past_the_count_are_not_written():
    case = GroupedCase("auto", "masked", (0, 3, 64, 129), n=128, k=64, out_dtype="bfloat16", capacity=256)
    run_grouped_case(case, np.random.default_rng(3))


def test_torch_grouped_linear_matches_its_reference():
    """deepgemm.torch.grouped_linear on CUDA, sizes on the host and on the device, against the
    per-expert torch arithmetic (integer inputs: both exact)."""
    torch = pytest.importorskip("torch")
    import deepgemm.torch as dgt
    gen = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randint(-3, 4, (300, 64), device="cuda", generator=gen).half()
    w = torch.randint(-3, 4, (4, 72, 64), device="cuda", generator=gen).half()     # [experts, out, in]
    bias = torch.randint(-3, 4, (4, 72), device="cuda", generator=gen).half()
    sizes = [100, 0, 150, 50]
    expected = dgt.reference_grouped_linear(x, w, torch.tensor(sizes), False, bias, "relu")
    for rows in (sizes, torch.tensor(sizes, dtype=torch.int32, device="cuda")):
        got = dgt.grouped_linear(x, w, sizes=rows, bias=bias, activation="relu")
        assert got.shape == (300, 72) and torch.equal(got, expected)
    offsets = torch.tensor([0, 100, 100, 250, 300], dtype=torch.int32, device="cuda")
    got = dgt.grouped_linear(x, w.transpose(1, 2).contiguous(), offsets=offsets, bias=bias, activation="relu",
                             weight_layout="in_out")
    assert torch.equal(got, expected)
