"""AssigningSplitEnumerator driven through a SourceCoordinator on a ManualScheduler.

The enumerator discovers splits from a :class:`Catalog` the test edits; discovery runs on
the scheduler's virtual clock, and a recording gateway shows what each reader was sent.
(The FLIP-537 loss scenarios live in their own tests.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from tests.coordinator.helpers import (
    FakeSource,
    Harness,
    ReassigningFakeSource,
    Split,
    make_harness,
)

from splitflow.api.assigner import AssignerState, AssignerStateCodec, AssigningSplitEnumerator
from splitflow.api.enumerator import SplitExtent
from splitflow.api.events import (
    BacklogFinishedEvent,
    BacklogStartedEvent,
    SplitsFinishedEvent,
    SplitsRemovedEvent,
)
from splitflow.api.split import DataclassCodec
from splitflow.coordinator import AddSplits, NoMoreSplits, ReaderEvent
from splitflow.errors import (
    ConfigurationError,
    ConnectorError,
    ContractViolation,
    DataLossError,
    SourceFailedError,
    SplitOwnershipError,
)


class Catalog:
    """The external system: the splits that exist now. ``error`` makes discovery fail."""

    def __init__(self, *splits: Split) -> None:
        self.splits = {s.split_id: s for s in splits}
        self.discoveries = 0
        self.error: Exception | None = None

    def add(self, *splits: Split) -> None:
        self.splits.update((s.split_id, s) for s in splits)

    def remove(self, *split_ids: str) -> None:
        for sid in split_ids:
            del self.splits[sid]


class CatalogEnumerator(AssigningSplitEnumerator[Split]):
    def __init__(self, context: Any, catalog: Catalog, **options: Any) -> None:
        super().__init__(context, **options)
        self.catalog = catalog

    def discover_splits(self) -> Sequence[Split]:
        self.catalog.discoveries += 1
        if self.catalog.error is not None:
            raise self.catalog.error
        return list(self.catalog.splits.values())


def make(
    catalog: Catalog,
    parallelism: int = 2,
    *,
    interval: float | None = None,
    state: AssignerState[Split] | None = None,
    source_type: type[FakeSource] = ReassigningFakeSource,
    start: bool = True,
) -> Harness:
    source = source_type(
        lambda ctx, restored: CatalogEnumerator(
            ctx, catalog, discovery_interval=interval, state=restored
        )
    )
    return make_harness(source, parallelism, restored_state=state, start=start)


def register(h: Harness, *readers: int) -> None:
    for reader in readers:
        h.run(h.coordinator.register_reader(reader, f"host-{reader}"))


def snapshot(h: Harness, checkpoint_id: int = 1) -> AssignerState[Split]:
    """The enumerator's snapshot, taken on the coordinator thread even while readers are
    missing (a coordinator checkpoint would be declined then)."""
    return h.run(h.coordinator.run(lambda e: e.snapshot_state(checkpoint_id)))


def added(h: Harness) -> dict[int, list[str]]:
    return {r: h.gateway.added_ids(r) for r in range(h.coordinator.parallelism)}


def S(sid: str, position: int = 0) -> Split:
    return Split(sid, position)


# -- waiting for readers ------------------------------------------------------------------


def test_splits_are_assigned_only_once_every_reader_registered() -> None:
    h = make(Catalog(S("a"), S("b"), S("c"), S("d"), S("e")), parallelism=3)
    register(h, 0, 1)
    assert h.gateway.sent == []
    assert h.enumerator.owners() == {}

    register(h, 2)

    assert added(h) == {0: ["a", "d"], 1: ["b", "e"], 2: ["c"]}
    assert h.enumerator.owners() == {"a": 0, "b": 1, "c": 2, "d": 0, "e": 1}
    assert h.enumerator.unassigned_splits() == []


def test_each_reader_gets_its_splits_in_one_message() -> None:
    h = make(Catalog(S("a"), S("b"), S("c")), parallelism=2, interval=10.0)
    register(h, 0, 1)
    assert h.gateway.sent == [
        (0, AddSplits((S("a"), S("c")))),
        (1, AddSplits((S("b"),))),
    ]


def test_discovery_that_completes_after_registration_assigns_at_once() -> None:
    catalog = Catalog(S("a"), S("b"))
    h = make(catalog, parallelism=2, start=False)
    c = h.coordinator
    futures = [c.start(), c.register_reader(0), c.register_reader(1)]  # all before discovery

    h.scheduler.run_until_idle()

    assert all(f.done() and f.exception() is None for f in futures)
    assert catalog.discoveries == 1
    assert added(h) == {0: ["a"], 1: ["b"]}


def test_new_splits_wait_while_a_failed_reader_has_not_registered_again() -> None:
    catalog = Catalog(S("a"), S("b"))
    h = make(catalog, parallelism=2, interval=10.0)
    register(h, 0, 1)  # a -> 0, b -> 1
    h.run(h.coordinator.checkpoint(1))
    h.run(h.coordinator.release_held_messages())
    h.run(h.coordinator.notify_checkpoint_complete(1))
    h.run(h.coordinator.reader_failed(1, 1))  # "b" was checkpointed: nothing given back
    h.gateway.clear()
    catalog.add(S("c"))

    h.scheduler.advance(10.0)
    assert h.gateway.sent == []
    assert h.enumerator.unassigned_splits() == [S("c")]

    # Reader 1 restored "b" (at 4) from checkpoint 1 and reports it (FLIP-537).
    h.run(h.coordinator.register_reader(1, reported_splits=[S("b", 4)]))

    assert h.gateway.sent == [(0, AddSplits((S("c"),))), (1, AddSplits((S("b", 4),)))]
    assert h.enumerator.owners() == {"a": 0, "b": 1, "c": 0}


# -- periodic and one-off discovery -------------------------------------------------------


def test_periodic_discovery_assigns_new_splits_on_the_next_tick() -> None:
    catalog = Catalog(S("a"))
    h = make(catalog, parallelism=2, interval=10.0)
    register(h, 0, 1)
    assert added(h) == {0: ["a"], 1: []}

    h.scheduler.advance(3.0)
    catalog.add(S("b"))
    h.scheduler.advance(6.9)  # t = 9.9
    assert added(h) == {0: ["a"], 1: []}

    h.scheduler.advance(0.1)  # t = 10: second discovery
    assert added(h) == {0: ["a"], 1: ["b"]}

    catalog.add(S("c"))
    h.scheduler.advance(10.0)  # t = 20: tie between the readers goes to the lowest id
    assert added(h) == {0: ["a", "c"], 1: ["b"]}
    assert catalog.discoveries == 3


def test_periodic_discovery_does_not_assign_a_known_split_again() -> None:
    catalog = Catalog(S("a"), S("b"))
    h = make(catalog, parallelism=2, interval=1.0)
    register(h, 0, 1)

    h.scheduler.advance(5.0)

    assert catalog.discoveries == 6
    assert added(h) == {0: ["a"], 1: ["b"]}


class ListingEnumerator(CatalogEnumerator):
    """Returns the catalog's ``listing`` object itself, as the test left it."""

    def discover_splits(self) -> Sequence[Split]:
        self.catalog.discoveries += 1
        return self.catalog.listing  # type: ignore[no-any-return]


