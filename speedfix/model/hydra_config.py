"""The configuration hydra composes for a script, read as data.

`@hydra.main(config_path="../configs", config_name="train.yaml")` composes the primary config
(hydra 0.x's `@hydra.main(config_path="config.yaml")` names the file itself)
with the options its defaults list names (`- trainer: default` loads
`configs/trainer/default.yaml` under the key `trainer`), in list order, the primary config's own
values where `_self_` stands (at the end when it is not listed: hydra 1.1 and newer). A group
option may have a defaults list of its own (`trainer/gpu.yaml` starting from `- default`), a
`# @package _global_` header puts a file at the root, `group@pkg` elsewhere, `optional` and
`override` are read as plain entries and `null` loads nothing. Every value keeps the line that
sets it, so a finding can point at `configs/trainer/default.yaml:9`.

The project's launch commands and README commands that run the script add their overrides:
a group choice (`python train.py exp=base_test`, where the primary config says `- exp: null`)
is composed where the defaults list names the group, and a value (`trainer.gpus=1`, `+key=...`)
is set in the composed tree, pointing at the command's line; where commands disagree on one
key, none of them counts. What hydra only knows at run time is not known here: interpolations
(`${paths.output_dir}`, kept as text), the config search path of plugins. The other options of
a group are offered too (``group_options``): `trainer/gpu.yaml` is how a project that trains on
the CPU by default runs on a GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from weakref import WeakKeyDictionary

import libcst as cst

from speedfix.model import launch
from speedfix.model.arguments import find_argument, string_value
from speedfix.model.config_tree import Node, load_mapping
from speedfix.model.context import FileContext
from speedfix.model.project_files import Location, ProjectFiles
from speedfix.project.steps import INSTANTIATE

HYDRA_MAIN = ("hydra.main",)
_DICTCONFIG = ("omegaconf.DictConfig", "omegaconf.dictconfig.DictConfig")
_MAX_DEPTH = 8


@dataclass
class Composed:
    """A composed config: its tree, the config folder, and the files each package came from."""

    tree: Node
    folder: Path
    files: dict[tuple[str, ...], list[Path]] = field(default_factory=dict)  # package -> files merged there


@dataclass(frozen=True)
class HydraMain:
    """A function decorated with `@hydra.main`, its config, and the names that hold the config."""

    function: cst.FunctionDef
    composed: Composed | None
    names: frozenset[str]
    # where the commands name different configs (`-cp conf/pretrain`, `-cp conf/finetune`): the
    # others, each composed (``composed`` is the first)
    variants: tuple[Composed, ...] = ()


_MAINS: WeakKeyDictionary[FileContext, list[HydraMain]] = WeakKeyDictionary()


def hydra_mains(ctx: FileContext) -> list[HydraMain]:
    """The `@hydra.main` functions of the file with their composed configs (once per file)."""
    found = _MAINS.get(ctx)
    if found is None:
        found = _MAINS[ctx] = _find_mains(ctx)
    return found


def config_of(ctx: FileContext, node: cst.BaseExpression) -> tuple[HydraMain, tuple[str, ...]] | None:
    """`cfg.trainer` (`cfg["trainer"]`, `cfg.get("trainer")`) -> (the hydra main, ("trainer",)),
    when `cfg` holds the composed config: the hydra main's parameter, or a parameter annotated
    `DictConfig` in a function of the file."""
    keys: list[str] = []
    while True:
        if isinstance(node, cst.Attribute):
            keys.append(node.attr.value)
            node = node.value
        elif isinstance(node, cst.Subscript) and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index) \
                and isinstance(node.slice[0].slice.value, cst.SimpleString):
            keys.append(str(node.slice[0].slice.value.evaluated_value))
            node = node.value
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "get" \
                and node.args and isinstance(node.args[0].value, cst.SimpleString):
            keys.append(str(node.args[0].value.evaluated_value))
            node = node.func.value
        else:
            break
    if not isinstance(node, cst.Name):
        return None
    for main in hydra_mains(ctx):
        if main.composed is not None and node.value in main.names:
            return main, tuple(reversed(keys))
    return None


def group_options(ctx: FileContext, main: HydraMain, group: str) -> list[tuple[str, Composed]]:
    """Each option of a config group (`trainer/gpu.yaml`, `trainer/ddp.yaml`) composed the way
    `python train.py trainer=gpu` would compose it, placed under the group's key."""
    composed = main.composed
    if composed is None or ctx.project is None:
        return []
    options = []
    for path in ctx.project.listing(composed.folder / group, (".yaml", ".yml")):
        result = Composed(Node({}, Location(path, 1, 1, 1, 1)), composed.folder)
        _compose_file(ctx.project, result, path, (group,), group, 0)
        options.append((path.stem, result))
    return options


