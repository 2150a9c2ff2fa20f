"""`speedfix server`: a Language Server (LSP over stdio, built on pygls) for editors.

It is glue only. Findings come from the engine that ``speedfix scan`` runs (``analyze``, on the
editor's text rather than the file on disk), with the settings the CLI would use for the document's
path (the nearest ``[tool.speedfix]``, ``per-file-ignores``, ``exclude`` as with
``--force-exclude``) and ``# noqa`` applied by the engine. A quick fix is the finding's fix made
by ``apply``'s transform (``fixer.apply_fixes``), and "fix all" is ``fix_source``, exactly what
``speedfix apply`` writes.

Published on open, change (full sync) and save; cleared on close. Jupyter notebooks (LSP
``notebookDocument/*``) are not supported: only Python text documents are checked.
"""

from __future__ import annotations

import difflib
import logging
import re
from bisect import bisect_right
from dataclasses import dataclass, replace
from functools import cached_property
from itertools import islice
from pathlib import Path

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path
from pygls.workspace import TextDocument
from pygls.workspace.position_codec import PositionCodec

from speedfix import __version__
from speedfix.commands.scan import TOO_DEEP, display_path, project_links, time_limit_message
from speedfix.engine.analysis import SyntaxProblem, analyze
from speedfix.engine.findings import Applicability, Finding, Fix, Severity
from speedfix.engine.registry import rule_by_code
from speedfix.engine.results import Analysis, FileError
from speedfix.fixes.fixer import FixError, allowed, apply_fixes, fix_source, op_node
from speedfix.output import format_names
from speedfix.project import Links
from speedfix.syntax import deadline
from speedfix.syntax.parsing import room_for_deep_trees
from speedfix.syntax.source import SourceError, SourceFile, decode_source
from speedfix.workspace.cache import ScanCache, cache_enabled
from speedfix.workspace.config import ConfigError, Settings, real_path, resolve_settings
from speedfix.workspace.discovery import MissingPath, iter_targets

log = logging.getLogger(__name__)

SOURCE = "speedfix"
FIX_ALL_KIND = f"{types.CodeActionKind.SourceFixAll.value}.speedfix"  # source.fixAll.speedfix
# Where `scan --format sarif` points for rule documentation (`speedfix rule CODE` has the full text).
RULES_HREF = "https://github.com/speedfix/speedfix/blob/main/README.md#rules"

_SEVERITY = {
    Severity.ERROR: types.DiagnosticSeverity.Error,
    Severity.WARNING: types.DiagnosticSeverity.Warning,
    Severity.INFO: types.DiagnosticSeverity.Information,
}
_PYTHON_SUFFIXES = (".py", ".pyi")
# LSP ends lines at \n, \r\n and \r only; str.splitlines() also splits at \f, \x1c, \u2028, ...
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


# ------------------------------------------------------------------------- positions
def _at(position: types.Position) -> tuple[int, int]:
    return position.line, position.character


class LineIndex:
    """Converts engine positions (lines 1-based, columns in code points) to LSP positions
    (0-based, in the client's negotiated units: UTF-16 unless it asked for another)."""

    def __init__(self, text: str, codec: PositionCodec) -> None:
        self.text = text
        self.codec = codec
        self.starts = [0, *(match.end() for match in _LINE_BREAK.finditer(text))]

    def _line_end(self, line: int) -> int:
        """Offset of the end of ``line``'s content (before its line break)."""
        end = self.starts[line + 1] if line + 1 < len(self.starts) else len(self.text)
        while end > self.starts[line] and self.text[end - 1] in "\r\n":
            end -= 1
        return end

    def position(self, line: int, character: int) -> types.Position:
        """0-based ``line`` and code-point ``character``, clamped to the text."""
        line = min(max(line, 0), len(self.starts) - 1)
        start = self.starts[line]
        end = min(start + max(character, 0), self._line_end(line))
        return types.Position(line=line, character=self.codec.client_num_units(self.text[start:end]))

    def at_offset(self, offset: int) -> types.Position:
        line = bisect_right(self.starts, offset) - 1
        return self.position(line, offset - self.starts[line])

    def span(self, line: int, column: int, end_line: int, end_column: int) -> types.Range:
        """A range from the engine's 1-based line/column pairs (the end exclusive)."""
        start = self.position(line - 1, column - 1)
        end = self.position(end_line - 1, end_column - 1)
        if _at(end) < _at(start):
            end = start  # a finding without an end position
        return types.Range(start=start, end=end)


