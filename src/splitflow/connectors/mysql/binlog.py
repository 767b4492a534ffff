"""Reading the binlog between two positions with mysql-replication's ``BinLogStreamReader``.

:meth:`BinlogReader.read` streams the transactions whose position (GTID ``seq``,
:mod:`.gtid`) is in ``[start, stop)``, whole, in binlog order, with the row changes of the
tables asked for. It connects as a replica (MariaDB's ``COM_BINLOG_DUMP`` after the GTID
before ``start``), reads blocking with heartbeats, and stops after the last transaction
before ``stop`` without waiting for another: every position below a planned stop is in the
binlog already. The binlog never changes, so reading a slice again gives the same
transactions.

Guards against mysql-replication 1.0.17 (``docs/mysql-cdc-notes.md``):

* it reconnects by itself after a dropped connection, from the *first* GTID, and would
  replay what it read: a second stream connection is refused, and the read fails;
* ``blocking=False`` can lose the end of a MariaDB stream: reads block, and stop at ``stop``;
* it logs its settings, password included, unless ``enable_logging=False``.

Each stream needs a replica server id unique on the server: MariaDB ends the older of two
streams with one id (error 4052).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Generator
from typing import Any, NamedTuple

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import HeartbeatLogEvent, MariadbGtidEvent, QueryEvent, XidEvent
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from splitflow.connectors.mysql import catalog, gtid
from splitflow.connectors.mysql.gtid import Gtid
from splitflow.connectors.mysql.options import MySqlOptions
from splitflow.errors import ConnectorError, DataLossError

HEARTBEAT = 5.0
"""Seconds between the server's heartbeats on an idle stream."""
READ_TIMEOUT = 60
"""Seconds a stream may stay silent (no event, no heartbeat) before the read fails."""
_STANDALONE = 1  # MariaDB GTID flag FL_STANDALONE: a DDL, which its query event ends


class Image(NamedTuple):
    """A row image of a binlog row event: values by column name, and mysql-replication's
    reasons for its None values (``"null"``, ``"empty set"``)."""

    values: dict[str, Any]
    none_sources: dict[str, str]


class Change(NamedTuple):
    """One row change: ``op`` ``c`` (``after`` only), ``u`` (both) or ``d`` (``before``)."""

    table: str
    op: str
    before: Image | None
    after: Image | None


class Transaction(NamedTuple):
    """A committed transaction: its GTID ``seq`` (its position), its start time (seconds
    since the epoch), its row changes to the tables read, in order, and the statements it
    logged as statements (a DDL: ``TRUNCATE``, ``ALTER TABLE``, ...), as
    ``(default database, statement)``."""

    seq: int
    timestamp: int
    changes: list[Change]
    statements: list[tuple[str, str]]


