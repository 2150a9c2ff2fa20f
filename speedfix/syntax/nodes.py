"""Small questions about one node: its code as written, the nodes below it, the names a target
binds, whether it is a string literal or the `__main__` guard's test."""

from __future__ import annotations

from typing import Iterator

import libcst as cst

from speedfix.syntax.names import dotted_name
from speedfix.syntax.walk import child_list


# libcst's node classes are ABCs, so `isinstance(node, cst.Name)` is a Python call when it is
# false, a few million times a scan. No concrete node class has a subclass (a test holds libcst
# to it), so the hottest loops compare types: `type(node) is cst.Name`, `type(node) in SCOPES`.
SCOPES = frozenset({cst.FunctionDef, cst.ClassDef, cst.Lambda})


def code_of(node: cst.CSTNode) -> str:
    """The source text of a node, as libcst prints it."""
    return cst.Module([]).code_for_node(node)


def walk_expression(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """Every node below ``node`` (for small subtrees only: tests, arguments, statements)."""
    todo = [node]
    pop, extend = todo.pop, todo.extend
    while todo:
        current = pop()
        yield current
        extend(child_list(current))


def walk_in_order(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """``walk_expression`` in source order (a parent before its children, the children left to
    right; recursive: for the small subtrees of one function)."""
    yield node
    for child in child_list(node):
        yield from walk_in_order(child)


def parameter_default(function: cst.CSTNode | None, name: str) -> cst.BaseExpression | None:
    """The default of parameter ``name`` of ``function`` (`every=2000` in `def __init__(self,
    every=2000)`); None when ``function`` is no `def`, has no such parameter, or it has no default."""
    if not isinstance(function, cst.FunctionDef):
        return None
    params = function.params
    return next((param.default for param in (*params.posonly_params, *params.params, *params.kwonly_params)
                 if param.name.value == name), None)


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


# An integer literal longer than this is no count, size or setting speedfix reasons about (and
# Python cannot even print one of over 4,300 digits: `str()` raises ValueError).
MAX_INTEGER_CHARACTERS = 100


def integer_value(node: cst.Integer) -> int | None:
    """The value of an integer literal as written (``0x10``, ``1_000``, ``0o7``); None for an
    absurdly long one."""
    if len(node.value) > MAX_INTEGER_CHARACTERS:
        return None
    try:
        return int(node.value, 0)
    except ValueError:  # not a literal the parser made
        return None


def number_value(node: cst.Integer | cst.Float) -> float | None:
    """The value of a number literal (``0x1``, ``1_000.0``, ``1e-3``), as a float."""
    if isinstance(node, cst.Integer):
        value = integer_value(node)
        return None if value is None else float(value)
    try:
        return float(node.value)
    except ValueError:
        return None


def negated_code(test: cst.BaseExpression) -> str:
    """The code of a test's negation: `a == 0` -> `a != 0`, `not x` -> `x`, anything else -> `not (...)`."""
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        target = test.comparisons[0]
        flipped = {cst.Equal: cst.NotEqual, cst.NotEqual: cst.Equal}.get(type(target.operator))
        if flipped is not None:
            operator = flipped(whitespace_before=target.operator.whitespace_before, whitespace_after=target.operator.whitespace_after)
            return code_of(test.with_changes(comparisons=[target.with_changes(operator=operator)], lpar=[], rpar=[]))
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return code_of(test.expression)
    return f"not ({code_of(test.with_changes(lpar=[], rpar=[]))})"
