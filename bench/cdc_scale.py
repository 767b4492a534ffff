"""A CDC snapshot of many chunks, streamed end to end on local Spark: planning time per
micro-batch, exactly once, and the driver's peak memory.

A throw-away PostgreSQL 15 on loopback (``splitflow.testing.postgres``) holds one narrow table
of N rows (``id bigint`` primary key, ``v int``; ids 1..N, dense), filled with
``generate_series`` and analyzed. One ``local[2]`` session streams it with
``spark.readStream.format("splitflow-postgres-cdc")`` (``startupMode=initial``, ``chunkSize``
50 by default: N / 50 chunks, 100k at 5M rows; ``maxChunksPerBatch``; ``parallelism`` 2;
``stateDir``) into a Parquet sink, ``trigger(processingTime="1 second")``, until the batches'
``numInputRows`` add up to N (the snapshot is read; the log split then has nothing to read),
and stops the query. Every batch's progress is kept by ``batchId`` as the query runs
(``recentProgress`` holds only the last hundred).

Printed:

* **exactly once**: the sink read back with Spark (``count``, ``count(DISTINCT id)``, min and
  max ``id``, rows whose ``op`` is not ``r``). Every id 1..N once, all snapshot reads, or the
  script fails (exit code 1): a correctness failure, not a miss.
* **planning**: of the batches that read rows, the median and p90 of ``durationMs``'s
  ``latestOffset`` (Spark asking the source for the batch's end offset: the source's
  planning, in the streaming runner process; the first batch's includes ``initialOffset``,
  where the table is cut into chunks, and is printed on its own), and the medians of
  ``queryPlanning``, ``addBatch`` (the batch's tasks: reading the chunks, writing Parquet),
  ``walCommit``, ``commitOffsets`` and ``triggerExecution``; the number of batches, of
  batches that ran and read nothing between the first and the last data batch (``empty``,
  from the checkpoint's ``commits``), the time from ``start()`` to the end of the first data
  batch and of the last (the wall time, from the batches' own timestamps) and rows/s.
* **driver memory**: PySpark runs a Python streaming source's driver side (the planner, the
  enumerator) in its own process, ``python -m
  pyspark.sql.streaming.python_streaming_source_runner``, a child of Spark's JVM (only this
  script's descendants count: another Spark job on the machine is not measured). A thread
  reads ``VmHWM`` and ``VmRSS`` from ``/proc/<pid>/status`` of that process (and of the
  JVM) every half second while the query runs; the peaks are printed in MiB, with the
  runner's resident set after the first data batch, to tell its start from its growth.

The target (the acceptance criterion of the many-chunks snapshot): median ``latestOffset``
under 100 ms at 100k chunks; the peak memory has no target, it is printed.

    python bench/cdc_scale.py                 # 5,000,000 rows, chunkSize 50: 100k chunks
    python bench/cdc_scale.py --rows 1000000  # 20k chunks
    python bench/cdc_scale.py --quick         # 200,000 rows: 4k chunks (< 1 minute)

Last line: ``RESULT planning_ms_median_<K>k=<ms> peak_runner_mib=<MiB> target=<=100,none``,
where K is the number of chunks in thousands (the name states the size it measured, so a
quick run is never taken for the 100k figure); above the target, a ``MISS`` line comes
before it (the exit code is still 0).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.spark (in _snapshot)

from tests.spark.support import log_ids

from _proc_cpu import is_runner, spark_processes
from _snapshot import local_session
from splitflow.testing.postgres import Postgres

TARGET_MS = 100.0
TABLE = "scale"
PHASES = ("queryPlanning", "addBatch", "walCommit", "commitOffsets", "triggerExecution")
MIB = 1024 * 1024


class Failed(Exception):
    """The query failed, timed out, or did not write every row exactly once."""


def fill(pg: Postgres, rows: int) -> float:
    """Create and fill the table, then analyze it; the seconds it took."""
    began = time.perf_counter()
    pg.execute(f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, v int NOT NULL)")
    pg.execute(
        f"INSERT INTO {TABLE} SELECT g, (g * 7919) % 100000 "
        f"FROM generate_series(1::bigint, {rows}) g"
    )
    pg.execute(f"VACUUM (FREEZE, ANALYZE) {TABLE}")  # no read sets hint bits
    return time.perf_counter() - began


# -- memory ----------------------------------------------------------------------------------


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise ValueError(f"no {field} in /proc/{pid}/status")


class MemoryWatch(threading.Thread):
    """Every ``every`` seconds, the ``VmHWM`` (peak resident set) and ``VmRSS`` of this
    process's streaming source runners and of its JVM, in KiB; the largest seen of each kind
    is kept (a process that ended keeps the last value read)."""

    def __init__(self, every: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.every = every
        self.peak = {"runner": 0, "jvm": 0}  # VmHWM
        self.rss = {"runner": 0, "jvm": 0}  # VmRSS at the last poll
        self.runners: set[int] = set()
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            self.poll()
            self._done.wait(self.every)

    def poll(self) -> None:
        rss = {"runner": 0, "jvm": 0}
        for pid, (kind, _) in spark_processes().items():
            try:
                if is_runner(pid):
                    kind = "runner"
                    self.runners.add(pid)
                elif kind != "jvm":
                    continue  # a Python worker
                self.peak[kind] = max(self.peak[kind], _status_kib(pid, "VmHWM"))
                rss[kind] = max(rss[kind], _status_kib(pid, "VmRSS"))
            except (OSError, ValueError):  # it ended meanwhile
                continue
        self.rss = rss

    def stop(self) -> None:
        self._done.set()
        self.join()


# -- the query -------------------------------------------------------------------------------


class Progress:
    """Every batch's progress by ``batchId``, gathered while the query runs."""

    def __init__(self, query: Any) -> None:
        self.query = query
        self.by_batch: dict[int, dict[str, Any]] = {}

    def update(self) -> int:
        """Gather what is new; the rows the batches read so far."""
        for p in self.query.recentProgress:
            self.by_batch[p["batchId"]] = p  # a batch's own progress comes after an idle one
        return sum(int(p["numInputRows"]) for p in self.by_batch.values())

    def data(self) -> list[dict[str, Any]]:
        """The progress of each batch that read rows, in batch order."""
        return [p for _, p in sorted(self.by_batch.items()) if p["numInputRows"] > 0]


