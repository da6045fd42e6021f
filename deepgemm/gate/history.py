"""Benchmark history across stored runs, with step changes attributed to the commit where they appeared.

Reads the runs in a key's history folder (regressions/<GPU>/<key>/history/), keeps the newest
run per commit, and follows each benchmark's median device time and its ratio to the same-run
reference (median time / reference median: 1.00 is cuBLAS's speed, lower is better). The ratio
is drift-robust, so step detection runs on it (on the absolute median when a benchmark has no
reference).

Step detection, in the spirit of asv's: fit a piecewise-constant function to the log of the
series by minimising  sum over segments of sum |y - median(segment)|  +  gamma per segment
(optimal partitioning, exact by dynamic programming; L1 so that one odd run moves a level
little). gamma = max(log(1 + min_change), 3 * noise), noise being a robust estimate of the
run-to-run scatter (1.4826 * MAD of successive differences / sqrt 2). Adjacent levels closer than
min_change are merged. Each remaining boundary is a step, attributed to the first commit of the
new level; a step at the newest commit rests on that one run.
"""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass
from pathlib import Path

from deepgemm.gate import stats
from deepgemm.gate.runs import BaselineNotFound, Run, gpu_slug, load_runs, reference, samples

MIN_STEP = 0.05  # the gate's effect floor
# Optimal partitioning here is cubic in the number of commits: the newest MAX_COMMITS keep a
# history of hundreds of benchmarks to seconds.
MAX_COMMITS = 150


@dataclass(frozen=True)
class Step:
    index: int  # first point of the new level
    before: float  # level (median) before, in the series' unit
    after: float

    @property
    def change(self) -> float:
        return self.after / self.before - 1


def _segment_costs(y: list[float]) -> list[list[float]]:
    """cost[i][j] = sum |y_k - median(y_i..y_{j-1})| for all 0 <= i < j <= n."""
    n = len(y)
    cost = [[0.0] * (n + 1) for _ in range(n + 1)]
    for i in range(n):
        window: list[float] = []
        for j in range(i, n):
            bisect.insort(window, y[j])
            med = stats.median(window)
            cost[i][j + 1] = sum(abs(v - med) for v in window)
    return cost


def step_penalty(y: list[float], min_change: float) -> float:
    """gamma, the price of one more segment of the log-series y (two points or more): the larger
    of log(1 + min_change) and 3 * noise, noise = 1.4826 * median |y[i+1] - y[i]| / sqrt 2 (the
    MAD of successive differences, scaled to one run's standard deviation)."""
    diffs = [abs(b - a) for a, b in zip(y, y[1:])]
    noise = 1.4826 * stats.median(diffs) / math.sqrt(2)
    return max(math.log1p(min_change), 3 * noise)


def detect_steps(values, min_change: float = MIN_STEP) -> list[Step]:
    """Step changes in a positive series (see the module docstring)."""
    values = [float(v) for v in values]
    if any(not v > 0 for v in values):
        raise ValueError(f"values: must all be positive, got {values}")
    if not 0 <= min_change < 10:
        raise ValueError(f"min_change: must be in [0, 10), got {min_change!r}")
    n = len(values)
    if n < 2:
        return []
    y = [math.log(v) for v in values]
    gamma = step_penalty(y, min_change)
    cost = _segment_costs(y)
    best = [0.0] + [math.inf] * n
    start = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):
            total = best[i] + cost[i][j] + gamma
            if total < best[j]:
                best[j], start[j] = total, i
    bounds, j = [], n
    while j > 0:
        bounds.append((start[j], j))
        j = start[j]
    segments = sorted(bounds)
    # Merge neighbours whose levels differ by less than the floor.
    merged = [list(segments[0])]
    for i, j in segments[1:]:
        level_prev = stats.median(values[merged[-1][0]:merged[-1][1]])
        level = stats.median(values[i:j])
        if abs(level / level_prev - 1) < min_change:
            merged[-1][1] = j
        else:
            merged.append([i, j])
    steps = []
    for (i0, j0), (i1, j1) in zip(merged, merged[1:]):
        steps.append(Step(i1, stats.median(values[i0:j0]), stats.median(values[i1:j1])))
    return steps


