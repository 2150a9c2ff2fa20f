"""Functions of a script that nothing runs: code a run of the project never reaches.

A training script accumulates helpers its run stopped calling (MedicalGPT's
`check_and_optimize_memory()`, defined in `supervised_finetuning.py` and called nowhere). Advice
about such a function changes nothing the run does. A top-level function is taken for unused only
when every sign of a use is absent:

- the file is an entry script (it has an `if __name__ == "__main__":` block), so no other code is
  expected to import it;
- the function has no decorator (one may register it: `@app.command`, `@hydra.main`);
- its name occurs nowhere else in the file's text: not in a call, a callback (`Thread(target=f)`),
  a string (`getattr(module, "f")`, `__all__`), nor even a comment;
- nor in any other Python file, notebook, configuration, launch script or Markdown file of the
  project (below its top folder), which could import it, name it (hydra's `_target_: train.f`) or
  run it (`python -c "from train import f; f()"`); a project too large to read that way, or with
  a file too large to read, keeps all its functions;
- the file hands no command line to its functions by name (`fire.Fire()`).

Nothing is run and nothing is parsed again: the files are read as text (``ProjectFiles``), and
they are recorded as the file's inputs, so an edit that starts calling the function elsewhere
brings its findings back.
"""

from __future__ import annotations

import re
from pathlib import Path
from weakref import WeakKeyDictionary

import libcst as cst

from speedfix.model.context import FileContext
from speedfix.syntax.nodes import code_of, is_main_guard

# Other files read to look for a use; a larger project keeps all its functions.
PROJECT_FILES_LIMIT = 400
_SUFFIXES = (".py", ".ipynb", ".yaml", ".yml", ".json", ".toml", ".cfg", ".sh", ".md")
_FOUND: WeakKeyDictionary[FileContext, dict[int, str]] = WeakKeyDictionary()


def unused_functions(ctx: FileContext) -> dict[int, str]:
    """Index of a top-level statement -> the name of the function it defines, for the functions
    of this entry script that nothing uses (see the module docstring)."""
    found = _FOUND.get(ctx)
    if found is None:
        found = _FOUND[ctx] = _unused(ctx)
    return found


def _unused(ctx: FileContext) -> dict[int, str]:
    body = ctx.module.body
    if ctx.project is None or not any(isinstance(s, cst.If) and is_main_guard(s.test) for s in body):
        return {}
    candidates = {index: statement for index, statement in enumerate(body)
                  if isinstance(statement, cst.FunctionDef) and not statement.decorators}
    if not candidates:
        return {}
    script = ctx.project.script
    text = ctx.project.text(script)
    if text is None or "Fire(" in text:
        return {}
    unused = {index: function.name.value for index, function in candidates.items()
              if len(_mentions(function.name.value, text)) == len(_mentions(function.name.value, code_of(function)))}
    if not unused:
        return {}
    others = _other_files(ctx, script)
    if others is None:
        return {}
    for path in others:
        other = ctx.project.text(path)
        if other is None:
            return {}  # unreadable: it might use them
        unused = {index: name for index, name in unused.items() if not _mentions(name, other)}
        if not unused:
            break
    return unused


def _mentions(name: str, text: str) -> list[str]:
    return re.findall(rf"\b{re.escape(name)}\b", text)


def _other_files(ctx: FileContext, script: Path) -> list[Path] | None:
    """The project's other files that could name a function, or None when there are more than the limit."""
    project = ctx.project
    assert project is not None
    found: list[Path] = []
    folders = [project.top()]
    while folders:
        folder = folders.pop()
        found.extend(path for path in project.listing(folder, _SUFFIXES) if path != script)
        if len(found) > PROJECT_FILES_LIMIT:
            return None
        folders.extend(project.subfolders(folder))
    return found
