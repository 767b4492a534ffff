"""The files source: a directory tree of Parquet, JSON lines or CSV files, read exactly once.

* **Splits.** A file of at most ``split_bytes`` is one split; a larger one is cut into byte
  ranges of ``split_bytes`` (part ``i`` of ``n``). Split ids are the file's path, or
  ``path#i`` for a part, so the set of finished ids (the enumerator's ledger) says which
  files were read, across restarts. Positions are byte offsets in the file.
* **Discovery.** Every ``discovery_interval`` seconds the directory is listed; new files
  become splits (with the size and mtime seen, so a file that changes afterwards is
  detected when it is read). A file already read is never read again.
* **Admission.** ``latest_positions`` (called when Spark plans a batch) lets a file be read
  only once it is *admitted*: at most ``max_files_per_batch`` admitted files wait unread at
  any time, so a batch starts at most that many new files, oldest first (newest first with
  ``latest_first``). Positions are bytes, so
  the runtime's byte limits (Spark's ``maxBytesPerBatch``) cut batches by file bytes.
  ``max_file_age`` skips, with a warning, new files older than the newest file seen minus
  that age.
* **Clean-up.** With ``clean_source`` ``delete`` or ``archive``, a file is deleted or moved
  to ``archive_dir`` once the checkpoint that records it as finished completed.
* **Event time.** For Parquet, with ``event_time_column`` (Spark's ``eventTimeColumn``), the
  enumerator answers ``event_times`` and ``positions_after`` from the row-group statistics
  in each file's footer (:class:`~splitflow.connectors.files.formats.RowGroupTimes`), read
  once per file and run; JSON lines and CSV have no statistics, so they have no index.
* **Bad input.** See :mod:`splitflow.connectors.files.reader`; quarantined ranges are kept
  in the enumerator state (:attr:`FilesState.quarantine`), visible in every checkpoint.
"""

from __future__ import annotations

import logging
import math
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from splitflow.api.assigner import AssignerState, AssignerStateCodec, AssigningSplitEnumerator
from splitflow.api.enumerator import SplitEnumerator, SplitEnumeratorContext, SplitExtent
from splitflow.api.events import SourceEvent, SplitsFinishedEvent
from splitflow.api.reader import SourceReader, SourceReaderContext
from splitflow.api.source import Boundedness, Source, SupportsSplitReassignmentOnRecovery
from splitflow.api.split import Codec, DataclassCodec, JsonDict
from splitflow.connectors.files.formats import (
    FORMATS,
    CsvOptions,
    FileEntry,
    RowGroupTimes,
    format_of,
    glob_regex,
    infer_schema,
    list_files,
    resolve,
    row_group_times,
)
from splitflow.connectors.files.reader import (
    BatchesEmitter,
    FileQuarantinedEvent,
    FileSplitReader,
    file_lost,
)
from splitflow.connectors.files.splits import FileSplit as FileSplit  # also its old place
from splitflow.connectors.files.splits import split_id
from splitflow.errors import ConfigurationError, ConnectorError, ContractViolation
from splitflow.reader import SourceReaderBase

log = logging.getLogger("splitflow.connectors.files")

CLEAN_SOURCE = ("off", "delete", "archive")
BAD_FILES = ("fail", "quarantine")


def cut(entry: FileEntry, split_bytes: int) -> list[FileSplit]:
    """The splits of one file: byte ranges of at most ``split_bytes`` (one for an empty file).

    >>> [(s.split_id, s.start, s.end) for s in cut(FileEntry("/d/a.json", 250, 1), 100)]
    [('/d/a.json#0', 0, 100), ('/d/a.json#1', 100, 200), ('/d/a.json#2', 200, 250)]
    """
    parts = max(1, math.ceil(entry.size / split_bytes))
    return [
        FileSplit(
            entry.path,
            i,
            parts,
            i * split_bytes,
            min((i + 1) * split_bytes, entry.size),
            entry.size,
            entry.mtime_ns,
            i * split_bytes,
        )
        for i in range(parts)
    ]


