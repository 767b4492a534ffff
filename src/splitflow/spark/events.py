"""Reader-to-coordinator events on Spark: once per committed batch, through a state directory.

A Spark task cannot call the driver, so a task writes the events its reader sent to
``<stateDir>/events/<batch seq>/<task index>`` when it has read its slice. The file is written
atomically and holds the same events whichever attempt writes it (a reader's events are a
function of its slice), so retries and speculative attempts leave exactly one copy. When the
planner plans batch ``n + 1``, batch ``n`` has completed: it hands batch ``n``'s events to the
enumerator and records in the new offset that events up to ``n`` are applied. After a
restart, the planner applies exactly the batches the restored offset has not.

On a cluster the state directory must be on a filesystem every executor and the driver share.
"""

from __future__ import annotations

import base64
import os
import pickle
import shutil
from collections.abc import Sequence

from splitflow.api.events import SourceEvent
from splitflow.errors import CheckpointStateError, IncompatibleCheckpointError
from splitflow.spark.statedir import write_atomically


def encode_events(events: Sequence[SourceEvent]) -> list[str]:
    """Events as strings that fit in JSON (they pickle, by contract)."""
    return [base64.b64encode(pickle.dumps(e)).decode("ascii") for e in events]


def decode_events(data: Sequence[str], where: str) -> list[SourceEvent]:
    """The events :func:`encode_events` made; ``where`` names them in an error.

    Raises :class:`~splitflow.errors.IncompatibleCheckpointError` for an event that does not
    load (its class renamed or moved since it was written) or is not a ``SourceEvent``.
    """
    events = []
    for item in data:
        try:
            event = pickle.loads(base64.b64decode(item))
        except Exception as e:
            found = f"{type(e).__name__}: {e}"
            raise IncompatibleCheckpointError(
                where, found=found, expected=_LOADABLE, of="an event that does not load"
            ) from e
        if not isinstance(event, SourceEvent):
            raise IncompatibleCheckpointError(
                where, found=repr(event), expected=_LOADABLE, of="a value that is not an event"
            )
        events.append(event)
    return events


_LOADABLE = "SourceEvents of classes the connector defines now"


class EventStore:
    """The events directory of one query's state directory."""

    def __init__(self, state_dir: str) -> None:
        self.root = os.path.join(state_dir, "events")

    def _batch(self, seq: int) -> str:
        return os.path.join(self.root, str(seq))

    def write(self, seq: int, task: int, slot: int, events: Sequence[SourceEvent]) -> None:
        """Record what task ``task`` of batch ``seq`` (slot ``slot``) sent. Idempotent."""
        target = os.path.join(self._batch(seq), f"{task:06d}")
        write_atomically(target, pickle.dumps((slot, list(events))))

    def read(self, seq: int) -> list[tuple[int, SourceEvent]]:
        """Batch ``seq``'s events as ``(slot, event)``, in task order."""
        directory = self._batch(seq)
        if not os.path.isdir(directory):
            return []
        result: list[tuple[int, SourceEvent]] = []
        for name in sorted(n for n in os.listdir(directory) if n.isdigit()):
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                try:
                    slot, events = pickle.load(f)
                except Exception as e:  # a class since changed, or the file altered
                    raise CheckpointStateError(
                        f"option stateDir: cannot read the reader events in {path} "
                        f"({type(e).__name__}: {e}); were they written by another version "
                        "of splitflow or of the connector?",
                        path=path,
                    ) from e
            result.extend((slot, event) for event in events)
        return result

    def discard_through(self, seq: int) -> None:
        """Forget the events of batches up to ``seq`` (applied and checkpointed)."""
        if not os.path.isdir(self.root):
            return
        for name in os.listdir(self.root):
            if name.isdigit() and int(name) <= seq:
                shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)
