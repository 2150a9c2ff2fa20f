"""How much is at stake in a script: the questions a finding's impact depends on.

Is a DataLoader the one the training loop iterates, or one only evaluation reads? How big is the
model the script trains, counted from the layers the file writes? The answers are estimates from
the code; a rule turns them into an impact (``Rule.report(impact=...)``), and a benchmark
measurement of the script decides over them (``speedfix.engine.impact``).
"""

from __future__ import annotations

import re
from enum import Enum
from functools import wraps
from typing import Any, Callable, TypeVar
from weakref import WeakKeyDictionary

import libcst as cst

from speedfix.model.arguments import find_argument, literal_int
from speedfix.model.context import FileContext
from speedfix.model.flow import assigned_name, is_returned, returned_at
from speedfix.model.frames import FrameKind, Stack
from speedfix.model.frameworks import lightning_fits, lightning_loader_hooks
from speedfix.model.index import CallSite
from speedfix.model.loaders import in_evaluation_branch
from speedfix.model.model_size import estimated_parameters
from speedfix.model.networks import (builds, built_classes, fresh_assignments, is_conv_architecture, may_train,
                                      model_classes, optimized_module, peel, project_builds_matmuls, project_builds_rnn,
                                      project_conv_dims, project_known_matmuls, trained_models, zoo_architecture)
from speedfix.model.patterns import EVALUATION_FUNCTION, NO_GRAD, OPTIMIZER_PREFIX, unwrap_iterable
from speedfix.project.steps import CONV_LAYERS, MATMUL_LAYERS, MATMUL_METHODS, layer_kind
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import parameter_default, walk_expression

T = TypeVar("T")


# ---------------------------------------------------------------- which loader
class Role(Enum):
    TRAINING = "training"  # its batches feed the training step
    EVALUATION = "evaluation"  # only validation, test or prediction reads it
    UNKNOWN = "unknown"


# `val_loader`, `testloader`, `eval_dataloader`, `self.valid_dl`, `cv_loader` (cross-validation),
# Lightning's `val_dataloader()`
_EVALUATION_NAME = re.compile(
    r"(?:^|[._])(?:val|valid|validation|cv|eval|evaluation|test|testing|predict|prediction|inference|dev)"
    r"(?:_|loader|dataloader|set|data|dl|$)",
    re.IGNORECASE,
)
_TRAINING_NAME = re.compile(r"(?:^|[._])train", re.IGNORECASE)


_ANSWERS: WeakKeyDictionary[FileContext, dict[str, object]] = WeakKeyDictionary()
_SITE_ANSWERS: WeakKeyDictionary[FileContext, dict[tuple[str, int], object]] = WeakKeyDictionary()


def per_site(question: Callable[[FileContext, CallSite], T]) -> Callable[[FileContext, CallSite], T]:
    """A question about one call of the file, answered once per call (the DataLoader rules and
    the impact estimates ask it of the same loader). Keyed by the call's node: the file's tree
    lives as long as its answers, so no other node takes its id meanwhile."""
    @wraps(question)
    def answer(ctx: FileContext, site: CallSite) -> T:
        answers = _SITE_ANSWERS.setdefault(ctx, {})
        key = (question.__name__, id(site.node))
        if key not in answers:
            answers[key] = question(ctx, site)
        return answers[key]  # type: ignore[return-value]
    return answer


def per_file(question: Callable[[FileContext], T]) -> Callable[[FileContext], T]:
    """A question about the whole file, answered once per file (every finding's impact asks it)."""
    @wraps(question)
    def answer(ctx: FileContext) -> T:
        answers = _ANSWERS.setdefault(ctx, {})
        if question.__name__ not in answers:
            answers[question.__name__] = question(ctx)
        return answers[question.__name__]  # type: ignore[return-value]
    return answer


def named_for_evaluation(name: str | None) -> bool:
    """Is ``name`` a loader's name that says evaluation (`test_loader`, `self.val_dl`)?"""
    return name is not None and bool(_EVALUATION_NAME.search(name)) and not _TRAINING_NAME.search(name)


@per_site
def loader_role(ctx: FileContext, site: CallSite) -> Role:
    """Does the DataLoader made at ``site`` feed the training step, or only evaluation?

    Where the loader is iterated decides: in a training loop, or around one (directly or through
    a function of the file it is passed to), or only in loops that take no optimizer step (a loop that yields
    the batches on, in a generator, is neither). A loader iterated nowhere else in the file is
    judged by its name (`test_loader`, Lightning's `val_dataloader()`)."""
    names = _loader_names(ctx, site)
    seen_training = seen_other = False
    for loop, iterates in _iterations(ctx, names):
        if iterates:
            if loop in ctx.training_loops:
                seen_training = True
            elif not _yields(loop):  # `for batch in loader: yield batch` hands the batches on
                seen_other = True
    if seen_training:
        return Role.TRAINING
    if seen_other:
        return Role.EVALUATION
    words = [name for name in names if name]
    if any(_EVALUATION_NAME.search(name) for name in words):
        return Role.EVALUATION
    if any(_TRAINING_NAME.search(name) for name in words):
        return Role.TRAINING
    return Role.EVALUATION if in_evaluation_branch(ctx, site) else Role.UNKNOWN


