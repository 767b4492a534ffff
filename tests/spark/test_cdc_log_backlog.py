"""The CDC source bounds a micro-batch to 64 MiB of WAL by default (project issue 23).

The first log batch after a snapshot used to hold every change made during the snapshot,
in one task. Against a real PostgreSQL, a table is snapshotted in chunks while another
connection writes over 200 MB of WAL (wide updates, 500 rows per transaction); a lock on a
second table holds the snapshot's last chunk until the writer is done, so all of it is
backlog when the log starts. Read with the defaults, the log comes in several batches, each
at most 64 MiB of WAL (the offsets in the checkpoint say where each batch started and
stopped), and every update arrives exactly once: per key, its snapshot row, then each
version once, up to the table's. The fast tests check that any batch option the user gives
replaces the default whole.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.spark.support import log_ids, logged_offset, reported_splits, wait_until

from splitflow.spark.limits import MaxBytes
from splitflow.spark.options import RuntimeOptions
from splitflow.testing.postgres import Postgres, postgres_fixture

DEFAULT = 64 * 1024 * 1024
WAL = 200 * 1024 * 1024
ROWS = 2000
WIDTH = 1792  # characters of payload: about 1.9 KB of WAL per updated row, not TOASTed


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Postgres]:
    yield from postgres_fixture(tmp_path_factory)


def make_table(postgres: Postgres, table: str, rows: int = ROWS) -> None:
    postgres.execute(
        f"CREATE TABLE {table} (id bigint PRIMARY KEY, version int NOT NULL, payload text)"
    )
    postgres.execute(
        f"INSERT INTO {table} SELECT g, 0, (SELECT string_agg(md5(g::text || h), '') "
        f"FROM generate_series(1, {WIDTH // 32}) h) FROM generate_series(1, {rows}) g"
    )
    postgres.execute(f"ANALYZE {table}")


@pytest.fixture(scope="module")
def small(postgres: Postgres) -> str:
    make_table(postgres, "bound_small", rows=10)
    return "bound_small"


def data_source(postgres: Postgres, table: str, **options: str) -> Any:
    """``PostgresCdcDataSource`` as Spark makes it at ``load()`` (keys lower-cased)."""
    from splitflow.spark.postgres import PostgresCdcDataSource

    given = {"conninfo": postgres.conninfo(), "tables": table, "slotName": "unused", **options}
    return PostgresCdcDataSource({key.lower(): value for key, value in given.items()})


# -- the default, and what replaces it ---------------------------------------------------------


def test_the_cdc_source_reads_at_most_64_mib_of_wal_per_batch_by_default(
    postgres: Postgres, small: str
) -> None:
    from pyspark.sql.streaming.datasource import ReadMaxBytes

    from splitflow.spark.datasource import SplitflowStreamReader
    from splitflow.spark.postgres import PostgresCdcDataSource

    assert PostgresCdcDataSource.DEFAULT_MAX_BYTES_PER_BATCH == DEFAULT
    # maxChunksPerBatch and parallelism size no micro-batch of the log: the default holds
    source = data_source(postgres, small, maxChunksPerBatch="2", parallelism="3")
    assert source.runtime.read_limit() == MaxBytes(DEFAULT)
    limit = SplitflowStreamReader(source).getDefaultReadLimit()
    assert isinstance(limit, ReadMaxBytes)
    assert limit.max_bytes == DEFAULT


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("maxRecordsPerBatch", "1000"),
        ("maxBytesPerBatch", "1g"),
        ("backlogMaxRecordsPerBatch", "1000"),
        ("backlogMaxBytesPerBatch", "1g"),
        ("minRecordsPerBatch", "10"),
    ],
)
def test_any_batch_option_replaces_the_default_whole(
    postgres: Postgres, small: str, option: str, value: str
) -> None:
    source = data_source(postgres, small, **{option: value})
    assert source.runtime == RuntimeOptions.parse({option.lower(): value})
    assert source.runtime.max_bytes_per_batch == (1024**3 if option == "maxBytesPerBatch" else None)


def test_spark_read_of_the_snapshot_is_not_limited(postgres: Postgres, small: str) -> None:
    """A batch read plans one batch of everything; the default bounds streams only."""
    from splitflow.spark.datasource import SplitflowBatchReader

    source = data_source(postgres, small, chunkSize="3")
    partitions = SplitflowBatchReader(source).partitions()
    assert sum(len(p.entries()) for p in partitions) == 4  # every chunk of 10 rows by 3


# -- a 200 MB backlog on Spark -----------------------------------------------------------------


def wal_position(postgres: Postgres) -> int:
    return int(postgres.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")[0][0])


def log_slices(checkpoint: Path, state_dir: Path) -> dict[int, tuple[int, int]]:
    """Batch id -> the log split's planned slice ``(start, stop)``, from the offsets."""
    slices = {}
    for batch in log_ids(checkpoint, "offsets"):
        offset = logged_offset(checkpoint, batch, state_dir)
        for slot in offset["slots"]:
            for _, split, start, stop, *_ in slot:
                if split["kind"] == "log":
                    slices[batch] = (int(start), int(stop))
    return slices


