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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import astuple, dataclass, replace
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from tests.spark.lagging import LaggingDataSource

from splitflow.api.assigner import AssignerState, AssignerStateCodec
from splitflow.api.enumerator import SplitEnumeratorContext
from splitflow.api.events import SourceEvent
from splitflow.api.options import parse_duration
from splitflow.api.reader import InputStatus, SourceReaderContext
from splitflow.api.split import Codec, LedgerCodec, SplitState
from splitflow.errors import ConfigurationError
from splitflow.reader import PositionedEmitter, SourceReaderBase
from splitflow.spark.datasource import SlicePartition, SplitflowStreamReader, read_partition
from splitflow.spark.generator import GeneratorDataSource
from splitflow.spark.sequence import SequenceDataSource
from splitflow.testing.sequence import (
    SequenceEnumerator,
    SequenceRecord,
    SequenceSource,
    SequenceSplit,
)
from splitflow.testing.sequence_reader import SequenceSplitReader


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

    OPTIONS = (*SequenceDataSource.OPTIONS, "readDelay", "crashBatch", "crashPartition", "taskLog")

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
    """How many records the partition's slices hold (``stop - start`` summed)."""
    return sum(max(0, int(e[3]) - int(e[2])) for e in partition.entries())


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
        "slices": [[e[1], int(e[2]), int(e[3])] for e in partition.entries()],
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


class OwnDaemonGeneratorDataSource(GeneratorDataSource):
    """``splitflow-generator`` under a name of its own, for a test that registers it with
    an environment of its own: Spark keeps a Python worker daemon per environment, so its
    tasks get a daemon started then, not the one earlier tests' tasks started."""

    @classmethod
    def name(cls) -> str:
        return "splitflow-generator-own-daemon"


TEST_SOURCES = (FaultySequenceDataSource, LaggingDataSource)


# -- splitflow-sequence-events: reader events end to end ----------------------------------------
#
# ``splitflow-sequence-events`` is ``splitflow-sequence-faulty`` (same options, same rows) whose
# readers report what they read and whose enumerator keeps every report in its state, so a
# test can read from the checkpoint's offsets exactly which events reached the enumerator:
#
# * reader -> enumerator: per split per task a :class:`ReadReport` ("read ``records`` records
#   of split X from ``start`` up to ``stop``", with the task's batch, partition and attempt);
# * enumerator -> reader: the enumerator answers each report with a :class:`ReportAck` (the
#   report's number) to the sending slot; the slot's tasks of a later batch receive it with
#   their partition and send it back in an :class:`AcksReceived`, which the enumerator keeps.
#
# Extra options: ``crashAfterEventsBatch`` / ``crashAfterEventsPartition`` (default 0): the
# first attempt of that task fails AFTER it has read its whole slice and its events were
# written to ``stateDir``; ``holdAfterEvents`` (a duration): every task waits this long after
# its events were written before it ends (a window to kill the driver in).


@dataclass(frozen=True)
class ReadReport(SourceEvent):
    """Reader -> enumerator: a task read ``records`` records of ``split`` in [start, stop)."""

    split: str
    start: int
    stop: int
    records: int
    batch: int | None
    partition: int | None
    attempt: int | None


@dataclass(frozen=True)
class ReportAck(SourceEvent):
    """Enumerator -> reader: report number ``number`` (its index in the log) arrived."""

    number: int


@dataclass(frozen=True)
class AcksReceived(SourceEvent):
    """Reader -> enumerator: the acks a task received with its partition."""

    numbers: tuple[int, ...]
    batch: int | None
    partition: int | None


@dataclass(frozen=True)
class EventLogState:
    """The enumerator's state: assignment, and every report and returned ack it received.

    ``reports``: ``(slot, split, start, stop, records, batch, partition, attempt)`` in order of
    arrival (a report's number is its index); ``echoes``: ``(slot, ack number, batch,
    partition)``.
    """

    assigner: AssignerState[SequenceSplit]
    reports: tuple[tuple[Any, ...], ...] = ()
    echoes: tuple[tuple[Any, ...], ...] = ()


