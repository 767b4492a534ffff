"""SourceCoordinator, mirroring Flink's SourceCoordinatorTest.

Most tests run the coordinator on a ManualScheduler (deterministic, virtual clock); the
threading tests at the end use the real ThreadedScheduler.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import pytest
from tests.coordinator.helpers import (
    FakeSource,
    Harness,
    ReassigningFakeSource,
    RecordingEnumerator,
    RecordingGateway,
    Split,
    ids,
    make_harness,
    splits,
)

from splitflow.api.events import SourceEvent
from splitflow.coordinator import (
    AddSplits,
    NoMoreSplits,
    ReaderEvent,
    SourceCoordinator,
    ThreadedScheduler,
)
from splitflow.errors import (
    CheckpointDeclinedError,
    ConfigurationError,
    ContractViolation,
    SourceFailedError,
)

WAIT = 5.0  # seconds; only reached when a test is about to fail


@dataclass(frozen=True)
class Ping(SourceEvent):
    n: int = 0


class Boom(Exception):
    pass


def scripted(**hooks: Callable[..., Any]) -> FakeSource:
    """A source whose RecordingEnumerator runs ``hooks`` (method name -> callable)."""
    return FakeSource(lambda ctx, state: RecordingEnumerator(ctx, state, hooks=dict(hooks)))


def failing_in(method: str, exc: BaseException) -> FakeSource:
    return FakeSource(lambda ctx, state: RecordingEnumerator(ctx, state, fail_in=method, error=exc))


def assign(h: Harness, assignment: dict[int, list[Split]]) -> None:
    """Assign splits from the coordinator thread, as an enumerator would."""
    h.run(h.coordinator.run(lambda e: h.coordinator.context.assign_splits(assignment)))


def assert_failed_with(exc: BaseException, cause: BaseException | type[BaseException]) -> None:
    assert isinstance(exc, SourceFailedError), f"expected SourceFailedError, got {exc!r}"
    if isinstance(cause, type):
        assert isinstance(exc.__cause__, cause), f"cause is {exc.__cause__!r}"
    else:
        assert exc.__cause__ is cause


# -- construction and start ---------------------------------------------------------------


@pytest.mark.parametrize("parallelism", [0, -1])
def test_parallelism_below_one_is_a_configuration_error(parallelism: int) -> None:
    with pytest.raises(ConfigurationError) as info:
        SourceCoordinator(FakeSource(), parallelism, RecordingGateway())
    assert info.value.option == "parallelism"


def test_enumerator_is_created_and_started_only_when_start_runs_on_the_coordinator() -> None:
    h = make_harness(start=False)
    future = h.coordinator.start()

    assert h.source.created == []
    with pytest.raises(ContractViolation):
        _ = h.coordinator.enumerator

    assert h.run(future) is None
    assert h.source.created == [h.coordinator.enumerator]
    assert h.enumerator.names() == ["start"]
    assert h.enumerator.context is h.coordinator.context


def test_start_with_restored_state_restores_the_enumerator_from_it() -> None:
    h = make_harness(restored_state={"checkpoint": 7})

    assert h.source.restored_from == [{"checkpoint": 7}]
    assert h.enumerator.restored == {"checkpoint": 7}
    assert h.enumerator.names() == ["start"]


def test_calls_before_start_fail_the_source_with_a_contract_violation() -> None:
    h = make_harness(start=False)
    exc = h.fail(h.coordinator.register_reader(0))
    assert_failed_with(exc, ContractViolation)
    assert "not started" in str(exc.__cause__)


# -- failure ------------------------------------------------------------------------------


def _drive_to(method: str, h: Harness) -> Future[Any]:
    """Make the coordinator call ``method`` of the enumerator; return that call's future."""
    c = h.coordinator
    if method == "start":
        return c.start()
    h.run(c.start())
    if method == "add_reader":
        return c.register_reader(0)
    h.run(c.register_reader(0))
    if method == "handle_source_event":
        return c.handle_source_event(0, Ping())
    if method == "handle_split_request":
        return c.handle_split_request(0, "host")
    if method == "snapshot_state":
        return c.checkpoint(1)
    if method == "notify_checkpoint_complete":
        return c.notify_checkpoint_complete(1)
    if method == "add_splits_back":
        assign(h, {0: [Split("a")]})
        return c.reader_failed(0, None)
    raise AssertionError(method)


ENUMERATOR_METHODS = [
    "start",
    "add_reader",
    "handle_source_event",
    "handle_split_request",
    "snapshot_state",
    "notify_checkpoint_complete",
    "add_splits_back",
]


