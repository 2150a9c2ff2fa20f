"""What a script tells about one of its DataLoaders: where its samples live and how often it is
iterated.

Where the samples live decides whether a DataLoader fix can raise. The pin thread of a loader
with `pin_memory=True` raises `cannot pin 'torch.cuda.FloatTensor'` for a CUDA tensor (and for a
sparse one), and worker processes that touch CUDA fail under `fork`. So a dataset is looked at:

- HOST: samples are certainly dense CPU data: torchvision/torchaudio/torchtext datasets, a
  `TensorDataset` (or list) of tensors made on the CPU, a Dataset class of this file whose methods
  never move anything to a device, and `Subset`/`random_split`/`ConcatDataset` of those;
- DEVICE: a `TensorDataset` of CUDA tensors, a Dataset class that calls `.to(device)`/`.cuda()`
  or passes `device=` (in `__getitem__` or when it loads its data), a `collate_fn` that does, a
  loader factory's parameter that other files hand only objects of their Dataset classes that do
  (``Links.on_device``); any loader of a run that makes CUDA the default for new tensors
  (`torch.set_default_tensor_type(torch.cuda.FloatTensor)`, here or in a module it imports);
- None: anything else (a dataset built by a function, imported from the project or a library,
  a parameter): a fix that could raise on it is unsafe.

A name the file never binds counts as HOST: the line that reads it cannot run as written (a
snippet), so no fix there can make the script raise.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from enum import Enum
from functools import cmp_to_key
from typing import Iterator
from weakref import WeakKeyDictionary

import libcst as cst

from speedfix.model.arguments import find_argument, string_value
from speedfix.model.context import FileContext
from speedfix.model.flow import (assigned_name, comes_before, false_in_every_run, gates, is_returned, off_by_default,
                                 returned_at)
from speedfix.model.frames import FrameKind, Stack
from speedfix.model.forward import read_names
from speedfix.model.frameworks import lightning_one_pass_loader
from speedfix.model.index import Assignment, CallSite, LoopInfo
from speedfix.model.torch_api import TENSOR_DATASET
from speedfix.project.steps import CUDA_DEFAULT_CALLS, PAD_TO_LONGEST
from speedfix.model.patterns import dataset_argument, is_cpu_device, is_dtype, unwrap_iterable
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import walk_expression
from speedfix.syntax.walk import child_nodes

_HOST_LIBRARIES = ("torchvision.datasets.", "torchaudio.datasets.", "torchtext.datasets.")
_WRAPPERS = (
    "torch.utils.data.Subset", "torch.utils.data.dataset.Subset", "torch.utils.data.random_split",
    "torch.utils.data.dataset.random_split", "torch.utils.data.ConcatDataset", "torch.utils.data.dataset.ConcatDataset",
)
_DATASET_BASES = (
    "torch.utils.data.Dataset", "torch.utils.data.dataset.Dataset", "torch.utils.data.IterableDataset",
    "torch.utils.data.dataset.IterableDataset",
)
# Calls that make a tensor that cannot be pinned: sparse layouts.
_UNPINNABLE = frozenset({"to_sparse", "to_sparse_csr", "sparse_coo_tensor", "sparse_csr_tensor"})
# torch functions that make a new tensor from Python data or a shape, on the default device.
_FACTORIES = frozenset(
    """
    tensor Tensor FloatTensor LongTensor IntTensor BoolTensor from_numpy zeros ones empty full rand
    randn randint randperm arange linspace logspace eye
    """.split()
)
_DEPTH = 4


class Place(Enum):
    HOST = "host"
    DEVICE = "device"  # on a GPU, or otherwise impossible to pin


def samples_place(ctx: FileContext, site: CallSite) -> Place | None:
    """Where the batches of the DataLoader built at ``site`` live (see the module docstring)."""
    if cuda_by_default(ctx):
        return Place.DEVICE
    collate = find_argument(ctx, site, "collate_fn", 4)
    if collate.unknown:
        return None
    if not collate.missing:
        place = _function_place(ctx, collate.node, site.stack)
        if place is not Place.HOST:
            return place
    return dataset_place(ctx, dataset_argument(site), site.stack)


def cuda_by_default(ctx: FileContext) -> bool:
    """Does the run make CUDA the default for new tensors: the script itself
    (`torch.set_default_tensor_type(torch.cuda.FloatTensor)`, `torch.set_default_device("cuda")`),
    or a module it imports (``Links.cuda_default``)? Whatever a Dataset or collate function makes
    is then a CUDA tensor."""
    if ctx.links.cuda_default is not None:
        return True
    for site in ctx.calls_to(*CUDA_DEFAULT_CALLS):
        device = string_value(ctx, site.node.args[0].value, site.stack) if site.node.args else None
        target = ctx.qualname(site.node.args[0].value) if site.node.args else None
        if (device or "").startswith(("cuda", "torch.cuda.")) or (target or "").startswith("torch.cuda."):
            return True
    return False


def dataset_place(ctx: FileContext, dataset: cst.BaseExpression | None, stack: Stack, depth: int = 0) -> Place | None:
    if dataset is None or depth > _DEPTH:
        return None
    if isinstance(dataset, (cst.List, cst.Tuple)):
        return _combine([tensor_place(ctx, element.value, stack, depth + 1) for element in dataset.elements])
    if not isinstance(dataset, cst.Call):
        values = _values_of(ctx, dataset, stack)
        if not values:
            if _handed_on_device(ctx, dataset, stack):
                return Place.DEVICE
            return Place.HOST if _unbound(ctx, dataset) else None
        return _combine([dataset_place(ctx, value, stack, depth + 1) for value in values])
    qualified = ctx.qualname(dataset.func)
    arguments = [arg.value for arg in dataset.args if arg.keyword is None and not arg.star]
    if qualified in TENSOR_DATASET:
        return _combine([tensor_place(ctx, value, stack, depth + 1) for value in arguments])
    if qualified in _WRAPPERS:
        return dataset_place(ctx, arguments[0], stack, depth + 1) if arguments else None
    if qualified is not None:
        return Place.HOST if qualified.startswith(_HOST_LIBRARIES) else None
    name = dotted_name(dataset.func)
    if name not in ctx.classes:
        return None
    given = [tensor_place(ctx, arg.value, stack, depth + 1) for arg in dataset.args]
    if Place.DEVICE in given:
        return Place.DEVICE
    return _class_place(ctx, name)


def tensor_place(ctx: FileContext, expr: cst.BaseExpression, stack: Stack, depth: int = 0) -> Place | None:
    """Where a tensor expression lives: `x.cuda()` DEVICE, `torch.randn(n)` HOST, a parameter None."""
    if depth > _DEPTH:
        return None
    if isinstance(expr, cst.Name):
        values = _values_of(ctx, expr, stack)
        if not values:
            return Place.HOST if _unbound(ctx, expr) else None
        return _combine([tensor_place(ctx, value, stack, depth + 1) for value in values])
    if isinstance(expr, cst.Subscript):
        return tensor_place(ctx, expr.value, stack, depth + 1)
    if not isinstance(expr, cst.Call):
        return None
    qualified = ctx.qualname(expr.func)
    if qualified is not None:
        return _torch_call_place(ctx, expr, qualified, stack, depth) if qualified.startswith("torch.") else None
    if isinstance(expr.func, cst.Attribute):
        if _moves_off_host(ctx, expr, stack):
            return Place.DEVICE
        if expr.func.attr.value in ("cpu", "pin_memory"):
            return Place.HOST
        return tensor_place(ctx, expr.func.value, stack, depth + 1)
    if isinstance(expr.func, cst.Name):  # `Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor`, then `Tensor(x)`
        return _combine([_tensor_type_place(ctx, value) for value in _values_of(ctx, expr.func, stack)])
    return None


def _tensor_type_place(ctx: FileContext, value: cst.BaseExpression) -> Place | None:
    """Where the tensors of a tensor type a name is bound to are made: `torch.cuda.FloatTensor`
    on the GPU, `torch.FloatTensor` on the host; of a conditional one, either branch's."""
    if isinstance(value, cst.IfExp):
        return _combine([_tensor_type_place(ctx, value.body), _tensor_type_place(ctx, value.orelse)])
    qualified = ctx.qualname(value) or ""
    if not (qualified.startswith("torch.") and qualified.endswith("Tensor")):
        return None
    return Place.DEVICE if qualified.startswith("torch.cuda.") else Place.HOST