@dataclass(frozen=True)
class QuarantineEntry:
    """Bytes ``[position, stop)`` of ``path`` were skipped because of ``reason``."""

    path: str
    position: int
    stop: int
    reason: str


@dataclass(frozen=True)
class FilesState(AssignerState[FileSplit]):
    """The files enumerator's snapshot: the assigner's, plus what the files source adds.

    ``admitted``: ids of unfinished splits admitted for reading. ``quarantine``: byte
    ranges skipped as bad (``badFiles=quarantine``), in the order they were reported.
    ``skipped``: unfinished splits skipped by ``max_file_age`` or data loss, to be finished.
    ``split_bytes``: the cut the split ids were made with (it must not change).
    ``cleaning``: paths of finished files that ``cleanSource`` has not cleaned yet (a
    restored enumerator cleans them once its first checkpoint completes).
    """

    admitted: frozenset[str] = frozenset()
    skipped: frozenset[str] = frozenset()
    quarantine: tuple[QuarantineEntry, ...] = ()
    split_bytes: int = 0
    newest_mtime_ns: int = 0
    cleaning: tuple[str, ...] = ()


class FilesStateCodec(AssignerStateCodec[FileSplit]):
    """Encodes :class:`FilesState`; the finished ids are the ledger (see the assigner codec)."""

    version = 1

    def encode(self, value: AssignerState[FileSplit]) -> JsonDict:
        data = super().encode(value)
        state = value if isinstance(value, FilesState) else FilesState(**vars(value))
        data["files"] = {
            "admitted": sorted(state.admitted),
            "skipped": sorted(state.skipped),
            "quarantine": [[q.path, q.position, q.stop, q.reason] for q in state.quarantine],
            "split_bytes": state.split_bytes,
            "newest_mtime_ns": state.newest_mtime_ns,
            **({"cleaning": list(state.cleaning)} if state.cleaning else {}),
        }
        return data

    def decode(self, data: Mapping[str, Any], version: int) -> FilesState:
        base = super().decode(data, version)
        files = data.get("files", {})
        return FilesState(
            **vars(base),
            admitted=frozenset(files.get("admitted", ())),
            skipped=frozenset(files.get("skipped", ())),
            quarantine=tuple(
                QuarantineEntry(str(p), int(a), int(b), str(r))
                for p, a, b, r in files.get("quarantine", ())
            ),
            split_bytes=int(files.get("split_bytes", 0)),
            newest_mtime_ns=int(files.get("newest_mtime_ns", 0)),
            cleaning=tuple(str(p) for p in files.get("cleaning", ())),
        )


def _extent(latest: int, final: bool, available: int | None = None) -> SplitExtent:
    """A split's extent; positions are byte offsets, so one position is one byte."""
    return SplitExtent(latest, final=final, bytes_per_position=1.0, available=available)


