"""The generator's Spark options: parsed into the source, errors that name the option.

Built the way Spark's Python worker builds a data source at ``load()``: pyspark must be
importable, no SparkSession is needed.
"""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from splitflow.errors import ConfigurationError
from splitflow.spark.generator import GeneratorDataSource


def build(**options: str) -> GeneratorDataSource:
    return GeneratorDataSource({key.lower(): value for key, value in options.items()})


def test_options_reach_the_source() -> None:
    source = build(
        splits="3",
        rowsPerSplit="10",
        rowsPerSecond="30",
        startTime="2026-01-01T00:00:00+00:00",
        skew="0.5",
        batchRows="7",
    ).create_source()
    assert (source.num_splits, source.rows, source.rows_per_second) == (3, 10, 30.0)
    assert (source.skew, source.batch_rows) == (0.5, 7)
    assert source.start_time == 1767225600.0


def test_start_time_takes_seconds_since_the_epoch() -> None:
    assert build(rowsPerSplit="1", startTime="12.5").create_source().start_time == 12.5


@pytest.mark.parametrize(
    ("options", "option", "quoted"),
    [
        ({"rowsPerSecond": "fast"}, "rowsPerSecond", "fast"),
        ({"rowsPerSecond": "0"}, "rowsPerSecond", None),
        ({"skew": "-2"}, "skew", "-2"),
        ({"rowsPerSplit": "1", "startTime": "yesterday"}, "startTime", "yesterday"),
        ({"rowsPerSplit": "1", "startTime": "2026-01-01T00:00:00"}, "startTime", None),
        ({"splits": "0", "rowsPerSplit": "1"}, "splits", "0"),
        ({"rowsPerSplit": "unbounded"}, "maxRecordsPerBatch", None),
        ({"rowsPerSplit": "many"}, "rowsPerSplit", "many"),
    ],
)
def test_bad_options_name_the_option(
    options: dict[str, str], option: str, quoted: str | None
) -> None:
    with pytest.raises(ConfigurationError) as error:
        build(**options)
    assert error.value.option == option
    if quoted is not None:
        assert repr(quoted) in str(error.value)


def test_rows_per_split_defaults_to_a_million_without_a_rate_and_unbounded_with_one() -> None:
    assert build().create_source().rows == 1_000_000
    assert build(rowsPerSecond="10").create_source().rows is None


def test_an_endless_unthrottled_stream_is_allowed_with_a_batch_limit() -> None:
    source = build(rowsPerSplit="unbounded", maxRecordsPerBatch="1000").create_source()
    assert source.rows is None
    assert source.rows_per_second is None
