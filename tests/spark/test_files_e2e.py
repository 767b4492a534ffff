"""The files source on Spark, end to end: a growing directory, kills, bad input, options.

The kill test runs the query in its own driver process (this module, run as
``python -m tests.spark.test_files_e2e --job ...``), SIGKILLs its process group twice with
a batch planned and not committed, and restarts it on the same checkpoint while files keep
arriving. The sink is then compared with the files, record by record.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from tests.spark.support import (
    REPO_ROOT,
    assert_exactly_once,
    batches_reading_nothing,
    driver_session,
    kill_before_commit,
    log_ids,
    logged_offset,
    spark_env,
    wait_until,
)

SCHEMA_DDL = "file string, n bigint, pad string"
ROWS_PER_FILE = 20


def rows_of(name: str, count: int = ROWS_PER_FILE) -> list[dict[str, Any]]:
    return [{"file": name, "n": i, "pad": "p" * (i * 7 % 60)} for i in range(count)]


def write_json(directory: Path, name: str, rows: list[dict[str, Any]]) -> None:
    """Write a JSON lines file atomically: a dot file, renamed into place."""
    temporary = directory / f".{name}.tmp"
    temporary.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(temporary, directory / name)


def expected_rows(names: list[str]) -> list[tuple[str, int, str]]:
    return sorted((r["file"], r["n"], r["pad"]) for name in names for r in rows_of(name))


def sink_rows(spark: Any, out: Path) -> list[tuple[str, int, str]]:
    if not (out / "_spark_metadata").is_dir():
        return []
    return sorted(
        (r["file"], r["n"], r["pad"])
        for r in spark.read.schema(SCHEMA_DDL).parquet(str(out)).collect()
    )


# -- the job: a driver in its own process ----------------------------------------------------


def job_main(argv: list[str]) -> int:
    """Stream ``--src`` (JSON lines) into Parquet at ``--out`` until killed or timed out."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--job", action="store_true")
    parser.add_argument("--src", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--state", required=True)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args(argv)
    spark = driver_session("splitflow-files-job")
    query = (
        spark.readStream.format("splitflow-files")
        .schema(SCHEMA_DDL)
        .option("path", args.src)
        .option("format", "json")
        .option("parallelism", "2")
        .option("maxFilesPerBatch", "4")
        .option("maxSplitBytes", "700")
        .option("discoveryInterval", "200ms")
        .option("stateDir", args.state)
        .load()
        .writeStream.format("parquet")
        .option("path", args.out)
        .option("checkpointLocation", args.checkpoint)
        .trigger(processingTime="300 milliseconds")
        .start()
    )
    print(f"STARTED {query.id}", flush=True)
    deadline = time.monotonic() + args.timeout
    while query.isActive and time.monotonic() < deadline:
        time.sleep(0.1)
    print(f"ENDED {query.exception()}".replace("\n", " | "), flush=True)
    return 2


class Job:
    """The job in its own process group, so a SIGKILL takes its JVM and workers too."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log.open("a", encoding="utf-8")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.spark.test_files_e2e", "--job", *args],
            cwd=REPO_ROOT,
            env=spark_env(),
            stdout=self.log,
            stderr=self.log,
            start_new_session=True,
        )

    def alive(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"the job exited with {self.process.returncode}; see {self.log}")
        return True

    def kill(self) -> None:
        """SIGKILL the process group (idempotent)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)
        self.log.close()


class Producer(threading.Thread):
    """Writes a new JSON lines file every ``every`` seconds, named in order, ``limit`` at most
    (the test's runs must read them all in a few minutes on two shared cores)."""

    def __init__(self, directory: Path, every: float = 0.5, limit: int = 40) -> None:
        super().__init__(daemon=True)
        self.directory, self.every, self.limit = directory, every, limit
        self.names: list[str] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.every) and len(self.names) < self.limit:
            name = f"f{len(self.names):05d}.json"
            write_json(self.directory, name, rows_of(name))
            self.names.append(name)

    def stop(self) -> None:
        self.stopped.set()
        self.join(10)


def uncommitted_offset(checkpoint: Path) -> int | None:
    in_flight = set(log_ids(checkpoint, "offsets")) - set(log_ids(checkpoint, "commits"))
    return min(in_flight, default=None)


