"""The PostgreSQL CDC source: a snapshot in parallel chunks, then one log split, on the CDC
core (:mod:`splitflow.connectors.cdc`).

The enumerator (driver) makes the publication and the replication slot before anything is
read, so the log holds every change from then on; cuts each table into key-range chunks and
assigns them (balanced); collects each chunk's watermark (:class:`~.splits.ChunkMark`) as
the chunk is read; and, once every chunk is read, starts the log split from the slot's
position with the marks, so the log skips exactly the changes a chunk's snapshot already
held. While chunks are read the source is processing backlog; the log is backlog up to the
WAL position when it starts. The slot's confirmed position follows the log only as far as
Spark has committed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import psycopg
import pyarrow as pa

from splitflow.api.enumerator import SplitEnumeratorContext
from splitflow.api.reader import SourceReader, SourceReaderContext
from splitflow.connectors.cdc.changes import SchemaRecord, StateFile
from splitflow.connectors.cdc.source import CdcEnumerator as CoreEnumerator
from splitflow.connectors.cdc.source import CdcSource
from splitflow.connectors.cdc.splits import Cut
from splitflow.connectors.postgres import catalog
from splitflow.connectors.postgres.catalog import Table
from splitflow.connectors.postgres.options import PostgresOptions
from splitflow.connectors.postgres.pgoutput import format_lsn
from splitflow.connectors.postgres.pinning import SnapshotPinner
from splitflow.connectors.postgres.splits import (
    SOURCE,
    CdcSplit,
    CdcState,
    ChunkMark,
    LogSplit,
)
from splitflow.connectors.postgres.types import ColumnType, TypeMapping
from splitflow.errors import DataLossError

log = logging.getLogger("splitflow.postgres")


class CdcEnumerator(CoreEnumerator[psycopg.Connection[Any]]):
    """The core's enumerator (:class:`splitflow.connectors.cdc.source.CdcEnumerator`) on
    PostgreSQL: discovery lists the tables, checks ``wal_level`` and replica identities,
    makes the publication and then the slot; the log's end is the WAL insert position; a
    completed checkpoint advances the slot.

    Tables that match ``tables`` after the log started are snapshotted too while the log
    runs, without watermarks (``docs/postgres-cdc.md`` names the one race an upsert by
    key with the highest ``lsn`` misses).
    """

    logger: ClassVar[logging.Logger] = log
    confirm_warning: ClassVar[str] = "splitflow: could not advance the replication slot: %s"

    def __init__(
        self,
        source: PostgresCdcSource,
        context: SplitEnumeratorContext[CdcSplit],
        state: CdcState | None,
    ) -> None:
        source.options.check_streaming()
        super().__init__(source, context, state)
        self._pg = source
        self._options = source.options
        self._conn: psycopg.Connection[Any] | None = None

    # -- discovery (worker thread) ------------------------------------------------------------

    def connect(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        return catalog.connect(self._options, autocommit=True)

    def list_tables(self, conn: psycopg.Connection[Any]) -> list[str]:
        return catalog.list_tables(conn, self._options)

    def prepare_log(
        self, conn: psycopg.Connection[Any], tables: list[str], new: list[str], start: bool
    ) -> int | None:
        """``wal_level``, the new tables' replica identity (before they are published),
        the publication, then (``start``) the slot, whose position the log starts from."""
        catalog.check_logical(conn, self._options.where)
        for table in new:  # before they are published (see check_replica_identity)
            catalog.check_replica_identity(self._pg.table(table, conn))
        # The publication first: the slot decodes changes with the catalog as of their LSN,
        # and a change from before the publication existed fails.
        catalog.ensure_publication(conn, self._options, tables)
        return catalog.ensure_slot(conn, self._options) if start else None

    def cut_table(self, conn: psycopg.Connection[Any], table: str) -> Cut:
        return catalog.cut(conn, self._pg.table(table, conn), self._options.chunk_size)

    def key_after(
        self, conn: psycopg.Connection[Any], table: str, key: str, at: int, rows: int
    ) -> int | None:
        return catalog.key_after(conn, table, key, at, rows)

    # -- positions and the slot ----------------------------------------------------------------

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = catalog.connect(self._options, autocommit=True)
        return self._conn

    def log_end(self, split: LogSplit | None) -> int:
        """The WAL insert position; for a log split, also checks that the slot still holds
        what it has not read (a DataLossError otherwise)."""
        insert, confirmed = self._wal_positions()
        if split is None:
            return insert
        if confirmed is None:
            raise DataLossError(
                f"replication slot {split.name} in {self._options.where} is gone: the "
                f"changes after LSN {format_lsn(split.position)} cannot be read",
                split_id=split.split_id,
            )
        if confirmed > split.position:
            raise DataLossError(
                f"replication slot {split.name} has confirmed LSN {format_lsn(confirmed)}, "
                f"past this query's position {format_lsn(split.position)}: another reader "
                "consumed the changes between",
                split_id=split.split_id,
            )
        return insert

    def _wal_positions(self) -> tuple[int, int | None]:
        """The WAL insert position and the slot's confirmed one (None: no such slot). A
        connection the server dropped (a restart) is made again once."""
        query = (
            "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn, "
            "(SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots "
            " WHERE slot_name = %s)"
        )
        try:
            row = self._connection().execute(query, (self._options.slot,)).fetchone()
        except psycopg.OperationalError:
            self.close()
            row = self._connection().execute(query, (self._options.slot,)).fetchone()
        assert row is not None
        return int(row[0]), None if row[1] is None else int(row[1])

    def confirm(self, position: int) -> None:
        """Advance the slot's confirmed position to ``position`` (never back)."""
        with catalog.connect(self._options, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_replication_slot_advance(slot_name, %s::pg_lsn) "
                "FROM pg_replication_slots "
                "WHERE slot_name = %s AND confirmed_flush_lsn < %s::pg_lsn",
                (format_lsn(position), self._options.slot, format_lsn(position)),
            )

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class PostgresCdcSource(CdcSource[PostgresOptions, Table]):
    """Change data capture from PostgreSQL (see the module doc and ``docs/postgres-cdc.md``).

    ``tables``: the tables matched when the source was made, described (columns, keys); the
    output schema is the union of their columns by name, then ``op``, ``lsn``,
    ``commit_ts`` and ``table``.
    """

    source_name: ClassVar[str] = SOURCE
    mark_type: ClassVar[type[Any]] = ChunkMark
    keeps_chunk_reads: ClassVar[bool] = True  # the exported snapshot ends with the driver

    def __init__(
        self,
        options: PostgresOptions,
        tables: Sequence[Table],
        row_bytes: Mapping[str, int] | None = None,
    ) -> None:
        super().__init__(options, tables, row_bytes)

    @property
    def log_name(self) -> str:
        return self.options.slot

    def describe(self, conn: Any, name: str) -> Table:
        return catalog.describe_table(conn, name, self.options)

    def schema_record_in(self, file: StateFile) -> SchemaRecord:
        return SchemaRecord(file, Table, _encode_type, _decode_type)

    def enumerator(
        self, context: SplitEnumeratorContext[CdcSplit], state: CdcState | None
    ) -> CdcEnumerator:
        return CdcEnumerator(self, context, state)

    def create_reader(self, context: SourceReaderContext) -> SourceReader[pa.RecordBatch, CdcSplit]:
        from splitflow.connectors.postgres.reader import create_cdc_reader

        return create_cdc_reader(self, context)

    def create_read_pinner(self) -> SnapshotPinner:
        """One snapshot per batch that reads chunks (:mod:`.pinning`)."""
        return SnapshotPinner(self.options, self.kept_chunks)


def _encode_type(kind: ColumnType) -> list[Any]:
    return [kind.type_oid, kind.type_modifier, kind.type_name]


def _decode_type(table: str, column: str, data: list[Any]) -> ColumnType:
    oid, modifier, name = data
    return TypeMapping.for_column(table, column, int(oid), int(modifier), str(name))
