"""The splits of the PostgreSQL CDC source, the chunk watermarks, and their codecs.

* :class:`ChunkSplit`: rows of one table whose chunk key (an integer column: the primary key,
  or the column of option ``chunkKeyColumn``) is in ``[lo, hi)`` (``None``: open end; the
  first chunk also holds the rows whose chunk key is NULL), read in one transaction.
  Positions: 0 unread, 1 read; a chunk is read whole.
* :class:`LogSplit`: the replication slot's change stream, ``position`` an LSN: the slice
  ``[a, b)`` holds the transactions whose commit record starts at an LSN in it. It carries
  the watermarks of the chunks read before it started (:class:`ChunkMark`), so that it skips
  the changes each chunk's snapshot already held.
* :class:`ChunkMark`: the MVCC snapshot a chunk was read in (``xmin``, ``xmax``, the
  transactions in progress) and a WAL insert position read after it was taken (``high``). A
  change of a key in the chunk belongs to the chunk's rows exactly when its transaction is
  visible in that snapshot; every transaction that commits at or after ``high`` is not. A change is
  the chunk's by the chunk key value of its row (of the old row for a delete).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from splitflow.api.assigner import AssignerState, AssignerStateCodec
from splitflow.api.events import SourceEvent
from splitflow.api.split import Codec, DataclassCodec, JsonDict, LedgerCodec
from splitflow.errors import ConnectorError, IncompatibleCheckpointError

Key = int | None
"""A chunk bound: an integer chunk key value, or ``None`` for an open end."""


@dataclass(frozen=True)
class ChunkSplit:
    """Rows of ``table`` with ``lo <= key < hi`` (``key`` the chunk key column: the primary
    key, or the column of option ``chunkKeyColumn``). The first chunk (``lo`` None) also
    holds the rows whose key is NULL, so every row is in exactly one chunk.

    A table without a chunk key (no option, and a key that is not one integer column, or no
    key) is one chunk, ``lo`` and ``hi`` ``None`` and ``key`` empty.

    >>> ChunkSplit("public.orders", 3, "id", 100, 200).split_id
    'public.orders#3'
    """

    table: str
    index: int
    key: str = ""
    lo: Key = None
    hi: Key = None
    position: int = 0

    @property
    def split_id(self) -> str:
        return f"{self.table}#{self.index}"


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


def _widen(xid: int, reference: int) -> int:
    """The 64-bit id nearest ``reference`` whose low 32 bits are ``xid``."""
    epoch_base = reference & ~0xFFFFFFFF
    full = epoch_base | xid
    if full > reference + 0x7FFFFFFF:
        full -= 1 << 32
    elif full < reference - 0x80000000:
        full += 1 << 32
    return full


@dataclass(frozen=True)
class LogSplit:
    """The change stream of replication slot ``slot`` from LSN ``position`` on.

    ``marks``: the watermarks of the chunks read before the log started, as tuples of
    :class:`ChunkMark` fields (so the split stays a flat dataclass of primitives).
    """

    slot: str
    position: int
    marks: tuple[tuple[Any, ...], ...] = ()

    @property
    def split_id(self) -> str:
        return f"log:{self.slot}"


CdcSplit = ChunkSplit | LogSplit


class ChunkFilter:
    """Decides, for a change in the log, whether a chunk's snapshot already held it.

    Built once per log reader from the split's marks: per table, the chunks sorted by their
    lower bound, so finding a key's chunk is a binary search.
    """

    def __init__(self, marks: Sequence[ChunkMark]) -> None:
        by_table: dict[str, list[ChunkMark]] = {}
        for mark in marks:
            by_table.setdefault(mark.table, []).append(mark)
        self._tables = {
            table: sorted(ms, key=lambda m: -(1 << 63) if m.lo is None else m.lo)
            for table, ms in by_table.items()
        }
        self._starts = {
            table: [-(1 << 63) if m.lo is None else m.lo for m in ms]
            for table, ms in self._tables.items()
        }
        self.high = max((m.high for m in marks), default=0)

    def already_read(self, table: str, key: Key, xid: int, commit_lsn: int) -> bool:
        """Whether the change by ``xid`` of a row of ``table`` whose chunk key is ``key`` was
        in its chunk's rows. ``key`` None: a NULL chunk key, or a table that is one chunk;
        either way the first chunk's (the one with no lower bound)."""
        if commit_lsn >= self.high:
            return False
        marks = self._tables.get(table)
        if not marks:
            return False
        if key is None:  # a NULL chunk key is the first chunk's; so is a one-chunk table
            mark, covered = marks[0], marks[0].lo is None
        else:
            mark = marks[bisect.bisect_right(self._starts[table], key) - 1]
            covered = (mark.lo is None or mark.lo <= key) and (mark.hi is None or key < mark.hi)
        if not covered:
            shown = "NULL" if key is None else key
            raise ConnectorError(
                f"no chunk watermark of table {table} covers key {shown} (the nearest is chunk "
                f"{mark.split_id}): the log split's watermarks are incomplete"
            )
        return commit_lsn < mark.high and mark.sees(xid)


