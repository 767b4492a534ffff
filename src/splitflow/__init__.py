"""splitflow: Flink's split-based sources (FLIP-27, FLIP-537, FLIP-309) for PySpark.

The public surface is :mod:`splitflow.api` (what a connector implements), re-exported here,
plus :mod:`splitflow.coordinator`, :mod:`splitflow.reader` and :mod:`splitflow.testing`.
"""

from splitflow.api import *  # noqa: F403
from splitflow.api import __all__ as _api_all
from splitflow.errors import (
    CheckpointDeclinedError,
    CheckpointStateError,
    ConfigurationError,
    ConnectorError,
    ContractViolation,
    DataLossError,
    IncompatibleCheckpointError,
    SourceFailedError,
    SplitflowError,
    SplitOwnershipError,
)

__version__ = "0.1.0"
__all__ = [
    *_api_all,
    "CheckpointDeclinedError",
    "CheckpointStateError",
    "ConfigurationError",
    "ConnectorError",
    "ContractViolation",
    "DataLossError",
    "IncompatibleCheckpointError",
    "SourceFailedError",
    "SplitOwnershipError",
    "SplitflowError",
]
