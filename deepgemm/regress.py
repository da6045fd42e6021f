"""``python -m deepgemm regress``: the benchmark gate's verdict and history on stored runs.

    regress compare CURRENT.json [--again AGAIN.json] [--baseline FILE] [--regressions DIR]
                    [--alpha 0.01] [--min-change 5%] [--min-diff-us 1] [--markdown FILE] [--json FILE] [--all]
    regress history [GPU] [--key driver580-cuda13] [--regressions DIR] [--out DIR] [--match REGEX]
    regress check CANDIDATE.json [--regressions DIR]

compare exits 0 (pass), 1 (a benchmark is slower, or nothing could be compared) or 2 (refused:
no baseline for the run's key, another key, a baseline without raw samples, unreadable input).
check holds a run that is to become the baseline against its key's stored runs (history/) and
names the benchmarks outside their range: exit 1 when it names any, 2 when there is no history.
The logic lives in deepgemm.gate (runs, verdict, history); ``pytest tests/bench
--benchmark-compare`` reaches the same verdict through deepgemm.testing.benchplugin.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from deepgemm.gate import history, runs, verdict


def _fraction(text: str) -> float:
    try:
        return float(text.rstrip("%")) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected e.g. 5% or 0.05, got {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from deepgemm import cli
    regressions = cli.repo_path("regressions")
    where = "the repository's regressions/; required outside a source checkout"
    sub = parser.add_subparsers(dest="regress_command", required=True, metavar="{compare,history,check}")
    cmp = sub.add_parser("compare", help="drift-aware verdict of a run against its key's baseline; "
                                         "exit 1 when a benchmark got slower")
    cmp.add_argument("current", help="the run to judge (pytest-benchmark JSON, --benchmark-json)")
    cmp.add_argument("--again", metavar="FILE",
                     help="a second run that timed CURRENT's slower benchmarks again (.ci/gate's again.json): "
                          "one fails only if slower in both")
    cmp.add_argument("--baseline", help="baseline JSON (default: <regressions>/<GPU>/<key>/baseline.json)")
    cmp.add_argument("--regressions", type=Path, default=regressions, help=f"baselines root (default: {where})")
    cmp.add_argument("--alpha", type=float, default=verdict.ALPHA,
                     help=f"Mann-Whitney U significance level (default {verdict.ALPHA})")
    cmp.add_argument("--min-change", type=_fraction, default=verdict.MIN_CHANGE,
                     help=f"smallest median change that counts (default {verdict.MIN_CHANGE * 100:g}%%)")
    cmp.add_argument("--min-diff-us", type=float, default=verdict.MIN_DIFF_S * 1e6,
                     help="smallest median change that counts, µs (default 1: two event-timer quanta)")
    cmp.add_argument("--markdown", metavar="FILE", help="also write the verdict as Markdown")
    cmp.add_argument("--json", metavar="FILE", help="also write the verdict as JSON")
    cmp.add_argument("--all", action="store_true", help="list every benchmark, not only the changed ones")
    hist = sub.add_parser("history", help="time and ratio to cuBLAS per commit, step changes marked "
                                          "(PNG + Markdown)")
    hist.add_argument("gpu", nargs="?", help="GPU model or its folder name (default: the key folder "
                                             "with the newest run)")
    hist.add_argument("--key", help="key folder, e.g. driver580-cuda13 (default: the newest)")
    hist.add_argument("--regressions", type=Path, default=regressions, help=f"baselines root (default: {where})")
    hist.add_argument("--out", default="regress-history", help="output folder")
    hist.add_argument("--match", type=cli.regex, default=None,
                      help="regular expression: keep only the benchmarks it finds")
    chk = sub.add_parser("check", help="a candidate baseline against its key's stored runs: the benchmarks "
                                       "outside their range (exit 1 when there are any)")
    chk.add_argument("candidate", help="the run to record as the baseline (pytest-benchmark JSON)")
    chk.add_argument("--regressions", type=Path, default=regressions, help=f"baselines root (default: {where})")


def _regressions(args) -> Path:
    if args.regressions is None:
        raise runs.BaselineNotFound("no regressions folder: deepgemm is installed without its repository; "
                                    "pass --regressions DIR (the repository's regressions/ folder)")
    return Path(args.regressions)


def _compare(args) -> int:
    current = runs.load_run(args.current)
    if args.baseline:
        baseline = runs.load_run(args.baseline)
    else:
        baseline = runs.find_baseline(_regressions(args), current.key)
    rule = verdict.Rule(alpha=args.alpha, min_change=args.min_change, min_diff_s=args.min_diff_us * 1e-6)
    report = verdict.compare(baseline, current, rule)
    if args.again:
        report = verdict.confirm(report, verdict.compare(baseline, runs.load_run(args.again), rule))
    print(report.to_text(all_rows=args.all))
    if args.markdown:
        Path(args.markdown).write_text(report.to_markdown())
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_dict(), indent=1) + "\n")
    return 1 if report.failed else 0


def _history(args) -> int:
    folders = history.key_folders(_regressions(args), args.gpu)
    if args.key:
        folders = [f for f in folders if f.name == args.key]
    if not folders:
        have = ", ".join(str(f) for f in history.key_folders(args.regressions)) or "none"
        raise runs.BaselineNotFound(f"No history for GPU {args.gpu or '(any)'} key {args.key or '(any)'} "
                                    f"under {args.regressions} (key folders with history: {have})")
    png, md, hist = history.write(folders[0], args.out, args.match)
    steps = sum(len(s) for s in hist.steps.values())
    print(f"{folders[0]}: {len(hist.runs)} commit(s), {len(hist.series)} benchmark(s), {steps} step change(s)")
    print(f"wrote {png}\nwrote {md}")
    return 0


def _check(args) -> int:
    candidate = runs.load_run(args.candidate)
    folder = runs.key_folder(_regressions(args), candidate.key)
    stored = history.load_history(folder)
    try:
        outside = history.outside_history(candidate, stored)
    except (KeyError, TypeError, ZeroDivisionError) as exc:
        raise ValueError(f"a run under {folder} cannot be read as history ({type(exc).__name__}: {exc})") from None
    print("\n".join(history.outside_lines(outside, top=len(outside))))
    return 1 if outside else 0


def run(args) -> int:
    try:
        if args.regress_command == "compare":
            return _compare(args)
        if args.regress_command == "check":
            return _check(args)
        return _history(args)
    except (runs.BaselineNotFound, runs.KeyMismatch, runs.BaselineFormatError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deepgemm regress",
                                     description="Benchmark regression gate on stored runs.")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
