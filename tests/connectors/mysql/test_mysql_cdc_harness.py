"""Exactly-once change data capture through the SourceHarness, against a real MariaDB.

As ``tests/connectors/postgres/test_cdc_harness.py`` does for PostgreSQL: each test
snapshots a table in chunks while a writer changes it (between harness steps, and from a
thread while chunks are read), checkpoints, fails and restores at chosen points, and then
replays the committed rows: ``r`` and ``c`` insert a key that must be absent, ``u`` and ``d``
change or delete a key that must be present. The result must equal a SELECT of the table,
row for row; with inserts only, every id must come exactly once.

The harness pins nothing, so each chunk stands at its own snapshot here; the pinned reads
(every read of a batch rewound to one position) are ``test_mysql_cdc_pinning.py``'s.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from tests.support.mariadb import MariaDB

pytest.importorskip("pymysqlreplication", reason="pip install -e '.[mysql]'")

from splitflow.api.events import BacklogFinishedEvent
from splitflow.connectors.cdc.splits import ChunkSplit, LogSplit
from splitflow.connectors.mysql import catalog
from splitflow.connectors.mysql.options import MySqlOptions
from splitflow.connectors.mysql.source import MySqlCdcSource
from splitflow.testing.harness import SourceHarness

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:'db' is deprecated:DeprecationWarning"),
]

_names = itertools.count()
_server_ids = itertools.count(7000, 10)

Harness = SourceHarness[pa.RecordBatch, Any, Any]


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


class Case:
    """A fresh table name for one test."""

    def __init__(self, db: MariaDB) -> None:
        self.db = db
        self.table = f"cdc_h{next(_names)}"

    @property
    def name(self) -> str:
        return f"splitflow.{self.table}"

    def source(self, chunk_size: int = 500, **options: str) -> MySqlCdcSource:
        return load(
            self.db,
            tableName=options.pop("tableName", self.table),
            chunkSize=str(chunk_size),
            **options,
        )


@pytest.fixture
def case(mariadb: MariaDB) -> Case:
    return Case(mariadb)


class Writer:
    """Random inserts, updates and deletes on ``table (id INT PRIMARY KEY, v INT, w
    VARCHAR(20))``, one or several per transaction, with a seeded generator."""

    def __init__(self, db: MariaDB, table: str, live: set[int], seed: int) -> None:
        self.conn = db.connect(autocommit=False)
        self.table = table
        self.live = set(live)
        self.dead: set[int] = set()
        self.next_id = max(live, default=0) + 1
        self.rng = random.Random(seed)
        self.lock = threading.Lock()

    def one(self, cursor: Any, inserts_only: bool = False) -> None:
        pick = self.rng.random()
        if inserts_only or pick < 0.4 or not self.live:
            if self.dead and self.rng.random() < 0.3:
                key = self.rng.choice(sorted(self.dead))  # a key again, inside a chunk
                self.dead.discard(key)
            else:
                key, self.next_id = self.next_id, self.next_id + 1
            cursor.execute(
                f"INSERT INTO {self.table} VALUES (%s, %s, 'new')", (key, self.rng.randrange(99))
            )
            self.live.add(key)
        elif pick < 0.8:
            key = self.rng.choice(sorted(self.live))
            cursor.execute(
                f"UPDATE {self.table} SET v = v + 1, w = %s WHERE id = %s", (f"u{pick:.3f}", key)
            )
        else:
            key = self.rng.choice(sorted(self.live))
            cursor.execute(f"DELETE FROM {self.table} WHERE id = %s", (key,))
            self.live.discard(key)
            self.dead.add(key)

    def write(self, transactions: int, inserts_only: bool = False) -> None:
        with self.lock:
            for _ in range(transactions):
                with self.conn.cursor() as cursor:
                    for _ in range(self.rng.choice((1, 1, 1, 3))):
                        self.one(cursor, inserts_only)
                self.conn.commit()

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


def make_table(db: MariaDB, table: str, ids: Any) -> set[int]:
    ids = list(ids)
    db.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, v INT, w VARCHAR(20))")
    with db.connect() as conn, conn.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {table} VALUES (%s, %s, %s)", [(i, i % 100, f"row{i}") for i in ids]
        )
    return set(ids)


def rows_of(batches: list[pa.RecordBatch]) -> list[dict[str, Any]]:
    return [row for batch in batches for row in batch.to_pylist()]


def replay(rows: list[dict[str, Any]], key: Callable[[dict[str, Any]], Any]) -> dict[Any, Any]:
    """Apply the rows in order (snapshot rows first, then changes by position, stable):
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


