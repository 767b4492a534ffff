"""The reader of the files source: byte-range slices of Parquet, JSON lines and CSV files.

One :class:`FileSplitReader` holds the slices of one reader slot and returns, per fetch,
one block of one split: a Parquet row group, or a block of whole lines. Splits take turns.
Each element is ``Positioned(batches, next_position)``; :class:`BatchesEmitter` collects the
batches one by one, so a split's position moves only after a whole block, and a snapshot
resumes at a line or row-group boundary (or at the slice's stop).

Bad input follows the source's policy: ``fail`` raises :class:`BadFileError` naming the
file and byte position; ``quarantine`` delivers what parsed before the bad record, skips
the rest of the slice, and tells the enumerator with a :class:`FileQuarantinedEvent`. A
file that vanished follows ``fail_on_data_loss`` like the sequence source.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from splitflow.api.events import SourceEvent
from splitflow.api.reader import ReaderOutput
from splitflow.api.split import SplitState
from splitflow.connectors.files.formats import (
    BadFileError,
    LineRanges,
    PartialParse,
    check_columns,
    conform,
    csv_header,
    parse_lines,
    row_group_starts,
)
from splitflow.connectors.files.splits import FileSplit
from splitflow.errors import DataLossError
from splitflow.reader import Positioned, RecordEmitter, RecordsBySplits, SplitReader, SplitSlice

if TYPE_CHECKING:
    from splitflow.connectors.files.source import FilesSource

log = logging.getLogger("splitflow.connectors.files")

Batches = list[pa.RecordBatch]


@dataclass(frozen=True)
class FileQuarantinedEvent(SourceEvent):
    """Reader -> enumerator: bytes ``[position, stop)`` of ``path`` were skipped as bad."""

    split_id: str
    path: str
    position: int
    stop: int
    reason: str


def file_lost(split: FileSplit, start: int, stop: int, what: str, *, fail: bool) -> None:
    """Bytes ``[start, stop)`` of a vanished file are lost: raise (``fail``) or warn."""
    lost = f"bytes [{start}, {stop}) of {split.path}"
    if fail:
        raise DataLossError(
            f"{lost} {what} (set failOnDataLoss=false to skip vanished files)",
            split_id=split.split_id,
        )
    log.warning("splitflow: %s are lost: the file vanished (failOnDataLoss=false)", lost)


class BatchesEmitter(RecordEmitter[Positioned[Batches], pa.RecordBatch, FileSplit]):
    """Collects each batch of a block, then moves the split past the block."""

    def emit(
        self,
        element: Positioned[Batches],
        output: ReaderOutput[pa.RecordBatch],
        state: SplitState[FileSplit],
    ) -> None:
        for batch in element.value:
            output.collect(batch)
        state.position = element.next_position


class FileSplitReader(SplitReader[Positioned[Batches], FileSplit]):
    """Reads file slices; one block of one split per fetch. ``fetch`` never waits."""

    def __init__(self, source: FilesSource, send: Callable[[SourceEvent], None]) -> None:
        self._source = source
        self._send = send
        self._cursors: dict[str, _Cursor] = {}
        self._turn = 0

    def handle_splits_changes(self, added: Sequence[SplitSlice[FileSplit]]) -> None:
        for piece in added:
            self._cursors[piece.split_id] = _Cursor(self._source, piece)

    def remove_splits(self, split_ids: Sequence[str]) -> None:
        for split_id in split_ids:
            cursor = self._cursors.pop(split_id, None)
            if cursor is not None:
                cursor.close()

    def fetch(self) -> RecordsBySplits[Positioned[Batches]]:
        batch: RecordsBySplits[Positioned[Batches]] = RecordsBySplits()
        if not self._cursors:
            return batch
        ids = list(self._cursors)
        split_id = ids[self._turn % len(ids)]
        self._turn += 1
        cursor = self._cursors[split_id]
        try:
            element = cursor.next_element()
        except BadFileError as error:
            element = self._bad(cursor, error)
        except FileNotFoundError:
            element = self._vanished(cursor)
        if element is not None and (element.value or element.next_position > cursor.position):
            batch.add(split_id, element)
            cursor.position = element.next_position
        if cursor.done or element is None:
            cursor.close()
            del self._cursors[split_id]
            if cursor.position >= cursor.split.end or cursor.skipped:
                batch.mark_ended(split_id)
            else:
                batch.mark_finished(split_id)
        return batch

    def _bad(self, cursor: _Cursor, error: BadFileError) -> Positioned[Batches] | None:
        if self._source.bad_files == "fail":
            raise error
        good: Batches = []
        at = error.position
        if isinstance(error, PartialParse):
            good = conform(error.good, cursor.schema, cursor.split.path, cursor.position)
            at = error.good_end
        stop = cursor.limit
        log.warning(
            "splitflow: quarantined %s bytes [%d, %d): %s", cursor.split.path, at, stop, error
        )
        self._send(
            FileQuarantinedEvent(cursor.split.split_id, cursor.split.path, at, stop, str(error))
        )
        cursor.done = True
        cursor.skipped = stop >= cursor.split.end
        return Positioned(good, stop)

    def _vanished(self, cursor: _Cursor) -> Positioned[Batches] | None:
        file_lost(
            cursor.split,
            cursor.position,
            cursor.limit,
            "were planned for reading but the file no longer exists",
            fail=self._source.fail_on_data_loss,
        )
        cursor.done = True
        cursor.skipped = True
        return Positioned([], cursor.limit)

    def wake_up(self) -> None:
        """Nothing to do: ``fetch`` never blocks on anything but the filesystem."""

    def close(self) -> None:
        for cursor in self._cursors.values():
            cursor.close()
        self._cursors.clear()


class _Cursor:
    """Where one split is read: its open file, position and limit (stop or end)."""

    def __init__(self, source: FilesSource, piece: SplitSlice[FileSplit]) -> None:
        self.source = source
        self.split = piece.split
        self.position = piece.start
        self.limit = piece.split.end if piece.stop is None else min(piece.stop, piece.split.end)
        self.done = False
        self.skipped = False
        self.schema = source.require_schema()
        self._file: pa.NativeFile | None = None
        self._lines: LineRanges | None = None
        self._parquet: pq.ParquetFile | None = None
        self._groups: list[int] = []

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _open(self) -> None:
        split = self.split
        fs, _ = self.source.filesystem()
        info = fs.get_file_info(split.path)
        if info.type == pafs.FileType.NotFound:
            raise FileNotFoundError(split.path)
        size, mtime = int(info.size or 0), int(info.mtime_ns or 0)
        if size != split.size or (split.mtime_ns and mtime != split.mtime_ns):
            raise BadFileError(
                f"{split.path} changed after it was discovered (size {split.size} -> {size}, "
                f"mtime_ns {split.mtime_ns} -> {mtime}): files must not change once they "
                "appear (write elsewhere, then rename into the directory)",
                path=split.path,
                position=self.position,
            )
        try:
            self._file = fs.open_input_file(split.path)
        except FileNotFoundError:
            raise
        except OSError as error:
            raise BadFileError(
                f"{split.path}: cannot open: {error}", path=split.path, position=self.position
            ) from error
        if self.source.format == "parquet":
            self._open_parquet()
        else:
            self._lines = LineRanges(
                self._file, size, self.position, self.limit, self.source.block_bytes, split.path
            )
            if self.source.format == "csv" and self.source.csv.header and self.position == 0:
                self._check_header()

    def _open_parquet(self) -> None:
        assert self._file is not None
        path = self.split.path
        try:
            self._parquet = pq.ParquetFile(self._file)
            metadata = self._parquet.metadata
            self._groups = row_group_starts(metadata)
            file_schema = self._parquet.schema_arrow
        except (pa.ArrowException, OSError) as error:
            raise BadFileError(
                f"{path}: not a readable Parquet file (footer at byte "
                f"{max(0, self.split.size - 8)}): {error}",
                path=path,
                position=self.position,
            ) from error
        check_columns(file_schema, self.schema, path)

    def _check_header(self) -> None:
        assert self._lines is not None
        block = self._lines.next_block()
        self._lines.position = 0
        if block is None:
            return
        line = block[0].split(b"\n", 1)[0] + b"\n"
        names = csv_header(line, self.source.csv)
        expected = self.schema.names
        if names != expected:
            wrong = next(
                (
                    f"{e!r} (the header has {n!r})"
                    for n, e in zip(names, expected, strict=False)
                    if n != e
                ),
                f"{len(expected)} columns (the header has {len(names)})",
            )
            raise BadFileError(
                f"{self.split.path}: the CSV header does not match the schema at column {wrong}",
                path=self.split.path,
                position=0,
            )
        self._lines.skip_line()

    def next_element(self) -> Positioned[Batches] | None:
        """The next block of this slice, or None (and ``done``) when the slice is read."""
        if self.position >= self.limit:
            self.done = True
            return None
        if self._file is None:
            self._open()
        if self._parquet is not None:
            return self._next_row_group()
        assert self._lines is not None
        at = self._lines.position
        block = self._lines.next_block()
        if block is None:
            self.done = True
            return Positioned([], self.limit)
        data, after = block
        table = parse_lines(
            data, self.source.format, self.schema, self.source.csv, self.split.path, at
        )
        batches = conform(table, self.schema, self.split.path, at)
        if after >= self.limit:
            self.done = True
        return Positioned(batches, after)

    def _next_row_group(self) -> Positioned[Batches]:
        assert self._parquet is not None
        path = self.split.path
        for index, start in enumerate(self._groups):
            if self.position <= start < self.limit:
                following = self._groups[index + 1] if index + 1 < len(self._groups) else None
                after = self.limit if following is None else min(following, self.limit)
                try:
                    table = self._parquet.read_row_group(
                        index,
                        columns=[
                            f.name
                            for f in self.schema
                            if f.name in self._parquet.schema_arrow.names
                        ],
                    )
                except (pa.ArrowException, OSError) as error:
                    raise BadFileError(
                        f"{path}: cannot read row group {index} at byte {start}: {error}",
                        path=path,
                        position=start,
                    ) from error
                if after >= self.limit:
                    self.done = True
                return Positioned(conform(table, self.schema, path, start), max(after, start + 1))
        self.done = True
        return Positioned([], self.limit)


__all__ = ["BatchesEmitter", "FileQuarantinedEvent", "FileSplitReader", "file_lost"]
