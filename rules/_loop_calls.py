"""A costly call in the training loop that removing fixes, as SF303 and SF304 report it."""

from __future__ import annotations

from speedfix.engine.findings import Severity
from speedfix.engine.rule import Rule
from speedfix.fixes.removal import NOT_ALONE, call_removal
from speedfix.model.branches import BranchTracker, frequency
from speedfix.model.context import FileContext
from speedfix.model.flow import in_no_run
from speedfix.model.index import CallSite


def report_loop_call(rule: Rule, site: CallSite, what: str, every_step: str, each_call: str) -> None:
    """Report a costly call in the training loop that removing fixes (`empty_cache()`,
    `gc.collect()`): a warning on every step; an info note when its cost is spread over N steps
    or it runs under an opt-in flag (no fix there: the user asked for it); nothing once or on an
    error path. ``rule`` is a ``BranchTracker`` that tracks the call."""
    assert isinstance(rule, BranchTracker)
    if _in_no_run(rule.ctx, site):
        return
    how_often = frequency(rule.ctx, site.stack, rule.branches_at(site.node))
    if how_often is None:
        return
    if how_often.every_step:
        rule.report(site.node, f"{what} {every_step}", fix_ops=call_removal(rule.ctx, site), no_fix_reason=NOT_ALONE)
        return
    message = f"{what} {how_often.describe()} in the training loop: each call {each_call}"
    if how_often.flag is not None:
        rule.report(site.node, message, severity=Severity.INFO, no_fix_reason=f"it only runs while `{how_often.flag}` is on")
    else:
        rule.report(site.node, message, severity=Severity.INFO, fix_ops=call_removal(rule.ctx, site), no_fix_reason=NOT_ALONE)


def _in_no_run(ctx: FileContext, site: CallSite) -> bool:
    """Does no run make the call: it lies under a flag no launch command turns on, or every call
    of its function does (`if args.use_ema: ema_unet.step(...)`, the `empty_cache()` inside
    `EMAModel.step`)?"""
    if in_no_run(ctx, site.statement, site.stack):
        return True
    function = ctx.function_of(site.stack)
    callers = ctx.local_callers(function) if function is not None else []
    return bool(callers) and all(in_no_run(ctx, caller.statement, caller.stack) for caller in callers)
