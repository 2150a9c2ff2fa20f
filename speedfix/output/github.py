"""``--output-format github``: GitHub Actions workflow commands, one annotation per finding.

``::warning file=train.py,line=12,col=5,endLine=12,endColumn=20,title=SF102 dataloader-no-pin-memory::SF102 [*] ...``
and ``::error file=...`` for a file that could not be analysed. GitHub accepts columns only
when the annotation starts and ends on the same line, so multi-line findings carry lines only.
Notebook findings are file annotations (their positions are within a cell, not lines of the
.ipynb file) that name the cell in the message.
"""

from __future__ import annotations

from pathlib import PurePath
from typing import TYPE_CHECKING

from speedfix.engine.findings import Finding, Severity
from speedfix.output import Reporter, ReportOptions, by_impact
from speedfix.syntax.source import printable

if TYPE_CHECKING:
    from speedfix.commands.scan import ScanResult

_COMMAND = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _command(name: str, properties: dict[str, object], message: str) -> str:
    props = ",".join(f"{key}={printable(_escape_property(str(value)))}" for key, value in properties.items())
    return f"::{name} {props}::{printable(_escape_data(message))}"  # %0A, and \x1b for an ESC


def _position(f: Finding) -> dict[str, object]:
    if f.cell is not None:
        return {}
    if f.line == f.end_line:
        return {"line": f.line, "col": f.column, "endLine": f.end_line, "endColumn": f.end_column}
    return {"line": f.line, "endLine": f.end_line}


def render_github(result: ScanResult) -> str:
    lines = []
    for f in by_impact(result.findings):
        where = f" (cell {f.cell}, line {f.cell_line}, column {f.column})" if f.cell is not None else ""
        message = f"{f.code}{' [*]' if f.fix else ''} {f.message}{where}"
        properties = {"file": PurePath(f.path).as_posix(), **_position(f), "title": f"{f.code} {f.name} ({f.impact.value} impact)"}
        lines.append(_command(_COMMAND[f.severity], properties, message))
    for error in result.errors:
        position = {"line": error.line, **({"col": error.column} if error.column else {})} if error.line else {}
        lines.append(_command("error", {"file": PurePath(error.path).as_posix(), **position, "title": "speedfix"}, error.render()))
    return "\n".join(lines) + ("\n" if lines else "")


class GithubReporter(Reporter):
    name = "github"

    def scan(self, result: ScanResult, options: ReportOptions) -> str:
        return render_github(result)
