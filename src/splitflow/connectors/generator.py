"""Generated data as Arrow record batches: deterministic, any number of splits, rates, event time.

In the spirit of Flink's ``DataGeneratorSource`` and ``NumberSequenceSource``. A split is a
numbered sequence of rows; row ``i`` of split ``s`` is::

    split      = s
    id         = i
    value      = (i * 2654435761 + s * 97) % 1000003
    event_time = start + i / rate            (microseconds, rounded down)

where ``start`` and ``rate`` belong to the split (:class:`GeneratorSplit`). A row is a pure
function of its split and index, so any slice can be made again, identically, from its
positions alone: a replay reads the same rows. Rows come as ``pyarrow.RecordBatch`` of up
to ``batch_rows`` rows, the fast path into Spark.

Settings (:class:`GeneratorSource`):

* ``rows_per_second``: rows per second over all splits, or ``None``: as fast as they are
  read. With a rate, row ``i`` of a split exists once its event time has passed, so
  ``latest_positions`` grows with the time elapsed since the source started.
* ``rows``: rows per split (the end), or ``None``: an unbounded stream.
* ``skew``: split ``i`` of ``n`` weighs ``1 + skew * i / (n - 1)``: it has that many times
  ``rows`` rows, and that share of the rate (the last split ``1 + skew`` times the first).
* ``start_time``: the event time of row 0, seconds since the epoch; default: when the
  enumerator is first created. The start is stored in every split, so it is part of every
  checkpoint: a restart does not change which rows exist nor their event times.

Without a rate the event time still advances, by :data:`UNTHROTTLED_EVENT_RATE` rows per
second of event time per split. Without a rate and without an end a split is always
available (:data:`UNBOUNDED`): admission control (Spark's ``maxRecordsPerBatch``) decides
how much a batch reads.

Built only on splitflow's public API.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from splitflow.api.assigner import AssignerState, AssignerStateCodec, AssigningSplitEnumerator
from splitflow.api.enumerator import SplitEnumerator, SplitEnumeratorContext, SplitExtent
from splitflow.api.reader import SourceReader, SourceReaderContext
from splitflow.api.source import Boundedness, Source, SupportsSplitReassignmentOnRecovery
from splitflow.api.split import Codec, DataclassCodec
from splitflow.errors import ConfigurationError
from splitflow.reader import (
    Positioned,
    PositionedEmitter,
    RecordsBySplits,
    SourceReaderBase,
    SplitReader,
    SplitSlice,
)

SCHEMA = pa.schema(
    [
        ("split", pa.int32(), False),
        ("id", pa.int64(), False),
        ("value", pa.int64(), False),
        ("event_time", pa.timestamp("us", tz="UTC"), False),
    ]
)
SPARK_SCHEMA = (
    "split int not null, id bigint not null, value bigint not null, event_time timestamp not null"
)
UNTHROTTLED_EVENT_RATE = 1000.0
"""Rows per second of event time of a split that has no rate (one row per millisecond)."""
UNBOUNDED = 2**62
"""The latest position of a split without a rate and without an end: always available."""


@dataclass(frozen=True)
class GeneratorSplit:
    """Split ``index``: rows ``position .. rows-1`` (``rows=None``: no end).

    ``start_us``: event time of row 0 (microseconds since the epoch). ``rate``: rows per
    second of this split, or ``None`` (as fast as read; event time then advances at
    :data:`UNTHROTTLED_EVENT_RATE`).
    """

    index: int
    rows: int | None
    start_us: int = 0
    rate: float | None = None
    position: int = 0

    @property
    def split_id(self) -> str:
        return f"gen-{self.index:05d}"

    def available(self, now: float) -> int:
        """How many rows exist at ``now`` (seconds since the epoch): the latest position.

        With a rate, row ``i`` exists once its event time is not after ``now``.

        >>> split = GeneratorSplit(0, rows=10, start_us=1_000_000, rate=2.0)
        >>> split.available(0.5), split.available(1.0), split.available(2.9), split.available(99)
        (0, 1, 4, 10)
        """
        end = UNBOUNDED if self.rows is None else self.rows
        if self.rate is None:
            return end
        elapsed_us = math.floor(now * 1_000_000) - self.start_us
        if elapsed_us < 0:
            return 0
        return min(end, math.floor(elapsed_us * self.rate / 1_000_000) + 1)

    def extent(self, now: float) -> SplitExtent:
        latest = self.available(now)
        return SplitExtent(latest, final=self.rows is not None and latest >= self.rows)

    @property
    def step_us(self) -> float:
        """Microseconds of event time between two rows."""
        return 1_000_000 / (UNTHROTTLED_EVENT_RATE if self.rate is None else self.rate)

    def event_time(self, row: int) -> int:
        """The event time of row ``row`` (microseconds; as :func:`make_batch` computes it).

        >>> GeneratorSplit(0, rows=None, start_us=10, rate=3.0).event_time(2)
        666676
        """
        step = self.step_us
        return self.start_us + (row * int(step) if step.is_integer() else math.floor(row * step))

    def first_after(self, event_time: int) -> int:
        """The first row whose event time is after ``event_time`` (from :attr:`position`).

        >>> split = GeneratorSplit(0, rows=None, start_us=0, rate=3.0)
        >>> split.first_after(333_333), split.first_after(333_332), split.first_after(-1)
        (2, 1, 0)
        """
        row = max(self.position, math.floor((event_time - self.start_us) / self.step_us))
        while row > self.position and self.event_time(row - 1) > event_time:
            row -= 1
        while self.event_time(row) <= event_time:
            row += 1
        return row

    def batch(self, start: int, stop: int) -> pa.RecordBatch:
        """Rows ``start .. stop-1`` of this split."""
        return make_batch(self.index, start, stop, start_us=self.start_us, rate=self.rate)


def make_batch(
    index: int, start: int, stop: int, *, start_us: int = 0, rate: float | None = None
) -> pa.RecordBatch:
    """Rows ``start .. stop-1`` of split ``index`` (the row function; see the module doc).

    >>> batch = make_batch(2, 0, 3, start_us=0, rate=2.0)
    >>> batch.column("id").to_pylist(), [t.value for t in batch.column("event_time")]
    ([0, 1, 2], [0, 500000, 1000000])
    """
    ids = np.arange(start, stop, dtype=np.int64)
    values = (ids * 2654435761 + index * 97) % 1000003
    step = GeneratorSplit(index, None, start_us, rate).step_us
    if step.is_integer():  # the default: exact integer arithmetic, and faster
        times = start_us + ids * int(step)
    else:
        times = start_us + np.floor(ids * step).astype(np.int64)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.full(stop - start, index, dtype=np.int32)),  # pa.repeat is 100x slower
            pa.array(ids),
            pa.array(values),
            pa.array(times, pa.timestamp("us", tz="UTC")),
        ],
        schema=SCHEMA,
    )


class GeneratorEnumerator(AssigningSplitEnumerator[GeneratorSplit]):
    """Discovers the source's splits once; their extents follow the clock.

    The start time is fixed when the enumerator is first created and stored in each split:
    a restored enumerator's splits come back from the checkpoint (its own state and the
    readers' reports) with their original start, and discovery never replaces a known split.
    """

    def __init__(
        self,
        source: GeneratorSource,
        context: SplitEnumeratorContext[GeneratorSplit],
        state: AssignerState[GeneratorSplit] | None,
    ) -> None:
        super().__init__(context, state=state)
        self._source = source
        self._start_us = source.start_us(source.clock())

    def discover_splits(self) -> Sequence[GeneratorSplit]:
        return self._source.splits(self._start_us)

    def latest_positions(self, splits: Sequence[GeneratorSplit]) -> dict[str, SplitExtent]:
        now = self._source.clock()
        return {s.split_id: s.extent(now) for s in splits}

    def event_times(self, splits: Sequence[GeneratorSplit]) -> dict[str, int]:
        now = self._source.clock()
        return {
            s.split_id: s.event_time(s.position) for s in splits if s.available(now) > s.position
        }

    def positions_after(self, splits: Sequence[GeneratorSplit], event_time: int) -> dict[str, int]:
        now = self._source.clock()
        return {s.split_id: min(s.first_after(event_time), s.available(now)) for s in splits}


class _GeneratorSplitReader(SplitReader[Positioned[pa.RecordBatch], GeneratorSplit]):
    """Makes one record batch per fetch, taking splits in turn; never past what exists.

    A planned slice (a stop) is read to its stop without looking at the clock: the driver
    planned it from rows that existed then, and a task whose clock is behind the driver's
    (another host, a clock stepped back) must read the same rows, not wait for them.
    """

    def __init__(self, batch_rows: int, clock: Callable[[], float]) -> None:
        self._batch_rows = batch_rows
        self._clock = clock
        self._pieces: dict[str, tuple[GeneratorSplit, int, int | None]] = {}  # split, pos, stop

    def handle_splits_changes(self, added: Sequence[SplitSlice[GeneratorSplit]]) -> None:
        for piece in added:
            self._pieces[piece.split_id] = (piece.split, piece.start, piece.stop)

    def remove_splits(self, split_ids: Sequence[str]) -> None:
        for split_id in split_ids:
            self._pieces.pop(split_id, None)

    def fetch(self) -> RecordsBySplits[Positioned[pa.RecordBatch]]:
        batch: RecordsBySplits[Positioned[pa.RecordBatch]] = RecordsBySplits()
        now = self._clock()
        for _ in range(len(self._pieces)):
            split_id = next(iter(self._pieces))
            split, position, stop = self._pieces.pop(split_id)
            limit = split.available(now) if stop is None else stop
            end = min(limit, position + self._batch_rows)
            if end > position:
                batch.add(split_id, Positioned(split.batch(position, end), end))
            if split.rows is not None and end >= split.rows:
                batch.mark_ended(split_id)
            elif stop is not None and end >= stop:
                batch.mark_finished(split_id)
            else:
                self._pieces[split_id] = (split, end, stop)  # back of the line
            if not batch.is_empty():
                break  # one batch per fetch; a split with nothing yet lets the next one go
        return batch

    def wake_up(self) -> None:
        """Nothing to do: ``fetch`` never blocks."""

    def close(self) -> None:
        self._pieces.clear()


def split_weights(splits: int, skew: float) -> list[float]:
    """Weight of each split: ``1 + skew * i / (splits - 1)``.

    >>> split_weights(3, 1.0)
    [1.0, 1.5, 2.0]
    """
    scale = max(1, splits - 1)
    return [1 + skew * i / scale for i in range(splits)]


class GeneratorSource(
    Source[pa.RecordBatch, GeneratorSplit, AssignerState[GeneratorSplit]],
    SupportsSplitReassignmentOnRecovery,
):
    """``splits`` splits of generated rows (see the module doc for every setting).

    ``clock``: seconds since the epoch (default ``time.time``); tests pass their own.
    """

    def __init__(
        self,
        splits: int,
        rows: int | None = None,
        *,
        rows_per_second: float | None = None,
        start_time: float | None = None,
        batch_rows: int = 65_536,
        skew: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        for name, value in (("splits", splits), ("rowsPerSplit", rows), ("batchRows", batch_rows)):
            if value is not None and value < 1:
                raise ConfigurationError(
                    f"option {name} must be at least 1, got {value}", option=name
                )
        if rows_per_second is not None and not (0 < rows_per_second < math.inf):
            raise ConfigurationError(
                f"option rowsPerSecond must be a positive number, got {rows_per_second}",
                option="rowsPerSecond",
            )
        if not 0 <= skew < math.inf:
            raise ConfigurationError(f"option skew must be >= 0, got {skew}", option="skew")
        self.num_splits, self.rows, self.batch_rows, self.skew = splits, rows, batch_rows, skew
        self.rows_per_second, self.start_time, self.clock = rows_per_second, start_time, clock

    def start_us(self, now: float) -> int:
        """The event time of row 0 for an enumerator created at ``now`` (microseconds)."""
        return math.floor((now if self.start_time is None else self.start_time) * 1_000_000)

    def splits(self, start_us: int = 0) -> list[GeneratorSplit]:
        """Every split, starting at ``start_us``."""
        weights = split_weights(self.num_splits, self.skew)
        total = sum(weights)
        rate = self.rows_per_second
        return [
            GeneratorSplit(
                i,
                None if self.rows is None else round(self.rows * w),
                start_us,
                None if rate is None else rate * w / total,
            )
            for i, w in enumerate(weights)
        ]

    @property
    def boundedness(self) -> Boundedness:
        return Boundedness.CONTINUOUS_UNBOUNDED if self.rows is None else Boundedness.BOUNDED

    def create_enumerator(
        self, context: SplitEnumeratorContext[GeneratorSplit]
    ) -> SplitEnumerator[GeneratorSplit, AssignerState[GeneratorSplit]]:
        return GeneratorEnumerator(self, context, None)

    def restore_enumerator(
        self,
        context: SplitEnumeratorContext[GeneratorSplit],
        state: AssignerState[GeneratorSplit],
    ) -> SplitEnumerator[GeneratorSplit, AssignerState[GeneratorSplit]]:
        return GeneratorEnumerator(self, context, state)

    def create_reader(
        self, context: SourceReaderContext
    ) -> SourceReader[pa.RecordBatch, GeneratorSplit]:
        batch_rows, clock = self.batch_rows, self.clock
        return SourceReaderBase(
            lambda: _GeneratorSplitReader(batch_rows, clock),
            PositionedEmitter[pa.RecordBatch, GeneratorSplit](),
            context,
        )

    @property
    def event_time_column(self) -> str:
        return "event_time"

    @property
    def split_codec(self) -> Codec[GeneratorSplit]:
        return DataclassCodec(GeneratorSplit)

    @property
    def enumerator_state_codec(self) -> Codec[AssignerState[GeneratorSplit]]:
        return AssignerStateCodec(self.split_codec)
