"""What one file tells the other files of a project, read with Python's own ``ast`` parser.

This pass runs before the rules, on every file that imports, or is imported by, another scanned
file; it must stay a fraction of the libcst parse (``ast.parse`` is about ten times faster), so
it keeps only what the other files need:

- its imports, as the file's ``ImportTable`` spells them (``engine.train_one_epoch``);
- whether it names CUDA, and which module-level names hold a CUDA device (``DEVICE = "cuda"``,
  ``def get_device(): return torch.device("cuda" ...)``, a config class with such an attribute);
- per function, method and class (called as its constructor): whether it takes a training step
  outside any loop (a per-step helper), whether it holds a training loop, which of its
  parameters that loop iterates (the loader), whether the loop copies batches to a device, and
  whether it computes a tensor and reads it on the host (a metric helper: `float(torch.sum(x))`),
  which parameters it copies to the GPU with a blocking copy (`x.cuda()`), and which its training
  loop calls every step (Megatron's `forward_step_func`);
- which imported functions it calls on every training step (``utils.log_loss_dict``) or from a
  module's ``forward`` (a mask class built every step), which return the loader one of its
  training loops iterates (``loader = get_loader(...)``), which it calls with autograd off
  (``with torch.no_grad(): validate(...)``), and which of its own functions it hands to an
  imported function (``train_step(..., forward_step_func=forward_step)``);
- which classes (and module-level factories returning them) build convolution or cuDNN RNN
  layers, directly or through the file's other classes and helpers (``ResNet`` ->
  ``BasicBlock`` -> ``conv3x3``);
- which imported classes it builds, and what it passes them (``ChipsData(root, num_workers=8)``);
- what its calls of imported functions pass them (``get_loader(path, num_workers=args.workers)``:
  a constant, or an option's argparse default);
- which classes multiply sparse matrices (``torch.spmm``), and what they build of other modules;
- whether, as a script, it chooses cuDNN's algorithms for the process (``cudnn.benchmark = True``),
  and the fp32 matmul precision (``allow_tf32``, ``set_float32_matmul_precision``);
- the options its argparse parser defines, with the default a run without each gets, and the
  names it binds the parsed options to (``args = parser.parse_args()``).

A training loop is recognised as in ``speedfix.model.context`` (same markers, from ``speedfix.project.steps``),
within this file and one call deep.
"""

from __future__ import annotations

import ast
import builtins
import json
import re
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Iterator

from speedfix.project.steps import (CUDA_ATTRIBUTES, CUDA_DEFAULT_CALLS, CUDA_DEVICE_HELPERS, CUDA_OBJECTS, CUDNN_CHOICES, DATALOADER,
                                    DETERMINISTIC_ALGORITHMS, HF_STEP_METHODS, LIGHTNING_CLI, LIGHTNING_DATAMODULE, LIGHTNING_MODULE,
                                    LIGHTNING_STEP_HOOKS, LIGHTNING_TRAINER, MATMUL_LAYERS, MATMUL_PRECISION_CALLS, PAD_TO_LONGEST, TF32_CHOICES,
                                    MATMUL_METHODS, MODULE_API, NO_GRAD_CALLS, SYNC_SWITCHES, diffusers_conv_net,
                                    is_iterable_wrapper, is_loss_scaler_call, is_optimizer_name, layer_kind, makes_adapters,
                                    zoo_cnn)

# Calls that choose cuDNN's algorithms for the process.
_CUDNN_OWNERS = frozenset((*DETERMINISTIC_ALGORITHMS, *LIGHTNING_TRAINER, *LIGHTNING_CLI))


@dataclass(frozen=True)
class FunctionFacts:
    """A function, a method (``Class.method``) or a class called as its constructor (``Class``:
    the parameters of ``__init__`` without ``self``, mapped through ``self.x = x``)."""

    params: tuple[str, ...] = ()  # positional parameters in order (a method's `self` included)
    steps: bool = False  # a backward/optimizer step outside any loop: a loop calling it trains
    trains: bool = False  # holds a training loop
    iterated: tuple[str, ...] = ()  # parameters its training loop iterates (the loader)
    epochs: tuple[str, ...] = ()  # ... in a loop inside another loop of the function (every epoch)
    changes: tuple[str, ...] = ()  # parameters whose `.dataset` a loop changes (`loader.dataset.reshuffle()`)
    loops_over: tuple[str, ...] = ()  # parameters any of its loops iterates (an evaluation's loader too)
    # parameters a loop inside another of its loops iterates: again and again (`def infiniteloop(loader):
    # while True: for x, y in iter(loader): yield x`)
    repeats: tuple[str, ...] = ()
    uploads: bool = False  # its training loop copies to a device (`.to(...)`, `.cuda()`)
    moves: bool = False  # it copies to a device anywhere (`def to_device(batch, device)`: a loop's helper)
    makes_on_device: bool = False  # makes tensors with `device=` (a `collate_fn` whose batches are on the GPU)
    adapters: bool = False  # leaves only LoRA adapters to train (`get_lora_model(model, config)`: `steps.ADAPTER_MAKERS`)
    cuda: bool = False  # names CUDA, or returns a CUDA device
    conv_dims: tuple[int, ...] = ()  # a class (or a factory returning one) that builds ConvNd layers: the Ns
    rnn: bool = False  # a class (or a factory returning one) that builds cuDNN LSTM/GRU/RNN layers
    matmul: bool = True  # ... that may multiply matrices (Linear, attention, `@`); False only when known
    matmuls: bool = False  # ... attention, recurrent layers or matmuls of its own (more than a classifier head)
    sparse: bool = False  # ... sparse matrix products (`torch.spmm`), here or in a scanned module's class it builds
    # ``matmul``/``matmuls`` known but for ``parts`` (the linker settles them from those modules' facts)
    matmul_but_parts: bool = True
    matmuls_but_parts: bool = True
    parts: tuple[str, ...] = ()  # ... what it builds of other modules, by qualified name (`layers.GraphConv`)
    syncs: bool = False  # reads a tensor's value on the host (`.item()`, `float(torch.sum(x))`): a metric helper
    # switches DDP's gradient all-reduce (`module.no_sync()`, `require_backward_grad_sync`): a
    # context manager such as NVlabs' `misc.ddp_sync(module, sync)`
    switches_sync: bool = False
    # parameters it copies to the GPU with a blocking copy (`x.cuda()`, `x.to(device)` without `non_blocking`)
    blocking_copies: tuple[str, ...] = ()
    calls_params: tuple[str, ...] = ()  # parameters its training loop calls every step (a `forward_step_func`)
    sets_only: bool = False  # calls nothing (a setter: `self.tgt_len = tgt_len`): it runs no network
    # may run a layer or compute with the weights (`self.encoder(x)`, `F.linear(x, self.w)`): calls
    # more than bookkeeping (`self.step.data.item()`, `torch.save(self.state_dict(), path)`, `print`)
    runs_parts: bool = True
    cudnn: bool = False  # chooses cuDNN's algorithms, outside any `if` (`torch.backends.cudnn.benchmark = True`)
    tf32: bool = False  # chooses the fp32 matmul precision (`torch.backends.cuda.matmul.allow_tf32 = True`)
    pads: bool = False  # pads samples to the longest (`pad_sequence`): a `collate_fn` whose batches change shape
    # a class of this module whose object it builds and returns (`return FastComposerModel(...)`,
    # `return cls(...)`): a static or class method that makes the model (`Model.from_pretrained(args)`)
    returns: str = ""


@dataclass(frozen=True)
class ModuleFacts:
    imports: tuple[tuple[str, str], ...] = ()  # (local name, qualified name) as ImportTable spells it
    star_imports: tuple[str, ...] = ()  # `from config import *`
    cuda: bool = False  # the file names CUDA itself
    cuda_names: tuple[str, ...] = ()  # module-level names that hold (or return) a CUDA device
    functions: dict[str, FunctionFacts] = field(default_factory=dict)
    hot_calls: tuple[str, ...] = ()  # qualified names (through imports) called on every training step
    forward_calls: tuple[str, ...] = ()  # qualified names (through imports) a module's `forward` calls
    # the `forward` of imported module classes run on every step: a submodule a `forward` calls
    # (`self.lr(x)` with `self.lr = LengthRegulator()`), a model a training loop calls (`model(x)`)
    forward_modules: tuple[str, ...] = ()
    # imported functions whose returned loader a training loop here iterates (`loader = get_loader()`):
    # (qualified name, iterated every epoch, its batches copied to a device, which element of the
    # tuple it returns the loop iterates: `train_loader, val_loader = get_loaders()`; -1: the value)
    loader_calls: tuple[tuple[str, bool, bool, int], ...] = ()
    # a loader made by an imported function, handed to another imported function: (the maker, the
    # callee, the parameter it is given as: its position as digits, or its keyword, which element of
    # the tuple the maker returns it is: `train_loader, val_loader = get_loaders()`; -1: the value)
    loader_hands: tuple[tuple[str, str, str, int], ...] = ()
    # keyword arguments handed to an imported function as `**kw` of a dict literal (`make_loaders(args,
    # **kwargs)` with `kwargs = {"num_workers": args.workers}`): (callee, key, the value's repr, or ""
    # when it is not a constant or an argparse default); key "*": a `**` whose keys are unknown, key
    # "#": the keys one call passes, comma-separated
    kwargs_given: tuple[tuple[str, str, str], ...] = ()
    # the arguments of its calls of imported functions (`get_loader(path, num_workers=args.workers)`):
    # (callee, slot: a keyword or a position as digits, the value's repr or "" as in ``kwargs_given``);
    # slot "#": the slots one call passes, comma-separated; slot "*": a call with `*args`/`**kwargs`
    arguments_given: tuple[tuple[str, str, str], ...] = ()
    # the command-line options its argparse parser defines: (destination, repr of the default a run
    # without the option gets: `False` for `store_true`, `None` without a default; "" when unknown)
    options: tuple[tuple[str, str], ...] = ()
    parsed_names: tuple[str, ...] = ()  # names it binds the parsed options to (`args = parser.parse_args()`)
    # module-level names bound once, outside any `if`, to a short constant: (name, its repr); a
    # config module's `num_workers = 0`, read by the scripts as `CFG.num_workers`
    constants: tuple[tuple[str, str], ...] = ()
    references: tuple[str, ...] = ()  # qualified names (through imports) read anywhere in the file
    trains: bool = False  # the file holds a training loop
    main_guard: bool = False  # the file has an `if __name__ == "__main__":` block
    # imported classes it builds: (qualified name, `.from_argparse_args` or "", keywords passed,
    # positional arguments passed, `*args`/`**kwargs` passed)
    constructions: tuple[tuple[str, str, tuple[str, ...], int, bool], ...] = ()
    no_grad_calls: tuple[str, ...] = ()  # qualified names (through imports) called under `torch.no_grad()`
    # methods called under `torch.no_grad()` on an object of a class the imports do not say
    # (`self.agent.act(obs)` with an agent hydra builds from a config): their names
    no_grad_methods: tuple[str, ...] = ()
    # a script (code at module level, or an `if __name__ == "__main__":` block) that chooses cuDNN's
    # algorithms outside any `if` (`cudnn.benchmark = True` in its `main()`); not a test's fixture
    cudnn: bool = False
    # a script that chooses the fp32 matmul precision for the process, under an `if` or not
    # (`torch.backends.cuda.matmul.allow_tf32 = args.tf32`: the run's command line decides)
    tf32: bool = False
    lightning: bool = False  # defines a LightningModule or LightningDataModule: Lightning trains on a GPU by default
    # builds DataLoaders and pins none of them (no `pin_memory`, or `pin_memory=False`): a file it
    # hands them to copies batches from pageable memory
    unpinned_loaders: bool = False
    # the layers each of its top-level classes builds in its methods, for a parameter count: (class,
    # ((callee qualified through the imports, or `.Name` for a class of this module; its arguments:
    # an int literal as digits, `=param` for a parameter of the class's `__init__`, "?" otherwise,
    # a keyword argument as `kw:value`; how many times it runs, -1 unknown), ...), `__init__`'s
    # parameters with their int defaults as `name=value` or `name`); none for a class whose layers
    # sit in other loops or comprehensions
    class_layers: tuple[tuple[str, tuple[tuple[str, tuple[str, ...], int], ...], tuple[str, ...]], ...] = ()
    # makes CUDA the default for new tensors, at module level or in its entry point
    # (`torch.set_default_tensor_type(torch.cuda.FloatTensor)`, `torch.set_default_device("cuda")`)
    cuda_default: bool = False
    # chooses cuDNN's algorithms or switches it off at module level, outside any `if`: a choice the
    # files that import it make with it (crnn's evaluate.py: `torch.backends.cudnn.enabled = False`)
    cudnn_at_import: bool = False
    # a module class of its top level whose `forward` calls a submodule only in some calls (under
    # an `if` on an argument, or after one that returns): DDP needs `find_unused_parameters` there
    skips_submodules: bool = False
    # takes a gradient with `create_graph` (`torch.autograd.grad(..., create_graph=self.training)`):
    # a backward pass that is differentiated again, which compiled graphs cannot run
    double_backward: bool = False
    # functions of this file handed to an imported function: (callee, slot as in ``arguments_given``,
    # the function's name): `train_step(..., forward_step_func=forward_step)`
    handed_functions: tuple[tuple[str, str, str], ...] = ()
    # methods it calls on objects of imported project classes it builds: (class, method), qualified
    # through imports (`buffer = utils.ReplayBuffer(...)`, then `buffer.add(...)`)
    object_methods: tuple[tuple[str, str], ...] = ()
    # imported functions and methods of imported classes called in a loop that steps an
    # environment (`agent.update(rollouts)` of an RL script's main loop): an RL update
    env_calls: tuple[str, ...] = ()
    # methods called in such a loop on an object of a class the imports do not say
    # (`self.agent.update(...)` with an agent hydra builds from a config): their names
    env_methods: tuple[str, ...] = ()
    # its classes built on imported ones: (class, the qualified names of its bases through imports)
    class_bases: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # the dict literal each of its module-level functions returns, as JSON (DeepSpeed-Chat's
    # `get_train_ds_config()`): keys and constant values; DICT_UNKNOWN for the others
    returned_dicts: tuple[tuple[str, str], ...] = ()
    # imported project classes it builds, with the flags each construction needs, from the `if`s
    # around it: (qualified name, (`args.gail`, `!args.cpu`, "?" for another test, ...)), one per
    # distinct set of gates
    gated_constructions: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # dicts of imported project modules or classes indexed by an option (LTSF-Linear's `model_dict =
    # {'Autoformer': Autoformer, 'DLinear': DLinear, ...}`, then `model_dict[self.args.model]`): (the
    # option's destination, ((key, qualified name of the entry), ...)), entries named nowhere else
    dispatches: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()

    def to_record(self) -> dict[str, Any]:
        record = {name: getattr(self, name) for name in self.__dataclass_fields__}
        record["functions"] = {name: facts.__dict__ for name, facts in self.functions.items()}
        return record

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> ModuleFacts:
        """Raises TypeError/KeyError/ValueError on a damaged record (the cache is a plain file)."""
        functions = {
            str(name): FunctionFacts(**{k: tuple(v) if isinstance(v, list) else v for k, v in facts.items()})
            for name, facts in record["functions"].items()
        }
        return cls(
            imports=tuple((str(a), str(b)) for a, b in record["imports"]),
            star_imports=tuple(map(str, record["star_imports"])),
            cuda=bool(record["cuda"]),
            cuda_names=tuple(map(str, record["cuda_names"])),
            functions=functions,
            hot_calls=tuple(map(str, record["hot_calls"])),
            forward_calls=tuple(map(str, record["forward_calls"])),
            forward_modules=tuple(map(str, record["forward_modules"])),
            loader_calls=tuple((str(q), bool(e), bool(u), int(p[0]) if p else -1) for q, e, u, *p in record["loader_calls"]),
            loader_hands=tuple((str(m), str(c), str(s), int(p[0]) if p else -1) for m, c, s, *p in record["loader_hands"]),
            kwargs_given=tuple((str(c), str(k), str(v)) for c, k, v in record["kwargs_given"]),
            arguments_given=tuple((str(c), str(k), str(v)) for c, k, v in record["arguments_given"]),
            options=tuple((str(d), str(v)) for d, v in record["options"]),
            parsed_names=tuple(map(str, record["parsed_names"])),
            constants=tuple((str(n), str(v)) for n, v in record["constants"]),
            references=tuple(map(str, record["references"])),
            trains=bool(record["trains"]),
            main_guard=bool(record["main_guard"]),
            constructions=tuple((str(q), str(m), tuple(map(str, k)), int(n), bool(s))
                                for q, m, k, n, s in record["constructions"]),
            no_grad_calls=tuple(map(str, record["no_grad_calls"])),
            no_grad_methods=tuple(map(str, record["no_grad_methods"])),
            object_methods=tuple((str(owner), str(method)) for owner, method in record["object_methods"]),
            lightning=bool(record["lightning"]),
            unpinned_loaders=bool(record.get("unpinned_loaders", False)),
            cuda_default=bool(record.get("cuda_default", False)),
            cudnn_at_import=bool(record.get("cudnn_at_import", False)),
            skips_submodules=bool(record.get("skips_submodules", False)),
            double_backward=bool(record.get("double_backward", False)),
            class_layers=tuple((str(name), tuple((str(c), tuple(map(str, a)), int(t)) for c, a, t in calls),
                                tuple(map(str, params))) for name, calls, params in record.get("class_layers", ())),
            cudnn=bool(record["cudnn"]),
            tf32=bool(record["tf32"]),
            handed_functions=tuple((str(c), str(k), str(f)) for c, k, f in record["handed_functions"]),
            env_calls=tuple(map(str, record["env_calls"])),
            env_methods=tuple(map(str, record.get("env_methods", ()))),
            class_bases=tuple((str(name), tuple(map(str, bases))) for name, bases in record.get("class_bases", ())),
            returned_dicts=tuple((str(name), str(data)) for name, data in record.get("returned_dicts", ())),
            gated_constructions=tuple((str(q), tuple(map(str, g))) for q, g in record["gated_constructions"]),
            dispatches=tuple((str(d), tuple((str(k), str(q)) for k, q in entries)) for d, entries in record["dispatches"]),
        )


