"""The MySQL/MariaDB CDC source's reader: chunks read in a consistent snapshot and rewound to
the batch's position, the binlog between two positions. The plumbing (a chunk or a log
piece per fetch, the batch's pin, the emitter) is the CDC core's
(:mod:`splitflow.connectors.cdc.reader`).

**Chunks.** A chunk is read with PyMySQL in ``START TRANSACTION WITH CONSISTENT SNAPSHOT``,
whose binlog position (``binlog_snapshot_file``/``_position``) says which transactions it
holds. On Spark the batch's :class:`~.pinning.BatchPosition` says where every read of the
batch must stand (``P``); the read's own snapshot is at or after it, and the chunk is
rewound to ``P`` with the binlog's transactions between the two (:func:`rewind`). Without a
pin (a batch read, the test harness) the chunk stands at its own snapshot. The rows come
out ordered by the primary key (by every column for a table without one), so every read of
a batch gives them in the same order; the watermark is ``P``
(:class:`~splitflow.connectors.cdc.splits.PositionMark`), also the ``lsn`` of the ``r`` rows.

**The log.** The slice ``[a, b)`` of the log split is every transaction whose GTID ``seq``
is in it (:mod:`.binlog`). A change is left out when the chunk its row falls in already
held it (its position is below the chunk's mark). An update that changes the primary key,
or of a table without one, comes as a delete of the old row and an insert of the new one.
The slice streams through the task in pieces of whole transactions of about
:data:`ROWS_PER_PIECE` rows.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Generator, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pymysql
from pymysql.constants import FIELD_TYPE

from splitflow.api.reader import SourceReader, SourceReaderContext
from splitflow.connectors.cdc.reader import CdcReader, CdcSplitReader, LogRead, Piece, Pinned
from splitflow.connectors.cdc.schema import OutputSchema, Table
from splitflow.connectors.cdc.splits import (
    CdcSplit,
    ChunkFilter,
    ChunkSplit,
    LogSplit,
    PositionMark,
    mark_of,
)
from splitflow.connectors.mysql import catalog, gtid
from splitflow.connectors.mysql.binlog import BinlogReader, Change, Image
from splitflow.connectors.mysql.pinning import BatchPosition
from splitflow.connectors.mysql.types import ColumnType, to_arrow
from splitflow.errors import ConnectorError

if TYPE_CHECKING:
    from splitflow.connectors.mysql.source import MySqlCdcSource

ROWS_PER_PIECE = 8192
"""A log piece is cut after the first transaction that brings it to this many rows."""
FETCH_ROWS = 10_000
"""Rows per fetch of a chunk's result."""


