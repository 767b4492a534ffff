"""The sequence source's record and split types (their own module, so that the reader and
the source both import them and not each other)."""

from __future__ import annotations

from dataclasses import dataclass

SequenceRecord = tuple[str, int]


@dataclass(frozen=True)
class SequenceSplit:
    """Records ``position .. end-1`` of sequence ``name`` (``end=None``: it keeps growing)."""

    name: str
    end: int | None = None
    position: int = 0

    @property
    def split_id(self) -> str:
        return self.name
