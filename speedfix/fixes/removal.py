"""Removing a statement without leaving broken or surprising code behind.

- No comment the user wrote is lost: the comments and blank lines above the removed statement,
  and every comment inside it (at the end of its line, in a removed `if` block), move above the
  next statement of the block, or to the end of the block when it was the last one (the fix
  applier does that for every removed statement, see ``fixer._Applier``).
- A statement that is alone in its block cannot just vanish: inside an `if` whose test has no
  side effects (`if step % 100 == 0:`, `if torch.cuda.is_available():`) the whole `if` goes;
  anywhere else it becomes `pass`.
"""

from __future__ import annotations

import libcst as cst

from speedfix.engine.findings import FixOp, Transform
from speedfix.model.context import FileContext
from speedfix.model.index import CallSite
from speedfix.syntax.blocks import statement_owner
from speedfix.syntax.comments import own_lines
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import walk_expression

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
        # The applier moves its comments to the next statement or the end of the block.
        return [Transform(statement, lambda _: cst.RemovalSentinel.REMOVE)]
    if isinstance(owner, cst.If) and owner.orelse is None and _pure(owner.test):
        return removal_ops(ctx, owner)  # the guard only existed for this statement
    return [Transform(statement, _pass_keeping_comments)]


def _pass_keeping_comments(node: cst.CSTNode) -> cst.SimpleStatementLine:
    """`pass` in place of ``node``, with its comments: those above and inside it above `pass`,
    the one at the end of its line still there."""
    trailing = node.trailing_whitespace if isinstance(node, cst.SimpleStatementLine) else cst.TrailingWhitespace()
    return cst.SimpleStatementLine(
        body=[cst.Pass()], leading_lines=own_lines(node, keep_trailing=True), trailing_whitespace=trailing
    )


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


def blank_lines_of_removed(block: list[cst.BaseStatement], removed: list[cst.SimpleStatementLine]) -> list[FixOp]:
    """Ops that drop the blank lines of ``removed`` statements of ``block`` that would pile up
    above the next statement left (the removal of a run of statements, not of one).

    The removal moves each removed statement's comments and blank lines above that statement;
    of a run of removed steps, only the first one's blank lines are kept, and only when the
    statement they land on has none of its own. A statement that becomes the first of its block
    loses its blank lines too."""
    ops: list[FixOp] = []
    gone = {id(statement) for statement in removed}
    first_of_run, kept_before = True, False
    for position, statement in enumerate(block):
        if id(statement) not in gone:
            if not kept_before and position > 0:
                ops.extend(_drop_blank_lines(statement))
            first_of_run, kept_before = True, True
            continue
        following = next((s for s in block[position + 1:] if id(s) not in gone), None)
        lands_on_blank = following is not None and any(_is_blank(line) for line in following.leading_lines)
        if not first_of_run or lands_on_blank or not kept_before:
            ops.extend(_drop_blank_lines(statement))
        first_of_run = False
    return ops


def _drop_blank_lines(statement: cst.BaseStatement) -> list[FixOp]:
    blank = [line for line in statement.leading_lines if _is_blank(line)]
    return [Transform(line, lambda _: cst.RemovalSentinel.REMOVE) for line in blank]


def _is_blank(line: cst.EmptyLine) -> bool:
    return line.comment is None