def _torch_call_place(ctx: FileContext, call: cst.Call, qualified: str, stack: Stack, depth: int) -> Place | None:
    """`torch.randn(n)` HOST, `torch.zeros(n, device="cuda")` DEVICE, `torch.stack([a, b])` where a and b are."""
    site = ctx.site_of(call)
    name = qualified.rsplit(".", 1)[-1]
    if site is None or qualified == "torch.load":
        return None
    if name in _UNPINNABLE or (qualified.startswith("torch.cuda.") and name.endswith("Tensor")):
        return Place.DEVICE  # `torch.cuda.FloatTensor(x)`: made on the GPU
    device = find_argument(ctx, site, "device")
    if not device.missing:
        return Place.HOST if device.node is not None and is_cpu_device(ctx, device.node, stack) else Place.DEVICE
    if name in _FACTORIES:  # on the default device, which the script may have changed
        return None if ctx.calls_to("torch.set_default_device") else Place.HOST
    first = next((arg.value for arg in call.args if arg.keyword is None and not arg.star), None)
    if isinstance(first, (cst.List, cst.Tuple)):
        return _combine([tensor_place(ctx, element.value, stack, depth + 1) for element in first.elements])
    return tensor_place(ctx, first, stack, depth + 1) if first is not None else None


def _moves_off_host(ctx: FileContext, call: cst.Call, stack: Stack) -> bool:
    """`.cuda()`, `.to(device)`, `.to_sparse()`: a tensor that cannot be pinned afterwards
    (`.to(torch.float16)`, `.to("cpu")` and `.to(self.dtype)` stay on the host)."""
    if not isinstance(call.func, cst.Attribute):
        return False
    method = call.func.attr.value
    if method == "cuda" or method in _UNPINNABLE:
        return True
    if method != "to":
        return False
    site = ctx.site_of(call)
    if site is None:
        return False
    target = find_argument(ctx, site, "device", 0)
    node = target.node
    if target.missing or node is None:
        return False  # `.to(dtype=...)`, `.to(memory_format=...)`
    if is_dtype(ctx, node) or "dtype" in (dotted_name(node) or "").rsplit(".", 1)[-1]:
        return False
    return not is_cpu_device(ctx, node, stack)


def _values_of(ctx: FileContext, expr: cst.BaseExpression, stack: Stack) -> list[cst.BaseExpression]:
    """Every value a variable is given in scope, `a, b = A(), B()` and `a, b = random_split(...)`
    included; [] when one cannot be told (`x += ...`, unpacking something else)."""
    name = dotted_name(expr)
    values: list[cst.BaseExpression] = []
    for assignment in ctx.assignments_in_scope(name, stack) if name else ():
        value: cst.BaseExpression | None = assignment.value
        if assignment.augmented:
            return []
        if assignment.unpacked and not isinstance(value, cst.Call):
            value = _element_for(assignment.statement, name, value)
        if value is None:
            return []
        values.append(value)
    return values


