"""A PostgreSQL CDC stream run by a driver subprocess (``tests/spark/jobs.py``), to be
killed and restarted: its table, its arguments, and how to let it catch up and stop; and
what a ``--sink delta`` job left: the batches it applied and the Delta table's rows."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
from tests.spark.support import Job, log_ids, wait_until

from splitflow.testing.postgres import Postgres

ROWS = 3000
OPTIONS = {"chunkSize": "250", "maxChunksPerBatch": "2", "discoveryInterval": "1s"}
"""12 chunks, read two per batch: six snapshot batches."""


def make_table(postgres: Postgres, table: str) -> None:
    """``ROWS`` rows ``(id bigint PRIMARY KEY, version int, payload text)``, the table
    :class:`~tests.support.cdc.Writer` changes; deletes carry the old row (``REPLICA
    IDENTITY FULL``), so a replay also sees an update lost before a delete."""
    postgres.execute(
        f"CREATE TABLE {table} (id bigint PRIMARY KEY, version int NOT NULL, payload text)"
    )
    postgres.execute(
        f"INSERT INTO {table} SELECT g, 0, md5(g::text) FROM generate_series(1, {ROWS}) g"
    )
    postgres.execute(f"ALTER TABLE {table} REPLICA IDENTITY FULL")
    postgres.execute(f"ANALYZE {table}")


def wal_end(postgres: Postgres) -> int:
    return int(postgres.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")[0][0])


def job_args(
    postgres: Postgres, tmp_path: Path, table: str, *extra: str, out: Path | None = None
) -> list[str]:
    """A driver streaming ``table`` (:data:`OPTIONS`) into a sink that writes, then counts
    every batch to ``out`` (default ``<tmp_path>/out``; ``extra`` may name another
    ``--sink``); it stops once ``<tmp_path>/done`` exists and the log reached the position
    in ``<tmp_path>/ends.json``."""
    catalog = tmp_path / "ends.json"
    catalog.write_text(json.dumps({"lengths": {}, "sealed": []}))
    return [
        f"--catalog={catalog}",
        f"--out={out or tmp_path / 'out'}",
        f"--checkpoint={tmp_path / 'checkpoint'}",
        "--parallelism=2",
        "--trigger=200ms",
        "--source=splitflow-postgres-cdc",
        "--sink=write-count",
        f"--done-file={tmp_path / 'done'}",
        f"--option=conninfo={postgres.conninfo()}",
        f"--option=tables={table}",
        f"--option=slotName=s_{table}",
        f"--option=stateDir={tmp_path / 'state'}",
        *(f"--option={key}={value}" for key, value in OPTIONS.items()),
        *extra,
    ]


def postgres_log(postgres: Postgres, table: str) -> Callable[[], tuple[str, int]]:
    """Where the log of a :func:`job_args` stream of ``table`` ends now, for :func:`finish`."""
    return lambda: (f"log:s_{table}", wal_end(postgres))


def finish(
    tmp_path: Path,
    job: Job,
    writer: Any,
    log_end: Callable[[], tuple[str, int]],
    *,
    log_batches: int = 2,
    wait: float = 150,
    finish_within: float = 120,
) -> None:
    """Once ``job`` completed ``log_batches`` batches that read the log: stop the writer,
    tell the job where the log ends now (``log_end()``: the log split's id and position,
    into ``<tmp_path>/ends.json``) and to stop once it is there (``<tmp_path>/done``); it
    must catch up and exit 0."""

    def read_log() -> int:
        job.check_alive()
        return sum(1 for line in job.lines if line.startswith("BATCH ") and '"log:' in line)

    wait_until("the job's log batches", lambda: read_log() >= log_batches, wait)
    writer.stop()
    split_id, end = log_end()
    ends = {"lengths": {split_id: end}, "sealed": []}
    (tmp_path / "ends.json").write_text(json.dumps(ends))
    (tmp_path / "done").touch()
    assert job.finish(finish_within) == 0, job.lines
    assert "CAUGHT-UP" in job.lines


def applied(job: Job) -> list[tuple[int, bool]]:
    """(batch id, skipped) of each ``APPLIED`` line a ``--sink delta`` job printed."""
    lines = [line.split() for line in job.lines if line.startswith("APPLIED ")]
    return [(int(words[1]), words[2] == "skipped=1") for words in lines]


def mirror_rows(uri: Path) -> dict[int, tuple[int, str]]:
    """The ``(id, version, payload)`` rows of the Delta table at ``uri``, as
    :func:`tests.support.cdc.table_rows` gives a table's (read by delta-rs's own engine:
    ``to_pyarrow_table`` may abort the interpreter at exit, delta-rs issue 2184)."""
    import deltalake

    result = deltalake.QueryBuilder().register("t", deltalake.DeltaTable(str(uri)))
    table = pa.table(result.execute("SELECT id, version, payload FROM t").read_all())
    return {r["id"]: (r["version"], r["payload"]) for r in table.to_pylist()}


def run_until_killed_after(batch: int, args: list[str], log: Path, checkpoint: Path) -> Job:
    """A ``--sink delta --kill-after-batch=<batch>`` job, run until it has applied ``batch``
    and killed itself, before Spark committed the batch."""
    job = Job(args, log)
    try:
        wait_until("the job to kill itself", lambda: job.process.poll() is not None, 240)
        assert applied(job)[-1] == (batch, False), job.lines
        assert batch in log_ids(checkpoint, "offsets")
        assert batch not in log_ids(checkpoint, "commits")
    finally:
        job.close()
    return job


def assert_mirrors(table: dict[int, tuple[int, str]], mirror: Path) -> None:
    """The Delta table at ``mirror`` holds exactly ``table``'s rows."""
    got = mirror_rows(mirror)
    wrong = {k: (table.get(k), got.get(k)) for k in table.keys() | got.keys()}
    wrong = {k: pair for k, pair in wrong.items() if pair[0] != pair[1]}
    shown = dict(list(wrong.items())[:10])
    assert not wrong, f"{len(wrong)} keys differ, as key -> (table, mirror): {shown}"


def table_dicts(postgres: Postgres, table: str) -> dict[Any, dict[str, Any]]:
    """Every row of ``table``, whatever its columns, by its first column (the key)."""
    with postgres.connect() as conn:
        cursor = conn.execute(f"SELECT * FROM {table}")
        names = [d.name for d in cursor.description]
        return {row[0]: dict(zip(names, row, strict=True)) for row in cursor.fetchall()}


def delta_dicts(uri: Path, key: str) -> dict[Any, dict[str, Any]]:
    """Every row of the Delta table at ``uri``, by ``key`` (read as :func:`mirror_rows`)."""
    import deltalake

    result = deltalake.QueryBuilder().register("t", deltalake.DeltaTable(str(uri)))
    table = pa.table(result.execute("SELECT * FROM t").read_all())
    return {r[key]: r for r in table.to_pylist()}
