"""`speedfix server`: a Language Server (LSP over stdio, built on pygls) for editors.

It is glue only. Findings come from the engine that ``speedfix scan`` runs (``analyze``, on the
editor's text rather than the file on disk), with the settings the CLI would use for the document's
path (the nearest ``[tool.speedfix]``, ``per-file-ignores``, ``exclude`` as with
``--force-exclude``) and ``# noqa`` applied by the engine. A quick fix is the finding's fix made
by ``apply``'s transform (``fixer.apply_fixes``), and "fix all" is ``fix_source``, exactly what
``speedfix apply`` writes.

Published on open, change (full sync) and save; cleared on close. Jupyter notebooks (LSP
``notebookDocument/*``) are not supported: only Python text documents are checked.

The messages are read by ``speedfix.jsonrpc``, not by pygls's own loop, which handles them one by
one as they come. Here a change only marks its document: once every message read so far is
handled (requests answered, in order), the marked documents are analysed in their last
version, and that analysis gives way (``deadline.Cancelled``) as soon as another message comes
in. Thirty quick edits are one analysis, a request never waits behind an analysis of a text
that is already stale, and a request that cannot be handled (not JSON, parameters that do not
fit, after ``shutdown``) gets an error answer. A document the engine cannot take (a lone
surrogate, a path with a NUL) gets a diagnostic that says why, never silence.
"""

from __future__ import annotations

import difflib
import json
import logging
import re
import sys
import threading
from bisect import bisect_right
from dataclasses import dataclass, replace
from functools import cached_property
from itertools import islice
from pathlib import Path
from typing import BinaryIO

from lsprotocol import types
from pygls.io_ import StdoutWriter
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path
from pygls.workspace import TextDocument
from pygls.workspace.position_codec import PositionCodec

from speedfix import __version__
from speedfix.commands.scan import TOO_DEEP, display_path, file_setup, project_links, time_limit_message
from speedfix.engine.analysis import SyntaxProblem, analyze
from speedfix.engine.findings import Applicability, Finding, Fix, Severity
from speedfix.engine.registry import rule_by_code
from speedfix.engine.results import Analysis, FileError
from speedfix.fixes.fixer import FixError, allowed, apply_fixes, fix_source, op_node
from speedfix.jsonrpc import INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR, Frame, Inbox, Oversized, error_frame
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
        project, version = file_setup(self.settings, self.source.path)
        try:
            outcome = fix_source(self.source, self.path, rules, version, unsafe=unsafe, project=project)
        except (SyntaxProblem, FixError, RecursionError) as exc:
            log.warning("fix all: %s", exc)
            return None
        return outcome.code if outcome.changed and outcome.code != self.text else None


