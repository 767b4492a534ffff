"""Exactly-once change data capture through the SourceHarness, against a real PostgreSQL:
the CDC core's suite (:class:`~tests.connectors.cdc.harness_suite.CdcHarnessSuite`, on
:class:`PostgresUnderTest`), then what is PostgreSQL's own: the marks of the chunks in the
log split, a table found late (the publication extended before its chunk is read), the
slot's confirmed position, an empty publication, TRUNCATE, a dropped connection.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from tests.connectors.cdc.database import Case, DatabaseUnderTest, Writer, make_table, table_now
from tests.connectors.cdc.harness_suite import (
    CdcHarnessSuite,
    Harness,
    Phases,
    by_id,
    finish,
    replay,
    rows_with_a_late_table,
    step,
)
from tests.support.cdc import chunks_of

from splitflow.connectors.postgres import catalog
from splitflow.connectors.postgres.options import PostgresOptions
from splitflow.connectors.postgres.source import PostgresCdcSource
from splitflow.connectors.postgres.splits import ChunkSplit, LogSplit
from splitflow.testing.harness import SourceHarness
from splitflow.testing.postgres import Postgres


def load(postgres: Postgres, **options: str) -> PostgresCdcSource:
    """The source as ``PostgresCdcDataSource`` makes it at ``load()``, without Spark."""
    parsed = PostgresOptions.parse({"conninfo": postgres.conninfo(), **options})
    with catalog.connect(parsed, autocommit=True) as conn:
        names = catalog.list_tables(conn, parsed)
        tables = [catalog.describe_table(conn, name, parsed) for name in names]
        row_bytes = catalog.row_bytes(conn, names)
    return PostgresCdcSource(parsed, tables, row_bytes)


class PostgresUnderTest(DatabaseUnderTest[Postgres]):
    """PostgreSQL for the CDC core's suites: tables in ``public``, patterns with ``*``, a
    source's log is the slot (and publication) named by ``log``, positions are WAL bytes."""

    schema = "public"
    text = "text"

    def source(self, tables: str, log: str, **options: str) -> PostgresCdcSource:
        return load(self.server, tables=tables, slotName=log, **options)

    def pattern(self, prefix: str) -> str:
        return f"{prefix}*"

    def log_end(self) -> int:
        return int(self.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")[0][0])

    def drop_log(self, log: str) -> None:
        self.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (log,),
        )
        self.execute(f"DROP PUBLICATION IF EXISTS {log}")

    def connect(self) -> Any:
        return self.server.connect()

    @contextmanager
    def transaction(self, conn: Any) -> Iterator[Any]:
        with conn.transaction(), conn.cursor() as cursor:
            yield cursor

    def cut(self, source: Any, table: str, chunk_size: int) -> list[ChunkSplit]:
        with catalog.connect(source.options) as conn:
            return chunks_of(catalog, conn, source.tables[table], chunk_size)


@pytest.fixture
def case(postgres: Postgres) -> Iterator[Case[Postgres]]:
    made = Case(PostgresUnderTest(postgres))
    yield made
    made.drop()


class TestPostgresCdcHarness(CdcHarnessSuite):
    """The suite on PostgreSQL."""


def confirmed(case: Case[Postgres]) -> int:
    """The slot's confirmed position."""
    rows = case.server.execute(
        "SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
        (case.log,),
    )
    return int(rows[0][0])


# -- exactly once ---------------------------------------------------------------------------------


