"""Reader events reach the enumerator once per completed batch; enumerator events reach the
next batch's tasks of their slot. Driven through the planner, without Spark."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from splitflow.api.assigner import AssignerState
from splitflow.api.enumerator import SplitEnumerator, SplitEnumeratorContext
from splitflow.api.events import SourceEvent
from splitflow.errors import CheckpointStateError, ConfigurationError
from splitflow.spark.events import EventStore
from splitflow.spark.limits import MaxRecords, ReadAll
from splitflow.spark.planner import Planner
from splitflow.testing import SequenceCatalog, SequenceSource, SequenceSplit
from splitflow.testing.sequence import SequenceEnumerator

HANDLED: list[tuple[int, int]] = []


@dataclass(frozen=True)
class Ping(SourceEvent):
    n: int


class PingEnumerator(SequenceEnumerator):
    """Records every Ping and answers the sending slot with Ping(n + 1)."""

    def handle_source_event(self, reader_id: int, event: SourceEvent) -> None:
        if isinstance(event, Ping):
            HANDLED.append((reader_id, event.n))
            self.context.send_event_to_source_reader(reader_id, Ping(event.n + 1))
        super().handle_source_event(reader_id, event)


class PingSource(SequenceSource):
    def create_enumerator(
        self, context: SplitEnumeratorContext[SequenceSplit]
    ) -> SplitEnumerator[SequenceSplit, AssignerState[SequenceSplit]]:
        return PingEnumerator(self, context, None)

    def restore_enumerator(
        self, context: SplitEnumeratorContext[SequenceSplit], state: AssignerState[SequenceSplit]
    ) -> SplitEnumerator[SequenceSplit, AssignerState[SequenceSplit]]:
        return PingEnumerator(self, context, state)


def roundtrip(offset: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads(json.dumps(offset)))  # as Spark stores it


def setup(tmp_path: Path) -> tuple[SequenceCatalog, PingSource, Planner[Any, Any]]:
    HANDLED.clear()
    catalog = SequenceCatalog({"a": 100, "b": 100})
    source = PingSource(catalog)
    return catalog, source, Planner(source, 2, clock=lambda: 0.0, state_dir=str(tmp_path))


def test_event_store_keeps_one_copy_per_task_and_forgets_applied_batches(tmp_path: Path) -> None:
    store = EventStore(str(tmp_path))
    store.write(3, 1, slot=0, events=[Ping(1)])
    store.write(3, 1, slot=0, events=[Ping(1)])  # a retried attempt
    store.write(3, 0, slot=1, events=[Ping(7), Ping(8)])
    assert store.read(3)[1] == [(1, Ping(7)), (1, Ping(8)), (0, Ping(1))]
    store.write(4, 0, slot=0, events=[Ping(2)])
    store.keep_from(4)  # Spark keeps no offset before batch 4's
    assert store.read(3)[1] == []
    assert store.read(4)[1] == [(0, Ping(2))]


def test_events_stay_while_spark_keeps_their_offset_and_a_restore_drops_later_ones(
    tmp_path: Path,
) -> None:
    """Batches 1 to 6 ran; Spark keeps the offsets from batch 3 on. Rolled back to batch 4
    (its commit kept: no task of it runs again), planning batch 5 reads batch 4's events as
    left; batch 5 and 6's are from tasks of offsets that are gone, and the batch 5 planned
    anew may have fewer tasks, so none of the old ones may stay beside its own."""
    store = EventStore(str(tmp_path))
    for seq in range(1, 7):
        store.write(seq, 0, slot=0, events=[Ping(seq)])
        store.write(seq, 1, slot=1, events=[Ping(10 * seq)])
    store.keep_from(3)
    assert sorted(p.name for p in (tmp_path / "events").iterdir()) == ["3", "4", "5", "6"]
    restored = EventStore(str(tmp_path))
    restored.resume_at(4)
    assert restored.read(4)[1] == [(0, Ping(4)), (1, Ping(40))]
    assert restored.read(5)[1] == []
    restored.write(5, 0, slot=0, events=[Ping(99)])  # batch 5 planned anew: one task
    assert restored.read(5)[1] == [(0, Ping(99))]
    restored.keep_from(5)  # knows batch 3 is the oldest left, without listing again
    assert sorted(p.name for p in (tmp_path / "events").iterdir()) == ["5"]


def test_a_state_directory_that_cannot_be_written_fails_naming_the_file(tmp_path: Path) -> None:
    """A full or read-only disk, or a path that is not a folder: the task's write fails
    with an error naming option stateDir and the file, and leaves no partial file."""
    from splitflow.errors import CheckpointStateError
    from splitflow.spark.ledger import LedgerStore

    state = tmp_path / "state"
    state.write_text("a file where the folder should be")
    with pytest.raises(CheckpointStateError) as error:
        EventStore(str(state)).write(1, 0, slot=0, events=[Ping(1)])
    assert "option stateDir: cannot write" in str(error.value)
    assert error.value.path == str(state / "events" / "1" / "000000")
    with pytest.raises(CheckpointStateError, match=f"cannot write {state}/ledger/"):
        LedgerStore(str(state)).write(1, frozenset({"a"}))


def test_reader_events_that_cannot_be_read_back_fail_naming_the_file(tmp_path: Path) -> None:
    """Events written by another version (a class since renamed) or altered on disk."""
    from splitflow.errors import CheckpointStateError

    store = EventStore(str(tmp_path))
    store.write(5, 0, slot=0, events=[Ping(1)])
    written = tmp_path / "events" / "5" / "000000"
    written.write_bytes(written.read_bytes().replace(b"Ping", b"Pong"))
    with pytest.raises(CheckpointStateError) as error:
        store.read(5)
    assert error.value.path == str(written)
    assert f"option stateDir: cannot read the reader events in {written} (AttributeError" in str(
        error.value
    )


def test_reader_events_reach_the_enumerator_once_per_completed_batch(tmp_path: Path) -> None:
    _, source, planner = setup(tmp_path)
    start = roundtrip(planner.initial_offset())
    end1 = roundtrip(planner.latest_offset(start, MaxRecords(10)))
    store = EventStore(str(tmp_path))
    store.write(1, 0, slot=0, events=[Ping(10)])
    store.write(1, 0, slot=0, events=[Ping(10)])  # task retried: same file, same events
    assert HANDLED == []  # batch 1 has not completed yet as far as the planner knows
    end2 = roundtrip(planner.latest_offset(end1, MaxRecords(10)))
    assert HANDLED == [(0, 10)]
    assert end2["events_through"] == 1
    planner.commit(end1)
    planner.latest_offset(end2, MaxRecords(10))
    assert HANDLED == [(0, 10)]  # never twice

    # A driver crash after end2 was written: a new planner restores from end2, which says
    # batch 1's events are in its enumerator state: they are not applied again.
    HANDLED.clear()
    again: Planner[Any, Any] = Planner(source, 2, clock=lambda: 0.0, state_dir=str(tmp_path))
    again.latest_offset(end2, MaxRecords(10))
    assert HANDLED == []
    # A crash before end2 was written: restoring from end1 applies batch 1's events once.
    replay: Planner[Any, Any] = Planner(source, 2, clock=lambda: 0.0, state_dir=str(tmp_path))
    replay.latest_offset(end1, MaxRecords(10))
    assert HANDLED == [(0, 10)]


def test_events_of_a_slot_a_rescale_removed_still_reach_the_enumerator(tmp_path: Path) -> None:
    """A driver dies after batch 1 ran on slots 0 and 1 and before batch 2 was planned; the
    query restarts with parallelism 1. Batch 1's events from slot 1 are facts of a completed
    batch: they reach the enumerator (as from slot 0, the one left), once. Found by the
    fault schedules (files, seed 2: 'reader 1 is not registered')."""
    _, source, planner = setup(tmp_path)
    start = roundtrip(planner.initial_offset())
    end1 = roundtrip(planner.latest_offset(start, MaxRecords(10)))
    EventStore(str(tmp_path)).write(1, 1, slot=1, events=[Ping(4)])
    HANDLED.clear()
    smaller: Planner[Any, Any] = Planner(source, 1, clock=lambda: 0.0, state_dir=str(tmp_path))
    end2 = roundtrip(smaller.latest_offset(end1, MaxRecords(10)))
    assert HANDLED == [(0, 4)]
    assert end2["events_through"] == 1
    smaller.latest_offset(end2, MaxRecords(10))
    assert HANDLED == [(0, 4)]


def after_reader_1_sent_ping_1(
    tmp_path: Path,
) -> tuple[PingSource, Planner[Any, Any], dict[str, Any]]:
    """Batch 1 planned (its end offset returned) and completed, reader 1 having sent Ping(1)."""
    _, source, planner = setup(tmp_path)
    start = roundtrip(planner.initial_offset())
    end1 = roundtrip(planner.latest_offset(start, MaxRecords(10)))
    EventStore(str(tmp_path)).write(1, 0, slot=1, events=[Ping(1)])
    return source, planner, end1


def test_enumerator_events_travel_to_the_next_batch_of_their_slot(tmp_path: Path) -> None:
    source, planner, end1 = after_reader_1_sent_ping_1(tmp_path)
    end2 = planner.read_offset(roundtrip(planner.latest_offset(end1, MaxRecords(10))))
    assert end2.to_readers == {1: (Ping(2),)}
    assert end2.has_tasks(1)
    end3 = planner.read_offset(
        roundtrip(planner.latest_offset(end2.encode(source), MaxRecords(10)))
    )
    assert end3.to_readers == {}  # delivered with batch 2's tasks, not again


def test_tasks_that_left_no_events_are_named_in_a_warning(tmp_path: Path, caplog: Any) -> None:
    """Every task writes its events, none or some: a slot of a completed batch with tasks and
    nothing written (executors writing to their own local stateDir on a cluster, or a sink
    that read part of the batch) is named in a warning; a batch whose tasks all wrote is not."""
    caplog.set_level(logging.WARNING, logger="splitflow")
    _, _, planner = setup(tmp_path)
    start = roundtrip(planner.initial_offset())
    end1 = roundtrip(planner.latest_offset(start, MaxRecords(10)))
    EventStore(str(tmp_path)).write(1, 0, slot=0, events=[])
    end2 = roundtrip(planner.latest_offset(end1, MaxRecords(10)))
    (warning,) = [r.getMessage() for r in caplog.records if "left no reader events" in r.message]
    assert "batch 1 completed, but the tasks of slot(s) 1 left" in warning
    assert str(tmp_path / "events") in warning
    caplog.clear()
    for index, slot in enumerate((0, 1)):
        EventStore(str(tmp_path)).write(2, index, slot=slot, events=[])
    planner.latest_offset(end2, MaxRecords(10))
    assert not [r for r in caplog.records if "left no reader events" in r.getMessage()]


class NeedyPingSource(PingSource):
    @property
    def needs_reader_events(self) -> bool:
        return True


def test_a_source_that_needs_reader_events_fails_when_tasks_left_none(tmp_path: Path) -> None:
    """A CDC snapshot whose chunk watermarks were lost would never start its log: for a
    source that needs its readers' events, missing ones fail the query, naming stateDir."""
    source = NeedyPingSource(SequenceCatalog({"a": 100, "b": 100}))
    planner: Planner[Any, Any] = Planner(source, 2, clock=lambda: 0.0, state_dir=str(tmp_path))
    start = roundtrip(planner.initial_offset())
    end1 = roundtrip(planner.latest_offset(start, MaxRecords(10)))
    for index, slot in enumerate((0, 1)):
        EventStore(str(tmp_path)).write(1, index, slot=slot, events=[])
    end2 = roundtrip(planner.latest_offset(end1, MaxRecords(10)))  # every task wrote: fine
    EventStore(str(tmp_path)).write(2, 0, slot=0, events=[])
    with pytest.raises(
        CheckpointStateError, match=r"batch 2 completed, but the tasks of slot\(s\) 1"
    ):
        planner.latest_offset(end2, MaxRecords(10))


