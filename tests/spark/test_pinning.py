"""The runtime's side of :class:`~splitflow.api.source.ReadPinner`, driven as Spark drives it.

Spark asks for a batch's tasks (``partitions``) for each evaluation of the batch, and again
for a batch it replays after a restart without planning it. Every task of the batch must get
the batch's pin first; the pin is held until the batch completed (the next batch is planned,
or the batch is committed) and released when the query run ends.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.spark.test_planner import FakeClock, as_spark_stores_it

from splitflow.api.events import SourceEvent
from splitflow.api.source import ReadPinner, SupportsPinnedReads
from splitflow.spark.datasource import _partitions
from splitflow.spark.events import decode_events
from splitflow.spark.limits import MaxRecords, ReadAll
from splitflow.spark.options import RuntimeOptions
from splitflow.spark.planner import Planner
from splitflow.testing.sequence import SequenceCatalog, SequenceSource, SequenceSplit


@dataclass(frozen=True)
class Pin(SourceEvent):
    batch: int
    generation: int


class RecordingPinner(ReadPinner[SequenceSplit]):
    def __init__(self, log: list[tuple[Any, ...]], made: int = 0) -> None:
        self.log = log
        self.held: dict[int, Pin] = {}
        self.made = made  # pins made so far: the next one's generation is made + 1

    def pin(self, batch: int, splits: Sequence[SequenceSplit]) -> Pin:
        self.log.append(("pin", batch, sorted((s.split_id, s.position) for s in splits)))
        if batch not in self.held:
            self.made += 1
            self.held[batch] = Pin(batch, self.made)
        return self.held[batch]

    def release(self, through_batch: int) -> None:
        self.log.append(("release", through_batch))
        for batch in [b for b in self.held if b <= through_batch]:
            del self.held[batch]


class PinnedSequenceSource(SequenceSource, SupportsPinnedReads[SequenceSplit]):
    pinner_type: type[RecordingPinner] = RecordingPinner

    def __init__(
        self, catalog: SequenceCatalog, log: list[tuple[Any, ...]], generations: int = 0
    ) -> None:
        super().__init__(catalog)
        self.log = log
        self.generations = generations  # a driver's pins count from here
        self.pinners: list[RecordingPinner] = []

    def create_read_pinner(self) -> RecordingPinner:
        pinner = self.pinner_type(self.log, self.generations)
        self.pinners.append(pinner)
        return pinner


class ResumingPinner(RecordingPinner):
    """A pin that outlives its driver (a log position): a replay resumes it."""

    def resume(self, batch: int, splits: Sequence[SequenceSplit], pinned: SourceEvent) -> Pin:
        self.log.append(("resume", batch, pinned))
        assert isinstance(pinned, Pin)
        self.held[batch] = pinned
        return pinned


class ResumingSequenceSource(PinnedSequenceSource):
    pinner_type = ResumingPinner


def make(
    log: list[tuple[Any, ...]],
    state_dir: Path | None = None,
    source_type: type[PinnedSequenceSource] = PinnedSequenceSource,
    generations: int = 0,
) -> tuple[PinnedSequenceSource, Planner[Any, Any]]:
    catalog = SequenceCatalog({"a": 10, "b": 10})
    source = source_type(catalog, log, generations)
    return source, Planner(source, 2, clock=FakeClock(), state_dir=state_dir and str(state_dir))


def test_every_task_of_a_batch_gets_the_batch_pin_first_in_every_evaluation() -> None:
    log: list[tuple[Any, ...]] = []
    source, planner = make(log)
    start = as_spark_stores_it(planner.initial_offset())
    end = as_spark_stores_it(planner.latest_offset(start, MaxRecords(6)))
    runtime = RuntimeOptions.parse({"maxrecordspertask": "2"})
    evaluations = []
    for _ in range(2):  # two actions on the batch: Spark asks for its tasks twice
        batch = planner.planned(end)
        tasks = _partitions(source, batch, runtime, planner.pin(batch))
        evaluations.append([decode_events(t.events, "test")[0] for t in tasks])
    assert len(evaluations[0]) == 4  # 3 records per slot, at most 2 per task
    assert evaluations[0] == evaluations[1] == [Pin(1, 1)] * 4
    assert log[0] == ("pin", 1, [("a", 0), ("b", 0)])
    planner.close()


def test_a_batch_pin_is_released_when_the_next_batch_is_planned_or_it_is_committed() -> None:
    log: list[tuple[Any, ...]] = []
    source, planner = make(log)
    start = as_spark_stores_it(planner.initial_offset())
    end = as_spark_stores_it(planner.latest_offset(start, MaxRecords(4)))
    planner.pin(planner.planned(end))
    (pinner,) = source.pinners
    assert list(pinner.held) == [1]
    planner.latest_offset(end, MaxRecords(4))  # batch 1 completed
    assert pinner.held == {}
    assert ("release", 1) in log
    planner.commit(end)
    assert log[-1] == ("release", 1)
    planner.close()


def test_a_replayed_batch_is_pinned_anew_by_the_restarted_driver() -> None:
    """After a crash, Spark asks the new runner for the batch's tasks without planning it."""
    log: list[tuple[Any, ...]] = []
    source, planner = make(log)
    start = as_spark_stores_it(planner.initial_offset())
    end = as_spark_stores_it(planner.latest_offset(start, MaxRecords(4)))
    first = planner.pin(planner.planned(end))
    # the driver dies; a new runner process gets a new source and planner
    restarted_source, restarted = make(log)
    replay = restarted.planned(end)
    again = restarted.pin(replay)
    assert again == Pin(1, 1)  # the new process's first pin: a new one
    assert restarted_source.pinners[0] is not source.pinners[0]
    assert first is not again
    restarted.close()
    assert restarted_source.pinners[0].held == {}


