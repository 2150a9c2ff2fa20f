"""Automatic mixed precision as a script sets it up, read without running it.

- ``autocasts``: each `torch.autocast` / `torch.amp.autocast` / `torch.cuda.amp.autocast` call
  with the precision it runs in on the script's *default path*: the dtype it asks for (else the
  device's default: fp16 on CUDA, bf16 on the CPU) and whether it is enabled, resolved through
  constants, argparse defaults (`store_true` flags included) and `{...}[key]` tables (nanoGPT's
  `ptdtype = {'float32': torch.float32, ...}[dtype]`). A value chosen at run time
  (`'bfloat16' if torch.cuda.is_bf16_supported() else 'float16'`) stays unknown, and unknown
  means the rules stay silent.
- ``mixed_precision_by_default``: does the script train in 16-bit when run as it is? An autocast
  that is off by default (`--dtype float32`, `enabled=args.amp` with no default) does not count.
- ``scalers`` and ``scaler_removal``: the GradScalers a script makes, and the rewrite that drops
  one (`scaler.scale(loss)` -> `loss`, `scaler.step(opt)` -> `opt.step()`, `scaler.update()`,
  `scaler.unscale_(opt)` and the construction removed), shared by SF204 and SF207.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from weakref import WeakKeyDictionary

import libcst as cst

from speedfix.engine.findings import FixOp, RemoveImportIfUnused, Transform
from speedfix.fixes.removal import removal_ops
from speedfix.model.arguments import argparse_default, find_argument
from speedfix.model.context import CallSite, FileContext, FrameKind, Stack, walk_expression
from speedfix.model.flow import default_truth, off_by_default
from speedfix.model.patterns import AUTOCAST
from speedfix.syntax.blocks import statement_owner
from speedfix.syntax.names import dotted_name


class Precision(Enum):
    FP16 = "float16"
    BF16 = "bfloat16"
    FP32 = "float32"
    UNKNOWN = "unknown"


_DTYPES = {
    "torch.float16": Precision.FP16,
    "torch.half": Precision.FP16,
    "torch.bfloat16": Precision.BF16,
    "torch.float32": Precision.FP32,
    "torch.float": Precision.FP32,
}
# The deprecated device-specific autocasts: their device is their module, their signature is
# (enabled, dtype, cache_enabled); torch.autocast's is (device_type, dtype, enabled, cache_enabled).
_LEGACY_AUTOCAST = {
    "torch.cuda.amp.autocast": "cuda",
    "torch.cuda.amp.autocast_mode.autocast": "cuda",
    "torch.cpu.amp.autocast": "cpu",
    "torch.cpu.amp.autocast_mode.autocast": "cpu",
}
ALL_AUTOCAST = (*AUTOCAST, "torch.cuda.amp.autocast_mode.autocast", "torch.cpu.amp.autocast_mode.autocast")
_DEFAULT_DTYPE_SETTERS = ("torch.set_autocast_gpu_dtype", "torch.set_autocast_dtype")
GRAD_SCALER = (
    "torch.GradScaler",
    "torch.amp.GradScaler",
    "torch.amp.grad_scaler.GradScaler",
    "torch.cuda.amp.GradScaler",
    "torch.cuda.amp.grad_scaler.GradScaler",
    "torch.cpu.amp.GradScaler",
    "torch.cpu.amp.grad_scaler.GradScaler",
)
_DEPRECATED_AMP_MODULES = ("torch.cuda.amp", "torch.cpu.amp")
# Keywords through which a framework or a model is put in 16-bit (Lightning, FSDP, HF, accelerate).
_PRECISION_KEYWORDS = frozenset({"precision", "param_dtype", "mixed_precision", "torch_dtype", "bf16", "fp16"})
_DEPTH = 4


@dataclass(frozen=True)
class Autocast:
    site: CallSite
    device: str | None  # "cuda", "cpu", ...; None when only known at run time
    precision: Precision  # on the default path
    enabled: bool | None  # None: decided at run time
    legacy: bool  # torch.cuda.amp / torch.cpu.amp signature
    gate: str | None = None  # the test of an `if` that keeps it off the default path (`args.amp`)

    @property
    def on_by_default(self) -> bool:
        """Does it run in 16-bit when the script runs with its defaults (or may it)?"""
        return self.enabled is not False and self.precision is not Precision.FP32 and self.gate is None

    @property
    def on_cuda(self) -> bool:
        """On the GPU path: CUDA, or a device the file only knows at run time."""
        return self.device is None or self.device == "cuda"


@dataclass(frozen=True)
class Scaler:
    site: CallSite
    enabled: bool | None
    target: str | None  # `scaler` / `self.scaler` when `target = GradScaler(...)` is its own statement


# ---------------------------------------------------------------- values on the default path
def string_value(ctx: FileContext, node: cst.BaseExpression | None, stack: Stack, depth: int = 0) -> str | None:
    """The string an expression certainly holds: a literal, a constant, an argparse default."""
    if node is None or depth > _DEPTH:
        return None
    if isinstance(node, cst.SimpleString):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    if isinstance(node, cst.Name):
        return string_value(ctx, ctx.single_value(node.value, stack), stack, depth + 1)
    return string_value(ctx, argparse_default(ctx, node), stack, depth + 1)


def precision_of(ctx: FileContext, node: cst.BaseExpression | None, stack: Stack, depth: int = 0) -> Precision:
    """The floating-point dtype an expression certainly holds (`torch.bfloat16`, a constant bound
    to one, `{...}[key]` with a known key, `getattr(torch, "float16")`)."""
    if node is None or depth > _DEPTH:
        return Precision.UNKNOWN
    known = _DTYPES.get(ctx.qualname(node) or "")
    if known is not None:
        return known
    if isinstance(node, cst.Name):
        return precision_of(ctx, ctx.single_value(node.value, stack), stack, depth + 1)
    if isinstance(node, cst.Subscript):
        return precision_of(ctx, _table_entry(ctx, node, stack, depth), stack, depth + 1)
    if isinstance(node, cst.Call) and dotted_name(node.func) == "getattr" and len(node.args) == 2:
        if ctx.qualname(node.args[0].value) == "torch":
            name = string_value(ctx, node.args[1].value, stack, depth + 1)
            return _DTYPES.get(f"torch.{name}", Precision.UNKNOWN)
    if isinstance(node, cst.IfExp):
        branches = {precision_of(ctx, node.body, stack, depth + 1), precision_of(ctx, node.orelse, stack, depth + 1)}
        return branches.pop() if len(branches) == 1 else Precision.UNKNOWN
    return Precision.UNKNOWN


def _table_entry(ctx: FileContext, node: cst.Subscript, stack: Stack, depth: int) -> cst.BaseExpression | None:
    """`{'float32': torch.float32, ...}[dtype]` with `dtype` known: the entry's value."""
    table = node.value
    if isinstance(table, cst.Name):
        table = ctx.single_value(table.value, stack)
    if not isinstance(table, cst.Dict) or len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
        return None
    key = string_value(ctx, node.slice[0].slice.value, stack, depth + 1)
    if key is None:
        return None
    for element in table.elements:
        if isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString):
            if element.key.evaluated_value == key:
                return element.value
    return None


