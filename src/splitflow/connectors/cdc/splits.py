"""The splits of a CDC source, the chunk watermarks, and their codecs: database-independent.

* :class:`ChunkSplit`: rows of one table whose chunk key (an integer column) is in
  ``[lo, hi)`` (``None``: open end; the first chunk also holds the rows whose chunk key is
  NULL), read in one snapshot. Positions: 0 unread, 1 read; a chunk is read whole.
* :class:`LogSplit`: the database's change log from ``position`` on, positions being the
  database's log positions mapped to one increasing integer (PostgreSQL: the LSN of a
  transaction's commit record; MySQL: see ``connectors/mysql``). The slice ``[a, b)`` holds
  the transactions whose position is in it. It carries the watermarks of the chunks read
  before it started, so that it skips the changes each chunk's rows already held, and
  drops a table's watermarks once its position has passed all of them.
* A **chunk mark** (:class:`Watermark`): what a database records when it reads a chunk, so
  that the log can tell whether the chunk's rows already held a change. Each database has
  its own (PostgreSQL: the MVCC snapshot and a WAL position; a database that can only say
  "the chunk is the table as of log position P": :class:`PositionMark`). A change is the
  chunk's by the chunk key value of its row (of the old row for a delete).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import is_
from typing import Any, Protocol, TypeVar

from splitflow.api.assigner import AssignerState, AssignerStateCodec
from splitflow.api.events import SourceEvent
from splitflow.api.split import Codec, DataclassCodec, JsonDict, LedgerCodec
from splitflow.errors import ConnectorError, ContractViolation, IncompatibleCheckpointError

Key = int | None
"""A chunk bound: an integer chunk key value, or ``None`` for an open end."""

_LOWEST = -(1 << 63)


@dataclass(frozen=True)
class ChunkSplit:
    """Rows of ``table`` with ``lo <= key < hi`` (``key`` the chunk key column). The first
    chunk (``lo`` None) also holds the rows whose key is NULL, so every row is in exactly
    one chunk.

    A table without a chunk key is one chunk, ``lo`` and ``hi`` ``None`` and ``key`` empty.

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
class Cut:
    """A table's cut into chunks, as far as it has gone: the next chunk is number ``index``
    and starts at ``lo`` (None: the first chunk, open below).

    How the bounds go is fixed when the cut starts (:func:`~.chunks.start_cut`, from the
    table's key statistics then): evenly by ``step`` up to ``high`` when the key's values are
    dense, by stepping through them in key order (``step`` 0: a query per chunk) when they
    are sparse; ``low`` None: the table is one chunk. A cut is a few numbers, so an
    enumerator keeps it in its state and cuts the next chunks as readers need them
    (:func:`~.chunks.next_chunks`), wherever it stopped.
    """

    table: str
    key: str = ""
    size: int = 0
    low: int | None = None
    high: int = 0
    step: int = 0
    index: int = 0
    lo: int | None = None


class Watermark(Protocol):
    """A chunk's watermark: which of the log's changes the chunk's rows already hold.

    Implement it as a ``@dataclass(frozen=True)`` of JSON primitives (it travels in
    checkpoints and, as a tuple of its fields, inside the :class:`LogSplit`) whose first
    fields are ``split_id``, ``table``, ``lo`` and ``hi`` (the chunk's) and whose last
    field is ``high`` (:func:`check_mark_type` checks the layout).
    """

    @property
    def split_id(self) -> str: ...

    @property
    def table(self) -> str: ...

    @property
    def lo(self) -> Key: ...

    @property
    def hi(self) -> Key: ...

    @property
    def high(self) -> int:
        """No change at a log position at or past ``high`` is in the chunk's rows."""
        ...

    def holds(self, position: int, txid: int) -> bool:
        """Whether the chunk's rows already hold a change to one of its keys that the
        transaction ``txid`` (0 where the database has no such id) committed at log
        position ``position``. Must be false at or past :attr:`high`."""
        ...


MarkT = TypeVar("MarkT", bound=Watermark)


@dataclass(frozen=True)
class PositionMark:
    """The watermark of a chunk read as the table stood at log position ``high``: its rows
    hold exactly the changes of the transactions before ``high``.

    >>> mark = PositionMark("db.t#0", "db.t", None, 100, 57)
    >>> mark.holds(56, 0), mark.holds(57, 0)
    (True, False)
    """

    split_id: str
    table: str
    lo: Key
    hi: Key
    high: int

    def holds(self, position: int, txid: int) -> bool:
        return position < self.high


def check_mark_type(cls: type[Any]) -> None:
    """Raise :class:`~splitflow.errors.ContractViolation` unless ``cls`` is laid out as
    :class:`Watermark` says (the log split reads a mark's table and high by position)."""
    names = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []
    if names[:4] != ["split_id", "table", "lo", "hi"] or names[-1:] != ["high"]:
        raise ContractViolation(
            f"chunk mark {cls!r} must be a dataclass whose fields start with split_id, table, "
            f"lo, hi and end with high (found {names})"
        )


