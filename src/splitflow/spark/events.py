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

How long events are kept. The offset of batch ``k`` records ``events_through = k - 1``, so
planning from it applies ``events/<k>/``. Spark plans from any offset it keeps: the newest
after a restart, and an older one when a user rolls a stopped query back by deleting the
newer offset and commit files. If batch ``k``'s commit file is gone too, Spark first runs
batch ``k`` again, whose tasks write ``events/<k>/`` again (the same events: a reader's are
a function of its slice, and the offset is the same), but if it is kept, Spark runs no task
of batch ``k`` and plans from its offset at once: ``events/<k>/`` is read as it was left.
So a batch's events outlive their first application for as long as Spark keeps its offset:

* **Committing batch n** (:meth:`EventStore.keep_from` with ``oldest = n - retain + 1``,
  ``retain`` as in :mod:`splitflow.spark.ledger`) deletes the events of the batches before
  ``oldest``, by name, one batch's folder at a time (no listing of ``events/``).
* **A restore from batch k** (:meth:`EventStore.resume_at`) deletes the events of batches
  after ``k``: their offsets are gone (rolled back, or lost in a crash before Spark logged
  them, in which case no task ran), and the batch of the same number that is planned next
  may have other tasks, so a file of the old one left beside its files would be read as
  one of its own. One listing of ``events/`` per run, which holds ``retain`` batches.
"""

from __future__ import annotations

import base64
import json
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
        self._oldest = 0  # no batch before this one has events left (that this store knows)

    def _batch(self, seq: int) -> str:
        return self.store.path("events", str(seq))

    def write(self, seq: int, task: int, slot: int, events: Sequence[SourceEvent]) -> None:
        """Record what task ``task`` of batch ``seq`` (slot ``slot``) sent. Idempotent: every
        attempt of the task writes the same events under the same name."""
        target = self.store.path("events", str(seq), f"{task:06d}")
        self.store.put(target, pickle.dumps((slot, list(events))))

    def write_pin(self, seq: int, pin: SourceEvent) -> None:
        """Keep the event batch ``seq``'s reads were pinned with (:meth:`read_pin`), with the
        batch's events: it goes when they go."""
        data = json.dumps(encode_events([pin])).encode()
        self.store.put(self.store.path("events", str(seq), "pin.json"), data)

    def read_pin(self, seq: int) -> SourceEvent | None:
        """The event :meth:`write_pin` kept for batch ``seq``, if any."""
        path = self.store.path("events", str(seq), "pin.json")
        content = self.store.get(path)
        if content is None:
            return None
        [pin] = decode_events(json.loads(content), self.store.where(path))
        return pin

    def read(self, seq: int) -> tuple[set[int], list[tuple[int, SourceEvent]]]:
        """The slots whose tasks of batch ``seq`` wrote (every task writes, with or without
        events), and the batch's events as ``(slot, event)``, in task order."""
        directory = self._batch(seq)
        slots: set[int] = set()
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
            slots.add(slot)
            result.extend((slot, event) for event in events)
        return slots, result

    def resume_at(self, seq: int) -> None:
        """The query restores from the offset of batch ``seq``: delete the events of later
        batches and learn the oldest batch with events left. One listing of ``events/``;
        call it before the run plans a batch after ``seq`` (a replay of batch ``seq`` itself
        may have run: its events stay)."""
        kept = []
        for batch in sorted(int(name) for name in self.store.names(self.root) if name.isdigit()):
            if batch > seq:
                self.store.delete(self._batch(batch), folder=True)
            else:
                kept.append(batch)
        self._oldest = min(kept, default=seq + 1)

    def keep_from(self, oldest: int) -> None:
        """Spark keeps no offset of a batch before ``oldest``: delete the events of those
        batches, one folder per batch since the last call (usually one), by name."""
        for batch in range(self._oldest, oldest):
            self.store.delete(self._batch(batch), folder=True)
        self._oldest = max(self._oldest, oldest)
