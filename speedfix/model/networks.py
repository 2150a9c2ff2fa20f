"""Models in a training script: which expression builds one, which are 2-D conv nets, what wraps
them, which one an optimizer trains and where it is called in the training loop.

A model is built by a class the file defines (`Net()`), by a model zoo
(`torchvision.models.resnet50()`, `models.__dict__[args.arch]()`, `models.get_model("resnet50")`,
`timm.create_model("resnet50")`) or by Hugging Face (`AutoModel.from_pretrained(...)`), possibly
followed by `.to(device)`/`.cuda()` and wrapped in `nn.DataParallel`/`DistributedDataParallel`.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from weakref import WeakKeyDictionary

import libcst as cst

from speedfix.model.arguments import argparse_default, find_argument
from speedfix.model.context import MODULE_METHODS, FileContext
from speedfix.model.flow import comes_before, gates, in_no_run, is_returned, passed_arguments
from speedfix.model.forward import LOSS_NAME, is_local_object, read_names
from speedfix.model.frames import FrameKind, Stack, class_of, function_of
from speedfix.model.index import Assignment, CallSite
from speedfix.model.patterns import INSTANTIATE, LIBRARY_OPTIMIZERS, NN_MODULE, OPTIMIZER_PREFIX
from speedfix.model.project_classes import project_class
from speedfix.project import FunctionFacts
from speedfix.project.steps import (CONV_LAYERS, LIGHTNING_CLI, LIGHTNING_TRAINER, MATMUL_METHODS, MODULE_API,
                                    NOT_CONV_NETS, SPARSE_MATMULS, diffusers_conv_net, layer_kind)
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import code_of, walk_expression
from speedfix.syntax.walk import child_list

DATA_PARALLEL = (
    "torch.nn.DataParallel",
    "torch.nn.parallel.DataParallel",
    "torch.nn.parallel.data_parallel.DataParallel",
)
DISTRIBUTED_DATA_PARALLEL = (
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
)
PARALLEL_WRAPPERS = DATA_PARALLEL + DISTRIBUTED_DATA_PARALLEL


def data_parallel_calls(ctx: FileContext) -> list[CallSite]:
    """`nn.DataParallel(...)`, and the constructor calls of a project class derived from it
    (Transformer-XL's `BalancedDataParallel(gpu0_bsz, model, dim=1)`, defined in this file or
    another of the project): one process driving every GPU either way."""
    found = list(ctx.calls_to(*DATA_PARALLEL))
    for qualified, sites in ctx.calls_by_qualname.items():
        if "Parallel" not in qualified.rsplit(".", 1)[-1] or qualified in PARALLEL_WRAPPERS:
            continue  # the class's name is the cheap test; its bases decide
        defined = project_class(ctx.project, qualified) if ctx.project is not None else None
        if defined is not None and set(defined.bases) & set(DATA_PARALLEL):
            found += sites
    found += [site for site in ctx.calls if site.func in ctx.classes and ctx.is_subclass_of(site.func, *DATA_PARALLEL)]
    return list({id(site.node): site for site in found}.values())  # a local class may also resolve as the project's
CONV2D = tuple(name for name, dims in CONV_LAYERS.items() if dims == 2)
_ZOO_FACTORIES = {
    "torchvision.models.get_model": "torchvision",
    "timm.create_model": "timm",
    "timm.models.create_model": "timm",
    "timm.models._factory.create_model": "timm",
}
# segmentation_models_pytorch: every architecture (`smp.Unet(...)`, `smp.create_model("FPN", ...)`)
# decodes with 2-D convolutions, whatever its encoder.
_SMP = "segmentation_models_pytorch"


# ---------------------------------------------------------------- building and wrapping
def peel(ctx: FileContext, expr: cst.BaseExpression) -> cst.BaseExpression:
    """``expr`` without `.to(...)`/`.cuda()`/`.train()` chains and DataParallel/DDP wrappers:
    `nn.DataParallel(Net().cuda()).cuda()` -> `Net()`."""
    while isinstance(expr, cst.Call):
        func = expr.func
        if isinstance(func, cst.Attribute) and func.attr.value in MODULE_METHODS:
            expr = func.value
        elif ctx.qualname(func) in PARALLEL_WRAPPERS and expr.args and expr.args[0].keyword is None:
            expr = expr.args[0].value
        else:
            break
    return expr


def wrapper_of(ctx: FileContext, expr: cst.BaseExpression) -> tuple[str, cst.Call] | None:
    """(qualified wrapper, its call) when ``expr`` is `DDP(x, ...)` or `nn.DataParallel(x).cuda()`."""
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in MODULE_METHODS:
        expr = expr.func.value
    if isinstance(expr, cst.Call) and expr.args and expr.args[0].keyword is None:
        qualified = ctx.qualname(expr.func)
        if qualified in PARALLEL_WRAPPERS:
            return qualified, expr
    return None


def zoo_architecture(ctx: FileContext, call: cst.Call, stack: Stack) -> tuple[str, str | None] | None:
    """(zoo, architecture name or None when unknown) for a call that builds a model from a zoo:
    `torchvision.models.resnet50()`, `models.__dict__[args.arch]()`, `get_model("resnet50")`,
    `timm.create_model(args.model)` (argparse defaults and constants are resolved), a diffusers
    U-Net or VAE (`UNet2DModel(...)`, `AutoencoderKL.from_pretrained(...)`), a
    segmentation_models_pytorch network (`smp.Unet(...)`, `smp.create_model("FPN", ...)`)."""
    func = call.func
    if isinstance(func, cst.Subscript) and isinstance(func.value, cst.Attribute) and func.value.attr.value == "__dict__":
        zoo = _zoo_module(ctx.qualname(func.value.value))
        if zoo is None or len(func.slice) != 1 or not isinstance(func.slice[0].slice, cst.Index):
            return None
        return zoo, _string_value(ctx, func.slice[0].slice.value, stack)
    qualified = ctx.qualname(func) or ""
    if qualified in _ZOO_FACTORIES:
        first = call.args[0] if call.args and call.args[0].keyword is None else next(
            (arg for arg in call.args if arg.keyword is not None and arg.keyword.value in ("name", "model_name")), None
        )
        return _ZOO_FACTORIES[qualified], _string_value(ctx, first.value, stack) if first is not None else None
    diffusers = diffusers_conv_net(qualified)
    if diffusers is not None:
        return "diffusers", diffusers  # `UNet2DModel(...)`, `UNet2DModel.from_config(config)`
    zoo = _zoo_module(qualified.rpartition(".")[0])
    leaf = qualified.rpartition(".")[2]
    if qualified.rpartition(".")[0] == _SMP and (leaf == "create_model" or leaf[:1].isupper()):
        return _SMP, None  # `smp.create_model(arch, ...)`, `smp.Unet(...)`: a conv decoder in any case
    if zoo == "torchvision" and leaf[:1].islower() and leaf not in ("get_weight", "get_model_weights", "list_models"):
        return zoo, leaf
    return None


def _zoo_module(qualified: str | None) -> str | None:
    if qualified is None:
        return None
    if qualified == "torchvision.models" or qualified.startswith("torchvision.models."):
        return None if ".detection" in qualified or ".video" in qualified or ".optical_flow" in qualified else "torchvision"
    if qualified in ("timm", "timm.models"):
        return "timm"
    return None


def _string_value(ctx: FileContext, node: cst.BaseExpression, stack: Stack) -> str | None:
    for _ in range(3):
        if isinstance(node, cst.SimpleString):
            value = node.evaluated_value
            return value if isinstance(value, str) else None
        default = argparse_default(ctx, node)
        if default is not None:
            node = default
            continue
        name = dotted_name(node)
        value = ctx.single_value(name, stack) if name else None
        if value is None:
            return None
        node = value
    return None


def is_conv_architecture(name: str | None) -> bool:
    """A zoo architecture with 2-D convolutions throughout (unknown names count: the classification
    zoos are mostly CNNs, and `models.__dict__[args.arch]` scripts default to a ResNet)."""
    return name is None or not name.lower().startswith(NOT_CONV_NETS)


def is_conv2d_net(ctx: FileContext, expr: cst.BaseExpression, stack: Stack) -> bool:
    """Does ``expr`` build a network with 2-D convolutions (`nn.Conv2d`/`nn.ConvTranspose2d`)?"""
    built = peel(ctx, expr)
    if not isinstance(built, cst.Call):
        return False
    zoo = zoo_architecture(ctx, built, stack)
    if zoo is not None:
        return is_conv_architecture(zoo[1])
    classes = built_classes(ctx, built, stack)
    if classes:
        return bool(classes & conv2d_classes(ctx))
    if 2 in project_conv_dims(ctx, built):
        return True
    return any(isinstance(node, cst.Call) and ctx.qualname(node.func) in CONV2D for node in walk_expression(built))


def project_conv_dims(ctx: FileContext, call: cst.Call) -> tuple[int, ...]:
    """The ConvNd dimensions of the network a class (or factory) of another scanned file builds:
    `net = ResNet18()` after `from models import *`."""
    facts = _project_builder(ctx, call)
    return facts.conv_dims if facts is not None else ()


def project_builds_rnn(ctx: FileContext, call: cst.Call) -> bool:
    """Does a class (or factory) of another scanned file build cuDNN LSTM/GRU/RNN layers
    (`decoder = DecoderRNN(...)` from model.py)?"""
    facts = _project_builder(ctx, call)
    return facts is not None and facts.rnn


def project_builds_matmuls(ctx: FileContext, call: cst.Call) -> bool:
    """Does a network of another scanned file have attention, recurrent layers or matmuls of its
    own, beyond a classifier head?"""
    facts = _project_builder(ctx, call)
    return facts is None or facts.matmuls


def project_known_matmuls(ctx: FileContext, call: cst.Call) -> bool:
    """Is a network of another scanned file known to multiply matrices beyond a classifier head:
    attention, recurrent layers, matmuls of its own, or linear layers without convolutions (an
    MLP)? False when it is not known (not a network of a scanned file)."""
    facts = _project_builder(ctx, call)
    return facts is not None and (facts.matmuls or (facts.matmul and not facts.conv_dims))


def multiplies_sparse(ctx: FileContext, call: cst.Call, stack: Stack) -> bool:
    """Does the network ``call`` builds multiply sparse matrices (`torch.spmm(adj, support)` of a
    graph convolution): in a class of this file (or one it instantiates), or of another scanned
    file (through the layers it builds there)?"""
    names = set().union(*(model_classes(ctx, name) for name in built_classes(ctx, call, stack)))
    if names and any((owner := class_of(site.stack)) is not None and owner.name.value in names
                     for site in ctx.calls_to(*SPARSE_MATMULS)):
        return True
    facts = _project_builder(ctx, call)
    return facts is not None and facts.sparse


def _project_builder(ctx: FileContext, call: cst.Call) -> FunctionFacts | None:
    return ctx.links.function(ctx.project_name(_called_name(ctx, call.func))) if ctx.links.modules else None


def _called_name(ctx: FileContext, func: cst.BaseExpression) -> str | None:
    """`models.resnet50` for `models.resnet50(...)`, and for `getattr(models, args.model)(...)`
    with an argparse default (or a literal) of "resnet50": a builder picked by name from a module."""
    if isinstance(func, cst.Call) and dotted_name(func.func) == "getattr" and len(func.args) == 2 \
            and not ctx.qualname(func.func):
        owner = dotted_name(func.args[0].value)
        name = _string_value(ctx, func.args[1].value, ())
        return f"{owner}.{name}" if owner and name else None
    return dotted_name(func)


def built_classes(ctx: FileContext, call: cst.Call, stack: Stack, depth: int = 0) -> set[str]:
    """The local classes a call instantiates: `Net()`, a local factory `resnet50()` that returns
    `ResNet(...)`, or a registry of them, `models[args.arch]()` with `models = {"resnet50": resnet50}`."""
    if depth > 3:
        return set()
    func = call.func
    if isinstance(func, cst.Subscript):
        registry = ctx.single_value(func.value.value, stack) if isinstance(func.value, cst.Name) else None
        if not isinstance(registry, cst.Dict):
            return set()
        found: set[str] = set()
        for element in registry.elements:
            if isinstance(element, cst.DictElement):
                found |= _classes_named(ctx, dotted_name(element.value), stack, depth)
        return found
    return _classes_named(ctx, dotted_name(func), stack, depth)


def _classes_named(ctx: FileContext, name: str | None, stack: Stack, depth: int) -> set[str]:
    """A local class, or what a local module-level function returns (`return ResNet(...)`)."""
    if name in ctx.classes:
        return {name}
    factories = [info for info in ctx.functions.get(name or "", ()) if not info.stack]
    if len(factories) != 1:
        return set()
    found: set[str] = set()
    for node in walk_expression(factories[0].node.body):
        if isinstance(node, cst.Return) and node.value is not None:
            returned = peel(ctx, node.value)
            if isinstance(returned, cst.Call):
                found |= built_classes(ctx, returned, stack, depth + 1)
    return found


def model_classes(ctx: FileContext, name: str) -> set[str]:
    """The local class ``name`` and the local classes its body instantiates, transitively."""
    calls = _classes(ctx).calls
    found: set[str] = set()
    todo = [name]
    while todo:
        current = todo.pop()
        if current in found or current not in ctx.classes:
            continue
        found.add(current)
        todo.extend(calls.get(current, ()))
    return found


def conv2d_classes(ctx: FileContext) -> set[str]:
    """Local classes whose bodies build 2-D convolutions or a zoo CNN, directly, through a
    module-level function of the file (`self.model = create_model()` returning a resnet18) or
    through other local classes they instantiate."""
    index = _classes(ctx)
    if index.conv2d is None:
        builders = {
            function.name.value for site in ctx.calls
            if (ctx.qualname(site.node.func) in CONV2D or _builds_zoo_cnn(ctx, site)) and ctx.class_of(site.stack) is None
            and isinstance(function := ctx.function_of(site.stack), cst.FunctionDef)
        }
        direct = {
            name for name, sites in index.sites.items()
            if any(ctx.qualname(site.node.func) in CONV2D or _builds_zoo_cnn(ctx, site) or site.func in builders
                   for site in sites)
        }
        index.conv2d = {name for name in ctx.classes if model_classes(ctx, name) & direct}
    return index.conv2d


def _builds_zoo_cnn(ctx: FileContext, site: CallSite) -> bool:
    zoo = zoo_architecture(ctx, site.node, site.stack)
    return zoo is not None and is_conv_architecture(zoo[1])


@dataclass
class _ClassIndex:
    sites: dict[str, list[CallSite]]  # local class -> the calls in its body (methods included)
    calls: dict[str, set[str]]  # local class -> the local classes it instantiates
    conv2d: set[str] | None = None


_CLASSES: WeakKeyDictionary[FileContext, _ClassIndex] = WeakKeyDictionary()


def _classes(ctx: FileContext) -> _ClassIndex:
    index = _CLASSES.get(ctx)
    if index is None:
        sites: dict[str, list[CallSite]] = {}
        for site in ctx.calls:
            for frame in site.stack:
                if frame.kind is FrameKind.CLASS and isinstance(frame.node, cst.ClassDef):
                    sites.setdefault(frame.node.name.value, []).append(site)
        calls = {
            name: {called for site in found if (called := dotted_name(site.node.func)) in ctx.classes}
            for name, found in sites.items()
        }
        index = _CLASSES[ctx] = _ClassIndex(sites, calls)
    return index


# ---------------------------------------------------------------- matrix multiplications
def multiplies_matrices(ctx: FileContext, expr: cst.BaseExpression, stack: Stack) -> bool:
    """May the network that ``expr`` builds multiply matrices outside cuDNN's convolutions
    (Linear, attention, RNN layers, `@`, `torch.matmul`)? False only when all its layers are
    known to be others: the conv-only generators and discriminators of DCGAN, SRCNN."""
    built = peel(ctx, expr)
    if not isinstance(built, cst.Call) or zoo_architecture(ctx, built, stack) is not None:
        return True
    classes = built_classes(ctx, built, stack)
    if classes:
        return any(_class_multiplies(ctx, name) for name in classes)
    facts = _project_builder(ctx, built)
    if facts is not None:
        return facts.matmul
    if not (ctx.qualname(built.func) or "").startswith("torch.nn."):
        return True
    calls = [node for node in walk_expression(built) if isinstance(node, cst.Call)]  # `nn.Sequential(nn.Conv2d(...), ...)`
    return any(_call_multiplies(ctx, call, stack, set()) for call in calls)


def _class_multiplies(ctx: FileContext, name: str) -> bool:
    found = _MULTIPLIES.setdefault(ctx, {})
    if name not in found:
        found[name] = True  # a class that builds itself stays unknown
        found[name] = _body_multiplies(ctx, ctx.classes[name].node, set())
    return found[name]


_MULTIPLIES: WeakKeyDictionary[FileContext, dict[str, bool]] = WeakKeyDictionary()


def _body_multiplies(ctx: FileContext, node: cst.CSTNode, seen: set[int]) -> bool:
    """A class or function of this file: its `@` operators, the classes it names (`ResNet(BasicBlock,
    ...)`, `Block(...)`) and what its calls build."""
    seen.add(id(node))
    for child in walk_expression(node):
        if isinstance(child, cst.BinaryOperation) and isinstance(child.operator, cst.MatrixMultiply):
            return True
        if isinstance(child, cst.Name) and child.value in ctx.classes and ctx.classes[child.value].node is not node:
            if _class_multiplies(ctx, child.value):
                return True
        site = ctx.site_of(child) if isinstance(child, cst.Call) else None
        if site is not None and _call_multiplies(ctx, site.node, site.stack, seen):
            return True
    return False


def _call_multiplies(ctx: FileContext, call: cst.Call, stack: Stack, seen: set[int]) -> bool:
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value in MATMUL_METHODS:
        return True
    qualified = ctx.qualname(func)
    if qualified is not None:
        facts = _project_builder(ctx, call)
        if facts is not None:
            return facts.matmul
        return layer_kind(qualified) in ("matmul", "rnn", "opaque")
    name = dotted_name(func)
    if name is not None and name.startswith("self.") and name.count(".") == 1:
        # `self.encoder(src)`: built in this class (walked with it) or handed in (unknown)
        built = class_assignments(ctx, name, stack)
        return not built or any(not isinstance(peel(ctx, a.value), cst.Call) for a in built)
    function = ctx.function_of(stack)
    if isinstance(function, cst.FunctionDef) and name in {p.name.value for p in function.params.params}:
        return True  # `block(inplanes, planes)`: a layer class handed in
    for info in ctx.functions.get(name or "", ()):  # a helper of this file (`conv3x3(...)`)
        if not info.stack and id(info.node) not in seen and _body_multiplies(ctx, info.node, seen):
            return True
    return False


def _own_method(ctx: FileContext, name: str | None, stack: Stack) -> bool:
    """`self.label2onehot(...)`: a method of the class around ``stack``, not a network."""
    owner = class_of(stack)
    if owner is None or not name or not name.startswith("self."):
        return False
    return any(info.class_name == owner.name.value for info in ctx.functions.get(name[5:], ()))


def class_assignments(ctx: FileContext, name: str, stack: Stack) -> list[Assignment]:
    """The assignments of `self.x` in every method of the class around ``stack``, except those
    that only move or wrap it (`self.G = self.G.to(device)`)."""
    owner = class_of(stack)
    if owner is None:
        return []
    return [
        a for infos in ctx.functions.values() for info in infos if info.class_name == owner.name.value
        for a in ctx.assignments_in(info.node, name) if name not in code_of(a.value)
    ]


def training_multiplies_matrices(ctx: FileContext) -> bool:
    """May the file's training multiply matrices outside convolutions: in its trained models, in
    the other networks its steps call (a frozen feature extractor) or in the step code itself?
    False only when every one of them is known (conv-only DCGAN or super-resolution training)."""
    for site in ctx.calls:
        if not ctx.in_training_loop(site.stack):
            continue
        func = site.node.func
        if layer_kind(ctx.qualname(func)) == "matmul" or isinstance(func, cst.Attribute) and func.attr.value in MATMUL_METHODS:
            return True  # `torch.matmul(...)`, `F.linear(...)` in the step
    for loop in ctx.step_loops:
        if any(isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.MatrixMultiply) for n in walk_expression(loop)):
            return True
    networks = step_networks(ctx)
    for name, stack in networks.items():
        assignments = network_assignments(ctx, name, stack)
        if not assignments:
            handed = handed_network(ctx, name, stack)
            if handed is not None and not handed[1]:
                continue  # a conv net of another file's class, handed in by every caller
            return True  # a parameter, an attribute set elsewhere: unknown
        calls = [(call, a.stack) for a in assignments if isinstance(call := peel(ctx, a.value), cst.Call)]
        if not calls and (name in dict(trained_models(ctx)) or _from_parameter(ctx, assignments)):
            return True  # a trained model built in a way not read here, or handed to a constructor
        for call, at in calls:  # `Tensor = torch.cuda.FloatTensor if cuda else ...` is no network
            if multiplies_matrices(ctx, call, at):
                return True  # also what wraps a module (`parallelize_module(model, ...)`): unknown
    return not networks


def _from_parameter(ctx: FileContext, assignments: list[Assignment]) -> bool:
    """`self.model = model` in a constructor (Speech-Transformer's `Solver(data, model, ...)`):
    may the network its callers pass multiply matrices (unknown: it may)?"""
    for assignment in assignments:
        value = peel(ctx, assignment.value)
        function = function_of(assignment.stack)
        if isinstance(value, cst.Name) and isinstance(function, cst.FunctionDef) and any(
                param.name.value == value.value for param in function.params.params):
            handed = handed_network(ctx, value.value, assignment.stack)
            if handed is None or handed[1]:
                return True
    return False


def handed_network(ctx: FileContext, name: str, stack: Stack) -> tuple[bool, bool] | None:
    """(builds convolutions, may multiply matrices) of the network that other files hand to the
    parameter ``name`` of the module-level function around ``stack``, a class of theirs
    (``Links.networks``), or to the constructor of its class around ``stack``; None when that
    is not known."""
    called = ctx.called_by_others_as(stack)
    if called is None:
        return None
    return next(((conv, matmul) for callee, param, conv, matmul in ctx.links.networks
                 if callee == called and param == name), None)


_NAME_READS: WeakKeyDictionary[FileContext, Counter[str]] = WeakKeyDictionary()


def _name_reads(ctx: FileContext) -> Counter[str]:
    """How often the file reads each plain name (one walk per file): not an attribute's name
    (`args.vae`), not a plain assignment's target (`x = ...`; `x.y = ...` and `x[i] = ...` read x)."""
    found = _NAME_READS.get(ctx)
    if found is None:
        found = _NAME_READS[ctx] = Counter()
        todo: list[cst.CSTNode] = [ctx.module]
        while todo:
            node = todo.pop()
            kind = type(node)
            if kind is cst.Name:
                found[node.value] += 1
            elif kind is cst.Attribute:
                todo.append(node.value)
            elif not (kind is cst.AssignTarget and type(node.target) is cst.Name):
                todo.extend(child_list(node))
    return found


def never_used(ctx: FileContext, site: CallSite) -> bool:
    """Is the network that ``site`` builds assigned to a plain name that nothing reads
    afterwards (fast-DiT's `vae = AutoencoderKL.from_pretrained(...).to(device)`, left over once
    the latents were extracted ahead): it never runs, so it says nothing of the training."""
    name = _built_into(ctx, site)
    if name is None:
        return False
    return _name_reads(ctx)[name] == 0


def runs_only_periodically(ctx: FileContext, site: CallSite) -> bool:
    """Is the network that ``site`` builds assigned to a plain name that is read only where the
    training loop calls it every N steps (REPA's VAE: `vae.decode(samples)` under `if global_step %
    args.sampling_steps == 0:`)? Its work is a sample now and then, not the training's."""
    name = _built_into(ctx, site)
    if name is None:
        return False
    periodic = [call for call in ctx.calls
                if (call.func == name or (call.func or "").startswith(name + "."))
                and ctx.in_training_loop(call.stack) and not ctx.is_hot(call.stack)
                and all(_now_and_then(frame.node.test) for frame in call.stack
                        if frame.kind is FrameKind.GUARD and isinstance(frame.node, cst.If))]
    return bool(periodic) and len(periodic) == _name_reads(ctx)[name]


def _now_and_then(test: cst.BaseExpression) -> bool:
    """A guard that holds on one step in N, N not 1 or 2: `step % N == 0` or `not step % N`,
    also inside `and`/`or` (`step == 1 or step % N == 0`), never `step % N != 0`."""
    def one_in_n(modulo: cst.BaseExpression) -> bool:
        if not (isinstance(modulo, cst.BinaryOperation) and isinstance(modulo.operator, cst.Modulo)):
            return False
        return not (isinstance(modulo.right, cst.Integer) and int(modulo.right.value, 0) <= 2)

    found = False
    for node in walk_expression(test):
        if isinstance(node, cst.Comparison) and len(node.comparisons) == 1:
            sides = (node.left, node.comparisons[0].comparator)
            if not any(one_in_n(side) for side in sides):
                continue
            if not isinstance(node.comparisons[0].operator, cst.Equal) or \
                    not any(isinstance(side, cst.Integer) and side.value == "0" for side in sides):
                return False  # `step % N != 0`, `step % N == 1`: most steps, or an unknown share
            found = True
        elif isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not) \
                and one_in_n(node.expression):
            found = True
    return found


