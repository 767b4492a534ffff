"""Options of the MySQL/MariaDB CDC source, validated before a query starts.

The names are Flink CDC's MySQL connector's, in Spark's spelling; Flink's own spelling is
accepted as an alias (in brackets). Spark passes option names lower-cased; any case is
accepted.

* ``hostname`` (localhost), ``port`` (3306): the server.
* ``username`` (required), ``password``: the user needs ``SELECT``, ``RELOAD``,
  ``REPLICATION SLAVE`` and ``BINLOG MONITOR`` (``REPLICATION CLIENT``). The password is
  never shown in offsets, checkpoints, logs or reprs.
* ``databaseName`` (``database-name``), ``tableName`` (``table-name``), both required:
  regular expressions; a table is read when its database matches ``databaseName`` and its
  name (without the database) ``tableName``, each in full, ignoring case.
* ``serverId`` (``server-id``, default ``5400-6399``): the replica server id, or a range
  ``N-M``, of the binlog readers: reader *i* reads the log as ``N + 2i`` and rewinds its
  chunks as ``N + 2i + 1`` (modulo the range), so a streaming query needs at least 2 ids per
  reader, each unique on the server (not the server's own, not a replica's).
* ``startupMode`` (``scan.startup.mode``, default ``initial``): ``initial`` the snapshot,
  then the binlog; ``latest`` (``latest-offset``) the binlog from now on; ``snapshotOnly``
  (``snapshot``) the snapshot, then the stream ends.
* ``chunkSize`` (``scan.incremental.snapshot.chunk.size``, 8096): rows per snapshot chunk.
* ``chunkKeyColumn`` (``scan.incremental.snapshot.chunk.key-column``): the integer column
  chunks are cut by: one name for every table that has it, or ``db.table:column`` entries;
  for a table with a primary key, one of its columns.
* ``maxChunksPerBatch`` (all): at most this many chunks read per micro-batch.
* ``discoveryInterval`` (30s): how often tables that newly match are looked for.
* ``connectTimeout`` (``connect.timeout``, 10s): connection timeout.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from splitflow.api.options import check_names, parse_duration, parse_positive_int
from splitflow.connectors.cdc.chunks import parse_chunk_keys
from splitflow.errors import ConfigurationError

MODES = {
    "initial": "initial",
    "latest": "latest",
    "latest-offset": "latest",
    "snapshotonly": "snapshotOnly",
    "snapshot": "snapshotOnly",
}
ALIASES = {
    "databaseName": "database-name",
    "tableName": "table-name",
    "serverId": "server-id",
    "startupMode": "scan.startup.mode",
    "chunkSize": "scan.incremental.snapshot.chunk.size",
    "chunkKeyColumn": "scan.incremental.snapshot.chunk.key-column",
    "connectTimeout": "connect.timeout",
}
"""Option -> its Flink CDC name, accepted as an alias."""
OPTIONS = (
    "hostname",
    "port",
    "username",
    "password",
    "databaseName",
    "tableName",
    "serverId",
    "startupMode",
    "chunkSize",
    "chunkKeyColumn",
    "maxChunksPerBatch",
    "discoveryInterval",
    "connectTimeout",
    *ALIASES.values(),
)
"""The connector's option names, as documented (any case is accepted)."""
DEFAULT_SERVER_IDS = (5400, 6399)
_MAX_SERVER_ID = 2**32 - 1


