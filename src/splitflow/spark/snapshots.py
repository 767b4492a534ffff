"""State kept in the state directory as snapshot and delta files, named by batch.

Spark writes an offset per batch and keeps the last hundred, so state that is large (every
split's position) or only grows (the ids of finished splits) must not be copied into every
offset. With a ``stateDir`` such state lives in a folder of the state directory, and the
offset of batch ``n`` names the files that hold it (a :class:`StateRef`): a full snapshot,
written every few batches, plus one small delta file per batch that changed it::

    <stateDir>/<folder>/snapshot-<n>.json   the whole state after batch n
    <stateDir>/<folder>/delta-<n>.json      batch n's change to the state before it

The state of an offset is its snapshot with its deltas applied in order, so restoring reads
at most ``1 + compact_every`` objects, and planning a batch reads none. Files are written
whole (:meth:`~splitflow.spark.statedir.StateStore.put`: an atomic rename locally, one PUT
on an object store), and only ever for an offset being planned. Two logs use it: the
enumerator's ledger (:mod:`splitflow.spark.ledger`) and the rest of the offset
(:mod:`splitflow.spark.offsetstate`).

Which files may go. Spark keeps the offsets of its last ``minBatchesToRetain`` batches (option
``stateRetainBatches`` says how many: the runtime cannot read Spark's setting), and any of
them may be restored from again: a user rolls a stopped query back by deleting its newest
offset and commit files, and the restart plans the next batch from the newest one left. So
each kept offset must find its files, and a rolled-back batch is planned again, possibly
writing other files than the first time (a delta where a snapshot was, or nothing):

* **A restore from batch k** (:meth:`SnapshotLog.resume_at`) deletes the files of batches
  after ``k``: they belong to offsets Spark no longer has (rolled back, or planned and lost
  in a crash before Spark logged them). The planner calls it once per run, after the owner
  check, before it writes any file; it is the one listing of the folder in a run (of about
  ``retain`` batches' files). From then on every file in the folder is one that the lineage
  of the offsets Spark keeps wrote, so the newest snapshot at or before a batch is that
  batch's base.
* **Committing batch n** (:meth:`SnapshotLog.keep_from` with ``oldest = n - retain + 1``):
  Spark commits batch ``n`` to the source once it logged the next batch's offset, and then
  keeps that batch and the ``retain`` before it; a splitflow batch number grows by at most
  one per Spark batch, so Spark keeps no offset older than ``oldest``. Bases only move
  forward along a lineage, so every kept offset reads from the base of ``oldest`` on: the
  newest snapshot at or before ``oldest``. The files before it go, by name, from what the
  store remembers (no listing). Example with ``retain = 100`` and a snapshot every 10
  changes: committing batch 150 keeps batch 51's base, snapshot 44 say, and deletes the
  snapshots and deltas before 44. A replay of a batch whose base a later snapshot
  superseded reads that older base, which is kept while Spark keeps the batch.

The state directory belongs to one query, as its checkpoint location does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from splitflow.api.split import JsonDict
from splitflow.errors import CheckpointStateError
from splitflow.spark.statedir import StateStore, open_store

RETAIN_BATCHES = 100
"""How many of the last batches' offsets stay restorable by default (option
``stateRetainBatches``): Spark's default ``spark.sql.streaming.minBatchesToRetain``."""


_AS_JSON_DOES = (
    orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)
"""What orjson would write and ``json`` refuses or writes otherwise is handed back instead."""


def to_json(content: object) -> bytes:
    """``content`` as compact JSON, the document ``json.dumps`` writes, at orjson's speed (a
    state of 100k splits: 12 ms against 157, ``bench/state_json.py``). What orjson does not
    write as ``json`` does (integers beyond 64 bits, keys that are not strings, subclasses
    of the JSON types, dataclasses, dates) goes through ``json``, which also raises for what
    is not JSON. A float that is not finite has no JSON form and is written as ``null``.

    What orjson wrote ends with a newline, which tells :func:`from_json` that orjson may
    read it back."""
    try:
        return orjson.dumps(content, option=_AS_JSON_DOES | orjson.OPT_APPEND_NEWLINE)
    except TypeError:
        return json.dumps(content, separators=(",", ":")).encode()


