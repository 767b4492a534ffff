"""The Kafka enumerator and option logic without a broker: a fake cluster in memory.

Starting offsets (earliest, latest, JSON, by timestamp with both strategies), discovery of
new partitions and topics (at earliest), deleted partitions under both data-loss policies,
offsets going backwards, ending offsets, options and secrets, and the FLINK-31762 balance
case (20 topics x 3 partitions over 8 readers).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pytest

from splitflow.api.assignment import flink_kafka_owner
from splitflow.connectors.kafka import Broker, KafkaOptions, KafkaSource, resolve_starting_offsets
from splitflow.connectors.kafka.broker import OffsetQuery, PeekedRecord
from splitflow.connectors.kafka.options import StartSpec, TopicPartition
from splitflow.errors import ConfigurationError, ConnectorError, DataLossError, SourceFailedError
from splitflow.testing.harness import SourceHarness


class FakeCluster(Broker):
    """Topics -> per-partition ``(earliest, end, {timestamp: offset})``; counts requests."""

    def __init__(self, topics: Mapping[str, list[tuple[int, int]]] | None = None) -> None:
        self.logs: dict[str, list[tuple[int, int]]] = {
            t: list(ps) for t, ps in (topics or {}).items()
        }
        self.times: dict[TopicPartition, list[tuple[int, int]]] = {}  # (timestamp, offset)
        self.requests = 0

    def topics(self) -> dict[str, int]:
        self.requests += 1
        return {t: len(ps) for t, ps in self.logs.items()}

    def offsets(
        self, queries: Mapping[TopicPartition, OffsetQuery]
    ) -> dict[TopicPartition, int | None]:
        self.requests += 1
        result: dict[TopicPartition, int | None] = {}
        for (topic, partition), query in queries.items():
            if topic not in self.logs or partition >= len(self.logs[topic]):
                continue
            earliest, end = self.logs[topic][partition]
            if query == "earliest":
                result[(topic, partition)] = earliest
            elif query == "latest":
                result[(topic, partition)] = end
            else:
                hits = [o for ts, o in self.times.get((topic, partition), []) if ts >= query]
                result[(topic, partition)] = min(hits) if hits else None
        return result

    def peek(self, positions: Mapping[TopicPartition, int]) -> dict[TopicPartition, PeekedRecord]:
        """The first of ``times`` at or after each offset and below the partition's end."""
        self.requests += 1
        result = {}
        for tp, offset in positions.items():
            topic, partition = tp
            if topic not in self.logs or partition >= len(self.logs[topic]):
                continue
            end = self.logs[topic][partition][1]
            there = [(o, ts) for ts, o in self.times.get(tp, []) if offset <= o < end]
            if there:
                result[tp] = PeekedRecord(*min(there))
        return result


def options(**extra: str) -> KafkaOptions:
    return KafkaOptions.parse({"kafka.bootstrap.servers": "fake:9092", **extra})


def source(cluster: FakeCluster, **extra: str) -> KafkaSource:
    return KafkaSource(options(**extra), broker_factory=lambda: cluster)


def positions(harness: SourceHarness[Any, Any, Any]) -> dict[str, int]:
    return {s.split_id: s.position for ss in harness.reader_splits().values() for s in ss}


# -- starting offsets ---------------------------------------------------------------------


CLUSTER = {"t": [(5, 50), (0, 7)]}
PARTS = [("t", 0), ("t", 1)]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (StartSpec("earliest"), {("t", 0): 5, ("t", 1): 0}),
        (StartSpec("latest"), {("t", 0): 50, ("t", 1): 7}),
        (StartSpec("offsets", {("t", 0): 20, ("t", 1): -2}), {("t", 0): 20, ("t", 1): 0}),
        (StartSpec("offsets", {("t", 0): -1, ("t", 1): 3}), {("t", 0): 50, ("t", 1): 3}),
    ],
)
def test_starting_offsets_resolve_by_spec(spec: StartSpec, expected: dict[Any, int]) -> None:
    assert resolve_starting_offsets(PARTS, spec, FakeCluster(CLUSTER)) == expected


def test_a_timestamp_resolves_to_the_first_offset_at_or_after_it() -> None:
    cluster = FakeCluster(CLUSTER)
    cluster.times = {("t", 0): [(100, 10), (200, 30)], ("t", 1): [(150, 2)]}
    spec = StartSpec("timestamps", {("t", 0): 150, ("t", 1): 150}, option="x")
    assert resolve_starting_offsets(PARTS, spec, cluster) == {("t", 0): 30, ("t", 1): 2}
    one = StartSpec("timestamp", timestamp=101, option="startingTimestamp")
    assert resolve_starting_offsets(PARTS, one, cluster) == {("t", 0): 30, ("t", 1): 2}


