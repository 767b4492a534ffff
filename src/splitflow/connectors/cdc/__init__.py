"""The change data capture core: what every database's CDC source shares.

The algorithm is Flink CDC's incremental snapshot (DBLog): the tables are read in parallel
as key-range **chunk splits**, each with a **watermark** that says which of the log's changes
its rows already hold; once every chunk is read, one **log split** streams the changes from
a position taken before any chunk was read, and leaves out exactly the changes a chunk's rows
held. No table is locked, and no row is lost or seen twice across the switch. This package
holds all of it except talking to the database; it imports :mod:`splitflow.api`,
:mod:`splitflow.reader` and pyarrow, no database driver.

=====================  ===========================================================================
module                 what it holds
=====================  ===========================================================================
:mod:`.splits`         :class:`ChunkSplit`, :class:`LogSplit` (which drops a table's watermarks
                       once it has read past them), the :class:`Watermark` protocol and
                       :class:`PositionMark`, :class:`ChunkFilter` (a change's chunk by table and
                       chunk key value), :class:`ChunkReadEvent`, the codecs and the enumerator's
                       state
:mod:`.chunks`         :func:`start_cut` and :func:`cut_ahead` (a table cut as it is read: dense
                       keys evenly, sparse keys by stepping, open ends, NULL keys in the first
                       chunk) and :func:`chunk_condition`
:mod:`.schema`         :data:`METADATA` (``op``, ``lsn``, ``commit_ts``, ``table``), :class:`Table`,
                       :func:`union_columns` (one schema by column name, checked) and
                       :class:`OutputSchema` (rows to Arrow)
:mod:`.source`         :class:`CdcEnumerator` (tables cut ahead of the reads, chunk bookkeeping,
                       watermarks collected, the switch to the log, backlog while the snapshot
                       lasts and up to the log's end when it starts, ``maxChunksPerBatch``,
                       confirming the log after completed checkpoints) and :class:`CdcSource`
:mod:`.reader`         :class:`CdcSplitReader` (a chunk or one log piece per fetch), :class:`Piece`,
                       :class:`Pinned`, :class:`CdcEmitter` (a chunk's rows and watermark leave
                       together), :class:`CdcReader`, and :class:`KeptChunks` (a batch's chunk
                       reads kept in ``stateDir``, for a database whose pin ends with the driver)
:mod:`.changes`        schema changes in the log: :class:`SchemaChange` (the reader cuts its slice
                       before the first change under a new schema), :func:`difference`,
                       :func:`widens`, :func:`follow` (renames by column id) and
                       :class:`SchemaRecord` (the query's schema in ``stateDir``)
=====================  ===========================================================================

**A new database is a small log reader plus a type mapping.** It implements:

1. **Options** with ``mode`` (``initial``, ``latest``, ``snapshotOnly``), ``chunk_size``,
   ``chunks_per_batch`` and ``discovery_interval`` (:class:`~.source.CdcOptions`).
2. **A type mapping**: each column type to an object with ``spark`` (DDL) and ``arrow``
   (:class:`~.schema.ColumnKind`), and a ConfigurationError naming ``table.column`` for the
   types it cannot map; tables described as :class:`~.schema.Table` (columns, key, chunk key).
3. **A position**: the log's positions as one increasing integer, so that the slice
   ``[a, b)`` is the transactions whose position is in it, and a **watermark** class
   (:class:`~.splits.Watermark`; :class:`PositionMark` when the chunk's rows are the table
   as of one log position).
4. **The enumerator's hooks** (:class:`~.source.CdcEnumerator`)::

       class MyEnumerator(CdcEnumerator[Connection]):
           def connect(self): ...                          # a connection for one discovery
           def list_tables(self, conn): ...                # names matching the options
           def prepare_log(self, conn, tables, new, start): ...  # make the log carry them;
                                                           # return its start when asked
           def cut_table(self, conn, table):               # usually chunks.start_cut(...)
               ...                                         # with min/max/count
           def key_after(self, conn, table, key, at, rows): ...  # sparse keys' next bound
           def log_end(self, split): ...                   # the log's end now
           def confirm(self, position): ...                # optional: free the log before it

5. **The reads** (:class:`~.reader.CdcSplitReader`): ``read_chunk(split)`` returns the
   chunk's rows (:meth:`OutputSchema.batches` with ``op="r"``) and its watermark as one
   :class:`Piece`; ``open_log(split, start, stop)`` returns a generator of pieces of whole
   transactions in ``[start, stop)``, each change left out when
   ``ChunkFilter(marks).holds(table, chunk_key_value, position, txid)``.
6. **The pin** (:class:`~splitflow.api.source.ReadPinner`): what makes every read of a
   planned batch's chunks return the same rows (PostgreSQL: one exported snapshot per batch;
   MySQL: one binlog position per batch, every chunk rewound to it).
7. **The source**: :class:`CdcSource` with ``source_name``, ``mark_type``, ``log_name``,
   ``enumerator(context, state)``, ``create_reader`` (a :class:`CdcReader` over the split
   reader, with the pin's event class) and ``create_read_pinner``.

``splitflow.connectors.postgres`` is the worked example; ``docs/cdc.md`` says what each
database supports.
"""

from splitflow.connectors.cdc.chunks import KeyStats, chunk_condition, cut_ahead, start_cut
from splitflow.connectors.cdc.reader import (
    CdcEmitter,
    CdcReader,
    CdcSplitReader,
    LogRead,
    Piece,
    Pinned,
)
from splitflow.connectors.cdc.schema import METADATA, ColumnKind, OutputSchema, Table, union_columns
from splitflow.connectors.cdc.source import CdcEnumerator, CdcOptions, CdcSource
from splitflow.connectors.cdc.splits import (
    CdcSplit,
    CdcSplitCodec,
    CdcState,
    CdcStateCodec,
    ChunkFilter,
    ChunkReadEvent,
    ChunkSplit,
    Cut,
    Key,
    LogSplit,
    PositionMark,
    Watermark,
)

__all__ = [
    "METADATA",
    "CdcEmitter",
    "CdcEnumerator",
    "CdcOptions",
    "CdcReader",
    "CdcSource",
    "CdcSplit",
    "CdcSplitCodec",
    "CdcSplitReader",
    "CdcState",
    "CdcStateCodec",
    "ChunkFilter",
    "ChunkReadEvent",
    "ChunkSplit",
    "ColumnKind",
    "Cut",
    "Key",
    "KeyStats",
    "LogRead",
    "LogSplit",
    "OutputSchema",
    "Piece",
    "Pinned",
    "PositionMark",
    "Table",
    "Watermark",
    "chunk_condition",
    "cut_ahead",
    "start_cut",
    "union_columns",
]
