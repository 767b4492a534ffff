"""SourceReaderBase, in both fetch modes (mirrors Flink's SourceReaderBaseTest)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

import pytest
from tests.reader.conftest import NewReader
from tests.reader.fakes import (
    WAIT,
    ListOutput,
    RecordingContext,
    Script,
    ScriptedSplitReader,
    by_split,
    read,
    read_until_idle,
)

from splitflow.api.events import (
    SliceEndedEvent,
    SourceEvent,
    SplitsFinishedEvent,
    SplitsRemovedEvent,
)
from splitflow.api.reader import InputStatus, ReaderOutput
from splitflow.api.split import SplitState
from splitflow.errors import ConfigurationError, ContractViolation, SplitOwnershipError
from splitflow.reader import Positioned, PositionedEmitter, RecordEmitter, SourceReaderBase
from splitflow.testing.sequence import SequenceCatalog, SequenceRecord, SequenceSplit

# -- reading --------------------------------------------------------------------------------


def test_reads_every_record_of_several_splits_once_in_order(
    new_reader: NewReader, fetch_threads: int
) -> None:
    catalog = SequenceCatalog({"a": 10, "b": 7, "c": 0, "d": 1})
    reader, context, _ = new_reader(catalog, fetch_threads=fetch_threads)
    reader.add_splits([SequenceSplit(n, end=k) for n, k in catalog.lengths().items()])
    reader.notify_no_more_splits()
    out = ListOutput()

    assert read(reader, out) is InputStatus.END_OF_INPUT
    assert by_split(out) == {"a": list(range(10)), "b": list(range(7)), "d": [0]}
    assert sorted(context.finished_ids()) == ["a", "b", "c", "d"]
    assert reader.snapshot_state(1) == []


def test_reads_splits_from_their_positions(new_reader: NewReader, fetch_threads: int) -> None:
    catalog = SequenceCatalog({"a": 10, "b": 5})
    reader, _, _ = new_reader(catalog, fetch_threads=fetch_threads)
    reader.add_splits([SequenceSplit("a", end=10, position=6), SequenceSplit("b", end=5)])
    reader.notify_no_more_splits()
    out = ListOutput()

    read(reader, out)
    assert by_split(out) == {"a": [6, 7, 8, 9], "b": [0, 1, 2, 3, 4]}


def test_split_added_to_a_running_reader_is_read(new_reader: NewReader, fetch_threads: int) -> None:
    catalog = SequenceCatalog({"a": 5, "b": 4})
    reader, context, _ = new_reader(catalog, fetch_threads=fetch_threads)
    reader.add_splits([SequenceSplit("a")])
    out = ListOutput()
    read(reader, out, until=lambda: len(out) == 5)

    reader.add_splits([SequenceSplit("b", end=4)])
    catalog.append("a", 3)
    read(reader, out, until=lambda: len(out) == 12 and "b" in reader.ended_split_ids())

    assert by_split(out) == {"a": list(range(8)), "b": list(range(4))}
    assert context.finished_ids() == ["b"]
    assert reader.snapshot_state(1) == [SequenceSplit("a", position=8)]


# -- snapshots ------------------------------------------------------------------------------


def test_snapshot_resumes_right_after_the_last_emitted_record(
    new_reader: NewReader, fetch_threads: int
) -> None:
    catalog = SequenceCatalog({"a": 20, "b": 15, "c": 9})
    splits = [SequenceSplit(n, end=k) for n, k in catalog.lengths().items()]
    first, _, _ = new_reader(catalog, fetch_threads=fetch_threads)
    first.add_splits(splits)
    before = ListOutput()
    read(first, before, until=lambda: len(before) >= 8)
    snapshot = first.snapshot_state(1)
    first.close()

    emitted = by_split(before)
    for split in snapshot:  # each split resumes right after its last emitted record
        assert split.position == len(emitted.get(split.name, []))
    second, _, _ = new_reader(catalog, fetch_threads=fetch_threads)
    second.add_splits(snapshot)
    second.notify_no_more_splits()
    after = ListOutput()
    read(second, after)

    union = [*before, *after]
    assert len(union) == len(set(union)), "a record was read twice"
    assert sorted(union) == catalog.records()


def test_snapshot_is_taken_between_polls_and_excludes_records_not_yet_emitted(
    new_reader: NewReader,
) -> None:
    catalog = SequenceCatalog({"a": 10})
    reader, _, _ = new_reader(catalog, Script(fetch_size=4))
    reader.add_splits([SequenceSplit("a")])
    out = ListOutput()

    assert reader.wait_available(WAIT)  # fetched a0..a3, not emitted yet
    assert reader.snapshot_state(1) == [SequenceSplit("a", position=0)]
    assert reader.poll_next(out) is InputStatus.MORE_AVAILABLE
    assert reader.snapshot_state(2) == [SequenceSplit("a", position=4)]


# -- stops ----------------------------------------------------------------------------------


def test_stop_at_is_honoured_exactly(new_reader: NewReader, fetch_threads: int) -> None:
    catalog = SequenceCatalog({"a": 20, "b": 20, "c": 20, "d": 20})
    reader, context, _ = new_reader(catalog, fetch_threads=fetch_threads)
    splits = [
        SequenceSplit("a"),  # unbounded
        SequenceSplit("b", end=20),  # bounded, stopped before its end
        SequenceSplit("c", position=3),  # empty slice [3, 3)
        SequenceSplit("d", position=2),  # stop beyond what exists: waits for records
    ]
    reader.add_splits(splits, stop_at={"a": 12, "b": 5, "c": 3, "d": 25})
    out = ListOutput()

    read(reader, out, until=lambda: reader.finished_split_ids() == {"a", "b", "c"})
    read_more = ListOutput()
    catalog.append("d", 10)
    reader.notify_no_more_splits()
    assert read(reader, read_more) is InputStatus.END_OF_INPUT

    records = by_split([*out, *read_more])
    assert records == {"a": list(range(12)), "b": list(range(5)), "d": list(range(2, 25))}
    assert sorted(reader.snapshot_state(1), key=lambda s: s.name) == [
        SequenceSplit("a", position=12),
        SequenceSplit("b", end=20, position=5),
        SequenceSplit("c", position=3),
        SequenceSplit("d", position=25),
    ]
    assert context.events == [], "a split that only reached its stop did not end"
    assert reader.ended_split_ids() == frozenset()


def test_split_whose_stop_is_its_end_ends(new_reader: NewReader, fetch_threads: int) -> None:
    catalog = SequenceCatalog({"a": 6})
    reader, context, _ = new_reader(catalog, fetch_threads=fetch_threads)
    reader.add_splits([SequenceSplit("a", end=6)], stop_at={"a": 6})
    reader.notify_no_more_splits()

    read(reader, ListOutput())
    assert context.finished_ids() == ["a"]
    assert reader.snapshot_state(1) == []


# -- finished and ended splits -----------------------------------------------------------


def test_ended_split_sends_exactly_one_splits_finished_event(
    new_reader: NewReader, fetch_threads: int
) -> None:
    catalog = SequenceCatalog({"a": 8, "b": 3, "c": 0})
    reader, context, _ = new_reader(catalog, fetch_threads=fetch_threads)
    reader.add_splits([SequenceSplit(n, end=k) for n, k in catalog.lengths().items()])
    reader.notify_no_more_splits()
    out = ListOutput()

    read(reader, out)
    for _ in range(3):
        assert reader.poll_next(out) is InputStatus.END_OF_INPUT
    assert sorted(context.finished_ids()) == ["a", "b", "c"]
    assert all(isinstance(e, SplitsFinishedEvent) for e in context.events)


def test_splits_that_end_in_one_fetch_are_reported_in_one_event(new_reader: NewReader) -> None:
    catalog = SequenceCatalog({"a": 2, "b": 2, "c": 9})
    reader, context, _ = new_reader(catalog)
    reader.add_splits([SequenceSplit(n, end=k) for n, k in catalog.lengths().items()])

    assert reader.poll_next(ListOutput()) is InputStatus.MORE_AVAILABLE
    assert context.events == [SplitsFinishedEvent(("a", "b"))]


def test_finished_event_is_sent_after_the_last_records_of_the_split(
    new_reader: NewReader, fetch_threads: int
) -> None:
    catalog = SequenceCatalog({"a": 5})
    sent_after: list[int] = []
    out = ListOutput()

    class Context(RecordingContext):
        def send_source_event_to_coordinator(self, event: SourceEvent) -> None:
            sent_after.append(len(out))
            super().send_source_event_to_coordinator(event)

    reader, _, _ = new_reader(catalog, context=Context(), fetch_threads=fetch_threads)
    reader.add_splits([SequenceSplit("a", end=5)])
    reader.notify_no_more_splits()
    read(reader, out)
    assert sent_after == [5]


def test_on_split_finished_hook_sees_final_states_once(fetch_threads: int) -> None:
    catalog = SequenceCatalog({"a": 4, "b": 9})
    calls: list[tuple[dict[str, int], frozenset[str]]] = []

    class Reader(SourceReaderBase[Positioned[SequenceRecord], SequenceRecord, SequenceSplit]):
        def on_split_finished(
            self, finished: Mapping[str, SplitState[SequenceSplit]], ended: frozenset[str]
        ) -> None:
            calls.append(({sid: s.position for sid, s in finished.items()}, ended))

    script = Script()
    reader = Reader(
        lambda: ScriptedSplitReader(catalog, script),
        PositionedEmitter(),
        RecordingContext(),
        fetch_threads=fetch_threads,
    )
    try:
        reader.add_splits([SequenceSplit("a", end=4), SequenceSplit("b")], stop_at={"b": 6})
        reader.notify_no_more_splits()
        read(reader, ListOutput())
    finally:
        reader.close()
    merged = {sid: pos for finished, _ in calls for sid, pos in finished.items()}
    assert merged == {"a": 4, "b": 6}
    assert sum(len(finished) for finished, _ in calls) == 2
    assert frozenset().union(*(ended for _, ended in calls)) == {"a"}


# -- removed splits -------------------------------------------------------------------------


def test_splits_removed_event_drops_the_split_without_a_finished_event(
    new_reader: NewReader, fetch_threads: int
) -> None:
    catalog = SequenceCatalog({"a": 5, "b": 3})
    reader, context, script = new_reader(catalog, fetch_threads=fetch_threads)
    reader.add_splits([SequenceSplit("a"), SequenceSplit("b", end=3)])
    out = ListOutput()
    read(reader, out, until=lambda: len(out) == 8)

    reader.handle_source_event(SplitsRemovedEvent(("a", "gone-already")))
    catalog.append("a", 5)
    reader.notify_no_more_splits()

    assert read(reader, out) is InputStatus.END_OF_INPUT
    assert script.wait_until(lambda: script.removed == ["a"]), "split reader still reads 'a'"
    assert by_split(out) == {"a": list(range(5)), "b": list(range(3))}
    assert reader.snapshot_state(1) == []
    assert context.finished_ids() == ["b"]


def test_records_in_flight_for_a_removed_split_are_dropped_even_if_it_is_added_again(
    new_reader: NewReader, fetch_threads: int
) -> None:
    catalog = SequenceCatalog({"a": 10})
    reader, _, _ = new_reader(catalog, fetch_threads=fetch_threads, queue_capacity=4)
    reader.add_splits([SequenceSplit("a")])
    assert reader.wait_available(WAIT)  # a batch of a0.. is fetched and waiting

    reader.handle_source_event(SplitsRemovedEvent(("a",)))
    reader.add_splits([SequenceSplit("a", position=7)])
    out = ListOutput()
    read(reader, out, until=lambda: len(out) >= 3)

    assert by_split(out) == {"a": [7, 8, 9]}


def test_other_source_events_are_ignored(new_reader: NewReader) -> None:
    reader, _, _ = new_reader(SequenceCatalog({"a": 1}))
    reader.add_splits([SequenceSplit("a")])
    reader.handle_source_event(SourceEvent())
    assert reader.snapshot_state(1) == [SequenceSplit("a")]


# -- end of input ---------------------------------------------------------------------------


def test_end_of_input_only_after_no_more_splits_and_all_splits_finished(
    new_reader: NewReader, fetch_threads: int
) -> None:
    catalog = SequenceCatalog({"a": 3, "b": 2})
    reader, _, _ = new_reader(catalog, fetch_threads=fetch_threads)
    reader.add_splits([SequenceSplit("a", end=3), SequenceSplit("b")], stop_at={"b": 4})
    out = ListOutput()

    status = read(reader, out, until=lambda: len(out) == 5 and "a" in reader.ended_split_ids())
    assert status is not InputStatus.END_OF_INPUT  # no notify_no_more_splits yet
    assert reader.poll_next(out) is not InputStatus.END_OF_INPUT
    reader.notify_no_more_splits()
    assert reader.poll_next(out) is not InputStatus.END_OF_INPUT  # "b" waits for records 2, 3

    catalog.append("b", 2)
    assert read(reader, out) is InputStatus.END_OF_INPUT
    assert reader.unfinished_split_ids() == frozenset()
    assert reader.wait_available(WAIT), "at the end, wait_available returns at once"


def test_reader_without_splits_ends_after_no_more_splits(
    new_reader: NewReader, fetch_threads: int
) -> None:
    reader, _, _ = new_reader(SequenceCatalog(), fetch_threads=fetch_threads)
    assert reader.poll_next(ListOutput()) is InputStatus.NOTHING_AVAILABLE
    reader.notify_no_more_splits()
    reader.notify_no_more_splits()  # idempotent
    assert reader.poll_next(ListOutput()) is InputStatus.END_OF_INPUT


def test_wait_available_returns_false_when_nothing_arrives(
    new_reader: NewReader, fetch_threads: int
) -> None:
    catalog = SequenceCatalog({"a": 0})
    reader, _, _ = new_reader(catalog, fetch_threads=fetch_threads, idle_backoff=0.005)
    reader.add_splits([SequenceSplit("a")])
    assert reader.poll_next(ListOutput()) is InputStatus.NOTHING_AVAILABLE
    assert reader.wait_available(0.02) is False


# -- errors ---------------------------------------------------------------------------------


def test_exception_in_fetch_surfaces_from_poll_next_naming_the_split(
    new_reader: NewReader, fetch_threads: int
) -> None:
    error = ConnectionError("broker gone")
    catalog = SequenceCatalog({"a": 5, "b": 5})
    script = Script(fail_fetch={"b": error})
    reader, _, _ = new_reader(catalog, script, fetch_threads=fetch_threads)
    reader.add_splits([SequenceSplit("b")])

    with pytest.raises(ConnectionError) as raised:
        read(reader, ListOutput())
    assert raised.value is error
    assert any("'b'" in note and "fetch()" in note for note in raised.value.__notes__)
    with pytest.raises(ConnectionError):  # the reader stays failed
        reader.poll_next(ListOutput())


def test_exception_in_handle_splits_changes_surfaces_from_poll_next(
    new_reader: NewReader, fetch_threads: int
) -> None:
    error = PermissionError("no access to x")
    script = Script(fail_add={"x": error})
    reader, _, _ = new_reader(SequenceCatalog({"x": 3}), script, fetch_threads=fetch_threads)
    reader.add_splits([SequenceSplit("x")])

    with pytest.raises(PermissionError) as raised:
        read(reader, ListOutput())
    assert raised.value is error
    assert any("'x'" in note for note in raised.value.__notes__)


def test_exception_in_emit_names_the_split_and_position(new_reader: NewReader) -> None:
    class Failing(RecordEmitter[Positioned[SequenceRecord], SequenceRecord, SequenceSplit]):
        def emit(
            self,
            element: Positioned[SequenceRecord],
            output: ReaderOutput[SequenceRecord],
            state: SplitState[SequenceSplit],
        ) -> None:
            if element.value[1] == 2:
                raise ValueError("bad record")
            PositionedEmitter[SequenceRecord, SequenceSplit]().emit(element, output, state)

    catalog = SequenceCatalog({"a": 5})
    reader = SourceReaderBase(
        lambda: ScriptedSplitReader(catalog, Script()), Failing(), RecordingContext()
    )
    reader.add_splits([SequenceSplit("a")])
    out = ListOutput()
    with pytest.raises(ValueError, match="bad record") as raised:
        reader.poll_next(out)
    reader.close()
    assert out == [("a", 0), ("a", 1)]
    assert any("'a' at position 2" in note for note in raised.value.__notes__)


def test_split_reader_returning_records_past_the_stop_is_a_contract_violation(
    new_reader: NewReader, fetch_threads: int
) -> None:
    script = Script(ignore_stop=True, fetch_size=5)
    reader, _, _ = new_reader(SequenceCatalog({"a": 9}), script, fetch_threads=fetch_threads)
    reader.add_splits([SequenceSplit("a")], stop_at={"a": 3})

    with pytest.raises(
        ContractViolation, match=r"'a' moved from 3 to 4, beyond its slice's stop 3"
    ):
        read(reader, ListOutput())


def test_emitter_moving_a_split_backwards_is_a_contract_violation(new_reader: NewReader) -> None:
    class Backwards(RecordEmitter[Positioned[SequenceRecord], SequenceRecord, SequenceSplit]):
        def emit(
            self,
            element: Positioned[SequenceRecord],
            output: ReaderOutput[SequenceRecord],
            state: SplitState[SequenceSplit],
        ) -> None:
            output.collect(element.value)
            state.position = 0

    catalog = SequenceCatalog({"a": 9})
    reader = SourceReaderBase(
        lambda: ScriptedSplitReader(catalog, Script()), Backwards(), RecordingContext()
    )
    reader.add_splits([SequenceSplit("a", position=4)])
    with pytest.raises(ContractViolation, match="moved split 'a' back from 4 to 0"):
        reader.poll_next(ListOutput())
    reader.close()


def test_split_reported_finished_before_its_stop_is_a_contract_violation(
    new_reader: NewReader,
) -> None:
    class QuitsEarly(ScriptedSplitReader):
        def fetch(self):  # type: ignore[no-untyped-def]
            batch = super().fetch()
            batch.mark_finished("a")
            return batch

    catalog = SequenceCatalog({"a": 9})
    reader = SourceReaderBase(
        lambda: QuitsEarly(catalog, Script()), PositionedEmitter(), RecordingContext()
    )
    reader.add_splits([SequenceSplit("a")], stop_at={"a": 8})
    with pytest.raises(ContractViolation, match="'a' finished at position 3, but its slice stops"):
        reader.poll_next(ListOutput())
    reader.close()


def test_a_slice_cut_before_its_stop_finishes_and_tells_where_it_ended(
    new_reader: NewReader,
) -> None:
    class CutsEarly(ScriptedSplitReader):
        def fetch(self):  # type: ignore[no-untyped-def]
            batch = super().fetch()
            batch.mark_cut("a")
            return batch

    catalog = SequenceCatalog({"a": 9})
    context = RecordingContext()
    reader = SourceReaderBase(lambda: CutsEarly(catalog, Script()), PositionedEmitter(), context)
    reader.add_splits([SequenceSplit("a")], stop_at={"a": 8})
    output = ListOutput()
    read_until_idle(reader, output)
    reader.close()

    assert [e for e in context.events if isinstance(e, SliceEndedEvent)] == [
        SliceEndedEvent("a", 3)
    ]
    assert context.finished_ids() == []  # the split did not end


def test_split_reader_returning_a_split_it_does_not_hold_is_a_contract_violation(
    new_reader: NewReader, fetch_threads: int
) -> None:
    class Stray(ScriptedSplitReader):
        def fetch(self):  # type: ignore[no-untyped-def]
            batch = super().fetch()
            batch.add("zzz", Positioned(("zzz", 0), 1))
            return batch

    catalog = SequenceCatalog({"a": 9})
    reader = SourceReaderBase(
        lambda: Stray(catalog, Script()),
        PositionedEmitter(),
        RecordingContext(),
        fetch_threads=fetch_threads,
    )
    try:
        reader.add_splits([SequenceSplit("a")])
        with pytest.raises(ContractViolation, match="'zzz' that it does not hold"):
            read(reader, ListOutput())
    finally:
        reader.close()


# -- misuse ---------------------------------------------------------------------------------


def test_adding_an_owned_or_ended_split_again_is_an_ownership_error(new_reader: NewReader) -> None:
    catalog = SequenceCatalog({"a": 2, "b": 1})
    reader, _, _ = new_reader(catalog)
    reader.add_splits([SequenceSplit("a"), SequenceSplit("b", end=1)])
    read(reader, ListOutput(), until=lambda: "b" in reader.ended_split_ids())

    for again in (["a"], ["b"], ["c", "c"]):
        with pytest.raises(SplitOwnershipError) as raised:
            reader.add_splits([SequenceSplit(name) for name in again])
        assert raised.value.split_ids == (again[0],)


def test_add_splits_after_no_more_splits_is_a_contract_violation(new_reader: NewReader) -> None:
    reader, _, _ = new_reader(SequenceCatalog({"a": 1}))
    reader.notify_no_more_splits()
    with pytest.raises(ContractViolation, match="after notify_no_more_splits"):
        reader.add_splits([SequenceSplit("a")])


@pytest.mark.parametrize(
    ("stops", "message"),
    [({"a": 2}, "stops at 2, before the split's position 5"), ({"b": 9}, "not being added")],
)
def test_bad_stop_at_is_a_contract_violation(
    new_reader: NewReader, stops: dict[str, int], message: str
) -> None:
    reader, _, _ = new_reader(SequenceCatalog({"a": 9}))
    with pytest.raises(ContractViolation, match=message):
        reader.add_splits([SequenceSplit("a", position=5)], stop_at=stops)


@pytest.mark.parametrize(
    ("option", "value"),
    [("fetch_threads", -1), ("fetch_threads", True), ("queue_capacity", 0), ("idle_backoff", 0)],
)
def test_invalid_options_are_configuration_errors(option: str, value: object) -> None:
    with pytest.raises(ConfigurationError) as raised:
        SourceReaderBase(
            lambda: ScriptedSplitReader(SequenceCatalog(), Script()),
            PositionedEmitter(),
            RecordingContext(),
            **{option: value},  # type: ignore[arg-type]
        )
    assert raised.value.option == option


def test_poll_after_close_is_a_contract_violation(new_reader: NewReader) -> None:
    reader, _, _ = new_reader(SequenceCatalog())
    reader.close()
    reader.close()  # idempotent
    with pytest.raises(ContractViolation, match="closed"):
        reader.poll_next(ListOutput())


# -- waking ---------------------------------------------------------------------------------


def test_wake_up_unblocks_wait_available_in_a_blocking_fetch(new_reader: NewReader) -> None:
    script = Script(block_when_idle=True)
    reader, _, _ = new_reader(SequenceCatalog({"a": 0}), script)
    reader.add_splits([SequenceSplit("a")])

    def wake_when_blocked() -> None:
        script.blocked.wait(WAIT)
        reader.wake_up()

    waker = threading.Thread(target=wake_when_blocked)
    waker.start()
    started = time.monotonic()
    assert reader.wait_available(WAIT) is False
    waker.join()
    assert time.monotonic() - started < WAIT / 2
    assert not script.unwoken
