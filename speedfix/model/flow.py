"""Control flow between statements: what encloses a statement, in what order statements come,
and does a statement run when the script is started with its default options?

`if args.compile: model = torch.compile(model)` with `--compile` defaulting to False, or nanoGPT's
`compile = False` at module level, leaves the default run uncompiled: a rule must not take such an
option for the optimization itself. A statement is *off by default* when an `if` on its way
from the module is certainly not taken with the defaults: its test reads argparse defaults
(`store_true` flags are False, an option without a default is None), module-level constants and
literals, combined with `not`/`and`/`or` and `is (not) None`; strings compare too (`opt == "adam"`
with `--opt` defaulting to `adamw`, after `.lower()` or `.split("_")[-1]`), a name the function
rebinds line after line has its last value before the `if`, and a module the script hands its
parsed options to (`create_optimizer(args, ...)`) reads the script's defaults. Anything else (`if use_amp:`,
`if torch.cuda.is_available():`) counts as taken: a rule stays silent rather than guess.
`reached_by_launch` asks the same of each launch command of the project (`--use_lora` sets
`args.use_lora`), with the defaults for the options a command leaves out.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Callable, Iterable, Iterator
from weakref import WeakKeyDictionary

import libcst as cst

from speedfix.model import launch
from speedfix.model.arguments import (
    absl_flag_default, annotated_field_default, argparse_option, find_argument, imported_option_default, literal_int,
    option_read, parameter_default,
    passed_through_star_kwargs, run_option_default,
)
from speedfix.model.config_files import configured_get, configured_value
from speedfix.model.context import FileContext
from speedfix.model.frames import Frame, FrameKind, Stack, class_of, function_of
from speedfix.model.hydra_config import config_of
from speedfix.model.index import Assignment, CallSite
from speedfix.syntax.blocks import statement_owner
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import code_of, integer_value, negated_code, walk_expression
from speedfix.syntax.walk import child_nodes

_UNKNOWN = object()  # a default that cannot be known
_OBJECT = object()  # a default that is some object (a constructor call), certainly not None


def off_by_default(ctx: FileContext, statement: cst.BaseStatement | None, stack: Stack) -> str | None:
    """The test (as code, `args.compile`) of the `if` that keeps ``statement`` off the default
    path, or None when it runs by default or that cannot be known."""
    for owner in _owners(ctx, statement):
        if isinstance(owner, cst.If) and _truth_at(ctx, owner.test, stack, owner) is False:
            return code_of(owner.test)
        for test in _tests_passed_as_false(ctx, owner):
            if _truth_at(ctx, test, stack, _tested_at(ctx, test, owner)) is True:
                return negated_code(test)  # the `else:` of `if not fp16:`: `fp16`
    return None


def runs_by_default(ctx: FileContext, statement: cst.BaseStatement | None, stack: Stack) -> bool:
    """Is ``statement`` known to run with the script's defaults: every `if` on the way to it
    holds with them (for an `else:`, fails)? False where that cannot be known (a test of a value
    a config file or the command line gives)."""
    for owner in _owners(ctx, statement):
        if isinstance(owner, cst.If) and _truth_at(ctx, owner.test, stack, owner) is not True:
            return False
        for test in _tests_passed_as_false(ctx, owner):
            if _truth_at(ctx, test, stack, _tested_at(ctx, test, owner)) is not False:
                return False
    return True


def _truth_at(ctx: FileContext, test: cst.BaseExpression, stack: Stack, at: cst.CSTNode) -> bool | None:
    """``default_truth`` of the test of the `if` (or `elif`) ``at``: a name the function rebinds
    on its way there has the value of its last binding before it."""
    token = _AT.set(at)
    try:
        return default_truth(ctx, test, stack)
    finally:
        _AT.reset(token)


def _tested_at(ctx: FileContext, test: cst.BaseExpression, owner: cst.CSTNode) -> cst.CSTNode:
    """The `if`/`elif` of an earlier branch's ``test`` (the chain's first `if` where not found)."""
    parent = _chain_parents(ctx).get(id(owner))
    while parent is not None and parent.test is not test:
        parent = _chain_parents(ctx).get(id(parent))
    return parent if parent is not None else owner


def reached_by_launch(ctx: FileContext, statement: cst.BaseStatement | None, stack: Stack) -> bool | None:
    """Does one of the project's launch commands run ``statement``: every `if` on its way taken
    with that command's options (`--use_lora --gradient_checkpointing`) and the script's defaults
    for the rest? None when the project shows no command that runs the script; a test that
    cannot be worked out counts as taken."""
    commands = launch.launches(ctx)
    if not commands:
        return None
    return any(reached_by_command(ctx, statement, stack, command) for command in commands)


def in_no_run(ctx: FileContext, statement: cst.BaseStatement | None, stack: Stack) -> bool:
    """Does no run execute ``statement``: no launch command of the project reaches it, or, where
    the project shows none, the script's defaults keep it off (`if args.multi_gpu:` with
    `--multi_gpu` off by default, and no run script that passes it)?"""
    if not gates(ctx, statement):
        return False  # no test on the way: every run that runs the file runs it (no launch file read)
    reached = reached_by_launch(ctx, statement, stack)
    if reached is None and launch.launch_files_capped(ctx):
        return False  # the commands that would run it may lie in the launch files not read
    return reached is False or reached is None and off_by_default(ctx, statement, stack) is not None


def every_step_guards(ctx: FileContext) -> frozenset[int]:
    """The periodic guards of the file (by ``id``) that hold on every step of every run: each
    modulo divides by 1 in every run (`(step + 1) % gradient_accumulation == 0` with
    `gradient_accumulation = args.gradient_accumulation` and `--gradient_accumulation`
    defaulting to 1, or `step % 1`)."""
    return frozenset(
        id(guard) for guard, stack, divisors in ctx.unstated_periods
        if divisors and all(ctx.period_of(divisor, stack) == 1 or int_in_every_run(ctx, divisor, stack) == 1
                            for divisor in divisors))


def int_in_every_run(ctx: FileContext, node: cst.BaseExpression, stack: Stack, depth: int = 0) -> int | None:
    """The int ``node`` holds in every run of the script: its value with the script's defaults
    (``literal_int``: a literal, a constant, an argparse default), where no launch command of
    the project that runs the script gives the option it reads (`args.accumulation_steps`)
    another value; for a parameter of a module-level function that only this file calls, the
    value every call gives it (`make_data_loader(..., args.num_workers)`). None when that cannot
    be known."""
    value = literal_int(ctx, node, stack)
    if value is None:
        return _passed_in_every_run(ctx, node, stack, depth) if isinstance(node, cst.Name) else None
    alias = option_alias(ctx, node.value, stack) if isinstance(node, cst.Name) else None
    read = option_read(alias[0] if alias is not None else node)  # `accumulation = args.gradient_accumulation`
    if read is not None:
        if launch.launch_files_capped(ctx):
            return None  # a command among the launch files not read may set it
        for command in launch.launches(ctx):
            given = command.options.get(read[1])
            if given is not None and given != str(value):
                return None
    return value


def _passed_in_every_run(ctx: FileContext, name: cst.Name, stack: Stack, depth: int) -> int | None:
    """The int every call of the file gives the parameter ``name`` of the module-level function
    around ``stack``, each in every run (``int_in_every_run`` at the call); None where another
    scanned file calls the function, where nothing calls it, or where the calls disagree."""
    function = ctx.function_of(stack)
    if depth > 2 or not isinstance(function, cst.FunctionDef) \
            or any(called == function.name.value for called, _, _ in ctx.links.arguments):
        return None
    passed = passed_arguments(ctx, name.value, stack)
    if not passed:
        return None
    values = {int_in_every_run(ctx, given, at, depth + 1) for given, at in passed}
    found = values.pop() if len(values) == 1 else None
    return found


def option_alias(ctx: FileContext, name: str, stack: Stack) -> tuple[cst.BaseExpression, Stack] | None:
    """`args.fp16` (and where it is read) for ``name`` bound once, in the scope of ``stack``, to
    an option (`fp16 = args.fp16`)."""
    found = ctx.assignments_in_scope(name, stack)
    if len(found) != 1 or found[0].unpacked or found[0].augmented or option_read(found[0].value) is None:
        return None
    return found[0].value, found[0].stack


def reached_by_command(ctx: FileContext, statement: cst.BaseStatement | None, stack: Stack,
                       command: launch.Launch) -> bool:
    """Does this one launch command run ``statement`` (as ``reached_by_launch`` decides it)?"""
    options = _options(command)
    return all(_launch_truth(ctx, test, stack, options) is not (not wanted) for test, wanted in gates(ctx, statement))


def called_in_no_run(ctx: FileContext, stack: Stack, false_in_every_run: Callable[[cst.BaseExpression, Stack], bool],
                     depth: int = 0) -> bool:
    """Is the function around ``stack`` called in this file only where no run goes: each call
    behind an `if` that the script's defaults, or every launch command of the project, leave
    false, or whose test ``false_in_every_run`` says is (`if training_args.load_in_kbits in [4,
    8]: prepare_model_for_kbit_training(model)` with `--load_in_kbits 16`), or inside a function
    called only so? False when the file never calls it (another file may)."""
    function = function_of(stack)
    callers = ctx.local_callers(function) if isinstance(function, cst.FunctionDef) and depth < 3 else []
    if not callers:
        return False
    for site in callers:
        if in_no_run(ctx, site.statement, site.stack):
            continue
        if any(wanted and false_in_every_run(test, site.stack) for test, wanted in gates(ctx, site.statement)):
            continue
        if not called_in_no_run(ctx, site.stack, false_in_every_run, depth + 1):
            return False
    return True


def false_in_every_run(ctx: FileContext, value: cst.BaseExpression, stack: Stack) -> bool:
    """Is ``value`` (`args.set_grads_to_none`, a `store_true` flag) certainly false with the
    script's defaults and with every launch command of the project (none passes `--set_grads_to_none`)?"""
    return _truth_of_runs(ctx, value, stack) is False


