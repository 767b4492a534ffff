"""Admission control, triggers, option errors and batch reads, on Spark local mode.

Every streaming test also checks the sink: every record of the catalog exactly once.
"""

from __future__ import annotations

import math
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from tests.spark.support import (
    SOURCE,
    assert_exactly_once,
    data_batches,
    log_ids,
    reported_splits,
    sink_rows,
    start_stream,
    wait_caught_up,
    wait_until,
)

from splitflow.testing.sequence import SequenceCatalog

pytestmark = pytest.mark.slow


@pytest.fixture
def catalog(tmp_path: Path) -> SequenceCatalog:
    return SequenceCatalog({"a": 100, "b": 37, "c": 3}, path=str(tmp_path / "catalog.json"))


def timestamp(progress: dict[str, Any]) -> float:
    return datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()


@pytest.mark.parametrize(
    ("options", "cap"),
    [
        ({"maxRecordsPerBatch": 25}, 25),
        ({"recordBytes": 100, "maxBytesPerBatch": 2_000}, 20),  # 100-byte records
    ],
    ids=["maxRecordsPerBatch", "maxBytesPerBatch"],
)
def test_a_batch_limit_bounds_every_batch_and_starves_no_split(
    tmp_path: Path, spark: Any, catalog: SequenceCatalog, options: dict[str, int], cap: int
) -> None:
    query = start_stream(
        spark, catalog, tmp_path / "out", tmp_path / "chk", parallelism=2, **options
    )
    wait_caught_up(query, catalog)
    query.stop()
    batches = data_batches(query)
    rows = [p["numInputRows"] for p in batches]
    assert max(rows) <= cap, rows
    assert sum(rows) == len(catalog.records())
    assert len(batches) >= math.ceil(140 / cap)
    first = reported_splits(batches[0])
    assert first["c"]["position"] > 0, f"the small split waits behind the big one: {first}"
    assert_exactly_once(sink_rows(spark, tmp_path / "out"), catalog.records())


def waiting_for_trigger(query: Any) -> bool:
    """At least one trigger has run (before the first: "Initializing sources")."""
    assert query.exception() is None, query.exception()
    return bool(query.status["message"] == "Waiting for next trigger")


def assert_reads_nothing_for(query: Any, seconds: float) -> None:
    """Over ``seconds`` (several triggers), no batch reads a record.

    (Spark may run an empty batch 0 from the initial offset: that one reads nothing.)
    """
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert query.exception() is None, query.exception()
        assert data_batches(query) == [], "a batch read records"
        time.sleep(0.05)


def test_min_records_per_batch_waits_for_enough_records(tmp_path: Path, spark: Any) -> None:
    """minRecordsPerBatch=50 (maxBatchDelay 1h): 30 records wait; 30 more make one batch."""
    catalog = SequenceCatalog({"a": 20, "b": 10}, path=str(tmp_path / "catalog.json"))
    out, checkpoint = tmp_path / "out", tmp_path / "chk"
    options = {"minRecordsPerBatch": 50, "maxBatchDelay": "1h"}
    query = start_stream(spark, catalog, out, checkpoint, **options)
    wait_until("the query's first trigger", lambda: waiting_for_trigger(query), 60)
    assert_reads_nothing_for(query, 3)
    catalog.append("b", 30)
    wait_caught_up(query, catalog)
    query.stop()
    assert [p["numInputRows"] for p in data_batches(query)] == [60]
    assert_exactly_once(sink_rows(spark, out), catalog.records())


def test_min_records_per_batch_gives_up_waiting_after_max_batch_delay(
    tmp_path: Path, spark: Any
) -> None:
    """minRecordsPerBatch=50, maxBatchDelay=3s: 5 records come in a batch 3 s after start."""
    catalog = SequenceCatalog({"a": 5}, path=str(tmp_path / "catalog.json"))
    out, checkpoint = tmp_path / "out", tmp_path / "chk"
    started = time.time()
    query = start_stream(spark, catalog, out, checkpoint, minRecordsPerBatch=50, maxBatchDelay="3s")
    wait_caught_up(query, catalog, timeout=60)
    query.stop()
    (batch,) = data_batches(query)
    assert batch["numInputRows"] == 5
    waited = timestamp(batch) - started
    assert waited >= 3 - 0.5, f"the batch was planned {waited:.1f}s after the start"
    assert_exactly_once(sink_rows(spark, out), catalog.records())


