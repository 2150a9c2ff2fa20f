"""The DeepSpeed configuration a script names, read without running the script.

A config reaches DeepSpeed as a dict (`deepspeed.initialize(..., config=ds_config)`), as the
path of a JSON file (`config="ds_config.json"`, `TrainingArguments(deepspeed="ds_z2.json")`,
`HfDeepSpeedConfig("ds.json")`, an argparse `--deepspeed_config` default), as a dict the script
loads from JSON (`ds_config = json.load(open(args.ds_file))`: the file each launch command
names, else the option's default), or on the command line of the project's launch scripts
(`deepspeed train.py --deepspeed ds_config.json`, in every command that runs the script), as a
path an f-string or `os.path.join` builds from the run's options (`f"ds/{args.model}_stage_{args.stage}.json"`
with `--model lora --stage 1` in every launch command, else the defaults; also kept in an item,
`args["ds_config_path"] = ...` after `args = vars(args)`), also as one branch of a conditional (`"ds.json" if args.deepspeed else None`: the config of every run
that uses DeepSpeed). A dict written in the file is read from its syntax tree (a value
such as `args.dtype == "fp16"` is worked out from the argparse default); a JSON file through
``ProjectFiles``: inside the project only, never bigger than its cap, and part of what the scan
cache checks. Each value of a JSON file keeps its line, so a finding points at it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import libcst as cst

from speedfix.model import launch
from speedfix.model.arguments import argparse_option, assigned_item, find_argument, string_value
from speedfix.model.config_tree import ConfigError, Node, TooDeep, load
from speedfix.model.context import FileContext
from speedfix.model.flow import compared, passed_arguments
from speedfix.model.frames import Stack
from speedfix.model.index import CallSite
from speedfix.model.loaded_config import built_string, loaded_names, run_strings
from speedfix.model.project_files import Location
from speedfix.project.facts import DICT_ANY_KEY, DICT_UNKNOWN
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import integer_value, walk_expression

# Calls that take a DeepSpeed config, and the keyword (and position) it is passed by.
CONFIG_TAKERS: dict[str, tuple[str, int | None]] = {
    "deepspeed.initialize": ("config", None),
    "deepspeed.init_inference": ("config", None),
    "transformers.TrainingArguments": ("deepspeed", None),
    "transformers.Seq2SeqTrainingArguments": ("deepspeed", None),
    "transformers.integrations.HfDeepSpeedConfig": ("config_file_or_dict", 0),
    "transformers.deepspeed.HfDeepSpeedConfig": ("config_file_or_dict", 0),
    "accelerate.DeepSpeedPlugin": ("hf_ds_config", 0),
    "accelerate.utils.DeepSpeedPlugin": ("hf_ds_config", 0),
}
_ARGPARSE_OPTIONS = ("deepspeed_config", "deepspeed")
_PLUGINS = ("accelerate.DeepSpeedPlugin", "accelerate.utils.DeepSpeedPlugin")
_INITIALIZE = DEEPSPEED_INITIALIZE = "deepspeed.initialize"
_HF_TAKERS = ("transformers.HfArgumentParser", "transformers.hf_argparser.HfArgumentParser", "trl.TrlParser",
              "transformers.Trainer", "accelerate.Accelerator")
# A script that can pass a DeepSpeed config has one of these (SF905 runs only there too); a
# Hugging Face script may get one from its launch command (`--deepspeed ds.json`).
MARKERS = (b"deepspeed", b"DeepSpeed", b"ds_config", b"HfArgumentParser", b"TrlParser")
UNRESOLVED = "\0unresolved"  # the key of a dict literal's values when some of its keys are unknown


@dataclass(frozen=True)
class DeepSpeedConfig:
    """A config as the script gives it: ``values`` (None when it cannot be read, ``problem`` says
    why), the node to report on (None: named by a launch command, at ``where``), and the JSON
    file's name and tree (None: a dict in the script)."""

    node: cst.CSTNode | None
    values: dict[str, Any] | None
    file: str | None = None
    literal: cst.Dict | None = None  # the dict as written, when the script holds it
    problem: str | None = None
    taker: str | None = None  # the call it is passed to (qualified), None: an argparse default
    name: str | None = None  # the variable that holds it (`ds_config`), when it is one
    tree: Node | None = None  # a JSON file's values with their lines
    where: Location | None = None  # the launch command's option that names the file
    some_runs: bool = False  # the launch commands name other files too: only the runs naming this one read it

    @property
    def for_trainer(self) -> bool:
        """Given to the Hugging Face Trainer or Accelerate, which fill in "auto" values and
        check fp16/bf16 against their own flags (a launch command's `--deepspeed` too, unless
        the script hands it to `deepspeed.initialize` itself)."""
        return self.taker is not None and self.taker != _INITIALIZE

    def location(self, *keys: str) -> Location | None:
        """The line of a key of a JSON file (the nearest enclosing key that exists)."""
        if self.tree is None:
            return None
        for end in range(len(keys), 0, -1):
            found = self.tree.get(*keys[:end])
            if found is not None:
                return found.at
        return self.tree.where


