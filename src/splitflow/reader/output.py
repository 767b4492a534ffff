"""The simplest reader output: a list."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


class Collector(list[T]):
    """A list that is a :class:`~splitflow.api.reader.ReaderOutput`: ``collect`` appends."""

    def collect(self, record: T) -> None:
        self.append(record)
