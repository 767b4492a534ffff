"""A Delta table kept equal to a PostgreSQL table by ``apply_changes`` in ``foreachBatch``,
through a driver crash between a batch's Delta commit and Spark's commit of it.

A writer inserts, updates and deletes rows all through the snapshot (3000 rows, chunks of
250, two per batch) and the log; the driver (``tests/spark/jobs.py --sink delta``)
SIGKILLs itself right after batch 2's changes are committed to Delta, before Spark commits
the batch; the restarted driver runs batch 2 again, which ``apply_changes`` finds recorded
and skips. Read back, the Delta table equals the PostgreSQL table row for row, with its
columns and their types, and records the last batch the query committed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.spark.cdc_jobs import (
    ROWS,
    applied,
    assert_mirrors,
    finish,
    job_args,
    make_table,
    postgres_log,
    run_until_killed_after,
)
from tests.spark.support import Job, log_ids
from tests.support.cdc import Writer, table_rows

from splitflow.testing.postgres import Postgres, postgres_fixture

pytestmark = pytest.mark.slow
deltalake = pytest.importorskip("deltalake", reason="needs the delta extra (deltalake)")

KILLED = 2
"""The batch after whose Delta commit the driver is killed (a snapshot batch)."""


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Postgres]:
    yield from postgres_fixture(tmp_path_factory)


def test_a_mirror_equals_the_table_after_a_crash_between_the_delta_and_the_spark_commit(
    postgres: Postgres, tmp_path: Path
) -> None:
    table = "mirrored"
    make_table(postgres, table)
    mirror, checkpoint = tmp_path / "mirror", tmp_path / "checkpoint"
    args = job_args(
        postgres, tmp_path, table, "--sink=delta", f"--kill-after-batch={KILLED}", out=mirror
    )
    writer = Writer(postgres, table, ROWS + 1)
    writer.start()
    jobs: list[Job] = []
    try:
        jobs.append(run_until_killed_after(KILLED, args, tmp_path / "jobs.log", checkpoint))
        run2 = Job(args, tmp_path / "jobs.log")
        jobs.append(run2)
        finish(tmp_path, run2, writer, postgres_log(postgres, table))
    finally:
        writer.stop()
        for job in jobs:
            job.close()
    assert writer.changes > 100, "the writer made too few changes to test anything"
    assert applied(run2)[0] == (KILLED, True), run2.lines
    assert all(not skipped for _, skipped in applied(run2)[1:]), run2.lines

    assert_mirrors(table_rows(postgres, table), mirror)
    delta = deltalake.DeltaTable(str(mirror))
    assert [(f.name, f.type.type) for f in delta.schema().fields] == [
        ("id", "long"),
        ("version", "integer"),
        ("payload", "string"),
    ]
    [query] = {line.split()[1] for job in jobs for line in job.lines if line.startswith("STARTED")}
    # Delta's transaction of the query is the last batch with changes, and Spark committed
    # every batch after it without one: such a batch read log positions that hold no change
    # of the table (the log moves on with the server's other writes), so it committed nothing.
    done = delta.transaction_version(f"splitflow-{query}")
    assert done is not None
    assert done > KILLED
    versions = {
        int(w[1]): w[3] for w in (line.split() for line in run2.lines) if w[:1] == ["APPLIED"]
    }
    assert versions[done] == f"version={delta.version()}", run2.lines
    after = range(done + 1, max(log_ids(checkpoint, "commits")) + 1)
    assert all(versions.get(batch) == versions[done] for batch in after), run2.lines
