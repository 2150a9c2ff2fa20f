"""Which fixes ``apply --verify`` keeps: sets of fixes measured against the original script.

Two strategies, both measured by one :class:`compare.Session` (the original's calibration and seed
band are paid once):

* **The combination first** (default). All the applicable fixes together are one comparison. When
  it passes (``decide``: not slower, loss check passed, enough pairs), every fix in it is kept.
  Only when it fails does a bisection look for the fixes that fail it: the fixes are split in two
  halves and each half is added to the set that passes so far, as one comparison; a half that
  fails is split again, down to the single fix, which is then rejected. What remains is the
  largest passing set the search found; it is always a set that was measured as a whole. For k
  fixes and one culprit that is about 2·log2(k) comparisons, at most 2k - 2.
* **Every fix alone** (``--per-fix``): each fix against the original, all in one set of
  counterbalanced rounds, then the kept ones together; while that combination fails, the kept
  fix with the smallest median is dropped (``MAX_COMBINATION_RETRIES`` times, then only the best
  single fix is kept).

Each comparison has its own interval: with n pairs it calls a byte-identical copy "faster" or
"slower" at most 2/2**n of the time (3.1% at 6 pairs, each side half of that). A verify that
makes m comparisons can make such an error in any of them: at most m times that rate (union
bound). Fixes whose effect only exists on CUDA (``Rule.gpu_only``) are not measured on a machine
without a CUDA GPU in the combination-first mode, and never called verified there in either mode.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from . import numerics, stats
from .compare import Session
from .results import CandidateResult, Comparison, Decision, FixDecision
from .runner import RunSpec
from .stats import INCONCLUSIVE, SLOWER, SLOWER_BELOW
from .timeplan import about

MAX_COMBINATION_RETRIES = 2
KEPT, REJECTED, UNMEASURED, NEEDS_GPU = Decision.KEPT, Decision.REJECTED, Decision.UNMEASURED, Decision.NEEDS_GPU


def decide(cand: CandidateResult) -> tuple[Decision, str]:
    """KEPT, REJECTED or UNMEASURED for one measured variant, with the reason a reviewer reads."""
    if cand.status != "ok":
        return REJECTED, f"the patched script failed ({cand.status}): {cand.failure.message if cand.failure else None}"
    check = cand.numerics
    if check and not check.passed:
        return REJECTED, f"loss check failed: {check.reason}"
    speed = cand.speedup
    needed = stats.MIN_VERDICT_PAIRS
    if not speed:
        return UNMEASURED, (f"not measured enough: no speed measurement ({needed} pairs needed); not applied, "
                            "the static advice stands")
    pairs = speed.pairs
    figure = f"{speed.median:.2f}x [{speed.lo:.2f}, {speed.hi:.2f}]"
    if pairs < needed:
        return UNMEASURED, (f"not measured enough: {pairs} pair{'s' if pairs != 1 else ''} of the {needed} a "
                            f"decision needs (the time budget or --max-pairs ran out), {figure} so far; not "
                            "applied, the static advice stands (raise --budget-s/--max-pairs to measure it)")
    undecided = f"no verdict from {pairs} pairs"
    if speed.verdict == SLOWER:
        return REJECTED, f"measurably slower: {figure}"
    if speed.verdict == INCONCLUSIVE and speed.median < SLOWER_BELOW:
        return REJECTED, f"probably slower: median below {SLOWER_BELOW:.2f}x, {figure} ({undecided})"
    if speed.verdict == INCONCLUSIVE:
        return KEPT, f"not slower as far as measured: {figure} ({undecided}); loss check passed"
    return KEPT, f"{speed.verdict} ({figure}); loss check passed"


def gpu_only(code: str) -> bool:
    """The fix's rule fires only on scripts that target CUDA: its effect exists only there."""
    from speedfix.engine.registry import rule_by_code

    rule = rule_by_code(code)
    return bool(rule and rule.gpu_only)


