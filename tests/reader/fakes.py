"""Fakes for reader tests: a recording context, a list output, a scriptable split reader.

The scripted split reader reads records ``(name, i)`` of a :class:`SequenceCatalog` (the data
store), like Flink's ``MockSplitReader``, and can be told to fail, to block when idle, or to
ignore stops; a :class:`Script` holds its settings and what it observed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from splitflow.api.reader import InputStatus
from splitflow.reader import (
    Positioned,
    PositionedEmitter,
    RecordsBySplits,
    SourceReaderBase,
    SplitReader,
    SplitSlice,
)
from splitflow.reader.output import Collector, RecordingReaderContext
from splitflow.testing.sequence import SequenceCatalog, SequenceRecord, SequenceSplit

WAIT = 5.0
"""Seconds a test waits for something that must happen; only reached when it is failing."""

FETCHER_THREAD_PREFIX = "splitflow-reader-"


RecordingContext = RecordingReaderContext
ListOutput = Collector


@dataclass
class Script:
    """Settings of :class:`ScriptedSplitReader` instances, and what they observed."""

    fetch_size: int = 3
    fail_fetch: dict[str, BaseException] = field(default_factory=dict)
    fail_add: dict[str, BaseException] = field(default_factory=dict)
    fail_close: BaseException | None = None
    block_when_idle: bool = False
    ignore_stop: bool = False
    # observed
    readers: list[ScriptedSplitReader] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    closed_on: list[str] = field(default_factory=list)
    blocked: threading.Event = field(default_factory=threading.Event)
    unwoken: bool = False
    fetches: int = 0
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def fetched(self) -> None:
        with self._cond:
            self.fetches += 1
            self._cond.notify_all()

    def changed(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def wait_until(self, predicate: Callable[[], bool], timeout: float = WAIT) -> bool:
        """Wait until ``predicate()`` holds (checked when split readers act); whether it did."""
        with self._cond:
            return self._cond.wait_for(predicate, timeout)

    def wait_fetches(self, count: int, timeout: float = WAIT) -> bool:
        """Wait until at least ``count`` fetches started; whether they did."""
        return self.wait_until(lambda: self.fetches >= count, timeout)


class ScriptedSplitReader(SplitReader[Positioned[SequenceRecord], SequenceSplit]):
    """Reads ``script.fetch_size`` records per split and fetch from a catalog, as scripted."""

    def __init__(self, catalog: SequenceCatalog, script: Script) -> None:
        self.catalog = catalog
        self.script = script
        self.added: list[str] = []
        self._slices: dict[str, list[int | None]] = {}  # id -> [position, stop, end]
        self._woken = threading.Event()
        script.readers.append(self)

    def handle_splits_changes(self, added: Sequence[SplitSlice[SequenceSplit]]) -> None:
        for piece in added:
            if piece.split_id in self.script.fail_add:
                raise self.script.fail_add[piece.split_id]
            self._slices[piece.split_id] = [piece.start, piece.stop, piece.split.end]
            self.added.append(piece.split_id)

    def remove_splits(self, split_ids: Sequence[str]) -> None:
        for sid in split_ids:
            del self._slices[sid]
        self.script.removed.extend(split_ids)
        self.script.changed()

    def fetch(self) -> RecordsBySplits[Positioned[SequenceRecord]]:
        self.script.fetched()
        for sid in self._slices:
            if sid in self.script.fail_fetch:
                raise self.script.fail_fetch[sid]
        batch: RecordsBySplits[Positioned[SequenceRecord]] = RecordsBySplits()
        for sid, (position, stop, end) in list(self._slices.items()):
            assert position is not None
            limit = self.catalog.length(sid) or 0
            if end is not None:
                limit = min(limit, end)
            if stop is not None and not self.script.ignore_stop:
                limit = min(limit, stop)
            upto = min(limit, position + self.script.fetch_size)
            batch.add_all(sid, [Positioned((sid, i), i + 1) for i in range(position, upto)])
            self._slices[sid][0] = upto
            if end is not None and upto >= end:
                batch.mark_ended(sid)
                del self._slices[sid]
            elif stop is not None and upto >= stop:
                batch.mark_finished(sid)
                del self._slices[sid]
        if batch.is_empty() and self.script.block_when_idle and not self._woken.is_set():
            self.script.blocked.set()  # blocks until wake_up: a long poll that found nothing
            if not self._woken.wait(WAIT):
                self.script.unwoken = True
        self._woken.clear()  # a wake-up only ever cuts one fetch short
        return batch

    def wake_up(self) -> None:
        self._woken.set()

    def close(self) -> None:
        self.script.closed_on.append(threading.current_thread().name)
        if self.script.fail_close is not None:
            raise self.script.fail_close


Reader = SourceReaderBase[Positioned[SequenceRecord], SequenceRecord, SequenceSplit]


def make_reader(
    catalog: SequenceCatalog,
    script: Script | None = None,
    *,
    context: RecordingContext | None = None,
    **options: Any,
) -> tuple[Reader, RecordingContext, Script]:
    """A SourceReaderBase over a scripted split reader; ``options`` go to its constructor."""
    script = script or Script()
    context = context or RecordingContext()
    reader: Reader = SourceReaderBase(
        lambda: ScriptedSplitReader(catalog, script),
        PositionedEmitter(),
        context,
        **options,
    )
    return reader, context, script


def read(
    reader: Any,
    output: ListOutput,
    *,
    until: Callable[[], bool] | None = None,
    timeout: float = WAIT,
) -> InputStatus:
    """Poll (waiting while nothing is available) until END_OF_INPUT or ``until()`` holds."""
    deadline = time.monotonic() + timeout
    while True:
        status = reader.poll_next(output)
        if status is InputStatus.END_OF_INPUT or (until is not None and until()):
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"reader did not get there in {timeout}s: read {len(output)}")
        if status is InputStatus.NOTHING_AVAILABLE:
            reader.wait_available(0.05)


def read_until_idle(reader: Any, output: ListOutput) -> None:
    """Synchronous mode only: poll until a poll finds nothing (what exists is read)."""
    for _ in range(10_000):
        if reader.poll_next(output) is not InputStatus.MORE_AVAILABLE:
            return
    raise AssertionError("reader never ran out of records")


def by_split(records: Sequence[SequenceRecord]) -> dict[str, list[int]]:
    """Split name -> the record indexes read from it, in the order read."""
    result: dict[str, list[int]] = {}
    for name, index in records:
        result.setdefault(name, []).append(index)
    return result


def fetcher_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(FETCHER_THREAD_PREFIX)]
