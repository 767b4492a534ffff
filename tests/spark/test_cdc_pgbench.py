"""pgbench's TPC-B load during a CDC snapshot, rebuilt exactly from a sink that reads twice.

``pgbench -i -s 1`` makes its four tables (100,000 accounts, 10 tellers, a branch, and
``pgbench_history``, which has no key; its replica identity is set to FULL). A stream of
all four (``parallelism`` 2, chunks of 5,000 rows, two per batch, the history cut by
``aid`` through option ``chunkKeyColumn``) goes into a ``foreachBatch`` sink that writes
every batch and then counts it (:class:`tests.spark.jobs.ForeachBatchSink`), so every batch
is read twice, while ``pgbench -c 2 -R 200`` runs its built-in TPC-B script (each
transaction updates an account, a teller and a branch and inserts a history row), from
before the stream starts until the log has read two batches. Once the stream caught up,
the four tables are rebuilt from the sink and must equal the database exactly:

* a table with a key: the last row of each key, in batch order, then ``lsn`` (a ``d``
  removes the key);
* ``pgbench_history``: the multiset of whole rows (``r`` and ``c`` add one, ``d`` removes
  one equal row, which must be there).

No row may reach the sink twice (the same table, op, ``lsn`` and values), and no key may
be read twice by the snapshot.

pgbench connects over TCP as the test server's role; its password goes in ``PGPASSWORD``,
never on a command line.
"""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.spark.jobs import ForeachBatchSink
from tests.spark.support import log_position, wait_until
from tests.support.cdc import batch_folders_in_order

from splitflow.testing.postgres import DATABASE, PASSWORD, USER, Postgres, postgres_fixture

pytestmark = pytest.mark.slow

KEYS = {"pgbench_accounts": ("aid",), "pgbench_branches": ("bid",), "pgbench_tellers": ("tid",)}
"""The keyed tables and their primary keys."""
HISTORY = "pgbench_history"
TABLES = (*KEYS, HISTORY)
LOAD_SECONDS = 120
"""The load's ``-T``, an upper bound: it is stopped once the log read two batches under it."""


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Postgres]:
    yield from postgres_fixture(tmp_path_factory)


def pgbench(postgres: Postgres, *args: str) -> list[str]:
    """The ``pgbench`` command line: the connection is in :func:`pgbench_env`."""
    return [str(postgres.bin_dir / "pgbench"), *args]


def pgbench_env(postgres: Postgres) -> dict[str, str]:
    """This environment plus the connection to ``postgres`` (``PG*``, the password too)."""
    return {
        **os.environ,
        "PGHOST": postgres.host,
        "PGPORT": str(postgres.port),
        "PGUSER": USER,
        "PGDATABASE": DATABASE,
        "PGPASSWORD": PASSWORD,
    }


def columns(postgres: Postgres, table: str) -> list[str]:
    return [
        name
        for (name,) in postgres.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = 'public' AND table_name = %s ORDER BY ordinal_position",
            (table,),
        )
    ]


Row = tuple[Any, ...]


def rebuild(
    rows: list[dict[str, Any]], names: dict[str, list[str]]
) -> tuple[dict[str, dict[Row, Row]], Counter[Row], list[str]]:
    """The keyed tables (key -> row) and the history (a multiset of rows) that ``rows``, in
    batch order, describe; and what was wrong on the way (rows twice, deletes of rows not
    there, keys read twice by the snapshot)."""
    keyed: dict[str, dict[Row, Row]] = {t: {} for t in KEYS}
    history: Counter[Row] = Counter()
    problems: list[str] = []
    seen: set[tuple[Any, ...]] = set()
    read: set[tuple[str, Row]] = set()
    for row in rows:
        table = row["table"].removeprefix("public.")
        values = tuple(row[c] for c in names[table])
        identity = (table, row["op"], row["lsn"], values)
        if identity in seen:
            problems.append(f"twice: {identity}")
        seen.add(identity)
        if table == HISTORY:
            if row["op"] in ("r", "c"):
                history[values] += 1
            elif history[values] > 0:
                history[values] -= 1
            else:
                problems.append(f"{HISTORY}: {row['op']} of a row not there: {values}")
            continue
        key = tuple(row[c] for c in KEYS[table])
        if row["op"] == "r":
            if (table, key) in read:
                problems.append(f"{table} {key}: read twice by the snapshot")
            read.add((table, key))
        if row["op"] == "d":
            keyed[table].pop(key, None)
        else:
            keyed[table][key] = values
    return keyed, +history, problems


