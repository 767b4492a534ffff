"""A batch's chunks read in the snapshot the driver pinned for it, against a real PostgreSQL.

Spark reads a micro-batch again for each action on it in ``foreachBatch`` (and for retried,
speculative and recomputed tasks). Every read of a chunk must give the same rows and the
same watermark, whatever was committed between the reads: the driver exports one snapshot
per batch (:class:`~splitflow.connectors.postgres.pinning.SnapshotPinner`) and each task's
reader imports it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from tests.connectors.cdc.database import read_slice
from tests.connectors.postgres.test_cdc_harness import load

from splitflow.api.events import SourceEvent
from splitflow.connectors.postgres.pinning import BatchSnapshot, SnapshotPinner
from splitflow.connectors.postgres.source import PostgresCdcSource
from splitflow.connectors.postgres.splits import ChunkReadEvent, ChunkSplit, LogSplit
from splitflow.errors import ConnectorError
from splitflow.testing.postgres import Postgres

TABLE = "pinned_orders"


@pytest.fixture
def source(postgres: Postgres) -> Iterator[PostgresCdcSource]:
    postgres.execute(f"DROP TABLE IF EXISTS {TABLE}")
    postgres.execute(f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, version int NOT NULL)")
    postgres.execute(f"INSERT INTO {TABLE} SELECT g, 0 FROM generate_series(1, 1000) g")
    yield load(postgres, tables=TABLE, chunkSize="400", slotName="never_made")
    postgres.execute(f"DROP TABLE {TABLE}")


def read(
    source: PostgresCdcSource, split: ChunkSplit, pin: SourceEvent | None
) -> tuple[list[tuple[Any, ...]], list[SourceEvent]]:
    """:func:`read_slice`, its rows sorted."""
    rows, events = read_slice(source, split, pin)
    return sorted(rows), events


def chunk() -> ChunkSplit:
    return ChunkSplit(f"public.{TABLE}", 0, "id", None, 500)


def test_every_read_of_a_pinned_batch_gives_the_same_rows_and_watermark(
    source: PostgresCdcSource, postgres: Postgres
) -> None:
    pinner = SnapshotPinner(source.options)
    try:
        pin = pinner.pin(1, [chunk()])
        assert isinstance(pin, BatchSnapshot)
        first = read(source, chunk(), pin)
        postgres.execute(f"UPDATE {TABLE} SET version = version + 1 WHERE id <= 10")
        postgres.execute(f"DELETE FROM {TABLE} WHERE id = 20")
        postgres.execute(f"INSERT INTO {TABLE} VALUES (0, 7)")
        assert pinner.pin(1, [chunk()]) == pin, "a batch keeps its pin while it runs"
        second = read(source, chunk(), pin)
    finally:
        pinner.close()
    assert second == first
    rows, events = first
    assert len(rows) == 499
    assert {lsn for *_, lsn in rows} == {pin.at}
    (mark,) = [e.mark for e in events if isinstance(e, ChunkReadEvent)]
    assert (mark.xmin, mark.xmax, mark.xip, mark.high) == (pin.xmin, pin.xmax, pin.xip, pin.at)


def test_without_a_pin_each_read_takes_its_own_snapshot(
    source: PostgresCdcSource, postgres: Postgres
) -> None:
    """What the pin prevents: a read after a commit sees it, with another watermark."""
    first = read(source, chunk(), None)
    postgres.execute(f"UPDATE {TABLE} SET version = version + 1 WHERE id <= 10")
    second = read(source, chunk(), None)
    assert second[0] != first[0]
    assert second[1] != first[1]


def test_a_released_pin_fails_the_read_naming_the_chunk_and_the_snapshot(
    source: PostgresCdcSource,
) -> None:
    pinner = SnapshotPinner(source.options)
    pin = pinner.pin(3, [chunk()])
    assert pin is not None
    pinner.release(3)
    with pytest.raises(ConnectorError) as failure:
        read(source, chunk(), pin)
    message = str(failure.value)
    assert f"chunk public.{TABLE}#0" in message
    assert pin.snapshot_id in message
    assert "restart the query" in message
    assert "s3cret-pw" not in message


def test_a_pin_lost_while_its_batch_runs_fails_the_batch_and_a_restart_pins_anew(
    source: PostgresCdcSource, postgres: Postgres
) -> None:
    """Some reads may have seen the lost snapshot: a new one would read other rows, so the
    batch fails (the query restarts, and its replay pins a new snapshot)."""
    pinner = SnapshotPinner(source.options)
    try:
        pin = pinner.pin(4, [chunk()])
        assert pin is not None
        postgres.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE state = 'idle in transaction' AND query LIKE '%pg_export_snapshot%'"
        )
        with pytest.raises(ConnectorError, match="restart the query"):
            read(source, chunk(), pin)
        with pytest.raises(ConnectorError) as failure:
            pinner.pin(4, [chunk()])
        assert pin.where in str(failure.value)
        assert "restart the query" in str(failure.value)
    finally:
        pinner.close()
    restarted = SnapshotPinner(source.options)
    try:
        again = restarted.pin(4, [chunk()])
        assert again is not None
        assert again.snapshot_id != pin.snapshot_id
        assert len(read(source, chunk(), again)[0]) == 499
    finally:
        restarted.close()


@pytest.mark.parametrize(
    "rewrite",
    [f"TRUNCATE {TABLE}", f"ALTER TABLE {TABLE} ALTER COLUMN version TYPE bigint"],
    ids=["truncate", "alter-table-rewrite"],
)
def test_a_table_rewritten_after_the_pin_fails_the_read_instead_of_reading_it_empty(
    source: PostgresCdcSource, postgres: Postgres, rewrite: str
) -> None:
    """TRUNCATE and a rewriting ALTER TABLE are not MVCC-safe: an older snapshot would read
    the new, empty storage, and every later read of the batch would differ from the first."""
    pinner = SnapshotPinner(source.options)
    try:
        pin = pinner.pin(8, [chunk()])
        assert pin is not None
        assert len(read(source, chunk(), pin)[0]) == 499
        postgres.execute(rewrite)
        with pytest.raises(ConnectorError) as failure:
            read(source, chunk(), pin)
    finally:
        pinner.close()
    message = str(failure.value)
    assert f"chunk public.{TABLE}#0: table {TABLE} was truncated or rewritten" in message
    assert pin.where in message
    assert "restart the query" in message


def test_a_batch_that_reads_only_the_log_pins_nothing(source: PostgresCdcSource) -> None:
    pinner = SnapshotPinner(source.options)
    assert pinner.pin(5, [LogSplit("slot", 0)]) is None
    pinner.close()


def test_release_frees_the_batches_up_to_the_one_completed(
    source: PostgresCdcSource, postgres: Postgres
) -> None:
    def held(expected: int) -> int:
        """Transactions that hold an exported snapshot, once they are ``expected`` or 5 s
        passed (a closed connection's backend exits a moment after the client closed it)."""
        for _ in range(50):
            rows = postgres.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction' "
                "AND query LIKE '%pg_export_snapshot%'"
            )
            if int(rows[0][0]) == expected:
                break
            time.sleep(0.1)
        return int(rows[0][0])

    pinner = SnapshotPinner(source.options)
    pinner.pin(6, [chunk()])
    pinner.pin(7, [chunk()])
    assert held(2) == 2
    pinner.release(6)
    assert held(1) == 1
    pinner.close()
    assert held(0) == 0


