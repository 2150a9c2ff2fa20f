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
- ``scalers`` and ``scaler_scope``: the GradScalers a script makes and where their names can be
  used (the rewrite that drops one is ``speedfix.fixes.scaler``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from weakref import WeakKeyDictionary

import libcst as cst

from speedfix.model.arguments import VALUE_DEPTH, find_argument, string_value
from speedfix.model.context import FileContext
from speedfix.model.deepspeed_config import DEEPSPEED_INITIALIZE, engine_sixteen_bit, plugin_sixteen_bit
from speedfix.model.flow import assigned_name, default_truth, gates, in_no_run, off_by_default, reached_by_launch
from speedfix.model.frames import FrameKind, Stack
from speedfix.model.frameworks import ACCELERATOR, launched_in_fp32, launched_mixed_precision
from speedfix.model.index import CallSite
from speedfix.model.launch import option_passed
from speedfix.model.networks import network_assignments, step_networks
from speedfix.model.patterns import AUTOCAST, EVALUATION_FUNCTION
from speedfix.model.tensors import has_sync_before
from speedfix.project.steps import LIGHTNING_MODULE
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import code_of, parameter_default

APEX_AMP_INITIALIZE = "apex.amp.initialize"


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
DEPRECATED_AMP_MODULES = ("torch.cuda.amp", "torch.cpu.amp")
# Keywords through which a framework or a model is put in 16-bit (Lightning, FSDP, HF, accelerate).
_PRECISION_KEYWORDS = frozenset({"precision", "param_dtype", "mixed_precision", "torch_dtype", "bf16", "fp16"})
# ... and of Hugging Face's `from_pretrained` only (transformers 4.56 renamed `torch_dtype`)
_LOADING_KEYWORDS = frozenset({"dtype"})


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
def precision_of(ctx: FileContext, node: cst.BaseExpression | None, stack: Stack, depth: int = 0) -> Precision:
    """The floating-point dtype an expression certainly holds (`torch.bfloat16`, a constant bound
    to one, `{...}[key]` with a known key, `getattr(torch, "float16")`)."""
    if node is None or depth > VALUE_DEPTH:
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
    gate = off_by_default(ctx, statement, site.stack)
    if gate is not None and reached_by_launch(ctx, statement, site.stack):
        gate = None  # a launch command of the project turns it on (`--use_torch_amp`)
    return Autocast(site, device, precision, enabled, legacy, gate)


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
    Unknown counts as yes (rules stay silent): a DeepSpeed engine whose config cannot be read. An autocast that is off by default does not count,
    nor do the 16-bit dtypes that only its options name."""
    casts = autocasts(ctx)
    if autocast_passed_around(ctx) or any(cast.on_by_default and not _evaluation_cast(ctx, cast) for cast in casts):
        return True
    if casts or autocast_passings(ctx) or _accelerate_in_fp32(ctx):
        return _low_precision_elsewhere(ctx) or _accelerate_launched_in_sixteen_bit(ctx)
    if _low_precision_by_default(ctx) or any(name.endswith("GradScaler") for name in ctx.calls_by_qualname):
        return True
    if any(not (_apex_in_fp32(ctx, site) or in_no_run(ctx, site.statement, site.stack))
           for site in ctx.calls_to(APEX_AMP_INITIALIZE)):
        return True  # NVIDIA apex, the mixed precision of torch before 1.6 (`if args.fp16:` off by default: not)
    if _prepared_by_a_configured_wrapper(ctx):
        return True  # its configuration decides
    return bool(ctx.calls_to(DEEPSPEED_INITIALIZE)) and engine_sixteen_bit(ctx) is not False  # its config decides


def _evaluation_cast(ctx: FileContext, cast: Autocast) -> bool:
    """An autocast in a function named for evaluation (diffusers' `log_validation`, which runs the
    pipeline under `torch.autocast("cuda")`), in a file that trains elsewhere: not the precision
    of its training steps."""
    function = ctx.function_of(cast.site.stack)
    return isinstance(function, cst.FunctionDef) and EVALUATION_FUNCTION.match(function.name.value) is not None \
        and bool(ctx.step_loops or ctx.step_functions) and not any(
            isinstance(frame.node, cst.FunctionDef) and frame.node in ctx.step_functions for frame in cast.site.stack)


def _apex_in_fp32(ctx: FileContext, site: CallSite) -> bool:
    """`amp.initialize(model, optimizer, opt_level=args.amp)` with `--amp` defaulting to "O0"
    (and no launch command of the project passing it): apex's pure-fp32 level, not mixed precision."""
    level = find_argument(ctx, site, "opt_level", 3)
    if level.missing or level.node is None:
        return False  # apex's default level is "O1"
    if string_value(ctx, level.node, site.stack) != "O0":
        return False
    option = level.node.attr.value if isinstance(level.node, cst.Attribute) else None
    return option is None or not option_passed(ctx, option)


def _low_precision_by_default(ctx: FileContext) -> bool:
    """Does the file name a 16-bit dtype or setting (`.half()`, `torch.bfloat16`, "bf16-mixed")
    on its default path? `if args.half: model.half()` with `--half` off by default does not count,
    unless one of the project's launch commands reaches it: the default run trains in fp32. (A
    path option that defaults to None, `if args.model_name_or_path:`, is given by every launch.)"""
    if not ctx.mentions_low_precision:
        return False
    launched_fp32 = launched_in_fp32(ctx)
    return any(
        not _defines_option(statement)
        and not (launched_fp32 and (statement is None or _under_accelerator_precision(ctx, statement)))
        and (off_by_default(ctx, statement, stack) is None or reached_by_launch(ctx, statement, stack))
        for statement, stack in ctx.low_precision_at)  # a launch command may turn the option on


def _defines_option(statement: cst.CSTNode | None) -> bool:
    """`parser.add_argument("--mixed_precision", default=None, choices=["no", "fp16", "bf16"])`:
    names the 16-bit choices, and its default chooses none of them (`default="bf16"` does)."""
    if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
            and isinstance(call := getattr(statement.body[0], "value", None), cst.Call)
            and isinstance(call.func, cst.Attribute) and call.func.attr.value == "add_argument"):
        return False
    default = next((arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value == "default"), None)
    return default is None or not any(word in code_of(default).lower() for word in ("16", "half"))


