"""Which splits went to which reader since which checkpoint (Flink's SplitAssignmentTracker).

Assignments are filed under the checkpoint that follows them. Once a checkpoint completes,
everything filed up to it is acknowledged (it is in the readers' state) and dropped. When a
reader fails and restarts from checkpoint C, what it was assigned after C is handed back to
the enumerator: the reader's restored state does not have it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Generic

from splitflow.api.split import SplitT


class SplitAssignmentTracker(Generic[SplitT]):
    """Called by: the coordinator thread only."""

    def __init__(self) -> None:
        self._by_checkpoint: dict[int, dict[int, list[SplitT]]] = {}
        self._uncheckpointed: dict[int, list[SplitT]] = {}

    def record_split_assignment(self, assignment: Mapping[int, Sequence[SplitT]]) -> None:
        for reader, splits in assignment.items():
            self._uncheckpointed.setdefault(reader, []).extend(splits)

    def on_checkpoint(self, checkpoint_id: int) -> None:
        """File everything assigned since the previous checkpoint under ``checkpoint_id``."""
        if self._uncheckpointed:
            self._by_checkpoint[checkpoint_id] = self._uncheckpointed
        self._uncheckpointed = {}

    def on_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Drop what was filed up to ``checkpoint_id``: readers have it in their state."""
        for done in [c for c in self._by_checkpoint if c <= checkpoint_id]:
            del self._by_checkpoint[done]

    def get_and_remove_uncheckpointed_assignment(
        self, reader_id: int, restored_checkpoint_id: int | None
    ) -> list[SplitT]:
        """What ``reader_id`` got after ``restored_checkpoint_id`` (None: ever), in order."""
        result: list[SplitT] = []
        for checkpoint_id in sorted(self._by_checkpoint):
            if restored_checkpoint_id is None or checkpoint_id > restored_checkpoint_id:
                result.extend(self._by_checkpoint[checkpoint_id].pop(reader_id, []))
        result.extend(self._uncheckpointed.pop(reader_id, []))
        return result

    def assignments_since(self, checkpoint_id: int | None) -> dict[int, list[SplitT]]:
        """Everything assigned after ``checkpoint_id`` (None: ever), by reader. For tests."""
        merged: dict[int, list[SplitT]] = {}
        filed = [
            self._by_checkpoint[c]
            for c in sorted(self._by_checkpoint)
            if checkpoint_id is None or c > checkpoint_id
        ]
        for part in [*filed, self._uncheckpointed]:
            for reader, splits in part.items():
                merged.setdefault(reader, []).extend(splits)
        return merged
