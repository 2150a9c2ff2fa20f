"""Map positions in fixed code back to the code it was made from.

`speedfix apply --diff` (and `scan --diff`) analyse the fixed code to say what is left, but write
nothing, so the positions they print must be those of the file on disk. A line the fixes did not
touch maps by its offset; a line they changed maps to its counterpart in a block of as many
lines, column by column; a line they added maps to the first line of the block it replaced.
"""

from __future__ import annotations

import difflib
from bisect import bisect_right
from typing import Iterable

from speedfix.engine.findings import Finding


class LineMap:
    """1-based (line, column) in ``fixed`` -> 1-based (line, column) in ``original``."""

    def __init__(self, fixed: str, original: str) -> None:
        self._new = fixed.splitlines()
        self._old = original.splitlines()
        # One (j1, j2, i1, i2, same) per opcode, in order of the fixed lines.
        matcher = difflib.SequenceMatcher(a=self._old, b=self._new, autojunk=False)
        self._blocks = [(j1, j2, i1, i2, tag == "equal") for tag, i1, i2, j1, j2 in matcher.get_opcodes()]
        self._starts = [block[0] for block in self._blocks]

    def position(self, line: int, column: int) -> tuple[int, int]:
        index = bisect_right(self._starts, line - 1) - 1
        if index < 0:
            return line, column
        j1, j2, i1, i2, same = self._blocks[index]
        if line - 1 >= j2:  # past the end of the fixed text
            return len(self._old) + (line - len(self._new)), column
        offset = line - 1 - j1
        if same:
            return i1 + offset + 1, column
        if j2 - j1 == i2 - i1:  # a changed line with a counterpart: map the column inside it
            return i1 + offset + 1, _column(self._new[line - 1], self._old[i1 + offset], column)
        return min(i1, max(len(self._old) - 1, 0)) + 1, 1

    def remap(self, findings: Iterable[Finding]) -> None:
        """Move ``findings`` (positions in the fixed code) to the original's positions."""
        for finding in findings:
            if finding.file is not None:
                continue  # a line of a configuration file, not of this code
            finding.line, finding.column = self.position(finding.line, finding.column)
            finding.end_line, finding.end_column = self.position(finding.end_line, finding.end_column)


def _column(new_line: str, old_line: str, column: int) -> int:
    """A 1-based column of ``new_line`` in ``old_line``: kept text keeps its column; a column in
    inserted or replaced text goes to the start of what it replaced."""
    matcher = difflib.SequenceMatcher(a=old_line, b=new_line, autojunk=False)
    for tag, i1, _i2, j1, j2 in matcher.get_opcodes():
        if j1 <= column - 1 < j2:
            return i1 + (column - 1 - j1) + 1 if tag == "equal" else i1 + 1
    return len(old_line) + 1 + (column - 1 - len(new_line))
