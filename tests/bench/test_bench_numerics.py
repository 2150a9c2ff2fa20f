"""The loss check on synthetic trajectories: A/A, seed band, NaN, rule classes."""

from __future__ import annotations

import math
import random

import pytest

from speedfix.bench import numerics


def trajectory(seed: int, n: int = 200, level: float = 1.0, noise: float = 0.02) -> list[float]:
    rng = random.Random(seed)
    return [level * (0.5 + 2.0 * math.exp(-i / 50)) * (1 + rng.gauss(0, noise)) for i in range(n)]


A = trajectory(0)
OTHER_SEEDS = [trajectory(1, level=1.03), trajectory(2, level=0.98)]


def band():
    return numerics.seed_band(A, OTHER_SEEDS)


def test_identical_trajectory_passes_without_a_seed_band():
    calls = []
    result = numerics.check([A, list(A)], list(A), kind=numerics.EXACT, band=lambda: calls.append(1))
    assert result.passed and result.level == "identical"
    assert calls == []  # the extra seed runs are not paid for


def test_losses_are_compared_over_the_steps_both_variants_ran():
    # each variant runs its own window: a faster candidate records more losses than the original
    longer = A + trajectory(5, n=300)
    result = numerics.check([A, list(A)], longer, kind=numerics.EXACT)
    assert result.passed and result.level == "identical" and result.ab.compared == len(A)
    shorter_changed = [v * (1 + 1e-3) for v in A[:50]]
    result = numerics.check([A, list(A)], shorter_changed, kind=numerics.EXACT)
    assert not result.passed and "over the first 50 backward() calls" in result.reason


def test_exact_rewrite_that_changes_the_loss_fails():
    changed = [v * (1 + 1e-4) for v in A]
    result = numerics.check([A, list(A)], changed, kind=numerics.EXACT, band=band)
    assert not result.passed
    assert result.level == "changed"
    assert "should not change" in result.reason


def test_within_a_a_tolerance_when_a_a_is_not_bitwise():
    a1 = [v * (1 + 1e-6 * ((i % 3) - 1)) for i, v in enumerate(A)]
    b = [v * (1 + 2e-6 * ((i % 2) - 0.5)) for i, v in enumerate(A)]
    result = numerics.check([A, a1], b, kind=numerics.EXACT)
    assert result.passed and result.level == "within A/A"
    far = [v * 1.001 for v in A]
    assert not numerics.check([A, a1], far, kind=numerics.EXACT).passed


def test_numerics_rewrite_inside_the_seed_band_passes():
    b = [v * (1 + 0.004 * math.sin(i)) for i, v in enumerate(A)]  # bf16-like jitter
    result = numerics.check([A, list(A)], b, kind=numerics.NUMERICS, band=band)
    assert result.passed, result.reason
    assert result.level == "within seed band"
    assert result.seed_band.runs == 2


def test_numerics_rewrite_outside_the_seed_band_fails():
    b = [v * 1.5 for v in A]
    result = numerics.check([A, list(A)], b, kind=numerics.NUMERICS, band=band)
    assert not result.passed and result.level == "outside seed band"


def test_first_loss_must_match_for_numerics_but_not_for_rng_rewrites():
    b = list(A)
    b[0] = A[0] * 1.05  # different initial loss, same later trajectory
    assert not numerics.check([A, list(A)], b, kind=numerics.NUMERICS, band=band).passed
    assert numerics.check([A, list(A)], b, kind=numerics.RNG, band=band).passed


def test_new_nan_fails_even_inside_the_band():
    b = list(A)
    b[150] = None  # the harness stores NaN/inf as null
    result = numerics.check([A, list(A)], b, kind=numerics.RNG, band=band)
    assert not result.passed and result.level == "new non-finite"


def test_nan_that_the_original_also_has_is_not_new():
    a = list(A)
    a[10] = None
    result = numerics.check([a, list(a)], list(a), kind=numerics.EXACT)
    assert result.passed


def test_seed_band_has_a_floor():
    info = numerics.seed_band(A, [list(A), list(A)])  # a script that ignores the seed
    assert info.ema_threshold == numerics.SEED_BAND_FLOOR
    assert info.tail_threshold == numerics.SEED_BAND_FLOOR


def test_no_recorded_loss_is_reported_as_unchecked():
    result = numerics.check([[]], [], kind=numerics.EXACT)
    assert result.level == "unchecked"


def test_compare_losses_reports_the_first_divergence():
    b = list(A)
    b[42] = A[42] * 1.01
    info = numerics.compare_losses(A, b)
    assert info.first_divergent_index == 42
    assert not info.bitwise
    assert info.max_rel_diff == pytest.approx(0.01 / 1.01, rel=1e-6)


@pytest.mark.parametrize("codes, expected", [
    (["SF402"], numerics.EXACT),
    (["SF402", "SF202"], numerics.NUMERICS),
    (["SF202", "SF703"], numerics.RNG),
    ([], numerics.EXACT),
])
def test_class_of_combined_fixes_is_the_loosest(codes, expected):
    assert numerics.class_of(codes) == expected


def test_class_of_an_unknown_code_is_an_error_not_the_loosest_check():
    with pytest.raises(ValueError):
        numerics.class_of(["SF999"])