def _built_into(ctx: FileContext, site: CallSite) -> str | None:
    """The plain name ``site``'s statement assigns what it builds to (`vae = ....to(device)`)."""
    statement = site.statement
    if statement is None or len(statement.body) != 1 or not isinstance(statement.body[0], cst.Assign):
        return None
    assign = statement.body[0]
    if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name) \
            or peel(ctx, assign.value) is not site.node:
        return None
    return assign.targets[0].target.value


def step_networks(ctx: FileContext) -> dict[str, Stack]:
    """The networks the training runs, by name: the models the optimizers update, and the local
    objects the training steps call (`self.model(**inputs)`, a frozen feature extractor), not the
    losses or the file's own methods."""
    networks: dict[str, Stack] = {}
    for model, site in [*trained_models(ctx), *optimizer_factories(ctx)]:
        networks.setdefault(model, site.stack)
    for site in ctx.calls:
        if not ctx.in_training_loop(site.stack):
            continue
        name = dotted_name(site.node.func)
        if is_local_object(ctx, name) and not LOSS_NAME.search(name or "") and not _own_method(ctx, name, site.stack):
            networks.setdefault(name, site.stack)  # type: ignore[arg-type]
    return networks


def network_assignments(ctx: FileContext, name: str, stack: Stack) -> list[Assignment]:
    """Where the network ``name`` gets its value: `self.model = ...` in any method of the class,
    or the fresh assignments of a variable in its scope."""
    return class_assignments(ctx, name, stack) if name.startswith("self.") else fresh_assignments(ctx, name, stack, None)


