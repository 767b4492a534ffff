"""The files source under Spark's planner, without Spark: admission, clean-up, data loss.

The planner (``splitflow.spark.planner``) is what Spark's streaming runner drives; here a
test drives it batch by batch, reads each planned slice with the source's own reader, and
checks which files every batch read. Nothing here needs a JVM.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from splitflow.connectors.files import FilesSource
from splitflow.errors import DataLossError, SourceFailedError
from splitflow.reader import Collector, RecordingReaderContext
from splitflow.spark.limits import ReadAll
from splitflow.spark.offset import BatchOffset, plan_partitions
from splitflow.spark.planner import Planner

SCHEMA = pa.schema([("file", pa.string()), ("n", pa.int64())])


def write(directory: Path, name: str, rows: int, mtime: int | None = None) -> Path:
    path = directory / name
    temporary = directory / f".{name}.tmp"
    temporary.write_text("".join(json.dumps({"file": name, "n": i}) + "\n" for i in range(rows)))
    os.replace(temporary, path)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


class Driver:
    """Plans batches like Spark's runner and reads each one with the source's reader."""

    def __init__(self, source: FilesSource, parallelism: int = 2) -> None:
        self.source = source
        ticks = itertools.count()
        # a virtual clock: a second passes between calls, so discovery runs before each batch
        self.planner: Planner[Any, Any] = Planner(
            source, parallelism, clock=lambda: float(next(ticks))
        )
        self.offset: Mapping[str, Any] = self.planner.initial_offset()
        self.batches: list[list[tuple[str, int]]] = []

    def batch(self) -> list[tuple[str, int]] | None:
        """Plan and read the next batch; commit the one before; None if nothing to plan."""
        end = self.planner.latest_offset(self.offset, ReadAll())
        if end.get("seq") == self.offset.get("seq"):
            return None
        rows = read_offset(self.source, self.planner.read_offset(end))
        if self.offset.get("seq"):
            self.planner.commit(self.offset)  # Spark commits batch n once n+1 is planned
        self.offset = end
        self.batches.append(rows)
        return rows

    def run(self, batches: int) -> list[list[tuple[str, int]]]:
        for _ in range(batches):
            self.batch()
        return self.batches

    def rows(self) -> list[tuple[str, int]]:
        return sorted(r for b in self.batches for r in b)

    def close(self) -> None:
        self.planner.close()


def read_offset(source: FilesSource, end: BatchOffset[Any, Any]) -> list[tuple[str, int]]:
    rows: list[tuple[str, int]] = []
    for slot, slices in plan_partitions(end, None):
        reader = source.create_reader(RecordingReaderContext(slot))
        reader.start()
        reader.add_splits([s.split for s in slices], {s.split.split_id: s.stop for s in slices})
        reader.notify_no_more_splits()
        out: Collector[Any] = Collector()
        while reader.poll_next(out).value != "end":
            pass
        reader.close()
        for batch in out:
            rows += zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True)
    return rows


def files_read(batch: list[tuple[str, int]]) -> list[str]:
    return sorted({name for name, _ in batch})


def every_row(counts: Mapping[str, int]) -> list[tuple[str, int]]:
    return sorted((name, i) for name, n in counts.items() for i in range(n))


def source(directory: Path, **options: Any) -> FilesSource:
    return FilesSource(str(directory), "json", SCHEMA, discovery_interval=0.5, **options)


def test_max_files_per_batch_reads_that_many_new_files_per_batch(tmp_path: Path) -> None:
    counts = {f"f{i}.json": 5 + i for i in range(5)}
    for i, (name, rows) in enumerate(counts.items()):
        write(tmp_path, name, rows, mtime=1_000_000 + i)
    driver = Driver(source(tmp_path, max_files_per_batch=2))
    driver.run(6)
    driver.close()
    read = [files_read(b) for b in driver.batches if b]
    assert read == [["f0.json", "f1.json"], ["f2.json", "f3.json"], ["f4.json"]]
    assert driver.rows() == every_row(counts)


def test_latest_first_reads_the_newest_files_first(tmp_path: Path) -> None:
    counts = {f"f{i}.json": 3 for i in range(4)}
    for i, name in enumerate(counts):
        write(tmp_path, name, 3, mtime=1_000_000 + i)
    driver = Driver(source(tmp_path, max_files_per_batch=1, latest_first=True))
    driver.run(6)
    driver.close()
    assert [files_read(b) for b in driver.batches if b] == [
        ["f3.json"],
        ["f2.json"],
        ["f1.json"],
        ["f0.json"],
    ]
    assert driver.rows() == every_row(counts)


def test_max_file_age_skips_files_older_than_the_newest_minus_the_age(tmp_path: Path) -> None:
    write(tmp_path, "old.json", 4, mtime=1_000_000)
    write(tmp_path, "new.json", 4, mtime=1_000_000 + 3600)
    write(tmp_path, "recent.json", 4, mtime=1_000_000 + 3000)
    driver = Driver(source(tmp_path, max_file_age=3600 - 1))
    driver.run(3)
    finished = driver.planner.coordinator.enumerator.finished_splits()
    driver.close()
    assert driver.rows() == every_row({"new.json": 4, "recent.json": 4})
    assert str(tmp_path / "old.json") in finished  # skipped for good: never read later


@pytest.mark.parametrize("mode", ["delete", "archive"])
def test_clean_source_acts_after_the_batch_that_finished_the_file_committed(
    tmp_path: Path, mode: str
) -> None:
    directory, archive = tmp_path / "in", tmp_path / "archive"
    directory.mkdir()
    write(directory, "a.json", 3)
    options: dict[str, Any] = {"clean_source": mode}
    if mode == "archive":
        options["archive_dir"] = str(archive)
    driver = Driver(source(directory, **options))
    driver.batch()  # reads a.json
    assert (directory / "a.json").exists()
    driver.batch()  # records a.json finished; commits the batch that read it
    assert (directory / "a.json").exists(), "cleaned before the finish was checkpointed"
    write(directory, "b.json", 2)
    driver.batch()  # reads b.json; commits the batch that recorded a.json finished
    driver.close()
    assert not (directory / "a.json").exists()
    assert (directory / "b.json").exists()
    assert (archive / "a.json").exists() == (mode == "archive")
    assert driver.rows() == every_row({"a.json": 3, "b.json": 2})


def test_a_file_that_vanishes_unread_fails_the_query(tmp_path: Path) -> None:
    write(tmp_path, "a.json", 3, mtime=1_000_000)
    write(tmp_path, "b.json", 3, mtime=1_000_001)
    driver = Driver(source(tmp_path, max_files_per_batch=1))
    driver.batch()
    (tmp_path / "b.json").unlink()
    with pytest.raises((DataLossError, SourceFailedError)) as error:
        driver.run(2)
    cause = error.value if isinstance(error.value, DataLossError) else error.value.__cause__
    assert isinstance(cause, DataLossError)
    assert "b.json" in str(cause)
    assert "never read" in str(cause)
    driver.close()


def test_a_file_that_vanishes_unread_is_skipped_without_fail_on_data_loss(
    tmp_path: Path,
) -> None:
    write(tmp_path, "a.json", 3, mtime=1_000_000)
    write(tmp_path, "b.json", 3, mtime=1_000_001)
    driver = Driver(source(tmp_path, max_files_per_batch=1, fail_on_data_loss=False))
    driver.batch()
    (tmp_path / "b.json").unlink()
    write(tmp_path, "c.json", 2, mtime=1_000_002)
    driver.run(4)
    driver.close()
    assert driver.rows() == every_row({"a.json": 3, "c.json": 2})


def test_a_file_read_before_it_vanished_is_not_data_loss(tmp_path: Path) -> None:
    write(tmp_path, "a.json", 3)
    driver = Driver(source(tmp_path))
    driver.batch()
    (tmp_path / "a.json").unlink()
    write(tmp_path, "b.json", 2)
    driver.run(3)
    driver.close()
    assert driver.rows() == every_row({"a.json": 3, "b.json": 2})


def test_a_restart_never_reads_a_finished_file_again(tmp_path: Path) -> None:
    write(tmp_path, "a.json", 3)
    first = Driver(source(tmp_path))
    first.run(2)
    first.close()
    write(tmp_path, "b.json", 2)
    second = Driver(source(tmp_path))
    second.offset = first.offset  # the restart resumes from the last offset
    second.run(3)
    second.close()
    assert first.rows() == every_row({"a.json": 3})
    assert second.rows() == every_row({"b.json": 2})


def test_available_now_reads_every_file_across_batches_with_max_files(tmp_path: Path) -> None:
    counts = {f"f{i}.json": 2 for i in range(3)}
    for i, name in enumerate(counts):
        write(tmp_path, name, 2, mtime=1_000_000 + i)
    driver = Driver(source(tmp_path, max_files_per_batch=1))
    driver.planner.prepare_available_now()
    driver.run(6)
    driver.close()
    assert driver.rows() == every_row(counts)


def test_files_found_when_a_run_starts_are_backlog_and_files_that_appear_later_are_live(
    tmp_path: Path,
) -> None:
    write(tmp_path, "old-1.json", 3)
    write(tmp_path, "old-2.json", 3)
    driver = Driver(source(tmp_path))
    assert driver.planner.in_backlog  # two files waited when the query started
    driver.batch()
    driver.batch()  # the batch after the one that read them: their boundaries are reached
    assert not driver.planner.in_backlog
    write(tmp_path, "new.json", 2)  # the live stream
    driver.batch()
    assert driver.batches[-1] == [("new.json", 0), ("new.json", 1)]
    assert not driver.planner.read_offset(driver.offset).backlog
    offset = driver.offset
    driver.close()

    write(tmp_path, "while-down.json", 4)  # piled up while the query was down: backlog
    restarted = Driver(source(tmp_path))
    restarted.offset = offset
    restarted.batch()
    assert restarted.batches[-1] == [("while-down.json", i) for i in range(4)]
    assert restarted.planner.read_offset(restarted.offset).backlog
    restarted.close()


def test_a_byte_budget_cuts_batches_by_file_bytes_and_reads_every_row_once(
    tmp_path: Path,
) -> None:
    """``maxBytesPerBatch``: positions are bytes, so a batch reads about that many bytes
    (whole lines: one that crosses the budget is read by the slice it starts in)."""
    from splitflow.spark.limits import MaxBytes

    sizes = [write(tmp_path, f"{name}.json", 200).stat().st_size for name in "ab"]
    files = source(tmp_path)
    planner: Planner[Any, Any] = Planner(files, 2, clock=lambda: 0.0)
    offset = planner.initial_offset()
    rows: list[tuple[str, int]] = []
    stops = []
    while True:
        end = planner.latest_offset(offset, MaxBytes(1_000))
        if end["seq"] == offset["seq"]:
            break
        decoded = BatchOffset.decode(end, files)
        stops.append(sum(s.records for i in range(decoded.parallelism) for s in decoded.reading(i)))
        rows += read_offset(files, decoded)
        offset = end
    planner.close()
    assert sorted(rows) == every_row({"a.json": 200, "b.json": 200})
    assert all(planned <= 1_000 for planned in stops)
    assert len(stops) >= sum(sizes) // 1_000
