"""``--output-format text``: one `path:line:col: CODE [*] message` line per finding, then a summary.

Lines never wrap and never end in spaces, on a terminal or not: editors, CI logs and scripts
parse them. Styles (bold, colours) only on a terminal. Tables are aligned here rather than by
rich, whose tables wrap to the terminal and pad every cell.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Sequence

from speedfix.engine.catalog import rule_name, rule_summary
from speedfix.engine.findings import Applicability, Blocker, Finding, Impact
from speedfix.output import Reporter, ReportOptions, by_impact, impact_counts, statistics_rows
from speedfix.output._styled import Line, line, render
from speedfix.syntax.source import printable

if TYPE_CHECKING:
    from speedfix.commands.apply import ApplyOutcome
    from speedfix.commands.scan import ScanResult
    from speedfix.engine.rule import Rule


_IMPACT_STYLE = {Impact.HIGH: "bold", Impact.MEDIUM: "", Impact.LOW: "dim"}


def finding_line(finding: Finding) -> Line:
    """The line editors and CI parse: `path:line:col: CODE [*] message (impact: high)`."""
    text = Line()
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


def table(header: Sequence[str], rows: Sequence[Sequence[str]], *, right: frozenset[int] = frozenset()) -> list[Line]:
    """Columns separated by two spaces; the last one is not padded, so no line ends in spaces."""
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header) - 1)]

    def row_line(cells: Sequence[str], style: str = "") -> Line:
        padded = [cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(cells, widths))]
        return line("  ".join([*padded, cells[-1]]).rstrip(), style)

    return [row_line(header, "bold"), *(row_line(row) for row in rows)]


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'s' if count != 1 else ''}"


def _print_lines(lines: Sequence[Line | str], options: ReportOptions) -> str:
    return render(lines, color=options.color, width=options.width)


def _fix_details(finding: Finding) -> list[Line]:
    """`--show-fixes` without `--fix`: the finding's fix and its diff, indented under it."""
    if finding.fix is None:
        return []
    lines = [line(f"    {finding.fix.applicability.value} fix: {finding.fix.title}", "cyan")]
    for text in (finding.diff or "").splitlines():
        style = "red" if text.startswith("-") and not text.startswith("---") else ""
        style = "green" if text.startswith("+") and not text.startswith("+++") else style
        lines.append(line(f"    {text}".rstrip(), style))
    return lines


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


def _summary(result: ScanResult) -> list[Line | str]:
    findings = result.findings
    if not findings:
        scanned = f"{_plural(result.files, 'file')} scanned"
        if result.errors:
            return [f"No findings ({scanned}; {len(result.errors)} could not be analysed)."]
        return [f"All checks passed: {scanned}."]
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
    lines: list[Line | str] = [summary + "."]
    rows = []
    for code, count in sorted(Counter(f.code for f in findings).items()):
        fix, effect = rule_summary(code) or ("", "")
        impact = min((f.impact for f in findings if f.code == code), key=lambda level: level.order)
        rows.append([code, rule_name(code) or "", str(count), impact.value, fix, effect])
    rows.sort(key=lambda row: (Impact(row[3]).order, row[0]))
    return lines + table(["rule", "name", "count", "impact", "fix", "expected effect"], rows, right=frozenset({2}))


class TextReporter(Reporter):
    name = "text"

    def scan(self, result: ScanResult, options: ReportOptions) -> str:
        lines: list[Line | str] = []
        for finding in by_impact(result.findings):
            lines.append(finding_line(finding))
            if options.show_fixes and options.fixed is None:
                lines += _fix_details(finding)
        lines += [printable(note.render()) for note in result.notes]  # what could not be checked, skipped cells
        if options.summary:
            if result.findings or options.fixed is not None:
                lines.append("")
            if options.fixed is not None and options.fixed.applied:
                lines += _fixed_lines(options.fixed, "Fixed", per_file=options.show_fixes)
            lines += _summary(result)
        return _print_lines(lines, options)

    def statistics(self, result: ScanResult, options: ReportOptions) -> str:
        rows = statistics_rows(result)
        width = len(str(max((row.count for row in rows), default=0)))
        return _print_lines([f"{row.count:>{width}}  {row.code}  {'[*]' if row.fixable else '[ ]'} {row.name}".rstrip()
                             for row in rows], options)

    def apply_summary(self, outcome: ApplyOutcome, options: ReportOptions) -> str:
        lines: list[Line | str] = []
        if outcome.applied:
            lines += _fixed_lines(outcome, "Would fix" if options.dry_run else "Fixed", per_file=options.show_fixes)
        else:
            lines.append("No fixes to apply." if not outcome.unfixed else "Nothing was fixed.")
        if outcome.unfixed:
            lines.append(f"{_plural(len(outcome.unfixed), 'finding')} left unfixed:")
            for item in sorted(outcome.unfixed, key=lambda item: item.finding.impact_key):  # the highest impact first
                lines.append(f"  {printable(item.finding.location)}: {item.finding.code} {printable(item.reason)}")
            if not options.unsafe_fixes and any(item.blocker is Blocker.NEEDS_UNSAFE for item in outcome.unfixed):
                lines.append("Run `speedfix apply --unsafe-fixes` to apply those too (then verify with `speedfix bench`).")
        return _print_lines(lines, options)

    def rule_list(self, rules: tuple[type[Rule], ...], options: ReportOptions) -> str:
        lines = table(["code", "name", "fix", "summary"], [[r.code, r.name, r.fix_availability(), r.summary] for r in rules])
        return _print_lines(lines, options)

    def rule_page(self, rule: type[Rule], options: ReportOptions) -> str:
        from speedfix.output.markdown import rule_markdown

        text = rule_markdown(rule)
        if not options.color:
            return text  # piped: the Markdown source, which reads fine as text
        import io

        from rich.console import Console
        from rich.markdown import Markdown

        buffer = io.StringIO()
        Console(file=buffer, force_terminal=True, no_color=False, width=options.width, highlight=False, soft_wrap=True,
                emoji=False, markup=False).print(Markdown(text))
        return buffer.getvalue()