def named_configs(ctx: FileContext) -> list[DeepSpeedConfig]:
    """The DeepSpeed configs the script passes (or defaults to, or is launched with), in file
    order, one per node (a launch command's file: once)."""
    found: dict[tuple[int, str | None], DeepSpeedConfig] = {}
    for qualified, (keyword, position) in CONFIG_TAKERS.items():
        for site in ctx.calls_to(qualified):
            argument = find_argument(ctx, site, keyword, position)
            if argument.missing and qualified == _INITIALIZE:  # the older spelling, still taken
                argument = find_argument(ctx, site, "config_params")
            if argument.missing or argument.unknown or argument.node is None:
                continue
            for config in _read(ctx, argument.node, site):
                name = argument.node.value if isinstance(argument.node, cst.Name) else None
                found.setdefault((id(config.node), config.file), replace(config, taker=qualified, name=name))
    # a file named on the command line goes to `deepspeed.initialize(args=args)`, else the Trainer
    taker = _INITIALIZE if ctx.calls_to(_INITIALIZE) and not ctx.calls_to(*_HF_TAKERS) else "transformers.Trainer"
    for site in ctx.calls:
        config = _argparse_config(ctx, site)
        if config is not None:
            found.setdefault((id(config.node), config.file), replace(config, taker=taker))
    launched = _launched(ctx)
    if launched is not None and not any(config.file == launched.file for config in found.values()):
        found[(id(launched), launched.file)] = replace(launched, taker=taker)
    return list(found.values())


def _read(ctx: FileContext, node: cst.BaseExpression, site: CallSite, depth: int = 0) -> list[DeepSpeedConfig]:
    if isinstance(node, cst.IfExp):  # `deepspeed="ds.json" if args.deepspeed else None`
        return _either(ctx, node, site)
    stack = site.stack
    item = assigned_item(ctx, node)  # `args["ds_config_path"] = f"dsconfig/{args['model']}.json"`
    if item is not None:
        node, stack = item.value, item.stack
    if isinstance(node, cst.Name):
        value = ctx.single_value(node.value, site.stack)
        if value is None:
            return _passed_in(ctx, node.value, site, depth) if depth < 4 else []
        if isinstance(value, cst.Dict) and _items_set(ctx, node.value, site.stack):
            # `config_dict["bf16"] = {...}` under `if dtype == torch.bfloat16:`: any key may be set
            return [replace(config, values={**config.values, UNRESOLVED: ...}) for config in _read(ctx, value, site, depth)]
        node = value
    if isinstance(node, cst.Call) and built_string(ctx, node, stack) is None:  # `get_ds_config(args)` of this file
        built = _returned_dict(ctx, node)
        if built is None:
            elsewhere = _project_returned_dict(ctx, node)
            if elsewhere is not None:  # DeepSpeed-Chat's `get_train_ds_config(...)` of `utils/ds_utils.py`
                return [DeepSpeedConfig(node, elsewhere)]
            return _loaded(ctx, node, stack)  # `ds_config = json.load(open(args.ds_file))`: the file of each run
        node, stack = built
    if isinstance(node, cst.Dict):
        values = _literal_dict(ctx, node, stack)
        return [DeepSpeedConfig(node, values, literal=node)]
    name = node.evaluated_value if isinstance(node, cst.SimpleString) else built_string(ctx, node, stack)
    if isinstance(name, str) and name.endswith(".json"):  # a literal, or an f-string of the run's options
        config = _from_file(ctx, node, name)
        return [config] if config is not None else []
    return []