def test_an_event_in_an_offset_that_no_longer_loads_fails_naming_its_batch(
    tmp_path: Path,
) -> None:
    """A connector renamed its event class while an offset carried one (here: Ping -> Pong)."""
    import base64

    from splitflow.errors import IncompatibleCheckpointError

    _, planner, end1 = after_reader_1_sent_ping_1(tmp_path)
    end2 = roundtrip(planner.latest_offset(end1, MaxRecords(10)))
    (event,) = end2["to_readers"]["1"]
    renamed = base64.b64decode(event).replace(b"Ping", b"Pong")
    end2["to_readers"]["1"] = [base64.b64encode(renamed).decode("ascii")]
    with pytest.raises(IncompatibleCheckpointError) as error:
        planner.read_offset(end2)
    message = str(error.value)
    assert message.startswith(
        f"events to reader 1 in the splitflow offset of batch {end2['seq']}: "
        "found an event that does not load "
    ), message
    assert "AttributeError: Can't get attribute 'Pong'" in message


def test_an_enumerator_event_waits_for_a_batch_where_its_slot_has_a_task(tmp_path: Path) -> None:
    catalog, source, planner = setup(tmp_path)
    start = roundtrip(planner.initial_offset())
    end1 = roundtrip(planner.latest_offset(start, ReadAll()))  # reads all 200: nothing left
    EventStore(str(tmp_path)).write(1, 0, slot=0, events=[Ping(5)])
    catalog.append("b", 3)  # only slot 1's split has data in batch 2
    offset2 = planner.read_offset(roundtrip(planner.latest_offset(end1, ReadAll())))
    owner_of_b = next(i for i, slot in enumerate(offset2.slots) if slot[0].split.name == "b")
    assert owner_of_b == 1
    assert offset2.to_readers == {0: (Ping(6),)}
    assert not offset2.has_tasks(0)
    catalog.append("a", 2)
    offset3 = planner.read_offset(
        roundtrip(planner.latest_offset(offset2.encode(source), ReadAll()))
    )
    assert offset3.has_tasks(0)
    assert offset3.to_readers == {0: (Ping(6),)}  # carried over to a batch that runs slot 0


