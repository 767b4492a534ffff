"""PostgreSQL change data capture on Spark, end to end, against a real PostgreSQL: what is
PostgreSQL's own. The kills in every phase (with concurrent writes, each key's history
checked), the rescale, the slot's confirmed position and ``spark.read`` run for every
database in ``tests/spark/test_databases_cdc_e2e.py``; this module checks the backlog flag
in the query's progress, and that no secret leaks.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from tests.spark.support import reported_splits, wait_until
from tests.support.cdc import Writer

from splitflow.testing.postgres import Postgres, postgres_fixture

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Postgres]:
    yield from postgres_fixture(tmp_path_factory)


class Flags:
    """The backlog flag of every batch that read rows, by batch id, gathered as the query
    runs (``recentProgress`` keeps only the last hundred)."""

    def __init__(self, query: Any) -> None:
        self.query = query
        self.by_batch: dict[int, bool] = {}

    def __call__(self) -> list[bool]:
        for p in self.query.recentProgress:
            if p["numInputRows"] > 0:
                offset = json.loads(p["sources"][0]["latestOffset"])
                self.by_batch[p["batchId"]] = bool(offset["backlog"])
        return [flag for _, flag in sorted(self.by_batch.items())]


def test_backlog_lasts_through_the_snapshot_and_the_log_up_to_its_start_and_no_secret_leaks(
    spark: Any, postgres: Postgres, tmp_path: Path
) -> None:
    """The snapshot's batches and the log's first stretch (what the WAL held when the log
    started) are backlog, then the source is at the head; changes made afterwards arrive
    as live changes. The log split's watermark is its latest change's commit time. The
    password is nowhere in offsets, state, commits or progress."""
    began = time.time()
    table = "backlog_orders"
    postgres.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, version int, payload text)")
    postgres.execute(f"INSERT INTO {table} SELECT g, 0, 'p' FROM generate_series(1, 2000) g")
    out, checkpoint, state = tmp_path / "out", tmp_path / "checkpoint", tmp_path / "state"
    writer = Writer(postgres, table, 2001)
    writer.start()  # changes while the snapshot is read: the log's backlog
    query = (
        spark.readStream.format("splitflow-postgres-cdc")
        .option("conninfo", postgres.conninfo())
        .option("tables", table)
        .option("slotName", "s_backlog")
        .option("chunkSize", "200")
        .option("maxChunksPerBatch", "2")
        .option("stateDir", str(state))
        .load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    seen = Flags(query)
    try:
        wait_until("the snapshot", lambda: len(seen()) >= 3, 120)
        writer.stop()

        def live() -> bool:  # a change, so that a batch reads rows and reports its flag
            postgres.execute(f"UPDATE {table} SET version = version + 1 WHERE id = 1")
            return seen()[-1] is False

        wait_until("a batch at the head", live, 120, step=1.0)

        def log_watermark() -> str | None:  # a batch's reports come with the next batch
            postgres.execute(f"UPDATE {table} SET version = version + 1 WHERE id = 2")
            split = reported_splits(query.lastProgress).get("log:s_backlog", {})
            return split.get("watermark")

        watermark = wait_until("the log split's watermark", log_watermark, 60, step=1.0)
        assert began - 1 <= datetime.fromisoformat(watermark).timestamp() <= time.time()
        progress = repr(query.recentProgress)
    finally:
        writer.stop()
        query.stop()
    flags = seen()
    assert flags[0] is True
    assert flags[-1] is False
    assert flags == sorted(flags, reverse=True), f"backlog must end once: {flags}"
    snapshot_batches = sum(1 for f in flags if f)
    assert snapshot_batches >= 5, f"10 chunks, 2 per batch, all in backlog: {flags}"
    secret = "s3cret-pw"
    assert secret in postgres.conninfo()
    assert secret not in progress
    for path in [*checkpoint.rglob("*"), *state.rglob("*")]:
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), f"the password is in {path}"