def run_first(ctx: FileContext, assignments: list[Assignment]) -> list[Assignment]:
    """``assignments`` with those a run takes first: `if args.model == "Autoformer": model = ...`
    comes last when every launch command of the project passes `--model TimeLLM`."""
    return sorted(assignments, key=lambda assignment: in_no_run(ctx, assignment.statement, assignment.stack))


def view_calls(ctx: FileContext, classes: set[str]) -> list[CallSite]:
    """`.view(...)` calls in the bodies of these local classes."""
    return [
        site for name in sorted(classes) for site in _classes(ctx).sites.get(name, ())
        if isinstance(site.node.func, cst.Attribute) and site.node.func.attr.value == "view"
    ]


_RESHAPES = frozenset({"view", "reshape", "unsqueeze", "squeeze", "flatten", "permute", "transpose", "unflatten"})


def reshapes_its_input(ctx: FileContext, class_name: str) -> bool:
    """Does the `forward` of local class ``class_name`` reshape its input (`x.view(-1, 1, 28, 28)`,
    `x.unsqueeze(1)`), so that the batch it gets need not be 4-D?"""
    for info in ctx.functions.get("forward", ()):
        params = info.node.params.params
        if info.class_name != class_name or len(params) < 2:
            continue
        name = params[1].name.value
        # Only the input itself: `x = self.conv1(x)` and later `torch.flatten(x, 1)` is not it.
        rebound = [a.statement for a in ctx.assignments_in(info.node, name) if a.statement is not None]
        first = rebound[0] if rebound else None
        for site in _classes(ctx).sites.get(class_name, ()):
            if ctx.function_of(site.stack) is not info.node or site.statement is None:
                continue
            if first is not None and site.statement is not first and not comes_before(ctx, site.statement, first):
                continue
            func = site.node.func
            if isinstance(func, cst.Attribute) and func.attr.value in _RESHAPES and dotted_name(func.value) == name:
                return True
            if (ctx.qualname(func) or "").rpartition(".")[2] in _RESHAPES and site.node.args and dotted_name(site.node.args[0].value) == name:
                return True
    return False


