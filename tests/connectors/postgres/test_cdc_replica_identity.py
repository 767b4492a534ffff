"""The CDC source under replica identities other than the default (FULL, USING INDEX): the
log keys changes by the primary key the chunks are cut by, not by pgoutput's key flags, and
fills unchanged TOAST values from a FULL old row."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import tests.connectors.cdc.harness_suite as h
from tests.connectors.cdc.database import Case, Writer, make_table, table_now
from tests.connectors.postgres.test_cdc_harness import PostgresUnderTest

from splitflow.connectors.postgres.splits import ChunkSplit, LogSplit
from splitflow.testing.harness import SourceHarness
from splitflow.testing.postgres import Postgres


@pytest.fixture
def case(postgres: Postgres) -> Iterator[Case[Postgres]]:
    made = Case(PostgresUnderTest(postgres))
    yield made
    made.drop()


def _log_running(harness: Any) -> bool:
    return any(isinstance(s, LogSplit) for ss in harness.reader_splits().values() for s in ss)


# -- (5) replica identity other than the default ------------------------------------------------


def test_replica_identity_full_table_with_changes_during_the_snapshot_is_exact(
    case: Case[Postgres],
) -> None:
    """docs/postgres-cdc.md (Limits) recommends REPLICA IDENTITY FULL; a table cut into
    chunks with changes during its snapshot must still be exact."""
    live = make_table(case.database, case.table, range(1, 1001))  # 2 chunks of 500
    case.server.execute(f"ALTER TABLE {case.table} REPLICA IDENTITY FULL")
    writer = Writer(case.database, case.table, live, seed=11)
    harness: h.Harness = SourceHarness(case.source(), 1)
    try:
        writer.write(20)  # after the slot, before the chunks: commit LSN < every high
        rows = h.finish(harness)
    finally:
        writer.close()
    assert h.replay(rows, h.by_id) == table_now(case.database, case.table)


def test_replica_identity_full_update_keeps_unchanged_toast_value(case: Case[Postgres]) -> None:
    big = "".join(chr(65 + (i * 7919) % 26) for i in range(20_000))
    case.server.execute(f"CREATE TABLE {case.table} (id int PRIMARY KEY, v int, doc text)")
    case.server.execute(f"ALTER TABLE {case.table} ALTER COLUMN doc SET STORAGE EXTERNAL")
    case.server.execute(f"ALTER TABLE {case.table} REPLICA IDENTITY FULL")
    case.server.execute(f"INSERT INTO {case.table} VALUES (1, 0, %s)", (big,))
    harness: h.Harness = SourceHarness(case.source(), 1)
    harness.read_available()
    harness.complete(harness.checkpoint())
    assert _log_running(harness)
    case.server.execute(f"UPDATE {case.table} SET v = 1 WHERE id = 1")  # doc untouched
    rows = h.finish(harness)
    changes = [(r["op"], r["id"], r["v"], r["doc"] == big) for r in rows if r["op"] != "r"]
    assert changes == [("u", 1, 1, True)]


def test_replica_identity_using_index_filters_changes_by_the_primary_key(
    case: Case[Postgres],
) -> None:
    case.server.execute(
        f"CREATE TABLE {case.table} (id int PRIMARY KEY, code int NOT NULL, v int, w text)"
    )
    case.server.execute(
        f"INSERT INTO {case.table} SELECT g, 1001 - g, 0, 'row' FROM generate_series(1, 1000) g"
    )
    case.server.execute(f"CREATE UNIQUE INDEX {case.table}_code ON {case.table} (code)")
    case.server.execute(f"ALTER TABLE {case.table} REPLICA IDENTITY USING INDEX {case.table}_code")
    harness: h.Harness = SourceHarness(case.source(), 1)  # chunks id < 501, id >= 501
    harness.settle()
    harness.poll(0, max_polls=1)  # one chunk read
    harness.settle()
    read = [s for ss in harness.reader_splits().values() for s in ss if isinstance(s, ChunkSplit)]
    assert len(read) == 1, read  # exactly one chunk still unread
    # id 1 (code 1000) and id 1000 (code 1): each row's code lies in the other chunk
    case.server.execute(f"UPDATE {case.table} SET v = 7, w = 'changed' WHERE id IN (1, 1000)")
    rows = h.finish(harness)
    state = h.replay(rows, h.by_id)
    now = table_now(case.database, case.table, "id, code, v, w")
    assert {k: v["v"] for k, v in state.items()} == {k: v["v"] for k, v in now.items()}
