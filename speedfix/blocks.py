"""Find the statement list (a module body or an indented block) that holds a statement."""

from __future__ import annotations

from typing import Sequence

import libcst as cst

from speedfix.context import FileContext


def _bodies(node: cst.CSTNode) -> list[Sequence[cst.BaseStatement]]:
    """Statement lists directly owned by a compound statement (body, else, except, finally)."""
    found: list[Sequence[cst.BaseStatement]] = []
    for child in node.children:
        if isinstance(child, cst.IndentedBlock):
            found.append(child.body)
        elif isinstance(child, (cst.Else, cst.If, cst.ExceptHandler, cst.Finally, cst.ExceptStarHandler)):
            found.extend(_bodies(child))
    return found


def enclosing_block(ctx: FileContext, statement: cst.BaseStatement) -> list[cst.BaseStatement] | None:
    """The list of sibling statements ``statement`` belongs to, or None."""
    todo: list[Sequence[cst.BaseStatement]] = [ctx.module.body]
    while todo:
        body = todo.pop()
        for node in body:
            if node is statement:
                return list(body)
            if isinstance(node, cst.BaseCompoundStatement):
                todo.extend(_bodies(node))
    return None
