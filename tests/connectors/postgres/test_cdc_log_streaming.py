"""A log slice streams through the CDC split reader one piece per fetch (project issue 23).

Against a real PostgreSQL: a slot, a publication and transactions of a few rows each, read
as a planned slice ``[start, stop)`` by :class:`CdcSplitReader` with small piece sizes
(``ROWS_PER_BATCH``, ``PIECE_BYTES`` patched down). Each fetch returns one piece of whole
transactions; a piece moves the position to just after its last commit, the last one to the
stop; the peek does not consume; the chunk filter applies in every piece; and the cursor's
transaction ends when the slice ends, when the split is removed and when the reader closes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from splitflow.connectors.postgres import catalog
from splitflow.connectors.postgres import reader as reader_module
from splitflow.connectors.postgres.options import PostgresOptions
from splitflow.connectors.postgres.pinning import parse_snapshot
from splitflow.connectors.postgres.reader import CdcSplitReader, Piece, Pinned
from splitflow.connectors.postgres.source import PostgresCdcSource
from splitflow.connectors.postgres.splits import ChunkMark, LogSplit, mark_tuple
from splitflow.errors import DataLossError
from splitflow.reader.split_reader import SplitSlice
from splitflow.testing.postgres import Postgres

_names = itertools.count()


class Log:
    """A table ``(id bigint PRIMARY KEY, v int, w text)``, its publication and slot."""

    def __init__(self, postgres: Postgres) -> None:
        n = next(_names)
        self.pg = postgres
        self.table = f"log_stream{n}"
        self.slot = f"log_stream{n}"
        postgres.execute(f"CREATE TABLE {self.table} (id bigint PRIMARY KEY, v int, w text)")
        postgres.execute(f"CREATE PUBLICATION {self.slot} FOR TABLE {self.table}")
        rows = postgres.execute(
            "SELECT lsn - '0/0'::pg_lsn FROM pg_create_logical_replication_slot(%s, 'pgoutput')",
            (self.slot,),
        )
        self.start = int(rows[0][0])
        self.next_id = 1
        options = PostgresOptions.parse(
            {"conninfo": postgres.conninfo(), "tables": self.table, "slotName": self.slot}
        )
        with catalog.connect(options, autocommit=True) as conn:
            table = catalog.describe_table(conn, f"public.{self.table}", options)
        self.source = PostgresCdcSource(options, [table])

    def write(self, transactions: int, rows: int, width: int = 10) -> None:
        """``transactions`` transactions of ``rows`` inserted rows each."""
        with self.pg.connect() as conn:
            for _ in range(transactions):
                with conn.transaction():
                    for _ in range(rows):
                        conn.execute(
                            f"INSERT INTO {self.table} VALUES (%s, 0, %s)",
                            (self.next_id, "x" * width),
                        )
                        self.next_id += 1

    def insert_position(self) -> int:
        return int(self.pg.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")[0][0])

    def reader(self, stop: int, marks: tuple[ChunkMark, ...] = ()) -> CdcSplitReader:
        split_reader = CdcSplitReader(self.source, Pinned())
        split = LogSplit(self.slot, self.start, tuple(mark_tuple(m) for m in marks))
        split_reader.handle_splits_changes([SplitSlice(split, stop)])
        return split_reader

    @property
    def split_id(self) -> str:
        return LogSplit(self.slot, self.start).split_id

    def log_backends(self) -> list[str]:
        """The states of the server's sessions that hold the log's cursor."""
        rows = self.pg.execute(
            "SELECT state FROM pg_stat_activity WHERE query LIKE %s AND pid <> pg_backend_pid()",
            ("%splitflow_log%",),
        )
        return [str(state) for (state,) in rows]

    def drop(self) -> None:
        self.pg.execute("SELECT pg_drop_replication_slot(%s)", (self.slot,))
        self.pg.execute(f"DROP PUBLICATION {self.slot}")


@pytest.fixture
def log(postgres: Postgres) -> Iterator[Log]:
    made = Log(postgres)
    yield made
    made.drop()


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces of about 10 rows (or 1 KB of messages)."""
    monkeypatch.setattr(reader_module, "ROWS_PER_BATCH", 10)
    monkeypatch.setattr(reader_module, "PIECE_BYTES", 1024)


