"""What value does a call argument have, as far as the file can tell?

Resolves, in this order: the keyword in the call, the positional slot, ``**kwargs`` built from a
dict literal or ``dict(...)`` in the same scope (keys that are later changed through
``.update()`` or ``kw[key] = ...`` are unknown: they may be set conditionally), module-level
constants (also those of a scanned config module it imports: `CFG.num_workers`), argparse
defaults and the project's run configs (`hp.train.num_workers`). Anything else is ``UNKNOWN``: rules stay silent rather than
guess (TorchFix's TOR401 reports ``DataLoader(ds, **kwargs)`` as missing ``num_workers``;
14 of its 23 hits on pytorch/examples were such false positives).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from weakref import WeakKeyDictionary

import libcst as cst

from speedfix.model.config_files import configured_value, run_configs
from speedfix.model.config_tree import interpolated_keys
from speedfix.model.context import FileContext
from speedfix.model.frames import Stack, class_of_method
from speedfix.model.index import Assignment, CallSite
from speedfix.model.imported_parser import imported_options
from speedfix.model.project_classes import dataclass_field, object_field
from speedfix.project.facts import DICT_CHANGES
from speedfix.project.linker import LEFT_OUT
from speedfix.project.steps import LIGHTNING_DATAMODULE
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import integer_value, is_main_guard, walk_expression


class State(Enum):
    MISSING = "missing"
    KNOWN = "known"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class ArgValue:
    state: State
    node: cst.BaseExpression | None = None
    arg: cst.Arg | None = None  # set when the value is written in the call itself
    # the value another file's call passes through `**kwargs` (an option there, maybe); with MISSING:
    # some calls pass it, others leave it out (the default holds there)
    passed: bool = False

    @property
    def missing(self) -> bool:
        return self.state is State.MISSING

    @property
    def unknown(self) -> bool:
        return self.state is State.UNKNOWN


MISSING = ArgValue(State.MISSING)
UNKNOWN = ArgValue(State.UNKNOWN)


def find_argument(ctx: FileContext, site: CallSite, keyword: str, position: int | None = None) -> ArgValue:
    call = site.node
    positional = 0
    saw_star = False
    for arg in call.args:
        if arg.keyword is not None:
            if arg.keyword.value == keyword:
                return ArgValue(State.KNOWN, arg.value, arg)
        elif arg.star == "*":
            saw_star = True
        elif arg.star == "":
            if position is not None and positional == position and not saw_star:
                return ArgValue(State.KNOWN, arg.value, arg)
            positional += 1
    if saw_star and position is not None and positional <= position:
        return UNKNOWN
    for arg in call.args:
        if arg.star == "**":
            found = _lookup_in_kwargs(ctx, arg.value, keyword, site.stack)
            if found is not MISSING:
                return found
    return MISSING


def _lookup_in_kwargs(ctx: FileContext, expr: cst.BaseExpression, key: str, stack: Stack, depth: int = 0) -> ArgValue:
    if depth > 3:
        return UNKNOWN
    if isinstance(expr, cst.Dict):
        return _lookup_in_dict_literal(ctx, expr, key, stack, depth)
    if isinstance(expr, cst.Call) and dotted_name(expr.func) == "dict" and not ctx.qualname(expr.func):
        return _lookup_in_dict_call(ctx, expr, key, stack, depth)
    if isinstance(expr, cst.IfExp):  # `**({"warmup_steps": n} if new else {"warmup_ratio": r})`
        if _asks_for_cuda(ctx, expr.test, stack):  # open-unmix's `{"num_workers": ...} if use_cuda else {}`
            return _lookup_in_kwargs(ctx, expr.body, key, stack, depth + 1)
        found = [_lookup_in_kwargs(ctx, branch, key, stack, depth + 1) for branch in (expr.body, expr.orelse)]
        return MISSING if all(f is MISSING for f in found) else UNKNOWN
    name = dotted_name(expr)
    if name is None:
        return UNKNOWN
    value = ctx.single_value(name, stack)
    narrowed = value is None and (value := _before_narrowing(ctx, name, stack)) is not None
    if value is None:
        return _passed_by_callers(ctx, name, key, stack)
    base = _lookup_in_kwargs(ctx, value, key, stack, depth + 1)
    if base.unknown or (narrowed and base is not MISSING):
        return UNKNOWN  # a key the narrowing may have dropped
    touched = _keys_changed_later(ctx, name, stack, depth)
    if touched is None:
        return UNKNOWN
    if key in touched:
        return _item_set_plainly(ctx, name, key, stack)
    return base


def _asks_for_cuda(ctx: FileContext, test: cst.BaseExpression, stack: Stack, depth: int = 0) -> bool:
    """Does ``test`` require `torch.cuda.is_available()` (and-ed with other tests, also through a
    name bound once to it: `use_cuda = not args.no_cuda and torch.cuda.is_available()`)? Such a
    branch is the one a run on a GPU takes, the branch this scan advises on."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return _asks_for_cuda(ctx, test.left, stack, depth) or _asks_for_cuda(ctx, test.right, stack, depth)
    if isinstance(test, cst.Call):
        return ctx.qualname(test.func) == "torch.cuda.is_available"
    if isinstance(test, cst.Name) and depth == 0:
        value = ctx.single_value(test.value, stack)
        return value is not None and _asks_for_cuda(ctx, value, stack, depth + 1)
    return False


def _item_set_plainly(ctx: FileContext, name: str, key: str, stack: Stack) -> ArgValue:
    """`kwargs["precision"] = "32-true"`, the one change of that key, written in the body of the
    function itself (no `if` or loop around it: every run sets it); unknown otherwise."""
    function = ctx.function_of(stack)
    body: Sequence[cst.CSTNode] = ()
    if isinstance(function, cst.FunctionDef) and isinstance(function.body, cst.IndentedBlock):
        body = function.body.body
    elif function is None:  # the module, and the body of its `if __name__ == "__main__":`
        body = [*ctx.module.body, *(line for statement in ctx.module.body if isinstance(statement, cst.If)
                                    and is_main_guard(statement.test) for line in statement.body.body)]
    found = [a for a in ctx.item_assignments.get(name, ()) if ctx.function_of(a.stack) is function and item_key(a) == key]
    updated = any(dotted_name(site.node.func.value) == name and ctx.function_of(site.stack) is function  # type: ignore[attr-defined]
                  for site in ctx.method_calls("update"))
    if len(found) != 1 or updated or found[0].augmented or not any(statement is found[0].statement for statement in body):
        return UNKNOWN
    return ArgValue(State.KNOWN, found[0].value)


def _before_narrowing(ctx: FileContext, name: str, stack: Stack) -> cst.BaseExpression | None:
    """A dict assigned once and then only narrowed (`kw = {k: v for k, v in kw.items() if k not
    in opts}`): its first value. A narrowed copy holds no key the dict did not."""
    found = ctx.assignments_in_scope(name, stack)
    if len(found) < 2 or any(a.unpacked or a.augmented for a in found):
        return None
    own = [a.value for a in found if not _narrows(a.value, name)]
    return own[0] if len(own) == 1 else None


