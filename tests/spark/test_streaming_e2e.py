"""Exactly-once streaming on Spark local mode, across every kind of restart and failure.

Each test streams a file-backed :class:`~splitflow.testing.sequence.SequenceCatalog` into
a Parquet sink with a checkpoint, changes the catalog while the query runs, and then reads
the sink back with Spark and compares it with ``catalog.records()``: every record exactly
once, nothing missing, nothing extra.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.spark.sources import read_task_log
from tests.spark.support import (
    FAULTY,
    Job,
    assert_exactly_once,
    caught_up,
    data_batches,
    end_offset,
    kill_before_commit,
    log_ids,
    owner_loads,
    reported_splits,
    sink_rows,
    start_stream,
    wait_caught_up,
    wait_until,
)

from splitflow.testing.sequence import SequenceCatalog

pytestmark = pytest.mark.slow


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Any]:
    """Start jobs with ``jobs(*args)``; every job still running after the test is killed."""
    started: list[Job] = []

    def start(*args: str) -> Job:
        job = Job(list(args), tmp_path / "jobs.log")
        started.append(job)
        return job

    yield start
    for job in started:
        job.close()


class Producer(threading.Thread):
    """Appends ``count`` records to every split of the catalog every ``every`` seconds."""

    def __init__(self, catalog: SequenceCatalog, every: float = 0.25, count: int = 2) -> None:
        super().__init__(daemon=True)
        self.catalog, self.every, self.count = catalog, every, count
        self.stopped = threading.Event()
        self.rounds = 0

    def run(self) -> None:
        while not self.stopped.wait(self.every):
            for name in sorted(self.catalog.lengths()):
                self.catalog.append(name, self.count)
            self.rounds += 1

    def stop(self) -> None:
        self.stopped.set()
        self.join(10)


def test_hard_kill_of_the_driver_mid_batch_then_restart_is_exactly_once(
    tmp_path: Path, spark: Any, jobs: Any
) -> None:
    """SIGKILL the driver twice, each time with a batch planned but not committed.

    Kill 1 lands while the batch's tasks are reading (each task sleeps 1 s first); kill 2
    as soon as the next run wrote a new offset. Records are appended all along, and a split
    is added during each of the first two runs. The third run finishes: the sink holds every
    record exactly once, and the batch in flight at each kill was run again, from its offset
    in the checkpoint.
    """
    catalog = SequenceCatalog({"a": 40, "b": 25, "c": 10}, path=str(tmp_path / "catalog.json"))
    out, checkpoint, done = tmp_path / "out", tmp_path / "checkpoint", tmp_path / "done"
    tasks = tmp_path / "tasks"
    args = [
        f"--catalog={catalog.path}",
        f"--out={out}",
        f"--checkpoint={checkpoint}",
        "--parallelism=2",
        "--max-records-per-batch=500",
        "--trigger=500ms",
        f"--source={FAULTY}",
        "--option=readDelay=1s",
        "--option=discoveryInterval=500ms",
        f"--option=taskLog={tasks}",
        f"--done-file={done}",
    ]
    producer = Producer(catalog)
    producer.start()
    try:
        # Run 1: kill while the tasks of a planned batch are reading.
        run1 = jobs(*args)
        wait_until("run 1's first batch", lambda: run1.check_alive() and run1.batches(), 120)
        catalog.add("added-1", 7)
        wait_until("run 1's next batch", lambda: run1.check_alive() and len(run1.batches()) > 1, 60)

        def reading() -> int | None:
            run1.check_alive()
            in_flight = set(log_ids(checkpoint, "offsets")) - set(log_ids(checkpoint, "commits"))
            started = {t["batch"] for t in read_task_log(tasks) if t["outcome"] == "started"}
            return min(in_flight & started, default=None)

        killed1 = kill_before_commit(
            run1, "a batch whose tasks are reading", reading, checkpoint, 60, step=0.02
        )

        # Run 2: kill as soon as a new offset is written (the batch replayed first).
        offsets_before = max(log_ids(checkpoint, "offsets"))
        run2 = jobs(*args)
        wait_until(
            "run 2 to start", lambda: run2.check_alive() and "STARTED" in str(run2.lines), 120
        )
        catalog.add("added-2", 5)

        def new_offset() -> int | None:
            run2.check_alive()
            committed = set(log_ids(checkpoint, "commits"))
            newer = [b for b in log_ids(checkpoint, "offsets") if b > offsets_before]
            return min(set(newer) - committed, default=None)

        killed2 = kill_before_commit(
            run2, "run 2 to write a new offset", new_offset, checkpoint, 120, step=0.01
        )
        assert killed1 in log_ids(checkpoint, "commits"), "run 2 ran the batch killed in run 1"

        # Run 3: the producer stops; the job stops once it has read everything.
        run3 = jobs(*args)
        wait_until("run 3 to complete a batch", lambda: run3.check_alive() and run3.batches(), 120)
    finally:
        producer.stop()
    done.touch()
    assert run3.finish(120) == 0, run3.lines
    assert "CAUGHT-UP" in run3.lines
    assert killed2 in run3.batches(), "run 3 ran the batch killed in run 2"
    assert {"added-1", "added-2"} <= set(catalog.lengths())
    assert_exactly_once(sink_rows(spark, out), catalog.records())

    # A batch run again after a kill read the very slices planned before the kill.
    log = read_task_log(tasks)
    slices: dict[tuple[int, int], set[str]] = {}
    for task in log:
        slices.setdefault((task["batch"], task["partition"]), set()).add(str(task["slices"]))
    assert all(len(planned) == 1 for planned in slices.values()), slices
    for killed in (killed1, killed2):
        finished = [t for t in log if t["batch"] == killed and t["outcome"] == "ok"]
        assert finished, f"batch {killed} was read to its end after the kill"
    readers = {t["pid"] for t in log if t["batch"] == killed1}
    assert len(readers) >= 2, f"batch {killed1} was read in run 1 (killed) and in run 2"


def test_clean_stop_and_restart_on_the_same_checkpoint_is_exactly_once(
    tmp_path: Path, spark: Any
) -> None:
    """``query.stop()``, new records and a new split, the same query again: all once."""
    catalog = SequenceCatalog({"a": 30, "b": 20}, path=str(tmp_path / "catalog.json"))
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    options = {"parallelism": 2, "maxRecordsPerBatch": 20, "discoveryInterval": "500ms"}

    first = start_stream(spark, catalog, out, checkpoint, **options)
    wait_caught_up(first, catalog)
    last_of_first = first.lastProgress["batchId"]
    first.stop()
    assert_exactly_once(sink_rows(spark, out), catalog.records())

    catalog.append("a", 15)
    catalog.add("c", 10)
    second = start_stream(spark, catalog, out, checkpoint, **options)
    wait_caught_up(second, catalog)
    second.stop()
    assert data_batches(second)[0]["batchId"] == last_of_first + 1
    assert_exactly_once(sink_rows(spark, out), catalog.records())


def test_a_crashed_task_attempt_is_retried_and_reads_exactly_its_slice_again(
    tmp_path: Path, spark: Any
) -> None:
    """The first attempt of task 0 of batch 1 yields half its slice, then raises.

    Spark retries the task (``local[2,3]``: three attempts); attempt 1 reads the same slices
    in full, and the half the crashed attempt yielded is not in the sink twice.
    """
    catalog = SequenceCatalog({"a": 60, "b": 60}, path=str(tmp_path / "catalog.json"))
    out, checkpoint, tasks = tmp_path / "out", tmp_path / "checkpoint", tmp_path / "tasks"
    query = start_stream(
        spark,
        catalog,
        out,
        checkpoint,
        source=FAULTY,
        parallelism=2,
        maxRecordsPerBatch=40,
        crashBatch=1,
        crashPartition=0,
        taskLog=tasks,
    )
    wait_caught_up(query, catalog)
    assert query.isActive
    assert query.exception() is None
    query.stop()

    log = read_task_log(tasks)
    crashed = [t for t in log if t["outcome"] == "crashed"]
    assert len(crashed) == 1, log
    (crash,) = crashed
    assert (crash["batch"], crash["partition"], crash["attempt"]) == (1, 0, 0)
    assert 0 < crash["rows"] < crash["planned"], "the crash came after part of the slice"
    retries = [
        t
        for t in log
        if t["outcome"] == "ok" and (t["batch"], t["partition"]) == (1, 0) and t["attempt"] > 0
    ]
    assert len(retries) == 1, log
    (retry,) = retries
    assert retry["slices"] == crash["slices"], "the retry reads the crashed attempt's slices"
    assert retry["rows"] == retry["planned"] == crash["planned"]
    assert_exactly_once(sink_rows(spark, out), catalog.records())


def test_restart_with_another_parallelism_balances_splits_over_the_new_slots(
    tmp_path: Path, spark: Any
) -> None:
    """Parallelism 2, then 3, then 1 on one checkpoint: splits balanced, records once."""
    names = ["a", "b", "c", "d", "e"]
    catalog = SequenceCatalog(
        {n: 10 + 5 * i for i, n in enumerate(names)}, path=str(tmp_path / "catalog.json")
    )
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    for parallelism in (2, 3, 1):
        query = start_stream(
            spark, catalog, out, checkpoint, parallelism=parallelism, maxRecordsPerBatch=40
        )
        wait_caught_up(query, catalog)
        progress = query.lastProgress
        query.stop()
        loads = owner_loads(reported_splits(progress), parallelism)
        assert sum(loads) == len(names)
        assert max(loads) - min(loads) <= 1, f"parallelism {parallelism}: loads {loads}"
        slots = end_offset(progress)["slots"]
        assert len(slots) == parallelism
        assert sorted(len(slot) for slot in slots) == sorted(loads)
        assert_exactly_once(sink_rows(spark, out), catalog.records())
        for name in names:
            catalog.append(name, 4)
    # the records appended after the last run are not in the sink yet
    assert len(sink_rows(spark, out)) == len(catalog.records()) - 4 * len(names)


def test_a_split_added_while_running_is_discovered_and_read_in_a_later_batch(
    tmp_path: Path, spark: Any
) -> None:
    catalog = SequenceCatalog({"a": 10}, path=str(tmp_path / "catalog.json"))
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    query = start_stream(spark, catalog, out, checkpoint, discoveryInterval="500ms")
    wait_caught_up(query, catalog)
    before = query.lastProgress["batchId"]
    catalog.add("late", 15)
    catalog.append("a", 5)
    wait_caught_up(query, catalog)
    query.stop()
    first_with_late = min(p["batchId"] for p in data_batches(query) if "late" in reported_splits(p))
    assert first_with_late > before
    assert_exactly_once(sink_rows(spark, out), catalog.records())


def test_a_vanished_split_is_dropped_and_the_query_reads_the_others(
    tmp_path: Path, spark: Any
) -> None:
    """A split removed from the catalog while the query runs.

    What happens: the records of ``gone`` read before it vanished stay in the sink, once
    each; at the next discovery the enumerator drops it and its slot stops planning it; the
    query keeps running and reads the other splits, old and new records alike. (``gone`` is
    removed when it has no unread records: see the next test for a split that vanishes with
    records planned but not yet read.)
    """
    catalog = SequenceCatalog({"a": 20, "gone": 20, "c": 20}, path=str(tmp_path / "catalog.json"))
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    query = start_stream(spark, catalog, out, checkpoint, discoveryInterval="500ms")
    wait_caught_up(query, catalog)
    read_before = catalog.records()
    catalog.remove("gone")
    catalog.append("a", 10)
    catalog.append("c", 5)

    def dropped_and_caught_up() -> bool:
        assert query.exception() is None, query.exception()
        return caught_up(query, catalog) and "gone" not in reported_splits(query.lastProgress)

    wait_until("the query to drop 'gone' and read the rest", dropped_and_caught_up, 60)
    catalog.append("a", 5)
    wait_caught_up(query, catalog)
    assert query.isActive
    query.stop()
    expected = catalog.records() + [r for r in read_before if r[0] == "gone"]
    assert_exactly_once(sink_rows(spark, out), sorted(expected))


def remove_gone_under_a_planned_batch(
    spark: Any, tmp_path: Path, **options: str
) -> tuple[Any, SequenceCatalog, Path, list[tuple[str, int]]]:
    """Stream splits ``a`` and ``gone``; remove ``gone`` while a batch's tasks, which hold a
    planned slice of new records of it, sleep before reading. Returns the running query, the
    catalog, the sink and the records read before."""
    catalog = SequenceCatalog({"a": 10, "gone": 10}, path=str(tmp_path / "catalog.json"))
    out, checkpoint, tasks = tmp_path / "out", tmp_path / "checkpoint", tmp_path / "tasks"
    query = start_stream(
        spark,
        catalog,
        out,
        checkpoint,
        source=FAULTY,
        readDelay="1s",
        discoveryInterval="500ms",
        taskLog=tasks,
        **options,
    )
    wait_caught_up(query, catalog)
    read_before = catalog.records()
    catalog.append("gone", 10)
    catalog.append("a", 10)

    def reading_gone() -> bool:
        return any(
            t["outcome"] == "started"
            and ["gone", 20] in [[s["name"], stop] for s, _, stop in t["slices"]]
            for t in read_task_log(tasks)
        )

    wait_until("a task reading gone's new records", reading_gone, 30, step=0.02)
    catalog.remove("gone")
    return query, catalog, out, read_before


def test_a_split_vanishing_with_planned_unread_records_is_skipped_without_fail_on_data_loss(
    tmp_path: Path, spark: Any
) -> None:
    """With ``failOnDataLoss=false`` the records of ``gone`` that were planned are lost with
    it (a warning), the query keeps running and reads the other splits exactly once."""
    query, catalog, out, read_before = remove_gone_under_a_planned_batch(
        spark, tmp_path, failOnDataLoss="false", readerIdleTimeout="500ms"
    )
    catalog.append("a", 5)
    wait_caught_up(query, catalog, timeout=60)
    assert query.isActive, query.exception()
    query.stop()
    rows = sink_rows(spark, out)
    gone = [r for r in rows if r[0] == "gone"]
    read_of_gone = sum(1 for r in read_before if r[0] == "gone")
    assert read_of_gone <= len(gone) <= 20, gone
    assert_exactly_once(gone, [("gone", i) for i in range(len(gone))])
    assert_exactly_once([r for r in rows if r[0] != "gone"], catalog.records())


def test_a_split_vanishing_with_planned_unread_records_fails_the_query_by_default(
    tmp_path: Path, spark: Any
) -> None:
    """The default ``failOnDataLoss=true``: the query stops with a DataLossError naming the
    split and the lost range, instead of skipping records silently."""
    query, *_ = remove_gone_under_a_planned_batch(spark, tmp_path)
    wait_until("the query to fail", lambda: not query.isActive, 60)
    error = str(query.exception())
    assert "DataLossError" in error
    assert "records [10, 20) of split gone" in error
