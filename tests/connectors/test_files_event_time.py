"""The files source's event-time index: Parquet row-group statistics, read from real files.

Positions of a file split are byte offsets; a row group belongs to the split its first byte
is in (:func:`~splitflow.connectors.files.formats.row_group_starts`). The enumerator maps
event time to those positions with the statistics in each file's footer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from splitflow.api.events import SplitsFinishedEvent
from splitflow.connectors.files import FileSplit, FilesSource
from splitflow.connectors.files.formats import (
    FileEntry,
    RowGroupTimes,
    row_group_starts,
    row_group_times,
)
from splitflow.connectors.files.source import FilesEnumerator, cut

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
SECOND = 1_000_000
T0 = int(EPOCH.timestamp()) * SECOND
"""2026-01-01T00:00:00Z in microseconds: the times below are seconds after it."""

UTC_MICROS = pa.timestamp("us", "UTC")
GROUPS = [[10, 15, 20], [30, 35, 40], [50, 55, 60]]
"""Three row groups, seconds after ``T0``: 10..20, 30..40, 50..60."""


def at(seconds: float) -> int:
    return T0 + round(seconds * SECOND)


def write_groups(
    path: Path,
    groups: Sequence[Sequence[float | None]],
    type_: pa.DataType = UTC_MICROS,
    **options: Any,
) -> Path:
    """A Parquet file of one row group per entry of ``groups`` (seconds after ``T0``)."""
    schema = pa.schema([("ts", type_), ("n", pa.int64())])
    temporary = path.parent / f".{path.name}.tmp"
    with pq.ParquetWriter(temporary, schema, **options) as writer:
        n = 0
        for group in groups:
            values = [None if s is None else EPOCH + timedelta(seconds=s) for s in group]
            times = pa.array(values, UTC_MICROS).cast(type_, safe=False)
            numbers = pa.array(range(n, n + len(group)), pa.int64())
            writer.write_table(pa.table([times, numbers], schema=schema))
            n += len(group)
    os.replace(temporary, path)
    return path


class FakeContext:
    """The enumerator's context, enough for calling it directly."""

    current_parallelism = 1
    reports_splits_on_registration = True

    class _Metrics:
        def gauge(self, name: str, supplier: Any) -> None:
            pass

        def counter(self, name: str) -> Any:
            return None

    metrics = _Metrics()

    def registered_readers(self) -> dict[int, Any]:
        return {}

    def call_async(self, *args: Any, **kwargs: Any) -> Any:
        return None

    def set_is_processing_backlog(self, is_backlog: bool) -> None:
        pass


def enumerator(source: FilesSource) -> FilesEnumerator:
    return FilesEnumerator(source, FakeContext(), None)  # type: ignore[arg-type]


def parquet_source(directory: Path, column: str | None = "ts", **options: Any) -> FilesSource:
    return FilesSource(str(directory), "parquet", event_time_column=column, **options)


def whole(path: Path) -> FileSplit:
    """The one split of the file at ``path``, at position 0."""
    stat = path.stat()
    (split,) = cut(FileEntry(str(path), stat.st_size, stat.st_mtime_ns), 1 << 30)
    return split


def moved(split: FileSplit, position: int) -> FileSplit:
    return FileSplit(**{**vars(split), "position": position})


def starts_of(path: Path) -> list[int]:
    return row_group_starts(pq.read_metadata(path))


# -- event_times --------------------------------------------------------------------------------


def test_event_time_is_the_least_time_of_the_next_row_group(tmp_path: Path) -> None:
    path = write_groups(tmp_path / "a.parquet", GROUPS)
    starts = starts_of(path)
    en = enumerator(parquet_source(tmp_path))
    split = whole(path)
    assert en.event_times([split]) == {split.split_id: at(10)}
    assert en.event_times([moved(split, starts[0])]) == {split.split_id: at(10)}
    assert en.event_times([moved(split, starts[0] + 1)]) == {split.split_id: at(30)}  # read
    assert en.event_times([moved(split, starts[2])]) == {split.split_id: at(50)}


def test_a_split_with_no_row_group_left_has_no_event_time(tmp_path: Path) -> None:
    path = write_groups(tmp_path / "a.parquet", GROUPS)
    en = enumerator(parquet_source(tmp_path))
    split = whole(path)
    assert en.event_times([moved(split, starts_of(path)[2] + 1)]) == {}
    assert en.event_times([moved(split, split.end)]) == {}


