"""The core's contract suites against the MySQL/MariaDB CDC source and a real MariaDB: the
bounded snapshot (``startupMode=snapshotOnly``) and the unbounded source (``initial``: the
snapshot, then the binlog). The read-twice check changes the tables between the two reads
of every slice (updates in every chunk, inserts at both ends, deletes), so each pinned
chunk read must rewind the other read's later snapshot to the batch's position."""

from __future__ import annotations

import itertools
import unittest
from typing import Any

import pyarrow as pa
import pytest
from tests.connectors.mysql.test_mysql_cdc_harness import load
from tests.support.mariadb import MariaDB

pytest.importorskip("pymysqlreplication", reason="pip install -e '.[mysql]'")

from splitflow.connectors.mysql.source import MySqlCdcSource
from splitflow.testing.contracts import SourceContract, SourceReaderContract

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:'db' is deprecated:DeprecationWarning"),
]

_names = itertools.count()

Row = tuple[str, Any, Any]


class _CdcData:
    """Per test: ``<prefix>_a`` (ids 1..60, chunks of 10: 6 chunks) and ``<prefix>_b`` (a
    text key: 1 chunk), under a pattern only this test matches."""

    mode = "snapshotOnly"
    db: MariaDB
    prefix: str
    written: list[Row]

    @pytest.fixture(autouse=True)
    def _data(self, mariadb: MariaDB) -> None:
        self.db, self.prefix, self.written = mariadb, f"mc{next(_names)}", []
        table = f"{self.prefix}_a"
        mariadb.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, v VARCHAR(20))")
        with mariadb.connect() as conn, conn.cursor() as cursor:
            cursor.executemany(
                f"INSERT INTO {table} VALUES (%s, %s)", [(i, f"a{i}") for i in range(1, 61)]
            )
        self.written += [(f"splitflow.{table}", i, f"a{i}") for i in range(1, 61)]
        self._text_table(f"{self.prefix}_b", 7)

    def _text_table(self, table: str, count: int) -> list[Row]:
        self.db.execute(f"CREATE TABLE {table} (k VARCHAR(20) PRIMARY KEY, v VARCHAR(20))")
        with self.db.connect() as conn, conn.cursor() as cursor:
            cursor.executemany(
                f"INSERT INTO {table} VALUES (%s, %s)",
                [(f"k{i}", f"b{i}") for i in range(1, count + 1)],
            )
        rows = [(f"splitflow.{table}", f"k{i}", f"b{i}") for i in range(1, count + 1)]
        self.written += rows
        return rows

    def make_source(self) -> MySqlCdcSource:
        return load(
            self.db,
            tableName=f"{self.prefix}_.*",
            startupMode=self.mode,
            chunkSize="10",
            discoveryInterval="1s",
            serverId="8000-8099",
        )

    def expected_records(self) -> list[Any]:
        return list(self.written)

    def change_upstream_between_reads(self) -> None:
        """The application keeps writing: an update in every chunk, an insert at each end,
        a delete, in both tables, each in its own transaction."""
        n = next(_names)
        a, b = f"{self.prefix}_a", f"{self.prefix}_b"
        for statement in (
            f"UPDATE {a} SET v = CONCAT(v, '+') WHERE id % 10 = {n % 10}",
            f"INSERT INTO {a} VALUES ({1000 + n}, 'late'), ({-n}, 'early')",
            f"DELETE FROM {a} WHERE id = {n % 60 + 1}",
            f"UPDATE {b} SET v = CONCAT(v, '+') WHERE k = 'k1'",
            f"INSERT INTO {b} VALUES ('late{n}', 'late')",
            f"DELETE FROM {b} WHERE k = 'k{n % 7 + 1}'",
        ):
            self.db.execute(statement)

    def slice_rows(self, record: Any) -> list[Any]:
        """Every column, the change's metadata (``op``, ``lsn``, ``commit_ts``) included."""
        assert isinstance(record, pa.RecordBatch)
        return list(zip(*record.to_pydict().values(), strict=True))

    def rows(self, record: Any) -> list[Any]:
        assert isinstance(record, pa.RecordBatch)
        data = record.to_pydict()
        assert set(data["op"]) <= {"r"}, "a change where nothing changed"
        keys = [i if i is not None else k for i, k in zip(data["id"], data["k"], strict=True)]
        return list(zip(data["table"], keys, data["v"], strict=True))

    def record_split_id(self, record: Any) -> str:
        table, key, _ = record
        return f"{table}#{(key - 1) // 10}" if isinstance(key, int) else f"{table}#0"


class TestSnapshotOnlyCdcContracts(_CdcData, SourceContract, SourceReaderContract):
    def add_split_upstream(self) -> list[Any]:
        raise unittest.SkipTest("a bounded snapshot lists its tables once")


class TestInitialCdcContracts(_CdcData, SourceContract, SourceReaderContract):
    mode = "initial"

    def add_split_upstream(self) -> list[Any]:
        raise unittest.SkipTest(
            "a table that matches after the binlog started comes through the binlog from "
            "its first change and through its chunk too, so its rows may come twice (an "
            "upsert by key with the highest lsn is exact): test_mysql_cdc_harness.py's "
            "test_a_table_created_after_the_log_started_is_snapshotted_and_followed"
        )
