"""Scan files and directories: discovery, reading, analysis, fix details for the reports."""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from speedfix.config import Settings
from speedfix.discovery import Target, iter_targets
from speedfix.engine import Analysis, FileError, analyze
from speedfix.findings import Edit, Finding
from speedfix.fixer import preview
from speedfix.source import SourceError, read_source


@dataclass
class ScanResult:
    findings: list[Finding] = field(default_factory=list)
    errors: list[FileError] = field(default_factory=list)
    files: int = 0

    @property
    def exit_code(self) -> int:
        if self.errors:
            return 2
        return 1 if self.findings else 0


def display_path(path: Path) -> str:
    """Paths relative to the current folder when they are below it (as ruff prints them)."""
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return str(path)
    return str(path) if relative.startswith("..") else relative


def scan_file(target: Target, settings: Settings, *, details: bool = False) -> Analysis:
    """Analyse one file; errors are returned, never raised."""
    shown = display_path(target.path)
    try:
        source = read_source(target.path)
    except SourceError as exc:
        return Analysis(shown, error=FileError(shown, str(exc)))
    try:
        analysis = analyze(source, shown, settings.rules_for(target.path), settings.target)
    except RecursionError:
        return Analysis(shown, error=FileError(shown, "the file is nested too deeply to analyse"))
    if details:
        attach_fix_details(analysis, source.text)
    analysis.module = None  # keep memory flat on big trees
    analysis.context = None
    return analysis


def attach_fix_details(analysis: Analysis, original: str) -> None:
    """Each fixable finding gets its own diff and text edits (for JSON, SARIF and Markdown)."""
    for finding in analysis.findings:
        if finding.fix is None:
            continue
        fixed = preview(analysis, finding)
        if fixed is None or fixed == original:
            continue
        finding.edits = line_edits(original, fixed)
        finding.diff = "".join(
            difflib.unified_diff(
                original.splitlines(keepends=True),
                fixed.splitlines(keepends=True),
                fromfile=f"a/{analysis.path}",
                tofile=f"b/{analysis.path}",
            )
        )


def line_edits(original: str, fixed: str) -> list[Edit]:
    """Whole-line edits that turn ``original`` into ``fixed``."""
    old = original.splitlines(keepends=True)
    new = fixed.splitlines(keepends=True)
    edits = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes():
        if tag != "equal":
            edits.append(Edit(line=i1 + 1, column=1, end_line=i2 + 1, end_column=1, content="".join(new[j1:j2])))
    return edits


def scan_paths(
    paths: list[Path],
    settings: Settings,
    *,
    details: bool = False,
    progress: Callable[[int], None] | None = None,
) -> ScanResult:
    result = ScanResult()
    targets = list(iter_targets(paths, settings))
    for analysis in analyse_all(targets, settings, details=details):
        result.files += 1
        if analysis.error is not None:
            result.errors.append(analysis.error)
        result.findings.extend(analysis.findings)
        if progress is not None:
            progress(1)
    result.findings.sort(key=lambda f: f.sort_key)
    return result


def analyse_all(targets: Iterable[Target], settings: Settings, *, details: bool) -> Iterable[Analysis]:
    for target in targets:
        yield scan_file(target, settings, details=details)
