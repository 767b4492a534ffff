"""Spark options, validated before a query starts: defaults, parsing, errors that name the option.

Spark passes option keys lower-cased; errors name the option as documented (camelCase) and
quote the value at fault. The ``SequenceDataSource`` tests build the data source the way
Spark's Python worker does at ``load()``: they need pyspark importable, not a SparkSession.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from splitflow.api.options import parse_duration
from splitflow.errors import ConfigurationError, ConnectorError, SplitflowError
from splitflow.spark import options as options_module
from splitflow.spark.options import RuntimeOptions

WHOLE_NUMBER_OPTIONS = [
    "parallelism",
    "maxRecordsPerBatch",
    "minRecordsPerBatch",
    "maxRecordsPerTask",
    "stateRetainBatches",
]
DURATION_OPTIONS = ["maxBatchDelay", "readerIdleTimeout"]


def spark_options(**options: str) -> dict[str, str]:
    """Options as Spark hands them over: keys lower-cased."""
    return {key.lower(): value for key, value in options.items()}


def parse(**options: str) -> RuntimeOptions:
    return RuntimeOptions.parse(spark_options(**options))


def assert_names(error: pytest.ExceptionInfo[ConfigurationError], option: str, value: str) -> None:
    assert error.value.option == option
    assert repr(value) in str(error.value), f"the message should quote {value!r}: {error.value}"


# -- RuntimeOptions ------------------------------------------------------------------------------


def test_defaults_when_no_option_is_given() -> None:
    parsed = RuntimeOptions.parse({})
    assert parsed == RuntimeOptions()
    assert parsed.parallelism == 2
    assert parsed.max_records_per_batch is None
    assert parsed.min_records_per_batch is None
    assert parsed.max_batch_delay == 15 * 60
    assert parsed.max_records_per_task is None
    assert parsed.reader_idle_timeout == 60


def test_every_option_parses() -> None:
    parsed = parse(
        parallelism="8",
        maxRecordsPerBatch="10000",
        minRecordsPerBatch="500",
        maxBatchDelay="2m",
        maxRecordsPerTask="2500",
        readerIdleTimeout="90s",
    )
    assert parsed == RuntimeOptions(
        parallelism=8,
        max_records_per_batch=10_000,
        min_records_per_batch=500,
        max_batch_delay=120.0,
        max_records_per_task=2_500,
        reader_idle_timeout=90.0,
    )


@pytest.mark.parametrize(
    ("text", "size"),
    [("1048576", 1_048_576), ("64k", 65_536), ("64m", 64 * 2**20), ("1g", 2**30), ("2GB", 2**31)],
)
def test_max_bytes_per_batch_takes_bytes_or_k_m_g_t(text: str, size: int) -> None:
    assert parse(maxBytesPerBatch=text).max_bytes_per_batch == size


@pytest.mark.parametrize("text", ["0", "-1", "1.5m", "lots", "", "10x"])
def test_a_bad_size_is_rejected_naming_the_option_and_quoting_the_value(text: str) -> None:
    with pytest.raises(ConfigurationError) as error:
        parse(maxBytesPerBatch=text)
    assert_names(error, "maxBytesPerBatch", text)


def test_options_are_read_under_the_lower_cased_keys_spark_passes() -> None:
    assert RuntimeOptions.parse({"maxrecordsperbatch": "7"}).max_records_per_batch == 7


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("30s", 30.0),
        ("15m", 900.0),
        ("1h", 3600.0),
        ("2", 2.0),
        ("1.5", 1.5),
        ("0.25s", 0.25),
        ("0", 0.0),
        (" 10 s ", 10.0),
    ],
)
def test_durations_take_ms_s_m_h_or_bare_seconds(text: str, seconds: float) -> None:
    assert parse_duration("maxBatchDelay", text) == pytest.approx(seconds)
    assert parse(maxBatchDelay=text).max_batch_delay == pytest.approx(seconds)
    if seconds > 0:  # a timeout of 0 is refused (see the zero test below)
        assert parse(readerIdleTimeout=text).reader_idle_timeout == pytest.approx(seconds)


@pytest.mark.parametrize("option", DURATION_OPTIONS)
@pytest.mark.parametrize("text", ["soon", "10x", "-5s", "", "1d", "s", "5 mins", "1,5s"])
def test_a_bad_duration_is_rejected_naming_the_option_and_quoting_the_value(
    option: str, text: str
) -> None:
    with pytest.raises(ConfigurationError) as error:
        parse(**{option: text})
    assert_names(error, option, text)


@pytest.mark.parametrize("option", WHOLE_NUMBER_OPTIONS)
@pytest.mark.parametrize("text", ["0", "-1", "many", "1.5", "", "+3", "1e3", "0x10"])
def test_a_bad_whole_number_is_rejected_naming_the_option_and_quoting_the_value(
    option: str, text: str
) -> None:
    with pytest.raises(ConfigurationError) as error:
        parse(**{option: text})
    assert_names(error, option, text)


@pytest.mark.parametrize("option", WHOLE_NUMBER_OPTIONS + DURATION_OPTIONS)
def test_errors_name_options_as_the_option_table_documents_them(option: str) -> None:
    with pytest.raises(ConfigurationError) as error:
        parse(**{option: "?"})
    assert f"``{error.value.option}``" in (options_module.__doc__ or "")


def test_min_records_per_batch_above_max_records_per_batch_is_rejected() -> None:
    with pytest.raises(ConfigurationError) as error:
        parse(minRecordsPerBatch="1000", maxRecordsPerBatch="999")
    assert error.value.option == "minRecordsPerBatch"
    assert "1000" in str(error.value)
    assert "999" in str(error.value)
    assert "maxRecordsPerBatch" in str(error.value)


def test_min_records_per_batch_equal_to_max_records_per_batch_is_allowed() -> None:
    parsed = parse(minRecordsPerBatch="1000", maxRecordsPerBatch="1000")
    assert parsed.min_records_per_batch == parsed.max_records_per_batch == 1_000


def test_state_retain_batches_is_spark_s_default_and_needs_a_state_dir() -> None:
    assert parse(stateDir="/tmp/s").state_retain_batches == 100  # minBatchesToRetain's default
    assert parse(stateDir="/tmp/s", stateRetainBatches="250").state_retain_batches == 250
    with pytest.raises(ConfigurationError, match="needs option stateDir") as error:
        parse(stateRetainBatches="250")
    assert error.value.option == "stateRetainBatches"


def test_a_configuration_error_is_a_value_error_under_the_splitflow_root() -> None:
    with pytest.raises(ConfigurationError) as error:
        parse(parallelism="none")
    assert isinstance(error.value, ValueError)
    assert isinstance(error.value, SplitflowError)


# -- SequenceDataSource: built at load(), before any query starts ---------------------------------


@pytest.fixture
def sequence_data_source() -> Any:
    pytest.importorskip("pyspark")
    from pyspark.sql.datasource import CaseInsensitiveDict

    from splitflow.spark.sequence import SequenceDataSource

    def build(**options: str) -> Any:
        return SequenceDataSource(CaseInsensitiveDict(options))  # as Spark's worker builds it

    return build


@pytest.fixture
def catalog_file(tmp_path: Path) -> str:
    from splitflow.testing.sequence import SequenceCatalog

    path = tmp_path / "catalog.json"
    SequenceCatalog({"a": 3, "b": 1}, path=str(path))
    return str(path)


def test_sequence_data_source_builds_its_source_from_valid_options(
    sequence_data_source: Any, catalog_file: str
) -> None:
    data_source = sequence_data_source(
        catalog=catalog_file,
        bounded="TRUE",
        discoveryInterval="500ms",
        fetchSize="5",
        parallelism="3",
    )
    source = data_source.create_source()
    assert source.bounded is True
    assert source.discovery_interval == pytest.approx(0.5)
    assert source.fetch_size == 5
    assert source.catalog.lengths() == {"a": 3, "b": 1}
    assert data_source.runtime.parallelism == 3


def test_sequence_data_source_requires_a_catalog(sequence_data_source: Any) -> None:
    with pytest.raises(ConfigurationError) as error:
        sequence_data_source()
    assert error.value.option == "catalog"


def test_sequence_data_source_rejects_a_catalog_path_without_a_file(
    sequence_data_source: Any, tmp_path: Path
) -> None:
    missing = str(tmp_path / "nowhere.json")
    with pytest.raises(ConfigurationError) as error:
        sequence_data_source(catalog=missing)
    assert_names(error, "catalog", missing)
    with pytest.raises(ConfigurationError) as error:
        sequence_data_source(catalog=str(tmp_path))  # a directory, not a file
    assert_names(error, "catalog", str(tmp_path))


@pytest.mark.parametrize("text", ["yes", "1", "maybe", ""])
def test_sequence_data_source_rejects_bounded_other_than_true_or_false(
    sequence_data_source: Any, catalog_file: str, text: str
) -> None:
    with pytest.raises(ConfigurationError) as error:
        sequence_data_source(catalog=catalog_file, bounded=text)
    assert_names(error, "bounded", text)


@pytest.mark.parametrize("text", ["0", "-3", "lots"])
def test_sequence_data_source_rejects_a_fetch_size_below_one(
    sequence_data_source: Any, catalog_file: str, text: str
) -> None:
    with pytest.raises(ConfigurationError) as error:
        sequence_data_source(catalog=catalog_file, fetchSize=text)
    assert error.value.option == "fetchSize"
    assert repr(text) in str(error.value)


def test_sequence_data_source_rejects_a_bad_discovery_interval(
    sequence_data_source: Any, catalog_file: str
) -> None:
    with pytest.raises(ConfigurationError) as error:
        sequence_data_source(catalog=catalog_file, discoveryInterval="often")
    assert error.value.option == "discoveryInterval"
    assert "'often'" in str(error.value)


def test_sequence_data_source_rejects_bad_runtime_options_at_load(
    sequence_data_source: Any, catalog_file: str
) -> None:
    with pytest.raises(ConfigurationError) as error:
        sequence_data_source(catalog=catalog_file, maxRecordsPerTask="0")
    assert_names(error, "maxRecordsPerTask", "0")


def test_backlog_lag_threshold_at_or_below_min_records_per_batch_is_rejected() -> None:
    with pytest.raises(ConfigurationError) as error:
        parse(backlogLagThreshold="500", minRecordsPerBatch="500")
    assert error.value.option == "backlogLagThreshold"
    assert parse(backlogLagThreshold="501", minRecordsPerBatch="500").backlog_lag_threshold == 501


# -- unknown option names --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("parallelizm", "parallelism"),  # the runtime's
        ("maxRecordPerBatch", "maxRecordsPerBatch"),
        ("stateDirectory", "stateDir"),
        ("discoveryIntrval", "discoveryInterval"),  # the sequence source's own
    ],
)
def test_an_unknown_option_is_refused_at_load_naming_the_nearest_known_one(
    sequence_data_source: Any, catalog_file: str, typo: str, meant: str
) -> None:
    """A misspelt option would otherwise change nothing, silently."""
    with pytest.raises(ConfigurationError) as error:
        sequence_data_source(catalog=catalog_file, **{typo: "1"})
    assert error.value.option == typo.lower()  # as Spark passed it
    assert str(error.value) == (
        f"unknown option {typo.lower()!r} for splitflow-sequence (did you mean {meant!r}?)"
    )


def test_each_connector_refuses_options_it_does_not_know(tmp_path: Path) -> None:
    """Spark's own options that a connector does not implement are refused too, so a user
    moving from Spark's Kafka or file source learns which ones: Kafka's ``kafka.*``
    settings go to the client, which checks them."""
    from splitflow.spark.files import FilesDataSource
    from splitflow.spark.generator import GeneratorDataSource
    from splitflow.spark.kafka import KafkaDataSource

    (tmp_path / "a.json").write_text('{"n": 1}\n')
    kafka = {"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "t"}
    files = {"path": str(tmp_path)}
    cases = [
        (GeneratorDataSource, {"rowsPerSecnd": "5"}, "did you mean 'rowsPerSecond'?"),
        (FilesDataSource, {**files, "maxFilesPerTriger": "1"}, "'maxFilesPerTrigger'"),
        (FilesDataSource, {**files, "recursiveFileLookup": "true"}, "for splitflow-files"),
        (KafkaDataSource, {**kafka, "startingOffset": "earliest"}, "'startingOffsets'"),
        (KafkaDataSource, {**kafka, "minPartitions": "8"}, "unknown option 'minpartitions'"),
    ]
    for data_source, options, text in cases:
        with pytest.raises(ConfigurationError, match=text):
            data_source(spark_options(**options))
    assert KafkaDataSource(spark_options(**kafka, **{"kafka.client.id": "x"})) is not None


@pytest.mark.parametrize(
    "server",
    [
        {"host": "127.0.0.1", "port": "9", "user": "u", "tables": "t"},  # PostgreSQL
        {
            "hostname": "127.0.0.1",
            "port": "9",
            "username": "u",
            "databaseName": "d",
            "tableName": "t",
        },
    ],
)
def test_the_cdc_sources_name_check_lets_the_state_directory_s_client_options_through(
    server: dict[str, str],
) -> None:
    """``stateDir.<key>`` options (an object store's endpoint or credentials) pass the CDC
    sources' own check of option names, as every source's: the source goes on to connect
    (refused here, the port is closed). A misspelt prefix is still refused by name."""
    from splitflow.spark.mysql import MySqlCdcDataSource
    from splitflow.spark.postgres import PostgresCdcDataSource

    cls = MySqlCdcDataSource if "hostname" in server else PostgresCdcDataSource
    options = {**server, "connectTimeout": "2s"}
    state = {"stateDir": "s3://bucket/state", "stateDir.endpoint_url": "http://127.0.0.1:9"}
    with pytest.raises(ConnectorError, match="cannot connect"):
        cls(spark_options(**options, **state))
    with pytest.raises(ConfigurationError, match=r"unknown option 'statdir\.endpoint_url'"):
        cls(spark_options(**options, **{"statDir.endpoint_url": "http://127.0.0.1:9"}))


def test_an_interval_or_a_timeout_of_zero_is_refused_naming_the_option(
    tmp_path: Path, sequence_data_source: Any, catalog_file: str
) -> None:
    """A zero discovery interval used to pass load() and fail the query's start with an
    error about call_async; a zero timeout fails every task or request at once."""
    from splitflow.spark.files import FilesDataSource
    from splitflow.spark.kafka import KafkaDataSource

    (tmp_path / "a.json").write_text('{"n": 1}\n')
    kafka = {"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "t"}
    cases = [
        (lambda o: sequence_data_source(catalog=catalog_file, **o), "discoveryInterval"),
        (lambda o: sequence_data_source(catalog=catalog_file, **o), "readerIdleTimeout"),
        (lambda o: FilesDataSource(spark_options(path=str(tmp_path), **o)), "discoveryInterval"),
        (lambda o: KafkaDataSource(spark_options(**kafka, **o)), "discoveryInterval"),
        (lambda o: KafkaDataSource(spark_options(**kafka, **o)), "requestTimeout"),
    ]
    for make, option in cases:
        with pytest.raises(ConfigurationError) as error:
            make({option: "0s"})
        assert error.value.option == option
        assert str(error.value).startswith(f"option {option}: '0s' is not a duration above 0")


def test_the_files_source_takes_a_byte_budget_under_either_name(tmp_path: Path) -> None:
    """Documented for files (positions are bytes), and refused at load until a review for
    issue 13 found it: ``maxBytesPerTrigger`` is Spark's name for ``maxBytesPerBatch``."""
    from splitflow.spark.files import FilesDataSource

    (tmp_path / "a.json").write_text('{"n": 1}\n')
    for name in ("maxBytesPerBatch", "maxBytesPerTrigger"):
        ds = FilesDataSource(spark_options(path=str(tmp_path), **{name: "1k"}))
        assert ds.runtime.max_bytes_per_batch == 1024


def test_a_files_source_is_checked_for_its_directory_at_load_only(tmp_path: Path) -> None:
    """At load() a missing directory is a bad option; once loaded, a directory that goes is
    data loss, for the enumerator to report under failOnDataLoss: a task's source (made
    in an executor from the loaded options) must still build."""
    import shutil

    from splitflow.spark.files import FilesDataSource

    folder = tmp_path / "in"
    with pytest.raises(ConfigurationError, match="option path: no directory at"):
        FilesDataSource(spark_options(path=str(folder), format="json"))
    folder.mkdir()
    loaded = FilesDataSource(spark_options(path=str(folder), format="json"))
    shutil.rmtree(folder)
    assert loaded.create_source().path == str(folder)


@pytest.mark.parametrize(
    "option",
    [
        "maxRecordsPerBatch",
        "maxBytesPerBatch",
        "backlogMaxRecordsPerBatch",
        "backlogMaxBytesPerBatch",
        "minRecordsPerBatch",
    ],
)
def test_a_source_default_for_max_bytes_per_batch_yields_to_any_batch_option(option: str) -> None:
    given = parse(**{option: "5"})
    assert given.sizes_batches
    assert given.with_default_max_bytes(64) == given
    assert not parse(parallelism="3", maxRecordsPerTask="9").sizes_batches
    defaulted = parse(parallelism="3").with_default_max_bytes(64)
    assert defaulted == parse(parallelism="3", maxBytesPerBatch="64")
    assert parse().with_default_max_bytes(None) == RuntimeOptions()


def test_the_sources_without_a_byte_default_keep_unbounded_batches(tmp_path: Path) -> None:
    from splitflow.spark.files import FilesDataSource

    assert FilesDataSource.DEFAULT_MAX_BYTES_PER_BATCH is None
    loaded = FilesDataSource(spark_options(path=str(tmp_path), format="json"))
    assert loaded.runtime == RuntimeOptions()
