"""A/B statistics: the interval of the median speedup, the stop rule and the verdict.

Pure python (no numpy): the parent process stays light and the results are reproducible.
A speedup is a ratio B/A of throughputs from one pair of runs; the median is taken on the
log scale, so that 2x and 0.5x are symmetric and an even count gives the geometric mean of the
two middle pairs.

The interval is the distribution-free one for a median (the sign-test interval): with n pairs,
the k-th smallest and the k-th largest ratio, with k the largest count such that fewer than k of
n fair coin flips come up heads with probability at most 2.5%. It assumes only that the pairs
are independent and exchangeable, which the alternating order (A B, then B A) is for; it
assumes nothing about the shape of the run-to-run noise. A percentile bootstrap of the median,
used before, claims 95% from 5-6 pairs while covering far less when runs have heavy tails (one
GPU A/A test of a byte-identical copy read 0.88x [0.72, 0.97], "slower"). With 6-8 pairs this
interval is [min, max]: an A/A comparison can only get a verdict if every single pair lands
more than 2% on the same side, which happens with probability at most 2 / 2**n (3.1% at n=6,
0.8% at n=8) whatever the noise.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

# Verdict thresholds: faster/slower need the whole 95% interval past
# +-2%; "no measurable change" needs it inside +-5%.
FASTER_ABOVE = 1.02
SLOWER_BELOW = 0.98
EQUAL_WITHIN = 0.05
CONFIDENCE = 0.95

FASTER, SLOWER, NO_CHANGE, INCONCLUSIVE = "faster", "slower", "no measurable change", "inconclusive"


@dataclass(frozen=True)
class SpeedupSummary:
    n: int
    median: float
    lo: float
    hi: float
    min: float
    max: float

    @property
    def half_width(self) -> float:
        """Largest relative distance from the median to an end of the interval (inf: no interval)."""
        return max(self.hi / self.median - 1.0, 1.0 - self.lo / self.median)

    @property
    def verdict(self) -> str:
        return verdict(self.lo, self.hi, self.n)


def log_median(ratios: Sequence[float]) -> float:
    """The median on the log scale: for an even count, the geometric mean of the two middle
    ratios, kept between them (``exp(log(3.0))`` is 3.0000000000000004, above an interval that
    ends at 3.0)."""
    import statistics  # with fractions and decimal: not for every command that imports the CLI

    ordered = sorted(ratios)
    low, high = ordered[(len(ordered) - 1) // 2], ordered[len(ordered) // 2]
    return min(max(math.exp(statistics.median(math.log(r) for r in ordered)), low), high)


def order_statistic_rank(n: int, confidence: float = CONFIDENCE) -> int:
    """k (1-based) such that [x_(k), x_(n+1-k)] covers the median with at least ``confidence``;
    0 when no such interval exists (too few pairs)."""
    alpha = (1.0 - confidence) / 2.0
    k, below = 0, 0.0  # below = P(Binomial(n, 1/2) < k + 1), accumulated term by term
    while k < n // 2:
        below += math.comb(n, k) / 2.0**n
        if below > alpha:
            break
        k += 1
    return k


# Fewer pairs than this have no 95% distribution-free interval for the median: even [min, max]
# covers only 1 - 2 / 2**n (5 pairs: 93.75%), so they give no verdict. 6 at 95%.
MIN_VERDICT_PAIRS = next(n for n in itertools.count(1) if order_statistic_rank(n) > 0)


def median_ci(ratios: Sequence[float], *, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The distribution-free interval of the median ratio; (0, inf) when there are too few pairs."""
    if not ratios:
        raise ValueError("no ratios")
    if any(not (r > 0 and math.isfinite(r)) for r in ratios):
        raise ValueError("ratios must be positive and finite")
    ordered = sorted(ratios)
    k = order_statistic_rank(len(ordered), confidence)
    if k == 0:
        return 0.0, math.inf
    return ordered[k - 1], ordered[len(ordered) - k]


def summarize(ratios: Sequence[float]) -> SpeedupSummary:
    lo, hi = median_ci(ratios)
    return SpeedupSummary(len(ratios), log_median(ratios), lo, hi, min(ratios), max(ratios))


def verdict(lo: float, hi: float, pairs: int = MIN_VERDICT_PAIRS) -> str:
    """faster / slower / no measurable change / inconclusive, from the 95% interval and the pair count."""
    if pairs < MIN_VERDICT_PAIRS:
        return INCONCLUSIVE
    if lo > FASTER_ABOVE:
        return FASTER
    if hi < SLOWER_BELOW:
        return SLOWER
    if lo >= 1.0 - EQUAL_WITHIN and hi <= 1.0 + EQUAL_WITHIN:
        return NO_CHANGE
    return INCONCLUSIVE


def precise_enough(summary: SpeedupSummary, tolerance: float = 0.05) -> bool:
    """The stop rule: the interval lies within +-tolerance of its median."""
    return summary.half_width <= tolerance


def cv(values: Sequence[float]) -> float | None:
    """Coefficient of variation (stdev / mean), None for fewer than two values."""
    import statistics  # as in log_median

    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean else None
