"""SplitsAhead: an enumerator that makes its splits as they are read, driven through a
SourceCoordinator on a ManualScheduler (the splits ahead, the end, failures)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from tests.coordinator.helpers import Harness, ReassigningFakeSource, Split, make_harness

from splitflow.api.ahead import SplitsAhead
from splitflow.api.assigner import AssigningSplitEnumerator
from splitflow.api.events import SourceEvent, SplitsFinishedEvent
from splitflow.coordinator import NoMoreSplits
from splitflow.errors import ConfigurationError, ConnectorError, ContractViolation

WINDOW = 4


@dataclass(frozen=True)
class Range:
    """Splits ``<name>-<next>`` .. ``<name>-<end - 1>`` still to be made."""

    name: str
    next: int
    end: int


class Upstream:
    """Makes splits from ranges; ``errors`` are raised by the next makes, one each."""

    def __init__(self) -> None:
        self.makes: list[int] = []  # n asked of each make
        self.errors: list[Exception] = []

    def make(self, cursors: Sequence[Range], n: int) -> tuple[list[Split], list[Range]]:
        self.makes.append(n)
        if self.errors:
            raise self.errors.pop(0)
        splits: list[Split] = []
        rest: list[Range] = []
        for c in cursors:
            k = min(n - len(splits), c.end - c.next)
            splits += [Split(f"{c.name}-{i}") for i in range(c.next, c.next + k)]
            if c.next + k < c.end:
                rest.append(Range(c.name, c.next + k, c.end))
        return splits, rest


class AheadEnumerator(AssigningSplitEnumerator[Split]):
    """Discovers nothing; makes its splits from ranges, :data:`WINDOW` live at a time."""

    def __init__(self, context: Any, upstream: Upstream, ranges: Sequence[Range]) -> None:
        super().__init__(context)
        self.ahead: SplitsAhead[Split, Range] = SplitsAhead(
            context, upstream.make, self.add_splits, lambda c: c.name, ranges
        )

    def discover_splits(self) -> Sequence[Split]:
        return []

    def add_splits(self, splits: Sequence[Split], *, at_start: bool = False) -> None:
        super().add_splits(splits, at_start=at_start)
        self.refill()

    def handle_source_event(self, reader_id: int, event: SourceEvent) -> None:
        super().handle_source_event(reader_id, event)
        if isinstance(event, SplitsFinishedEvent):
            self.refill()

    def refill(self) -> None:
        self.ahead.refill(WINDOW, len(self.owners()) + len(self.unassigned_splits()))

    def splits_to_come(self) -> bool:
        return self.ahead.pending


def make(upstream: Upstream, *ranges: Range) -> Harness:
    source = ReassigningFakeSource(lambda ctx, restored: AheadEnumerator(ctx, upstream, ranges))
    h = make_harness(source, 2)
    h.register_all()
    return h


def finish(h: Harness, *split_ids: str) -> None:
    owners = h.enumerator.owners()
    for sid in split_ids:
        h.run(h.coordinator.handle_source_event(owners[sid], SplitsFinishedEvent((sid,))))


def test_splits_are_made_a_window_ahead_in_order_and_the_end_is_told_after_the_last() -> None:
    upstream = Upstream()
    h = make(upstream, Range("a", 0, 5), Range("b", 0, 4))
    assert sorted(h.enumerator.owners()) == ["a-0", "a-1", "a-2", "a-3"]
    assert h.enumerator.ahead.cursors == (Range("a", 4, 5), Range("b", 0, 4))
    made = sorted(h.enumerator.owners())
    while h.enumerator.owners():
        told = any(m == NoMoreSplits() for _, m in h.gateway.sent)
        assert told is not h.enumerator.ahead.pending  # told once the last one is made
        finish(h, *sorted(h.enumerator.owners())[:2])
        assert len(h.enumerator.owners()) <= WINDOW
        made += [s for s in h.enumerator.owners() if s not in made]
    assert made == [*(f"a-{i}" for i in range(5)), *(f"b-{i}" for i in range(4))]
    assert h.enumerator.ahead.cursors == ()
    assert not h.enumerator.ahead.pending
    assert [r for r, m in h.gateway.sent if m == NoMoreSplits()] == [0, 1]
    assert h.failures == []


def test_a_failed_make_is_tried_again_after_a_delay_and_loses_nothing() -> None:
    upstream = Upstream()
    h = make(upstream, Range("a", 0, 6))
    upstream.errors = [OSError("connection reset")]
    finish(h, "a-0")  # the make fails: the range stays where it was
    assert h.enumerator.ahead.cursors == (Range("a", 4, 6),)
    finish(h, "a-1")  # a refill while the retry waits makes nothing
    assert sorted(h.enumerator.owners()) == ["a-2", "a-3"]
    assert upstream.makes == [4, 1]
    h.scheduler.advance(SplitsAhead.retry_delay)  # the retry, then the refill after it
    assert sorted(h.enumerator.owners()) == ["a-2", "a-3", "a-4", "a-5"]
    assert upstream.makes == [4, 1, 1, 1]
    assert h.enumerator.ahead.cursors == ()
    assert h.failures == []


def test_three_failed_makes_in_a_row_fail_the_source_naming_the_cursor() -> None:
    """Finishes while a retry waits spend no attempt: three makes fail, one after another."""
    upstream = Upstream()
    h = make(upstream, Range("a", 0, 9))
    upstream.errors = [OSError("connection reset")] * 3
    finish(h, "a-0", "a-1", "a-2")
    h.scheduler.advance(SplitsAhead.retry_delay)
    assert h.failures == []
    h.scheduler.advance(2 * SplitsAhead.retry_delay)
    [failure] = h.failures
    assert isinstance(failure, ConnectorError)
    assert "next splits of a" in str(failure)
    assert "3 time(s) in a row" in str(failure)
    assert "connection reset" in str(failure)
    assert len(upstream.makes) == 4


def test_a_make_that_makes_nothing_while_cursors_go_on_is_a_contract_violation() -> None:
    class Stuck(Upstream):
        def make(self, cursors: Sequence[Range], n: int) -> tuple[list[Split], list[Range]]:
            return super().make(cursors, n) if not self.makes else ([], list(cursors))

    h = make(Stuck(), Range("a", 0, 9))
    finish(h, "a-0")
    [failure] = h.failures
    assert isinstance(failure, ContractViolation)


@pytest.mark.parametrize("error", [ConfigurationError("option x: bad", option="x")])
def test_a_configuration_error_fails_the_source_at_once(error: Exception) -> None:
    upstream = Upstream()
    h = make(upstream, Range("a", 0, 9))
    upstream.errors = [error]
    finish(h, "a-0")
    [failure] = h.failures
    assert failure.__cause__ is error
