"""Exactly-once change data capture through the SourceHarness, against a real PostgreSQL.

Each test snapshots a table in chunks while a writer changes it (between harness steps, and
from a thread while chunks are read), checkpoints, fails and restores at chosen points, and
then replays the committed rows: ``r`` and ``c`` insert a key that must be absent, ``u`` and
``d`` change or delete a key that must be present. The result must equal a SELECT of the
table, row for row; with inserts only, every id must come exactly once.
"""

from __future__ import annotations

import itertools
import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest
from tests.support.postgres import Postgres

from splitflow.api.events import BacklogFinishedEvent
from splitflow.connectors.postgres import catalog
from splitflow.connectors.postgres.options import PostgresOptions
from splitflow.connectors.postgres.source import PostgresCdcSource
from splitflow.connectors.postgres.splits import ChunkSplit, LogSplit
from splitflow.testing.harness import SourceHarness

_names = itertools.count()

Harness = SourceHarness[pa.RecordBatch, Any, Any]


def load(postgres: Postgres, **options: str) -> PostgresCdcSource:
    """The source as ``PostgresCdcDataSource`` makes it at ``load()``, without Spark."""
    parsed = PostgresOptions.parse({"conninfo": postgres.conninfo(), **options})
    with catalog.connect(parsed, autocommit=True) as conn:
        names = catalog.list_tables(conn, parsed)
        tables = [catalog.describe_table(conn, name, parsed) for name in names]
        row_bytes = catalog.row_bytes(conn, names)
    return PostgresCdcSource(parsed, tables, row_bytes)


class Case:
    """A fresh table name and slot for one test; the slot and publication are dropped after."""

    def __init__(self, postgres: Postgres) -> None:
        n = next(_names)
        self.pg = postgres
        self.table = f"cdc_h{n}"
        self.slot = f"cdc_h{n}"

    def source(self, chunk_size: int = 500, **options: str) -> PostgresCdcSource:
        return load(
            self.pg,
            tables=options.pop("tables", self.table),
            slotName=self.slot,
            chunkSize=str(chunk_size),
            **options,
        )

    def drop(self) -> None:
        self.pg.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (self.slot,),
        )
        self.pg.execute(f"DROP PUBLICATION IF EXISTS {self.slot}")

    def confirmed(self) -> int:
        rows = self.pg.execute(
            "SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (self.slot,),
        )
        return int(rows[0][0])


@pytest.fixture
def case(postgres: Postgres) -> Iterator[Case]:
    made = Case(postgres)
    yield made
    made.drop()


class Writer:
    """Random inserts, updates and deletes on ``table (id int PRIMARY KEY, v int, w text)``,
    one or several per transaction, with a seeded generator (the same run every time)."""

    def __init__(self, postgres: Postgres, table: str, live: set[int], seed: int) -> None:
        self.conn = postgres.connect()
        self.table = table
        self.live = set(live)
        self.dead: set[int] = set()
        self.next_id = max(live, default=0) + 1
        self.rng = random.Random(seed)
        self.lock = threading.Lock()

    def one(self, inserts_only: bool = False) -> None:
        pick = self.rng.random()
        if inserts_only or pick < 0.4 or not self.live:
            if self.dead and self.rng.random() < 0.3:
                key = self.rng.choice(sorted(self.dead))  # a key again, inside a chunk
                self.dead.discard(key)
            else:
                key, self.next_id = self.next_id, self.next_id + 1
            self.conn.execute(
                f"INSERT INTO {self.table} VALUES (%s, %s, 'new')", (key, self.rng.randrange(99))
            )
            self.live.add(key)
        elif pick < 0.8:
            key = self.rng.choice(sorted(self.live))
            self.conn.execute(
                f"UPDATE {self.table} SET v = v + 1, w = %s WHERE id = %s", (f"u{pick:.3f}", key)
            )
        else:
            key = self.rng.choice(sorted(self.live))
            self.conn.execute(f"DELETE FROM {self.table} WHERE id = %s", (key,))
            self.live.discard(key)
            self.dead.add(key)

    def write(self, transactions: int, inserts_only: bool = False) -> None:
        with self.lock:
            for _ in range(transactions):
                with self.conn.transaction():
                    for _ in range(self.rng.choice((1, 1, 1, 3))):
                        self.one(inserts_only)

    def close(self) -> None:
        self.conn.close()


