"""libcst parsing whose cost grows linearly with the file, and never hangs.

libcst's parser has costs that grow faster than the input, and a parse cannot be interrupted:

- a chain of N operators, attributes or calls (``a + b + ... ``, ``f()()()``, ``a.b.c...``) is a
  tree N levels deep, and parsing it costs about N². Python's own parser measures the nesting
  first (``speedfix.syntax.nesting``): code nested deeper than ``MAX_DEPTH`` is refused with a
  ``NestingTooDeep`` error naming the line, before libcst ever sees it, and
  ``room_for_deep_trees`` gives libcst's recursive visitors the Python frames the accepted depth
  needs;
- one parse of a whole multi-megabyte module costs more per byte than parses of its parts (2 MB:
  17 s in one piece, 13 s in 64 KB pieces). A module over ``CHUNK_FROM``, or with nesting work
  over ``CHUNK_WORK`` (a few expressions nested a thousand deep), is therefore parsed in chunks of
  whole top-level statements, cut only where the lines between two statements are empty or
  column-0 comments (there libcst gives them to the next statement, whatever precedes it), and
  the chunks are joined into the ``Module`` a single parse would have built. A test compares the
  two trees with ``deep_equals``. Chunks that disagree on the default indentation or newline fall
  back to one parse. The per-file time limit is checked between chunks;
- a statement is parsed in one piece, and libcst's memory for it is several hundred times its
  size. A statement over ``MAX_PIECE_BYTES`` or ``MAX_STATEMENT_WORK`` (a 4 MB training function
  of nested sums ran out of memory at 6 GB and aborted the process), or a file that cannot be cut
  and is over ``MAX_PIECE_BYTES``, is refused (``TooBigToParse``) before libcst sees it.

A syntax error found by ``ast`` is raised as libcst's ``ParserSyntaxError`` without running
libcst, so callers keep one error path. Code that ``ast`` accepts is built by libcst without
its per-node checks (``_parser_output_trusted``).
"""

from __future__ import annotations

import dataclasses
import re
import sys
import tokenize
from contextlib import contextmanager
from typing import Callable, Iterator

import libcst as cst
from libcst import ParserSyntaxError

from speedfix.syntax.collector import collector_paused
from speedfix.syntax.nesting import MAX_DEPTH, NestingTooDeep, bound_by_tokens, line_starts
from speedfix.syntax.pyast import Measured, decode, measure_text, python_ast
from speedfix.syntax.source import split_lines
from speedfix.syntax.walk import child_nodes
# libcst's visitors, transformers and code generation recurse: up to 4 Python frames per level
# of the tree (5 here, with a margin), for MAX_DEPTH levels of expressions and elifs plus the
# indented blocks (Python allows 100) and statements around them.
DEEP_TREES_RECURSION_LIMIT = 1000 + 5 * (MAX_DEPTH + 200)
# Modules smaller than this are parsed in one piece, exactly as libcst does it.
CHUNK_FROM = 256 * 1024
CHUNK_SIZE = 64 * 1024
# A chunk also ends once it holds this much nesting work (squared depths: three expressions
# nested 1,000 deep, about a second of libcst's time), so that the time limit is checked.
CHUNK_WORK = 3 * MAX_DEPTH**2
# What libcst may parse in one piece: bytes (libcst needs 300 to 750 bytes of memory per byte:
# measured 789 MB for a 2.8 MB list literal, 318 MB for 0.4 MB of nested sums in a function),
# and nesting work (40 expressions nested 1,000 deep: about 5 s).
MAX_PIECE_BYTES = 2 * 1024 * 1024
MAX_STATEMENT_WORK = 40 * MAX_DEPTH**2


class TooBigToParse(Exception):
    """A statement (or a file that cannot be cut into statements) that libcst would parse in one
    piece, with more memory or time than is reasonable; ``line``: where it starts."""

    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.line = line

