"""Snapshot rows per second from MariaDB: splitflow-mysql-cdc at parallelism 1 and 2 against
a plain client loop reading the same table.

A throw-away MariaDB on loopback (``tests.support.mariadb``: tmpfs, row binlog) holds one
table of N rows (``id BIGINT`` primary key, an ``INT``, a ``VARCHAR(20)``, a
``DECIMAL(12,2)`` and a ``DATETIME(6)``), filled from the ``seq`` engine and analyzed
before anything is timed. One ``local[2]`` Spark session reads the whole table with:

* **splitflow p1 / p2**: ``spark.read.format("splitflow-mysql-cdc")`` (the snapshot: key-range
  chunks of ``chunkSize`` rows, each read with PyMySQL in a consistent snapshot and turned
  into Arrow) with ``parallelism`` 1 or 2, timed around
  ``df.write.format("noop").mode("overwrite").save()`` (planning, tasks, the server's scan,
  Arrow into the JVM); the row count, from an ``Observation`` in the same job, must be the
  table's;
* **the client loop**: one PyMySQL connection, ``SELECT * FROM t`` through an unbuffered
  ``SSCursor``, ``fetchmany(10000)`` until the end, each batch's tuples kept no further: the
  least a Python program does to read the table with the same driver.

The three alternate over the rounds, so noise hits them all. Each read prints its time,
rows/s and CPU seconds: of Spark's JVM, of Python (its workers, and this script, where the
client loop runs), of the server (``mariadbd``) and of the rest of the machine (``other``);
the medians line adds each reader's CPU seconds per million rows. The score is
median(splitflow p2 rows/s) / median(client loop rows/s).

    python bench/cdc_snapshot.py           # 1,000,000 rows, 3 rounds
    python bench/cdc_snapshot.py --quick   # 200,000 rows, 2 rounds (about a minute)

Last line: ``RESULT ratio_vs_baseline=<x> target=0.8``; below the target, a ``MISS`` line
comes before it (the exit code is still 0).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support, tests.spark

from tests.support.mariadb import MariaDB

from _snapshot import CPU_HEADER, ServerCpu, Timed, local_session, noop_rows, report, run_rounds

TARGET = 0.8
TABLE = "bench"
COLUMNS = (
    "id BIGINT PRIMARY KEY, qty INT NOT NULL, name VARCHAR(20) NOT NULL, "
    "price DECIMAL(12,2) NOT NULL, created DATETIME(6) NOT NULL"
)


def fill(db: MariaDB, rows: int) -> float:
    began = time.perf_counter()
    db.execute(f"CREATE TABLE {TABLE} ({COLUMNS})")
    db.execute(
        f"INSERT INTO {TABLE} SELECT seq, (seq * 7919) % 100000, "
        "SUBSTR(CONCAT(MD5(seq), MD5(seq + 1)), 1, 20), ((seq * 104729) % 100000000) / 100.0, "
        "TIMESTAMP '2024-01-01 00:00:00' + INTERVAL (seq * 1500000) MICROSECOND "
        f"FROM seq_1_to_{rows}"
    )
    db.execute(f"ANALYZE TABLE {TABLE}")
    return time.perf_counter() - began


def splitflow_read(spark: Any, db: MariaDB, parallelism: int, chunk_size: int) -> Callable[[], int]:
    settings = db.connection_settings()

    def read() -> int:
        frame = (
            spark.read.format("splitflow-mysql-cdc")
            .option("hostname", settings["host"])
            .option("port", str(settings["port"]))
            .option("username", settings["user"])
            .option("password", settings["password"])
            .option("databaseName", settings["database"])
            .option("tableName", TABLE)
            .option("chunkSize", str(chunk_size))
            .option("parallelism", str(parallelism))
            .load()
        )
        return noop_rows(frame)

    return read


def client_loop(db: MariaDB) -> Callable[[], int]:
    def read() -> int:
        import pymysql

        rows = 0
        conn = db.connect(cursorclass=pymysql.cursors.SSCursor)
        try:
            with conn.cursor() as cursor:
                cursor.execute(f"SELECT * FROM {TABLE}")
                while batch := cursor.fetchmany(10_000):
                    rows += len(batch)
        finally:
            conn.close()
        return rows

    return read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small run, about a minute")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chunk-size", type=int, default=50_000)
    args = parser.parse_args()
    if args.quick:
        args.rows, args.rounds, args.chunk_size = 200_000, 2, 25_000

    print(f"$ python bench/cdc_snapshot.py {' '.join(sys.argv[1:])}".rstrip(), flush=True)
    with (
        tempfile.TemporaryDirectory(prefix="splitflow-mariadb-bench-") as tmp,
        MariaDB.start(Path(tmp)) as db,
    ):
        took = fill(db, args.rows)
        ((count,),) = db.execute(f"SELECT COUNT(*) FROM {TABLE}")
        ((version,),) = db.execute("SELECT VERSION()")
        print(
            f"table {TABLE}: {count:,} rows, filled in {took:.1f}s; MariaDB {version}; "
            f"{os.cpu_count()} cpus; load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        spark = local_session()
        server = ServerCpu(db.pid_file)
        c = args.chunk_size // 1000
        p1 = Timed(
            f"splitflow p1 c{c}k", splitflow_read(spark, db, 1, args.chunk_size), count, server
        )
        p2 = Timed(
            f"splitflow p2 c{c}k", splitflow_read(spark, db, 2, args.chunk_size), count, server
        )
        base = Timed("PyMySQL client loop", client_loop(db), count, server)
        print(CPU_HEADER, flush=True)
        for timed in (p2, p1, base):  # warm-up: JVM, Python workers, the server's caches
            timed.once("warm")
            timed.forget()
        run_rounds((p1, p2, base), args.rounds)
        spark.stop()
    print(
        "medians: "
        + ", ".join(f"{t.label} {t.median:,.0f} rows/s" for t in (p1, p2, base))
        + f"; p2/p1 {p2.median / p1.median:.2f}\n"
        + "CPU seconds per million rows (medians): "
        + "; ".join(f"{t.label} {t.cpu_per_million()}" for t in (p1, p2, base)),
        flush=True,
    )
    report(p2.median / base.median, TARGET)


if __name__ == "__main__":
    main()