def truth_in_every_run(ctx: FileContext, value: cst.BaseExpression, stack: Stack) -> bool | None:
    """The truth ``value`` (`args.fp16`, `default=True`) has with the script's defaults and with
    every launch command of the project; None when a command changes it or it cannot be known."""
    return None if launch.launch_files_capped(ctx) else _truth_of_runs(ctx, value, stack)


def _truth_of_runs(ctx: FileContext, value: cst.BaseExpression, stack: Stack) -> bool | None:
    """The truth ``value`` has with the defaults, when every launch command read agrees (None otherwise)."""
    truth = default_truth(ctx, value, stack)
    if truth is None:
        return None
    return truth if all(_launch_truth(ctx, value, stack, _options(command)) is truth
                        for command in launch.launches(ctx)) else None


def gates(ctx: FileContext, statement: cst.BaseStatement | None) -> list[tuple[cst.BaseExpression, bool]]:
    """The tests of the `if`s on the way to ``statement``, each with the truth it needs to be run."""
    return list(_gates(ctx, statement))


def _gates(ctx: FileContext, statement: cst.BaseStatement | None) -> Iterator[tuple[cst.BaseExpression, bool]]:
    """The tests on the way to ``statement``, each with the truth it needs to be run."""
    for owner in _owners(ctx, statement):
        if isinstance(owner, cst.If):
            yield owner.test, True
        for test in _tests_passed_as_false(ctx, owner):
            yield test, False


def _options(command: launch.Launch) -> dict[str, object]:
    return {name.replace("-", "_"): value for name, value in command.options.items()}


