"""Read limits of a micro-batch, independent of Spark's classes, and how a budget of
records or bytes is shared over splits by their backlog."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from splitflow.api.enumerator import SplitExtent
from splitflow.errors import ConfigurationError


@dataclass(frozen=True)
class ReadAll:
    """Read everything available (``trigger(once=True)``, batch reads)."""


@dataclass(frozen=True)
class MaxRecords:
    """Read at most ``records`` in one batch, shared over splits by backlog."""

    records: int


@dataclass(frozen=True)
class MaxBytes:
    """Read about ``bytes`` in one batch (the source estimates sizes), and at most
    ``records`` records if given; shared over splits by backlog in bytes."""

    bytes: int
    records: int | None = None
    option: str = "maxBytesPerBatch"
    """The option that set ``bytes`` (errors name it)."""


@dataclass(frozen=True)
class MinRecords:
    """Wait for ``records`` before a batch, unless ``max_delay`` seconds passed since the last."""

    records: int
    max_delay: float
    then: ReadAll | MaxRecords | MaxBytes = ReadAll()


@dataclass(frozen=True)
class BacklogAware:
    """``backlog`` while the source is processing backlog (throughput), else ``live``
    (latency); decided when each batch is planned (see :meth:`Planner.latest_offset`)."""

    backlog: ReadAll | MaxRecords | MaxBytes | MinRecords
    live: ReadAll | MaxRecords | MaxBytes | MinRecords


ReadLimit = ReadAll | MaxRecords | MaxBytes | MinRecords | BacklogAware


def share_records(backlogs: Mapping[str, int], budget: int) -> dict[str, int]:
    """Split ``budget`` records over splits in proportion to their backlog, exactly: the
    splits that get records, and how many (a split left out gets none).

    Every split with a backlog gets at least one record while the budget lasts (largest
    backlog first), so a small split is never starved behind a large one; the rest is shared
    in proportion to backlog, largest remainders first. Never more than a split's backlog,
    never more than ``budget`` in total.

    >>> share_records({"big": 900, "small": 10, "none": 0}, 91)
    {'big': 89, 'small': 2}
    """
    return Backlogs.of(backlogs).share(budget)


class Backlogs:
    """What each split may read next, as arrays: ``ids`` (split ids, an object array) and
    ``values`` (records, int64; Python ints in an object array where they do not fit), and
    where a :class:`~splitflow.spark.table.SplitTable` made them, each split's ``rows``
    there. Budgets are shared over them with array operations: a batch over 100k lagging
    splits with a budget of 10k records makes no Python object per split that reads
    nothing. What a batch reads has the same shape (:meth:`take`, :func:`reads_under`)."""

    def __init__(self, ids: np.ndarray, values: np.ndarray, rows: np.ndarray | None = None) -> None:
        self.ids = ids
        self.values = values
        self.rows = rows

    @classmethod
    def of(cls, backlogs: Mapping[str, int]) -> Backlogs:
        ids = np.array(list(backlogs), dtype=object)
        return cls(ids, int_array(list(backlogs.values())))

    def as_dict(self) -> dict[str, int]:
        return dict(zip(self.ids.tolist(), self.values.tolist(), strict=True))

    def total(self) -> int:
        """The sum of the positive backlogs."""
        return exact_sum(self.values[self.values > 0])

    def _part(self, keep: np.ndarray, values: np.ndarray) -> Backlogs:
        """The splits ``keep`` (indexes or a mask) with ``values``, their rows kept."""
        rows = None if self.rows is None else self.rows[keep]
        return Backlogs(self.ids[keep], values, rows)

    def waiting(self) -> Backlogs:
        """Only the splits with a positive backlog."""
        positive = self.values > 0
        return self if positive.all() else self._part(positive, self.values[positive])

    def share(self, budget: int) -> dict[str, int]:
        """:func:`share_records` over these backlogs."""
        return self.take(budget).as_dict()

    def take(self, budget: int) -> Backlogs:
        """:meth:`share`: the splits that get records, and how many, as arrays."""
        waiting = self.waiting()
        ids, values = waiting.ids, waiting.values
        count = len(values)
        total = exact_sum(values)
        if total <= budget:
            return waiting
        if budget <= count:  # one record each for the largest backlogs; nothing is left
            chosen = largest(budget, values, ids)
            return waiting._part(chosen, np.ones(len(chosen), np.int64))
        # One record each, and what is left of the budget in proportion to what is left of
        # each backlog. Integers only (floats lose records past 2**53), in Python ints
        # where the products would not fit 64 bits.
        left, rest_total = budget - count, total - count
        rest = values - 1
        if left * int(rest.max()) >= 2**63 or rest_total >= 2**63:
            rest = rest.astype(object)
        product = rest * left
        shares = 1 + product // rest_total
        remainder = budget - exact_sum(shares)
        shares[largest(remainder, product % rest_total, ids)] += 1
        return Backlogs(ids, shares, waiting.rows)


def largest(count: int, values: np.ndarray, ids: np.ndarray | None = None) -> np.ndarray:
    """The indexes of the ``count`` largest ``values`` (in no particular order), a tie going
    to the smaller id of ``ids``, or without ids to the smaller index. Sorts tied ids only.

    >>> ids = np.array(["a", "b", "c", "d"], dtype=object)
    >>> sorted(ids[largest(2, np.array([1, 5, 5, 5]), ids)])
    ['b', 'c']
    """
    if count <= 0:
        return np.zeros(0, dtype=np.intp)
    if count >= len(values):
        return np.arange(len(values))
    threshold = np.partition(values, len(values) - count)[len(values) - count]
    above = np.flatnonzero(values > threshold)
    tied = np.flatnonzero(values == threshold)
    need = count - len(above)
    if need < len(tied):
        tied = tied[np.argsort(ids[tied], kind="stable")[:need]] if ids is not None else tied[:need]
    return np.concatenate((above, tied))


def exact_sum(values: np.ndarray) -> int:
    """The sum of non-negative ``values``, exact (in Python ints where int64 could overflow)."""
    if not len(values):
        return 0
    if values.dtype == object or int(values.max()) >= 2**63 // len(values):
        return int(sum(values.tolist()))
    return int(values.sum())


def int_array(values: Sequence[int]) -> np.ndarray:
    """``values`` as int64, or as Python ints (an object array) where one does not fit."""
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        return np.array(values, dtype=object)


def share_bytes(
    backlogs: Mapping[str, int],
    sizes: Mapping[str, float | None],
    budget: int,
    option: str = "maxBytesPerBatch",
) -> dict[str, int]:
    """Records per split for a budget of ``budget`` bytes; ``sizes``: bytes per record.

    The budget is shared as :func:`share_records` shares records, over each split's backlog
    in bytes, and each share turned back into whole records (a split left out reads none).
    A split whose one record is larger than its share still gets that record (a batch
    always moves every split with a backlog while the budget lasts), so a batch can pass
    the budget by less than a record per split. A split with a backlog and no size
    estimate is a configuration error.

    >>> share_bytes({"rows": 1_000, "blobs": 1_000}, {"rows": 10.0, "blobs": 990.0}, 10_000)
    {'rows': 10, 'blobs': 9}
    """
    unknown = sorted(s for s, b in backlogs.items() if b > 0 and sizes.get(s) is None)
    if unknown:
        raise ConfigurationError(
            f"option {option}: the source gives no size estimate for split "
            f"{unknown[0]} (it does not support a byte budget)",
            option=option,
        )
    size = {s: max(float(sizes[s] or 0.0), 1e-9) for s in backlogs}
    in_bytes = {s: math.ceil(b * size[s]) if b > 0 else 0 for s, b in backlogs.items()}
    shares = share_records(in_bytes, budget)

    def records(split: str) -> int:
        share = shares.get(split, 0)
        if share >= in_bytes[split]:
            return max(0, backlogs[split])  # its whole backlog fits its share
        if not share:
            return 0
        return min(backlogs[split], max(1, math.floor(share / size[split] + 1e-9)))

    reads = {s: records(s) for s in backlogs}
    return {s: n for s, n in reads.items() if n > 0}


def reads_under(
    limit: ReadAll | MaxRecords | MaxBytes,
    backlogs: Backlogs,
    extents: Mapping[str, SplitExtent],
) -> Backlogs:
    """Records each split reads in the next batch under ``limit``: only splits that read
    some, with their rows in ``backlogs``' table if it has them."""
    if isinstance(limit, MaxRecords):
        return backlogs.take(limit.records)
    if isinstance(limit, ReadAll):
        return backlogs.waiting()
    waiting = backlogs.as_dict()
    sizes = {sid: extents[sid].bytes_per_position for sid in waiting}
    reads = share_bytes(waiting, sizes, limit.bytes, limit.option)
    if limit.records is not None:
        capped = backlogs.share(limit.records)
        reads = {sid: min(n, capped[sid]) for sid, n in reads.items() if sid in capped}
    return Backlogs.of(reads)
