"""``--output-format text``: one `path:line:col: CODE [*] message` line per finding, then a summary.

Lines never wrap and never end in spaces, on a terminal or not: editors, CI logs and scripts
parse them. Styles (bold, colours) only on a terminal. Tables are aligned here rather than by
rich, whose tables wrap to the terminal and pad every cell.
"""

from __future__ import annotations

import io
from collections import Counter
from typing import TYPE_CHECKING, Callable, Sequence

from rich.console import Console
from rich.text import Text

from speedfix.engine.catalog import rule_name
from speedfix.engine.findings import Applicability, Blocker, Finding, Impact
from speedfix.engine.registry import rule_by_code
from speedfix.output import Reporter, ReportOptions, by_impact, impact_counts, statistics_rows
from speedfix.syntax.source import printable

if TYPE_CHECKING:
    from speedfix.commands.apply import ApplyOutcome
    from speedfix.commands.scan import ScanResult
    from speedfix.engine.rule import Rule


_IMPACT_STYLE = {Impact.HIGH: "bold", Impact.MEDIUM: "", Impact.LOW: "dim"}


def finding_line(finding: Finding) -> Text:
    """The line editors and CI parse: `path:line:col: CODE [*] message (impact: high)`."""
    text = Text()
    text.append(printable(finding.location), style="bold")
    text.append(": ")
    text.append(finding.code, style="bold red")
    text.append(" ")
    if finding.fix is not None:
        text.append("[*] ", style="cyan")
    text.append(printable(finding.message))
    text.append(f" (impact: {finding.impact.value}{', measured' if finding.measured else ''})",
                style=_IMPACT_STYLE[finding.impact])
    return text


def table(header: Sequence[str], rows: Sequence[Sequence[str]], *, right: frozenset[int] = frozenset()) -> list[Text]:
    """Columns separated by two spaces; the last one is not padded, so no line ends in spaces."""
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header) - 1)]

    def line(cells: Sequence[str], style: str = "") -> Text:
        padded = [cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(cells, widths))]
        return Text("  ".join([*padded, cells[-1]]).rstrip(), style=style)

    return [line(header, "bold"), *(line(row) for row in rows)]


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'s' if count != 1 else ''}"


def _render(options: ReportOptions, draw: Callable[[Console], None]) -> str:
    buffer = io.StringIO()
    console = Console(
        file=buffer, force_terminal=options.color, no_color=not options.color, width=options.width,
        highlight=False, soft_wrap=True, emoji=False, markup=False,
    )
    draw(console)
    return buffer.getvalue()


def _print_lines(lines: Sequence[Text | str], options: ReportOptions) -> str:
    def draw(console: Console) -> None:
        for line in lines:
            console.print(line)

    return _render(options, draw)


def _fix_details(console: Console, finding: Finding) -> None:
    """`--show-fixes` without `--fix`: the finding's fix and its diff, indented under it."""
    if finding.fix is None:
        return
    console.print(Text(f"    {finding.fix.applicability.value} fix: {finding.fix.title}", style="cyan"))
    for line in (finding.diff or "").splitlines():
        style = "red" if line.startswith("-") and not line.startswith("---") else ""
        style = "green" if line.startswith("+") and not line.startswith("+++") else style
        console.print(Text(f"    {line}".rstrip(), style=style))


def _fixed_lines(outcome: ApplyOutcome, verb: str, *, per_file: bool) -> list[str]:
    total = sum(outcome.applied.values())
    files = _plural(len(outcome.changed_files), "file")
    if not per_file:
        per_rule = ", ".join(f"{code} x{count}" for code, count in sorted(outcome.applied.items()))
        return [f"{verb} {_plural(total, 'finding')} in {files} ({per_rule})."]
    lines = [f"{verb} {_plural(total, 'finding')} in {files}:"]
    for path, applied in outcome.applied_by_file.items():
        lines.append(f"  {printable(path)}")
        for code, count in sorted(applied.items()):
            lines.append(f"    {count} x {code} {rule_name(code) or ''}".rstrip())
    return lines


