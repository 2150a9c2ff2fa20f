"""PyTorch knowledge shared by several rules: which names are DataLoaders, autocast, dtypes,
which variables hold a batch from a DataLoader, which hold a model being trained."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

import libcst as cst

from speedfix.context import CallSite, FileContext, Stack
from speedfix.names import dotted_name

DATALOADER = ("torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader")
TENSOR_DATASET = ("torch.utils.data.TensorDataset", "torch.utils.data.dataset.TensorDataset")
ITERABLE_DATASET = ("torch.utils.data.IterableDataset", "torch.utils.data.dataset.IterableDataset")
AUTOCAST = (
    "torch.autocast",
    "torch.amp.autocast",
    "torch.amp.autocast_mode.autocast",
    "torch.cuda.amp.autocast",
    "torch.cpu.amp.autocast",
)
OPTIMIZER_PREFIX = "torch.optim."
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


def is_in_memory_dataset(ctx: FileContext, dataset: cst.BaseExpression | None, stack: Stack) -> bool:
    """A `TensorDataset`, a plain sequence (`range(n)`, a list: index loaders), or a local
    Dataset class whose `__getitem__` only indexes tensors it holds (`return self.x[i],
    self.y[i]`): worker processes cannot make any of these faster."""
    if isinstance(dataset, (cst.List, cst.Tuple)):
        return True
    call = constructor_call(ctx, dataset, stack)
    if call is None:
        return False
    if ctx.qualname(call.func) in TENSOR_DATASET:
        return True
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
    params = function.params.params
    if len(params) != 2 or not isinstance(function.body, cst.IndentedBlock) or len(function.body.body) != 1:
        return False
    index = params[1].name.value
    line = function.body.body[0]
    if not (isinstance(line, cst.SimpleStatementLine) and isinstance(line.body[0], cst.Return)):
        return False
    value = line.body[0].value
    parts = [element.value for element in value.elements] if isinstance(value, cst.Tuple) else [value]

    def indexes_self(part: cst.BaseExpression | None) -> bool:
        return (
            isinstance(part, cst.Subscript)
            and (dotted_name(part.value) or "").startswith("self.")
            and len(part.slice) == 1
            and isinstance(part.slice[0].slice, cst.Index)
            and dotted_name(part.slice[0].slice.value) == index
        )

    return bool(parts) and all(indexes_self(part) for part in parts)


def is_iterable_dataset(ctx: FileContext, dataset: cst.BaseExpression | None, stack: Stack) -> bool:
    call = constructor_call(ctx, dataset, stack)
    if call is None:
        return False
    qualified = ctx.qualname(call.func)
    if qualified in ITERABLE_DATASET:
        return True
    name = dotted_name(call.func)
    return name is not None and ctx.is_subclass_of(name, *ITERABLE_DATASET)


def is_dataloader(ctx: FileContext, expr: cst.BaseExpression, stack: Stack) -> bool:
    """A DataLoader: built by one here, or a variable/parameter named like one (`train_loader`)."""
    call = constructor_call(ctx, expr, stack)
    if call is not None:
        return ctx.qualname(call.func) in DATALOADER
    name = dotted_name(expr)
    return name is not None and bool(_LOADER_NAME.search(name.rsplit(".", 1)[-1]))


def unwrap_iterable(expr: cst.BaseExpression) -> cst.BaseExpression:
    """``enumerate(tqdm(loader))`` -> ``loader``."""
    while isinstance(expr, cst.Call) and dotted_name(expr.func) in (
        "enumerate", "tqdm", "tqdm.tqdm", "tqdm.auto.tqdm", "iter",
    ) and expr.args:
        expr = expr.args[0].value
    return expr


_CUDNN_SWITCHES = ("cudnn.benchmark", "cudnn.deterministic", "cudnn.enabled")
DETERMINISTIC_ALGORITHMS = ("torch.use_deterministic_algorithms",)


def cudnn_settings(ctx: FileContext) -> bool:
    """Does the script choose cuDNN's behaviour itself (autotuning, determinism, cuDNN off)?"""
    return bool(ctx.calls_to(*DETERMINISTIC_ALGORITHMS)) or any(
        name.endswith(_CUDNN_SWITCHES) for name in ctx.assignments
    )


def uses_autocast(ctx: FileContext) -> bool:
    return bool(ctx.calls_to(*AUTOCAST)) or any(
        ctx.qualname(item) in AUTOCAST for info in ctx.withs for item in info.items
    )


@dataclass
class BatchNames:
    """Variables holding (parts of) a batch straight from a DataLoader, per function."""

    ctx: FileContext

    @cached_property
    def by_function(self) -> dict[cst.CSTNode | None, set[str]]:
        result: dict[cst.CSTNode | None, set[str]] = {}
        for info in self.ctx.loops.values():
            if not isinstance(info.node, cst.For) or info.iter is None:
                continue
            if not is_dataloader(self.ctx, unwrap_iterable(info.iter), info.stack):
                continue
            names = result.setdefault(self.ctx.function_of(info.stack), set())
            names.update(n for n in info.targets if not _is_index_name(info, n))
        self._add_callee_parameters(result)
        for function, names in result.items():
            self._add_derived(function, names)
        return result

    def _add_callee_parameters(self, result: dict[cst.CSTNode | None, set[str]]) -> None:
        """`for batch in loader: train_step(model, batch)` makes `batch` a batch in train_step."""
        for site in self.ctx.calls:
            if not isinstance(site.node.func, cst.Name) or site.node.func.value not in self.ctx.functions:
                continue
            caller = result.get(self.ctx.function_of(site.stack))
            if not caller:
                continue
            for info in self.ctx.functions[site.node.func.value]:
                params = [p.name.value for p in info.node.params.params]
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
                    if root_name(assignment.value) in names and _is_projection(assignment.value):
                        names.add(target)
                        added = True
                        break
            if not added:
                return

    def names_at(self, stack: Stack) -> set[str]:
        return self.by_function.get(self.ctx.function_of(stack), set())

    def is_batch(self, expr: cst.BaseExpression, stack: Stack) -> bool:
        """``expr`` is a batch variable, or an item/attribute of one (``batch["x"]``)."""
        return _is_projection(expr) and root_name(expr) in self.names_at(stack)

    def is_host_batch(self, expr: cst.BaseExpression, stack: Stack) -> bool:
        """A batch part that was never moved to a device in this function (still on the CPU)."""
        if not self.is_batch(expr, stack):
            return False
        name = root_name(expr)
        function = self.ctx.function_of(stack)
        for assignment in self.ctx.assignments_in(function, name or ""):
            if _moves_to_device(assignment.value):
                return False
        return True


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
