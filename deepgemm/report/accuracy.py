"""Accuracy report: FP32 vs FP16 accumulation of FP16/BF16 products, for K = 16 .. 65536.

For every input dtype, data distribution and K we draw A (M x K) and B (K x N), round them
to the input dtype and compare each accumulator's result with the float64 reference
(``A @ B`` of the rounded inputs: exact products, error <= gamma_K(2^-53)|A||B|, negligible
here).  Without a GPU (or with ``backend="emulated"``) the results come from the exact
CPU emulation in :mod:`deepgemm.report.emulate`; with ``backend="gpu"`` from deepgemm's
kernels through ``gpu_runner``, and the report adds kernel times and the agreement of the
GPU's FP16-accumulating output with the emulation.

Metrics (all over the *finite* outputs; inf/nan outputs are counted, never hidden):

* ``max_rel`` = max|C^ - C| / max|C| and ``mean_rel`` = mean|C^ - C| / mean|C|: normwise,
  because the elementwise relative error is unbounded wherever the exact result is near 0,
  which zero-mean data produces in every large matrix;
* ``bound_ratio`` = max_ij |C^ - C|_ij / (gamma_K(u) (|A||B|)_ij), the componentwise
  forward error bound of Higham §3.1 with the accumulator's own u (2^-24 for FP32,
  2^-11 for FP16); nan where K*u >= 1 and the bound says nothing (FP16: K >= 2048).  The
  bound assumes no underflow, so FP16 accumulation of tiny values may exceed it;
* ``overflow`` / ``nan``: fractions of outputs that are +-inf / nan.

M x N is 64 x 64 by default (32 x 32 with ``quick``): 4096 outputs per case is enough for
stable maxima, and the emulated full run (2 dtypes x 4 distributions x 16 K values x 3
accumulator models) then takes about 65 s of CPU time on one core (2.5 min wall clock
on a busy, shared 2-core machine).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from .emulate import UNIT_ROUNDOFF, emulate_gemm, gamma

FULL_KS = (16, 32, 64, 100, 128, 256, 512, 1000, 1024, 2048, 3000, 4096,
           8192, 16384, 32768, 65536)
QUICK_KS = (16, 100, 1024, 8192)

# name -> (description, sampler(rng, shape) in float64)
DISTRIBUTIONS: dict[str, tuple[str, Callable]] = {
    "normal": ("normal(0, 1)", lambda rng, shape: rng.standard_normal(shape)),
    # All-positive products (mean 1/4): the FP16 partial sum stalls between 1024 and 2048,
    # where a product below half an ulp (0.5, then 1) no longer changes it.
    "uniform": ("uniform[0, 1)", lambda rng, shape: rng.uniform(0.0, 1.0, shape)),
    # Products ~1e-6 fall in FP16's subnormal range (below 6.1e-5).
    "small": ("normal(0, 1) x 1e-3", lambda rng, shape: 1e-3 * rng.standard_normal(shape)),
    # All-positive and activation-sized (products up to 64, mean 16): the sums pass FP16's
    # 65504 near K = 4096 and keep growing (products above half an ulp at 32768 are common),
    # so FP16 accumulation overflows to inf.  uniform[0, 1) cannot show that below
    # K ~ 260000: its exact sum (K/4) stays under 65504 and its FP16 sum stalls long before.
    "large": ("uniform[0, 8)", lambda rng, shape: rng.uniform(0.0, 8.0, shape)),
}

# Accumulator models: name -> (emulate accumulate, block_k, unit roundoff for the bound).
MODELS = {
    "fp32": ("fp32", 1, UNIT_ROUNDOFF["fp32"]),
    "fp16": ("fp16", 1, UNIT_ROUNDOFF["fp16"]),  # rounds after every k (hfma2)
    "fp16_k16": ("fp16", 16, UNIT_ROUNDOFF["fp16"]),  # rounds per k-block of 16 (mma.sync)
}
GPU_ACCUMULATORS = ("fp32", "fp16")  # what gpu_runner is asked for
MODEL_LABELS = {"fp32": "FP32 acc", "fp16": "FP16 acc", "fp16_k16": "FP16 acc, k-block 16"}
ACCUMULATION_NAMES = {"fp32": "FP32 accumulation", "fp16": "FP16 accumulation",
                      "fp16_k16": "FP16 accumulation rounded per k-block of 16"}

# gpu_runner(a, b, accumulate) -> (C as float64 on the host, seconds per call), with a, b
# host arrays of the input dtype (numpy float16 / ml_dtypes bfloat16) and accumulate in
# GPU_ACCUMULATORS; None or NotImplementedError = no such kernel (the emulation stands in).
GpuRunner = Callable[[np.ndarray, np.ndarray, str], Optional[tuple]]


@dataclasses.dataclass
class ErrorStats:
    max_abs: float
    max_rel: float  # normwise, see the module docstring
    mean_rel: float
    bound_ratio: float  # nan where gamma_K(u) is vacuous (K*u >= 1)
    overflow: float  # fraction of outputs that are +-inf
    nan: float  # fraction of outputs that are nan
    mean_out: float  # mean of the finite outputs (shows a stalled sum)
    source: str = "emulated"  # "emulated" or "gpu"

    @property
    def finite_only(self) -> bool:
        """True when some outputs were inf/nan and the errors cover the rest only."""
        return self.overflow > 0 or self.nan > 0


@dataclasses.dataclass
class AccuracyRow:
    dtype: str
    dist: str
    k: int
    mean_ref: float
    max_abs_ref: float
    errors: dict[str, ErrorStats]  # keys: MODELS (emulated) or GPU_ACCUMULATORS (gpu)
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)  # gpu only
    # gpu only: max|gpu - emulation| / max|ref| over elements finite in both, and the
    # number of elements finite in one but not the other.
    agreement: dict[str, float] = dataclasses.field(default_factory=dict)
    overflow_mismatch: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def fp16_over_fp32(self) -> float:
        return _ratio(self.errors["fp16"].max_rel, self.errors["fp32"].max_rel)


@dataclasses.dataclass
class ReportResult:
    out_dir: Path
    backend: str  # "emulated" or "gpu"
    device: str
    m: int
    n: int
    ks: tuple
    rows: list[AccuracyRow]
    findings: list[str]
    markdown_path: Path
    csv_path: Path
    plot_paths: list[Path]
    text: str  # short plain-text table for the terminal
    seconds: float

    def row(self, dtype: str, dist: str, k: int) -> AccuracyRow:
        return next(r for r in self.rows if (r.dtype, r.dist, r.k) == (dtype, dist, k))


def _ratio(num: float, den: float) -> float:
    if not (math.isfinite(num) and math.isfinite(den)):
        return math.nan
    return num / den if den > 0 else (math.inf if num > 0 else math.nan)


def error_stats(out, ref, abs_product, k: int, u: float, source="emulated") -> ErrorStats:
    """Errors of ``out`` against ``ref``; ``abs_product`` = |A||B| for the bound."""
    finite = np.isfinite(out)
    overflow, nan = float(np.isinf(out).mean()), float(np.isnan(out).mean())
    if not finite.any():
        return ErrorStats(*[math.nan] * 4, overflow, nan, math.nan, source)
    err, ref_f = np.abs(out[finite] - ref[finite]), np.abs(ref[finite])
    max_abs = float(err.max())
    g = float(gamma(k, u))
    bound_ratio = math.nan  # the bound is vacuous when K*u >= 1
    if math.isfinite(g):
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios = np.where(err == 0, 0.0, err / (g * abs_product[finite]))
        bound_ratio = float(ratios.max())
    return ErrorStats(max_abs=max_abs, max_rel=_ratio(max_abs, float(ref_f.max())),
                      mean_rel=_ratio(float(err.mean()), float(ref_f.mean())),
                      bound_ratio=bound_ratio, overflow=overflow, nan=nan,
                      mean_out=float(out[finite].mean()), source=source)


def agreement(gpu_out, emu_out, ref) -> tuple[float, int]:
    both = np.isfinite(gpu_out) & np.isfinite(emu_out)
    mismatch = int((np.isfinite(gpu_out) != np.isfinite(emu_out)).sum())
    if not both.any():
        return math.nan, mismatch
    diff = float(np.abs(gpu_out[both] - emu_out[both]).max())
    return _ratio(diff, float(np.abs(ref[np.isfinite(ref)]).max())), mismatch


def _input_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


class _Progress:
    """deepgemm.cli.Progress, K-weighted (the work per case grows with K), or nothing."""

    def __init__(self, total: int, enabled: bool):
        from deepgemm import cli
        self.done = 0
        self.bar = cli.Progress(total, "accuracy report") if enabled else None

    def update(self, label: str, work: int = 0) -> None:
        self.done += work
        if self.bar is not None:
            self.bar.update(self.done, label)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _gpu_device_name(gpu_runner) -> str:
    name = getattr(gpu_runner, "device_name", None)
    if name:
        return str(name)
    from deepgemm import device
    try:
        return device.name(device.current())
    except Exception:
        return "GPU"


def run_accuracy_report(out_dir, *, ks=None, dtypes=("float16", "bfloat16"),
                        dists=("normal", "uniform", "small", "large"), m=None, n=None,
                        quick=False, backend="auto", gpu_runner: GpuRunner | None = None,
                        progress=True, seed=0, device_name=None) -> ReportResult:
    """Measure, write ``report.md``, ``accuracy.csv`` and one PNG per dtype into
    ``out_dir``, and return the data.  See the module docstring for the metrics."""
    if backend == "auto":
        backend = "gpu" if gpu_runner is not None else "emulated"
    if backend not in ("emulated", "gpu"):
        raise ValueError(f"backend must be auto, emulated or gpu, got {backend!r}")
    if backend == "gpu" and gpu_runner is None:
        raise ValueError('backend="gpu" needs a gpu_runner')
    unknown = set(dists) - set(DISTRIBUTIONS)
    if unknown:
        raise ValueError(f"unknown distributions {sorted(unknown)}; known: {list(DISTRIBUTIONS)}")
    ks = tuple(sorted(set(ks if ks is not None else (QUICK_KS if quick else FULL_KS))))
    m = m or (32 if quick else 64)
    n = n or (32 if quick else 64)
    device = (device_name or _gpu_device_name(gpu_runner)) if backend == "gpu" else "EMULATED"
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    started = time.perf_counter()
    bar = _Progress(total=len(dtypes) * sum(ks), enabled=progress)
    rows = []
    for dtype_index, dtype in enumerate(dtypes):
        in_dtype = _input_dtype(dtype)
        for k in ks:
            bar.update(f"{dtype} K={k}")
            # Inputs rounded to the input dtype; everything downstream sees these values.
            a_in, b_in = [], []
            for dist_index, dist in enumerate(dists):
                rng = np.random.default_rng([seed, dtype_index, dist_index, k])
                sample = DISTRIBUTIONS[dist][1]
                a_in.append(sample(rng, (m, k)).astype(in_dtype))
                b_in.append(sample(rng, (k, n)).astype(in_dtype))
            # All distributions in one batch: numpy's per-call cost dominates at 64 x 64.
            a64 = np.stack(a_in).astype(np.float64)
            b64 = np.stack(b_in).astype(np.float64)
            # einsum, not matmul: multithreaded OpenBLAS crawls on a busy 2-core machine.
            ref = np.einsum("bmk,bkn->bmn", a64, b64)
            abs_product = np.einsum("bmk,bkn->bmn", np.abs(a64), np.abs(b64))
            emulated = {name: emulate_gemm(a64, b64, acc, block_k)
                        for name, (acc, block_k, _) in MODELS.items()}
            for i, dist in enumerate(dists):
                row = AccuracyRow(dtype=dtype, dist=dist, k=k, mean_ref=float(ref[i].mean()),
                                  max_abs_ref=float(np.abs(ref[i]).max()), errors={})
                for name, (_, _, u) in MODELS.items():
                    row.errors[name] = error_stats(emulated[name][i], ref[i],
                                                   abs_product[i], k, u)
                if backend == "gpu":
                    _measure_on_gpu(row, gpu_runner, a_in[i], b_in[i], ref[i],
                                    abs_product[i], {nm: e[i] for nm, e in emulated.items()})
                rows.append(row)
            bar.update(f"{dtype} K={k}", work=k)
    bar.close()

    findings = compute_findings(rows, backend)
    plot_paths = [_plot(rows, dtype, out_dir, device) for dtype in dtypes]
    seconds = time.perf_counter() - started
    result = ReportResult(out_dir=out_dir, backend=backend, device=device, m=m, n=n, ks=ks,
                          rows=rows, findings=findings, markdown_path=out_dir / "report.md",
                          csv_path=out_dir / "accuracy.csv", plot_paths=plot_paths, text="",
                          seconds=seconds)
    result.markdown_path.write_text(render_markdown(result, dists))
    _write_csv(result)
    result.text = render_text(result)
    return result


def _measure_on_gpu(row, gpu_runner, a, b, ref, abs_product, emulated) -> None:
    """Replace the emulated fp32 / fp16 errors by the GPU's and compare the two."""
    del row.errors["fp16_k16"]  # a GPU row shows GPU kernels; the model is for agreement
    for acc in GPU_ACCUMULATORS:
        try:
            measured = gpu_runner(a, b, acc)
        except NotImplementedError:
            measured = None
        if measured is None:
            continue  # no kernel for this dtype/accumulator: the emulation stands in
        out, secs = measured
        out = np.asarray(out, dtype=np.float64)
        row.errors[acc] = error_stats(out, ref, abs_product, row.k, MODELS[acc][2], "gpu")
        row.seconds[acc] = float(secs)
        for model in ([acc] if acc == "fp32" else ["fp16", "fp16_k16"]):
            key = f"{acc}_vs_emulated" if model == acc else f"{acc}_vs_emulated_k16"
            row.agreement[key], row.overflow_mismatch[key] = agreement(out, emulated[model], ref)