def is_module_class(ctx: FileContext, name: str) -> bool:
    return ctx.is_subclass_of(name, *NN_MODULE)


# ---------------------------------------------------------------- the trained model
def optimizer_parameters(ctx: FileContext, site: CallSite) -> cst.BaseExpression | None:
    """What an optimizer call is given to update: its first argument, or the `params=` that
    hydra's `instantiate` passes on."""
    args = site.node.args
    if _instantiates(ctx, site):
        return next((arg.value for arg in args if arg.keyword is not None and arg.keyword.value == "params"), None)
    return args[0].value if args else None


def optimizes_tensors_only(ctx: FileContext, name: str, stack: Stack) -> bool:
    """Is the optimizer bound to ``name`` (`self.log_lambda_optimizer`) made, wherever it is, over
    a list of standalone tensors (`torch.optim.SGD([self.log_lambda], lr=...)`: a Lagrange
    multiplier, SAC's entropy temperature), no module's parameters? Its step runs no network."""
    made = class_assignments(ctx, name, stack) if name.startswith("self.") else ctx.assignments_in_scope(name, stack)
    if not made:
        return False
    for assignment in made:
        value = assignment.value
        site = ctx.site_of(value) if isinstance(value, cst.Call) else None
        params = optimizer_parameters(ctx, site) if site is not None and is_optimizer_call(ctx, site) else None
        if not isinstance(params, (cst.List, cst.Tuple)) or not params.elements or not all(
                isinstance(element, cst.Element) and isinstance(element.value, (cst.Name, cst.Attribute))
                for element in params.elements):  # (a module in the list would raise: these are tensors)
            return False
    return True


def optimized_module(ctx: FileContext, site: CallSite) -> str | None:
    """`X` in `Optimizer(X.parameters(), ...)`, in its param groups, or in a variable that holds
    them (`params = model.parameters()`): the one module whose parameters an optimizer updates."""
    params = optimizer_parameters(ctx, site)
    if params is None:
        return None
    roots = _parameter_roots(ctx, params, site.stack, depth=0)
    if len(roots) != 1:
        return None
    root = roots.pop()
    return None if root == "self" else root