@per_site
def evaluation_feed(ctx: FileContext, site: CallSite) -> bool:
    """Does the DataLoader made at ``site`` only feed evaluation (``loader_role``), and no
    function of another scanned file that trains is handed it (`train_one_epoch(model,
    loader)` of `engine.py` trains on a loader this file also validates with)? Pinned memory
    and persistent workers are not worth advising for such a loader: its batches leave no
    training step waiting. Only in a file whose training the scan sees (a step loop of its own,
    or a call of another file's training loop): elsewhere a loop without a visible step may be
    the training loop itself (`for x, y in loader: train(x, y)`); or in a file that trains with
    Lightning's `trainer.fit` and hands the loader on only for validation, by a keyword that
    says so (`System(..., val_loader=val_loader)`, `fit(model, val_dataloaders=loader)`)."""
    if loader_role(ctx, site) is not Role.EVALUATION:
        return False
    if _lightning_evaluation_hook(ctx, site) or _evaluation_factory(ctx, site) or _beside_the_fed_loader(ctx, site) \
            or in_evaluation_branch(ctx, site) or _read_in_evaluation_methods(ctx, site):
        return True
    if not ctx.drives_training and not (lightning_fits(ctx) and _handed_for_evaluation(ctx, site)):
        return False
    names = _loader_names(ctx, site)
    for call in ctx.calls:
        if any(not arg.star and dotted_name(arg.value) in names for arg in call.node.args):
            callee = ctx.project_callee(call)
            if callee is not None and (callee.trains or callee.steps):
                return False
    return True


def _read_in_evaluation_methods(ctx: FileContext, site: CallSite) -> bool:
    """A loader named for evaluation (`self.eval_dataloader`) that only functions named for it
    iterate (`def eval(self):`), where the training loop of the file is another's to see (a
    trainer base class whose `train()` calls steps its subclasses define)."""
    names = _loader_names(ctx, site)
    if not any(_EVALUATION_NAME.search(name) for name in names if name):
        return False
    loops = [loop for loop, iterates in _iterations(ctx, names) if iterates]
    return bool(loops) and all(
        isinstance(function := ctx.function_of(ctx.loops[loop].stack), cst.FunctionDef)
        and EVALUATION_FUNCTION.match(function.name.value) is not None for loop in loops)


_LIGHTNING_EVALUATION_HOOKS = frozenset({"val_dataloader", "test_dataloader", "predict_dataloader"})


def _lightning_evaluation_hook(ctx: FileContext, site: CallSite) -> bool:
    """A loader a class method `val_dataloader()` (or `test_`, `predict_`) returns, or a method a
    LightningModule/DataModule assigns to those hooks only (`self.val_dataloader =
    partial(self._val_dataloader, shuffle=False)`, latent diffusion's `DataModuleFromConfig`):
    Lightning's hook for the evaluation loops, which never feed a training step."""
    function = ctx.function_of(site.stack)
    if (isinstance(function, cst.FunctionDef) and function.name.value in _LIGHTNING_EVALUATION_HOOKS
            and any(frame.kind is FrameKind.CLASS for frame in site.stack)):
        return True
    hooked = lightning_loader_hooks(ctx, site)
    return bool(hooked) and hooked <= _LIGHTNING_EVALUATION_HOOKS


def _evaluation_factory(ctx: FileContext, site: CallSite) -> bool:
    """A loader returned by a module-level function named for evaluation (`get_test_dataloader`)
    of a library that a training script imports (``Links.trained_by``), when no training loop of
    another file is known to iterate it (``Links.feeds``, which may name its sibling
    `get_training_dataloader`): the scripts evaluate with it."""
    feeds = {feed[0] for feed in ctx.links.feeds}
    function = ctx.function_of(site.stack)
    return (bool(feeds or ctx.links.trained_by) and isinstance(function, cst.FunctionDef)
            and ctx.class_of(site.stack) is None and function.name.value not in feeds
            and named_for_evaluation(function.name.value) and is_returned(function, site))


def _beside_the_fed_loader(ctx: FileContext, site: CallSite) -> bool:
    """A loader a module-level function returns in a tuple beside the one that the training loops
    of other files iterate (`return train_loader, test_loader`, where every caller unpacks
    `train_loader, val_loader = get_cifar100_dataloaders(...)` and trains on the first): the
    scripts evaluate with it."""
    function = ctx.function_of(site.stack)
    if not isinstance(function, cst.FunctionDef) or ctx.class_of(site.stack) is not None:
        return False
    feed = next((feed for feed in ctx.links.feeds if feed[0] == function.name.value), None)
    if feed is None or -1 in feed[4]:
        return False
    return is_returned(function, site) and not returned_at(function, site, feed[4])


def _handed_for_evaluation(ctx: FileContext, site: CallSite) -> bool:
    """Is the loader handed to other calls, and always for evaluation: by a keyword that names
    it (`val_loader=`, `val_dataloaders=`), or at the place of a Lightning Trainer's validation
    loader (`trainer.fit(model, train_loader, val_loader)`, `trainer.validate(model, loader)`),
    never elsewhere?"""
    loader = assigned_name(site)
    if loader is None:
        return False
    handed = [(call, index, arg) for call in ctx.calls for index, arg in enumerate(call.node.args)
              if not arg.star and dotted_name(arg.value) == loader]
    return bool(handed) and all(_EVALUATION_NAME.search(arg.keyword.value) if arg.keyword is not None
                                else _LIGHTNING_EVALUATION_PLACES.get(_method(call)) == index for call, index, arg in handed)


# The positional place of the evaluation loader in a Lightning Trainer's methods: `fit(model,
# train_dataloaders, val_dataloaders)`, `validate(model, dataloaders)`, `test(model, dataloaders)`
_LIGHTNING_EVALUATION_PLACES = {"fit": 2, "validate": 1, "test": 1}


def _method(call: CallSite) -> str | None:
    func = call.node.func
    return func.attr.value if isinstance(func, cst.Attribute) else None


def _yields(loop: cst.CSTNode) -> bool:
    """Does the loop hand what it iterates on (a generator that cycles a loader forever,
    `def sample_data(loader): while True: for batch in loader: yield batch`)? Whoever draws from
    the generator decides the loader's role, not this loop."""
    return any(isinstance(node, cst.Yield) for node in walk_expression(loop))


