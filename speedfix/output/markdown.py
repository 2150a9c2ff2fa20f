"""``--format markdown``: the optimization report a person reads.

Per finding: what is slow, why, what to change (the fix and its diff, or why there is none),
the expected gain and its source. Totals by rule come first.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict

from speedfix import __version__
from speedfix.findings import Applicability, Finding
from speedfix.registry import rule_by_code
from speedfix.rule import Rule
from speedfix.scan import ScanResult
from speedfix.versions import TorchVersion

_URL = re.compile(r"https?://[^\s,)]+")


def _first_paragraph(text: str) -> str:
    return text.strip().split("\n\n", 1)[0].replace("\n", " ")


def _sources(rule: Rule | type[Rule]) -> list[str]:
    return [url.rstrip(".") for url in _URL.findall(rule.doc_sections().get("Measured effect", ""))]


def _fix_text(finding: Finding) -> str:
    if finding.fix is None:
        reason = finding.no_fix_reason or "no automatic fix for this rule"
        return f"No automatic fix: {reason}."
    how = "`speedfix apply`" if finding.fix.applicability is Applicability.SAFE else "`speedfix apply --unsafe-fixes`"
    return f"{finding.fix.title} ({finding.fix.applicability.value} fix: {how})."


def render_markdown(result: ScanResult, target: TorchVersion) -> str:
    findings = result.findings
    out: list[str] = ["# speedfix optimization report", ""]
    files = len({f.path for f in findings})
    fixable = sum(1 for f in findings if f.fix)
    out.append(
        f"speedfix {__version__} scanned {result.files} file{'s' if result.files != 1 else ''} "
        f"(target torch {target}): **{len(findings)} finding{'s' if len(findings) != 1 else ''}** "
        f"in {files} file{'s' if files != 1 else ''}, {fixable} with an automatic fix."
    )
    out.append("")
    if result.errors:
        out += ["## Files that could not be analysed", ""]
        out += [f"- `{error.render()}`" for error in result.errors]
        out.append("")
    if not findings:
        out.append("Nothing to report: no missed optimization was found.")
        return "\n".join(out) + "\n"
    out += ["## Totals by rule", "", "| Rule | Name | Findings | Fix | Expected gain |", "|---|---|---:|---|---|"]
    for code, count in sorted(Counter(f.code for f in findings).items()):
        rule = rule_by_code(code)
        assert rule is not None
        out.append(f"| {code} | {rule.name} | {count} | {rule.fix_availability()} | {rule.effect} |")
    out.append("")
    by_file: dict[str, list[Finding]] = defaultdict(list)
    for finding in findings:
        by_file[finding.path].append(finding)
    out += ["## Findings", ""]
    for path, items in by_file.items():
        out += [f"### `{path}`", ""]
        for number, finding in enumerate(items, 1):
            rule = rule_by_code(finding.code)
            assert rule is not None
            sections = rule.doc_sections()
            out += [f"#### {number}. {finding.code} {finding.name} at `{finding.location}`", ""]
            out += [f"**What is slow:** {finding.message}.", ""]
            out += [f"**Why:** {_first_paragraph(sections.get('Why is this bad?', ''))}", ""]
            out += [f"**What to change:** {_fix_text(finding)}", ""]
            if finding.diff:
                out += ["```diff", finding.diff.rstrip("\n"), "```", ""]
            sources = ", ".join(f"<{url}>" for url in _sources(rule))
            out += [f"**Expected gain:** {rule.effect}" + (f" Sources: {sources}" if sources else ""), ""]
            out += [f"Details: `speedfix rule {finding.code}`.", ""]
    return "\n".join(out) + "\n"
