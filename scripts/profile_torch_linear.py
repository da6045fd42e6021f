"""Host time of one eager layer call: torch's F.linear (+ GELU) against deepgemm.torch.linear
(GELU fused) and deepgemm.gemm on the same torch tensors (a plan-cache replay), then cProfile of
deepgemm.torch.linear, top entries by own time. The default shape is a 768 -> 3072 MLP layer
over 512 tokens (examples/seed_mlp.py's first layer).

Measures host time: the launch queue is drained between batches (untimed), so a call never waits
for the GPU; compare the rows with each other, not across machines (host speed varies).

    python3 scripts/profile_torch_linear.py [--tokens 512] [--in-features 768] [--out-features 3072]
"""
import argparse
import cProfile
import pstats
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=512, help="rows of x (default: 512)")
    ap.add_argument("--in-features", type=int, default=768, help="default: 768")
    ap.add_argument("--out-features", type=int, default=3072, help="default: 3072")
    ap.add_argument("--calls", type=int, default=3000, help="calls per measurement (default: 3000)")
    ap.add_argument("--top", type=int, default=22, help="cProfile entries to print (default: 22)")
    args = ap.parse_args(argv)

    import torch
    from torch.nn import functional as F

    if not torch.cuda.is_available():
        why = "this torch is a CPU build" if torch.version.cuda is None else "torch sees no CUDA device"
        print(f"profile_torch_linear.py: needs a CUDA GPU ({why}); nothing was measured", file=sys.stderr)
        return 2
    import deepgemm
    import deepgemm.torch as dgt

    x = torch.randn(args.tokens, args.in_features, device="cuda", dtype=torch.float16)
    layer = torch.nn.Linear(args.in_features, args.out_features, device="cuda", dtype=torch.float16)
    w, b = layer.weight.detach(), layer.bias.detach()
    out = torch.empty(args.tokens, args.out_features, device="cuda", dtype=torch.float16)
    calls = {
        "torch F.linear + gelu": lambda: F.gelu(F.linear(x, w, b), approximate="tanh"),
        "torch F.linear": lambda: F.linear(x, w, b),
        "deepgemm.torch.linear (gelu fused)": lambda: dgt.linear(x, w, b, activation="gelu"),
        "deepgemm.gemm (replay, out=)": lambda: deepgemm.gemm(x, w.t(), bias=b, activation="gelu", out=out),
    }

    def per_call(fn, batch=100) -> float:
        """Host µs per call; synchronising between batches keeps the launch queue from filling up."""
        total = 0.0
        for _ in range(args.calls // batch):
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(batch):
                fn()
            total += time.perf_counter() - t
        return total / (args.calls // batch * batch) * 1e6

    with torch.inference_mode():
        for fn in calls.values():   # compile and warm up
            for _ in range(50):
                fn()
        for name, fn in calls.items():
            print(f"{name:40} {per_call(fn):6.1f} us per call")
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            dgt.linear(x, w, b, activation="gelu")
        prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
