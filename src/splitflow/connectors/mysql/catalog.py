"""What the CDC source asks MySQL/MariaDB outside of reading rows: connections, the server's
binlog settings and GTID position, the tables and their columns, and the cut of a table
into chunks.

Every error names the thing at fault (the server as ``user@host:port``, the table, the
option) and never the password.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import pymysql

from splitflow.connectors.cdc import chunks
from splitflow.connectors.cdc.chunks import KeyStats
from splitflow.connectors.cdc.schema import Table
from splitflow.connectors.cdc.splits import ChunkSplit, Cut
from splitflow.connectors.mysql import gtid
from splitflow.connectors.mysql.options import MySqlOptions
from splitflow.connectors.mysql.types import ColumnType, TypeMapping
from splitflow.errors import ConfigurationError, ConnectorError

MySqlTable = Table[ColumnType]
"""A table the source reads: ``db.table``, its columns, primary key and chunk key."""

INTEGER_KEYS = frozenset({"tinyint", "smallint", "mediumint", "int", "bigint"})
SYSTEM_SCHEMAS = ("mysql", "information_schema", "performance_schema", "sys")
BINLOG_SETTINGS = {
    "log_bin": "ON",
    "binlog_format": "ROW",
    "binlog_row_image": "FULL",
    "binlog_row_metadata": "FULL",
}
"""What the server's binlog must be for change data capture (MariaDB 10.5+ names)."""


def connect(options: MySqlOptions, **kwargs: Any) -> Any:
    """A PyMySQL connection (autocommit, session time zone UTC), or a ConnectorError
    naming the server and the reason, never the password."""
    settings = {**options.connection_settings(), "autocommit": True, **kwargs}
    settings.setdefault("init_command", "SET time_zone = '+00:00'")
    try:
        return pymysql.connect(**settings)
    except pymysql.err.MySQLError as e:
        raise connect_failed(options, e) from None


def connect_failed(options: MySqlOptions, error: BaseException) -> ConnectorError:
    reason = " ".join(str(error).split()) or type(error).__name__
    if options.password:
        reason = reason.replace(options.password, "***")
    return ConnectorError(f"cannot connect to MySQL {options.where}: {reason}")


def quoted(table: str) -> str:
    """```db`.`table``` for ``db.table``."""
    return ".".join(quote_name(part) for part in table.split(".", 1))


