"""Any splitflow Source as a PySpark Python data source, streaming and batch.

A connector exposes its Source by subclassing :class:`SplitflowDataSource` (a
``pyspark.sql.datasource.DataSource``): ``name()``, ``schema()`` and ``create_source()``.
Then ``splitflow.spark.register(spark, MySource)`` (``spark.dataSource.register`` works too,
but the Python processes Spark starts for it start cold: :mod:`splitflow.spark.warmstart`)
and ``spark.readStream.format(name)`` or ``spark.read.format(name)``.

Who runs what (see ``docs/spark.md``):

* ``DataSource.__init__`` runs at ``load()``: options are validated there, so a bad option
  fails before any query starts, with an error that names it.
* The stream reader in the driver-side streaming runner process owns a :class:`Planner`
  (created lazily, closed on ``stop()`` and on SIGTERM); it answers ``initialOffset``,
  ``latestOffset``, ``partitions`` and ``commit``.
* ``read(partition)`` runs in executor Python workers on a pickled copy of the reader: it
  creates the source's reader, gives it the partition's slices and yields its records.
"""

from __future__ import annotations

import logging
import signal
import threading
from abc import abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.streaming.datasource import ReadLimit as SparkReadLimit
from pyspark.sql.types import StructType

from splitflow.api.events import SourceEvent, SplitEventTimesEvent, SplitsFinishedEvent
from splitflow.api.options import check_names
from splitflow.api.reader import InputStatus
from splitflow.api.source import Source
from splitflow.errors import ConfigurationError, ConnectorError
from splitflow.reader.output import Collector, RecordingReaderContext
from splitflow.spark.events import EventStore, decode_events, encode_events
from splitflow.spark.eventtime import EventTimeCollector, EventTimeSettings
from splitflow.spark.limits import ReadAll, ReadLimit
from splitflow.spark.offset import BatchOffset, at, encode_tasks
from splitflow.spark.options import NAMES, PREFIXES, RuntimeOptions
from splitflow.spark.planner import Planner, collect_garbage_less_often
from splitflow.spark.snapshots import from_json, to_json

log = logging.getLogger("splitflow.spark")

AnySource = Source[Any, Any, Any]


class SplitflowDataSource(DataSource):
    """Base of every splitflow data source. Subclass and implement the three methods.

    ``self.options`` holds the Spark options (keys lower-cased); :attr:`runtime` the
    splitflow options every source understands (``parallelism``, batch and task limits).
    ``create_source()`` must validate the connector's own options and raise
    :class:`~splitflow.errors.ConfigurationError` naming the option at fault: it is called
    once at ``load()``, before any query starts.
    """

    @classmethod
    @abstractmethod
    def name(cls) -> str: ...

    @abstractmethod
    def schema(self) -> str | StructType: ...

    @abstractmethod
    def create_source(self) -> AnySource:
        """The Source these options describe. Called on the driver and in executors."""

    def described(self) -> str:
        """What the source was made from besides the options, when the data source reads
        it at ``load()`` (a CDC source's table schemas): a worker that read an earlier
        query with the same options makes the source again when it differs."""
        return ""

    OPTIONS: tuple[str, ...] = ()
    """The connector's own option names, as documented; any other option than these and the
    runtime's (:data:`~splitflow.spark.options.NAMES`) is refused at ``load()``, naming the
    nearest known one."""
    OPTION_PREFIXES: tuple[str, ...] = ()
    """Prefixes of options passed through to a client that checks them (``kafka.``)."""
    DEFAULT_MAX_BYTES_PER_BATCH: int | None = None
    """The connector's default for ``maxBytesPerBatch`` when no option sizes batches
    (:meth:`~splitflow.spark.options.RuntimeOptions.with_default_max_bytes`); only for a
    source that estimates sizes. ``None``: batches are unbounded unless the user bounds
    them."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        prefixes = (*self.OPTION_PREFIXES, *PREFIXES)
        check_names(self.options, (*NAMES, *self.OPTIONS), self.name(), prefixes)
        self.runtime = RuntimeOptions.parse(self.options)
        store = self.runtime.state_store
        if store is not None:
            store.check()  # an object store's bucket or container exists and answers
        source = self.create_source()
        for option, value in (
            ("maxBytesPerBatch", self.runtime.max_bytes_per_batch),
            ("backlogMaxBytesPerBatch", self.runtime.backlog_max_bytes_per_batch),
        ):
            if value is not None and not source.estimates_size:
                raise ConfigurationError(
                    f"option {option}: {self.name()} cannot estimate the size of its "
                    "records; use the records options",
                    option=option,
                )
        if source.estimates_size:
            self.runtime = self.runtime.with_default_max_bytes(self.DEFAULT_MAX_BYTES_PER_BATCH)
        self.event_time = self._event_time(source)

    def _event_time(self, source: AnySource) -> EventTimeSettings | None:
        """The event-time settings from the options and the source's own column."""
        runtime = self.runtime
        column = runtime.event_time_column or source.event_time_column
        if column is None:
            if runtime.max_event_time_drift is not None:
                raise ConfigurationError(
                    f"option maxEventTimeDrift: {self.name()} has no event-time column; name "
                    "one with option eventTimeColumn",
                    option="maxEventTimeDrift",
                )
            return None
        drift = runtime.max_event_time_drift
        return EventTimeSettings(
            column,
            None if drift is None else round(drift * 1_000_000),
            runtime.split_idle_timeout,
            indexed=column == source.event_time_column,
        )

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        if self.event_time is not None:
            _check_event_time_column(self.event_time.column, schema)
        return SplitflowStreamReader(self)

    def reader(self, schema: Any) -> DataSourceReader:
        return SplitflowBatchReader(self)


