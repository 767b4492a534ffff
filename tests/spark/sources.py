"""Test-only Spark data sources: the sequence source with injected faults and a task log.

Executors import this module by name (``tests.spark.sources``): the session of
``tests/spark/conftest.py`` and the job of ``tests/spark/jobs.py`` put the repository root
on ``PYTHONPATH`` before Spark starts.

``splitflow-sequence-faulty`` is ``splitflow-sequence`` (same options, same rows) plus:

==================  ========================================================================
option              meaning
==================  ========================================================================
``readDelay``       every task sleeps this long before it reads (a duration, e.g. ``2s``):
                    a window in which the test can kill the driver while a batch runs
``crashBatch``      the streaming batch id in which one task crashes ...
``crashPartition``  ... the partition (task index) that crashes (default 0). Only the FIRST
                    attempt (``attemptNumber() == 0``) crashes, after yielding about half
                    of its slice, so the retry must re-read the slice without duplicating
                    what the crashed attempt had already handed to Spark
``taskLog``         a folder: every task attempt writes one JSON file when it starts reading
                    (``"outcome": "started"``) and one when it ends (``"ok"`` or
                    ``"crashed"``), with its batch, partition, attempt, slices and row count
==================  ========================================================================
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from splitflow.errors import ConfigurationError
from splitflow.spark.datasource import SlicePartition, SplitflowStreamReader, read_partition
from splitflow.spark.options import parse_duration
from splitflow.spark.sequence import SequenceDataSource


class InjectedCrash(RuntimeError):
    """Raised by the first attempt of the task chosen with ``crashBatch``/``crashPartition``."""


def _whole(options: dict[str, str], name: str) -> int | None:
    text = options.get(name.lower())
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise ConfigurationError(
            f"option {name}: {text!r} is not a whole number", option=name
        ) from None
    if value < 0:
        raise ConfigurationError(f"option {name}: {value} is negative", option=name)
    return value


class FaultySequenceDataSource(SequenceDataSource):
    """``splitflow-sequence`` with a read delay, a crashing task attempt and a task log."""

    @classmethod
    def name(cls) -> str:
        return "splitflow-sequence-faulty"

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        delay = self.options.get("readdelay")
        self.read_delay = 0.0 if delay is None else parse_duration("readDelay", delay)
        self.crash_batch = _whole(self.options, "crashBatch")
        self.crash_partition = _whole(self.options, "crashPartition") or 0
        self.task_log = self.options.get("tasklog")

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return FaultyStreamReader(self)


class FaultyStreamReader(SplitflowStreamReader):
    """The splitflow stream reader whose executor-side ``read()`` injects the faults."""

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, SlicePartition)
        assert isinstance(self._ds, FaultySequenceDataSource)
        return _faulty_read(self._ds, partition)


def planned_records(partition: SlicePartition) -> int:
    """How many records the partition's slices hold (``stop - position`` summed)."""
    return sum(max(0, int(stop) - int(split["position"])) for split, stop in partition.slices)


def _faulty_read(ds: FaultySequenceDataSource, partition: SlicePartition) -> Iterator[Any]:
    context = TaskContext.get()
    assert context is not None, "read() runs in a Spark task"
    batch_text = context.getLocalProperty("streaming.sql.batchId")
    batch = None if batch_text is None else int(batch_text)
    task = {
        "batch": batch,
        "partition": context.partitionId(),
        "attempt": context.attemptNumber(),
        "slot": partition.slot,
        "seq": partition.seq,
        "slices": [[split, int(stop)] for split, stop in partition.slices],
        "planned": planned_records(partition),
        "pid": os.getpid(),
    }
    _log(ds, {**task, "outcome": "started", "rows": 0})
    if ds.read_delay:
        time.sleep(ds.read_delay)
    crash = (
        batch is not None
        and batch == ds.crash_batch
        and task["partition"] == ds.crash_partition
        and task["attempt"] == 0
    )
    crash_after = max(1, task["planned"] // 2)
    rows = 0
    for record in read_partition(ds, partition):
        if crash and rows >= crash_after:
            break
        rows += 1
        yield record
    if crash:
        _log(ds, {**task, "outcome": "crashed", "rows": rows})
        raise InjectedCrash(
            f"injected crash: batch {batch}, partition {task['partition']}, attempt 0, "
            f"after {rows} of {task['planned']} records"
        )
    _log(ds, {**task, "outcome": "ok", "rows": rows})


def _log(ds: FaultySequenceDataSource, entry: dict[str, Any]) -> None:
    if not ds.task_log:
        return
    os.makedirs(ds.task_log, exist_ok=True)
    name = (
        f"b{entry['batch']}-p{entry['partition']}-a{entry['attempt']}-{entry['outcome']}-"
        f"{uuid.uuid4().hex[:8]}"
    )
    tmp = os.path.join(ds.task_log, f".{name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(entry, f)
    os.replace(tmp, os.path.join(ds.task_log, f"{name}.json"))


def read_task_log(folder: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every entry the tasks wrote to ``folder`` (empty if none)."""
    if not os.path.isdir(folder):
        return []
    entries = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".json"):
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                entries.append(json.load(f))
    return entries


TEST_SOURCES = (FaultySequenceDataSource,)
