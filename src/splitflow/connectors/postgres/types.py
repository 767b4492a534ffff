"""PostgreSQL column types: what the CDC source emits for each, in one place.

Both read paths produce the same Python values: the snapshot (a ``SELECT`` through a
psycopg connection made with ``context=adapters()``) and the log (pgoutput's text values
through :meth:`ColumnType.from_text`, which uses the same psycopg loaders).
:func:`to_arrow` turns those values into Arrow arrays of the declared types.

============================  ==================  ======================  ===================
PostgreSQL                    Spark               Arrow                   Python value
============================  ==================  ======================  ===================
``smallint``, ``integer``     ``int``             ``int32``               ``int``
``bigint``                    ``bigint``          ``int64``               ``int``
``real``                      ``float``           ``float32``             ``float``
``double precision``          ``double``          ``float64``             ``float``
``numeric(p,s)``, p <= 38     ``decimal(p,s)``    ``decimal128(p,s)``     ``Decimal``
``numeric`` (no precision)    ``decimal(38,18)``  ``decimal128(38,18)``   ``Decimal``
``text``, ``varchar(n)``,     ``string``          ``string``              ``str``
``char(n)``, ``name``,
``citext``
``uuid``                      ``string``          ``string``              ``str`` (canonical)
``json``, ``jsonb``           ``string``          ``string``              ``str`` (JSON text)
``boolean``                   ``boolean``         ``bool_``               ``bool``
``timestamp with time zone``  ``timestamp``       ``timestamp(us, UTC)``  aware ``datetime``
``timestamp``                 ``timestamp_ntz``   ``timestamp(us)``       naive ``datetime``
``date``                      ``date``            ``date32``              ``date``
``bytea``                     ``binary``          ``binary``              ``bytes``
1-D array of any of these     ``array<elem>``     ``list<elem>``          ``list``
============================  ==================  ======================  ===================

Any other type (``interval``, ``point``, ``money``, ``xml``, enums, domains, ranges,
composite types, ...) is a :class:`~splitflow.errors.ConfigurationError` naming
``table.column``: a view cannot cast it for CDC (logical decoding reads tables), so exclude
the table or change the column's type.

Details:

* ``numeric`` without a precision has no fixed scale; it is read as ``decimal(38,18)``.
  A value that does not fit the Arrow decimal (more than 20 integer digits or more than 18
  fractional digits, ``NaN``, ``Infinity``) makes :func:`to_arrow` raise
  ConfigurationError naming the column: declare it ``numeric(p,s)``. PostgreSQL 15 allows a
  negative scale (``numeric(5,-2)``: integers rounded to hundreds) and a scale above the
  precision (``numeric(2,5)``); they map to ``decimal(p-s,0)`` and ``decimal(s,s)``.
* ``timestamp with time zone``: the snapshot's ``datetime`` is in the session's
  ``TimeZone``, the log's in UTC; they are equal instants, and Arrow holds UTC. Open the
  snapshot connection with ``options='-c TimeZone=UTC'`` for identical ``tzinfo`` too.
  The text loaders expect ``DateStyle`` ISO (PostgreSQL's default) in the session that
  peeks the slot.
* ``uuid`` loads as its canonical lower-case string (not ``uuid.UUID``), so the values a
  cursor returns are the values the source emits.
* An array column's type does not record its dimensions; a multi-dimensional value makes
  :func:`to_arrow` raise ConfigurationError naming the column.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final

import pyarrow as pa
from psycopg import adapt, pq
from psycopg.abc import Buffer, Transformer
from psycopg.adapt import AdaptersMap, Loader
from psycopg.types.string import TextLoader

from splitflow.connectors.cdc.schema import METADATA
from splitflow.errors import ConfigurationError

__all__ = ["METADATA", "ColumnType", "TypeMapping", "adapters", "to_arrow"]

_NUMERIC: Final = 1700
#: Unconstrained ``numeric`` is read as decimal(38, 18): 20 integer and 18 fractional digits.
UNCONSTRAINED_NUMERIC: Final = (38, 18)
MAX_DECIMAL_PRECISION: Final = 38


class _JsonbBinaryTextLoader(Loader):
    """jsonb in binary format (a version byte, then the JSON text) as ``str``."""

    format = pq.Format.BINARY

    def load(self, data: Buffer) -> str:
        return bytes(data[1:]).decode()


class _BinaryTextLoader(Loader):
    """json in binary format (the JSON text) as ``str``."""

    format = pq.Format.BINARY

    def load(self, data: Buffer) -> str:
        return bytes(data).decode()


class _UuidBinaryStrLoader(Loader):
    format = pq.Format.BINARY

    def load(self, data: Buffer) -> str:
        return str(uuid.UUID(bytes=bytes(data)))


def adapters() -> AdaptersMap:
    """A copy of psycopg's global adapters where ``json``/``jsonb`` load as their JSON text
    and ``uuid`` as its canonical string; every other type loads as psycopg's default.

    Use it for the snapshot's connection so a ``SELECT`` returns the values the source
    emits::

        psycopg.connect(conninfo, context=adapters())
    """
    import psycopg

    result = AdaptersMap(psycopg.adapters)
    for name in ("json", "jsonb", "uuid"):
        result.register_loader(name, TextLoader)
    result.register_loader("json", _BinaryTextLoader)
    result.register_loader("jsonb", _JsonbBinaryTextLoader)
    result.register_loader("uuid", _UuidBinaryStrLoader)
    return result


@dataclass(frozen=True)
class _Base:
    spark: str
    arrow: Any


# type OID -> (Spark DDL type, Arrow type), for the scalar types; numeric apart.
_SCALARS: Final[dict[int, _Base]] = {
    21: _Base("int", pa.int32()),  # int2
    23: _Base("int", pa.int32()),  # int4
    20: _Base("bigint", pa.int64()),  # int8
    700: _Base("float", pa.float32()),  # float4
    701: _Base("double", pa.float64()),  # float8
    25: _Base("string", pa.string()),  # text
    1043: _Base("string", pa.string()),  # varchar
    1042: _Base("string", pa.string()),  # bpchar
    19: _Base("string", pa.string()),  # name
    2950: _Base("string", pa.string()),  # uuid
    114: _Base("string", pa.string()),  # json
    3802: _Base("string", pa.string()),  # jsonb
    16: _Base("boolean", pa.bool_()),  # bool
    1184: _Base("timestamp", pa.timestamp("us", tz="UTC")),  # timestamptz
    1114: _Base("timestamp_ntz", pa.timestamp("us")),  # timestamp
    1082: _Base("date", pa.date32()),  # date
    17: _Base("binary", pa.binary()),  # bytea
}

# array type OID -> element type OID
_ARRAYS: Final[dict[int, int]] = {
    1005: 21,
    1007: 23,
    1016: 20,
    1021: 700,
    1022: 701,
    1231: _NUMERIC,
    1009: 25,
    1015: 1043,
    1014: 1042,
    1003: 19,
    2951: 2950,
    199: 114,
    3807: 3802,
    1000: 16,
    1185: 1184,
    1115: 1114,
    1182: 1082,
    1001: 17,
}

# Extension types (their OIDs differ per database), by name: they load as text.
_BY_NAME: Final[dict[str, _Base]] = {"citext": _Base("string", pa.string())}

_shared_adapters: AdaptersMap | None = None
_shared_transformer: Transformer | None = None


def _transformer() -> Transformer:
    global _shared_adapters, _shared_transformer
    if _shared_transformer is None:
        _shared_adapters = adapters()
        _shared_transformer = adapt.Transformer(_shared_adapters)
    return _shared_transformer


def _numeric(typmod: int) -> tuple[int, int] | None:
    """(precision, scale) of a numeric type modifier, None when unconstrained.

    PostgreSQL stores ``((precision << 16) | (scale & 0x7FF)) + 4``, the scale as an 11-bit
    two's complement (PostgreSQL 15 allows -1000..1000).

    >>> _numeric(((10 << 16) | 2) + 4), _numeric(-1), _numeric(((5 << 16) | 0x7FE) + 4)
    ((10, 2), None, (5, -2))
    """
    if typmod < 4:
        return None
    value = typmod - 4
    scale = value & 0x7FF
    return (value >> 16) & 0xFFFF, (scale ^ 0x400) - 0x400


def _unsupported(table: str, column: str, type_name: str, why: str = "") -> ConfigurationError:
    return ConfigurationError(
        f"column {table}.{column} has PostgreSQL type {type_name!r}, which the postgres-cdc "
        f"source cannot read{why}. Supported: smallint, integer, bigint, real, double "
        "precision, numeric, text, varchar, char, name, citext, uuid, json, jsonb, boolean, "
        "timestamp, timestamptz, date, bytea and 1-D arrays of these. A view cannot cast it "
        "(logical decoding reads tables): exclude the table from the source, or change the "
        "column's type (ALTER TABLE ... ALTER COLUMN ... TYPE ...)."
    )


def _decimal(table: str, column: str, type_name: str, typmod: int) -> _Base:
    bounds = _numeric(typmod)
    if bounds is None:
        precision, scale = UNCONSTRAINED_NUMERIC
    else:
        precision, scale = bounds
        if scale < 0:
            precision, scale = precision - scale, 0
        elif scale > precision:
            precision = scale
        if precision > MAX_DECIMAL_PRECISION:
            raise _unsupported(
                table,
                column,
                type_name,
                f" (precision {precision} is above Spark's maximum decimal precision "
                f"{MAX_DECIMAL_PRECISION})",
            )
    return _Base(f"decimal({precision},{scale})", pa.decimal128(precision, scale))


def _short_name(type_name: str) -> str:
    """``citext`` from ``public.citext``, ``"citext"`` or ``citext(10)``."""
    name = type_name.rsplit(".", 1)[-1].strip().strip('"')
    return re.sub(r"\(.*\)$", "", name).lower()


@dataclass(frozen=True)
class ColumnType:
    """How one column is read: its Spark and Arrow types and its text loader.

    Made by :meth:`TypeMapping.for_column`; pickles (the loader is made again).
    """

    table: str
    column: str
    type_name: str
    type_oid: int
    type_modifier: int
    spark: str
    """Spark DDL type, e.g. ``decimal(10,2)`` or ``array<int>``."""
    arrow: Any
    """The ``pyarrow.DataType`` of :func:`to_arrow`'s array for this column."""
    _load: Callable[[Buffer], Any] = field(repr=False, compare=False)

    def from_text(self, data: Buffer) -> Any:
        """The Python value of a pgoutput text-format value (the bytes of a TupleData
        column): the same value a ``SELECT`` through :func:`adapters` returns.

        Not for NULL or unchanged-TOAST columns (they have no bytes).
        """
        return self._load(data)

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            TypeMapping.for_column,
            (self.table, self.column, self.type_oid, self.type_modifier, self.type_name),
        )