def _handed_on_device(ctx: FileContext, expr: cst.BaseExpression, stack: Stack) -> bool:
    """A parameter of a loader factory that other files hand only objects of their classes that
    copy to a device (``Links.on_device``: a Dataset whose `__getitem__` moves each sample)."""
    if not isinstance(expr, cst.Name) or not ctx.links.on_device:
        return False
    called = ctx.called_by_others_as(stack)
    return called is not None and (called, expr.value) in ctx.links.on_device


def _unbound(ctx: FileContext, expr: cst.BaseExpression) -> bool:
    """A name the file never binds (and no `import *` could): the line that reads it cannot run
    as written (a snippet), so no fix there can make the script raise."""
    if not isinstance(expr, cst.Name) or expr.value in ctx.name_bindings or expr.value in ctx.rebound_everywhere:
        return False
    return not any(
        isinstance(small, cst.ImportFrom) and isinstance(small.names, cst.ImportStar)
        for line in ctx.import_lines for small in line.body
    )


def _element_for(statement: cst.SimpleStatementLine | None, name: str, value: cst.BaseExpression) -> cst.BaseExpression | None:
    """`a, b = x, y`: the element of ``value`` that goes to ``name``."""
    assign = statement.body[0] if statement is not None and statement.body else None
    if not isinstance(assign, cst.Assign) or not isinstance(value, (cst.Tuple, cst.List)):
        return None
    for target in assign.targets:
        if isinstance(target.target, (cst.Tuple, cst.List)) and len(target.target.elements) == len(value.elements):
            names = [dotted_name(element.value) for element in target.target.elements]
            if name in names:
                return value.elements[names.index(name)].value
    return None


def _class_place(ctx: FileContext, name: str, seen: frozenset[str] = frozenset()) -> Place | None:
    """A Dataset class of this file: DEVICE if a method moves data off the host, HOST if its
    bases are torch's or its own, None when it inherits code speedfix cannot see."""
    info = ctx.classes[name]
    for base in info.bases:
        if base in ctx.classes and base not in seen:
            inherited = _class_place(ctx, base, seen | {name})
            if inherited is not Place.HOST:
                return inherited
        elif ctx.imports.resolve(base) not in _DATASET_BASES and base != "object":
            return None
    return Place.DEVICE if _moves_any(ctx, info.node) else Place.HOST


def _function_place(ctx: FileContext, func: cst.BaseExpression | None, stack: Stack) -> Place | None:
    """A `collate_fn`: a lambda or a function of this file is looked at; torch's default is HOST."""
    if isinstance(func, cst.Lambda):
        return Place.DEVICE if _moves_any(ctx, func) else Place.HOST
    name = dotted_name(func) if func is not None else None
    if name is None:
        return None
    if ctx.qualname(func) in ("torch.utils.data.default_collate", "torch.utils.data.dataloader.default_collate"):
        return Place.HOST
    defined = [info.node for info in ctx.functions.get(name, ()) if info.class_name is None]
    if len(defined) != 1:
        imported = ctx.links.function(ctx.project_name(name)) if not defined else None
        # ChatGLM-finetune-LoRA's `collate_fn=dataset.GLM.collate_fn`, which builds its batches with `device=device`
        return Place.DEVICE if imported is not None and (imported.moves or imported.makes_on_device) else None
    return Place.DEVICE if _moves_any(ctx, defined[0]) else Place.HOST


def _moves_any(ctx: FileContext, node: cst.CSTNode) -> bool:
    """Does a call inside ``node`` (a class, a function, a lambda) move data off the host?"""
    for site in ctx.calls:
        if _within(site, node) and (_moves_off_host(ctx, site.node, site.stack) or _makes_device_tensor(ctx, site)):
            return True
    return False


def _within(site: CallSite, node: cst.CSTNode) -> bool:
    if isinstance(node, cst.Lambda):
        return any(child is site.node for child in walk_expression(node))
    return any(frame.node is node for frame in site.stack)


def _makes_device_tensor(ctx: FileContext, site: CallSite) -> bool:
    """`torch.tensor(x, device=self.device)` or a sparse tensor made by a torch function."""
    qualified = ctx.call_qualname(site)
    if qualified is None or not qualified.startswith("torch."):
        return False
    if qualified.rsplit(".", 1)[-1] in _UNPINNABLE:
        return True
    device = find_argument(ctx, site, "device")
    return not device.missing and device.node is not None and not is_cpu_device(ctx, device.node, site.stack)


def _combine(places: list[Place | None]) -> Place | None:
    if Place.DEVICE in places:
        return Place.DEVICE
    return Place.HOST if places and all(place is Place.HOST for place in places) else None


