"""The YAML run configs a project keeps, read without the script naming them.

Config-driven projects keep one YAML file per run in a `configs/` (or `config/`, `conf/`, `cfgs/`,
`experiments/`) folder of the script's folder or of a folder above it up to the project's top
(`pkg/config/` beside `pkg/workspace/train.py`), or a single `config.yaml` there (hydra 0.x's
`@hydra.main(config_path="config.yaml")`), and name there what a
run builds: `model: {target: pkg.models.VQModel}` (taming-transformers' and Stable Diffusion's
`instantiate_from_config`), `_target_:` (hydra), `class_path:` (LightningCLI). Four questions are
answered from them:

- ``trained_classes``: which LightningModules the runs train (the class the top-level `model`
  builds), and whether the same config gives LightningCLI an `optimizer:` that replaces the
  module's own `configure_optimizers`;
- ``init_args``: what the runs give a class's constructor (`data: {num_workers: 8}` for the
  DataModule LightningCLI builds, `init_args:` under a `class_path:`), for code that reads the
  values back as attributes;
- ``cli_configs``: the LightningCLI configs (files with a top-level `trainer` mapping beside a
  `model` or `data` key), for a `LightningCLI` whose launch commands speedfix cannot see
  (`mytool fit -c experiments/run.yaml` through a console script);
- ``builds_conv2d``: whether the project classes a run's YAML names build 2-D convolutions
  (``classes_build_conv2d``: the same for classes a script names, `trainer.fit(CLIPWrapper(...))`);
- ``configured_value``: the value a config object's attribute chain (`hp.train.num_workers`)
  has in them, where the code that loads the config cannot be followed.

The files are read through ``ProjectFiles`` (inside the project, as data, recorded for the cache).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence
from weakref import WeakKeyDictionary

import libcst as cst

from speedfix.model.config_tree import ConfigError, Node, is_interpolation, load
from speedfix.model.context import FileContext
from speedfix.model.frames import Stack, class_of_method, function_of
from speedfix.model.project_classes import module_path
from speedfix.model.project_files import ProjectFiles, kept_for_scan
from speedfix.project.facts import ModuleFacts, extract_facts

FOLDERS = ("configs", "config", "conf", "cfgs", "cfg", "experiments", "configs_template")
# folders not looked into for a config folder: data, outputs, tests
_SKIPPED = re.compile(r"^(?:data|datasets?|outputs?|runs|logs|checkpoints|tests?|docs?|assets|images|results)$", re.I)
_SUFFIXES = (".yaml", ".yml", ".json")
_DEPTH = 3  # subfolders of a config folder searched
_MAX_FILES = 300
# the key that names the class a mapping builds (hydra 0.x wrote `class:` beside `params:`)
_TARGET_KEYS = ("target", "_target_", "class_path", "class")


@dataclass(frozen=True)
class TrainedClass:
    name: str  # the class's own name (the last part of its dotted path)
    path: str  # as the config writes it
    optimizer_replaced: bool  # LightningCLI: the config's `optimizer:` replaces `configure_optimizers`


@dataclass(frozen=True)
class RunConfigs:
    files: tuple[tuple[Path, Node], ...]

    def trained_classes(self) -> list[TrainedClass]:
        found = []
        for _path, tree in self.files:
            model = tree.get("model")
            target = _target(model) if model is not None else None
            if target is not None:
                found.append(TrainedClass(target.rsplit(".", 1)[-1], target, tree.get("optimizer") is not None))
        return found

    def named_classes(self) -> set[str]:
        """The own names of every class a config names (`_target_: pkg.models.Net` -> `Net`)."""
        return {target.rsplit(".", 1)[-1] for _path, tree in self.files for target in _targets(tree)}

    def built(self, qualified: Iterable[str]) -> list[Node]:
        """The mappings that build one of these classes (`_target_: lightning.pytorch.Trainer`)."""
        wanted = set(qualified)
        return [node for _path, tree in self.files for node in _mappings(tree) if _target(node) in wanted]

    def cli_configs(self) -> list[Node]:
        """The LightningCLI configs (their `trainer:` mapping is ``tree.value["trainer"]``)."""
        return [tree for _path, tree in self.files if _is_cli_config(tree)]

    def configures(self, section: str) -> bool:
        """Does a run config name the class of its top-level ``section`` (`data: {class_path: ...}`)?"""
        return any((node := tree.get(section)) is not None and _target(node) is not None for _path, tree in self.files)

    def agreed(self, keys: Sequence[str]) -> object | None:
        """The scalar every run config that sets ``keys`` at its top gives them (`device: cuda` in
        the primary config that a group file's `device: ${device}` reads), None when none sets
        them or they differ."""
        found = {repr(node.value): node.value for _path, tree in self.files
                 if (node := tree.get(*keys)) is not None and not isinstance(node.value, (dict, list))
                 and not is_interpolation(node.value)}
        return next(iter(found.values())) if len(found) == 1 else None

    def init_args(self, class_name: str, params: Sequence[str], section: str) -> list[Node]:
        """The constructor arguments each run config gives the class ``class_name``: the
        `init_args:`/`params:` of a mapping whose `class_path:`/`target:`/`_target_:` names it
        (the `_target_` mapping's own keys), or, in a LightningCLI config, the top-level
        ``section`` (`data`, `model`) written without a class path (the class LightningCLI is
        given in code) when every key of it is one of ``params``."""
        found = []
        for _path, tree in self.files:
            for node in _mappings(tree):
                target = _target(node)
                if target is not None and target.rsplit(".", 1)[-1] == class_name:
                    args = node.get("init_args") or node.get("params")
                    if args is None and node.get("_target_") is not None:
                        args = node
                    found.append(args if args is not None and isinstance(args.value, dict) else Node({}, node.where))
            plain = tree.get(section)
            if _is_cli_config(tree) and plain is not None and isinstance(plain.value, dict) and plain.value \
                    and _target(plain) is None and set(plain.value) <= set(params):
                found.append(plain)
        return found


_FOUND: WeakKeyDictionary[FileContext, RunConfigs] = WeakKeyDictionary()


def run_configs(ctx: FileContext) -> RunConfigs:
    """The project's run configs (computed once per file; none without a project)."""
    found = _FOUND.get(ctx)
    if found is None:
        found = _FOUND[ctx] = RunConfigs(tuple(_read(ctx)))
    return found


def _read(ctx: FileContext) -> list[tuple[Path, Node]]:
    project = ctx.project
    if project is None:
        return []
    paths: list[Path] = []

    def collect(folder: Path, depth: int) -> None:
        for path in project.listing(folder, _SUFFIXES):
            if len(paths) < _MAX_FILES:
                paths.append(path)
        if depth > 0:
            for sub in project.subfolders(folder):
                collect(sub, depth - 1)

    for base in reversed(project.folders_up()):
        paths.extend(path for path in project.listing(base, _SUFFIXES) if path.stem == "config")
        subfolders = {sub.name for sub in project.subfolders(base)}
        for name in FOLDERS:
            if name in subfolders:
                collect(base / name, _DEPTH)
    for sub in project.subfolders(project.folder):  # beside the script, one level down: so-vits-svc's
        if sub.name not in FOLDERS and not _SKIPPED.search(sub.name):  # `preprocessing/config_templates/`
            for inner in project.subfolders(sub):
                if "config" in inner.name.lower():
                    collect(inner, _DEPTH)
    found = []
    for path in paths:
        tree = _quiet_mapping(project, path)
        if tree is not None:
            found.append((path, tree))
    return found


def _quiet_mapping(project: ProjectFiles, path: Path) -> Node | None:
    """The mapping at the top of a run config, or None, without a note when it cannot be read:
    nothing names these files (a DeepSpeed `ds_config_TEMPLATE.json` with placeholders). Parsed
    once per scan for all the scripts that look at it."""
    text = project.quiet_text(path)
    if text is None:
        return None

    def parse() -> Node | None:
        try:
            tree = load(project, path)
        except ConfigError:
            return None
        return tree if tree is not None and isinstance(tree.value, dict) else None
    return kept_for_scan(("run config", path, text), parse)


def configured_value(ctx: FileContext, node: cst.BaseExpression) -> Node | None:
    """`hp.train.num_workers`, where `hp` is a run config that code this file cannot follow
    built (a parameter; a project class that reads the YAML named on the command line): the
    scalar at `train.num_workers` in the project's run configs, when every config that sets it
    agrees. Two attributes at least (`args.workers` is an option, not a config section), and
    never `self.`."""
    keys = _config_keys(ctx, node)
    found = configured_at(ctx, keys) if keys is not None else None
    return found if isinstance(found, Node) else None


def configured_get(ctx: FileContext, node: cst.Call) -> Node | bool | None:
    """`hps.train.get("bf16_run", False)` on such a config: the agreed scalar (``configured_value``);
    False when no run config sets the key (the `.get` default holds); None when they differ, or
    the call is no such `.get`."""
    func = node.func
    if not (isinstance(func, cst.Attribute) and func.attr.value == "get" and node.args
            and isinstance(node.args[0].value, cst.SimpleString) and node.args[0].keyword is None):
        return None
    key = node.args[0].value.evaluated_value
    keys = _config_keys(ctx, func.value, at_least=1)
    return configured_at(ctx, (*keys, key)) if keys is not None and isinstance(key, str) else None


def configured_at(ctx: FileContext, keys: tuple[str, ...]) -> Node | bool | None:
    """The scalar every run config that sets ``keys`` gives them; False when none does, though
    some hold the section around them (`train:` without `bf16_run`); None when they differ, hold a
    mapping or list, or no run config has the section."""
    files = run_configs(ctx).files
    found = [value for _path, tree in files if (value := tree.get(*keys)) is not None]
    if not found:
        sections = [section for _path, tree in files if (section := tree.get(*keys[:-1])) is not None]
        return False if any(isinstance(section.value, dict) for section in sections) else None
    if len({repr(value.value) for value in found}) != 1 or isinstance(found[0].value, (dict, list)):
        return None
    return found[0]


def _config_keys(ctx: FileContext, node: cst.BaseExpression, at_least: int = 2) -> tuple[str, ...] | None:
    """`hp.train.num_workers` -> ("train", "num_workers"): the attributes read from a name that
    is no import nor `self`, ``at_least`` of them."""
    path: list[str] = []
    while isinstance(node, cst.Attribute):
        path.append(node.attr.value)
        node = node.value
    if not isinstance(node, cst.Name) or node.value == "self" or len(path) < at_least or node.value in ctx.imports.bindings:
        return None
    return tuple(reversed(path))


def _target(node: Node) -> str | None:
    if not isinstance(node.value, dict):
        return None
    for key in _TARGET_KEYS:
        value = node.get(key)
        if value is not None and isinstance(value.value, str) and "." in value.value:
            return value.value
    return None


def _is_cli_config(tree: Node) -> bool:
    trainer = tree.get("trainer")
    return trainer is not None and isinstance(trainer.value, dict) and _target(trainer) is None \
        and (tree.get("model") is not None or tree.get("data") is not None)


def optimizers_unused(ctx: FileContext, stack: Stack) -> str | None:
    """Why the `configure_optimizers` that code at ``stack`` is part of never runs in the
    project's configured runs, or None (it may run). Only said of a file whose classes the
    configs train: a class of it that no config trains, nor any class of the file that inherits
    the method, is trained by none of them (a class the file builds itself may still run); nor a
    class of a file whose classes the configs name only as parts of the model they train, when
    no scanned file builds it."""
    function = function_of(stack)
    owner = class_of_method(stack)
    if not isinstance(function, cst.FunctionDef) or function.name.value != "configure_optimizers" or owner is None:
        return None
    configs = run_configs(ctx)
    every = configs.trained_classes()
    trained = [found for found in every if found.name in ctx.classes]
    name = owner.name.value
    users = {other for other in ctx.classes if other == name or _inherits_method(ctx, other, name)}
    if not trained:
        # a file whose classes the configs build only as parts of the model they train (latent
        # diffusion's `first_stage_config: {target: ldm.models.autoencoder.AutoencoderKL}`): Lightning
        # runs the trained module's `configure_optimizers`, not theirs
        if every and configs.named_classes() & set(ctx.classes) and not any(site.func in users for site in ctx.calls) \
                and not any(built in users for built, *_ in ctx.links.constructed):
            return f"the configs train `{every[0].name}` and build the classes of this file only as its parts"
        return None
    runs = [found for found in trained if found.name in users]
    if any(not found.optimizer_replaced for found in runs) or any(site.func in users for site in ctx.calls):
        return None
    if runs:
        return f"the configs that train `{name}` give LightningCLI an `optimizer:`, which replaces its `configure_optimizers`"
    return f"no config of the project trains `{name}`"


def _inherits_method(ctx: FileContext, name: str, ancestor: str) -> bool:
    """``name`` is a class of the file below ``ancestor`` that defines no `configure_optimizers`
    of its own on the way (so it runs the ancestor's)."""
    seen: set[str] = set()
    current = name
    while current not in seen:
        seen.add(current)
        info = ctx.classes.get(current)
        if info is None or _defines(info.node, "configure_optimizers"):
            return False
        local = [base for base in info.bases if base in ctx.classes]
        if not local:
            return False
        if local[0] == ancestor:
            return True
        current = local[0]
    return False


def _defines(node: cst.ClassDef, method: str) -> bool:
    return any(isinstance(item, cst.FunctionDef) and item.name.value == method for item in node.body.body)


# ---------------------------------------------------------------------- what the configured classes build
_CLASS_DEPTH = 2  # imports followed from a configured class's module (a re-export, then the layers' module)


def builds_conv2d(ctx: FileContext, trees: list[Node]) -> bool:
    """Does a project class these configs name (`class_path:`, `target:`, `_target_:`, the
    model's parts included) build 2-D convolutions (``classes_build_conv2d``)?"""
    return classes_build_conv2d(ctx, {value for tree in trees for value in _targets(tree)})


def classes_build_conv2d(ctx: FileContext, qualified: Iterable[str]) -> bool:
    """Does one of these project classes (qualified as the script's imports spell them:
    `models.CLIPWrapper`) build 2-D convolutions, in its own module or through what that module
    imports from the project: a class (taming's `VQModel` and its `Encoder`) or a factory
    (`from cifar10_models.resnet import resnet18`)? Read with ``ast`` through ``ProjectFiles``;
    nothing is imported."""
    project = ctx.project
    if project is None:
        return False
    seen: dict[str, _Module | None] = {}
    return any(_class_conv2d(project, target, seen, 0) for target in sorted(set(qualified)))


def _targets(tree: Node) -> Iterator[str]:
    """Every class path the tree names, in mappings and lists (`modules: [{class_path: ...}]`)."""
    for node in _mappings(tree):
        for key, child in node.value.items():
            if key in _TARGET_KEYS and isinstance(child.value, str) and "." in child.value:
                yield child.value


def _mappings(tree: Node) -> Iterator[Node]:
    """Every mapping of the tree, in mappings and lists."""
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node.value, dict):
            yield node
            todo.extend(node.value.values())
        elif isinstance(node.value, list):
            todo.extend(node.value)


@dataclass(frozen=True)
class _Module:
    facts: ModuleFacts
    package: bool  # read from its __init__.py


def _class_conv2d(project: ProjectFiles, qualified: str, seen: dict[str, _Module | None], depth: int) -> bool:
    module, _, name = qualified.rpartition(".")
    found_module = _module(project, module, seen)
    if found_module is None:
        return False
    facts = found_module.facts
    found = facts.functions.get(name)
    if found is not None and 2 in found.conv_dims:
        return True
    if depth >= _CLASS_DEPTH:
        return False
    imported = {local: _absolute(module, target, found_module.package) for local, target in facts.imports}
    if found is None:  # re-exported by a package's __init__.py
        return name in imported and _class_conv2d(project, imported[name], seen, depth + 1)
    return any(_class_conv2d(project, target, seen, depth + 1) for local, target in imported.items()
               if local[:1].isupper() or _factory(local, target))


def _factory(local: str, target: str) -> bool:
    """A lower-case name taken from a module (`from models.resnet import resnet18`), which may be
    a factory that builds the network (a module taken so, `from torch import nn`, is not found)."""
    return "." in target and target.rsplit(".", 1)[1] == local and not local.startswith("_")


def _absolute(module: str, target: str, package: bool) -> str:
    """`.layers.Encoder` imported in `pkg.models` (a package when read from its __init__.py)."""
    if not target.startswith("."):
        return target
    level = len(target) - len(target.lstrip("."))
    parts = module.split(".") if package else module.split(".")[:-1]
    base = parts[: len(parts) - (level - 1)]
    return ".".join([*base, target.lstrip(".")])


def _module(project: ProjectFiles, module: str, seen: dict[str, _Module | None]) -> _Module | None:
    if module in seen:
        return seen[module]
    seen[module] = None
    path = module_path(project, module) if len(seen) <= _MAX_FILES else None
    if path is None:
        return None
    facts = extract_facts(project.text(path) or "")
    seen[module] = _Module(facts, path.name == "__init__.py") if facts is not None else None
    return seen[module]
