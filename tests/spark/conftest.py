"""One local-mode SparkSession for the whole test run, shared by the Spark end-to-end tests.

The session starts only when a test asks for it (``spark`` or ``spark_session``): tests in
this folder that need no Spark (planner, options) or start their own (standalone cluster)
do not pay for it.

Master ``local[2,3]``: two cores, and up to three attempts per task (plain ``local[2]``
never retries a task, and ``spark.task.maxFailures`` is ignored in local mode), so a test
can crash one task attempt and watch Spark retry it.

The environment is set before the JVM starts, because Python workers inherit it from there:
``PYSPARK_PYTHON`` is this interpreter (the one with splitflow and pyarrow installed),
``SPARK_LOCAL_IP`` avoids the loopback-hostname lookup, and ``PYTHONPATH`` holds the
repository root so executors can import the test-only sources in ``tests/spark/sources.py``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
from tests.spark.support import spark_env


@pytest.fixture(scope="session")
def spark_session() -> Iterator[Any]:
    """The run's single SparkSession, made as users are told to (``splitflow.spark.session``),
    with the built-in and the test-only sources registered."""
    pytest.importorskip("pyspark")
    if shutil.which("java") is None:
        pytest.skip("Spark needs Java 17 on PATH")
    with pytest.MonkeyPatch.context() as env:
        for key, value in spark_env().items():
            if os.environ.get(key) != value:
                env.setenv(key, value)
        from pyspark.sql import SparkSession
        from tests.spark.sources import TEST_SOURCES

        from splitflow.spark import register, session

        spark = session(
            SparkSession.builder.master("local[2,3]")
            .appName("splitflow-e2e")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.driver.host", "127.0.0.1")
            # an idle query reports progress every second (default 10 s): lastProgress
            # then shows the source's state (reportLatestOffset) soon after it changes
            .config("spark.sql.streaming.noDataProgressEventInterval", "1000")
        )
        spark.sparkContext.setLogLevel("ERROR")
        register(spark, *TEST_SOURCES)
        try:
            yield spark
        finally:
            for query in spark.streams.active:
                query.stop()
            spark.stop()


@pytest.fixture
def spark(spark_session: Any) -> Iterator[Any]:
    """The shared session; any streaming query a test leaves running is stopped after it."""
    yield spark_session
    for query in spark_session.streams.active:
        query.stop()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: Any) -> Iterator[Any]:
    """moto's S3 server on loopback for the whole run (``tests/support/objectstores.py``)."""
    from tests.support.objectstores import server_fixture

    yield from server_fixture("s3", tmp_path_factory)


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: Any) -> Iterator[Any]:
    """Azurite (the Azure Storage emulator) on loopback for the whole run."""
    from tests.support.objectstores import server_fixture

    yield from server_fixture("azure", tmp_path_factory)


@pytest.fixture(params=["s3", "azure"])
def object_store(request: Any) -> Any:
    """A fresh bucket (moto) or container (Azurite): each test runs once per store."""
    from tests.support.objectstores import StoreUnderTest

    server = request.getfixturevalue("s3_server" if request.param == "s3" else "azurite")
    return StoreUnderTest(request.param, server)