def _narrows(value: cst.BaseExpression, name: str) -> bool:
    """`{k: v for k, v in name.items() if ...}`."""
    if not isinstance(value, cst.DictComp) or value.for_in.inner_for_in is not None:
        return False
    source, target = value.for_in.iter, value.for_in.target
    pair = [dotted_name(element.value) for element in target.elements] if isinstance(target, cst.Tuple) else []
    return isinstance(source, cst.Call) and not source.args and isinstance(source.func, cst.Attribute) \
        and source.func.attr.value == "items" and dotted_name(source.func.value) == name \
        and len(pair) == 2 and pair == [dotted_name(value.key), dotted_name(value.value)]


def _passed_by_callers(ctx: FileContext, name: str, key: str, stack: Stack) -> ArgValue:
    """`def make_loaders(args, **kwargs): DataLoader(..., **kwargs)`: what the other files'
    calls pass as those keyword arguments (``Links.kwargs``), when each passes a dict literal
    with the same keys and the values agree."""
    function = ctx.function_of(stack)
    star = function.params.star_kwarg if isinstance(function, cst.FunctionDef) else None
    if star is None or star.name.value != name or ctx.assignments_in(function, name):
        return UNKNOWN
    owner = class_of_method(stack)
    qualified = f"{owner.name.value}.{function.name.value}" if owner is not None else function.name.value  # type: ignore[union-attr]
    given = {k: value for f, k, value in ctx.links.kwargs if f == qualified}
    if not given or _keys_changed_later(ctx, name, stack, 0) != set():
        return UNKNOWN
    if key not in given:
        return MISSING
    if given[key] == LEFT_OUT:
        return ArgValue(State.MISSING, passed=True)  # some calls pass it, others leave the default
    return ArgValue(State.KNOWN, cst.parse_expression(given[key]), passed=True) if given[key] else UNKNOWN


def passed_through_star_kwargs(ctx: FileContext, name: str, key: str, stack: Stack) -> list[tuple[cst.BaseExpression | None, Stack]] | None:
    """`kwargs.get("fp16", False)` in `def __init__(self, ..., **kwargs)` of a module-level class
    (or in a module-level function): what each call of the class (the function) in the file
    passes as `fp16=`, with the call's stack (None: the call leaves it out). None when that
    cannot be known: the function rebinds or changes `kwargs`, a call passes `*`/`**` arguments,
    another scanned file builds or calls it, or nothing in the file does."""
    function = ctx.function_of(stack)
    star = function.params.star_kwarg if isinstance(function, cst.FunctionDef) else None
    if not isinstance(star, cst.Param) or star.name.value != name or ctx.assignments_in(function, name):
        return None
    assert isinstance(function, cst.FunctionDef)
    if key in {param.name.value for param in (*function.params.params, *function.params.kwonly_params)}:
        return None  # a keyword of that name goes to the parameter, not to `**kwargs`
    touched = _keys_changed_later(ctx, name, stack, 0)
    if touched is None or key in touched:
        return None
    owner = class_of_method(stack)
    if owner is not None:
        called = owner.name.value
        # `__init__` of a class at the top of the module
        module_level = function.name.value == "__init__" and bool(stack) and stack[0].node is owner
        if not module_level or any(built == called for built, *_ in ctx.links.constructed):
            return None
        qualified = f"{called}.__init__"
    else:
        called = qualified = function.name.value
        if len(stack) != 1 or any(f == called for f, _, _ in ctx.links.arguments):
            return None
    if any(f == qualified for f, _, _ in ctx.links.kwargs):
        return None
    found: list[tuple[cst.BaseExpression | None, Stack]] = []
    for site in ctx.calls:
        if site.func != called:
            continue
        if any(arg.star for arg in site.node.args):
            return None
        given = next((arg.value for arg in site.node.args if arg.keyword is not None and arg.keyword.value == key), None)
        found.append((given, site.stack))
    return found or None


def _lookup_in_dict_literal(ctx: FileContext, node: cst.Dict, key: str, stack: Stack, depth: int) -> ArgValue:
    result = MISSING
    for element in node.elements:
        if isinstance(element, cst.StarredDictElement):
            inner = _lookup_in_kwargs(ctx, element.value, key, stack, depth + 1)
            if inner is not MISSING:
                result = inner
            continue
        if not isinstance(element.key, cst.SimpleString):
            return UNKNOWN
        if element.key.evaluated_value == key:
            result = ArgValue(State.KNOWN, element.value)
    return result


def _lookup_in_dict_call(ctx: FileContext, node: cst.Call, key: str, stack: Stack, depth: int) -> ArgValue:
    result = MISSING
    for arg in node.args:
        if arg.keyword is not None:
            if arg.keyword.value == key:
                result = ArgValue(State.KNOWN, arg.value)
        elif arg.star == "**" or arg.star == "":
            inner = _lookup_in_kwargs(ctx, arg.value, key, stack, depth + 1)
            if inner is not MISSING:
                result = inner
        else:
            return UNKNOWN
    return result


def _keys_changed_later(ctx: FileContext, name: str, stack: Stack, depth: int) -> set[str] | None:
    """Keys a dict's `.update()`/item assignments may change; None if that cannot be known."""
    function = ctx.function_of(stack)
    touched: set[str] = set()
    for assignment in ctx.item_assignments.get(name, ()):
        if ctx.function_of(assignment.stack) is function:
            key = item_key(assignment)
            if key is None:
                return None  # `kw[key] = v` with a key that is not a literal: be silent
            touched.add(key)
    for site in ctx.method_calls("update"):
        func = site.node.func
        assert isinstance(func, cst.Attribute)
        if dotted_name(func.value) != name or ctx.function_of(site.stack) is not function:
            continue
        for arg in site.node.args:
            if arg.keyword is not None:
                touched.add(arg.keyword.value)
                continue
            keys = _literal_keys(ctx, arg.value, site.stack, depth + 1)
            if keys is None:
                return None
            touched |= keys
    return touched


def assigned_item(ctx: FileContext, node: cst.BaseExpression) -> Assignment | None:
    """The one assignment `args["ds_config_path"] = ...` of the file that sets the item
    ``node`` reads (a literal key), or None."""
    read = option_read(node) if isinstance(node, cst.Subscript) else None
    if read is None:
        return None
    found = [a for a in ctx.item_assignments.get(read[0], ()) if item_key(a) == read[1] and not a.augmented]
    return found[0] if len(found) == 1 else None


def item_key(assignment: Assignment) -> str | None:
    """The literal key of `kw["callbacks"] = [...]`, else None."""
    statement = assignment.statement
    for small in statement.body if statement is not None else ():
        if not isinstance(small, cst.Assign) or small.value is not assignment.value:
            continue
        for target in small.targets:
            subscript = target.target
            if isinstance(subscript, cst.Subscript) and len(subscript.slice) == 1 \
                    and isinstance(subscript.slice[0].slice, cst.Index) \
                    and isinstance(key := subscript.slice[0].slice.value, cst.SimpleString):
                return str(key.evaluated_value)
    return None


def kwargs_value(ctx: FileContext, expr: cst.BaseExpression, key: str, stack: Stack) -> ArgValue:
    """The value ``key`` takes in a `**expr` of a call (MISSING, KNOWN or UNKNOWN)."""
    return _lookup_in_kwargs(ctx, expr, key, stack)


