"""What value does a call argument have, as far as the file can tell?

Resolves, in this order: the keyword in the call, the positional slot, ``**kwargs`` built from a
dict literal or ``dict(...)`` in the same scope (keys that are later changed through
``.update()`` or ``kw[key] = ...`` are unknown: they may be set conditionally), module-level
constants and argparse defaults. Anything else is ``UNKNOWN``: rules stay silent rather than
guess (TorchFix's TOR401 reports ``DataLoader(ds, **kwargs)`` as missing ``num_workers``;
14 of its 23 hits on pytorch/examples were such false positives).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import libcst as cst

from speedfix.model.context import FileContext
from speedfix.model.frames import Stack, class_of_method
from speedfix.model.index import Assignment, CallSite
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import integer_value, walk_expression


class State(Enum):
    MISSING = "missing"
    KNOWN = "known"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class ArgValue:
    state: State
    node: cst.BaseExpression | None = None
    arg: cst.Arg | None = None  # set when the value is written in the call itself

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
    name = dotted_name(expr)
    if name is None:
        return UNKNOWN
    value = ctx.single_value(name, stack)
    if value is None:
        return UNKNOWN
    base = _lookup_in_kwargs(ctx, value, key, stack, depth + 1)
    if base.unknown:
        return UNKNOWN
    touched = _keys_changed_later(ctx, name, stack, depth)
    if touched is None or key in touched:
        return UNKNOWN
    return base


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
            key = _item_key(assignment)
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


def _item_key(assignment: Assignment) -> str | None:
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
    """The string an expression certainly holds: a literal, a constant, an argparse default."""
    if node is None or depth > VALUE_DEPTH:
        return None
    if isinstance(node, cst.SimpleString):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    if isinstance(node, cst.Name):
        return string_value(ctx, ctx.single_value(node.value, stack), stack, depth + 1)
    default = argparse_default(ctx, node) or declared_default(ctx, node, stack) or annotated_field_default(ctx, node, stack)
    return string_value(ctx, default, stack, depth + 1)


def literal_int(ctx: FileContext, node: cst.BaseExpression | None, stack: Stack, depth: int = 0) -> int | None:
    """An int the expression certainly has: a literal, a constant, or an argparse default."""
    if node is None or depth > 3:
        return None
    if isinstance(node, cst.Integer):
        return integer_value(node)
    if isinstance(node, cst.Name):
        value = ctx.single_value(node.value, stack) or parameter_default(ctx, node.value, stack)
        return literal_int(ctx, value, stack, depth + 1)
    if isinstance(node, cst.Call) and dotted_name(node.func) == "int" and len(node.args) == 1:
        return literal_int(ctx, node.args[0].value, stack, depth + 1)  # `int(opt.workers)`
    default = argparse_default(ctx, node) or declared_default(ctx, node, stack)
    if default is not None:
        return literal_int(ctx, default, stack, depth + 1)
    return None


def parameter_default(ctx: FileContext, name: str, stack: Stack) -> cst.BaseExpression | None:
    """The default of the parameter ``name`` of the function around ``stack`` when no call in
    the file passes it and the function never rebinds it: `def __init__(self, ...,
    num_workers: int = 0)` with `Trainer(model, data)` calls (or none) runs with 0."""
    function = ctx.function_of(stack)
    if not isinstance(function, cst.FunctionDef) or ctx.assignments_in(function, name):
        return None
    params = [*function.params.params, *function.params.kwonly_params]
    param = next((p for p in params if p.name.value == name), None)
    if param is None or param.default is None:
        return None
    owner = class_of_method(stack)
    called = owner.name.value if owner is not None and function.name.value == "__init__" else function.name.value
    positional = [p.name.value for p in function.params.params]
    index = positional.index(name) if name in positional else None
    if index is not None and owner is not None:
        index -= 1  # `self` is not passed
    for site in ctx.calls:
        if (site.func or "").rsplit(".", 1)[-1] != called:
            continue
        if any(arg.star for arg in site.node.args) or not find_argument(ctx, site, name, index).missing:
            return None  # a call passes it (or may, through `*args`/`**kwargs`)
    return param.default


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
    """`args.use_lora` in `def main(args: FlatArguments)`, `FlatArguments` a dataclass of the
    file that an argument parser fills (`HfArgumentParser`): the field's default, which is the
    option's default on the command line."""
    if not isinstance(node, cst.Attribute) or not isinstance(node.value, cst.Name):
        return None
    function = ctx.function_of(stack)
    if not isinstance(function, cst.FunctionDef) or ctx.assignments_in(function, node.value.value):
        return None
    params = [*function.params.params, *function.params.kwonly_params]
    param = next((p for p in params if p.name.value == node.value.value and p.annotation is not None), None)
    owner = dotted_name(param.annotation.annotation) if param is not None else None  # type: ignore[union-attr]
    info = ctx.classes.get(owner or "")
    if info is None or not any(dotted_name(d.decorator) in ("dataclass", "dataclasses.dataclass")
                               or isinstance(d.decorator, cst.Call) and dotted_name(d.decorator.func) in
                               ("dataclass", "dataclasses.dataclass") for d in info.node.decorators):
        return None
    return class_field_defaults(ctx, info.name).get(node.attr.value)