def from_json(content: bytes) -> Any:
    """What :func:`to_json` wrote, read back. orjson reads what orjson wrote (about 1.8
    times as fast as ``json``: every integer in it fits 64 bits, beyond which orjson would
    read a float); ``json`` reads the rest (what ``json`` wrote, and files written before
    orjson marked its own). Raises ValueError for what is not JSON."""
    if content.endswith(b"\n"):
        return orjson.loads(content)
    return json.loads(content)


@dataclass(frozen=True)
class StateRef:
    """Which files hold an offset's state: snapshot ``base``, then ``deltas`` in order."""

    base: int
    deltas: tuple[int, ...] = ()
    size: int = 0
    """How many entries the state holds (a check on load, and what ``splitflow inspect``
    shows)."""

    def encode(self) -> JsonDict:
        return {"base": self.base, "deltas": list(self.deltas), "size": self.size}

    @classmethod
    def decode(cls, data: Mapping[str, Any]) -> StateRef:
        return cls(int(data["base"]), tuple(int(d) for d in data["deltas"]), int(data["size"]))


class SnapshotLog:
    """One folder of snapshot and delta files in the state directory; remembers the files
    that exist (those it wrote, or found at :meth:`resume_at`)."""

    what = "state"
    """What the files hold, as an error names it."""

    def __init__(self, state_dir: str | StateStore, folder: str) -> None:
        self.store = open_store(state_dir)
        self.folder = folder
        self.root = self.store.path(folder)
        self._files: dict[str, int] = {}  # file name -> batch, of the files known to exist
        self._snapshots: set[int] = set()  # the batches of the snapshots among them
        self._kept_from = -1  # the base of the oldest kept offset, as last computed

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
                self.store.delete(self.store.path(self.folder, name))
            else:
                self._remember(int(number), kind)
        self._kept_from = -1

    def keep_from(self, oldest: int) -> None:
        """Spark keeps no offset of a batch before ``oldest``: delete the files older than
        the newest snapshot at or before ``oldest`` (the base of every offset kept). Lists
        nothing: deletes the files this log wrote, or found at :meth:`resume_at`, by name;
        deletes only when that snapshot moved on."""
        base = max((s for s in self._snapshots if s <= oldest), default=-1)
        if base <= self._kept_from:
            return
        for name, seq in sorted(self._files.items(), key=lambda item: item[1]):
            if seq < base:
                self.store.delete(self.store.path(self.folder, name))
                del self._files[name]
                self._snapshots.discard(seq)
        self._kept_from = base

    def _remember(self, seq: int, kind: str) -> None:
        self._files[f"{kind}-{seq}.json"] = seq
        if kind == "snapshot":
            self._snapshots.add(seq)

    def _write(self, seq: int, kind: str, content: JsonDict) -> None:
        """Write ``content`` as file ``<kind>-<seq>.json``."""
        self._put(seq, kind, to_json(content))

    def _put(self, seq: int, kind: str, data: bytes) -> None:
        self.store.put(self.store.path(self.folder, f"{kind}-{seq}.json"), data)
        self._remember(seq, kind)

    def _read_all(self, ref: StateRef) -> tuple[Any, list[Any], list[int]]:
        """The snapshot and the deltas ``ref`` names, in order (read concurrently from an
        object store), and the size in bytes of each file."""
        names = [f"snapshot-{ref.base}.json", *(f"delta-{d}.json" for d in ref.deltas)]
        paths = [self.store.path(self.folder, name) for name in names]
        found = self.store.get_many(paths)
        snapshot, *deltas = (self._parse(path, found.get(path)) for path in paths)
        return snapshot, deltas, [len(found.get(path) or b"") for path in paths]

    def _parse(self, path: str, content: bytes | None) -> Any:
        where = self.store.where(path)
        if content is None:
            raise CheckpointStateError(
                f"{self.what} file {where} is missing: the checkpoint refers to it; is option "
                "stateDir the one the query ran with, and is stateRetainBatches at least "
                "Spark's spark.sql.streaming.minBatchesToRetain (a commit deletes the files "
                "of the batches before the last stateRetainBatches)",
                path=where,
            )
        try:
            return from_json(content)
        except ValueError as error:
            raise CheckpointStateError(
                f"option stateDir: {self.what} file {where} is not JSON: {error}", path=where
            ) from error
