"""Test support: a deterministic harness, a test source, and contract test suites."""

from splitflow.reader.output import Collector, RecordingReaderContext
from splitflow.testing.harness import (
    ENUMERATOR,
    SourceHarness,
    assigning_enumerator_owned,
    count_duplicates,
)
from splitflow.testing.sequence import (
    SequenceCatalog,
    SequenceEnumerator,
    SequenceRecord,
    SequenceSource,
    SequenceSplit,
)

__all__ = [
    "ENUMERATOR",
    "Collector",
    "RecordingReaderContext",
    "SequenceCatalog",
    "SequenceEnumerator",
    "SequenceRecord",
    "SequenceSource",
    "SequenceSplit",
    "SourceHarness",
    "assigning_enumerator_owned",
    "count_duplicates",
]