class Background:
    """A writer thread that writes until stopped (changes made while chunks are read)."""

    def __init__(self, writer: Writer, inserts_only: bool = False) -> None:
        self.writer = writer
        self.stopping = threading.Event()
        self.count = 0
        self.error: BaseException | None = None

        def run() -> None:
            try:
                while not self.stopping.is_set():
                    writer.write(1, inserts_only)
                    self.count += 1
            except BaseException as e:  # reported by stop()
                self.error = e

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def stop(self) -> int:
        self.stopping.set()
        self.thread.join(30)
        if self.error is not None:
            raise self.error
        return self.count


def make_table(postgres: Postgres, table: str, ids: Any) -> set[int]:
    postgres.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v int, w text)")
    postgres.execute(
        f"INSERT INTO {table} SELECT g, g %% 100, 'row' || g FROM unnest(%s::int[]) g", (list(ids),)
    )
    return set(ids)


def rows_of(batches: list[pa.RecordBatch]) -> list[dict[str, Any]]:
    return [row for batch in batches for row in batch.to_pylist()]


def replay(rows: list[dict[str, Any]], key: Callable[[dict[str, Any]], Any]) -> dict[Any, Any]:
    """Apply the rows in order (snapshot rows first, then changes by commit LSN, stable):
    ``r``/``c`` need the key absent, ``u``/``d`` present; returns key -> row values."""
    ordered = sorted(rows, key=lambda r: (0, 0) if r["op"] == "r" else (1, r["lsn"]))
    state: dict[Any, Any] = {}
    for row in ordered:
        k, op = key(row), row["op"]
        values = {n: v for n, v in row.items() if n not in ("op", "lsn", "commit_ts", "table")}
        if op in ("r", "c"):
            assert k not in state, f"{op} of {k} while the key holds {state[k]}"
            state[k] = values
        elif op == "u":
            assert k in state, f"update of absent key {k}"
            state[k] = values
        else:
            assert op == "d", op
            assert k in state, f"delete of absent key {k}"
            del state[k]
    return state


def table_now(postgres: Postgres, table: str, columns: str = "id, v, w") -> dict[Any, Any]:
    names = [c.strip() for c in columns.split(",")]
    rows = postgres.execute(f"SELECT {columns} FROM {table}")
    return {row[0]: dict(zip(names, row, strict=True)) for row in rows}


def by_id(row: dict[str, Any]) -> Any:
    return row["id"]


class Phases:
    """Checks, after every step, that the log split is held only once every chunk finished,
    and that the source is processing backlog while chunks remain."""

    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.log_seen = False

    def check(self) -> None:
        h = self.harness
        enumerator: Any = h.coordinator.enumerator
        held = [s for splits in h.reader_splits().values() for s in splits]
        held += enumerator.unassigned_splits()
        chunks = {s.split_id for s in held if isinstance(s, ChunkSplit)}
        logs = [s for s in held if isinstance(s, LogSplit)]
        if chunks:
            assert not logs, f"log split out while chunks {sorted(chunks)} are unfinished"
            assert h.coordinator.context.is_processing_backlog
        if logs:
            self.log_seen = True
            assert enumerator._chunk_ids <= enumerator.finished_splits()
            assert len(logs) == 1


def step(harness: Harness, phases: Phases, reader_id: int | None = None) -> None:
    """One poll of one reader (or of all, round robin), then the phase checks."""
    harness.settle()
    for rid in sorted(harness.slots) if reader_id is None else [reader_id]:
        harness.poll(rid, max_polls=1)
        harness.settle()
    phases.check()