class FilesEnumerator(AssigningSplitEnumerator[FileSplit]):
    """Lists the directory, admits files for reading, cleans finished files up."""

    def __init__(
        self,
        source: FilesSource,
        context: SplitEnumeratorContext[FileSplit],
        state: AssignerState[FileSplit] | None,
    ) -> None:
        super().__init__(context, discovery_interval=source.discovery_interval, state=state)
        self._source = source
        files = state if isinstance(state, FilesState) else FilesState()
        if state is not None and files.split_bytes and files.split_bytes != source.split_bytes:
            raise ConfigurationError(
                f"option maxSplitBytes: the checkpoint's files were cut into splits of "
                f"{files.split_bytes} bytes, this query says {source.split_bytes}; split ids "
                "would change and files be read again: keep the option as it was",
                option="maxSplitBytes",
            )
        self._admitted: set[str] = set(files.admitted)
        self._skipped: set[str] = set(files.skipped)
        self._quarantine: list[QuarantineEntry] = list(files.quarantine)
        self._newest = files.newest_mtime_ns
        self._vanished: set[str] = set()
        # Admitted splits not seen read yet: a file counts against maxFilesPerBatch until
        # a batch has started reading it (restored ones count until seen).
        self._fresh: set[str] = set(files.admitted)
        self._restored_finished = frozenset(files.finished)
        self._finished_now: set[str] = set()
        # path -> checkpoint recording it finished; restored ones: recorded by a committed one
        self._to_clean: dict[str, int | None] = dict.fromkeys(files.cleaning, 0)
        self._parts: dict[str, int] = {}  # path -> parts, for files seen in this run
        self._path_of: dict[str, str] = {}  # split id -> path, for splits seen in this run
        self._directory_gone = False  # the last discovery found no directory (warned)
        # The last listing and its splits: a listing equal to the last gives the same tuple
        # (the assigner then compares nothing), and a file listed again keeps its splits.
        self._files_listed: tuple[list[FileEntry], tuple[FileSplit, ...]] = ([], ())
        self._cuts: dict[FileEntry, list[FileSplit]] = {}
        # Each split's extent as answered last, answered again while it is the same (the
        # planner then finds it unchanged by identity): one entry per held split.
        self._extents: dict[str, SplitExtent] = {}
        # path -> ((size, mtime_ns) read, its event-time index): footers read once per file
        self._times: dict[str, tuple[tuple[int, int], RowGroupTimes | None]] = {}
        context.metrics.gauge("quarantinedRanges", lambda: len(self._quarantine))
        context.metrics.gauge("admittedSplits", lambda: len(self._admitted))

    # -- discovery (worker thread) ----------------------------------------------------------

    def discover_splits(self) -> Sequence[FileSplit]:
        """The files' splits; a directory that is gone is data loss (its unread files are):
        it fails discovery naming option path, or with ``failOnDataLoss=false`` is waited
        for with a warning (each file then vanishes under its own policy)."""
        entries = self._source.list_files()
        if not entries and not self._source.directory_exists():
            message = (
                f"option path: the directory {self._source.path} is gone (it was there when "
                "the query started)"
            )
            if self._source.fail_on_data_loss:
                raise ConnectorError(
                    f"{message}: restore it, or set failOnDataLoss=false to wait for it"
                )
            if not self._directory_gone:
                log.warning("splitflow: %s; waiting for it (failOnDataLoss=false)", message)
            self._directory_gone = True
            return []
        self._directory_gone = False
        if entries == self._files_listed[0]:
            return self._files_listed[1]
        cuts, size = self._cuts, self._source.split_bytes
        self._cuts = {entry: cuts.get(entry) or cut(entry, size) for entry in entries}
        splits = tuple(split for parts in self._cuts.values() for split in parts)
        self._files_listed = entries, splits
        return splits

    def on_splits_vanished(self, split_ids: Sequence[str]) -> None:
        """Remembered: ``latest_positions`` decides whether unread bytes were lost."""
        self._vanished.update(split_ids)

    # -- planning (coordinator thread) ------------------------------------------------------

    def latest_positions(self, splits: Sequence[FileSplit]) -> Mapping[str, SplitExtent]:
        result: dict[str, SplitExtent] = {}
        pending: dict[str, list[FileSplit]] = {}
        for split in splits:
            sid = split.split_id
            self._parts[split.path] = split.parts
            self._path_of[sid] = split.path
            if sid in self._vanished:
                result[sid] = self._vanished_extent(split)
            elif sid in self._skipped:
                result[sid] = self._extent_of(sid, split.position, True)
            elif sid in self._admitted:
                if split.position > split.start or split.position >= split.end:
                    self._fresh.discard(sid)
                result[sid] = self._extent_of(sid, split.end, True)
            else:
                pending.setdefault(split.path, []).append(split)
                self._newest = max(self._newest, split.mtime_ns)
        for _path, parts in self._admit(pending):
            for split in parts:
                self._admitted.add(split.split_id)
                self._fresh.add(split.split_id)
                result[split.split_id] = self._extent_of(split.split_id, split.end, True)
        for parts in pending.values():
            for split in parts:
                sid = split.split_id
                if sid not in result:
                    final = sid in self._skipped  # too old: finished unread
                    waits = None if final else split.end  # for admission
                    result[sid] = self._extent_of(sid, split.position, final, waits)
        return result

    def _extent_of(
        self, sid: str, latest: int, final: bool, available: int | None = None
    ) -> SplitExtent:
        """Split ``sid``'s extent: the one answered last while it is the same."""
        kept = self._extents.get(sid)
        if (
            kept is not None
            and kept.latest == latest
            and kept.final == final
            and kept.available == available
        ):
            return kept
        extent = self._extents[sid] = _extent(latest, final, available)
        return extent

    def event_times(self, splits: Sequence[FileSplit]) -> Mapping[str, int]:
        """The least event time in the next row group of each split (a lower bound of its
        next record's), from the Parquet footer's statistics.

        Called by: the coordinator thread, when the runtime aligns splits by event time.
        Blocking: reads the footer of each file not seen before (once per file and run; a
        file is forgotten when read or vanished).
        Left out: splits of files without an index (not Parquet, no usable column, an
        unreadable footer), splits with no row group left, and row groups without statistics.
        """
        result = {}
        for split in splits:
            times = self._times_of(split)
            first = None if times is None else times.first_time(split.position, split.end)
            if first is not None:
                result[split.split_id] = first
        return result

    def positions_after(self, splits: Sequence[FileSplit], event_time: int) -> Mapping[str, int]:
        """Where the first row group from each split's position begins that may hold an
        event time after ``event_time`` (its statistics say so, or it has none), else the
        split's end. That is the position itself when its next row group may.

        Called by, blocking and left out: as :meth:`event_times`.
        """
        result = {}
        for split in splits:
            times = self._times_of(split)
            if times is not None:
                result[split.split_id] = times.first_after(split.position, split.end, event_time)
        return result

    def _times_of(self, split: FileSplit) -> RowGroupTimes | None:
        """The event-time index of ``split``'s file, its footer read on first use."""
        column = self._source.event_time_column
        if column is None:
            return None
        identity = (split.size, split.mtime_ns)
        cached = self._times.get(split.path)
        if cached is not None and cached[0] == identity:
            return cached[1]
        try:
            times = self._source.row_group_times(split.path, split.size, column)
        except OSError as error:  # perhaps passing (a vanished file is the reader's to report)
            log.debug("splitflow: no event-time index for %s: %s", split.path, error)
            return None
        self._times[split.path] = (identity, times)
        return times

    def _fresh_files(self) -> int:
        return len({self._path_of.get(sid, sid) for sid in self._fresh})

    def backlog_boundary(
        self, split: FileSplit, extent: SplitExtent | None, at_start: bool
    ) -> int | None:
        """Files found when a run starts are backlog until read (FLIP-309), admitted or still
        waiting for admission: they piled up before the query (re)started. Files that
        appear while it runs are the live stream; a pile of them re-enters backlog through
        ``backlogLagThreshold``."""
        return split.end if at_start else None

    def _vanished_extent(self, split: FileSplit) -> SplitExtent:
        if split.position < split.end:  # else: it was read before it vanished
            file_lost(
                split,
                split.position,
                split.end,
                "were never read: the file vanished",
                fail=self._source.fail_on_data_loss,
            )
            self._skipped.add(split.split_id)
        self._times.pop(split.path, None)
        return self._extent_of(split.split_id, split.position, True)

    def _admit(self, pending: Mapping[str, list[FileSplit]]) -> list[tuple[str, list[FileSplit]]]:
        """Files admitted now, within what is left of this checkpoint's budget."""
        source = self._source
        order = sorted(
            pending.items(),
            key=lambda item: (item[1][0].mtime_ns, item[0]),
            reverse=source.latest_first,
        )
        admitted: list[tuple[str, list[FileSplit]]] = []
        too_old = []
        fresh = self._fresh_files()  # counted once: nothing below changes it
        for path, parts in order:
            if source.max_file_age is not None and not (
                parts[0].mtime_ns >= self._newest - int(source.max_file_age * 1e9)
            ):
                too_old.append(path)
                for split in parts:
                    self._skipped.add(split.split_id)
                continue
            limit = source.max_files_per_batch
            if limit is not None and fresh + len(admitted) >= limit:
                continue
            admitted.append((path, parts))
        if too_old:
            log.warning(
                "splitflow: %d file(s) skipped, older than maxFileAge (%gs) before the newest "
                "file seen: %s",
                len(too_old),
                source.max_file_age,
                ", ".join(too_old[:10]),
            )
        return admitted

    # -- events and checkpoints ---------------------------------------------------------------

    def handle_source_event(self, reader_id: int, event: SourceEvent) -> None:
        if isinstance(event, FileQuarantinedEvent):
            entry = QuarantineEntry(event.path, event.position, event.stop, event.reason)
            if entry not in self._quarantine:
                self._quarantine.append(entry)
            return
        super().handle_source_event(reader_id, event)
        if isinstance(event, SplitsFinishedEvent):
            for sid in event.split_ids:
                self._file_split_finished(sid)

    def _file_split_finished(self, sid: str) -> None:
        self._admitted.discard(sid)
        self._fresh.discard(sid)
        self._skipped.discard(sid)
        self._vanished.discard(sid)
        self._extents.pop(sid, None)
        self._finished_now.add(sid)
        path = self._path_of.pop(sid, sid)
        parts = self._parts.get(path, 1)
        done = self._finished_now | self._restored_finished
        if all(split_id(path, i, parts) in done for i in range(parts)):
            self._parts.pop(path, None)
            self._times.pop(path, None)
            self._finished_now.difference_update(split_id(path, i, parts) for i in range(parts))
            if self._source.clean_source != "off":
                self._to_clean.setdefault(path, None)

    def snapshot_state(self, checkpoint_id: int) -> FilesState:
        base = super().snapshot_state(checkpoint_id)
        for path, tagged in self._to_clean.items():
            if tagged is None:
                self._to_clean[path] = checkpoint_id
        return FilesState(
            **vars(base),
            admitted=frozenset(self._admitted),
            skipped=frozenset(self._skipped),
            quarantine=tuple(self._quarantine),
            split_bytes=self._source.split_bytes,
            newest_mtime_ns=self._newest,
            cleaning=tuple(sorted(self._to_clean)),
        )

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        if self._source.clean_source == "off":
            self._to_clean.clear()
            return
        ready = [p for p, c in self._to_clean.items() if c is not None and c <= checkpoint_id]
        for path in ready:
            del self._to_clean[path]
        if ready:
            source = self._source
            self.context.call_async(lambda: source.clean(ready), self._cleaned)

    def _cleaned(self, result: list[str] | None, error: BaseException | None) -> None:
        if error is not None:
            log.warning("splitflow: cleanSource failed: %s", error)
        for problem in result or ():
            log.warning("splitflow: cleanSource: %s", problem)

    def quarantine(self) -> list[QuarantineEntry]:
        return list(self._quarantine)


