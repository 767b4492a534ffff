"""What connector authors implement and use. No engine (pyspark) import in this layer."""

from splitflow.api.ahead import SplitsAhead
from splitflow.api.assigner import AssignerState, AssignerStateCodec, AssigningSplitEnumerator
from splitflow.api.assignment import (
    AssignmentStrategy,
    BalancedAssignment,
    HashAssignment,
    RoundRobinAssignment,
)
from splitflow.api.enumerator import (
    Cancellable,
    MetricGroup,
    ReaderInfo,
    SplitEnumerator,
    SplitEnumeratorContext,
    SplitExtent,
)
from splitflow.api.events import (
    BacklogFinishedEvent,
    BacklogStartedEvent,
    SourceEvent,
    SplitsFinishedEvent,
    SplitsRemovedEvent,
)
from splitflow.api.reader import (
    InputStatus,
    ReaderOutput,
    SourceReader,
    SourceReaderContext,
    SplitOutputs,
)
from splitflow.api.source import (
    Boundedness,
    ReadPinner,
    Source,
    SupportsPinnedReads,
    SupportsSplitReassignmentOnRecovery,
)
from splitflow.api.split import (
    Codec,
    DataclassCodec,
    JsonDict,
    LedgerCodec,
    SourceSplit,
    SplitState,
    with_position,
)

__all__ = [
    "AssignerState",
    "AssignerStateCodec",
    "AssigningSplitEnumerator",
    "AssignmentStrategy",
    "BacklogFinishedEvent",
    "BacklogStartedEvent",
    "BalancedAssignment",
    "Boundedness",
    "Cancellable",
    "Codec",
    "DataclassCodec",
    "HashAssignment",
    "InputStatus",
    "JsonDict",
    "LedgerCodec",
    "MetricGroup",
    "ReadPinner",
    "ReaderInfo",
    "ReaderOutput",
    "RoundRobinAssignment",
    "Source",
    "SourceEvent",
    "SourceReader",
    "SourceReaderContext",
    "SourceSplit",
    "SplitEnumerator",
    "SplitEnumeratorContext",
    "SplitExtent",
    "SplitOutputs",
    "SplitState",
    "SplitsAhead",
    "SplitsFinishedEvent",
    "SplitsRemovedEvent",
    "SupportsPinnedReads",
    "SupportsSplitReassignmentOnRecovery",
    "with_position",
]
