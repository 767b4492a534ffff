"""splitflow sources from a Spark Connect session: batch, AvailableNow streaming, restart.

One Spark Connect server for the whole module (``spark-submit --class ...SparkConnectServer``
from the installed pyspark, ``local[2,3]``, on a free port of 127.0.0.1), in its own process
group, stopped after the module. Clients run in subprocesses: this file run as a script
(``python tests/spark/test_connect.py <config.json>``). A Connect client sets
``SPARK_CONNECT_MODE_ENABLED`` in its process's environment, which turns every later
``pyspark.sql`` call of that process into a Connect call; the rest of the suite shares a
classic session in the test process, so the two must not meet there.

Each client registers the sources on its Connect session (``session(builder)`` sends the
data source classes to the server, whose Python workers import ``splitflow``), runs one
step and writes what it saw to a JSON file; the test checks it against the catalog.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from tests.spark.cluster import QUICK_JVM, SPARK_HOME, free_port, stop_processes
from tests.spark.support import REPO_ROOT, assert_exactly_once, log_ids, spark_env, wait_until

from splitflow.testing.sequence import SequenceCatalog

pytestmark = pytest.mark.slow


# -- the client: this file run as a script ----------------------------------------------------


def run_client(config: dict[str, Any]) -> dict[str, Any]:
    """Connect to ``config["url"]``, register the sources, run ``config["step"]``."""
    from pyspark.sql import SparkSession

    from splitflow.spark import session
    from splitflow.spark.warmstart import WarmStart

    spark = session(SparkSession.builder.remote(config["url"]))  # registers the sources
    assert type(spark).__module__ == "pyspark.sql.connect.session", type(spark)
    assert WarmStart._current is None, "a warm process for a server that starts its own"
    try:
        if config["step"] == "batch":
            return batch_step(spark, config)
        if config["step"] == "stream":
            return stream_step(spark, config)
        raise SystemExit(f"unknown step {config['step']!r}")
    finally:
        spark.stop()


def batch_step(spark: Any, config: dict[str, Any]) -> dict[str, Any]:
    """A batch read of each source, and an invalid option."""
    rows = (
        spark.read.format("splitflow-sequence")
        .option("catalog", config["catalog"])
        .option("parallelism", "3")
        .load()
        .collect()
    )
    generated = (
        spark.read.format("splitflow-generator")
        .option("splits", "3")
        .option("rowsPerSplit", "1000")
        .option("parallelism", "2")
        .load()
        .selectExpr(
            "count(*) AS n", "count(DISTINCT split, id) AS distinct_rows", "sum(value) AS v"
        )
        .collect()[0]
    )
    try:
        spark.read.format("splitflow-sequence").option("catalog", config["catalog"]).option(
            "parallelism", "0"
        ).load().collect()
        invalid = None
    except Exception as exc:  # the server's error, as the Connect client raises it
        invalid = f"{type(exc).__name__}: {exc}"
    return {
        "rows": [[r["split"], r["position"]] for r in rows],
        "generated": generated.asDict(),
        "invalid": invalid,
    }


def stream_step(spark: Any, config: dict[str, Any]) -> dict[str, Any]:
    """One AvailableNow run into Parquet; the sink read back (as Spark reads it)."""
    query = (
        spark.readStream.format("splitflow-sequence")
        .option("catalog", config["catalog"])
        .option("parallelism", "2")
        .option("maxRecordsPerBatch", str(config["max_records_per_batch"]))
        .option("discoveryInterval", "1s")
        .load()
        .writeStream.format("parquet")
        .option("path", config["out"])
        .option("checkpointLocation", config["checkpoint"])
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(config.get("timeout", 180))
    if query.isActive:
        query.stop()
        raise SystemExit("the AvailableNow query did not terminate in time")
    if query.exception() is not None:
        raise SystemExit(f"the query failed: {query.exception()}")
    rows = spark.read.parquet(config["out"]).collect()
    return {"rows": [[r["split"], r["position"]] for r in rows]}


# -- the server and the clients, from the test process -----------------------------------------


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Spark Connect server for this module: its ``sc://`` URL. Stopped (by PID) after."""
    root = tmp_path_factory.mktemp("connect-server")
    port = free_port()
    log = root / "server.log"
    env = spark_env()
    env["SPARK_HOME"] = str(SPARK_HOME)
    command = [
        str(SPARK_HOME / "bin" / "spark-submit"),
        *("--class", "org.apache.spark.sql.connect.service.SparkConnectServer"),
        *("--master", "local[2,3]"),  # up to 3 attempts per task, as in conftest.py
        *("--driver-java-options", QUICK_JVM),
        *("--conf", f"spark.connect.grpc.binding.port={port}"),
        *("--conf", "spark.connect.grpc.binding.address=127.0.0.1"),
        *("--conf", "spark.driver.host=127.0.0.1"),
        *("--conf", "spark.ui.enabled=false"),
        *("--conf", "spark.sql.shuffle.partitions=2"),
    ]
    with open(log, "wb") as out:
        server = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=root,  # its Python workers leave its process group but work here
            start_new_session=True,
        )
    try:

        def started() -> bool:
            if server.poll() is not None:
                raise AssertionError(
                    f"the Connect server exited with {server.returncode}:\n{tail(log)}"
                )
            return "Spark Connect server started at" in log.read_text(errors="replace")

        wait_until("the Spark Connect server", started, 120, step=0.2)
        yield f"sc://127.0.0.1:{port}"
    finally:
        left = stop_processes([server.pid], root)
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=30)
        assert not left, f"the Connect server left processes behind: {left}"


def tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def client(tmp_path: Path, url: str, step: str, **config: Any) -> dict[str, Any]:
    """Run this file as a Connect client for ``step``; return what it wrote."""
    name = f"{step}-{time.monotonic_ns()}"
    config_file, result_file = tmp_path / f"{name}.json", tmp_path / f"{name}.result.json"
    config_file.write_text(json.dumps({"url": url, "step": step, **config}))
    log = tmp_path / f"{name}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, __file__, str(config_file), str(result_file)],
            cwd=REPO_ROOT,
            env=spark_env(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        code = process.wait(timeout=240)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
    assert code == 0, f"the Connect client ({step}) exited with {code}:\n{tail(log)}"
    return dict(json.loads(result_file.read_text()))


def rows_of(result: dict[str, Any]) -> list[tuple[str, int]]:
    return sorted((str(split), int(position)) for split, position in result["rows"])


def test_batch_reads_from_a_connect_session_read_every_record_once(
    tmp_path: Path, connect_url: str
) -> None:
    catalog = SequenceCatalog({"a": 40, "b": 25, "c": 7}, path=str(tmp_path / "catalog.json"))
    result = client(tmp_path, connect_url, "batch", catalog=catalog.path)
    assert_exactly_once(rows_of(result), catalog.records())
    # splitflow-generator: 3 splits x 1000 rows, each (split, id) once
    assert result["generated"]["n"] == 3000
    assert result["generated"]["distinct_rows"] == 3000
    expected_sum = sum((i * 2654435761 + s * 97) % 1000003 for s in range(3) for i in range(1000))
    assert result["generated"]["v"] == expected_sum
    # an invalid option fails on the server with splitflow's message, naming the option
    assert result["invalid"] is not None
    assert "option parallelism" in result["invalid"], result["invalid"]


def test_available_now_on_connect_is_exactly_once_and_a_restart_resumes_from_the_checkpoint(
    tmp_path: Path, connect_url: str
) -> None:
    catalog = SequenceCatalog({"a": 45, "b": 20}, path=str(tmp_path / "catalog.json"))
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    paths = {"catalog": catalog.path, "out": str(out), "checkpoint": str(checkpoint)}

    first = client(tmp_path, connect_url, "stream", max_records_per_batch=20, **paths)
    assert_exactly_once(rows_of(first), catalog.records())
    first_run = log_ids(checkpoint, "offsets")
    assert len(first_run) >= 4, first_run  # 65 records, at most 20 per batch
    assert log_ids(checkpoint, "commits") == first_run  # every planned batch committed

    catalog.append("a", 13)
    catalog.add("c", 9)
    second = client(tmp_path, connect_url, "stream", max_records_per_batch=20, **paths)
    assert_exactly_once(rows_of(second), catalog.records())
    # the second run continued the checkpoint: it added batches, each committed once
    second_run = log_ids(checkpoint, "offsets")
    assert second_run[: len(first_run)] == first_run
    assert len(second_run) > len(first_run), second_run
    assert log_ids(checkpoint, "commits") == second_run

    third = client(tmp_path, connect_url, "stream", max_records_per_batch=20, **paths)
    assert log_ids(checkpoint, "offsets") == second_run  # nothing new: no batch planned
    assert_exactly_once(rows_of(third), catalog.records())


if __name__ == "__main__":
    outcome = run_client(json.loads(Path(sys.argv[1]).read_text()))
    Path(sys.argv[2]).write_text(json.dumps(outcome, default=str))
