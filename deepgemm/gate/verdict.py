"""The drift-aware verdict: "our kernel got slower" versus "this machine is slower today".

Every device benchmark carries a same-run reference (cuBLAS on the same operands, timed in the
rounds interleaved with the kernel's: extra_info['reference'] = {'name', 'samples', 'median'}).
For each benchmark present in both runs:

* absolute scale: the kernel's raw samples, baseline vs current;
* normalised scale: each run's samples divided by that run's reference median, so a GPU that is
  slower today (clocks, power, temperature) moves kernel and reference alike and cancels out.

On each scale, a change counts when it clears both effect floors (|median change| >= 5 % and
>= 1 µs, measured on the baseline's scale; a benchmark may widen the first in its extra_info,
GATE_MIN_CHANGE_KEY, and the baseline's value is the one used, so a change cannot loosen its own
gate) and Mann-Whitney U on the samples is significant at
alpha = 0.01 (two-sided) after Holm's correction over all the benchmarks compared in the run:
the gate fails when ANY benchmark is slower, so alpha bounds the chance that a run of unchanged
code fails on noise at all, however many benchmarks it holds (an uncorrected 0.01 over 250
benchmarks would expect about one false "slower" per run wherever the floors do not bind).
Then:

* slower  = significantly slower on the normalised scale AND on the absolute scale. The second
            condition keeps a reference that got faster (a cuBLAS update, or a baseline recorded
            on a slow day) from being read as our regression. A real slowdown hidden inside drift
            (kernel slower by more than the reference) is slower on both scales, so it fails.
* faster  = the mirror image.
* same    = no change beyond the floors on the normalised scale. When the absolute time moved
            with the reference, the row says so (drift) and does not fail.
* unsure  = a change beyond the floors without enough evidence (p >= alpha), the two scales
            disagree, or data is missing (no samples, reference renamed or absent).
* new / missing = in only one of the runs; listed, never failing (adding or removing a
            benchmark is a code change a reviewer sees; the gate cannot judge it).

Only "slower" fails. References themselves are compared too (their samples pooled over all the
benchmarks that use them): a significant shift there is reported as environment drift.
Benchmarks without a reference (host-time ones) are judged on the absolute scale alone.

Confirmation (`confirm`): the benchmarks a run found slower are timed once more, alone, in a second
session against the same baseline. One stays slower only if it is slower again; otherwise it is
reported unsure, with both changes. A slowdown in the code is there every time it runs; one that
came from the state the long run left the machine in (clocks, heat, memory) is not. A benchmark
the second session did not time stays slower.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field, replace

from deepgemm.gate import stats
from deepgemm.gate.runs import Run, as_run, check_baseline, reference, samples

ALPHA = 0.01
MIN_CHANGE = 0.05
# extra_info key: a wider effect floor for one benchmark (a fraction, e.g. 0.15), for a measurement
# whose noise on one machine exceeds MIN_CHANGE (host-time benchmarks: docs/regression-gate.md).
GATE_MIN_CHANGE_KEY = "gate_min_change"
# CUDA events resolve ~0.5 µs: a median can move by one quantum between two runs of the same
# µs-scale kernel; a change must exceed two quanta before it can count.
MIN_DIFF_S = 1e-6

STATES = ("slower", "unsure", "faster", "new", "missing", "same")  # display order
FAILING = frozenset({"slower"})
# Throttle reasons that say nothing about a slowdown: an idle GPU between benchmarks, clocks
# set by the application or display.
BENIGN_REASONS = frozenset({"gpu_idle", "applications_clocks_setting", "display_clock_setting"})


@dataclass(frozen=True)
class Rule:
    alpha: float = ALPHA
    min_change: float = MIN_CHANGE
    min_diff_s: float = MIN_DIFF_S

    def __post_init__(self):
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha: must be in (0, 1), got {self.alpha!r}")
        if not 0 <= self.min_change < 10:
            raise ValueError(f"min_change: must be in [0, 10), got {self.min_change!r}")
        if not self.min_diff_s >= 0:
            raise ValueError(f"min_diff_s: must be >= 0 seconds, got {self.min_diff_s!r}")

    def describe(self) -> str:
        return (f"slower/faster = reference-normalised and absolute median both moved by "
                f">= {self.min_change:.0%} and >= {self.min_diff_s * 1e6:g} µs, Mann-Whitney U "
                f"two-sided p < {self.alpha:g} after Holm's correction over the run")


@dataclass(frozen=True)
class Scale:
    """One comparison of baseline and current samples."""

    change: float  # current median / baseline median - 1
    diff_s: float  # median difference, seconds on the baseline's scale
    p: float  # Mann-Whitney U, two-sided, Holm-corrected over the run's family
    direction: str  # slower / faster / same / unsure


@dataclass(frozen=True)
class Verdict:
    name: str
    status: str
    base_median: float | None = None  # seconds
    cur_median: float | None = None
    absolute: Scale | None = None
    normalised: Scale | None = None
    reference: str | None = None
    reference_change: float | None = None  # current / baseline reference median - 1
    note: str = ""


@dataclass(frozen=True)
class Drift:
    """A reference (cuBLAS at one shape) compared across the runs, samples pooled."""

    name: str
    base_median: float
    cur_median: float
    scale: Scale
    benchmarks: int  # how many current benchmarks it normalises

    @property
    def status(self) -> str:
        return self.scale.direction


@dataclass(frozen=True)
class Measured:
    """One scale before the decision: raw p-value, to be corrected over the run's family."""

    change: float
    diff_s: float
    p: float
    effect: float  # P(current > baseline), Mann-Whitney's common-language effect size