def kill_in_flight(job: Job, checkpoint: Path, run: int) -> None:
    """Wait until ``job`` committed a batch and planned the next; SIGKILL it then."""
    committed = len(log_ids(checkpoint, "commits"))
    wait_until(
        f"run {run} to commit a batch",
        lambda: job.alive() and len(log_ids(checkpoint, "commits")) > committed,
        180,
    )
    kill_before_commit(
        job,
        f"run {run} to have a batch in flight",
        lambda: uncommitted_offset(checkpoint) if job.alive() else None,
        checkpoint,
        60,
        step=0.01,
    )


@pytest.mark.slow
def test_growing_directory_with_driver_kills_is_read_exactly_once(
    tmp_path: Path, spark: Any
) -> None:
    """Files arrive all along; the driver is SIGKILLed twice with a batch in flight.

    Each file is several splits (700-byte parts of ~1.6 kB files), at most four new files
    start per batch, and the ledger of read files lives in ``stateDir``. After the third run
    has read everything, the sink holds every row of every file exactly once.
    """
    src, out, checkpoint, state = (tmp_path / n for n in ("src", "out", "chk", "state"))
    src.mkdir()
    for i in range(6):  # a backlog waiting at the start
        write_json(src, f"a{i:03d}.json", rows_of(f"a{i:03d}.json"))
    backlog = [f"a{i:03d}.json" for i in range(6)]
    args = [f"--src={src}", f"--out={out}", f"--checkpoint={checkpoint}", f"--state={state}"]
    producer = Producer(src)
    producer.start()
    jobs: list[Job] = []
    try:
        for run in (1, 2):
            job = Job(args, tmp_path / "jobs.log")
            jobs.append(job)
            kill_in_flight(job, checkpoint, run)
        producer.stop()
        names = backlog + list(producer.names)
        expected = expected_rows(names)
        final = Job(args, tmp_path / "jobs.log")
        jobs.append(final)
        wait_until(
            "run 3 to read every file",
            lambda: final.alive() and len(sink_rows(spark, out)) >= len(expected),
            240,
            step=1.0,
        )
        final.kill()
    finally:
        producer.stop()
        for job in jobs:
            job.kill()
    assert len(producer.names) > 15, "files kept arriving during the runs"
    assert_exactly_once(sink_rows(spark, out), expected)
    assert (state / "ledger").is_dir(), "the ledger of read files is kept in stateDir"


# -- in the shared session -------------------------------------------------------------------


def stream(
    spark: Any,
    src: Path,
    tmp_path: Path,
    schema: str | None = SCHEMA_DDL,
    trigger: str = "300 milliseconds",
    **options: Any,
) -> Any:
    reader = spark.readStream.format("splitflow-files")
    options.setdefault("path", str(src))
    if schema:
        reader = reader.schema(schema)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return (
        reader.load()
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(**({"once": True} if trigger == "once" else {"processingTime": trigger}))
        .start()
    )


def wait_failed(query: Any, timeout: float = 90) -> str:
    def failed() -> str | None:
        error = query.exception()
        return None if error is None else str(error)

    return str(wait_until("the query to fail", failed, timeout, step=0.1))


def last_offset(checkpoint: Path, state_dir: Path) -> dict[str, Any]:
    return dict(logged_offset(checkpoint, max(log_ids(checkpoint, "offsets")), state_dir))


def write_corrupt(src: Path) -> int:
    """bad.json: five good lines, then a broken one; the broken line's byte."""
    good = "".join(json.dumps(r) + "\n" for r in rows_of("bad.json", 5)).encode()
    (src / ".bad").write_bytes(good + b'{"file": "bad.json", "n": broken\n')
    os.replace(src / ".bad", src / "bad.json")
    return len(good)


def corrupt_dir(tmp_path: Path) -> tuple[Path, int]:
    src = tmp_path / "src"
    src.mkdir()
    write_json(src, "good.json", rows_of("good.json"))
    return src, write_corrupt(src)


@pytest.mark.slow
def test_a_corrupt_file_fails_the_query_naming_file_and_byte(tmp_path: Path, spark: Any) -> None:
    """... and what the query committed before stays in the sink, once."""
    src = tmp_path / "src"
    src.mkdir()
    write_json(src, "good.json", rows_of("good.json"))
    query = stream(spark, src, tmp_path, format="json")
    out, committed = tmp_path / "out", expected_rows(["good.json"])
    wait_until("the good rows", lambda: len(sink_rows(spark, out)) >= len(committed), 90, step=0.5)
    bad_at = write_corrupt(src)
    message = wait_failed(query)
    assert "bad.json" in message
    assert f"byte {bad_at}" in message
    assert sink_rows(spark, out) == committed