def _literal_keys(ctx: FileContext, expr: cst.BaseExpression, stack: Stack, depth: int) -> set[str] | None:
    if depth > 3:
        return None
    if isinstance(expr, cst.Dict):
        keys: set[str] = set()
        for element in expr.elements:
            if isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString):
                keys.add(str(element.key.evaluated_value))
            else:
                return None
        return keys
    name = dotted_name(expr)
    value = ctx.single_value(name, stack) if name else None
    return _literal_keys(ctx, value, stack, depth + 1) if value is not None else None


# ---------------------------------------------------------------- literal values
VALUE_DEPTH = 4  # how many names, constants and defaults a value is followed through


def string_value(ctx: FileContext, node: cst.BaseExpression | None, stack: Stack, depth: int = 0) -> str | None:
    """The string an expression certainly holds: a literal, a constant, an argparse default, a
    parameter's default that no call overrides (``parameter_default``)."""
    if node is None or depth > VALUE_DEPTH:
        return None
    if isinstance(node, cst.SimpleString):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    if isinstance(node, cst.Name):
        value = ctx.single_value(node.value, stack) or parameter_default(ctx, node.value, stack) \
            or imported_constant(ctx, node, stack)
        if value is None:
            configured = configured_parameter(ctx, node.value, stack)
            return configured if isinstance(configured, str) else None
        return string_value(ctx, value, stack, depth + 1)
    found = string_value(ctx, _default(ctx, node, stack), stack, depth + 1)
    if found is None and isinstance(node, cst.Attribute):
        init = init_argument(ctx, node, stack)  # `self.device`, stored by `__init__` from a configured parameter
        if init is not None:
            return (init.config if isinstance(init.config, str) else None) if init.configured \
                else string_value(ctx, init.default, init.stack, depth + 1)
    return found


def literal_int(ctx: FileContext, node: cst.BaseExpression | None, stack: Stack, depth: int = 0) -> int | None:
    """An int the expression certainly has: a literal, a constant, an argparse default, or a
    constructor argument read back as `self.x` (``init_argument``)."""
    if node is None or depth > 3:
        return None
    if isinstance(node, cst.Integer):
        return integer_value(node)
    if isinstance(node, cst.Name):
        value = ctx.single_value(node.value, stack) or parameter_default(ctx, node.value, stack) \
            or imported_constant(ctx, node, stack)
        return literal_int(ctx, value, stack, depth + 1)
    if isinstance(node, cst.Call) and dotted_name(node.func) == "int" and len(node.args) == 1:
        return literal_int(ctx, node.args[0].value, stack, depth + 1)  # `int(opt.workers)`
    default = _default(ctx, node, stack)
    if default is not None:
        return literal_int(ctx, default, stack, depth + 1)
    init = init_argument(ctx, node, stack)
    if init is not None:
        if init.configured:
            return init.config if isinstance(init.config, int) and not isinstance(init.config, bool) else None
        return literal_int(ctx, init.default, init.stack, depth + 1)
    return None


@dataclass(frozen=True)
class InitArgument:
    """What a constructor argument read back as `self.x` holds: the value the project's run
    configs give it (``configured``; ``config`` is UNKNOWN_VALUE where they disagree), else the
    parameter's default in the code (``default``, read at ``stack``)."""

    configured: bool
    config: object = None
    default: cst.BaseExpression | None = None
    stack: Stack = ()


def init_argument(ctx: FileContext, node: cst.BaseExpression, stack: Stack) -> InitArgument | None:
    """`self.num_workers` in a method of a class whose `__init__` stores its parameter there
    (`self.num_workers = num_workers`, the only assignment of the attribute in the class): the
    value the run configs give the class (LightningCLI's `data: {num_workers: 8}`, a
    `class_path:` with `init_args:`; a config that leaves it out gives the default), else the
    parameter's default when no call of the file passes it (as ``parameter_default``)."""
    owner = class_of_method(stack)
    if owner is None or not (isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name)
                             and node.value.value == "self"):
        return None
    stored = [a for a in ctx.assignments.get(f"self.{node.attr.value}", ()) if class_of_method(a.stack) is owner]
    if len(stored) != 1 or stored[0].unpacked or stored[0].augmented or not isinstance(stored[0].value, cst.Name):
        return None
    function = ctx.function_of(stored[0].stack)
    if not isinstance(function, cst.FunctionDef) or function.name.value != "__init__":
        return None
    name = stored[0].value.value
    params = [*function.params.params, *function.params.kwonly_params]
    param = next((p for p in params if p.name.value == name), None)
    if param is None:
        return None
    configured = _configured_init_value(ctx, owner, params, param, stored[0].stack)
    if configured is not None:
        return InitArgument(True, configured)
    if run_configs(ctx).configures(_section(ctx, owner.name.value)):
        return None  # the project's configured runs build another class there: this one's values are no run's
    default = parameter_default(ctx, name, stored[0].stack)
    positional = [p.name.value for p in function.params.params][1:]
    for built, method, keywords, count, star in ctx.links.constructed:  # what other scanned files pass it
        if built != owner.name.value:
            continue
        if method == "from_argparse_args":  # Lightning 1.x: the parsed options of the same names
            default = _own_option_default(ctx, owner, name) or default
        elif method or star or name in keywords or (name in positional and positional.index(name) < count):
            return None
    return InitArgument(False, default=default, stack=stored[0].stack) if default is not None else None


def _passed_by_other_files(ctx: FileContext, built: str, name: str, index: int | None) -> bool:
    """Does another scanned file build the class ``built`` passing its constructor's parameter
    ``name`` (positional at ``index``, not counting `self`), or in a way that may pass it (`**kw`,
    a classmethod constructor)?"""
    return any(cls == built and bool(method or star or name in keywords or (index is not None and index < count))
               for cls, method, keywords, count, star in ctx.links.constructed)


def _configured_init_value(ctx: FileContext, owner: cst.ClassDef, params: Sequence[cst.Param], param: cst.Param,
                           stack: Stack) -> object | None:
    """What the run configs that build the class ``owner`` give its constructor's ``param``
    (the parameter's default where a config leaves it out; UNKNOWN_VALUE where they disagree),
    or None when no run config builds the class."""
    configs = run_configs(ctx).init_args(owner.name.value, [p.name.value for p in params], _section(ctx, owner.name.value))
    if not configs:
        return None
    name = param.name.value
    values = [_across_files(ctx, found.plain()) if (found := config.get(name)) is not None else _DEFAULT
              for config in configs]
    if _DEFAULT in values:
        default = known_value(ctx, param.default, stack) if param.default is not None else UNKNOWN_VALUE
        values = [default if value is _DEFAULT else value for value in values]
    return values[0] if all(value == values[0] for value in values) else UNKNOWN_VALUE


def _across_files(ctx: FileContext, value: object) -> object:
    """``value``, or for a plain interpolation another file of the composed config fills (a
    group file's `device: ${device}`, with `device: cuda` in the primary config) the scalar the
    run configs agree on there."""
    keys = interpolated_keys(value)
    agreed = run_configs(ctx).agreed(keys) if keys is not None else None
    return agreed if agreed is not None else value


