"""``# noqa`` comments.

- ``# noqa`` on the reported line suppresses every finding there; ``# noqa: SF101, SF104``
  only those codes (codes of other tools, e.g. ``# noqa: E501``, suppress nothing of ours);
- ``# speedfix: noqa`` on a line of its own skips the whole file; ``# speedfix: noqa: SF101``
  suppresses those codes in the whole file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_CODE_LIST = r"(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*)"
_LINE_NOQA = re.compile(r"#\s*noqa(?::\s*" + _CODE_LIST + r")?", re.IGNORECASE)
_FILE_NOQA = re.compile(r"^[ \t]*#\s*speedfix:\s*noqa(?::\s*" + _CODE_LIST + r")?[ \t]*$", re.IGNORECASE | re.MULTILINE)

ALL = frozenset({"*"})


def _codes(text: str | None) -> frozenset[str]:
    if not text:
        return ALL
    return frozenset(code.upper() for code in re.split(r"[\s,]+", text.strip()) if code)


@dataclass(frozen=True)
class FileSuppressions:
    codes: frozenset[str]  # ALL, specific codes, or empty

    @classmethod
    def parse(cls, text: str) -> FileSuppressions:
        codes: set[str] = set()
        for match in _FILE_NOQA.finditer(text):
            codes |= _codes(match.group("codes"))
        return cls(frozenset(codes))

    @property
    def skips_file(self) -> bool:
        return "*" in self.codes

    def suppresses(self, code: str) -> bool:
        return "*" in self.codes or code in self.codes


def line_suppresses(line: str, code: str) -> bool:
    """Does a ``# noqa`` comment on ``line`` cover ``code``?"""
    if "#" not in line:
        return False
    for match in _LINE_NOQA.finditer(line):
        codes = _codes(match.group("codes"))
        if codes is ALL or code in codes:
            return True
    return False