class Layout:
    """A table's columns as the reader handles them: names, types, the key's and the chunk
    key's column indexes; a chunk's rows to Arrow, a binlog row image to a row."""

    def __init__(self, table: Table[ColumnType]) -> None:
        self.table = table
        self.names = [name for name, _ in table.columns]
        self.kinds = [kind for _, kind in table.columns]
        index = {name: i for i, name in enumerate(self.names)}
        self.key = [index[k] for k in table.key]
        self.chunk_key = index[table.chunk_key] if table.chunk_key else None
        self.order = [(name, "ascending") for name in (table.key or self.names)]
        """How a chunk's rows are sorted: by the key, else by every column."""

    def snapshot_arrays(self, rows: Sequence[Sequence[Any]]) -> list[pa.Array]:
        """The columns of a chunk's rows (PyMySQL, with :data:`AS_TEXT` kept as text),
        typed: text cast by Arrow, the rest through :meth:`ColumnType.from_snapshot`."""
        arrays = []
        for values, kind in zip(_columns(rows, len(self.names)), self.kinds, strict=True):
            if _as_text(kind):
                arrays.append(_cast_text(values, kind))
            elif kind.kind == "plain":
                arrays.append(to_arrow([values], [kind])[0])
            else:
                arrays.append(to_arrow([[kind.from_snapshot(v) for v in values]], [kind])[0])
        return arrays

    def rows(self, arrays: Sequence[Any]) -> list[Row]:
        """Arrow columns as rows of Python values: the one form :func:`rewind` compares."""
        if not arrays or len(arrays[0]) == 0:
            return []
        return list(zip(*(a.to_pylist() for a in arrays), strict=True))

    def canonical(self, rows: Sequence[Row]) -> list[Row]:
        """``rows`` (from binlog images) in the form :meth:`rows` gives (through Arrow)."""
        return self.rows(to_arrow(_columns(rows, len(self.names)), self.kinds))

    def from_log(self, image: Image, schema: OutputSchema[Any]) -> Row:
        """The row of a binlog image, in the table's column order (a column the image
        lacks is null; one the query's schema lacks fails, naming it)."""
        values, reasons = image.values, image.none_sources
        if len(values) != len(self.names) or any(name not in values for name in self.names):
            schema.check(self.table.name, values)
        return tuple(
            kind.from_log(values.get(name), reasons.get(name))
            for name, kind in zip(self.names, self.kinds, strict=True)
        )

    def key_of(self, row: Row) -> Row:
        return tuple(row[i] for i in self.key)

    def chunk_value(self, row: Row) -> int | None:
        return None if self.chunk_key is None else row[self.chunk_key]

    def in_chunk(self, split: ChunkSplit, row: Row) -> bool:
        """Whether ``row`` is one of ``split``'s (by its chunk key; a NULL key is the first
        chunk's)."""
        value = self.chunk_value(row)
        if value is None:
            return split.lo is None
        return (split.lo is None or split.lo <= value) and (split.hi is None or value < split.hi)


AS_TEXT = (
    FIELD_TYPE.DECIMAL,
    FIELD_TYPE.NEWDECIMAL,
    FIELD_TYPE.DATE,
    FIELD_TYPE.NEWDATE,
    FIELD_TYPE.DATETIME,
    FIELD_TYPE.TIMESTAMP,
)
"""Column types a chunk's connection keeps as the server's text, which Arrow parses in C++
(PyMySQL's ``Decimal`` and ``datetime`` objects cost more than the rest of the read)."""


def _as_text(kind: ColumnType) -> bool:
    arrow = kind.arrow
    return kind.kind == "plain" and (
        pa.types.is_decimal(arrow) or pa.types.is_date32(arrow) or pa.types.is_timestamp(arrow)
    )


def _cast_text(values: Sequence[Any], kind: ColumnType) -> pa.Array:
    """Text values (``str`` or ``bytes``) of a decimal, date or datetime column as its Arrow
    type; a value Arrow cannot parse (a zero date) is a ConnectorError naming the column."""
    try:
        array = pa.array(values)
        if not pa.types.is_string(array.type):
            array = array.cast(pa.string())
        if pa.types.is_timestamp(kind.arrow):
            return array.cast(pa.timestamp("us")).cast(kind.arrow)
        return array.cast(kind.arrow)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
        raise ConnectorError(
            f"column {kind.table}.{kind.column} ({kind.type_name}, read as {kind.spark}) "
            f"holds a value that does not fit: {e}"
        ) from None


def _text_conversions() -> dict[int, Any]:
    """PyMySQL's conversions, with :data:`AS_TEXT` left as the server sends them."""
    conversions = dict(pymysql.converters.conversions)
    for field_type in AS_TEXT:
        conversions[field_type] = _same
    return conversions


def _same(value: Any) -> Any:
    return value


Row = tuple[Any, ...]
RowChange = tuple[Row | None, Row | None]
"""A row change as rows: ``(before, after)``; an insert has no before, a delete no after."""