def test_a_slot_cut_into_several_tasks_gets_its_events_in_its_first_task_only(
    tmp_path: Path,
) -> None:
    from splitflow.spark.datasource import _partitions
    from splitflow.spark.events import decode_events
    from splitflow.spark.options import RuntimeOptions

    source, planner, end1 = after_reader_1_sent_ping_1(tmp_path)
    end2 = planner.read_offset(roundtrip(planner.latest_offset(end1, ReadAll())))
    tasks = _partitions(source, end2, RuntimeOptions(max_records_per_task=10))
    slot1 = [t for t in tasks if t.slot == 1]
    assert len(slot1) > 1
    assert [decode_events(t.events, "test") for t in slot1] == [[Ping(2)]] + [[]] * (len(slot1) - 1)


# -- one query per state directory ---------------------------------------------------------------


def planner_on(source: PingSource, state: Path) -> Planner[Any, Any]:
    return Planner(source, 2, clock=lambda: 0.0, state_dir=str(state))


def test_a_second_query_is_refused_a_state_directory_in_use(tmp_path: Path) -> None:
    _, source, first = setup(tmp_path)
    start = roundtrip(first.initial_offset())
    end1 = roundtrip(first.latest_offset(start, MaxRecords(10)))
    first.latest_offset(end1, MaxRecords(10))
    first.commit(end1)  # a batch committed: the directory is this query's for good
    second = planner_on(source, tmp_path)
    with pytest.raises(ConfigurationError) as error:  # when it plans its first batch
        second.latest_offset(roundtrip(second.initial_offset()), MaxRecords(10))
    assert error.value.option == "stateDir"
    assert f"option stateDir: {tmp_path} is in use by another query, or was" in str(error.value)