class TypeMapping:
    """The one mapping from PostgreSQL column types to what the source emits (see the
    module's table)."""

    @staticmethod
    def for_column(
        table: str, column: str, type_oid: int, type_modifier: int, type_name: str
    ) -> ColumnType:
        """The :class:`ColumnType` of ``table.column``.

        ``type_oid`` and ``type_modifier`` are ``pg_attribute.atttypid``/``atttypmod`` (or a
        pgoutput Relation column's); ``type_name`` is for messages and for extension types
        (``citext``), e.g. ``format_type(atttypid, atttypmod)``.
        Raises ConfigurationError for a type outside the mapping.

        >>> t = TypeMapping.for_column("public.t", "price", 1700, ((10 << 16) | 2) + 4,
        ...                            "numeric(10,2)")
        >>> t.spark, str(t.arrow), t.from_text(b"-12.50")
        ('decimal(10,2)', 'decimal128(10, 2)', Decimal('-12.50'))
        """
        base: _Base
        if type_oid == _NUMERIC:
            base = _decimal(table, column, type_name, type_modifier)
        elif type_oid in _SCALARS:
            base = _SCALARS[type_oid]
        elif type_oid in _ARRAYS:
            element = _ARRAYS[type_oid]
            if element == _NUMERIC:
                inner = _decimal(table, column, type_name, type_modifier)
            else:
                inner = _SCALARS[element]
            base = _Base(f"array<{inner.spark}>", pa.list_(inner.arrow))
        elif _short_name(type_name) in _BY_NAME:
            base = _BY_NAME[_short_name(type_name)]
        else:
            raise _unsupported(table, column, type_name)
        loader = _transformer().get_loader(type_oid, pq.Format.TEXT)
        return ColumnType(
            table, column, type_name, type_oid, type_modifier, base.spark, base.arrow, loader.load
        )


