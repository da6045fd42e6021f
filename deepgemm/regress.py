"""Performance regressions from stored pytest-benchmark runs, one folder per GPU model.

Reads pytest-benchmark's JSON as written by ``--benchmark-save``/``--benchmark-autosave`` (into
``regressions/<gpu_slug>/<OS-Python-bits>/NNNN_*.json``) or ``--benchmark-json``: top-level
``machine_info`` (with ``gpu`` added by deepgemm.testing.benchplugin), ``commit_info``,
``datetime`` and ``benchmarks`` (``name``, ``fullname``, ``stats`` in seconds, ``extra_info``).

CLI (``python -m deepgemm regress ...``: ``add_arguments`` and ``run``)::

    regress compare CURRENT.json [--baseline FILE] [--regressions DIR] [--threshold 5%]
    regress history [GPU] [--regressions DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from deepgemm.bench import gpu_slug

STATUSES = ("slower", "faster", "same", "new", "missing")
RECORD_HINT = "record one on that GPU with: pytest tests/bench --benchmark-only --benchmark-save=baseline"


class BaselineNotFound(LookupError):
    pass


class GPUMismatch(ValueError):
    pass


# ---------------------------------------------------------------------------------------------
# Runs


@dataclass
class Run:
    """One pytest-benchmark JSON file."""

    data: dict
    path: Path | None = None

    @property
    def gpu_name(self) -> str | None:
        return (self.data.get("machine_info", {}).get("gpu") or {}).get("name")

    @property
    def commit(self) -> str:
        info = self.data.get("commit_info") or {}
        commit = str(info.get("id") or "unknown")[:10]
        return commit + ("+dirty" if info.get("dirty") else "")

    @property
    def timestamp(self) -> datetime:
        try:
            when = datetime.fromisoformat(self.data["datetime"])
        except (KeyError, TypeError, ValueError):
            mtime = self.path.stat().st_mtime if self.path else 0.0
            return datetime.fromtimestamp(mtime, timezone.utc)
        return when if when.tzinfo else when.replace(tzinfo=timezone.utc)

    @property
    def benchmarks(self) -> dict[str, dict]:
        return {b["fullname"]: b for b in self.data.get("benchmarks", [])}

    def __str__(self) -> str:
        return str(self.path) if self.path else f"<run {self.commit}>"


def load_run(path) -> Run:
    path = Path(path)
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or "benchmarks" not in data:
        raise ValueError(f"{path} is not a pytest-benchmark run (no 'benchmarks' key)")
    return Run(data, path)


def _as_run(run) -> Run:
    return run if isinstance(run, Run) else Run(run)


def load_runs(folder) -> list[Run]:
    """Every readable run below `folder`, oldest first; unreadable files warn and are skipped."""
    runs = []
    for path in sorted(Path(folder).rglob("*.json")):
        try:
            runs.append(load_run(path))
        except (OSError, ValueError) as exc:
            warnings.warn(f"skipping {path}: {exc}", stacklevel=2)
    # The file number breaks ties: pytest-benchmark numbers runs 0001, 0002, ... per folder.
    return sorted(runs, key=lambda r: (r.timestamp, r.path.name))


def gpus_with_runs(regressions_dir: Path) -> dict[str, Path]:
    """GPU model -> its folder, for every folder below regressions_dir holding runs."""
    found: dict[str, Path] = {}
    if not regressions_dir.is_dir():
        return found
    for folder in sorted(p for p in regressions_dir.iterdir() if p.is_dir()):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            runs = load_runs(folder)
        for run in runs:
            found.setdefault(run.gpu_name or f"(no GPU recorded) {folder.name}", folder)
    return found


def find_baseline(regressions_dir, gpu_name: str, *, exclude=()) -> Run:
    """The newest run recorded on exactly `gpu_name`, from regressions_dir/<gpu_slug(gpu_name)>.

    Runs in that folder whose machine_info names another GPU (or none) are ignored; `exclude`
    lists files to skip (the current run, when it was saved into the same folder).
    """
    regressions_dir = Path(regressions_dir)
    folder = regressions_dir / gpu_slug(gpu_name)
    excluded = {Path(p).resolve() for p in ([exclude] if isinstance(exclude, (str, Path)) else exclude)}
    candidates = [
        run for run in (load_runs(folder) if folder.is_dir() else [])
        if run.gpu_name == gpu_name and run.path.resolve() not in excluded
    ]
    if candidates:
        return candidates[-1]
    others = {name: path for name, path in gpus_with_runs(regressions_dir).items() if name != gpu_name}
    have = ", ".join(f"{name!r} ({path})" for name, path in others.items()) or "none"
    state = "has no run recorded on that GPU" if folder.is_dir() else "does not exist"
    raise BaselineNotFound(
        f"No baseline for GPU {gpu_name!r}: looked in {folder}, which {state}. "
        f"GPU models with baselines under {regressions_dir}: {have}. To create one, {RECORD_HINT}."
    )


# ---------------------------------------------------------------------------------------------
# Compare


@dataclass(frozen=True)
class Verdict:
    name: str
    status: str  # one of STATUSES
    base_median: float | None = None  # seconds
    cur_median: float | None = None
    change: float | None = None  # (cur - base) / base
    tolerance: float | None = None  # |change| must exceed this to count as slower/faster
    noise_base: float | None = None
    noise_cur: float | None = None


def relative_noise(stats: dict) -> float:
    """A run's noise as IQR/median; relative stddev where no IQR was stored.

    IQR rather than stddev: one slow round (clock dip, a preempting process) inflates stddev and
    would then hide real regressions, while the quartiles barely move.
    """
    median = stats.get("median") or 0.0
    if median > 0 and stats.get("iqr") is not None:
        return float(stats["iqr"]) / median
    mean = stats.get("mean") or 0.0
    return float(stats.get("stddev") or 0.0) / mean if mean > 0 else 0.0


def _same_gpu(baseline: Run, current: Run) -> None:
    base, cur = baseline.gpu_name, current.gpu_name
    if base is None or cur is None:
        missing = baseline if base is None else current
        raise GPUMismatch(f"{missing} records no GPU model (machine_info.gpu.name), so it cannot "
                          f"be checked against the other run's GPU; refusing to compare.")
    if base != cur:
        raise GPUMismatch(f"Refusing to compare across GPU models: baseline {baseline} was recorded "
                          f"on {base!r}, current run {current} on {cur!r}.")


# CUDA events resolve about 0.5 µs, so the medians of two runs of a µs-scale kernel can land one
# quantum apart even when every round inside each run reads the same value (IQR 0). A change
# must exceed two quanta before it can count, whatever the relative numbers say.
MIN_ABS_DIFF_S = 1e-6


def compare(baseline_run, current_run, *, threshold: float = 0.05,
            min_abs_diff: float = MIN_ABS_DIFF_S) -> list[Verdict]:
    """Noise-aware verdict per benchmark, by fullname.

    'slower' needs (cur - base)/base > max(threshold, noise_base + noise_cur) and
    cur - base > min_abs_diff (seconds); 'faster' is the mirror image; in between is 'same'.
    Adding both runs' relative IQRs widens the band for benchmarks whose rounds scatter
    (µs-scale kernels), in the spirit of nvbench's compare.
    """
    baseline, current = _as_run(baseline_run), _as_run(current_run)
    _same_gpu(baseline, current)
    base_benches, cur_benches = baseline.benchmarks, current.benchmarks
    verdicts = []
    for name, cur in cur_benches.items():
        base = base_benches.get(name)
        if base is None:
            verdicts.append(Verdict(name, "new", cur_median=cur["stats"]["median"]))
            continue
        b, c = base["stats"]["median"], cur["stats"]["median"]
        noise_b, noise_c = relative_noise(base["stats"]), relative_noise(cur["stats"])
        tolerance = max(threshold, noise_b + noise_c)
        change = (c - b) / b if b > 0 else float("inf")
        significant = abs(c - b) > min_abs_diff and abs(change) > tolerance
        status = "same" if not significant else "slower" if change > 0 else "faster"
        verdicts.append(Verdict(name, status, b, c, change, tolerance, noise_b, noise_c))
    for name, base in base_benches.items():
        if name not in cur_benches:
            verdicts.append(Verdict(name, "missing", base_median=base["stats"]["median"]))
    return verdicts


def format_verdicts(verdicts: list[Verdict]) -> str:
    def us(seconds):
        return "" if seconds is None else f"{seconds * 1e6:.2f}"

    def pct(frac):
        return "" if frac is None else f"{frac * 100:+.1f}%"

    rows = [("benchmark", "base µs", "current µs", "change", "tolerance", "verdict")]
    for v in verdicts:
        tol = "" if v.tolerance is None else f"±{v.tolerance * 100:.1f}%"
        rows.append((v.name, us(v.base_median), us(v.cur_median), pct(v.change), tol, v.status.upper()
                     if v.status == "slower" else v.status))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in
                       enumerate(zip(row, widths))) for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# History


def throughput(bench: dict) -> tuple[float, str]:
    """(value, unit): TFLOP/s from extra_info 'tflops', or from a stored operation count over the
    median ('flops'/'ops', or m, n, k as 2*M*N*K), else 1/median in runs per second."""
    extra = bench.get("extra_info") or {}
    median = bench["stats"]["median"]
    if extra.get("tflops") is not None:
        return float(extra["tflops"]), "TFLOP/s"
    flops = extra.get("flops", extra.get("ops"))
    if flops is None and all(extra.get(d) is not None for d in "mnk"):
        flops = 2.0 * extra["m"] * extra["n"] * extra["k"]
    if flops is not None and median > 0:
        return float(flops) / median / 1e12, "TFLOP/s"
    return (1.0 / median if median > 0 else 0.0), "runs/s"


def history(gpu_folder, out_dir, match: str | None = None) -> tuple[Path, Path]:
    """Plot throughput per benchmark per commit from every run in `gpu_folder`.

    One row per commit (its newest run), commits in time order. match: a regular expression;
    only benchmarks whose name it finds are kept (a suite of hundreds is unreadable in one plot).
    Writes <slug>.png and <slug>.md into out_dir and returns their paths.
    """
    import re
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on CI machines
    import matplotlib.pyplot as plt

    gpu_folder = Path(gpu_folder)
    runs = load_runs(gpu_folder)
    if not runs:
        raise BaselineNotFound(f"No pytest-benchmark runs under {gpu_folder}; {RECORD_HINT}.")
    newest_per_commit: dict[str, Run] = {}
    for run in runs:  # oldest first, so later runs of a commit replace earlier ones
        newest_per_commit.pop(run.commit, None)
        newest_per_commit[run.commit] = run
    rows = sorted(newest_per_commit.values(), key=lambda r: r.timestamp)

    names: list[str] = []
    units: dict[str, str] = {}
    table: list[dict[str, float]] = []
    for run in rows:
        values = {}
        for fullname, b in run.benchmarks.items():
            if match and not re.search(match, fullname):
                continue
            values[fullname], units[fullname] = throughput(b)
            if fullname not in names:
                names.append(fullname)
        table.append(values)

    short = {f: f.rsplit("::", 1)[-1] for f in names}
    if len(set(short.values())) < len(short):  # keep names unique
        short = {f: f for f in names}
    label = {f: f"{short[f]} ({units[f]})" for f in names}

    gpu = next((r.gpu_name for r in reversed(rows) if r.gpu_name), gpu_folder.name)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    slug = gpu_slug(gpu)
    png, md = out_dir / f"{slug}.png", out_dir / f"{slug}.md"

    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * len(rows) + 3), 4.5))
    # Benchmarks without an operation count are plotted in runs/s on a second axis, so that
    # they do not flatten the TFLOP/s lines.
    other_ax = ax.twinx() if any(u != "TFLOP/s" for u in units.values()) else None
    xs = list(range(len(rows)))
    for i, f in enumerate(names):
        points = [(x, vals[f]) for x, vals in zip(xs, table) if f in vals]
        target = ax if units[f] == "TFLOP/s" else other_ax
        target.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                    linestyle="-" if target is ax else "--", color=f"C{i % 10}", label=label[f])
    ax.set_xticks(xs, [r.commit for r in rows], rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("TFLOP/s (device time)")
    ax.set_title(f"deepgemm benchmark history: {gpu}")
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if other_ax is not None:
        other_ax.set_ylabel("runs/s (1 / median)")
        more = other_ax.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    # Below the axes: with many benchmarks an inside legend hides the lines.
    ax.legend(handles, labels, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22),
              ncol=2, frameon=False)
    fig.savefig(png, dpi=120, bbox_inches="tight")
    plt.close(fig)

    lines = [f"# Benchmark history: {gpu}", "",
             "| commit | date | " + " | ".join(label[f] for f in names) + " |",
             "|---|---|" + "---:|" * len(names)]
    for run, vals in zip(rows, table):
        cells = [f"{vals[f]:.1f}" if f in vals else "" for f in names]
        lines.append(f"| {run.commit} | {run.timestamp:%Y-%m-%d %H:%M} | " + " | ".join(cells) + " |")
    md.write_text("\n".join(lines) + "\n")
    return png, md


# ---------------------------------------------------------------------------------------------
# CLI


def _threshold(text: str) -> float:
    value = float(text.rstrip("%")) / 100 if text.endswith("%") else float(text)
    if not 0 <= value < 10:
        raise argparse.ArgumentTypeError(f"threshold {text!r} out of range")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `python -m deepgemm regress` options: subcommands compare and history."""
    from deepgemm import cli
    regressions = cli.repo_path("regressions")
    where = "the repository's regressions/; required outside a source checkout"
    sub = parser.add_subparsers(dest="regress_command", metavar="command", required=True, title="commands")
    cmp = sub.add_parser("compare", help="noise-aware compare of a run against this GPU's baseline; "
                                         "exit 1 when a benchmark got slower",
                         prog="python -m deepgemm regress compare")
    cmp.add_argument("current", help="pytest-benchmark JSON of the run to check (--benchmark-json)")
    cmp.add_argument("--baseline", help="baseline JSON (default: newest run for the same GPU model)")
    cmp.add_argument("--regressions", type=Path, default=regressions,
                     help=f"per-GPU baselines root (default: {where})")
    cmp.add_argument("--threshold", type=_threshold, default=0.05, help="e.g. 5%% or 0.05")
    cmp.add_argument("--min-diff-us", type=float, default=MIN_ABS_DIFF_S * 1e6,
                     help="ignore median changes smaller than this (default: 2 event-timer quanta)")
    hist = sub.add_parser("history", help="TFLOP/s per benchmark per commit (PNG + Markdown)",
                          prog="python -m deepgemm regress history")
    hist.add_argument("gpu", nargs="?", help="GPU model or folder name (default: the only one, "
                                             "else the current device)")
    hist.add_argument("--regressions", type=Path, default=regressions, help=f"per-GPU baselines root "
                                                                              f"(default: {where})")
    hist.add_argument("--out", default="regress-history", help="output folder (default: regress-history in "
                                                                   "the working directory)")
    hist.add_argument("--match", type=cli.regex, default=None,
                      help="regular expression: keep only the benchmarks it finds")