def _under_accelerator_precision(ctx: FileContext, statement: cst.CSTNode | None) -> bool:
    """Is ``statement`` under `if accelerator.mixed_precision == "fp16":` (diffusers' `weight_dtype`)?"""
    return isinstance(statement, cst.BaseStatement) and any(
        isinstance(test, cst.Comparison) and isinstance(test.left, cst.Attribute)
        and test.left.attr.value == "mixed_precision" and wanted for test, wanted in gates(ctx, statement))


def accelerate_picks_precision(ctx: FileContext) -> bool:
    """Does an `Accelerator` of the file take its mixed precision from outside the code: no
    `mixed_precision=` the scan can read (`Accelerator(**accelerate_kwargs)`, or none at all), so
    `accelerate launch --mixed_precision` or the machine's `accelerate config` decides? Not when
    every launch command of the project says `--mixed_precision="no"`: those runs are fp32."""
    if not any(precision is None for precision in _accelerator_precisions(ctx)):
        return False
    return not launched_in_fp32(ctx)  # `accelerate launch --mixed_precision="no"`: fp32


def _accelerate_launched_in_sixteen_bit(ctx: FileContext) -> bool:
    """Does an `Accelerator` that leaves its precision open run in 16-bit all the same: every
    launch command of the project sets fp16 or bf16 (`accelerate launch --mixed_precision bf16`),
    or the DeepSpeed plugin it is given has a config that enables them? The script's own autocast
    flag (`--use_amp`, off by default) is then not what decides."""
    if not any(precision is None for precision in _accelerator_precisions(ctx)):
        return False
    if plugin_sixteen_bit(ctx):
        return True
    chosen = launched_mixed_precision(ctx)
    return bool(chosen) and all(value in ("fp16", "bf16") for value in chosen)


def _accelerate_in_fp32(ctx: FileContext) -> bool:
    """Does every `Accelerator` of the file train in fp32 by default (diffusers' `--mixed_precision`
    option, default "no")? The 16-bit dtypes the file names are then for its other choices."""
    precisions = _accelerator_precisions(ctx)
    return bool(precisions) and all(precision == "no" for precision in precisions)


def _prepared_by_a_configured_wrapper(ctx: FileContext) -> bool:
    """Does an object that is no `Accelerator` of this file both `prepare` the model and run the
    backward pass (PickScore's `accelerator = instantiate_with_cfg(cfg.accelerator)`, a project
    class around Accelerate or DeepSpeed built from a hydra config, or one handed in)? Its
    configuration, not this file, decides the precision."""
    prepared = {site.func.rsplit(".", 1)[0] for site in ctx.method_calls("prepare") if site.func and "." in site.func}
    stepping = {site.func.rsplit(".", 1)[0] for site in ctx.method_calls("backward") if site.func and "." in site.func}
    return any(not any(isinstance(a.value, cst.Call) and ctx.qualname(a.value.func) in ACCELERATOR
                       for a in ctx.assignments.get(receiver, ()))
               for receiver in prepared & stepping)