def _launch_truth(ctx: FileContext, test: cst.BaseExpression, stack: Stack, options: dict[str, object],
                  depth: int = 0) -> bool | None:
    """``test`` with the options a launch command passes (`args.use_lora` for `--use_lora`; also
    handed to a parameter, `train(..., use_torch_amp=run_config.use_torch_amp)`), the script's
    defaults for the others (None: unknown)."""
    if depth > 4:
        return None
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = _launch_truth(ctx, test.expression, stack, options, depth + 1)
        return None if inner is None else not inner
    if isinstance(test, cst.Name) and (passed := passed_arguments(ctx, test.value, stack)):
        truths = {_launch_truth(ctx, given, at, options, depth + 1) for given, at in passed}
        return truths.pop() if len(truths) == 1 else None
    if isinstance(test, cst.Name) and (alias := option_alias(ctx, test.value, stack)) is not None:
        return _launch_truth(ctx, alias[0], alias[1], options, depth + 1)  # `fp16 = args.fp16`, then `if fp16:`
    if isinstance(test, cst.BooleanOperation):
        left = _launch_truth(ctx, test.left, stack, options, depth + 1)
        right = _launch_truth(ctx, test.right, stack, options, depth + 1)
        if isinstance(test.operator, cst.And):
            return False if False in (left, right) else (True if left and right else None)
        return True if True in (left, right) else (False if left is False and right is False else None)
    if isinstance(test, cst.Attribute) and _launch_sets(ctx, test, stack, options):
        return launch.truth(options[test.attr.value])  # an option of the script the command sets
    if isinstance(test, cst.Attribute) and (derived := _derived_option(ctx, test)) is not None:
        return _launch_truth(ctx, derived.value, derived.stack, options, depth + 1)
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and isinstance(test.left, cst.Attribute) \
            and _launch_sets(ctx, test.left, stack, options):  # `args.load_in_kbits in [4, 8]` with `--load_in_kbits 4`
        target = test.comparisons[0]
        return compared(target.operator, _number_or_text(options[test.left.attr.value]),
                        literal_value(ctx, target.comparator, stack))
    return default_truth(ctx, test, stack)


def _derived_option(ctx: FileContext, node: cst.Attribute) -> Assignment | None:
    """The one assignment of the file to ``node`` (`args.distributed = args.world_size > 1 or
    args.multiprocessing_distributed`, pytorch/examples' ImageNet and MoCo), when it is no option
    of the parser and its value reads options (`args.X`)."""
    name = dotted_name(node)
    found = ctx.assignments.get(name, ()) if name is not None and "." in name else ()
    if len(found) != 1 or found[0].unpacked or found[0].augmented or argparse_option(ctx, node) is not None:
        return None
    head = name.split(".", 1)[0]
    reads = any(isinstance(part, cst.Attribute) and isinstance(part.value, cst.Name) and part.value.value == head
                for part in walk_expression(found[0].value))
    return found[0] if reads else None


def _launch_sets(ctx: FileContext, option: cst.Attribute, stack: Stack, options: dict[str, object]) -> bool:
    """Is ``option`` (`args.use_lora`) an option of the script that the command's ``options`` set?"""
    return option.attr.value in options and (
        argparse_option(ctx, option) is not None or annotated_field_default(ctx, option, stack) is not None
        or run_option_default(ctx, option, stack) is not None)


def _number_or_text(value: object) -> object:
    """A command line's word as the number it spells (`4`, `0.5`), else as it is."""
    if isinstance(value, str):
        for kind in (int, float):
            try:
                return kind(value)
            except ValueError:
                pass
    return value


def default_choice(ctx: FileContext, places: Iterable[tuple[cst.BaseStatement | None, Stack]]) -> tuple[bool, str | None]:
    """(does one of ``places`` run by default?; if none does, the test of the option that turns
    the first one on). The places are where a script makes a choice (`torch.compile`, a cuDNN
    setting); `(False, None)` when there are none."""
    gates: list[str] = []
    for statement, stack in places:
        gate = off_by_default(ctx, statement, stack)
        if gate is None:
            return True, None
        gates.append(gate)
    return False, gates[0] if gates else None


def unchosen_entry(ctx: FileContext, node: cst.BaseExpression, statement: cst.BaseStatement | None,
                   stack: Stack) -> str | None:
    """The key the defaults pick when ``node`` is another entry's value of a dict literal indexed
    at once (`{"adam": Adam(...), "sgd": SGD(...)}[optimizer_type]` with `optimizer_type = "sgd"`):
    Python builds every entry, but the unchosen ones are never used. None otherwise."""
    if statement is None:
        return None
    for subscript in walk_expression(statement):
        if not (isinstance(subscript, cst.Subscript) and isinstance(subscript.value, cst.Dict)
                and len(subscript.slice) == 1 and isinstance(subscript.slice[0].slice, cst.Index)):
            continue
        entry = next((e for e in subscript.value.elements if isinstance(e, cst.DictElement) and e.value is node), None)
        if entry is None:
            continue
        key = _default_value(ctx, entry.key, stack, 0)
        chosen = _default_value(ctx, subscript.slice[0].slice.value, stack, 0)
        return chosen if isinstance(key, str) and isinstance(chosen, str) and chosen != key else None
    return None


def enclosing_statements(ctx: FileContext, statement: cst.BaseStatement) -> list[cst.BaseStatement]:
    """``statement`` and the compound statements around it, innermost first."""
    found = [statement]
    for owner in _owners(ctx, statement):
        outer = _statement_of(ctx, owner)
        if isinstance(outer, cst.BaseStatement) and outer is not found[-1]:
            found.append(outer)
    return found


def _owners(ctx: FileContext, statement: cst.BaseStatement | None) -> Iterator[cst.CSTNode]:
    """The compound statements and clauses (`else:`, an `elif`) around ``statement``, innermost first."""
    node: cst.CSTNode | None = statement
    while isinstance(node, cst.BaseStatement):
        found = statement_owner(ctx, node)
        if found is None or isinstance(found[0], cst.Module):
            return
        yield found[0]
        node = _statement_of(ctx, found[0])