# ---------------------------------------------------------------------------------------------
# Series from runs


@dataclass(frozen=True)
class Point:
    run: int  # index into the history's runs
    median_s: float
    reference_s: float | None
    tflops: float | None

    @property
    def ratio(self) -> float | None:
        return self.median_s / self.reference_s if self.reference_s else None


def _reference_seconds(bench: dict) -> float | None:
    ref = reference(bench)
    if ref:
        if ref.get("samples"):
            return stats.median(ref["samples"])
        if ref.get("median"):
            return float(ref["median"])
    legacy = (bench.get("extra_info") or {}).get("reference_us")  # runs before named references
    return float(legacy) * 1e-6 if legacy else None


def _median(bench: dict) -> float:
    data = samples(bench)
    return stats.median(data) if data else float(bench["stats"]["median"])


def _tflops(bench: dict, median_s: float) -> float | None:
    extra = bench.get("extra_info") or {}
    flops = extra.get("flops")
    if flops is None and all(extra.get(d) is not None for d in "mnk"):
        flops = 2.0 * extra["m"] * extra["n"] * extra["k"]
    return float(flops) / median_s / 1e12 if flops and median_s > 0 else None


@dataclass
class History:
    runs: list[Run]  # one per commit, oldest first
    series: dict[str, list[Point]]
    steps: dict[str, list[Step]]  # on the ratio series, or the absolute one without reference

    def uses_ratio(self, name: str) -> bool:
        return all(p.ratio is not None for p in self.series[name])


def build(runs: list[Run], match: str | None = None, min_change: float = MIN_STEP) -> History:
    if not runs:
        raise ValueError("runs: no runs to build a history from")
    pattern = re.compile(match) if match else None
    newest: dict[str, Run] = {}
    for run in sorted(runs, key=lambda r: r.timestamp):  # a later run of a commit replaces it
        newest.pop(run.commit, None)
        newest[run.commit] = run
    ordered = sorted(newest.values(), key=lambda r: r.timestamp)[-MAX_COMMITS:]
    series: dict[str, list[Point]] = {}
    for index, run in enumerate(ordered):
        for name, bench in run.benchmarks.items():
            if pattern and not pattern.search(name):
                continue
            median_s = _median(bench)
            if median_s <= 0:
                continue
            series.setdefault(name, []).append(
                Point(index, median_s, _reference_seconds(bench), _tflops(bench, median_s)))
    hist = History(ordered, series, {})
    for name, points in series.items():
        values = [p.ratio for p in points] if hist.uses_ratio(name) else [p.median_s for p in points]
        hist.steps[name] = detect_steps(values, min_change)
    return hist


def key_folders(root, gpu: str | None = None) -> list[Path]:
    """Key folders (regressions/<GPU>/<key>) with history, newest activity first."""
    root = Path(root)
    folders = [p.parent for p in root.glob("*/*/history") if p.is_dir() and any(p.glob("*.json"))]
    if gpu:
        folders = [f for f in folders if f.parent.name in (gpu, gpu_slug(gpu))]
    return sorted(folders, key=lambda f: max(p.stat().st_mtime for p in (f / "history").glob("*.json")),
                  reverse=True)


def load_history(folder) -> list[Run]:
    folder = Path(folder)
    runs = load_runs(folder / "history") if (folder / "history").is_dir() else []
    if not runs:
        raise BaselineNotFound(f"No runs under {folder / 'history'}")
    return runs


# ---------------------------------------------------------------------------------------------
# Rendering


def _short_names(names) -> dict[str, str]:
    short = {f: f.rsplit("::", 1)[-1] for f in names}
    return short if len(set(short.values())) == len(short) else {f: f for f in names}