def _items_set(ctx: FileContext, name: str, stack: Stack) -> bool:
    """Does the function around ``stack`` set items of the dict ``name`` (`d["bf16"] = ...`, `d.update(...)`)?"""
    function = ctx.function_of(stack)
    return any(ctx.function_of(a.stack) is function for a in ctx.item_assignments.get(name, ())) or any(
        ctx.function_of(site.stack) is function and dotted_name(site.node.func) == f"{name}.update"
        for site in ctx.method_calls("update"))


def _passed_in(ctx: FileContext, name: str, site: CallSite, depth: int) -> list[DeepSpeedConfig]:
    """The config a parameter holds: `def train(model, ..., ds_config=None)` called once in the
    file with `ds_config=run_config.ds_config`, the `--ds_config` option each launch command
    passes (CleanTransformer's `--ds_config scripts/ds_config_example.json`)."""
    passed = passed_arguments(ctx, name, site.stack)
    if not passed or len(passed) != 1:
        return []
    given, stack = passed[0]
    if isinstance(given, cst.Name) and given.value == "None":
        return []
    if argparse_option(ctx, given) is not None:
        return _json_files(ctx, run_strings(ctx, given, stack))
    return _read(ctx, given, replace(site, stack=stack), depth + 1)  # a caller's own parameter in turn, a dict


def _either(ctx: FileContext, node: cst.IfExp, site: CallSite) -> list[DeepSpeedConfig]:
    """The configs of a conditional: a run with DeepSpeed reads the one config there is
    (`"ds.json" if args.deepspeed else None`: the other branch runs without DeepSpeed); when
    both branches name configs, each is only some runs' config."""
    branches = [branch for branch in (node.body, node.orelse)
                if not (isinstance(branch, cst.Name) and branch.value == "None")]
    found = [config for branch in branches for config in _read(ctx, branch, site)]
    return [replace(config, some_runs=True) for config in found] if len(branches) > 1 else found


def _loaded(ctx: FileContext, call: cst.Call, stack: Stack) -> list[DeepSpeedConfig]:
    """The JSON files a `json.load(...)` reads in the project's runs: the launch commands'
    `--ds_file ds_zero3.json`, else the option's default (a default that names no file of the
    project is no run's). A file only some runs read is marked ``some_runs``."""
    return _json_files(ctx, loaded_names(ctx, call, stack))


def _json_files(ctx: FileContext, given: list[tuple[str, Location | None]]) -> list[DeepSpeedConfig]:
    """The configs of the JSON files the runs name, each with the launch option that names it
    (None: a default or a literal); a file only some runs read is marked ``some_runs``."""
    project = ctx.project
    names = [(name, where) for name, where in given if name.endswith(".json")]
    if project is None:
        return []
    found = []
    for name, where in names:
        roots = (where.path.parent, project.top(), project.folder) if where is not None else (project.folder, project.top())
        path = project.find(name, roots)
        if path is not None:
            found.append(replace(_parse(ctx, path, name, None), where=where, some_runs=len(names) > 1))
    return found


