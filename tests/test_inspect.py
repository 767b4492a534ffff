"""`splitflow inspect` reads a Spark checkpoint's split state without Spark."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.spark.test_offset_state import FORMAT_1_OFFSET, OLD_FORMATS

from splitflow.errors import ConfigurationError, IncompatibleCheckpointError
from splitflow.inspect import format_table, read_checkpoint
from splitflow.spark.limits import MaxRecords
from splitflow.spark.planner import Planner
from splitflow.testing import SequenceCatalog, SequenceSource


def write_checkpoint(root: Path, offsets: list[dict[str, object]], committed: int) -> None:
    """Lay out offsets as Spark does: offsets/<n> = version, metadata, one line per source."""
    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir()
    for batch, offset in enumerate(offsets):
        lines = ["v1", json.dumps({"batchWatermarkMs": 0}), json.dumps(offset)]
        (root / "offsets" / str(batch)).write_text("\n".join(lines))
        if batch <= committed:
            (root / "commits" / str(batch)).write_text("v1\n{}")


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    catalog = SequenceCatalog({"a": 10, "b": 4, "c": 0})
    catalog.seal("c")
    planner = Planner(SequenceSource(catalog), parallelism=2, clock=lambda: 0.0)
    start = planner.initial_offset()
    first = planner.latest_offset(start, MaxRecords(6))
    second = planner.latest_offset(first, MaxRecords(6))
    planner.close()
    write_checkpoint(tmp_path, [first, second], committed=0)
    return tmp_path


def test_inspect_shows_each_split_with_owner_and_slice(checkpoint: Path) -> None:
    [state] = read_checkpoint(str(checkpoint))
    assert (state.batch, state.committed, state.parallelism) == (1, False, 2)
    rows = {r.split_id: r for r in state.splits}
    assert rows["c"].state == "finished"
    reading = {sid: r for sid, r in rows.items() if r.state == "reading"}
    assert set(reading) == {"a", "b"}
    assert sum(r.records or 0 for r in reading.values()) == 6  # maxRecordsPerBatch
    assert all(r.owner in (0, 1) for r in reading.values())
    assert rows["a"].owner != rows["b"].owner  # balanced over the two slots


def test_inspect_reads_an_older_batch_and_knows_it_committed(checkpoint: Path) -> None:
    [state] = read_checkpoint(str(checkpoint), batch=0)
    assert state.committed
    assert {r.split_id: (r.start, r.stop) for r in state.splits if r.state == "reading"} == {
        "a": (0, 4),
        "b": (0, 2),
    }
    table = format_table([state])
    assert "batch 0 (committed)" in table
    assert "a " in table


def test_inspect_shows_a_split_the_batch_did_not_read_where_it_is(tmp_path: Path) -> None:
    """The offset keeps b's slice as batch 0 read it; batch 1 leaves b at 4."""
    catalog = SequenceCatalog({"a": 4, "b": 4})
    planner = Planner(SequenceSource(catalog), parallelism=2, clock=lambda: 0.0)
    first = planner.latest_offset(planner.initial_offset(), MaxRecords(8))
    catalog.append("a", 3)
    second = planner.latest_offset(first, MaxRecords(8))
    planner.close()
    write_checkpoint(tmp_path, [first, second], committed=1)
    [state] = read_checkpoint(str(tmp_path))
    rows = {r.split_id: (r.start, r.stop, r.records) for r in state.splits}
    assert rows == {"a": (4, 7, 3), "b": (4, 4, 0)}