@pytest.mark.parametrize("method", ENUMERATOR_METHODS)
def test_exception_in_enumerator_fails_the_source_with_it_as_cause(method: str) -> None:
    boom = Boom(f"{method} broke")
    h = make_harness(failing_in(method, boom), parallelism=1, start=False)

    exc = h.fail(_drive_to(method, h))

    assert_failed_with(exc, boom)
    assert h.coordinator.failure is boom
    assert h.failures == [boom]


@pytest.mark.parametrize("method", ENUMERATOR_METHODS)
def test_every_later_call_fails_with_the_original_cause_and_never_reaches_the_enumerator(
    method: str,
) -> None:
    boom = Boom(f"{method} broke")
    h = make_harness(failing_in(method, boom), parallelism=1, start=False)
    h.fail(_drive_to(method, h))
    calls_at_failure = list(h.source.created[0].calls)

    later = [
        h.coordinator.register_reader(0),
        h.coordinator.handle_source_event(0, Ping()),
        h.coordinator.checkpoint(2),
        h.coordinator.notify_checkpoint_complete(2),
        h.coordinator.reader_failed(0, None),
        h.coordinator.run(lambda e: "inspected"),
    ]
    for future in later:
        assert_failed_with(h.fail(future), boom)

    assert h.source.created[0].calls == calls_at_failure
    assert h.failures == [boom]  # on_failure is called once


def test_calls_queued_before_the_failure_also_fail() -> None:
    boom = Boom("add_reader broke")
    h = make_harness(failing_in("add_reader", boom), parallelism=2)
    first = h.coordinator.register_reader(0)
    second = h.coordinator.register_reader(1)  # queued behind the failing call

    assert_failed_with(h.fail(first), boom)
    assert_failed_with(h.fail(second), boom)
    assert h.enumerator.calls == [("start",), ("add_reader", 0)]


def test_base_exception_from_the_enumerator_also_fails_the_source() -> None:
    class Fatal(BaseException):  # like a Java Error in Flink's testErrorThrownFromSplitEnumerator
        pass

    fatal = Fatal("fatal")
    h = make_harness(failing_in("handle_source_event", fatal), parallelism=1)
    h.run(h.coordinator.register_reader(0))

    assert_failed_with(h.fail(h.coordinator.handle_source_event(0, Ping())), fatal)
    assert h.failures == [fatal]


def test_exception_in_a_call_async_handler_fails_the_source() -> None:
    boom = Boom("handler broke")

    def handler(result: object, error: BaseException | None) -> None:
        raise boom

    source = FakeSource(
        lambda ctx, state: RecordingEnumerator(
            ctx, state, hooks={"start": lambda: ctx.call_async(lambda: 1, handler)}
        )
    )
    h = make_harness(source, parallelism=1)
    h.scheduler.run_until_idle()

    assert h.coordinator.failure is boom
    assert h.failures == [boom]
    assert_failed_with(h.fail(h.coordinator.register_reader(0)), boom)


def test_on_failure_runs_before_calls_queued_behind_the_failure_complete() -> None:
    h = make_harness(failing_in("add_reader", Boom("x")), parallelism=2)
    failures_seen_by_second: list[int] = []
    first = h.coordinator.register_reader(0)
    second = h.coordinator.register_reader(1)
    second.add_done_callback(lambda f: failures_seen_by_second.append(len(h.failures)))

    h.scheduler.run_until_idle()

    assert first.done()
    assert failures_seen_by_second == [1]


# -- routing of reader calls --------------------------------------------------------------


def test_registration_reaches_the_enumerator_after_the_reader_is_registered() -> None:
    seen: list[dict[int, Any]] = []
    source = FakeSource(
        lambda ctx, state: RecordingEnumerator(
            ctx, state, hooks={"add_reader": lambda r: seen.append(dict(ctx.registered_readers()))}
        )
    )
    h = make_harness(source, parallelism=2)

    h.run(h.coordinator.register_reader(1, "host-1"))

    assert h.enumerator.calls[-1] == ("add_reader", 1)
    assert list(seen[0]) == [1]
    assert seen[0][1].location == "host-1"


def test_source_event_reaches_the_enumerator_with_its_reader() -> None:
    h = make_harness(parallelism=2)
    h.register_all()

    h.run(h.coordinator.handle_source_event(1, Ping(3)))

    assert h.enumerator.calls[-1] == ("handle_source_event", 1, Ping(3))