def configured_parameter(ctx: FileContext, name: str, stack: Stack) -> object | None:
    """`device` of `__init__(self, obs_shape, device, ...)` in a class the run configs build
    (`agent: {_target_: drqv2.DrQV2Agent, device: ${device}}` beside `device: cuda`), where the
    constructor never rebinds it: the value they all give it, or None."""
    function = ctx.function_of(stack)
    owner = class_of_method(stack)
    if owner is None or not isinstance(function, cst.FunctionDef) or function.name.value != "__init__" \
            or ctx.assignments_in(function, name):
        return None
    params = [*function.params.params, *function.params.kwonly_params]
    param = next((p for p in params if p.name.value == name), None)
    if param is None:
        return None
    value = _configured_init_value(ctx, owner, params, param, stack)
    return None if value is UNKNOWN_VALUE else value


def _own_option_default(ctx: FileContext, owner: cst.ClassDef, name: str) -> cst.BaseExpression | None:
    """The default of the `--name` option the class declares itself (Lightning 1.x's
    `add_argparse_args`), which `from_argparse_args` passes to its constructor."""
    for site in ctx.method_calls("add_argument"):
        if class_of_method(site.stack) is owner and _dest_of(site) == name:
            return _keyword(site, "default")
    return None


_DEFAULT = object()  # a run config that leaves the argument out


def _section(ctx: FileContext, class_name: str) -> str:
    """LightningCLI's section for a class given to it in code: `data` for a DataModule, else `model`."""
    return "data" if ctx.is_subclass_of(class_name, *LIGHTNING_DATAMODULE) else "model"


def _default(ctx: FileContext, node: cst.BaseExpression, stack: Stack) -> cst.BaseExpression | None:
    """What an option or setting holds by default: an argparse default, a settings class's
    declared default, the field of a dataclass a parser fills (`def main(args: Config)`), or the
    value the project's run configs give a config's attribute chain."""
    found = argparse_default(ctx, node) or declared_default(ctx, node, stack) or annotated_field_default(ctx, node, stack) \
        or dict_item(ctx, node, stack) or absl_flag_default(ctx, node, stack) or run_option_default(ctx, node, stack) \
        or imported_constant(ctx, node, stack)
    if found is None and isinstance(node, cst.Attribute):
        configured = configured_value(ctx, node)
        if configured is not None and isinstance(configured.value, (bool, int, float, str)):
            found = cst.parse_expression(repr(configured.value))
    return found


def imported_constant(ctx: FileContext, node: cst.BaseExpression, stack: Stack = ()) -> cst.BaseExpression | None:
    """`CFG.num_workers` after `import config as CFG` (or `num_workers` taken with `from config
    import num_workers`) where the scanned `config.py` binds it once to a constant at its top
    level, and this file never assigns it (nor takes a parameter of that name around ``stack``)."""
    if not ctx.links.modules or not isinstance(node, (cst.Name, cst.Attribute)):
        return None
    written = dotted_name(node)
    qualified = _imported_name(ctx, written, stack)
    shown = ctx.links.constant(qualified) if qualified is not None else None
    return cst.parse_expression(shown) if shown else None


def _imported_name(ctx: FileContext, written: str | None, stack: Stack) -> str | None:
    """The qualified name of an imported name this file never assigns (nor takes as a parameter
    of a function around ``stack``)."""
    if written is None or written in ctx.assignments:
        return None
    head = written.split(".", 1)[0]
    for frame in stack:
        function = frame.node
        if isinstance(function, cst.FunctionDef) and any(
                param.name.value == head for param in (*function.params.params, *function.params.kwonly_params,
                                                       *function.params.posonly_params)):
            return None  # the parameter hides the imported name
    return ctx.project_name(written)


def _imported_dict_item(ctx: FileContext, holder: cst.BaseExpression, key: str, stack: Stack) -> cst.BaseExpression | None:
    """`base_config["model_path"]` after `from config import base_config`, where the scanned
    `config.py` binds it once, at its top level, to a dict literal that nothing changes: the
    constant written there for that key."""
    name = dotted_name(holder)
    if not ctx.links.modules or "." in key or name is None or name in ctx.item_assignments \
            or any(dotted_name(site.node.func.value) == name  # type: ignore[attr-defined]
                   for method in DICT_CHANGES for site in ctx.method_calls(method)):
        return None  # this file changes it
    qualified = _imported_name(ctx, name, stack)
    shown = ctx.links.constant(f"{qualified}[{key!r}]") if qualified is not None else None
    return cst.parse_expression(shown) if shown else None


def dict_item(ctx: FileContext, node: cst.BaseExpression, stack: Stack) -> cst.BaseExpression | None:
    """`config["precision"]` or `config.get("precision", "32")` where `config` holds a dict
    literal of the file (`config = {"precision": "16-mixed", ...}`, no later change of that
    key): the value written there, else the default `.get` is given; `config["precision"]` of
    a dict imported from a scanned module (``_imported_dict_item``)."""
    key: cst.BaseExpression | None = None
    fallback: cst.BaseExpression | None = None
    if isinstance(node, cst.Subscript) and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
        holder, key = node.value, node.slice[0].slice.value
    elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "get" \
            and 1 <= len(node.args) <= 2 and not any(arg.keyword or arg.star for arg in node.args):
        holder, key = node.func.value, node.args[0].value
        fallback = node.args[1].value if len(node.args) == 2 else cst.Name("None")
    else:
        return None
    name = dotted_name(holder)
    if not isinstance(key, cst.SimpleString) or not isinstance(key.evaluated_value, str) or name is None:
        return None
    if not isinstance(ctx.single_value(name, stack), cst.Dict):
        return _imported_dict_item(ctx, holder, key.evaluated_value, stack) if fallback is None else None
    found = kwargs_value(ctx, holder, key.evaluated_value, stack)
    if found.missing:
        return fallback
    return None if found.unknown else found.node


def parameter_default(ctx: FileContext, name: str, stack: Stack, *, others: bool = False) -> cst.BaseExpression | None:
    """The value the parameter ``name`` of the function around ``stack`` has in every run, when
    the function never rebinds it: what the calls of other scanned files pass when they all pass
    the same constant (`get_loader(..., num_workers=args.workers)` in `main.py`, with the option's
    default 8), else its default when no call passes it: `def __init__(self, ...,
    num_workers: int = 0)` with `Trainer(model, data)` calls (or none) runs with 0. With
    ``others``, none where another scanned file builds the class passing it, whatever it passes
    (`A2C_ACKTR(..., acktr=True)`: the truth of a test, not yet the value itself)."""
    function = ctx.function_of(stack)
    if not isinstance(function, cst.FunctionDef) or ctx.assignments_in(function, name):
        return None
    params = [*function.params.params, *function.params.kwonly_params]
    param = next((p for p in params if p.name.value == name), None)
    if param is None:
        return None
    owner = class_of_method(stack)
    passed = _passed_from_other_files(ctx, function, name) if owner is None else None
    if passed is not None:
        return _only_call_sites_elsewhere(ctx, function, passed)
    if param.default is None:
        return None
    called = owner.name.value if owner is not None and function.name.value == "__init__" else function.name.value
    positional = [p.name.value for p in function.params.params]
    index = positional.index(name) if name in positional else None
    if index is not None and owner is not None:
        index -= 1  # `self` is not passed
    if others and owner is not None and called == owner.name.value and _passed_by_other_files(ctx, called, name, index):
        return None  # `A2C_ACKTR(..., acktr=True)` in main.py
    for site in ctx.calls:
        if (site.func or "").rsplit(".", 1)[-1] != called:
            continue
        if any(arg.star for arg in site.node.args) or not find_argument(ctx, site, name, index).missing:
            return None  # a call passes it (or may, through `*args`/`**kwargs`)
    return param.default