def finish(harness: Harness, phases: Phases | None = None) -> list[dict[str, Any]]:
    harness.read_available()
    harness.complete(harness.checkpoint())
    harness.read_available()  # the log after the last writes
    harness.complete(harness.checkpoint())
    if phases is not None:
        phases.check()
        assert phases.log_seen
    rows = rows_of(harness.committed())
    harness.close()
    return rows


# -- the plan -------------------------------------------------------------------------------------


def test_dense_integer_keys_are_cut_into_even_ranges(case: Case) -> None:
    make_table(case.pg, case.table, range(2, 6001, 2))  # 3000 rows over 2..6000: 2 values/row
    with catalog.connect(case.source().options) as conn:
        table = catalog.describe_table(conn, f"public.{case.table}")
        chunks = catalog.cut(conn, table, 500)
    edges = [None, 1002, 2002, 3002, 4002, 5002, None]
    assert [(c.lo, c.hi) for c in chunks] == list(itertools.pairwise(edges))
    assert [c.split_id for c in chunks] == [f"public.{case.table}#{i}" for i in range(6)]


def test_sparse_integer_keys_are_cut_by_stepping_through_them(case: Case) -> None:
    ids = [1, *range(1_000_000, 10_000_000, 1_000_000)]  # 10 rows spread over 9 million
    make_table(case.pg, case.table, ids)
    source = case.source(chunk_size=3, startupMode="snapshotOnly")
    with catalog.connect(source.options) as conn:
        chunks = catalog.cut(conn, source.tables[f"public.{case.table}"], 3)
    assert [(c.lo, c.hi) for c in chunks] == [
        (None, 3_000_000),
        (3_000_000, 6_000_000),
        (6_000_000, 9_000_000),
        (9_000_000, None),
    ]
    harness = SourceHarness(source, 2)
    harness.run_to_end()
    rows = rows_of(harness.committed())
    harness.close()
    assert sorted(r["id"] for r in rows) == ids
    assert {r["op"] for r in rows} == {"r"}


def test_a_table_smaller_than_a_chunk_is_one_open_chunk(case: Case) -> None:
    make_table(case.pg, case.table, range(1, 11))
    source = case.source(chunk_size=10)
    with catalog.connect(source.options) as conn:
        chunks = catalog.cut(conn, source.tables[f"public.{case.table}"], 10)
    assert chunks == [ChunkSplit(f"public.{case.table}", 0, "id")]


# -- exactly once ---------------------------------------------------------------------------------


def run_exact(
    case: Case,
    disturb: Callable[[Harness, Writer], None],
    *,
    parallelism: int = 2,
    rows: int = 3000,
    seed: int = 7,
) -> None:
    """A table of ``rows`` rows (chunks of 500), a writer between the steps of ``disturb``
    and after it; the replayed committed rows must equal the table."""
    live = make_table(case.pg, case.table, range(1, rows + 1))
    writer = Writer(case.pg, case.table, live, seed)
    harness: Harness = SourceHarness(case.source(), parallelism)
    phases = Phases(harness)
    try:
        writer.write(20)  # after the slot, before any chunk is read
        disturb(harness, writer)
        step(harness, phases)
        writer.write(30)  # the log is reading by now, or soon
        final = finish(harness, phases)
    finally:
        writer.close()
    assert replay(final, by_id) == table_now(case.pg, case.table)


def test_changes_between_chunk_reads_are_exact(case: Case) -> None:
    def disturb(h: Harness, w: Writer) -> None:
        phases = Phases(h)
        for _ in range(4):
            step(h, phases, 0)
            w.write(10)
            step(h, phases, 1)
            w.write(10)

    run_exact(case, disturb)


def test_changes_while_chunks_are_read_are_exact(case: Case) -> None:
    def disturb(h: Harness, w: Writer) -> None:
        background = Background(w)
        phases = Phases(h)
        for _ in range(6):
            step(h, phases)
        assert background.stop() > 0

    run_exact(case, disturb, rows=6000)


def test_global_restore_during_the_snapshot_is_exact(case: Case) -> None:
    def disturb(h: Harness, w: Writer) -> None:
        phases = Phases(h)
        h.settle()
        h.poll(0, max_polls=1)  # some chunks read, others not
        w.write(10)
        h.complete(h.checkpoint())
        w.write(10)
        h.poll(1, max_polls=1)  # read, then lost in the restore
        w.write(10)
        h.restore()
        phases.check()
        w.write(10)

    run_exact(case, disturb)


