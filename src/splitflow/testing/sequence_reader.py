"""The reader of :class:`~splitflow.testing.sequence.SequenceSource`.

Reads records ``(name, i)`` of the in-process :class:`~splitflow.testing.sequence.SequenceCatalog`
with :class:`~splitflow.reader.SourceReaderBase`: a :class:`SequenceSplitReader` and a
:class:`~splitflow.reader.PositionedEmitter`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from splitflow.api.reader import SourceReader, SourceReaderContext
from splitflow.errors import ConfigurationError, DataLossError
from splitflow.reader import (
    Positioned,
    PositionedEmitter,
    RecordsBySplits,
    SourceReaderBase,
    SplitReader,
    SplitSlice,
)
from splitflow.testing.sequence_splits import SequenceRecord, SequenceSplit

if TYPE_CHECKING:  # the source imports this module
    from splitflow.testing.sequence import SequenceCatalog, SequenceSource

log = logging.getLogger("splitflow.testing")


class SequenceSplitReader(SplitReader[Positioned[SequenceRecord], SequenceSplit]):
    """Reads :class:`SequenceSplit` slices from a catalog, ``fetch_size`` records per fetch.

    A split with ``end`` is bounded: it ends at ``end``. Without, it reads the records that
    exist now (``catalog.length(name)``) and then has nothing available until more are
    appended. A split whose name vanished from the catalog has nothing available (the
    enumerator removes it); under a planned slice (a ``stop``) it is data loss: a
    :class:`~splitflow.errors.DataLossError`, or with ``fail_on_data_loss=False`` the split
    ends with a warning. A sealed split without ``end`` ends at its length when read without
    a stop; under a stop it only finishes there (the runtime, which planned the stop from a
    final extent, finishes it). Splits take turns: each fetch starts one split further on, so
    a long split does not starve the others.

    Thread: the :class:`~splitflow.reader.SplitReader` contract; ``fetch`` never blocks.
    """

    def __init__(
        self, catalog: SequenceCatalog, fetch_size: int, *, fail_on_data_loss: bool = True
    ) -> None:
        if fetch_size < 1:
            raise ConfigurationError(
                f"fetch_size must be >= 1, got {fetch_size!r}", option="fetch_size"
            )
        self._catalog = catalog
        self._fetch_size = fetch_size
        self._fail_on_data_loss = fail_on_data_loss
        self._reading: dict[str, _Cursor] = {}
        self._turn = 0

    def handle_splits_changes(self, added: Sequence[SplitSlice[SequenceSplit]]) -> None:
        for piece in added:
            self._reading[piece.split_id] = _Cursor(piece)

    def remove_splits(self, split_ids: Sequence[str]) -> None:
        for split_id in split_ids:
            self._reading.pop(split_id, None)

    def fetch(self) -> RecordsBySplits[Positioned[SequenceRecord]]:
        batch: RecordsBySplits[Positioned[SequenceRecord]] = RecordsBySplits()
        budget = self._fetch_size
        cursors = list(self._reading.values())
        if not cursors:
            return batch
        start = self._turn % len(cursors)
        self._turn = start + 1
        for cursor in cursors[start:] + cursors[:start]:
            budget -= cursor.read(self._catalog, budget, batch, self._fail_on_data_loss)
            if cursor.done:
                del self._reading[cursor.name]
            if budget == 0:
                break
        return batch

    def wake_up(self) -> None:
        """Nothing to do: ``fetch`` never blocks."""


class _Cursor:
    """Where one split is read: position, and the end (bounded) or stop, if any."""

    def __init__(self, piece: SplitSlice[SequenceSplit]) -> None:
        self.name = piece.split.name
        self.position = piece.start
        self.end = piece.split.end
        self.stop = piece.stop
        self.done = False

    def read(
        self,
        catalog: SequenceCatalog,
        budget: int,
        batch: RecordsBySplits[Positioned[SequenceRecord]],
        fail_on_data_loss: bool,
    ) -> int:
        """Add up to ``budget`` records to ``batch``; return how many."""
        extent = catalog.extent(self.name)
        if extent is None and self.stop is not None and self.position < self.stop:
            # Vanished under a planned slice: those records are gone for good, and no
            # removal event will reach a reader of a bounded slice (a Spark task).
            lost = f"records [{self.position}, {self.stop}) of split {self.name}"
            if fail_on_data_loss:
                raise DataLossError(
                    f"{lost} were planned for reading but the split no longer exists "
                    "(set failOnDataLoss=false to skip lost records)",
                    split_id=self.name,
                )
            log.warning("splitflow: %s are lost: the split vanished (failOnDataLoss=false)", lost)
            batch.mark_ended(self.name)
            self.done = True
            return 0
        if extent is None:
            return 0  # vanished: nothing available until the enumerator removes the split
        length, sealed = extent
        # Sealed: the split ends where it is; but a planned slice (a stop) ends only at the
        # split's own end, so that whether it ends does not depend on when it is read (a
        # seal between two reads of one slice); the runtime finishes sealed splits itself.
        end = length if self.end is None and sealed and self.stop is None else self.end
        limit = length if end is None else min(length, end)
        if self.stop is not None:
            limit = min(limit, self.stop)
        count = max(0, min(limit - self.position, budget))
        name, first = self.name, self.position
        batch.add_all(name, [Positioned((name, i), i + 1) for i in range(first, first + count)])
        self.position += count
        if end is not None and self.position >= end:
            batch.mark_ended(name)
            self.done = True
        elif self.stop is not None and self.position >= self.stop:
            batch.mark_finished(name)
            self.done = True
        return count


def create_sequence_reader(
    source: SequenceSource, context: SourceReaderContext, *, fetch_threads: int = 0
) -> SourceReader[SequenceRecord, SequenceSplit]:
    """The reader :meth:`SequenceSource.create_reader` returns.

    ``fetch_threads``: see :class:`~splitflow.reader.SourceReaderBase` (tests run both modes).
    """
    catalog, fetch_size = source.catalog, source.fetch_size
    return SourceReaderBase(
        lambda: SequenceSplitReader(
            catalog, fetch_size, fail_on_data_loss=source.fail_on_data_loss
        ),
        PositionedEmitter[SequenceRecord, SequenceSplit](),
        context,
        fetch_threads=fetch_threads,
    )


__all__ = ["SequenceSplitReader", "create_sequence_reader"]
