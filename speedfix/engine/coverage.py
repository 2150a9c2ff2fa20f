"""Say what could not be checked, rather than stay silent.

A script that builds its optimizer and then hands everything to ``train_one_epoch`` from a file
that was not scanned gets no finding from the rules that look inside the training loop: they
never saw it. The report says so, and how to let them see it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from speedfix.model.patterns import OPTIMIZER_PREFIX

if TYPE_CHECKING:
    from speedfix.engine.rule import Rule
    from speedfix.model.context import FileContext

# The rules that only look at code inside the training loop.
LOOP_RULES = ("SF104", "SF202", "SF301", "SF302", "SF303", "SF304")


def unchecked_loop_note(ctx: FileContext, rules: Sequence[type[Rule]]) -> str | None:
    """A note for a script (it has a `__main__` guard) that sets up training (builds a torch
    optimizer) but whose training loop is nowhere in sight: not here, not in a scanned file it
    calls. None otherwise, or when none of the enabled ``rules`` looks inside the loop."""
    codes = sorted({rule.code for rule in rules} & set(LOOP_RULES))
    if not codes or ctx.step_loops or ctx.hot_functions or not _builds_optimizer(ctx):
        return None
    if not ctx.has_main_guard:  # a module (`configure_optimizers()` of a model file), not a script
        return None
    if any((callee := ctx.project_callee(site)) is not None and callee.trains for site in ctx.calls):
        return None
    checks = f"the checks of the training loop ({', '.join(codes)})"
    if ctx.links.missing:
        modules = ", ".join(ctx.links.missing)
        return (f"no training loop in this file; it imports {modules}, which {'was' if len(ctx.links.missing) == 1 else 'were'} "
                f"not scanned, so {checks} did not run: scan the whole folder")
    return f"no training loop found in this file or in the scanned files it calls, so {checks} did not run"


def _builds_optimizer(ctx: FileContext) -> bool:
    for site in ctx.calls:
        name = ctx.call_qualname(site)
        if name and name.startswith(OPTIMIZER_PREFIX) and not name.startswith("torch.optim.lr_scheduler"):
            return True
    return False