def _passed_from_other_files(ctx: FileContext, function: cst.FunctionDef, name: str) -> str | None:
    """What other scanned files pass to the parameter ``name`` of a module-level function: a
    value's repr, "" when it is unknown or they differ, None when none passes it."""
    function_name = function.name.value
    for called, param, value in ctx.links.arguments:
        if called == function_name and param in (name, "*"):
            return value
    return None


def _only_call_sites_elsewhere(ctx: FileContext, function: cst.FunctionDef, value: str) -> cst.BaseExpression | None:
    """``value`` parsed, when the function's own file does not call it too (its calls there
    might pass something else, or leave the default)."""
    if not value or any((site.func or "").rsplit(".", 1)[-1] == function.name.value for site in ctx.calls):
        return None
    try:
        return cst.parse_expression(value)
    except cst.ParserSyntaxError:
        return None


_DATACLASS_FIELD = ("dataclasses.field",)


def class_field_defaults(ctx: FileContext, name: str) -> dict[str, cst.BaseExpression]:
    """The fields the file's class ``name`` writes with a default (`lr: float = 1e-3`,
    `use_lora: bool = field(default=False)`): field -> the default as written (the name
    `UNKNOWN_DEFAULT` for a `field(...)` without one)."""
    info = ctx.classes.get(name)
    fields: dict[str, cst.BaseExpression] = {}
    for statement in info.node.body.body if info is not None else ():
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name) and small.value is not None:
                fields.setdefault(small.target.value, _field_default(ctx, small.value))
    return fields


def _field_default(ctx: FileContext, value: cst.BaseExpression) -> cst.BaseExpression:
    """`field(default=X)` -> X; a plain default as written."""
    if isinstance(value, cst.Call) and (ctx.qualname(value.func) in _DATACLASS_FIELD or (
            isinstance(value.func, cst.Name) and value.func.value == "field")):
        for arg in value.args:
            if arg.keyword is not None and arg.keyword.value == "default":
                return arg.value
        return cst.Name("UNKNOWN_DEFAULT")
    return value


def annotated_field_default(ctx: FileContext, node: cst.BaseExpression, stack: Stack) -> cst.BaseExpression | None:
    """`args.use_lora` in `def main(args: FlatArguments)` (or `(args,) = HfArgumentParser(
    (FlatArguments,)).parse_args_into_dataclasses()`, `args = tyro.cli(FlatArguments)`, `args =
    FlatArguments()`), `FlatArguments` a dataclass of the file that an argument parser fills: the
    field's default, which is the option's default on the command line."""
    if not isinstance(node, cst.Attribute) or not isinstance(node.value, cst.Name):
        return None
    name = node.value.value
    owner = _annotated_class(ctx, name, stack) or _parsed_class(ctx, name, stack) or _built_class(ctx, name, stack)
    info = ctx.classes.get(owner or "")
    if info is None and owner is not None and ctx.project is not None \
            and (qualified := ctx.imports.resolve(owner)) is not None and "." in qualified:
        if ctx.assignments.get(f"{name}.{node.attr.value}"):
            return None  # the script sets it itself (`opt.lr = args.lr`)
        # a dataclass of another file of the project, or a plain settings class built here (`opt = Config()`)
        value = dataclass_field(ctx.project, qualified, node.attr.value, plain=_built_class(ctx, name, stack) == owner)
        return cst.parse_expression(repr(value)) if isinstance(value, (bool, int, float, str)) else None
    if info is None or not any(dotted_name(d.decorator) in ("dataclass", "dataclasses.dataclass")
                               or isinstance(d.decorator, cst.Call) and dotted_name(d.decorator.func) in
                               ("dataclass", "dataclasses.dataclass") for d in info.node.decorators):
        return None
    return class_field_defaults(ctx, info.name).get(node.attr.value)


def _annotated_class(ctx: FileContext, name: str, stack: Stack) -> str | None:
    """The class a parameter of the enclosing function is annotated with (`args: FlatArguments`)."""
    function = ctx.function_of(stack)
    if not isinstance(function, cst.FunctionDef) or ctx.assignments_in(function, name):
        return None
    params = [*function.params.params, *function.params.kwonly_params]
    param = next((p for p in params if p.name.value == name and p.annotation is not None), None)
    return dotted_name(param.annotation.annotation) if param is not None else None  # type: ignore[union-attr]


# Command-line parsers that fill a dataclass from its fields (CleanRL's `args = tyro.cli(Args)`):
# the class is their first argument, or their `config_class`.
_DATACLASS_CLIS = frozenset({"tyro.cli", "pyrallis.parse", "draccus.parse", "simple_parsing.parse"})


def _built_class(ctx: FileContext, name: str, stack: Stack) -> str | None:
    """`args = tyro.cli(Args)`, `cfg = pyrallis.parse(config_class=TrainConfig)`, `cfg =
    TrainConfig()`: the class whose fields' defaults the name holds on a default run."""
    value = ctx.single_value(name, stack)
    if not isinstance(value, cst.Call):
        return None
    if ctx.qualname(value.func) in _DATACLASS_CLIS:
        given = next((arg.value for arg in value.args if arg.keyword is None or arg.keyword.value == "config_class"), None)
        return dotted_name(given) if given is not None else None
    called = dotted_name(value.func)
    if value.args or called is None:
        return None
    return called if called in ctx.classes or "." in (ctx.imports.resolve(called) or "") else None


_DATACLASS_PARSES = frozenset({"parse_args_into_dataclasses", "parse_json_file", "parse_yaml_file"})


def _dataclass_parse(value: cst.BaseExpression) -> bool:
    """`parser.parse_args_into_dataclasses()`, `parser.parse_json_file(path)`: an
    `HfArgumentParser` filling dataclasses, not argparse's namespace."""
    return isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) \
        and value.func.attr.value in _DATACLASS_PARSES


