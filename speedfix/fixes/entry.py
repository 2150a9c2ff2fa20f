"""Where a process-wide setting (`torch.backends.cudnn.benchmark = True`,
`torch.set_float32_matmul_precision("high")`) goes: the script's entry point.

That is the top of a module-level `main()`, else the top of the `if __name__ == "__main__":` block,
else, in a script that does its work at module level (a training loop, a `train()` call), right
after the import block. A module with none of these only defines things: it is a library, and a
setting written there would change every program that imports it, so no fix is offered. A setting
at the top of the entry point runs before the script's own choices further down, so an opt-in
flag (`if args.deterministic: cudnn.benchmark = False`) still wins.
"""

from __future__ import annotations

from typing import Callable, Iterable

import libcst as cst

from speedfix.engine.findings import FixOp, InsertStatements
from speedfix.fixes.codegen import NO_IMPORT_BLOCK, reference, setting_after_imports, statement
from speedfix.model.context import FileContext
from speedfix.model.frames import Frame, FrameKind, Stack
from speedfix.syntax.nodes import is_main_guard

OPT_IN_AT_IMPORT = "the script's own opt-in setting runs at import time, before its entry point would set this"
NO_ENTRY_POINT = "a library module (no `main()`, `__main__` block or module-level training): the setting belongs in the script that runs"


def setting_at_entry_point(
    ctx: FileContext, qualified: str, render: Callable[[str], str], opt_ins: Iterable[Stack] = ()
) -> tuple[list[FixOp] | None, str]:
    """(ops that insert ``render(<the file's spelling of qualified>)`` at the entry point, or None;
    the reason when there are none). ``opt_ins``: where the script sets the same thing behind an
    option that is off by default; the setting must run before them."""
    if any(runs_before_entry(ctx, stack) for stack in opt_ins):
        return None, OPT_IN_AT_IMPORT
    entry = entry_block(ctx)
    if entry is None:
        if _does_work_at_module_level(ctx):
            return setting_after_imports(ctx, qualified, render), NO_IMPORT_BLOCK
        return None, NO_ENTRY_POINT
    body, stack = entry
    # `mp.spawn(main_worker, ...)`: spawned processes start afresh and never run what `main()`
    # set, so the setting goes to the top of the worker (pytorch/examples imagenet) -- unless an
    # opt-in outside the worker must still win over it.
    worker = _spawned_worker(ctx, stack[0].node)
    if worker is not None and not any(ctx.function_of(s) is not worker[1][0].node for s in opt_ins):
        body, stack = worker
    ops: list[FixOp] = []
    new = statement(render(reference(ctx, qualified, ops, stack)))
    # InsertStatements compose: two settings (SF201, SF601) may go to the same place in one pass
    preamble = _preamble(body)
    if preamble is not None:
        return [InsertStatements(preamble, (new,)), *ops], ""
    return [InsertStatements(body[0], (new,), after=False), *ops], ""


def entry_block(ctx: FileContext) -> tuple[list[cst.BaseStatement], Stack] | None:
    """The statements of `main()` (module level, defined once), else of the `__main__` block,
    with the frames code inserted there sits in."""
    mains = [info for info in ctx.functions.get("main", ()) if not info.stack]
    if len(mains) == 1 and isinstance(mains[0].node.body, cst.IndentedBlock):
        node = mains[0].node
        return list(node.body.body), (Frame(FrameKind.FUNCTION, node),)
    for node in ctx.module.body:
        if isinstance(node, cst.If) and is_main_guard(node.test) and isinstance(node.body, cst.IndentedBlock):
            return list(node.body.body), (Frame(FrameKind.MAIN, node),)
    return None


# Calls that start worker processes running a function of the script: `mp.spawn(fn, ...)`.
_SPAWNERS = frozenset({"torch.multiprocessing.spawn", "torch.multiprocessing.start_processes"})


def _spawned_worker(ctx: FileContext, entry: cst.CSTNode) -> tuple[list[cst.BaseStatement], Stack] | None:
    """The module-level function the entry point spawns as its worker processes, if any."""
    for site in ctx.calls_to(*_SPAWNERS):
        if not any(frame.node is entry for frame in site.stack) or not site.node.args:
            continue
        target = site.node.args[0].value
        workers = [info for info in ctx.functions.get(target.value, ()) if not info.stack] if isinstance(target, cst.Name) else []
        if len(workers) == 1 and isinstance(workers[0].node.body, cst.IndentedBlock):
            return list(workers[0].node.body.body), (Frame(FrameKind.FUNCTION, workers[0].node),)
    return None


def runs_before_entry(ctx: FileContext, stack: Stack) -> bool:
    """Does code at ``stack`` run at import time, before the entry point's first statement
    (module level outside the `__main__` block)? A setting inserted at the entry point would
    then overwrite what it chose."""
    return entry_block(ctx) is not None and ctx.at_module_level(stack) and not ctx.in_main_guard(stack)


def _preamble(body: list[cst.BaseStatement]) -> cst.BaseStatement | None:
    """The last leading docstring or `global` statement, after which new code goes."""
    last = None
    for node in body:
        if isinstance(node, cst.SimpleStatementLine) and all(
            isinstance(small, (cst.Global, cst.Nonlocal))
            or (isinstance(small, cst.Expr) and isinstance(small.value, (cst.SimpleString, cst.ConcatenatedString)))
            for small in node.body
        ):
            last = node
            continue
        break
    return last


def _does_work_at_module_level(ctx: FileContext) -> bool:
    """A script without `main()`: module-level loops, `with` blocks or calls (`train()`)."""
    for node in ctx.module.body:
        if isinstance(node, (cst.For, cst.While, cst.With)):
            return True
        if isinstance(node, cst.SimpleStatementLine) and any(
            isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) for small in node.body
        ):
            return True
    return False