def default_truth(ctx: FileContext, test: cst.BaseExpression, stack: Stack, depth: int = 0) -> bool | None:
    """The truth value of ``test`` with the script's defaults (None: unknown)."""
    if depth > 4:
        return None
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = default_truth(ctx, test.expression, stack, depth + 1)
        return None if inner is None else not inner
    if isinstance(test, cst.BooleanOperation):
        left = default_truth(ctx, test.left, stack, depth + 1)
        right = default_truth(ctx, test.right, stack, depth + 1)
        if isinstance(test.operator, cst.And):
            return False if False in (left, right) else (True if left and right else None)
        return True if True in (left, right) else (False if left is False and right is False else None)
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        if isinstance(test.comparisons[0].operator, (cst.Equal, cst.NotEqual)) and not _is_none_test(test):
            equal = _same_string(ctx, test, stack, depth)  # `opt == "adam"` with `--opt` defaulting to "adamw"
            if equal is not None:
                return equal
        return _none_test(ctx, test, stack, depth) if _is_none_test(test) else _number_test(ctx, test, stack, depth)
    value = _default_value(ctx, test, stack, depth)
    return None if value is _UNKNOWN else _truth(value)


def _same_string(ctx: FileContext, test: cst.Comparison, stack: Stack, depth: int) -> bool | None:
    """`name == "adam"` / `name != "adam"` where both sides are strings the defaults give."""
    target = test.comparisons[0]
    left = _default_value(ctx, test.left, stack, depth + 1)
    if not isinstance(left, str):
        return None
    right = _default_value(ctx, target.comparator, stack, depth + 1)
    return compared(target.operator, left, right) if isinstance(right, str) else None


def taken_on_a_gpu(ctx: FileContext, test: cst.BaseExpression, stack: Stack) -> bool:
    """Is ``test`` true on a GPU machine with the script's defaults: `torch.cuda.is_available()`,
    and-ed with tests not false by default (`not args.disable_cuda`), also through a
    name bound once to such a test (DiGress's `use_gpu = cfg.general.gpus > 0 and
    torch.cuda.is_available()`)?"""
    parts: list[cst.BaseExpression] = [test]
    found_gpu = False
    if isinstance(test, cst.Name):
        parts = [ctx.single_value(test.value, stack) or test]  # `use_cuda = torch.cuda.is_available()` too
    while parts:
        part = parts.pop()
        if isinstance(part, cst.BooleanOperation) and isinstance(part.operator, cst.And):
            parts.extend((part.left, part.right))
        elif isinstance(part, cst.Call) and ctx.qualname(part.func) == "torch.cuda.is_available":
            found_gpu = True
        elif default_truth(ctx, part, stack) is False:
            return False  # (a test the defaults cannot settle, `cfg.general.gpus > 0` of a config, is a run's to take)
    return found_gpu


_NUMBER_TESTS = {
    cst.GreaterThan: lambda a, b: a > b, cst.GreaterThanEqual: lambda a, b: a >= b,
    cst.LessThan: lambda a, b: a < b, cst.LessThanEqual: lambda a, b: a <= b,
    cst.Equal: lambda a, b: a == b, cst.NotEqual: lambda a, b: a != b,
}


def _is_none_test(test: cst.Comparison) -> bool:
    target = test.comparisons[0]
    return isinstance(target.comparator, cst.Name) and target.comparator.value == "None"


def _number_test(ctx: FileContext, test: cst.Comparison, stack: Stack, depth: int) -> bool | None:
    """`num_gpus > 1` with `num_gpus = 1` (or an option's default of 1); `bits in [4, 8]`."""
    target = test.comparisons[0]
    left = _default_value(ctx, test.left, stack, depth + 1)
    return compared(target.operator, left, _default_value(ctx, target.comparator, stack, depth + 1))


def compared(operator: cst.BaseCompOp, left: object, right: object) -> bool | None:
    """Numbers compared (``_NUMBER_TESTS``), two strings compared with `==` or `!=`, or a number
    or string in a list, tuple or set of them."""
    if isinstance(operator, (cst.In, cst.NotIn)):
        if not isinstance(right, tuple) or not all(_is_scalar(value) for value in (left, *right)):
            return None
        return (left in right) is isinstance(operator, cst.In)
    if isinstance(operator, (cst.Equal, cst.NotEqual)) and isinstance(left, str) and isinstance(right, str):
        return (left == right) is isinstance(operator, cst.Equal)
    compare = _NUMBER_TESTS.get(type(operator))
    return compare(left, right) if compare is not None and _is_number(left) and _is_number(right) else None


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_scalar(value: object) -> bool:
    return _is_number(value) or isinstance(value, str)


def _none_test(ctx: FileContext, test: cst.Comparison, stack: Stack, depth: int) -> bool | None:
    """`x is None` / `x is not None` with x's default."""
    target = test.comparisons[0]
    if not (isinstance(target.comparator, cst.Name) and target.comparator.value == "None"):
        return None
    if not isinstance(target.operator, (cst.Is, cst.IsNot)):
        return None
    value = False if _filled_when_none(ctx, test.left, stack) else _default_value(ctx, test.left, stack, depth)
    if value is _UNKNOWN:
        return None
    is_none = value is None
    return is_none if isinstance(target.operator, cst.Is) else not is_none


def holds_in_every_run(ctx: FileContext, owner: cst.If, stack: Stack) -> bool:
    """Does the test of ``owner`` hold whatever a run passes: `if args.seed is not None:` after
    `if args.seed is None: args.seed = ...` (``_filled_when_none``)?"""
    test = owner.test
    if not (isinstance(test, cst.Comparison) and _is_none_test(test) and isinstance(test.comparisons[0].operator, cst.IsNot)):
        return False
    token = _AT.set(owner)
    try:
        return _filled_when_none(ctx, test.left, stack)
    finally:
        _AT.reset(token)