def _parsed_class(ctx: FileContext, name: str, stack: Stack) -> str | None:
    """`model_args, training_args = parser.parse_args_into_dataclasses()` with `parser =
    HfArgumentParser((ModelArguments, TrainingArguments))`: the class whose fields fill the
    name's place (`training_args`: `TrainingArguments`); also `script_args =
    HfArgumentParser(ScriptArguments).parse_args_into_dataclasses()[0]`."""
    found = ctx.assignments_in_scope(name, stack)
    if len(found) != 1:
        return None
    parse, position = found[0].value, found[0].position
    if not found[0].unpacked:  # `script_args = parser.parse_args_into_dataclasses()[0]`
        index = parse.slice[0].slice if isinstance(parse, cst.Subscript) and len(parse.slice) == 1 else None
        if not isinstance(index, cst.Index) or not isinstance(index.value, cst.Integer):
            return None
        parse, position = parse.value, int(index.value.value)  # type: ignore[union-attr]
    if position is None or not isinstance(parse, cst.Call) or not isinstance(parse.func, cst.Attribute) \
            or not _dataclass_parse(parse):
        return None
    parser = parse.func.value
    if isinstance(parser, cst.Name):
        parser = ctx.single_value(parser.value, found[0].stack)
    if not isinstance(parser, cst.Call) or not parser.args:
        return None
    given = parser.args[0].value  # `HfArgumentParser((ModelArguments, TrainingArguments))`, or one class
    classes = [element.value for element in given.elements] if isinstance(given, (cst.Tuple, cst.List)) else [given]
    if position >= len(classes) or isinstance(given, (cst.Tuple, cst.List)) and any(
            isinstance(element, cst.StarredElement) for element in given.elements):
        return None
    return dotted_name(classes[position])


def literal_bool(ctx: FileContext, node: cst.BaseExpression | None, stack: Stack) -> bool | None:
    if isinstance(node, cst.Name) and node.value in ("True", "False"):
        return node.value == "True"
    if isinstance(node, cst.Name):
        value = ctx.single_value(node.value, stack) or imported_constant(ctx, node, stack)
        if isinstance(value, cst.Name) and value.value in ("True", "False"):
            return value.value == "True"
    return None


def run_option_default(ctx: FileContext, node: cst.BaseExpression, stack: Stack) -> cst.BaseExpression | None:
    """`args.opt` in `def create_optimizer(args, model)`, or `self.args.use_multi_gpu` in a class
    whose `__init__(self, args)` keeps it (also read through `args = self.args` in a method), in
    a file without the parser: the default of the option of the scripts that run the file
    (``Links.options``), when ``args`` is the name they bind their parsed options to and the file
    gets it handed in (a parameter, never rebound)."""
    if not isinstance(node, cst.Attribute) or not ctx.links.option_holders:
        return None
    holder = node.value
    if isinstance(holder, cst.Name):
        function = ctx.function_of(stack)
        if not isinstance(function, cst.FunctionDef):
            return None
        if holder.value not in ctx.links.option_holders:
            return _run_option_default(ctx, node.attr.value) if _holds_run_options(ctx, function, holder.value) else None
        local = ctx.assignments_in(function, holder.value)
        if len(local) == 1 and not local[0].unpacked and not local[0].augmented and isinstance(local[0].value, cst.Attribute):
            # `args = self.args` at the top of a method: the options the object keeps
            kept = local[0].value
            return run_option_default(ctx, node.with_changes(value=kept), stack) if isinstance(kept.value, cst.Name) else None
        if local or not any(p.name.value == holder.value for p in (*function.params.params, *function.params.kwonly_params)):
            return None
    elif isinstance(holder, cst.Attribute) and isinstance(holder.value, cst.Name) and holder.value.value == "self":
        stored = ctx.assignments.get(f"self.{holder.attr.value}", [])
        if holder.attr.value not in ctx.links.option_holders or class_of_method(stack) is None or any(
                not isinstance(a.value, cst.Name) or a.value.value != holder.attr.value for a in stored):
            return None  # `self.args = args` in `__init__`, or kept by a base class of another file
    else:
        return None
    return _run_option_default(ctx, node.attr.value)


def _holds_run_options(ctx: FileContext, function: cst.FunctionDef, name: str) -> bool:
    """Is the parameter ``name`` of ``function`` the options object of the scripts that run the
    file under another name (LTSF-Linear's `Model.__init__(self, configs)`, built with the parsed
    `args`)? The function reads two or more of its attributes, every one an option those scripts
    define (`configs.seq_len`, `configs.individual`), and never rebinds it."""
    params = (*function.params.params, *function.params.kwonly_params)
    if not any(p.name.value == name for p in params) or ctx.assignments_in(function, name):
        return False
    options = {dest for dest, _ in ctx.links.options}
    read: set[str] = set()
    for found in walk_expression(function.body):
        if type(found) is cst.Attribute and type(found.value) is cst.Name and found.value.value == name:
            if found.attr.value not in options:
                return False
            read.add(found.attr.value)
    return len(read) >= 2


def _run_option_default(ctx: FileContext, dest: str) -> cst.BaseExpression | None:
    """The default ``Links.options`` gives ``dest``, as code; parsed once per file."""
    parsed = _RUN_OPTIONS.setdefault(ctx, {})
    if dest not in parsed:
        shown = dict(ctx.links.options).get(dest)
        try:
            parsed[dest] = cst.parse_expression(shown) if shown else None
        except cst.ParserSyntaxError:
            parsed[dest] = None
    return parsed[dest]


_RUN_OPTIONS: WeakKeyDictionary[FileContext, dict[str, cst.BaseExpression | None]] = WeakKeyDictionary()


def argparse_default(ctx: FileContext, node: cst.BaseExpression) -> cst.BaseExpression | None:
    """`args.workers` -> the `default=` of `parser.add_argument("--workers", ...)`, or what a
    `parser.set_defaults(workers=1)` of the file sets instead (diffpool)."""
    options = _options(ctx, node)
    if options and (reset := _set_default(ctx, _dest_of(options[0]))) is not None:
        return reset
    defaults = [default for site in options if (default := _keyword(site, "default")) is not None]
    return defaults[0] if len(defaults) == 1 else None


def _set_default(ctx: FileContext, dest: str) -> cst.BaseExpression | None:
    """The one value `parser.set_defaults(dest=...)` calls of the file give ``dest``."""
    values = [arg.value for site in ctx.method_calls("set_defaults") for arg in site.node.args
              if arg.keyword is not None and arg.keyword.value == dest]
    return values[0] if len(values) == 1 else None


def imported_option_default(ctx: FileContext, node: cst.BaseExpression, stack: Stack) -> cst.BaseExpression | None:
    """`args.local_rank` where `args` holds the parsed options of a parser this file does not
    define the option on (BERT-NER's `args = get_argparse().parse_args()`, the parser built in
    `tools/finetuning_argparse.py`): the default the imported modules that define it agree on."""
    if not isinstance(node, cst.Attribute) or not holds_parsed_options(ctx, node.value, stack) \
            or _defining(ctx, node.attr.value):
        return None
    shown = {dict(facts.options).get(node.attr.value) for facts in ctx.links.modules.values()} - {None}
    if len(shown) != 1 or not (value := shown.pop()):
        return None
    try:
        return cst.parse_expression(value)
    except cst.ParserSyntaxError:
        return None


_ABSL_DEFINES = tuple(f"absl.flags.DEFINE_{kind}" for kind in ("integer", "float", "bool", "boolean", "string", "enum"))


