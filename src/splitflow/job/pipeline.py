"""The main job's streaming pipeline: files -> event-time windows with a watermark -> Parquet.

::

    events = (spark.readStream.format("splitflow-files").schema(EVENT_SPARK_SCHEMA)
              .option("path", landing).option("format", "parquet")
              .option("parallelism", 2).option("stateDir", state)
              .option("eventTimeColumn", "event_time").option("maxEventTimeDrift", "5s")
              .load())
    windows = (events.withWatermark("event_time", "5 seconds")
               .groupBy(F.window("event_time", "5 seconds"))
               .agg(F.count("*").alias("events"), F.sum("value").alias("value_sum")))
    windows.writeStream.format("parquet").outputMode("append") ...

In append mode a window is written once, when the watermark (the latest event time seen
minus the delay) has passed its end; later events for it are dropped as late. The output
is exactly-once through Spark's file sink log (``output/_spark_metadata``): only files of
committed batches count, which :func:`committed_output_files` reads without Spark.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from splitflow.job.producer import EVENT_SPARK_SCHEMA


@dataclass(frozen=True)
class Layout:
    """Where the job keeps everything, under one work directory."""

    work: Path

    @property
    def landing(self) -> Path:
        return self.work / "landing"

    @property
    def output(self) -> Path:
        return self.work / "output"

    @property
    def checkpoint(self) -> Path:
        return self.work / "checkpoint"

    @property
    def state(self) -> Path:
        return self.work / "source-state"


@dataclass(frozen=True)
class PipelineSettings:
    window: str = "5 seconds"
    watermark: str = "5 seconds"
    trigger: str = "2 seconds"
    max_drift: str | None = "5s"
    """The source's ``maxEventTimeDrift`` (None: no alignment; event time is tracked)."""
    parallelism: int = 2
    file_format: str = "parquet"
    source: str = "splitflow-files"
    """``splitflow-files``, or ``spark-files``: Spark's own file stream source (to compare)."""


