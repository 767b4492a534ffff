"""What a connector writes to read splits: a :class:`SplitReader` and the batches it returns.

A split reader fetches raw elements of the splits it holds, grouped by split id
(:class:`RecordsBySplits`). It knows nothing of output, state or checkpoints: a
:class:`~splitflow.reader.RecordEmitter` turns each element into output and moves the split's
position, and :class:`~splitflow.reader.SourceReaderBase` does the bookkeeping. This is
Flink's ``SplitReader`` / ``RecordsWithSplitIds`` from flink-connector-base.

An element is opaque to this layer: a single row, or a whole ``pyarrow.RecordBatch`` that
covers many positions. Nothing here assumes one element is one position.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from splitflow.api.split import SplitT
from splitflow.errors import ContractViolation

E = TypeVar("E")
"""The element a split reader fetches (a row, a batch of rows, a positioned wrapper)."""


@dataclass(frozen=True)
class SplitSlice(Generic[SplitT]):
    """A split to read from its ``position`` up to ``stop`` (exclusive), or on without a stop.

    On Spark the driver plans one slice ``[split.position, stop)`` per split and micro-batch,
    and a replay of the batch reads the same slice, so a split reader must stop exactly
    there: it never returns an element that covers a position at or beyond ``stop``, and it
    reports the split finished (:meth:`RecordsBySplits.mark_finished`) once it has returned
    everything below ``stop``.

    Raises: :class:`~splitflow.errors.ContractViolation` if ``stop`` is before the split's
    position.

    >>> from splitflow.testing.sequence import SequenceSplit
    >>> piece = SplitSlice(SequenceSplit("orders", position=10), stop=15)
    >>> piece.split_id, piece.start, piece.clamp(12), piece.clamp(40)
    ('orders', 10, 12, 15)
    >>> SplitSlice(SequenceSplit("orders")).clamp(40)
    40
    """

    split: SplitT
    stop: int | None = None

    def __post_init__(self) -> None:
        if self.stop is not None and self.stop < self.split.position:
            raise ContractViolation(
                f"slice of split {self.split.split_id!r} stops at {self.stop}, before the "
                f"split's position {self.split.position}: a slice is [position, stop)"
            )

    @property
    def split_id(self) -> str:
        return self.split.split_id

    @property
    def start(self) -> int:
        """The first position to read: the split's own ``position``."""
        return self.split.position

    def clamp(self, available: int) -> int:
        """How far reading may go now, exclusive, when positions below ``available`` exist.

        That is ``min(available, stop)``, or ``available`` without a stop.
        """
        return available if self.stop is None else min(available, self.stop)


@dataclass
class RecordsBySplits(Generic[E]):
    """What one :meth:`SplitReader.fetch` returns: elements per split, and finished splits.

    ``records``: split id -> elements of that split, in the split's order. A split reader
    may return elements of any subset of its splits; each list continues exactly where the
    previous fetch of that split stopped.

    ``finished``: splits this reader is done with, after the elements in this batch: each
    reached its slice's stop, or its end. The split reader drops them; it never returns
    elements of a finished split again.

    ``ended``: the subset of ``finished`` whose split itself ended and will never yield
    more (the last record of a bounded split or a file). Those are reported to the
    enumerator and dropped from snapshots; splits that only reached their stop stay in the
    snapshot at their position.

    ``cut``: the subset of ``finished`` whose slice ends before its stop, where the emitter
    left the position (a CDC log at a schema change). It must end there at every read of
    the slice; the reader tells the runtime (:class:`~splitflow.api.events.SliceEndedEvent`)
    and the split's next slice starts there.

    Thread: built by the thread that runs ``fetch``, then handed over; not shared.

    >>> batch: RecordsBySplits[str] = RecordsBySplits()
    >>> batch.add_all("a", ["a0", "a1"])
    >>> batch.mark_ended("a")
    >>> batch.mark_finished("b")
    >>> batch.records, sorted(batch.finished), sorted(batch.ended), batch.is_empty()
    ({'a': ['a0', 'a1']}, ['a', 'b'], ['a'], False)
    """

    records: dict[str, list[E]] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)
    ended: set[str] = field(default_factory=set)
    cut: set[str] = field(default_factory=set)

    def add(self, split_id: str, element: E) -> None:
        """Append one element of ``split_id``."""
        self.records.setdefault(split_id, []).append(element)

    def add_all(self, split_id: str, elements: Iterable[E]) -> None:
        """Append elements of ``split_id``, in order. An empty iterable adds nothing."""
        items = list(elements)
        if items:
            self.records.setdefault(split_id, []).extend(items)

    def mark_finished(self, split_id: str) -> None:
        """``split_id`` reached its slice's stop: this reader is done with it for now."""
        self.finished.add(split_id)

    def mark_ended(self, split_id: str) -> None:
        """``split_id`` reached its end and will never yield more (implies finished)."""
        self.finished.add(split_id)
        self.ended.add(split_id)

    def mark_cut(self, split_id: str) -> None:
        """``split_id``'s slice ends where it is, before its stop (implies finished)."""
        self.finished.add(split_id)
        self.cut.add(split_id)

    def split_ids(self) -> set[str]:
        """Every split id this batch mentions (with elements, finished or ended)."""
        return set(self.records) | self.finished | self.ended

    def is_empty(self) -> bool:
        """True when the batch has no element and finishes no split (nothing was ready)."""
        return not self.finished and not self.ended and not any(self.records.values())


