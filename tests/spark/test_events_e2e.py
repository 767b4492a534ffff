"""Reader events reach the enumerator exactly once per committed batch, on real Spark.

The source is ``splitflow-sequence-events`` (``tests/spark/sources.py``): per split per task
its readers send a :class:`~tests.spark.sources.ReadReport` ("read N records of split X
from S up to P", with the task's batch, partition and attempt); its enumerator keeps every
report in its state and answers each with a :class:`~tests.spark.sources.ReportAck` to the
sending slot, whose tasks of a later batch send the acks they received back
(:class:`~tests.spark.sources.AcksReceived`), kept too. The enumerator state is part of each
offset Spark writes, so the test reads from ``<checkpoint>/offsets`` exactly what reached the
enumerator, and compares it with what every batch planned:

* the reports in the last offset are exactly one per slice of every batch whose events that
  offset says are applied (``events_through``): none twice, none missing, none from a later
  batch, each with ``records == stop - start``;
* each ack came back exactly once, from a task of the slot it was sent to, in a later batch;
  the acks not back yet are exactly those the last offset still carries to the readers.

Runs: local mode with a task attempt that crashes after its events were written and one that
crashes before (both retried); a driver SIGKILLed while a batch's events are written but the
batch is not committed, then restarted, in local mode and on a standalone cluster (the state
directory on the local filesystem the cluster's processes share). The Parquet sink is
checked too: every record exactly once.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from tests.spark.cluster import QUICK_JVM, script_driver, standalone_cluster
from tests.spark.sources import (
    EVENT_SOURCES,
    EventLogSequenceSource,
    EventLogState,
    ReportAck,
    read_task_log,
)
from tests.spark.support import (
    assert_exactly_once,
    expanded,
    log_ids,
    sink_rows,
    start_stream,
    wait_caught_up,
    wait_until,
)

from splitflow.api.events import SourceEvent
from splitflow.spark import register
from splitflow.spark.limits import MaxRecords
from splitflow.spark.offset import BatchOffset, plan_partitions
from splitflow.spark.planner import Planner
from splitflow.testing.sequence import SequenceCatalog, SequenceEnumerator, SequenceSource

EVENTS = "splitflow-sequence-events"


# -- reading what reached the enumerator from the checkpoint -------------------------------------


def source_offset(checkpoint: Path, batch: int, state_dir: Path) -> dict[str, Any]:
    """The splitflow offset Spark wrote for ``batch`` (``offsets/<batch>``: version, metadata,
    then one line per source), whole (its state read back from ``state_dir``)."""
    lines = (checkpoint / "offsets" / str(batch)).read_text().splitlines()
    return dict(expanded(json.loads(lines[2]), state_dir))


def check_event_log(checkpoint: Path, catalog: SequenceCatalog, state_dir: Path) -> EventLogState:
    """Assert the module doc's claims on the last offset of ``checkpoint``; return its state."""
    source = EventLogSequenceSource(catalog)
    batches = log_ids(checkpoint, "offsets")
    offsets = {
        b: BatchOffset.decode(source_offset(checkpoint, b, state_dir), source) for b in batches
    }
    last = offsets[batches[-1]]
    state = last.enumerator
    assert isinstance(state, EventLogState)
    applied = {b: o for b, o in offsets.items() if o.seq <= last.events_through}
    assert last.events_through == offsets[batches[-2]].seq, "the batch before the last is applied"

    # reader -> enumerator: one report per slice of every applied batch, nothing else
    expected: Counter[tuple[Any, ...]] = Counter()
    for batch, offset in applied.items():
        for partition, (slot, slices) in enumerate(plan_partitions(offset, None)):
            for piece in slices:
                key = (slot, piece.split.name, piece.start, piece.stop, batch, partition)
                expected[key] += 1
    received = Counter((r[0], r[1], r[2], r[3], r[5], r[6]) for r in state.reports)
    twice = sorted(k for k, n in received.items() if n > 1)
    missing = sorted(set(expected) - set(received))
    extra = sorted(set(received) - set(expected))
    assert not twice, f"reports that reached the enumerator more than once: {twice[:10]}"
    assert not missing, f"{len(missing)} reports of committed batches missing: {missing[:10]}"
    assert not extra, f"reports of batches not applied yet (or never planned): {extra[:10]}"
    assert all(r[4] == r[3] - r[2] for r in state.reports), "a report's count is not stop-start"

    # enumerator -> reader: each ack back once, from its slot, from the tasks of the first
    # batch after the report's in which that slot had a task; the rest still travels in the
    # last offset
    slot_of = {n: r[0] for n, r in enumerate(state.reports)}
    batch_of = {n: r[5] for n, r in enumerate(state.reports)}
    echoed = Counter(e[1] for e in state.echoes)
    twice_back = sorted(n for n, count in echoed.items() if count > 1)
    assert not twice_back, f"acks back twice: {twice_back}"
    for slot, number, batch, _partition in state.echoes:
        assert slot == slot_of[number], f"ack {number} came back from slot {slot}"
        after = [b for b, o in offsets.items() if b > batch_of[number] and o.has_tasks(slot)]
        assert batch == min(after), (
            f"ack {number} (a report of batch {batch_of[number]}) came back from batch "
            f"{batch}, not from slot {slot}'s next batch {min(after)}"
        )
    travelling = {
        e.number for events in last.to_readers.values() for e in events if isinstance(e, ReportAck)
    }
    assert set(echoed) | travelling == set(slot_of), "acks lost on the way"
    assert not set(echoed) & travelling, "acks back and still travelling"
    # ... and an applied batch's tasks sent back exactly what its offset carried to them
    carried = Counter(
        (e.number, batch)
        for batch, offset in applied.items()
        for slot, events in offset.to_readers.items()
        if offset.has_tasks(slot)
        for e in events
        if isinstance(e, ReportAck)
    )
    assert carried == Counter((e[1], e[2]) for e in state.echoes)
    assert len(state.reports) >= 2 * len(applied)  # at least a report per slot and batch
    return state


