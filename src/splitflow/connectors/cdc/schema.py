"""The rows a CDC source emits: the tables it reads, the union of their columns, and the
metadata columns every row carries.

Every row holds the union of the tables' columns by name (a column a table lacks is null),
then :data:`METADATA`: ``op`` (``r`` a snapshot read, ``c`` insert, ``u`` update, ``d``
delete), ``lsn`` (the change's log position; for ``r``, the position the chunk's rows stand
at), ``commit_ts`` (null for ``r``) and ``table``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, Protocol, TypeVar

import pyarrow as pa

from splitflow.errors import ConfigurationError, ConnectorError

METADATA: Final = (
    ("op", pa.string(), "string"),
    ("lsn", pa.int64(), "bigint"),
    ("commit_ts", pa.timestamp("us", tz="UTC"), "timestamp"),
    ("table", pa.string(), "string"),
)
"""The columns the source adds to every row, after the table's: name, Arrow and Spark type."""


class ColumnKind(Protocol):
    """What the core needs of a database's column type: how it is emitted."""

    @property
    def spark(self) -> str:
        """Spark DDL type, e.g. ``decimal(10,2)``."""
        ...

    @property
    def arrow(self) -> Any:
        """The ``pyarrow.DataType`` of the column's arrays."""
        ...


KindT = TypeVar("KindT", bound=ColumnKind)


@dataclass(frozen=True)
class Table(Generic[KindT]):
    """A table the source reads: its columns (name, type) in order, the columns that identify
    a row in the log, and the column its chunks are cut by.

    ``key``: the columns that identify a row (the primary key); empty: a row is known only
    by all its values. ``chunk_key``: the integer column chunks are cut by
    (:func:`~splitflow.connectors.cdc.chunks.cut`); empty: the table is one chunk.
    """

    name: str
    columns: tuple[tuple[str, KindT], ...]
    key: tuple[str, ...]
    chunk_key: str = ""
    ids: tuple[int, ...] = ()
    """A stable id per column where the database has one (PostgreSQL's ``attnum``), so that
    a column whose id stays while its name changes is known as renamed; empty: none."""
    formerly: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Columns renamed since the query started: ``(name, (older names, newest first))``."""


def union_columns(
    tables: Iterable[Table[KindT]], option: str = "tables"
) -> list[tuple[str, KindT]]:
    """The union of the tables' columns by name, in first-seen order.

    A column named like a metadata column, or one name with two Spark types, is a
    ConfigurationError naming ``option`` (the option that lists the tables).
    """
    union: dict[str, tuple[str, KindT]] = {}
    reserved = [name for name, _, _ in METADATA]
    for table in tables:
        for name, kind in table.columns:
            if name in reserved:
                raise ConfigurationError(
                    f"option {option}: table {table.name} has a column named {name}, which "
                    f"the source adds to every row ({', '.join(reserved)})",
                    option=option,
                )
            first = union.setdefault(name, (table.name, kind))
            if first[1].spark != kind.spark:
                raise ConfigurationError(
                    f"option {option}: column {name} is {first[1].spark} in {first[0]} but "
                    f"{kind.spark} in {table.name}; the tables of one query share one "
                    "schema by column name",
                    option=option,
                )
    return [(name, kind) for name, (_, kind) in union.items()]


class OutputSchema(Generic[KindT]):
    """The source's row layout: the union of the tables' columns, then the metadata."""

    def __init__(self, columns: Sequence[tuple[str, KindT]]) -> None:
        self.columns = dict(columns)
        self.arrow = pa.schema(
            [pa.field(n, k.arrow) for n, k in self.columns.items()]
            + [pa.field(n, t) for n, t, _ in METADATA]
        )

    def check(self, table: str, names: Iterable[str]) -> None:
        """Every column of ``names`` is in the schema, or a ConnectorError names it."""
        for name in names:
            if name not in self.columns:
                raise ConnectorError(
                    f"table {table} has column {name}, which is not in the query's schema "
                    "(it was added after the query started): restart the query"
                )

    def batches(
        self,
        table: str,
        names: Sequence[str],
        values: Sequence[Any],
        rows: int,
        op: str | list[str],
        lsn: int | list[int],
        commit_ts: Any,
    ) -> list[pa.RecordBatch]:
        """``rows`` rows of ``table`` with columns ``names`` (arrays ``values``; the rest
        null) and their metadata; a metadata value that is not a list is the same for every
        row."""
        self.check(table, names)
        given = dict(zip(names, values, strict=True))
        arrays = [
            given[name] if name in given else pa.nulls(rows, kind.arrow)
            for name, kind in self.columns.items()
        ]
        for (_, arrow, _), value in zip(METADATA, (op, lsn, commit_ts, table), strict=True):
            arrays.append(
                pa.array(value, arrow)
                if isinstance(value, list)
                else pa.repeat(pa.scalar(value, arrow), rows)
            )
        batches: list[pa.RecordBatch] = pa.Table.from_arrays(arrays, schema=self.arrow).to_batches()
        return batches
