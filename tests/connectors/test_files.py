"""The files connector: contract suites per format, byte-range slicing, bad input, admission."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from splitflow.api.enumerator import SplitExtent
from splitflow.connectors.files import (
    BadFileError,
    CsvOptions,
    FileQuarantinedEvent,
    FileSplit,
    FilesSource,
)
from splitflow.connectors.files.formats import FileEntry, glob_regex
from splitflow.connectors.files.source import FilesEnumerator, FilesStateCodec, cut
from splitflow.errors import ConfigurationError, ConnectorError, DataLossError
from splitflow.reader import Collector, RecordingReaderContext
from splitflow.testing import SourceHarness
from splitflow.testing.contracts import SourceContract, SourceReaderContract

SCHEMA = pa.schema([("file", pa.string()), ("n", pa.int64()), ("text", pa.string())])


def rows_of(name: str, count: int) -> list[dict[str, Any]]:
    return [{"file": name, "n": i, "text": f"{name}-{i}" + "x" * (i % 7)} for i in range(count)]


def write(directory: Path, name: str, rows: list[dict[str, Any]], fmt: str) -> Path:
    """Write ``rows`` as ``name`` (atomically: a dot file renamed into place)."""
    target = directory / name
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.parent / f".{target.name}.tmp"
    if fmt == "json":
        temporary.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "csv":
        lines = ["file,n,text"] + [f"{r['file']},{r['n']},{r['text']}" for r in rows]
        temporary.write_text("\n".join(lines) + "\n")
    else:
        table = pa.Table.from_pylist(rows, schema=SCHEMA)
        pq.write_table(table, temporary, row_group_size=5)
    os.replace(temporary, target)
    return target


def batch_rows(record: Any) -> list[Any]:
    assert isinstance(record, pa.RecordBatch)
    assert record.schema.equals(SCHEMA), record.schema
    return list(zip(*(record.column(i).to_pylist() for i in range(3)), strict=True))


class FilesContract(SourceContract, SourceReaderContract):
    """The suites over a directory of several files, one of them cut into parts."""

    fmt = "json"
    split_bytes = 1 << 20

    def setup_method(self, method: Any) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix=f"files-{self.fmt}-"))
        ext = {"json": "jsonl", "csv": "csv", "parquet": "parquet"}[self.fmt]
        self.written: list[tuple[str, int, str]] = []
        for name, count in (("a", 30), ("b", 12), ("sub/c", 25), ("d", 7), ("e", 1)):
            rows = rows_of(name, count)
            write(self.directory, f"{name}.{ext}", rows, self.fmt)
            self.written += [(r["file"], r["n"], r["text"]) for r in rows]
        self.added = 0

    def teardown_method(self, method: Any) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def make_source(self) -> FilesSource:
        return FilesSource(
            str(self.directory),
            self.fmt,
            SCHEMA,
            split_bytes=self.split_bytes,
            block_bytes=64,
            csv=CsvOptions(header=True),
        )

    def expected_records(self) -> list[Any]:
        return list(self.written)

    def rows(self, record: Any) -> list[Any]:
        return batch_rows(record)

    def record_key(self, record: Any) -> Hashable:
        return tuple(record)

    def record_split_id(self, record: Any) -> str:
        return ""  # unused: ownership is checked on split ids below

    def add_split_upstream(self) -> list[Any]:
        self.added += 1
        name = f"late{self.added}"
        ext = {"json": "jsonl", "csv": "csv", "parquet": "parquet"}[self.fmt]
        rows = rows_of(name, 9)
        write(self.directory, f"{name}.{ext}", rows, self.fmt)
        new = [(r["file"], r["n"], r["text"]) for r in rows]
        self.written += new
        return new

    def change_upstream_between_reads(self) -> None:
        """A live directory gets new files (a file is immutable once in place)."""
        self.add_split_upstream()

    def test_every_split_has_exactly_one_owner(self) -> None:
        harness = self.harness()
        harness.settle()
        splits = [s for ss in harness.reader_splits().values() for s in ss]
        harness.close()
        ids = [s.split_id for s in splits]
        assert len(ids) == len(set(ids))
        assert {s.path for s in splits} == {
            str(p) for p in self.directory.rglob("*") if p.is_file() and not p.name.startswith(".")
        }


class TestJsonFiles(FilesContract):
    fmt = "json"
    split_bytes = 300  # several parts per file: lines cross part boundaries


class TestCsvFiles(FilesContract):
    fmt = "csv"
    split_bytes = 200


class TestParquetFiles(FilesContract):
    fmt = "parquet"
    split_bytes = 400  # row groups of 5 rows; parts take the groups that begin in them


# -- byte-range slicing -----------------------------------------------------------------------


def discovered(source: FilesSource) -> list[FileSplit]:
    """The splits ``source``'s enumerator makes of the directory now."""
    harness = SourceHarness(source, 1)
    harness.settle()
    splits: list[FileSplit] = harness.reader_splits()[0]
    harness.close()
    return splits


