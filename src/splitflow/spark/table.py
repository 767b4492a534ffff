"""Each held split's position and extent in arrays, a row per split (docs/design.md, "Slot
arrays"): a batch's backlogs, the splits at their end and every lag are array expressions
over all held splits, with no Python work per split that did not change. No pyspark import.

Positions and extents are written as they change (a split assigned, read, rewound, its
extent learnt); rows of splits that left are reused. Values are int64 within 2**62 either
way of 0 (so that no difference of two overflows), or Python ints in object arrays once one
is past that (a log position).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import pairwise, repeat
from operator import is_
from typing import NamedTuple, cast

import numpy as np

from splitflow.api.enumerator import SplitExtent
from splitflow.spark.limits import Backlogs, exact_sum, int_array

_VALUES = ("position", "latest", "exists", "stop")


class SlotReads(NamedTuple):
    """What a batch reads of one slot's splits, in split id order: their ``ids``, their
    ``rows`` and the records each reads (``values``, an array like :attr:`Backlogs.values`)."""

    ids: list[str]
    rows: np.ndarray
    values: np.ndarray


class SplitTable:
    """The held splits of one planner: ``slot``, ``position``, and of the extent last learnt
    ``latest``, ``exists`` (how far the split exists), ``stop`` (how far a batch may read it:
    ``latest``, or less under ``availableNow``) and ``final``; ``known``: held, with an
    extent; ``body``: the split object of its slice in the planner (as it was assigned or
    restored: its own position may be behind the row's). A row without a split, or
    without an extent, has no backlog and no lag."""

    def __init__(self) -> None:
        self.ids = np.empty(0, dtype=object)  # row -> split id (None: a free row)
        self.body = np.empty(0, dtype=object)
        self.row_of: dict[str, int] = {}
        self._free: list[int] = []
        self._rows = 0  # rows in use, free ones included
        self.slot = self.position = self.latest = self.exists = self.stop = np.zeros(0, np.int64)
        self.final = self.known = np.zeros(0, dtype=bool)

    def add(
        self, ids: Sequence[str], slot: int, positions: Sequence[int], bodies: Sequence[object]
    ) -> None:
        """Splits ``ids`` (objects ``bodies``) join slot ``slot`` at ``positions``: new ones
        with their extents not known yet; one held until now (assigned again) keeps its row
        and extent."""
        row_of = self.row_of
        again = [i for i, sid in enumerate(ids) if sid in row_of]
        if again:
            rows = np.array([row_of[ids[i]] for i in again], np.intp)
            self.slot[rows] = slot
            self._store("position", rows, [positions[i] for i in again])
            _put(self.body, rows, [bodies[i] for i in again])
            kept = set(again)
            ids = [sid for i, sid in enumerate(ids) if i not in kept]
            positions = [position for i, position in enumerate(positions) if i not in kept]
            bodies = [body for i, body in enumerate(bodies) if i not in kept]
        rows = self._allocate(len(ids))
        self.ids[rows] = ids
        _put(self.body, rows, bodies)
        row_of.update(zip(ids, rows.tolist(), strict=True))
        self.known[rows] = False
        self.slot[rows] = slot
        self._store("position", rows, positions)

    def remove(self, split_id: str) -> None:
        row = self.row_of.pop(split_id, None)
        if row is not None:
            self.ids[row] = self.body[row] = None
            self.known[row] = False
            self._free.append(row)

    def move(self, ids: Iterable[str], positions: Sequence[int]) -> None:
        """Held splits ``ids`` are now at ``positions``."""
        row_of = self.row_of
        self._store("position", np.array([row_of[sid] for sid in ids], np.intp), positions)

    def note(
        self,
        ids: Iterable[str],
        extents: Mapping[str, SplitExtent],
        cap: Callable[[str, SplitExtent], int] | None = None,
    ) -> bool:
        """The extents of splits ``ids`` (those not held are left out; none in ``extents``:
        not known), and how far a batch may read each (``cap``; default: its ``latest``);
        whether every one of ``ids`` is held.

        One dict lookup per split in each of the two dicts: at 1M splits every lookup of a
        changed split misses the CPU's caches."""
        ids = list(ids)
        held = list(map(self.row_of.get, ids))
        told = list(map(extents.get, ids))
        all_held = None not in held
        if not all_held or holds_none(told):
            self.known[
                [r for r, e in zip(held, told, strict=True) if r is not None and e is None]
            ] = False
            kept = [
                i
                for i, (r, e) in enumerate(zip(held, told, strict=True))
                if r is not None and e is not None
            ]
            ids, held, told = (
                [ids[i] for i in kept],
                [held[i] for i in kept],
                [told[i] for i in kept],
            )
        rows, found = cast(list[int], held), cast(list[SplitExtent], told)
        if not rows:
            return all_held
        at = np.array(rows, np.intp)
        latest = [extent.latest for extent in found]
        available = [extent.available for extent in found]
        self._store("latest", at, latest)
        if available.count(None) == len(available):
            self._store("exists", at, latest)
        else:
            self._store("exists", at, [extent.exists_to for extent in found])
        self._store("stop", at, latest if cap is None else list(map(cap, ids, found)))
        self.final[at] = [extent.final for extent in found]
        self.known[at] = True
        return all_held

    # -- array expressions over every row ---------------------------------------------

    def backlogs(self) -> Backlogs:
        """What each split may read next: only splits with records to read."""
        n = self._rows
        backlog = self.stop[:n] - self.position[:n]
        rows = np.flatnonzero(self.known[:n] & (backlog > 0))
        return Backlogs(self.ids[rows], backlog[rows], rows)

    def ended(self) -> dict[int, list[str]]:
        """Each slot's splits at their final position with nothing to read (sorted), to be
        finished without a batch reading to their end: an empty file, a split whose end
        became known after its last read, a restore from an offset that did not finish it."""
        n = self._rows
        position = self.position[:n]
        at_end = (
            self.known[:n]
            & self.final[:n]
            & (position >= self.latest[:n])
            & (self.stop[:n] <= position)
        )
        return self._by_slot(np.flatnonzero(at_end))

    def placed(self, reads: Backlogs) -> Backlogs:
        """``reads`` (of held splits) with each split's row: those it has, else looked up
        (a split not held is left out)."""
        if reads.rows is not None:
            return reads
        held = list(map(self.row_of.get, reads.ids.tolist()))
        if None in held:  # not expected: a batch reads held splits
            kept = np.array([row is not None for row in held], dtype=bool)
            reads = Backlogs(reads.ids[kept], reads.values[kept])
            held = [row for row in held if row is not None]
        return Backlogs(reads.ids, reads.values, np.array(held, np.intp))

    def read_to_end(self, reads: Backlogs) -> dict[int, list[str]]:
        """Each slot's splits (sorted) that ``reads`` (:meth:`placed`) takes to their final
        position."""
        rows = cast(np.ndarray, reads.rows)
        stops = self.position[rows] + reads.values
        at_end = self.known[rows] & self.final[rows] & (stops >= self.latest[rows])
        return self._by_slot(rows[at_end])

    def advance(self, reads: Backlogs) -> None:
        """The splits ``reads`` (:meth:`placed`) names are read on by its records."""
        rows = cast(np.ndarray, reads.rows)
        self._store("position", rows, self.position[rows] + reads.values)

    def slots_of(self, reads: Backlogs) -> dict[int, SlotReads]:
        """What ``reads`` (:meth:`placed`) reads of each slot's splits."""
        rows = cast(np.ndarray, reads.rows)
        return {
            slot: SlotReads(ids, rows[at], reads.values[at])
            for slot, (ids, at) in self._grouped(rows).items()
        }

    def lags(self) -> np.ndarray:
        """What exists past each row's position (0 for rows without a split or extent)."""
        n = self._rows
        lag = self.exists[:n] - self.position[:n]
        return np.where(self.known[:n] & (lag > 0), lag, 0)

    def slot_lags(self, lags: np.ndarray, parallelism: int) -> list[int]:
        """Each slot's sum of ``lags`` (of :meth:`lags`)."""
        slots = self.slot[: self._rows]
        if lags.dtype == object or exact_sum(lags) >= 2**63:
            return [exact_sum(lags[slots == slot]) for slot in range(parallelism)]
        totals = np.zeros(parallelism, np.int64)
        np.add.at(totals, slots, lags)
        return [int(total) for total in totals]

    def lagging(self, lags: np.ndarray) -> dict[int, list[str]]:
        """Each slot's splits with a lag (of :meth:`lags`), sorted."""
        return self._by_slot(np.flatnonzero(lags > 0))

    def _by_slot(self, rows: np.ndarray) -> dict[int, list[str]]:
        """The splits of ``rows`` grouped by slot (in slot order), each group sorted."""
        return {slot: ids for slot, (ids, _) in self._grouped(rows).items()}

    def _grouped(self, rows: np.ndarray) -> dict[int, tuple[list[str], np.ndarray]]:
        """The splits of ``rows`` grouped by slot (in slot order), each group sorted, with
        the indexes in ``rows`` of its splits, in the same order."""
        slots = self.slot[rows]
        order = np.argsort(slots, kind="stable")
        slots = slots[order]
        ids = self.ids[rows[order]].tolist()
        starts = [0, *(np.flatnonzero(slots[1:] != slots[:-1]) + 1).tolist(), len(ids)]
        groups = {}
        for a, b in pairwise(starts):
            if a < b:
                group = ids[a:b]
                by_id = sorted(range(b - a), key=group.__getitem__)
                groups[int(slots[a])] = ([group[i] for i in by_id], order[a:b][by_id])
        return groups

    # -- storage ------------------------------------------------------------------------

    def _allocate(self, count: int) -> np.ndarray:
        reused = [self._free.pop() for _ in range(min(count, len(self._free)))]
        fresh = count - len(reused)
        if self._rows + fresh > len(self.ids):
            self._grow(max(self._rows + fresh, 2 * len(self.ids), 1024))
        rows = np.array(reused + list(range(self._rows, self._rows + fresh)), np.intp)
        self._rows += fresh
        return rows

    def _grow(self, capacity: int) -> None:
        def grown(column: np.ndarray) -> np.ndarray:
            bigger = np.zeros(capacity, dtype=column.dtype)
            bigger[: len(column)] = column
            return bigger

        for name in ("ids", "body"):
            objects = np.empty(capacity, dtype=object)
            objects[: len(getattr(self, name))] = getattr(self, name)
            setattr(self, name, objects)
        for name in (*_VALUES, "slot", "final", "known"):
            setattr(self, name, grown(getattr(self, name)))

    def _store(self, name: str, rows: np.ndarray, values: Sequence[int]) -> None:
        """``values`` into column ``name`` at ``rows``; every column holds Python ints from
        the first value that does not fit 63 bits (so that no difference of two overflows)."""
        column = getattr(self, name)
        if column.dtype != object:
            array = int_array(values)
            if array.dtype != object and _within(array):
                column[rows] = array
                return
            for other in _VALUES:
                setattr(self, other, getattr(self, other).astype(object))
        getattr(self, name)[rows] = values


def _put(column: np.ndarray, rows: np.ndarray, objects: Sequence[object]) -> None:
    """``objects`` into object column ``column`` at ``rows``, each as it is (NumPy would
    take a tuple, say a named tuple's split, for a sequence to spread)."""
    column[rows] = np.fromiter(objects, dtype=object, count=len(objects))


def _within(values: np.ndarray) -> bool:
    """Whether every int64 value is within ``[-2**62, 2**62)``."""
    return not len(values) or bool(values.max() < 2**62 and values.min() >= -(2**62))


def holds_none(values: Iterable[object]) -> bool:
    """Whether ``values`` holds None, by identity at C speed (``None in values`` calls each
    value's ``__eq__``: Python code for a dataclass)."""
    return any(map(is_, values, repeat(None)))
