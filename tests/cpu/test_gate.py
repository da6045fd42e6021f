"""The gate's pure modules on synthetic runs: statistics, verdict, keys and storage, history and
telemetry (no GPU)."""

import json
import math
import os
import random
from pathlib import Path

import pytest

from deepgemm.gate import history, runs, stats, telemetry, verdict
from gate_runs import A100, H200, entry, gemm_pair, make_run, noisy

REPO = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------------------------------------
# Mann-Whitney U


def test_mann_whitney_matches_published_values():
    # SciPy's documented example: U = 17, exact two-sided p = 1/9; asymptotic 0.11134688653314041.
    males, females = [19, 22, 16, 29, 24], [20, 11, 17, 12]
    exact = stats.mann_whitney_u(males, females)
    assert (exact.u, exact.method) == (17.0, "exact") and exact.p == pytest.approx(1 / 9)
    # Same data with a tie forces the normal approximation (continuity corrected).
    tied = stats.mann_whitney_u(males + [20], females)
    assert tied.method == "normal" and 0 < tied.p < 1
    # Critical values of the U table, n1 = n2 = 10 (two-sided): 23 at 0.05, 16 at 0.01.
    counts, total = stats.u_distribution(10, 10), math.comb(20, 10)

    def p(u):
        return 2 * sum(counts[: u + 1]) / total

    assert p(23) <= 0.05 < p(24) and p(16) <= 0.01 < p(17)
    assert sum(stats.u_distribution(5, 4)) == math.comb(9, 4)


def test_mann_whitney_normal_approximation_with_ties_by_hand():
    x, y = [1, 1, 2, 3, 3], [2, 4, 5, 5, 6]
    r = stats.mann_whitney_u(x, y)
    # Ranks 1.5 1.5 3.5 5.5 5.5 -> U = 17.5 - 15; four tie pairs: sum(t^3 - t) = 24.
    variance = 25 / 12 * (11 - 24 / 90)
    z = (abs(2.5 - 12.5) - 0.5) / math.sqrt(variance)
    assert r.u == 2.5 and r.p == pytest.approx(math.erfc(z / math.sqrt(2)))
    assert stats.mann_whitney_u([3, 3, 3], [3, 3]).p == 1.0  # all tied: no evidence
    # Two runs alike, with ties (the normal path): U sits at its mean, and within the continuity
    # correction of it the p-value is exactly 1 (z floored at 0), so such a pair never counts.
    assert stats.mann_whitney_u([1, 2, 2, 3], [1, 2, 2, 3]).p == 1.0
    assert stats.mann_whitney_u([1, 2, 2, 3], [1, 2, 2, 3.5]).p == 1.0   # |U - mean| = 0.5


def test_mann_whitney_exact_agrees_with_normal_for_large_samples():
    rng = random.Random(5)
    x = [rng.gauss(0, 1) for _ in range(60)]
    y = [rng.gauss(0.6, 1) for _ in range(60)]
    exact = stats.mann_whitney_u(x, y)
    assert exact.method == "exact"
    saved = stats.EXACT_MAX_PAIRS
    try:
        stats.EXACT_MAX_PAIRS = 0
        normal = stats.mann_whitney_u(x, y)
    finally:
        stats.EXACT_MAX_PAIRS = saved
    assert normal.method == "normal" and normal.p == pytest.approx(exact.p, rel=0.1)  # the tail: ~7 % apart at p ~ 0.003
    assert exact.effect < 0.5  # x tends to be smaller


def test_mann_whitney_rejects_bad_input():
    with pytest.raises(ValueError, match="x: needs at least one sample"):
        stats.mann_whitney_u([], [1.0])
    with pytest.raises(ValueError, match="y: contains NaN"):
        stats.mann_whitney_u([1.0], [float("nan")])
    # One NaN among good samples poisons the ranks just the same (NaN compares false to all).
    with pytest.raises(ValueError, match="x: contains NaN"):
        stats.mann_whitney_u([1.0, float("nan"), 2.0], [1.5])
    with pytest.raises(ValueError, match="y: expected a sequence of numbers, got None"):
        stats.mann_whitney_u([1.0], None)
    for n1, n2 in ((-1, 3), (3, -1)):
        with pytest.raises(ValueError, match="sample sizes must be >= 0"):
            stats.u_distribution(n1, n2)


def test_mann_whitney_exact_p_at_the_tails_and_the_centre():
    # [6 choose 3]_q: of the C(6, 3) = 20 orderings of three x's and three y's, U = 0..9 occurs
    # 1, 1, 2, 3, 3, 3, 3, 2, 1, 1 times (one way to put every x first, ...).
    assert stats.u_distribution(3, 3) == [1, 1, 2, 3, 3, 3, 3, 2, 1, 1]
    # Degree n1*n2 exactly, symmetric (U and n1*n2 - U are mirror orderings); an empty sample has
    # the single ordering with U = 0.
    counts = stats.u_distribution(5, 4)
    assert len(counts) == 5 * 4 + 1 and counts == counts[::-1]
    assert stats.u_distribution(0, 3) == [1] and stats.u_distribution(3, 0) == [1]
    # Complete separation, either way round: the one extreme ordering of 20, doubled (two-sided).
    for x, y, u in (([1, 2, 3], [4, 5, 6], 0), ([4, 5, 6], [1, 2, 3], 9)):
        r = stats.mann_whitney_u(x, y)
        assert (r.u, r.method) == (u, "exact") and r.p == pytest.approx(2 * 1 / 20)
    # One step in from the tail: P(U <= 1) = 2/20, two-sided 0.2.
    assert stats.mann_whitney_u([1, 2, 4], [3, 5, 6]).p == pytest.approx(0.2)
    # U at the centre of its distribution: both tails hold more than half; the p-value is 1, not more.
    centre = stats.mann_whitney_u([1, 3], [2])
    assert centre.u == 1 and centre.p == 1.0


def test_mann_whitney_exact_up_to_its_pair_limit(monkeypatch):
    """Exact counting while n1 * n2 <= EXACT_MAX_PAIRS (no ties), the normal approximation above."""
    monkeypatch.setattr(stats, "EXACT_MAX_PAIRS", 12)
    assert stats.mann_whitney_u([1, 2, 3], [4, 5, 6, 7]).method == "exact"         # 12 pairs
    assert stats.mann_whitney_u([0], list(range(1, 14))).method == "normal"       # 13 pairs
    assert stats.mann_whitney_u(list(range(13)), [20]).method == "normal"


def test_mann_whitney_all_equal_and_small_normal_cases_by_hand():
    # Every sample equal: every pair a tie, U = n1 n2 / 2, effect exactly one half.
    same = stats.mann_whitney_u([3, 3, 3], [3, 3])
    assert (same.u, same.effect, same.p) == (3.0, 0.5, 1.0)
    # x = [1], y = [2, 2, 2]: U = 0; one tie group of 3 (t^3 - t = 24), n = 4: a variance
    # 3/12 (5 - 24/12) = 0.75 below 1 is still a variance.
    r = stats.mann_whitney_u([1], [2, 2, 2])
    z = (abs(0 - 1.5) - 0.5) / math.sqrt(0.75)
    assert r.method == "normal" and r.p == pytest.approx(math.erfc(z / math.sqrt(2)))
    # Alike samples with ties: ranks 1.5 4 4 7 for x -> U = 16.5 - 10 = 6.5 of a centre 8; tie
    # groups 2, 3, 3 (sum t^3 - t = 54), n = 8. A large p (~0.76) is reported as it is.
    r = stats.mann_whitney_u([1, 2, 2, 3], [1, 2, 3, 3])
    z = (abs(6.5 - 8) - 0.5) / math.sqrt(16 / 12 * (9 - 54 / 56))
    assert r.u == 6.5 and r.p == pytest.approx(math.erfc(z / math.sqrt(2))) and r.p > 0.5


# ---------------------------------------------------------------------------------------------
# Verdict

K = "tests/bench/test_bench.py::"


