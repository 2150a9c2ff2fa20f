"""The worker processes of one scan, forked when a step first has enough items to share out.

A scan has two parallel steps: the project facts (Python's own parser, no engine) and then the
analysis of the files (libcst, the model and the rules: ``load``). Loading the engine takes a
fifth of a second, so it is not done while the workers wait: the facts' workers are forked
first, one process fewer than the jobs, and this process loads the engine on the core left
while they read the facts. The analysis then needs workers forked after the load, which share
what it loaded instead of loading it again each (a fork costs a few milliseconds; loading the
engine in every worker would cost the fifth of a second again).

Every process, this one included, claims the next item from a counter they share until none is
left, so that no core waits for another: when the load ends before the facts do, this process
reads its share of them. What this process has to do besides, it does ``meanwhile``, once the
workers have started; that may list more items for them (the analysis of the files that need
the project links: the workers analyse the files that do not while this process links the
project).
"""

from __future__ import annotations

import os
import pickle
from typing import TYPE_CHECKING, Any, Callable, Generic, TypeVar

if TYPE_CHECKING:
    from multiprocessing.context import BaseContext
    from multiprocessing.pool import Pool

Item = TypeVar("Item")
Result = TypeVar("Result")

# Below this many items a process pool costs more than it saves.
PARALLEL_FROM = 8


