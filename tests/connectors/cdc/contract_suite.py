"""The core's contract suites (:mod:`splitflow.testing.contracts`) against a CDC database:
the bounded snapshot (``startupMode=snapshotOnly``) and the unbounded source (``initial``:
the snapshot, then the log, which has nothing to add while the tables do not change). The
read-twice check changes the tables between the two reads of every slice (updates in every
chunk, inserts at both ends, deletes), so every read of a batch must stand where the first
did.

A database's contract module provides the fixture ``database`` (its
:class:`~tests.connectors.cdc.database.DatabaseUnderTest`) and subclasses
:class:`SnapshotOnlyCdcContracts` and :class:`InitialCdcContracts`.
"""

from __future__ import annotations

import itertools
import unittest
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from tests.connectors.cdc.database import AnyCdcSource, DatabaseUnderTest

from splitflow.testing.contracts import SourceContract, SourceReaderContract

_names = itertools.count()

Row = tuple[str, Any, Any]


class CdcContractData:
    """Per test: ``<prefix>_a`` (ids 1..60, chunks of 10: 6 chunks) and ``<prefix>_b`` (a
    text key: 1 chunk), under a pattern only this test matches."""

    mode = "snapshotOnly"
    database: DatabaseUnderTest[Any]
    prefix: str
    written: list[Row]

    @pytest.fixture(autouse=True)
    def _data(self, database: DatabaseUnderTest[Any]) -> Iterator[None]:
        self.database, self.prefix, self.written = database, f"cc{next(_names)}", []
        table = f"{self.prefix}_a"
        database.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, v {database.text})")
        database.insert(table, [(i, f"a{i}") for i in range(1, 61)])
        self.written += [(database.qualified(table), i, f"a{i}") for i in range(1, 61)]
        self._text_table(f"{self.prefix}_b", 7)
        yield
        database.drop_log(self.prefix)

    def _text_table(self, table: str, count: int) -> list[Row]:
        text = self.database.text
        self.database.execute(f"CREATE TABLE {table} (k {text} PRIMARY KEY, v {text})")
        self.database.insert(table, [(f"k{i}", f"b{i}") for i in range(1, count + 1)])
        rows = [(self.database.qualified(table), f"k{i}", f"b{i}") for i in range(1, count + 1)]
        self.written += rows
        return rows

    def make_source(self) -> AnyCdcSource:
        return self.database.source(
            self.database.pattern(f"{self.prefix}_"),
            self.prefix,
            startupMode=self.mode,
            chunkSize="10",
            discoveryInterval="1s",
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
            self.database.execute(statement)

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


class SnapshotOnlyCdcContracts(CdcContractData, SourceContract, SourceReaderContract):
    def add_split_upstream(self) -> list[Any]:
        raise unittest.SkipTest("a bounded snapshot lists its tables once")


class InitialCdcContracts(CdcContractData, SourceContract, SourceReaderContract):
    mode = "initial"

    def add_split_upstream(self) -> list[Any]:
        """A table that matches, created while the source runs."""
        return self._text_table(f"{self.prefix}_new", 5)
