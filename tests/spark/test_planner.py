"""The driver-side planner, driven the way Spark drives it, without starting Spark.

``Planner`` imports no pyspark, so these tests run in milliseconds: a fake clock, an
in-memory :class:`~splitflow.testing.SequenceCatalog`, and a :class:`Query` that makes
Spark's calls (``initialOffset``, ``latestOffset(start, limit)``, ``partitions(start, end)``,
``commit(end)``) with every offset passed through JSON, as Spark persists it. "Reading" a
batch collects the records ``[start, stop)`` of every slice ``plan_partitions``
gives; across batches (and across planners, after a crash or a rescale) that must be every
record of the catalog, exactly once.
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from splitflow.api.assigner import AssignerState
from splitflow.api.enumerator import SplitExtent
from splitflow.api.events import BacklogStartedEvent, SplitsFinishedEvent
from splitflow.errors import ConfigurationError, IncompatibleCheckpointError, SplitOwnershipError
from splitflow.spark.limits import (
    MaxBytes,
    MaxRecords,
    MinRecords,
    ReadAll,
    ReadLimit,
    largest,
    share_bytes,
    share_records,
)
from splitflow.spark.offset import (
    OFFSET_FORMAT,
    BatchOffset,
    Slice,
    encode_tasks,
    plan_partitions,
    slice_entry,
)
from splitflow.spark.planner import Planner
from splitflow.testing.sequence import (
    SequenceCatalog,
    SequenceEnumerator,
    SequenceSource,
    SequenceSplit,
)

Record = tuple[str, int]
Offset = dict[str, Any]
DISCOVERY = 10.0  # seconds between split discoveries, on the fake clock
READ_ALL = ReadAll()

# Deterministic: the same examples on every run, nothing written to a database.
PROPERTY = settings(derandomize=True, database=None, deadline=None, max_examples=100)


# -- helpers --------------------------------------------------------------------------------------


class FakeClock:
    """A monotonic clock that moves only when a test says so."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def as_spark_stores_it(offset: Mapping[str, Any]) -> Offset:
    """Spark keeps offsets as JSON and hands back what it parsed."""
    parsed: Offset = json.loads(json.dumps(offset))
    return parsed


def records_of(
    end: Mapping[str, Any], planner: Planner[Any, Any], max_records_per_task: int | None = None
) -> list[Record]:
    """What Spark's tasks read for the batch that ends at ``end`` (planned by ``planner``
    as Spark's ``partitions`` gets it: the batch planned last, or one read back)."""
    tasks = plan_partitions(planner.planned(end), max_records_per_task)
    return [
        (piece.split.name, position)
        for _, pieces in tasks
        for piece in pieces
        for position in range(piece.start, piece.stop)
    ]


def write_task_events(planner: Planner[Any, Any], end: Mapping[str, Any]) -> None:
    """What every task of the batch that ends at ``end`` leaves in the planner's state
    directory, if it has one: its reader events (none, with the sequence source)."""
    store = planner._events
    if store is not None:
        tasks = plan_partitions(planner.planned(end), None)
        for index, (slot, _) in enumerate(tasks):
            store.write(int(end["seq"]), index, slot, [])


def slot_splits(offset: Mapping[str, Any], planner: Planner[Any, Any]) -> list[list[str]]:
    """Split ids each slot holds after an offset's batch."""
    states = planner.read_offset(offset).reader_states()
    return [[split.split_id for split in states[slot]] for slot in sorted(states)]


def assert_exactly_once(read: Iterable[Record], expected: Iterable[Record]) -> None:
    counts = Counter(read)
    twice = sorted(r for r, n in counts.items() if n > 1)
    assert not twice, f"read more than once: {twice[:10]}"
    missing = sorted(set(expected) - counts.keys())
    extra = sorted(counts.keys() - set(expected))
    assert not missing, f"never read: {missing[:10]} ({len(missing)} in all)"
    assert not extra, f"read but not in the data: {extra[:10]}"


class Query:
    """Makes Spark's calls on a planner and "reads" every batch it plans.

    ``start``: the offset a restarted query resumes from (Spark's last logged offset);
    without it, the query starts fresh from ``initial_offset()``.
    """

    def __init__(self, planner: Planner[Any, Any], start: Mapping[str, Any] | None = None) -> None:
        self.planner = planner
        self.source: SequenceSource = planner.source  # type: ignore[assignment]
        self.offset: Offset = as_spark_stores_it(
            planner.initial_offset() if start is None else start
        )
        self.read: list[Record] = []
        self.batches: list[list[Record]] = []
        self.ends: list[Offset] = []

    def plan(self, limit: ReadLimit = READ_ALL) -> Offset | None:
        """``latestOffset``: the end of the next batch, or None when Spark plans no batch."""
        end = as_spark_stores_it(self.planner.latest_offset(self.offset, limit))
        return None if end == self.offset else end

    def run(self, end: Offset) -> list[Record]:
        """Run the batch that ends at ``end``, as Spark does once it logged ``end``.

        Spark commits the previous batch's end only now, after logging the next one (and
        again after a restart), so ``commit`` lags one batch behind.
        """
        self.planner.commit(self.offset)
        records = records_of(end, self.planner)
        write_task_events(self.planner, end)
        self.read.extend(records)
        self.batches.append(records)
        self.ends.append(end)
        self.offset = end
        return records

    def batch(self, limit: ReadLimit = READ_ALL) -> list[Record] | None:
        """One trigger: plan, and run the batch if there is one."""
        end = self.plan(limit)
        return None if end is None else self.run(end)

    def drain(self, limit: ReadLimit = READ_ALL, most: int = 1_000) -> int:
        """Trigger until Spark would plan no batch; the number of batches run."""
        for count in range(most):
            if self.batch(limit) is None:
                return count
        raise AssertionError(f"still planning batches after {most}")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def planner_for(
    catalog: SequenceCatalog,
    clock: FakeClock,
    parallelism: int = 2,
    *,
    bounded: bool = False,
) -> Planner[Any, Any]:
    """A planner on a NEW source instance, as a new streaming runner process would build."""
    source = SequenceSource(catalog, bounded=bounded, discovery_interval=DISCOVERY)
    return Planner(source, parallelism, clock=clock)


# -- share_records --------------------------------------------------------------------------------


def test_share_records_spends_exactly_the_budget_when_the_backlog_exceeds_it() -> None:
    shares = share_records({"a": 500, "b": 300, "c": 7}, 100)
    assert sum(shares.values()) == 100


def test_share_records_gives_every_backlog_in_full_when_it_fits_the_budget() -> None:
    assert share_records({"a": 5, "b": 0, "c": 3}, 8) == {"a": 5, "c": 3}
    assert share_records({"a": 5, "b": 0, "c": 3}, 1_000) == {"a": 5, "c": 3}


def test_share_records_shares_the_rest_in_proportion_to_backlog() -> None:
    # One record each first, then 400 over the remaining backlogs 3000 : 1000 : 0.
    assert share_records({"a": 3_001, "b": 1_001, "c": 1}, 403) == {"a": 301, "b": 101, "c": 1}
    assert share_records({"a": 3_001, "none": 0, "c": 1}, 403) == {"a": 402, "c": 1}


def test_share_records_never_starves_a_small_split_behind_a_big_one() -> None:
    shares = share_records({"big": 10**9, "small": 1, "tiny": 2}, 3)
    assert shares == {"big": 1, "small": 1, "tiny": 1}


def test_share_records_below_one_record_per_split_serves_the_largest_backlogs_first() -> None:
    shares = share_records({"a": 1, "b": 50, "c": 20, "d": 20}, 2)
    assert shares == {"b": 1, "c": 1}  # c before d: ties go by split id; a and d get none


def test_share_records_never_gives_a_split_more_than_its_backlog() -> None:
    shares = share_records({"a": 2, "b": 1, "c": 10_000}, 5_000)
    assert shares["a"] <= 2
    assert shares["b"] <= 1
    assert sum(shares.values()) == 5_000


def test_share_records_gives_nothing_to_splits_without_backlog() -> None:
    assert share_records({"a": 0, "b": -3}, 10) == {}
    assert share_records({}, 10) == {}
    assert share_records({"a": 9, "b": 0}, 0) == {}


def test_share_records_is_deterministic_whatever_the_order_of_splits() -> None:
    backlogs = {f"s{i}": (i * 37) % 11 + 1 for i in range(20)}
    reordered = dict(reversed(list(backlogs.items())))
    first = share_records(backlogs, 33)
    assert share_records(backlogs, 33) == first
    assert share_records(reordered, 33) == first