def one(kernel_s, ref_s, seed, **kw):
    return [gemm_pair("test_gemm[v5-8192^3-bfloat16]", kernel_s, ref_s, seed=seed, **kw)]


def judge(base, cur):
    report = verdict.compare(make_run(base), make_run(cur))
    [v] = [v for v in report.verdicts if v.status not in ("new", "missing")]
    return report, v


def test_unchanged_code_passes():
    report, v = judge(one(100e-6, 50e-6, 1), one(100e-6, 50e-6, 2))
    assert v.status == "same" and not report.failed and "PASS" in report.headline()


def test_drift_of_the_reference_only_is_reported_and_does_not_fail():
    """The machine is 7 % slower today: kernel and cuBLAS alike (cuBLAS 8192^3 bf16 +6.9 % with
    an unchanged library was such a case)."""
    report, v = judge(one(1500e-6, 1400e-6, 1), one(1500e-6 * 1.069, 1400e-6 * 1.069, 2))
    assert v.absolute.direction == "slower"  # a fixed % on medians would have cried wolf
    assert v.status == "same" and "drift" in v.note
    assert not report.failed
    [d] = report.drift
    assert d.status == "slower" and d.scale.change == pytest.approx(0.069, abs=0.01)
    assert d.benchmarks == 1 and v.reference_change == pytest.approx(0.069, abs=0.01)
    text = report.to_text()
    assert "environment drift" in text and "cublas[test_gemm[v5-8192^3-bfloat16]]" in text


def test_slowdown_hidden_inside_drift_fails():
    """Reference +7 %, kernel +20 %: slower than the drift explains."""
    report, v = judge(one(100e-6, 50e-6, 1), one(120e-6, 53.5e-6, 2))
    assert v.status == "slower" and report.failed
    assert v.normalised.change == pytest.approx(1.2 / 1.07 - 1, abs=0.01)
    assert "FAIL: 1 benchmark(s) slower" in report.headline()
    assert "SLOWER" in report.to_text()


def test_plain_slowdown_fails_and_speedup_is_faster():
    assert judge(one(100e-6, 50e-6, 1), one(110e-6, 50e-6, 2))[1].status == "slower"
    assert judge(one(100e-6, 50e-6, 1), one(85e-6, 50e-6, 2))[1].status == "faster"
    assert judge(one(100e-6, 50e-6, 1), one(103e-6, 50e-6, 2))[1].status == "same"  # below 5 %


def test_a_benchmark_may_widen_its_floor_from_the_baseline_only():
    """A host-time benchmark 9 % slower against its reference, with 50 % drift: slower under the
    5 % floor; the same under the 15 % its baseline declares; and a floor declared only by the
    current run (a change loosening its own gate) is ignored."""
    def pair(kernel_s, ref_s, seed, floor=None):
        [e] = one(kernel_s, ref_s, seed)
        if floor is not None:
            e["extra_info"][verdict.GATE_MIN_CHANGE_KEY] = floor
        return [e]
    base, cur = (100e-6, 50e-6, 1), (100e-6 * 1.5 * 1.09, 75e-6, 2)
    assert judge(pair(*base), pair(*cur))[1].status == "slower"
    assert judge(pair(*base, floor=0.15), pair(*cur))[1].status == "same"
    assert judge(pair(*base), pair(*cur, floor=0.15))[1].status == "slower"
    assert judge(pair(*base, floor=0.15), pair(100e-6 * 1.5 * 1.2, 75e-6, 2))[1].status == "slower"
    assert judge(pair(*base, floor="bogus"), pair(*cur))[1].status == "slower"
    # A declared floor takes Rule's range, [0, 10): 9.5 (950 %) holds, 10 and beyond are ignored.
    assert judge(pair(*base, floor=9.5), pair(100e-6 * 1.5 * 3, 75e-6, 2))[1].status == "same"
    assert judge(pair(*base, floor=10), pair(*cur))[1].status == "slower"


def test_reference_that_got_faster_is_not_our_regression():
    """cuBLAS updated (or the baseline day was slow): reference -10 %, kernel time unchanged.
    Against the reference the kernel looks 11 % slower; in absolute time it is not: unsure."""
    report, v = judge(one(100e-6, 50e-6, 1), one(100e-6, 45e-6, 2))
    assert v.normalised.direction == "slower" and v.absolute.direction == "same"
    assert v.status == "unsure" and "reference moved" in v.note and not report.failed


def noisy_suite(seed, n_benchmarks=60, slow=None):
    """A run of many benchmarks of unchanged code: 5 % scatter per round and, in some benchmarks,
    a few 30-60 % outlier rounds (a clock dip, a preempting process), drawn independently per run.
    `slow`: {index: factor} makes those kernels slower."""
    rng = random.Random(seed)
    out = []
    for i in range(n_benchmarks):
        kernel_s, ref_s = 20e-6 * (1 + i % 7), 15e-6 * (1 + i % 7)
        bench = gemm_pair(f"test_gemm[{i}]", kernel_s * (slow or {}).get(i, 1.0), ref_s, rel=0.05,
                          seed=rng.randrange(10**9))
        if rng.random() < 0.3:
            bench["stats"]["data"] = noisy(kernel_s * (slow or {}).get(i, 1.0), 0.05, 30,
                                           rng.randrange(10**9), outliers=rng.randint(1, 4))
        out.append(bench)
    return out


def test_noisy_unchanged_runs_never_fail():
    """Pairs of scattered runs of the same code, 60 benchmarks each: same or unsure, never slower.
    Judged one benchmark at a time (no correction over the run), some of these runs would fail."""
    seen, uncorrected_failures = set(), 0
    for seed in range(40):
        base, cur = noisy_suite(seed), noisy_suite(seed + 1000)
        report = verdict.compare(make_run(base), make_run(cur))
        statuses = {v.status for v in report.verdicts}
        assert statuses <= {"same", "unsure"}, (seed, report.to_text())
        assert not report.failed
        seen |= statuses
        alone = [verdict.judge(b["fullname"], b, c) for b, c in zip(base, cur)]
        uncorrected_failures += any(v.status == "slower" for v in alone)
    assert "same" in seen
    assert uncorrected_failures >= 1


def test_one_real_slowdown_among_many_noisy_benchmarks_still_fails():
    base = make_run(noisy_suite(7))
    report = verdict.compare(base, make_run(noisy_suite(8, slow={3: 1.15, 40: 1.25})))
    slower = {v.name.rsplit("::")[-1] for v in report.slower}
    assert slower == {"test_gemm[3]", "test_gemm[40]"} and report.failed


def test_holm_adjustment():
    assert verdict.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert verdict.holm([]) == [] and verdict.holm([0.2]) == [0.2]


def test_quantised_microsecond_kernel_does_not_false_alarm():
    """A ~3 µs kernel read through CUDA events' ~0.5 µs quanta: medians hop between quanta from
    run to run (a fixed 5 % would alarm often); the 1 µs floor and the rank test do not."""
    rng = random.Random(1234)

    def run_of_tiny_kernel(shift=0.0):
        return [round((3.2e-6 + shift + rng.gauss(0, 0.3e-6)) / 0.5e-6) * 0.5e-6 for _ in range(20)]

    naive_alarms = 0
    for _ in range(200):
        base, cur = run_of_tiny_kernel(), run_of_tiny_kernel()
        ref_b, ref_c = run_of_tiny_kernel(), run_of_tiny_kernel()
        _, v = judge([entry(K + "t", base, ref="r", ref_samples=ref_b)],
                     [entry(K + "t", cur, ref="r", ref_samples=ref_c)])
        assert v.status != "slower", v
        naive_alarms += stats.median(cur) > 1.05 * stats.median(base)
    assert naive_alarms > 20
    _, v = judge([entry(K + "t", run_of_tiny_kernel(), ref="r", ref_samples=run_of_tiny_kernel())],
                 [entry(K + "t", run_of_tiny_kernel(1.6e-6), ref="r", ref_samples=run_of_tiny_kernel())])
    assert v.status == "slower"