def ended(progress: dict[str, Any]) -> float:
    """When the batch ``progress`` is about ended (``time.time()``): its trigger's start plus
    its ``triggerExecution``."""
    began = datetime.fromisoformat(progress["timestamp"]).timestamp()
    return began + float(progress["durationMs"]["triggerExecution"]) / 1000


@dataclass
class Run:
    """What one streaming query measured."""

    rows: int
    seconds: float  # start() to the end of the last data batch
    first_batch: float  # start() to the end of the first data batch
    data: list[dict[str, Any]]  # the progress of each batch that read rows
    batches: int  # batches Spark ran (committed)
    empty: list[int]  # batches that read nothing, between the first and the last data batch
    memory: MemoryWatch
    runner_after_first: int  # the runner's VmRSS (KiB) after the first data batch


def stream(spark: Any, pg: Postgres, args: argparse.Namespace, work: Path) -> Run:
    """Run the query until the snapshot is read (polled every second: the progress of a
    large source is a few dozen KiB, a hundred of them per poll); what was measured."""
    out, checkpoint, state = work / "out", work / "checkpoint", work / "state"
    memory = MemoryWatch()
    memory.start()
    began, deadline = time.time(), time.monotonic() + args.timeout
    query = (
        spark.readStream.format("splitflow-postgres-cdc")
        .option("conninfo", pg.conninfo())
        .option("tables", TABLE)
        .option("slotName", f"bench_scale_{os.getpid()}")
        .option("startupMode", "initial")
        .option("chunkSize", str(args.chunk_size))
        .option("maxChunksPerBatch", str(args.chunks_per_batch))
        .option("parallelism", "2")
        .option("stateDir", str(state))
        .load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="1 second")
        .start()
    )
    progress = Progress(query)
    runner_after_first = 0
    try:
        while (rows := progress.update()) < args.rows:
            if query.exception() is not None:
                raise Failed(f"the query failed: {query.exception()}")
            if time.monotonic() > deadline:
                raise Failed(f"timed out after {args.timeout:g}s with {rows:,} rows read")
            if rows and not runner_after_first:
                memory.poll()
                runner_after_first = memory.rss["runner"]
            time.sleep(1)
        memory.poll()
    finally:
        # a batch after the snapshot's (the log's first) may be running: its abort is no news
        spark.sparkContext.setLogLevel("FATAL")
        query.stop()
        memory.stop()
    data = progress.data()
    ran = log_ids(checkpoint, "commits")
    read = {p["batchId"] for p in data}
    first, last = min(read), max(read)
    return Run(
        rows=rows,
        seconds=ended(data[-1]) - began,
        first_batch=ended(data[0]) - began,
        data=data,
        batches=len(ran),
        empty=[b for b in ran if first <= b <= last and b not in read],
        memory=memory,
        runner_after_first=runner_after_first,
    )