def test_rescale_to_three_readers_during_the_snapshot_is_exact(case: Case) -> None:
    def disturb(h: Harness, w: Writer) -> None:
        h.settle()
        h.poll(1, max_polls=1)
        w.write(10)
        h.complete(h.checkpoint())
        h.restore(parallelism=3)
        loads = h.loads()
        assert sorted(loads) == [0, 1, 2]
        assert max(loads.values()) - min(loads.values()) <= 1, loads
        w.write(10)

    run_exact(case, disturb)


def test_reader_failure_mid_snapshot_is_exact(case: Case) -> None:
    def disturb(h: Harness, w: Writer) -> None:
        h.settle()
        h.complete(h.checkpoint())
        h.poll(0, max_polls=1)  # reader 0 read chunks, sent their marks, then fails
        w.write(10)
        h.fail_reader(0)
        w.write(10)

    run_exact(case, disturb)


def test_reader_failure_and_restore_after_the_log_started_are_exact(case: Case) -> None:
    def disturb(h: Harness, w: Writer) -> None:
        h.read_available()
        assert any(isinstance(s, LogSplit) for ss in h.reader_splits().values() for s in ss)
        w.write(10)
        h.read_available()
        h.complete(h.checkpoint())
        w.write(10)
        h.read_available()  # read, not committed
        (owner,) = [r for r, ss in h.reader_splits().items() if ss]
        h.fail_reader(owner)
        w.write(10)
        h.read_available()
        h.complete(h.checkpoint())
        w.write(10)
        h.read_available()
        h.restore()
        w.write(10)

    run_exact(case, disturb)


def test_inserts_only_come_exactly_once_across_snapshot_and_log(case: Case) -> None:
    """Even ids in the table, odd ids inserted (also inside the chunks' ranges) before,
    between and while chunks are read and after the log started."""
    make_table(case.pg, case.table, range(2, 4001, 2))
    writer = Writer(case.pg, case.table, set(), seed=3)
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
    assert sorted(ids) == sorted(r[0] for r in case.pg.execute(f"SELECT id FROM {case.table}"))
    assert {r["op"] for r in rows} == {"r", "c"}


def test_inserts_only_while_chunks_are_read_come_exactly_once(case: Case) -> None:
    live = make_table(case.pg, case.table, range(1, 6001))
    writer = Writer(case.pg, case.table, live, seed=11)
    harness: Harness = SourceHarness(case.source(), 2)
    phases = Phases(harness)
    try:
        background = Background(writer, inserts_only=True)
        for _ in range(6):
            step(harness, phases)
        background.stop()
        rows = finish(harness, phases)
    finally:
        writer.close()
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "ids read twice"
    assert set(ids) == set(table_now(case.pg, case.table))


def test_the_log_carries_the_marks_of_chunks_finished_before_a_restore(case: Case) -> None:
    make_table(case.pg, case.table, range(1, 3001))
    harness: Harness = SourceHarness(case.source(), 2)
    harness.settle()
    past_the_start(case)
    harness.poll(0, max_polls=1)  # chunks #0, #2, #4
    harness.complete(harness.checkpoint())
    harness.restore()
    log = until_the_log_is_assigned(harness)
    harness.close()
    assert [m[0] for m in log.marks] == [f"public.{case.table}#{i}" for i in range(6)]


def past_the_start(case: Case) -> None:
    """A commit after the slot was made and before the chunks are read, so that their marks
    end past the log's start. (A mark that ends at or before it holds nothing the log reads,
    and the log split drops it, issue 19.)"""
    case.pg.execute(f"UPDATE {case.table} SET v = v WHERE id = 1")


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


