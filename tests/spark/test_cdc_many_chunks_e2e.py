"""A CDC snapshot of many chunks, streamed end to end against a real PostgreSQL, the table
cut as it is read (``maxChunksPerBatch``): every row exactly once, no micro-batch while the
snapshot is read that reads nothing, and an ``availableNow`` run reads the chunks cut after
its start.

The small version of ``bench/cdc_scale.py`` (100k chunks, planning time and driver memory).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.spark.support import log_ids, wait_until

from splitflow.testing.postgres import Postgres, postgres_fixture

pytestmark = pytest.mark.slow

ROWS = 20_000
CHUNK_SIZE = 10  # 2,000 chunks
CHUNKS_PER_BATCH = 100  # 20 batches


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Postgres]:
    yield from postgres_fixture(tmp_path_factory)


def snapshot(
    spark: Any, postgres: Postgres, tmp_path: Path, table: str, rows: int, sizes: tuple[int, int]
) -> tuple[Any, Path, Path]:
    """A query of a new ``table`` of ``rows`` rows (``id`` 1..rows) into a Parquet sink, at
    ``sizes`` = (``chunkSize``, ``maxChunksPerBatch``), to be started with the caller's
    trigger; the query's writer, the sink and the checkpoint."""
    postgres.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, v int NOT NULL)")
    postgres.execute(f"INSERT INTO {table} SELECT g, g % 1000 FROM generate_series(1, {rows}) g")
    postgres.execute(f"ANALYZE {table}")
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    writer = (
        spark.readStream.format("splitflow-postgres-cdc")
        .option("conninfo", postgres.conninfo())
        .option("tables", table)
        .option("slotName", f"s_{table}")
        .option("startupMode", "initial")
        .option("chunkSize", str(sizes[0]))
        .option("maxChunksPerBatch", str(sizes[1]))
        .option("parallelism", "2")
        .option("stateDir", str(tmp_path / "state"))
        .load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
    )
    return writer, out, checkpoint


def test_a_snapshot_of_2000_chunks_is_read_exactly_once_and_every_batch_reads_rows(
    spark: Any, postgres: Postgres, tmp_path: Path
) -> None:
    """20,000 rows at ``chunkSize=10``, at most 100 chunks a batch: every id once, each as a
    snapshot read (``op`` ``r``); no batch reads more than its 100 chunks, and every batch
    Spark ran between the first and the last that read rows read rows."""
    sizes = (CHUNK_SIZE, CHUNKS_PER_BATCH)
    writer, out, checkpoint = snapshot(spark, postgres, tmp_path, "many_chunks", ROWS, sizes)
    query = writer.trigger(processingTime="200 milliseconds").start()
    by_batch: dict[int, dict[str, Any]] = {}  # recentProgress keeps only the last hundred

    def snapshot_read() -> bool:
        if query.exception() is not None:
            raise AssertionError(f"the query failed: {query.exception()}")
        for p in query.recentProgress:
            by_batch[p["batchId"]] = p  # a batch's own progress comes after an idle one
        return sum(int(p["numInputRows"]) for p in by_batch.values()) >= ROWS

    try:
        wait_until(f"the snapshot's {ROWS:,} rows", snapshot_read, 120)
    finally:
        query.stop()

    rows = [(r["id"], r["op"]) for r in spark.read.parquet(str(out)).select("id", "op").collect()]
    ids = Counter(key for key, _ in rows)
    duplicates = sorted(key for key, n in ids.items() if n > 1)
    missing = sorted(set(range(1, ROWS + 1)) - ids.keys())
    assert not duplicates, f"{len(duplicates)} ids more than once, e.g. {duplicates[:10]}"
    assert not missing, f"{len(missing)} of {ROWS} ids missing, e.g. {missing[:10]}"
    assert len(rows) == ROWS
    assert {op for _, op in rows} == {"r"}

    read = {b: p["numInputRows"] for b, p in by_batch.items() if p["numInputRows"] > 0}
    assert max(read.values()) <= CHUNKS_PER_BATCH * CHUNK_SIZE, f"rows by batch: {read}"
    first, last = min(read), max(read)
    empty = [b for b in log_ids(checkpoint, "commits") if first <= b <= last and b not in read]
    assert not empty, f"batches {empty} read nothing while the snapshot was read: {read}"


def test_an_available_now_run_reads_every_chunk_of_a_table_cut_as_it_is_read(
    spark: Any, postgres: Postgres, tmp_path: Path
) -> None:
    """Most chunks are cut after an ``availableNow`` run fixed what it reads; their rows
    existed at its start, so the run reads them all: every row once, at most
    ``maxChunksPerBatch`` chunks a batch."""
    writer, out, _ = snapshot(spark, postgres, tmp_path, "available_now", 2000, (100, 3))
    query = writer.trigger(availableNow=True).start()
    assert query.awaitTermination(180), "the availableNow run did not end"
    read = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    ids = sorted(r["id"] for r in spark.read.parquet(str(out)).select("id").collect())
    assert ids == list(range(1, 2001))
    assert len(read) >= 7, read
    assert max(read) <= 300, read
