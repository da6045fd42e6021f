"""Host time of one eager layer call: torch's F.linear (+ GELU) vs deepgemm.torch.linear (GELU fused)
vs deepgemm.gemm on the same torch tensors (a plan-cache replay), then cProfile of
deepgemm.torch.linear, top entries by own time. The seed MLP's first layer (512 x 768 -> 3072).

    python3 scripts/profile_torch_linear.py"""
import cProfile
import pstats
import time

import torch
from torch.nn import functional as F

import deepgemm
import deepgemm.torch as dgt

x = torch.randn(512, 768, device="cuda", dtype=torch.float16)
layer = torch.nn.Linear(768, 3072, device="cuda", dtype=torch.float16)
w, b = layer.weight.detach(), layer.bias.detach()
out = torch.empty(512, 3072, device="cuda", dtype=torch.float16)
calls = {
    "torch F.linear + gelu": lambda: F.gelu(F.linear(x, w, b), approximate="tanh"),
    "torch F.linear": lambda: F.linear(x, w, b),
    "deepgemm.torch.linear (gelu fused)": lambda: dgt.linear(x, w, b, activation="gelu"),
    "deepgemm.gemm (replay, out=)": lambda: deepgemm.gemm(x, w.t(), bias=b, activation="gelu", out=out),
}


def per_call(fn, n=3000, batch=100) -> float:
    """Host µs per call; synchronising between batches keeps the launch queue from filling up."""
    total = 0.0
    for _ in range(n // batch):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(batch):
            fn()
        total += time.perf_counter() - t
    return total / n * 1e6


with torch.inference_mode():
    for fn in calls.values():
        for _ in range(50):
            fn()
    for name, fn in calls.items():
        print(f"{name:40} {per_call(fn):6.1f} us per call")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(3000):
        dgt.linear(x, w, b, activation="gelu")
    prof.disable()
pstats.Stats(prof).sort_stats("tottime").print_stats(22)
