"""Functions of a script that nothing runs: code a run of the project never reaches.

A training script accumulates helpers its run stopped calling (MedicalGPT's
`check_and_optimize_memory()`, defined in `supervised_finetuning.py` and called nowhere). Advice
about such a function changes nothing the run does. A top-level function is taken for unused only
when every sign of a use is absent:

- the file is an entry script (it has an `if __name__ == "__main__":` block), so no other code is
  expected to import it, and not a test file (pytest collects its functions);
- the file finds no functions by themselves: no `fire.Fire()`, jsonargparse's `CLI()`, `globals()`,
  `locals()`, `vars()`, `sys.modules[__name__]`, `inspect.getmembers`, `__all__`, `exec`, `eval`;
- the function has no decorator (one may register it: `@app.command`, `@hydra.main`);
- its name occurs nowhere else in the file's text: not in a call, a callback (`Thread(target=f)`),
  a string (`getattr(module, "f")`), nor even a comment;
- nor in any other file of the project that could import, name or run it: Python files,
  notebooks, configurations (hydra's `_target_: train.f`), launch scripts and Makefiles
  (`python -c "from train import f; f()"`), Markdown, below the project's top folder. When the
  project goes on above the folders the scan may read (`cd src && speedfix scan train.py` in a
  project whose `pyproject.toml` lies above), or has more folders or files than are read here,
  every function counts as used.

A library module's functions are read the same way, but its name is likely to be an everyday
word there (FEDformer's `layers/utils.py` keeps a `train()` helper beside `model.train()` calls
everywhere): in a library module other scanned files import, a function its own file never names
again is taken for unused when no other file imports it (by name, over several lines, or by a
star), names it through the module (`utils.train`, hydra's `layers.utils.train`, `utils:train`) or
looks it up (`getattr(utils, "train")`); a notebook that mentions the name at all keeps it
(``unused_library_functions``). So are the functions only a library module's self-test block
calls (vall-e's `example_usage()`, ``self_test_functions``).

The same search decides for a library module (imports, functions, classes and constants only)
that no other scanned file names, in a scan that holds code that trains (``Links.unreferenced``):
when no other file of the project mentions its name either, no run builds its classes
(``unreferenced_module``; Time-LLM's `layers/SelfAttention_Family.py`, a layer left over from
another model).

Nothing is run and nothing is parsed again: the files are read as text (``ProjectFiles``), and
they are recorded as the file's inputs, so an edit that starts calling the function elsewhere
brings its findings back. An unreadable file (too large, not UTF-8) is passed over without a note.
A name is looked for as a plain substring first, and a function's own text is cut from its
file's, not printed again.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Callable, Iterable

import libcst as cst

from speedfix.model.context import FileContext
from speedfix.model.project_files import PROJECT_MARKERS, display_path, kept_for_scan
from speedfix.project import is_test_file
from speedfix.syntax.names import dotted_name
from speedfix.syntax.nodes import code_of, is_main_guard, walk_expression
from speedfix.syntax.positions import statement_texts

# What is read to look for a use; a larger project keeps all its functions.
FOLDERS_LIMIT = 200
FILES_LIMIT = 400
_SUFFIXES = (".py", ".ipynb", ".yaml", ".yml", ".json", ".toml", ".cfg", ".ini", ".sh", ".bash", ".slurm", ".md",
             "Makefile")
# A file that finds its functions by itself (a command line made of them, a registry, `exec`).
_DYNAMIC = re.compile(r"\b(?:Fire|CLI|auto_cli)\s*\(|\b(?:globals|locals|vars)\s*\(\s*\)|sys\.modules\s*\[\s*__name__"
                      r"|\bgetmembers\s*\(|\b__all__\b|(?<!\.)\bexec\s*\(|(?<!\.)\beval\s*\(")  # not `model.eval()`
# Where a match of ``_DYNAMIC`` may start: found by one word search (five times as fast).
_DYNAMIC_WORDS = re.compile(r"\b(?:Fire|CLI|auto_cli|globals|locals|vars|getmembers|__all__|exec|eval)\b|sys\.modules")


def _finds_its_functions(text: str) -> bool:
    """Does the file find its functions by itself (``_DYNAMIC``)?"""
    return any(_DYNAMIC.match(text, word.start()) for word in _DYNAMIC_WORDS.finditer(text))


def unused_functions(ctx: FileContext, among: Iterable[int]) -> dict[int, str]:
    """Of the top-level statements ``among`` (indexes in the module's body), those that define
    a function of this entry script that nothing uses (see the module docstring): index -> name."""
    body = ctx.module.body
    candidates = {index: body[index] for index in set(among)
                  if isinstance(body[index], cst.FunctionDef) and not body[index].decorators}
    project = ctx.project
    if not candidates or project is None or is_test_file(Path(display_path(project.script))) \
            or not any(isinstance(s, cst.If) and is_main_guard(s.test) for s in body):
        return {}
    text = project.quiet_text(project.script)
    if text is None or _finds_its_functions(text):
        return {}
    counts, own = Counter(_WORD.findall(text)), _statements(ctx, text)
    unused = {index: function.name.value for index, function in candidates.items()
              if counts[function.name.value] == _count(function.name.value, own(index))}
    return _unmentioned(ctx, unused)


def unused_library_functions(ctx: FileContext, among: Iterable[int]) -> dict[int, str]:
    """Of the top-level statements ``among``, those that define a function of a library module
    (``library_module``) that other scanned files import (``Links.importers``) while nothing uses
    the function: its own file never names it again, and no other file of the project imports it
    or names it through the module (``_used_elsewhere``; FEDformer's `layers/utils.py`, imported
    for `get_filter`, keeps a `train()` helper nothing calls): index -> name."""
    body = ctx.module.body
    candidates = {index: body[index] for index in set(among)
                  if isinstance(body[index], cst.FunctionDef) and not body[index].decorators}
    project = ctx.project
    if not candidates or project is None or not ctx.links.importers or not library_module(ctx) \
            or is_test_file(Path(display_path(project.script))):
        return {}
    return _unused_here_and_elsewhere(ctx, {index: function.name.value for index, function in candidates.items()})


def self_test_functions(ctx: FileContext, block: cst.If) -> dict[int, str]:
    """The top-level functions of the file that only its self-test ``block`` calls (vall-e's
    `example_usage()`, a toy training run of the model the file defines): the block names them,
    the rest of the file does not, and no other file of the project imports them or names them
    through the module (``_used_elsewhere``): index -> name."""
    called = {dotted_name(node.func) for node in walk_expression(block) if isinstance(node, cst.Call)}
    body = ctx.module.body
    names = {index: statement.name.value for index, statement in enumerate(body)
             if isinstance(statement, cst.FunctionDef) and not statement.decorators and statement.name.value in called}
    if not names or ctx.project is None:
        return {}
    return _unused_here_and_elsewhere(ctx, names, block)


def _unused_here_and_elsewhere(ctx: FileContext, names: dict[int, str], block: cst.If | None = None) -> dict[int, str]:
    """Of ``names`` (top-level functions by index), those its own file names only in their
    definition (and in ``block``) and that ``_used_elsewhere`` finds no use of."""
    project = ctx.project
    assert project is not None
    text = project.quiet_text(project.script)
    if text is None or _finds_its_functions(text):
        return {}
    counts, own = Counter(_WORD.findall(text)), _statements(ctx, text)
    in_block = code_of(block) if block is not None else ""
    outside = {index: name for index, name in names.items()
               if counts[name] == _count(name, own(index)) + _count(name, in_block)}
    stem = project.script.stem if project.script.stem != "__init__" else project.script.parent.name
    return _unmentioned(ctx, outside, lambda name, other, suffix: _used_elsewhere(stem, name, other, suffix))


def _used_elsewhere(stem: str, name: str, text: str, suffix: str) -> bool:
    """Does another file's ``text`` use function ``name`` of module ``stem``: import it
    (`from layers.utils import get_filter, train`, also over several lines, or `import *`),
    name it through the module (`utils.train(...)`, hydra's `_target_: layers.utils.train`,
    `utils:train` in an entry point, `model_utils.train(...)` after `import model.utils as
    model_utils`), or look it up by its name (`getattr(utils, "train")`)?
    A notebook counts any mention of the name (its cells may have imported it by a star)."""
    if suffix == ".ipynb":
        return _mentioned(name, text, suffix)
    if not _has_word(name, text):  # only a star import could bring it in
        return "*" in text and any("*" in imported for imported in _imports_from(stem, text))
    word = re.escape(name)
    if re.search(rf"\b{re.escape(stem)}\s*[.:]\s*{word}\b|getattr\s*\([^)]*[\"']{word}[\"']", text):
        return True
    if any(re.search(rf"\b{re.escape(alias)}\s*\.\s*{word}\b", text) for alias in _aliases(stem, text)):
        return True
    return any("*" in imported or _count(name, imported) for imported in _imports_from(stem, text))


def _aliases(stem: str, text: str) -> list[str]:
    """The names ``text`` binds a module named ``stem`` to (`import model.utils as model_utils`,
    `from model import utils as mu`)."""
    if stem not in text:
        return []
    return re.findall(rf"\b{re.escape(stem)}\s+as\s+(\w+)", text)


def _imports_from(stem: str, text: str) -> list[str]:
    """What ``text`` imports from a module named ``stem`` (`from layers.utils import a, b`: "a,
    b"; over several lines in parentheses; `*`), once per scan."""
    if stem not in text:
        return []
    return kept_for_scan(("imports from", stem, text), lambda: [imported.group(1) for imported in re.finditer(
        rf"\bfrom\s+[\w.]*\b{re.escape(stem)}\s+import\s+(\([^)]*\)|[^\n]*)", text)])


def unreferenced_module(ctx: FileContext) -> bool:
    """Is this file a library module that no run builds: the scan found no other scanned file
    naming it (``Links.unreferenced``), it only defines things (``library_module``), and no
    other file of the project mentions its name either (read as for functions, above: hydra's
    `_target_: layers.attention.Block`, a launch script, a README)?"""
    project = ctx.project
    return (ctx.links.unreferenced and project is not None and library_module(ctx)
            and bool(_unmentioned(ctx, {0: project.script.stem})))


def _mentioned(name: str, text: str, suffix: str) -> bool:
    """Does another file's ``text`` mention ``name`` anywhere (a notebook's or JSON file's
    escaped strings read as code)?"""
    if name not in text:
        return False
    if suffix in (".ipynb", ".json"):  # a cell's source is one JSON string: `\\nfoo` would read as `nfoo`
        text = kept_for_scan(("unescaped", text), lambda: text.replace("\\n", "\n").replace('\\"', '"'))
    return _has_word(name, text)


def _unmentioned(ctx: FileContext, names: dict[int, str],
                 used: Callable[[str, str, str], bool] = _mentioned) -> dict[int, str]:
    """Of ``names``, those that no other file of the project ``used`` (name, its text, its
    suffix) says uses them (by default: mentions them); none when the project goes on above the
    folders the scan may read, or has more folders or files than are read."""
    project = ctx.project
    if not names or project is None or _goes_on_above(ctx):
        return {}
    others = _other_files(ctx, project.script)
    if others is None:
        return {}
    for path in others:
        other = project.quiet_text(path)
        if other is None:
            if path.suffix in (".py", ".ipynb"):
                return {}  # code that could not be read might use them
            continue
        names = {index: name for index, name in names.items() if not used(name, other, path.suffix)}
        if not names:
            break
    return names


def library_module(ctx: FileContext) -> bool:
    """Does the module only define things (imports, functions, classes, constants, guarded
    imports) and run nothing when imported or run: no call or loop at its top level, no
    `if __name__ == "__main__":` block?"""
    return all(_defines_only(statement) for statement in ctx.module.body)


_DEFINITIONS = (cst.FunctionDef, cst.ClassDef)
_DEFINING = (cst.Import, cst.ImportFrom, cst.Assign, cst.AnnAssign, cst.Pass)


def _defines_only(statement: cst.CSTNode) -> bool:
    if isinstance(statement, _DEFINITIONS):
        return True
    if isinstance(statement, cst.SimpleStatementLine):
        return all(isinstance(small, _DEFINING) or isinstance(small, cst.Expr) and isinstance(
            small.value, (cst.SimpleString, cst.ConcatenatedString)) for small in statement.body)
    if isinstance(statement, cst.If):  # `if TYPE_CHECKING:`, `if sys.version_info >= ...:`
        return not is_main_guard(statement.test) and all(map(_defines_only, _blocks(statement)))
    if isinstance(statement, cst.Try):  # `try: import apex` / `except ImportError: apex = None`
        return all(map(_defines_only, _blocks(statement)))
    return False


def _blocks(statement: cst.If | cst.Try) -> list[cst.CSTNode]:
    found: list[cst.CSTNode] = list(statement.body.body)
    if isinstance(statement, cst.If):
        orelse = statement.orelse
        while isinstance(orelse, cst.If):
            found.extend(orelse.body.body)
            orelse = orelse.orelse
        if orelse is not None:
            found.extend(orelse.body.body)
    else:
        for handler in statement.handlers:
            found.extend(handler.body.body)
        for block in (statement.orelse, statement.finalbody):
            if block is not None:
                found.extend(block.body.body)
    return found


_WORD = re.compile(r"\w+")


def _count(name: str, text: str) -> int:
    """How often ``name`` (an identifier) occurs in ``text`` as a whole word: what
    `\\bname\\b` finds, since such a match is a whole run of word characters."""
    return _WORD.findall(text).count(name) if name in text else 0


def _has_word(name: str, text: str) -> bool:
    """Does ``name`` occur in ``text`` as a whole word?"""
    return name in text and re.search(rf"\b{re.escape(name)}\b", text) is not None


def _statements(ctx: FileContext, text: str) -> Callable[[int], str]:
    """The text of the module-level statement at an index, with its leading comments: sliced
    from the file's ``text`` where Python's parser agrees with libcst's tree, printed otherwise."""
    texts = statement_texts(ctx.module, text)
    return (lambda index: texts[index]) if texts is not None else (lambda index: code_of(ctx.module.body[index]))


def _goes_on_above(ctx: FileContext) -> bool:
    """Does the project reach above the folders the scan may read (no marker at its top, one
    above the outermost root)?"""
    project = ctx.project
    assert project is not None
    top = project.top()
    return not any((top / marker).exists() for marker in PROJECT_MARKERS) and project.marked_above()


def _other_files(ctx: FileContext, script: Path) -> list[Path] | None:
    """The project's other files that could name a function, or None past the limits."""
    project = ctx.project
    assert project is not None
    found: list[Path] = []
    folders, seen = [project.top()], 0
    while folders:
        folder = folders.pop()
        seen += 1
        if seen > FOLDERS_LIMIT:
            return None
        found.extend(path for path in project.listing(folder, _SUFFIXES) if path != script)
        if len(found) > FILES_LIMIT:
            return None
        folders.extend(project.subfolders(folder))
    return found
