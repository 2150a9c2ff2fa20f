"""Lightning Trainers a script never writes as `Trainer(...)`: built from configuration.

- hydra: `hydra.utils.instantiate(cfg.trainer, ...)` where the composed config's `trainer`
  has `_target_: lightning.pytorch.Trainer` (``speedfix.model.hydra_config``). The composed
  default is one Trainer; each other option of the `trainer` group (`trainer=gpu`) another.
- a section unpacked into the call: `Trainer(**config["trainer"])` of a YAML file the script
  loads, `pl.Trainer(**cfg.trainer)` of the config hydra composes (its default only), or
  `Trainer(**trainer_opt)` of the `lightning: trainer:` section of the YAML files the launch
  commands name, which the script merges (`OmegaConf.merge(*[OmegaConf.load(f) for f in opt.base])`).
- LightningCLI: `LightningCLI(Model, DataModule, trainer_defaults={...})`, with what every
  launch command adds (`--trainer.precision bf16-mixed`, or a `--config config.yaml` whose
  `trainer:` section sets it).
- Lightning 1.x: `Trainer.from_argparse_args(args)`, whose options default to the Trainer's
  (CPU and fp32 in 1.x) unless `parser.set_defaults(...)`, the call's own arguments or the launch
  commands say otherwise; `precision=16` without a device option is GPU code (1.x runs 16-bit AMP
  only on CUDA).

Each is a ``ConfiguredTrainer``: its settings with where they are set (a YAML line, a launch
option, a dict element of the script), and whether the settings not listed are certainly the
Trainer's defaults (``complete``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Sequence

import libcst as cst

from speedfix.model import launch
from speedfix.model.arguments import UNKNOWN_VALUE, find_argument, item_key, known_value, kwargs_value, string_value
from speedfix.model.config_files import run_configs
from speedfix.model.config_tree import ConfigError, Node, is_interpolation, load
from speedfix.model.context import FileContext
from speedfix.model.frameworks import LEGACY_STRATEGIES, LIGHTNING_CLI, LIGHTNING_FROM_ARGPARSE, LIGHTNING_TRAINER
from speedfix.model.hydra_config import Composed, config_of, group_options
from speedfix.model.index import CallSite
from speedfix.model.loaded_config import loaded_node, section_keys
from speedfix.model.patterns import INSTANTIATE
from speedfix.model.versions import lightning_before_2
from speedfix.model.project_files import Location, display_path
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import code_of

UNKNOWN: Any = object()
_GPU_ACCELERATORS = frozenset({"gpu", "cuda", "auto"})
_YAML_LOADS = ("omegaconf.OmegaConf.load", "yaml.safe_load", "yaml.load", "yaml.full_load")


@dataclass(frozen=True)
class TrainerValue:
    value: Any
    where: Location | None = None  # a YAML line or a launch option
    node: cst.CSTNode | None = None  # a dict element or argument of the script


@dataclass
class ConfiguredTrainer:
    kind: str  # "hydra", "cli", "argparse"
    site: CallSite  # the call of the script that builds it
    label: str  # how a message names it
    settings: dict[str, TrainerValue] = field(default_factory=dict)
    complete: bool = True  # settings not listed are the Trainer's defaults
    add_at: Location | None = None  # where a missing setting would be written (a YAML file)
    commented: dict[str, Location] = field(default_factory=dict)  # `# precision: 16` lines
    add_node: cst.CSTNode | None = None  # where a missing setting would be written in the script
    lightning_1x: bool = False  # `from_argparse_args`: Lightning before 2.0 ("bf16", not "bf16-mixed")
    kwargs: list[Callable[[str], TrainerValue | None]] = field(default_factory=list)  # `**trainer_kwargs` dicts
    configs: list[Node] = field(default_factory=list)  # the YAML files the run reads (what they build)

    def get(self, key: str) -> TrainerValue | None:
        """The setting, None when left at the Trainer's default; UNKNOWN value when it cannot be
        known (something unknown may set it)."""
        found = self.settings.get(key)
        for lookup in self.kwargs if found is None else ():
            found = lookup(key)
            if found is not None:
                return found
        if found is None and not self.complete:
            return TrainerValue(UNKNOWN)
        return found

    def on_gpu(self) -> bool:
        accelerator = self.get("accelerator")
        if self.lightning_1x:  # 1.x trains on the CPU unless told `gpus`/`accelerator`
            gpus = self.get("gpus") or self.get("devices")
            if accelerator is not None and isinstance(accelerator.value, str) \
                    and accelerator.value.lower() not in LEGACY_STRATEGIES:
                return accelerator.value.lower() in _GPU_ACCELERATORS and gpus is not None
            if gpus is None and accelerator is None:  # 1.x runs 16-bit AMP on CUDA only: `precision=16` is GPU code
                precision = self.get("precision")
                return precision is not None and str(precision.value) in ("16", "16-mixed")
            return gpus is not None and gpus.value not in (None, 0, "0", UNKNOWN)
        if accelerator is None:
            return True  # "auto": the GPU when there is one
        return isinstance(accelerator.value, str) and accelerator.value.lower() in _GPU_ACCELERATORS


def configured_trainers(ctx: FileContext) -> list[ConfiguredTrainer]:
    return [*_hydra(ctx), *_cli(ctx), *_from_argparse(ctx), *_loaded(ctx)]


# ---------------------------------------------------------------------- hydra
def _hydra(ctx: FileContext) -> list[ConfiguredTrainer]:
    found: list[ConfiguredTrainer] = []
    for site in ctx.calls_to(*INSTANTIATE):
        if not site.node.args:
            continue
        resolved = config_of(ctx, site.node.args[0].value)
        if resolved is None:
            continue
        main, keys = resolved
        assert main.composed is not None
        options: list[tuple[str | None, Composed]] = [(None, main.composed)]
        options.extend((None, composed) for composed in main.variants)  # `-cp conf/finetune`: another config
        if len(keys) == 1 and tuple(keys) in main.composed.files:
            options.extend(group_options(ctx, main, keys[0]))
        seen: dict[tuple[str, int], ConfiguredTrainer] = {}
        for option, composed in options:
            node = composed.tree.get(*keys)
            if node is None or not isinstance(node.value, dict):
                continue
            target = node.get("_target_")
            if target is None or target.value not in LIGHTNING_TRAINER:
                continue
            trainer = _from_node(ctx, site, node, composed, keys, option)
            if not trainer.on_gpu():
                continue
            key = (str(trainer.add_at.path), trainer.add_at.line) if trainer.add_at else ("", 0)
            if key in seen:  # options that share the file where the fix goes: one finding
                if option is not None and seen[key].kind == "hydra" and "`" in seen[key].label:
                    seen[key].label = seen[key].label.replace("` (", f"`, `{keys[0]}={option}` (", 1)
                continue
            seen[key] = trainer
            found.append(trainer)
    return found


def _from_node(ctx: FileContext, site: CallSite, node: Node, composed: Composed, keys: tuple[str, ...],
               option: str | None) -> ConfiguredTrainer:
    files = composed.files.get(keys, [])
    shown = files[-1].name if files else "the config"
    group = "/".join(keys)
    label = f"the `Trainer` hydra builds from `{group}/{files[-1].name}`" if files else "the `Trainer` hydra builds"
    if option is not None and files:
        label = f"the `Trainer` of `{group}={option}` ({group}/{shown})"
    trainer = ConfiguredTrainer("hydra", site, label)
    for key, child in node.value.items():
        if key.startswith("_"):
            continue
        value = UNKNOWN if is_interpolation(child.value) else child.plain()
        trainer.settings[key] = TrainerValue(value, child.at)
    for arg in site.node.args[1:]:  # `instantiate(cfg.trainer, precision=...)` wins over the YAML
        if arg.keyword is not None:
            trainer.settings[arg.keyword.value] = TrainerValue(_python(ctx, arg.value, site), node=arg)
        elif arg.star:
            trainer.complete = False
    target = node.get("_target_")
    trainer.add_at = target.at if target is not None else node.where
    trainer.lightning_1x = _lightning_1x(ctx, trainer)
    for path in files:
        tree = _tree(ctx, path)
        hint = tree.commented_key("precision") if tree is not None else None
        if hint is not None:
            trainer.commented["precision"] = hint
    return trainer


def _lightning_1x(ctx: FileContext, trainer: ConfiguredTrainer) -> bool:
    """Lightning before 2.0: a `gpus` setting (gone from 2.0), or the Lightning the project pins."""
    return "gpus" in trainer.settings or lightning_before_2(ctx.project)


def _tree(ctx: FileContext, path: Path) -> Node | None:
    assert ctx.project is not None
    try:
        return load(ctx.project, path)
    except ConfigError:
        return None


# ---------------------------------------------------------------------- LightningCLI
def _cli(ctx: FileContext) -> list[ConfiguredTrainer]:
    found = []
    subclasses = _cli_subclasses(ctx)
    sites = [*ctx.calls_to(*LIGHTNING_CLI), *(site for site in ctx.calls if site.func in subclasses)]
    for site in sites:
        trainer = ConfiguredTrainer("cli", site, "the `Trainer` LightningCLI builds")
        if site.func in subclasses:
            _cli_parser_defaults(ctx, trainer, site.func)
        defaults = find_argument(ctx, site, "trainer_defaults")
        if defaults.unknown:
            trainer.complete = False
        elif defaults.node is not None:
            node = defaults.node
            if isinstance(node, cst.Name):
                node = ctx.single_value(node.value, site.stack) or node
            if isinstance(node, cst.Dict):
                trainer.add_node = node
                for element in node.elements:
                    key = string_value(ctx, element.key, site.stack) if isinstance(element, cst.DictElement) else None
                    if key is None:
                        trainer.complete = False
                        continue
                    assert isinstance(element, cst.DictElement)
                    trainer.settings[key] = TrainerValue(_python(ctx, element.value, site), node=element)
            else:
                trainer.complete = False
        _cli_launch_settings(ctx, trainer)
        found.append(trainer)
    return found


def _cli_subclasses(ctx: FileContext) -> list[str]:
    """Classes of the file that subclass LightningCLI (called by their plain name)."""
    return [name for name in ctx.classes if ctx.is_subclass_of(name, *LIGHTNING_CLI)]


def _cli_parser_defaults(ctx: FileContext, trainer: ConfiguredTrainer, class_name: str) -> None:
    """`parser.set_defaults({"trainer.max_epochs": 15})` in the subclass's `add_arguments_to_parser`."""
    owner = ctx.classes[class_name].node
    for call in ctx.method_calls("set_defaults"):
        if not any(frame.node is owner for frame in call.stack) or not call.node.args:
            continue
        values = call.node.args[0].value
        if not isinstance(values, cst.Dict):
            trainer.complete = False
            continue
        for element in values.elements:
            key = string_value(ctx, element.key, call.stack) if isinstance(element, cst.DictElement) else None
            if key is None:
                trainer.complete = False
            elif key.startswith("trainer."):
                assert isinstance(element, cst.DictElement)
                trainer.settings[key.split(".", 1)[1]] = TrainerValue(_python(ctx, element.value, call), node=element)


