"""PyTorch knowledge shared by several rules: which names are DataLoaders, autocast, dtypes,
which variables hold a batch from a DataLoader, which hold a model being trained."""

from __future__ import annotations

import re
from dataclasses import InitVar, dataclass, field
from functools import cached_property
from typing import Callable
from weakref import WeakKeyDictionary, ref

import libcst as cst

from speedfix.model.context import FileContext
from speedfix.model.flow import comes_before, default_choice, default_truth, off_by_default, passed_arguments, returned_values
from speedfix.model.frames import Stack
from speedfix.model.project_classes import project_class
from speedfix.model.index import Assignment, CallSite, LoopInfo
from speedfix.model.torch_api import TENSOR_DATASET
from speedfix.project.steps import (CUDNN_CHOICES, DATALOADER, DETERMINISM_HELPERS, DETERMINISTIC_ALGORITHMS,
                                    INSTANTIATE, NO_GRAD_CALLS, is_iterable_wrapper)
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import walk_expression

ITERABLE_DATASET = ("torch.utils.data.IterableDataset", "torch.utils.data.dataset.IterableDataset")
AUTOCAST = (
    "torch.autocast",
    "torch.amp.autocast",
    "torch.amp.autocast_mode.autocast",
    "torch.cuda.amp.autocast",
    "torch.cpu.amp.autocast",
)
OPTIMIZER_PREFIX = "torch.optim."
# transformers' own AdamW (deprecated, removed from recent releases): never fused.
TRANSFORMERS_ADAMW = ("transformers.AdamW", "transformers.optimization.AdamW")
# Optimizers of other libraries that update the parameters they are handed, as `torch.optim`'s do.
LIBRARY_OPTIMIZERS = (*TRANSFORMERS_ADAMW, "transformers.Adafactor", "transformers.optimization.Adafactor",
                      "bitsandbytes.optim.", "apex.optimizers.", "torch_optimizer.", "deepspeed.ops.adam.",
                      "deepspeed.ops.lamb.")
# hydra builds the object its config names (`_target_: torch.optim.AdamW`) from the arguments given.
NO_GRAD = tuple(sorted(NO_GRAD_CALLS))
NN_MODULE = ("torch.nn.Module", "torch.nn.modules.module.Module")
_DTYPES = {
    "float", "float32", "float64", "double", "float16", "half", "bfloat16", "int", "int8", "int16",
    "int32", "int64", "long", "short", "uint8", "bool", "complex64", "complex128", "cfloat",
    "float8_e4m3fn", "float8_e5m2",
}
_LOADER_NAME = re.compile(r"(loader|_dl$|^dl$|^dl_)", re.IGNORECASE)


def is_dtype(ctx: FileContext, node: cst.BaseExpression) -> bool:
    qualified = ctx.qualname(node)
    return bool(qualified and qualified.startswith("torch.") and qualified.split(".", 1)[1] in _DTYPES)


def is_cpu_device(ctx: FileContext, node: cst.BaseExpression, stack: Stack) -> bool:
    """A device expression that is certainly the CPU (``"cpu"``, ``torch.device("cpu")``)."""
    if isinstance(node, cst.SimpleString):
        return str(node.evaluated_value).startswith("cpu")
    if isinstance(node, cst.Call) and ctx.qualname(node.func) == "torch.device" and node.args:
        return is_cpu_device(ctx, node.args[0].value, stack)
    if isinstance(node, cst.Name):
        value = ctx.single_value(node.value, stack)
        return value is not None and is_cpu_device(ctx, value, stack)
    return False


def dataset_argument(site: CallSite) -> cst.BaseExpression | None:
    for arg in site.node.args:
        if arg.keyword is not None and arg.keyword.value == "dataset":
            return arg.value
    first = site.node.args[0] if site.node.args else None
    return first.value if first is not None and first.keyword is None and first.star == "" else None


def constructor_call(ctx: FileContext, expr: cst.BaseExpression | None, stack: Stack) -> cst.Call | None:
    """The call that built ``expr`` (the expression itself, or a variable's single value)."""
    if isinstance(expr, cst.Call):
        return expr
    name = dotted_name(expr) if expr is not None else None
    value = ctx.single_value(name, stack) if name else None
    return value if isinstance(value, cst.Call) else None