def truth_value(ctx: FileContext, node: cst.BaseExpression | None, stack: Stack) -> bool | None:
    """Whether a condition holds with the script's defaults: ``flow.default_truth`` (constants,
    argparse defaults and flags, `not`/`and`/`or`), plus `dtype == 'float16'` with `dtype` known."""
    if node is None:
        return None
    if isinstance(node, cst.Comparison) and len(node.comparisons) == 1:
        compared = _compare(ctx, node, stack, 0)
        if compared is not None:
            return compared
    return default_truth(ctx, node, stack)


def _compare(ctx: FileContext, node: cst.Comparison, stack: Stack, depth: int) -> bool | None:
    operator = node.comparisons[0].operator
    if not isinstance(operator, (cst.Equal, cst.NotEqual, cst.Is, cst.IsNot)):
        return None
    left, right = node.left, node.comparisons[0].comparator
    equal: bool | None = None
    strings = string_value(ctx, left, stack, depth + 1), string_value(ctx, right, stack, depth + 1)
    if None not in strings:
        equal = strings[0] == strings[1]
    else:
        dtypes = precision_of(ctx, left, stack, depth + 1), precision_of(ctx, right, stack, depth + 1)
        if Precision.UNKNOWN not in dtypes:
            equal = dtypes[0] is dtypes[1]
    if equal is None:
        return None
    return equal if isinstance(operator, (cst.Equal, cst.Is)) else not equal


# ---------------------------------------------------------------- autocast
_AUTOCASTS: WeakKeyDictionary[FileContext, list[Autocast]] = WeakKeyDictionary()


