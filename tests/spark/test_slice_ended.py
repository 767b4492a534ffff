"""A reader that ends a slice before its stop (``SliceEndedEvent``, a CDC log at a schema
change): the planner starts the split's next slice where it ended, in the batch it plans
next and after a restart from the batch's offset, whose events it applies again."""

from __future__ import annotations

from pathlib import Path

from tests.spark.test_planner import DISCOVERY, FakeClock, Query

from splitflow.api.events import SliceEndedEvent
from splitflow.spark.offset import plan_partitions
from splitflow.spark.planner import Planner
from splitflow.testing.sequence import SequenceCatalog, SequenceSource


def planner(catalog: SequenceCatalog, clock: FakeClock, state: Path) -> Planner[object, object]:
    source = SequenceSource(catalog, discovery_interval=DISCOVERY)
    return Planner(source, 1, clock=clock, state_dir=str(state))


def starts(end: dict[str, object], driver: Planner[object, object]) -> dict[str, tuple[int, int]]:
    """Split name -> (start, stop) of each slice the batch ending at ``end`` reads."""
    tasks = plan_partitions(driver.read_offset(end), None)
    return {p.split.name: (p.split.position, p.stop) for _, pieces in tasks for p in pieces}


def test_the_next_slice_starts_where_the_reader_ended_the_last(tmp_path: Path) -> None:
    clock = FakeClock()
    catalog = SequenceCatalog({"a": 10, "b": 10})
    query = Query(planner(catalog, clock, tmp_path))
    first = query.plan()
    assert first is not None
    query.run(first)  # writes the tasks' (empty) event files: overwrite slot 0's
    query.planner._events.write(first["seq"], 0, 0, [SliceEndedEvent("a", 4)])  # type: ignore[union-attr, index]
    catalog.append("a", 5)
    catalog.append("b", 5)

    second = query.plan()
    assert second is not None
    assert starts(second, query.planner) == {"a": (4, 15), "b": (10, 15)}

    restarted = Query(planner(catalog, clock, tmp_path), start=first)
    again = restarted.plan()
    assert again is not None
    assert starts(again, restarted.planner) == starts(second, query.planner)