# ---------------------------------------------------------------- iteration
def iterated_per_epoch(ctx: FileContext, loader: str, depth: int = 0) -> bool:
    """Is ``loader`` iterated more than once: in a nested loop, in a function called in a loop,
    or passed to one there, also through a progress bar (`pbar = tqdm(loader)`) or a function of
    this file that does so with its parameter (`train(model, train_dataloader=loader, epochs=5)`)?
    (A test loader iterated once after training is not.)"""
    index = _iterations(ctx)
    names = {loader} | index.aliases.get(loader, set())
    if names & index.iterated_per_epoch or loader in index.passed_in_loops:
        return True
    if any(ctx.project_iterates(site, loader, any_loop=True) for site in index.loop_calls_with.get(loader, ())):
        return True  # `train_one_epoch(model, loader)`, `evaluate(val_loader)` of another file, every epoch
    if any(ctx.project_iterates(site, loader, again=True) for site in index.local_calls_with.get(loader, ())):
        return True  # `datalooper = infiniteloop(loader)` of another file: it starts the loader again and again
    if depth < 2 and any(iterated_per_epoch(ctx, param, depth + 1) for site in index.local_calls_with.get(loader, ())
                         for param in _parameters_given(ctx, site, loader) if param != loader):
        return True
    if any(_stored_and_iterated_per_epoch(ctx, site, attr)  # `Trainer(model, loader).fit(epochs)` of this file
           for site in index.classes_given.get(loader, ()) for attr in _stored_as(ctx, site, loader)):
        return True
    return any(_trainer_run_in_a_loop(ctx, index, site) for site in index.local_calls_with.get(loader, ())
               if ctx.project_iterates(site, loader))


def _trainer_run_in_a_loop(ctx: FileContext, index: _Iterations, site: CallSite) -> bool:
    """`trainer = BERTTrainer(model, train_dataloader=loader)` of another file, whose training
    loop iterates the loader it keeps, then `trainer.train(epoch)` in an epoch loop."""
    name = assigned_name(site)
    return name is not None and "." not in name and name in index.receivers_in_loops


def _parameters_given(ctx: FileContext, site: CallSite, name: str) -> list[str]:
    """The parameters of the function of this file that ``site`` calls which take ``name``."""
    found = []
    for info in ctx.functions.get(site.func or "", ()):
        params = [param.name.value for param in (*info.node.params.params, *info.node.params.kwonly_params)]
        positional = [param.name.value for param in info.node.params.params]
        index = 0
        for arg in site.node.args:
            if arg.star:
                break
            if arg.keyword is None:
                if dotted_name(arg.value) == name and index < len(positional):
                    found.append(positional[index])
                index += 1
            elif dotted_name(arg.value) == name and arg.keyword.value in params:
                found.append(arg.keyword.value)
    return found


@dataclass
class _Iterations:
    """What ``iterated_per_epoch`` asks of every loop and call of a file, read once per file (a
    module of a thousand loaders asked it of every call for each loader: quadratic)."""

    iterated_per_epoch: set[str]  # names iterated in a nested loop, or in a function called in a loop
    passed_in_loops: set[str]  # names passed, in a loop, to a function of this file
    loop_calls_with: dict[str, list[CallSite]]  # name -> the calls in a loop that take it
    classes_given: dict[str, list[CallSite]]  # name -> `Trainer(...)` calls of a class of this file given it
    aliases: dict[str, set[str]]  # name -> names bound to it (`active = train_loader`, `pbar = tqdm(loader)`)
    local_calls_with: dict[str, list[CallSite]]  # name -> the calls of functions of this file (not methods) given it
    receivers_in_loops: set[str]  # names whose methods are called in a loop (`trainer.train(epoch)`)


_ITERATIONS: WeakKeyDictionary[FileContext, _Iterations] = WeakKeyDictionary()


def _iterations(ctx: FileContext) -> _Iterations:
    found = _ITERATIONS.get(ctx)
    if found is not None:
        return found
    in_loop = [site for site in ctx.calls if ctx.nearest_loop(site.stack) is not None]
    called_in_loops = {info.node for site in in_loop if site.func in ctx.functions for info in ctx.functions[site.func]}
    per_epoch = {
        name for info in ctx.loops.values() if info.iter is not None
        and (ctx.nearest_loop(info.stack) is not None or ctx.function_of(info.stack) in called_in_loops)
        and (name := dotted_name(unwrap_iterable(info.iter))) is not None
    }
    passed = {dotted_name(arg.value) for site in in_loop if site.func in ctx.functions for arg in site.node.args}
    loop_calls: dict[str, list[CallSite]] = {}
    for site in in_loop:
        for name in {dotted_name(arg.value) for arg in site.node.args} - {None}:
            loop_calls.setdefault(name, []).append(site)  # type: ignore[arg-type]
    classes: dict[str, list[CallSite]] = {}
    for site in ctx.calls:
        if site.func in ctx.classes:
            for name in set(_init_arguments(ctx, site)[1].values()):
                classes.setdefault(name, []).append(site)
    local_calls: dict[str, list[CallSite]] = {}
    for site in ctx.calls:
        if site.func is not None and "." not in site.func and (site.func in ctx.functions or ctx.links.modules):
            for name in {dotted_name(arg.value) for arg in site.node.args} - {None}:
                local_calls.setdefault(name, []).append(site)  # type: ignore[arg-type]
    receivers = {dotted_name(site.node.func.value) for site in in_loop if isinstance(site.node.func, cst.Attribute)}
    found = _Iterations(per_epoch, passed - {None}, loop_calls, classes, _all_aliases(ctx), local_calls,  # type: ignore[arg-type]
                        receivers - {None})  # type: ignore[arg-type]
    _ITERATIONS[ctx] = found
    return found