@pytest.mark.parametrize(
    "type_",
    [
        pa.timestamp("s"),
        pa.timestamp("ms"),
        pa.timestamp("us"),
        pa.timestamp("ns"),
        pa.timestamp("ms", "UTC"),
        pa.timestamp("ns", "Asia/Tokyo"),
    ],
    ids=str,
)
def test_every_timestamp_unit_is_read_as_microseconds_and_naive_as_utc(
    tmp_path: Path, type_: pa.DataType
) -> None:
    path = write_groups(tmp_path / "a.parquet", [[10.5, 12], [30, 40.25]], type_)
    en = enumerator(parquet_source(tmp_path))
    split = whole(path)
    low = at(10) if type_.unit == "s" else at(10.5)  # a cast to seconds drops the half
    assert en.event_times([split]) == {split.split_id: low}
    after = en.positions_after([split], at(12))
    assert after == {split.split_id: starts_of(path)[1]}


def test_timestamps_written_as_parquet_1_0_keep_their_unit(tmp_path: Path) -> None:
    path = write_groups(tmp_path / "a.parquet", [[10, 20], [30]], pa.timestamp("ns"), version="1.0")
    en = enumerator(parquet_source(tmp_path))
    split = whole(path)
    assert en.event_times([split]) == {split.split_id: at(10)}
    assert en.positions_after([split], at(20)) == {split.split_id: starts_of(path)[1]}


def test_a_date_column_is_midnight_utc(tmp_path: Path) -> None:
    path = tmp_path / "a.parquet"
    days = [date(2026, 1, 1), date(2026, 1, 3)]
    table = pa.table({"day": pa.array(days, pa.date32()), "n": [1, 2]})
    pq.write_table(table, path, row_group_size=1)
    en = enumerator(parquet_source(tmp_path, column="day"))
    split = whole(path)
    assert en.event_times([split]) == {split.split_id: T0}
    assert en.positions_after([split], T0) == {split.split_id: starts_of(path)[1]}


# -- positions_after ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "group"),
    [
        (5, "position"),  # before every group: the next group may not be read
        (10, "position"),  # inside the first group (its max is after it)
        (19.9, "position"),
        (20, 1),  # the first group's max: it may be read, the second not
        (25, 1),  # between groups
        (39, 1),
        (40, 2),
        (59, 2),
        (60, "end"),  # the last max: the whole split
        (1000, "end"),  # after every group
    ],
)
def test_positions_after_stop_where_a_later_time_may_begin(
    tmp_path: Path, seconds: float, group: int | str
) -> None:
    path = write_groups(tmp_path / "a.parquet", GROUPS)
    starts = starts_of(path)
    en = enumerator(parquet_source(tmp_path))
    split = whole(path)
    expected = {"position": split.position, "end": split.end}.get(str(group))
    if expected is None:
        expected = starts[int(group)]
    assert en.positions_after([split], at(seconds)) == {split.split_id: expected}


def test_positions_after_start_at_the_split_position(tmp_path: Path) -> None:
    path = write_groups(tmp_path / "a.parquet", GROUPS)
    starts = starts_of(path)
    en = enumerator(parquet_source(tmp_path))
    second = moved(whole(path), starts[1])
    # the first group is read: its times no longer count
    assert en.positions_after([second], at(20)) == {second.split_id: starts[1]}
    assert en.positions_after([second], at(45)) == {second.split_id: starts[2]}
    inside = moved(whole(path), starts[1] + 1)  # a cap inside the second group's bytes
    assert en.positions_after([inside], at(20)) == {inside.split_id: inside.position}
    assert en.positions_after([inside], at(60)) == {inside.split_id: inside.end}


def test_reading_up_to_the_mapped_position_reads_no_later_time(tmp_path: Path) -> None:
    path = write_groups(tmp_path / "a.parquet", GROUPS)
    source = parquet_source(tmp_path)
    source.schema = source.infer_schema()
    split = whole(path)
    stop = enumerator(source).positions_after([split], at(45))[split.split_id]
    read = read_slice(source, split, stop)
    assert read == [at(s) for group in GROUPS[:2] for s in group]


def read_slice(source: FilesSource, split: FileSplit, stop: int) -> list[int]:
    """The event times the source's reader reads from ``split`` up to ``stop``."""
    from splitflow.reader import Collector, RecordingReaderContext

    reader = source.create_reader(RecordingReaderContext())
    reader.start()
    reader.add_splits([split], stop_at={split.split_id: stop})
    reader.notify_no_more_splits()
    out: Collector[Any] = Collector()
    while reader.poll_next(out).value != "end":
        pass
    reader.close()
    return [v for batch in out for v in batch.column("ts").cast(pa.int64()).to_pylist()]