def _filled_when_none(ctx: FileContext, node: cst.BaseExpression, stack: Stack) -> bool:
    """Is ``node`` given a value earlier in the body of the function that tests it, whenever it
    is None (pointMLP: `if args.seed is None: args.seed = np.random.randint(1, 10000)`, then `if
    args.seed is not None:` holds in every run)? Read where the test is read (``_AT``)."""
    at = _AT.get()
    function = ctx.function_of(stack)
    body = function.body.body if isinstance(function, cst.FunctionDef) and isinstance(function.body, cst.IndentedBlock) \
        else ctx.module.body if function is None else ()
    wanted = code_of(node)
    for statement in body:
        if at is None or statement is at or not comes_before(ctx, statement, at):  # type: ignore[arg-type]
            return False
        if isinstance(statement, cst.If) and statement.orelse is None and isinstance(statement.test, cst.Comparison) \
                and _is_none_test(statement.test) and isinstance(statement.test.comparisons[0].operator, cst.Is) \
                and code_of(statement.test.left) == wanted and isinstance(statement.body, cst.IndentedBlock) \
                and any(_assigns_a_value(line, wanted) for line in statement.body.body):
            return True
    return False


def _assigns_a_value(statement: cst.BaseStatement, target: str) -> bool:
    """`target = <anything but None>` (one of the statement's small statements)."""
    return isinstance(statement, cst.SimpleStatementLine) and any(
        isinstance(small, cst.Assign) and len(small.targets) == 1 and code_of(small.targets[0].target) == target
        and not (isinstance(small.value, cst.Name) and small.value.value == "None") for small in statement.body)


def _default_value(ctx: FileContext, node: cst.BaseExpression, stack: Stack, depth: int) -> object:
    """A Python value for a literal, a module-level constant or an argparse option's (or absl
    flag's) default (``_UNKNOWN`` when it cannot be known)."""
    if depth > 8:
        return _UNKNOWN
    if isinstance(node, cst.Name):
        if node.value in ("True", "False", "None"):
            return {"True": True, "False": False, "None": None}[node.value]
        found = ctx.assignments_in_scope(node.value, stack)
        value = ctx.single_value(node.value, stack)
        if value is not None:
            return _following(found[0], lambda: _default_value(ctx, value, stack, depth + 1))
        last = _last_binding(ctx, found)
        if last is not None:  # timm's `opt_lower = args.opt.lower()`, then `opt_lower = opt_split[-1]`
            return _following(last, lambda: _default_value(ctx, last.value, last.stack, depth + 1))
        if len(found) > 1 and not any(a.unpacked or a.augmented for a in found):
            # llm.c's `FLASH = 0`, later `FLASH = args.flash` (default 0): the same value either way
            values = [_default_value(ctx, a.value, a.stack, depth + 1) for a in found]
            same = all(v is not _UNKNOWN and (v is values[0] or v == values[0]) for v in values)
            return values[0] if same else _UNKNOWN
        passed = _argument_default(ctx, node.value, stack, depth)
        default = parameter_default(ctx, node.value, stack, others=True) if passed is _UNKNOWN else None
        return passed if default is None else _default_value(ctx, default, stack, depth + 1)
    if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self":
        stored = _stored_attribute(ctx, code_of(node), stack)  # `self.amp = amp` in `__init__`
        return _UNKNOWN if stored is None else _default_value(ctx, stored.value, stored.stack, depth + 1)
    if isinstance(node, (cst.Call, cst.Subscript, cst.UnaryOperation)):
        derived = _derived_value(ctx, node, stack, depth)  # `args.opt.lower()`, `name.split("_")[-1]`, `-1`
        if derived is not _UNKNOWN:
            return derived
    if isinstance(node, cst.Integer):
        value = integer_value(node)
        return _UNKNOWN if value is None else value
    if isinstance(node, (cst.Float, cst.SimpleString)):
        return node.evaluated_value
    if isinstance(node, (cst.List, cst.Tuple, cst.Set)):  # `[4, 8]`: its values, when each is known
        values = tuple(_default_value(ctx, element.value, stack, depth + 1) for element in node.elements)
        return _UNKNOWN if any(value is _UNKNOWN for value in values) else values
    if isinstance(node, cst.IfExp):  # `GradScaler() if args.amp else None`
        chosen = default_truth(ctx, node.test, stack, depth + 1)
        return _UNKNOWN if chosen is None else _default_value(ctx, node.body if chosen else node.orelse, stack, depth + 1)
    if isinstance(node, cst.Call) and dotted_name(node.func) in ("int", "float") and len(node.args) == 1:
        value = _default_value(ctx, node.args[0].value, stack, depth + 1)  # `ngpu = int(opt.ngpu)`
        return value if _is_number(value) else _UNKNOWN
    if isinstance(node, cst.Call) and (dotted_name(node.func) or "").rsplit(".", 1)[-1][:1].isupper():
        return _OBJECT  # a class's constructor: some object, never None
    option = argparse_option(ctx, node)
    if option is not None:
        return _option_default(ctx, option.node, stack, depth)
    field = annotated_field_default(ctx, node, stack)  # `args.use_lora` of `def main(args: FlatArguments)`
    if field is None and isinstance(node, cst.Attribute) and (handed := run_option_default(ctx, node, stack)) is not None:
        # `args.opt` handed in by the script that parses it; a launch command may set it instead
        if launch.option_passed(ctx, node.attr.value):
            return _UNKNOWN
        field = handed
    if field is None:
        field = absl_flag_default(ctx, node, stack)  # `FLAGS.parallel` of `flags.DEFINE_bool("parallel", False)`
    if field is None and isinstance(node, (cst.Attribute, cst.Subscript)):
        configured = _hydra_value(ctx, node)  # `args.model.compile` of `@hydra.main`'s composed config
        if configured is not None:
            return configured
    if field is None and isinstance(node, cst.Attribute):
        agreed = configured_value(ctx, node)  # `hps.train.fp16_run`: what every run config of the project says
        if agreed is not None:
            return agreed.value
    if field is None and isinstance(node, cst.Attribute) and (imported := imported_option_default(ctx, node, stack)) is not None:
        # `args.local_rank` of a parser another file builds; a launch command may set it instead
        field = None if launch.option_passed(ctx, node.attr.value) else imported
        if field is None:
            return _UNKNOWN
    if field is not None:
        return _default_value(ctx, field, stack, depth + 1)
    return _UNKNOWN