def is_in_memory_dataset(ctx: FileContext, dataset: cst.BaseExpression | None, stack: Stack, depth: int = 0) -> bool:
    """A `TensorDataset`, a plain sequence (`range(n)`, a list: index loaders), or a local
    Dataset class whose `__getitem__` only indexes tensors it holds (`return self.x[i],
    self.y[i]`): worker processes cannot make any of these faster. Followed through the file's
    functions: what a module-level function returns (`return TensorDataset(feats, labels)`), and
    a parameter every call of its function passes such a dataset to."""
    if isinstance(dataset, (cst.List, cst.Tuple)):
        return True
    if depth > 4:
        return False
    call = constructor_call(ctx, dataset, stack)
    if call is None:
        name = dotted_name(dataset) if isinstance(dataset, cst.Name) else None
        passed = passed_arguments(ctx, name, stack) if name else None
        return bool(passed) and all(is_in_memory_dataset(ctx, value, at, depth + 1) for value, at in passed or ())
    if ctx.qualname(call.func) in TENSOR_DATASET:
        return True
    returned = returned_values(ctx, dotted_name(call.func)) if isinstance(call.func, cst.Name) else None
    if returned:
        return all(is_in_memory_dataset(ctx, value, at, depth + 1) for value, at in returned)
    if isinstance(call.func, cst.Name) and call.func.value in ("range", "list", "tuple") and not ctx.qualname(call.func):
        return True
    info = ctx.classes.get(dotted_name(call.func) or "")
    if info is None:
        return False
    for function in ctx.functions.get("__getitem__", ()):
        if function.class_name == info.name:
            return _only_indexes_attributes(function.node)
    return False


def _only_indexes_attributes(function: cst.FunctionDef) -> bool:
    """`return self.x[i], self.y[i]`, or the same through names bound first (`point = self.data[i]`,
    `label = self.label[i]`, `return point, label`), a docstring aside."""
    params = function.params.params
    if len(params) != 2 or not isinstance(function.body, cst.IndentedBlock):
        return False
    index = params[1].name.value

    def indexes_self(part: cst.BaseExpression | None) -> bool:
        return (
            isinstance(part, cst.Subscript)
            and (dotted_name(part.value) or "").startswith("self.")
            and len(part.slice) == 1
            and isinstance(part.slice[0].slice, cst.Index)
            and dotted_name(part.slice[0].slice.value) == index
        )

    bound: set[str] = set()
    lines = list(function.body.body)
    for number, line in enumerate(lines):
        if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
            return False
        statement = line.body[0]
        if number == 0 and isinstance(statement, cst.Expr) and isinstance(statement.value, cst.SimpleString):
            continue  # the docstring
        if isinstance(statement, cst.Return):
            value = statement.value
            parts = [element.value for element in value.elements] if isinstance(value, cst.Tuple) else [value]
            return number == len(lines) - 1 and bool(parts) and all(
                indexes_self(part) or isinstance(part, cst.Name) and part.value in bound for part in parts)
        if not (isinstance(statement, cst.Assign) and len(statement.targets) == 1
                and isinstance(statement.targets[0].target, cst.Name) and indexes_self(statement.value)):
            return False
        bound.add(statement.targets[0].target.value)
    return False


# What a `__getitem__` may call and still only reshape arrays it holds: numpy's and torch's array
# functions (not their file readers), random draws, and the arrays' own methods.
_ARRAY_MODULES = ("numpy.", "torch.", "random.")
_READERS = frozenset({"load", "loadtxt", "genfromtxt", "fromfile", "memmap", "open", "read_file", "read_image", "decode_image"})
_BUILTINS = frozenset({"len", "int", "float", "min", "max", "range", "abs", "round", "list", "tuple", "slice", "zip"})
_ARRAY_METHODS = frozenset({"astype", "copy", "reshape", "transpose", "squeeze", "unsqueeze", "long", "float", "int",
                            "flatten", "view", "clone", "permute", "contiguous", "T", "item", "tolist", "numpy",
                            "randint", "random", "rand", "randn", "uniform", "choice", "shuffle", "append"})


# A function named for evaluation, not training: `eval`, `validate`, `test_epoch`, diffusers'
# `log_validation`
EVALUATION_FUNCTION = re.compile(r"^_?(?:log_)?(?:eval|evaluate|evaluation|valid|validate|validation|test|predict)(?:_|$)")