class Workers:
    """``map`` on ``jobs`` processes (None: one per core), this one included; serial for one
    job or a handful of items. ``load`` loads what ``map(..., loaded=True)`` needs (called once).
    Use it as a context manager: the workers end with the block."""

    def __init__(self, jobs: int | None, load: Callable[[], None] = lambda: None) -> None:
        self.jobs = jobs or os.cpu_count() or 1
        self._load = load
        self._loaded = False
        self._pool: Pool | None = None  # where processes cannot be forked: a pool of its own
        self._pool_loaded = False  # started after the load
        self._size = 0
        self._started: list[_Shared] = []  # steps begun by ``start``

    def load(self) -> None:
        if not self._loaded:
            self._load()
            self._loaded = True

    def map(
        self, function: Callable[[Item], Result], items: list[Item], *, loaded: bool = False,
        meanwhile: Callable[[], list[Item]] | None = None, done: Callable[[int], None] | None = None,
    ) -> list[Result]:
        """``[function(item) for item in items + meanwhile()]``. ``loaded``: ``function`` needs
        what ``load`` loads (it is loaded here first); without it, this process loads it while the
        workers run. ``meanwhile()``: called once, by this process, while the workers start on
        ``items`` (after the load); it returns more items (or none). ``done(n)``: n items are done
        (called now and then, in this process)."""
        if meanwhile is not None and (self.jobs <= 1 or len(items) < PARALLEL_FROM):
            items, meanwhile = [*items, *meanwhile()], None  # too few to start on: together they may be enough
        if not items:
            return []
        if loaded:
            self.load()
        if self.jobs <= 1 or len(items) < PARALLEL_FROM:
            return _counted(map(function, items), done)
        import multiprocessing  # a scan of cached files forks nothing

        if "fork" in multiprocessing.get_all_start_methods():
            step = _Shared(function, items, done)
            return step.run(multiprocessing.get_context("fork"), min(self.jobs - 1, len(items)), self.load, meanwhile)
        items = [*items, *(meanwhile() if meanwhile is not None else ())]  # (before a pool that is not forked)
        if self._pool is not None and loaded and not self._pool_loaded:
            self.close()
        if self._pool is None:
            # While this process loads, it takes a core of its own: the other jobs run ``function``.
            size = min(self.jobs if self._loaded else max(1, self.jobs - 1), len(items))
            self._pool_loaded = self._loaded
            self._pool = multiprocessing.Pool(size)
            self._size = size
        results = self._pool.imap(function, items, chunksize=max(1, len(items) // (self._size * 8)))
        self.load()  # while the workers run, if not yet: the next step will need it
        return _counted(results, done)

    def start(self, function: Callable[[Item], Result], items: list[Item], *,
              done: Callable[[int], None] | None = None) -> Started[Item, Result]:
        """``map(function, items + more(), loaded=True, ...)`` begun now: where processes can be
        forked and there are enough items, the workers start on them while this process goes on
        with other work (the engine is loaded first); ``finish(more)`` hands them the items
        ``more()`` lists, takes this process's share and returns every result, in order."""
        import multiprocessing

        if self.jobs > 1 and len(items) >= PARALLEL_FROM and "fork" in multiprocessing.get_all_start_methods():
            self.load()
            step = _Shared(function, items, done)
            step.start(multiprocessing.get_context("fork"), min(self.jobs - 1, len(items)))
            self._started.append(step)
            return Started(lambda more: step.finish(lambda: None, more))
        return Started(lambda more: self.map(function, items, loaded=True, meanwhile=more, done=done))

    def close(self) -> None:
        for step in self._started:
            step.close()
        self._started.clear()
        if self._pool is not None:
            self._pool.terminate()
            self._pool = None

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Started(Generic[Item, Result]):
    """A ``Workers.start``-ed map: ``finish(more)`` returns its results."""

    def __init__(self, finish: Callable[[Callable[[], list[Item]]], list[Result]]) -> None:
        self._finish = finish

    def finish(self, more: Callable[[], list[Item]]) -> list[Result]:
        return self._finish(more)


def _counted(results: Any, done: Callable[[int], None] | None) -> list:
    found = []
    for result in results:
        found.append(result)
        if done is not None:
            done(len(found))
    return found


class _Shared:
    """One step on forked workers and this process: each claims the next item of a list from a
    counter they share (``_claim``). The workers inherit the step when they are forked; the
    items ``meanwhile`` lists after the fork reach them as a task of the pool."""

    def __init__(self, function: Callable[[Any], Any], items: list, done: Callable[[int], None] | None) -> None:
        self.function = function
        self.items = items
        self.done = done
        self.pool: Pool | None = None  # the forked workers (``start``)
        self.pending: list = []  # their tasks' results to come
        self.size = 0

    def run(self, context: BaseContext, size: int, load: Callable[[], None],
            meanwhile: Callable[[], list] | None) -> list:
        self.start(context, size)
        return self.finish(load, meanwhile)

    def start(self, context: BaseContext, size: int) -> None:
        """Fork ``size`` workers, which start on ``items`` at once."""
        global _STEP
        # Counters: the items claimed of ``items``, of the items ``meanwhile`` lists, the items done.
        self.claimed, self.claimed_more, self.finished = (context.Value("q", 0) for _ in range(3))
        _STEP = self
        try:
            self.pool = context.Pool(size)
        finally:
            _STEP = None
        self.pending = [self.pool.apply_async(_claim, (None,)) for _ in range(size)]
        self.size = size

    def finish(self, load: Callable[[], None], meanwhile: Callable[[], list] | None) -> list:
        """``load()``, then the items ``meanwhile()`` lists handed to the workers too; this
        process takes its share; every result, in order."""
        assert self.pool is not None
        try:
            load()
            extra = meanwhile() if meanwhile is not None else []
            if extra:
                data = pickle.dumps(extra, pickle.HIGHEST_PROTOCOL)  # once, not once per worker
                self.pending += [self.pool.apply_async(_claim_more, (data,)) for _ in range(self.size)]
            mine = [*self.claim(None), *self.claim(extra)]
            results: list = [None] * (len(self.items) + len(extra))
            for index, result in [*mine, *(pair for job in self.pending for pair in job.get())]:
                results[index] = result
        finally:
            self.close()
        return results

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool = None

    def claim(self, extra: list | None) -> list[tuple[int, object]]:
        """Claim items one at a time until none is left, of ``items`` (``extra`` None) or of
        ``extra`` (numbered after ``items``); (index, result) for each claimed here."""
        items, claimed, offset = (self.items, self.claimed, 0) if extra is None else (extra, self.claimed_more, len(self.items))
        mine = []
        while True:
            with claimed.get_lock():
                index = claimed.value
                claimed.value = index + 1
            if index >= len(items):
                return mine
            mine.append((offset + index, self.function(items[index])))
            with self.finished.get_lock():
                self.finished.value += 1
                finished = self.finished.value
            if self.done is not None and _STEP is None:  # this process: the workers have no one to tell
                self.done(finished)


# The step the workers being forked inherit (None otherwise; in a worker: the step it runs).
_STEP: _Shared | None = None


def _claim(extra: list | None) -> list[tuple[int, object]]:
    """A worker's part of the step it was forked with (``_Shared.claim``)."""
    assert _STEP is not None
    return _STEP.claim(extra)


def _claim_more(data: bytes) -> list[tuple[int, object]]:
    return _claim(pickle.loads(data))
