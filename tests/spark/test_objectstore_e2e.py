"""Exactly once with ``stateDir`` on an object store (moto's S3 server, Azurite): a rescale
and a driver SIGKILL, with reader events, the ledger of finished splits and the owner token
all on the store, and the store's objects cleaned up as batches commit."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

import pytest
from tests.spark.sources import read_task_log
from tests.spark.support import (
    FAULTY,
    Job,
    assert_exactly_once,
    kill_before_commit,
    log_ids,
    sink_rows,
    start_stream,
    wait_caught_up,
    wait_until,
)
from tests.spark.test_streaming_e2e import Producer

from splitflow.testing.sequence import SequenceCatalog

pytestmark = pytest.mark.slow


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Any]:
    started: list[Job] = []

    def start(*args: str) -> Job:
        job = Job(list(args), tmp_path / "jobs.log")
        started.append(job)
        return job

    yield start
    for job in started:
        job.close()


def test_a_rescale_with_state_on_the_store_is_exactly_once(
    tmp_path: Path, spark: Any, object_store: Any
) -> None:
    """Parallelism 2, then 3, then 1 on one checkpoint, with sealed splits finishing in each
    run (the ledger) and stateDir on the store: every record once, the ledger on the store
    holds the finished splits, and committed batches' objects are gone."""
    catalog = SequenceCatalog({"a": 30, "b": 20}, path=str(tmp_path / "catalog.json"))
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    state = {"stateDir": object_store.url("q"), **object_store.spark_options()}
    for run, parallelism in enumerate((2, 3, 1)):
        for i in range(3):
            catalog.add(f"sealed-{run}-{i}", 5)
            catalog.seal(f"sealed-{run}-{i}")
        query = start_stream(
            spark,
            catalog,
            out,
            checkpoint,
            parallelism=parallelism,
            maxRecordsPerBatch=15,
            discoveryInterval="200ms",
            **state,
        )
        sealed = [name for name in catalog.lengths() if name.startswith("sealed")]
        wait_caught_up(query, catalog, ignore=sealed)  # finished splits leave the report
        wait_until(
            "every record in the sink",
            lambda: len(sink_rows(spark, out)) == len(catalog.records()),
            60,
        )
        query.stop()
        assert_exactly_once(sink_rows(spark, out), catalog.records())
        catalog.append("a", 4)
    names = object_store.fs.ls(object_store.url("q"), detail=False)
    assert {n.rsplit("/", 1)[-1] for n in names} >= {"owner.json", "ledger"}
    ledger = object_store.fs.ls(object_store.url("q", "ledger"), detail=False)
    assert 1 <= len(ledger) <= 12, ledger


def test_a_driver_sigkill_mid_batch_with_state_on_the_store_is_exactly_once(
    tmp_path: Path, spark: Any, jobs: Any, object_store: Any
) -> None:
    """The driver is SIGKILLed while a planned batch's tasks read (events not yet on the
    store); the next run replays that batch from its offset and reads everything once."""
    catalog = SequenceCatalog({"a": 40, "b": 25, "c": 10}, path=str(tmp_path / "catalog.json"))
    out, checkpoint, done = tmp_path / "out", tmp_path / "checkpoint", tmp_path / "done"
    tasks = tmp_path / "tasks"
    args = [
        f"--catalog={catalog.path}",
        f"--out={out}",
        f"--checkpoint={checkpoint}",
        "--parallelism=2",
        "--max-records-per-batch=500",
        "--trigger=500ms",
        f"--source={FAULTY}",
        "--option=readDelay=1s",
        "--option=discoveryInterval=500ms",
        f"--option=taskLog={tasks}",
        f"--option=stateDir={object_store.url('q')}",
        *(f"--option={k}={v}" for k, v in object_store.spark_options().items()),
        f"--done-file={done}",
    ]
    producer = Producer(catalog)
    producer.start()
    try:
        run1 = jobs(*args)
        wait_until("run 1's first batch", lambda: run1.check_alive() and run1.batches(), 120)
        catalog.add("added-1", 7)

        def reading() -> int | None:
            run1.check_alive()
            in_flight = set(log_ids(checkpoint, "offsets")) - set(log_ids(checkpoint, "commits"))
            started = {t["batch"] for t in read_task_log(tasks) if t["outcome"] == "started"}
            return min(in_flight & started, default=None)

        killed = kill_before_commit(
            run1, "a batch whose tasks are reading", reading, checkpoint, 60, step=0.02
        )
        run2 = jobs(*args)
        wait_until("run 2 to complete a batch", lambda: run2.check_alive() and run2.batches(), 120)
    finally:
        producer.stop()
    done.touch()
    assert run2.finish(120) == 0, run2.lines
    assert killed in run2.batches() or killed in log_ids(checkpoint, "commits")
    assert_exactly_once(sink_rows(spark, out), catalog.records())
    log = read_task_log(tasks)
    slices: dict[tuple[int, int], set[str]] = {}
    for task in log:
        slices.setdefault((task["batch"], task["partition"]), set()).add(str(task["slices"]))
    assert all(len(planned) == 1 for planned in slices.values()), slices
    for secret in object_store.secrets():
        for offset in (checkpoint / "offsets").iterdir():
            assert secret.encode() not in offset.read_bytes()