class SplitReader(ABC, Generic[E, SplitT]):
    """Fetches elements of the splits it holds. The one class most connectors write.

    Called by: ONE fetch thread: the reader's own thread in synchronous mode, or a fetcher
    thread of :class:`~splitflow.reader.SourceReaderBase` with ``fetch_threads=N``. Only
    :meth:`wake_up` is called from another thread. Write single-threaded code otherwise.
    Ordering: ``handle_splits_changes`` and ``remove_splits`` are applied between fetches,
    in the order the reader received them; ``close`` is last.
    Positions: a split reader never moves a split's position; it returns elements in split
    order and the :class:`~splitflow.reader.RecordEmitter` moves the position.
    """

    @abstractmethod
    def handle_splits_changes(self, added: Sequence[SplitSlice[SplitT]]) -> None:
        """Start reading ``added`` splits, each from ``slice.start`` up to ``slice.stop``.

        Called by: the fetch thread, between fetches.
        Blocking: may block briefly (open a connection, seek); a long wait delays all
        splits of this split reader.
        Guarantees: a split id is never added twice while this split reader holds it.
        Errors: an exception fails the reader; it surfaces from ``poll_next`` naming the
        added splits.
        """

    @abstractmethod
    def remove_splits(self, split_ids: Sequence[str]) -> None:
        """Stop reading ``split_ids`` and forget them (the enumerator removed them).

        Called by: the fetch thread, between fetches; only with ids this split reader holds
        and has not reported finished.
        Guarantees required: no element of these splits is returned after this call.
        """

    @abstractmethod
    def fetch(self) -> RecordsBySplits[E]:
        """Return the elements that are ready now, grouped by split.

        Called by: the fetch thread, in a loop, only while it holds unfinished splits.
        Blocking: may block briefly (a long poll), but must return promptly, possibly
        empty, after :meth:`wake_up`. In synchronous mode a fetch runs inside
        ``poll_next``, so a fetch that blocks there should use ``fetch_threads``. An empty
        result means nothing is ready: the caller waits ``idle_backoff`` seconds (or until
        woken) before it fetches again.
        Guarantees required: per split, elements continue where the last fetch stopped,
        never reach a slice's stop, and stop for good once the split is reported finished.
        Errors: an exception fails the reader; it surfaces from ``poll_next`` as the same
        exception, with a note naming the splits being read.
        """

    @abstractmethod
    def wake_up(self) -> None:
        """Make a blocked :meth:`fetch` return now (possibly empty).

        Called by: any thread, possibly while ``fetch`` runs on the fetch thread: when
        splits are added or removed, when the reader is woken, and on close.
        Blocking: must not block. If no fetch is running, the next one may return early.
        """

    def close(self) -> None:
        """Release connections and buffers.

        Called by: the fetch thread, once, after the last fetch (also after a failure).
        """


__all__ = ["E", "RecordsBySplits", "SplitReader", "SplitSlice"]
