"""What the MySQL/MariaDB CDC connector will rely on, checked against a real MariaDB.

The server is ``tests/support/mariadb.py``'s (row binlog, full row images and metadata,
GTID strict mode); the log is read with ``mysql-replication``'s ``BinLogStreamReader`` as
the ``splitflow`` user, which has only the CDC privileges outside its own database. Each
test is one fact (``docs/mysql-cdc-notes.md`` explains them):

* row events name their columns and carry whole before and after images;
* every transaction has a GTID ``0-1-N`` whose ``N`` grows by one per binlogged transaction;
* a reader started at a GTID position yields exactly the transactions after it (and one
  started at a file and position does too, but only with ``is_mariadb=False``);
* ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` reports the binlog position of its
  snapshot, exact even under concurrent commits, and ``BINLOG_GTID_POS`` turns it into a GTID;
* readers with distinct ``server_id`` read side by side; a second one with the same id
  disconnects the first.

Readers here block (``blocking=True``) and stop at a known GTID: with ``blocking=False``
mysql-replication 1.0.17 loses the end of a MariaDB stream (see the last test).
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

import pytest
from tests.support.mariadb import MariaDB

pymysql = pytest.importorskip("pymysql", reason="pip install -e '.[mysql]'")
pytest.importorskip("pymysqlreplication", reason="pip install -e '.[mysql]'")

from pymysqlreplication import BinLogStreamReader  # noqa: E402
from pymysqlreplication.event import (  # noqa: E402
    MariadbGtidEvent,
    QueryEvent,
    XidEvent,
)
from pymysqlreplication.row_event import (  # noqa: E402
    DeleteRowsEvent,
    TableMapEvent,
    UpdateRowsEvent,
    WriteRowsEvent,
)

pytestmark = [
    pytest.mark.slow,  # a real server: ~0.7 s to start, ~2 s for the module
    # BinLogStreamReader opens its control connection with pymysql's deprecated ``db=``.
    pytest.mark.filterwarnings("ignore:'db' is deprecated:DeprecationWarning"),
]

#: The events the tests read: a transaction is a GTID event, row events, and its end.
EVENTS = [MariadbGtidEvent, WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, XidEvent, QueryEvent]
FL_STANDALONE = 1  # a MariaDB GTID event flag: a DDL statement, no XID/COMMIT follows
ER_SLAVE_SAME_ID = 4052  # "A slave with the same server_uuid/server_id is already connected"


# -- helpers ---------------------------------------------------------------------------------


def gtid_seq(position: str, domain: int = 0) -> int:
    """The sequence number of ``domain`` in a MariaDB GTID position, 0 if it has none.

    A position holds the last GTID of each replication domain, ``domain-server-seq``
    joined by commas: ``gtid_seq("0-1-42,7-3-5") == 42``. In ``gtid_strict_mode`` a
    domain's sequence numbers only grow, whichever server wrote them, so with one domain
    the position is one integer.
    """
    for gtid in filter(None, position.split(",")):
        d, _server, seq = gtid.strip().split("-")
        if int(d) == domain:
            return int(seq)
    return 0


@dataclass
class Transaction:
    gtid: str
    seq: int
    server_id: int
    changes: list[tuple[str, str, list[dict[str, Any]]]] = field(default_factory=list)
    end: tuple[str, int] | None = None  # binlog file and position just after its commit

    def rows(self, kind: str | None = None) -> list[dict[str, Any]]:
        return [row for k, _, rows in self.changes if kind in (None, k) for row in rows]


class _NoReconnect:
    """A ``pymysql_wrapper`` that fails the test if the reader reconnects: on a lost
    connection BinLogStreamReader silently reconnects from its *start* position."""

    def __init__(self, db: MariaDB) -> None:
        self.db = db
        self.reader: BinLogStreamReader | None = None
        self.connections = 0
        self.started = time.monotonic()

    def __call__(self, **kwargs: Any) -> Any:
        self.connections += 1  # one control connection, one stream connection
        if self.connections > 2:
            self._refuse(time.monotonic() - self.started)
        return pymysql.connect(**kwargs)

    def _refuse(self, elapsed: float) -> None:  # not in __call__: pytest prints its kwargs
        where = (self.reader.log_file, self.reader.log_pos) if self.reader else None
        server = self.db.execute("SHOW MASTER STATUS")[0][:2]
        dumps = [r[:8] for r in self.db.execute("SHOW PROCESSLIST") if r[4] == "Binlog Dump"]
        raise AssertionError(
            f"BinLogStreamReader lost its stream {elapsed:.1f} s after it started and"
            f" reconnected (it would replay the log). The reader was at {where}, the binlog"
            f" ends at {server}; dump threads: {dumps}"
        )


def open_reader(db: MariaDB, server_id: int, **kwargs: Any) -> BinLogStreamReader:
    """A blocking reader as ``splitflow`` (``kwargs``: the start position). No heartbeat:
    a reader waiting for a transaction that never comes fails after ``read_timeout``."""
    settings = db.connection_settings(database=None)
    settings["read_timeout"] = 20  # a reader that hangs fails instead of waiting forever
    kwargs.setdefault("is_mariadb", True)
    kwargs.setdefault("only_events", EVENTS)
    wrapper = _NoReconnect(db)
    wrapper.reader = BinLogStreamReader(
        connection_settings=settings,
        server_id=server_id,
        blocking=True,
        pymysql_wrapper=wrapper,
        enable_logging=False,
        **kwargs,
    )
    return wrapper.reader


def next_transaction(reader: BinLogStreamReader) -> Transaction:
    """Read one whole transaction (blocks until it is committed)."""
    current: Transaction | None = None
    standalone = False
    for event in reader:
        if isinstance(event, MariadbGtidEvent):
            current = Transaction(event.gtid, event.gtid_seq_no, event.server_id)
            standalone = bool(event.flags & FL_STANDALONE)
            continue
        if current is None:
            continue  # the tail of a transaction the position started inside
        if isinstance(event, WriteRowsEvent | UpdateRowsEvent | DeleteRowsEvent):
            kind = {WriteRowsEvent: "c", UpdateRowsEvent: "u", DeleteRowsEvent: "d"}
            current.changes.append((kind[type(event)], event.table, event.rows))
        elif isinstance(event, XidEvent) or (
            isinstance(event, QueryEvent) and (standalone or event.query == "COMMIT")
        ):
            current.end = (reader.log_file, reader.log_pos)
            return current
    raise AssertionError("the log ended inside a transaction")


def read_until(reader: BinLogStreamReader, last_seq: int) -> list[Transaction]:
    """Every transaction up to and including the one with sequence number ``last_seq``."""
    transactions: list[Transaction] = []
    while not transactions or transactions[-1].seq < last_seq:
        transactions.append(next_transaction(reader))
    return transactions


def read_log(db: MariaDB, start: str, last_seq: int, server_id: int = 100) -> list[Transaction]:
    """The transactions after position ``start`` up to sequence number ``last_seq``."""
    if last_seq <= gtid_seq(start):
        return []  # a blocking reader would wait for a transaction that never comes
    reader = open_reader(db, server_id, auto_position=start)
    try:
        return read_until(reader, last_seq)
    finally:
        reader.close()


def previous(gtid: str) -> str:
    """The position just before transaction ``gtid`` (``0-1-7`` -> ``0-1-6``)."""
    domain, server, seq = gtid.split("-")
    return f"{domain}-{server}-{int(seq) - 1}"


def binlog_pos(db: MariaDB) -> str:
    return str(db.execute("SELECT @@gtid_binlog_pos")[0][0])


def commit(conn: Any, *statements: str) -> str:
    """Run ``statements`` in one transaction; return its GTID (the session's
    ``@@last_gtid``)."""
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        for statement in statements:
            cur.execute(statement)
        cur.execute("COMMIT")
        cur.execute("SELECT @@last_gtid")
        return str(cur.fetchone()[0])


@pytest.fixture
def conn(mariadb: MariaDB) -> Iterator[Any]:
    with mariadb.connect() as connection:
        yield connection


# -- the server ------------------------------------------------------------------------------


def test_server_writes_a_row_binlog_with_full_images_and_metadata(mariadb: MariaDB) -> None:
    (row,) = mariadb.execute(
        "SELECT @@log_bin, @@binlog_format, @@binlog_row_image, @@binlog_row_metadata,"
        " @@gtid_strict_mode, @@gtid_domain_id, @@server_id, @@binlog_checksum"
    )
    assert row == (1, "ROW", "FULL", "FULL", 1, 0, 1, "CRC32")


# -- a. row events ---------------------------------------------------------------------------


def test_row_events_carry_column_names_and_full_before_and_after_images(
    mariadb: MariaDB, conn: Any
) -> None:
    mariadb.execute(
        "CREATE TABLE row_images (id INT PRIMARY KEY, name VARCHAR(20), amount DECIMAL(12,2),"
        " at DATETIME(6), doc JSON, note TEXT)"
    )
    start = binlog_pos(mariadb)
    at = datetime(2026, 1, 2, 3, 4, 5, 123456)
    commit(
        conn,
        "INSERT INTO row_images VALUES (1, 'a', 1.50, '2026-01-02 03:04:05.123456',"
        " '{\"k\": 1}', NULL), (2, 'b\U0001f642', 2.25, NULL, NULL, 'x')",
    )
    commit(conn, "UPDATE row_images SET name = 'bb' WHERE id = 2")
    last = commit(conn, "DELETE FROM row_images WHERE id = 1")

    inserted, updated, deleted = read_log(mariadb, start, gtid_seq(last))
    one = {"id": 1, "name": "a", "amount": Decimal("1.50"), "at": at, "doc": '{"k": 1}'}
    one["note"] = None
    two = {"id": 2, "name": "b\U0001f642", "amount": Decimal("2.25"), "at": None}
    two |= {"doc": None, "note": "x"}
    assert [r["values"] for r in inserted.rows("c")] == [one, two]
    assert updated.rows("u") == [
        {
            "before_values": two,
            "before_none_sources": {"at": "null", "doc": "null"},
            "after_values": two | {"name": "bb"},
            "after_none_sources": {"at": "null", "doc": "null"},
        }
    ]
    assert [r["values"] for r in deleted.rows("d")] == [one]
    assert {table for t in (inserted, updated, deleted) for _, table, _ in t.changes} == {
        "row_images"
    }


def test_row_events_name_the_primary_key_in_column_order(mariadb: MariaDB, conn: Any) -> None:
    """``primary_key`` is a name, a tuple of names in the table's column order (not the
    key's), or ``""``; the table map's metadata has the key's column indexes in key order."""
    mariadb.execute("CREATE TABLE keyed (a INT, b VARCHAR(5), v INT, PRIMARY KEY (b, a))")
    mariadb.execute("CREATE TABLE keyed_one (id INT PRIMARY KEY)")
    mariadb.execute("CREATE TABLE keyless (v INT)")
    start = binlog_pos(mariadb)
    commit(conn, "INSERT INTO keyed VALUES (1, 'x', 0)")
    commit(conn, "INSERT INTO keyed_one VALUES (1)")
    commit(conn, "INSERT INTO keyless VALUES (1)")
    reader = open_reader(
        mariadb, 101, auto_position=start, only_events=[TableMapEvent, WriteRowsEvent]
    )
    keys: dict[str, Any] = {}
    key_indexes: dict[str, list[int]] = {}
    try:
        for event in reader:
            if isinstance(event, TableMapEvent):
                key_indexes[event.table] = event.optional_metadata.simple_primary_key_list
            else:
                keys[event.table] = event.primary_key
                if event.table == "keyless":
                    break
    finally:
        reader.close()
    assert keys == {"keyed": ("a", "b"), "keyed_one": "id", "keyless": ""}
    assert key_indexes == {"keyed": [1, 0], "keyed_one": [0], "keyless": []}


