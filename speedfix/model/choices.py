"""Which layer classes of a library module the runs never build: a choice by string option.

A model library often holds several variants of one layer and builds the one an option names:

    class GNN(nn.Module):
        def __init__(self, num_layer, emb_dim, gnn_type="gin"):
            ...
            if gnn_type == "gin":
                self.gnns.append(GINConv(emb_dim))
            elif gnn_type == "gcn":
                self.gnns.append(GCNConv(emb_dim))

with the training script building `GNN(..., gnn_type=args.gnn_type)` and `--gnn_type` defaulting to
`"gin"`. `GCNConv` is built only in a branch whose test no run's value passes, so no run trains with
it: advice inside it is about code the runs do not take.

The value of such a parameter is what every call passes: the other scanned files' calls
(``Links.arguments``: a constant, or an option's argparse default), this file's own calls (a
constant, its default when left out, or in turn the parameter of the constructor that passes it
on: `GNN_graphpred(..., gnn_type="gin")` building `GNN(..., gnn_type=gnn_type)`), the `params:` of
the project's run configs that build the class (latent diffusion's `target: ...UNetModel` with
`use_spatial_transformer: True`), and the default where none passes it. A value that cannot be
known (a launch command that sets the option, a computed argument, `**kwargs`) keeps the class on
the run. The tests read are comparisons with constants and flags (`if use_checkpoint:`, `not
use_spatial_transformer`), in `if` statements and conditional expressions. A class built only
inside classes that no run builds is not built either (ldm's `QKVAttentionLegacy`, built only in
`AttentionBlock`); a class that nothing names at all (no call, no config, no decorator) counts as
such a builder, not as off the run itself. Only classes of a module that a scanned training
script imports (``Links.trained_by``) or whose classes a run config builds, that no other scanned
file builds, and that this file names nowhere but in those calls count.
"""

from __future__ import annotations

import ast
from typing import Callable, Iterator
from weakref import WeakKeyDictionary

import libcst as cst

from speedfix.model.arguments import State, find_argument
from speedfix.model.config_files import run_configs
from speedfix.model.context import FileContext
from speedfix.model.frames import function_of
from speedfix.model.index import CallSite
from speedfix.model.launch import option_passed
from speedfix.syntax.walk import child_nodes

_DEPTH = 3  # constructors passing a parameter on to another, followed at most
_KNOWN: WeakKeyDictionary[FileContext, dict[tuple[int, str], set[object] | None]] = WeakKeyDictionary()
_UNKNOWN = object()
_LITERALS = (cst.SimpleString, cst.Integer, cst.Float)


def classes_no_run_picks(ctx: FileContext) -> dict[str, str]:
    """The top-level classes of this library module that no run builds, each with why (`built
    only where `gnn_type` is `'gcn'`; the runs give `'gin'``)."""
    classes = {statement.name.value for statement in ctx.module.body if isinstance(statement, cst.ClassDef)}
    if ctx.links.trained_by is None and not classes & run_configs(ctx).named_classes():
        return {}  # neither a training script's module nor one whose classes the run configs build
    built_elsewhere = {built for built, *_ in ctx.links.constructed}
    sites: dict[str, list[CallSite]] = {}
    for site in ctx.calls:
        if site.func in classes and site.func not in built_elsewhere:
            sites.setdefault(site.func, []).append(site)
    taken = {id(site): _never_taken(ctx, site) for built in sites.values() for site in built}
    if not any(taken.values()):
        return {}
    # classes built nowhere that only build others count as builders no run takes (see below)
    idle = _built_by_nothing(ctx, classes - set(sites) - built_elsewhere)
    found: dict[str, str] = {}
    owner_of = {id(site): _top_class(ctx, site) for built in sites.values() for site in built}
    while True:  # in turn: classes built only inside classes no run builds (ldm's `QKVAttentionLegacy`)
        off = set(found) | idle
        more: dict[str, str] = {}
        for name, built in sites.items():
            owners = [owner_of[id(site)] for site in built]
            reasons = [None if owner in off else taken[id(site)] for site, owner in zip(built, owners)]
            if name in found or not all(reason or owner in off for reason, owner in zip(reasons, owners)):
                continue
            # the branch's test reads best; else the classes that would build it
            inside = " and ".join(f"`{owner}`" for owner in dict.fromkeys(o for o in owners if o in off))
            more[name] = next((reason for reason in reasons if reason), f"built only in {inside}, which no run builds")
        # a class named otherwise too (`custom_ops={QKVAttention: ...}`) may be built that way
        named = _names_used(ctx.module, set(more), skip=off) if more else {}
        more = {name: why for name, why in more.items()
                if named.get(name, 0) == sum(owner_of[id(site)] not in off for site in sites[name])}
        if not more:
            return found
        found.update(more)