def test_split_request_reaches_the_enumerator_with_its_reader_and_host() -> None:
    h = make_harness(parallelism=2)
    h.register_all()

    h.run(h.coordinator.handle_split_request(0, "host-a"))
    h.run(h.coordinator.handle_split_request(1))

    assert h.enumerator.calls[-2:] == [
        ("handle_split_request", 0, "host-a"),
        ("handle_split_request", 1, None),
    ]


def test_run_returns_what_the_function_returns_on_the_coordinator() -> None:
    h = make_harness()
    assert h.run(h.coordinator.run(lambda e: e.names())) == ["start"]


def test_latest_positions_asks_the_enumerator() -> None:
    h = make_harness()
    assert h.run(h.coordinator.latest_positions(list(splits("a")))) == {}


# -- contract violations ------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.handle_source_event(1, Ping()),
        lambda c: c.handle_split_request(1, None),
    ],
    ids=["handle_source_event", "handle_split_request"],
)
def test_messages_from_an_unregistered_reader_are_a_contract_violation(
    call: Callable[[SourceCoordinator[Split, Any]], Future[None]],
) -> None:
    h = make_harness(parallelism=2)
    h.run(h.coordinator.register_reader(0))

    exc = h.fail(call(h.coordinator))

    assert_failed_with(exc, ContractViolation)
    assert "reader 1 is not registered" in str(exc.__cause__)
    assert h.enumerator.names() == ["start", "add_reader"]


@pytest.mark.parametrize("reader_id", [-1, 2, 5])
def test_registering_a_reader_outside_the_parallelism_is_a_contract_violation(
    reader_id: int,
) -> None:
    h = make_harness(parallelism=2)

    exc = h.fail(h.coordinator.register_reader(reader_id))

    assert_failed_with(exc, ContractViolation)
    assert f"reader {reader_id} registered but parallelism is 2" in str(exc.__cause__)
    assert h.enumerator.names() == ["start"]


def test_registering_a_reader_twice_without_failing_is_a_contract_violation() -> None:
    h = make_harness(parallelism=2)
    h.run(h.coordinator.register_reader(0))

    exc = h.fail(h.coordinator.register_reader(0))

    assert_failed_with(exc, ContractViolation)
    assert "registered twice" in str(exc.__cause__)
    assert h.enumerator.names() == ["start", "add_reader"]


def test_reported_splits_from_a_source_without_the_mixin_are_a_contract_violation() -> None:
    h = make_harness(FakeSource(), parallelism=1)

    exc = h.fail(h.coordinator.register_reader(0, reported_splits=splits("a")))

    assert_failed_with(exc, ContractViolation)
    assert "SupportsSplitReassignmentOnRecovery" in str(exc.__cause__)
    assert h.coordinator.context.registered_readers() == {}
    assert h.enumerator.names() == ["start"]


def test_reported_splits_from_a_source_with_the_mixin_are_accepted() -> None:
    h = make_harness(ReassigningFakeSource(), parallelism=1)
    h.run(h.coordinator.register_reader(0, reported_splits=splits("a")))
    assert h.coordinator.failure is None
    assert h.enumerator.calls[-1] == ("add_reader", 0)


# -- checkpoints --------------------------------------------------------------------------


def test_checkpoint_returns_the_enumerator_snapshot_for_that_checkpoint() -> None:
    h = make_harness(scripted(snapshot_state=lambda cid: {"unassigned": ["x"], "id": cid}), 1)
    h.register_all()

    state = h.run(h.coordinator.checkpoint(7))

    assert state == {"unassigned": ["x"], "id": 7}
    assert h.enumerator.calls[-1] == ("snapshot_state", 7)


def test_checkpoint_files_assignments_in_the_tracker_before_the_enumerator_snapshots() -> None:
    h = make_harness(parallelism=2)
    h.register_all()
    filed_at_snapshot: list[dict[int, list[Split]]] = []
    h.enumerator.hooks["snapshot_state"] = lambda cid: filed_at_snapshot.append(
        h.coordinator.tracker.assignments_since(cid)
    )
    assign(h, {0: [Split("a")], 1: [Split("b"), Split("c")]})

    h.run(h.coordinator.checkpoint(5))

    assert filed_at_snapshot == [{}]  # nothing is "after 5" any more: filed under 5
    since_4 = h.coordinator.tracker.assignments_since(4)
    assert {r: ids(ss) for r, ss in since_4.items()} == {0: ["a"], 1: ["b", "c"]}


