"""The CDC source and enumerator bases: a snapshot in parallel chunks, then one log split.

The enumerator (driver) prepares the log before anything is read (PostgreSQL: the
publication and the replication slot), so the log holds every change from then on; cuts
each table into key-range chunks and assigns them (balanced); collects each chunk's
watermark (:class:`~.splits.ChunkReadEvent`) as the chunk is read; and, once every chunk is
read, starts the log split from the log's start position with the marks, so the log skips
exactly the changes a chunk's rows already held. While chunks are read the source is
processing backlog; the log is backlog up to its end when it starts. What the log has read
is confirmed to the database (PostgreSQL: the slot advanced) only as far as a completed
checkpoint covers it.

Under ``maxChunksPerBatch`` a table is cut as it is read: the enumerator keeps
2 x ``maxChunksPerBatch`` chunks (at least 2 per reader) ahead of the reads and, in its
state, where each table's cut goes on (:class:`~.splits.Cut`, a few numbers), so the number
of live chunk splits, and with it the cost of planning a batch, is bounded by what two
batches read, not by the tables' sizes. Without it a batch may read every chunk, and tables
are cut whole.

A database subclasses :class:`CdcEnumerator` (its hooks: :meth:`~CdcEnumerator.connect`,
:meth:`~CdcEnumerator.list_tables`, :meth:`~CdcEnumerator.prepare_log`,
:meth:`~CdcEnumerator.cut_table`, :meth:`~CdcEnumerator.key_after`,
:meth:`~CdcEnumerator.log_end`, and optionally
:meth:`~CdcEnumerator.confirm`) and :class:`CdcSource`.
"""

from __future__ import annotations

import logging
import sys
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack
from typing import Any, ClassVar, Generic, Protocol, TypeVar, cast

import pyarrow as pa

from splitflow.api.ahead import SplitsAhead
from splitflow.api.assigner import AssignerState, AssigningSplitEnumerator
from splitflow.api.enumerator import SplitEnumerator, SplitEnumeratorContext, SplitExtent
from splitflow.api.events import SourceEvent, SplitsFinishedEvent
from splitflow.api.source import (
    Boundedness,
    Source,
    SupportsPinnedReads,
    SupportsSplitReassignmentOnRecovery,
)
from splitflow.api.split import Codec
from splitflow.connectors.cdc.changes import (
    SchemaChange,
    SchemaRecord,
    StateFile,
    columns_shown,
    difference,
    not_followed,
)
from splitflow.connectors.cdc.chunks import cut_ahead
from splitflow.connectors.cdc.reader import KeptChunks
from splitflow.connectors.cdc.schema import Table, union_columns
from splitflow.connectors.cdc.splits import (
    CdcSplit,
    CdcSplitCodec,
    CdcState,
    CdcStateCodec,
    ChunkReadEvent,
    ChunkSplit,
    Cut,
    LogSplit,
    mark_tuple,
)
from splitflow.errors import ConfigurationError, ConnectorError, SchemaChangedError

MODES = ("initial", "latest", "snapshotOnly")
"""``initial``: the snapshot, then the log; ``latest``: the log from now on;
``snapshotOnly``: the snapshot, then the stream ends."""


class CdcOptions(Protocol):
    """What the core reads of a database's parsed options."""

    @property
    def mode(self) -> str:
        """One of :data:`MODES`."""
        ...

    @property
    def chunk_size(self) -> int:
        """Rows per snapshot chunk."""
        ...

    @property
    def chunks_per_batch(self) -> int | None:
        """At most this many chunks read per micro-batch (None: all)."""
        ...

    @property
    def discovery_interval(self) -> float:
        """Seconds between looks for tables that newly match."""
        ...

    @property
    def schema_changes(self) -> str:
        """What a schema change in the log does: ``stop`` or ``fail`` (:mod:`.changes`)."""
        ...


OptionsT = TypeVar("OptionsT", bound=CdcOptions)
TableT = TypeVar("TableT", bound=Table[Any])
ConnT = TypeVar("ConnT")