_GAP_LINE = re.compile(r"(?:#[^\r\n]*)?(?:\r\n|\r|\n)?")


def parse_module(
    data: bytes | str,
    *,
    max_depth: int = MAX_DEPTH,
    chunk_from: int = CHUNK_FROM,
    chunk_size: int = CHUNK_SIZE,
    between_chunks: Callable[[], None] | None = None,
    measured: Measured | None = None,
) -> cst.Module:
    """``libcst.parse_module(data)``, linear in the size of ``data`` (see the module docstring).

    ``between_chunks`` is called before each chunk is parsed (a deadline check). ``measured``:
    what Python's parser measured of these bytes already (``pyast.parsed``; taken only with the
    default ``max_depth``), instead of parsing them with it again."""
    encoding, text = _decode(data)
    if measured is not None and max_depth == MAX_DEPTH and measured.of(data):
        lines = split_lines(text)
        statements, works = list(measured.statements), list(measured.works)
    else:
        try:
            tree = python_ast(text)
        except SyntaxError as exc:
            newer = _newer_syntax(data, text, max_depth)  # `type X = ...` under Python 3.11
            if newer is not None:
                return newer
            raise ParserSyntaxError(
                exc.msg or "invalid syntax", lines=text.splitlines() or [""],
                raw_line=exc.lineno or 1, raw_column=max((exc.offset or 1) - 1, 0),
            ) from None
        except ValueError as exc:  # NUL bytes (before Python 3.12)
            raise ParserSyntaxError(str(exc), lines=[""], raw_line=1, raw_column=0) from None
        except (RecursionError, MemoryError):
            raise NestingTooDeep("Python's own parser gives up on it") from None
        # (first line, last line) of each top-level statement; the ast itself can go now.
        lines, statements, works = measure_text(text, tree, max_depth)
        del tree
    offsets = line_starts(lines)
    _check_pieces(statements, works, offsets)
    with collector_paused(), _parser_output_trusted():
        module = None
        if len(text) >= chunk_from or sum(works) > CHUNK_WORK:
            module = _parse_in_chunks(statements, works, lines, offsets, chunk_size, between_chunks)
        if module is None and offsets[-1] > MAX_PIECE_BYTES:
            raise TooBigToParse(f"the file ({_size(offsets[-1])}) cannot be cut into statements that libcst parses one "
                                f"by one, and one parse would take {_size(offsets[-1] * 750)} of memory or more; "
                                f"the limit is {_size(MAX_PIECE_BYTES)}", 1)
        module = cst.parse_module(data) if module is None else module.with_changes(encoding=encoding)
    global _last_parsed
    _last_parsed = (text, [first for first, _ in statements])
    return module


# The text last parsed, and the first line of each of its top-level statements as ast numbers
# them (one entry per ast statement: `a = 1; b = 2` is two), so that positions are computed
# without parsing the file with ast a second time (a tenth of a big file's scan).
_last_parsed: tuple[str, list[int]] | None = None


def statement_first_lines(text: str) -> list[int] | None:
    """What ``parse_module`` recorded for ``text``, if it was the last text parsed."""
    last = _last_parsed
    return last[1] if last is not None and last[0] == text else None


@contextmanager
def _parser_output_trusted() -> Iterator[None]:
    """While libcst parses code that Python's own parser accepted, its nodes are not checked
    one by one. Every node libcst constructs checks itself (``CSTNode._validate``: that
    parentheses pair up, that a keyword has the spaces it needs); for the parser's own output
    that is redundant (libcst's comment on it says so) and costs a seventh of the parse. The
    nodes that fixes build afterwards are checked as always.

    The parser calls each node class with its fields, a few hundred thousand times a scan;
    ``_install_constructors`` gives the node classes constructors that set the fields as the
    dataclass's own does and skip the check (and its call) in here; the other classes' check
    (``CSTNode.__post_init__``) is replaced once by one that skips it in here (assigning a class
    attribute on every parse would empty the interpreter's method caches of every node class)."""
    if not _CONSTRUCTORS_INSTALLED:
        _install_constructors()
    trusted, _TRUSTED[0] = _TRUSTED[0], True
    try:
        yield
    finally:
        _TRUSTED[0] = trusted


