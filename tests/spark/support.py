"""Helpers of the Spark end-to-end tests: start a query, wait for it, check the sink.

Every wait polls with a hard timeout; nothing sleeps and hopes. The sink is always read
back with Spark (``spark.read.parquet``), never with pyarrow: Spark's file sink lists the
files of committed batches in ``_spark_metadata``, and a part file left by a killed or
crashed attempt is in the folder but not in that log. Reading the folder raw would count
such leftovers; reading it as Spark does is the exactly-once contract of the sink.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any, Protocol, TypeVar

from splitflow.spark.offsetstate import OffsetState, expand_offset
from splitflow.spark.statedir import StateStore
from splitflow.testing.sequence import SequenceCatalog

T = TypeVar("T")

REPO_ROOT = Path(__file__).resolve().parents[2]

SOURCE = "splitflow-sequence"
FAULTY = "splitflow-sequence-faulty"
TRIGGER = "500 milliseconds"


def spark_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) plus what Spark's Python workers need.

    ``PYSPARK_PYTHON``: this interpreter (it has splitflow and pyarrow); ``SPARK_LOCAL_IP``:
    no loopback-hostname lookup; ``PYTHONPATH``: the repository root first, so executors
    import ``tests.spark.sources``. Workers inherit the JVM's environment: set it before the
    session starts.
    """
    env = dict(os.environ if base is None else base)
    env["PYSPARK_PYTHON"] = sys.executable
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(REPO_ROOT) not in paths:
        paths.insert(0, str(REPO_ROOT))
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def driver_session(app: str, master: str = "local[2]") -> Any:
    """The session of a driver subprocess (``jobs.py``, a test's own job; ``local[2]`` unless
    told), with splitflow's sources registered and the environment of :func:`spark_env`."""
    os.environ.update(spark_env())
    from pyspark.sql import SparkSession

    from splitflow.spark import register

    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
    )
    if master.startswith("spark://"):  # the standalone cluster of tests/spark/cluster.py
        from tests.spark.cluster import QUICK_JVM

        builder = (
            builder.config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.executor.memory", "512m")
            .config("spark.cores.max", "2")
            .config("spark.driver.extraJavaOptions", QUICK_JVM)
            .config("spark.executor.extraJavaOptions", QUICK_JVM)
        )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def wait_until(what: str, check: Callable[[], T], timeout: float, step: float = 0.05) -> T:
    """Poll ``check`` until it returns something true; return it. Fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(step)


def start_stream(
    spark: Any,
    catalog: SequenceCatalog,
    out: Path,
    checkpoint: Path,
    *,
    source: str = SOURCE,
    trigger: Mapping[str, Any] | None = None,
    columns: Mapping[str, Any] | None = None,
    **options: Any,
) -> Any:
    """Stream ``catalog`` into Parquet at ``out`` with ``checkpoint``; return the query.

    ``options`` are the source's options (values are turned into strings); ``trigger`` the
    keyword arguments of ``DataStreamWriter.trigger`` (default: every 500 ms); ``columns``:
    name -> ``Column``, added to the source's two columns.
    """
    reader = spark.readStream.format(source).option("catalog", catalog.path)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    frame = reader.load()
    for name, column in (columns or {}).items():
        frame = frame.withColumn(name, column)
    return (
        frame.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(**(trigger or {"processingTime": TRIGGER}))
        .start()
    )


def sink_rows(spark: Any, out: Path) -> list[tuple[str, int]]:
    """The ``(split, position)`` rows of committed batches in the Parquet sink, sorted."""
    return sorted((r["split"], r["position"]) for r in spark.read.parquet(str(out)).collect())


def assert_exactly_once(rows: list[tuple[str, int]], expected: list[tuple[str, int]]) -> None:
    """Every expected record once: no duplicate, nothing missing, nothing unexpected."""
    duplicates = sorted(r for r, n in Counter(rows).items() if n > 1)
    missing = sorted(set(expected) - set(rows))
    unexpected = sorted(set(rows) - set(expected))
    assert not duplicates, f"{len(duplicates)} records more than once, e.g. {duplicates[:10]}"
    assert not missing, f"{len(missing)} of {len(expected)} records missing, e.g. {missing[:10]}"
    assert not unexpected, f"{len(unexpected)} records not in the catalog: {unexpected[:10]}"
    assert sorted(rows) == sorted(expected)


def source_progress(progress: Mapping[str, Any]) -> Mapping[str, Any]:
    (source,) = progress["sources"]
    return source


def reported_splits(progress: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Split id -> ``{owner, position, latest, lag}`` from the source's ``reportLatestOffset``.

    Spark calls ``reportLatestOffset`` right after planning the batch the progress is about,
    so ``position`` is where that batch stops.
    """
    if not progress:
        return {}
    latest = source_progress(progress).get("latestOffset")
    if not latest or latest == "null":
        return {}
    return dict(json.loads(latest)["splits"])


