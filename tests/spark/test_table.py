"""The planner's table of held splits: positions and extents in arrays (no Spark)."""

from __future__ import annotations

from typing import NamedTuple

from splitflow.api.enumerator import SplitExtent
from splitflow.spark.limits import Backlogs
from splitflow.spark.table import SlotReads, SplitTable


class _Body(NamedTuple):  # a split object: a tuple, which the table must keep whole
    split_id: str


def _table(positions: dict[str, int], slot: int = 0) -> SplitTable:
    table = SplitTable()
    table.add(list(positions), slot, list(positions.values()), [_Body(sid) for sid in positions])
    return table


def test_backlogs_and_lags_come_from_positions_and_extents() -> None:
    table = _table({"a": 0, "b": 5, "c": 9})
    table.note(["a", "b", "c"], {"a": SplitExtent(10), "b": SplitExtent(5, available=8)})
    assert table.backlogs().as_dict() == {"a": 10}  # b is at latest; c has no extent
    lags = table.lags()
    assert {sid: int(lags[table.row_of[sid]]) for sid in "abc"} == {"a": 10, "b": 3, "c": 0}
    table.move(["a"], [4])
    assert table.backlogs().as_dict() == {"a": 6}


def test_a_cap_sets_how_far_a_batch_may_read() -> None:
    table = _table({"a": 0, "b": 0})
    table.note(["a", "b"], {"a": SplitExtent(10), "b": SplitExtent(10)}, lambda sid, e: 4)
    assert table.backlogs().as_dict() == {"a": 4, "b": 4}
    lags = table.lags()
    assert lags[table.row_of["a"]] == 10  # what exists counts for the lag, capped or not


def test_ended_splits_are_at_their_final_position_with_nothing_to_read() -> None:
    table = _table({"done": 7, "open": 7, "more": 3}, slot=1)
    table.add(["other"], 0, [2], [_Body(sid) for sid in ["other"]])
    final = SplitExtent(7, final=True)
    table.note(
        ["done", "open", "more", "other"],
        {"done": final, "open": SplitExtent(7), "more": final, "other": SplitExtent(2, final=True)},
    )
    assert table.ended() == {0: ["other"], 1: ["done"]}
    table.note(["more"], {"more": final}, lambda sid, e: 3)  # nothing to read, not at its end
    assert table.backlogs().as_dict() == {}
    assert table.ended() == {0: ["other"], 1: ["done"]}


def test_rows_of_splits_that_left_are_reused_and_hold_nothing() -> None:
    table = _table({"a": 0, "b": 0})
    table.note(["a", "b"], {"a": SplitExtent(5), "b": SplitExtent(5)})
    row = table.row_of["a"]
    table.remove("a")
    assert table.backlogs().as_dict() == {"b": 5}
    assert int(table.lags().sum()) == 5
    table.add(["c"], 1, [1], [_Body(sid) for sid in ["c"]])
    assert table.row_of["c"] == row
    assert table.backlogs().as_dict() == {"b": 5}  # c's extent is not known yet
    table.note(["c"], {"c": SplitExtent(3)})
    assert table.backlogs().as_dict() == {"b": 5, "c": 2}
    assert table.slot_lags(table.lags(), 2) == [5, 2]


def test_a_split_assigned_again_keeps_its_row_and_extent() -> None:
    table = _table({"a": 0, "b": 0})
    table.note(["a", "b"], {"a": SplitExtent(5), "b": SplitExtent(4)})
    row = table.row_of["a"]
    table.add(["c", "a"], 1, [1, 2], [_Body(sid) for sid in ["c", "a"]])
    assert table.row_of["a"] == row
    assert len(table.row_of) == 3
    assert table.backlogs().as_dict() == {"a": 3, "b": 4}  # c's extent is not known yet
    assert table.slot_lags(table.lags(), 2) == [4, 3]


def test_splits_left_out_or_unknown_are_ignored_or_forgotten() -> None:
    table = _table({"a": 0})
    table.note(["a"], {"a": SplitExtent(5)})
    table.note(["a", "gone"], {"gone": SplitExtent(9)})  # a: no extent now; gone: not held
    assert table.backlogs().as_dict() == {}
    assert "gone" not in table.row_of


