"""The CDC reader's plumbing: chunk and log slices fetched one bounded read at a time, the
batch's pin, and the emitter that reports a chunk's watermark with its rows.

A database subclasses :class:`CdcSplitReader` with two reads:

* :meth:`~CdcSplitReader.read_chunk`: a chunk's rows (already in the source's
  :class:`~.schema.OutputSchema`, ``op`` ``r``) and its watermark, as one :class:`Piece`,
  under the batch's pin (:attr:`Pinned.event`) when the runtime sent one, else in a read of
  its own. The rows and the :class:`~.splits.ChunkReadEvent` leave the reader together, as
  one element, so a checkpoint never splits a chunk from its watermark.
* :meth:`~CdcSplitReader.open_log`: the log slice ``[start, stop)`` (the transactions whose
  position is in it) as a generator of pieces of whole transactions, leaving out what the
  chunks held (:class:`~.splits.ChunkFilter`). Each piece moves the position to just
  after its last transaction; the last one to ``stop``. :meth:`fetch` takes one piece per
  call, so a task holds one piece, not the slice.

A reader's output for a planned slice is a function of the slice (``docs/design.md``): the
log from its positions, a chunk from the pin.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Collection, Generator, Sequence
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

import pyarrow as pa

from splitflow.api.events import SourceEvent
from splitflow.api.reader import ReaderOutput, SourceReaderContext
from splitflow.api.split import SplitState
from splitflow.connectors.cdc.schema import OutputSchema
from splitflow.connectors.cdc.splits import CdcSplit, ChunkReadEvent, ChunkSplit, LogSplit
from splitflow.reader.base import SourceReaderBase
from splitflow.reader.emitter import RecordEmitter
from splitflow.reader.split_reader import RecordsBySplits, SplitReader, SplitSlice

PinT = TypeVar("PinT", bound=SourceEvent)


class Piece(NamedTuple):
    """What the split reader hands the emitter: rows up to ``next_position``, and a
    chunk's watermark with the chunk's rows. ``cut``: the log's schema changed at
    ``next_position`` (a :class:`~.changes.SchemaChange`): the slice ends there."""

    batches: list[pa.RecordBatch]
    next_position: int
    mark: Any = None
    cut: Any = None


class LogRead(NamedTuple):
    """A log slice being read: its pieces, taken one per fetch, and where it stops."""

    pieces: Generator[Piece, None, None]
    stop: int


class CdcEmitter(RecordEmitter[Piece, pa.RecordBatch, CdcSplit]):
    """Emits a piece's rows, reports a chunk's watermark, moves the position."""

    def __init__(self, context: SourceReaderContext, report_marks: bool) -> None:
        self._context = context
        self._report_marks = report_marks  # only the switch to the log needs them

    def emit(
        self, element: Piece, output: ReaderOutput[pa.RecordBatch], state: SplitState[CdcSplit]
    ) -> None:
        for batch in element.batches:
            output.collect(batch)
        if element.mark is not None and self._report_marks:
            self._context.send_source_event_to_coordinator(ChunkReadEvent(element.mark))
        if element.cut is not None:
            self._context.send_source_event_to_coordinator(element.cut)
        state.position = element.next_position


class Pinned(Generic[PinT]):
    """The batch's pin (the runtime's event, see :class:`~splitflow.api.source.ReadPinner`)
    once the runtime sent it; the reader's split readers read chunks under it. Set before
    any split is added; None without a runtime that pins (a batch read, the harness)."""

    event: PinT | None = None


class KeptChunks(Protocol):
    """Where each batch's chunk reads are kept (``stateDir``) until the batch completes, for
    a database whose pin ends with the driver (PostgreSQL's exported snapshot): a batch
    evaluated again after a driver crash then returns the chunks its first evaluation
    read, with their watermarks, whatever the sink kept of it."""

    def get(self, batch: int, split_id: str) -> bytes | None:
        """The chunk's read kept for ``batch``; None when there is none."""
        ...

    def put_first(self, batch: int, split_id: str, content: bytes) -> bytes:
        """Keep ``content`` unless a read of the chunk is kept already; return the one kept
        (the first read's, when two raced)."""
        ...

    def drop_through(self, batch: int, pinned: Collection[int]) -> None:
        """Forget the reads of the batches up to ``batch`` (they completed): ``pinned``, the
        ones this run pinned, and any an earlier run left."""
        ...


_MARK = b"splitflow.mark"


def encode_piece(piece: Piece) -> bytes:
    """A chunk's :class:`Piece` as bytes (Arrow IPC; the watermark pickled in the schema's
    metadata), for :class:`KeptChunks`."""
    import pickle

    schema = piece.batches[0].schema if piece.batches else pa.schema([])
    schema = schema.with_metadata({_MARK: pickle.dumps((piece.next_position, piece.mark))})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for batch in piece.batches:
            writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def decode_piece(content: bytes) -> Piece:
    """The :class:`Piece` :func:`encode_piece` made."""
    import pickle

    reader = pa.ipc.open_stream(content)
    next_position, mark = pickle.loads(reader.schema.metadata[_MARK])
    schema = reader.schema.remove_metadata()
    batches = [pa.RecordBatch.from_arrays(b.columns, schema=schema) for b in reader]
    return Piece(batches, next_position, mark)


class CdcSplitReader(SplitReader[Piece, CdcSplit]):
    """Reads chunk and log slices (see the module doc): one chunk per fetch (so its rows
    go out before the next is read), and one piece of each log slice.

    ``kept``: where a pinned batch's chunk reads are kept (:class:`KeptChunks`): a chunk
    the batch read before is returned as it was read, not read again."""

    def __init__(
        self,
        columns: Sequence[tuple[str, Any]],
        pinned: Pinned[Any],
        kept: KeptChunks | None = None,
    ) -> None:
        self._pinned = pinned
        self._kept = kept
        self._schema: OutputSchema[Any] = OutputSchema(columns)
        self._slices: dict[str, SplitSlice[CdcSplit]] = {}
        self._log_at: dict[str, int] = {}  # how far each log split has been read
        self._log_reads: dict[str, LogRead] = {}  # slices being read, a piece per fetch

    # -- hooks ----------------------------------------------------------------------------------

    @abstractmethod
    def read_chunk(self, split: ChunkSplit) -> Piece:
        """The chunk's rows and its watermark (``Piece(batches, 1, mark)``)."""

    @abstractmethod
    def open_log(self, split: LogSplit, start: int, stop: int | None) -> LogRead | None:
        """Start reading the slice ``[start, stop)`` of ``split``; None when it is empty.
        ``stop`` None (no planned stop: the harness): up to the log's end now. The pieces
        are taken lazily, one per :meth:`fetch`."""

    def close_log_read(self, reading: LogRead) -> None:
        """End a slice's read before its last piece (``pieces.close()``); override to
        recover a connection the close could not clean up."""
        reading.pieces.close()

    # -- SplitReader ----------------------------------------------------------------------------

    def handle_splits_changes(self, added: Sequence[SplitSlice[CdcSplit]]) -> None:
        for piece in added:
            self._end_log_read(piece.split_id)  # defensive: a split is not added twice
        self._slices.update((piece.split_id, piece) for piece in added)

    def remove_splits(self, split_ids: Sequence[str]) -> None:
        for split_id in split_ids:
            self._slices.pop(split_id, None)
            self._log_at.pop(split_id, None)
            self._end_log_read(split_id)

    def wake_up(self) -> None:
        pass  # every fetch returns after one bounded read

    def fetch(self) -> RecordsBySplits[Piece]:
        out: RecordsBySplits[Piece] = RecordsBySplits()
        chunks = [p for p in self._slices.values() if isinstance(p.split, ChunkSplit)]
        logs = [p for p in self._slices.values() if isinstance(p.split, LogSplit)]
        if chunks:
            piece, split = chunks[0], chunks[0].split
            assert isinstance(split, ChunkSplit)
            if piece.stop is not None and piece.stop <= split.position:
                out.mark_finished(split.split_id)  # held back: not in this batch
            else:
                out.add(split.split_id, self._chunk(split))
                out.mark_ended(split.split_id)
            del self._slices[split.split_id]
        for piece in logs:
            self._read_log(piece, out)  # type: ignore[arg-type]
            if piece.split_id in out.finished:
                del self._slices[piece.split_id]
        return out

    def _chunk(self, split: ChunkSplit) -> Piece:
        """The chunk's read: kept from an earlier read of the pinned batch, else read (and
        kept, when a store is given)."""
        batch = getattr(self._pinned.event, "batch", None)
        if self._kept is None or batch is None:
            return self.read_chunk(split)
        kept = self._kept.get(batch, split.split_id)
        if kept is not None:
            return decode_piece(kept)
        piece = self.read_chunk(split)
        content = encode_piece(piece)
        first = self._kept.put_first(batch, split.split_id, content)
        return piece if first == content else decode_piece(first)

    def _read_log(self, piece: SplitSlice[LogSplit], out: RecordsBySplits[Piece]) -> None:
        """The next piece of the log split's slice. The first fetch of a slice starts its
        read (:meth:`open_log`); each fetch takes one piece; the last piece, at the slice's
        stop, ends the read and finishes a planned slice."""
        split = piece.split
        reading = self._log_reads.get(split.split_id)
        if reading is None:
            start = self._log_at.get(split.split_id, split.position)
            if piece.stop is not None and piece.stop <= start:
                out.mark_finished(split.split_id)
                return
            reading = self.open_log(split, start, piece.stop)
            if reading is None:
                return
            self._log_reads[split.split_id] = reading
        element = next(reading.pieces)
        out.add(split.split_id, element)
        if element.next_position >= reading.stop or element.cut is not None:  # the last piece
            self._end_log_read(split.split_id)
            self._log_at[split.split_id] = element.next_position
            if piece.stop is not None and element.cut is not None:
                out.mark_cut(split.split_id)
            elif piece.stop is not None:
                out.mark_finished(split.split_id)

    def _end_log_read(self, split_id: str) -> None:
        """Forget the split's slice read, if any, closing one that has not reached its last
        piece."""
        reading = self._log_reads.pop(split_id, None)
        if reading is not None:
            self.close_log_read(reading)

    def close(self) -> None:
        for split_id in list(self._log_reads):
            self._end_log_read(split_id)


class CdcReader(SourceReaderBase[Piece, pa.RecordBatch, CdcSplit]):
    """A CDC source's reader: :class:`SourceReaderBase` that also takes the batch's pin
    (an event of class ``pin_type``), which the runtime sends before the splits.

    ``split_reader``: makes a split reader that reads under the given :class:`Pinned`;
    ``report_marks``: send each chunk's watermark to the enumerator (``startupMode``
    ``initial``: the switch to the log needs them).
    """

    def __init__(
        self,
        split_reader: Callable[[Pinned[Any]], SplitReader[Piece, CdcSplit]],
        context: SourceReaderContext,
        *,
        report_marks: bool,
        pin_type: type[SourceEvent],
    ) -> None:
        self._pinned: Pinned[Any] = Pinned()
        self._pin_type = pin_type
        emitter = CdcEmitter(context, report_marks=report_marks)
        super().__init__(lambda: split_reader(self._pinned), emitter, context)

    def handle_source_event(self, event: SourceEvent) -> None:
        if isinstance(event, self._pin_type):
            self._pinned.event = event
        super().handle_source_event(event)
