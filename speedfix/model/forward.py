"""The forward pass of a training step, as the statements of a block show it.

Several fixes put a `with` around the statements that run the model and compute the loss that a
``backward()`` call differentiates (autocast, SF202; DDP's ``no_sync``, SF802), and some rules
ask whether code runs the model at all (an evaluation loop, SF702). A "model call" is a call of a
local object (``model(x)``, ``self.net(x)``) that is not named like a loss function; calls of
imports, of the file's own functions and classes, and of builtins are not.
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Iterator

import libcst as cst

from speedfix.model.context import FileContext
from speedfix.model.flow import enclosing_statements
from speedfix.model.frames import Stack
from speedfix.model.index import CallSite, entered
from speedfix.model.patterns import NO_GRAD
from speedfix.model.project_classes import project_class
from speedfix.syntax.blocks import statement_owner
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import target_names, walk_expression
from speedfix.syntax.walk import child_nodes

# Calls that move or reshape a batch rather than run the model: a statement made only of these
# is data preparation and stays outside the wrapped block.
_DATA_MOVES = frozenset({"to", "cuda", "pin_memory", "float", "long", "view", "reshape", "squeeze", "unsqueeze"})
_STEP_CALLS = frozenset({"backward", "step", "zero_grad"})
LOSS_NAME = re.compile(r"loss|criterion", re.IGNORECASE)


def forward_range(ctx: FileContext, statements: list[cst.BaseStatement], site: CallSite) -> tuple[int, int] | None:
    """(first, last) indices in ``statements`` of those computing the loss that the backward call
    ``site`` differentiates: from the model call to the last assignment of the loss before the
    backward statement. None when they are not next to it in the same block."""
    index = next((i for i, s in enumerate(statements) if s is site.statement), None)
    func = site.node.func
    if index is None or site.statement is None or not isinstance(func, cst.Attribute) or len(site.statement.body) != 1:
        return None
    loss = _loss_name(func.value)
    if loss is None:
        return None
    end = next((i for i in range(index - 1, -1, -1) if loss in assigned_names(statements[i])), None)
    if end is None:
        return None
    needed = read_names(statements[end])
    start = end
    for i in range(end - 1, -1, -1):
        candidate = statements[i]
        if not (assigned_names(candidate) & needed) or not _computes(candidate):
            break
        needed |= read_names(candidate)
        start = i
    while start <= end and not calls_model(ctx, statements[start]):
        start += 1
    if start > end or any(steps(statements[i]) for i in range(start, end + 1)):
        return None
    return start, end


def calls_model(ctx: FileContext, node: cst.CSTNode) -> bool:
    """Does ``node`` call the model (a local object that is not the loss function), also by its
    `forward` (`model.forward(input_ids=x)`)?"""
    return calls_model_with_grad(ctx, node, None)


def calls_model_with_grad(ctx: FileContext, node: cst.CSTNode, owner: str | None) -> bool:
    """``calls_model``, where a call of a method of the class ``owner`` (`self.generate_eval(...)`)
    counts by what that method runs: the model outside `torch.no_grad()`/`inference_mode()`
    (trlx's `generate_eval`, whose `generate` sits in a `with torch.no_grad():`, does not)."""
    return any(_runs_model(ctx, call, owner, 0) for call in _calls(ctx, node, skip_no_grad=False))


def _runs_model(ctx: FileContext, call: cst.Call, owner: str | None, depth: int) -> bool:
    name = dotted_name(call.func)
    method = _own_method(ctx, name, owner)
    if method is not None:
        return depth < 2 and not _no_grad_decorated(ctx, method) and any(
            _runs_model(ctx, inner, owner, depth + 1) for inner in _calls(ctx, method.body, skip_no_grad=True))
    if name is not None and name.endswith(".forward"):
        name = name[: -len(".forward")]
    return is_local_object(ctx, name) and not LOSS_NAME.search(name or "")


def _calls(ctx: FileContext, node: cst.CSTNode, *, skip_no_grad: bool) -> Iterator[cst.Call]:
    """The calls below ``node``; with ``skip_no_grad``, not those inside a `with torch.no_grad():`."""
    todo = [node]
    while todo:
        current = todo.pop()
        if isinstance(current, cst.Call):
            yield current
        if skip_no_grad and isinstance(current, cst.With) and any(
                isinstance(item.item, cst.Call) and ctx.qualname(entered(item.item).func) in NO_GRAD  # type: ignore[attr-defined]
                for item in current.items):
            continue
        todo.extend(child_nodes(current))


def _own_method(ctx: FileContext, name: str | None, owner: str | None) -> cst.FunctionDef | None:
    """The method of class ``owner`` that `self.<name>(...)` calls, if the class defines it."""
    if owner is None or name is None or not name.startswith("self.") or name.count(".") != 1:
        return None
    found = [info.node for info in ctx.functions.get(name[5:], ()) if info.class_name == owner]
    return found[0] if len(found) == 1 and isinstance(found[0], cst.FunctionDef) else None


def _no_grad_decorated(ctx: FileContext, function: cst.FunctionDef) -> bool:
    return any(ctx.qualname(decorator.decorator.func if isinstance(decorator.decorator, cst.Call)
                            else decorator.decorator) in NO_GRAD for decorator in function.decorators)


def is_local_object(ctx: FileContext, name: str | None) -> bool:
    """`model(x)`, `self.net(x)`: a call of an object (the model, a loss module), not of an
    import, a def, a class or a builtin."""
    if name is None:
        return False
    root = name.split(".")[0]
    if root == "self":
        return name.count(".") == 1
    if "." in name or ctx.imports.resolve(root) is not None:
        return False
    return root not in ctx.functions and root not in ctx.classes and not hasattr(builtins, root)


def plain_object(ctx: FileContext, name: str, stack: Stack) -> bool:
    """Is ``name`` made, wherever it is assigned, by a class that is no module: one of the file's
    own or of another project file that has no base class (`scheduler = StepLR(optimizer, lr)`
    with utility/step_lr.py's `class StepLR:`), or a learning-rate scheduler of torch? A class
    with any base may be a module and is not one of these."""
    found = ctx.assignments_in_scope(name, stack)
    if not found:
        return False
    for assignment in found:
        value = assignment.value
        if type(value) is not cst.Call:
            return False
        called = dotted_name(value.func)
        if called in ctx.classes:
            if ctx.class_bases(called) - {"object"}:
                return False
            continue
        qualified = ctx.qualname(value.func) or ""
        if qualified.startswith("torch.optim.lr_scheduler."):
            continue
        defined = project_class(ctx.project, qualified, beside_script=True) if ctx.project is not None and qualified else None
        if defined is None or any(base != "object" for base in defined.bases):
            return False
    return True


# A call whose last name has one of these words runs an evaluation, a test or a save: `eval_step(...)`,
# `run_validation()`, `torch.save(...)`, `save_image(...)`, `train_state.save(path)`, `save_checkpoint(...)`
# (`sample`, `generate`, `pipeline`: a diffusion model's periodic samples, SVD_Xtend's
# `video_frames = pipeline(...)` then `export_to_gif(...)`)
_PHASE_WORDS = frozenset({"eval", "evaluate", "evaluation", "validate", "validation", "test", "save", "checkpoint", "ckpt",
                          "sample", "samples", "sampling", "generate", "generation", "inference", "infer", "pipeline",
                          "export", "visualize", "visualise"})


def before_evaluation(ctx: FileContext, site: CallSite) -> bool:
    """Does the innermost `if` around ``site`` (a periodic branch of the training loop: `if steps
    % validation_interval == 0:`) run an evaluation pass: a loop under `torch.no_grad()`, or a call
    named for an evaluation, a test or a save (`model.eval()`, `eval_step(...)`, `torch.save(...)`,
    `save_image(...)`)? HiFi-GAN empties the CUDA cache there before validating; U-ViT around the
    sampling and the checkpoint it saves every 5,000 steps."""
    if site.statement is None:
        return False
    branch = next((outer for outer in enclosing_statements(ctx, site.statement)[1:] if isinstance(outer, cst.If)), None)
    if branch is None:
        return False
    evaluates = has_loop = False
    for node in walk_expression(branch.body):
        kind = type(node)
        if kind in (cst.For, cst.While):
            has_loop = True
        elif kind is cst.Call and _PHASE_WORDS.intersection((dotted_name(node.func) or "").rpartition(".")[2].lower().split("_")):
            return True  # `model.eval()`, `eval_step(...)`, `torch.save(...)`
        elif kind is cst.With and any(type(manager := entered(item.item)) is cst.Call
                                      and ctx.qualname(manager.func) in NO_GRAD for item in node.items):
            evaluates = True  # `with torch.no_grad():` (a loop must be there too)
    return has_loop and evaluates


def backward_calls(ctx: FileContext) -> list[CallSite]:
    """`loss.backward()` calls in training loops (not `accelerator.backward(loss)`, whose
    framework owns precision and gradient sync)."""
    return [
        site for site in ctx.method_calls("backward")
        if not (site.node.args and site.node.args[0].keyword is None) and ctx.in_training_loop(site.stack)
    ]


def statement_block(ctx: FileContext, statement: cst.BaseStatement | None) -> tuple[cst.IndentedBlock, list[cst.BaseStatement]] | None:
    """(the indented block that holds ``statement``, its statements), or None (module level, a
    one-line block)."""
    found = statement_owner(ctx, statement) if statement is not None else None
    block = getattr(found[0], "body", None) if found is not None else None
    return (block, found[1]) if found is not None and isinstance(block, cst.IndentedBlock) else None


def wrap(block: cst.CSTNode, spans: list[tuple[int, int]], context: str) -> cst.CSTNode:
    """``block`` with the statements of each (first, last) span inside `with <context>:`.

    A fix using this restructures the block (``Rule.report(restructures=block)``), so no other
    fix touches it in the same pass: the indices computed from the analysed block still hold."""
    assert isinstance(block, cst.IndentedBlock)
    body = list(block.body)
    for start, end in sorted(set(spans), reverse=True):
        body[start : end + 1] = [with_statement(context, body[start : end + 1])]
    return block.with_changes(body=body)


def with_statement(context: str, statements: list[cst.BaseStatement]) -> cst.With:
    """`with <context>:` around ``statements``; the comments above the first one go above it."""
    head = statements[0]
    return cst.With(
        items=[cst.WithItem(cst.parse_expression(context))],
        body=cst.IndentedBlock(body=[head.with_changes(leading_lines=[]), *statements[1:]]),
        leading_lines=head.leading_lines,
    )


def _loss_name(receiver: cst.BaseExpression) -> str | None:
    """`loss` in `loss.backward()`, `(loss / accum).backward()` and `scaler.scale(loss).backward()`."""
    if isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Attribute) and receiver.func.attr.value == "scale":
        receiver = receiver.args[0].value if receiver.args else receiver
    if isinstance(receiver, cst.BinaryOperation):
        receiver = receiver.left
    return dotted_name(receiver)


