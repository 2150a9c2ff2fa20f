"""The A/B statistics on synthetic inputs: interval, verdicts, stop rule."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from speedfix.bench import stats

ratios_st = st.lists(st.floats(min_value=0.2, max_value=5.0), min_size=1, max_size=25)


@given(ratios_st)
@example([1.0, 1.0, 3.0, 3.0, 3.0, 3.0])  # exp(log(3.0)) rounds above 3.0, the interval's end
@settings(max_examples=60, deadline=None)
def test_interval_brackets_the_median_and_lies_within_the_data(ratios):
    s = stats.summarize(ratios)
    eps = 1e-9  # exp(log(x)) round trips
    if len(ratios) < stats.MIN_VERDICT_PAIRS:  # no 95% interval exists: it says so
        assert (s.lo, s.hi) == (0.0, math.inf)
        return
    assert min(ratios) * (1 - eps) <= s.lo <= s.median <= s.hi <= max(ratios) * (1 + eps)


@given(ratios_st, st.floats(min_value=0.5, max_value=2.0))
@settings(max_examples=40, deadline=None)
def test_scaling_every_ratio_scales_the_interval(ratios, factor):
    a = stats.summarize(ratios)
    b = stats.summarize([r * factor for r in ratios])
    assert b.median == pytest.approx(a.median * factor, rel=1e-9)
    assert b.lo == pytest.approx(a.lo * factor, rel=1e-9)
    assert b.hi == pytest.approx(a.hi * factor, rel=1e-9)


def test_median_is_on_the_log_scale():
    # 2x and 0.5x are symmetric: their median is 1, not 1.25
    assert stats.log_median([2.0, 0.5]) == pytest.approx(1.0)
    assert stats.log_median([1.0, 2.0, 4.0]) == pytest.approx(2.0)


@pytest.mark.parametrize("n, rank", [(5, 0), (6, 1), (8, 1), (9, 2), (12, 3), (20, 6)])
def test_order_statistic_rank_matches_the_sign_test_table(n, rank):
    assert stats.order_statistic_rank(n) == rank


def test_the_gpu_a_a_example_that_read_slower_is_inconclusive():
    # a byte-identical copy, 6 pairs on an H100 (single-process loading, heavy-tailed runs)
    summary = stats.summarize([1.06, 0.61, 0.89, 0.88, 0.89, 0.84])
    assert (summary.lo, summary.hi) == (0.61, 1.06)
    assert summary.verdict == stats.INCONCLUSIVE


@pytest.mark.parametrize("noise", ["lognormal", "heavy_tailed", "slow_outliers"])
@pytest.mark.parametrize("pairs", [6, 10])
def test_a_a_false_verdicts_stay_under_the_bound_whatever_the_noise(noise, pairs):
    # Seeded simulation (deterministic): identical scripts, i.e. ratios symmetric around 1.
    rng = random.Random(pairs * 31 + len(noise))

    def run_rate() -> float:
        if noise == "lognormal":
            return math.exp(rng.gauss(0, 0.05))
        if noise == "heavy_tailed":  # Student-t with 1 degree of freedom on the log scale
            return math.exp(0.05 * max(-200.0, min(200.0, math.tan(math.pi * (rng.random() - 0.5)))))
        return 0.5 if rng.random() < 0.2 else math.exp(rng.gauss(0, 0.02))  # a run loses half its speed

    trials = 4000
    false = sum(stats.summarize([run_rate() / run_rate() for _ in range(pairs)]).verdict
                in (stats.FASTER, stats.SLOWER) for _ in range(trials))
    bound = 2 / 2 ** pairs if pairs <= 8 else 0.05
    assert false / trials <= bound


def test_more_pairs_give_a_narrower_interval():
    rng = random.Random(1)
    few = [math.exp(rng.gauss(math.log(1.3), 0.1)) for _ in range(6)]
    many = few + [math.exp(rng.gauss(math.log(1.3), 0.1)) for _ in range(60)]
    s_few, s_many = stats.summarize(few), stats.summarize(many)
    assert s_many.hi / s_many.lo < s_few.hi / s_few.lo


@pytest.mark.parametrize("lo, hi, expected", [
    (1.10, 1.40, stats.FASTER),
    (1.021, 1.03, stats.FASTER),
    (0.70, 0.90, stats.SLOWER),
    (0.97, 1.03, stats.NO_CHANGE),
    (0.95, 1.05, stats.NO_CHANGE),
    (0.90, 1.10, stats.INCONCLUSIVE),
    (1.00, 1.30, stats.INCONCLUSIVE),
    (0.96, 1.06, stats.INCONCLUSIVE),
])
def test_verdict_from_the_interval(lo, hi, expected):
    assert stats.verdict(lo, hi) == expected


def test_too_few_pairs_give_no_verdict():
    assert stats.verdict(1.5, 1.6, pairs=4) == stats.INCONCLUSIVE
    assert stats.summarize([2.0, 2.0, 2.1]).verdict == stats.INCONCLUSIVE
    assert stats.summarize([2.0, 2.0, 2.1, 2.05, 1.98]).verdict == stats.INCONCLUSIVE
    assert stats.summarize([2.0, 2.0, 2.1, 2.05, 1.98, 2.02]).verdict == stats.FASTER


def test_clear_synthetic_effects_get_the_right_verdict():
    rng = random.Random(7)
    noisy = lambda centre: [centre * math.exp(rng.gauss(0, 0.03)) for _ in range(12)]  # noqa: E731
    assert stats.summarize(noisy(1.5)).verdict == stats.FASTER
    assert stats.summarize(noisy(0.6)).verdict == stats.SLOWER
    assert stats.summarize(noisy(1.0)).verdict == stats.NO_CHANGE
    wild = [0.6, 1.7, 0.9, 1.4, 0.7, 1.2]
    assert stats.summarize(wild).verdict == stats.INCONCLUSIVE


def test_stop_rule_needs_the_interval_within_the_tolerance():
    tight = stats.summarize([1.30, 1.31, 1.29, 1.30, 1.32, 1.30])
    loose = stats.summarize([1.0, 1.6, 1.2, 0.9, 1.4, 1.1])
    assert stats.precise_enough(tight, 0.05)
    assert not stats.precise_enough(loose, 0.05)


def test_invalid_ratios_are_refused():
    with pytest.raises(ValueError):
        stats.median_ci([])
    with pytest.raises(ValueError):
        stats.median_ci([1.0, 0.0])
    with pytest.raises(ValueError):
        stats.median_ci([1.0, float("nan")])


def test_coefficient_of_variation():
    assert stats.cv([1.0]) is None
    assert stats.cv([2.0, 2.0, 2.0]) == 0.0
    assert stats.cv([1.0, 3.0]) == pytest.approx(math.sqrt(2) / 2)
