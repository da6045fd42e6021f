"""torch CUDA tensors in, torch tensors out: zero-copy views (bf16 through DLPack), transposed
weights, out=, and the launch on torch's current stream rather than CuPy's."""
import numpy as np
import pytest

import deepgemm
from deepgemm.testing import assert_gemm_close

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("kernel", ["v3", "v4"])
def test_torch_in_torch_out_with_transposed_weight(dtype, kernel):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(130, 96, device="cuda", dtype=getattr(torch, dtype), generator=g)
    w = torch.randn(72, 96, device="cuda", dtype=getattr(torch, dtype), generator=g)   # nn.Linear layout
    y = deepgemm.gemm(x, w.T, kernel=kernel)                                           # w.T: no copy
    assert isinstance(y, torch.Tensor) and y.dtype == x.dtype and y.shape == (130, 72) and y.is_cuda
    torch.cuda.synchronize()
    assert_gemm_close(y, a=x, b=w.T, accumulate=deepgemm.api.registry.get(kernel).accumulate)


def test_out_tensor_is_written_in_place_and_returned():
    x = torch.randn(64, 40, device="cuda", dtype=torch.float16)
    w = torch.randn(40, 24, device="cuda", dtype=torch.float16)
    out = torch.full((64, 24), float("nan"), device="cuda", dtype=torch.float32)
    assert deepgemm.gemm(x, w, out=out) is out
    torch.cuda.synchronize()
    assert_gemm_close(out, a=x, b=w, accumulate="fp32_tc")


def test_runs_on_torch_current_stream():
    """The GEMM must be ordered after work queued on torch's current (non-default) stream."""
    s = torch.cuda.Stream()
    x = torch.zeros(512, 512, device="cuda", dtype=torch.float16)
    w = torch.randn(512, 512, device="cuda", dtype=torch.float16)
    big = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        for _ in range(3):
            big @ big                     # keep the stream busy so a wrong-stream launch races ahead
        x.copy_(torch.ones_like(x))       # queued on s, after the busy work
        y = deepgemm.gemm(x, w, kernel="v4")
    s.synchronize()
    expected = w.float().sum(dim=0).expand(512, -1)
    assert torch.allclose(y.float(), expected, rtol=1e-2, atol=1e-1)
