"""Exactly-once on a real multi-process Spark cluster, across a hard kill of the driver.

The cluster (a master and two one-core workers, see :mod:`tests.spark.cluster`) runs in its
own processes; so does the driver: this file run as a script (``python <this file>
<config.json>``) is a driver with its own ``SparkSession(master=spark://...)``. A separate
process because the rest of the suite shares one local-mode session in the test process,
and because a driver is what the test kills.

The scenario, with a file-backed :class:`~splitflow.testing.sequence.SequenceCatalog` that
the test, the driver's planner and the executors all read:

1. run 1 streams ``splitflow-sequence`` (parallelism 2, 25 records per batch, discovery
   every second) into Parquet with a checkpoint; after its first committed batch the test
   adds a split and appends to another; once more batches are planned, the test SIGKILLs
   the driver's process group, if possible while a batch is planned but not committed;
2. run 2 starts on the same checkpoint; the test adds a split and appends to two others,
   then asks the driver to finish: it processes all that is available, reads the Parquet
   output back with Spark, runs a small side job that reports each task's process, and
   writes all of it to a JSON file;
3. the output equals ``catalog.records()``: every record exactly once. The streaming tasks
   ran on both executors (status REST API) and the side job's tasks ran in two Python
   processes under the two workers' work folders. After the cluster stops, none of its
   processes (daemons, executors, Python workers) is left.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from tests.spark.cluster import (
    QUICK_JVM,
    StandaloneCluster,
    script_driver,
    standalone_cluster,
)

from splitflow.testing.sequence import SequenceCatalog

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("java") is None, reason="Spark needs Java 17 on PATH"),
]

RECORDS_PER_BATCH = 25


# -- the driver: this file run as a script ---------------------------------------------------


def _wait(what: str, ready: Callable[[], bool], timeout: float, step: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} after {timeout:g}s")
        time.sleep(step)


def _executors(spark: Any) -> list[dict[str, Any]]:
    """Each executor's id and task count, from the driver's status REST API."""
    import urllib.request

    context = spark.sparkContext
    jsc = context._jsc
    # Both executors registered (the driver is an entry of this map too).
    _wait("2 executors", lambda: jsc.sc().getExecutorMemoryStatus().size() >= 3, 60, 0.2)
    url = f"{context.uiWebUrl}/api/v1/applications/{context.applicationId}/executors"
    with urllib.request.urlopen(url, timeout=10) as response:
        return [
            {"id": e["id"], "totalTasks": e["totalTasks"]}
            for e in json.load(response)
            if e["id"] != "driver"
        ]


def run_driver(config: dict[str, Any]) -> None:
    """Stream the catalog into Parquet until ``stop`` exists, then report (see module doc)."""
    from pyspark.sql import SparkSession

    from splitflow.spark import register

    control = Path(config["control"])
    spark = (
        SparkSession.builder.master(config["master"])
        .appName(f"splitflow-exactly-once-run-{config['run']}")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.executor.memory", "512m")
        .config("spark.cores.max", "2")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.extraJavaOptions", QUICK_JVM)
        .config("spark.executor.extraJavaOptions", QUICK_JVM)
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    query = (
        spark.readStream.format("splitflow-sequence")
        .option("catalog", config["catalog"])
        .option("parallelism", "2")
        .option("maxRecordsPerBatch", str(RECORDS_PER_BATCH))
        .option("discoveryInterval", "1s")
        .load()
        .writeStream.format("parquet")
        .option("path", config["out"])
        .option("checkpointLocation", config["checkpoint"])
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    (control / f"started-{config['run']}").touch()

    def stop_requested() -> bool:
        if query.exception() is not None:
            raise RuntimeError(f"the query failed: {query.exception()}")
        return (control / "stop").exists()

    _wait("stop request", stop_requested, 600, 0.1)
    query.processAllAvailable()
    executors = _executors(spark)  # before any other job: only streaming tasks ran so far
    expected = len(SequenceCatalog(path=config["catalog"]).records())
    written = spark.read.parquet(config["out"]).count()
    deadline = time.monotonic() + 60
    while written < expected and time.monotonic() < deadline:  # discovery may lag a second
        time.sleep(0.5)
        query.processAllAvailable()
        written = spark.read.parquet(config["out"]).count()
    query.stop()

    def where(_: int) -> tuple[int, str]:
        time.sleep(0.5)  # keep both cores busy so the tasks spread over both executors
        return os.getpid(), os.getcwd()

    side = spark.sparkContext.parallelize(range(4), 4).map(where).collect()
    rows = [(r.split, r.position) for r in spark.read.parquet(config["out"]).collect()]
    result = {"rows": rows, "executors": executors, "tasks": side}
    Path(config["result"]).write_text(json.dumps(result))
    spark.stop()


# -- the test -----------------------------------------------------------------------------------


def _batch_ids(folder: Path) -> list[int]:
    return sorted(int(p.name) for p in folder.glob("*") if p.name.isdigit())


def driver(tmp: Path, cluster: StandaloneCluster, run: int, **paths: Path) -> Any:
    config = {"master": cluster.master_url, "run": run, **{k: str(p) for k, p in paths.items()}}
    return script_driver(__file__, tmp, run, config)


@pytest.mark.timeout(420)
def test_exactly_once_on_a_standalone_cluster_across_a_driver_kill(tmp_path: Path) -> None:
    catalog = SequenceCatalog({"a": 150, "b": 100}, path=str(tmp_path / "catalog.json"))
    control = tmp_path / "control"
    control.mkdir()
    checkpoint = tmp_path / "checkpoint"
    paths = {
        "catalog": Path(catalog.path or ""),
        "out": tmp_path / "out",
        "checkpoint": checkpoint,
        "control": control,
        "result": tmp_path / "result.json",
    }

    def committed() -> list[int]:
        return _batch_ids(checkpoint / "commits")

    def planned() -> list[int]:
        return _batch_ids(checkpoint / "offsets")

    with standalone_cluster(workers=2, cores=1, memory="1g", root=tmp_path / "cluster") as cluster:
        # Run 1: the catalog changes while it runs; then a hard kill, mid-batch if we can.
        with driver(tmp_path, cluster, 1, **paths) as run1:
            _wait("run 1's first commit", lambda: run1.check_alive() and bool(committed()), 120)
            catalog.add("c", 30)
            catalog.append("a", 50)

            def mid_batch() -> bool:
                run1.check_alive()
                done, todo = committed(), planned()
                return len(todo) >= 4 and todo[-1] > (done[-1] if done else -1)

            _wait("a batch of run 1 in flight", mid_batch, 120, 0.01)
            run1.kill()
        in_flight = planned()[-1] > committed()[-1]
        print(f"run 1 killed with batches {committed()} committed, {planned()} planned")

        # Run 2 on the same checkpoint: more changes, then finish and report.
        with driver(tmp_path, cluster, 2, **paths) as run2:
            _wait("run 2", lambda: run2.check_alive() and (control / "started-2").exists(), 120)
            catalog.add("d", 20)
            catalog.append("b", 30)
            catalog.append("c", 10)
            first = committed()[-1]

            def two_more_batches() -> bool:
                return run2.check_alive() and committed()[-1] >= first + 2

            _wait("2 batches of run 2", two_more_batches, 120)
            (control / "stop").touch()
            run2.process.wait(timeout=180)
            assert run2.process.returncode == 0, run2.tail()
        result = json.loads(paths["result"].read_text())
        work_dirs = [cluster.work_dir(i).resolve() for i in range(2)]

    rows = sorted((split, position) for split, position in result["rows"])
    expected = catalog.records()
    duplicates = len(rows) - len(set(rows))
    missing = sorted(set(expected) - set(rows))
    assert duplicates == 0, f"{duplicates} duplicate rows"
    assert not missing, f"{len(missing)} missing rows, first {missing[:5]}"
    assert rows == expected
    assert len(expected) == 150 + 50 + 100 + 30 + 30 + 10 + 20
    print(f"{len(rows)} rows exactly once; run 1 was killed mid-batch: {in_flight}")

    # A multi-process cluster: both executors ran streaming tasks of run 2 ...
    executors = result["executors"]
    assert len(executors) == 2, executors
    assert all(e["totalTasks"] > 0 for e in executors), executors
    # ... and the side job's tasks ran in two Python processes, one under each worker.
    pids = {pid for pid, _ in result["tasks"]}
    workers = {Path(cwd).resolve().parents[1] for _, cwd in result["tasks"]}
    assert len(pids) >= 2, result["tasks"]
    assert workers == set(work_dirs), (workers, work_dirs)

    assert cluster.leftovers() == []


def test_cluster_stops_every_process_when_the_body_fails(tmp_path: Path) -> None:
    clusters: list[StandaloneCluster] = []

    def failing_body() -> None:
        with standalone_cluster(workers=1, root=tmp_path) as cluster:
            clusters.append(cluster)
            assert cluster.alive_workers() == 1
            assert len(cluster.leftovers()) >= 2  # the master and the worker, at least
            raise RuntimeError("the body failed")

    with pytest.raises(RuntimeError, match="the body failed"):
        failing_body()
    assert clusters[0].leftovers() == []


if __name__ == "__main__":
    run_driver(json.loads(Path(sys.argv[1]).read_text()))
