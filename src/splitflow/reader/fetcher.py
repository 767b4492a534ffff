"""Fetching: run split readers on the reader's thread or on fetcher threads.

Implementation of :class:`~splitflow.reader.SourceReaderBase`; connectors do not use it.
Two managers give the reader the same interface, and the same elements per split:

* :class:`SyncFetcherManager`: one split reader for every split, fetched on the reader's own
  thread inside ``poll_next`` / ``wait_available`` (no thread at all);
* :class:`ThreadedFetcherManager`: ``N`` fetcher threads, each with its own split reader and
  its share of the splits (least loaded first), handing batches to the reader through one
  bounded queue, as Flink's ``SplitFetcherManager``.

Every batch carries the assignment generation of each split it mentions: when a split is
removed while a batch of it is in flight, and even when a split of the same id is added
again, the reader recognises the stale elements and drops them.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic

from splitflow.api.split import SplitT
from splitflow.errors import ContractViolation
from splitflow.reader.split_reader import E, RecordsBySplits, SplitReader, SplitSlice

SplitReaderFactory = Callable[[], SplitReader[E, SplitT]]
"""Makes a new split reader; called once per fetcher, on the reader's thread."""

Assignment = tuple[SplitSlice[SplitT], int]
"""A slice to read and the generation the reader gave this assignment."""


def describe_ids(split_ids: Iterable[str], limit: int = 10) -> str:
    """``'a', 'b'`` (and how many more), for messages that name splits."""
    ids = sorted(split_ids)
    shown = ", ".join(repr(sid) for sid in ids[:limit])
    return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")


@dataclass(frozen=True)
class FetchedBatch(Generic[E]):
    """A non-empty :class:`RecordsBySplits` from fetcher ``fetcher``.

    ``generations``: split id -> the assignment generation the split reader held it under,
    for every split id the batch mentions.
    Thread: built on the fetch thread, then owned by the reader's thread.
    """

    records: RecordsBySplits[E]
    generations: Mapping[str, int]
    fetcher: str


class SplitFetcher(Generic[E, SplitT]):
    """One split reader and the splits it holds.

    Called by: one fetch thread (all methods but :meth:`wake_up`, which any thread may call).
    Guarantees: every exception escaping the split reader gets a note naming the fetcher and
    the splits involved, and is re-raised unchanged otherwise.
    """

    def __init__(self, split_reader: SplitReader[E, SplitT], name: str) -> None:
        self.split_reader = split_reader
        self.name = name
        self._held: dict[str, int] = {}  # unfinished split id -> generation

    @property
    def has_splits(self) -> bool:
        """Whether the split reader holds a split it has not reported finished."""
        return bool(self._held)

    def add(self, assignments: Sequence[Assignment[SplitT]]) -> None:
        slices = [piece for piece, _ in assignments]
        try:
            self.split_reader.handle_splits_changes(slices)
        except BaseException as exc:
            self._note(exc, "handle_splits_changes", "adding", (s.split_id for s in slices))
            raise
        for piece, generation in assignments:
            self._held[piece.split_id] = generation

    def remove(self, split_ids: Collection[str]) -> None:
        held = [sid for sid in split_ids if sid in self._held]
        if not held:
            return  # finished already: the split reader dropped them itself
        for sid in held:
            del self._held[sid]
        try:
            self.split_reader.remove_splits(held)
        except BaseException as exc:
            self._note(exc, "remove_splits", "removing", held)
            raise

    def fetch(self) -> FetchedBatch[E] | None:
        """Fetch once; ``None`` when nothing was ready."""
        try:
            batch = self.split_reader.fetch()
        except BaseException as exc:
            self._note(exc, "fetch", "reading", self._held)
            raise
        if batch.is_empty():
            return None
        mentioned = batch.split_ids()
        unknown = mentioned - self._held.keys()
        if unknown:
            raise ContractViolation(
                f"{type(self.split_reader).__name__}.fetch() ({self.name}) returned split(s) "
                f"{describe_ids(unknown)} that it does not hold: they were never added, were "
                "removed, or were already reported finished"
            )
        generations = {sid: self._held[sid] for sid in mentioned}
        for sid in batch.finished | batch.ended:
            del self._held[sid]
        return FetchedBatch(batch, generations, self.name)

    def wake_up(self) -> None:
        self.split_reader.wake_up()

    def close(self) -> None:
        try:
            self.split_reader.close()
        except BaseException as exc:
            self._note(exc, "close", "holding", self._held)
            raise

    def _note(self, exc: BaseException, method: str, doing: str, split_ids: Iterable[str]) -> None:
        ids = describe_ids(split_ids) or "no split"
        exc.add_note(
            f"splitflow: raised by {type(self.split_reader).__name__}.{method}() in {self.name}, "
            f"{doing} split(s) {ids}"
        )