def _built_by_nothing(ctx: FileContext, candidates: set[str]) -> set[str]:
    """The classes of ``candidates`` (built nowhere in this file nor by another scanned file)
    that nothing names: not this file's other code, not a run config, no decorator that
    registers them (guided diffusion's `EncoderUNetModel` beside the `UNetModel` a config
    builds). A scan does not see every caller, so they only count as builders of other classes
    that no run builds; their own code keeps its findings."""
    if not candidates:
        return set()
    configured = run_configs(ctx).named_classes()
    named = _names_used(ctx.module, candidates)
    return {statement.name.value for statement in ctx.module.body if isinstance(statement, cst.ClassDef)
            and statement.name.value in candidates and not statement.decorators
            and statement.name.value not in configured and not named.get(statement.name.value)}


def _top_class(ctx: FileContext, site: CallSite) -> str | None:
    """The top-level class whose code holds ``site`` (None: module-level code or a function)."""
    outer = next((frame.node for frame in site.stack if isinstance(frame.node, cst.ClassDef)), None)
    return outer.name.value if outer is not None and any(statement is outer for statement in ctx.module.body) else None


def _never_taken(ctx: FileContext, site: CallSite) -> str | None:
    """Why no run reaches ``site``: a branch of its function whose test no value of a parameter
    the runs give passes (None when one may)."""
    function = function_of(site.stack)
    if not isinstance(function, cst.FunctionDef) or site.statement is None:
        return None
    reasons: list[tuple[bool, str]] = []
    way = _branches_to(function.body, site.statement) + (_choices_to(site.statement, site.node) or [])
    for test, taken in way:
        decided = _parameter_test(test)
        if decided is None:
            continue
        name, passes, shown = decided
        values = _values(ctx, function, name, 0)
        if values is None or not values or any(passes(value) == taken for value in values):
            continue
        given = " or ".join(f"`{value!r}`" for value in sorted(values, key=repr))
        reasons.append((taken, f"built only {'where' if taken else 'unless'} `{name}` {shown}; the runs give {given}"))
    # the branch's own test reads best (`where gnn_type is 'gcn'`, not `unless ... 'gin'` of the `if` before its `elif`)
    return max(reasons, key=lambda reason: reason[0])[1] if reasons else None


def _branches_to(body: cst.BaseSuite, target: cst.CSTNode) -> list[tuple[cst.BaseExpression, bool]]:
    """The `if` tests on the way from ``body`` to the statement ``target``, each with whether the
    way goes through its body (True) or its `else`/`elif` (False); [] when not found in it."""
    path: list[tuple[cst.BaseExpression, bool]] = []
    return path if _find(body, target, path) else []


def _choices_to(node: cst.CSTNode, target: cst.CSTNode) -> list[tuple[cst.BaseExpression, bool]] | None:
    """The conditional expressions on the way from ``node`` to ``target`` (`AttentionBlock(...)
    if not use_spatial_transformer else SpatialTransformer(...)`), as ``_branches_to`` gives them;
    None when ``target`` is not below ``node``."""
    if node is target:
        return []
    for child in child_nodes(node):
        way = _choices_to(child, target)
        if way is not None:
            if isinstance(node, cst.IfExp) and child is not node.test:
                way.insert(0, (node.test, child is node.body))
            return way
    return None


def _find(body: cst.BaseSuite | cst.CSTNode, target: cst.CSTNode, path: list[tuple[cst.BaseExpression, bool]]) -> bool:
    statements = body.body if isinstance(body, (cst.IndentedBlock, cst.SimpleStatementSuite)) else ()
    for statement in statements:
        if statement is target:
            return True
        if isinstance(statement, cst.If):
            if _find_in_if(statement, target, path):
                return True
        elif isinstance(statement, (cst.For, cst.While, cst.With, cst.Try)):
            for suite in _suites(statement):
                if _find(suite, target, path):
                    return True
    return False


