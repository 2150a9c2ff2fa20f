"""``--output-format sarif``: SARIF 2.1.0 for code-scanning dashboards (GitHub, GitLab, Azure DevOps).

One run: every rule with its documentation as help text, one result per finding (with the
fix's text replacements when it has one) and a tool execution notification per file that
could not be analysed. Lines and columns are 1-based, end columns exclusive, counted in code
points. Relative paths are URIs under ``%SRCROOT%`` (the folder the scan ran in, which GitHub
takes as the repository root); others are ``file://`` URIs.
"""

from __future__ import annotations

import json
from pathlib import PurePath
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from speedfix import __version__
from speedfix.engine.findings import Finding, Severity
from speedfix.engine.registry import all_rules
from speedfix.output import Reporter, ReportOptions

if TYPE_CHECKING:
    from speedfix.commands.scan import ScanResult
    from speedfix.engine.results import FileError
    from speedfix.engine.rule import Rule

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}
_HOME = "https://github.com/speedfix/speedfix"
_HELP_URI = f"{_HOME}/blob/main/README.md#rules"


def _artifact(path: str) -> dict[str, str]:
    pure = PurePath(path)
    if pure.is_absolute():
        return {"uri": pure.as_uri()}
    return {"uri": quote(pure.as_posix()), "uriBaseId": "%SRCROOT%"}


def _region(line: int, column: int, end_line: int, end_column: int) -> dict[str, int]:
    return {"startLine": line, "startColumn": column, "endLine": end_line, "endColumn": end_column}


def _result(finding: Finding, index: dict[str, int]) -> dict[str, Any]:
    artifact = _artifact(finding.path)
    physical: dict[str, Any] = {"artifactLocation": artifact}
    message = finding.message
    result: dict[str, Any] = {"ruleId": finding.code, "ruleIndex": index[finding.code], "level": _LEVEL[finding.severity],
                              "rank": finding.rank}
    properties: dict[str, Any] = {"impact": finding.impact.value}
    if finding.impact_reason:
        properties["impactReason"] = finding.impact_reason
    if finding.cell is not None:
        # Notebook positions are within a cell, not lines of the .ipynb file: no region, no fix.
        message += f" (cell {finding.cell}, line {finding.cell_line}, column {finding.column})"
        properties.update(notebookCell=finding.cell, cellLine=finding.cell_line, cellColumn=finding.column)
    else:
        physical["region"] = _region(finding.line, finding.column, finding.end_line, finding.end_column)
    result["properties"] = properties
    result["message"] = {"text": message}
    result["locations"] = [{"physicalLocation": physical}]
    if finding.fix is not None and finding.edits and finding.cell is None:
        replacements = [
            {
                "deletedRegion": _region(edit.line, edit.column, edit.end_line, edit.end_column),
                "insertedContent": {"text": edit.content},
            }
            for edit in finding.edits
        ]
        result["fixes"] = [
            {
                "description": {"text": f"{finding.fix.title} ({finding.fix.applicability.value} fix)"},
                "artifactChanges": [{"artifactLocation": artifact, "replacements": replacements}],
            }
        ]
    return result


def _notification(error: FileError) -> dict[str, Any]:
    physical: dict[str, Any] = {"artifactLocation": _artifact(error.path)}
    if error.line:
        physical["region"] = {"startLine": error.line, **({"startColumn": error.column} if error.column else {})}
    return {
        "level": "error",
        "message": {"text": error.render()},
        "descriptor": {"id": "file-error"},  # syntax errors are results (SF000), not notifications
        "locations": [{"physicalLocation": physical}],
    }


def _rule(rule: type[Rule]) -> dict[str, Any]:
    docs = rule.docs()
    return {
        "id": rule.code,
        "name": rule.name,
        "shortDescription": {"text": rule.summary},
        "fullDescription": {"text": rule.doc_sections().get("What it does", rule.summary)},
        "help": {"text": docs or rule.summary, "markdown": docs or rule.summary},
        "helpUri": _HELP_URI,
        "defaultConfiguration": {"level": _LEVEL[rule.severity], "rank": Finding.rank_of(rule.impact)},
        "properties": {
            "fix": rule.fix_availability(),
            "expectedEffect": rule.effect,
            "impact": rule.impact.value,
            "tags": [rule.category.value, "pytorch"],
        },
    }


def render_sarif(result: ScanResult) -> str:
    rules = all_rules()
    index = {rule.code: i for i, rule in enumerate(rules)}
    driver = {
        "name": "speedfix",
        "version": __version__,
        "semanticVersion": __version__,
        "informationUri": _HOME,
        "rules": [_rule(rule) for rule in rules],
    }
    run = {
        "tool": {"driver": driver},
        "results": [_result(f, index) for f in result.findings],
        "invocations": [
            {
                "executionSuccessful": not result.errors,
                "exitCode": result.exit_code,
                "toolExecutionNotifications": [_notification(e) for e in result.errors],
            }
        ],
        "columnKind": "unicodeCodePoints",
    }
    document = {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}
    return json.dumps(document, indent=2) + "\n"  # ASCII, as the JSON format


class SarifReporter(Reporter):
    name = "sarif"
    fix_details = True

    def scan(self, result: ScanResult, options: ReportOptions) -> str:
        return render_sarif(result)