def reports_of(state: EventLogState, batch: int, partition: int) -> list[tuple[Any, ...]]:
    return [r for r in state.reports if r[5] == batch and r[6] == partition]


def assert_check_catches_tampering(
    checkpoint: Path, catalog: SequenceCatalog, state_dir: Path, tmp: Path
) -> None:
    """:func:`check_event_log` fails on a copy of the checkpoint whose last offset says an
    event arrived twice, or not at all: the check can fail."""
    last = log_ids(checkpoint, "offsets")[-1]

    def check_tampered(name: str, edit: Any) -> None:
        copy = tmp / name
        shutil.copytree(checkpoint / "offsets", copy / "offsets")
        lines = (copy / "offsets" / str(last)).read_text().splitlines()
        offset = source_offset(checkpoint, last, state_dir)  # whole: format 1
        edit(offset["enumerator"])
        lines[2] = json.dumps(offset)
        (copy / "offsets" / str(last)).write_text("\n".join(lines))
        check_event_log(copy, catalog, state_dir)

    cases = {
        "more than once": lambda state: state["reports"].append(state["reports"][0]),
        "missing": lambda state: state["reports"].pop(0),
        "acks back twice": lambda state: state["echoes"].append(state["echoes"][0]),
        "acks lost": lambda state: state["echoes"].pop(0),
    }
    for index, (message, edit) in enumerate(cases.items()):
        with pytest.raises(AssertionError, match=message):
            check_tampered(f"tampered-{index}", edit)


# -- local mode, in the shared session: task attempts that crash after and before sending -------


@pytest.mark.slow
def test_reader_events_reach_the_enumerator_once_per_committed_batch_despite_task_retries(
    tmp_path: Path, spark: Any
) -> None:
    register(spark, *EVENT_SOURCES)
    catalog = SequenceCatalog({"a": 30, "b": 20, "c": 12}, path=str(tmp_path / "catalog.json"))
    checkpoint, tasks = tmp_path / "checkpoint", tmp_path / "tasks"
    query = start_stream(
        spark,
        catalog,
        tmp_path / "out",
        checkpoint,
        source=EVENTS,
        parallelism=2,
        maxRecordsPerBatch=16,
        discoveryInterval="500ms",
        stateDir=tmp_path / "state",
        taskLog=tasks,
        crashAfterEventsBatch=1,  # attempt 0 of task 0 fails after its events were written
        crashBatch=2,  # attempt 0 of task 0 fails halfway through its slice
    )
    wait_until("batch 3", lambda: len(log_ids(checkpoint, "commits")) >= 4, 120)
    catalog.append("a", 10)
    catalog.add("d", 8)
    wait_caught_up(query, catalog, timeout=120)
    query.stop()

    assert_exactly_once(sink_rows(spark, tmp_path / "out"), catalog.records())
    state = check_event_log(checkpoint, catalog, tmp_path / "state")
    log = read_task_log(tasks)
    crashed = {(t["batch"], t["outcome"]) for t in log if t["partition"] == 0 and t["attempt"] == 0}
    assert (1, "ok") in crashed  # batch 1, attempt 0: read all, events written ...
    assert (1, "crashed-after-events") in crashed  # ... then the task failed
    assert (2, "crashed") in crashed  # batch 2, attempt 0: failed before its events
    assert (2, "ok") not in crashed
    for batch in (1, 2):
        reports = reports_of(state, batch, 0)
        assert reports, f"no report of batch {batch}, task 0"
        assert {r[7] for r in reports} == {1}, f"batch {batch}: the retry's events count, once"
    assert_check_catches_tampering(checkpoint, catalog, tmp_path / "state", tmp_path)