def test_benchmark_without_reference_is_judged_on_absolute_time():
    base = [entry(K + "host", noisy(2e-3, 0.01, 20, 1))]
    assert judge(base, [entry(K + "host", noisy(2.3e-3, 0.01, 20, 2))])[1].status == "slower"
    _, v = judge(base, [entry(K + "host", noisy(2e-3, 0.01, 20, 3))])
    assert v.status == "same" and "absolute" in v.note


@pytest.mark.parametrize("with_reference", [True, False])
def test_the_one_microsecond_floor_on_each_scale(with_reference):
    """A 10 µs kernel with 0.2 % scatter (every change below is overwhelmingly significant):
    +0.8 µs (+8 %) clears the 5 % floor but not the 1 µs one, so it is the same; +1.2 µs is slower.
    The floor is measured in the baseline's seconds on both scales (the normalised scale's ratio
    times the baseline's 20 µs reference median)."""
    def bench(kernel_s, seed):
        if with_reference:
            return [gemm_pair("test_gemm[tiny]", kernel_s, 20e-6, rel=0.002, seed=seed)]
        return [entry(K + "host", noisy(kernel_s, 0.002, 20, seed))]

    for cur_s, status in ((10.8e-6, "same"), (11.2e-6, "slower")):
        _, v = judge(bench(10e-6, 1), bench(cur_s, 2))
        assert v.status == status, v
        assert v.absolute.diff_s == pytest.approx(v.cur_median - v.base_median)
        assert v.absolute.diff_s == pytest.approx(cur_s - 10e-6, abs=0.05e-6)
        if with_reference:
            assert v.normalised.direction == status
            assert v.normalised.diff_s == pytest.approx(cur_s - 10e-6, abs=0.05e-6)


def test_decide_at_the_floors_and_the_significance_level():
    """The documented rule: |change| >= min_change AND |diff| >= min_diff_s AND p < alpha, with
    the ranks (Mann-Whitney's effect) pointing the same way as the medians."""
    rule = verdict.Rule()

    def direction(change, diff_s, p, effect):
        return verdict.decide(verdict.Measured(change, diff_s, 0.0, effect), p, rule).direction

    assert direction(0.05, 1e-6, 0.001, 0.9) == "slower"           # both floors reached exactly
    assert direction(-0.05, -1e-6, 0.001, 0.1) == "faster"
    assert direction(0.049, 5e-6, 0.001, 0.9) == "same"
    assert direction(0.2, 0.99e-6, 0.001, 0.9) == "same"
    assert direction(0.2, 5e-6, 0.01, 0.9) == "unsure"              # p == alpha is not significant
    assert direction(0.2, 5e-6, 0.0099, 0.9) == "slower"
    # Medians up but the ranks say the current run is mostly faster (or a coin toss): no verdict.
    assert direction(0.2, 5e-6, 0.001, 0.3) == "unsure"
    assert direction(0.2, 5e-6, 0.001, 0.5) == "unsure"
    assert direction(-0.2, -5e-6, 0.001, 0.5) == "faster"
    # Zero floors: any move of the medians counts, an unmoved median is the same whatever p says.
    zero = verdict.Rule(min_change=0, min_diff_s=0)
    for effect in (0.1, 0.5, 0.9):
        assert verdict.decide(verdict.Measured(0.0, 0.0, 0.0, effect), 0.001, zero).direction == "same"
    assert verdict.decide(verdict.Measured(0.001, 1e-9, 0.0, 0.9), 0.001, zero).direction == "slower"
    assert verdict.decide(verdict.Measured(-0.001, -1e-9, 0.0, 0.1), 0.001, zero).direction == "faster"


def test_measure_reports_relative_and_absolute_change():
    m = verdict.measure([2.0, 2.0, 2.0], [3.0, 3.0, 3.0], unit=1e-6)
    assert m.change == pytest.approx(0.5) and m.diff_s == pytest.approx(1e-6) and m.effect == 1.0
    # A zero baseline median (an empty timer reading) is an infinite change, not a crash.
    assert verdict.measure([0.0, 0.0], [1e-6, 1e-6]).change == math.inf


def test_holm_never_exceeds_one():
    assert verdict.holm([0.6, 0.9]) == [1.0, 1.0]
    assert verdict.holm([0.3, 0.8]) == pytest.approx([0.6, 0.8])


def test_reference_timing_from_samples_or_from_an_old_median():
    """Runs recorded before references kept their samples carry only the median: the kernel is
    still normalised by it. Where samples exist they are what counts."""
    def with_ref(kernel_s, ref, seed):
        e = entry(K + "t", noisy(kernel_s, 0.01, 30, seed))
        e["extra_info"]["reference"] = ref
        return [e]

    _, v = judge(with_ref(100e-6, {"name": "r", "median": 50e-6}, 1),
                 with_ref(120e-6, {"name": "r", "median": 50e-6}, 2))
    assert v.status == "slower" and v.reference_change == 0 and v.normalised.direction == "slower"
    _, v = judge(with_ref(100e-6, {"name": "r", "samples": noisy(50e-6, 0.01, 30, 3), "median": 1.0}, 1),
                 with_ref(100e-6, {"name": "r", "samples": noisy(50e-6, 0.01, 30, 4), "median": 2.0}, 2))
    assert v.status == "same" and abs(v.reference_change) < 0.01
    _, v = judge(with_ref(100e-6, {"name": "r"}, 1), with_ref(100e-6, {"name": "r", "median": 50e-6}, 2))
    assert v.status == "unsure" and "no timing" in v.note


def test_renamed_reference_is_unsure():
    base = one(100e-6, 50e-6, 1, ref_name="cublas[a]")
    cur = one(150e-6, 50e-6, 2, ref_name="cublas[b]")
    report, v = judge(base, cur)
    assert v.status == "unsure" and "cublas[a] -> cublas[b]" in v.note and not report.failed


@pytest.mark.parametrize("side", ["baseline", "current"])
def test_reference_on_one_side_only_is_unsure(side):
    """A benchmark that gained or lost its reference has no same-reference comparison: judging it
    on absolute time alone would let drift through as a verdict, so it is unsure."""
    with_ref = one(100e-6, 50e-6, 1)
    without = [entry(K + "test_gemm[v5-8192^3-bfloat16]", noisy(150e-6, seed=2))]
    base, cur = (with_ref, without) if side == "baseline" else (without, with_ref)
    report, v = judge(base, cur)
    names = "cublas[test_gemm[v5-8192^3-bfloat16]] -> none" if side == "baseline" else \
        "none -> cublas[test_gemm[v5-8192^3-bfloat16]]"
    assert v.status == "unsure" and names in v.note and not report.failed


def test_new_and_missing_are_listed_not_failing():
    base = [gemm_pair("test_gemm[a]", 1e-4, 1e-4, seed=1), gemm_pair("test_gemm[gone]", 1e-4, 1e-4, seed=2)]
    cur = [gemm_pair("test_gemm[a]", 1e-4, 1e-4, seed=3), gemm_pair("test_gemm[added]", 1e-4, 1e-4, seed=4)]
    report = verdict.compare(make_run(base), make_run(cur))
    assert {v.name.rsplit("::")[-1]: v.status for v in report.verdicts} == {
        "test_gemm[a]": "same", "test_gemm[added]": "new", "test_gemm[gone]": "missing"}
    medians = {v.status: (v.base_median, v.cur_median) for v in report.verdicts}
    assert medians["new"] == (None, pytest.approx(1e-4, rel=0.01))
    assert medians["missing"] == (pytest.approx(1e-4, rel=0.01), None)
    assert not report.failed
    # Nothing in common: the gate compared nothing, which is not a pass.
    nothing = verdict.compare(make_run(base), make_run(cur[1:]))
    assert nothing.failed and "nothing was compared" in nothing.headline()