@pytest.mark.slow
def test_a_corrupt_file_is_quarantined_and_the_query_goes_on(tmp_path: Path, spark: Any) -> None:
    src, bad_at = corrupt_dir(tmp_path)
    query = stream(
        spark, src, tmp_path, format="json", badFiles="quarantine", stateDir=tmp_path / "state"
    )
    out = tmp_path / "out"
    first = expected_rows(["good.json"]) + sorted(
        (r["file"], r["n"], r["pad"]) for r in rows_of("bad.json", 5)
    )
    wait_until("the good rows", lambda: len(sink_rows(spark, out)) >= len(first), 90, step=0.5)
    write_json(src, "later.json", rows_of("later.json"))
    expected = sorted(first + expected_rows(["later.json"]))

    def quarantined() -> list[Any]:
        assert query.exception() is None, query.exception()
        enumerator = last_offset(tmp_path / "chk", tmp_path / "state")["enumerator"]
        return list(enumerator["files"]["quarantine"])

    entries = wait_until("the quarantine list in the offsets", quarantined, 90, step=0.2)
    wait_until("the later file", lambda: len(sink_rows(spark, out)) >= len(expected), 90, step=0.5)
    assert query.isActive
    query.stop()
    assert_exactly_once(sink_rows(spark, out), expected)
    ((path, position, stop, reason),) = entries
    assert path == str(src / "bad.json")
    assert position == bad_at
    assert stop == (src / "bad.json").stat().st_size
    assert "bad.json" in reason


