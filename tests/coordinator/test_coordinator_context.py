"""CoordinatorContext (the enumerator's context), mirroring Flink's SourceCoordinatorContextTest.

The context is called by the enumerator on the coordinator thread; with a ManualScheduler
the test thread is that thread, so the tests call it directly.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from tests.coordinator.helpers import (
    Harness,
    ReassigningFakeSource,
    Split,
    make_harness,
    splits,
)

from splitflow.api.events import SourceEvent
from splitflow.coordinator import AddSplits, NoMoreSplits, ReaderEvent
from splitflow.errors import ContractViolation


@dataclass(frozen=True)
class Hello(SourceEvent):
    text: str = "hi"


@pytest.fixture
def h() -> Harness:
    harness = make_harness(parallelism=3)
    harness.run(harness.coordinator.register_reader(0, "host-0"))
    harness.run(harness.coordinator.register_reader(1, "host-1"))
    return harness  # reader 2 is not registered


# -- properties ---------------------------------------------------------------------------


def test_current_parallelism_is_the_coordinators_parallelism(h: Harness) -> None:
    assert h.coordinator.context.current_parallelism == 3


def test_reports_splits_on_registration_follows_the_mixin() -> None:
    assert make_harness().coordinator.context.reports_splits_on_registration is False
    with_mixin = make_harness(ReassigningFakeSource())
    assert with_mixin.coordinator.context.reports_splits_on_registration is True


def test_registered_readers_lists_each_reader_with_location_and_reported_splits() -> None:
    h = make_harness(ReassigningFakeSource(), parallelism=2)
    h.run(h.coordinator.register_reader(1, "host-1", reported_splits=[Split("a", 5)]))
    h.run(h.coordinator.register_reader(0))

    readers = h.coordinator.context.registered_readers()

    assert sorted(readers) == [0, 1]
    assert readers[1].reader_id == 1
    assert readers[1].location == "host-1"
    assert readers[1].reported_splits == (Split("a", 5),)
    assert readers[0].location is None
    assert readers[0].reported_splits == ()


def test_registered_readers_cannot_be_changed_by_the_enumerator(h: Harness) -> None:
    readers = h.coordinator.context.registered_readers()
    with pytest.raises(TypeError):
        readers[5] = readers[0]  # type: ignore[index]
    with pytest.raises((TypeError, AttributeError)):
        readers.pop(0)  # type: ignore[attr-defined]
    assert sorted(h.coordinator.context.registered_readers()) == [0, 1]


def test_failed_reader_is_no_longer_registered(h: Harness) -> None:
    h.run(h.coordinator.reader_failed(1, None))
    assert sorted(h.coordinator.context.registered_readers()) == [0]


# -- assign_splits ------------------------------------------------------------------------


def test_assign_splits_sends_each_reader_its_splits_in_reader_order(h: Harness) -> None:
    h.coordinator.context.assign_splits({1: list(splits("c")), 0: list(splits("a", "b"))})

    assert h.gateway.sent == [
        (0, AddSplits((Split("a"), Split("b")))),
        (1, AddSplits((Split("c"),))),
    ]


def test_assign_splits_records_the_assignment_in_the_tracker(h: Harness) -> None:
    h.coordinator.context.assign_splits({0: list(splits("a")), 1: list(splits("b", "c"))})
    tracked = h.coordinator.tracker.assignments_since(None)
    assert {r: [s.split_id for s in ss] for r, ss in tracked.items()} == {
        0: ["a"],
        1: ["b", "c"],
    }


def test_assign_splits_skips_readers_with_an_empty_list(h: Harness) -> None:
    h.coordinator.context.assign_splits({0: [], 1: list(splits("a"))})
    assert h.gateway.sent == [(1, AddSplits((Split("a"),)))]
    assert 0 not in h.coordinator.tracker.assignments_since(None)


def test_assign_splits_to_an_unregistered_reader_raises_and_sends_nothing(h: Harness) -> None:
    with pytest.raises(
        ContractViolation, match=r"reader 2 is not registered \(registered: \[0, 1\]\)"
    ):
        h.coordinator.context.assign_splits({0: list(splits("a")), 2: list(splits("b"))})

    assert h.gateway.sent == []
    assert h.coordinator.tracker.assignments_since(None) == {}
    assert h.coordinator.context.metrics.counter("splits_assigned").count == 0


def test_assign_splits_to_a_reader_outside_the_parallelism_raises(h: Harness) -> None:
    with pytest.raises(ContractViolation, match="reader 7 is not registered"):
        h.coordinator.context.assign_splits({7: list(splits("a"))})


def test_assign_splits_to_a_failed_reader_raises(h: Harness) -> None:
    h.run(h.coordinator.reader_failed(0, None))
    with pytest.raises(ContractViolation, match="reader 0 is not registered"):
        h.coordinator.context.assign_splits({0: list(splits("a"))})


@pytest.mark.parametrize(
    "assignment",
    [
        {0: [Split("a"), Split("a")]},
        {0: [Split("a")], 1: [Split("a")]},
        {0: [Split("a", 0)], 1: [Split("a", 9)]},  # same id, other position: still the same split
    ],
    ids=["same-reader", "two-readers", "other-position"],
)
def test_assigning_a_split_twice_in_one_call_raises_and_sends_nothing(
    h: Harness, assignment: dict[int, list[Split]]
) -> None:
    with pytest.raises(ContractViolation, match="split a assigned twice in one call"):
        h.coordinator.context.assign_splits(assignment)
    assert h.gateway.sent == []
    assert h.coordinator.tracker.assignments_since(None) == {}


# -- signal_no_more_splits ----------------------------------------------------------------


def test_signal_no_more_splits_is_sent_once_however_often_it_is_called(h: Harness) -> None:
    # FLINK-40586: re-sending no-more-splits to a finished reader failed the job.
    ctx = h.coordinator.context
    ctx.signal_no_more_splits(0)
    ctx.signal_no_more_splits(0)
    ctx.signal_no_more_splits(0)

    assert h.gateway.sent == [(0, NoMoreSplits())]


def test_assign_after_no_more_splits_raises(h: Harness) -> None:
    ctx = h.coordinator.context
    ctx.signal_no_more_splits(0)

    with pytest.raises(ContractViolation, match="reader 0 was already told there are no more"):
        ctx.assign_splits({0: list(splits("a"))})
    assert h.gateway.sent == [(0, NoMoreSplits())]


def test_assign_to_another_reader_after_no_more_splits_to_one_is_allowed(h: Harness) -> None:
    ctx = h.coordinator.context
    ctx.signal_no_more_splits(0)
    ctx.assign_splits({1: list(splits("a"))})
    assert h.gateway.added_ids(1) == ["a"]


def test_no_more_splits_is_sent_again_once_a_failed_reader_registered_again(h: Harness) -> None:
    ctx = h.coordinator.context
    ctx.signal_no_more_splits(0)
    h.run(h.coordinator.reader_failed(0, None))
    h.run(h.coordinator.register_reader(0))

    ctx.assign_splits({0: list(splits("a"))})  # allowed again for the new attempt
    ctx.signal_no_more_splits(0)
    ctx.signal_no_more_splits(0)

    assert h.gateway.messages(0) == [NoMoreSplits(), AddSplits((Split("a"),)), NoMoreSplits()]


def test_signal_no_more_splits_to_an_unregistered_reader_raises(h: Harness) -> None:
    with pytest.raises(ContractViolation, match="reader 2 is not registered"):
        h.coordinator.context.signal_no_more_splits(2)
    assert h.gateway.sent == []


# -- events -------------------------------------------------------------------------------


def test_send_event_to_source_reader_delivers_it_wrapped(h: Harness) -> None:
    h.coordinator.context.send_event_to_source_reader(1, Hello("there"))
    assert h.gateway.sent == [(1, ReaderEvent(Hello("there")))]


def test_send_event_to_an_unregistered_reader_raises(h: Harness) -> None:
    with pytest.raises(ContractViolation, match="reader 2 is not registered"):
        h.coordinator.context.send_event_to_source_reader(2, Hello())
    assert h.gateway.sent == []


# -- backlog and metrics ------------------------------------------------------------------


def test_processing_backlog_flag_follows_the_last_call(h: Harness) -> None:
    ctx = h.coordinator.context
    assert ctx.is_processing_backlog is False
    ctx.set_is_processing_backlog(True)
    assert ctx.is_processing_backlog is True
    ctx.set_is_processing_backlog(True)
    assert ctx.is_processing_backlog is True
    ctx.set_is_processing_backlog(False)
    assert ctx.is_processing_backlog is False


def test_splits_assigned_counter_counts_every_assigned_split(h: Harness) -> None:
    ctx = h.coordinator.context
    ctx.assign_splits({0: list(splits("a", "b")), 1: list(splits("c"))})
    ctx.assign_splits({1: list(splits("d"))})

    assert ctx.metrics.counter("splits_assigned").count == 4
    assert ctx.metrics.snapshot()["splits_assigned"] == 4


def test_metrics_accept_gauges_read_at_snapshot(h: Harness) -> None:
    ctx = h.coordinator.context
    pending = [3]
    ctx.metrics.gauge("pending_splits", lambda: pending[0])
    pending[0] = 5
    assert ctx.metrics.snapshot() == {"pending_splits": 5}
