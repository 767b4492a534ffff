"""Spark's offset of one micro-batch (a full checkpoint of the source after it), and the
tasks it is read by. No pyspark import here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress
from operator import is_not
from typing import Any, Generic, NamedTuple

from splitflow.api.enumerator import EnumStateT
from splitflow.api.events import SourceEvent
from splitflow.api.source import Source
from splitflow.api.split import Codec, JsonDict, SplitT, with_position
from splitflow.errors import IncompatibleCheckpointError
from splitflow.spark.events import decode_events, encode_events
from splitflow.spark.snapshots import StateRef

OFFSET_FORMAT = 5
"""The whole offset's format: 5 since each slice names where it starts (its split is
encoded as it was assigned, not moved to each new position)."""
FORMAT_3 = 3
"""The format before, still read: a slice starts at its split's position, and names the
batch that read it."""
OLD_OFFSET_FORMAT = 1
"""The format before 3, still read: its slices that read are read by the offset's batch."""
READ_FORMATS = (OFFSET_FORMAT, FORMAT_3, OLD_OFFSET_FORMAT)
"""The whole offset's formats that are read."""


class Slice(NamedTuple, Generic[SplitT]):
    """Where a split is after a batch: at ``stop``, having been read from ``start`` up to
    ``stop`` (exclusive) by batch ``seq`` (0: not read since it was assigned or moved
    back). A batch reads the slices it names (``seq`` is its own); the others stay as the
    batch that read them left them, the same objects from offset to offset. ``ends``:
    ``stop`` is the split's final position, so the split is finished after the batch.

    ``body`` is the split object as it was assigned (or restored): its own ``position`` is
    where it was then, not where the slice starts, so that a batch that reads the split
    makes no new split object and the offset encodes each split once. :attr:`split` is the
    split at ``start``, as its reader gets it (a new object when it moved since).

    A named tuple: immutable like a frozen dataclass, and made in a third of the time (a
    restore at 100k splits makes two per split, a batch one per split it reads)."""

    body: SplitT
    start: int
    stop: int
    seq: int = 0
    ends: bool = False

    @property
    def records(self) -> int:
        """What batch :attr:`seq` read of the split."""
        return max(0, self.stop - self.start)

    @property
    def split(self) -> SplitT:
        """The split at :attr:`start`, where the slice's reader begins."""
        return at(self.body, self.start)


def at(split: SplitT, position: int) -> SplitT:
    """``split`` at ``position``: itself when it is there."""
    return split if split.position == position else with_position(split, position)