def never_read(ctx: FileContext, site: CallSite) -> bool:
    """Is the DataLoader of ``site`` bound to a name that nothing reads: in its function, or, at
    module level, anywhere in a script that trains (not a module others may import from)? A test
    loader made and never used costs nothing: advice about its workers or pinning is noise (also
    when it is only handed to `accelerator.prepare(...)`, which binds the name again, or made only
    where a test no run passes says so: `DataLoader(test_set) if test_set is not None else None`).
    Nor is a loader built in a branch that the script's defaults never take (the `else:` of
    `if validation_fraction is not None:` where every call passes `validation_fraction=0.1`).
    A loader whose only reads are `len(loader)` is never read for batches either (minimind's
    `loader_for_count`, made to count the steps of a schedule)."""
    if off_by_default(ctx, site.statement, site.stack) is not None:
        return True
    if site.statement is not None and any(
            isinstance(node, cst.IfExp) and node.body is site.node and false_in_every_run(ctx, node.test, site.stack)
            for node in walk_expression(site.statement)):
        return True  # `DataLoader(test_set) if test_set is not None else None`, no test set given by default
    name = assigned_name(site)
    if name is None or "." in name:
        return False
    scope = ctx.function_of(site.stack)
    if scope is None and not ctx.step_loops:
        return False
    counted = sum(1 for call in ctx.calls if call.func == "len" and len(call.node.args) == 1
                  and dotted_name(call.node.args[0].value) == name and ctx.function_of(call.stack) is scope)
    return _reads(ctx, scope or ctx.module)[name] == _prepared_in_place(ctx, scope, name) + counted


def _bound_names(target: cst.BaseExpression) -> Iterator[cst.BaseExpression]:
    """An assignment target and, in a tuple or list of targets (`a, (b, c) = ...`), each name it binds."""
    yield target
    if isinstance(target, (cst.Tuple, cst.List)):
        for element in target.elements:
            yield from _bound_names(element.value)


_PREPARED: WeakKeyDictionary[FileContext, Counter[tuple[int, str]]] = WeakKeyDictionary()


def _prepared_in_place(ctx: FileContext, scope: cst.CSTNode | None, name: str) -> int:
    """How often ``scope`` reads ``name`` only to hand it to a `prepare` that binds the name
    again (`train_dl, test_dl = accelerator.prepare(train_dl, test_dl)`): no use of the loader.
    Counted once per file."""
    found = _PREPARED.get(ctx)
    if found is None:
        found = _PREPARED[ctx] = Counter()
        for call in ctx.method_calls("prepare"):
            passed = {arg.value.value for arg in call.node.args if isinstance(arg.value, cst.Name) and not arg.star}
            statement = call.statement
            for small in statement.body if statement is not None else ():
                if isinstance(small, cst.Assign) and small.value is call.node:
                    bound = {node.value for target in small.targets for node in _bound_names(target.target)
                             if isinstance(node, cst.Name)}
                    function = ctx.function_of(call.stack)
                    for again in passed & bound:
                        found[(id(function), again)] += 1
    return found[(id(scope), name)]


def not_for_training(ctx: FileContext, site: CallSite) -> bool:
    """A loader made and never read, read for a look at one batch, or consumed in place for one
    pass: its workers and pinning do not matter."""
    return never_read(ctx, site) or only_peeked(ctx, site) or consumed_in_place(ctx, site)


def consumed_in_place(ctx: FileContext, site: CallSite) -> bool:
    """Is the DataLoader of ``site`` made as the iterable of a comprehension outside any loop
    (`torch.cat([d[0] for d in DataLoader(train_set)])` to compute a dataset's mean and std)? It
    makes one pass, once: no training reads it."""
    if site.statement is None or ctx.nearest_loop(site.stack) is not None:
        return False
    return any(isinstance(node, cst.CompFor) and node.iter is site.node for node in walk_expression(site.statement))


def only_peeked(ctx: FileContext, site: CallSite) -> bool:
    """Is the DataLoader of ``site`` bound to a name that is only iterated by loops that stop
    after their first batch (`for img, label in loader: show(encoder(img)); break`) or drawn from
    once outside any loop (`imgs, _ = next(iter(loader))`), or in the loop that makes it anew on
    each pass (a plot per data set)? Looking at one batch (a shape check,
    a picture in a notebook) is no training: its workers and pinning do not matter."""
    name = assigned_name(site)
    if name is None or "." in name:
        return False
    scope = ctx.function_of(site.stack) or ctx.module
    peeks = _peeks(ctx)
    loops = [info for info in peeks.loops.get(name, []) if not _shadowed(ctx, info.stack, scope, name)]
    draws = [draw for draw in peeks.draws.get(name, []) if not _shadowed(ctx, draw.stack, scope, name)]
    made_in = ctx.nearest_loop(site.stack)  # a loader made anew on each pass of a loop, and drawn from once there
    if any(ctx.nearest_loop(draw.stack) not in (None, made_in) for draw in draws) or not (loops or draws):
        return False
    reads = _reads(ctx, scope)[name]
    return reads == len(loops) + len(draws) and all(stops_at_once(info.node) for info in loops)


def _shadowed(ctx: FileContext, stack: Stack, scope: cst.CSTNode, name: str) -> bool:
    """Is ``name`` at ``stack`` another variable than ``scope``'s: a function between them binds it?"""
    inner = False
    for frame in stack:
        if frame.node is scope:
            inner = True
        elif frame.kind is FrameKind.FUNCTION and (inner or scope is ctx.module) \
                and isinstance(frame.node, (cst.FunctionDef, cst.Lambda)) and name in _bound_inside(ctx, frame.node):
            return True
    return False


@dataclass
class _Peeks:
    """Per file, once: the `for` loops over each name and the `next(iter(name))` draws of each
    name (asked per loader, found per file)."""

    loops: dict[str, list[LoopInfo]]
    draws: dict[str, list[CallSite]]


_PEEKS: WeakKeyDictionary[FileContext, _Peeks] = WeakKeyDictionary()


