"""Exactly-once change data capture through the SourceHarness, against a real database: the
tests every database of the CDC core gets (:class:`CdcHarnessSuite`) and their tools.

Each test snapshots a table in chunks while a writer changes it (between harness steps, and
from a thread while chunks are read), checkpoints, fails and restores at chosen points, and
then replays the committed rows: ``r`` and ``c`` insert a key that must be absent, ``u`` and
``d`` change or delete a key that must be present. The result must equal a SELECT of the
table, row for row; with inserts only, every id must come exactly once.

A database's harness module subclasses the suite in one line and provides the fixture
``case`` (a :class:`~tests.connectors.cdc.database.Case` of its
:class:`~tests.connectors.cdc.database.DatabaseUnderTest`); its own tests, next to the
subclass, use the same tools.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from tests.connectors.cdc.database import (
    Background,
    Case,
    Writer,
    make_table,
    table_now,
)

from splitflow.api.events import BacklogFinishedEvent
from splitflow.connectors.cdc.splits import ChunkSplit, LogSplit
from splitflow.testing.harness import SourceHarness

Harness = SourceHarness[pa.RecordBatch, Any, Any]
Key = Callable[[dict[str, Any]], Any]


def rows_of(batches: list[pa.RecordBatch]) -> list[dict[str, Any]]:
    return [row for batch in batches for row in batch.to_pylist()]


def replay(rows: list[dict[str, Any]], key: Key) -> dict[Any, Any]:
    """Apply the rows in order (snapshot rows first, then changes by log position, stable):
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
    """Read what is there, twice with a completed checkpoint after each (the log after the
    last writes), close the harness; the committed rows."""
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


def run_exact(
    case: Case[Any],
    disturb: Callable[[Harness, Writer], None],
    *,
    parallelism: int = 2,
    rows: int = 3000,
    seed: int = 7,
    chunk_size: int = 500,
    **options: str,
) -> None:
    """A table of ``rows`` rows (chunks of ``chunk_size``), a writer between the steps of
    ``disturb`` and after it; the replayed committed rows must equal the table."""
    live = make_table(case.database, case.table, range(1, rows + 1))
    writer = Writer(case.database, case.table, live, seed)
    harness: Harness = SourceHarness(case.source(chunk_size, **options), parallelism)
    phases = Phases(harness)
    try:
        harness.settle()  # the log's start is taken, the chunks assigned
        writer.write(20)  # after it, before any chunk is read
        disturb(harness, writer)
        step(harness, phases)
        writer.write(30)  # the log is reading by now, or soon
        final = finish(harness, phases)
    finally:
        writer.close()
    assert replay(final, by_id) == table_now(case.database, case.table)


def rows_with_a_late_table(case: Case[Any]) -> list[dict[str, Any]]:
    """The committed rows of a source of ``<table>*`` (1000 rows) whose log is read when
    ``<table>_late`` (10 rows) is created and found by discovery, then a change to row 3
    of each table. How a late table's rows come is each database's to say."""
    db = case.database
    make_table(db, case.table, range(1, 1001))
    harness: Harness = SourceHarness(
        case.source(tables=db.pattern(case.table), discoveryInterval="1s"), 2
    )
    harness.read_available()
    make_table(db, f"{case.table}_late", range(1, 11))
    harness.advance(1.0)  # discovery: the new table's chunk
    harness.read_available()
    db.execute(f"UPDATE {case.table}_late SET v = -1 WHERE id = 3")
    db.execute(f"UPDATE {case.table} SET v = -1 WHERE id = 3")
    return finish(harness)


