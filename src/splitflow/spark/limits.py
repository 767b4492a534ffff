"""Read limits of a micro-batch, independent of Spark's classes, and how a budget of
records or bytes is shared over splits by their backlog."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

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
    never more than ``budget`` in total. A batch over 100k lagging splits with a budget of
    10k records makes no dict of 100k shares.

    >>> share_records({"big": 900, "small": 10, "none": 0}, 91)
    {'big': 89, 'small': 2}
    """
    waiting = backlogs
    if min(backlogs.values(), default=1) <= 0:
        waiting = {s: b for s, b in backlogs.items() if b > 0}
    total = sum(waiting.values())
    if total <= budget:
        return dict(waiting)
    if budget <= len(waiting):  # one record each for the largest backlogs; nothing is left
        return dict.fromkeys(largest(budget, waiting), 1)
    # One record each, and what is left of the budget in proportion to what is left of
    # each backlog. Integers only: floats lose records past 2**53 (a share above the
    # backlog or budget).
    left, rest_total = budget - len(waiting), total - len(waiting)
    quota = {s: divmod(left * (b - 1), rest_total) for s, b in waiting.items()}
    shares = {s: 1 + whole for s, (whole, _) in quota.items()}
    remainder = budget - sum(shares.values())
    for split in largest(remainder, {s: part for s, (_, part) in quota.items()}):
        shares[split] += 1
    return shares


def largest(count: int, values: Mapping[str, int]) -> list[str]:
    """The ``count`` keys of ``values`` with the largest values, a tie going to the smaller
    key (in no particular order). Sorts values and tied keys only: C speed at 100k splits.

    >>> sorted(largest(2, {"a": 1, "b": 5, "c": 5, "d": 5}))
    ['b', 'c']
    """
    if count <= 0:
        return []
    if count >= len(values):
        return list(values)
    threshold = sorted(values.values(), reverse=True)[count - 1]
    above = [key for key, value in values.items() if value > threshold]
    tied = sorted(key for key, value in values.items() if value == threshold)
    return above + tied[: count - len(above)]


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
    backlogs: dict[str, int],
    extents: Mapping[str, SplitExtent],
) -> dict[str, int]:
    """Records each split reads in the next batch under ``limit`` (a split left out, or
    with 0 or less, reads none)."""
    if isinstance(limit, MaxRecords):
        return share_records(backlogs, limit.records)
    if isinstance(limit, ReadAll):
        return backlogs
    sizes = {sid: extents[sid].bytes_per_position for sid in backlogs}
    reads = share_bytes(backlogs, sizes, limit.bytes, limit.option)
    if limit.records is not None:
        capped = share_records(backlogs, limit.records)
        reads = {sid: min(n, capped[sid]) for sid, n in reads.items() if sid in capped}
    return reads