def literal_bool(ctx: FileContext, node: cst.BaseExpression | None, stack: Stack) -> bool | None:
    if isinstance(node, cst.Name) and node.value in ("True", "False"):
        return node.value == "True"
    if isinstance(node, cst.Name):
        value = ctx.single_value(node.value, stack)
        if isinstance(value, cst.Name) and value.value in ("True", "False"):
            return value.value == "True"
    return None


def argparse_default(ctx: FileContext, node: cst.BaseExpression) -> cst.BaseExpression | None:
    """`args.workers` -> the `default=` of `parser.add_argument("--workers", ...)`."""
    defaults = [default for site in _options(ctx, node) if (default := _keyword(site, "default")) is not None]
    return defaults[0] if len(defaults) == 1 else None


def declared_default(ctx: FileContext, node: cst.BaseExpression, stack: Stack) -> cst.BaseExpression | None:
    """`config.accelerator` where `config = Config()` builds a class of this file (a dataclass of
    settings) whose body declares `accelerator: str = "auto"`: that default, when the call passes
    no argument for it (and no positional ones) and nothing assigns `config.accelerator` later."""
    if not isinstance(node, cst.Attribute) or not isinstance(node.value, cst.Name):
        return None
    built = ctx.single_value(node.value.value, stack)
    if not isinstance(built, cst.Call) or not isinstance(built.func, cst.Name) or built.func.value not in ctx.classes:
        return None
    field = node.attr.value
    if any(arg.keyword is None or arg.keyword.value == field for arg in built.args) \
            or ctx.assignments.get(f"{node.value.value}.{field}"):
        return None
    return class_field_defaults(ctx, built.func.value).get(field)


def argparse_option(ctx: FileContext, node: cst.BaseExpression) -> CallSite | None:
    """`args.workers` -> the one `parser.add_argument("--workers", ...)` call that defines it."""
    options = _options(ctx, node)
    return options[0] if len(options) == 1 else None


def _options(ctx: FileContext, node: cst.BaseExpression) -> list[CallSite]:
    """The `add_argument` calls whose destination is the attribute ``node`` reads from parsed args."""
    if not isinstance(node, cst.Attribute) or not isinstance(node.value, cst.Name):
        return []
    # `args` is often assigned inside main(), or twice (`args = get_args_parser()` then
    # `args = args.parse_args()`, MAE/DeiT): the last assignment anywhere parses them.
    found = ctx.assignments.get(node.value.value, [])
    if not found or not _holds_parsed_args(ctx, found[-1]):
        return []
    dest = node.attr.value
    return [site for site in ctx.method_calls("add_argument") if _dest_of(site) == dest]


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
        return bool(local) and index is None and not local[-1].unpacked and _parses(ctx, local[-1].value, None, depth)
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