# -- the files source on the store ----------------------------------------------------------------


def test_the_files_source_reads_a_landing_zone_on_the_store_exactly_once(
    tmp_path: Path, spark: Any, object_store: Any
) -> None:
    """JSON files land in the bucket (or container) while the query runs, with state on the
    store too: discovery by listing, files cut into byte ranges (``maxSplitBytes``), files
    deleted once committed (``cleanSource=delete``); every row once."""
    from tests.spark.test_files_e2e import SCHEMA_DDL, expected_rows, rows_of
    from tests.spark.test_files_e2e import sink_rows as file_rows

    fs = object_store.fs

    def land(name: str) -> None:  # one PUT: a file appears whole
        rows = rows_of(name)
        fs.pipe_file(
            object_store.url("landing", name), "".join(json.dumps(r) + "\n" for r in rows).encode()
        )

    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    names = [f"f{i:03d}.json" for i in range(6)]
    for name in names[:3]:
        land(name)
    reader = (
        spark.readStream.format("splitflow-files")
        .schema(SCHEMA_DDL)
        .option("path", object_store.url("landing"))
        .option("format", "json")
        .option("parallelism", "2")
        .option("maxSplitBytes", "400")
        .option("maxFilesPerBatch", "2")
        .option("discoveryInterval", "200ms")
        .option("cleanSource", "delete")
        .option("stateDir", object_store.url("state"))
    )
    for key, value in {
        **object_store.spark_options("path"),
        **object_store.spark_options("stateDir"),
    }.items():
        reader = reader.option(key, value)
    query = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        wait_until("the first files read", lambda: len(file_rows(spark, out)) > 0, 120)
        for name in names[3:]:
            land(name)
        wait_until(
            "every landed row in the sink",
            lambda: (
                (query.exception() is None and file_rows(spark, out) == expected_rows(names))
                or (query.exception() is not None and _raise(query.exception()))
            ),
            120,
        )

        def cleaned() -> bool:
            left = fs.ls(object_store.url("landing"), detail=False)
            return len(left) <= 2  # the last batch's files wait for its commit

        wait_until("committed files deleted (cleanSource)", cleaned, 60)
    finally:
        query.stop()
    assert file_rows(spark, out) == expected_rows(names)


def _raise(error: Any) -> bool:
    raise AssertionError(f"the query failed: {error}")


# -- bad credentials under Spark ------------------------------------------------------------------


@dataclass(frozen=True)
class Credentials:
    """A fresh bucket or container on a store that checks credentials, the ``url`` of a
    ``stateDir`` in it, and three sets of storage options for it: ``good`` (may write),
    ``wrong`` (refused), ``read_only`` (may list and read, not write); ``secrets``: the
    values of all three that no message may show."""

    url: str
    good: dict[str, str]
    wrong: dict[str, str]
    read_only: dict[str, str]
    secrets: tuple[str, ...]


@pytest.fixture(scope="module")
def s3_auth(tmp_path_factory: Any) -> Iterator[Any]:
    """moto's S3 server checking credentials and IAM policies (``MotoS3.start(auth=True)``)."""
    from tests.support.objectstores import MotoS3, moto_installed

    if not moto_installed():
        pytest.skip("moto's S3 server is not installed: pip install -e '.[objectstore]'")
    server = MotoS3.start(tmp_path_factory.mktemp("moto-auth"), auth=True)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["s3", "azure"])
def credentials(request: Any) -> Credentials:
    """S3: moto with IAM enforced (``s3_auth``), a wrong secret, a user allowed
    ``S3_READ_ONLY``. Azure: Azurite (it always checks the account key and SAS tokens), a
    well-formed key that is not the account's, a container SAS that may read and list.
    The SAS goes in a connection string: from ``account_name`` and ``sas_token`` adlfs
    makes an ``https://`` URL, which Azurite (plain HTTP) never answers, and the Azure SDK
    retries the failed TLS handshake for about 90 s."""
    if request.param == "s3":
        from tests.support.objectstores import S3_READ_ONLY

        s3 = request.getfixturevalue("s3_auth")
        bucket = s3.create_bucket()
        key, secret = s3.create_user(f"ro-{bucket}", S3_READ_ONLY)
        wrong = "wrong-" + s3.secret
        return Credentials(
            s3.url(bucket, "q"),
            s3.storage_options(),
            s3.storage_options(s3.key, wrong),
            s3.storage_options(key, secret),
            (s3.secret, wrong, secret),
        )
    from tests.support.objectstores import AZURE_KEY

    azurite = request.getfixturevalue("azurite")
    container = azurite.create_container()
    wrong = base64.b64encode(b"not the key of devstoreaccount1, but well formed").decode()
    sas = azurite.read_only_sas(container)
    (signature,) = parse_qs(sas)["sig"]
    return Credentials(
        azurite.url(container, "q"),
        azurite.storage_options(),
        azurite.storage_options(wrong),
        {
            "connection_string": (
                f"BlobEndpoint={azurite.blob_endpoint};SharedAccessSignature={sas}"
            )
        },
        (AZURE_KEY, wrong, signature, quote(signature, safe="")),
    )


