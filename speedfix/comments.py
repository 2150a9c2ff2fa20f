"""The comments a statement holds, so that a fix that removes or replaces it can keep them.

A comment can sit above a statement (its ``leading_lines``), at the end of one of its lines
(``TrailingWhitespace``), on its own line inside a multi-line expression or an indented block,
or in a block's footer. ``own_lines`` returns all of them in source order as own-line comments
(``EmptyLine``), ready to be put above the next statement or at the end of the block.
"""

from __future__ import annotations

from typing import Iterator

import libcst as cst


def own_lines(statement: cst.CSTNode, *, keep_trailing: bool = False) -> list[cst.EmptyLine]:
    """``statement``'s leading lines (blank lines included, as written), then every other
    comment in it as an own-line comment. With ``keep_trailing``, the comment at the end of a
    simple statement's line is left out (the caller keeps it on the line)."""
    leading = list(getattr(statement, "leading_lines", ()))
    skip: set[int] = {id(line) for line in leading}
    if keep_trailing and isinstance(statement, cst.SimpleStatementLine):
        skip.add(id(statement.trailing_whitespace))
    inner = [cst.EmptyLine(comment=comment) for comment in _comments(statement, skip)]
    return [*leading, *inner]


def _comments(node: cst.CSTNode, skip: set[int]) -> Iterator[cst.Comment]:
    """Comment nodes below ``node`` in source order (libcst lists children in that order)."""
    todo: list[cst.CSTNode] = [node]
    while todo:
        current = todo.pop()
        if id(current) in skip:
            continue
        if isinstance(current, cst.Comment):
            yield current
            continue
        todo.extend(reversed(current.children))
