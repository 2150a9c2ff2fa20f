"""A read-only batched traversal, call-compatible with ``libcst.visit_batched``.

libcst's ``visit_batched`` is built on the transformer machinery: every node's children are
visited through ``_visit_and_replace_children``, which constructs (and validates) a new node for
each one, even though a visitor changes nothing. On training scripts that costs about twice the
parse. This walker reads the same dataclass fields and calls the same ``visit_<Node>``,
``visit_<Node>_<field>``, ``leave_<Node>_<field>`` and ``leave_<Node>`` methods of the same
``BatchableCSTVisitor`` objects, in pre-order, but builds nothing. It skips whitespace, comments
and punctuation nodes, which no rule looks at. A test checks it against ``visit_batched``.

``Visitor`` is the base of the visitors it runs: the file index and the rules.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, ClassVar, Iterable, Iterator

import libcst as cst

from speedfix.syntax import deadline

Method = Callable[[cst.CSTNode], object]


class Visitor(cst.BatchableCSTVisitor):
    """A batchable visitor whose method lookup never touches other attributes.

    libcst's default ``get_visitors`` runs ``inspect.getmembers``, which evaluates every
    property, and so would compute (and cache) facts before the tree was even walked.
    """

    _method_names: ClassVar[dict[type, tuple[str, ...]]] = {}

    def get_visitors(self):  # type: ignore[no-untyped-def]
        cls = type(self)
        names = Visitor._method_names.get(cls)
        if names is None:  # computed once per class
            candidates = {name for klass in cls.__mro__ for name in _hooks_defined(klass)}
            names = tuple(sorted(name for name in candidates if not getattr(getattr(cls, name), "_is_no_op", False)))
            Visitor._method_names[cls] = names
        return {name: getattr(self, name) for name in names}


_HOOK_PREFIXES = ("visit_", "leave_")
_HOOKS: dict[type, tuple[str, ...]] = {}


def _hooks_defined(klass: type) -> tuple[str, ...]:
    """The ``visit_``/``leave_`` names ``klass`` itself defines, less libcst's typed stubs.

    libcst's visitor bases define a no-op stub for every node and field (thousands of names):
    reading them once per class with ``dir()`` took 90 ms of every scanning process."""
    names = _HOOKS.get(klass)
    if names is None:
        attributes = vars(klass)
        names = tuple(
            name for name in attributes
            if name.startswith(_HOOK_PREFIXES) and not getattr(attributes[name], "_is_no_op", False)
        )
        _HOOKS[klass] = names
    return names


# The per-file time limit is checked every 4,096 nodes (a few milliseconds of walking).
_CHECK_EVERY = 4095

# Fields that only hold whitespace, comments or punctuation.
_SKIPPED_FIELDS = frozenset(
    {
        "leading_lines", "lines_after_decorators", "lpar", "rpar", "comma", "semicolon", "header",
        "footer", "trailing_whitespace", "equal", "colon", "dot", "asynchronous", "lbracket",
        "rbracket", "lbrace", "rbrace", "first_line", "empty_lines", "last_line", "newline",
        "star_tok", "arrow", "walrus", "operator", "lambda_", "dots", "await_",
    }
)
_SKIPPED_BASES = (
    cst.BaseParenthesizableWhitespace, cst.TrailingWhitespace, cst.EmptyLine, cst.Comment,
    cst.Newline, cst.LeftParen, cst.RightParen,
)
_SKIP, _NODE, _SEQUENCE = 0, 1, 2
# What a field value is, by its concrete type (isinstance on libcst's ABCs is slow).
_KIND: dict[type, int] = {tuple: _SEQUENCE, list: _SEQUENCE}
_FIELDS: dict[type, tuple[str, ...]] = {}


def _kind(cls: type) -> int:
    kind = _KIND.get(cls)
    if kind is None:
        kind = _NODE if issubclass(cls, cst.CSTNode) and not issubclass(cls, _SKIPPED_BASES) else _SKIP
        _KIND[cls] = kind
    return kind


def _child_fields(cls: type) -> tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        names = tuple(
            f.name for f in dataclasses.fields(cls) if not f.name.startswith("whitespace") and f.name not in _SKIPPED_FIELDS
        )
        _FIELDS[cls] = names
    return names


_HOOK_NAMES: dict[type, tuple[str, str, tuple[tuple[str, str, str], ...]]] = {}


def _hook_names(cls: type) -> tuple[str, str, tuple[tuple[str, str, str], ...]]:
    """The names of the methods a walk calls for a node of class ``cls``: ``visit_<Node>``,
    ``leave_<Node>`` and, per child field, ``visit_<Node>_<field>`` and ``leave_<Node>_<field>``
    (built once per class, not once per class and file)."""
    names = _HOOK_NAMES.get(cls)
    if names is None:
        node = cls.__name__
        fields = tuple((field, f"visit_{node}_{field}", f"leave_{node}_{field}") for field in _child_fields(cls))
        names = _HOOK_NAMES[cls] = (f"visit_{node}", f"leave_{node}", fields)
    return names


def _methods(visitors: Iterable[cst.BatchableCSTVisitor]) -> dict[str, list[Method]]:
    table: dict[str, list[Method]] = {}
    for visitor in visitors:
        for name, method in visitor.get_visitors().items():
            table.setdefault(name, []).append(method)
    return table


def walk_batched(
    module: cst.Module,
    visitors: Iterable[cst.BatchableCSTVisitor],
    top_of: dict[int, int] | None = None,
) -> None:
    """Call the visitors' methods for every node of ``module`` (no return values honoured).

    With ``top_of``, also record for every node (by its ``id``: a node's own ``__hash__`` is a
    Python call, and this runs for every node) the index of the module-level statement that holds
    it (positions are then computed for those statements only).
    """
    table = _methods(visitors)
    current = [-1]
    visited = [0]
    plans: dict[type, tuple[tuple[Method, ...], tuple[Method, ...], tuple[tuple[str, tuple[Method, ...], tuple[Method, ...]], ...]]] = {}

    def plan_for(cls: type):  # type: ignore[no-untyped-def]
        enter, leave, field_hooks = _hook_names(cls)
        fields = tuple(
            (field, tuple(table.get(before, ())), tuple(table.get(after, ()))) for field, before, after in field_hooks
        )
        plan = (tuple(table.get(enter, ())), tuple(table.get(leave, ())), fields)
        plans[cls] = plan
        return plan

    def visit(node: cst.CSTNode) -> None:
        cls = type(node)
        enter, leave, fields = plans.get(cls) or plan_for(cls)
        visited[0] += 1
        if not visited[0] & _CHECK_EVERY:
            deadline.check()
        if top_of is not None:  # pre-order: a statement's nodes come before the next statement
            index = tops.get(id(node))
            if index is not None:
                current[0] = index
            top_of[id(node)] = current[0]
        for method in enter:
            method(node)
        for field, before, after in fields:
            value = getattr(node, field)
            kind = _KIND.get(type(value))
            if kind is None:
                kind = _kind(type(value))
            if kind == _SKIP:
                continue
            for method in before:
                method(node)
            if kind == _NODE:
                visit(value)
            else:
                for item in value:
                    kind = _KIND.get(type(item))
                    if (kind if kind is not None else _kind(type(item))) == _NODE:
                        visit(item)
            for method in after:
                method(node)
        for method in leave:
            method(node)

    tops = {id(statement): index for index, statement in enumerate(module.body)}
    try:
        visit(module)
    finally:
        # ``visit`` calls itself, so it sits in a reference cycle; emptied, the cycle holds no
        # visitor, and the file's tree and index are freed as soon as the analysis lets go of
        # them, not by a later collection of the cyclic garbage collector.
        plans.clear()
        table.clear()


def child_nodes(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """The children of ``node`` that the walk visits (no whitespace, comments or punctuation),
    in source order; much cheaper than libcst's ``children``, which rebuilds the node."""
    return iter(child_list(node))


def child_list(node: cst.CSTNode) -> list[cst.CSTNode]:
    """``child_nodes`` as a list (the model's walks ask for them a few hundred thousand times a
    scan: no generator, and each type's kind looked up once)."""
    found: list[cst.CSTNode] = []
    for field in _FIELDS.get(type(node)) or _child_fields(type(node)):
        value = getattr(node, field)
        kind = _KIND.get(type(value))
        if kind is None:
            kind = _kind(type(value))
        if kind == _NODE:
            found.append(value)
        elif kind == _SEQUENCE:
            for item in value:
                kind = _KIND.get(type(item))
                if (kind if kind is not None else _kind(type(item))) == _NODE:
                    found.append(item)
    return found