def test_a_query_whose_directory_another_took_stops_at_its_next_batch(tmp_path: Path) -> None:
    """Both started afresh, the second before the first committed anything: the second
    takes the directory, the first fails when it plans, before mixing their events."""
    _, source, first = setup(tmp_path)
    start = roundtrip(first.initial_offset())
    end1 = roundtrip(first.latest_offset(start, MaxRecords(10)))
    second = planner_on(source, tmp_path)
    second.latest_offset(roundtrip(second.initial_offset()), MaxRecords(10))
    with pytest.raises(ConfigurationError, match="was taken by another query while this one ran"):
        first.latest_offset(end1, MaxRecords(10))


def test_a_second_query_started_during_the_first_s_first_batch_is_refused(
    tmp_path: Path,
) -> None:
    """Spark wrote batch 1's offset and asked for its partitions; its commit reaches the
    planner only with the next batch, a trigger later. A second query started meanwhile on
    the same directory is refused, and the first plans on (an end-to-end test found the
    second taking the directory once query starts got faster)."""
    _, source, first = setup(tmp_path)
    start = roundtrip(first.initial_offset())
    end1 = roundtrip(first.latest_offset(start, MaxRecords(10)))
    first.planned(end1)  # Spark's partitions(start, end1)
    second = planner_on(source, tmp_path)
    with pytest.raises(ConfigurationError, match="is in use by another query"):
        second.latest_offset(roundtrip(second.initial_offset()), MaxRecords(10))
    assert first.latest_offset(end1, MaxRecords(10))["owner"] == end1["owner"]


