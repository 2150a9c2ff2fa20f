"""Line/column positions for the few nodes that are reported.

libcst's ``PositionProvider`` records a range for every node (measured: twice the parse time).
A scan only needs positions of reported nodes, so this runs the same code generation but keeps
ranges only for the nodes asked for (and the child nodes their syntactic ranges borrow from).
"""

from __future__ import annotations

import re
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Optional

import libcst as cst
from libcst._nodes.internal import CodegenState
from libcst._position import CodePosition, CodeRange

from speedfix.syntax.parsing import statement_first_lines
from speedfix.syntax.pyast import first_line, python_ast

_NEWLINE = re.compile(r"\r\n?|\n")
_NOTHING = nullcontext()


class _AllFound(Exception):
    """Stops code generation once every wanted node has its range."""


@dataclass(frozen=False)
class _SparsePositionState(CodegenState):
    wanted: set[cst.CSTNode] = field(default_factory=set)
    found: dict[cst.CSTNode, CodeRange] = field(default_factory=dict)
    # the ids of the wanted nodes: asked for every generated node, and a node's own hash is a
    # Python call
    wanted_ids: set[int] = field(default_factory=set)
    starts: dict[cst.CSTNode, CodePosition] = field(default_factory=dict)
    line: int = 1
    column: int = 0

    def add_indent_tokens(self) -> None:
        for token in self.indent_tokens:
            self.add_token(token)

    def add_token(self, value: str) -> None:
        # No token list is kept: only the position matters.
        if "\n" not in value and "\r" not in value:
            self.column += len(value)
            return
        segments = _NEWLINE.split(value)
        self.line += len(segments) - 1
        self.column = len(segments[-1])

    def before_codegen(self, node: cst.CSTNode) -> None:
        if id(node) in self.wanted_ids:
            self.starts[node] = CodePosition(self.line, self.column)

    def after_codegen(self, node: cst.CSTNode) -> None:
        # Nodes without a syntactic range (whitespace, lines) get the inclusive one, as in libcst.
        if id(node) in self.wanted_ids and node not in self.found:
            self.found[node] = CodeRange(self.starts[node], CodePosition(self.line, self.column))
            self._check_done()

    def record_syntactic_position(  # type: ignore[override]
        self,
        node: cst.CSTNode,
        *,
        start_node: Optional[cst.CSTNode] = None,
        end_node: Optional[cst.CSTNode] = None,
    ):
        if id(node) not in self.wanted_ids:
            return _NOTHING  # the common case: no generator object per node
        return self._record(node, start_node, end_node)

    @contextmanager
    def _record(
        self, node: cst.CSTNode, start_node: Optional[cst.CSTNode], end_node: Optional[cst.CSTNode]
    ) -> Iterator[None]:
        # Children that define this node's bounds must be recorded as they are generated.
        for borrowed in (start_node, end_node):
            if borrowed is not None:
                self.wanted.add(borrowed)
                self.wanted_ids.add(id(borrowed))
        start = CodePosition(self.line, self.column)
        try:
            yield
        finally:
            end = CodePosition(self.line, self.column)
            if start_node is not None and start_node in self.found:
                start = self.found[start_node].start
            if end_node is not None and end_node in self.found:
                end = self.found[end_node].end
            self.found[node] = CodeRange(start, end)
            self._check_done()

    def _check_done(self) -> None:
        if len(self.found) >= len(self.wanted) and self.wanted.issubset(self.found):
            raise _AllFound


def positions_for(
    module: cst.Module,
    nodes: Iterable[cst.CSTNode],
    *,
    text: str | None = None,
    top_of: dict[int, int] | None = None,
) -> dict[cst.CSTNode, CodeRange]:
    """Syntactic ranges (as libcst's PositionProvider gives them) of ``nodes`` in ``module``.

    Given the source ``text`` and ``top_of`` (a node's id -> index of its module-level
    statement, from the walk), only the statements holding wanted nodes are generated, each starting at the line
    Python's own parser gives for it; otherwise the module is generated up to the last node.
    """
    wanted = set(nodes)
    if not wanted:
        return {}
    if text is not None and top_of is not None:
        starts = _statement_lines(module, text)
        # Grouped in one pass: filtering all wanted nodes per statement was quadratic.
        by_statement: dict[int, set[cst.CSTNode]] = {}
        for node in wanted:
            by_statement.setdefault(top_of.get(id(node), -1), set()).add(node)
        if starts is not None and -1 not in by_statement:
            found: dict[cst.CSTNode, CodeRange] = {}
            for index in sorted(by_statement):
                state = _state(module, by_statement[index], line=starts[index])
                try:
                    module.body[index]._codegen(state)
                except _AllFound:
                    pass
                found.update(state.found)
            return found
    state = _state(module, wanted, line=1)
    try:
        module._codegen(state)
    except _AllFound:
        pass
    return state.found


def _state(module: cst.Module, wanted: set[cst.CSTNode], line: int) -> _SparsePositionState:
    return _SparsePositionState(
        default_indent=module.default_indent, default_newline=module.default_newline, wanted=wanted, line=line,
        wanted_ids={id(node) for node in wanted}
    )


def statement_start_lines(module: cst.Module, text: str) -> list[int] | None:
    """The 1-based line where each module-level statement starts, its leading comments and
    blank lines included; None when it cannot be known cheaply."""
    return _statement_lines(module, text)


def statement_texts(module: cst.Module, text: str) -> list[str] | None:
    """The source text of each module-level statement, its leading comments and blank lines
    included: what printing the statement gives, cut from ``text`` without printing it; None
    when the start lines cannot be known cheaply."""
    starts = _statement_lines(module, text)
    if starts is None:
        return None
    offsets = [0, *(match.end() for match in _NEWLINE.finditer(text))]  # where each line starts
    lines = len(offsets) - (offsets[-1] == len(text))  # the last offset is past a final newline
    ends = [*starts[1:], lines + 1 - len(module.footer)]  # trailing comments belong to the module
    return [text[offsets[start - 1]:offsets[end - 1] if end - 1 < len(offsets) else len(text)]
            for start, end in zip(starts, ends)]


def _statement_lines(module: cst.Module, text: str) -> list[int] | None:
    """The first line of each module-level statement, its leading comments and blank lines
    included, from Python's parser (fast, in C); None when it disagrees with libcst's tree."""
    firsts = statement_first_lines(text)  # recorded by the parse, which ran ast already
    if firsts is None:
        try:
            body = python_ast(text).body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        firsts = [first_line(node) for node in body]
    starts: list[int] = []
    position = 0
    for statement in module.body:
        if position >= len(firsts):
            return None
        first = firsts[position]
        position += len(statement.body) if isinstance(statement, cst.SimpleStatementLine) else 1
        starts.append(first - len(statement.leading_lines))
    return starts if position == len(firsts) else None