def module_by_option(prefix: str, option: str) -> str:
    """The name a module imported by an option's value is bound to (`MODEL =
    importlib.import_module(args.model)`: prefix "", option "model"; `"models." + args.arch`:
    prefix "models."), in the facts and in a file's imports; the linker finds the module
    (``linker._module_of_option``). No dots: it must not read as a module path."""
    return f"import_module({prefix.replace('.', '/')}{{{option}}})"


def option_of_module(name: str) -> tuple[str, str] | None:
    """(prefix, option) of a ``module_by_option`` name; None for any other name."""
    match = _BY_OPTION.fullmatch(name)
    return (match.group(1).replace("/", "."), match.group(2)) if match else None


IMPORT_MODULE = "importlib.import_module"
_BY_OPTION = re.compile(r"import_module\(([\w/]*)\{(\w+)\}\)")


def imported_by_name(argument: ast.expr) -> str | None:
    """What `importlib.import_module(argument)` imports: a module name written out, or an
    option's value (``module_by_option``): `args.model`, `"models." + args.arch`,
    `f"models.{args.arch}"`. None for anything else."""
    if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
        return argument.value if re.fullmatch(r"\w+(\.\w+)*", argument.value) else None
    prefix, option = "", argument
    if isinstance(argument, ast.BinOp) and isinstance(argument.op, ast.Add) and isinstance(argument.left, ast.Constant):
        prefix, option = argument.left.value, argument.right
    elif isinstance(argument, ast.JoinedStr) and len(argument.values) == 2 and isinstance(argument.values[0], ast.Constant) \
            and isinstance(argument.values[1], ast.FormattedValue) and argument.values[1].format_spec is None:
        prefix, option = argument.values[0].value, argument.values[1].value
    if not isinstance(prefix, str) or not re.fullmatch(r"(\w+\.)*", prefix) or not isinstance(option, ast.Attribute):
        return None
    return module_by_option(prefix, option.attr)


def extract_facts(data: bytes | str) -> ModuleFacts | None:
    """The facts of one file, or None when Python cannot parse it (its own scan reports why)."""
    try:
        tree = ast.parse(data)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return facts_of(tree)


def _parses_options(value: ast.expr) -> bool:
    """`parser.parse_args()`, `parser.parse_known_args()` (or its `[0]`)."""
    if isinstance(value, ast.Subscript):
        value = value.value
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
        and value.func.attr in ("parse_args", "parse_known_args")


def _option_default(node: ast.Call, default: ast.expr | None) -> str:
    """The repr of the value an `add_argument` option has when the command line leaves it out
    (see ModuleFacts.options)."""
    if default is not None:
        shown = _literal_repr(default)
        return shown if len(shown) <= 40 else ""
    if any(k.arg == "required" and not (isinstance(k.value, ast.Constant) and k.value.value is False) for k in node.keywords):
        return ""  # every run passes it: its value is the command's
    action = next((k.value for k in node.keywords if k.arg == "action"), None)
    if action is None:
        return "None"
    kind = action.value if isinstance(action, ast.Constant) else None
    return {"store_true": "False", "store_false": "True", "store": "None"}.get(kind, "")  # type: ignore[arg-type]


def _literal_repr(node: ast.expr) -> str:
    """The repr of a literal (`8`, `-1`, `"bert"`, `(0.9, 0.999)`), "" for anything else."""
    if isinstance(node, ast.Constant):
        return repr(node.value)
    if isinstance(node, (ast.UnaryOp, ast.Tuple, ast.List)):
        try:
            return repr(ast.literal_eval(node))
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return ""
    return ""


def facts_of(tree: ast.Module) -> ModuleFacts | None:
    """The facts of a file Python parsed into ``tree`` (None: too deep for this walk)."""
    collector = _Collector()
    collector.module_classes = {statement.name for statement in tree.body if isinstance(statement, ast.ClassDef)}
    try:
        collector.visit(tree)
    except RecursionError:
        return None
    return collector.facts()


# ---------------------------------------------------------------------------------- internals
# The fields of a statement that hold statements (an `except` clause's and a `case`'s body too),
# in the order of each node's ``_fields``
_BLOCKS = ("body", "handlers", "orelse", "finalbody", "cases")


def _statements(node: ast.AST) -> Iterator[ast.AST]:
    """The statements in and under ``node`` (with the `except` and `case` clauses that hold
    some), in ``ast.walk``'s order, without walking the expressions, which hold none."""
    todo = deque([node])
    while todo:
        node = todo.popleft()
        for name in _BLOCKS:
            block = getattr(node, name, None)
            if block:
                todo.extend(block)
        yield node


def _walk(node: ast.AST) -> Iterator[ast.AST]:
    """``ast.walk(node)`` less the nodes without fields (`Load`, `+`: no caller looks for them),
    without its two generators per node."""
    todo = deque([node])
    while todo:
        node = todo.popleft()
        for name in node._fields:
            value = getattr(node, name, None)
            if type(value) is list:
                todo.extend(item for item in value if isinstance(item, ast.AST) and item._fields)
            elif isinstance(value, ast.AST) and value._fields:
                todo.append(value)
        yield node


def _range_count(node: ast.expr) -> int | None:
    """How many times `for _ in range(8)` (or `range(2, 10)`) runs; None for anything else."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range"
            and 1 <= len(node.args) <= 2 and not node.keywords):
        return None
    values = [arg.value for arg in node.args if isinstance(arg, ast.Constant) and type(arg.value) is int]
    if len(values) != len(node.args):
        return None
    return values[0] if len(values) == 1 else max(0, values[1] - values[0])


def dotted(node: ast.AST) -> str | None:
    if type(node) is ast.Name:  # (the parser makes no subclasses of its nodes)
        return node.id
    parts: list[str] = []
    while type(node) is ast.Attribute:
        parts.append(node.attr)
        node = node.value
    if type(node) is not ast.Name:
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


_MODULE_MOVES = frozenset({"to", "cuda", "cpu", "train", "eval", "float", "half", "double", "bfloat16"})


def _unmoved(node: ast.AST) -> ast.AST:
    """``FastSpeech2(...).to(device)``, ``Net().cuda().eval()`` -> the call that builds the object."""
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _MODULE_MOVES \
            and isinstance(node.func.value, ast.Call):
        node = node.func.value
    return node


# Methods that fold a trained module's layers for inference (see ``_folding_for_inference``).
_INFERENCE_FOLDING = re.compile(r"fuse|switch_to_deploy|reparameteri[sz]e|deploy")

# Calls that return the module they are given, wrapped or not (`DataParallel(model)`).
_MODULE_WRAPPERS = ("DataParallel", "DistributedDataParallel", "convert_sync_batchnorm", "compile")


def _same_module(value: ast.AST, made_by: dict[str, str]) -> str | None:
    """What made the module ``value`` hands on: `model.train()`, `model.cuda(rank)`,
    `nn.DataParallel(model)`, `torch.compile(model)` of a `model` made by an imported call."""
    if not isinstance(value, ast.Call):
        return None
    if isinstance(value.func, ast.Attribute) and value.func.attr in _MODULE_MOVES and isinstance(value.func.value, ast.Name):
        return made_by.get(value.func.value.id)
    func = dotted(value.func) or ""
    if func.rpartition(".")[2] in _MODULE_WRAPPERS and value.args and isinstance(value.args[0], ast.Name):
        return made_by.get(value.args[0].id)
    return None


# Methods that change a dict in place.
DICT_CHANGES = ("update", "setdefault", "pop", "popitem", "clear", "__setitem__", "__delitem__")


def _dict_items(value: ast.AST) -> dict[str, str] | None:
    """The constant items of a dict literal (`{"model_path": "Qwen/Qwen2-7B", ...}`, `dict(lr=0.1)`) by
    key (keys with a dot are left out: they would read as a module path); None for anything else."""
    if isinstance(value, ast.Dict) and all(key is not None for key in value.keys):
        pairs = [(key.value, item) for key, item in zip(value.keys, value.values)
                 if isinstance(key, ast.Constant) and isinstance(key.value, str)]
    elif isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "dict" and not value.args \
            and all(keyword.arg for keyword in value.keywords):
        pairs = [(str(keyword.arg), keyword.value) for keyword in value.keywords]
    else:
        return None
    # (a config's checkpoint paths are long: `/mnt/models/Qwen/Qwen2-7B`)
    return {key: shown for key, item in pairs if "." not in key and (shown := _Collector._constant(item, longest=160))
            and not shown.startswith("@")}


def _unwrap(node: ast.AST) -> ast.AST:
    """``enumerate(tqdm(loader))``, ``metric_logger.log_every(loader, ...)`` -> ``loader``."""
    while isinstance(node, ast.Call) and node.args and is_iterable_wrapper(dotted(node.func)):
        node = node.args[0]
    return node


def _cuda_attribute(node: ast.Attribute) -> bool:
    return node.attr in CUDA_ATTRIBUTES or (isinstance(node.value, ast.Name) and node.value.id in CUDA_OBJECTS)


def _picked_classes(func: ast.expr) -> list[str]:
    """The names a call through a dict written in place picks from (`{'a': A, 'b': B}[key](...)`):
    each entry's dotted name; none for another callee."""
    if not (isinstance(func, ast.Subscript) and isinstance(func.value, ast.Dict)):
        return []
    return [name for value in func.value.values if value is not None and (name := dotted(value)) is not None]