def rewind(
    layout: Layout, split: ChunkSplit, rows: Sequence[Row], changes: Sequence[RowChange]
) -> list[Row]:
    """``rows`` (the chunk as a snapshot at ``S`` read it) as they stood before ``changes``
    (the changes to the table of every transaction between ``P`` and ``S``, in binlog
    order): their changes to the chunk's rows undone, last first. Keyed rows by their key; a
    table without a key as a multiset (the caller sorts the result).

    A row to take out that the snapshot does not hold means the snapshot and the binlog
    disagree, and is a ConnectorError naming the chunk.

    >>> from splitflow.connectors.mysql.types import TypeMapping
    >>> kind = TypeMapping.for_column("db.t", "id", "int", "int(11)")
    >>> layout = Layout(Table("db.t", (("id", kind), ("v", kind)), ("id",), "id"))
    >>> chunk = ChunkSplit("db.t", 0, "id", None, 10)
    >>> at_s = [(1, 11), (2, 20), (3, 30)]  # after: update 1 (10 -> 11), insert 3, delete 4
    >>> sorted(rewind(layout, chunk, at_s, [((1, 10), (1, 11)), (None, (3, 30)), ((4, 40), None)]))
    [(1, 10), (2, 20), (4, 40)]
    """
    keyed: dict[Row, Row] = {}
    multiset: Counter[Row] = Counter()
    if layout.key:
        keyed = {layout.key_of(row): row for row in rows}
    else:
        multiset.update(rows)
    for before, after in reversed(changes):
        if after is not None and layout.in_chunk(split, after):
            if layout.key:
                present = keyed.pop(layout.key_of(after), None) is not None
            else:
                present = multiset[after] > 0
                multiset[after] -= 1
            if not present:
                raise ConnectorError(
                    f"chunk {split.split_id}: rewinding it to the batch's position, a row "
                    "that a later change wrote is not in the chunk's snapshot: the snapshot "
                    "and the binlog disagree (was the table changed with sql_log_bin=0?)"
                )
        if before is not None and layout.in_chunk(split, before):
            if layout.key:
                keyed[layout.key_of(before)] = before
            else:
                multiset[before] += 1
    return list(keyed.values()) if layout.key else list(multiset.elements())


