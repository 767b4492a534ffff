"""The Spark options every splitflow source understands, validated before a query starts.

============================  =========  =====================================================
option                        default    meaning
============================  =========  =====================================================
``parallelism``               2          reader slots; splits are balanced over them
``maxRecordsPerBatch``        (none)     at most this many records per micro-batch, shared
                                         over splits by backlog (a small split is never
                                         starved)
``maxBytesPerBatch``          (none)     about this many bytes per micro-batch (``64m``,
                                         ``1g``), for sources that estimate record sizes;
                                         with maxRecordsPerBatch, both apply. A source may
                                         default it when no option here sizes batches (the
                                         CDC source: ``64m`` of WAL)
``backlogMaxRecordsPerBatch`` (none)     while the source processes backlog (catching up):
                                         at most this many records per batch instead of
                                         maxRecordsPerBatch (size it for throughput)
``backlogMaxBytesPerBatch``   (none)     the same for maxBytesPerBatch
``backlogLagThreshold``       (none)     outside backlog, falling more than this many
                                         records behind (all splits) enters backlog again
``minRecordsPerBatch``        (none)     wait for this many records before a batch ...
``maxBatchDelay``             15m        ... unless this long passed since the last batch
``maxRecordsPerTask``         (none)     cut a slot's slices into tasks of at most this many
                                         records (skew, oversized replays)
``readerIdleTimeout``         60s        a task fails, naming its splits, when nothing
                                         arrives this long before its planned stops
``stateDir``                  (none)     directory for the query's source state: reader
                                         events travel to the enumerator through it (on a
                                         cluster: an object store, ``s3://``, ``abfs://``,
                                         ``gs://``, ``hdfs://``, or a filesystem all nodes
                                         share)
``stateDir.<key>``            (none)     storage option ``key`` of stateDir's fsspec
                                         filesystem (``stateDir.endpoint_url``,
                                         ``stateDir.account_name``, ...); without them
                                         the store's client reads its environment
``stateRetainBatches``        100        the state of the last this many batches stays in
                                         stateDir, so each offset Spark keeps can be
                                         restored (a rollback, a replay); set it to the
                                         session's ``spark.sql.streaming.minBatchesToRetain``
                                         if that is not 100 (the source cannot read it)
``eventTimeColumn``           (source's) the timestamp column that holds event time (the
                                         generator's ``event_time``, Kafka's ``timestamp``,
                                         CDC's ``commit_ts``; files: none); with stateDir,
                                         each split's latest is tracked as its watermark
``maxEventTimeDrift``         (none)     align splits: none reads records more than this
                                         far ahead of the slowest active split (needs
                                         stateDir; see docs/event-time.md)
``splitIdleTimeout``          1m         a split with nothing to read this long is idle: it
                                         holds no other split back until data arrives
============================  =========  =====================================================

Durations take ``ms``, ``s``, ``m`` or ``h`` (``"500ms"``, ``"30s"``, ``"15m"``); a bare number
is seconds. Spark lower-cases option keys; so does this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from splitflow.api.options import parse_bytes, parse_duration, parse_positive_int
from splitflow.errors import ConfigurationError
from splitflow.spark.limits import (
    BacklogAware,
    MaxBytes,
    MaxRecords,
    MinRecords,
    ReadAll,
    ReadLimit,
)
from splitflow.spark.snapshots import RETAIN_BATCHES
from splitflow.spark.statedir import StateStore, absolute, storage_options

NAMES = (
    "parallelism",
    "maxRecordsPerBatch",
    "maxBytesPerBatch",
    "backlogMaxRecordsPerBatch",
    "backlogMaxBytesPerBatch",
    "backlogLagThreshold",
    "minRecordsPerBatch",
    "maxBatchDelay",
    "maxRecordsPerTask",
    "readerIdleTimeout",
    "stateDir",
    "stateRetainBatches",
    "eventTimeColumn",
    "maxEventTimeDrift",
    "splitIdleTimeout",
)
"""The runtime's option names (for sources that refuse unknown options)."""

PREFIXES = ("stateDir.",)
"""The runtime's option prefixes: ``stateDir.<key>`` is a storage option of the state store."""


