"""Reader helpers in the spirit of Flink's flink-connector-base.

A connector writes a :class:`SplitReader` (fetch elements of its splits, grouped by split)
and picks or writes a :class:`RecordEmitter` (turn an element into output, move the split's
position); :class:`SourceReaderBase` ties them into a complete
:class:`~splitflow.api.reader.SourceReader`::

    class MyReader(SourceReaderBase[Positioned[Row], Row, MySplit]):
        def __init__(self, source: MySource, context: SourceReaderContext) -> None:
            super().__init__(
                lambda: MySplitReader(source), PositionedEmitter(), context, fetch_threads=2
            )

Imports point one way: this package depends on :mod:`splitflow.api` only.
"""

from splitflow.reader.base import SourceReaderBase
from splitflow.reader.emitter import Positioned, PositionedEmitter, RecordEmitter
from splitflow.reader.output import Collector, RecordingReaderContext
from splitflow.reader.split_reader import RecordsBySplits, SplitReader, SplitSlice

__all__ = [
    "Collector",
    "Positioned",
    "PositionedEmitter",
    "RecordEmitter",
    "RecordingReaderContext",
    "RecordsBySplits",
    "SourceReaderBase",
    "SplitReader",
    "SplitSlice",
]