def make_listing(catalog: Catalog) -> Harness:
    source = ReassigningFakeSource(
        lambda ctx, restored: ListingEnumerator(ctx, catalog, discovery_interval=1.0)
    )
    return make_harness(source, 2)


def test_a_listing_returned_again_as_the_same_list_grown_in_place_is_read_anew() -> None:
    catalog = Catalog()
    catalog.listing = [S("a")]  # type: ignore[attr-defined]
    h = make_listing(catalog)
    register(h, 0, 1)
    catalog.listing.append(S("b"))  # type: ignore[attr-defined]

    h.scheduler.advance(1.0)

    assert added(h) == {0: ["a"], 1: ["b"]}


def test_the_same_tuple_returned_again_finds_what_changed_on_the_enumerators_side() -> None:
    """The listing did not change, its index is reused; splits finished or removed since
    are still compared with it."""
    catalog = Catalog()
    catalog.listing = (S("a"), S("b"), S("c"))  # type: ignore[attr-defined]
    h = make_listing(catalog)
    register(h, 0, 1)  # a, c -> 0; b -> 1
    h.run(h.coordinator.handle_source_event(0, SplitsFinishedEvent(("a",))))
    h.scheduler.advance(1.0)
    assert added(h) == {0: ["a", "c"], 1: ["b"]}  # a finished: not assigned again

    catalog.listing = catalog.listing[1:]  # type: ignore[attr-defined]
    h.scheduler.advance(1.0)
    assert added(h) == {0: ["a", "c"], 1: ["b"]}
    catalog.listing = catalog.listing[1:]  # type: ignore[attr-defined]  # b vanished
    h.scheduler.advance(1.0)
    assert h.gateway.events(1) == [SplitsRemovedEvent(("b",))]
    assert h.enumerator.owners() == {"c": 0}