def held_items_class(ctx: FileContext, dataset: cst.BaseExpression | None, stack: Stack) -> str | None:
    """The Dataset class of the file (or of another file of the project), when its `__getitem__`
    only picks, crops, pads and reshapes arrays it already holds (autovc's mel-spectrograms
    loaded in `__init__`, cropped at random in `__getitem__`): no file read, no decoding, no
    transform or tokenizer, only array and random functions of numpy/torch, a few builtins and
    the arrays' own methods. None otherwise."""
    call = constructor_call(ctx, dataset, stack)
    info = ctx.classes.get(dotted_name(call.func) or "") if call is not None else None
    if info is None:
        return _held_items_elsewhere(ctx, call)
    getters = [function.node for function in ctx.functions.get("__getitem__", ()) if function.class_name == info.name]
    if len(getters) != 1:
        return None
    for node in walk_expression(getters[0].body):
        if isinstance(node, cst.Call) and not _array_call(ctx, node):
            return None
    return info.name


def _held_items_elsewhere(ctx: FileContext, call: cst.Call | None) -> str | None:
    """The same for a Dataset class another file of the project defines (Crossformer's
    `Dataset_MTS`, whose `__getitem__` slices the arrays it loaded in `__init__`)."""
    qualified = ctx.qualname(call.func) if call is not None else None
    if ctx.project is None or qualified is None or "." not in qualified:
        return None
    defined = project_class(ctx.project, qualified)
    if defined is None or not defined.has_items or not all(map(_array_name, defined.item_calls_qualified)):
        return None
    return qualified.rsplit(".", 1)[-1]


def _array_name(name: str) -> bool:
    """``_array_call`` for a call written `numpy.random.randint` (qualified), `len`, `x.astype`."""
    if name.startswith(_ARRAY_MODULES):
        return name.rsplit(".", 1)[-1] not in _READERS
    return name in _BUILTINS if "." not in name else name.rsplit(".", 1)[-1] in _ARRAY_METHODS


def _array_call(ctx: FileContext, call: cst.Call) -> bool:
    qualified = ctx.qualname(call.func)
    if qualified is not None:
        return qualified.startswith(_ARRAY_MODULES) and qualified.rsplit(".", 1)[-1] not in _READERS
    if isinstance(call.func, cst.Name):
        return call.func.value in _BUILTINS and call.func.value not in ctx.functions
    return isinstance(call.func, cst.Attribute) and call.func.attr.value in _ARRAY_METHODS


def is_iterable_dataset(ctx: FileContext, dataset: cst.BaseExpression | None, stack: Stack) -> bool:
    call = constructor_call(ctx, dataset, stack)
    if call is None:
        return False
    qualified = ctx.qualname(call.func)
    if qualified in ITERABLE_DATASET:
        return True
    name = dotted_name(call.func)
    return name is not None and ctx.is_subclass_of(name, *ITERABLE_DATASET)


def worker_start_refusal(ctx: FileContext, stack: Stack) -> str | None:
    """Why DataLoader workers must not be added to code at ``stack`` (None: they may).

    With the spawn/forkserver start method (Windows, macOS, Linux on Python 3.14+) every worker
    re-imports the script: a notebook's classes cannot be unpickled, and a script without an
    `if __name__ == "__main__":` guard would run again in each worker."""
    if ctx.path.endswith(".ipynb"):
        return (
            "in a notebook, worker processes started with spawn/forkserver (macOS, Windows, "
            "Python 3.14+) cannot unpickle datasets defined in the notebook"
        )
    if not ctx.has_main_guard or (ctx.at_module_level(stack) and not ctx.in_main_guard(stack)):
        return (
            'no `if __name__ == "__main__":` guard: with the spawn/forkserver start method every '
            "worker would re-run the script"
        )
    return None


def is_dataloader(ctx: FileContext, expr: cst.BaseExpression, stack: Stack, _depth: int = 0) -> bool:
    """A DataLoader: built by one here, or a variable/parameter named like one (`train_loader`);
    through wrappers kept in a variable (`pbar = tqdm(loader)`), also one bound more than once,
    each time to a loader (`steps = list(enumerate(train_loader))` in two notebook cells); one of a
    dict of loaders (`dataloaders[phase]`, the transfer-learning tutorial's train/val loop)."""
    if isinstance(expr, cst.Subscript):
        return _depth < 3 and _dict_of_loaders(ctx, expr.value, stack, _depth + 1)
    call = constructor_call(ctx, expr, stack)
    if call is None and isinstance(expr, cst.Name) and _depth < 3:
        entered = with_bound(expr.value, stack)  # `with tqdm(enumerate(loader)) as t: for ... in t:`
        if entered is not None:
            return is_dataloader(ctx, entered, stack, _depth + 1)
        found = ctx.assignments_in_scope(expr.value, stack)
        if len(found) > 1 and all(isinstance(a.value, cst.Call) and not a.unpacked and not a.augmented
                                  and is_dataloader(ctx, a.value, stack, _depth + 1) for a in found):
            return True
    if call is not None:
        if ctx.qualname(call.func) in DATALOADER:
            return True
        inner = unwrap_iterable(call)
        if inner is call:  # a factory named like one: `get_loader(...)`, `build_dataloader(...)`
            func = dotted_name(call.func)
            return func is not None and bool(_LOADER_NAME.search(func.rsplit(".", 1)[-1]))
        return _depth < 3 and is_dataloader(ctx, inner, stack, _depth + 1)
    name = dotted_name(expr)
    return name is not None and bool(_LOADER_NAME.search(name.rsplit(".", 1)[-1]))