def test_a_split_part_maps_only_the_row_groups_that_begin_in_it(tmp_path: Path) -> None:
    path = write_groups(tmp_path / "a.parquet", GROUPS)
    starts = starts_of(path)
    size, mtime = path.stat().st_size, path.stat().st_mtime_ns
    middle = starts[2] - 1  # part 0 holds the first two groups, part 1 the third
    part0 = FileSplit(str(path), 0, 2, 0, middle, size, mtime, 0)
    part1 = FileSplit(str(path), 1, 2, middle, size, size, mtime, middle)
    en = enumerator(parquet_source(tmp_path))
    assert en.event_times([part0, part1]) == {part0.split_id: at(10), part1.split_id: at(50)}
    assert en.positions_after([part0, part1], at(45)) == {
        part0.split_id: middle,  # the end of part 0: the third group is not its own
        part1.split_id: middle,  # part 1's next group is after 45
    }


def test_a_row_group_of_nulls_only_holds_nobody_back(tmp_path: Path) -> None:
    path = write_groups(tmp_path / "a.parquet", [[10, 20], [None, None], [30, 40]])
    starts = starts_of(path)
    en = enumerator(parquet_source(tmp_path))
    split = whole(path)
    assert en.positions_after([split], at(25)) == {split.split_id: starts[2]}
    assert en.event_times([moved(split, starts[1])]) == {split.split_id: at(30)}


# -- no index -------------------------------------------------------------------------------------


def test_without_statistics_a_split_has_no_event_time_and_maps_to_its_position(
    tmp_path: Path,
) -> None:
    path = write_groups(tmp_path / "a.parquet", GROUPS, write_statistics=False)
    en = enumerator(parquet_source(tmp_path))
    split = whole(path)
    assert en.event_times([split]) == {}
    # nothing can be read that is known to be within the time; the planner's guard reads
    # the split when its reported event time is within the limit
    assert en.positions_after([split], at(1000)) == {split.split_id: split.position}


def test_a_row_group_without_statistics_is_where_reading_stops() -> None:
    times = RowGroupTimes((4, 100, 200), (10, None, 50), (20, None, 60), (False,) * 3)
    assert times.first_after(0, 300, 1000) == 100
    assert times.first_time(100, 300) is None


def test_statistics_of_other_columns_only_are_no_index(tmp_path: Path) -> None:
    path = write_groups(tmp_path / "a.parquet", GROUPS, write_statistics=["n"])
    assert row_group_times(pq.read_metadata(path), "ts") == RowGroupTimes(
        tuple(starts_of(path)), (None,) * 3, (None,) * 3, (False,) * 3
    )


@pytest.mark.parametrize("column", ["missing", "n"])
def test_a_column_missing_or_not_a_time_has_no_index(tmp_path: Path, column: str) -> None:
    path = write_groups(tmp_path / "a.parquet", GROUPS)
    en = enumerator(parquet_source(tmp_path, column=column))
    split = whole(path)
    assert en.event_times([split]) == {}
    assert en.positions_after([split], at(0)) == {}


