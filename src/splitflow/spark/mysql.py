"""Change data capture from MariaDB on Spark: ``format("splitflow-mysql-cdc")``.

Streaming reads snapshot the tables in parallel chunks, then stream the binlog;
``spark.read`` reads the snapshot only. The options are Flink CDC's MySQL connector's in
Spark's spelling (:mod:`splitflow.connectors.mysql.options`), plus the runtime's
(:mod:`splitflow.spark.options`); rows carry the tables' columns (the union by name), then
``op``, ``lsn`` (the transaction's GTID ``seq``; for ``r``, the position the chunk stands
at), ``commit_ts`` and ``table`` (``db.table``). The tables are described at ``load()``: a
missing table, a column type the source cannot map or a bad ``chunkKeyColumn`` fails there,
naming it. See ``docs/cdc.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from splitflow.connectors.mysql import options as mysql_options
from splitflow.errors import ConfigurationError
from splitflow.spark.cdc import CdcDataSource
from splitflow.spark.options import NAMES, PREFIXES, RuntimeOptions

if TYPE_CHECKING:  # PyMySQL (the mysql extra) is imported only when the source is used
    from splitflow.connectors.mysql.source import MySqlCdcSource


class MySqlCdcDataSource(CdcDataSource):
    """``splitflow-mysql-cdc``: a snapshot of tables, then their changes."""

    OPTIONS = mysql_options.OPTIONS
    DEFAULT_MAX_BYTES_PER_BATCH = 64 * 1024 * 1024
    """A micro-batch reads about 64 MiB of binlog unless an option sizes batches (the
    positions are transactions, sized by the binlog's bytes per transaction), for the
    reasons PostgreSQL's WAL bound has (``docs/postgres-cdc.md``)."""

    def __init__(self, options: dict[str, str]) -> None:
        from splitflow.connectors.mysql import catalog
        from splitflow.connectors.mysql.options import MySqlOptions

        self._options = MySqlOptions.parse(options, NAMES, PREFIXES)
        RuntimeOptions.parse(options)  # its errors before any connection is tried
        with catalog.connect(self._options) as conn:
            self._load_tables(catalog, conn, options)
        super().__init__(options)

    @classmethod
    def name(cls) -> str:
        return "splitflow-mysql-cdc"

    def create_source(self) -> MySqlCdcSource:
        from splitflow.connectors.mysql.source import MySqlCdcSource

        return self._recording(MySqlCdcSource(self._options, self._tables, self._row_bytes))

    def check_streaming(self) -> None:
        from splitflow.connectors.mysql import catalog

        with catalog.connect(self._options) as conn:
            catalog.check_binlog(conn, self._options.where)
        low, high = self._options.server_ids
        needed = 2 * self.runtime.parallelism if self._options.mode != "latest" else 1
        if high - low + 1 < needed:
            raise ConfigurationError(
                f"option serverId: {low}-{high} gives {high - low + 1} replica server id(s), "
                f"and {needed} binlog readers may run at once (two per reader with "
                f"parallelism {self.runtime.parallelism}: the log's and the chunks'); give a "
                f"range of at least {needed} ids that no other replica uses",
                option="serverId",
            )

    def __repr__(self) -> str:
        return f"MySqlCdcDataSource({self._options!r})"