def _cli_launch_settings(ctx: FileContext, trainer: ConfiguredTrainer) -> None:
    """`--config config.yaml` (its `trainer:` section) and `--trainer.X value` of the launch commands."""
    config = launch.option(ctx, "config", "c")
    if config.state is launch.State.MIXED or (config.state is launch.State.KNOWN and not config.known):
        trainer.complete = False
    elif config.state is launch.State.MISSING:
        _cli_project_configs(ctx, trainer)
    elif config.known and isinstance(config.value, str) and config.where is not None and ctx.project is not None:
        project = ctx.project
        path = project.find(config.value, (config.where.path.parent, project.top(), project.folder))
        tree = _tree(ctx, path) if path is not None else None
        section = tree.get("trainer") if tree is not None else None
        if tree is not None:
            trainer.configs.append(tree)
        if section is None or not isinstance(section.value, dict):
            trainer.complete = trainer.complete and path is not None and tree is not None
        else:
            for key, child in section.value.items():
                trainer.settings[key] = TrainerValue(child.plain(), child.at)
            trainer.add_at = section.at
            hint = section.commented_key("precision")
            if hint is not None:
                trainer.commented["precision"] = hint
    for launched in launch.launches(ctx):
        for key in launched.options:
            if key.startswith("trainer."):
                name = key.split(".", 1)[1]
                given = launch.option(ctx, key)
                trainer.settings[name] = TrainerValue(given.value if given.known else UNKNOWN, given.where)


