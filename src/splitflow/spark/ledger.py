"""The enumerator's ledger (the ids of finished splits) kept in the state directory.

With a ``stateDir`` and an enumerator state codec that is a
:class:`~splitflow.api.split.LedgerCodec`, the offset of batch ``n`` holds the enumerator's
state without its ledger and a :class:`~splitflow.spark.snapshots.StateRef`; the ledger
itself is a full snapshot file written every :data:`COMPACT_EVERY` changes, plus one small
delta file per batch that changed it::

    <stateDir>/ledger/snapshot-<n>.json   {"ids": [...]}            all ids after batch n
    <stateDir>/ledger/delta-<n>.json      {"add": [...], "drop": [...]}   batch n's change

Which files may go, and why every offset Spark keeps finds its own:
:mod:`splitflow.spark.snapshots`.
"""

from __future__ import annotations

from splitflow.errors import CheckpointStateError
from splitflow.spark.snapshots import SnapshotLog, StateRef
from splitflow.spark.statedir import StateStore

COMPACT_EVERY = 10
"""A ledger is written whole again after this many deltas."""


class LedgerStore(SnapshotLog):
    """The ledger folder of one query; remembers the ledger it wrote or loaded last."""

    what = "ledger"

    def __init__(self, state_dir: str | StateStore) -> None:
        super().__init__(state_dir, "ledger")
        self._ref: StateRef | None = None
        self._ids: frozenset[str] = frozenset()

    def write(self, seq: int, ids: frozenset[str]) -> StateRef:
        """Record ``ids`` as the ledger of the offset of batch ``seq``."""
        ref = self._ref
        if ref is None or len(ref.deltas) >= COMPACT_EVERY:
            self._write(seq, "snapshot", {"ids": sorted(ids)})
            ref = StateRef(seq, (), len(ids))
        elif ids != self._ids:
            added, dropped = ids - self._ids, self._ids - ids
            self._write(seq, "delta", {"add": sorted(added), "drop": sorted(dropped)})
            ref = StateRef(ref.base, (*ref.deltas, seq), len(ids))
        self._ref, self._ids = ref, ids
        return ref

    def load(self, ref: StateRef | None) -> frozenset[str]:
        """The ledger ``ref`` names (empty for ``None``); later writes build on it."""
        ids: set[str] = set()
        if ref is not None:
            snapshot, deltas, _ = self._read_all(ref)
            ids.update(snapshot["ids"])
            for delta in deltas:
                ids.difference_update(delta["drop"])
                ids.update(delta["add"])
            if len(ids) != ref.size:
                raise CheckpointStateError(
                    f"ledger in {self.root} (snapshot {ref.base}, deltas {list(ref.deltas)}) "
                    f"holds {len(ids)} ids where the checkpoint says {ref.size}: was the "
                    "state directory shared with another query, or altered",
                    path=self.root,
                )
        self._ref, self._ids = ref, frozenset(ids)
        return self._ids