def spark_environment() -> None:
    """What Spark's Python workers need, set before the JVM starts (workers inherit it)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    package_root = str(Path(__file__).resolve().parents[2])  # the folder holding splitflow/
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if package_root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([package_root, *paths])


def start_session() -> Any:
    """A local Spark session for the job (2 cores, quiet, 2 shuffle partitions); once per
    process.

    Spark's JVM and splitflow's warm process (which forks the streaming source runners)
    run in sessions of their own: a signal to the job's process group (Ctrl-C in a
    terminal, ``timeout``) is the job's to handle, and the job then stops its query
    between batches and Spark in order. pyspark's own launch keeps only SIGINT from the
    JVM; a SIGTERM to the group killed it, and the runner, under the running query. Both
    still end with the job: when it exits, their stdin (a pipe from it) closes.
    """
    spark_environment()
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway
    from pyspark.sql import SparkSession

    from splitflow.spark import _UNIX_SOCKETS, session
    from splitflow.spark.warmstart import starting_spark

    conf = SparkConf().setAll(
        [
            ("spark.master", "local[2]"),
            ("spark.app.name", "splitflow-main-job"),
            ("spark.ui.enabled", "false"),
            ("spark.ui.showConsoleProgress", "false"),
            ("spark.sql.shuffle.partitions", "2"),
            ("spark.driver.host", "127.0.0.1"),
            ("spark.sql.session.timeZone", "UTC"),
            ("spark.sql.streaming.noDataProgressEventInterval", "1000"),
            (_UNIX_SOCKETS, "true"),  # what session() would set: read as the JVM starts
        ]
    )
    with starting_spark(detached=True):  # the JVM hands its Python processes over warm
        gateway = launch_gateway(conf, {"start_new_session": True})  # type: ignore[no-untyped-call]
    SparkContext(conf=conf, gateway=gateway)
    spark = session(SparkSession.builder.config(conf=conf))
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def start_query(spark: Any, layout: Layout, settings: PipelineSettings) -> Any:
    """Start the streaming query; it resumes from the checkpoint when there is one."""
    from pyspark.sql import functions as F

    if settings.source == "spark-files":
        events = (
            spark.readStream.format(settings.file_format)
            .schema(EVENT_SPARK_SCHEMA)
            .load(str(layout.landing))
        )
    else:
        reader = (
            spark.readStream.format("splitflow-files")
            .schema(EVENT_SPARK_SCHEMA)
            .option("path", str(layout.landing))
            .option("format", settings.file_format)
            .option("pattern", f"*.{settings.file_format}")
            .option("parallelism", str(settings.parallelism))
            .option("stateDir", str(layout.state))
            .option("eventTimeColumn", "event_time")
        )
        if settings.max_drift is not None:
            reader = reader.option("maxEventTimeDrift", settings.max_drift)
        events = reader.load()
    windows = (
        events.withWatermark("event_time", settings.watermark)
        .groupBy(F.window("event_time", settings.window))
        .agg(F.count("*").alias("events"), F.sum("value").alias("value_sum"))
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "events",
            "value_sum",
        )
    )
    return (
        windows.writeStream.format("parquet")
        .outputMode("append")
        .option("path", str(layout.output))
        .option("checkpointLocation", str(layout.checkpoint))
        .trigger(processingTime=settings.trigger)
        .queryName("splitflow_main_job")
        .start()
    )


def stop_between_batches(query: Any, patience: float = 15.0) -> None:
    """Stop ``query`` when no batch is running (stopping one mid-way interrupts its tasks:
    it is replayed on resume, correctly, but Spark logs the interruption loudly)."""
    deadline = time.monotonic() + patience
    while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(0.05)
    query.stop()


def committed_output_files(output: Path) -> list[Path]:
    """The Parquet files of committed batches, from the sink's log (``_spark_metadata``).

    The log has one file per batch (``N``) and, every few batches, a compaction
    (``N.compact``) that repeats everything before it; each holds a version line and one
    JSON entry per file (``{"path": ..., "action": "add"}``). Part files of a batch that did
    not commit are in the folder but not in the log: they do not count.
    """
    log = output / "_spark_metadata"
    if not log.is_dir():
        return []
    batches: dict[int, Path] = {}
    compact = -1
    for entry in log.iterdir():
        stem, _, suffix = entry.name.partition(".")
        if not stem.isdigit() or suffix not in ("", "compact"):
            continue
        batches[int(stem)] = entry
        if suffix == "compact":
            compact = max(compact, int(stem))
    files: dict[str, bool] = {}
    for batch in sorted(b for b in batches if b >= compact):
        lines = batches[batch].read_text(encoding="utf-8").splitlines()[1:]
        for line in lines:
            if not line.strip():
                continue
            entry = json.loads(line)
            files[entry["path"]] = entry.get("action", "add") == "add"
    return sorted(Path(unquote(urlparse(p).path)) for p, added in files.items() if added)


class OutputCounter:
    """Rows (closed windows) in the committed output files; each file's footer read once."""

    def __init__(self, output: Path) -> None:
        self.output = output
        self._rows: dict[Path, int] = {}

    def count(self) -> tuple[int, int]:
        """``(rows, files)`` committed so far."""
        import pyarrow.parquet as pq

        files = committed_output_files(self.output)
        for path in files:
            if path not in self._rows:
                self._rows[path] = pq.read_metadata(path).num_rows
        return sum(self._rows[p] for p in files), len(files)


def last_committed_batch(checkpoint: Path) -> int | None:
    commits = checkpoint / "commits"
    if not commits.is_dir():
        return None
    ids = [int(n) for n in os.listdir(commits) if n.isdigit()]
    return max(ids) if ids else None


def batch_watermark_ms(checkpoint: Path, batch: int) -> int:
    """The watermark batch ``batch`` ran with (``offsets/<batch>``, metadata line)."""
    lines = (checkpoint / "offsets" / str(batch)).read_text(encoding="utf-8").splitlines()
    return int(json.loads(lines[1])["batchWatermarkMs"])