@per_site
def inference_feed(ctx: FileContext, site: CallSite) -> bool:
    """Does the DataLoader made at ``site`` feed a script that never trains (an evaluation,
    extraction or synthesis script: no step loop, backward pass or optimizer, no call of another
    file's training loop, and no scanned file that trains imports it) and evaluates (`model.eval()`,
    `torch.no_grad()`), which iterates it itself or in a function it hands it to (`extract(env,
    loader, model)`)? Its workers and pinned memory would speed up inference, not a training
    step. A loader a function returns (a factory) is not one: whoever calls it may train with it."""
    if not evaluation_script(ctx) or ctx.links.trained_by is not None or ctx.links.feeds:
        return False
    bound = assigned_name(site)
    return bound is not None and bool(_iterations(ctx, frozenset({bound})))


def evaluation_script(ctx: FileContext) -> bool:
    """Does the file never train (no step loop, backward pass or optimizer, no call of another
    file's training loop) and switch a model to evaluation (`model.eval()`) or autograd off
    (`torch.no_grad()`, `torch.inference_mode()`)? A loop without a visible step in a file that
    does neither may be the training loop itself (`for x, y in loader: step(x, y)`), and a
    Hugging Face `Trainer` script trains with no loop of its own."""
    return not may_train(ctx) and _evaluates(ctx)


def _evaluates(ctx: FileContext) -> bool:
    return any(not site.node.args for site in ctx.method_calls("eval")) or bool(ctx.calls_to(*NO_GRAD))


def _loader_names(ctx: FileContext, site: CallSite) -> frozenset[str]:
    """The variable the loader is bound to, and the function that returns it (`val_dataloader`)."""
    names = set()
    bound = assigned_name(site)
    if bound:
        names.add(bound)
    function = ctx.function_of(site.stack)
    if isinstance(function, cst.FunctionDef) and is_returned(function, site):
        names.add(function.name.value)
        names.update(_bound_from_calls(ctx, function, site))
    return frozenset(names)


def _bound_from_calls(ctx: FileContext, function: cst.FunctionDef, site: CallSite) -> set[str]:
    """The names the file binds the returned loader to where it calls ``function``: Informer's
    `train_data, train_loader = self._get_data(flag="train")` after `return data_set, data_loader`."""
    position = _returned_position(function, site)
    if position is None:
        return set()
    called = {function.name.value, f"self.{function.name.value}"}
    return {target for target, assignments in ctx.assignments.items() for a in assignments
            if isinstance(a.value, cst.Call) and dotted_name(a.value.func) in called and not a.augmented
            and a.position == (None if position < 0 else position) and a.unpacked == (position >= 0)}


def _returned_position(function: cst.FunctionDef, site: CallSite) -> int | None:
    """Where every `return` of ``function`` puts what ``site`` makes: -1 (the value itself), the
    index in the tuple it returns, or None (elsewhere, or the returns differ)."""
    name = assigned_name(site)
    found: set[int] = set()
    for node in walk_expression(function.body):
        if type(node) is not cst.Return or node.value is None:
            continue
        value = node.value
        if value is site.node or name is not None and dotted_name(value) == name:
            found.add(-1)
        elif isinstance(value, cst.Tuple):
            found.update(index for index, element in enumerate(value.elements)
                         if element.value is site.node or name is not None and dotted_name(element.value) == name)
    return found.pop() if len(found) == 1 else None


def _iterations(ctx: FileContext, names: frozenset[str]) -> list[tuple[cst.CSTNode, bool]]:
    """(loop, True) for each loop over the loader, or over the parameter of a function of the
    file that the loader is passed to (`test(model, test_loader)`)."""
    passes, loops = _loader_paths(ctx)
    found = [(loop, True) for name in names for loop, _ in loops.get(name, ())]
    for name in names:
        for function, param in passes.get(name, ()):
            found += [(loop, True) for loop, where in loops.get(param, ()) if where is function]
    return found


# Per file: argument name -> (function of the file, its parameter) it is passed to; the loops
# over each name -> (loop, the function around it). Made once: a file with many loaders asks often.
_PATHS: WeakKeyDictionary[FileContext, tuple[dict[str, list[tuple[cst.CSTNode, str]]],
                                             dict[str, list[tuple[cst.CSTNode, cst.CSTNode | None]]]]] = WeakKeyDictionary()


def _loader_paths(ctx: FileContext) -> tuple[dict[str, list[tuple[cst.CSTNode, str]]],
                                             dict[str, list[tuple[cst.CSTNode, cst.CSTNode | None]]]]:
    if ctx in _PATHS:
        return _PATHS[ctx]
    passes: dict[str, list[tuple[cst.CSTNode, str]]] = {}
    for call in ctx.calls:
        callees = ctx.functions.get(dotted_name(call.node.func) or "", [])
        if len(callees) != 1 or not isinstance(callees[0].node, cst.FunctionDef):
            continue
        params = [p.name.value for p in callees[0].node.params.params]
        if params and params[0] == "self":
            params = params[1:]
        for index, arg in enumerate(call.node.args):
            name = None if arg.star else dotted_name(arg.value)
            param = arg.keyword.value if arg.keyword is not None else (params[index] if index < len(params) else None)
            if name is not None and param is not None:
                passes.setdefault(name, []).append((callees[0].node, param))
    loops: dict[str, list[tuple[cst.CSTNode, cst.CSTNode | None]]] = {}
    for info in ctx.loops.values():
        iterable = unwrap_iterable(info.iter) if info.iter is not None else None
        if isinstance(iterable, cst.Name):  # `pbar = tqdm(loader)`, then `for x in pbar:`
            value = ctx.single_value(iterable.value, info.stack)
            if isinstance(value, cst.Call) and unwrap_iterable(value) is not value:
                iterable = unwrap_iterable(value)
        source = dotted_name(iterable) if iterable is not None else None
        if source is not None:
            loops.setdefault(source, []).append((info.node, ctx.function_of(info.stack)))
    _PATHS[ctx] = passes, loops
    return passes, loops