@dataclass(frozen=True)
class BatchOffset(Generic[SplitT, EnumStateT]):
    """Spark's offset of one micro-batch: a full checkpoint of the source after it."""

    seq: int
    enumerator: EnumStateT
    slots: tuple[tuple[Slice[SplitT], ...], ...]
    backlog: bool = False
    """Whether the source was processing backlog when the batch was planned."""
    events_through: int = 0
    """Reader events of batches up to this one are applied to ``enumerator``."""
    to_readers: Mapping[int, tuple[SourceEvent, ...]] = field(default_factory=dict)
    """Events from the enumerator for each slot's tasks of this batch."""
    ledger: StateRef | None = None
    """Where ``enumerator``'s ledger is, when it is kept in the state directory (then
    ``enumerator`` holds the rest of the state; see :mod:`splitflow.spark.ledger`)."""
    event_times: Mapping[str, int] = field(default_factory=dict)
    """Each held split's watermark: the latest event time read from it (microseconds), as
    reported by the batches up to ``events_through``."""
    owner: str | None = None
    """The token of the query's state directory (:class:`~splitflow.spark.statedir.Owner`),
    with ``stateDir``."""
    read_slices: tuple[tuple[Slice[SplitT], ...], ...] | None = field(
        default=None, compare=False, repr=False
    )
    """Each slot's slices that read records, in the slot's order, when the planner that
    made the offset knows them (None: found from ``slots``; see :meth:`reading`)."""
    read_entries: tuple[int, tuple[list[list[Any]], ...]] | None = field(
        default=None, compare=False, repr=False
    )
    """The split codec's version and each slot's entries (:func:`slice_entry`) of the slices
    :meth:`reading` names, in the same order, when :class:`OffsetEncoder` encoded the offset:
    its tasks are these entries (:func:`encode_tasks`)."""

    def reading(self, slot: int) -> tuple[Slice[SplitT], ...]:
        """Slot ``slot``'s slices that read records, in order."""
        found = self.read_slices
        if found is None:
            seq = self.seq
            found = tuple(
                tuple(s for s in slices if s.seq == seq and s.records > 0) for slices in self.slots
            )
            object.__setattr__(self, "read_slices", found)  # derived, kept once found
        return found[slot]

    def has_tasks(self, slot: int) -> bool:
        return bool(self.reading(slot))

    @property
    def parallelism(self) -> int:
        return len(self.slots)

    def reader_states(self) -> dict[int, list[SplitT]]:
        """Each slot's splits at the position reading resumes after this batch (the splits
        the batch ends are finished then)."""
        return {slot: [split for split, _ in kept] for slot, kept in self.resumes().items()}

    def resumes(self) -> dict[int, list[tuple[SplitT, Slice[SplitT]]]]:
        """:meth:`reader_states`, each split with its slice in this offset."""
        return {
            slot: [(at(s.body, s.stop), s) for s in slices if not s.ends]
            for slot, slices in enumerate(self.slots)
        }

    def encode(
        self,
        source: Source[Any, SplitT, EnumStateT],
        encoder: OffsetEncoder[SplitT, EnumStateT] | None = None,
    ) -> JsonDict:
        """The offset as JSON primitives (``encoder``: the planner's, which reuses what it
        encoded for the offset before)."""
        return (encoder or OffsetEncoder(source)).encode(self)

    @classmethod
    def decode(
        cls, data: Mapping[str, Any], source: Source[Any, SplitT, EnumStateT]
    ) -> BatchOffset[SplitT, EnumStateT]:
        if data.get("initial"):
            raise ValueError(
                "the initial offset holds no state: only the planner that made it knows it"
            )
        version = data.get("splitflow")
        if version not in READ_FORMATS:
            raise IncompatibleCheckpointError(
                "splitflow offset in the Spark checkpoint", found=version, expected=OFFSET_FORMAT
            )
        enum_version, split_version = data["codecs"]
        codec = source.split_codec
        seq = int(data["seq"])
        slots: tuple[tuple[Slice[SplitT], ...], ...]
        if version == OFFSET_FORMAT:
            slots = tuple(
                tuple(
                    Slice(
                        codec.decode(s, split_version),
                        int(start),
                        int(stop),
                        int(read_by),
                        bool(ends),
                    )
                    for _, s, start, stop, read_by, *ends in slot
                )
                for slot in data["slots"]
            )
        elif version == FORMAT_3:  # a slice starts at its split's position
            slots = tuple(
                tuple(
                    _format_3_slice(codec.decode(s, split_version), int(stop), int(read_by), ends)
                    for _, s, stop, read_by, *ends in slot
                )
                for slot in data["slots"]
            )
        else:  # format 1: every slice that reads is read by this offset's batch
            slots = tuple(
                tuple(
                    _format_1_slice(codec.decode(s, split_version), int(stop), seq, bool(ends))
                    for _, s, stop, *ends in slot
                )
                for slot in data["slots"]
            )
        return cls(
            seq=seq,
            enumerator=source.enumerator_state_codec.decode(data["enumerator"], enum_version),
            slots=slots,
            backlog=bool(data.get("backlog", False)),
            events_through=int(data.get("events_through", 0)),
            to_readers={
                int(r): tuple(
                    decode_events(e, f"events to reader {r} in the splitflow offset of batch {seq}")
                )
                for r, e in data.get("to_readers", {}).items()
            },
            ledger=StateRef.decode(data["ledger"]) if "ledger" in data else None,
            event_times={k: int(v) for k, v in data.get("event_times", {}).items()},
            owner=data.get("owner"),
        )


def slice_entry(piece: Slice[SplitT], encoded: Any) -> list[Any]:
    """``piece`` as an offset encodes it, with its split encoded as ``encoded``:
    ``[split id, encoded split, start, stop, seq]``, and a last ``1`` when it ends."""
    entry = [piece.body.split_id, encoded, piece.start, piece.stop, piece.seq]
    if piece.ends:
        entry.append(1)
    return entry


def _format_3_slice(split: SplitT, stop: int, seq: int, ends: Sequence[Any]) -> Slice[SplitT]:
    return Slice(split, split.position, stop, seq, bool(ends))


def _format_1_slice(split: SplitT, stop: int, seq: int, ends: bool) -> Slice[SplitT]:
    return Slice(split, split.position, stop, seq if stop > split.position else 0, ends)


class Changed(NamedTuple):
    """A slot's entries that changed from one offset to the next."""

    split: list[list[Any]]
    """Entries whose split is encoded anew (another object of the same split id)."""
    kept: list[list[Any]]
    """Entries that keep the split encoding (the same object) of the slot's entry before:
    only their slice's start, stop, seq or end changed."""


