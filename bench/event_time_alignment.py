"""Events Spark drops as late behind a lagging partition, with and without alignment; and
what alignment costs when nothing lags.

**Drops.** One Tansu broker on loopback, one topic of 4 partitions: events every
``every`` ms over 5 minutes, and partition 3 also holds the 10 minutes before them (a
partition behind on a backlog). A streaming query counts events per 1-minute event-time
window with a 30-second watermark, in append mode, into Parquet, reading at most
``maxRecordsPerBatch`` records per batch until it has read everything
(``trigger(availableNow=True)``). It runs twice, on the same topic: plain, and with
``maxEventTimeDrift=30s``. A batch query recounts every window; the events of closed
windows (ended at or before the final watermark) missing from the sink were dropped as
late. Spark's own ``numRowsDroppedByWatermark`` is printed beside it: it counts the
aggregation's partial rows it dropped (one per window and task), not events. The plot of
each split's watermark against the batch number, for both runs, is written to
``docs/event-time.png`` (``--plot`` to choose another path; ``--quick`` writes it in its
work directory, leaving the docs' figure as the full run drew it).

**Cost.** The generator source with no lag (4 splits, event time advancing equally; each
batch spans more event time than the drift), streamed to the ``noop`` sink under
``trigger(availableNow=True)`` with ``maxRecordsPerBatch``: plain (no ``stateDir``, so no
event time is tracked at all) against aligned (``stateDir`` and ``maxEventTimeDrift``: the
tasks report event times, the planner aligns), alternating in pairs; the median ratio of
records per second (aligned / plain) is printed: the target is at least 0.9.

    python bench/event_time_alignment.py           # events every 250 ms, 5 cost pairs
    python bench/event_time_alignment.py --quick   # every 1 s, 3 cost pairs (< 1 minute)

Last line: ``RESULT dropped_with_alignment=<n> target=0``; a ``MISS`` line before it for a
missed target (a drop with alignment, or a cost ratio below 0.9).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support

from tests.support.event_time import (
    WindowRun,
    batch_recount,
    produce_lagging_topic,
    run_windows,
)
from tests.support.tansu import Tansu

from splitflow.job.pipeline import start_session

PLOT = Path(__file__).resolve().parents[1] / "docs" / "event-time.png"


def generator_rate(spark: Any, workdir: Path, rows: int, aligned: bool) -> float:
    """Records per second of one generator read in 4 batches, to the noop sink; each split
    reads ``rows / 16`` rows (milliseconds of event time) a batch."""
    reader = (
        spark.readStream.format("splitflow-generator")
        .option("splits", "4")
        .option("rowsPerSplit", str(rows // 4))
        .option("maxRecordsPerBatch", str(rows // 4))
    )
    if aligned:
        reader = reader.option("stateDir", str(workdir / "state"))
        reader = reader.option("maxEventTimeDrift", "30s")
    began = time.monotonic()
    query = (
        reader.load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(workdir / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    seconds = time.monotonic() - began
    read = sum(p["numInputRows"] for p in query.recentProgress)
    if read != rows:
        raise AssertionError(f"read {read} of {rows} rows")
    return rows / seconds


def plot(plain: WindowRun, aligned: WindowRun, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    origin = min(t for run in (plain, aligned) for marks in run.watermarks for t in marks.values())
    for axis, run, title in (
        (axes[0], plain, f"plain Spark: {plain.dropped:,} events dropped as late"),
        (axes[1], aligned, f"maxEventTimeDrift=30s: {aligned.dropped:,} dropped"),
    ):
        for split in sorted({s for marks in run.watermarks for s in marks}):
            points = [
                (batch, (marks[split] - origin) / 60e6)
                for batch, marks in enumerate(run.watermarks)
                if split in marks
            ]
            axis.plot(*zip(*points, strict=True), marker=".", label=f"partition {split[-1]}")
        axis.set_title(title, fontsize=10)
        axis.set_xlabel("batch")
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("split watermark (minutes of event time)")
    axes[1].legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args()
    every_ms, batches, pairs, rows = (
        (1000, 12, 3, 1_600_000) if args.quick else (250, 40, 5, 8_000_000)
    )

    workdir = Path(tempfile.mkdtemp(prefix="splitflow-event-time-"))
    figure = args.plot or (workdir / "event-time.png" if args.quick else PLOT)
    with Tansu.start() as broker:
        topic = "lagging"
        broker.create_topic(topic, 4)
        start_ms = (int(time.time()) // 60 - 30) * 60_000
        expected = produce_lagging_topic(
            broker.producer, topic, start_ms=start_ms, every_ms=every_ms
        )
        spark = start_session()  # the main job's: local[2], quiet, the sources registered
        recount = batch_recount(spark, broker.bootstrap, topic)
        assert recount == expected, "the topic does not hold what was produced"
        batch = sum(expected.values()) // batches  # so many batches for the plain run
        runs = {}
        for name, drift in (("plain", None), ("aligned", "30s")):
            run = run_windows(
                spark,
                broker.bootstrap,
                topic,
                workdir / name,
                expected,
                drift=drift,
                max_records=batch,
            )
            runs[name] = run
            print(
                f"{name:>8}: {sum(expected.values()):,} events, {run.batches} batches in "
                f"{run.seconds:.1f}s, {len(run.closed)} closed windows, dropped as late: "
                f"{run.dropped:,} by the recount, {run.dropped_by_spark:,} by Spark's count",
                flush=True,
            )
        plot(runs["plain"], runs["aligned"], figure)
        print(f"plot: {figure}", flush=True)

    ratios = []
    if not args.quick:
        generator_rate(spark, workdir / "warm-up", rows // 4, aligned=True)
    for pair in range(pairs):
        rate = {}
        for with_alignment in (False, True) if pair % 2 == 0 else (True, False):  # alternate
            out = workdir / f"gen-{pair}-{'aligned' if with_alignment else 'plain'}"
            rate[with_alignment] = generator_rate(spark, out, rows, aligned=with_alignment)
        plain, aligned = rate[False], rate[True]
        ratios.append(aligned / plain)
        print(
            f"generator, no lag, pair {pair}: plain {plain:,.0f} rec/s, aligned "
            f"{aligned:,.0f} rec/s, ratio {aligned / plain:.3f}",
            flush=True,
        )
    spark.stop()
    cost = statistics.median(ratios)
    print(
        f"alignment cost: median throughput ratio aligned/plain = {cost:.3f} (target >= 0.9)",
        flush=True,
    )
    if cost < 0.9:
        print(f"MISS alignment cost: ratio {cost:.3f} is below the target 0.9")
    dropped = runs["aligned"].dropped
    if dropped:
        print(f"MISS dropped_with_alignment={dropped}: aligned, events were dropped as late")
    print(f"RESULT dropped_with_alignment={dropped} target=0")


if __name__ == "__main__":
    main()
