"""The core's contract suites against the Kafka source and a real broker (Tansu)."""

from __future__ import annotations

import unittest
import uuid
from typing import Any

import pyarrow as pa
import pytest
from tests.support.tansu import Tansu

from splitflow.connectors.kafka import KafkaOptions, KafkaSource
from splitflow.testing.contracts import SourceContract, SourceReaderContract

pytestmark = pytest.mark.slow

Row = tuple[str, int, int, bytes]


class _KafkaData:
    """Two fresh topics per test (3 and 2 partitions) under a pattern only this test uses."""

    bounded = False
    broker: Tansu
    prefix: str
    written: list[Row]

    @pytest.fixture(autouse=True)
    def _data(self, tansu: Tansu) -> None:
        self.broker, self.prefix, self.written = tansu, f"c{uuid.uuid4().hex[:8]}", []
        for name, partitions, count in (("a", 3, 17), ("b", 2, 8)):
            self._topic(f"{self.prefix}-{name}", partitions, count)

    def _topic(self, topic: str, partitions: int, count: int) -> list[Row]:
        self.broker.create_topic(topic, partitions)
        records = [
            (b"k%d" % i, b"%s/%d" % (topic.encode(), i), i % partitions) for i in range(count)
        ]
        self.broker.produce(topic, records)
        offsets = dict.fromkeys(range(partitions), 0)
        rows = []
        for _, value, partition in records:
            rows.append((topic, partition, offsets[partition], value))
            offsets[partition] += 1
        self.written.extend(rows)
        return rows

    def change_upstream_between_reads(self) -> None:
        """Producers keep writing: records land past the planned stops, in every partition."""
        for name, partitions in (("a", 3), ("b", 2)):
            topic = f"{self.prefix}-{name}"
            self.broker.produce(
                topic, [(b"late", b"%s/late%d" % (topic.encode(), p), p) for p in range(partitions)]
            )

    def make_source(self) -> KafkaSource:
        options = {
            "kafka.bootstrap.servers": self.broker.bootstrap,
            "subscribePattern": f"{self.prefix}-.*",
            "startingOffsets": "earliest",
            "discoveryInterval": "500ms",
        }
        if self.bounded:
            options["endingOffsets"] = "latest"
        return KafkaSource(KafkaOptions.parse(options, batch=self.bounded), fetch_size=5)

    def expected_records(self) -> list[Any]:
        return list(self.written)

    def rows(self, record: Any) -> list[Any]:
        assert isinstance(record, pa.RecordBatch)
        data = record.to_pydict()
        return list(
            zip(data["topic"], data["partition"], data["offset"], data["value"], strict=True)
        )

    def record_split_id(self, record: Any) -> str:
        return f"{record[0]}-{record[1]}"


class TestKafkaSourceContracts(_KafkaData, SourceContract, SourceReaderContract):
    def add_split_upstream(self) -> list[Any]:
        return self._topic(f"{self.prefix}-new", 1, 5)


class TestBoundedKafkaSourceContracts(_KafkaData, SourceContract, SourceReaderContract):
    bounded = True

    def add_split_upstream(self) -> list[Any]:
        raise unittest.SkipTest("a bounded read discovers its partitions once")
