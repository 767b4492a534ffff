"""The core's contract suites against the PostgreSQL CDC source and a real server: the
bounded snapshot (``startupMode=snapshotOnly``) and the unbounded source (``initial``: the
snapshot, then the log, which has nothing to add while the tables do not change)."""

from __future__ import annotations

import itertools
import unittest
from typing import Any

import pyarrow as pa
import pytest
from tests.support.postgres import Postgres

from splitflow.connectors.postgres import catalog
from splitflow.connectors.postgres.options import PostgresOptions
from splitflow.connectors.postgres.source import PostgresCdcSource
from splitflow.testing.contracts import SourceContract, SourceReaderContract

_names = itertools.count()

Row = tuple[str, Any, Any]


class _CdcData:
    """Per test: ``<prefix>_a`` (ids 1..60, chunks of 10: 6 chunks) and ``<prefix>_b`` (a
    text key: 1 chunk), under a pattern only this test matches."""

    mode = "snapshotOnly"
    pg: Postgres
    prefix: str
    written: list[Row]

    @pytest.fixture(autouse=True)
    def _data(self, postgres: Postgres) -> Any:
        self.pg, self.prefix, self.written = postgres, f"cc{next(_names)}", []
        postgres.execute(f"CREATE TABLE {self.prefix}_a (id int PRIMARY KEY, v text)")
        postgres.execute(
            f"INSERT INTO {self.prefix}_a SELECT g, 'a' || g FROM generate_series(1, 60) g"
        )
        self.written += [(f"public.{self.prefix}_a", i, f"a{i}") for i in range(1, 61)]
        self._text_table(f"{self.prefix}_b", 7)
        yield
        postgres.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (self.prefix,),
        )
        postgres.execute(f"DROP PUBLICATION IF EXISTS {self.prefix}")

    def _text_table(self, table: str, count: int) -> list[Row]:
        self.pg.execute(f"CREATE TABLE {table} (k text PRIMARY KEY, v text)")
        self.pg.execute(
            f"INSERT INTO {table} SELECT 'k' || g, 'b' || g FROM generate_series(1, %s) g",
            (count,),
        )
        rows = [(f"public.{table}", f"k{i}", f"b{i}") for i in range(1, count + 1)]
        self.written += rows
        return rows

    def make_source(self) -> PostgresCdcSource:
        options = PostgresOptions.parse(
            {
                "conninfo": self.pg.conninfo(),
                "tables": f"{self.prefix}_*",
                "startupMode": self.mode,
                "slotName": self.prefix,
                "chunkSize": "10",
                "discoveryInterval": "1s",
            }
        )
        with catalog.connect(options, autocommit=True) as conn:
            names = catalog.list_tables(conn, options)
            tables = [catalog.describe_table(conn, name) for name in names]
        return PostgresCdcSource(options, tables)

    def expected_records(self) -> list[Any]:
        return list(self.written)

    def change_upstream_between_reads(self) -> None:
        """The application keeps writing: an update in every chunk, an insert at each end,
        a delete, in both tables, each in its own transaction."""
        n = next(_names)
        a, b = f"{self.prefix}_a", f"{self.prefix}_b"
        for statement in (
            f"UPDATE {a} SET v = v || '+' WHERE id % 10 = {n % 10}",
            f"INSERT INTO {a} VALUES ({1000 + n}, 'late'), ({-n}, 'early')",
            f"DELETE FROM {a} WHERE id = {n % 60 + 1}",
            f"UPDATE {b} SET v = v || '+' WHERE k = 'k1'",
            f"INSERT INTO {b} VALUES ('late{n}', 'late')",
            f"DELETE FROM {b} WHERE k = 'k{n % 7 + 1}'",
        ):
            self.pg.execute(statement)

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
        return self._text_table(f"{self.prefix}_new", 5)

    def test_new_split_is_discovered_and_read(self) -> None:
        super().test_new_split_is_discovered_and_read()
