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
on an object store), and only ever for an offset being planned.

Which files may go. Spark keeps the offsets of its last ``minBatchesToRetain`` batches (option
``stateRetainBatches`` says how many: the runtime cannot read Spark's setting), and any of
them may be restored from again: a user rolls a stopped query back by deleting its newest
offset and commit files, and the restart plans the next batch from the newest one left. So
each kept offset must find its files, and a rolled-back batch is planned again, possibly
writing other files than the first time (a delta where a snapshot was, or nothing):

* **A restore from batch k** (:meth:`LedgerStore.resume_at`) deletes the files of batches
  after ``k``: they belong to offsets Spark no longer has (rolled back, or planned and lost
  in a crash before Spark logged them). The planner calls it once per run, after the owner
  check, before it writes any file; it is the one listing of the folder in a run (of about
  ``retain`` batches' files). From then on every file in the folder is one that the lineage
  of the offsets Spark keeps wrote, so the newest snapshot at or before a batch is that
  batch's base.
* **Committing batch n** (:meth:`LedgerStore.keep_from` with ``oldest = n - retain + 1``):
  Spark commits batch ``n`` to the source once it logged the next batch's offset, and then
  keeps that batch and the ``retain`` before it; a splitflow batch number grows by at most
  one per Spark batch, so Spark keeps no offset older than ``oldest``. Bases only move
  forward along a lineage, so every kept offset reads from the base of ``oldest`` on: the
  newest snapshot at or before ``oldest``. The files before it go, by name, from what the
  store remembers (no listing). Example with ``retain = 100`` and a snapshot every 10
  changes: committing batch 150 keeps batch 51's base, snapshot 44 say, and deletes the
  snapshots and deltas before 44.

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

RETAIN_BATCHES = 100
"""How many of the last batches' offsets stay restorable by default (option
``stateRetainBatches``): Spark's default ``spark.sql.streaming.minBatchesToRetain``."""


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
        self._files: dict[str, int] = {}  # file name -> batch, of the files known to exist
        self._snapshots: set[int] = set()  # the batches of the snapshots among them
        self._kept_from = -1  # the base of the oldest kept offset, as last computed

    def write(self, seq: int, ids: frozenset[str]) -> LedgerRef:
        """Record ``ids`` as the ledger of the offset of batch ``seq``."""
        ref = self._ref
        if ref is None or len(ref.deltas) >= COMPACT_EVERY:
            self._write(seq, "snapshot", {"ids": sorted(ids)})
            ref = LedgerRef(seq, (), len(ids))
        elif ids != self._ids:
            added, dropped = ids - self._ids, self._ids - ids
            self._write(seq, "delta", {"add": sorted(added), "drop": sorted(dropped)})
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

    def resume_at(self, seq: int) -> None:
        """The query restores from the offset of batch ``seq``: delete the files of later
        batches (no offset Spark keeps refers to them; a replanned batch may write others)
        and remember the rest. One listing; call it before the run writes any file."""
        self._files, self._snapshots = {}, set()
        for name in self.store.names(self.root):
            kind, _, rest = name.partition("-")
            number = rest.removesuffix(".json")
            if kind not in ("snapshot", "delta") or not number.isdigit():
                continue
            if int(number) > seq:
                self.store.delete(self.store.path("ledger", name))
            else:
                self._remember(int(number), kind)
        self._kept_from = -1

    def keep_from(self, oldest: int) -> None:
        """Spark keeps no offset of a batch before ``oldest``: delete the files older than
        the newest snapshot at or before ``oldest`` (the base of every offset kept). Lists
        nothing: deletes the files this store wrote, or found at :meth:`resume_at`, by name;
        deletes only when that snapshot moved on (every :data:`COMPACT_EVERY` changes)."""
        base = max((s for s in self._snapshots if s <= oldest), default=-1)
        if base <= self._kept_from:
            return
        for name, seq in sorted(self._files.items(), key=lambda item: item[1]):
            if seq < base:
                self.store.delete(self.store.path("ledger", name))
                del self._files[name]
                self._snapshots.discard(seq)
        self._kept_from = base

    def _remember(self, seq: int, kind: str) -> None:
        self._files[f"{kind}-{seq}.json"] = seq
        if kind == "snapshot":
            self._snapshots.add(seq)

    def _write(self, seq: int, kind: str, content: JsonDict) -> None:
        data = json.dumps(content, separators=(",", ":")).encode()
        self.store.put(self.store.path("ledger", f"{kind}-{seq}.json"), data)
        self._remember(seq, kind)

    def _read(self, name: str) -> Any:
        path = self.store.path("ledger", f"{name}.json")
        content = self.store.get(path)
        if content is None:
            path = self.store.where(path)
            raise CheckpointStateError(
                f"ledger file {path} is missing: the checkpoint refers to it; is option "
                "stateDir the one the query ran with, and is stateRetainBatches at least "
                "Spark's spark.sql.streaming.minBatchesToRetain (a commit deletes the files "
                "of the batches before the last stateRetainBatches)",
                path=path,
            )
        try:
            return json.loads(content)
        except ValueError as error:
            where = self.store.where(path)
            raise CheckpointStateError(
                f"option stateDir: ledger file {where} is not JSON: {error}", path=where
            ) from error