# -- a driver SIGKILLed between a batch's events and its commit, local and on a cluster -----------


def run_driver(config: dict[str, Any]) -> None:
    """Stream the catalog with ``config["options"]`` until ``<control>/stop``, then report."""
    from pyspark.sql import SparkSession

    control = Path(config["control"])
    builder = (
        SparkSession.builder.master(config["master"])
        .appName(f"splitflow-events-run-{config['run']}")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.extraJavaOptions", QUICK_JVM)
    )
    if config["master"].startswith("spark://"):
        builder = (
            builder.config("spark.executor.memory", "512m")
            .config("spark.cores.max", "2")
            .config("spark.executor.extraJavaOptions", QUICK_JVM)
            # executors unpickle the test source: tests.spark.sources must be importable
            .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
        )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register(spark, *EVENT_SOURCES)
    reader = spark.readStream.format(EVENTS).option("catalog", config["catalog"])
    for key, value in config["options"].items():
        reader = reader.option(key, str(value))
    query = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", config["out"])
        .option("checkpointLocation", config["checkpoint"])
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    (control / f"started-{config['run']}").touch()
    catalog = SequenceCatalog(path=config["catalog"])

    def positions() -> dict[str, int]:
        progress = query.lastProgress
        latest = progress["sources"][0].get("latestOffset") if progress else None
        if not latest or latest == "null":
            return {}
        return {s: int(i["position"]) for s, i in json.loads(latest)["splits"].items()}

    deadline = time.monotonic() + 600
    while not ((control / "stop").exists() and positions() == catalog.lengths()):
        if query.exception() is not None:
            raise RuntimeError(f"the query failed: {query.exception()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"not caught up: {positions()} vs {catalog.lengths()}")
        time.sleep(0.1)
    query.stop()
    rows = [(r.split, r.position) for r in spark.read.parquet(config["out"]).collect()]
    Path(config["result"]).write_text(json.dumps({"rows": rows}))
    spark.stop()


def driver(tmp: Path, config: dict[str, Any]) -> Any:
    return script_driver(__file__, tmp, int(config["run"]), config)


def kill_and_restart(tmp_path: Path, master: str) -> None:
    """Run 1 is killed while a planned batch's events are in stateDir but the batch is not
    committed; run 2 on the same checkpoint replays it and goes on; then every check."""
    catalog = SequenceCatalog({"a": 40, "b": 25}, path=str(tmp_path / "catalog.json"))
    checkpoint, state_dir, control = tmp_path / "checkpoint", tmp_path / "state", tmp_path / "ctl"
    control.mkdir()
    base = {
        "master": master,
        "catalog": catalog.path,
        "out": str(tmp_path / "out"),
        "checkpoint": str(checkpoint),
        "control": str(control),
        "result": str(tmp_path / "result.json"),
    }
    options = {
        "parallelism": 2,
        "maxRecordsPerBatch": 20,
        "discoveryInterval": "500ms",
        "stateDir": str(state_dir),
        "taskLog": str(tmp_path / "tasks"),
        "crashAfterEventsBatch": 1,
    }

    def committed() -> list[int]:
        return log_ids(checkpoint, "commits")

    def events_written_not_committed() -> int | None:
        for batch in sorted(set(log_ids(checkpoint, "offsets")) - set(committed())):
            with contextlib.suppress(OSError, ValueError, IndexError):
                seq = source_offset(checkpoint, batch, state_dir)["seq"]
                folder = state_dir / "events" / str(seq)
                if folder.is_dir() and any(name.isdigit() for name in os.listdir(folder)):
                    return batch
        return None

    run1_options = {**options, "holdAfterEvents": "2s"}  # tasks end 2 s after their events
    with driver(tmp_path, {**base, "run": 1, "options": run1_options}) as run1:
        wait_until("run 1's batch 1", lambda: run1.check_alive() and len(committed()) >= 2, 240)
        catalog.append("a", 12)
        catalog.add("c", 15)
        killed = wait_until(
            "a batch with its events written and not committed",
            lambda: run1.check_alive() and events_written_not_committed(),
            120,
            step=0.01,
        )
        run1.kill()
    assert killed not in committed()
    print(f"run 1 killed in batch {killed}, committed {committed()}")

    with driver(tmp_path, {**base, "run": 2, "options": options}) as run2:
        wait_until("run 2", lambda: run2.check_alive() and (control / "started-2").exists(), 240)
        catalog.append("b", 9)
        catalog.add("d", 6)
        wait_until(
            "run 2's batches", lambda: run2.check_alive() and committed()[-1] >= killed + 2, 240
        )
        (control / "stop").touch()
        if run2.process.wait(timeout=300) != 0:
            run2.check_alive()  # raises, with the driver's log
    assert killed in committed()  # replayed and committed by run 2

    rows = sorted(
        (split, position)
        for split, position in json.loads((tmp_path / "result.json").read_text())["rows"]
    )
    assert_exactly_once(rows, catalog.records())
    state = check_event_log(checkpoint, catalog, state_dir)
    killed_batch = [r for r in state.reports if r[5] == killed]
    assert killed_batch, f"no report of the batch in flight at the kill ({killed})"
    retried = reports_of(state, 1, 0)
    assert retried, "no report of batch 1, task 0"
    assert {r[7] for r in retried} == {1}, retried  # the retry's events, once


@pytest.mark.slow
def test_reader_events_once_per_committed_batch_across_a_driver_kill_local_mode(
    tmp_path: Path,
) -> None:
    kill_and_restart(tmp_path, "local[2,3]")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_reader_events_once_per_committed_batch_across_a_driver_kill_on_a_cluster(
    tmp_path: Path,
) -> None:
    with standalone_cluster(workers=2, cores=1, memory="1g", root=tmp_path / "cluster") as cluster:
        kill_and_restart(tmp_path, cluster.master_url)
    assert cluster.leftovers() == []


# -- found on the way: enumerator events sent while the planner started were lost -------------


@dataclass(frozen=True)
class Hello(SourceEvent):
    """Enumerator -> reader: sent to each reader when it registers (``add_reader``)."""

    reader: int


class HelloEnumerator(SequenceEnumerator):
    def add_reader(self, reader_id: int) -> None:
        super().add_reader(reader_id)
        self.context.send_event_to_source_reader(reader_id, Hello(reader_id))


class HelloSource(SequenceSource):
    def create_enumerator(self, context: Any) -> Any:
        return HelloEnumerator(self, context, None)

    def restore_enumerator(self, context: Any, state: Any) -> Any:
        return HelloEnumerator(self, context, state)


def delivered(offsets: list[dict[str, Any]], source: HelloSource) -> list[SourceEvent]:
    """The events each offset carries to slots that have a task in its batch."""
    events = []
    for data in offsets:
        offset = BatchOffset.decode(json.loads(json.dumps(data)), source)
        events += [e for s, es in offset.to_readers.items() if offset.has_tasks(s) for e in es]
    return events


def test_events_the_enumerator_sends_when_a_reader_registers_reach_its_tasks() -> None:
    """Events sent from ``add_reader`` (fresh start and restore) travel to the slot's tasks.

    ``Planner._start`` used to empty its outbox after the slots registered, dropping them.
    """
    source = HelloSource(SequenceCatalog({"a": 100, "b": 100}))
    planner: Planner[Any, Any] = Planner(source, 2, clock=lambda: 0.0)
    start = planner.initial_offset()
    end1 = planner.latest_offset(start, MaxRecords(10))
    restarted: Planner[Any, Any] = Planner(source, 2, clock=lambda: 0.0)
    end2 = restarted.latest_offset(json.loads(json.dumps(end1)), MaxRecords(10))
    # fresh start: each slot says hello once; the restore registers the slots again
    assert sorted(e.reader for e in delivered([end1], source)) == [0, 1]
    assert sorted(e.reader for e in delivered([end2], source)) == [0, 1]


if __name__ == "__main__":
    run_driver(json.loads(Path(sys.argv[1]).read_text()))