class CdcEnumerator(AssigningSplitEnumerator[CdcSplit], Generic[ConnT]):
    """Plans the snapshot's chunks and starts the log after them (see the module doc).

    Thread: the coordinator thread, except :meth:`discover_splits` (a worker thread), which
    reads only values replaced whole (``_tables``, ``_log_start``) and leaves what it found
    in ``_found_*`` for :meth:`add_splits`, which the handler that follows it calls.

    Tables that match after the log started are snapshotted too while the log runs, without
    watermarks: a change made to one between its addition to the log and its chunk's read
    may come both as a change and inside its snapshot row (``op=r``); an upsert by key that
    keeps the highest ``lsn`` ends exact.

    Hooks (a database implements them): :meth:`connect`, :meth:`list_tables`,
    :meth:`prepare_log`, :meth:`cut_table`, :meth:`key_after` (on a worker thread, on one
    connection); :meth:`log_end` (the coordinator thread); :meth:`confirm` (a worker
    thread).
    """

    logger: ClassVar[logging.Logger] = logging.getLogger("splitflow.cdc")
    confirm_warning: ClassVar[str] = "splitflow: could not confirm the log's position: %s"

    def __init__(
        self,
        source: CdcSource[Any, Any],
        context: SplitEnumeratorContext[CdcSplit],
        state: CdcState | None,
    ) -> None:
        options = source.options
        state = state or CdcState(AssignerState())
        super().__init__(
            context,
            discovery_interval=None
            if options.mode == "snapshotOnly"
            else options.discovery_interval,
            state=state.assigner,
        )
        self._source = source
        self._mode: str = options.mode
        self._chunk_size: int = options.chunk_size
        self._chunks_per_batch: int | None = options.chunks_per_batch
        self._ahead: SplitsAhead[CdcSplit, Cut] = SplitsAhead(  # the cuts that go on
            context, self._cut_next, self._add_chunks, lambda c: c.table, state.cuts
        )
        self._tables: frozenset[str] = frozenset(state.tables)
        self._at_start: frozenset[str] = self._tables  # known by the run's first discovery
        self._marks: dict[str, Any] = {m.split_id: m for m in state.marks}
        self._log_start = state.log_start
        self._log_made = state.log_made
        if self._log_made:
            self._marks.clear()  # the log split carries them
        self._found_log_start: int | None = None  # handed over by discovery
        self._found_tables: tuple[str, ...] = ()  # handed over by discovery
        self._found_cuts: tuple[Cut, ...] = ()  # handed over by discovery
        known = state.assigner.assigned.keys() | state.assigner.finished  # ids, all kinds
        self._chunk_ids: set[str] = {
            s.split_id for s in state.assigner.unassigned if isinstance(s, ChunkSplit)
        } | {sid for sid in known if not sid.startswith("log:")}
        self._log_seen: int | None = None  # the log's position at the last planning
        self._pending: dict[int, int] = {}  # checkpoint id -> log position safe to confirm
        self._confirmed = 0

    # -- hooks ----------------------------------------------------------------------------------

    @abstractmethod
    def connect(self) -> AbstractContextManager[ConnT]:
        """A connection for one discovery (a worker thread), closed when it ends."""

    @abstractmethod
    def list_tables(self, conn: ConnT) -> list[str]:
        """The names of the tables the options match now, sorted. A table the options name
        that does not exist is a ConfigurationError naming the option."""

    def prepare_log(
        self, conn: ConnT, tables: list[str], new: list[str], start: bool
    ) -> int | None:
        """Make the log carry the changes of ``tables`` (``new``: those not seen before),
        before any of their chunks is read; with ``start``, also return the position the
        log starts from (every change at or past it will be read). Called on streams only
        (``startupMode`` not ``snapshotOnly``), when there are new tables or no start yet.
        PostgreSQL: the publication, then the slot. Default: nothing to prepare, and the
        log starts at its end now."""
        return self.log_end(None) if start else None

    @abstractmethod
    def cut_table(self, conn: ConnT, table: str) -> Cut:
        """The start of ``table``'s cut into chunks, nothing cut yet (usually
        :func:`~splitflow.connectors.cdc.chunks.start_cut` with the chunk key's min, max
        and counts)."""

    @abstractmethod
    def key_after(self, conn: ConnT, table: str, key: str, at: int, rows: int) -> int | None:
        """The value of ``table``'s chunk key ``key`` that comes ``rows`` rows after the first
        value ``>= at`` in key order (``WHERE key >= at ORDER BY key OFFSET rows LIMIT 1``),
        None past the end: how a table whose key values are sparse is cut."""

    @abstractmethod
    def log_end(self, split: LogSplit | None) -> int:
        """The log's end now: the position after the last change written. ``split``: the
        log split being planned (None: the log has not started), so that a log that can no
        longer be read from its position raises
        :class:`~splitflow.errors.DataLossError` naming it.

        Called by: the coordinator thread when the runtime plans (may block briefly), and
        by the default :meth:`prepare_log` on the discovery's thread."""

    def confirm(self, position: int) -> None:
        """Tell the database the log before ``position`` is no longer needed (a completed
        checkpoint covers it). Called by: a worker thread. Default: nothing."""

    def bytes_per_log_position(self) -> float:
        """About how many bytes one log position holds, for ``maxBytesPerBatch``. Called
        by: the coordinator thread, after :meth:`log_end`. Default 1.0: positions are
        bytes (PostgreSQL's WAL)."""
        return 1.0

    # -- discovery (worker thread) ------------------------------------------------------------

    @property
    def mode(self) -> str:
        return self._mode

    def discover_splits(self) -> Sequence[CdcSplit]:
        self._found_tables = ()  # a discovery that failed after it set them cut nothing
        with self.connect() as conn:
            tables = self.list_tables(conn)
            new = [t for t in tables if t not in self._tables]
            for table in new:  # before the log carries it
                self._source.check_new_table(self._source.table(table, conn))
            if self._mode != "snapshotOnly" and (new or self._log_start is None):
                start = self.prepare_log(conn, tables, new, self._log_start is None)
                if self._log_start is None:
                    self._found_log_start = start
            if not new:
                return []
            self._found_tables = tuple(new)
            if self._mode == "latest":
                return []
            cuts = [self.cut_table(conn, table) for table in new]
            chunks, self._found_cuts = cut_ahead(
                cuts, self._window(), lambda t, k, at, rows: self.key_after(conn, t, k, at, rows)
            )
            return list(chunks)

    def on_discovery_error(self, error: BaseException) -> None:
        if isinstance(error, ConnectorError | ValueError):
            raise error  # names the server, option or table already
        super().on_discovery_error(error)

    def on_splits_vanished(self, split_ids: Sequence[str]) -> None:
        """Discovery lists only new tables' chunks: a split it does not list is not gone."""

    def add_splits(self, splits: Sequence[CdcSplit], *, at_start: bool = False) -> None:
        """Also takes over what the discovery before it found: the log's start, the tables
        it found (a table is found once) and the cuts that go on."""
        if self._found_log_start is not None and self._log_start is None:
            self._log_start = self._found_log_start
        self._tables = self._tables | set(self._found_tables)
        if at_start:
            self._at_start = self._tables
        self._ahead.extend(self._found_cuts)
        self._found_tables, self._found_cuts = (), ()
        self._add_chunks(splits, at_start)

    def _add_chunks(self, splits: Sequence[CdcSplit], at_start: bool = False) -> None:
        self._chunk_ids |= {s.split_id for s in splits if isinstance(s, ChunkSplit)}
        if self._mode == "initial" and not self._log_made and splits:
            self.hold_backlog(True)
        super().add_splits(splits, at_start=at_start)
        self._maybe_start_log()
        self._maybe_cut_ahead()

    def splits_to_come(self) -> bool:
        """While a table's cut goes on, its next chunks are still to come."""
        return self._ahead.pending

    # -- cutting ahead of the reads ------------------------------------------------------------

    def _window(self) -> int | None:
        """How many chunks are kept live ahead of the reads: two batches' worth, and at
        least two per reader; None: tables are cut whole (a batch may read every chunk)."""
        if self._chunks_per_batch is None:
            return None
        return 2 * max(self._chunks_per_batch, self.context.current_parallelism)

    def _maybe_cut_ahead(self) -> None:
        if not self._ahead.pending:
            return
        window = self._window()
        if window is None:  # restored from a run with maxChunksPerBatch: the rest whole
            self._ahead.refill(sys.maxsize, 0)
            return
        live = {s.split_id for s in self.unassigned_splits()}
        live |= self.owners().keys() | self.awaiting_report().keys()
        self._ahead.refill(window, sum(1 for sid in live if sid in self._chunk_ids))

    def _cut_next(self, cuts: Sequence[Cut], n: int) -> tuple[list[CdcSplit], tuple[Cut, ...]]:
        """The next ``n`` chunks of ``cuts`` (a worker thread), on a connection opened only
        for a table whose key values are sparse."""
        with ExitStack() as stack:
            conns: list[ConnT] = []

            def key_after(table: str, key: str, at: int, rows: int) -> int | None:
                if not conns:
                    conns.append(stack.enter_context(self.connect()))
                return self.key_after(conns[0], table, key, at, rows)

            chunks, rest = cut_ahead(cuts, n, key_after)
            return list(chunks), rest

    # -- the switch to the log ---------------------------------------------------------------

    def handle_source_event(self, reader_id: int, event: SourceEvent) -> None:
        if isinstance(event, ChunkReadEvent):
            if not self._log_made:  # later chunks (new tables) have no place in the log
                # a chunk read again: its new mark goes last, so the marks before it keep
                # their places (the state's codec encodes a page of them once)
                self._marks.pop(event.mark.split_id, None)
                self._marks[event.mark.split_id] = event.mark
        elif isinstance(event, SchemaChange):
            self._source.schema_changed(event)
        else:
            super().handle_source_event(reader_id, event)
            if isinstance(event, SplitsFinishedEvent):
                self._maybe_cut_ahead()
        self._maybe_start_log()

    def _maybe_start_log(self) -> None:
        """The log split, once every chunk finished and its watermark arrived (a chunk is
        finished when the batch that reads it is planned; its reader reports the watermark
        after the batch, through ``stateDir``)."""
        if self._log_made or self._mode == "snapshotOnly" or self._log_start is None:
            return
        if self.splits_to_come() or len(self._marks) < len(self._chunk_ids):
            return  # marks come after their chunks finished: cheap to tell while they are few
        if not self.discovered or not self._chunk_ids <= self.finished_splits():
            return
        if not self._chunk_ids <= self._marks.keys():
            return
        marks = tuple(mark_tuple(self._marks[sid]) for sid in sorted(self._chunk_ids))
        self._log_made = True
        self._marks.clear()
        self.logger.info("splitflow: snapshot read (%d chunks): the log starts", len(marks))
        super().add_splits([LogSplit(self._source.log_name, self._log_start, marks)])
        self.hold_backlog(False)

    def backlog_boundary(
        self, split: CdcSplit, extent: SplitExtent | None, at_start: bool
    ) -> int | None:
        """The log is backlog up to its end when it starts; chunks are backlog through the
        held flag while the snapshot lasts."""
        if isinstance(split, LogSplit) and extent is not None:
            return extent.latest
        return None

    # -- positions -----------------------------------------------------------------------------

    def latest_positions(self, splits: Sequence[CdcSplit]) -> Mapping[str, SplitExtent]:
        """Chunks: read whole (1), at most ``maxChunksPerBatch`` of them per batch; the log:
        up to :meth:`log_end`."""
        extents: dict[str, SplitExtent] = {}
        logs = [s for s in splits if isinstance(s, LogSplit)]
        chunks = sorted((s for s in splits if isinstance(s, ChunkSplit)), key=_chunk_order)
        admit = self._chunks_per_batch
        for n, split in enumerate(chunks):
            size = float(self._source.row_bytes.get(split.table, 100) * self._chunk_size)
            held = admit is not None and n >= admit and split.position == 0
            extents[split.split_id] = SplitExtent(  # a held chunk has not ended: not final
                split.position if held else 1,
                final=not held,
                bytes_per_position=size,
                available=1,
                preexisting=split.table in self._at_start,  # cut after the run started
            )
        if logs:
            log_split = logs[0]
            end = self.log_end(log_split)
            self._log_seen = log_split.position
            extents[log_split.split_id] = SplitExtent(
                max(end, log_split.position), bytes_per_position=self.bytes_per_log_position()
            )
        return extents

    # -- checkpoints ---------------------------------------------------------------------------

    def snapshot_state(self, checkpoint_id: int) -> CdcState:  # type: ignore[override]
        if self._log_seen is not None:
            self._pending[checkpoint_id] = self._log_seen
        return CdcState(
            super().snapshot_state(checkpoint_id),
            tuple(sorted(self._tables)),
            tuple(self._marks.values()),
            self._log_start,
            self._log_made,
            self._ahead.cursors,
        )

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Confirm what the completed checkpoint's batches read: the log's position at its
        planning, which the batch before it (committed) reached."""
        done = [c for c in self._pending if c <= checkpoint_id]
        if not done:
            return
        position = max(self._pending.pop(c) for c in done)
        if position <= self._confirmed:
            return
        self._confirmed = position
        self.context.call_async(lambda: self.confirm(position), self._confirm_error)

    def _confirm_error(self, result: None, error: BaseException | None) -> None:
        if error is not None:  # the next commit confirms further; nothing is lost meanwhile
            self.logger.warning(self.confirm_warning, error)


def _chunk_order(split: ChunkSplit) -> tuple[str, int]:
    return split.table, split.index


class CdcSource(
    Source[pa.RecordBatch, CdcSplit, CdcState],
    SupportsSplitReassignmentOnRecovery,
    SupportsPinnedReads[CdcSplit],
    Generic[OptionsT, TableT],
):
    """A CDC source (see the module doc): the options, the tables matched when it was made
    (described: columns, keys) and their average row sizes.

    The output schema is the union of the tables' columns by name, then ``op``, ``lsn``,
    ``commit_ts`` and ``table`` (:mod:`.schema`). A database sets :attr:`source_name`,
    :attr:`tables_option` and :attr:`mark_type` and implements :attr:`log_name`,
    :meth:`enumerator`, ``create_reader`` and ``create_read_pinner``.
    """

    source_name: ClassVar[str] = "cdc"
    """The source's name in errors about checkpoints (``postgres-cdc``)."""
    tables_option: ClassVar[str] = "tables"
    """The option that lists the tables, named by errors about their columns."""
    mark_type: ClassVar[type[Any]]
    """The class of the database's chunk watermark (:class:`~.splits.Watermark`)."""
    keeps_chunk_reads: ClassVar[bool] = False
    """Whether a batch's chunk reads are kept in ``stateDir`` until it completes
    (:class:`~.reader.KeptChunks`): for a database whose pin does not outlive the driver,
    so that a replay after a driver crash reads what the first evaluation read."""

    def __init__(
        self,
        options: OptionsT,
        tables: Sequence[TableT],
        row_bytes: Mapping[str, int] | None = None,
    ) -> None:
        self.options = options
        self.tables: dict[str, TableT] = {t.name: t for t in tables}
        self.row_bytes = dict(row_bytes or {})
        self.schema_record: SchemaRecord | None = None
        """Where schema changes are recorded (``stateDir``); None: nowhere, and a change
        fails the query as with ``schemaChanges=fail``."""
        self._state_codec: CdcStateCodec | None = None
        self.kept_chunks: KeptChunks | None = None
        """Where a batch's chunk reads are kept (``stateDir``), for a database that
        :attr:`keeps_chunk_reads`; None: nowhere."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.options!r})"

    def columns(self) -> list[tuple[str, Any]]:
        """The union of the tables' columns by name, in first-seen order."""
        return union_columns(self.tables.values(), self.tables_option)

    def table(self, name: str, conn: Any = None) -> TableT:
        """The description of ``name``, from the source or (a table found later) the
        server, through ``conn``."""
        if name in self.tables:
            return self.tables[name]
        if conn is None:
            raise ConnectorError(f"table {name} is not one the query's schema was made from")
        return self.describe(conn, name)

    # -- schema changes (see :mod:`.changes`) ---------------------------------------------------

    def schema_record_in(self, file: StateFile) -> SchemaRecord | None:
        """The record of the query's schema kept in ``file`` (in ``stateDir``), for
        ``schemaChanges=stop``; None: the database does not follow schema changes (they
        fail the query). A database that does returns a :class:`~.changes.SchemaRecord`
        with its column types' codec."""
        return None

    def check_new_table(self, table: TableT) -> None:
        """A table found after the start fits the query's schema (its columns are among
        the others' with the same types), or the query stops as at a schema change."""
        if table.name in self.tables:
            return
        union = dict(self.columns())
        if all(n in union and union[n].spark == k.spark for n, k in table.columns):
            return
        if self.options.schema_changes == "stop":
            self._stop(table.name, table, "its discovery", "a new table")

    def schema_changed(self, change: SchemaChange) -> None:
        """The enumerator's part of a change a log reader reported: record it and stop the
        query. A change already recorded is the same batch's events applied again after
        the restart: nothing to do."""
        old = self.tables.get(change.table)
        new = change.new
        if old is not None and old.columns == new.columns and old.ids == new.ids:
            return
        what = "a new table" if old is None else str(difference(old, new))
        self._stop(change.table, new, f"log position {change.shown}", what)

    def _stop(self, name: str, new: TableT, where: str, what: str) -> None:
        old = self.tables.get(name)
        problem = None if old is None else difference(old, new).problem(old)
        tables = {**self.tables, name: new}
        try:
            union_columns(tables.values(), self.tables_option)
        except ConfigurationError as e:
            problem = str(e)
        record = self.schema_record
        if problem is not None or record is None:
            why = (
                f"{problem}: no restart can follow it"
                if problem
                else "nothing was recorded (schemaChanges=fail, or no stateDir)"
            )
            raise not_followed(name, old, new, where, what, why)
        had, changes = record.read() or ({}, [])
        if had.get(name) != new:  # a discovery that runs again records it once
            changes.append({"table": name, "at": where, "change": what})
            record.write(tables, changes)
        raise SchemaChangedError(
            f"table {name}'s schema changed at {where}: {what}; {SchemaChangedError.RECORDED}: "
            "restart the query (same checkpoint), which reads on from the change with it",
            table=name,
            old=() if old is None else columns_shown(old),
            new=columns_shown(new),
            position=where,
            recorded=True,
        )

    @abstractmethod
    def describe(self, conn: Any, name: str) -> TableT:
        """Table ``name`` described by the server (``conn``: a connection of the database's
        client), with the source's options."""

    @property
    @abstractmethod
    def log_name(self) -> str:
        """The log split's name (its id is ``log:<name>``)."""

    @abstractmethod
    def enumerator(
        self, context: SplitEnumeratorContext[CdcSplit], state: CdcState | None
    ) -> CdcEnumerator[Any]:
        """A new enumerator, or one restored from ``state``."""

    @property
    def boundedness(self) -> Boundedness:
        if self.options.mode == "snapshotOnly":
            return Boundedness.BOUNDED
        return Boundedness.CONTINUOUS_UNBOUNDED

    @property
    def needs_reader_events(self) -> bool:
        """The chunks' watermarks come as reader events; the log starts only with all."""
        return True

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
        return _as_cdc(self.enumerator(context, None))

    def restore_enumerator(
        self, context: SplitEnumeratorContext[CdcSplit], state: CdcState
    ) -> SplitEnumerator[CdcSplit, CdcState]:
        return _as_cdc(self.enumerator(context, state))

    @property
    def split_codec(self) -> Codec[CdcSplit]:
        return CdcSplitCodec(self.source_name)

    @property
    def enumerator_state_codec(self) -> Codec[CdcState]:
        """One codec per source: it keeps the encoding of full pages of marks."""
        if self._state_codec is None:
            self._state_codec = CdcStateCodec(self.mark_type, self.source_name)
        return self._state_codec


def _as_cdc(enumerator: CdcEnumerator[Any]) -> SplitEnumerator[CdcSplit, CdcState]:
    """The enumerator as what it is: its snapshots are :class:`CdcState` (its base's typing
    says :class:`AssignerState`, which :meth:`CdcEnumerator.snapshot_state` wraps)."""
    return cast(SplitEnumerator[CdcSplit, CdcState], enumerator)