def _is_main_guard(test: ast.AST) -> bool:
    """`__name__ == "__main__"`."""
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and len(test.comparators) == 1 and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == "__main__")


def _cpu_constant(node: ast.AST) -> bool:
    """`"cpu"` (or `torch.device("cpu")`): a device that keeps the tensor on the host."""
    if isinstance(node, ast.Call) and len(node.args) == 1:
        node = node.args[0]
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("cpu")


def _flag_test(test: ast.AST) -> str | None:
    """`args.gail` for `if args.gail:`, `!args.cpu` for `if not args.cpu:`: a test of one flag;
    `args.policy=DDPG` for `if args.policy == "DDPG":` (`!args.policy=DDPG` for `!=`): a test of
    one option's value."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _flag_test(test.operand)
        return None if inner is None or inner[0] == "!" else "!" + inner
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Eq, ast.NotEq)) \
            and isinstance(test.comparators[0], ast.Constant) and isinstance(test.comparators[0].value, str):
        option = dotted(test.left) if isinstance(test.left, ast.Attribute) else None
        value = test.comparators[0].value
        if option is None or "=" in value or not value.isprintable():
            return None
        return ("!" if isinstance(test.ops[0], ast.NotEq) else "") + f"{option}={value}"
    return dotted(test) if isinstance(test, (ast.Name, ast.Attribute)) else None


def _is_periodic(test: ast.AST) -> bool:
    return any(isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) for node in _walk(test))


@dataclass
class _Loop:
    function: _Function | None
    iterable: str | None  # dotted name of what a `for` iterates, wrappers removed
    marker: bool = False  # a step marker directly in its body (no nested loop in between)
    uploads: bool = False
    calls: list[tuple[str, bool]] = field(default_factory=list)  # (callee as written, under a periodic guard)
    handed: list[str] = field(default_factory=list)  # names handed to a call (`gpu_timer(train_step)`)
    nested: bool = False  # inside another loop of the same function (an epoch loop)
    env: bool = False  # it steps an environment (`envs.step(action)`), itself or in a loop inside it
    outer: _Loop | None = field(default=None, compare=False, repr=False)  # the loop around it in the same function

    def between_env_steps(self) -> bool:
        """Does it step an environment, or run inside a loop that does (`for _ in range(gail_epoch):
        discr.update(...)` in the main loop of an RL script)?"""
        loop: _Loop | None = self
        while loop is not None:
            if loop.env:
                return True
            loop = loop.outer
        return False


@dataclass
class _Function:
    name: str  # `f` or `Class.method`
    class_name: str | None
    params: tuple[str, ...]
    steps: bool = False
    cuda: bool = False
    returns_cuda: bool = False
    local_values: dict[str, list[ast.expr]] = field(default_factory=dict)  # `device = torch.device(...)`: device: [its value]
    moves: bool = False  # `.to(...)`/`.cuda()` somewhere in its body
    makes_on_device: bool = False  # a call with `device=` other than the CPU: `torch.ones(n, device=device)`
    adapters: bool = False  # a call of `steps.ADAPTER_MAKERS` in its body
    blocking_copies: set[str] = field(default_factory=set)  # parameters it copies without `non_blocking`
    syncs: bool = False  # `.item()`/`.tolist()`, or `float(...)`/`int(...)` of a torch result, in its body
    switches_sync: bool = False  # `.no_sync` or `.require_backward_grad_sync` in its body
    cudnn: bool = False  # a cuDNN choice in its body, outside any `if`
    tf32: bool = False  # a choice of the fp32 matmul precision in its body
    pads: bool = False  # a `pad_sequence` call in its body
    loops: list[_Loop] = field(default_factory=list)
    stored: dict[str, str] = field(default_factory=dict)  # `self.attr = param` -> attr: param
    made_by: dict[str, str] = field(default_factory=dict)  # `v = Ctor(...)` -> v: Ctor (as written)
    aliases: dict[str, str] = field(default_factory=dict)  # `v = tqdm(loader)`, `v = loader` -> v: loader
    dicts: dict[str, ast.Dict] = field(default_factory=dict)  # `kw = {"num_workers": 4}` -> kw: the literal
    # `self.iteration(epoch, self.train_data)`: (callee as written, its arguments' names by position or keyword)
    passes: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    called: set[str] = field(default_factory=set)  # every call's callee as written, outside periodic guards
    changes: set[str] = field(default_factory=set)  # names whose `.dataset` a loop changes
    calls: bool = False  # any call in its body
    local_calls: set[str] = field(default_factory=set)  # the bare names it calls (`opti_flags()`)
    runs_parts: bool = False  # see FunctionFacts.runs_parts
    # what it returns as it got it from one call (as written): `return make(...)`, or
    # `a, b = make(...)` then `return a, b`; "" when a return gives something else
    forwards: str | None = None


class _Collector(ast.NodeVisitor):
    def __init__(self) -> None:
        self.bindings: dict[str, str] = {}
        self.star: list[str] = []
        self.cuda = False
        self.functions: dict[str, _Function] = {}
        self.function_stack: list[_Function] = []
        self.class_stack: list[str] = []
        self.class_names: set[str] = set()
        self._local: frozenset[str] | None = None  # see _local_names
        self.loop_stack: list[_Loop | None] = []  # None: a function boundary
        self.guards = 0  # periodic `if step % N == 0:` bodies open inside the current loop
        self.guard_stack: list[int] = []
        self.loops: list[_Loop] = []
        self.cuda_names: set[str] = set()
        self.cuda_classes: set[str] = set()
        self.option_words: set[int] = set()  # strings naming or describing an option: `add_argument("--cuda")`
        self.references: set[str] = set()
        self.constructions: set[tuple[str, str, tuple[str, ...], int, bool]] = set()
        # class or module-level function -> the names it calls (a function: in what it returns)
        self.builds: dict[str, set[str]] = {}
        # ... -> what it calls itself: ConvNd by N, "rnn" (cuDNN LSTM/GRU/RNN), "matmul", "opaque" (steps.layer_kind),
        # "heavy" (attention, recurrent layers, matmuls written out: more than a classifier head)
        self.layers: dict[str, set[int | str]] = {}
        self.made_at_module: dict[str, str] = {}  # module-level `v = f(...)` -> v: f (as written)
        # every maker of a name, by its made_by table: `loader = a.make_x(...)` in one branch of
        # an option, `loader = a.make_y(...)` in another
        self.makers: dict[tuple[int, str], list[str]] = {}
        self.positions: dict[tuple[int, str], int] = {}  # (scope, name) -> its element of a tuple a call returns
        self.partials: dict[str, str] = {}  # module-level `v = partial(f, ...)` -> v: f (as written)
        self.module_aliases: dict[str, str] = {}  # module-level `v = tqdm(loader)` -> v: loader
        # (maker, callee, slot, element of the maker's tuple) as written: see ModuleFacts.loader_hands
        self.hands: list[tuple[str, str, str, int]] = []
        self.kwargs: list[tuple[str, str, str]] = []  # (callee as written, key, value): see ModuleFacts.kwargs_given
        self.arguments: list[tuple[str, str, str]] = []  # (callee as written, slot, value): ModuleFacts.arguments_given
        self.handed: list[tuple[str, str, str]] = []  # (callee as written, slot, a name given): ModuleFacts.handed_functions
        self.defaults: dict[str, str] = {}  # argparse destination -> repr of its constant default
        self.reset_defaults: dict[str, str] = {}  # ... as `parser.set_defaults(...)` sets it
        # module-level names bound once, outside any `if`, to a constant (`fp16 = False` in the
        # `__main__` block): name -> its repr, "" when bound otherwise too
        self.module_constants: dict[str, str] = {}
        # module-level names bound once, outside any `if`, to a dict literal (`base_config = {"model_path":
        # ...}`): name -> the repr of each constant item by its key; None when bound otherwise too
        self.module_dicts: dict[str, dict[str, str] | None] = {}
        self.changed_dicts: set[str] = set()  # `cfg["lr"] = ...`, `cfg.update(...)` anywhere in the file
        self.options: dict[str, str] = {}  # see ModuleFacts.options
        self.parsed_names: set[str] = set()  # see ModuleFacts.parsed_names
        self.parsed_into: set[tuple[str, int]] = set()  # `main(parser.parse_args())`: (function, argument index)
        self.class_made_by: dict[str, dict[str, str]] = {}  # class -> `self.loader = f(...)` in a method: self.loader: f
        self.no_grad = 0  # `with torch.no_grad():` bodies (or a `@torch.no_grad()` function) open here
        self.no_grad_calls: set[str] = set()
        self.no_grad_methods: set[str] = set()
        self.object_methods: set[tuple[str, str]] = set()
        self.lightning = False
        self.loaders = [0, 0]  # DataLoaders built, and those given a `pin_memory` that may be True
        self.class_layers: list[tuple[str, tuple[tuple[str, tuple[str, ...], int], ...], tuple[str, ...]]] = []
        self.module_classes: set[str] = set()  # the module's top-level classes (``facts_of`` fills it)
        self.cuda_default = [False, False]  # CUDA made the default for new tensors: anywhere, at module level
        self.cudnn = False  # a cuDNN choice outside any `if`: at module level, in a function
        self.cudnn_at_top = False  # ... at module level
        self.skips_submodules = False
        self.double_backward = False
        self.tf32 = False  # a choice of the fp32 matmul precision, anywhere
        self.class_bases: list[tuple[str, tuple[str, ...]]] = []
        self.returned_dicts: dict[str, str | None] = {}  # function -> its returned dict (None: returns differ)
        self.tf32_at_top = False  # ... at module level
        self.entry = False  # an `if __name__ == "__main__":` block
        self.conditions = 0  # `if` bodies open (not the `if __name__ == "__main__":` block)
        # the tests of the `if`s around the code here: `args.gail`, `!args.gail` in the `else`, "?"
        # for a test that is no plain flag, "" for the `__main__` guard
        self.gates: list[str] = []
        self.gated: set[tuple[str, tuple[str, ...]]] = set()  # see ModuleFacts.gated_constructions
        self.entry_dicts: dict[str, tuple[tuple[str, str], ...]] = {}  # name -> a dict of imported names (keys: strings)
        self.dispatches: set[tuple[str, tuple[tuple[str, str], ...], str]] = set()  # ModuleFacts.dispatches, by dict
        self.entry_dicts_used: set[str] = set()  # those dicts read otherwise too (`d["x"]`, `d.items()`, `f(d)`)

    # ------------------------------------------------------------------ imports
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            local = alias.asname or alias.name.split(".", 1)[0]
            self.bindings[local] = alias.name if alias.asname else local
            if not alias.asname and "." in alias.name:
                self.bindings[alias.name] = alias.name  # `import dataset.GLM`: read as `dataset.GLM.collate_fn`

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = "." * node.level + (node.module or "")
        if not base:
            return
        for alias in node.names:
            if alias.name == "*":
                self.star.append(base)
            else:  # spelled as ImportTable does: `from . import m` binds `.m`
                self.bindings[alias.asname or alias.name] = f"{base}{alias.name}" if base.endswith(".") else f"{base}.{alias.name}"

    def resolve(self, name: str | None) -> str | None:
        if name is None:
            return None
        head, _, rest = name.partition(".")
        target = self.bindings.get(head)
        if target is None:
            return None
        return f"{target}.{rest}" if rest else target

    # ------------------------------------------------------------------ scopes
    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if any(self.resolve(dotted(base)) in _LIGHTNING_CLASSES for base in node.bases):
            self.lightning = True
        bases = tuple(qualified for base in node.bases if (qualified := self.resolve(dotted(base))))
        if bases and not self.class_stack and not self.function_stack:
            self.class_bases.append((node.name, bases))
        if not self.class_stack and not self.function_stack:
            layers = self._class_layers(node)
            if layers is not None:
                self.class_layers.append(layers)
            self.skips_submodules = self.skips_submodules or _skips_submodules(node)
        self.class_stack.append(node.name)
        self.class_names.add(node.name)
        for statement in node.body:  # a config class: `class Config: device = "cuda"`
            if isinstance(statement, (ast.Assign, ast.AnnAssign)) and statement.value is not None:
                if self._mentions_cuda(statement.value):
                    self.cuda_classes.add(node.name)
        self.generic_visit(node)
        self.class_stack.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        owner = self.class_stack[-1] if self.class_stack and not self.function_stack else None
        name = f"{owner}.{node.name}" if owner else node.name
        args = node.args
        params = tuple(a.arg for a in [*args.posonlyargs, *args.args])
        function = _Function(name, owner, params)
        nested = bool(self.function_stack)
        if not nested:
            self.functions.setdefault(name, function)
        else:  # nested functions count as part of the enclosing one
            function = self.function_stack[-1]
        self.function_stack.append(function)
        if any(self._mentions_cuda(default) for default in [*args.defaults, *args.kw_defaults] if default is not None):
            self._note_cuda()  # `def train(epochs=100, device="cuda:0")`
        # a function defined in a loop's body is part of it (I-JEPA's `def train_step():` handed to `gpu_timer`)
        self.loop_stack.append(self._current_loop() if nested else None)
        self.guard_stack.append(self.guards)
        self.guards = 0
        outer_no_grad, self.no_grad = self.no_grad, int(any(self._turns_grad_off(d) for d in node.decorator_list))
        for statement in node.body:
            self.visit(statement)
        if not nested and owner is None and self._returns_container(node):
            # VGG's `make_layers()`: `layers += [nn.Conv2d(...)]`, then `return nn.Sequential(*layers)`;
            # YOLOv3's `create_modules()`: `module_list.append(...)` of `add_module("conv", nn.Conv2d(...))`
            for call in (n for n in _walk(node) if isinstance(n, ast.Call)):
                func = dotted(call.func)
                if func is not None and (self.resolve(func) or "").startswith("torch.nn."):
                    self._builds(name, func)
        self.no_grad = outer_no_grad
        for decorator in node.decorator_list:
            self.visit(decorator)
        self.guards = self.guard_stack.pop()
        self.loop_stack.pop()
        self.function_stack.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def _returns_container(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
        """Does the function return a module container it fills (`nn.Sequential(*layers)`, or a
        `module_list = nn.ModuleList()` it appends to), itself or in a tuple?"""
        made: dict[str, str] = {}  # `module_list = nn.ModuleList()`: module_list -> torch.nn.ModuleList
        returned: list[ast.expr] = []
        for statement in _statements(node):
            if isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Call):
                for target in statement.targets:
                    if isinstance(target, ast.Name):
                        made[target.id] = self.resolve(dotted(statement.value.func)) or ""
            elif isinstance(statement, ast.Return) and statement.value is not None:
                value = statement.value
                returned.extend(value.elts if isinstance(value, ast.Tuple) else [value])
        return any((self.resolve(dotted(element.func)) if isinstance(element, ast.Call) else
                    made.get(element.id) if isinstance(element, ast.Name) else None) in _CONTAINERS
                   for element in returned)

    def _current_loop(self) -> _Loop | None:
        return self.loop_stack[-1] if self.loop_stack else None

    def _visit_loop(self, node: ast.For | ast.AsyncFor | ast.While, iterable: str | None) -> None:
        loop = _Loop(self.function_stack[-1] if self.function_stack else None, iterable, nested=self._current_loop() is not None,
                     outer=self._current_loop())
        self.loops.append(loop)
        if loop.function is not None:
            loop.function.loops.append(loop)
        self.loop_stack.append(loop)
        self.guard_stack.append(self.guards)
        self.guards = 0
        for statement in node.body:
            self.visit(statement)
        self.guards = self.guard_stack.pop()
        self.loop_stack.pop()
        for statement in node.orelse:
            self.visit(statement)

    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:
        if isinstance(node.iter, ast.Name) and node.iter.id in self.entry_dicts:
            self.entry_dicts_used.add(node.iter.id)  # `for name in model_dict:`
        self.visit(node.iter)
        self.visit(node.target)
        iterable = dotted(_unwrap(node.iter))
        aliases = self.function_stack[-1].aliases if self.function_stack else self.module_aliases
        self._visit_loop(node, aliases.get(iterable, iterable) if iterable else None)  # `loader = tqdm(train_loader)`

    visit_AsyncFor = visit_For  # type: ignore[assignment]

    def visit_While(self, node: ast.While) -> None:
        self.visit(node.test)
        self._visit_loop(node, None)

    def visit_With(self, node: ast.With | ast.AsyncWith) -> None:
        for item in node.items:
            self.visit(item)
        off = any(self._turns_grad_off(item.context_expr) for item in node.items)
        self.no_grad += off
        for statement in node.body:
            self.visit(statement)
        self.no_grad -= off

    visit_AsyncWith = visit_With  # type: ignore[assignment]

    def _turns_grad_off(self, node: ast.expr) -> bool:
        """`torch.no_grad()`, `torch.inference_mode()` (as a `with` item or a decorator; `with
        accelerator.accumulate(model) and torch.no_grad():` enters only the last of an `and`)."""
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
            node = node.values[-1]
        return self.resolve(dotted(node.func if isinstance(node, ast.Call) else node)) in NO_GRAD_CALLS

    def visit_If(self, node: ast.If) -> None:
        self.visit(node.test)
        periodic = _is_periodic(node.test)
        condition = not _is_main_guard(node.test)
        self.entry = self.entry or not condition
        self.guards += periodic
        self.conditions += condition
        flag = _flag_test(node.test) if condition else None
        self.gates.append(flag or "?" if condition else "")
        for statement in node.body:
            self.visit(statement)
        self.gates.pop()
        self.guards -= periodic
        self.gates.append(("!" + flag if flag[0] != "!" else flag[1:]) if flag else "?" if condition else "")
        for statement in node.orelse:
            self.visit(statement)
        self.gates.pop()
        self.conditions -= condition

    # ------------------------------------------------------------------ facts
    def visit_Assign(self, node: ast.Assign) -> None:
        self._assigned([target for target in node.targets], node.value)
        value = node.value
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and isinstance(value, ast.Call) \
                and len(value.args) == 1 and not value.keywords and self.resolve(dotted(value.func)) == IMPORT_MODULE:
            imported = imported_by_name(value.args[0])  # `MODEL = importlib.import_module(args.model)`
            if imported is not None:
                self.bindings[node.targets[0].id] = imported
        if isinstance(node.value, ast.Dict):
            self._entry_dict(node.targets, node.value)
        if _parses_options(node.value):  # `args = parser.parse_args()`, `args, _ = parser.parse_known_args()`
            for target in node.targets:
                first = target.elts[0] if isinstance(target, (ast.Tuple, ast.List)) and target.elts else target
                if isinstance(first, ast.Name):
                    self.parsed_names.add(first.id)
        if any((dotted(target) or "").endswith(CUDNN_CHOICES) for target in node.targets):
            self._cudnn_choice()
        if any((dotted(target) or "").endswith(TF32_CHOICES) for target in node.targets):
            self._tf32_choice()
        self.generic_visit(node)

    def _entry_dict(self, targets: list[ast.expr], value: ast.expr) -> None:
        """`model_dict = {'Autoformer': Autoformer, ...}`: three or more string keys, each value an
        imported name (a module or a class of the project), for ``visit_Subscript``."""
        if len(targets) != 1 or not isinstance(targets[0], ast.Name) or len(value.keys) < 3:  # type: ignore[attr-defined]
            return
        entries = []
        for key, entry in zip(value.keys, value.values):  # type: ignore[attr-defined]
            qualified = self.resolve(dotted(entry)) if isinstance(entry, (ast.Name, ast.Attribute)) else None
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)) or qualified is None \
                    or qualified.split(".", 1)[0] in _EXTERNAL:
                return
            entries.append((key.value, qualified))
        self.entry_dicts[targets[0].id] = tuple(entries)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        """`model_dict[self.args.model]`, `models[args.arch]`: a dict of entries picked by an option."""
        if isinstance(node.value, ast.Name) and not isinstance(node.ctx, ast.Load):
            self.changed_dicts.add(node.value.id)  # `cfg["lr"] = 0.1`, `del cfg["lr"]`
        if isinstance(node.value, ast.Name) and node.value.id in self.entry_dicts:
            if isinstance(node.slice, ast.Attribute):
                self.dispatches.add((node.slice.attr, self.entry_dicts[node.value.id], node.value.id))
            else:
                self.entry_dicts_used.add(node.value.id)  # `model_dict["former"]`: built on every run
        self.generic_visit(node)

    def _entry_dict_used(self, node: ast.Call) -> None:
        """`model_dict.items()`, `build(model_dict)`: the dict's entries are read otherwise too."""
        head = node.func.value.id if isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) else None
        for name in (head, *(arg.id for arg in node.args if isinstance(arg, ast.Name)),
                     *(kw.value.id for kw in node.keywords if isinstance(kw.value, ast.Name))):
            if name in self.entry_dicts:
                self.entry_dicts_used.add(name)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self._assigned([node.target], node.value)
        self.generic_visit(node)

    def _assigned(self, targets: list[ast.expr], value: ast.expr) -> None:
        function = self.function_stack[-1] if self.function_stack else None
        built = _unmoved(value)
        made = dotted(built.func) if isinstance(built, ast.Call) else None
        made_by = function.made_by if function is not None else None if self.class_stack else self.made_at_module
        on_self = self.class_made_by.setdefault(function.class_name, {}) if function and function.class_name else None
        for target in targets:
            if isinstance(target, (ast.Tuple, ast.List)) and made and made_by is not None:
                for position, element in enumerate(target.elts):  # `train_loader, val_loader = get_loaders(...)`
                    if isinstance(element, ast.Name):
                        made_by[element.id] = made
                        self.makers.setdefault((id(made_by), element.id), []).append(made)
                        self.positions[(id(made_by), element.id)] = position
                    elif on_self is not None and (attribute := dotted(element)) and attribute.startswith("self."):
                        on_self[attribute] = made  # `self.train_loader, self.val_loader = make_loaders(...)`
            if on_self is not None and made and (attribute := dotted(target)) and attribute.startswith("self."):
                on_self[attribute] = made
            if function is not None and isinstance(target, ast.Name) and isinstance(value, ast.Dict):
                function.dicts[target.id] = value
            name = dotted(target)
            if name is None:
                continue
            if function is None and not self.class_stack and isinstance(target, ast.Name):
                shown = self._constant(value) if isinstance(value, ast.Constant) and not self.conditions else ""
                self.module_constants[name] = shown if self.module_constants.get(name, shown) == shown else ""
                items = _dict_items(value) if not self.conditions else None
                self.module_dicts[name] = items if name not in self.module_dicts else None
            if function is None and not self.class_stack and "." not in name and self._mentions_cuda(value):
                self.cuda_names.add(name)
            elif function is not None and isinstance(target, ast.Name):
                function.local_values.setdefault(name, []).append(value)  # read if the function returns the name
            if made and made_by is not None and "." not in name:
                kept = _same_module(value, made_by)  # `model_train = model.train()`, `DataParallel(model)`
                made_by[name] = kept or made
                self.makers.setdefault((id(made_by), name), []).append(kept or made)
            source = dotted(_unwrap(value)) if isinstance(value, (ast.Name, ast.Attribute, ast.Call)) else None
            if source is not None and source != name and "." not in name and made_by is not None:
                (function.aliases if function is not None else self.module_aliases)[name] = source
            if made_by is self.made_at_module and isinstance(value, ast.Call) and self.resolve(made) == "functools.partial" \
                    and value.args and isinstance(target, ast.Name):
                self._partial(target.id, value)
            if function is not None and name.startswith("self.") and isinstance(value, ast.Name) and value.id in function.params:
                function.stored[name[5:]] = value.id

    def _partial(self, name: str, call: ast.Call) -> None:
        """`resnet50 = partial(ResNet, net_cls=M.resnet50)`: a module-level builder of what the
        partial calls, with what its arguments name (a zoo network passed in as a keyword too)."""
        self.partials[name] = dotted(call.args[0]) or ""
        for arg in [*call.args, *(keyword.value for keyword in call.keywords)]:
            built = dotted(arg)
            if built is not None:
                self._builds(name, built)

    def _hands(self, func: str, node: ast.Call) -> None:
        """`train(args, trainloader, ...)` with `trainloader = create_dataloader(...)`: the
        loader another function made, handed to this call (see ModuleFacts.loader_hands)."""
        made_by = self.function_stack[-1].made_by if self.function_stack else self.made_at_module
        slots = [(str(index), arg) for index, arg in enumerate(node.args)]
        slots += [(keyword.arg, keyword.value) for keyword in node.keywords if keyword.arg]
        for slot, arg in slots:
            made = made_by.get(arg.id) if isinstance(arg, ast.Name) else None
            if made is not None:
                self.hands.append((made, func, slot, self.positions.get((id(made_by), arg.id), -1)))

    def _passes(self, func: str, node: ast.Call) -> None:
        """A call of this file's functions (`f(...)`, `self.m(...)`) given a parameter or a `self.`
        attribute: what the callee's loops iterate, the caller iterates through it."""
        if not self.function_stack or func.count(".") > (1 if func.startswith("self.") else 0):
            return
        function = self.function_stack[-1]
        given = {str(index): name for index, arg in enumerate(node.args) if (name := dotted(arg)) is not None}
        given.update({keyword.arg: name for keyword in node.keywords if keyword.arg and (name := dotted(keyword.value))})
        given = {slot: name for slot, name in given.items() if name in function.params or name.startswith("self.")}
        if given:
            function.passes.append((func, given))

    def _kwargs(self, func: str, node: ast.Call) -> None:
        """`make_loaders(args, **kwargs)` with a dict literal `kwargs` of this function: each key
        and its value (see ModuleFacts.kwargs_given); also the argparse defaults a value may name."""
        if func.endswith("add_argument"):
            self._argparse_default(node)
            return
        if func.endswith("set_defaults"):  # `parser.set_defaults(num_workers=1)`: wins over `add_argument`'s
            self.reset_defaults.update({keyword.arg: repr(keyword.value.value) for keyword in node.keywords
                                        if keyword.arg and isinstance(keyword.value, ast.Constant)})
            return
        for keyword in node.keywords:
            if keyword.arg is not None:
                continue
            name = keyword.value.id if isinstance(keyword.value, ast.Name) else None
            literal = keyword.value if isinstance(keyword.value, ast.Dict) else \
                self.function_stack[-1].dicts.get(name or "") if self.function_stack else None
            if literal is None or any(key is None or not isinstance(key, ast.Constant) for key in literal.keys):
                self.kwargs.append((func, "*", ""))
                continue
            keys = [str(key.value) for key in literal.keys]  # type: ignore[union-attr]
            self.kwargs.append((func, "#", ",".join(sorted(keys))))  # which keys this call passes
            for key, value in zip(keys, literal.values):
                self.kwargs.append((func, key, self._constant(value)))

    def _arguments(self, func: str, node: ast.Call) -> None:
        """The arguments of a call of an imported name (see ModuleFacts.arguments_given), also of
        a bare name a star import may bind (`*get_dataloader` after `from ddpm_torch import *`)."""
        if self.resolve(func) is None:
            if not self.star or "." in func or func in self.functions or hasattr(builtins, func):
                return
            func = "*" + func
        if any(isinstance(arg, ast.Starred) for arg in node.args) or any(k.arg is None for k in node.keywords):
            self.arguments.append((func, "*", ""))
            return
        values = [*node.args, *(keyword.value for keyword in node.keywords)]
        slots = [str(index) for index in range(len(node.args))] + [str(keyword.arg) for keyword in node.keywords]
        self.handed.extend((func, slot, value.id) for slot, value in zip(slots, values) if isinstance(value, ast.Name))
        self.arguments.append((func, "#", ",".join(slots)))
        at_top = not self.function_stack and not self.class_stack  # a name here is the module's own
        self.arguments.extend((func, slot, f"={value.id}" if at_top and isinstance(value, ast.Name)
                               else self._constant(value)) for slot, value in zip(slots, values))

    def _cudnn_choice(self) -> None:
        if not self.conditions:
            self.cudnn = True
            if self.function_stack:
                self.function_stack[-1].cudnn = True
            self.cudnn_at_top = self.cudnn_at_top or not self.function_stack

    def _class_layers(self, node: ast.ClassDef) -> tuple[str, tuple[tuple[str, tuple[str, ...], int], ...],
                                                           tuple[str, ...]] | None:
        """What ``ModuleFacts.class_layers`` holds for the class ``node`` (None: layers it cannot
        place, in a loop other than `for _ in range(<int>)` or in a comprehension)."""
        init = next((s for s in node.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)
        params: list[str] = []
        if init is not None:
            positional = init.args.args[1:]
            defaults = [None] * (len(positional) - len(init.args.defaults)) + list(init.args.defaults)
            for arg, default in [*zip(positional, defaults), *zip(init.args.kwonlyargs, init.args.kw_defaults)]:
                value = default.value if isinstance(default, ast.Constant) and type(default.value) is int else None
                params.append(arg.arg if value is None else f"{arg.arg}={value}")
        names = {param.partition("=")[0] for param in params}
        calls: list[tuple[str, tuple[str, ...], int]] = []

        def argument(value: ast.expr) -> str:
            if isinstance(value, ast.Constant) and type(value.value) is int:
                return str(value.value)
            return f"={value.id}" if isinstance(value, ast.Name) and value.id in names else "?"

        def walk(statements: list[ast.stmt], times: int) -> bool:
            for statement in statements:
                if isinstance(statement, ast.For):
                    count = _range_count(statement.iter)
                    if not walk(statement.body, times * count if count is not None and times >= 0 else -1):
                        return False
                    continue
                if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    continue  # a nested def runs when called: not counted
                for child in _walk(statement):
                    if isinstance(child, (ast.ListComp, ast.GeneratorExp, ast.SetComp, ast.DictComp, ast.While)) and any(
                            isinstance(inner, ast.Call) and self._counted(inner) for inner in _walk(child)):
                        return False
                    if isinstance(child, ast.Call) and (callee := self._counted(child)) is not None:
                        calls.append((callee, tuple([*map(argument, child.args), *(
                            f"{keyword.arg}:{argument(keyword.value)}" for keyword in child.keywords if keyword.arg)]),
                            times))
            return True

        for method in node.body:
            if isinstance(method, ast.FunctionDef) and not walk(method.body, 1):
                return None
        return (node.name, tuple(calls), tuple(params)) if calls else None

    def _counted(self, call: ast.Call) -> str | None:
        """A torch.nn layer's qualified name, or `.Name` for a class this module defines."""
        qualified = self.resolve(dotted(call.func))
        if qualified is not None and qualified.startswith("torch.nn.") and qualified.count(".") == 2:
            return qualified
        if isinstance(call.func, ast.Name) and call.func.id in self.module_classes:
            return "." + call.func.id
        return None

    def _names_cuda(self, node: ast.expr) -> bool:
        """`torch.cuda.FloatTensor`, "torch.cuda.HalfTensor", "cuda", "cuda:0"."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value.startswith(("cuda", "torch.cuda."))
        return (self.resolve(dotted(node)) or "").startswith("torch.cuda.")

    def _tf32_choice(self) -> None:
        self.tf32 = True
        if self.function_stack:
            self.function_stack[-1].tf32 = True
        self.tf32_at_top = self.tf32_at_top or not self.function_stack

    def _argparse_default(self, node: ast.Call) -> None:
        options = [arg.value for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
        default = next((k.value for k in node.keywords if k.arg == "default"), None)
        longs = [option for option in options if option.startswith("--")]
        if not (longs or options):
            return
        flag = (longs or options)[0].lstrip("-").replace("-", "_")  # `--num-workers`: num_workers
        if isinstance(default, ast.Constant):
            self.defaults[flag] = repr(default.value)
        named = next((k.value for k in node.keywords if k.arg == "dest"), None)
        dest = named.value if isinstance(named, ast.Constant) and isinstance(named.value, str) else flag
        value = _option_default(node, default)
        self.options[dest] = value if self.options.get(dest, value) == value else ""

    @staticmethod
    def _constant(value: ast.expr, longest: int = 40) -> str:
        """The repr of a constant (a short one), `@workers` for an option `args.workers` (its
        argparse default is looked up once the whole file is read), "" otherwise."""
        if isinstance(value, ast.Constant):
            shown = repr(value.value)
            return shown if len(shown) <= longest else ""
        if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name):
            return f"@{value.attr}"
        return ""

    def _mentions_cuda(self, node: ast.AST) -> bool:
        for child in _walk(node):
            if isinstance(child, ast.Attribute) and _cuda_attribute(child):
                return True
            if isinstance(child, ast.Constant) and isinstance(child.value, str) and "cuda" in child.value:
                return True
            if isinstance(child, ast.Name) and (child.id in self.cuda_names or child.id in CUDA_DEVICE_HELPERS):
                return True
        return False

    def _note_cuda(self) -> None:
        self.cuda = True
        if self.function_stack:
            self.function_stack[-1].cuda = True

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if _cuda_attribute(node):
            self._note_cuda()
        if node.attr in SYNC_SWITCHES and self.function_stack:
            self.function_stack[-1].switches_sync = True
        name = dotted(node)
        if name is not None:
            self._reference(name)
        self.generic_visit(node)

    def _construction(self, node: ast.Call, func: str | None) -> None:
        """`ChipsData(root, num_workers=8)` or `ChipsData.from_argparse_args(args)` of an imported
        project class: what the call passes (its constructor's defaults hold for the rest)."""
        head, _, method = (func or "").rpartition(".") if (func or "").endswith(_BUILDERS) else (func, "", "")
        qualified = self.resolve(head)
        if qualified is None or qualified.split(".", 1)[0] in _EXTERNAL or not qualified.rsplit(".", 1)[-1][:1].isupper():
            return
        keywords = tuple(sorted(keyword.arg for keyword in node.keywords if keyword.arg))
        star = any(keyword.arg is None for keyword in node.keywords) or any(isinstance(a, ast.Starred) for a in node.args)
        self.constructions.add((qualified, method, keywords, len(node.args), star))
        self.gated.add((qualified, tuple(gate for gate in self.gates if gate)))

    def _object_method(self, func: ast.Attribute) -> None:
        """`buffer.add(...)` where `buffer = utils.ReplayBuffer(...)` (in this function, at module
        level, or `self.buffer` in a method of the class): a method of an imported project class."""
        receiver = dotted(func.value)
        if receiver is None:
            return
        function = self.function_stack[-1] if self.function_stack else None
        if receiver.startswith("self."):
            made = self.class_made_by.get(function.class_name, {}).get(receiver) if function and function.class_name else None
        elif "." not in receiver:
            made = (function.made_by.get(receiver) if function is not None else None) or self.made_at_module.get(receiver)
        else:
            return
        qualified = self.resolve(made)
        if qualified is not None and qualified.split(".", 1)[0] not in _EXTERNAL and qualified.rsplit(".", 1)[-1][:1].isupper():
            self.object_methods.add((qualified, func.attr))

    def _reference(self, name: str) -> None:
        """`config.DEVICE`, `utils.log_loss()`: what is asked of an imported module (a name
        taken with `from m import x` and read as such is among the imports already)."""
        if "." in name:
            qualified = self.resolve(name)
            if qualified is not None and qualified.split(".", 1)[0] not in _EXTERNAL:
                self.references.add(qualified)

    def visit(self, node: ast.AST) -> None:
        """NodeVisitor's dispatch without building a method name for every node."""
        method = _DISPATCH.get(type(node))
        if method is not None:
            method(self, node)
        else:
            self.generic_visit(node)

    def generic_visit(self, node: ast.AST) -> None:
        """The children in ``ast.iter_child_nodes`` order, without its two generators per node,
        less the ones whose visit does nothing (``_INERT``: a name, `Load`, `+`)."""
        visit = self.visit
        for name in node._fields:
            value = getattr(node, name, None)
            if type(value) is list:
                for item in value:
                    if type(item) not in _INERT and isinstance(item, ast.AST):
                        visit(item)
            elif type(value) not in _INERT and isinstance(value, ast.AST):
                visit(value)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and "cuda" in node.value and id(node) not in self.option_words:
            self._note_cuda()

    def visit_Call(self, node: ast.Call) -> None:
        func = dotted(node.func)
        resolved = self.resolve(func)
        if isinstance(node.func, ast.Name):  # DiffWave's `main(parser.parse_args())`: `main`'s parameter holds them
            self.parsed_into.update((node.func.id, index) for index, arg in enumerate(node.args) if _parses_options(arg))
        if self.entry_dicts:
            self._entry_dict_used(node)
        if isinstance(node.func, ast.Attribute) and node.func.attr in DICT_CHANGES and isinstance(node.func.value, ast.Name):
            self.changed_dicts.add(node.func.value.id)  # `cfg.update(lr=0.1)`
        if self.function_stack:
            function = self.function_stack[-1]
            function.calls = True
            if isinstance(node.func, ast.Name):
                function.local_calls.add(node.func.id)
            if not function.runs_parts and _runs_a_part(func):
                function.runs_parts = True
        if func in CUDA_DEVICE_HELPERS:
            self._note_cuda()  # `try_gpu()`
        elif isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            self.option_words.update(id(arg) for arg in node.args if isinstance(arg, ast.Constant))
            self.option_words.update(id(keyword.value) for keyword in node.keywords
                                     if keyword.arg in ("help", "metavar", "dest") and isinstance(keyword.value, ast.Constant))
        if resolved in PAD_TO_LONGEST and self.function_stack:
            self.function_stack[-1].pads = True
        if resolved in DATALOADER:
            self.loaders[0] += 1
            pin = next((keyword.value for keyword in node.keywords if keyword.arg in ("pin_memory", None)), None)
            if len(node.args) > 7 or pin is not None and not (isinstance(pin, ast.Constant) and pin.value is False):
                self.loaders[1] += 1
        if resolved in _GRADIENT_CALLS and any(
                keyword.arg == "create_graph" and not (isinstance(keyword.value, ast.Constant) and not keyword.value.value)
                for keyword in node.keywords):
            self.double_backward = True  # schnetpack's forces: `grad(..., create_graph=self.training)`
        if resolved in CUDA_DEFAULT_CALLS and node.args and self._names_cuda(node.args[0]):
            self.cuda_default = [True, self.cuda_default[1] or not self.function_stack]
        if resolved in _CUDNN_OWNERS:
            self._cudnn_choice()  # (a Lightning Trainer sets `cudnn.benchmark` from its own `benchmark`)
        elif resolved in MATMUL_PRECISION_CALLS:
            self._tf32_choice()
        loop = self._current_loop()
        if self._is_marker(node, func):
            if loop is not None:
                loop.marker = True
            elif self.function_stack:
                self.function_stack[-1].steps = True
        if loop is not None:
            loop.handed.extend(arg.id for arg in node.args if isinstance(arg, ast.Name))
        moves = isinstance(node.func, ast.Attribute) and node.func.attr in ("to", "cuda")
        if moves and self.function_stack:
            self.function_stack[-1].moves = True
            copied = _blocking_copy_of(node)
            if copied in self.function_stack[-1].params:
                self.function_stack[-1].blocking_copies.add(copied)
        if self.function_stack and any(keyword.arg == "device" and not _cpu_constant(keyword.value) for keyword in node.keywords):
            self.function_stack[-1].makes_on_device = True
        if self.function_stack and makes_adapters(resolved, func):
            self.function_stack[-1].adapters = True
        if self.function_stack and self._reads_on_host(node, func, self.function_stack[-1]):
            self.function_stack[-1].syncs = True
        if self.no_grad and func is not None:
            if resolved is not None and resolved.split(".", 1)[0] not in _EXTERNAL:
                self.no_grad_calls.add(resolved)
            elif resolved is None and "." in func:
                self.no_grad_methods.add(func.rpartition(".")[2])
        if loop is not None and isinstance(node.func, ast.Attribute) and node.func.attr == "step" \
                and "env" in (dotted(node.func.value) or "").rsplit(".", 1)[-1].lower():
            for around in reversed(self.loop_stack):  # the rollout loop and the update loop around it
                if around is None:
                    break
                around.env = True
        if loop is not None:
            if moves:
                loop.uploads = True
            if func is not None and ".dataset." in func and self.function_stack:
                self.function_stack[-1].changes.add(func.split(".", 1)[0])  # `loader.dataset.shuffle()` each epoch
            if func is not None:
                loop.calls.append((func, self.guards > 0))
        if self.function_stack and func is not None and self.guards == 0:
            self.function_stack[-1].called.add(func)
        if self.class_stack and func is not None and not self._folding_for_inference():
            self._builds_through(self.class_stack[-1], node)
        self._construction(node, func)
        for picked in _picked_classes(node.func):
            self._construction(node, picked)  # QCNet's `{'argoverse_v2': ArgoverseV2DataModule}[args.dataset](**vars(args))`
        if isinstance(node.func, ast.Attribute):
            self._object_method(node.func)
        if func is not None:
            self._hands(func, node)
            self._kwargs(func, node)
            self._arguments(func, node)
            self._passes(func, node)
        owner = self._layer_owner()
        if owner is not None and (layer_kind(resolved) == "matmul" or (
                isinstance(node.func, ast.Attribute) and node.func.attr in MATMUL_METHODS)):
            self.layers.setdefault(owner, set()).add("matmul")  # in a helper's body too, not only what it returns
        self.generic_visit(node)

    def _reads_on_host(self, node: ast.Call, func: str | None, function: _Function) -> bool:
        """Does the call compute a tensor and read it on the host: `(a == b).sum().item()`,
        `float(torch.sum(tp))`, or `float(corr)` / `corr.item()` of a name the function bound
        to a torch call (`corr = torch.sum(a == b)`)? Reading a tensor it was given
        (`v.item()` in a logger's `update(**losses)`) is not: the caller computed it."""
        if isinstance(node.func, ast.Attribute) and node.func.attr in ("item", "tolist") and not node.args:
            read = node.func.value
        elif func in ("float", "int") and len(node.args) == 1:
            read = node.args[0]
        else:
            return False
        if isinstance(read, ast.Call):
            return isinstance(read.func, ast.Attribute) or (self.resolve(dotted(read.func)) or "").startswith("torch.")
        return isinstance(read, ast.Name) and (self.resolve(function.made_by.get(read.id)) or "").startswith("torch.")

    def visit_Return(self, node: ast.Return) -> None:
        function = self.function_stack[-1] if self.function_stack else None
        if function is not None and node.value is not None and (self._mentions_cuda(node.value) or (
                isinstance(node.value, ast.Name)  # pytorchic-bert's `device = torch.device("cuda" if ...)`, `return device`
                and any(self._mentions_cuda(value) for value in function.local_values.get(node.value.id, ())))):
            function.returns_cuda = True
        if function is not None and function.class_name is None and len(self.function_stack) == 1 \
                and node.value is not None:
            value = node.value
            if isinstance(value, ast.Name) and len(function.local_values.get(value.id, ())) == 1:
                value = function.local_values[value.id][0]  # `ds_config = {...}`, then `return ds_config`
            data = json.dumps(_dict_data(value, 0)) if isinstance(value, ast.Dict) else None
            if self.returned_dicts.setdefault(function.name, data) != data:
                self.returned_dicts[function.name] = None
        if function is not None:
            forwarded = self._forwarded(function, node.value)
            function.forwards = forwarded if function.forwards in (None, forwarded) else ""
        if function is not None and function.class_name is None and node.value is not None:
            value = node.value
            for element in value.elts if isinstance(value, ast.Tuple) else [value]:  # `return model, optimizer` too
                made = function.made_by.get(element.id) if isinstance(element, ast.Name) else None
                if made is not None:  # `model = ResNet(...); return model`
                    self._builds(function.name, made)
            for call in (n for n in _walk(value) if isinstance(n, ast.Call)):
                self._builds_through(function.name, call)
        self.generic_visit(node)

    def _forwarded(self, function: _Function, value: ast.expr | None) -> str:
        """The call (as written) whose result ``value`` returns unchanged: `make(...)` itself, or
        the names `a, b = make(...)` bound, in their order; "" for anything else."""
        if isinstance(value, ast.Call):
            return dotted(value.func) or ""
        if not isinstance(value, ast.Tuple) or not value.elts:
            return ""
        makers = {function.made_by.get(e.id) if isinstance(e, ast.Name) else None for e in value.elts}
        in_order = all(isinstance(e, ast.Name) and self.positions.get((id(function.made_by), e.id)) == i
                       for i, e in enumerate(value.elts))
        if len(makers) != 1 or not in_order:
            return ""
        return next(iter(makers)) or ""

    def _builds_through(self, owner: str, call: ast.Call) -> None:
        """What a call builds for ``owner``: the callee, and classes passed to it
        (`ResNet(BasicBlock, [2, 2, 2, 2])`, `self._make_layer(Bottleneck, 64)`)."""
        for name in [dotted(call.func), *(dotted(arg) for arg in call.args)]:
            if name is not None:
                self._builds(owner, name)

    def _builds(self, owner: str, func: str) -> None:
        self.builds.setdefault(owner, set()).add(func)
        qualified = self.resolve(func)
        layer = layer_kind(qualified)
        if zoo_cnn(qualified):  # `torchvision.models.resnet50`: convolutions and a classifier head
            self.layers.setdefault(owner, set()).update((2, "matmul"))
        elif diffusers_conv_net(qualified):  # `UNet2DConditionModel.from_config(...)`: convolutions and attention
            self.layers.setdefault(owner, set()).update((2, "matmul", "heavy"))
        elif layer is not None:
            self.layers.setdefault(owner, set()).add(layer)
            if layer == "opaque" and (qualified or "").split(".", 1)[0] in _EXTERNAL:
                self.layers[owner].add("external")  # another library's network: its layers stay unknown
        if qualified in MATMUL_LAYERS:  # more than a classifier head
            self.layers.setdefault(owner, set()).add("heavy")

    def _folding_for_inference(self) -> bool:
        """Code in a method that folds a trained module's layers for inference (YOLO's `fuse()`
        multiplying conv and batch-norm weights with `torch.mm`, RepVGG's `switch_to_deploy()`,
        MobileOne's `reparameterize()`): not layers the training runs. Such a method takes no
        argument but `self`: a VAE's `reparameterize(self, mu, logvar)` is a training step's."""
        method = self.function_stack[0] if self.function_stack else None
        return method is not None and method.class_name is not None and method.params == ("self",) \
            and _INFERENCE_FOLDING.match(method.name.rpartition(".")[2]) is not None

    def _layer_owner(self) -> str | None:
        """Whose layers code here adds to: the class around it (not in a method that folds
        layers for inference), else the module-level function."""
        if self.class_stack:
            return None if self._folding_for_inference() else self.class_stack[-1]
        function = self.function_stack[0] if self.function_stack else None
        return function.name if function is not None and function.class_name is None else None

    def visit_BinOp(self, node: ast.BinOp) -> None:
        owner = self._layer_owner()
        if isinstance(node.op, ast.MatMult) and owner is not None:
            self.layers.setdefault(owner, set()).update(("matmul", "heavy"))  # `q @ k.transpose(-2, -1)`
        self.generic_visit(node)

    def _is_marker(self, node: ast.Call, func: str | None) -> bool:
        target = node.func
        if isinstance(target, ast.Attribute):
            if target.attr == "backward":
                return True
            if target.attr == "step":
                receiver = dotted(target.value)
                made = self._made_by(receiver)
                if made is not None and (made.startswith("torch.optim.") or made.endswith("GradScaler")):
                    return not made.startswith("torch.optim.lr_scheduler")
                return receiver is not None and is_optimizer_name(receiver)
        elif self.resolve(func) == "torch.autograd.backward":
            return True
        positional = [dotted(arg) for arg in node.args if not isinstance(arg, ast.Starred)]
        return is_loss_scaler_call(func, positional, {kw.arg for kw in node.keywords if kw.arg})

    def _made_by(self, name: str | None) -> str | None:
        if name is None or not self.function_stack:
            return None
        made = self.function_stack[-1].made_by.get(name)
        return self.resolve(made) or made if made else None

    # ------------------------------------------------------------------ results
    def facts(self) -> ModuleFacts:
        step_functions = {name for name, function in self.functions.items() if function.steps}
        for loop in self.loops:  # one call deep, as in the file's own index; also a step function handed to a
            # call that runs it (I-JEPA's `gpu_timer(train_step)`)
            if not loop.marker and (any(self._local_callee(callee, loop) in step_functions for callee, _ in loop.calls)
                                    or any(name in step_functions for name in loop.handed)):
                loop.marker = True
        changed = True  # a choice made by a helper of the module counts for the functions that call it
        while changed:
            changed = False
            for function in self.functions.values():
                for callee in function.local_calls:
                    helper = self.functions.get(callee)
                    if helper is not None and (helper.tf32 > function.tf32 or helper.cudnn > function.cudnn):
                        function.tf32, function.cudnn, changed = function.tf32 or helper.tf32, function.cudnn or helper.cudnn, True
        functions = {name: self._function_facts(function) for name, function in self.functions.items()}
        self.parsed_names.update(functions[name].params[index] for name, index in self.parsed_into
                                 if name in functions and index < len(functions[name].params) and "." not in name)
        self._passed_on(functions)
        functions.update(self._constructors(functions))
        for name, target in self.partials.items():  # called as what it wraps
            functions.setdefault(name, functions.get(target, FunctionFacts()))
        for owner in self.builds:  # layers a star import brings: unknown here, the linker looks them up
            if self._star_parts(owner):
                self.layers.setdefault(owner, set()).add("opaque")
        parts = self._parts_reached()
        for name, layers in self._layers_reached().items():
            if name in functions:
                dims = tuple(sorted(layer for layer in layers if isinstance(layer, int)))
                # "opaque" without "external": only the project's own parts are unknown here
                unknown = not parts.get(name) and "opaque" in layers or "external" in layers
                functions[name] = replace(functions[name], conv_dims=dims, rnn="rnn" in layers,
                                          matmul=bool(layers & {"rnn", "matmul", "opaque"}),
                                          matmuls=bool(layers & {"rnn", "heavy", "opaque"}), sparse="sparse" in layers,
                                          parts=parts.get(name, ()) if "opaque" in layers else (),
                                          matmul_but_parts=bool(layers & {"rnn", "matmul"}) or unknown,
                                          matmuls_but_parts=bool(layers & {"rnn", "heavy"}) or unknown)
        return ModuleFacts(
            imports=tuple(sorted(self.bindings.items())),
            star_imports=tuple(self.star),
            cuda=self.cuda,
            cuda_names=tuple(sorted(self.cuda_names | self.cuda_classes | self._cuda_returners())),
            functions=functions,
            hot_calls=_project_names(self._hot_calls()),
            env_calls=_project_names(self._loop_calls([loop for loop in self.loops if loop.between_env_steps()],
                                                      every_maker=True)),
            forward_calls=_project_names(self._forward_calls()),
            forward_modules=_project_names(self._forward_modules()),
            loader_calls=self._loader_calls(),
            loader_hands=self._loader_hands(),
            kwargs_given=self._resolved(self.kwargs),
            arguments_given=self._resolved(self.arguments),
            options=tuple(sorted({**self.options, **{dest: value for dest, value in self.reset_defaults.items()
                                                     if dest in self.options}}.items())),
            parsed_names=tuple(sorted(self.parsed_names)),
            constants=tuple(sorted([*((name, shown) for name, shown in self.module_constants.items()
                                      if shown and not shown.startswith("@")), *self._dict_constants()])),
            references=tuple(sorted(self.references)),
            trains=any(loop.marker for loop in self.loops),
            main_guard=self.entry,
            constructions=tuple(sorted(self.constructions)),
            gated_constructions=tuple(sorted(self.gated)),
            dispatches=tuple(sorted(
                (option, entries) for option, entries, name in self.dispatches if name not in self.entry_dicts_used
                and not any(reference.startswith(qualified + ".") for _, qualified in entries for reference in self.references))),
            no_grad_calls=tuple(sorted(self.no_grad_calls)),
            no_grad_methods=tuple(sorted(self.no_grad_methods)),
            env_methods=tuple(sorted({callee.rpartition(".")[2] for loop in self.loops if loop.between_env_steps()
                                      for callee, guarded in loop.calls
                                      if not guarded and "." in callee and self.resolve(callee) is None})),
            object_methods=tuple(sorted(self.object_methods)),
            lightning=self.lightning,
            unpinned_loaders=self.loaders[0] > 0 and not self.loaders[1],
            cuda_default=self.cuda_default[1] or (self.cuda_default[0] and self.entry),
            class_layers=tuple(self.class_layers),
            cudnn=self.cudnn_at_top or (self.cudnn and self.entry),
            cudnn_at_import=self.cudnn_at_top,
            skips_submodules=self.skips_submodules,
            double_backward=self.double_backward,
            tf32=self.tf32_at_top or (self.tf32 and self.entry),
            class_bases=tuple(self.class_bases),
            returned_dicts=tuple((name, data) for name, data in sorted(self.returned_dicts.items()) if data is not None),
            handed_functions=self._resolved([(callee, slot, name) for callee, slot, name in self.handed
                                             if name in self.functions]),
        )

    def _dict_constants(self) -> Iterator[tuple[str, str]]:
        """`base_config['model_path']` -> its repr, for the module's dicts that nothing changes."""
        for name, items in self.module_dicts.items():
            if items is not None and name not in self.changed_dicts:
                yield from ((f"{name}[{key!r}]", shown) for key, shown in items.items())

    def _resolved(self, given: list[tuple[str, str, str]]) -> tuple[tuple[str, str, str], ...]:
        """(callee, key, value) with the callee's qualified name (project modules only), an
        option's argparse default for its `@name` and a module constant's value for its `=name`."""
        known = {"@": {**self.defaults, **self.reset_defaults}, "=": self.module_constants}
        return tuple(sorted({
            (target, key, known[value[0]].get(value[1:], "") if value[:1] in known else value)
            for func, key, value in given
            if (target := func if func.startswith("*") else self.resolve(func)) and target.split(".", 1)[0] not in _EXTERNAL
        }))

    def _passed_on(self, functions: dict[str, FunctionFacts]) -> None:
        """`def train(self, epoch): self.iteration(epoch, self.train_data)` where `iteration`'s
        training loop iterates its `data_loader`: `train` iterates `self.train_data` (two calls deep)."""
        for _ in range(2):
            for name, function in self.functions.items():
                facts = functions[name]
                for callee, given in function.passes:
                    head, _, rest = callee.partition(".")
                    key = f"{function.class_name}.{rest}" if head == "self" and function.class_name else callee
                    other = functions.get(key) if key != name else None
                    if other is None or not other.iterated:
                        continue
                    params = other.params[1:] if other.params[:1] == ("self",) else other.params
                    taken = {(params[int(slot)] if slot.isdigit() and int(slot) < len(params) else slot): arg
                             for slot, arg in given.items()}
                    loops = [arg for param, arg in taken.items() if param in other.iterated and arg not in facts.iterated]
                    if loops:
                        facts = replace(facts, trains=True, uploads=facts.uploads or other.uploads,
                                        iterated=facts.iterated + tuple(loops),
                                        epochs=facts.epochs + tuple(a for p, a in taken.items() if p in other.epochs))
                functions[name] = facts

    def _parts(self, owner: str) -> tuple[str, ...]:
        """What ``owner`` builds of other modules (not libraries), by qualified name; a name that
        only a star import can bind (`DoubleConv` after `from .unet_parts import *`) as `*.DoubleConv`."""
        return tuple(sorted({qualified for name in self.builds.get(owner, ()) if (qualified := self.resolve(name))
                             and qualified.split(".", 1)[0] not in _EXTERNAL} | self._star_parts(owner)))

    def _star_parts(self, owner: str) -> set[str]:
        if not self.star:
            return set()
        local = self._local_names()
        return {f"*.{name}" for name in self.builds.get(owner, ()) if "." not in name and name not in self.bindings
                and name not in local and name not in _BUILTINS}

    def _local_names(self) -> frozenset[str]:
        """The classes and functions the file defines, and what builds something (asked once the
        whole file is read, then kept)."""
        if self._local is None:
            self._local = frozenset(self.class_names | {name.split(".", 1)[0] for name in self.functions}
                                    | set(self.builds))
        return self._local

    def _parts_reached(self) -> dict[str, tuple[str, ...]]:
        """What each class or factory builds of other modules, itself or through the file's own
        classes and helpers it builds (`create_model()` returning `UNetModel(...)`, which builds
        nn.py's `conv_nd`), to a fixed point."""
        found = {owner: set(self._parts(owner)) for owner in self.builds}
        changed = True
        while changed:
            changed = False
            for owner, called in self.builds.items():
                reached = set().union(*(found.get(name, set()) for name in called if name != owner))
                if not reached <= found[owner]:
                    found[owner] |= reached
                    changed = True
        return {owner: tuple(sorted(parts)) for owner, parts in found.items()}

    def _layers_reached(self) -> dict[str, set[int | str]]:
        """Classes and factories that build convolutions or RNNs, through the file's own classes
        and helpers they call (`conv3x3()` returning `nn.Conv2d`), to a fixed point."""
        found = {name: set(found) for name, found in self.layers.items()}
        changed = True
        while changed:
            changed = False
            for owner, called in self.builds.items():
                reached = set().union(*(found.get(name, set()) for name in called))
                if not reached <= found.get(owner, set()):
                    found.setdefault(owner, set()).update(reached)
                    changed = True
        return found

    def _cuda_returners(self) -> set[str]:
        """Module-level functions that return a CUDA device (`get_device()`, `try_gpu()`)."""
        return {name for name, function in self.functions.items() if function.returns_cuda and not function.class_name}

    def _local_callee(self, callee: str, loop: _Loop) -> str | None:
        """`f(...)`, `self.f(...)` or `obj.f(...)` with `obj = Cls(...)` of this file: the
        function's key in ``self.functions``."""
        if "." not in callee:
            return callee
        head, _, rest = callee.partition(".")
        if "." in rest:
            return None
        owner = loop.function.class_name if loop.function is not None else None
        if head == "self":
            return f"{owner}.{rest}" if owner else None
        made = (loop.function.made_by if loop.function is not None else self.made_at_module).get(head)
        return f"{made}.{rest}" if made is not None and f"{made}.{rest}" in self.functions else None

    def _function_facts(self, function: _Function) -> FunctionFacts:
        training = [loop for loop in function.loops if loop.marker]
        return FunctionFacts(
            params=function.params,
            steps=function.steps,
            trains=bool(training),
            iterated=_loop_sources(function, training),
            epochs=_loop_sources(function, [loop for loop in training if loop.nested]),
            changes=tuple(sorted(name for name in function.changes if name in function.params)),
            loops_over=_loop_sources(function, function.loops),
            repeats=_loop_sources(function, [loop for loop in function.loops if loop.nested]),
            sets_only=not function.calls,
            runs_parts=function.runs_parts,
            returns=self._returned_class(function),
            uploads=any(loop.uploads for loop in training),
            moves=function.moves,
            makes_on_device=function.makes_on_device,
            adapters=function.adapters,
            cuda=function.cuda,
            syncs=function.syncs,
            switches_sync=function.switches_sync,
            cudnn=function.cudnn,
            tf32=function.tf32,
            pads=function.pads,
            blocking_copies=tuple(sorted(function.blocking_copies)),
            calls_params=tuple(dict.fromkeys(callee for loop in training for callee, guarded in loop.calls
                                             if not guarded and callee in function.params)),
        )

    def _returned_class(self, function: _Function) -> str:
        """``FunctionFacts.returns``: the class of this module whose new object every return gives."""
        made = function.forwards or ""
        if made == "cls" and function.class_name:
            made = function.class_name
        return made if made in self.class_names else ""

    def _constructors(self, functions: dict[str, FunctionFacts]) -> dict[str, FunctionFacts]:
        """`Trainer(model, loader, device)`: what its methods do with what `__init__` stores."""
        result: dict[str, FunctionFacts] = {}
        classes = {function.class_name for function in self.functions.values() if function.class_name}
        for owner in classes:
            methods = [(name, facts) for name, facts in functions.items() if name.startswith(owner + ".")]
            init = self.functions.get(f"{owner}.__init__")
            params = init.params[1:] if init is not None else ()
            stored = init.stored if init is not None else {}
            iterated = [stored[attr[5:]] for _, facts in methods for attr in facts.iterated
                        if attr.startswith("self.") and attr[5:] in stored]
            looped = [stored[attr[5:]] for _, facts in methods for attr in facts.loops_over
                      if attr.startswith("self.") and attr[5:] in stored]
            epochs = [stored[attr[5:]] for _, facts in methods for attr in facts.epochs
                      if attr.startswith("self.") and attr[5:] in stored]
            result[owner] = FunctionFacts(
                params=params,
                steps=any(facts.steps for _, facts in methods),  # an agent whose `train()` takes one step
                trains=any(facts.trains for _, facts in methods),
                iterated=tuple(dict.fromkeys(iterated)),
                epochs=tuple(dict.fromkeys(epochs)),  # `Solver(loader).train()` with an epoch loop around it
                loops_over=tuple(dict.fromkeys(looped)),
                uploads=any(facts.uploads for _, facts in methods),
                cuda=any(facts.cuda for _, facts in methods) or owner in self.cuda_classes,
            )
        return result

    def _loader_calls(self) -> tuple[tuple[str, bool, bool, int], ...]:
        """Imported functions whose result a training loop iterates: `loader = get_loader(...)`
        then `for x, y in loader:` (the DataLoader is built, and gets its fix, in their file), and
        which element of the tuple they return it is (`train_loader, val_loader = get_loaders()`)."""
        found: dict[tuple[str, int], tuple[bool, bool]] = {}
        called_in_loops = {self._local_callee(callee, loop) for loop in self.loops for callee, _ in loop.calls} - {None}
        for loop in self.loops:
            if not loop.marker or loop.iterable is None:
                continue
            function = loop.function
            made_by = function.made_by if function is not None else self.made_at_module
            made = made_by.get(loop.iterable)
            if made is None and function is not None and function.class_name:
                made = self.class_made_by.get(function.class_name, {}).get(loop.iterable)  # `self.train_loader`
            if made is None and function is not None and loop.iterable in self.made_at_module \
                    and loop.iterable not in function.local_values and loop.iterable not in function.params:
                made_by = self.made_at_module  # TCN's `train()` iterating the module's `train_loader`
                made = made_by.get(loop.iterable)
            position = self.positions.get((id(made_by), loop.iterable), -1)
            for maker in dict.fromkeys([*self.makers.get((id(made_by), loop.iterable or ""), []), made]):
                qualified = self.resolve(self._forwarded_maker(maker, function))
                if qualified is None or qualified.split(".", 1)[0] in _EXTERNAL:
                    continue
                per_epoch, uploads = found.get((qualified, position), (False, False))
                # every epoch: a loop inside another, or in a function this file calls in a loop (`trainer.training(epoch)`)
                again = loop.nested or (function is not None and function.name in called_in_loops)
                found[(qualified, position)] = (per_epoch or again, uploads or loop.uploads)
        # `train(model, train_loader)` with `train_loader, _ = get_loaders()`: a function of this
        # file whose training loop iterates that parameter (one of another file: ``loader_hands``)
        for made, callee, slot, position in self.hands:
            function = self.functions.get(callee)
            qualified = self.resolve(made)
            if function is None or function.class_name is not None or qualified is None \
                    or qualified.split(".", 1)[0] in _EXTERNAL:
                continue
            param = function.params[int(slot)] if slot.isdigit() and int(slot) < len(function.params) else slot
            loops = [loop for loop in function.loops if loop.marker and loop.iterable == param]
            if loops:
                per_epoch, uploads = found.get((qualified, position), (False, False))
                again = any(loop.nested for loop in loops) or function.name in called_in_loops
                found[(qualified, position)] = (per_epoch or again, uploads or any(loop.uploads for loop in loops))
        return tuple((name, *uses, position) for (name, position), uses in sorted(found.items()))

    def _forwarded_maker(self, maker: str | None, function: _Function | None) -> str | None:
        """``maker``; for a function of this file that returns another call's result unchanged
        (`data_set, data_loader = data_provider(args, flag)` then `return data_set, data_loader`
        in `self._get_data(flag)`), that call's maker."""
        if maker is None:
            return None
        head, _, rest = maker.partition(".")
        owner = function.class_name if function is not None else None
        local = self.functions.get(f"{owner}.{rest}" if head == "self" and owner and "." not in rest else maker)
        return local.forwards if local is not None and local.forwards else maker

    def _loader_hands(self) -> tuple[tuple[str, str, str, int], ...]:
        """Loaders made by an imported function and handed to another (resolved through the imports)."""
        found = set()
        for made, callee, slot, position in self.hands:
            maker, target = self.resolve(made), self.resolve(callee)
            if maker and target and maker.split(".", 1)[0] not in _EXTERNAL and target.split(".", 1)[0] not in _EXTERNAL:
                found.add((maker, target, slot, position))
        return tuple(sorted(found))

    def _forward_calls(self) -> Iterator[str | None]:
        """What the `forward` of each class calls, directly or through its own methods two levels
        down (`self._attend(...)` building a mask object): it runs on every step of a training."""
        for name, function in self.functions.items():
            if function.class_name is None or not name.endswith(".forward"):
                continue
            reached, todo = {name}, [(function, 0)]
            while todo:
                current, depth = todo.pop()
                for callee in current.called:
                    method = f"{function.class_name}.{callee[5:]}" if callee.startswith("self.") else None
                    if method in self.functions and method not in reached and depth < 2:
                        reached.add(method)
                        todo.append((self.functions[method], depth + 1))
                    elif method is None:
                        yield self.resolve(callee)

    def _forward_modules(self) -> Iterator[str | None]:
        """`Class.forward` (qualified) of the imported module classes whose objects run on every
        step: called in a training loop (`model(x)` with `model = Net()`), or called by the
        `forward` of a class of this file (`self.lr(x)` with `self.lr = LengthRegulator()`)."""
        for loop in self.loops:
            if not loop.marker:
                continue
            made_by = loop.function.made_by if loop.function is not None else self.made_at_module
            for callee, guarded in loop.calls:
                if guarded or "." in callee:
                    continue
                # every maker: `model, optim = get_model(...)`, then `model = nn.DataParallel(model)`
                for made in self.makers.get((id(made_by), callee), [made_by.get(callee)]):
                    yield self._forward_of(made)
        for name, function in self.functions.items():
            if function.class_name is None or not name.endswith(".forward"):
                continue
            attributes = self.class_made_by.get(function.class_name, {})
            for callee in function.called:
                yield self._forward_of(attributes.get(callee) if callee.startswith("self.") and callee.count(".") == 1 else None)

    def _forward_of(self, made: str | None) -> str | None:
        """`pkg.Class.forward` for an object made by ``made`` (as written), when it resolves."""
        owner = self.resolve(made) if made is not None else None
        return f"{owner}.forward" if owner is not None else None

    def _hot_calls(self) -> Iterator[str | None]:
        """Imported functions and methods of imported classes called on every step: in a loop
        that steps, or in a method a framework runs every step (a LightningModule's or a Hugging
        Face Trainer's `training_step`, Lightning's per-batch hooks), outside periodic guards
        (so-vits-svc's `commons.clip_grad_value_(...)` in its `training_step`)."""
        yield from self._loop_calls([loop for loop in self.loops if loop.marker])
        for name, function in self.functions.items():
            if function.class_name is not None and name.rpartition(".")[2] in _STEP_METHODS:
                for callee in function.called:
                    if not callee.startswith("self."):
                        yield self.resolve(callee)

    def _loop_calls(self, loops: list[_Loop], *, every_maker: bool = False) -> Iterator[str | None]:
        """Imported functions and methods of imported classes that ``loops`` call outside a
        periodic guard; with ``every_maker``, a method of each class the object may be (`agent =
        algo.PPO(...)` in one branch, `algo.A2C_ACKTR(...)` in another)."""
        for loop in loops:
            for callee, guarded in loop.calls:
                if guarded:
                    continue
                head, _, rest = callee.partition(".")
                made_by = loop.function.made_by if loop.function is not None else self.made_at_module
                made = made_by.get(head) if rest else None  # `logger = Logger(...)`, then `logger.log(...)`
                if made is not None and "." not in rest:
                    makers = self.makers.get((id(made_by), head), [made]) if every_maker else [made]
                    for maker in dict.fromkeys(makers):
                        owner = self.resolve(maker)
                        yield f"{owner}.{rest}" if owner else None
                else:
                    yield self.resolve(callee)


def _skips_submodules(node: ast.ClassDef) -> bool:
    """Does the class's `forward` call a submodule (`self.name(...)`, not a method of the class)
    only in some calls: under an `if` on one of its arguments, or after such an `if` that returns?
    (What ``networks.skips_submodules`` asks of the file's own classes.)"""
    methods = {s.name for s in node.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
    forward = next((s for s in node.body if isinstance(s, ast.FunctionDef) and s.name == "forward"), None)
    if forward is None:
        return False
    args = forward.args
    arguments = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)} - {"self"}
    return bool(arguments) and _gated_call(forward.body, arguments, methods, gated=False)


def _gated_call(statements: list[ast.stmt], arguments: set[str], methods: set[str], *, gated: bool) -> bool:
    for statement in statements:
        if isinstance(statement, ast.If):
            on_argument = any(isinstance(n, ast.Name) and n.id in arguments for n in _walk(statement.test))
            if any(_gated_call(branch, arguments, methods, gated=gated or on_argument)
                   for branch in (statement.body, statement.orelse)):
                return True
            if on_argument and statement.body and isinstance(statement.body[-1], ast.Return):
                gated = True  # `if return_features: return x`: what follows runs only in some calls
        elif isinstance(statement, (ast.For, ast.While, ast.With, ast.Try)):
            inner = [getattr(statement, "body", []), getattr(statement, "orelse", [])]
            if any(_gated_call(block, arguments, methods, gated=gated) for block in inner):
                return True
        elif gated and any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                           and isinstance(n.func.value, ast.Name) and n.func.value.id == "self"
                           and n.func.attr not in methods for n in _walk(statement)):
            return True
    return False


