"""The Kafka reader against a real broker (Tansu): schema, slices that end early, gaps.

A slice is ``[position, stop)`` of offsets. These tests plan slices the way the Spark
runtime does and check the rule of ``splitflow.connectors.kafka.reader``: a reader stops at
the planned stop, or earlier when the broker has nothing more; offsets below the broker's
end that hold no record (transaction markers) are skipped; a broker whose end is below the
plan is data loss. No test waits on a tuned sleep: each read either ends or fails within
the reader's own bounds, and the time taken is asserted.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import pyarrow as pa
import pytest
from tests.support.tansu import Tansu

from splitflow.api.reader import InputStatus
from splitflow.connectors.kafka import SCHEMA, SCHEMA_WITH_HEADERS, KafkaOptions, KafkaSource
from splitflow.connectors.kafka.splits import KafkaSplit
from splitflow.errors import DataLossError
from splitflow.reader.output import Collector, RecordingReaderContext

pytestmark = pytest.mark.slow


def make_source(tansu: Tansu, topic: str, **extra: str) -> KafkaSource:
    options = {"kafka.bootstrap.servers": tansu.bootstrap, "subscribe": topic, **extra}
    return KafkaSource(KafkaOptions.parse(options), fetch_size=4, poll_timeout=0.5)


def read_slices(
    source: KafkaSource, splits: list[KafkaSplit], stops: dict[str, int], limit: float = 30.0
) -> tuple[list[pa.RecordBatch], list[KafkaSplit], float]:
    """Read slices to their end like a Spark task; return batches, final splits, seconds."""
    reader = source.create_reader(RecordingReaderContext())
    reader.start()
    reader.add_splits(splits, stop_at=stops)
    reader.notify_no_more_splits()
    out: Collector[Any] = Collector()
    began = time.monotonic()
    try:
        while True:
            status = reader.poll_next(out)
            if status is InputStatus.END_OF_INPUT:
                break
            assert time.monotonic() - began < limit, "the reader did not end its slices"
            if status is InputStatus.NOTHING_AVAILABLE:
                reader.wait_available(0.1)
        return list(out), reader.snapshot_state(1), time.monotonic() - began
    finally:
        reader.close()


def offsets(batches: list[pa.RecordBatch]) -> list[int]:
    return [o for b in batches for o in b.column("offset").to_pylist()]


@pytest.fixture
def topic(tansu: Tansu) -> str:
    name = f"r{uuid.uuid4().hex[:8]}"
    tansu.create_topic(name, 1)
    return name


def test_batches_have_the_schema_of_sparks_kafka_source(tansu: Tansu, topic: str) -> None:
    tansu.produce(
        topic,
        [(b"k0", b"v0", 0), (None, b"v1", 0)],
        timestamp=1_700_000_000_123,
        headers=[("h", b"x")],
    )
    plain, _, _ = read_slices(make_source(tansu, topic), [KafkaSplit(topic, 0)], {f"{topic}-0": 2})
    assert all(b.schema.equals(SCHEMA) for b in plain)
    rows = pa.Table.from_batches(plain).to_pylist()
    assert [(r["key"], r["value"], r["topic"], r["partition"], r["offset"]) for r in rows] == [
        (b"k0", b"v0", topic, 0, 0),
        (None, b"v1", topic, 0, 1),
    ]
    assert rows[0]["timestamp"].timestamp() == 1_700_000_000.123
    assert rows[0]["timestampType"] == 0  # CreateTime, as Kafka's TimestampType id
    with_headers, _, _ = read_slices(
        make_source(tansu, topic, includeHeaders="true"), [KafkaSplit(topic, 0)], {f"{topic}-0": 2}
    )
    assert all(b.schema.equals(SCHEMA_WITH_HEADERS) for b in with_headers)
    assert pa.Table.from_batches(with_headers).column("headers").to_pylist()[0] == [
        {"key": "h", "value": b"x"}
    ]


def test_a_slice_stops_exactly_at_its_stop_and_the_next_reads_on(tansu: Tansu, topic: str) -> None:
    tansu.produce(topic, [(None, b"%d" % i, 0) for i in range(10)])
    source = make_source(tansu, topic)
    first, (split,), _ = read_slices(source, [KafkaSplit(topic, 0, 2)], {f"{topic}-0": 7})
    assert offsets(first) == [2, 3, 4, 5, 6]
    assert split.position == 7
    rest, _, _ = read_slices(source, [split], {f"{topic}-0": 10})
    assert offsets(rest) == [7, 8, 9]


def test_one_reader_reads_several_partitions_each_to_its_own_stop(tansu: Tansu) -> None:
    """One consumer, three partitions: each ``consume()`` mixes them (the bench's setup)."""
    name = f"multi-{uuid.uuid4().hex[:8]}"
    tansu.create_topic(name, 3)
    tansu.produce(name, [(None, b"%d-%d" % (p, i), p) for i in range(20) for p in range(3)])
    options = {"kafka.bootstrap.servers": tansu.bootstrap, "subscribe": name}
    source = KafkaSource(KafkaOptions.parse(options), fetch_size=50, poll_timeout=0.5)
    stops = {f"{name}-0": 20, f"{name}-1": 7, f"{name}-2": 13}
    batches, final, _ = read_slices(source, [KafkaSplit(name, p, 1) for p in range(3)], stops)
    read: dict[int, list[tuple[int, bytes]]] = {}
    for batch in batches:
        columns = batch.to_pydict()
        for p, o, v in zip(columns["partition"], columns["offset"], columns["value"], strict=True):
            read.setdefault(p, []).append((o, v))
    assert read == {
        p: [(i, b"%d-%d" % (p, i)) for i in range(1, stops[f"{name}-{p}"])] for p in range(3)
    }
    assert {s.split_id: s.position for s in final} == stops


def test_a_slice_past_the_brokers_end_is_data_loss_and_never_hangs(
    tansu: Tansu, topic: str
) -> None:
    tansu.produce(topic, [(None, b"%d" % i, 0) for i in range(3)])
    with pytest.raises(
        DataLossError, match=rf"{topic}-0.*end offset is now 3, below the planned 8"
    ):
        read_slices(make_source(tansu, topic), [KafkaSplit(topic, 0)], {f"{topic}-0": 8})


def test_without_fail_on_data_loss_a_short_slice_ends_with_what_exists(
    tansu: Tansu, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    tansu.produce(topic, [(None, b"%d" % i, 0) for i in range(3)])
    source = make_source(tansu, topic, failOnDataLoss="false")
    with caplog.at_level(logging.WARNING, logger="splitflow.kafka"):
        batches, (split,), seconds = read_slices(source, [KafkaSplit(topic, 0)], {f"{topic}-0": 8})
    assert offsets(batches) == [0, 1, 2]
    assert split.position == 8, "the lost offsets are skipped: the next slice starts at 8"
    assert f"{topic}-0" in caplog.text
    assert seconds < 5, seconds


def test_transaction_markers_below_the_end_are_skipped_and_the_slice_completes(
    tansu: Tansu, topic: str
) -> None:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": tansu.bootstrap,
            "transactional.id": topic,
            "batch.num.messages": 1,
            "linger.ms": 0,
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic, value=b"%d" % i, partition=0)
    producer.commit_transaction(30)
    end = tansu.end_offsets(topic, 1)[0]
    source = make_source(tansu, topic)
    batches, (split,), seconds = read_slices(source, [KafkaSplit(topic, 0)], {f"{topic}-0": end})
    assert offsets(batches) == [0, 1, 2], "the three records, without the commit marker"
    assert split.position == end
    assert seconds < 5, seconds


def test_tansus_short_end_offsets_lose_nothing_the_next_slice_reads_the_rest(
    tansu: Tansu, topic: str
) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": tansu.bootstrap, "linger.ms": 200})
    for i in range(6):
        producer.produce(topic, value=b"%d" % i, partition=0)
    producer.flush(30)  # one produce batch of six records: Tansu reports the end as 1
    reported = tansu.end_offsets(topic, 1)[0]
    source = make_source(tansu, topic)
    first, (split,), _ = read_slices(source, [KafkaSplit(topic, 0)], {f"{topic}-0": reported})
    assert offsets(first) == list(range(reported))
    assert split.position == reported
    tansu.produce(topic, [(None, b"later", 0)])
    end = tansu.end_offsets(topic, 1)[0]
    rest, _, _ = read_slices(source, [split], {f"{topic}-0": end})
    assert offsets(first) + offsets(rest) == list(range(7))


@pytest.mark.parametrize("fail_on_data_loss", ["true", "false"])
def test_a_topic_deleted_under_a_planned_slice_is_data_loss_not_a_hang(
    tansu: Tansu, topic: str, fail_on_data_loss: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A deleted topic sends the consumer no error: the reader asks the cluster once a
    partition has been silent for ``check_interval`` and finds it gone."""
    tansu.produce(topic, [(None, b"%d" % i, 0) for i in range(3)])
    tansu.delete_topic(topic)
    source = make_source(tansu, topic, failOnDataLoss=fail_on_data_loss)
    began = time.monotonic()
    if fail_on_data_loss == "true":
        with pytest.raises(DataLossError, match=rf"{topic}-0.*0 to 3.*no longer exists"):
            read_slices(source, [KafkaSplit(topic, 0)], {f"{topic}-0": 3})
    else:
        with caplog.at_level(logging.WARNING, logger="splitflow.kafka"):
            batches, (split,), _ = read_slices(source, [KafkaSplit(topic, 0)], {f"{topic}-0": 3})
        assert not offsets(batches)
        assert split.position == 3
        assert "no longer exists" in caplog.text
    assert time.monotonic() - began < 15
