"""The main job's terminal view: a rich live table on a terminal, plain lines otherwise.

Everything shown comes from Spark's query progress (``query.recentProgress``) and the
producer's counters. The source's part is what splitflow reports as the source's latest
offset (:meth:`splitflow.spark.planner.Planner.lag`): per reader slot its splits and lag,
the most lagging splits with owner, position and latest position, and the backlog flag.
With an event-time column the report also has each split's watermark, and with alignment
(``maxEventTimeDrift``) the aligned watermark, the drift bound, each split's drift and
whether it is idle or paused: the view shows those only when the report has them.
Rendering is a pure function of a :class:`JobView`, so it is tested on a recorded progress.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from splitflow.job.producer import ProducerStats

SPLITS_SHOWN = 8
"""Splits listed in the view (the most lagging)."""


def source_report(progress: Mapping[str, Any] | None) -> dict[str, Any]:
    """The splitflow source's report in ``progress`` (its ``latestOffset``), or ``{}``."""
    if not progress or not progress.get("sources"):
        return {}
    latest = progress["sources"][0].get("latestOffset")
    if isinstance(latest, str):
        latest = None if latest in ("", "null") else json.loads(latest)
    return dict(latest) if isinstance(latest, Mapping) else {}


@dataclass
class JobView:
    """What the view shows, accumulated over progress events (one per micro-batch)."""

    title: str
    started: float = field(default_factory=time.monotonic)
    batches: int = 0
    rows: int = 0
    windows: int = 0
    """Closed windows in the output's committed files (set by the job)."""
    last: Mapping[str, Any] | None = None
    seen: set[str] = field(default_factory=set)
    producer: ProducerStats | None = None

    def update(self, progresses: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """Take new progress events (``query.recentProgress``); returns those not seen yet."""
        new = []
        for progress in progresses:
            key = f"{progress.get('runId')}/{progress.get('batchId')}/{progress.get('timestamp')}"
            if key in self.seen:
                continue
            self.seen.add(key)
            new.append(progress)
            rows = int(progress.get("numInputRows") or 0)
            if rows:
                self.batches += 1
            self.rows += rows
            self.last = progress
        return new


def _number(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    try:
        return f"{float(value):,.{digits}f}"
    except (TypeError, ValueError):
        return str(value)


def _clock_time(mark: Any) -> str:
    """An ISO time as ``HH:MM:SS``; ``-`` for none or Spark's initial watermark (the epoch)."""
    if not mark or str(mark).startswith("1970-01-01"):
        return "-"
    try:
        return datetime.fromisoformat(str(mark).replace("Z", "+00:00")).strftime("%H:%M:%S")
    except ValueError:
        return str(mark)


def _watermark(progress: Mapping[str, Any] | None) -> str:
    """Spark's watermark of the query (the largest event time less the delay)."""
    return _clock_time(((progress or {}).get("eventTime") or {}).get("watermark"))


def _seconds(value: Any) -> str:
    return "-" if value is None else f"{_number(value, 1)}s"


def _split_state(info: Mapping[str, Any]) -> str:
    """``idle``, ``paused`` (both if both), or empty: how alignment treated the split."""
    return ", ".join(flag for flag in ("idle", "paused") if info.get(flag))


def _event_time_figures(report: Mapping[str, Any]) -> dict[str, str]:
    """The event-time headline figures: none without an event-time column, the alignment
    figures only with ``maxEventTimeDrift``."""
    if "eventTimeColumn" not in report:
        return {}
    figures = {"event time column": str(report["eventTimeColumn"])}
    if "maxEventTimeDrift" in report:
        figures["aligned watermark"] = _clock_time(report.get("alignedWatermark"))
        figures["max drift"] = _seconds(report.get("maxEventTimeDrift"))
        figures["idle splits"] = _number(report.get("idleSplits"))
        figures["paused splits"] = _number(report.get("pausedSplits"))
    return figures


def _short(split_id: str, width: int = 28) -> str:
    name = os.path.basename(split_id.rstrip("/")) or split_id
    return name if len(name) <= width else "..." + name[-(width - 3) :]


def summary(view: JobView) -> dict[str, str]:
    """The headline figures, as text (shared by the live view and the plain lines)."""
    last = view.last or {}
    report = source_report(last)
    producer = view.producer
    figures = {
        "elapsed": f"{time.monotonic() - view.started:,.0f}s",
        "batch": str(last.get("batchId", "-")),
        "batches": str(view.batches),
        "rows": f"{view.rows:,}",
        "last batch rows": _number(last.get("numInputRows")),
        "input rows/s": _number(last.get("inputRowsPerSecond")),
        "processed rows/s": _number(last.get("processedRowsPerSecond")),
        "watermark": _watermark(last),
        "windows written": f"{view.windows:,}",
        "splits": _number(report.get("splitCount")),
        "total lag": _number(report.get("totalLag")),
        "backlog": "yes" if report.get("backlog") else ("no" if report else "-"),
        **_event_time_figures(report),
    }
    if producer is not None:
        figures["files produced"] = f"{producer.files:,} (run {producer.run})"
        figures["rows produced"] = f"{producer.rows:,}"
        if producer.error:
            figures["producer error"] = producer.error
    return figures


def render(view: JobView) -> RenderableType:
    """The live view: headline figures, per-slot load, the most lagging splits."""
    head = Table(title=view.title, show_header=False, box=None, pad_edge=False)
    head.add_column(style="bold")
    head.add_column()
    head.add_column(style="bold")
    head.add_column()
    items = list(summary(view).items())
    for i in range(0, len(items), 2):
        pair = items[i : i + 2] + [("", "")] * (2 - len(items[i : i + 2]))
        head.add_row(pair[0][0], pair[0][1], pair[1][0], pair[1][1])

    report = source_report(view.last)
    slots = Table(title="reader slots", title_justify="left")
    slots.add_column("slot", justify="right")
    slots.add_column("splits", justify="right")
    slots.add_column("lag", justify="right")
    for slot_id, slot in enumerate(report.get("slots", [])):
        slots.add_row(str(slot_id), _number(slot.get("splits")), _number(slot.get("lag")))

    event_time = "eventTimeColumn" in report
    aligned = "maxEventTimeDrift" in report
    splits = Table(title=f"most lagging splits (up to {SPLITS_SHOWN})", title_justify="left")
    names = ["split", "slot", "position", "latest", "lag"]
    if event_time:
        names.append("watermark")
    if aligned:
        names += ["drift", "state"]
    for name in names:
        splits.add_column(name, justify="left" if name in ("split", "state") else "right")
    rows = sorted(
        report.get("splits", {}).items(), key=lambda item: (-(item[1].get("lag") or 0), item[0])
    )
    for split_id, info in rows[:SPLITS_SHOWN]:
        cells = [
            _short(split_id),
            str(info.get("owner", "-")),
            _number(info.get("position")),
            _number(info.get("latest")),
            _number(info.get("lag")),
        ]
        if event_time:
            cells.append(_clock_time(info.get("watermark")))
        if aligned:
            cells += [_seconds(info.get("drift")), _split_state(info)]
        splits.add_row(*cells)
    hint = Text("Ctrl-C stops cleanly; run again to resume from the checkpoint", style="dim")
    return Group(head, slots, splits, hint)


def plain_line(view: JobView, progress: Mapping[str, Any]) -> str:
    """One line per progress event, for logs and pipes."""
    report = source_report(progress)
    slots = report.get("slots", [])
    load = " ".join(f"{s.get('splits', 0)}/{s.get('lag', 0)}" for s in slots)
    alignment = ""
    if "maxEventTimeDrift" in report:
        alignment = (
            f" aligned_watermark={_clock_time(report.get('alignedWatermark'))}"
            f" max_drift={_seconds(report.get('maxEventTimeDrift'))}"
            f" idle={report.get('idleSplits', '-')} paused={report.get('pausedSplits', '-')}"
        )
    return (
        f"batch {progress.get('batchId')}: rows={progress.get('numInputRows', 0)} "
        f"rows/s={_number(progress.get('processedRowsPerSecond'))} "
        f"windows={view.windows} watermark={_watermark(progress)} "
        f"splits={report.get('splitCount', '-')} lag={report.get('totalLag', '-')} "
        f"backlog={'yes' if report.get('backlog') else 'no'} slots(splits/lag)=[{load}]"
        f"{alignment}"
    )