# Calls that take gradients, with `create_graph=` to differentiate them again.
_GRADIENT_CALLS = frozenset({"torch.autograd.grad", "torch.autograd.backward"})

# Methods a framework runs on every training step.
_STEP_METHODS = frozenset({*HF_STEP_METHODS, *LIGHTNING_STEP_HOOKS})


def _blocking_copy_of(node: ast.Call) -> str | None:
    """The name `x` of `x.cuda()` or `x.to(device)` (a device, not a dtype: a name or a string)
    when the copy blocks: no `non_blocking`, nor more positional arguments that may set it."""
    func = node.func
    if not isinstance(func, ast.Attribute) or not isinstance(func.value, ast.Name) or node.keywords and any(
            keyword.arg in (None, "non_blocking") for keyword in node.keywords):
        return None
    if func.attr == "cuda":
        return func.value.id if len(node.args) <= 1 else None
    device = node.args[0] if len(node.args) == 1 else None
    if isinstance(device, ast.Name) and "dtype" not in device.id or isinstance(device, ast.Constant) \
            and isinstance(device.value, str) and "cuda" in device.value:
        return func.value.id
    return None  # `.to(torch.float16)`, `.to("cpu")`, `.to(device, dtype)`: a cast, or no copy to the GPU


def _project_names(qualified: Iterable[str | None]) -> tuple[str, ...]:
    """The names that may be the project's own (not torch, numpy, ...), sorted, once each."""
    return tuple(sorted({q for q in qualified if q is not None and q.split(".", 1)[0] not in _EXTERNAL}))


