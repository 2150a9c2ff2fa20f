"""Jupyter notebooks: map a notebook to one Python source and back.

The rules read one Python module, so a notebook is turned into a *virtual source*: its code cells
in order, each followed by a sentinel comment line (``# ~speedfix~ end of cell 4``, where 4 is
the cell's number in the notebook). The sentinels let fixed code be split back into cells even
when a fix inserts or removes lines. Markdown and raw cells are left out; so are all cells of a
notebook whose kernel language is not Python.

Cell numbers shown to users are 1-based positions among *all* cells, markdown included, so they
match the order a notebook UI shows; lines within a cell are 1-based too.

IPython syntax never reaches the parser. Each line that IPython would transform — line magics
(``%time f()``), shell escapes (``!pip install x``), assignments from them (``files = !ls``), help
(``obj?``, ``?obj``), the other escapes (``/f x``, ``,f a``, ``;f a``), line magics written without
their ``%`` (automagic: ``pip install timm``, ``cd /kaggle/working``), backslash-continued lines of
these — becomes a placeholder on the same line: a comment ``# ~speedfix~ magic 7`` at the top
level, and ``pass  # ~speedfix~ magic 7`` when indented, so that a block whose body is only magic
(``if IN_COLAB:`` / ``!pip install ...``) still parses. A cell magic (first non-blank line starts
with ``%%``) whose body is Python (``%%time``, ``%%timeit``, ``%%capture``) keeps its first line as
a placeholder and its body is scanned and fixed like any cell; any other (``%%bash``,
``%%writefile``) turns the whole cell into comment placeholders, is never rewritten, and is named
in the report as skipped (``Notebook.skipped``).
Lines are classified one at a time with a small lexer that carries open brackets, backslash
continuations and open strings (triple-quoted, or single-quoted continued with a backslash) from
line to line: only a line that starts a new logical line can be magic, so text inside a
multi-line string or call is never touched. The lexer does not know Python 3.12 f-strings that
reuse their own quote inside ``{}``; such a line may be misread, which can only turn a magic into
a syntax error, never change code.

``rebuild`` restores every placeholder verbatim (re-indented if a fix re-indented its block) and
rewrites only the code cells whose text changed. A sentinel or placeholder that a fix dropped
(libcst removes a statement together with the comment lines above it) is put back where the
original line was, found with difflib; markers that are duplicated or out of order make the
rebuild fail, and then nothing is written.

The JSON layout is kept: indentation, ``ensure_ascii``, separators, BOM, line endings and the
trailing newline are detected, and a notebook whose unchanged content does not re-serialise to
exactly its own bytes is refused rather than reformatted.
"""

from __future__ import annotations

import ast
import bisect
import difflib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from speedfix.engine.findings import Finding
from speedfix.engine.results import SYNTAX_ERROR_CODE, FileError
from speedfix.syntax.source import (DEFAULT_MAX_FILE_SIZE, SourceError, SourceFile, diff_labels, read_bytes, read_source,
                                    size_limit_text, split_lines)

SENTINEL = "# ~speedfix~ end of cell {}"
PLACEHOLDER = "# ~speedfix~ magic {}"
_SENTINEL_RE = re.compile(r"^[ \t]*# ~speedfix~ end of cell (\d+)[ \t]*$")
_PLACEHOLDER_RE = re.compile(r"^([ \t]*)(?:pass[ \t]+)?# ~speedfix~ magic (\d+)[ \t]*$")