def markdown(hist: History, title: str) -> str:
    names = list(hist.series)
    short = _short_names(names)
    runs = hist.runs
    lines = [f"# Benchmark history: {title}", "",
             f"{len(runs)} commit(s), oldest first. Cell: median device time in µs, then the ratio "
             f"to the same-run reference (cuBLAS on the same operands; 1.00 = cuBLAS's speed, lower "
             f"is better). ▲ / ▼: a step change (slower / faster) appears at that commit, found on "
             f"the ratio (on the time where a benchmark has no reference).", ""]
    all_steps = [(name, s) for name in names for s in hist.steps[name]]
    lines += ["## Step changes", ""]
    if all_steps:
        lines += ["| benchmark | commit | date | scale | before | after | change |",
                  "|---|---|---|---|---:|---:|---:|"]
        for name, s in sorted(all_steps, key=lambda t: (t[1].index, t[0])):
            point = hist.series[name][s.index]
            run = runs[point.run]
            scale = "vs ref" if hist.uses_ratio(name) else "µs"
            fmt = (lambda v: f"{v:.3f}") if scale == "vs ref" else (lambda v: f"{v * 1e6:.2f}")
            newest = " (newest run only)" if s.index == len(hist.series[name]) - 1 else ""
            lines.append(f"| {short[name]} | {run.commit}{newest} | {run.timestamp:%Y-%m-%d %H:%M} | "
                         f"{scale} | {fmt(s.before)} | {fmt(s.after)} | {s.change:+.1%} |")
    else:
        lines.append("None beyond the noise and the 5 % floor.")
    lines += ["", "## Per commit", "",
              "| benchmark | " + " | ".join(r.commit for r in runs) + " |",
              "|---|" + "---:|" * len(runs)]
    for name in names:
        cells = [""] * len(runs)
        marks = {hist.series[name][s.index].run: ("▲" if s.change > 0 else "▼") for s in hist.steps[name]}
        for p in hist.series[name]:
            cell = f"{p.median_s * 1e6:.1f}" + (f" · {p.ratio:.2f}×" if p.ratio else "")
            cells[p.run] = (marks.get(p.run, "") + " " + cell).strip()
        lines.append(f"| {short[name]} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("| commit | date |")
    lines.append("|---|---|")
    lines += [f"| {r.commit} | {r.timestamp:%Y-%m-%d %H:%M} |" for r in runs]
    return "\n".join(lines) + "\n"


def plot(hist: History, title: str, path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on CI machines
    import matplotlib.pyplot as plt

    names = list(hist.series)
    short = _short_names(names)
    xs = list(range(len(hist.runs)))
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(max(7.0, 0.6 * len(xs) + 4), 7.5),
                                      gridspec_kw={"height_ratios": [3, 2]})
    palette = plt.get_cmap("tab20").colors
    for i, name in enumerate(names):
        color = palette[i % len(palette)]
        points = hist.series[name]
        tf = [(p.run, p.tflops) for p in points if p.tflops]
        if tf:
            top.plot([x for x, _ in tf], [v for _, v in tf], marker="o", color=color, label=short[name])
        ratio = [(p.run, p.ratio) for p in points if p.ratio]
        if ratio:
            bottom.plot([x for x, _ in ratio], [v for _, v in ratio], marker="o", color=color)
        for s in hist.steps[name]:
            p = points[s.index]
            if p.ratio:
                bottom.plot([p.run], [p.ratio], marker="^" if s.change > 0 else "v", markersize=12,
                            color=color, markeredgecolor="black")
            if p.tflops:
                top.axvline(p.run - 0.5, color=color, linestyle=":", alpha=0.6)
    top.set_ylabel("TFLOP/s (device time)")
    top.set_title(f"deepgemm benchmark history: {title}")
    top.grid(alpha=0.3)
    bottom.set_ylabel("time / same-run cuBLAS time")
    bottom.set_yscale("log")  # the ladder spans 1x to 15x: a linear axis flattens the fast kernels
    bottom.axhline(1.0, color="grey", linewidth=0.8)
    bottom.grid(alpha=0.3)
    bottom.set_xticks(xs, [r.commit for r in hist.runs], rotation=45, ha="right", fontsize=8)
    handles, labels = top.get_legend_handles_labels()
    if handles:  # below the axes: with many benchmarks an inside legend hides the lines
        fig.legend(handles, labels, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, 0.0),
                   ncol=2, frameon=False)
    path = Path(path)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def write(folder, out_dir, match: str | None = None) -> tuple[Path, Path, History]:
    """PNG + Markdown for the runs of one key folder; returns their paths and the history."""
    folder = Path(folder)
    runs = load_history(folder)
    hist = build(runs, match)
    if not hist.series:
        raise ValueError(f"match: {match!r} selects no benchmark of the runs in {folder / 'history'}")
    key = runs[-1].key
    title = str(key)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{gpu_slug(key.gpu)}_{key.slug}"
    md = out_dir / f"{stem}.md"
    md.write_text(markdown(hist, title))
    return plot(hist, title, out_dir / f"{stem}.png"), md, hist


