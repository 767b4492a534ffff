"""Generated data as Arrow record batches: deterministic, any number of splits, optional skew.

A split is a numbered sequence of rows; row ``i`` of split ``s`` is
``(split=s, id=i, value=(i * 2654435761 + s * 97) % 1000003)``, so any slice can be made
again, identically, from its positions alone (a replay reads the same rows). Rows come as
``pyarrow.RecordBatch`` of up to ``batch_rows`` rows: the fast path into Spark.

This is the first piece of the generator connector (rates, event time and an unbounded mode
are still to come); it is built only on splitflow's public API.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from splitflow.api.assigner import AssignerState, AssignerStateCodec, AssigningSplitEnumerator
from splitflow.api.enumerator import SplitEnumerator, SplitEnumeratorContext, SplitExtent
from splitflow.api.reader import SourceReader, SourceReaderContext
from splitflow.api.source import Boundedness, Source, SupportsSplitReassignmentOnRecovery
from splitflow.api.split import Codec, DataclassCodec
from splitflow.errors import ConfigurationError
from splitflow.reader import (
    Positioned,
    PositionedEmitter,
    RecordsBySplits,
    SourceReaderBase,
    SplitReader,
    SplitSlice,
)

SCHEMA = pa.schema(
    [("split", pa.int32(), False), ("id", pa.int64(), False), ("value", pa.int64(), False)]
)
SPARK_SCHEMA = "split int not null, id bigint not null, value bigint not null"


@dataclass(frozen=True)
class GeneratorSplit:
    index: int
    rows: int
    position: int = 0

    @property
    def split_id(self) -> str:
        return f"gen-{self.index:05d}"


def make_batch(index: int, start: int, stop: int) -> pa.RecordBatch:
    """Rows ``start .. stop-1`` of split ``index``."""
    ids = np.arange(start, stop, dtype=np.int64)
    values = (ids * 2654435761 + index * 97) % 1000003
    return pa.RecordBatch.from_arrays(
        [pa.repeat(pa.scalar(index, pa.int32()), stop - start), pa.array(ids), pa.array(values)],
        schema=SCHEMA,
    )


class GeneratorEnumerator(AssigningSplitEnumerator[GeneratorSplit]):
    def __init__(
        self,
        source: GeneratorSource,
        context: SplitEnumeratorContext[GeneratorSplit],
        state: AssignerState[GeneratorSplit] | None,
    ) -> None:
        super().__init__(context, state=state)
        self._source = source

    def discover_splits(self) -> Sequence[GeneratorSplit]:
        return self._source.splits()

    def latest_positions(self, splits: Sequence[GeneratorSplit]) -> dict[str, SplitExtent]:
        return {s.split_id: SplitExtent(s.rows, final=True) for s in splits}


class _GeneratorSplitReader(SplitReader[Positioned[pa.RecordBatch], GeneratorSplit]):
    """Makes one record batch per fetch, taking splits in turn."""

    def __init__(self, batch_rows: int) -> None:
        self._batch_rows = batch_rows
        self._pieces: dict[str, tuple[GeneratorSplit, int, int]] = {}  # id -> split, pos, stop

    def handle_splits_changes(self, added: Sequence[SplitSlice[GeneratorSplit]]) -> None:
        for piece in added:
            stop = piece.split.rows if piece.stop is None else min(piece.stop, piece.split.rows)
            self._pieces[piece.split_id] = (piece.split, piece.start, stop)

    def remove_splits(self, split_ids: Sequence[str]) -> None:
        for split_id in split_ids:
            self._pieces.pop(split_id, None)

    def fetch(self) -> RecordsBySplits[Positioned[pa.RecordBatch]]:
        batch: RecordsBySplits[Positioned[pa.RecordBatch]] = RecordsBySplits()
        if not self._pieces:
            return batch
        split_id = next(iter(self._pieces))
        split, position, stop = self._pieces.pop(split_id)
        end = min(stop, position + self._batch_rows)
        if end > position:
            batch.add(split_id, Positioned(make_batch(split.index, position, end), end))
        if end >= split.rows:
            batch.mark_ended(split_id)
        elif end >= stop:
            batch.mark_finished(split_id)
        else:
            self._pieces[split_id] = (split, end, stop)  # back of the line
        return batch

    def wake_up(self) -> None:
        """Nothing to do: ``fetch`` never blocks."""

    def close(self) -> None:
        self._pieces.clear()


class GeneratorSource(
    Source[pa.RecordBatch, GeneratorSplit, AssignerState[GeneratorSplit]],
    SupportsSplitReassignmentOnRecovery,
):
    """``splits`` splits of ``rows`` rows each; with ``skew``, split ``i`` has
    ``rows * (1 + skew * i / (splits - 1))`` rows (the last ``1 + skew`` times the first)."""

    def __init__(
        self, splits: int, rows: int, *, batch_rows: int = 65_536, skew: float = 0.0
    ) -> None:
        for name, value in (("splits", splits), ("rowsPerSplit", rows), ("batchRows", batch_rows)):
            if value < 1:
                raise ConfigurationError(
                    f"option {name} must be at least 1, got {value}", option=name
                )
        if skew < 0:
            raise ConfigurationError(f"option skew must be >= 0, got {skew}", option="skew")
        self.num_splits, self.rows, self.batch_rows, self.skew = splits, rows, batch_rows, skew

    def splits(self) -> list[GeneratorSplit]:
        scale = max(1, self.num_splits - 1)
        return [
            GeneratorSplit(i, round(self.rows * (1 + self.skew * i / scale)))
            for i in range(self.num_splits)
        ]

    @property
    def boundedness(self) -> Boundedness:
        return Boundedness.BOUNDED

    def create_enumerator(
        self, context: SplitEnumeratorContext[GeneratorSplit]
    ) -> SplitEnumerator[GeneratorSplit, AssignerState[GeneratorSplit]]:
        return GeneratorEnumerator(self, context, None)

    def restore_enumerator(
        self,
        context: SplitEnumeratorContext[GeneratorSplit],
        state: AssignerState[GeneratorSplit],
    ) -> SplitEnumerator[GeneratorSplit, AssignerState[GeneratorSplit]]:
        return GeneratorEnumerator(self, context, state)

    def create_reader(
        self, context: SourceReaderContext
    ) -> SourceReader[pa.RecordBatch, GeneratorSplit]:
        batch_rows = self.batch_rows
        return SourceReaderBase(
            lambda: _GeneratorSplitReader(batch_rows),
            PositionedEmitter[pa.RecordBatch, GeneratorSplit](),
            context,
        )

    @property
    def split_codec(self) -> Codec[GeneratorSplit]:
        return DataclassCodec(GeneratorSplit)

    @property
    def enumerator_state_codec(self) -> Codec[AssignerState[GeneratorSplit]]:
        return AssignerStateCodec(self.split_codec)
