"""The contract suites' read-twice check fails a reader whose output for a planned slice is
not a function of the slice, and passes one that keeps the rule through a read pinner.

The toy source is the sequence source with a mutable store beside it (a stand-in for a
database table): each record carries the store's value when it was read, or the value a
driver-held pin captured for the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from splitflow.api.events import SourceEvent
from splitflow.api.reader import ReaderOutput, SourceReader, SourceReaderContext
from splitflow.api.source import ReadPinner, SupportsPinnedReads
from splitflow.api.split import SplitState
from splitflow.reader import Positioned, SourceReaderBase
from splitflow.reader.emitter import RecordEmitter
from splitflow.testing import SequenceCatalog, SequenceSource, SequenceSplit
from splitflow.testing.contracts import SourceReaderContract
from splitflow.testing.sequence_reader import SequenceSplitReader


class Store:
    """A value that changes under the readers, as a table's rows do."""

    def __init__(self) -> None:
        self.version = 0
        self.pins: list[tuple[str, int]] = []  # ("pin" | "release", batch)


@dataclass(frozen=True)
class Pinned(SourceEvent):
    """Driver -> every task of a batch: read the store as it was at ``version``."""

    batch: int
    version: int


@dataclass(frozen=True)
class SawVersion(SourceEvent):
    """Reader -> enumerator: the store's version a slice was read at."""

    split_id: str
    version: int


class StampingEmitter(RecordEmitter[Positioned[tuple[str, int]], tuple[str, int, int], Any]):
    def __init__(self, reader: StoreReader, events: bool) -> None:
        self._reader = reader
        self._events = events

    def emit(
        self,
        element: Positioned[tuple[str, int]],
        output: ReaderOutput[tuple[str, int, int]],
        state: SplitState[Any],
    ) -> None:
        version = self._reader.version()
        if self._events:
            self._reader.context.send_source_event_to_coordinator(
                SawVersion(state.split_id, version)
            )
        output.collect((*element.value, 0 if self._events else version))
        state.position = element.next_position


class StoreReader(SourceReaderBase[Any, tuple[str, int, int], SequenceSplit]):
    """Reads the store as it is now, or as the batch's pin says."""

    def __init__(self, source: StoreSource, context: SourceReaderContext) -> None:
        self._store = source.store
        self._pinned: Pinned | None = None
        catalog = source.catalog
        super().__init__(
            lambda: SequenceSplitReader(catalog, 4), StampingEmitter(self, source.events), context
        )

    def version(self) -> int:
        return self._pinned.version if self._pinned is not None else self._store.version

    def handle_source_event(self, event: SourceEvent) -> None:
        if isinstance(event, Pinned):
            self._pinned = event
        super().handle_source_event(event)


class StoreSource(SequenceSource):
    """Records ``(name, i, the store's version)``; with ``events``, the version goes in an
    event per record instead (the records carry 0)."""

    def __init__(self, catalog: SequenceCatalog, store: Store, *, events: bool = False) -> None:
        super().__init__(catalog)
        self.store = store
        self.events = events

    def create_reader(self, context: SourceReaderContext) -> SourceReader[Any, SequenceSplit]:
        return StoreReader(self, context)


class VersionPinner(ReadPinner[SequenceSplit]):
    def __init__(self, store: Store, *, stable: bool = True) -> None:
        self._store = store
        self._stable = stable
        self._held: dict[int, Pinned] = {}

    def pin(self, batch: int, splits: Sequence[SequenceSplit]) -> Pinned:
        self._store.pins.append(("pin", batch))
        if not self._stable or batch not in self._held:
            self._held[batch] = Pinned(batch, self._store.version)
        return self._held[batch]

    def release(self, through_batch: int) -> None:
        self._store.pins.append(("release", through_batch))
        self._held = {b: p for b, p in self._held.items() if b > through_batch}


class PinnedStoreSource(StoreSource, SupportsPinnedReads[SequenceSplit]):
    stable = True

    def create_read_pinner(self) -> VersionPinner:
        return VersionPinner(self.store, stable=self.stable)


class UnstablePinnedStoreSource(PinnedStoreSource):
    stable = False  # pins anew on every call: a broken pinner


class StoreContract(SourceReaderContract):
    """The read-twice check over a store source; the store changes between the reads."""

    source_class: type[StoreSource] = StoreSource
    events = False

    def __init__(self) -> None:
        self.catalog = SequenceCatalog({"a": 5, "b": 3})
        self.store = Store()

    def make_source(self) -> StoreSource:
        return self.source_class(self.catalog, self.store, events=self.events)

    def rows(self, record: Any) -> list[Any]:
        return [record]

    def change_upstream_between_reads(self) -> None:
        self.store.version += 1


def check(contract: StoreContract) -> None:
    contract.test_a_slice_read_twice_gives_the_same_records_and_events()


def test_a_reader_that_reads_the_store_as_it_is_now_fails_the_check() -> None:
    with pytest.raises(AssertionError, match=r"slice \[0, 5\) of split a read twice gave other"):
        check(StoreContract())


def test_a_reader_whose_events_depend_on_the_store_fails_the_check() -> None:
    contract = StoreContract()
    contract.events = True
    with pytest.raises(AssertionError, match="read twice sent other reader events"):
        check(contract)


def test_the_same_reader_passes_when_the_store_does_not_change() -> None:
    contract = StoreContract()
    contract.change_upstream_between_reads = lambda: None  # type: ignore[method-assign]
    check(contract)


def test_a_pinned_source_passes_and_each_evaluation_is_pinned_then_released() -> None:
    contract = StoreContract()
    contract.source_class = PinnedStoreSource
    check(contract)
    # Batch 1 reads a and b, pinned for each evaluation; batch 2 has nothing to read; the
    # pinner's close() releases every pin.
    assert contract.store.pins == [("pin", 1), ("pin", 1), ("release", 1), ("release", 2**63 - 1)]


def test_a_pinner_that_answers_another_event_while_the_pin_is_held_fails_the_check() -> None:
    contract = StoreContract()
    contract.source_class = UnstablePinnedStoreSource
    with pytest.raises(AssertionError, match="the pinner gave another event for the batch"):
        check(contract)


def test_records_appended_past_the_stops_are_read_in_the_next_batch_not_this_one() -> None:
    contract = StoreContract()
    contract.source_class = PinnedStoreSource

    def append() -> None:
        contract.store.version += 1
        contract.catalog.append("a", 2)

    contract.change_upstream_between_reads = append  # type: ignore[method-assign]
    check(contract)
    # Two batches, each pinned twice: the second reads what the first's change appended.
    assert [p for p in contract.store.pins if p[0] == "pin"] == [("pin", 1)] * 2 + [("pin", 2)] * 2


class SealingSequenceContract(SourceReaderContract):
    """The sequence source, whose splits are sealed between the two reads of a slice."""

    def __init__(self) -> None:
        self.catalog = SequenceCatalog({"a": 5, "b": 3})

    def make_source(self) -> SequenceSource:
        return SequenceSource(self.catalog)

    def change_upstream_between_reads(self) -> None:
        for name in self.catalog.lengths():
            if not self.catalog.is_sealed(name):
                self.catalog.seal(name)


def test_sealing_a_sequence_split_between_two_reads_of_its_slice_changes_nothing() -> None:
    """Whether a slice ends its split comes from the plan, not from when it is read: the
    first read (unsealed) and the second (sealed) send the same events."""
    SealingSequenceContract().test_a_slice_read_twice_gives_the_same_records_and_events()
