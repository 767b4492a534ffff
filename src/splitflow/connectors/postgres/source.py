"""The PostgreSQL CDC source: a snapshot in parallel chunks, then one log split.

The enumerator (driver) makes the replication slot before anything is read, so the log
holds every change from then on; cuts each table into key-range chunks and assigns them
(balanced); collects each chunk's watermark (:class:`~.splits.ChunkMark`) as the chunk is
read; and, once every chunk is read, starts the log split from the slot's position with the
marks, so the log skips exactly the changes a chunk's snapshot already held. While chunks
are read the source is processing backlog; the log is backlog up to the WAL position when it
starts. The slot's confirmed position follows the log only as far as Spark has committed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, cast

import psycopg
import pyarrow as pa

from splitflow.api.assigner import AssignerState, AssigningSplitEnumerator
from splitflow.api.enumerator import SplitEnumerator, SplitEnumeratorContext, SplitExtent
from splitflow.api.events import SourceEvent
from splitflow.api.reader import SourceReader, SourceReaderContext
from splitflow.api.source import (
    Boundedness,
    Source,
    SupportsPinnedReads,
    SupportsSplitReassignmentOnRecovery,
)
from splitflow.api.split import Codec
from splitflow.connectors.postgres import catalog
from splitflow.connectors.postgres.catalog import Table
from splitflow.connectors.postgres.options import PostgresOptions
from splitflow.connectors.postgres.pgoutput import format_lsn
from splitflow.connectors.postgres.pinning import SnapshotPinner
from splitflow.connectors.postgres.splits import (
    CdcSplit,
    CdcSplitCodec,
    CdcState,
    CdcStateCodec,
    ChunkMark,
    ChunkReadEvent,
    ChunkSplit,
    LogSplit,
    mark_tuple,
)
from splitflow.connectors.postgres.types import METADATA, ColumnType
from splitflow.errors import ConfigurationError, ConnectorError, DataLossError

log = logging.getLogger("splitflow.postgres")


class CdcEnumerator(AssigningSplitEnumerator[CdcSplit]):
    """Plans the snapshot's chunks and starts the log after them (see the module doc).

    Thread: the coordinator thread, except :meth:`discover_splits` (a worker thread), which
    reads only values replaced whole (``_tables``, ``_log_start``) and leaves what it found
    in ``_found_*`` for :meth:`add_splits`, which the handler that follows it calls.

    Tables that match ``tables`` after the log started are snapshotted too while the log
    runs, without watermarks: a change made to one between its addition to the publication
    and its chunk's read may come both as a change and inside its snapshot row (``op=r``);
    an upsert by key that keeps the highest ``lsn`` ends exact (``docs/postgres-cdc.md``
    names the one race it misses).
    """

    def __init__(
        self,
        source: PostgresCdcSource,
        context: SplitEnumeratorContext[CdcSplit],
        state: CdcState | None,
    ) -> None:
        options = source.options
        options.check_streaming()
        state = state or CdcState(AssignerState())
        super().__init__(
            context,
            discovery_interval=None
            if options.mode == "snapshotOnly"
            else options.discovery_interval,
            state=state.assigner,
        )
        self._source = source
        self._options = options
        self._tables: frozenset[str] = frozenset(state.tables)
        self._marks: dict[str, ChunkMark] = {m.split_id: m for m in state.marks}
        self._log_start = state.log_start
        self._log_made = state.log_made
        self._found_log_start: int | None = None  # handed over by discovery
        self._found_tables: tuple[str, ...] = ()  # handed over by discovery
        known = state.assigner.assigned.keys() | state.assigner.finished  # ids, all kinds
        self._chunk_ids: set[str] = {
            s.split_id for s in state.assigner.unassigned if isinstance(s, ChunkSplit)
        } | {sid for sid in known if not sid.startswith("log:")}
        self._log_seen: int | None = None  # the log's position at the last planning
        self._pending: dict[int, int] = {}  # checkpoint id -> log position safe to confirm
        self._confirmed = 0
        self._conn: psycopg.Connection[Any] | None = None

    # -- discovery (worker thread) ------------------------------------------------------------

    def discover_splits(self) -> Sequence[CdcSplit]:
        options = self._options
        with catalog.connect(options) as conn:
            conn.autocommit = True
            tables = catalog.list_tables(conn, options)
            new = [t for t in tables if t not in self._tables]
            if options.mode != "snapshotOnly" and (new or self._log_start is None):
                catalog.check_logical(conn, options.where)
                for table in new:  # before they are published (see check_replica_identity)
                    catalog.check_replica_identity(self._source.table(table, conn))
                # The publication first: the slot decodes changes with the catalog as of
                # their LSN, and a change from before the publication existed fails.
                catalog.ensure_publication(conn, options, tables)
                if self._log_start is None:
                    self._found_log_start = catalog.ensure_slot(conn, options)
            if not new:
                return []
            self._found_tables = tuple(new)
            if options.mode == "latest":
                return []
            splits: list[CdcSplit] = []
            for table in new:
                described = self._source.table(table, conn)
                splits.extend(catalog.cut(conn, described, options.chunk_size))
            return splits

    def on_discovery_error(self, error: BaseException) -> None:
        if isinstance(error, ConnectorError | ValueError):
            raise error  # names the server, option or table already
        super().on_discovery_error(error)

    def on_splits_vanished(self, split_ids: Sequence[str]) -> None:
        """Discovery lists only new tables' chunks: a split it does not list is not gone."""

    def add_splits(self, splits: Sequence[CdcSplit], *, at_start: bool = False) -> None:
        """Also takes over what the discovery before it found: the slot's position and the
        tables it cut (a table is cut once)."""
        if self._found_log_start is not None and self._log_start is None:
            self._log_start = self._found_log_start
        self._tables = self._tables | set(self._found_tables)
        self._found_tables = ()
        self._chunk_ids |= {s.split_id for s in splits if isinstance(s, ChunkSplit)}
        if self._options.mode == "initial" and not self._log_made and splits:
            self.hold_backlog(True)
        super().add_splits(splits, at_start=at_start)
        self._maybe_start_log()

    # -- the switch to the log ---------------------------------------------------------------

    def handle_source_event(self, reader_id: int, event: SourceEvent) -> None:
        if isinstance(event, ChunkReadEvent):
            self._marks[event.mark.split_id] = event.mark
            return
        super().handle_source_event(reader_id, event)
        self._maybe_start_log()

    def _maybe_start_log(self) -> None:
        if self._log_made or self._options.mode == "snapshotOnly" or self._log_start is None:
            return
        if not self.discovered or not self._chunk_ids <= self.finished_splits():
            return
        unmarked = sorted(self._chunk_ids - self._marks.keys())
        if unmarked:
            raise ConnectorError(
                f"chunk(s) {', '.join(unmarked[:5])} were read but their watermarks never "
                "reached the enumerator: run the query with option stateDir (the readers "
                "report watermarks through it)"
            )
        marks = tuple(mark_tuple(self._marks[sid]) for sid in sorted(self._chunk_ids))
        self._log_made = True
        log.info("splitflow: snapshot read (%d chunks): the log starts", len(marks))
        super().add_splits([LogSplit(self._options.slot, self._log_start, marks)])
        self.hold_backlog(False)

    def backlog_boundary(
        self, split: CdcSplit, extent: SplitExtent | None, at_start: bool
    ) -> int | None:
        """The log is backlog up to the WAL position when it starts; chunks are backlog
        through the held flag while the snapshot lasts."""
        if isinstance(split, LogSplit) and extent is not None:
            return extent.latest
        return None

    # -- positions and the slot ----------------------------------------------------------------

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = catalog.connect(self._options, autocommit=True)
        return self._conn

    def latest_positions(self, splits: Sequence[CdcSplit]) -> Mapping[str, SplitExtent]:
        extents: dict[str, SplitExtent] = {}
        logs = [s for s in splits if isinstance(s, LogSplit)]
        chunks = sorted((s for s in splits if isinstance(s, ChunkSplit)), key=_chunk_order)
        admit = self._options.chunks_per_batch
        for n, split in enumerate(chunks):
            size = float(self._source.row_bytes.get(split.table, 100) * self._options.chunk_size)
            held = admit is not None and n >= admit and split.position == 0
            extents[split.split_id] = SplitExtent(  # a held chunk has not ended: not final
                split.position if held else 1, final=not held, bytes_per_position=size, available=1
            )
        if logs:
            log_split = logs[0]
            insert, confirmed = self._wal_positions()
            if confirmed is None:
                raise DataLossError(
                    f"replication slot {log_split.slot} in {self._options.where} is gone: the "
                    f"changes after LSN {format_lsn(log_split.position)} cannot be read",
                    split_id=log_split.split_id,
                )
            if confirmed > log_split.position:
                raise DataLossError(
                    f"replication slot {log_split.slot} has confirmed LSN {format_lsn(confirmed)}, "
                    f"past this query's position {format_lsn(log_split.position)}: another reader "
                    "consumed the changes between",
                    split_id=log_split.split_id,
                )
            self._log_seen = log_split.position
            extents[log_split.split_id] = SplitExtent(
                max(insert, log_split.position), bytes_per_position=1.0
            )
        return extents

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

    def snapshot_state(self, checkpoint_id: int) -> CdcState:  # type: ignore[override]
        if self._log_seen is not None:
            self._pending[checkpoint_id] = self._log_seen
        return CdcState(
            super().snapshot_state(checkpoint_id),
            tuple(sorted(self._tables)),
            tuple(self._marks[s] for s in sorted(self._marks)),
            self._log_start,
            self._log_made,
        )

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Confirm to the slot what the completed checkpoint's batches read: the log's
        position at its planning, which the batch before it (committed) reached."""
        done = [c for c in self._pending if c <= checkpoint_id]
        if not done:
            return
        lsn = max(self._pending.pop(c) for c in done)
        if lsn <= self._confirmed:
            return
        self._confirmed = lsn
        self.context.call_async(lambda: self._advance(lsn), _log_advance_error)

    def _advance(self, lsn: int) -> None:
        with catalog.connect(self._options, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_replication_slot_advance(slot_name, %s::pg_lsn) "
                "FROM pg_replication_slots "
                "WHERE slot_name = %s AND confirmed_flush_lsn < %s::pg_lsn",
                (format_lsn(lsn), self._options.slot, format_lsn(lsn)),
            )

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _chunk_order(split: ChunkSplit) -> tuple[str, int]:
    return split.table, split.index


def _log_advance_error(result: None, error: BaseException | None) -> None:
    if error is not None:  # the next commit confirms further; nothing is lost meanwhile
        log.warning("splitflow: could not advance the replication slot: %s", error)


def _as_cdc(enumerator: CdcEnumerator) -> SplitEnumerator[CdcSplit, CdcState]:
    """The enumerator as what it is: its snapshots are :class:`CdcState` (its base's typing
    says :class:`AssignerState`, which :meth:`CdcEnumerator.snapshot_state` wraps)."""
    return cast(SplitEnumerator[CdcSplit, CdcState], enumerator)


class PostgresCdcSource(
    Source[pa.RecordBatch, CdcSplit, CdcState],
    SupportsSplitReassignmentOnRecovery,
    SupportsPinnedReads[CdcSplit],
):
    """Change data capture from PostgreSQL (see the module doc and ``docs/postgres-cdc.md``).

    ``tables``: the tables matched when the source was made, described (columns, keys); the
    output schema is the union of their columns by name, then ``op``, ``lsn``,
    ``commit_ts`` and ``table``.
    """

    def __init__(
        self,
        options: PostgresOptions,
        tables: Sequence[Table],
        row_bytes: Mapping[str, int] | None = None,
    ) -> None:
        self.options = options
        self.tables = {t.name: t for t in tables}
        self.row_bytes = dict(row_bytes or {})

    def __repr__(self) -> str:
        return f"PostgresCdcSource({self.options!r})"

    def columns(self) -> list[tuple[str, ColumnType]]:
        """The union of the tables' columns by name, in first-seen order."""
        union: dict[str, tuple[str, ColumnType]] = {}
        reserved = [name for name, _, _ in METADATA]
        for table in self.tables.values():
            for name, kind in table.columns:
                if name in reserved:
                    raise ConfigurationError(
                        f"option tables: table {table.name} has a column named {name}, which "
                        f"the source adds to every row ({', '.join(reserved)})",
                        option="tables",
                    )
                first = union.setdefault(name, (table.name, kind))
                if first[1].spark != kind.spark:
                    raise ConfigurationError(
                        f"option tables: column {name} is {first[1].spark} in {first[0]} but "
                        f"{kind.spark} in {table.name}; the tables of one query share one "
                        "schema by column name",
                        option="tables",
                    )
        return [(name, kind) for name, (_, kind) in union.items()]

    def table(self, name: str, conn: psycopg.Connection[Any] | None = None) -> Table:
        """The description of ``name``, from the source or (a table found later) the server."""
        if name in self.tables:
            return self.tables[name]
        if conn is None:
            raise ConnectorError(f"table {name} is not one the query's schema was made from")
        return catalog.describe_table(conn, name, self.options)

    @property
    def boundedness(self) -> Boundedness:
        if self.options.mode == "snapshotOnly":
            return Boundedness.BOUNDED
        return Boundedness.CONTINUOUS_UNBOUNDED

    @property
    def estimates_size(self) -> bool:
        return True

    @property
    def event_time_column(self) -> str:
        """The commit time (null for snapshot rows: chunks carry no event time)."""
        return "commit_ts"

    def create_enumerator(
        self, context: SplitEnumeratorContext[CdcSplit]
    ) -> SplitEnumerator[CdcSplit, CdcState]:
        return _as_cdc(CdcEnumerator(self, context, None))

    def restore_enumerator(
        self, context: SplitEnumeratorContext[CdcSplit], state: CdcState
    ) -> SplitEnumerator[CdcSplit, CdcState]:
        return _as_cdc(CdcEnumerator(self, context, state))

    def create_reader(self, context: SourceReaderContext) -> SourceReader[pa.RecordBatch, CdcSplit]:
        from splitflow.connectors.postgres.reader import create_cdc_reader

        return create_cdc_reader(self, context)

    def create_read_pinner(self) -> SnapshotPinner:
        """One snapshot per batch that reads chunks (:mod:`.pinning`)."""
        return SnapshotPinner(self.options)

    @property
    def split_codec(self) -> Codec[CdcSplit]:
        return CdcSplitCodec()

    @property
    def enumerator_state_codec(self) -> Codec[CdcState]:
        return CdcStateCodec()
