"""Reader registration, as in the registration cases of Flink's SourceOperatorTest.

Without :class:`SupportsSplitReassignmentOnRecovery` a restarting reader keeps its restored
splits and registers with none. With it (FLIP-537) the reader hands them to the enumerator
at registration: they arrive in ``ReaderInfo.reported_splits``, and the enumerator sees them
from its ``add_reader`` call on.
"""

from __future__ import annotations

from typing import Any

from tests.coordinator.helpers import (
    FakeSource,
    ReassigningFakeSource,
    RecordingEnumerator,
    Split,
    make_harness,
)

from splitflow.api.enumerator import ReaderInfo
from splitflow.errors import ContractViolation, SourceFailedError


def _seeing(source_type: type[FakeSource]) -> tuple[FakeSource, list[ReaderInfo[Split]]]:
    """A source whose enumerator records the ReaderInfo it finds in each add_reader call."""
    seen: list[ReaderInfo[Split]] = []

    def make(ctx: Any, state: Any) -> RecordingEnumerator:
        return RecordingEnumerator(
            ctx, state, hooks={"add_reader": lambda r: seen.append(ctx.registered_readers()[r])}
        )

    return source_type(make), seen


def test_reader_of_a_source_without_the_mixin_registers_with_no_reported_splits() -> None:
    source, seen = _seeing(FakeSource)
    h = make_harness(source, parallelism=2)

    h.run(h.coordinator.register_reader(0, "host-0"))
    h.run(h.coordinator.register_reader(1, "host-1"))

    assert seen == [ReaderInfo(0, "host-0", ()), ReaderInfo(1, "host-1", ())]
    assert h.coordinator.context.reports_splits_on_registration is False


def test_restarted_reader_without_the_mixin_registers_again_with_no_reported_splits() -> None:
    source, seen = _seeing(FakeSource)
    h = make_harness(source, parallelism=1)
    h.run(h.coordinator.register_reader(0, "host-0"))
    h.run(h.coordinator.reader_failed(0, 3))

    h.run(h.coordinator.register_reader(0, "host-0b"))

    assert seen == [ReaderInfo(0, "host-0", ()), ReaderInfo(0, "host-0b", ())]


def test_reader_without_the_mixin_reporting_splits_fails_the_source() -> None:
    source, seen = _seeing(FakeSource)
    h = make_harness(source, parallelism=1)

    exc = h.fail(h.coordinator.register_reader(0, reported_splits=[Split("a", 4)]))

    assert isinstance(exc, SourceFailedError)
    assert isinstance(exc.__cause__, ContractViolation)
    assert seen == []


def test_reader_with_the_mixin_reports_its_restored_splits_at_registration() -> None:
    source, seen = _seeing(ReassigningFakeSource)
    h = make_harness(source, parallelism=2)
    restored = [Split("a", 10), Split("b", 20)]

    h.run(h.coordinator.register_reader(1, "host-1", reported_splits=restored))

    assert seen == [ReaderInfo(1, "host-1", (Split("a", 10), Split("b", 20)))]
    assert h.coordinator.context.reports_splits_on_registration is True


def test_reported_splits_are_visible_to_the_enumerator_in_add_reader_and_after() -> None:
    source, seen = _seeing(ReassigningFakeSource)
    h = make_harness(source, parallelism=2)

    h.run(h.coordinator.register_reader(0, reported_splits=[Split("a", 1)]))
    h.run(h.coordinator.register_reader(1, reported_splits=[]))

    assert [info.reported_splits for info in seen] == [(Split("a", 1),), ()]
    readers = h.coordinator.context.registered_readers()
    assert readers[0].reported_splits == (Split("a", 1),)
    assert readers[1].reported_splits == ()


def test_reader_with_the_mixin_and_nothing_restored_registers_with_no_reported_splits() -> None:
    source, seen = _seeing(ReassigningFakeSource)
    h = make_harness(source, parallelism=1)

    h.run(h.coordinator.register_reader(0, "host-0"))

    assert seen == [ReaderInfo(0, "host-0", ())]


def test_re_registration_after_a_failure_replaces_the_reported_splits() -> None:
    source, seen = _seeing(ReassigningFakeSource)
    h = make_harness(source, parallelism=1)
    h.run(h.coordinator.register_reader(0, reported_splits=[Split("a", 1), Split("b", 2)]))
    h.run(h.coordinator.reader_failed(0, 1))

    h.run(h.coordinator.register_reader(0, reported_splits=[Split("a", 7)]))

    assert [info.reported_splits for info in seen] == [
        (Split("a", 1), Split("b", 2)),
        (Split("a", 7),),
    ]
    assert h.coordinator.context.registered_readers()[0].reported_splits == (Split("a", 7),)


def test_reported_splits_are_not_recorded_as_assignments() -> None:
    # They come from the reader's checkpointed state, not from an assignment after it:
    # a later failure must not give them back through add_splits_back.
    h = make_harness(ReassigningFakeSource(), parallelism=1)
    h.run(h.coordinator.register_reader(0, reported_splits=[Split("a", 3)]))

    h.run(h.coordinator.reader_failed(0, None))

    assert h.coordinator.tracker.assignments_since(None) == {}
    assert "add_splits_back" not in h.enumerator.names()


def test_reported_splits_are_not_sent_back_to_the_reader_by_the_runtime() -> None:
    # Only the enumerator decides who reads them (FLIP-537): registration sends nothing.
    h = make_harness(ReassigningFakeSource(), parallelism=1)
    h.run(h.coordinator.register_reader(0, reported_splits=[Split("a", 3)]))
    assert h.gateway.sent == []
