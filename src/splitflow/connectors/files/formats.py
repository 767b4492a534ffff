"""Filesystems, listing, and the three file formats (Parquet, JSON lines, CSV) with pyarrow.

Every format is read by byte range: a split is a file or a byte range of one, and its
positions are byte offsets. A record belongs to the range its first byte is in (Hadoop's
line-split rule): for JSON lines and CSV a line, for Parquet a row group (its first page).
So any slice ``[start, stop)`` the planner cuts reads each record exactly once, whatever
the cuts: a slice that starts inside a line skips to the next line start, and the line that
crosses ``stop`` is read by the slice it started in.
"""

from __future__ import annotations

import io
import json
import posixpath
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.json as pajson
import pyarrow.parquet as pq

from splitflow.errors import ConfigurationError, ConnectorError

FORMATS = ("parquet", "json", "csv")
EXTENSIONS = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".ndjson": "json"}
EXTENSIONS[".csv"] = "csv"


class BadFileError(ConnectorError):
    """A file cannot be read from ``position`` on: corrupt, truncated, changed, or its
    columns do not match the schema. ``path`` and ``position`` (a byte offset) name it."""

    def __init__(self, message: str, *, path: str, position: int) -> None:
        super().__init__(message)
        self.path = path
        self.position = position


# -- filesystems ------------------------------------------------------------------------------


@lru_cache(maxsize=16)
def resolve(uri: str, options: tuple[tuple[str, Any], ...] = ()) -> tuple[pafs.FileSystem, str]:
    """The filesystem of ``uri`` and the path inside it (pyarrow's, else fsspec's).

    ``options``: fsspec storage options (the ``path.<key>`` Spark options); with them the
    filesystem is always fsspec's (``s3fs``, ``adlfs``, ``gcsfs``), without a listings
    cache, so that discovery sees files as they land. Cached per process: executors open
    many splits of the same source.
    """
    if not options:
        try:
            fs, path = pafs.FileSystem.from_uri(uri)
            return fs, str(path)
        except (pa.ArrowInvalid, ValueError, TypeError):
            pass
    try:
        import fsspec  # type: ignore[import-untyped]
    except ImportError as error:  # pragma: no cover - fsspec is a dependency
        raise ConfigurationError(
            f"option path: pyarrow cannot open {uri!r}; install fsspec", option="path"
        ) from error
    kwargs = dict(options)
    if kwargs:
        kwargs.setdefault("use_listings_cache", False)
    try:
        fs, path = fsspec.core.url_to_fs(uri, **kwargs)
    except ImportError as error:
        raise ConfigurationError(
            f"option path: cannot open {uri!r}: {error} (pip install 'splitflow[objectstore]')",
            option="path",
        ) from None
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), str(path)


class FileEntry(NamedTuple):
    """A file found by a listing: its path in the filesystem, size and mtime (ns). A named
    tuple: a listing of every file is made, and compared with the last, at each discovery."""

    path: str
    size: int
    mtime_ns: int


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A glob over '/'-separated relative paths: ``*`` and ``?`` stay within a directory,
    ``**/`` matches any number of directories, ``[...]`` a character class.

    >>> bool(glob_regex("**/*.json").match("a/b/c.json"))
    True
    >>> bool(glob_regex("*.json").match("a/c.json"))
    False
    >>> bool(glob_regex("**/*.json").match("c.json"))
    True
    """
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:[^/]*/)*")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end == -1:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : end].replace("\\", "\\\\")
                out.append(f"[^{body[1:]}]" if body.startswith("!") else f"[{body}]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z")


def list_files(fs: pafs.FileSystem, base: str, pattern: re.Pattern[str] | None) -> list[FileEntry]:
    """Every file under ``base`` (recursive) whose path relative to ``base`` matches.

    Files and directories whose name starts with ``.`` or ``_`` are skipped, as Spark does
    (``_SUCCESS``, ``.part.tmp``): a writer makes a file appear complete by writing it under
    such a name and renaming it. Sorted by path.
    """
    infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    prefix = base.rstrip("/") + "/"
    found = []
    for info in infos:
        if not info.is_file:
            continue
        path = info.path
        relative = path[len(prefix) :] if path.startswith(prefix) else path
        within = "/" + relative  # a part that starts with "." or "_" follows a "/"
        if "/." in within or "/_" in within:
            continue
        if pattern is not None and not pattern.match(relative):
            continue
        found.append(FileEntry(path, info.size or 0, info.mtime_ns or 0))
    found.sort()  # by path: paths differ
    return found


def format_of(path: str) -> str | None:
    """The format a file's extension names (``.parquet``, ``.json``/``.jsonl``, ``.csv``)."""
    return EXTENSIONS.get(posixpath.splitext(path)[1].lower())