def test_missing_samples():
    old = make_run([entry(K + "t", None, stats_median=1e-4)])  # medians only
    with pytest.raises(runs.BaselineFormatError, match="no raw samples.*--benchmark-save=baseline"):
        verdict.compare(old, make_run(one(1e-4, 1e-4, 1)))
    # One benchmark without samples among others that have them: that one is unsure.
    base = make_run(one(1e-4, 5e-5, 1) + [entry(K + "old", None, stats_median=1e-4)])
    cur = make_run(one(1e-4, 5e-5, 2) + [entry(K + "old", noisy(2e-4, seed=3))])
    verdicts = {v.name.rsplit("::")[-1]: v for v in verdict.compare(base, cur).verdicts}
    status = {name: (v.status, v.note) for name, v in verdicts.items()}
    assert status["old"] == ("unsure", "the baseline has no raw samples for it")
    # The row still shows both medians (from the stored statistics) for the reader.
    assert verdicts["old"].base_median == pytest.approx(1e-4)
    assert verdicts["old"].cur_median == pytest.approx(2e-4, rel=0.02)
    assert status["test_gemm[v5-8192^3-bfloat16]"][0] == "same"


@pytest.mark.parametrize("change,expect", [
    (dict(driver="575.57.08"), "driver 575"),
    (dict(cuda="12.8"), "CUDA 12"),
    (dict(gpu=A100), A100),
])
def test_mismatched_keys_are_refused_naming_both(change, expect):
    base = make_run(one(1e-4, 5e-5, 1), **change)
    with pytest.raises(runs.KeyMismatch) as err:
        verdict.compare(base, make_run(one(1e-4, 5e-5, 2)))
    msg = str(err.value)
    assert expect in msg and "NVIDIA H200, driver 580, CUDA 13" in msg and "Refusing" in msg


def test_rule_validation_names_the_argument():
    with pytest.raises(ValueError, match="alpha"):
        verdict.Rule(alpha=0)
    with pytest.raises(ValueError, match="min_change"):
        verdict.Rule(min_change=-0.1)
    with pytest.raises(ValueError, match="min_diff_s"):
        verdict.Rule(min_diff_s=-1)
    # The documented ranges, ends included or not: alpha in (0, 1), min_change in [0, 10),
    # min_diff_s >= 0 (zero floors are a legitimate "judge on the test alone").
    with pytest.raises(ValueError, match="alpha"):
        verdict.Rule(alpha=1)
    with pytest.raises(ValueError, match="min_change"):
        verdict.Rule(min_change=10)
    verdict.Rule(alpha=0.999, min_change=0, min_diff_s=0)
    verdict.Rule(min_change=9.5)


def slower_and_same_with_telemetry(second_telemetry=None):
    """(baseline, current) entries: one benchmark 30 % slower, its current run with throttling
    telemetry (gpu_idle, which is benign, and sw_power_cap), and one the same, whose name has a pipe."""
    tel = {"source": "nvml", "before": {"sm_mhz": 1980, "temp_c": 40, "reasons": ["gpu_idle"]},
           "after": {"sm_mhz": 1755, "temp_c": 71, "reasons": ["sw_power_cap"]}}
    base = one(100e-6, 50e-6, 1) + [gemm_pair("test_gemm[a|b]", 1e-4, 1e-4, seed=9)]
    cur = one(130e-6, 50e-6, 2) + [gemm_pair("test_gemm[a|b]", 1e-4, 1e-4, seed=8)]
    cur[0]["extra_info"]["telemetry"] = tel
    if second_telemetry is not None:
        cur[1]["extra_info"]["telemetry"] = second_telemetry
    return base, cur


def test_markdown_and_dict_render_the_verdict():
    base, cur = slower_and_same_with_telemetry()
    report = verdict.compare(make_run(base, commit="b" * 40), make_run(cur))
    md = report.to_markdown()
    assert md.startswith("## ❌ Benchmark gate: FAIL")
    assert "| SLOWER | tests/bench/test_bench.py::test_gemm[v5-8192^3-bfloat16] |" in md
    assert "test_gemm[a\\|b]" in md and "<details>" in md  # pipes escaped, same rows folded
    assert "SM clock 1755-1980 MHz" in md and "sw_power_cap in 1 benchmark(s)" in md
    assert "gpu_idle" not in md
    data = json.loads(json.dumps(report.to_dict()))
    assert data["result"] == "fail" and data["counts"] == {"slower": 1, "same": 1}
    assert data["key"] == "NVIDIA H200, driver 580, CUDA 13"
    assert data["baseline"]["commit"].startswith("bbbb") and data["current"]["commit"].startswith("aaaa")


def test_text_report_names_the_rule_the_telemetry_and_what_it_folded():
    base, cur = slower_and_same_with_telemetry({"unavailable": "no NVML"})
    report = verdict.compare(make_run(base, commit="b" * 40), make_run(cur))
    lines = report.to_text().splitlines()
    assert lines[4] == ("rule: slower/faster = reference-normalised and absolute median both moved by >= 5% and "
                        ">= 1 µs, Mann-Whitney U two-sided p < 0.01 after Holm's correction over the run")
    assert lines[5] == "telemetry, baseline: not recorded"
    assert lines[6] == ("telemetry, current:  SM clock 1755-1980 MHz (median 1868), max 71 °C, "
                        "throttled: sw_power_cap in 1 benchmark(s), unavailable: no NVML")
    # The table: a header, a rule as wide as its widest line, the slower row; the same row folded.
    header, rule_line, row, folded = lines[-4:]
    assert header.split() == ["verdict", "benchmark", "base", "µs", "now", "µs", "abs", "ref", "vs", "ref", "p", "note"]
    assert set(rule_line) == {"-"} and len(rule_line) == max(len(header), len(row))
    assert row.startswith("SLOWER   tests/bench/test_bench.py::test_gemm[v5-8192^3-bfloat16]")
    assert folded == "(1 more: same, no note)"
    full = report.to_text(all_rows=True).splitlines()
    assert full[-1].startswith("same     tests/bench/test_bench.py::test_gemm[a|b]") and "more: same" not in full[-1]
    # Clocks without a throttle reason say so; a run without telemetry says that instead.
    quiet = {"before": {"sm_mhz": 1980, "temp_c": 40, "reasons": ["gpu_idle"]}, "after": {"sm_mhz": 1980}}
    cur[0]["extra_info"]["telemetry"], cur[1]["extra_info"]["telemetry"] = quiet, quiet
    assert verdict._describe_telemetry(verdict.telemetry_summary(runs.as_run(make_run(cur)))) == \
        "SM clock 1980-1980 MHz (median 1980), max 40 °C, no throttling"
    assert verdict._describe_telemetry({}) == "not recorded"
    cur[1]["extra_info"]["telemetry"] = {"unavailable": "no NVML"}
    assert verdict.telemetry_summary(runs.as_run(make_run(cur)))["unavailable"] == {"no NVML": 1}


def test_a_run_with_nothing_in_common_fails_and_says_why():
    """Nothing ran, or nothing that ran is in the baseline: a FAIL that says nothing was compared,
    not a PASS over zero benchmarks; no common reference means no drift check, said so."""
    base = make_run([entry("tests/bench/test_bench.py::test_a", noisy(1e-4, seed=1))], commit="b" * 40)
    empty = verdict.compare(base, make_run([]))
    assert empty.headline() == "FAIL: no benchmark of this run is in the baseline (1 missing); nothing was compared"
    assert empty.failed and empty.compared == 0
    other = verdict.compare(base, make_run([entry("tests/bench/test_bench.py::test_b", noisy(1e-4, seed=2))]))
    assert other.headline() == ("FAIL: no benchmark of this run is in the baseline (1 new, 1 missing); "
                                "nothing was compared")
    assert other.drift_lines() == ["references: none in common (no drift check)"]
    data = other.to_dict()     # runs made in memory have no file: their paths are empty, not "None"
    assert data["baseline"]["path"] == data["current"]["path"] == "" and data["result"] == "fail"


