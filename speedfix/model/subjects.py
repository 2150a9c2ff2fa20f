"""Which model a call is for: `netG.compile()` compiles the generator, not the discriminator.

Advice given per model (compile it, convert it to channels-last) is settled for a model by the
calls that act on it: on the model under any of its names (the variable, its wrappers, the
parameters it is passed as), or on the batch it is called on. A call whose subject cannot be
read (`torch.compile(build())`) or that acts on a function (`torch.compile(train_step)`) may be
for any model, and settles the advice for all of them, as a whole-file check did.
"""

from __future__ import annotations

import libcst as cst

from speedfix.model.context import FileContext
from speedfix.model.frames import Stack
from speedfix.model.index import CallSite
from speedfix.model.networks import calls_in_training_step, model_names
from speedfix.syntax.names import dotted_name


def call_subjects(ctx: FileContext, site: CallSite, *, receiver: bool) -> set[str] | None:
    """The names a call acts on: its receiver (``receiver``: `model.compile()`, `x.to(...)`) or
    its first argument (`torch.compile(model)`), and the name its value is assigned to
    (`model = torch.compile(model)`, `model = Net().to(...)`). None when it cannot say: the
    subject is an expression, or a function of the file (`torch.compile(train_step)`)."""
    call = site.node
    subject: cst.BaseExpression | None
    if receiver:
        subject = call.func.value if isinstance(call.func, cst.Attribute) else None
        while isinstance(subject, cst.Call) and isinstance(subject.func, cst.Attribute):  # `x.cuda().to(...)`
            subject = subject.func.value
    else:
        first = next((arg for arg in call.args if arg.keyword is None or arg.keyword.value == "model"), None)
        subject = first.value if first is not None and not first.star else None
    target = _assigned_to(site)
    name = dotted_name(subject) if subject is not None else None
    if name is None:
        # `model = Net().to(memory_format=...)`, `real = data[0].to(...)`: the assignment names it
        return {target} if target is not None and subject is not None else None
    if name.split(".")[0] in ctx.functions:
        return None  # compiling a function of the file: it may run any model
    return {name, target} if target is not None else {name}


def _assigned_to(site: CallSite) -> str | None:
    """`y = <expression holding the call>`: `y`, when the statement is that one assignment."""
    statement = site.statement
    if statement is None or len(statement.body) != 1 or not isinstance(statement.body[0], cst.Assign):
        return None
    assign = statement.body[0]
    return dotted_name(assign.targets[0].target) if len(assign.targets) == 1 else None


def is_for_model(ctx: FileContext, subjects: set[str] | None, model: str, stack: Stack,
                 others: list[tuple[str, Stack]]) -> bool:
    """Does a call acting on ``subjects`` act for ``model`` (trained at ``stack``)? Yes for the
    model under any of its names and for the batch it is called on in the training step; no
    for another of the ``others`` models, or the batch only another model is called on; yes
    when it cannot say (``subjects`` None, or a name it cannot place)."""
    if subjects is None:
        return True
    if _acts_on(ctx, subjects, model, stack):
        return True
    return not any(other != model and _acts_on(ctx, subjects, other, other_stack) for other, other_stack in others)


def _acts_on(ctx: FileContext, subjects: set[str], model: str, stack: Stack) -> bool:
    names = model_names(ctx, model, stack)
    every = set().union(*names.values())
    inputs = {name for site in calls_in_training_step(ctx, names) for arg in site.node.args
              if (name := dotted_name(arg.value)) is not None}  # `netD(real)`: `real`
    return any(subject in inputs or any(subject == n or subject.startswith(n + ".") for n in every)
               for subject in subjects)