# -- schemas ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CsvOptions:
    header: bool = True
    delimiter: str = ","


def infer_schema(
    fs: pafs.FileSystem, entry: FileEntry, fmt: str, csv: CsvOptions, sample_bytes: int = 1 << 20
) -> pa.Schema:
    """The schema of one file (Parquet: its own; JSON/CSV: from its first ``sample_bytes``)."""
    try:
        if fmt == "parquet":
            with fs.open_input_file(entry.path) as f:
                return pq.read_schema(f)
        with fs.open_input_file(entry.path) as f:
            sample = f.read(sample_bytes)
        cut = sample.rfind(b"\n")
        if len(sample) == sample_bytes and cut >= 0:
            sample = sample[: cut + 1]
        if fmt == "json":
            return pajson.read_json(io.BytesIO(sample)).schema
        return pacsv.read_csv(io.BytesIO(sample), **_csv_kwargs(csv, None)).schema
    except (pa.ArrowException, OSError) as error:
        raise ConfigurationError(
            f"option schema: cannot infer a schema from {entry.path} ({error}); give one with "
            ".schema(...) or the schema option",
            option="schema",
        ) from error


def _csv_kwargs(csv: CsvOptions, schema: pa.Schema | None) -> dict[str, object]:
    read = pacsv.ReadOptions(
        use_threads=False,
        autogenerate_column_names=False,
        column_names=None if schema is None else schema.names,
        skip_rows=0,
        block_size=1 << 26,
    )
    parse = pacsv.ParseOptions(delimiter=csv.delimiter, newlines_in_values=False)
    convert = pacsv.ConvertOptions(
        column_types=None if schema is None else {f.name: f.type for f in schema},
        strings_can_be_null=True,
    )
    return {"read_options": read, "parse_options": parse, "convert_options": convert}


