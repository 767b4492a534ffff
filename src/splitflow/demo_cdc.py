"""The main job's CDC form (``python -m splitflow demo --cdc``): PostgreSQL to Delta mirrors.

On one machine, in one command: a throw-away local PostgreSQL (the Debian package
``postgresql-15``; :mod:`splitflow.testing.postgres`) holding pgbench's four tables; a
writer thread running pgbench's transaction (an account, its teller and branch updated, a
history row inserted) at a steady rate, and once, ``--alter-after`` seconds in, ``ALTER
TABLE pgbench_accounts ADD COLUMN note`` (the writer then fills it); and a streaming query
that reads the four tables with ``splitflow-postgres-cdc`` (a snapshot in parallel chunks,
then the log) and keeps a Delta table per source table equal to it
(:func:`splitflow.cdc.apply_changes`), under :func:`splitflow.spark.run_restarting`, so the
schema change stops the query and it goes on with the new schema.

A live view shows the snapshot's progress (chunks read of all, rows/s), the switch to the
log, the log's lag (WAL bytes, and seconds since the newest change applied was
committed), the writer's rate and each schema change with its restart (plain lines when
the output is not a terminal). ``--duration`` or Ctrl-C stops it: the writer stops, the
query catches up with the log's end, stops, and each mirror is compared with its table
row for row. A second run with the same ``--work-dir`` resumes: the same database, the
query from its checkpoint.

::

    splitflow-demo-cdc/
      pg/               the PostgreSQL cluster (kept between runs), postgres.log beside it
      mirror/<table>/   one Delta table per source table
      checkpoint/       the query's Spark checkpoint
      source-state/     the source's stateDir (cdc-schema.json: the recorded schema)
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_WORK_DIR = "splitflow-demo-cdc"
TABLES = {
    "pgbench_accounts": (
        "aid bigint PRIMARY KEY, bid int NOT NULL, abalance int NOT NULL, filler text",
        "aid",
    ),
    "pgbench_branches": ("bid int PRIMARY KEY, bbalance int NOT NULL, filler text", "bid"),
    "pgbench_tellers": (
        "tid int PRIMARY KEY, bid int NOT NULL, tbalance int NOT NULL, filler text",
        "tid",
    ),
    "pgbench_history": (
        "hid bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, tid int, bid int, "
        "aid bigint, delta int, mtime timestamp, filler text",
        "hid",
    ),
}
"""pgbench's tables (with a key on history): name -> (columns, key)."""
SLOT = "splitflow_demo"


def add_arguments(parser: Any) -> None:
    """The ``--cdc`` options (an argparse parser or argument group)."""
    parser.add_argument("--scale", type=int, default=200_000, help="accounts rows (200000)")
    parser.add_argument("--tps", type=float, default=50.0, help="writer transactions/s (50)")
    parser.add_argument(
        "--alter-after",
        type=float,
        default=30.0,
        help="seconds before ALTER TABLE pgbench_accounts ADD COLUMN note (30; once)",
    )
    parser.add_argument("--chunk-size", type=int, default=10_000, help="snapshot chunk rows")


@dataclass
class CdcView:
    """What the view shows; the ``foreachBatch`` function and the watch loop update it."""

    started: float = field(default_factory=time.monotonic)
    chunks_all: int = 0
    """The snapshot's chunks: the tables' rows in chunks of ``chunkSize`` (dense keys)."""
    chunks_left: int = 0
    log_started: bool = False
    log_lag_bytes: int | None = None
    lag_seconds: float | None = None
    snapshot_rows: int = 0
    log_changes: int = 0
    batches: int = 0
    transactions: int = 0
    changes: list[str] = field(default_factory=list)
    rates: dict[str, float] = field(default_factory=dict)

    def take_report(self, report: dict[str, Any]) -> None:
        """The source's part of Spark's progress (``latestOffset``)."""
        splits = report.get("splits") or {}
        log = next((row for sid, row in splits.items() if sid.startswith("log:")), None)
        self.log_started = self.log_started or log is not None
        count = int(report.get("splitCount") or 0) - (1 if log is not None else 0)
        self.chunks_left = max(0, count)
        self.chunks_all = max(self.chunks_all, self.chunks_left)
        if log is not None:
            self.log_lag_bytes = log.get("lag")

    def lines(self) -> list[tuple[str, str]]:
        elapsed = max(1e-6, time.monotonic() - self.started)
        done = self.chunks_all - self.chunks_left
        phase = (
            f"log (snapshot of {self.chunks_all} chunks read)"
            if self.log_started and not self.chunks_left
            else f"snapshot: {done} of {self.chunks_all} chunks read"
        )
        lag = "-" if self.log_lag_bytes is None else f"{self.log_lag_bytes:,} bytes"
        if self.lag_seconds is not None:
            lag += f", {self.lag_seconds:.1f} s"
        return [
            ("phase", phase),
            ("snapshot rows", f"{self.snapshot_rows:,} ({self.rates.get('r', 0):,.0f} rows/s)"),
            ("log changes", f"{self.log_changes:,} ({self.rates.get('c', 0):,.0f}/s)"),
            ("log lag", lag),
            ("writer", f"{self.transactions:,} transactions ({self.transactions / elapsed:.0f}/s)"),
            ("batches", str(self.batches)),
            ("schema changes", "; ".join(self.changes) or "none yet"),
        ]


