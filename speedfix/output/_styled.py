"""The lines of the text reports: text with styles, which only a terminal shows.

A report that goes to a file or a pipe (a CI log, a pre-commit hook, an editor) is written as
its plain text, without loading rich: rich's import and rendering were a tenth of a scan whose
files are all cached. On a terminal (``color``), rich renders the styles, and lines with a tab
go through rich in any case, which expands tabs by the width of what precedes them.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from typing import IO, Iterable


@dataclass
class Line:
    """One line: segments of (text, style), and a style for the whole line ("" for none)."""

    segments: list[tuple[str, str]] = field(default_factory=list)
    style: str = ""

    def append(self, text: str, style: str = "") -> Line:
        self.segments.append((text, style))
        return self

    @property
    def plain(self) -> str:
        return "".join(text for text, _ in self.segments)


def line(text: str = "", style: str = "") -> Line:
    return Line([(text, "")], style)


# What rich leaves out of any text it prints (bell, backspace, vertical tab, form feed, carriage
# return): a plain report leaves them out too, and reads the same as through rich.
_DROPPED = dict.fromkeys((7, 8, 11, 12, 13))


def render(lines: Iterable[Line | str], *, color: bool, width: int) -> str:
    """The lines as a report prints them (each ends with a newline)."""
    shown = [item if isinstance(item, Line) else line(item) for item in lines]
    if not color and not any("\t" in item.plain for item in shown):
        return "".join(item.plain.translate(_DROPPED) + "\n" for item in shown)
    from rich.console import Console
    from rich.text import Text

    buffer = io.StringIO()
    console = Console(
        file=buffer, force_terminal=color, no_color=not color, width=width,
        highlight=False, soft_wrap=True, emoji=False, markup=False,
    )
    for item in shown:
        text = Text(style=item.style)
        for part, style in item.segments:
            text.append(part, style=style or None)
        console.print(text)
    return buffer.getvalue()


def surely_not_a_terminal(stream: IO[str]) -> bool:
    """True when rich would certainly not take ``stream`` for a terminal (so styles and a
    progress bar are off without asking rich): it is no TTY and no environment variable forces
    one (rich reads `FORCE_COLOR` and `TTY_COMPATIBLE`). False: ask rich."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError, OSError):
        tty = False
    return not tty and "FORCE_COLOR" not in os.environ and os.environ.get("TTY_COMPATIBLE", "") != "1"
