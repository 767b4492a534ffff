"""The live view shows per-split event time and alignment when the source reports them."""

from __future__ import annotations

import json
import re
from typing import Any

from rich.console import Console

from splitflow.job.live import JobView, plain_line, render

SPLITS: dict[str, dict[str, Any]] = {
    "gen-00000": {"owner": 0, "position": 1600, "latest": 12673, "lag": 11073},
    "gen-00001": {"owner": 1, "position": 2000, "latest": 15841, "lag": 13841},
    "gen-00002": {"owner": 0, "position": 2400, "latest": 19009, "lag": 16609},
}
PLAIN_REPORT: dict[str, Any] = {
    "splitCount": 3,
    "totalLag": 41523,
    "slots": [{"splits": 2, "lag": 27682}, {"splits": 1, "lag": 13841}],
    "splits": SPLITS,
    "backlog": False,
    "backlogSplits": 0,
}
ALIGNED_REPORT: dict[str, Any] = {
    **PLAIN_REPORT,
    "splits": {
        "gen-00000": {
            **SPLITS["gen-00000"],
            "watermark": "2026-11-21T16:37:17.365+00:00",
            "idle": False,
            "paused": False,
            "drift": 0.0,
        },
        "gen-00001": {
            **SPLITS["gen-00001"],
            "watermark": "2026-11-21T16:38:02.000+00:00",
            "idle": False,
            "paused": True,
            "drift": 44.635,
        },
        "gen-00002": {  # idle: no drift
            **SPLITS["gen-00002"],
            "watermark": None,
            "idle": True,
            "paused": False,
        },
    },
    "eventTimeColumn": "ts",
    "maxEventTimeDrift": 30.0,
    "alignedWatermark": "2026-11-21T16:37:17.365+00:00",
    "idleSplits": 1,
    "pausedSplits": 1,
}
EVENT_TIME_REPORT: dict[str, Any] = {
    **PLAIN_REPORT,
    "splits": {
        sid: {**row, "watermark": f"2026-11-21T16:3{i}:00.000+00:00"}
        for i, (sid, row) in enumerate(SPLITS.items())
    },
    "eventTimeColumn": "ts",
}


def progress(report: dict[str, Any]) -> dict[str, Any]:
    return {
        "runId": "r",
        "timestamp": "2026-11-21T16:38:05.388Z",
        "batchId": 3,
        "numInputRows": 3000,
        "processedRowsPerSecond": 4651.2,
        "eventTime": {"watermark": "2026-11-21T16:36:00.000Z"},
        "sources": [{"numInputRows": 3000, "latestOffset": json.dumps(report)}],
    }


def rendered(report: dict[str, Any]) -> str:
    view = JobView("main job")
    view.update([progress(report)])
    console = Console(record=True, width=160, color_system=None)
    console.print(render(view))
    return console.export_text()


def split_line(text: str, word: str) -> list[str]:
    """The cells of the one table line with ``word`` (a split id, or a column's name)."""
    [line] = [line for line in text.splitlines() if word in line]
    return [cell.strip() for cell in re.split("[│┃]", line)[1:-1]]


def test_the_headline_shows_the_aligned_watermark_drift_bound_and_idle_paused_counts() -> None:
    text = rendered(ALIGNED_REPORT)
    head = text.split("reader slots")[0]
    for figure in (
        "event time column +ts",
        "aligned watermark +16:37:17",
        "max drift +30.0s",
        "idle splits +1",
        "paused splits +1",
    ):
        assert re.search(figure, head), (figure, head)


def test_the_split_table_shows_each_split_s_watermark_drift_and_state() -> None:
    text = rendered(ALIGNED_REPORT)
    header = split_line(text, "position")
    assert header == ["split", "slot", "position", "latest", "lag", "watermark", "drift", "state"]
    assert split_line(text, "gen-00000")[5:] == ["16:37:17", "0.0s", ""]
    assert split_line(text, "gen-00001")[5:] == ["16:38:02", "44.6s", "paused"]
    assert split_line(text, "gen-00002")[5:] == ["-", "-", "idle"]


def test_an_event_time_column_without_alignment_shows_watermarks_only() -> None:
    text = rendered(EVENT_TIME_REPORT)
    assert split_line(text, "position")[5:] == ["watermark"]
    assert split_line(text, "gen-00002")[5:] == ["16:32:00"]
    assert "event time" in text
    for absent in ("aligned watermark", "max drift", "idle splits", "paused", "drift"):
        assert absent not in text, absent


def test_a_report_without_event_time_renders_no_event_time_figures_or_columns() -> None:
    text = rendered(PLAIN_REPORT)
    assert split_line(text, "position") == ["split", "slot", "position", "latest", "lag"]
    assert split_line(text, "gen-00000") == ["gen-00000", "0", "1,600", "12,673", "11,073"]
    for absent in ("event time", "aligned", "drift", "idle", "paused"):
        assert absent not in text, absent


def test_the_plain_line_adds_the_alignment_only_when_aligned() -> None:
    view = JobView("main job")
    aligned = plain_line(view, progress(ALIGNED_REPORT))
    assert aligned.endswith(
        "slots(splits/lag)=[2/27682 1/13841] "
        "aligned_watermark=16:37:17 max_drift=30.0s idle=1 paused=1"
    ), aligned
    plain = plain_line(view, progress(PLAIN_REPORT))
    assert plain.endswith("slots(splits/lag)=[2/27682 1/13841]"), plain
    assert plain_line(view, progress(EVENT_TIME_REPORT)) == plain