def assigned_names(statement: cst.BaseStatement | cst.Else, *, in_with: bool = False) -> set[str]:
    """Names a statement assigns, looking into `with` blocks (`with autocast(): loss = ...`) and,
    inside one, into the branches of an `if` (DINO's frozen backbone: `with torch.no_grad(): if
    vit: ... else: ...`). An `if` of its own is not looked into: its branches may compute
    different things (`output, hidden = model(x, hidden)` in one of them)."""
    if isinstance(statement, cst.With) or (in_with and isinstance(statement, (cst.If, cst.Else))):
        if not isinstance(statement.body, cst.IndentedBlock):
            return set()
        names: set[str] = set()
        for inner in statement.body.body:
            names |= assigned_names(inner, in_with=True)
        orelse = getattr(statement, "orelse", None)
        return names | assigned_names(orelse, in_with=True) if orelse is not None else names
    if not isinstance(statement, cst.SimpleStatementLine):
        return set()
    names = set()
    for small in statement.body:
        if isinstance(small, cst.Assign):
            for target in small.targets:
                names.update(target_names(target.target))
        elif isinstance(small, (cst.AugAssign, cst.AnnAssign)):
            names.update(target_names(small.target))
    return names


def read_names(node: cst.CSTNode) -> set[str]:
    """Every dotted name in ``node``: `self.model` gives `self.model` and `self`."""
    names: set[str] = set()
    for child in walk_expression(node):
        if isinstance(child, (cst.Name, cst.Attribute)):
            name = dotted_name(child)
            if name:
                names.add(name)
    return names


def _computes(statement: cst.BaseStatement) -> bool:
    """Does the statement call anything besides moving or reshaping data?"""
    for node in walk_expression(statement):
        if isinstance(node, cst.Call):
            if not (isinstance(node.func, cst.Attribute) and node.func.attr.value in _DATA_MOVES):
                return True
    return False


def steps(statement: cst.CSTNode) -> bool:
    """Does the statement call `backward()`, `step()` or `zero_grad()`?"""
    return any(
        isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in _STEP_CALLS
        for node in walk_expression(statement)
    )