class KeepingEnumerator(ListingEnumerator):
    """Keeps splits that vanished from the listing, and notes each time it is told."""

    def __init__(self, context: Any, catalog: Catalog, **options: Any) -> None:
        super().__init__(context, catalog, **options)
        self.told: list[list[str]] = []

    def on_splits_vanished(self, split_ids: Sequence[str]) -> None:
        self.told.append(list(split_ids))


@pytest.mark.parametrize("how", ["add_splits", "a reader's report"])
def test_the_same_tuple_again_finds_a_split_known_since_from_elsewhere_vanished(how: str) -> None:
    """The assigner skips comparing a tuple it compared before only while the splits it
    knows are those it knew then: one it learnt of from elsewhere since is compared."""
    catalog = Catalog()
    catalog.listing = (S("a"), S("b"))  # type: ignore[attr-defined]
    h = make_listing(catalog)
    if how == "add_splits":
        register(h, 0, 1)
        h.scheduler.advance(1.0)  # compared once: known = listed
        h.run(h.coordinator.run(lambda e: e.add_splits([S("x")])))
    else:
        h.run(h.coordinator.register_reader(0, "host-0"))
        h.scheduler.advance(1.0)  # compared once, waiting for reader 1
        h.run(h.coordinator.register_reader(1, "host-1", [S("x", 5)]))  # unknown: kept
    assert "x" in h.enumerator.owners()

    h.scheduler.advance(1.0)

    owner = {"add_splits": 0, "a reader's report": 1}[how]
    assert SplitsRemovedEvent(("x",)) in h.gateway.events(owner)
    assert sorted(h.enumerator.owners()) == ["a", "b"]


def test_the_same_tuple_again_finds_a_split_removed_since_but_still_listed() -> None:
    catalog = Catalog()
    catalog.listing = (S("a"), S("b"))  # type: ignore[attr-defined]
    h = make_listing(catalog)
    register(h, 0, 1)
    h.scheduler.advance(1.0)
    h.run(h.coordinator.run(lambda e: e.remove_splits(["b"])))
    assert sorted(h.enumerator.owners()) == ["a"]

    h.scheduler.advance(1.0)

    assert sorted(h.enumerator.owners()) == ["a", "b"]  # listed: found again, as before
    assert added(h) == {0: ["a"], 1: ["b", "b"]}


def test_splits_an_enumerator_keeps_after_they_vanished_are_reported_at_every_discovery() -> None:
    catalog = Catalog()
    catalog.listing = (S("a"), S("b"))  # type: ignore[attr-defined]
    source = ReassigningFakeSource(
        lambda ctx, restored: KeepingEnumerator(ctx, catalog, discovery_interval=1.0)
    )
    h = make_harness(source, 2)
    register(h, 0, 1)
    catalog.listing = (S("a"),)  # type: ignore[attr-defined]

    h.scheduler.advance(3.0)

    assert h.enumerator.told == [["b"], ["b"], ["b"]]


def test_one_off_discovery_runs_once() -> None:
    catalog = Catalog(S("a"))
    h = make(catalog, parallelism=1)
    register(h, 0)
    catalog.add(S("late"))

    h.scheduler.advance(1000.0)

    assert catalog.discoveries == 1
    assert added(h) == {0: ["a"]}


def test_failed_discovery_fails_the_source_with_a_connector_error() -> None:
    catalog = Catalog(S("a"))
    catalog.error = OSError("broker unreachable")
    h = make(catalog, parallelism=1)

    exc = h.fail(h.coordinator.register_reader(0))

    assert isinstance(exc, SourceFailedError)
    assert isinstance(exc.__cause__, ConnectorError)
    assert exc.__cause__.__cause__ is catalog.error
    assert "broker unreachable" in str(exc.__cause__)