class CdcHarnessSuite:
    """The exactly-once tests of every CDC database: its test module subclasses this and
    provides the fixture ``case``."""

    # -- the plan ---------------------------------------------------------------------------

    def test_dense_integer_keys_are_cut_into_even_ranges(self, case: Case[Any]) -> None:
        make_table(case.database, case.table, range(2, 6001, 2))  # 3000 rows: 2 values/row
        chunks = case.database.cut(case.source(), case.name, 500)
        edges = [None, 1002, 2002, 3002, 4002, 5002, None]
        assert [(c.lo, c.hi) for c in chunks] == list(itertools.pairwise(edges))
        assert [c.split_id for c in chunks] == [f"{case.name}#{i}" for i in range(6)]

    def test_sparse_integer_keys_are_cut_by_stepping_through_them(self, case: Case[Any]) -> None:
        ids = [1, *range(1_000_000, 10_000_000, 1_000_000)]  # 10 rows spread over 9 million
        make_table(case.database, case.table, ids)
        source = case.source(chunk_size=3, startupMode="snapshotOnly")
        chunks = case.database.cut(source, case.name, 3)
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

    def test_a_table_smaller_than_a_chunk_is_one_open_chunk(self, case: Case[Any]) -> None:
        make_table(case.database, case.table, range(1, 11))
        chunks = case.database.cut(case.source(chunk_size=10), case.name, 10)
        assert chunks == [ChunkSplit(case.name, 0, "id")]

    # -- exactly once -----------------------------------------------------------------------

    def test_changes_between_chunk_reads_are_exact(self, case: Case[Any]) -> None:
        def disturb(h: Harness, w: Writer) -> None:
            phases = Phases(h)
            for _ in range(4):
                step(h, phases, 0)
                w.write(10)
                step(h, phases, 1)
                w.write(10)

        run_exact(case, disturb)

    def test_changes_while_chunks_are_read_are_exact(self, case: Case[Any]) -> None:
        def disturb(h: Harness, w: Writer) -> None:
            background = Background(w)
            phases = Phases(h)
            for _ in range(6):
                step(h, phases)
            assert background.stop() > 0

        run_exact(case, disturb, rows=6000)

    def test_global_restore_during_the_snapshot_is_exact(self, case: Case[Any]) -> None:
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

    def test_rescale_to_three_readers_during_the_snapshot_is_exact(self, case: Case[Any]) -> None:
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

    def test_reader_failure_mid_snapshot_is_exact(self, case: Case[Any]) -> None:
        def disturb(h: Harness, w: Writer) -> None:
            h.settle()
            h.complete(h.checkpoint())
            h.poll(0, max_polls=1)  # reader 0 read chunks, sent their marks, then fails
            w.write(10)
            h.fail_reader(0)
            w.write(10)

        run_exact(case, disturb)

    def test_reader_failure_and_restore_after_the_log_started_are_exact(
        self, case: Case[Any]
    ) -> None:
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

    def test_a_table_cut_as_it_is_read_keeps_a_window_of_chunks_and_is_exact(
        self, case: Case[Any]
    ) -> None:
        """Under ``maxChunksPerBatch`` (2) the table (30 chunks) is cut as it is read: never
        more chunks live than 2 x max(2, readers), the cut's cursor in the checkpoints, and
        exact through a global restore, a rescale to 3 readers and a reader failure, each
        mid-cut."""
        live_counts: list[tuple[int, int]] = []  # (live chunks, readers)
        cursors: list[int] = []

        def live(h: Harness) -> int:
            enumerator: Any = h.coordinator.enumerator
            held = [s for splits in h.reader_splits().values() for s in splits]
            held += enumerator.unassigned_splits()
            count = sum(1 for s in held if isinstance(s, ChunkSplit))
            live_counts.append((count, len(h.slots)))
            return count

        def checkpoint(h: Harness) -> None:
            checkpoint_id = h.checkpoint()
            state = h.checkpoints[checkpoint_id].enumerator
            cursors.extend(c.index for c in state.cuts)
            h.complete(checkpoint_id)

        def disturb(h: Harness, w: Writer) -> None:
            phases = Phases(h)
            for _ in range(3):
                step(h, phases)
                w.write(5)
                live(h)
            checkpoint(h)
            step(h, phases, 0)
            h.restore()
            w.write(5)
            for _ in range(2):
                step(h, phases)
                live(h)
            checkpoint(h)
            h.restore(parallelism=3)
            step(h, phases)
            live(h)
            checkpoint(h)
            step(h, phases, 1)
            h.fail_reader(1)
            w.write(5)
            # (a failover gives back what the failed reader finished since the checkpoint: live
            # chunks may then exceed the window until they are read again)
            for _ in range(30):  # a round reads what is cut: the rest comes as chunks finish
                if h.coordinator.enumerator._log_made:
                    break
                h.read_available()
                h.complete(h.checkpoint())

        run_exact(case, disturb, chunk_size=100, maxChunksPerBatch="2")
        assert all(0 < n <= 2 * max(2, readers) for n, readers in live_counts), live_counts
        assert (6, 3) in live_counts, live_counts  # the window grew with the readers
        assert cursors, "no checkpoint held a cut that goes on"
        assert 0 < min(cursors) <= max(cursors) < 30, cursors

    def test_a_cut_left_half_done_is_finished_whole_by_a_restore_without_the_option(
        self, case: Case[Any]
    ) -> None:
        """A checkpoint taken mid-cut (``maxChunksPerBatch``), restored by a query without
        the option: the rest of the table is cut whole at once, and the log starts."""

        def disturb(h: Harness, w: Writer) -> None:
            phases = Phases(h)
            step(h, phases)
            checkpoint_id = h.checkpoint()
            assert h.checkpoints[checkpoint_id].enumerator.cuts, "no cut goes on"
            h.complete(checkpoint_id)
            w.write(5)
            h.source = case.source(100)  # the same query, without maxChunksPerBatch
            h.restore()
            enumerator: Any = h.coordinator.enumerator
            assert not enumerator.splits_to_come()
            assert len(enumerator._chunk_ids) == 30

        run_exact(case, disturb, chunk_size=100, maxChunksPerBatch="2")

    def test_only_chunks_of_tables_found_at_the_start_hold_data_older_than_they_are(
        self, case: Case[Any]
    ) -> None:
        """A chunk cut later holds rows that existed when the run started (an
        ``availableNow`` run reads it), unless its table was found after the start."""
        db = case.database
        make_table(db, case.table, range(1, 1001))
        source = case.source(100, tables=db.pattern(case.table), discoveryInterval="1s")
        harness: Harness = SourceHarness(source, 2)
        harness.settle()
        make_table(db, f"{case.table}_late", range(1, 11))
        harness.advance(1.0)  # discovery: the new table's chunk
        enumerator: Any = harness.coordinator.enumerator
        held = [s for splits in harness.reader_splits().values() for s in splits]
        held += enumerator.unassigned_splits()
        extents = enumerator.latest_positions(held)
        old = {s.table: extents[s.split_id].preexisting for s in held if isinstance(s, ChunkSplit)}
        harness.close()
        assert old == {
            db.qualified(case.table): True,
            db.qualified(f"{case.table}_late"): False,
        }

    def test_inserts_only_while_chunks_are_read_come_exactly_once(self, case: Case[Any]) -> None:
        live = make_table(case.database, case.table, range(1, 6001))
        writer = Writer(case.database, case.table, live, seed=11)
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
        assert set(ids) == set(table_now(case.database, case.table))

    # -- keys that cannot be cut ------------------------------------------------------------

    @pytest.mark.parametrize(
        ("columns", "key"),
        [
            ("k {text} PRIMARY KEY, v INT", lambda r: r["k"]),
            ("a INT, b {text}, v INT, PRIMARY KEY (a, b)", lambda r: (r["a"], r["b"])),
        ],
        ids=["text", "composite"],
    )
    def test_a_table_whose_key_cannot_be_cut_is_one_chunk_and_exact(
        self, case: Case[Any], columns: str, key: Key
    ) -> None:
        db, t = case.database, case.table
        db.execute(f"CREATE TABLE {t} ({columns.format(text=db.text)})")
        text = columns.startswith("k ")
        if text:
            db.insert(t, [(f"k{g}", g) for g in range(1, 301)])
        else:
            db.insert(t, [(g % 7, f"b{g}", g) for g in range(1, 301)])
        source = case.source(chunk_size=50)
        assert db.cut(source, case.name, 50) == [ChunkSplit(case.name, 0)]
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
        names = ["k", "v"] if text else ["a", "b", "v"]
        expected = {
            key(row): row
            for row in (
                dict(zip(names, values, strict=True))
                for values in db.execute(f"SELECT {', '.join(names)} FROM {t}")
            )
        }
        assert replay(rows, key) == expected
        assert {r["op"] for r in rows} == {"r", "u", "d", "c"}

    # -- backlog ----------------------------------------------------------------------------

    def test_backlog_lasts_through_the_snapshot_and_ends_at_the_log_boundary(
        self, case: Case[Any]
    ) -> None:
        db = case.database
        make_table(db, case.table, range(1, 2001))
        source = case.source()
        harness: Harness = SourceHarness(source, 2)
        harness.settle()
        context = harness.coordinator.context
        enumerator: Any = harness.coordinator.enumerator
        assert context.is_processing_backlog
        assert enumerator.backlog_boundaries() == {}  # chunks: the held flag, no boundary
        db.execute(f"UPDATE {case.table} SET v = -1 WHERE id < 10")
        harness.poll(0, max_polls=1)
        harness.settle()
        assert context.is_processing_backlog
        db.execute(f"UPDATE {case.table} SET v = -2 WHERE id > 1990")
        end_before = db.log_end()
        harness.read_available()
        log_id = LogSplit(source.log_name, 0).split_id
        boundaries = enumerator.backlog_boundaries()
        assert list(boundaries) == [log_id]
        assert boundaries[log_id] >= end_before  # the log's end when the log started
        assert context.is_processing_backlog  # until the runtime says the boundary is reached
        harness.coordinator.handle_source_event(0, BacklogFinishedEvent((log_id,)))
        harness.settle()
        assert not context.is_processing_backlog
        harness.close()