def test_checkpoint_is_declined_until_every_reader_registered() -> None:
    h = make_harness(parallelism=3)
    h.run(h.coordinator.register_reader(1))

    exc = h.fail(h.coordinator.checkpoint(1))

    assert isinstance(exc, CheckpointDeclinedError)
    assert "readers [0, 2] are not registered" in str(exc)
    assert h.coordinator.failure is None
    assert h.failures == []
    assert "snapshot_state" not in h.enumerator.names()

    h.run(h.coordinator.register_reader(0))
    h.run(h.coordinator.register_reader(2))
    assert h.run(h.coordinator.checkpoint(2)) == {"checkpoint": 2}


def test_checkpoint_is_declined_again_while_a_failed_reader_has_not_registered_again() -> None:
    h = make_harness(parallelism=2)
    h.register_all()
    h.run(h.coordinator.reader_failed(1, None))

    assert isinstance(h.fail(h.coordinator.checkpoint(3)), CheckpointDeclinedError)
    assert h.coordinator.failure is None


def test_declined_checkpoint_does_not_hold_messages() -> None:
    h = make_harness(parallelism=2)
    h.run(h.coordinator.register_reader(0))
    h.fail(h.coordinator.checkpoint(1))

    assign(h, {0: [Split("a")]})

    assert h.gateway.added_ids(0) == ["a"]


def test_messages_before_a_checkpoint_are_delivered_at_once() -> None:
    h = make_harness(parallelism=2)
    h.register_all()
    assign(h, {1: [Split("a")], 0: [Split("b")]})
    assert h.gateway.sent == [(0, AddSplits((Split("b"),))), (1, AddSplits((Split("a"),)))]


def test_messages_sent_after_a_checkpoint_are_held_until_released_in_order() -> None:
    h = make_harness(parallelism=2)
    h.register_all()
    ctx = h.coordinator.context
    h.run(h.coordinator.checkpoint(1))

    def enumerator_work(e: Any) -> None:
        ctx.assign_splits({0: [Split("a")]})
        ctx.signal_no_more_splits(1)
        ctx.send_event_to_source_reader(0, Ping(1))

    h.run(h.coordinator.run(enumerator_work))
    assert h.gateway.sent == []

    h.run(h.coordinator.release_held_messages())

    assert h.gateway.sent == [
        (0, AddSplits((Split("a"),))),
        (1, NoMoreSplits()),
        (0, ReaderEvent(Ping(1))),
    ]


def test_after_release_messages_are_delivered_at_once_again() -> None:
    h = make_harness(parallelism=1)
    h.register_all()
    h.run(h.coordinator.checkpoint(1))
    h.run(h.coordinator.release_held_messages())

    assign(h, {0: [Split("a")]})

    assert h.gateway.added_ids(0) == ["a"]


def test_release_without_a_checkpoint_delivers_nothing_twice() -> None:
    h = make_harness(parallelism=1)
    h.register_all()
    assign(h, {0: [Split("a")]})
    h.run(h.coordinator.release_held_messages())
    assert h.gateway.added_ids(0) == ["a"]


def test_held_messages_of_a_failed_reader_are_dropped_and_its_splits_given_back() -> None:
    h = make_harness(parallelism=2)
    h.register_all()
    h.run(h.coordinator.checkpoint(1))
    assign(h, {0: [Split("a")], 1: [Split("b")]})

    h.run(h.coordinator.reader_failed(1, None))
    h.run(h.coordinator.release_held_messages())

    assert h.gateway.sent == [(0, AddSplits((Split("a"),)))]
    assert h.enumerator.calls[-1] == ("add_splits_back", [Split("b")], 1)


def test_a_second_checkpoint_before_release_keeps_the_messages_held_since_the_first() -> None:
    h = make_harness(parallelism=1)
    h.register_all()
    h.run(h.coordinator.checkpoint(1))
    assign(h, {0: [Split("a")]})
    h.run(h.coordinator.checkpoint(2))
    assign(h, {0: [Split("b")]})

    h.run(h.coordinator.release_held_messages())

    assert h.gateway.added_ids(0) == ["a", "b"]


def test_checkpoint_complete_is_passed_to_the_enumerator_and_drops_tracked_assignments() -> None:
    h = make_harness(parallelism=1)
    h.register_all()
    assign(h, {0: [Split("a")]})
    h.run(h.coordinator.checkpoint(100))
    assign(h, {0: [Split("b")]})
    h.run(h.coordinator.checkpoint(101))

    h.run(h.coordinator.notify_checkpoint_complete(100))

    assert h.enumerator.calls[-1] == ("notify_checkpoint_complete", 100)
    assert {r: ids(ss) for r, ss in h.coordinator.tracker.assignments_since(None).items()} == {
        0: ["b"]
    }