def _lines(text: str) -> list[str]:
    """``text``'s lines as LSP counts them, each with its line break."""
    pieces = _LINE_BREAK.split(text)
    breaks = _LINE_BREAK.findall(text)
    lines = [piece + brk for piece, brk in zip(pieces, breaks)]
    return lines + [pieces[-1]] if pieces[-1] else lines


def text_edits(old: str, new: str, index: LineIndex) -> list[types.TextEdit]:
    """Edits turning ``old`` (the text ``index`` indexes) into ``new``: whole lines, one edit per
    changed block, so that an import added at the top and a call fixed below stay two edits."""
    before, after = _lines(old), _lines(new)
    offsets = [*index.starts[: len(before)], len(old)]  # offsets[i]: where line i starts
    edits = []
    matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            edits.append(
                types.TextEdit(
                    range=types.Range(start=index.at_offset(offsets[i1]), end=index.at_offset(offsets[i2])),
                    new_text="".join(after[j1:j2]),
                )
            )
    return edits


# ------------------------------------------------------------------------- analysis
@dataclass
class Checked:
    """One analysis of a document's text, kept for the code actions that follow it."""

    text: str
    source: SourceFile
    path: str  # as messages show it
    settings: Settings
    analysis: Analysis

    @cached_property
    def applied(self) -> str | None:
        """The text ``speedfix apply`` would write (None: no change, or the fix failed).

        Editors ask for code actions at every cursor move, so this runs once per text."""
        unsafe = self.settings.unsafe_fixes
        if not any(allowed(finding, unsafe) for finding in self.analysis.findings):
            return None
        rules = self.settings.rules_for(self.source.path)
        try:
            outcome = fix_source(self.source, self.path, rules, self.settings.target, unsafe=unsafe)
        except (SyntaxProblem, FixError, RecursionError) as exc:
            log.warning("fix all: %s", exc)
            return None
        return outcome.code if outcome.changed and outcome.code != self.text else None


def source_from_text(path: Path, text: str) -> SourceFile:
    """The editor's text as the engine would read the file: encoded as its coding cookie says."""
    data = text.encode("utf-8")
    encoding = "utf-8"
    try:
        encoding = decode_source(data)[1]
        if encoding not in ("utf-8", "utf-8-sig"):
            data = text.encode(encoding)
    except (SourceError, UnicodeEncodeError, LookupError):
        pass  # the engine reports what it cannot parse
    return SourceFile(path, data, text, encoding)


def settings_for(path: Path | None) -> Settings | None:
    """The CLI's settings for ``path`` (``None``: the file is excluded). Raises ConfigError."""
    settings = resolve_settings([path] if path is not None else [], output_formats=format_names())
    if path is None:
        return settings
    try:
        # An editor names one file, as pre-commit does: `exclude` applies as with --force-exclude.
        if not any(iter_targets([path], replace(settings, force_exclude=True))):
            return None
    except MissingPath:
        pass  # a new file not saved yet
    return settings


# A folder with more Python files than this is analysed file by file in the editor: linking it
# again after every edit would make the diagnostics lag.
PROJECT_FILES = 300


def links_for(path: Path, data: bytes, settings: Settings) -> Links | None:
    """What the other files of the buffer's folder (its subfolders included) tell it, as
    `speedfix scan FOLDER` would: the loop in engine.py that runs this file's helpers, the
    `DEVICE` of config.py. None when the file is on its own, or the folder is too big."""
    try:
        targets = list(islice(iter_targets([path.parent], settings), PROJECT_FILES + 1))
    except (MissingPath, OSError):
        return None
    mine = real_path(path)
    here = next((t.path for t in targets if real_path(t.path) == mine), None)
    if here is None or len(targets) > PROJECT_FILES:
        return None
    cache = ScanCache(settings.root, settings.fingerprint(), warn=lambda _: None) if cache_enabled(settings.cache) else None
    links, _ = project_links(targets, [path.parent, settings.root], settings, cache, texts={here: data})
    if cache is not None:
        cache.save()
    return links.get(here)


def check(path: Path | None, text: str, settings: Settings) -> Checked:
    """Analyse ``text`` as ``scan`` analyses the file at ``path`` (``None``: an unsaved buffer)."""
    file = path if path is not None else settings.root / "untitled.py"
    shown = display_path(file)
    source = source_from_text(file, text)
    links = links_for(path, source.data, settings) if path is not None else None
    try:
        # the same per-file limit as `scan`: a pathological buffer must not block the editor
        with deadline.time_limit(settings.file_time_limit):
            analysis = analyze(source, shown, settings.rules_for(file), settings.target, links)
    except RecursionError:
        analysis = Analysis(shown, error=FileError(shown, TOO_DEEP))
    except deadline.TimeLimitExceeded as exc:
        analysis = Analysis(shown, error=FileError(shown, time_limit_message(exc)))
    return Checked(text, source, shown, settings, analysis)


