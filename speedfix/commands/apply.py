"""`speedfix apply`: fix files in place (or show the diff), and say what was left unfixed."""

from __future__ import annotations

import difflib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.text import Text

from speedfix.commands.scan import TOO_DEEP, display_path, file_setup, project_links, superseded_files, time_limit_message
from speedfix.engine.analysis import SyntaxProblem
from speedfix.engine.results import FileError
from speedfix.fixes.fixer import FixError, Unfixed, fix_source
from speedfix.fixes.linemap import LineMap
from speedfix.syntax import deadline
from speedfix.syntax.collector import collector_paused
from speedfix.syntax.source import SourceError, WriteRefused, diff_labels, write_atomic, write_refusal
from speedfix.workspace.config import Settings
from speedfix.workspace.discovery import iter_targets
from speedfix.workspace.notebook import read_python


@dataclass
class ApplyOutcome:
    changed_files: list[str] = field(default_factory=list)
    applied: Counter[str] = field(default_factory=Counter)
    applied_by_file: dict[str, dict[str, int]] = field(default_factory=dict)  # path -> code -> fixes
    unfixed: list[Unfixed] = field(default_factory=list)
    errors: list[FileError] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        if self.errors:
            return 2
        return 1 if self.changed_files else 0


def apply_paths(paths: list[Path], settings: Settings, *, write: bool, show_diff: bool, console: Console) -> ApplyOutcome:
    outcome = ApplyOutcome()
    targets = list(iter_targets(paths, settings))
    links, _ = project_links(targets, paths, settings)  # read before any file is written
    folders = project_folders(paths, settings)
    superseded = superseded_files(targets, paths, links)  # `old/`: left as it is, as the scan leaves it out
    for target in targets:
        if target.path in superseded:
            continue
        shown = display_path(target.path)
        notebook = None
        try:
            source, notebook = read_python(target.path, settings.max_file_size)
            with deadline.time_limit(settings.file_time_limit), collector_paused():
                project, version = file_setup(settings, target.path)
                fixed = fix_source(source, shown, settings.rules_for(target.path), version,
                                   unsafe=settings.unsafe_fixes, links=links.get(target.path), project=project,
                                   min_impact=settings.min_impact)
            original, data = source.data, fixed.data
            left = [item.finding for item in fixed.unfixed]
            if not write:  # positions must be those of the file on disk, not of the fixed code
                LineMap(fixed.code, source.text).remap(left)
            if notebook is not None:
                notebook.locate(left, fixed.code if write else None)
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
        except deadline.TimeLimitExceeded as exc:
            outcome.errors.append(FileError(shown, time_limit_message(exc)))
            continue
        except RecursionError:
            outcome.errors.append(FileError(shown, TOO_DEEP))
            continue
        if data == original:
            outcome.unfixed.extend(fixed.unfixed)
            continue
        problem = write_file(target.path, data, original, folders, write=write)  # said with --diff too
        if problem is not None:
            outcome.errors.append(FileError(shown, problem))
            continue
        outcome.unfixed.extend(fixed.unfixed)  # a refused file has its error instead (positions of unwritten code)
        outcome.changed_files.append(shown)  # only files written (or, with --diff, that would be)
        outcome.applied.update(fixed.applied)
        outcome.applied_by_file[shown] = dict(fixed.applied)
        if show_diff and notebook is not None:
            for change in notebook.changes(fixed.code):
                print_diff(console, *change.for_diff(), f"{shown}:cell {change.number}")
        elif show_diff:
            print_diff(console, source.text, fixed.code, shown)
    return outcome


def write_file(path: Path, data: bytes, original: bytes, folders: list[Path], *, write: bool = True) -> str | None:
    """Write ``data`` over ``path`` as `apply` does; why it was not written, or None. Refused: a
    read-only file, a link out of ``folders``, a file that no longer holds ``original`` (an
    editor saved it meanwhile). With ``write`` False only the refusal is checked (`--diff`)."""
    try:
        refused = write_refusal(path, folders)
        if refused is not None:
            raise WriteRefused(path, refused)
        if write:
            write_atomic(path, data, expected=original, within=folders)
    except WriteRefused as exc:
        return exc.reason
    except OSError as exc:
        return f"cannot write: {exc.strerror or exc}"
    return None


def project_folders(paths: list[Path], settings: Settings) -> list[Path]:
    """The folders `apply` may write into through a symbolic link: the folder of the configuration
    file in use, each folder given, and the folder of each file given."""
    given = [path if path.is_dir() else path.absolute().parent for path in paths]
    return [settings.root, *given] if settings.config_file is not None else given


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
