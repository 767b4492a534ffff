"""SplitAssignmentTracker, mirroring Flink's SplitAssignmentTrackerTest.

``assignment(n, first)`` is Flink's ``getSplitsAssignment(n, first)``: reader ``i`` gets
``i + 1`` splits, numbered on from ``first``; ``assignment(3, 0)`` is
``{0: ["0"], 1: ["1", "2"], 2: ["3", "4", "5"]}``.
"""

from __future__ import annotations

from tests.coordinator.helpers import Split, ids

from splitflow.coordinator import SplitAssignmentTracker


def assignment(readers: int, first: int) -> dict[int, list[Split]]:
    result: dict[int, list[Split]] = {}
    next_id = first
    for reader in range(readers):
        result[reader] = [Split(str(next_id + k)) for k in range(reader + 1)]
        next_id += reader + 1
    return result


def by_reader(tracked: dict[int, list[Split]]) -> dict[int, list[str]]:
    return {reader: ids(ss) for reader, ss in sorted(tracked.items())}


def test_assignment_helper_matches_flinks_get_splits_assignment() -> None:
    assert by_reader(assignment(3, 0)) == {0: ["0"], 1: ["1", "2"], 2: ["3", "4", "5"]}


def test_incremental_assignments_accumulate_per_reader_in_order() -> None:
    tracker: SplitAssignmentTracker[Split] = SplitAssignmentTracker()
    tracker.record_split_assignment(assignment(3, 0))
    tracker.record_split_assignment(assignment(2, 6))

    assert by_reader(tracker.assignments_since(None)) == {
        0: ["0", "6"],
        1: ["1", "2", "7", "8"],
        2: ["3", "4", "5"],
    }


def test_checkpoint_files_uncheckpointed_assignments_under_its_id() -> None:
    tracker: SplitAssignmentTracker[Split] = SplitAssignmentTracker()
    tracker.record_split_assignment(assignment(3, 0))

    tracker.on_checkpoint(123)

    # Filed under 123: nothing is assigned after 123, everything after 122.
    assert tracker.assignments_since(123) == {}
    assert by_reader(tracker.assignments_since(122)) == {
        0: ["0"],
        1: ["1", "2"],
        2: ["3", "4", "5"],
    }


def test_checkpoint_without_new_assignments_files_nothing() -> None:
    tracker: SplitAssignmentTracker[Split] = SplitAssignmentTracker()
    tracker.record_split_assignment(assignment(1, 0))
    tracker.on_checkpoint(1)
    tracker.on_checkpoint(2)  # nothing new since 1

    assert by_reader(tracker.assignments_since(1)) == {}
    assert by_reader(tracker.assignments_since(0)) == {0: ["0"]}


def test_assignments_after_a_checkpoint_are_filed_under_the_next_one() -> None:
    tracker: SplitAssignmentTracker[Split] = SplitAssignmentTracker()
    tracker.record_split_assignment(assignment(2, 0))
    tracker.on_checkpoint(100)
    tracker.record_split_assignment(assignment(2, 3))
    tracker.on_checkpoint(101)

    assert by_reader(tracker.assignments_since(100)) == {0: ["3"], 1: ["4", "5"]}
    assert by_reader(tracker.assignments_since(99)) == {0: ["0", "3"], 1: ["1", "2", "4", "5"]}


def test_checkpoint_complete_drops_what_was_filed_up_to_it_and_keeps_later_ones() -> None:
    tracker: SplitAssignmentTracker[Split] = SplitAssignmentTracker()
    tracker.record_split_assignment(assignment(2, 0))
    tracker.on_checkpoint(100)
    tracker.record_split_assignment(assignment(2, 3))
    tracker.on_checkpoint(101)

    tracker.on_checkpoint_complete(100)

    assert by_reader(tracker.assignments_since(None)) == {0: ["3"], 1: ["4", "5"]}


def test_checkpoint_complete_also_drops_older_checkpoints_that_never_completed() -> None:
    tracker: SplitAssignmentTracker[Split] = SplitAssignmentTracker()
    tracker.record_split_assignment({0: [Split("a")]})
    tracker.on_checkpoint(1)
    tracker.record_split_assignment({0: [Split("b")]})
    tracker.on_checkpoint(2)
    tracker.record_split_assignment({0: [Split("c")]})
    tracker.on_checkpoint(3)

    tracker.on_checkpoint_complete(2)  # 1 was subsumed

    assert by_reader(tracker.assignments_since(None)) == {0: ["c"]}


def test_checkpoint_complete_keeps_uncheckpointed_assignments() -> None:
    tracker: SplitAssignmentTracker[Split] = SplitAssignmentTracker()
    tracker.record_split_assignment({0: [Split("a")]})
    tracker.on_checkpoint(1)
    tracker.record_split_assignment({0: [Split("b")]})

    tracker.on_checkpoint_complete(1)

    assert by_reader(tracker.assignments_since(None)) == {0: ["b"]}


