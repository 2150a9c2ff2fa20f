"""Command-line options a parser in another file of the project defines.

`args = parse_args_paired_training()` in `src/train.py`, imported from the project's
`my_utils/training_utils.py` (next to the script, at the project's top or in its src layout),
whose function builds an `argparse` parser, adds `--mixed_precision` (default None) and
`--set_grads_to_none` (`store_true`), and returns `parser.parse_args()`: `args.mixed_precision`
reads that option. The file is read with ``ProjectFiles`` and parsed, nothing is imported or
run (parsed with the same limits as a scanned file); only the function's own `add_argument`
calls count, and only when it parses them itself.
"""

from __future__ import annotations

import libcst as cst

from speedfix.model.context import FileContext
from speedfix.model.index import CallSite
from speedfix.model.project_classes import script_module_path
from speedfix.syntax.names import dotted_name
from speedfix.syntax.parsing import TooBigToParse, parse_module
from speedfix.syntax.nodes import walk_expression

_LARGEST = 300_000  # characters: a parser module is small; anything bigger is not read for this


def imported_options(ctx: FileContext, value: cst.BaseExpression) -> list[CallSite]:
    """The `add_argument` calls of the project function ``value`` calls (`parse_args_paired_training()`,
    imported from a file of the project) when that function returns the parsed options; [] otherwise."""
    if ctx.project is None or not isinstance(value, cst.Call):
        return []
    qualified = ctx.qualname(value.func)
    if qualified is None or "." not in qualified or qualified == dotted_name(value.func):
        return []  # not imported: the file's own functions are read by ``arguments``
    module, _, name = qualified.rpartition(".")
    project = ctx.project
    path = script_module_path(project, module)
    if path is None:
        return []
    return project.recorded(("parser-options", str(path), name), lambda: _function_options(project.text(path), name))


def _function_options(text: str | None, name: str) -> list[CallSite]:
    if text is None or len(text) > _LARGEST:
        return []
    try:
        module = parse_module(text)  # the nesting and size checks of every parse: never hangs
    except (cst.ParserSyntaxError, TooBigToParse, RecursionError, MemoryError, ValueError):
        return []
    functions = [s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value == name]
    if len(functions) != 1:
        return []
    calls = [node for node in walk_expression(functions[0].body) if isinstance(node, cst.Call)]
    if not any(isinstance(c.func, cst.Attribute) and c.func.attr.value in ("parse_args", "parse_known_args") for c in calls):
        return []
    return [CallSite(call, dotted_name(call.func), (), None) for call in calls
            if isinstance(call.func, cst.Attribute) and call.func.attr.value == "add_argument"]

