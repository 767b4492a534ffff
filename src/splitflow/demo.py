"""The main job (``python -m splitflow demo``, the README's ``make run``).

On one machine, in one command: a local Spark session; a producer thread writing a
continuous stream of event files into ``<work>/landing`` (with a backlog of files waiting
before the query starts); and a streaming query that reads them with the splitflow files
source, counts events in event-time windows with a watermark and appends the closed
windows to Parquet in ``<work>/output``. A live view shows batches, rows per second, each
reader slot's load, the most lagging splits and the backlog flag (plain lines when the
output is not a terminal).

It stops cleanly on Ctrl-C (or SIGTERM) or after ``--duration`` seconds, prints where the
output and the checkpoint are, and a second run with the same ``--work-dir`` resumes from
the checkpoint: the producer goes on where it stopped and no window is written twice.

The work directory defaults to ``./splitflow-demo`` (in the current directory, so that it
is easy to find, inspect and resume; delete it to start afresh)::

    splitflow-demo/
      landing/          event files (events-000001.parquet, ...)
      output/           windowed counts, Parquet (read it with Spark or pyarrow)
      checkpoint/       the query's Spark checkpoint (offsets, commits, state)
      source-state/     the splitflow source's state directory (stateDir)
      producer.json     where the producer stopped
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from splitflow.job.live import JobView, plain_line, render
from splitflow.job.pipeline import (
    Layout,
    OutputCounter,
    PipelineSettings,
    batch_watermark_ms,
    last_committed_batch,
    start_query,
    start_session,
    stop_between_batches,
)
from splitflow.job.producer import Producer

DEFAULT_WORK_DIR = "splitflow-demo"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cdc",
        action="store_true",
        help="the CDC form: a local PostgreSQL's pgbench tables mirrored into Delta tables "
        "(splitflow.demo_cdc)",
    )
    parser.add_argument(
        "--work-dir",
        default=None,
        help=f"landing, output, checkpoint and state live here (default ./{DEFAULT_WORK_DIR}; "
        "with --cdc ./splitflow-demo-cdc)",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=None,
        help="stop after this many seconds (default: Ctrl-C)",
    )
    parser.add_argument("--rate", type=float, default=2000.0, help="events per second (2000)")
    parser.add_argument("--devices", type=int, default=4, help="event streams, skewed (4)")
    parser.add_argument(
        "--backlog", type=float, default=30.0, help="seconds of events waiting at start (30)"
    )
    parser.add_argument(
        "--file-interval", type=float, default=1.0, help="seconds of events per file (1)"
    )
    parser.add_argument("--format", choices=("parquet", "json"), default="parquet")
    parser.add_argument("--window", default="5 seconds", help="event-time window ('5 seconds')")
    parser.add_argument("--watermark", default="5 seconds", help="allowed lateness ('5 seconds')")
    parser.add_argument("--trigger", default="2 seconds", help="micro-batch interval ('2 seconds')")
    parser.add_argument(
        "--max-drift",
        default="5s",
        help="maxEventTimeDrift: no file is read more than this far ahead of the slowest "
        "('5s', the watermark's delay; 'off' to turn alignment off)",
    )
    parser.add_argument("--parallelism", type=int, default=2, help="reader slots (2)")
    parser.add_argument(
        "--source",
        choices=("splitflow-files", "spark-files"),
        default="splitflow-files",
        help="read the landing directory with splitflow (default) or Spark's file source",
    )
    parser.add_argument(
        "--plain", action="store_true", help="plain progress lines even on a terminal"
    )
    from splitflow.demo_cdc import add_arguments as add_cdc_arguments

    add_cdc_arguments(parser.add_argument_group("--cdc"))


class StopSignal:
    """Ctrl-C and SIGTERM ask for a clean stop; a second Ctrl-C stops at once."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        self.reason = ""
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, self._handle)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.reason = signal.Signals(signum).name
        self.requested.set()


