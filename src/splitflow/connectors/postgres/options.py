"""Options of the PostgreSQL CDC source, validated before a query starts.

=====================  ============  ==========================================================
option                 default       meaning
=====================  ============  ==========================================================
``host``               localhost     server host (or use ``conninfo``)
``port``               5432          server port
``dbname``             (user)        database
``user``               (libpq)       role; needs REPLICATION and SELECT on the tables (and
                                     CREATE on the database when the publication is missing)
``password``           (none)        never shown in offsets, checkpoints, logs or reprs
``conninfo``           (none)        a libpq connection string; the options above override it
``tables``             (required)    comma-separated ``schema.table`` names; ``*`` and ``?``
                                     match patterns (``public.orders_*``); no schema: ``public``
``startupMode``        initial       ``initial``: snapshot, then the log; ``latest``: the log
                                     from now on; ``snapshotOnly``: the snapshot, bounded
``chunkSize``          8096          rows per snapshot chunk
``chunkKeyColumn``     (none)        the integer column chunks are cut by: one name for every
                                     table that has it, or ``table:column,...``; for a table
                                     with a primary key, one of its key columns
``maxChunksPerBatch``  (all)         at most this many chunks read per micro-batch (smaller
                                     batches: a restart re-reads less)
``slotName``           (required)    logical replication slot of the query (created if
                                     missing); one reading query per slot
``publicationName``    slotName      publication of the tables (created or extended if needed)
``discoveryInterval``  30s           how often tables newly matching ``tables`` are looked for
``connectTimeout``     10s           connection timeout
``schemaChanges``      stop          a table's schema changing in the log: ``stop`` ends the
                                     query after the batches before the change, with the new
                                     schema recorded in ``stateDir`` for the restart;
                                     ``fail`` fails it without recording (no ``stateDir``:
                                     ``fail``)
=====================  ============  ==========================================================
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from splitflow.api.options import check_names, parse_duration, parse_positive_int
from splitflow.connectors.cdc.changes import parse_schema_changes
from splitflow.connectors.cdc.chunks import parse_chunk_keys
from splitflow.errors import ConfigurationError

MODES = {"initial": "initial", "latest": "latest", "snapshotonly": "snapshotOnly"}
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
OPTIONS = (
    "host",
    "port",
    "dbname",
    "user",
    "password",
    "conninfo",
    "tables",
    "startupMode",
    "chunkSize",
    "chunkKeyColumn",
    "maxChunksPerBatch",
    "slotName",
    "publicationName",
    "discoveryInterval",
    "connectTimeout",
    "schemaChanges",
)
"""The connector's option names, as documented (any case is accepted)."""


