"""Source events: the custom messages between an enumerator and its readers.

Events are frozen dataclasses, so they compare by value and pickle; a runtime that must
carry them across processes (Spark) pickles them, also into its checkpoint. Connectors
define their own by subclassing :class:`SourceEvent`; the ones below are understood by
splitflow's own bases. An event class is part of a connector's checkpoint format: renaming
or moving one makes a checkpoint that carries it fail to restore (the error names the batch
or the file), unless the old name stays as an alias.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class SourceEvent:
    """Base of every event sent between a split enumerator and its readers."""


@dataclass(frozen=True)
class SplitsFinishedEvent(SourceEvent):
    """Reader -> enumerator: these splits reached their end and will never yield more.

    Sent by :class:`~splitflow.reader.SourceReaderBase` for bounded splits. The enumerator
    forgets their ownership; a finished split is never assigned again.
    """

    split_ids: tuple[str, ...]


@dataclass(frozen=True)
class SplitsRemovedEvent(SourceEvent):
    """Enumerator -> reader: these splits no longer exist (a deleted topic or partition).

    The reader stops reading them and drops them from its state.
    """

    split_ids: tuple[str, ...]


@dataclass(frozen=True)
class BacklogFinishedEvent(SourceEvent):
    """Reader (or runtime) -> enumerator: these splits reached their backlog boundary.

    Sent once per split and boundary. On Spark the driver sends it when the batch that
    read a split up to its boundary has completed (it knows every split's position then),
    so a retried or replayed task never sends it twice.
    """

    split_ids: tuple[str, ...]


@dataclass(frozen=True)
class BacklogStartedEvent(SourceEvent):
    """Runtime -> enumerator: these splits fell far behind; catch up to these positions.

    ``boundaries``: split id -> the position the split must reach to leave backlog again.
    """

    boundaries: tuple[tuple[str, int], ...]

    @classmethod
    def of(cls, boundaries: Mapping[str, int]) -> BacklogStartedEvent:
        return cls(tuple(sorted(boundaries.items())))


@dataclass(frozen=True)
class SplitEventTimesEvent(SourceEvent):
    """Reader (runtime) -> runtime: the latest event time each split read in a task.

    ``event_times``: split id -> microseconds since the epoch. On Spark each task sends one
    for the slices it read (a function of the slices, so a retry sends the same); the
    planner keeps each split's largest as its watermark, in every offset.
    """

    event_times: tuple[tuple[str, int], ...]

    @classmethod
    def of(cls, event_times: Mapping[str, int]) -> SplitEventTimesEvent:
        return cls(tuple(sorted(event_times.items())))


@dataclass(frozen=True)
class SliceEndedEvent(SourceEvent):
    """Reader -> runtime: the reader ended its slice of ``split_id`` at ``position``, before
    the planned stop (a CDC log at a schema change); the split's next slice starts there.

    A reader sends it when its split reader finishes a slice early, which it must do at the
    same position for every read of the slice (the slice's output stays a function of the
    slice). On Spark the planner moves the split back to ``position`` when it plans the
    batch after; a runtime that keeps the reader's own split state has nothing to do.
    """

    split_id: str
    position: int
