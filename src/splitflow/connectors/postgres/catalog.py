"""What the CDC source asks PostgreSQL outside of reading rows: connections, the tables and
their columns, the publication, the replication slot, and the cut of a table into chunks.

Every error names the thing at fault (the server as ``user@host:port/db``, the table, the
slot, the publication) and never the password.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from splitflow.connectors.cdc import changes, chunks, schema
from splitflow.connectors.cdc.chunks import KeyStats
from splitflow.connectors.cdc.splits import Cut
from splitflow.connectors.postgres.options import PostgresOptions
from splitflow.connectors.postgres.splits import ChunkSplit
from splitflow.connectors.postgres.types import ColumnType, TypeMapping, adapters
from splitflow.errors import ConfigurationError, ConnectorError

INTEGER_KEYS = {"int2", "int4", "int8"}


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
class Table(schema.Table[ColumnType]):
    """A table the source reads (the core's :class:`~splitflow.connectors.cdc.schema.Table`):
    its columns (name, type) in order, the columns that identify a row in the log, the
    column its chunks are cut by, and its replica identity.

    ``key``: the primary key; for a table without one, the columns of its ``REPLICA IDENTITY
    USING INDEX`` index; otherwise empty: a row is known only by all its values, and the log
    needs ``REPLICA IDENTITY FULL`` (:func:`check_replica_identity`).
    ``chunk_key``: the integer column :func:`cut` cuts by; empty: the table is one chunk.
    ``replica_identity``: ``pg_class.relreplident``: ``d`` default, ``f`` full, ``i`` using
    an index, ``n`` nothing.
    """

    replica_identity: str = "d"


def check_logical(conn: psycopg.Connection[Any], where: str) -> None:
    level = conn.execute("SHOW wal_level").fetchone()
    if level is None or level[0] != "logical":
        raise ConnectorError(
            f"PostgreSQL {where} has wal_level={level[0] if level else '?'}; change data "
            "capture needs wal_level=logical (set it in postgresql.conf and restart the "
            "server), or use startupMode=snapshotOnly"
        )


def list_tables(conn: psycopg.Connection[Any], options: PostgresOptions) -> list[str]:
    """The tables ``options.tables`` names or matches, sorted.

    A named table that does not exist is a ConfigurationError, and so is an option
    ``chunkKeyColumn`` that names a table not among them, or a column none of them has.
    """
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
    for table, column in options.chunk_keys:
        if table and table not in names:
            raise ConfigurationError(
                f"option chunkKeyColumn: table {table} is not one of the tables the query "
                "reads (option tables)",
                option="chunkKeyColumn",
            )
        if not table and names and not _has_column(conn, names, column):
            raise ConfigurationError(
                f"option chunkKeyColumn: no table the query reads has a column {column} "
                f"({', '.join(names[:5])}{', ...' if len(names) > 5 else ''})",
                option="chunkKeyColumn",
            )
    return names


def _has_column(conn: psycopg.Connection[Any], tables: list[str], column: str) -> bool:
    found = conn.execute(
        "SELECT 1 FROM pg_attribute WHERE attrelid = ANY(%s::regclass[]) AND attname = %s "
        "AND attnum > 0 AND NOT attisdropped LIMIT 1",
        ([quoted(t).as_string(conn) for t in tables], column),
    ).fetchone()
    return found is not None


def describe_table(
    conn: psycopg.Connection[Any], table: str, options: PostgresOptions | None = None
) -> Table:
    """Columns, key, chunk key and replica identity of ``table`` (see :class:`Table`).

    The chunk key is the column option ``chunkKeyColumn`` names for the table (``options``;
    None: no option), else a key of one integer column, else none. A named column must
    exist, be an integer column and, in a table with a key, be one of the key's columns (a
    delete carries only the key); otherwise a ConfigurationError names it.
    """
    regclass = quoted(table).as_string(conn)
    rows = conn.execute(
        "SELECT a.attname, a.atttypid, a.atttypmod, format_type(a.atttypid, a.atttypmod), "
        "  t.typname, a.attnum "
        "FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
        "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped "
        "ORDER BY a.attnum",
        (regclass,),
    ).fetchall()
    key_rows = conn.execute(  # the primary key, else the replica identity's index
        "SELECT a.attname, i.indisprimary FROM pg_index i "
        "JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n) ON true "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
        "WHERE i.indexrelid = (SELECT indexrelid FROM pg_index WHERE indrelid = %s::regclass "
        "  AND (indisprimary OR indisreplident) ORDER BY indisprimary DESC LIMIT 1) "
        "ORDER BY k.n",
        (regclass,),
    ).fetchall()
    identity = conn.execute(
        "SELECT relreplident FROM pg_class WHERE oid = %s::regclass", (regclass,)
    ).fetchone()
    columns = tuple(
        (name, TypeMapping.for_column(table, name, oid, typmod, type_name))
        for name, oid, typmod, type_name, _, _ in rows
    )
    types = {r[0]: r[4] for r in rows}
    key = tuple(r[0] for r in key_rows)
    key_name = "primary key" if key_rows and key_rows[0][1] else "replica identity index"
    chunk_key = key[0] if len(key) == 1 and types[key[0]] in INTEGER_KEYS else ""
    named = options.chunk_key(table) if options is not None else None
    explicit = options is not None and (table, named) in options.chunk_keys
    if named is not None and (named in types or explicit):  # a bare name: tables that have it
        where = f"option chunkKeyColumn: column {table}.{named}"
        if named not in types:
            raise ConfigurationError(f"{where} does not exist", option="chunkKeyColumn")
        if types[named] not in INTEGER_KEYS:
            raise ConfigurationError(
                f"{where} is {types[named]}: chunks are cut by an integer column (smallint, "
                "integer or bigint)",
                option="chunkKeyColumn",
            )
        if key and named not in key:
            raise ConfigurationError(
                f"{where} is not in the {key_name} of {table} ({', '.join(key)}): a table "
                "with a key is cut by one of its key columns, because a delete carries only "
                "the key (name the tables a column applies to as table:column)",
                option="chunkKeyColumn",
            )
        chunk_key = named
    return Table(
        table,
        columns,
        key,
        chunk_key,
        ids=tuple(int(r[5]) for r in rows),
        replica_identity=str(identity[0]) if identity else "d",
    )


def layout(table: Table) -> list[tuple[str, int, int]]:
    """``(name, type oid, type modifier)`` of each column: what a ``Relation`` message or
    ``pg_attribute`` says of a table, to tell whether it is still as ``table`` describes."""
    return [(name, kind.type_oid, kind.type_modifier) for name, kind in table.columns]


def describe_relation(
    conn: psycopg.Connection[Any],
    described: Table,
    oid: int,
    columns: Sequence[tuple[str, int, int]],
) -> Table:
    """``described`` with the columns ``(name, type oid, type modifier)`` the log now
    writes its table (``oid``) with; each column's id is its ``attnum`` in the catalog now
    (0 for a name the catalog no longer has), so that a rename is known."""
    rows = conn.execute(
        "SELECT c.n, format_type(c.oid, c.typmod), t.typname, "
        "  (SELECT a.attnum FROM pg_attribute a WHERE a.attrelid = %s::oid AND a.attname = c.name "
        "   AND NOT a.attisdropped) "
        "FROM unnest(%s::text[], %s::oid[], %s::int[]) WITH ORDINALITY AS c(name, oid, typmod, n) "
        "JOIN pg_type t ON t.oid = c.oid ORDER BY c.n",
        (oid, [c[0] for c in columns], [c[1] for c in columns], [c[2] for c in columns]),
    ).fetchall()
    kinds = [
        (name, TypeMapping.for_column(described.name, name, type_oid, typmod, str(row[1])))
        for (name, type_oid, typmod), row in zip(columns, rows, strict=True)
    ]
    ids = [int(row[3] or 0) for row in rows]
    return changes.follow(described, kinds, ids)  # type: ignore[return-value]


def check_replica_identity(table: Table) -> None:
    """Refuse to stream a table without a key unless its replica identity is FULL.

    PostgreSQL refuses ``UPDATE`` and ``DELETE`` on a published table that has no replica
    identity (which would break the application writing it), and the log needs the whole
    old row to say which row an update or a delete changed. Called before the table joins
    the publication, for streams only: a snapshot needs nothing.
    """
    if table.key or table.replica_identity == "f":
        return
    name = ".".join(p if _PLAIN.fullmatch(p) else f'"{p}"' for p in table.name.split(".", 1))
    raise ConfigurationError(
        f"option tables: table {table.name} has no primary key and replica identity "
        f"{_IDENTITIES.get(table.replica_identity, table.replica_identity)}: updates and "
        "deletes of a table without a primary key need REPLICA IDENTITY FULL to be streamed "
        "(PostgreSQL refuses them on a published table without a replica identity, and the "
        f"log needs the old row): run ALTER TABLE {name} REPLICA IDENTITY FULL, or leave "
        "the table out, or use startupMode=snapshotOnly",
        option="tables",
    )


_PLAIN = re.compile(r"[a-z_][a-z0-9_]*")
_IDENTITIES = {"d": "default", "n": "nothing", "i": "using an index that no longer exists"}


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


def cut(conn: psycopg.Connection[Any], table: Table, chunk_size: int) -> Cut:
    """The start of ``table``'s cut into chunks of about ``chunk_size`` rows by its chunk
    key (:attr:`Table.chunk_key`, an integer column), as the core cuts
    (:func:`splitflow.connectors.cdc.chunks.start_cut`: even ranges when the values are
    dense, found by stepping through them in order (:func:`key_after`) when they are sparse;
    open first and last chunks; NULL keys in the first). Without a chunk key the whole table
    is one chunk.
    """
    if not table.chunk_key:
        return Cut(table.name)
    key = table.chunk_key
    stats = conn.execute(
        sql.SQL("SELECT min({k}), max({k}), count({k}), count(*) FROM {t}").format(
            k=sql.Identifier(key), t=quoted(table.name)
        )
    ).fetchone() or (None, None, 0, 0)
    return chunks.start_cut(table.name, key, chunk_size, KeyStats(*stats))


def key_after(
    conn: psycopg.Connection[Any], table: str, key: str, at: int, rows: int
) -> int | None:
    """The value of ``table``'s column ``key`` ``rows`` rows after the first value ``>= at``
    in key order, None past the end."""
    found = conn.execute(
        sql.SQL("SELECT {k} FROM {t} WHERE {k} >= %s ORDER BY {k} OFFSET %s LIMIT 1").format(
            k=sql.Identifier(key), t=quoted(table)
        ),
        (at, rows),
    ).fetchone()
    return None if found is None else int(found[0])


def chunk_condition(split: ChunkSplit) -> str:
    """The SQL condition that selects ``split``'s rows, empty for a whole table
    (:func:`splitflow.connectors.cdc.chunks.chunk_condition`).

    >>> chunk_condition(ChunkSplit("public.t", 0, "aid", None, 100))
    '("aid" < 100 OR "aid" IS NULL)'
    >>> chunk_condition(ChunkSplit("public.t", 1, "aid", 100, 200))
    '"aid" >= 100 AND "aid" < 200'
    """
    return chunks.chunk_condition(split, lambda name: sql.Identifier(name).as_string())


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
