"""Schema changes in PostgreSQL's log while a Delta mirror is kept (``schemaChanges=stop``).

One run per change: ``ADD COLUMN``, ``DROP COLUMN``, ``RENAME COLUMN``, a widening type
change. A writer inserts, updates and deletes rows all through the snapshot (3000 rows,
chunks of 250, two per batch) and the log; once the log streams, the table is altered while
the writer goes on. The job (``tests/spark/jobs.py``) writes every batch to Parquet (the
history) and applies it to Delta (``apply_changes``), under ``run_restarting``: the query
stops at the change with a ``SchemaChangedError``, the schema recorded in ``stateDir``, and
is started again in the same driver, which SIGKILLs itself right after the first batch of
the restarted query reached Delta, before Spark committed it. A second driver goes on.

Then: the Delta table equals the PostgreSQL table, values and schema (a renamed column keeps
its values); every key's history (the Parquet batches, in order) is gap-free and ends at the
table's row; no batch mixes the two schemas (every row of a batch written with the old
columns is older than every row written with the new); ``stateDir`` records the change.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from tests.spark.cdc_jobs import (
    ROWS,
    applied,
    delta_dicts,
    finish,
    job_args,
    make_table,
    postgres_log,
    table_dicts,
)
from tests.spark.support import Job, wait_until
from tests.support.cdc import Writer, batch_folders, batch_rows, replay

from splitflow.testing.postgres import Postgres, postgres_fixture

pytestmark = pytest.mark.slow
deltalake = pytest.importorskip("deltalake", reason="needs the delta extra (deltalake)")

CHANGES = {
    "add": (
        [
            "ALTER TABLE {t} ADD COLUMN note text",
            "UPDATE {t} SET version = version + 1, note = 'n' || id WHERE id % 10 = 0",
        ],
        {"id": "long", "version": "integer", "payload": "string", "note": "string"},
    ),
    "drop": (
        ["ALTER TABLE {t} DROP COLUMN payload"],
        {"id": "long", "version": "integer"},
    ),
    "rename": (
        ["ALTER TABLE {t} RENAME COLUMN payload TO body"],
        {"id": "long", "version": "integer", "body": "string"},
    ),
    "widen": (
        ["ALTER TABLE {t} ALTER COLUMN version TYPE bigint"],
        {"id": "long", "version": "long", "payload": "string"},
    ),
}
"""Each change: its statements, and the mirror's columns after it (Delta types)."""


class VersionWriter(Writer):
    """:class:`Writer` that leaves ``payload`` alone, so it goes on whatever the change."""

    INSERT = "INSERT INTO {table} (id, version) VALUES (%s, 0)"
    UPDATE = "UPDATE {table} SET version = version + 1 WHERE id = %s"


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Postgres]:
    yield from postgres_fixture(tmp_path_factory)