# -- b. GTIDs --------------------------------------------------------------------------------


def test_every_transaction_has_a_gtid_and_seq_grows_by_one(mariadb: MariaDB, conn: Any) -> None:
    mariadb.execute("CREATE TABLE gtids (id INT PRIMARY KEY, v INT)")
    start = binlog_pos(mariadb)
    gtids = [
        commit(conn, "INSERT INTO gtids VALUES (1, 0)"),
        commit(conn, "INSERT INTO gtids VALUES (2, 0)", "UPDATE gtids SET v = 1"),
    ]
    with conn.cursor() as cur:  # a rolled-back transaction is not binlogged: no GTID
        cur.execute("BEGIN")
        cur.execute("INSERT INTO gtids VALUES (3, 0)")
        cur.execute("ROLLBACK")
        cur.execute("CREATE INDEX gtids_v ON gtids (v)")  # DDL: a transaction of its own
        cur.execute("SELECT @@last_gtid")
        gtids.append(cur.fetchone()[0])
    gtids.append(commit(conn, "DELETE FROM gtids WHERE id = 1"))

    seq = gtid_seq(start)
    assert gtids == [f"0-1-{seq + n}" for n in range(1, 5)]
    transactions = read_log(mariadb, start, gtid_seq(gtids[-1]))
    assert [t.gtid for t in transactions] == gtids
    assert [(t.seq, t.server_id) for t in transactions] == [(seq + n, 1) for n in range(1, 5)]
    # The server's positions: the last GTID per domain; both are the same on a primary.
    (binlog, current) = mariadb.execute("SELECT @@gtid_binlog_pos, @@gtid_current_pos")[0]
    assert binlog == current == gtids[-1]
    assert gtid_seq(binlog) == seq + 4