@dataclass(frozen=True)
class MySqlOptions:
    """The parsed options. ``repr`` leaves the password out."""

    host: str
    port: int
    user: str
    password: str = field(repr=False)
    databases: str
    tables: str
    server_ids: tuple[int, int] = DEFAULT_SERVER_IDS
    mode: str = "initial"
    chunk_size: int = 8096
    chunk_keys: tuple[tuple[str, str], ...] = ()
    """``chunkKeyColumn`` as ``(db.table, column)`` pairs; table ``""``: every table."""
    chunks_per_batch: int | None = None
    discovery_interval: float = 30.0
    connect_timeout: float = 10.0
    schema_changes: str = "fail"
    """A schema change in the binlog fails the query (``stop`` is PostgreSQL's so far)."""

    @classmethod
    def parse(
        cls,
        options: Mapping[str, str],
        known: Iterable[str] | None = None,
        prefixes: Sequence[str] = (),
    ) -> MySqlOptions:
        """Read the options (any case). ``known``: the other option names the caller
        understands (the runtime's), and ``prefixes`` the other names' beginnings
        (``stateDir.``); an option that is none of these is refused with the nearest known
        name."""
        check_names(options, (*OPTIONS, *(known or ())), "splitflow-mysql-cdc", prefixes)
        lowered = {k.lower(): v for k, v in options.items()}

        def get(name: str) -> str | None:
            alias = ALIASES.get(name)
            value = lowered.get(name.lower())
            if alias is not None and alias.lower() in lowered:
                if value is not None:
                    raise ConfigurationError(
                        f"options {name} and {alias} are the same option: give one",
                        option=name,
                    )
                value = lowered[alias.lower()]
            return value

        user = (get("username") or "").strip()
        if not user:
            raise ConfigurationError("option username is required", option="username")
        databases = _pattern("databaseName", get("databaseName"))
        tables = _pattern("tableName", get("tableName"))
        raw_mode = (get("startupMode") or "initial").strip()
        mode = MODES.get(raw_mode.lower())
        if mode is None:
            raise ConfigurationError(
                "option startupMode must be initial, latest (latest-offset) or snapshotOnly "
                f"(snapshot), not {raw_mode!r}",
                option="startupMode",
            )
        port = get("port")
        return cls(
            host=(get("hostname") or "localhost").strip(),
            port=3306 if port is None else parse_positive_int("port", port),
            user=user,
            password=get("password") or "",
            databases=databases,
            tables=tables,
            server_ids=_server_ids(get("serverId")),
            mode=mode,
            chunk_size=parse_positive_int("chunkSize", get("chunkSize") or "8096"),
            chunk_keys=parse_chunk_keys(get("chunkKeyColumn") or "", "db.table:column", _db_table),
            chunks_per_batch=(
                None
                if get("maxChunksPerBatch") is None
                else parse_positive_int("maxChunksPerBatch", get("maxChunksPerBatch") or "")
            ),
            discovery_interval=parse_duration(
                "discoveryInterval", get("discoveryInterval") or "30s", above_zero=True
            ),
            connect_timeout=parse_duration(
                "connectTimeout", get("connectTimeout") or "10s", above_zero=True
            ),
        )

    @property
    def where(self) -> str:
        """The server as errors name it: ``user@host:port``."""
        return f"{self.user}@{self.host}:{self.port}"

    def connection_settings(self) -> dict[str, Any]:
        """Keyword arguments for ``pymysql.connect`` (a fresh dict each call)."""
        timeout = max(1, round(self.connect_timeout))
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password,
            "charset": "utf8mb4",
            "connect_timeout": timeout,
        }

    def server_id(self, reader_id: int, rewind: bool = False) -> int:
        """The replica server id of reader ``reader_id``'s binlog stream (``rewind``: the
        one that rewinds its chunks), so that no two concurrent streams share one.

        >>> options = MySqlOptions("h", 3306, "u", "p", "db", "t", server_ids=(5400, 5403))
        >>> [options.server_id(r) for r in range(3)], options.server_id(0, rewind=True)
        ([5400, 5402, 5400], 5401)
        """
        low, high = self.server_ids
        size = high - low + 1
        pairs = max(1, size // 2)
        base = low + 2 * (reader_id % pairs)
        return min(high, base + 1) if rewind else base

    def matches(self, database: str, table: str) -> bool:
        """Whether ``database.table`` is one the options read."""
        return bool(
            re.fullmatch(self.databases, database, re.IGNORECASE)
            and re.fullmatch(self.tables, table, re.IGNORECASE)
        )

    def chunk_key(self, table: str) -> str | None:
        """The column option ``chunkKeyColumn`` names for ``db.table`` (None: none)."""
        return next((c for t, c in self.chunk_keys if t in ("", table)), None)


def _pattern(option: str, text: str | None) -> str:
    pattern = (text or "").strip()
    if not pattern:
        raise ConfigurationError(
            f"option {option} is required: a regular expression (Flink CDC's {ALIASES[option]})",
            option=option,
        )
    try:
        re.compile(pattern)
    except re.error as e:
        raise ConfigurationError(
            f"option {option}: {pattern!r} is not a regular expression ({e})", option=option
        ) from None
    return pattern


def _server_ids(text: str | None) -> tuple[int, int]:
    if text is None:
        return DEFAULT_SERVER_IDS
    match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", text)
    low = int(match.group(1)) if match else 0
    high = int(match.group(2) or low) if match else 0
    if not match or not 1 < low <= high <= _MAX_SERVER_ID:
        raise ConfigurationError(
            f"option serverId: {text!r} is not a server id or a range of them (5400, or "
            "5400-5409), above 1 and below 2**32",
            option="serverId",
        )
    return low, high


def _db_table(name: str) -> str | None:
    """``db.table`` as it is, anything else None."""
    return name if name.count(".") == 1 and all(name.split(".")) else None
