"""Spark's offset of one micro-batch (a full checkpoint of the source after it), and the
tasks it is read by. No pyspark import here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic

from splitflow.api.enumerator import EnumStateT
from splitflow.api.events import SourceEvent
from splitflow.api.source import Source
from splitflow.api.split import JsonDict, SplitT, with_position
from splitflow.errors import IncompatibleCheckpointError
from splitflow.spark.events import decode_events, encode_events
from splitflow.spark.snapshots import StateRef

OFFSET_FORMAT = 1
SplitCache = dict[int, tuple[Any, list[Any]]]
"""id(split) -> (split, [split id, encoded split]): what :meth:`BatchOffset.encode` reuses."""


@dataclass(frozen=True)
class Slice(Generic[SplitT]):
    """Split ``split`` is read from ``split.position`` up to ``stop`` (exclusive); ``ends``:
    ``stop`` is the split's final position, so the split is finished after the batch."""

    split: SplitT
    stop: int
    ends: bool = False

    @property
    def records(self) -> int:
        return max(0, self.stop - self.split.position)


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

    def has_tasks(self, slot: int) -> bool:
        return any(s.records > 0 for s in self.slots[slot])

    @property
    def parallelism(self) -> int:
        return len(self.slots)

    def reader_states(self) -> dict[int, list[SplitT]]:
        """Each slot's splits at the position reading resumes after this batch (the splits
        the batch ends are finished then)."""
        return {
            slot: [with_position(s.split, s.stop) for s in slices if not s.ends]
            for slot, slices in enumerate(self.slots)
        }

    def encode(
        self, source: Source[Any, SplitT, EnumStateT], cache: SplitCache | None = None
    ) -> JsonDict:
        """The offset as JSON primitives.

        ``cache`` (the encoder's own, kept from one offset to the next) saves encoding a
        split object that an earlier offset encoded already: splits are immutable, and a
        batch moves few of them. It ends holding this offset's splits only.
        """
        splits = source.split_codec
        enum_codec = source.enumerator_state_codec
        seen: SplitCache = {}

        def encoded(split: SplitT) -> list[Any]:
            hit = None if cache is None else cache.get(id(split))
            if hit is None or hit[0] is not split:
                hit = (split, [split.split_id, splits.encode(split)])
            seen[id(split)] = hit
            return hit[1]

        slots = [
            [[*encoded(s.split), s.stop, *([1] if s.ends else [])] for s in slot]
            for slot in self.slots
        ]
        if cache is not None:
            cache.clear()
            cache.update(seen)
        return {
            "splitflow": OFFSET_FORMAT,
            "seq": self.seq,
            "codecs": [enum_codec.version, splits.version],
            "enumerator": enum_codec.encode(self.enumerator),
            "slots": slots,
            "backlog": self.backlog,
            "events_through": self.events_through,
            "to_readers": {str(r): encode_events(e) for r, e in self.to_readers.items() if e},
            **({} if self.ledger is None else {"ledger": self.ledger.encode()}),
            **({"event_times": dict(self.event_times)} if self.event_times else {}),
            **({} if self.owner is None else {"owner": self.owner}),
        }

    @classmethod
    def decode(
        cls, data: Mapping[str, Any], source: Source[Any, SplitT, EnumStateT]
    ) -> BatchOffset[SplitT, EnumStateT]:
        if data.get("splitflow") != OFFSET_FORMAT:
            raise IncompatibleCheckpointError(
                "splitflow offset in the Spark checkpoint",
                found=data.get("splitflow"),
                expected=OFFSET_FORMAT,
            )
        enum_version, split_version = data["codecs"]
        codec = source.split_codec
        seq = int(data["seq"])
        return cls(
            seq=seq,
            enumerator=source.enumerator_state_codec.decode(data["enumerator"], enum_version),
            slots=tuple(
                tuple(
                    Slice(codec.decode(s, split_version), int(stop), bool(ends))
                    for _, s, stop, *ends in slot
                )
                for slot in data["slots"]
            ),
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


def plan_partitions(
    end: BatchOffset[SplitT, EnumStateT], max_records_per_task: int | None
) -> list[tuple[int, list[Slice[SplitT]]]]:
    """The tasks of a batch: each slot's non-empty slices, cut to at most that many records.

    Pure: the same offset always gives the same tasks (a replay reads the same records).
    """
    cap = max_records_per_task
    tasks: list[tuple[int, list[Slice[SplitT]]]] = []
    for slot_id, slices in enumerate(end.slots):
        current: list[Slice[SplitT]] = []
        size = 0
        for piece in slices:
            start = piece.split.position
            while start < piece.stop:
                take = piece.stop - start if cap is None else min(piece.stop - start, cap - size)
                split = piece.split
                if start != split.position:  # only a slice cut by max_records_per_task moves
                    split = with_position(split, start)
                current.append(Slice(split, start + take))
                size += take
                start += take
                if cap is not None and size >= cap:
                    tasks.append((slot_id, current))
                    current, size = [], 0
        if current:
            tasks.append((slot_id, current))
    return tasks