# ---------------------------------------------------------------- how often code runs
def runs_once(ctx: FileContext, stack: Stack, depth: int = 0) -> bool:
    """Does code at ``stack`` run once per training run, in a file that trains: outside every
    loop, at the top of the script or in the function that runs the epochs (a test pass after
    them), or in a function of the file that is only called from such places? False for code a
    loop repeats (a validation pass every epoch), and for a function whose callers the file
    does not show (another file's, a framework's hook) or that runs every step."""
    if not ctx.drives_training or depth > 3:
        return False
    for frame in reversed(stack):
        if frame.kind is FrameKind.LOOP:
            return False
        if frame.kind is FrameKind.FUNCTION:
            function = frame.node
            if function in ctx.hot_functions:
                return False
            callers = ctx.local_callers(function)
            if not callers and function not in _epoch_functions(ctx):
                return False  # called from elsewhere, maybe in a loop
            return all(runs_once(ctx, site.stack, depth + 1) for site in callers)
    return True


@per_file
def _epoch_functions(ctx: FileContext) -> set[cst.CSTNode]:
    """Functions that run the whole training: a training loop inside an epoch loop of their own
    (`def train(self): for epoch in ...: for batch in self.train_loader: ...`)."""
    found = set()
    for loop in ctx.step_loops:
        info = ctx.loops.get(loop)
        if info is None:
            continue
        for frame in reversed(info.stack):
            if frame.kind is FrameKind.LOOP:
                function = ctx.function_of(info.stack)
                if function is not None:
                    found.add(function)
                break
            if frame.kind in (FrameKind.FUNCTION, FrameKind.CLASS):
                break
    return found


# ---------------------------------------------------------------- how big a model
# Below this many parameters a model is small: its optimizer step, layout and kernel fusion
# are worth little next to the rest (a fused optimizer on an MNIST net).
SMALL_MODEL_PARAMETERS = 10_000_000
# From this many parameters a model is large: a step takes hundreds of milliseconds or more, so a
# fixed cost per step (a host sync) is a small share of it.
LARGE_MODEL_PARAMETERS = 1_000_000_000

_NN = "torch.nn."


def _linear(a: list[int | None]) -> int | None:
    return None if None in a[:2] or len(a) < 2 else a[0] * a[1] + a[1]  # type: ignore[operator]


def _conv(dims: int):  # type: ignore[no-untyped-def]
    def count(a: list[int | None]) -> int | None:
        if len(a) < 3 or None in a[:3]:
            return None
        return a[0] * a[1] * a[2] ** dims + a[1]  # type: ignore[operator]
    return count


def _embedding(a: list[int | None]) -> int | None:
    return None if len(a) < 2 or None in a[:2] else a[0] * a[1]  # type: ignore[operator]


def _recurrent(gates: int):  # type: ignore[no-untyped-def]
    def count(a: list[int | None]) -> int | None:
        if len(a) < 2 or None in a[:2]:
            return None
        size, hidden = a[0], a[1]
        layers = a[2] if len(a) > 2 and a[2] is not None else 1
        return gates * hidden * (size + hidden + 2) * layers  # type: ignore[operator]
    return count


def _norm(a: list[int | None]) -> int | None:
    return None if not a or a[0] is None else 2 * a[0]


def _attention(a: list[int | None]) -> int | None:
    return None if not a or a[0] is None else 4 * a[0] * a[0] + 4 * a[0]


# What a layer of torch.nn holds, from its positional sizes (in, out, kernel / num, dim / ...).
_LAYERS = {
    "Linear": _linear, "Bilinear": _linear, "Conv1d": _conv(1), "Conv2d": _conv(2), "Conv3d": _conv(3),
    "ConvTranspose1d": _conv(1), "ConvTranspose2d": _conv(2), "ConvTranspose3d": _conv(3),
    "Embedding": _embedding, "EmbeddingBag": _embedding, "LSTM": _recurrent(4), "GRU": _recurrent(3),
    "RNN": _recurrent(1), "LayerNorm": _norm, "BatchNorm1d": _norm, "BatchNorm2d": _norm, "BatchNorm3d": _norm,
    "InstanceNorm2d": _norm, "MultiheadAttention": _attention,
}
# torch.nn's names for those sizes, by position, when a call passes them by keyword.
_SIZE_KEYWORDS = {
    "in_features": 0, "out_features": 1, "in_channels": 0, "out_channels": 1, "kernel_size": 2,
    "num_embeddings": 0, "embedding_dim": 1, "input_size": 0, "hidden_size": 1, "num_layers": 2,
    "num_features": 0, "normalized_shape": 0, "embed_dim": 0,
}
# Layers with parameters whose size this table does not know: the model's size is unknown.
_UNSIZED = ("Transformer", "TransformerEncoder", "TransformerDecoder", "TransformerEncoderLayer",
            "TransformerDecoderLayer", "GroupNorm", "PReLU", "LazyLinear", "LazyConv2d")


