"""Output formats: each module of this package defines one ``Reporter``, found by its ``name``.

A reporter turns what a command produced into text. Its methods are the reports it can write:
``scan`` (`speedfix scan`, every format has it), ``statistics`` (`scan --statistics`),
``apply_summary`` (what `apply`, `scan --fix` and `scan --diff` fixed and left), ``rule_list``
(`speedfix rules`) and ``rule_page`` (`speedfix rule CODE`). A command refuses a format that
does not override its method. Adding a format is adding a module; the command line and the
``output-format`` setting find it here.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, ClassVar

from speedfix.engine.catalog import rule_name
from speedfix.engine.findings import Impact
from speedfix.engine.plugins import check_unique, one_per_module

if TYPE_CHECKING:
    from speedfix.commands.apply import ApplyOutcome
    from speedfix.engine.findings import Finding
    from speedfix.commands.scan import ScanResult
    from speedfix.engine.rule import Rule
    from speedfix.model.versions import TorchVersion

DEFAULT_FORMAT = "text"


@dataclass(frozen=True)
class ReportOptions:
    """What the command line asked for; each format uses what applies to it."""

    target: TorchVersion | None = None  # the torch version the advice is for
    color: bool = False  # ANSI styles: the text format on a terminal
    width: int = 100  # the terminal's width, for rich rendering only (finding lines never wrap)
    summary: bool = True  # the text format's totals after the finding lines
    show_fixes: bool = False  # each finding's fix under it, or what `--fix` fixed per file
    fixed: ApplyOutcome | None = None  # `scan --fix`: what was fixed before this scan
    dry_run: bool = False  # apply summary: nothing was written
    unsafe_fixes: bool = False  # apply summary: unsafe fixes were allowed


class Reporter:
    """One output format. Override the reports it supports; ``scan`` is required."""

    name: ClassVar[str]
    fix_details: ClassVar[bool] = False  # its scan report needs each fix's diff and edits

    def scan(self, result: ScanResult, options: ReportOptions) -> str:
        raise NotImplementedError

    def statistics(self, result: ScanResult, options: ReportOptions) -> str:
        raise NotImplementedError

    def apply_summary(self, outcome: ApplyOutcome, options: ReportOptions) -> str:
        raise NotImplementedError

    def rule_list(self, rules: tuple[type[Rule], ...], options: ReportOptions) -> str:
        raise NotImplementedError

    def rule_page(self, rule: type[Rule], options: ReportOptions) -> str:
        raise NotImplementedError

    @classmethod
    def supports(cls, report: str) -> bool:
        return getattr(cls, report) is not getattr(Reporter, report)


class UnknownFormat(ValueError):
    """A format name that no module defines, or one without the report asked for."""


@lru_cache(maxsize=1)
def reporters() -> dict[str, type[Reporter]]:
    """Every format by name, the default first (their modules are imported on first use)."""
    found = one_per_module(__name__, Reporter)
    check_unique(found, "name")
    return {cls.name: cls for cls in sorted(found, key=lambda cls: (cls.name != DEFAULT_FORMAT, cls.name))}


def format_names(report: str = "scan") -> tuple[str, ...]:
    """The formats that can write ``report``."""
    return tuple(name for name, cls in reporters().items() if cls.supports(report))


def get_reporter(name: str, report: str = "scan") -> Reporter:
    """The reporter for format ``name``; raises UnknownFormat naming the formats that fit."""
    cls = reporters().get(name)
    if cls is None or not cls.supports(report):
        raise UnknownFormat(f"must be one of {', '.join(format_names(report))}, not {name!r}")
    return cls()


@dataclass(frozen=True)
class StatisticsRow:
    code: str
    name: str
    count: int
    fixable: bool  # as in ruff: at least one of them has a fix


def statistics_rows(result: ScanResult) -> list[StatisticsRow]:
    """`--statistics`: findings per rule, most frequent first (then by code)."""
    counts = Counter(f.code for f in result.findings)
    fixable = {f.code for f in result.findings if f.fix is not None}
    return [StatisticsRow(code, rule_name(code) or "", count, code in fixable)
            for code, count in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]


def by_impact(findings: list[Finding]) -> list[Finding]:
    """The order of a report that leads: the highest impact first (a measured one before an
    estimated one of its level), then by position."""
    return sorted(findings, key=lambda f: f.impact_key)


def impact_counts(findings: list[Finding]) -> str:
    """`2 high impact, 5 medium, 3 low` (levels without findings left out)."""
    counts = Counter(f.impact for f in findings)
    parts = [f"{counts[level]} {level.value}" for level in Impact if counts[level]]
    if parts:
        parts[0] += " impact"
    return ", ".join(parts)