class OffsetEncoder(Generic[SplitT, EnumStateT]):
    """Encodes one planner's offsets, each reusing what the one before it encoded.

    A slot's slices are encoded as a list of entries ``[split id, split, start, stop, seq,
    (1 if it ends)]`` in the slot's order. Splits and slices are immutable and a batch
    changes few of them (those it reads), so when a slot holds the same splits in the same
    order as in the offset encoded last, the slices that are not the same objects as then
    are found by identity at C speed, and only their entries are made anew: the others are
    the same list objects as before (which :func:`~splitflow.spark.offsetstate.difference`
    skips by identity). A slice's split is the object assigned, whatever the batches read,
    so a new entry keeps the encoding of its split (encoded once, when it was assigned). A
    slot whose splits changed is encoded whole, reusing each split's encoding. After a
    restore, the offset restored from counts as the one encoded last (:meth:`seed`).

    Called by: the planner, one offset at a time.
    """

    def __init__(self, source: Source[Any, SplitT, EnumStateT]) -> None:
        self.source = source
        self._codec = source.split_codec
        self._slots: Sequence[Sequence[Slice[SplitT]]] = ()
        self._entries: list[list[list[Any]]] = []
        self.changed: list[Changed | None] = []
        """Per slot of the offset encoded last: its entries that are new (the others are as
        in :attr:`since`), or None when the slot was encoded whole."""
        self.since: list[list[list[Any]]] | None = None
        """The ``slots`` of the offset encoded before the last one (what :attr:`changed`
        is relative to)."""
        self._seeded = False  # the last offset is a decoded one (seed)
        self._by_id: dict[str, tuple[SplitT, list[Any]]] | None = None  # its entries by id

    def seed(self, offset: BatchOffset[SplitT, EnumStateT], data: Mapping[str, Any]) -> None:
        """Encode the next offset as one that follows ``offset``, decoded from ``data`` (a
        whole offset) by a restore: a slice it keeps (the same object) keeps its entry of
        ``data``, in whichever slot it is now. Only when ``data`` is of this format and
        these codec versions: its splits' encodings are then what this encoder writes."""
        codecs = [self.source.enumerator_state_codec.version, self.source.split_codec.version]
        if data.get("splitflow") != OFFSET_FORMAT or list(data.get("codecs", ())) != codecs:
            return
        self._slots, self._entries, self._seeded = offset.slots, data["slots"], True

    def encode(self, offset: BatchOffset[SplitT, EnumStateT]) -> JsonDict:
        enum_codec = self.source.enumerator_state_codec
        self._codec = self.source.split_codec  # a source may make it anew on each access
        entries: list[list[list[Any]]] = []
        changed: list[Changed | None] = []
        reads: list[list[list[Any]]] = []  # each slot's entries of the slices read
        seq = offset.seq
        for index, slices in enumerate(offset.slots):
            last = self._slots[index] if index < len(self._slots) else ()
            was = self._entries[index] if index < len(self._entries) else []
            moved = (
                list(compress(range(len(slices)), map(is_not, slices, last)))
                if len(last) == len(slices)
                else None
            )
            read_on = None if moved is None else self._read_on(slices, last, was, moved, seq)
            if read_on is not None:
                now, new, read = read_on
                changed.append(new)
            else:
                by_id = self._entries_by_id() if self._seeded else _by_id(last, was)
                now = [self._entry(s, *by_id.get(s.body.split_id, (None, None))) for s in slices]
                changed.append(None)
                read = [
                    e for e, s in zip(now, slices, strict=True) if s.seq == seq and s.stop > s.start
                ]
            entries.append(now)
            reads.append(read)
        self.since = self._entries if self._slots else None
        self._slots, self._entries, self.changed = offset.slots, entries, changed
        self._seeded, self._by_id = False, None
        object.__setattr__(offset, "read_entries", (self._codec.version, tuple(reads)))
        return {
            "splitflow": OFFSET_FORMAT,
            "seq": offset.seq,
            "codecs": [enum_codec.version, self._codec.version],
            "enumerator": enum_codec.encode(offset.enumerator),
            "slots": entries,
            "backlog": offset.backlog,
            "events_through": offset.events_through,
            "to_readers": {str(r): encode_events(e) for r, e in offset.to_readers.items() if e},
            **({} if offset.ledger is None else {"ledger": offset.ledger.encode()}),
            **({"event_times": dict(offset.event_times)} if offset.event_times else {}),
            **({} if offset.owner is None else {"owner": offset.owner}),
        }

    def _entries_by_id(self) -> dict[str, tuple[SplitT, list[Any]]]:
        """Every slot's entries of the last offset by split id: a restore may have moved a
        split to another slot."""
        if self._by_id is None:
            self._by_id = {}
            for slices, entries in zip(self._slots, self._entries, strict=True):
                self._by_id.update(_by_id(slices, entries))
        return self._by_id

    def _read_on(
        self,
        slices: Sequence[Slice[SplitT]],
        last: Sequence[Slice[SplitT]],
        was: list[list[Any]],
        moved: list[int],
        seq: int,
    ) -> tuple[list[list[Any]], Changed, list[list[Any]]] | None:
        """A slot's entries when only its slices ``moved`` (indexes) are new since the
        offset encoded last (``last``, encoded as ``was``), each of the same split id as
        then: all of them, those that are new, and those that batch ``seq`` reads. None when
        a split id differs (the slot holds other splits: encoded whole).

        One pass over the moved slices (at 1M splits, 100k a batch): most read on from the
        same split object and do not end, and get :func:`slice_entry`'s entry, inline."""
        now = list(was)
        new = Changed([], [])
        split, kept = new.split, new.kept
        read = []
        for i in moved:
            piece, entry = slices[i], was[i]
            body, start, stop, read_by, ends = piece
            if body.split_id != entry[0]:
                return None
            if body is last[i].body and not ends:  # read on: most slices
                made = [entry[0], entry[1], start, stop, read_by]
                kept.append(made)
            else:
                made = self._entry(piece, last[i].body, entry)
                if made is not entry:
                    (kept if made[1] is entry[1] else split).append(made)
            now[i] = made
            if read_by == seq and stop > start:
                read.append(made)
        return now, new, read

    def _entry(self, piece: Slice[SplitT], split: Any, entry: list[Any] | None) -> list[Any]:
        """``piece``'s entry; ``entry`` is what encoded ``split`` (of the same id) last."""
        if entry is None or piece.body is not split:  # new, or another object (assigned again)
            return slice_entry(piece, self._codec.encode(piece.body))
        made = slice_entry(piece, entry[1])
        return entry if made == entry else made


