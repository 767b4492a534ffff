"""MySQL/MariaDB column types: what the CDC source emits for each, in one place.

Both read paths give the same Python values: the snapshot (PyMySQL, in a session whose
``time_zone`` is UTC) through :meth:`ColumnType.from_snapshot`, and the binlog's row events
(mysql-replication, with ``binlog_row_metadata=FULL``) through :meth:`ColumnType.from_log`.
:func:`to_arrow` turns them into Arrow arrays of the declared types.

=======================================  ==================  ======================
MySQL/MariaDB                            Spark               Arrow
=======================================  ==================  ======================
``TINYINT``, ``SMALLINT``, ``MEDIUMINT``  ``int``             ``int32``
(signed or not), ``INT``, ``YEAR``
``INT UNSIGNED``, ``BIGINT``             ``bigint``          ``int64``
``BIGINT UNSIGNED``                      ``decimal(20,0)``   ``decimal128(20,0)``
``FLOAT`` / ``DOUBLE``                   ``float``/``double``  ``float32``/``float64``
``DECIMAL(p,s)``, p <= 38                ``decimal(p,s)``    ``decimal128(p,s)``
``CHAR``, ``VARCHAR``, ``*TEXT``,        ``string``          ``string``
``JSON``, ``ENUM``, ``SET``
``BINARY``, ``VARBINARY``, ``*BLOB``     ``binary``          ``binary``
``DATE``                                 ``date``            ``date32``
``DATETIME(p)``                          ``timestamp_ntz``   ``timestamp(us)``
``TIMESTAMP(p)``                         ``timestamp``       ``timestamp(us, UTC)``
``BIT(1)``                               ``boolean``         ``bool_``
``BIT(n)``, 1 < n <= 63                  ``bigint``          ``int64``
=======================================  ==================  ======================

Any other type (``TIME``, ``BIT(64)``, the spatial types, MariaDB's ``UUID``, ``INET4``,
``INET6``, ``VECTOR``, ...) is a :class:`~splitflow.errors.ConfigurationError` at
``load()`` naming ``db.table.column``: leave the table out, or change the column's type.

Details, each checked by ``tests/connectors/mysql/test_mysql_types.py`` against both paths:

* ``SET`` is its members in the column's order joined by commas (``a,c``), the empty set
  ``''``; the binlog gives a Python set.
* ``BINARY(n)`` is padded with zero bytes to ``n``, as stored; the binlog drops them.
* ``BIT(n)`` is the bits as a number; the snapshot gives big-endian bytes, the binlog a
  string of ``0`` and ``1``.
* ``TIMESTAMP`` is read in UTC on both paths; ``DATETIME`` has no time zone.
* ``FLOAT`` is a 4-byte float (the snapshot's text ``1.1`` and the binlog's
  ``1.100000023841858`` are the same ``float32``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

import pyarrow as pa

from splitflow.errors import ConfigurationError, ConnectorError

__all__ = ["ColumnType", "TypeMapping", "to_arrow"]

MAX_DECIMAL_PRECISION: Final = 38

_INT32 = frozenset({"tinyint", "smallint", "mediumint", "year"})
_TEXT = frozenset(
    {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "json", "enum", "set"}
)
_BYTES = frozenset({"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"})


@dataclass(frozen=True)
class ColumnType:
    """How one column is read: its Spark and Arrow types and its value conversions.

    Made by :meth:`TypeMapping.for_column`; a plain frozen dataclass, so it pickles.
    ``kind`` says which conversion applies (``plain``, ``ubigint``, ``set``, ``binary``,
    ``bit``, ``bit1``); ``members``: a ``SET``'s members in order; ``width``: a
    ``BINARY(n)``'s ``n``.
    """

    table: str
    column: str
    type_name: str
    spark: str
    arrow: Any
    kind: str = "plain"
    members: tuple[str, ...] = ()
    width: int = 0

    def from_snapshot(self, value: Any) -> Any:
        """The value of a PyMySQL row (None is NULL)."""
        if value is None or self.kind == "plain" or self.kind == "set":
            return value
        if self.kind == "ubigint":
            return Decimal(value)
        if self.kind == "binary":
            return bytes(value)
        if self.kind == "bit1":
            return int.from_bytes(value, "big") == 1
        if self.kind == "bit":
            return int.from_bytes(value, "big")
        raise AssertionError(self.kind)

    def from_log(self, value: Any, none_source: str | None = None) -> Any:
        """The value of a binlog row image (``none_source``: mysql-replication's reason for
        a None, ``"empty set"`` for an empty ``SET``)."""
        if value is None:
            return "" if self.kind == "set" and none_source == "empty set" else None
        if self.kind == "plain":
            return value
        if self.kind == "set":
            return ",".join(m for m in self.members if m in value)
        if self.kind == "ubigint":
            return Decimal(value)
        if self.kind == "binary":
            data = value.encode() if isinstance(value, str) else bytes(value)
            return data.ljust(self.width, b"\0")
        if self.kind == "bit1":
            return int(value, 2) == 1
        if self.kind == "bit":
            return int(value, 2)
        raise AssertionError(self.kind)


class TypeMapping:
    """The one mapping from MySQL/MariaDB column types to what the source emits (see the
    module's table)."""

    @staticmethod
    def for_column(
        table: str,
        column: str,
        data_type: str,
        column_type: str,
        precision: int | None = None,
        scale: int | None = None,
        octet_length: int | None = None,
    ) -> ColumnType:
        """The :class:`ColumnType` of ``table.column`` from ``information_schema.COLUMNS``
        (``DATA_TYPE``, ``COLUMN_TYPE``, ``NUMERIC_PRECISION``, ``NUMERIC_SCALE``,
        ``CHARACTER_OCTET_LENGTH``). Raises ConfigurationError for a type outside it.

        >>> t = TypeMapping.for_column("shop.orders", "total", "decimal", "decimal(10,2)", 10, 2)
        >>> t.spark, str(t.arrow)
        ('decimal(10,2)', 'decimal128(10, 2)')
        """
        name = data_type.lower()
        full = column_type.lower()
        unsigned = "unsigned" in full

        def made(spark: str, arrow: Any, kind: str = "plain", **extra: Any) -> ColumnType:
            return ColumnType(table, column, column_type, spark, arrow, kind, **extra)

        if name in _INT32 or (name == "int" and not unsigned):
            return made("int", pa.int32())
        if name == "int" or (name == "bigint" and not unsigned):
            return made("bigint", pa.int64())
        if name == "bigint":
            return made("decimal(20,0)", pa.decimal128(20, 0), "ubigint")
        if name == "float":
            return made("float", pa.float32())
        if name == "double":
            return made("double", pa.float64())
        if name == "decimal":
            p, s = int(precision or 10), int(scale or 0)
            if p > MAX_DECIMAL_PRECISION:
                raise _unsupported(
                    table,
                    column,
                    column_type,
                    f" (precision {p} is above Spark's maximum decimal precision "
                    f"{MAX_DECIMAL_PRECISION})",
                )
            return made(f"decimal({p},{s})", pa.decimal128(p, s))
        if name == "set":
            return made("string", pa.string(), "set", members=_members(column_type))
        if name in _TEXT:
            return made("string", pa.string())
        if name == "binary":
            return made("binary", pa.binary(), "binary", width=int(octet_length or 0))
        if name in _BYTES:
            return made("binary", pa.binary())
        if name == "date":
            return made("date", pa.date32())
        if name == "datetime":
            return made("timestamp_ntz", pa.timestamp("us"))
        if name == "timestamp":
            return made("timestamp", pa.timestamp("us", tz="UTC"))
        if name == "bit":
            bits = int(precision or 1)
            if bits == 1:
                return made("boolean", pa.bool_(), "bit1")
            if bits <= 63:
                return made("bigint", pa.int64(), "bit")
            raise _unsupported(table, column, column_type, " (more than 63 bits)")
        raise _unsupported(table, column, column_type)


def _members(column_type: str) -> tuple[str, ...]:
    """The members of ``set('a','b''c')`` in order.

    >>> _members("set('a','b''c','d,e')")
    ('a', "b'c", 'd,e')
    """
    inner = column_type[column_type.index("(") + 1 : column_type.rindex(")")]
    return tuple(m.replace("''", "'") for m in re.findall(r"'((?:[^']|'')*)'", inner))


def _unsupported(table: str, column: str, type_name: str, why: str = "") -> ConfigurationError:
    return ConfigurationError(
        f"column {table}.{column} has type {type_name!r}, which the mysql-cdc source cannot "
        f"read{why}. Supported: the integer types, FLOAT, DOUBLE, DECIMAL, CHAR, VARCHAR, "
        "the TEXT types, JSON, ENUM, SET, BINARY, VARBINARY, the BLOB types, DATE, DATETIME, "
        "TIMESTAMP, YEAR and BIT up to 63 bits. Leave the table out of tableName, or change "
        "the column's type (ALTER TABLE ... MODIFY ...)."
    )


def to_arrow(columns: Sequence[Sequence[Any]], types: Sequence[ColumnType]) -> list[Any]:
    """One ``pyarrow.Array`` per column (``columns[i]``: the values, already converted by
    :meth:`ColumnType.from_snapshot` or :meth:`~ColumnType.from_log`), typed
    ``types[i].arrow``. A value that does not fit is a ConnectorError naming the column.

    >>> kinds = [TypeMapping.for_column("db.t", "id", "int", "int(11)"),
    ...          TypeMapping.for_column("db.t", "s", "set", "set('a','b')")]
    >>> [a.to_pylist() for a in to_arrow([[1, None], ["a,b", ""]], kinds)]
    [[1, None], ['a,b', '']]
    """
    arrays = []
    for values, kind in zip(columns, types, strict=True):
        try:
            arrays.append(pa.array(values, type=kind.arrow))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError) as e:
            raise ConnectorError(
                f"column {kind.table}.{kind.column} ({kind.type_name}, read as {kind.spark}) "
                f"holds a value that does not fit: {e}"
            ) from None
    return arrays