# ---------------------------------------------------------------------------------------------
# A candidate baseline against the stored runs

# A baseline is one run, and the gate judges every later run against it. A run whose long
# benchmarks sat at the fast edge of what their unchanged code measures (the card's power state
# that day) made the next run of that code fail the gate three times on the H200 (docs/performance.md,
# the regression gate's evidence): 2.5 % to 8 % under its stored runs. So a new baseline is held
# against the newest RECORD_WINDOW stored runs first; a benchmark more than RECORD_MARGIN outside
# their range is named, for the person recording to tell an intended change from an odd run.
RECORD_WINDOW = 8
RECORD_MARGIN = 0.02
RECORD_MIN_RUNS = 3   # fewer stored runs of a benchmark give no range to hold it against


@dataclass(frozen=True)
class Outside:
    name: str
    value: float   # the run's median / its reference's median, or its median in seconds (no reference)
    low: float     # the stored runs' range, in the same unit
    high: float
    runs: int
    ratio: bool

    @property
    def change(self) -> float:
        """How far outside the range: < 0 below it (faster), > 0 above it (slower)."""
        return self.value / self.low - 1 if self.value < self.low else self.value / self.high - 1

    def __str__(self) -> str:
        unit = (lambda v: f"{v:.3f}×") if self.ratio else (lambda v: f"{v * 1e6:.2f} µs")
        what = "ratio to its reference" if self.ratio else "median"
        side = "below" if self.change < 0 else "above"
        return (f"{self.name}: {what} {unit(self.value)}, {abs(self.change):.1%} {side} its last {self.runs} "
                f"stored runs ({unit(self.low)} – {unit(self.high)})")


def outside_history(run: Run, stored: list[Run], window: int = RECORD_WINDOW,
                    margin: float = RECORD_MARGIN) -> list[Outside]:
    """The benchmarks of `run` whose ratio to their same-run reference (their median where there is
    no reference) lies more than `margin` outside the range of their newest `window` stored runs
    (one per commit, as the history keeps them), furthest first. Benchmarks with fewer than
    RECORD_MIN_RUNS stored runs are not judged."""
    if not stored:
        return []
    hist = build(stored)
    out = []
    for name, bench in run.benchmarks.items():
        points = hist.series.get(name, [])[-window:]
        if len(points) < RECORD_MIN_RUNS:
            continue
        median_s, ref_s = _median(bench), _reference_seconds(bench)
        as_ratio = ref_s is not None and all(p.ratio is not None for p in points)
        value = median_s / ref_s if as_ratio else median_s
        values = [p.ratio if as_ratio else p.median_s for p in points]
        low, high = min(values), max(values)
        if value < low / (1 + margin) or value > high * (1 + margin):
            out.append(Outside(name, value, low, high, len(points), as_ratio))
    return sorted(out, key=lambda o: -abs(o.change))


def outside_lines(outside: list[Outside], top: int = 30) -> list[str]:
    """The check's report: a headline, then one line per benchmark named (at most `top`)."""
    if not outside:
        return [f"against the stored runs: every benchmark with {RECORD_MIN_RUNS}+ stored runs lies within "
                f"{RECORD_MARGIN:.0%} of the range of its last {RECORD_WINDOW}"]
    lines = [f"against the stored runs: {len(outside)} benchmark(s) lie more than {RECORD_MARGIN:.0%} outside the "
             f"range of their last {RECORD_WINDOW} stored runs. The changes the commit intends belong here; any "
             f"other means this run's machine state was not theirs, and as a baseline it would fail later runs "
             f"of unchanged code (one below its range) or pass slower ones (one above): record again."]
    lines += [f"  {o}" for o in outside[:top]]
    if len(outside) > top:
        lines.append(f"  ({len(outside) - top} more)")
    return lines