def test_a_periodic_discovery_that_fails_after_the_first_is_tried_again_at_the_next_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    catalog = Catalog(S("a"))
    h = make(catalog, parallelism=1, interval=10.0)
    register(h, 0)
    catalog.add(S("b"))
    catalog.error = OSError("connection reset")

    h.scheduler.advance(20.0)  # two failures in a row: the source runs on

    assert [r.getMessage() for r in caplog.records] == [
        "CatalogEnumerator: split discovery failed (1 of 3 in a row; the next interval tries "
        "again): connection reset",
        "CatalogEnumerator: split discovery failed (2 of 3 in a row; the next interval tries "
        "again): connection reset",
    ]
    assert added(h) == {0: ["a"]}
    catalog.error = None
    h.scheduler.advance(10.0)
    assert added(h) == {0: ["a", "b"]}

    catalog.error = OSError("connection reset")
    h.scheduler.advance(20.0)  # the count starts again after a discovery that completed
    catalog.error = None
    h.scheduler.advance(10.0)
    assert catalog.discoveries == 7
    assert h.failures == []
    assert h.enumerator.owners() == {"a": 0, "b": 0}


def test_the_third_failed_discovery_in_a_row_fails_the_source() -> None:
    catalog = Catalog(S("a"))
    h = make(catalog, parallelism=1, interval=10.0)
    register(h, 0)
    catalog.error = OSError("connection refused")

    h.scheduler.advance(20.0)
    assert h.failures == []
    h.scheduler.advance(10.0)

    [failure] = h.failures
    assert isinstance(failure, ConnectorError)
    assert "connection refused" in str(failure)


@pytest.mark.parametrize(
    "error",
    [
        ConfigurationError("option pattern: no table matches"),
        DataLossError("the directory vanished", split_id="dir"),
    ],
    ids=["configuration", "data-loss"],
)
def test_a_discovery_that_says_the_input_is_wrong_fails_the_source_at_once(
    error: Exception,
) -> None:
    catalog = Catalog(S("a"))
    h = make(catalog, parallelism=1, interval=10.0)
    register(h, 0)
    catalog.error = error

    h.scheduler.advance(10.0)

    assert catalog.discoveries == 2
    [failure] = h.failures
    assert failure.__cause__ is error


# -- vanished splits ----------------------------------------------------------------------


def test_vanished_split_is_removed_and_its_owner_told() -> None:
    catalog = Catalog(S("a"), S("b"), S("c"))
    h = make(catalog, parallelism=2, interval=10.0)
    register(h, 0, 1)  # a, c -> 0; b -> 1
    catalog.remove("a", "c")

    h.scheduler.advance(10.0)

    assert h.gateway.events(0) == [SplitsRemovedEvent(("a", "c"))]
    assert h.gateway.events(1) == []
    assert h.enumerator.owners() == {"b": 1}
    assert snapshot(h).assigned == {"b": 1}


def test_vanished_unassigned_split_is_dropped_without_telling_anyone() -> None:
    catalog = Catalog(S("a"), S("b"))
    h = make(catalog, parallelism=2, interval=10.0)
    register(h, 0)
    catalog.remove("b")

    h.scheduler.advance(10.0)
    assert h.gateway.sent == []
    assert h.enumerator.unassigned_splits() == [S("a")]

    register(h, 1)
    assert added(h) == {0: ["a"], 1: []}


def test_vanished_split_reappearing_later_is_a_new_split() -> None:
    catalog = Catalog(S("a"))
    h = make(catalog, parallelism=1, interval=10.0)
    register(h, 0)
    catalog.remove("a")
    h.scheduler.advance(10.0)
    catalog.add(S("a", 0))

    h.scheduler.advance(10.0)

    assert h.gateway.messages(0) == [
        AddSplits((S("a"),)),
        ReaderEvent(SplitsRemovedEvent(("a",))),
        AddSplits((S("a"),)),
    ]


