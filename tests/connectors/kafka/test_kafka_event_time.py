"""The Kafka source's event-time index: record timestamps by offset, and offsets by time.

``positions_after`` is Kafka's look-up by timestamp (ListOffsets: the first offset whose
timestamp is at or after ``T`` ms); ``event_times`` peeks at the record at each position
with one consumer. Times are microseconds; Kafka's are milliseconds (``ms * 1000``).

The fast tests use the fake cluster of ``test_kafka_enumerator.py``, which answers like
Kafka. The slow ones run against Tansu, which looks timestamps up by the time it appended
each record, not by the record's own timestamp, and answers "no record reaches it" with
offset 0 and timestamp -1. So the broker tests stamp records with the wall clock at sending,
400 ms apart, and ask between them: there both times order the records alike, and the
answers are exact on Tansu and Kafka. Records stamped far from the wall clock show an
answer before the position, which is the position (the planner searches from there).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from tests.connectors.kafka.test_kafka_enumerator import FakeCluster
from tests.support.tansu import Tansu

from splitflow.connectors.kafka import KafkaEnumerator, KafkaOptions, KafkaSource, KafkaSplit
from splitflow.connectors.kafka.broker import ConfluentBroker, PeekedRecord
from splitflow.errors import ConnectorError

MS = 1000
"""Microseconds in a millisecond."""


class FakeContext:
    """The enumerator's context, enough for calling the enumerator directly."""

    current_parallelism = 1
    reports_splits_on_registration = True

    def registered_readers(self) -> dict[int, Any]:
        return {}

    def call_async(self, *args: Any, **kwargs: Any) -> Any:
        return None


def enumerator(source: KafkaSource) -> KafkaEnumerator:
    return KafkaEnumerator(source, FakeContext(), None)  # type: ignore[arg-type]


def fake(cluster: FakeCluster) -> KafkaEnumerator:
    options = KafkaOptions.parse({"kafka.bootstrap.servers": "fake:9092", "subscribe": "t"})
    return enumerator(KafkaSource(options, broker_factory=lambda: cluster))


def at(position: int, partition: int = 0, end: int | None = None) -> KafkaSplit:
    return KafkaSplit("t", partition, position=position, end=end)


def cluster_of_times() -> FakeCluster:
    """``t-0``: offsets 0..9 exist; records at 0..8 (offset 5 is a transaction marker),
    timestamps never decreasing: 0,1 at 1000 ms; 2 at 2000; 3,4 at 3000; 6..8 at 4000..6000.
    ``t-1``: offsets 0..2, at 500 ms each."""
    cluster = FakeCluster({"t": [(0, 10), (0, 3)]})
    cluster.times = {
        ("t", 0): [
            *[(1000, 0), (1000, 1), (2000, 2), (3000, 3), (3000, 4)],
            *[(4000, 6), (5000, 7), (6000, 8)],
        ],
        ("t", 1): [(500, 0), (500, 1), (500, 2)],
    }
    return cluster


# -- the source ---------------------------------------------------------------------------------


def test_the_event_time_column_is_the_record_timestamp() -> None:
    options = KafkaOptions.parse({"kafka.bootstrap.servers": "b", "subscribe": "t"})
    assert KafkaSource(options).event_time_column == "timestamp"


# -- positions_after, on the fake cluster -----------------------------------------------------


@pytest.mark.parametrize(
    ("event_time", "expected"),
    [
        (2000 * MS, 3),  # the record at 2000 ms is not after 2000 ms: stop before 3
        (2000 * MS - 1, 2),  # it is after one microsecond earlier
        (3000 * MS + 999, 6),  # the microseconds below the next millisecond: still 3000 ms
        (4000 * MS, 7),
    ],
)
def test_positions_after_is_the_first_offset_whose_timestamp_is_later(
    event_time: int, expected: int
) -> None:
    assert fake(cluster_of_times()).positions_after([at(0)], event_time) == {"t-0": expected}


def test_positions_after_a_time_before_the_position_is_the_position() -> None:
    en = fake(cluster_of_times())
    assert en.positions_after([at(4)], 500 * MS) == {"t-0": 4}
    assert en.positions_after([at(4)], 2000 * MS) == {"t-0": 4}, "offset 3 is before 4"
    assert en.positions_after([at(0)], -5 * MS) == {"t-0": 0}, "not Kafka's -2 (earliest)"