def run(args: argparse.Namespace, echo: Callable[[str], None] = print) -> int:
    """Run the main job until a signal or ``args.duration``; returns the exit code."""
    if args.cdc:
        from splitflow.demo_cdc import run as run_cdc

        return run_cdc(args, echo)
    layout = Layout(Path(args.work_dir or DEFAULT_WORK_DIR).resolve())
    resumed = (layout.checkpoint / "offsets").is_dir()
    settings = PipelineSettings(
        window=args.window,
        watermark=args.watermark,
        trigger=args.trigger,
        max_drift=None if args.max_drift == "off" else args.max_drift,
        parallelism=args.parallelism,
        file_format=args.format,
        source=args.source,
    )
    producer = Producer(
        layout.work,
        rate=args.rate,
        splits=args.devices,
        interval=args.file_interval,
        backlog=args.backlog,
        file_format=args.format,
    )
    echo(f"splitflow main job in {layout.work} ({'resuming' if resumed else 'fresh start'})")
    backlog = producer.write_backlog()
    echo(f"producer run {producer.stats.run}: {backlog} files waiting in {layout.landing}")
    echo("starting Spark (local[2]) ...")
    spark = start_session()
    stop = StopSignal()
    stop.install()  # after the session: SparkContext installs a SIGINT handler of its own
    failure: str | None = None
    try:
        query = start_query(spark, layout, settings)
        producer.start()
        title = (
            f"splitflow main job: files -> {settings.window} windows "
            f"(watermark {settings.watermark}) -> parquet"
        )
        view = JobView(title, producer=producer.stats)
        live = sys.stdout.isatty() and not args.plain
        deadline = None if args.duration is None else time.monotonic() + args.duration
        failure = _follow(query, view, OutputCounter(layout.output), stop, deadline, live, echo)
        if not stop.requested.is_set():
            stop.reason = "the duration passed" if failure is None else "the query failed"
    finally:
        producer.stop()
        for active in spark.streams.active:
            active.stop()
        spark.stop()
        stop.restore()
    echo(f"stopped ({stop.reason})")
    _report(layout, producer, echo)
    if producer.stats.error is not None:
        echo(f"the producer failed: {producer.stats.error}")
    if failure is not None:
        echo(f"the query failed: {failure}")
    return 0 if failure is None and producer.stats.error is None else 1


def _follow(
    query: Any,
    view: JobView,
    output: OutputCounter,
    stop: StopSignal,
    deadline: float | None,
    live: bool,
    echo: Callable[[str], None],
) -> str | None:
    """Show progress until a stop is asked for, the deadline, or the query ends."""

    def done() -> bool:
        over = deadline is not None and time.monotonic() >= deadline
        return stop.requested.is_set() or over or not query.isActive

    def refresh() -> list[Any]:
        new = view.update(query.recentProgress)
        view.windows = output.count()[0]
        return new

    if live:
        from rich.live import Live

        with Live(render(view), refresh_per_second=2, transient=False) as display:
            while not done():
                refresh()
                display.update(render(view))
                stop.requested.wait(0.5)
    else:
        while not done():
            for progress in refresh():
                if progress.get("numInputRows"):
                    echo(plain_line(view, progress))
            stop.requested.wait(0.5)
    stop_between_batches(query)
    error = query.exception()
    return None if error is None else str(error).splitlines()[0]


def _report(layout: Layout, producer: Producer, echo: Callable[[str], None]) -> None:
    windows, files = OutputCounter(layout.output).count()
    batch = last_committed_batch(layout.checkpoint)
    stats = producer.stats
    echo(f"produced:   {stats.files} files, {stats.rows:,} events in {layout.landing}")
    echo(f"output:     {layout.output} ({windows} closed windows in {files} committed files)")
    if batch is not None:
        mark = datetime.fromtimestamp(batch_watermark_ms(layout.checkpoint, batch) / 1000, UTC)
        echo(
            f"checkpoint: {layout.checkpoint} (last committed batch {batch}, "
            f"watermark {mark:%Y-%m-%d %H:%M:%S} UTC)"
        )
    else:
        echo(f"checkpoint: {layout.checkpoint} (no batch committed yet)")
    echo(f"inspect:    python -m splitflow inspect {layout.checkpoint} --state-dir {layout.state}")
    echo(f"resume:     python -m splitflow demo --work-dir {layout.work}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m splitflow demo", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
