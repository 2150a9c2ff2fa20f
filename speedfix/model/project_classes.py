"""A class another file of the project defines, read as text: its bases and the fields it sets.

`from alignment import SFTConfig` in `scripts/sft.py`, where the project's package
(`src/alignment/configs.py`, re-exported by its `__init__.py`) says `class SFTConfig(trl.
SFTConfig): chat_template: str = None`: the script's parser fills TRL's config with one more
field. The module is looked for below the project's top (`alignment/`, `src/alignment/`, a
package's `__init__.py` and the modules it imports the name from, one level), read with
``ProjectFiles`` and parsed with ``ast``; nothing is imported or run.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from speedfix.model.project_files import ProjectFiles

_LAYOUTS = ("", "src")  # `pkg/` at the project's top, or the src layout `src/pkg/`


@dataclass(frozen=True)
class ProjectClass:
    bases: tuple[str, ...]  # qualified through the defining file's imports (`trl.SFTConfig`)
    fields: tuple[str, ...]  # names the class body gives a value (`chat_template: str = None`)
    forwards_init: bool  # no `__init__`, or one that hands `*args, **kwargs` to the base unchanged
    item_calls: tuple[str, ...] = ()  # the calls its `__getitem__` makes, as written (`self.tokenizer`, `Image.open`)
    own_keywords: tuple[str, ...] = ()  # keyword-only parameters that such an `__init__` keeps for itself
    has_items: bool = False  # it defines `__getitem__`
    # the calls its `__getitem__` makes, qualified through the module's imports (`numpy.random.randint`)
    item_calls_qualified: tuple[str, ...] = ()


def project_class(project: ProjectFiles, qualified: str, *, beside_script: bool = False) -> ProjectClass | None:
    """The class ``qualified`` (`alignment.SFTConfig`, as the script's imports spell it) when a
    file of the project defines it; None otherwise. ``beside_script``: the module is looked for
    next to the script first, as Python does (``script_module_path``)."""
    module, _, name = qualified.rpartition(".")
    path = script_module_path(project, module) if beside_script else module_path(project, module)
    return _find(project, path, name, follow=True) if path is not None else None


def class_in_file(project: ProjectFiles, path: Path, name: str) -> ProjectClass | None:
    """The class ``name`` that the project file ``path`` defines (or re-exports from a sibling
    module), when the module was found another way (the linker's, for a folder the project puts
    on ``PYTHONPATH``)."""
    return _find(project, path, name, follow=True) if project.inside(path) else None


def object_field(project: ProjectFiles, qualified: str, field: str) -> object | None:
    """The literal a field has on a settings object another file of the project makes at module
    level from a class of its own, with no arguments (`from utils.config import opt`, where
    utils/config.py says `class Config: num_workers = 8` and `opt = Config()`): 8. None when the
    file, the object or a literal value for the field is not found, or the file sets the field
    at module level itself."""
    module, _, name = qualified.rpartition(".")
    path = module_path(project, module)
    tree = _parse(project, path) if path is not None else None
    if tree is None:
        return None
    classes = {statement.name: statement for statement in tree.body if isinstance(statement, ast.ClassDef)}
    made = [statement.value for statement in tree.body if isinstance(statement, ast.Assign)
            and any(isinstance(target, ast.Name) and target.id == name for target in statement.targets)]
    if len(made) != 1 or not isinstance(made[0], ast.Call) or made[0].args or made[0].keywords \
            or not isinstance(made[0].func, ast.Name) or made[0].func.id not in classes:
        return None
    values = [statement.value for statement in classes[made[0].func.id].body if isinstance(statement, (ast.Assign, ast.AnnAssign))
              and any(isinstance(target, ast.Name) and target.id == field
                      for target in (statement.targets if isinstance(statement, ast.Assign) else [statement.target]))]
    if len(values) != 1 or not isinstance(values[0], ast.Constant) or any(
            isinstance(node, (ast.Assign, ast.AugAssign)) and any(
                isinstance(target, ast.Attribute) and target.attr == field and isinstance(target.value, ast.Name)
                and target.value.id == name for target in getattr(node, "targets", [getattr(node, "target", None)]))
            for node in tree.body):
        return None
    return values[0].value


def dataclass_field(project: ProjectFiles, qualified: str, field: str, *, plain: bool = False) -> object | None:
    """The literal default of ``field`` in a dataclass another file of the project defines
    (ChatLM's `config.fp16` of `def sft_train(config: SFTconfig)`, `SFTconfig` in config.py with
    `fp16: bool = True`): True. With ``plain``, also of a plain class's attribute that no method
    sets on the object (arcface's `class Config(object): optimizer = 'sgd'`, built as
    `opt = Config()`). None when the file, such a class or a literal default is not found."""
    module, _, name = qualified.rpartition(".")
    path = module_path(project, module) if module else None
    tree = _parse(project, path) if path is not None else None
    found = next((statement for statement in tree.body if isinstance(statement, ast.ClassDef) and statement.name == name),
                 None) if tree is not None else None
    if found is None:
        return None
    dataclass = bool({ast.unparse(decorator.func if isinstance(decorator, ast.Call) else decorator)
                      for decorator in found.decorator_list} & {"dataclass", "dataclasses.dataclass"})
    if not dataclass and (not plain or found.bases and any(ast.unparse(base) != "object" for base in found.bases)
                          or any(isinstance(node, ast.Attribute) and node.attr == field and isinstance(node.ctx, ast.Store)
                                 for node in ast.walk(found))):
        return None  # a class with bases may get the field elsewhere; a method may set it
    values = [statement.value for statement in found.body
              if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
              and statement.target.id == field
              or not dataclass and isinstance(statement, ast.Assign) and len(statement.targets) == 1
              and isinstance(statement.targets[0], ast.Name) and statement.targets[0].id == field]
    return values[0].value if len(values) == 1 and isinstance(values[0], ast.Constant) else None


def module_path(project: ProjectFiles, module: str) -> Path | None:
    """The file of the project's module `pkg.models` (`pkg/models.py` or its `__init__.py`, at
    the project's top or in the src layout), or None."""
    if not module or module.startswith("."):
        return None
    for layout in _LAYOUTS:
        base = project.top() / layout if layout else project.top()
        path = _module_file(project, base, module.split("."))
        if path is not None:
            return path
    return None


def script_module_path(project: ProjectFiles, module: str) -> Path | None:
    """``module_path``, first looked for next to the script (Python puts the script's folder on
    the path: `src/train.py` imports `my_utils.training_utils` from `src/my_utils/`)."""
    if not module or module.startswith("."):
        return None
    return _module_file(project, project.folder, module.split(".")) or module_path(project, module)


def _module_file(project: ProjectFiles, base: Path, parts: list[str]) -> Path | None:
    stem = base.joinpath(*parts)
    for candidate in (stem / "__init__.py", stem.with_suffix(".py")):
        if project.inside(candidate) and project.is_file(candidate):
            return candidate
    return None


def _find(project: ProjectFiles, path: Path, name: str, *, follow: bool) -> ProjectClass | None:
    tree = _parse(project, path)
    if tree is None:
        return None
    imports: dict[str, str] = {}
    for statement in tree.body:
        if isinstance(statement, ast.ClassDef) and statement.name == name:
            return ProjectClass(tuple(_qualified(base, imports) for base in statement.bases), _fields(statement),
                                forwards_init(statement), _item_calls(statement), own_keywords(statement),
                                _getitem(statement) is not None, _item_calls(statement, imports))
        if isinstance(statement, ast.Import):
            for alias in statement.names:
                imports[alias.asname or alias.name.split(".", 1)[0]] = alias.name if alias.asname else alias.name.split(".", 1)[0]
        elif isinstance(statement, ast.ImportFrom):
            for alias in statement.names:
                local = alias.asname or alias.name
                imports[local] = f"{statement.module or ''}.{alias.name}"
                if follow and local == name == alias.name and statement.level == 1 and statement.module:
                    found = _module_file(project, path.parent, statement.module.split("."))  # `from .configs import X`
                    return _find(project, found, name, follow=False) if found is not None else None
    return None


def forwards_init(node: ast.ClassDef) -> bool:
    """Does the class take its base's constructor arguments unchanged: no `__init__`, or
    `def __init__(self, *args, **kwargs)` that calls `super().__init__(*args, **kwargs)`? Keyword-only
    parameters between them (`*args, LFR_m=1, **kwargs`) are the class's own (``own_keywords``):
    a caller that asks for one of the base's parameters by such a name does not reach the base."""
    init = _init(node)
    if init is None:
        return True
    params = init.args
    if params.vararg is None or params.kwarg is None or len(params.args) != 1 or params.posonlyargs:
        return False
    return any(_forwards(call, params.vararg.arg, params.kwarg.arg) for call in ast.walk(init))


def own_keywords(node: ast.ClassDef) -> tuple[str, ...]:
    """The keyword-only parameters of the class's `__init__`."""
    init = _init(node)
    return tuple(param.arg for param in init.args.kwonlyargs) if init is not None else ()


def _init(node: ast.ClassDef) -> ast.FunctionDef | None:
    return next((s for s in node.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)


def _item_calls(node: ast.ClassDef, imports: dict[str, str] | None = None) -> tuple[str, ...]:
    """What `__getitem__` calls, as dotted names (`self.tokenizer`, `Image.open`; qualified
    through ``imports`` when given: `numpy.random.randint`): the work a DataLoader does for each
    sample."""
    method = _getitem(node)
    if method is None:
        return ()
    return tuple(dict.fromkeys(name for call in ast.walk(method) if isinstance(call, ast.Call)
                               and (name := _qualified(call.func, imports or {}))))


def _getitem(node: ast.ClassDef) -> ast.FunctionDef | None:
    return next((s for s in node.body if isinstance(s, ast.FunctionDef) and s.name == "__getitem__"), None)


def _forwards(node: ast.AST, star: str, double: str) -> bool:
    """`super().__init__(*args, **kwargs)` with the names of `__init__`'s own `*`/`**` parameters."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "__init__"
            and isinstance(node.func.value, ast.Call) and isinstance(node.func.value.func, ast.Name)
            and node.func.value.func.id == "super"):
        return False
    args, keywords = node.args, node.keywords
    return len(args) == 1 and isinstance(args[0], ast.Starred) and isinstance(args[0].value, ast.Name) \
        and args[0].value.id == star and len(keywords) == 1 and keywords[0].arg is None \
        and isinstance(keywords[0].value, ast.Name) and keywords[0].value.id == double


def _parse(project: ProjectFiles, path: Path) -> ast.Module | None:
    text = project.text(path)
    if text is None:
        return None
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _qualified(base: ast.expr, imports: dict[str, str]) -> str:
    parts: list[str] = []
    while isinstance(base, ast.Attribute):
        parts.append(base.attr)
        base = base.value
    if not isinstance(base, ast.Name):
        return ""
    head = imports.get(base.id, base.id)
    return ".".join([head, *reversed(parts)])


def _fields(node: ast.ClassDef) -> tuple[str, ...]:
    names = []
    for statement in node.body:
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name) and statement.value is not None:
            names.append(statement.target.id)
        elif isinstance(statement, ast.Assign):
            names.extend(target.id for target in statement.targets if isinstance(target, ast.Name))
    return tuple(names)
