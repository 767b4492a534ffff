"""What the CDC source asks PostgreSQL outside of reading rows: connections, the tables and
their columns, the publication, the replication slot, and the cut of a table into chunks.

Every error names the thing at fault (the server as ``user@host:port/db``, the table, the
slot, the publication) and never the password.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from splitflow.connectors.postgres.options import PostgresOptions
from splitflow.connectors.postgres.splits import ChunkSplit
from splitflow.connectors.postgres.types import ColumnType, TypeMapping, adapters
from splitflow.errors import ConfigurationError, ConnectorError

INTEGER_KEYS = {"int2", "int4", "int8"}
SPARSE = 4.0
"""Keys spread over more than this many values per row are cut by stepping through them in
key order (``ORDER BY key OFFSET chunkSize``) instead of evenly by value."""


def connect(options: PostgresOptions, **kwargs: Any) -> psycopg.Connection[Any]:
    """A connection with the source's type mapping, or a ConnectorError naming the server."""
    try:
        conn = psycopg.connect(options.conninfo, context=adapters(), **kwargs)
    except psycopg.OperationalError as e:
        raise connect_failed(options.conninfo, options.where, e) from None
    return conn


def connect_failed(
    conninfo: str, where: str, error: BaseException, driver: str = ""
) -> ConnectorError:
    """The error of a connection that failed: the server and the driver's reason, on one
    line, with the password taken out."""
    from psycopg.conninfo import conninfo_to_dict

    reason = " ".join(str(error).split()) or type(error).__name__
    password = str(conninfo_to_dict(conninfo).get("password") or "")
    if password:
        reason = reason.replace(password, "***")
    return ConnectorError(f"cannot connect to PostgreSQL {where}{driver}: {reason}")


def quoted(table: str) -> sql.Composed:
    schema, name = table.split(".", 1)
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(name))


@dataclass(frozen=True)
class Table:
    """A table the source reads: its columns (name, type), in order, and its primary key."""

    name: str
    columns: tuple[tuple[str, ColumnType], ...]
    key: tuple[str, ...]
    key_type: str

    @property
    def cuttable(self) -> bool:
        """Whether chunks are key ranges (one integer key column) or the whole table."""
        return len(self.key) == 1 and self.key_type in INTEGER_KEYS


def check_logical(conn: psycopg.Connection[Any], where: str) -> None:
    level = conn.execute("SHOW wal_level").fetchone()
    if level is None or level[0] != "logical":
        raise ConnectorError(
            f"PostgreSQL {where} has wal_level={level[0] if level else '?'}; change data "
            "capture needs wal_level=logical (set it in postgresql.conf and restart the "
            "server), or use startupMode=snapshotOnly"
        )


def list_tables(conn: psycopg.Connection[Any], options: PostgresOptions) -> list[str]:
    """The tables ``options.tables`` names or matches, sorted. A named table that does not
    exist is a ConfigurationError."""
    rows = conn.execute(
        "SELECT n.nspname || '.' || c.relname FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
    ).fetchall()
    names = sorted(r[0] for r in rows if options.matches(r[0]))
    for wanted in options.tables:
        if not any(ch in wanted for ch in "*?[") and wanted not in names:
            raise ConfigurationError(
                f"option tables: table {wanted} does not exist in {options.where} (or the "
                "role cannot see it)",
                option="tables",
            )
    return names


def describe_table(conn: psycopg.Connection[Any], table: str) -> Table:
    """Columns and primary key of ``table``; a table without a primary key is refused."""
    rows = conn.execute(
        "SELECT a.attname, a.atttypid, a.atttypmod, format_type(a.atttypid, a.atttypmod), "
        "  t.typname, coalesce(a.attnum = ANY(i.indkey), false) "
        "FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
        "LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary "
        "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped "
        "ORDER BY a.attnum",
        (str(quoted(table).as_string(conn)),),
    ).fetchall()
    key_order = conn.execute(
        "SELECT a.attname, t.typname FROM pg_index i "
        "JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n) ON true "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
        "JOIN pg_type t ON t.oid = a.atttypid "
        "WHERE i.indrelid = %s::regclass AND i.indisprimary ORDER BY k.n",
        (str(quoted(table).as_string(conn)),),
    ).fetchall()
    if not key_order:
        raise ConfigurationError(
            f"option tables: table {table} has no primary key; change data capture needs one "
            "(to cut the snapshot into chunks and to key updates and deletes): add a primary "
            "key or leave the table out",
            option="tables",
        )
    columns = tuple(
        (name, TypeMapping.for_column(table, name, oid, typmod, type_name))
        for name, oid, typmod, type_name, _, _ in rows
    )
    return Table(table, columns, tuple(r[0] for r in key_order), key_order[0][1])


