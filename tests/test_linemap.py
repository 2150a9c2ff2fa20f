"""Positions in fixed code mapped back to the code on disk (for `apply --diff`)."""

from __future__ import annotations

from speedfix.fixes.linemap import LineMap

ORIGINAL = "a = 1\nx = f(y).item()\nb = 2\n"


def test_untouched_lines_move_by_the_lines_a_fix_added_above_them():
    fixed = "import os\n\n" + ORIGINAL
    lines = LineMap(fixed, ORIGINAL)
    assert lines.position(4, 5) == (2, 5)
    assert lines.position(5, 1) == (3, 1)
    assert lines.position(1, 3) == (1, 1)  # an added line: where it was inserted


def test_a_changed_line_keeps_the_column_of_the_text_it_kept():
    fixed = "a = 1\nx = f(y, z=True).item()\nb = 2\n"
    lines = LineMap(fixed, ORIGINAL)
    assert lines.position(2, fixed.splitlines()[1].index(".item") + 1) == (2, ORIGINAL.splitlines()[1].index(".item") + 1)
    assert lines.position(2, 1) == (2, 1)
    assert lines.position(2, 11) == (2, 8)  # inside the inserted text: where it was inserted
    assert lines.position(2, len(fixed.splitlines()[1]) + 1) == (2, len(ORIGINAL.splitlines()[1]) + 1)  # end of line


def test_a_call_wrapped_over_lines_keeps_the_column_of_its_first_line():
    original = "a = 1\nloader = DataLoader(data, batch_size=8)\nb = 2\n"
    fixed = "a = 1\nloader = DataLoader(\n    data,\n    batch_size=8,\n    pin_memory=True,\n)\nb = 2\n"
    lines = LineMap(fixed, original)
    assert lines.position(2, 10) == (2, 10)  # the call still starts where it did
    assert lines.position(4, 5) == (2, 1)  # a line the fix added: the start of what it replaced
    assert lines.position(7, 1) == (3, 1)
