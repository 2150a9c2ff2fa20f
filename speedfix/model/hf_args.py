"""Hugging Face `TrainingArguments` a script never writes as a call: filled in by a parser.

`HfArgumentParser((ModelArguments, DataArguments, TrainingArguments)).parse_args_into_dataclasses()`
and TRL's `TrlParser((ScriptArguments, SFTConfig, ModelConfig)).parse_args_and_config()` build
the training arguments from the command line. Their settings are then, in this order:

1. the project's launch commands (``speedfix.model.launch``): `--bf16 True` in every command
   that runs the script, or the value the recipe YAML each command names gives (`--config
   recipe.yaml` for TRL's parser, or a YAML as the script's first argument);
2. the field defaults of the project's own subclass (`class TrainingArguments(transformers.
   TrainingArguments): optim: str = field(default="adamw_torch")`), read from this file; a
   subclass the script imports from the project's package (``speedfix.model.project_classes``)
   makes the fields it sets unknown;
3. TRL's defaults for its configs (0.22 and newer): `gradient_checkpointing=True`, and `bf16` on
   unless `fp16` is (so precision is TRL's business, never reported as fp32);
4. transformers' own defaults (fp32, no TF32 setting, no loader workers, ...).

A value the launch commands set differently from one command to another, or through a shell
variable, is unknown as one setting; ``ParsedArguments.per_launch`` gives each command's own.

`HfArgumentParser(...).parse_json_file(args.train_args_file)` (and `parse_yaml_file`) fill the
arguments from a file alone: the file each launch command names with the option, else the
option's default (read as data, never run); a value they all write is known.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from enum import Enum
from typing import Any

import libcst as cst

from speedfix.model import launch
from speedfix.model.arguments import (UNKNOWN_VALUE, class_field_defaults, find_argument, known_value, option_read,
                                      string_value)
from speedfix.model.config_tree import load_mapping
from speedfix.model.loaded_config import run_strings
from speedfix.model.context import FileContext
from speedfix.model.flow import compared, literal_value, truth_in_every_run
from speedfix.model.frames import Stack
from speedfix.model.frameworks import HF_ARGUMENT_PARSERS, HF_TRAINING_ARGUMENTS, TRL_CONFIGS
from speedfix.model.index import CallSite
from speedfix.model.project_classes import project_class
from speedfix.model.project_files import Location, ProjectFiles
from speedfix.syntax.nodes import integer_value, walk_expression

TRL_DEFAULTS = {"gradient_checkpointing": True}
_PARSE_METHODS = frozenset({"parse_args_into_dataclasses", "parse_args_and_config"})
# `parser.parse_json_file(path)`: every value comes from the file, none from the command line
FILE_PARSES = {"parse_json_file": "json_file", "parse_yaml_file": "yaml_file"}


class Source(Enum):
    CALL = "call"  # written in a `TrainingArguments(...)` call of the script
    LAUNCH = "launch"  # a launch command's option
    FIELD = "field"  # the default of a field of the project's subclass
    FRAMEWORK = "framework"  # TRL's default
    DEFAULT = "default"  # transformers' default: missing


@dataclass(frozen=True)
class Setting:
    """One training argument of a parsed `TrainingArguments`: ``value`` (None: transformers'
    default; ``UNKNOWN``: cannot be known), and where it is set: a launch file's line
    (``where``) or a field of the script (``node``)."""

    value: Any
    source: Source
    where: Location | None = None
    node: cst.CSTNode | None = None
    arg: cst.Arg | None = None  # the argument of the call that writes it (Source.CALL)

    @property
    def unknown(self) -> bool:
        return self.value is UNKNOWN

    @property
    def missing(self) -> bool:
        return self.source is Source.DEFAULT


UNKNOWN: Any = object()


@dataclass(frozen=True)
class ParsedArguments:
    """The `TrainingArguments` class a parser fills (``reference``: where the script names it in
    the parser's tuple), the parse call, and what sets each value."""

    ctx: FileContext
    reference: cst.BaseExpression
    parse: CallSite
    qualname: str  # transformers' or TRL's class it is (or derives from)
    fields: dict[str, cst.BaseExpression]  # field defaults of the project's own subclass
    recipes: tuple[dict[str, tuple[Any, Location]] | None, ...]  # per launch command, its `--config` YAML
    # `parse_json_file(path)`: the values of each file the runs read, the script's default first
    files: tuple[dict[str, tuple[Any, Location]], ...] | None = None

    @property
    def trl(self) -> bool:
        return self.qualname in TRL_CONFIGS

    def per_launch(self, key: str) -> list[Setting | None]:
        """The value each launch command gives ``key`` (its option, or its recipe's; None where
        it leaves it out): where they disagree, ``setting`` is unknown but each run's is not."""
        if self.files is not None:
            return [Setting(_parsed(file[key][0]), Source.LAUNCH, file[key][1]) if key in file else None
                    for file in self.files]
        return [None if given is None else Setting(_parsed(given[0]), Source.LAUNCH, given[1])
                for given in launch.per_command(self.ctx, key, files=self.recipes)]

    def per_run(self, key: str) -> list[Setting]:
        """The value each run gives ``key``: each launch command's (or file's), else the default
        (``default``); just the default where the project has no launch command."""
        return [given or self.default(key) for given in self.per_launch(key) or [None]]

    def setting(self, key: str) -> Setting:
        if self.files is not None:
            return self._file_setting(key)
        given = launch.option(self.ctx, key, files=self.recipes)
        if given.state is launch.State.MIXED or (given.state is launch.State.KNOWN and not given.known):
            return Setting(UNKNOWN, Source.LAUNCH, given.where)
        if given.known:
            return Setting(_parsed(given.value), Source.LAUNCH, given.where)
        return self.default(key)

    def _file_setting(self, key: str) -> Setting:
        """``key`` as the files the runs read give it: the value they all write (at the line of
        the first, the script's default file when it is one of them), the class's default when
        none writes it, unknown when they differ."""
        assert self.files is not None
        given = [file[key] for file in self.files if key in file]
        if not given:
            return self.default(key)
        if len(given) < len(self.files) or len({repr(value) for value, _ in given}) > 1:
            return Setting(UNKNOWN, Source.LAUNCH, given[0][1])
        value, where = given[0]
        default = _default_file(self.ctx, self.parse)
        if default is not None and key in default and repr(default[key][0]) == repr(value):
            where = default[key][1]  # the file the script itself names says the same: point there
        return Setting(_parsed(value), Source.LAUNCH, where)

    def default(self, key: str) -> Setting:
        """``key`` as a run that leaves it out gets it: the project's field default, TRL's, or
        the class's own (``Source.DEFAULT``, value None)."""
        if key in self.fields:
            value = _literal(self.fields[key])
            return Setting(value, Source.FIELD, node=self.fields[key])
        if self.trl and key in TRL_DEFAULTS:
            return Setting(TRL_DEFAULTS[key], Source.FRAMEWORK)
        if self.trl and key == "bf16":
            return Setting(UNKNOWN, Source.FRAMEWORK)  # on unless fp16 is: TRL decides
        return Setting(None, Source.DEFAULT)


def call_setting(ctx: FileContext, site: CallSite, key: str) -> Setting:
    """A keyword of a `TrainingArguments(...)` call as a ``Setting``: its value as far as the file
    can tell (a literal, a constant, an argparse default), UNKNOWN otherwise."""
    found = find_argument(ctx, site, key)
    if found.missing:
        return Setting(None, Source.DEFAULT)
    if found.unknown or found.node is None:
        return Setting(UNKNOWN, Source.CALL, arg=found.arg)
    value = known_value(ctx, found.node, site.stack)
    if value is UNKNOWN_VALUE and option_read(found.node) is not None:  # `fp16=args.fp16` with `default=True`
        truth = truth_in_every_run(ctx, found.node, site.stack)
        value = UNKNOWN_VALUE if truth is None else truth
    return Setting(UNKNOWN if value is UNKNOWN_VALUE else value, Source.CALL, node=found.node, arg=found.arg)


def parsed_arguments(ctx: FileContext) -> list[ParsedArguments]:
    """Each `TrainingArguments` (or TRL config) class that a parser of this file fills from the
    command line, when the file parses it (`parse_args_into_dataclasses()`,
    `parse_args_and_config()`)."""
    found = []
    for site in ctx.calls_to(*HF_ARGUMENT_PARSERS):
        if not site.node.args:
            continue
        parse = _parse_call(ctx, site)
        if parse is None:
            continue
        files = _parsed_files(ctx, parse) if _method(parse) in FILE_PARSES else None
        if _method(parse) in FILE_PARSES and not files:
            continue  # a file the scan cannot name or read: its values are unknown
        for element in _classes(ctx, site.node.args[0].value, site):
            qualname, fields = _training_class(ctx, element)
            if qualname is not None:
                found.append(ParsedArguments(ctx, element, parse, qualname, fields,
                                             () if files else _recipes(ctx), files))
    return found


def compared_false_in_every_run(ctx: FileContext, test: cst.BaseExpression, stack: Stack) -> bool:
    """`training_args.load_in_kbits in [4, 8]`: a field of the project's TrainingArguments
    subclass a parser fills, compared with a literal, false with the value each launch command
    gives it (`--load_in_kbits 16`) and with the field's default where a command leaves it out."""
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1 or not isinstance(test.left, cst.Attribute):
        return False
    key, target = test.left.attr.value, test.comparisons[0]
    right = literal_value(ctx, target.comparator, stack)
    for parsed in parsed_arguments(ctx):
        if key in parsed.fields:
            return all(compared(target.operator, run.value, right) is False for run in parsed.per_run(key))
    return False


def _method(site: CallSite) -> str:
    func = site.node.func
    return func.attr.value if isinstance(func, cst.Attribute) else ""


def _file_argument(ctx: FileContext, parse: CallSite) -> cst.BaseExpression | None:
    """The path `parse_json_file` is given, followed through a name (`path = args.train_args_file`)."""
    node = find_argument(ctx, parse, FILE_PARSES[_method(parse)], 0).node
    if isinstance(node, cst.Name):
        return ctx.single_value(node.value, parse.stack) or node
    return node


def _default_file(ctx: FileContext, parse: CallSite) -> dict[str, tuple[Any, Location]] | None:
    """The file the script reads when no option names another (`default="train_args/sft.json"`)."""
    node = _file_argument(ctx, parse)
    default = string_value(ctx, node, parse.stack) if node is not None else None
    return _values_file(ctx, default, None) if default is not None else None


def _parsed_files(ctx: FileContext, parse: CallSite) -> tuple[dict[str, tuple[Any, Location]], ...]:
    """The values of the files `parser.parse_json_file(args.train_args_file)` reads: the file
    each launch command passes (`--train_args_file sft.json`), else the option's default. A
    name the project holds no file for (a README's typo, a file each user writes) is no run the
    scan can read."""
    node = _file_argument(ctx, parse)
    if node is None or ctx.project is None:
        return ()
    names = run_strings(ctx, node, parse.stack)
    files = [_values_file(ctx, name, where.path.parent if where is not None else None) for name, where in names]
    return tuple(file for file in files if file is not None)


def _parse_call(ctx: FileContext, parser: CallSite) -> CallSite | None:
    """The `parse_args_into_dataclasses()`/`parse_args_and_config()` call on the parser (else its
    `parse_json_file(path)`): the parser assigned to a name (in this function, or returned by a
    function of the file)."""
    holders = _holders(ctx, parser)
    for method in (*sorted(_PARSE_METHODS), *FILE_PARSES):
        for site in ctx.method_calls(method):
            func = site.node.func
            assert isinstance(func, cst.Attribute)
            if isinstance(func.value, cst.Call) and func.value is parser.node:
                return site
            if isinstance(func.value, cst.Name) and func.value.value in holders:
                return site
    return None


def _holders(ctx: FileContext, parser: CallSite) -> set[str]:
    """Names that hold the parser: `parser = HfArgumentParser(...)`, or `parser = make_parser()`
    where the file's `make_parser` returns it."""
    names: set[str] = set()
    returned = False
    for line in parser.statement.body if parser.statement is not None else ():
        if isinstance(line, cst.Assign) and line.value is parser.node:
            names.update(t.target.value for t in line.targets if isinstance(t.target, cst.Name))
        returned = returned or (isinstance(line, cst.Return) and line.value is parser.node)
    function = ctx.function_of(parser.stack)
    if not isinstance(function, cst.FunctionDef):
        return names
    returned = returned or any(isinstance(r.value, cst.Name) and r.value.value in names for r in _returns(function))
    if returned:
        for name, assignments in ctx.assignments.items():
            if any(isinstance(a.value, cst.Call) and isinstance(a.value.func, cst.Name)
                   and a.value.func.value == function.name.value for a in assignments):
                names.add(name)
    return names


def _returns(function: cst.FunctionDef) -> list[cst.Return]:
    found: list[cst.Return] = []

    class Visitor(cst.CSTVisitor):
        def visit_Return(self, node: cst.Return) -> None:
            found.append(node)

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is function

    function.visit(Visitor())
    return found


def _classes(ctx: FileContext, node: cst.BaseExpression, site: CallSite) -> list[cst.BaseExpression]:
    """The classes of the parser's first argument: a tuple or list of them, one class, or a
    name holding the tuple (`dataclass_types = (ScriptArguments, SFTConfig, ModelConfig)`)."""
    if isinstance(node, cst.Name) and node.value not in ctx.classes:
        value = ctx.single_value(node.value, site.stack)
        if value is None or not isinstance(value, (cst.Tuple, cst.List)):
            return [node]
        node = value
    if isinstance(node, (cst.Tuple, cst.List)):
        return [element.value for element in node.elements if isinstance(element, cst.Element)]
    return [node]


def _training_class(ctx: FileContext, node: cst.BaseExpression) -> tuple[str | None, dict[str, cst.BaseExpression]]:
    """(transformers'/TRL's class, the field defaults of the file's subclasses)."""
    qualname = ctx.qualname(node)
    known = (*HF_TRAINING_ARGUMENTS, *TRL_CONFIGS)
    if qualname in known:
        return _canonical(qualname), {}
    name = node.value if isinstance(node, cst.Name) else None
    if name is not None and name not in ctx.classes and qualname and ctx.project is not None:
        return _project_training_class(ctx.project, qualname, known)
    if name is None or name not in ctx.classes:
        return None, {}
    bases = ctx.class_bases(name)
    base = next((b for b in bases if b in known), None)
    if base is None:
        return None, {}
    fields: dict[str, cst.BaseExpression] = {}
    for class_name in _lineage(ctx, name):
        for key, value in class_field_defaults(ctx, class_name).items():
            fields.setdefault(key, value)
    return _canonical(base), fields


def _project_training_class(project: ProjectFiles, qualname: str, known: tuple[str, ...]
                            ) -> tuple[str | None, dict[str, cst.BaseExpression]]:
    """A subclass another file of the project defines (`from alignment import SFTConfig`): the
    fields it gives a value are unknown here (the rules stay silent about them)."""
    found = project_class(project, qualname)
    base = next((b for b in found.bases if b in known), None) if found is not None else None
    if found is None or base is None:
        return None, {}
    return _canonical(base), {key: cst.Name("UNKNOWN_DEFAULT") for key in found.fields}


def _lineage(ctx: FileContext, name: str) -> list[str]:
    """The class and its bases defined in this file, most derived first."""
    found = [name]
    index = 0
    while index < len(found):
        for base in ctx.classes[found[index]].bases:
            short = base.rsplit(".", 1)[-1]
            if short in ctx.classes and short not in found and base == short:
                found.append(short)
        index += 1
    return found


def _canonical(qualname: str) -> str:
    return "transformers.TrainingArguments" if qualname in HF_TRAINING_ARGUMENTS else qualname


def _literal(node: cst.BaseExpression) -> Any:
    if isinstance(node, cst.Name) and node.value in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[node.value]
    if isinstance(node, cst.Integer):  # an integer too long to print is no count
        value = integer_value(node)
        return UNKNOWN if value is None else value
    if isinstance(node, (cst.Float, cst.SimpleString)):
        return node.evaluated_value
    return UNKNOWN


def _parsed(value: object) -> Any:
    """A launch option's text as the parser reads it: booleans, numbers, strings (a config
    file's values are typed already)."""
    if value is True or isinstance(value, (bool, int, float)) or value is None:
        return value
    truth = launch.truth(value)
    if truth is not None and isinstance(value, str) and value.lower() in ("true", "false"):
        return truth
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return value
    return UNKNOWN


_RECIPE_SUFFIXES = (".yaml", ".yml", ".json")


def _recipes(ctx: FileContext) -> tuple[dict[str, tuple[Any, Location]] | None, ...]:
    """Per launch command, the values of the recipe YAML it names with `--config` (TRL's parser
    reads it): empty for a command that names none, None for one whose file cannot be read."""
    return tuple(_recipe(ctx, command) for command in launch.launches(ctx))


def _recipe(ctx: FileContext, command: launch.Launch) -> dict[str, tuple[Any, Location]] | None:
    """The recipe of one command: `--config recipe.yaml`, or the YAML or JSON file given as the
    script's first argument (`sft.py recipes/config_qlora.yaml`; `train.py run.json`, which
    `HfArgumentParser.parse_json_file` reads); `config_{a,b}.yaml` names both files, and a value
    is known where they say the same."""
    given = command.options.get("config")
    if given is None and command.positional and command.positional[0].lower().endswith(_RECIPE_SUFFIXES):
        given = command.positional[0]
    if given is None or ctx.project is None:
        return {}
    if not isinstance(given, str):
        return None
    recipes = [_recipe_file(ctx, command, name) for name in _brace_expansion(given)]
    if any(recipe is None for recipe in recipes):
        return None
    merged: dict[str, tuple[Any, Location]] = {}
    for recipe in recipes:
        for key, (value, where) in recipe.items():  # type: ignore[union-attr]
            agree = all(key in other and other[key][0] == value for other in recipes)  # type: ignore[operator]
            merged.setdefault(key, (value if agree else launch.UNKNOWN_VALUE, where))
    return merged


def _recipe_file(ctx: FileContext, command: launch.Launch, name: str) -> dict[str, tuple[Any, Location]] | None:
    return _values_file(ctx, name, command.file.parent)


def _values_file(ctx: FileContext, name: str, base: Path | None) -> dict[str, tuple[Any, Location]] | None:
    """The top-level values of a YAML or JSON file of the project, each with its line (found
    beside ``base``, the launch file naming it, or from the project's top or folder)."""
    project = ctx.project
    assert project is not None
    roots = (project.top(), project.folder) if base is None else (base, project.top(), project.folder)
    path = project.find(name, roots)
    if path is None or path.suffix.lower() not in _RECIPE_SUFFIXES:
        return None
    tree = load_mapping(project, path)
    if tree is None:
        return None
    return {key: (node.plain(), node.at) for key, node in tree.value.items()}


def _brace_expansion(word: str) -> list[str]:
    """`config_{grok,anthropic}.yaml` -> both names, as the shell expands them (one brace)."""
    match = re.search(r"\{([^{}]*,[^{}]*)\}", word)
    if match is None:
        return [word]
    return [word[:match.start()] + part + word[match.end():] for part in match.group(1).split(",")]


def arguments_only(ctx: FileContext) -> bool:
    """Does the file use `TrainingArguments` only as a holder of options for a training loop of
    its own (distil-whisper's Accelerate loop: `accelerator.backward(loss)`, its own AdamW)? No
    Trainer is built, so the Trainer's precision, optimizer, loader and compile settings do nothing."""
    if any(name.rsplit(".", 1)[-1].endswith("Trainer") for name in ctx.calls_by_qualname):
        return False
    if any(info.bases and any(base.endswith("Trainer") for base in info.bases) for info in ctx.classes.values()):
        return False
    return any(ctx.in_training_loop(site.stack) for site in ctx.method_calls("backward"))


def trainer_never_trains(ctx: FileContext) -> bool:
    """Does the file build its Trainers only to evaluate or predict (an inference script:
    `trainer = Trainer(...)`, then `trainer.evaluate()` or `trainer.get_model()`, never
    `trainer.train()`)? Each Trainer is bound to a plain name where it is built, and that name is
    only the receiver of method calls other than `train`: never returned, passed on or stored."""
    built = [site for site in ctx.calls if (site.func or "").rsplit(".", 1)[-1].endswith("Trainer")
             and site.func not in ctx.functions]
    if not built:
        return False
    for site in built:
        line = site.statement.body[0] if site.statement is not None and len(site.statement.body) == 1 else None
        if not (isinstance(line, cst.Assign) and line.value is site.node and len(line.targets) == 1
                and isinstance(line.targets[0].target, cst.Name)):
            return False
        name = line.targets[0].target.value
        scope = ctx.function_of(site.stack) or ctx.module
        receivers = {id(node.value) for node in walk_expression(scope) if isinstance(node, cst.Attribute)
                     and isinstance(node.value, cst.Name) and node.value.value == name
                     and node.attr.value not in ("train", "fit")}
        if any(isinstance(node, cst.Name) and node.value == name and id(node) not in receivers
               and node is not line.targets[0].target for node in walk_expression(scope)):
            return False  # `trainer.train()`, `trainer.fit(...)`, `return trainer`, `run(trainer)`
    return True


# transformers' own defaults of the `TrainingArguments` fields that a script's own code may read
# (`DataLoader(..., num_workers=training_args.dataloader_num_workers)`).
_FIELD_DEFAULTS: dict[str, object] = {"dataloader_num_workers": 0, "dataloader_pin_memory": True,
                                      "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1}


def run_field_value(ctx: FileContext, node: cst.BaseExpression) -> object:
    """The value every run gives `training_args.<field>` (``node``), where a parser of the file
    fills `training_args` (`model_args, data_args, training_args =
    parser.parse_args_into_dataclasses()`): a launch command's or config file's, else the
    field's default (the project's dataclass, else transformers' own for the fields of
    ``_FIELD_DEFAULTS``); UNKNOWN where the runs disagree or it cannot be known."""
    if not (isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name)):
        return UNKNOWN
    holder, key = node.value.value, node.attr.value
    for one in parsed_arguments(ctx):
        index = _place_in_parser(ctx, one)
        if not any(a.value is one.parse.node and a.position == index for a in ctx.assignments.get(holder, ())):
            continue
        setting = one.setting(key)
        if setting.unknown:
            return UNKNOWN
        if setting.missing:
            return _FIELD_DEFAULTS.get(key, UNKNOWN)
        return setting.value
    return UNKNOWN


def _place_in_parser(ctx: FileContext, parsed: ParsedArguments) -> int | None:
    """The place of the class in its parser's tuple, which is its place in the tuple the parse
    returns (None: the parser's only class)."""
    for site in ctx.calls_to(*HF_ARGUMENT_PARSERS):
        if site.node.args:
            classes = _classes(ctx, site.node.args[0].value, site)
            if parsed.reference in classes:
                return classes.index(parsed.reference) if len(classes) > 1 else None
    return None
