"""The reader side of a source: one SourceReader per parallel reader.

Most connectors do not implement :class:`SourceReader` directly: they write a
:class:`~splitflow.reader.SplitReader` (fetch records of assigned splits) and a
:class:`~splitflow.reader.RecordEmitter` and let :class:`~splitflow.reader.SourceReaderBase`
do the rest, as in Flink's flink-connector-base.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Generic, Protocol, TypeVar

from splitflow.api.events import SourceEvent
from splitflow.api.split import SplitT

RecordT = TypeVar("RecordT")
RecordT_contra = TypeVar("RecordT_contra", contravariant=True)


class InputStatus(enum.Enum):
    """What :meth:`SourceReader.poll_next` found."""

    MORE_AVAILABLE = "more"
    """Call ``poll_next`` again right away."""
    NOTHING_AVAILABLE = "nothing"
    """Nothing now: wait with ``wait_available`` before polling again."""
    END_OF_INPUT = "end"
    """No split left and no more will come: the reader is done."""


class ReaderOutput(Protocol[RecordT_contra]):
    """Where a reader puts what it read (a Spark task's output, a test's list)."""

    def collect(self, record: RecordT_contra) -> None: ...


class SplitOutputs(ReaderOutput[RecordT_contra], Protocol[RecordT_contra]):
    """An output that wants to know each record's split (Flink's per-split output).

    A reader that knows which split a record came from collects it into
    ``output.for_split(split_id)`` instead of ``output`` (as
    :class:`~splitflow.reader.SourceReaderBase` does); the runtime uses this to track each
    split's event time. Records collected into ``output`` itself belong to no known split.
    """

    def for_split(self, split_id: str) -> ReaderOutput[RecordT_contra]: ...


class SourceReaderContext(Protocol):
    """What the runtime offers a reader. Called by the reader's thread."""

    @property
    def reader_id(self) -> int: ...

    @property
    def location(self) -> str | None:
        """Host the reader runs on, if known."""
        ...

    def send_source_event_to_coordinator(self, event: SourceEvent) -> None:
        """Send an event to the enumerator (its ``handle_source_event``)."""
        ...

    def send_split_request(self) -> None:
        """Ask the enumerator for work (its ``handle_split_request``)."""
        ...


class SourceReader(ABC, Generic[RecordT, SplitT]):
    """Reads the splits assigned to one parallel reader.

    Called by: one reader thread; no method is called concurrently with another.
    Blocking: ``poll_next`` must not block; ``wait_available`` is where a reader waits.
    Lifecycle: ``start`` first, ``close`` last; ``snapshot_state`` only between them.
    """

    def start(self) -> None:
        """Open resources. Splits may be added before or after."""

    @abstractmethod
    def poll_next(self, output: ReaderOutput[RecordT]) -> InputStatus:
        """Emit what is ready into ``output`` and say whether more is ready."""

    @abstractmethod
    def wait_available(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds until ``poll_next`` can make progress.

        Returns whether it can. Returns at once when data, an end, or an error is pending.
        """

    @abstractmethod
    def snapshot_state(self, checkpoint_id: int) -> list[SplitT]:
        """The splits this reader owns, each at the first position not yet emitted.

        Guarantees: restoring these splits resumes right after the last record emitted
        before this call. Splits that ended are not included; a split that only reached
        its slice's stop is included, at its stop.
        """

    @abstractmethod
    def add_splits(
        self, splits: Sequence[SplitT], stop_at: Mapping[str, int] | None = None
    ) -> None:
        """Take ownership of ``splits`` and read each from its ``position``.

        ``stop_at`` bounds a split to the slice ``[position, stop)``: the reader emits no
        record at or beyond ``stop`` and considers the split done for now when it gets
        there (Spark plans such a slice per micro-batch on the driver). Without a stop, a
        split is read until its end, or forever.
        """

    @abstractmethod
    def notify_no_more_splits(self) -> None:
        """No split will be added any more: at the end of the current splits, input ends."""

    def handle_source_event(self, event: SourceEvent) -> None:
        """A custom event from the enumerator. Default: ignore."""

    def wake_up(self) -> None:
        """Make a running or the next ``wait_available`` return now. Called by: any thread."""

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """A checkpoint that included this reader's snapshot completed."""

    def close(self) -> None:
        """Release resources (stop fetch threads, close connections)."""
