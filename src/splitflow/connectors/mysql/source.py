"""The MySQL/MariaDB CDC source: a snapshot in parallel chunks, then the binlog, on the CDC
core (:mod:`splitflow.connectors.cdc`).

The log's positions are the GTID sequence numbers of the server's one GTID domain
(:mod:`.gtid`). The enumerator checks the binlog's settings and takes the log's start from
a consistent snapshot before any chunk is read, so every transaction before it is visible to
every chunk's snapshot and every one after it is in the log; cuts each table into key-range
chunks; and, once every chunk is read, starts the log split with the chunks' positions
(:class:`~splitflow.connectors.cdc.splits.PositionMark`). The binlog is the server's to
keep: nothing is confirmed to it (``binlog_expire_logs_seconds`` must outlast a stopped
query, or its restart fails with a DataLossError).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import pyarrow as pa
import pymysql

from splitflow.api.enumerator import SplitEnumeratorContext
from splitflow.api.reader import SourceReader, SourceReaderContext
from splitflow.connectors.cdc.source import CdcEnumerator, CdcSource
from splitflow.connectors.cdc.splits import (
    CdcSplit,
    CdcState,
    Cut,
    LogSplit,
    PositionMark,
)
from splitflow.connectors.mysql import catalog, gtid
from splitflow.connectors.mysql.catalog import MySqlTable
from splitflow.connectors.mysql.options import MySqlOptions
from splitflow.connectors.mysql.pinning import PositionPinner
from splitflow.errors import ConnectorError, DataLossError

log = logging.getLogger("splitflow.mysql")

SOURCE = "mysql-cdc"
LOG_NAME = "binlog"
"""The log split's name: its id is ``log:binlog``."""


class MySqlEnumerator(CdcEnumerator[Any]):
    """The core's enumerator on MariaDB: discovery lists the tables (and checks the
    binlog's settings before the log starts); the log starts at a consistent snapshot's
    position; the log's end is ``@@gtid_binlog_pos``."""

    logger: ClassVar[logging.Logger] = log

    def __init__(
        self,
        source: MySqlCdcSource,
        context: SplitEnumeratorContext[CdcSplit],
        state: CdcState | None,
    ) -> None:
        super().__init__(source, context, state)
        self._my = source
        self._options = source.options
        self._conn: Any = None
        self._bytes_per_position = 1000.0

    def connect(self) -> AbstractContextManager[Any]:
        conn: AbstractContextManager[Any] = catalog.connect(self._options)
        return conn

    def list_tables(self, conn: Any) -> list[str]:
        return catalog.list_tables(conn, self._options)

    def prepare_log(self, conn: Any, tables: list[str], new: list[str], start: bool) -> int | None:
        """The binlog's settings; with ``start``, the log starts at the position of a
        consistent snapshot taken now."""
        catalog.check_binlog(conn, self._options.where)
        if not start:
            return None
        _, _, position = catalog.snapshot_position(conn, self._options.where)
        return position

    def cut_table(self, conn: Any, table: str) -> Cut:
        return catalog.cut(conn, self._my.table(table, conn), self._options.chunk_size)

    def key_after(self, conn: Any, table: str, key: str, at: int, rows: int) -> int | None:
        return catalog.key_after(conn, table, key, at, rows)

    def _connection(self) -> Any:
        if self._conn is None or not self._conn.open:
            self._conn = catalog.connect(self._options)
        return self._conn

    def log_end(self, split: LogSplit | None) -> int:
        """``@@gtid_binlog_pos`` as a position; for a log split, also checks that the
        binlog still holds what it has not read (a DataLossError otherwise)."""
        try:
            return self._log_end(split)
        except pymysql.err.OperationalError:  # the server dropped the connection: again once
            self.close()
            return self._log_end(split)

    def _log_end(self, split: LogSplit | None) -> int:
        conn = self._connection()
        where = self._options.where
        ((pos,),) = catalog.query(conn, "SELECT @@gtid_binlog_pos")
        end = gtid.position_after(pos, where)
        if split is None:
            return end
        files = catalog.query(conn, "SHOW BINARY LOGS")
        if not files:
            raise ConnectorError(f"MySQL {where} writes no binlog (log_bin is OFF)")
        ((oldest,),) = catalog.query(conn, "SELECT BINLOG_GTID_POS(%s, 4)", (files[0][0],))
        first = gtid.position_after(oldest, where)  # the first position still in the binlog
        if first > split.position:
            raise DataLossError(
                f"the binlog of {where} starts at position {first} ({files[0][0]}, after "
                f"GTID {oldest}) but this query's log is at {split.position}: the binlog "
                "files between were purged (binlog_expire_logs_seconds, PURGE BINARY LOGS), "
                "and the changes in them cannot be read",
                split_id=split.split_id,
            )
        if end > first:
            total = sum(int(f[1]) for f in files)
            self._bytes_per_position = max(1.0, total / (end - first))
        return end

    def bytes_per_log_position(self) -> float:
        """The binlog's bytes per transaction (its files' size over the transactions in
        them), measured when the log was last planned."""
        return self._bytes_per_position

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class MySqlCdcSource(CdcSource[MySqlOptions, MySqlTable]):
    """Change data capture from MariaDB (see the module doc and ``docs/cdc.md``).

    ``tables``: the tables matched when the source was made, described; the output schema
    is the union of their columns by name, then ``op``, ``lsn`` (the GTID ``seq``),
    ``commit_ts`` and ``table`` (``db.table``).
    """

    source_name: ClassVar[str] = SOURCE
    tables_option: ClassVar[str] = "tableName"
    mark_type: ClassVar[type[Any]] = PositionMark

    def __init__(
        self,
        options: MySqlOptions,
        tables: Sequence[MySqlTable],
        row_bytes: Mapping[str, int] | None = None,
    ) -> None:
        super().__init__(options, tables, row_bytes)

    @property
    def log_name(self) -> str:
        return LOG_NAME

    def describe(self, conn: Any, name: str) -> MySqlTable:
        return catalog.describe_table(conn, name, self.options)

    def enumerator(
        self, context: SplitEnumeratorContext[CdcSplit], state: CdcState | None
    ) -> MySqlEnumerator:
        return MySqlEnumerator(self, context, state)

    def create_reader(self, context: SourceReaderContext) -> SourceReader[pa.RecordBatch, CdcSplit]:
        from splitflow.connectors.mysql.reader import create_cdc_reader

        return create_cdc_reader(self, context)

    def create_read_pinner(self) -> PositionPinner:
        """One binlog position per batch that reads chunks (:mod:`.pinning`)."""
        return PositionPinner(self.options)
