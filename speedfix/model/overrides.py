"""Methods that replace one another: a subclass's override of a method of its base class.

`BasicTrainer.train()` calls `self.clip_gradient()` every step; `FSDPTrainer(BasicTrainer)`
overrides `clip_gradient`. A run builds one trainer class, so one of the two methods runs, never
both: advice about the two is one piece of advice about the step. Only classes of the same file
are followed (a base class another file defines is not read).
"""

from __future__ import annotations

import libcst as cst

from speedfix.model.context import FileContext


def overridden_method(ctx: FileContext, function: cst.CSTNode | None) -> cst.CSTNode | None:
    """The method ``function`` overrides in the furthest base class of the file that defines it
    (`FSDPTrainer.clip_gradient` -> `BasicTrainer.clip_gradient`); ``function`` itself when it
    overrides none (or is no method)."""
    if not isinstance(function, cst.FunctionDef):
        return function
    name = function.name.value
    owners = [info.class_name for info in ctx.functions.get(name, ()) if info.node is function and info.class_name]
    if not owners:
        return function
    found, seen = function, {owners[0]}
    todo = [owners[0]]
    while todo:
        info = ctx.classes.get(todo.pop())
        for base in info.bases if info is not None else ():
            base_name = base
            if not base_name or base_name in seen or base_name not in ctx.classes:
                continue
            seen.add(base_name)
            todo.append(base_name)
            method = next((m.node for m in ctx.functions.get(name, ()) if m.class_name == base_name), None)
            if method is not None:
                found = method
    return found


def owner_name(ctx: FileContext, function: cst.CSTNode) -> str:
    """`FSDPTrainer.clip_gradient` for a method, the function's name otherwise."""
    if not isinstance(function, cst.FunctionDef):
        return ""
    owner = next((info.class_name for info in ctx.functions.get(function.name.value, ())
                  if info.node is function and info.class_name), None)
    return f"{owner}.{function.name.value}" if owner else function.name.value
