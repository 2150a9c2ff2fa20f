"""``--output-format markdown``: the optimization report a person reads, and rule pages.

The report leads: after the totals, at most ``MAX_ACTIONS`` ranked actions for the whole scan
(what to change, where, the expected gain), then the details by impact (high, medium), each
rule's why and expected gain once with its findings under it (what is slow, wrong or
deprecated, what to change, the diff of the fix or why there is none). Low-impact findings come
last, one table row each, folded in a ``<details>`` block.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from speedfix import __version__
from speedfix.engine.findings import Applicability, Category, Finding, Impact
from speedfix.engine.registry import rule_by_code
from speedfix.output import Reporter, ReportOptions, by_impact, impact_counts
from speedfix.syntax.source import printable

if TYPE_CHECKING:
    from speedfix.commands.scan import ScanResult
    from speedfix.engine.rule import Rule

MAX_ACTIONS = 10
_PLACES_SHOWN = 3  # places named in an action's row before "and N more"

_URL = re.compile(r"https?://[^\s,)]+")

# Per category: the label of a finding's message, the label of its rule's effect.
_LABELS = {
    Category.PERFORMANCE: ("What is slow", "Expected gain"),
    Category.CORRECTNESS: ("What is wrong", "Effect of the fix"),
    Category.DEPRECATION: ("What is deprecated", "Effect of the fix"),
}


def _first_paragraph(text: str) -> str:
    return text.strip().split("\n\n", 1)[0].replace("\n", " ")


def _sources(rule: type[Rule]) -> list[str]:
    return [url.rstrip(".") for url in _URL.findall(rule.doc_sections().get("Measured effect", ""))]


def _fix_text(finding: Finding) -> str:
    if finding.fix is None:
        reason = finding.no_fix_reason or "no automatic fix for this rule"
        return f"No automatic fix: {reason}."
    how = "`speedfix apply`" if finding.fix.applicability is Applicability.SAFE else "`speedfix apply --unsafe-fixes`"
    return f"{finding.fix.title} ({finding.fix.applicability.value} fix: {how})."


def _rule(code: str) -> type[Rule]:
    rule = rule_by_code(code)
    assert rule is not None, f"a finding of an unknown rule: {code}"
    return rule


def _what_to_change(finding: Finding, rule: type[Rule]) -> str:
    """An action's first words: the fix's title, else the rule's, else what the finding says."""
    if finding.fix is not None and finding.fix.title:
        return finding.fix.title
    return rule.fix_title or printable(finding.message)


def _impact_note(finding: Finding) -> list[str]:
    if not finding.impact_reason:
        return []
    how = "measured" if finding.measured else "estimated"
    return [f"**Impact:** {finding.impact.value} ({how}: {finding.impact_reason}).", ""]


def _finding(number: int, finding: Finding, rule: type[Rule]) -> list[str]:
    what, _ = _LABELS[rule.category]
    out = [f"#### {number}. `{printable(finding.location)}`", ""]
    out += [f"**{what}:** {printable(finding.message).rstrip('.')}.", ""]
    out += _impact_note(finding)
    out += [f"**What to change:** {_fix_text(finding)}", ""]
    if finding.diff:
        out += ["```diff", finding.diff.rstrip("\n"), "```", ""]
    return out


def _rule_section(rule: type[Rule], findings: list[Finding]) -> list[str]:
    """A rule's why and effect once, then each of its findings."""
    _, effect = _LABELS[rule.category]
    count = f"{len(findings)} finding{'s' if len(findings) != 1 else ''}"
    out = [f"### {rule.code} {rule.name}: {count}", ""]
    out += [f"**Why:** {_first_paragraph(rule.doc_sections().get('Why is this bad?', ''))}", ""]
    sources = ", ".join(f"<{url}>" for url in _sources(rule))
    out += [f"**{effect}:** {rule.effect}" + (f" Sources: {sources}" if sources else ""), ""]
    for number, finding in enumerate(findings, 1):
        out += _finding(number, finding, rule)
    out += [f"Details: `speedfix rule {rule.code}`.", ""]
    return out


@dataclass
class Action:
    """One row of the ranked actions: a rule's findings of one impact level, across the scan."""

    rule: type[Rule]
    findings: list[Finding] = field(default_factory=list)

    @property
    def rank(self) -> int:
        return max(f.rank for f in self.findings)

    def row(self, number: int) -> str:
        first = self.findings[0]
        change = _what_to_change(first, self.rule)
        fixable = [f for f in self.findings if f.fix is not None]
        if fixable:
            safe = all(f.fix.applicability is Applicability.SAFE for f in fixable if f.fix)
            change += f" ({self.rule.code}; {'safe' if safe else 'unsafe'} fix)"
        else:
            change += f" ({self.rule.code}; by hand)"
        places = [f"`{printable(f.path)}:{f.cell_line if f.cell is not None else f.line}`" for f in self.findings[:_PLACES_SHOWN]]
        if len(self.findings) > _PLACES_SHOWN:
            places.append(f"and {len(self.findings) - _PLACES_SHOWN} more")
        impact = first.impact.value + (" (measured)" if any(f.measured for f in self.findings) else "")
        cells = [str(number), impact, change, ", ".join(places), self.rule.effect]
        return "| " + " | ".join(_table_cell(cell) for cell in cells) + " |"