# -- reader failure (partial failover) ----------------------------------------------------


def _three_assignments_over_two_checkpoints(h: Harness) -> None:
    h.register_all()
    assign(h, {0: [Split("a")], 1: [Split("x")]})
    h.run(h.coordinator.checkpoint(100))
    assign(h, {0: [Split("b")]})
    h.run(h.coordinator.checkpoint(101))
    h.run(h.coordinator.release_held_messages())
    assign(h, {0: [Split("c")]})


def test_reader_failure_gives_back_exactly_the_splits_assigned_after_the_restored_checkpoint() -> (
    None
):
    h = make_harness(parallelism=2)
    _three_assignments_over_two_checkpoints(h)

    h.run(h.coordinator.reader_failed(0, 100))

    assert h.enumerator.calls[-1] == ("add_splits_back", [Split("b"), Split("c")], 0)
    assert 0 not in h.coordinator.context.registered_readers()
    assert 1 in h.coordinator.context.registered_readers()
    remaining = h.coordinator.tracker.assignments_since(None)
    assert {r: ids(ss) for r, ss in sorted(remaining.items())} == {0: ["a"], 1: ["x"]}


def test_reader_failure_before_every_checkpoint_gives_back_all_its_splits() -> None:
    h = make_harness(parallelism=2)
    _three_assignments_over_two_checkpoints(h)

    h.run(h.coordinator.reader_failed(0, 99))

    assert h.enumerator.calls[-1] == ("add_splits_back", [Split("a"), Split("b"), Split("c")], 0)


def test_reader_failure_gives_back_nothing_when_everything_was_checkpointed_and_completed() -> None:
    h = make_harness(parallelism=1)
    h.register_all()
    assign(h, {0: [Split("a"), Split("b")]})
    h.run(h.coordinator.checkpoint(100))
    h.run(h.coordinator.notify_checkpoint_complete(100))

    h.run(h.coordinator.reader_failed(0, 100))

    assert "add_splits_back" not in h.enumerator.names()
    assert h.coordinator.tracker.assignments_since(None) == {}
    assert h.coordinator.context.registered_readers() == {}


def test_reader_failure_does_not_give_back_another_readers_splits() -> None:
    h = make_harness(parallelism=2)
    h.register_all()
    assign(h, {0: [Split("a")], 1: [Split("b")]})

    h.run(h.coordinator.reader_failed(1, None))

    assert h.enumerator.calls[-1] == ("add_splits_back", [Split("b")], 1)
    assert {r: ids(ss) for r, ss in h.coordinator.tracker.assignments_since(None).items()} == {
        0: ["a"]
    }


def test_failed_reader_registers_again_with_its_new_location() -> None:
    h = make_harness(parallelism=1)
    h.run(h.coordinator.register_reader(0, "old-host"))
    h.run(h.coordinator.reader_failed(0, None))

    h.run(h.coordinator.register_reader(0, "new-host"))

    assert h.enumerator.names() == ["start", "add_reader", "add_reader"]
    assert h.coordinator.context.registered_readers()[0].location == "new-host"


def test_failure_of_a_reader_that_never_registered_gives_nothing_back() -> None:
    h = make_harness(parallelism=2)
    h.run(h.coordinator.reader_failed(1, None))
    assert h.enumerator.names() == ["start"]
    assert h.coordinator.failure is None


# -- call_async ---------------------------------------------------------------------------


class AsyncProbe:
    """A source whose enumerator calls ``call_async`` in ``start`` with the given options."""

    def __init__(self, callable: Callable[[], Any], **options: Any) -> None:
        self.callable = callable
        self.options = options
        self.handled: list[tuple[Any, BaseException | None, float]] = []
        self.handler_error: BaseException | None = None
        self.pending_timers_in_handler: list[int] = []
        self.after_handle: Callable[[], None] | None = None
        self.handle: Any = None
        self.harness: Harness | None = None
        self.source = FakeSource(self._make)

    def _make(self, ctx: Any, state: Any) -> RecordingEnumerator:
        def start() -> None:
            self.handle = ctx.call_async(self.callable, self._handler, **self.options)

        return RecordingEnumerator(ctx, state, hooks={"start": start})

    def _handler(self, result: Any, error: BaseException | None) -> None:
        assert self.harness is not None
        scheduler = self.harness.scheduler
        self.handled.append((result, error, scheduler.now))
        self.pending_timers_in_handler.append(scheduler.pending_timers)
        if self.after_handle is not None:
            self.after_handle()
        if self.handler_error is not None:
            raise self.handler_error

    def start(self) -> Harness:
        self.harness = make_harness(self.source, parallelism=1, start=False)
        self.harness.run(self.harness.coordinator.start())
        return self.harness


