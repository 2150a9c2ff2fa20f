"""Find the statement list (a module body or an indented block) that holds a statement."""

from __future__ import annotations

from typing import Protocol, Sequence
from weakref import WeakKeyDictionary

import libcst as cst

from speedfix.syntax.walk import child_nodes


class HasModule(Protocol):
    """What the lookups need of a file: its module (the model's file index has it)."""

    module: cst.Module


def enclosing_block(ctx: HasModule, statement: cst.BaseStatement) -> list[cst.BaseStatement] | None:
    """The list of sibling statements ``statement`` belongs to, or None."""
    found = statement_owner(ctx, statement)
    return found[1] if found is not None else None


def statement_owner(ctx: HasModule, statement: cst.BaseStatement) -> tuple[cst.CSTNode, list[cst.BaseStatement]] | None:
    """(the node whose block holds ``statement`` — the Module or a compound statement, or an
    ``Else``/``ExceptHandler``/``Finally`` clause — and that block's statements)."""
    index = _OWNERS.get(ctx)
    if index is None:
        index = _OWNERS[ctx] = _index_owners(ctx.module)
    return index.get(id(statement))


# One walk over the statements per file, shared by every rule that asks.
_OWNERS: WeakKeyDictionary[HasModule, dict[int, tuple[cst.CSTNode, list[cst.BaseStatement]]]] = WeakKeyDictionary()


def _index_owners(module: cst.Module) -> dict[int, tuple[cst.CSTNode, list[cst.BaseStatement]]]:
    index: dict[int, tuple[cst.CSTNode, list[cst.BaseStatement]]] = {}
    todo: list[tuple[cst.CSTNode, Sequence[cst.BaseStatement]]] = [(module, module.body)]
    while todo:
        owner, body = todo.pop()
        statements = list(body)
        for node in statements:
            index[id(node)] = (owner, statements)
            if isinstance(node, cst.BaseCompoundStatement):
                todo.extend(_owned_bodies(node))
    return index


def _owned_bodies(node: cst.CSTNode) -> list[tuple[cst.CSTNode, Sequence[cst.BaseStatement]]]:
    found: list[tuple[cst.CSTNode, Sequence[cst.BaseStatement]]] = []
    for child in child_nodes(node):
        if isinstance(child, cst.IndentedBlock):
            found.append((node, child.body))
        elif isinstance(child, (cst.Else, cst.If, cst.ExceptHandler, cst.Finally, cst.ExceptStarHandler)):
            found.extend(_owned_bodies(child))
    return found