@st.composite
def backlogs_and_budget(draw: st.DrawFn) -> tuple[dict[str, int], int]:
    sizes = draw(
        st.lists(
            st.one_of(st.integers(-3, 3), st.integers(0, 1_000), st.integers(0, 10**12)),
            max_size=25,
        )
    )
    budget = draw(st.one_of(st.integers(0, 30), st.integers(0, 10**6), st.integers(0, 10**12)))
    return {f"split-{i:02d}": size for i, size in enumerate(sizes)}, budget


@PROPERTY
@given(backlogs_and_budget())
def test_share_records_invariants_hold_for_any_backlogs_and_budget(
    case: tuple[dict[str, int], int],
) -> None:
    backlogs, budget = case
    shares = share_records(backlogs, budget)
    waiting = [s for s, b in backlogs.items() if b > 0]
    total = sum(backlogs[s] for s in waiting)

    assert shares.keys() <= set(waiting), "only splits with a backlog are named"
    assert sum(shares.values()) == min(budget, total), "spends exactly the budget, or all"
    for split, share in shares.items():
        assert 0 < share <= backlogs[split], f"{split}: {share} of backlog {backlogs[split]}"
    if budget >= len(waiting):
        starved = [s for s in waiting if s not in shares]
        assert not starved, f"splits with backlog got nothing: {starved}"
    for a in waiting:  # a larger backlog never gets fewer records
        for b in waiting:
            if backlogs[a] > backlogs[b]:
                assert shares.get(a, 0) >= shares.get(b, 0), (a, b)
    if len(waiting) <= budget < total:  # one each, the rest by backlog, within one record
        left, rest = budget - len(waiting), total - len(waiting)
        for split in waiting:
            ideal = 1 + left * (backlogs[split] - 1) / rest
            assert abs(shares[split] - ideal) < 1, (split, shares[split], ideal)
    assert share_records(dict(reversed(list(backlogs.items()))), budget) == shares


@PROPERTY
@given(
    st.dictionaries(st.text("abc", max_size=3), st.integers(0, 4), max_size=12), st.integers(-1, 14)
)
def test_the_largest_backlogs_are_chosen_by_value_then_by_split_id(
    values: dict[str, int], count: int
) -> None:
    expected = sorted(values, key=lambda key: (-values[key], key))[: max(count, 0)]
    ids = np.array(list(values), dtype=object)
    chosen = ids[largest(count, np.array(list(values.values()), dtype=np.int64), ids)]
    assert sorted(chosen.tolist()) == sorted(expected)


def test_share_records_stays_exact_for_budgets_beyond_float_precision() -> None:
    budget = 26_053_720_804_375_121
    shares = share_records({"a": 1, "b": 718_834_393_590_046_398}, budget)
    assert shares == {"a": 1, "b": budget - 1}


FAR = 2**64  # where the far source's splits start: a log position past 64 bits


class _FarEnumerator(SequenceEnumerator):
    """The sequence enumerator with every position moved on by :data:`FAR`."""

    def discover_splits(self) -> Sequence[SequenceSplit]:
        return [SequenceSplit(s.name, s.end, FAR) for s in super().discover_splits()]

    def latest_positions(self, splits: Sequence[SequenceSplit]) -> Mapping[str, SplitExtent]:
        return {
            sid: SplitExtent(FAR + extent.latest, extent.final)
            for sid, extent in super().latest_positions(splits).items()
        }

    def changed_positions(self, since: object | None) -> None:
        return None


class _FarSource(SequenceSource):
    def create_enumerator(self, context: Any) -> Any:
        return _FarEnumerator(self, context, None)

    def restore_enumerator(self, context: Any, state: Any) -> Any:
        return _FarEnumerator(self, context, state)


def test_positions_past_64_bits_are_planned_exactly_across_a_restart(clock: FakeClock) -> None:
    catalog = SequenceCatalog({"a": 30, "b": 5, "c": 12})
    source = _FarSource(catalog, discovery_interval=DISCOVERY)
    query = Query(Planner(source, 2, clock=clock))
    for _ in range(3):
        query.batch(MaxRecords(7))
    assert len(query.read) == 21
    assert query.planner.lag()["totalLag"] == 47 - 21
    restarted = Query(Planner(_FarSource(catalog, discovery_interval=DISCOVERY), 3, clock=clock))
    restarted.offset = query.offset
    restarted.read = list(query.read)
    restarted.drain(MaxRecords(7))
    expected = [(name, FAR + i) for name, n in catalog.lengths().items() for i in range(n)]
    assert_exactly_once(restarted.read, expected)
    assert restarted.planner.lag()["totalLag"] == 0


@pytest.mark.parametrize("tracked", [True, False], ids=["tracked", "untracked"])
def test_a_held_split_the_enumerator_assigns_again_is_read_to_its_end(
    clock: FakeClock, tracked: bool
) -> None:
    catalog = SequenceCatalog({"a": 10, "b": 10})
    source_type = SequenceSource if tracked else _UntrackedSequenceSource
    query = Query(Planner(source_type(catalog, discovery_interval=DISCOVERY), 1, clock=clock))
    query.batch(MaxRecords(8))
    planner = query.planner
    planner.coordinator.context.assign_splits({0: [planner._current()[0]["a"]]})  # the same split
    planner._settle()
    query.drain(MaxRecords(8))
    assert_exactly_once(query.read, [(name, i) for name in "ab" for i in range(10)])
    assert planner.lag()["totalLag"] == 0


class _RemovingEnumerator(SequenceEnumerator):
    """Removes split ``b`` as it handles a BacklogStartedEvent: a held split removed while
    the planner settles an event it sent."""

    def handle_source_event(self, reader_id: int, event: Any) -> None:
        super().handle_source_event(reader_id, event)
        if isinstance(event, BacklogStartedEvent) and "b" in self._owner:
            self.remove_splits(["b"])


class _RemovingSource(SequenceSource):
    def create_enumerator(self, context: Any) -> Any:
        return _RemovingEnumerator(self, context, None)


@pytest.mark.parametrize("parallelism", [1, 2])
@pytest.mark.parametrize("limit", [MaxRecords(4), MaxBytes(40)], ids=["records", "bytes"])
def test_a_split_removed_as_the_source_falls_behind_leaves_the_budget_to_the_others(
    clock: FakeClock, parallelism: int, limit: ReadLimit
) -> None:
    catalog = SequenceCatalog({"a": 10, "b": 10})
    source = _RemovingSource(catalog, discovery_interval=DISCOVERY, record_bytes=10)
    query = Query(Planner(source, parallelism, clock=clock, backlog_lag_threshold=5))
    query.drain()  # read what exists: out of backlog
    catalog.append("a", 20)
    catalog.append("b", 20)
    clock.advance(DISCOVERY)
    assert query.batch(limit) == [("a", i) for i in range(10, 14)]  # b removed, its share a's


class _OnFinishEnumerator(SequenceEnumerator):
    """As split ``a`` finishes, removes split ``c`` (``remove``), and assigns it again from
    its start, a new object (``again``): a split that the batch which reads ``a`` to its
    end also reads, changed while the planner finishes ``a``."""

    remove = True
    again = False

    def handle_source_event(self, reader_id: int, event: Any) -> None:
        super().handle_source_event(reader_id, event)
        if isinstance(event, SplitsFinishedEvent) and "a" in event.split_ids:
            if self.remove:
                self.remove_splits(["c"])
            if self.again:
                self.add_splits([SequenceSplit("c")])


def _on_finish_source(
    catalog: SequenceCatalog, *, remove: bool, again: bool, discovery_interval: float | None
) -> SequenceSource:
    class Source(SequenceSource):
        def create_enumerator(self, context: Any) -> Any:
            enumerator = _OnFinishEnumerator(self, context, None)
            enumerator.remove, enumerator.again = remove, again
            return enumerator

    return Source(catalog, discovery_interval=discovery_interval)


@pytest.mark.parametrize("parallelism", [1, 2, 3])
def test_a_split_removed_as_another_finishes_is_left_out_of_the_batch_that_finishes_it(
    clock: FakeClock, parallelism: int
) -> None:
    catalog = SequenceCatalog({"a": 3, "b": 3, "c": 3})
    catalog.seal("a")
    source = _on_finish_source(catalog, remove=True, again=False, discovery_interval=None)
    query = Query(Planner(source, parallelism, clock=clock))
    read = query.batch()
    assert sorted(read or []) == [(name, i) for name in "ab" for i in range(3)]
    slices = [s for slot in query.planner.planned(query.offset).slots for s in slot]
    assert sorted((s.body.split_id, s.ends) for s in slices) == [("a", True), ("b", False)]
    catalog.append("b", 2)
    clock.advance(DISCOVERY)
    assert query.batch() == [("b", 3), ("b", 4)]