def parameter_estimate(ctx: FileContext, call: cst.Call, stack: Stack) -> int | None:
    """The parameters of the network ``call`` builds, counted from the torch.nn layers the
    file's classes (or an inline `nn.Sequential`) create with sizes it can read: literals,
    constants, argparse defaults, products of them, parameter defaults; for a class of another
    scanned file, from the layers its facts record (``_other_file_parameters``). None when it
    cannot tell: a model zoo, `from_pretrained`, a size it cannot read."""
    built = peel(ctx, call)
    if not isinstance(built, cst.Call) or zoo_architecture(ctx, built, stack) is not None:
        return None
    classes = built_classes(ctx, built, stack)
    if classes:
        return _classes_parameters(ctx, classes)
    if (ctx.qualname(built.func) or "").startswith(_NN):
        return _count(ctx, [site for site in ctx.calls if _within(site.node, built)], stack)
    return _other_file_parameters(ctx, built, stack)


def _other_file_parameters(ctx: FileContext, call: cst.Call, stack: Stack) -> int | None:
    """The parameters of a class another scanned file defines (SRCNN's `models.SRCNN()`), from
    the layers its methods build (``ModuleFacts.class_layers``) with the sizes its constructor
    call gives or its `__init__` defaults; None where one cannot be read."""
    found = ctx.links.lookup(ctx.qualname(call.func))
    if found is None or "." in found[1]:
        return None
    classes = {name: (calls, params) for name, calls, params in ctx.links.modules[found[0]].class_layers}
    entry = classes.get(found[1])
    if entry is None:
        return None
    positional = [literal_int(ctx, arg.value, stack) for arg in call.args if arg.keyword is None and not arg.star]
    keywords = {arg.keyword.value: literal_int(ctx, arg.value, stack) for arg in call.args if arg.keyword is not None}
    if any(arg.star for arg in call.args):
        return None
    return _class_parameters(classes, found[1], positional, keywords, 0)


def _class_parameters(classes: dict[str, tuple[tuple[tuple[str, tuple[str, ...], int], ...], tuple[str, ...]]],
                      name: str, positional: list[int | None], keywords: dict[str, int | None], depth: int) -> int | None:
    entry = classes.get(name)
    if entry is None or depth > 4:
        return None
    calls, params = entry
    values: dict[str, int | None] = {}
    for index, param in enumerate(params):
        key, equals, default = param.partition("=")
        values[key] = (positional[index] if index < len(positional) else keywords[key] if key in keywords
                       else int(default) if equals else None)

    def value(text: str) -> int | None:
        return int(text) if text.isdigit() else values.get(text[1:]) if text.startswith("=") else None

    total = 0
    for callee, args, times in calls:
        given = [value(arg) for arg in args if ":" not in arg]
        named = {key: value(text) for arg in args if ":" in arg for key, text in [arg.split(":", 1)]}
        if callee.startswith("."):
            count = _class_parameters(classes, callee[1:], given, named, depth + 1)
        else:
            count = _layer_parameters(callee[len(_NN):], lambda: _with_keywords(given, named))
            if count is _NO_PARAMETERS:
                continue
        if count is None or times < 0:
            return None
        total += count * times
    return total or None


def _classes_parameters(ctx: FileContext, classes: set[str]) -> int | None:
    """The layers the classes create, and those of the local classes they instantiate."""
    return _count(ctx, _class_calls(ctx, classes), None)


def _class_calls(ctx: FileContext, classes: set[str]) -> list[CallSite]:
    """The calls written in the classes, and in the local classes they instantiate."""
    names = set().union(*(model_classes(ctx, name) for name in classes))
    return [site for site in ctx.calls if any(_in_class(site, name) for name in names)]


@per_file
def largest_trained_model(ctx: FileContext) -> int | None:
    """The parameters of the biggest model the script trains, when every one can be counted
    (None: no model, or one whose size the file does not show). A module that makes its own
    optimizer (Lightning's `configure_optimizers`: `Adam(self.parameters())`) is counted whole;
    a model of the Hugging Face Hub is as big as its config or checkpoint name says
    (``model_size``)."""
    counts: list[int | None] = []
    for site in _optimizers(ctx):
        model = optimized_module(ctx, site)
        owner = ctx.class_of(site.stack)
        if model is None or model.startswith("self."):
            mine = _of_self(site) or model is not None  # `Adam(self.parameters())`, or of `self.policy` alone
            counts.append(_classes_parameters(ctx, {owner.name.value}) if owner is not None and mine else None)
            continue
        counts += [parameter_estimate(ctx, b.built, b.assignment.stack)
                   for b in builds(ctx, model, site.stack, site.statement)] or [None]
    if not counts:
        counts = _engine_models(ctx)
    if counts and None not in counts:
        return max(counts)  # type: ignore[type-var]
    stated = estimated_parameters(ctx)  # a Hugging Face config or checkpoint that states its size
    if stated is None:
        return None
    return max([stated] + [count for count in counts if count is not None])


def _engine_models(ctx: FileContext) -> list[int | None]:
    """The parameters of each model handed to `deepspeed.initialize(model=...)`, whose optimizer
    its config names (deepspeedtrial: `model = FashionModel().cuda()`, an MLP of `model.py`)."""
    counts: list[int | None] = []
    for site in ctx.calls_to("deepspeed.initialize"):
        model = find_argument(ctx, site, "model", 1).node
        if not isinstance(model, cst.Name):
            continue
        made = [(peel(ctx, assignment.value), assignment.stack)
                for assignment in fresh_assignments(ctx, model.value, site.stack, site.statement)]
        counts += [parameter_estimate(ctx, built, stack) if isinstance(built, cst.Call) else None
                   for built, stack in made] or [None]
    return counts


@per_file
def trains_hub_model(ctx: FileContext) -> bool:
    """Does the script train a Hugging Face transformer (`AutoModel.from_pretrained(...)`,
    `Qwen2ForCausalLM(config)`, directly or from a factory function of the file)?"""
    for model, site in trained_models(ctx):
        for build in builds(ctx, model, site.stack, site.statement):
            call = peel(ctx, build.built)
            if not isinstance(call, cst.Call):
                continue
            factories = ctx.functions.get(dotted_name(call.func) or "", [])
            places = [call] + [info.node for info in factories if len(factories) == 1]
            if any(isinstance(node, cst.Call) and _from_hub(ctx, node) for place in places for node in walk_expression(place)):
                return True
    return False