def with_bound(name: str, stack: Stack) -> cst.BaseExpression | None:
    """The expression a `with EXPR as name:` around ``stack`` entered, when it is an iterable
    wrapper (`with tqdm(loader) as bar:`): a progress bar's `__enter__` returns the bar itself,
    which yields what it wraps. Other context managers (`open`, `autocast`) are left alone."""
    for frame in reversed(stack):
        if not isinstance(frame.node, cst.With):
            continue
        for item in frame.node.items:
            target = item.asname.name if item.asname is not None else None
            if isinstance(target, cst.Name) and target.value == name:
                value = item.item
                wrapper = isinstance(value, cst.Call) and bool(value.args) and is_iterable_wrapper(dotted_name(value.func))
                return value if wrapper else None
    return None


def draws_next(expr: cst.BaseExpression) -> bool:
    """`next(batches)`, `next(iter(loader))`, `next(self.data_iter)`: the next item of a named iterable."""
    return (isinstance(expr, cst.Call) and dotted_name(expr.func) == "next" and bool(expr.args)
            and dotted_name(unwrap_iterable(expr.args[0].value)) is not None)


def _dict_of_loaders(ctx: FileContext, expr: cst.BaseExpression, stack: Stack, depth: int) -> bool:
    """A dict whose every value is a DataLoader: `{x: DataLoader(sets[x]) for x in ("train", "val")}`
    or `{"train": DataLoader(...), "val": DataLoader(...)}`, written here or kept in a variable."""
    name = dotted_name(expr)
    value = ctx.single_value(name, stack) if name else expr
    if isinstance(value, cst.DictComp):
        return is_dataloader(ctx, value.value, stack, depth)
    if isinstance(value, cst.Dict) and value.elements:
        return all(isinstance(element, cst.DictElement) and is_dataloader(ctx, element.value, stack, depth)
                   for element in value.elements)
    return False


# Tensor methods that reshape, broadcast or convert a tensor where it is, before a copy: `x.view(-1,
# 784).to(device)` still copies the batch, `torch.linspace(...).unsqueeze(1).expand(b, n).cuda()` the
# tensor made on the CPU. The `_as` forms take only the other tensor's shape (`type_as` takes its
# device too: a copy itself, not listed).
_LAYOUT_METHODS = frozenset({"view", "reshape", "flatten", "squeeze", "unsqueeze", "permute", "transpose", "expand",
                             "repeat", "contiguous", "float", "long", "int", "half", "double", "bool", "expand_as",
                             "view_as", "reshape_as"})


def without_layout_calls(expr: cst.BaseExpression) -> cst.BaseExpression:
    """`x.reshape(-1, 784).float()` -> `x`."""
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in _LAYOUT_METHODS:
        expr = expr.func.value
    return expr


def unwrap_iterable(expr: cst.BaseExpression) -> cst.BaseExpression:
    """``enumerate(tqdm(loader))``, ``metric_logger.log_every(loader, 10)`` -> ``loader``."""
    while isinstance(expr, cst.Call) and is_iterable_wrapper(dotted_name(expr.func)) and expr.args:
        expr = expr.args[0].value
    return expr


def is_step_loop_source(ctx: FileContext, info: LoopInfo) -> bool:
    """The iterable of a training loop that comes from outside the function: a parameter
    (`def train(model, data, opt): for x, y in data:`) or an attribute (`self.train_data`).
    What drives a training loop is its batches, whatever the loader is called."""
    if info.node not in ctx.step_loops or info.iter is None:
        return False
    name = dotted_name(unwrap_iterable(info.iter))
    function = ctx.function_of(info.stack)
    return name is not None and _from_outside(ctx, function, name, 0)


