"""The CDC source's reader: chunk splits read in one snapshot each, the log split from the
slot with the SQL functions of logical decoding.

**Chunks.** A chunk is read in one ``REPEATABLE READ`` transaction: its snapshot (``xmin``,
``xmax``, transactions in progress) and the WAL insert position come from the first
statement, the rows straight into Arrow from the ADBC driver (:mod:`.snapshot`), and the
insert position after the rows is the chunk's ``high`` mark. The rows (``op = 'r'``,
``lsn`` = the position at the snapshot) and the :class:`~.splits.ChunkReadEvent` leave the
reader together, as one element, so a checkpoint never splits a chunk.

**The log.** The slice ``[a, b)`` of the log split is every transaction whose commit record
starts at an LSN in it. ``pg_logical_slot_peek_binary_changes(slot, b, ...)`` decodes the
slot's changes from its confirmed position up to the first commit at or past ``b``, without
consuming them, so a retried or replayed task reads the same slice; the driver advances the
slot once Spark has committed. Logical decoding reads only flushed WAL: before peeking, the
reader makes sure the WAL is flushed up to the insert position it sees (everything that
started before ``b`` ended before it), committing an empty transaction when something is
not, so a commit that started before ``b`` is never missed for not being on disk yet. A
change is left out when its chunk's snapshot already held it (:class:`~.splits.ChunkFilter`).

Values come from pgoutput in text form and go through the same type mapping as the
snapshot's rows (:mod:`.types`). A change is keyed by the table's primary key (pgoutput's
key flags mark the replica identity instead). An unchanged TOASTed value (a large value an
``UPDATE`` did not touch) comes as null, or from the old row under ``REPLICA IDENTITY FULL``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import psycopg
import pyarrow as pa
from psycopg import sql

from splitflow.api.reader import ReaderOutput, SourceReader, SourceReaderContext
from splitflow.api.split import SplitState
from splitflow.connectors.postgres import catalog, pgoutput, snapshot
from splitflow.connectors.postgres.splits import (
    CdcSplit,
    ChunkFilter,
    ChunkMark,
    ChunkReadEvent,
    ChunkSplit,
    LogSplit,
    mark_of,
)
from splitflow.connectors.postgres.types import METADATA, ColumnType, to_arrow
from splitflow.errors import ConnectorError
from splitflow.reader.base import SourceReaderBase
from splitflow.reader.emitter import RecordEmitter
from splitflow.reader.split_reader import RecordsBySplits, SplitReader, SplitSlice

if TYPE_CHECKING:
    from splitflow.connectors.postgres.source import PostgresCdcSource

ROWS_PER_BATCH = 8192


class Piece(NamedTuple):
    """What the split reader hands the emitter: rows up to ``next_position``, and a
    chunk's watermark with the chunk's rows."""

    batches: list[pa.RecordBatch]
    next_position: int
    mark: ChunkMark | None = None


class CdcEmitter(RecordEmitter[Piece, pa.RecordBatch, CdcSplit]):
    """Emits a piece's rows, reports a chunk's watermark, moves the position."""

    def __init__(self, context: SourceReaderContext, report_marks: bool) -> None:
        self._context = context
        self._report_marks = report_marks  # only the switch to the log needs them

    def emit(
        self, element: Piece, output: ReaderOutput[pa.RecordBatch], state: SplitState[CdcSplit]
    ) -> None:
        for batch in element.batches:
            output.collect(batch)
        if element.mark is not None and self._report_marks:
            self._context.send_source_event_to_coordinator(ChunkReadEvent(element.mark))
        state.position = element.next_position


class OutputSchema:
    """The source's row layout: the union of the tables' columns, then the metadata."""

    def __init__(self, columns: Sequence[tuple[str, ColumnType]]) -> None:
        self.columns = dict(columns)
        self.arrow = pa.schema(
            [pa.field(n, k.arrow) for n, k in self.columns.items()]
            + [pa.field(n, t) for n, t, _ in METADATA]
        )

    def batches(
        self,
        table: str,
        names: Sequence[str],
        values: Sequence[Any],
        rows: int,
        op: str | list[str],
        lsn: int | list[int],
        commit_ts: Any,
    ) -> list[pa.RecordBatch]:
        """``rows`` rows of ``table`` with columns ``names`` (the rest null) and their
        metadata; a metadata value that is not a list is the same for every row."""
        for name in names:
            if name not in self.columns:
                raise ConnectorError(
                    f"table {table} has column {name}, which is not in the query's schema "
                    "(it was added after the query started): restart the query"
                )
        given = dict(zip(names, values, strict=True))
        arrays = [
            given[name] if name in given else pa.nulls(rows, kind.arrow)
            for name, kind in self.columns.items()
        ]
        for (_, arrow, _), value in zip(METADATA, (op, lsn, commit_ts, table), strict=True):
            arrays.append(
                pa.array(value, arrow)
                if isinstance(value, list)
                else pa.repeat(pa.scalar(value, arrow), rows)
            )
        batches: list[pa.RecordBatch] = pa.Table.from_arrays(arrays, schema=self.arrow).to_batches()
        return batches


class CdcSplitReader(SplitReader[Piece, CdcSplit]):
    """Reads chunk and log slices (see the module doc). One connection per split reader."""

    def __init__(self, source: PostgresCdcSource) -> None:
        self._source = source
        self._options = source.options
        self._schema = OutputSchema(source.columns())
        self._slices: dict[str, SplitSlice[CdcSplit]] = {}
        self._log_at: dict[str, int] = {}  # how far each log split has been read
        self._wal_sizes: tuple[int, int] | None = None  # WAL page and segment size
        self._adbc: Any = None  # chunk reads (ADBC); the log and the catalog use psycopg
        self._conn: psycopg.Connection[Any] | None = None

    def _connection(self) -> psycopg.Connection[Any]:
        """Autocommit, so catalog reads hold no transaction; each chunk read and each peek
        is one explicit ``REPEATABLE READ READ ONLY`` transaction."""
        if self._conn is None or self._conn.closed:
            self._conn = catalog.connect(self._options, autocommit=True)
            self._conn.execute("SET synchronous_commit = on")  # see _read_log
            self._conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            self._conn.read_only = True
        return self._conn

    def handle_splits_changes(self, added: Sequence[SplitSlice[CdcSplit]]) -> None:
        self._slices.update((piece.split_id, piece) for piece in added)

    def remove_splits(self, split_ids: Sequence[str]) -> None:
        for split_id in split_ids:
            self._slices.pop(split_id, None)
            self._log_at.pop(split_id, None)

    def wake_up(self) -> None:
        pass  # every fetch returns after one bounded read

    def fetch(self) -> RecordsBySplits[Piece]:
        """One chunk (so its rows go out before the next is read), or the log once."""
        out: RecordsBySplits[Piece] = RecordsBySplits()
        chunks = [p for p in self._slices.values() if isinstance(p.split, ChunkSplit)]
        logs = [p for p in self._slices.values() if isinstance(p.split, LogSplit)]
        if chunks:
            piece, split = chunks[0], chunks[0].split
            assert isinstance(split, ChunkSplit)
            if piece.stop is not None and piece.stop <= split.position:
                out.mark_finished(split.split_id)  # held back: not in this batch
            else:
                out.add(split.split_id, self._read_chunk(split))
                out.mark_ended(split.split_id)
            del self._slices[split.split_id]
        for piece in logs:
            self._read_log(piece, out)  # type: ignore[arg-type]
            if piece.split_id in out.finished:
                del self._slices[piece.split_id]
        return out

    # -- chunks --------------------------------------------------------------------------------

    def _read_chunk(self, split: ChunkSplit) -> Piece:
        table = self._source.tables.get(split.table) or self._source.table(
            split.table, self._connection()
        )
        names = [name for name, _ in table.columns]
        query = f"SELECT {snapshot.select_list(table.columns)} FROM "
        query += catalog.quoted(split.table).as_string()
        key = sql.Identifier(split.key).as_string() if split.key else None
        conditions = []
        if key is not None and split.lo is not None:
            conditions.append(f"{key} >= {int(split.lo)}")
        if key is not None and split.hi is not None:
            conditions.append(f"{key} < {int(split.hi)}")
        if conditions:
            query += " WHERE " + " AND ".join(conditions)
        if self._adbc is None:
            self._adbc = snapshot.connect(self._options.conninfo, self._options.where)
        conn = self._adbc
        try:
            with conn.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                cursor.execute(
                    "SELECT pg_current_snapshot()::text, "
                    "pg_current_wal_insert_lsn() - '0/0'::pg_lsn"
                )
                snapshot_text, at = cursor.fetchone()
                cursor.execute(query)
                rows = cursor.fetch_arrow_table()
                cursor.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
                (high,) = cursor.fetchone()
        except Exception as e:
            if getattr(e, "sqlstate", None) == "42P01":
                raise ConnectorError(
                    f"chunk {split.split_id}: table {split.table} no longer exists"
                ) from None
            raise
        finally:
            conn.rollback()  # read only: nothing to commit; the next chunk starts afresh
        xmin, xmax, xip = _snapshot(snapshot_text)
        columns = snapshot.to_columns(rows, table.columns, f"chunk {split.split_id}")
        batches = self._schema.batches(
            split.table, names, columns, rows.num_rows, "r", int(at), None
        )
        mark = ChunkMark(
            split.split_id, split.table, split.lo, split.hi, xmin, xmax, xip, int(high)
        )
        return Piece(batches, 1, mark)

    # -- the log -------------------------------------------------------------------------------

    def _read_log(self, piece: SplitSlice[LogSplit], out: RecordsBySplits[Piece]) -> None:
        split = piece.split
        start = self._log_at.get(split.split_id, split.position)
        if piece.stop is not None and piece.stop <= start:
            out.mark_finished(split.split_id)
            return
        conn = self._connection()
        insert = _lsn(conn, "pg_current_wal_insert_lsn()")
        stop = insert if piece.stop is None else piece.stop
        if stop <= start:
            return
        if _lsn(conn, "pg_current_wal_flush_lsn()") < self._written_to(conn, insert):
            # WAL that no commit flushed yet (a standby snapshot record, an asynchronous
            # commit): flush it with an empty transaction's synchronous commit, so that every
            # commit record that starts before the stop is on disk and decodable.
            conn.execute("SELECT txid_current()")
        marks = [mark_of(m) for m in split.marks]
        pieces = LogDecoder(self._schema, marks, self._key_of).read(
            conn, self._options.slot, self._options.publication, start, stop
        )
        self._log_at[split.split_id] = stop
        out.add_all(split.split_id, pieces)
        if piece.stop is not None:
            out.mark_finished(split.split_id)

    def _key_of(self, table: str) -> Sequence[str]:
        """The primary key columns of ``table`` (a table found later: from the server)."""
        known = self._source.tables.get(table)
        return (known or self._source.table(table, self._connection())).key

    def _written_to(self, conn: psycopg.Connection[Any], insert: int) -> int:
        """Where the last WAL record before the insert position ``insert`` ends.

        That is ``insert`` itself, unless no record has been written on ``insert``'s page
        yet: the insert position then points past the page's header, while the records
        before it end at the page's start (and the flush position stays there until more
        WAL is written).
        """
        if self._wal_sizes is None:
            row = conn.execute(
                "SELECT current_setting('wal_block_size')::int, "
                "pg_size_bytes(current_setting('wal_segment_size'))"
            ).fetchone()
            assert row is not None
            self._wal_sizes = (int(row[0]), int(row[1]))
        block, segment = self._wal_sizes
        header = 40 if insert % segment < block else 24  # long header on a segment's 1st page
        within = insert % block
        return insert - within if within <= header else insert

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._adbc is not None:
            self._adbc.close()
            self._adbc = None


class LogDecoder:
    """Turns the slot's pgoutput messages of a slice into pieces of rows, one or more whole
    transactions per piece, leaving out the changes chunks already held."""

    def __init__(
        self,
        schema: OutputSchema,
        marks: Sequence[ChunkMark],
        key_of: Callable[[str], Sequence[str]],
    ) -> None:
        self._schema = schema
        self._key_of = key_of  # table -> its primary key columns
        self._filter = ChunkFilter(marks)
        self._relations: dict[int, pgoutput.Relation] = {}
        self._converters: dict[int, list[ColumnType]] = {}

    def read(
        self, conn: psycopg.Connection[Any], slot: str, publication: str, start: int, stop: int
    ) -> list[Piece]:
        pieces: list[Piece] = []
        rows: dict[int, list[tuple[str, int, Any, list[Any]]]] = {}
        count = 0
        keep = False
        begin: pgoutput.Begin | None = None
        try:
            with conn.transaction(), conn.cursor(name="splitflow_log") as cursor:
                cursor.itersize = 2000
                cursor.execute(
                    "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, NULL, "
                    "'proto_version', '1', 'publication_names', %s)",
                    (slot, pgoutput.format_lsn(stop), publication),
                )
                for (data,) in cursor:
                    message = pgoutput.decode(bytes(data))
                    if isinstance(message, pgoutput.Begin):
                        begin = message
                        keep = start <= message.final_lsn < stop
                    elif isinstance(message, pgoutput.Relation):
                        self._relations[message.oid] = message
                        self._converters.pop(message.oid, None)
                    elif isinstance(message, pgoutput.Commit):
                        if keep and count >= ROWS_PER_BATCH:
                            pieces.append(Piece(self._batches(rows), message.commit_lsn + 1))
                            rows, count = {}, 0
                        keep = False
                    elif (
                        keep
                        and begin is not None
                        and isinstance(message, pgoutput.Insert | pgoutput.Update | pgoutput.Delete)
                    ):
                        count += self._change(message, begin, rows)
        except psycopg.errors.ObjectInUse as e:
            raise ConnectorError(
                f"option slotName: replication slot {slot} is in use by another process "
                f"({e.diag.message_primary}): one query per slot"
            ) from None
        except psycopg.errors.UndefinedObject as e:
            raise ConnectorError(
                f"option slotName: replication slot {slot}: {e.diag.message_primary}"
            ) from None
        pieces.append(Piece(self._batches(rows), stop))
        return pieces

    def _change(
        self,
        message: pgoutput.Insert | pgoutput.Update | pgoutput.Delete,
        begin: pgoutput.Begin,
        rows: dict[int, list[tuple[str, int, Any, list[Any]]]],
    ) -> int:
        relation = self._relations[message.relation_oid]
        table = f"{relation.namespace}.{relation.name}"
        names = [c.name for c in relation.columns]
        # The primary key (the chunks are cut by it), not pgoutput's key flags: those mark
        # the replica identity, every column under REPLICA IDENTITY FULL.
        keys = [names.index(k) for k in self._key_of(table)]
        events: list[tuple[str, pgoutput.TupleData]] = []
        old = None if isinstance(message, pgoutput.Insert) else message.key or message.old
        if isinstance(message, pgoutput.Delete):
            assert old is not None
            events.append(("d", old))
        elif isinstance(message, pgoutput.Insert):
            events.append(("c", message.new))
        else:
            new = message.new
            if message.old is not None:  # REPLICA IDENTITY FULL: the old row is whole
                new = tuple(
                    was if now is pgoutput.UNCHANGED_TOAST else now
                    for now, was in zip(new, message.old, strict=True)
                )
            if old is not None and any(old[i] != new[i] for i in keys):
                events += [("d", old), ("c", new)]  # the primary key changed
            else:
                events.append(("u", new))
        emitted = 0
        for op, values in events:
            converted = self._convert(relation, table, values)
            key = converted[keys[0]] if len(keys) == 1 else None
            if not self._filter.already_read(table, key, begin.xid, begin.final_lsn):
                rows.setdefault(relation.oid, []).append(
                    (op, begin.final_lsn, begin.commit_ts, converted)
                )
                emitted += 1
        return emitted

    def _convert(
        self, relation: pgoutput.Relation, table: str, values: pgoutput.TupleData
    ) -> list[Any]:
        kinds = self._converters.get(relation.oid)
        if kinds is None:
            for column in relation.columns:
                if column.name not in self._schema.columns:
                    raise ConnectorError(
                        f"table {table} has column {column.name}, which is not in the "
                        "query's schema (it was added after the query started): restart the "
                        "query"
                    )
            kinds = self._converters[relation.oid] = [
                self._schema.columns[c.name] for c in relation.columns
            ]
        return [
            kind.from_text(raw) if isinstance(raw, bytes) else None
            for kind, raw in zip(kinds, values, strict=True)
        ]

    def _batches(
        self, rows: dict[int, list[tuple[str, int, Any, list[Any]]]]
    ) -> list[pa.RecordBatch]:
        batches = []
        for oid, changes in rows.items():
            relation = self._relations[oid]
            table = f"{relation.namespace}.{relation.name}"
            names = [c.name for c in relation.columns]
            columns = to_arrow([c[3] for c in changes], [self._schema.columns[n] for n in names])
            batches += self._schema.batches(
                table,
                names,
                columns,
                len(changes),
                [c[0] for c in changes],
                [c[1] for c in changes],
                [c[2] for c in changes],
            )
        return batches


def _lsn(conn: psycopg.Connection[Any], function: str) -> int:
    row = conn.execute(f"SELECT {function} - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


def _snapshot(text: str) -> tuple[int, int, tuple[int, ...]]:
    """``xmin:xmax:xip,...`` (``pg_current_snapshot()``) as numbers."""
    xmin, xmax, xip = text.split(":")
    return int(xmin), int(xmax), tuple(int(x) for x in xip.split(",") if x)


def create_cdc_reader(
    source: PostgresCdcSource, context: SourceReaderContext
) -> SourceReader[pa.RecordBatch, CdcSplit]:
    emitter = CdcEmitter(context, report_marks=source.options.mode == "initial")
    return SourceReaderBase(lambda: CdcSplitReader(source), emitter, context)