def test_confirm_keeps_a_slower_benchmark_only_when_it_is_slower_again():
    """A second session times the slower benchmarks alone: slower again stays SLOWER; the same or
    faster again turns unsure with both changes in the note; not timed again stays SLOWER; the
    other verdicts are the first run's."""
    def pair(name, kernel_s, seed):
        return gemm_pair(f"test_gemm[{name}]", kernel_s, 50e-6, seed=seed)
    baseline = make_run([pair("real", 100e-6, 1), pair("passing", 100e-6, 3), pair("untimed", 100e-6, 5),
                         pair("same", 100e-6, 7)], commit="b" * 40)
    first = verdict.compare(baseline, make_run([pair("real", 120e-6, 2), pair("passing", 120e-6, 4),
                                                pair("untimed", 120e-6, 6), pair("same", 100e-6, 8)]))
    assert [v.status for v in first.verdicts] == ["slower", "slower", "slower", "same"]
    again = verdict.compare(baseline, make_run([pair("real", 121e-6, 12), pair("passing", 100.5e-6, 14)]))
    final = verdict.confirm(first, again)
    got = {v.name.split("[")[1].rstrip("]"): v for v in final.verdicts}
    assert {k: v.status for k, v in got.items()} == {"real": "slower", "passing": "unsure", "untimed": "slower",
                                                     "same": "same"}
    assert got["real"].note.startswith("slower again alone (+2")
    assert got["passing"].note.startswith("slower in the run (+20") and "same timed again alone (+1.2% vs ref)" in got["passing"].note
    assert got["passing"].note.endswith("not confirmed")
    assert got["untimed"].note == "not timed again: stays slower"
    assert got["same"] == first.verdicts[3]
    assert final.failed and final.headline() == "FAIL: 2 benchmark(s) slower (2 slower, 1 unsure, 1 same)"
    assert final.context()[-1].startswith("confirmation: 2 benchmark(s) found slower timed again alone")
    assert final.context()[-1].endswith(": 2 slower again")
    assert final.to_dict()["again"]["benchmarks"] == sorted(again.current.benchmarks)
    assert "not confirmed" in final.to_markdown()
    assert "(a second session, " in final.context()[-1] and final.to_dict()["again"]["path"] == ""
    # Read from a file, the second session is named by it, in the text and in the JSON.
    again_file = verdict.compare(baseline, runs.Run(make_run([pair("real", 121e-6, 12)]), Path("out/again.json")))
    named = verdict.confirm(first, again_file)
    assert "alone (out/again.json, " in named.context()[-1]
    assert named.to_dict()["again"]["path"] == "out/again.json"
    # Only the passing one slower: the gate passes, and says what it did not count.
    cleared = verdict.confirm(verdict.compare(baseline, make_run([pair("passing", 120e-6, 4)])),
                              verdict.compare(baseline, make_run([pair("passing", 99e-6, 14)])))
    assert not cleared.failed and cleared.headline().startswith("PASS (1 unsure")
    # Against another baseline the two runs cannot be put together.
    other = make_run([pair("real", 100e-6, 1)], commit="c" * 40)
    with pytest.raises(ValueError, match="again: compared with another baseline"):
        verdict.confirm(first, verdict.compare(other, make_run([pair("real", 121e-6, 12)])))


GOLDEN = Path(__file__).resolve().parent / "golden"


def test_every_verdict_renders_as_the_golden_reports():
    """One run with each verdict (slower, unsure as the reference moved, faster, new, missing, same)
    renders, line for line, as tests/cpu/golden/gate_report.txt (`regress compare -v`) and .md (the
    CI comment). The samples are seeded; a deliberate format change rewrites both files."""
    def pair(name, kernel_s, ref_s, seed):
        return gemm_pair(f"test_gemm[{name}]", kernel_s, ref_s, seed=seed)
    base = [pair("slower", 100e-6, 50e-6, 1), pair("faster", 100e-6, 50e-6, 3), pair("refmoved", 100e-6, 50e-6, 5),
            pair("same", 100e-6, 50e-6, 7), pair("gone", 100e-6, 50e-6, 9)]
    cur = [pair("slower", 110e-6, 50e-6, 2), pair("faster", 85e-6, 50e-6, 4), pair("refmoved", 100e-6, 45e-6, 6),
           pair("same", 100e-6, 50e-6, 8), pair("added", 100e-6, 50e-6, 10)]
    report = verdict.compare(make_run(base, commit="b" * 40), make_run(cur))
    assert report.to_text(all_rows=True) + "\n" == (GOLDEN / "gate_report.txt").read_text(encoding="utf-8")
    assert report.to_markdown() == (GOLDEN / "gate_report.md").read_text(encoding="utf-8")
    assert report.compared == 4 and report.failed


# ---------------------------------------------------------------------------------------------
# Keys and storage


def test_key_from_identity_and_layout(tmp_path):
    key = runs.GateKey.from_identity({"name": "NVIDIA H200", "driver_version": "580.159.04",
                                      "cuda_runtime_version": "13.2", "cuda_driver_version": "13.0"})
    assert (key.driver_major, key.cuda_major) == ("580", "13")
    assert runs.baseline_path(tmp_path, key) == tmp_path / "NVIDIA_H200" / "driver580-cuda13" / "baseline.json"
    no_driver = runs.GateKey.from_identity({"name": "NVIDIA H200"})
    assert not no_driver.complete and no_driver.slug == "driverunknown-cudaunknown"
    with pytest.raises(ValueError, match="identity"):
        runs.GateKey.from_identity({})


def test_a_key_is_complete_only_with_both_majors_and_needs_a_model_name():
    assert runs.GateKey("NVIDIA H200", "580", "13").complete
    assert not runs.GateKey("NVIDIA H200", "580", None).complete
    assert not runs.GateKey("NVIDIA H200", None, "13").complete
    for identity in (None, {}, {"name": ""}, {"name": None, "driver_version": "580"}):
        with pytest.raises(ValueError, match="no GPU model"):
            runs.GateKey.from_identity(identity)


def test_a_runs_time_is_utc_when_unzoned_and_the_epoch_when_unknown():
    from datetime import datetime, timedelta, timezone
    when = lambda text: runs.Run(dict(make_run([]), datetime=text)).timestamp
    assert when("2026-11-30T10:00:00") == datetime(2026, 11, 30, 10, tzinfo=timezone.utc)
    assert when("2026-11-30T12:00:00+02:00") == datetime(2026, 11, 30, 10, tzinfo=timezone.utc)
    assert when("2026-11-30T12:00:00+02:00").utcoffset() == timedelta(hours=2)   # its own zone kept
    assert runs.Run({"benchmarks": []}).timestamp == datetime.fromtimestamp(0, timezone.utc)   # no path either
    with pytest.raises(TypeError, match=r"^run: expected a Run or a pytest-benchmark dict, got int"):
        runs.as_run(5)


def test_save_and_find_baseline(tmp_path):
    data = make_run(one(1e-4, 5e-5, 1), commit="0123456789abcdef" * 2)
    written = runs.save_run(tmp_path, data, as_baseline=True)
    folder = tmp_path / "NVIDIA_H200" / "driver580-cuda13"
    assert written == [folder / "history" / "2026-11-30_100000_0123456789.json", folder / "baseline.json"]
    assert written[0].read_text() == written[1].read_text()
    base = runs.find_baseline(tmp_path, runs.Run(data).key)
    assert base.has_samples() and base.commit == "0123456789"
    # Samples are stored with 7 significant digits, one benchmark per line.
    stored = json.loads(written[1].read_text())["benchmarks"][0]
    raw = data["benchmarks"][0]["stats"]["data"][0]
    assert stored["stats"]["data"][0] == float(f"{raw:.7g}") != raw
    assert len(written[1].read_text().splitlines()) < 20
    # A history-only save does not touch the baseline.
    later = make_run(one(2e-4, 5e-5, 1), commit="f" * 40, when="2026-12-01T00:00:00+00:00")
    [only] = runs.save_run(tmp_path, later, as_baseline=False, label="nightly")
    assert only.name == "2026-12-01_000000_ffffffffff_nightly.json"
    assert runs.find_baseline(tmp_path, runs.Run(data).key).commit == "0123456789"


