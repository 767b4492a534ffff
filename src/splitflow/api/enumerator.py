"""The split enumerator and the context the runtime gives it.

The enumerator is the control plane of a source: it discovers splits, assigns them to
readers, keeps ownership, and checkpoints. It runs once per query, in a coordinator on the
driver. Every method of an enumerator is called on ONE coordinator thread, never
concurrently, so an enumerator needs no locks; I/O goes through
:meth:`SplitEnumeratorContext.call_async`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from splitflow.api.events import SourceEvent
from splitflow.api.split import SplitT

EnumStateT = TypeVar("EnumStateT")
T = TypeVar("T")


@dataclass(frozen=True)
class ReaderInfo(Generic[SplitT]):
    """What the coordinator knows of a registered reader.

    ``reported_splits`` are the splits the reader restored from its checkpointed state and
    handed to the enumerator at registration instead of reading them itself. They are
    non-empty only for sources that implement
    :class:`~splitflow.api.source.SupportsSplitReassignmentOnRecovery`, and only when the
    reader restarted from a checkpoint (a global restore, or a partial failover of that
    reader). Until the enumerator assigns them again, nobody reads them: the enumerator owns
    them and must keep them in its snapshot.
    """

    reader_id: int
    location: str | None = None
    reported_splits: tuple[SplitT, ...] = ()


@dataclass(frozen=True)
class SplitExtent:
    """How far a split can be read now.

    ``latest`` is exclusive: positions below it exist now. ``final`` is true when nothing
    will ever follow ``latest`` (the end of a file, the stopping offset of a bounded read):
    a reader that reaches it has finished the split. ``bytes_per_position``, when the source
    can estimate it, is the size of what one position holds (a row's bytes; ``1.0`` where
    positions are byte offsets): what ``maxBytesPerBatch`` plans with. ``available``, when
    the source holds part of a split back (admission control: a file waiting for its turn
    under ``maxFilesPerBatch``), is how far the split exists; ``latest`` how far it may be
    read now. ``trigger(availableNow=True)`` reads up to ``available`` (default: ``latest``).
    ``preexisting``: the split holds data that existed before the split was made (a chunk
    of a table cut as it is read), so a run that reads what exists at its start
    (``availableNow``) reads it although the split appeared after the start.
    """

    latest: int
    final: bool = False
    bytes_per_position: float | None = None
    available: int | None = None
    preexisting: bool = False

    @property
    def exists_to(self) -> int:
        """How far the split exists now (``available``, else ``latest``)."""
        return self.latest if self.available is None else self.available


class Cancellable(Protocol):
    """Handle of a scheduled call; ``cancel()`` stops future runs (idempotent)."""

    def cancel(self) -> None: ...


class Counter(Protocol):
    def inc(self, n: int = 1) -> None: ...

    @property
    def count(self) -> int: ...


class MetricGroup(Protocol):
    """Metrics of a source, reported by the runtime (e.g. in Spark's query progress)."""

    def counter(self, name: str) -> Counter:
        """The counter called ``name``, created on first use."""
        ...

    def gauge(self, name: str, supplier: Callable[[], float | int | None]) -> None:
        """Register a gauge; the runtime calls ``supplier`` on the coordinator thread."""
        ...


class SplitEnumeratorContext(Protocol[SplitT]):
    """What the runtime offers an enumerator: assignment, messaging, threads, metrics.

    Called by: the enumerator, on the coordinator thread, unless a method says otherwise.
    Blocking: no method blocks.
    """

    @property
    def current_parallelism(self) -> int:
        """The number of parallel readers the runtime runs (ids ``0 .. n-1``)."""
        ...

    @property
    def reports_splits_on_registration(self) -> bool:
        """True when readers hand their restored splits back at registration (FLIP-537)."""
        ...

    @property
    def metrics(self) -> MetricGroup: ...

    def registered_readers(self) -> Mapping[int, ReaderInfo[SplitT]]:
        """The readers registered now, by id, with the splits each reported (a read-only view)."""
        ...

    def assign_splits(self, assignment: Mapping[int, Sequence[SplitT]]) -> None:
        """Give each listed reader the listed splits, in addition to what it has.

        Raises: :class:`~splitflow.errors.ContractViolation` if a reader is not registered,
        or a split is assigned twice in one call.
        Guarantees: the reader receives them in order, after everything sent to it before;
        the assignment belongs to exactly one side of every checkpoint.
        """
        ...

    def signal_no_more_splits(self, reader_id: int) -> None:
        """Tell a reader it will get no more splits (bounded sources). Idempotent."""
        ...

    def send_event_to_source_reader(self, reader_id: int, event: SourceEvent) -> None:
        """Send a custom event to a registered reader."""
        ...

    def call_async(
        self,
        callable: Callable[[], T],
        handler: Callable[[T | None, BaseException | None], None],
        *,
        initial_delay: float = 0.0,
        period: float | None = None,
    ) -> Cancellable:
        """Run ``callable`` on a worker thread, then ``handler(result, error)`` here.

        ``callable`` may block (list a directory, ask a broker) and must not touch
        enumerator state. ``handler`` runs on the coordinator thread with either the result
        or the exception. With ``period``, the call repeats ``period`` seconds after each
        handler finished (fixed delay: runs never overlap). An exception escaping
        ``handler`` fails the source.
        """
        ...

    def run_in_coordinator_thread(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the coordinator thread, after what is already queued there.

        May be called from any thread.
        """
        ...

    def set_is_processing_backlog(self, is_backlog: bool) -> None:
        """Tell the runtime the source is reading backlog (favour throughput) or not."""
        ...


class SplitEnumerator(ABC, Generic[SplitT, EnumStateT]):
    """Discovers splits and assigns them to readers. Single-threaded by contract.

    Called by: the coordinator thread, one method at a time, never concurrently.
    Blocking: no method may block on I/O; use ``context.call_async``.
    Lifecycle: ``start`` first; ``snapshot_state`` is never called before ``start`` nor after
    ``close``; ``close`` is called at most once.
    Failure: an exception from any method fails the source; the runtime surfaces it as the
    cause of :class:`~splitflow.errors.SourceFailedError`.
    """

    def start(self) -> None:
        """Start discovery (e.g. schedule a periodic ``call_async``)."""

    @abstractmethod
    def add_reader(self, reader_id: int) -> None:
        """A reader registered; its :class:`ReaderInfo` is in ``context.registered_readers()``.

        Called by: the coordinator thread, after the reader (re)started and registered, and
        after ``add_splits_back`` for that reader on a partial failover.
        Ordering: a reader's reported splits (FLIP-537) are known only from this call on.
        """

    def handle_split_request(self, reader_id: int, host: str | None) -> None:
        """A reader asked for work (pull-based sources, e.g. files). Default: ignore."""

    @abstractmethod
    def add_splits_back(self, splits: Sequence[SplitT], reader_id: int) -> None:
        """Splits assigned to ``reader_id`` after its last completed checkpoint come back.

        Called by: the coordinator thread, only when that reader failed and restarts from
        the last completed checkpoint, before ``add_reader`` for it. The reader never
        acknowledged these splits in a checkpoint, so the enumerator owns them again: treat
        them as never assigned and assign them again.
        """

    def handle_source_event(self, reader_id: int, event: SourceEvent) -> None:
        """A reader sent a custom event. Default: ignore."""

    @abstractmethod
    def snapshot_state(self, checkpoint_id: int) -> EnumStateT:
        """Return the state to restore from: every split the enumerator owns, with position.

        Called by: the coordinator thread, at a checkpoint, after the assignment tracker
        filed the assignments made so far under ``checkpoint_id``.
        Guarantees required: splits reported by readers and not yet assigned again belong
        to the enumerator and MUST be in this state, or they are lost on restore.
        """

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed (the runtime persisted it)."""

    def latest_positions(self, splits: Sequence[SplitT]) -> Mapping[str, SplitExtent]:
        """How far each split can be read now, by split id.

        Called by: the coordinator thread, when a runtime plans bounded slices (Spark: once
        per micro-batch, planned on the driver) and when tracking backlog.
        Blocking: the one enumerator method allowed to block, briefly: the runtime waits
        for the answer anyway. Keep it to one round trip to the external system.
        Default: nothing is known (a runtime that needs positions raises).
        """
        return {}

    def changed_positions(
        self, since: object | None
    ) -> tuple[object, Mapping[str, SplitExtent | None]] | None:
        """The splits whose extent changed since the call that returned token ``since``.

        Optional; lets a runtime that plans every micro-batch ask only for what changed,
        not for every split it holds (a listing's generation, a log position, a catalog's
        version say what changed). Returns ``(token, changes)``: ``changes`` maps the id of
        every split whose extent changed after ``since`` was made to its extent now (as
        :meth:`latest_positions` would give it), or to None where the split cannot be
        told any more (it vanished); the runtime passes ``token`` (any object, never
        persisted) to its next call. The token must be no newer than the extents given
        with it (read together, or the token first): a change between the two is then
        reported again by the next call instead of lost. A split the runtime does not hold
        is ignored, and a split reported although unchanged costs only its look-up; a
        change left out is never planned. ``since`` None: the runtime knows nothing yet;
        ``changes`` may be empty then. None instead of a pair, on any call: the source
        cannot tell now (a token older than its history, a store rewritten); the runtime
        then asks :meth:`latest_positions` for every split it holds and starts again.

        Called by: the coordinator thread, at least once per planning (again after splits
        finish), before :meth:`latest_positions` for the splits the runtime has no extent
        of (all of them at its first call, then splits assigned since, and splits that
        :meth:`latest_positions` left out the time before); the runtime keeps every other
        split's last extent. Blocking: as :meth:`latest_positions`.
        Default: None, changes are not tracked; the runtime then asks
        :meth:`latest_positions` for every split it holds, every time.
        """
        return None

    def event_times(self, splits: Sequence[SplitT]) -> Mapping[str, int]:
        """Event time of the first record at or after each split's position, without reading
        the split (microseconds since the epoch, of :attr:`Source.event_time_column`).

        Called by: the coordinator thread, when a runtime aligns splits by event time
        (Spark's ``maxEventTimeDrift``), for splits with records to read. Blocking: like
        :meth:`latest_positions`, one bounded round trip. Splits the source cannot tell
        are left out (a split with no record there yet, or a source without an index).
        Default: none; splits are then aligned by the event time their readers report.
        """
        return {}

    def positions_after(self, splits: Sequence[SplitT], event_time: int) -> Mapping[str, int]:
        """For each split, the first position at or after its position whose record's event
        time is after ``event_time`` (microseconds), or how far the split exists when no
        record there is: reading up to it reads no record later than ``event_time``.

        Exact where event time never decreases along a split (a log's append time, a
        generated sequence). Called by: the coordinator thread, as :meth:`event_times`.
        Splits the source cannot map are left out (default: all); the runtime then reads
        or pauses them whole.
        """
        return {}

    def backlog_boundaries(self) -> Mapping[str, int]:
        """Splits still reading backlog, each with the position that ends its backlog.

        Called by: the coordinator thread, when a runtime tracks backlog (Spark: once per
        micro-batch); a runtime sends :class:`~splitflow.api.events.BacklogFinishedEvent`
        for a split whose position reached its boundary. Default: none. The mapping may be
        the enumerator's own (an :class:`~splitflow.api.assigner.AssigningSplitEnumerator`
        hands out the same one while it stays the same): read it, do not change it.
        """
        return {}

    def close(self) -> None:
        """Release resources. No other method is called after this."""


__all__ = [
    "Cancellable",
    "Counter",
    "EnumStateT",
    "MetricGroup",
    "ReaderInfo",
    "SplitEnumerator",
    "SplitEnumeratorContext",
    "SplitExtent",
]