class _StreamConnect:
    """``pymysql_wrapper`` that allows one stream connection per reader: a second one is
    mysql-replication reconnecting after a cut, from its first GTID, which would replay."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.streams = 0

    def __call__(self, **settings: Any) -> Any:
        if settings.get("db") != "information_schema":  # the stream, not the control one
            self.streams += 1
            if self.streams > 1:
                raise ConnectorError(
                    f"the binlog stream from {self.where} was cut mid-read (connection lost "
                    "or timed out): the slice is read again from its start"
                )
        return pymysql.connect(**settings)


class BinlogReader:
    """Reads slices of the binlog of the server ``options`` names, as replica
    ``server_id``, keeping the row changes of the tables ``keep`` says (``db.table``
    names; None: all).

    Called by: one reader thread. Not thread-safe; one stream open at a time.
    """

    def __init__(
        self,
        options: MySqlOptions,
        server_id: int,
        keep: Callable[[str], bool] | None = None,
    ) -> None:
        self._options = options
        self._server_id = server_id
        self._keep = keep
        self._split_id = ""

    def read(
        self,
        start: int,
        stop: int,
        after: Gtid | None = None,
        split_id: str = "",
        tables: Collection[str] | None = None,
    ) -> Generator[Transaction, None, None]:
        """The transactions whose ``seq`` is in ``[start, stop)``, lazily; ``after``: the
        GTID of the transaction before ``start`` when the caller knows it (else it is
        looked up, :func:`~.gtid.candidates`). The stream is open from the first
        transaction taken until the last one, or until the generator is closed.
        ``split_id``: the split read, named by a DataLossError; ``tables``: keep only
        these tables' changes (instead of ``keep``'s)."""
        if stop <= start:
            return
        self._split_id = split_id
        keep = self._keep if tables is None else frozenset(tables).__contains__
        stream = self._open(start, after)
        try:
            yield from self._transactions(stream, start, stop, keep)
        except pymysql.err.OperationalError as e:
            raise self._stream_error(e) from None
        finally:
            stream.close()

    # -- opening a stream ------------------------------------------------------------------

    def _open(self, start: int, after: Gtid | None) -> Any:
        if start <= 1:
            return self._stream(None)  # nothing before: from the first binlog file
        if after is not None:
            return self._stream(after, check=True)
        with catalog.connect(self._options) as conn:
            ((state, strict),) = catalog.query(
                conn, "SELECT @@gtid_binlog_state, @@gtid_strict_mode"
            )
        where = self._options.where
        found = gtid.candidates(state, start - 1, where)
        if not found:
            raise DataLossError(
                f"the binlog of {where} holds no transaction at or after position "
                f"{start - 1} (GTID state {state or 'empty'}): it was reset or purged, and "
                "the changes from there on cannot be read",
                split_id=self._split_id,
            )
        if len(found) > 1 and not strict:
            raise ConnectorError(
                f"cannot resume the binlog of {where} after position {start - 1}: servers "
                f"{', '.join(str(g.server) for g in found)} all wrote GTIDs that high, and "
                "without gtid_strict_mode=ON the server does not say which one wrote it: "
                "set gtid_strict_mode=ON"
            )
        for candidate in found:
            stream = self._stream(candidate, check=True, more=candidate is not found[-1])
            if stream is not None:
                return stream
        raise AssertionError("the last candidate raises")

    def _stream(
        self, after: Gtid | None, check: bool = False, more: bool = False
    ) -> _Stream | None:
        """A stream after ``after``; with ``check``, its first event read (so that the
        server's answer to the GTID is known): None when the server says the GTID is not in
        its binlog and ``more`` candidates remain."""
        settings = {**self._options.connection_settings(), "read_timeout": READ_TIMEOUT}
        reader = BinLogStreamReader(
            settings,
            server_id=self._server_id,
            is_mariadb=True,
            auto_position=None if after is None else str(after),
            blocking=True,
            slave_heartbeat=HEARTBEAT,
            only_events=[
                MariadbGtidEvent,
                XidEvent,
                QueryEvent,
                WriteRowsEvent,
                UpdateRowsEvent,
                DeleteRowsEvent,
                HeartbeatLogEvent,
            ],
            enable_logging=False,
            pymysql_wrapper=_StreamConnect(self._options.where),
        )
        stream = _Stream(reader)
        if not check:
            return stream
        try:
            stream.peek()
        except pymysql.err.OperationalError as e:
            stream.close()
            message = str(e.args[1]) if len(e.args) > 1 else str(e)
            if e.args and e.args[0] == 1236 and "missing the GTID" in message and more:
                return None
            raise self._stream_error(e, after) from None
        except BaseException:
            stream.close()
            raise
        return stream

    def _stream_error(
        self, error: pymysql.err.OperationalError, after: Gtid | None = None
    ) -> Exception:
        code = error.args[0] if error.args else None
        message = " ".join(str(error.args[1] if len(error.args) > 1 else error).split())
        where = self._options.where
        if code == 4052:
            return ConnectorError(
                f"the binlog stream from {where} as server id {self._server_id} was ended by "
                "the server: another client connected with the same server id (option "
                f"serverId must give ids no other replica or reader of the server uses): "
                f"{message}"
            )
        if code == 1236:
            return DataLossError(
                f"cannot read the binlog of {where} after GTID {after}: {message} (binlog "
                "files were purged, or the server's binlog was reset): the changes from there "
                "on cannot be read",
                split_id=self._split_id,
            )
        if code in (1227, 1045, 1044):
            return ConnectorError(
                f"cannot read the binlog of {where}: {message} (the user needs REPLICATION "
                "SLAVE and BINLOG MONITOR)"
            )
        return ConnectorError(f"reading the binlog of {where} failed: {message}")

    # -- transactions ----------------------------------------------------------------------

    def _transactions(
        self, stream: _Stream, start: int, stop: int, keep: Callable[[str], bool] | None
    ) -> Generator[Transaction, None, None]:
        current: Transaction | None = None
        standalone = False
        while True:
            event = stream.next()
            if event is None:  # the stream ended: the server closed it
                raise ConnectorError(
                    f"the binlog stream from {self._options.where} ended before position {stop}"
                )
            if isinstance(event, MariadbGtidEvent):
                seq = int(event.gtid_seq_no)
                if seq >= stop:
                    return
                current = Transaction(seq, int(event.timestamp), [], [])
                standalone = bool(event.flags & _STANDALONE)
                continue
            if current is None or isinstance(event, HeartbeatLogEvent):
                continue
            query = event.query.strip() if isinstance(event, QueryEvent) else ""
            if query and query.upper() not in ("BEGIN", "COMMIT", "ROLLBACK"):
                schema = event.schema.decode() if isinstance(event.schema, bytes) else event.schema
                current.statements.append((str(schema or ""), query))
            ended = isinstance(event, XidEvent) or (
                isinstance(event, QueryEvent)
                and (standalone or query.upper() in ("COMMIT", "ROLLBACK"))
            )
            if ended:
                done, current = current, None
                if done.seq >= start:
                    yield done
                if done.seq >= stop - 1:
                    return
                continue
            if isinstance(event, WriteRowsEvent | UpdateRowsEvent | DeleteRowsEvent):
                table = f"{event.schema}.{event.table}"
                if keep is not None and not keep(table):
                    continue  # rows are decoded lazily: never touched, never decoded
                current.changes.extend(_changes(event, table))


def _changes(event: Any, table: str) -> list[Change]:
    out = []
    for row in event.rows:
        if isinstance(event, WriteRowsEvent):
            out.append(Change(table, "c", None, Image(row["values"], row["none_sources"])))
        elif isinstance(event, DeleteRowsEvent):
            out.append(Change(table, "d", Image(row["values"], row["none_sources"]), None))
        else:
            before = Image(row["before_values"], row["before_none_sources"])
            after = Image(row["after_values"], row["after_none_sources"])
            out.append(Change(table, "u", before, after))
    return out


class _Stream:
    """A ``BinLogStreamReader`` with one event of look-ahead."""

    def __init__(self, reader: Any) -> None:
        self._reader = reader
        self._ahead: list[Any] = []

    def peek(self) -> Any:
        if not self._ahead:
            self._ahead.append(self._reader.fetchone())
        return self._ahead[0]

    def next(self) -> Any:
        if self._ahead:
            return self._ahead.pop()
        return self._reader.fetchone()

    def close(self) -> None:
        self._reader.close()