def _normalise(value: Any) -> Any:
    """A value pyarrow may refuse, made acceptable (uuid.UUID -> str, in lists too)."""
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, list):
        return [_normalise(v) for v in value]
    return value


def _first_bad(values: list[Any], arrow: Any) -> Any:
    for value in values:
        try:
            pa.array([value], type=arrow)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError):
            return value
    return None


def _column_array(values: list[Any], kind: ColumnType) -> Any:
    try:
        return pa.array(values, type=kind.arrow)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError) as first:
        values = [_normalise(v) for v in values]
        try:
            return pa.array(values, type=kind.arrow)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError):
            pass
        bad = _first_bad(values, kind.arrow)
        where = f"column {kind.table}.{kind.column} ({kind.type_name}, read as {kind.spark})"
        if isinstance(bad, list) and any(isinstance(v, list) for v in bad):
            raise ConfigurationError(
                f"{where} holds a multi-dimensional array {bad!r:.200}; only 1-D arrays can be "
                "read: exclude the table or store 1-D arrays"
            ) from first
        if isinstance(bad, Decimal) or (
            isinstance(bad, list) and any(isinstance(v, Decimal) for v in bad)
        ):
            raise ConfigurationError(
                f"{where} holds {bad!r:.200}, which does not fit {kind.spark}: declare the "
                "column numeric(p,s) with p <= 38 so every value fits"
            ) from first
        raise ConfigurationError(
            f"{where}: cannot convert {bad!r:.200} to Arrow {kind.arrow}: {first}"
        ) from first


def to_arrow(rows: Sequence[Sequence[Any]], types: Sequence[ColumnType]) -> list[Any]:
    """One ``pyarrow.Array`` per column of ``rows`` (values as :func:`adapters` or
    :meth:`ColumnType.from_text` give them; None is null), typed ``types[i].arrow``.

    Aware datetimes become UTC; ``uuid.UUID`` becomes its string. A value that does not fit
    (a numeric beyond the column's decimal, a multi-dimensional array) raises
    ConfigurationError naming the column.

    >>> kinds = [TypeMapping.for_column("t", "id", 23, -1, "integer"),
    ...          TypeMapping.for_column("t", "doc", 3802, -1, "jsonb")]
    >>> [a.to_pylist() for a in to_arrow([(1, '{"a": 1}'), (None, None)], kinds)]
    [[1, None], ['{"a": 1}', None]]
    """
    width = len(types)
    for row in rows:
        if len(row) != width:
            raise ValueError(f"a row has {len(row)} values, expected {width} (one per type)")
    return [_column_array([row[i] for row in rows], kind) for i, kind in enumerate(types)]