def test_a_split_removed_and_added_again_as_another_finishes_is_planned_from_where_it_is_now(
    clock: FakeClock,
) -> None:
    """The batch that reads ``a`` to its end also reads ``c``, which the enumerator removes
    and adds again from its start while ``a`` finishes: the next batch reads ``c`` from
    where the new assignment's slice stops, never past the records ``c`` has, and the
    planner's table agrees with every slice."""
    catalog = SequenceCatalog({"a": 3, "c": 3})
    catalog.seal("a")
    source = _on_finish_source(catalog, remove=True, again=True, discovery_interval=DISCOVERY)
    query = Query(Planner(source, 1, clock=clock))
    query.drain()
    assert all(i < 3 for _, i in query.read), query.read  # nothing past c's records
    assert sorted(set(query.read)) == [(name, i) for name in "ac" for i in range(3)]
    planner = query.planner
    table = planner._table
    for sid, row in table.row_of.items():
        assert table.position[row] == planner._pieces[planner._slot_of[sid]][sid].stop


@pytest.mark.parametrize("parallelism", [1, 2])
def test_an_enumerator_that_adds_a_split_a_reader_holds_fails_naming_it(
    clock: FakeClock, parallelism: int
) -> None:
    """Two readers would hold ``c`` (or one, twice) and read it twice: the query stops with
    SplitOwnershipError naming ``c`` and its reader. Before, the planner went on, reading
    ``c`` again from its start, and failed later with a KeyError when the two ``c`` were on
    different readers and one of them finished."""
    catalog = SequenceCatalog({"a": 3, "c": 3})
    catalog.seal("a")
    source = _on_finish_source(catalog, remove=False, again=True, discovery_interval=DISCOVERY)
    query = Query(Planner(source, parallelism, clock=clock))
    with pytest.raises(
        SplitOwnershipError, match=r"added 1 split\(s\) that a reader holds: c \(reader \d\)"
    ) as raised:
        query.drain()
    assert raised.value.split_ids == ("c",)


class AgainAsItEnds(SequenceEnumerator):
    """Assigns split ``b`` again, once, as ``b`` finishes: a new split of the same id, where
    the catalog ended it (3)."""

    again = True

    def handle_source_event(self, reader_id: int, event: Any) -> None:
        super().handle_source_event(reader_id, event)
        if self.again and isinstance(event, SplitsFinishedEvent) and "b" in event.split_ids:
            self.again = False
            self._finished.pop("b", None)
            self.add_splits([SequenceSplit("b", position=3)])


class AgainAsItEndsSource(SequenceSource):
    def create_enumerator(self, context: Any) -> Any:
        return AgainAsItEnds(self, context, None)

    def restore_enumerator(self, context: Any, state: Any) -> Any:
        return AgainAsItEnds(self, context, state)


def test_a_split_assigned_again_as_it_finishes_is_read_once_by_the_slice_that_ends_it(
    clock: FakeClock,
) -> None:
    """The batch that reads ``b`` to its end holds two slices of ``b`` (the enumerator
    assigns ``b`` again while it finishes): the one that ends it reads its last record, and
    the new one reads nothing (it starts where ``b`` ends), in that batch or after."""
    catalog = SequenceCatalog({"a": 2, "b": 2})
    query = Query(
        Planner(AgainAsItEndsSource(catalog, discovery_interval=DISCOVERY), 1, clock=clock)
    )
    assert sorted(query.batch() or []) == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    catalog.append("b", 1)
    catalog.seal("b")
    catalog.append("a", 1)
    assert sorted(query.batch() or []) == [("a", 2), ("b", 2)]
    slices = query.planner.planned(query.offset).slots[0]
    assert sorted((s.body.split_id, s.start, s.stop, s.ends) for s in slices) == [
        ("a", 2, 3, False),
        ("b", 2, 3, True),
        ("b", 3, 3, False),
    ]
    catalog.append("a", 1)
    query.drain()
    assert sorted(query.read) == [(name, i) for name, n in (("a", 4), ("b", 3)) for i in range(n)]


# -- plan_partitions ------------------------------------------------------------------------------


def batch_offset(*slots: list[tuple[str, int, int]]) -> BatchOffset[SequenceSplit, Any]:
    """A batch whose slot ``i`` reads ``(name, start, stop)`` slices."""
    return BatchOffset(
        seq=1,
        enumerator=AssignerState(),
        slots=tuple(
            tuple(Slice(SequenceSplit(name), start, stop, 1) for name, start, stop in slot)
            for slot in slots
        ),
    )


def tasks_as_ranges(
    tasks: list[tuple[int, list[Slice[SequenceSplit]]]],
) -> list[tuple[int, list[tuple[str, int, int]]]]:
    return [(slot, [(s.split.name, s.start, s.stop) for s in ss]) for slot, ss in tasks]


def test_plan_partitions_is_pure_the_same_offset_gives_the_same_tasks(clock: FakeClock) -> None:
    catalog = SequenceCatalog({"a": 40, "b": 7, "c": 0, "d": 13})
    planner = planner_for(catalog, clock, parallelism=3)
    end = as_spark_stores_it(planner.latest_offset(planner.initial_offset(), MaxRecords(30)))
    catalog.append("a", 100)  # the data moving on changes nothing about a planned batch
    first = tasks_as_ranges(plan_partitions(planner.read_offset(end), 4))
    again = tasks_as_ranges(plan_partitions(planner.read_offset(end), 4))
    elsewhere = SequenceSource(catalog, discovery_interval=DISCOVERY)  # another process
    there = tasks_as_ranges(plan_partitions(BatchOffset.decode(end, elsewhere), 4))
    assert first == again == there
    assert sum(stop - start for _, ranges in first for _, start, stop in ranges) == 30


def test_plan_partitions_without_a_cap_gives_one_task_per_slot_with_records() -> None:
    end = batch_offset([("a", 3, 20), ("b", 0, 0)], [("c", 5, 5)], [("d", 0, 9), ("e", 1, 2)])
    assert tasks_as_ranges(plan_partitions(end, None)) == [
        (0, [("a", 3, 20)]),
        (2, [("d", 0, 9), ("e", 1, 2)]),
    ]


def test_plan_partitions_makes_no_task_for_empty_slices() -> None:
    end = batch_offset([("a", 4, 4), ("b", 0, 0)], [], [("c", 9, 9)])
    assert plan_partitions(end, None) == []
    assert plan_partitions(end, 1) == []
    mixed = batch_offset([("a", 4, 4), ("b", 0, 2), ("c", 7, 7)])
    assert tasks_as_ranges(plan_partitions(mixed, 1)) == [(0, [("b", 0, 1)]), (0, [("b", 1, 2)])]


def test_encode_tasks_are_the_offset_s_own_entries_and_the_same_when_decoded(
    clock: FakeClock,
) -> None:
    catalog = SequenceCatalog({f"s{i}": 10 + i for i in range(6)})
    planner = planner_for(catalog, clock, parallelism=2)
    codec = planner.source.split_codec
    start = planner.initial_offset()
    for batch in range(3):
        whole = planner.latest_offset(start, MaxRecords(25))
        end = as_spark_stores_it(whole)
        planned = planner.planned(end)
        assert planned.read_entries is not None
        version, kept = planned.read_entries
        assert version == codec.version
        decoded = BatchOffset.decode(end, planner.source)  # another process: nothing kept
        assert decoded.read_entries is None
        for cap in (None, 4):
            anew = [
                (slot, [slice_entry(s, codec.encode(s.body)) for s in slices])
                for slot, slices in plan_partitions(planned, cap)
            ]
            assert anew
            assert encode_tasks(planned, codec, cap) == encode_tasks(decoded, codec, cap) == anew
        # without a cap, a task's entries are the offset's own (the same list objects)
        in_offset = {id(e) for slot in whole["slots"] for e in slot}
        tasks = encode_tasks(planned, codec, None)
        assert [task for _, task in tasks] == [kept[slot] for slot, _ in tasks]
        assert all(id(e) in in_offset for _, task in tasks for e in task)
        # entries kept under another codec version are not used
        object.__setattr__(planned, "read_entries", (version + 1, ([["bogus"]],) * 2))
        assert encode_tasks(planned, codec, None) == encode_tasks(decoded, codec, None)
        catalog.append(f"s{batch}", 5)
        start = end


def test_max_records_per_task_cuts_a_range_into_contiguous_tasks_of_at_most_n() -> None:
    end = batch_offset([("a", 10, 21)])
    assert tasks_as_ranges(plan_partitions(end, 4)) == [
        (0, [("a", 10, 14)]),
        (0, [("a", 14, 18)]),
        (0, [("a", 18, 21)]),
    ]