@dataclass
class SlicePartition(InputPartition):
    """Task ``index`` of batch ``seq``: slot ``slot`` reads the slices ``slices`` holds, as
    JSON (:meth:`entries`; one string pickles at C speed whatever the split count).

    ``events`` are the enumerator's events for the slot's reader (encoded).
    """

    index: int
    slot: int
    seq: int
    split_codec: int
    slices: bytes
    events: list[str]

    def __init__(
        self,
        index: int,
        slot: int,
        seq: int,
        split_codec: int,
        slices: bytes,
        events: list[str],
    ) -> None:
        super().__init__(index)
        self.index, self.slot, self.seq = index, slot, seq
        self.split_codec, self.slices, self.events = split_codec, slices, events

    def entries(self) -> list[list[Any]]:
        """Each slice as an offset entry: ``[split id, encoded split, start, stop, seq]``,
        and a last ``1`` for a slice that ends its split
        (:func:`~splitflow.spark.offset.slice_entry`); the task reads each split from
        ``start`` to ``stop`` (the split may be encoded at another position)."""
        return cast(list[list[Any]], from_json(self.slices))


def _check_event_time_column(column: str, schema: Any) -> None:
    """The event-time column is a timestamp or date column of the query's schema."""
    from pyspark.sql.types import DateType, StructType, TimestampNTZType, TimestampType

    if not isinstance(schema, StructType):
        return
    fields = {f.name: f for f in schema.fields}
    if column not in fields:
        raise ConfigurationError(
            f"option eventTimeColumn: no column {column!r} (columns: {', '.join(fields)})",
            option="eventTimeColumn",
        )
    if not isinstance(fields[column].dataType, TimestampType | TimestampNTZType | DateType):
        raise ConfigurationError(
            f"option eventTimeColumn: column {column!r} is "
            f"{fields[column].dataType.simpleString()}, not a timestamp or a date",
            option="eventTimeColumn",
        )


