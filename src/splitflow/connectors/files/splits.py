"""The files source's split type: a byte range of one file (its own module, so that the
reader and the source both import it and not each other)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FileSplit:
    """Bytes ``[start, end)`` of the file at ``path`` (part ``part`` of ``parts``).

    ``size`` and ``mtime_ns`` are the file's when it was discovered; ``position`` is the
    byte offset where reading resumes.
    """

    path: str
    part: int
    parts: int
    start: int
    end: int
    size: int
    mtime_ns: int
    position: int

    @property
    def split_id(self) -> str:  # split_id(self.path, ...), inline: asked for very often
        return self.path if self.parts == 1 else f"{self.path}#{self.part}"


def split_id(path: str, part: int, parts: int) -> str:
    return path if parts == 1 else f"{path}#{part}"