def table_now(db: MariaDB, table: str, columns: str = "id, v, w") -> dict[Any, Any]:
    names = [c.strip() for c in columns.split(",")]
    rows = db.execute(f"SELECT {columns} FROM {table}")
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
    make_table(case.db, case.table, range(2, 6001, 2))  # 3000 rows over 2..6000: 2 values/row
    source = case.source()
    with catalog.connect(source.options) as conn:
        chunks = catalog.cut(conn, source.tables[case.name], 500)
    edges = [None, 1002, 2002, 3002, 4002, 5002, None]
    assert [(c.lo, c.hi) for c in chunks] == list(itertools.pairwise(edges))
    assert [c.split_id for c in chunks] == [f"{case.name}#{i}" for i in range(6)]


def test_sparse_integer_keys_are_cut_by_stepping_through_them(case: Case) -> None:
    ids = [1, *range(1_000_000, 10_000_000, 1_000_000)]  # 10 rows spread over 9 million
    make_table(case.db, case.table, ids)
    source = case.source(chunk_size=3, startupMode="snapshotOnly")
    with catalog.connect(source.options) as conn:
        chunks = catalog.cut(conn, source.tables[case.name], 3)
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
    live = make_table(case.db, case.table, range(1, rows + 1))
    writer = Writer(case.db, case.table, live, seed)
    harness: Harness = SourceHarness(case.source(), parallelism)
    phases = Phases(harness)
    try:
        harness.settle()  # the log's start is taken
        writer.write(20)  # after it, before any chunk is read
        disturb(harness, writer)
        step(harness, phases)
        writer.write(30)  # the log is reading by now, or soon
        final = finish(harness, phases)
    finally:
        writer.close()
    assert replay(final, by_id) == table_now(case.db, case.table)


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


def test_inserts_only_while_chunks_are_read_come_exactly_once(case: Case) -> None:
    live = make_table(case.db, case.table, range(1, 6001))
    writer = Writer(case.db, case.table, live, seed=11)
    harness: Harness = SourceHarness(case.source(), 2)
    phases = Phases(harness)
    try:
        harness.settle()
        background = Background(writer, inserts_only=True)
        for _ in range(6):
            step(harness, phases)
        background.stop()
        rows = finish(harness, phases)
    finally:
        writer.close()
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "ids read twice"
    assert set(ids) == set(table_now(case.db, case.table))


def test_the_log_carries_the_position_of_every_chunk_until_it_passes_them(case: Case) -> None:
    make_table(case.db, case.table, range(1, 3001))
    harness: Harness = SourceHarness(case.source(), 2)
    harness.settle()
    case.db.execute(f"UPDATE {case.table} SET v = v + 1 WHERE id = 1")  # past the log's start
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


def test_a_table_created_after_the_log_started_is_snapshotted_and_followed(case: Case) -> None:
    """The log reads every table that matches, so a table created after it started comes
    whole through the log, and through its chunk too (without a watermark): its rows may
    come twice, and an upsert by key that keeps the highest ``lsn`` ends exact."""
    make_table(case.db, case.table, range(1, 1001))
    harness: Harness = SourceHarness(
        case.source(tableName=f"{case.table}.*", discoveryInterval="1s"), 2
    )
    harness.read_available()
    make_table(case.db, f"{case.table}_late", range(1, 11))
    harness.advance(1.0)  # discovery: the new table's chunk
    harness.read_available()
    case.db.execute(f"UPDATE {case.table}_late SET v = -1 WHERE id = 3")
    case.db.execute(f"UPDATE {case.table} SET v = -1 WHERE id = 3")
    rows = finish(harness)
    late = [r for r in rows if r["table"] == f"{case.name}_late"]
    assert sorted((r["id"], r["op"]) for r in late) == sorted(
        [(i, "r") for i in range(1, 11)] + [(i, "c") for i in range(1, 11)] + [(3, "u")]
    )
    assert upsert(late, by_id) == table_now(case.db, f"{case.table}_late")
    first = [r for r in rows if r["table"] == case.name]
    assert replay(first, by_id) == table_now(case.db, case.table)


def upsert(rows: list[dict[str, Any]], key: Callable[[dict[str, Any]], Any]) -> dict[Any, Any]:
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