def _peeks(ctx: FileContext) -> _Peeks:
    if ctx not in _PEEKS:
        loops: dict[str, list[LoopInfo]] = {}
        for info in ctx.loops.values():
            if isinstance(info.node, cst.For) and info.iter is not None:
                name = dotted_name(unwrap_iterable(info.iter))
                if name:
                    loops.setdefault(name, []).append(info)
        draws: dict[str, list[CallSite]] = {}
        for draw in ctx.calls:
            if (dotted_name(draw.node.func) == "next" and len(draw.node.args) == 1
                    and isinstance(inner := draw.node.args[0].value, cst.Call) and dotted_name(inner.func) == "iter"
                    and len(inner.args) == 1 and (name := dotted_name(inner.args[0].value))):
                draws.setdefault(name, []).append(draw)
        _PEEKS[ctx] = _Peeks(loops, draws)
    return _PEEKS[ctx]


def stops_at_once(loop: cst.CSTNode) -> bool:
    """The loop's body ends in an unconditional `break`."""
    body = loop.body.body if isinstance(loop, cst.For) and isinstance(loop.body, cst.IndentedBlock) else ()
    last = body[-1] if body else None
    return isinstance(last, cst.SimpleStatementLine) and any(isinstance(small, cst.Break) for small in last.body)


_READS: WeakKeyDictionary[FileContext, tuple[set[int], dict[int, Counter[str]]]] = WeakKeyDictionary()


def _reads(ctx: FileContext, scope: cst.CSTNode) -> Counter[str]:
    """How often ``scope`` reads each of its names (once per scope; the file's assignment targets
    once per file). Not reads: a plain assignment's target (each name of a tuple of them too), a
    keyword's name (`f(loader=x)`), a function's parameters and whatever a nested function binds
    itself (its own `loader`), and a bare name or tuple of names as a statement (a notebook cell
    showing `train_dl, test_dl`)."""
    if ctx not in _READS:
        targets = {id(bound) for assignments in ctx.assignments.values() for a in assignments
                   if a.statement is not None for small in a.statement.body if isinstance(small, cst.Assign)
                   for target in small.targets for bound in _bound_names(target.target)}
        _READS[ctx] = (targets, {})
    targets, by_scope = _READS[ctx]
    found = by_scope.get(id(scope))
    if found is None:
        found = by_scope[id(scope)] = Counter()
        todo: list[tuple[cst.CSTNode, frozenset[str]]] = [(scope, frozenset())]
        while todo:
            node, hidden = todo.pop()
            kind = type(node)
            if kind is cst.Name:
                if node.value not in hidden and id(node) not in targets:
                    found[node.value] += 1
                continue
            if (kind is cst.FunctionDef or kind is cst.Lambda) and node is not scope:
                hidden = hidden | _bound_inside(ctx, node)
            if kind is cst.Expr and _shown(node.value):
                continue
            if kind is cst.Arg:
                children: list[cst.CSTNode] = [node.value]
            elif kind is cst.Param:
                children = [part for part in (node.annotation, node.default) if part is not None]
            else:
                children = list(child_nodes(node))
            todo.extend((child, hidden) for child in children)
    return found


def _bound_inside(ctx: FileContext, function: cst.FunctionDef | cst.Lambda) -> frozenset[str]:
    """The names a nested function binds itself: its parameters and its assignments."""
    params = function.params
    names = {param.name.value for param in (*params.posonly_params, *params.params, *params.kwonly_params)}
    for star in (params.star_arg, params.star_kwarg):
        if isinstance(star, cst.Param):
            names.add(star.name.value)
    return frozenset(names | set(ctx.assignments_by_function.get(function, {})))


def _shown(expr: cst.BaseExpression) -> bool:
    """`loader` or `train_dl, test_dl` alone on a line: shown by a notebook, not read."""
    if isinstance(expr, cst.Tuple):
        return all(isinstance(element.value, cst.Name) for element in expr.elements)
    return isinstance(expr, cst.Name)


# A factory's parameter that says whether it builds the training loader: `create_dataloader(hp, args, train)`.
_TRAINING_FLAG = re.compile(r"(?:is_)?train(?:ing)?", re.IGNORECASE)


def in_evaluation_branch(ctx: FileContext, site: CallSite) -> bool:
    """Is the DataLoader of ``site`` built where a factory's training flag is off: the `else:` of
    `if train:`, or under `if not is_train:` (voicefilter's `create_dataloader(hp, args, train)`,
    whose other branch builds the training loader)?"""
    function = ctx.function_of(site.stack)
    if not isinstance(function, cst.FunctionDef):
        return False
    params = {param.name.value for param in (*function.params.params, *function.params.kwonly_params)}
    for test, wanted in gates(ctx, site.statement):
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            test, wanted = test.expression, not wanted
        if isinstance(test, cst.Name) and test.value in params and _TRAINING_FLAG.fullmatch(test.value) and not wanted:
            return True
        if _names_evaluation_phase(test, wanted, params):
            return True
    return False


# What a factory's `phase`/`split`/`mode` parameter is compared with.
_EVALUATION_PHASE = re.compile(r"val(?:id(?:ation)?)?|eval(?:uation)?|test(?:ing)?|dev", re.IGNORECASE)
_TRAINING_PHASE = re.compile(r"train(?:ing)?", re.IGNORECASE)