class FilesSource(
    Source[pa.RecordBatch, FileSplit, AssignerState[FileSplit]],
    SupportsSplitReassignmentOnRecovery,
):
    """Files under ``path`` (any filesystem pyarrow or fsspec reaches), as Arrow batches.

    ``schema``: the Arrow schema of the rows (None: readers cannot be made; see
    :meth:`infer_schema`). The other arguments are described in the module doc and in
    ``docs/files.md``; each invalid one raises ConfigurationError naming its Spark option.
    """

    def __init__(
        self,
        path: str,
        format: str,
        schema: pa.Schema | None = None,
        *,
        pattern: str | None = None,
        discovery_interval: float | None = 1.0,
        split_bytes: int = 128 << 20,
        block_bytes: int = 4 << 20,
        max_files_per_batch: int | None = None,
        latest_first: bool = False,
        max_file_age: float | None = None,
        clean_source: str = "off",
        archive_dir: str | None = None,
        bad_files: str = "fail",
        fail_on_data_loss: bool = True,
        csv: CsvOptions | None = None,
        bounded: bool = False,
        event_time_column: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        if format not in FORMATS:
            raise ConfigurationError(
                f"option format: {format!r} is not one of {', '.join(FORMATS)}", option="format"
            )
        for option, value in (("maxSplitBytes", split_bytes), ("blockBytes", block_bytes)):
            if value < 1:
                raise ConfigurationError(f"option {option} must be at least 1", option=option)
        if discovery_interval is not None and not discovery_interval > 0:
            raise ConfigurationError(
                f"option discoveryInterval must be above 0, got {discovery_interval}",
                option="discoveryInterval",
            )
        if clean_source not in CLEAN_SOURCE:
            raise ConfigurationError(
                f"option cleanSource: {clean_source!r} is not one of {', '.join(CLEAN_SOURCE)}",
                option="cleanSource",
            )
        if bad_files not in BAD_FILES:
            raise ConfigurationError(
                f"option badFiles: {bad_files!r} is not one of {', '.join(BAD_FILES)}",
                option="badFiles",
            )
        self.path = path
        self.format = format
        self.schema = schema
        self.pattern = pattern
        self.discovery_interval = discovery_interval
        self.split_bytes = split_bytes
        self.block_bytes = block_bytes
        self.max_files_per_batch = max_files_per_batch
        self.latest_first = latest_first
        self.max_file_age = max_file_age
        self.clean_source = clean_source
        self.archive_dir = archive_dir
        self.bad_files = bad_files
        self.fail_on_data_loss = fail_on_data_loss
        self.csv = csv or CsvOptions()
        self.bounded = bounded
        self.time_column = event_time_column
        self._storage = tuple(sorted((storage_options or {}).items()))  # may hold credentials
        _, base = self.filesystem()
        if clean_source == "archive":
            if not archive_dir:
                raise ConfigurationError(
                    "option sourceArchiveDir is required with cleanSource=archive",
                    option="sourceArchiveDir",
                )
            _, archive = resolve(archive_dir, self._storage)
            if (archive.rstrip("/") + "/").startswith(base.rstrip("/") + "/"):
                raise ConfigurationError(
                    f"option sourceArchiveDir: {archive_dir!r} is inside the source path "
                    f"{path!r}; archived files would be read again",
                    option="sourceArchiveDir",
                )

    # -- files --------------------------------------------------------------------------------

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        return resolve(self.path, self._storage)

    def list_files(self) -> list[FileEntry]:
        """The files to read; ConnectorError naming option path if they cannot be listed
        (permission denied, an unreachable file system)."""
        fs, base = self.filesystem()
        try:
            return list_files(fs, base, glob_regex(self.pattern) if self.pattern else None)
        except OSError as error:
            raise ConnectorError(
                f"option path: cannot list the files under {self.path}: {error}"
            ) from error

    def directory_exists(self) -> bool:
        fs, base = self.filesystem()
        return bool(fs.get_file_info(base).type == pafs.FileType.Directory)

    def infer_schema(self) -> pa.Schema:
        """The schema of the first file (in path order); ConfigurationError if there is none."""
        files = self.list_files()
        if not files:
            raise ConfigurationError(
                f"option schema: no file under {self.path!r} to infer the schema from; give "
                "a schema (.schema(...) or the schema option) or add a file first",
                option="schema",
            )
        fs, _ = self.filesystem()
        return infer_schema(fs, files[0], self.format, self.csv)

    def row_group_times(self, path: str, size: int, column: str) -> RowGroupTimes | None:
        """The event-time index of ``column`` in the Parquet file at ``path`` (its footer).

        None when the file has none: ``column`` is not a timestamp or date in it, the footer
        is unreadable, or the file is no longer ``size`` bytes (it changed; the reader
        reports that). Raises OSError when the file cannot be opened. May block (I/O).
        """
        fs, _ = self.filesystem()
        with fs.open_input_file(path) as f:
            if f.size() != size:
                return None
            try:
                metadata = pq.read_metadata(f)
            except pa.ArrowException as error:
                if isinstance(error, OSError):
                    raise
                log.debug("splitflow: no event-time index for %s: %s", path, error)
                return None
        return row_group_times(metadata, column)

    def require_schema(self) -> pa.Schema:
        if self.schema is None:
            raise ContractViolation("FilesSource has no schema: pass one or use infer_schema()")
        return self.schema

    def clean(self, paths: Sequence[str]) -> list[str]:
        """Delete or archive ``paths``; return a description of each failure (worker thread).
        A path already gone is done (a restored enumerator may clean again what the run
        before it cleaned just before it stopped)."""
        fs, base = self.filesystem()
        problems = []
        for path in paths:
            try:
                if fs.get_file_info(path).type == pafs.FileType.NotFound:
                    continue
                if self.clean_source == "delete":
                    fs.delete_file(path)
                else:
                    assert self.archive_dir is not None
                    _, archive = resolve(self.archive_dir, self._storage)
                    relative = posixpath.relpath(path, base)
                    target = posixpath.join(archive, relative)
                    fs.create_dir(posixpath.dirname(target), recursive=True)
                    fs.move(path, target)
            except (OSError, pa.ArrowException) as error:
                problems.append(f"{path}: {error}")
        return problems

    # -- Source -------------------------------------------------------------------------------

    @property
    def boundedness(self) -> Boundedness:
        return Boundedness.BOUNDED if self.bounded else Boundedness.CONTINUOUS_UNBOUNDED

    def create_enumerator(
        self, context: SplitEnumeratorContext[FileSplit]
    ) -> SplitEnumerator[FileSplit, AssignerState[FileSplit]]:
        return FilesEnumerator(self, context, None)

    def restore_enumerator(
        self, context: SplitEnumeratorContext[FileSplit], state: AssignerState[FileSplit]
    ) -> SplitEnumerator[FileSplit, AssignerState[FileSplit]]:
        return FilesEnumerator(self, context, state)

    def create_reader(
        self, context: SourceReaderContext
    ) -> SourceReader[pa.RecordBatch, FileSplit]:
        self.require_schema()
        return SourceReaderBase(
            lambda: FileSplitReader(self, context.send_source_event_to_coordinator),
            BatchesEmitter(),
            context,
        )

    @property
    def event_time_column(self) -> str | None:
        """``event_time_column`` as given, for Parquet: the enumerator indexes it by the
        row-group statistics. None for JSON lines and CSV (no statistics to index)."""
        return self.time_column if self.format == "parquet" else None

    @property
    def estimates_size(self) -> bool:
        """Yes: positions are bytes (every extent has ``bytes_per_position`` 1), so the
        runtime's byte budgets (``maxBytesPerBatch``) cut batches by file bytes."""
        return True

    @property
    def split_codec(self) -> Codec[FileSplit]:
        return DataclassCodec(FileSplit)

    @property
    def enumerator_state_codec(self) -> Codec[AssignerState[FileSplit]]:
        return FilesStateCodec(self.split_codec)


def default_format(path: str, pattern: str | None, files: Sequence[FileEntry]) -> str:
    """The format named by the pattern's extension, else by the first file's."""
    for candidate in ([pattern] if pattern else []) + [f.path for f in files[:1]]:
        found = format_of(candidate)
        if found:
            return found
    raise ConfigurationError(
        f"option format: cannot tell the format of the files under {path!r} from their "
        "extension; set format to parquet, json or csv",
        option="format",
    )


__all__ = [
    "FileSplit",
    "FilesEnumerator",
    "FilesSource",
    "FilesState",
    "FilesStateCodec",
    "QuarantineEntry",
    "cut",
    "default_format",
]
