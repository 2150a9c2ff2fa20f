"""Bytes that libcst does not give back, put back.

``libcst.parse_module(data).bytes`` is ``data`` for almost every file, but not all: libcst drops a
form feed at the start of a statement's line and the final ``\\r`` of a file whose line endings
are a lone CR. A fix would then silently change lines it never touched. So the fixer compares
the round trip with the file: where they differ line for line (the same number of lines in a
changed stretch), the original of each such line is remembered, and after fixing, every line of
the result that is still exactly libcst's rendering of an original line is replaced by that
original line. A file where that does not restore every byte of the unfixed round trip (lines
that libcst adds or drops) is refused: it is reported and left unfixed.
"""

from __future__ import annotations

import difflib
import re

from speedfix.syntax.source import LINE

_LINE = re.compile(LINE.pattern.encode())  # the same lines, in bytes


class RoundTripError(Exception):
    """libcst cannot reproduce the file byte for byte, in a way that cannot be repaired."""


def lines(data: bytes) -> list[bytes]:
    """``data`` split after each line ending (``\\r\\n``, ``\\r`` or ``\\n``), endings kept."""
    return _LINE.findall(data)


class Restorer:
    """Maps libcst's rendering of a file's lines back to the file's own bytes."""

    def __init__(self, original: bytes, roundtrip: bytes) -> None:
        self.identity = original == roundtrip
        self._rendered: list[bytes] = []
        self._originals: dict[int, bytes] = {}  # index in the round trip -> original line
        if self.identity:
            return
        before, after = lines(original), lines(roundtrip)
        self._rendered = after
        matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag == "equal":
                continue
            if tag != "replace" or i2 - i1 != j2 - j1:
                where = f"line {i1 + 1}" if i2 - i1 <= 1 else f"lines {i1 + 1}-{i2}"
                raise RoundTripError(f"libcst does not reproduce {where} of the file byte for byte")
            for offset in range(i2 - i1):
                self._originals[j1 + offset] = before[i1 + offset]
        if self.restore(roundtrip) != original:
            raise RoundTripError("libcst does not reproduce the file byte for byte")

    def restore(self, fixed: bytes) -> bytes:
        """``fixed`` with each line that libcst rendered from an original line, and that no fix
        changed, replaced by the original line."""
        if self.identity:
            return fixed
        result = lines(fixed)
        matcher = difflib.SequenceMatcher(a=self._rendered, b=result, autojunk=False)
        for tag, i1, i2, j1, _ in matcher.get_opcodes():
            if tag != "equal":
                continue
            for offset in range(i2 - i1):
                original = self._originals.get(i1 + offset)
                if original is not None:
                    result[j1 + offset] = original
        return b"".join(result)
