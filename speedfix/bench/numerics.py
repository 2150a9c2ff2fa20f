"""Numerics smoke test: does the patched script's loss stay where the original's would be?

Yardsticks, both measured on the original script:

* A/A: two runs with the same seed. On CPU they are bitwise identical, so an *exact* rewrite
  (set_to_none, pin_memory, removing a sync) must be bitwise identical too; where A/A is not
  bitwise (CUDA atomics), the tolerance is 3x the A/A deviation.
* the seed band: the original with other seeds (the script's own seed calls are shifted too).
  A *numerics* rewrite (bf16, TF32, compile, fused kernels) or an *rng* rewrite (changes the
  order of random draws) must keep its smoothed and tail loss inside that band, floored at 2%.

New NaN/inf always fails. A window of a few hundred steps is a smoke test for broken numerics,
not proof of equal convergence; reports say so (``CAVEAT``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from .results import LossCheck, LossDiff, SeedBand

CAVEAT = ("The loss check covers only the measured window (a few hundred steps at most): it is a "
          "smoke test for broken numerics, not proof of equal convergence.")

AA_K = 3.0  # exact rewrites: within 3x the A/A deviation when A/A is not bitwise
SEED_BAND_MULT = 1.5  # two or three other seeds underestimate the spread
SEED_BAND_FLOOR = 0.02  # very stable runs are not over-tightened
STEP0_TOL = 1e-2  # forward-only first loss, numerics rewrites
DIVERGE_REL = 1e-3  # "first divergent step"
EMA_ALPHA = 0.1
TAIL_SHARE = 0.2

EXACT, NUMERICS, RNG, AUTO = "exact", "numerics", "rng", "auto"

_LOOSENESS = {EXACT: 0, NUMERICS: 1, RNG: 2, AUTO: 2}


def rule_class(code: str) -> str:
    """The loss check a rule's fix declares (``Rule.loss_check``). An unknown code or a fix with
    no declared check is an error, never a silently loose check."""
    from speedfix.engine.registry import rule_by_code  # the rule catalog: only loaded when judging fixes

    rule = rule_by_code(code)
    if rule is None:
        raise ValueError(f"unknown rule code {code!r}")
    if rule.loss_check is None:
        raise ValueError(f"{rule.code} declares no loss check (Rule.loss_check)")
    return rule.loss_check.value


def class_of(codes: Sequence[str]) -> str:
    """The loosest class among several fixes applied together (rng > numerics > exact)."""
    classes = [rule_class(code) for code in codes] or [EXACT]
    return max(classes, key=_LOOSENESS.__getitem__)


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-8)


def _finite(values: Sequence[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def ema(values: Sequence[float | None], alpha: float = EMA_ALPHA) -> float | None:
    acc = None
    for v in _finite(values):
        acc = v if acc is None else (1 - alpha) * acc + alpha * v
    return acc


def tail_mean(values: Sequence[float | None], share: float = TAIL_SHARE) -> float | None:
    finite = _finite(values)
    if not finite:
        return None
    k = max(1, int(len(finite) * share))
    return sum(finite[-k:]) / k


def nonfinite(values: Sequence[float | None]) -> int:
    return sum(v is None or not math.isfinite(v) for v in values)


def compare_losses(a: Sequence[float | None], b: Sequence[float | None]) -> LossDiff:
    """How far trajectory b is from trajectory a, position by position over the steps both ran
    (the original's runs from an earlier comparison of a verify may have run a longer window)."""
    n = min(len(a), len(b))
    diffs = [(i, _rel(x, y)) for i, (x, y) in enumerate(zip(a[:n], b[:n]))
             if x is not None and y is not None]
    first_div = next((i for i, d in diffs if d > DIVERGE_REL), None)
    ema_a, ema_b = ema(a[:n]), ema(b[:n])
    tail_a, tail_b = tail_mean(a[:n]), tail_mean(b[:n])
    return LossDiff(
        compared=n, length_a=len(a), length_b=len(b),
        bitwise=n > 0 and list(a[:n]) == list(b[:n]),
        max_rel_diff=max((d for _, d in diffs), default=None),
        step0_rel_diff=_rel(a[0], b[0]) if n and a[0] is not None and b[0] is not None else None,
        first_divergent_index=first_div,
        ema_final_rel_diff=_rel(ema_a, ema_b) if ema_a is not None and ema_b is not None else None,
        tail_mean_rel_diff=_rel(tail_a, tail_b) if tail_a is not None and tail_b is not None else None,
    )


def seed_band(reference: Sequence[float | None], others: Sequence[Sequence[float | None]]) -> SeedBand:
    """The spread of the original across seeds, as thresholds for the smoothed and tail loss."""
    comparisons = [compare_losses(reference, other) for other in others]
    ema_spread = max((c.ema_final_rel_diff or 0.0 for c in comparisons), default=0.0)
    tail_spread = max((c.tail_mean_rel_diff or 0.0 for c in comparisons), default=0.0)
    return SeedBand(runs=len(comparisons), ema_spread=ema_spread, tail_spread=tail_spread,
                    ema_threshold=max(SEED_BAND_FLOOR, SEED_BAND_MULT * ema_spread),
                    tail_threshold=max(SEED_BAND_FLOOR, SEED_BAND_MULT * tail_spread))


def check(a_runs: Sequence[Sequence[float | None]], b: Sequence[float | None], *, kind: str = AUTO,
          band: Callable[[], SeedBand | None] | None = None) -> LossCheck:
    """Judge trajectory b against the original's runs (same seed). ``band`` is called lazily:
    the extra seed runs cost time and are needed only when b is not within the A/A tolerance."""
    if not a_runs or not a_runs[0] or not b:
        return LossCheck(kind, level="unchecked", passed=True,
                         reason="no scalar loss was passed to backward(), so the loss could not be compared")
    a0 = a_runs[0]
    ab = compare_losses(a0, b)
    aa = compare_losses(a0, a_runs[1]) if len(a_runs) > 1 else None
    nonfinite_a, nonfinite_b = max(nonfinite(r) for r in a_runs), nonfinite(b)

    def judged(level: str, passed: bool, reason: str, info: SeedBand | None = None) -> LossCheck:
        return LossCheck(kind, ab, aa, info, nonfinite_a, nonfinite_b, level, passed, reason)

    if nonfinite_b > nonfinite_a:
        return judged("new non-finite", False, f"{nonfinite_b} NaN/inf losses, the original had {nonfinite_a}")
    if ab.bitwise:
        return judged("identical", True, "bitwise identical loss trajectory")
    if aa is not None and not aa.bitwise and aa.max_rel_diff is not None and ab.max_rel_diff is not None \
            and ab.max_rel_diff <= AA_K * aa.max_rel_diff:
        return judged("within A/A", True, f"max deviation {ab.max_rel_diff:.2g} is within {AA_K:g}x the original's "
                                          f"run-to-run deviation ({aa.max_rel_diff:.2g})")
    where = _divergence(ab)
    if kind == EXACT:
        return judged("changed", False, f"this fix should not change the numerics, but the loss changed ({where}); "
                                        "a hidden RNG or behaviour change")
    info = band() if band is not None else None
    if info is None or not info.runs:
        return judged("changed", False, f"the loss changed ({where}) and no seed band was measured to judge it",
                      info)
    ema_d, tail_d = ab.ema_final_rel_diff or 0.0, ab.tail_mean_rel_diff or 0.0
    if kind == NUMERICS and ab.step0_rel_diff is not None and ab.step0_rel_diff > STEP0_TOL:
        return judged("outside seed band", False,
                      f"the first loss differs by {ab.step0_rel_diff:.1%} (tolerance {STEP0_TOL:.0%})", info)
    if ema_d <= info.ema_threshold and tail_d <= info.tail_threshold:
        return judged("within seed band", True,
                      f"smoothed loss {ema_d:.2%} and tail loss {tail_d:.2%} from the original, inside "
                      f"its seed-to-seed band ({info.ema_threshold:.2%}, {info.tail_threshold:.2%})", info)
    return judged("outside seed band", False,
                  f"smoothed loss {ema_d:.2%} / tail loss {tail_d:.2%} from the original, outside its "
                  f"seed-to-seed band ({info.ema_threshold:.2%} / {info.tail_threshold:.2%})", info)


def _divergence(ab: LossDiff) -> str:
    index = ab.first_divergent_index
    where = f"first differs by >{DIVERGE_REL:g} at backward() #{index}" if index is not None else "tiny differences"
    return f"{where}, max relative deviation {ab.max_rel_diff:.2g} over the first {ab.compared} backward() calls"