def _from_outside(ctx: FileContext, function: cst.CSTNode | None, name: str, depth: int) -> bool:
    """Is ``name`` a loader handed in: an attribute (`self.train_data`), a parameter (keyword-only
    too), or a local name only ever bound to one of those or to a slice of itself (`tl =
    train_loader`, then `tl = islice(tl, epoch_size)` for a shorter epoch)?"""
    if name.startswith("self.") and name.count(".") == 1:
        return True
    if not isinstance(function, cst.FunctionDef) or depth > 2:
        return False
    assignments = ctx.assignments_in(function, name)
    if not assignments:
        params = function.params
        return name in {param.name.value for param in (*params.params, *params.kwonly_params)}
    for assignment in assignments:
        value = unwrap_iterable(assignment.value)
        if isinstance(value, cst.Call) and ctx.qualname(value.func) == "itertools.islice" and value.args:
            value = value.args[0].value
        source = dotted_name(value)
        if assignment.unpacked or assignment.augmented or source is None:
            return False
        if source != name and not _from_outside(ctx, function, source, depth + 1):
            return False
    return True


_CUDNN_SWITCHES = CUDNN_CHOICES


def cudnn_settings(ctx: FileContext) -> bool:
    """Does the script choose cuDNN's behaviour itself (autotuning, determinism, cuDNN off)?"""
    return bool(cudnn_choices(ctx))


def cudnn_choices(ctx: FileContext) -> list[tuple[cst.SimpleStatementLine | None, Stack]]:
    """(statement, stack) of each place that chooses cuDNN's behaviour, also a call of a function
    of another scanned file that does (`initialize(args, seed=42)` setting `cudnn.benchmark`)."""
    found = [(site.statement, site.stack) for site in ctx.calls_to(*DETERMINISTIC_ALGORITHMS, *DETERMINISM_HELPERS)]
    found += [(site.statement, site.stack) for site in ctx.calls
              if (callee := ctx.project_callee(site)) is not None and callee.cudnn]
    return found + _assigned(ctx, lambda name: name.endswith(_CUDNN_SWITCHES))


def cudnn_disabled(ctx: FileContext) -> Assignment | None:
    """`torch.backends.cudnn.enabled = False` on the default path, also through an option that is
    off by default (`= args.enable_cudnn` with a `store_true` flag): convolutions, recurrent layers
    and batch norm then run PyTorch's own, slower kernels."""
    for name, assignments in ctx.assignments.items():
        if not name.endswith("cudnn.enabled"):
            continue
        for assignment in assignments:
            if assignment.augmented or assignment.unpacked or off_by_default(ctx, assignment.statement, assignment.stack):
                continue
            if default_truth(ctx, assignment.value, assignment.stack) is False:
                return assignment
    return None


_TF32_SWITCHES = ("allow_tf32", "fp32_precision")


def matmul_precision_chosen(ctx: FileContext) -> bool:
    """Does the script's default run choose the fp32 matmul precision itself
    (`set_float32_matmul_precision`, any `allow_tf32`/`fp32_precision` setting, "highest"
    included)? A choice behind an option that is off by default (`if args.allow_tf32:` with a
    `store_true` flag) does not count."""
    return default_choice(ctx, matmul_precision_choices(ctx))[0]


def matmul_precision_choices(ctx: FileContext) -> list[tuple[cst.SimpleStatementLine | None, Stack]]:
    """(statement, stack) of each place that chooses the fp32 matmul precision."""
    found = [(site.statement, site.stack) for site in ctx.calls_to("torch.set_float32_matmul_precision")]
    found += _assigned(ctx, lambda name: name.rsplit(".", 1)[-1] in _TF32_SWITCHES)
    return found + [
        (site.statement, site.stack) for site in ctx.calls if "fp32_precision" in (dotted_name(site.node.func) or "")
    ]


def tf32_switched_off(ctx: FileContext) -> Assignment | None:
    """`torch.backends.cuda.matmul.allow_tf32 = False` on the default path, when no other choice
    of the fp32 matmul precision runs by default (NVlabs' EDM and StyleGAN switch TF32 off for
    numerical accuracy): the assignment, else None."""
    off: Assignment | None = None
    for name, found in ctx.assignments.items():
        if name.rsplit(".", 1)[-1] not in _TF32_SWITCHES or "cudnn" in name:
            continue  # (cuDNN's switch is for convolutions)
        for assignment in found:
            if off_by_default(ctx, assignment.statement, assignment.stack) is not None:
                continue
            if not name.endswith("matmul.allow_tf32") or not (isinstance(assignment.value, cst.Name)
                                                              and assignment.value.value == "False"):
                return None  # another default-run choice (TF32 on, a precision string)
            off = off or assignment
    precision_calls = [site for site in ctx.calls_to("torch.set_float32_matmul_precision")
                       if off_by_default(ctx, site.statement, site.stack) is None]
    return None if precision_calls else off