def transactions(postgres: Postgres) -> int:
    """pgbench's transactions so far (each inserts one history row)."""
    return int(postgres.execute(f"SELECT count(*) FROM {HISTORY}")[0][0])


def test_pgbench_tpcb_during_the_snapshot_is_rebuilt_exactly_from_a_sink_that_reads_twice(
    spark: Any, postgres: Postgres, tmp_path: Path
) -> None:
    init = subprocess.run(
        pgbench(postgres, "-i", "-s", "1", "-q"),
        env=pgbench_env(postgres),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert init.returncode == 0, init.stderr[-2000:]
    postgres.execute(f"ALTER TABLE {HISTORY} REPLICA IDENTITY FULL")
    names = {table: columns(postgres, table) for table in TABLES}
    slot, out = "s_pgbench", tmp_path / "out"
    load = subprocess.Popen(
        pgbench(postgres, "-n", "-c", "2", "-j", "2", "-R", "200", "-T", str(LOAD_SECONDS)),
        env=pgbench_env(postgres),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    query = None
    try:
        query = (
            spark.readStream.format("splitflow-postgres-cdc")
            .option("conninfo", postgres.conninfo())
            .option("tables", ",".join(TABLES))
            .option("chunkKeyColumn", f"{HISTORY}:aid")
            .option("slotName", slot)
            .option("parallelism", "2")
            .option("chunkSize", "5000")
            .option("maxChunksPerBatch", "2")
            .option("stateDir", str(tmp_path / "state"))
            .load()
            .writeStream.foreachBatch(ForeachBatchSink("write-count", out))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(processingTime="200 milliseconds")
            .start()
        )

        def log_at() -> int | None:
            return log_position(query, slot)

        began = wait_until("the end of the snapshot", log_at, 120)
        wait_until("a log batch", lambda: (log_at() or 0) > began, 60)
        began = log_at() or 0
        wait_until("a second log batch", lambda: (log_at() or 0) > began, 60)
        # enough load to test anything, however fast the query got here (200 a second)
        wait_until("2,001 transactions", lambda: transactions(postgres) > 2000, 60)
        if load.poll() is not None:
            raise AssertionError(f"the load ended too soon: {load.communicate()[0][-2000:]}")
        load.terminate()  # a transaction it was running rolls back
        load.wait(30)
        end = int(postgres.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")[0][0])
        wait_until("the log to catch up", lambda: (log_at() or 0) >= end, 90)
    finally:
        if load.poll() is None:
            load.kill()
            load.wait(10)
        if query is not None:
            query.stop()
    rows = batch_folders_in_order(out)
    ops = Counter((r["table"].removeprefix("public."), r["op"]) for r in rows)
    assert ops[("pgbench_accounts", "r")] == 100_000, ops
    assert ops[("pgbench_accounts", "u")] > 1000, ops
    assert ops[(HISTORY, "c")] > 0, ops
    keyed, history, problems = rebuild(rows, names)
    assert not problems, f"{len(problems)} problems: {problems[:10]}"
    ran = transactions(postgres)
    assert ran > 2000, f"only {ran} transactions ran"
    wrong = {}
    for table, key in KEYS.items():
        listed = ", ".join(names[table])
        now = {
            tuple(r[names[table].index(c)] for c in key): tuple(r)
            for r in postgres.execute(f"SELECT {listed} FROM {table}")
        }
        differ = [k for k in now.keys() | keyed[table].keys() if now.get(k) != keyed[table].get(k)]
        if differ:
            wrong[table] = f"{len(differ)} of {len(now)} keys differ, e.g. {sorted(differ)[:5]}"
    now_history = Counter(
        tuple(r) for r in postgres.execute(f"SELECT {', '.join(names[HISTORY])} FROM {HISTORY}")
    )
    if now_history != history:
        missing, extra = now_history - history, history - now_history
        wrong[HISTORY] = f"{sum(missing.values())} rows missing, {sum(extra.values())} extra"
    assert not wrong, wrong
