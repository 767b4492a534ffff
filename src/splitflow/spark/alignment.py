"""Event-time alignment: where each split stops in a micro-batch so that no split's records
arrive late for Spark's one watermark (FLIP-182, FLIP-217; see :mod:`.eventtime` and
``docs/event-time.md``). The planner asks :class:`Aligner` once per batch, with the splits
it holds, their extents and backlogs, and applies the caps it returns. No pyspark import.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic

from splitflow.api.enumerator import SplitExtent
from splitflow.api.split import SplitT, with_position
from splitflow.spark.eventtime import EventTimeSettings
from splitflow.spark.limits import Backlogs, MaxBytes, MaxRecords, ReadAll, reads_under


class Aligner(Generic[SplitT]):
    """Aligns one query run's batches by event time (:meth:`align`), with ``settings``
    (``maxEventTimeDrift`` set). ``event_times``: the source's event time at each split's
    position (the enumerator's ``event_times``, left out where it cannot tell);
    ``positions_after``: the source's first position of each split whose record is later
    than a time (``positions_after``). It remembers when each split last had records to
    read (for ``splitIdleTimeout``) and the event time at each split's position."""

    rounds = 3
    """How many bounds :meth:`align` tries before it takes the safe one."""

    def __init__(
        self,
        settings: EventTimeSettings,
        event_times: Callable[[Sequence[SplitT]], Mapping[str, int]],
        positions_after: Callable[[Sequence[SplitT], int], Mapping[str, int]],
    ) -> None:
        assert settings.max_drift is not None
        self.settings = settings
        self.max_drift: int = settings.max_drift
        self._event_times = event_times
        self._positions_after = positions_after
        self._active_at: dict[str, float] = {}  # split id -> when it last had records to read
        self._next_times: dict[str, tuple[int, int]] = {}  # id -> (position, its event time)
        self._times_memo: dict[tuple[str, int], int | None] = {}  # this batch's answers

    def align(
        self,
        held: Mapping[str, SplitT],
        extents: Mapping[str, SplitExtent],
        backlogs: Mapping[str, int],
        limit: ReadAll | MaxRecords | MaxBytes,
        watermarks: Mapping[str, int],
        *,
        now: float,
        available_now: bool = False,
    ) -> Alignment:
        """Where each split must stop in the next batch so that no active split's records
        are late: Spark's watermark follows the latest event time read, so after the batch
        that must be at most ``max_drift`` past the earliest record any active split still
        has to read (its *floor*).

        ``held``: the splits the slots hold (with an extent); ``backlogs``: what each may
        read now; ``limit``: the batch's read limit; ``watermarks``: each split's latest
        event time read; ``now``: the planner's clock; ``available_now``: the run reads up
        to a target (``trigger(availableNow=True)``).

        A split is active while it has records to read, and for ``idle_timeout`` seconds
        after; idle splits hold nobody back, nor, under ``trigger(availableNow=True)``, do
        splits at the run's target (they read nothing more in it). An active split's
        *current* event time is its next record's where the source tells it, else its
        watermark. A split the source cannot tell, with records to read, is read alone, one
        position, to learn where it stands.

        Indexed sources (``settings.indexed``): the batch reads up to an event-time bound.
        A split whose next record is past it pauses; the others stop at the source's
        position for it (``positions_after``), searched where the source maps a split to
        its own position while its next record is within (a coarse index, or one that
        contradicts the record) or maps none. The bound starts at the floor of a batch
        read without alignment plus the drift, so that splits that move together read
        whole shares; the floor is then taken again at the stops the bound gives (the
        event time at each active split's stop, or of its last record when it reads all
        it has now; a split read to its final position has none), and the bound lowered
        until it holds, at most :attr:`rounds` times, after which it is the slowest
        active split's current time plus the drift (always safe: no split's next record is
        earlier). Event time must not decrease along a split.

        Other sources: a split whose watermark is past the slowest one's plus the drift
        pauses; the others read their shares (they may overshoot by one).
        """
        settings = self.settings
        max_drift = self.max_drift
        self._times_memo = {}
        for sid, split in held.items():
            if extents[sid].exists_to > split.position or sid not in self._active_at:
                self._active_at[sid] = now
        for sid in [sid for sid in self._active_at if sid not in held]:
            del self._active_at[sid]
        to_read = {sid: split.position + backlogs.get(sid, 0) for sid, split in held.items()}
        idle = frozenset(
            sid
            for sid, split in held.items()
            if now - self._active_at[sid] >= settings.idle_timeout
            or (available_now and to_read[sid] <= split.position)
        )
        waiting = {
            sid: split
            for sid, split in held.items()
            if sid not in idle and to_read[sid] > split.position
        }
        next_times = self._next_event_times(waiting) if settings.indexed else {}
        current = {
            sid: t
            for sid in held
            if sid not in idle and (t := next_times.get(sid, watermarks.get(sid))) is not None
        }
        positions = {sid: split.position for sid, split in waiting.items()}

        def aligned(bound: int | None, caps: dict[str, int]) -> Alignment:
            return Alignment(
                min(current.values(), default=None), bound, current, idle, caps, positions
            )

        unknown = [sid for sid in waiting if sid not in current]
        if unknown:  # read alone, one position each
            return aligned(None, {sid: p + (sid in unknown) for sid, p in positions.items()})
        if not current:
            return aligned(None, {})
        safe = min(current.values()) + max_drift
        if not settings.indexed:
            return aligned(
                safe, {sid: s.position for sid, s in waiting.items() if current[sid] > safe}
            )
        bound: int | None = None
        caps: dict[str, int] = {}
        for _ in range(self.rounds):
            reads = reads_under(
                limit, Backlogs.of(capped(backlogs, caps, positions)), extents
            ).as_dict()
            floor = self._floor(held, waiting, current, extents, to_read, reads)
            if floor is None or (bound is not None and bound <= floor + max_drift):
                return aligned(bound, caps)
            bound = floor + max_drift
            caps = self._stops(waiting, current, to_read, bound)
        return aligned(safe, self._stops(waiting, current, to_read, safe))

    def _floor(
        self,
        held: Mapping[str, SplitT],
        waiting: Mapping[str, SplitT],
        current: Mapping[str, int],
        extents: Mapping[str, SplitExtent],
        to_read: Mapping[str, int],
        reads: Mapping[str, int],
    ) -> int | None:
        """The earliest event time an active split will have left to read after a batch
        that reads ``reads``; None when none will (all read to their final position)."""
        floor: dict[str, int] = {}
        ask = []
        for sid, time_now in current.items():
            split = held[sid]
            stop = split.position + reads.get(sid, 0)
            if stop == split.position or sid not in waiting:
                floor[sid] = time_now
            elif not (extents[sid].final and stop >= extents[sid].latest):
                floor[sid] = time_now  # unless the source tells the time where it stops
                ask.append(with_position(split, min(stop, to_read[sid] - 1)))
        floor.update(self._times_at(ask))
        return min(floor.values(), default=None)

    def _stops(
        self,
        waiting: Mapping[str, SplitT],
        current: Mapping[str, int],
        to_read: Mapping[str, int],
        bound: int,
    ) -> dict[str, int]:
        """Where each waiting split stops to read nothing later than ``bound``: at its
        position when its next record is later; else where the source maps it, searched
        where it maps it to its position or not at all (``to_read``: how far each may read)."""
        within = {sid: split for sid, split in waiting.items() if current[sid] <= bound}
        caps = {sid: split.position for sid, split in waiting.items() if sid not in within}
        mapped = self._positions_after(list(within.values()), bound) if within else {}
        for sid, split in within.items():
            if mapped.get(sid, split.position) > split.position:
                caps[sid] = mapped[sid]
        search = {sid: split for sid, split in within.items() if sid not in caps}
        bounds = {sid: to_read[sid] for sid in search}
        caps.update(self._search_after(search, bounds, bound, current))
        return caps

    def _search_after(
        self,
        splits: Mapping[str, SplitT],
        bounds: Mapping[str, int],
        limit: int,
        known: Mapping[str, int],
    ) -> dict[str, int]:
        """Each split's first position below its bound whose record is later than ``limit``
        (else its bound), by asking the event time at positions (event time must not
        decrease along a split; ``known``: the time at each split's position, within
        ``limit``). One ``event_times`` call per step for all splits: first the last
        position, then a guess from the times at both ends of what is left (they are
        often spaced evenly), or its middle when the last guess did not halve it."""
        low = {sid: split.position for sid, split in splits.items()}
        at_low = dict(known)
        high = dict(bounds)
        at_high: dict[str, int] = {}
        halve: set[str] = set()
        probes = {sid: high[sid] - 1 for sid in splits if high[sid] - 1 > low[sid]}
        while probes:
            times = self._times_at([with_position(splits[sid], at) for sid, at in probes.items()])
            for sid, at in probes.items():
                width = high[sid] - low[sid]
                if sid in times and times[sid] <= limit:
                    low[sid], at_low[sid] = at, times[sid]
                else:
                    high[sid] = at
                    if sid in times:
                        at_high[sid] = times[sid]
                if 2 * (high[sid] - low[sid]) > width:
                    halve.add(sid)
                else:
                    halve.discard(sid)
            probes = {}
            for sid in splits:
                lo, hi = low[sid], high[sid]
                if hi - lo <= 1:
                    continue
                probe = (lo + hi) // 2
                if sid not in halve and sid in at_high and at_high[sid] > at_low[sid]:
                    spread = at_high[sid] - at_low[sid]
                    guess = lo + (limit - at_low[sid]) * (hi - lo) // spread
                    probe = min(max(guess, lo + 1), hi - 1)
                probes[sid] = probe
        return high

    def _times_at(self, splits: Sequence[SplitT]) -> dict[str, int]:
        """The source's event time at each split's position, each position asked once per
        planned batch (:meth:`align` asks the same ones in its rounds); splits it cannot
        tell are left out."""
        memo = self._times_memo
        ask = [s for s in splits if (s.split_id, s.position) not in memo]
        if ask:
            answers = self._event_times(ask)
            for split in ask:
                memo[(split.split_id, split.position)] = answers.get(split.split_id)
        return {s.split_id: t for s in splits if (t := memo[(s.split_id, s.position)]) is not None}

    def _next_event_times(self, waiting: Mapping[str, SplitT]) -> dict[str, int]:
        """The event time at each waiting split's position, asked once per position."""
        cached = {
            sid: hit[1]
            for sid, split in waiting.items()
            if (hit := self._next_times.get(sid)) is not None and hit[0] == split.position
        }
        answers = self._times_at([split for sid, split in waiting.items() if sid not in cached])
        self._next_times = {
            sid: (waiting[sid].position, t) for sid, t in {**cached, **answers}.items()
        }
        return {**cached, **answers}


def capped(
    backlogs: Mapping[str, int], caps: Mapping[str, int], positions: Mapping[str, int]
) -> dict[str, int]:
    """``backlogs`` cut to end at ``caps`` (split id -> stop) from ``positions``."""
    result = dict(backlogs)
    for sid, cap in caps.items():
        result[sid] = min(result.get(sid, 0), cap - positions[sid])
    return result


@dataclass(frozen=True)
class Alignment:
    """How one batch was aligned by event time: the watermark (the slowest active split's
    current event time), the limit (the latest event time the batch reads), each active
    split's current event time, the idle splits, and where splits must stop (``caps``)
    from their ``positions`` (of the splits with records to read)."""

    watermark: int | None
    limit: int | None
    current: Mapping[str, int]
    idle: frozenset[str]
    caps: Mapping[str, int]
    positions: Mapping[str, int]

    @property
    def paused(self) -> frozenset[str]:
        """The splits that read nothing in the batch (capped at their position)."""
        return frozenset(sid for sid, cap in self.caps.items() if cap <= self.positions[sid])
