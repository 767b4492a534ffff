"""The lagging-partition scenario of issue 12, shared by the end-to-end test and the benchmark.

A Kafka topic of four partitions holds events every ``every_ms`` over ``minutes`` minutes;
partition 3 also holds the ``behind`` minutes before them, so it starts that far behind the
others (a partition stuck behind a backlog). A streaming query counts events in 1-minute
event-time windows with a 30-second watermark, in append mode, into Parquet, under
``trigger(availableNow=True)`` and a small ``maxRecordsPerBatch`` (many batches). A batch
query over the same topic recounts the windows. A window whose end is at or before the
query's final watermark is closed: plain Spark has emitted it, and every event of it that
is missing from the sink was dropped as late.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from splitflow.spark.offsetstate import OffsetState, expand_offset

WINDOW_MS = 60_000
DELAY = "30 seconds"
PARTITIONS = 4


def produce_lagging_topic(
    producer: Any,
    topic: str,
    *,
    start_ms: int,
    minutes: float = 5,
    behind: float = 10,
    every_ms: int = 500,
) -> Counter[int]:
    """Produce the scenario's events; returns how many events each window (start, ms) has.

    Partition 3's events start ``behind`` minutes before the others'. Timestamps increase
    along every partition (the producer's create time).
    """
    windows: Counter[int] = Counter()
    end = start_ms + round(minutes * 60_000)
    for partition in range(PARTITIONS):
        first = start_ms - (round(behind * 60_000) if partition == PARTITIONS - 1 else 0)
        for stamp in range(first, end, every_ms):
            value = f"{partition}/{stamp}".encode()
            while True:
                try:
                    producer.produce(topic, value=value, partition=partition, timestamp=stamp)
                    break
                except BufferError:
                    producer.poll(0.1)
            windows[stamp - stamp % WINDOW_MS] += 1
        producer.poll(0)
    if producer.flush(60):
        raise RuntimeError(f"produce to {topic}: undelivered records")
    return windows


@dataclass
class WindowRun:
    """What one streaming run of the scenario did."""

    dropped: int
    """Events of closed windows missing from the sink (by the batch recount)."""
    dropped_by_spark: int
    """Spark's own count: ``numRowsDroppedByWatermark`` summed over the run's batches. It
    counts the rows the stateful operator drops, and those are the aggregation's partial
    rows (one per window and task of a batch), not events: non-zero whenever events were
    dropped, but far below their number."""
    closed: dict[int, tuple[int, int]]
    """Closed window start (ms) -> (events in the sink, events in the recount)."""
    batches: int
    watermarks: list[dict[str, int]] = field(default_factory=list)
    """Per batch (offset order): split id -> its watermark (µs), as the batch's offset has it."""
    seconds: float = 0.0


def batch_recount(spark: Any, bootstrap: str, topic: str) -> Counter[int]:
    """Events per 1-minute window of the whole topic, by a batch query."""
    from pyspark.sql import functions as f

    frame = (
        spark.read.format("splitflow-kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .load()
        .groupBy(f.window("timestamp", "1 minute"))
        .count()
    )
    return Counter({_ms(row[0]["start"]): row[1] for row in frame.collect()})


def run_windows(
    spark: Any,
    bootstrap: str,
    topic: str,
    workdir: Path,
    expected: Counter[int],
    *,
    drift: str | None,
    max_records: int,
    timeout: float = 600,
) -> WindowRun:
    """Stream the scenario's windows into Parquet under ``workdir``; count what was lost."""
    import time

    from pyspark.sql import functions as f

    reader = (
        spark.readStream.format("splitflow-kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerBatch", str(max_records))
        .option("stateDir", str(workdir / "state"))
    )
    if drift is not None:
        reader = reader.option("maxEventTimeDrift", drift)
    counts = (
        reader.load()
        .withWatermark("timestamp", DELAY)
        .groupBy(f.window("timestamp", "1 minute"))
        .count()
        .select(f.col("window.start").alias("start"), "count")
    )
    began = time.monotonic()
    query = (
        counts.writeStream.format("parquet")
        .outputMode("append")
        .option("path", str(workdir / "out"))
        .option("checkpointLocation", str(workdir / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    if not query.awaitTermination(timeout):
        query.stop()
        raise AssertionError(f"the windowed query did not finish within {timeout:g}s")
    seconds = time.monotonic() - began
    if query.exception() is not None:
        raise AssertionError(f"the windowed query failed: {query.exception()}")
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0 or p["stateOperators"]]
    final = query.lastProgress["eventTime"].get("watermark")
    watermark = _ms(datetime.fromisoformat(final.replace("Z", "+00:00"))) if final else 0
    sink = Counter(
        {
            _ms(row["start"]): row["count"]
            for row in spark.read.parquet(str(workdir / "out")).collect()
        }
    )
    closed = {
        start: (sink.get(start, 0), count)
        for start, count in expected.items()
        if start + WINDOW_MS <= watermark
    }
    over = {start: pair for start, pair in closed.items() if pair[0] > pair[1]}
    if over or set(sink) - set(expected):
        raise AssertionError(f"the sink has windows or events the topic has not: {over}")
    return WindowRun(
        dropped=sum(count - got for got, count in closed.values()),
        dropped_by_spark=sum(
            op.get("numRowsDroppedByWatermark", 0) for p in progress for op in p["stateOperators"]
        ),
        closed=closed,
        batches=sum(1 for p in progress if p["numInputRows"] > 0),
        watermarks=offset_watermarks(workdir / "checkpoint", workdir / "state"),
        seconds=seconds,
    )


def offset_watermarks(checkpoint: Path, state_dir: Path) -> list[dict[str, int]]:
    """Each logged batch's per-split watermarks (µs), in batch order, from its offset file."""
    folder = checkpoint / "offsets"
    result = []
    for name in sorted((n for n in os.listdir(folder) if n.isdigit()), key=int):
        lines = (folder / name).read_text(encoding="utf-8").splitlines()
        offset = expand_offset(json.loads(lines[2]), OffsetState(str(state_dir)))
        result.append({k: int(v) for k, v in offset.get("event_times", {}).items()})
    return result


def _ms(moment: datetime) -> int:
    """Milliseconds since the epoch (a naive time is local, as PySpark returns them)."""
    return round(moment.timestamp() * 1000)
