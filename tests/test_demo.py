"""The main job's parts without Spark: the producer, the live view, the sink log reader.

The job end to end (Spark, resume, output checked against the files) is
``tests/spark/test_main_job.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console

from splitflow.connectors.generator import GeneratorSource
from splitflow.job.live import JobView, plain_line, render, source_report
from splitflow.job.pipeline import committed_output_files
from splitflow.job.producer import Producer, ProducerState

# A progress event recorded from a query on the generator source (offsets left out).
REPORT = {
    "splitCount": 5,
    "totalLag": 83046,
    "slots": [{"splits": 3, "lag": 49828}, {"splits": 2, "lag": 33218}],
    "splits": {
        "gen-00000": {"owner": 0, "position": 1600, "latest": 12673, "lag": 11073},
        "gen-00002": {"owner": 0, "position": 2400, "latest": 19009, "lag": 16609},
        "gen-00004": {"owner": 0, "position": 3200, "latest": 25346, "lag": 22146},
        "gen-00001": {"owner": 1, "position": 2000, "latest": 15841, "lag": 13841},
        "gen-00003": {"owner": 1, "position": 2800, "latest": 22177, "lag": 19377},
    },
    "backlog": True,
    "backlogSplits": 5,
}
PROGRESS: dict[str, Any] = {
    "id": "2e77428e-d1c0-41b1-8784-75064ee9a235",
    "runId": "e70632b2-2abe-4e18-b75b-cafb6f49bb31",
    "timestamp": "2026-11-21T16:38:05.388Z",
    "batchId": 3,
    "batchDuration": 645,
    "numInputRows": 3000,
    "inputRowsPerSecond": 2111.2,
    "processedRowsPerSecond": 4651.2,
    "eventTime": {"watermark": "2026-11-21T16:37:17.365Z"},
    "sources": [{"numInputRows": 3000, "latestOffset": json.dumps(REPORT)}],
    "sink": {"description": "FileSink[file:/tmp/out]", "numOutputRows": -1},
}


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def landing_table(work: Path) -> pa.Table:
    return pa.concat_tables(
        pq.read_table(p) for p in sorted((work / "landing").glob("events-*.parquet"))
    )


def test_the_source_report_is_read_from_the_latest_offset_text() -> None:
    assert source_report(PROGRESS) == REPORT
    assert source_report({"sources": [{"latestOffset": "null"}]}) == {}
    assert source_report(None) == {}


def test_the_live_view_shows_batches_rate_slot_load_lagging_splits_and_backlog() -> None:
    view = JobView("main job")
    assert view.update([PROGRESS, PROGRESS]) == [PROGRESS]  # the same event counts once
    view.windows = 7
    console = Console(record=True, width=120, color_system=None)
    console.print(render(view))
    text = console.export_text()
    assert "4,651" in text  # processed rows per second
    assert "16:37:17" in text  # the watermark
    assert "83,046" in text  # total lag
    for slot_line in ("0 │      3 │ 49,828", "1 │      2 │ 33,218"):
        assert slot_line in text, text
    lagging = [line for line in text.splitlines() if "gen-0000" in line]
    assert [line.split()[1] for line in lagging] == [
        "gen-00004",
        "gen-00003",
        "gen-00002",
        "gen-00001",
        "gen-00000",
    ]  # most lagging first
    assert "backlog" in text
    assert "yes" in text
    assert "windows written" in text
    assert " 7 " in text


def test_a_plain_line_per_batch_when_the_output_is_not_a_terminal() -> None:
    view = JobView("main job")
    view.update([PROGRESS])
    line = plain_line(view, PROGRESS)
    assert line.startswith("batch 3: rows=3000 rows/s=4,651")
    assert "backlog=yes" in line
    assert "lag=83046" in line
    assert "slots(splits/lag)=[3/49828 2/33218]" in line


def test_the_producer_writes_the_backlog_at_once_then_one_file_per_tick(tmp_path: Path) -> None:
    clock = Clock(10_000.0)
    producer = Producer(
        tmp_path, rate=100.0, splits=2, skew=1.0, backlog=5.0, interval=1.0, clock=clock
    )
    assert producer.write_backlog() == 5
    clock.now += 2.5
    assert producer._write_due(int(clock.now * 1e6)) == 2
    table = landing_table(tmp_path)
    # 7 seconds of events at 100/s over two skewed splits, as the generator makes them
    splits = GeneratorSource(2, rows_per_second=100.0, skew=1.0).splits(9_995_000_000)
    assert table.num_rows == sum(s.available(10_002.0) for s in splits) == 701
    assert table.column_names == ["run", "split", "id", "value", "event_time"]
    times = [t.value for t in table.column("event_time")]
    assert min(times) == 9_995_000_000
    assert max(times) <= 10_002_000_000
    files = sorted(p.name for p in (tmp_path / "landing").iterdir())
    assert files == [f"events-{i:06d}.parquet" for i in range(1, 8)]
    state = ProducerState.load(tmp_path / "producer.json")
    assert (state.runs, state.files, state.rows) == (1, 7, table.num_rows)


def test_a_second_run_goes_on_where_the_first_stopped(tmp_path: Path) -> None:
    clock = Clock(10_000.0)
    first = Producer(tmp_path, rate=50.0, splits=3, backlog=4.0, clock=clock)
    first.write_backlog()
    covered = ProducerState.load(tmp_path / "producer.json").covered_until_us
    clock.now += 2.0  # a short stop: the new run starts where the old one's files ended
    second = Producer(tmp_path, rate=50.0, splits=3, backlog=4.0, clock=clock)
    assert second.write_backlog() == 2
    table = landing_table(tmp_path)
    keys = list(zip(*(table.column(c).to_pylist() for c in ("run", "split", "id")), strict=True))
    assert len(keys) == len(set(keys)), "a row was written twice"
    runs = table.column("run").to_pylist()
    late = [t.value for t, r in zip(table.column("event_time"), runs, strict=True) if r == 2]
    early = [t.value for t, r in zip(table.column("event_time"), runs, strict=True) if r == 1]
    assert min(late) >= covered >= max(early)
    clock.now += 600.0  # a long stop: only the last `backlog` seconds are made up
    third = Producer(tmp_path, rate=50.0, splits=3, backlog=4.0, clock=clock)
    assert third.write_backlog() == 4


def test_json_lines_files_hold_the_same_rows(tmp_path: Path) -> None:
    clock = Clock(500.0)
    parquet = Producer(tmp_path / "p", rate=20.0, splits=2, backlog=2.0, clock=clock)
    parquet.write_backlog()
    lines = Producer(
        tmp_path / "j", rate=20.0, splits=2, backlog=2.0, clock=clock, file_format="json"
    )
    lines.write_backlog()
    rows = [
        json.loads(line)
        for path in sorted((tmp_path / "j" / "landing").iterdir())
        for line in path.read_text().splitlines()
    ]
    table = landing_table(tmp_path / "p")
    assert [r["id"] for r in rows] == table.column("id").to_pylist()
    assert rows[0]["event_time"] == "1970-01-01T00:08:18+00:00"


def test_only_files_in_the_sink_log_are_committed_output(tmp_path: Path) -> None:
    log = tmp_path / "_spark_metadata"
    log.mkdir()

    def entry(name: str, action: str = "add") -> str:
        return json.dumps({"path": f"file://{tmp_path}/{name}", "action": action})

    (log / "0").write_text("v1\n" + entry("a.parquet") + "\n")
    (log / "1.compact").write_text("v1\n" + entry("a.parquet") + "\n" + entry("b.parquet"))
    (log / "2").write_text("v1\n" + entry("c%20d.parquet") + "\n" + entry("a.parquet", "delete"))
    (tmp_path / "left-by-a-failed-attempt.parquet").write_text("")
    assert committed_output_files(tmp_path) == [tmp_path / "b.parquet", tmp_path / "c d.parquet"]


def test_the_command_line_offers_the_main_job_and_inspect() -> None:
    for command in ("demo", "inspect"):
        done = subprocess.run(
            [sys.executable, "-m", "splitflow", command, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
    assert (
        "--duration"
        in subprocess.run(
            [sys.executable, "-m", "splitflow", "demo", "--help"], capture_output=True, text=True
        ).stdout
    )