# --------------------------------------------------------------------------- findings

def _fmt_ratio(x: float) -> str:
    if not math.isfinite(x):
        return "n/a"
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _range(values) -> str:
    values = [v for v in values if math.isfinite(v)]
    lo, hi = _fmt_ratio(min(values)), _fmt_ratio(max(values))
    return f"{lo}x" if lo == hi else f"{lo}x-{hi}x"


def compute_findings(rows: list[AccuracyRow], backend: str) -> list[str]:
    """Plain sentences, each computed from the rows."""
    findings = []
    dtypes = list(dict.fromkeys(r.dtype for r in rows))
    k_big = 1024
    for dtype in dtypes:
        big = [r for r in rows if r.dtype == dtype and r.k >= k_big and r.dist == "normal"]
        ratios = [r.fp16_over_fp32 for r in big if math.isfinite(r.fp16_over_fp32)]
        emulated_fp16 = backend == "gpu" and any(r.errors["fp16"].source == "emulated"
                                                 for r in big)
        if ratios:
            findings.append(
                f"{dtype} inputs, normal data, K >= {k_big}: FP16 accumulation's max relative "
                f"error is {_range(ratios)} that of FP32 accumulation "
                f"(median {_fmt_ratio(float(np.median(ratios)))}x)"
                + (" (FP16 emulated: no GPU kernel)." if emulated_fp16 else "."))

    fp32 = [(r.errors["fp32"].bound_ratio, r) for r in rows
            if math.isfinite(r.errors["fp32"].bound_ratio)]
    if fp32:
        worst, wr = max(fp32, key=lambda t: t[0])
        verdict = "stays within" if worst <= 1 else "EXCEEDS"
        findings.append(
            f"FP32 accumulation {verdict} the forward error bound gamma_K(2^-24)|A||B| in every "
            f"case: largest error/bound ratio {worst:.3g} ({wr.dtype}, {wr.dist}, K={wr.k}).")

    fp16_defined = [r for r in rows if math.isfinite(r.errors["fp16"].bound_ratio)]
    over_bound = [r for r in fp16_defined if r.errors["fp16"].bound_ratio > 1]
    text = ("The FP16 bound gamma_K(2^-11)|A||B| is vacuous for K >= 2048 (K*u >= 1): "
            "no guarantee at all there.")
    if over_bound:
        cases = sorted({f"{r.dist}" for r in over_bound})
        worst = max(r.errors["fp16"].bound_ratio for r in over_bound)
        text += (f" Where it is defined, FP16 accumulation exceeds it for {', '.join(cases)} "
                 f"data (up to {worst:.3g}x): the bound assumes no underflow, and products of "
                 f"~1e-6 lie in FP16's subnormal range, where the relative spacing is coarse.")
    findings.append(text)

    for dtype in dtypes:
        stalled = [r for r in rows if r.dtype == dtype and r.dist == "uniform"]
        if stalled:
            r = max(stalled, key=lambda r: r.k)
            e = r.errors["fp16"]
            findings.append(
                f"{dtype}, uniform[0,1) data, K={r.k}: the exact sums average {r.mean_ref:,.0f} "
                f"but FP16 accumulation ends at {e.mean_out:,.0f} on average (max relative error "
                f"{e.max_rel:.3g}): the sum stalls, because from 1024 on (ulp 1) every product "
                f"below 0.5 rounds away, and from 2048 on (ulp 2) every product below 1 does.")

    for name in [nm for nm in MODELS if any(nm in r.errors for r in rows)]:
        overflowed = [r for r in rows if name in r.errors and r.errors[name].overflow > 0]
        if not overflowed:
            findings.append(f"{ACCUMULATION_NAMES[name]} produced no inf or nan.")
            continue
        parts = []
        for dtype in dtypes:
            for dist in dict.fromkeys(r.dist for r in overflowed):
                cases = [r for r in overflowed if (r.dtype, r.dist) == (dtype, dist)]
                if cases:
                    first = min(cases, key=lambda r: r.k)
                    parts.append(f"{dtype}/{dist} from K={first.k} "
                                 f"({first.errors[name].overflow:.1%} of outputs, "
                                 f"{max(c.errors[name].overflow for c in cases):.0%} at worst)")
        biggest = max(r.max_abs_ref for r in overflowed)
        findings.append(
            f"OVERFLOW: {ACCUMULATION_NAMES[name]} gave inf in {len(overflowed)} cases: "
            + "; ".join(parts) + f". The exact results reach {biggest:,.0f} (FP16 max is "
            f"65504); errors in those rows are over the finite outputs only (marked *).")

    tensor = [r for r in rows if "fp16_k16" in r.errors and r.k >= k_big and r.dist == "normal"]
    gains = [_ratio(r.errors["fp16"].max_rel, r.errors["fp16_k16"].max_rel) for r in tensor]
    gains = [g for g in gains if math.isfinite(g)]
    if gains:
        findings.append(
            f"Rounding the FP16 accumulator once per k-block of 16 (the mma.sync model) instead "
            f"of after every k cuts the error {_range(gains)} (normal data, K >= {k_big}); "
            f"it remains far from FP32 accumulation.")

    if backend == "gpu":
        for key in ("fp16_vs_emulated", "fp16_vs_emulated_k16", "fp32_vs_emulated"):
            vals = [r.agreement[key] for r in rows if key in r.agreement]
            if vals:
                exact = sum(v == 0 for v in vals)
                findings.append(f"GPU vs emulation ({key}): max |gpu - emu| / max|ref| up to "
                                f"{max(vals):.3g}; bit-exact in {exact} of {len(vals)} cases.")
        times = [_ratio(r.seconds["fp16"], r.seconds["fp32"]) for r in rows
                 if {"fp16", "fp32"} <= r.seconds.keys()]
        if times:
            findings.append(f"Price of accuracy: the FP16-accumulating kernel takes "
                            f"{_range(times)} the time of the FP32-accumulating one here.")
    return findings