def _assigned(ctx: FileContext, wanted: Callable[[str], bool]) -> list[tuple[cst.SimpleStatementLine | None, Stack]]:
    return [(a.statement, a.stack) for name, found in ctx.assignments.items() if wanted(name) for a in found]


@dataclass
class BatchNames:
    """Variables holding (parts of) a batch straight from a DataLoader, per function. It holds
    its file's context weakly: a per-file cache (``tensors``) keeps it by that context."""

    context: InitVar[FileContext]
    values: set[str] = field(default_factory=set)  # the values of dict batches (tensors), by name

    def __post_init__(self, context: FileContext) -> None:
        self._context = ref(context)

    @property
    def ctx(self) -> FileContext:
        context = self._context()
        assert context is not None, "used after its file's analysis"
        return context

    @cached_property
    def by_function(self) -> dict[cst.CSTNode | None, set[str]]:
        result: dict[cst.CSTNode | None, set[str]] = {}
        for info in self.ctx.loops.values():
            if not isinstance(info.node, cst.For) or info.iter is None:
                continue
            if not is_dataloader(self.ctx, unwrap_iterable(info.iter), info.stack) and not is_step_loop_source(self.ctx, info):
                continue
            if _device_placed(self.ctx, unwrap_iterable(info.iter)):
                continue  # its batches arrive on the GPU already
            names = result.setdefault(self.ctx.function_of(info.stack), set())
            names.update(n for n in info.targets if not _is_index_name(info, n))
        self._add_next_batches(result)
        self._add_callee_parameters(result)
        for function, names in result.items():
            self._add_derived(function, names)
            self._add_values(function, names)
        return result

    @cached_property
    def _loops_over(self) -> dict[int, list[cst.CSTNode]]:
        """The loops over each iterated expression (by id), found once."""
        found: dict[int, list[cst.CSTNode]] = {}
        for info in self.ctx.loops.values():
            found.setdefault(id(info.iter), []).append(info.node)
        return found

    def _add_values(self, function: cst.CSTNode | None, names: set[str]) -> None:
        """`{k: v.to(device) for k, v in batch.items()}` and `for k, v in batch.items():
        batch[k] = v.to(device)`: the values of a dict batch, copied key by key; the elements of a
        list batch copied one by one (`[t.to(device) for t in batch]`)."""
        for method in ("items", "values"):
            for site in self.ctx.method_calls(method):
                receiver = site.node.func.value  # type: ignore[attr-defined]
                if site.node.args or self.ctx.function_of(site.stack) is not function or root_name(receiver) not in names:
                    continue
                holders: list[cst.CSTNode] = list(self._loops_over.get(id(site.node), ()))
                if site.statement is not None:
                    holders.extend(n for n in walk_expression(site.statement) if isinstance(n, cst.CompFor) and n.iter is site.node)
                for holder in holders:
                    target = holder.target  # type: ignore[attr-defined]
                    if method == "items" and isinstance(target, cst.Tuple) and len(target.elements) == 2:
                        target = target.elements[1].value
                    if isinstance(target, cst.Name):
                        names.add(target.value)
                        self.values.add(target.value)
        # `[t.to(device) for t in batch]` (minGPT): each element of a tuple/list batch is a tensor
        for assignments in self.ctx.assignments_by_function.get(function, {}).values():
            for assignment in assignments:
                for node in walk_expression(assignment.value):
                    if type(node) is cst.CompFor and isinstance(node.iter, cst.Name) and node.iter.value in names \
                            and isinstance(node.target, cst.Name):
                        names.add(node.target.value)
                        self.values.add(node.target.value)

    def _add_next_batches(self, result: dict[cst.CSTNode | None, set[str]]) -> None:
        """`x, y = next(batches)` or `next(iter(loader))` in a training loop: a batch, unless a
        framework moves the loader's batches to the device (audiolm's `wave, = next(self.dl_iter)`
        with `self.dl_iter = cycle(self.dl)` of an `accelerator.prepare`d loader)."""
        for target, assignments in self.ctx.assignments.items():
            for assignment in assignments:
                value = assignment.value
                if draws_next(value) and self.ctx.in_training_loop(assignment.stack) \
                        and not _device_placed(self.ctx, unwrap_iterable(value.args[0].value)):  # type: ignore[attr-defined]
                    result.setdefault(self.ctx.function_of(assignment.stack), set()).add(target)

    def _add_callee_parameters(self, result: dict[cst.CSTNode | None, set[str]]) -> None:
        """`for batch in loader: train_step(model, batch)` makes `batch` a batch in train_step; so
        does a method of the object (`self.process_batch(x, y)`: its parameters after `self`)."""
        for site in self.ctx.calls:
            if not isinstance(site.node.func, (cst.Name, cst.Attribute)):
                continue
            caller = result.get(self.ctx.function_of(site.stack))
            if not caller:
                continue
            for info in self.ctx.local_callees(site):
                params = [p.name.value for p in info.node.params.params]
                if isinstance(site.node.func, cst.Attribute) and params and not _is_static(info.node):
                    params = params[1:]  # bound: `self` is not among the call's arguments
                for index, arg in enumerate(site.node.args):
                    if arg.keyword is None and arg.star == "" and index < len(params):
                        if dotted_name(arg.value) in caller:
                            result.setdefault(info.node, set()).add(params[index])
                    elif arg.keyword is not None and dotted_name(arg.value) in caller:
                        result.setdefault(info.node, set()).add(arg.keyword.value)

    def _add_derived(self, function: cst.CSTNode | None, names: set[str]) -> None:
        """`x, y = batch`, `inputs = batch["input_ids"]`, `x = batch[0]` derive batch parts."""
        for _ in range(3):
            added = False
            for target, assignments in self.ctx.assignments_by_function.get(function, {}).items():
                if target in names:
                    continue
                for assignment in assignments:
                    if assignment.augmented:
                        continue
                    value = assignment.part or assignment.value  # `x, y = batch["x"], batch["y"]`
                    if root_name(value) in names and _is_projection(value):
                        names.add(target)
                        added = True
                        break
            if not added:
                return

    def names_at(self, stack: Stack) -> set[str]:
        return self.by_function.get(self.ctx.function_of(stack), set())

    def is_batch(self, expr: cst.BaseExpression, stack: Stack) -> bool:
        """``expr`` is a batch variable, an item/attribute of one (``batch["x"]``), or a batch drawn
        where it is used in a training loop (``next(batches).to(device)``)."""
        if draws_next(expr):  # not from a loader whose batches a framework moves (`next(self.dl)`, Accelerate's)
            return self.ctx.in_training_loop(stack) and not _device_placed(self.ctx, unwrap_iterable(expr.args[0].value))  # type: ignore[attr-defined]
        return _is_projection(expr) and root_name(expr) in self.names_at(stack)

    def moved_before(self, expr: cst.BaseExpression, stack: Stack, statement: cst.BaseStatement | None) -> bool:
        """Was the batch part ``expr`` copied to a device by an assignment of its name above
        ``statement`` in this function, inside the same loop (`x = x.cuda()`, then `net(x.cuda())`:
        a no-op)?"""
        name = root_name(expr)
        if statement is None or name is None:
            return False
        loop = self.ctx.nearest_loop(stack)
        return any(a.statement is not None and a.statement is not statement and _moves_to_device(a.part or a.value)
                   and (loop is None or any(frame.node is loop for frame in a.stack))
                   and comes_before(self.ctx, a.statement, statement)
                   for a in self.ctx.assignments_in(self.ctx.function_of(stack), name))

    def is_host_batch(self, expr: cst.BaseExpression, stack: Stack) -> bool:
        """A batch part that was never moved to a device in this function (still on the CPU)."""
        if not self.is_batch(expr, stack):
            return False
        name = root_name(expr)
        function = self.ctx.function_of(stack)
        for assignment in self.ctx.assignments_in(function, name or ""):
            if _moves_to_device(assignment.part or assignment.value):
                return False
        return True


