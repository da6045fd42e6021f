"""deepgemm.torch on the GPU: linear() against the FP64 reference over x layouts, dtypes and
epilogues; zero-copy operands; torch's current stream; swapped modules keep their outputs; CUDA-graph
capture and replay; torch.compile(fullgraph=True) with the op inside.

Cases are chosen to keep the number of compiled kernel variants small (each costs seconds on a
cold cache): the epilogues are spread over the layouts rather than crossed with them."""
import copy

import pytest

from deepgemm.testing import assert_gemm_close

torch = pytest.importorskip("torch", reason="torch is not installed")
pytestmark = pytest.mark.gpu

from torch import nn  # noqa: E402

import deepgemm.torch as dgt  # noqa: E402


@pytest.fixture(autouse=True)
def _torch_sees_the_gpu():
    if not torch.cuda.is_available():   # the gpu marker asks CuPy; torch must see the GPU too
        pytest.skip("torch sees no CUDA device")

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def _x(layout, m, k, dtype, g):
    """x of logical shape [..., k] in the named memory layout (the [M, K] matrix gemm sees)."""
    if layout == "contiguous":
        return torch.randn(m, k, device="cuda", dtype=dtype, generator=g)
    if layout == "batched":                       # [2, m/2, k] -> a view, no copy
        return torch.randn(2, m // 2, k, device="cuda", dtype=dtype, generator=g)
    if layout == "transposed":                    # column-major 2-D view
        return torch.randn(k, m, device="cuda", dtype=dtype, generator=g).t()
    if layout == "sliced":                        # row-major with a leading dimension > k
        return torch.randn(m, k + 24, device="cuda", dtype=dtype, generator=g)[:, 8:8 + k]
    if layout == "batch-transposed":              # [2, m/2, k] that cannot be flattened (copied)
        return torch.randn(m // 2, k, 2, device="cuda", dtype=dtype, generator=g).permute(2, 0, 1)
    raise ValueError(layout)


def _check(y, x, w, bias, act, residual, weight_in_out=False):
    n = y.shape[-1]
    assert y.shape == (*x.shape[:-1], n) and y.dtype == x.dtype and y.is_cuda
    torch.cuda.synchronize()
    b_kn = w if weight_in_out else w.t()
    return assert_gemm_close(y.reshape(-1, n), a=x.reshape(-1, x.shape[-1]), b=b_kn, bias=bias, activation=act,
                             c=None if residual is None else residual.reshape(-1, n),
                             beta=0.0 if residual is None else 1.0, accumulate="fp32_tc")


CASES = [
    # (x layout, dtype, M, K, N, bias, activation, residual dtype or None)
    ("contiguous", "float16", 200, 256, 192, True, None, None),
    ("contiguous", "bfloat16", 200, 256, 192, True, None, None),
    ("transposed", "float16", 200, 256, 192, True, None, None),
    ("transposed", "bfloat16", 130, 96, 72, True, "gelu", None),          # odd sizes: the non-TMA path
    ("sliced", "float16", 130, 96, 72, True, None, None),
    ("batch-transposed", "float16", 200, 256, 192, True, None, None),
    ("batched", "float16", 200, 256, 192, True, "relu", None),
    ("batched", "float16", 200, 256, 192, True, "gelu", None),
    ("batched", "float16", 200, 256, 192, True, "gelu_erf", None),
    ("batched", "float16", 200, 256, 192, True, "silu", None),
    ("batched", "bfloat16", 200, 256, 192, False, None, None),
    ("batched", "float16", 200, 256, 192, True, "gelu", "float16"),
    ("contiguous", "bfloat16", 200, 256, 192, False, None, "float32"),
    ("batched", "float16", 8, 256, 192, True, "gelu", None),              # decode-sized M
    ("contiguous", "bfloat16", 1, 256, 192, True, None, "bfloat16"),
]


@pytest.mark.parametrize("layout, dtype, m, k, n, with_bias, act, res_dtype", CASES,
                         ids=["-".join(str(v) for v in c if v is not None and not isinstance(v, bool)) for c in CASES])
def test_linear_matches_reference(layout, dtype, m, k, n, with_bias, act, res_dtype):
    g = torch.Generator(device="cuda").manual_seed(m * 7 + n)
    dt = DTYPES[dtype]
    x = _x(layout, m, k, dt, g)
    w = torch.randn(n, k, device="cuda", dtype=dt, generator=g) / k ** 0.5      # nn.Linear layout
    bias = torch.randn(n, device="cuda", dtype=dt, generator=g) if with_bias else None
    residual = (torch.randn(*x.shape[:-1], n, device="cuda", dtype=getattr(torch, res_dtype), generator=g)
                if res_dtype else None)
    y = dgt.linear(x, w, bias, act, residual)
    _check(y, x, w, bias, act, residual)


def test_conv1d_weight_layout_in_out():
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(4, 50, 256, device="cuda", dtype=torch.float16, generator=g)
    w = torch.randn(256, 192, device="cuda", dtype=torch.float16, generator=g) / 16   # [in, out]
    b = torch.randn(192, device="cuda", dtype=torch.float16, generator=g)
    y = dgt.linear(x, w, b, "gelu", weight_layout="in_out")
    _check(y, x, w, b, "gelu", None, weight_in_out=True)


def test_operands_are_not_copied():
    """Only the output is allocated: the weight (read transposed in place) and a batched x are not
    copied. Measured as the peak of torch's allocator during the call."""
    x = torch.randn(4, 64, 512, device="cuda", dtype=torch.float16)
    w = torch.randn(1024, 512, device="cuda", dtype=torch.float16)
    b = torch.randn(1024, device="cuda", dtype=torch.float16)
    dgt.linear(x, w, b, "gelu")                  # compile and load first
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    y = dgt.linear(x, w, b, "gelu")
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - before <= y.numel() * y.element_size() + 512


def test_runs_on_torch_current_stream():
    s = torch.cuda.Stream()
    x = torch.zeros(512, 512, device="cuda", dtype=torch.float16)
    w = torch.randn(512, 512, device="cuda", dtype=torch.float16)
    big = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    dgt.linear(x, w)
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        for _ in range(3):
            big @ big                     # keep the stream busy so a wrong-stream launch races ahead
        x.copy_(torch.ones_like(x))
        y = dgt.linear(x, w)
    s.synchronize()
    expected = w.float().sum(dim=1).expand(512, -1)      # x @ w^T with x = ones
    assert torch.allclose(y.float(), expected, rtol=1e-2, atol=1e-1)


def _mlp(dtype):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(approximate="tanh"),
                         nn.Linear(512, 256)).cuda().to(dtype).eval()


def _assert_outputs_close(got, ref32, eager_lowp):
    """The swapped model is as close to the FP32 model as torch's own low-precision run (x2 + slack)."""
    err = (got.float() - ref32).abs().max().item()
    err_torch = (eager_lowp.float() - ref32).abs().max().item()
    assert err <= 2 * err_torch + 1e-3 * ref32.abs().max().item(), (err, err_torch)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_swapped_mlp_keeps_its_outputs(dtype):
    model = _mlp(DTYPES[dtype])
    ref32 = copy.deepcopy(model).float()
    swapped = copy.deepcopy(model)
    report = dgt.swap_linears(swapped)
    assert report.folded == {"0": "gelu_erf", "2": "gelu"}
    x = torch.randn(3, 100, 256, device="cuda", dtype=DTYPES[dtype])
    with torch.inference_mode():
        _assert_outputs_close(swapped(x), ref32(x.float()), model(x))


def test_swapped_gpt2_keeps_its_outputs():
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    cfg = transformers.GPT2Config(n_layer=2)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).cuda().eval()
    ref32 = copy.deepcopy(model)
    model = model.half()
    swapped = copy.deepcopy(model)
    report = dgt.swap_linears(swapped)
    assert len(report.swapped) == 9 and len(report.folded) == 2
    ids = torch.randint(0, cfg.vocab_size, (2, 64), device="cuda")
    with torch.inference_mode():
        got, want, lowp = (m(ids, output_hidden_states=True) for m in (swapped, ref32, model))
    _assert_outputs_close(got.hidden_states[-1], want.hidden_states[-1], lowp.hidden_states[-1])
    _assert_outputs_close(got.logits, want.logits, lowp.logits)