def run(args: argparse.Namespace, echo: Callable[[str], None] = print) -> int:
    """Run the CDC main job until a signal or ``args.duration``; returns the exit code."""
    from splitflow.testing.postgres import Postgres

    if not Postgres.installed():
        echo("splitflow demo --cdc needs a local PostgreSQL server: apt install postgresql-15")
        return 2
    missing = [m for m in ("psycopg", "deltalake") if importlib.util.find_spec(m) is None]
    if missing:
        echo(
            f"splitflow demo --cdc needs {' and '.join(missing)}: "
            "pip install 'splitflow[postgres,delta]'"
        )
        return 2
    from splitflow.demo import StopSignal
    from splitflow.job.pipeline import start_session, stop_between_batches
    from splitflow.spark import run_restarting

    work = Path(args.work_dir or DEFAULT_WORK_DIR).resolve()
    resumed = (work / "checkpoint" / "offsets").is_dir()
    echo(f"splitflow main job (CDC) in {work} ({'resuming' if resumed else 'fresh start'})")
    echo("starting PostgreSQL ...")
    pg = Postgres.start(work, keep=True)
    view = CdcView()
    writer = Writer(pg, args.tps, args.alter_after, view)
    failure: str | None = None
    stop = StopSignal()
    try:
        made = prepare(pg, args.scale)
        echo(f"PostgreSQL at {pg.host}:{pg.port}: {made}")
        if not resumed:
            view.chunks_all = sum(
                max(1, -(-int(pg.execute(f"SELECT count(*) FROM {name}")[0][0]) // args.chunk_size))
                for name in TABLES
            )
        echo("starting Spark (local[2]) ...")
        spark = start_session()
        stop.install()
        mirror = Mirror(work / "mirror", view)
        writer.start()
        live = sys.stdout.isatty() and not args.plain
        deadline = None if args.duration is None else time.monotonic() + args.duration

        def build() -> Any:
            frame = (
                spark.readStream.format("splitflow-postgres-cdc")
                .option("conninfo", pg.conninfo())
                .option("tables", "public.pgbench_*")
                .option("slotName", SLOT)
                .option("stateDir", str(work / "source-state"))
                .option("chunkSize", str(args.chunk_size))
                .option("maxChunksPerBatch", "4")
                .option("parallelism", str(args.parallelism))
                .option("discoveryInterval", "5s")
                .load()
            )
            return (
                frame.writeStream.foreachBatch(mirror)
                .option("checkpointLocation", str(work / "checkpoint"))
                .trigger(processingTime="2 seconds")
                .start()
            )

        def restarted(error: BaseException) -> None:
            text = str(error)
            start = text.find("schema changed at")
            shown = text[start:].split(";")[0] if start >= 0 else "a schema change"
            view.changes.append(f"{shown} -> restarted")
            echo(f"schema change: {shown}; the query restarts with the new schema")

        def watch(query: Any) -> None:
            show = _Display(view, live, echo)
            end: int | None = None
            catch_up = 0.0
            with show:
                while query.isActive:
                    progress = query.lastProgress
                    if progress and progress.get("sources"):
                        from splitflow.job.live import source_report

                        view.take_report(source_report(progress))
                    show.refresh()
                    over = deadline is not None and time.monotonic() >= deadline
                    if (stop.requested.is_set() or over) and end is None:
                        writer.stop()
                        end = wal_end(pg)
                        catch_up = time.monotonic() + 60
                        echo("stopping: the writer stopped, the query catches up with the log")
                    if end is not None and (caught_up(query, end) or time.monotonic() > catch_up):
                        stop_between_batches(query)
                        return
                    stop.requested.wait(0.5)

        try:
            run_restarting(build, wait=watch, on_restart=restarted)
        except Exception as error:  # the query failed: say so, stop cleanly
            failure = str(error).splitlines()[0]
        spark.stop()
    finally:
        writer.stop()
        stop.restore()
    if failure is None:
        for line in compare(pg, work / "mirror"):
            echo(line)
    pg.stop()
    echo(f"checkpoint: {work / 'checkpoint'}; mirrors: {work / 'mirror'}")
    echo(f"resume:     python -m splitflow demo --cdc --work-dir {work}")
    if writer.error is not None:
        echo(f"the writer failed: {writer.error}")
    if failure is not None:
        echo(f"the query failed: {failure}")
    return 0 if failure is None and writer.error is None else 1


class _Display:
    """The live view (rich) or plain lines, one per new batch."""

    def __init__(self, view: CdcView, live: bool, echo: Callable[[str], None]) -> None:
        self.view, self.live, self.echo = view, live, echo
        self._shown = -1
        self._live: Any = None

    def __enter__(self) -> _Display:
        if self.live:
            from rich.live import Live

            self._live = Live(self._table(), refresh_per_second=2)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)

    def _table(self) -> Any:
        from rich.table import Table

        table = Table(
            title="splitflow main job: PostgreSQL CDC -> Delta mirrors", show_header=False
        )
        for name, value in self.view.lines():
            table.add_row(name, value)
        return table

    def refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._table())
        elif self.view.batches != self._shown:
            self._shown = self.view.batches
            self.echo(" | ".join(f"{n}: {v}" for n, v in self.view.lines()))