def _loop_sources(function: _Function, loops: list[_Loop]) -> tuple[str, ...]:
    """The parameters (or, in a method, `self.` attributes: the constructor maps them to its
    parameters) that ``loops`` iterate."""
    found = []
    for loop in loops:
        name = loop.iterable or ""
        if name in function.params or (name.startswith("self.") and function.class_name):
            found.append(name)
    return tuple(dict.fromkeys(found))


# Imports that can never be a scanned project's own module: their names are not kept as
# references (a smaller cache; the linker would find nothing for them anyway). Not `datasets`:
# many projects keep their own `datasets/` package (its loader factories matter).
_LIGHTNING_CLASSES = frozenset((*LIGHTNING_MODULE, *LIGHTNING_DATAMODULE))
_BUILDERS = (".from_argparse_args",)  # classmethods that build the class (Lightning 1.x)
_BUILTINS = frozenset(dir(builtins))
_CONTAINERS = frozenset({"torch.nn.Sequential", "torch.nn.ModuleList", "torch.nn.ModuleDict"})
_EXTERNAL = frozenset({
    "torch", "torchvision", "torchaudio", "torchtext", "numpy", "os", "sys", "math", "time", "json", "re", "random",
    "typing", "collections", "functools", "itertools", "argparse", "logging", "pathlib", "dataclasses", "warnings",
    "transformers", "timm", "lightning", "pytorch_lightning", "accelerate", "tqdm", "PIL", "matplotlib", "pandas",
    "sklearn", "scipy", "wandb", "tensorboard", "shutil", "subprocess", "contextlib", "copy",
})