@dataclass(frozen=True)
class RuntimeOptions:
    parallelism: int = 2
    max_records_per_batch: int | None = None
    max_bytes_per_batch: int | None = None
    backlog_max_records_per_batch: int | None = None
    backlog_max_bytes_per_batch: int | None = None
    backlog_lag_threshold: int | None = None
    min_records_per_batch: int | None = None
    max_batch_delay: float = 900.0
    max_records_per_task: int | None = None
    reader_idle_timeout: float = 60.0
    state_dir: str | None = None
    state_retain_batches: int = RETAIN_BATCHES
    event_time_column: str | None = None
    max_event_time_drift: float | None = None
    split_idle_timeout: float = 60.0
    state_options: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """The ``stateDir.<key>`` storage options (may hold credentials: never shown)."""

    @cached_property
    def state_store(self) -> StateStore | None:
        """Where the query's source state lives (None without ``stateDir``)."""
        if self.state_dir is None:
            return None
        return StateStore(self.state_dir, self.state_options)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> RuntimeOptions:
        """Read the options (keys already lower-cased, as Spark passes them)."""

        def whole(name: str) -> int | None:
            text = options.get(name.lower())
            return None if text is None else parse_positive_int(name, text)

        def size(name: str) -> int | None:
            text = options.get(name.lower())
            return None if text is None else parse_bytes(name, text)

        def duration(name: str, default: float, *, above_zero: bool = False) -> float:
            text = options.get(name.lower())
            return default if text is None else parse_duration(name, text, above_zero=above_zero)

        parsed = cls(
            parallelism=whole("parallelism") or 2,
            max_records_per_batch=whole("maxRecordsPerBatch"),
            max_bytes_per_batch=size("maxBytesPerBatch"),
            backlog_max_records_per_batch=whole("backlogMaxRecordsPerBatch"),
            backlog_max_bytes_per_batch=size("backlogMaxBytesPerBatch"),
            backlog_lag_threshold=whole("backlogLagThreshold"),
            min_records_per_batch=whole("minRecordsPerBatch"),
            max_batch_delay=duration("maxBatchDelay", 900.0),
            max_records_per_task=whole("maxRecordsPerTask"),
            reader_idle_timeout=duration("readerIdleTimeout", 60.0, above_zero=True),
            state_dir=absolute(options["statedir"]) if options.get("statedir") else None,
            state_retain_batches=whole("stateRetainBatches") or RETAIN_BATCHES,
            event_time_column=options.get("eventtimecolumn") or None,
            max_event_time_drift=(
                None
                if options.get("maxeventtimedrift") is None
                else duration("maxEventTimeDrift", 0.0)
            ),
            split_idle_timeout=duration("splitIdleTimeout", 60.0),
            state_options=storage_options(options),
        )
        if parsed.state_options and parsed.state_dir is None:
            first = sorted(parsed.state_options)[0]
            raise ConfigurationError(
                f"option stateDir.{first} is given without option stateDir",
                option=f"stateDir.{first}",
            )
        if "stateretainbatches" in options and parsed.state_dir is None:
            raise ConfigurationError(
                "option stateRetainBatches needs option stateDir: it says how long the "
                "state there is kept",
                option="stateRetainBatches",
            )
        if parsed.max_event_time_drift is not None and parsed.state_dir is None:
            raise ConfigurationError(
                "option maxEventTimeDrift needs option stateDir: the readers report each "
                "split's event time to the planner through it",
                option="maxEventTimeDrift",
            )
        threshold, minimum = parsed.backlog_lag_threshold, parsed.min_records_per_batch
        if threshold is not None and minimum is not None and threshold <= minimum:
            raise ConfigurationError(
                f"option backlogLagThreshold ({threshold}) must be above minRecordsPerBatch "
                f"({minimum}): every wait for the minimum would enter "
                "backlog",
                option="backlogLagThreshold",
            )
        low, high = parsed.min_records_per_batch, parsed.max_records_per_batch
        if low is not None and high is not None and low > high:
            raise ConfigurationError(
                f"option minRecordsPerBatch ({low}) is above maxRecordsPerBatch ({high})",
                option="minRecordsPerBatch",
            )
        return parsed

    @property
    def sizes_batches(self) -> bool:
        """Whether any option that sizes batches was given (the records and bytes limits,
        their backlog forms, ``minRecordsPerBatch``)."""
        return any(
            value is not None
            for value in (
                self.max_records_per_batch,
                self.max_bytes_per_batch,
                self.backlog_max_records_per_batch,
                self.backlog_max_bytes_per_batch,
                self.min_records_per_batch,
            )
        )

    def with_default_max_bytes(self, max_bytes: int | None) -> RuntimeOptions:
        """These options, with ``maxBytesPerBatch`` = ``max_bytes`` when no option sizes
        batches (:attr:`sizes_batches`): a source's own default, which any batch option the
        user gives replaces whole. ``None``: no default.

        >>> RuntimeOptions().with_default_max_bytes(64).read_limit()
        MaxBytes(bytes=64, records=None, option='maxBytesPerBatch')
        >>> RuntimeOptions(max_records_per_batch=10).with_default_max_bytes(64).read_limit()
        MaxRecords(records=10)
        """
        if max_bytes is None or self.sizes_batches:
            return self
        return replace(self, max_bytes_per_batch=max_bytes)

    def read_limit(self) -> ReadLimit:
        """The planner's limit for each batch, from the admission options."""
        cap = _cap(self.max_records_per_batch, self.max_bytes_per_batch)
        live: ReadAll | MaxRecords | MaxBytes | MinRecords = cap
        if self.min_records_per_batch is not None:
            live = MinRecords(self.min_records_per_batch, self.max_batch_delay, cap)
        records, size = self.backlog_max_records_per_batch, self.backlog_max_bytes_per_batch
        if records is None and size is None:
            return live
        return BacklogAware(_cap(records, size, "backlogMaxBytesPerBatch"), live)


def _cap(
    records: int | None, size: int | None, option: str = "maxBytesPerBatch"
) -> ReadAll | MaxRecords | MaxBytes:
    if size is not None:
        return MaxBytes(size, records, option)
    return ReadAll() if records is None else MaxRecords(records)
