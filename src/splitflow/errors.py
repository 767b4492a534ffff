"""Every error splitflow raises, under one root.

::

    SplitflowError
    ├── ConfigurationError          the user gave a bad option or argument
    ├── ContractViolation           a connector (or runtime) broke an API contract
    │   └── SplitOwnershipError     a split would be lost or owned twice
    ├── ConnectorError              the external system failed (always ``raise ... from exc``)
    │   ├── DataLossError           records planned for reading no longer exist
    │   └── SchemaChangedError      a table's schema changed in a change log (CDC)
    ├── SourceFailedError           the coordinator failed; ``__cause__`` is the original error
    ├── CheckpointDeclinedError     a checkpoint cannot be taken now (retry later)
    ├── IncompatibleCheckpointError a checkpoint was written by an incompatible version
    └── CheckpointStateError        state a checkpoint refers to is missing or does not match

Messages name the thing at fault (option, split, reader, checkpoint) and, where there is
one, the fix.
"""

from __future__ import annotations

from typing import Any


class SplitflowError(Exception):
    """Root of every error raised by splitflow."""


class ConfigurationError(SplitflowError, ValueError):
    """The user gave an invalid option or argument.

    ``option`` names the option at fault, so a caller can point at it.
    """

    def __init__(self, message: str, *, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option


class ContractViolation(SplitflowError):
    """A connector or runtime called the API in a way its contract forbids."""


class SplitOwnershipError(ContractViolation):
    """A split would be lost, or owned by more than one party at once.

    ``split_ids`` lists the splits at fault.
    """

    def __init__(self, message: str, *, split_ids: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.split_ids = split_ids


class ConnectorError(SplitflowError):
    """The external system a connector reads failed (unreachable, refused, corrupt data)."""


class DataLossError(ConnectorError):
    """Records that were planned for reading no longer exist (a deleted split, a purge).

    Raised when a source's ``failOnDataLoss`` policy is on (the default); with it off, the
    connector skips what was lost and logs a warning instead. ``split_id`` names the split.
    """

    def __init__(self, message: str, *, split_id: str) -> None:
        super().__init__(message)
        self.split_id = split_id


class SchemaChangedError(ConnectorError):
    """A table's schema changed in the change log (CDC, option ``schemaChanges``).

    With ``schemaChanges=stop`` the micro-batches before the change are committed and the
    new schema is recorded in ``stateDir``: restarting the query (same checkpoint) goes on
    with the new schema right at the change (:func:`splitflow.spark.run_restarting` does
    it). Otherwise (``fail``, or a change no restart can follow) nothing is recorded.
    ``table``, ``old`` and ``new`` (the columns, ``name type``), ``position`` (the log's,
    as the database shows it) name the change; ``recorded`` says whether a restart goes on.
    """

    RECORDED = "the new schema is recorded in stateDir"
    """The words of the message when a restart goes on: Spark hands a Python error to the
    driver as text, where :func:`splitflow.spark.run_restarting` looks for them."""

    def __init__(
        self,
        message: str,
        *,
        table: str,
        old: tuple[str, ...],
        new: tuple[str, ...],
        position: str,
        recorded: bool,
    ) -> None:
        super().__init__(message)
        self.table = table
        self.old = old
        self.new = new
        self.position = position
        self.recorded = recorded

    def __reduce__(self) -> Any:
        fields = (self.table, self.old, self.new, self.position, self.recorded)
        return (_schema_changed, (str(self), *fields))


def _schema_changed(message: str, *fields: Any) -> SchemaChangedError:
    table, old, new, position, recorded = fields
    return SchemaChangedError(
        message, table=table, old=old, new=new, position=position, recorded=recorded
    )


class SourceFailedError(SplitflowError):
    """The source's coordinator failed; the original exception is ``__cause__``."""


class CheckpointDeclinedError(SplitflowError):
    """A checkpoint cannot be taken now, for a reason that passes (e.g. readers registering)."""


class IncompatibleCheckpointError(SplitflowError):
    """A checkpoint or encoded value was written in a form this version cannot read."""

    def __init__(self, what: str, *, found: object, expected: object, of: str = "version") -> None:
        super().__init__(f"{what}: found {of} {found!r}, this splitflow reads {expected!r}")
        self.found = found
        self.expected = expected


class CheckpointStateError(SplitflowError):
    """State that a checkpoint refers to (in the state directory) is missing or altered.

    ``path`` names the file or directory at fault.
    """

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path