# IPython's escapes: magic, shell, help, and the autocall quote/paren escapes. None of them can
# start a Python statement, so a logical line that starts with one is always IPython syntax.
_ESCAPES = ("%", "!", "?", "/", ",", ";")
_ASSIGN_FROM_MAGIC = re.compile(r"^[ \t]*[\w.]+(?:[ \t]*,[ \t]*[\w.]+)*[ \t]*=[ \t]*[!%]")
# Line magics IPython runs without their `%` (automagic, on by default): `pip install timm` in a
# Kaggle or Colab cell. Such a line is magic only when it is not a useful Python statement
# (`time = 5` is; `cd /kaggle/working` parses as a division that does nothing), and the word is
# not followed by what continues a Python statement (`env = dict(`, `run (`, `time + (`).
_AUTOMAGIC = re.compile(
    r"^(?:pip|conda|mamba|cd|env|set_env|mkdir|rmdir|cp|mv|rm|cat|load_ext|reload_ext|unload_ext|autoreload|"
    r"matplotlib|pylab|time|timeit|run|config|who|whos|history|store|sx|system)[ \t]+(?![-+*%&|^<>@=(\[,:]|$)"
)
_BOM = b"\xef\xbb\xbf"
_LINE_REFERENCE = re.compile(r"\bon line (\d+)\b")
# Cell magics whose body IPython runs as Python code.
PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun"})


class NotebookError(SourceError):
    """A notebook that cannot be read or written back; the message names the problem."""


def is_notebook(path: Path) -> bool:
    return path.suffix.lower() == ".ipynb"


@dataclass
class _CodeCell:
    index: int  # position among all cells, 0-based
    text: str  # the cell's source as stored
    virtual: str  # what the virtual source holds for it (ends with a newline unless empty)
    start: int  # 1-based virtual line of its first line
    cell_magic: bool = False

    @property
    def number(self) -> int:
        return self.index + 1


@dataclass
class _Placeholder:
    original: str  # the line as written, without its newline
    indent: str  # the placeholder's indentation in the virtual source


@dataclass
class CellChange:
    """A code cell that fixing changed: its text before and after."""

    index: int
    before: str
    after: str

    @property
    def number(self) -> int:
        return self.index + 1

    def for_diff(self) -> tuple[str, str]:
        """Both texts ending with a newline, so that a diff shows only what changed."""
        return _terminated(self.before), _terminated(self.after)


