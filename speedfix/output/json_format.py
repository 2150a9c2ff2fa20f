"""``--output-format json``: a list of findings (the schema is in the README). Line and column
numbers are 1-based, end columns exclusive. Also the JSON of `--statistics` and of the rule
catalog (`speedfix rules`, `speedfix rule CODE`)."""

from __future__ import annotations

import dataclasses

import json
from typing import TYPE_CHECKING, Any

from speedfix.engine.findings import Finding
from speedfix.output import Reporter, ReportOptions, statistics_rows

if TYPE_CHECKING:
    from speedfix.commands.scan import ScanResult
    from speedfix.engine.rule import Rule


def finding_to_dict(finding: Finding) -> dict[str, Any]:
    data: dict[str, Any] = {
        "path": finding.path,
        "line": finding.line,
        "column": finding.column,
        "end_line": finding.end_line,
        "end_column": finding.end_column,
        "code": finding.code,
        "name": finding.name,
        "severity": finding.severity.value,
        "impact": finding.impact.value,
        "message": finding.message,
        "fix": None,
    }
    if finding.impact_reason:
        data["impact_reason"] = finding.impact_reason
        data["impact_measured"] = finding.measured
    if finding.cell is not None:
        data["cell"] = finding.cell
        data["cell_line"] = finding.cell_line
    if finding.fix is not None:
        data["fix"] = {
            "applicability": finding.fix.applicability.value,
            "title": finding.fix.title,
            "edits": [
                {
                    "content": edit.content,
                    "line": edit.line,
                    "column": edit.column,
                    "end_line": edit.end_line,
                    "end_column": edit.end_column,
                }
                for edit in finding.edits or []
            ],
        }
    elif finding.no_fix_reason:
        data["no_fix_reason"] = finding.no_fix_reason
    return data


def rule_to_dict(rule: type[Rule]) -> dict[str, Any]:
    return {
        "code": rule.code,
        "name": rule.name,
        "fix": rule.fix_availability(),
        "severity": rule.severity.value,
        "impact": rule.impact.value,
        "category": rule.category.value,
        "gpu_only": rule.gpu_only,
        "summary": rule.summary,
    }


def _dump(data: Any) -> str:
    return json.dumps(data, indent=2) + "\n"  # ASCII: valid JSON on any terminal, control characters escaped


class JsonReporter(Reporter):
    name = "json"
    fix_details = True

    def scan(self, result: ScanResult, options: ReportOptions) -> str:
        return _dump([finding_to_dict(f) for f in result.findings])

    def statistics(self, result: ScanResult, options: ReportOptions) -> str:
        return _dump([dataclasses.asdict(row) for row in statistics_rows(result)])

    def rule_list(self, rules: tuple[type[Rule], ...], options: ReportOptions) -> str:
        return _dump([rule_to_dict(rule) for rule in rules])

    def rule_page(self, rule: type[Rule], options: ReportOptions) -> str:
        return _dump(
            {
                **rule_to_dict(rule),
                "fix_title": rule.fix_title,
                "loss_check": rule.loss_check.value if rule.loss_check else None,
                "min_torch": str(rule.min_torch) if rule.min_torch else None,
                "max_torch": str(rule.max_torch) if rule.max_torch else None,
                "effect": rule.effect,
                "sections": rule.doc_sections(),
            }
        )
