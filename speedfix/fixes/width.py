"""Lines a fix writes stay at a sane width, laid out as black would.

A fix that adds an argument (`pin_memory=True` after the author's 110 characters), rewrites a
call (`torch.as_tensor(obs, dtype=torch.float32, device=device)`) or indents a statement under
a new `with` can push a line past ``MAX_WIDTH``. Such a line, one the original code did not have,
gets its longest call that sits on it alone laid out one argument per line; lines the author
wrote long stay as they are.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from speedfix.fixes.codegen import explode

MAX_WIDTH = 120
_ROUNDS = 4  # one call per long line and round; a line holding several long calls takes a few


def wrap_long_lines(before: cst.Module, after: cst.Module) -> cst.Module:
    """``after`` with the calls on its new over-long lines exploded."""
    original: frozenset[str] | None = None
    for _ in range(_ROUNDS):
        lines = after.code.splitlines()
        long = {number for number, line in enumerate(lines, 1) if len(line) > MAX_WIDTH}
        if long and original is None:
            original = frozenset(before.code.splitlines())
        long = {number for number in long if lines[number - 1] not in (original or ())}
        targets = _longest_calls(after, long) if long else set()
        if not targets:
            return after
        after = after.visit(_Exploder(targets, after.default_indent))
    return after


def _longest_calls(module: cst.Module, lines: set[int]) -> set[int]:
    """Per long line, the call with arguments (or the bare tuple of values of an assignment,
    `x, y = x.to(...), y.to(...)`) that spans the most of it without leaving it."""
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    positions = wrapper.resolve(PositionProvider)
    values = _AssignedTuples()
    wrapper.module.visit(values)
    best: dict[int, tuple[int, cst.CSTNode]] = {}
    for node, where in positions.items():
        splittable = (isinstance(node, cst.Call) and node.args) or id(node) in values.found
        if not splittable or where.start.line != where.end.line:
            continue
        line = where.start.line
        span = where.end.column - where.start.column
        if line in lines and (line not in best or span > best[line][0]):
            best[line] = (span, node)
    return {id(node) for _, node in best.values()}


class _AssignedTuples(cst.CSTVisitor):
    """The bare tuples assigned by `a, b = f(x), g(y)` (not the targets)."""

    def __init__(self) -> None:
        self.found: set[int] = set()

    def visit_Assign(self, node: cst.Assign) -> None:
        if isinstance(node.value, cst.Tuple) and not node.value.lpar and len(node.value.elements) > 1:
            self.found.add(id(node.value))


def _newline(extra: str) -> cst.ParenthesizedWhitespace:
    return cst.ParenthesizedWhitespace(indent=True, last_line=cst.SimpleWhitespace(extra))


class _Exploder(cst.CSTTransformer):
    def __init__(self, targets: set[int], indent: str) -> None:
        self.targets = targets
        self.indent = indent

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if id(original_node) not in self.targets:
            return updated_node
        return explode(updated_node, self.indent)

    def leave_Tuple(self, original_node: cst.Tuple, updated_node: cst.Tuple) -> cst.BaseExpression:
        """`a, b = f(x), g(y)` -> `a, b = (` one value per line `)`."""
        if id(original_node) not in self.targets:
            return updated_node
        last = len(updated_node.elements) - 1
        elements = [
            element.with_changes(comma=cst.Comma(whitespace_after=_newline("" if i == last else self.indent)))
            for i, element in enumerate(updated_node.elements)
        ]
        return updated_node.with_changes(
            elements=elements,
            lpar=[cst.LeftParen(whitespace_after=_newline(self.indent))],
            rpar=[cst.RightParen()],
        )

    def visit_FormattedString(self, node: cst.FormattedString) -> bool:
        return False  # a call inside an f-string cannot span lines before Python 3.12
