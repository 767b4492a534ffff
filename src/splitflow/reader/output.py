"""The simplest reader output (a list) and reader context (it records what is sent)."""

from __future__ import annotations

from typing import TypeVar

from splitflow.api.events import SourceEvent, SplitsFinishedEvent

T = TypeVar("T")


class Collector(list[T]):
    """A list that is a :class:`~splitflow.api.reader.ReaderOutput`: ``collect`` appends."""

    def collect(self, record: T) -> None:
        self.append(record)


class RecordingReaderContext:
    """A :class:`~splitflow.api.reader.SourceReaderContext` that records what a reader sends."""

    def __init__(self, reader_id: int = 0) -> None:
        self._reader_id = reader_id
        self.events: list[SourceEvent] = []
        self.split_requests = 0

    @property
    def reader_id(self) -> int:
        return self._reader_id

    @property
    def location(self) -> str | None:
        return None

    def send_source_event_to_coordinator(self, event: SourceEvent) -> None:
        self.events.append(event)

    def send_split_request(self) -> None:
        self.split_requests += 1

    def finished_ids(self) -> list[str]:
        """Split ids of every SplitsFinishedEvent sent, in order, repeats included."""
        return [
            sid for e in self.events if isinstance(e, SplitsFinishedEvent) for sid in e.split_ids
        ]