def test_max_records_per_task_packs_a_slots_slices_into_as_few_tasks_as_possible() -> None:
    end = batch_offset([("a", 0, 3), ("b", 5, 10)], [("c", 0, 2)])
    assert tasks_as_ranges(plan_partitions(end, 4)) == [
        (0, [("a", 0, 3), ("b", 5, 6)]),
        (0, [("b", 6, 10)]),
        (1, [("c", 0, 2)]),
    ]


@st.composite
def slots_and_cap(draw: st.DrawFn) -> tuple[list[list[tuple[str, int, int]]], int | None]:
    names = iter(f"s{i}" for i in range(1_000))
    slots = draw(
        st.lists(
            st.lists(st.tuples(st.integers(0, 50), st.integers(0, 30)), max_size=5), max_size=4
        )
    )
    cap = draw(st.none() | st.integers(1, 12))
    return [[(next(names), start, start + n) for start, n in slot] for slot in slots], cap


@PROPERTY
@given(slots_and_cap())
def test_plan_partitions_covers_every_slice_exactly_in_tasks_of_at_most_n(
    case: tuple[list[list[tuple[str, int, int]]], int | None],
) -> None:
    slots, cap = case
    tasks = plan_partitions(batch_offset(*slots), cap)
    assert tasks == plan_partitions(batch_offset(*slots), cap)
    pieces: dict[str, list[tuple[int, int]]] = {}
    for slot, task in tasks:
        assert task, "no empty task"
        assert all(s.stop > s.start for s in task), "no empty slice in a task"
        assert cap is None or sum(s.records for s in task) <= cap
        for piece in task:
            assert piece.split.name in {name for name, _, _ in slots[slot]}, "stays in its slot"
            pieces.setdefault(piece.split.name, []).append((piece.start, piece.stop))
    for slot_id, slot in enumerate(slots):
        for name, start, stop in slot:
            ranges = pieces.get(name, [])
            covered = [p for a, b in ranges for p in range(a, b)]
            assert covered == list(range(start, stop)), f"{name}: {ranges} vs [{start}, {stop})"
        slot_total = sum(stop - start for _, start, stop in slot)
        slot_tasks = sum(1 for owner, _ in tasks if owner == slot_id)
        fewest = 0 if slot_total == 0 else 1 if cap is None else math.ceil(slot_total / cap)
        assert slot_tasks == fewest


# -- initial_offset and latest_offset -------------------------------------------------------------


def test_initial_offset_is_idempotent_as_spark_calls_it_twice_on_a_fresh_start(
    clock: FakeClock,
) -> None:
    planner = planner_for(SequenceCatalog({"a": 5, "b": 3}), clock)
    first = planner.initial_offset()
    assert planner.initial_offset() == first
    assert first["seq"] == 0


def test_initial_offset_assigns_every_split_to_one_slot_and_reads_nothing(
    clock: FakeClock,
) -> None:
    catalog = SequenceCatalog({f"s{i}": i for i in range(5)})
    planner = planner_for(catalog, clock, parallelism=2)
    start = as_spark_stores_it(planner.initial_offset())
    slots = slot_splits(start, planner)
    assert sorted(sid for slot in slots for sid in slot) == [f"s{i}" for i in range(5)]
    assert sorted(len(slot) for slot in slots) == [2, 3]
    assert records_of(start, planner) == []


def test_initial_offset_stays_the_offset_before_the_first_batch(clock: FakeClock) -> None:
    planner = planner_for(SequenceCatalog({"a": 5}), clock)
    start = planner.initial_offset()
    planner.latest_offset(start, ReadAll())
    assert planner.initial_offset() == start


def test_the_initial_offset_is_the_same_few_bytes_whatever_the_split_count(
    clock: FakeClock,
) -> None:
    """Spark parses the initial offset, shows it as batch 0's start in the query's progress
    and keeps it there: it names no split (checkpoint 0 stays in the planner)."""
    small = planner_for(SequenceCatalog({"a": 5}), clock).initial_offset()
    many = planner_for(SequenceCatalog({f"s{i:05}": 3 for i in range(5_000)}), clock)
    assert many.initial_offset() == small
    assert len(json.dumps(small)) < 64


