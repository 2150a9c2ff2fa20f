"""Each finding's own fix as text edits and a diff, in time proportional to what the fix changes.

JSON, SARIF and Markdown reports show every fixable finding's fix on its own. Applying each fix
to the whole module and diffing the whole file cost (findings x file size): 138 s for a 40 KB
generated module with 350 findings. Here a fix is applied by a transformer that descends only
into the ancestors of the nodes the fix changes, only the top-level statements it replaced are
generated again, and only their lines are diffed, with the file's own lines as context. The
import a fix adds is the same for every finding that asks for it, so it is computed once per
import, on the whole module.

Whenever the shortcut cannot vouch for its result (a fix that adds or removes top-level
statements, a statement whose generated code is not exactly its original lines, two changes
close enough to share diff context), the caller falls back to the whole-module preview.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass
from typing import Sequence

import libcst as cst

from speedfix.engine.findings import AddImport, Applicability, Edit, Fix, FixOp, RemoveImportIfUnused
from speedfix.fixes.fixer import apply_fixes, op_node
from speedfix.syntax.positions import statement_start_lines
from speedfix.syntax.source import split_lines
from speedfix.syntax.walk import child_nodes

CONTEXT = 3  # lines of context around each change, as `diff -u`
_HUNK = re.compile(r"^@@ -(\d+)(,\d+)? \+(\d+)(,\d+)? @@")


@dataclass(frozen=True)
class Change:
    """Lines ``start`` (0-based) to ``start + len(old)`` of the file become ``new``."""

    start: int
    old: tuple[str, ...]
    new: tuple[str, ...]

    def edits(self) -> list[Edit]:
        """Whole-line edits (1-based lines, end exclusive), as few lines as possible."""
        matcher = difflib.SequenceMatcher(a=self.old, b=self.new, autojunk=False)
        return [
            Edit(line=self.start + i1 + 1, column=1, end_line=self.start + i2 + 1, end_column=1, content="".join(self.new[j1:j2]))
            for tag, i1, i2, j1, j2 in matcher.get_opcodes()
            if tag != "equal"
        ]

    def hunks(self, lines: Sequence[str], shift: int = 0) -> list[str]:
        """The unified diff's hunks for this change, numbered as lines of the whole file
        (``shift``: how many lines the changes before this one added)."""
        first = max(0, self.start - CONTEXT)
        after = self.start + len(self.old)
        before, following = list(lines[first : self.start]), list(lines[after : after + CONTEXT])
        diff = difflib.unified_diff([*before, *self.old, *following], [*before, *self.new, *following], n=CONTEXT)
        return [_renumber(line, first, first + shift) for line in list(diff)[2:]]  # no ---/+++ header

    def window(self) -> tuple[int, int]:
        return self.start - CONTEXT, self.start + len(self.old) + CONTEXT


NO_CHANGE = Change(0, (), ())


def _renumber(line: str, old_offset: int, new_offset: int) -> str:
    """A hunk header of a diff of a slice, renumbered for the whole file."""
    match = _HUNK.match(line)
    if match is None:
        return line
    old, old_len, new, new_len = match.groups()
    return f"@@ -{int(old) + old_offset}{old_len or ''} +{int(new) + new_offset}{new_len or ''} @@" + line[match.end():]


class Previewer:
    """Previews of single fixes on one analysed module (see the module docstring)."""

    def __init__(self, module: cst.Module, text: str, fixes: Sequence[Fix]) -> None:
        self.module = module
        self.lines = tuple(split_lines(text))
        self.starts = statement_start_lines(module, text)
        targets = {id(node) for fix in fixes for node in map(op_node, fix.ops) if node is not None}
        self.paths = _paths(module, targets) if self.starts is not None else {}
        self._imports: dict[tuple[FixOp, ...], Change | None] = {}

    def changes(self, fix: Fix) -> list[Change] | None:
        """The changes ``fix`` makes, in file order; None when only the whole-module preview
        can tell."""
        if self.starts is None or any(isinstance(op, RemoveImportIfUnused) for op in fix.ops):
            return None  # whether an import is still used depends on the whole fixed module
        imports = tuple(op for op in fix.ops if isinstance(op, AddImport))
        local = self._local(dataclasses.replace(fix, ops=tuple(op for op in fix.ops if not isinstance(op, AddImport))))
        if local is None:
            return None
        found = [change for change in (self._import(imports) if imports else None, local) if change and change != NO_CHANGE]
        if len(found) == 2 and _overlap(*found):
            return None
        return sorted(found, key=lambda change: change.start)

    def _import(self, imports: tuple[FixOp, ...]) -> Change | None:
        """The lines that adding ``imports`` changes (computed once per set of imports)."""
        if imports not in self._imports:
            fixed = apply_fixes(self.module, [Fix("", Applicability.SAFE, imports)]).code
            self._imports[imports] = _whole_file_change(self.lines, tuple(split_lines(fixed)))
        return self._imports[imports]

    def _local(self, fix: Fix) -> Change | None:
        if not fix.ops:
            return NO_CHANGE
        only: set[int] = set()
        for op in fix.ops:
            path = self.paths.get(id(op_node(op)))
            if path is None:
                return None
            only |= path
        module, fixed = self.module, apply_fixes(self.module, [fix], only=only)
        # (Tuples of the same nodes compare equal: nodes compare by identity.)
        if len(fixed.body) != len(module.body) or fixed.header != module.header or fixed.footer != module.footer:
            return None
        changed = [i for i, (old, new) in enumerate(zip(module.body, fixed.body)) if old is not new]
        if not changed:
            return NO_CHANGE
        new_lines: list[str] = []
        for index in range(changed[0], changed[-1] + 1):
            original = self._statement(index)
            if original is None:
                return None
            if fixed.body[index] is module.body[index]:
                new_lines.extend(original)
                continue
            if "".join(original) != module.code_for_node(module.body[index]):
                return None  # libcst does not render this statement as its lines: no shortcut
            new_lines.extend(split_lines(module.code_for_node(fixed.body[index])))
        start = self.starts[changed[0]] - 1  # type: ignore[index]
        end = start + sum(len(self._statement(i) or ()) for i in range(changed[0], changed[-1] + 1))
        return Change(start, self.lines[start:end], tuple(new_lines))

    def _statement(self, index: int) -> tuple[str, ...] | None:
        """The original lines of module-level statement ``index`` (leading lines included)."""
        assert self.starts is not None
        start = self.starts[index] - 1
        if index + 1 < len(self.starts):
            end = self.starts[index + 1] - 1
        else:
            end = len(self.lines) - len(self.module.footer)
        return self.lines[start:end] if 0 <= start <= end <= len(self.lines) else None


def _paths(module: cst.Module, targets: set[int]) -> dict[int, frozenset[int]]:
    """For each target node: the ids of it and of all its ancestors (one walk of the module)."""
    found: dict[int, frozenset[int]] = {}
    path: list[int] = []
    todo: list[tuple[cst.CSTNode, bool]] = [(module, False)]
    while todo and len(found) < len(targets):
        node, leaving = todo.pop()
        if leaving:
            path.pop()
            continue
        path.append(id(node))
        if id(node) in targets:
            found[id(node)] = frozenset(path)
        todo.append((node, True))
        todo.extend((child, False) for child in reversed(list(child_nodes(node))))
    return found


def _whole_file_change(old: tuple[str, ...], new: tuple[str, ...]) -> Change | None:
    """The smallest single stretch of lines that differs between ``old`` and ``new``."""
    if old == new:
        return None
    head = 0
    while head < min(len(old), len(new)) and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < min(len(old), len(new)) - head and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    return Change(head, old[head : len(old) - tail], new[head : len(new) - tail])


def _overlap(a: Change, b: Change) -> bool:
    (a_start, a_end), (b_start, b_end) = a.window(), b.window()
    return a_start <= b_end and b_start <= a_end


def apply_changes(lines: Sequence[str], changes: Sequence[Change]) -> str:
    """The whole fixed text (for notebooks, whose diff is per cell)."""
    result: list[str] = []
    position = 0
    for change in changes:
        result.extend(lines[position : change.start])
        result.extend(change.new)
        position = change.start + len(change.old)
    result.extend(lines[position:])
    return "".join(result)


def diff(lines: Sequence[str], changes: Sequence[Change], labels: tuple[str, str]) -> str:
    """A unified diff of the whole file for ``changes`` (they do not share context lines)."""
    hunks: list[str] = []
    shift = 0
    for change in changes:
        hunks.extend(change.hunks(lines, shift))
        shift += len(change.new) - len(change.old)
    return "".join([f"--- {labels[0]}\n", f"+++ {labels[1]}\n", *hunks]) if hunks else ""
