"""The Kafka source on Spark, end to end, against a Tansu broker the tests start.

Every test reads its sink back with Spark and compares it with what was produced, record
by record: ``(topic, partition, offset, value)`` exactly once each.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.spark.support import assert_exactly_once, reported_splits, wait_until
from tests.support.tansu import Tansu, tansu_fixture

pytestmark = pytest.mark.slow

Row = tuple[str, int, int, bytes]


@pytest.fixture(scope="module")
def tansu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tansu]:
    yield from tansu_fixture(tmp_path_factory)


class Topics:
    """Topics of one test (a fresh prefix) and every record produced to them."""

    def __init__(self, tansu: Tansu) -> None:
        self.tansu, self.prefix = tansu, f"e{uuid.uuid4().hex[:8]}"
        self.partitions: dict[str, int] = {}
        self.rows: list[Row] = []
        self._next: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    def create(self, name: str, partitions: int) -> str:
        topic = f"{self.prefix}-{name}"
        self.tansu.create_topic(topic, partitions)
        self.partitions[topic] = partitions
        return topic

    def produce(self, topic: str, count: int) -> None:
        with self._lock:
            records = []
            for i in range(count):
                partition = i % self.partitions[topic]
                offset = self._next.get((topic, partition), 0)
                self._next[(topic, partition)] = offset + 1
                value = f"{topic}/{partition}/{offset}".encode()
                records.append((None, value, partition))
                self.rows.append((topic, partition, offset, value))
            self.tansu.produce(topic, records)

    def ends(self, *topics: str) -> dict[str, int]:
        """Split id -> number of records produced, for ``topics`` (default: all)."""
        with self._lock:
            return {f"{t}-{p}": n for (t, p), n in self._next.items() if not topics or t in topics}

    def expected(self, *topics: str) -> list[Row]:
        return sorted(r for r in self.rows if not topics or r[0] in topics)


def sink(spark: Any, out: Path) -> list[Row]:
    frame = spark.read.parquet(str(out)).select("topic", "partition", "offset", "value")
    return sorted((r[0], r[1], r[2], bytes(r[3])) for r in frame.collect())


def stream(spark: Any, tansu: Tansu, out: Path, checkpoint: Path, **options: str) -> Any:
    reader = spark.readStream.format("splitflow-kafka").option(
        "kafka.bootstrap.servers", tansu.bootstrap
    )
    for key, value in {"parallelism": "2", "discoveryInterval": "500ms", **options}.items():
        reader = reader.option(key, value)
    return (
        reader.load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="500 milliseconds")
        .start()
    )


def batch_read(spark: Any, tansu: Tansu, topic: str, **options: str) -> Any:
    reader = (
        spark.read.format("splitflow-kafka")
        .option("kafka.bootstrap.servers", tansu.bootstrap)
        .option("subscribe", topic)
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def wait_read(query: Any, ends: dict[str, int], timeout: float = 90) -> dict[str, Any]:
    """Wait until a completed batch reached ``ends``; return the reported splits."""

    def check() -> dict[str, Any] | None:
        if query.exception() is not None:
            raise AssertionError(f"the query failed: {query.exception()}")
        splits = reported_splits(query.lastProgress)
        done = all(s in splits and splits[s]["position"] >= n for s, n in ends.items())
        return splits if done else None

    return wait_until(f"the query to read {ends}", check, timeout)


def test_batch_read_with_ending_offsets_reads_exactly_that_range(spark: Any, tansu: Tansu) -> None:
    topics = Topics(tansu)
    topic = topics.create("batch", 2)
    topics.produce(topic, 20)
    frame = batch_read(spark, tansu, topic, endingOffsets=json.dumps({topic: {"0": 4, "1": -1}}))
    assert frame.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int>"
    ), "the schema of Spark's Kafka source"
    rows = sorted(
        (r[0], r[1], r[2], bytes(r[3]))
        for r in frame.select("topic", "partition", "offset", "value").collect()
    )
    expected = [r for r in topics.expected() if r[1] == 1 or r[2] < 4]
    assert_exactly_once(rows, expected)


def test_streaming_follows_new_topics_and_deleted_ones_without_fail_on_data_loss(
    spark: Any, tansu: Tansu, tmp_path: Path
) -> None:
    """A pattern subscription: a topic added while running is read from its earliest
    offset; a topic deleted is dropped (failOnDataLoss=false) and the others read on.
    Per-partition lag is in the query progress."""
    topics = Topics(tansu)
    first = topics.create("first", 2)
    doomed = topics.create("doomed", 1)
    topics.produce(first, 10)
    topics.produce(doomed, 3)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    secret = f"pw-{uuid.uuid4().hex}"
    query = stream(
        spark,
        tansu,
        out,
        checkpoint,
        subscribePattern=f"{topics.prefix}-.*",
        startingOffsets="earliest",
        failOnDataLoss="false",
        maxOffsetsPerTrigger="7",
        **{"kafka.sasl.password": secret},  # ignored by a PLAINTEXT client; must not leak
    )
    splits = wait_read(query, topics.ends())
    assert {"owner", "position", "latest", "lag"} <= set(splits[f"{first}-0"])
    lagging = [
        p
        for p in query.recentProgress
        if any((s.get("lag") or 0) > 0 for s in reported_splits(p).values())
    ]
    assert lagging, "maxOffsetsPerTrigger=7 left lag that the progress reports per partition"

    added = topics.create("added", 3)
    topics.produce(added, 9)
    topics.produce(first, 4)
    wait_read(query, topics.ends())

    tansu.delete_topic(doomed)
    topics.produce(first, 6)
    splits = wait_read(query, topics.ends(first, added))
    wait_until(
        "the deleted topic to be dropped",
        lambda: f"{doomed}-0" not in reported_splits(query.lastProgress),
        60,
    )
    progress = " ".join(p.json for p in query.recentProgress)
    query.stop()
    assert_exactly_once(sink(spark, out), topics.expected())
    stored = [f for f in checkpoint.rglob("*") if f.is_file()]
    assert stored
    assert not [f for f in stored if secret.encode() in f.read_bytes()]
    assert secret not in progress, "a credential in the query progress"


def test_a_refused_login_fails_the_read_naming_the_servers_and_not_the_password(
    spark: Any, tmp_path: Path
) -> None:
    """Against a broker that wants a login and knows no user (every login is refused)."""
    password = "wrong-pw-5678"
    with Tansu.start(tmp_path / "tansu.log", authentication=True) as guarded:
        frame = batch_read(
            spark,
            guarded,
            "t",
            **{
                "kafka.security.protocol": "SASL_PLAINTEXT",
                "kafka.sasl.mechanism": "SCRAM-SHA-512",
                "kafka.sasl.username": "alice",
                "kafka.sasl.password": password,
                "requestTimeout": "60s",
            },
        )
        began = time.monotonic()
        with pytest.raises(Exception, match="refused the client") as error:
            frame.count()
        took = time.monotonic() - began
    message = str(error.value)
    assert f"kafka.bootstrap.servers={guarded.bootstrap} refused the client" in message
    assert "SASL authentication error" in message
    assert password not in message
    assert took < 30, f"{took:.1f}s: a refused login must not wait for requestTimeout (60s)"


def test_a_deleted_topic_fails_the_query_by_default(
    spark: Any, tansu: Tansu, tmp_path: Path
) -> None:
    topics = Topics(tansu)
    kept, doomed = topics.create("kept", 1), topics.create("doomed", 1)
    topics.produce(kept, 3)
    topics.produce(doomed, 3)
    query = stream(
        spark,
        tansu,
        tmp_path / "out",
        tmp_path / "checkpoint",
        subscribePattern=f"{topics.prefix}-.*",
        startingOffsets="earliest",
    )
    wait_read(query, topics.ends())
    tansu.delete_topic(doomed)
    wait_until("the query to fail", lambda: query.exception() is not None, 60)
    message = str(query.exception())
    assert "DataLossError" in message, message
    assert f"{doomed}-0" in message, message
    assert "failOnDataLoss=false" in message
    assert sink(spark, tmp_path / "out") == topics.expected()  # what was committed stays, once


def test_a_partition_added_while_running_is_read_from_its_start(
    spark: Any, tansu: Tansu, tmp_path: Path
) -> None:
    topics = Topics(tansu)
    topic = topics.create("grow", 1)
    topics.produce(topic, 4)
    from confluent_kafka.admin import NewPartitions

    try:
        probe = tansu.admin.create_partitions([NewPartitions(topic, 2)], validate_only=True)
        for future in probe.values():
            future.result(30)
    except Exception as exc:
        if "not supported" in str(exc):
            pytest.skip(f"the broker cannot add partitions (Tansu 0.6: no KIP-195): {exc}")
        raise
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    query = stream(spark, tansu, out, checkpoint, subscribe=topic, startingOffsets="earliest")
    wait_read(query, topics.ends())
    for future in tansu.admin.create_partitions([NewPartitions(topic, 3)]).values():
        future.result(30)
    topics.partitions[topic] = 3
    topics.produce(topic, 9)
    wait_read(query, topics.ends())
    query.stop()
    assert_exactly_once(sink(spark, out), topics.expected())


def test_starting_offsets_by_timestamp_on_the_broker(
    spark: Any, tansu: Tansu, tmp_path: Path
) -> None:
    """Tansu answers every timestamp look-up with offset 0, so on this broker the query
    starts at 0; the resolution rules themselves are tested without a broker."""
    topics = Topics(tansu)
    topic = topics.create("ts", 2)
    topics.produce(topic, 6)
    by_time = json.dumps({topic: {"0": 1, "1": 1}})
    frame = batch_read(spark, tansu, topic, startingOffsetsByTimestamp=by_time)
    assert frame.count() == 6


class Producing(threading.Thread):
    """Produces ``count`` records to ``topic`` every ``every`` seconds until stopped."""

    def __init__(self, topics: Topics, topic: str, every: float = 0.2, count: int = 3) -> None:
        super().__init__(daemon=True)
        self.topics, self.topic, self.every, self.count = topics, topic, every, count
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.every):
            self.topics.produce(self.topic, self.count)

    def stop(self) -> None:
        self.stopped.set()
        self.join(30)


def test_driver_sigkill_while_producing_is_exactly_once(
    spark: Any, tansu: Tansu, tmp_path: Path
) -> None:
    """SIGKILL the driver (its whole process group) with a batch planned but not committed,
    while records keep arriving; the restarted driver replays that batch from its offset and
    reads on. The sink holds every produced record exactly once."""
    from tests.spark.support import Job, kill_before_commit, log_ids

    topics = Topics(tansu)
    topic = topics.create("live", 3)
    topics.produce(topic, 12)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    catalog, done = tmp_path / "ends.json", tmp_path / "done"
    catalog.write_text(json.dumps({"lengths": {}, "sealed": []}))
    args = [
        f"--catalog={catalog}",
        f"--out={out}",
        f"--checkpoint={checkpoint}",
        "--parallelism=2",
        "--max-records-per-batch=20",
        "--trigger=500ms",
        "--source=splitflow-kafka",
        f"--done-file={done}",
        f"--option=kafka.bootstrap.servers={tansu.bootstrap}",
        f"--option=subscribe={topic}",
        "--option=startingOffsets=earliest",
        "--option=discoveryInterval=500ms",
    ]
    producer = Producing(topics, topic)
    producer.start()
    jobs: list[Job] = []
    try:
        run1 = Job(args, tmp_path / "jobs.log")
        jobs.append(run1)
        wait_until("run 1's batches", lambda: run1.check_alive() and len(run1.batches()) >= 2, 180)

        def planned_not_committed() -> int | None:
            run1.check_alive()
            pending = set(log_ids(checkpoint, "offsets")) - set(log_ids(checkpoint, "commits"))
            return min(pending, default=None)

        killed = kill_before_commit(
            run1, "a planned, uncommitted batch", planned_not_committed, checkpoint, 60, step=0.01
        )

        run2 = Job(args, tmp_path / "jobs.log")
        jobs.append(run2)
        wait_until("run 2's batches", lambda: run2.check_alive() and len(run2.batches()) >= 2, 180)
        producer.stop()
        catalog.write_text(json.dumps({"lengths": topics.ends(topic), "sealed": []}))
        done.touch()
        assert run2.finish(180) == 0, run2.lines
        assert "CAUGHT-UP" in run2.lines
        assert killed in log_ids(checkpoint, "commits"), "run 2 ran the batch killed in run 1"
    finally:
        producer.stop()
        for job in jobs:
            job.close()
    assert_exactly_once(sink(spark, out), topics.expected(topic))
