"""The CDC source's reader: chunk splits read in one snapshot each, the log split from the
slot with the SQL functions of logical decoding. The plumbing (a chunk or a log piece per
fetch, the batch's pin, the emitter) is the CDC core's (:mod:`splitflow.connectors.cdc.reader`);
this module reads PostgreSQL.

**Chunks.** A chunk is read in one ``REPEATABLE READ READ ONLY`` transaction. On Spark it
imports the snapshot the driver pinned for the batch (:mod:`.pinning`): every read of the
batch, in any task or attempt, sees the same rows, and the chunk's watermark is the pinned
snapshot's (``xmin``, ``xmax``, transactions in progress, and the WAL insert position read
after it was taken, which is also the ``lsn`` of the ``r`` rows). Without a pin (a batch
read, the test harness) the transaction's first statement takes a snapshot of its own and
the insert position after the rows is the ``high`` mark. The rows come straight into Arrow
from the ADBC driver (:mod:`.snapshot`); they and the :class:`~.splits.ChunkReadEvent` leave
the reader together, as one element, so a checkpoint never splits a chunk.

**The log.** The slice ``[a, b)`` of the log split is every transaction whose commit record
starts at an LSN in it. ``pg_logical_slot_peek_binary_changes(slot, b, ...)`` decodes the
slot's changes from its confirmed position up to the first commit at or past ``b``, without
consuming them, so a retried or replayed task reads the same slice; the driver advances the
slot once Spark has committed. Logical decoding reads only flushed WAL: before peeking, the
reader makes sure the WAL is flushed up to the insert position it sees (everything that
started before ``b`` ended before it), committing an empty transaction when something is
not, so a commit that started before ``b`` is never missed for not being on disk yet. A
change is left out when its chunk's snapshot already held it (:class:`~.splits.ChunkFilter`).
A slice streams through the task: the peek's rows come through a server-side cursor on the
log's own connection, and each fetch returns one piece of whole transactions (about
:data:`ROWS_PER_BATCH` rows or :data:`PIECE_BYTES` bytes), so the task holds one piece, not
the slice, however large the slice was planned (:meth:`LogDecoder.read`).

Values come from pgoutput in text form and go through the same type mapping as the
snapshot's rows (:mod:`.types`). A change is keyed by the table's key (:class:`~.catalog.Table`;
pgoutput's key flags mark the replica identity instead). An update that changes the key, or
of a table without one (its old row is its identity, under ``REPLICA IDENTITY FULL``), comes
as a delete of the old row and an insert of the new one. An unchanged TOASTed value (a large
value an ``UPDATE`` did not touch) comes as null, or from the old row under ``REPLICA
IDENTITY FULL``.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any

import psycopg
import pyarrow as pa
from psycopg import sql

from splitflow.api.reader import SourceReader, SourceReaderContext
from splitflow.connectors.cdc import changes
from splitflow.connectors.cdc import reader as cdc_reader
from splitflow.connectors.cdc.reader import CdcEmitter, CdcReader, LogRead, Piece, Pinned
from splitflow.connectors.cdc.schema import OutputSchema
from splitflow.connectors.postgres import catalog, pgoutput, snapshot
from splitflow.connectors.postgres.pgoutput import format_lsn
from splitflow.connectors.postgres.pinning import BatchSnapshot, parse_snapshot
from splitflow.connectors.postgres.splits import (
    CdcSplit,
    ChunkFilter,
    ChunkMark,
    ChunkSplit,
    LogSplit,
    mark_of,
)
from splitflow.connectors.postgres.types import ColumnType, to_arrow
from splitflow.errors import ConnectorError, DataLossError, SchemaChangedError

if TYPE_CHECKING:
    from splitflow.connectors.postgres.source import PostgresCdcSource

COLUMNS = (
    "SELECT attname::text, atttypid::int8, atttypmod::int8 FROM pg_attribute "
    "WHERE attrelid = {table}::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
)
"""A table's columns as ``pg_attribute`` has them in the transaction's snapshot."""

REWRITTEN = (
    "SELECT string_agg(c.oid::regclass::text, ', ') FROM pg_class c "
    "WHERE c.relkind = 'r' AND c.relfilenode <> pg_relation_filenode(c.oid) AND (c.oid = "
    "{table}::regclass OR c.oid IN (SELECT relid FROM pg_partition_tree({table}::regclass)))"
)
"""The tables of a chunk's scan whose storage was replaced since the transaction's snapshot
(``pg_class`` read in the snapshot, the file in use now). ``TRUNCATE`` and the
table-rewriting ``ALTER TABLE`` are not MVCC-safe: a snapshot older than them reads the
new, empty storage. Run after the scan, whose lock holds off any further rewrite."""

ROWS_PER_BATCH = 8192
"""A log piece is cut after the first commit that brings it to this many rows ..."""
PIECE_BYTES = 4 * 1024 * 1024
"""... or to this many bytes of pgoutput messages (wide rows, large values)."""
FETCH_BYTES = 1024 * 1024
"""About how many bytes of the slot's messages one fetch from the log's cursor brings."""
FETCH_ROWS = 2000
"""At most this many messages per fetch from the log's cursor."""
_CHANGES = frozenset(b"IUD")
"""pgoutput's insert, update and delete message types."""