def _checked_unless_trusted(self: cst.CSTNode) -> None:
    """``CSTNode.__post_init__``, skipped while the parser's output is trusted."""
    if not _TRUSTED[0]:
        self._validate()


# Set while the parser's output is trusted: the installed constructors skip the node's check.
_TRUSTED = [False]
_CONSTRUCTORS_INSTALLED = False
DATACLASS_CONSTRUCTORS: dict[type, Callable[..., None]] = {}  # what the installed ones replaced
_FREQUENT_NODES = (
    cst.SimpleWhitespace, cst.Name, cst.Newline, cst.TrailingWhitespace, cst.Arg, cst.Dot, cst.Attribute,
    cst.SimpleStatementLine, cst.Call, cst.Comma, cst.EmptyLine, cst.AssignTarget, cst.Assign, cst.AssignEqual,
    cst.SimpleString, cst.Integer, cst.Expr, cst.IndentedBlock, cst.Comment, cst.ParenthesizedWhitespace,
)


def _install_constructors() -> None:
    """Replace the dataclass-generated ``__init__`` of libcst's node classes by one that sets the
    same fields with the same defaults through the classes' slots, and calls ``__post_init__``
    (the node's check) unless the parser's output is trusted: it is what the generated one does,
    less an attribute lookup per field. Only for the classes the parser builds most (compiling a
    constructor costs a tenth of a millisecond; these twenty make 92% of the nodes of the
    pytorch/examples and nanoGPT scripts). A class whose ``__init__`` is not dataclass-generated,
    or whose fields are not plain slots, keeps its own (a test compares the trees both build)."""
    global _CONSTRUCTORS_INSTALLED
    _CONSTRUCTORS_INSTALLED = True
    cst.CSTNode.__post_init__ = _checked_unless_trusted  # type: ignore[method-assign]
    for cls in _FREQUENT_NODES:
        constructor = _constructor(cls)
        if constructor is not None:
            DATACLASS_CONSTRUCTORS[cls] = cls.__init__  # type: ignore[misc]
            cls.__init__ = constructor  # type: ignore[misc]


def _constructor(cls: type) -> Callable[..., None] | None:
    init = cls.__dict__.get("__init__")
    if init is None or not dataclasses.is_dataclass(cls) or getattr(init, "__code__", None) is None \
            or init.__code__.co_filename != "<string>":
        return None  # not the dataclass's own constructor
    namespace: dict[str, object] = {"_TRUSTED": _TRUSTED, "_MISSING": dataclasses.MISSING}
    parameters, lines = [], []
    for number, field in enumerate(dataclasses.fields(cls)):
        slot = cls.__dict__.get(field.name)
        if not field.init or field.kw_only or type(slot).__name__ != "member_descriptor" or not field.name.isidentifier():
            return None
        namespace[f"_set{number}"] = slot.__set__
        value = field.name
        if field.default is not dataclasses.MISSING:
            namespace[f"_default{number}"] = field.default
            parameters.append(f"{field.name}=_default{number}")
        elif field.default_factory is not dataclasses.MISSING:
            namespace[f"_factory{number}"] = field.default_factory
            parameters.append(f"{field.name}=_MISSING")
            value = f"_factory{number}() if {field.name} is _MISSING else {field.name}"
        else:
            parameters.append(field.name)
        lines.append(f"    _set{number}(self, {value})")
    lines.append("    if not _TRUSTED[0]:\n        self.__post_init__()")
    exec(f"def __init__(self, {', '.join(parameters)}):\n" + "\n".join(lines), namespace)  # noqa: S102
    constructor = namespace["__init__"]
    constructor.__qualname__ = init.__qualname__  # type: ignore[attr-defined]
    constructor.__doc__ = init.__doc__
    return constructor  # type: ignore[return-value]


