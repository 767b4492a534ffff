"""The Kafka connector: topic-partitions as splits, read with confluent-kafka.

Needs the ``kafka`` extra (``pip install splitflow[kafka]``: confluent-kafka). On Spark:
``spark.readStream.format("splitflow-kafka")`` (see :mod:`splitflow.spark.kafka` and
``docs/kafka.md``). Built on splitflow's public API only.
"""

from splitflow.connectors.kafka.broker import Broker, ConfluentBroker
from splitflow.connectors.kafka.options import ClientConfig, KafkaOptions, StartSpec
from splitflow.connectors.kafka.reader import SCHEMA, SCHEMA_WITH_HEADERS
from splitflow.connectors.kafka.source import (
    KafkaEnumerator,
    KafkaSource,
    resolve_starting_offsets,
)
from splitflow.connectors.kafka.splits import KafkaSplit

__all__ = [
    "SCHEMA",
    "SCHEMA_WITH_HEADERS",
    "Broker",
    "ClientConfig",
    "ConfluentBroker",
    "KafkaEnumerator",
    "KafkaOptions",
    "KafkaSource",
    "KafkaSplit",
    "StartSpec",
    "resolve_starting_offsets",
]