def log_position(query: Any, slot: str) -> int | None:
    """Where the last planned batch of a running CDC query stops its log split ``log:slot``
    (None before the log starts); a query that failed fails the caller."""
    if query.exception() is not None:
        raise AssertionError(f"the query failed: {query.exception()}")
    split = reported_splits(query.lastProgress).get(f"log:{slot}")
    return None if split is None else int(split["position"])


def end_offset(progress: Mapping[str, Any]) -> dict[str, Any]:
    """The splitflow offset of the batch the progress is about (its ``endOffset``)."""
    return dict(json.loads(source_progress(progress)["endOffset"]))


def caught_up(query: Any, catalog: SequenceCatalog, *, ignore: Iterable[str] = ()) -> bool:
    """The last completed batch reached the end of every split the catalog has now."""
    splits = reported_splits(query.lastProgress)
    lengths = {s: n for s, n in catalog.lengths().items() if s not in set(ignore)}
    return bool(lengths) and all(
        s in splits and splits[s]["position"] == n for s, n in lengths.items()
    )


def wait_caught_up(
    query: Any, catalog: SequenceCatalog, timeout: float = 60, *, ignore: Iterable[str] = ()
) -> None:
    def check() -> bool:
        if query.exception() is not None:
            raise AssertionError(f"the query failed: {query.exception()}")
        return caught_up(query, catalog, ignore=ignore)

    wait_until(f"the query to read all of {catalog.lengths()}", check, timeout)


def data_batches(query: Any) -> list[dict[str, Any]]:
    """The progress of each batch that read rows, once per batch id, in batch order."""
    by_batch = {p["batchId"]: p for p in query.recentProgress if p["numInputRows"] > 0}
    return [by_batch[b] for b in sorted(by_batch)]


def log_ids(checkpoint: Path, log: str) -> list[int]:
    """Batch ids written to ``<checkpoint>/<log>`` (``offsets`` or ``commits``)."""
    folder = checkpoint / log
    if not folder.is_dir():
        return []
    return sorted(int(name) for name in os.listdir(folder) if name.isdigit())


def expanded(offset: Mapping[str, Any], state_dir: str | Path | StateStore | None) -> Any:
    """A splitflow offset as format 1 (the whole checkpoint), its state read back from the
    query's ``state_dir`` if it keeps it there."""
    if state_dir is None:
        return expand_offset(offset, None)
    store = state_dir if isinstance(state_dir, StateStore) else str(state_dir)
    return expand_offset(offset, OffsetState(store))


def logged_offset(checkpoint: Path, batch: int, state_dir: Path | None) -> Any:
    """The splitflow offset (one source per query) Spark logged for ``batch``, whole."""
    lines = (checkpoint / "offsets" / str(batch)).read_text().splitlines()
    return expanded(json.loads(lines[2]), state_dir)


def batches_reading_nothing(checkpoint: Path, state_dir: Path | None = None) -> list[int]:
    """Batches whose splitflow offset (one source per query) gives no slice of its own a
    record to read: a batch Spark ran for nothing. An entry is ``[split id, split, start,
    stop, the batch that read it, (1 if it ends)]``."""
    empty = []
    for batch in log_ids(checkpoint, "offsets"):
        offset = logged_offset(checkpoint, batch, state_dir)
        seq = offset["seq"]
        slices = [entry[2:5] for slot in offset["slots"] for entry in slot]
        if not any(stop > start and read_by == seq for start, stop, read_by in slices):
            empty.append(batch)
    return empty


def owner_loads(splits: Mapping[str, Mapping[str, Any]], parallelism: int) -> list[int]:
    """How many splits each of ``parallelism`` slots owns."""
    loads = [0] * parallelism
    for info in splits.values():
        loads[int(info["owner"])] += 1
    return loads


# -- a driver in its own process, to be killed -----------------------------------------------