# ---------------------------------------------------------------------- composition
def _find_mains(ctx: FileContext) -> list[HydraMain]:
    found = []
    for functions in ctx.functions.values():
        for info in functions:
            function = info.node
            if not isinstance(function, cst.FunctionDef):
                continue
            decorator = next((d.decorator for d in function.decorators if isinstance(d.decorator, cst.Call)
                              and ctx.qualname(d.decorator.func) in HYDRA_MAIN), None)
            if decorator is None:
                continue
            composed = [made for choice in _config_choices(ctx, decorator)
                        if (made := _compose(ctx, *choice)) is not None]
            found.append(HydraMain(function, composed[0] if composed else None, _holders(ctx, function),
                                   tuple(composed[1:])))
    return found


def _config_choices(ctx: FileContext, decorator: cst.Call) -> list[tuple[str | None, str | None]]:
    """(config_path, config_name) of each config the runs compose: the decorator's, or,
    where the commands give `-cp`/`--config-path` or `-cn`/`--config-name` (uni2ts' `python -m
    cli.train -cp conf/pretrain ...`), each distinct pair they give."""
    site = next((s for s in ctx.calls if s.node is decorator), None)
    if site is None:
        return []
    folder_name = string_value(ctx, find_argument(ctx, site, "config_path", 0).node, site.stack)
    name = string_value(ctx, find_argument(ctx, site, "config_name", 1).node, site.stack)
    given = {_command_config(command, folder_name, name) for command in launch.launches(ctx)}
    if not given or given == {(folder_name, name)}:
        return [(folder_name, name)]
    return sorted(given, key=lambda pair: (str(pair[0]), str(pair[1])))


_CONFIG_FLAGS = {"-cp": 0, "--config-path": 0, "--config_path": 0, "-cn": 1, "--config-name": 1, "--config_name": 1}


def _command_config(command: launch.Launch, folder_name: str | None, name: str | None) -> tuple[str | None, str | None]:
    """The config path and name one command runs the script with (its flags over the decorator's)."""
    chosen = [folder_name, name]
    words = command.words
    for index, word in enumerate(words):
        flag, equals, value = word.partition("=")
        if flag in _CONFIG_FLAGS and (equals or index + 1 < len(words)):
            chosen[_CONFIG_FLAGS[flag]] = value if equals else words[index + 1]
    return chosen[0], chosen[1]


def _overrides(command: launch.Launch) -> list[str]:
    """The `key=value` overrides of a command (not its flags' values: `-cp conf/finetune`)."""
    words = command.words or command.positional
    found = []
    for index, word in enumerate(words):
        if word.startswith("-") or index and words[index - 1] in _CONFIG_FLAGS:
            continue
        found.append(word)
    return found


def _compose(ctx: FileContext, folder_name: str | None, name: str | None) -> Composed | None:
    project = ctx.project
    if project is None:
        return None
    if name is None and folder_name is not None and folder_name.endswith((".yaml", ".yml")):
        folder_name, _, name = folder_name.rpartition("/")  # hydra 0.x: `config_path="config.yaml"`, the file
        folder_name = folder_name or "."
    if folder_name is None or name is None:
        return None
    folder = project.resolve(folder_name)
    if folder is None:
        project.problems.append(f"hydra's config_path {folder_name!r} lies outside the scanned folders: "
                                "scan the project's folder to read its configuration")
        return None
    path = folder / (name if name.endswith((".yaml", ".yml")) else f"{name}.yaml")
    composed = Composed(Node({}, Location(path, 1, 1, 1, 1)), folder)
    if not project.is_file(path):
        return None
    groups, values = _command_overrides(ctx, project, folder)
    _compose_file(project, composed, path, (), None, 0, groups)
    for keys, node in values.items():
        _set(composed.tree, keys, node)
    return composed


def _command_overrides(ctx: FileContext, project: ProjectFiles, folder: Path
                       ) -> tuple[dict[str, str], dict[tuple[str, ...], Node]]:
    """The overrides the project's commands for the script agree on: group choices
    (`exp=base_test`, the group a folder of ``folder``) and values (`trainer.gpus=1`)."""
    groups: dict[str, str] = {}
    values: dict[tuple[str, ...], Node] = {}
    disputed: set[str] = set()
    for command in launch.launches(ctx):
        for word in _overrides(command):
            key, equals, text = word.partition("=")
            key = key.lstrip("+")
            if not equals or not key or key.startswith("~") or key in disputed or not _KEY.match(key):
                continue
            if "." not in key and project.listing(folder / key, (".yaml", ".yml")):
                if groups.setdefault(key, text) != text:
                    disputed.add(key)
                continue
            node = Node(_scalar(text), command.at, command.at)
            keys = tuple(key.split("."))
            if keys in values and values[keys].value != node.value:
                disputed.add(key)
            values.setdefault(keys, node)
    return ({k: v for k, v in groups.items() if k not in disputed},
            {k: v for k, v in values.items() if ".".join(k) not in disputed})


