"""PostgreSQL change data capture on Spark, end to end, against a real PostgreSQL.

A writer thread inserts, updates and deletes rows all along (during the snapshot, across the
switch to the log, during the log). The job streams ``splitflow-postgres-cdc`` into Parquet
and its driver is SIGKILLed with a batch planned and not committed, then started again
(with the same or another ``parallelism``). The sink is read back in batch order (Spark's
``_spark_metadata`` log) and checked row by row:

* every key's history is whole: its first row is its snapshot read (``r``) or its insert
  (``c``), each update moves its ``version`` by exactly one, nothing follows a delete, so no
  change is lost or seen twice, across the switch and the kills;
* no row appears twice, and no key is read twice by the snapshot;
* replaying every row in order gives exactly the table as it is at the end.

The kills in the other phases, the rescale and ``spark.read`` run for every database in
``tests/spark/test_databases_cdc_e2e.py``; this module keeps what is PostgreSQL's own: the
slot's confirmed position follows what Spark committed (a kill during the log), and the
backlog flag in the query's progress.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from tests.spark.support import Job, log_ids, reported_splits, wait_until
from tests.support.cdc import Writer, replay, sink_in_batch_order
from tests.support.postgres import Postgres, postgres_fixture

pytestmark = pytest.mark.slow

ROWS = 3000


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Postgres]:
    yield from postgres_fixture(tmp_path_factory)


def check_histories(rows: list[dict[str, Any]], table: dict[int, tuple[int, str]]) -> None:
    found = replay(rows, table)
    assert not found.duplicated, found.duplicated[:10]
    assert not found.lost, found.lost[:10]


@pytest.mark.parametrize(
    ("kill_at", "parallelism_after"),
    [("log", 2)],
    ids=["during-log"],
)
def test_driver_sigkill_with_concurrent_writes_is_exactly_once(
    postgres: Postgres, tmp_path: Path, kill_at: str, parallelism_after: int
) -> None:
    table = f"orders_{kill_at}_{parallelism_after}"
    postgres.execute(
        f"CREATE TABLE {table} (id bigint PRIMARY KEY, version int NOT NULL, payload text)"
    )
    postgres.execute(
        f"INSERT INTO {table} SELECT g, 0, md5(g::text) FROM generate_series(1, {ROWS}) g"
    )
    postgres.execute(f"ANALYZE {table}")
    slot = f"s_{table}"
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    catalog, done = tmp_path / "ends.json", tmp_path / "done"
    catalog.write_text(json.dumps({"lengths": {}, "sealed": []}))

    def args(parallelism: int) -> list[str]:
        return [
            f"--catalog={catalog}",
            f"--out={out}",
            f"--checkpoint={checkpoint}",
            f"--parallelism={parallelism}",
            "--trigger=500ms",
            "--source=splitflow-postgres-cdc",
            f"--done-file={done}",
            f"--option=conninfo={postgres.conninfo()}",
            f"--option=tables={table}",
            f"--option=slotName={slot}",
            "--option=chunkSize=250",
            "--option=maxChunksPerBatch=2",
            f"--option=stateDir={tmp_path / 'state'}",
            "--option=discoveryInterval=1s",
        ]

    def offset_text(batch: int) -> str:
        return (checkpoint / "offsets" / str(batch)).read_text()

    def planned_not_committed() -> int | None:
        run1.check_alive()
        pending = set(log_ids(checkpoint, "offsets")) - set(log_ids(checkpoint, "commits"))
        committed = log_ids(checkpoint, "commits")
        for batch in sorted(pending):
            has_log = '"log:' in offset_text(batch)
            logged = [b for b in committed if '"log:' in offset_text(b)]
            if kill_at == "snapshot" and not has_log and committed:
                return batch
            if kill_at == "switch" and has_log and not logged:
                return batch
            if kill_at == "log" and has_log and len(logged) >= 2:
                return batch
        return None

    writer = Writer(postgres, table, ROWS + 1)
    writer.start()
    jobs: list[Job] = []
    try:
        run1 = Job(args(2), tmp_path / "jobs.log")
        jobs.append(run1)
        killed = wait_until(f"a batch to kill {kill_at}", planned_not_committed, 240, step=0.01)
        run1.kill()
        assert killed not in log_ids(checkpoint, "commits")
        run2 = Job(args(parallelism_after), tmp_path / "jobs.log")
        jobs.append(run2)

        def log_batches() -> int:
            run2.check_alive()
            return sum(1 for line in run2.lines if line.startswith("BATCH ") and '"log:' in line)

        wait_until("run 2's log batches", lambda: log_batches() >= 3, 240)
        writer.stop()
        end = postgres.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")[0][0]
        catalog.write_text(json.dumps({"lengths": {f"log:{slot}": int(end)}, "sealed": []}))
        done.touch()
        assert run2.finish(240) == 0, run2.lines
        assert "CAUGHT-UP" in run2.lines
        assert killed in log_ids(checkpoint, "commits"), "run 2 ran the batch killed in run 1"
        if kill_at == "snapshot":  # run 2's first plan: the unread chunks over its slots
            slots = json.loads(offset_text(killed + 1).splitlines()[2])["slots"]
            chunks = [sum(1 for s in slot if s[1]["kind"] == "chunk") for slot in slots]
            assert len(chunks) == parallelism_after
            assert min(chunks) >= 1, f"a slot without chunks to read: {chunks}"
            assert max(chunks) - min(chunks) <= 1, f"chunks unbalanced over slots: {chunks}"
    finally:
        writer.stop()
        for job in jobs:
            job.close()
    assert writer.changes > 50, "the writer made too few changes to test anything"
    secret = "s3cret-pw"  # in the jobs' arguments (the log's "$ jobs" lines), nowhere else
    for path in [*checkpoint.rglob("*"), *(tmp_path / "state").rglob("*")]:
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), f"the password is in {path}"
    logged = (tmp_path / "jobs.log").read_text().splitlines()
    assert not [line for line in logged if secret in line and not line.startswith("$ jobs")]
    final = {k: (v, p) for k, v, p in postgres.execute(f"SELECT id, version, payload FROM {table}")}
    rows = sink_in_batch_order(out)
    check_histories(rows, final)
    assert {r["op"] for r in rows} == {"r", "c", "u", "d"}
    confirmed = postgres.execute(
        "SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
        (slot,),
    )[0][0]
    first_log_lsn = min(r["lsn"] for r in rows if r["op"] != "r")
    assert confirmed > first_log_lsn, "the slot never advanced past what Spark committed"


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
