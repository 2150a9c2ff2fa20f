"""Python's own parser (``ast``, in C): the syntax check, and what it measures of a file before
libcst parses it. No libcst here: a scan reads the facts of a project's files with it before
the engine is loaded (``speedfix.project.facts``).

``measured`` is that measurement, made once per file: the scan takes it with the `ast` parse
that reads the file's project facts and hands it to the file's analysis, whose libcst parse
(``speedfix.syntax.parsing.parse_module``) then needs no `ast` parse of its own.
"""

from __future__ import annotations

import ast
import hashlib
import io
import tokenize
import warnings
from dataclasses import dataclass

from speedfix.syntax.nesting import MAX_DEPTH, NestingTooDeep, measure
from speedfix.syntax.source import split_lines


def python_ast(source: str | bytes, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse`` without its SyntaxWarnings (``"a" "b"()``, ``x is 1``): they are about the
    user's code, and speedfix is not the place that prints them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        return ast.parse(source, filename=filename)


def decode(data: bytes) -> tuple[str, str]:
    """(encoding, text) as libcst decodes them: BOM or coding cookie, else UTF-8. Raises
    SyntaxError, UnicodeDecodeError or LookupError."""
    encoding = tokenize.detect_encoding(io.BytesIO(data).readline)[0]
    return encoding, data.decode(encoding)


def first_line(statement: ast.stmt) -> int:
    """The line a top-level statement starts on, its decorators included."""
    decorators = getattr(statement, "decorator_list", None)
    return decorators[0].lineno if decorators else statement.lineno


@dataclass(frozen=True)
class Measured:
    """Of a file's bytes (``digest``): the first and last line of each top-level statement as
    Python's parser numbers them, and the nesting work of each (``nesting.measure``)."""

    digest: str
    statements: tuple[tuple[int, int], ...]
    works: tuple[int, ...]

    def of(self, data: bytes | str) -> bool:
        """Was this measured of ``data``?"""
        return isinstance(data, bytes) and hashlib.sha256(data).hexdigest() == self.digest


def measure_text(text: str, tree: ast.Module, max_depth: int = MAX_DEPTH) -> tuple[list[str], list[tuple[int, int]], list[int]]:
    """The lines of ``text``, and each top-level statement's (first line, last line) and nesting
    work; raises NestingTooDeep."""
    lines = split_lines(text)
    works = measure(tree, lines, max_depth)
    statements = [(first_line(node), node.end_lineno or node.lineno) for node in tree.body]
    return lines, statements, works


def parsed(data: bytes) -> tuple[ast.Module | None, Measured | None]:
    """Python's tree of a file, and its measurement for libcst; (None, None) when Python cannot
    parse it, no measurement when it nests too deeply (the file's analysis says why)."""
    try:
        text = decode(data)[1]
        tree = python_ast(text)
    except (SyntaxError, ValueError, LookupError, RecursionError, MemoryError):  # UnicodeDecodeError is a ValueError
        return None, None
    try:
        _, statements, works = measure_text(text, tree)
    except NestingTooDeep:
        return tree, None
    return tree, Measured(hashlib.sha256(data).hexdigest(), tuple(statements), tuple(works))