@dataclass(frozen=True)
class ChunkReadEvent(SourceEvent):
    """Reader -> enumerator: a chunk was read, with its watermark."""

    mark: ChunkMark


class CdcSplitCodec(Codec[CdcSplit]):
    """Chunks and the log split in one codec, told apart by a ``kind`` field."""

    version = 1

    def __init__(self) -> None:
        self._chunk = DataclassCodec(ChunkSplit)
        self._log = DataclassCodec(LogSplit)

    def encode(self, value: CdcSplit) -> JsonDict:
        if isinstance(value, ChunkSplit):
            return {"kind": "chunk", **self._chunk.encode(value)}
        return {"kind": "log", **self._log.encode(value)}

    def decode(self, data: Mapping[str, Any], version: int) -> CdcSplit:
        if version != self.version:
            raise IncompatibleCheckpointError("postgres-cdc split", found=version, expected=1)
        fields = {k: v for k, v in data.items() if k != "kind"}
        if data["kind"] == "chunk":
            return self._chunk.decode(fields, 1)
        return self._log.decode(fields, 1)


@dataclass(frozen=True)
class CdcState:
    """The CDC enumerator's snapshot: the assigner's state plus the snapshot phase's.

    ``tables``: tables cut into chunks so far. ``marks``: watermarks of chunks read.
    ``log_start``: the LSN the log starts from (the slot's position when it was made).
    ``log_made``: the log split exists (in ``assigner``, or finished).
    """

    assigner: AssignerState[CdcSplit]
    tables: tuple[str, ...] = ()
    marks: tuple[ChunkMark, ...] = ()
    log_start: int | None = None
    log_made: bool = False


class CdcStateCodec(LedgerCodec[CdcState]):
    """Encodes :class:`CdcState`; its ledger is the assigner's (finished split ids)."""

    version = 1

    def __init__(self) -> None:
        self._assigner = AssignerStateCodec(CdcSplitCodec())
        self._marks = DataclassCodec(ChunkMark)

    def encode(self, value: CdcState) -> JsonDict:
        return {
            "assigner": self._assigner.encode(value.assigner),
            "tables": list(value.tables),
            "marks": [self._marks.encode(m) for m in value.marks],
            "log_start": value.log_start,
            "log_made": value.log_made,
        }

    def decode(self, data: Mapping[str, Any], version: int) -> CdcState:
        if version != self.version:
            raise IncompatibleCheckpointError("postgres-cdc state", found=version, expected=1)
        return CdcState(
            assigner=self._assigner.decode(data["assigner"], self._assigner.version),
            tables=tuple(data["tables"]),
            marks=tuple(self._marks.decode(m, 1) for m in data["marks"]),
            log_start=data["log_start"],
            log_made=bool(data["log_made"]),
        )

    def split_ledger(self, value: CdcState) -> tuple[CdcState, frozenset[str]]:
        stripped, ledger = self._assigner.split_ledger(value.assigner)
        return CdcState(stripped, value.tables, value.marks, value.log_start, value.log_made), (
            ledger
        )

    def join_ledger(self, value: CdcState, ledger: frozenset[str]) -> CdcState:
        joined = self._assigner.join_ledger(value.assigner, ledger)
        return CdcState(joined, value.tables, value.marks, value.log_start, value.log_made)


def mark_tuple(mark: ChunkMark) -> tuple[Any, ...]:
    return (mark.split_id, mark.table, mark.lo, mark.hi, mark.xmin, mark.xmax, mark.xip, mark.high)


def mark_of(fields: Sequence[Any]) -> ChunkMark:
    split_id, table, lo, hi, xmin, xmax, xip, high = fields
    return ChunkMark(split_id, table, lo, hi, xmin, xmax, tuple(xip), high)
