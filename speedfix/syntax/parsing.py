"""libcst parsing whose cost grows linearly with the file, and never hangs.

libcst's parser has two costs that grow faster than the input:

- a chain of N operators, attributes or calls (``a + b + ... ``, ``f()()()``, ``a.b.c...``) is a
  tree N levels deep, and parsing it costs about N² (1,000 terms: 0.3 s; 2,000: 1.5 s; a
  20,000-term generated expression does not finish). Python's own parser (``ast``, in C, a few
  milliseconds) measures the nesting first, and code nested deeper than ``MAX_DEPTH`` is refused
  with a ``NestingTooDeep`` error naming the line, before libcst ever sees it. The nesting is
  counted as libcst builds it, where ``and`` chains, dotted names and ``elif`` chains are deep
  (its native parser crashes the process on about 6,000 levels), and ``room_for_deep_trees``
  gives libcst's recursive visitors the Python frames the accepted depth needs;
- one parse of a whole multi-megabyte module costs more per byte than parses of its parts (2 MB:
  17 s in one piece, 13 s in 64 KB pieces). A module over ``CHUNK_FROM`` is therefore parsed in
  chunks of whole top-level statements, cut only where the lines between two statements are
  empty or column-0 comments (there libcst gives them to the next statement, whatever precedes
  it), and the chunks are joined into the ``Module`` a single parse would have built. A test
  compares the two trees with ``deep_equals``. Chunks that disagree on the default indentation or
  newline fall back to one parse.

A syntax error found by ``ast`` is raised as libcst's ``ParserSyntaxError`` without running
libcst, so callers keep one error path.
"""

from __future__ import annotations

import ast
import gc
import io
import re
import sys
import tokenize
import warnings
from contextlib import contextmanager
from typing import Callable, Iterator

import libcst as cst
from libcst import ParserSyntaxError

from speedfix.syntax.source import split_lines
from speedfix.syntax.walk import child_nodes

# Deeper expressions are refused (libcst's cost per expression grows with the square of this).
MAX_DEPTH = 1000
# libcst's visitors, transformers and code generation recurse: up to 4 Python frames per level
# of the tree (5 here, with a margin), for MAX_DEPTH levels of expressions and elifs plus the
# indented blocks (Python allows 100) and statements around them.
DEEP_TREES_RECURSION_LIMIT = 1000 + 5 * (MAX_DEPTH + 200)
# Modules smaller than this are parsed in one piece, exactly as libcst does it.
CHUNK_FROM = 256 * 1024
CHUNK_SIZE = 64 * 1024

_GAP_LINE = re.compile(r"(?:#[^\r\n]*)?(?:\r\n|\r|\n)?")


