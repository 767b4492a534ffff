"""Fetcher threads (mirrors Flink's SplitFetcherTest / SplitFetcherManagerTest)."""

from __future__ import annotations

import threading
import time

import pytest
from tests.reader.conftest import NewReader
from tests.reader.fakes import (
    WAIT,
    ListOutput,
    RecordingContext,
    Script,
    ScriptedSplitReader,
    by_split,
    fetcher_threads,
    read,
)

from splitflow.errors import ContractViolation
from splitflow.reader import PositionedEmitter, SourceReaderBase
from splitflow.reader.fetcher import ThreadedFetcherManager
from splitflow.testing.sequence import SequenceCatalog, SequenceSplit


def test_close_joins_fetcher_threads_and_closes_split_readers_on_them(
    new_reader: NewReader,
) -> None:
    before = set(threading.enumerate())
    catalog = SequenceCatalog({f"s{i}": 4 for i in range(5)})
    reader, _, script = new_reader(catalog, fetch_threads=3)
    reader.add_splits([SequenceSplit(n, end=4) for n in catalog.lengths()])
    reader.notify_no_more_splits()
    read(reader, ListOutput())
    assert len(fetcher_threads()) == 3

    reader.close()

    assert set(threading.enumerate()) <= before, "close() left threads running"
    assert sorted(script.closed_on) == [f"splitflow-reader-0-fetcher-{i}" for i in range(3)]


def test_fetcher_threads_start_only_when_splits_arrive(new_reader: NewReader) -> None:
    reader, _, _ = new_reader(SequenceCatalog({"a": 1}), fetch_threads=4)
    assert fetcher_threads() == []
    reader.add_splits([SequenceSplit("a")])
    assert len(fetcher_threads()) == 1


def test_new_splits_go_to_the_least_loaded_fetcher(new_reader: NewReader) -> None:
    catalog = SequenceCatalog(dict.fromkeys("abcdefg", 3))
    reader, _, script = new_reader(catalog, fetch_threads=3)
    reader.add_splits([SequenceSplit(n) for n in "abc"])
    reader.add_splits([SequenceSplit("d", end=3), *(SequenceSplit(n) for n in "ef")])
    out = ListOutput()
    read(reader, out, until=lambda: "d" in reader.ended_split_ids() and len(out) == 18)

    reader.add_splits([SequenceSplit("g")])  # the fetcher of finished "d" is least loaded
    read(reader, out, until=lambda: len(out) == 21)
    assert [r.added for r in script.readers] == [["a", "d", "g"], ["b", "e"], ["c", "f"]]


def test_full_queue_blocks_fetchers_until_the_reader_polls(new_reader: NewReader) -> None:
    script = Script(fetch_size=1)
    reader, _, _ = new_reader(
        SequenceCatalog({"a": 100}), script, fetch_threads=1, queue_capacity=2
    )
    reader.add_splits([SequenceSplit("a")])

    assert script.wait_fetches(3)  # two batches queued, the third waits for space
    assert not script.wait_fetches(4, timeout=0.1), "a fetcher ran past a full queue"
    out = ListOutput()
    read(reader, out, until=lambda: len(out) >= 10)
    assert by_split(out)["a"] == list(range(len(out)))


def test_close_stops_a_fetcher_blocked_on_a_full_queue(new_reader: NewReader) -> None:
    script = Script(fetch_size=1)
    reader, _, _ = new_reader(
        SequenceCatalog({"a": 100}), script, fetch_threads=1, queue_capacity=1
    )
    reader.add_splits([SequenceSplit("a")])
    assert script.wait_fetches(2)

    reader.close()
    assert fetcher_threads() == []


def test_close_wakes_a_blocking_fetch(new_reader: NewReader) -> None:
    script = Script(block_when_idle=True)
    reader, _, _ = new_reader(SequenceCatalog({"a": 0}), script, fetch_threads=2)
    reader.add_splits([SequenceSplit("a")])
    assert script.blocked.wait(WAIT)

    started = time.monotonic()
    reader.close()
    assert time.monotonic() - started < WAIT / 2
    assert fetcher_threads() == []
    assert not script.unwoken


def test_adding_a_split_wakes_a_blocking_fetch(new_reader: NewReader) -> None:
    script = Script(block_when_idle=True)
    catalog = SequenceCatalog({"a": 0, "b": 4})
    reader, _, _ = new_reader(catalog, script, fetch_threads=1)
    reader.add_splits([SequenceSplit("a")])
    assert script.blocked.wait(WAIT)

    reader.add_splits([SequenceSplit("b", end=4)])
    out = ListOutput()
    read(reader, out, until=lambda: len(out) == 4)
    assert by_split(out) == {"b": [0, 1, 2, 3]}
    assert not script.unwoken


def test_split_reader_close_error_is_raised_from_close(new_reader: NewReader) -> None:
    error = OSError("socket already closed")
    reader, _, _ = new_reader(SequenceCatalog({"a": 1}), Script(fail_close=error), fetch_threads=1)
    reader.add_splits([SequenceSplit("a")])
    with pytest.raises(OSError, match="socket already closed") as raised:
        reader.close()
    assert raised.value is error
    assert fetcher_threads() == []


def test_fetch_that_ignores_wake_up_is_reported_by_close(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release = threading.Event()

    class Deaf(ScriptedSplitReader):
        def fetch(self):  # type: ignore[no-untyped-def]
            self.script.blocked.set()
            release.wait(WAIT)
            return super().fetch()

    monkeypatch.setattr(ThreadedFetcherManager, "close_timeout", 0.05)
    script = Script()
    reader = SourceReaderBase(
        lambda: Deaf(SequenceCatalog({"a": 1}), script),
        PositionedEmitter(),
        RecordingContext(),
        fetch_threads=1,
    )
    reader.add_splits([SequenceSplit("a")])
    assert script.blocked.wait(WAIT)
    try:
        with pytest.raises(ContractViolation, match="must return promptly after wake_up"):
            reader.close()
    finally:
        release.set()
        for thread in fetcher_threads():
            thread.join(WAIT)