def quote_name(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def query(conn: Any, sql: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())


def check_binlog(conn: Any, where: str) -> None:
    """The server is MariaDB (10.5 or later) with a row-based binlog of whole rows with
    column names; otherwise a ConnectorError says which setting to change."""
    ((version,),) = query(conn, "SELECT VERSION()")
    if "mariadb" not in str(version).lower():
        raise ConnectorError(
            f"{where} is MySQL {version}: splitflow-mysql-cdc reads MariaDB (10.5 or later), "
            "whose consistent snapshots say where they lie in the binlog "
            "(binlog_snapshot_position); MySQL has no such thing"
        )
    found = dict(
        query(
            conn,
            "SHOW GLOBAL VARIABLES WHERE Variable_name IN "
            "('log_bin', 'binlog_format', 'binlog_row_image', 'binlog_row_metadata')",
        )
    )
    wrong = [
        f"{name}={found.get(name, '(unset)')}"
        for name, wanted in BINLOG_SETTINGS.items()
        if str(found.get(name, "")).upper() != wanted
    ]
    if wrong:
        raise ConnectorError(
            f"MySQL {where} has {', '.join(wrong)}; change data capture needs a row-based "
            "binlog of whole rows with column names: start the server with --log-bin "
            "--binlog-format=ROW --binlog-row-image=FULL --binlog-row-metadata=FULL, or use "
            "startupMode=snapshotOnly"
        )


def binlog_position(conn: Any, where: str) -> int:
    """The log's end: the position after the last transaction in the binlog."""
    ((pos,),) = query(conn, "SELECT @@gtid_binlog_pos")
    return gtid.position_after(pos, where)


def snapshot_position(conn: Any, where: str) -> tuple[tuple[int, int], str, int]:
    """Where a consistent snapshot taken now lies in the binlog: its ``(file, offset)``
    (the file's number), the GTID position there, and the log position after it (every
    transaction before it is visible in the snapshot, none after). Leaves no transaction
    open."""
    try:
        with conn.cursor() as cursor:
            cursor.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
            at = snapshot_offset(cursor)
            cursor.execute("SELECT BINLOG_GTID_POS(%s, %s)", (at[0], at[1]))
            (gtid_pos,) = cursor.fetchone()
    finally:
        conn.rollback()
    offset = binlog_offset(at[0], at[1])
    return offset, str(gtid_pos or ""), gtid.position_after(gtid_pos, where)


def snapshot_offset(cursor: Any) -> tuple[str, int]:
    """``Binlog_snapshot_file`` and ``Binlog_snapshot_position`` of the cursor's consistent
    snapshot transaction."""
    cursor.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
    status = {str(k).lower(): v for k, v in cursor.fetchall()}
    return str(status["binlog_snapshot_file"]), int(status["binlog_snapshot_position"])


def binlog_files(conn: Any) -> set[int]:
    """The numbers (as :func:`binlog_offset` gives them) of the binlog files the server has."""
    return {binlog_offset(str(row[0]), 0)[0] for row in query(conn, "SHOW BINARY LOGS")}


def binlog_offset(file: str, offset: int) -> tuple[int, int]:
    """``binlog.000042``, 1234 as ``(42, 1234)``, which orders as the binlog does."""
    match = re.search(r"(\d+)$", file)
    return (int(match.group(1)) if match else 0), int(offset)


def list_tables(conn: Any, options: MySqlOptions) -> list[str]:
    """The ``db.table`` names the options match, sorted.

    A table that is not InnoDB is a ConfigurationError (a consistent snapshot covers InnoDB
    tables only), and so is a name given without any pattern that matches nothing, or an
    option ``chunkKeyColumn`` naming a table not among them.
    """
    placeholders = ", ".join(["%s"] * len(SYSTEM_SCHEMAS))
    rows = query(
        conn,
        "SELECT TABLE_SCHEMA, TABLE_NAME, ENGINE FROM information_schema.TABLES "
        f"WHERE TABLE_TYPE = 'BASE TABLE' AND TABLE_SCHEMA NOT IN ({placeholders})",
        SYSTEM_SCHEMAS,
    )
    matched = sorted(
        (f"{db}.{name}", engine) for db, name, engine in rows if options.matches(db, name)
    )
    for name, engine in matched:
        if str(engine).lower() != "innodb":
            raise ConfigurationError(
                f"option tableName: table {name} uses the {engine} engine: change data "
                "capture reads InnoDB tables (a consistent snapshot covers only them); "
                "leave it out, or ALTER TABLE ... ENGINE=InnoDB",
                option="tableName",
            )
    names = [name for name, _ in matched]
    literal = re.escape(options.databases) == options.databases and (
        re.escape(options.tables) == options.tables
    )
    if literal and not names:
        raise ConfigurationError(
            f"option tableName: table {options.databases}.{options.tables} does not exist "
            f"in {options.where} (or the user cannot see it)",
            option="tableName",
        )
    for table, _column in options.chunk_keys:
        if table and table not in names:
            raise ConfigurationError(
                f"option chunkKeyColumn: table {table} is not one of the tables the query "
                "reads (options databaseName and tableName)",
                option="chunkKeyColumn",
            )
    return names


def describe_table(conn: Any, table: str, options: MySqlOptions | None = None) -> MySqlTable:
    """Columns, primary key and chunk key of ``db.table``.

    The chunk key is the column option ``chunkKeyColumn`` names for the table, else a
    primary key of one integer column, else none. A named column must exist, be an integer
    column and, in a table with a key, be one of the key's columns; otherwise a
    ConfigurationError names it. A column whose type cannot be read is a ConfigurationError
    naming ``db.table.column``.
    """
    db, name = table.split(".", 1)
    rows = query(
        conn,
        "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, NUMERIC_PRECISION, NUMERIC_SCALE, "
        "CHARACTER_OCTET_LENGTH FROM information_schema.COLUMNS "
        "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
        (db, name),
    )
    if not rows:
        raise ConnectorError(f"table {table} no longer exists in MySQL (or cannot be seen)")
    key_rows = query(
        conn,
        "SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s "
        "AND TABLE_NAME = %s AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX",
        (db, name),
    )
    columns = tuple(
        (
            str(column),
            TypeMapping.for_column(
                table, str(column), str(data_type), str(column_type), precision, scale, octets
            ),
        )
        for column, data_type, column_type, precision, scale, octets in rows
    )
    types = {str(r[0]): str(r[1]).lower() for r in rows}
    key = tuple(str(r[0]) for r in key_rows)
    chunk_key = key[0] if len(key) == 1 and types[key[0]] in INTEGER_KEYS else ""
    named = options.chunk_key(table) if options is not None else None
    explicit = options is not None and (table, named) in options.chunk_keys
    if named is not None and (named in types or explicit):
        where = f"option chunkKeyColumn: column {table}.{named}"
        if named not in types:
            raise ConfigurationError(f"{where} does not exist", option="chunkKeyColumn")
        if types[named] not in INTEGER_KEYS:
            raise ConfigurationError(
                f"{where} is {types[named]}: chunks are cut by an integer column",
                option="chunkKeyColumn",
            )
        if key and named not in key:
            raise ConfigurationError(
                f"{where} is not in the primary key of {table} ({', '.join(key)}): a table "
                "with a key is cut by one of its key columns",
                option="chunkKeyColumn",
            )
        chunk_key = named
    return Table(table, columns, key, chunk_key)


def cut(conn: Any, table: MySqlTable, chunk_size: int) -> Cut:
    """The start of ``table``'s cut into chunks of about ``chunk_size`` rows by its chunk
    key, as the core cuts (:func:`splitflow.connectors.cdc.chunks.start_cut`); without one,
    one chunk."""
    if not table.chunk_key:
        return Cut(table.name)
    key, name = quote_name(table.chunk_key), quoted(table.name)
    ((low, high, values, count),) = query(
        conn, f"SELECT MIN({key}), MAX({key}), COUNT({key}), COUNT(*) FROM {name}"
    )
    stats = KeyStats(
        None if low is None else int(low), None if high is None else int(high), values, count
    )
    return chunks.start_cut(table.name, table.chunk_key, chunk_size, stats)


def key_after(conn: Any, table: str, key: str, at: int, rows: int) -> int | None:
    """The value of ``table``'s column ``key`` ``rows`` rows after the first value ``>= at``
    in key order, None past the end."""
    column = quote_name(key)
    found = query(
        conn,
        f"SELECT {column} FROM {quoted(table)} WHERE {column} >= %s "
        f"ORDER BY {column} LIMIT 1 OFFSET %s",
        (at, rows),
    )
    return int(found[0][0]) if found else None


def chunk_condition(split: ChunkSplit) -> str:
    """The SQL condition that selects ``split``'s rows, empty for a whole table.

    >>> chunk_condition(ChunkSplit("shop.t", 0, "id", None, 100))
    '(`id` < 100 OR `id` IS NULL)'
    """
    return chunks.chunk_condition(split, quote_name)


def row_bytes(conn: Any, tables: Sequence[str]) -> dict[str, int]:
    """Each table's average row size in bytes, from the server's statistics (100 unknown)."""
    sizes = {}
    for table in tables:
        db, name = table.split(".", 1)
        found = query(
            conn,
            "SELECT AVG_ROW_LENGTH FROM information_schema.TABLES "
            "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
            (db, name),
        )
        size = int(found[0][0] or 0) if found else 0
        sizes[table] = size if size > 0 else 100
    return sizes