def test_inserts_only_come_exactly_once_across_snapshot_and_log(case: Case[Postgres]) -> None:
    """Even ids in the table, odd ids inserted (also inside the chunks' ranges) before,
    between and while chunks are read and after the log started."""
    make_table(case.database, case.table, range(2, 4001, 2))
    writer = Writer(case.database, case.table, set(), seed=3)
    odd = iter(range(1, 8001, 2))

    def insert(n: int) -> None:
        for _ in range(n):
            writer.conn.execute(f"INSERT INTO {case.table} VALUES (%s, 0, 'odd')", (next(odd),))

    harness: Harness = SourceHarness(case.source(chunk_size=250), 2)
    phases = Phases(harness)
    try:
        insert(100)
        step(harness, phases, 0)
        insert(100)
        harness.complete(harness.checkpoint())
        step(harness, phases, 1)
        insert(100)
        harness.restore()
        phases.harness = harness
        insert(100)
        step(harness, phases)
        insert(100)
        rows = finish(harness, phases)
    finally:
        writer.close()
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "ids read twice"
    assert sorted(ids) == sorted(r[0] for r in case.server.execute(f"SELECT id FROM {case.table}"))
    assert {r["op"] for r in rows} == {"r", "c"}


def test_the_log_carries_the_marks_of_chunks_finished_before_a_restore(
    case: Case[Postgres],
) -> None:
    make_table(case.database, case.table, range(1, 3001))
    harness: Harness = SourceHarness(case.source(), 2)
    harness.settle()
    past_the_start(case)
    harness.poll(0, max_polls=1)  # chunks #0, #2, #4
    harness.complete(harness.checkpoint())
    harness.restore()
    log = until_the_log_is_assigned(harness)
    harness.close()
    assert [m[0] for m in log.marks] == [f"{case.name}#{i}" for i in range(6)]


def past_the_start(case: Case[Postgres]) -> None:
    """A commit after the slot was made and before the chunks are read, so that their marks
    end past the log's start. (A mark that ends at or before it holds nothing the log reads,
    and the log split drops it, issue 19.)"""
    case.server.execute(f"UPDATE {case.table} SET v = v WHERE id = 1")


def until_the_log_is_assigned(harness: Harness) -> LogSplit:
    """Read the chunks one poll at a time until the log split is assigned, and return it
    unread: as the enumerator made it. (Once the log has read past every mark of a table,
    the split drops that table's marks, issue 19.)"""
    for _ in range(1000):
        for reader_id in sorted(harness.slots):
            harness.settle()
            held = [s for ss in harness.reader_splits().values() for s in ss]
            logs = [s for s in held if isinstance(s, LogSplit)]
            if logs:
                return logs[0]
            harness.poll(reader_id, max_polls=1)
    raise AssertionError("the log split was never assigned")


def test_the_log_carries_the_mark_of_every_chunk(case: Case[Postgres]) -> None:
    make_table(case.database, case.table, range(1, 3001))
    harness: Harness = SourceHarness(case.source(), 2)
    harness.settle()
    past_the_start(case)
    harness.poll(0, max_polls=1)
    harness.complete(harness.checkpoint())
    harness.fail_reader(1)
    log = until_the_log_is_assigned(harness)
    harness.close()
    assert [m[0] for m in log.marks] == [f"{case.name}#{i}" for i in range(6)]
    assert [(m[2], m[3]) for m in log.marks] == list(
        itertools.pairwise([None, 501, 1001, 1501, 2001, 2501, None])
    )


def test_a_table_created_after_the_log_started_is_snapshotted_and_followed(
    case: Case[Postgres],
) -> None:
    """Discovery extends the publication before the new table's chunk is read: its rows
    come once, through the chunk, and its changes after that through the log."""
    rows = rows_with_a_late_table(case)
    late = [r for r in rows if r["table"] == f"{case.name}_late"]
    assert sorted((r["id"], r["op"]) for r in late) == sorted(
        [(i, "r") for i in range(1, 11)] + [(3, "u")]
    )
    assert replay(late, by_id) == table_now(case.database, f"{case.table}_late")


# -- the slot and the server ---------------------------------------------------------------------


