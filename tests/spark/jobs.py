"""A standalone streaming job, for tests that kill the driver and start it again.

Run from the repository root::

    python -m tests.spark.jobs [--catalog CATALOG.json] --out OUT --checkpoint CHK \\
        --parallelism 2 --max-records-per-batch 30 --trigger 500ms \\
        [--source splitflow-sequence-faulty] [--option readDelay=1s ...] \\
        [--done-file DONE] [--timeout 120] [--master local[2,4]] \\
        [--sink write-count [--fail-once]]

It streams a splitflow source (by default the sequence source over a file-backed
:class:`~splitflow.testing.sequence.SequenceCatalog`; ``--source``, ``--schema`` and
``--option`` name another) into Parquet at ``OUT`` with the checkpoint ``CHK`` (its own
SparkSession on ``--master``, ``local[2]`` by default). ``--sink`` says how:

* ``parquet`` (the default): Spark's file sink, which reads each batch once;
* ``write-count``, ``count-write``, ``write-twice``: a ``foreachBatch`` sink that reads
  every batch more than once (:class:`ForeachBatchSink`), as a job with several actions on
  a batch does; ``--fail-once`` also fails the first attempt of every task of its second
  action, so that Spark retries the task, which reads its slice once more.

It runs until

* it is killed (the tests SIGKILL its process group: this Python driver, its JVM, the
  streaming runner and the Python workers), or
* ``DONE`` exists and the last completed batch reached, for every split the catalog lists
  then, its length (for another source than the sequence: the position the catalog gives)
  (the test's producer writes ``DONE`` after its last change): it stops the query
  and exits 0, or
* the query terminates by itself (``--trigger availableNow`` or ``once``): exit 0, or
* the query fails (exit 2), or ``--timeout`` seconds pass (exit 3).

It prints one line per event, flushed at once, for the test to follow:

* ``STARTED <query id> <run id>`` when the query is running;
* ``BATCH <batch id> rows=<n> positions=<json>`` when batch ``<batch id>`` has completed
  (its output and commit are written); ``positions`` is split id -> end of that batch;
* ``APPLIED <batch id> skipped=<0|1> version=<n>`` for each batch ``--sink delta`` applied
  (``COUNTED <batch id> rows=<n>`` before it with ``--sink count-delta``); with
  ``--restart-on-schema-change`` a query that fails with a recorded CDC schema change is
  started again in the same process (``STARTED`` again);
* ``IDLE`` once, at the first trigger that found nothing to read (a restarted query whose
  source has nothing new plans no batch, as Spark's own sources);
* ``CAUGHT-UP``, ``TERMINATED``, ``FAILED <error>`` or ``TIMEOUT`` before it exits.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.spark.support import driver_session


def parse_trigger(text: str) -> dict[str, Any]:
    """``500ms``, ``2s``: processing time; ``availableNow``; ``once``."""
    if text == "availableNow":
        return {"availableNow": True}
    if text == "once":
        return {"once": True}
    if text.endswith("ms"):
        return {"processingTime": f"{int(text[:-2])} milliseconds"}
    if text.endswith("s"):
        return {"processingTime": f"{float(text[:-1]):g} seconds"}
    raise SystemExit(f"--trigger: {text!r} is not 500ms, 2s, availableNow or once")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.spark.jobs", description=__doc__)
    parser.add_argument("--catalog", default=None, help="sequence catalog JSON file")
    parser.add_argument("--master", default="local[2]", help="Spark master (local[2])")
    parser.add_argument("--out", required=True, help="Parquet output folder")
    parser.add_argument("--checkpoint", required=True, help="query checkpoint folder")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--max-records-per-batch", type=int, default=None)
    parser.add_argument("--trigger", default="500ms")
    parser.add_argument("--source", default="splitflow-sequence")
    parser.add_argument("--schema", default=None, help="the source's schema (a DDL string)")
    parser.add_argument(
        "--option", action="append", default=[], metavar="KEY=VALUE", help="a source option"
    )
    parser.add_argument("--done-file", default=None, help="stop once this exists and caught up")
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--sink", choices=SINKS, default="parquet", help="how to write (parquet)")
    parser.add_argument(
        "--fail-once",
        action="store_true",
        help="fail the first attempt of every task of the sink's second action",
    )
    parser.add_argument("--mirror-keys", default="id", help="--sink delta: the key columns")
    parser.add_argument(
        "--kill-after-batch",
        type=int,
        default=None,
        help="--sink delta: SIGKILL the driver once this batch is applied (once per --out)",
    )
    parser.add_argument(
        "--history",
        default=None,
        help="--sink delta: first write each batch to <HISTORY>/batch=<id> (Parquet)",
    )
    parser.add_argument(
        "--restart-on-schema-change",
        action="store_true",
        help="run the query with splitflow.spark.run_restarting",
    )
    parser.add_argument(
        "--kill-after-restart",
        action="store_true",
        help="--sink delta: SIGKILL the driver once the first batch of a query restarted in "
        "this process is applied (once per --out)",
    )
    args = parser.parse_args(argv)
    if args.fail_once and args.sink in ("parquet", "delta", "count-delta"):
        parser.error("--fail-once needs a foreachBatch --sink (write-count, ...)")
    return args


SINKS = ("parquet", "write-count", "count-write", "write-twice", "delta", "count-delta")
"""The ``--sink`` choices: Spark's file sink, a :class:`ForeachBatchSink` mode, or a
:class:`DeltaMirrorSink`."""


def fail_first_attempt(
    batches: Iterator[Any], failures: str | None = None, batch_id: int = -1
) -> Iterator[Any]:
    """A ``mapInArrow`` function: passes the rows through, then fails if this is the task's
    first attempt (so Spark retries the task, whose retry reads its input again). Each
    failure first creates ``<failures>/<batch_id>-<partition>``, for the test to count."""
    from pyspark import TaskContext

    yield from batches
    context = TaskContext.get()
    if context is not None and context.attemptNumber() == 0:
        if failures is not None:
            Path(failures, f"{batch_id}-{context.partitionId()}").touch()
        raise RuntimeError("injected failure: the first attempt of each task fails")


class ForeachBatchSink:
    """A ``foreachBatch`` function that reads every batch more than once, in ``mode``:

    * ``write-count``: writes the batch, then counts it (``batch.count()``);
    * ``count-write``: counts it, then writes it;
    * ``write-twice``: writes it, then writes it again, to ``<out>/again``.

    A batch is written to ``<out>/batch=<id>`` (mode overwrite: a batch replayed after a
    crash replaces what an earlier attempt of it wrote), so the sink reads back in batch
    order (``tests.support.cdc.sink_in_batch_order``). ``counts`` holds what each count
    returned, by batch id, and ``finished`` the batches whose call returned (in the driver
    that runs the query: a stop may cut the newest batch's short). With ``fail_once``, the
    second action runs through :func:`fail_first_attempt`: the first attempt of each of
    its tasks fails after reading its rows, and Spark's retry reads them once more (the
    master must allow retries: ``local[2,4]``); each failure leaves a file in
    ``<out>/_failures``.

    >>> ForeachBatchSink("write-count", "/out").folder(7)
    '/out/batch=7'
    >>> ForeachBatchSink("write-twice", "/out").folder(7, again=True)
    '/out/again/batch=7'
    """

    def __init__(self, mode: str, out: str | os.PathLike[str], fail_once: bool = False) -> None:
        if mode not in SINKS[1:-2]:
            raise ValueError(f"no foreachBatch sink {mode!r}: one of {SINKS[1:-2]}")
        self.mode, self.out, self.fail_once = mode, os.fspath(out), fail_once
        self.counts: dict[int, int] = {}
        self.finished: set[int] = set()

    def folder(self, batch_id: int, again: bool = False) -> str:
        return os.path.join(self.out, *(["again"] if again else []), f"batch={batch_id}")

    def __call__(self, batch: Any, batch_id: int) -> None:
        first, second = self.mode.split("-")  # write-twice: write, then write again
        self._act(first, batch, batch_id)
        if self.fail_once:
            failures = Path(self.out, "_failures")
            failures.mkdir(parents=True, exist_ok=True)
            fail = functools.partial(fail_first_attempt, failures=str(failures), batch_id=batch_id)
            batch = batch.mapInArrow(fail, batch.schema)
        if second == "twice":
            batch.write.mode("overwrite").parquet(self.folder(batch_id, again=True))
        else:
            self._act(second, batch, batch_id)
        self.finished.add(batch_id)

    def _act(self, action: str, batch: Any, batch_id: int) -> None:
        if action == "count":
            self.counts[batch_id] = batch.count()
        else:
            batch.write.mode("overwrite").parquet(self.folder(batch_id))


class DeltaMirrorSink:
    """A ``foreachBatch`` function that applies each batch of a CDC source to the Delta
    table at ``out`` (:func:`splitflow.cdc.apply_changes`) and prints
    ``APPLIED <batch id> skipped=<0|1> version=<n>``. With ``kill_after``: once that batch
    is applied, and the first time only (``<out>.killed`` records it), SIGKILLs the
    driver's process group: a crash between the Delta commit and Spark's."""

    def __init__(
        self,
        out: str,
        keys: list[str],
        kill_after: int | None = None,
        count_first: bool = False,
        history: str | None = None,
    ) -> None:
        self.out, self.keys, self.kill_after = out, keys, kill_after
        self.count_first, self.history = count_first, history
        self.kill_after_restart = False
        self.restarted = False  # set when a query of this process was restarted

    def __call__(self, batch: Any, batch_id: int) -> None:
        from splitflow.cdc import apply_changes

        if self.count_first:  # reads the batch, also a replay that apply_changes then skips
            say(f"COUNTED {batch_id} rows={batch.count()}")
        if self.history is not None:
            batch.write.mode("overwrite").parquet(os.path.join(self.history, f"batch={batch_id}"))
        applied = apply_changes(batch, batch_id, self.out, keys=self.keys)
        say(f"APPLIED {batch_id} skipped={int(applied.skipped)} version={applied.version}")
        marker = Path(f"{self.out}.killed")
        kill = batch_id == self.kill_after or (self.kill_after_restart and self.restarted)
        if kill and not marker.exists():
            marker.touch()
            os.killpg(os.getpgrp(), signal.SIGKILL)


def say(line: str) -> None:
    print(line, flush=True)


def positions(progress: dict[str, Any] | None) -> dict[str, int]:
    """Split id -> where the progress's batch stops, from ``reportLatestOffset``."""
    if not progress:
        return {}
    latest = progress["sources"][0].get("latestOffset")
    if not latest or latest == "null":
        return {}
    return {s: int(info["position"]) for s, info in json.loads(latest)["splits"].items()}


