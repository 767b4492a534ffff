"""What the change data capture data sources share on Spark (``splitflow-postgres-cdc``,
``splitflow-mysql-cdc``): the schema is the source's columns then the change metadata, and
``spark.read`` reads the snapshot only."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader
from pyspark.sql.types import StructField, StructType

from splitflow.errors import ConfigurationError, ContractViolation
from splitflow.spark.datasource import SplitflowDataSource
from splitflow.spark.options import RuntimeOptions
from splitflow.spark.statedir import StateStore

if TYPE_CHECKING:
    from splitflow.connectors.cdc.source import CdcSource

SCHEMA_FILE = "cdc-schema.json"
"""The CDC schema record in ``stateDir`` (:class:`.changes.SchemaRecord`)."""
TABLES_KEY = "splitflow.tables"
"""Field metadata: the source tables that have the column."""
FORMERLY_KEY = "splitflow.formerly"
"""Field metadata: table -> the column's names before renames, newest first."""

SourceT = TypeVar("SourceT", bound="CdcSource[Any, Any]")


@dataclass(frozen=True)
class StoreFile:
    """One file of a state store (:class:`~splitflow.connectors.cdc.changes.StateFile`)."""

    store: StateStore
    name: str

    def read(self) -> bytes | None:
        return self.store.get(self.store.path(self.name))

    def write(self, content: bytes) -> None:
        self.store.put(self.store.path(self.name), content)


class StoreChunks:
    """A batch's chunk reads in ``<stateDir>/chunks/<batch>/<split id>``
    (:class:`~splitflow.connectors.cdc.reader.KeptChunks`): written by the tasks, the first
    write of a chunk winning; deleted by the driver once the batch completed (one listing of
    ``chunks/`` per run, then the batches it kept, by name)."""

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self._listed = False
        self._batches: set[int] = set()  # batches that may have kept reads, not dropped

    def __getstate__(self) -> dict[str, Any]:
        return {"store": self.store, "_listed": False, "_batches": set()}

    def _path(self, batch: int, split_id: str) -> str:
        return self.store.path("chunks", str(batch), quote(split_id, safe=""))

    def get(self, batch: int, split_id: str) -> bytes | None:
        return self.store.get(self._path(batch, split_id))

    def put_first(self, batch: int, split_id: str, content: bytes) -> bytes:
        path = self._path(batch, split_id)
        if self.store.create(path, content):
            return content
        kept = self.store.get(path)
        return content if kept is None else kept

    def drop_through(self, batch: int, pinned: Collection[int]) -> None:
        if not self._listed:
            self._listed = True
            names = self.store.names(self.store.path("chunks"))
            self._batches |= {int(n) for n in names if n.isdigit()}
        self._batches |= set(pinned)
        for done in sorted(b for b in self._batches if b <= batch):
            self.store.delete(self.store.path("chunks", str(done)), folder=True)
            self._batches.discard(done)