def diagnostic(finding: Finding, index: LineIndex) -> types.Diagnostic:
    rule = rule_by_code(finding.code)
    return types.Diagnostic(
        range=index.span(finding.line, finding.column, finding.end_line, finding.end_column),
        severity=_SEVERITY[finding.severity],
        code=finding.code,
        code_description=types.CodeDescription(href=RULES_HREF) if rule is not None and rule.docs() else None,
        source=SOURCE,
        message=finding.message,
    )


def error_diagnostic(error: FileError, index: LineIndex) -> types.Diagnostic:
    """A file the engine could not analyse at all (a syntax error is an SF000 finding instead)."""
    line, column = error.line or 1, error.column or 1
    return types.Diagnostic(
        range=index.span(line, column, line, column + 1),
        severity=types.DiagnosticSeverity.Error,
        source=SOURCE,
        message=f"speedfix cannot analyse this file: {error.message}",
    )


def diagnostics(checked: Checked, index: LineIndex) -> list[types.Diagnostic]:
    found = [diagnostic(finding, index) for finding in checked.analysis.findings]
    if checked.analysis.error is not None:
        found.append(error_diagnostic(checked.analysis.error, index))
    return found


# ------------------------------------------------------------------------- code actions
def _kind_wanted(kind: str, only: list[str] | None) -> bool:
    """``only`` holds kind prefixes: "source.fixAll" asks for "source.fixAll.speedfix" too."""
    return only is None or any(kind == want or kind.startswith(f"{want}.") for want in only)


def _overlaps(a: types.Range, b: types.Range) -> bool:
    return _at(a.start) <= _at(b.end) and _at(b.start) <= _at(a.end)


def _asked_for(finding: Finding, where: types.Range, params: types.CodeActionParams) -> bool:
    """The finding under the requested range, or one whose diagnostic the client passed along
    (editors send the cursor's range with the diagnostics of its line)."""
    if _overlaps(where, params.range):
        return True
    return any(
        d.source == SOURCE and d.code == finding.code and d.range.start.line == where.start.line
        for d in params.context.diagnostics
    )


def _edited(fix: Fix) -> set[int]:
    """The nodes ``fix`` edits (by identity)."""
    return {id(node) for op in fix.ops if (node := op_node(op)) is not None}


def coupled(finding: Finding, findings: list[Finding]) -> list[Finding]:
    """``finding`` and the findings of its rule whose fixes edit a node that its fix edits too:
    one import rewritten for several uses (SF203's ``from torch.cuda.amp import GradScaler,
    autocast``). Fixed alone, one of them would leave the others' calls broken."""
    assert finding.fix is not None
    group, nodes = [finding], _edited(finding.fix)
    grew = True
    while grew:
        grew = False
        for other in findings:
            if other.code == finding.code and other.fix is not None and other not in group and nodes & _edited(other.fix):
                group.append(other)
                nodes |= _edited(other.fix)
                grew = True
    return group


def quick_fix(checked: Checked, finding: Finding, uri: str, index: LineIndex) -> types.CodeAction | None:
    """``finding``'s fix (with the fixes coupled to it), made by ``apply``'s transform."""
    assert finding.fix is not None and checked.analysis.module is not None
    group = coupled(finding, checked.analysis.findings)
    try:
        with room_for_deep_trees():
            fixed = apply_fixes(checked.analysis.module, [f.fix for f in group if f.fix is not None]).code
    except Exception:  # as in `fixer.preview`: a fix that fails must not take the server down
        log.exception("%s: the fix for %s failed", checked.path, finding.code)
        return None
    if fixed == checked.text:
        return None
    safe = all(f.fix is not None and f.fix.applicability is Applicability.SAFE for f in group)
    title = f"{finding.code}: {finding.fix.title or 'apply the fix'}"
    if len(group) > 1:
        title += f" (and {len(group) - 1} more {finding.code} sharing its edit)"
    return types.CodeAction(
        title=title + ("" if safe else " (unsafe)"),
        kind=types.CodeActionKind.QuickFix,
        diagnostics=[diagnostic(f, index) for f in group],
        is_preferred=safe,
        edit=types.WorkspaceEdit(changes={uri: text_edits(checked.text, fixed, index)}),
    )


