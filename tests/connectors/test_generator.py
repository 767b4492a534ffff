"""The generator connector: the contract suites, determinism, rates, event time and skew."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from splitflow.api.reader import InputStatus
from splitflow.connectors.generator import (
    UNBOUNDED,
    GeneratorSource,
    GeneratorSplit,
    make_batch,
)
from splitflow.errors import ConfigurationError
from splitflow.reader.output import Collector, RecordingReaderContext
from splitflow.testing import SourceHarness
from splitflow.testing.contracts import SourceContract, SourceReaderContract


class _GeneratorContract(SourceContract, SourceReaderContract):
    def expected_records(self) -> list[Any]:
        source = self.make_source()
        return [(s.index, i) for s in source.splits() for i in range(s.rows or 0)]

    def rows(self, record: Any) -> list[Any]:
        assert isinstance(record, pa.RecordBatch)
        columns = record.to_pydict()
        return list(zip(columns["split"], columns["id"], strict=True))

    def record_split_id(self, record: Any) -> str:
        return f"gen-{record[0]:05d}"


class TestGeneratorSource(_GeneratorContract):
    def make_source(self) -> GeneratorSource:
        return GeneratorSource(5, 40, batch_rows=7, skew=1.0)


class TestRatedGeneratorSource(_GeneratorContract):
    """With a rate and a start long past: every row exists, through the rate's code path."""

    def make_source(self) -> GeneratorSource:
        return GeneratorSource(4, 30, rows_per_second=8.0, start_time=0.0, batch_rows=4)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def read_all(source: GeneratorSource, splits: list[GeneratorSplit]) -> pa.Table:
    """What a reader without planned stops emits now, as one table."""
    reader = source.create_reader(RecordingReaderContext())
    reader.start()
    reader.add_splits(splits)
    out: Collector[pa.RecordBatch] = Collector()
    while reader.poll_next(out) is InputStatus.MORE_AVAILABLE:
        pass
    reader.close()
    return pa.Table.from_batches(list(out), schema=make_batch(0, 0, 0).schema)


def test_a_slice_is_the_same_rows_whatever_the_batch_boundaries() -> None:
    whole = make_batch(3, 0, 100, start_us=5, rate=3.0)
    pieces = [
        make_batch(3, 0, 37, start_us=5, rate=3.0),
        make_batch(3, 37, 100, start_us=5, rate=3.0),
    ]
    assert pa.Table.from_batches([whole]).equals(pa.Table.from_batches(pieces))


def test_row_i_has_event_time_start_plus_i_over_the_rate() -> None:
    batch = make_batch(1, 0, 5, start_us=10_000_000, rate=4.0)
    micros = [t.value for t in batch.column("event_time")]
    assert micros == [10_000_000, 10_250_000, 10_500_000, 10_750_000, 11_000_000]


def test_skew_makes_the_last_split_that_many_times_the_first() -> None:
    splits = GeneratorSource(4, 100, skew=2.0).splits()
    assert [s.rows for s in splits] == [100, 167, 233, 300]


def test_the_rate_is_shared_over_splits_by_weight_and_sums_to_the_total() -> None:
    splits = GeneratorSource(3, rows_per_second=600.0, skew=1.0).splits()
    rates = [s.rate or 0.0 for s in splits]
    assert sum(rates) == pytest.approx(600.0)
    assert rates[2] == pytest.approx(2 * rates[0])


def test_with_a_rate_latest_positions_follow_the_elapsed_time() -> None:
    clock = Clock(1000.0)
    source = GeneratorSource(2, 50, rows_per_second=20.0, clock=clock)  # 10 rows/s per split
    harness = SourceHarness(source, 1)
    harness.settle()
    splits = harness.reader_splits()[0]

    def latest() -> list[tuple[int, bool]]:
        extents = harness._await(harness.coordinator.latest_positions(splits))
        return [(extents[s.split_id].latest, extents[s.split_id].final) for s in splits]

    assert latest() == [(1, False), (1, False)]  # row 0's event time is the start: it exists
    clock.now += 2.05
    assert latest() == [(21, False), (21, False)]
    clock.now += 100
    assert latest() == [(50, True), (50, True)]
    harness.close()