def test_call_async_runs_the_callable_once_and_hands_its_result_to_the_handler() -> None:
    runs: list[int] = []
    probe = AsyncProbe(lambda: runs.append(1) or 42)
    h = probe.start()
    h.scheduler.advance(100)

    assert runs == [1]
    assert probe.handled == [(42, None, 0.0)]
    assert h.scheduler.pending_timers == 0


@pytest.mark.parametrize("period", [0, 0.0, -1.0])
def test_call_async_with_a_period_not_above_zero_fails_the_source_naming_it(
    period: float,
) -> None:
    probe = AsyncProbe(lambda: 1, period=period)
    h = make_harness(probe.source, parallelism=1, start=False)
    probe.harness = h
    error = h.fail(h.coordinator.start())
    assert isinstance(error.__cause__, ContractViolation)
    assert "period must be above 0" in str(error.__cause__)


def test_call_async_hands_the_callables_exception_to_the_handler_without_failing() -> None:
    boom = Boom("cannot list")

    def callable() -> int:
        raise boom

    probe = AsyncProbe(callable)
    h = probe.start()

    assert probe.handled == [(None, boom, 0.0)]
    assert h.coordinator.failure is None


def test_call_async_waits_for_the_initial_delay() -> None:
    runs: list[float] = []
    probe = AsyncProbe(lambda: runs.append(1), initial_delay=5.0)
    h = probe.start()

    h.scheduler.advance(4.9)
    assert runs == []
    h.scheduler.advance(0.1)
    assert runs == [1]
    assert [t for *_, t in probe.handled] == [5.0]


def test_periodic_call_repeats_with_a_fixed_delay_after_each_handler() -> None:
    probe = AsyncProbe(lambda: "ok", initial_delay=1.0, period=10.0)
    h = probe.start()

    h.scheduler.advance(31.0)

    assert [t for *_, t in probe.handled] == [1.0, 11.0, 21.0, 31.0]
    # The next run is scheduled only after the handler returned: runs never overlap.
    assert probe.pending_timers_in_handler == [0, 0, 0, 0]
    assert h.scheduler.pending_timers == 1


def test_cancel_stops_a_periodic_call() -> None:
    probe = AsyncProbe(lambda: "ok", period=10.0)
    h = probe.start()
    h.scheduler.advance(10.0)
    assert len(probe.handled) == 2

    probe.handle.cancel()
    h.scheduler.advance(100.0)

    assert len(probe.handled) == 2
    assert h.scheduler.pending_timers == 0


def test_cancel_before_the_initial_delay_means_the_callable_never_runs() -> None:
    runs: list[int] = []
    probe = AsyncProbe(lambda: runs.append(1), initial_delay=5.0, period=1.0)
    h = probe.start()

    probe.handle.cancel()
    h.scheduler.advance(100.0)

    assert runs == []
    assert probe.handled == []


def test_handler_may_cancel_its_own_periodic_call() -> None:
    probe = AsyncProbe(lambda: "ok", period=1.0)

    def cancel_on_third() -> None:
        if len(probe.handled) == 3:
            probe.handle.cancel()

    probe.after_handle = cancel_on_third
    h = probe.start()
    h.scheduler.advance(50.0)

    assert [t for *_, t in probe.handled] == [0.0, 1.0, 2.0]


def test_periodic_call_passes_errors_to_the_handler_and_keeps_going() -> None:
    calls = iter([1, Boom("flaky"), 3])

    def callable() -> int:
        value = next(calls)
        if isinstance(value, BaseException):
            raise value
        return value

    probe = AsyncProbe(callable, period=1.0)
    h = probe.start()
    h.scheduler.advance(2.0)

    assert [(r, type(e).__name__ if e else None) for r, e, _ in probe.handled] == [
        (1, None),
        (None, "Boom"),
        (3, None),
    ]
    assert h.coordinator.failure is None


def test_exception_in_a_periodic_handler_fails_the_source_and_stops_the_call() -> None:
    boom = Boom("handler broke")
    probe = AsyncProbe(lambda: "ok", period=1.0)
    probe.handler_error = boom
    h = probe.start()
    h.scheduler.advance(10.0)

    assert len(probe.handled) == 1
    assert h.failures == [boom]
    assert h.scheduler.pending_timers == 0


# -- run_in_coordinator_thread ------------------------------------------------------------