def test_split_removed_upstream_is_not_brought_back_by_its_owners_failure() -> None:
    catalog = Catalog(S("a"), S("b"))
    h = make(catalog, parallelism=1, interval=10.0)
    register(h, 0)
    catalog.remove("a")
    h.scheduler.advance(10.0)  # "a" removed, reader 0 told
    h.gateway.clear()

    h.run(h.coordinator.reader_failed(0, None))  # "a" and "b" were never checkpointed
    register(h, 0)

    assert h.gateway.added_ids(0) == ["b"]


# -- bounded, one-off discovery: no more splits -------------------------------------------


def test_one_off_discovery_signals_no_more_splits_once_to_each_reader_after_its_splits() -> None:
    h = make(Catalog(S("a"), S("b"), S("c")), parallelism=2)
    register(h, 0, 1)
    h.run(h.coordinator.handle_source_event(0, SplitsFinishedEvent(("a",))))
    h.scheduler.advance(100.0)

    assert h.gateway.messages(0) == [AddSplits((S("a"), S("c"))), NoMoreSplits()]
    assert h.gateway.messages(1) == [AddSplits((S("b"),)), NoMoreSplits()]


def test_no_more_splits_is_not_signalled_before_every_reader_registered() -> None:
    h = make(Catalog(), parallelism=2)
    register(h, 0)
    assert h.gateway.sent == []

    register(h, 1)
    assert h.gateway.sent == [(0, NoMoreSplits()), (1, NoMoreSplits())]


def test_no_more_splits_is_signalled_again_once_per_registration_after_a_failover() -> None:
    h = make(Catalog(S("a"), S("b")), parallelism=2)
    register(h, 0, 1)

    h.run(h.coordinator.reader_failed(1, None))  # "b" was never checkpointed: given back
    register(h, 1)

    assert h.gateway.messages(1) == [
        AddSplits((S("b"),)),
        NoMoreSplits(),
        AddSplits((S("b"),)),
        NoMoreSplits(),
    ]
    assert h.gateway.no_more_splits_count(0) == 1
    assert h.coordinator.failure is None


def test_periodic_discovery_never_signals_no_more_splits() -> None:
    h = make(Catalog(S("a")), parallelism=1, interval=5.0)
    register(h, 0)
    h.scheduler.advance(50.0)
    assert h.gateway.no_more_splits_count(0) == 0


# -- finished splits ----------------------------------------------------------------------


def test_finished_split_is_released_and_never_assigned_again() -> None:
    catalog = Catalog(S("a"), S("b"))
    h = make(catalog, parallelism=2, interval=10.0)
    register(h, 0, 1)

    h.run(h.coordinator.handle_source_event(0, SplitsFinishedEvent(("a",))))
    h.scheduler.advance(30.0)  # "a" is still discovered three more times

    assert h.enumerator.finished_splits() == frozenset({"a"})
    assert h.enumerator.owners() == {"b": 1}
    assert added(h) == {0: ["a"], 1: ["b"]}
    state = snapshot(h)
    assert state.finished == frozenset({"a"})
    assert state.assigned == {"b": 1}
    assert state.unassigned == ()


def test_finished_split_is_not_given_to_another_reader_after_its_owner_fails() -> None:
    h = make(Catalog(S("a"), S("b")), parallelism=2, interval=10.0)
    register(h, 0, 1)
    h.run(h.coordinator.checkpoint(1))
    h.run(h.coordinator.release_held_messages())
    h.run(h.coordinator.notify_checkpoint_complete(1))
    h.run(h.coordinator.handle_source_event(0, SplitsFinishedEvent(("a",))))

    h.run(h.coordinator.reader_failed(1, 1))
    h.run(h.coordinator.register_reader(1, reported_splits=[S("b", 3)]))
    h.scheduler.advance(10.0)

    assert h.gateway.added_ids(1) == ["b", "b"]
    assert h.enumerator.owners() == {"b": 1}
    assert h.enumerator.finished_splits() == frozenset({"a"})
    assert h.coordinator.failure is None


def test_finished_split_that_vanishes_is_not_reported_as_removed() -> None:
    catalog = Catalog(S("a"))
    h = make(catalog, parallelism=1, interval=10.0)
    register(h, 0)
    h.run(h.coordinator.handle_source_event(0, SplitsFinishedEvent(("a",))))
    catalog.remove("a")

    h.scheduler.advance(10.0)

    assert h.gateway.events(0) == []