def gpu_only_reason(device: str, measured: str | None) -> str:
    figures = f"the {device} figures: {measured}" if measured else f"not measured on {device}"
    return (f"measured on {device}, where this fix's effect cannot show: it targets CUDA, and so do its ways to "
            f"fail (pin_memory=True raises on CUDA tensors, yet passes bit-identically on a CPU); "
            f"{figures}. Not applied: run --verify on a machine with a CUDA GPU")


@dataclass
class FixSets:
    """Measures sets of fixes against ``session``'s original and records a decision per fix.

    ``write(tag, codes)`` writes the script with those fixes as a variant and returns its path;
    ``applied`` holds, per fix, what it changed (rule code -> count).
    """

    session: Session
    original: RunSpec
    write: Callable[[str, list[str]], Any]
    applied: dict[str, dict[str, int]]
    fixes: list[FixDecision] = field(default_factory=list)  # one per fix, in the fixes' order
    combos: list[FixDecision] = field(default_factory=list)  # every set measured, in order
    first: Comparison | None = None  # the first comparison (its window, load and settings go in the report)
    _measured: dict[frozenset, FixDecision] = field(default_factory=dict)

    # ------------------------------------------------------------ shared
    @property
    def device(self) -> str:
        device = self.session.device
        return (device.type if device else None) or "?"

    def _spec(self, label: str, codes: list[str]) -> RunSpec:
        return RunSpec(self.write(f"set{len(self._measured) + 1}", codes), list(self.original.args),
                       self.original.cwd, label=label, real_cwd=self.original.real_cwd)

    def measure(self, codes: list[str]) -> FixDecision:
        """One comparison of the original against the script with ``codes`` fixed (once per set)."""
        key = frozenset(codes)
        if key in self._measured:
            return self._measured[key]
        label = "+".join(codes)
        outcome = self.session.compare([self._spec(label, codes)], kinds={label: numerics.class_of(codes)})
        self.first = self.first or outcome
        decision, reason = decide(outcome.candidates[0])
        applied = {code: n for c in codes for code, n in self.applied.get(c, {}).items()}
        record = FixDecision.of(outcome.candidates[0], decision, reason, applied, codes=list(codes))
        self._measured[key] = record
        self.combos.append(record)
        return record

    def _per_fix_record(self, code: str, measured: FixDecision, decision: Decision, reason: str) -> FixDecision:
        return replace(measured, label=code, kept=decision is KEPT, decision=decision, reason=reason,
                       measured=decision is not UNMEASURED, applied=dict(self.applied.get(code, {})), codes=None,
                       measured_as=None if measured.label == code else measured.label)

    def _cost_of_comparisons(self, count: int, kind: str) -> float | None:
        """What ``count`` one-candidate comparisons will take (a calibration run and the pairs each,
        and the seed band once if the loss may differ and it was not measured yet)."""
        _, pairs = self.session.rounds()
        band = self.session.settings.seed_band_runs if kind != numerics.EXACT and not self.session.band_measured else 0
        return self.session.time.seconds([self.original.name] * (count * (1 + 2 * pairs) + band))

    # ------------------------------------------------------------ the combination first
    def combination_first(self, codes: list[str]) -> list[str]:
        """The kept fixes: all of them when their combination passes, else the largest passing set
        a bisection finds. GPU-only fixes wait for a CUDA machine."""
        self.session.prepare()  # the original's calibration: its device and the cost of a run
        decisions: dict[str, FixDecision] = {}
        known = self.session.device is not None  # not before a run (a fixed window without a discarded run)
        measurable = [c for c in codes if not known or self.device == "cuda" or not gpu_only(c)]
        for code in codes:
            if code not in measurable:
                decisions[code] = FixDecision(code, kept=False, decision=NEEDS_GPU,
                                              reason=gpu_only_reason(self.device, None),
                                              applied=dict(self.applied.get(code, {})))
        kept: list[str] = []
        if measurable:
            kind = numerics.class_of(measurable)
            most = 2 * len(measurable) - 2
            self.session.progress.note(
                f"verify: {len(measurable)} fix(es) together first{about(self._cost_of_comparisons(1, kind))}"
                + (f"; if that fails, a search for the fixes that fail it: up to {most} more comparisons"
                   f"{about(self._cost_of_comparisons(most, kind))} at most" if most else ""))
            kept = self._extend([], measurable, decisions)
        for code in kept:
            if self.device != "cuda" and gpu_only(code):  # measured after all: never verified off CUDA
                decisions[code] = replace(decisions[code], kept=False, decision=NEEDS_GPU,
                                          reason=gpu_only_reason(self.device, decisions[code].reason))
        self.fixes += [decisions[code] for code in codes]
        return [code for code in kept if decisions[code].kept]

    def _extend(self, base: list[str], group: list[str], decisions: dict[str, FixDecision]) -> list[str]:
        """``base`` (a set that passes, or nothing) plus the largest part of ``group`` found to pass with it."""
        measured = self.measure(base + group)
        if measured.decision is KEPT:
            with_ = f" with {measured.label}" if len(base + group) > 1 else ""
            for code in base + group:
                decisions[code] = self._per_fix_record(code, measured, KEPT, f"kept{with_}: {measured.reason}")
            return base + group
        if measured.decision is UNMEASURED:  # a smaller set would run out the same way
            for code in group:
                decisions[code] = self._per_fix_record(code, measured, UNMEASURED, measured.reason)
            return base
        if len(group) == 1:
            where = f"added to {'+'.join(base)}" if base else "alone"
            decisions[group[0]] = self._per_fix_record(group[0], measured, REJECTED,
                                                       f"rejected {where}: {measured.reason}")
            return base
        half = len(group) // 2
        passing = self._extend(base, group[:half], decisions)
        self.session.progress.note(f"verify: passing so far: {'+'.join(passing) or 'none'}; next: "
                                   f"{'+'.join(group[half:])} added to it")
        return self._extend(passing, group[half:], decisions)

    # ------------------------------------------------------------ every fix alone (--per-fix)
    def per_fix(self, specs: list[RunSpec]) -> list[str]:
        """Each fix alone, then the kept ones together (``MAX_COMBINATION_RETRIES``)."""
        self.session.prepare(specs)
        singles = self.session.compare(specs, kinds={s.name: numerics.class_of([s.name]) for s in specs})
        self.first = singles
        for cand in singles.candidates:
            decision, reason = decide(cand)
            if self.device != "cuda" and decision is KEPT and gpu_only(cand.label):
                decision, reason = NEEDS_GPU, gpu_only_reason(self.device, reason)
            self.fixes.append(FixDecision.of(cand, decision, reason, self.applied.get(cand.label, {})))
        kept = [f.label for f in self.fixes if f.kept]
        return self._combine(kept) if len(kept) > 1 else kept

    def _combine(self, kept: list[str]) -> list[str]:
        """Measure the kept fixes together; drop the weakest while the combination fails.

        A combination that was not measured enough (budget or --max-pairs) proves nothing either way,
        and a smaller one would run out the same way: only the best single fix is kept.
        """
        speed = {f.label: f.speedup.median if f.speedup else 0.0 for f in self.fixes}
        final: list[str] = []
        decision = KEPT
        for attempt in range(MAX_COMBINATION_RETRIES + 1):
            decision = self.measure(kept).decision
            if decision is KEPT:
                final = kept
                break
            if decision is UNMEASURED or len(kept) == 2 or attempt == MAX_COMBINATION_RETRIES:
                final = [max(kept, key=speed.__getitem__)]
                break
            weakest = min(kept, key=speed.__getitem__)
            kept = [c for c in kept if c != weakest]
        last = self.combos[-1]
        for i, f in enumerate(self.fixes):
            if f.kept and f.label not in final:  # only when a combination failed or was not measured enough
                if decision is UNMEASURED:
                    reason = (f"kept alone, but the combination {last.label} was {last.reason}; "
                              f"only {'+'.join(final)}, the best alone, written")
                    self.fixes[i] = replace(f, kept=False, decision=UNMEASURED, reason=reason)
                else:
                    failed = next(c for c in reversed(self.combos) if not c.kept)
                    reason = (f"passed alone, but the combination with it failed ({failed.reason}); "
                              f"kept {'+'.join(final)}")
                    self.fixes[i] = replace(f, kept=False, decision=REJECTED, reason=reason)
        return final
