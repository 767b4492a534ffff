"""The Source: a factory of one split enumerator and many split readers."""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Generic

from splitflow.api.enumerator import EnumStateT, SplitEnumerator, SplitEnumeratorContext
from splitflow.api.events import SourceEvent
from splitflow.api.reader import RecordT, SourceReader, SourceReaderContext
from splitflow.api.split import Codec, SplitT


class Boundedness(enum.Enum):
    BOUNDED = "bounded"
    """All splits are known to end; input ends once every split has (batch reads)."""
    CONTINUOUS_UNBOUNDED = "continuous_unbounded"
    """Splits may never end and new splits may appear (streaming reads)."""


class Source(ABC, Generic[RecordT, SplitT, EnumStateT]):
    """A factory of the enumerator (control plane) and readers (data plane) of one source.

    A Source holds only configuration: it is pickled and shipped to every reader, so keep it
    small, picklable, and free of open connections or threads. Every factory method may be
    called in another process than the one that built the Source.
    """

    @property
    @abstractmethod
    def boundedness(self) -> Boundedness: ...

    @abstractmethod
    def create_enumerator(
        self, context: SplitEnumeratorContext[SplitT]
    ) -> SplitEnumerator[SplitT, EnumStateT]:
        """A new enumerator for a query that starts from nothing.

        Called by: the coordinator thread, once per query run, before any reader registers.
        """

    @abstractmethod
    def restore_enumerator(
        self, context: SplitEnumeratorContext[SplitT], state: EnumStateT
    ) -> SplitEnumerator[SplitT, EnumStateT]:
        """An enumerator that resumes from a checkpoint (a global restore).

        Called by: the coordinator thread, once, instead of ``create_enumerator``.
        """

    @abstractmethod
    def create_reader(self, context: SourceReaderContext) -> SourceReader[RecordT, SplitT]:
        """A reader for one parallel slot. Called in the reader's process (a Spark task)."""

    @property
    @abstractmethod
    def split_codec(self) -> Codec[SplitT]:
        """Encodes splits for checkpoints and Spark offsets."""

    @property
    @abstractmethod
    def enumerator_state_codec(self) -> Codec[EnumStateT]:
        """Encodes the enumerator's snapshot for checkpoints."""

    @property
    def estimates_size(self) -> bool:
        """Whether the enumerator's ``latest_positions`` gives every split a
        ``bytes_per_position`` (a byte budget per batch needs it). Default: no."""
        return False

    @property
    def needs_reader_events(self) -> bool:
        """Whether the enumerator cannot go on without the events its readers send (a CDC
        chunk's watermark, without which the log never starts): the Spark runtime then fails
        the query when a completed batch's tasks left none, instead of warning. Default: no."""
        return False

    @property
    def event_time_column(self) -> str | None:
        """The column of the source's records that holds their event time, if it has one
        (Kafka's record timestamp, a change's commit time). The enumerator's
        :meth:`~splitflow.api.enumerator.SplitEnumerator.event_times` and
        :meth:`~splitflow.api.enumerator.SplitEnumerator.positions_after` answer for this
        column. Default: none (a user names one with the ``eventTimeColumn`` option)."""
        return None


class SupportsSplitReassignmentOnRecovery:
    """Mix-in: on recovery, readers hand their splits to the enumerator (FLIP-537).

    A restarting reader of such a source does not resume its restored splits itself: it
    reports them at registration (``ReaderInfo.reported_splits``) and reads only what the
    enumerator assigns. The enumerator is then the single source of truth for ownership and
    can rebalance on a global restore or a change of parallelism. It must tell apart:

    1. splits reported during a global restore (its own state has them as "with readers"):
       redistribute them;
    2. splits reported by a reader in a partial failover (its assignment map lists that
       reader as their owner): take them back and assign them again; ignore splits its map
       says another reader owns now;
    3. splits given back by ``add_splits_back`` (assigned after the last completed
       checkpoint, never acknowledged): forget that assignment and assign them again.

    :class:`~splitflow.api.assigner.AssigningSplitEnumerator` implements all three.
    """


class ReadPinner(ABC, Generic[SplitT]):
    """Holds, on the driver, what makes every read of a planned batch return the same records.

    The rule every connector keeps: a reader's output for a planned slice is a function of
    the slice. A runtime may read a slice more than once (Spark evaluates a micro-batch
    again for every action on it in ``foreachBatch``, for a ``MERGE``, a retried or
    speculative task, a stage recomputed after a lost executor), and each read must give the
    same records, with the same reader events. Most sources get this from their data:
    an offset range of a log, the byte range of an immutable file. A source that reads a
    mutable store (a table's snapshot chunk) cannot, unless something outlives the single
    read: a database snapshot exported by the driver and imported by every task, say.
    That something is pinned here, per batch.

    Lifecycle: one pinner per query run, made by
    :meth:`SupportsPinnedReads.create_read_pinner` in the driver process.

    Called by: the runtime's planning thread (on Spark, the streaming runner's main thread),
    one call at a time.
    """

    @abstractmethod
    def pin(self, batch: int, splits: Sequence[SplitT]) -> SourceEvent | None:
        """Pin what batch ``batch`` reads; return the event its readers need to read it.

        ``splits``: the splits the batch reads, each at the position its slice starts.
        The runtime hands the returned event to the reader of every task of the batch
        (``SourceReader.handle_source_event``) before its splits; ``None``: the batch needs
        nothing pinned.

        Called: at least once per batch, before any of its tasks runs, and again for each
        later evaluation of the batch (return the same event while the pin is held). After
        a driver restart, a runtime that kept the batch's event calls :meth:`resume`
        instead. Blocking: may block briefly (a round trip to the store).
        """

    def resume(
        self, batch: int, splits: Sequence[SplitT], pinned: SourceEvent
    ) -> SourceEvent | None:
        """Batch ``batch`` is read again by a restarted driver; ``pinned`` is the event
        :meth:`pin` gave its reads before (the runtime keeps it with the batch's state, on
        Spark with ``stateDir``). Return the event its reads use from now on, and hold it as
        :meth:`pin` would.

        Return ``pinned`` itself (and hold it) where the pin outlives the driver, a log
        position say: the replay then reads exactly what the first evaluation read, so a
        sink may keep either's output. The default pins anew (:meth:`pin`), for a pin that
        ends with its driver (an exported snapshot ends with its session): the replay's
        reads then all see the new pin, and the sink must keep the replay's output or
        skip the replay unread.
        """
        del pinned
        return self.pin(batch, splits)

    @abstractmethod
    def release(self, through_batch: int) -> None:
        """Batches up to ``through_batch`` have completed: release their pins.

        Called: when the runtime knows no evaluation of those batches can follow (on Spark,
        when the next batch is planned, or the batch is committed). Idempotent.
        """

    def close(self) -> None:
        """Release every pin. Called once when the query run ends; not guaranteed (a
        killed driver releases nothing: the store must free what a dead client held)."""
        self.release(2**63 - 1)


class SupportsPinnedReads(Generic[SplitT]):
    """Mix-in of a :class:`Source` whose slices read the same only under a driver-held pin
    (see :class:`ReadPinner`). Without a runtime that pins (a batch read, the test harness),
    its readers must still read correctly, each read on its own terms."""

    @abstractmethod
    def create_read_pinner(self) -> ReadPinner[SplitT]:
        """A new pinner for one query run. Called by: the runtime, on the driver, once."""