@pytest.mark.slow
def test_a_schema_mismatch_between_files_names_the_file_and_column(
    tmp_path: Path, spark: Any
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    spark.createDataFrame([("a", 1)], "file string, n bigint").write.parquet(str(src / "p1"))
    spark.createDataFrame([("b", "x")], "file string, n string").write.parquet(str(src / "p2"))
    query = stream(spark, src, tmp_path, schema="file string, n bigint", pattern="p*/*.parquet")
    message = wait_failed(query)
    assert "p2/" in message
    assert "column 'n'" in message


@pytest.mark.slow
def test_a_file_that_vanishes_before_it_is_read_fails_the_query(tmp_path: Path, spark: Any) -> None:
    src = tmp_path / "src"
    src.mkdir()
    write_json(src, "a.json", rows_of("a.json"))
    os.utime(src / "a.json", (1_000_000, 1_000_000))
    write_json(src, "b.json", rows_of("b.json"))
    # One batch: a.json is admitted and read; b.json is discovered (in the offset) but waits.
    first = stream(spark, src, tmp_path, maxFilesPerBatch=1, trigger="once")
    first.awaitTermination(120)
    assert first.exception() is None, first.exception()
    assert sink_rows(spark, tmp_path / "out") == expected_rows(["a.json"])
    (src / "b.json").unlink()
    query = stream(spark, src, tmp_path, maxFilesPerBatch=1)
    message = wait_failed(query)
    assert "b.json" in message
    assert "never read" in message
    assert sink_rows(spark, tmp_path / "out") == expected_rows(["a.json"])


@pytest.mark.slow
def test_max_files_per_batch_on_parquet_with_an_inferred_schema(tmp_path: Path, spark: Any) -> None:
    src = tmp_path / "src"
    for i in range(4):
        frame = spark.createDataFrame(
            [(f"p{i}", n, "x") for n in range(10 + i)], "file string, n bigint, pad string"
        )
        frame.coalesce(1).write.parquet(str(src / f"d{i}"))
    query = stream(spark, src, tmp_path, schema=None, maxFilesPerBatch=1, pattern="**/*.parquet")
    expected = sorted((f"p{i}", n, "x") for i in range(4) for n in range(10 + i))
    out = tmp_path / "out"
    wait_until("every file", lambda: len(sink_rows(spark, out)) >= len(expected), 120, step=0.5)
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    query.stop()
    assert_exactly_once(sink_rows(spark, out), expected)
    assert sorted(p["numInputRows"] for p in progress) == [10, 11, 12, 13], "one file per batch"


def available_now_batches(query: Any) -> list[int]:
    """The rows of every batch an ``availableNow`` query ran, once it stopped by itself."""
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    return [p["numInputRows"] for p in query.recentProgress]


@pytest.mark.parametrize(("files", "per_batch"), [(2, None), (10, 3)])
def test_available_now_runs_the_batches_spark_runs_with_none_empty_and_cleans_every_file(
    tmp_path: Path, spark: Any, files: int, per_batch: int | None
) -> None:
    """Side by side with Spark's own file source on the same files and maxFilesPerTrigger,
    two availableNow runs (the second after one more file landed): the same batches, none of
    them empty (a split's finish is recorded by the batch that reads its end, not by a batch
    of its own), and cleanSource=archive leaves the same files as Spark's. Spark commits a
    batch to its source when it plans the next one, so a run's last batch's files are
    archived by the next run, for both (splitflow keeps them in its offset until then)."""
    names = [f"f{i:02d}.json" for i in range(files)]
    limit = {} if per_batch is None else {"maxFilesPerTrigger": str(per_batch)}

    def land(new: list[str]) -> None:
        for directory in (tmp_path / "spark_src", tmp_path / "src"):
            directory.mkdir(exist_ok=True)
            for name in new:
                write_json(directory, name, rows_of(name))

    def run_spark() -> list[int]:
        reader = spark.readStream.schema(SCHEMA_DDL).options(
            **limit, cleanSource="archive", sourceArchiveDir=str(tmp_path / "spark_arc")
        )
        return available_now_batches(
            reader.json(str(tmp_path / "spark_src"))
            .writeStream.format("parquet")
            .option("path", str(tmp_path / "spark_out"))
            .option("checkpointLocation", str(tmp_path / "spark_chk"))
            .trigger(availableNow=True)
            .start()
        )

    def run_ours() -> list[int]:
        reader = spark.readStream.format("splitflow-files").schema(SCHEMA_DDL)
        return available_now_batches(
            reader.options(
                path=str(tmp_path / "src"),
                format="json",
                cleanSource="archive",
                sourceArchiveDir=str(tmp_path / "archive"),
                stateDir=str(tmp_path / "state"),
                **limit,
            )
            .load()
            .writeStream.format("parquet")
            .option("path", str(tmp_path / "out"))
            .option("checkpointLocation", str(tmp_path / "chk"))
            .trigger(availableNow=True)
            .start()
        )

    for new in (names, ["g.json"]):
        land(new)
        sparks, ours = run_spark(), run_ours()
        assert len(ours) == len(sparks), f"batches: ours {ours}, Spark's {sparks}"
        assert 0 not in ours, f"an empty batch: {ours}"
        left = sorted(p.name for p in (tmp_path / "src").iterdir())
        assert len(left) == ours[-1] // ROWS_PER_FILE, "every batch but the last archived"
        assert len(left) == len(list((tmp_path / "spark_src").iterdir())), "as many as Spark's"
    assert left == ["g.json"], "the first run's last files were archived by the second"
    assert batches_reading_nothing(tmp_path / "chk", tmp_path / "state") == []
    assert_exactly_once(sink_rows(spark, tmp_path / "out"), expected_rows([*names, "g.json"]))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({}, "path"),
        ({"path": "/no/such/dir"}, "path"),
        ({"cleanSource": "shred"}, "cleanSource"),
        ({"cleanSource": "archive"}, "sourceArchiveDir"),
        ({"badFiles": "quarantine"}, "stateDir"),
        ({"maxFilesPerBatch": "0"}, "maxFilesPerBatch"),
        ({"format": "xml"}, "format"),
    ],
)
def test_invalid_options_fail_before_any_batch(
    tmp_path: Path, spark: Any, options: dict[str, str], named: str
) -> None:
    """Without a schema, ``load()`` raises (it infers the schema, options are validated);
    with one, Spark builds the source when the query starts, which fails at once."""
    write_json(tmp_path, "a.json", rows_of("a.json"))
    settings = {"path": str(tmp_path), **options} if options else {}
    inferring = spark.readStream.format("splitflow-files")
    for key, value in settings.items():
        inferring = inferring.option(key, value)
    with pytest.raises(Exception, match=named):  # Spark wraps the ConfigurationError
        inferring.load()
    assert not spark.streams.active

    query = stream(spark, tmp_path, tmp_path / "run", **settings) if settings else None
    if query is None:
        reader = spark.readStream.format("splitflow-files").schema(SCHEMA_DDL)
        query = reader.load().writeStream.format("noop").start()
    wait_until("the query to stop", lambda: not query.isActive, 60, step=0.1)
    assert named in str(query.exception())
    assert not log_ids(tmp_path / "run" / "chk", "commits"), "no batch ran"