def narrow_to_class(ctx: FileContext) -> str | None:
    """A class of this file, or of a project module it imports, whose `.to()` takes a device
    and no `non_blocking` (DETR's `NestedTensor.to(self, device)`): a collate function may put
    one in a batch, and `x.to(device, non_blocking=True)` raises a `TypeError` on it."""
    for info in ctx.functions.get("to", ()):
        params = info.node.params
        names = {param.name.value for param in (*params.posonly_params, *params.params, *params.kwonly_params)}
        if info.class_name and not isinstance(params.star_kwarg, cst.Param) and "non_blocking" not in names:
            return info.class_name
    for _, facts in sorted(ctx.links.modules.items()):
        for name, function in sorted(facts.functions.items()):
            owner, _, method = name.rpartition(".")
            # `def to(self, device)`; `def to(self, *args, **kwargs)` has `self` alone
            if method == "to" and owner and len(function.params) == 2 and function.params[1] != "non_blocking":
                return owner
    return None


# Framework calls that return a loader whose batches they move to the device themselves.
_DEVICE_PLACING = frozenset({"prepare", "setup_dataloaders", "prepare_data_loader"})


def _device_placed(ctx: FileContext, iterable: cst.BaseExpression) -> bool:
    return device_placing_call(ctx, iterable) is not None