def mark_tuple(mark: Watermark) -> tuple[Any, ...]:
    """``mark`` as the tuple of its fields, as a :class:`LogSplit` carries it."""
    return tuple(getattr(mark, f.name) for f in dataclasses.fields(mark))  # type: ignore[arg-type]


def mark_of(cls: type[MarkT], fields: Sequence[Any]) -> MarkT:
    """The mark of class ``cls`` whose fields are ``fields`` (lists become tuples)."""
    return cls(*(_frozen(v) for v in fields))


def _frozen(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    return value


@dataclass(frozen=True)
class LogSplit:
    """The change log ``name`` (PostgreSQL: the replication slot) from ``position`` on.

    ``marks``: the watermarks of the chunks read before the log started, as tuples of their
    fields (so the split stays a flat dataclass of primitives): ``(split_id, table, lo, hi,
    ..., high)``. A table's marks are dropped once ``position`` is at or past the ``high`` of
    every one of them: every change the log reads from then on is past them, so no chunk of
    the table holds it, and the split carries only the tables whose snapshot the log has
    not yet passed (its size no longer grows with the tables read). The runtime moves a
    split with :func:`dataclasses.replace`, which runs this again.

    >>> marks = (("t#0", "t", None, 5, 100), ("t#1", "t", 5, None, 120),
    ...          ("u#0", "u", None, None, 90))
    >>> [m[0] for m in LogSplit("s", 95, marks).marks]
    ['t#0', 't#1']
    >>> LogSplit("s", 120, marks).marks
    ()
    """

    name: str
    position: int
    marks: tuple[tuple[Any, ...], ...] = ()

    def __post_init__(self) -> None:
        if not self.marks:
            return
        open_tables = {m[1] for m in self.marks if m[-1] > self.position}
        if len(open_tables) < len({m[1] for m in self.marks}):
            kept = tuple(m for m in self.marks if m[1] in open_tables)
            object.__setattr__(self, "marks", kept)

    @property
    def split_id(self) -> str:
        return f"log:{self.name}"


CdcSplit = ChunkSplit | LogSplit


class ChunkFilter:
    """Decides, for a change in the log, whether a chunk's rows already held it.

    Built once per log read from the split's marks: per table, the chunks sorted by their
    lower bound, so finding a key's chunk is a binary search; the database's test
    (:meth:`Watermark.holds`) then decides.
    """

    def __init__(self, marks: Sequence[Watermark]) -> None:
        by_table: dict[str, list[Watermark]] = {}
        for mark in marks:
            by_table.setdefault(mark.table, []).append(mark)
        self._tables = {
            table: sorted(ms, key=lambda m: _LOWEST if m.lo is None else m.lo)
            for table, ms in by_table.items()
        }
        self._starts = {
            table: [_LOWEST if m.lo is None else m.lo for m in ms]
            for table, ms in self._tables.items()
        }
        self.high = max((m.high for m in marks), default=0)

    def holds(self, table: str, key: Key, position: int, txid: int = 0) -> bool:
        """Whether the change at ``position`` (by transaction ``txid``) of a row of
        ``table`` whose chunk key is ``key`` was in its chunk's rows. ``key`` None: a NULL
        chunk key, or a table that is one chunk; either way the first chunk's (the one with
        no lower bound). A table without marks (found after the log started, or whose
        marks the log has passed) holds nothing."""
        if position >= self.high:
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
        return mark.holds(position, txid)


@dataclass(frozen=True)
class ChunkReadEvent(SourceEvent):
    """Reader -> enumerator: a chunk was read, with its watermark."""

    mark: Any
    """The chunk's :class:`Watermark`."""


class CdcSplitCodec(Codec[CdcSplit]):
    """Chunks and the log split in one codec, told apart by a ``kind`` field.

    The log split's :attr:`LogSplit.name` is stored as ``slot``, its name in version 1,
    when PostgreSQL was the only CDC source: offsets written then still decode.
    ``source``: the source's name in errors (``postgres-cdc``).
    """

    version = 1

    def __init__(self, source: str = "cdc") -> None:
        self._source = source
        self._chunk = DataclassCodec(ChunkSplit)

    def encode(self, value: CdcSplit) -> JsonDict:
        if isinstance(value, ChunkSplit):
            return {"kind": "chunk", **self._chunk.encode(value)}
        return {
            "kind": "log",
            "slot": value.name,
            "position": value.position,
            "marks": [[_json(v) for v in m] for m in value.marks],
        }

    def decode(self, data: Mapping[str, Any], version: int) -> CdcSplit:
        if version != self.version:
            raise IncompatibleCheckpointError(f"{self._source} split", found=version, expected=1)
        fields = {k: v for k, v in data.items() if k != "kind"}
        if data["kind"] == "chunk":
            return self._chunk.decode(fields, 1)
        if set(fields) - {"slot", "position", "marks"} or not {"slot", "position"} <= set(fields):
            raise IncompatibleCheckpointError(
                f"{self._source} log split codec version {version}",
                found=sorted(fields),
                expected=["marks", "position", "slot"],
                of="fields",
            )
        marks = tuple(_frozen(m) for m in fields.get("marks", ()))
        return LogSplit(fields["slot"], fields["position"], marks)


def _json(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_json(v) for v in value]
    return value


@dataclass(frozen=True)
class CdcState:
    """The CDC enumerator's snapshot: the assigner's state plus the snapshot phase's.

    ``tables``: tables found so far (cut into chunks, or being cut: ``cuts``). ``marks``:
    watermarks of chunks read (until the log split, which then carries them, exists).
    ``log_start``: the position the log starts from. ``log_made``: the log split exists (in
    ``assigner``, or finished).
    ``cuts``: the tables whose cut goes on (chunks are cut ahead of the reads, a bounded
    number at a time, under ``maxChunksPerBatch``).
    """

    assigner: AssignerState[CdcSplit]
    tables: tuple[str, ...] = ()
    marks: tuple[Any, ...] = ()
    log_start: int | None = None
    log_made: bool = False
    cuts: tuple[Cut, ...] = ()


class CdcStateCodec(LedgerCodec[CdcState]):
    """Encodes :class:`CdcState`; its ledger is the assigner's (finished split ids).

    ``mark_type``: the database's :class:`Watermark` class; ``source``: the source's name in
    errors. The marks (in the order they came; a mark that replaces another is taken out
    and added last, so the pages before it stay as they were) are encoded in pages of
    :attr:`PAGE` keyed by number, and a full page is encoded once: the state of a snapshot
    of 100,000 chunks costs its newest page per batch, not every mark, to encode and to
    compare with the last (``stateDir`` writes what changed). Version 1 (marks as a list,
    no cuts) still decodes.
    """

    PAGE = 500
    """Marks per page."""

    version = 2

    def __init__(self, mark_type: type[Any], source: str = "cdc") -> None:
        check_mark_type(mark_type)
        self._source = source
        self._assigner = AssignerStateCodec(CdcSplitCodec(source))
        self._marks: DataclassCodec[Any] = DataclassCodec(mark_type)
        self._cuts = DataclassCodec(Cut)
        self._pages: list[tuple[Sequence[Any], list[JsonDict]]] = []  # full: (marks, encoded)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pages": []}

    def encode(self, value: CdcState) -> JsonDict:
        return {
            "assigner": self._assigner.encode(value.assigner),
            "tables": list(value.tables),
            "marks": self._encode_marks(value.marks),
            "log_start": value.log_start,
            "log_made": value.log_made,
            "cuts": {c.table: self._cuts.encode(c) for c in value.cuts},
        }

    def _encode_marks(self, marks: Sequence[Any]) -> JsonDict:
        """``{"0": [first PAGE marks], "1": [...], ...}``; a full page of the very mark
        objects encoded there before is that encoding (told apart by identity, in C)."""
        size, pages = self.PAGE, []
        for n, start in enumerate(range(0, len(marks), size)):
            page = marks[start : start + size]
            done = self._pages[n] if n < len(self._pages) else None
            if done is None or len(done[0]) != len(page) or not all(map(is_, done[0], page)):
                done = (page, [self._marks.encode(m) for m in page])
            pages.append(done)
        self._pages = [done for done in pages if len(done[1]) == size]
        return {str(n): encoded for n, (_, encoded) in enumerate(pages)}

    def decode(self, data: Mapping[str, Any], version: int) -> CdcState:
        if version not in (1, self.version):
            raise IncompatibleCheckpointError(
                f"{self._source} state", found=version, expected=[1, self.version]
            )
        pages = data["marks"]
        marks = pages if version == 1 else [m for n in sorted(pages, key=int) for m in pages[n]]
        return CdcState(
            assigner=self._assigner.decode(data["assigner"], self._assigner.version),
            tables=tuple(data["tables"]),
            marks=tuple(self._marks.decode(m, 1) for m in marks),
            log_start=data["log_start"],
            log_made=bool(data["log_made"]),
            cuts=tuple(self._cuts.decode(c, 1) for c in data.get("cuts", {}).values()),
        )

    def split_ledger(self, value: CdcState) -> tuple[CdcState, frozenset[str]]:
        stripped, ledger = self._assigner.split_ledger(value.assigner)
        return dataclasses.replace(value, assigner=stripped), ledger

    def join_ledger(self, value: CdcState, ledger: frozenset[str]) -> CdcState:
        joined = self._assigner.join_ledger(value.assigner, ledger)
        return dataclasses.replace(value, assigner=joined)
