"""Rows per second reading a MariaDB table, and its binlog, with the Python drivers.

Not a test and not a dependency: the numbers behind ``docs/mysql-cdc-notes.md``. Run it in
an environment that has the drivers to compare (those missing are skipped)::

    python -m venv /tmp/mysql-bench
    /tmp/mysql-bench/bin/pip install PyMySQL mysql-replication mysqlclient mariadb \\
        connectorx pyarrow          # mysqlclient and mariadb build against libmariadb-dev
    /tmp/mysql-bench/bin/python -m tests.connectors.mysql.read_speed [--rows N] [--rounds R]

It starts a throw-away MariaDB (``tests.support.mariadb``), fills one table of N rows
(``id BIGINT`` primary key, an ``INT``, a ``VARCHAR(20)``, a ``DECIMAL(12,2)``, a
``DATETIME(6)``) from the ``seq_1_to_N`` sequence table in one ``INSERT ... SELECT``, and
reads ``SELECT * FROM t`` whole with each driver, over TCP, R rounds (best and median
printed). Python-object readers build one tuple per row; Arrow readers one table. Then it
decodes the insert's row events with ``BinLogStreamReader`` (the log phase's cost per row).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.mariadb import MariaDB


def _count(cursor: Any) -> int:
    """Read ``SELECT * FROM t`` through ``cursor``, 10,000 rows a fetch; the rows read."""
    cursor.execute("SELECT * FROM t")
    n = 0
    while batch := cursor.fetchmany(10_000):
        n += len(batch)
    return n


def _login(db: MariaDB) -> dict[str, Any]:
    """What a DB-API driver's ``connect`` needs to reach ``db`` as the tests' user."""
    settings = db.connection_settings()
    return {k: settings[k] for k in ("host", "port", "user", "password", "database")}


def _rows_pymysql(db: MariaDB, streaming: bool) -> int:
    import pymysql.cursors

    cursorclass = pymysql.cursors.SSCursor if streaming else pymysql.cursors.Cursor
    with db.connect(cursorclass=cursorclass) as conn, conn.cursor() as cur:
        return _count(cur)


def _rows_mysqlclient(db: MariaDB, streaming: bool) -> int:
    import MySQLdb
    import MySQLdb.cursors

    cursorclass = MySQLdb.cursors.SSCursor if streaming else MySQLdb.cursors.Cursor
    conn = MySQLdb.connect(**_login(db), charset="utf8mb4", cursorclass=cursorclass)
    try:
        return _count(conn.cursor())
    finally:
        conn.close()


def _rows_mariadb(db: MariaDB, streaming: bool) -> int:
    import mariadb

    conn = mariadb.connect(**_login(db))
    try:
        return _count(conn.cursor(buffered=not streaming))
    finally:
        conn.close()


def _rows_connectorx(db: MariaDB, partitions: int) -> int:
    import connectorx

    if partitions == 1:
        table = connectorx.read_sql(db.url(), "SELECT * FROM t", return_type="arrow")
    else:
        table = connectorx.read_sql(
            db.url(),
            "SELECT * FROM t",
            return_type="arrow",
            partition_on="id",
            partition_num=partitions,
        )
    return int(table.num_rows)


def _rows_binlog(db: MariaDB, start_gtid: str, rows: int) -> int:
    """Decode the insert's row events. The reader blocks and stops after ``rows`` rows: with
    ``blocking=False`` mysql-replication 1.0.17 loses the end of a MariaDB stream."""
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import WriteRowsEvent

    reader = BinLogStreamReader(
        connection_settings=db.connection_settings(database=None),
        server_id=900,
        is_mariadb=True,
        auto_position=start_gtid,
        blocking=True,
        only_events=[WriteRowsEvent],
        only_tables=["t"],
        enable_logging=False,
    )
    n = 0
    try:
        for event in reader:
            n += len(event.rows)
            if n >= rows:
                break
        return n
    finally:
        reader.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="100,000 rows, one round")
    args = parser.parse_args()
    rows, rounds = (100_000, 1) if args.quick else (args.rows, args.rounds)

    readers: dict[str, Callable[[MariaDB], int]] = {}
    if importlib.util.find_spec("pymysql"):
        readers["PyMySQL Cursor"] = lambda db: _rows_pymysql(db, streaming=False)
        readers["PyMySQL SSCursor"] = lambda db: _rows_pymysql(db, streaming=True)
    if importlib.util.find_spec("MySQLdb"):
        readers["mysqlclient Cursor"] = lambda db: _rows_mysqlclient(db, streaming=False)
        readers["mysqlclient SSCursor"] = lambda db: _rows_mysqlclient(db, streaming=True)
    if importlib.util.find_spec("mariadb"):
        readers["mariadb (Connector/C) buffered"] = lambda db: _rows_mariadb(db, False)
        readers["mariadb (Connector/C) unbuffered"] = lambda db: _rows_mariadb(db, True)
    if importlib.util.find_spec("connectorx"):
        readers["connectorx -> Arrow, 1 conn"] = lambda db: _rows_connectorx(db, 1)
        readers["connectorx -> Arrow, 2 partitions"] = lambda db: _rows_connectorx(db, 2)

    with MariaDB.start(Path(tempfile.mkdtemp(prefix="splitflow-mysql-bench-"))) as db:
        db.execute(
            "CREATE TABLE t (id BIGINT PRIMARY KEY, n INT NOT NULL, name VARCHAR(20) NOT NULL,"
            " amount DECIMAL(12,2) NOT NULL, at DATETIME(6) NOT NULL)"
        )
        start_gtid = db.execute("SELECT @@gtid_binlog_pos")[0][0]
        t0 = time.perf_counter()
        db.execute(
            f"INSERT INTO t SELECT seq, seq % 1000, CONCAT('name-', seq), seq / 100,"
            f" TIMESTAMP'2026-01-01 00:00:00' + INTERVAL seq SECOND FROM seq_1_to_{rows}"
        )
        fill = time.perf_counter() - t0
        binlog = db.execute("SHOW BINARY LOGS")
        print(f"{rows:,} rows filled in {fill:.1f} s; binlog: {binlog}")
        db.execute("ANALYZE TABLE t")

        results: dict[str, list[float]] = {name: [] for name in readers}
        for _ in range(rounds):  # alternate, so noise hits every reader
            for name, read in readers.items():
                t0 = time.perf_counter()
                n = read(db)
                results[name].append(time.perf_counter() - t0)
                assert n == rows, f"{name} read {n} rows, not {rows}"
        for name, times in results.items():
            best, median = min(times), statistics.median(times)
            print(f"{name:36} best {rows / best:>12,.0f} rows/s  median {rows / median:>12,.0f}")

        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            n = _rows_binlog(db, start_gtid, rows)
            times.append(time.perf_counter() - t0)
            assert n == rows, f"the binlog held {n} rows, not {rows}"
        best = min(times)
        print(f"{'BinLogStreamReader (row events)':36} best {rows / best:>12,.0f} rows/s")

        file, position = db.execute("SHOW MASTER STATUS")[0][:2]
        t0 = time.perf_counter()
        gtid = db.execute("SELECT BINLOG_GTID_POS(%s, %s)", (file, position))[0][0]
        took = time.perf_counter() - t0
        print(f"BINLOG_GTID_POS({file}, {position}) = {gtid} in {took * 1000:.1f} ms")


if __name__ == "__main__":
    main()