def test_get_and_remove_before_every_checkpoint_returns_all_of_the_readers_splits() -> None:
    # Flink: getAndRemoveUncheckpointedAssignment(0, checkpointId1 - 1) == ["0", "3"].
    tracker: SplitAssignmentTracker[Split] = SplitAssignmentTracker()
    tracker.record_split_assignment(assignment(2, 0))
    tracker.on_checkpoint(100)
    tracker.record_split_assignment(assignment(2, 3))
    tracker.on_checkpoint(101)

    assert ids(tracker.get_and_remove_uncheckpointed_assignment(0, 99)) == ["0", "3"]


def test_get_and_remove_after_some_checkpoint_returns_only_later_splits() -> None:
    # Flink: testGetAndRemoveSplitsAfterSomeCheckpoint, restored to checkpointId1 -> ["3"].
    tracker: SplitAssignmentTracker[Split] = SplitAssignmentTracker()
    tracker.record_split_assignment(assignment(2, 0))
    tracker.on_checkpoint(100)
    tracker.record_split_assignment(assignment(2, 3))
    tracker.on_checkpoint(101)

    assert ids(tracker.get_and_remove_uncheckpointed_assignment(0, 100)) == ["3"]


def test_get_and_remove_for_the_newest_checkpoint_returns_only_uncheckpointed_splits() -> None:
    tracker: SplitAssignmentTracker[Split] = SplitAssignmentTracker()
    tracker.record_split_assignment(assignment(2, 0))
    tracker.on_checkpoint(100)
    tracker.record_split_assignment(assignment(2, 3))

    assert ids(tracker.get_and_remove_uncheckpointed_assignment(0, 100)) == ["3"]
    assert ids(tracker.get_and_remove_uncheckpointed_assignment(1, 100)) == ["4", "5"]


def test_get_and_remove_restored_from_a_newer_checkpoint_returns_only_uncheckpointed() -> None:
    tracker: SplitAssignmentTracker[Split] = SplitAssignmentTracker()
    tracker.record_split_assignment({0: [Split("a")]})
    tracker.on_checkpoint(100)
    tracker.record_split_assignment({0: [Split("b")]})

    assert ids(tracker.get_and_remove_uncheckpointed_assignment(0, 200)) == ["b"]


def test_get_and_remove_with_no_restored_checkpoint_returns_everything_in_order() -> None:
    tracker: SplitAssignmentTracker[Split] = SplitAssignmentTracker()
    tracker.record_split_assignment({0: [Split("a")], 1: [Split("x")]})
    tracker.on_checkpoint(1)
    tracker.record_split_assignment({0: [Split("b")]})
    tracker.on_checkpoint(2)
    tracker.record_split_assignment({0: [Split("c")]})

    assert ids(tracker.get_and_remove_uncheckpointed_assignment(0, None)) == ["a", "b", "c"]


def test_get_and_remove_removes_only_that_readers_splits() -> None:
    tracker: SplitAssignmentTracker[Split] = SplitAssignmentTracker()
    tracker.record_split_assignment(assignment(3, 0))
    tracker.on_checkpoint(1)
    tracker.record_split_assignment(assignment(3, 6))

    assert ids(tracker.get_and_remove_uncheckpointed_assignment(1, None)) == ["1", "2", "7", "8"]

    assert ids(tracker.get_and_remove_uncheckpointed_assignment(1, None)) == []
    assert by_reader(tracker.assignments_since(None)) == {
        0: ["0", "6"],
        2: ["3", "4", "5", "9", "10", "11"],
    }


def test_get_and_remove_keeps_the_readers_splits_filed_up_to_the_restored_checkpoint() -> None:
    tracker: SplitAssignmentTracker[Split] = SplitAssignmentTracker()
    tracker.record_split_assignment({0: [Split("a")]})
    tracker.on_checkpoint(1)
    tracker.record_split_assignment({0: [Split("b")]})
    tracker.on_checkpoint(2)

    assert ids(tracker.get_and_remove_uncheckpointed_assignment(0, 1)) == ["b"]
    # "a" stays filed under 1: a later failure restored to before 1 still gets it back.
    assert ids(tracker.get_and_remove_uncheckpointed_assignment(0, 0)) == ["a"]


def test_get_and_remove_after_completion_returns_nothing_acknowledged() -> None:
    tracker: SplitAssignmentTracker[Split] = SplitAssignmentTracker()
    tracker.record_split_assignment({0: [Split("a")]})
    tracker.on_checkpoint(1)
    tracker.on_checkpoint_complete(1)

    assert tracker.get_and_remove_uncheckpointed_assignment(0, 1) == []