@contextmanager
def room_for_deep_trees() -> Iterator[None]:
    """Raise Python's recursion limit (1,000 frames by default) so that libcst can walk, transform
    and print every tree ``parse_module`` accepts; a tree of a few hundred levels would
    otherwise stop ``apply`` with a RecursionError. 7,000 frames stay far from the C stack's
    end (Python 3.10, where each frame takes C stack, crashes near 28,000)."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, DEEP_TREES_RECURSION_LIMIT))
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


def _decode(data: bytes | str) -> tuple[str, str]:
    """(encoding, text) as libcst decodes them: BOM or coding cookie, else UTF-8."""
    if isinstance(data, str):
        return "utf-8", data
    try:
        return decode(data)
    except (SyntaxError, UnicodeDecodeError, LookupError) as exc:
        raise ParserSyntaxError(f"cannot decode the file: {exc}", lines=[""], raw_line=1, raw_column=0) from None


# ------------------------------------------------------------------ newer syntax
# Nodes of a grammar newer than the interpreter that runs speedfix: type aliases and parameters
# (3.12), template strings (3.14), `except*` (3.11).
_NEWER_NODES: tuple[type[cst.CSTNode], ...] = (cst.TypeAlias, cst.TypeParameters, cst.TemplatedString)
if sys.version_info < (3, 11):
    _NEWER_NODES += (cst.TryStar,)


def _newer_syntax(data: bytes | str, text: str, max_depth: int) -> cst.Module | None:
    """The module, when Python's parser refused code that libcst's grammar (Python 3.0 to 3.14)
    takes and the code uses syntax newer than this interpreter's; None otherwise (the
    interpreter's syntax error stands). Python 3.12 code analysed with Python 3.11 gets its
    findings, not an SF000. Raises NestingTooDeep when the code may be too deep for libcst."""
    if len(text) > MAX_PIECE_BYTES:  # parsed in one piece
        raise TooBigToParse(f"the file ({_size(len(text))}) is written for a newer Python than this one, and is parsed "
                            f"in one piece; the limit is {_size(MAX_PIECE_BYTES)}", 1)
    try:
        bound_by_tokens(text, max_depth)  # no ast to measure the nesting with
        with collector_paused():
            module = cst.parse_module(data)
    except (ParserSyntaxError, tokenize.TokenError, SyntaxError):
        return None
    todo: list[cst.CSTNode] = [module]
    while todo:
        node = todo.pop()
        if isinstance(node, _NEWER_NODES) or (isinstance(node, cst.FormattedString) and _newer_f_string(node)):
            return module
        todo.extend(child_nodes(node))
    return None


def newer_syntax(data: bytes | str) -> bool:
    """Python's parser refuses ``data`` because it is written for a newer Python (see
    ``_newer_syntax``); raises NestingTooDeep when it may be too deep to tell."""
    try:
        return _newer_syntax(data, _decode(data)[1], MAX_DEPTH) is not None
    except ParserSyntaxError:  # cannot be decoded
        return False


def _newer_f_string(node: cst.FormattedString) -> bool:
    """An f-string only Python 3.12 reads (the same quotes inside, a backslash or a comment in
    a replacement field)."""
    try:
        python_ast(cst.Module([]).code_for_node(node))
    except SyntaxError:
        return True
    return False


# ------------------------------------------------------------------ what one parse may hold
def _check_pieces(statements: list[tuple[int, int]], works: list[int], offsets: list[int]) -> None:
    """Raise TooBigToParse for a top-level statement libcst would parse with too much memory or
    time (it parses a statement in one piece, and nothing interrupts it)."""
    for (first, last), work in zip(statements, works):
        size = offsets[min(last, len(offsets) - 1)] - offsets[first - 1]
        where = f"lines {first:,}-{last:,} are one statement"
        if size > MAX_PIECE_BYTES:
            raise TooBigToParse(f"{where} of {_size(size)}: libcst parses a statement in one piece, with "
                                f"{_size(size * 300)} to {_size(size * 750)} of memory; the limit is "
                                f"{_size(MAX_PIECE_BYTES)}", first)
        if work > MAX_STATEMENT_WORK:
            raise TooBigToParse(f"{where} whose expressions nest as much as {work / MAX_DEPTH**2:,.0f} expressions "
                                f"{MAX_DEPTH:,} levels deep (libcst's parse of a statement costs the square of its "
                                f"nesting, and nothing interrupts it); the limit is "
                                f"{MAX_STATEMENT_WORK // MAX_DEPTH**2:,} such expressions", first)


def _size(size: float) -> str:
    return f"{size / 1024 / 1024:,.1f} MB" if size >= 100 * 1024 else f"{size / 1024:,.0f} KB"


# ------------------------------------------------------------------ chunks
def _parse_in_chunks(
    statements: list[tuple[int, int]], works: list[int], lines: list[str], offsets: list[int], chunk_size: int,
    between_chunks: Callable[[], None] | None,
) -> cst.Module | None:
    """The module parsed chunk by chunk and joined, or None when the chunks disagree."""
    cuts = _cuts(statements, works, lines, offsets, chunk_size)
    if not cuts:
        return None
    pieces: list[cst.Module] = []
    bounds = [0, *cuts, len(lines)]
    for start, end in zip(bounds, bounds[1:]):
        if between_chunks is not None:
            between_chunks()
        pieces.append(cst.parse_module("".join(lines[start:end])))
    first = pieces[0]
    if any(
        piece.default_indent != first.default_indent or piece.default_newline != first.default_newline
        for piece in pieces
    ):
        return None
    statements: list[cst.BaseStatement] = list(first.body)
    for piece in pieces[1:]:
        if not piece.body:
            return None
        # At the start of a chunk, libcst puts the lines above the first statement in the
        # module header; in the whole module they lead that statement.
        head, *rest = piece.body
        statements.append(head.with_changes(leading_lines=[*piece.header, *head.leading_lines]))
        statements.extend(rest)
    last = pieces[-1]
    return first.with_changes(body=statements, footer=last.footer, has_trailing_newline=last.has_trailing_newline)


def _cuts(
    statements: list[tuple[int, int]], works: list[int], lines: list[str], offsets: list[int], chunk_size: int
) -> list[int]:
    """0-based indexes of the lines where a new chunk starts: right after a statement's last
    line, once the chunk holds ``chunk_size`` bytes or ``CHUNK_WORK`` of nesting work, where the
    gap is clean (``_clean_gap``)."""
    cuts: list[int] = []
    chunk_start = 0
    work = 0  # in the chunk so far
    previous_end: int | None = None  # 0-based index of the line after the previous statement
    for (first, last), statement_work in zip(statements, works):
        start = first - 1
        if (
            previous_end is not None
            and (offsets[start] - offsets[chunk_start] >= chunk_size or work >= CHUNK_WORK)
            and _clean_gap(lines, previous_end, start)
        ):
            cuts.append(previous_end)
            chunk_start, work = previous_end, 0
        previous_end = last
        work += statement_work
    return cuts


def _clean_gap(lines: list[str], start: int, end: int) -> bool:
    """Lines ``start`` to ``end`` (exclusive) are empty or column-0 comments, and the line
    before them ends a statement (no backslash continuation, no `;` joined statement)."""
    if start > end or start == 0:
        return False
    before = lines[start - 1].rstrip("\r\n")
    if before.endswith("\\"):
        return False
    return all(_GAP_LINE.fullmatch(line) for line in lines[start:end])
