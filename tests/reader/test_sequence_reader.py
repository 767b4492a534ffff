"""The SequenceSource reader: its split reader alone, and the whole reader in both modes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from tests.reader.fakes import ListOutput, RecordingContext, by_split, read, read_until_idle

from splitflow.api.reader import InputStatus, SourceReader
from splitflow.errors import ConfigurationError
from splitflow.reader import Positioned, RecordsBySplits, SplitSlice
from splitflow.testing.sequence import (
    SequenceCatalog,
    SequenceRecord,
    SequenceSource,
    SequenceSplit,
)
from splitflow.testing.sequence_reader import SequenceSplitReader, create_sequence_reader


def fetched(batch: RecordsBySplits[Positioned[SequenceRecord]]) -> dict[str, list[int]]:
    """Split id -> indexes of the records fetched."""
    return {sid: [e.value[1] for e in elements] for sid, elements in batch.records.items()}


@contextlib.contextmanager
def opened(reader: SourceReader[object, SequenceSplit]) -> Iterator[None]:
    reader.start()
    try:
        yield
    finally:
        reader.close()


# -- the split reader -------------------------------------------------------------------


def test_fetch_returns_at_most_fetch_size_records() -> None:
    split_reader = SequenceSplitReader(SequenceCatalog({"a": 10, "b": 10}), fetch_size=4)
    split_reader.handle_splits_changes(
        [SplitSlice(SequenceSplit("a")), SplitSlice(SequenceSplit("b"))]
    )
    batch = split_reader.fetch()
    assert sum(len(v) for v in batch.records.values()) == 4


def test_splits_take_turns_so_none_is_starved() -> None:
    catalog = SequenceCatalog({"a": 50, "b": 50, "c": 50})
    split_reader = SequenceSplitReader(catalog, fetch_size=2)
    split_reader.handle_splits_changes([SplitSlice(SequenceSplit(n)) for n in "abc"])
    first_in_fetch = [next(iter(split_reader.fetch().records)) for _ in range(3)]
    assert sorted(first_in_fetch) == ["a", "b", "c"]


def test_unbounded_split_reads_what_exists_then_has_nothing_available() -> None:
    catalog = SequenceCatalog({"a": 3})
    split_reader = SequenceSplitReader(catalog, fetch_size=10)
    split_reader.handle_splits_changes([SplitSlice(SequenceSplit("a", position=1))])
    assert fetched(split_reader.fetch()) == {"a": [1, 2]}
    assert split_reader.fetch().is_empty()
    catalog.append("a", 2)
    assert fetched(split_reader.fetch()) == {"a": [3, 4]}


def test_bounded_split_ends_at_its_end_even_if_more_records_exist() -> None:
    split_reader = SequenceSplitReader(SequenceCatalog({"a": 10}), fetch_size=100)
    split_reader.handle_splits_changes([SplitSlice(SequenceSplit("a", end=6, position=4))])
    batch = split_reader.fetch()
    assert fetched(batch) == {"a": [4, 5]}
    assert batch.ended == {"a"}


def test_slice_finishes_at_its_stop_without_ending() -> None:
    catalog = SequenceCatalog({"a": 3})
    split_reader = SequenceSplitReader(catalog, fetch_size=100)
    split_reader.handle_splits_changes([SplitSlice(SequenceSplit("a", end=20), stop=5)])
    first = split_reader.fetch()
    assert (fetched(first), first.finished) == ({"a": [0, 1, 2]}, set())
    catalog.append("a", 10)
    second = split_reader.fetch()
    assert (fetched(second), second.finished, second.ended) == ({"a": [3, 4]}, {"a"}, set())
    assert split_reader.fetch().is_empty()


def test_split_that_vanished_from_the_catalog_has_nothing_available() -> None:
    catalog = SequenceCatalog({"a": 3})
    split_reader = SequenceSplitReader(catalog, fetch_size=10)
    split_reader.handle_splits_changes([SplitSlice(SequenceSplit("a", end=3))])
    catalog.remove("a")
    assert split_reader.fetch().is_empty()
    split_reader.remove_splits(["a"])
    assert split_reader.fetch().is_empty()


def test_fetch_size_below_one_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError) as raised:
        SequenceSplitReader(SequenceCatalog(), fetch_size=0)
    assert raised.value.option == "fetch_size"


# -- the whole reader -------------------------------------------------------------------


def test_source_creates_a_reader_that_reads_every_record(fetch_threads: int) -> None:
    catalog = SequenceCatalog({"a": 7, "b": 0, "c": 12})
    source = SequenceSource(catalog, bounded=True, fetch_size=5)
    context = RecordingContext()
    reader = (
        source.create_reader(context)
        if fetch_threads == 0
        else create_sequence_reader(source, context, fetch_threads=fetch_threads)
    )
    out = ListOutput()
    with opened(reader):
        reader.add_splits([SequenceSplit(n, end=k) for n, k in catalog.lengths().items()])
        reader.notify_no_more_splits()
        assert read(reader, out) is InputStatus.END_OF_INPUT
    assert sorted(out) == catalog.records()
    assert sorted(context.finished_ids()) == ["a", "b", "c"]


def test_records_appended_later_are_read_by_a_running_reader() -> None:
    catalog = SequenceCatalog({"a": 2})
    reader = SequenceSource(catalog).create_reader(RecordingContext())
    out = ListOutput()
    with opened(reader):
        reader.add_splits([SequenceSplit("a")])
        read_until_idle(reader, out)
        assert out == [("a", 0), ("a", 1)]
        catalog.append("a", 2)
        read_until_idle(reader, out)
        assert reader.snapshot_state(1) == [SequenceSplit("a", position=4)]
    assert by_split(out) == {"a": [0, 1, 2, 3]}


def test_threaded_mode_gives_the_same_output_and_snapshot_as_sync_mode() -> None:
    lengths = {f"s{i}": 3 + 11 * i for i in range(8)}

    def run(fetch_threads: int) -> tuple[dict[str, list[int]], list[SequenceSplit], list[str]]:
        catalog = SequenceCatalog(lengths)
        source = SequenceSource(catalog, fetch_size=7)
        context = RecordingContext()
        reader = create_sequence_reader(source, context, fetch_threads=fetch_threads)
        splits = [
            SequenceSplit(n, end=k if i % 2 else None, position=i)
            for i, (n, k) in enumerate(lengths.items())
        ]
        stops = {s.name: min(s.position + 9, lengths[s.name]) for s in splits[:4]}
        stops.update({s.name: lengths[s.name] for s in splits[4:] if s.end is None})
        out = ListOutput()
        with opened(reader):
            reader.add_splits(splits, stop_at=stops)
            reader.notify_no_more_splits()
            read(reader, out)
            snapshot = sorted(reader.snapshot_state(1), key=lambda s: s.name)
        return by_split(out), snapshot, sorted(context.finished_ids())

    sync = run(0)
    output, snapshot, ended = sync
    assert len(output) == len(lengths)
    assert snapshot
    assert ended
    assert run(3) == sync
    assert run(1) == sync
