"""splitflow's files source vs Spark's own Parquet reader, on the same Parquet files.

One directory of Parquet files (id bigint, value double, category string, flag boolean;
row groups of 128k rows) is read by both, in one SparkSession, with the same number of
tasks: Spark's reader gets ``spark.sql.files.maxPartitionBytes`` set so that it plans
about ``--tasks`` partitions, and splitflow gets as many reader slots and the same cut
(``maxSplitBytes`` = ``maxPartitionBytes``). The query is a
full-scan aggregate over every column (``count, sum(id), sum(value), max(category),
sum(flag)``), so every value is decoded and handed to Spark. All readers are warmed up,
then run in turn, round after round (splitflow, Spark, the two below, splitflow, ...); the
score is the median of the per-round ratios splitflow / Spark. Results must be equal or the
run stops.

To say where the time goes, the script also times (not in the score) two Python data
sources from this script on the same data with the same tasks: a minimal one that yields
the same Arrow batches from the same Parquet files (the least code any Python source needs),
and a ceiling one that yields the batches memory-mapped from Arrow IPC copies of the files
(no decoding at all: what Spark's Python Data Source API costs by itself). It prints the CPU
seconds the JVM and the Python workers used in each (processes of this script only, see
``_proc_cpu``), the CPU seconds of the decode alone in this process (pyarrow reading and
conforming the files on one thread, no Spark), and the load average at the start.

    python bench/files_vs_parquet.py            # 8 files x 1.25M rows, 5 pairs
    python bench/files_vs_parquet.py --quick    # 8 files x 250k rows, 3 pairs (< 1 minute)

Last line: ``RESULT ratio_vs_spark_parquet=<splitflow rows/s / Spark rows/s> target=>=0.9``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from _proc_cpu import spark_cpu_used, spark_processes
from splitflow.connectors.files.formats import conform
from splitflow.spark import register

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("value", pa.float64()),
        ("category", pa.string()),
        ("flag", pa.bool_()),
    ]
)
QUERY = (
    "count(*) AS n",
    "sum(id) AS s_id",
    "round(sum(value), 3) AS s_value",
    "max(category) AS m_cat",
    "sum(cast(flag AS int)) AS s_flag",
)


def write_files(directory: str, files: int, rows: int) -> int:
    """``files`` Parquet files of ``rows`` rows; returns their total size in bytes."""
    rng = np.random.default_rng(7)
    categories = np.array([f"category-{i:03d}" for i in range(200)])
    total = 0
    for f in range(files):
        ids = np.arange(f * rows, (f + 1) * rows, dtype=np.int64)
        table = pa.table(
            {
                "id": ids,
                "value": rng.random(rows),
                "category": categories[rng.integers(0, len(categories), rows)],
                "flag": rng.random(rows) < 0.5,
            },
            schema=SCHEMA,
        )
        path = os.path.join(directory, f"part-{f:04d}.parquet")
        pq.write_table(table, path, row_group_size=128 * 1024)
        total += os.path.getsize(path)
    return total


class _MinimalParquetReader(DataSourceReader):
    def __init__(self, files: list[str], tasks: int) -> None:
        self.files, self.tasks = files, tasks

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(self.files[i :: self.tasks]) for i in range(self.tasks)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        for path in partition.value:
            pf = pq.ParquetFile(path)
            for index in range(pf.num_row_groups):
                yield from conform(pf.read_row_group(index), SCHEMA, path, 0)


class _ArrowIpcReader(_MinimalParquetReader):
    def read(self, partition: InputPartition) -> Iterator[Any]:
        for path in partition.value:
            with pa.memory_map(path) as mapped:
                file = pa.ipc.open_file(mapped)
                for index in range(file.num_record_batches):
                    yield file.get_batch(index)


class MinimalParquetSource(DataSource):
    """Diagnostic baseline: the least Python data source yielding the same Arrow batches."""

    @classmethod
    def name(cls) -> str:
        return "minimal-parquet"

    read_with = _MinimalParquetReader

    def schema(self) -> str:
        return "id bigint, value double, category string, flag boolean"

    def reader(self, schema: Any) -> DataSourceReader:
        directory = self.options["path"]
        files = sorted(os.path.join(directory, n) for n in os.listdir(directory))
        return self.read_with(files, int(self.options["tasks"]))


class ArrowIpcSource(MinimalParquetSource):
    """Diagnostic ceiling: batches memory-mapped from Arrow IPC files, no decoding."""

    @classmethod
    def name(cls) -> str:
        return "arrow-ipc"

    read_with = _ArrowIpcReader


def write_arrow_copies(directory: str, into: str) -> None:
    """Each Parquet file of ``directory`` as an Arrow IPC file in ``into``, same batches."""
    os.makedirs(into)
    for name in sorted(os.listdir(directory)):
        pf = pq.ParquetFile(os.path.join(directory, name))
        with pa.ipc.new_file(os.path.join(into, name + ".arrow"), SCHEMA) as out:
            for index in range(pf.num_row_groups):
                for batch in conform(pf.read_row_group(index), SCHEMA, name, 0):
                    out.write_batch(batch)


def spark_parquet(spark: SparkSession, directory: str) -> Any:
    return spark.read.parquet(directory)


def splitflow_files(spark: SparkSession, directory: str, tasks: int, split_bytes: int) -> Any:
    return (
        spark.read.format("splitflow-files")
        .option("path", directory)
        .option("format", "parquet")
        .option("parallelism", tasks)
        .option("maxSplitBytes", split_bytes)  # files cut as Spark cuts them
        .load()
    )


def timed(frame: Any, cpu: list[dict[str, float]] | None = None) -> tuple[float, tuple[Any, ...]]:
    """Seconds and result of the query on ``frame``; appends the CPU it used to ``cpu``."""
    before = spark_processes()
    started = time.perf_counter()
    row = frame.selectExpr(*QUERY).collect()[0]
    took = time.perf_counter() - started
    if cpu is not None:
        cpu.append(spark_cpu_used(before))
    return took, tuple(row)


def decode_only(directory: str) -> float:
    """CPU seconds for pyarrow to read and conform every row group here, on one thread."""
    started = time.process_time()
    for name in sorted(os.listdir(directory)):
        pf = pq.ParquetFile(os.path.join(directory, name))
        for index in range(pf.num_row_groups):
            conform(pf.read_row_group(index, use_threads=False), SCHEMA, name, 0)
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tasks", type=int, default=4, help="Spark's Parquet partitions")
    args = parser.parse_args()
    files, rows, pairs = (8, 250_000, 3) if args.quick else (8, 1_250_000, 5)
    total_rows = files * rows
    workdir = tempfile.mkdtemp(prefix="files_vs_parquet-")
    directory, arrow_copies = os.path.join(workdir, "parquet"), os.path.join(workdir, "arrow")
    try:
        os.makedirs(directory)
        size = write_files(directory, files, rows)
        write_arrow_copies(directory, arrow_copies)
        split_bytes = size // args.tasks + 1
        spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            # the same number of tasks for both readers
            .config("spark.sql.files.maxPartitionBytes", str(split_bytes))
            .config("spark.sql.files.openCostInBytes", "0")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        spark.dataSource.register(MinimalParquetSource)
        spark.dataSource.register(ArrowIpcSource)
        theirs_frame = spark_parquet(spark, directory)
        tasks = theirs_frame.rdd.getNumPartitions()  # the others get as many tasks
        frames = {
            "splitflow": splitflow_files(spark, directory, tasks, split_bytes),
            "spark.read.parquet": theirs_frame,
            "minimal Python source": spark.read.format("minimal-parquet")
            .option("path", directory)
            .option("tasks", tasks)
            .load(),
            "ceiling (Arrow IPC, no decode)": spark.read.format("arrow-ipc")
            .option("path", arrow_copies)
            .option("tasks", tasks)
            .load(),
        }
        parts = (tasks, frames["splitflow"].rdd.getNumPartitions())
        print(
            f"files_vs_parquet: {files} files x {rows:,} rows = {total_rows:,} rows, "
            f"{size / 1e6:.1f} MB, tasks spark/splitflow = {parts[0]}/{parts[1]}, {pairs} pairs, "
            f"local[2], load average {os.getloadavg()[0]:.2f}"
        )
        for _ in range(2):  # warm up all: JVM, Python workers, file cache
            for frame in frames.values():
                timed(frame)
        rates: dict[str, list[float]] = {name: [] for name in frames}
        cpu: dict[str, list[dict[str, float]]] = {name: [] for name in frames}
        ratios = []
        for i in range(pairs):
            results = {}
            for name, frame in frames.items():
                took, results[name] = timed(frame, cpu[name])
                rates[name].append(total_rows / took)
            if len(set(results.values())) != 1:
                raise SystemExit(f"results differ: {results}")
            ratios.append(rates["splitflow"][-1] / rates["spark.read.parquet"][-1])
            print(
                f"pair {i}: splitflow {rates['splitflow'][-1] / 1e6:6.2f} M rows/s   "
                f"spark.read.parquet {rates['spark.read.parquet'][-1] / 1e6:6.2f} M rows/s   "
                f"ratio {ratios[-1]:.3f}"
            )
        ratio = statistics.median(ratios)
        print(
            f"{'median of ' + str(pairs):32} {'M rows/s':>9} {'JVM cpu s':>10} {'Python cpu s':>13}"
        )
        for name in frames:
            jvm = statistics.median(c["jvm"] for c in cpu[name])
            python = statistics.median(c["python"] for c in cpu[name])
            rate = statistics.median(rates[name]) / 1e6
            print(f"{name:32} {rate:9.2f} {jvm:10.2f} {python:13.2f}")
        decode = decode_only(directory)
        print(
            f"decode alone (pyarrow read + conform, 1 thread, no Spark): {decode:.2f} cpu s "
            f"= {total_rows / decode / 1e6:.2f} M rows/s"
        )
        spark.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if ratio < 0.9:
        print(f"MISS: ratio {ratio:.3f} is below the target 0.9")
    print(f"RESULT ratio_vs_spark_parquet={ratio:.3f} target=>=0.9")


if __name__ == "__main__":
    main()