def run(args: argparse.Namespace) -> int:
    spark = driver_session("splitflow-e2e-job", args.master)
    from tests.spark.sources import TEST_SOURCES

    from splitflow.spark import register
    from splitflow.testing.sequence import SequenceCatalog

    register(spark, *TEST_SOURCES)
    catalog = SequenceCatalog(path=args.catalog) if args.catalog else None

    reader = spark.readStream.format(args.source).option("parallelism", str(args.parallelism))
    if args.schema:
        reader = reader.schema(args.schema)
    if args.source.startswith("splitflow-sequence"):
        reader = reader.option("catalog", args.catalog)
    if args.max_records_per_batch is not None:
        reader = reader.option("maxRecordsPerBatch", str(args.max_records_per_batch))
    for option in args.option:
        key, _, value = option.partition("=")
        reader = reader.option(key, value)
    sink: Any = None
    if args.sink in ("delta", "count-delta"):
        keys = args.mirror_keys.split(",")
        counted = args.sink == "count-delta"
        sink = DeltaMirrorSink(args.out, keys, args.kill_after_batch, counted, args.history)
        sink.kill_after_restart = args.kill_after_restart
    elif args.sink != "parquet":
        sink = ForeachBatchSink(args.sink, args.out, args.fail_once)
    started = 0

    def start() -> Any:
        nonlocal started
        writer = (
            reader.load()
            .writeStream.option("checkpointLocation", args.checkpoint)
            .trigger(**parse_trigger(args.trigger))
        )
        if sink is None:
            writer = writer.format("parquet").option("path", args.out)
        else:
            writer = writer.foreachBatch(sink)
        if started and isinstance(sink, DeltaMirrorSink):
            sink.restarted = True
        started += 1
        query = writer.start()
        say(f"STARTED {query.id} {query.runId}")
        return query

    deadline = time.monotonic() + args.timeout
    reported: set[int] = set()
    idle = False
    timed_out = False

    def report_batches(query: Any) -> None:
        nonlocal idle
        for progress in query.recentProgress:
            batch = progress["batchId"]
            if progress["numInputRows"] == 0 and not idle:
                idle = True
                say("IDLE")
            if batch in reported or progress["numInputRows"] == 0:
                continue
            reported.add(batch)
            say(
                f"BATCH {batch} rows={progress['numInputRows']} "
                f"positions={json.dumps(positions(progress), sort_keys=True)}"
            )

    def watch(query: Any) -> None:
        nonlocal timed_out
        while query.isActive:
            report_batches(query)
            if catalog is not None and args.done_file and os.path.exists(args.done_file):
                done = positions(query.lastProgress)
                lengths = catalog.lengths()
                if lengths and all(done.get(s, -1) >= n for s, n in lengths.items()):
                    say("CAUGHT-UP")
                    query.stop()
                    break
            if time.monotonic() > deadline:
                say("TIMEOUT")
                timed_out = True
                query.stop()
                return
            time.sleep(0.05)
        report_batches(query)

    if args.restart_on_schema_change:
        from splitflow.spark import run_restarting

        try:
            query = run_restarting(start, wait=watch)
        except Exception as error:
            say(f"FAILED {error}".replace("\n", " | "))
            return 2
    else:
        query = start()
        watch(query)
    if timed_out:
        return 3
    if query.exception() is not None:
        say(f"FAILED {query.exception()}".replace("\n", " | "))
        return 2
    say("TERMINATED")
    spark.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
