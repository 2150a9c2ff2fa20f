"""`speedfix scan --add-noqa`: a baseline for an existing codebase, as ruff's `--add-noqa`.

Each line with findings gets `# noqa: SFxxx` for the codes found there, so that the next scan
(and the pre-commit hook) reports only new findings; removing a comment brings its advice back.
A `# noqa: E501` already on the line gets the codes added to its list; another comment stays
and the directive follows it. A line whose end is inside a string or after a backslash cannot
take a comment without changing the code: it is left as it is and said in a note. Nothing else
changes: every other byte, the line endings and the encoding are kept, and a file is written
as `apply` writes (atomically, refusing read-only files and links out of the project).
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

from speedfix.commands.apply import project_folders, write_file
from speedfix.commands.scan import display_path, file_setup, project_links, superseded_files, time_limit_message
from speedfix.engine.analysis import SyntaxProblem, analyze
from speedfix.engine.results import SYNTAX_ERROR_CODE, FileError, Note
from speedfix.engine.findings import Finding
from speedfix.syntax import deadline
from speedfix.syntax.collector import collector_paused
from speedfix.project import Links
from speedfix.syntax.source import SourceError, SourceFile, split_lines
from speedfix.workspace.config import Settings
from speedfix.workspace.discovery import iter_targets
from speedfix.workspace.notebook import read_python

# An existing `# noqa: CODES` directive: the codes are extended in place.
_NOQA_CODES = re.compile(r"#\s*noqa:\s*[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*", re.IGNORECASE)


@dataclass
class NoqaOutcome:
    added: int = 0  # directives: one per line changed
    files: list[str] = field(default_factory=list)
    errors: list[FileError] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 2 if self.errors else 0


def add_noqa_paths(paths: list[Path], settings: Settings) -> NoqaOutcome:
    outcome = NoqaOutcome()
    targets = list(iter_targets(paths, settings))
    links, _ = project_links(targets, paths, settings)
    folders = project_folders(paths, settings)
    superseded = superseded_files(targets, paths, links)  # the scan reports nothing there: nothing to baseline
    for target in targets:
        if target.path in superseded:
            continue
        shown = display_path(target.path)
        try:
            source, notebook = read_python(target.path, settings.max_file_size)
            text, added, refused, elsewhere = _baseline(source, shown, settings, links.get(target.path), target.path)
        except SourceError as exc:
            outcome.errors.append(FileError(shown, str(exc)))
            continue
        except SyntaxProblem as problem:
            outcome.errors.append(problem.error)
            continue
        except deadline.TimeLimitExceeded as exc:
            outcome.errors.append(FileError(shown, time_limit_message(exc)))
            continue
        for line in refused:
            outcome.notes.append(Note(shown, f"line {line} ends inside a string or after a backslash: "
                                             "no `# noqa` added there"))
        outcome.notes += [_elsewhere_note(shown, finding) for finding in elsewhere]
        if not added:
            continue
        data = notebook.rebuild(text) if notebook is not None else text.encode(source.encoding)
        original = notebook.data if notebook is not None else source.data
        problem = write_file(target.path, data, original, folders)
        if problem is not None:
            outcome.errors.append(FileError(shown, problem))
            continue
        outcome.added += added
        outcome.files.append(shown)
    return outcome


def _elsewhere_note(shown: str, finding: Finding) -> Note:
    """A finding of the script's analysis in a configuration file is not edited: said, with the
    way to silence it (a YAML or shell line takes a comment, a JSON file none)."""
    where = display_path(Path(finding.file or ""))
    how = (f"list {finding.code} in `per-file-ignores` for {shown}" if where.endswith(".json")
           else f"that line takes `# noqa: {finding.code}` by hand")
    return Note(shown, f"{finding.code} at {where}:{finding.line} is in a configuration file: no `# noqa` added there ({how})")


_PASSES = 10  # a suppressed finding may let the rule report the next place (SF301's other syncs)


def _baseline(source: SourceFile, shown: str, settings: Settings, links: Links | None,
              path: Path) -> tuple[str, int, list[int], list[Finding]]:
    """The file's text with `# noqa` on every line with findings, until no finding is left that
    a comment can take; the lines changed, those that cannot take one, and the findings in
    configuration files (YAML, JSON, launch scripts) that the script's analysis reported."""
    text, added, refused, elsewhere = source.text, 0, [], []
    project, version = file_setup(settings, path)
    for _ in range(_PASSES):
        current = SourceFile(source.path, text.encode(source.encoding), text, source.encoding)
        with deadline.time_limit(settings.file_time_limit), collector_paused():
            analysis = analyze(current, shown, settings.rules_for(path), version, links, project)
        wanted = [f for f in analysis.findings if f.code != SYNTAX_ERROR_CODE and f.impact.at_least(settings.min_impact)]
        elsewhere = elsewhere or [f for f in wanted if f.file is not None]
        findings = [f for f in wanted if f.file is None and f.line not in refused]
        text, more, cannot = with_noqa(text, findings)
        refused += cannot
        if not more:
            break
        added += more
    return text, added, refused, elsewhere


def with_noqa(text: str, findings: list[Finding]) -> tuple[str, int, list[int]]:
    """``text`` with the findings' codes in a `# noqa` on their lines; how many lines changed,
    and the lines that cannot take a comment. Unparseable text is returned unchanged."""
    codes: dict[int, list[str]] = {}
    for finding in sorted(findings, key=lambda f: f.code):
        at = codes.setdefault(finding.line, [])
        if finding.code not in at:
            at.append(finding.code)
    lines = split_lines(text)
    safe, comments = _line_ends(text)
    added, refused = 0, []
    for number, wanted in sorted(codes.items()):
        if not 0 < number <= len(lines):
            continue
        if number not in safe:
            refused.append(number)
            continue
        line = lines[number - 1]
        body = line.rstrip("\r\n")
        ending = line[len(body):]
        lines[number - 1] = _directive(body, wanted, comments.get(number)) + ending
        added += 1
    return "".join(lines), added, refused


def _directive(body: str, codes: list[str], comment_at: int | None) -> str:
    """The line ``body`` with a `# noqa` for ``codes``: added to an existing `# noqa: ...` list
    in its comment, else after the line (and its comment)."""
    if comment_at is not None:
        existing = _NOQA_CODES.search(body, comment_at)
        if existing is not None:
            listed = re.findall(r"[A-Z]+[0-9]+", existing.group(0).upper())
            missing = [code for code in codes if code not in listed]
            return body[:existing.end()] + "".join(f", {code}" for code in missing) + body[existing.end():]
    return body.rstrip(" \t") + "  # noqa: " + ", ".join(codes)


def _line_ends(text: str) -> tuple[set[int], dict[int, int]]:
    """The lines whose end can take a comment (the tokenizer ends a line there, not a string or
    a backslash), and the column where each line's comment starts."""
    safe: set[int] = set()
    comments: dict[int, int] = {}
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type in (tokenize.NEWLINE, tokenize.NL):
                safe.add(token.start[0])
            elif token.type == tokenize.COMMENT:
                comments[token.start[0]] = token.start[1]
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return set(), {}
    return safe, comments