def test_finish_reported_by_a_reader_that_does_not_own_the_split_is_ignored() -> None:
    h = make(Catalog(S("a"), S("b")), parallelism=2, interval=10.0)
    register(h, 0, 1)

    h.run(h.coordinator.handle_source_event(1, SplitsFinishedEvent(("a",))))

    assert h.enumerator.finished_splits() == frozenset()
    assert h.enumerator.owners() == {"a": 0, "b": 1}


# -- snapshots ----------------------------------------------------------------------------


def test_snapshot_before_the_first_discovery_is_empty_and_not_discovered() -> None:
    h = make(Catalog(S("a")), parallelism=1, start=False)
    started = h.coordinator.start()
    state = h.coordinator.run(lambda e: e.snapshot_state(1))  # queued before discovery runs

    h.scheduler.run_until_idle()

    assert started.exception() is None
    assert state.result() == AssignerState()


def test_snapshot_holds_unassigned_splits_with_their_positions() -> None:
    h = make(Catalog(S("a", 5), S("b", 9), S("c")), parallelism=2)
    register(h, 0)

    state = snapshot(h)

    assert state.unassigned == (S("a", 5), S("b", 9), S("c", 0))
    assert state.assigned == {}
    assert state.discovered is True


def test_snapshot_holds_only_the_ids_and_owners_of_assigned_splits() -> None:
    h = make(Catalog(S("a", 5), S("b", 9), S("c")), parallelism=2)
    register(h, 0, 1)

    state = h.run(h.coordinator.checkpoint(2))

    assert state == AssignerState(
        unassigned=(),
        assigned={"a": 0, "b": 1, "c": 0},
        finished=frozenset(),
        discovered=True,
    )


def test_snapshot_holds_given_back_splits_as_unassigned_with_their_positions() -> None:
    h = make(Catalog(S("a", 5), S("b", 9)), parallelism=2)
    register(h, 0, 1)

    h.run(h.coordinator.reader_failed(1, None))
    state = snapshot(h)

    assert state.unassigned == (S("b", 9),)
    assert state.assigned == {"a": 0}


def test_snapshot_holds_reported_splits_with_the_positions_readers_reported() -> None:
    h = make(Catalog(S("a")), parallelism=2)

    # Reader 1 restarted from a checkpoint holding "z" at 77 and reports it; reader 0 has
    # not registered yet, so nothing is assigned and the enumerator owns "z".
    h.run(h.coordinator.register_reader(1, reported_splits=[S("z", 77)]))
    state = snapshot(h)

    assert state.unassigned == (S("a"), S("z", 77))
    assert state.assigned == {}


# -- restore ------------------------------------------------------------------------------


def test_restored_unassigned_splits_keep_their_positions_when_discovered_again() -> None:
    catalog = Catalog(S("a", 0), S("b", 0))
    restored = AssignerState(unassigned=(S("a", 40),), discovered=True)
    h = make(catalog, parallelism=1, state=restored)

    register(h, 0)

    assert h.gateway.messages(0) == [AddSplits((S("a", 40), S("b", 0))), NoMoreSplits()]


def test_restored_finished_splits_are_never_assigned() -> None:
    restored = AssignerState(finished=frozenset({"a"}), discovered=True)
    h = make(Catalog(S("a"), S("b")), parallelism=1, state=restored)

    register(h, 0)

    assert added(h) == {0: ["b"]}


def test_a_restored_split_that_vanished_before_its_reader_reported_it_is_dropped() -> None:
    restored = AssignerState(assigned={"a": 0, "b": 0}, discovered=True)
    h = make(Catalog(S("a")), parallelism=1, interval=10.0, state=restored)

    h.scheduler.advance(10.0)

    assert h.enumerator.awaiting_report() == {"a": 0}
    assert snapshot(h).assigned == {"a": 0}


def test_restoring_reader_ownership_needs_the_mixin() -> None:
    restored = AssignerState(assigned={"a": 0}, discovered=True)
    h = make(Catalog(S("a")), parallelism=1, state=restored, source_type=FakeSource, start=False)

    exc = h.fail(h.coordinator.start())

    assert isinstance(exc.__cause__, ContractViolation)
    assert "SupportsSplitReassignmentOnRecovery" in str(exc.__cause__)


