"""The worker processes of one scan: forked once, when a step first has enough items to share
out, and used by every later step (the project facts, then the analysis of the files).

Forking costs the same for a pool that reads a few dozen files' facts as for one that analyses
the whole tree, so one pool serves both. ``before_fork`` runs once, just before the pool is
forked: what it loads (the engine, the rules) every worker then shares instead of loading it
again.
"""

from __future__ import annotations

import multiprocessing
import os
from multiprocessing.pool import Pool
from typing import Callable, Iterable, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")

# Below this many items a process pool costs more than it saves.
PARALLEL_FROM = 8


class Workers:
    """``map`` on ``jobs`` worker processes (None: one per core), in order; serial for one job
    or a handful of items. Use it as a context manager: the pool ends with the block."""

    def __init__(self, jobs: int | None, before_fork: Callable[[], None] = lambda: None) -> None:
        self.jobs = jobs or os.cpu_count() or 1
        self.before_fork = before_fork
        self._pool: Pool | None = None
        self._size = 0

    def map(self, function: Callable[[Item], Result], items: list[Item]) -> Iterable[Result]:
        if self.jobs <= 1 or len(items) < PARALLEL_FROM:
            return map(function, items)
        if self._pool is None:
            self._size = min(self.jobs, len(items))
            self.before_fork()
            method = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
            self._pool = multiprocessing.get_context(method).Pool(self._size)
        return self._pool.imap(function, items, chunksize=max(1, len(items) // (self._size * 8)))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool = None

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