@dataclass
class Notebook:
    path: Path
    data: bytes
    content: dict[str, Any]
    cells: list[_CodeCell] = field(default_factory=list)
    placeholders: list[_Placeholder] = field(default_factory=list)
    source: str = ""  # the virtual source
    skipped_cells: list[tuple[int, str]] = field(default_factory=list)  # (cell number, why)
    python: bool = True  # False: the kernel runs another language; no cell is scanned

    @classmethod
    def from_bytes(cls, data: bytes, path: Path) -> Notebook:
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise NotebookError(f"not a notebook: not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
        try:
            content = json.loads(text)
        except json.JSONDecodeError as exc:
            raise NotebookError(f"invalid notebook JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
        except ValueError as exc:  # a number of over 4,300 digits
            raise NotebookError(f"invalid notebook JSON: {exc}") from None
        except RecursionError:
            raise NotebookError("invalid notebook JSON: nested too deeply") from None
        if not isinstance(content, dict):
            raise NotebookError('not a notebook: the JSON is not an object with a "cells" list')
        version = content.get("nbformat")
        if isinstance(version, int) and version < 4:
            raise NotebookError(f"nbformat {version} notebooks are not supported (nbformat 4 or newer is needed)")
        cells = content.get("cells")
        if not isinstance(cells, list):
            raise NotebookError('not a notebook: no "cells" list')
        notebook = cls(Path(path), data, content)
        python = notebook.python = _is_python(content.get("metadata"))
        pieces: list[str] = []
        line = 1
        for index, cell in enumerate(cells):
            if not isinstance(cell, dict):
                raise NotebookError(f"cell {index + 1} is not a JSON object")
            if cell.get("cell_type") != "code" or not python:
                continue
            text = _cell_text(cell, index)
            virtual, cell_magic = notebook._virtual_cell(text)
            if cell_magic:
                magic = next(line for line in split_lines(text) if line.strip()).split()[0]
                notebook.skipped_cells.append((index + 1, f"`{magic}` cell, not Python"))
            notebook.cells.append(_CodeCell(index, text, virtual, line, cell_magic))
            pieces.append(virtual)
            pieces.append(SENTINEL.format(index + 1) + "\n")
            line += len(split_lines(virtual)) + 1
        notebook.source = "".join(pieces)
        return notebook

    # ------------------------------------------------------------------ reading
    def source_file(self) -> SourceFile:
        return SourceFile(path=self.path, data=self.source.encode("utf-8"), text=self.source, encoding="utf-8")

    def position(self, line: int, code: str | None = None) -> tuple[int, int]:
        """The (cell number, line within the cell) of a 1-based line of the virtual source, or of
        ``code``, a fixed version of it (its sentinels say where its cells start)."""
        return _position(line, *self._starts(code))

    def locate(self, findings: list[Finding], code: str | None = None) -> None:
        """Give findings their cell and line within the cell; ``line`` stays the virtual line."""
        starts, numbers = self._starts(code)

        def in_cell(match: re.Match[str]) -> str:
            cell, line = _position(int(match.group(1)), starts, numbers)
            return f"on line {line} of cell {cell}"

        for finding in findings:
            if finding.file is not None:
                continue  # a line of a configuration file the notebook reads
            finding.cell, finding.cell_line = _position(finding.line, starts, numbers)
            if finding.code == SYNTAX_ERROR_CODE:  # the parser's "... on line 3" counts virtual lines
                finding.message = _LINE_REFERENCE.sub(in_cell, finding.message)

    def _starts(self, code: str | None) -> tuple[list[int], list[int]]:
        if code is None or code == self.source:
            return [cell.start for cell in self.cells], [cell.number for cell in self.cells]
        starts, numbers, start = [], [], 1
        for number, line in enumerate(split_lines(code), 1):
            match = _SENTINEL_RE.match(line.rstrip("\r\n"))
            if match is not None:
                starts.append(start)
                numbers.append(int(match.group(1)))
                start = number + 1
        return starts, numbers

    def locate_error(self, error: FileError) -> FileError:
        """Name the cell of an error reported at a virtual line."""
        if error.line is not None and self.cells:
            cell, line = self.position(error.line)
            error.message = f"{error.message} (cell {cell}, line {line})"
        return error

    def skipped(self) -> list[str]:
        """What the report says about the code cells that were not scanned."""
        if not self.python:
            return ["not a Python notebook (its kernel runs another language): no cell was scanned"]
        return [f"cell {number} skipped: {why}" for number, why in self.skipped_cells]

    def _virtual_cell(self, text: str) -> tuple[str, bool]:
        lines = split_lines(text)
        if lines and not lines[-1].endswith(("\n", "\r")):
            lines[-1] += "\n"
        first = next((number for number, line in enumerate(lines) if line.strip()), -1)
        cell_magic = first >= 0 and lines[first].lstrip().startswith("%%")
        if cell_magic and _magic_name(lines[first]) not in PYTHON_CELL_MAGICS:  # the whole cell is not Python
            return "".join(self._placeholder(line, "", statement=False) for line in lines), True
        out: list[str] = []
        lexer = _Lexer()
        magic_continues = False
        for number, line in enumerate(lines):
            if cell_magic and number == first:  # `%%time`: the first line only
                out.append(self._placeholder(line, "", statement=False))
                continue
            if _marker_of(line) is not None:
                raise NotebookError(f"a code cell holds the line {line.strip()!r}, which speedfix uses as a marker")
            if magic_continues or (lexer.at_statement_start and _is_magic(line)):
                indent = line[: len(line) - len(line.lstrip(" \t"))]
                out.append(self._placeholder(line, indent, statement=bool(indent) and not magic_continues))
                magic_continues = line.rstrip("\r\n").endswith("\\")
            else:
                lexer.feed(line)
                out.append(line)
        return "".join(out), False

    def _placeholder(self, line: str, indent: str, *, statement: bool) -> str:
        body = line.rstrip("\r\n")
        newline = line[len(body):] or "\n"
        self.placeholders.append(_Placeholder(body, indent))
        marker = PLACEHOLDER.format(len(self.placeholders) - 1)
        return f"{indent}{'pass  ' if statement else ''}{marker}{newline}"

    # ------------------------------------------------------------------ writing back
    def changes(self, fixed: str) -> list[CellChange]:
        """The code cells that ``fixed`` (the fixed virtual source) changes, magics restored."""
        if fixed == self.source:
            return []
        lines = self._recover_markers(split_lines(fixed))
        texts: dict[int, list[str]] = {}
        current: list[str] = []
        position = 0
        for line in lines:
            sentinel = _SENTINEL_RE.match(line.rstrip("\r\n"))
            if sentinel is not None:
                texts[self.cells[position].index] = current
                position += 1
                current = []
                continue
            placeholder = _PLACEHOLDER_RE.match(line.rstrip("\r\n"))
            if placeholder is not None:
                line = self._restore(placeholder, line)
            current.append(line)
        if "".join(current).strip():
            raise NotebookError("a fix added code after the last cell; left unchanged")
        changed = []
        for cell in self.cells:
            after = "".join(texts[cell.index])
            if not cell.text.endswith(("\n", "\r")) and after.endswith("\n"):
                after = after[:-2] if after.endswith("\r\n") else after[:-1]
            if after == cell.text:
                continue
            if cell.cell_magic:
                raise NotebookError(f"a fix would change cell {cell.number}, a cell magic; left unchanged")
            changed.append(CellChange(cell.index, cell.text, after))
        return changed

    def diff(self, fixed: str, path: str) -> str:
        """A unified diff of the cells ``fixed`` changes, each labelled ``path:cell N``."""
        out = []
        for change in self.changes(fixed):
            before, after = change.for_diff()
            label = f"{path}:cell {change.number}"
            lines = difflib.unified_diff(
                before.splitlines(keepends=True), after.splitlines(keepends=True), *diff_labels(label)
            )
            out.append("".join(lines))
        return "".join(out)

    def rebuild(self, fixed: str) -> bytes:
        """The notebook's bytes with the cells ``fixed`` changes rewritten; all else as it was."""
        changes = self.changes(fixed)
        if not changes:
            return self.data
        dump = self._layout()
        cells = list(self.content["cells"])
        for change in changes:
            cell = cells[change.index]
            # a list of lines split as nbformat splits them, or a string if the file stored one
            source: Any = change.after if isinstance(cell.get("source"), str) else change.after.splitlines(keepends=True)
            cells[change.index] = dict(cell, source=source)
        return dump(dict(self.content, cells=cells))

    def _recover_markers(self, lines: list[str]) -> list[str]:
        """Check the sentinels and placeholders in fixed code; put back the ones a fix dropped."""
        expected = _markers(split_lines(self.source))
        found = _markers(lines)
        if found == expected:
            return lines
        rank = {marker: i for i, marker in enumerate(expected)}
        ranks = [rank.get(marker, -1) for marker in found]
        if -1 in ranks or any(a >= b for a, b in zip(ranks, ranks[1:])):
            raise NotebookError("a fix moved or duplicated a cell boundary or an IPython magic line; left unchanged")
        original = split_lines(self.source)
        missing = set(expected) - set(found)
        inserts: list[tuple[int, int, str]] = []  # (position in fixed, original position, line)
        matcher = difflib.SequenceMatcher(a=original, b=lines, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag == "equal":
                continue
            for i in range(i1, i2):
                marker = _marker_of(original[i])
                if marker in missing:
                    inserts.append((j1 + min(i - i1, j2 - j1), i, original[i]))
        recovered = list(lines)
        for j, _i, line in sorted(inserts, reverse=True):
            recovered.insert(j, line)
        if _markers(recovered) != expected:
            raise NotebookError("a fix removed a cell boundary or an IPython magic line; left unchanged")
        return recovered

    def _restore(self, match: re.Match[str], line: str) -> str:
        placeholder = self.placeholders[int(match.group(2))]
        newline = line[len(line.rstrip("\r\n")):]
        indent = match.group(1)
        if indent == placeholder.indent:
            return placeholder.original + newline
        return indent + placeholder.original.lstrip(" \t") + newline

    def _layout(self) -> Callable[[Any], bytes]:
        """A serialiser that writes this notebook's JSON exactly as it is stored."""
        data = self.data
        bom = _BOM if data.startswith(_BOM) else b""
        text = data[len(bom):].decode("utf-8")
        crlf = "\r\n" in text
        if crlf:
            text = text.replace("\r\n", "\n")
        trailing = text[len(text.rstrip()):]
        indent: int | str | None = None
        match = re.match(r"[\[{]\n([ \t]*)", text)
        if match is not None:
            whitespace = match.group(1)
            indent = whitespace if "\t" in whitespace else len(whitespace)
        ensure_ascii = text.isascii()
        separators = [(",", ": "), (", ", ": ")] if indent is not None else [(", ", ": "), (",", ":")]
        body = text[: len(text) - len(trailing)] if trailing else text
        for separator in separators:
            def dump(content: Any, separator: tuple[str, str] = separator) -> bytes:
                out = json.dumps(content, indent=indent, ensure_ascii=ensure_ascii, separators=separator) + trailing
                return bom + (out.replace("\n", "\r\n") if crlf else out).encode("utf-8")

            if json.dumps(self.content, indent=indent, ensure_ascii=ensure_ascii, separators=separator) == body:
                return dump
        raise NotebookError("cannot reproduce the notebook's JSON layout; left unchanged")


# Outputs (plots, logs) make a notebook file many times bigger than its code: `max-file-size-mb`
# caps the code of a notebook, and the file itself may be this many times the cap.
NOTEBOOK_FILE_FACTOR = 20


def read_cap(path: Path, max_bytes: int | None) -> int | None:
    """How much of ``path`` may be read: the cap, or ``NOTEBOOK_FILE_FACTOR`` times it for a notebook."""
    return max_bytes * NOTEBOOK_FILE_FACTOR if max_bytes is not None and is_notebook(path) else max_bytes


def load_notebook(path: Path, max_bytes: int | None = DEFAULT_MAX_FILE_SIZE) -> Notebook:
    """The notebook at ``path``, whose code cells hold at most ``max_bytes`` (None: no cap)."""
    try:
        data = read_bytes(Path(path), read_cap(Path(path), max_bytes))
    except SourceError as exc:
        raise NotebookError(str(exc)) from None
    notebook = Notebook.from_bytes(data, Path(path))
    if max_bytes is not None and len(notebook.source.encode("utf-8", "surrogatepass")) > max_bytes:
        raise NotebookError(f"skipped: its code is larger than {size_limit_text(max_bytes)} "
                            "(raise `max-file-size-mb` or pass --max-file-size-mb)")
    return notebook


def _is_python(metadata: Any) -> bool:
    """False only when the notebook says its kernel runs another language."""
    if not isinstance(metadata, dict):
        return True
    for key, name in (("language_info", "name"), ("kernelspec", "language")):
        section = metadata.get(key)
        if isinstance(section, dict) and isinstance(section.get(name), str):
            return section[name].lower() == "python"
    return True


def _cell_text(cell: dict[str, Any], index: int) -> str:
    source = cell.get("source", "")
    if isinstance(source, str):
        return source
    if isinstance(source, list) and all(isinstance(part, str) for part in source):
        return "".join(source)
    raise NotebookError(f'cell {index + 1}: "source" is not a string or a list of strings')


def _position(line: int, starts: list[int], numbers: list[int]) -> tuple[int, int]:
    if not starts:
        return 1, line
    at = max(0, bisect.bisect_right(starts, line) - 1)
    return numbers[at], max(1, line - starts[at] + 1)


def _terminated(text: str) -> str:
    return text if not text or text.endswith("\n") else text + "\n"


def _markers(lines: list[str]) -> list[tuple[str, int]]:
    return [marker for marker in map(_marker_of, lines) if marker is not None]


def _marker_of(line: str) -> tuple[str, int] | None:
    body = line.rstrip("\r\n")
    match = _SENTINEL_RE.match(body)
    if match is not None:
        return ("cell", int(match.group(1)))
    match = _PLACEHOLDER_RE.match(body)
    if match is not None:
        return ("magic", int(match.group(2)))
    return None


def _magic_name(line: str) -> str:
    """`%%timeit -n 10` -> `timeit`."""
    words = line.strip()[2:].split()
    return words[0] if words else ""


def _is_magic(line: str) -> bool:
    """Is this line (which starts a logical line) IPython syntax rather than Python?"""
    stripped = line.strip()
    if not stripped or stripped.startswith("#"):
        return False
    if stripped.startswith(_ESCAPES) or _ASSIGN_FROM_MAGIC.match(line):
        return True
    if _AUTOMAGIC.match(stripped) and not _useful_python(stripped):
        return True
    lexer = _Lexer()
    lexer.feed(line)
    return lexer.code.rstrip().endswith("?") and lexer.at_statement_start  # help: ``obj?``, ``obj??``


def _useful_python(line: str) -> bool:
    """Does the line parse as a statement that does something (not a bare `cd / data`)?"""
    try:
        tree = ast.parse(line)
    except (SyntaxError, ValueError):
        return False
    return not (len(tree.body) == 1 and isinstance(tree.body[0], ast.Expr) and isinstance(tree.body[0].value, ast.BinOp))


class _Lexer:
    """Just enough of Python's lexer to know whether the next line starts a logical line."""

    def __init__(self) -> None:
        self.quote: str | None = None  # the open string's delimiter
        self.depth = 0  # open brackets
        self.continued = False  # the last line ended with a backslash
        self.code = ""  # the last line without its comment

    @property
    def at_statement_start(self) -> bool:
        return self.quote is None and self.depth == 0 and not self.continued

    def feed(self, line: str) -> None:
        body = line.rstrip("\r\n")
        code_end = len(body)
        i, n = 0, len(body)
        escaped_newline = False
        while i < n:
            char = body[i]
            if self.quote is not None:
                if char == "\\":
                    escaped_newline = i + 1 == n
                    i += 2
                elif body.startswith(self.quote, i):
                    i += len(self.quote)
                    self.quote = None
                else:
                    i += 1
                continue
            if char == "#":
                code_end = i
                break
            if char in "\"'":
                self.quote = char * 3 if body.startswith(char * 3, i) else char
                i += len(self.quote)
                continue
            if char in "([{":
                self.depth += 1
            elif char in ")]}":
                self.depth = max(0, self.depth - 1)
            i += 1
        self.code = body[:code_end]
        if self.quote is not None and len(self.quote) == 1 and not escaped_newline:
            self.quote = None  # an unterminated string: a syntax error the parser will report
        self.continued = self.quote is None and code_end == n and body.endswith("\\")


def read_python(path: Path, max_bytes: int | None = DEFAULT_MAX_FILE_SIZE) -> tuple[SourceFile, Notebook | None]:
    """The Python source of a file: the file itself, or a notebook's code cells as one module
    (with the notebook, to map positions and write the cells back). Raises SourceError; a file
    over ``max_bytes`` (None: no cap) or that is no regular file is never read."""
    if is_notebook(path):
        notebook = load_notebook(path, max_bytes)
        return notebook.source_file(), notebook
    return read_source(path, max_bytes), None
