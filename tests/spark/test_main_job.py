"""The main job end to end: ``python -m splitflow demo`` run twice on one work directory.

Run 1 is stopped with SIGINT to its process group (Ctrl-C in a terminal) once it has written
closed windows; run 2 resumes from the checkpoint and is stopped with SIGTERM to its process
group (what ``timeout`` sends) once it has written more. Both must stop
cleanly: Spark's JVM must not get the group's signal. After each run, the windowed counts in
the job's committed Parquet output (the files Spark's sink log lists) must equal the counts
computed directly from the event files in the landing directory, with pyarrow, for every
window the watermark has closed (window end <= the watermark of the last committed batch);
the output must hold no other window and no window twice.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from queue import Empty, Queue

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from tests.spark.support import REPO_ROOT, spark_env

from splitflow.job.pipeline import (
    batch_watermark_ms,
    committed_output_files,
    last_committed_batch,
)

pytestmark = pytest.mark.slow

SOURCE = "splitflow-files"
WINDOW_S = 5
JOB_ARGS = [
    "--rate", "800", "--devices", "4", "--backlog", "20", "--file-interval", "1",
    "--window", f"{WINDOW_S} seconds", "--watermark", "5 seconds", "--trigger", "2 seconds",
    "--source", SOURCE, "--plain",
]  # fmt: skip
BACKSTOP = ["--duration", "240"]  # a run the test fails to stop stops itself
BATCH_LINE = re.compile(r"^batch (\d+): rows=(\d+) .* windows=(\d+) ")


def micros(column: pa.ChunkedArray) -> list[int]:
    """Timestamps (any unit, with or without a zone) as microseconds since the epoch."""
    unit = {"s": 1_000_000, "ms": 1000, "us": 1, "ns": 1}[column.type.unit]
    values = pc.cast(column, pa.int64()).to_pylist()
    return [v // 1000 if column.type.unit == "ns" else v * unit for v in values]


def expected_windows(work: Path, closed_until_ms: int) -> dict[int, tuple[int, int]]:
    """Window start (µs) -> (events, sum of value), from the landing files, closed windows."""
    table = pa.concat_tables(pq.read_table(p) for p in sorted((work / "landing").iterdir()))
    width = WINDOW_S * 1_000_000
    counts: Counter[int] = Counter()
    sums: Counter[int] = Counter()
    for t, value in zip(
        micros(table.column("event_time")), table.column("value").to_pylist(), strict=True
    ):
        start = t - t % width
        if start + width <= closed_until_ms * 1000:
            counts[start] += 1
            sums[start] += value
    return {start: (counts[start], sums[start]) for start in counts}


def output_windows(work: Path) -> list[tuple[int, int, int, int]]:
    """``(start µs, end µs, events, value_sum)`` of every row in the committed output."""
    files = committed_output_files(work / "output")
    if not files:
        return []
    table = pa.concat_tables(pq.read_table(p) for p in files)
    return list(
        zip(
            micros(table.column("window_start")),
            micros(table.column("window_end")),
            table.column("events").to_pylist(),
            table.column("value_sum").to_pylist(),
            strict=True,
        )
    )


class Job:
    """``python -m splitflow demo`` in a subprocess; its stdout lines arrive in a queue."""

    def __init__(self, work: Path, *extra: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "splitflow", "demo", "--work-dir", str(work), *JOB_ARGS, *extra],
            cwd=REPO_ROOT,
            env=spark_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,  # signals go to its group, as a terminal's do
        )
        self.lines: list[str] = []
        self._queue: Queue[str | None] = Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, pattern: re.Pattern[str], accept: object, timeout: float) -> re.Match[str]:
        """The first line matching ``pattern`` for which ``accept(match)`` is true."""
        import time

        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except Empty:
                raise AssertionError(f"no such line after {timeout}s: {self.lines[-5:]}") from None
            if line is None:
                raise AssertionError(f"the job ended first: {self.lines[-10:]}")
            self.lines.append(line)
            match = pattern.match(line)
            if match and accept(match):  # type: ignore[operator]
                return match

    def finish(self, timeout: float) -> int:
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            raise
        while True:
            try:
                line = self._queue.get(timeout=5)
            except Empty:
                break
            if line is None:
                break
            self.lines.append(line)
        return code

    def batches(self) -> list[int]:
        return [int(m.group(1)) for m in map(BATCH_LINE.match, self.lines) if m]


def check_output(work: Path) -> tuple[int, list[tuple[int, int, int, int]]]:
    """The committed output equals the closed windows of the files; returns the watermark."""
    batch = last_committed_batch(work / "checkpoint")
    assert batch is not None, "no batch committed"
    watermark_ms = batch_watermark_ms(work / "checkpoint", batch)
    rows = output_windows(work)
    starts = [start for start, *_ in rows]
    assert len(starts) == len(set(starts)), (
        f"windows written twice: {Counter(starts).most_common(3)}"
    )
    assert all(end <= watermark_ms * 1000 for _, end, *_ in rows), "an open window was written"
    assert all(end - start == WINDOW_S * 1_000_000 for start, end, *_ in rows)
    written = {start: (events, total) for start, _, events, total in rows}
    expected = expected_windows(work, watermark_ms)
    differ = [(s, written[s], expected[s]) for s in written.keys() & expected.keys()]
    assert written == expected, (
        f"windows differ from the files: missing {sorted(expected.keys() - written.keys())[:5]}, "
        f"extra {sorted(written.keys() - expected.keys())[:5]}, different counts "
        f"{[d for d in differ if d[1] != d[2]][:5]}"
    )
    return watermark_ms, rows


def test_the_main_job_counts_every_closed_window_once_across_a_ctrl_c_a_sigterm_and_a_resume(
    tmp_path: Path,
) -> None:
    work = tmp_path / "demo"
    first = Job(work, *BACKSTOP)
    first.wait_for(BATCH_LINE, lambda m: int(m.group(3)) >= 3, timeout=240)
    os.killpg(first.process.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the group
    assert first.finish(timeout=120) == 0, first.lines[-10:]
    text = "\n".join(first.lines)
    assert "fresh start" in text
    assert "stopped (SIGINT)" in text
    assert f"output:     {work / 'output'}" in text
    assert f"checkpoint: {work / 'checkpoint'}" in text
    watermark_1, rows_1 = check_output(work)
    assert len(rows_1) >= 3
    committed_1 = last_committed_batch(work / "checkpoint")
    assert committed_1 is not None

    second = Job(work, *BACKSTOP)
    second.wait_for(BATCH_LINE, lambda m: int(m.group(3)) > len(rows_1), timeout=240)
    os.killpg(second.process.pid, signal.SIGTERM)  # as timeout(1) does: the whole group
    assert second.finish(timeout=180) == 0, second.lines[-10:]
    text = "\n".join(second.lines)
    assert "resuming" in text
    assert "producer run 2" in text
    assert "stopped (SIGTERM)" in text
    assert min(second.batches()) > committed_1, "the second run did not resume the batch ids"
    watermark_2, rows_2 = check_output(work)
    assert watermark_2 > watermark_1
    assert set(rows_1) < set(rows_2), "the second run lost or rewrote the first run's windows"
    runs = pa.concat_tables(pq.read_table(p) for p in (work / "landing").iterdir()).column("run")
    assert set(runs.to_pylist()) == {1, 2}