class MemoryChunks:
    """:class:`~splitflow.connectors.cdc.reader.KeptChunks` in memory (the Spark runtime's
    is ``splitflow.spark.cdc.StoreChunks``, in ``stateDir``)."""

    def __init__(self) -> None:
        self.kept: dict[tuple[int, str], bytes] = {}

    def get(self, batch: int, split_id: str) -> bytes | None:
        return self.kept.get((batch, split_id))

    def put_first(self, batch: int, split_id: str, content: bytes) -> bytes:
        return self.kept.setdefault((batch, split_id), content)

    def drop_through(self, batch: int, pinned: Any) -> None:
        self.kept = {k: v for k, v in self.kept.items() if k[0] > batch}


def test_a_batch_replayed_under_a_new_pin_returns_the_chunks_its_first_reads_kept(
    source: PostgresCdcSource, postgres: Postgres
) -> None:
    """A driver crash ends the exported snapshot: the restarted driver pins the batch anew,
    but with the chunk reads kept (``stateDir``) the replay returns what the first
    evaluation read, rows and watermark; another batch reads afresh; a completed batch's
    reads are forgotten at the release."""
    kept = MemoryChunks()
    source.kept_chunks = kept
    first_driver = SnapshotPinner(source.options, kept)
    try:
        first = read(source, chunk(), first_driver.pin(3, [chunk()]))
    finally:
        first_driver.close()  # the crash: its snapshot is gone
    postgres.execute(f"UPDATE {TABLE} SET version = version + 1 WHERE id <= 10")
    restarted = SnapshotPinner(source.options, kept)
    try:
        replay_pin = restarted.pin(3, [chunk()])
        replayed = read(source, chunk(), replay_pin)
        later = read(source, chunk(), restarted.pin(4, [chunk()]))
        restarted.release(3)
    finally:
        restarted.close()
        source.kept_chunks = None
    assert replayed == first
    assert later != first  # batch 4 reads the table as it is now
    assert [b for b, _ in kept.kept] == [4]