def _hydra_value(ctx: FileContext, node: cst.BaseExpression) -> object | None:
    """The scalar a key of the config `@hydra.main` composes holds (nanoT5's `args.model.compile`
    with `compile: false` in configs/default.yaml): ``_UNKNOWN`` where the commands compose
    other configs or a launch command overrides the key (`model.compile=true`); None where the
    expression is no key of such a config, or the key holds no scalar."""
    found = config_of(ctx, node)
    if found is None:
        return None
    main, keys = found
    assert main.composed is not None
    value = main.composed.tree.get(*keys) if keys else None
    if value is None or isinstance(value.value, (dict, list)):
        return None
    dotted = ".".join(keys)
    if main.variants or any(dotted in word for command in launch.launches(ctx) for word in command.words):
        return _UNKNOWN
    return value.value


def literal_value(ctx: FileContext, node: cst.BaseExpression, stack: Stack) -> object:
    """The Python value of a literal (`[4, 8]`), a constant or an option's default; ``UNKNOWN``
    when it cannot be known."""
    return _default_value(ctx, node, stack, 0)


def _stored_attribute(ctx: FileContext, name: str, stack: Stack) -> Assignment | None:
    """The one plain assignment of `self.x` in the methods of the class around ``stack``."""
    owner = class_of(stack)
    if owner is None:
        return None
    found = [a for infos in ctx.functions.values() for info in infos if info.class_name == owner.name.value
             for a in ctx.assignments_in(info.node, name)]
    return found[0] if len(found) == 1 and not (found[0].unpacked or found[0].augmented) else None


def bound_once(ctx: FileContext, target: cst.BaseExpression, stack: Stack) -> tuple[cst.BaseExpression, Stack] | None:
    """The value (and its stack) of a name assigned once in scope, or of `self.x` assigned once
    in the methods of the class around ``stack``; None otherwise."""
    if isinstance(target, cst.Name):
        found = ctx.assignments_in_scope(target.value, stack)
        one = found[0] if len(found) == 1 and not (found[0].unpacked or found[0].augmented) else None
    elif isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) and target.value.value == "self":
        one = _stored_attribute(ctx, code_of(target), stack)
    else:
        one = None
    return None if one is None else (one.value, one.stack)


def _argument_default(ctx: FileContext, name: str, stack: Stack, depth: int) -> object:
    """A parameter of a module-level function: the value every call of it in the file passes
    (torchvision's `train_one_epoch(..., scaler)` with `scaler = GradScaler() if args.amp else None`)."""
    passed = passed_arguments(ctx, name, stack)
    values = [_default_value(ctx, given, at, depth + 1) for given, at in passed or ()]
    if not values or any(v is _UNKNOWN for v in values) or any(v is not values[0] and v != values[0] for v in values):
        return _UNKNOWN
    return values[0]


def passed_arguments(ctx: FileContext, name: str, stack: Stack) -> list[tuple[cst.BaseExpression, Stack]] | None:
    """The parameter ``name`` of the module-level function around ``stack``: what each call of
    the function in the file passes for it (the default where a call leaves it out), with the
    stack of the call. None when that cannot be known (the function rebinds the name, a call
    passes `*args`, a required parameter is left out); an empty list when nothing calls it."""
    function = ctx.function_of(stack)
    if not isinstance(function, cst.FunctionDef) or ctx.assignments_in(function, name):
        return None
    params = [param.name.value for param in function.params.params]
    if name not in params or not any(
            info.node is function and not info.stack for info in ctx.functions.get(function.name.value, ())):
        return None
    index = params.index(name)
    found: list[tuple[cst.BaseExpression, Stack]] = []
    for site in ctx.calls:
        if site.func != function.name.value:
            continue
        passed = find_argument(ctx, site, name, index)
        given = function.params.params[index].default if passed.missing else passed.node
        if given is None:
            return None  # `*args` in the call, or a required parameter left out
        found.append((given, site.stack))
    return found


def returned_values(ctx: FileContext, name: str | None) -> list[tuple[cst.BaseExpression, Stack]] | None:
    """What the module-level function ``name`` of the file returns, each value with the stack
    inside the function (None when no single such function is defined)."""
    functions = [info for info in ctx.functions.get(name or "", ()) if not info.stack]
    if len(functions) != 1:
        return None
    inside = (Frame(FrameKind.FUNCTION, functions[0].node),)
    return [(node.value, inside) for node in walk_expression(functions[0].node.body)
            if isinstance(node, cst.Return) and node.value is not None]


def _option_default(ctx: FileContext, call: cst.Call, stack: Stack, depth: int) -> object:
    keywords = {arg.keyword.value: arg.value for arg in call.args if arg.keyword is not None}
    if "default" in keywords:
        return _default_value(ctx, keywords["default"], stack, depth + 1)
    action = keywords.get("action")
    if isinstance(action, cst.SimpleString):
        kind = action.evaluated_value
        if kind == "store_true":
            return False
        if kind == "store_false":
            return True
        if kind in ("store", "append", "count"):
            return None
        return _UNKNOWN
    return None if action is None else _UNKNOWN


def _truth(value: object) -> bool | None:
    if isinstance(value, (bool, int, float, str)) or value is None:
        return bool(value)
    return None  # _OBJECT: its truth is its class's business