def _from_hub(ctx: FileContext, call: cst.Call) -> bool:
    qualified = ctx.qualname(call.func) or ""
    return qualified.startswith("transformers.") or (dotted_name(call.func) or "").endswith(".from_pretrained")


def _optimizers(ctx: FileContext) -> list[CallSite]:
    return [site for site in ctx.calls if (q := ctx.call_qualname(site) or "").startswith(OPTIMIZER_PREFIX)
            and not q.startswith("torch.optim.lr_scheduler")]


def _of_self(site: CallSite) -> bool:
    """`Adam(self.parameters())`, `Adam(self.net.parameters())`: a module's own optimizer."""
    first = site.node.args[0].value if site.node.args else None
    return isinstance(first, cst.Call) and (dotted_name(first.func) or "").startswith("self.")


def _in_class(site: CallSite, name: str) -> bool:
    return any(frame.kind is FrameKind.CLASS and isinstance(frame.node, cst.ClassDef) and frame.node.name.value == name
               for frame in site.stack)


def _within(node: cst.CSTNode, outer: cst.CSTNode) -> bool:
    return node is outer or any(child is node for child in walk_expression(outer))


# A layer without parameters of its own: activations, pooling, dropout, containers.
_NO_PARAMETERS = object()


def _layer_parameters(layer: str, sizes: Callable[[], list[int | None]]) -> Any:
    """The parameters of the torch.nn layer ``layer`` (`Conv2d`) with its ``sizes`` (by position,
    worked out only for a layer that has parameters); None when unknown, ``_NO_PARAMETERS``."""
    if layer in _UNSIZED:
        return None
    counter = _LAYERS.get(layer)
    return _NO_PARAMETERS if counter is None else counter(sizes())


def _with_keywords(given: list[int | None], named: dict[str, int | None]) -> list[int | None]:
    """Sizes by position, those passed by keyword (`kernel_size=3`) put in their place."""
    sizes = list(given)
    for key, size in named.items():
        index = _SIZE_KEYWORDS.get(key)
        if index is not None:
            sizes += [None] * (index + 1 - len(sizes))
            sizes[index] = size
    return sizes


def _count(ctx: FileContext, sites: list[CallSite], stack: Stack | None) -> int | None:
    total = 0
    for site in sites:
        qualified = ctx.qualname(site.node.func) or ""
        if not qualified.startswith(_NN):
            continue
        count = _layer_parameters(qualified[len(_NN):],
                                  lambda: _layer_sizes(ctx, site, stack if stack is not None else site.stack))
        if count is _NO_PARAMETERS:
            continue
        repeat = _repeats(ctx, site)
        if count is None or repeat is None:
            return None
        total += count * repeat
    return total or None  # no layer it knows: parameters made by hand (`nn.Parameter(...)`)


def _layer_sizes(ctx: FileContext, site: CallSite, where: Stack, given: Given | None = None) -> list[int | None]:
    """A torch.nn layer's sizes by position (in, out, kernel / num, dim / ...), None where unknown;
    ``given``: what the class's constructor call gives the parameters of the `__init__` the layer
    is built in."""
    init, values = given if given is not None else (None, {})
    in_init = init is not None and ctx.function_of(site.stack) is init

    def size(node: cst.BaseExpression) -> int | None:
        found = _size(ctx, node, where)
        if found is None and in_init and isinstance(node, cst.Name) and node.value in values:
            found = _size(ctx, *values[node.value])
        return found

    sizes = [size(arg.value) for arg in site.node.args if arg.keyword is None and not arg.star]
    for arg in site.node.args:  # `nn.Conv2d(1, 16, kernel_size=5)`, `nn.LSTM(8, 64, num_layers=2)`
        index = _SIZE_KEYWORDS.get(arg.keyword.value) if arg.keyword is not None else None
        if index is not None:
            sizes += [None] * (index + 1 - len(sizes))
            sizes[index] = size(arg.value)
    return sizes


# An MLP no wider than this multiplies matrices too small for tensor cores to matter: a 256x256
# matmul on a batch of 256 is 34 MFLOP, a few microseconds even without tensor cores (tens of
# TFLOP/s), about what launching its kernel costs (arithmetic, not a measurement).
NARROW_WIDTH = 256
_SHAPELESS = frozenset({"LayerNorm", "BatchNorm1d"})  # parameters, but no matmul


@per_file
def trains_narrow_mlps_only(ctx: FileContext) -> bool:
    """Is every model the script trains an MLP of `nn.Linear` layers (with activations, dropout
    and norms) whose stated widths are all at most ``NARROW_WIDTH`` (TD3's 256-wide actor and
    critics; an input or output width the environment or the data decides may stay unknown)?
    False when any model, or any of its layers, is something else or cannot be read."""
    return _trains_mlps_only(ctx, NARROW_WIDTH)


@per_file
def trains_mlps_only(ctx: FileContext) -> bool:
    """Is every model the script trains an MLP of `nn.Linear` layers (with activations, dropout
    and norms), whatever its widths: no convolution or recurrent layer for cuDNN to run? False
    when any model, or any of its layers, is something else or cannot be read."""
    return _trains_mlps_only(ctx, None)