def measure(base, cur, unit: float = 1.0) -> Measured:
    """Medians and Mann-Whitney U of one scale; `unit` turns a median difference into baseline seconds."""
    mb, mc = stats.median(base), stats.median(cur)
    test = stats.mann_whitney_u(cur, base)
    return Measured(mc / mb - 1 if mb > 0 else math.inf, (mc - mb) * unit, test.p, test.effect)


def decide(m: Measured, p: float, rule: Rule) -> Scale:
    """Direction of one scale given its (corrected) p-value (unmoved medians: same, even at zero floors)."""
    big = m.change != 0 and abs(m.change) >= rule.min_change and abs(m.diff_s) >= rule.min_diff_s
    if not big:
        direction = "same"
    elif p >= rule.alpha or (m.effect > 0.5) != (m.change > 0):
        direction = "unsure"  # a large median move the ranks do not back up
    else:
        direction = "slower" if m.change > 0 else "faster"
    return Scale(m.change, m.diff_s, p, direction)


def holm(pvalues: list[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (same order): family-wise error control."""
    m = len(pvalues)
    order = sorted(range(m), key=pvalues.__getitem__)
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


@dataclass
class _Pending:
    """A benchmark present in both runs, measured, waiting for the family's correction."""

    name: str
    base_median: float | None
    cur_median: float | None
    absolute: Measured | None = None
    normalised: Measured | None = None
    reference: str | None = None
    reference_change: float | None = None
    min_change: float = 0.0  # the baseline's own floor (GATE_MIN_CHANGE_KEY), if wider than the rule's
    problem: str = ""  # set: the verdict is unsure for this reason, no test needed


def _ref_median(ref: dict) -> float | None:
    if ref.get("samples"):
        return stats.median(ref["samples"])
    return float(ref["median"]) if ref.get("median") else None


def _declared_floor(base: dict) -> float:
    value = (base.get("extra_info") or {}).get(GATE_MIN_CHANGE_KEY, 0.0)
    try:
        value = float(value)
    except (TypeError, ValueError):
        return 0.0
    return value if 0 <= value < 10 else 0.0


def _measure_pair(name: str, base: dict, cur: dict) -> _Pending:
    xb, xc = samples(base), samples(cur)
    if not xb or not xc:
        which = "the baseline" if not xb else "this run"
        return _Pending(name, (base.get("stats") or {}).get("median"), (cur.get("stats") or {}).get("median"),
                        problem=f"{which} has no raw samples for it")
    pending = _Pending(name, stats.median(xb), stats.median(xc), absolute=measure(xb, xc),
                       min_change=_declared_floor(base))
    rb, rc = reference(base), reference(cur)
    if rb is None and rc is None:
        return pending
    pending.reference = (rc or rb)["name"]
    if rb is None or rc is None or rb["name"] != rc["name"]:
        names = f"{rb['name'] if rb else 'none'} -> {rc['name'] if rc else 'none'}"
        pending.problem = f"reference changed ({names}): no same-reference comparison"
        return pending
    ref_b, ref_c = _ref_median(rb), _ref_median(rc)
    if not ref_b or not ref_c:
        pending.problem = "reference has no timing in one of the runs"
        return pending
    pending.normalised = measure([x / ref_b for x in xb], [x / ref_c for x in xc], unit=ref_b)
    pending.reference_change = ref_c / ref_b - 1
    return pending


def _classify(pending: _Pending, p_abs: float | None, p_norm: float | None, rule: Rule) -> Verdict:
    if pending.min_change > rule.min_change:
        rule = replace(rule, min_change=pending.min_change)
    absolute = decide(pending.absolute, p_abs, rule) if pending.absolute else None
    common = dict(base_median=pending.base_median, cur_median=pending.cur_median, absolute=absolute,
                  reference=pending.reference, reference_change=pending.reference_change)
    if pending.problem:
        return Verdict(pending.name, "unsure", **common, note=pending.problem)
    if pending.normalised is None:
        return Verdict(pending.name, absolute.direction, **common, note="no reference: absolute time")
    normalised = decide(pending.normalised, p_norm, rule)
    common["normalised"] = normalised
    n, a, ref_change = normalised.direction, absolute.direction, pending.reference_change
    if n in ("slower", "faster"):
        if a == n:
            return Verdict(pending.name, n, **common)
        return Verdict(pending.name, "unsure", **common, note=(
            f"{normalised.change:+.1%} against the reference but {absolute.change:+.1%} in absolute "
            f"time ({a}): the reference moved ({ref_change:+.1%}), not necessarily the kernel"))
    if n == "unsure":
        return Verdict(pending.name, "unsure", **common, note=(
            f"{normalised.change:+.1%} against the reference, not significant (p={normalised.p:.2g})"))
    note = ""
    if a in ("slower", "faster"):
        note = (f"drift: absolute {absolute.change:+.1%}, reference {ref_change:+.1%}: "
                f"the machine, not the kernel")
    return Verdict(pending.name, "same", **common, note=note)


def judge_all(pairs: list[tuple[str, dict, dict]], rule: Rule = Rule()) -> list[Verdict]:
    """Verdicts for (name, baseline entry, current entry) triples, Holm-corrected together."""
    pending = [_measure_pair(name, base, cur) for name, base, cur in pairs]
    adjusted = {}
    for scale in ("absolute", "normalised"):
        family = [(i, getattr(p, scale).p) for i, p in enumerate(pending)
                  if getattr(p, scale) is not None and not p.problem]
        for (i, _), q in zip(family, holm([p for _, p in family])):
            adjusted[(scale, i)] = q
    return [_classify(p, adjusted.get(("absolute", i), 1.0), adjusted.get(("normalised", i), 1.0), rule)
            for i, p in enumerate(pending)]


def judge(name: str, base: dict, cur: dict, rule: Rule = Rule()) -> Verdict:
    """The verdict for one benchmark on its own (no other benchmark in the family)."""
    return judge_all([(name, base, cur)], rule)[0]


def drift(baseline: Run, current: Run, rule: Rule = Rule()) -> list[Drift]:
    """Each reference used in both runs, its samples pooled over the benchmarks using it."""
    def pooled(run: Run):
        out, users = defaultdict(list), Counter()
        for bench in run.benchmarks.values():
            ref = reference(bench)
            if ref and ref.get("samples"):
                out[ref["name"]].extend(float(x) for x in ref["samples"])
                users[ref["name"]] += 1
        return out, users

    (base, _), (cur, users) = pooled(baseline), pooled(current)
    names = sorted(set(base) & set(cur))
    measured = [measure(base[n], cur[n]) for n in names]
    return [Drift(n, stats.median(base[n]), stats.median(cur[n]), decide(m, q, rule), users[n])
            for n, m, q in zip(names, measured, holm([m.p for m in measured]))]


# ---------------------------------------------------------------------------------------------
# Telemetry summary


def telemetry_summary(run: Run) -> dict:
    """SM clock, temperature and non-benign throttle reasons over a run's benchmarks."""
    clocks, temps, reasons, unavailable = [], [], Counter(), Counter()
    for bench in run.benchmarks.values():
        tel = (bench.get("extra_info") or {}).get("telemetry")
        if not isinstance(tel, dict):
            continue
        if tel.get("unavailable"):
            unavailable[tel["unavailable"]] += 1
        seen = set()
        for when in ("before", "after"):
            point = tel.get(when) or {}
            if point.get("sm_mhz") is not None:
                clocks.append(point["sm_mhz"])
            if point.get("temp_c") is not None:
                temps.append(point["temp_c"])
            seen.update(r for r in point.get("reasons") or () if r not in BENIGN_REASONS)
        reasons.update(seen)
    summary: dict = {}
    if clocks:
        summary["sm_mhz"] = {"min": min(clocks), "median": stats.median(clocks), "max": max(clocks)}
    if temps:
        summary["temp_c"] = {"max": max(temps)}
    if reasons:
        summary["throttle"] = dict(reasons.most_common())
    if unavailable:
        summary["unavailable"] = dict(unavailable)
    return summary


def _describe_telemetry(summary: dict) -> str:
    if not summary:
        return "not recorded"
    parts = []
    if "sm_mhz" in summary:
        c = summary["sm_mhz"]
        parts.append(f"SM clock {c['min']:.0f}-{c['max']:.0f} MHz (median {c['median']:.0f})")
    if "temp_c" in summary:
        parts.append(f"max {summary['temp_c']['max']:.0f} °C")
    if "throttle" in summary:
        parts.append("throttled: " + ", ".join(f"{r} in {n} benchmark(s)" for r, n in summary["throttle"].items()))
    elif "sm_mhz" in summary:
        parts.append("no throttling")
    if "unavailable" in summary:
        parts.append("unavailable: " + "; ".join(summary["unavailable"]))
    return ", ".join(parts)


# ---------------------------------------------------------------------------------------------
# Report


@dataclass
class Report:
    baseline: Run
    current: Run
    rule: Rule
    verdicts: list[Verdict]
    drift: list[Drift] = field(default_factory=list)
    again: Run | None = None  # the confirmation session (`confirm`), if one ran

    @property
    def counts(self) -> Counter:
        return Counter(v.status for v in self.verdicts)

    @property
    def compared(self) -> int:
        return sum(1 for v in self.verdicts if v.status not in ("new", "missing"))

    @property
    def slower(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.status in FAILING]

    @property
    def failed(self) -> bool:
        """Slower benchmarks, or nothing compared at all (a gate that compared nothing passed nothing)."""
        return bool(self.slower) or self.compared == 0

    @property
    def drifted(self) -> list[Drift]:
        return [d for d in self.drift if d.status != "same"]

    def headline(self) -> str:
        c = self.counts
        tally = ", ".join(f"{c[s]} {s}" for s in STATES if c[s])
        if self.compared == 0:
            return (f"FAIL: no benchmark of this run is in the baseline ({tally or 'nothing ran'}); "
                    f"nothing was compared")
        if self.slower:
            return f"FAIL: {len(self.slower)} benchmark(s) slower ({tally})"
        return f"PASS ({tally})"

    def context(self) -> list[str]:
        b, c = self.baseline, self.current
        lines = [f"baseline key: {b.key}",
                 f"baseline: {b} (commit {b.commit}, {b.timestamp:%Y-%m-%d %H:%M} UTC)",
                 f"current:  {c.path or 'this run'} (commit {c.commit}, {c.timestamp:%Y-%m-%d %H:%M} UTC)",
                 f"rule: {self.rule.describe()}",
                 f"telemetry, baseline: {_describe_telemetry(telemetry_summary(b))}",
                 f"telemetry, current:  {_describe_telemetry(telemetry_summary(c))}"]
        if self.again is not None:
            a = self.again
            lines.append(f"confirmation: {len(a.benchmarks)} benchmark(s) found slower timed again alone "
                         f"({a.path or 'a second session'}, {a.timestamp:%Y-%m-%d %H:%M} UTC): "
                         f"{len(self.slower)} slower again")
        return lines

    def drift_lines(self) -> list[str]:
        if not self.drift:
            return ["references: none in common (no drift check)"]
        moved = self.drifted
        if not moved:
            return [f"references: {len(self.drift)} compared, none moved beyond the floors (no drift)"]
        lines = [f"environment drift: {len(moved)} of {len(self.drift)} references moved "
                 f"(reported, never failing; the benchmarks are judged against them):"]
        for d in moved:
            lines.append(f"  {d.name}: {d.base_median * 1e6:.2f} -> {d.cur_median * 1e6:.2f} µs "
                         f"({d.scale.change:+.1%}, p={d.scale.p:.2g}, {d.status}; normalises "
                         f"{d.benchmarks} benchmark(s))")
        return lines

    def _rows(self, all_rows: bool) -> list[Verdict]:
        order = {s: i for i, s in enumerate(STATES)}
        rows = sorted(self.verdicts, key=lambda v: (order[v.status], v.name))
        return rows if all_rows else [v for v in rows if v.status != "same" or v.note]

    @staticmethod
    def _cells(v: Verdict) -> list[str]:
        def us(s):
            return "" if s is None else f"{s * 1e6:.2f}"

        def pct(x):
            return "" if x is None else f"{x:+.1%}"

        scale = v.normalised or v.absolute
        return [v.status.upper() if v.status in FAILING else v.status, v.name, us(v.base_median),
                us(v.cur_median), pct(v.absolute.change if v.absolute else None), pct(v.reference_change),
                pct(v.normalised.change if v.normalised else None),
                "" if scale is None else f"{scale.p:.2g}", v.note]

    HEADER = ["verdict", "benchmark", "base µs", "now µs", "abs", "ref", "vs ref", "p", "note"]

    def to_text(self, all_rows: bool = False) -> str:
        lines = [f"benchmark gate: {self.headline()}"] + self.context() + self.drift_lines()
        shown = self._rows(all_rows)
        if not shown:
            return "\n".join(lines + ["", f"all {len(self.verdicts)} benchmark(s) the same (-v or --all lists them)"])
        rows = [self.HEADER] + [self._cells(v) for v in shown]
        widths = [max(len(r[i]) for r in rows) for i in range(len(self.HEADER) - 1)]
        table = ["  ".join([c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in
                            enumerate(zip(r[:-1], widths))] + [r[-1]]).rstrip() for r in rows]
        table.insert(1, "-" * max(len(t) for t in table))
        hidden = len(self.verdicts) - (len(rows) - 1)
        if hidden:
            table.append(f"({hidden} more: same, no note)")
        return "\n".join(lines + [""] + table)

    def to_markdown(self) -> str:
        def md(text):
            return str(text).replace("|", "\\|")

        icon = "❌" if self.failed else "✅"
        out = [f"## {icon} Benchmark gate: {md(self.headline())}", ""]
        out += [f"- {md(line)}" for line in self.context()]
        out += ["", *[f"{'- ' if not line.startswith('  ') else '  - '}{md(line.strip())}"
                      for line in self.drift_lines()], ""]
        head = "| " + " | ".join(self.HEADER) + " |"
        rule = "|" + "|".join("---" if i < 2 or i == 8 else "---:" for i in range(len(self.HEADER))) + "|"

        def table(rows):
            return [head, rule] + ["| " + " | ".join(md(c) for c in self._cells(v)) + " |" for v in rows]

        shown = self._rows(all_rows=False)
        if shown:
            out += table(shown)
        same = [v for v in self.verdicts if v.status == "same" and not v.note]
        if same:
            out += ["", f"<details><summary>{len(same)} benchmark(s) the same</summary>", ""]
            out += table(sorted(same, key=lambda v: v.name)) + ["", "</details>"]
        return "\n".join(out) + "\n"

    def to_dict(self) -> dict:
        return {
            "result": "fail" if self.failed else "pass",
            "headline": self.headline(),
            "counts": dict(self.counts),
            "key": str(self.current.key),
            "baseline": {"path": str(self.baseline.path or ""), "commit": self.baseline.commit},
            "current": {"path": str(self.current.path or ""), "commit": self.current.commit},
            "again": None if self.again is None else {
                "path": str(self.again.path or ""), "benchmarks": sorted(self.again.benchmarks)},
            "rule": asdict(self.rule),
            "drift": [dict(asdict(d), status=d.status) for d in self.drift],
            "telemetry": {"baseline": telemetry_summary(self.baseline),
                          "current": telemetry_summary(self.current)},
            "verdicts": [asdict(v) for v in self.verdicts],
        }


def compare(baseline, current, rule: Rule = Rule()) -> Report:
    """The verdict of `current` against `baseline` (Runs or pytest-benchmark dicts).

    Raises runs.KeyMismatch across keys (GPU model, driver major, CUDA major) and
    runs.BaselineFormatError for a baseline without raw samples.
    """
    baseline, current = as_run(baseline), as_run(current)
    check_baseline(baseline, current.key)
    base, cur = baseline.benchmarks, current.benchmarks
    verdicts = judge_all([(name, base[name], entry) for name, entry in cur.items() if name in base], rule)
    for name, entry in cur.items():
        if name not in base:
            verdicts.append(Verdict(name, "new", cur_median=(entry.get("stats") or {}).get("median")))
    for name, entry in base.items():
        if name not in cur:
            verdicts.append(Verdict(name, "missing", base_median=(entry.get("stats") or {}).get("median")))
    return Report(baseline, current, rule, verdicts, drift(baseline, current, rule))


def _moved(v: Verdict) -> str:
    scale = v.normalised or v.absolute
    return "no timing" if scale is None else f"{scale.change:+.1%}{' vs ref' if v.normalised else ''}"


def confirm(first: Report, again: Report) -> Report:
    """`first`'s verdict, where a slower benchmark stays slower only if `again` finds it slower too.

    `again` is a second session that timed `first`'s slower benchmarks alone, compared with the
    same baseline (the module's docstring says why). Other verdicts are `first`'s unchanged.
    """
    same = (again.baseline.commit, again.baseline.timestamp) == (first.baseline.commit, first.baseline.timestamp)
    if not same:
        raise ValueError(f"again: compared with another baseline ({again.baseline}, commit "
                         f"{again.baseline.commit}) than the run it confirms ({first.baseline}, commit "
                         f"{first.baseline.commit})")
    rerun = {v.name: v for v in again.verdicts if v.status != "new"}
    verdicts = []
    for v in first.verdicts:
        w = rerun.get(v.name)
        if v.status not in FAILING:
            verdicts.append(v)
        elif w is None or w.status == "missing":
            verdicts.append(replace(v, note=_join(v.note, "not timed again: stays slower")))
        elif w.status in FAILING:
            verdicts.append(replace(v, note=_join(v.note, f"slower again alone ({_moved(w)})")))
        else:
            verdicts.append(replace(v, status="unsure", note=_join(
                v.note, f"slower in the run ({_moved(v)}), {w.status} timed again alone "
                        f"({_moved(w)}): not confirmed")))
    return Report(first.baseline, first.current, first.rule, verdicts, first.drift, again=again.current)


def _join(*notes: str) -> str:
    return "; ".join(n for n in notes if n)
