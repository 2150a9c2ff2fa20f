"""What a benchmark measurement of a script says about its findings' impact.

A rule estimates a finding's impact from the code (``Rule.impact``, moved by the rule's own
decision). When ``speedfix bench`` has measured the script, the measurement decides for the
findings it bears on: a rule names the measurement that judges it (``Rule.measure``), and
``judge`` sets the impact of its findings from the figures. The benchmark itself is read by the
commands (``speedfix.commands.measurements``); this module sees only the figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Iterable

from speedfix.engine.findings import Finding, Impact


class Measure(str, Enum):
    """A measurement of the benchmark that can decide a finding's impact."""

    DATA_WAIT = "data_wait"  # the share of step time spent waiting for the next batch
    HOST_SYNC = "host_sync"  # a host sync per step: its cost depends on how short the steps are


# Data wait: a loader that holds the GPU up for a fifth of every step is the first thing to fix;
# under 5% measured on the GPU, it keeps up (on a CPU the compute is slower, so the GPU would
# wait longer: a small CPU figure moves nothing).
DATA_WAIT_HIGH = 0.20
DATA_WAIT_MEDIUM = 0.08
DATA_WAIT_LOW = 0.05
# A host sync stalls the CPU's queue for about a step's launch time: it matters when steps are
# short, and is noise in a step of half a second.
SHORT_STEP_S = 0.05
LONG_STEP_S = 0.5


@dataclass(frozen=True)
class Estimate:
    """A rule's judgement of one finding's impact, from what the script is."""

    impact: Impact
    reason: str  # said in the report: "an evaluation loader", "a small model (about 1.2M parameters)"
    measurable: bool = True  # False: a benchmark of the script does not measure this (an evaluation loader)


@dataclass(frozen=True)
class Measurements:
    """The figures of one `speedfix bench` run of a script."""

    source: str  # the JSON file they come from, as the report names it
    device: str | None = None  # "cuda", "cpu", ...
    data_wait: float | None = None  # share of step time, 0-1
    step_time_s: float | None = None  # median step time

    @property
    def on_gpu(self) -> bool:
        return self.device == "cuda"


def _data_wait(m: Measurements) -> tuple[Impact, str] | None:
    share = m.data_wait
    if share is None:
        return None
    said = f"`speedfix bench` measured {share:.0%} of the step time waiting for data ({m.source})"
    if share >= DATA_WAIT_HIGH:
        return Impact.HIGH, said
    if share >= DATA_WAIT_MEDIUM:
        return Impact.MEDIUM, said
    if share < DATA_WAIT_LOW and m.on_gpu:
        return Impact.LOW, said
    return None


def _host_sync(m: Measurements) -> tuple[Impact, str] | None:
    step = m.step_time_s
    if step is None or not m.on_gpu:
        return None  # on a CPU a sync costs nothing: the figure says nothing about the GPU
    said = f"`speedfix bench` measured a median step of {step * 1000:.0f} ms on the GPU ({m.source})"
    if step <= SHORT_STEP_S:
        return Impact.HIGH, said
    if step >= LONG_STEP_S:
        return Impact.LOW, said
    return None


_JUDGES = {Measure.DATA_WAIT: _data_wait, Measure.HOST_SYNC: _host_sync}


def verdict(measure: Measure | str, measurements: Measurements) -> tuple[Impact, str] | None:
    """(impact, the figure said in words) that ``measurements`` give a finding judged by
    ``measure``; None when they do not decide it."""
    return _JUDGES[Measure(measure)](measurements)


def judge(findings: Iterable[Finding], measurements: Measurements) -> None:
    """Set the impact of each finding that ``measurements`` bear on (in place)."""
    for finding in findings:
        if finding.measure is None:
            continue
        decided = verdict(finding.measure, measurements)
        if decided is not None:
            finding.impact, finding.impact_reason = decided
            finding.measured = True