def ranked_actions(findings: list[Finding]) -> list[Action]:
    """Findings grouped by rule and impact level, the highest ranked first (then correctness
    bugs, then the most findings, then the first in position)."""
    actions: dict[tuple[str, Impact], Action] = {}
    for finding in by_impact(findings):
        key = (finding.code, finding.impact)
        if key not in actions:
            actions[key] = Action(_rule(finding.code))
        actions[key].findings.append(finding)
    # a bug before a speed-up of its impact, then the action with the most findings
    return sorted(actions.values(), key=lambda a: (-a.rank, a.rule.category is not Category.CORRECTNESS,
                                                   -len(a.findings), a.findings[0].sort_key))


def _low_impact(findings: list[Finding]) -> list[str]:
    """The low-impact findings, one row each, folded."""
    per_rule: dict[str, int] = {}
    for finding in findings:
        per_rule[finding.code] = per_rule.get(finding.code, 0) + 1
    codes = ", ".join(f"{code} x{count}" for code, count in sorted(per_rule.items()))
    out = ["## Low impact", "", "<details>",
           f"<summary>{len(findings)} low-impact finding{'s' if len(findings) != 1 else ''} ({codes})</summary>", "",
           "| Where | Rule | Finding | What to change |", "|---|---|---|---|"]
    for finding in findings:
        rule = _rule(finding.code)
        message = printable(finding.message).rstrip(".") + (f" ({finding.impact_reason})" if finding.impact_reason else "")
        cells = [f"`{printable(finding.location)}`", f"{finding.code} {rule.name}", message, _fix_text(finding)]
        out.append("| " + " | ".join(_table_cell(cell) for cell in cells) + " |")
    return out + ["", "</details>", ""]


def rule_markdown(rule: type[Rule]) -> str:
    """A rule's page: what `speedfix rule CODE` shows."""
    versions = []
    if rule.min_torch:
        versions.append(f"torch >= {rule.min_torch}")
    if rule.max_torch:
        versions.append(f"torch < {rule.max_torch}")
    header = [
        f"# {rule.code} {rule.name}",
        "",
        f"{rule.summary}.",
        "",
        f"- Fix: {rule.fix_availability()}" + (f" ({rule.fix_title})" if rule.fix_title else ""),
        f"- Severity: {rule.severity.value}",
        f"- Impact: {rule.impact.value} (see Impact below for what moves it)",
        f"- Applies to: {', '.join(versions) if versions else 'every torch version'}"
        + ("; CUDA scripts only" if rule.gpu_only else ""),
        "",
    ]
    return "\n".join(header) + rule.docs() + "\n"


class MarkdownReporter(Reporter):
    name = "markdown"
    fix_details = True

    def scan(self, result: ScanResult, options: ReportOptions) -> str:
        findings = by_impact(result.findings)
        files = len({f.path for f in findings})
        fixable = sum(1 for f in findings if f.fix)
        target = f" (target torch {options.target})" if options.target is not None else ""
        out: list[str] = ["# speedfix optimization report", ""]
        summary = (
            f"speedfix {__version__} scanned {result.files} file{'s' if result.files != 1 else ''}{target}: "
            f"**{len(findings)} finding{'s' if len(findings) != 1 else ''}** "
            f"in {files} file{'s' if files != 1 else ''}"
        )
        if findings:
            summary += f" ({impact_counts(findings)}), {fixable} with an automatic fix"
        out += [summary + ".", ""]
        if result.errors:
            out += ["## Files that could not be analysed", ""]
            out += [f"- `{printable(error.render())}`" for error in result.errors]
            out.append("")
        if not findings:
            out.append("Nothing to report: no missed optimization was found.")
            return "\n".join(out) + "\n"
        actions = ranked_actions(findings)
        shown = actions[:MAX_ACTIONS]
        out += ["## Top actions", ""]
        if len(actions) > MAX_ACTIONS:
            out += [f"The {MAX_ACTIONS} of {len(actions)} actions that matter most; the details below list every finding.", ""]
        out += ["| # | Impact | What to change | Where | Expected gain |", "|---:|---|---|---|---|"]
        out += [action.row(number) for number, action in enumerate(shown, 1)]
        out.append("")
        for level, heading in ((Impact.HIGH, "## High impact"), (Impact.MEDIUM, "## Medium impact")):
            at_level = [f for f in findings if f.impact is level]
            if not at_level:
                continue
            out += [heading, ""]
            per_rule: dict[str, list[Finding]] = {}
            for finding in at_level:
                per_rule.setdefault(finding.code, []).append(finding)
            for code, items in per_rule.items():
                out += _rule_section(_rule(code), items)
        low = [f for f in findings if f.impact is Impact.LOW]
        if low:
            out += _low_impact(low)
        return "\n".join(out) + "\n"

    def rule_list(self, rules: tuple[type[Rule], ...], options: ReportOptions) -> str:
        rows = [f"| {r.code} | `{r.name}` | {r.fix_availability()} | {_table_cell(r.summary)} |" for r in rules]
        return "\n".join(["| Code | Name | Fix | Finds |", "|---|---|---|---|", *rows]) + "\n"

    def rule_page(self, rule: type[Rule], options: ReportOptions) -> str:
        return rule_markdown(rule)


def _table_cell(text: str) -> str:
    return text.replace("|", "\\|")
