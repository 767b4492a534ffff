"""Contract test suites: a connector subclasses them with its fixtures and gets the standard
enumerator and reader tests, run on its real enumerator and readers through the harness.

::

    from splitflow.testing.contracts import SourceContract

    class TestMySource(SourceContract):
        def make_source(self):
            return MySource(path=self.data_dir)       # over data the test made

        def expected_records(self):
            return self.records_written               # every record, once

        def record_split_id(self, record):
            return record.file_path                   # which split a record came from

The suites use plain ``assert`` and need no pytest import; a connector's test module
collects them because its class name starts with ``Test``. Optional features (new splits
appearing, bounded input) are skipped when the connector does not provide them.
"""

from __future__ import annotations

import unittest
from collections.abc import Hashable
from typing import Any

from splitflow.api.enumerator import SplitExtent
from splitflow.api.reader import InputStatus
from splitflow.api.source import Boundedness, Source
from splitflow.reader.output import Collector, RecordingReaderContext
from splitflow.testing.harness import (
    SourceHarness,
    assigning_enumerator_owned,
    count_duplicates,
)

AnySource = Source[Any, Any, Any]


class _ContractBase:
    parallelism = 3
    """Readers in the suites' runs."""

    discovery_seconds = 1.0
    """Virtual seconds after which the source's periodic discovery has run again."""

    def make_source(self) -> AnySource:
        """A new source over finite test data (the same data on every call)."""
        raise NotImplementedError

    def expected_records(self) -> list[Any]:
        """Every row the data holds now, each once (as :meth:`rows` gives them)."""
        raise NotImplementedError

    def record_split_id(self, record: Any) -> str:
        """The id of the split ``record`` came from."""
        raise NotImplementedError

    def rows(self, record: Any) -> list[Any]:
        """The rows in one emitted record (default: the record is one row).

        Sources that emit batches (e.g. ``pyarrow.RecordBatch``) return the batch's rows, so
        that counting works whatever the batch boundaries of a run.
        """
        return [record]

    def record_key(self, record: Any) -> Hashable:
        """What identifies a record when counting it (default: the record itself)."""
        return record  # type: ignore[no-any-return]

    def add_split_upstream(self) -> list[Any]:
        """Make a new split appear upstream; return its records. Optional."""
        raise unittest.SkipTest("the connector cannot add splits while running")

    # -- helpers ----------------------------------------------------------------------

    def harness(self, parallelism: int | None = None) -> SourceHarness[Any, Any, Any]:
        return SourceHarness(self.make_source(), parallelism or self.parallelism)

    def assert_exactly_once(self, records: list[Any], expected: list[Any]) -> None:
        keys = [self.record_key(row) for record in records for row in self.rows(record)]
        duplicates = count_duplicates(keys)
        assert not duplicates, f"records read more than once: {list(duplicates)[:5]}"
        missing = {self.record_key(r) for r in expected} - set(keys)
        assert not missing, (
            f"{len(missing)} records never read, e.g. {sorted(map(repr, missing))[:5]}"
        )
        assert len(keys) == len(expected), f"read {len(keys)} records, expected {len(expected)}"

    def finish(self, harness: SourceHarness[Any, Any, Any]) -> list[Any]:
        """Read what is there, commit it, close; return every committed record."""
        harness.advance(self.discovery_seconds)
        harness.read_available()
        harness.complete(harness.checkpoint())
        harness.close()
        return harness.committed()