def chunk_batch(checkpoint: Path, state_dir: Path, table: str) -> int | None:
    """The batch that reads ``table``'s (only) chunk, once planned."""
    for batch in log_ids(checkpoint, "offsets"):
        offset = logged_offset(checkpoint, batch, state_dir)
        for slot in offset["slots"]:
            for _, split, start, stop, *_ in slot:
                if split.get("table") == f"public.{table}" and stop > start:
                    return batch
    return None


@pytest.mark.slow
def test_a_wal_backlog_built_during_the_snapshot_is_read_in_bounded_batches_exactly_once(
    spark: Any, postgres: Postgres, tmp_path: Path
) -> None:
    wide, gate, slot = "a_backlog_wide", "z_backlog_gate", "s_backlog"
    make_table(postgres, wide)
    postgres.execute(f"CREATE TABLE {gate} (id bigint PRIMARY KEY)")
    postgres.execute(f"INSERT INTO {gate} VALUES (-1)")
    batches: dict[int, list[tuple[str, int, int]]] = {}

    def sink(frame: Any, batch_id: int) -> None:
        rows = frame.where(f"`table` = 'public.{wide}'").select("op", "id", "version").collect()
        batches[batch_id] = [(r["op"], r["id"], r["version"]) for r in rows]

    checkpoint = tmp_path / "checkpoint"
    query = (
        spark.readStream.format("splitflow-postgres-cdc")
        .option("conninfo", postgres.conninfo())
        .option("tables", f"{wide}, {gate}")
        .option("slotName", slot)
        .option("stateDir", str(tmp_path / "state"))
        .option("chunkSize", "1000")  # the wide table's two chunks, then the gate's
        .option("maxChunksPerBatch", "1")  # one a batch, so the gate's comes last
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="1 second")
        .start()
    )

    def check() -> bool:
        if query.exception() is not None:
            raise AssertionError(f"the query failed: {query.exception()}")
        return True

    def log_position() -> int:
        check()
        split = reported_splits(query.lastProgress).get(f"log:{slot}")
        return -1 if split is None else int(split["position"])

    lock = postgres.connect(autocommit=False)
    try:
        # The first batch is planned: the slot exists and the chunks are cut; the gate's
        # chunk comes after the wide table's, a batch (a second) later at the earliest.
        wait_until("the first batch", lambda: check() and log_ids(checkpoint, "offsets"), 120)
        lock.execute(f"LOCK TABLE {gate} IN ACCESS EXCLUSIVE MODE")
        # The gate's batch waits for the lock, and the batches before it have read the wide
        # table's chunks: every change the writer makes comes through the log.
        held = wait_until(
            "the gate's batch",
            lambda: check() and chunk_batch(checkpoint, tmp_path / "state", gate),
            60,
        )
        wait_until(
            "the wide table", lambda: check() and held - 1 in log_ids(checkpoint, "commits"), 60
        )
        ((start,),) = postgres.execute(
            "SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (slot,),
        )
        updates = 0
        with postgres.connect() as writer:
            while wal_position(postgres) - int(start) < WAL:
                writer.execute(
                    f"UPDATE {wide} SET version = version + 1, "
                    "payload = overlay(payload placing md5(random()::text) from 1) "
                    "WHERE id %% 4 = %s",
                    (updates % 4,),
                )
                updates += 1
        end = wal_position(postgres)
        assert log_position() == -1, "the snapshot ended before the writer did"
        lock.rollback()  # the gate's chunk is read: the snapshot ends, the log starts
        wait_until("the log to catch up", lambda: log_position() >= end, 240, step=0.2)
    finally:
        lock.close()
        query.stop()

    slices = {b: s for b, s in log_slices(checkpoint, tmp_path / "state").items() if s[1] > s[0]}
    spans = [stop - position for position, stop in slices.values()]
    assert all(span <= DEFAULT for span in spans), spans
    assert len(spans) >= math.ceil((end - int(start)) / DEFAULT) >= 4, spans
    full = [stop - position for position, stop in slices.values() if position + DEFAULT <= end]
    assert full == [DEFAULT] * len(full), "a batch with 64 MiB of backlog reads 64 MiB"
    assert min(p for p, _ in slices.values()) == int(start)  # the log read it all
    assert max(s for _, s in slices.values()) >= end

    rows = [row for batch in sorted(batches) for row in batches[batch]]
    final = dict(postgres.execute(f"SELECT id, version FROM {wide}"))
    snapshot = {key: version for op, key, version in rows if op == "r"}
    assert sorted(key for op, key, _ in rows if op == "r") == sorted(final), "one r per key"
    changes = Counter((key, version) for op, key, version in rows if op != "r")
    assert {op for op, _, _ in rows} == {"r", "u"}
    assert max(changes.values()) == 1, [c for c, n in changes.items() if n > 1][:10]
    expected = {(k, v) for k, last in final.items() for v in range(snapshot[k] + 1, last + 1)}
    assert set(changes) == expected, f"lost: {sorted(expected - set(changes))[:10]}"
    assert len(changes) == updates * ROWS // 4  # about 105,000 updates in 200 MB of WAL
    in_log = sum(len(batches.get(b, ())) for b in slices)
    assert in_log == len(changes), "every change came in a log batch"
