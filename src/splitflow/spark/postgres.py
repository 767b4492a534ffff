"""Change data capture from PostgreSQL on Spark: ``format("splitflow-postgres-cdc")``.

Streaming reads snapshot the tables in parallel chunks, then stream the log; ``spark.read``
reads the snapshot only. The options are in :mod:`splitflow.connectors.postgres.options`
(plus the runtime's, :mod:`splitflow.spark.options`); rows carry the tables' columns (the
union by name), then ``op`` (``r`` snapshot read, ``c``, ``u``, ``d``), ``lsn`` (of the
commit; of the snapshot for ``r``), ``commit_ts`` and ``table``. The tables are described
at ``load()``: a missing table, a column type the source cannot map or a bad
``chunkKeyColumn`` fails there, naming it; a stream of a table without a primary key whose
replica identity is not FULL fails when the stream starts. See ``docs/postgres-cdc.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from splitflow.connectors.postgres import options as postgres_options
from splitflow.spark.cdc import CdcDataSource
from splitflow.spark.options import NAMES, PREFIXES, RuntimeOptions

if TYPE_CHECKING:  # psycopg (the postgres extra) is imported only when the source is used
    from splitflow.connectors.postgres.source import PostgresCdcSource


class PostgresCdcDataSource(CdcDataSource):
    """``splitflow-postgres-cdc``: a snapshot of tables, then their changes."""

    OPTIONS = postgres_options.OPTIONS
    DEFAULT_MAX_BYTES_PER_BATCH = 64 * 1024 * 1024
    """A micro-batch reads at most 64 MiB of WAL unless an option sizes batches. Without a
    bound, the first log batch after a snapshot held every change made during it, in one
    task that a crash replays whole. Readers stream a slice in bounded memory whatever its
    size, so the bound is about what a batch costs: a replay re-reads at most 64 MiB of WAL,
    and the server's peek materializes about as much. Larger batches save little: such a
    batch took 2-3 s on local Spark (2 cores, 33,000 rows of 1.8 KB), of which about 0.3 s
    is the batch's fixed cost. The bound leaves the snapshot as it was (every chunk with
    rows to read still moves) and a log at the head, whose batches are far smaller."""

    def __init__(self, options: dict[str, str]) -> None:
        from splitflow.connectors.postgres import catalog
        from splitflow.connectors.postgres.options import PostgresOptions

        self._options = PostgresOptions.parse(options, NAMES, PREFIXES)
        RuntimeOptions.parse(options)  # its errors before any connection is tried
        with catalog.connect(self._options, autocommit=True) as conn:
            self._load_tables(catalog, conn, options)
        super().__init__(options)

    @classmethod
    def name(cls) -> str:
        return "splitflow-postgres-cdc"

    def create_source(self) -> PostgresCdcSource:
        from splitflow.connectors.postgres.source import PostgresCdcSource

        return self._recording(PostgresCdcSource(self._options, self._tables, self._row_bytes))

    def check_streaming(self) -> None:
        from splitflow.connectors.postgres import catalog

        self._options.check_streaming()
        if self._options.mode != "snapshotOnly":
            for table in self._tables:
                catalog.check_replica_identity(table)
            with catalog.connect(self._options, autocommit=True) as conn:
                catalog.check_logical(conn, self._options.where)

    def __repr__(self) -> str:
        return f"PostgresCdcDataSource({self._options!r})"