def test_an_unreadable_footer_has_no_index(tmp_path: Path) -> None:
    path = tmp_path / "a.parquet"
    path.write_bytes(b"PAR1 this is not parquet PAR1")
    en = enumerator(parquet_source(tmp_path))
    assert en.event_times([whole(path)]) == {}
    assert en.positions_after([whole(path)], at(0)) == {}


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_json_and_csv_sources_have_no_index(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / f"a.{fmt}"
    path.write_text(json.dumps({"ts": "2026-01-01T00:00:10Z"}) + "\n")
    source = FilesSource(str(tmp_path), fmt, event_time_column="ts")
    assert source.event_time_column is None
    en = enumerator(source)
    assert en.event_times([whole(path)]) == {}
    assert en.positions_after([whole(path)], at(0)) == {}


def test_a_parquet_source_without_the_option_has_no_event_time_column(tmp_path: Path) -> None:
    assert parquet_source(tmp_path, column=None).event_time_column is None
    assert parquet_source(tmp_path).event_time_column == "ts"


# -- footers are read once -----------------------------------------------------------------------


def counting(source: FilesSource, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    reads: list[str] = []
    real = source.row_group_times

    def read(path: str, size: int, column: str) -> RowGroupTimes | None:
        reads.append(Path(path).name)
        return real(path, size, column)

    monkeypatch.setattr(source, "row_group_times", read)
    return reads


def test_each_footer_is_read_once_per_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = write_groups(tmp_path / "a.parquet", GROUPS)
    b = write_groups(tmp_path / "b.parquet", [[1, 2]])
    source = parquet_source(tmp_path)
    reads = counting(source, monkeypatch)
    en = enumerator(source)
    size, mtime = a.stat().st_size, a.stat().st_mtime_ns
    parts = [FileSplit(str(a), i, 2, 0, size, size, mtime, 0) for i in range(2)]
    for _ in range(3):
        en.event_times([*parts, whole(b)])
        en.positions_after([*parts, whole(b)], at(30))
    assert sorted(reads) == ["a.parquet", "b.parquet"]


def test_a_finished_file_is_forgotten_and_a_changed_file_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = write_groups(tmp_path / "a.parquet", GROUPS)
    source = parquet_source(tmp_path)
    reads = counting(source, monkeypatch)
    en = enumerator(source)
    split = whole(a)
    en.latest_positions([split])
    en.event_times([split])
    en.handle_source_event(0, SplitsFinishedEvent((split.split_id,)))
    en.event_times([split])
    assert reads == ["a.parquet", "a.parquet"]
    write_groups(a, [[70, 80]])  # replaced: another size and mtime
    assert en.event_times([whole(a)]) == {str(a): at(70)}
    assert reads == ["a.parquet"] * 3


# -- the planner and the Spark data source -------------------------------------------------------


def plan(
    tmp_path: Path, limit: Any, batches: int = 1, drift: float = 15
) -> list[dict[str, tuple[int, int]]]:
    """Plan ``batches`` batches over the Parquet files in ``tmp_path``, aligned by ``ts``
    with ``drift`` seconds; each batch's slices, file name -> (start, stop)."""
    from splitflow.spark.eventtime import EventTimeSettings
    from splitflow.spark.offset import BatchOffset
    from splitflow.spark.planner import Planner

    source = parquet_source(tmp_path, discovery_interval=0.5)
    settings = EventTimeSettings("ts", max_drift=round(drift * SECOND), indexed=True)
    ticks = iter(range(1000))
    planner: Planner[Any, Any] = Planner(
        source, 1, clock=lambda: float(next(ticks)), event_time=settings
    )
    offset = planner.initial_offset()
    slices = []
    for _ in range(batches):
        offset = planner.latest_offset(offset, limit)
        end = BatchOffset.decode(offset, source)
        slices.append(
            {
                Path(s.split.path).name: (s.split.position, s.stop)
                for slot in end.slots
                for s in slot
            }
        )
    planner.close()
    return slices


def test_the_planner_reads_the_early_file_and_holds_the_late_one(tmp_path: Path) -> None:
    from splitflow.spark.limits import MaxRecords, share_records

    early = write_groups(tmp_path / "early.parquet", [[0, 5], [10, 15], [20, 25], [30, 35]])
    late = write_groups(tmp_path / "late.parquet", [[100 + i / 100 for i in range(5_000)]])
    budget = starts_of(early)[3]
    shares = share_records({"early": early.stat().st_size, "late": late.stat().st_size}, budget)
    # early's share leaves the group of 10..15s unread first: no record left in any file
    # is earlier than 10s once the batch is read, so it may read up to 25s
    assert starts_of(early)[0] < shares["early"] <= starts_of(early)[1]
    [batch] = plan(tmp_path, MaxRecords(budget))
    assert batch["early.parquet"] == (0, starts_of(early)[3])  # 0..5, 10..15 and 20..25s
    assert batch["late.parquet"] == (0, 0)  # paused: its next record is at 100s


def test_files_read_whole_in_one_batch_are_not_held(tmp_path: Path) -> None:
    """Nothing of a file read to its end in the batch is left to be late: without a read
    limit both files are read whole, whatever their times."""
    from splitflow.spark.limits import ReadAll

    early = write_groups(tmp_path / "early.parquet", [[0, 5], [10, 15], [20, 25], [30, 35]])
    late = write_groups(tmp_path / "late.parquet", [[100, 110]])
    [batch] = plan(tmp_path, ReadAll())
    assert batch == {
        "early.parquet": (0, early.stat().st_size),
        "late.parquet": (0, late.stat().st_size),
    }


def test_the_event_time_option_reaches_the_source_for_parquet(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    from splitflow.spark.files import FilesDataSource

    write_groups(tmp_path / "a.parquet", GROUPS)
    (tmp_path / "b.jsonl").write_text("")

    def build(**options: str) -> FilesDataSource:
        return FilesDataSource({key.lower(): value for key, value in options.items()})

    parquet = build(path=str(tmp_path), pattern="*.parquet", eventTimeColumn="ts")
    assert parquet.create_source().event_time_column == "ts"
    assert parquet.event_time is not None
    assert parquet.event_time.indexed
    lines = build(path=str(tmp_path), format="json", eventTimeColumn="ts")
    assert lines.create_source().event_time_column is None
    assert lines.event_time is not None
    assert not lines.event_time.indexed
    assert build(path=str(tmp_path), format="parquet").create_source().event_time_column is None
