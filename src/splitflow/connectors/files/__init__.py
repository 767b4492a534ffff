"""The files source: Parquet, JSON lines and CSV files in a directory tree, read exactly once.

See :mod:`splitflow.connectors.files.source` for the design and ``docs/files.md`` for the
options on Spark (``spark.readStream.format("splitflow-files")``).
"""

from splitflow.connectors.files.formats import BadFileError, CsvOptions
from splitflow.connectors.files.reader import FileQuarantinedEvent
from splitflow.connectors.files.source import (
    FilesSource,
    FilesState,
    QuarantineEntry,
    default_format,
)
from splitflow.connectors.files.splits import FileSplit

__all__ = [
    "BadFileError",
    "CsvOptions",
    "FileQuarantinedEvent",
    "FileSplit",
    "FilesSource",
    "FilesState",
    "QuarantineEntry",
    "default_format",
]
