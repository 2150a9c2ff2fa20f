"""YAML and JSON files a script loads itself, and the parts of them it hands on.

`config = yaml.safe_load(open(args.config))` with `--config` defaulting to `configs/vae.yaml`,
then `Trainer(**config["trainer_params"])`: the Trainer's settings are that file's lines. An
expression is followed back to the load (`yaml.safe_load`/`yaml.load`/`yaml.full_load` of a file
opened with `open(...)`, directly or in `with open(...) as f`; `json.load` the same way;
`OmegaConf.load(path)`), the path is a literal or an argparse option (what the project's launch
commands pass, else its default: one file for every run, or none is known), and the keys read
from it (`config["trainer_params"]`, `config.trainer`) are looked up in the file's
tree (``config_tree``: read as data, never run, each value with its line).
"""

from __future__ import annotations

import libcst as cst

from speedfix.model import launch
from speedfix.model.arguments import argparse_option, literal_int, option_read, string_value
from speedfix.model.config_tree import Node, load_noted
from speedfix.model.context import FileContext
from speedfix.model.frames import Stack, class_of_method
from speedfix.model.project_files import Location
from speedfix.syntax.names import dotted_name

_LOADERS = frozenset({"yaml.safe_load", "yaml.load", "yaml.full_load", "json.load"})
_PATH_LOADERS = frozenset({"omegaconf.OmegaConf.load"})
# Calls that make a whole config: its sections are reached by key from there.
_CONFIG_ROOTS = _LOADERS | _PATH_LOADERS | {"omegaconf.OmegaConf.merge"}
# Calls that hand a section on unchanged, as another kind of mapping.
_SAME_SECTION = frozenset({"argparse.Namespace", "omegaconf.OmegaConf.to_container", "omegaconf.OmegaConf.to_object"})
_KEY_READS = frozenset({"get", "pop"})
_DEPTH = 6
_SECTION_DEPTH = 12  # names, key reads and re-wrappings between a merged config and its use


def loaded_node(ctx: FileContext, expr: cst.BaseExpression, stack: Stack, depth: int = 0) -> Node | None:
    """The part of a loaded config file ``expr`` certainly holds, or None."""
    if depth > _DEPTH:
        return None
    if isinstance(expr, cst.Subscript) and len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index):
        key = string_value(ctx, expr.slice[0].slice.value, stack)
        base = loaded_node(ctx, expr.value, stack, depth + 1) if key is not None else None
        return base.get(key) if base is not None and key is not None else None
    if isinstance(expr, cst.Attribute) and dotted_name(expr.value) not in ctx.imports.bindings:
        base = loaded_node(ctx, expr.value, stack, depth + 1)
        return base.get(expr.attr.value) if base is not None else None
    if isinstance(expr, cst.Name):
        value = ctx.single_value(expr.value, stack)
        return loaded_node(ctx, value, stack, depth + 1) if value is not None else None
    if isinstance(expr, cst.Call) and expr.args:
        return _loaded_file(ctx, expr, stack)
    return None


def spread_parameter(ctx: FileContext, name: str, stack: Stack) -> Node | None:
    """The value the parameter ``name`` of the module-level function around ``stack`` gets from a
    loaded config spread into its one call (`main(**OmegaConf.load(args.config))`, Tune-A-Video's
    way): the config's entry of that name, with its line. None when the function rebinds it, is
    called otherwise (or more than once), or the config has no such entry."""
    function = ctx.function_of(stack)
    if not isinstance(function, cst.FunctionDef) or class_of_method(stack) is not None \
            or ctx.assignments_in(function, name):
        return None
    calls = [site for site in ctx.calls if site.func == function.name.value]
    if len(calls) != 1 or len(calls[0].node.args) != 1 or calls[0].node.args[0].star != "**":
        return None
    config = loaded_node(ctx, calls[0].node.args[0].value, calls[0].stack)
    return config.get(name) if config is not None and isinstance(config.value, dict) else None