# What a method calls that runs no layer: nn.Module's own methods, a tensor's host reads, saving and loading.
_BOOKKEEPING = MODULE_API | {
    "item", "tolist", "numpy", "detach", "clone", "size", "dim", "numel", "fill_", "zero_", "copy_", "save", "load",
}


# Calls that run no layer whatever they are given: builtins, printing, files and the host's libraries.
_HOUSEKEEPING_CALLS = frozenset({
    "print", "open", "str", "repr", "len", "int", "float", "bool", "round", "abs", "min", "max", "sum", "dict", "list",
    "tuple", "set", "sorted", "isinstance", "hasattr", "getattr", "setattr", "filter", "map", "zip", "enumerate",
    "range", "format", "vars", "type", "Path",
})
_HOUSEKEEPING_MODULES = frozenset({"os", "sys", "json", "pickle", "logging", "np", "numpy", "math", "time", "shutil",
                                   "pathlib", "warnings", "yaml"})


def _runs_a_part(func: str | None) -> bool:
    """A call that may run a layer or compute with the weights (`self.fc(x)`, `F.linear(x,
    self.w)`, `self.layers[i](x)`): anything but nn.Module bookkeeping and a tensor's host reads
    (`self.state_dict()`, `self.step.data.item()`), builtins and the host's libraries (`torch.save`
    of a state dict, `print`, `os.path.join`)."""
    if func is None:
        return True
    return not (func.rsplit(".", 1)[-1] in _BOOKKEEPING or func in _HOUSEKEEPING_CALLS
                or func.split(".", 1)[0] in _HOUSEKEEPING_MODULES)