# --------------------------------------------------------------------------- output

def _sci(x: float) -> str:
    return "—" if not math.isfinite(x) else f"{x:.2e}"


def _overflow_cell(e: ErrorStats) -> str:
    if not e.finite_only:
        return "—"
    parts = [f"inf {e.overflow:.1%}"] if e.overflow else []
    return " ".join(parts + ([f"nan {e.nan:.1%}"] if e.nan else []))


def _err_cell(e: ErrorStats, gpu: bool, with_overflow=False) -> str:
    cell = _sci(e.max_rel) + ("*" if e.finite_only else "")
    if with_overflow and e.finite_only:
        cell += f" ({_overflow_cell(e)})"
    return cell + (" (emu)" if gpu and e.source == "emulated" else "")


HEADING = "# deepgemm accuracy report — "
EMULATED_TITLE = "EMULATED on the CPU (no GPU)"


def render_markdown(result: ReportResult, dists) -> str:
    gpu = result.backend == "gpu"
    title = result.device if gpu else EMULATED_TITLE
    lines = [
        HEADING + title,
        "",
        ("Measured with deepgemm's kernels on " + result.device + "; the emulation is used "
         "for the agreement columns." if gpu else
         "**EMULATED**: every accumulator below is an exact CPU emulation "
         "(`deepgemm.report.emulate`): products exact in float64, the running sum rounded to "
         "the accumulator's precision (round to nearest even) after every k, or after every "
         "block of 16 k for the tensor-core model; overflow to inf exactly as on hardware. "
         "No GPU was used."),
        "",
        f"Problem: C = A·B with M×N = {result.m}×{result.n}, K in {list(result.ks)}; "
        f"one fresh A, B per case (seeded), rounded to the input dtype. Reference: the same "
        f"rounded A, B multiplied in float64.",
        "",
        "Distributions: " + "; ".join(f"`{d}` = {DISTRIBUTIONS[d][0]}" for d in dists) + ".",
        "",
        "Columns: *max rel* = max|Ĉ−C| / max|C| (normwise; the elementwise ratio is unbounded "
        "where C≈0). *bound* = max over elements of |Ĉ−C| / (γ_K(u)·(|A||B|)), "
        "γ_K(u) = Ku/(1−Ku) (Higham §3.1), u = 2^-24 for FP32 and 2^-11 for FP16 "
        "accumulation; ≤ 1 means within the classical bound, n/a where Ku ≥ 1. *overflow*: "
        "share of outputs that are inf/nan; rows marked * had some, and their errors are over "
        "the finite outputs only.",
    ]
    if gpu:
        lines += ["",
                  "*agree k1 / k16* = max|GPU − emulation| / max|C| for the FP16-accumulating "
                  "kernel against the per-k emulation and the k-block-16 emulation. A CUDA-core "
                  "`hfma2` kernel rounds once per k (an FMA), so it should match k1 exactly if it "
                  "visits k in order; tensor cores (`mma.sync` with f16 accumulators) may round "
                  "once per k-block and their internal adder is not specified, so exact agreement "
                  "is not expected there: k16 should be the closer. Values marked (emu) had no "
                  "GPU kernel (e.g. bf16 mma has no f16 accumulator) and show the emulation."]
    lines += ["", "## Findings", ""] + [f"- {f}" for f in result.findings]

    for dtype in dict.fromkeys(r.dtype for r in result.rows):
        lines += ["", f"## Inputs {dtype}", "",
                  f"![max relative error vs K, {dtype}](accuracy_{dtype}.png)", ""]
        header = ["K", "dist", "FP32 max rel", "FP16 max rel", "FP16/FP32"]
        header += [] if gpu else ["FP16 k-block-16 max rel"]
        header += ["FP32 bound", "FP16 bound", "FP32 overflow", "FP16 overflow"]
        header += ["agree k1", "agree k16", "FP32 time µs", "FP16 time µs"] if gpu else []
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        rows = sorted((r for r in result.rows if r.dtype == dtype),
                      key=lambda r: (list(dists).index(r.dist), r.k))
        for r in rows:
            e32, e16 = r.errors["fp32"], r.errors["fp16"]
            cells = [str(r.k), r.dist, _err_cell(e32, gpu), _err_cell(e16, gpu),
                     _fmt_ratio(r.fp16_over_fp32)]
            if not gpu:
                cells.append(_err_cell(r.errors["fp16_k16"], gpu, with_overflow=True))
            cells += [_fmt_bound(e32.bound_ratio), _fmt_bound(e16.bound_ratio),
                      _overflow_cell(e32), _overflow_cell(e16)]
            if gpu:
                cells += [_sci(r.agreement.get("fp16_vs_emulated", math.nan)),
                          _sci(r.agreement.get("fp16_vs_emulated_k16", math.nan)),
                          *(f"{r.seconds[a] * 1e6:.1f}" if a in r.seconds else "—"
                            for a in ("fp32", "fp16"))]
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Generated in {result.seconds:.0f} s; raw numbers in `accuracy.csv`.", ""]
    return "\n".join(lines)