def _cli_project_configs(ctx: FileContext, trainer: ConfiguredTrainer) -> None:
    """No launch command the scan sees names a config (`mytool fit -c experiments/run.yaml`
    through a console script): the `trainer:` sections of the project's LightningCLI configs.
    A setting counts when every config sets it alike; one they disagree on is unknown."""
    configs = run_configs(ctx).cli_configs()
    if not configs:
        return
    sections = [tree.value["trainer"] for tree in configs]
    _merge_sections(trainer, sections)
    trainer.configs.extend(configs)
    if len(sections) == 1:
        trainer.add_at = sections[0].at
        hint = sections[0].commented_key("precision")
        if hint is not None:
            trainer.commented["precision"] = hint


def _merge_sections(trainer: ConfiguredTrainer, sections: list[Node]) -> None:
    """Settings of several runs' `trainer` sections: known where all agree, else unknown."""
    keys = dict.fromkeys(key for section in sections for key in section.value)
    for key in keys:
        children = [section.value.get(key) for section in sections]
        values = [child.plain() if child is not None else None for child in children]
        first = children[0]
        if first is not None and all(child is not None for child in children) and all(v == values[0] for v in values):
            trainer.settings[key] = TrainerValue(UNKNOWN if is_interpolation(values[0]) else values[0], first.at)
        else:
            trainer.settings[key] = TrainerValue(UNKNOWN)