def test_missing_baseline_names_the_key_and_other_keys(tmp_path):
    runs.save_run(tmp_path, make_run(one(1e-4, 5e-5, 1), driver="575.1"), as_baseline=True)
    with pytest.raises(runs.BaselineNotFound) as err:
        runs.find_baseline(tmp_path, runs.Run(make_run([])).key)
    msg = str(err.value)
    assert "No baseline for [NVIDIA H200, driver 580, CUDA 13]" in msg
    assert "driver 575" in msg and "not compared" in msg and runs.RECORD_COMMAND in msg
    # Another model's baselines are listed as keys with runs, never offered as this model's
    other = tmp_path / "other"
    runs.save_run(other, make_run(one(1e-4, 5e-5, 1), gpu="NVIDIA A100-SXM4-80GB"), as_baseline=True)
    with pytest.raises(runs.BaselineNotFound) as err:
        runs.find_baseline(other, runs.Run(make_run([])).key)
    assert "This GPU model has baselines" not in str(err.value) and "A100" in str(err.value)
    # A key whose folder holds recorded runs but no baseline yet is listed among the keys with runs.
    history_only = tmp_path / "history-only"
    runs.save_run(history_only, make_run(one(1e-4, 5e-5, 1), gpu="NVIDIA A100-SXM4-80GB"), as_baseline=False)
    assert [k.gpu for k in runs.keys_under(history_only)] == ["NVIDIA A100-SXM4-80GB"]
    with pytest.raises(runs.BaselineNotFound, match="Keys with runs under .*A100"):
        runs.find_baseline(history_only, runs.Run(make_run([])).key)


def test_what_is_not_a_run_or_not_this_keys_baseline_is_refused_by_name(tmp_path):
    for text, why in (("[1, 2]", "not a pytest-benchmark run"), ('{"machine_info": {}}', "not a pytest-benchmark run"),
                      ("{cut", "is not JSON")):
        (tmp_path / "x.json").write_text(text)
        with pytest.raises(ValueError, match=why):
            runs.load_run(tmp_path / "x.json")
    assert runs.keys_under(tmp_path / "none") == {}
    key = runs.Run(make_run([])).key
    # A baseline that does not record its driver or CUDA version cannot stand for a complete key.
    unversioned = make_run(one(1e-4, 5e-5, 1))
    for field in ("driver_version", "cuda_driver_version", "cuda_runtime_version"):
        unversioned["machine_info"]["gpu"].pop(field)
    with pytest.raises(runs.KeyMismatch, match="does not record its driver or CUDA version"):
        runs.check_baseline(runs.Run(unversioned), key)
    # A baseline.json filed under this key's folder but recorded on another GPU is refused there.
    folder = tmp_path / "regs" / key.folder
    folder.mkdir(parents=True)
    (folder / "baseline.json").write_text(json.dumps(make_run(one(1e-4, 5e-5, 1), gpu=A100)))
    with pytest.raises(runs.KeyMismatch, match="Refusing to compare across baseline keys"):
        runs.find_baseline(tmp_path / "regs", key)
    # A run without the GPU's identity has no key; a baseline must hold raw samples; an unreadable
    # history file is skipped with a warning, the others read.
    nameless = make_run([])
    nameless["machine_info"]["gpu"].pop("name")
    with pytest.raises(runs.KeyMismatch, match=r"records no GPU model \(machine_info.gpu.name\)"):
        runs.Run(nameless).key
    medians_only = make_run([entry("tests/bench/test_bench.py::test_a", None, stats_median=1e-4)])
    with pytest.raises(runs.BaselineFormatError, match="a baseline needs raw samples"):
        runs.save_run(tmp_path / "saved", medians_only, as_baseline=True)
    history = tmp_path / "hist"
    history.mkdir()
    (history / "good.json").write_text(json.dumps(make_run(one(1e-4, 5e-5, 1))))
    (history / "bad.json").write_text("{cut")
    with pytest.warns(UserWarning, match=r"skipping .*bad\.json: .*is not JSON"):
        assert [r.path.name for r in runs.load_runs(history)] == ["good.json"]


def test_repository_history_is_keyed_and_old_format():
    """The runs kept from before the gate stored samples: filed under their key's history, no
    baseline.json, so the gate asks for a new recording instead of comparing medians."""
    folder = REPO / "regressions" / "NVIDIA_H200" / "driver580-cuda13"
    stored = runs.load_runs(folder / "history")
    assert len(stored) >= 4 and all(r.key.slug == "driver580-cuda13" for r in stored)
    for r in stored:
        assert r.path.name == runs.history_name(r)
    baseline = folder / "baseline.json"
    if baseline.exists():  # once recorded on the GPU, it must be a usable one
        runs.check_baseline(runs.load_run(baseline), stored[-1].key)
    else:
        with pytest.raises(runs.BaselineNotFound, match="Record one on this GPU"):
            runs.find_baseline(REPO / "regressions", stored[-1].key)


# ---------------------------------------------------------------------------------------------
# History


def test_detect_steps_finds_and_attributes_steps():
    flat = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98]
    assert history.detect_steps(flat) == []
    up = [1.0, 1.01, 0.99, 1.0, 1.2, 1.21, 1.19, 1.2]
    [s] = history.detect_steps(up)
    assert s.index == 4 and s.change == pytest.approx(0.2, abs=0.02)
    # An odd run in the middle of a flat series is not a step when the series is noisy enough.
    noisy_series = [1.0, 1.04, 0.97, 1.03, 0.96, 1.12, 1.0, 1.03, 0.98]
    assert history.detect_steps(noisy_series) == []
    two = [1.0] * 4 + [0.8] * 4 + [0.9] * 4
    assert [s.index for s in history.detect_steps(two)] == [4, 8]
    with pytest.raises(ValueError, match="values"):
        history.detect_steps([1.0, 0.0])
    for bad in (-0.01, 10):
        with pytest.raises(ValueError, match=r"^min_change: must be in \[0, 10\)"):
            history.detect_steps(up, min_change=bad)
    assert len(history.detect_steps(up, min_change=0)) == 1   # no floor: the noise alone decides
    assert history.detect_steps([]) == [] and history.detect_steps([1.0]) == []   # no pair: no step


def _steps(values, **kw):
    return [(s.index, round(s.change, 3)) for s in history.detect_steps(values, **kw)]


def test_detect_steps_finds_each_level_change_where_it_starts():
    steps = history.detect_steps([1.0] * 4 + [1.3] * 4 + [1.0] * 4)
    assert [(s.index, s.before, s.after) for s in steps] == [(4, 1.0, 1.3), (8, 1.3, 1.0)]
    assert [round(s.change, 3) for s in steps] == [0.3, -0.231]


def test_detect_steps_merges_levels_closer_than_the_floor():
    assert _steps([1.0] * 4 + [1.03] * 4) == []                       # 3 %: under the 5 % floor
    assert _steps([1.0] * 4 + [1.03] * 4, min_change=0.02) == [(4, 0.03)]
    assert _steps([10.0] * 4 + [10.3] * 4) == []                        # relative, whatever the unit
    assert _steps([1.0] * 4 + [1.25] * 4, min_change=0.25) == [(4, 0.25)]   # a change of exactly the floor counts
    assert _steps([1.0] + [1.5] * 7) == [(1, 0.5)]                      # from the second run on


def test_step_penalty_is_the_floor_or_three_robust_sigmas_of_the_scatter():
    d = 0.1   # every successive difference of the log-series is d
    assert history.step_penalty([0.0, d] * 4, 0.05) == pytest.approx(3 * 1.4826 * d / math.sqrt(2), rel=1e-12)
    assert history.step_penalty([0.0, 0.001] * 4, 0.05) == pytest.approx(math.log1p(0.05), rel=1e-12)
    # the median difference, not the mean: one jump among quiet runs does not raise the bar
    assert history.step_penalty([0.0] * 6 + [1.0] * 6, 0.05) == pytest.approx(math.log1p(0.05), rel=1e-12)