def test_the_log_carries_the_mark_of_every_chunk(case: Case) -> None:
    make_table(case.pg, case.table, range(1, 3001))
    harness: Harness = SourceHarness(case.source(), 2)
    harness.settle()
    past_the_start(case)
    harness.poll(0, max_polls=1)
    harness.complete(harness.checkpoint())
    harness.fail_reader(1)
    log = until_the_log_is_assigned(harness)
    harness.close()
    assert [m[0] for m in log.marks] == [f"public.{case.table}#{i}" for i in range(6)]
    assert [(m[2], m[3]) for m in log.marks] == list(
        itertools.pairwise([None, 501, 1001, 1501, 2001, 2501, None])
    )


def test_a_table_created_after_the_log_started_is_snapshotted_and_followed(case: Case) -> None:
    make_table(case.pg, case.table, range(1, 1001))
    harness: Harness = SourceHarness(
        case.source(tables=f"{case.table}*", discoveryInterval="1s"), 2
    )
    harness.read_available()
    make_table(case.pg, f"{case.table}_late", range(1, 11))
    harness.advance(1.0)  # discovery: the new table's chunk, and the publication extended
    harness.read_available()
    case.pg.execute(f"UPDATE {case.table}_late SET v = -1 WHERE id = 3")
    case.pg.execute(f"UPDATE {case.table} SET v = -1 WHERE id = 3")
    rows = finish(harness)
    late = [r for r in rows if r["table"] == f"public.{case.table}_late"]
    assert sorted((r["id"], r["op"]) for r in late) == sorted(
        [(i, "r") for i in range(1, 11)] + [(3, "u")]
    )
    assert replay(late, by_id) == table_now(case.pg, f"{case.table}_late")


# -- keys that cannot be cut ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ddl", "key"),
    [
        ("(k text PRIMARY KEY, v int)", lambda r: r["k"]),
        ("(a int, b text, v int, PRIMARY KEY (a, b))", lambda r: (r["a"], r["b"])),
    ],
    ids=["text", "composite"],
)
def test_a_table_whose_key_cannot_be_cut_is_one_chunk_and_exact(
    case: Case, ddl: str, key: Callable[[dict[str, Any]], Any]
) -> None:
    pg, t = case.pg, case.table
    pg.execute(f"CREATE TABLE {t} {ddl}")
    text = "k" in ddl.split()[0]
    if text:
        pg.execute(f"INSERT INTO {t} SELECT 'k' || g, g FROM generate_series(1, 300) g")
    else:
        pg.execute(f"INSERT INTO {t} SELECT g % 7, 'b' || g, g FROM generate_series(1, 300) g")
    source = case.source(chunk_size=50)
    with catalog.connect(source.options) as conn:
        assert catalog.cut(conn, source.tables[f"public.{t}"], 50) == [ChunkSplit(f"public.{t}", 0)]
    where = "k = 'k5'" if text else "a = 5 AND b = 'b5'"
    harness: Harness = SourceHarness(source, 2)
    phases = Phases(harness)
    pg.execute(f"UPDATE {t} SET v = -5 WHERE {where}")  # before the chunk: in its snapshot
    pg.execute(f"DELETE FROM {t} WHERE v = 7")
    step(harness, phases)
    pg.execute(f"DELETE FROM {t} WHERE v = 8")  # after: from the log
    pg.execute(f"UPDATE {t} SET v = v * 10 WHERE v < 50")
    if text:
        pg.execute(f"INSERT INTO {t} VALUES ('new', 1)")
    else:
        pg.execute(f"INSERT INTO {t} VALUES (99, 'new', 1)")
    rows = finish(harness, phases)
    columns = "k, v" if text else "a, b, v"
    expected = {
        key(row): row
        for row in (
            dict(zip([c.strip() for c in columns.split(",")], values, strict=True))
            for values in pg.execute(f"SELECT {columns} FROM {t}")
        )
    }
    assert replay(rows, key) == expected
    assert {r["op"] for r in rows} == {"r", "u", "d", "c"}


# -- backlog and the slot --------------------------------------------------------------------------


