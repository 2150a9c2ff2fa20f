"""Small questions about one node: its code as written, the nodes below it, the names a target
binds, whether it is a string literal or the `__main__` guard's test."""

from __future__ import annotations

from typing import Iterator

import libcst as cst

from speedfix.syntax.names import dotted_name
from speedfix.syntax.walk import child_nodes


def code_of(node: cst.CSTNode) -> str:
    """The source text of a node, as libcst prints it."""
    return cst.Module([]).code_for_node(node)


def walk_expression(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """Every node below ``node`` (for small subtrees only: tests, arguments, statements)."""
    todo = [node]
    while todo:
        current = todo.pop()
        yield current
        todo.extend(child_nodes(current))


def target_names(target: cst.BaseExpression) -> tuple[str, ...]:
    """Names bound by an assignment or loop target (`x`, `(x, y)`, `i, (x, y)`, `self.m`)."""
    if isinstance(target, (cst.Tuple, cst.List)):
        names: list[str] = []
        for element in target.elements:
            names.extend(target_names(element.value))
        return tuple(names)
    if isinstance(target, cst.StarredElement):
        return target_names(target.value)
    name = dotted_name(target)
    return (name,) if name else ()


def is_main_guard(test: cst.BaseExpression) -> bool:
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    sides = [test.left, test.comparisons[0].comparator]
    names = [s.value for s in sides if isinstance(s, cst.Name)]
    strings = [s.evaluated_value for s in sides if isinstance(s, cst.SimpleString)]
    return names == ["__name__"] and strings == ["__main__"]


def is_string(node: cst.BaseExpression) -> bool:
    """A string literal: plain, implicitly concatenated or an f-string."""
    return isinstance(node, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString))


def bound_names(statement: cst.CSTNode) -> set[str]:
    """Dotted names a statement (re)binds anywhere inside it."""
    bound: set[str] = set()
    for node in walk_expression(statement):
        if isinstance(node, cst.AssignTarget):
            bound.update(target_names(node.target))
        elif isinstance(node, (cst.AugAssign, cst.AnnAssign, cst.For, cst.NamedExpr)):
            bound.update(target_names(node.target))
        elif isinstance(node, cst.AsName) and isinstance(node.name, (cst.Name, cst.Tuple, cst.List)):
            bound.update(target_names(node.name))
    return bound
