"""Catch up a backlog, then serve a live trickle: backlog-aware batch sizing vs latency-sized
batches alone, on the same data, in one SparkSession.

A file-backed sequence catalog of ``--splits`` splits holds a backlog of ``--backlog``
records when the query starts; a producer thread appends a live trickle
(``--rate`` records per second over all splits, every 50 ms) from the start until the end.
Two streaming queries read identical copies of that data into Parquet, one after the other
(the order alternates over ``--reps`` repetitions):

* (a) backlog-aware: ``backlogMaxRecordsPerBatch`` (``--backlog-batch``) while the source
  processes backlog, ``maxRecordsPerBatch`` (``--live-batch``) once it caught up;
* (b) latency-sized alone: ``maxRecordsPerBatch`` (``--live-batch``) throughout.

Catch-up time: from the query's start to the end of the first batch after which every
split reached its backlog boundary (the records there at start). Latency of a live record:
from its creation (the producer's clock when it appended it) to the end of the batch that
wrote it to the sink (the batch's start ``timestamp`` plus its ``triggerExecution``
duration, from ``query.recentProgress``; which batch holds which record comes from the
per-split positions the source reports), for records created after the query caught up.
Reported: the catch-up times, their ratio, and p50/p95 latency of each run.

    python bench/backlog_catchup.py            # 200k backlog, 15 s of trickle, 3 reps
    python bench/backlog_catchup.py --quick    # 20k backlog, 5 s of trickle, 1 rep (< 1 min)

Last line: ``RESULT catchup_speedup=<(b) time / (a) time> target=>=2``; targets: (a) at
least twice as fast to catch up, and its live p50/p95 latency no worse than (b)'s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import SparkSession

from splitflow.spark import register
from splitflow.testing.sequence import SequenceCatalog

TICK = 0.05  # seconds between the producer's appends


class Producer(threading.Thread):
    """Appends the live trickle round robin over the splits; remembers creation times."""

    def __init__(self, catalog: SequenceCatalog, rate: float) -> None:
        super().__init__(daemon=True)
        self.catalog = catalog
        self.per_tick = max(1, round(rate * TICK))
        self.created: dict[tuple[str, int], float] = {}  # (split, position) -> time
        self.stopped = threading.Event()

    def run(self) -> None:
        names = sorted(self.catalog.lengths())
        turn = 0
        while not self.stopped.wait(TICK):
            lengths = self.catalog.lengths()
            for _ in range(self.per_tick):
                name = names[turn % len(names)]
                turn += 1
                self.catalog.append(name, 1)
                self.created[(name, lengths[name])] = time.time()
                lengths[name] += 1

    def stop(self) -> None:
        self.stopped.set()
        self.join(10)


@dataclass
class Outcome:
    label: str
    catchup: float
    latencies: list[float] = field(default_factory=list)
    batches: int = 0

    def percentile(self, p: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else float("nan")


def _end_time(progress: dict[str, Any]) -> float:
    start = datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()
    return start + float(progress["durationMs"]["triggerExecution"]) / 1000.0


def _positions(progress: dict[str, Any]) -> dict[str, int]:
    latest = progress["sources"][0].get("latestOffset")
    if not latest or latest == "null":
        return {}
    return {s: int(v["position"]) for s, v in json.loads(latest)["splits"].items()}


def run_one(
    spark: SparkSession, label: str, options: dict[str, str], args: argparse.Namespace
) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="splitflow-backlog-") as work:
        per_split = args.backlog // args.splits
        names = [f"s{i}" for i in range(args.splits)]
        catalog = SequenceCatalog(
            dict.fromkeys(names, per_split), path=os.path.join(work, "catalog.json")
        )
        boundary = dict.fromkeys(names, per_split)
        producer = Producer(catalog, args.rate)
        reader = (
            spark.readStream.format("splitflow-sequence")
            .option("catalog", catalog.path)
            .option("parallelism", str(args.splits))
        )
        for key, value in options.items():
            reader = reader.option(key, value)
        started = time.time()
        producer.start()
        query = (
            reader.load()
            .writeStream.format("parquet")
            .option("path", os.path.join(work, "out"))
            .option("checkpointLocation", os.path.join(work, "chk"))
            .start()
        )
        caught_up_at: float | None = None
        try:
            while True:
                time.sleep(0.2)
                if query.exception() is not None:
                    raise RuntimeError(f"{label}: the query failed: {query.exception()}")
                if caught_up_at is None:
                    for progress in query.recentProgress:
                        positions = _positions(progress)
                        if positions and all(positions[s] >= boundary[s] for s in names):
                            caught_up_at = _end_time(progress)
                            break
                elif time.time() > caught_up_at + args.live:
                    break
                if time.time() > started + args.timeout:
                    raise RuntimeError(f"{label}: did not catch up within {args.timeout} s")
            producer.stop()
            # let the last live records through, so every measured record is visible
            lengths = catalog.lengths()
            deadline = time.time() + 60
            while time.time() < deadline:
                last = query.lastProgress
                if last and all(_positions(last).get(s, -1) >= n for s, n in lengths.items()):
                    break
                time.sleep(0.1)
        finally:
            query.stop()
            producer.stop()
        assert caught_up_at is not None
        outcome = Outcome(label, caught_up_at - started)
        previous = dict.fromkeys(names, 0)
        for progress in query.recentProgress:
            if progress["numInputRows"] == 0:
                continue
            outcome.batches += 1
            visible = _end_time(progress)
            positions = _positions(progress)
            for name in names:
                for position in range(previous[name], positions.get(name, previous[name])):
                    created = producer.created.get((name, position))
                    if created is not None and created > caught_up_at:
                        outcome.latencies.append(visible - created)
                previous[name] = max(previous[name], positions.get(name, 0))
        if len(query.recentProgress) >= 100:  # Spark keeps the last 100 progress reports
            print(f"  note: {label} ran over 100 batches; the earliest are not in its progress")
        return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small run, under a minute")
    parser.add_argument("--backlog", type=int, default=200_000)
    parser.add_argument("--splits", type=int, default=4)
    parser.add_argument("--rate", type=float, default=400.0, help="live records per second")
    parser.add_argument("--live", type=float, default=15.0, help="seconds of live trickle")
    parser.add_argument("--live-batch", type=int, default=1_000)
    parser.add_argument("--backlog-batch", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    if args.quick:
        args.backlog, args.live, args.reps, args.live_batch = 8_000, 2.0, 1, 400
        args.rate = 200.0
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("splitflow-backlog-catchup")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    warm = argparse.Namespace(**{**vars(args), "backlog": 400, "live": 0.5})
    run_one(spark, "warm-up", {"maxRecordsPerBatch": "100"}, warm)  # JVM, Python workers
    print(f"$ python bench/backlog_catchup.py {' '.join(sys.argv[1:])}")
    print(
        f"backlog {args.backlog:,} records over {args.splits} splits, live trickle "
        f"{args.rate:g} records/s for {args.live:g} s after catching up; batches: "
        f"{args.backlog_batch:,} (backlog) / {args.live_batch:,} (live); {os.cpu_count()} cpus"
    )
    aware = {
        "backlogMaxRecordsPerBatch": str(args.backlog_batch),
        "maxRecordsPerBatch": str(args.live_batch),
    }
    plain = {"maxRecordsPerBatch": str(args.live_batch)}
    results: dict[str, list[Outcome]] = {"a": [], "b": []}
    for rep in range(args.reps):
        order = [("a", aware), ("b", plain)] if rep % 2 == 0 else [("b", plain), ("a", aware)]
        for label, options in order:
            outcome = run_one(spark, label, options, args)
            results[label].append(outcome)
            print(
                f"  rep {rep} ({label}): caught up in {outcome.catchup:6.2f} s, "
                f"{outcome.batches} batches, live p50 {outcome.percentile(0.5) * 1e3:6.0f} ms, "
                f"p95 {outcome.percentile(0.95) * 1e3:6.0f} ms ({len(outcome.latencies)} records)"
            )
    spark.stop()

    def median(label: str, of: Any) -> float:
        return float(statistics.median(of(o) for o in results[label]))

    speedups = [b.catchup / a.catchup for a, b in zip(results["a"], results["b"], strict=True)]
    speedup = statistics.median(speedups)
    print(
        f"\n{'':34}{'catch-up s':>12}{'live p50 ms':>13}{'live p95 ms':>13}\n"
        f"{'(a) backlog-aware sizing':34}{median('a', lambda o: o.catchup):12.2f}"
        f"{median('a', lambda o: o.percentile(0.5)) * 1e3:13.0f}"
        f"{median('a', lambda o: o.percentile(0.95)) * 1e3:13.0f}\n"
        f"{'(b) latency-sized batches alone':34}{median('b', lambda o: o.catchup):12.2f}"
        f"{median('b', lambda o: o.percentile(0.5)) * 1e3:13.0f}"
        f"{median('b', lambda o: o.percentile(0.95)) * 1e3:13.0f}"
    )
    p95_a = median("a", lambda o: o.percentile(0.95))
    p95_b = median("b", lambda o: o.percentile(0.95))
    print(f"live p95 latency (a)/(b): {p95_a / p95_b:.2f} (target: no worse, about 1 or less)")
    if speedup < 2:
        print(f"MISS catchup_speedup={speedup:.2f} is below the target of 2")
    print(f"RESULT catchup_speedup={speedup:.2f} target=>=2")


if __name__ == "__main__":
    main()
