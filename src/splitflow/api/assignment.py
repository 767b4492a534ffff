"""Assignment strategies: which reader gets which split.

A strategy is pure policy: it is handed splits and the readers' current loads and returns a
choice; it owns no state that must survive a restore (round-robin's counter restarts at
zero, which is allowed). Three are built in:

* :class:`BalancedAssignment` (default): least-loaded reader, by split count or by an
  estimated weight. After a redistribution, loads differ by at most one split (count) or the
  largest split's weight, and splits stay with the reader that held them whenever balance
  allows, so a global restore or a change of parallelism moves as few splits as it can.
* :class:`RoundRobinAssignment`: a global counter (Flink's dynamic Kafka source, "global").
* :class:`HashAssignment`: Flink's Kafka ownership, ``(hash(topic) * 31 & 0x7FFFFFFF) %
  n + partition) % n``: stable without coordination, but skewed with many small topics
  (FLINK-31762).
"""

from __future__ import annotations

import heapq
import itertools
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Generic

from splitflow.api.split import SplitT

Assignment = dict[int, list[SplitT]]
_EPSILON = 1e-9


class AssignmentStrategy(ABC, Generic[SplitT]):
    """Chooses owners for splits.

    Called by: an enumerator, on the coordinator thread. Must not block.
    """

    def weight(self, split: SplitT) -> float:
        """How much work ``split`` is, relative to others. Default: every split weighs 1."""
        return 1.0

    @abstractmethod
    def assign(
        self,
        splits: Sequence[SplitT],
        loads: Mapping[int, float],
    ) -> Assignment[SplitT]:
        """Choose an owner for each of ``splits`` among the readers keyed in ``loads``.

        ``loads`` is each candidate reader's current load (sum of weights it owns).
        Returns only readers that get splits. (Splits given back in a partial failover do
        not come here: the enumerator returns them to the reader that had them.)
        """

    @abstractmethod
    def redistribute(
        self,
        held: Mapping[int, Sequence[SplitT]],
        readers: Sequence[int],
        unowned: Sequence[SplitT] = (),
    ) -> Assignment[SplitT]:
        """Distribute every split over ``readers`` from scratch (global restore, rescale).

        ``held`` groups splits by the reader that holds them now (a key that is not in
        ``readers`` is a reader that no longer exists); ``unowned`` have no holder.
        Returns an owner for every split given.
        """


class BalancedAssignment(AssignmentStrategy[SplitT]):
    """Least-loaded reader first (ties: the lowest id).

    ``weigh`` estimates a split's size (bytes, rows); without it, splits are counted.

    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True)
    ... class S:
    ...     split_id: str
    ...     position: int = 0
    >>> balanced = BalancedAssignment[S]()
    >>> out = balanced.assign([S("a"), S("b"), S("c")], {0: 5.0, 1: 0.0, 2: 1.0})
    >>> {r: [s.split_id for s in ss] for r, ss in sorted(out.items())}
    {1: ['a', 'b'], 2: ['c']}
    """

    def __init__(self, weigh: Callable[[SplitT], float] | None = None) -> None:
        self._weigh = weigh

    def weight(self, split: SplitT) -> float:
        return 1.0 if self._weigh is None else float(self._weigh(split))

    def assign(
        self,
        splits: Sequence[SplitT],
        loads: Mapping[int, float],
    ) -> Assignment[SplitT]:
        return self._assign_least_loaded(splits, dict(loads))

    def redistribute(
        self,
        held: Mapping[int, Sequence[SplitT]],
        readers: Sequence[int],
        unowned: Sequence[SplitT] = (),
    ) -> Assignment[SplitT]:
        if not readers:
            return {}
        # Keep what each reader holds, heaviest first, up to the average load. Then deal the
        # rest one split at a time, always to a least-loaded reader, so max - min <= the
        # largest weight (count: 1). Among the least loaded, a reader that still has a split
        # of its own left gets it back; otherwise it takes a split that must move anyway
        # (unowned, or from a reader that is gone); only then one from the reader with the
        # most left over. That moves a split only when balance requires it.
        live = set(readers)
        total = sum(self.weight(s) for s in itertools.chain(unowned, *held.values()))
        target = total / len(readers)
        loads = dict.fromkeys(readers, 0.0)
        result: Assignment[SplitT] = {r: [] for r in readers}
        homeless = list(unowned)
        left: dict[int, deque[SplitT]] = {}
        for reader, splits in held.items():
            if reader not in live:
                homeless.extend(splits)
                continue
            for split in sorted(splits, key=self._heaviest_first):
                w = self.weight(split)
                if loads[reader] + w <= target + _EPSILON:
                    loads[reader] += w
                    result[reader].append(split)
                else:
                    left.setdefault(reader, deque()).append(split)
        homeless.sort(key=self._heaviest_first, reverse=True)  # pop() takes the heaviest

        def key(reader: int) -> tuple[float, int, int]:
            return (loads[reader], 0 if left.get(reader) else 1, reader)

        def donor_key(reader: int) -> tuple[int, int]:
            return (-len(left[reader]), reader)

        takers = [key(r) for r in readers]
        heapq.heapify(takers)
        donors = [donor_key(r) for r in left]
        heapq.heapify(donors)
        for _ in range(len(homeless) + sum(len(ss) for ss in left.values())):
            while takers[0] != key(takers[0][2]):  # stale: load or leftovers changed
                heapq.heapreplace(takers, key(takers[0][2]))
            reader = takers[0][2]
            if left.get(reader):
                split = left[reader].popleft()
            elif homeless:
                split = homeless.pop()
            else:
                while donors[0] != donor_key(donors[0][1]):
                    heapq.heapreplace(donors, donor_key(donors[0][1]))
                split = left[donors[0][1]].popleft()
            loads[reader] += self.weight(split)
            result[reader].append(split)
            heapq.heapreplace(takers, key(reader))
        return {r: ss for r, ss in result.items() if ss}

    def _heaviest_first(self, split: SplitT) -> tuple[float, str]:
        return (-self.weight(split), split.split_id)

    def _assign_least_loaded(
        self, splits: Sequence[SplitT], loads: dict[int, float]
    ) -> Assignment[SplitT]:
        if not loads:
            return {}
        heap = [(load, reader) for reader, load in loads.items()]
        heapq.heapify(heap)
        result: Assignment[SplitT] = {}
        for split in sorted(splits, key=self._heaviest_first):
            while heap[0][0] != loads[heap[0][1]]:  # stale entry: that load grew since
                heapq.heappop(heap)
            reader = heap[0][1]
            loads[reader] += self.weight(split)
            heapq.heappush(heap, (loads[reader], reader))
            result.setdefault(reader, []).append(split)
        return result


