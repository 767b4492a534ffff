"""The enumerator's ledger (the ids of finished splits) kept in the state directory.

Spark writes an offset per batch and keeps the last hundred, so state that only grows must
not be copied into every offset. With a ``stateDir`` and an enumerator state codec that is a
:class:`~splitflow.api.split.LedgerCodec`, the offset of batch ``n`` holds the state without
its ledger and a :class:`LedgerRef`; the ledger itself is a full snapshot file written every
:data:`COMPACT_EVERY` changes, plus one small delta file per batch that changed it::

    <stateDir>/ledger/snapshot-<n>.json   {"ids": [...]}            all ids after batch n
    <stateDir>/ledger/delta-<n>.json      {"add": [...], "drop": [...]}   batch n's change

The ledger of an offset is its snapshot with its deltas applied in order, so restoring reads
at most ``1 + COMPACT_EVERY`` objects, and planning a batch reads none. Files are written
whole (:meth:`~splitflow.spark.statedir.StateStore.put`: an atomic rename locally, one PUT
on an object store), and only ever for an offset being planned: a batch whose offset Spark has
persisted is never planned again, so a file an offset refers to is never rewritten (a file
of an offset lost in a crash may be, with the replanned batch's content). Committing a batch
deletes the files older than its snapshot, which no later offset refers to.

The state directory belongs to one query, as its checkpoint location does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from splitflow.api.split import JsonDict
from splitflow.errors import CheckpointStateError
from splitflow.spark.statedir import StateStore, open_store

COMPACT_EVERY = 10
"""A ledger is written whole again after this many deltas."""


@dataclass(frozen=True)
class LedgerRef:
    """Which files hold an offset's ledger: snapshot ``base``, then ``deltas`` in order."""

    base: int
    deltas: tuple[int, ...] = ()
    size: int = 0
    """Ids in the ledger (a check on load, and what ``splitflow inspect`` shows)."""

    def encode(self) -> JsonDict:
        return {"base": self.base, "deltas": list(self.deltas), "size": self.size}

    @classmethod
    def decode(cls, data: Mapping[str, Any]) -> LedgerRef:
        return cls(int(data["base"]), tuple(int(d) for d in data["deltas"]), int(data["size"]))


class LedgerStore:
    """The ledger directory of one query; remembers the ledger it wrote or loaded last."""

    def __init__(self, state_dir: str | StateStore) -> None:
        self.store = open_store(state_dir)
        self.root = self.store.path("ledger")
        self._ref: LedgerRef | None = None
        self._ids: frozenset[str] = frozenset()
        self._discarded = -1  # files before this snapshot are gone (no listing needed)

    def write(self, seq: int, ids: frozenset[str]) -> LedgerRef:
        """Record ``ids`` as the ledger of the offset of batch ``seq``."""
        ref = self._ref
        if ref is None or len(ref.deltas) >= COMPACT_EVERY:
            self._write(f"snapshot-{seq}", {"ids": sorted(ids)})
            ref = LedgerRef(seq, (), len(ids))
        elif ids != self._ids:
            added, dropped = ids - self._ids, self._ids - ids
            self._write(f"delta-{seq}", {"add": sorted(added), "drop": sorted(dropped)})
            ref = LedgerRef(ref.base, (*ref.deltas, seq), len(ids))
        self._ref, self._ids = ref, ids
        return ref

    def load(self, ref: LedgerRef | None) -> frozenset[str]:
        """The ledger ``ref`` names (empty for ``None``); later writes build on it."""
        ids: set[str] = set()
        if ref is not None:
            ids.update(self._read(f"snapshot-{ref.base}")["ids"])
            for seq in ref.deltas:
                delta = self._read(f"delta-{seq}")
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

    def discard_before(self, base: int) -> None:
        """Delete the files of batches before snapshot ``base`` (a committed offset's).
        Lists the folder only when ``base`` is newer than the last one discarded before (a
        snapshot is written every :data:`COMPACT_EVERY` changes, so most commits list
        nothing)."""
        if base <= self._discarded:
            return
        for name in self.store.names(self.root):
            kind, _, rest = name.partition("-")
            seq = rest.removesuffix(".json")
            if kind in ("snapshot", "delta") and seq.isdigit() and int(seq) < base:
                self.store.delete(self.store.path("ledger", name))
        self._discarded = base

    def _write(self, name: str, content: JsonDict) -> None:
        data = json.dumps(content, separators=(",", ":")).encode()
        self.store.put(self.store.path("ledger", f"{name}.json"), data)

    def _read(self, name: str) -> Any:
        path = self.store.path("ledger", f"{name}.json")
        content = self.store.get(path)
        if content is None:
            path = self.store.where(path)
            raise CheckpointStateError(
                f"ledger file {path} is missing: the checkpoint refers to it; is option "
                "stateDir the one the query ran with, and is this the query's latest batch "
                "(a commit discards the files of older ones)",
                path=path,
            )
        try:
            return json.loads(content)
        except ValueError as error:
            where = self.store.where(path)
            raise CheckpointStateError(
                f"option stateDir: ledger file {where} is not JSON: {error}", path=where
            ) from error