class FetcherManager(ABC, Generic[E, SplitT]):
    """What :class:`~splitflow.reader.SourceReaderBase` needs from fetching.

    Called by: the reader's thread, except :meth:`wake_up` (any thread).
    Errors: an exception of a split reader (or a contract violation found while fetching)
    is raised from :meth:`poll` or :meth:`wait`, unchanged; the manager is then failed.
    """

    @abstractmethod
    def add_splits(self, assignments: Sequence[Assignment[SplitT]]) -> None:
        """Hand new slices to split readers. Does not call the split reader: never raises."""

    @abstractmethod
    def remove_splits(self, split_ids: Collection[str]) -> None:
        """Stop reading these splits; their elements may still be in flight."""

    def splits_finished(self, split_ids: Collection[str]) -> None:
        """The reader saw these splits finish (for balancing new splits over fetchers)."""

    @abstractmethod
    def poll(self) -> FetchedBatch[E] | None:
        """The next batch, or ``None`` if none is ready. Does not wait for one."""

    @abstractmethod
    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a batch; ``False`` on timeout or wake-up."""

    @abstractmethod
    def wake_up(self) -> None:
        """Make a running or the next :meth:`wait` return now. Thread: any."""

    @abstractmethod
    def close(self) -> None:
        """Stop fetching and close every split reader (raises the first close error)."""


class SyncFetcherManager(FetcherManager[E, SplitT]):
    """One split reader, fetched on the calling (reader) thread.

    Split changes are applied just before the next fetch, so split reader errors surface
    from :meth:`poll` / :meth:`wait` in both modes.
    """

    def __init__(
        self, factory: SplitReaderFactory[E, SplitT], *, idle_backoff: float, name: str
    ) -> None:
        self._factory = factory
        self._idle_backoff = idle_backoff
        self._name = name
        self._fetcher: SplitFetcher[E, SplitT] | None = None
        self._changes: list[Callable[[SplitFetcher[E, SplitT]], None]] = []
        self._ready: FetchedBatch[E] | None = None
        self._woken = threading.Event()

    def add_splits(self, assignments: Sequence[Assignment[SplitT]]) -> None:
        batch = list(assignments)
        self._changes.append(lambda fetcher: fetcher.add(batch))

    def remove_splits(self, split_ids: Collection[str]) -> None:
        ids = list(split_ids)
        self._changes.append(lambda fetcher: fetcher.remove(ids))

    def poll(self) -> FetchedBatch[E] | None:
        fetcher = self._apply_changes()
        if self._ready is not None:
            ready, self._ready = self._ready, None
            return ready
        if fetcher is None or not fetcher.has_splits:
            return None
        return fetcher.fetch()

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        fetcher = self._apply_changes()
        while self._ready is None:
            if fetcher is not None and fetcher.has_splits:
                self._ready = fetcher.fetch()
                if self._ready is not None:
                    break
                pause = min(self._idle_backoff, deadline - time.monotonic())
            else:
                pause = deadline - time.monotonic()  # only this thread could add splits
            if pause <= 0:
                return False
            if self._woken.wait(pause):
                self._woken.clear()
                return False
        return True

    def wake_up(self) -> None:
        self._woken.set()
        fetcher = self._fetcher
        if fetcher is not None:
            fetcher.wake_up()

    def close(self) -> None:
        self._changes.clear()
        self._ready = None
        if self._fetcher is not None:
            self._fetcher.close()

    def _apply_changes(self) -> SplitFetcher[E, SplitT] | None:
        if self._changes and self._fetcher is None:
            self._fetcher = SplitFetcher(self._factory(), self._name)
        while self._changes:
            change = self._changes.pop(0)
            assert self._fetcher is not None
            change(self._fetcher)
        return self._fetcher


class _FetchQueue(Generic[E]):
    """The bounded hand-over from fetcher threads to the reader's thread.

    ``put`` blocks while full (backpressure) until space frees or the queue closes. A
    failure skips the line and is raised by the next ``take``.
    """

    def __init__(self, capacity: int) -> None:
        self._cond = threading.Condition()
        self._items: deque[FetchedBatch[E]] = deque()
        self._capacity = capacity
        self._failure: BaseException | None = None
        self._closed = False
        self._woken = False

    def put(self, batch: FetchedBatch[E]) -> bool:
        """Queue ``batch``; ``False`` if the queue closed first. Thread: a fetcher."""
        with self._cond:
            while len(self._items) >= self._capacity and not self._closed:
                self._cond.wait()
            if self._closed:
                return False
            self._items.append(batch)
            self._cond.notify_all()
            return True

    def fail(self, failure: BaseException) -> None:
        """Record a fetcher's failure (the first one wins). Thread: a fetcher. Never blocks."""
        with self._cond:
            if self._failure is None:
                self._failure = failure
            self._cond.notify_all()

    def take(self) -> FetchedBatch[E] | None:
        """The oldest batch, or ``None``; raises a recorded failure. Thread: the reader."""
        with self._cond:
            if self._failure is not None:
                raise self._failure
            if not self._items:
                return None
            batch = self._items.popleft()
            self._cond.notify_all()
            return batch

    def wait(self, timeout: float) -> bool:
        """Wait for a batch or failure, a wake-up, or the timeout. Thread: the reader."""
        with self._cond:
            self._cond.wait_for(
                lambda: bool(self._items) or self._failure is not None or self._woken,
                timeout,
            )
            self._woken = False
            return bool(self._items) or self._failure is not None

    def wake(self) -> None:
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._items.clear()
            self._cond.notify_all()