def test_gtid_position_maps_to_one_integer_per_domain() -> None:
    assert gtid_seq("") == 0
    assert gtid_seq("0-1-42") == 42
    assert gtid_seq("1-2-7,0-3-42") == 42
    assert gtid_seq("1-2-7,0-3-42", domain=1) == 7


# -- c. resuming -----------------------------------------------------------------------------


def test_reader_resumed_from_a_gtid_yields_exactly_the_later_transactions(
    mariadb: MariaDB, conn: Any
) -> None:
    mariadb.execute("CREATE TABLE resume (id INT PRIMARY KEY)")
    gtids = [commit(conn, f"INSERT INTO resume VALUES ({i})") for i in range(6)]
    later = read_log(mariadb, gtids[2], gtid_seq(gtids[-1]))
    assert [t.gtid for t in later] == gtids[3:]
    assert [t.rows("c") for t in later] == [
        [{"values": {"id": i}, "none_sources": {}}] for i in (3, 4, 5)
    ]

    # From the newest position: nothing until the next commit, which comes first.
    reader = open_reader(mariadb, 102, auto_position=gtids[-1])
    try:
        after = commit(conn, "INSERT INTO resume VALUES (6)")
        assert next_transaction(reader).gtid == after
    finally:
        reader.close()


def test_reader_resumed_from_a_file_and_position_needs_is_mariadb_false(
    mariadb: MariaDB, conn: Any
) -> None:
    mariadb.execute("CREATE TABLE resume_file (id INT PRIMARY KEY)")
    first = commit(conn, "INSERT INTO resume_file VALUES (1)")
    file, position = mariadb.execute("SHOW MASTER STATUS")[0][:2]
    second = commit(conn, "INSERT INTO resume_file VALUES (2)")

    # The classic COM_BINLOG_DUMP; MariaDB still sends its GTID events.
    reader = open_reader(
        mariadb, 103, is_mariadb=False, log_file=file, log_pos=position, resume_stream=True
    )
    try:
        resumed = next_transaction(reader)
    finally:
        reader.close()
    assert resumed.gtid == second
    assert resumed.rows("c") == [{"values": {"id": 2}, "none_sources": {}}]

    # With is_mariadb=True (and no auto_position) log_file/log_pos are ignored: the reader
    # starts at the first binlog file, before the position asked for.
    reader = open_reader(mariadb, 104, log_file=file, log_pos=position, resume_stream=True)
    try:
        earliest = next_transaction(reader)
    finally:
        reader.close()
    assert earliest.seq < gtid_seq(first)