@pytest.mark.parametrize(
    ("ddl", "key"),
    [
        ("(k VARCHAR(20) PRIMARY KEY, v INT)", lambda r: r["k"]),
        ("(a INT, b VARCHAR(20), v INT, PRIMARY KEY (a, b))", lambda r: (r["a"], r["b"])),
    ],
    ids=["text", "composite"],
)
def test_a_table_whose_key_cannot_be_cut_is_one_chunk_and_exact(
    case: Case, ddl: str, key: Callable[[dict[str, Any]], Any]
) -> None:
    db, t = case.db, case.table
    db.execute(f"CREATE TABLE {t} {ddl}")
    text = "k" in ddl.split()[0]
    with db.connect() as conn, conn.cursor() as cursor:
        if text:
            cursor.executemany(
                f"INSERT INTO {t} VALUES (%s, %s)", [(f"k{g}", g) for g in range(1, 301)]
            )
        else:
            cursor.executemany(
                f"INSERT INTO {t} VALUES (%s, %s, %s)", [(g % 7, f"b{g}", g) for g in range(1, 301)]
            )
    source = case.source(chunk_size=50)
    with catalog.connect(source.options) as conn:
        assert catalog.cut(conn, source.tables[case.name], 50) == [ChunkSplit(case.name, 0)]
    where = "k = 'k5'" if text else "a = 5 AND b = 'b5'"
    harness: Harness = SourceHarness(source, 2)
    phases = Phases(harness)
    harness.settle()
    db.execute(f"UPDATE {t} SET v = -5 WHERE {where}")  # before the chunk: in its snapshot
    db.execute(f"DELETE FROM {t} WHERE v = 7")
    step(harness, phases)
    db.execute(f"DELETE FROM {t} WHERE v = 8")  # after: from the log
    db.execute(f"UPDATE {t} SET v = v * 10 WHERE v < 50")
    if text:
        db.execute(f"INSERT INTO {t} VALUES ('new', 1)")
        db.execute(f"UPDATE {t} SET k = 'renamed' WHERE k = 'k9'")  # a key change: d + c
    else:
        db.execute(f"INSERT INTO {t} VALUES (99, 'new', 1)")
    rows = finish(harness, phases)
    columns = "k, v" if text else "a, b, v"
    names = [c.strip() for c in columns.split(",")]
    expected = {
        key(row): row
        for row in (
            dict(zip(names, values, strict=True))
            for values in db.execute(f"SELECT {columns} FROM {t}")
        )
    }
    assert replay(rows, key) == expected
    assert {r["op"] for r in rows} == {"r", "u", "d", "c"}


def test_a_table_without_a_primary_key_is_one_chunk_and_a_multiset(case: Case) -> None:
    db, t = case.db, case.table
    db.execute(f"CREATE TABLE {t} (v INT, w VARCHAR(10))")
    with db.connect() as conn, conn.cursor() as cursor:
        cursor.executemany(f"INSERT INTO {t} VALUES (%s, %s)", [(g % 5, "same") for g in range(40)])
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


# -- backlog, positions, purges ------------------------------------------------------------------


def test_backlog_lasts_through_the_snapshot_and_ends_at_the_log_boundary(case: Case) -> None:
    make_table(case.db, case.table, range(1, 2001))
    harness: Harness = SourceHarness(case.source(), 2)
    harness.settle()
    context = harness.coordinator.context
    enumerator: Any = harness.coordinator.enumerator
    assert context.is_processing_backlog
    assert enumerator.backlog_boundaries() == {}  # chunks: the held flag, no boundary
    harness.poll(0, max_polls=1)
    harness.settle()
    assert context.is_processing_backlog
    case.db.execute(f"UPDATE {case.table} SET v = -2 WHERE id > 1990")
    harness.read_available()
    boundaries = enumerator.backlog_boundaries()
    assert list(boundaries) == ["log:binlog"]
    assert context.is_processing_backlog  # until the runtime says the boundary is reached
    harness.coordinator.handle_source_event(0, BacklogFinishedEvent(("log:binlog",)))
    harness.settle()
    assert not context.is_processing_backlog
    harness.close()


def test_a_log_whose_binlog_was_purged_fails_naming_the_positions(tmp_path: Path) -> None:
    from splitflow.errors import DataLossError, SourceFailedError

    with MariaDB.start(tmp_path) as db:  # a server of its own: its binlog is purged
        case = Case(db)
        make_table(db, case.table, range(1, 11))
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