def autocasts(ctx: FileContext) -> list[Autocast]:
    """Every autocast call of the file (`with` item, assigned context or decorator), in order."""
    found = _AUTOCASTS.get(ctx)
    if found is None:
        found = _AUTOCASTS[ctx] = [_autocast(ctx, site) for site in ctx.calls_to(*ALL_AUTOCAST)]
    return found


def _autocast(ctx: FileContext, site: CallSite) -> Autocast:
    device = _LEGACY_AUTOCAST.get(ctx.call_qualname(site) or "")
    legacy = device is not None
    if not legacy:
        device_arg = find_argument(ctx, site, "device_type", 0)
        device = string_value(ctx, device_arg.node, site.stack)
    dtype = find_argument(ctx, site, "dtype", 1)
    if dtype.missing:
        default_set = bool(ctx.calls_to(*_DEFAULT_DTYPE_SETTERS))
        precision = Precision.UNKNOWN if default_set else (Precision.BF16 if device == "cpu" else Precision.FP16)
    else:
        precision = precision_of(ctx, dtype.node, site.stack)
    enabled_arg = find_argument(ctx, site, "enabled", 0 if legacy else 2)
    enabled = True if enabled_arg.missing else truth_value(ctx, enabled_arg.node, site.stack)
    statement = site.statement or next((w.node for w in ctx.withs if site.node in w.items), None)
    return Autocast(site, device, precision, enabled, legacy, off_by_default(ctx, statement, site.stack))


@dataclass(frozen=True)
class Passing:
    """A place that hands autocast itself around (`partial(torch.autocast, ...)`, `ac =
    torch.autocast`): the precision it runs in is in no one call the file shows."""

    node: cst.CSTNode
    gate: str | None  # the test of an `if` that keeps it off the default path (`args.amp`)


def autocast_passings(ctx: FileContext) -> list[Passing]:
    found = _PASSINGS.get(ctx)
    if found is None:
        places = [(site.node, site.statement, site.stack) for site in ctx.calls
                  if any(ctx.qualname(arg.value) in ALL_AUTOCAST for arg in site.node.args)]
        places += [(a.value, a.statement, a.stack) for assignments in ctx.assignments.values()
                   for a in assignments if ctx.qualname(a.value) in ALL_AUTOCAST]
        found = _PASSINGS[ctx] = [Passing(node, off_by_default(ctx, statement, stack)) for node, statement, stack in places]
    return found


def autocast_passed_around(ctx: FileContext) -> bool:
    """Is autocast handed around on the script's default path? timm's `if args.amp:
    amp_autocast = partial(torch.autocast, ...)` with `--amp` off by default is not."""
    return any(passing.gate is None for passing in autocast_passings(ctx))


_PASSINGS: WeakKeyDictionary[FileContext, list[Passing]] = WeakKeyDictionary()


def mixed_precision_by_default(ctx: FileContext) -> bool:
    """Does the script run its model in 16-bit with its defaults, as far as the file tells?
    Unknown counts as yes (rules stay silent). An autocast that is off by default does not count,
    nor do the 16-bit dtypes that only its options name."""
    casts = autocasts(ctx)
    if autocast_passed_around(ctx) or any(cast.on_by_default for cast in casts):
        return True
    if casts or autocast_passings(ctx):
        return _low_precision_elsewhere(ctx)
    return ctx.mentions_low_precision or any(name.endswith("GradScaler") for name in ctx.calls_by_qualname)


def gated_autocasts(ctx: FileContext) -> list[Autocast | Passing]:
    """The file's autocasts (and places that hand autocast around) when all of them are off by
    default and nothing else runs in 16-bit."""
    return [] if mixed_precision_by_default(ctx) else [*autocasts(ctx), *autocast_passings(ctx)]


def _low_precision_elsewhere(ctx: FileContext) -> bool:
    """A 16-bit model or framework setting besides autocast: `.half()`, `.to(torch.bfloat16)`,
    Lightning's `precision="bf16-mixed"`, FSDP's `param_dtype=`, HF's `bf16=True`."""
    if any(True for _ in ctx.method_calls("half")) or any(True for _ in ctx.method_calls("bfloat16")):
        return True
    for site in ctx.method_calls("to"):
        if any(precision_of(ctx, arg.value, site.stack) in (Precision.FP16, Precision.BF16) for arg in site.node.args):
            return True
    for site in ctx.calls:
        for arg in site.node.args:
            if arg.keyword is not None and arg.keyword.value in _PRECISION_KEYWORDS and _sixteen_bit(ctx, arg, site):
                return True
    return False