class EventLogStateCodec(LedgerCodec[EventLogState]):
    """JSON for :class:`EventLogState`; its ledger is the assigner's (finished split ids)."""

    version = 1

    def __init__(self, split_codec: Codec[SequenceSplit]) -> None:
        self._assigner = AssignerStateCodec(split_codec)

    def encode(self, value: EventLogState) -> dict[str, Any]:
        return {
            "assigner": self._assigner.encode(value.assigner),
            "reports": [list(r) for r in value.reports],
            "echoes": [list(e) for e in value.echoes],
        }

    def decode(self, data: Mapping[str, Any], version: int) -> EventLogState:
        return EventLogState(
            self._assigner.decode(data["assigner"], self._assigner.version),
            tuple(tuple(r) for r in data["reports"]),
            tuple(tuple(e) for e in data["echoes"]),
        )

    def split_ledger(self, value: EventLogState) -> tuple[EventLogState, frozenset[str]]:
        stripped, ledger = self._assigner.split_ledger(value.assigner)
        return replace(value, assigner=stripped), ledger

    def join_ledger(self, value: EventLogState, ledger: frozenset[str]) -> EventLogState:
        return replace(value, assigner=self._assigner.join_ledger(value.assigner, ledger))


class EventLogEnumerator(SequenceEnumerator):
    """The sequence enumerator that logs reports and returned acks, and acks each report."""

    def __init__(
        self,
        source: SequenceSource,
        context: SplitEnumeratorContext[SequenceSplit],
        state: EventLogState | None,
    ) -> None:
        super().__init__(source, context, state.assigner if state else None)
        self._reports = list(state.reports) if state else []
        self._echoes = list(state.echoes) if state else []

    def handle_source_event(self, reader_id: int, event: SourceEvent) -> None:
        if isinstance(event, ReadReport):
            number = len(self._reports)
            self._reports.append((reader_id, *astuple(event)))
            self.context.send_event_to_source_reader(reader_id, ReportAck(number))
        elif isinstance(event, AcksReceived):
            self._echoes.extend((reader_id, n, event.batch, event.partition) for n in event.numbers)
        else:
            super().handle_source_event(reader_id, event)

    def snapshot_state(self, checkpoint_id: int) -> EventLogState:  # type: ignore[override]
        return EventLogState(
            super().snapshot_state(checkpoint_id), tuple(self._reports), tuple(self._echoes)
        )


class _CountingOutput:
    """Passes records on; counts them per split and checks they come in position order."""

    def __init__(self, output: Any, counts: dict[str, int], nexts: dict[str, int]) -> None:
        self._output, self._counts, self._nexts = output, counts, nexts

    def collect(self, record: tuple[str, int]) -> None:
        name, position = record
        if self._nexts.get(name, position) != position:
            raise AssertionError(f"split {name}: record {position}, expected {self._nexts[name]}")
        self._nexts[name] = position + 1
        self._counts[name] = self._counts.get(name, 0) + 1
        self._output.collect(record)


class ReportingSequenceReader(SourceReaderBase[Any, Any, SequenceSplit]):
    """The sequence reader that sends a :class:`ReadReport` per finished split slice and an
    :class:`AcksReceived` for the acks it was given (see the section comment)."""

    def __init__(self, source: SequenceSource, context: SourceReaderContext) -> None:
        catalog, fetch_size = source.catalog, source.fetch_size
        super().__init__(
            lambda: SequenceSplitReader(
                catalog, fetch_size, fail_on_data_loss=source.fail_on_data_loss
            ),
            PositionedEmitter[SequenceRecord, SequenceSplit](),
            context,
        )
        task = TaskContext.get()
        batch = None if task is None else task.getLocalProperty("streaming.sql.batchId")
        self._batch = None if batch is None else int(batch)
        self._partition = None if task is None else task.partitionId()
        self._attempt = None if task is None else task.attemptNumber()
        self._starts: dict[str, int] = {}
        self._counts: dict[str, int] = {}
        self._nexts: dict[str, int] = {}
        self._acks: list[int] = []

    def add_splits(
        self, splits: Sequence[SequenceSplit], stop_at: Mapping[str, int] | None = None
    ) -> None:
        for split in splits:
            self._starts[split.split_id] = split.position
            self._nexts[split.split_id] = split.position
        super().add_splits(splits, stop_at)

    def notify_no_more_splits(self) -> None:
        if self._acks:
            self.context.send_source_event_to_coordinator(
                AcksReceived(tuple(self._acks), self._batch, self._partition)
            )
        super().notify_no_more_splits()

    def handle_source_event(self, event: SourceEvent) -> None:
        if isinstance(event, ReportAck):
            self._acks.append(event.number)
        super().handle_source_event(event)

    def poll_next(self, output: Any) -> InputStatus:
        return super().poll_next(_CountingOutput(output, self._counts, self._nexts))

    def on_split_finished(
        self, finished: Mapping[str, SplitState[SequenceSplit]], ended: frozenset[str]
    ) -> None:
        for split_id, state in finished.items():
            self.context.send_source_event_to_coordinator(
                ReadReport(
                    split_id,
                    self._starts[split_id],
                    state.position,
                    self._counts.get(split_id, 0),
                    self._batch,
                    self._partition,
                    self._attempt,
                )
            )