def fetch_all(split_reader: CdcSplitReader, split_id: str) -> list[list[Piece]]:
    """Fetch until the split finishes; the pieces each fetch returned."""
    fetches = []
    for _ in range(10_000):
        out = split_reader.fetch()
        fetches.append(out.records.get(split_id, []))
        if split_id in out.finished:
            return fetches
    raise AssertionError("the slice never finished")


def ids(pieces: list[Piece]) -> list[int]:
    return [
        i for piece in pieces for batch in piece.batches for i in batch.column("id").to_pylist()
    ]


def lsns(piece: Piece) -> list[int]:
    return [lsn for batch in piece.batches for lsn in batch.column("lsn").to_pylist()]


def test_each_fetch_returns_one_piece_that_ends_after_a_whole_transaction(
    log: Log, small_pieces: None
) -> None:
    log.write(transactions=20, rows=3)
    stop = log.insert_position()
    split_reader = log.reader(stop)
    try:
        fetches = fetch_all(split_reader, log.split_id)
    finally:
        split_reader.close()
    assert all(len(pieces) == 1 for pieces in fetches), [len(p) for p in fetches]
    pieces = [p for (p,) in fetches]
    # 60 rows in transactions of 3: a piece is cut after the commit that brings it to 10 rows
    assert [sum(b.num_rows for b in p.batches) for p in pieces] == [12, 12, 12, 12, 12, 0]
    for piece in pieces[:-1]:
        assert piece.next_position == max(lsns(piece)) + 1  # just after its last commit
    assert pieces[-1].next_position == stop
    assert ids(pieces) == list(range(1, 61))


def test_a_piece_is_also_cut_by_bytes(log: Log, small_pieces: None) -> None:
    log.write(transactions=6, rows=1, width=2000)  # 2 KB messages: over a piece's 1 KB
    split_reader = log.reader(log.insert_position())
    try:
        fetches = fetch_all(split_reader, log.split_id)
    finally:
        split_reader.close()
    assert [sum(b.num_rows for p in f for b in p.batches) for f in fetches] == [1] * 6 + [0]


def test_a_transaction_larger_than_a_piece_comes_whole_in_one_piece(
    log: Log, small_pieces: None
) -> None:
    log.write(transactions=1, rows=5)
    log.write(transactions=1, rows=50)
    log.write(transactions=1, rows=5)
    split_reader = log.reader(log.insert_position())
    try:
        fetches = fetch_all(split_reader, log.split_id)
    finally:
        split_reader.close()
    assert [sum(b.num_rows for p in f for b in p.batches) for f in fetches] == [55, 5]


def test_the_peek_does_not_consume_and_a_slice_reads_the_same_twice(
    log: Log, small_pieces: None
) -> None:
    log.write(transactions=10, rows=4)
    stop = log.insert_position()
    log.write(transactions=3, rows=4)  # past the stop: in neither read
    reads = []
    for _ in range(2):
        split_reader = log.reader(stop)
        try:
            fetches = fetch_all(split_reader, log.split_id)
        finally:
            split_reader.close()
        reads.append([(p.next_position, ids([p])) for f in fetches for p in f])
    assert reads[0] == reads[1]
    assert [i for _, piece in reads[0] for i in piece] == list(range(1, 41))


def test_the_chunk_filter_leaves_out_what_a_chunk_held_in_every_piece(
    log: Log, small_pieces: None
) -> None:
    log.write(transactions=8, rows=3)  # ids 1-24: committed before the chunk's snapshot
    ((text, high),) = log.pg.execute(
        "SELECT pg_current_snapshot()::text, pg_current_wal_insert_lsn() - '0/0'::pg_lsn"
    )
    xmin, xmax, xip = parse_snapshot(text)
    table = f"public.{log.table}"
    mark = ChunkMark(f"{table}:0", table, None, None, xmin, xmax, xip, int(high))
    log.write(transactions=8, rows=3)  # ids 25-48: after it
    split_reader = log.reader(log.insert_position(), (mark,))
    try:
        fetches = fetch_all(split_reader, log.split_id)
    finally:
        split_reader.close()
    assert ids([p for f in fetches for p in f]) == list(range(25, 49))
    assert len(fetches) > 2, "the slice should come in several pieces"


