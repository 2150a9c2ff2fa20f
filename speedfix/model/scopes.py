"""Which name certainly means a module at a given place in the file.

A fix that inserts ``t.autocast(...)`` because the file says ``import torch as t`` breaks the
script if ``t`` is something else where the code lands: ``for t, (x, y) in enumerate(loader)``
rebinds it. libcst's ``ScopeProvider`` would answer exactly, but costs about five times the
parse; this index is filled during the one walk the scan already makes.

``NameBindings`` is a mixin of the file's context visitor (it reads its frame ``stack``). It
records every binding of a name (assignment and loop targets, parameters, ``with ... as``,
``except ... as``, walrus, comprehension targets, ``del``, match captures, ``def``/``class``,
imports) with its scope: the innermost function or class, or the module. A name ``global`` or
``nonlocal`` anywhere counts as rebound everywhere. The answer is conservative: a name is used
only when Python would look it up at module level from that place (no enclosing function binds
it, nor the class whose body it is in) and every module-level binding of it imports the same
thing. Otherwise the fix imports the module under a name that occurs nowhere in the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import libcst as cst

from speedfix.model.frames import FrameKind, Stack
from speedfix.syntax.names import bound_name, dotted_name


_CURRENT = object()  # `_bind`'s default scope: the one being visited


@dataclass(frozen=True, slots=True)
class Binding:
    scope: cst.CSTNode | None  # the innermost function or class; None at module level
    target: str | None  # what an import binds (`torch`, `torch.nn`); None for any other binding


class NameBindings:
    """Mixin for ``FileIndex``: an index of name bindings, and questions about it."""

    stack: Stack
    module: cst.Module

    def __init__(self) -> None:
        self.name_bindings: dict[str, list[Binding]] = {}
        self.rebound_everywhere: set[str] = set()  # `global t` / `nonlocal t`

    # ------------------------------------------------------------------ recording
    def _scope(self, skip: int = 0) -> cst.CSTNode | None:
        """The innermost function or class frame (``skip`` innermost ones left out)."""
        for frame in reversed(self.stack[: len(self.stack) - skip] if skip else self.stack):
            if frame.kind in (FrameKind.FUNCTION, FrameKind.CLASS):
                return frame.node
        return None

    def _bind(self, name: str, target: str | None = None, scope: object = _CURRENT) -> None:
        where = self._scope() if scope is _CURRENT else scope
        self.name_bindings.setdefault(name, []).append(Binding(where, target))  # type: ignore[arg-type]

    def _bind_targets(self, target: cst.CSTNode | None) -> None:
        for name in _bound_names(target):
            self._bind(name)

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._bind_targets(node.target)

    def visit_AugAssign_target(self, node: cst.AugAssign) -> None:
        self._bind_targets(node.target)

    def visit_AnnAssign_target(self, node: cst.AnnAssign) -> None:
        self._bind_targets(node.target)  # `t: int` alone makes `t` local to a function

    def visit_For_target(self, node: cst.For) -> None:
        self._bind_targets(node.target)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._bind_targets(node.target)  # its own scope in Python 3; counted in the enclosing one

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self._bind_targets(node.asname.name)

    def visit_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        if node.name is not None:
            self._bind_targets(node.name.name)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._bind_targets(node.target)

    def visit_Del(self, node: cst.Del) -> None:
        self._bind_targets(node.target)

    def visit_Param(self, node: cst.Param) -> None:
        self._bind(node.name.value)  # a lambda's parameters count in the enclosing scope

    def visit_Global(self, node: cst.Global) -> None:
        self.rebound_everywhere.update(item.name.value for item in node.names)

    def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
        self.rebound_everywhere.update(item.name.value for item in node.names)

    def visit_FunctionDef_name(self, node: cst.FunctionDef) -> None:
        self._bind(node.name.value, scope=self._scope(skip=1))  # its own frame is already open

    def visit_ClassDef_name(self, node: cst.ClassDef) -> None:
        self._bind(node.name.value, scope=self._scope(skip=1))

    def visit_MatchAs(self, node: cst.MatchAs) -> None:
        if node.name is not None:
            self._bind(node.name.value)

    def visit_MatchStar(self, node: cst.MatchStar) -> None:
        if node.name is not None:
            self._bind(node.name.value)

    def visit_MatchMapping(self, node: cst.MatchMapping) -> None:
        if node.rest is not None:
            self._bind(node.rest.value)

    def visit_Import_names(self, node: cst.Import) -> None:
        for alias in node.names:
            name = bound_name(alias, from_import=False)
            self._bind(name, alias.evaluated_name if alias.asname is not None else name)

    def visit_ImportFrom_names(self, node: cst.ImportFrom) -> None:
        if isinstance(node.names, cst.ImportStar):
            return  # binds names nobody can list; the file's own modules, as a rule
        base = dotted_name(node.module) if node.module is not None else ""
        base = "." * len(node.relative) + (base or "")
        for alias in node.names:
            self._bind(bound_name(alias, from_import=True), f"{base}.{alias.evaluated_name}")

    # ------------------------------------------------------------------ questions
    def means(self, name: str, target: str, stack: Stack) -> bool:
        """Does ``name``, read at ``stack``, certainly hold what ``import ... as name`` bound to
        ``target`` at module level (and nothing else)?"""
        module = self._module_bindings(name, stack)
        return module is not None and bool(module) and all(b.target == target for b in module)

    def free_for_import(self, name: str, stack: Stack) -> bool:
        """Would a module-level ``import name`` make ``name`` mean that module at ``stack``?"""
        module = self._module_bindings(name, stack)
        return module is not None and all(b.target == name for b in module)

    def unused_name(self, base: str) -> str:
        """``base_``, ``_base``, ``base_2``, ...: the first that occurs nowhere in the file."""
        code = self.module.code
        for candidate in _candidates(base):
            if candidate not in code:
                return candidate
        raise AssertionError("unreachable: the candidates never end")

    def _module_bindings(self, name: str, stack: Stack) -> list[Binding] | None:
        """The module-level bindings of ``name`` if a read at ``stack`` looks it up there;
        None when a function or class on the way binds it (or `global`/`nonlocal` names it)."""
        if name in self.rebound_everywhere:
            return None
        bindings = self.name_bindings.get(name, [])
        for scope in _lookup_scopes(stack):
            if any(binding.scope is scope for binding in bindings):
                return None
        return [binding for binding in bindings if binding.scope is None]


def _lookup_scopes(stack: Stack) -> list[cst.CSTNode]:
    """The scopes Python searches before the module: the innermost function or class, then
    the enclosing functions (a class body is not visible from the methods inside it)."""
    scopes = [frame for frame in stack if frame.kind in (FrameKind.FUNCTION, FrameKind.CLASS)]
    if not scopes:
        return []
    innermost, outer = scopes[-1], scopes[:-1]
    return [innermost.node, *(frame.node for frame in reversed(outer) if frame.kind is FrameKind.FUNCTION)]


def _bound_names(target: cst.CSTNode | None) -> Iterator[str]:
    """Plain names bound by an assignment-like target (`t`, `(t, (x, y))`, `*rest`); attributes
    and subscripts bind nothing."""
    todo = [target]
    while todo:
        node = todo.pop()
        if isinstance(node, cst.Name):
            yield node.value
        elif isinstance(node, (cst.Tuple, cst.List)):
            todo.extend(element.value for element in node.elements)
        elif isinstance(node, cst.StarredElement):
            todo.append(node.value)


def _candidates(base: str) -> Iterator[str]:
    yield f"{base}_"
    yield f"_{base}"
    number = 2
    while True:
        yield f"{base}_{number}"
        number += 1
