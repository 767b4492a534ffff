"""The PostgreSQL CDC source's chunk watermark, on the CDC core's splits and codecs.

The splits are the core's (:mod:`splitflow.connectors.cdc.splits`): :class:`ChunkSplit`
(rows of one table whose chunk key, the primary key or the column of option
``chunkKeyColumn``, is in ``[lo, hi)``) and :class:`LogSplit` (the replication slot's
change stream, ``position`` an LSN: the slice ``[a, b)`` holds the transactions whose commit
record starts at an LSN in it).

* :class:`ChunkMark`: the MVCC snapshot a chunk was read in (``xmin``, ``xmax``, the
  transactions in progress) and a WAL insert position read after it was taken (``high``). A
  change of a key in the chunk belongs to the chunk's rows exactly when its transaction is
  visible in that snapshot; every transaction that commits at or after ``high`` is not. A
  change is the chunk's by the chunk key value of its row (of the old row for a delete).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from splitflow.connectors.cdc import splits as cdc
from splitflow.connectors.cdc.splits import (
    CdcSplit,
    CdcState,
    ChunkReadEvent,
    ChunkSplit,
    Key,
    LogSplit,
)

__all__ = [
    "CdcSplit",
    "CdcSplitCodec",
    "CdcState",
    "CdcStateCodec",
    "ChunkFilter",
    "ChunkMark",
    "ChunkReadEvent",
    "ChunkSplit",
    "Key",
    "LogSplit",
    "mark_of",
    "mark_tuple",
]

SOURCE = "postgres-cdc"


@dataclass(frozen=True)
class ChunkMark:
    """Where and when chunk ``split_id`` was read (see the module doc)."""

    split_id: str
    table: str
    lo: Key
    hi: Key
    xmin: int
    xmax: int
    xip: tuple[int, ...]
    high: int

    def sees(self, xid: int) -> bool:
        """Whether transaction ``xid`` (committed) was visible to the chunk's snapshot.

        ``xid`` is the 32-bit id pgoutput reports; the snapshot's ids are 64-bit with the
        epoch, compared modulo 2**32 within one epoch of ``xmax``.
        """
        full = _widen(xid, self.xmax)
        return full < self.xmin or (full < self.xmax and full not in self.xip)

    def holds(self, position: int, txid: int) -> bool:
        """The change committed at LSN ``position`` by transaction ``txid`` is in the
        chunk's rows: it committed before ``high`` and the snapshot saw it."""
        return position < self.high and self.sees(txid)


def _widen(xid: int, reference: int) -> int:
    """The 64-bit id nearest ``reference`` whose low 32 bits are ``xid``."""
    epoch_base = reference & ~0xFFFFFFFF
    full = epoch_base | xid
    if full > reference + 0x7FFFFFFF:
        full -= 1 << 32
    elif full < reference - 0x80000000:
        full += 1 << 32
    return full


class ChunkFilter(cdc.ChunkFilter):
    """The core's chunk filter (:class:`splitflow.connectors.cdc.splits.ChunkFilter`) over
    :class:`ChunkMark` watermarks, asked in pgoutput's terms."""

    def __init__(self, marks: Sequence[ChunkMark]) -> None:
        super().__init__(marks)

    def already_read(self, table: str, key: Key, xid: int, commit_lsn: int) -> bool:
        """Whether the change by ``xid``, committed at ``commit_lsn``, of a row of ``table``
        whose chunk key is ``key`` was in its chunk's rows. ``key`` None: a NULL chunk key,
        or a table that is one chunk; either way the first chunk's (the one with no lower
        bound)."""
        return self.holds(table, key, commit_lsn, xid)


class CdcSplitCodec(cdc.CdcSplitCodec):
    """The core's split codec, naming ``postgres-cdc`` in its errors."""

    def __init__(self) -> None:
        super().__init__(SOURCE)


class CdcStateCodec(cdc.CdcStateCodec):
    """The core's enumerator state codec with :class:`ChunkMark` watermarks."""

    def __init__(self) -> None:
        super().__init__(ChunkMark, SOURCE)


def mark_tuple(mark: ChunkMark) -> tuple[Any, ...]:
    return cdc.mark_tuple(mark)


def mark_of(fields: Sequence[Any]) -> ChunkMark:
    return cdc.mark_of(ChunkMark, fields)