@dataclass(frozen=True)
class PostgresOptions:
    """The parsed options. ``repr`` leaves the password and the connection string out."""

    conninfo: str = field(repr=False)
    where: str
    tables: tuple[str, ...]
    mode: str = "initial"
    chunk_size: int = 8096
    chunk_keys: tuple[tuple[str, str], ...] = ()
    """``chunkKeyColumn`` as ``(table, column)`` pairs; table ``""``: every table."""
    chunks_per_batch: int | None = None
    slot: str = ""
    publication: str = ""
    discovery_interval: float = 30.0
    schema_changes: str = "stop"

    @classmethod
    def parse(
        cls,
        options: Mapping[str, str],
        known: Iterable[str] | None = None,
        prefixes: Sequence[str] = (),
    ) -> PostgresOptions:
        """Read the options (keys lower-cased, as Spark passes them).

        ``known``: the other option names the caller understands (the runtime's), and
        ``prefixes`` the other names' beginnings (``stateDir.``); an option that is none of
        these is refused with the nearest known name.
        """
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        check_names(options, (*OPTIONS, *(known or ())), "splitflow-postgres-cdc", prefixes)
        get = {k.lower(): v for k, v in options.items()}.get
        base = get("conninfo") or ""
        try:
            parsed = conninfo_to_dict(base)
        except Exception as e:  # psycopg.ProgrammingError: names no secret
            raise ConfigurationError(
                "option conninfo is not a valid libpq connection string", option="conninfo"
            ) from e
        port = get("port")
        if port is not None:
            parse_positive_int("port", port)
        timeout = parse_duration("connectTimeout", get("connecttimeout") or "10s", above_zero=True)
        overrides = {
            name: get(name)
            for name in ("host", "port", "dbname", "user", "password")
            if get(name) is not None
        }
        if "host" not in overrides and "host" not in parsed and "hostaddr" not in parsed:
            overrides["host"] = "localhost"
        conninfo = make_conninfo(base, **overrides, connect_timeout=str(max(1, round(timeout))))
        merged = conninfo_to_dict(conninfo)
        where = (
            f"{merged.get('user', '(default user)')}@{merged.get('host')}:"
            f"{merged.get('port', 5432)}/{merged.get('dbname', '(default db)')}"
        )
        raw_mode = (get("startupmode") or "initial").strip()
        mode = MODES.get(raw_mode.lower())
        if mode is None:
            raise ConfigurationError(
                f"option startupMode must be initial, latest or snapshotOnly, not {raw_mode!r}",
                option="startupMode",
            )
        tables = tuple(_table(t) for t in (get("tables") or "").split(",") if t.strip())
        if not tables:
            raise ConfigurationError(
                "option tables is required: comma-separated schema.table names or patterns",
                option="tables",
            )
        slot = (get("slotname") or "").strip()
        if slot and not _NAME.fullmatch(slot):
            raise ConfigurationError(
                f"option slotName {slot!r}: use lower-case letters, digits and underscores, "
                "at most 63",
                option="slotName",
            )
        publication = (get("publicationname") or slot).strip()
        if publication and not _NAME.fullmatch(publication):
            raise ConfigurationError(
                f"option publicationName {publication!r}: use lower-case letters, digits "
                "and underscores, at most 63",
                option="publicationName",
            )
        return cls(
            conninfo=conninfo,
            where=where,
            tables=tables,
            mode=mode,
            chunk_size=parse_positive_int("chunkSize", get("chunksize") or "8096"),
            chunk_keys=parse_chunk_keys(
                get("chunkkeycolumn") or "",
                "table:column",
                lambda table: _table(table, "chunkKeyColumn"),
            ),
            chunks_per_batch=(
                None
                if get("maxchunksperbatch") is None
                else parse_positive_int("maxChunksPerBatch", get("maxchunksperbatch") or "")
            ),
            slot=slot,
            publication=publication,
            discovery_interval=parse_duration(
                "discoveryInterval", get("discoveryinterval") or "30s", above_zero=True
            ),
            schema_changes=parse_schema_changes(get("schemachanges")),
        )

    def check_streaming(self) -> None:
        """What reading the log needs beyond a snapshot: a slot name (a streaming query with
        ``startupMode`` ``initial`` or ``latest``; ``spark.read`` needs none)."""
        if self.mode != "snapshotOnly" and not self.slot:
            raise ConfigurationError(
                f"option slotName is required with startupMode={self.mode}: the query's "
                "logical replication slot (created if missing)",
                option="slotName",
            )

    def chunk_key(self, table: str) -> str | None:
        """The column option ``chunkKeyColumn`` names for ``schema.table`` (None: none)."""
        return next((c for t, c in self.chunk_keys if t in ("", table)), None)

    def matches(self, table: str) -> bool:
        """Whether ``schema.table`` is one of :attr:`tables` or matches one's pattern."""
        return any(fnmatch.fnmatchcase(table, pattern) for pattern in self.tables)


def _table(text: str, option: str = "tables") -> str:
    name = text.strip()
    if "." not in name:
        name = f"public.{name}"
    if name.count(".") != 1 or not all(name.split(".")):
        raise ConfigurationError(
            f"option {option}: {text.strip()!r} is not a schema.table name or pattern",
            option=option,
        )
    return name