def _summary(console: Console, result: ScanResult) -> None:
    findings = result.findings
    if not findings:
        scanned = f"{_plural(result.files, 'file')} scanned"
        if result.errors:
            console.print(f"No findings ({scanned}; {len(result.errors)} could not be analysed).")
        else:
            console.print(f"All checks passed: {scanned}.")
        return
    files = len({f.path for f in findings})
    safe = sum(1 for f in findings if f.fix and f.fix.applicability is Applicability.SAFE)
    unsafe = sum(1 for f in findings if f.fix and f.fix.applicability is Applicability.UNSAFE)
    summary = f"Found {_plural(len(findings), 'finding')} in {_plural(files, 'file')}: {impact_counts(findings)}"
    if safe or unsafe:
        parts = []
        if safe:
            parts.append(f"{safe} fixable with `speedfix apply`")
        if unsafe:
            parts.append(f"{unsafe} {'more' if safe else 'fixable'} with `speedfix apply --unsafe-fixes`")
        summary += " (" + ", ".join(parts) + ")"
    console.print(summary + ".")
    rows = []
    for code, count in sorted(Counter(f.code for f in findings).items()):
        rule = rule_by_code(code)
        impact = min((f.impact for f in findings if f.code == code), key=lambda level: level.order)
        rows.append([code, rule.name if rule else "", str(count), impact.value, rule.fix_availability() if rule else "",
                     rule.effect if rule else ""])
    rows.sort(key=lambda row: (Impact(row[3]).order, row[0]))
    for line in table(["rule", "name", "count", "impact", "fix", "expected effect"], rows, right=frozenset({2})):
        console.print(line)


class TextReporter(Reporter):
    name = "text"

    def scan(self, result: ScanResult, options: ReportOptions) -> str:
        def draw(console: Console) -> None:
            for finding in by_impact(result.findings):
                console.print(finding_line(finding))
                if options.show_fixes and options.fixed is None:
                    _fix_details(console, finding)
            for note in result.notes:  # what could not be checked, skipped notebook cells
                console.print(Text(printable(note.render())))
            if not options.summary:
                return
            if result.findings or options.fixed is not None:
                console.print()
            if options.fixed is not None and options.fixed.applied:
                for line in _fixed_lines(options.fixed, "Fixed", per_file=options.show_fixes):
                    console.print(line)
            _summary(console, result)

        return _render(options, draw)

    def statistics(self, result: ScanResult, options: ReportOptions) -> str:
        rows = statistics_rows(result)
        width = len(str(max((row.count for row in rows), default=0)))
        return _print_lines([f"{row.count:>{width}}  {row.code}  {'[*]' if row.fixable else '[ ]'} {row.name}".rstrip()
                             for row in rows], options)

    def apply_summary(self, outcome: ApplyOutcome, options: ReportOptions) -> str:
        def draw(console: Console) -> None:
            if outcome.applied:
                verb = "Would fix" if options.dry_run else "Fixed"
                for line in _fixed_lines(outcome, verb, per_file=options.show_fixes):
                    console.print(line)
            else:
                console.print("No fixes to apply." if not outcome.unfixed else "Nothing was fixed.")
            if not outcome.unfixed:
                return
            console.print(f"{_plural(len(outcome.unfixed), 'finding')} left unfixed:")
            for item in sorted(outcome.unfixed, key=lambda item: item.finding.impact_key):  # the highest impact first
                console.print(f"  {printable(item.finding.location)}: {item.finding.code} {printable(item.reason)}")
            if not options.unsafe_fixes and any(item.blocker is Blocker.NEEDS_UNSAFE for item in outcome.unfixed):
                console.print("Run `speedfix apply --unsafe-fixes` to apply those too (then verify with `speedfix bench`).")

        return _render(options, draw)

    def rule_list(self, rules: tuple[type[Rule], ...], options: ReportOptions) -> str:
        lines = table(["code", "name", "fix", "summary"], [[r.code, r.name, r.fix_availability(), r.summary] for r in rules])
        return _print_lines(lines, options)

    def rule_page(self, rule: type[Rule], options: ReportOptions) -> str:
        from speedfix.output.markdown import rule_markdown

        text = rule_markdown(rule)
        if not options.color:
            return text  # piped: the Markdown source, which reads fine as text
        from rich.markdown import Markdown

        return _render(options, lambda console: console.print(Markdown(text)))
