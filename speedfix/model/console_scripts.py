"""The commands a project installs: console scripts that run a module of the project.

`deepspeed $(which stylegan2_deepspeed) --deepspeed_config config/stylegan2.json` (or the same
with backquotes) runs `stylegan2_deepspeed/cli.py`, because setup.py declares `'stylegan2_deepspeed =
stylegan2_deepspeed.cli:main'` among its `console_scripts`. They are read from the project's top
folder: setup.py's `entry_points` (as text, never run), setup.cfg's `[options.entry_points]`,
pyproject.toml's `[project.scripts]` and Poetry's `[tool.poetry.scripts]`. The module is looked
for below the top and its `src/` folder. Nothing is run: the files are read as text
(``ProjectFiles``).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from speedfix.model.project_files import ProjectFiles

# `name = package.module:function`: quoted in setup.py, on a line of its own in setup.cfg
_QUOTED = re.compile(r"""['"]\s*([A-Za-z0-9_][\w.-]*)\s*=\s*([A-Za-z_][\w.]*)\s*:\s*[A-Za-z_][\w.]*\s*['"]""")
_LINE = re.compile(r"^\s*([A-Za-z0-9_][\w.-]*)\s*=\s*([A-Za-z_][\w.]*)\s*:\s*[A-Za-z_][\w.]*\s*$")
_SOURCE_FOLDERS = ("", "src")


def console_scripts(project: ProjectFiles) -> dict[str, Path]:
    """The project's console scripts that run a module of the project: name -> its file."""
    return project.recorded(("console scripts", project.top()), lambda: _console_scripts(project))


def _console_scripts(project: ProjectFiles) -> dict[str, Path]:
    top = project.top()
    declared: dict[str, str] = {}
    text = project.quiet_text(top / "setup.py")
    if text is not None and "console_scripts" in text:  # up to the list's closing bracket
        declared.update(_QUOTED.findall(text.split("console_scripts", 1)[1].split("]", 1)[0]))
    text = project.quiet_text(top / "setup.cfg")
    if text is not None and "console_scripts" in text:  # its indented lines
        declared.update(_cfg_entries(text.split("console_scripts", 1)[1].splitlines()[1:]))
    text = project.quiet_text(top / "pyproject.toml")
    if text is not None and "scripts" in text:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            data = {}
        for table in (data.get("project"), (data.get("tool") or {}).get("poetry")):
            scripts = table.get("scripts") if isinstance(table, dict) else None
            if isinstance(scripts, dict):
                declared.update((str(name), str(target).partition(":")[0].strip())
                                for name, target in scripts.items() if isinstance(target, str))
    found: dict[str, Path] = {}
    for name, module in declared.items():
        parts = module.split(".")
        for folder in _SOURCE_FOLDERS:
            base = top / folder if folder else top
            path = next((candidate for candidate in (base.joinpath(*parts).with_suffix(".py"),
                                                     base.joinpath(*parts, "__init__.py"))
                         if project.is_file(candidate)), None)
            if path is not None:
                found[name] = path
                break
    return found


def _cfg_entries(lines: list[str]) -> dict[str, str]:
    """The `name = module:function` lines of a setup.cfg key's value: its indented lines."""
    entries: dict[str, str] = {}
    for line in lines:
        if line.strip() and not line[0].isspace():
            break
        match = _LINE.match(line)
        if match is not None:
            entries[match.group(1)] = match.group(2)
    return entries