class Killable(Protocol):
    """A job in a process group of its own (``start_new_session``)."""

    process: subprocess.Popen[Any]

    def kill(self) -> None:
        """SIGKILL its process group."""


def kill_before_commit(
    job: Killable,
    what: str,
    find: Callable[[], int | None],
    checkpoint: Path,
    timeout: float,
    step: float = 0.05,
) -> int:
    """Kill ``job`` while the batch that ``find`` returns (once it returns one; an
    uncommitted one when it looks) is not committed; returns that batch. Spark may commit
    it between ``find`` and the kill, so the job's processes are stopped (SIGSTOP) first
    and killed only while the batch is still not in the commits log; else they go on
    until ``find`` finds another."""
    deadline = time.monotonic() + timeout
    group = job.process.pid
    while True:
        batch = wait_until(what, find, max(0.0, deadline - time.monotonic()), step)
        _stop(group)
        if batch not in log_ids(checkpoint, "commits"):
            job.kill()
            assert batch not in log_ids(checkpoint, "commits")
            return batch
        os.killpg(group, signal.SIGCONT)


def _stop(group: int, timeout: float = 2.0) -> None:
    """Stop every thread of process group ``group`` (SIGSTOP). The signal is sent again
    until they are: a thread in a system call (the rename that commits a batch, say)
    stops when the call returns, and a process forked as the signal went out misses it.
    A thread that stays in an uninterruptible wait (``D``: the JVM's thread that started a
    process with ``vfork`` waits for its child, which stopped before it could ``exec``) is
    let be after ``timeout`` seconds; anything else still running then fails."""
    deadline = time.monotonic() + timeout
    while running := _running(group):
        if time.monotonic() > deadline:
            if all(thread.endswith(" D") for thread in running):
                return
            raise AssertionError(f"process group {group} did not stop: {running[:10]}")
        os.killpg(group, signal.SIGSTOP)
        time.sleep(0.005)


def _running(group: int) -> list[str]:
    """The threads of process group ``group`` that are not stopped (``pid/tid (name) state``;
    a zombie counts as stopped)."""
    running = []
    for stat in Path("/proc").glob("[0-9]*/task/[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # ended meanwhile
        head, rest = text.rsplit(")", 1)
        state, _, pgrp = rest.split()[:3]
        if int(pgrp) == group and state not in "tTZX":
            pid, tid, name = stat.parents[2].name, stat.parent.name, head.split("(", 1)[1]
            running.append(f"{pid}/{tid} ({name}) {state}")
    return running


class Job:
    """``python -m tests.spark.jobs ...`` in its own process group; its output lines, live."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.lines: list[str] = []
        self._log = log.open("a", encoding="utf-8")
        self._log.write(f"$ jobs {' '.join(args)}\n")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.spark.jobs", *args],
            cwd=REPO_ROOT,
            env=spark_env(),
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            start_new_session=True,
        )
        assert self.process.stdout is not None
        self._reader = threading.Thread(target=self._follow, args=(self.process.stdout,))
        self._reader.start()

    def _follow(self, stdout: IO[str]) -> None:
        for line in stdout:
            self.lines.append(line.rstrip("\n"))
            self._log.write(line)
            self._log.flush()

    def batches(self) -> list[int]:
        """Ids of the batches this run completed, in order."""
        return [int(line.split()[1]) for line in self.lines if line.startswith("BATCH ")]

    def triggered(self) -> bool:
        """Whether the query has run a trigger: a batch completed, or one found nothing new."""
        return bool(self.batches()) or "IDLE" in self.lines

    def check_alive(self) -> bool:
        if self.process.poll() is not None:
            self._reader.join(5)
            raise AssertionError(f"the job exited with {self.process.returncode}: {self.lines}")
        return True

    def kill(self) -> None:
        """SIGKILL the whole process group: driver, JVM, streaming runner, Python workers."""
        pgid = self.process.pid
        os.killpg(pgid, signal.SIGKILL)
        self.process.wait(30)

        def group_gone() -> bool:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return True
            return False

        wait_until(f"process group {pgid} to die", group_gone, 30)
        self._reader.join(10)

    def finish(self, timeout: float) -> int:
        code = self.process.wait(timeout)
        self._reader.join(10)
        return code

    def close(self) -> None:
        if self.process.poll() is None:
            self.kill()
        self._reader.join(10)
        self._log.close()