def _names_evaluation_phase(test: cst.BaseExpression, wanted: bool, params: set[str]) -> bool:
    """`phase == "val"` (or `split in ("val", "test")`) taken, or `phase == "train"` not taken (the
    `elif`/`else` after it), on a parameter of the factory (SR3's `create_dataloader(dataset,
    dataset_opt, phase)`)."""
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1 or not isinstance(test.left, cst.Name) \
            or test.left.value not in params:
        return False
    target = test.comparisons[0]
    words = [element.value for element in target.comparator.elements] \
        if isinstance(target.comparator, (cst.Tuple, cst.List, cst.Set)) else [target.comparator]
    texts = [word.evaluated_value for word in words if isinstance(word, cst.SimpleString)]
    if not texts or len(texts) != len(words) or not all(isinstance(text, str) for text in texts):
        return False
    equal = isinstance(target.operator, (cst.Equal, cst.In))
    if not equal and not isinstance(target.operator, (cst.NotEqual, cst.NotIn)):
        return False
    pattern = _EVALUATION_PHASE if equal == wanted else _TRAINING_PHASE  # the value is one of them / none of them
    return all(pattern.fullmatch(text) for text in texts)  # type: ignore[arg-type]


def returned_to_training(ctx: FileContext, site: CallSite) -> tuple[bool, bool, bool] | None:
    """(iterated every epoch, its batches copied to a device, its dataset changed between epochs)
    when the DataLoader of ``site`` is returned by a module-level function whose result a
    training loop of another scanned file iterates (`return DataLoader(...)` in `data.py`,
    `loader = get_loader(...)` in `train.py`, or handed on to a `train(...)` that loops over it)."""
    if not ctx.links.feeds:
        return None
    function = ctx.function_of(site.stack)
    if not isinstance(function, cst.FunctionDef) or ctx.class_of(site.stack) is not None:
        return None
    feed = next((feed for feed in ctx.links.feeds if feed[0] == function.name.value), None)
    if feed is None:
        return None
    _, per_epoch, uploads, changed, positions = feed
    if in_evaluation_branch(ctx, site):
        return None  # the factory's other branch builds the training loader
    # `train_loader, val_loader = get_loaders()`, then `for x, y in train_loader:`: that element only
    returned = is_returned(function, site) if -1 in positions else returned_at(function, site, positions)
    return (per_epoch, uploads, changed) if returned else None


def _all_aliases(ctx: FileContext) -> dict[str, set[str]]:
    """Name -> the names bound to it: `active = train_loader`, `loader = a if resume else train_loader`,
    `pbar = tqdm(train_loader)`, `with tqdm(train_loader) as pbar:`."""
    found: dict[str, set[str]] = {}
    for target, assignments in ctx.assignments.items():
        for assignment in assignments:
            if assignment.augmented:
                continue
            value = assignment.part or assignment.value
            for option in [value.body, value.orelse] if isinstance(value, cst.IfExp) else [value]:
                name = dotted_name(unwrap_iterable(option))  # `pbar = tqdm(loader)` iterates the loader
                if name is not None:
                    found.setdefault(name, set()).add(target)
    for info in ctx.withs:  # `with tqdm(loader) as pbar:` binds the progress bar the same way
        for item in info.node.items:
            target = dotted_name(item.asname.name) if item.asname is not None else None
            name = dotted_name(unwrap_iterable(item.item)) if isinstance(item.item, cst.Call) else None
            if target is not None and name is not None:
                found.setdefault(name, set()).add(target)
    return found


def _init_arguments(ctx: FileContext, site: CallSite) -> tuple[cst.FunctionDef | None, dict[str, str]]:
    """The `__init__` of the class of this file that ``site`` instantiates, and the name each of
    its parameters is given (`Trainer(model, loader)`: {"loader": "loader"})."""
    inits = [info for info in ctx.functions.get("__init__", ()) if info.class_name == site.func]
    if len(inits) != 1:
        return None, {}
    params = [param.name.value for param in inits[0].node.params.params][1:]
    given = {param: dotted_name(find_argument(ctx, site, param, index).node) for index, param in enumerate(params)}
    return inits[0].node, {param: name for param, name in given.items() if name is not None}


def _stored_as(ctx: FileContext, site: CallSite, name: str) -> list[str]:
    """`Trainer(model, loader)` whose `__init__` does `self.train_loader = train_loader`: the
    attributes (`self.train_loader`) that hold the argument ``name``."""
    init, arguments = _init_arguments(ctx, site)
    given = {param for param, argument in arguments.items() if argument == name}
    if init is None or not given:
        return []
    return [target for target, assignments in ctx.assignments_by_function.get(init, {}).items()
            if target.startswith("self.") and any(dotted_name(a.value) in given for a in assignments)]


def _stored_and_iterated_per_epoch(ctx: FileContext, site: CallSite, attribute: str) -> bool:
    """Does a method of the class of ``site`` iterate ``attribute`` inside another loop?"""
    for info in ctx.loops.values():
        if info.iter is None or dotted_name(unwrap_iterable(info.iter)) != attribute:
            continue
        owner = ctx.class_of(info.stack)
        if owner is not None and owner.name.value == site.func and ctx.nearest_loop(info.stack) is not None:
            return True
    return False


# ---------------------------------------------------------------- attributes set after creation
# `DataLoader.__setattr__` raises ValueError for these once the loader exists.
FROZEN_ATTRIBUTES = frozenset({"batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers"})
# Read by each new iterator: set later, they apply from the next `iter(loader)` on.
ITERATOR_ATTRIBUTES = frozenset(
    {"num_workers", "prefetch_factor", "pin_memory", "pin_memory_device", "timeout", "worker_init_fn",
     "collate_fn", "multiprocessing_context", "generator", "in_order"}
)
# Arguments of `DataLoader(...)` that it turns into other objects: the attribute is never read.
IGNORED_ATTRIBUTES = frozenset({"shuffle"})