def _by_id(
    slices: Sequence[Slice[SplitT]], entries: Sequence[list[Any]]
) -> dict[str, tuple[SplitT, list[Any]]]:
    return {s.body.split_id: (s.body, e) for s, e in zip(slices, entries, strict=True)}


def encode_tasks(
    end: BatchOffset[SplitT, EnumStateT], codec: Codec[SplitT], max_records_per_task: int | None
) -> list[tuple[int, list[list[Any]]]]:
    """The tasks of a batch (:func:`plan_partitions`), each a slot and its slices' entries
    (:func:`slice_entry`; a task reads ``encoded split`` from ``start`` to ``stop``): the
    offset's own entries where the encoder kept them (:attr:`BatchOffset.read_entries`, of
    the same codec version), else made now; under ``max_records_per_task``, entries of the
    cut slices, with the kept encodings. The encoded split may be at another position than
    ``start`` (:class:`Slice`): the task moves it there (:func:`at`)."""
    kept = end.read_entries
    entries = kept[1] if kept is not None and kept[0] == codec.version else None

    def read(slot: int) -> list[list[Any]]:
        reading = end.reading(slot)
        if entries is not None and len(entries[slot]) == len(reading):
            return entries[slot]
        return [slice_entry(s, codec.encode(s.body)) for s in reading]

    if max_records_per_task is None:
        return [(slot, read(slot)) for slot in range(end.parallelism) if end.reading(slot)]
    encoded = {  # each split read, by its object's id (the offset holds them all)
        id(s.body): entry[1]
        for slot in range(end.parallelism)
        for s, entry in zip(end.reading(slot), read(slot), strict=True)
    }
    return [
        (slot, [slice_entry(s, encoded[id(s.body)]) for s in slices])
        for slot, slices in plan_partitions(end, max_records_per_task)
    ]


def plan_partitions(
    end: BatchOffset[SplitT, EnumStateT], max_records_per_task: int | None
) -> list[tuple[int, list[Slice[SplitT]]]]:
    """The tasks of a batch: each slot's non-empty slices, cut to at most that many records.

    Pure: the same offset always gives the same tasks (a replay reads the same records).
    """
    cap = max_records_per_task
    tasks: list[tuple[int, list[Slice[SplitT]]]] = []
    if cap is None:  # a task per slot that reads, with the offset's own slices
        return [
            (slot, list(end.reading(slot))) for slot in range(end.parallelism) if end.reading(slot)
        ]
    for slot_id in range(end.parallelism):
        current: list[Slice[SplitT]] = []
        size = 0
        for piece in end.reading(slot_id):
            start = piece.start
            while start < piece.stop:
                take = min(piece.stop - start, cap - size)
                current.append(Slice(piece.body, start, start + take, piece.seq))
                size += take
                start += take
                if size >= cap:
                    tasks.append((slot_id, current))
                    current, size = [], 0
        if current:
            tasks.append((slot_id, current))
    return tasks