def _partitions(
    source: AnySource,
    end: BatchOffset[Any, Any],
    runtime: RuntimeOptions,
    pinned: SourceEvent | None = None,
) -> list[SlicePartition]:
    """The batch's tasks. A slot's events from the enumerator go to its first task only (a
    slot cut into several tasks by ``maxRecordsPerTask`` still gets each event once);
    the batch's pin (:meth:`Planner.pin`) goes to every task, first."""
    codec = source.split_codec
    partitions = []
    served: set[int] = set()
    first = [] if pinned is None else [pinned]
    tasks = encode_tasks(end, codec, runtime.max_records_per_task)
    for index, (slot, entries) in enumerate(tasks):
        events = () if slot in served else end.to_readers.get(slot, ())
        served.add(slot)
        partitions.append(
            SlicePartition(
                index,
                slot,
                end.seq,
                codec.version,
                to_json(entries),
                encode_events([*first, *events]),
            )
        )
    return partitions


_SOURCES: dict[tuple[type, tuple[tuple[str, str], ...], str], AnySource] = {}
_SOURCES_LOCK = threading.Lock()


def _cached_source(data_source: SplitflowDataSource) -> AnySource:
    """One Source per options and :meth:`~SplitflowDataSource.described` in a Python worker
    (workers are reused across tasks and queries)."""
    options = tuple(sorted(data_source.options.items()))
    key = (type(data_source), options, data_source.described())
    with _SOURCES_LOCK:
        if key not in _SOURCES:
            _SOURCES[key] = data_source.create_source()
        return _SOURCES[key]


def read_partition(data_source: SplitflowDataSource, partition: SlicePartition) -> Iterator[Any]:
    """Read one task's slices with the source's own reader; yield its records."""
    source = _cached_source(data_source)
    codec = source.split_codec
    version = partition.split_codec
    entries = partition.entries()
    splits = [at(codec.decode(entry[1], version), entry[2]) for entry in entries]
    stops = {split.split_id: entry[3] for split, entry in zip(splits, entries, strict=True)}
    context = RecordingReaderContext(partition.slot)  # events go to the state dir
    reader = source.create_reader(context)
    reader.start()
    settings = data_source.event_time
    out: Collector[Any] = (
        EventTimeCollector(settings.column)
        if settings is not None and data_source.runtime.state_dir is not None
        else Collector()
    )
    idle_timeout = data_source.runtime.reader_idle_timeout
    try:
        where = f"events to slot {partition.slot} in batch {partition.seq}, task {partition.index}"
        for event in decode_events(partition.events, where):
            reader.handle_source_event(event)
        reader.add_splits(splits, stop_at=stops)
        reader.notify_no_more_splits()
        while True:
            status = reader.poll_next(out)
            if out:
                yield from out
                out.clear()
            if status is InputStatus.END_OF_INPUT:
                break
            if status is InputStatus.NOTHING_AVAILABLE and not reader.wait_available(idle_timeout):
                unfinished = {s.split_id: s.position for s in reader.snapshot_state(-1)}
                raise ConnectorError(
                    f"batch {partition.seq}, slot {partition.slot}: nothing arrived for "
                    f"{idle_timeout:g}s (option readerIdleTimeout) before the planned stops; "
                    f"splits at {unfinished}, planned stops {stops}"
                )
    finally:
        reader.close()
    if isinstance(out, EventTimeCollector) and out.event_times:
        context.events.append(SplitEventTimesEvent.of(out.event_times))
    _record_events(data_source, partition, context.events)


def _record_events(
    data_source: SplitflowDataSource, partition: SlicePartition, events: list[SourceEvent]
) -> None:
    """Leave the reader's events for the enumerator (applied once the batch completed)."""
    store = data_source.runtime.state_store
    if store is not None:
        EventStore(store).write(partition.seq, partition.index, partition.slot, events)
    elif any(not isinstance(e, SplitsFinishedEvent) for e in events):
        log.warning(
            "splitflow: %d reader event(s) of batch %d dropped: set option stateDir to "
            "deliver reader events to the enumerator",
            len(events),
            partition.seq,
        )


class SplitflowStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Spark's streaming reader for a splitflow source (see the module doc)."""

    def __init__(self, data_source: SplitflowDataSource) -> None:
        self._ds = data_source
        self._planner: Planner[Any, Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"_ds": self._ds, "_planner": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    # -- driver side (the streaming runner process) -------------------------------------------

    def _driver(self) -> Planner[Any, Any]:
        if self._planner is None:
            collect_garbage_less_often()
            runtime = self._ds.runtime
            self._planner = Planner(
                self._ds.create_source(),
                runtime.parallelism,
                state_dir=runtime.state_store,
                backlog_lag_threshold=runtime.backlog_lag_threshold,
                event_time=self._ds.event_time,
                retain_batches=runtime.state_retain_batches,
            )
            self._close_on_sigterm()
        return self._planner

    def _close_on_sigterm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGTERM)

        def on_sigterm(signum: int, frame: Any) -> None:
            self.stop()
            if callable(previous):
                previous(signum, frame)
            else:
                raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, on_sigterm)

    def initialOffset(self) -> dict[str, Any]:
        return self._driver().initial_offset()

    def latestOffset(self, start: dict[str, Any], limit: SparkReadLimit) -> dict[str, Any]:
        return self._driver().latest_offset(start, self._limit(limit))

    def getDefaultReadLimit(self) -> SparkReadLimit:
        runtime = self._ds.runtime
        if runtime.min_records_per_batch is not None:
            return ReadMinRows(runtime.min_records_per_batch)
        if runtime.max_bytes_per_batch is not None:
            return ReadMaxBytes(runtime.max_bytes_per_batch)
        if runtime.max_records_per_batch is not None:
            return ReadMaxRows(runtime.max_records_per_batch)
        if runtime.backlog_max_bytes_per_batch is not None:
            return ReadMaxBytes(runtime.backlog_max_bytes_per_batch)
        if runtime.backlog_max_records_per_batch is not None:
            return ReadMaxRows(runtime.backlog_max_records_per_batch)
        return ReadAllAvailable()

    def _limit(self, limit: SparkReadLimit) -> ReadLimit:
        """ReadAllAvailable (``trigger(once=True)``) reads everything; any other limit is
        the default one, which the planner applies from the options (by backlog state)."""
        if isinstance(limit, ReadAllAvailable):
            return ReadAll()
        return self._ds.runtime.read_limit()

    def prepareForTriggerAvailableNow(self) -> None:
        self._driver().prepare_available_now()

    def reportLatestOffset(self) -> dict[str, Any] | None:
        if self._planner is None:
            return None
        return self._planner.lag()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[SlicePartition]:
        """Spark calls this for every evaluation of the batch (each action on its DataFrame
        plans it again) and, after a restart, for the batch it replays without planning it:
        both go through the planner, which pins what the batch reads until it completes."""
        planner = self._driver()
        batch = planner.planned(end)
        return _partitions(planner.source, batch, self._ds.runtime, planner.pin(batch))

    def commit(self, end: dict[str, Any]) -> None:
        if self._planner is not None:
            self._planner.commit(end)

    def stop(self) -> None:
        if self._planner is not None:
            self._planner.close()
            self._planner = None

    # -- executor side --------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, SlicePartition)
        return read_partition(self._ds, partition)


class SplitflowBatchReader(DataSourceReader):
    """A batch read: every split from its start to what is available now, in one job."""

    def __init__(self, data_source: SplitflowDataSource) -> None:
        self._ds = data_source

    def partitions(self) -> list[SlicePartition]:
        source = self._ds.create_source()
        planner: Planner[Any, Any] = Planner(source, self._ds.runtime.parallelism)
        try:
            start = planner.initial_offset()
            end = planner.latest_offset(start, ReadAll())
            return _partitions(source, planner.planned(end), self._ds.runtime)
        finally:
            planner.close()

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if partition.value is None:  # Spark's one task when partitions() gave none
            return iter(())
        assert isinstance(partition, SlicePartition)
        return read_partition(self._ds, partition)


__all__ = [
    "SlicePartition",
    "SplitflowBatchReader",
    "SplitflowDataSource",
    "SplitflowStreamReader",
    "read_partition",
]