def absl_flag_default(ctx: FileContext, node: cst.BaseExpression, stack: Stack) -> cst.BaseExpression | None:
    """`FLAGS.num_workers` (`FLAGS = flags.FLAGS` of absl) -> the default of the one
    `flags.DEFINE_integer('num_workers', 4, ...)` of this file (a flagfile or the command line
    may still set it, as with an argparse default)."""
    if not isinstance(node, cst.Attribute):
        return None
    holder = node.value
    if isinstance(holder, cst.Name) and ctx.qualname(holder) != "absl.flags.FLAGS":
        holder = ctx.single_value(holder.value, stack) or holder
    if ctx.qualname(holder) != "absl.flags.FLAGS":
        return None
    defaults = [
        args[1].value for site in ctx.calls_to(*_ABSL_DEFINES)
        if len(args := site.node.args) >= 2 and isinstance(args[0].value, cst.SimpleString)
        and args[0].value.evaluated_value == node.attr.value and args[0].keyword is None and args[1].keyword is None
    ]
    return defaults[0] if len(defaults) == 1 else None


def declared_default(ctx: FileContext, node: cst.BaseExpression, stack: Stack) -> cst.BaseExpression | None:
    """`config.accelerator` where `config = Config()` builds a class of this file (a dataclass of
    settings) whose body declares `accelerator: str = "auto"`: that default, when the call passes
    no argument for it (and no positional ones) and nothing assigns `config.accelerator` later.
    Also such an object another file of the project makes and this one imports (`from
    utils.config import opt`; ``object_field``)."""
    if not isinstance(node, cst.Attribute) or not isinstance(node.value, cst.Name):
        return None
    built = ctx.single_value(node.value.value, stack)
    field = node.attr.value
    if built is None and ctx.project is not None and not ctx.assignments.get(f"{node.value.value}.{field}") \
            and (qualified := ctx.qualname(node.value)) is not None and qualified.count(".") >= 1:
        value = object_field(ctx.project, qualified, field)  # `from utils.config import opt`: `opt = Config()` there
        return cst.parse_expression(repr(value)) if isinstance(value, (bool, int, float, str)) else None
    if not isinstance(built, cst.Call) or not isinstance(built.func, cst.Name) or built.func.value not in ctx.classes:
        return None
    if any(arg.keyword is None or arg.keyword.value == field for arg in built.args) \
            or ctx.assignments.get(f"{node.value.value}.{field}"):
        return None
    return class_field_defaults(ctx, built.func.value).get(field)


def option_defaults(ctx: FileContext) -> dict[str, cst.BaseExpression]:
    """Each command-line option's default by its destination (`--arch` -> `"resnet18"`), for the
    options the file defines once with a `default=`."""
    found: dict[str, list[cst.BaseExpression | None]] = {}
    for site in ctx.method_calls("add_argument"):
        found.setdefault(_dest_of(site), []).append(_keyword(site, "default"))
    return {dest: defaults[0] for dest, defaults in found.items() if len(defaults) == 1 and defaults[0] is not None}


def _restored(value: cst.BaseExpression, holder: str) -> bool:
    """`ckpt["args"]`: the parsed options a checkpoint saved (vq-vae-2's `args = ckpt['args']`
    under `if args.ckpt is not None:`), the same options as the parser's."""
    if not isinstance(value, cst.Subscript) or len(value.slice) != 1:
        return False
    index = value.slice[0].slice
    return isinstance(index, cst.Index) and isinstance(index.value, cst.SimpleString) \
        and index.value.evaluated_value == holder


def argparse_option(ctx: FileContext, node: cst.BaseExpression) -> CallSite | None:
    """`args.workers` -> the one `parser.add_argument("--workers", ...)` call that defines it."""
    options = _options(ctx, node)
    return options[0] if len(options) == 1 else None


def _options(ctx: FileContext, node: cst.BaseExpression) -> list[CallSite]:
    """The `add_argument` calls whose destination is the attribute ``node`` reads from parsed args."""
    saved = _saved_hyperparameter(ctx, node)
    if saved is not None:
        return _defining(ctx, saved)
    read = option_read(node)
    if read is None:
        return []
    holder, dest = read
    # `args` is often assigned inside main(), or twice (`args = get_args_parser()` then
    # `args = args.parse_args()`, MAE/DeiT): the last assignment anywhere parses them.
    found = ctx.assignments.get(holder, [])
    as_dict = bool(found) and _is_vars_of(found[-1].value, holder)  # `args = vars(args)`, then `args["model"]`
    if as_dict:
        found = found[:-1]
    elif found and not found[-1].unpacked and _vars_of_parsed(ctx, found[-1].value):
        return _defining(ctx, dest)  # `config = vars(parse_args())`, then `config["optimizer"]`
    while len(found) > 1 and _restored(found[-1].value, holder):
        found = found[:-1]  # `args = ckpt["args"]` when resuming: the options a run of the script saved
    if not found or isinstance(node, cst.Subscript) and not as_dict:
        return []
    if not _holds_parsed_args(ctx, found[-1]):  # `args = parse_args()` imported from a file of the project
        imported = [] if found[-1].unpacked else imported_options(ctx, _returned_call(ctx, found[-1].value))
        if imported or not found[-1].unpacked or not any(_holds_parsed_args(ctx, a) for a in found[:-1]):
            return [site for site in imported if _dest_of(site) == dest]
        # the name parsed the options before a tuple of other things reused it (`args =
        # parser.parse_args()`, then `args, training_args = hf_parser.parse_json_file(args.train_args_file)`)
    return _defining(ctx, dest)


def _returned_call(ctx: FileContext, value: cst.BaseExpression) -> cst.BaseExpression:
    """`get_opt()`, a module-level function of this file that binds `opt = parse_opts()`, adjusts
    it and returns `opt`: that call (`parse_opts()`, whose options another file defines); else
    ``value`` itself."""
    if not isinstance(value, cst.Call) or not isinstance(value.func, cst.Name):
        return value
    functions = [info for info in ctx.functions.get(value.func.value, ()) if not info.stack]
    if len(functions) != 1:
        return value
    function = functions[0].node
    returns = {dotted_name(n.value) for n in walk_expression(function.body) if isinstance(n, cst.Return) and n.value is not None}
    if len(returns) != 1 or (name := returns.pop()) is None or "." in name:
        return value
    local = [a for a in ctx.assignments.get(name, ()) if ctx.function_of(a.stack) is function]
    return local[0].value if len(local) == 1 and not local[0].unpacked and isinstance(local[0].value, cst.Call) else value


def _saved_hyperparameter(ctx: FileContext, node: cst.BaseExpression) -> str | None:
    """`self.hparams.use_compile` in a LightningModule of a file whose module keeps the parsed
    options it is given (`def __init__(self, hparams): self.save_hyperparameters(hparams)`,
    built as `LightningModel(args)`): the option `use_compile` of the file's parser."""
    if not (isinstance(node, cst.Attribute) and isinstance(node.value, cst.Attribute)
            and node.value.attr.value == "hparams" and isinstance(node.value.value, cst.Name)
            and node.value.value.value == "self"):
        return None
    for site in ctx.method_calls("save_hyperparameters"):
        args = site.node.args
        if len(args) == 1 and args[0].keyword is None and isinstance(args[0].value, cst.Name) \
                and dotted_name(site.node.func) == "self.save_hyperparameters":
            return node.attr.value
    return None