def _parameter_roots(ctx: FileContext, expr: cst.BaseExpression, stack: Stack, depth: int) -> set[str]:
    receivers = [
        dotted_name(node.func.value)
        for node in walk_expression(expr)
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and _gives_parameters(node.func)
        and not _module_helper(ctx, node.func)
    ]
    roots = {r.split(".")[0] if not r.startswith("self.") else ".".join(r.split(".")[:2]) for r in receivers if r}
    if not roots and isinstance(expr, cst.Call):
        group = _param_group_helper_model(ctx, expr)
        if group is not None:
            roots = {group}
    if not roots and isinstance(expr, cst.Name) and depth < 2:
        for assignment in ctx.assignments_in_scope(expr.value, stack):
            roots |= _parameter_roots(ctx, assignment.value, stack, depth + 1)
    if not roots and depth == 0:
        roots = _function_parameter_roots(ctx, stack)  # groups filled in a loop over `model.named_parameters()`
    return {_unaliased(ctx, root, stack) for root in roots}


def _module_helper(ctx: FileContext, method: cst.Attribute) -> bool:
    """`utils.get_params_groups(student)`, `lrd.param_groups_lrd(model, ...)`: a param-group helper
    of an imported module (DINO, MAE), not a method of the model; its argument is the model."""
    return method.attr.value not in ("parameters", "named_parameters") and ctx.qualname(method.value) is not None


def _gives_parameters(method: cst.Attribute) -> bool:
    """`model.parameters()`, `named_parameters()`, or a method of the model's own that hands
    out a share of them (`model.get_1x_lr_params()` for a backbone's lower learning rate,
    `model.trainable_params()`): not a method of the parsed options."""
    name = method.attr.value
    if name in ("parameters", "named_parameters"):
        return True
    receiver = dotted_name(method.value) or ""
    return "param" in name.lower() and receiver.split(".", 1)[0] not in _OPTIONS_NAMES


def _function_parameter_roots(ctx: FileContext, stack: Stack) -> set[str]:
    """The one module whose `.parameters()`/`.named_parameters()` the function around ``stack``
    reads (`for name, p in model.named_parameters(): decay.append(p)`), else nothing."""
    function = ctx.function_of(stack)
    found = {
        dotted_name(site.node.func.value) for site in ctx.calls  # type: ignore[attr-defined]
        if isinstance(site.node.func, cst.Attribute) and site.node.func.attr.value in ("parameters", "named_parameters")
        and ctx.function_of(site.stack) is function
    }
    roots = {r.split(".")[0] if not r.startswith("self.") else ".".join(r.split(".")[:2]) for r in found if r}
    return roots if len(roots) == 1 and None not in found else set()


_OPTIMIZER_BASES = ("torch.optim.Optimizer", "torch.optim.optimizer.Optimizer")
# What scripts call their parsed options: never the model.
_OPTIONS_NAMES = frozenset({"args", "cfg", "config", "opt", "opts", "hparams", "options", "params"})
# Words in the name of a helper that turns a model into optimizer param groups:
# torchvision's `set_weight_decay(model, wd)`, timm's `param_groups_weight_decay(model, wd)`,
# MAE's `param_groups_lrd(model, ...)`.
_PARAM_GROUP_WORDS = ("weight_decay", "param_group", "parameter_group", "params")


def _param_group_helper_model(ctx: FileContext, call: cst.Call) -> str | None:
    """`set_weight_decay(model, 1e-4)`: the model a param-group helper of the project or a
    library (not torch itself) is given as its first argument."""
    name = (dotted_name(call.func) or "").rsplit(".", 1)[-1].lower()
    qualified = ctx.qualname(call.func) or ""
    if not any(word in name for word in _PARAM_GROUP_WORDS) or qualified.startswith("torch.") or not call.args:
        return None
    first = call.args[0]
    model = dotted_name(first.value) if first.keyword is None and not first.star else None
    return model if model and "." not in model else None


def _unaliased(ctx: FileContext, name: str, stack: Stack) -> str:
    """`model_without_ddp = model` (or `= model.module`) everywhere it is assigned: `model`."""
    found = ctx.assignments_in_scope(name, stack)
    targets = {_unwrapped_name(value) for a in found
               for value in ((a.value.body, a.value.orelse) if isinstance(a.value, cst.IfExp) else (a.value,))}
    if found and len(targets) == 1 and None not in targets:
        target = targets.pop()
        if target and "." not in target and target != name:
            return target
    return name


def _unwrapped_name(value: cst.BaseExpression) -> str | None:
    """`model.module` (the module a DDP wrapper holds) or `model`: `model`."""
    if isinstance(value, cst.Attribute) and value.attr.value == "module":
        return dotted_name(value.value)
    return dotted_name(value)


_INSTANTIATE_LEAVES = frozenset(name.rsplit(".", 1)[-1] for name in INSTANTIATE)


def _instantiates(ctx: FileContext, site: CallSite) -> bool:
    """`hydra.utils.instantiate(...)` (however imported)."""
    return (site.func or "").rsplit(".", 1)[-1] in _INSTANTIATE_LEAVES and ctx.call_qualname(site) in INSTANTIATE


def is_optimizer_call(ctx: FileContext, site: CallSite) -> bool:
    """`torch.optim.AdamW(...)` (or another library's: `transformers.AdamW`, `bnb.optim.AdamW8bit`),
    also chosen by name: `getattr(torch.optim, args.optimizer)(...)`,
    or an optimizer class of the file's own built on `torch.optim.Optimizer` (a hand-written LARS
    or LAMB for large-batch training), or the one a hydra config names, handed the parameters
    (`hydra.utils.instantiate(cfg.optimizer, params=model.parameters())`): it updates the model's
    parameters all the same."""
    func = site.node.func
    if _instantiates(ctx, site):
        params = optimizer_parameters(ctx, site)
        return params is not None and any(
            isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and _gives_parameters(node.func)
            for node in walk_expression(params))
    if type(func) is cst.Call and dotted_name(func.func) == "getattr" and func.args:
        return ctx.qualname(func.args[0].value) == "torch.optim"
    if type(func) is cst.Name and func.value in ctx.classes:
        return ctx.is_subclass_of(func.value, *_OPTIMIZER_BASES)
    qualified = ctx.call_qualname(site)
    if not qualified:
        if type(func) is not cst.Name:
            return False
        # `optimizer_cls = torch.optim.AdamW` (diffusers: `bnb.optim.AdamW8bit` under `--use_8bit_adam`)
        chosen = [ctx.qualname(a.value) or "" for a in ctx.assignments_in_scope(func.value, site.stack)]
        return bool(chosen) and all(_optimizer_class(name) for name in chosen)
    return _optimizer_class(qualified) or _project_optimizer(ctx, site, qualified)


def _optimizer_class(qualified: str) -> bool:
    if qualified.startswith(OPTIMIZER_PREFIX):
        return not qualified.startswith("torch.optim.lr_scheduler")
    return qualified.startswith(LIBRARY_OPTIMIZERS)


def in_optimizer_class(ctx: FileContext, stack: Stack) -> bool:
    """Is code at ``stack`` inside an optimizer class of the file (`class KFACOptimizer(optim.Optimizer)`
    building an inner `optim.SGD` over the parameters it is handed): the optimizer's own workings,
    not a training script; the model it updates is built and trained by whoever builds it."""
    owner = ctx.class_of(stack)
    return owner is not None and ctx.is_subclass_of(owner.name.value, *_OPTIMIZER_BASES)


def _project_optimizer(ctx: FileContext, site: CallSite, qualified: str) -> bool:
    """`SAM(model.parameters(), torch.optim.SGD, ...)` where another file of the project says
    `class SAM(torch.optim.Optimizer)`: handed a model's parameters, a class of the project built
    on `torch.optim.Optimizer` (sharpness-aware minimisation, LARS, LAMB) updates them."""
    args = site.node.args
    if ctx.project is None or qualified.startswith("torch.") or not args or args[0].keyword is not None:
        return False
    if not any(type(node) is cst.Call and type(node.func) is cst.Attribute and _gives_parameters(node.func)
               for node in walk_expression(args[0].value)):
        return False  # the cheap test first: only then is the other file read
    defined = project_class(ctx.project, qualified, beside_script=True)
    return defined is not None and bool(set(defined.bases) & set(_OPTIMIZER_BASES))


