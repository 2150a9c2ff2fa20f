"""``--format json``: a list of findings (DESIGN §5). Line and column numbers are 1-based."""

from __future__ import annotations

import json
from typing import Any

from speedfix.findings import Finding
from speedfix.scan import ScanResult


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
        "message": finding.message,
        "fix": None,
    }
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


def render_json(result: ScanResult) -> str:
    return json.dumps([finding_to_dict(f) for f in result.findings], indent=2, ensure_ascii=False) + "\n"