def _trains_mlps_only(ctx: FileContext, width: int | None) -> bool:
    found = False
    for site in _optimizers(ctx):
        model = optimized_module(ctx, site)
        owner = ctx.class_of(site.stack)
        if model is None:
            return False
        if model.startswith("self."):
            if owner is None or _beyond_a_head(*_class_layers(ctx, {owner.name.value})):
                return False
            layers: list[tuple[list[CallSite], Stack | None, Given]] = [(_class_calls(ctx, {owner.name.value}), None, _NOTHING)]
        else:
            layers = []
            found_builds = builds(ctx, model, site.stack, site.statement)
            if not found_builds:
                return False  # a model built where the scan cannot see
            for build in found_builds:
                built = peel(ctx, build.built)
                if not isinstance(built, cst.Call) or zoo_architecture(ctx, built, build.assignment.stack) is not None:
                    return False
                classes = built_classes(ctx, built, build.assignment.stack)
                if classes and _beyond_a_head(*_class_layers(ctx, classes)):
                    return False  # attention, recurrent layers, `x @ self.weight`
                if classes:
                    layers.append((_class_calls(ctx, classes), None, _constructor_arguments(ctx, built, build.assignment.stack)))
                elif (ctx.qualname(built.func) or "").startswith(_NN):  # an inline `nn.Sequential(...)`
                    layers.append(([s for s in ctx.calls if _within(s.node, built)], build.assignment.stack, _NOTHING))
                else:
                    return False
        if not all(_mlp(ctx, sites, stack, width, given) for sites, stack, given in layers):
            return False
        found = True
    return found


# The `__init__` a class is built with, and what its call gives that `__init__`'s parameters.
Given = tuple[cst.FunctionDef | None, dict[str, tuple[cst.BaseExpression, Stack]]]
_NOTHING: Given = (None, {})


def _constructor_arguments(ctx: FileContext, call: cst.Call, stack: Stack) -> Given:
    """What `SimpleClassifier(num_inputs=2, num_hidden=4, num_outputs=1)` (a class of the file,
    called by its name) gives the parameters of its `__init__` that it never rebinds, each with
    the stack of the call; nothing when a `*`/`**` argument hides which is which."""
    if not isinstance(call.func, cst.Name) or any(arg.star for arg in call.args):
        return _NOTHING
    init = next((info.node for info in ctx.functions.get("__init__", ()) if info.class_name == call.func.value), None)
    if not isinstance(init, cst.FunctionDef) or call.func.value not in ctx.classes:
        return _NOTHING
    names = [param.name.value for param in init.params.params][1:]  # less `self`
    values: dict[str, tuple[cst.BaseExpression, Stack]] = {}
    for index, arg in enumerate(call.args):
        name = arg.keyword.value if arg.keyword is not None else (names[index] if index < len(names) else None)
        if name is not None and not ctx.assignments_in(init, name):
            values[name] = (arg.value, stack)
    return init, values


def _mlp(ctx: FileContext, sites: list[CallSite], stack: Stack | None, width: int | None, given: Given) -> bool:
    """Are ``sites`` the layers of an MLP (no wider than ``width``, when given: every `Linear`'s
    stated sizes, or the sizes its class is built with, ``given``)?"""
    linears = 0
    for site in sites:
        qualified = ctx.qualname(site.node.func) or ""
        if qualified in MATMUL_LAYERS or layer_kind(qualified) == "sparse" or isinstance(site.node.func, cst.Attribute) \
                and site.node.func.attr.value in MATMUL_METHODS:
            return False  # matrices multiplied by hand (`torch.mm(x, self.weight)`, attention)
        if not qualified.startswith(_NN):
            continue
        layer = qualified[len(_NN):]
        if layer in _UNSIZED:
            return False
        if layer not in _LAYERS or layer in _SHAPELESS:
            continue
        if layer != "Linear":
            return False  # a convolution, an embedding, a recurrent layer, attention
        if width is not None:
            sizes = _layer_sizes(ctx, site, stack if stack is not None else site.stack, given)[:2]
            known = [size for size in sizes if size is not None]
            if not known or max(known) > width:
                return False
        linears += 1
    return linears > 0


def _repeats(ctx: FileContext, site: CallSite) -> int | None:
    """How many times a layer's call runs where it is written: 1, or the constant count of the
    `for _ in range(n)` loops around it inside the class (None: a count it cannot read)."""
    times = 1
    for frame in site.stack:
        if frame.kind is not FrameKind.LOOP:
            continue
        loop = frame.node
        if not isinstance(loop, cst.For) or not isinstance(loop.iter, cst.Call) or dotted_name(loop.iter.func) != "range":
            return None
        counts = [_size(ctx, arg.value, site.stack) for arg in loop.iter.args]
        if not counts or None in counts:
            return None
        times *= counts[0] if len(counts) == 1 else max(0, counts[1] - counts[0])  # type: ignore[operator]
    return times


def _size(ctx: FileContext, node: cst.BaseExpression, stack: Stack, depth: int = 0) -> int | None:
    if depth > 4:
        return None
    value = literal_int(ctx, node, stack)
    if value is not None:
        return value
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Multiply, cst.Add, cst.Subtract,
                                                                             cst.FloorDivide, cst.Power)):
        left, right = _size(ctx, node.left, stack, depth + 1), _size(ctx, node.right, stack, depth + 1)
        if left is None or right is None:
            return None
        operator = node.operator
        if isinstance(operator, cst.Multiply):
            return left * right
        if isinstance(operator, cst.Add):
            return left + right
        if isinstance(operator, cst.Subtract):
            return left - right
        if isinstance(operator, cst.Power):
            return left ** right if right < 8 else None
        return left // right if right else None
    if isinstance(node, cst.Call) and dotted_name(node.func) == "int" and len(node.args) == 1:
        return _size(ctx, node.args[0].value, stack, depth + 1)
    if isinstance(node, cst.Name):
        branches = ctx.assignments_in_scope(node.value, stack)  # `nc = 3` or `nc = 1` by data set: the larger
        values = [literal_int(ctx, a.value, a.stack) for a in branches if not (a.unpacked or a.augmented)]
        if values and len(values) == len(branches) and None not in values:
            return max(values)  # type: ignore[type-var]
        return _parameter_default(ctx, node.value, stack, depth)
    if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self":
        return _parameter_default(ctx, node.attr.value, stack, depth)
    return None