class NestingTooDeep(RecursionError):
    """Code nested deeper than libcst can parse in reasonable time (a RecursionError, so that
    callers treat it as the interpreter's own "too deeply nested" failure); ``line``: where, when
    known."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.line = line


def python_ast(source: str | bytes, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse`` without its SyntaxWarnings (``"a" "b"()``, ``x is 1``): they are about the
    user's code, and speedfix is not the place that prints them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        return ast.parse(source, filename=filename)


def parse_module(
    data: bytes | str,
    *,
    max_depth: int = MAX_DEPTH,
    chunk_from: int = CHUNK_FROM,
    chunk_size: int = CHUNK_SIZE,
    between_chunks: Callable[[], None] | None = None,
) -> cst.Module:
    """``libcst.parse_module(data)``, linear in the size of ``data`` (see the module docstring).

    ``between_chunks`` is called before each chunk is parsed (a deadline check)."""
    encoding, text = _decode(data)
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
    lines = split_lines(text)
    _check_depth(tree, lines, max_depth)
    # (first line, last line) of each top-level statement; the ast itself can go now.
    statements = [(first_line(node), node.end_lineno or node.lineno) for node in tree.body]
    del tree
    with collector_paused():
        module = None
        if len(text) >= chunk_from:
            module = _parse_in_chunks(statements, lines, chunk_size, between_chunks)
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
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a file's tree is built and analysed.

    A parse allocates millions of nodes, none of them in a reference cycle; every collection
    would walk all the nodes built so far (a third of a 2 MB parse's time, a fifth of a scan's).
    The few cycles made meanwhile are collected once it is enabled again."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


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
        encoding = tokenize.detect_encoding(io.BytesIO(data).readline)[0]
        return encoding, data.decode(encoding)
    except (SyntaxError, UnicodeDecodeError, LookupError) as exc:
        raise ParserSyntaxError(f"cannot decode the file: {exc}", lines=[""], raw_line=1, raw_column=0) from None


# ------------------------------------------------------------------ nesting depth
def _check_depth(tree: ast.Module, lines: list[str], limit: int) -> None:
    """Raise NestingTooDeep when code is nested deeper than ``limit`` in libcst's tree.

    libcst nests what ``ast`` keeps flat: ``a and b and c`` is ``(a and b) and c``, a dotted name
    (``import a.b.c``) is attributes in attributes, ``"a" "b" "c"`` is a concatenation in a
    concatenation, each ``for`` of a comprehension is inside the one before, and each ``elif``
    inside the ``if`` above it. Those count here too: libcst's native parser crashes the process
    (a segmentation fault, not an exception) on about 6,000 of them. Only expressions long enough
    to reach the limit are walked (each level of nesting takes at least one character), so
    ordinary code costs one look per statement."""
    starts = _line_starts(lines)
    todo: list[tuple[ast.AST, int]] = [(statement, 0) for statement in tree.body]
    while todo:
        node, blocks = todo.pop()  # blocks: the statements around this one
        if blocks > limit:
            raise _too_deep(getattr(node, "lineno", 1), blocks, limit, "blocks")
        if isinstance(node, ast.ImportFrom) and node.module:
            _check_name(node.module, node.lineno, blocks, limit)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                todo.append((child, blocks + 1))
            elif isinstance(child, ast.expr):
                if blocks + _span(child, starts) > limit:
                    depth, line = _depth(child, lines, starts, limit - blocks)
                    if blocks + depth > limit:
                        what = "blocks and expressions" if blocks else "expressions"
                        raise _too_deep(line, blocks + depth, limit, what)
            elif isinstance(child, ast.alias):
                _check_name(child.name, getattr(child, "lineno", node.lineno), blocks, limit)  # type: ignore[attr-defined]
            else:  # handlers, match cases, arguments, ...
                todo.append((child, blocks))


def _too_deep(line: int, depth: int, limit: int, what: str) -> NestingTooDeep:
    return NestingTooDeep(f"line {line} nests {depth:,} {what}; the limit is {limit:,}", line)


def _check_name(name: str, line: int, blocks: int, limit: int) -> None:
    """An imported dotted name: libcst nests each ``.`` as an attribute."""
    if blocks + len(name) > limit and blocks + name.count(".") + 1 > limit:
        raise _too_deep(line, blocks + name.count(".") + 1, limit, "names")


def _line_starts(lines: list[str]) -> list[int]:
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line.encode("utf-8", "surrogatepass")))
    return starts


def _span(node: ast.expr, starts: list[int]) -> int:
    """An upper bound of the expression's length in characters (UTF-8 bytes from the start of
    its first line)."""
    end_line = node.end_lineno or node.lineno
    if end_line == node.lineno:
        return (node.end_col_offset or 0) - node.col_offset
    last = min(end_line, len(starts) - 1)
    return starts[last - 1] + (node.end_col_offset or 0) - starts[node.lineno - 1]


_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)


def _depth(root: ast.expr, lines: list[str], starts: list[int], limit: int) -> tuple[int, int]:
    """(how many expressions are nested in ``root`` in libcst's tree, at most, counting it; the
    line where the deepest is), without recursion. Keywords, comprehensions and the like are
    passed through without counting, as are contexts and operators. Literals are only looked
    into where they could take the count over ``limit``."""
    deepest, where = 0, root.lineno
    todo: list[tuple[ast.AST, int]] = [(root, 1)]
    while todo:
        node, depth = todo.pop()
        # "a" "b" "c" is a concatenation in a concatenation (each literal takes 2 characters)
        if isinstance(node, (ast.Constant, ast.JoinedStr)) and depth + _span(node, starts) // 2 > limit:
            depth += _string_parts(node, lines) - 1
        if depth > deepest:
            deepest, where = depth, getattr(node, "lineno", where)
        # `a and b and c` is ((a and b) and c): the first operand is len(values) - 1 levels down
        below = depth + len(node.values) - 1 if isinstance(node, ast.BoolOp) else depth + 1
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                if not (isinstance(node, ast.JoinedStr) and isinstance(child, ast.Constant)):  # its own text
                    todo.append((child, below))
            elif not isinstance(child, (ast.expr_context, ast.operator, ast.unaryop, ast.cmpop, ast.boolop, ast.comprehension)):
                todo.append((child, depth))
        if isinstance(node, _COMPREHENSIONS):  # each `for` is inside the one before it
            todo.extend((generator, depth + index) for index, generator in enumerate(node.generators))
    return deepest, where


def _string_parts(node: ast.expr, lines: list[str]) -> int:
    """How many literals a string constant is written as (``"a" "b"`` is two)."""
    if isinstance(node, ast.Constant) and not isinstance(node.value, (str, bytes)):
        return 1
    first, last = node.lineno - 1, (node.end_lineno or node.lineno) - 1
    code = "".join(lines[first : last + 1]).encode("utf-8", "surrogatepass")
    end = len(code) - len(lines[last].encode("utf-8", "surrogatepass")) + (node.end_col_offset or 0)
    segment = b"(" + code[node.col_offset : end] + b")"
    try:
        tokens = tokenize.tokenize(io.BytesIO(segment).readline)
        return max(1, sum(token.type in _STRING_STARTS for token in tokens))
    except (tokenize.TokenError, SyntaxError):
        return 1


_STRING_STARTS = frozenset({tokenize.STRING, getattr(tokenize, "FSTRING_START", tokenize.STRING)})


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
    try:
        _check_depth_by_tokens(text, max_depth)  # no ast to measure the nesting with
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


_NESTING_WORDS = frozenset({"and", "or", "not", "if", "else", "for", "lambda", "await"})
_ATOM_ENDS = frozenset({")", "]", "}"})


def _check_depth_by_tokens(text: str, limit: int) -> None:
    """An upper bound of the nesting from the tokens, where ``ast`` cannot measure it: in each
    comma-separated part of each bracket, the operators, dots, keywords like ``and`` and
    ``for``, calls and subscripts on a call, and string literals after another; the brackets
    around; the file's ``elif``s (a chain nests each in the one before)."""
    levels = [0]  # per open bracket: what nests in the current comma-separated part
    elifs = 0
    previous: tokenize.TokenInfo | None = None
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        kind, string = token.type, token.string
        if kind == tokenize.NEWLINE:
            levels = [0]
        elif kind == tokenize.OP and string in "([{":
            if previous is not None and previous.type == tokenize.OP and previous.string in _ATOM_ENDS:
                levels[-1] += 1  # `f()()`, `a[0][0]`
            levels.append(0)
        elif kind == tokenize.OP and string in ")]}":
            if len(levels) > 1:
                levels.pop()
        elif kind == tokenize.OP and string == ",":
            levels[-1] = 0
        elif kind == tokenize.OP or (kind == tokenize.NAME and string in _NESTING_WORDS):
            levels[-1] += 1
        elif kind == tokenize.STRING and previous is not None and previous.type == tokenize.STRING:
            levels[-1] += 1
        elif kind == tokenize.NAME and string == "elif":
            elifs += 1
        depth = sum(levels) + len(levels)
        if depth > limit or elifs > limit:
            line, most = token.start[0], max(depth, elifs)
            raise NestingTooDeep(f"line {line} may nest up to {most:,} expressions (counted from its tokens: the "
                                 f"file is written for a newer Python); the limit is {limit:,}", line)
        if kind not in (tokenize.NL, tokenize.COMMENT):
            previous = token


