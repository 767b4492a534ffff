"""What the change data capture data sources share on Spark (``splitflow-postgres-cdc``,
``splitflow-mysql-cdc``): the schema is the source's columns then the change metadata, and
``spark.read`` reads the snapshot only."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader

from splitflow.errors import ConfigurationError
from splitflow.spark.datasource import SplitflowDataSource

if TYPE_CHECKING:
    from splitflow.connectors.cdc.source import CdcSource


class CdcDataSource(SplitflowDataSource):
    """Base of the CDC data sources. A subclass parses its options into ``_options`` (a
    frozen dataclass with a ``mode``: ``initial``, ``latest`` or ``snapshotOnly``) before
    calling ``super().__init__``, and makes its :class:`~splitflow.connectors.cdc.source.
    CdcSource` in :meth:`create_source`."""

    _options: Any
    _tables: list[Any]
    _row_bytes: dict[str, int]

    def _load_tables(self, catalog: Any, conn: Any) -> None:
        """The tables the options match on ``conn``, described, and their row sizes
        (``catalog``: the database's catalog module)."""
        names = catalog.list_tables(conn, self._options)
        self._tables = [catalog.describe_table(conn, name, self._options) for name in names]
        self._row_bytes = catalog.row_bytes(conn, names)

    def create_source(self) -> CdcSource[Any, Any]:
        raise NotImplementedError

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
        return super().streamReader(schema)

    def schema(self) -> str:
        from splitflow.connectors.cdc.schema import spark_schema

        return spark_schema(self.create_source().columns())

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
