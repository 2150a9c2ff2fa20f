"""Qualified names through every import form, without libcst's scope analysis.

libcst's ``QualifiedNameProvider`` needs ``ScopeProvider``, which costs about five times the
parse itself (measured: 399 ms against 77 ms for a 1,700-line file), far over the scan budget.
Training scripts bind torch names with imports, so a table of import bindings answers the same
question for the forms that matter (``import torch as T``, ``from torch.utils.data import
DataLoader as DL``, ``from torch.utils import data``). Names that the file defines itself with
``def``/``class`` win over imports, so a project's own ``DataLoader`` is never torch's.
"""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from speedfix.syntax.deadline import tick


def dotted_name(node: cst.BaseExpression) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None (calls, subscripts, literals)."""
    tick()  # called in every rule's loops: where a slow rule meets the time limit
    if type(node) is cst.Name:
        return node.value  # most calls: a plain name
    parts: list[str] = []
    # Exact types, not isinstance: libcst's node classes are never subclassed, and isinstance
    # through their ABC metaclass is several times slower when it fails; this runs ~400 times a file.
    while type(node) is cst.Attribute:
        parts.append(node.attr.value)
        node = node.value
    if type(node) is not cst.Name:
        return None
    parts.append(node.value)
    return ".".join(reversed(parts))


def alias_module_name(node: cst.BaseExpression) -> str:
    name = dotted_name(node)
    assert name is not None, "import targets are always dotted names"
    return name


class ImportTable:
    """Local name -> the qualified name it was imported as."""

    def __init__(self) -> None:
        self.bindings: dict[str, str] = {}
        # Bindings made by imports at module level: only these may be used by code that a fix
        # inserts at module level (an import inside main() does not bind a global).
        self.module_level: set[str] = set()
        self.local_definitions: set[str] = set()
        # `from models import *`: the names it brings are unknown, except that a `torch` the file
        # never imports itself can only be the module `torch` that the star import re-exports.
        self.star_import = False

    def _bind(self, local: str, target: str, module_level: bool) -> None:
        self.bindings[local] = target
        if module_level:
            self.module_level.add(local)

    def add_import(self, node: cst.Import, *, module_level: bool) -> None:
        for alias in node.names:
            module = alias_module_name(alias.name)
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                self._bind(alias.asname.name.value, module, module_level)
            else:
                head = module.split(".", 1)[0]
                self._bind(head, head, module_level)

    def add_import_from(self, node: cst.ImportFrom, *, module_level: bool) -> None:
        if isinstance(node.names, cst.ImportStar):
            self.star_import = True
            return
        if node.relative:
            # The project's own modules: bind to a name that can never look like torch's.
            base = "." * len(node.relative) + (alias_module_name(node.module) if node.module else "")
        elif node.module is None:
            return
        else:
            base = alias_module_name(node.module)
        for alias in node.names:
            imported = alias_module_name(alias.name)
            local = imported
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                local = alias.asname.name.value
            # `from . import engine` binds `.engine`, as `from .engine import x` binds `.engine.x`
            self._bind(local, f"{base}{imported}" if base.endswith(".") else f"{base}.{imported}", module_level)

    def bind_module(self, local: str, target: str) -> None:
        """``local`` holds the module ``target`` without an import statement
        (`MODEL = importlib.import_module(...)`); fixes do not use it."""
        self._bind(local, target, module_level=False)

    def add_star_libraries(self, names: dict[str, str]) -> None:
        """Names a `from m import *` of another file binds to libraries `m` imports (`torch`);
        added before the file's own imports, which win. Not usable by fixes: they spell their
        own imports rather than lean on a star import."""
        for local, target in names.items():
            self._bind(local, target, module_level=False)

    def resolve(self, dotted: str | None) -> str | None:
        """Qualified name of a dotted reference, or None when it is not imported."""
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        if head in self.local_definitions:
            return None
        target = self.bindings.get(head)
        if target is None and head == "torch" and self.star_import:
            target = "torch"
        if target is None:
            return None
        return f"{target}.{rest}" if rest else target

    def local_name_for(self, qualified: str, *, module_level: bool = False,
                       usable: Callable[[str, str], bool] | None = None) -> str | None:
        """How this file can spell ``qualified`` with its own imports, e.g. ``T.compile``.

        With ``module_level``, only bindings made by module-level imports count; ``usable(local,
        target)`` can veto a binding (one rebound where the code goes, for example).
        """
        best: str | None = None
        for local, target in self.bindings.items():
            if local in self.local_definitions or (module_level and local not in self.module_level):
                continue
            if qualified == target:
                candidate = local
            elif qualified.startswith(target + "."):
                candidate = local + qualified[len(target):]
            else:
                continue
            if (best is None or len(candidate) < len(best)) and (usable is None or usable(local, target)):
                best = candidate
        return best


def bound_name(alias: cst.ImportAlias, *, from_import: bool) -> str:
    """The local name an import alias binds (`import a.b` binds `a`; `from m import a` binds `a`)."""
    if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
        return alias.asname.name.value
    name = alias.evaluated_name
    return name if from_import else name.split(".", 1)[0]


def line_binds(line: cst.SimpleStatementLine, local: str) -> bool:
    """Does this statement line import something as ``local``?"""
    for small in line.body:
        if isinstance(small, cst.Import):
            if any(bound_name(alias, from_import=False) == local for alias in small.names):
                return True
        elif isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
            if any(bound_name(alias, from_import=True) == local for alias in small.names):
                return True
    return False