def returns_torch_optimizer(ctx: FileContext, factory: str) -> bool:
    """Does every function or method of this file named ``factory`` return a `torch.optim`
    optimizer it builds (`def _select_optimizer(self): return optim.Adam(...)`)?"""
    functions = {info.node for info in ctx.functions.get(factory, ())}
    if not functions:
        return False
    returning = {ctx.function_of(site.stack) for site in ctx.calls
                 if ctx.function_of(site.stack) in functions and is_optimizer_call(ctx, site)
                 and is_returned(ctx.function_of(site.stack), site)}  # type: ignore[arg-type]
    return returning == functions


def trained_models(ctx: FileContext) -> list[tuple[str, CallSite]]:
    """(model name, the optimizer call) for each `torch.optim` optimizer over one model, in order
    (found once per file: rules ask for every forward pass)."""
    if ctx not in _TRAINED:
        found: list[tuple[str, CallSite]] = []
        for site in ctx.calls:
            if not is_optimizer_call(ctx, site) or only_restored(ctx, site):
                continue
            model = optimized_module(ctx, site)
            if model is not None:
                found.append((model, site))
        _TRAINED[ctx] = found
    return list(_TRAINED[ctx])


def only_restored(ctx: FileContext, site: CallSite) -> bool:
    """An optimizer that a file with no training step makes only to load a checkpoint's state
    into it (votenet's eval.py and demo.py: `optimizer = optim.Adam(...)`, then
    `optimizer.load_state_dict(checkpoint[...])`, and nothing steps it): its model is evaluated."""
    statement = site.statement
    if ctx.drives_training or ctx.links.trained_by is not None or statement is None or len(statement.body) != 1:
        return False
    small = statement.body[0]
    if not (isinstance(small, cst.Assign) and small.value is site.node and len(small.targets) == 1
            and isinstance(small.targets[0].target, cst.Name)):
        return False
    name = small.targets[0].target.value
    scope = ctx.function_of(site.stack) or ctx.module
    reads = restores = 0
    for node in walk_expression(scope):
        if isinstance(node, cst.Name) and node.value == name:
            reads += 1
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "load_state_dict" \
                and isinstance(node.func.value, cst.Name) and node.func.value.value == name:
            restores += 1
    return restores > 0 and reads == restores + 1  # the assignment's target, and the receivers of its restores


_TRAINED: WeakKeyDictionary[FileContext, list[tuple[str, CallSite]]] = WeakKeyDictionary()


def self_optimizing_classes(ctx: FileContext) -> set[str]:
    """Module classes of the file that make an optimizer over their own parameters
    (`self.optimizer = optim.RMSprop(self.parameters(), lr=lr)` in a DQN's network): their
    objects are trained, by whatever file steps that optimizer."""
    found: set[str] = set()
    for site in ctx.calls:
        owner = class_of(site.stack)
        if owner is None or not site.node.args or not is_module_class(ctx, owner.name.value):
            continue
        params = optimizer_parameters(ctx, site)
        if params is not None and is_optimizer_call(ctx, site) and _parameter_roots(ctx, params, site.stack, depth=1) == {"self"}:
            found.add(owner.name.value)
    return found


def frozen_before(ctx: FileContext, site: CallSite) -> bool:
    """Are the parameters of the module an optimizer is handed frozen first, in the same function
    (`for param in model.parameters(): param.requires_grad = False`, then the classifier's
    unfrozen; MoCo's linear probe freezes all but `fc` by name in `model.named_parameters()`), in
    every run (no `if` around the loop): a fine-tune of a head, whose update touches a few
    parameters whatever the kernels."""
    model = optimized_module(ctx, site)
    if model is None:
        return False
    function = ctx.function_of(site.stack)
    for info in ctx.loops.values():
        call = info.iter
        if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
                and (call.func.attr.value, len(info.targets)) in (("parameters", 1), ("named_parameters", 2))
                and dotted_name(call.func.value) == model
                and ctx.function_of(info.stack) is function and info.node.body is not None):
            continue
        if any(True for _ in gates(ctx, info.node)):
            continue  # frozen only in some runs (sr3's `if opt['model']['finetune_norm']:`)
        if _submodule_unfrozen(ctx, model, function):
            return False  # `model.unet.requires_grad_(True)` afterwards: most of the model trains again
        target = info.targets[-1]  # `param` of `for name, param in model.named_parameters():`
        for node in walk_expression(info.node.body):
            if isinstance(node, cst.Assign) and isinstance(node.value, cst.Name) and node.value.value == "False" and any(
                    dotted_name(t.target) == f"{target}.requires_grad" for t in node.targets):
                return True
            if isinstance(node, cst.Call) and dotted_name(node.func) == f"{target}.requires_grad_" and node.args \
                    and isinstance(node.args[0].value, cst.Name) and node.args[0].value.value == "False":
                return True
    return False


def _submodule_unfrozen(ctx: FileContext, model: str, function: cst.CSTNode | None) -> bool:
    """Does ``function`` switch a whole submodule of ``model`` back on (`model.unet.requires_grad_(True)`,
    fastcomposer), rather than a head picked by name?"""
    for site in ctx.method_calls("requires_grad_"):
        receiver = dotted_name(site.node.func.value) if isinstance(site.node.func, cst.Attribute) else None
        first = site.node.args[0].value if site.node.args else None
        on = first is None or isinstance(first, cst.Name) and first.value == "True"
        if on and receiver is not None and receiver.startswith(model + ".") and ctx.function_of(site.stack) is function:
            return True
    return False


def optimized_modules(ctx: FileContext) -> set[str]:
    """Every module whose parameters some optimizer updates, also those sharing one optimizer
    (a CycleGAN's `Adam(itertools.chain(G_AB.parameters(), G_BA.parameters()))`)."""
    found: set[str] = set()
    for site in ctx.calls:
        params = optimizer_parameters(ctx, site)
        if params is not None and is_optimizer_call(ctx, site):
            found |= _parameter_roots(ctx, params, site.stack, depth=0)
    return found | {model for model, _ in optimizer_factories(ctx)}


def optimizer_factories(ctx: FileContext) -> list[tuple[str, CallSite]]:
    """(model, call) for optimizers made by a factory that takes the model itself
    (`create_optimizer_v2(model, ...)` in timm, `set_optimizer(opt, model)`) or by the model
    (`model.configure_optimizers(...)`)."""
    found: list[tuple[str, CallSite]] = list(_parameters_handed_in(ctx))
    for site in ctx.calls:
        leaf = (site.func or "").rsplit(".", 1)[-1].lower()
        if "optimizer" in leaf and leaf.startswith("configure") and isinstance(site.node.func, cst.Attribute):
            # nanoGPT's `raw_model.configure_optimizers(...)`: the model makes its own optimizer
            receiver = dotted_name(site.node.func.value)
            if receiver and "." not in receiver and receiver not in _OPTIONS_NAMES:
                found.append((_unaliased(ctx, receiver, site.stack), site))
            continue
        if "optimizer" in leaf and _factory_verb(leaf) and not leaf.endswith(_SETTERS) and site.node.args:
            # the model is the first name that is not the options (timm: `create_optimizer(args, model)`)
            names = [dotted_name(arg.value) for arg in site.node.args if arg.keyword is None and not arg.star]
            # (not the optimizer itself: `set_optimizer_lr(optimizer, lr_scheduler_func, epoch)`)
            candidates = [n for n in names if n and n not in _OPTIONS_NAMES and "optim" not in n.lower()]
            name = candidates[0] if candidates else None
            if name is not None and _NOT_MODELS.search(name):
                # 1d-tokenizer's `create_optimizer(config, logger, model, loss_module)`: the model, not the logger
                name = next((n for n in candidates[1:] if _MODEL_NAME.search(n) and not _NOT_MODELS.search(n)), None)
            if name and "." not in name and not _holds_parameters(ctx, name, site.stack):
                found.append((_unaliased(ctx, name, site.stack), site))
    return found