class _OwnerPerSplit(AssignmentStrategy[SplitT]):
    """A strategy that picks each split's owner on its own, ignoring loads."""

    @abstractmethod
    def _owner(self, split: SplitT, readers: Sequence[int]) -> int:
        """The owner of ``split`` among ``readers`` (sorted, not empty)."""

    def assign(
        self,
        splits: Sequence[SplitT],
        loads: Mapping[int, float],
    ) -> Assignment[SplitT]:
        readers = sorted(loads)
        result: Assignment[SplitT] = {}
        if readers:
            for split in splits:
                result.setdefault(self._owner(split, readers), []).append(split)
        return result

    def redistribute(
        self,
        held: Mapping[int, Sequence[SplitT]],
        readers: Sequence[int],
        unowned: Sequence[SplitT] = (),
    ) -> Assignment[SplitT]:
        everything = sorted(itertools.chain(unowned, *held.values()), key=lambda s: s.split_id)
        return self.assign(everything, dict.fromkeys(readers, 0.0))


class RoundRobinAssignment(_OwnerPerSplit[SplitT]):
    """Deal splits to readers in turn with one global counter (Flink's dynamic Kafka source).

    A redistribution starts the counter again and deals splits in id order.
    """

    def __init__(self) -> None:
        self._next = 0

    def _owner(self, split: SplitT, readers: Sequence[int]) -> int:
        reader = readers[self._next % len(readers)]
        self._next += 1
        return reader

    def redistribute(
        self,
        held: Mapping[int, Sequence[SplitT]],
        readers: Sequence[int],
        unowned: Sequence[SplitT] = (),
    ) -> Assignment[SplitT]:
        self._next = 0
        return super().redistribute(held, readers, unowned)


def java_string_hash(text: str) -> int:
    """``String.hashCode()`` of Java, as a signed 32-bit int (UTF-16 code units).

    >>> java_string_hash("orders")
    -1008770331
    """
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def flink_kafka_owner(topic: str, partition: int, num_readers: int) -> int:
    """The reader Flink's KafkaSourceEnumerator gives ``topic``-``partition`` to."""
    start = ((java_string_hash(topic) * 31) & 0x7FFFFFFF) % num_readers
    return (start + partition) % num_readers


class HashAssignment(_OwnerPerSplit[SplitT]):
    """Flink-compatible hash ownership: a pure function of the split and the parallelism.

    ``key`` maps a split to ``(topic, partition)``; by default ``(split_id, 0)``.
    Ignores loads by design: that is what makes it skew.
    """

    def __init__(self, key: Callable[[SplitT], tuple[str, int]] | None = None) -> None:
        self._key = key

    def _owner(self, split: SplitT, readers: Sequence[int]) -> int:
        topic, partition = self._key(split) if self._key else (split.split_id, 0)
        return readers[flink_kafka_owner(topic, partition, len(readers))]
