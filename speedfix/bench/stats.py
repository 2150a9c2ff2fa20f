"""A/B statistics: the bootstrap interval of the median speedup, the stop rule and the verdict.

Pure python (no numpy): the parent process stays light and the results are reproducible.
A speedup is a ratio B/A of throughputs from one pair of runs; the median is taken on the
log scale, so that 2x and 0.5x are symmetric and an even count gives the geometric mean of the
two middle pairs.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# Verdict thresholds (benchmark-notes §7): faster/slower need the whole 95% interval past
# +-2%; "no measurable change" needs it inside +-5%.
FASTER_ABOVE = 1.02
SLOWER_BELOW = 0.98
EQUAL_WITHIN = 0.05
# With fewer pairs the percentile bootstrap of a median is about [min, max], whose true coverage
# is far below 95% (3 pairs: 75%); 5 pairs reach about 94% (sign test), so fewer give no verdict.
MIN_VERDICT_PAIRS = 5

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
        """Largest relative distance from the median to an end of the interval."""
        return max(self.hi / self.median - 1.0, 1.0 - self.lo / self.median)

    def as_dict(self) -> dict:
        return {"pairs": self.n, "median": self.median, "bootstrap95_median": [self.lo, self.hi],
                "min": self.min, "max": self.max, "verdict": verdict(self.lo, self.hi, self.n)}


def log_median(ratios: Sequence[float]) -> float:
    return math.exp(statistics.median(math.log(r) for r in ratios))


def bootstrap_median_ci(ratios: Sequence[float], *, confidence: float = 0.95, resamples: int = 4000,
                        seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the median ratio (seeded: the same input, the same answer).

    With very few pairs this degenerates to about [min, max], which is the honest answer.
    """
    if not ratios:
        raise ValueError("no ratios")
    if any(not (r > 0 and math.isfinite(r)) for r in ratios):
        raise ValueError("ratios must be positive and finite")
    logs = [math.log(r) for r in ratios]
    if len(logs) == 1:
        return math.exp(logs[0]), math.exp(logs[0])
    rng = random.Random(seed)
    n = len(logs)
    medians = sorted(statistics.median(rng.choices(logs, k=n)) for _ in range(resamples))
    alpha = (1.0 - confidence) / 2.0
    lo = medians[int(math.floor(alpha * (resamples - 1)))]
    hi = medians[int(math.ceil((1.0 - alpha) * (resamples - 1)))]
    return math.exp(lo), math.exp(hi)


def summarize(ratios: Sequence[float], *, seed: int = 0) -> SpeedupSummary:
    lo, hi = bootstrap_median_ci(ratios, seed=seed)
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
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean else None