def test_assigning_enumerator_for_a_source_without_the_mixin_is_refused_at_start() -> None:
    h = make(Catalog(S("a")), parallelism=1, source_type=FakeSource, start=False)

    exc = h.fail(h.coordinator.start())

    assert isinstance(exc.__cause__, ContractViolation)


# -- backlog boundaries (FLIP-309, the Fluss design) ----------------------------------------------


class LatestEnumerator(CatalogEnumerator):
    """Knows each split's latest position (``latest``: split id -> position)."""

    def __init__(self, context: Any, catalog: Catalog, latest: dict[str, int], **kw: Any) -> None:
        super().__init__(context, catalog, **kw)
        self.latest = latest

    def latest_positions(self, splits: Sequence[Split]) -> dict[str, SplitExtent]:
        return {s.split_id: SplitExtent(self.latest[s.split_id]) for s in splits}


def make_latest(
    catalog: Catalog, latest: dict[str, int], state: AssignerState[Split] | None = None
) -> Harness:
    source = ReassigningFakeSource(
        lambda ctx, restored: LatestEnumerator(
            ctx, catalog, latest, discovery_interval=10.0, state=restored
        )
    )
    return make_harness(source, 2, restored_state=state)


def in_backlog(h: Harness) -> bool:
    return bool(h.coordinator.context.is_processing_backlog)


def test_a_split_seen_first_gets_its_latest_position_as_backlog_boundary() -> None:
    latest = {"a": 100, "b": 5, "caught-up": 7}
    h = make_latest(Catalog(S("a"), S("b", 5), S("caught-up", 7)), latest)
    register(h, 0, 1)
    assert h.enumerator.backlog_boundaries() == {"a": 100}  # nothing to catch up elsewhere
    assert in_backlog(h)
    latest["a"] = 150  # a known split's boundary does not move
    latest["new"] = 30
    h.enumerator.catalog.add(S("new"))
    h.scheduler.advance(10.0)
    assert h.enumerator.backlog_boundaries() == {"a": 100, "new": 30}


def test_backlog_ends_when_the_last_split_reports_its_boundary() -> None:
    h = make_latest(Catalog(S("a"), S("b")), {"a": 10, "b": 20})
    register(h, 0, 1)
    owner = h.enumerator.owners()
    h.run(h.coordinator.handle_source_event(owner["a"], BacklogFinishedEvent(("a",))))
    assert in_backlog(h)
    h.run(h.coordinator.handle_source_event(owner["b"], BacklogFinishedEvent(("b",))))
    assert not in_backlog(h)
    assert h.enumerator.backlog_boundaries() == {}


def test_finished_removed_and_unknown_splits_leave_no_boundary() -> None:
    catalog = Catalog(S("a"), S("b"), S("c"))
    h = make_latest(catalog, {"a": 10, "b": 20, "c": 30})
    register(h, 0, 1)
    owner = h.enumerator.owners()
    h.run(h.coordinator.handle_source_event(owner["a"], SplitsFinishedEvent(("a",))))
    catalog.remove("b")
    h.scheduler.advance(10.0)
    assert h.enumerator.backlog_boundaries() == {"c": 30}
    started = BacklogStartedEvent.of({"c": 90, "a": 50, "ghost": 1})  # a finished, ghost unknown
    h.run(h.coordinator.handle_source_event(owner["c"], started))
    assert h.enumerator.backlog_boundaries() == {"c": 90}


def test_boundaries_and_the_held_flag_survive_a_snapshot_and_restore() -> None:
    h = make_latest(Catalog(S("a"), S("b")), {"a": 10, "b": 20})
    register(h, 0, 1)
    h.run(h.coordinator.run(lambda e: e.hold_backlog(True)))
    owner = h.enumerator.owners()
    h.run(h.coordinator.handle_source_event(owner["a"], BacklogFinishedEvent(("a",))))
    state = snapshot(h)
    assert state.backlog == {"b": 20}
    assert state.backlog_held

    codec = AssignerStateCodec(DataclassCodec(Split))
    decoded = codec.decode(codec.encode(state), codec.version)
    assert decoded == state
    restored = make_latest(Catalog(S("a"), S("b")), {"a": 99, "b": 99}, state=decoded)
    assert restored.enumerator.backlog_boundaries() == {"b": 20}
    assert in_backlog(restored)


