"""Source events: the custom messages between an enumerator and its readers.

Events are frozen dataclasses, so they compare by value and pickle; a runtime that must
carry them across processes (Spark) pickles them. Connectors define their own by
subclassing :class:`SourceEvent`; the ones below are understood by splitflow's own bases.
"""

from __future__ import annotations

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
