"""``--format sarif``: SARIF 2.1.0 for code-scanning dashboards (GitHub, GitLab, Azure DevOps)."""

from __future__ import annotations

import json
from pathlib import PurePath
from typing import Any

from speedfix import __version__
from speedfix.findings import Finding, Severity
from speedfix.registry import all_rules
from speedfix.scan import ScanResult

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}
_HELP_URI = "https://github.com/speedfix/speedfix/blob/main/README.md#rules"


def _uri(path: str) -> str:
    return PurePath(path).as_posix()


def _region(line: int, column: int, end_line: int, end_column: int) -> dict[str, int]:
    return {"startLine": line, "startColumn": column, "endLine": end_line, "endColumn": end_column}


def _result(finding: Finding, index: dict[str, int]) -> dict[str, Any]:
    location = {"artifactLocation": {"uri": _uri(finding.path), "uriBaseId": "%SRCROOT%"}}
    result: dict[str, Any] = {
        "ruleId": finding.code,
        "ruleIndex": index[finding.code],
        "level": _LEVEL[finding.severity],
        "message": {"text": finding.message},
        "locations": [
            {"physicalLocation": {**location, "region": _region(finding.line, finding.column, finding.end_line, finding.end_column)}}
        ],
    }
    if finding.cell is not None:
        result["properties"] = {"notebookCell": finding.cell, "cellLine": finding.cell_line}
    if finding.fix is not None and finding.edits:
        result["fixes"] = [
            {
                "description": {"text": f"{finding.fix.title} ({finding.fix.applicability.value})"},
                "artifactChanges": [
                    {
                        **location,
                        "replacements": [
                            {
                                "deletedRegion": _region(edit.line, edit.column, edit.end_line, edit.end_column),
                                "insertedContent": {"text": edit.content},
                            }
                            for edit in finding.edits
                        ],
                    }
                ],
            }
        ]
    return result


def render_sarif(result: ScanResult) -> str:
    rules = all_rules()
    index = {rule.code: i for i, rule in enumerate(rules)}
    driver = {
        "name": "speedfix",
        "version": __version__,
        "semanticVersion": __version__,
        "informationUri": "https://github.com/speedfix/speedfix",
        "rules": [
            {
                "id": rule.code,
                "name": rule.name,
                "shortDescription": {"text": rule.summary},
                "fullDescription": {"text": rule.doc_sections().get("What it does", rule.summary)},
                "help": {"text": rule.docs(), "markdown": rule.docs()},
                "helpUri": f"{_HELP_URI}",
                "defaultConfiguration": {"level": _LEVEL[rule.severity]},
                "properties": {"fix": rule.fix_availability(), "expectedEffect": rule.effect, "tags": ["performance", "pytorch"]},
            }
            for rule in rules
        ],
    }
    notifications = [
        {
            "level": "error",
            "message": {"text": error.render()},
            "locations": [{"physicalLocation": {"artifactLocation": {"uri": _uri(error.path)}}}],
        }
        for error in result.errors
    ]
    document = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {"driver": driver},
                "results": [_result(f, index) for f in result.findings],
                "invocations": [{"executionSuccessful": not result.errors, "toolExecutionNotifications": notifications}],
                "columnKind": "unicodeCodePoints",
            }
        ],
    }
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"