def option_read(node: cst.BaseExpression) -> tuple[str, str] | None:
    """(holder, option) for `args.model`, or `args["model"]` (after `args = vars(args)`)."""
    if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name):
        return node.value.value, node.attr.value
    if isinstance(node, cst.Subscript) and isinstance(node.value, cst.Name) and len(node.slice) == 1 \
            and isinstance(node.slice[0].slice, cst.Index) and isinstance(key := node.slice[0].slice.value, cst.SimpleString) \
            and isinstance(key.evaluated_value, str):
        return node.value.value, key.evaluated_value
    return None


def _is_vars_of(value: cst.BaseExpression, name: str) -> bool:
    return isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == "vars" \
        and len(value.args) == 1 and isinstance(value.args[0].value, cst.Name) and value.args[0].value.value == name


def _vars_of_parsed(ctx: FileContext, value: cst.BaseExpression) -> bool:
    """`vars(parser.parse_args())`, `vars(parse_args())` (a function of the file that returns them)."""
    return isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == "vars" \
        and len(value.args) == 1 and _parses(ctx, value.args[0].value, None, 0)


def _add_argument_calls(ctx: FileContext) -> list[CallSite]:
    """`parser.add_argument(...)` calls, also through a short alias (`arg = parser.add_argument`,
    then `arg('--workers', type=int, default=4)`; `add_arg = functools.partial(add_arguments,
    argparser=parser)`); found once per file."""
    found = _ADD_ARGUMENT.get(ctx)
    if found is None:
        found = list(ctx.method_calls("add_argument"))
        aliases = {name for name, assignments in ctx.assignments.items() if "." not in name and assignments and all(
            isinstance(a.value, cst.Attribute) and a.value.attr.value == "add_argument" or _partial_adder(ctx, a.value)
            for a in assignments)}
        if aliases:
            found += [site for site in ctx.calls if isinstance(site.node.func, cst.Name) and site.node.func.value in aliases]
        _ADD_ARGUMENT[ctx] = found
    return found


_ADD_ARGUMENT: WeakKeyDictionary[FileContext, list[CallSite]] = WeakKeyDictionary()


def _partial_adder(ctx: FileContext, value: cst.BaseExpression) -> bool:
    """`functools.partial(add_arguments, argparser=parser)` (PaddlePaddle's helper, then
    `add_arg("fp16", type=bool, default=True, help=...)`): a function that adds `--fp16`."""
    return isinstance(value, cst.Call) and ctx.qualname(value.func) == "functools.partial" and bool(value.args) \
        and (dotted_name(value.args[0].value) or "").rsplit(".", 1)[-1] in ("add_argument", "add_arguments")


def _defining(ctx: FileContext, dest: str) -> list[CallSite]:
    """The `add_argument` calls (``_add_argument_calls``) whose destination is ``dest``."""
    by_dest = _BY_DEST.get(ctx)
    if by_dest is None:  # once per file: every option an analysis reads asks
        by_dest = _BY_DEST[ctx] = {}
        for site in _add_argument_calls(ctx):
            by_dest.setdefault(_dest_of(site), []).append(site)
    return list(by_dest.get(dest, ()))


_BY_DEST: WeakKeyDictionary[FileContext, dict[str, list[CallSite]]] = WeakKeyDictionary()


def holds_parsed_options(ctx: FileContext, node: cst.BaseExpression, stack: Stack) -> bool:
    """Is ``node`` a name bound, in the scope of ``stack``, only to the parsed options (`args`
    after `args = parser.parse_args()`)?"""
    if not isinstance(node, cst.Name):
        return False
    found = ctx.assignments_in_scope(node.value, stack)
    return bool(found) and all(_holds_parsed_args(ctx, assignment) for assignment in found)


def _holds_parsed_args(ctx: FileContext, assignment: Assignment) -> bool:
    """Is the target bound to the parsed options: `args = parser.parse_args()`, `args, _ =
    parser.parse_known_args()`, or the same through a function of the file (timm's `args,
    args_text = _parse_args()`, YOLOv5's `opt = parse_opt()`)?"""
    if assignment.unpacked and assignment.position is None:
        return False
    return _parses(ctx, assignment.value, assignment.position, 0)


def _parses(ctx: FileContext, value: cst.BaseExpression, index: int | None, depth: int) -> bool:
    if depth > 2:
        return False
    if isinstance(value, cst.IfExp):
        return _parses(ctx, value.body, index, depth) and _parses(ctx, value.orelse, index, depth)
    if isinstance(value, cst.Subscript) and index is None and len(value.slice) == 1:
        element = value.slice[0].slice
        if isinstance(element, cst.Index) and isinstance(element.value, cst.Integer) and element.value.value == "0":
            return _parses(ctx, value.value, 0, depth)  # `parser.parse_known_args()[0]`
        return False
    if not isinstance(value, cst.Call):
        return False
    if isinstance(value.func, cst.Attribute):
        method = value.func.attr.value
        return (method == "parse_args" and index is None) or (method == "parse_known_args" and index == 0)
    if not isinstance(value.func, cst.Name):
        return False
    functions = [info for info in ctx.functions.get(value.func.value, ()) if not info.stack]
    if len(functions) != 1:
        return False
    returns = [n.value for n in walk_expression(functions[0].node.body) if isinstance(n, cst.Return) and n.value is not None]
    return bool(returns) and all(_returns_parsed(ctx, functions[0].node, r, index, depth + 1) for r in returns)


def _returns_parsed(ctx: FileContext, function: cst.CSTNode, value: cst.BaseExpression, index: int | None, depth: int) -> bool:
    if isinstance(value, cst.Tuple) and index is not None:
        if index >= len(value.elements):
            return False
        value, index = value.elements[index].value, None
    if isinstance(value, cst.Name):
        local = [a for a in ctx.assignments.get(value.value, ()) if ctx.function_of(a.stack) is function]
        if not local or index is not None:
            return False
        # `args, _unknown = parser.parse_known_args()`, then `return args` (CleanTransformer)
        last = local[-1]
        return (last.position is not None or not last.unpacked) and _parses(ctx, last.value, last.position if last.unpacked else None, depth)
    return _parses(ctx, value, index, depth)


def _keyword(site: CallSite, name: str) -> cst.BaseExpression | None:
    return next((arg.value for arg in site.node.args if arg.keyword is not None and arg.keyword.value == name), None)


def _dest_of(site: CallSite) -> str:
    explicit = _keyword(site, "dest")
    if isinstance(explicit, cst.SimpleString):
        return str(explicit.evaluated_value)
    options = [str(arg.value.evaluated_value) for arg in site.node.args
               if arg.keyword is None and isinstance(arg.value, cst.SimpleString)]
    longs = [o for o in options if o.startswith("--")]
    chosen = longs[0] if longs else (options[0] if options else "")
    return chosen.lstrip("-").replace("-", "_")


UNKNOWN_VALUE = object()  # what ``known_value`` returns for a value the file cannot tell


def known_value(ctx: FileContext, node: cst.BaseExpression, stack: Stack) -> object:
    """The Python value (bool, int, str or None) an expression certainly holds: a literal, a
    constant, an argparse default; ``UNKNOWN_VALUE`` otherwise."""
    for read in (literal_bool, literal_int, string_value):
        value = read(ctx, node, stack)
        if value is not None:
            return value
    return None if isinstance(node, cst.Name) and node.value == "None" else UNKNOWN_VALUE