def test_max_records_per_task_cuts_a_slot_into_tasks_of_at_most_that_many_records(
    tmp_path: Path, spark: Any
) -> None:
    """One batch (trigger once) of 60 + 25 records, 2 slots, tasks of at most 20 records.

    ``spark_partition_id()`` in the written rows tells which task read each record.
    """
    from pyspark.sql.functions import spark_partition_id

    catalog = SequenceCatalog({"a": 60, "b": 25}, path=str(tmp_path / "catalog.json"))
    query = start_stream(
        spark,
        catalog,
        tmp_path / "out",
        tmp_path / "chk",
        trigger={"once": True},
        columns={"task": spark_partition_id()},
        parallelism=2,
        maxRecordsPerTask=20,
    )
    assert query.awaitTermination(120)
    frame = spark.read.parquet(str(tmp_path / "out"))
    per_task = {r["task"]: r["count"] for r in frame.groupBy("task").count().collect()}
    assert max(per_task.values()) <= 20, per_task
    assert len(per_task) == math.ceil(60 / 20) + math.ceil(25 / 20), per_task
    assert_exactly_once(sink_rows(spark, tmp_path / "out"), catalog.records())


def test_trigger_once_reads_everything_available_in_one_batch_and_stops(
    tmp_path: Path, spark: Any, catalog: SequenceCatalog
) -> None:
    """``trigger(once=True)`` passes ReadAllAvailable: maxRecordsPerBatch does not apply."""
    query = start_stream(
        spark,
        catalog,
        tmp_path / "out",
        tmp_path / "chk",
        trigger={"once": True},
        maxRecordsPerBatch=10,
    )
    assert query.awaitTermination(120), "the query stops by itself"
    assert query.exception() is None
    assert [p["numInputRows"] for p in data_batches(query)] == [140]
    assert_exactly_once(sink_rows(spark, tmp_path / "out"), catalog.records())


def test_trigger_available_now_reads_what_existed_at_start_in_batches_and_stops(
    tmp_path: Path, spark: Any, catalog: SequenceCatalog
) -> None:
    """Records and splits that appear after the start wait for the next run."""
    out, checkpoint = tmp_path / "out", tmp_path / "chk"
    at_start = catalog.records()
    options = {"maxRecordsPerBatch": 20, "discoveryInterval": "200ms"}
    query = start_stream(spark, catalog, out, checkpoint, trigger={"availableNow": True}, **options)
    wait_until("the first batch", lambda: query.lastProgress or not query.isActive, 60)
    assert query.isActive, "the run is still going when records are added"
    catalog.append("a", 10)
    catalog.append("c", 4)
    catalog.add("late", 6)
    assert query.awaitTermination(120), "the query stops by itself"
    assert query.exception() is None
    rows = [p["numInputRows"] for p in data_batches(query)]
    assert max(rows) <= 20, rows
    assert len(rows) >= math.ceil(len(at_start) / 20), rows
    assert_exactly_once(sink_rows(spark, out), at_start)

    again = start_stream(spark, catalog, out, checkpoint, trigger={"availableNow": True}, **options)
    assert again.awaitTermination(120)
    assert again.exception() is None
    assert_exactly_once(sink_rows(spark, out), catalog.records())


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"parallelism": "0"}, "parallelism"),
        ({"maxRecordsPerBatch": "abc"}, "maxRecordsPerBatch"),
        ({"maxBatchDelay": "soon"}, "maxBatchDelay"),
        ({"minRecordsPerBatch": "50", "maxRecordsPerBatch": "10"}, "minRecordsPerBatch"),
        ({"catalog": None}, "catalog"),
        ({"maxBytesPerBatch": "64m"}, "maxBytesPerBatch"),  # no size estimate: no recordBytes
        ({"maxBytesPerBatch": "1.5g", "recordBytes": "10"}, "maxBytesPerBatch"),
    ],
    ids=[
        "parallelism=0",
        "maxRecordsPerBatch=abc",
        "maxBatchDelay=soon",
        "min>max",
        "no-catalog",
        "bytes-without-estimate",
        "maxBytesPerBatch=1.5g",
    ],
)
def test_an_invalid_option_fails_load_naming_it_and_no_query_starts(
    tmp_path: Path,
    spark: Any,
    catalog: SequenceCatalog,
    options: dict[str, str | None],
    option: str,
) -> None:
    from pyspark.errors import AnalysisException

    given = {"catalog": catalog.path, **options}
    checkpoint = tmp_path / "chk"
    reader = spark.readStream.format(SOURCE)
    for key, value in given.items():
        if value is not None:
            reader = reader.option(key, value)
    with pytest.raises(AnalysisException, match=f"ConfigurationError: option {option}\\b"):
        (
            reader.load()
            .writeStream.format("parquet")
            .option("path", str(tmp_path / "out"))
            .option("checkpointLocation", str(checkpoint))
            .start()
        )
    assert spark.streams.active == []
    assert log_ids(checkpoint, "offsets") == [], "no batch was planned"

    batch = spark.read.format(SOURCE)
    for key, value in given.items():
        if value is not None:
            batch = batch.option(key, value)
    with pytest.raises(AnalysisException, match=f"option {option}\\b"):
        batch.load()


