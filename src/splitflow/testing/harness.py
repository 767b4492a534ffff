"""A deterministic, in-process runtime for one source: coordinator, readers, checkpoints, failures.

:class:`SourceHarness` runs a source's real enumerator (in a :class:`SourceCoordinator` on a
:class:`ManualScheduler` with a virtual clock) and its real readers, one per parallel slot,
all on the calling thread. Nothing happens unless a test says so, so a test can place a
checkpoint, a failure or a restore exactly where it wants and replay it.

It models a Flink job with an exactly-once sink:

* every record a reader emits goes to that reader's output; records emitted before a
  checkpoint that completes are *committed*;
* a partial failover of reader ``r`` drops ``r``'s uncommitted records, closes it, gives the
  enumerator back what ``r`` got after the last completed checkpoint, and starts a new reader
  from ``r``'s state in that checkpoint (which reports its splits, FLIP-537, or resumes
  them itself);
* a global restore drops every uncommitted record and restarts coordinator and readers from
  the last completed checkpoint, with the same or another parallelism.

So :meth:`SourceHarness.committed` after a final checkpoint is what an exactly-once sink
holds: tests compare it with the data, record by record.

>>> from splitflow.testing import SequenceCatalog, SequenceSource, SourceHarness
>>> catalog = SequenceCatalog({"a": 3, "b": 2})
>>> harness = SourceHarness(SequenceSource(catalog, bounded=True), parallelism=2)
>>> harness.run_to_end()
>>> sorted(harness.committed()) == catalog.records()
True
>>> harness.close()
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic

from splitflow.api.enumerator import EnumStateT
from splitflow.api.events import SourceEvent
from splitflow.api.reader import InputStatus, RecordT, SourceReader
from splitflow.api.source import Source, SupportsSplitReassignmentOnRecovery
from splitflow.api.split import SplitT
from splitflow.coordinator.checkpoint import Checkpoint, redistribute_reader_states
from splitflow.coordinator.coordinator import (
    AddSplits,
    NoMoreSplits,
    ReaderEvent,
    ReaderMessage,
    SourceCoordinator,
)
from splitflow.coordinator.scheduler import ManualScheduler
from splitflow.errors import ContractViolation, SourceFailedError
from splitflow.reader.output import Collector

ENUMERATOR = -1
"""Owner id that stands for the enumerator in :meth:`SourceHarness.ownership`."""


class _ReaderContext:
    def __init__(self, harness: SourceHarness[Any, Any, Any], reader_id: int) -> None:
        self._harness = harness
        self._reader_id = reader_id

    @property
    def reader_id(self) -> int:
        return self._reader_id

    @property
    def location(self) -> str | None:
        return "localhost"

    def send_source_event_to_coordinator(self, event: SourceEvent) -> None:
        self._harness.coordinator.handle_source_event(self._reader_id, event)

    def send_split_request(self) -> None:
        self._harness.coordinator.handle_split_request(self._reader_id, self.location)


@dataclass
class _Slot(Generic[RecordT, SplitT]):
    """One parallel reader, as the harness runs it."""

    reader: SourceReader[RecordT, SplitT]
    inbox: list[ReaderMessage[SplitT]] = field(default_factory=list)
    output: Collector[RecordT] = field(default_factory=Collector)
    committed: int = 0  # output[:committed] is committed
    marks: dict[int, int] = field(default_factory=dict)  # checkpoint id -> len(output)
    ended: bool = False


class SourceHarness(Generic[RecordT, SplitT, EnumStateT]):
    """Runs ``source`` with ``parallelism`` readers; see the module doc.

    ``restore_from`` starts from a checkpoint (a global restore) instead of from nothing.
    ``start_readers=False`` leaves the readers to :meth:`start_reader`, one by one.
    """

    def __init__(
        self,
        source: Source[RecordT, SplitT, EnumStateT],
        parallelism: int,
        *,
        restore_from: Checkpoint[SplitT, EnumStateT] | None = None,
        start_readers: bool = True,
    ) -> None:
        self.source = source
        self.parallelism = parallelism
        self.checkpoints: dict[int, Checkpoint[SplitT, EnumStateT]] = {}
        self._aborted: set[int] = set()
        self.last_completed: Checkpoint[SplitT, EnumStateT] | None = restore_from
        self._ids = itertools.count((restore_from.checkpoint_id + 1) if restore_from else 1)
        self._committed_before: list[RecordT] = []
        self._start(restore_from, start_readers)

    # -- lifecycle ----------------------------------------------------------------------

    def _start(
        self, restore_from: Checkpoint[SplitT, EnumStateT] | None, start_readers: bool = True
    ) -> None:
        self.scheduler = ManualScheduler()
        self.coordinator: SourceCoordinator[SplitT, EnumStateT] = SourceCoordinator(
            self.source,
            self.parallelism,
            self,
            scheduler=self.scheduler,
            restored_state=restore_from.enumerator if restore_from else None,
        )
        self._await(self.coordinator.start())
        self.slots: dict[int, _Slot[RecordT, SplitT]] = {}
        # What each reader restarts from on a partial failover: its share of the checkpoint
        # the run started from, until a checkpoint of this run completes.
        self._restore_points: dict[int, list[SplitT]] = (
            redistribute_reader_states(restore_from.readers, self.parallelism)
            if restore_from
            else {}
        )
        if start_readers:
            for reader_id in range(self.parallelism):
                self.start_reader(reader_id)

    def start_reader(self, reader_id: int) -> None:
        """Start reader ``reader_id`` from its restore point and register it."""
        self._start_reader(reader_id, self._restore_points.get(reader_id, []))

    def _start_reader(self, reader_id: int, restored: Sequence[SplitT]) -> None:
        reader = self.source.create_reader(_ReaderContext(self, reader_id))
        reader.start()
        self.slots[reader_id] = _Slot(reader)
        reports = isinstance(self.source, SupportsSplitReassignmentOnRecovery)
        if restored and not reports:
            reader.add_splits(list(restored))
        self._await(
            self.coordinator.register_reader(
                reader_id, "localhost", list(restored) if reports else ()
            )
        )

    def close(self) -> None:
        for slot in self.slots.values():
            slot.reader.close()
        self.coordinator.close()

    # -- the gateway (coordinator -> readers) --------------------------------------------

    def send(self, reader_id: int, message: ReaderMessage[SplitT]) -> None:
        self.slots[reader_id].inbox.append(message)

    # -- driving --------------------------------------------------------------------------

    def _await(self, future: Any) -> Any:
        self.scheduler.run_until_idle()
        if not future.done():
            raise ContractViolation("a coordinator call did not complete when the harness settled")
        return future.result()

    def settle(self) -> None:
        """Run queued coordinator work and deliver every message to its reader."""
        while True:
            self.scheduler.run_until_idle()
            pending = [(r, s) for r, s in sorted(self.slots.items()) if s.inbox]
            if not pending:
                break
            for reader_id, _ in pending:
                self.deliver(reader_id)
        self.raise_if_failed()

    def deliver(self, reader_id: int) -> None:
        """Hand ``reader_id`` the messages sent to it so far."""
        slot = self.slots[reader_id]
        messages, slot.inbox = slot.inbox, []
        for message in messages:
            if isinstance(message, AddSplits):
                slot.reader.add_splits(list(message.splits))
            elif isinstance(message, NoMoreSplits):
                slot.reader.notify_no_more_splits()
            elif isinstance(message, ReaderEvent):
                slot.reader.handle_source_event(message.event)

    def advance(self, seconds: float) -> None:
        """Move the virtual clock (periodic discovery fires), then settle."""
        self.scheduler.advance(seconds)
        self.settle()

    def raise_if_failed(self) -> None:
        failure = self.coordinator.failure
        if failure is not None:
            raise SourceFailedError(f"the source failed: {failure!r}") from failure

    def poll(self, reader_id: int, max_polls: int = 1) -> InputStatus:
        """Call ``poll_next`` on one reader up to ``max_polls`` times (stops when not MORE)."""
        slot = self.slots[reader_id]
        status = InputStatus.NOTHING_AVAILABLE
        for _ in range(max_polls):
            status = slot.reader.poll_next(slot.output)
            self.scheduler.run_until_idle()
            if status is not InputStatus.MORE_AVAILABLE:
                break
        slot.ended = status is InputStatus.END_OF_INPUT
        return status

    def read_available(self, max_rounds: int = 10_000) -> None:
        """Settle and poll every reader until none has anything available now."""
        for _ in range(max_rounds):
            self.settle()
            busy = False
            for reader_id in sorted(self.slots):
                if self.poll(reader_id, max_polls=1000) is InputStatus.MORE_AVAILABLE:
                    busy = True
            self.settle()
            if not busy and not any(s.inbox for s in self.slots.values()):
                return
        raise ContractViolation(f"readers still had data after {max_rounds} rounds")

    def run_to_end(self) -> None:
        """Read a bounded source to its end, then checkpoint so everything is committed."""
        self.read_available()
        if not all(slot.ended for slot in self.slots.values()):
            raise ContractViolation("run_to_end: input has not ended (is the source bounded?)")
        self.complete(self.checkpoint())

    # -- checkpoints ----------------------------------------------------------------------

    def checkpoint(self) -> int:
        """Take a checkpoint: enumerator first, then every reader; returns its id.

        Raises :class:`~splitflow.errors.CheckpointDeclinedError` while readers register.
        """
        checkpoint_id = next(self._ids)
        enumerator_state = self._await(self.coordinator.checkpoint(checkpoint_id))
        readers: dict[int, tuple[SplitT, ...]] = {}
        for reader_id, slot in sorted(self.slots.items()):
            self.deliver(reader_id)  # sent before the coordinator's snapshot: before the cut
            readers[reader_id] = tuple(slot.reader.snapshot_state(checkpoint_id))
            slot.marks[checkpoint_id] = len(slot.output)
        self._await(self.coordinator.release_held_messages())
        self.checkpoints[checkpoint_id] = Checkpoint(checkpoint_id, enumerator_state, readers)
        return checkpoint_id

    def complete(self, checkpoint_id: int) -> None:
        """The checkpoint is durable: commit output up to it, tell coordinator and readers.

        Raises :class:`~splitflow.errors.ContractViolation` for a checkpoint a failure
        aborted (taken before a failover, it holds state the failover rolled back) or one
        older than the last completed checkpoint.
        """
        if checkpoint_id in self._aborted:
            raise ContractViolation(
                f"checkpoint {checkpoint_id} was aborted by a failure after it was taken"
            )
        if self.last_completed is not None and checkpoint_id <= self.last_completed.checkpoint_id:
            raise ContractViolation(
                f"checkpoint {checkpoint_id} is not newer than the last completed one, "
                f"{self.last_completed.checkpoint_id}"
            )
        self.last_completed = self.checkpoints[checkpoint_id]
        self._restore_points = {r: list(ss) for r, ss in self.last_completed.readers.items()}
        for slot in self.slots.values():
            if checkpoint_id in slot.marks:
                slot.committed = max(slot.committed, slot.marks[checkpoint_id])
            slot.marks = {c: m for c, m in slot.marks.items() if c > checkpoint_id}
            slot.reader.notify_checkpoint_complete(checkpoint_id)
        self._await(self.coordinator.notify_checkpoint_complete(checkpoint_id))
        self.settle()

    # -- failures -------------------------------------------------------------------------

    def _abort_pending(self) -> None:
        """A failure aborts every checkpoint taken and not completed (as Flink does)."""
        done = self.last_completed.checkpoint_id if self.last_completed else 0
        self._aborted.update(c for c in self.checkpoints if c > done)

    def fail_reader(self, reader_id: int) -> None:
        """Partial failover of one reader, restarted from the last completed checkpoint.

        Checkpoints taken and not completed are aborted.
        """
        self._abort_pending()
        slot = self.slots.pop(reader_id)
        self._committed_before.extend(slot.output[: slot.committed])
        slot.reader.close()
        restored_id = self.last_completed.checkpoint_id if self.last_completed else None
        self._await(self.coordinator.reader_failed(reader_id, restored_id))
        self.start_reader(reader_id)
        self.settle()

    def restore(self, parallelism: int | None = None) -> None:
        """Global failover: restart everything from the last completed checkpoint.

        ``parallelism`` changes the number of readers (a rescale). Checkpoints taken and not
        completed are aborted.
        """
        self._abort_pending()
        for slot in self.slots.values():
            self._committed_before.extend(slot.output[: slot.committed])
            slot.reader.close()
        self.coordinator.close()
        if parallelism is not None:
            self.parallelism = parallelism
        self._start(self.last_completed)
        self.settle()

    # -- what tests look at ---------------------------------------------------------------

    def committed(self) -> list[RecordT]:
        """Every committed record, across failures and restores, in commit order per reader."""
        current = [r for _, s in sorted(self.slots.items()) for r in s.output[: s.committed]]
        return [*self._committed_before, *current]

    def emitted(self) -> list[RecordT]:
        """Committed records plus what live readers emitted since the last checkpoint."""
        live = [r for _, s in sorted(self.slots.items()) for r in s.output[s.committed :]]
        return [*self.committed(), *live]

    def reader_splits(self) -> dict[int, list[SplitT]]:
        """What each live reader holds now, including splits sent to it and not delivered."""
        held: dict[int, list[SplitT]] = {}
        for reader_id, slot in sorted(self.slots.items()):
            splits = list(slot.reader.snapshot_state(-1))
            for message in slot.inbox:
                if isinstance(message, AddSplits):
                    splits.extend(message.splits)
            held[reader_id] = splits
        return held

    def ownership(self, enumerator_owned: Callable[[Any], Iterable[str]]) -> dict[str, list[int]]:
        """Split id -> every party holding it (reader ids, :data:`ENUMERATOR`).

        ``enumerator_owned(enumerator)`` lists the ids the enumerator owns (for an
        :class:`~splitflow.api.assigner.AssigningSplitEnumerator`:
        :func:`assigning_enumerator_owned`). Exactly one holder per unfinished split is the
        invariant.
        """
        owners: dict[str, list[int]] = {}
        for sid in self._await(self.coordinator.run(lambda e: list(enumerator_owned(e)))):
            owners.setdefault(sid, []).append(ENUMERATOR)
        for reader_id, splits in self.reader_splits().items():
            for split in splits:
                owners.setdefault(split.split_id, []).append(reader_id)
        return owners

    def loads(self) -> dict[int, int]:
        """Number of splits each live reader holds."""
        return {r: len(ss) for r, ss in self.reader_splits().items()}


def assigning_enumerator_owned(enumerator: Any) -> list[str]:
    """Ids an :class:`~splitflow.api.assigner.AssigningSplitEnumerator` owns itself."""
    return [s.split_id for s in enumerator.unassigned_splits()] + list(enumerator.awaiting_report())


def count_duplicates(records: Iterable[Any]) -> Mapping[Any, int]:
    """Records seen more than once, with their counts."""
    seen: dict[Any, int] = {}
    for record in records:
        seen[record] = seen.get(record, 0) + 1
    return {r: n for r, n in seen.items() if n > 1}
