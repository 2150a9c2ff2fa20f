"""Terminal output: one `path:line:col: CODE [*] message` line per finding, then a summary."""

from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.table import Table
from rich.text import Text

from speedfix.findings import Applicability, Finding
from speedfix.registry import rule_by_code
from speedfix.scan import ScanResult


def finding_line(finding: Finding) -> Text:
    """The line editors and CI parse; never wrapped, plain when piped."""
    text = Text()
    text.append(finding.location, style="bold")
    text.append(": ")
    text.append(finding.code, style="bold red")
    text.append(" ")
    if finding.fix is not None:
        text.append("[*] ", style="cyan")
    text.append(finding.message)
    return text


def print_findings(console: Console, findings: list[Finding]) -> None:
    for finding in findings:
        console.print(finding_line(finding), soft_wrap=True, highlight=False)


def print_summary(console: Console, result: ScanResult) -> None:
    findings = result.findings
    if not findings:
        scanned = f"{result.files} file{'s' if result.files != 1 else ''} scanned"
        if result.errors:
            console.print(f"No findings ({scanned}; {len(result.errors)} could not be analysed).", highlight=False)
        else:
            console.print(f"All checks passed: {scanned}.", highlight=False)
        return
    files = len({f.path for f in findings})
    safe = sum(1 for f in findings if f.fix and f.fix.applicability is Applicability.SAFE)
    unsafe = sum(1 for f in findings if f.fix and f.fix.applicability is Applicability.UNSAFE)
    console.print()
    summary = f"Found {len(findings)} finding{'s' if len(findings) != 1 else ''} in {files} file{'s' if files != 1 else ''}"
    if safe or unsafe:
        parts = []
        if safe:
            parts.append(f"{safe} fixable with `speedfix apply`")
        if unsafe:
            parts.append(f"{unsafe} {'more ' if safe else ''}with `speedfix apply --unsafe-fixes`")
        summary += " (" + ", ".join(parts) + ")"
    console.print(summary + ".", highlight=False, soft_wrap=True)
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    table.add_column("rule")
    table.add_column("name")
    table.add_column("count", justify="right")
    table.add_column("fix")
    table.add_column("expected effect", overflow="fold")
    for code, count in sorted(Counter(f.code for f in findings).items()):
        rule = rule_by_code(code)
        table.add_row(
            code,
            rule.name if rule else "",
            str(count),
            rule.fix_availability() if rule else "",
            rule.effect if rule else "",
        )
    if not console.is_terminal:
        console.width = max(console.width, 120)  # CI logs: no wrapping inside the table
    console.print(table)
