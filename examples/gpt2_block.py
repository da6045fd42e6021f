"""GPT-2 small from `transformers` (GPT2Config(), random weights, nothing downloaded) with its
Conv1D projections and LM head swapped for deepgemm layers and each MLP's gelu_new folded into
c_fc's epilogue (deepgemm.torch.swap_linears).

    python3 examples/gpt2_block.py [--dtype float16|bfloat16] [--layers 2] [--out gpt2.json]

1. Outputs: logits and last hidden states of a --layers-layer GPT2LMHeadModel on 8x128 tokens, in
   float16 and bfloat16, each against the FP32 model: deepgemm must be as close as torch's own
   low-precision run (within 2x, plus 1e-3 of the largest value).
2. Latency of one GPT2Block and of its MLP sub-block (c_fc -> act -> c_proj), torch eager vs
   deepgemm, at batch x sequence 1x1 (one token, no KV cache: the decode GEMV shape), 8x128 and
   4x1024; CUDA events, warm-up, median. Also both under CUDA graphs (no launch overhead).
   Target: the MLP sub-block at <= 0.9x torch eager.
Exit 1 if outputs are out of tolerance, 2 without a GPU.
"""
from __future__ import annotations

import argparse
import copy

import _common as C   # also puts this checkout's deepgemm on sys.path
import torch

import deepgemm.torch as dgt

TARGET_MLP = 0.9
SHAPES = ((1, 1), (8, 128), (4, 1024))


def _first(out):
    return out[0] if isinstance(out, tuple) else out   # GPT2Block returns a tuple in older transformers


def check_outputs(model32, dtype, batch=8, seq=128, device="cuda") -> dict:
    lowp = copy.deepcopy(model32).to(dtype)
    swapped = copy.deepcopy(lowp)
    dgt.swap_linears(swapped)
    ids = torch.randint(0, model32.config.vocab_size, (batch, seq), device=device,
                        generator=torch.Generator(device).manual_seed(1))
    with torch.inference_mode():
        ref, lo, dg = (m(ids, output_hidden_states=True) for m in (model32, lowp, swapped))
    result = {}
    for name, pick in (("logits", lambda o: o.logits), ("hidden", lambda o: o.hidden_states[-1])):
        err_t, err_d = C.max_abs_err(pick(lo), pick(ref)), C.max_abs_err(pick(dg), pick(ref))
        result[name] = {"torch": err_t, "deepgemm": err_d, "ok": C.within_tolerance(err_d, err_t, pick(ref))}
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16", help="for the timings")
    p.add_argument("--layers", type=int, default=2, help="GPT2LMHeadModel layers for the output check")
    p.add_argument("--no-graphs", action="store_true", help="skip the CUDA-graph timings")
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)   # cpu: a dry run of the plumbing
    args = p.parse_args(argv)
    C.require_gpu(args.device)
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        C.missing("transformers", "pip install transformers")

    cfg = GPT2Config(n_layer=args.layers)
    torch.manual_seed(0)
    dev = args.device
    model32 = GPT2LMHeadModel(cfg).to(dev).eval()

    accuracy = {dt: check_outputs(model32, getattr(torch, dt), device=dev) for dt in ("float16", "bfloat16")}
    ok = all(v["ok"] for per in accuracy.values() for v in per.values())

    dtype = getattr(torch, args.dtype)
    block_t = copy.deepcopy(model32.transformer.h[0]).to(dtype)
    block_d = copy.deepcopy(block_t)
    report = dgt.swap_linears(block_d)
    print(report)
    rows, timings = [], []
    with torch.inference_mode():
        for b, s in SHAPES if dev == "cuda" else SHAPES[:2]:
            h = torch.randn(b, s, cfg.n_embd, device=dev, dtype=dtype)
            r = {"shape": f"{b}x{s}", "tokens": b * s,
                 "kernels": {f"{n}x{k}": C.auto_kernel(b * s, n, k, args.dtype, layout="rr")   # Conv1D: [in, out]
                             for n, k in ((3 * cfg.n_embd, cfg.n_embd), (4 * cfg.n_embd, cfg.n_embd),
                                          (cfg.n_embd, 4 * cfg.n_embd))}}
            fns = {"mlp_torch": lambda: block_t.mlp(h), "mlp_deepgemm": lambda: block_d.mlp(h),
                   "block_torch": lambda: _first(block_t(h)), "block_deepgemm": lambda: _first(block_d(h))}
            for name, fn in fns.items():
                r[name + "_us"] = C.time_us(fn, device=dev)
                if not args.no_graphs:
                    r[name + "_graph_us"], why = C.try_graph_time_us(fn, dev)
                    if why:
                        r[name + "_graph_error"] = why
            r["mlp_ratio"] = r["mlp_deepgemm_us"] / r["mlp_torch_us"]
            r["block_ratio"] = r["block_deepgemm_us"] / r["block_torch_us"]
            g = [r.get(k) for k in ("mlp_torch_graph_us", "mlp_deepgemm_graph_us",
                                    "block_torch_graph_us", "block_deepgemm_graph_us")]
            r["mlp_ratio_graph"] = g[1] / g[0] if g[0] and g[1] else None
            r["block_ratio_graph"] = g[3] / g[2] if g[2] and g[3] else None
            r["mlp_target_met"] = r["mlp_ratio"] <= TARGET_MLP
            timings.append(r)
            rows.append([r["shape"], r["mlp_torch_us"], r["mlp_deepgemm_us"],
                         f"{r['mlp_ratio']:.2f} {'PASS' if r['mlp_target_met'] else 'MISS'}",
                         r["block_torch_us"], r["block_deepgemm_us"], f"{r['block_ratio']:.2f}",
                         _ratio(r["mlp_ratio_graph"]), _ratio(r["block_ratio_graph"])])

    print(f"\nGPT-2 small block, {args.dtype}, on {C.device_info(dev)['gpu']} (latency in us; "
          f"MLP target <= {TARGET_MLP}x torch eager)")
    print(C.table(["BxT", "MLP torch", "MLP deepgemm", "MLP ratio", "block torch", "block deepgemm",
                   "block ratio", "MLP ratio graphed", "block ratio graphed"], rows))
    for r in timings:
        errors = {k: v for k, v in r.items() if k.endswith("_graph_error")}
        if errors:
            print(f"{r['shape']}: CUDA graph capture failed: {errors}")
    print(f"\nOutputs vs the FP32 model ({args.layers} layers, 8x128 tokens), max |err| torch / deepgemm:")
    print(C.table(["dtype", "logits", "last hidden state"],
                  [[dt, _errs(v["logits"]), _errs(v["hidden"])] for dt, v in accuracy.items()]))
    C.write_json(args.out, {"demo": "gpt2_block", **C.device_info(dev), "dtype": args.dtype,
                            "swapped": report.names, "folded": report.folded, "timings": timings,
                            "target_mlp": TARGET_MLP, "accuracy": accuracy, "outputs_ok": ok})
    return 0 if ok else 1


def _ratio(v):
    return f"{v:.2f}" if v else None


def _errs(v):
    return f"{v['torch']:.3g} / {v['deepgemm']:.3g} {'OK' if v['ok'] else 'FAIL'}"


if __name__ == "__main__":
    raise SystemExit(main())