def log_batches(job: Job) -> int:
    job.check_alive()
    return sum(1 for line in job.lines if line.startswith("BATCH ") and '"log:' in line)


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_mirror_follows_a_schema_change_through_a_restart_and_a_crash(
    postgres: Postgres, tmp_path: Path, change: str
) -> None:
    table = f"altered_{change}"
    make_table(postgres, table)
    statements, columns = CHANGES[change]
    mirror, history = tmp_path / "mirror", tmp_path / "history"
    args = job_args(
        postgres,
        tmp_path,
        table,
        "--sink=delta",
        f"--history={history}",
        "--restart-on-schema-change",
        "--kill-after-restart",
        out=mirror,
    )
    writer = VersionWriter(postgres, table, ROWS + 1)
    writer.start()
    jobs: list[Job] = []
    try:
        run1 = Job(args, tmp_path / "jobs.log")
        jobs.append(run1)
        wait_until("the job's first log batch", lambda: log_batches(run1) >= 1, 240)
        for statement in statements:
            postgres.execute(statement.format(t=table))
        wait_until("the job to kill itself", lambda: run1.process.poll() is not None, 240)
        run1.finish(30)  # and its last lines read: the process may end before they are
        starts = [n for n, line in enumerate(run1.lines) if line.startswith("STARTED")]
        assert len(starts) == 2, run1.lines  # stopped at the change, started again
        killed, skipped = applied(run1)[-1]
        assert not skipped, run1.lines
        assert f"APPLIED {killed} skipped=0" in " ".join(run1.lines[starts[1] :]), run1.lines

        run2 = Job(args, tmp_path / "jobs.log")
        jobs.append(run2)
        finish(tmp_path, run2, writer, postgres_log(postgres, table))
    finally:
        writer.stop()
        for job in jobs:
            job.close()
    assert writer.changes > 100, "the writer made too few changes to test anything"
    assert applied(run2)[0] == (killed, True), run2.lines  # the replay is skipped

    source = table_dicts(postgres, table)
    delta = deltalake.DeltaTable(str(mirror))
    assert {f.name: f.type.type for f in delta.schema().fields} == columns
    got = delta_dicts(mirror, "id")
    wrong = {k: (source.get(k), got.get(k)) for k in source.keys() | got.keys()}
    wrong = {k: pair for k, pair in wrong.items() if pair[0] != pair[1]}
    assert not wrong, f"{len(wrong)} keys differ: {dict(list(wrong.items())[:5])}"

    batches = [
        ([(c.name, str(c.type)) for c in pq.read_schema(next(f.glob("*.parquet")))], batch_rows(f))
        for f in batch_folders(history).values()
        if any(f.glob("*.parquet"))
    ]
    result = replay(
        [{**r, "payload": None} for _, batch in batches for r in batch],
        {k: (row["version"], None) for k, row in source.items()},
    )
    assert (result.lost, result.duplicated) == ([], []), result
    layouts = [names for names, _ in batches]
    old = [max(r["lsn"] for r in b) for n, b in batches if n == layouts[0] and b]
    new = [min(r["lsn"] for r in b) for n, b in batches if n != layouts[0] and b]
    assert new, f"no batch was written with the new columns: {layouts}"
    assert max(old) < min(new), "a batch holds rows of both schemas"

    record = json.loads((tmp_path / "state" / "cdc-schema.json").read_text())
    assert [c["table"] for c in record["changes"]] == [f"public.{table}"]


def test_a_new_table_with_new_columns_stops_the_query_and_the_restart_reads_it(
    postgres: Postgres, tmp_path: Path
) -> None:
    """A table that matches ``tables`` once the log streams, with a column the query lacks:
    the query stops at the table's discovery (before the log carries it), ``run_restarting``
    starts it again with the column, and the restarted query snapshots the table and follows
    its changes; the first table's history stays gap-free."""
    table = "grows"
    make_table(postgres, table)
    out = tmp_path / "out"
    args = job_args(
        postgres,
        tmp_path,
        table,
        "--sink=write-count",
        "--restart-on-schema-change",
        f"--option=tables=public.{table}*",
        out=out,
    )
    writer = VersionWriter(postgres, table, ROWS + 1)
    writer.start()
    job = Job(args, tmp_path / "jobs.log")
    try:
        wait_until("the job's first log batch", lambda: log_batches(job) >= 1, 240)
        postgres.execute(f"CREATE TABLE {table}_new (id bigint PRIMARY KEY, price numeric(8,2))")
        postgres.execute(
            f"INSERT INTO {table}_new SELECT g, g / 100.0 FROM generate_series(1, 50) g"
        )
        wait_until(
            "the restart", lambda: sum(1 for s in job.lines if s.startswith("STARTED")) >= 2, 120
        )
        postgres.execute(f"UPDATE {table}_new SET price = price + 1 WHERE id <= 10")
        finish(tmp_path, job, writer, postgres_log(postgres, table), log_batches=3)
    finally:
        writer.stop()
        job.close()

    rows = [r for f in batch_folders(out).values() for r in batch_rows(f)]
    mine = [r for r in rows if r["table"] == f"public.{table}"]
    new = [r for r in rows if r["table"] == f"public.{table}_new"]
    source = table_dicts(postgres, table)
    result = replay(
        [{**r, "payload": None} for r in mine],
        {k: (row["version"], None) for k, row in source.items()},
    )
    assert (result.lost, result.duplicated) == ([], []), result
    last = {r["id"]: r["price"] for r in sorted(new, key=lambda r: r["lsn"])}
    assert last == {k: row["price"] for k, row in table_dicts(postgres, f"{table}_new").items()}
    record = json.loads((tmp_path / "state" / "cdc-schema.json").read_text())
    assert [c["change"] for c in record["changes"]] == ["a new table"]
