"""``--output-format markdown``: the optimization report a person reads, and rule pages.

The report gives totals by rule, then the findings grouped by what they are (what is slow, what
is wrong, what is deprecated), each with why, what to change (the fix and its diff, or why there
is none) and the effect of the change with its source.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from typing import TYPE_CHECKING

from speedfix import __version__
from speedfix.engine.findings import Applicability, Category, Finding
from speedfix.engine.registry import rule_by_code
from speedfix.output import Reporter, ReportOptions
from speedfix.syntax.source import printable

if TYPE_CHECKING:
    from speedfix.commands.scan import ScanResult
    from speedfix.engine.rule import Rule

_URL = re.compile(r"https?://[^\s,)]+")

# Per category: the section heading, the label of a finding's message, the label of its effect.
_SECTIONS = {
    Category.PERFORMANCE: ("What is slow", "What is slow", "Expected gain"),
    Category.CORRECTNESS: ("What is wrong", "What is wrong", "Effect of the fix"),
    Category.DEPRECATION: ("What is deprecated", "What is deprecated", "Effect of the fix"),
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


def _finding(number: int, finding: Finding, rule: type[Rule]) -> list[str]:
    _, what, effect = _SECTIONS[rule.category]
    out = [f"#### {number}. {finding.code} {finding.name} at `{printable(finding.location)}`", ""]
    out += [f"**{what}:** {printable(finding.message).rstrip('.')}.", ""]
    out += [f"**Why:** {_first_paragraph(rule.doc_sections().get('Why is this bad?', ''))}", ""]
    out += [f"**What to change:** {_fix_text(finding)}", ""]
    if finding.diff:
        out += ["```diff", finding.diff.rstrip("\n"), "```", ""]
    sources = ", ".join(f"<{url}>" for url in _sources(rule))
    out += [f"**{effect}:** {rule.effect}" + (f" Sources: {sources}" if sources else ""), ""]
    out += [f"Details: `speedfix rule {finding.code}`.", ""]
    return out


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
        f"- Applies to: {', '.join(versions) if versions else 'every torch version'}"
        + ("; CUDA scripts only" if rule.gpu_only else ""),
        "",
    ]
    return "\n".join(header) + rule.docs() + "\n"


class MarkdownReporter(Reporter):
    name = "markdown"
    fix_details = True

    def scan(self, result: ScanResult, options: ReportOptions) -> str:
        findings = result.findings
        files = len({f.path for f in findings})
        fixable = sum(1 for f in findings if f.fix)
        target = f" (target torch {options.target})" if options.target is not None else ""
        out: list[str] = ["# speedfix optimization report", ""]
        out.append(
            f"speedfix {__version__} scanned {result.files} file{'s' if result.files != 1 else ''}{target}: "
            f"**{len(findings)} finding{'s' if len(findings) != 1 else ''}** "
            f"in {files} file{'s' if files != 1 else ''}, {fixable} with an automatic fix."
        )
        out.append("")
        if result.errors:
            out += ["## Files that could not be analysed", ""]
            out += [f"- `{printable(error.render())}`" for error in result.errors]
            out.append("")
        if not findings:
            out.append("Nothing to report: no missed optimization was found.")
            return "\n".join(out) + "\n"
        out += ["## Totals by rule", "", "| Rule | Name | Findings | Fix | Expected gain |", "|---|---|---:|---|---|"]
        for code, count in sorted(Counter(f.code for f in findings).items()):
            rule = _rule(code)
            out.append(f"| {code} | {rule.name} | {count} | {rule.fix_availability()} | {rule.effect} |")
        out.append("")
        grouped: dict[Category, dict[str, list[Finding]]] = defaultdict(lambda: defaultdict(list))
        for finding in findings:
            grouped[_rule(finding.code).category][finding.path].append(finding)
        for category, (heading, _, _) in _SECTIONS.items():
            if category not in grouped:
                continue
            out += [f"## {heading}", ""]
            for path, items in grouped[category].items():
                out += [f"### `{printable(path)}`", ""]
                for number, finding in enumerate(items, 1):
                    out += _finding(number, finding, _rule(finding.code))
        return "\n".join(out) + "\n"

    def rule_list(self, rules: tuple[type[Rule], ...], options: ReportOptions) -> str:
        rows = [f"| {r.code} | `{r.name}` | {r.fix_availability()} | {_table_cell(r.summary)} |" for r in rules]
        return "\n".join(["| Code | Name | Fix | Finds |", "|---|---|---|---|", *rows]) + "\n"

    def rule_page(self, rule: type[Rule], options: ReportOptions) -> str:
        return rule_markdown(rule)


def _table_cell(text: str) -> str:
    return text.replace("|", "\\|")