def test_positions_after_a_time_past_every_record_is_the_end_in_two_requests() -> None:
    cluster = cluster_of_times()
    en = fake(cluster)
    before = cluster.requests
    result = en.positions_after([at(2), at(0, partition=1)], 5000 * MS)
    assert result == {"t-0": 8, "t-1": 3}
    assert cluster.requests - before == 2, "one look-up by time, one for the ends"
    before = cluster.requests
    assert en.positions_after([at(0), at(0, partition=1)], 400 * MS) == {"t-0": 0, "t-1": 0}
    assert cluster.requests - before == 1, "every look-up found a record: no end asked"


def test_positions_after_stays_within_a_bounded_split() -> None:
    en = fake(cluster_of_times())
    assert en.positions_after([at(0, end=5)], 3000 * MS) == {"t-0": 5}
    assert en.positions_after([at(0, end=5)], 9000 * MS) == {"t-0": 5}


def test_positions_after_leaves_out_deleted_partitions() -> None:
    en = fake(cluster_of_times())
    gone = KafkaSplit("gone", 0)
    assert en.positions_after([at(0), gone], 2000 * MS) == {"t-0": 3}
    assert en.positions_after([at(0), gone], 9000 * MS) == {"t-0": 10}


# -- event_times, on the fake cluster ---------------------------------------------------------


def test_event_times_are_the_timestamps_of_the_records_at_the_positions_in_one_request() -> None:
    cluster = cluster_of_times()
    en = fake(cluster)
    before = cluster.requests
    assert en.event_times([at(2), at(1, partition=1)]) == {"t-0": 2000 * MS, "t-1": 500 * MS}
    assert cluster.requests - before == 1
    assert en.event_times([at(5)]) == {"t-0": 4000 * MS}, "the marker at 5: the record at 6"


def test_event_times_leave_out_splits_with_no_record_there() -> None:
    en = fake(cluster_of_times())
    assert en.event_times([at(9), at(3, partition=1), KafkaSplit("gone", 0)]) == {}
    assert en.event_times([at(5, end=6)]) == {}, "the next record is past the split's end"
    assert en.event_times([at(4, end=4)]) == {}, "a finished split"


def test_an_answer_before_the_position_is_the_position() -> None:
    """Timestamps out of order: the look-up finds offset 1 at 3000 ms, before the position
    2. The answer is the position, whose record (1000 ms) the planner then sees is within
    2000 ms: it searches the stop itself."""
    cluster = FakeCluster({"t": [(0, 4)]})
    cluster.times = {("t", 0): [(1000, 0), (3000, 1), (1000, 2), (4000, 3)]}
    en = fake(cluster)
    assert en.positions_after([at(2)], 2000 * MS) == {"t-0": 2}
    assert en.event_times([at(2)]) == {"t-0": 1000 * MS}


# -- on the broker (Tansu) ----------------------------------------------------------------------


@pytest.fixture
def topic(tansu: Tansu) -> str:
    name = f"e{uuid.uuid4().hex[:8]}"
    tansu.create_topic(name, 2)
    return name


@pytest.fixture
def broker_enumerator(tansu: Tansu, topic: str) -> Iterator[KafkaEnumerator]:
    options = {"kafka.bootstrap.servers": tansu.bootstrap, "subscribe": topic}
    en = enumerator(KafkaSource(KafkaOptions.parse(options)))
    yield en
    en.close()


def produce_stamped(tansu: Tansu, topic: str, count: int, gap: float = 0.4) -> list[int]:
    """``count`` records to partition 0, stamped with the wall clock (ms) ``gap`` s apart."""
    stamps = []
    for i in range(count):
        if i:
            time.sleep(gap)
        stamps.append(int(time.time() * 1000))
        tansu.produce(topic, [(None, b"%d" % i, 0)], timestamp=stamps[-1])
    return stamps


@pytest.mark.slow
def test_on_the_broker_positions_after_is_exact_between_records_before_and_past_them(
    tansu: Tansu, topic: str, broker_enumerator: KafkaEnumerator
) -> None:
    stamps = produce_stamped(tansu, topic, 4)
    split, sid = KafkaSplit(topic, 0), f"{topic}-0"
    middle = (stamps[1] + 200) * MS  # Tansu appended record 1 before, record 2 after
    assert broker_enumerator.positions_after([split], middle) == {sid: 2}
    assert broker_enumerator.positions_after([KafkaSplit(topic, 0, position=3)], middle) == {sid: 3}
    assert broker_enumerator.positions_after([split], (stamps[0] - 1000) * MS) == {sid: 0}
    past = broker_enumerator.positions_after([split, KafkaSplit(topic, 1)], (stamps[3] + 900) * MS)
    assert past == {sid: 4, f"{topic}-1": 0}, "every record is earlier: the ends"