def _history_folder(regressions: Path, gpu: str | None) -> Path:
    if gpu:
        for candidate in (regressions / gpu, regressions / gpu_slug(gpu)):
            if candidate.is_dir():
                return candidate
        raise BaselineNotFound(f"No folder for GPU {gpu!r} under {regressions} "
                               f"(have: {', '.join(gpus_with_runs(regressions)) or 'none'}).")
    folders = sorted(set(gpus_with_runs(regressions).values()))
    if len(folders) == 1:
        return folders[0]
    from deepgemm import bench

    if bench.gpu_available()[0]:
        return _history_folder(regressions, bench.gpu_identity()["name"])
    raise BaselineNotFound(f"Name the GPU: {regressions} holds runs for "
                           f"{', '.join(gpus_with_runs(regressions)) or 'no GPU at all'}.")


def run(args: argparse.Namespace) -> int:
    try:
        if args.regress_command == "compare":
            current = load_run(args.current)
            if current.gpu_name is None:
                raise GPUMismatch(f"{current} records no GPU model; was it run with "
                                  f"deepgemm.testing.benchplugin loaded?")
            baseline = (load_run(args.baseline) if args.baseline else
                        find_baseline(_regressions(args), current.gpu_name, exclude=[args.current]))
            verdicts = compare(baseline, current, threshold=args.threshold,
                               min_abs_diff=args.min_diff_us * 1e-6)
            print(f"GPU {current.gpu_name}: {current} vs baseline {baseline} "
                  f"(commit {baseline.commit}); threshold {args.threshold:.0%} or the runs' noise")
            print(format_verdicts(verdicts))
            slower = [v.name for v in verdicts if v.status == "slower"]
            if slower:
                print(f"\nREGRESSION: {len(slower)} benchmark(s) slower: {', '.join(slower)}")
                return 1
            return 0
        png, md = history(_history_folder(_regressions(args), args.gpu), args.out, args.match)
        print(f"wrote {png}\nwrote {md}")
        return 0
    except (BaselineNotFound, GPUMismatch, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _regressions(args) -> Path:
    if args.regressions is None:
        raise BaselineNotFound("no regressions folder: deepgemm is installed without its repository; pass "
                               "--regressions DIR (the repository's regressions/ folder)")
    return Path(args.regressions)


def main(argv=None) -> int:
    """`regress` on its own: the same options as `python -m deepgemm regress`."""
    parser = argparse.ArgumentParser(prog="python -m deepgemm regress", description="Per-GPU benchmark regressions.")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
