"""The split-loss scenarios of the FLIP-537 discussion, one named test each.

Each test drives the real coordinator and readers through the harness, then reads
everything, checkpoints, and compares the committed output with the data record by record:
a lost split shows up as missing records, a doubly owned one as duplicates. Ownership is
checked too: every unfinished split has exactly one holder (the enumerator or one reader).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from splitflow.api.assigner import AssignerState
from splitflow.api.assignment import Assignment, BalancedAssignment
from splitflow.coordinator import Checkpoint
from splitflow.errors import CheckpointDeclinedError, ContractViolation
from splitflow.testing import (
    ENUMERATOR,
    SequenceCatalog,
    SequenceSource,
    SequenceSplit,
    SourceHarness,
    assigning_enumerator_owned,
    count_duplicates,
)

Harness = SourceHarness[tuple[str, int], SequenceSplit, AssignerState[SequenceSplit]]


class HoldBack(BalancedAssignment[SequenceSplit]):
    """Balanced, but keeps the splits named in ``held`` with the enumerator for now."""

    def __init__(self) -> None:
        super().__init__()
        self.held: set[str] = set()

    def redistribute(
        self,
        held: Mapping[int, Sequence[SequenceSplit]],
        readers: Sequence[int],
        unowned: Sequence[SequenceSplit] = (),
    ) -> Assignment[SequenceSplit]:
        full = super().redistribute(held, readers, unowned)
        return {r: [s for s in ss if s.split_id not in self.held] for r, ss in full.items()}

    def assign(
        self,
        splits: Sequence[SequenceSplit],
        loads: Mapping[int, float],
    ) -> Assignment[SequenceSplit]:
        return super().assign([s for s in splits if s.split_id not in self.held], loads)


class AllTo(BalancedAssignment[SequenceSplit]):
    """Gives every split to one reader (to build the 'B owns what A reports' case)."""

    def __init__(self, reader: int) -> None:
        super().__init__()
        self.reader = reader

    def redistribute(
        self,
        held: Mapping[int, Sequence[SequenceSplit]],
        readers: Sequence[int],
        unowned: Sequence[SequenceSplit] = (),
    ) -> Assignment[SequenceSplit]:
        return {self.reader: [*unowned, *(s for ss in held.values() for s in ss)]}


class ScriptedSource(SequenceSource):
    """A SequenceSource whose enumerator uses a strategy object the test controls."""

    def __init__(self, catalog: SequenceCatalog, strategy: BalancedAssignment[SequenceSplit]):
        super().__init__(catalog, discovery_interval=1.0)
        self.scripted = strategy

    def make_strategy(self) -> BalancedAssignment[SequenceSplit]:
        return self.scripted


def restored_from(readers: dict[int, tuple[SequenceSplit, ...]]) -> Checkpoint:  # type: ignore[type-arg]
    """A checkpoint in which ``readers`` hold those splits and the enumerator owns none."""
    assigned = {s.split_id: r for r, ss in readers.items() for s in ss}
    return Checkpoint(7, AssignerState(assigned=assigned, discovered=True), readers)


def assert_single_owner(harness: Harness) -> None:
    owners = harness.ownership(assigning_enumerator_owned)
    doubly = {sid: who for sid, who in owners.items() if len(who) != 1}
    assert not doubly, f"splits with more than one holder: {doubly}"


def assert_exactly_once(harness: Harness, expected: list[tuple[str, int]]) -> None:
    harness.read_available()
    harness.complete(harness.checkpoint())
    committed = harness.committed()
    assert not count_duplicates(committed), f"duplicates: {count_duplicates(committed)}"
    missing = sorted(set(expected) - set(committed))
    assert not missing, f"lost records, e.g. {missing[:5]} ({len(missing)} in all)"
    assert sorted(committed) == sorted(expected)


def records_from(catalog: SequenceCatalog, starts: dict[str, int]) -> list[tuple[str, int]]:
    return [(name, i) for name, i in catalog.records() if i >= starts.get(name, 0)]


def test_reported_splits_not_yet_reassigned_are_in_the_enumerator_checkpoint() -> None:
    # Readers report 1,2 and 3,4; the enumerator reassigns only 1,2; a checkpoint is taken.
    catalog = SequenceCatalog({"1": 10, "2": 10, "3": 10, "4": 10})
    strategy = HoldBack()
    strategy.held = {"3", "4"}
    source = ScriptedSource(catalog, strategy)
    split = {n: SequenceSplit(n, position=4) for n in "1234"}
    harness: Harness = SourceHarness(
        source,
        2,
        restore_from=restored_from({0: (split["1"], split["2"]), 1: (split["3"], split["4"])}),
    )
    harness.settle()
    assert {s.split_id for ss in harness.reader_splits().values() for s in ss} == {"1", "2"}

    checkpoint = harness.checkpoint()
    state = harness.checkpoints[checkpoint].enumerator
    assert {s.split_id: s.position for s in state.unassigned} == {"3": 4, "4": 4}
    harness.complete(checkpoint)
    assert_single_owner(harness)

    # A global restore from that checkpoint must still read 3 and 4 from position 4.
    strategy.held = set()
    harness.restore()
    assert_single_owner(harness)
    assert_exactly_once(harness, records_from(catalog, dict.fromkeys("1234", 4)))


def test_checkpoint_before_every_report_arrived_is_declined() -> None:
    catalog = SequenceCatalog({"1": 5, "2": 5, "3": 5, "4": 5})
    source = SequenceSource(catalog, discovery_interval=1.0)
    split = {n: SequenceSplit(n, position=1) for n in "1234"}
    harness: Harness = SourceHarness(
        source,
        2,
        restore_from=restored_from({0: (split["1"], split["2"]), 1: (split["3"], split["4"])}),
        start_readers=False,
    )
    harness.start_reader(0)  # reports 1,2; reader 1 (holding 3,4) has not registered
    with pytest.raises(CheckpointDeclinedError, match=r"readers \[1\] are not registered"):
        harness.checkpoint()
    assert harness.coordinator.failure is None

    harness.start_reader(1)
    harness.settle()
    checkpoint = harness.checkpoint()
    held = {s.split_id for ss in harness.checkpoints[checkpoint].readers.values() for s in ss}
    owned = {s.split_id for s in harness.checkpoints[checkpoint].enumerator.unassigned}
    assert held | owned == {"1", "2", "3", "4"}
    harness.complete(checkpoint)
    assert_exactly_once(harness, records_from(catalog, dict.fromkeys("1234", 1)))


@pytest.mark.parametrize("checkpoint_before_failure", [True, False])
def test_reader_re_reporting_only_some_splits_after_others_moved_loses_nothing(
    checkpoint_before_failure: bool,
) -> None:
    # A reports 1,2; the enumerator gives 1 to A and 2 to B; A fails and reports again:
    # only 1 if a checkpoint completed in between (its state then held only 1), else 1,2.
    catalog = SequenceCatalog({"1": 20, "2": 20})
    source = SequenceSource(catalog, discovery_interval=1.0)
    split = {n: SequenceSplit(n, position=3) for n in "12"}
    harness: Harness = SourceHarness(
        source, 2, restore_from=restored_from({0: (split["1"], split["2"]), 1: ()})
    )
    harness.settle()
    assert {r: [s.split_id for s in ss] for r, ss in harness.reader_splits().items()} == {
        0: ["1"],
        1: ["2"],
    }
    harness.poll(0, max_polls=1)
    harness.poll(1, max_polls=1)
    if checkpoint_before_failure:
        harness.complete(harness.checkpoint())
        assert [s.split_id for s in harness.last_completed.readers[0]] == ["1"]  # type: ignore[union-attr]
    harness.poll(0, max_polls=1)
    harness.fail_reader(0)
    assert_single_owner(harness)
    assert {s.split_id for s in harness.reader_splits()[1]} == {"2"}
    assert_exactly_once(harness, records_from(catalog, {"1": 3, "2": 3}))


def test_stale_report_of_splits_another_reader_owns_is_ignored() -> None:
    # A reports 1,2; the enumerator gives both to B; A fails and reports 1,2 again.
    catalog = SequenceCatalog({"1": 20, "2": 20})
    source = ScriptedSource(catalog, AllTo(reader=1))
    split = {n: SequenceSplit(n, position=2) for n in "12"}
    harness: Harness = SourceHarness(
        source, 2, restore_from=restored_from({0: (split["1"], split["2"]), 1: ()})
    )
    harness.settle()
    assert {r: len(ss) for r, ss in harness.reader_splits().items()} == {0: 0, 1: 2}
    harness.poll(1, max_polls=3)  # B reads on
    harness.fail_reader(0)  # no checkpoint since the restore: A reports 1,2 again
    assert {r: len(ss) for r, ss in harness.reader_splits().items()} == {0: 0, 1: 2}
    owners = harness.ownership(assigning_enumerator_owned)
    assert owners == {"1": [1], "2": [1]}
    assert_exactly_once(harness, records_from(catalog, {"1": 2, "2": 2}))


def test_assignment_after_the_last_checkpoint_never_acknowledged_is_given_back() -> None:
    catalog = SequenceCatalog({"a": 5, "b": 5})
    source = SequenceSource(catalog, discovery_interval=1.0)
    harness: Harness = SourceHarness(source, 2)
    harness.read_available()
    harness.complete(harness.checkpoint())

    catalog.add("c", 8)  # discovered and assigned after the last completed checkpoint
    harness.advance(1.0)
    owner = next(r for r, ss in harness.reader_splits().items() if any(s.name == "c" for s in ss))
    harness.poll(owner, max_polls=5)
    harness.fail_reader(owner)  # its restored state does not have c, so it cannot report c

    owners = harness.ownership(assigning_enumerator_owned)
    assert len(owners["c"]) == 1
    assert owners["c"] != [ENUMERATOR]  # given back and assigned again, not parked
    assert_exactly_once(harness, catalog.records())


def test_partial_failover_returns_splits_to_their_reader_and_moves_no_other() -> None:
    # Reader 0 finishes "a" and then gets "b"; it fails before a checkpoint. Both come back to
    # it (the finish is undone with the failure), even though it is then the most loaded.
    catalog = SequenceCatalog({"x": 3, "y": 3})
    source = SequenceSource(catalog, discovery_interval=1.0)
    harness: Harness = SourceHarness(source, 3)
    harness.complete(harness.checkpoint())
    catalog.add("a", 2)
    catalog.seal("a")
    harness.advance(1.0)
    owner = next(r for r, ss in harness.reader_splits().items() if any(s.name == "a" for s in ss))
    harness.poll(owner, max_polls=5)  # reads "a" to its end: finished
    catalog.add("b", 4)
    harness.advance(1.0)
    before = {r: {s.split_id for s in ss} for r, ss in harness.reader_splits().items()}
    assert "b" in before[owner]  # the least loaded again once "a" finished

    harness.fail_reader(owner)

    after = {r: {s.split_id for s in ss} for r, ss in harness.reader_splits().items()}
    assert after[owner] == before[owner] | {"a"}
    assert {r: ss for r, ss in after.items() if r != owner} == {
        r: ss for r, ss in before.items() if r != owner
    }
    assert_exactly_once(harness, catalog.records())


def test_stale_report_of_a_split_another_reader_finished_is_ignored() -> None:
    # After a rescale, reader 0's restore point still lists "b", which moved to reader 1 and
    # was read to its end there. Reader 0 fails: its report of "b" must not bring it back.
    catalog = SequenceCatalog({"a": 0, "b": 0})
    source = SequenceSource(catalog, discovery_interval=1.0)
    harness: Harness = SourceHarness(source, 3)
    harness.restore(parallelism=1)
    catalog.seal("a")
    harness.complete(harness.checkpoint())
    catalog.seal("b")
    harness.restore(parallelism=2)  # reader 0 reports a and b; b moves to reader 1
    assert {r: [s.name for s in ss] for r, ss in harness.reader_splits().items()} == {
        0: ["a"],
        1: ["b"],
    }
    harness.poll(1, max_polls=2)  # b ends on reader 1
    harness.fail_reader(0)
    owners = harness.ownership(assigning_enumerator_owned)
    assert "b" not in owners
    assert_exactly_once(harness, catalog.records())


def test_a_checkpoint_taken_before_a_failover_cannot_complete_after_it() -> None:
    # Found by the stateful test: completing such a checkpoint would restore a reader past
    # records whose output the failover rolled back.
    catalog = SequenceCatalog({"a": 1})
    harness: Harness = SourceHarness(SequenceSource(catalog), 1)
    harness.poll(0, max_polls=1)
    taken = harness.checkpoint()
    harness.fail_reader(0)
    with pytest.raises(ContractViolation, match=f"checkpoint {taken} was aborted"):
        harness.complete(taken)
    assert_exactly_once(harness, catalog.records())
