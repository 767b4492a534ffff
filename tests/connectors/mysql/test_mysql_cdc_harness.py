"""Exactly-once change data capture through the SourceHarness, against a real MariaDB: the
CDC core's suite (:class:`~tests.connectors.cdc.harness_suite.CdcHarnessSuite`, on
:class:`MariaDbUnderTest`), then what is MariaDB's own: the chunks' positions in the log
split, a table found late (its rows come through the binlog too), a table without a primary
key, a purged binlog.

The harness pins nothing, so each chunk stands at its own snapshot here; the pinned reads
(every read of a batch rewound to one position) are ``test_mysql_cdc_pinning.py``'s.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from tests.connectors.cdc.database import Case, DatabaseUnderTest, make_table, table_now
from tests.connectors.cdc.harness_suite import (
    CdcHarnessSuite,
    Harness,
    Key,
    Phases,
    by_id,
    finish,
    replay,
    rows_with_a_late_table,
    step,
)
from tests.support.cdc import chunks_of
from tests.support.mariadb import MariaDB

pytest.importorskip("pymysqlreplication", reason="pip install -e '.[mysql]'")

from splitflow.connectors.cdc.splits import ChunkSplit, LogSplit
from splitflow.connectors.mysql import catalog, gtid
from splitflow.connectors.mysql.options import MySqlOptions
from splitflow.connectors.mysql.source import MySqlCdcSource
from splitflow.testing.harness import SourceHarness

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:'db' is deprecated:DeprecationWarning"),
]

_server_ids = itertools.count(7000, 10)


def load(db: MariaDB, **options: str) -> MySqlCdcSource:
    """The source as ``MySqlCdcDataSource`` makes it at ``load()``, without Spark."""
    settings = db.connection_settings()
    first_id = next(_server_ids)
    given = {
        "hostname": settings["host"],
        "port": str(settings["port"]),
        "username": settings["user"],
        "password": settings["password"],
        "databaseName": settings["database"],
        "serverId": f"{first_id}-{first_id + 9}",
        **options,
    }
    parsed = MySqlOptions.parse(given)
    with catalog.connect(parsed) as conn:
        names = catalog.list_tables(conn, parsed)
        tables = [catalog.describe_table(conn, name, parsed) for name in names]
        row_bytes = catalog.row_bytes(conn, names)
    return MySqlCdcSource(parsed, tables, row_bytes)


class MariaDbUnderTest(DatabaseUnderTest[MariaDB]):
    """MariaDB for the CDC core's suites: tables in database ``splitflow``, patterns are
    regular expressions, the log is the binlog (positions: GTID sequence numbers), and each
    source reads it with 10 fresh replica ``serverId`` values (or ``server_ids``)."""

    schema = "splitflow"
    text = "VARCHAR(20)"

    def __init__(self, server: MariaDB, server_ids: str | None = None) -> None:
        super().__init__(server)
        self.server_ids = server_ids

    def source(self, tables: str, log: str, **options: str) -> MySqlCdcSource:
        if self.server_ids is not None:
            options.setdefault("serverId", self.server_ids)
        return load(self.server, tableName=tables, **options)

    def pattern(self, prefix: str) -> str:
        return f"{prefix}.*"

    def log_end(self) -> int:
        ((position,),) = self.execute("SELECT @@gtid_binlog_pos")
        return gtid.position_after(position, "the test server")

    def connect(self) -> Any:
        return self.server.connect(autocommit=False)

    @contextmanager
    def transaction(self, conn: Any) -> Iterator[Any]:
        with conn.cursor() as cursor:
            yield cursor
        conn.commit()

    def cut(self, source: Any, table: str, chunk_size: int) -> list[ChunkSplit]:
        with catalog.connect(source.options) as conn:
            return chunks_of(catalog, conn, source.tables[table], chunk_size)


@pytest.fixture
def case(mariadb: MariaDB) -> Case[MariaDB]:
    return Case(MariaDbUnderTest(mariadb))


class TestMariaDbCdcHarness(CdcHarnessSuite):
    """The suite on MariaDB."""


# -- the log split ------------------------------------------------------------------------------


def test_the_log_carries_the_position_of_every_chunk_until_it_passes_them(
    case: Case[MariaDB],
) -> None:
    make_table(case.database, case.table, range(1, 3001))
    harness: Harness = SourceHarness(case.source(), 2)
    harness.settle()
    case.server.execute(f"UPDATE {case.table} SET v = v + 1 WHERE id = 1")  # past the log's start
    for _ in range(20):
        held = [s for ss in harness.reader_splits().values() for s in ss]
        logs = [s for s in held if isinstance(s, LogSplit)]
        if logs:
            break
        step(harness, Phases(harness))
    (log,) = logs
    assert [m[0] for m in log.marks] == [f"{case.name}#{i}" for i in range(6)]
    assert all(m[-1] > log.position for m in log.marks)
    harness.read_available()  # the log reads past every chunk's position
    (read,) = [s for ss in harness.reader_splits().values() for s in ss]
    harness.close()
    assert isinstance(read, LogSplit)
    assert read.marks == ()
    assert read.position > log.position


def test_a_table_created_after_the_log_started_is_snapshotted_and_followed(
    case: Case[MariaDB],
) -> None:
    """The log reads every table that matches, so a table created after it started comes
    whole through the log, and through its chunk too (without a watermark): its rows may
    come twice, and an upsert by key that keeps the highest ``lsn`` ends exact."""
    rows = rows_with_a_late_table(case)
    late = [r for r in rows if r["table"] == f"{case.name}_late"]
    assert sorted((r["id"], r["op"]) for r in late) == sorted(
        [(i, "r") for i in range(1, 11)] + [(i, "c") for i in range(1, 11)] + [(3, "u")]
    )
    assert upsert(late, by_id) == table_now(case.database, f"{case.table}_late")
    first = [r for r in rows if r["table"] == case.name]
    assert replay(first, by_id) == table_now(case.database, case.table)


def upsert(rows: list[dict[str, Any]], key: Key) -> dict[Any, Any]:
    """Apply the rows by key in ``lsn`` order: the row with the highest ``lsn`` wins, a
    delete removes. An ``r`` row's ``lsn`` is its chunk's position, which it holds every
    change below: it goes before the changes at that position."""
    state: dict[Any, Any] = {}
    for row in sorted(rows, key=lambda r: (r["lsn"], r["op"] != "r")):
        values = {n: v for n, v in row.items() if n not in ("op", "lsn", "commit_ts", "table")}
        if row["op"] == "d":
            state.pop(key(row), None)
        else:
            state[key(row)] = values
    return state


# -- keys that cannot be cut ----------------------------------------------------------------------


def test_a_table_without_a_primary_key_is_one_chunk_and_a_multiset(case: Case[MariaDB]) -> None:
    db, t = case.database, case.table
    db.execute(f"CREATE TABLE {t} (v INT, w VARCHAR(10))")
    db.insert(t, [(g % 5, "same") for g in range(40)])
    harness: Harness = SourceHarness(case.source(chunk_size=10), 2)
    harness.settle()
    db.execute(f"UPDATE {t} SET w = 'changed' WHERE v = 1 LIMIT 2")
    harness.read_available()
    db.execute(f"DELETE FROM {t} WHERE v = 2 LIMIT 3")
    db.execute(f"INSERT INTO {t} VALUES (9, 'late')")
    rows = finish(harness)
    assert {r["op"] for r in rows} <= {"r", "c", "d"}  # no u: an update is a d and a c
    bag: dict[tuple[Any, ...], int] = {}
    for row in sorted(rows, key=lambda r: (0, 0) if r["op"] == "r" else (1, r["lsn"])):
        item = (row["v"], row["w"])
        bag[item] = bag.get(item, 0) + (-1 if row["op"] == "d" else 1)
        assert bag[item] >= 0, f"{row['op']} of {item} that is not there"
    now: dict[tuple[Any, ...], int] = {}
    for v, w in db.execute(f"SELECT v, w FROM {t}"):
        now[(v, w)] = now.get((v, w), 0) + 1
    assert {k: n for k, n in bag.items() if n} == now


# -- purges -------------------------------------------------------------------------------------


def test_a_log_whose_binlog_was_purged_fails_naming_the_positions(tmp_path: Path) -> None:
    from splitflow.errors import DataLossError, SourceFailedError

    with MariaDB.start(tmp_path) as db:  # a server of its own: its binlog is purged
        case = Case(MariaDbUnderTest(db))
        make_table(case.database, case.table, range(1, 11))
        harness: Harness = SourceHarness(case.source(), 1)
        try:
            harness.read_available()
            (log,) = [s for ss in harness.reader_splits().values() for s in ss]
            db.execute(f"UPDATE {case.table} SET v = 5 WHERE id = 1")  # not read yet
            purge_binlogs(db)
            enumerator: Any = harness.coordinator.enumerator
            with pytest.raises(DataLossError, match=r"purged") as failed:
                enumerator.latest_positions([log])
            assert failed.value.split_id == "log:binlog"
        finally:
            with contextlib.suppress(SourceFailedError):
                harness.close()


def purge_binlogs(db: MariaDB) -> None:
    """Purge every binlog file but a new one (MariaDB keeps a file until InnoDB's
    checkpoint has moved past it: rotate twice, and retry)."""
    for _ in range(50):
        db.execute("FLUSH BINARY LOGS", admin=True)
        files = db.execute("SHOW BINARY LOGS", admin=True)
        db.execute(f"PURGE BINARY LOGS TO '{files[-1][0]}'", admin=True)
        if len(db.execute("SHOW BINARY LOGS", admin=True)) == 1:
            return
        time.sleep(0.1)
    raise AssertionError("the server kept its old binlog files")
