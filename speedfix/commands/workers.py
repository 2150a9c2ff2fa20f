"""The worker processes of one scan, forked when a step first has enough items to share out.

A scan has two parallel steps: the project facts (Python's own parser, no engine) and then the
analysis of the files (libcst, the model and the rules: ``load``). Loading the engine takes a
fifth of a second, so it is not done while the workers wait: the facts' pool is forked first,
with one process fewer than the jobs, and this process loads the engine on the core left while
its workers read the facts. The analysis then needs workers forked after the load, which share
what it loaded instead of loading it again each: a pool forked before the load is replaced by
one forked after it (a fork costs a few milliseconds; loading the engine in every worker would
cost the fifth of a second again).

Which of the two ends first depends on the machine and the project: when the load ends first,
this process takes its share of the facts still to read (the items are claimed one at a time
from a counter the processes share), so that neither core waits for the other.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Iterable, TypeVar

if TYPE_CHECKING:
    from multiprocessing.context import BaseContext
    from multiprocessing.pool import Pool

Item = TypeVar("Item")
Result = TypeVar("Result")

# Below this many items a process pool costs more than it saves.
PARALLEL_FROM = 8


class Workers:
    """``map`` on ``jobs`` worker processes (None: one per core), in order; serial for one job
    or a handful of items. ``load`` loads what ``map(..., loaded=True)`` needs (called once).
    Use it as a context manager: the pool ends with the block."""

    def __init__(self, jobs: int | None, load: Callable[[], None] = lambda: None) -> None:
        self.jobs = jobs or os.cpu_count() or 1
        self._load = load
        self._loaded = False
        self._pool: Pool | None = None
        self._size = 0
        self._pool_loaded = False  # forked after the load

    def load(self) -> None:
        if not self._loaded:
            self._load()
            self._loaded = True

    def map(self, function: Callable[[Item], Result], items: list[Item], *, loaded: bool = False) -> Iterable[Result]:
        """``map(function, items)``; ``loaded``: ``function`` needs what ``load`` loads (it is
        loaded here first). Without it, this process loads it while the workers run."""
        if not items:
            return iter(())
        if loaded:
            self.load()
        if self.jobs <= 1 or len(items) < PARALLEL_FROM:
            return map(function, items)
        if self._pool is not None and loaded and not self._pool_loaded:
            self.close()
        import multiprocessing  # a scan of cached files forks nothing

        forks = "fork" in multiprocessing.get_all_start_methods()
        if self._pool is None and not self._loaded and forks:
            return self._shared(function, items, multiprocessing.get_context("fork"))
        if self._pool is None:
            # While this process loads, it takes a core of its own: the other jobs run ``function``.
            self._size = min(self.jobs if self._loaded else max(1, self.jobs - 1), len(items))
            self._pool_loaded = self._loaded
            self._pool = multiprocessing.get_context("fork" if forks else None).Pool(self._size)
        results = self._pool.imap(function, items, chunksize=max(1, len(items) // (self._size * 8)))
        self.load()  # while the workers run, if not yet: the next step will need it
        return results

    def _shared(self, function: Callable[[Item], Result], items: list[Item], context: BaseContext) -> Iterable[Result]:
        """``map`` on ``jobs - 1`` forked workers while this process loads, then on this process
        too: each process claims the next item from a shared counter until none is left."""
        global _DRAINED
        self._size = min(max(1, self.jobs - 1), len(items))
        self._pool_loaded = False
        claimed = context.Value("q", 0)
        _DRAINED = (function, items, claimed)  # the forked workers inherit it
        try:
            self._pool = context.Pool(self._size)
            pending = [self._pool.apply_async(_drain) for _ in range(self._size)]
            self.load()
            mine = _drain()
        finally:
            _DRAINED = None
        results: list[Result] = [None] * len(items)  # type: ignore[list-item]
        for index, result in [*mine, *(pair for job in pending for pair in job.get())]:
            results[index] = result
        return results

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool = None

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# What the processes of ``Workers._shared`` share while they read the items: the function, the
# items and the counter of claimed items (set before the workers are forked; None otherwise).
_DRAINED: tuple[Callable, list, Any] | None = None


def _drain() -> list[tuple[int, object]]:
    """Claim items one at a time until none is left; (index, result) for each claimed here."""
    assert _DRAINED is not None
    function, items, claimed = _DRAINED
    done = []
    while True:
        with claimed.get_lock():
            index = claimed.value
            claimed.value = index + 1
        if index >= len(items):
            return done
        done.append((index, function(items[index])))
