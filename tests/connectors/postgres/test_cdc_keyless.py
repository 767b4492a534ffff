"""Tables without a primary key, through the SourceHarness against a real PostgreSQL.

Such a table is one chunk, or is cut by option ``chunkKeyColumn`` (the first chunk also
holding the rows whose chunk key is NULL). Its changes carry whole rows, and an update
comes as a delete of the old row and an insert of the new one, so the output is checked as
a multiset: ``r`` and ``c`` add a whole row, ``d`` removes one equal whole row (which must
be there), and at the end the multiset must equal the table. The table is shaped like
pgbench's ``pgbench_history``, with NULLs and duplicate rows.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import tests.connectors.cdc.harness_suite as h
from tests.connectors.cdc.database import (
    Background,
    Case,
    DatabaseUnderTest,
    TransactionWriter,
    table_now,
)
from tests.connectors.postgres.test_cdc_harness import PostgresUnderTest
from tests.support.cdc import chunks_of

from splitflow.connectors.postgres import catalog
from splitflow.connectors.postgres.splits import ChunkSplit, LogSplit
from splitflow.testing.harness import SourceHarness
from splitflow.testing.postgres import Postgres

HISTORY = "(tid int, bid int, aid int, delta int, mtime timestamp, filler char(22))"
COLUMNS = ("tid", "bid", "aid", "delta", "mtime", "filler")
Row = tuple[Any, ...]


@pytest.fixture
def case(postgres: Postgres) -> Iterator[Case[Postgres]]:
    made = Case(PostgresUnderTest(postgres))
    yield made
    made.drop()


def make_history(pg: Postgres, table: str, rows: int, *, full: bool = True) -> None:
    """``rows`` rows with ``aid`` 1..rows, NULL in every 50th, and every 97th row twice."""
    pg.execute(f"CREATE TABLE {table} {HISTORY}")
    pg.execute(
        f"INSERT INTO {table} SELECT g %% 10, g %% 3, "
        "CASE WHEN g %% 50 = 0 THEN NULL ELSE g END, g %% 7 - 3, "
        "timestamp '2024-01-01' + g * interval '1 second', 'f' || g "
        "FROM generate_series(1, %s) g",
        (rows,),
    )
    pg.execute(f"INSERT INTO {table} SELECT * FROM {table} WHERE aid % 97 = 0")
    if full:
        pg.execute(f"ALTER TABLE {table} REPLICA IDENTITY FULL")


def rebuilt(rows: list[dict[str, Any]]) -> Counter[Row]:
    """The multiset the output describes: snapshot rows first, then changes by commit LSN
    (stable: a transaction's changes in their order)."""
    ordered = sorted(rows, key=lambda r: (0, 0) if r["op"] == "r" else (1, r["lsn"]))
    state: Counter[Row] = Counter()
    for row in ordered:
        values = tuple(row[c] for c in COLUMNS)
        if row["op"] in ("r", "c"):
            state[values] += 1
        else:
            assert row["op"] == "d", f"{row['op']} of a table without a key: {values}"
            assert state[values] > 0, f"delete of a row that is not there: {values}"
            state[values] -= 1
    return +state


def history_now(pg: Postgres, table: str) -> Counter[Row]:
    return Counter(tuple(r) for r in pg.execute(f"SELECT {', '.join(COLUMNS)} FROM {table}"))


class HistoryWriter(TransactionWriter):
    """Random inserts (new rows and copies of existing ones), updates (of ``delta``, and of
    ``aid`` to any value, past the known range, or NULL) and deletes, one row each, picked
    by position, with a seeded generator."""

    def __init__(self, database: DatabaseUnderTest[Postgres], table: str, seed: int) -> None:
        super().__init__(database, table, seed)
        self.rows = int(database.execute(f"SELECT count(*) FROM {table}")[0][0])
        self.next = 10_000

    def _aid(self) -> int | None:
        return None if self.rng.random() < 0.15 else self.rng.randrange(1, 2 * self.next)

    def _picked(self) -> str:
        offset = self.rng.randrange(self.rows)
        return f"ctid = (SELECT ctid FROM {self.table} OFFSET {offset} LIMIT 1)"

    def one(self, cursor: Any, inserts_only: bool = False) -> None:
        pick, t = self.rng.random(), self.table
        if inserts_only or pick < 0.4 or self.rows < 10:
            self.next += 1
            cursor.execute(
                f"INSERT INTO {t} VALUES (%s, %s, %s, %s, "
                "timestamp '2024-01-01' + %s * interval '1 second', %s)",
                (self.next % 10, self.next % 3, self._aid(), 1, self.next, f"n{self.next}"),
            )
            self.rows += 1
        elif pick < 0.5:  # a duplicate of a row
            cursor.execute(f"INSERT INTO {t} SELECT * FROM {t} WHERE {self._picked()}")
            self.rows += 1
        elif pick < 0.65:
            cursor.execute(f"UPDATE {t} SET delta = delta + 1 WHERE {self._picked()}")
        elif pick < 0.8:
            cursor.execute(f"UPDATE {t} SET aid = %s WHERE {self._picked()}", (self._aid(),))
        else:
            cursor.execute(f"DELETE FROM {t} WHERE {self._picked()}")
            self.rows -= 1


def _log_running(harness: h.Harness) -> bool:
    return any(isinstance(s, LogSplit) for ss in harness.reader_splits().values() for s in ss)


# -- the plan -------------------------------------------------------------------------------------


def test_a_table_without_a_key_is_one_chunk_without_the_option(case: Case[Postgres]) -> None:
    make_history(case.server, case.table, 300, full=False)
    source = case.source(chunk_size=50, startupMode="snapshotOnly")  # needs no replica identity
    table = source.tables[case.name]
    assert (table.key, table.chunk_key, table.replica_identity) == ((), "", "d")
    with catalog.connect(source.options) as conn:
        assert chunks_of(catalog, conn, table, 50) == [ChunkSplit(case.name, 0)]
    harness = SourceHarness(source, 2)
    harness.run_to_end()
    rows = h.rows_of(harness.committed())
    harness.close()
    assert rebuilt(rows) == history_now(case.server, case.table)


@pytest.mark.parametrize("option", ["aid", "{table}:aid", "public.{table}:aid"])
def test_chunk_key_column_cuts_a_keyless_table_and_the_first_chunk_takes_the_nulls(
    case: Case[Postgres], option: str
) -> None:
    make_history(case.server, case.table, 3000, full=False)
    source = case.source(
        chunk_size=500, startupMode="snapshotOnly", chunkKeyColumn=option.format(table=case.table)
    )
    table = source.tables[case.name]
    assert table.chunk_key == "aid"
    with catalog.connect(source.options) as conn:
        chunks = chunks_of(catalog, conn, table, 500)
    # 2970 values over 1..2999 (60 NULLs, 30 duplicates): steps of ceil(500 * 2999 / 2970)
    edges = [None, 506, 1011, 1516, 2021, 2526, None]
    assert [(c.key, c.lo, c.hi) for c in chunks] == [
        ("aid", lo, hi) for lo, hi in itertools.pairwise(edges)
    ]
    assert catalog.chunk_condition(chunks[0]) == '("aid" < 506 OR "aid" IS NULL)'
    harness = SourceHarness(source, 2)
    harness.run_to_end()
    rows = h.rows_of(harness.committed())
    harness.close()
    assert rebuilt(rows) == history_now(case.server, case.table)
    assert sum(r["aid"] is None for r in rows) == 60


def test_a_chunk_key_that_is_all_null_is_one_chunk(case: Case[Postgres]) -> None:
    make_history(case.server, case.table, 200, full=False)
    case.server.execute(f"UPDATE {case.table} SET aid = NULL")
    source = case.source(chunk_size=50, startupMode="snapshotOnly", chunkKeyColumn="aid")
    with catalog.connect(source.options) as conn:
        chunks = chunks_of(catalog, conn, source.tables[case.name], 50)
    assert chunks == [ChunkSplit(case.name, 0, "aid")]
    harness = SourceHarness(source, 1)
    harness.run_to_end()
    rows = h.rows_of(harness.committed())
    harness.close()
    assert rebuilt(rows) == history_now(case.server, case.table)


# -- exactly once ---------------------------------------------------------------------------------


def run_exact(
    case: Case[Postgres], chunk_key: str | None, *, inserts_only: bool, seed: int
) -> set[str]:
    """3000 rows in chunks of 500 (or one chunk), a writer before the first chunk, between
    and while chunks are read (a thread), across a restore and after the log started; the
    multiset of the output must equal the table. Returns the ops seen."""
    make_history(case.server, case.table, 3000)
    writer = HistoryWriter(case.database, case.table, seed)
    options = {} if chunk_key is None else {"chunkKeyColumn": chunk_key}
    harness: h.Harness = SourceHarness(case.source(500, **options), 2)
    phases = h.Phases(harness)
    try:
        writer.write(20, inserts_only)  # after the slot, before any chunk is read
        h.step(harness, phases, 0)
        writer.write(10, inserts_only)
        harness.complete(harness.checkpoint())
        background = Background(writer, inserts_only)
        for _ in range(3):
            h.step(harness, phases)
        assert background.stop() > 0
        harness.restore()
        phases.harness = harness
        writer.write(10, inserts_only)
        h.step(harness, phases)
        writer.write(20, inserts_only)  # the log is reading by now, or soon
        rows = h.finish(harness, phases)
    finally:
        writer.close()
    assert rebuilt(rows) == history_now(case.server, case.table)
    return {r["op"] for r in rows}


@pytest.mark.parametrize("chunk_key", [None, "aid"], ids=["one-chunk", "chunkKeyColumn"])
def test_inserts_into_a_keyless_table_while_it_is_read_come_exactly_once(
    case: Case[Postgres], chunk_key: str | None
) -> None:
    assert run_exact(case, chunk_key, inserts_only=True, seed=5) == {"r", "c"}


@pytest.mark.parametrize("chunk_key", [None, "aid"], ids=["one-chunk", "chunkKeyColumn"])
def test_updates_and_deletes_of_a_keyless_table_under_replica_identity_full_are_exact(
    case: Case[Postgres], chunk_key: str | None
) -> None:
    assert run_exact(case, chunk_key, inserts_only=False, seed=13) == {"r", "c", "d"}


def test_an_update_of_a_keyless_row_is_a_delete_of_the_old_row_then_an_insert(
    case: Case[Postgres],
) -> None:
    make_history(case.server, case.table, 10)
    harness: h.Harness = SourceHarness(case.source(chunkKeyColumn="aid"), 1)
    harness.read_available()
    harness.complete(harness.checkpoint())
    assert _log_running(harness)
    case.server.execute(f"UPDATE {case.table} SET delta = 100, aid = NULL WHERE aid = 3")
    case.server.execute(f"DELETE FROM {case.table} WHERE aid = 4")
    rows = h.finish(harness)
    changes = [(r["op"], r["aid"], r["delta"], r["filler"].strip()) for r in rows if r["op"] != "r"]
    assert changes == [("d", 3, 0, "f3"), ("c", None, 100, "f3"), ("d", 4, 1, "f4")]
    assert rebuilt(rows) == history_now(case.server, case.table)


@pytest.mark.parametrize("read_first", ["first", "second"])
def test_each_row_of_an_update_is_judged_by_its_own_chunk(
    case: Case[Postgres], read_first: str
) -> None:
    """With one chunk read and the other not: rows moved between the two chunks, into and
    out of NULL (the first chunk's), by updates that the two chunks' snapshots disagree on."""
    make_history(case.server, case.table, 1000)  # chunks aid < 511 (and NULL), aid >= 511
    harness: h.Harness = SourceHarness(case.source(chunkKeyColumn="aid"), 2)
    harness.settle()
    owners = {
        s.lo is None: reader
        for reader, splits in harness.reader_splits().items()
        for s in splits
        if isinstance(s, ChunkSplit)
    }
    harness.poll(owners[read_first == "first"], max_polls=1)
    harness.settle()
    (unread,) = [
        s for ss in harness.reader_splits().values() for s in ss if isinstance(s, ChunkSplit)
    ]
    assert (unread.lo is None) == (read_first == "second")
    t = case.table
    if read_first == "second":  # rows out of the unread first chunk and into it
        moves = [(10, 900), (None, 901), (810, 20), (811, None)]
    else:
        moves = [(910, 10), (911, None), (20, 810), (None, 811)]
    for before, after in moves:
        where = "aid IS NULL" if before is None else f"aid = {before}"
        case.server.execute(
            f"UPDATE {t} SET aid = %s, delta = 50 WHERE ctid = "
            f"(SELECT ctid FROM {t} WHERE {where} LIMIT 1)",
            (after,),
        )
    rows = h.finish(harness)
    assert rebuilt(rows) == history_now(case.server, case.table)


def test_a_keyless_table_with_replica_identity_using_an_index_is_keyed_by_it(
    case: Case[Postgres],
) -> None:
    t = case.table
    case.server.execute(f"CREATE TABLE {t} (code int NOT NULL, v int, w text)")
    case.server.execute(f"INSERT INTO {t} SELECT g, 0, 'row' FROM generate_series(1, 1000) g")
    case.server.execute(f"CREATE UNIQUE INDEX {t}_code ON {t} (code)")
    case.server.execute(f"ALTER TABLE {t} REPLICA IDENTITY USING INDEX {t}_code")
    source = case.source()
    table = source.tables[case.name]
    assert (table.key, table.chunk_key, table.replica_identity) == (("code",), "code", "i")
    harness: h.Harness = SourceHarness(source, 1)
    harness.settle()
    harness.poll(0, max_polls=1)  # one of two chunks read
    case.server.execute(f"UPDATE {t} SET v = 7 WHERE code IN (1, 1000)")
    case.server.execute(f"UPDATE {t} SET code = 2000 WHERE code = 2")  # the key changes
    case.server.execute(f"DELETE FROM {t} WHERE code = 999")
    rows = h.finish(harness)

    def code(row: dict[str, Any]) -> Any:
        return row["code"]

    assert h.replay(rows, code) == table_now(case.database, t, "code, v, w")


def test_a_key_column_named_by_chunk_key_column_cuts_a_composite_key(case: Case[Postgres]) -> None:
    t = case.table
    case.server.execute(f"CREATE TABLE {t} (a int, b text, v int, PRIMARY KEY (b, a))")
    case.server.execute(
        f"INSERT INTO {t} SELECT g, 'b' || g % 7, 0 FROM generate_series(1, 1000) g"
    )
    source = case.source(chunkKeyColumn=f"{t}:a")
    with catalog.connect(source.options) as conn:
        chunks = chunks_of(catalog, conn, source.tables[case.name], 500)
    assert [(c.key, c.lo, c.hi) for c in chunks] == [("a", None, 501), ("a", 501, None)]
    harness: h.Harness = SourceHarness(source, 1)
    harness.settle()
    harness.poll(0, max_polls=1)  # one chunk read
    case.server.execute(f"UPDATE {t} SET a = 1001 - a, v = 1 WHERE a IN (3, 997)")  # across chunks
    case.server.execute(f"UPDATE {t} SET v = 2 WHERE a IN (4, 996)")
    rows = h.finish(harness)

    def key(row: dict[str, Any]) -> Any:
        return row["a"], row["b"]

    expected = {
        (a, b): {"a": a, "b": b, "v": v}
        for a, b, v in case.server.execute(f"SELECT a, b, v FROM {t}")
    }
    assert h.replay(rows, key) == expected
    assert {r["op"] for r in rows} == {"r", "u", "d", "c"}