def test_batch_read_reads_every_split_from_its_start_to_its_current_end_in_one_job(
    spark: Any, catalog: SequenceCatalog
) -> None:
    catalog.add("empty", 0)
    catalog.add("d", 7)
    context = spark.sparkContext
    context.setJobGroup("splitflow-batch-read", "batch read")
    try:
        frame = spark.read.format(SOURCE).option("catalog", catalog.path).option("parallelism", 3)
        rows = sorted((r["split"], r["position"]) for r in frame.load().collect())
    finally:
        context.setJobGroup("", "")
    assert_exactly_once(rows, catalog.records())
    jobs = context.statusTracker().getJobIdsForGroup("splitflow-batch-read")
    assert len(jobs) == 1, f"{len(jobs)} Spark jobs"
    (job,) = jobs
    info = context.statusTracker().getJobInfo(job)
    assert info.status == "SUCCEEDED"
    (stage,) = info.stageIds
    assert context.statusTracker().getStageInfo(stage).numTasks == 3, "one task per slot"


@pytest.mark.parametrize("splits", [{}, {"empty": 0}], ids=["no split", "an empty split"])
def test_batch_read_of_nothing_is_an_empty_frame(
    spark: Any, tmp_path: Path, splits: dict[str, int]
) -> None:
    catalog = SequenceCatalog(splits, path=str(tmp_path / "catalog.json"))
    frame = spark.read.format(SOURCE).option("catalog", catalog.path).load()
    assert frame.collect() == []  # Spark runs one task when a read has none: it reads nothing
    assert frame.count() == 0


def test_a_second_query_on_a_state_directory_in_use_fails_and_the_first_reads_on(
    tmp_path: Path, spark: Any
) -> None:
    """Two queries given one stateDir would read each other's reader events and delete each
    other's files: the second fails when it starts, naming the option; the first is not
    disturbed and its sink holds every record once."""
    catalog = SequenceCatalog({"a": 30, "b": 30}, path=str(tmp_path / "catalog.json"))
    state = tmp_path / "state"
    first = start_stream(
        spark, catalog, tmp_path / "out1", tmp_path / "chk1", stateDir=state, maxRecordsPerBatch=20
    )
    try:
        wait_until("a committed batch", lambda: log_ids(tmp_path / "chk1", "commits"), 60)
        second = start_stream(spark, catalog, tmp_path / "out2", tmp_path / "chk2", stateDir=state)
        try:
            wait_until("the second query to fail", lambda: second.exception() is not None, 60)
            message = str(second.exception())
            assert f"option stateDir: {state} is in use by another query" in message
            assert not log_ids(tmp_path / "chk2", "commits")
        finally:
            second.stop()
        catalog.append("a", 10)
        wait_caught_up(first, catalog)
    finally:
        first.stop()
    assert_exactly_once(sink_rows(spark, tmp_path / "out1"), catalog.records())