def _sixteen_bit(ctx: FileContext, arg: cst.Arg, site: CallSite) -> bool:
    """May this precision keyword select 16-bit? (Unknown values count.)"""
    if precision_of(ctx, arg.value, site.stack) is Precision.FP32:
        return False
    text = string_value(ctx, arg.value, site.stack)
    if text is not None:
        return "16" in text
    if isinstance(arg.value, cst.Integer):
        return arg.value.value == "16"
    return truth_value(ctx, arg.value, site.stack) is not False


# ---------------------------------------------------------------- GradScaler
def scalers(ctx: FileContext) -> list[Scaler]:
    found = []
    for site in ctx.calls_to(*GRAD_SCALER):
        legacy = (ctx.call_qualname(site) or "").startswith(_DEPRECATED_AMP_MODULES)
        enabled_arg = find_argument(ctx, site, "enabled", 4 if legacy else 5)
        enabled = True if enabled_arg.missing else truth_value(ctx, enabled_arg.node, site.stack)
        found.append(Scaler(site, enabled, _assigned_to(site)))
    return found


def loss_scaler_calls(ctx: FileContext) -> list[CallSite]:
    """timm/Meta `loss_scaler(loss, optimizer, ...)` calls: a GradScaler built elsewhere (a
    `NativeScaler` made in `main.py` and passed in) that scales, unscales and steps."""
    return [site for site in ctx.calls if ctx.is_loss_scaler(site)]


def _assigned_to(site: CallSite) -> str | None:
    statement = site.statement
    if statement is None or len(statement.body) != 1:
        return None
    small = statement.body[0]
    if not isinstance(small, cst.Assign) or len(small.targets) != 1 or small.value is not site.node:
        return None
    return dotted_name(small.targets[0].target)


@dataclass
class _Uses:
    """What a walk over the scaler's scope found."""

    ops: list[FixOp]
    removed: list[cst.BaseStatement]
    problem: str | None = None


def scaler_removal(ctx: FileContext, scaler: Scaler) -> tuple[list[FixOp] | None, str | None]:
    """Ops that drop ``scaler`` and rewrite its calls as if it were not there, or (None, why)."""
    name = scaler.target
    scope = scaler_scope(ctx, scaler)
    if name is None or scope is None or scaler.site.statement is None:
        small = scaler.site.statement.body[0] if scaler.site.statement is not None else None
        if isinstance(small, cst.Assign) and isinstance(small.value, cst.IfExp):
            return None, "the scaler exists only on some paths (`... if ... else None`), which its uses test"
        return None, "the GradScaler is not assigned to a variable of its own"
    uses = _Uses(ops=[], removed=[scaler.site.statement])
    target = scaler.site.statement.body[0].targets[0].target  # type: ignore[attr-defined]
    _collect_uses(ctx, scope, name, target, uses)
    if uses.problem is None:
        uses.problem = _empties_a_block(ctx, uses.removed)
    if uses.problem is not None:
        return None, uses.problem
    ops = list(uses.ops)
    for statement in uses.removed:
        removal = removal_ops(ctx, statement)
        if removal is None:
            return None, "a scaler call could not be removed"
        ops.extend(removal)
    ops.extend(_import_cleanup(ctx, scaler))
    return ops, None


def scaler_scope(ctx: FileContext, scaler: Scaler) -> cst.CSTNode | None:
    """Where the scaler's name can be used: its class for `self.x`, else its function or module.

    A fix that drops the scaler restructures this node (``Rule.report(restructures=...)``): a fix
    of another rule that would write a new scaler call in it (SF205's `scaler.unscale_(opt)`)
    waits for the next pass, which no longer finds the scaler."""
    name = scaler.target or ""
    wanted = FrameKind.CLASS if name.startswith("self.") and name.count(".") == 1 else FrameKind.FUNCTION
    if "." in name and wanted is FrameKind.FUNCTION:
        return None  # `trainer.scaler`: used wherever `trainer` goes
    for frame in reversed(scaler.site.stack):
        if frame.kind is wanted:
            return frame.node
    return None if wanted is FrameKind.CLASS else ctx.module


