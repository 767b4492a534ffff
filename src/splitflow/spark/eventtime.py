"""Event time on Spark: what a task reports per split, and how the planner aligns splits.

Spark keeps one watermark per query: the largest event time seen, less the delay given to
``withWatermark``. A split that lags behind the others (a backlog, a slow producer) then has
its records dropped as late. splitflow plans how far every split reads in every batch, so it
can keep the splits together (FLIP-182 and FLIP-217):

* each task reports, per split, the latest event time it read (:class:`EventTimeCollector`,
  through the state directory); the planner keeps each split's largest, its *watermark*,
  in every offset;
* a split with nothing to read for ``splitIdleTimeout`` is *idle* and holds nobody back;
* with ``maxEventTimeDrift``, no batch reads records more than the drift past the earliest
  record an active split has left once the batch is read (its floor; see
  :meth:`~splitflow.spark.alignment.Aligner.align`): each split stops there exactly where
  the source tells event times
  (:meth:`~splitflow.api.enumerator.SplitEnumerator.positions_after`), else a split whose
  watermark is too far ahead pauses for the batch.

See ``docs/event-time.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from splitflow.errors import ConnectorError
from splitflow.reader.output import Collector

_MICROS = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": 0}


@dataclass(frozen=True)
class EventTimeSettings:
    """A query's event-time options: the column, and alignment if ``max_drift`` is set.

    ``max_drift`` and ``idle_timeout`` in microseconds and seconds. ``indexed``: the source's
    enumerator answers ``event_times``/``positions_after`` for ``column``.
    """

    column: str
    max_drift: int | None = None
    idle_timeout: float = 60.0
    indexed: bool = False


def micros(value: Any, type_: pa.DataType) -> int:
    """A timestamp or date scalar's raw value as microseconds since the epoch."""
    if pa.types.is_timestamp(type_):
        unit = type_.unit
        return int(value) // 1_000 if unit == "ns" else int(value) * _MICROS[unit]
    if pa.types.is_date32(type_):
        return int(value) * 86_400_000_000
    if pa.types.is_date64(type_):
        return int(value) * 1_000
    raise TypeError(type_)


def iso(event_time: int | None) -> str | None:
    """Microseconds since the epoch as an ISO-8601 UTC time (for progress and views)."""
    if event_time is None:
        return None
    return datetime.fromtimestamp(event_time / 1_000_000, UTC).isoformat(timespec="milliseconds")


class EventTimeCollector(Collector[Any]):
    """A task's output that keeps the latest event time of each split's record batches.

    Readers collect split ``x``'s records into ``for_split(x)`` (a
    :class:`~splitflow.api.reader.SplitOutputs`); every record lands in this list, and
    :attr:`event_times` holds the largest value of ``column`` per split.
    """

    def __init__(self, column: str) -> None:
        super().__init__()
        self.column = column
        self.event_times: dict[str, int] = {}
        self._outputs: dict[str, _SplitCollector] = {}

    def for_split(self, split_id: str) -> _SplitCollector:
        output = self._outputs.get(split_id)
        if output is None:
            output = self._outputs[split_id] = _SplitCollector(self, split_id)
        return output

    def observe(self, split_id: str, record: Any) -> None:
        if not isinstance(record, pa.RecordBatch | pa.Table):
            raise ConnectorError(
                f"option eventTimeColumn: split {split_id} gives {type(record).__name__} "
                "records; event time is read from Arrow record batches only"
            )
        index = record.schema.get_field_index(self.column)
        if index < 0:
            raise ConnectorError(
                f"option eventTimeColumn: split {split_id}'s records have no column "
                f"{self.column!r} (columns: {', '.join(record.schema.names)})"
            )
        column = record.column(index)
        type_ = column.type
        if not (pa.types.is_timestamp(type_) or pa.types.is_date(type_)):
            raise ConnectorError(
                f"option eventTimeColumn: column {self.column!r} of split {split_id} is "
                f"{type_}, not a timestamp or a date"
            )
        if len(column) == 0:
            return
        # Imported here: Spark's streaming source runner imports this module at the start of
        # every query and never observes a record (pyarrow.compute takes 40 ms to import).
        import pyarrow.compute as pc

        latest = pc.max(column)
        if not latest.is_valid:
            return  # only nulls (a Kafka record without a timestamp)
        value = micros(latest.value, type_)
        if value > self.event_times.get(split_id, -(2**63)):
            self.event_times[split_id] = value


class _SplitCollector:
    __slots__ = ("_owner", "_split_id")

    def __init__(self, owner: EventTimeCollector, split_id: str) -> None:
        self._owner, self._split_id = owner, split_id

    def collect(self, record: Any) -> None:
        self._owner.observe(self._split_id, record)
        self._owner.append(record)
