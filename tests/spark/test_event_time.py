"""Event time on Spark without a session: per-split watermarks, idleness and alignment.

Batches are planned by the real planner and read by the real task code
(:func:`~splitflow.spark.datasource.read_partition`, which reports each split's event time
through the state directory), on generator splits whose event times are known exactly. A
model of Spark's rule for late rows (a row is dropped when its 1-minute window ended at or
before the largest event time of the earlier batches, less the watermark delay) counts the
rows Spark would drop; the real Spark runs are in ``test_event_time_e2e.py``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("pyspark")

from tests.spark.lagging import LaggingDataSource
from tests.spark.support import expanded

from splitflow.errors import ConfigurationError
from splitflow.spark.datasource import _partitions, read_partition
from splitflow.spark.eventtime import EventTimeSettings
from splitflow.spark.generator import GeneratorDataSource
from splitflow.spark.limits import BacklogAware, MaxRecords, ReadLimit
from splitflow.spark.planner import Planner

SECOND = 1_000_000
WINDOW = 60 * SECOND
DELAY = 30 * SECOND


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class Run:
    """A query of ``data_source``: plans with a planner, reads with the real task code."""

    def __init__(
        self,
        data_source: GeneratorDataSource,
        clock: FakeClock,
        parallelism: int = 2,
        start: Mapping[str, Any] | None = None,
        event_time: EventTimeSettings | None = None,
        available_now: bool = False,
    ) -> None:
        self.ds = data_source
        self.source = data_source.create_source()
        runtime = data_source.runtime
        self.planner: Planner[Any, Any] = Planner(
            self.source,
            parallelism,
            clock=clock,
            state_dir=runtime.state_dir,
            event_time=event_time or data_source.event_time,
        )
        if available_now:
            self.planner.prepare_available_now()
        self.offset = dict(start) if start else roundtrip(self.planner.initial_offset())
        self.batches: list[pa.Table] = []

    def batch(self, records: int | ReadLimit) -> pa.Table | None:
        limit = MaxRecords(records) if isinstance(records, int) else records
        end = roundtrip(self.planner.latest_offset(self.offset, limit))
        if end == self.offset:
            return None
        self.planner.commit(self.offset)
        decoded = self.planner.read_offset(end)
        parts = _partitions(self.source, decoded, self.ds.runtime)
        batches = [b for p in parts for b in read_partition(self.ds, p)]
        table = pa.Table.from_batches(batches) if batches else pa.table({})
        self.batches.append(table)
        self.offset = end
        return table

    def full(self, offset: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """An offset (default: the last), its state read back from ``stateDir``."""
        return dict(
            expanded(self.offset if offset is None else offset, self.ds.runtime.state_store)
        )

    def watermarks(self) -> dict[str, int]:
        return {k: int(v) for k, v in self.full().get("event_times", {}).items()}


def roundtrip(offset: Mapping[str, Any]) -> dict[str, Any]:
    return dict(json.loads(json.dumps(offset)))


def lagging(tmp_path: Path, **options: str) -> LaggingDataSource:
    settings = {
        "splits": "4",
        "rowsPerSplit": "400000",
        "startTime": "1000",
        "batchRows": "5000",
        "stateDir": str(tmp_path / "state"),
        "maxEventTimeDrift": "30s",
        **options,
    }
    return LaggingDataSource({k.lower(): v for k, v in settings.items()})


def event_times(table: pa.Table) -> list[int]:
    return [] if table.num_rows == 0 else pc.cast(table["event_time"], pa.int64()).to_pylist()


def dropped_by_spark(batches: list[pa.Table]) -> int:
    """Rows Spark drops as late: their window ended at or before the watermark of their
    batch (the largest event time of the earlier batches, less :data:`DELAY`)."""
    dropped, latest = 0, None
    for table in batches:
        times = event_times(table)
        if latest is not None:
            watermark = latest - DELAY
            dropped += sum(1 for t in times if t - t % WINDOW + WINDOW <= watermark)
        if times:
            latest = max(times) if latest is None else max(latest, max(times))
    return dropped


def per_split_max(table: pa.Table) -> dict[int, int]:
    result: dict[int, int] = {}
    for split, t in zip(table["split"].to_pylist(), event_times(table), strict=True):
        result[split] = max(result.get(split, t), t)
    return result


# -- the rule -------------------------------------------------------------------------------


def invariant_holds(run: Run, latest: int) -> bool:
    """After the batch just planned, ``latest`` (the latest event time read so far) is at
    most the drift past the next record of every split with records left."""
    planned = run.planner.read_offset(run.offset)
    unread = [
        s.split.event_time(s.stop)
        for slot in planned.slots
        for s in slot
        if s.split.rows is None or s.stop < s.split.rows
    ]
    return not unread or latest <= min(unread) + 30 * SECOND


# -- through the planner and the task code ---------------------------------------------------


def test_without_alignment_spark_would_drop_the_lagging_split_and_with_it_none(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    plain = Run(
        lagging(tmp_path / "plain", maxEventTimeDrift="30s"),
        clock,
        event_time=EventTimeSettings("event_time"),
    )
    aligned = Run(lagging(tmp_path / "aligned"), clock)
    for run in (plain, aligned):
        while run.batch(40_000) is not None and len(run.batches) < 60:
            pass
    assert dropped_by_spark(plain.batches) > 10_000
    assert dropped_by_spark(aligned.batches) == 0
    total = sum(t.num_rows for t in aligned.batches)
    assert total == sum(t.num_rows for t in plain.batches) > 0


def test_no_batch_reads_more_than_the_drift_past_any_split_s_next_record(tmp_path: Path) -> None:
    """After every batch, the latest event time read so far (what Spark's watermark follows)
    is at most the drift past the next unread record of every split with records left: with
    the drift at most the watermark delay, none of them can be late."""
    run = Run(lagging(tmp_path), FakeClock())
    latest = 0
    for _ in range(30):
        table = run.batch(40_000)
        assert table is not None
        assert table.num_rows > 0
        latest = max(latest, *per_split_max(table).values())
        assert invariant_holds(run, latest)
    # the lagging split caught up: all four are within the drift of each other
    assert max(run.watermarks().values()) - min(run.watermarks().values()) <= 30 * SECOND


def test_splits_that_move_together_read_whole_shares(tmp_path: Path) -> None:
    """Without lag, alignment cuts nothing: a batch reads as much as without it, even when a
    share spans more event time than the drift (here 100 s a split and batch)."""
    clock = FakeClock()
    plain = Run(lagging(tmp_path / "plain", lag="0s"), clock, event_time=EventTimeSettings("t"))
    aligned = Run(lagging(tmp_path / "aligned", lag="0s"), clock)
    for _ in range(3):
        plain.batch(400_000)
        aligned.batch(400_000)
        assert aligned.full()["slots"] == plain.full()["slots"]
    assert aligned.planner.lag()["pausedSplits"] == 0


def test_a_source_that_maps_no_position_is_searched_to_the_same_stops(tmp_path: Path) -> None:
    """Kafka tells event times (by peeking) but maps no position: the planner searches the
    positions with event times at positions, and must plan exactly what the index plans."""
    clock = FakeClock()
    mapped = Run(lagging(tmp_path / "mapped"), clock)
    searched = Run(lagging(tmp_path / "searched", mapsPositions="false"), clock)
    for _ in range(12):
        mapped.batch(40_000)
        searched.batch(40_000)
        assert searched.full()["slots"] == mapped.full()["slots"]
    assert dropped_by_spark(searched.batches) == 0


def test_a_coarse_index_neither_lets_a_split_past_the_limit_nor_stalls_it(
    tmp_path: Path,
) -> None:
    """An index that maps positions to units of 50,000 rows (as Parquet's row groups; here
    50 s, longer than the drift) maps a split to its own position when its next unit holds
    times on both sides of the limit: the planner then searches the split's stop, so the
    split reads up to the limit and no further."""
    run = Run(lagging(tmp_path, unit="50000"), FakeClock())
    straddled = 0
    for _ in range(25):
        table = run.batch(40_000)
        assert table is not None
        assert table.num_rows > 0
        report = run.planner.lag()
        limit = _micros(report["alignmentLimit"])
        assert max(per_split_max(table).values()) <= limit
        planned = run.planner.read_offset(run.offset)
        for slot in range(planned.parallelism):
            for piece in planned.reading(slot):
                split = piece.split
                if split.event_time(piece.start) <= limit:
                    exact = split.first_after(limit)
                    straddled += exact - exact % 50_000 <= piece.start
    assert straddled > 0, "no batch put a unit across the limit: the test tests nothing"


def test_a_quiet_split_is_not_left_late_when_the_batch_is_shared_again(tmp_path: Path) -> None:
    """Split 0 has a record a second from 0 s, splits 1 and 2 a hundred a second from 100 s.
    Cut to the drift, the busy splits leave budget that goes, shared again, mostly to
    them: the bound must hold for what each split reads in the end, not for the shares it
    was computed from (a review found 38 rows of split 0 late here)."""
    ds = lagging(tmp_path, splits="3", rowsPerSplit="100000", starts="0,100,100", rates="1,100,100")
    run = Run(ds, FakeClock())
    latest = 0
    for _ in range(8):
        table = run.batch(1_000)
        assert table is not None
        latest = max(latest, *per_split_max(table).values())
        assert invariant_holds(run, latest)
    assert dropped_by_spark(run.batches) == 0


@settings(max_examples=40, deadline=None)
@given(
    splits=st.lists(
        st.tuples(
            st.integers(0, 100),  # first event time, seconds
            st.sampled_from([0.1, 1.0, 10.0, 100.0, 1000.0]),  # rows per second
            st.sampled_from([50, 500, 5_000, 100_000]),  # rows
        ),
        min_size=2,
        max_size=4,
    ),
    budget=st.sampled_from([1, 2, 3, 7, 50, 300, 2_000]),
    index=st.sampled_from(["exact", "searched", "unit=10", "unit=100", "unit=1000"]),
)
def test_no_split_is_left_late_and_none_stalls(
    splits: list[tuple[int, float, int]], budget: int, index: str
) -> None:
    """Any starts, rates, lengths, budgets and indexes (exact, searched, coarse): after every
    batch no split has a record left more than the drift before the latest event time read,
    and while records are left, a batch is planned."""
    import tempfile

    options = {
        "splits": str(len(splits)),
        "rowsPerSplit": str(max(rows for _, _, rows in splits)),
        "starts": ",".join(str(start) for start, _, _ in splits),
        "rates": ",".join(str(rate) for _, rate, _ in splits),
    }
    if index == "searched":
        options["mapsPositions"] = "false"
    elif index.startswith("unit="):
        options["unit"] = index[5:]
    with tempfile.TemporaryDirectory() as tmp:
        run = Run(lagging(Path(tmp), **options), FakeClock())
        latest = 0
        for _ in range(40):
            table = run.batch(budget)
            planned = run.planner.read_offset(run.offset)
            left = any(s.stop < s.split.rows for slot in planned.slots for s in slot)
            if table is None:
                assert not left, "a trigger planned no batch with records left"
                break
            if table.num_rows:  # (a batch may only record splits that finished)
                latest = max(latest, *per_split_max(table).values())
            assert invariant_holds(run, latest)


def test_watermarks_in_the_offset_are_the_latest_event_time_read_per_split(
    tmp_path: Path,
) -> None:
    """Batch n's reports reach the planner when it plans batch n + 1: its offset holds the
    latest event time of every split over batches 1 .. n."""
    run = Run(lagging(tmp_path), FakeClock())
    seen: dict[str, int] = {}
    for _ in range(4):
        table = run.batch(20_000)
        assert table is not None
        assert run.watermarks() == seen
        for split, t in per_split_max(table).items():
            sid = f"gen-{split:05d}"
            seen[sid] = max(seen.get(sid, t), t)
    assert len(seen) == 4


def test_watermarks_survive_a_restart_and_a_rescale(tmp_path: Path) -> None:
    clock = FakeClock()
    first = Run(lagging(tmp_path), clock)
    for _ in range(5):
        first.batch(20_000)
    kept = first.watermarks()
    assert len(kept) == 4
    again = Run(lagging(tmp_path), clock, parallelism=3, start=first.offset)
    assert again.batch(20_000) is not None
    planned = again.full()  # from the restored watermarks and the last batch's reports
    assert planned["event_times"].keys() == kept.keys()
    assert all(planned["event_times"][sid] >= t for sid, t in kept.items())
    # a second restart from the same offset plans the same watermarks: restored exactly
    ds = lagging(tmp_path)
    restored = Planner(
        ds.create_source(), 3, clock=clock, state_dir=ds.runtime.state_dir, event_time=ds.event_time
    )
    replanned = again.full(roundtrip(restored.latest_offset(first.offset, MaxRecords(20_000))))
    assert replanned["event_times"] == planned["event_times"]
    assert replanned["slots"] == planned["slots"]


def test_an_idle_split_stops_holding_the_others_back_after_the_idle_timeout(
    tmp_path: Path,
) -> None:
    """Split 0 gets nothing after its first 1,000 rows: without idleness the others could not
    get more than the drift ahead of it."""
    clock = FakeClock()
    run = Run(lagging(tmp_path, stall="0", stallAfter="1000", splitIdleTimeout="10s"), clock)
    for _ in range(10):
        run.batch(20_000)
    stuck = run.watermarks()["gen-00000"]
    ahead = max(t for sid, t in run.watermarks().items() if sid != "gen-00000")
    assert ahead <= stuck + 30 * SECOND  # held back while split 0 is active
    report = run.planner.lag()
    assert report["splits"]["gen-00000"]["idle"] is False
    clock.now += 11
    for _ in range(10):
        run.batch(20_000)
    report = run.planner.lag()
    assert report["splits"]["gen-00000"]["idle"] is True
    assert report["idleSplits"] == 1
    ahead = max(t for sid, t in run.watermarks().items() if sid != "gen-00000")
    assert ahead > stuck + 60 * SECOND


def test_under_available_now_a_split_at_its_target_holds_nobody_back(tmp_path: Path) -> None:
    """``trigger(availableNow=True)`` ends at the first trigger that plans no batch. Split 0
    has 1,000 rows when the run starts (and is never idle by time): once it has read them it
    reads nothing more in this run, so it must not hold the others at its watermark plus
    the drift, or the run would end with their rows unread."""
    run = Run(
        lagging(
            tmp_path, stall="0", stallAfter="1000", splitIdleTimeout="1h", rowsPerSplit="100000"
        ),
        FakeClock(),
        available_now=True,
    )
    while run.batch(40_000) is not None:
        pass
    assert sum(t.num_rows for t in run.batches) == 1_000 + 3 * 100_000
    assert run.planner.lag()["splits"]["gen-00000"]["idle"] is True


def test_a_batch_sized_for_the_backlog_is_aligned_too(tmp_path: Path) -> None:
    """Catching up on a backlog (FLIP-309's large batches) and alignment work together: the
    backlog limit sizes the batch, alignment still holds the splits ahead of split 3."""
    run = Run(lagging(tmp_path), FakeClock())
    assert run.planner.in_backlog
    table = run.batch(BacklogAware(backlog=MaxRecords(100_000), live=MaxRecords(1_000)))
    assert table is not None
    assert set(table["split"].to_pylist()) == {3}
    assert table.num_rows > 1_000  # the backlog's size, not the live one
    assert run.planner.lag()["pausedSplits"] == 3


def test_progress_reports_watermarks_drift_and_paused_splits(tmp_path: Path) -> None:
    run = Run(lagging(tmp_path), FakeClock())
    run.batch(40_000)
    report = run.planner.lag()
    assert report["eventTimeColumn"] == "event_time"
    assert report["maxEventTimeDrift"] == 30.0
    assert report["pausedSplits"] == 3  # the three splits ahead of split 3
    rows = report["splits"]
    assert rows["gen-00003"]["paused"] is False
    assert rows["gen-00000"]["paused"] is True
    assert rows["gen-00000"]["drift"] == 60  # the generator's lag option
    assert rows["gen-00003"]["drift"] == 0
    assert report["alignedWatermark"] == "1970-01-01T00:15:40.000+00:00"  # 1000 s less LAG
    # split 3's share of 10,000 rows (10 s) leaves 00:15:50 unread: the batch reads to 30 s
    # past that
    assert report["alignmentLimit"] == "1970-01-01T00:16:20.000+00:00"
    assert rows["gen-00003"]["watermark"] is None  # batch 1's reports come with batch 2
    run.batch(40_000)
    assert (
        run.planner.lag()["splits"]["gen-00003"]["watermark"] == "1970-01-01T00:16:19.999+00:00"
    )  # it read the batch's 40,000 rows alone: 1 ms short of the limit


def test_an_unindexed_source_aligns_by_pausing(tmp_path: Path) -> None:
    """Without an index the first batch reads one row of each split, to learn where it
    stands; from then on splits ahead of the slowest by more than the drift pause."""
    clock = FakeClock()
    ds = lagging(tmp_path)
    assert ds.event_time is not None
    settings = EventTimeSettings("event_time", ds.event_time.max_drift, indexed=False)
    run = Run(ds, clock, event_time=settings)
    first = run.batch(40_000)
    assert first is not None
    assert sorted(first["split"].to_pylist()) == [0, 1, 2, 3]
    second = run.batch(40_000)
    assert second is not None
    assert set(per_split_max(second)) == {3}


# -- options ---------------------------------------------------------------------------------


def test_alignment_needs_a_state_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as error:
        lagging(tmp_path, stateDir="")
    assert error.value.option == "maxEventTimeDrift"
    assert "stateDir" in str(error.value)


def test_a_bad_drift_names_the_option(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as error:
        lagging(tmp_path, maxEventTimeDrift="soon")
    assert error.value.option == "maxEventTimeDrift"
    assert "'soon'" in str(error.value)


def test_the_event_time_column_must_be_a_timestamp_of_the_schema(tmp_path: Path) -> None:
    from pyspark.sql.types import LongType, StructField, StructType, TimestampType

    schema = StructType([StructField("id", LongType()), StructField("at", TimestampType())])
    ds = lagging(tmp_path, eventTimeColumn="when")
    with pytest.raises(ConfigurationError, match="no column 'when'"):
        ds.streamReader(schema)
    ds = lagging(tmp_path, eventTimeColumn="id")
    with pytest.raises(ConfigurationError, match="'id' is bigint, not a timestamp"):
        ds.streamReader(schema)
    assert lagging(tmp_path, eventTimeColumn="at").streamReader(schema) is not None


def test_a_user_column_is_not_the_sources_index(tmp_path: Path) -> None:
    ds = lagging(tmp_path, eventTimeColumn="other")
    assert ds.event_time is not None
    assert not ds.event_time.indexed
    assert lagging(tmp_path).event_time == EventTimeSettings("event_time", 30 * SECOND, 60.0, True)


def _micros(text: str) -> int:
    from datetime import datetime

    return round(datetime.fromisoformat(text).timestamp() * 1_000_000)