def ensure_publication(
    conn: psycopg.Connection[Any], options: PostgresOptions, tables: list[str]
) -> None:
    """Create the publication of ``tables``, or add those it lacks."""
    name = options.publication
    exists = conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (name,)).fetchone()
    try:
        if exists is None:
            create = sql.SQL("CREATE PUBLICATION {}").format(sql.Identifier(name))
            if tables:  # none yet (a pattern that matches nothing so far): an empty one
                create += sql.SQL(" FOR TABLE {}").format(
                    sql.SQL(", ").join(quoted(t) for t in tables)
                )
            conn.execute(create)
            return
        published = {
            f"{s}.{t}"
            for s, t in conn.execute(
                "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
                (name,),
            ).fetchall()
        }
        missing = [t for t in tables if t not in published]
        if missing:
            conn.execute(
                sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
                    sql.Identifier(name), sql.SQL(", ").join(quoted(t) for t in missing)
                )
            )
    except psycopg.errors.InsufficientPrivilege as e:
        raise ConnectorError(
            f"option publicationName: cannot create or extend publication {name} in "
            f"{options.where} ({e.diag.message_primary}): create it as an owner of the tables "
            f"(CREATE PUBLICATION {name} FOR TABLE ...) or grant the role CREATE on the "
            "database and ownership of the tables"
        ) from None


def ensure_slot(conn: psycopg.Connection[Any], options: PostgresOptions) -> int:
    """The slot's confirmed LSN, creating the slot (pgoutput) if it is missing."""
    slot = options.slot
    row = conn.execute(
        "SELECT plugin, confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots "
        "WHERE slot_name = %s",
        (slot,),
    ).fetchone()
    if row is not None:
        if row[0] != "pgoutput":
            raise ConnectorError(
                f"option slotName: replication slot {slot} in {options.where} uses plugin "
                f"{row[0]}, not pgoutput: choose another slot name"
            )
        return int(row[1])
    try:
        made = conn.execute(
            "SELECT lsn - '0/0'::pg_lsn FROM pg_create_logical_replication_slot(%s, 'pgoutput')",
            (slot,),
        ).fetchone()
    except psycopg.errors.InsufficientPrivilege as e:
        raise ConnectorError(
            f"option slotName: cannot create replication slot {slot} in {options.where} "
            f"({e.diag.message_primary}): the role needs the REPLICATION attribute"
        ) from None
    assert made is not None
    return int(made[0])


def cut(conn: psycopg.Connection[Any], table: Table, chunk_size: int) -> list[ChunkSplit]:
    """``table`` cut into chunks of about ``chunk_size`` rows.

    One integer key column: ranges of key values, even when the keys are dense and found by
    stepping through them in key order when they are sparse; the first and last chunks are
    open, so a key inserted beyond the range known now still belongs to exactly one chunk.
    Any other key: the whole table is one chunk.
    """
    if not table.cuttable:
        return [ChunkSplit(table.name, 0)]
    key = table.key[0]
    low, high, rows = conn.execute(
        sql.SQL("SELECT min({k}), max({k}), count(*) FROM {t}").format(
            k=sql.Identifier(key), t=quoted(table.name)
        )
    ).fetchone() or (None, None, 0)
    if low is None or high is None or rows <= chunk_size:
        return [ChunkSplit(table.name, 0, key)]
    bounds: list[int] = []
    spread = (high - low + 1) / rows
    if spread <= SPARSE:
        step = max(1, math.ceil(chunk_size * spread))
        bounds = list(range(low + step, high + 1, step))
    else:
        at = low
        step_query = sql.SQL(
            "SELECT {k} FROM {t} WHERE {k} >= %s ORDER BY {k} OFFSET %s LIMIT 1"
        ).format(k=sql.Identifier(key), t=quoted(table.name))
        while True:
            found = conn.execute(step_query, (at, chunk_size)).fetchone()
            if found is None:
                break
            at = int(found[0])
            bounds.append(at)
    edges: list[int | None] = [None, *bounds, None]
    return [ChunkSplit(table.name, i, key, edges[i], edges[i + 1]) for i in range(len(edges) - 1)]


def row_bytes(conn: psycopg.Connection[Any], tables: list[str]) -> dict[str, int]:
    """Each table's average row size in bytes, from the planner's statistics (100 unknown)."""
    sizes = {}
    for table in tables:
        row = conn.execute(
            "SELECT pg_relation_size(%s::regclass), reltuples FROM pg_class "
            "WHERE oid = %s::regclass",
            (quoted(table).as_string(conn),) * 2,
        ).fetchone()
        size, tuples = row if row is not None else (0, 0)
        sizes[table] = max(1, int(size / tuples)) if tuples and tuples > 0 else 100
    return sizes