def _loaded_file(ctx: FileContext, call: cst.Call, stack: Stack) -> Node | None:
    names = loaded_names(ctx, call, stack)
    if len(names) != 1 or ctx.project is None:
        return None  # none, or one per run
    project = ctx.project
    path = project.find(names[0][0], (project.folder, project.top()))
    if path is None:
        return None
    return load_noted(project, path)


def loaded_names(ctx: FileContext, call: cst.Call, stack: Stack) -> list[tuple[str, Location | None]]:
    """The file names a loader call (`json.load(open(args.ds_file))`, `OmegaConf.load(path)`)
    reads in the project's runs, each with the launch option that names it (None: the argparse
    default or a literal); empty when ``call`` is no such load or its path cannot be known."""
    loader = ctx.qualname(call.func)
    if not call.args:
        return []
    first = call.args[0].value
    if loader in _PATH_LOADERS:
        path_expr: cst.BaseExpression | None = first
    elif loader in _LOADERS:
        path_expr = _opened_path(ctx, first, stack)
    else:
        return []
    return run_strings(ctx, path_expr, stack) if path_expr is not None else []


def run_strings(ctx: FileContext, expr: cst.BaseExpression, stack: Stack) -> list[tuple[str, Location | None]]:
    """The strings ``expr`` holds in the project's runs: for an argparse option (`args.ds_file`),
    what each launch command passes (`--ds_file ds_zero3.json`, with its line) and the default
    for the commands that pass none (or a value a scan cannot know: `$CONFIG`, `<your.json>`);
    otherwise the one string it certainly holds, if any."""
    default = string_value(ctx, expr, stack)
    option = argparse_option(ctx, expr)
    read = option_read(expr)
    if option is None or read is None:
        return [(default, None)] if default is not None else []
    names = {read[1], *(str(arg.value.evaluated_value).lstrip("-").replace("-", "_") for arg in option.node.args
                               if arg.keyword is None and isinstance(arg.value, cst.SimpleString)
                               and str(arg.value.evaluated_value).startswith("--"))}
    found: dict[str, Location | None] = {}
    for given in launch.per_command(ctx, *sorted(names)) or [None]:
        if given is not None and isinstance(given[0], str):
            found.setdefault(given[0], given[1])
        elif default is not None:
            found.setdefault(default, None)
    return list(found.items())


def built_string(ctx: FileContext, expr: cst.BaseExpression, stack: Stack) -> str | None:
    """The one string an f-string or `os.path.join(...)` builds in every run of the project
    (`f"dsconfig/{args.model}_stage_{args.stage}.json"` with `--model openllama_peft --stage 1`
    in each launch command, else the options' defaults); None when a part cannot be known or
    the runs disagree."""
    parts: list[str | None]
    if isinstance(expr, cst.FormattedString):
        if any(isinstance(part, cst.FormattedStringExpression) and (part.conversion or part.format_spec)
               for part in expr.parts):
            return None
        parts = [part.value if isinstance(part, cst.FormattedStringText) else _one_string(ctx, part.expression, stack)
                 for part in expr.parts]
        separator = ""
    elif isinstance(expr, cst.Call) and ctx.qualname(expr.func) == "os.path.join" and expr.args \
            and not any(arg.keyword or arg.star for arg in expr.args):
        parts, separator = [_one_string(ctx, arg.value, stack) for arg in expr.args], "/"
    else:
        return None
    known = [part for part in parts if part is not None]
    return separator.join(known) if len(known) == len(parts) else None


def _one_string(ctx: FileContext, expr: cst.BaseExpression, stack: Stack) -> str | None:
    built = built_string(ctx, expr, stack)  # `os.path.join("ds", f"{args.model}.json")`
    if built is not None:
        return built
    values = {name for name, _ in run_strings(ctx, expr, stack)}
    if not values:
        number = literal_int(ctx, expr, stack)
        return None if number is None else str(number)
    return values.pop() if len(values) == 1 else None