def conform(table: pa.Table, schema: pa.Schema, path: str, position: int) -> list[pa.RecordBatch]:
    """``table``'s columns in ``schema``'s order, names, types and nullability, as batches.

    Raises :class:`BadFileError` naming the file and the column when a column is missing,
    cannot be cast, or holds a null where the schema forbids one.
    """
    columns = []
    for field in schema:
        if field.name not in table.column_names:
            if field.nullable:
                columns.append(pa.nulls(table.num_rows, field.type))
                continue
            raise BadFileError(
                f"{path}: column {field.name!r} of the schema is not in the file",
                path=path,
                position=position,
            )
        column = table.column(field.name)
        if column.type != field.type:
            try:
                column = column.cast(field.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
                raise BadFileError(
                    f"{path}: column {field.name!r} is {column.type} in the file, the schema "
                    f"says {field.type} ({error})",
                    path=path,
                    position=position,
                ) from error
        if not field.nullable and column.null_count:
            raise BadFileError(
                f"{path}: column {field.name!r} holds nulls near byte {position} but the "
                "schema says it is not nullable",
                path=path,
                position=position,
            )
        columns.append(column)
    conformed = pa.Table.from_arrays(columns, schema=schema)
    return [b for b in conformed.to_batches() if b.num_rows]


def check_columns(file_schema: pa.Schema, schema: pa.Schema, path: str) -> None:
    """Fail naming the column when a file's schema cannot give ``schema``'s columns.

    Columns of the file that the schema does not name are not read (a projection).
    """
    for field in schema:
        index = file_schema.get_field_index(field.name)
        if index < 0:
            if field.nullable:
                continue
            raise BadFileError(
                f"{path}: column {field.name!r} of the schema is not in the file (the file "
                f"has {', '.join(file_schema.names)})",
                path=path,
                position=0,
            )
        found = file_schema.field(index).type
        if found != field.type and not _castable(found, field.type):
            raise BadFileError(
                f"{path}: column {field.name!r} is {found} in the file, the schema says "
                f"{field.type}",
                path=path,
                position=0,
            )


def _castable(source: pa.DataType, target: pa.DataType) -> bool:
    try:
        pa.array([], type=source).cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False
    return True


# -- reading byte ranges ----------------------------------------------------------------------


class LineRanges:
    """Reads the lines of ``[start, stop)`` of the open file at ``path`` of ``size`` bytes, a
    block at a time.

    A line belongs to the range its first byte is in. ``next_block`` returns the bytes of
    whole lines (a line longer than the block is read whole) and the position after them,
    never beyond ``stop``. A file that turns out shorter than ``size`` (truncated while read)
    raises :class:`BadFileError` at the first byte missing.
    """

    def __init__(
        self, f: pa.NativeFile, size: int, start: int, stop: int, block: int, path: str
    ) -> None:
        self._f, self._size, self._stop, self._block = f, size, stop, block
        self._path = path
        self.position = self._first_line_at_or_after(start)

    def _read(self, at: int, n: int) -> bytes:
        want = min(n, max(0, self._size - at))
        data = bytes(self._f.read_at(want, at)) if want else b""
        if len(data) < want:
            missing = at + len(data)
            raise BadFileError(
                f"{self._path} changed while it was read: byte {missing} of its {self._size} "
                "is gone (truncated): files must not change once they appear (write "
                "elsewhere, then rename into the directory)",
                path=self._path,
                position=missing,
            )
        return data

    def _first_line_at_or_after(self, start: int) -> int:
        if start <= 0:
            return 0
        at = start - 1  # the byte before: a newline there means a line starts at `start`
        while at < self._size:
            chunk = self._read(at, self._block)
            nl = chunk.find(b"\n")
            if nl >= 0:
                return at + nl + 1
            at += len(chunk)
        return self._size

    def skip_line(self) -> None:
        """Move past the line at the current position (a CSV header)."""
        self.position = self._first_line_at_or_after(self.position + 1)

    def next_block(self) -> tuple[bytes, int] | None:
        """``(bytes of whole lines, position after them)``, or None when the range is done."""
        first = self.position
        if first >= self._stop or first >= self._size:
            return None
        data = self._read(first, self._block)
        while True:
            reach = self._stop - first  # lines must start before this offset in `data`
            nl = data.find(b"\n", reach - 1) if reach <= len(data) else data.rfind(b"\n")
            if nl >= 0:
                end = nl + 1
                break
            if first + len(data) >= self._size:
                end = len(data)  # the last line has no newline
                break
            data += self._read(first + len(data), max(self._block, len(data)))
        self.position = first + end
        return data[:end], min(self.position, self._stop)


def parse_lines(
    data: bytes, fmt: str, schema: pa.Schema, csv: CsvOptions, path: str, at: int
) -> pa.Table:
    """Parse whole lines of JSON or CSV at byte ``at`` of ``path`` into ``schema``.

    Raises :class:`BadFileError` naming the first line that does not parse, with the
    table of the lines before it in ``error.good`` (a :class:`PartialParse`).
    """
    try:
        return _parse(data, fmt, schema, csv)
    except pa.ArrowException as error:
        starts = _line_starts(data)
        low, high = 0, len(starts)  # lines[:low] parse; lines[:high] do not
        while high - low > 1:
            mid = (low + high) // 2
            try:
                _parse(data[: _end_of(starts, mid, data)], fmt, schema, csv)
                low = mid
            except pa.ArrowException:
                high = mid
        good_end = _end_of(starts, low, data)
        good = _parse(data[:good_end], fmt, schema, csv) if low else _empty(schema)
        raise PartialParse(
            f"{path}: cannot parse the line at byte {at + good_end}: {error}",
            path=path,
            position=at + good_end,
            good=good,
            good_end=at + good_end,
        ) from error


class PartialParse(BadFileError):
    """A block of lines failed to parse; ``good`` holds the lines before the bad one."""

    def __init__(
        self, message: str, *, path: str, position: int, good: pa.Table, good_end: int
    ) -> None:
        super().__init__(message, path=path, position=position)
        self.good = good
        self.good_end = good_end


def _line_starts(data: bytes) -> list[int]:
    starts = [0]
    at = data.find(b"\n")
    while at >= 0 and at + 1 < len(data):
        starts.append(at + 1)
        at = data.find(b"\n", at + 1)
    return starts


def _end_of(starts: Sequence[int], lines: int, data: bytes) -> int:
    return starts[lines] if lines < len(starts) else len(data)


def _empty(schema: pa.Schema) -> pa.Table:
    return schema.empty_table()


def _parse(data: bytes, fmt: str, schema: pa.Schema, csv: CsvOptions) -> pa.Table:
    if not data.strip():
        return _empty(schema)
    if fmt == "json":
        return pajson.read_json(
            io.BytesIO(data),
            read_options=pajson.ReadOptions(use_threads=False, block_size=max(len(data), 1 << 16)),
            parse_options=pajson.ParseOptions(
                explicit_schema=_nullable(schema), unexpected_field_behavior="error"
            ),
        )
    return pacsv.read_csv(io.BytesIO(data), **_csv_kwargs(csv, _nullable(schema)))


def _nullable(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every field nullable: parsers fill absent fields, conform checks."""
    return pa.schema([f.with_nullable(True) for f in schema])


def csv_header(data: bytes, csv: CsvOptions) -> list[str]:
    """The column names in a CSV header line."""
    table = pacsv.read_csv(
        io.BytesIO(data),
        read_options=pacsv.ReadOptions(use_threads=False),
        parse_options=pacsv.ParseOptions(delimiter=csv.delimiter),
    )
    return list(table.column_names)


def row_group_starts(metadata: pq.FileMetaData) -> list[int]:
    """The byte offset where each row group's data begins (its first page)."""
    starts = []
    for index in range(metadata.num_row_groups):
        group = metadata.row_group(index)
        first = None
        for c in range(group.num_columns):
            column = group.column(c)
            offsets = [column.data_page_offset]
            if column.has_dictionary_page and column.dictionary_page_offset:
                offsets.append(column.dictionary_page_offset)
            low = min(o for o in offsets if o is not None)
            first = low if first is None else min(first, low)
        starts.append(int(first or 0))
    return starts


# -- event time from Parquet statistics --------------------------------------------------------

_UNIT_MICROS = {"milliseconds": (1_000, 1), "microseconds": (1, 1), "nanoseconds": (1, 1_000)}
"""Parquet's timestamp units as (multiply, divide) to microseconds."""
_DAY_MICROS = 86_400_000_000


@dataclass(frozen=True)
class RowGroupTimes:
    """Where each row group of one Parquet file begins, and the range of its event times.

    ``starts[i]`` is row group ``i``'s first byte (:func:`row_group_starts`: the offset a
    split's position is compared with). ``low[i]`` and ``high[i]`` are the least and greatest
    event time in it (microseconds since the epoch), None where the file has no statistics
    for the group. ``timeless[i]`` is true for a group without any event time (no rows, or
    nulls only): it holds no record later than any time.

    Three groups at bytes 4, 100 and 200 holding times 10..20, 15..40 and 50..60:

    >>> times = RowGroupTimes((4, 100, 200), (10, 15, 50), (20, 40, 60), (False,) * 3)
    >>> times.first_time(4, 300), times.first_time(5, 300), times.first_time(201, 300)
    (10, 15, None)
    >>> [times.first_after(0, 300, t) for t in (5, 20, 39, 40, 55, 60)]
    [0, 100, 100, 200, 200, 300]
    >>> times.first_after(4, 150, 45)  # a split of bytes [0, 150) holds the first two groups
    150
    """

    starts: tuple[int, ...]
    low: tuple[int | None, ...]
    high: tuple[int | None, ...]
    timeless: tuple[bool, ...]

    def _groups(self, position: int, end: int) -> Iterator[int]:
        """The groups a split of bytes ``[.., end)`` at ``position`` still has to read."""
        return (i for i, start in enumerate(self.starts) if position <= start < end)

    def first_time(self, position: int, end: int) -> int | None:
        """The least event time of the next group with one, from byte ``position`` (a lower
        bound of the next record's), or None: no such group, or no statistics for it."""
        for i in self._groups(position, end):
            if not self.timeless[i]:
                return self.low[i]
        return None

    def first_after(self, position: int, end: int, event_time: int) -> int:
        """Where the first group from ``position`` begins that may hold an event time after
        ``event_time`` (a group without statistics may), else ``end``: reading
        ``[position, it)`` reads nothing later than ``event_time``. ``position`` itself
        when that group is the next one to read (no record lies before it)."""
        for n, i in enumerate(self._groups(position, end)):
            high = self.high[i]
            if not self.timeless[i] and (high is None or high > event_time):
                return position if n == 0 else self.starts[i]
        return end


def row_group_times(metadata: pq.FileMetaData, column: str) -> RowGroupTimes | None:
    """The event-time index of a Parquet file from its footer's statistics of ``column``.

    None when the file cannot give one: it has no top-level column ``column``, or its type
    is not a timestamp (any unit; one without a time zone is taken as UTC) or a date.
    Groups without statistics have ``low``/``high`` None.
    """
    schema = metadata.schema
    index = next((i for i in range(len(schema)) if schema.column(i).path == column), None)
    if index is None:
        return None
    to_micros = _to_micros(schema.column(index))
    if to_micros is None:
        return None
    low: list[int | None] = []
    high: list[int | None] = []
    timeless = []
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        stats = group.column(index).statistics if group.column(index).is_stats_set else None
        nulls_only = (
            stats is not None and stats.has_null_count and stats.null_count >= group.num_rows
        )
        timeless.append(group.num_rows == 0 or nulls_only)
        if stats is not None and stats.has_min_max:
            low.append(to_micros(stats.min_raw))
            high.append(to_micros(stats.max_raw))
        else:
            low.append(None)
            high.append(None)
    return RowGroupTimes(
        tuple(row_group_starts(metadata)), tuple(low), tuple(high), tuple(timeless)
    )


def _to_micros(column: pq.ColumnSchema) -> Callable[[Any], int] | None:
    """How a raw statistic of ``column`` becomes microseconds since the epoch, if it can."""
    logical = column.logical_type
    if logical.type == "DATE" and column.physical_type == "INT32":
        return lambda raw: int(raw) * _DAY_MICROS
    if logical.type == "TIMESTAMP" and column.physical_type == "INT64":
        unit = json.loads(logical.to_json()).get("timeUnit")
        if unit in _UNIT_MICROS:
            times, per = _UNIT_MICROS[unit]
            return lambda raw: int(raw) * times // per
    return None


__all__ = [
    "FORMATS",
    "BadFileError",
    "CsvOptions",
    "FileEntry",
    "LineRanges",
    "PartialParse",
    "RowGroupTimes",
    "check_columns",
    "conform",
    "csv_header",
    "format_of",
    "glob_regex",
    "infer_schema",
    "list_files",
    "parse_lines",
    "resolve",
    "row_group_starts",
    "row_group_times",
]
