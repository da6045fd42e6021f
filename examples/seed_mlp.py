"""The seed's inference demo: a 3-layer MLP (768 -> 3072 -> 3072 -> 768, GELU after the first two
layers, 512 tokens) whose GEMMs dominate its time under torch eager, swapped for deepgemm layers
with the GELUs fused into the GEMM epilogues. Random weights (nothing downloaded).

    python3 examples/seed_mlp.py [--dtype float16|bfloat16] [--gelu tanh|none] [--out mlp.json]

Reports the GEMMs' share of torch eager's GPU time (torch.profiler kernel times, and GEMMs timed
alone vs the whole forward), latency torch eager vs deepgemm (CUDA events, warm-up, median; also
both under CUDA graphs, which removes Python/launch overhead), and the error of each against the
FP32 model. Target: deepgemm <= 0.75x torch eager end to end. Exit 1 if outputs are out of tolerance,
2 without a GPU.
"""
from __future__ import annotations

import argparse
import copy

import _common as C   # also puts this checkout's deepgemm on sys.path
import torch
from torch import nn
from torch.nn import functional as F

import deepgemm.torch as dgt

TARGET = 0.75


def build(gelu: str) -> nn.Sequential:
    return nn.Sequential(nn.Linear(768, 3072), nn.GELU(approximate=gelu), nn.Linear(3072, 3072),
                         nn.GELU(approximate=gelu), nn.Linear(3072, 768))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
    p.add_argument("--gelu", choices=("tanh", "none"), default="tanh",
                   help="nn.GELU's approximate= (tanh: deepgemm 'gelu'; none: erf, 'gelu_erf')")
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)   # cpu: a dry run of the plumbing
    args = p.parse_args(argv)
    C.require_gpu(args.device)
    dtype = getattr(torch, args.dtype)

    torch.manual_seed(0)
    dev = args.device
    model32 = build(args.gelu).to(dev).eval()
    model = copy.deepcopy(model32).to(dtype)
    fused = copy.deepcopy(model)
    report = dgt.swap_linears(fused)
    print(report)
    x = torch.randn(args.tokens, 768, device=dev, dtype=dtype)

    with torch.inference_mode():
        ref = model32(x.float())
        y_torch, y_dg = model(x), fused(x)
        err_torch, err_dg = C.max_abs_err(y_torch, ref), C.max_abs_err(y_dg, ref)
        ok = C.within_tolerance(err_dg, err_torch, ref)

        # The GEMMs alone, on the inputs each layer sees (cuBLAS's addmm fuses the bias add).
        layers = [model[0], model[2], model[4]]
        inputs = [x, model[1](model[0](x)), model[3](model[2](model[1](model[0](x))))]
        def gemms_only():
            for layer, h in zip(layers, inputs):
                F.linear(h, layer.weight, layer.bias)

        split = C.kernel_time_split(lambda: model(x), device=dev)
        t_eager = C.time_us(lambda: model(x), device=dev)
        t_gemms = C.time_us(gemms_only, device=dev)
        t_dg = C.time_us(lambda: fused(x), device=dev)
        t_eager_graph, why_eager = C.try_graph_time_us(lambda: model(x), dev)
        t_dg_graph, why_dg = C.try_graph_time_us(lambda: fused(x), dev)

    ratio = t_dg / t_eager
    ratio_graph = t_dg_graph / t_eager_graph if t_dg_graph and t_eager_graph else None
    m = args.tokens
    kernels = {f"{m}x{n}x{k}": C.auto_kernel(m, n, k, args.dtype) for n, k in ((3072, 768), (3072, 3072), (768, 3072))}
    print(f"\nSeed MLP 768-3072-3072-768, {m} tokens, {args.dtype}, GELU approximate={args.gelu!r} "
          f"on {C.device_info(dev)['gpu']}; deepgemm 'auto' runs {kernels}")
    print(C.table(["measure", "value"], [
        ["GEMM share of torch eager GPU kernel time (profiler)",
         f"{100 * split['gemm_share']:.0f} %" if split["gemm_share"] is not None else None],
        ["GEMMs alone / whole forward (torch eager, timed)", f"{100 * t_gemms / t_eager:.0f} %"],
        ["torch eager latency (us)", t_eager],
        ["deepgemm fused latency (us)", t_dg],
        [f"deepgemm / torch eager (target <= {TARGET})", f"{ratio:.2f} {'PASS' if ratio <= TARGET else 'MISS'}"],
        ["torch eager, CUDA graph (us)", t_eager_graph],
        ["deepgemm fused, CUDA graph (us)", t_dg_graph],
        ["deepgemm / torch, both graphed", f"{ratio_graph:.2f}" if ratio_graph else None],
        ["max |err| vs FP32 model: torch / deepgemm", f"{err_torch:.3g} / {err_dg:.3g} {'OK' if ok else 'FAIL'}"],
    ]))
    if why_eager or why_dg:
        print(f"CUDA graph capture failed: torch: {why_eager}; deepgemm: {why_dg}")
    C.write_json(args.out, {
        "demo": "seed_mlp", **C.device_info(dev), "tokens": m, "dtype": args.dtype, "gelu": args.gelu,
        "deepgemm_kernels": kernels, "swapped": report.names, "folded": report.folded,
        "torch_kernel_split": split, "gemm_share_profiler": split["gemm_share"],
        "gemm_share_timed": t_gemms / t_eager,
        "latency_us": {"torch_eager": t_eager, "torch_gemms_only": t_gemms, "deepgemm": t_dg,
                       "torch_eager_graph": t_eager_graph, "deepgemm_graph": t_dg_graph},
        "ratio": ratio, "ratio_graph": ratio_graph, "target": TARGET, "target_met": ratio <= TARGET,
        "max_abs_err": {"torch": err_torch, "deepgemm": err_dg}, "outputs_ok": ok,
    })
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
