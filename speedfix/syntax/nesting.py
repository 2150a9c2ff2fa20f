"""How deep code nests in libcst's tree, measured before libcst parses it.

libcst's parser costs about N² for a chain of N operators, attributes or calls (1,000 terms:
0.3 s; a 20,000-term generated sum does not finish), its native code crashes the process (a
segmentation fault) on about 6,000 levels, and its Python code recurses once per level. Python's
own parser (``ast``, in C, milliseconds) measures first:

- ``measure`` refuses code nested deeper than ``MAX_DEPTH`` (``NestingTooDeep``, with the line),
  counted as libcst builds it: ``a and b and c`` is ``(a and b) and c``, a dotted name
  (``import a.b.c``) is attributes in attributes, ``"a" "b" "c"`` is a concatenation in a
  concatenation, each ``for`` of a comprehension is inside the one before, and each ``elif`` is
  inside the ``if`` above it; and it says how much nesting work each top-level statement holds
  (the sum of the squared depths of its long expressions), so that the parse can be cut where
  the work is and a statement too costly to parse in one piece refused;
- ``bound_by_tokens`` gives an upper bound from the tokens alone, for code written for a newer
  Python than the one running (no ``ast`` to measure with).
"""

from __future__ import annotations

import ast
import io
import tokenize
from typing import Iterator

# Deeper expressions are refused (libcst's cost per expression grows with the square of this).
MAX_DEPTH = 1000


class NestingTooDeep(RecursionError):
    """Code nested deeper than libcst can parse in reasonable time (a RecursionError, so that
    callers treat it as the interpreter's own "too deeply nested" failure); ``line``: where, when
    known."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.line = line


def measure(tree: ast.Module, lines: list[str], limit: int = MAX_DEPTH) -> list[int]:
    """The nesting work of each top-level statement of ``tree`` (the squared depths of its
    expressions, summed); raises NestingTooDeep when code nests deeper than ``limit``.

    Only expressions long enough to reach the limit are walked (each level of nesting takes at
    least one character), so ordinary code costs one look per statement and has no work."""
    starts = line_starts(lines)
    return [_statement_work(statement, lines, starts, limit) for statement in tree.body]


def _statement_work(top: ast.stmt, lines: list[str], starts: list[int], limit: int) -> int:
    work = 0
    todo: list[tuple[ast.AST, int]] = [(top, 0)]
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
                    work += depth * depth
            elif isinstance(child, ast.alias):
                _check_name(child.name, getattr(child, "lineno", node.lineno), blocks, limit)  # type: ignore[attr-defined]
            else:  # handlers, match cases, arguments, ...
                todo.append((child, blocks))
    return work


def _too_deep(line: int, depth: int, limit: int, what: str) -> NestingTooDeep:
    return NestingTooDeep(f"line {line} nests {depth:,} {what}; the limit is {limit:,}", line)


def _check_name(name: str, line: int, blocks: int, limit: int) -> None:
    """An imported dotted name: libcst nests each ``.`` as an attribute."""
    if blocks + len(name) > limit and blocks + name.count(".") + 1 > limit:
        raise _too_deep(line, blocks + name.count(".") + 1, limit, "names")


def line_starts(lines: list[str]) -> list[int]:
    """The UTF-8 offset where each line starts (and the end of the text)."""
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
        return max(1, sum(token.type in _STRING_STARTS for token in _tokens(segment)))
    except (tokenize.TokenError, SyntaxError):
        return 1


def _tokens(segment: bytes) -> Iterator[tokenize.TokenInfo]:
    return tokenize.tokenize(io.BytesIO(segment).readline)


_STRING_STARTS = frozenset({tokenize.STRING, getattr(tokenize, "FSTRING_START", tokenize.STRING)})
_NESTING_WORDS = frozenset({"and", "or", "not", "if", "else", "for", "lambda", "await"})
_ATOM_ENDS = frozenset({")", "]", "}"})


def bound_by_tokens(text: str, limit: int = MAX_DEPTH) -> None:
    """Raise NestingTooDeep when an upper bound of the nesting, from the tokens, passes
    ``limit``: in each comma-separated part of each bracket, the operators, dots, keywords like
    ``and`` and ``for``, calls and subscripts on a call, and string literals after another; the
    brackets around; the file's ``elif``s (a chain nests each in the one before). Raises
    tokenize.TokenError or SyntaxError for text that cannot be cut into tokens."""
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