def test_a_timestamp_no_record_reaches_fails_or_starts_at_the_end_by_strategy() -> None:
    cluster = FakeCluster(CLUSTER)
    cluster.times = {("t", 0): [(100, 10)], ("t", 1): [(500, 6)]}
    spec = StartSpec(
        "timestamps", {("t", 0): 300, ("t", 1): 300}, option="startingOffsetsByTimestamp"
    )
    with pytest.raises(ConnectorError, match=r"startingOffsetsByTimestamp.*t-0.*Strategy=latest"):
        resolve_starting_offsets(PARTS, spec, cluster)
    lenient = StartSpec("timestamps", spec.per_partition, no_match="latest", option=spec.option)
    assert resolve_starting_offsets(PARTS, lenient, cluster) == {("t", 0): 50, ("t", 1): 6}


def test_per_partition_json_must_name_every_partition_read() -> None:
    spec = StartSpec("offsets", {("t", 0): 1})
    with pytest.raises(ConfigurationError, match="t-1") as error:
        resolve_starting_offsets(PARTS, spec, FakeCluster(CLUSTER))
    assert error.value.option == "startingOffsets"


def test_starting_timestamp_wins_over_by_timestamp_which_wins_over_offsets() -> None:
    both = options(
        subscribe="t",
        startingOffsets="earliest",
        startingOffsetsByTimestamp='{"t": {"0": 5, "1": 5}}',
    )
    assert both.start.kind == "timestamps"
    three = options(
        subscribe="t", startingTimestamp="7", startingOffsetsByTimestamp='{"t": {"0": 5}}'
    )
    assert (three.start.kind, three.start.timestamp) == ("timestamp", 7)
    assert options(subscribe="t").start.kind == "latest"
    assert (
        KafkaOptions.parse(
            {"kafka.bootstrap.servers": "b", "subscribe": "t"}, batch=True
        ).start.kind
        == "earliest"
    )


# -- discovery ------------------------------------------------------------------------------


def test_first_start_uses_the_starting_offsets_and_later_partitions_start_at_earliest() -> None:
    cluster = FakeCluster({"orders": [(0, 10), (4, 9)]})
    harness = SourceHarness(
        source(cluster, subscribePattern="or.*", startingOffsets="latest", discoveryInterval="1s"),
        2,
    )
    harness.settle()
    assert positions(harness) == {"orders-0": 10, "orders-1": 9}
    cluster.logs["orders"].append((3, 8))  # a partition added
    cluster.logs["orderly"] = [(2, 5)]  # a new topic matching the pattern
    cluster.logs["other"] = [(0, 5)]  # not matching
    harness.advance(1.0)
    assert positions(harness) == {"orders-0": 10, "orders-1": 9, "orders-2": 3, "orderly-0": 2}
    split = next(
        s for ss in harness.reader_splits().values() for s in ss if s.split_id == "orders-2"
    )
    assert split.first_end == 8, "the end offset at first sight is the backlog boundary"
    harness.close()


def test_backlog_boundaries_are_end_offsets_at_first_sight_and_survive_a_restore() -> None:
    cluster = FakeCluster({"t": [(0, 10), (4, 9)]})
    harness = SourceHarness(
        source(cluster, subscribe="t", startingOffsets="earliest", discoveryInterval="1s"), 2
    )
    harness.settle()

    def boundaries() -> dict[str, int]:
        future = harness.coordinator.run(lambda e: dict(e.backlog_boundaries()))
        harness.settle()
        return future.result()

    assert boundaries() == {"t-0": 10, "t-1": 9}
    assert harness.coordinator.context.is_processing_backlog
    cluster.logs["t"][0] = (0, 25)  # records after first sight are live, not backlog
    cluster.logs["t"].append((0, 4))  # a partition added later: its records so far are
    harness.advance(1.0)
    assert boundaries() == {"t-0": 10, "t-1": 9, "t-2": 4}
    harness.complete(harness.checkpoint())
    harness.restore(3)
    assert boundaries() == {"t-0": 10, "t-1": 9, "t-2": 4}
    harness.close()


def test_a_restored_enumerator_starts_new_partitions_at_earliest_not_at_the_option() -> None:
    cluster = FakeCluster({"t": [(0, 10)]})
    harness = SourceHarness(source(cluster, subscribe="t", startingOffsets="latest"), 1)
    harness.settle()
    harness.complete(harness.checkpoint())
    cluster.logs["t"].append((1, 6))
    harness.restore()
    harness.advance(31.0)
    assert positions(harness) == {"t-0": 10, "t-1": 1}
    harness.close()