def test_a_reader_without_stops_emits_only_rows_that_exist_yet() -> None:
    clock = Clock(50.0)
    source = GeneratorSource(1, rows_per_second=4.0, start_time=49.0, clock=clock)
    table = read_all(source, source.splits(source.start_us(clock())))
    assert table.column("id").to_pylist() == [0, 1, 2, 3, 4]  # event times 49.0 .. 50.0


def test_a_planned_slice_is_read_to_its_stop_whatever_the_task_clock_says() -> None:
    """The driver planned rows 0..20 at 1002.05; a task whose clock is behind (another host,
    a clock stepped back) reads exactly them, at once: the slice is a function of itself."""
    clock = Clock(1000.0)
    split = GeneratorSource(1, 50, rows_per_second=10.0, clock=clock).splits(1_000_000_000)[0]
    assert split.available(1002.05) == 21
    reader = GeneratorSource(1, 50, rows_per_second=10.0, clock=clock).create_reader(
        RecordingReaderContext()
    )
    reader.start()
    reader.add_splits([split], stop_at={split.split_id: 21})
    reader.notify_no_more_splits()
    out: Collector[pa.RecordBatch] = Collector()
    while reader.poll_next(out) is InputStatus.MORE_AVAILABLE:
        pass
    assert reader.poll_next(out) is InputStatus.END_OF_INPUT
    reader.close()
    ids = pa.Table.from_batches(list(out)).column("id").to_pylist()
    assert ids == list(range(21))


def test_a_restart_keeps_the_start_time_so_the_same_rows_exist() -> None:
    clock = Clock(1000.0)
    source = GeneratorSource(3, 40, rows_per_second=30.0, clock=clock, batch_rows=3)
    harness = SourceHarness(source, 2)
    harness.settle()
    for reader_id in harness.slots:
        harness.poll(reader_id, max_polls=2)
    harness.complete(harness.checkpoint())
    before = harness.committed()
    clock.now += 500.0  # a restart much later: a new enumerator would start at 1500
    harness.restore()
    starts = {s.start_us for splits in harness.reader_splits().values() for s in splits}
    assert starts == {1_000_000_000}
    harness.read_available()
    harness.complete(harness.checkpoint())
    records = harness.committed()
    harness.close()
    table = pa.Table.from_batches(records)
    assert len(before) > 0
    assert table.num_rows == 120  # everything exists by now, read once
    expected = pa.Table.from_batches(
        [make_batch(i, 0, 40, start_us=1_000_000_000, rate=10.0) for i in range(3)]
    )
    assert table.sort_by([("split", "ascending"), ("id", "ascending")]).equals(expected)


def test_without_rate_or_end_every_split_is_endless_and_always_available() -> None:
    source = GeneratorSource(2)
    split = source.splits()[0]
    assert split.extent(0.0).latest == UNBOUNDED
    assert not split.extent(0.0).final
    assert source.boundedness.name == "CONTINUOUS_UNBOUNDED"


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"splits": 0}, "splits"),
        ({"rows": 0}, "rowsPerSplit"),
        ({"skew": -1.0}, "skew"),
        ({"rows_per_second": 0.0}, "rowsPerSecond"),
        ({"batch_rows": 0}, "batchRows"),
    ],
)
def test_bad_settings_name_the_option(kwargs: dict[str, Any], option: str) -> None:
    settings: dict[str, Any] = {"splits": 2, "rows": 10, **kwargs}
    with pytest.raises(ConfigurationError) as error:
        GeneratorSource(settings.pop("splits"), settings.pop("rows"), **settings)
    assert error.value.option == option
