"""Backlog awareness on the driver (FLIP-309 with the Fluss boundary design), without Spark.

In the spirit of Flink's CheckpointIntervalDuringBacklogITCase: a split's backlog boundary
is its latest position when first seen; the source processes backlog while any split is
behind its boundary; batch sizes follow the flag (``BacklogAware``: throughput-sized while
catching up, latency-sized after), switch when the last split crosses its boundary, and
switch back when the query falls more than a threshold behind. Boundaries are enumerator
state: they survive a restart and a rescale, and a boundary is reported once per split.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from tests.spark.backlog_source import BacklogLoggingSource
from tests.spark.test_planner import DISCOVERY, FakeClock, Query, assert_exactly_once

from splitflow.spark.limits import BacklogAware, MaxRecords, ReadAll
from splitflow.spark.planner import Planner
from splitflow.testing.sequence import SequenceCatalog, SequenceSource

SIZED = BacklogAware(backlog=MaxRecords(50), live=MaxRecords(5))


def planner(
    catalog: SequenceCatalog,
    clock: FakeClock,
    parallelism: int = 2,
    threshold: int | None = None,
) -> Planner[Any, Any]:
    source = SequenceSource(catalog, discovery_interval=DISCOVERY)
    return Planner(source, parallelism, clock=clock, backlog_lag_threshold=threshold)


def boundaries(query: Query) -> dict[str, int]:
    """The boundaries in the query's last offset (the enumerator's, when it was planned)."""
    return dict(query.planner.read_offset(query.offset).enumerator.backlog)


def live_boundaries(p: Planner[Any, Any]) -> dict[str, int]:
    """The enumerator's boundaries now (after the last ``latestOffset`` call)."""
    return dict(p._settle(p.coordinator.backlog_boundaries()))


def counting_planner(catalog: SequenceCatalog, clock: FakeClock, log: Path) -> Planner[Any, Any]:
    """A planner whose enumerators log each BacklogFinishedEvent's splits to ``log``."""
    source = BacklogLoggingSource(catalog, discovery_interval=DISCOVERY)
    source.log_path = str(log)
    return Planner(source, 2, clock=clock)


def received(log: Path) -> Counter[str]:
    return Counter(log.read_text().split()) if log.exists() else Counter()


def test_boundaries_are_the_latest_positions_when_splits_are_first_seen() -> None:
    clock = FakeClock()
    catalog = SequenceCatalog({"a": 100, "b": 20, "empty": 0})
    query = Query(planner(catalog, clock))
    assert boundaries(query) == {"a": 100, "b": 20}  # nothing to catch up: no boundary
    assert query.planner.in_backlog
    catalog.append("a", 7)  # after first sight: not backlog
    catalog.add("late", 30)  # a split discovered later: its backlog is what it has then
    clock.advance(DISCOVERY)
    query.batch(MaxRecords(1))
    assert boundaries(query) == {"a": 100, "b": 20, "late": 30}


def test_batch_sizes_follow_the_backlog_flag_and_switch_when_the_last_split_crosses() -> None:
    clock = FakeClock()
    catalog = SequenceCatalog({"a": 120, "b": 30})
    query = Query(planner(catalog, clock))
    while len(query.read) < 150:
        assert query.batch(SIZED) is not None
    catalog.append("a", 12)  # live records, once the backlog is read
    catalog.append("b", 3)
    clock.advance(1.0)
    query.drain(SIZED)
    sizes = [len(b) for b in query.batches]
    flags = [query.planner.read_offset(end).backlog for end in query.ends]
    assert sizes == [50, 50, 50, 5, 5, 5], sizes
    assert flags == [True, True, True, False, False, False]
    assert_exactly_once(query.read, catalog.records())


def test_the_flag_stays_on_until_the_last_split_reaches_its_boundary() -> None:
    clock = FakeClock()
    catalog = SequenceCatalog({"fast": 4, "slow": 400})
    query = Query(planner(catalog, clock))
    while "fast" in live_boundaries(query.planner):
        query.batch(SIZED)
    assert set(live_boundaries(query.planner)) == {"slow"}
    assert query.planner.in_backlog
    lag = query.planner.lag()
    assert lag["backlog"] is True
    assert lag["backlogSplits"] == 1
    assert lag["splits"]["slow"]["toBoundary"] == 400 - lag["splits"]["slow"]["position"] > 0
    assert "backlogBoundary" not in lag["splits"]["fast"]