# ---------------------------------------------------------------------- Lightning 1.x argparse
def _from_argparse(ctx: FileContext) -> list[ConfiguredTrainer]:
    found = []
    for site in ctx.calls_to(*LIGHTNING_FROM_ARGPARSE):
        trainer = ConfiguredTrainer("argparse", site, "the `Trainer` `from_argparse_args` builds", lightning_1x=True)
        for call in ctx.method_calls("set_defaults"):
            for arg in call.node.args:
                if arg.keyword is not None:
                    trainer.settings[arg.keyword.value] = TrainerValue(_python(ctx, arg.value, call), node=arg)
        if ctx.calls_to(*_YAML_LOADS):
            _launched_yaml(ctx, trainer)
        _launch_options(ctx, trainer)
        _call_arguments(ctx, trainer, site.node.args[1:], site)
        found.append(trainer)
    return found


def _launch_options(ctx: FileContext, trainer: ConfiguredTrainer) -> None:
    """The options the launch commands pass (`--precision 16`): the Trainer's settings."""
    for launched in launch.launches(ctx):
        for key in launched.options:
            given = launch.option(ctx, key)
            trainer.settings[key] = TrainerValue(given.value if given.known else UNKNOWN, given.where)


def _launched_yaml(ctx: FileContext, trainer: ConfiguredTrainer, keys: tuple[str, ...] = ()) -> list[Node]:
    """A script that loads the YAML files its launch commands name (`main.py --base
    configs/vqgan.yaml`, merged with OmegaConf): their ``keys`` sections (by default
    `lightning: trainer:` or `trainer:`) set the Trainer, alike in every command or unknown.
    Returns the sections found."""
    assert ctx.project is not None
    runs: list[Node] = []
    sections: list[Node] = []
    for launched in launch.launches(ctx):
        merged: dict[str, Node] = {}
        for value in launched.options.values():
            for name in value.split() if isinstance(value, str) else ():
                if not name.endswith((".yaml", ".yml")):
                    continue
                path = ctx.project.find(name, (launched.file.parent, ctx.project.top(), ctx.project.folder))
                tree = _tree(ctx, path) if path is not None else None
                if tree is None:
                    trainer.complete = False
                    continue
                trainer.configs.append(tree)
                section = tree.get(*keys) if keys else tree.get("lightning", "trainer") or tree.get("trainer")
                if section is not None and isinstance(section.value, dict) and section.get("_target_") is None:
                    merged.update(section.value)
                    sections.append(section)
        runs.append(Node(merged, Location(launched.file, launched.line, 1, launched.line, 1)))
    if any(run.value for run in runs):
        _merge_sections(trainer, runs)
    return sections


# ---------------------------------------------------------------------- a YAML the script loads itself
def _loaded(ctx: FileContext) -> list[ConfiguredTrainer]:
    """`Trainer(..., **config["trainer_params"])` where `config` is a YAML file the script loads
    (``loaded_config``): the section's lines are the Trainer's settings."""
    found = []
    for site in ctx.calls_to(*LIGHTNING_TRAINER):
        sections = [(arg, nodes) for arg in site.node.args if arg.star == "**"
                    and (nodes := [node for node in _section_nodes(ctx, arg.value, site) if isinstance(node.value, dict)])]
        if not sections:
            found.extend(_launched_section(ctx, site))
            continue
        arg, nodes = sections[0]
        for section in nodes:  # hydra: the section of each config the launch commands pick
            label = f"the `Trainer` given `{code_of(arg.value)}` ({display_path(section.where.path)})"
            trainer = ConfiguredTrainer("yaml", site, label, add_at=section.at)
            for key, child in section.value.items():
                trainer.settings[key] = TrainerValue(UNKNOWN if is_interpolation(child.value) else child.plain(), child.at)
            _call_arguments(ctx, trainer, [other for other in site.node.args if other is not arg], site)
            trainer.lightning_1x = _lightning_1x(ctx, trainer)
            hint = section.commented_key("precision")
            if hint is not None:
                trainer.commented["precision"] = hint
            found.append(trainer)
    return found


