"""The first query of an application: splitflow's files source vs Spark's own file source.

A scheduled ``availableNow`` job is a new Spark application each time: its one query is the
first one, and pays what a long-running session pays once (the JVM's classes and JIT, and
for a Python data source its Python processes). This benchmark runs that job in fresh
processes, side by side: each run is a new Python driver with a new ``local[2]`` session
that reads two small Parquet files (2,000 rows, ``id bigint, value bigint``, the schema
given) with ``trigger(availableNow=True)`` into the noop sink, three ways:

* ``spark``: ``spark.readStream.parquet``;
* ``splitflow``: ``import splitflow.spark``, ``register(spark)``, then
  ``format("splitflow-files")``;
* ``splitflow cold``: the same with ``SPLITFLOW_WARM_START=0`` (no warm process: every
  Python process Spark starts for the source imports pyspark from ``pyspark.zip`` and the
  rest anew).

A run's time is from the session's creation to the query's termination: for splitflow it
includes importing and registering it (what a job using it does), not the session's own
start, which is the same for all. Also printed per way (medians): ``register``, ``load``
(``readStream...load()``, which creates the data source in a Python process for
splitflow), ``start`` (from ``start()`` to the first batch's trigger) and ``addBatch``.
The ways run in turn, round after round, the order rotating each round.

    python bench/first_query.py            # 5 rounds
    python bench/first_query.py --quick    # 1 round (< 1 minute)

Last line: ``RESULT first_query_speed_vs_spark=<ratio> target=>=0.83``: Spark's time over
splitflow's (median of the rounds' ratios). The target is the issue's bound on a query's
start, Spark's own plus 20% (1 / 1.2); a ``MISS`` line comes before it when it is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.spark

WAYS = {"spark": {}, "splitflow": {}, "splitflow cold": {"SPLITFLOW_WARM_START": "0"}}
TARGET = 1 / 1.2
ROWS = 1_000  # per file, two files
PARTS = ("total", "register", "load", "start", "addBatch")


def write_files(directory: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    for f in range(2):
        ids = pa.array(range(f * ROWS, (f + 1) * ROWS), pa.int64())
        pq.write_table(pa.table({"id": ids, "value": ids}), directory / f"part-{f}.parquet")


def job(way: str, directory: str) -> dict[str, float]:
    """The job itself, in this (fresh) process: the seconds of its parts."""
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    began = time.perf_counter()
    stream = spark.readStream.schema("id bigint, value bigint")
    if way == "spark":
        registered = time.perf_counter()
        frame = stream.parquet(directory)
    else:
        from splitflow.spark import register

        register(spark)
        registered = time.perf_counter()
        frame = stream.format("splitflow-files").option("format", "parquet").load(directory)
    loaded = time.perf_counter()
    with tempfile.TemporaryDirectory() as checkpoint:
        writer = (
            frame.writeStream.format("noop")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
        )
        started_at = time.time()
        query = writer.start()
        query.awaitTermination()
        ended = time.perf_counter()
        progress = [p for p in query.recentProgress if "batchId" in p]
    rows = sum(int(p["numInputRows"]) for p in progress)
    if query.exception() is not None or rows != 2 * ROWS:
        raise SystemExit(f"{way}: the query read {rows} rows: {query.exception()}")
    first = progress[0]
    trigger = datetime.fromisoformat(first["timestamp"].replace("Z", "+00:00")).timestamp()
    spark.stop()
    return {
        "total": ended - began,
        "register": registered - began,
        "load": loaded - registered,
        "start": trigger - started_at,
        "addBatch": first["durationMs"]["addBatch"] / 1e3,
    }


def run(way: str, directory: Path) -> dict[str, float]:
    """One job in a fresh Python process."""
    from tests.spark.support import spark_env

    env = {**os.environ, **spark_env(), **WAYS[way]}
    done = subprocess.run(
        [sys.executable, __file__, "--job", way, str(directory)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise SystemExit(f"{way}: the job failed:\n{done.stderr[-3000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 round (< 1 minute)")
    parser.add_argument("--rounds", type=int, help="rounds (5; --quick 1)")
    parser.add_argument("--job", nargs=2, metavar=("WAY", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job:
        print(json.dumps(job(*args.job)))
        return
    rounds = args.rounds or (1 if args.quick else 5)
    print(f"$ python bench/first_query.py {' '.join(sys.argv[1:])}".rstrip())
    print(
        f"first_query: a fresh local[2] application per run, 2 files x {ROWS:,} rows, "
        f"availableNow into noop; {rounds} rounds; load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cpus)"
    )
    results: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    ways = list(WAYS)
    with tempfile.TemporaryDirectory(prefix="first_query-") as work:
        write_files(Path(work))
        for r in range(rounds):
            order = ways[r % len(ways) :] + ways[: r % len(ways)]
            line = []
            for way in order:
                done = run(way, Path(work))
                results[way].append(done)
                line.append(f"{way} {done['total']:.2f} s")
            print(f"round {r}: " + ", ".join(line), flush=True)
    print(f"{'median s':<16}" + "".join(f"{part:>10}" for part in PARTS))
    for way, runs in results.items():
        row = "".join(f"{statistics.median(x[part] for x in runs):10.3f}" for part in PARTS)
        print(f"{way:<16}{row}")
    spark = [run["total"] for run in results["spark"]]

    def speed(way: str) -> list[float]:
        return [s / run["total"] for s, run in zip(spark, results[way], strict=True)]

    ratios, cold = speed("splitflow"), speed("splitflow cold")
    ratio = statistics.median(ratios)
    print(f"speed vs Spark: splitflow {ratio:.3f} ({', '.join(f'{x:.3f}' for x in ratios)})")
    print(f"speed vs Spark: splitflow cold {statistics.median(cold):.3f}")
    if ratio < TARGET:
        print(f"MISS first_query_speed_vs_spark={ratio:.3f} is below the target {TARGET:.2f}")
    print(f"RESULT first_query_speed_vs_spark={ratio:.3f} target=>={TARGET:.2f}")


if __name__ == "__main__":
    main()