def _accelerator_precisions(ctx: FileContext) -> list[str | None]:
    """Each `Accelerator`'s `mixed_precision=` as the scan reads it (None: not stated, or unknown)."""
    return [string_value(ctx, find_argument(ctx, site, "mixed_precision").node, site.stack)
            for site in ctx.calls_to(*ACCELERATOR)]


def gated_autocasts(ctx: FileContext) -> list[Autocast | Passing]:
    """The file's autocasts (and places that hand autocast around) when all of them are off by
    default and nothing else runs in 16-bit; not an evaluation's (``_evaluation_cast``)."""
    if mixed_precision_by_default(ctx):
        return []
    return [*(cast for cast in autocasts(ctx) if not _evaluation_cast(ctx, cast)), *autocast_passings(ctx)]


def _low_precision_elsewhere(ctx: FileContext) -> bool:
    """A 16-bit model or framework setting besides autocast: `.half()`, `.to(torch.bfloat16)`,
    Lightning's `precision="bf16-mixed"`, FSDP's `param_dtype=`, HF's `bf16=True`, a checkpoint
    loaded in 16-bit (`from_pretrained(..., dtype=torch.bfloat16)`)."""
    return _sixteen_bit_casts(ctx) or _sixteen_bit_keyword(ctx)


def weights_in_sixteen_bit(ctx: FileContext) -> bool:
    """Does the file put a network the training runs in 16-bit itself, whatever a framework's
    mixed-precision setting says: `from_pretrained(..., dtype=torch.bfloat16)` (or
    `torch_dtype=`), `.half()`, `.to(torch.bfloat16)`? Only values certain to be 16-bit count."""
    networks = step_networks(ctx)
    for name, stack in networks.items():
        if any(_built_in_sixteen_bit(ctx, a.value, a.stack) for a in network_assignments(ctx, name, stack)):
            return True
    return any(dotted_name(site.node.func.value) in networks and _casts_to_sixteen_bit(ctx, site.node, site.stack)  # type: ignore[attr-defined]
               for method in ("half", "bfloat16", "to") for site in ctx.method_calls(method))


def lightning_module_in_sixteen_bit(ctx: FileContext) -> bool:
    """Does a LightningModule of this file cast itself to 16-bit (`self.to(device).to(dtype)`,
    `self.half()`, `self.bfloat16()`), with a dtype that is 16-bit or a parameter of its method
    that defaults to one (`dtype: torch.dtype = torch.bfloat16`)? Its weights, and so its
    matmuls, are then 16-bit whatever the Trainer's `precision` says (OminiControl's LoRA on FLUX)."""
    for method in ("to", "half", "bfloat16"):
        for site in ctx.method_calls(method):
            owner = ctx.class_of(site.stack)
            if owner is None or _chain_root(site.node) != "self" \
                    or not ctx.is_subclass_of(owner.name.value, *LIGHTNING_MODULE):
                continue
            if _casts_to_sixteen_bit(ctx, site.node, site.stack) or any(
                    arg.keyword is None and isinstance(arg.value, cst.Name)
                    and precision_of(ctx, parameter_default(ctx.function_of(site.stack), arg.value.value), site.stack)
                    in (Precision.FP16, Precision.BF16) for arg in site.node.args):
                return True
    return False


def _chain_root(call: cst.Call) -> str | None:
    """`self` of `self.to(device).to(dtype)`."""
    node: cst.BaseExpression = call
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        node = node.func.value
    return dotted_name(node)


def _built_in_sixteen_bit(ctx: FileContext, value: cst.BaseExpression, stack: Stack) -> bool:
    for link in _chain(value):
        if not isinstance(link, cst.Call):
            continue
        if _casts_to_sixteen_bit(ctx, link, stack):
            return True
        if (dotted_name(link.func) or "").endswith(".from_pretrained") and any(
                arg.keyword is not None and arg.keyword.value in ("torch_dtype", "dtype")
                and precision_of(ctx, arg.value, stack) in (Precision.FP16, Precision.BF16) for arg in link.args):
            return True
    return False


