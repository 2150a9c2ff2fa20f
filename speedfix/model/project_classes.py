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


def project_class(project: ProjectFiles, qualified: str) -> ProjectClass | None:
    """The class ``qualified`` (`alignment.SFTConfig`, as the script's imports spell it) when a
    file of the project defines it; None otherwise."""
    module, _, name = qualified.rpartition(".")
    path = module_path(project, module)
    return _find(project, path, name, follow=True) if path is not None else None


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
            return ProjectClass(tuple(_qualified(base, imports) for base in statement.bases), _fields(statement))
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