__all__ = [
    "CdcEmitter",
    "CdcReader",
    "CdcSplitReader",
    "LogDecoder",
    "LogRead",
    "OutputSchema",
    "Piece",
    "Pinned",
    "create_cdc_reader",
]


class CdcSplitReader(cdc_reader.CdcSplitReader):
    """Reads chunk and log slices (see the module doc) on the core's split reader
    (:class:`splitflow.connectors.cdc.reader.CdcSplitReader`). One catalog connection per
    split reader, plus the chunks' (ADBC) and the log's own."""

    def __init__(self, source: PostgresCdcSource, pinned: Pinned[BatchSnapshot]) -> None:
        super().__init__(source.columns(), pinned, source.kept_chunks)
        self._source = source
        self._options = source.options
        self._wal_sizes: tuple[int, int] | None = None  # WAL page and segment size
        self._adbc: Any = None  # chunk reads (ADBC); the log and the catalog use psycopg
        self._conn: psycopg.Connection[Any] | None = None
        self._log_conn: psycopg.Connection[Any] | None = None  # the log's open cursor

    def _connection(self) -> psycopg.Connection[Any]:
        """Autocommit, so catalog reads hold no transaction (the log's peeks run on
        :meth:`_log_connection`, each one explicit ``REPEATABLE READ READ ONLY``
        transaction)."""
        if self._conn is None or self._conn.closed:
            self._conn = catalog.connect(self._options, autocommit=True)
            self._conn.execute("SET synchronous_commit = on")  # see _read_log
            self._conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            self._conn.read_only = True
        return self._conn

    def _log_connection(self) -> psycopg.Connection[Any]:
        """The log's own: a slice's cursor keeps its transaction open on it from one fetch
        to the next, while catalog reads (a table's description, met while decoding) and
        chunk reads go on on the others."""
        if self._log_conn is None or self._log_conn.closed:
            self._log_conn = catalog.connect(self._options, autocommit=True)
            self._log_conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            self._log_conn.read_only = True
        return self._log_conn

    # -- chunks --------------------------------------------------------------------------------

    def read_chunk(self, split: ChunkSplit) -> Piece:
        table = self._source.tables.get(split.table) or self._source.table(
            split.table, self._connection()
        )
        names = [name for name, _ in table.columns]
        query = f"SELECT {snapshot.select_list(table.columns)} FROM "
        query += catalog.quoted(split.table).as_string()
        condition = catalog.chunk_condition(split)
        if condition:
            query += " WHERE " + condition
        if self._adbc is None:
            self._adbc = snapshot.connect(self._options.conninfo, self._options.where)
        conn = self._adbc
        pinned: BatchSnapshot | None = self._pinned.event
        try:
            with conn.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                if pinned is not None:
                    name = pinned.snapshot_id.replace("'", "''")
                    cursor.execute(f"SET TRANSACTION SNAPSHOT '{name}'")
                    at = high = pinned.at
                    xmin, xmax, xip = pinned.xmin, pinned.xmax, pinned.xip
                else:  # no runtime pins (a batch read, the harness): a snapshot of its own
                    cursor.execute(
                        "SELECT pg_current_snapshot()::text, "
                        "pg_current_wal_insert_lsn() - '0/0'::pg_lsn"
                    )
                    snapshot_text, at = cursor.fetchone()
                    xmin, xmax, xip = parse_snapshot(snapshot_text)
                cursor.execute("SET LOCAL synchronize_seqscans = off")  # rows in one order
                cursor.execute(query)
                rows = cursor.fetch_arrow_table()
                regclass = sql.Literal(catalog.quoted(split.table).as_string()).as_string()
                cursor.execute(COLUMNS.format(table=regclass))
                written = [tuple(r) for r in cursor.fetchall()]
                cursor.execute(
                    REWRITTEN.format(
                        table=sql.Literal(catalog.quoted(split.table).as_string()).as_string()
                    )
                )
                (rewritten,) = cursor.fetchone()
                if pinned is None:
                    cursor.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
                    (high,) = cursor.fetchone()
        except Exception as e:
            if getattr(e, "sqlstate", None) == "42P01":
                raise ConnectorError(
                    f"chunk {split.split_id}: table {split.table} no longer exists"
                ) from None
            if getattr(e, "sqlstate", None) == "42703":  # a column dropped or renamed
                self._changed_in_snapshot(split, table, None)
            if pinned is not None and getattr(e, "sqlstate", None) == "22023":
                raise ConnectorError(
                    f"chunk {split.split_id}: {pinned.where} is gone (the driver's transaction "
                    f"that holds it in {self._options.where} ended before the batch did): the "
                    "chunk is read only in its batch's snapshot, so that every read of the "
                    "batch returns the same rows; restart the query, which reads the batch "
                    "again under a new snapshot"
                ) from None
            raise
        finally:
            conn.rollback()  # read only: nothing to commit; the next chunk starts afresh
        if rewritten:
            raise ConnectorError(
                f"chunk {split.split_id}: table {rewritten} was truncated or rewritten (TRUNCATE "
                "or an ALTER TABLE that rewrites it) after "
                + ("the chunk's snapshot" if pinned is None else pinned.where)
                + " was taken, so the chunk's rows are no longer readable in it: "
                + (
                    "the task is retried under a new snapshot"
                    if pinned is None
                    else "restart the query, which reads the batch again under a new snapshot"
                )
            )
        if written != catalog.layout(table):
            self._changed_in_snapshot(split, table, written)
        columns = snapshot.to_columns(rows, table.columns, f"chunk {split.split_id}")
        batches = self._schema.batches(
            split.table, names, columns, rows.num_rows, "r", int(at), None
        )
        mark = ChunkMark(
            split.split_id, split.table, split.lo, split.hi, xmin, xmax, xip, int(high)
        )
        return Piece(batches, 1, mark)

    def _changed_in_snapshot(
        self,
        split: ChunkSplit,
        table: catalog.Table,
        written: list[tuple[Any, ...]] | None,
    ) -> None:
        """The chunk's table is not as the query describes it in the chunk's snapshot (an
        ``ALTER TABLE`` before the snapshot): the rows would lose what the change holds
        (an added column's values set since), and the log's changes before the snapshot
        are left out as the chunk's. Fails the read, unless Spark sees no change (a type
        change that keeps the Spark type)."""
        conn = self._connection()
        name = catalog.quoted(split.table).as_string(conn)
        if written is None:
            query = COLUMNS.format(table=sql.Literal(name).as_string(conn))
            written = [tuple(r) for r in conn.execute(query).fetchall()]
        row = conn.execute("SELECT %s::regclass::oid::int8", (name,)).fetchone()
        assert row is not None
        new = catalog.describe_relation(conn, table, int(row[0]), written)
        change = changes.difference(table, new)
        if not change:
            return
        raise SchemaChangedError(
            f"chunk {split.split_id}: table {split.table}'s schema changed before the chunk "
            f"was read ({change}), during the query's snapshot: the chunks read from then on "
            "would lose what the change holds. The query cannot go on: read the table in a "
            "new query (new checkpoint and stateDir); alter a table before its snapshot or "
            "once its chunks are read (see docs/postgres-cdc.md, Schema changes)",
            table=split.table,
            old=changes.columns_shown(table),
            new=changes.columns_shown(new),
            position=f"chunk {split.split_id}",
            recorded=False,
        )

    # -- the log -------------------------------------------------------------------------------

    def open_log(self, split: LogSplit, start: int, stop: int | None) -> LogRead | None:
        """Start reading the slice ``[start, stop)``: make sure the WAL before the insert
        position is flushed, check the slot still holds ``start``, and open the peek
        (:meth:`LogDecoder.read`), whose pieces the core takes one per fetch. Without a
        planned stop (the harness), the slice reads up to the insert position now."""
        conn = self._connection()
        insert = _lsn(conn, "pg_current_wal_insert_lsn()")
        stop = insert if stop is None else stop
        if stop <= start:
            return None
        if _lsn(conn, "pg_current_wal_flush_lsn()") < self._written_to(conn, insert):
            # WAL that no commit flushed yet (a standby snapshot record, an asynchronous
            # commit): flush it with an empty transaction's synchronous commit, so that
            # every commit record that starts before the stop is on disk and decodable.
            conn.execute("SELECT txid_current()")
        self._check_slot(conn, split, start)
        marks = [mark_of(m) for m in split.marks]
        decoder = LogDecoder(
            self._schema,
            marks,
            self._table_of,
            self._describe_relation,
            self._options.schema_changes == "stop",
        )
        pieces = decoder.read(
            self._log_connection(), self._options.slot, self._options.publication, start, stop
        )
        return LogRead(pieces, stop)

    def _check_slot(self, conn: psycopg.Connection[Any], split: LogSplit, start: int) -> None:
        """The slot still holds the slice from ``start``: a peek starts at the slot's
        confirmed position, so one past ``start`` (advanced by another client between two
        reads of the slice, as this query's driver never does) would silently skip the
        changes between."""
        row = conn.execute(
            "SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (self._options.slot,),
        ).fetchone()
        confirmed = None if row is None or row[0] is None else int(row[0])
        slot = f"replication slot {self._options.slot} in {self._options.where}"
        if confirmed is None:
            raise DataLossError(
                f"{slot} is gone: the changes after LSN {format_lsn(start)} cannot be read",
                split_id=split.split_id,
            )
        if confirmed > start:
            raise DataLossError(
                f"{slot} has confirmed LSN {format_lsn(confirmed)}, past this slice's start "
                f"{format_lsn(start)}: another reader consumed the changes between",
                split_id=split.split_id,
            )

    def close_log_read(self, reading: LogRead) -> None:
        """Close a slice's cursor and roll its transaction back; if the connection broke,
        closing it ends the transaction on the server as well."""
        try:
            reading.pieces.close()
        except psycopg.Error:
            if self._log_conn is not None:
                self._log_conn.close()

    def _table_of(self, table: str) -> catalog.Table:
        """The description of ``table`` (a table found later: from the server)."""
        return self._source.table(table, self._connection())

    def _describe_relation(
        self, described: catalog.Table, relation: pgoutput.Relation
    ) -> catalog.Table:
        columns = [(c.name, c.type_oid, c.type_modifier) for c in relation.columns]
        return catalog.describe_relation(self._connection(), described, relation.oid, columns)

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
        super().close()
        if self._log_conn is not None:
            self._log_conn.close()
            self._log_conn = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._adbc is not None:
            self._adbc.close()
            self._adbc = None