def test_a_restart_keeps_its_directory_and_an_offset_of_another_query_is_refused(
    tmp_path: Path,
) -> None:
    _, source, first = setup(tmp_path / "a")
    start = roundtrip(first.initial_offset())
    end1 = roundtrip(first.latest_offset(start, MaxRecords(10)))
    end2 = roundtrip(first.latest_offset(end1, MaxRecords(10)))
    first.commit(end1)
    again = planner_on(source, tmp_path / "a")  # a restart from its own offset
    assert again.latest_offset(end2, MaxRecords(10))["owner"] == end2["owner"]
    other = planner_on(source, tmp_path / "b")
    other.latest_offset(roundtrip(other.initial_offset()), MaxRecords(10))
    with pytest.raises(ConfigurationError, match="belongs to another query than this checkpoint"):
        planner_on(source, tmp_path / "b").latest_offset(end2, MaxRecords(10))


def test_a_crash_before_the_first_commit_does_not_lock_the_query_out(tmp_path: Path) -> None:
    """Spark wrote batch 0's offset, then the driver died before its commit. The restart
    asks for the initial offset again (a fresh start of the planner) to replay batch 0,
    then plans batch 1 from batch 0's offset: the directory is still the query's (a review
    found the first version of the owner token refusing it, for good)."""
    _, source, first = setup(tmp_path)
    start = roundtrip(first.initial_offset())
    end1 = roundtrip(first.latest_offset(start, MaxRecords(10)))  # Spark's offsets/0
    again = planner_on(source, tmp_path)
    again.initial_offset()  # Spark replays batch 0 from the initial offset
    end2 = roundtrip(again.latest_offset(end1, MaxRecords(10)))
    assert end2["owner"] == end1["owner"]
    again.commit(end1)
    assert planner_on(source, tmp_path).latest_offset(end2, MaxRecords(10))["seq"] == 3


def test_a_first_start_that_died_before_any_commit_leaves_the_directory_free(
    tmp_path: Path,
) -> None:
    """The driver died after claiming the directory, before Spark recorded an offset: the
    query starts afresh again and must not find its directory locked."""
    _, source, first = setup(tmp_path)
    end1 = roundtrip(first.latest_offset(roundtrip(first.initial_offset()), MaxRecords(10)))
    fresh = planner_on(source, tmp_path)
    offset = roundtrip(fresh.latest_offset(roundtrip(fresh.initial_offset()), MaxRecords(10)))
    assert offset["owner"] != end1["owner"]


def test_a_checkpoint_of_a_splitflow_without_owner_tokens_takes_its_directory(
    tmp_path: Path,
) -> None:
    """Offsets and a state directory of a splitflow before the owner token: the restored
    query draws a token and takes the directory."""
    _, source, first = setup(tmp_path)
    start = roundtrip(first.initial_offset())
    end1 = roundtrip(first.latest_offset(start, MaxRecords(10)))
    first_owner = end1.pop("owner")
    (tmp_path / "owner.json").unlink()
    end2 = roundtrip(planner_on(source, tmp_path).latest_offset(end1, MaxRecords(10)))
    assert end2["owner"] not in (None, first_owner)
