"""A standalone streaming job, for tests that kill the driver and start it again.

Run from the repository root::

    python -m tests.spark.jobs [--catalog CATALOG.json] --out OUT --checkpoint CHK \\
        --parallelism 2 --max-records-per-batch 30 --trigger 500ms \\
        [--source splitflow-sequence-faulty] [--option readDelay=1s ...] \\
        [--done-file DONE] [--timeout 120] [--master local[2,4]]

It streams a splitflow source (by default the sequence source over a file-backed
:class:`~splitflow.testing.sequence.SequenceCatalog`; ``--source``, ``--schema`` and
``--option`` name another) into Parquet at ``OUT`` with the checkpoint ``CHK`` (its own
SparkSession on ``--master``, ``local[2]`` by default), and runs until

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
* ``CAUGHT-UP``, ``TERMINATED``, ``FAILED <error>`` or ``TIMEOUT`` before it exits.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
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
    return parser.parse_args(argv)


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
    query = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", args.out)
        .option("checkpointLocation", args.checkpoint)
        .trigger(**parse_trigger(args.trigger))
        .start()
    )
    say(f"STARTED {query.id} {query.runId}")

    deadline = time.monotonic() + args.timeout
    reported: set[int] = set()

    def report_batches() -> None:
        for progress in query.recentProgress:
            batch = progress["batchId"]
            if batch in reported or progress["numInputRows"] == 0:
                continue
            reported.add(batch)
            say(
                f"BATCH {batch} rows={progress['numInputRows']} "
                f"positions={json.dumps(positions(progress), sort_keys=True)}"
            )

    while query.isActive:
        report_batches()
        if catalog is not None and args.done_file and os.path.exists(args.done_file):
            done = positions(query.lastProgress)
            lengths = catalog.lengths()
            if lengths and all(done.get(s, -1) >= n for s, n in lengths.items()):
                say("CAUGHT-UP")
                query.stop()
                break
        if time.monotonic() > deadline:
            say("TIMEOUT")
            query.stop()
            return 3
        time.sleep(0.05)
    report_batches()
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