def prepare(pg: Any, scale: int) -> str:
    """pgbench's tables, filled, unless they are there (a resumed run)."""
    if pg.execute("SELECT to_regclass('public.pgbench_accounts')")[0][0] is not None:
        return "the tables as the last run left them"
    for name, (columns, _) in TABLES.items():
        pg.execute(f"CREATE TABLE {name} ({columns})")
    branches = max(1, scale // 50_000)
    pg.execute(
        "INSERT INTO pgbench_accounts SELECT g, 1 + (g - 1) %% %s, 0, repeat('a', 84) "
        "FROM generate_series(1, %s) g",
        (branches, scale),
    )
    pg.execute(
        "INSERT INTO pgbench_branches SELECT g, 0, repeat('b', 88) FROM generate_series(1, %s) g",
        (branches,),
    )
    pg.execute(
        "INSERT INTO pgbench_tellers SELECT g, 1 + (g - 1) %% %s, 0, repeat('t', 84) "
        "FROM generate_series(1, %s) g",
        (branches, branches * 10),
    )
    for name in TABLES:
        pg.execute(f"ANALYZE {name}")
    return f"{scale:,} accounts, {branches} branches, {branches * 10} tellers"


class Writer(threading.Thread):
    """pgbench's transaction at ``tps`` per second; after ``alter_after`` seconds, once,
    ``ALTER TABLE pgbench_accounts ADD COLUMN note text``, which it then fills."""

    def __init__(self, pg: Any, tps: float, alter_after: float, view: CdcView) -> None:
        super().__init__(daemon=True, name="splitflow-demo-writer")
        self.pg, self.tps, self.alter_after, self.view = pg, tps, alter_after, view
        self.stopped = threading.Event()
        self.error: BaseException | None = None

    def stop(self) -> None:
        self.stopped.set()
        if self.is_alive():
            self.join(30)

    def run(self) -> None:
        try:
            self._write()
        except BaseException as error:  # shown when the job ends
            self.error = error

    def _write(self) -> None:
        rng = random.Random()
        started = time.monotonic()
        with self.pg.connect() as conn:
            accounts, tellers, branches = (
                int(conn.execute(f"SELECT max({key}) FROM {name}").fetchone()[0])
                for name, key in (
                    ("pgbench_accounts", "aid"),
                    ("pgbench_tellers", "tid"),
                    ("pgbench_branches", "bid"),
                )
            )
            noted = self._has_note(conn)
            while not self.stopped.wait(1 / self.tps):
                if not noted and time.monotonic() - started >= self.alter_after:
                    conn.execute("ALTER TABLE pgbench_accounts ADD COLUMN note text")
                    noted = True
                aid, tid, bid = (
                    rng.randint(1, accounts),
                    rng.randint(1, tellers),
                    rng.randint(1, branches),
                )
                delta = rng.randint(-5000, 5000)
                note = ", note = 'tx ' || txid_current()" if noted else ""
                with conn.transaction():
                    account = f"UPDATE pgbench_accounts SET abalance = abalance + %s{note}"
                    conn.execute(f"{account} WHERE aid = %s", (delta, aid))
                    conn.execute(
                        "UPDATE pgbench_tellers SET tbalance = tbalance + %s WHERE tid = %s",
                        (delta, tid),
                    )
                    conn.execute(
                        "UPDATE pgbench_branches SET bbalance = bbalance + %s WHERE bid = %s",
                        (delta, bid),
                    )
                    conn.execute(
                        "INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) "
                        "VALUES (%s, %s, %s, %s, now()::timestamp)",
                        (tid, bid, aid, delta),
                    )
                self.view.transactions += 1

    @staticmethod
    def _has_note(conn: Any) -> bool:
        row = conn.execute(
            "SELECT 1 FROM information_schema.columns WHERE table_name = 'pgbench_accounts' "
            "AND column_name = 'note'"
        ).fetchone()
        return row is not None


class Mirror:
    """The ``foreachBatch`` function: each table's rows to its Delta table. The batch is
    read once (as Arrow) for the four, and not at all when every table has it already."""

    def __init__(self, root: Path, view: CdcView) -> None:
        self.root, self.view = root, view
        self._last: tuple[float, int, int] | None = None

    def __call__(self, batch: Any, batch_id: int) -> None:
        import pyarrow.compute as pc
        from deltalake import DeltaTable

        from splitflow.cdc import apply_changes

        query = batch.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
        app = f"splitflow-{query}"
        pending = []
        for name in TABLES:
            uri = str(self.root / name)
            done = (
                DeltaTable(uri).transaction_version(app) if DeltaTable.is_deltatable(uri) else None
            )
            if done is None or done < batch_id:
                pending.append(name)
        if not pending:
            return
        rows = batch.toArrow()
        for name in pending:
            key = TABLES[name][1]
            apply_changes(
                rows,
                batch_id,
                str(self.root / name),
                keys=[key],
                table=f"public.{name}",
                app_id=app,
            )
        self._count(rows, pc)

    def _count(self, rows: Any, pc: Any) -> None:
        view = self.view
        snapshot = int(pc.sum(pc.equal(rows["op"], "r")).as_py() or 0)
        view.snapshot_rows += snapshot
        view.log_changes += rows.num_rows - snapshot
        view.batches += 1
        newest = pc.max(rows["commit_ts"]).as_py()
        if newest is not None:
            view.lag_seconds = max(0.0, time.time() - newest.timestamp())
        now = time.monotonic()
        if self._last is not None:
            seconds = max(1e-6, now - self._last[0])
            view.rates = {
                "r": (view.snapshot_rows - self._last[1]) / seconds,
                "c": (view.log_changes - self._last[2]) / seconds,
            }
        self._last = (now, view.snapshot_rows, view.log_changes)


def wal_end(pg: Any) -> int:
    return int(pg.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")[0][0])


def caught_up(query: Any, end: int) -> bool:
    """Whether the last batch's log position reached ``end``."""
    from splitflow.job.live import source_report

    report = source_report(query.lastProgress)
    log = [row for sid, row in (report.get("splits") or {}).items() if sid.startswith("log:")]
    return bool(log) and int(log[0].get("position") or 0) >= end


def compare(pg: Any, root: Path) -> list[str]:
    """Each mirror against its table, row for row: one line per table."""
    import deltalake
    import pyarrow as pa

    lines = []
    for name, (_, key) in TABLES.items():
        with pg.connect() as conn:
            cursor = conn.execute(f"SELECT * FROM {name}")
            names = [d.name for d in cursor.description]
            source = {row[0]: dict(zip(names, row, strict=True)) for row in cursor.fetchall()}
        uri = str(root / name)
        if not deltalake.DeltaTable.is_deltatable(uri):
            lines.append(f"mirror {name}: no Delta table yet")
            continue
        table = deltalake.DeltaTable(uri)
        result = deltalake.QueryBuilder().register("t", table).execute("SELECT * FROM t")
        mirror = {r[key]: r for r in pa.table(result.read_all()).to_pylist()}
        differ = sum(1 for k in source.keys() | mirror.keys() if source.get(k) != mirror.get(k))
        verdict = "equal" if differ == 0 else f"{differ} rows differ"
        columns = ", ".join(f.name for f in table.schema().fields)
        lines.append(f"mirror {name}: {len(mirror):,} rows ({columns}): {verdict} to the table")
    return lines