_KEY = re.compile(r"[A-Za-z_][\w.-]*$")


def _scalar(text: str) -> Any:
    """A command-line value as hydra reads it: numbers, booleans and null, else the text."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "null":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _set(tree: Node, keys: tuple[str, ...], node: Node) -> None:
    """Put ``node`` at ``keys`` of the composed tree (mappings made on the way)."""
    target = tree
    for key in keys[:-1]:
        child = target.value.get(key)
        if child is None or not isinstance(child.value, dict):
            child = target.value[key] = Node({}, node.where)
        target = child
    target.value[keys[-1]] = node


def _compose_file(project: ProjectFiles, composed: Composed, path: Path, package: tuple[str, ...],
                  group: str | None, depth: int, chosen: dict[str, str] | None = None) -> None:
    """Merge ``path`` and its defaults list into ``composed`` at ``package`` (``chosen``: the
    options the command line picks for the primary config's groups)."""
    if depth > _MAX_DEPTH:
        return
    tree = load_mapping(project, path)
    if tree is None:
        return
    if _global_header(project, path):
        package = ()
    body = Node({k: v for k, v in tree.value.items() if k not in ("defaults", "hydra")}, tree.where, tree.key_where,
                tree.lines)
    defaults = tree.value.get("defaults")
    entries = defaults.value if defaults is not None and isinstance(defaults.value, list) else []
    own_at = next((i for i, e in enumerate(entries) if e.value == "_self_"), len(entries))
    for index, entry in enumerate([*entries, None] if own_at == len(entries) else entries):
        if entry is None or entry.value == "_self_":
            _merge_at(composed, package, body, path)
            continue
        for target, target_package, target_group in _entry_files(composed.folder, entry.value, package, group,
                                                                 chosen or {}):
            if project.is_file(target):
                _compose_file(project, composed, target, target_package, target_group, depth + 1)


def _entry_files(folder: Path, value: Any, package: tuple[str, ...], group: str | None,  # type: ignore[no-untyped-def]
                 chosen: dict[str, str]):
    """(file, package, group) of one defaults-list entry (its option as ``chosen`` says)."""
    if isinstance(value, str):  # `- default` in a group file, `- base` in the primary config
        base = folder / group if group else folder
        yield base / f"{value}.yaml", package, group
        return
    if not isinstance(value, dict) or len(value) != 1:
        return
    ((key, option),) = value.items()
    key = str(key).replace("override ", "").replace("optional ", "").strip().lstrip("/")
    group_name, _, explicit = key.partition("@")
    options = [child.value for child in option.value] if isinstance(option.value, list) else [option.value]
    if group_name in chosen:
        options = [chosen[group_name]]
    for choice in options:
        if not isinstance(choice, str):
            continue  # `null`: nothing to load
        if explicit == "_global_":
            target_package: tuple[str, ...] = ()
        elif explicit:
            target_package = tuple(explicit.split("."))
        else:
            target_package = (*package, *group_name.split("/")) if group else tuple(group_name.split("/"))
        yield folder / group_name / f"{choice}.yaml", target_package, group_name


def _global_header(project: ProjectFiles, path: Path) -> bool:
    text = project.text(path) or ""
    for line in text.splitlines()[:5]:
        if line.strip().startswith("# @package") and "_global_" in line:
            return True
    return False


def _merge_at(composed: Composed, package: tuple[str, ...], body: Node, path: Path) -> None:
    composed.files.setdefault(package, []).append(path)
    target = composed.tree
    for key in package:
        child = target.value.get(key)
        if child is None or not isinstance(child.value, dict):
            child = Node({}, body.where, lines=body.lines)
            target.value[key] = child
        target = child
    _merge(target, body)


def _merge(target: Node, source: Node) -> None:
    """Deep-merge ``source`` into ``target``: later values win, mappings merge key by key."""
    for key, value in source.value.items():
        existing = target.value.get(key)
        if existing is not None and isinstance(existing.value, dict) and isinstance(value.value, dict):
            _merge(existing, value)
        else:
            target.value[key] = value


def _holders(ctx: FileContext, function: cst.FunctionDef) -> frozenset[str]:
    """The hydra main's first parameter and the file's parameters annotated `DictConfig`."""
    names = set()
    params = function.params.params
    if params:
        names.add(params[0].name.value)
    for infos in ctx.functions.values():
        for info in infos:
            node = info.node
            if not isinstance(node, cst.FunctionDef):
                continue
            for param in node.params.params:
                if param.annotation is not None and ctx.qualname(param.annotation.annotation) in _DICTCONFIG:
                    names.add(param.name.value)
    return frozenset(names)
