"""``ConfluentBroker`` on a real broker (Tansu): a large query's offsets are asked in
several ListOffsets requests, and its peeks assign a few partitions at a time, and both
answer as for one request."""

from __future__ import annotations

import uuid

import pytest
from tests.support.tansu import Tansu

from splitflow.connectors.kafka import KafkaOptions
from splitflow.connectors.kafka.broker import ConfluentBroker, OffsetQuery, PeekedRecord
from splitflow.connectors.kafka.options import TopicPartition


@pytest.mark.slow
def test_offsets_asked_in_several_requests_answer_every_partition_once(tansu: Tansu) -> None:
    topic = f"b{uuid.uuid4().hex[:8]}"
    tansu.create_topic(topic, 7)
    tansu.produce(topic, [(None, b"x", p) for p in range(7) for _ in range(p)])
    options = KafkaOptions.parse({"kafka.bootstrap.servers": tansu.bootstrap, "subscribe": topic})
    broker = ConfluentBroker(options.client, request_timeout=10)
    broker.request_partitions = 3  # requests of 3, 3 and 2 partitions (one does not exist)
    try:
        asked: dict[TopicPartition, OffsetQuery] = {(topic, p): "latest" for p in range(8)}
        assert broker.offsets(asked) == {(topic, p): p for p in range(7)}
        earliest: dict[TopicPartition, OffsetQuery] = {(topic, p): "earliest" for p in range(7)}
        assert broker.offsets(earliest) == dict.fromkeys(earliest, 0)
    finally:
        broker.close()


@pytest.mark.slow
def test_a_peek_in_several_assignments_answers_every_partition_once(tansu: Tansu) -> None:
    topic = f"b{uuid.uuid4().hex[:8]}"
    tansu.create_topic(topic, 7)
    base = 1_700_000_000_000
    for p in range(1, 7):  # partition p: p records stamped base + 10 * p + offset
        for offset in range(p):
            tansu.produce(topic, [(None, b"x", p)], timestamp=base + 10 * p + offset)
    options = KafkaOptions.parse({"kafka.bootstrap.servers": tansu.bootstrap, "subscribe": topic})
    broker = ConfluentBroker(options.client, request_timeout=10)
    broker.request_partitions = 3  # assignments of 3, 3 and 1 partitions
    try:
        at_start = broker.peek({(topic, p): 0 for p in range(7)})
        assert at_start == {(topic, p): PeekedRecord(0, base + 10 * p) for p in range(1, 7)}
        at_last = broker.peek({(topic, p): max(p - 1, 0) for p in range(7)})
        assert at_last == {(topic, p): PeekedRecord(p - 1, base + 11 * p - 1) for p in range(1, 7)}
    finally:
        broker.close()