def test_a_state_encoded_before_backlog_tracking_decodes_without_boundaries() -> None:
    codec = AssignerStateCodec(DataclassCodec(Split))
    old = {
        "split_codec": 1,
        "unassigned": {},
        "assigned": {"a": 0},
        "finished": [],
        "discovered": True,
    }
    state = codec.decode(old, 1)
    assert state.backlog == {}
    assert not state.backlog_held


def test_snapshots_share_what_stayed_the_same_and_hold_every_change() -> None:
    """A snapshot shares the enumerator's copy of its assignments and of its boundaries with
    the snapshot before while they stay the same, encoded as the same objects too (Spark's
    runtime compares each batch's state with the last: unchanged by identity), and holds a
    new copy after any change to them."""
    catalog = Catalog(S("a"), S("b"), S("c"))
    h = make_latest(catalog, {"a": 10, "b": 20, "c": 30, "d": 40})
    register(h, 0, 1)
    codec = AssignerStateCodec(DataclassCodec(Split))
    first, again = snapshot(h), snapshot(h)
    assert again.assigned is first.assigned
    assert again.backlog is first.backlog
    assert codec.encode(again)["assigned"] is codec.encode(first)["assigned"]

    def is_now(state: AssignerState[Split]) -> None:
        assert state.assigned == {**h.enumerator.awaiting_report(), **h.enumerator.owners()}
        assert state.backlog == h.enumerator._backlog  # not the copy it keeps

    owner = h.enumerator.owners()
    changes = [
        lambda: h.coordinator.handle_source_event(owner["a"], BacklogFinishedEvent(("a",))),
        lambda: h.coordinator.handle_source_event(owner["b"], SplitsFinishedEvent(("b",))),
        lambda: h.coordinator.handle_source_event(owner["c"], BacklogStartedEvent.of({"c": 90})),
    ]
    for change in changes:
        before = snapshot(h)
        h.run(change())
        after = snapshot(h)
        is_now(after)
        assert after != before
    catalog.add(S("d"))  # discovered: assigned, with a boundary
    h.scheduler.advance(10.0)
    is_now(snapshot(h))
    assert "d" in snapshot(h).assigned
    catalog.remove("c")  # vanished: unassigned, no boundary
    h.scheduler.advance(10.0)
    is_now(snapshot(h))
    assert "c" not in snapshot(h).assigned
    # a restore: the splits await their readers' reports, then are theirs again
    state = snapshot(h)
    restored = make_latest(catalog, {"a": 10, "d": 40}, state=state)
    waiting = snapshot(restored)
    assert waiting.assigned == restored.enumerator.awaiting_report() == state.assigned
    for reader in (0, 1):
        held = [S(sid) for sid, r in state.assigned.items() if r == reader]
        restored.run(restored.coordinator.register_reader(reader, reported_splits=held))
    assert restored.enumerator.awaiting_report() == {}
    assert snapshot(restored).assigned == restored.enumerator.owners() == state.assigned


@pytest.mark.parametrize("held", ["assigned", "restored"])
def test_adding_a_split_a_reader_holds_fails_naming_it_and_its_reader(held: str) -> None:
    """Two readers would hold it, or one twice: ``add_splits`` refuses, also for a split a
    restore holds for its reader's report; a split that finished may be added again."""
    restored = AssignerState(assigned={"a": 1}, discovered=True) if held == "restored" else None
    h = make(Catalog(S("a"), S("b")), parallelism=2, state=restored)
    if held == "assigned":
        register(h, 0, 1)
    owner = 1 if held == "restored" else next(r for r, ids in added(h).items() if "a" in ids)

    failed = h.fail(h.coordinator.run(lambda e: e.add_splits([S("a", 5)])))

    cause = failed.__cause__
    assert isinstance(cause, SplitOwnershipError)
    assert f"added 1 split(s) that a reader holds: a (reader {owner})" in str(cause)
    assert cause.split_ids == ("a",)
