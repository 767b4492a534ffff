"""Reader-to-coordinator events on Spark: once per committed batch, through a state directory.

A Spark task cannot call the driver, so a task writes the events its reader sent to
``<stateDir>/events/<batch seq>/<task index>`` when it has read its slice. The file is written
atomically and holds the same events whichever attempt writes it (a reader's events are a
function of its slice), so retries and speculative attempts leave exactly one copy. When the
planner plans batch ``n + 1``, batch ``n`` has completed: it hands batch ``n``'s events to the
enumerator and records in the new offset that events up to ``n`` are applied. After a
restart, the planner applies exactly the batches the restored offset has not.

On a cluster the state directory must be one every executor and the driver reach: a shared
filesystem or an object store (:class:`~splitflow.spark.statedir.StateStore`). Planning batch
``n + 1`` reads ``events/<n>/``: one listing of a folder that holds one object per task of
batch ``n``, however old the query.
"""

from __future__ import annotations

import base64
import pickle
from collections.abc import Sequence

from splitflow.api.events import SourceEvent
from splitflow.errors import CheckpointStateError, IncompatibleCheckpointError
from splitflow.spark.statedir import StateStore, open_store


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
    """The events folder of one query's state directory (local or an object store)."""

    def __init__(self, state_dir: str | StateStore) -> None:
        self.store = open_store(state_dir)
        self.root = self.store.path("events")

    def _batch(self, seq: int) -> str:
        return self.store.path("events", str(seq))

    def write(self, seq: int, task: int, slot: int, events: Sequence[SourceEvent]) -> None:
        """Record what task ``task`` of batch ``seq`` (slot ``slot``) sent. Idempotent: every
        attempt of the task writes the same events under the same name."""
        target = self.store.path("events", str(seq), f"{task:06d}")
        self.store.put(target, pickle.dumps((slot, list(events))))

    def read(self, seq: int) -> list[tuple[int, SourceEvent]]:
        """Batch ``seq``'s events as ``(slot, event)``, in task order."""
        directory = self._batch(seq)
        result: list[tuple[int, SourceEvent]] = []
        paths = [
            self.store.path("events", str(seq), name)
            for name in self.store.names(directory)
            if name.isdigit()
        ]
        for path, content in self.store.get_many(paths).items():
            if content is None:  # deleted since the listing: by a commit of this query only
                continue
            try:
                slot, events = pickle.loads(content)
            except Exception as e:  # a class since changed, or the file altered
                where = self.store.where(path)
                raise CheckpointStateError(
                    f"option stateDir: cannot read the reader events in {where} "
                    f"({type(e).__name__}: {e}); were they written by another version "
                    "of splitflow or of the connector?",
                    path=where,
                ) from e
            result.extend((slot, event) for event in events)
        return result

    def discard_through(self, seq: int) -> None:
        """Forget the events of batches up to ``seq`` (applied and checkpointed). One listing
        of ``events/``, which holds the batches not yet discarded (a few)."""
        for name in self.store.names(self.root):
            if name.isdigit() and int(name) <= seq:
                self.store.delete(self._batch(int(name)), folder=True)