def test_falling_behind_by_more_than_the_threshold_enters_backlog_again() -> None:
    clock = FakeClock()
    catalog = SequenceCatalog({"a": 10, "b": 10})
    query = Query(planner(catalog, clock, threshold=100))
    query.drain(SIZED)
    assert not query.planner.in_backlog
    catalog.append("a", 60)  # 60 behind: under the threshold, stays live
    clock.advance(1.0)
    assert len(query.batch(SIZED) or []) == 5
    assert not query.planner.in_backlog
    catalog.append("a", 80)
    catalog.append("b", 40)  # 55 + 120 = 175 behind: over 100
    clock.advance(1.0)
    assert len(query.batch(SIZED) or []) == 50
    assert boundaries(query) == {"a": 150, "b": 50}  # the latest positions then
    query.drain(SIZED)
    assert not query.planner.in_backlog
    assert [len(b) for b in query.batches][-1] <= 50
    assert_exactly_once(query.read, catalog.records())


def test_boundaries_survive_a_restart_and_a_rescale() -> None:
    clock = FakeClock()
    catalog = SequenceCatalog({f"s{i}": 40 for i in range(6)})
    before = Query(planner(catalog, clock, parallelism=2))
    before.batch(SIZED)
    catalog.append("s0", 500)  # arrives after the boundaries were set: not backlog
    clock.advance(DISCOVERY)

    for parallelism in (3, 1):  # a rescale, then another
        after = Query(planner(catalog, clock, parallelism=parallelism), start=before.offset)
        after.batch(SIZED)
        assert after.planner.in_backlog
        kept = boundaries(after)
        assert kept, "the boundaries were lost"
        assert all(b == 40 for b in kept.values()), kept
        before = after
    before.drain(SIZED)
    assert not before.planner.in_backlog
    assert live_boundaries(before.planner) == {}


def test_a_split_s_boundary_is_reported_once_across_idle_triggers_and_a_restart(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    catalog = SequenceCatalog({"a": 10, "b": 10})
    log = tmp_path / "events.txt"
    query = Query(counting_planner(catalog, clock, log))
    query.batch(ReadAll())  # reads both to their boundary
    for _ in range(3):  # idle triggers: latestOffset with nothing new
        clock.advance(1.0)
        assert query.plan(ReadAll()) is None
    assert received(log) == {"a": 1, "b": 1}
    assert not query.planner.in_backlog

    # A restart from that batch's offset, which still holds both boundaries (the events
    # were derived when planning the next batch): the restored enumerator gets them once.
    assert boundaries(query) == {"a": 10, "b": 10}
    log = tmp_path / "events-after-restart.txt"
    after = Query(counting_planner(catalog, clock, log), start=query.offset)
    catalog.append("a", 1)
    clock.advance(1.0)
    after.batch(ReadAll())
    assert received(log) == {"a": 1, "b": 1}
    assert boundaries(after) == {}
    clock.advance(1.0)
    assert after.plan(ReadAll()) is None
    assert received(log) == {"a": 1, "b": 1}


def test_an_enumerator_can_hold_the_backlog_flag_itself() -> None:
    clock = FakeClock()
    catalog = SequenceCatalog({"a": 0})
    query = Query(planner(catalog, clock))
    assert not query.planner.in_backlog
    query.planner._settle(query.planner.coordinator.run(lambda e: e.hold_backlog(True)))
    catalog.append("a", 100)
    clock.advance(1.0)
    assert len(query.batch(SIZED) or []) == 50
    assert query.planner.read_offset(query.offset).enumerator.backlog_held
    restarted = Query(planner(catalog, clock), start=query.offset)
    restarted.batch(SIZED)
    assert restarted.planner.in_backlog  # held across the restart
