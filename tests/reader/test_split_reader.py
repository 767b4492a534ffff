"""The small value types of the reader layer: slices, fetched batches, positioned elements."""

from __future__ import annotations

import pickle

import pytest
from tests.reader.fakes import ListOutput

from splitflow.api.split import SplitState
from splitflow.errors import ContractViolation
from splitflow.reader import Positioned, PositionedEmitter, RecordsBySplits, SplitSlice
from splitflow.testing.sequence import SequenceSplit


def test_slice_starts_at_the_split_position_and_clamps_to_its_stop() -> None:
    piece = SplitSlice(SequenceSplit("a", position=4), stop=9)
    assert (piece.split_id, piece.start, piece.stop) == ("a", 4, 9)
    assert [piece.clamp(n) for n in (4, 7, 9, 30)] == [4, 7, 9, 9]
    assert SplitSlice(SequenceSplit("a")).clamp(30) == 30


def test_empty_slice_is_allowed_and_a_stop_before_the_position_is_not() -> None:
    assert SplitSlice(SequenceSplit("a", position=4), stop=4).clamp(10) == 4
    with pytest.raises(ContractViolation, match="'a' stops at 3, before the split's position 4"):
        SplitSlice(SequenceSplit("a", position=4), stop=3)


def test_slices_are_frozen_values_that_pickle() -> None:
    piece = SplitSlice(SequenceSplit("a", position=4), stop=9)
    assert pickle.loads(pickle.dumps(piece)) == piece
    with pytest.raises(AttributeError):
        piece.stop = 10  # type: ignore[misc]


def test_ended_split_is_also_finished() -> None:
    batch: RecordsBySplits[int] = RecordsBySplits()
    batch.mark_ended("a")
    batch.mark_finished("b")
    assert batch.finished == {"a", "b"}
    assert batch.ended == {"a"}
    assert batch.split_ids() == {"a", "b"}


def test_batch_with_only_a_finished_split_is_not_empty() -> None:
    batch: RecordsBySplits[int] = RecordsBySplits()
    batch.add_all("a", [])
    assert batch.is_empty()
    assert batch.records == {}
    batch.mark_finished("a")
    assert not batch.is_empty()


def test_elements_keep_their_order_per_split() -> None:
    batch: RecordsBySplits[str] = RecordsBySplits()
    batch.add("a", "a0")
    batch.add_all("b", ["b0", "b1"])
    batch.add_all("a", ["a1", "a2"])
    assert batch.records == {"a": ["a0", "a1", "a2"], "b": ["b0", "b1"]}


def test_positioned_emitter_collects_the_value_and_moves_to_its_next_position() -> None:
    state = SplitState.of(SequenceSplit("a", position=10))
    out = ListOutput()
    emitter: PositionedEmitter[object, SequenceSplit] = PositionedEmitter()
    emitter.emit(Positioned(["row 10", "row 11", "row 12"], 13), out, state)  # a batch
    assert out == [["row 10", "row 11", "row 12"]]
    assert state.to_split() == SequenceSplit("a", position=13)


def test_positioned_emitter_does_not_move_when_the_output_fails() -> None:
    class Broken:
        def collect(self, record: object) -> None:
            raise RuntimeError("sink closed")

    state = SplitState.of(SequenceSplit("a", position=10))
    with pytest.raises(RuntimeError):
        PositionedEmitter[str, SequenceSplit]().emit(Positioned("x", 11), Broken(), state)
    assert state.position == 10