def test_asking_for_the_initial_offset_again_after_a_batch_changes_nothing(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Spark may ask for the initial offset again while batch 0 runs (it is that batch's
    start): the batch planned next follows the one planned last, with no restore."""
    catalog = SequenceCatalog({"a": 5, "b": 5})
    planner = planner_for(catalog, clock)
    start = as_spark_stores_it(planner.initial_offset())
    end1 = as_spark_stores_it(planner.latest_offset(start, MaxRecords(4)))
    first = records_of(end1, planner)
    assert planner.initial_offset() == start
    with caplog.at_level(logging.INFO, logger="splitflow.spark"):
        end2 = as_spark_stores_it(planner.latest_offset(end1, ReadAll()))
    assert "restoring" not in caplog.text
    assert end2["seq"] == end1["seq"] + 1
    assert_exactly_once(first + records_of(end2, planner), catalog.records())


def test_latest_offset_returns_start_unchanged_when_nothing_is_new(clock: FakeClock) -> None:
    query = Query(planner_for(SequenceCatalog({"a": 5, "b": 2}), clock))
    query.drain()
    start = query.offset
    assert query.planner.latest_offset(start, ReadAll()) == start
    assert query.planner.latest_offset(start, MaxRecords(10)) == start
    clock.advance(3 * DISCOVERY)  # discovery runs, finds nothing new
    assert query.planner.latest_offset(start, ReadAll()) == start


def test_latest_offset_plans_the_next_seq_when_records_arrive(clock: FakeClock) -> None:
    catalog = SequenceCatalog({"a": 0})
    query = Query(planner_for(catalog, clock))
    assert query.plan() is None
    catalog.append("a", 4)
    end = query.plan()
    assert end is not None
    assert end["seq"] == query.offset["seq"] + 1
    assert query.run(end) == [("a", i) for i in range(4)]


def test_an_empty_catalog_plans_no_batch(clock: FakeClock) -> None:
    query = Query(planner_for(SequenceCatalog(), clock))
    assert query.plan() is None
    assert query.planner.lag()["splits"] == {}


# -- read limits ----------------------------------------------------------------------------------


def test_read_all_reads_everything_available_in_one_batch(clock: FakeClock) -> None:
    catalog = SequenceCatalog({"a": 30, "b": 1, "c": 0, "d": 12})
    query = Query(planner_for(catalog, clock, parallelism=3))
    assert query.drain(ReadAll()) == 1
    assert_exactly_once(query.read, catalog.records())


def test_max_records_limits_every_batch_and_reads_everything_in_the_end(
    clock: FakeClock,
) -> None:
    catalog = SequenceCatalog({"a": 100, "b": 10, "c": 1, "d": 0})
    query = Query(planner_for(catalog, clock, parallelism=2))
    batches = query.drain(MaxRecords(20))
    assert batches == math.ceil(111 / 20)
    assert all(len(batch) <= 20 for batch in query.batches)
    assert [len(batch) for batch in query.batches[:-1]] == [20] * (batches - 1)
    assert_exactly_once(query.read, catalog.records())


def test_max_records_shares_a_batch_over_splits_by_backlog(clock: FakeClock) -> None:
    catalog = SequenceCatalog({"big": 900, "small": 100, "tiny": 1})
    query = Query(planner_for(catalog, clock, parallelism=2))
    batch = query.batch(MaxRecords(101))
    assert batch is not None
    per_split = Counter(name for name, _ in batch)
    assert per_split == share_records({"big": 900, "small": 100, "tiny": 1}, 101)
    assert per_split["tiny"] == 1  # not starved behind the big ones
    assert 8 <= per_split["big"] / per_split["small"] <= 10  # about 900 : 100


def test_max_records_reads_each_split_in_order_from_where_the_last_batch_stopped(
    clock: FakeClock,
) -> None:
    catalog = SequenceCatalog({"a": 50, "b": 50})
    query = Query(planner_for(catalog, clock))
    query.drain(MaxRecords(7))
    for name in ("a", "b"):
        assert [p for n, p in query.read if n == name] == list(range(50))


def test_min_records_waits_until_enough_records_arrived(clock: FakeClock) -> None:
    catalog = SequenceCatalog({"a": 3, "b": 3})
    query = Query(planner_for(catalog, clock))
    limit = MinRecords(10, max_delay=60.0)
    assert query.plan(limit) is None
    catalog.append("a", 3)
    clock.advance(30)
    assert query.plan(limit) is None  # 9 < 10 and only 30 s waited
    catalog.append("b", 1)
    batch = query.batch(limit)
    assert batch is not None
    assert len(batch) == 10


def test_min_records_reads_what_there_is_once_max_delay_passed(clock: FakeClock) -> None:
    catalog = SequenceCatalog({"a": 3})
    query = Query(planner_for(catalog, clock))
    limit = MinRecords(10, max_delay=60.0)
    clock.advance(59.5)
    assert query.plan(limit) is None
    clock.advance(0.5)
    assert query.batch(limit) == [("a", 0), ("a", 1), ("a", 2)]


def test_min_records_waits_again_after_each_batch(clock: FakeClock) -> None:
    catalog = SequenceCatalog({"a": 10})
    query = Query(planner_for(catalog, clock))
    limit = MinRecords(10, max_delay=60.0)
    assert query.batch(limit) is not None
    catalog.append("a", 2)
    clock.advance(59)
    assert query.plan(limit) is None
    clock.advance(1)
    assert query.batch(limit) == [("a", 10), ("a", 11)]


def test_min_records_then_limit_caps_the_batch_it_lets_through(clock: FakeClock) -> None:
    catalog = SequenceCatalog({"a": 20, "b": 5})
    query = Query(planner_for(catalog, clock))
    limit = MinRecords(10, max_delay=60.0, then=MaxRecords(4))
    batch = query.batch(limit)
    assert batch is not None
    assert len(batch) == 4


# -- discovery, appends, finished and removed splits ----------------------------------------------


def test_a_split_added_to_the_catalog_is_read_once_the_discovery_interval_passed(
    clock: FakeClock,
) -> None:
    catalog = SequenceCatalog({"a": 2})
    query = Query(planner_for(catalog, clock))
    query.drain()
    catalog.add("new", 5)
    clock.advance(DISCOVERY / 2)
    assert query.plan() is None  # not discovered yet
    clock.advance(DISCOVERY / 2)
    assert query.batch() == [("new", i) for i in range(5)]
    assert_exactly_once(query.read, catalog.records())


def test_records_appended_to_a_split_are_read_in_a_following_batch(clock: FakeClock) -> None:
    catalog = SequenceCatalog({"a": 2, "b": 0})
    query = Query(planner_for(catalog, clock))
    query.drain()
    catalog.append("b", 3)
    catalog.append("a", 1)
    assert sorted(query.batch() or []) == [("a", 2), ("b", 0), ("b", 1), ("b", 2)]
    assert_exactly_once(query.read, catalog.records())


def test_a_split_sealed_after_its_last_read_finishes_without_a_batch_of_its_own(
    clock: FakeClock,
) -> None:
    """No empty batch only to record a finish: the enumerator learns it at once, and the next
    batch that reads records records it."""
    catalog = SequenceCatalog({"a": 5, "b": 3})
    query = Query(planner_for(catalog, clock))
    query.drain()
    catalog.seal("a")
    assert query.plan() is None, "no batch without records"
    assert "a" in query.planner.coordinator.enumerator.finished_splits()  # type: ignore[attr-defined]
    assert "a" not in query.planner.lag()["splits"]
    catalog.append("b", 2)
    end = query.plan()
    assert end is not None
    assert query.run(end) == [("b", 3), ("b", 4)]
    decoded = query.planner.read_offset(end)
    assert "a" in decoded.enumerator.finished
    assert "a" not in decoded.enumerator.assigned
    assert all("a" not in slot for slot in slot_splits(end, query.planner))
    assert query.plan() is None  # finished once, not again in every batch
    assert_exactly_once(query.read, catalog.records())


def test_a_restart_from_an_offset_that_holds_a_split_at_its_end_finishes_it(
    clock: FakeClock,
) -> None:
    """A split sealed after the last batch: the restarted query finishes it from the offset
    (positions say it ended) and reads nothing again."""
    catalog = SequenceCatalog({"a": 5, "b": 3})
    query = Query(planner_for(catalog, clock))
    query.drain()
    catalog.seal("a")
    restarted = Query(planner_for(catalog, clock), start=query.offset)
    assert restarted.plan() is None
    assert "a" in restarted.planner.coordinator.enumerator.finished_splits()  # type: ignore[attr-defined]
    catalog.append("b", 1)
    assert restarted.batch() == [("b", 3)]
    assert "a" in query.planner.read_offset(restarted.offset).enumerator.finished


def test_a_sealed_split_is_read_to_its_end_before_it_finishes(clock: FakeClock) -> None:
    catalog = SequenceCatalog({"a": 5})
    query = Query(planner_for(catalog, clock))
    catalog.seal("a")
    assert query.batch(MaxRecords(3)) == [("a", 0), ("a", 1), ("a", 2)]
    assert "a" not in query.planner.read_offset(query.offset).enumerator.finished
    assert query.batch(MaxRecords(3)) == [("a", 3), ("a", 4)]
    last = query.planner.read_offset(query.offset)
    assert "a" in last.enumerator.finished, "the batch that reads its end finishes it"
    assert [s.ends for slot in last.slots for s in slot] == [True]
    assert last.reader_states() == {0: [], 1: []}
    assert query.plan(MaxRecords(3)) is None, "no batch of its own for the finish"
    assert_exactly_once(query.read, catalog.records())


def test_a_bounded_source_finishes_every_split_after_reading_it(clock: FakeClock) -> None:
    catalog = SequenceCatalog({"a": 4, "b": 2})
    query = Query(planner_for(catalog, clock, bounded=True))
    catalog.append("a", 10)  # beyond the end the bounded split was discovered with
    query.drain()
    assert sorted(query.read) == [("a", i) for i in range(4)] + [("b", 0), ("b", 1)]
    finished = query.planner.read_offset(query.offset).enumerator.finished
    assert finished == frozenset({"a", "b"})
    assert slot_splits(query.offset, query.planner) == [[], []]


def test_a_removed_split_is_dropped_from_its_slot(clock: FakeClock) -> None:
    catalog = SequenceCatalog({"a": 3, "b": 3})
    query = Query(planner_for(catalog, clock))
    query.drain()
    catalog.remove("b")
    clock.advance(DISCOVERY)
    catalog.append("a", 1)
    assert query.batch() == [("a", 3)]
    assert "b" not in query.planner.lag()["splits"]
    assert all("b" not in slot for slot in slot_splits(query.offset, query.planner))
    enumerator = query.planner.read_offset(query.offset).enumerator
    assert "b" not in enumerator.assigned
    assert all(s.split_id != "b" for s in enumerator.unassigned)


# -- AvailableNow ---------------------------------------------------------------------------------


def test_available_now_reads_only_what_existed_when_prepared(clock: FakeClock) -> None:
    catalog = SequenceCatalog({"a": 10, "b": 5})
    existing = catalog.records()
    planner = planner_for(catalog, clock)
    query = Query(planner)
    planner.prepare_available_now()
    catalog.append("a", 5)
    catalog.add("late", 4)
    clock.advance(DISCOVERY)
    query.drain(MaxRecords(4))
    assert_exactly_once(query.read, existing)
    catalog.append("late", 1)
    clock.advance(DISCOVERY)
    assert query.plan(MaxRecords(4)) is None


def test_available_now_on_a_fresh_query_prepares_before_the_initial_offset(
    clock: FakeClock,
) -> None:
    catalog = SequenceCatalog({"a": 10, "b": 5})
    existing = catalog.records()
    planner = planner_for(catalog, clock)
    planner.prepare_available_now()  # Spark: in MicroBatchExecution.logicalPlan
    query = Query(planner)  # initialOffset fixes the target, then the batches
    catalog.append("a", 5)
    query.drain(MaxRecords(4))
    assert_exactly_once(query.read, existing)


def test_available_now_after_a_restart_reads_up_to_what_existed_when_prepared(
    clock: FakeClock,
) -> None:
    catalog = SequenceCatalog({"a": 10, "b": 5})
    first = Query(planner_for(catalog, clock))
    first.batch(MaxRecords(6))
    catalog.append("b", 5)
    existing = catalog.records()

    restarted = planner_for(catalog, clock)
    restarted.prepare_available_now()  # before Spark says where the run resumes
    second = Query(restarted, start=first.offset)
    second.batch(MaxRecords(4))  # the run's first planning call fixes the target
    catalog.append("a", 3)
    catalog.add("late", 2)
    clock.advance(DISCOVERY)
    second.drain(MaxRecords(4))
    assert_exactly_once(first.read + second.read, existing)


# -- replay and restore after a driver crash ------------------------------------------------------


def grow(catalog: SequenceCatalog, step: int) -> None:
    """Change the data between batches: appends, a new split, a sealed one."""
    catalog.append("a", 3 + step)
    if step == 1:
        catalog.add(f"new{step}", 4)
    if step == 2:
        catalog.seal("c")
    catalog.append("b", step % 2)


def run_batches(query: Query, catalog: SequenceCatalog, clock: FakeClock, count: int) -> None:
    for step in range(count):
        grow(catalog, step)
        clock.advance(DISCOVERY)
        query.batch(MaxRecords(9))


@pytest.mark.parametrize("crash_after", [0, 1, 3])
def test_a_new_planner_restores_from_the_last_offset_and_continues_exactly_once(
    clock: FakeClock, crash_after: int
) -> None:
    catalog = SequenceCatalog({"a": 20, "b": 5, "c": 2, "d": 0})
    before = Query(planner_for(catalog, clock, parallelism=2))
    run_batches(before, catalog, clock, crash_after)
    logged = before.offset  # the driver dies; Spark's offset log ends here

    grow(catalog, 5)
    after = Query(planner_for(catalog, clock, parallelism=2), start=logged)
    after.drain(MaxRecords(9))
    catalog.append("d", 2)
    clock.advance(DISCOVERY)
    after.drain(MaxRecords(9))
    assert_exactly_once(before.read + after.read, catalog.records())


def test_a_batch_planned_but_not_logged_is_planned_again_after_the_crash(
    clock: FakeClock,
) -> None:
    catalog = SequenceCatalog({"a": 20, "b": 5, "c": 2})
    before = Query(planner_for(catalog, clock))
    run_batches(before, catalog, clock, 2)
    lost = before.plan(MaxRecords(9))  # planned, then the driver died before Spark logged it
    assert lost is not None

    after = Query(planner_for(catalog, clock), start=before.offset)
    after.drain(MaxRecords(9))
    assert_exactly_once(before.read + after.read, catalog.records())


def test_a_replayed_batch_reads_the_same_records_and_the_query_continues(
    clock: FakeClock,
) -> None:
    catalog = SequenceCatalog({"a": 20, "b": 5, "c": 2})
    before = Query(planner_for(catalog, clock))
    run_batches(before, catalog, clock, 2)
    logged = before.plan(MaxRecords(9))  # in Spark's offset log; the driver dies mid-batch
    assert logged is not None
    planned_by_old = tasks_as_ranges(plan_partitions(before.planner.read_offset(logged), 4))
    catalog.append("a", 7)

    new_planner = planner_for(catalog, clock)
    # Spark replays with partitions(start, end) before any latestOffset call
    planned_by_new = tasks_as_ranges(plan_partitions(new_planner.read_offset(logged), 4))
    assert planned_by_new == planned_by_old
    after = Query(new_planner, start=before.offset)
    after.run(logged)
    after.drain(MaxRecords(9))
    assert_exactly_once(before.read + after.read, catalog.records())


def test_a_finished_split_stays_finished_after_a_restore(clock: FakeClock) -> None:
    catalog = SequenceCatalog({"a": 4, "b": 2})
    catalog.seal("b")
    before = Query(planner_for(catalog, clock))
    before.drain()
    assert "b" in before.planner.read_offset(before.offset).enumerator.finished

    after = Query(planner_for(catalog, clock), start=before.offset)
    clock.advance(DISCOVERY)
    catalog.append("a", 1)
    after.drain()
    assert after.read == [("a", 4)]
    assert "b" in after.planner.read_offset(after.offset).enumerator.finished


# -- rescale --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("old", "new"), [(2, 1), (2, 3), (3, 5), (4, 2), (1, 4)])
def test_a_restart_with_another_parallelism_balances_splits_and_stays_exactly_once(
    clock: FakeClock, old: int, new: int
) -> None:
    catalog = SequenceCatalog({f"s{i:02d}": 3 * i + 1 for i in range(11)})
    before = Query(planner_for(catalog, clock, parallelism=old))
    before.batch(MaxRecords(40))
    before.batch(MaxRecords(40))
    for i in range(0, 11, 3):
        catalog.append(f"s{i:02d}", 5)

    after = Query(planner_for(catalog, clock, parallelism=new), start=before.offset)
    end = after.plan(MaxRecords(40))
    assert end is not None
    loads = [len(slot) for slot in slot_splits(end, after.planner)]
    assert len(loads) == new
    assert sum(loads) == 11
    assert max(loads) - min(loads) <= 1, f"slot loads {loads}"
    owners = Counter(info["owner"] for info in after.planner.lag()["splits"].values())
    assert sorted(owners.values()) == sorted(load for load in loads if load)
    after.run(end)
    after.drain(MaxRecords(40))
    assert_exactly_once(before.read + after.read, catalog.records())


# -- offsets --------------------------------------------------------------------------------------


def test_offsets_stay_compact_with_a_thousand_splits(clock: FakeClock) -> None:
    catalog = SequenceCatalog({f"split-{i:04d}": 1_000 + i for i in range(1_000)})
    query = Query(planner_for(catalog, clock, parallelism=8))
    end = query.plan(MaxRecords(250_000))
    assert end is not None
    per_split = len(json.dumps(end)) / 1_000
    print(f"\nBatch offset with 1,000 splits (10-char ids): {per_split:.1f} bytes per split")
    assert per_split < 200


def test_batch_offset_round_trips_through_json(clock: FakeClock) -> None:
    catalog = SequenceCatalog({"a": 9, "b": 4})
    catalog.seal("b")
    query = Query(planner_for(catalog, clock))
    query.drain(MaxRecords(5))
    decoded = query.planner.read_offset(query.offset)
    assert decoded.encode(query.source) == query.offset
    assert BatchOffset.decode(as_spark_stores_it(decoded.encode(query.source)), query.source) == (
        decoded
    )


@pytest.mark.parametrize(
    "data",
    [
        {"splitflow": OFFSET_FORMAT + 1, "seq": 3},
        {"splitflow": "1", "seq": 3},
        {"seq": 3, "slots": []},
        {"topic": {"0": 42}},  # some other source's offset
    ],
)
def test_batch_offset_decode_rejects_an_unknown_format(
    clock: FakeClock, data: dict[str, Any]
) -> None:
    source = SequenceSource(SequenceCatalog({"a": 1}))
    with pytest.raises(IncompatibleCheckpointError) as caught:
        BatchOffset.decode(data, source)
    assert caught.value.found == data.get("splitflow")
    assert caught.value.expected == OFFSET_FORMAT


def test_commit_is_idempotent_and_may_lag_behind_planning(clock: FakeClock) -> None:
    catalog = SequenceCatalog({"a": 30})
    planner = planner_for(catalog, clock)
    start = planner.initial_offset()
    planner.commit(start)
    first = planner.latest_offset(start, MaxRecords(10))
    second = planner.latest_offset(first, MaxRecords(10))  # Spark commits batch k after k+1
    planner.commit(first)
    planner.commit(first)
    planner.commit(second)
    third = planner.latest_offset(second, MaxRecords(10))
    assert [o["seq"] for o in (first, second, third)] == [1, 2, 3]


# -- lag ------------------------------------------------------------------------------------------


def test_lag_reports_owner_position_and_the_latest_the_batch_was_planned_against(
    clock: FakeClock,
) -> None:
    # Spark asks for the report right after planning: it shows what planning saw.
    catalog = SequenceCatalog({"a": 10, "b": 4})
    query = Query(planner_for(catalog, clock, parallelism=2))
    query.batch(MaxRecords(6))
    catalog.append("b", 2)  # after planning: not in this batch's report
    lag = query.planner.lag()
    owners = {
        sid: slot
        for slot, ids in enumerate(slot_splits(query.offset, query.planner))
        for sid in ids
    }
    read = Counter(name for name, _ in query.read)
    assert lag["backlog"] is True  # the records there at the start are the backlog
    assert lag["splits"] == {
        "a": {
            "owner": owners["a"],
            "position": read["a"],
            "latest": 10,
            "lag": 10 - read["a"],
            "backlogBoundary": 10,
            "toBoundary": 10 - read["a"],
        },
        "b": {
            "owner": owners["b"],
            "position": read["b"],
            "latest": 4,
            "lag": 4 - read["b"],
            "backlogBoundary": 4,
            "toBoundary": 4 - read["b"],
        },
    }
    query.batch(MaxRecords(6))
    assert query.planner.lag()["splits"]["b"]["latest"] == 6
    assert read["a"] + read["b"] == 6


class _SealsBWhenAFinishes(SequenceSource):
    """A source whose split ``b`` ends (its writer closes it) right when split ``a``
    finishes: between two looks at the extents in one planning."""

    def create_enumerator(self, context: Any) -> Any:
        catalog = self.catalog

        class Enumerator(SequenceEnumerator):
            def handle_source_event(self, reader: int, event: Any) -> None:
                super().handle_source_event(reader, event)
                if isinstance(event, SplitsFinishedEvent) and "a" in event.split_ids:
                    catalog.seal("b")

        return Enumerator(self, context, None)


def test_a_split_that_ends_while_a_batch_is_planned_is_finished(clock: FakeClock) -> None:
    """Planning finishes split a (at its end, unread); that ends split b (at its end too):
    b is finished in the same planning, not left held (a later planning looks only at the
    splits whose extent or position changed, and b's do not)."""
    catalog = SequenceCatalog({"a": 0, "b": 0, "c": 3})
    catalog.seal("a")
    query = Query(Planner(_SealsBWhenAFinishes(catalog), 1, clock=clock))
    query.drain()
    catalog.append("c", 2)
    query.drain()
    assert sorted(query.read) == [("c", i) for i in range(5)]
    assert list(query.planner.lag()["splits"]) == ["c"]  # a and b finished


def test_progress_before_the_planner_started_is_empty(clock: FakeClock) -> None:
    report = planner_for(SequenceCatalog({"a": 3}), clock).lag()
    assert (report["splitCount"], report["totalLag"], report["splits"]) == (0, 0, {})


def test_lag_totals_per_slot_and_lists_only_the_most_lagging_splits_of_a_large_source(
    clock: FakeClock,
) -> None:
    catalog = SequenceCatalog({f"s{i:02d}": i for i in range(12)})  # s00 has 0 ... s11 has 11
    query = Query(planner_for(catalog, clock, parallelism=3))
    query.planner.progress_splits = 4
    query.batch(MaxRecords(1))  # s11 gets the one record: the largest backlog
    lag = query.planner.lag()
    assert lag["splitCount"] == 12
    assert lag["totalLag"] == sum(range(12)) - 1
    assert [s["splits"] for s in lag["slots"]] == [4, 4, 4]
    assert sum(s["lag"] for s in lag["slots"]) == lag["totalLag"]
    assert sorted(lag["splits"]) == ["s08", "s09", "s10", "s11"]  # lags 8, 9, 10, 10
    assert lag["splits"]["s11"]["lag"] == 10


# -- maxBytesPerBatch -----------------------------------------------------------------------------


def test_share_bytes_shares_a_byte_budget_by_backlog_in_bytes() -> None:
    # 100 records of 10 bytes and 100 of 1,000: the budget goes about 1 : 100, whole records.
    reads = share_bytes({"small": 100, "large": 100}, {"small": 10.0, "large": 1_000.0}, 10_100)
    assert reads == {"small": 10, "large": 9}
    assert reads["small"] * 10 + reads["large"] * 1_000 <= 10_100


def test_share_bytes_gives_each_split_one_record_even_larger_than_its_share() -> None:
    # Every split with a backlog moves while the budget lasts, even past the budget.
    assert share_bytes({"a": 5, "b": 5}, {"a": 4_000.0, "b": 4_000.0}, 1_000) == {"a": 1, "b": 1}
    assert share_bytes({"a": 5, "b": 5}, {"a": 4_000.0, "b": 4_000.0}, 1) == {"a": 1}


def test_share_bytes_names_the_option_when_a_split_has_no_size_estimate() -> None:
    with pytest.raises(ConfigurationError, match=r"maxBytesPerBatch.*split b") as caught:
        share_bytes({"a": 5, "b": 5}, {"a": 10.0, "b": None}, 1_000)
    assert caught.value.option == "maxBytesPerBatch"


def test_max_bytes_plans_batches_by_the_source_s_size_estimate(clock: FakeClock) -> None:
    catalog = SequenceCatalog({"a": 300, "b": 300})
    source = SequenceSource(catalog, discovery_interval=DISCOVERY, record_bytes=100)
    query = Query(Planner(source, 2, clock=clock))
    batches = 0
    while query.batch(MaxBytes(5_000)) is not None:
        batches += 1
        assert len(query.batches[-1]) == 50  # 5,000 bytes of 100-byte records
    assert batches == 12
    assert_exactly_once(query.read, catalog.records())


def test_max_bytes_with_max_records_keeps_both_limits(clock: FakeClock) -> None:
    catalog = SequenceCatalog({"a": 300, "b": 300})
    source = SequenceSource(catalog, discovery_interval=DISCOVERY, record_bytes=100)
    query = Query(Planner(source, 2, clock=clock))
    assert len(query.batch(MaxBytes(5_000, records=20)) or []) == 20
    assert len(query.batch(MaxBytes(1_000, records=20)) or []) == 10


def test_an_initial_offset_read_by_another_planner_is_a_clear_error(clock: FakeClock) -> None:
    catalog = SequenceCatalog({"a": 5})
    start = as_spark_stores_it(planner_for(catalog, clock).initial_offset())
    with pytest.raises(ValueError, match="initial offset holds no state"):
        planner_for(catalog, clock).read_offset(start)


# -- the enumerator's changed_positions ----------------------------------------------------------


class _UntrackedEnumerator(SequenceEnumerator):
    def changed_positions(self, since: object | None) -> None:
        return None  # as an enumerator that does not track changes


class _UntrackedSequenceSource(SequenceSource):
    """The sequence source whose enumerator answers only ``latest_positions``."""

    def create_enumerator(self, context: Any) -> Any:
        return _UntrackedEnumerator(self, context, None)

    def restore_enumerator(self, context: Any, state: Any) -> Any:
        return _UntrackedEnumerator(self, context, state)


_STEPS = st.lists(
    st.tuples(
        st.sampled_from(["append", "add", "seal", "remove", "batch", "restart", "availableNow"]),
        st.integers(0, 6),
    ),
    max_size=30,
)
_LIMITS = [READ_ALL, MaxRecords(7), MaxRecords(40)]


def _restarted(query: Query, parallelism: int, clock: FakeClock) -> Query:
    """``query`` run anew (a new planner) from its last offset, at ``parallelism``."""
    restarted = Query(Planner(query.source, parallelism, clock=clock), query.offset)
    restarted.read = query.read
    return restarted


@PROPERTY
@given(_STEPS)
@example([("append", 0), ("batch", 1), ("remove", 0), ("batch", 0)])  # gone, not yet discovered
@example([("append", 1), ("seal", 1), ("batch", 1), ("append", 2), ("restart", 2), ("batch", 0)])
def test_a_planner_told_only_what_changed_plans_what_one_asking_every_split_plans(
    steps: list[tuple[str, int]],
) -> None:
    """The sequence enumerator tracks changes; a copy of it that does not makes its planner
    ask ``latest_positions`` for every split at every planning. Driven through the same
    appends, new, sealed and removed splits, limits, restarts (at another parallelism) and
    ``availableNow`` runs, both plan the same offsets and read every record once."""
    lengths = {f"s{i}": 10 * i for i in range(4)}
    catalogs = [SequenceCatalog(lengths), SequenceCatalog(lengths)]
    clocks = [FakeClock(), FakeClock()]
    gone: set[str] = set()
    queries = [
        Query(
            Planner(SequenceSource(catalogs[0], discovery_interval=DISCOVERY), 2, clock=clocks[0])
        ),
        Query(
            Planner(
                _UntrackedSequenceSource(catalogs[1], discovery_interval=DISCOVERY),
                2,
                clock=clocks[1],
            )
        ),
    ]
    for op, arg in steps:
        for q, (catalog, clock) in enumerate(zip(catalogs, clocks, strict=True)):
            clock.advance(DISCOVERY / 5)  # a discovery every fifth step
            names = sorted(catalog.lengths())
            name = names[arg % len(names)] if names else None
            if op == "batch":
                queries[q].batch(_LIMITS[arg % len(_LIMITS)])
            elif op == "restart":
                queries[q] = _restarted(queries[q], 1 + arg % 3, clock)
            elif op == "availableNow":  # a run of its own, then the query runs on
                queries[q] = _restarted(queries[q], 2, clock)
                queries[q].planner.prepare_available_now()
                queries[q].drain(MaxRecords(25))
                queries[q] = _restarted(queries[q], 2, clock)
            elif op == "add" and f"n{arg}" not in catalog.lengths() and f"n{arg}" not in gone:
                catalog.add(f"n{arg}", arg)
            elif op == "append" and name is not None and not catalog.is_sealed(name):
                catalog.append(name, 5)
            elif op == "seal" and name is not None:
                catalog.seal(name)
            elif op == "remove" and name is not None:
                catalog.remove(name)
                gone.add(name)  # a split id is never used again
        assert queries[0].offset == queries[1].offset, f"after {op} {arg}"
        if op == "batch":  # Spark asks for progress after each planning
            assert queries[0].planner.lag() == queries[1].planner.lag()
        for planner in (query.planner for query in queries):  # keeps nothing of other splits
            assert planner._extent_of.keys() <= planner._slot_of.keys()
            assert planner._unknown <= planner._slot_of.keys()
            table = planner._table  # positions and extents, kept as splits move
            assert table.row_of.keys() == planner._slot_of.keys()
            totals: Counter[int] = Counter()
            for sid, row in table.row_of.items():
                slot = planner._slot_of[sid]
                position = planner._pieces[slot][sid].stop
                assert (table.slot[row], table.position[row]) == (slot, position)
                assert planner._current()[slot][sid].position == position
                if (extent := planner._extent_of.get(sid)) is not None:
                    totals[slot] += max(0, extent.exists_to - position)
            lags = table.slot_lags(table.lags(), planner.parallelism)
            assert {slot: lag for slot, lag in enumerate(lags) if lag} == +totals
    for clock, query in zip(clocks, queries, strict=True):
        clock.advance(DISCOVERY)
        query.drain()
    assert queries[0].offset == queries[1].offset
    assert queries[0].read == queries[1].read
    assert_exactly_once(queries[0].read, set(queries[0].read))
    assert set(catalogs[0].records()) <= set(queries[0].read)


class _AwkwardSource(SequenceSource):
    """A tracking sequence source whose enumerator is awkward the way real ones may be
    (``awkward``): ``untold``, it cannot tell split ``late`` the first time it is asked
    for it; ``racing``, a writer appends to ``late`` right after the enumerator read the
    catalog for it; ``forgets``, once told to (``forget``), it cannot tell what changed
    and from then on knows no change made before."""

    def __init__(self, catalog: SequenceCatalog, awkward: str) -> None:
        super().__init__(catalog, discovery_interval=DISCOVERY)
        self.awkward = awkward

    def create_enumerator(self, context: Any) -> Any:
        catalog, awkward = self.catalog, self.awkward

        class Enumerator(SequenceEnumerator):
            asked_late = 0  # by the planner (the enumerator also asks when it adds splits)
            adding = False
            forget = False
            floor = 0

            def add_splits(self, splits: Any, *, at_start: bool = False) -> None:
                self.adding = True
                try:
                    super().add_splits(splits, at_start=at_start)
                finally:
                    self.adding = False

            def latest_positions(self, splits: Any) -> Any:
                told = dict(super().latest_positions(splits))
                if not self.adding and any(split.name == "late" for split in splits):
                    self.asked_late += 1
                    if self.asked_late == 1 and awkward == "untold":
                        del told["late"]
                    if self.asked_late == 1 and awkward == "racing":
                        catalog.append("late", 3)
                return told

            def changed_positions(self, since: object | None) -> Any:
                if self.forget:
                    self.forget, self.floor = False, catalog.changes(None)[0]
                    return None
                if isinstance(since, int):
                    since = max(since, self.floor)
                return super().changed_positions(since)

        return Enumerator(self, context, None)


@pytest.mark.parametrize("awkward", ["untold", "racing", "forgets"])
def test_a_tracking_planner_reads_every_record_of_an_awkward_source(
    clock: FakeClock, awkward: str
) -> None:
    """A split the source could not tell is asked for again (``untold``), a change made
    while the planner asked for a new split is planned (``racing``: the token is older
    than what the source read), and a call that cannot tell what changed makes the
    planner ask for every split (``forgets``): every record is read once."""
    catalog = SequenceCatalog({"a": 5, "b": 5})
    query = Query(Planner(_AwkwardSource(catalog, awkward), 2, clock=clock))
    query.drain()
    catalog.add("late", 4)
    clock.advance(DISCOVERY)
    query.drain()
    catalog.append("b", 3)
    enumerator = query.planner.coordinator.enumerator
    enumerator.forget = awkward == "forgets"
    for _ in range(3):
        clock.advance(DISCOVERY)
        query.drain()
    assert enumerator.asked_late >= 1  # the planner asked for the late split
    assert not enumerator.forget  # and the enumerator forgot, when told to
    assert_exactly_once(query.read, catalog.records())


# -- the start of a planner in a planning process ---------------------------------------------

QUIET_START = """
import gc, sys, weakref
from splitflow.spark.limits import ReadAll
from splitflow.spark.planner import Planner, collect_garbage_less_often
from splitflow.testing.sequence import SequenceCatalog, SequenceSource

if sys.argv[1] == "planning":
    collect_garbage_less_often()
gc.set_threshold(700, 10, 10)  # Python's default: a start of 20k splits sets off collections
started = []  # the generation of each collection that starts
gc.callbacks.append(lambda phase, info: phase == "start" and started.append(info["generation"]))
restoring = []  # the collections that started while a planner restored (in _ensure)
ensure = Planner._ensure
def counted(self, start):
    before = len(started)
    try:
        return ensure(self, start)
    finally:
        restoring.append(len(started) - before)
Planner._ensure = counted
catalog = SequenceCatalog({f"s{i:05d}": 3 for i in range(20_000)})
first = Planner(SequenceSource(catalog), 4, clock=lambda: 0.0)
gc.collect()  # none due as the start begins, whatever the imports made
started.clear()
start = first.initial_offset()
print("initial", len(started), gc.get_freeze_count() > 0)
end = first.latest_offset(start, ReadAll())
catalog.append("s00003", 1)
later = first.latest_offset(end, ReadAll())
old = weakref.ref(first.coordinator)
first.latest_offset(end, ReadAll())  # Spark hands back an older start: the planner restores
print("old", old() is None)  # the coordinator it replaced is freed, not frozen
first.close()
print("closed", gc.get_freeze_count())
catalog.append("s00007", 2)
gc.collect()
restoring.clear()
restored = Planner(SequenceSource(catalog), 3, clock=lambda: 0.0)
after = restored.latest_offset(later, ReadAll())  # a restart: restores from later
print("restore", sum(restoring), gc.get_freeze_count() > 0)
print("reads", sum(s.records for slot in range(3) for s in restored.planned(after).reading(slot)))
split = weakref.ref(next(iter(restored._slots[0].values())))
restored.close()
del restored
gc.collect()
print("freed", gc.get_freeze_count(), split() is None)
"""


@pytest.mark.parametrize("process", ["planning", "other"])
def test_a_planning_process_starts_planners_without_collections_and_freezes_what_they_made(
    process: str,
) -> None:
    """In a process that plans batches, a planner's start and restore run no collection
    and freeze what they made; closing unfreezes it, and the splits are freed. Elsewhere
    the collector is left as it is. Both processes collect at Python's default thresholds,
    under which a start of 20k splits sets off collections."""
    done = subprocess.run(
        [sys.executable, "-c", QUIET_START, process], capture_output=True, text=True, check=True
    )
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    planning = process == "planning"
    initial, froze = lines["initial"].split()
    assert (int(initial) == 0) == planning  # collections while it started
    assert froze == str(planning)
    assert lines["old"] == "True"
    assert lines["closed"] == "0"
    restored, froze = lines["restore"].split()
    assert (int(restored) == 0) == planning
    assert froze == str(planning)
    assert lines["reads"] == "2"  # the restored planner reads on: what was appended
    assert lines["freed"] == "0 True"


BATCHES_WITHOUT_COLLECTIONS = """
import gc, sys
from splitflow.spark.limits import ReadAll
from splitflow.spark.planner import Planner, collect_garbage_less_often
from splitflow.testing.sequence import SequenceCatalog, SequenceSource

gc.set_threshold(700, 10, 10)  # Python's default (3.11 to 3.13)
if sys.argv[1] == "planning":
    collect_garbage_less_often()
started = []  # the generation of each collection that starts
gc.callbacks.append(lambda phase, info: phase == "start" and started.append(info["generation"]))
names = [f"s{i:05d}" for i in range(30_000)]
catalog = SequenceCatalog(dict.fromkeys(names, 3))
now = [0.0]
planner = Planner(SequenceSource(catalog, discovery_interval=1.0), 4, clock=lambda: now[0])
start = planner.initial_offset()
for batch in range(4):  # every batch reads every split
    for name in names:
        catalog.append(name, 1)
    now[0] += 1.0
    started.clear()
    end = planner.latest_offset(start, ReadAll())
    planner.commit(end)
    start = end
print("collections", len(started))  # in the last batch
print("threshold", gc.get_threshold()[0])
"""


@pytest.mark.parametrize("process", ["planning", "other"])
def test_a_planning_process_collects_its_youngest_objects_in_proportion_to_the_splits_held(
    process: str,
) -> None:
    """In a process that plans batches, the youngest generation is collected once as many
    objects as three times the splits held were made: a batch that reads each of 30k splits
    sets off no collection (at the fixed threshold, it did; the objects a batch makes
    would each be visited by collections that fall within it). Elsewhere the collector is
    left as it is."""
    done = subprocess.run(
        [sys.executable, "-c", BATCHES_WITHOUT_COLLECTIONS, process],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    if process == "planning":
        assert lines["threshold"] == "90000"
        assert lines["collections"] == "0"
    else:
        assert lines["threshold"] == "700"  # as the script set it
        assert int(lines["collections"]) > 0