def late_attributes(ctx: FileContext, site: CallSite) -> list[Assignment]:
    """`loader.num_workers = 16` after `loader = DataLoader(...)`: the assignments to the
    loader's attributes that follow its creation (in its function, or for `self.loader` in any
    method of its class), in file order."""
    loader = assigned_name(site)
    if loader is None or site.statement is None:
        return []
    function, owner = ctx.function_of(site.stack), ctx.class_of(site.stack)
    rebound = [a.statement for a in ctx.assignments_in(function, loader)
               if a.statement is not None and a.statement is not site.statement]
    found = []
    for attribute in sorted(FROZEN_ATTRIBUTES | ITERATOR_ATTRIBUTES | IGNORED_ATTRIBUTES):
        for assignment in ctx.assignments.get(f"{loader}.{attribute}", ()):
            if assignment.statement is None or assignment.unpacked or assignment.augmented:
                continue
            if ctx.function_of(assignment.stack) is function:
                if comes_before(ctx, site.statement, assignment.statement) and not any(
                    comes_before(ctx, site.statement, other) and comes_before(ctx, other, assignment.statement)
                    for other in rebound
                ):  # not after `loader = Wrapper(loader)`: that object's attribute
                    found.append(assignment)
            elif loader.startswith("self.") and owner is not None and ctx.class_of(assignment.stack) is owner:
                found.append(assignment)
    return sorted(found, key=cmp_to_key(lambda a, b: -1 if comes_before(ctx, a.statement, b.statement) else 1))


def late_value(ctx: FileContext, site: CallSite, attribute: str) -> Assignment | None:
    """The last assignment of ``attribute`` after the loader's creation (see `late_attributes`)."""
    found = [a for a in late_attributes(ctx, site) if a.target.rpartition(".")[2] == attribute]
    return found[-1] if found else None


# Calls that build the training loader themselves, from a dataset: `deepspeed.initialize(...,
# training_data=trainset)` returns it as its third value.
_FRAMEWORK_LOADERS = {"deepspeed.initialize": "training_data"}


def evaluation_only(ctx: FileContext, site: CallSite) -> bool:
    """A DataLoader the default run iterates once, outside the training loop, in a script that
    trains: in training loops of its own, or on batches from a loader a framework builds
    (`deepspeed.initialize(..., training_data=trainset)`). An evaluation after training, where
    workers and pinned memory would start up for a single pass (a script that only evaluates is
    not one: its loader is its whole workload). Also a Lightning `test_dataloader` or
    `predict_dataloader` hook's loader (``lightning_one_pass_loader``)."""
    if lightning_one_pass_loader(ctx, site):
        return True
    if not ctx.step_loops and not any(not find_argument(ctx, init, keyword).missing
                                      for qualified, keyword in _FRAMEWORK_LOADERS.items()
                                      for init in ctx.calls_to(qualified)):
        return False
    name = assigned_name(site)
    if name is None or iterated_per_epoch(ctx, name):
        return False
    home = ctx.function_of(site.stack)
    iterating = [info for info in ctx.loops.values()
                 if info.iter is not None and dotted_name(unwrap_iterable(info.iter)) == name
                 and _same_binding(ctx, name, home, ctx.function_of(info.stack))]
    return bool(iterating) and not any(info.node in ctx.training_loops for info in iterating)


def _same_binding(ctx: FileContext, name: str, home: cst.CSTNode | None, there: cst.CSTNode | None) -> bool:
    """Is ``name`` in function ``there`` the one bound in ``home``: the same function, or one that
    binds no such name of its own (Crossformer's `_get_data` and `test` each make a `data_loader`)?"""
    return there is home or there is None or not ctx.assignments_in(there, name)


def built_for_one_pass(ctx: FileContext, site: CallSite) -> bool:
    """Is the DataLoader of ``site`` made anew on every pass of a loop and used only in that pass
    (`for epoch in ...: loader = DataLoader(...); train_epoch(epoch, loader)`), no loop inside
    the pass iterating it again? Then its workers end with it, whatever `persistent_workers`
    says (minimind rebuilds its loader each epoch to skip the batches of a resumed run)."""
    loop = ctx.nearest_loop(site.stack)
    name = assigned_name(site)
    if loop is None or name is None or "." in name:
        return False
    function = ctx.function_of(site.stack)
    uses: list[Stack] = [other.stack for other in ctx.calls if other is not site and ctx.function_of(other.stack) is function
                         and any(name in read_names(arg.value) for arg in other.node.args)]
    uses += [info.stack for info in ctx.loops.values() if info.iter is not None and ctx.function_of(info.stack) is function
             and name in read_names(info.iter)]
    return bool(uses) and all(ctx.nearest_loop(stack) is loop for stack in uses)


def pads_to_longest(ctx: FileContext, site: CallSite) -> bool:
    """Does the DataLoader made at ``site`` collate with a function that pads each batch's
    samples to its longest (`collate_fn=collate_batch`, which calls `pad_sequence`, in this file
    or another of the project: FragmentVC)? Its batches change shape from one to the next."""
    collate = find_argument(ctx, site, "collate_fn", 6).node
    name = dotted_name(collate) if collate is not None else None
    if name is None:
        return False
    local = [info for info in ctx.functions.get(name, ()) if info.class_name is None]
    if local:
        return any(ctx.qualname(node.func) in PAD_TO_LONGEST for info in local for node in walk_expression(info.node)
                   if isinstance(node, cst.Call))
    facts = ctx.links.function(ctx.project_name(name)) if ctx.links.modules else None
    return facts is not None and facts.pads
