"""Removing a statement without leaving broken or surprising code behind.

- Comments and blank lines above the removed line move to the next statement, so no comment
  the user wrote is lost.
- A statement that is alone in its block cannot just vanish: inside an `if` whose test has no
  side effects (`if step % 100 == 0:`, `if torch.cuda.is_available():`) the whole `if` goes;
  anywhere else it becomes `pass`.
"""

from __future__ import annotations

import libcst as cst

from speedfix.blocks import statement_owner
from speedfix.context import CallSite, FileContext, walk_expression
from speedfix.findings import FixOp, Transform
from speedfix.names import dotted_name

_PURE_CALLS = ("len", "torch.cuda.is_available", "is_available", "isinstance")


NOT_ALONE = "the call is part of a larger statement"


def call_removal(ctx: FileContext, site: CallSite) -> list[FixOp] | None:
    """Ops that remove the statement made of this call, or None (see NOT_ALONE)."""
    if site.statement is None or len(site.statement.body) != 1:
        return None
    small = site.statement.body[0]
    if not (isinstance(small, cst.Expr) and small.value is site.node):
        return None
    return removal_ops(ctx, site.statement)


def removal_ops(ctx: FileContext, statement: cst.BaseStatement) -> list[FixOp] | None:
    """Ops that remove ``statement``, or None when it cannot be found."""
    found = statement_owner(ctx, statement)
    if found is None:
        return None
    owner, siblings = found
    if len(siblings) > 1:
        return _remove_keeping_comments(statement, siblings)
    if isinstance(owner, cst.If) and owner.orelse is None and _pure(owner.test):
        return removal_ops(ctx, owner)  # the guard only existed for this statement
    return [Transform(statement, lambda node: cst.SimpleStatementLine(
        body=[cst.Pass()], leading_lines=node.leading_lines  # type: ignore[attr-defined]
    ))]


def _remove_keeping_comments(node: cst.BaseStatement, siblings: list[cst.BaseStatement]) -> list[FixOp]:
    index = next(i for i, s in enumerate(siblings) if s is node)
    ops: list[FixOp] = [Transform(node, lambda _: cst.RemovalSentinel.REMOVE)]
    comments = list(node.leading_lines)
    if comments and index + 1 < len(siblings):
        following = siblings[index + 1]
        ops.append(Transform(following, lambda updated: updated.with_changes(  # type: ignore[attr-defined]
            leading_lines=[*comments, *updated.leading_lines]
        )))
    return ops


def _pure(test: cst.BaseExpression) -> bool:
    """No calls other than a few known side-effect-free ones, no walrus, no await."""
    for node in walk_expression(test):
        if isinstance(node, (cst.NamedExpr, cst.Await, cst.Yield, cst.Lambda)):
            return False
        if isinstance(node, cst.Call):
            name = dotted_name(node.func) or ""
            if not any(name == pure or name.endswith("." + pure) for pure in _PURE_CALLS):
                return False
    return True