def _collect_uses(ctx: FileContext, scope: cst.CSTNode, name: str, target: cst.CSTNode, uses: _Uses) -> None:
    consumed = {id(target)}
    not_references: set[int] = set()  # `x.scaler`'s `scaler`, `f(scaler=...)`'s keyword
    references: list[cst.CSTNode] = []
    for node in walk_expression(scope):
        if isinstance(node, cst.Attribute):
            not_references.add(id(node.attr))
        elif isinstance(node, cst.Arg) and node.keyword is not None:
            not_references.add(id(node.keyword))
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and dotted_name(node.func.value) == name:
            if _rewrite_call(ctx, node, uses):
                consumed.add(id(node.func.value))
            elif uses.problem is None:
                uses.problem = f"`{name}.{node.func.attr.value}()` has no counterpart without the scaler"
        if (isinstance(node, cst.Name) and node.value == name) or (
            isinstance(node, cst.Attribute) and "." in name and dotted_name(node) == name
        ):
            references.append(node)
    if uses.problem is None and any(id(n) not in consumed and id(n) not in not_references for n in references):
        uses.problem = f"`{name}` is also used as a value (passed on, compared or stored)"


def _rewrite_call(ctx: FileContext, call: cst.Call, uses: _Uses) -> bool:
    """Record the rewrite of one scaler method call; False when it has none."""
    method = call.func.attr.value  # type: ignore[attr-defined]
    if method == "scale":
        value = _only_argument(call, "outputs")
        if value is None:
            return False
        uses.ops.append(Transform(call, _unwrap_scale))
        return True
    if method == "step":
        if _only_argument(call, "optimizer", alone=False) is None:
            return False
        uses.ops.append(Transform(call, _optimizer_step))
        return True
    if method in ("update", "unscale_"):
        site = ctx.site_of(call)
        statement = site.statement if site is not None else None
        alone = statement is not None and len(statement.body) == 1 and isinstance(statement.body[0], cst.Expr)
        if not alone or statement.body[0].value is not call:  # type: ignore[union-attr]
            return False
        uses.removed.append(statement)
        return True
    return False


def _only_argument(call: cst.Call, keyword: str, *, alone: bool = True) -> cst.BaseExpression | None:
    """The first argument (positional, or ``keyword=``), when no `*`/`**` argument hides others."""
    if not call.args or any(arg.star for arg in call.args) or (alone and len(call.args) != 1):
        return None
    first = call.args[0]
    return first.value if first.keyword is None or first.keyword.value == keyword else None


def _unwrap_scale(updated: cst.CSTNode) -> cst.CSTNode:
    """`scaler.scale(loss)` -> `loss` (parenthesised where an operator needs it)."""
    assert isinstance(updated, cst.Call)
    return _atom(updated.args[0].value, updated)


def _optimizer_step(updated: cst.CSTNode) -> cst.CSTNode:
    """`scaler.step(opt, *rest)` -> `opt.step(*rest)`."""
    assert isinstance(updated, cst.Call)
    optimizer, rest = updated.args[0].value, list(updated.args[1:])
    return updated.with_changes(func=cst.Attribute(value=_atom(optimizer, None), attr=cst.Name("step")), args=rest)


def _atom(expr: cst.BaseExpression, replaced: cst.BaseExpression | None) -> cst.BaseExpression:
    """``expr`` as it may stand where ``replaced`` stood, or before `.attr`."""
    if replaced is not None and replaced.lpar and not expr.lpar:
        return expr.with_changes(lpar=replaced.lpar, rpar=replaced.rpar)
    if expr.lpar or isinstance(expr, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
        return expr
    return expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def _empties_a_block(ctx: FileContext, removed: list[cst.BaseStatement]) -> str | None:
    """Removing every statement of a block at once would leave it empty (one alone is replaced
    by `pass` or takes its `if` along)."""
    by_block: dict[int, tuple[int, int]] = {}
    for statement in removed:
        found = statement_owner(ctx, statement)
        if found is None:
            return "a scaler call is not a statement of a block"
        count, size = by_block.get(id(found[1]), (0, len(found[1])))
        by_block[id(found[1])] = (count + 1, size)
    if any(count == size and size > 1 for count, size in by_block.values()):
        return "removing the scaler calls would leave a block empty"
    return None


def _import_cleanup(ctx: FileContext, scaler: Scaler) -> list[FixOp]:
    """Drop `from ... import GradScaler` once nothing uses it (also under the `torch.amp` name
    SF203 may give the import in the same pass)."""
    func = scaler.site.node.func
    qualified = ctx.qualname(func)
    if not isinstance(func, cst.Name) or qualified is None or "." not in qualified:
        return []
    module, obj = qualified.rsplit(".", 1)
    asname = func.value if func.value != obj else None
    ops: list[FixOp] = [RemoveImportIfUnused(module, obj, asname)]
    if module in _DEPRECATED_AMP_MODULES:
        ops.append(RemoveImportIfUnused("torch.amp", obj, asname))
    return ops
