"""A per-file time limit that long-running steps check cooperatively.

``with time_limit(60): ...`` sets a deadline for the current thread (a context variable, so
threads and a server's requests each have their own); the parser between chunks, the walk every
few thousand nodes and the engine between rules call ``check()``, which raises
``TimeLimitExceeded`` once the deadline has passed. Inside the rules, the helpers every rule's
loops call (``dotted_name``, the loop and function around a node) call ``tick()``, which checks
every 1,024th time: a rule that takes long on a big file stops there, not only after it. No signal is used: a signal handler only
works in the main thread and cannot interrupt libcst's native parser anyway (the parser's own
worst cases are refused up front, see ``speedfix.syntax.parsing``).

``with cancelled_by(event): ...`` makes ``check()`` raise ``Cancelled`` once ``event`` is set: the
editor server abandons the analysis of a text that the next keystroke has made stale.

``clock`` is looked up at each call so that tests can replace it with a fake clock.
"""

from __future__ import annotations

import itertools
import threading
import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator

# The default of the `file-time-limit` setting, in seconds (a generated 5 MB module took 53 s of
# one core's CPU time on the 2-vCPU machine this project is built on: benchmarks/scan_size.py).
DEFAULT_SECONDS = 120.0

clock = time.monotonic
_deadline: ContextVar[tuple[float, float] | None] = ContextVar("speedfix_deadline", default=None)
_cancel: ContextVar[threading.Event | None] = ContextVar("speedfix_cancel", default=None)


class TimeLimitExceeded(Exception):
    """Analysing one file took longer than its limit; ``seconds`` is that limit."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"took longer than {seconds:g} s")
        self.seconds = seconds


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Run the block under a deadline ``seconds`` from now (None: no limit)."""
    token = _deadline.set(None if seconds is None else (clock() + seconds, seconds))
    try:
        yield
    finally:
        _deadline.reset(token)


_ticks = itertools.count(1)


def tick() -> None:
    """``check()`` one call in 1,024: cheap enough for the helpers the rules call in their loops."""
    if not next(_ticks) & 1023:
        check()


class Cancelled(BaseException):
    """The work was abandoned because something newer came in (a BaseException, as asyncio's
    CancelledError, so that no ``except Exception`` on the way takes it for a failure)."""


@contextmanager
def cancelled_by(event: threading.Event) -> Iterator[None]:
    """Run the block so that ``check()`` raises Cancelled once ``event`` is set."""
    token = _cancel.set(event)
    try:
        yield
    finally:
        _cancel.reset(token)


def check() -> None:
    """Raise TimeLimitExceeded when the current deadline has passed, Cancelled when the work
    was called off."""
    current = _deadline.get()
    if current is not None and clock() > current[0]:
        raise TimeLimitExceeded(current[1])
    event = _cancel.get()
    if event is not None and event.is_set():
        raise Cancelled
