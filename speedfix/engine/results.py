"""What the analysis of one file gives: its findings, an error that stopped it, notes.

Kept apart from the analysis itself (``analysis.py``) so that results read back from the scan
cache need neither libcst nor a rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from speedfix.engine.findings import Finding, Impact, Severity

if TYPE_CHECKING:
    import libcst as cst

    from speedfix.model.context import FileContext

SYNTAX_ERROR_CODE = "SF000"
SYNTAX_ERROR_NAME = "invalid-syntax"


@dataclass
class FileError:
    """A file that could not be analysed; ``line``/``column`` are 1-based when known."""

    path: str
    message: str
    line: int | None = None
    column: int | None = None
    kind: str = "error"  # error | syntax

    def render(self) -> str:
        where = f"{self.path}:{self.line}:{self.column}" if self.line else self.path
        prefix = "syntax error" if self.kind == "syntax" else "error"
        return f"{where}: {prefix}: {self.message}"



@dataclass
class Note:
    """Something the report must say about a file that is neither a finding nor an error: what
    could not be checked, a notebook cell that was skipped."""

    path: str
    message: str
    # about the project rather than the file (another file that could not be read): said once per
    # scan, under the first file that met it
    shared: bool = False

    def render(self) -> str:
        return f"{self.path}: note: {self.message}"



@dataclass
class Analysis:
    """The result for one file; ``module``/``context`` are kept for ``apply``."""

    path: str
    findings: list[Finding] = field(default_factory=list)
    error: FileError | None = None
    module: cst.Module | None = None
    context: FileContext | None = None
    notes: list[Note] = field(default_factory=list)
    # The project files the analysis read (configuration, launch scripts): path -> digest
    # (``speedfix.model.project_files``); a cached result holds only while they are unchanged.
    inputs: dict[str, str] = field(default_factory=dict)

    @property
    def syntax_error(self) -> Finding | None:
        """The SF000 finding when the file does not parse."""
        return next((f for f in self.findings if f.code == SYNTAX_ERROR_CODE), None)



def syntax_finding(error: FileError) -> Finding:
    """The SF000 finding for a syntax error: one character at the parser's position."""
    line, column = error.line or 1, error.column or 1
    return Finding(
        code=SYNTAX_ERROR_CODE,
        name=SYNTAX_ERROR_NAME,
        message=error.message,
        severity=Severity.ERROR,
        node=None,
        path=error.path,
        line=line,
        column=column,
        end_line=line,
        end_column=column + 1,
        no_fix_reason="a file that does not parse is never rewritten",
        impact=Impact.HIGH,  # the script does not run at all
    )