def _find_in_if(node: cst.If, target: cst.CSTNode, path: list[tuple[cst.BaseExpression, bool]]) -> bool:
    path.append((node.test, True))
    if _find(node.body, target, path):
        return True
    path[-1] = (node.test, False)
    orelse = node.orelse
    if isinstance(orelse, cst.If) and _find_in_if(orelse, target, path):
        return True
    if isinstance(orelse, cst.Else) and _find(orelse.body, target, path):
        return True
    path.pop()
    return False


def _suites(statement: cst.CSTNode) -> Iterator[cst.BaseSuite]:
    yield statement.body  # type: ignore[attr-defined]
    if isinstance(statement, cst.Try):
        for handler in statement.handlers:
            yield handler.body
    for part in ("orelse", "finalbody"):
        extra = getattr(statement, part, None)
        if extra is not None:
            yield extra.body


def _parameter_test(test: cst.BaseExpression) -> tuple[str, Callable[[object], bool], str] | None:
    """`name == "x"`, `"x" == name`, `name != "x"`, `name in ("x", "y")`, `name not in (...)`,
    `name`, `not name`: the name, the test as a function of its value, and the test as shown."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not) and isinstance(test.expression, cst.Name):
        return test.expression.value, lambda value: not value, "is false"
    if isinstance(test, cst.Name) and test.value not in ("True", "False", "None"):
        return test.value, bool, "is true"
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return None
    target = test.comparisons[0]
    left, right, operator = test.left, target.comparator, target.operator
    if isinstance(right, cst.Name) and isinstance(operator, (cst.Equal, cst.NotEqual)):
        left, right = right, left
    if not isinstance(left, cst.Name):
        return None
    if isinstance(operator, (cst.In, cst.NotIn)):
        if not isinstance(right, (cst.Tuple, cst.List, cst.Set)):
            return None
        options = [_literal(element.value) for element in right.elements]
        if any(option is _UNKNOWN for option in options):
            return None
        shown = " or ".join(f"`{option!r}`" for option in options)
        if isinstance(operator, cst.In):
            return left.value, lambda value: value in options, f"is {shown}"
        return left.value, lambda value: value not in options, f"is not {shown}"
    compared = _literal(right)
    if compared is _UNKNOWN:
        return None
    if isinstance(operator, cst.Equal):
        return left.value, lambda value: value == compared, f"is `{compared!r}`"
    if isinstance(operator, cst.NotEqual):
        return left.value, lambda value: value != compared, f"is not `{compared!r}`"
    return None


def _literal(node: cst.BaseExpression | None) -> object:
    if isinstance(node, _LITERALS):
        try:
            return ast.literal_eval(cst.Module([]).code_for_node(node))
        except (ValueError, SyntaxError):
            return _UNKNOWN
    if isinstance(node, cst.Name) and node.value in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[node.value]
    return _UNKNOWN


def parameter_values(ctx: FileContext, function: cst.FunctionDef, name: str) -> set[object] | None:
    """The values the parameter ``name`` of ``function`` (a top-level function or a top-level
    class's `__init__`) takes on the runs, as the module docstring says they are worked out; None
    when they cannot be known. (pointMLP: every model factory passes `bias=False`, through `Model`
    to the blocks it builds.)"""
    return _values(ctx, function, name, 0)


def _values(ctx: FileContext, function: cst.FunctionDef, name: str, depth: int) -> set[object] | None:
    """The values the parameter ``name`` of ``function`` takes on the runs (None: unknown);
    worked out once per parameter of a file."""
    known = _KNOWN.setdefault(ctx, {})
    key = (id(function), name)
    if key not in known:
        known[key] = _worked_out(ctx, function, name, depth)
    return known[key]


def _worked_out(ctx: FileContext, function: cst.FunctionDef, name: str, depth: int) -> set[object] | None:
    if depth > _DEPTH or option_passed(ctx, name):
        return None
    owner = _callable_of(ctx, function)
    if owner is None:
        return None
    called, offset = owner
    params = [*function.params.posonly_params, *function.params.params]
    index = next((i for i, param in enumerate(params) if param.name.value == name), None)
    param = params[index] if index is not None else next(
        (param for param in function.params.kwonly_params if param.name.value == name), None)
    if param is None or _rebinds(ctx, function, name):
        return None
    default = _literal(param.default) if param.default is not None else _UNKNOWN
    position = index - offset if index is not None and index >= offset else None
    values: set[object] = set()
    given = [value for other, key, value in ctx.links.arguments if other == called and key in (name, "*")]
    for value in given:
        try:
            values.add(ast.literal_eval(value))
        except (ValueError, SyntaxError):
            return None
    # no other file passes it: where they call it (a class: where they build it), its default holds
    left_out = not given and (not offset or called in {built for built, *_ in ctx.links.constructed})
    # the project's run configs that build the class (`target: ...UNetModel` with `params:`)
    configs = run_configs(ctx).init_args(called, (), "") if offset else []
    for args in configs:
        value = args.get(name)
        if value is None:
            left_out = True
        elif value.value is None or isinstance(value.value, (str, int, float, bool)):
            values.add(value.value)
        else:
            return None
    calls = [site for site in ctx.calls if site.func == called]
    left_out = left_out or not (given or calls or configs)  # called nowhere: its default
    for site in calls:
        argument = find_argument(ctx, site, name, position)
        if argument.state is State.MISSING:
            left_out = True
            continue
        if argument.state is not State.KNOWN or argument.node is None:
            return None
        passed = _passed_value(ctx, site, argument.node, depth)
        if passed is None:
            return None
        values |= passed
    if left_out:
        if default is _UNKNOWN:
            return None
        values.add(default)
    return values


def _passed_value(ctx: FileContext, site: CallSite, value: cst.BaseExpression, depth: int) -> set[object] | None:
    literal = _literal(value)
    if literal is not _UNKNOWN:
        return {literal}
    outer = function_of(site.stack)
    if isinstance(value, cst.Name) and isinstance(outer, cst.FunctionDef):
        return _values(ctx, outer, value.value, depth + 1)
    return None


def _callable_of(ctx: FileContext, function: cst.FunctionDef) -> tuple[str, int] | None:
    """What a call of ``function`` names, with the parameters it fills by itself: a top-level
    function (its name, 0) or the `__init__` of a top-level class (the class, 1 for `self`)."""
    if any(statement is function for statement in ctx.module.body):
        return function.name.value, 0
    if function.name.value != "__init__":
        return None
    for statement in ctx.module.body:
        if isinstance(statement, cst.ClassDef) and isinstance(statement.body, cst.IndentedBlock) \
                and any(member is function for member in statement.body.body):
            return statement.name.value, 1
    return None


def _rebinds(ctx: FileContext, function: cst.FunctionDef, name: str) -> bool:
    """Does ``function`` bind ``name`` again (beyond the parameter), or is it global anywhere?"""
    if name in ctx.rebound_everywhere:
        return True
    return sum(binding.scope is function for binding in ctx.name_bindings.get(name, ())) > 1


class _NameCount(cst.CSTVisitor):
    def __init__(self, names: set[str], skip: set[str]) -> None:
        self.names = names
        self.skip = skip
        self.inside: list[str] = []
        self.count: dict[str, int] = {}

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        if node.name.value in self.skip:
            return False
        for part in (*node.decorators, *node.bases, *node.keywords):
            part.visit(self)
        self.inside.append(node.name.value)
        node.body.visit(self)
        self.inside.pop()
        return False  # its own name is no use of it

    def visit_Name(self, node: cst.Name) -> None:
        if node.value in self.names and node.value not in self.inside:
            self.count[node.value] = self.count.get(node.value, 0) + 1


def _names_used(module: cst.Module, names: set[str], skip: set[str] = frozenset()) -> dict[str, int]:  # type: ignore[assignment]
    """How often each of ``names`` is read in the module, outside its own class (`super(GCNConv,
    self).__init__()` is no use of `GCNConv`) and the classes ``skip``."""
    counter = _NameCount(names, skip)
    module.visit(counter)
    return counter.count