def _project_returned_dict(ctx: FileContext, call: cst.Call) -> dict[str, Any] | None:
    """The dict literal a function of another scanned file returns (its project facts), its
    values that are no constants as ``...``: the keys it sets still count."""
    found = ctx.links.lookup(ctx.project_name(dotted_name(call.func))) if ctx.links.modules else None
    if found is None:
        return None
    data = dict(ctx.links.modules[found[0]].returned_dicts).get(found[1])
    return _unpacked(json.loads(data)) if data is not None else None


def _unpacked(value: Any) -> Any:
    if isinstance(value, dict):
        return {(UNRESOLVED if key == DICT_ANY_KEY else key): _unpacked(item) for key, item in value.items()}
    return ... if value == DICT_UNKNOWN else value


def _returned_dict(ctx: FileContext, call: cst.Call) -> tuple[cst.Dict, Stack] | None:
    """The dict a module-level function of the file returns (`return ds_config`, assigned once
    there, or a dict literal), with the stack its values are read in."""
    if not isinstance(call.func, cst.Name):
        return None
    functions = [info for info in ctx.functions.get(call.func.value, ()) if not info.stack]
    if len(functions) != 1 or not isinstance(functions[0].node, cst.FunctionDef):
        return None
    function = functions[0].node
    returns = [n.value for n in walk_expression(function.body) if isinstance(n, cst.Return) and n.value is not None]
    if len(returns) != 1:
        return None
    value = returns[0]
    if isinstance(value, cst.Name):
        local = [a for a in ctx.assignments.get(value.value, ()) if ctx.function_of(a.stack) is function]
        if len(local) != 1 or local[0].unpacked or not isinstance(local[0].value, cst.Dict):
            return None
        return local[0].value, local[0].stack
    return None


def _argparse_config(ctx: FileContext, site: CallSite) -> DeepSpeedConfig | None:
    """`parser.add_argument("--deepspeed_config", default="ds_config.json")`."""
    if not (site.func or "").endswith("add_argument") or not site.node.args:
        return None
    first = site.node.args[0].value
    if not isinstance(first, cst.SimpleString) or not isinstance(first.evaluated_value, str):
        return None
    if first.evaluated_value.lstrip("-").replace("-", "_") not in _ARGPARSE_OPTIONS:
        return None
    default = find_argument(ctx, site, "default").node
    if isinstance(default, cst.SimpleString) and isinstance(default.evaluated_value, str):
        if default.evaluated_value.endswith(".json"):
            return _from_file(ctx, default, default.evaluated_value)
    return None


def _launched(ctx: FileContext) -> DeepSpeedConfig | None:
    """The JSON file every launch command of the script names (`--deepspeed ds.json`)."""
    given = launch.option(ctx, *_ARGPARSE_OPTIONS)
    if not given.known or not isinstance(given.value, str) or not given.value.endswith(".json") or given.where is None:
        return None
    project = ctx.project
    assert project is not None  # launch commands are only read through the project's files
    path = project.find(given.value, (given.where.path.parent, project.top(), project.folder))
    if path is None:
        return None
    return replace(_parse(ctx, path, given.value, None), where=given.where)


def supplies_optimizer(ctx: FileContext) -> bool:
    """Does DeepSpeed build or step the optimizer (an `"optimizer"` section: its own fused Adam; an
    optimizer offloaded to the CPU: its CPU Adam, on the host) in every
    config the script is given: those ``named_configs`` finds, or, when the launch commands
    name different files (`--deepspeed ds_gpt2.json`, `--deepspeed ds_neo.json`), each of them?"""
    configs = named_configs(ctx)
    if not configs:
        configs = []
        for command, config in per_launch_command(ctx):
            if config is None and not any(key in command.options for key in _ARGPARSE_OPTIONS):
                return False  # a run without DeepSpeed: the Trainer's own optimizer
            if config is not None:  # (a file named by a variable, `$DS_CONFIG`, says nothing either way)
                configs.append(config)
    return bool(configs) and all(config.values is not None and (
        isinstance(config.values.get("optimizer"), dict)
        or ("offload_optimizer", "device") in offloaded(section(config.values, "zero_optimization")))
        for config in configs)


