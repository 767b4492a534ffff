"""Snapshot rows per second from PostgreSQL: splitflow-postgres-cdc vs Spark's JDBC read,
then the log's end-to-end latency.

A throw-away PostgreSQL 15 on loopback (``splitflow.testing.postgres``) holds one table of N rows
(``id bigint`` primary key, an ``int``, a 20-character ``text``, a ``numeric(12,2)`` and a
``timestamptz``), filled with ``generate_series`` and vacuumed before anything is timed. One
``local[2]`` session reads the whole table with three readers, alternating over several
rounds so noise hits them all, each read timed around
``df.write.format("noop").mode("overwrite").save()`` (planning, tasks, the server's scan,
Arrow into the JVM):

* **splitflow p1 / p2**: ``spark.read.format("splitflow-postgres-cdc")`` with
  ``startupMode=snapshotOnly``, ``chunkSize`` (key-range chunks, each one ``REPEATABLE
  READ`` transaction read into Arrow by the ADBC driver) and ``parallelism`` 1 or 2 (reader
  slots);
* **JDBC**: ``spark.read.format("jdbc")`` with the PostgreSQL JDBC driver (Debian's
  ``libpostgresql-jdbc-java``, ``/usr/share/java/postgresql.jar``, passed as
  ``spark.jars``), ``partitionColumn=id``, ``lowerBound``/``upperBound`` the key's min/max,
  ``numPartitions=2``, ``fetchsize=10000``. If the jar is missing, the baseline is one
  psycopg connection's ``COPY (SELECT ...) TO STDOUT (FORMAT BINARY)`` turned into Arrow
  record batches of 10,000 rows (the least code that reads the table into Arrow), and the
  script says so.

Every read's row count, counted in the same job by an ``Observation``, must equal the
table's. Each read prints its time, rows/s and CPU seconds: of Spark's JVM, of Python (its
workers, and this script, where the COPY loop runs), of the PostgreSQL server (the
postmaster and its backends) and of the rest of the machine (``other``: another job on the
two cores shows there). The medians line adds each reader's CPU seconds per million rows:
on two cores, a reader that needs twice the CPU per row cannot keep up. The full run also
reads with a few other ``chunkSize`` values at parallelism 2 (not in the score).

**Latency.** A streaming query (``startupMode=latest``, slot ``bench_latency``, a small table
of its own, ``trigger(processingTime="0 seconds")``) writes into a ``foreachBatch`` sink that
collects each batch's ids and stamps them with ``time.time()`` once the batch's rows are on
the driver. After a warm-up (the query has run batches and read a marker row committed after
it started, so it is at the head of the log), a writer commits one-row ``INSERT``
transactions at a steady pace (``--rate``), stamping each with ``time.time()`` right after
its commit returns. Latency = arrival - commit, per row; the script prints the median and p99
over ``--changes`` rows and Spark's per-batch durations. They are not in the score.

The score is median(splitflow p2 rows/s) / median(JDBC rows/s).

    python bench/pg_snapshot.py           # 2,000,000 rows, 3 rounds, 1,000 changes
    python bench/pg_snapshot.py --quick   # 300,000 rows, 2 rounds, 200 changes (< 1 minute)

Last line: ``RESULT ratio_vs_baseline=<x> target=0.8``; below the target, a ``MISS`` line
comes before it (the exit code is still 0).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support, tests.spark

import pyarrow as pa

from _snapshot import CPU_HEADER, ServerCpu, Timed, local_session, noop_rows, report, run_rounds
from splitflow.testing.postgres import Postgres

TARGET = 0.8
JDBC_JAR = Path("/usr/share/java/postgresql.jar")
TABLE = "bench"
LIVE_TABLE = "bench_live"
SLOT = "bench_latency"
COLUMNS = (
    "id bigint PRIMARY KEY, qty int NOT NULL, name text NOT NULL, "
    "price numeric(12,2) NOT NULL, created timestamptz NOT NULL"
)


# -- the table -------------------------------------------------------------------------------


def fill(pg: Postgres, rows: int) -> float:
    """Create and fill the table (and the latency query's); vacuum so no read sets hint
    bits. Returns the seconds it took."""
    began = time.perf_counter()
    pg.execute(f"CREATE TABLE {TABLE} ({COLUMNS})")
    pg.execute(f"CREATE TABLE {LIVE_TABLE} ({COLUMNS})")
    pg.execute(
        f"INSERT INTO {TABLE} SELECT g, (g * 7919) % 100000, "
        "substr(md5(g::text) || md5((g + 1)::text), 1, 20), "
        "((g * 104729) % 100000000) / 100.0, "
        "timestamptz '2024-01-01 00:00:00+00' + g * interval '1.5 seconds' "
        f"FROM generate_series(1::bigint, {rows}) g"
    )
    pg.execute(f"VACUUM (FREEZE, ANALYZE) {TABLE}")
    return time.perf_counter() - began


# -- the readers -----------------------------------------------------------------------------


def splitflow_read(
    spark: Any, pg: Postgres, parallelism: int, chunk_size: int
) -> Callable[[], int]:
    def read() -> int:
        frame = (
            spark.read.format("splitflow-postgres-cdc")
            .option("conninfo", pg.conninfo())
            .option("tables", TABLE)
            .option("startupMode", "snapshotOnly")
            .option("chunkSize", str(chunk_size))
            .option("parallelism", str(parallelism))
            .load()
        )
        return noop_rows(frame)

    return read


def jdbc_read(spark: Any, pg: Postgres, low: int, high: int) -> Callable[[], int]:
    def read() -> int:
        frame = (
            spark.read.format("jdbc")
            .option("url", f"jdbc:postgresql://{pg.host}:{pg.port}/splitflow")
            .option("driver", "org.postgresql.Driver")
            .option("user", "splitflow")
            .option("password", "s3cret-pw")
            .option("dbtable", TABLE)
            .option("partitionColumn", "id")
            .option("lowerBound", str(low))
            .option("upperBound", str(high))
            .option("numPartitions", "2")
            .option("fetchsize", "10000")
            .load()
        )
        return noop_rows(frame)

    return read


def copy_read(pg: Postgres) -> Callable[[], int]:
    """The fallback baseline: one psycopg ``COPY ... TO STDOUT (FORMAT BINARY)`` into Arrow
    record batches of 10,000 rows."""
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("qty", pa.int32()),
            ("name", pa.string()),
            ("price", pa.decimal128(12, 2)),
            ("created", pa.timestamp("us", "UTC")),
        ]
    )

    def read() -> int:
        rows = 0
        with pg.connect() as conn, conn.cursor() as cursor:
            query = f"COPY (SELECT id, qty, name, price, created FROM {TABLE}) TO STDOUT"
            with cursor.copy(query + " (FORMAT BINARY)") as copy:
                copy.set_types(["int8", "int4", "text", "numeric", "timestamptz"])
                chunk: list[tuple[Any, ...]] = []
                for row in copy.rows():
                    chunk.append(row)
                    if len(chunk) == 10_000:
                        rows += _arrow(chunk, schema).num_rows
                        chunk = []
                if chunk:
                    rows += _arrow(chunk, schema).num_rows
        return rows

    return read


def _arrow(rows: list[tuple[Any, ...]], schema: pa.Schema) -> pa.RecordBatch:
    columns = list(zip(*rows, strict=True))
    return pa.RecordBatch.from_arrays(
        [pa.array(c, f.type) for c, f in zip(columns, schema, strict=True)], schema=schema
    )


# -- latency ---------------------------------------------------------------------------------


class Sink:
    """The foreachBatch sink: id -> ``time.time()`` when its batch's rows reached the driver."""

    def __init__(self) -> None:
        self.arrived: dict[int, float] = {}
        self.lock = threading.Lock()

    def __call__(self, frame: Any, batch_id: int) -> None:
        ids = [row[0] for row in frame.select("id").collect()]
        now = time.time()
        with self.lock:
            for key in ids:
                self.arrived.setdefault(key, now)

    def wait_for(self, keys: range, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if all(k in self.arrived for k in keys):
                    return True
            time.sleep(0.01)
        return False


def latency(spark: Any, pg: Postgres, changes: int, rate: float, work: Path) -> None:
    """Start the streaming query, warm it up, then time ``changes`` one-row commits."""
    sink = Sink()
    query = (
        spark.readStream.format("splitflow-postgres-cdc")
        .option("conninfo", pg.conninfo())
        .option("tables", LIVE_TABLE)
        .option("startupMode", "latest")
        .option("slotName", SLOT)
        .option("stateDir", str(work / "state"))
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(processingTime="0 seconds")
        .start()
    )
    insert = f"INSERT INTO {LIVE_TABLE} VALUES (%s, %s, 'live-change-00000000', 12.34, now())"
    try:
        with pg.connect() as conn:
            began = time.monotonic()
            while not query.recentProgress and time.monotonic() - began < 60:
                time.sleep(0.05)  # the first batch: the slot exists, the log is read
            warm = range(-200, -100)
            for key in warm:  # warm-up: a burst, then a trickle, then a marker at the head
                conn.execute(insert, (key, key))
            if not sink.wait_for(warm, 60):
                raise RuntimeError(f"warm-up rows never arrived: {query.lastProgress}")
            for key in range(-100, -1):
                conn.execute(insert, (key, key))
                time.sleep(1 / rate)
            conn.execute(insert, (-1, -1))
            if not sink.wait_for(range(-100, 0), 60):
                raise RuntimeError(f"warm-up rows never arrived: {query.lastProgress}")
            batches_before = len(query.recentProgress)
            committed: dict[int, float] = {}
            start = time.monotonic()
            for key in range(changes):
                wait = start + key / rate - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                conn.execute(insert, (key, key))
                committed[key] = time.time()
        if not sink.wait_for(range(changes), 60):
            missing = [k for k in range(changes) if k not in sink.arrived]
            raise RuntimeError(f"{len(missing)} changes never arrived: {query.lastProgress}")
        progress = query.recentProgress[batches_before:]
    finally:
        query.stop()
    seconds = sorted(sink.arrived[k] - committed[k] for k in range(changes))
    p50 = statistics.median(seconds)
    p99 = seconds[min(len(seconds) - 1, round(0.99 * len(seconds)) - 1)]
    durations = [p["durationMs"] for p in progress]
    phase = {
        name: statistics.median(d.get(name, 0) for d in durations)
        for name in ("triggerExecution", "latestOffset", "queryPlanning", "addBatch", "walCommit")
    }
    print(
        f"latency, commit to foreachBatch, {changes:,} one-row commits at {rate:g}/s: "
        f"median {p50 * 1e3:.0f} ms, p99 {p99 * 1e3:.0f} ms, max {seconds[-1] * 1e3:.0f} ms\n"
        f"  {len(progress)} batches meanwhile ({changes / max(1, len(progress)):.1f} rows "
        "each); median ms per batch: "
        + ", ".join(f"{name} {ms:.0f}" for name, ms in phase.items()),
        flush=True,
    )


# -- main ------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small run, under a minute")
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chunk-size", type=int, default=100_000)
    parser.add_argument(
        "--chunk-sizes",
        default="10000,25000,250000",
        help="other chunkSize values read once each at parallelism 2 (not in the score)",
    )
    parser.add_argument("--changes", type=int, default=1_000, help="latency: one-row commits")
    parser.add_argument("--rate", type=float, default=50.0, help="latency: commits per second")
    parser.add_argument(
        "--baseline", choices=("jdbc", "copy"), default="jdbc", help="copy: the psycopg loop"
    )
    args = parser.parse_args()
    if args.quick:
        args.rows, args.rounds, args.chunk_size, args.changes = 300_000, 2, 50_000, 200
        args.chunk_sizes = ""
    baseline = args.baseline
    if baseline == "jdbc" and not JDBC_JAR.is_file():
        print(
            f"no PostgreSQL JDBC driver at {JDBC_JAR} (apt install libpostgresql-jdbc-java): "
            "the baseline is a psycopg COPY ... TO STDOUT into Arrow loop instead",
            flush=True,
        )
        baseline = "copy"

    print(f"$ python bench/pg_snapshot.py {' '.join(sys.argv[1:])}".rstrip(), flush=True)
    with (
        tempfile.TemporaryDirectory(prefix="splitflow-pg-bench-") as tmp,
        Postgres.start(Path(tmp)) as pg,
    ):
        took = fill(pg, args.rows)
        low, high, count = pg.execute(f"SELECT min(id), max(id), count(*) FROM {TABLE}")[0]
        size = pg.execute(f"SELECT pg_size_pretty(pg_table_size('{TABLE}'))")[0][0]
        version = pg.execute("SHOW server_version")[0][0]
        print(
            f"table {TABLE}: {count:,} rows ({size}), filled in {took:.1f}s; PostgreSQL "
            f"{version}; {os.cpu_count()} cpus; load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        spark = local_session(JDBC_JAR if baseline == "jdbc" else None)

        server = ServerCpu(pg.pid_file)
        p1 = Timed(
            f"splitflow p1 c{args.chunk_size // 1000}k",
            splitflow_read(spark, pg, 1, args.chunk_size),
            count,
            server,
        )
        p2 = Timed(
            f"splitflow p2 c{args.chunk_size // 1000}k",
            splitflow_read(spark, pg, 2, args.chunk_size),
            count,
            server,
        )
        if baseline == "jdbc":
            base = Timed("jdbc 2 partitions", jdbc_read(spark, pg, low, high), count, server)
        else:
            base = Timed("psycopg COPY loop", copy_read(pg), count, server)
        print(CPU_HEADER, flush=True)
        for reader in (p2, base):  # warm-up: JVM, Python workers, the driver class
            reader.once("warm")
            reader.forget()
        run_rounds((p1, p2, base), args.rounds)
        for chunk in filter(None, args.chunk_sizes.split(",")):
            Timed(
                f"splitflow p2 c{int(chunk) // 1000}k",
                splitflow_read(spark, pg, 2, int(chunk)),
                count,
                server,
            ).once("extra")
        print(
            f"medians: splitflow p1 {p1.median:,.0f} rows/s, p2 {p2.median:,.0f} rows/s, "
            f"{base.label} {base.median:,.0f} rows/s; scaling p2/p1 "
            f"{p2.median / p1.median:.2f}; p1 vs baseline {p1.median / base.median:.2f}; "
            f"load average {os.getloadavg()[0]:.2f}\n"
            f"CPU seconds per million rows (medians): splitflow p1 {p1.cpu_per_million()}; "
            f"p2 {p2.cpu_per_million()}; {base.label} {base.cpu_per_million()}",
            flush=True,
        )
        latency(spark, pg, args.changes, args.rate, Path(tmp))
        spark.stop()
    report(p2.median / base.median, TARGET)


if __name__ == "__main__":
    main()