def _opened_path(ctx: FileContext, expr: cst.BaseExpression, stack: Stack) -> cst.BaseExpression | None:
    """The path of `open(path)`, written in place or bound by `with open(path) as f`."""
    if isinstance(expr, cst.Call) and dotted_name(expr.func) == "open" and expr.args:
        return expr.args[0].value
    if not isinstance(expr, cst.Name):
        return None
    opened = [item for info in ctx.withs for item in info.node.items
              if isinstance(item.asname, cst.AsName) and isinstance(item.asname.name, cst.Name)
              and item.asname.name.value == expr.value]
    if len(opened) != 1:
        return None
    return _opened_path(ctx, opened[0].item, stack)


def section_keys(ctx: FileContext, expr: cst.BaseExpression, stack: Stack, depth: int = 0,
                 names: list[str] | None = None) -> tuple[str, ...] | None:
    """The keys that lead from a loaded (or merged) config to the section ``expr`` holds:
    `config.pop("lightning", {}).get("trainer", {})`, `cfg["trainer"]`, followed through names
    and through what hands a section on unchanged (`vars(...)`, `dict(...)`,
    `argparse.Namespace(**section)`, `OmegaConf.to_container(...)`); `()` for the whole config
    (`OmegaConf.merge(*configs)`, `OmegaConf.load(path)`, `yaml.safe_load(f)`), None when
    ``expr`` is not read from a config file. ``names`` collects the variables passed through."""
    if depth > _SECTION_DEPTH:
        return None
    inner: cst.BaseExpression | None = None
    key: str | None = None
    if isinstance(expr, cst.Subscript) and len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index):
        inner, key = expr.value, string_value(ctx, expr.slice[0].slice.value, stack)
        if key is None:
            return None
    elif isinstance(expr, cst.Attribute) and dotted_name(expr.value) not in ctx.imports.bindings:
        inner, key = expr.value, expr.attr.value
    elif isinstance(expr, cst.Name):
        inner = _one_value(ctx, expr.value, stack)
        if names is not None:
            names.append(expr.value)
    elif isinstance(expr, cst.Call):
        qualified = ctx.qualname(expr.func)
        if qualified in _CONFIG_ROOTS:
            return ()
        if isinstance(expr.func, cst.Attribute) and expr.func.attr.value in _KEY_READS and expr.args:
            inner, key = expr.func.value, string_value(ctx, expr.args[0].value, stack)
            if key is None:
                return None
        else:
            inner = _handed_on(ctx, expr, qualified)
    if inner is None:
        return None
    base = section_keys(ctx, inner, stack, depth + 1, names)
    return None if base is None else (*base, key) if key is not None else base


def _handed_on(ctx: FileContext, call: cst.Call, qualified: str | None) -> cst.BaseExpression | None:
    """The section a call hands on unchanged: `vars(x)`, `dict(x)`, `argparse.Namespace(**x)`."""
    if len(call.args) != 1 or call.args[0].keyword is not None:
        return None
    arg = call.args[0]
    builtin = qualified is None and dotted_name(call.func) in ("vars", "dict")
    if (builtin and not arg.star) or (qualified in _SAME_SECTION and arg.star in ("", "**")):
        return arg.value
    return None


def _one_value(ctx: FileContext, name: str, stack: Stack) -> cst.BaseExpression | None:
    """The one value of ``name`` in scope, not counting re-wrappings of itself (`opt = vars(opt)`)."""
    found = ctx.assignments_in_scope(name, stack)
    if any(a.unpacked or a.augmented for a in found):
        return None
    own = [a.value for a in found if not _rewraps(ctx, a.value, name)]
    return own[0] if len(own) == 1 else None


def _rewraps(ctx: FileContext, value: cst.BaseExpression, name: str) -> bool:
    inner = _handed_on(ctx, value, ctx.qualname(value.func)) if isinstance(value, cst.Call) else None
    return inner is not None and dotted_name(inner) == name