class EventLogSequenceSource(SequenceSource):
    """:class:`SequenceSource` with the event-logging enumerator and the reporting reader."""

    @classmethod
    def like(cls, source: SequenceSource) -> EventLogSequenceSource:
        return cls(
            source.catalog,
            bounded=source.bounded,
            discovery_interval=source.discovery_interval,
            strategy=source.strategy,
            fetch_size=source.fetch_size,
            fail_on_data_loss=source.fail_on_data_loss,
        )

    def create_enumerator(self, context: SplitEnumeratorContext[SequenceSplit]) -> Any:
        return EventLogEnumerator(self, context, None)

    def restore_enumerator(self, context: SplitEnumeratorContext[SequenceSplit], state: Any) -> Any:
        return EventLogEnumerator(self, context, state)

    def create_reader(self, context: SourceReaderContext) -> Any:
        return ReportingSequenceReader(self, context)

    @property
    def enumerator_state_codec(self) -> Any:
        return EventLogStateCodec(self.split_codec)


class EventsSequenceDataSource(FaultySequenceDataSource):
    """``splitflow-sequence-events``: see the section comment above."""

    OPTIONS = (
        *FaultySequenceDataSource.OPTIONS,
        "crashAfterEventsBatch",
        "crashAfterEventsPartition",
        "holdAfterEvents",
    )

    @classmethod
    def name(cls) -> str:
        return "splitflow-sequence-events"

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.crash_after_events_batch = _whole(self.options, "crashAfterEventsBatch")
        self.crash_after_events_partition = _whole(self.options, "crashAfterEventsPartition") or 0
        hold = self.options.get("holdafterevents")
        self.hold_after_events = 0.0 if hold is None else parse_duration("holdAfterEvents", hold)

    def create_source(self) -> EventLogSequenceSource:
        return EventLogSequenceSource.like(super().create_source())

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return EventsStreamReader(self)


class EventsStreamReader(SplitflowStreamReader):
    """Reads like ``splitflow-sequence-faulty``, then may hold or crash after the events."""

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, SlicePartition)
        assert isinstance(self._ds, EventsSequenceDataSource)
        return _read_then_crash(self._ds, partition)


def _read_then_crash(ds: EventsSequenceDataSource, partition: SlicePartition) -> Iterator[Any]:
    yield from _faulty_read(ds, partition)  # the events are in stateDir once this returns
    context = TaskContext.get()
    assert context is not None, "read() runs in a Spark task"
    batch_text = context.getLocalProperty("streaming.sql.batchId")
    batch = None if batch_text is None else int(batch_text)
    if ds.hold_after_events:
        time.sleep(ds.hold_after_events)
    if (
        batch is not None
        and batch == ds.crash_after_events_batch
        and context.partitionId() == ds.crash_after_events_partition
        and context.attemptNumber() == 0
    ):
        _log(
            ds,
            {
                "batch": batch,
                "partition": context.partitionId(),
                "attempt": 0,
                "outcome": "crashed-after-events",
                "rows": planned_records(partition),
            },
        )
        raise InjectedCrash(
            f"injected crash after the events were written: batch {batch}, "
            f"partition {context.partitionId()}, attempt 0"
        )


EVENT_SOURCES = (EventsSequenceDataSource,)