@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "misaligned-x"])
def test_cuda_graph_capture_and_replay(aligned):
    """Replays match eager runs. Misaligned x (offset by one element): kernels that cannot read it
    in place stage a copy, allocated inside the capture (from torch's allocator, not CuPy's pool)."""
    model = _mlp(torch.float16)
    dgt.swap_linears(model)
    m = 64 if aligned else 200      # 200: past the small-M kernel, into the TMA (staging) kernel
    static_x = (torch.randn(m, 256, device="cuda", dtype=torch.float16) if aligned
                else torch.randn(m, 257, device="cuda", dtype=torch.float16)[:, 1:])
    with torch.inference_mode():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):                # warm-up: compiles and loads the kernels
            for _ in range(2):
                model(static_x)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = model(static_x)
        for seed in (1, 2):
            x = torch.randn(m, 256, device="cuda", dtype=torch.float16, generator=torch.Generator("cuda").manual_seed(seed))
            static_x.copy_(x)
            graph.replay()
            eager = model(x)
            torch.cuda.synchronize()
            assert torch.allclose(static_y, eager, rtol=1e-3, atol=1e-3), (static_y - eager).abs().max()


def test_torch_compile_fullgraph():
    pytest.importorskip("triton", reason="triton is not installed: torch.compile's inductor backend needs it")
    try:
        import torch._inductor  # noqa: F401
    except ImportError as e:
        pytest.skip(f"torch inductor is unavailable: {e}")

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(256, 512), nn.Linear(512, 256)

        def forward(self, x):
            h = dgt.linear(x, self.fc1.weight, self.fc1.bias, activation="gelu")
            return dgt.linear(h, self.fc2.weight, self.fc2.bias, residual=x) * 0.5

    model = Block().cuda().half().eval()
    x = torch.randn(4, 32, 256, device="cuda", dtype=torch.float16)
    with torch.inference_mode():
        eager = model(x)
        compiled = torch.compile(model, fullgraph=True)(x)
    torch.cuda.synchronize()
    assert torch.allclose(compiled, eager, rtol=1e-3, atol=1e-3), (compiled - eager).abs().max()
