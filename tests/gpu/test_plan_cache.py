"""gemm()'s repeat-call fast path (api._plans) gives the same results as the full path: new
pointers, new outputs, epilogue operands, alignment changes, torch tensors and every kernel kind
(the plain launch, V5's tensor maps, small_m's grid hook)."""
import numpy as np
import pytest

import deepgemm
from deepgemm import api

cupy = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu


def _rand(shape, seed, dtype=cupy.float16):
    return cupy.asarray(np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)).astype(dtype)


@pytest.mark.parametrize("m, n, k", [(1, 4096, 1024), (256, 512, 128), (300, 200, 136)])
def test_replayed_calls_match_the_full_path(m, n, k):
    api._plans.clear()
    bias, c = _rand(n, 9, cupy.float32), _rand((m, n), 10)
    results = []
    for seed in range(3):   # call 1: full path, builds the plan; calls 2, 3: replays with new pointers
        a, w = _rand((m, k), seed), _rand((n, k), seed + 100)
        results.append((deepgemm.gemm(a, w.T, bias=bias, activation="relu", c=c), a, w))
    assert len(api._plans) == 1
    for d, a, w in results:
        ref = cupy.maximum(a.astype(cupy.float32) @ w.T.astype(cupy.float32) + bias, 0) + c.astype(cupy.float32)
        err = float(cupy.abs(d.astype(cupy.float32) - ref).max() / cupy.abs(ref).max())
        assert err < 2e-3, err


def test_alignment_change_takes_the_full_path():
    """Same shape and strides, base 2 bytes off: not a replay of the aligned call's plan (V5 must
    stage that operand, so such calls are never cached)."""
    api._plans.clear()
    buf, b = _rand((128, 144), 1), _rand((136, 256), 2)
    deepgemm.gemm(buf[:, :136], b, kernel="v5")
    assert len(api._plans) == 1
    view = buf[:, 1:137]                      # the same geometry, base 2 bytes further
    d = deepgemm.gemm(view, b, kernel="v5")
    assert len(api._plans) == 1
    ref = view.astype(cupy.float32) @ b.astype(cupy.float32)
    assert float(cupy.abs(d.astype(cupy.float32) - ref).max() / cupy.abs(ref).max()) < 2e-3


def test_torch_calls_replay_on_torch_stream():
    torch = pytest.importorskip("torch")
    api._plans.clear()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for seed in range(3):
            x = torch.randn(64, 96, device="cuda", dtype=torch.float16, generator=torch.Generator("cuda").manual_seed(seed))
            w = torch.randn(80, 96, device="cuda", dtype=torch.float16)
            y = deepgemm.gemm(x, w.T)
            ref = x.float() @ w.T.float()
    torch.cuda.synchronize()
    assert isinstance(y, torch.Tensor) and len(api._plans) == 1
    assert float((y.float() - ref).abs().max() / ref.abs().max()) < 2e-3
