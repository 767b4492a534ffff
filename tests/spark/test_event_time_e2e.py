"""Event time on Spark, end to end: alignment against late-event drops, idleness, restarts.

The Kafka tests run against the Tansu broker the tests start; the restart test kills a
driver subprocess (``tests/spark/jobs.py``) reading the test-only lagging generator.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.spark.support import Job, log_ids, logged_offset, reported_splits, wait_until
from tests.support.event_time import (
    batch_recount,
    produce_lagging_topic,
    run_windows,
)
from tests.support.tansu import Tansu, tansu_fixture

from splitflow.testing.sequence import SequenceCatalog

pytestmark = pytest.mark.slow

SECOND = 1_000_000


@pytest.fixture(scope="module")
def tansu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tansu]:
    yield from tansu_fixture(tmp_path_factory)


def test_plain_spark_drops_a_lagging_partitions_events_and_alignment_drops_none(
    spark: Any, tansu: Tansu, tmp_path: Path
) -> None:
    """Four partitions, one with 10 minutes of older events behind a backlog; 1-minute
    windows with a 30-second watermark. Without alignment the lagging partition's events
    are dropped as late; with ``maxEventTimeDrift=30s`` none is, and every closed window
    holds what a batch recount of the topic gives."""
    topic = f"lagging-{uuid.uuid4().hex[:8]}"
    tansu.create_topic(topic, 4)
    start_ms = (int(time.time()) // 60 - 30) * 60_000
    expected = produce_lagging_topic(tansu.producer, topic, start_ms=start_ms, every_ms=500)
    assert batch_recount(spark, tansu.bootstrap, topic) == expected

    plain = run_windows(
        spark, tansu.bootstrap, topic, tmp_path / "plain", expected, drift=None, max_records=400
    )
    aligned = run_windows(
        spark, tansu.bootstrap, topic, tmp_path / "aligned", expected, drift="30s", max_records=400
    )
    assert plain.dropped > 500, plain
    # Spark saw late rows too; its count is of the aggregation's partial rows (one per window
    # and task), not of events, so only the recount gives the number of events lost.
    assert plain.dropped_by_spark > 0
    assert aligned.dropped == 0, aligned
    assert aligned.dropped_by_spark == 0
    assert len(aligned.closed) >= 14  # the older 10 minutes and most of the next 5
    assert all(got == count for got, count in aligned.closed.values())
    # the lagging partition's watermark stayed within the drift of the others' in every batch
    for marks in aligned.watermarks:
        if len(marks) == 4:
            assert max(marks.values()) - min(marks.values()) <= 30 * SECOND + 500_000


def test_an_idle_partition_does_not_stall_the_others(
    spark: Any, tansu: Tansu, tmp_path: Path
) -> None:
    """Partition 3 receives nothing after the start; the others keep receiving events whose
    time runs 25 times faster than the clock. Once partition 3 is idle (``splitIdleTimeout``)
    the others run far past the 30 s drift it held them to, and every event is read."""
    topic = f"idle-{uuid.uuid4().hex[:8]}"
    tansu.create_topic(topic, 4)
    base = int(time.time() * 1000) - 3_600_000
    produced: list[tuple[int, int]] = []

    def produce(partitions: range, first: int, count: int) -> None:
        for partition in partitions:
            for i in range(count):
                stamp = first + i * 100
                tansu.producer.produce(
                    topic,
                    value=f"{partition}/{stamp}".encode(),
                    partition=partition,
                    timestamp=stamp,
                )
                produced.append((partition, stamp))
        tansu.producer.flush(30)

    produce(range(4), base, 100)  # 10 s of events in every partition
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    query = (
        spark.readStream.format("splitflow-kafka")
        .option("kafka.bootstrap.servers", tansu.bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("stateDir", str(tmp_path / "state"))
        .option("maxEventTimeDrift", "30s")
        .option("splitIdleTimeout", "3s")
        .load()
        .selectExpr("partition", "timestamp")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    stop = threading.Event()
    next_stamp = [base + 10_000]

    def keep_producing() -> None:
        while not stop.wait(0.2):
            produce(range(3), next_stamp[0], 50)  # 5 s of event time per 0.2 s
            next_stamp[0] += 5_000

    producer = threading.Thread(target=keep_producing, daemon=True)
    producer.start()
    try:
        quiet = base + 9_900  # partition 3's last event
        split = f"{topic}-3"

        def far_ahead() -> dict[str, Any] | None:
            assert query.exception() is None, query.exception()
            splits = reported_splits(query.lastProgress)
            marks = [
                splits[f"{topic}-{p}"].get("watermark")
                for p in range(3)
                if f"{topic}-{p}" in splits
            ]
            if len(marks) < 3 or None in marks:
                return None
            slowest = min(_micros(m) for m in marks)
            return splits if slowest > (quiet + 120_000) * 1000 else None

        splits = wait_until(
            "the other partitions to run 2 minutes past the idle one", far_ahead, 120
        )
        assert splits[split]["idle"] is True
        assert _micros(splits[split]["watermark"]) == quiet * 1000
    finally:
        stop.set()
        producer.join(10)
    last = len(produced)
    wait_until(
        "every event in the sink",
        lambda: _sink_count(spark, out) >= last,
        60,
        step=0.5,
    )
    query.stop()
    rows = sorted(
        (r[0], int(r[1].timestamp() * 1000))
        for r in spark.read.parquet(str(out)).select("partition", "timestamp").collect()
    )
    assert rows == sorted(produced)


def test_split_watermarks_survive_a_driver_sigkill_and_a_rescale(tmp_path: Path) -> None:
    """Split 0 gets 1,000 rows, then nothing (and never turns idle): alignment holds the
    others at its watermark plus 30 s, where they pause. The driver is killed there and the
    query restarts with 3 slots instead of 2, split 0 now getting 1,000 more rows. Every
    offset's watermarks must be the previous offset's merged with what the previous batch
    read: across the restart that holds only if the paused splits' watermarks, which no
    batch around the restart reported, came back from the checkpoint."""
    catalog = SequenceCatalog({}, path=str(tmp_path / "catalog.json"))
    checkpoint = tmp_path / "checkpoint"
    common = [
        f"--catalog={catalog.path}",
        f"--out={tmp_path / 'out'}",
        f"--checkpoint={checkpoint}",
        "--source=splitflow-test-lagging",
        "--max-records-per-batch=20000",
        "--trigger=500ms",
        "--option=splits=4",
        "--option=rowsPerSplit=10000000",
        "--option=startTime=1000",
        "--option=batchRows=5000",
        "--option=lag=0s",
        "--option=stall=0",
        f"--option=stateDir={tmp_path / 'state'}",
        "--option=maxEventTimeDrift=30s",
        "--option=splitIdleTimeout=1h",
    ]

    def run_until_paused(*args: str) -> None:
        job = Job([*common, *args], tmp_path / "jobs.log")
        first = max(log_ids(checkpoint, "offsets"), default=-1)

        def paused() -> bool:
            job.check_alive()
            offsets = log_ids(checkpoint, "offsets")
            if max(offsets, default=-1) < first + 2:
                return False
            if max(log_ids(checkpoint, "commits"), default=-1) < max(offsets):
                return False
            time.sleep(3)  # no batch planned for 3 s: every split paused or at its end
            return max(log_ids(checkpoint, "offsets")) == max(offsets)

        try:
            wait_until("the splits to pause at the alignment limit", paused, 180, step=0.5)
            job.kill()
        finally:
            job.close()

    run_until_paused("--parallelism=2", "--option=stallAfter=1000")
    restarted_at = max(log_ids(checkpoint, "offsets")) + 1
    run_until_paused("--parallelism=3", "--option=stallAfter=2000")

    state = tmp_path / "state"
    offsets = [
        logged_offset(checkpoint, batch, state) for batch in sorted(log_ids(checkpoint, "offsets"))
    ]
    from tests.spark.lagging import LaggingDataSource

    source = LaggingDataSource({"splits": "4", "rowspersplit": "10000000"}).create_source()
    codec = source.split_codec
    for before, after in itertools.pairwise(offsets):
        merged = dict(before.get("event_times", {}))
        for slot in before["slots"]:
            for _, data, start, stop, *_ in slot:
                split = codec.decode(data, before["codecs"][1])
                if stop > start:
                    latest = split.event_time(stop - 1)
                    merged[split.split_id] = max(merged.get(split.split_id, latest), latest)
        assert after.get("event_times", {}) == merged, f"batch {after['seq']}"
    assert len(offsets) > restarted_at + 1
    assert len(offsets[restarted_at - 1]["slots"]) == 2
    final = offsets[-1]
    assert len(final["slots"]) == 3
    stalled = (1000 + 1.999) * SECOND  # split 0's last row: startTime + 1,999 ms
    assert final["event_times"]["gen-00000"] == stalled
    last_read = {  # how far the last batch left each split
        split.split_id: split.event_time(stop - 1)
        for slot in final["slots"]
        for _, data, _, stop, *_ in slot
        if (split := codec.decode(data, final["codecs"][1]))
    }
    for sid in ("gen-00001", "gen-00002", "gen-00003"):
        assert stalled + 29 * SECOND < last_read[sid] <= stalled + 30 * SECOND


def _micros(text: str) -> int:
    from datetime import datetime

    return round(datetime.fromisoformat(text).timestamp() * 1_000_000)


def _sink_count(spark: Any, out: Path) -> int:
    try:
        return int(spark.read.parquet(str(out)).count())
    except Exception:  # no file committed yet
        return 0