def check_sink(spark: Any, out: Path, rows: int) -> str:
    """Every id 1..``rows`` exactly once in the sink, every row a snapshot read; a line that
    says so, or :class:`Failed`."""
    from pyspark.sql import functions as f

    found = (
        spark.read.parquet(str(out))
        .agg(
            f.count(f.lit(1)).alias("rows"),
            f.count_distinct("id").alias("ids"),
            f.min("id").alias("low"),
            f.max("id").alias("high"),
            f.count(f.when(f.col("op") != "r", 1)).alias("not_reads"),
        )
        .first()
        .asDict()
    )
    line = (
        f"sink: {found['rows']:,} rows, {found['ids']:,} distinct ids, ids {found['low']} to "
        f"{found['high']}, {found['not_reads']} rows whose op is not 'r'"
    )
    expected = {"rows": rows, "ids": rows, "low": 1, "high": rows, "not_reads": 0}
    if found != expected:
        raise Failed(f"{line}; expected every id 1..{rows:,} once as op 'r'")
    return line + ": exactly once"


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(fraction * len(ordered)) - 1)]


def report(run: Run, chunks: int) -> None:
    """The run's lines, then the score's: ``MISS`` when above the target, then ``RESULT``."""
    planning = [p["durationMs"].get("latestOffset", 0) for p in run.data]
    first = run.data[0]["durationMs"]
    medians = {
        phase: statistics.median(p["durationMs"].get(phase, 0) for p in run.data)
        for phase in PHASES
    }
    runner, jvm = run.memory.peak["runner"] / 1024, run.memory.peak["jvm"] / 1024
    print(
        f"{run.rows:,} rows in {len(run.data)} data batches ({run.batches} batches ran, "
        f"{len(run.empty)} empty between the first and the last data batch"
        + (f": {run.empty[:10]}" if run.empty else "")
        + f"); {run.seconds:.1f}s from start() to the last data batch's end "
        f"({run.first_batch:.1f}s to the first's), {run.rows / run.seconds:,.0f} rows/s\n"
        f"latestOffset ms of data batches: median {statistics.median(planning):.0f}, p90 "
        f"{percentile(planning, 0.9):.0f}, max {max(planning):.0f}; the first batch's (with "
        f"initialOffset) {planning[0]:.0f} (its addBatch {first['addBatch']:.0f}, "
        f"triggerExecution {first['triggerExecution']:.0f}), the others' median "
        f"{statistics.median(planning[1:] or planning):.0f}\n"
        "median ms per data batch: "
        + ", ".join(f"{phase} {ms:.0f}" for phase, ms in medians.items())
        + f"\ndriver memory: streaming source runner peak {runner:,.0f} MiB (resident "
        f"{run.runner_after_first / 1024:,.0f} MiB after the first data batch, "
        f"{run.memory.rss['runner'] / 1024:,.0f} MiB at the end; "
        f"{len(run.memory.runners)} runner process(es)); Spark's JVM peak {jvm:,.0f} MiB; "
        f"load average now {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    median = statistics.median(planning)
    metric = f"planning_ms_median_{round(chunks / 1000)}k"
    if median > TARGET_MS:
        print(f"MISS {metric}={median:.0f} is above the target {TARGET_MS:g}")
    print(f"RESULT {metric}={median:.0f} peak_runner_mib={runner:.0f} target=<={TARGET_MS:g},none")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="200,000 rows, under a minute")
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--chunk-size", type=int, default=50)
    parser.add_argument("--chunks-per-batch", type=int, default=1000, help="maxChunksPerBatch")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds for the snapshot")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.chunks_per_batch, args.timeout = 200_000, 200, 300
    chunks = math.ceil(args.rows / args.chunk_size)

    print(f"$ python bench/cdc_scale.py {' '.join(sys.argv[1:])}".rstrip(), flush=True)
    with (
        tempfile.TemporaryDirectory(prefix="splitflow-cdc-scale-") as tmp,
        Postgres.start(Path(tmp)) as pg,
    ):
        load = os.getloadavg()
        took = fill(pg, args.rows)
        size = pg.execute(f"SELECT pg_size_pretty(pg_table_size('{TABLE}'))")[0][0]
        print(
            f"table {TABLE}: {args.rows:,} rows ({size}), filled in {took:.1f}s; {chunks:,} "
            f"chunks of {args.chunk_size}, at most {args.chunks_per_batch:,} per batch; "
            f"{os.cpu_count()} cpus; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
            flush=True,
        )
        spark = local_session()
        try:
            run = stream(spark, pg, args, Path(tmp))
            print(check_sink(spark, Path(tmp) / "out", args.rows), flush=True)
        except Failed as exc:
            print(f"FAILED: {exc}", flush=True)
            return 1
        finally:
            spark.stop()
    report(run, chunks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