# -- d. the binlog position of a snapshot ----------------------------------------------------


def snapshot_status(cur: Any) -> tuple[str, int]:
    cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
    status = {name.lower(): value for name, value in cur.fetchall()}
    return status["binlog_snapshot_file"], int(status["binlog_snapshot_position"])


def test_consistent_snapshot_reports_the_binlog_position_of_its_snapshot(
    mariadb: MariaDB, conn: Any
) -> None:
    mariadb.execute("CREATE TABLE snap (id INT PRIMARY KEY)")
    before = commit(conn, "INSERT INTO snap VALUES (1)")
    with mariadb.connect() as reader, reader.cursor() as cur:
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        file, position = snapshot_status(cur)
        after = commit(conn, "INSERT INTO snap VALUES (2)")

        assert snapshot_status(cur) == (file, position)  # fixed for the transaction
        cur.execute("SELECT id FROM snap")
        assert cur.fetchall() == ((1,),)
        # No GTID form of the status; BINLOG_GTID_POS maps the position to one (it must be
        # an event boundary: any other offset gives NULL).
        cur.execute(
            "SELECT BINLOG_GTID_POS(%s, %s), BINLOG_GTID_POS(%s, %s)",
            (file, position, file, position + 1),
        )
        assert cur.fetchone() == (before, None)
        # @@gtid_binlog_pos is the server's, not the snapshot's: it has moved on.
        cur.execute("SELECT @@gtid_binlog_pos")
        assert cur.fetchone() == (after,)
        cur.execute("COMMIT")
        assert snapshot_status(cur) > (file, position)  # outside one: the current position

    # The position is the end of the last transaction in the snapshot.
    (tx,) = read_log(mariadb, previous(before), gtid_seq(before))
    assert tx.gtid == before
    assert tx.end == (file, position)