def fix_all(checked: Checked, uri: str, index: LineIndex) -> types.CodeAction | None:
    """Every fix ``speedfix apply`` would write (safe ones, unless the config says `unsafe-fixes`)."""
    if checked.applied is None:
        return None
    unsafe = checked.settings.unsafe_fixes
    return types.CodeAction(
        title="speedfix: fix all" + (" (unsafe fixes included)" if unsafe else " safe findings"),
        kind=FIX_ALL_KIND,
        edit=types.WorkspaceEdit(changes={uri: text_edits(checked.text, checked.applied, index)}),
    )


def code_actions(checked: Checked, uri: str, index: LineIndex, params: types.CodeActionParams) -> list[types.CodeAction]:
    only = [getattr(kind, "value", kind) for kind in params.context.only or ()] or None  # enum or str
    actions: list[types.CodeAction] = []
    if _kind_wanted(types.CodeActionKind.QuickFix.value, only):
        for finding in checked.analysis.findings:
            if finding.fix is None:
                continue
            where = index.span(finding.line, finding.column, finding.end_line, finding.end_column)
            if _asked_for(finding, where, params) and (action := quick_fix(checked, finding, uri, index)):
                actions.append(action)
    if _kind_wanted(FIX_ALL_KIND, only) and (action := fix_all(checked, uri, index)):
        actions.append(action)
    return actions


# ------------------------------------------------------------------------- the server
class SpeedfixServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__("speedfix", __version__, text_document_sync_kind=types.TextDocumentSyncKind.Full)
        self.checked: dict[str, Checked] = {}  # uri -> the last analysis of an open document
        self.config_errors: set[str] = set()  # shown once each

    def is_python(self, document: TextDocument) -> bool:
        return document.language_id == "python" or (document.path or "").endswith(_PYTHON_SUFFIXES)

    def refresh(self, uri: str) -> Checked | None:
        """The analysis of the document's current text (redone only when the text or the
        settings changed); None for an excluded or non-Python document, or a broken config."""
        document = self.workspace.get_text_document(uri)
        if not self.is_python(document):
            return None
        fs_path = to_fs_path(uri) if uri.startswith("file:") else None
        path = Path(fs_path) if fs_path else None
        try:
            settings = settings_for(path)  # read again each time: pyproject.toml may have changed
        except ConfigError as exc:
            if str(exc) not in self.config_errors:
                self.config_errors.add(str(exc))
                self.window_show_message(types.ShowMessageParams(type=types.MessageType.Error, message=f"speedfix: {exc}"))
            settings = None
        if settings is None:
            self.checked.pop(uri, None)
            return None
        text = document.source
        previous = self.checked.get(uri)
        if previous is not None and previous.text == text and previous.settings == settings:
            return previous
        self.checked[uri] = checked = check(path, text, settings)
        return checked

    def publish(self, uri: str) -> None:
        checked = self.refresh(uri)
        document = self.workspace.get_text_document(uri)
        found = diagnostics(checked, LineIndex(checked.text, document.position_codec)) if checked else []
        self.text_document_publish_diagnostics(
            types.PublishDiagnosticsParams(uri=uri, diagnostics=found, version=document.version)
        )


server = SpeedfixServer()


@server.feature(types.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: SpeedfixServer, params: types.DidOpenTextDocumentParams) -> None:
    ls.publish(params.text_document.uri)


@server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: SpeedfixServer, params: types.DidChangeTextDocumentParams) -> None:
    ls.publish(params.text_document.uri)


@server.feature(types.TEXT_DOCUMENT_DID_SAVE)
def did_save(ls: SpeedfixServer, params: types.DidSaveTextDocumentParams) -> None:
    ls.publish(params.text_document.uri)


@server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: SpeedfixServer, params: types.DidCloseTextDocumentParams) -> None:
    ls.checked.pop(params.text_document.uri, None)
    ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=params.text_document.uri, diagnostics=[]))


@server.feature(
    types.TEXT_DOCUMENT_CODE_ACTION,
    types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.QuickFix, FIX_ALL_KIND]),
)
def code_action(ls: SpeedfixServer, params: types.CodeActionParams) -> list[types.CodeAction] | None:
    uri = params.text_document.uri
    checked = ls.refresh(uri)
    if checked is None:
        return None
    index = LineIndex(checked.text, ls.workspace.get_text_document(uri).position_codec)
    return code_actions(checked, uri, index, params) or None


def serve() -> None:
    """Speak LSP on standard input and output until the client says exit."""
    server.start_io()