def test_assign_reads_only_the_listed_partitions() -> None:
    cluster = FakeCluster({"t": [(0, 1), (0, 2), (0, 3)], "u": [(0, 1)]})
    harness = SourceHarness(source(cluster, assign='{"t": [0, 2]}', startingOffsets="earliest"), 2)
    harness.settle()
    assert set(positions(harness)) == {"t-0", "t-2"}
    harness.close()


def test_a_deleted_partition_fails_the_source_when_fail_on_data_loss() -> None:
    cluster = FakeCluster({"t": [(0, 10)], "u": [(0, 5)]})
    harness = SourceHarness(source(cluster, subscribePattern=".*", discoveryInterval="1s"), 2)
    harness.settle()
    del cluster.logs["u"]
    with pytest.raises(SourceFailedError) as error:
        harness.advance(1.0)
    assert isinstance(error.value.__cause__, DataLossError)
    assert "u-0" in str(error.value.__cause__)
    assert "failOnDataLoss=false" in str(error.value.__cause__)


def test_a_deleted_partition_is_removed_and_its_reader_told_without_fail_on_data_loss(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cluster = FakeCluster({"t": [(0, 10)], "u": [(0, 5)]})
    harness = SourceHarness(
        source(cluster, subscribePattern=".*", discoveryInterval="1s", failOnDataLoss="false"), 2
    )
    harness.settle()
    owner = next(r for r, ss in harness.reader_splits().items() if any(s.topic == "u" for s in ss))
    del cluster.logs["u"]
    with caplog.at_level(logging.WARNING, logger="splitflow.kafka"):
        harness.advance(1.0)
    assert set(positions(harness)) == {"t-0"}
    assert "u-0" in caplog.text
    enumerator: Any = harness.coordinator.enumerator
    assert "u-0" not in enumerator.owners()
    assert owner in harness.slots
    harness.close()


def test_an_end_offset_below_the_position_is_data_loss() -> None:
    cluster = FakeCluster({"t": [(0, 10)]})
    kafka = source(cluster, subscribe="t")
    harness = SourceHarness(kafka, 1)
    harness.settle()
    cluster.logs["t"] = [(0, 3)]  # deleted and created again: offsets start over
    splits = harness.reader_splits()[0]
    with pytest.raises(SourceFailedError) as error:
        harness._await(harness.coordinator.latest_positions(splits))
    assert isinstance(error.value.__cause__, DataLossError)
    assert "t-0: its end offset 3 is below offset 10" in str(error.value.__cause__)
    lenient = SourceHarness(source(cluster, subscribe="t", failOnDataLoss="false"), 1)
    lenient.settle()
    extents = lenient._await(lenient.coordinator.latest_positions(lenient.reader_splits()[0]))
    assert extents["t-0"].latest == 3
    lenient.close()


def test_ending_offsets_bound_the_splits_of_a_batch_read() -> None:
    cluster = FakeCluster({"t": [(0, 10), (0, 20)]})
    kafka = KafkaSource(
        KafkaOptions.parse(
            {
                "kafka.bootstrap.servers": "b",
                "subscribe": "t",
                "endingOffsets": '{"t": {"0": 4, "1": -1}}',
            },
            batch=True,
        ),
        broker_factory=lambda: cluster,
    )
    harness = SourceHarness(kafka, 1)
    harness.settle()
    splits = harness.reader_splits()[0]
    assert {s.split_id: s.end for s in splits} == {"t-0": 4, "t-1": 20}
    extents = harness._await(harness.coordinator.latest_positions(splits))
    assert extents["t-0"].final
    assert extents["t-0"].latest == 4
    harness.close()


def test_an_unreachable_broker_fails_discovery_naming_bootstrap_servers() -> None:
    kafka = KafkaSource(
        KafkaOptions.parse(
            {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t", "requestTimeout": "1s"}
        )
    )
    with pytest.raises(SourceFailedError) as error:
        SourceHarness(kafka, 1).settle()
    cause = str(error.value.__cause__)
    assert "kafka.bootstrap.servers=127.0.0.1:1" in cause
    assert "requestTimeout" in cause


# -- balance: FLINK-31762 ---------------------------------------------------------------------


def test_balanced_assignment_spreads_many_small_topics_where_hash_ownership_skews(
    capsys: pytest.CaptureFixture[str],
) -> None:
    cluster = FakeCluster({f"topic-{i:02d}": [(0, 1)] * 3 for i in range(20)})
    loads = {}
    for strategy in ("balanced", "hash"):
        harness = SourceHarness(
            source(cluster, subscribePattern="topic-.*", splitAssignment=strategy), 8
        )
        harness.settle()
        loads[strategy] = [len(harness.reader_splits()[r]) for r in range(8)]
        harness.close()
    with capsys.disabled():
        print(f"\nFLINK-31762, 20 topics x 3 partitions over 8 readers: {loads}")
    assert sum(loads["balanced"]) == sum(loads["hash"]) == 60
    assert max(loads["balanced"]) - min(loads["balanced"]) <= 1
    assert max(loads["hash"]) - min(loads["hash"]) > 1
    expected = [0] * 8
    for i in range(20):
        for p in range(3):
            expected[flink_kafka_owner(f"topic-{i:02d}", p, 8)] += 1
    assert loads["hash"] == expected, "hash ownership is Flink's KafkaSourceEnumerator's"


# -- options and secrets ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "option"),
    [
        ({}, "kafka.bootstrap.servers"),
        ({"kafka.bootstrap.servers": "b"}, "subscribe"),
        ({"kafka.bootstrap.servers": "b", "subscribe": "t", "assign": '{"t": [0]}'}, "assign"),
        ({"kafka.bootstrap.servers": "b", "subscribePattern": "("}, "subscribePattern"),
        ({"kafka.bootstrap.servers": "b", "assign": "[1]"}, "assign"),
        (
            {"kafka.bootstrap.servers": "b", "subscribe": "t", "startingOffsets": "{x"},
            "startingOffsets",
        ),
        (
            {"kafka.bootstrap.servers": "b", "subscribe": "t", "kafka.group.id": "g"},
            "kafka.group.id",
        ),
        (
            {"kafka.bootstrap.servers": "b", "subscribe": "t", "failOnDataLoss": "yes"},
            "failOnDataLoss",
        ),
        (
            {"kafka.bootstrap.servers": "b", "subscribe": "t", "endingOffsets": "latest"},
            "endingOffsets",
        ),
        (
            {"kafka.bootstrap.servers": "b", "subscribe": "t", "splitAssignment": "x"},
            "splitAssignment",
        ),
        (
            {"kafka.bootstrap.servers": "b", "subscribe": "t", "startingTimestamp": "x"},
            "startingTimestamp",
        ),
    ],
)
def test_bad_options_name_the_option(given: dict[str, str], option: str) -> None:
    with pytest.raises(ConfigurationError) as error:
        KafkaOptions.parse(given)
    assert error.value.option == option


def test_credentials_never_appear_in_reprs_offsets_or_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    secret = "s3cret-Pa55"
    parsed = options(
        subscribe="t",
        **{
            "kafka.sasl.password": secret,
            "kafka.ssl.key.password": secret,
            "kafka.sasl.username": "alice",
        },
    )
    kafka = KafkaSource(parsed, broker_factory=lambda: FakeCluster({"t": [(0, 4)]}))
    with caplog.at_level(logging.DEBUG):
        harness = SourceHarness(kafka, 1)
        harness.settle()
        state = harness._await(harness.coordinator.checkpoint(1))
        encoded = kafka.enumerator_state_codec.encode(state)
        splits = [kafka.split_codec.encode(s) for s in harness.reader_splits()[0]]
        harness.close()
    shown = " ".join(
        [repr(parsed), str(parsed.client), repr(kafka), str(encoded), str(splits), caplog.text]
    )
    assert secret not in shown
    assert "alice" in repr(parsed.client)
    assert "sasl.password=<redacted>" in repr(parsed.client)
    assert parsed.client.to_dict()["sasl.password"] == secret  # still given to the client


# -- the Spark data source's options (no session needed) ------------------------------------


def test_the_spark_data_source_validates_at_load_and_hides_secrets() -> None:
    pytest.importorskip("pyspark")
    from splitflow.spark.kafka import KafkaDataSource

    base = {"kafka.bootstrap.servers": "b:9092", "subscribe": "t"}
    data_source = KafkaDataSource(
        {**base, "kafka.sasl.password": "s3cret", "maxoffsetspertrigger": "7"}
    )
    assert "s3cret" not in repr(data_source)
    assert data_source.runtime.max_records_per_batch == 7, "maxOffsetsPerTrigger is the batch cap"
    with pytest.raises(ConfigurationError) as error:
        KafkaDataSource({**base, "kafka.no.such.setting": "1"})
    assert error.value.option == "kafka.*"
    assert "no.such.setting" in str(error.value)
    bounded = KafkaDataSource({**base, "endingoffsets": "latest"})
    with pytest.raises(ConfigurationError) as error:
        bounded.streamReader(None)
    assert error.value.option == "endingOffsets"