def test_run_in_coordinator_thread_runs_after_what_is_already_queued() -> None:
    h = make_harness(parallelism=1)
    order: list[str] = []
    h.enumerator.hooks["add_reader"] = lambda r: order.append("add_reader")
    h.enumerator.hooks["snapshot_state"] = lambda cid: order.append("snapshot")

    registered = h.coordinator.register_reader(0)
    h.coordinator.context.run_in_coordinator_thread(lambda: order.append("fn"))
    checkpoint = h.coordinator.checkpoint(1)
    assert order == []

    h.scheduler.run_until_idle()

    assert order == ["add_reader", "fn", "snapshot"]
    assert registered.done()
    assert checkpoint.done()


def test_exception_in_run_in_coordinator_thread_fails_the_source() -> None:
    h = make_harness(parallelism=1)
    boom = Boom("fn broke")

    def fn() -> None:
        raise boom

    h.coordinator.context.run_in_coordinator_thread(fn)
    h.scheduler.run_until_idle()

    assert h.failures == [boom]
    assert_failed_with(h.fail(h.coordinator.register_reader(0)), boom)


def test_run_in_coordinator_thread_does_nothing_once_the_source_failed() -> None:
    h = make_harness(failing_in("add_reader", Boom("x")), parallelism=1)
    h.fail(h.coordinator.register_reader(0))
    ran: list[str] = []

    h.coordinator.context.run_in_coordinator_thread(lambda: ran.append("fn"))
    h.scheduler.run_until_idle()

    assert ran == []


# -- close --------------------------------------------------------------------------------


def test_close_closes_the_enumerator_once_on_a_manual_scheduler() -> None:
    h = make_harness(parallelism=1)
    enumerator = h.enumerator

    h.coordinator.close()
    h.coordinator.close()

    assert enumerator.closed == 1


def test_close_stops_periodic_calls() -> None:
    probe = AsyncProbe(lambda: "ok", period=1.0)
    h = probe.start()
    h.scheduler.advance(2.0)
    assert len(probe.handled) == 3

    h.coordinator.close()
    h.scheduler.advance(100.0)

    assert len(probe.handled) == 3
    assert all(call.cancelled for call in h.coordinator.periodic_calls)


def test_calls_after_close_fail_instead_of_never_completing() -> None:
    h = make_harness(parallelism=1)
    h.coordinator.close()

    future = h.coordinator.register_reader(0)
    h.scheduler.run_until_idle()

    assert future.done()
    assert isinstance(future.exception(timeout=0), SourceFailedError)


# -- real threads -------------------------------------------------------------------------


class ThreadCheckingEnumerator(RecordingEnumerator):
    """Records how many enumerator calls ever ran at the same time."""

    def __init__(self, ctx: Any, state: Any) -> None:
        super().__init__(ctx, state)
        self._lock = threading.Lock()
        self._active = 0
        self.max_active = 0

    def _record(self, name: str, *args: Any) -> Any:
        with self._lock:
            self._active += 1
            self.max_active = max(self.max_active, self._active)
        try:
            threading.Event().wait(0.0005)  # widen the window in which an overlap would show
            return super()._record(name, *args)
        finally:
            with self._lock:
                self._active -= 1


def test_enumerator_calls_all_run_on_one_thread_even_when_called_from_many_threads() -> None:
    source = FakeSource(ThreadCheckingEnumerator)
    coordinator: SourceCoordinator[Split, Any] = SourceCoordinator(
        source, 4, RecordingGateway(), scheduler=ThreadedScheduler(name="t1")
    )
    try:
        coordinator.start().result(WAIT)
        callers: list[int] = []
        errors: list[BaseException] = []
        go = threading.Barrier(4, timeout=WAIT)

        def reader(reader_id: int) -> None:
            try:
                callers.append(threading.get_ident())
                go.wait()
                futures = [coordinator.register_reader(reader_id)]
                futures += [coordinator.handle_source_event(reader_id, Ping(i)) for i in range(10)]
                futures.append(coordinator.handle_split_request(reader_id, None))
                for f in futures:
                    f.result(WAIT)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=reader, args=(r,)) for r in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
        assert errors == []
        coordinator.checkpoint(1).result(WAIT)
        enumerator = coordinator.run(lambda e: e).result(WAIT)
    finally:
        coordinator.close()

    assert len(enumerator.calls) == 1 + 4 * 12 + 1 + 1  # start, readers, snapshot, close
    assert len(set(enumerator.threads)) == 1
    assert enumerator.threads[0] not in {*callers, threading.get_ident()}
    assert source.creator_threads == enumerator.threads[:1]
    assert enumerator.max_active == 1
    assert enumerator.closed == 1