class _FetcherThread(Generic[E, SplitT]):
    """A thread that applies split changes, fetches, and queues non-empty batches."""

    def __init__(
        self, fetcher: SplitFetcher[E, SplitT], queue: _FetchQueue[E], idle_backoff: float
    ) -> None:
        self.fetcher = fetcher
        self.close_error: BaseException | None = None
        self._queue = queue
        self._idle_backoff = idle_backoff
        self._cond = threading.Condition()
        self._changes: deque[Callable[[SplitFetcher[E, SplitT]], None]] = deque()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=fetcher.name, daemon=True)
        self._thread.start()

    def add(self, assignments: list[Assignment[SplitT]]) -> None:
        """Have the fetcher thread add these slices (before its next fetch)."""
        self._submit(lambda fetcher: fetcher.add(assignments))

    def remove(self, split_ids: list[str]) -> None:
        """Have the fetcher thread remove these splits (before its next fetch)."""
        self._submit(lambda fetcher: fetcher.remove(split_ids))

    def _submit(self, change: Callable[[SplitFetcher[E, SplitT]], None]) -> None:
        """Queue a split change for the fetcher thread and interrupt its fetch."""
        with self._cond:
            self._changes.append(change)
            self._cond.notify_all()
        self.fetcher.wake_up()

    def shutdown(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self.fetcher.wake_up()

    def join(self, timeout: float) -> bool:
        """Wait for the thread to end; whether it did."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not (self._closed or self._changes or self.fetcher.has_splits):
                        self._cond.wait()
                    if self._closed:
                        return
                    changes = list(self._changes)
                    self._changes.clear()
                for change in changes:
                    change(self.fetcher)
                if not self.fetcher.has_splits:
                    continue
                batch = self.fetcher.fetch()
                if batch is None:
                    with self._cond:
                        self._cond.wait_for(
                            lambda: self._closed or bool(self._changes), self._idle_backoff
                        )
                elif not self._queue.put(batch):
                    return
        except BaseException as exc:
            self._queue.fail(exc)
        finally:
            try:
                self.fetcher.close()
            except BaseException as exc:
                self.close_error = exc


class ThreadedFetcherManager(FetcherManager[E, SplitT]):
    """``threads`` fetcher threads, each with its own split reader; started on first use.

    A new split goes to the fetcher holding the fewest unfinished splits (the lowest index
    on a tie). ``close`` wakes every split reader, stops and joins the threads.
    """

    close_timeout: float = 10.0
    """Seconds ``close`` waits for each fetcher thread before it reports a stuck fetch."""

    def __init__(
        self,
        factory: SplitReaderFactory[E, SplitT],
        *,
        threads: int,
        queue_capacity: int,
        idle_backoff: float,
        name: str,
    ) -> None:
        self._factory = factory
        self._idle_backoff = idle_backoff
        self._name = name
        self._queue: _FetchQueue[E] = _FetchQueue(queue_capacity)
        self._threads: list[_FetcherThread[E, SplitT] | None] = [None] * threads
        self._load = [0] * threads
        self._owner: dict[str, int] = {}

    def add_splits(self, assignments: Sequence[Assignment[SplitT]]) -> None:
        groups: dict[int, list[Assignment[SplitT]]] = {}
        for assignment in assignments:
            index = min(range(len(self._load)), key=lambda i: (self._load[i], i))
            self._load[index] += 1
            self._owner[assignment[0].split_id] = index
            groups.setdefault(index, []).append(assignment)
        for index, group in groups.items():
            self._thread(index).add(group)

    def remove_splits(self, split_ids: Collection[str]) -> None:
        groups: dict[int, list[str]] = {}
        for sid in split_ids:
            index = self._owner.pop(sid, None)
            if index is not None:
                self._load[index] -= 1
                groups.setdefault(index, []).append(sid)
        for index, ids in groups.items():
            self._thread(index).remove(ids)

    def splits_finished(self, split_ids: Collection[str]) -> None:
        for sid in split_ids:
            index = self._owner.pop(sid, None)
            if index is not None:
                self._load[index] -= 1

    def poll(self) -> FetchedBatch[E] | None:
        return self._queue.take()

    def wait(self, timeout: float) -> bool:
        return self._queue.wait(timeout)

    def wake_up(self) -> None:
        self._queue.wake()

    def close(self) -> None:
        started = [t for t in self._threads if t is not None]
        for thread in started:
            thread.shutdown()
        self._queue.close()
        stuck = [t.fetcher.name for t in started if not t.join(self.close_timeout)]
        if stuck:
            raise ContractViolation(
                f"fetcher thread(s) {', '.join(stuck)} did not stop within "
                f"{self.close_timeout} s of close(): SplitReader.fetch must return promptly "
                "after wake_up()"
            )
        for thread in started:
            if thread.close_error is not None:
                raise thread.close_error

    def _thread(self, index: int) -> _FetcherThread[E, SplitT]:
        thread = self._threads[index]
        if thread is None:
            fetcher = SplitFetcher(self._factory(), f"{self._name}-fetcher-{index}")
            thread = _FetcherThread(fetcher, self._queue, self._idle_backoff)
            self._threads[index] = thread
        return thread


__all__ = [
    "FetchedBatch",
    "FetcherManager",
    "SplitFetcher",
    "SplitReaderFactory",
    "SyncFetcherManager",
    "ThreadedFetcherManager",
]