def read_slices(source: FilesSource, cuts: list[int]) -> list[Any]:
    """Read every split of ``source`` as consecutive slices ending at ``cuts`` (bytes)."""
    splits = discovered(source)
    out: list[Any] = []
    for split in splits:
        stops = sorted({c for c in cuts if split.start < c < split.end} | {split.end})
        current = split
        for stop in stops:
            context = RecordingReaderContext()
            reader = source.create_reader(context)
            reader.start()
            reader.add_splits([current], stop_at={split.split_id: stop})
            reader.notify_no_more_splits()
            collected: Collector[Any] = Collector()
            for _ in range(10_000):
                status = reader.poll_next(collected)
                if status.value == "end":
                    break
            (current,) = reader.snapshot_state(1) or [
                FileSplit(**{**vars(split), "position": stop})
            ]
            assert current.position == stop
            reader.close()
            out += [row for record in collected for row in batch_rows(record)]
    return out


@pytest.mark.parametrize("fmt", ["json", "csv", "parquet"])
def test_any_cuts_read_every_record_once(tmp_path: Path, fmt: str) -> None:
    rows = rows_of("big", 200)
    write(tmp_path, f"big.{fmt}", rows, fmt)
    size = (tmp_path / f"big.{fmt}").stat().st_size
    source = FilesSource(str(tmp_path), fmt, SCHEMA, block_bytes=50)
    expected = sorted((r["file"], r["n"], r["text"]) for r in rows)
    for cuts in ([], [1], list(range(1, size, 37)), list(range(1, size, 1 + size // 5))):
        assert sorted(read_slices(source, cuts)) == expected, cuts


def test_glob_pattern_matches_relative_paths() -> None:
    assert glob_regex("**/*.json").match("x/y/z.json")
    assert glob_regex("2024-*/*.csv").match("2024-01/a.csv")
    assert not glob_regex("2024-*/*.csv").match("2023-01/a.csv")


def test_hidden_and_underscore_files_are_not_listed(tmp_path: Path) -> None:
    write(tmp_path, "a.json", rows_of("a", 2), "json")
    (tmp_path / "_SUCCESS").write_text("")
    (tmp_path / ".b.json.tmp").write_text("{}\n")
    (tmp_path / "_tmp").mkdir()
    write(tmp_path / "_tmp", "c.json", rows_of("c", 2), "json")
    assert [e.path for e in FilesSource(str(tmp_path), "json").list_files()] == [
        str(tmp_path / "a.json")
    ]


def poll_until_end(reader: Any) -> None:
    for _ in range(1000):
        if reader.poll_next(Collector()).value == "end":
            return


# -- bad input ----------------------------------------------------------------------------------


def read_all(source: FilesSource) -> tuple[list[Any], RecordingReaderContext]:
    splits = discovered(source)
    context = RecordingReaderContext()
    reader = source.create_reader(context)
    reader.start()
    reader.add_splits(splits, stop_at={s.split_id: s.end for s in splits})
    reader.notify_no_more_splits()
    out: Collector[Any] = Collector()
    try:
        for _ in range(10_000):
            if reader.poll_next(out).value == "end":
                break
    finally:
        reader.close()
    return [row for record in out for row in batch_rows(record)], context


def corrupt_json(tmp_path: Path) -> int:
    good = write(tmp_path, "a.json", rows_of("a", 10), "json").read_bytes()
    bad_at = len(good)
    (tmp_path / "a.json").write_bytes(good + b'{"file": "a", "n": oops}\n' + good)
    return bad_at


def test_a_corrupt_line_fails_naming_file_and_byte(tmp_path: Path) -> None:
    bad_at = corrupt_json(tmp_path)
    with pytest.raises(BadFileError) as error:
        read_all(FilesSource(str(tmp_path), "json", SCHEMA, block_bytes=64))
    assert error.value.path == str(tmp_path / "a.json")
    assert error.value.position == bad_at
    assert f"byte {bad_at}" in str(error.value)


def test_quarantine_keeps_the_lines_before_and_reports_the_range(tmp_path: Path) -> None:
    bad_at = corrupt_json(tmp_path)
    source = FilesSource(str(tmp_path), "json", SCHEMA, block_bytes=1 << 20, bad_files="quarantine")
    rows, context = read_all(source)
    assert sorted(rows) == sorted((r["file"], r["n"], r["text"]) for r in rows_of("a", 10))
    (event,) = [e for e in context.events if isinstance(e, FileQuarantinedEvent)]
    size = (tmp_path / "a.json").stat().st_size
    assert (event.path, event.position, event.stop) == (str(tmp_path / "a.json"), bad_at, size)


def test_a_truncated_parquet_file_is_a_bad_file(tmp_path: Path) -> None:
    path = write(tmp_path, "a.parquet", rows_of("a", 20), "parquet")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(BadFileError, match=r"a\.parquet"):
        read_all(FilesSource(str(tmp_path), "parquet", SCHEMA))


def as_another_user(check: Any) -> str:
    """``check()`` in a forked child that, under root, runs as nobody (root reads every
    file, so permission denied cannot happen to it); what it printed, or its error."""
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return into pytest
        os.close(rd)
        result = "the child failed"
        try:
            if os.getuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            result = repr(check())
        except Exception as error:
            result = f"{type(error).__name__}: {error}"
        finally:  # whatever happened (even a BaseException): leave here
            os.write(wr, result.encode())
            os._exit(0)
    os.close(wr)
    with os.fdopen(rd, "rb") as pipe:
        result = pipe.read().decode()
    os.waitpid(pid, 0)
    return result


@pytest.fixture
def open_dir() -> Any:
    """A directory every user may enter (pytest's tmp_path is root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="splitflow-perm-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


@pytest.mark.timeout(60)  # a child that hangs (a lock forked while held) fails, not waits
@pytest.mark.parametrize("fmt", ["json", "csv", "parquet"])
def test_a_file_that_cannot_be_read_is_a_bad_file_and_quarantine_skips_it(
    open_dir: Path, fmt: str
) -> None:
    write(open_dir, f"a.{fmt}", rows_of("a", 5), fmt)
    write(open_dir, f"b.{fmt}", rows_of("b", 5), fmt).chmod(0)
    failing = FilesSource(str(open_dir), fmt, SCHEMA)
    assert as_another_user(lambda: read_all(failing)) == (
        f"BadFileError: {open_dir}/b.{fmt}: cannot open: [Errno 13] Failed to open local file "
        f"'{open_dir}/b.{fmt}'. Detail: [errno 13] Permission denied"
    )
    skipping = FilesSource(str(open_dir), fmt, SCHEMA, bad_files="quarantine")

    def read_and_quarantine() -> tuple[list[Any], list[tuple[str, int]]]:
        rows, context = read_all(skipping)
        events = [e for e in context.events if isinstance(e, FileQuarantinedEvent)]
        return sorted(rows), [(e.path, e.position) for e in events]

    expected = sorted((r["file"], r["n"], r["text"]) for r in rows_of("a", 5))
    assert as_another_user(read_and_quarantine) == repr((expected, [(f"{open_dir}/b.{fmt}", 0)]))


@pytest.mark.timeout(60)
def test_a_directory_that_cannot_be_listed_fails_discovery_naming_the_path(
    open_dir: Path,
) -> None:
    closed = open_dir / "in"
    write(closed, "a.json", rows_of("a", 3), "json")
    closed.chmod(0)
    assert as_another_user(lambda: enumerator(closed).discover_splits()) == (
        f"ConnectorError: option path: cannot list the files under {closed}: [Errno 13] "
        f"Cannot list directory '{closed}'. Detail: [errno 13] Permission denied"
    )


def test_a_file_that_changed_after_discovery_is_a_bad_file(tmp_path: Path) -> None:
    path = write(tmp_path, "a.json", rows_of("a", 20), "json")
    source = FilesSource(str(tmp_path), "json", SCHEMA)
    (split,) = discovered(source)
    path.write_text(path.read_text()[:50])  # truncated
    reader = source.create_reader(RecordingReaderContext())
    reader.start()
    reader.add_splits([split])
    with pytest.raises(BadFileError, match="changed after it was discovered"):
        poll_until_end(reader)
    reader.close()


def read_to_end(lines: Any) -> None:
    while lines.next_block() is not None:
        pass


@pytest.mark.timeout(20)
@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_a_file_truncated_while_it_is_read_is_a_bad_file_not_a_hang(
    tmp_path: Path, fmt: str
) -> None:
    """The reader opened the file at its full size; it is cut short between two blocks: the
    next block fails naming the file and the first byte missing (it used to loop forever
    on empty reads, found by the survey for issue 13)."""
    import pyarrow.fs as pafs

    from splitflow.connectors.files.formats import LineRanges

    path = write(tmp_path, f"a.{fmt}", rows_of("a", 400), fmt)
    size = path.stat().st_size
    with pafs.LocalFileSystem().open_input_file(str(path)) as f:
        lines = LineRanges(f, size, 0, size, 1024, str(path))
        assert lines.next_block() is not None
        with open(path, "r+b") as out:
            out.truncate(1500)
        with pytest.raises(BadFileError) as error:
            read_to_end(lines)
    assert error.value.path == str(path)
    assert error.value.position == 1500
    assert f"{path} changed while it was read: byte 1500" in str(error.value)


def test_schema_mismatch_names_file_and_column(tmp_path: Path) -> None:
    write(tmp_path, "a.parquet", rows_of("a", 3), "parquet")
    other = pa.table({"file": ["b"], "n": ["not a number"], "text": ["t"]})
    pq.write_table(other, tmp_path / "b.parquet")
    with pytest.raises(BadFileError) as error:
        read_all(FilesSource(str(tmp_path), "parquet", SCHEMA))
    assert "b.parquet" in str(error.value)
    assert "'n'" in str(error.value)


def test_an_unexpected_json_field_names_it(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text('{"file": "a", "n": 1, "text": "t", "extra": 2}\n')
    with pytest.raises(BadFileError, match=r"a\.json"):
        read_all(FilesSource(str(tmp_path), "json", SCHEMA))


def test_a_csv_header_that_differs_names_the_column(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("file,count,text\na,1,t\n")
    with pytest.raises(BadFileError, match="'n'"):
        read_all(FilesSource(str(tmp_path), "csv", SCHEMA))


def test_a_vanished_file_under_a_planned_slice_is_data_loss(tmp_path: Path) -> None:
    path = write(tmp_path, "a.json", rows_of("a", 5), "json")
    source = FilesSource(str(tmp_path), "json", SCHEMA)
    (split,) = discovered(source)
    path.unlink()
    reader = source.create_reader(RecordingReaderContext())
    reader.start()
    reader.add_splits([split], stop_at={split.split_id: split.end})
    with pytest.raises(DataLossError, match=r"a\.json"):
        poll_until_end(reader)
    reader.close()


# -- enumerator: admission, age, vanished, state ----------------------------------------------


class FakeContext:
    """The little of a SplitEnumeratorContext that latest_positions-only tests need."""

    current_parallelism = 1
    reports_splits_on_registration = True

    class metrics:
        @staticmethod
        def gauge(name: str, supplier: Any) -> None:
            pass


def enumerator(tmp_path: Path, **options: Any) -> FilesEnumerator:
    source = FilesSource(str(tmp_path), "json", SCHEMA, **options)
    return FilesEnumerator(source, FakeContext(), None)  # type: ignore[arg-type]


def files(tmp_path: Path, sizes: list[int]) -> list[FileSplit]:
    splits = []
    for i, size in enumerate(sizes):
        splits += cut(FileEntry(str(tmp_path / f"f{i}"), size, 10_000 + i), 1 << 30)
    return splits


def done_at(position: int) -> SplitExtent:
    return SplitExtent(position, final=True, bytes_per_position=1.0)


def admitted(extents: dict[str, SplitExtent]) -> list[str]:
    return sorted(Path(s).name for s, e in extents.items() if e.latest > 0)


def test_max_files_per_batch_admits_more_only_once_admitted_files_are_read(
    tmp_path: Path,
) -> None:
    en = enumerator(tmp_path, max_files_per_batch=2)
    splits = files(tmp_path, [10, 10, 10, 10, 10])
    assert admitted(dict(en.latest_positions(splits))) == ["f0", "f1"]
    assert admitted(dict(en.latest_positions(splits))) == ["f0", "f1"]  # still unread
    started = [FileSplit(**{**vars(s), "position": 3}) for s in splits[:1]] + splits[1:]
    assert admitted(dict(en.latest_positions(started))) == ["f0", "f1", "f2"]


def test_admission_over_many_waiting_files_counts_the_unread_admitted_ones_once(
    tmp_path: Path,
) -> None:
    en = enumerator(tmp_path, max_files_per_batch=3)
    splits = files(tmp_path, [10] * 50)
    assert admitted(dict(en.latest_positions(splits))) == ["f0", "f1", "f2"]
    # asked again before any is read (the planner asks twice in a planning): none more
    assert admitted(dict(en.latest_positions(splits))) == ["f0", "f1", "f2"]
    read = [FileSplit(**{**vars(s), "position": 10}) for s in splits[:2]] + splits[2:]
    assert admitted(dict(en.latest_positions(read))) == ["f0", "f1", "f2", "f3", "f4"]


def test_an_extent_answered_again_unchanged_is_the_same_object(tmp_path: Path) -> None:
    """The planner finds the extents that changed by identity: the same answer is the same
    object; a changed one (a file admitted, read, vanished) is a new one."""
    en = enumerator(tmp_path, max_files_per_batch=1)
    splits = files(tmp_path, [10, 10])
    first = dict(en.latest_positions(splits))
    again = dict(en.latest_positions(splits))
    assert all(again[sid] is first[sid] for sid in first)
    read = [FileSplit(**{**vars(splits[0]), "position": 10}), splits[1]]
    now = dict(en.latest_positions(read))
    waiting = splits[1].split_id
    assert now[waiting] is not first[waiting]  # admitted: readable to its end now
    assert now[waiting] == SplitExtent(10, final=True, bytes_per_position=1.0)
    assert now[splits[0].split_id] is first[splits[0].split_id]


def test_a_listing_like_the_last_gives_the_same_splits_and_a_change_new_ones(
    tmp_path: Path,
) -> None:
    write(tmp_path, "a.json", rows_of("a", 3), "json")
    en = enumerator(tmp_path)
    first = en.discover_splits()
    assert en.discover_splits() is first  # the assigner then compares nothing
    write(tmp_path, "b.json", rows_of("b", 2), "json")
    second = en.discover_splits()
    assert [Path(s.path).name for s in second] == ["a.json", "b.json"]
    assert second[0] is first[0]  # a file listed again keeps its split
    write(tmp_path, "a.json", rows_of("a", 5), "json")  # rewritten: another size
    third = en.discover_splits()
    assert third[0] is not first[0]
    assert third[0].size > first[0].size
    assert third[1] is second[1]


def test_latest_first_admits_the_newest(tmp_path: Path) -> None:
    en = enumerator(tmp_path, max_files_per_batch=2, latest_first=True)
    assert admitted(dict(en.latest_positions(files(tmp_path, [10] * 5)))) == ["f3", "f4"]


def test_extents_are_bytes_so_byte_limits_apply(tmp_path: Path) -> None:
    extents = enumerator(tmp_path).latest_positions(files(tmp_path, [100, 10]))
    assert {e.bytes_per_position for e in extents.values()} == {1.0}
    assert sorted(e.latest for e in extents.values()) == [10, 100]


def test_max_file_age_skips_old_files_as_finished(tmp_path: Path) -> None:
    en = enumerator(tmp_path, max_file_age=1e-6)  # 1000 ns
    splits = files(tmp_path, [10, 10])
    old = cut(FileEntry(str(tmp_path / "old"), 10, 1), 1 << 30)
    extents = dict(en.latest_positions(splits + old))
    assert extents[str(tmp_path / "old")] == done_at(0)
    assert admitted(extents) == ["f0", "f1"]


def test_a_file_vanished_unread_fails_or_is_skipped(tmp_path: Path) -> None:
    (split,) = files(tmp_path, [10])
    strict = enumerator(tmp_path)
    strict.on_splits_vanished([split.split_id])
    with pytest.raises(DataLossError, match="f0"):
        strict.latest_positions([split])
    lenient = enumerator(tmp_path, fail_on_data_loss=False)
    lenient.on_splits_vanished([split.split_id])
    assert lenient.latest_positions([split]) == {split.split_id: done_at(0)}
    read = FileSplit(**{**vars(split), "position": 10})
    strict.on_splits_vanished([split.split_id])
    assert strict.latest_positions([read]) == {split.split_id: done_at(10)}


def test_state_round_trips_with_admission_and_quarantine(tmp_path: Path) -> None:
    en = enumerator(tmp_path, max_files_per_batch=1)
    splits = files(tmp_path, [10, 10])
    en.latest_positions(splits)
    en.handle_source_event(0, FileQuarantinedEvent("x", "/p", 3, 9, "bad"))
    state = en.snapshot_state(1)
    codec = FilesStateCodec(FilesSource(str(tmp_path), "json").split_codec)
    decoded = codec.decode(json.loads(json.dumps(codec.encode(state))), codec.version)
    assert decoded == state
    assert decoded.admitted == {splits[0].split_id}
    assert [(q.path, q.position, q.stop) for q in decoded.quarantine] == [("/p", 3, 9)]


def test_changing_the_split_size_on_restore_is_refused(tmp_path: Path) -> None:
    state = enumerator(tmp_path).snapshot_state(1)
    source = FilesSource(str(tmp_path), "json", SCHEMA, split_bytes=1000)
    with pytest.raises(ConfigurationError) as error:
        FilesEnumerator(source, FakeContext(), state)  # type: ignore[arg-type]
    assert error.value.option == "maxSplitBytes"


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"format": "xml"}, "format"),
        ({"clean_source": "shred"}, "cleanSource"),
        ({"bad_files": "ignore"}, "badFiles"),
        ({"clean_source": "archive"}, "sourceArchiveDir"),
        ({"split_bytes": 0}, "maxSplitBytes"),
    ],
)
def test_bad_settings_name_the_option(tmp_path: Path, kwargs: dict[str, Any], option: str) -> None:
    settings: dict[str, Any] = {"format": "json", **kwargs}
    with pytest.raises(ConfigurationError) as error:
        FilesSource(str(tmp_path), settings.pop("format"), SCHEMA, **settings)
    assert error.value.option == option


def test_an_archive_dir_inside_the_source_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="inside the source path"):
        FilesSource(
            str(tmp_path), "json", SCHEMA, clean_source="archive", archive_dir=str(tmp_path / "x")
        )


def test_a_directory_that_vanishes_fails_discovery_naming_the_path(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    write(folder, "a.json", rows_of("a", 3), "json")
    en = enumerator(folder)
    assert len(en.discover_splits()) == 1
    shutil.rmtree(folder)
    with pytest.raises(ConnectorError) as error:
        en.discover_splits()
    assert f"option path: the directory {folder} is gone" in str(error.value)
    assert "failOnDataLoss=false" in str(error.value)


def test_without_fail_on_data_loss_a_vanished_directory_is_waited_for_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    en = enumerator(folder, fail_on_data_loss=False)
    folder.rmdir()
    with caplog.at_level(logging.WARNING, logger="splitflow"):
        assert en.discover_splits() == []
        assert en.discover_splits() == []
    assert [r.getMessage() for r in caplog.records].count(
        f"splitflow: option path: the directory {folder} is gone (it was there when the query "
        "started); waiting for it (failOnDataLoss=false)"
    ) == 1
    folder.mkdir()
    write(folder, "b.json", rows_of("b", 2), "json")
    assert len(en.discover_splits()) == 1