@pytest.mark.parametrize("version", sorted(OLD_FORMATS), ids=lambda v: f"format {v}")
def test_inspect_reads_a_checkpoint_of_a_format_before(tmp_path: Path, version: int) -> None:
    offset, files = OLD_FORMATS[version]
    state_dir = tmp_path / "state"
    for name, content in (files or {}).items():
        (state_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (state_dir / name).write_text(json.dumps(content))
    write_checkpoint(tmp_path / "chk", [offset], committed=0)
    [state] = read_checkpoint(str(tmp_path / "chk"), state_dir=str(state_dir) if files else None)
    rows = {r.split_id: (r.owner, r.start, r.stop) for r in state.splits}
    assert rows == {"a": (0, 2, 4), "c": (0, 0, 0), "b": (1, 2, 3)}


def test_inspect_names_what_is_wrong_with_a_bad_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="not a Spark streaming checkpoint"):
        read_checkpoint(str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-m", "splitflow", "inspect", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "no offsets/<batch> files" in done.stderr


def test_inspect_command_prints_json(checkpoint: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "splitflow", "inspect", str(checkpoint), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    [source] = json.loads(done.stdout)
    assert source["parallelism"] == 2
    assert {s["id"] for s in source["splits"]} == {"a", "b", "c"}


def test_inspect_shows_each_split_s_backlog_boundary_and_distance(checkpoint: Path) -> None:
    [state] = read_checkpoint(str(checkpoint))
    rows = {r.split_id: r for r in state.splits}
    assert state.backlog  # the records there at the start are the backlog
    assert rows["a"].boundary == 10
    assert rows["a"].to_boundary == 10 - (rows["a"].stop or 0)
    assert rows["c"].boundary is None  # empty at the start: no backlog
    assert "backlog to" in format_table([state])


def test_inspect_shows_long_split_ids_whole_or_by_their_end() -> None:
    from splitflow.inspect import SourceState, SplitRow

    long_id = "/data/landing/2026/11/21/" + "x" * 50 + "/events-000057.parquet"
    rows = [
        SplitRow("/data/a/events-000001.parquet", "reading", 0, 0, 5),
        SplitRow(long_id, "finished", None, None, None),
    ]
    table = format_table([SourceState(3, True, 0, 3, False, 1, rows)])
    assert "/data/a/events-000001.parquet " in table
    assert "events-000057.parquet" in table


def hand_written_offset(**extra: object) -> dict[str, object]:
    """An offset as the planner encodes it: slot 0 reads ``a``, slot 1 reads ``b``, the
    enumerator holds ``u`` and has finished ``f``."""
    return {
        "splitflow": 1,
        "seq": 4,
        "codecs": [1, 1],
        "enumerator": {"unassigned": {"u": {"position": 3}}, "finished": ["f"]},
        "slots": [[["a", {"position": 10}, 14]], [["b", {"position": 0}, 2]]],
        "backlog": False,
        **extra,
    }


A_TIME = 1_795_279_037_365_000  # 2026-11-21T16:37:17.365 UTC, in microseconds
B_TIME = A_TIME + 44_635_000


def test_inspect_shows_each_held_split_s_watermark_from_the_offset(tmp_path: Path) -> None:
    offset = hand_written_offset(event_times={"a": A_TIME, "b": B_TIME})
    write_checkpoint(tmp_path, [offset], committed=0)
    [state] = read_checkpoint(str(tmp_path))
    rows = {r.split_id: r for r in state.splits}
    assert {sid: r.watermark for sid, r in rows.items()} == {
        "a": A_TIME,
        "b": B_TIME,
        "u": None,
        "f": None,
    }
    lines = format_table([state]).splitlines()
    assert lines[1].endswith(" watermark")
    [a_line] = [line for line in lines if line.startswith("  a ")]
    [b_line] = [line for line in lines if line.startswith("  b ")]
    assert a_line.endswith(" 2026-11-21T16:37:17.365+00:00")
    assert b_line.endswith(" 2026-11-21T16:38:02.000+00:00")


def test_inspect_command_prints_watermarks_in_microseconds(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, [hand_written_offset(event_times={"a": A_TIME})], committed=0)
    done = subprocess.run(
        [sys.executable, "-m", "splitflow", "inspect", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    [source] = json.loads(done.stdout)
    assert {s["id"]: s["watermark_us"] for s in source["splits"]} == {
        "a": A_TIME,
        "b": None,
        "u": None,
        "f": None,
    }


def test_inspect_of_an_offset_without_event_times_shows_no_watermark(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, [hand_written_offset()], committed=0)
    [state] = read_checkpoint(str(tmp_path))
    assert all(r.watermark is None for r in state.splits)
    table = format_table([state])
    assert "watermark" not in table
    assert table.splitlines()[1].endswith("to go")


def test_inspect_refuses_an_offset_format_it_does_not_know(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, [{**FORMAT_1_OFFSET, "splitflow": 99}], committed=0)
    with pytest.raises(IncompatibleCheckpointError, match="batch 0"):
        read_checkpoint(str(tmp_path))
