"""Backlog-aware batch sizing on Spark (FLIP-309), in the spirit of Flink's
CheckpointIntervalDuringBacklogITCase: batch sizes follow the backlog flag and switch when
the last split crosses its boundary; a boundary is reported once per split although the
task that crossed it crashed and was retried; boundaries survive a driver SIGKILL and a
restart with another parallelism. Every test also checks the sink, record by record.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.spark.backlog_source import BacklogLoggingDataSource
from tests.spark.support import (
    assert_exactly_once,
    data_batches,
    log_ids,
    sink_rows,
    source_progress,
    start_stream,
    wait_caught_up,
    wait_until,
)
from tests.spark.test_streaming_e2e import FAULTY, jobs  # noqa: F401 (the fixture)

from splitflow.testing.sequence import SequenceCatalog

pytestmark = pytest.mark.slow


def backlog_flag(progress: dict[str, Any]) -> bool:
    return bool(json.loads(source_progress(progress)["latestOffset"])["backlog"])


def offsets(checkpoint: Path) -> list[dict[str, Any]]:
    """The splitflow offset of every batch in the checkpoint's offset log, in order."""
    found = []
    for batch in log_ids(checkpoint, "offsets"):
        lines = (checkpoint / "offsets" / str(batch)).read_text().splitlines()
        found.append(json.loads(lines[2]))
    return found


def test_batch_sizes_follow_the_backlog_and_the_crossing_is_reported_once_despite_a_retry(
    tmp_path: Path, spark: Any
) -> None:
    spark.dataSource.register(BacklogLoggingDataSource)
    catalog = SequenceCatalog({"a": 150, "b": 50}, path=str(tmp_path / "catalog.json"))
    events = tmp_path / "backlog-events.txt"
    query = start_stream(
        spark,
        catalog,
        tmp_path / "out",
        tmp_path / "chk",
        source="splitflow-sequence-backlog",
        parallelism=2,
        backlogMaxRecordsPerBatch=100,
        maxRecordsPerBatch=10,
        discoveryInterval="200ms",
        crashBatch=1,  # the batch that reads both splits up to their boundaries
        backlogLog=str(events),
    )
    try:
        wait_caught_up(query, catalog)
        catalog.append("a", 15)  # live records, after the backlog
        catalog.append("b", 15)
        wait_caught_up(query, catalog)
    finally:
        query.stop()
    batches = data_batches(query)
    rows = [p["numInputRows"] for p in batches]
    assert rows[:2] == [100, 100], rows  # catching up: throughput-sized
    assert rows[2:] == [10, 10, 10], rows  # at the head: latency-sized
    flags = [backlog_flag(p) for p in batches]
    assert flags[0] is True
    assert flags[2:] == [False, False, False]
    assert sorted(events.read_text().split()) == ["a", "b"], "one event per split"
    assert_exactly_once(sink_rows(spark, tmp_path / "out"), catalog.records())


def test_boundaries_survive_a_driver_kill_and_a_restart_with_another_parallelism(
    tmp_path: Path,
    spark: Any,
    jobs: Any,  # noqa: F811
) -> None:
    catalog = SequenceCatalog({"a": 60, "b": 60, "c": 60}, path=str(tmp_path / "catalog.json"))
    out, checkpoint, done = tmp_path / "out", tmp_path / "chk", tmp_path / "done"
    common = [
        f"--catalog={catalog.path}",
        f"--out={out}",
        f"--checkpoint={checkpoint}",
        "--trigger=200ms",
        f"--source={FAULTY}",
        "--option=backlogMaxRecordsPerBatch=30",
        "--option=maxRecordsPerBatch=6",
        "--option=discoveryInterval=200ms",
        "--option=readDelay=500ms",
        f"--done-file={done}",
    ]
    run1 = jobs(*common, "--parallelism=2")
    wait_until("run 1's first batch", lambda: run1.check_alive() and run1.batches(), 120)
    for name in "abc":  # after the boundaries were recorded: live, not backlog
        catalog.append(name, 20)
    wait_until("a planned batch", lambda: len(log_ids(checkpoint, "offsets")) >= 3, 60)
    run1.kill()

    done.touch()
    run2 = jobs(*common, "--parallelism=3")
    assert run2.finish(180) == 0, run2.lines
    history = offsets(checkpoint)
    assert [len(o["slots"]) for o in history][-1] == 3
    seen = {}
    for offset in history:
        seen.update(offset["enumerator"]["backlog"])
        assert set(offset["enumerator"]["backlog"].values()) <= {60}, offset["enumerator"]
    assert seen == {"a": 60, "b": 60, "c": 60}
    in_backlog = [o["backlog"] for o in history]
    assert in_backlog[0] is True
    assert in_backlog[-1] is False
    assert in_backlog == sorted(in_backlog, reverse=True), "backlog ends once, never resumes"
    assert_exactly_once(sink_rows(spark, out), catalog.records())
