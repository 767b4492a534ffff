"""Small offsets: with ``stateDir``, the bulk of each offset lives in the state directory.

Without a state directory, Spark's offset of a batch is the whole checkpoint of the source
(:class:`~splitflow.spark.offset.BatchOffset`, format 5): the enumerator's state, every
slot's splits with their slices, each split's watermark. That grows with the number of
live splits (about 100 bytes each), and Spark parses it several times per batch and keeps a
hundred of them. With a state directory the planner hands Spark a small offset instead
(format 7): the same offset with those three parts (the *state*) moved into files, and a
:class:`~splitflow.spark.snapshots.StateRef` naming the files in their place::

    <stateDir>/offsets/snapshot-<n>.json   the state of batch n, whole
    <stateDir>/offsets/delta-<n>.json      what batch n changed in the state before it

Spark's offset then stays below a few kilobytes whatever the number of splits: its sequence
number, codecs, backlog flag, the events for readers, the ledger's reference, the owner
token, the number of slots and the state's reference (a snapshot and at most
:data:`COMPACT_EVERY` deltas).

**The state** is one JSON document: ``{"enumerator": <the enumerator's state>, "slots":
{"<slot>": {"<split id>": [split id, split, start, stop, seq, (1 if it ends)]}}, "event_times":
{...}}``, the slices as the whole offset writes them, keyed by slot and split id. A delta
is a structural difference of two such documents (:func:`difference`): for each object,
the members set (new or changed), dropped, and the nested objects that changed; arrays and
values are set whole. A slot's slices that keep their split (the same encoding: most of
those a batch reads on) are ``moved`` instead of set: ``{"<split id>": [start, stop, seq,
(1)]}``, the entry without its split id and split, which stay as they were. A batch that
reads 1% of the splits writes a delta about the size of those splits' positions (a slice
stays as the batch that read it left it until a batch reads the split again). A slot can
hold one split id twice: a split read to its end whose id the enumerator assigns again while
it finishes. The state keeps the new split's slice under the id, and the ending one apart,
in ``"ending": {"<slot>": [entry, ...]}``, which only the batch that read it to its end has.

**Why a replay reads the same records.** A batch's files are written before Spark learns
its offset, and never written again while an offset Spark keeps refers to them
(:mod:`splitflow.spark.snapshots`): a restore from batch ``k`` deletes the files of later
batches before the run writes any, and the offset of a batch planned again names the files
written then. So expanding offset ``n`` gives, value for value, the whole offset the
planner built for batch ``n`` (:meth:`OffsetState.expand`; slices come back in split id
order within each slot, the order the planner builds them in), and its tasks are the same
(:func:`~splitflow.spark.offset.plan_partitions` is a function of that offset). A restart
restores the coordinator from the expanded offset, through the same path as before.

A new snapshot is written every :data:`COMPACT_EVERY` batches, or sooner once the deltas
since the last one add up to half its size (a run that loaded an offset goes on from its
files, unless they are of an older format); so a restore reads the snapshot and at most
:data:`COMPACT_EVERY` deltas, about one and a half times the state.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Mapping, Sequence
from operator import itemgetter
from typing import Any

from splitflow.api.split import JsonDict
from splitflow.errors import CheckpointStateError, ConfigurationError
from splitflow.spark.offset import FORMAT_3, OFFSET_FORMAT, OLD_OFFSET_FORMAT, Changed
from splitflow.spark.snapshots import SnapshotLog, StateRef, to_json
from splitflow.spark.statedir import StateStore

FULL, SMALL = OFFSET_FORMAT, 7
"""The offset formats: the whole checkpoint, and the one whose state is in files."""
WHOLE_OF = {SMALL: FULL, 6: FULL, 4: FORMAT_3, 2: OLD_OFFSET_FORMAT}
"""Each small format, read, and the whole format of its time: 6 before deltas named the
slices that moved on (``moved``), 4 and 3 before slices named where they start, 2 and 1
before slices named the batch that read them."""

COMPACT_EVERY = 20
"""A state is written whole again after at most this many deltas."""

_MISSING = object()
_ID = itemgetter(0)  # of a slice's entry: its split id
_POSITIONS = itemgetter(slice(2, None))  # of a slice's entry: start, stop, seq (and end)
_END = 5  # of a slice's entry: the index of its end mark


def difference(old: Mapping[str, Any], new: Mapping[str, Any]) -> JsonDict:
    """What turns JSON object ``old`` into ``new``: ``{"set": {member: value}, "drop":
    [member], "sub": {member: difference}}`` (empty parts left out; ``{}`` when equal).

    Objects nested in both are compared member by member; anything else is set whole when
    it differs. Values shared by the two (the same object) are not looked into.
    """
    changed: JsonDict = {}
    nested: JsonDict = {}
    for key, value in new.items():
        before = old.get(key, _MISSING)
        if before is value:
            continue
        if isinstance(before, dict) and isinstance(value, dict):
            if before == value:  # at C speed: most of a large object stays the same
                continue
            inner = difference(before, value)
            if inner:
                nested[key] = inner
        elif before is _MISSING or before != value:
            changed[key] = value
    dropped = [key for key in old if key not in new]
    return {
        **({"set": changed} if changed else {}),
        **({"drop": dropped} if dropped else {}),
        **({"sub": nested} if nested else {}),
    }


def patched(document: JsonDict, change: Mapping[str, Any]) -> JsonDict:
    """``document`` with ``change`` (a :func:`difference`, or a slot's change with
    ``moved``: see the module doc) applied, in place."""
    for key in change.get("drop", ()):
        document.pop(key, None)
    document.update(change.get("set", {}))
    for key, rest in change.get("moved", {}).items():
        document[key] = [*document[key][:2], *rest]
    for key, inner in change.get("sub", {}).items():
        patched(document[key], inner)
    return document


def _keyed(entries: Sequence[list[Any]]) -> dict[str, list[Any]]:
    """A slot's ``entries`` by split id, as the state's document holds them."""
    return dict(zip(map(_ID, entries), entries, strict=True))


def _ends(entry: list[Any]) -> bool:
    return len(entry) > _END and entry[_END] == 1


def _apart(entries: Sequence[list[Any]]) -> tuple[list[list[Any]], list[list[Any]]]:
    """A slot's ``entries`` that hold a split id twice (a split read to its end, assigned
    again while it finished) as those the state keeps by split id, and the ending ones of
    the ids held twice, which it keeps apart (``ending``)."""
    twice = {sid for sid, n in Counter(map(_ID, entries)).items() if n > 1}
    ending = [e for e in entries if _ID(e) in twice and _ends(e)]
    kept = [e for e in entries if not (_ID(e) in twice and _ends(e))]
    return kept, ending


def _with_ending(slot: Mapping[str, list[Any]], ending: Sequence[list[Any]]) -> list[list[Any]]:
    """A slot's entries as the offset holds them: in split id order, each ending entry of an
    id held twice after the other entry of its id (as the planner sorts them)."""
    ids = sorted(slot)
    entries = [slot[sid] for sid in ids]
    for entry in sorted(ending, key=_ID, reverse=True):  # later places first: the rest stay
        entries.insert(bisect_right(ids, _ID(entry)), entry)
    return entries


def _moved(old: Mapping[str, list[Any]], change: JsonDict) -> JsonDict:
    """A slot's ``change`` (a :func:`difference` from ``old``) with the entries it sets that
    keep their split (an equal encoding) as ``moved``."""
    entries = change.get("set", {})
    moved = {
        sid: _POSITIONS(entry)
        for sid, entry in entries.items()
        if (before := old.get(sid)) is not None and (before[1] is entry[1] or before[1] == entry[1])
    }
    if not moved:
        return change
    entries = {sid: entry for sid, entry in entries.items() if sid not in moved}
    rest = {k: v for k, v in change.items() if k != "set"}
    return {**({"set": entries} if entries else {}), "moved": moved, **rest}


class OffsetState(SnapshotLog):
    """The ``offsets`` folder of one query; remembers the state it wrote or loaded last.

    Called by: the streaming runner's planner, one call at a time; ``splitflow inspect``.
    """

    what = "offset state"

    def __init__(self, state_dir: str | StateStore) -> None:
        super().__init__(state_dir, "offsets")
        self._ref: StateRef | None = None
        self._state: JsonDict = {}
        """The state written or read last, each slot in it as the offset's list of entries."""
        self._keyed: dict[str, dict[str, list[Any]]] = {}
        """Slots of :attr:`_state` by split id, as the state's document holds them, where
        made (a slot compared whole, a snapshot, a state read back) and still the same."""
        self._sizes: dict[str, int] = {}
        """The slices of each slot of :attr:`_state` by split id (as its document holds
        them: a split id a slot holds twice, a split that ends and is assigned again while
        it finishes, once)."""
        self._slots: object = None  # the slots of the offset whose state _state is
        self._base_bytes = 0  # the size of the snapshot of _ref; 0: write one next
        self._delta_bytes = 0  # the sizes of _ref's deltas, added up

    def compact(
        self,
        offset: JsonDict,
        changed: Sequence[Changed | None] | None = None,
        since: object = None,
    ) -> JsonDict:
        """Whole ``offset`` as a small one, its state written to files first.

        ``changed`` (per slot: the slot's entries that differ from those in the ``slots``
        of offset ``since``, or None for a slot to compare whole) saves comparing every
        entry when ``since`` is the offset compacted last (see
        :class:`~splitflow.spark.offset.OffsetEncoder`).
        """
        if offset.get("splitflow") != FULL:
            raise ValueError(f"only a whole offset (format {FULL}) can be compacted")
        seq = int(offset["seq"])
        hints = changed if since is not None and since is self._slots else None
        state, keyed, slots_change = self._state_after(offset, hints)
        # A slot with hints holds the split ids it held (hints need the same at each place).
        sizes = {k: len(keyed[k]) if k in keyed else self._sizes[k] for k in state["slots"]}
        size = sum(sizes.values())
        ref = self._ref
        if ref is None or self._base_bytes == 0 or len(ref.deltas) >= COMPACT_EVERY:
            ref = self._snapshot(seq, state, keyed, size)
        else:
            change = difference(
                {k: v for k, v in self._state.items() if k != "slots"},
                {k: v for k, v in state.items() if k != "slots"},
            )
            if slots_change:
                change.setdefault("sub", {})["slots"] = slots_change
            if change:
                data = to_json(change)
                if 2 * (self._delta_bytes + len(data)) > self._base_bytes:
                    ref = self._snapshot(seq, state, keyed, size)
                else:
                    self._put(seq, "delta", data)
                    self._delta_bytes += len(data)
                    ref = StateRef(ref.base, (*ref.deltas, seq), size)
        self._ref, self._state, self._keyed, self._slots = ref, state, keyed, offset["slots"]
        self._sizes = sizes
        kept = {k: v for k, v in offset.items() if k not in ("enumerator", "slots", "event_times")}
        parallelism = len(offset["slots"])
        return {**kept, "splitflow": SMALL, "parallelism": parallelism, "state": ref.encode()}

    def _state_after(
        self, offset: JsonDict, hints: Sequence[Changed | None] | None
    ) -> tuple[JsonDict, dict[str, dict[str, list[Any]]], JsonDict]:
        """The state of ``offset`` (its slots the offset's lists of entries, less the
        ending entries of split ids a slot holds twice, ``ending``), those of its slots made
        by split id (:attr:`_keyed`), and the :func:`difference` of its slots from those of
        the state before, with the slices that keep their split ``moved``.

        A slot with ``hints`` is not made by split id: its change is the hint's entries
        (unless the slot held an id twice before: the hints pair its entries by place)."""
        before = self._state.get("slots", {})
        slots: JsonDict = {}
        keyed: dict[str, dict[str, list[Any]]] = {}
        added: JsonDict = {}
        nested: JsonDict = {}
        ending: JsonDict = {}
        was_ending = self._state.get("ending", {})
        for index, entries in enumerate(offset["slots"]):
            key = str(index)
            old = before.get(key)
            hint = hints[index] if hints is not None and index < len(hints) else None
            if old is not None and hint is not None and key not in was_ending:
                change: JsonDict = {}
                if hint.split:
                    change["set"] = dict(zip(map(_ID, hint.split), hint.split, strict=True))
                if hint.kept:
                    moved = map(_POSITIONS, hint.kept)
                    change["moved"] = dict(zip(map(_ID, hint.kept), moved, strict=True))
                if change:
                    nested[key] = change
                elif key in self._keyed:  # the same entries
                    keyed[key] = self._keyed[key]
            else:
                slot = keyed[key] = _keyed(entries)
                if len(slot) < len(entries):
                    entries, ending[key] = _apart(entries)
                    slot = keyed[key] = _keyed(entries)
                if old is None:
                    added[key] = slot
                elif inner := difference(old_slot := self._keyed.get(key) or _keyed(old), slot):
                    nested[key] = _moved(old_slot, inner)
            slots[key] = entries
        dropped = [key for key in before if key not in slots]
        state = {
            "enumerator": offset["enumerator"],
            "slots": slots,
            "event_times": offset.get("event_times", {}),
            **({"ending": ending} if ending else {}),
        }
        return (
            state,
            keyed,
            {
                **({"set": added} if added else {}),
                **({"drop": dropped} if dropped else {}),
                **({"sub": nested} if nested else {}),
            },
        )

    def _snapshot(
        self, seq: int, state: JsonDict, keyed: dict[str, dict[str, list[Any]]], size: int
    ) -> StateRef:
        """Write ``state`` whole, its slots by split id (those not in ``keyed`` made now,
        and kept there)."""
        for key, entries in state["slots"].items():
            if key not in keyed:
                keyed[key] = _keyed(entries)
        data = to_json({**state, "slots": {key: keyed[key] for key in state["slots"]}})
        self._put(seq, "snapshot", data)
        self._base_bytes, self._delta_bytes = len(data), 0
        return StateRef(seq, (), size)

    def expand(self, offset: Mapping[str, Any]) -> JsonDict:
        """``offset`` whole: a small offset with its state read back from files (later
        writes build on it), in the whole format of its time (:data:`WHOLE_OF`); a whole
        offset as it is."""
        small = offset.get("splitflow")
        if small not in WHOLE_OF:
            return dict(offset)
        ref = StateRef.decode(offset["state"])
        snapshot, deltas, sizes = self._read_all(ref)
        state = snapshot
        for seq, delta in zip(ref.deltas, deltas, strict=True):
            try:
                state = patched(state, delta)
            except (KeyError, IndexError, TypeError, AttributeError) as error:
                raise CheckpointStateError(
                    f"offset state in {self.root}: delta {seq} does not apply to snapshot "
                    f"{ref.base} and the deltas before it ({error!r}): was the state "
                    "directory shared with another query, or altered",
                    path=self.root,
                ) from error
        slots = [state["slots"][str(slot)] for slot in range(len(state["slots"]))]
        if sum(len(slot) for slot in slots) != ref.size:
            raise CheckpointStateError(
                f"offset state in {self.root} (snapshot {ref.base}, deltas "
                f"{list(ref.deltas)}) holds {sum(map(len, slots))} slices where the "
                f"checkpoint says {ref.size}: was the state directory shared with another "
                "query, or altered",
                path=self.root,
            )
        ending = state.get("ending", {})
        whole = [_with_ending(slot, ending.get(str(i), ())) for i, slot in enumerate(slots)]
        # The next state is written as a delta of this one, or whole (after a state of a
        # format before, whose entries a delta would leave in their old form).
        self._ref, self._keyed, self._slots = ref, state["slots"], whole
        self._sizes = {key: len(slot) for key, slot in state["slots"].items()}
        self._state = {
            **state,
            "slots": {key: list(slot.values()) for key, slot in state["slots"].items()},
        }
        self._base_bytes, self._delta_bytes = (
            (sizes[0], sum(sizes[1:])) if small == SMALL else (0, 0)
        )
        kept = {k: v for k, v in offset.items() if k not in ("state", "parallelism")}
        return {
            **kept,
            "splitflow": WHOLE_OF[small],
            "enumerator": state["enumerator"],
            "slots": whole,
            **({"event_times": state["event_times"]} if state["event_times"] else {}),
        }


def expand_offset(offset: Mapping[str, Any], state: OffsetState | None) -> JsonDict:
    """``offset`` whole, read back with ``state`` (the query's ``stateDir``)."""
    if offset.get("splitflow") in WHOLE_OF and state is None:
        raise ConfigurationError(
            f"option stateDir: the checkpoint keeps the state of batch {offset.get('seq')} "
            "in a state directory; run the query with its stateDir",
            option="stateDir",
        )
    return dict(offset) if state is None else state.expand(offset)
