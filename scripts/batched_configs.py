"""V5's tiles on strided batches: every config of the grouped rule's options (K unsplit) that takes
the batch, each checked exactly first (integer operands against an FP64 torch.bmm), then timed
beside kernel="auto" and torch.bmm in the same rounds (device time, cold L2; per entry the best of
--rounds medians of --reps calls). This is how the grouped rule's tile choice is checked against
the other tiles (docs/performance.md, batched and grouped GEMM). A is [B, M, K] and B [B, K, N],
both row-major, as attention's QK^T and PV run them; needs torch and CuPy.

    python3 scripts/batched_configs.py 64x512x64x512,64x512x512x64
    python3 scripts/batched_configs.py 32x2048x128x2048 --configs 128x128,256x128
    python3 scripts/batched_configs.py 64x512x64x512 --list     # the configs and auto's pick; no GPU needed

Exit status 1 if any config's result is not exact, 2 without a GPU.
"""
from __future__ import annotations

import argparse
import sys


def label(config: dict) -> str:
    return f"{config['DG_BM']}x{config['DG_BN']}" + ("-pingpong" if config["DG_PINGPONG"] else "")


def options(batch: int, m: int, n: int, k: int, dtype: str, dev) -> tuple[dict, str]:
    """label -> config for every unsplit tile of the grouped rule's options that this batch takes,
    and the label of auto's pick on device `dev` (None: on the guessed SM count)."""
    from deepgemm import dispatch, registry
    spec = registry.get("v5")
    problem = registry.Problem(m, n, k, dtype, dtype, groups=registry.Groups("batch", batch))
    out = {}
    for (_, _, split, _), config in dispatch._v5_rule_options().items():
        full = spec.config_defines(config)
        if split == 1 and spec.config_reason(full, problem) is None:
            out[label(full)] = dict(config)
    decision = dispatch.decide(problem, dev)
    return out, f"{decision.spec.name} {label(decision.config)}" if decision.spec.name == "v5" else decision.spec.name


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shapes", help="comma-separated BxMxNxK (batch, then each product's M, N, K)")
    ap.add_argument("--configs", default=None, help="comma-separated labels to time (default: every one listed)")
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"), help="default: float16")
    ap.add_argument("--reps", type=int, default=20, help="timed calls per median (default: 20)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, each timing every entry once (default: 3)")
    ap.add_argument("--list", action="store_true", help="print each shape's configs and auto's pick, time nothing")
    args = ap.parse_args(argv)
    import deepgemm
    from deepgemm.tuner import parse_shape
    try:
        shapes = [parse_shape(s, "BxMxNxK", "64x512x64x512") for s in args.shapes.split(",")]
    except ValueError as exc:
        ap.error(str(exc))
    if args.reps < 1 or args.rounds < 1:
        ap.error("--reps and --rounds: at least 1")
    wanted = args.configs.split(",") if args.configs else None
    ok, why = deepgemm.gpu_available()
    plans = []
    for shape in shapes:
        configs, auto = options(*shape, args.dtype, 0 if ok else None)
        unknown = [c for c in wanted or () if c not in configs]
        if unknown:
            ap.error(f"--configs: {', '.join(unknown)} not among {'x'.join(map(str, shape))}'s: {', '.join(configs)}")
        plans.append((shape, {c: configs[c] for c in wanted or configs}, auto))
    if args.list:
        for shape, configs, auto in plans:
            print(f"{'x'.join(map(str, shape))}: auto {auto}; configs {', '.join(configs)}")
        return 0

    if not ok:
        print(f"batched_configs.py: needs a GPU ({why}); nothing was measured", file=sys.stderr)
        return 2
    import cupy
    import torch

    from deepgemm.bench import time_device

    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    dt = getattr(torch, args.dtype)
    wrong = 0
    rows = []
    for (g, m, n, k), configs, auto in plans:
        name = f"{g}x{m}x{n}x{k}"
        calls = {f"auto ({auto})": {}}
        calls.update({c: dict(kernel="v5", config=cfg) for c, cfg in configs.items()})
        gen = torch.Generator(device="cuda").manual_seed(0)
        ai = torch.randint(-2, 3, (g, m, k), device="cuda", generator=gen).to(dt)
        bi = torch.randint(-2, 3, (g, k, n), device="cuda", generator=gen).to(dt)
        exact = torch.bmm(ai.double(), bi.double())
        for c, kw in calls.items():
            err = (deepgemm.gemm(ai, bi, out_dtype="float32", **kw).double() - exact).abs().max().item()
            if err != 0:
                wrong += 1
                print(f"{name} {c}: NOT EXACT, largest difference {err}")
        a = torch.randn(g, m, k, device="cuda", generator=gen).to(dt)
        b = torch.randn(g, k, n, device="cuda", generator=gen).to(dt)
        out = torch.empty(g, m, n, device="cuda", dtype=dt)
        fns = {c: (lambda kw=kw: deepgemm.gemm(a, b, out=out, **kw)) for c, kw in calls.items()}
        fns["torch.bmm"] = lambda: torch.bmm(a, b, out=out)
        best = dict.fromkeys(fns, float("inf"))
        for _ in range(args.rounds):
            for c, fn in fns.items():
                best[c] = min(best[c], time_device(fn, reps=args.reps, stream=stream).median)
        rows.append((name, best))
    print(f"device time, µs (best of {args.rounds} medians of {args.reps}, cold L2), {torch.cuda.get_device_name()}:")
    for name, best in rows:
        print(f"{name}: " + "  ".join(f"{c} {us:.2f}" for c, us in best.items()))
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