@pytest.mark.slow
def test_on_the_broker_event_times_peek_each_record_and_leave_out_the_ends(
    tansu: Tansu, topic: str, broker_enumerator: KafkaEnumerator
) -> None:
    base = 1_700_000_000_000
    for i in range(4):
        tansu.produce(topic, [(None, b"%d" % i, 0)], timestamp=base + 10 * i + 1)
    tansu.produce(topic, [(None, b"x", 1)], timestamp=base + 7)
    splits = [KafkaSplit(topic, 0, position=2), KafkaSplit(topic, 1)]
    began = time.monotonic()
    assert broker_enumerator.event_times(splits) == {
        f"{topic}-0": (base + 21) * MS,
        f"{topic}-1": (base + 7) * MS,
    }
    at_ends = [KafkaSplit(topic, 0, position=4), KafkaSplit(topic, 1, position=1)]
    assert broker_enumerator.event_times(at_ends) == {}
    assert broker_enumerator.event_times([KafkaSplit(topic, 0, position=3)]) == {
        f"{topic}-0": (base + 31) * MS
    }, "the consumer is assigned again at the new offsets"
    assert time.monotonic() - began < 5


@pytest.mark.slow
def test_on_the_broker_a_lookup_by_another_time_is_never_before_the_position(
    tansu: Tansu, topic: str, broker_enumerator: KafkaEnumerator
) -> None:
    """Records stamped in 2023: Kafka finds offset 3 for a time after the second; Tansu,
    looking up the time it appended them (now), answers offset 0, before the position: the
    answer is the position (where the planner searches), never 0."""
    base = 1_700_000_000_000
    for i in range(5):
        tansu.produce(topic, [(None, b"%d" % i, 0)], timestamp=base + 10 * i)
    split = KafkaSplit(topic, 0, position=1)
    assert broker_enumerator.event_times([split]) == {f"{topic}-0": (base + 10) * MS}
    assert broker_enumerator.positions_after([split], (base + 25) * MS)[f"{topic}-0"] in (1, 3)


@pytest.mark.slow
def test_on_the_broker_a_peek_sees_an_open_transaction_only_reading_uncommitted(
    tansu: Tansu, topic: str
) -> None:
    """As the readers: librdkafka reads committed records unless told otherwise."""
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": tansu.bootstrap, "transactional.id": topic, "linger.ms": 0}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"open", partition=0, timestamp=1_700_000_000_005)
    producer.flush(30)
    tp, record = (topic, 0), PeekedRecord(0, 1_700_000_000_005)

    def broker(**isolation: str) -> ConfluentBroker:
        options = {"kafka.bootstrap.servers": tansu.bootstrap, "subscribe": topic, **isolation}
        return ConfluentBroker(KafkaOptions.parse(options).client, request_timeout=10)

    committed = broker(**{"kafka.isolation.level": "read_committed"})
    uncommitted = broker(**{"kafka.isolation.level": "read_uncommitted"})
    assert uncommitted.peek({tp: 0}) == {tp: record}
    assert committed.peek({tp: 0}) == {}, "the open transaction is not read yet"
    assert broker().peek({tp: 0}) == {}, "librdkafka's default: read_committed"
    producer.commit_transaction(30)
    assert committed.peek({tp: 0}) == {tp: record}


def test_a_peek_at_an_unreachable_cluster_fails_naming_the_servers_and_no_secret() -> None:
    options = KafkaOptions.parse(
        {
            "kafka.bootstrap.servers": "127.0.0.1:1",
            "subscribe": "t",
            "kafka.security.protocol": "SASL_PLAINTEXT",
            "kafka.sasl.mechanism": "PLAIN",
            "kafka.sasl.username": "u",
            "kafka.sasl.password": "s3cret",
        }
    )
    broker = ConfluentBroker(options.client, request_timeout=1)
    began = time.monotonic()
    try:
        with pytest.raises(ConnectorError, match=r"kafka\.bootstrap\.servers=127\.0\.0\.1:1") as e:
            broker.peek({("t", 0): 0})
    finally:
        broker.close()
    assert "s3cret" not in str(e.value)
    assert time.monotonic() - began < 5
