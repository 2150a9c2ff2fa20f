"""`speedfix apply`: fix files in place (or show the diff), and say what was left unfixed."""

from __future__ import annotations

import difflib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.text import Text

from speedfix.config import Settings
from speedfix.discovery import iter_targets
from speedfix.engine import FileError, SyntaxProblem
from speedfix.fixer import FixError, Unfixed, fix_source
from speedfix.notebook import read_python
from speedfix.scan import display_path
from speedfix.source import SourceError, diff_labels, write_atomic


@dataclass
class ApplyOutcome:
    changed_files: list[str] = field(default_factory=list)
    applied: Counter[str] = field(default_factory=Counter)
    unfixed: list[Unfixed] = field(default_factory=list)
    errors: list[FileError] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        if self.errors:
            return 2
        return 1 if self.changed_files else 0


def apply_paths(paths: list[Path], settings: Settings, *, write: bool, show_diff: bool, console: Console) -> ApplyOutcome:
    outcome = ApplyOutcome()
    for target in iter_targets(paths, settings):
        shown = display_path(target.path)
        notebook = None
        try:
            source, notebook = read_python(target.path)
            fixed = fix_source(source, shown, settings.rules_for(target.path), settings.target, unsafe=settings.unsafe_fixes)
            original, data = source.data, fixed.data
            if notebook is not None:
                notebook.locate([item.finding for item in fixed.unfixed], fixed.code)
                original, data = notebook.data, notebook.rebuild(fixed.code)
        except SourceError as exc:
            outcome.errors.append(FileError(shown, str(exc)))
            continue
        except SyntaxProblem as problem:
            outcome.errors.append(problem.error if notebook is None else notebook.locate_error(problem.error))
            continue
        except FixError as exc:
            outcome.errors.append(FileError(shown, str(exc)))
            continue
        outcome.unfixed.extend(fixed.unfixed)
        if data == original:
            continue
        outcome.changed_files.append(shown)
        outcome.applied.update(fixed.applied)
        if show_diff and notebook is not None:
            for change in notebook.changes(fixed.code):
                print_diff(console, *change.for_diff(), f"{shown}:cell {change.number}")
        elif show_diff:
            print_diff(console, source.text, fixed.code, shown)
        if write:
            try:
                write_atomic(target.path, data)
            except OSError as exc:
                outcome.errors.append(FileError(shown, f"cannot write: {exc.strerror or exc}"))
    return outcome


def print_diff(console: Console, before: str, after: str, path: str) -> None:
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), *diff_labels(path)
    )
    for line in lines:
        style = ""
        if line.startswith(("+++", "---")):
            style = "bold"
        elif line.startswith("+"):
            style = "green"
        elif line.startswith("-"):
            style = "red"
        elif line.startswith("@@"):
            style = "cyan"
        console.print(Text(line.rstrip("\r\n"), style=style), soft_wrap=True, highlight=False)


def print_apply_summary(outcome: ApplyOutcome, settings: Settings, *, console: Console, dry_run: bool) -> None:
    errors = Console(stderr=True, highlight=False, soft_wrap=True)
    for error in outcome.errors:
        errors.print(error.render(), markup=False)
    total = sum(outcome.applied.values())
    verb = "Would fix" if dry_run else "Fixed"
    if total:
        per_rule = ", ".join(f"{code} x{count}" for code, count in sorted(outcome.applied.items()))
        files = len(outcome.changed_files)
        console.print(f"{verb} {total} finding{'s' if total != 1 else ''} in {files} file{'s' if files != 1 else ''} ({per_rule}).", highlight=False)
    else:
        console.print("No fixes to apply." if not outcome.unfixed else "Nothing was fixed.", highlight=False)
    if outcome.unfixed:
        console.print(f"{len(outcome.unfixed)} finding{'s' if len(outcome.unfixed) != 1 else ''} left unfixed:", highlight=False)
        for item in outcome.unfixed:
            f = item.finding
            console.print(f"  {f.location}: {f.code} {item.reason}", highlight=False, markup=False, soft_wrap=True)
        if not settings.unsafe_fixes and any(u.reason.startswith("unsafe fix") for u in outcome.unfixed):
            console.print("Run `speedfix apply --unsafe-fixes` to apply those too (then verify with `speedfix bench`).", highlight=False)
