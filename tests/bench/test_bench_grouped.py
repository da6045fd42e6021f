"""Benchmarks of batched and grouped GEMM (device time: CUDA events, cold L2, median of rounds),
each against the reference a user would otherwise run, timed in alternating rounds of the same run:
  * strided batches (attention's QK^T and PV): cuBLAS's strided-batched GEMM through torch.bmm
    (CuPy 14 converts 3-D float16 operands to FP32 and runs a CUDA-core GEMM: Nsight Compute);
  * grouped MoE layers (contiguous, skewed tokens per expert, empty experts included): a torch loop
    over the experts (torch.mm per expert), and the dense GEMM of the same total work, whose ratio
    says how much grouping costs;
  * masked decode (M per expert <= 64): the same torch loop over each expert's valid rows.
"""
import numpy as np
import pytest

from deepgemm.testing.benchplugin import Reference

pytestmark = pytest.mark.gpu

# name -> (batch, M, N, K)
BATCHED = {
    "attn_qk_64x512x512x64": (64, 512, 512, 64),
    "attn_pv_64x512x64x512": (64, 512, 64, 512),
    "llama_qk_32x2048x2048x128": (32, 2048, 2048, 128),
    "llama_pv_32x2048x128x2048": (32, 2048, 128, 2048),
}
# name -> (experts, tokens in all, N, K): Mixtral-like up projection, DeepSeek-like small experts
MOE = {
    "moe_8x_8192tok_14336x4096": (8, 8192, 14336, 4096),
    "moe_64x_8192tok_2048x7168": (64, 8192, 2048, 7168),
    "moe_64x_8192tok_7168x2048": (64, 8192, 7168, 2048),
}
# name -> (experts, M_max, N, K)
MASKED = {"masked_8x64_14336x4096": (8, 64, 14336, 4096), "masked_64x32_4096x7168": (64, 32, 4096, 7168)}

_ops = {}


def skewed_sizes(groups: int, total: int, seed: int = 0) -> list[int]:
    """Tokens per expert from a Dirichlet(0.3) split (a few hot experts, some empty), summing to total."""
    rng = np.random.default_rng(seed)
    share = rng.dirichlet(np.full(groups, 0.3))
    sizes = np.floor(share * total).astype(int)
    sizes[rng.choice(groups, size=max(1, groups // 8), replace=False)] = 0     # idle experts
    sizes[int(np.argmax(sizes))] += total - int(sizes.sum())
    return sizes.tolist()


def _torch():
    return pytest.importorskip("torch")


def _stream():
    import cupy
    return cupy.cuda.ExternalStream(_torch().cuda.current_stream().cuda_stream)


def _randn(*shape):
    torch = _torch()
    return torch.randn(*shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(len(_ops))).half()


@pytest.mark.parametrize("name", list(BATCHED))
def test_batched(device_benchmark, name):
    import deepgemm
    torch = _torch()
    g, m, n, k = BATCHED[name]
    a, b, out = _randn(g, m, k), _randn(g, k, n), torch.empty(g, m, n, device="cuda", dtype=torch.half)
    stream = _stream()
    ref = Reference(f"torch_bmm[{name}]", lambda: torch.bmm(a, b), stream)
    device_benchmark(lambda: deepgemm.gemm(a, b, out=out), reference=ref, stream=stream)
    device_benchmark.record_throughput(m=g * m, n=n, k=k)


def _moe(name):
    if name not in _ops:
        _ops.clear()
        torch = _torch()
        g, tokens, n, k = MOE[name]
        sizes = skewed_sizes(g, tokens)
        _ops[name] = (_randn(tokens, k), _randn(g, n, k), torch.tensor(sizes, dtype=torch.int32, device="cuda"),
                      sizes, torch.empty(tokens, n, device="cuda", dtype=torch.half))
    return _ops[name]


def _expert_loop(x, w, sizes, out):
    torch = _torch()
    offsets = np.concatenate([[0], np.cumsum(sizes)])

    def run():
        for e, (lo, hi) in enumerate(zip(offsets[:-1], offsets[1:])):
            if hi > lo:
                torch.mm(x[lo:hi], w[e].t(), out=out[lo:hi])
    return run


@pytest.mark.parametrize("name", list(MOE))
def test_grouped_moe(device_benchmark, name):
    """Contiguous groups, sizes on the device (graph-safe); reference: torch's loop over experts."""
    import deepgemm
    torch = _torch()
    x, w, sizes_dev, sizes, out = _moe(name)
    ref_out = torch.empty_like(out)
    stream = _stream()
    ref = Reference(f"torch_expert_loop[{name}]", _expert_loop(x, w, sizes, ref_out), stream)
    device_benchmark(lambda: deepgemm.grouped_gemm(x, w.transpose(1, 2), sizes=sizes_dev, out=out),
                     reference=ref, stream=stream)
    g, tokens, n, k = MOE[name]
    device_benchmark.record_throughput(m=tokens, n=n, k=k)
    device_benchmark.extra_info.update(sizes=sizes)


@pytest.mark.parametrize("name", list(MOE))
def test_grouped_moe_dense_equivalent(device_benchmark, name):
    """deepgemm's dense GEMM of the same total work (all tokens x one expert's weight), against
    cuBLAS: the grouped benchmark's TFLOP/s over this one's is what grouping costs."""
    import deepgemm
    x, w, _, _, out = _moe(name)
    stream = _stream()
    ref = Reference(f"torch_mm[{name}-dense]", lambda: _torch().mm(x, w[0].t()), stream)
    device_benchmark(lambda: deepgemm.gemm(x, w[0].t(), out=out), reference=ref, stream=stream)
    g, tokens, n, k = MOE[name]
    device_benchmark.record_throughput(m=tokens, n=n, k=k)


@pytest.mark.parametrize("name", list(MASKED))
def test_grouped_masked_decode(device_benchmark, name):
    """Masked layout at decode sizes: every expert's weight streamed once; bytes_moved counts them."""
    import deepgemm
    torch = _torch()
    g, m_max, n, k = MASKED[name]
    counts = [max(1, (m_max * (i % 4 + 1)) // 4) for i in range(g)]
    x, w = _randn(g, m_max, k), _randn(g, n, k)
    counts_dev = torch.tensor(counts, dtype=torch.int32, device="cuda")
    out, ref_out = (torch.empty(g, m_max, n, device="cuda", dtype=torch.half) for _ in range(2))
    stream = _stream()

    def loop():
        for e, c in enumerate(counts):
            torch.mm(x[e, :c], w[e].t(), out=ref_out[e, :c])
    ref = Reference(f"torch_expert_loop[{name}]", loop, stream)
    device_benchmark(lambda: deepgemm.grouped_gemm(x, w.transpose(1, 2), masked_m=counts_dev, out=out),
                     reference=ref, stream=stream)
    device_benchmark.record_throughput(flops=2.0 * sum(counts) * n * k, bytes_moved=2.0 * g * n * k)