class SourceContract(_ContractBase):
    """Enumerator and reader behaviour every splitflow source must have."""

    def test_reads_every_record_exactly_once(self) -> None:
        self.assert_exactly_once(self.finish(self.harness()), self.expected_records())

    def test_every_split_has_exactly_one_owner(self) -> None:
        harness = self.harness()
        harness.settle()
        owners = harness.ownership(assigning_enumerator_owned)
        harness.close()
        doubly = {sid: who for sid, who in owners.items() if len(who) != 1}
        assert not doubly, f"splits with several owners: {doubly}"
        expected = {self.record_split_id(r) for r in self.expected_records()}
        assert expected <= owners.keys(), f"splits nobody owns: {sorted(expected - owners.keys())}"

    def test_splits_are_balanced_across_readers(self) -> None:
        harness = self.harness()
        harness.settle()
        loads = harness.loads()
        harness.close()
        assert max(loads.values()) - min(loads.values()) <= 1, f"unbalanced loads {loads}"

    def test_snapshot_resumes_after_the_last_emitted_record(self) -> None:
        harness = self.harness()
        harness.settle()
        for reader_id in harness.slots:
            harness.poll(reader_id, max_polls=1)
        harness.complete(harness.checkpoint())
        partial = len(harness.committed())
        harness.restore()  # everything restarts from that checkpoint
        records = self.finish(harness)
        assert partial > 0, "the first poll of every reader emitted nothing"
        self.assert_exactly_once(records, self.expected_records())

    def test_partial_failover_of_each_reader_loses_and_duplicates_nothing(self) -> None:
        harness = self.harness()
        harness.settle()
        harness.complete(harness.checkpoint())
        for reader_id in sorted(harness.slots):
            harness.poll(reader_id, max_polls=1)
            harness.fail_reader(reader_id)
        self.assert_exactly_once(self.finish(harness), self.expected_records())

    def test_assignments_after_the_last_checkpoint_are_given_back(self) -> None:
        harness = self.harness()
        harness.settle()  # everything assigned, no checkpoint yet
        for reader_id in sorted(harness.slots):
            harness.poll(reader_id, max_polls=1)
        harness.fail_reader(0)
        self.assert_exactly_once(self.finish(harness), self.expected_records())

    def test_scale_up_then_down_reads_everything_once(self) -> None:
        harness = self.harness()
        harness.settle()
        for reader_id in sorted(harness.slots):
            harness.poll(reader_id, max_polls=1)
        harness.complete(harness.checkpoint())
        harness.restore(parallelism=self.parallelism + 2)
        loads = harness.loads()
        assert max(loads.values()) - min(loads.values()) <= 1, f"scale-up unbalanced: {loads}"
        harness.poll(0, max_polls=1)
        harness.complete(harness.checkpoint())
        harness.restore(parallelism=1)
        self.assert_exactly_once(self.finish(harness), self.expected_records())

    def test_new_split_is_discovered_and_read(self) -> None:
        harness = self.harness()
        harness.read_available()
        added = self.add_split_upstream()
        records = self.finish(harness)
        self.assert_exactly_once(records, [*self.expected_records()])
        read = {self.record_key(row) for r in records for row in self.rows(r)}
        assert {self.record_key(r) for r in added} <= read

    def test_bounded_input_ends_on_every_reader(self) -> None:
        source = self.make_source()
        if source.boundedness is not Boundedness.BOUNDED:
            raise unittest.SkipTest("the source is unbounded")
        harness = SourceHarness(source, self.parallelism)
        harness.run_to_end()
        assert all(slot.ended for slot in harness.slots.values())
        harness.close()
        self.assert_exactly_once(harness.committed(), self.expected_records())


class SourceReaderContract(_ContractBase):
    """A source's reader on its own, fed splits its enumerator made."""

    def splits_and_extents(self, source: AnySource) -> tuple[list[Any], dict[str, SplitExtent]]:
        harness = SourceHarness(source, 1)
        harness.settle()
        splits = harness.reader_splits()[0]
        extents = harness._await(harness.coordinator.latest_positions(splits))
        harness.close()
        return splits, dict(extents)

    def read(self, reader: Any, context: RecordingReaderContext, out: Collector[Any]) -> None:
        for _ in range(100_000):
            status = reader.poll_next(out)
            if status is InputStatus.END_OF_INPUT:
                return
            if status is InputStatus.NOTHING_AVAILABLE and not reader.wait_available(0.05):
                return
        raise AssertionError("the reader never ran out of input")

    def test_reader_reads_every_assigned_split(self) -> None:
        source = self.make_source()
        splits, _ = self.splits_and_extents(source)
        context = RecordingReaderContext()
        reader = source.create_reader(context)
        reader.start()
        reader.add_splits(splits)
        reader.notify_no_more_splits()
        out: Collector[Any] = Collector()
        self.read(reader, context, out)
        reader.close()
        self.assert_exactly_once(list(out), self.expected_records())

    def test_reader_stops_exactly_at_the_planned_position(self) -> None:
        source = self.make_source()
        splits, extents = self.splits_and_extents(source)
        stops = {
            s.split_id: s.position + (extents[s.split_id].latest - s.position) // 2 for s in splits
        }
        context = RecordingReaderContext()
        reader = source.create_reader(context)
        reader.start()
        reader.add_splits(splits, stop_at=stops)
        reader.notify_no_more_splits()
        first: Collector[Any] = Collector()
        self.read(reader, context, first)
        remaining = reader.snapshot_state(1)
        reader.close()
        halted = {sid for sid, stop in stops.items() if stop < extents[sid].latest}
        assert {s.split_id: s.position for s in remaining if s.split_id in halted} == {
            sid: stops[sid] for sid in halted
        }, "a split did not stop exactly at its planned position"
        finished = set(context.finished_ids())
        assert not finished & halted, (
            f"splits stopped by plan reported finished: {finished & halted}"
        )
        # Reading on from the snapshot completes the data, exactly once.
        rest_context = RecordingReaderContext()
        rest = source.create_reader(rest_context)
        rest.start()
        rest.add_splits(remaining)
        rest.notify_no_more_splits()
        second: Collector[Any] = Collector()
        self.read(rest, rest_context, second)
        rest.close()
        self.assert_exactly_once([*first, *second], self.expected_records())