def _fmt_bound(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.3g}"


def _write_csv(result: ReportResult) -> None:
    stat_fields = [f.name for f in dataclasses.fields(ErrorStats)]
    with open(result.csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["dtype", "dist", "k", "accumulator", *stat_fields, "seconds",
                    "agreement", "agreement_k16", "overflow_mismatch"])
        for r in result.rows:
            for name, e in r.errors.items():
                w.writerow([r.dtype, r.dist, r.k, name, *(getattr(e, s) for s in stat_fields),
                            r.seconds.get(name, ""), r.agreement.get(f"{name}_vs_emulated", ""),
                            r.agreement.get(f"{name}_vs_emulated_k16", ""),
                            r.overflow_mismatch.get(f"{name}_vs_emulated", "")])


def render_text(result: ReportResult) -> str:
    """A short terminal table: a few K values, every dtype and distribution."""
    wanted = {min(result.ks), max(result.ks)} | ({1024} & set(result.ks))
    lines = [f"deepgemm accuracy ({result.device}, {result.m}x{result.n}, max relative error; "
             f"full report: {result.markdown_path})",
             f"{'dtype':<9} {'dist':<8} {'K':>6} {'fp32 acc':>9} {'fp16 acc':>9} "
             f"{'fp16/fp32':>9}  fp16 overflow"]
    for r in result.rows:
        if r.k in wanted:
            e16 = r.errors["fp16"]
            lines.append(f"{r.dtype:<9} {r.dist:<8} {r.k:>6} {_sci(r.errors['fp32'].max_rel):>9} "
                         f"{_sci(e16.max_rel):>9} {_fmt_ratio(r.fp16_over_fp32):>9}  "
                         f"{_overflow_cell(e16)}")
    return "\n".join(lines)