def test_detect_steps_raises_its_bar_with_the_run_to_run_scatter():
    def zigzag(level, a):   # ten runs alternating a above and below the level
        return [level * (1 + a if i % 2 else 1 - a) for i in range(10)]
    assert _steps(zigzag(1.0, 0.01) + zigzag(1.06, 0.01)) == [(10, 0.06)]   # +6 % over 1 % scatter: a step
    assert _steps(zigzag(1.0, 0.03) + zigzag(1.06, 0.03)) == []             # over 3 % scatter: not one


def test_detect_steps_needs_two_positive_values_and_a_sane_floor():
    assert _steps([]) == [] and _steps([1.0]) == [] and _steps([1.0, 1.0]) == []
    for bad in ([1.0, 0.0], [1.0, -2.0], [1.0, float("nan")]):
        with pytest.raises(ValueError, match="values: must all be positive"):
            history.detect_steps(bad)
    for floor in (-0.01, 10):
        with pytest.raises(ValueError, match="min_change: must be in"):
            history.detect_steps([1.0, 2.0], min_change=floor)


def test_history_marks_steps_with_ratio_next_to_time(tmp_path):
    folder = tmp_path / "NVIDIA_H200" / "driver580-cuda13"
    ratios = [1.30, 1.31, 1.29, 1.05, 1.06, 1.04]  # V5 got faster relative to cuBLAS at commit 3
    for i, ratio in enumerate(ratios):
        drift = 1.0 + 0.08 * (i == 4)  # a slow machine day at commit 4: time up, ratio unchanged
        ref = 180e-6 * drift
        bench = gemm_pair("test_gemm[v5-4096^3-float16]", ref * ratio, ref, rel=0.005, seed=i,
                          ref_name="cublas[4096^3-float16]")
        bench["extra_info"].update(m=4096, n=4096, k=4096)
        runs.save_run(tmp_path, make_run([bench], commit=f"{i}" * 40, when=f"2026-11-{10 + i}T00:00:00+00:00"),
                      as_baseline=False)
    png, md, hist = history.write(folder, tmp_path / "out")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    [[step]] = hist.steps.values()
    assert hist.runs[hist.series["tests/bench/test_bench.py::test_gemm[v5-4096^3-float16]"][step.index].run].commit == "3333333333"
    text = md.read_text()
    assert "| test_gemm[v5-4096^3-float16] | 3333333333 |" in text and "vs ref" in text
    assert "▼" in text and "· 1.30×" in text  # time and ratio side by side
    lines = text.splitlines()
    steps_at = lines.index("## Step changes")
    assert lines[steps_at + 1:steps_at + 4] == ["", "| benchmark | commit | date | scale | before | after | change |",
                                                "|---|---|---|---|---:|---:|---:|"]
    assert "None beyond the noise" not in text
    # The runs' commits and dates close the page, oldest first, one row each, a table of their own
    commits = lines[lines.index("| commit | date |"):]
    assert lines[lines.index("| commit | date |") - 1] == ""
    assert commits[1] == "|---|---|" and commits[2] == "| 0000000000 | 2026-11-10 00:00 |"
    assert len(commits) == 2 + len(ratios) and commits[-1] == "| 5555555555 | 2026-11-15 00:00 |"
    # TFLOP/s from the benchmark's M, N, K and its median time (2 M N K flops)
    first = hist.series["tests/bench/test_bench.py::test_gemm[v5-4096^3-float16]"][0]
    assert first.tflops == pytest.approx(2 * 4096 ** 3 / first.median_s / 1e12)
    assert 400 < first.tflops < 800


def test_history_of_a_benchmark_without_reference_steps_on_its_time(tmp_path):
    folder = tmp_path / "NVIDIA_H200" / "driver580-cuda13"
    for i, t in enumerate([10e-6, 10.1e-6, 9.9e-6, 13e-6, 13.1e-6, 12.9e-6]):   # slower at commit 3
        bench = entry(K + "test_host_overhead[v5]", noisy(t, 0.002, 20, i), extra={"flops": 2e6})
        runs.save_run(tmp_path, make_run([bench], commit=f"{i}" * 40, when=f"2026-11-{10 + i}T00:00:00+00:00"),
                      as_baseline=False)
    _, md, hist = history.write(folder, tmp_path / "out")
    [[step]] = hist.steps.values()
    assert step.index == 3 and step.change == pytest.approx(0.3, abs=0.02)
    text = md.read_text()
    assert "| test_host_overhead[v5] | 3333333333 | 2026-11-13 00:00 | µs | 9.99 | 13.00 | +30.1% |" in text
    assert "▲ 13.0" in text and "vs ref" not in text
    assert hist.series[K + "test_host_overhead[v5]"][0].tflops == pytest.approx(2e6 / 10e-6 / 1e12, rel=0.01)


def test_a_history_without_steps_says_so_and_leaves_out_runs_that_timed_nothing(tmp_path):
    """A flat series: the step table is a sentence. A benchmark whose run recorded a median of 0 (no
    time measured) is not a point: its ratio would be 0, and a step to 0 is not a change of speed."""
    folder = tmp_path / "NVIDIA_H200" / "driver580-cuda13"
    for i, t in enumerate([10e-6, 10.1e-6, 9.9e-6, 10e-6]):
        benches = [gemm_pair("test_gemm[v4]", t, 5e-6, rel=0.002, seed=i)]
        if i == 3:
            benches.append(entry(K + "test_gemm[v3]", [0.0] * 5))
        runs.save_run(tmp_path, make_run(benches, commit=f"{i}" * 40, when=f"2026-11-{10 + i}T00:00:00+00:00"),
                      as_baseline=False)
    _, md, hist = history.write(folder, tmp_path / "out")
    assert list(hist.series) == [K + "test_gemm[v4]"] and hist.steps[K + "test_gemm[v4]"] == []
    lines = md.read_text().splitlines()
    assert lines[lines.index("## Step changes") + 1:][:2] == ["", "None beyond the noise and the 5 % floor."]


def test_steps_at_one_commit_are_listed_by_benchmark_name(tmp_path):
    folder = tmp_path / "NVIDIA_H200" / "driver580-cuda13"
    for i in range(6):
        slow = 1.3 if i >= 3 else 1.0                      # both slower from commit 3 on
        benches = [gemm_pair(f"test_gemm[{k}]", 10e-6 * slow, 5e-6, rel=0.002, seed=10 * i + j)
                   for j, k in enumerate(("v5", "v4"))]
        runs.save_run(tmp_path, make_run(benches, commit=f"{i}" * 40, when=f"2026-11-{10 + i}T00:00:00+00:00"),
                      as_baseline=False)
    _, md, _ = history.write(folder, tmp_path / "out")
    rows = [line for line in md.read_text().splitlines() if line.startswith("| test_gemm[") and "| vs ref |" in line]
    assert [r.split(" | ")[:2] for r in rows] == [["| test_gemm[v4]", "3333333333"], ["| test_gemm[v5]", "3333333333"]]


def test_a_reference_is_timed_by_its_samples_else_by_its_median():
    """The ratio's denominator: the reference's own samples where the run kept them (their median),
    its stored median where it kept only that, the old reference_us before named references."""
    with_samples = gemm_pair("test_gemm[v4]", 10e-6, 5e-6, rel=0.0, seed=0)
    with_samples["extra_info"]["reference"]["median"] = 99.0      # a stale median: the samples decide
    median_only = gemm_pair("test_gemm[v4]", 10e-6, 5e-6, rel=0.0, seed=0)
    median_only["extra_info"]["reference"]["samples"] = []
    median_only["extra_info"]["reference"]["median"] = 4e-6
    points = []
    for bench in (with_samples, median_only):
        hist = history.build([runs.Run(make_run([bench]))])
        points.append(hist.series[K + "test_gemm[v4]"][0].ratio)
    assert points == pytest.approx([2.0, 2.5])
    nothing = gemm_pair("test_gemm[v4]", 10e-6, 5e-6, rel=0.0, seed=0)
    nothing["extra_info"]["reference"].update(samples=[], median=None)
    assert history.build([runs.Run(make_run([nothing]))]).series[K + "test_gemm[v4]"][0].ratio is None