def ledger_base(checkpoint: Path, batch: int) -> int:
    """The ledger snapshot that the splitflow offset of ``batch`` names as its base."""
    lines = (checkpoint / "offsets" / str(batch)).read_text().splitlines()
    return int(json.loads(lines[-1])["ledger"]["base"])


def state_base(checkpoint: Path, batch: int) -> int:
    """The snapshot of the state (``<stateDir>/offsets``) the offset of ``batch`` reads from."""
    lines = (checkpoint / "offsets" / str(batch)).read_text().splitlines()
    return int(json.loads(lines[-1])["state"]["base"])


def roll_back(checkpoint: Path, out: Path, to: int) -> None:
    """Forget every batch after ``to`` as a user rolling a stopped query back does: delete
    their offset and commit files (and checksums), and what they wrote to the sink."""
    for log in ("offsets", "commits"):
        for batch in log_ids(checkpoint, log):
            if batch > to:
                (checkpoint / log / str(batch)).unlink()
                (checkpoint / log / f".{batch}.crc").unlink(missing_ok=True)
    for written in out.iterdir():
        if int(written.name) > to:
            shutil.rmtree(written)


@pytest.mark.slow
def test_a_query_rolled_back_to_an_older_offset_replans_and_reads_every_record_once(
    tmp_path: Path, spark: Any
) -> None:
    """Spark keeps the offsets of the last ``minBatchesToRetain`` batches, and any of them
    may become the newest again: the user deletes the newer offset and commit files of a
    stopped query. The restart replays a batch and restores the coordinator from an offset
    whose ledger and state bases are older than the ones later commits moved on to, so the
    state directory must still hold them (``stateRetainBatches``, default 100, as
    ``minBatchesToRetain``)."""
    src, out, checkpoint, state = (tmp_path / n for n in ("src", "out", "chk", "state"))
    src.mkdir()
    names = [f"f{i:03d}.json" for i in range(26)]
    for name in names:
        write_json(src, name, rows_of(name))

    def run() -> None:
        query = (
            spark.readStream.format("splitflow-files")
            .schema(SCHEMA_DDL)
            .option("path", str(src))
            .option("format", "json")
            .option("maxFilesPerBatch", "1")
            .option("stateDir", str(state))
            .load()
            .writeStream.foreachBatch(  # idempotent per batch id: a replanned batch rewrites
                lambda frame, batch: frame.write.mode("overwrite").parquet(f"{out}/{batch:05d}")
            )
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(240), "the run did not end"
        assert query.exception() is None, query.exception()

    run()
    # The source's commit of a batch comes after the next batch is planned: the last one
    # that ran is that of the batch before the newest.
    committed = max(log_ids(checkpoint, "commits")) - 1
    newest = ledger_base(checkpoint, committed), state_base(checkpoint, committed)
    to = max(
        b
        for b in log_ids(checkpoint, "offsets")
        if ledger_base(checkpoint, b) < newest[0] and state_base(checkpoint, b) < newest[1]
    )
    assert committed - to >= 2, "rolled back a few batches, across newer snapshots"
    roll_back(checkpoint, out, to)
    # Batch `to` not committed either: the restart replays it from its offset, whose state
    # is a snapshot that later ones superseded, then plans the batches after it again.
    (checkpoint / "commits" / str(to)).unlink()
    (checkpoint / "commits" / f".{to}.crc").unlink(missing_ok=True)
    run()
    assert max(log_ids(checkpoint, "commits")) > to, "the restart planned new batches"
    rows = sorted(
        (r["file"], r["n"], r["pad"])
        for r in spark.read.schema(SCHEMA_DDL)
        .option("recursiveFileLookup", "true")
        .parquet(str(out))
        .collect()
    )
    assert_exactly_once(rows, expected_rows(names))


if __name__ == "__main__":
    sys.exit(job_main(sys.argv[1:]))