_DISPATCH = {
    getattr(ast, name[len("visit_"):]): method
    for name, method in vars(_Collector).items()
    if name.startswith("visit_") and hasattr(ast, name[len("visit_"):])
}
# Nodes with no handler and no child a handler could see (a name's fields are its text and its
# `Load`/`Store`; the operators and contexts have no fields): the walk skips them.
_INERT = frozenset(
    cls for cls in (getattr(ast, name) for name in dir(ast))
    if isinstance(cls, type) and issubclass(cls, ast.AST) and cls not in _DISPATCH
    and (not cls._fields or cls is ast.Name)
)


DICT_UNKNOWN = "\0unknown"  # a value of a returned dict that is no constant
DICT_ANY_KEY = "\0unresolved"  # ... and the key standing for keys that are no constant strings (`**base`)


def _dict_data(node: ast.Dict, depth: int) -> dict[str, Any]:
    """A dict literal as data: nested dicts and constants; DICT_UNKNOWN for anything else."""
    found: dict[str, Any] = {}
    for key, value in zip(node.keys, node.values):
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            found[key.value] = _value_data(value, depth)
        else:
            found[DICT_ANY_KEY] = DICT_UNKNOWN
    return found


def _value_data(node: ast.expr, depth: int) -> Any:
    if isinstance(node, ast.Dict) and depth < 8:
        return _dict_data(node, depth + 1)
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool, type(None))):
        return node.value
    return DICT_UNKNOWN