def test_only_key_folders_with_stored_runs_have_a_history(tmp_path):
    empty = tmp_path / "NVIDIA_H200" / "driver1-cuda1" / "history"
    empty.mkdir(parents=True)
    runs.save_run(tmp_path, make_run([gemm_pair("test_gemm[v4]", 1e-5, 5e-6)]), as_baseline=False)
    assert [f.name for f in history.key_folders(tmp_path)] == ["driver580-cuda13"]


def test_no_stored_runs_name_nothing_outside_their_range():
    run = runs.Run(make_run([gemm_pair("test_gemm[v4]", 1e-5, 5e-6)]))
    assert history.outside_history(run, []) == []


def test_history_reads_old_runs_with_a_median_reference(tmp_path):
    folder = tmp_path / "G" / "driver1-cuda1" / "history"
    for i, (t, ref) in enumerate([(100.0, 50.0), (101.0, 50.0), (80.0, 50.0)]):
        b = entry(K + "test_gemm[v4]", None, stats_median=t * 1e-6, extra={"reference_us": ref})
        runs.save_run(tmp_path, make_run([b], gpu="G", driver="1", cuda="1", commit=f"{i}" * 40,
                                         when=f"2026-11-1{i}T00:00:00+00:00"), as_baseline=False)
    hist = history.build(runs.load_runs(folder))
    assert [p.ratio for p in hist.series[K + "test_gemm[v4]"]] == pytest.approx([2.0, 2.02, 1.6])


# ---------------------------------------------------------------------------------------------
# Telemetry


class FakeNvml:
    """NVML as pynvml has it; like the real library, every call before nvmlInit() raises."""
    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    def __init__(self):
        self.bus_ids = []
        self.initialized = False

    def nvmlInit(self):
        self.initialized = True

    def _ready(self):
        if not self.initialized:
            raise RuntimeError("NVMLError_Uninitialized: Uninitialized")

    def nvmlDeviceGetHandleByPciBusId(self, bus_id):
        self._ready()
        self.bus_ids.append(bus_id)
        return "h"

    def nvmlDeviceGetClockInfo(self, h, which):
        self._ready()
        return {1: 1755, 2: 3201}[which]

    def nvmlDeviceGetTemperature(self, h, which):
        self._ready()
        return 68

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        self._ready()
        return 0x4 | 0x1

    def nvmlDeviceGetPowerUsage(self, h):
        self._ready()
        return 699_500


def test_telemetry_through_nvml():
    nvml = FakeNvml()
    tel = telemetry.Telemetry("0000:18:00.0", nvml_module=nvml)
    point = tel.read()
    assert point == {"sm_mhz": 1755, "mem_mhz": 3201, "temp_c": 68, "power_w": 699.5,
                     "reasons": ["gpu_idle", "sw_power_cap"]}
    assert nvml.bus_ids == [b"00000000:18:00.0"]
    assert tel.around(point, point)["source"] == "nvml"


class CountedNvml(FakeNvml):
    def __init__(self, count):
        super().__init__()
        self.count, self.indices = count, []

    def nvmlDeviceGetCount(self):
        self._ready()
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i):
        self._ready()
        self.indices.append(i)
        return "h"


def test_nvml_without_a_bus_id_reads_the_only_gpu_and_refuses_to_guess_among_several():
    one = CountedNvml(1)
    assert telemetry.Telemetry(None, nvml_module=one).read()["sm_mhz"] == 1755 and one.indices == [0]
    two = CountedNvml(2)
    tel = telemetry.Telemetry(None, nvml_module=two, use_smi=False)
    assert two.indices == [] and "several GPUs and no PCI bus id" in tel.read()["unavailable"]


def test_nvml_is_preferred_where_nvidia_smi_answers_too():
    def smi(args):
        return "1980, 3201, 41, 120.50, 0x0\n"
    tel = telemetry.Telemetry("0000:18:00.0", nvml_module=FakeNvml(), smi_runner=smi)
    assert tel.source.name == "nvml" and tel.read()["sm_mhz"] == 1755


def test_bus_ids_in_nvml_spelling():
    assert telemetry._nvml_bus_id("0000:18:00.0") == "00000000:18:00.0"
    assert telemetry._nvml_bus_id("0010:18:00.0") == "00000010:18:00.0"   # the domain is hex
    assert telemetry._nvml_bus_id("0001:af:00.0") == "00000001:AF:00.0"
    for odd in ("18:00.0", "0000-18-00.0"):   # not domain:bus:device.function: passed on as given
        assert telemetry._nvml_bus_id(odd) == odd


def test_nvidia_smi_on_the_path_is_run_and_read_without_nvml(tmp_path, monkeypatch):
    """The default runner executes the nvidia-smi it finds on PATH (here a stand-in script that
    knows only the older reason field, as drivers before the rename do) and reads its CSV."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\ncase "$*" in *clocks_event_reasons*) exit 6;; esac\n'
                   'echo "1410, 1593, 55, 301.25, 0x0000000000000004"\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    tel = telemetry.Telemetry("0000:18:00.0", use_nvml=False)
    assert tel.source is not None and tel.source.name == "nvidia-smi", tel.unavailable
    assert tel.read() == {"sm_mhz": 1410, "mem_mhz": 1593, "temp_c": 55, "power_w": 301.25,
                          "reasons": ["sw_power_cap"]}


def test_nvidia_smi_answers_of_the_wrong_shape_are_errors_not_points():
    answers = {"clocks_event_reasons.active": "1980, 3201\n", "clocks_throttle_reasons.active": "\n"}

    def smi(args):
        return next(v for k, v in answers.items() if k in args[2])
    tel = telemetry.Telemetry(None, use_nvml=False, smi_runner=smi)
    assert "nvidia-smi did not answer a clock query" in tel.read()["unavailable"]
    answers["clocks_throttle_reasons.active"] = "1980, 3201, 41, [N/A], 0x1\n"
    tel = telemetry.Telemetry(None, use_nvml=False, smi_runner=smi)
    assert tel.read() == {"sm_mhz": 1980, "mem_mhz": 3201, "temp_c": 41, "reasons": ["gpu_idle"]}
    answers["clocks_throttle_reasons.active"] = "1980, 3201, 41\n"     # the driver changed its mind
    assert "answered" in tel.read()["unavailable"]


def test_telemetry_falls_back_to_nvidia_smi_then_to_unavailable():
    calls = []

    def smi(args):
        calls.append(args)
        if "clocks_event_reasons.active" in args[2]:
            raise OSError("unknown field")  # an older driver: only the throttle name
        return "1980, 3201, 41, 120.50, 0x0000000000000020\n"

    tel = telemetry.Telemetry("0000:18:00.0", use_nvml=False, smi_runner=smi)
    assert tel.read() == {"sm_mhz": 1980, "mem_mhz": 3201, "temp_c": 41, "power_w": 120.5,
                          "reasons": ["sw_thermal_slowdown"]}
    assert calls[-1][1] == "--id=0000:18:00.0" and "clocks_throttle_reasons.active" in calls[-1][2]

    def broken(args):
        raise FileNotFoundError("nvidia-smi")

    none = telemetry.Telemetry(None, nvml_module=None, use_nvml=False, smi_runner=broken)
    assert "nvidia-smi" in none.read()["unavailable"]
    assert none.around({}, {}) == {"source": None, "unavailable": none.unavailable}
    assert telemetry.decode_reasons(0x208) == ["hw_slowdown", "other_0x200"]
