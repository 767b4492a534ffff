"""The Kafka source on Spark: ``spark.readStream.format("splitflow-kafka")``.

The options of Spark's own Kafka source (``subscribe`` / ``subscribePattern`` / ``assign``,
``startingOffsets``, ``startingOffsetsByTimestamp``, ``startingTimestamp``,
``endingOffsets`` for batch reads, ``failOnDataLoss``, ``includeHeaders``, ``kafka.*``;
``maxOffsetsPerTrigger`` is read as ``maxRecordsPerBatch``), plus ``discoveryInterval``,
``splitAssignment`` (``balanced`` or ``hash``), ``requestTimeout``, ``fetchSize`` and the
runtime options of :mod:`splitflow.spark.options`. Rows have the schema of Spark's Kafka
source. See ``docs/kafka.md``.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader

from splitflow.api.options import parse_positive_int
from splitflow.connectors.kafka.broker import check_client_config
from splitflow.connectors.kafka.options import KafkaOptions
from splitflow.connectors.kafka.reader import SPARK_HEADERS, SPARK_SCHEMA
from splitflow.connectors.kafka.source import KafkaSource
from splitflow.errors import ConfigurationError
from splitflow.spark.datasource import SplitflowDataSource


class KafkaDataSource(SplitflowDataSource):
    """``splitflow-kafka``: Kafka topics, streaming or batch."""

    OPTIONS = (
        "subscribe",
        "subscribePattern",
        "assign",
        "startingOffsets",
        "startingOffsetsByTimestamp",
        "startingOffsetsByTimestampStrategy",
        "startingTimestamp",
        "endingOffsets",
        "failOnDataLoss",
        "maxOffsetsPerTrigger",
        "discoveryInterval",
        "includeHeaders",
        "fetchSize",
        "requestTimeout",
        "splitAssignment",
    )
    OPTION_PREFIXES = ("kafka.",)

    _batch = False

    def __init__(self, options: dict[str, str]) -> None:
        merged = dict(options)
        lowered = {k.lower() for k in merged}
        trigger_cap = next((k for k in merged if k.lower() == "maxoffsetspertrigger"), None)
        if trigger_cap is not None and "maxrecordsperbatch" not in lowered:
            merged["maxrecordsperbatch"] = merged[trigger_cap]
        super().__init__(merged)
        check_client_config(self.create_source().options.client)

    @classmethod
    def name(cls) -> str:
        return "splitflow-kafka"

    def schema(self) -> str:
        headers = self.options.get("includeheaders", "false").strip().lower() == "true"
        return SPARK_SCHEMA + (SPARK_HEADERS if headers else "")

    def create_source(self) -> KafkaSource:
        fetch = self.options.get("fetchsize")
        return KafkaSource(
            KafkaOptions.parse(self.options, batch=self._batch or "endingoffsets" in self.options),
            fetch_size=10_000 if fetch is None else parse_positive_int("fetchSize", fetch),
        )

    def reader(self, schema: Any) -> DataSourceReader:
        self._batch = True  # travels with the pickled reader: batch defaults everywhere
        return super().reader(schema)

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        if "endingoffsets" in self.options:
            raise ConfigurationError(
                "option endingOffsets is for batch reads (spark.read) only",
                option="endingOffsets",
            )
        return super().streamReader(schema)

    def __repr__(self) -> str:
        return f"KafkaDataSource({self.create_source().options!r})"
