"""Rows per second per core of the generator source through Spark, beside a minimal source.

Side by side in one SparkSession (``local[2]``, so 2 cores): the ``splitflow-generator``
source and the least code that yields the same Arrow batches (``MinimalArrowSource`` of
``bench/spark_overhead.py``, reused here), over the same splits and partitions, each
queried with a full-scan aggregate over all four columns (``count, sum(id), sum(value),
max(split), max(event_time)``). The generator runs with ``startTime=0`` so its rows equal
the minimal source's, event times included; the results must be equal. Runs alternate
(generator, minimal, ...); the score is the median generator throughput divided by the
cores. A streaming figure follows: the endless, unthrottled generator
(``maxRecordsPerBatch``) into Spark's ``noop`` sink, rows over the batches' trigger time.

    python bench/generator_rate.py            # 4 splits x 5M rows, 5 pairs, 8 stream batches
    python bench/generator_rate.py --quick    # 4 splits x 400k rows, 2 pairs, 2 (< 1 minute)

Last line: ``RESULT generator_rows_per_sec_per_core=<rows/s/core> target=>=1000000``.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from splitflow.job.pipeline import stop_between_batches

CORES = 2
TARGET = 1_000_000
QUERY = (
    "count(*) AS n",
    "sum(id) AS s_id",
    "sum(value) AS s_value",
    "max(split) AS m_split",
    "max(event_time) AS m_time",
)


def _spark_overhead() -> Any:
    """``bench/spark_overhead.py`` as a module (bench/ is not a package)."""
    path = Path(__file__).with_name("spark_overhead.py")
    spec = importlib.util.spec_from_file_location("spark_overhead", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["spark_overhead"] = module
    spec.loader.exec_module(module)
    from pyspark import cloudpickle  # workers cannot import spark_overhead by name

    cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]
    return module


def stream_rate(spark: Any, splits: int, batch_records: int, batches: int) -> float:
    """Rows per second of the endless generator into the noop sink, over ``batches``."""
    query = (
        spark.readStream.format("splitflow-generator")
        .option("splits", splits)
        .option("parallelism", splits)
        .option("rowsPerSplit", "unbounded")
        .option("maxRecordsPerBatch", batch_records)
        .load()
        .writeStream.format("noop")
        .trigger(processingTime="0 seconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 300
        while len([p for p in query.recentProgress if p["numInputRows"]]) < batches + 1:
            if time.monotonic() > deadline or not query.isActive:
                raise SystemExit(f"the streaming query did not run {batches} batches")
            time.sleep(0.1)
        done = [p for p in query.recentProgress if p["numInputRows"]][1 : batches + 1]
    finally:
        stop_between_batches(query)
    rows = sum(p["numInputRows"] for p in done)
    millis = sum(p["durationMs"]["triggerExecution"] for p in done)
    return float(rows / (millis / 1000))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    overhead = _spark_overhead()  # sets PYSPARK_PYTHON and SPARK_LOCAL_IP before Spark
    from pyspark.sql import SparkSession

    from splitflow.spark import register

    splits, rows, pairs, batches = (4, 400_000, 2, 2) if args.quick else (4, 5_000_000, 5, 8)
    batch_rows = 65_536
    spark = (
        SparkSession.builder.master(f"local[{CORES}]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    spark.dataSource.register(overhead.MinimalArrowSource)
    total = splits * rows
    print(
        f"generator_rate: {splits} splits x {rows:,} rows = {total:,} rows, {pairs} pairs, "
        f"local[{CORES}]"
    )

    def timed(fmt: str, count: int) -> tuple[float, tuple[Any, ...]]:
        result: tuple[float, tuple[Any, ...]] = overhead.run(
            spark, fmt, splits, count, batch_rows, QUERY, startTime="0"
        )
        return result

    for fmt in ("splitflow-generator", "minimal-arrow"):  # warm up (first query pays start-up)
        timed(fmt, 10_000)
    ours, theirs = [], []
    for i in range(pairs):
        t_ours, r_ours = timed("splitflow-generator", rows)
        t_min, r_min = timed("minimal-arrow", rows)
        if r_ours != r_min:
            raise SystemExit(f"results differ: generator {r_ours} vs minimal {r_min}")
        ours.append(total / t_ours)
        theirs.append(total / t_min)
        print(
            f"pair {i}: generator {total / t_ours / 1e6:6.2f} M rows/s   "
            f"minimal {total / t_min / 1e6:6.2f} M rows/s   ratio {t_min / t_ours:.3f}"
        )
    rate, baseline = statistics.median(ours), statistics.median(theirs)
    print(
        f"median: generator {rate / 1e6:.2f} M rows/s ({rate / CORES / 1e6:.2f} per core), "
        f"minimal {baseline / 1e6:.2f} M rows/s, ratio {rate / baseline:.3f}"
    )
    streaming = stream_rate(spark, splits, rows // 2, batches)
    print(
        f"streaming: endless generator, {rows // 2:,} rows per batch -> noop: "
        f"{streaming / 1e6:.2f} M rows/s ({streaming / CORES / 1e6:.2f} per core)"
    )
    spark.stop()
    per_core = rate / CORES
    if per_core < TARGET:
        print(f"MISS: {per_core:,.0f} rows/s per core is below the target {TARGET:,}")
    print(f"RESULT generator_rows_per_sec_per_core={per_core:.0f} target=>={TARGET}")


if __name__ == "__main__":
    main()
