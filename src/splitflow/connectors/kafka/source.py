"""The Kafka source: splits are topic-partitions, positions are offsets.

* :class:`KafkaSplit`: one partition, ``position`` = the next offset to read; ``end`` is the
  stopping offset of a bounded read; ``first_end`` is the partition's end offset when the
  enumerator first saw it (the backlog boundary of FLIP-309: records below it were there
  before the query started reading the partition).
* :class:`KafkaEnumerator`: discovers the partitions of the subscribed topics (periodically,
  through ``call_async``), resolves where new ones start (the starting options on the first
  start, the earliest offset afterwards), assigns them (balanced by default, Flink's hash
  ownership as an option), removes deleted ones, and answers ``latest_positions`` with the
  partitions' end offsets, in one request. Its event-time index (the record ``timestamp``):
  ``positions_after`` looks offsets up by timestamp (ListOffsets), ``event_times`` peeks at
  the record at each position (Kafka keeps no timestamp by offset).
* :class:`KafkaSource`: ties them with the reader of :mod:`splitflow.connectors.kafka.reader`;
  it reassigns splits on recovery (FLIP-537).

Data loss (``failOnDataLoss``, as Spark's Kafka source): a partition that disappears, or
whose end offset falls below the position already read (the topic was deleted and made
again, the log was truncated), fails the source with a
:class:`~splitflow.errors.DataLossError`; with the option off, it is logged and the source
goes on (a deleted partition is removed and its reader told).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from splitflow.api.assigner import AssignerState, AssignerStateCodec, AssigningSplitEnumerator
from splitflow.api.assignment import AssignmentStrategy, BalancedAssignment, HashAssignment
from splitflow.api.enumerator import SplitEnumerator, SplitEnumeratorContext, SplitExtent
from splitflow.api.reader import SourceReader, SourceReaderContext
from splitflow.api.source import Boundedness, Source, SupportsSplitReassignmentOnRecovery
from splitflow.api.split import Codec, DataclassCodec
from splitflow.connectors.kafka.broker import Broker, ConfluentBroker, OffsetQuery
from splitflow.connectors.kafka.options import (
    EARLIEST,
    LATEST,
    KafkaOptions,
    StartSpec,
    TopicPartition,
)
from splitflow.connectors.kafka.splits import KafkaSplit as KafkaSplit  # also its old place
from splitflow.errors import ConfigurationError, ConnectorError, DataLossError

log = logging.getLogger("splitflow.kafka")


def describe(partitions: Sequence[TopicPartition], limit: int = 10) -> str:
    names = [f"{t}-{p}" for t, p in sorted(partitions)]
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def resolve_starting_offsets(
    partitions: Sequence[TopicPartition], spec: StartSpec, broker: Broker
) -> dict[TopicPartition, int]:
    """Where each partition starts on the first start of a query, by ``spec``.

    At most two requests: the spec's queries, then ``latest`` for timestamps that no record
    reaches when the strategy is ``latest``. A partition that vanished meanwhile is left out.

    Raises :class:`~splitflow.errors.ConfigurationError` when per-partition JSON leaves out
    a partition that is read, and :class:`~splitflow.errors.ConnectorError` for a timestamp
    that no record reaches under the ``error`` strategy.
    """
    queries: dict[TopicPartition, OffsetQuery] = {}
    fixed: dict[TopicPartition, int] = {}
    if spec.kind in ("earliest", "latest"):
        queries = dict.fromkeys(partitions, spec.kind)
    elif spec.kind == "timestamp":
        assert spec.timestamp is not None
        queries = dict.fromkeys(partitions, spec.timestamp)
    else:
        missing = [tp for tp in partitions if tp not in spec.per_partition]
        if missing:
            raise ConfigurationError(
                f"option {spec.option} has no entry for partition(s) {describe(missing)}: list "
                "every partition read"
                + (" (-2: earliest, -1: latest)" if spec.kind == "offsets" else ""),
                option=spec.option,
            )
        for tp in partitions:
            value = spec.per_partition[tp]
            if spec.kind == "timestamps":
                queries[tp] = value
            elif value == EARLIEST:
                queries[tp] = "earliest"
            elif value == LATEST:
                queries[tp] = "latest"
            else:
                fixed[tp] = value
    answers = broker.offsets(queries)
    unmatched = [tp for tp in queries if tp in answers and answers[tp] is None]
    if unmatched and spec.no_match == "error":
        raise ConnectorError(
            f"option {spec.option}: no record at or after the timestamp in partition(s) "
            f"{describe(unmatched)}; set startingOffsetsByTimestampStrategy=latest to start "
            "them at their end"
        )
    latest = broker.offsets(dict.fromkeys(unmatched, "latest")) if unmatched else {}
    result = dict(fixed)
    for tp in queries:
        offset = answers.get(tp)
        if offset is None:
            offset = latest.get(tp)
        if offset is not None:
            result[tp] = offset
    return result


class KafkaEnumerator(AssigningSplitEnumerator[KafkaSplit]):
    """Discovers, assigns and tracks the partitions of a :class:`KafkaSource`.

    Thread: the coordinator thread, except :meth:`discover_splits` (a worker thread).
    """

    def __init__(
        self,
        source: KafkaSource,
        context: SplitEnumeratorContext[KafkaSplit],
        state: AssignerState[KafkaSplit] | None,
    ) -> None:
        super().__init__(
            context,
            strategy=source.make_strategy(),
            discovery_interval=source.options.discovery_interval,
            state=state,
        )
        self._source = source
        self._options = source.options
        self._broker: Broker | None = None
        self._warned_backwards: set[str] = set()

    @property
    def broker(self) -> Broker:
        if self._broker is None:
            self._broker = self._source.make_broker()
        return self._broker

    def backlog_boundary(
        self, split: KafkaSplit, extent: SplitExtent | None, at_start: bool
    ) -> int | None:
        """A partition's backlog boundary is its end offset when first seen (FLIP-309)."""
        return split.first_end

    def on_discovery_error(self, error: BaseException) -> None:
        if isinstance(error, ConfigurationError | ConnectorError):
            raise error  # already names the option or the cluster
        super().on_discovery_error(error)

    def discover_splits(self) -> Sequence[KafkaSplit]:
        options = self._options
        kind, chosen = options.subscription
        partitions = sorted(
            (topic, p)
            for topic, count in self.broker.topics().items()
            if options.matches(topic)
            for p in range(count)
            if kind != "assign" or p in chosen[topic]
        )
        ends = self.broker.offsets(dict.fromkeys(partitions, "latest"))
        # ``discovered`` turns true in the handler of the first successful discovery, on the
        # coordinator thread; discoveries never overlap their handlers.
        if not self.discovered:
            starts = resolve_starting_offsets(partitions, options.start, self.broker)
        else:  # partitions and topics found later start at their earliest offset
            starts = {
                tp: o
                for tp, o in self.broker.offsets(dict.fromkeys(partitions, "earliest")).items()
                if o is not None
            }
        stops = self._stopping_offsets(partitions, ends)
        return [
            KafkaSplit(t, p, position=starts[(t, p)], end=stops.get((t, p)), first_end=ends[(t, p)])
            for t, p in partitions
            if (t, p) in starts and ends.get((t, p)) is not None
        ]

    def _stopping_offsets(
        self, partitions: Sequence[TopicPartition], ends: Mapping[TopicPartition, int | None]
    ) -> dict[TopicPartition, int]:
        spec = self._options.end
        if spec is None:
            return {}
        if spec.per_partition is None:
            return {tp: o for tp, o in ends.items() if o is not None}
        missing = [tp for tp in partitions if tp not in spec.per_partition]
        if missing:
            raise ConfigurationError(
                f"option endingOffsets has no entry for partition(s) {describe(missing)}: list "
                "every partition read (-1: latest)",
                option="endingOffsets",
            )
        stops = {}
        for tp in partitions:
            value, end = spec.per_partition[tp], ends.get(tp)
            if value != LATEST:
                stops[tp] = value
            elif end is not None:
                stops[tp] = end
        return stops

    def latest_positions(self, splits: Sequence[KafkaSplit]) -> Mapping[str, SplitExtent]:
        ends = self.broker.offsets({s.topic_partition: "latest" for s in splits})
        result = {}
        for split in splits:
            end = ends.get(split.topic_partition)
            if end is None:
                continue  # deleted: nothing can be planned for it; discovery removes it
            if end < split.position:
                self._went_backwards(split, end)
                end = split.position
            if split.end is not None and split.end <= end:
                result[split.split_id] = SplitExtent(max(split.end, split.position), final=True)
            else:
                result[split.split_id] = SplitExtent(end)
        return result

    def event_times(self, splits: Sequence[KafkaSplit]) -> Mapping[str, int]:
        """The timestamp (µs) of the first record at or after each split's position.

        One :meth:`Broker.peek` for all splits. Left out: a split with no record there yet
        (or none before its ``end``), a deleted partition, a record without a timestamp.
        """
        ask = {s.topic_partition: s.position for s in splits if s.end is None or s.position < s.end}
        peeked = self.broker.peek(ask) if ask else {}
        result = {}
        for split in splits:
            record = peeked.get(split.topic_partition)
            if record is None or (split.end is not None and record.offset >= split.end):
                continue
            result[split.split_id] = record.timestamp * 1000
        return result

    def positions_after(self, splits: Sequence[KafkaSplit], event_time: int) -> Mapping[str, int]:
        """The first offset at or after each split's position whose record's timestamp is
        after ``event_time`` (µs), by Kafka's look-up by timestamp; the end offset where no
        record is (exact where timestamps never decrease: ``LogAppendTime``, or producers
        that stamp in order).

        Kafka's look-up finds the first offset with timestamp at or after ``T`` ms, so it
        asks ``T = event_time // 1000 + 1``: a record of 1_000 ms is at 1_000_000 µs, after
        ``event_time`` 999_999 (``T`` = 1_000: found) and not after 1_000_000 (``T`` = 1_001).
        At most two requests: the look-ups, then ``latest`` for those no record reaches.

        Never below the position (an answer before it, from timestamps out of order or a
        broker that indexes another time, as Tansu indexes append time, is the position:
        the runtime then searches by :meth:`event_times`); never past the split's ``end``;
        partitions the broker no longer has are left out.
        """
        ask = {split.topic_partition: split for split in splits}
        if not ask:
            return {}
        threshold = max(0, event_time // 1000 + 1)  # negative queries mean earliest, latest
        found = self.broker.offsets(dict.fromkeys(ask, threshold))
        none = [tp for tp in ask if tp in found and found[tp] is None]
        ends = self.broker.offsets(dict.fromkeys(none, "latest")) if none else {}
        result: dict[str, int] = {}
        for tp, split in ask.items():
            offset = found.get(tp)
            if offset is None:  # every record there is earlier: up to the end
                offset = ends.get(tp)
            if offset is None:
                continue  # deleted
            if split.end is not None:
                offset = min(offset, split.end)
            result[split.split_id] = max(offset, split.position)
        return result

    def _went_backwards(self, split: KafkaSplit, end: int) -> None:
        message = (
            f"partition {split.split_id}: its end offset {end} is below offset "
            f"{split.position}, where reading stands: the topic was deleted and created "
            "again, or its log was truncated"
        )
        if self._options.fail_on_data_loss:
            raise DataLossError(
                f"{message} (set failOnDataLoss=false to go on)", split_id=split.split_id
            )
        if split.split_id not in self._warned_backwards:
            self._warned_backwards.add(split.split_id)
            log.warning("splitflow: %s; reading waits for offset %d", message, split.position)

    def on_splits_vanished(self, split_ids: Sequence[str]) -> None:
        if self._options.fail_on_data_loss:
            raise DataLossError(
                f"partition(s) {', '.join(split_ids)} no longer exist (the topic or partition "
                "was deleted); records not read yet are lost. Set failOnDataLoss=false to drop "
                "deleted partitions and go on",
                split_id=split_ids[0],
            )
        log.warning(
            "splitflow: partition(s) %s were deleted; unread records are lost "
            "(failOnDataLoss=false)",
            ", ".join(split_ids),
        )
        self.remove_splits(split_ids)

    def close(self) -> None:
        if self._broker is not None:
            self._broker.close()
            self._broker = None


class KafkaSource(
    Source[Any, KafkaSplit, AssignerState[KafkaSplit]],
    SupportsSplitReassignmentOnRecovery,
):
    """Reads Kafka topics as Arrow record batches in the schema of Spark's Kafka source.

    ``options``: see :mod:`splitflow.connectors.kafka.options`. ``fetch_size``: at most
    this many records per fetch of a reader. ``broker_factory``: how the enumerator reaches
    the cluster (default: confluent-kafka; tests pass a fake).
    """

    def __init__(
        self,
        options: KafkaOptions,
        *,
        fetch_size: int = 10_000,
        poll_timeout: float = 0.5,
        broker_factory: Callable[[], Broker] | None = None,
    ) -> None:
        if fetch_size < 1:
            raise ConfigurationError(
                f"option fetchSize must be at least 1, got {fetch_size}", option="fetchSize"
            )
        self.options = options
        self.fetch_size = fetch_size
        self.poll_timeout = poll_timeout
        self._broker_factory = broker_factory

    def __repr__(self) -> str:
        return f"KafkaSource({self.options!r})"

    def make_broker(self) -> Broker:
        if self._broker_factory is not None:
            return self._broker_factory()
        return ConfluentBroker(self.options.client, request_timeout=self.options.request_timeout)

    def make_strategy(self) -> AssignmentStrategy[KafkaSplit]:
        if self.options.assignment == "hash":
            return HashAssignment(key=lambda s: (s.topic, s.partition))
        return BalancedAssignment()

    @property
    def event_time_column(self) -> str:
        """Kafka's record ``timestamp`` (CreateTime or LogAppendTime, as the topic keeps)."""
        return "timestamp"

    @property
    def boundedness(self) -> Boundedness:
        if self.options.end is not None:
            return Boundedness.BOUNDED
        return Boundedness.CONTINUOUS_UNBOUNDED

    def create_enumerator(
        self, context: SplitEnumeratorContext[KafkaSplit]
    ) -> SplitEnumerator[KafkaSplit, AssignerState[KafkaSplit]]:
        return KafkaEnumerator(self, context, None)

    def restore_enumerator(
        self, context: SplitEnumeratorContext[KafkaSplit], state: AssignerState[KafkaSplit]
    ) -> SplitEnumerator[KafkaSplit, AssignerState[KafkaSplit]]:
        return KafkaEnumerator(self, context, state)

    def create_reader(self, context: SourceReaderContext) -> SourceReader[Any, KafkaSplit]:
        from splitflow.connectors.kafka.reader import create_kafka_reader

        return create_kafka_reader(self, context)

    @property
    def split_codec(self) -> Codec[KafkaSplit]:
        return DataclassCodec(KafkaSplit)

    @property
    def enumerator_state_codec(self) -> Codec[AssignerState[KafkaSplit]]:
        return AssignerStateCodec(self.split_codec)
