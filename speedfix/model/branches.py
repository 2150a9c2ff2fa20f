"""Which code inside a training step does not run on every step, and which runs many times in one.

The context already takes code under `if step % N == 0:` off the hot path. Rules about per-step
costs (host syncs, `synchronize()`, `empty_cache()`) also need the rarer branches inside a step:

- a branch that ends the run or the loop (`if not math.isfinite(loss_value): print(...);
  sys.exit(1)`, a `raise`, a `break` out of the step loop) or that runs on one step
  (`if step == 0:`): ONCE;
- an `except` handler (`except torch.cuda.OutOfMemoryError: torch.cuda.empty_cache()`): ERROR;
- an opt-in debugging, timing or plotting flag (`if args.synchronize_step:`, `if debug:`,
  `if args.visdom:`), unless it is on with the script's defaults (`DEBUG = True`,
  `default=True`): FLAG; also a helper that the loop calls only under such a flag
  (`if args.visdom: update_vis_plot(...)`).

``BranchTracker`` is a mixin for rules: during the one traversal it keeps ``branches``, the
`if`/`else`/`except` branches around the node being visited; ``rare_path`` then says whether
one of them, inside the step, makes the code rare.

The other way round, ``element_loop`` finds a loop inside the step over the elements of a
batch, a sequence or a list of tensors (`for i in range(batch_size):`, `[p.item() for p in
preds]`): code there runs once per element, many times per step. A loop over a few named values
(`for name, value in losses.items():`, a literal tuple, `range(3)`) is no such loop.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import ClassVar, Sequence, Union

import libcst as cst

from speedfix.model.arguments import find_argument, literal_int
from speedfix.model.context import FileContext
from speedfix.model.flow import default_truth, enclosing_statements
from speedfix.model.frameworks import accelerator_step_state
from speedfix.model.frames import FrameKind, Stack
from speedfix.model.index import runs_on_one_pass
from speedfix.model.patterns import unwrap_iterable
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import code_of, walk_expression
from speedfix.syntax.walk import Visitor

BranchNode = Union[cst.If, cst.ExceptHandler, cst.ExceptStarHandler]

# Words of a flag's name that mark it as debugging or timing (split at `_`: `synchronize_step`).
_FLAG_WORDS = frozenset(
    """
    debug debugging dbg verbose profile profiling profiler prof timing timings time timer timed
    benchmark bench sync synchronize synchronise trace tracing anomaly sanity nan
    visdom vis visualize visualise visualization visualisation plot plots plotting
    """.split()
)
_EXITS = ("sys.exit", "os._exit", "os.abort")


class Rare(Enum):
    ONCE = "once"  # ends the run or the step loop, or runs on a single step
    ERROR = "error"  # an exception handler
    FLAG = "flag"  # an opt-in debugging or timing flag
    EVAL = "eval"  # a module's evaluation mode only (`if not self.training:` in a `forward`)


@dataclass(frozen=True, slots=True)
class Branch:
    node: BranchNode
    taken: bool  # in the `if` body (True) or in its `else`/`elif` part (False)
    stack: Stack  # the context's frames where the branch starts


@dataclass(frozen=True)
class RarePath:
    kind: Rare
    branch: Branch
    flag: str | None = None  # FLAG: the flag as written (`args.synchronize_step`)


class BranchTracker(Visitor):
    """Mixin for a rule (which has ``ctx``): ``branches`` around the node being visited,
    outermost first, and kept for the calls named in ``tracked_calls`` (``branches_at``)."""

    ctx: FileContext
    branches: tuple[Branch, ...] = ()
    # last names: `synchronize`, `collect`; None: every call (a helper's call site counts too)
    tracked_calls: ClassVar[frozenset[str] | None] = frozenset()
    _tracked: dict[cst.Call, tuple[Branch, ...]] | None = None

    def visit_Call(self, node: cst.Call) -> None:
        name = node.func.attr if isinstance(node.func, cst.Attribute) else node.func
        if self.branches and (self.tracked_calls is None or isinstance(name, cst.Name) and name.value in self.tracked_calls):
            if self._tracked is None:
                self._tracked = {}
            self._tracked[node] = self.branches

    def branches_at(self, call: cst.Call) -> tuple[Branch, ...]:
        return self._tracked.get(call, ()) if self._tracked is not None else ()

    def _enter(self, node: BranchNode, taken: bool) -> None:
        self.branches = (*self.branches, Branch(node, taken, self.ctx.stack))

    def _leave(self) -> None:
        self.branches = self.branches[:-1]

    def visit_If_body(self, node: cst.If) -> None:
        self._enter(node, True)

    def leave_If_body(self, node: cst.If) -> None:
        self._leave()

    def visit_If_orelse(self, node: cst.If) -> None:
        self._enter(node, False)

    def leave_If_orelse(self, node: cst.If) -> None:
        self._leave()

    def visit_ExceptHandler_body(self, node: cst.ExceptHandler) -> None:
        self._enter(node, True)

    def leave_ExceptHandler_body(self, node: cst.ExceptHandler) -> None:
        self._leave()

    def visit_ExceptStarHandler_body(self, node: cst.ExceptStarHandler) -> None:
        self._enter(node, True)

    def leave_ExceptStarHandler_body(self, node: cst.ExceptStarHandler) -> None:
        self._leave()


@dataclass(frozen=True)
class Frequency:
    """How often a call in the training loop runs, when not on every step."""

    flag: str | None = None  # only while this opt-in flag is on
    interval: str | None = None  # every N steps (N as written), under a periodic guard

    @property
    def every_step(self) -> bool:
        return self.flag is None and self.interval is None

    def describe(self) -> str:
        if self.flag is not None:
            return f"while `{self.flag}` is on"
        return f"every `{self.interval}` steps" if self.interval else "every few steps"


def frequency(ctx: FileContext, stack: Stack, branches: Sequence[Branch]) -> Frequency | None:
    """How often code at ``stack`` runs in the training loop (periodic guards included); None
    outside it, or on a path that runs once or only on errors."""
    if not ctx.in_training_loop(stack):
        return None
    rare = rare_path(ctx, branches, ctx.step_scope(stack))
    if rare is not None and rare.kind is not Rare.FLAG:
        return None
    if not ctx.is_hot(stack):
        return Frequency(interval=_interval(stack) or "")
    return Frequency(flag=rare.flag if rare is not None else None)


_COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)
_NAMED_VALUES = frozenset({"items", "keys", "values"})  # a dict of named values: losses, metrics


def element_loop(ctx: FileContext, stack: Stack, statement: cst.CSTNode | None, node: cst.CSTNode) -> cst.CSTNode | None:
    """The innermost loop around ``node`` inside its training step (a `for` or `while` that takes
    no step of its own, in the step or in a function it calls, or a comprehension of
    ``statement``), when it runs once per element of a batch, a sequence or a list of tensors."""
    scope = ctx.step_scope(stack)
    if scope is None:
        return None
    if statement is not None:
        for comprehension in walk_expression(statement):
            if isinstance(comprehension, _COMPREHENSIONS) and any(inner is node for inner in walk_expression(comprehension)):
                return comprehension if _over_elements(ctx, comprehension.for_in.iter, stack) else None
    for frame in reversed(stack):
        if frame.node is scope:
            return None
        if frame.kind is FrameKind.LOOP and frame.node not in ctx.step_loops:
            info = ctx.loops.get(frame.node)
            iterable = info.iter if info is not None else None
            return frame.node if iterable is None or _over_elements(ctx, iterable, info.stack) else None  # a `while` counts
    return None


def loop_iterable(loop: cst.CSTNode) -> cst.BaseExpression | None:
    """What a `for` or a comprehension iterates (None for a `while`)."""
    if isinstance(loop, _COMPREHENSIONS):
        return loop.for_in.iter
    return loop.iter if isinstance(loop, cst.For) else None


# `range(max_turns)` with `max_turns=3`: a count the code states, this small, is a handful of passes
_HANDFUL = 16


def _over_elements(ctx: FileContext, iterable: cst.BaseExpression, stack: Stack) -> bool:
    source = unwrap_iterable(iterable)
    if isinstance(source, (cst.List, cst.Tuple, cst.Set, cst.Dict)):
        return False
    if isinstance(source, cst.Call):
        func = source.func
        if isinstance(func, cst.Attribute) and func.attr.value in _NAMED_VALUES:
            return False
        if dotted_name(func) == "range":  # `range(3)`: a fixed handful; `range(x.size(0))`: the batch
            return not all(isinstance(arg.value, cst.Integer) or _handful(ctx, arg.value, stack) for arg in source.args)
    return True


def _handful(ctx: FileContext, node: cst.BaseExpression, stack: Stack, depth: int = 0) -> bool:
    """Is ``node`` a count of at most ``_HANDFUL`` in every run: a constant, an option's default,
    or a parameter whose default is one and that every call of its function in the file passes
    such a count or leaves out (`rollout_single(..., max_turns)` inside `rollout_batch(...,
    max_turns=3)`)?"""
    count = literal_int(ctx, node, stack)
    if count is not None:
        return count <= _HANDFUL
    function = ctx.function_of(stack)
    if depth > 2 or not isinstance(node, cst.Name) or not isinstance(function, cst.FunctionDef) \
            or ctx.assignments_in(function, node.value):
        return False
    positional = [param.name.value for param in function.params.params]
    param = next((p for p in (*function.params.params, *function.params.kwonly_params) if p.name.value == node.value), None)
    if param is None or param.default is None or not _handful(ctx, param.default, stack, depth + 1):
        return False
    index = positional.index(node.value) if node.value in positional else None
    for site in ctx.calls:
        if (site.func or "").rsplit(".", 1)[-1] != function.name.value:
            continue
        if any(arg.star for arg in site.node.args):
            return False
        passed = find_argument(ctx, site, node.value, index)
        if not passed.missing and (passed.node is None or not _handful(ctx, passed.node, site.stack, depth + 1)):
            return False
    return True


def _interval(stack: Stack) -> str | None:
    """`100` in the innermost `if step % 100 == 0:` around ``stack``."""
    for frame in reversed(stack):
        if frame.kind is FrameKind.GUARD and isinstance(frame.node, cst.If):
            for node in walk_expression(frame.node.test):
                if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo):
                    return code_of(node.right)
    return None


def rare_path(ctx: FileContext, branches: Sequence[Branch], scope: cst.CSTNode | None) -> RarePath | None:
    """The innermost branch inside ``scope`` (a step loop or hot function, see
    ``FileContext.step_scope``) that keeps code from running on every step, or None."""
    for branch in reversed(branches):
        if not any(frame.node is scope for frame in branch.stack):
            return None  # this branch and the ones around it enclose the whole step
        found = _rarity(ctx, branch, scope)
        if found is not None:
            return found
    return _gated_calls(ctx, scope) if isinstance(scope, cst.FunctionDef) else None


def _gated_calls(ctx: FileContext, function: cst.FunctionDef, depth: int = 0) -> RarePath | None:
    """A hot function whose every call in the training loop sits under an opt-in flag
    (`if args.visdom: update_vis_plot(...)`), or in evaluation mode only (`if not
    self.training:` in a `forward`), also through one function that is itself gated so:
    its code runs only with that flag, or not in training."""
    found: RarePath | None = None
    for site in ctx.local_callers(function):
        if site.statement is None or not ctx.in_training_loop(site.stack):
            continue
        found = _gate_of(ctx, site.statement, site.stack)
        caller = ctx.function_of(site.stack)
        if found is None and depth < 1 and isinstance(caller, cst.FunctionDef) and caller is not function:
            found = _gated_calls(ctx, caller, depth + 1)
        if found is None:
            return None
    return found


def _gate_of(ctx: FileContext, statement: cst.BaseStatement, stack: Stack) -> RarePath | None:
    """The `if <opt-in flag>:` around ``statement`` inside its loop or function, or None."""
    inner = statement
    for outer in enclosing_statements(ctx, statement)[1:]:
        if isinstance(outer, (cst.For, cst.While, cst.FunctionDef)):
            return None
        if isinstance(outer, cst.If) and isinstance(outer.body, cst.IndentedBlock) and inner in outer.body.body:
            branch = Branch(outer, True, stack)
            if _in_eval_mode_only(outer.test, True):
                return RarePath(Rare.EVAL, branch)
            flag = _opt_in_flag(ctx, outer.test, branch)
            if flag is not None and default_truth(ctx, outer.test, stack) is False:  # certainly off by default
                return RarePath(Rare.FLAG, branch, flag)
        inner = outer
    return None


def _rarity(ctx: FileContext, branch: Branch, scope: cst.CSTNode | None) -> RarePath | None:
    node = branch.node
    if not isinstance(node, cst.If):
        return RarePath(Rare.ERROR, branch)
    if branch.taken and _runs_on_one_step(ctx, node.test, scope):
        return RarePath(Rare.ONCE, branch)
    if _in_eval_mode_only(node.test, branch.taken):
        return RarePath(Rare.EVAL, branch)
    block = node.body if branch.taken else node.orelse.body if isinstance(node.orelse, cst.Else) else None
    if block is not None and _ends_the_loop(ctx, block, branch.stack, scope):
        return RarePath(Rare.ONCE, branch)
    flag = _opt_in_flag(ctx, node.test, branch)
    return RarePath(Rare.FLAG, branch, flag) if flag else None


def _in_eval_mode_only(test: cst.BaseExpression, taken: bool) -> bool:
    """Is the branch taken only when the module is not training: the body of `if not
    self.training:` (also one operand of an `and`: OmniGen's `if offload_model and not
    self.training:`), or the `else` of `if self.training:`?"""
    if not taken:
        return _is_self_training(test)
    operands = []
    while isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        operands.append(test.right)
        test = test.left
    operands.append(test)
    return any(isinstance(operand, cst.UnaryOperation) and isinstance(operand.operator, cst.Not)
               and _is_self_training(operand.expression) for operand in operands)


def _is_self_training(node: cst.BaseExpression) -> bool:
    return dotted_name(node) == "self.training"


# ---------------------------------------------------------------- once
def _ends_the_loop(ctx: FileContext, block: cst.BaseSuite, stack: Stack, scope: cst.CSTNode | None) -> bool:
    """Does ``block`` end with `raise`, `sys.exit()`, or a `break`/`return` that leaves the step loop?"""
    statements = block.body
    last = statements[-1] if statements else None
    if isinstance(last, cst.SimpleStatementLine):
        small: cst.BaseSmallStatement | None = last.body[-1] if last.body else None
    elif isinstance(block, cst.SimpleStatementSuite):
        small = block.body[-1] if block.body else None
    else:
        return False
    if isinstance(small, cst.Raise):
        return True
    if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
        func = small.value.func
        qualified = ctx.qualname(func)
        return qualified in _EXITS or (qualified is None and dotted_name(func) in ("exit", "quit"))
    if not isinstance(scope, (cst.For, cst.While)):
        return False  # in a hot function, `break`/`return` only end this step
    if isinstance(small, cst.Break):
        return ctx.nearest_loop(stack) is scope
    if isinstance(small, cst.Return):
        return not _function_inside(stack, scope)
    return False


def _function_inside(stack: Stack, scope: cst.CSTNode) -> bool:
    """Is there a function boundary between ``scope`` and the innermost frame of ``stack``?"""
    inside = False
    for frame in stack:
        if frame.node is scope:
            inside = True
        elif inside and frame.kind is FrameKind.FUNCTION:
            return True
    return False


def _runs_on_one_step(ctx: FileContext, test: cst.BaseExpression, scope: cst.CSTNode | None) -> bool:
    """`step == 0`, `i == len(loader) - 1`, `epoch == 0 and step == 0`: the step loop's own
    counter compared for equality (an epoch counter or a rank would not do)."""
    return runs_on_one_pass(test, lambda name: _is_step_counter(ctx, name, scope))


def _is_step_counter(ctx: FileContext, name: str, scope: cst.CSTNode | None) -> bool:
    info = ctx.loops.get(scope) if scope is not None else None
    if info is None:
        return False
    if name in info.targets:
        return True
    return any(a.augmented and ctx.nearest_loop(a.stack) is scope for a in ctx.assignments.get(name, ()))


# ---------------------------------------------------------------- flags
def opt_in_flag(ctx: FileContext, branches: Sequence[Branch]) -> str | None:
    """The debugging/timing flag (off by default) that one of ``branches`` needs, or None."""
    for branch in reversed(branches):
        if isinstance(branch.node, cst.If):
            flag = _opt_in_flag(ctx, branch.node.test, branch)
            if flag is not None:
                return flag
    return None


def _opt_in_flag(ctx: FileContext, test: cst.BaseExpression, branch: Branch) -> str | None:
    """The debugging/timing flag that must be on for the branch to run, or None."""
    if not branch.taken:
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            return _flag(ctx, test.expression, branch.stack)
        return None
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return _opt_in_flag(ctx, test.left, branch) or _opt_in_flag(ctx, test.right, branch)
    return _flag(ctx, test, branch.stack)


def _flag(ctx: FileContext, expr: cst.BaseExpression, stack: Stack) -> str | None:
    name = dotted_name(expr)
    if name is None or accelerator_step_state(ctx, expr):
        return None
    words = set(re.split(r"_+", name.rsplit(".", 1)[-1].lower()))
    if not words & _FLAG_WORDS or default_truth(ctx, expr, stack) is True:
        return None  # `DEBUG = True`, `action="store_false"`: left on, so not opt-in
    return name