Rows = dict[tuple[str, tuple[str, ...]], list[tuple[str, int, Any, list[Any]]]]
"""A piece's changes by table and the columns they were written with: ``(op, lsn,
commit time, values)``."""


class LogDecoder:
    """Turns the slot's pgoutput messages of a slice into pieces of rows, one or more whole
    transactions per piece, leaving out the changes chunks already held."""

    def __init__(
        self,
        schema: OutputSchema[ColumnType],
        marks: Sequence[ChunkMark],
        table_of: Callable[[str], catalog.Table],
        describe: Callable[[catalog.Table, pgoutput.Relation], catalog.Table],
        stop: bool,
    ) -> None:
        self._schema = schema
        self._table_of = table_of  # table -> its key and chunk key
        self._describe = describe  # a table as a Relation message writes it
        self._stop = stop  # schemaChanges=stop
        self._filter = ChunkFilter(marks)
        self._relations: dict[int, pgoutput.Relation] = {}
        self._converters: dict[int, list[ColumnType]] = {}
        self._checked: set[int] = set()  # relations whose schema is the query's

    def read(
        self, conn: psycopg.Connection[Any], slot: str, publication: str, start: int, stop: int
    ) -> Generator[Piece, None, None]:
        """The slice ``[start, stop)``, lazily, as pieces of whole transactions.

        The peek runs when the first piece is asked for (the server decodes the slot's
        changes up to the first commit at or past ``stop`` into its own work space, spilling
        to disk). Its rows come through a server-side cursor, about :data:`FETCH_BYTES` per
        fetch, and a piece is cut after the first commit that brings it to
        :data:`ROWS_PER_BATCH` rows or :data:`PIECE_BYTES` bytes of messages. Each piece but
        the last moves the position to just after its last commit (``commit_lsn + 1``, below
        ``stop``); the last one, perhaps empty, moves it to ``stop``. So memory holds one
        piece and one fetch, not the slice. A transaction is never cut: one larger than a
        piece makes a piece of its own.

        The cursor's transaction stays open on ``conn`` between pieces, until the last piece
        is taken or the generator is closed (``close()`` rolls it back); ``conn`` serves
        nothing else meanwhile. The changes of transactions outside the slice (between the
        slot's restart point and ``start``) are skipped without being decoded.
        """
        rows: Rows = {}
        pending: Rows = {}  # the transaction's, until its commit
        count = size = 0  # rows and bytes of messages in the piece
        keep = False
        begin: pgoutput.Begin | None = None
        try:
            with conn.transaction(), conn.cursor(name="splitflow_log", binary=True) as cursor:
                cursor.execute(
                    "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, NULL, "
                    "'proto_version', '1', 'publication_names', %s)",
                    (slot, pgoutput.format_lsn(stop), publication),
                )
                wanted = 100  # then sized from the messages' mean size to FETCH_BYTES
                while True:
                    page = cursor.fetchmany(wanted)
                    fetched = 0
                    for (data,) in page:
                        fetched += len(data)
                        if not keep and data[0] in _CHANGES:
                            continue  # a change outside the slice
                        message = pgoutput.decode(bytes(data))
                        if isinstance(message, pgoutput.Begin):
                            begin = message
                            keep = start <= message.final_lsn < stop
                        elif isinstance(message, pgoutput.Relation):
                            self._relations[message.oid] = message
                            self._converters.pop(message.oid, None)
                            self._checked.discard(message.oid)
                        elif isinstance(message, pgoutput.Commit):
                            for key, changes in pending.items():
                                rows.setdefault(key, []).extend(changes)
                            pending = {}
                            full = count >= ROWS_PER_BATCH or size >= PIECE_BYTES
                            if keep and full and message.commit_lsn + 1 < stop:
                                yield Piece(self._batches(rows), message.commit_lsn + 1)
                                rows, count, size = {}, 0, 0
                            keep = False
                        elif (
                            keep
                            and begin is not None
                            and isinstance(
                                message, pgoutput.Insert | pgoutput.Update | pgoutput.Delete
                            )
                        ):
                            cut = self._schema_change(message.relation_oid, begin, start)
                            if cut is not None:  # the slice ends before this transaction
                                yield Piece(self._batches(rows), begin.final_lsn, cut=cut)
                                return
                            count += self._change(message, begin, pending)
                            size += len(data)
                    if len(page) < wanted:
                        break
                    wanted = max(1, min(FETCH_ROWS, FETCH_BYTES * len(page) // max(1, fetched)))
        except psycopg.errors.ObjectInUse as e:
            raise ConnectorError(
                f"option slotName: replication slot {slot} is in use by another process "
                f"({e.diag.message_primary}): one query per slot"
            ) from None
        except psycopg.errors.UndefinedObject as e:
            raise ConnectorError(
                f"option slotName: replication slot {slot}: {e.diag.message_primary}"
            ) from None
        yield Piece(self._batches(rows), stop)

    def _change(
        self,
        message: pgoutput.Insert | pgoutput.Update | pgoutput.Delete,
        begin: pgoutput.Begin,
        rows: Rows,
    ) -> int:
        relation = self._relations[message.relation_oid]
        table = f"{relation.namespace}.{relation.name}"
        names = tuple(c.name for c in relation.columns)
        # The table's key, not pgoutput's key flags: those mark the replica identity, every
        # column under REPLICA IDENTITY FULL. Each row is filtered by its chunk key's value.
        described = self._table_of(table)
        keys = [names.index(k) for k in described.key]
        chunk_key = names.index(described.chunk_key) if described.chunk_key else None
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
            if old is not None and (not keys or any(old[i] != new[i] for i in keys)):
                # The key changed, or there is none (the old row is the row's identity): a
                # downstream cannot apply the update in place.
                events += [("d", old), ("c", new)]
            else:
                events.append(("u", new))
        emitted = 0
        for op, values in events:
            converted = self._convert(relation, table, values)
            key = None if chunk_key is None else converted[chunk_key]
            if not self._filter.already_read(table, key, begin.xid, begin.final_lsn):
                rows.setdefault((table, names), []).append(
                    (op, begin.final_lsn, begin.commit_ts, converted)
                )
                emitted += 1
        return emitted

    def _convert(
        self, relation: pgoutput.Relation, table: str, values: pgoutput.TupleData
    ) -> list[Any]:
        kinds = self._converters.get(relation.oid)
        if kinds is None:
            self._schema.check(table, [c.name for c in relation.columns])
            kinds = self._converters[relation.oid] = [
                self._schema.columns[c.name] for c in relation.columns
            ]
        return [
            kind.from_text(raw) if isinstance(raw, bytes) else None
            for kind, raw in zip(kinds, values, strict=True)
        ]

    def _schema_change(
        self, oid: int, begin: pgoutput.Begin, start: int
    ) -> changes.SchemaChange | None:
        """The change to cut the slice at, when the log writes ``oid``'s table otherwise
        than the query describes it (see :mod:`splitflow.connectors.cdc.changes`); checked
        once per Relation message. A change no restart can follow, or any with
        ``schemaChanges=fail``, raises :class:`~splitflow.errors.SchemaChangedError`.

        At the slice's start there is nothing before the change to cut off: the slice
        starts where an earlier read of the log cut it, after a restart with the new
        schema; a transaction that changed rows of the table before altering it is read
        under the new schema (a column it dropped fails the read, naming it)."""
        if oid in self._checked:
            return None
        relation = self._relations[oid]
        table = f"{relation.namespace}.{relation.name}"
        described = self._table_of(table)
        written = [(c.name, c.type_oid, c.type_modifier) for c in relation.columns]
        if written == catalog.layout(described):
            self._checked.add(oid)
            return None
        new = self._describe(described, relation)
        difference = changes.difference(described, new)
        problem = difference.problem(described) if difference else None
        at = format_lsn(begin.final_lsn)
        if difference and (problem or not self._stop):
            why = f"{problem}: no restart can follow it" if problem else "schemaChanges=fail"
            raise changes.not_followed(
                table, described, new, f"log position {at}", str(difference), why
            )
        if not difference or begin.final_lsn <= start:
            self._checked.add(oid)
            return None
        return changes.SchemaChange(table, begin.final_lsn, at, new)

    def _batches(self, rows: Rows) -> list[pa.RecordBatch]:
        batches = []
        for (table, names), items in rows.items():
            columns = to_arrow([c[3] for c in items], [self._schema.columns[n] for n in names])
            batches += self._schema.batches(
                table,
                names,
                columns,
                len(items),
                [c[0] for c in items],
                [c[1] for c in items],
                [c[2] for c in items],
            )
        return batches


def _lsn(conn: psycopg.Connection[Any], function: str) -> int:
    row = conn.execute(f"SELECT {function} - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


def create_cdc_reader(
    source: PostgresCdcSource, context: SourceReaderContext
) -> SourceReader[pa.RecordBatch, CdcSplit]:
    """The core's reader (:class:`~splitflow.connectors.cdc.reader.CdcReader`) over
    :class:`CdcSplitReader`, taking the batch's :class:`~.pinning.BatchSnapshot`."""
    return CdcReader(
        lambda pinned: CdcSplitReader(source, pinned),
        context,
        report_marks=source.options.mode == "initial",
        pin_type=BatchSnapshot,
    )