def test_the_cursor_transaction_ends_with_the_slice(log: Log, small_pieces: None) -> None:
    log.write(transactions=10, rows=3)
    split_reader = log.reader(log.insert_position())
    try:
        split_reader.fetch()
        assert log.log_backends() == ["idle in transaction"]  # between two fetches
        fetch_all(split_reader, log.split_id)
        assert log.log_backends() in ([], ["idle"])
    finally:
        split_reader.close()


def test_removing_the_split_mid_slice_rolls_its_cursor_transaction_back(
    log: Log, small_pieces: None
) -> None:
    log.write(transactions=10, rows=3)
    stop = log.insert_position()
    split_reader = log.reader(stop)
    try:
        split_reader.fetch()
        assert log.log_backends() == ["idle in transaction"]
        split_reader.remove_splits([log.split_id])
        assert log.log_backends() in ([], ["idle"])
        assert split_reader.fetch().is_empty()
        # added again, it reads the slice from the split's position, on the same connection
        split = LogSplit(log.slot, log.start)
        split_reader.handle_splits_changes([SplitSlice(split, stop)])
        fetches = fetch_all(split_reader, log.split_id)
    finally:
        split_reader.close()
    assert ids([p for f in fetches for p in f]) == list(range(1, 31))


def test_closing_the_reader_mid_slice_ends_its_session(log: Log, small_pieces: None) -> None:
    log.write(transactions=10, rows=3)
    split_reader = log.reader(log.insert_position())
    split_reader.fetch()
    assert log.log_backends() == ["idle in transaction"]
    split_reader.close()

    def gone() -> bool:
        return log.log_backends() == []

    for _ in range(100):  # the server notices the closed connection at once, almost
        if gone():
            break
        log.pg.execute("SELECT pg_sleep(0.01)")
    assert gone(), log.log_backends()


def test_a_slice_without_a_stop_reads_to_the_insert_position_piece_by_piece(
    log: Log, small_pieces: None
) -> None:
    log.write(transactions=10, rows=3)
    split_reader = CdcSplitReader(log.source, Pinned())
    split_reader.handle_splits_changes([SplitSlice(LogSplit(log.slot, log.start))])
    got: list[Piece] = []
    try:
        for _ in range(20):
            out: Any = split_reader.fetch()
            got += out.records.get(log.split_id, [])
        assert ids(got) == list(range(1, 31))
        log.write(transactions=2, rows=3)  # the next slice
        for _ in range(20):
            got += split_reader.fetch().records.get(log.split_id, [])
    finally:
        split_reader.close()
    assert ids(got) == list(range(1, 37))


def test_a_slot_advanced_past_the_slice_start_by_another_client_fails_the_read(
    log: Log,
) -> None:
    """A peek starts at the slot's confirmed position: a second read of a slice after
    someone else advanced the slot would silently miss the slice's first changes."""
    log.write(transactions=3, rows=2)
    stop = log.insert_position()
    first = log.reader(stop)
    try:
        assert len(ids([p for ps in fetch_all(first, log.split_id) for p in ps])) == 6
    finally:
        first.close()
    log.pg.execute(
        "SELECT pg_replication_slot_advance(%s, pg_current_wal_insert_lsn())", (log.slot,)
    )
    second = log.reader(stop)
    try:
        with pytest.raises(DataLossError) as failure:
            fetch_all(second, log.split_id)
    finally:
        second.close()
    message = str(failure.value)
    assert f"replication slot {log.slot}" in message
    assert "past this slice's start" in message
    assert failure.value.split_id == log.split_id