# Names that hold no model: the run's helpers a factory is handed beside it.
_NOT_MODELS = re.compile(r"(^|_)(logger|log|writer|accelerator|device|tokenizer|processor|dataset|loader|dataloader|"
                         r"scheduler|scaler|wandb|tb)s?($|_)", re.IGNORECASE)
_MODEL_NAME = re.compile(r"model|net|policy|actor|critic|generator|discriminator|encoder|decoder", re.IGNORECASE)

_FACTORY_VERBS = ("create", "build", "make", "get", "set", "init", "initialize")
# ... unless it sets a value of an optimizer it is given (`set_optimizer_lr(optimizer, lr_fn, epoch)`)
_SETTERS = ("_lr", "_lrs", "_learning_rate", "_momentum", "_state")


def _factory_verb(leaf: str) -> bool:
    """Does the (lower-cased) function name start with a verb that makes an optimizer, as a word
    of its own (`set_optimizer`, `createoptimizer`), not a longer one (Fabric's
    `setup_optimizers(optimizer)` wraps an optimizer it is given)?"""
    return any(leaf.startswith(verb) and leaf[len(verb):].startswith(("_", "optim")) for verb in _FACTORY_VERBS)


def _parameters_handed_in(ctx: FileContext) -> list[tuple[str, CallSite]]:
    """(model, the caller's call) for a function of the file that makes an optimizer over
    parameters it is given (`def get_train_utils(opt, model_parameters): ... SGD(model_parameters,
    ...)`), called with a model's parameters (`get_train_utils(opt, model.parameters())`, or a
    variable holding them): the caller's model is trained."""
    found: list[tuple[str, CallSite]] = []
    for site in ctx.calls:
        first = site.node.args[0].value if site.node.args and site.node.args[0].keyword is None else None
        if type(first) is not cst.Name:
            continue
        function = ctx.function_of(site.stack)
        if type(function) is not cst.FunctionDef or not is_optimizer_call(ctx, site):
            continue
        params = [param.name.value for param in function.params.params]
        if first.value not in params or ctx.assignments_in(function, first.value):
            continue
        position = params.index(first.value)
        helpers = ctx.functions.get(function.name.value, [])
        if len(helpers) != 1 or helpers[0].node is not function or helpers[0].class_name is not None:
            continue
        for caller in ctx.calls:
            if caller.func != function.name.value:
                continue
            handed = find_argument(ctx, caller, first.value, position).node
            roots = _parameter_roots(ctx, handed, caller.stack, depth=1) if handed is not None else set()
            if len(roots) == 1 and (root := roots.pop()) != "self":
                found.append((root, caller))
    return found


def _holds_parameters(ctx: FileContext, name: str, stack: Stack) -> bool:
    """Does ``name`` hold parameters rather than a model (`param_groups = get_param_groups(model)`,
    `params = model.parameters()`): a factory given them (`get_optimizer(param_groups, args)`)
    is not given the model."""
    value = ctx.single_value(name, stack)
    called = (dotted_name(value.func) or "").rsplit(".", 1)[-1] if isinstance(value, cst.Call) else ""
    return "param" in name.lower() or "param" in called.lower()


@dataclass(frozen=True)
class Build:
    """An assignment that builds the model (`model = Net().to(device)`)."""

    assignment: Assignment
    built: cst.Call  # the constructor or factory call inside it


def builds(ctx: FileContext, model: str, stack: Stack, before: cst.BaseStatement | None, depth: int = 0) -> list[Build]:
    """The fresh assignments to ``model`` (see ``fresh_assignments``) that build a module; for a
    parameter of a module-level function the file calls (wavegrad's `_train_impl(replica_id,
    model, ...)`), the ones that build what each call passes (`model = WaveGrad(params).cuda()`)."""
    found: list[Build] = []
    for assignment in fresh_assignments(ctx, model, stack, before):
        built = peel(ctx, assignment.value)
        if isinstance(built, cst.Call) and builds_module(ctx, built, assignment.stack):
            found.append(Build(assignment, built))
    if not found and depth < 2 and "." not in model:
        for value, at in passed_arguments(ctx, model, stack) or ():
            if isinstance(value, cst.Name):
                found += builds(ctx, value.value, at, None, depth + 1)
    return found


def fresh_assignments(ctx: FileContext, model: str, stack: Stack, before: cst.BaseStatement | None) -> list[Assignment]:
    """Assignments that give ``model`` a new value in the scope of ``stack``, before the
    statement ``before``: not the ones that wrap, move or convert it (`model = DDP(model)`)."""
    return [
        assignment for assignment in ctx.assignments_in_scope(model, stack)
        if not (assignment.unpacked or assignment.augmented or assignment.statement is None)
        and (before is None or comes_before(ctx, assignment.statement, before))
        and not reads(assignment.value, model.split(".")[0])
    ]


def reads(node: cst.CSTNode, name: str) -> bool:
    """Does ``node`` read the variable ``name`` (not an attribute or a keyword of that name)?"""
    skipped: set[int] = set()
    for child in walk_expression(node):
        kind = type(child)
        if kind is cst.Attribute:
            skipped.add(id(child.attr))
        elif kind is cst.Arg and child.keyword is not None:
            skipped.add(id(child.keyword))
        elif kind is cst.Name and child.value == name and id(child) not in skipped:
            return True
    return False


def builds_module(ctx: FileContext, call: cst.Call, stack: Stack) -> bool:
    if zoo_architecture(ctx, call, stack) is not None:
        return True
    classes = built_classes(ctx, call, stack)
    if classes:
        return any(is_module_class(ctx, name) or name in conv2d_classes(ctx) for name in classes)
    qualified = ctx.qualname(call.func) or ""
    if _NOT_MODULES.search(dotted_name(call.func) or qualified):
        return False  # `AutoTokenizer.from_pretrained(...)`, an image processor, a config
    if qualified.startswith("torch.nn.") and qualified.endswith("Loss"):
        return False  # `nn.MSELoss()`: a module by class, but it has no weights to run (MTGNN's `evaluateL2`)
    if qualified.endswith(".from_pretrained") or qualified.startswith("torch.nn.") or project_conv_dims(ctx, call):
        return True
    return isinstance(call.func, cst.Attribute) and call.func.attr.value == "from_pretrained"


# What a Hugging Face `from_pretrained` loads that is no module: tokenizers, processors, configs.
_NOT_MODULES = re.compile(r"(Tokenizer(Fast)?|Processor|FeatureExtractor|Config)\.from_pretrained$")


# ---------------------------------------------------------------- where the model runs
def model_names(ctx: FileContext, model: str, stack: Stack) -> dict[cst.CSTNode | None, set[str]]:
    """Function (None: module level) -> the names the model goes by there: the variable, the
    wrappers made of it (`ddp_model = DDP(model)`), and the parameters of same-file functions
    it is passed to (`train(loader, model, ...)`), two calls deep."""
    home = ctx.function_of(stack)
    names: dict[cst.CSTNode | None, set[str]] = {home: {model}}
    for target, assignments in ctx.assignments_by_function.get(home, {}).items():
        for assignment in assignments:
            wrapped = wrapper_of(ctx, assignment.value)
            if wrapped and dotted_name(wrapped[1].args[0].value) == model:
                names[home].add(target)
    for _ in range(2):
        for site in ctx.calls:
            caller = names.get(ctx.function_of(site.stack))
            callee = ctx.functions.get(dotted_name(site.node.func) or "", [])
            if not caller or len(callee) != 1:
                continue
            params = [p.name.value for p in callee[0].node.params.params]
            for index, arg in enumerate(site.node.args):
                if dotted_name(arg.value) not in caller or arg.star:
                    continue
                param = arg.keyword.value if arg.keyword is not None else (params[index] if index < len(params) else None)
                if param is not None:
                    names.setdefault(callee[0].node, set()).add(param)
    return names