def test_call_async_runs_the_callable_on_a_worker_and_the_handler_on_the_coordinator() -> None:
    done = threading.Event()
    seen: dict[str, int] = {}

    def make(ctx: Any, state: Any) -> RecordingEnumerator:
        def callable() -> str:
            seen["callable"] = threading.get_ident()
            return "listed"

        def handler(result: Any, error: BaseException | None) -> None:
            seen["handler"] = threading.get_ident()
            seen["result_ok"] = int(result == "listed" and error is None)
            done.set()

        def start() -> None:
            seen["start"] = threading.get_ident()
            ctx.call_async(callable, handler)

        return RecordingEnumerator(ctx, state, hooks={"start": start})

    coordinator: SourceCoordinator[Split, Any] = SourceCoordinator(
        FakeSource(make), 1, RecordingGateway(), scheduler=ThreadedScheduler(name="t2")
    )
    try:
        coordinator.start().result(WAIT)
        assert done.wait(WAIT)
    finally:
        coordinator.close()

    assert seen["handler"] == seen["start"]
    assert seen["callable"] != seen["start"]
    assert seen["result_ok"] == 1


def _periodic_threaded_coordinator(
    name: str, runs: list[int], first: threading.Event
) -> tuple[FakeSource, SourceCoordinator[Split, Any]]:
    def make(ctx: Any, state: Any) -> RecordingEnumerator:
        def start() -> None:
            ctx.call_async(lambda: runs.append(1), lambda r, e: first.set(), period=0.01)

        return RecordingEnumerator(ctx, state, hooks={"start": start})

    source = FakeSource(make)
    coordinator: SourceCoordinator[Split, Any] = SourceCoordinator(
        source, 1, RecordingGateway(), scheduler=ThreadedScheduler(name=name)
    )
    coordinator.start().result(WAIT)
    assert first.wait(WAIT)
    return source, coordinator


def test_close_on_a_threaded_scheduler_closes_the_enumerator_and_stops_periodic_calls() -> None:
    runs: list[int] = []
    source, coordinator = _periodic_threaded_coordinator("t3", runs, threading.Event())

    coordinator.close()
    threading.Event().wait(0.05)  # let a run that was already past its cancel check finish
    after_close = len(runs)
    threading.Event().wait(0.1)

    enumerator = source.created[0]
    assert isinstance(enumerator, RecordingEnumerator)
    assert enumerator.closed == 1
    assert enumerator.names()[-1] == "close"
    assert len(runs) == after_close


class _CappedEvent(threading.Event):
    """An Event whose long waits (close()'s 10 s) last 0.3 s, so a hang cannot stall exit."""

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is not None and timeout >= 10:
            timeout = 0.3
        return super().wait(timeout)


@pytest.fixture
def capped_close_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threading, "Event", _CappedEvent)


def _returns_within(fn: Callable[[], None], seconds: float) -> bool:
    """Run ``fn`` on a daemon thread; whether it returned within ``seconds``."""
    finished = threading.Event()

    def run() -> None:
        fn()
        finished.set()

    threading.Thread(target=run, daemon=True).start()
    return finished.wait(seconds)


@pytest.mark.usefixtures("capped_close_wait")
def test_second_close_on_a_threaded_scheduler_returns_at_once() -> None:
    source, coordinator = _periodic_threaded_coordinator("t4", [], threading.Event())
    coordinator.close()

    assert _returns_within(coordinator.close, 0.2)
    enumerator = source.created[0]
    assert isinstance(enumerator, RecordingEnumerator)
    assert enumerator.closed == 1


@pytest.mark.usefixtures("capped_close_wait")
def test_close_from_the_coordinator_thread_closes_the_enumerator_without_blocking() -> None:
    holder: list[SourceCoordinator[Split, Any]] = []
    closed = threading.Event()

    def on_failure(exc: BaseException) -> None:
        holder[0].close()
        closed.set()

    source = failing_in("add_reader", Boom("x"))
    coordinator: SourceCoordinator[Split, Any] = SourceCoordinator(
        source, 1, RecordingGateway(), scheduler=ThreadedScheduler(name="t5"), on_failure=on_failure
    )
    holder.append(coordinator)
    coordinator.start().result(WAIT)
    coordinator.register_reader(0)

    assert closed.wait(0.2)
    enumerator = source.created[0]
    assert isinstance(enumerator, RecordingEnumerator)
    assert enumerator.closed == 1