def _plot(rows, dtype: str, out_dir: Path, device: str) -> Path:
    from matplotlib.figure import Figure  # no pyplot: no global state, no display needed

    fig = Figure(figsize=(11, 5.5))
    ax = fig.add_subplot()
    dtype_rows = [r for r in rows if r.dtype == dtype]
    ks = sorted({r.k for r in dtype_rows})
    styles = {"fp32": "-", "fp16": "--", "fp16_k16": ":"}
    overflow_markers = {"fp32": "o", "fp16": "x", "fp16_k16": "+"}
    colors = dict(zip(dict.fromkeys(r.dist for r in dtype_rows), ("C0", "C1", "C2", "C3", "C4")))
    for dist, color in colors.items():
        series = sorted((r for r in dtype_rows if r.dist == dist), key=lambda r: r.k)
        for name, style in styles.items():
            if name not in series[0].errors:
                continue
            errs = [r.errors[name].max_rel for r in series]
            y = [e if math.isfinite(e) and e > 0 else math.nan for e in errs]
            ax.plot([r.k for r in series], y, style, color=color, marker=".",
                    label=f"{MODEL_LABELS[name]}, {dist}")
            over = [r.k for r in series if r.errors[name].overflow > 0]
            if over:  # inf outputs are an unbounded error: drawn at 1 with a cross
                ax.plot(over, [1.0] * len(over), overflow_markers[name], color=color,
                        markersize=10, mew=2, fillstyle="none")
    for name, color in (("fp32", "0.5"), ("fp16", "0.75")):
        u = UNIT_ROUNDOFF[name]
        bound = [float(gamma(k, u)) for k in ks]
        ax.plot(ks, [b if math.isfinite(b) else math.nan for b in bound], "-", color=color,
                lw=3, alpha=0.5, label=f"γ_K(u), u = {u:.2g} ({name})")
    ax.set(xscale="log", yscale="log", xlabel="K", ylabel="max |C^ - C| / max |C|",
           title=f"GEMM accuracy, {dtype} inputs ({device})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              title="overflow to inf drawn at 1:\n× per-k FP16, + k-block-16, o FP32",
              title_fontsize=7)
    fig.tight_layout()
    path = out_dir / f"accuracy_{dtype}.png"
    fig.savefig(path, dpi=110)
    return path