class MySqlSplitReader(CdcSplitReader):
    """Reads chunk and log slices (see the module doc) on the core's split reader. One
    connection for chunks and catalog reads; binlog streams as replica server ids of reader
    ``reader_id`` (option ``serverId``): one for the log, one for rewinding chunks."""

    def __init__(
        self, source: MySqlCdcSource, pinned: Pinned[BatchPosition], reader_id: int
    ) -> None:
        super().__init__(source.columns(), pinned)
        self._source = source
        self._options = options = source.options
        self._conn: Any = None
        self._chunk_conn: Any = None
        self._layouts: dict[str, Layout] = {}
        self._log = BinlogReader(options, options.server_id(reader_id), self._wanted)
        self._rewinds = BinlogReader(options, options.server_id(reader_id, rewind=True))

    def _wanted(self, table: str) -> bool:
        database, name = table.split(".", 1)
        return self._options.matches(database, name)

    def _connection(self) -> Any:
        if self._conn is None or not self._conn.open:
            self._conn = catalog.connect(self._options)
        return self._conn

    def _layout(self, table: str) -> Layout:
        layout = self._layouts.get(table)
        if layout is None:
            described = self._source.table(table, self._connection())
            layout = self._layouts[table] = Layout(described)
        return layout

    # -- chunks --------------------------------------------------------------------------------

    def _chunk_connection(self) -> Any:
        """The chunks' own: :data:`AS_TEXT` columns come as text (Arrow parses them)."""
        if self._chunk_conn is None or not self._chunk_conn.open:
            self._chunk_conn = catalog.connect(self._options, conv=_text_conversions())
        return self._chunk_conn

    def read_chunk(self, split: ChunkSplit) -> Piece:
        """The chunk's rows in a consistent snapshot of their own, rewound to the batch's
        pinned position when the snapshot lies past it; sorted by the key (by every column
        without one), so every read gives them in one order."""
        layout = self._layout(split.table)
        pinned: BatchPosition | None = self._pinned.event
        select = ", ".join(catalog.quote_name(n) for n in layout.names)
        sql = f"SELECT {select} FROM {catalog.quoted(split.table)}"
        condition = catalog.chunk_condition(split)
        if condition:
            sql += f" WHERE {condition}"
        conn = self._chunk_connection()
        try:
            with conn.cursor() as cursor:
                cursor.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
                file, offset = catalog.snapshot_offset(cursor)
                cursor.execute(sql)
                fetched: list[Any] = []
                while batch := cursor.fetchmany(FETCH_ROWS):
                    fetched.extend(batch)
        except pymysql.err.ProgrammingError as e:
            if e.args and e.args[0] == 1146:
                raise ConnectorError(
                    f"chunk {split.split_id}: table {split.table} no longer exists"
                ) from None
            raise
        finally:
            conn.rollback()  # read only: nothing to commit
        arrays = layout.snapshot_arrays(fetched)
        at = catalog.binlog_offset(file, offset)
        if pinned is None:  # no runtime pins: the chunk stands at its own snapshot
            position = self._position_at(file, offset)
        else:
            position = pinned.position
            if at < (pinned.file, pinned.offset):
                raise ConnectorError(
                    f"chunk {split.split_id}: its snapshot lies at binlog {file}:{offset}, "
                    f"before {pinned.where}: the binlog was reset, or the server is another one"
                )
            if at > (pinned.file, pinned.offset):
                snapshot = self._position_at(file, offset)
                rows = self._rewind(layout, split, layout.rows(arrays), pinned, snapshot)
                arrays = to_arrow(_columns(rows, len(layout.names)), layout.kinds)
        table = pa.Table.from_arrays(arrays, names=layout.names).sort_by(layout.order)
        batches = self._schema.batches(
            split.table, layout.names, table.columns, table.num_rows, "r", position, None
        )
        mark = PositionMark(split.split_id, split.table, split.lo, split.hi, position)
        return Piece(batches, 1, mark)

    def _position_at(self, file: str, offset: int) -> int:
        """The log position of binlog ``file``:``offset``: after the GTID there."""
        try:
            ((gtid_pos,),) = catalog.query(
                self._connection(), "SELECT BINLOG_GTID_POS(%s, %s)", (file, offset)
            )
        except pymysql.err.OperationalError as error:  # a lost connection: the task is retried
            raise ConnectorError(
                f"cannot read where binlog {file}:{offset} lies on MySQL "
                f"{self._options.where}: {error}"
            ) from None
        return gtid.position_after(gtid_pos, self._options.where)

    def _rewind(
        self,
        layout: Layout,
        split: ChunkSplit,
        rows: list[Row],
        pinned: BatchPosition,
        snapshot: int,
    ) -> list[Row]:
        """``rows`` read at log position ``snapshot`` rewound to the pinned one."""
        after = gtid.single(pinned.gtid, self._options.where)
        changes: list[RowChange] = []
        named = re.compile(rf"\b{re.escape(split.table.split('.', 1)[1])}\b", re.IGNORECASE)
        for transaction in self._rewinds.read(
            pinned.position, snapshot, after, split_id=split.split_id, tables={split.table}
        ):
            for _, statement in transaction.statements:
                if named.search(statement):  # TRUNCATE, ALTER: no row images to undo
                    raise ConnectorError(
                        f"chunk {split.split_id}: table {split.table} was changed by a "
                        f"statement after {pinned.where} ({statement[:80]!r}), which cannot "
                        "be undone to read the chunk as it stood there: restart the query, "
                        "which reads the batch again at a new position"
                    )
            for change in transaction.changes:
                changes.append((self._row(layout, change.before), self._row(layout, change.after)))
        images = layout.canonical([row for change in changes for row in change if row is not None])
        at = iter(images)  # the images in the form of the snapshot's rows, in order
        canonical = [
            (None if before is None else next(at), None if after is None else next(at))
            for before, after in changes
        ]
        return rewind(layout, split, rows, canonical)

    def _row(self, layout: Layout, image: Image | None) -> Row | None:
        return None if image is None else layout.from_log(image, self._schema)

    # -- the log -------------------------------------------------------------------------------

    def open_log(self, split: LogSplit, start: int, stop: int | None) -> LogRead | None:
        """The slice ``[start, stop)``; without a planned stop (the harness), up to the
        binlog's end now."""
        if stop is None:
            stop = catalog.binlog_position(self._connection(), self._options.where)
        if stop <= start:
            return None
        marks = [mark_of(PositionMark, m) for m in split.marks]
        return LogRead(self._log_pieces(split, start, stop, ChunkFilter(marks)), stop)

    def _log_pieces(
        self, split: LogSplit, start: int, stop: int, chunks: ChunkFilter
    ) -> Generator[Piece, None, None]:
        """Pieces of whole transactions, each cut after the first transaction that brings
        it to :data:`ROWS_PER_PIECE` rows; the last one ends at ``stop``."""
        rows: dict[str, list[tuple[str, int, datetime, Row]]] = {}
        count = 0
        for transaction in self._log.read(start, stop, split_id=split.split_id):
            commit_ts = datetime.fromtimestamp(transaction.timestamp, UTC)
            for change in transaction.changes:
                count += self._change(change, transaction.seq, commit_ts, chunks, rows)
            if count >= ROWS_PER_PIECE and transaction.seq + 1 < stop:
                yield Piece(self._batches(rows), transaction.seq + 1)
                rows, count = {}, 0
        yield Piece(self._batches(rows), stop)

    def _change(
        self,
        change: Change,
        seq: int,
        commit_ts: datetime,
        chunks: ChunkFilter,
        rows: dict[str, list[tuple[str, int, datetime, Row]]],
    ) -> int:
        """Add ``change``'s rows that no chunk held to ``rows``; how many were added."""
        layout = self._layout(change.table)
        before = self._row(layout, change.before)
        after = self._row(layout, change.after)
        events: list[tuple[str, Row]] = []
        if change.op == "c":
            assert after is not None
            events.append(("c", after))
        elif change.op == "d":
            assert before is not None
            events.append(("d", before))
        else:
            assert before is not None
            assert after is not None
            if not layout.key or layout.key_of(before) != layout.key_of(after):
                events += [("d", before), ("c", after)]  # cannot be applied in place
            else:
                events.append(("u", after))
        added = 0
        for op, row in events:
            if not chunks.holds(change.table, layout.chunk_value(row), seq):
                rows.setdefault(change.table, []).append((op, seq, commit_ts, row))
                added += 1
        return added

    def _batches(
        self, rows: dict[str, list[tuple[str, int, datetime, Row]]]
    ) -> list[pa.RecordBatch]:
        batches: list[pa.RecordBatch] = []
        for table, changes in rows.items():
            layout = self._layout(table)
            columns = to_arrow(_columns([c[3] for c in changes], len(layout.names)), layout.kinds)
            batches += self._schema.batches(
                table,
                layout.names,
                columns,
                len(changes),
                [c[0] for c in changes],
                [c[1] for c in changes],
                [c[2] for c in changes],
            )
        return batches

    def close(self) -> None:
        super().close()
        for conn in (self._conn, self._chunk_conn):
            if conn is not None:
                conn.close()
        self._conn = self._chunk_conn = None


def _columns(rows: Sequence[Sequence[Any]], width: int) -> list[Sequence[Any]]:
    """``rows`` as ``width`` columns."""
    if not rows:
        return [[] for _ in range(width)]
    return list(zip(*rows, strict=True))


def create_cdc_reader(
    source: MySqlCdcSource, context: SourceReaderContext
) -> SourceReader[pa.RecordBatch, CdcSplit]:
    """The core's reader (:class:`~splitflow.connectors.cdc.reader.CdcReader`) over
    :class:`MySqlSplitReader`, taking the batch's :class:`~.pinning.BatchPosition`."""
    return CdcReader(
        lambda pinned: MySqlSplitReader(source, pinned, context.reader_id),
        context,
        report_marks=source.options.mode == "initial",
        pin_type=BatchPosition,
    )