def per_launch_command(ctx: FileContext) -> list[tuple[launch.Launch, DeepSpeedConfig | None]]:
    """Each launch command of the script with the JSON file it passes (`--deepspeed ds.json`),
    also where the commands name different files (a LoRA run's config beside a full fine-tune's);
    None for a command that passes none, or a file the project does not hold."""
    found: list[tuple[launch.Launch, DeepSpeedConfig | None]] = []
    project = ctx.project
    for command in launch.launches(ctx):
        key = next((key for key in _ARGPARSE_OPTIONS if key in command.options), None)
        name = command.options[key] if key is not None else None
        path = None
        if isinstance(name, str) and name.endswith(".json") and project is not None:
            path = project.find(name, (command.file.parent, project.top(), project.folder))
        config = None
        if path is not None and isinstance(name, str) and key is not None:
            config = replace(_parse(ctx, path, name, None), where=command.where.get(key))
        found.append((command, config))
    return found


def _from_file(ctx: FileContext, node: cst.BaseExpression, name: str) -> DeepSpeedConfig | None:
    project = ctx.project
    if project is None:
        return None
    path = project.find(name)
    if path is None:
        return None  # not beside the script nor in the current folder (or too big): nothing to read
    return _parse(ctx, path, name, node)


def _parse(ctx: FileContext, path: Path, name: str, node: cst.CSTNode | None) -> DeepSpeedConfig:
    assert ctx.project is not None
    try:
        tree = load(ctx.project, path)
    except TooDeep as exc:  # the script keeps its findings: only the JSON is left unread
        return DeepSpeedConfig(node, None, name, problem=f"{name} is {exc}")
    except ConfigError as exc:
        return DeepSpeedConfig(node, None, name, problem=f"{name} is {exc}; DeepSpeed reads it as hjson, which "
                                                         "allows comments, speedfix does not")
    if tree is None:
        return DeepSpeedConfig(node, None, name, problem=f"cannot read {name}")
    values = tree.plain()
    if not isinstance(values, dict):
        return DeepSpeedConfig(node, None, name, problem=f"{name} holds a JSON {type(values).__name__}, not an object")
    return DeepSpeedConfig(node, values, name, tree=tree)


def _literal_dict(ctx: FileContext, node: cst.Dict, stack: Stack) -> dict[str, Any]:
    """A dict of literals (nested dicts, strings, numbers, True/False/None); unknown values
    (names, calls) are kept as ``...`` so that the keys around them still count. A key or a
    comparison the argparse defaults decide counts too (`dtype: {...}`, `args.dtype == "fp16"`)."""
    values: dict[str, Any] = {}
    for element in node.elements:
        key = string_value(ctx, element.key, stack) if isinstance(element, cst.DictElement) else None
        if isinstance(key, str):
            values[key] = _literal(ctx, element.value, stack)
        else:
            values[UNRESOLVED] = ...  # `**base` or a key speedfix cannot know: any key may be set
    return values


def _literal(ctx: FileContext, node: cst.BaseExpression, stack: Stack) -> Any:
    if isinstance(node, cst.Dict):
        return _literal_dict(ctx, node, stack)
    if isinstance(node, cst.SimpleString):
        return node.evaluated_value
    if isinstance(node, cst.Integer):
        value = integer_value(node)
        return ... if value is None else value
    if isinstance(node, cst.Float):
        return node.evaluated_value
    if isinstance(node, cst.Name) and node.value in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[node.value]
    if isinstance(node, cst.Comparison) and len(node.comparisons) == 1:
        return _compared(ctx, node, stack)
    return ...


