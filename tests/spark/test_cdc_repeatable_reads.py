"""Every read of a planned CDC batch returns the same rows (project issue 23).

Spark evaluates a micro-batch more than once: each action on it in ``foreachBatch`` (write
then count, count then write, two writes), a ``MERGE``, a retried task, a batch replayed
after a crash. A snapshot chunk's rows must then come from one MVCC snapshot, the same in
every read, and the chunk's watermark (the snapshot the log's filter uses) must be that
snapshot: if the rows written came from one read and the watermark from a later one, the
log would skip the changes committed between the two, and the sink would lose them.

Against a real PostgreSQL, with a writer inserting, updating and deleting rows all through
the snapshot (3000 rows, chunks of 250, two chunks per batch, ``parallelism`` 2), a stream
into a ``foreachBatch`` sink (:class:`tests.spark.jobs.ForeachBatchSink`) that reads every
batch twice, in each order, and once with the second read's tasks failed once and retried;
then a driver SIGKILLed between the two reads of a snapshot batch and started again. The
sink is read back batch by batch and replayed key by key (:func:`tests.support.cdc.replay`):
no change lost or seen twice, and the rebuilt table equals the final table. Besides, every
read of a batch saw as many rows as were written, and a second write equals the first.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.spark.cdc_jobs import (
    OPTIONS,
    ROWS,
    finish,
    job_args,
    make_table,
    postgres_log,
    wal_end,
)
from tests.spark.cluster import StandaloneCluster, standalone_cluster
from tests.spark.jobs import ForeachBatchSink
from tests.spark.support import (
    Job,
    kill_before_commit,
    log_ids,
    log_position,
    logged_offset,
    wait_until,
)
from tests.support.cdc import (
    Writer,
    batch_folders,
    batch_rows,
    replay,
    sink_in_batch_order,
    table_rows,
)

from splitflow.testing.postgres import Postgres, postgres_fixture

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Postgres]:
    yield from postgres_fixture(tmp_path_factory)


def check_replay(out: Path, final: dict[int, tuple[int, str]]) -> list[dict[str, Any]]:
    rows = sink_in_batch_order(out)
    found = replay(rows, final)
    summary = f"lost={len(found.lost)} duplicated={len(found.duplicated)} of {found.keys} keys"
    assert not found.lost, f"{summary}: {found.lost[:10]}"
    assert not found.duplicated, f"{summary}: {found.duplicated[:10]}"
    assert {r["op"] for r in rows} == {"r", "c", "u", "d"}
    return rows


@pytest.mark.parametrize(
    ("mode", "fail_once"),
    [("write-count", False), ("count-write", False), ("write-twice", False), ("write-count", True)],
    ids=["write-count", "count-write", "write-twice", "write-count-retried"],
)
def test_every_read_of_a_batch_sees_one_snapshot_and_no_change_is_lost(
    spark: Any, postgres: Postgres, tmp_path: Path, mode: str, fail_once: bool
) -> None:
    table = f"rr_{mode.replace('-', '_')}{'_retried' if fail_once else ''}"
    slot = f"s_{table}"
    make_table(postgres, table)
    out = tmp_path / "out"
    sink = ForeachBatchSink(mode, out, fail_once)
    writer = Writer(postgres, table, ROWS + 1)
    writer.start()
    reader = (
        spark.readStream.format("splitflow-postgres-cdc")
        .option("conninfo", postgres.conninfo())
        .option("tables", table)
        .option("slotName", slot)
        .option("parallelism", "2")
        .option("stateDir", str(tmp_path / "state"))
    )
    for key, value in OPTIONS.items():
        reader = reader.option(key, value)
    query = (
        reader.load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )

    def log_at() -> int | None:
        return log_position(query, slot)

    try:
        wait_until("the end of the snapshot", lambda: log_at() is not None, 150)
        began = log_at()
        wait_until("a log batch", lambda: (log_at() or 0) > began, 60)
        writer.stop()
        end = wal_end(postgres)
        wait_until("the log to catch up", lambda: (log_at() or 0) >= end, 60)
    finally:
        writer.stop()
        query.stop()
    assert writer.changes > 100, "the writer made too few changes to test anything"
    check_replay(out, table_rows(postgres, table))
    folders = batch_folders(out)
    cut = sorted(set(folders) - sink.finished)  # the stop may land in the newest batch's call
    assert cut in ([], [max(folders)]), f"batches {cut}: written, their foreachBatch unfinished"
    folders = {b: folder for b, folder in folders.items() if b in sink.finished}
    if mode != "write-twice":
        written = {b: len(batch_rows(folder)) for b, folder in folders.items()}
        differ = {b: (sink.counts.get(b), n) for b, n in written.items() if sink.counts.get(b) != n}
        assert not differ, f"batch -> (rows counted, rows written) where they differ: {differ}"
    else:
        again = batch_folders(out / "again")
        assert again.keys() >= folders.keys()
        for batch, folder in folders.items():
            first, second = batch_rows(folder), batch_rows(again[batch])
            key = sorted(json.dumps(r, default=str, sort_keys=True) for r in first)
            assert key == sorted(json.dumps(r, default=str, sort_keys=True) for r in second), (
                f"batch {batch}: the second write read other rows ({len(first)}, {len(second)})"
            )
    if fail_once:  # every snapshot batch's second read failed once and was retried
        failed = {int(path.name.split("-")[0]) for path in (out / "_failures").iterdir()}
        snapshot = {b for b, f in folders.items() if any(r["op"] == "r" for r in batch_rows(f))}
        assert snapshot <= failed, f"no task failed in batches {sorted(snapshot - failed)}"


def test_a_driver_killed_between_two_reads_of_a_snapshot_batch_resumes_exactly_once(
    postgres: Postgres, tmp_path: Path
) -> None:
    """The driver dies after a snapshot batch was written and while it is counted: the
    restart replays the batch (under a new snapshot), overwrites its folder, and the
    watermarks the log uses are those of the replay's reads."""
    table = "rr_killed"
    make_table(postgres, table)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    args = job_args(postgres, tmp_path, table)

    def written_not_committed() -> int | None:
        """A batch that read chunks (after the first commit), written whole and not
        committed: its count is running."""
        run1.check_alive()
        committed = log_ids(checkpoint, "commits")
        for batch in sorted(set(log_ids(checkpoint, "offsets")) - set(committed)):
            offset = json.dumps(logged_offset(checkpoint, batch, tmp_path / "state"))
            if '"log:' in offset:
                raise AssertionError("the snapshot ended before a batch was caught mid-count")
            folder = out / f"batch={batch}"
            if committed and (folder / "_SUCCESS").exists() and batch_rows(folder):
                return batch
        return None

    writer = Writer(postgres, table, ROWS + 1)
    writer.start()
    jobs: list[Job] = []
    try:
        run1 = Job(args, tmp_path / "jobs.log")
        jobs.append(run1)
        killed = kill_before_commit(
            run1,
            "a batch written, not committed",
            written_not_committed,
            checkpoint,
            150,
            step=0.005,
        )
        run2 = Job(args, tmp_path / "jobs.log")
        jobs.append(run2)
        finish(tmp_path, run2, writer, postgres_log(postgres, table))
        assert killed in log_ids(checkpoint, "commits"), "run 2 ran the batch killed in run 1"
    finally:
        writer.stop()
        for job in jobs:
            job.close()
    assert writer.changes > 100, "the writer made too few changes to test anything"
    check_replay(out, table_rows(postgres, table))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    with standalone_cluster(root=tmp_path_factory.mktemp("cluster")) as running:
        yield running


def test_on_a_standalone_cluster_reads_retried_on_either_executor_see_the_batch_snapshot(
    postgres: Postgres, tmp_path: Path, cluster: StandaloneCluster
) -> None:
    """Two executors, each its own Python workers: every task imports the snapshot the
    driver exported, and so does each task's retry (the first attempt of every task of each
    batch's second read fails), wherever it runs."""
    table = "rr_cluster"
    make_table(postgres, table)
    writer = Writer(postgres, table, ROWS + 1)
    writer.start()
    job = Job(
        job_args(postgres, tmp_path, table, f"--master={cluster.master_url}", "--fail-once"),
        tmp_path / "jobs.log",
    )
    try:
        finish(tmp_path, job, writer, postgres_log(postgres, table))
    finally:
        writer.stop()
        job.close()
    assert writer.changes > 100, "the writer made too few changes to test anything"
    out = tmp_path / "out"
    check_replay(out, table_rows(postgres, table))
    assert list((out / "_failures").iterdir()), "no task was retried"
