"""splitflow on Spark vs a minimal hand-written Arrow Python data source, same rows.

Both sources produce exactly the same rows (the generator connector's
``make_batch``: split int, id bigint, value bigint) as Arrow record batches of the same
size, over the same number of partitions, in one SparkSession. Each query is a full-scan
aggregate over all columns (``count, sum(id), sum(value), max(split)``), so Spark must
materialise every row. Runs alternate (splitflow, minimal, splitflow, ...) so that noise
hits both; the score is the median of per-pair throughput ratios.

    python bench/spark_overhead.py            # 4 splits x 5M rows, 5 pairs
    python bench/spark_overhead.py --quick    # 4 splits x 1M rows, 3 pairs (< 1 minute)

Last line: ``RESULT ratio_vs_minimal_arrow_source=<splitflow rows/s / minimal rows/s>
target=>=0.9``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    InputPartition,
)

from splitflow.connectors.generator import SPARK_SCHEMA, make_batch
from splitflow.spark import register


class _MinimalReader(DataSourceReader):
    def __init__(self, splits: int, rows: int, batch_rows: int) -> None:
        self.splits, self.rows, self.batch_rows = splits, rows, batch_rows

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(i) for i in range(self.splits)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        for start in range(0, self.rows, self.batch_rows):
            yield make_batch(partition.value, start, min(self.rows, start + self.batch_rows))


class MinimalArrowSource(DataSource):
    """The baseline: the least code that yields the same Arrow batches."""

    @classmethod
    def name(cls) -> str:
        return "minimal-arrow"

    def schema(self) -> str:
        return SPARK_SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        o = self.options
        return _MinimalReader(int(o["splits"]), int(o["rowspersplit"]), int(o["batchrows"]))


QUERY = ("count(*) AS n", "sum(id) AS s_id", "sum(value) AS s_value", "max(split) AS m_split")


def run(
    spark: SparkSession,
    fmt: str,
    splits: int,
    rows: int,
    batch_rows: int,
    query: tuple[str, ...] = QUERY,
    **options: Any,
) -> tuple[float, tuple[Any, ...]]:
    """Time ``query`` over ``splits`` x ``rows`` rows of ``fmt``; extra ``options`` for it."""
    reader = (
        spark.read.format(fmt)
        .option("splits", splits)
        .option("rowsPerSplit", rows)
        .option("batchRows", batch_rows)
        .option("parallelism", splits)
        .options(**options)
    )
    started = time.perf_counter()
    row = reader.load().selectExpr(*query).collect()[0]
    return time.perf_counter() - started, tuple(row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    splits, rows, pairs = (4, 1_000_000, 3) if args.quick else (4, 5_000_000, 5)
    batch_rows = 65_536
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    spark.dataSource.register(MinimalArrowSource)
    total = splits * rows
    print(
        f"spark_overhead: {splits} splits x {rows:,} rows = {total:,} rows, {pairs} pairs, local[2]"
    )
    for fmt in ("splitflow-generator", "minimal-arrow"):  # warm up both (first query pays start-up)
        run(spark, fmt, splits, 10_000, batch_rows)
    ratios, ours, theirs = [], [], []
    for i in range(pairs):
        t_ours, r_ours = run(spark, "splitflow-generator", splits, rows, batch_rows)
        t_min, r_min = run(spark, "minimal-arrow", splits, rows, batch_rows)
        if r_ours != r_min:
            raise SystemExit(f"results differ: splitflow {r_ours} vs minimal {r_min}")
        ours.append(total / t_ours)
        theirs.append(total / t_min)
        ratios.append(t_min / t_ours)
        print(
            f"pair {i}: splitflow {total / t_ours / 1e6:6.2f} M rows/s   "
            f"minimal {total / t_min / 1e6:6.2f} M rows/s   ratio {t_min / t_ours:.3f}"
        )
    ratio = statistics.median(ratios)
    print(
        f"median: splitflow {statistics.median(ours) / 1e6:.2f} M rows/s, "
        f"minimal {statistics.median(theirs) / 1e6:.2f} M rows/s"
    )
    spark.stop()
    if ratio < 0.9:
        print(f"MISS: ratio {ratio:.3f} is below the target 0.9")
    print(f"RESULT ratio_vs_minimal_arrow_source={ratio:.3f} target=>=0.9")


if __name__ == "__main__":
    main()