class CdcDataSource(SplitflowDataSource):
    """Base of the CDC data sources. A subclass parses its options into ``_options`` (a
    frozen dataclass with a ``mode``: ``initial``, ``latest`` or ``snapshotOnly``) before
    calling ``super().__init__``, and makes its :class:`~splitflow.connectors.cdc.source.
    CdcSource` in :meth:`create_source`."""

    _options: Any
    _tables: list[Any]
    _row_bytes: dict[str, int]
    _store: StateStore | None = None

    def _load_tables(self, catalog: Any, conn: Any, options: dict[str, str]) -> None:
        """The tables the options match on ``conn``, described, and their row sizes
        (``catalog``: the database's catalog module). With ``schemaChanges=stop`` and a
        ``stateDir``, the tables its schema record holds are as recorded there, not as the
        catalog has them now (:mod:`splitflow.connectors.cdc.changes`); without a
        ``stateDir``, ``schemaChanges`` is ``fail``."""
        names = catalog.list_tables(conn, self._options)
        self._tables = [catalog.describe_table(conn, name, self._options) for name in names]
        self._row_bytes = catalog.row_bytes(conn, names)
        self._store = RuntimeOptions.parse(options).state_store
        if self._options.schema_changes != "stop":
            return
        record = self.create_source().schema_record
        if record is None:
            self._options = replace(self._options, schema_changes="fail")
            return
        recorded = record.read()
        if recorded is not None:
            tables = recorded[0]
            self._tables = [*tables.values(), *(t for t in self._tables if t.name not in tables)]

    def _recording(self, source: SourceT) -> SourceT:
        """``source`` with the record schema changes go to (``schemaChanges=stop``), and the
        store its batches' chunk reads are kept in (:attr:`~.CdcSource.keeps_chunk_reads`);
        each subclass's :meth:`create_source` returns its source through it."""
        if self._store is not None and self._options.schema_changes == "stop":
            source.schema_record = source.schema_record_in(StoreFile(self._store, SCHEMA_FILE))
        if self._store is not None and source.keeps_chunk_reads:
            source.kept_chunks = StoreChunks(self._store)
        return source

    def create_source(self) -> CdcSource[Any, Any]:
        raise NotImplementedError

    def described(self) -> str:
        """The tables' descriptions: they change at a schema change's restart."""
        return repr([(t.name, t.columns, t.key, t.ids) for t in self._tables])

    def check_streaming(self) -> None:
        """What the database needs for a stream (its log's settings), checked before the
        query starts; a ConfigurationError or ConnectorError naming what to change."""

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        self.check_streaming()
        if self._options.mode == "initial" and self.runtime.state_dir is None:
            raise ConfigurationError(
                "option stateDir is required with startupMode=initial: the snapshot's chunk "
                "readers report their watermarks to the driver through it",
                option="stateDir",
            )
        record = self.create_source().schema_record
        if record is not None and record.read() is None:  # the schema the query starts with
            record.write({t.name: t for t in self._tables}, [])
        return super().streamReader(schema)

    def schema(self) -> StructType:
        return spark_struct(self.create_source())

    def reader(self, schema: Any) -> DataSourceReader:
        """``spark.read``: the snapshot, whatever ``startupMode`` says (but ``latest``,
        which reads no snapshot)."""
        if self._options.mode == "latest":
            raise ConfigurationError(
                "option startupMode=latest reads only changes: use readStream (spark.read "
                "reads the snapshot)",
                option="startupMode",
            )
        self._options = replace(self._options, mode="snapshotOnly")
        return super().reader(schema)


def spark_struct(source: CdcSource[Any, Any]) -> StructType:
    """The source's Spark schema: the columns (the union of the tables'), then the change
    metadata. Each table column's field metadata names the tables that have it
    (``splitflow.tables``) and the names it had before renames (``splitflow.formerly``:
    table -> names, newest first), which :func:`splitflow.cdc.apply_changes` reads."""
    from pyspark.sql.pandas.types import from_arrow_type

    from splitflow.connectors.cdc.schema import METADATA

    fields = []
    for name, kind in source.columns():
        having = [t for t in source.tables.values() if name in dict(t.columns)]
        metadata: dict[str, Any] = {TABLES_KEY: [t.name for t in having]}
        formerly = {
            t.name: list(dict(t.formerly)[name]) for t in having if name in dict(t.formerly)
        }
        if formerly:
            metadata[FORMERLY_KEY] = formerly
        spark = from_arrow_type(kind.arrow)
        if spark.simpleString() != kind.spark:
            raise ContractViolation(
                f"column {name}: its Arrow type {kind.arrow} is Spark's {spark.simpleString()}, "
                f"not {kind.spark} as its type mapping says"
            )
        fields.append(StructField(name, spark, True, metadata))
    fields += [StructField(name, from_arrow_type(arrow), True) for name, arrow, _ in METADATA]
    return StructType(fields)