def test_the_slot_is_confirmed_only_up_to_a_completed_checkpoint(case: Case[Postgres]) -> None:
    """The runtime calls ``latest_positions`` when it plans (Spark's planner); the harness
    does not, so the test plays the planner: plan at the checkpointed position, then check
    the slot moves there only when a later checkpoint completes."""
    make_table(case.database, case.table, range(1, 101))
    harness: Harness = SourceHarness(case.source(), 1)
    start = confirmed(case)
    harness.read_available()
    case.server.execute(f"INSERT INTO {case.table} VALUES (1000, 1, 'x')")
    harness.read_available()
    first = harness.checkpoint()
    (log,) = [s for s in harness.checkpoints[first].readers[0] if isinstance(s, LogSplit)]
    assert log.position > start
    harness.complete(first)
    assert confirmed(case) == start  # nothing planned at that position yet
    harness._await(harness.coordinator.latest_positions([log]))  # the planner, next batch
    case.server.execute(f"INSERT INTO {case.table} VALUES (1001, 1, 'y')")
    harness.read_available()
    second = harness.checkpoint()
    assert confirmed(case) == start  # taken, not completed
    harness.complete(second)
    assert confirmed(case) == log.position
    # what comes after the confirmed position is still read, once
    harness.restore()
    case.server.execute(f"INSERT INTO {case.table} VALUES (1002, 1, 'z')")
    rows = finish(harness)
    assert sorted(r["id"] for r in rows if r["op"] == "c") == [1000, 1001, 1002]
    assert sorted(r["id"] for r in rows if r["op"] == "r") == list(range(1, 101))


def test_a_pattern_that_matches_nothing_yet_starts_with_an_empty_publication(
    postgres: Postgres,
) -> None:
    options = PostgresOptions.parse(
        {
            "conninfo": postgres.conninfo(),
            "tables": "public.nothing_yet_*",
            "slotName": "cdc_empty_pattern",
            "startupMode": "latest",
        }
    )
    harness = SourceHarness(PostgresCdcSource(options, []), 1)
    try:
        harness.read_available()
        harness.raise_if_failed()
        published = postgres.execute(
            "SELECT count(*) FROM pg_publication_tables WHERE pubname = 'cdc_empty_pattern'"
        )
        made = postgres.execute(
            "SELECT count(*) FROM pg_publication WHERE pubname = 'cdc_empty_pattern'"
        )
        assert (made, published) == ([(1,)], [(0,)])
        assert [s for ss in harness.reader_splits().values() for s in ss] == [
            LogSplit("cdc_empty_pattern", harness.reader_splits()[0][0].position)
        ]
    finally:
        harness.close()


def test_a_truncate_is_not_emitted_and_the_log_goes_on(case: Case[Postgres]) -> None:
    make_table(case.database, case.table, range(1, 101))
    harness = SourceHarness(case.source(chunk_size=50), 2)
    harness.read_available()
    harness.complete(harness.checkpoint())
    case.server.execute(f"TRUNCATE {case.table}")
    case.server.execute(f"INSERT INTO {case.table} VALUES (500, 5, 'after')")
    rows = finish(harness)
    assert sorted(r["id"] for r in rows if r["op"] == "r") == list(range(1, 101))
    assert [(r["op"], r["id"]) for r in rows if r["op"] != "r"] == [("c", 500)]


def test_the_enumerator_reconnects_after_the_server_dropped_its_connection(
    case: Case[Postgres],
) -> None:
    make_table(case.database, case.table, range(1, 11))
    harness = SourceHarness(case.source(chunk_size=50), 1)
    try:
        harness.read_available()
        harness.complete(harness.checkpoint())
        log = next(s for ss in harness.reader_splits().values() for s in ss)
        enumerator = harness.coordinator.enumerator
        enumerator.latest_positions([log])  # the driver's connection is open now
        case.server.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE pid <> pg_backend_pid() AND datname = current_database() "
            "AND query LIKE '%%pg_current_wal_insert_lsn%%'"
        )
        case.server.execute(f"INSERT INTO {case.table} VALUES (99, 1, 'x')")
        extent = enumerator.latest_positions([log])[log.split_id]
        assert extent.latest > log.position
    finally:
        harness.close()
