"""Dropping a GradScaler: its calls rewritten as if it were not there (`scaler.scale(loss)` ->
`loss`, `scaler.step(opt)` -> `opt.step()`), its `update()`/`unscale_()` statements and its
construction removed, and its import once nothing uses it (SF204, SF207)."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from speedfix.engine.findings import FixOp, RemoveImportIfUnused, Transform
from speedfix.fixes.removal import removal_ops
from speedfix.model.amp import DEPRECATED_AMP_MODULES, Scaler, scaler_scope
from speedfix.model.context import FileContext
from speedfix.syntax.blocks import statement_owner
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import walk_expression


@dataclass
class _Uses:
    """What a walk over the scaler's scope found."""

    ops: list[FixOp]
    removed: list[cst.BaseStatement]
    problem: str | None = None


def scaler_removal(ctx: FileContext, scaler: Scaler) -> tuple[list[FixOp] | None, str | None]:
    """Ops that drop ``scaler`` and rewrite its calls as if it were not there, or (None, why)."""
    name = scaler.target
    scope = scaler_scope(ctx, scaler)
    if name is None or scope is None or scaler.site.statement is None:
        small = scaler.site.statement.body[0] if scaler.site.statement is not None else None
        if isinstance(small, cst.Assign) and isinstance(small.value, cst.IfExp):
            return None, "the scaler exists only on some paths (`... if ... else None`), which its uses test"
        return None, "the GradScaler is not assigned to a variable of its own"
    uses = _Uses(ops=[], removed=[scaler.site.statement])
    target = scaler.site.statement.body[0].targets[0].target  # type: ignore[attr-defined]
    _collect_uses(ctx, scope, name, target, uses)
    if uses.problem is None:
        uses.problem = _empties_a_block(ctx, uses.removed)
    if uses.problem is not None:
        return None, uses.problem
    ops = list(uses.ops)
    for statement in uses.removed:
        removal = removal_ops(ctx, statement)
        if removal is None:
            return None, "a scaler call could not be removed"
        ops.extend(removal)
    ops.extend(_import_cleanup(ctx, scaler))
    return ops, None


def _collect_uses(ctx: FileContext, scope: cst.CSTNode, name: str, target: cst.CSTNode, uses: _Uses) -> None:
    consumed = {id(target)}
    not_references: set[int] = set()  # `x.scaler`'s `scaler`, `f(scaler=...)`'s keyword
    references: list[cst.CSTNode] = []
    for node in walk_expression(scope):
        if isinstance(node, cst.Attribute):
            not_references.add(id(node.attr))
        elif isinstance(node, cst.Arg) and node.keyword is not None:
            not_references.add(id(node.keyword))
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and dotted_name(node.func.value) == name:
            if _rewrite_call(ctx, node, uses):
                consumed.add(id(node.func.value))
            elif uses.problem is None:
                uses.problem = f"`{name}.{node.func.attr.value}()` has no counterpart without the scaler"
        if (isinstance(node, cst.Name) and node.value == name) or (
            isinstance(node, cst.Attribute) and "." in name and dotted_name(node) == name
        ):
            references.append(node)
    if uses.problem is None and any(id(n) not in consumed and id(n) not in not_references for n in references):
        uses.problem = f"`{name}` is also used as a value (passed on, compared or stored)"


def _rewrite_call(ctx: FileContext, call: cst.Call, uses: _Uses) -> bool:
    """Record the rewrite of one scaler method call; False when it has none."""
    method = call.func.attr.value  # type: ignore[attr-defined]
    if method == "scale":
        value = _only_argument(call, "outputs")
        if value is None:
            return False
        uses.ops.append(Transform(call, _unwrap_scale))
        return True
    if method == "step":
        if _only_argument(call, "optimizer", alone=False) is None:
            return False
        uses.ops.append(Transform(call, _optimizer_step))
        return True
    if method in ("update", "unscale_"):
        site = ctx.site_of(call)
        statement = site.statement if site is not None else None
        alone = statement is not None and len(statement.body) == 1 and isinstance(statement.body[0], cst.Expr)
        if not alone or statement.body[0].value is not call:  # type: ignore[union-attr]
            return False
        uses.removed.append(statement)
        return True
    return False


def _only_argument(call: cst.Call, keyword: str, *, alone: bool = True) -> cst.BaseExpression | None:
    """The first argument (positional, or ``keyword=``), when no `*`/`**` argument hides others."""
    if not call.args or any(arg.star for arg in call.args) or (alone and len(call.args) != 1):
        return None
    first = call.args[0]
    return first.value if first.keyword is None or first.keyword.value == keyword else None


def _unwrap_scale(updated: cst.CSTNode) -> cst.CSTNode:
    """`scaler.scale(loss)` -> `loss` (parenthesised where an operator needs it)."""
    assert isinstance(updated, cst.Call)
    return _atom(updated.args[0].value, updated)


def _optimizer_step(updated: cst.CSTNode) -> cst.CSTNode:
    """`scaler.step(opt, *rest)` -> `opt.step(*rest)`."""
    assert isinstance(updated, cst.Call)
    optimizer, rest = updated.args[0].value, list(updated.args[1:])
    return updated.with_changes(func=cst.Attribute(value=_atom(optimizer, None), attr=cst.Name("step")), args=rest)


def _atom(expr: cst.BaseExpression, replaced: cst.BaseExpression | None) -> cst.BaseExpression:
    """``expr`` as it may stand where ``replaced`` stood, or before `.attr`."""
    if replaced is not None and replaced.lpar and not expr.lpar:
        return expr.with_changes(lpar=replaced.lpar, rpar=replaced.rpar)
    if expr.lpar or isinstance(expr, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
        return expr
    return expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def _empties_a_block(ctx: FileContext, removed: list[cst.BaseStatement]) -> str | None:
    """Removing every statement of a block at once would leave it empty (one alone is replaced
    by `pass` or takes its `if` along)."""
    by_block: dict[int, tuple[int, int]] = {}
    for statement in removed:
        found = statement_owner(ctx, statement)
        if found is None:
            return "a scaler call is not a statement of a block"
        count, size = by_block.get(id(found[1]), (0, len(found[1])))
        by_block[id(found[1])] = (count + 1, size)
    if any(count == size and size > 1 for count, size in by_block.values()):
        return "removing the scaler calls would leave a block empty"
    return None


def _import_cleanup(ctx: FileContext, scaler: Scaler) -> list[FixOp]:
    """Drop `from ... import GradScaler` once nothing uses it (also under the `torch.amp` name
    SF203 may give the import in the same pass)."""
    func = scaler.site.node.func
    qualified = ctx.qualname(func)
    if not isinstance(func, cst.Name) or qualified is None or "." not in qualified:
        return []
    module, obj = qualified.rsplit(".", 1)
    asname = func.value if func.value != obj else None
    ops: list[FixOp] = [RemoveImportIfUnused(module, obj, asname)]
    if module in DEPRECATED_AMP_MODULES:
        ops.append(RemoveImportIfUnused("torch.amp", obj, asname))
    return ops