def _compared(ctx: FileContext, node: cst.Comparison, stack: Stack) -> Any:
    """`args.dtype == "fp16"` with the option's default "fp16": True (``...`` when unknown)."""
    target = node.comparisons[0]
    if not isinstance(target.operator, (cst.Equal, cst.NotEqual)):
        return ...
    left, right = string_value(ctx, node.left, stack), string_value(ctx, target.comparator, stack)
    return ... if left is None or right is None else compared(target.operator, left, right)


def engine_owned(ctx: FileContext, model: str) -> bool:
    """Is ``model`` handed to `deepspeed.initialize(model=...)` in the file (a training script's,
    a trainer class's `_init_train_engine`)? The engine runs it then, and compiling it is the
    engine's business (`engine.compile()`)."""
    for site in ctx.calls_to(_INITIALIZE):
        found = find_argument(ctx, site, "model", 1)
        if found.node is not None and dotted_name(found.node) == model:
            return True
    return False


def engine_sixteen_bit(ctx: FileContext) -> bool | None:
    """For a script that builds its engine with `deepspeed.initialize`, whose config chooses the
    precision: does a config it is given enable fp16 or bf16 (True), none of them (False), or can
    no config be read (None: a file the scan cannot find, a dict built at run time)? None also
    for a script without `deepspeed.initialize`."""
    if not ctx.calls_to(_INITIALIZE):
        return None
    readable = [config.values for config in named_configs(ctx)
                if config.values is not None and config.taker in (_INITIALIZE, None)]
    if not readable:
        return None
    return any(map(_enables_sixteen_bit, readable))


def plugin_sixteen_bit(ctx: FileContext) -> bool:
    """Does a config handed to Accelerate's `DeepSpeedPlugin(hf_ds_config=...)` enable fp16 or
    bf16 (or leave them to "auto")?"""
    return any(_enables_sixteen_bit(config.values) for config in named_configs(ctx)
               if config.values is not None and config.taker in _PLUGINS)


def _enables_sixteen_bit(values: dict[str, Any]) -> bool:
    """Does a DeepSpeed config turn fp16 or bf16 on (or leave them to "auto")?"""
    return any(section(values, key).get("enabled", False) is not False for key in ("fp16", "bf16"))


def section(values: dict[str, Any], key: str) -> dict[str, Any]:
    """The ``key`` section of a config (empty when it has none), its `"enabled"` written as a
    string read as DeepSpeed's pydantic models read it (EAGLE's `"enabled": "true"`)."""
    found = values.get(key)
    if not isinstance(found, dict):
        return {}
    enabled = found.get("enabled")
    if isinstance(enabled, str) and enabled.lower() in ("true", "false"):
        return {**found, "enabled": enabled.lower() == "true"}
    return found


def element(literal: cst.Dict, keys: tuple[str, ...]) -> cst.DictElement | None:
    """The element of ``literal`` at the path ``keys`` (nested dicts)."""
    current: cst.Dict | None = literal
    found: cst.DictElement | None = None
    for key in keys:
        if current is None:
            return None
        found = next(
            (e for e in current.elements if isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString)
             and e.key.evaluated_value == key),
            None,
        )
        if found is None:
            return None
        current = found.value if isinstance(found.value, cst.Dict) else None
    return found


def offloaded(zero: dict[str, Any]) -> list[tuple[str, ...]]:
    """The ZeRO settings that move state to the CPU or NVMe, as key paths under
    `zero_optimization`: `("offload_optimizer", "device")`, `("offload_param", "device")`, or the
    old `("cpu_offload",)`/`("cpu_offload_params",)` flags. DeepSpeed drops `"auto"` values it
    is given (the Hugging Face Trainer fills in none for the device), so `"device": "auto"` is
    its default, no offload."""
    found: list[tuple[str, ...]] = []
    for key in ("offload_optimizer", "offload_param"):
        section = zero.get(key)
        if isinstance(section, dict) and section.get("device") not in (None, "none", "auto"):
            found.append((key, "device"))
    found.extend((key,) for key in ("cpu_offload", "cpu_offload_params") if zero.get(key) is True)
    return found
