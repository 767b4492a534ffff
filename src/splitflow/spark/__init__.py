"""The Spark runtime: any splitflow Source through PySpark's Python Data Source API.

The only package that imports pyspark. ``register(spark)`` registers the built-in sources.
"""

from __future__ import annotations

from typing import Any

from splitflow.spark.datasource import SplitflowDataSource
from splitflow.spark.files import FilesDataSource
from splitflow.spark.generator import GeneratorDataSource
from splitflow.spark.kafka import KafkaDataSource
from splitflow.spark.mysql import MySqlCdcDataSource
from splitflow.spark.options import RuntimeOptions
from splitflow.spark.postgres import PostgresCdcDataSource
from splitflow.spark.sequence import SequenceDataSource

BUILT_IN: tuple[type[SplitflowDataSource], ...] = (
    SequenceDataSource,
    GeneratorDataSource,
    KafkaDataSource,
    FilesDataSource,
    PostgresCdcDataSource,
    MySqlCdcDataSource,
)


def register(spark: Any, *data_sources: type[SplitflowDataSource]) -> None:
    """Register ``data_sources`` (default: the built-in ones) with a Spark session."""
    for data_source in data_sources or BUILT_IN:
        spark.dataSource.register(data_source)


__all__ = [
    "BUILT_IN",
    "FilesDataSource",
    "GeneratorDataSource",
    "KafkaDataSource",
    "MySqlCdcDataSource",
    "PostgresCdcDataSource",
    "RuntimeOptions",
    "SequenceDataSource",
    "SplitflowDataSource",
    "register",
]
