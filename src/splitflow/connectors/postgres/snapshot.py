"""Reading a chunk's rows straight into Arrow with the ADBC PostgreSQL driver.

Row by row through psycopg, the snapshot spent most of its time making Python objects
(``Decimal``, aware ``datetime``) only to turn them into Arrow arrays. ADBC's driver reads
the rows with ``COPY ... (FORMAT binary)`` in C++ and hands over Arrow arrays, so the chunk
never becomes Python objects. The columns are made to match :mod:`.types` (what the log
emits):

* ``uuid``, ``json``, ``jsonb``, ``citext`` and ``name`` (and arrays of them) are selected as
  ``text`` (ADBC would give UUID bytes and JSON extension types);
* ``numeric`` is selected as text too and cast to the column's decimal (see :data:`AS_TEXT`);
* everything else comes in its Arrow type and is cast where the width differs
  (``smallint`` to ``int32``).

The chunk's transaction (``REPEATABLE READ READ ONLY``) and its watermark statements run on
the same ADBC connection, so the watermark describes exactly the snapshot the rows come from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from psycopg import sql

from splitflow.connectors.postgres.catalog import connect_failed
from splitflow.connectors.postgres.types import ColumnType
from splitflow.errors import ConnectorError

AS_TEXT = {2950, 114, 3802, 19, 1700, 2951, 199, 3807, 1003, 1231}
"""Type OIDs selected as ``text`` (``text[]`` for the arrays): uuid, json, jsonb, name,
numeric and their arrays; ``citext`` too, found by name (its OID differs per database). Not
``char(n)``: a cast to text drops its padding. ``numeric`` as text: the server formats it for
less than ADBC's own conversion costs (0.09 against 0.25 CPU seconds per million values,
measured), and pyarrow casts the text to the column's decimal."""


def select_list(columns: Sequence[tuple[str, ColumnType]]) -> str:
    """The ``SELECT`` list of a chunk: each column as :func:`to_columns` expects it."""
    items = []
    for name, kind in columns:
        cast = ""
        if kind.type_oid in AS_TEXT or "citext" in kind.type_name.lower():
            cast = "::text[]" if pa.types.is_list(kind.arrow) else "::text"
        column = sql.Identifier(name).as_string()
        items.append(f"{column}{cast} AS {column}")
    return ", ".join(items)


def to_columns(
    table: pa.Table, columns: Sequence[tuple[str, ColumnType]], where: str
) -> list[pa.ChunkedArray]:
    """The columns of a chunk's ADBC result, each cast to its :mod:`.types` Arrow type."""
    arrays = []
    for i, (name, kind) in enumerate(columns):
        got = table.column(i)
        if got.type != kind.arrow:
            try:
                got = got.cast(kind.arrow)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise ConnectorError(
                    f"{where}: column {name} ({kind.type_name}) holds a value that does not fit "
                    f"{kind.spark}: {e}"
                ) from None
        arrays.append(got)
    return arrays


def connect(conninfo: str, where: str = "") -> Any:
    """An ADBC DB-API connection (not autocommit: each chunk is one transaction).

    A failure is a :class:`~splitflow.errors.ConnectorError` naming the server (``where``,
    as ``user@host:port/db``) and the driver's reason, with the password taken out.
    """
    import adbc_driver_postgresql.dbapi as adbc

    try:
        return adbc.connect(conninfo)
    except Exception as e:
        raise connect_failed(conninfo, where, e, " (ADBC)") from None
