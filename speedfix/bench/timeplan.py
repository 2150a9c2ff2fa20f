"""How long the runs still planned will take: each variant's measured cost per run, and the plan.

A run's cost is what it took from start to end, start-up and clean-up included, as measured by the
parent. A variant that has not run yet costs what the reference variant (the original) took: the
window is sized by the slowest variant, usually the original, so that is an upper bound as a rule.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable


class TimePlan:
    def __init__(self, reference: str) -> None:
        self.reference = reference
        self.pending: list[str] = []  # variant names, one per planned run
        self.costs: dict[str, list[float]] = {}

    def add(self, names: Iterable[str]) -> None:
        self.pending.extend(names)

    def drop(self, names: Iterable[str]) -> None:
        """Planned runs that will not happen after all."""
        for name in names:
            if name in self.pending:
                self.pending.remove(name)

    def ran(self, name: str, seconds: float | None) -> None:
        """One run of ``name`` ended; ``seconds``: its cost (None: not typical, e.g. a short discarded run)."""
        self.drop([name])
        if seconds is not None:
            self.costs.setdefault(name, []).append(seconds)

    def cost(self, name: str) -> float | None:
        known = self.costs.get(name) or self.costs.get(self.reference)
        return sum(known) / len(known) if known else None

    def seconds(self, names: Iterable[str]) -> float | None:
        """What these runs will take (None: nothing has been measured yet)."""
        total = 0.0
        for name, count in Counter(names).items():
            cost = self.cost(name)
            if cost is None:
                return None
            total += cost * count
        return total

    def left(self) -> float | None:
        return self.seconds(self.pending)


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, sec = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {sec:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def about(seconds: float | None) -> str:
    """", about 2 min 10 s" for a sentence; nothing before any run was measured."""
    return f", about {fmt_duration(seconds)}" if seconds is not None else ""