def test_with_a_state_dir_a_replayed_batch_resumes_the_pin_its_first_reads_had(
    tmp_path: Path,
) -> None:
    """The pin is kept with the batch's events before any task gets it; the restarted
    driver hands it to the pinner's resume, and a pin that outlives its driver stays."""
    log: list[tuple[Any, ...]] = []
    _, planner = make(log, tmp_path, ResumingSequenceSource)
    start = as_spark_stores_it(planner.initial_offset())
    end = as_spark_stores_it(planner.latest_offset(start, MaxRecords(4)))
    first = planner.pin(planner.planned(end))
    assert first == Pin(1, 1)
    assert (tmp_path / "events" / "1" / "pin.json").exists()

    _, restarted = make(log, tmp_path, ResumingSequenceSource, generations=100)
    again = restarted.pin(restarted.planned(end))
    assert again == first
    assert ("resume", 1, first) in log
    assert restarted.pin(restarted.planned(end)) == first  # later evaluations: held
    assert [entry[0] for entry in log].count("resume") == 1
    restarted.close()
    planner.close()


def test_a_pin_that_ends_with_its_driver_is_taken_anew_and_kept_in_its_place(
    tmp_path: Path,
) -> None:
    """``ReadPinner.resume``'s default pins anew (an exported snapshot died with the driver);
    the new pin replaces the kept one, for a later replay."""
    log: list[tuple[Any, ...]] = []
    _, planner = make(log, tmp_path)
    start = as_spark_stores_it(planner.initial_offset())
    end = as_spark_stores_it(planner.latest_offset(start, MaxRecords(4)))
    first = planner.pin(planner.planned(end))
    _, restarted = make(log, tmp_path, generations=100)
    again = restarted.pin(restarted.planned(end))
    assert (first, again) == (Pin(1, 1), Pin(1, 101))
    kept = json.loads((tmp_path / "events" / "1" / "pin.json").read_text())
    assert decode_events(kept, "pin") == [again]
    restarted.close()
    planner.close()


def test_a_batch_that_reads_nothing_pins_nothing_and_close_releases_all() -> None:
    log: list[tuple[Any, ...]] = []
    source, planner = make(log)
    start = as_spark_stores_it(planner.initial_offset())
    assert planner.pin(planner.planned(start)) is None  # batch 0 reads nothing
    assert source.pinners == []
    end = as_spark_stores_it(planner.latest_offset(start, ReadAll()))
    planner.pin(planner.planned(end))
    planner.close()
    assert source.pinners[0].held == {}


def test_a_source_without_pins_gets_tasks_without_a_pin_event() -> None:
    source = SequenceSource(SequenceCatalog({"a": 5}))
    planner: Planner[Any, Any] = Planner(source, 1, clock=FakeClock())
    start = as_spark_stores_it(planner.initial_offset())
    end = as_spark_stores_it(planner.latest_offset(start, ReadAll()))
    batch = planner.planned(end)
    assert planner.pin(batch) is None
    (task,) = _partitions(source, batch, RuntimeOptions.parse({}), planner.pin(batch))
    assert decode_events(task.events, "test") == []
    planner.close()
