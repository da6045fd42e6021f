"""Shared by the demos: put this checkout's deepgemm first on sys.path, time with CUDA events,
capture CUDA graphs, sum profiler kernel times, print tables and write JSON."""
from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

# `python3 examples/<demo>.py` from anywhere runs this checkout's deepgemm (no install, no PYTHONPATH).
REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def missing(what: str, install: str):
    """Stop a demo whose Python lacks a package it needs: exit 2 with one line on stderr, as
    require_gpu does, rather than an ImportError's traceback."""
    print(f"{Path(sys.argv[0]).name}: needs {what}, and {sys.executable} has none; nothing was measured. "
          f"Install it: {install}", file=sys.stderr)
    raise SystemExit(2)


try:
    import torch  # noqa: E402
except ImportError:
    missing("PyTorch", "pip install -e '.[torch]' in the repository")


def require_gpu(device: str) -> None:
    """Stop a demo asked to measure on the GPU (the default) where torch sees none: exit 2 with the
    reason on stderr, rather than a traceback from deep inside torch."""
    if device != "cuda" or torch.cuda.is_available():
        return
    why = "this torch is a CPU build" if torch.version.cuda is None else "torch sees no CUDA device"
    print(f"{Path(sys.argv[0]).name}: needs a CUDA GPU, and {why}; nothing was measured. "
          f"Without a GPU: ./run.sh (the static checks) and ./test.sh (the CPU tier).", file=sys.stderr)
    raise SystemExit(2)


def _cpu_time_us(fn, trials):   # --device cpu: a dry run of the demo's plumbing, not a benchmark
    import time
    fn()
    times = []
    for _ in range(trials):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e6)
    return statistics.median(times)


def time_us(fn, *, warmup=10, trials=25, min_trial_ms=2.0, device="cuda") -> float:
    """Median per-call latency of back-to-back calls, in microseconds: CUDA events around a batch of
    calls (so CPU launch overhead counts when it is the bottleneck, as in an inference loop), batch
    sized to last >= min_trial_ms, median over trials. Inputs stay in L2, as in a steady serving loop."""
    if device == "cpu":
        return _cpu_time_us(fn, 3)
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(3):
        fn()
    end.record()
    end.synchronize()
    one_ms = start.elapsed_time(end) / 3
    reps = max(1, min(500, int(min_trial_ms / max(one_ms, 1e-4))))
    times = []
    for _ in range(trials):
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(times)


def graphed(fn):
    """fn captured in a CUDA graph (after a warm-up on a side stream, as torch requires); returns replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def try_graph_time_us(fn, device="cuda"):
    if device == "cpu":
        return None, "no CUDA graphs on the CPU"
    try:
        return time_us(graphed(fn)), None
    except Exception as e:   # a model that cannot be captured: report it, keep the eager numbers
        torch.cuda.synchronize()
        return None, f"{type(e).__name__}: {str(e)[:120]}"


GEMM_KERNEL = re.compile(r"gemm|nvjet|xmma|cutlass|cublas|matmul|deepgemm|splitk", re.I)


def kernel_time_split(fn, reps=20, device="cuda") -> dict:
    """torch.profiler's CUDA kernel time for `reps` calls, split into GEMM and other kernels (by
    kernel name: cuBLAS's gemm/nvjet/xmma/cutlass kernels, deepgemm's own)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    if device == "cpu":
        return {"gemm_us": None, "other_us": None, "gemm_share": None, "kernels_us": {}}
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    gemm = other = 0.0
    names = {}
    for evt in prof.events():
        if evt.device_type != DeviceType.CUDA or evt.name.startswith(("Memcpy", "Memset")):
            continue
        t = evt.device_time_total
        is_gemm = bool(GEMM_KERNEL.search(evt.name))
        gemm, other = (gemm + t, other) if is_gemm else (gemm, other + t)
        short = evt.name[:60]
        names[short] = names.get(short, 0.0) + t / reps
    total = gemm + other
    return {"gemm_us": gemm / reps, "other_us": other / reps,
            "gemm_share": gemm / total if total else None,
            "kernels_us": dict(sorted(names.items(), key=lambda kv: -kv[1])[:8])}


def max_abs_err(got, ref) -> float:
    return (got.float() - ref.float()).abs().max().item()


def within_tolerance(err, err_torch, ref) -> bool:
    """As close to the FP32 model as torch's own low-precision run, within 2x plus a small slack."""
    return err <= 2 * err_torch + 1e-3 * ref.float().abs().max().item()


def auto_kernel(m, n, k, dtype, layout="rc") -> str:
    """The kernel deepgemm's "auto" picks for this problem, read from deepgemm.explain's text."""
    import deepgemm
    try:
        text = deepgemm.explain(m, n, k, dtype, layout=layout)
    except TypeError:   # an explain() without layout=
        text = deepgemm.explain(m, n, k, dtype)
    except Exception as e:   # informational only
        return f"? ({type(e).__name__})"
    found = re.search(r"chosen:\s*(\w+)", text) or re.search(r": (\w+) \(", text)
    return found.group(1) if found else "?"


def device_info(device="cuda") -> dict:
    return {"gpu": torch.cuda.get_device_name() if device == "cuda" else device, "torch": torch.__version__,
            "cuda": torch.version.cuda}


def table(headers, rows) -> str:
    cells = [[str(h) for h in headers]] + [[_fmt(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = [" | ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in cells]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(v):
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def write_json(path, data) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(data, indent=2, default=str) + "\n")
        print(f"wrote {path}")
