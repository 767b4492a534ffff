"""The main job's producer: a continuous stream of event files in a landing directory.

Events are the generator connector's rows (:mod:`splitflow.connectors.generator`): device
``split`` sends rows at its share of ``rate`` rows per second, each with its event time.
File ``k`` of a run holds every row whose event time falls in tick ``k``
(``(start + (k-1) * interval, start + k * interval]``), so the files follow event time and
their content is a pure function of the run's start, the rate and ``k``.

A run starts ``backlog`` seconds in the past (or where the previous run's files ended, if
that is later): the files of those ticks are written at once, a backlog waiting before the
query starts; then one file per tick, as time passes. The producer's state
(``producer.json``: runs, files written, where event time is covered to) is saved after
every file, so a second run goes on where the first stopped. Rows are unique by
``(run, split, id)``.

Files are written to a scratch directory beside the landing directory and renamed into it,
so a reader never sees a half-written file.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from splitflow.connectors.generator import SCHEMA, GeneratorSource, GeneratorSplit

EVENT_SPARK_SCHEMA = "run int, split int, id bigint, value bigint, event_time timestamp"
"""The schema of the event files, as the pipeline declares it."""


@dataclass
class ProducerState:
    """What ``producer.json`` holds: everything a later run needs to go on."""

    runs: int = 0
    files: int = 0
    rows: int = 0
    covered_until_us: int = 0
    """Every row with an event time up to here is in a file."""

    @classmethod
    def load(cls, path: Path) -> ProducerState:
        if not path.exists():
            return cls()
        return cls(**json.loads(path.read_text(encoding="utf-8")))

    def save(self, path: Path) -> None:
        scratch = path.with_suffix(".tmp")
        scratch.write_text(json.dumps(asdict(self)), encoding="utf-8")
        os.replace(scratch, path)


@dataclass
class ProducerStats:
    """What the live view shows of the producer (read from another thread: plain values)."""

    run: int = 0
    files: int = 0
    rows: int = 0
    backlog_files: int = 0
    error: str | None = None
    last_file: str | None = None
    started_us: int = 0


class Producer(threading.Thread):
    """Writes event files into ``landing`` until :meth:`stop`; see the module doc.

    ``rate``: rows per second over ``splits`` devices (with ``skew``); ``interval``: seconds
    of event time per file; ``backlog``: seconds of events written at once when a run starts;
    ``file_format``: ``parquet`` or ``json`` (JSON lines). ``clock``: seconds since the epoch.
    """

    def __init__(
        self,
        work_dir: Path,
        *,
        rate: float = 2000.0,
        splits: int = 4,
        skew: float = 1.0,
        interval: float = 1.0,
        backlog: float = 30.0,
        file_format: str = "parquet",
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(name="splitflow-producer", daemon=True)
        if file_format not in ("parquet", "json"):
            raise ValueError(f"file format {file_format!r}: use parquet or json")
        self.landing = work_dir / "landing"
        self._scratch = work_dir / "producer-scratch"
        self._state_path = work_dir / "producer.json"
        self.rate, self.splits, self.skew = rate, splits, skew
        self.interval, self.backlog, self.file_format = interval, backlog, file_format
        self._clock = clock
        self._stopping = threading.Event()
        self.stats = ProducerStats()
        self._state = ProducerState.load(self._state_path)
        self._run_splits: list[GeneratorSplit] = []
        self._start_us = 0
        self._tick = 0
        self._written: list[int] = []

    # -- lifecycle ------------------------------------------------------------------------

    def write_backlog(self) -> int:
        """Begin a run and write the files of every tick that has passed; returns how many.

        Called once, before :meth:`start` (the backlog is waiting before the query starts).
        """
        self.landing.mkdir(parents=True, exist_ok=True)
        self._scratch.mkdir(parents=True, exist_ok=True)
        now_us = math.floor(self._clock() * 1_000_000)
        start_us = max(now_us - round(self.backlog * 1_000_000), self._state.covered_until_us)
        self._state.runs += 1
        self._start_us = start_us
        source = GeneratorSource(
            self.splits, rows_per_second=self.rate, skew=self.skew, start_time=start_us / 1e6
        )
        self._run_splits = source.splits(start_us)
        self._written = [0] * len(self._run_splits)
        self._tick = 0
        self.stats.run, self.stats.started_us = self._state.runs, start_us
        self.stats.files, self.stats.rows = self._state.files, self._state.rows
        written = self._write_due(now_us)
        self.stats.backlog_files = written
        return written

    def run(self) -> None:
        try:
            while not self._stopping.is_set():
                next_tick_us = self._tick_end_us(self._tick + 1)
                wait = next_tick_us / 1e6 - self._clock()
                if wait > 0 and self._stopping.wait(wait):
                    break
                self._write_due(math.floor(self._clock() * 1_000_000))
        except Exception as exc:  # the view shows it; the job reports it at the end
            self.stats.error = f"{type(exc).__name__}: {exc}"
            raise

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the file being written (files are never left half-written)."""
        self._stopping.set()
        if self.is_alive():
            self.join(timeout)

    # -- writing --------------------------------------------------------------------------

    def _tick_end_us(self, tick: int) -> int:
        return self._start_us + round(tick * self.interval * 1_000_000)

    def _write_due(self, now_us: int) -> int:
        """Write a file for every tick that ended by ``now_us``; returns how many."""
        count = 0
        while self._tick_end_us(self._tick + 1) <= now_us and not self._stopping.is_set():
            self._tick += 1
            self._write_tick(self._tick)
            count += 1
        return count

    def _write_tick(self, tick: int) -> None:
        until_s = self._tick_end_us(tick) / 1e6
        batches = []
        for i, split in enumerate(self._run_splits):
            stop = split.available(until_s)
            if stop > self._written[i]:
                batches.append(split.batch(self._written[i], stop))
                self._written[i] = stop
        table = event_table(self._state.runs, batches)
        self._state.files += 1
        name = f"events-{self._state.files:06d}.{self.file_format}"
        scratch = self._scratch / name
        if self.file_format == "parquet":
            pq.write_table(table, scratch)
        else:
            write_json_lines(table, scratch)
        os.replace(scratch, self.landing / name)
        self._state.rows += table.num_rows
        self._state.covered_until_us = self._tick_end_us(tick)
        self._state.save(self._state_path)
        self.stats.files, self.stats.rows, self.stats.last_file = (
            self._state.files,
            self._state.rows,
            name,
        )


def event_table(run: int, batches: list[pa.RecordBatch]) -> pa.Table:
    """The generator's rows with the run number in front (the event files' columns)."""
    rows = pa.Table.from_batches(batches, schema=SCHEMA)
    column = pa.array([run] * rows.num_rows, pa.int32())
    return rows.add_column(0, pa.field("run", pa.int32(), False), column)


def write_json_lines(table: pa.Table, path: Path) -> None:
    """One JSON object per row; event times as ISO-8601 UTC with microseconds."""
    columns = table.to_pydict()
    names = list(columns)
    with path.open("w", encoding="utf-8") as out:
        for values in zip(*columns.values(), strict=True):
            row = dict(zip(names, values, strict=True))
            row["event_time"] = row["event_time"].isoformat()
            out.write(json.dumps(row) + "\n")
