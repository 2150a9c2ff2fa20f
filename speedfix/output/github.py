"""``--format github``: GitHub Actions workflow commands, one annotation per finding."""

from __future__ import annotations

from speedfix.findings import Severity
from speedfix.scan import ScanResult

_COMMAND = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def render_github(result: ScanResult) -> str:
    lines = []
    for f in result.findings:
        properties = ",".join(
            [
                f"file={_escape_property(f.path)}",
                f"line={f.line}",
                f"col={f.column}",
                f"endLine={f.end_line}",
                f"endColumn={f.end_column}",
                f"title={_escape_property(f'{f.code} {f.name}')}",
            ]
        )
        fixable = " [*]" if f.fix else ""
        lines.append(f"::{_COMMAND[f.severity]} {properties}::{_escape_data(f'{f.code}{fixable} {f.message}')}")
    for error in result.errors:
        where = f"file={_escape_property(error.path)}" + (f",line={error.line},col={error.column}" if error.line else "")
        lines.append(f"::error {where},title=speedfix::{_escape_data(error.render())}")
    return "\n".join(lines) + ("\n" if lines else "")