def source_from_text(path: Path, text: str) -> SourceFile:
    """The editor's text as the engine would read the file: encoded as its coding cookie says.
    Raises SourceError for text no file can hold (a lone surrogate, which JSON can carry)."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        line = text.count("\n", 0, exc.start) + 1
        raise SourceError(f"line {line}: the text holds {text[exc.start]!a}, a lone surrogate, which no file can hold") from None
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
    try:
        source = source_from_text(file, text)
    except SourceError as exc:
        return Checked(text, SourceFile(file, b"", text, "utf-8"), shown, settings, Analysis(shown, error=FileError(shown, str(exc))))
    links = links_for(path, source.data, settings) if path is not None else None
    try:
        # the same per-file limit as `scan`: a pathological buffer must not block the editor
        with deadline.time_limit(settings.file_time_limit):
            project, version = file_setup(settings, file)
            analysis = analyze(source, shown, settings.rules_for(file), version, links, project)
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
        message=f"{finding.message} (impact: {finding.impact.value})",
        data={"impact": finding.impact.value},
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
    """The highest impact first, as `speedfix scan` lists them; none below `min-impact`. A finding
    about a configuration file the script reads belongs to that file, not this buffer."""
    wanted = [f for f in checked.analysis.findings
              if f.file is None and f.impact.at_least(checked.settings.min_impact)]
    found = [diagnostic(finding, index) for finding in sorted(wanted, key=lambda f: f.impact_key)]
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
        self.pending: dict[str, None] = {}  # uris to analyse and publish, oldest first
        self.arrived = threading.Event()  # set while messages wait: the work in hand gives way
        self.shut_down = False
        self.output: BinaryIO | None = None  # where answers go (standard output)

    def is_python(self, document: TextDocument) -> bool:
        return document.language_id == "python" or (document.path or "").endswith(_PYTHON_SUFFIXES)

    def refresh(self, uri: str) -> Checked | None:
        """The analysis of the document's current text (redone only when the text or the
        settings changed); None for an excluded or non-Python document, or a broken config."""
        document = self.workspace.get_text_document(uri)
        if not self.is_python(document):
            return None
        path = document_path(uri)
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
        document = self.workspace.get_text_document(uri)
        try:
            checked = self.refresh(uri)
            found = diagnostics(checked, LineIndex(checked.text, document.position_codec)) if checked else []
        except (deadline.Cancelled, KeyboardInterrupt):
            raise
        except Exception as exc:  # a document is never dropped in silence
            log.exception("%s: the analysis failed", uri)
            failed = FileError(uri, f"{type(exc).__name__}: {exc}")
            found = [error_diagnostic(failed, LineIndex(document.source, document.position_codec))]
        self.text_document_publish_diagnostics(
            types.PublishDiagnosticsParams(uri=uri, diagnostics=found, version=document.version)
        )

    def work(self) -> None:
        """Analyse and publish the changed documents, until a message comes in."""
        while self.pending and not self.arrived.is_set():
            uri = next(iter(self.pending))
            try:
                with deadline.cancelled_by(self.arrived):
                    self.publish(uri)
            except deadline.Cancelled:
                return  # the document stays pending: its text may be changing still
            self.pending.pop(uri, None)

    def receive(self, frame: Frame) -> int | None:
        """Handle one message; the exit code once the client says ``exit``."""
        if isinstance(frame, Oversized):
            self.answer_error(frame.request_id(), INVALID_REQUEST, f"a message of {frame.size:,} bytes is over the limit")
            return None
        try:
            data = json.loads(frame)
        except (ValueError, RecursionError) as exc:
            self.answer_error(None, PARSE_ERROR, f"not JSON: {exc}")
            return None
        if not isinstance(data, dict):
            self.answer_error(None, INVALID_REQUEST, "a message must be a JSON object")
            return None
        method, request = data.get("method"), "id" in data and "method" in data
        if method == types.EXIT:
            return 0 if self.shut_down else 1  # as LSP says: 1 without a shutdown request first
        if self.shut_down:
            if request:
                self.answer_error(data["id"], INVALID_REQUEST, "the server is shutting down")
            return None
        try:
            message = self.protocol.structure_message(data)
        except Exception as exc:  # parameters that do not fit the method (a negative line)
            if request:
                self.answer_error(data["id"], INVALID_PARAMS, f"invalid parameters for {method}: {exc.__cause__ or exc}")
            return None
        self.protocol.handle_message(message)
        if method == types.SHUTDOWN:
            self.shut_down = True
        return None

    def answer_error(self, request_id: object, code: int, message: str) -> None:
        if self.output is not None and (isinstance(request_id, (int, str)) or request_id is None):
            self.output.write(error_frame(request_id, code, message))
            self.output.flush()

    def serve(self, stdin: BinaryIO, stdout: BinaryIO) -> int:
        """Answer the messages of ``stdin`` on ``stdout`` until ``exit``; the exit code."""
        self.output = stdout
        self.protocol.set_writer(StdoutWriter(stdout))
        inbox = Inbox(stdin)
        self.arrived = inbox.arrived
        while True:
            frames = inbox.batch()
            if frames is None:  # the client went away
                return 0 if self.shut_down else 1
            for frame in frames:
                code = self.receive(frame)
                if code is not None:
                    return code
            self.work()


def document_path(uri: str) -> Path | None:
    """The file of a ``file:`` URI; None for another scheme, or a path no file can have (a NUL)."""
    fs_path = to_fs_path(uri) if uri.startswith("file:") else None
    return Path(fs_path) if fs_path and "\x00" not in fs_path else None


server = SpeedfixServer()


def _changed(ls: SpeedfixServer, uri: str) -> None:
    ls.pending.pop(uri, None)
    ls.pending[uri] = None  # analysed once the messages read so far are handled


@server.feature(types.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: SpeedfixServer, params: types.DidOpenTextDocumentParams) -> None:
    _changed(ls, params.text_document.uri)


@server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: SpeedfixServer, params: types.DidChangeTextDocumentParams) -> None:
    _changed(ls, params.text_document.uri)


@server.feature(types.TEXT_DOCUMENT_DID_SAVE)
def did_save(ls: SpeedfixServer, params: types.DidSaveTextDocumentParams) -> None:
    _changed(ls, params.text_document.uri)


@server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: SpeedfixServer, params: types.DidCloseTextDocumentParams) -> None:
    ls.pending.pop(params.text_document.uri, None)
    ls.checked.pop(params.text_document.uri, None)
    ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=params.text_document.uri, diagnostics=[]))


@server.feature(
    types.TEXT_DOCUMENT_CODE_ACTION,
    types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.QuickFix, FIX_ALL_KIND]),
)
def code_action(ls: SpeedfixServer, params: types.CodeActionParams) -> list[types.CodeAction] | None:
    uri = params.text_document.uri
    try:
        with deadline.cancelled_by(ls.arrived):  # stale once the next message is in
            checked = ls.refresh(uri)
            if checked is None:
                return None
            index = LineIndex(checked.text, ls.workspace.get_text_document(uri).position_codec)
            return code_actions(checked, uri, index, params) or None
    except deadline.Cancelled:
        return None


def serve() -> int:
    """Speak LSP on standard input and output until the client says exit; the exit code."""
    return server.serve(sys.stdin.buffer, sys.stdout.buffer)