def _launched_section(ctx: FileContext, site: CallSite) -> list[ConfiguredTrainer]:
    """`Trainer(**trainer_opt, **trainer_kwargs)` where `trainer_opt` is a section (`lightning:
    trainer:`) of the YAML files the launch commands name, merged by the script (`OmegaConf.merge(
    *[OmegaConf.load(f) for f in opt.base])`): that section of each run's files, as for
    `from_argparse_args`, with what the script writes into it (`trainer_config["accelerator"] =
    "gpu"`) and the Trainer options the launch commands pass."""
    for arg in site.node.args:
        names: list[str] = []
        keys = section_keys(ctx, arg.value, site.stack, names=names) if arg.star == "**" else None
        if not keys:
            continue
        label = f"the `Trainer` given `{code_of(arg.value)}` (the `{': '.join(keys)}:` section of the run's YAML)"
        trainer = ConfiguredTrainer("yaml", site, label)
        sections = _launched_yaml(ctx, trainer, keys)
        if not sections:
            return []  # no launch command names a file with that section: nothing is known
        if len(sections) == 1:
            trainer.add_at = sections[0].at
        _written_into(ctx, trainer, names, site)
        _launch_options(ctx, trainer)
        _call_arguments(ctx, trainer, [other for other in site.node.args if other is not arg], site)
        trainer.lightning_1x = _lightning_1x(ctx, trainer)
        return [trainer]
    return []


def _written_into(ctx: FileContext, trainer: ConfiguredTrainer, names: list[str], site: CallSite) -> None:
    """`trainer_config["accelerator"] = "gpu"` on the way from the config to the call; a key the
    scan cannot read makes the settings incomplete, unless its value is an option of the
    command line (`trainer_config[k] = getattr(opt, k)`: the launch commands say those)."""
    function = ctx.function_of(site.stack)
    for name in names:
        for assignment in ctx.item_assignments.get(name, ()):
            if ctx.function_of(assignment.stack) is not function:
                continue
            key = item_key(assignment)
            if key is not None:
                trainer.settings[key] = TrainerValue(_python(ctx, assignment.value, site), node=assignment.value)
            elif not (isinstance(assignment.value, cst.Call) and dotted_name(assignment.value.func) == "getattr"):
                trainer.complete = False


def _section_nodes(ctx: FileContext, expr: cst.BaseExpression, site: CallSite) -> list[Node]:
    """The section a `**expr` unpacks: of a YAML file the script loads, or of the configs hydra
    composes for its main (`pl.Trainer(**config.trainer)`: `trainer/default.yaml`; one per config
    the launch commands pick with `--config-name`)."""
    node = loaded_node(ctx, expr, site.stack)
    if node is not None:
        return [node]
    resolved = config_of(ctx, expr)
    if resolved is None or not resolved[1] or resolved[0].composed is None:
        return []
    main, keys = resolved
    found = {(node.at, repr(node.plain())): node for composed in (main.composed, *main.variants)
             if (node := composed.tree.get(*keys)) is not None}
    return list(found.values())  # configs that share their trainer file, unchanged, give it once


def _call_arguments(ctx: FileContext, trainer: ConfiguredTrainer, args: Sequence[cst.Arg], site: CallSite) -> None:
    """The call's own arguments win over the configuration; a `**kwargs` dict is asked key by key."""
    for arg in args:
        if arg.keyword is not None:
            trainer.settings[arg.keyword.value] = TrainerValue(_python(ctx, arg.value, site), node=arg)
        elif arg.star == "**":
            trainer.kwargs.append(partial(_kwargs_lookup, ctx, arg.value, site))
        elif arg.star:
            trainer.complete = False


def _kwargs_lookup(ctx: FileContext, expr: cst.BaseExpression, site: CallSite, key: str) -> TrainerValue | None:
    found = kwargs_value(ctx, expr, key, site.stack)
    if found.missing:
        return None
    return TrainerValue(UNKNOWN if found.unknown or found.node is None else _python(ctx, found.node, site))


def _python(ctx: FileContext, node: cst.BaseExpression, site: CallSite) -> Any:
    value = known_value(ctx, node, site.stack)
    return UNKNOWN if value is UNKNOWN_VALUE else value