def test_backlog_lasts_through_the_snapshot_and_ends_at_the_log_boundary(case: Case) -> None:
    make_table(case.pg, case.table, range(1, 2001))
    harness: Harness = SourceHarness(case.source(), 2)
    harness.settle()
    context = harness.coordinator.context
    enumerator: Any = harness.coordinator.enumerator
    assert context.is_processing_backlog
    assert enumerator.backlog_boundaries() == {}  # chunks: the held flag, no boundary
    case.pg.execute(f"UPDATE {case.table} SET v = -1 WHERE id < 10")
    harness.poll(0, max_polls=1)
    harness.settle()
    assert context.is_processing_backlog
    case.pg.execute(f"UPDATE {case.table} SET v = -2 WHERE id > 1990")
    insert_before = int(case.pg.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")[0][0])
    harness.read_available()
    log_id = f"log:{case.slot}"
    boundaries = enumerator.backlog_boundaries()
    assert list(boundaries) == [log_id]
    assert boundaries[log_id] >= insert_before  # the WAL position when the log started
    assert context.is_processing_backlog  # until the runtime says the boundary is reached
    harness.coordinator.handle_source_event(0, BacklogFinishedEvent((log_id,)))
    harness.settle()
    assert not context.is_processing_backlog
    harness.close()


def test_the_slot_is_confirmed_only_up_to_a_completed_checkpoint(case: Case) -> None:
    """The runtime calls ``latest_positions`` when it plans (Spark's planner); the harness
    does not, so the test plays the planner: plan at the checkpointed position, then check
    the slot moves there only when a later checkpoint completes."""
    make_table(case.pg, case.table, range(1, 101))
    harness: Harness = SourceHarness(case.source(), 1)
    start = case.confirmed()
    harness.read_available()
    case.pg.execute(f"INSERT INTO {case.table} VALUES (1000, 1, 'x')")
    harness.read_available()
    first = harness.checkpoint()
    (log,) = [s for s in harness.checkpoints[first].readers[0] if isinstance(s, LogSplit)]
    assert log.position > start
    harness.complete(first)
    assert case.confirmed() == start  # nothing planned at that position yet
    harness._await(harness.coordinator.latest_positions([log]))  # the planner, next batch
    case.pg.execute(f"INSERT INTO {case.table} VALUES (1001, 1, 'y')")
    harness.read_available()
    second = harness.checkpoint()
    assert case.confirmed() == start  # taken, not completed
    harness.complete(second)
    assert case.confirmed() == log.position
    # what comes after the confirmed position is still read, once
    harness.restore()
    case.pg.execute(f"INSERT INTO {case.table} VALUES (1002, 1, 'z')")
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


def test_a_truncate_is_not_emitted_and_the_log_goes_on(case: Case) -> None:
    make_table(case.pg, case.table, range(1, 101))
    harness = SourceHarness(case.source(chunk_size=50), 2)
    harness.read_available()
    harness.complete(harness.checkpoint())
    case.pg.execute(f"TRUNCATE {case.table}")
    case.pg.execute(f"INSERT INTO {case.table} VALUES (500, 5, 'after')")
    rows = finish(harness)
    assert sorted(r["id"] for r in rows if r["op"] == "r") == list(range(1, 101))
    assert [(r["op"], r["id"]) for r in rows if r["op"] != "r"] == [("c", 500)]


def test_the_enumerator_reconnects_after_the_server_dropped_its_connection(case: Case) -> None:
    make_table(case.pg, case.table, range(1, 11))
    harness = SourceHarness(case.source(chunk_size=50), 1)
    try:
        harness.read_available()
        harness.complete(harness.checkpoint())
        log = next(s for ss in harness.reader_splits().values() for s in ss)
        enumerator = harness.coordinator.enumerator
        enumerator.latest_positions([log])  # the driver's connection is open now
        case.pg.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE pid <> pg_backend_pid() AND datname = current_database() "
            "AND query LIKE '%%pg_current_wal_insert_lsn%%'"
        )
        case.pg.execute(f"INSERT INTO {case.table} VALUES (99, 1, 'x')")
        extent = enumerator.latest_positions([log])[log.split_id]
        assert extent.latest > log.position
    finally:
        harness.close()
