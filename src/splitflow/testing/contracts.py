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

:class:`SourceReaderContract` also checks that a reader's output for a planned slice is a
function of the slice (Spark reads a batch more than once): every planned slice is read
twice, and a connector whose upstream is live overrides
:meth:`~_ContractBase.change_upstream_between_reads` to change it between the reads::

        def change_upstream_between_reads(self):
            self.table.update_some_rows()             # as the application would
"""

from __future__ import annotations

import time
import unittest
from collections.abc import Hashable, Sequence
from typing import Any

from splitflow.api.enumerator import SplitExtent
from splitflow.api.events import SourceEvent, SplitsFinishedEvent
from splitflow.api.reader import InputStatus
from splitflow.api.source import Boundedness, ReadPinner, Source, SupportsPinnedReads
from splitflow.api.split import with_position
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

    def change_upstream_between_reads(self) -> None:
        """Change the upstream data the way a live system does, between two reads of the
        same planned slices (the read-twice check of :class:`SourceReaderContract`): write
        to the tables being read, produce past the planned stops, add files. Called once
        per planned batch. Default: nothing changes."""

    def slice_rows(self, record: Any) -> list[Hashable]:
        """The rows of one emitted record as the read-twice check compares them (default:
        :meth:`record_key` of each of :meth:`rows`). Override to compare more of each row
        (metadata columns the key leaves out)."""
        return [self.record_key(row) for row in self.rows(record)]

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

    def test_changed_positions_tell_what_latest_positions_tells(self) -> None:
        """Where the enumerator tracks changes (``changed_positions``), the extents a
        runtime keeps from them after the upstream changed are those ``latest_positions``
        gives then."""
        harness = SourceHarness(self.make_source(), 1)
        harness.settle()
        splits = harness.reader_splits()[0]
        tracked = harness._await(harness.coordinator.changed_positions(None))
        if tracked is None:
            harness.close()
            raise unittest.SkipTest("the enumerator does not track changes")
        token, _ = tracked
        kept = dict(harness._await(harness.coordinator.latest_positions(splits)))
        self.change_upstream_between_reads()
        for _ in range(2):  # a token's changes, then none or those made since
            tracked = harness._await(harness.coordinator.changed_positions(token))
            assert tracked is not None, "changed_positions stopped tracking changes"
            token, changes = tracked
            for sid in changes.keys() & {split.split_id for split in splits}:
                extent = changes[sid]
                if extent is None:
                    kept.pop(sid, None)
                else:
                    kept[sid] = extent
            now = dict(harness._await(harness.coordinator.latest_positions(splits)))
            assert kept == now, f"kept from changes {kept}, latest_positions {now}"
        harness.close()

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

    # -- the read-twice check -----------------------------------------------------------

    read_twice_batches = 2
    """Batches the read-twice check plans one after the other: the slices the enumerator
    assigns first, then those that follow once they are read (more records past the first
    stops, new splits, the PostgreSQL log after its snapshot's chunks)."""

    slice_idle_timeout = 30.0
    """Seconds a slice's read may wait for records before its stop (a Spark task's
    ``readerIdleTimeout``) before the check fails."""

    def test_a_slice_read_twice_gives_the_same_records_and_events(self) -> None:
        """A reader's output for a planned slice is a function of the slice.

        Spark may evaluate a micro-batch more than once (several actions in
        ``foreachBatch``, ``MERGE``, retried and speculative tasks, a stage recomputed
        after a lost executor). So the check plans batches as the Spark runtime does (the
        enumerator's splits, each from its position up to the latest position it reports),
        reads every slice twice, each time in a fresh reader of its own (a task), with
        :meth:`change_upstream_between_reads` in between, and compares the records of each
        slice, in order, and the reader's events. A :class:`SupportsPinnedReads` source is
        pinned per evaluation through its :class:`ReadPinner`, as the runtime does.
        """
        source = self.make_source()
        pinner = source.create_read_pinner() if isinstance(source, SupportsPinnedReads) else None
        harness = SourceHarness(source, 1)  # the enumerator, and what it assigns
        held: dict[str, Any] = {}  # split id -> the split at its next slice's start
        gone: set[str] = set()  # finished splits
        compared = 0
        try:
            harness.settle()
            for batch in range(1, self.read_twice_batches + 1):
                for split in harness.reader_splits()[0]:  # what the enumerator assigned since
                    if split.split_id not in held and split.split_id not in gone:
                        held[split.split_id] = split
                extents = harness._await(harness.coordinator.latest_positions(list(held.values())))
                slices = [
                    (split, extents[sid].latest)
                    for sid, split in held.items()
                    if sid in extents and extents[sid].latest > split.position
                ]
                reads: dict[str, tuple[list[Hashable], list[SourceEvent]]] = {}
                if slices:
                    first = self._evaluate(source, pinner, batch, slices)
                    self.change_upstream_between_reads()
                    second = self._evaluate(source, pinner, batch, slices)
                    if pinner is not None:
                        pinner.release(batch)
                    self._assert_same_reads(batch, slices, first, second)
                    reads = first[1]
                    compared += sum(len(rows) for rows, _ in reads.values())
                # On to the next batch: the slices were read; the enumerator gets the events.
                for split, stop in slices:
                    held[split.split_id] = with_position(split, stop)
                    extent = extents[split.split_id]
                    if extent.final and stop >= extent.latest:
                        gone.add(split.split_id)
                for _, events in reads.values():
                    for event in events:
                        if isinstance(event, SplitsFinishedEvent):
                            gone.update(event.split_ids)
                        harness.coordinator.handle_source_event(0, event)
                for sid in gone:
                    held.pop(sid, None)
                harness.advance(self.discovery_seconds)
        finally:
            if pinner is not None:
                pinner.close()
            harness.close()
        assert compared > 0, "no planned slice held a record: the check compared nothing"

    def _evaluate(
        self,
        source: AnySource,
        pinner: ReadPinner[Any] | None,
        batch: int,
        slices: Sequence[tuple[Any, int]],
    ) -> tuple[SourceEvent | None, dict[str, tuple[list[Hashable], list[SourceEvent]]]]:
        """One evaluation of a planned batch: pin it (as the runtime does on every
        evaluation), then read each slice in a fresh reader. Returns the pin's event and,
        per split id, the slice's rows (:meth:`slice_rows`) and the reader's events."""
        pinned = pinner.pin(batch, [split for split, _ in slices]) if pinner else None
        reads = {
            split.split_id: self._read_slice(source, split, stop, pinned) for split, stop in slices
        }
        return pinned, reads

    def _read_slice(
        self, source: AnySource, split: Any, stop: int, pinned: SourceEvent | None
    ) -> tuple[list[Hashable], list[SourceEvent]]:
        """Read ``split`` from its position up to ``stop`` as a Spark task does."""
        context = RecordingReaderContext()
        reader = source.create_reader(context)
        reader.start()
        out: Collector[Any] = Collector()
        where = f"slice [{split.position}, {stop}) of split {split.split_id}"
        try:
            if pinned is not None:
                reader.handle_source_event(pinned)
            reader.add_splits([split], stop_at={split.split_id: stop})
            reader.notify_no_more_splits()
            deadline = time.monotonic() + 10 * self.slice_idle_timeout
            while True:
                status = reader.poll_next(out)
                if status is InputStatus.END_OF_INPUT:
                    break
                if status is InputStatus.NOTHING_AVAILABLE and not reader.wait_available(
                    self.slice_idle_timeout
                ):
                    raise AssertionError(
                        f"{where}: nothing arrived for {self.slice_idle_timeout:g}s before the "
                        "planned stop"
                    )
                if time.monotonic() > deadline:
                    raise AssertionError(f"{where}: the reader never reached END_OF_INPUT")
        finally:
            reader.close()
        return [row for record in out for row in self.slice_rows(record)], list(context.events)

    @staticmethod
    def _assert_same_reads(
        batch: int,
        slices: Sequence[tuple[Any, int]],
        first: tuple[SourceEvent | None, dict[str, tuple[list[Hashable], list[SourceEvent]]]],
        second: tuple[SourceEvent | None, dict[str, tuple[list[Hashable], list[SourceEvent]]]],
    ) -> None:
        assert first[0] == second[0], (
            f"batch {batch}: the pinner gave another event for the batch while its pin was "
            f"held: {first[0]!r}, then {second[0]!r}"
        )
        for split, stop in slices:
            sid = split.split_id
            where = f"batch {batch}, slice [{split.position}, {stop}) of split {sid}"
            (rows_1, events_1), (rows_2, events_2) = first[1][sid], second[1][sid]
            if rows_1 != rows_2:
                at = next(
                    (i for i, (a, b) in enumerate(zip(rows_1, rows_2, strict=False)) if a != b),
                    min(len(rows_1), len(rows_2)),
                )
                raise AssertionError(
                    f"{where} read twice gave other records: {len(rows_1)} rows, then "
                    f"{len(rows_2)}; they first differ at row {at}: "
                    f"{rows_1[at] if at < len(rows_1) else '(none)'!r}, then "
                    f"{rows_2[at] if at < len(rows_2) else '(none)'!r}"
                )
            assert events_1 == events_2, (
                f"{where} read twice sent other reader events: {events_1!r}, then {events_2!r}"
            )
