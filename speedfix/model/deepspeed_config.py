"""The DeepSpeed configuration a script names, read without running the script.

A config reaches DeepSpeed as a dict (`deepspeed.initialize(..., config=ds_config)`) or as the
path of a JSON file (`config="ds_config.json"`, `TrainingArguments(deepspeed="ds_z2.json")`,
`HfDeepSpeedConfig("ds.json")`, an argparse `--deepspeed_config` default). A dict written in the
file is read from its syntax tree; a JSON file from where ``speedfix.model.deepspeed_files``
finds it (beside the script or in the current folder, never out of them), and what it holds is
part of the script's cache key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import libcst as cst

from speedfix.model.arguments import find_argument
from speedfix.model.context import FileContext
from speedfix.model.deepspeed_files import locate
from speedfix.model.index import CallSite
from speedfix.syntax.nodes import integer_value

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


@dataclass(frozen=True)
class DeepSpeedConfig:
    """A config as the script gives it: ``values`` (None when it cannot be read, ``problem`` says
    why), the node to report on, and the JSON file's name (None: a dict in the script)."""

    node: cst.CSTNode
    values: dict[str, Any] | None
    file: str | None = None
    literal: cst.Dict | None = None  # the dict as written, when the script holds it
    problem: str | None = None
    taker: str | None = None  # the call it is passed to (qualified), None: an argparse default
    name: str | None = None  # the variable that holds it (`ds_config`), when it is one


def named_configs(ctx: FileContext) -> list[DeepSpeedConfig]:
    """The DeepSpeed configs the script passes (or defaults to), in file order, one per node."""
    found: dict[int, DeepSpeedConfig] = {}
    for qualified, (keyword, position) in CONFIG_TAKERS.items():
        for site in ctx.calls_to(qualified):
            argument = find_argument(ctx, site, keyword, position)
            if argument.missing or argument.unknown or argument.node is None:
                continue
            config = _read(ctx, argument.node, site)
            if config is not None:
                name = argument.node.value if isinstance(argument.node, cst.Name) else None
                found.setdefault(id(config.node), replace(config, taker=qualified, name=name))
    for site in ctx.calls:
        config = _argparse_config(ctx, site)
        if config is not None:
            found.setdefault(id(config.node), config)
    return list(found.values())


def _read(ctx: FileContext, node: cst.BaseExpression, site: CallSite) -> DeepSpeedConfig | None:
    if isinstance(node, cst.Name):
        value = ctx.single_value(node.value, site.stack)
        if value is None:
            return None
        node = value
    if isinstance(node, cst.Dict):
        values = _literal_dict(node)
        return DeepSpeedConfig(node, values, literal=node) if values is not None else None
    if isinstance(node, cst.SimpleString):
        name = node.evaluated_value
        if isinstance(name, str) and name.endswith(".json"):
            return _from_file(ctx, node, name)
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


def _from_file(ctx: FileContext, node: cst.SimpleString, name: str) -> DeepSpeedConfig | None:
    path = locate(Path(ctx.path), name)
    if path is None:
        return None  # not beside the script nor in the current folder (or too big): nothing to read
    try:
        data = path.read_bytes()
    except OSError as exc:
        return DeepSpeedConfig(node, None, name, problem=f"cannot read {name}: {exc.strerror or exc}")
    try:
        values = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        return DeepSpeedConfig(node, None, name, problem=f"{name} is not plain JSON ({exc}); DeepSpeed reads it as "
                                                         "hjson, which allows comments, speedfix does not")
    except RecursionError:  # the script keeps its findings: only the JSON is left unread
        return DeepSpeedConfig(node, None, name, problem=f"{name} is nested too deeply to read")
    if not isinstance(values, dict):
        return DeepSpeedConfig(node, None, name, problem=f"{name} holds a JSON {type(values).__name__}, not an object")
    return DeepSpeedConfig(node, values, name)


def _literal_dict(node: cst.Dict) -> dict[str, Any] | None:
    """A dict of literals (nested dicts, strings, numbers, True/False/None); unknown values
    (names, calls) are kept as ``...`` so that the keys around them still count."""
    values: dict[str, Any] = {}
    for element in node.elements:
        if not isinstance(element, cst.DictElement) or not isinstance(element.key, cst.SimpleString):
            continue
        key = element.key.evaluated_value
        if isinstance(key, str):
            values[key] = _literal(element.value)
    return values


def _literal(node: cst.BaseExpression) -> Any:
    if isinstance(node, cst.Dict):
        return _literal_dict(node)
    if isinstance(node, cst.SimpleString):
        return node.evaluated_value
    if isinstance(node, cst.Integer):
        value = integer_value(node)
        return ... if value is None else value
    if isinstance(node, cst.Float):
        return node.evaluated_value
    if isinstance(node, cst.Name) and node.value in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[node.value]
    return ...
