"""Two-sample statistics for the gate, in pure Python (no SciPy: one test does not justify it).

Mann-Whitney U (Wilcoxon rank-sum) asks whether one run's samples tend to be larger than the
other's without assuming a distribution: GPU timings are skewed (a clock dip or a preempting
process makes a few rounds slow, never fast), so a t-test's normality assumption does not hold,
while ranks are untouched by how far out an outlier lies.

* exact: when there are no ties and the samples are small (n1*n2 <= EXACT_MAX_PAIRS), the null
  distribution of U is counted exactly (coefficients of a Gaussian binomial coefficient);
* normal approximation otherwise, with the tie correction of the variance and a continuity
  correction (as SciPy's ``mannwhitneyu(..., method="asymptotic")``). Ties are common: CUDA event
  times of µs-scale kernels come in ~0.5 µs quanta.

p-values are two-sided.
"""

from __future__ import annotations

import functools
import itertools
import math
import statistics
from dataclasses import dataclass
from typing import Sequence

# Exact counting costs O(n1 * n1 * n2) integer additions: trivial for the 20-30 rounds of a
# benchmark, pointless for pooled references with hundreds of samples (normal is accurate there).
EXACT_MAX_PAIRS = 10_000


@dataclass(frozen=True)
class MannWhitney:
    u: float  # U of the first sample: pairs (x, y) with x > y, ties counting 1/2
    p: float  # two-sided p-value
    method: str  # "exact" or "normal"
    n1: int
    n2: int

    @property
    def effect(self) -> float:
        """Common-language effect size: P(x > y) + P(x == y)/2, 0.5 when the runs are alike."""
        return self.u / (self.n1 * self.n2)


def _clean(values, name: str) -> list[float]:
    if values is None:
        raise ValueError(f"{name}: expected a sequence of numbers, got None")
    out = [float(v) for v in values]
    if not out:
        raise ValueError(f"{name}: needs at least one sample")
    if any(math.isnan(v) for v in out):
        raise ValueError(f"{name}: contains NaN")
    return out


def ranks(values: Sequence[float]) -> tuple[list[float], list[int]]:
    """1-based ranks with ties given their average rank, and the sizes of the tie groups."""
    order = sorted(range(len(values)), key=values.__getitem__)
    result = [0.0] * len(values)
    ties = []
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        average = (i + j) / 2 + 1
        for k in range(i, j + 1):
            result[order[k]] = average
        if j > i:
            ties.append(j - i + 1)
        i = j + 1
    return result, ties


def u_distribution(n1: int, n2: int) -> list[int]:
    """counts[u] = number of orderings of n1 x's and n2 y's (no ties) whose U equals u.

    The generating function of U is the Gaussian binomial coefficient [n1+n2 choose n1]_q,
    built as prod_{i=1..n1} (1 - q^(n2+i)) / (1 - q^i), truncated at degree n1*n2 (exact: the
    result is a polynomial of that degree, and truncated power-series arithmetic is consistent).
    """
    if n1 < 0 or n2 < 0:
        raise ValueError(f"n1, n2: sample sizes must be >= 0, got {n1}, {n2}")
    size = n1 * n2 + 1
    poly = [0] * size
    poly[0] = 1
    for i in range(1, n1 + 1):
        shift = n2 + i
        for k in range(size - 1, shift - 1, -1):  # times (1 - q^shift)
            poly[k] -= poly[k - shift]
        for k in range(i, size):  # divided by (1 - q^i)
            poly[k] += poly[k - i]
    return poly


@functools.lru_cache(maxsize=64)
def _cumulative(n1: int, n2: int) -> tuple[int, ...]:
    """Running sums of u_distribution(n1, n2): a run's benchmarks share a handful of sizes."""
    return tuple(itertools.accumulate(u_distribution(n1, n2)))


def mann_whitney_u(x, y) -> MannWhitney:
    """Two-sided Mann-Whitney U test of samples x and y (any numbers, any lengths >= 1)."""
    x, y = _clean(x, "x"), _clean(y, "y")
    n1, n2 = len(x), len(y)
    r, ties = ranks(x + y)
    u = sum(r[:n1]) - n1 * (n1 + 1) / 2
    if not ties and n1 * n2 <= EXACT_MAX_PAIRS:
        cumulative = _cumulative(n1, n2)
        total = cumulative[-1]
        k = int(round(u))
        low, high = cumulative[k], total - (cumulative[k - 1] if k > 0 else 0)
        return MannWhitney(u, min(1.0, 2 * min(low, high) / total), "exact", n1, n2)
    n = n1 + n2
    tie_term = sum(t ** 3 - t for t in ties)
    variance = n1 * n2 / 12 * ((n + 1) - tie_term / (n * (n - 1)))
    if variance <= 0:  # every sample equal: no evidence of any difference
        return MannWhitney(u, 1.0, "normal", n1, n2)
    z = max(0.0, abs(u - n1 * n2 / 2) - 0.5) / math.sqrt(variance)
    return MannWhitney(u, min(1.0, math.erfc(z / math.sqrt(2))), "normal", n1, n2)


def median(values) -> float:
    return statistics.median(_clean(values, "values"))