# ------------------------------------------------------------------ chunks
def _parse_in_chunks(
    statements: list[tuple[int, int]], lines: list[str], chunk_size: int, between_chunks: Callable[[], None] | None
) -> cst.Module | None:
    """The module parsed chunk by chunk and joined, or None when the chunks disagree."""
    cuts = _cuts(statements, lines, chunk_size)
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


def _cuts(statements: list[tuple[int, int]], lines: list[str], chunk_size: int) -> list[int]:
    """0-based indexes of the lines where a new chunk starts: right after a statement's last
    line, once the chunk holds ``chunk_size`` bytes, where the gap is clean (``_clean_gap``)."""
    offsets = _line_starts(lines)
    cuts: list[int] = []
    chunk_start = 0
    previous_end: int | None = None  # 0-based index of the line after the previous statement
    for first, last in statements:
        start = first - 1
        if (
            previous_end is not None
            and offsets[start] - offsets[chunk_start] >= chunk_size
            and _clean_gap(lines, previous_end, start)
        ):
            cuts.append(previous_end)
            chunk_start = previous_end
        previous_end = last
    return cuts


def first_line(statement: ast.stmt) -> int:
    """The line a top-level statement starts on, its decorators included."""
    decorators = getattr(statement, "decorator_list", None)
    return decorators[0].lineno if decorators else statement.lineno


def _clean_gap(lines: list[str], start: int, end: int) -> bool:
    """Lines ``start`` to ``end`` (exclusive) are empty or column-0 comments, and the line
    before them ends a statement (no backslash continuation, no `;` joined statement)."""
    if start > end or start == 0:
        return False
    before = lines[start - 1].rstrip("\r\n")
    if before.endswith("\\"):
        return False
    return all(_GAP_LINE.fullmatch(line) for line in lines[start:end])