def test_refused_and_read_only_credentials_fail_naming_state_dir_and_lose_nothing(
    tmp_path: Path, spark: Any, credentials: Credentials
) -> None:
    """On a store that checks credentials (S3 with IAM, Azure): a wrong secret or key fails
    ``load()``; a read-only credential (an S3 user allowed reads, an Azure SAS that may read
    and list), given to a query that has committed batches, fails its first batch (its
    first write to the store) before it commits one; both name option stateDir and show
    no secret, and the query then resumes with the right credential exactly once."""
    catalog = SequenceCatalog({"a": 30, "b": 20}, path=str(tmp_path / "catalog.json"))
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    scheme = credentials.url.split("://", 1)[0]

    def run(options: dict[str, str]) -> Any:
        state: dict[str, Any] = {f"stateDir.{k}": v for k, v in options.items()}
        return start_stream(
            spark, catalog, out, checkpoint, parallelism=2, maxRecordsPerBatch=15,
            stateDir=credentials.url, **state,
        )  # fmt: skip

    def shows_no_secret(error: BaseException) -> None:
        for secret in credentials.secrets:
            assert secret not in str(error)

    with pytest.raises(Exception, match="option stateDir: cannot reach") as caught:
        run(credentials.wrong)
    shows_no_secret(caught.value)

    def rows() -> list[tuple[str, int]]:  # [] until a batch with rows committed
        from pyspark.errors import AnalysisException

        try:
            return sink_rows(spark, out)
        except AnalysisException:
            return []

    query = run(credentials.good)
    wait_until("every record in the sink", lambda: len(rows()) == 50, 120)
    query.stop()
    committed = sink_rows(spark, out)
    catalog.append("a", 10)

    query = run(credentials.read_only)
    with pytest.raises(Exception, match=f"option stateDir: cannot write {scheme}://") as caught:
        query.awaitTermination(120)
    shows_no_secret(caught.value)
    assert sink_rows(spark, out) == committed

    query = run(credentials.good)
    wait_until("every record in the sink", lambda: len(rows()) == len(catalog.records()), 120)
    query.stop()
    assert_exactly_once(sink_rows(spark, out), catalog.records())


@pytest.mark.parametrize("kind", ["s3", "azure"])
def test_a_store_unreachable_mid_run_fails_naming_state_dir_and_resumes_exactly_once(
    tmp_path: Path, spark: Any, kind: str, request: pytest.FixtureRequest
) -> None:
    """The store's endpoint goes away between batches (``Outage``: connections refused):
    the next batch fails naming option stateDir, showing no secret, before it commits; once
    the store is back the query resumes from its last committed batch, every record once.
    S3 is told to try once; the Azure SDK tries four times over about a minute, and adlfs
    passes it no retry setting from ``stateDir.*`` (docs/deployment.md)."""
    from tests.support.objectstores import Outage, StoreUnderTest

    server = request.getfixturevalue("s3_server" if kind == "s3" else "azurite")
    store = StoreUnderTest(kind, server)
    outage = Outage(server.port)
    catalog = SequenceCatalog({"a": 30, "b": 20}, path=str(tmp_path / "catalog.json"))
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    options: dict[str, Any] = store.spark_options()
    if kind == "s3":
        options["stateDir.endpoint_url"] = outage.endpoint
        options["stateDir.config_kwargs"] = '{"retries": {"max_attempts": 1}, "connect_timeout": 2}'
    else:
        options["stateDir.connection_string"] = options["stateDir.connection_string"].replace(
            f":{server.port}/", f":{outage.port}/"
        )

    def rows() -> list[tuple[str, int]]:  # [] until a batch with rows committed
        from pyspark.errors import AnalysisException

        try:
            return sink_rows(spark, out)
        except AnalysisException:
            return []

    def run() -> Any:
        return start_stream(
            spark, catalog, out, checkpoint, parallelism=2, maxRecordsPerBatch=15,
            stateDir=store.url("q"), **options,
        )  # fmt: skip

    try:
        query = run()
        wait_until("the first records in the sink", lambda: len(rows()) == 50, 120)
        outage.cut()
        catalog.append("a", 10)
        with pytest.raises(Exception, match="option stateDir: cannot") as caught:
            query.awaitTermination(180)
        for secret in store.secrets():
            assert secret not in str(caught.value)
        assert len(rows()) == 50  # no batch is planned without the store
        outage.restore()
        query = run()
        wait_until("every record in the sink", lambda: len(rows()) == len(catalog.records()), 120)
        query.stop()
    finally:
        outage.close()
    assert_exactly_once(sink_rows(spark, out), catalog.records())