def test_consistent_snapshot_position_is_exact_under_concurrent_commits(
    mariadb: MariaDB,
) -> None:
    """Writers commit one row per transaction as fast as they can while snapshots are
    taken; every snapshot sees exactly the rows whose commits lie before its position."""
    mariadb.execute("CREATE TABLE snap_race (id INT PRIMARY KEY, writer INT)")
    start = binlog_pos(mariadb)
    stop = threading.Event()
    writing = threading.Semaphore(0)  # released once by each writer after its first commit
    errors: list[BaseException] = []

    def write(writer: int) -> None:
        try:
            with mariadb.connect() as w, w.cursor() as cur:
                n = 0
                while not stop.is_set():
                    n += 1
                    cur.execute(
                        "INSERT INTO snap_race VALUES (%s, %s)", (writer * 10**6 + n, writer)
                    )
                    if n == 1:
                        writing.release()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
            writing.release()

    writers = [threading.Thread(target=write, args=(i,), daemon=True) for i in (1, 2)]
    for thread in writers:
        thread.start()
    snapshots: list[tuple[tuple[str, int], str, set[int]]] = []
    try:
        for _ in writers:  # snapshots start once both writers are committing
            assert writing.acquire(timeout=30)
        with mariadb.connect() as reader, reader.cursor() as cur:
            for _ in range(50):
                cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
                file, position = snapshot_status(cur)
                cur.execute("SELECT id FROM snap_race")
                visible = {row[0] for row in cur.fetchall()}
                cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (file, position))
                gtid = cur.fetchone()[0]
                cur.execute("COMMIT")
                snapshots.append(((file, position), gtid, visible))
    finally:
        stop.set()
        for thread in writers:
            thread.join(30)
    assert not errors
    assert len({len(visible) for _, _, visible in snapshots}) > 10  # the writers kept going
    log = read_log(mariadb, start, gtid_seq(binlog_pos(mariadb)))
    committed = [(t.end, t.seq, t.rows("c")[0]["values"]["id"]) for t in log]
    for position, gtid, visible in snapshots:
        assert visible == {id_ for end, _, id_ in committed if end <= position}
        assert visible == {id_ for _, seq, id_ in committed if seq <= gtid_seq(gtid)}