def _casts_to_sixteen_bit(ctx: FileContext, call: cst.Call, stack: Stack) -> bool:
    """`x.half()`, `x.bfloat16()`, `x.to(torch.bfloat16)`, `x.to(device, dtype=torch.float16)`."""
    func = call.func
    if not isinstance(func, cst.Attribute):
        return False
    if func.attr.value in ("half", "bfloat16"):
        return True
    return func.attr.value == "to" and any(
        (arg.keyword is None or arg.keyword.value == "dtype")
        and precision_of(ctx, arg.value, stack) in (Precision.FP16, Precision.BF16) for arg in call.args)


def _sixteen_bit_casts(ctx: FileContext) -> bool:
    """`.half()`, `.bfloat16()`, `.to(torch.bfloat16)` of something other than a host copy."""
    for method in ("half", "bfloat16"):
        if any(not _host_copy(site) for site in ctx.method_calls(method)):
            return True
    for site in ctx.method_calls("to"):
        if _host_copy(site):
            continue
        if any(precision_of(ctx, arg.value, site.stack) in (Precision.FP16, Precision.BF16) for arg in site.node.args):
            return True
    return False


def _sixteen_bit_keyword(ctx: FileContext) -> bool:
    networks = step_networks(ctx)
    for site in ctx.calls:
        if _own_code(ctx, site.func):
            continue  # the file's own class or function: its code shows what `fp16=` does there
        loading = (site.func or "").endswith(".from_pretrained")
        if loading and networks and assigned_name(site) not in networks:
            continue  # a pipeline loaded in fp16 to generate class images, not a network the steps run
        for arg in site.node.args:
            if arg.keyword is None:
                continue
            if (arg.keyword.value in _PRECISION_KEYWORDS or loading and arg.keyword.value in _LOADING_KEYWORDS) \
                    and _sixteen_bit(ctx, arg, site):
                return True
    return False


def _own_code(ctx: FileContext, name: str | None, depth: int = 0) -> bool:
    """Is ``name`` a module-level function of the file, or a class of the file whose bases are all
    its own too, that keeps the keywords it is given (a subclass of Lightning's `Trainer`, or a
    `**kwargs` passed on, hands `precision=` to a framework)? Once per name and file."""
    if name is None or depth > 4:
        return False
    known = _OWN_CODE.setdefault(ctx, {})
    if name not in known:
        known[name] = _keeps_keywords(ctx, name, depth)
    return known[name]


_OWN_CODE: WeakKeyDictionary[FileContext, dict[str, bool]] = WeakKeyDictionary()


def _keeps_keywords(ctx: FileContext, name: str, depth: int) -> bool:
    functions = [info.node for info in ctx.functions.get(name, ()) if not info.stack]
    if functions:
        return not any(_passes_kwargs_on(ctx, function) for function in functions)
    info = ctx.classes.get(name)
    if info is None or not all(base == "object" or _own_code(ctx, base, depth + 1) for base in info.bases):
        return False
    return not any(_passes_kwargs_on(ctx, method.node) for method in ctx.functions.get("__init__", ())
                   if method.class_name == name)


def _passes_kwargs_on(ctx: FileContext, function: cst.CSTNode) -> bool:
    """Does ``function`` take `**kwargs` and pass them on to a call (`Trainer(**kwargs)`)?"""
    star = function.params.star_kwarg if isinstance(function, cst.FunctionDef) else None
    if not isinstance(star, cst.Param):
        return False
    return any(arg.star == "**" and isinstance(arg.value, cst.Name) and arg.value.value == star.name.value
               for site in ctx.calls if any(frame.node is function for frame in site.stack) for arg in site.node.args)


def _host_copy(site: CallSite) -> bool:
    """`t.detach().cpu().to(torch.bfloat16)`: a copy on the host (a checkpoint written in bf16),
    not the model or the batch put in 16-bit for training."""
    receiver = site.node.func.value  # type: ignore[attr-defined]
    return has_sync_before(receiver) or any(
        isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "detach"
        for node in _chain(receiver)
    )


def _chain(expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    """`a.b().c()[0].d()` -> every link, outermost first."""
    links = []
    while isinstance(expr, (cst.Call, cst.Attribute, cst.Subscript)):
        links.append(expr)
        expr = expr.func if isinstance(expr, cst.Call) else expr.value
    return links


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
        legacy = (ctx.call_qualname(site) or "").startswith(DEPRECATED_AMP_MODULES)
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