def test_values_whose_difference_would_pass_64_bits_stay_exact() -> None:
    table = _table({"a": -3})
    table.note(["a"], {"a": SplitExtent(2**63 - 1)})
    assert table.backlogs().as_dict() == {"a": 2**63 + 2}
    assert table.lags()[table.row_of["a"]] == 2**63 + 2


def test_positions_past_64_bits_stay_exact() -> None:
    big = 2**64 + 3  # a log position past int64 (and uint64)
    table = _table({"small": 0, "log": big - 10})
    table.note(["small", "log"], {"small": SplitExtent(4), "log": SplitExtent(big)})
    assert table.backlogs().as_dict() == {"small": 4, "log": 10}
    assert table.backlogs().share(7) == {"small": 2, "log": 5}
    table.move(["log"], [big - 1])
    lags = table.lags()
    assert table.slot_lags(lags, 1) == [5]
    table.note(["log"], {"log": SplitExtent(2**70, final=True)})
    assert table.backlogs().as_dict() == {"small": 4, "log": 2**70 - big + 1}
    assert table.backlogs().total() == 4 + 2**70 - big + 1
    table.move(["log"], [2**70])
    assert table.ended() == {0: ["log"]}


def test_the_splits_a_batch_reads_to_their_end() -> None:
    table = _table({"a": 0, "b": 0, "c": 0}, slot=1)
    table.add(["d"], 0, [3], [_Body(sid) for sid in ["d"]])
    final = SplitExtent(5, final=True)
    table.note(["a", "b", "c", "d"], {"a": final, "b": SplitExtent(5), "c": final, "d": final})
    reads = table.placed(Backlogs.of({"a": 5, "b": 5, "c": 4, "d": 2, "gone": 1}))
    assert reads.ids.tolist() == ["a", "b", "c", "d"]  # not held: left out
    assert table.read_to_end(reads) == {0: ["d"], 1: ["a"]}


def test_what_a_batch_reads_keeps_its_rows_groups_by_slot_and_moves_the_splits_on() -> None:
    table = _table({"b": 0, "a": 2}, slot=1)
    table.add(["c", "d"], 0, [5, 1], [_Body(sid) for sid in ["c", "d"]])
    table.note(
        ["a", "b", "c", "d"],
        {"a": SplitExtent(10), "b": SplitExtent(10), "c": SplitExtent(9), "d": SplitExtent(1)},
    )
    reads = table.backlogs().take(9)  # shared over a (8), b (10) and c (4); d has none
    assert reads.rows is not None
    assert table.ids[reads.rows].tolist() == reads.ids.tolist()
    counts = reads.as_dict()
    assert sorted(counts) == ["a", "b", "c"]
    assert sum(counts.values()) == 9
    assert table.placed(reads) is reads  # rows known: nothing looked up
    rows = table.row_of
    assert {
        slot: (group.ids, group.rows.tolist(), group.values.tolist())
        for slot, group in table.slots_of(reads).items()
    } == {
        0: (["c"], [rows["c"]], [counts["c"]]),
        1: (["a", "b"], [rows["a"], rows["b"]], [counts["a"], counts["b"]]),
    }
    assert all(isinstance(group, SlotReads) for group in table.slots_of(reads).values())
    table.advance(reads)
    at = {sid: int(table.position[table.row_of[sid]]) for sid in "abcd"}
    assert at == {"a": 2 + counts["a"], "b": counts["b"], "c": 5 + counts["c"], "d": 1}
    assert table.backlogs().as_dict() == {
        sid: extent - at[sid] for sid, extent in {"a": 10, "b": 10, "c": 9}.items()
    }


def test_each_row_holds_its_split_object_as_assigned_until_the_split_leaves() -> None:
    table = _table({"a": 0, "b": 0})
    row = table.row_of["a"]
    assert table.body[row] == _Body("a")  # a tuple, held whole
    again = _Body("a")
    table.add(["a"], 1, [3], [again])
    assert table.body[row] is again
    table.remove("a")
    assert table.body[row] is None
    table.add(["c"], 0, [1], [_Body("c")])
    assert table.row_of["c"] == row
    assert table.body[row] == _Body("c")
    assert table.body[table.row_of["b"]] == _Body("b")