def _parameter_default(ctx: FileContext, name: str, stack: Stack, depth: int) -> int | None:
    """The default of the enclosing function's parameter ``name`` (`def __init__(self, hidden=128)`)."""
    default = parameter_default(ctx.function_of(stack), name)
    return _size(ctx, default, stack, depth + 1) if default is not None else None


# ---------------------------------------------------------------- where the time goes
@per_file
def conv_nets_only(ctx: FileContext) -> bool:
    """Is every model the script trains a conv net whose matmuls are at most a classifier head:
    a CNN of a model zoo, or a network (of this file or another scanned one) with convolutions
    and no attention, recurrent layer or matmul of its own? (cuDNN runs its convolutions in TF32
    by default, in any dimension.)"""
    found = False
    for model, site in trained_models(ctx):
        built = builds(ctx, model, site.stack, site.statement)
        if not built:
            return False
        for build in built:
            call = peel(ctx, build.built)
            if not isinstance(call, cst.Call) or not _conv_only(ctx, call, build.assignment.stack):
                return False
            found = True
    for name in _self_optimizing_classes(ctx):
        layers, nodes = _class_layers(ctx, {name})
        if not layers & CONV_LAYERS.keys() or _beyond_a_head(layers, nodes):
            return False
        found = True
    return found


def _self_optimizing_classes(ctx: FileContext) -> set[str]:
    """The classes of the file that make their own optimizer over their parameters (Lightning's
    `configure_optimizers`: `Adam(self.parameters())`): each is a model the script trains."""
    found = set()
    for site in _optimizers(ctx):
        owner = ctx.class_of(site.stack)
        if owner is not None and _of_self(site):
            found.add(owner.name.value)
    return found


@per_file
def matmul_nets(ctx: FileContext) -> bool:
    """Does the script train a model known to multiply matrices beyond a classifier head: a
    Hugging Face transformer, a zoo transformer, a network (of this file or another scanned one)
    with attention, recurrent layers or matmuls of its own, or of linear layers without
    convolutions (an MLP)? False when no model's layers are known (a factory of another package)."""
    if trains_hub_model(ctx) or any(_classes_multiply(ctx, {name}) for name in _self_optimizing_classes(ctx)):
        return True
    untraced = False  # a model passed in as a parameter (`def train(model, loader)`)
    for model, site in trained_models(ctx):
        built = builds(ctx, model, site.stack, site.statement)
        untraced = untraced or not fresh_assignments(ctx, model, site.stack, site.statement)
        for build in built:
            call = peel(ctx, build.built)
            if isinstance(call, cst.Call) and _multiplies(ctx, call, build.assignment.stack):
                return True
    if not untraced:
        return False
    # then the networks the file writes or loads decide
    return (any(_classes_multiply(ctx, {name}) for name in ctx.classes)
            or any(_from_hub(ctx, site.node) for site in ctx.calls))


def _multiplies(ctx: FileContext, call: cst.Call, stack: Stack) -> bool:
    zoo = zoo_architecture(ctx, call, stack)
    if zoo is not None:
        return zoo[1] is not None and not is_conv_architecture(zoo[1])
    classes = built_classes(ctx, call, stack)
    if classes:
        return _classes_multiply(ctx, classes)
    if (ctx.qualname(call.func) or "").startswith(_NN):  # an inline `nn.Sequential(...)`
        nodes = list(walk_expression(call))
        return _layers_multiply({ctx.qualname(node.func) for node in nodes if isinstance(node, cst.Call)}, nodes)
    return project_known_matmuls(ctx, call)


def _classes_multiply(ctx: FileContext, classes: set[str]) -> bool:
    return _layers_multiply(*_class_layers(ctx, classes))


def _class_layers(ctx: FileContext, classes: set[str]) -> tuple[set[str | None], list[cst.CSTNode]]:
    """The torch.nn layers the classes (and the local classes they build) call, and their nodes."""
    names = set().union(*(model_classes(ctx, name) for name in classes))
    layers = {ctx.qualname(site.node.func) for site in _class_calls(ctx, classes)}
    return layers, [node for name in names for node in walk_expression(ctx.classes[name].node)]


def _layers_multiply(layers: set[str | None], nodes: list[cst.CSTNode]) -> bool:
    """Attention, recurrent layers, matmuls written out, or linear layers without convolutions."""
    return _beyond_a_head(layers, nodes) or (_NN + "Linear" in layers and not layers & CONV_LAYERS.keys())


def _beyond_a_head(layers: set[str | None], nodes: list[cst.CSTNode]) -> bool:
    """Matmuls more than a classifier head's: attention, recurrent layers, `@`, `torch.matmul`."""
    return bool(layers & MATMUL_LAYERS) or any(isinstance(node, cst.BinaryOperation)
                                               and isinstance(node.operator, cst.MatrixMultiply) for node in nodes)


def _conv_only(ctx: FileContext, call: cst.Call, stack: Stack) -> bool:
    zoo = zoo_architecture(ctx, call, stack)
    if zoo is not None:
        return is_conv_architecture(zoo[1])
    classes = built_classes(ctx, call, stack)
    if not classes:  # a network of another scanned file
        return bool(project_conv_dims(ctx, call)) and not project_builds_rnn(ctx, call) and not project_builds_matmuls(ctx, call)
    layers, nodes = _class_layers(ctx, classes)
    return bool(layers & CONV_LAYERS.keys()) and not _beyond_a_head(layers, nodes)