# ---------------------------------------------------------------- if/elif/else structure
def _tests_passed_as_false(ctx: FileContext, owner: cst.CSTNode) -> Iterator[cst.BaseExpression]:
    """For an `else:` clause or an `elif`, the tests of the earlier branches (all False there)."""
    parent = _chain_parents(ctx).get(id(owner))
    while parent is not None:
        yield parent.test
        parent = _chain_parents(ctx).get(id(parent))


def _statement_of(ctx: FileContext, owner: cst.CSTNode) -> cst.CSTNode | None:
    """The statement ``owner`` (a compound statement or one of its clauses) belongs to."""
    top = owner
    while id(top) in _chain_parents(ctx):
        top = _chain_parents(ctx)[id(top)]
    if isinstance(top, (cst.Else, cst.ExceptHandler, cst.Finally, cst.ExceptStarHandler)):
        return _clause_owners(ctx).get(id(top))
    return top


def comes_before(ctx: FileContext, first: cst.BaseStatement, second: cst.BaseStatement) -> bool:
    """Does ``first`` start before ``second`` in the file?"""
    order = _statement_order(ctx)
    return order.get(id(first), -1) < order.get(id(second), -1)


def _statement_order(ctx: FileContext) -> dict[int, int]:
    """id(a statement of the file) -> its place in the file, statements in order."""
    order = _ORDER.get(ctx)
    if order is None:
        order = _ORDER[ctx] = {id(node): index for index, node in enumerate(_statements_in_order(ctx.module.body))}
    return order


def _statements_in_order(body) -> Iterator[cst.BaseStatement]:  # type: ignore[no-untyped-def]
    for node in body:
        yield node
        if isinstance(node, cst.BaseCompoundStatement):
            for child in child_nodes(node):
                if isinstance(child, cst.IndentedBlock):
                    yield from _statements_in_order(child.body)
                elif isinstance(child, cst.If):
                    yield from _statements_in_order([child])
                elif isinstance(child, (cst.Else, cst.ExceptHandler, cst.Finally, cst.ExceptStarHandler)):
                    yield from _statements_in_order(_clause_body(child))


_ORDER: WeakKeyDictionary[FileContext, dict[int, int]] = WeakKeyDictionary()
_CHAINS: WeakKeyDictionary[FileContext, tuple[dict[int, cst.If], dict[int, cst.CSTNode]]] = WeakKeyDictionary()


def if_chain_top(ctx: FileContext, clause: cst.CSTNode) -> cst.If:
    """The first `if` of the if-chain that ``clause`` (an `if`, an `elif` or an `else` clause)
    belongs to: the statement whose place in its block the whole chain takes."""
    top = clause
    while (parent := _chain_parents(ctx).get(id(top))) is not None:
        top = parent
    assert isinstance(top, cst.If)
    return top


def _chain_parents(ctx: FileContext) -> dict[int, cst.If]:
    """id(an `elif` If or an `else` clause of an if-chain) -> the If it continues."""
    return _index(ctx)[0]


def _clause_owners(ctx: FileContext) -> dict[int, cst.CSTNode]:
    """id(an `else`/`except`/`finally` clause of a loop or try) -> its statement."""
    return _index(ctx)[1]


def _index(ctx: FileContext) -> tuple[dict[int, cst.If], dict[int, cst.CSTNode]]:
    found = _CHAINS.get(ctx)
    if found is None:
        parents: dict[int, cst.If] = {}
        clauses: dict[int, cst.CSTNode] = {}
        for statement in _compound_statements(ctx.module.body):
            if isinstance(statement, cst.If):
                current = statement
                while current.orelse is not None:
                    parents[id(current.orelse)] = current
                    if not isinstance(current.orelse, cst.If):
                        break
                    current = current.orelse
            for child in child_nodes(statement):
                if isinstance(child, (cst.Else, cst.ExceptHandler, cst.Finally, cst.ExceptStarHandler)):
                    clauses.setdefault(id(child), statement)
        found = _CHAINS[ctx] = (parents, clauses)
    return found


def _compound_statements(body) -> Iterator[cst.BaseCompoundStatement]:  # type: ignore[no-untyped-def]
    todo = list(body)
    while todo:
        node = todo.pop()
        if not isinstance(node, cst.BaseCompoundStatement):
            continue
        yield node
        for child in child_nodes(node):
            if isinstance(child, cst.IndentedBlock):
                todo.extend(child.body)
            elif isinstance(child, cst.If):  # an `elif`
                todo.append(child)
            elif isinstance(child, (cst.Else, cst.ExceptHandler, cst.Finally, cst.ExceptStarHandler)):
                todo.extend(_clause_body(child))


def _clause_body(clause: cst.CSTNode) -> list[cst.BaseStatement]:
    body = getattr(clause, "body", None)
    return list(body.body) if isinstance(body, cst.IndentedBlock) else []


def assigned_name(site: CallSite) -> str | None:
    """`loader = DataLoader(...)` (`trainer: Trainer = Trainer(...)` too): the name the call's
    value is bound to."""
    statement = site.statement
    if statement is None or len(statement.body) != 1:
        return None
    assign = statement.body[0]
    if isinstance(assign, cst.AnnAssign) and assign.value is site.node:
        return dotted_name(assign.target)
    if not isinstance(assign, cst.Assign) or assign.value is not site.node or len(assign.targets) != 1:
        return None
    return dotted_name(assign.targets[0].target)


def is_returned(function: cst.FunctionDef, site: CallSite) -> bool:
    """Does ``function`` return what the call of ``site`` makes: `return DataLoader(...)`,
    `return train, val`, or `optimizer = SGD(...)` then `return optimizer`?"""
    name = assigned_name(site)
    for node in walk_expression(function.body):
        if type(node) is cst.Return and node.value is not None:
            if any(n is site.node or (name is not None and dotted_name(n) == name) for n in walk_expression(node.value)):
                return True
    return False