def test_snapshots_cannot_be_shared_between_sessions(mariadb: MariaDB) -> None:
    """MariaDB has no ``pg_export_snapshot``: each chunk reader takes its own snapshot."""
    with pytest.raises(pymysql.err.ProgrammingError):
        mariadb.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT FROM SESSION 1")


# -- e. several readers ----------------------------------------------------------------------


def test_readers_with_distinct_server_ids_read_side_by_side(mariadb: MariaDB, conn: Any) -> None:
    mariadb.execute("CREATE TABLE side (id INT PRIMARY KEY)")
    start = binlog_pos(mariadb)
    first = commit(conn, "INSERT INTO side VALUES (1)")
    a = open_reader(mariadb, 111, auto_position=start)
    b = open_reader(mariadb, 112, auto_position=start)
    try:
        assert next_transaction(a).gtid == first
        assert next_transaction(b).gtid == first
        dumps = [r for r in mariadb.execute("SHOW PROCESSLIST") if r[4] == "Binlog Dump"]
        assert len(dumps) >= 2
        second = commit(conn, "INSERT INTO side VALUES (2)")
        assert next_transaction(b).gtid == second
        assert next_transaction(a).gtid == second
    finally:
        a.close()
        b.close()


def test_a_reader_with_the_same_server_id_disconnects_the_first(
    mariadb: MariaDB, conn: Any
) -> None:
    mariadb.execute("CREATE TABLE same_id (id INT PRIMARY KEY)")
    start = binlog_pos(mariadb)
    first = commit(conn, "INSERT INTO same_id VALUES (1)")
    a = open_reader(mariadb, 121, auto_position=start)
    b = open_reader(mariadb, 121, auto_position=start)
    try:
        assert next_transaction(a).gtid == first
        assert next_transaction(b).gtid == first  # registers 121 again
        with pytest.raises(pymysql.err.OperationalError) as failure:
            next_transaction(a)
        assert failure.value.args[0] == ER_SLAVE_SAME_ID
        second = commit(conn, "INSERT INTO same_id VALUES (2)")
        assert next_transaction(b).gtid == second  # the newer one carries on
    finally:
        a.close()
        b.close()


# -- a known bug -----------------------------------------------------------------------------


def test_mariadb_dump_request_declares_one_byte_too_few() -> None:
    """mysql-replication 1.0.17's MariaDB ``COM_BINLOG_DUMP`` says 14 bytes and sends 15.

    The server leaves the last byte unread. With ``blocking=False`` it closes the
    connection at the end of the log, and a close with unread input is a TCP reset, which
    discards what the client has not read yet: the reader gets error 2013 and silently
    reconnects from its start position (a 100,000-row transaction is read again and again).
    Blocking readers are not affected. When this test fails, the library is fixed.
    """
    reader = BinLogStreamReader(connection_settings={}, server_id=1, is_mariadb=True)

    class Cursor:
        def execute(self, *args: Any) -> None:
            pass

        def close(self) -> None:
            pass

    reader._stream_connection = type("Conn", (), {"cursor": lambda self: Cursor()})()
    prelude = reader._BinLogStreamReader__set_mariadb_settings()
    (declared,) = struct.unpack("<i", prelude[:4])
    assert (declared, len(prelude) - 4) == (14, 15)