def device_placing_call(ctx: FileContext, iterable: cst.BaseExpression, depth: int = 0) -> cst.Call | None:
    """The call that made the loader one whose batches a framework moves to the device itself:
    `model, opt, loader = accelerator.prepare(model, opt, loader)`, `fabric.setup_dataloaders(...)`,
    also for what is made of such a loader (`accelerator.skip_first_batches(loader, n) if ... else loader`)."""
    if depth > 6:
        return None
    if isinstance(iterable, cst.IfExp):
        body = device_placing_call(ctx, iterable.body, depth + 1)
        return body if body is not None and device_placing_call(ctx, iterable.orelse, depth + 1) is not None else None
    if isinstance(iterable, cst.Call) and iterable.args and _repeats_its_argument(ctx, iterable.func):
        return device_placing_call(ctx, iterable.args[0].value, depth + 1)  # `cycle(accelerator.prepare(dl))`
    if isinstance(iterable, cst.Call) and isinstance(iterable.func, cst.Attribute):
        if iterable.func.attr.value in _DEVICE_PLACING:
            return iterable
        if iterable.func.attr.value == "skip_first_batches" and iterable.args:
            return device_placing_call(ctx, iterable.args[0].value, depth + 1)
        return None
    name = dotted_name(iterable)
    if name is None:
        return None
    if depth == 0:  # a loop over a name: the same answer for every loop over it, found once per file
        placed = _PLACED.setdefault(ctx, {})
        if name not in placed:
            placed[name] = _assigned_placing_call(ctx, name, iterable, 1)
        return placed[name]
    return _assigned_placing_call(ctx, name, iterable, depth + 1)


def _repeats_its_argument(ctx: FileContext, func: cst.BaseExpression) -> bool:
    """`itertools.cycle`, `enumerate`, `tqdm`, or a generator function of the file (`def
    cycle(dl): while True: for data in dl: yield data`): its items are its first argument's."""
    name = dotted_name(func)
    if is_iterable_wrapper(ctx.qualname(func) or name) or ctx.qualname(func) == "itertools.cycle":
        return True
    infos = [info for info in ctx.functions.get(name or "", ()) if not info.stack]
    return len(infos) == 1 and any(isinstance(node, cst.Yield) for node in walk_expression(infos[0].node.body))


def _assigned_placing_call(ctx: FileContext, name: str, iterable: cst.BaseExpression, depth: int) -> cst.Call | None:
    for assignment in ctx.assignments.get(name, ()):
        found = device_placing_call(ctx, assignment.value, depth) if assignment.value is not iterable else None
        if found is not None:
            return found
    return None


_PLACED: WeakKeyDictionary[FileContext, dict[str, cst.Call | None]] = WeakKeyDictionary()


def _is_static(function: cst.FunctionDef) -> bool:
    return any(dotted_name(decorator.decorator) == "staticmethod" for decorator in function.decorators)


def _is_index_name(info, name: str) -> bool:
    """`for i, batch in enumerate(loader)`: `i` is a counter, not a batch."""
    return (
        isinstance(info.iter, cst.Call)
        and dotted_name(info.iter.func) == "enumerate"
        and isinstance(info.node.target, cst.Tuple)
        and dotted_name(info.node.target.elements[0].value) == name
    )


def root_name(expr: cst.BaseExpression) -> str | None:
    while isinstance(expr, (cst.Subscript, cst.Attribute)):
        expr = expr.value
    return expr.value if isinstance(expr, cst.Name) else None


def _is_projection(expr: cst.BaseExpression) -> bool:
    """A name, or subscripts/attributes of one (no calls): the data itself, not derived math."""
    while isinstance(expr, (cst.Subscript, cst.Attribute)):
        expr = expr.value
    return isinstance(expr, cst.Name)


def _moves_to_device(value: cst.BaseExpression) -> bool:
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
        if value.func.attr.value in ("to", "cuda"):
            return True
        return _moves_to_device(value.func.value)
    return False