def returned_at(function: cst.FunctionDef, site: CallSite, positions: Iterable[int]) -> bool:
    """Does ``function`` return what ``site`` makes as one of these elements of the tuple it
    returns (`return train_loader, test_loader` with position 0: the first)?"""
    name = assigned_name(site)
    wanted = set(positions)
    for node in walk_expression(function.body):
        if isinstance(node, cst.Return) and isinstance(node.value, (cst.Tuple, cst.List)):
            for position, element in enumerate(node.value.elements):
                value = element.value
                if position in wanted and (value is site.node or name is not None and dotted_name(value) == name):
                    return True
    return False


# ---------------------------------------------------------------- values derived from the defaults
_AT: ContextVar[cst.CSTNode | None] = ContextVar("speedfix_flow_at", default=None)  # where a test is read
_STRING_METHODS = ("lower", "upper", "strip", "split")


def _following(assignment: Assignment, evaluate: Callable[[], object]) -> object:
    """``evaluate`` an assignment's value where the assignment stands (for ``_last_binding``)."""
    if assignment.statement is None:
        return evaluate()
    token = _AT.set(assignment.statement)
    try:
        return evaluate()
    finally:
        _AT.reset(token)


def _last_binding(ctx: FileContext, found: list[Assignment]) -> Assignment | None:
    """Of a name bound several times, one after another in its function's body (no branch, no
    loop around any binding), the last binding before the statement being read (``_AT``)."""
    at = _AT.get()
    if len(found) < 2 or at is None or any(a.unpacked or a.augmented or a.statement is None for a in found):
        return None
    function = ctx.function_of(found[0].stack)
    if not isinstance(function, cst.FunctionDef) or not isinstance(function.body, cst.IndentedBlock):
        return None
    top_level = {id(statement) for statement in function.body.body}
    if not all(id(a.statement) in top_level for a in found):
        return None
    before = [a for a in found if a.statement is not at and comes_before(ctx, a.statement, at)]  # type: ignore[arg-type]
    return max(before, key=lambda a: _place(ctx, a.statement), default=None)  # type: ignore[arg-type]


def _place(ctx: FileContext, statement: cst.CSTNode) -> int:
    return _statement_order(ctx).get(id(statement), -1)


def _derived_value(ctx: FileContext, node: cst.BaseExpression, stack: Stack, depth: int) -> object:
    """A string method's result, an element of a known sequence, a negated number, an item of
    a function's `**kwargs` (`kwargs.get("fp16", False)`), a run config's `.get` (``configured_get``)."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in _STRING_METHODS:
        return _string_method(ctx, node, stack, depth)
    if (item := _star_kwargs_item(ctx, node, stack, depth)) is not _UNKNOWN:
        return item
    if isinstance(node, cst.Subscript) and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
        sequence = _default_value(ctx, node.value, stack, depth)
        index = _default_value(ctx, node.slice[0].slice.value, stack, depth)
        if isinstance(sequence, (tuple, str)) and isinstance(index, int) and not isinstance(index, bool) \
                and -len(sequence) <= index < len(sequence):
            return sequence[index]
        return _UNKNOWN
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        value = _default_value(ctx, node.expression, stack, depth)
        return -value if _is_number(value) else _UNKNOWN
    if isinstance(node, cst.Call) and len(node.args) <= 2:  # `hps.train.get("bf16_run", False)` of the run configs
        configured = configured_get(ctx, node)
        if configured is False:  # no run config sets the key
            return _default_value(ctx, node.args[1].value, stack, depth + 1) if len(node.args) == 2 else None
        if configured is not None:
            return configured.value
    return _UNKNOWN


def _star_kwargs_item(ctx: FileContext, node: cst.BaseExpression, stack: Stack, depth: int) -> object:
    """`kwargs.get("fp16", False)` (or `.pop`, or `kwargs["fp16"]`) of a function's `**kwargs`:
    the value every call of the function in the file gives it (DiffWave's learner built with
    `fp16=args.fp16`, a flag off by default), the `.get` default where a call leaves it out."""
    default: cst.BaseExpression | None = None
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in ("get", "pop") \
            and isinstance(node.func.value, cst.Name) and 1 <= len(node.args) <= 2 \
            and not any(arg.keyword is not None or arg.star for arg in node.args):
        name, key_node = node.func.value.value, node.args[0].value
        default = node.args[1].value if len(node.args) == 2 else cst.Name("None")
    elif isinstance(node, cst.Subscript) and isinstance(node.value, cst.Name) and len(node.slice) == 1 \
            and isinstance(node.slice[0].slice, cst.Index):
        name, key_node = node.value.value, node.slice[0].slice.value
    else:
        return _UNKNOWN
    if not isinstance(key_node, cst.SimpleString) or not isinstance(key := key_node.evaluated_value, str):
        return _UNKNOWN
    passed = passed_through_star_kwargs(ctx, name, key, stack)
    if passed is None or any(given is None and default is None for given, _ in passed):
        return _UNKNOWN  # `kwargs["fp16"]` that a call leaves out raises
    values = [_default_value(ctx, given, at, depth + 1) if given is not None else _default_value(ctx, default, stack, depth + 1)
              for given, at in passed]
    if any(value is _UNKNOWN for value in values) or any(value is not values[0] and value != values[0] for value in values):
        return _UNKNOWN
    return values[0]


def _string_method(ctx: FileContext, call: cst.Call, stack: Stack, depth: int) -> object:
    """`.lower()`, `.upper()`, `.strip()` and `.split(sep)` of a string the defaults give."""
    assert isinstance(call.func, cst.Attribute)
    text = _default_value(ctx, call.func.value, stack, depth)
    method = call.func.attr.value
    if not isinstance(text, str) or any(arg.keyword is not None or arg.star for arg in call.args):
        return _UNKNOWN
    if method == "split" and len(call.args) == 1:
        separator = _default_value(ctx, call.args[0].value, stack, depth)
        return tuple(text.split(separator)) if isinstance(separator, str) and separator else _UNKNOWN
    return getattr(text, method)() if not call.args and method != "split" else _UNKNOWN