def default_gpu_runner() -> GpuRunner | None:
    """deepgemm's kernels (deepgemm.report.gpu_runner) when a usable GPU is present, else None
    (the emulation), saying why on stderr when a GPU is there but cannot be used."""
    from deepgemm.device import gpu_available

    if not gpu_available()[0]:
        return None
    from .gpu_runner import make_gpu_runner
    try:
        return make_gpu_runner()
    except RuntimeError as exc:
        print(f"[accuracy] GPU not used, emulating: {exc}", file=sys.stderr)
        return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `python -m deepgemm report accuracy` options."""
    from deepgemm import cli
    parser.add_argument("--out", type=Path, default=None, required=cli.repo_path("docs", "accuracy") is None,
                        help="output folder (default: the repository's docs/accuracy, where the committed "
                             "report lives, except for an emulated run while that report is a GPU's; "
                             "required outside a source checkout)")
    parser.add_argument("--quick", action="store_true", help=f"K in {QUICK_KS}, 32x32")
    parser.add_argument("--emulated", action="store_true",
                        help="use the CPU emulation even when a GPU runner is available")
    parser.add_argument("--ks", type=lambda s: [int(k) for k in s.split(",")],
                        help="comma-separated K values")
    parser.add_argument("--size", type=int, help="M = N (default 64, quick 32)")
    parser.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace, *, gpu_runner: GpuRunner | None = None) -> int:
    """Measures on the GPU with deepgemm's kernels when one is available (default_gpu_runner),
    unless ``--emulated``; otherwise, or without a GPU, the CPU emulation. An emulated run never
    replaces the committed GPU-measured report by default: it needs --out."""
    from deepgemm import cli
    if gpu_runner is None and not args.emulated:
        gpu_runner = default_gpu_runner()
    out = args.out if args.out is not None else cli.repo_path("docs", "accuracy")
    committed = out / "report.md"
    if args.out is None and (args.emulated or gpu_runner is None) and committed.is_file() \
            and not committed.read_text(encoding="utf-8").startswith(HEADING + EMULATED_TITLE):
        print(f"report accuracy: no GPU measures this run ({'--emulated' if args.emulated else 'none is usable here'}), "
              f"and {committed} is a GPU's report: an emulated one goes elsewhere, give --out DIR "
              f"(--out {out} replaces it on purpose)", file=sys.stderr)
        return 2
    result = run_accuracy_report(
        out, ks=args.ks, quick=args.quick, m=args.size, n=args.size,
        backend="emulated" if args.emulated else "auto",
        gpu_runner=None if args.emulated else gpu_runner, progress=not args.no_progress)
    print(result.text)
    print(f"{len(result.rows)} cases in {result.seconds:.1f} s -> {result.markdown_path}")
    return 0


def main(argv=None, *, gpu_runner: GpuRunner | None = None) -> int:
    """``report accuracy`` on its own (tests inject a gpu_runner): the options of ``python -m
    deepgemm report accuracy``."""
    parser = argparse.ArgumentParser(prog="python -m deepgemm report accuracy",
                                     description="FP32 vs FP16 accumulation accuracy report")
    add_arguments(parser)
    return run(parser.parse_args(argv), gpu_runner=gpu_runner)


if __name__ == "__main__":
    sys.exit(main())