def step_method(ctx: FileContext, model: str) -> str | None:
    """The method of its own through which the training loop runs ``model`` when it never calls
    the model itself (`loss = self.model.compute_loss(batch)`, diffusion_policy's policies; also
    through DDP's `.module`): a compiled `forward` would not run there."""
    if model == "self":
        return None  # a module's own step: it calls its submodules
    method = None
    for site in ctx.calls:
        if not ctx.in_training_loop(site.stack):
            continue
        func = site.func
        if func is None or not func.startswith(model):
            continue
        rest = func[len(model):].removeprefix(".module")
        if rest in ("", ".forward"):
            return None  # `model(x)`: the forward runs
        leaf = rest[1:]
        if rest.startswith(".") and "." not in leaf and leaf not in MODULE_API and ctx.is_hot(site.stack):
            method = method or leaf
    return method


def model_aliases(ctx: FileContext, model: str, function: cst.CSTNode | None) -> set[str]:
    """``model`` and the names ``function`` binds to it as it is (`self.model = model`, or
    `self.model, self.optimizer = model, optimizer` in a trainer class's `__init__`): the model
    is wrapped and moved under those names too (`self.model = DataParallel(self.model)`)."""
    names = {model}
    for target, assignments in ctx.assignments_by_function.get(function, {}).items():
        for assignment in assignments:
            value = assignment.part if assignment.unpacked else assignment.value
            if not assignment.augmented and value is not None and dotted_name(value) == model:
                names.add(target)
    return names


def calls_in_training_step(ctx: FileContext, names: dict[cst.CSTNode | None, set[str]]) -> list[CallSite]:
    """Calls of the model (under any of its ``names``) that run on every training step."""
    return [
        site for site in ctx.calls
        if site.func is not None and site.func in names.get(ctx.function_of(site.stack), ())
        and ctx.is_hot(site.stack)
    ]


def may_train(ctx: FileContext) -> bool:
    """Does the file train, or may it through what it calls: a step loop, a call of another
    file's training loop, a backward pass or an optimizer of its own, a Lightning Trainer it
    builds and fits? An inference, evaluation or demo script does none of these."""
    return ctx.drives_training or any(True for _ in ctx.method_calls("backward")) \
        or any(is_optimizer_call(ctx, site) for site in ctx.calls) \
        or bool(ctx.calls_to(*LIGHTNING_TRAINER, *LIGHTNING_CLI)) and any(True for _ in ctx.method_calls("fit"))


def skips_submodules(ctx: FileContext) -> str | None:
    """A module class of this file whose `forward` calls one of its submodules only in some
    calls: under an `if` on one of its arguments (`if not uncond_fwd: self.reference_unet(...)`),
    or after an `if` on one that returns. In the steps that skip it, the submodule's parameters
    get no gradient (DDP then needs `find_unused_parameters=True`). Its name, or None (or the
    module the file imports that has one: ``Links.skips_submodules``, imagen-pytorch's Unet with
    its optional conditioning, trained in trainer.py). A test of `self.training` alone does not
    count: a training step always takes the same branch."""
    if ctx.links.skips_submodules is not None:
        return ctx.links.skips_submodules
    for name, info in ctx.classes.items():
        if not is_module_class(ctx, name):
            continue
        methods = {s.name.value for s in info.node.body.body if isinstance(s, cst.FunctionDef)}
        forward = next((s for s in info.node.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "forward"), None)
        if forward is None:
            continue
        params = forward.params
        arguments = {p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)} - {"self"}
        if arguments and _gated_submodule_call(forward.body, arguments, methods, gated=False):
            return name
    return None


def _gated_submodule_call(block: cst.BaseSuite, arguments: set[str], methods: set[str], *, gated: bool) -> bool:
    statements = list(block.body) if isinstance(block, cst.IndentedBlock) else [block]
    for statement in statements:
        if isinstance(statement, cst.If):
            on_argument = bool(read_names(statement.test) & arguments)
            branches: list[cst.BaseSuite] = [statement.body]
            if isinstance(statement.orelse, cst.If):  # an `elif`: an `if` of its own in the `else`
                branches.append(cst.IndentedBlock(body=[statement.orelse]))
            elif statement.orelse is not None:
                branches.append(statement.orelse.body)
            if any(_gated_submodule_call(branch, arguments, methods, gated=gated or on_argument) for branch in branches):
                return True
            body = statement.body.body if isinstance(statement.body, cst.IndentedBlock) else []
            if on_argument and body and isinstance(body[-1], cst.SimpleStatementLine) \
                    and any(isinstance(small, cst.Return) for small in body[-1].body):
                gated = True  # `if return_features: return x`: what follows runs only in some calls
        elif isinstance(statement, cst.BaseCompoundStatement):
            inner = [statement.body] + ([statement.orelse.body] if getattr(statement, "orelse", None) is not None else [])
            if any(_gated_submodule_call(body, arguments, methods, gated=gated) for body in inner if body is not None):
                return True
        elif gated and any(isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
                           and isinstance(node.func.value, cst.Name) and node.func.value.value == "self"
                           and node.func.attr.value not in methods for node in walk_expression(statement)):
            return True
    return False


# ---------------------------------------------------------------- layers wrapped in a class
@dataclass(frozen=True)
class ConvWrapper:
    """A class of the file that only wraps one convolution (Tacotron's `ConvNorm`: `self.conv =
    nn.Conv1d(..., bias=bias)` in `__init__`, `return self.conv(x)` in `forward`)."""

    name: str
    # the `__init__` parameter (less `self`, by position) the convolution's `bias` comes from,
    # True by default; None when the convolution always has its bias (no `bias=` given to it)
    bias: tuple[str, int] | None


def conv_wrapper(ctx: FileContext, name: str) -> ConvWrapper | None:
    """The class ``name`` of the file, when it only wraps a convolution with a bias by default."""
    if name not in ctx.classes:
        return None
    methods = {info.node.name.value: info.node for info in
               (*ctx.functions.get("__init__", ()), *ctx.functions.get("forward", ())) if info.class_name == name}
    init, forward = methods.get("__init__"), methods.get("forward")
    if not isinstance(init, cst.FunctionDef) or not isinstance(forward, cst.FunctionDef):
        return None
    layers = [site for site in ctx.calls if ctx.function_of(site.stack) is init
              and (ctx.qualname(site.node.func) or "").startswith("torch.nn.") and not (ctx.qualname(site.node.func) or "").startswith("torch.nn.init.")]
    if len(layers) != 1 or ctx.qualname(layers[0].node.func) not in CONV_LAYERS:
        return None
    conv = layers[0]
    line = conv.statement.body[0] if conv.statement is not None and len(conv.statement.body) == 1 else None
    attribute = dotted_name(line.targets[0].target) if isinstance(line, cst.Assign) and len(line.targets) == 1 \
        and line.value is conv.node else None
    used = [node for node in walk_expression(forward.body) if isinstance(node, cst.Call)]
    if attribute is None or [dotted_name(node.func) for node in used] != [attribute]:
        return None  # its forward does more than run the convolution
    bias = find_argument(ctx, conv, "bias", 7)
    if bias.missing:
        return ConvWrapper(name, None)
    if isinstance(bias.node, cst.Name) and bias.node.value == "True":
        return ConvWrapper(name, None)
    params = [param.name.value for param in init.params.params][1:]
    if not isinstance(bias.node, cst.Name) or bias.node.value not in params:
        return None
    param = init.params.params[params.index(bias.node.value) + 1]
    if not (isinstance(param.default, cst.Name) and param.default.value == "True"):
        return None
    return ConvWrapper(name, (bias.node.value, params.index(bias.node.value)))
