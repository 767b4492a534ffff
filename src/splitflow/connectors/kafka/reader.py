"""The reader of the Kafka source: one confluent-kafka consumer, ``assign()`` + offsets.

A :class:`KafkaSplitReader` reads its partitions with ``assign()`` (never ``subscribe()``:
no consumer group, nothing committed to Kafka) and returns, per fetch and partition, one
``pyarrow.RecordBatch`` in the schema of Spark's Kafka source.

When is a slice ``[a, b)`` done? At ``b``, or earlier when the broker has nothing more:

* The consumer runs with ``enable.partition.eof``: the broker says "end of partition at
  offset e" (``e`` is its end offset, the high watermark) when the reader has everything
  below ``e``. So the reader never waits for records that are not there: it never hangs.
* If ``e >= b``, the offsets between the last record read and ``b`` are below the end the
  broker reports: they are transaction markers, or aborted or compacted records. Kafka never
  writes below its end offset, so they will never exist. The slice is complete: the split
  moves to ``b`` and a replay of the batch reads exactly the same records.
* If ``e < b``, the broker now reports less than it did when the batch was planned (a
  truncated log, a broker whose end offsets are wrong). Records at ``[e, b)`` could appear
  later, and a replay would read them where the first attempt did not: that breaks
  exactly-once, so it is data loss: a :class:`~splitflow.errors.DataLossError` naming the
  partition and offsets, or with ``failOnDataLoss=false`` a warning and the slice ends where
  the reader got (the next batch starts at ``b``, as planned).

Tansu's wrong end offsets (the last batch's base offset + 1) are below the truth, never
above: a slice planned from them ends before records that exist, which the next batch
reads. Offsets out of range (aged out) are data loss too: the consumer runs with
``auto.offset.reset=error``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from splitflow.api.reader import ReaderOutput, SourceReader, SourceReaderContext
from splitflow.api.split import SplitState
from splitflow.connectors.kafka.broker import (
    AUTH_FAILED,
    GONE,
    OUT_OF_RANGE,
    consumer_settings,
    describe_kafka_error,
    refused_error,
)
from splitflow.connectors.kafka.splits import KafkaSplit
from splitflow.errors import ConnectorError, DataLossError
from splitflow.reader import (
    Positioned,
    RecordEmitter,
    RecordsBySplits,
    SourceReaderBase,
    SplitReader,
    SplitSlice,
)

if TYPE_CHECKING:  # the source imports this module when it makes a reader
    from splitflow.connectors.kafka.source import KafkaSource

log = logging.getLogger("splitflow.kafka")

HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestampType", pa.int32()),
    ]
)
SCHEMA_WITH_HEADERS = SCHEMA.append(pa.field("headers", HEADERS_TYPE))
SPARK_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset bigint, "
    "timestamp timestamp, timestampType int"
)
SPARK_HEADERS = ", headers array<struct<key: string, value: binary>>"

# confluent-kafka's timestamp types -> Kafka's TimestampType ids (Spark's timestampType)
_TIMESTAMP_TYPES = {0: -1, 1: 0, 2: 1}


def to_record_batch(
    topic: str, partition: int, messages: Sequence[Any], include_headers: bool
) -> pa.RecordBatch:
    """Messages of one partition as a record batch in Spark's Kafka schema."""
    n = len(messages)
    stamps = [m.timestamp() for m in messages]
    columns = [
        pa.array([m.key() for m in messages], pa.binary()),
        pa.array([m.value() for m in messages], pa.binary()),
        pa.array([topic] * n, pa.string()),
        pa.array([partition] * n, pa.int32()),
        pa.array([m.offset() for m in messages], pa.int64()),
        pa.array([ts * 1000 if kind else None for kind, ts in stamps], pa.timestamp("us", "UTC")),
        pa.array([_TIMESTAMP_TYPES.get(kind, -1) for kind, _ in stamps], pa.int32()),
    ]
    schema = SCHEMA
    if include_headers:
        headers = [m.headers() for m in messages]
        columns.append(
            pa.array(
                [None if not h else [{"key": k, "value": v} for k, v in h] for h in headers],
                HEADERS_TYPE,
            )
        )
        schema = SCHEMA_WITH_HEADERS
    return pa.RecordBatch.from_arrays(columns, schema=schema)


class KafkaEmitter(RecordEmitter[Positioned[pa.RecordBatch | None], pa.RecordBatch, KafkaSplit]):
    """Emits a fetched batch; ``None`` only moves the position (over offsets with no record)."""

    def emit(
        self,
        element: Positioned[pa.RecordBatch | None],
        output: ReaderOutput[pa.RecordBatch],
        state: SplitState[KafkaSplit],
    ) -> None:
        if element.value is not None:
            output.collect(element.value)
        state.position = element.next_position


@dataclass
class _Cursor:
    """One partition being read: the next offset, where to stop, what the broker said."""

    split: KafkaSplit
    position: int
    limit: int | None  # min(slice stop, bounded end): nothing at or beyond it is returned
    eof_at: int | None = None  # the end offset of the broker's last "end of partition"
    heard: bool = False  # a record or an end of partition came since it was assigned
    lost: bool = False  # records it should read are gone (failOnDataLoss=false): skipped
    quiet_since: float = 0.0  # when it was assigned, or last heard of
    ends_split: bool = False  # reaching ``limit`` ends the split (a bounded read's end)

    @property
    def split_id(self) -> str:
        return self.split.split_id


class KafkaSplitReader(SplitReader[Positioned[pa.RecordBatch | None], KafkaSplit]):
    """Reads assigned partitions with one consumer (see the module doc for when a slice ends).

    Thread: the :class:`~splitflow.reader.SplitReader` contract. ``fetch`` blocks at most
    ``poll_timeout`` seconds, less when every partition is at its end or after ``wake_up``.
    """

    def __init__(self, source: KafkaSource) -> None:
        self._options = source.options
        self._fetch_size = source.fetch_size
        self._poll_timeout = source.poll_timeout
        self._request_timeout = source.options.request_timeout
        self._consumer: Any = None
        self._cursors: dict[str, _Cursor] = {}
        self._by_tp: dict[tuple[str, int], _Cursor] = {}
        self._woken = False
        self._checked_at = 0.0

    check_interval = 2.0
    """Seconds a partition may stay silent (no record, no end) before the reader asks the
    cluster whether it still exists (a deleted topic sends the consumer no error at all);
    one that exists is fetched again from the reader's position."""

    # -- split changes --------------------------------------------------------------------

    def _client(self) -> Any:
        if self._consumer is None:
            from confluent_kafka import Consumer

            try:
                self._consumer = Consumer(consumer_settings(self._options.client))
            except Exception as exc:
                raise ConnectorError(
                    f"could not create a Kafka consumer for kafka.bootstrap.servers="
                    f"{self._options.client.bootstrap_servers}: {describe_kafka_error(exc)}"
                ) from exc
        return self._consumer

    def handle_splits_changes(self, added: Sequence[SplitSlice[KafkaSplit]]) -> None:
        from confluent_kafka import TopicPartition

        assign = []
        for piece in added:
            split = piece.split
            limits = [x for x in (piece.stop, split.end) if x is not None]
            cursor = _Cursor(split, piece.start, min(limits) if limits else None)
            cursor.quiet_since = time.monotonic()
            cursor.ends_split = split.end is not None and cursor.limit == split.end
            self._cursors[piece.split_id] = cursor
            self._by_tp[split.topic_partition] = cursor
            if cursor.limit is None or cursor.position < cursor.limit:
                assign.append(TopicPartition(split.topic, split.partition, piece.start))
        if assign:
            self._client().incremental_assign(assign)

    def remove_splits(self, split_ids: Sequence[str]) -> None:
        for split_id in split_ids:
            cursor = self._cursors.get(split_id)
            if cursor is not None:
                self._drop(cursor)

    def _drop(self, cursor: _Cursor) -> None:
        from confluent_kafka import TopicPartition

        del self._cursors[cursor.split_id]
        del self._by_tp[cursor.split.topic_partition]
        if self._consumer is not None:
            topic, partition = cursor.split.topic_partition
            try:
                self._consumer.incremental_unassign([TopicPartition(topic, partition)])
            except Exception as exc:  # not assigned (an empty slice): nothing to undo
                log.debug("splitflow: unassign %s: %s", cursor.split_id, exc)

    # -- fetching ------------------------------------------------------------------------

    def fetch(self) -> RecordsBySplits[Positioned[pa.RecordBatch | None]]:
        batch: RecordsBySplits[Positioned[pa.RecordBatch | None]] = RecordsBySplits()
        self._settle(batch)  # empty slices, and ends decided by the last fetch
        if not self._cursors:
            return batch
        consumer = self._client()
        got: dict[str, list[Any]] = {}
        started = time.monotonic()
        self._woken = False
        while True:
            # A partition just assigned may take a metadata round trip (a new topic: more
            # than a second) before its first record or end: wait for it up to the request
            # timeout, so that an empty fetch means "nothing there", not "not asked yet".
            cursors = self._cursors.values()
            patience = self._request_timeout if any(not c.heard for c in cursors) else 0.0
            left = started + max(self._poll_timeout, patience) - time.monotonic()
            self._take(consumer.consume(self._fetch_size, timeout=max(0.0, min(left, 0.05))), got)
            self._check_silent(consumer)
            if got or any(c.limit is not None and c.eof_at is not None for c in cursors):
                break  # records, or a slice the broker has nothing more for
            if all(c.eof_at is not None for c in cursors) or left <= 0 or self._woken:
                break  # everything that exists now is read, or time is up
        for split_id, messages in got.items():
            cursor = self._cursors[split_id]
            topic, partition = cursor.split.topic_partition
            records = to_record_batch(topic, partition, messages, self._options.include_headers)
            cursor.position = messages[-1].offset() + 1
            batch.add(split_id, Positioned(records, cursor.position))
        self._settle(batch)
        return batch

    def _take(self, messages: list[Any], got: dict[str, list[Any]]) -> None:
        """Sort one ``consume()`` result: records of each slice into ``got``, ends, errors.

        Per message only what must be per message; the partition's cursor is looked up once
        per run of messages from the same partition (how the consumer returns them).
        """
        now = time.monotonic()
        run: tuple[str | None, int] | None = None  # (None, -1): a client-level error
        cursor: _Cursor | None = None
        taken: list[Any] = []
        for message in messages:
            key = (message.topic(), message.partition())
            if key != run:
                run, cursor, taken = key, self._by_tp.get(key), []
                if cursor is not None:
                    cursor.heard, cursor.quiet_since = True, now
                    taken = got.setdefault(cursor.split_id, [])
            error = message.error()
            if error is not None:
                self._handle_error(error, cursor, message)
            elif cursor is not None:  # else a partition dropped meanwhile
                offset = message.offset()
                if cursor.limit is not None and offset >= cursor.limit:
                    cursor.eof_at = offset  # the log goes on past the slice: it is all there
                elif offset >= cursor.position:
                    cursor.eof_at = None
                    taken.append(message)
        for split_id in [s for s, records in got.items() if not records]:
            del got[split_id]

    def _check_silent(self, consumer: Any) -> None:
        """Partitions silent for :attr:`check_interval`: lost if the cluster lost them."""
        now = time.monotonic()
        if now - self._checked_at < self.check_interval:
            return
        silent = [
            c
            for c in self._cursors.values()
            if c.eof_at is None and now - c.quiet_since >= self.check_interval
        ]
        if not silent:
            return
        self._checked_at = now
        try:
            metadata = consumer.list_topics(timeout=self._request_timeout)
        except Exception as exc:  # unreachable: the task's idle timeout reports it
            log.debug("splitflow: metadata request failed: %s", describe_kafka_error(exc))
            return
        from confluent_kafka import TopicPartition

        for cursor in silent:
            topic, partition = cursor.split.topic_partition
            found = metadata.topics.get(topic)
            if found is None or found.error is not None or partition not in found.partitions:
                self._lost(cursor, "its topic or partition no longer exists")
            elif cursor.heard:  # it exists but went quiet: fetch again from the position
                cursor.quiet_since = now
                try:
                    consumer.seek(TopicPartition(topic, partition, cursor.position))
                except Exception as exc:  # not fetching yet: it will start by itself
                    log.debug("splitflow: seek %s: %s", cursor.split_id, exc)

    def _handle_error(self, error: Any, cursor: _Cursor | None, message: Any) -> None:
        name = error.name()
        if name == "_PARTITION_EOF":
            if cursor is not None:
                cursor.eof_at = message.offset()
            return
        where = cursor.split_id if cursor is not None else None
        if cursor is not None and name in GONE:
            self._lost(cursor, f"its topic or partition no longer exists ({name})")
            return
        if cursor is not None and name in OUT_OF_RANGE:
            self._lost(cursor, f"offset {cursor.position} is out of range: aged out ({name})")
            return
        servers = self._options.client.bootstrap_servers
        if name in AUTH_FAILED:
            raise refused_error(servers, error)
        if error.fatal():
            raise ConnectorError(
                f"Kafka client error{f' on partition {where}' if where else ''} "
                f"(kafka.bootstrap.servers={servers}): {name}: {error.str()}"
            )
        log.debug("splitflow: transient Kafka error %s: %s", name, error.str())

    def _lost(self, cursor: _Cursor, why: str) -> None:
        """Records ``cursor`` should read are gone: fail, or (failOnDataLoss=false) skip them.

        Skipping ends a slice at its stop (the next batch starts there anyway); an unbounded
        split stops being read, until the enumerator removes it.
        """
        if cursor.lost:
            return
        upto = "its end" if cursor.limit is None else str(cursor.limit)
        message = (
            f"partition {cursor.split_id}: records from offset {cursor.position} to {upto} "
            f"cannot be read: {why}"
        )
        if self._options.fail_on_data_loss:
            raise DataLossError(
                f"{message} (set failOnDataLoss=false to skip lost records)",
                split_id=cursor.split_id,
            )
        log.warning("splitflow: %s; skipped (failOnDataLoss=false)", message)
        cursor.lost = True
        cursor.eof_at = cursor.position
        if cursor.limit is None and self._consumer is not None:
            from confluent_kafka import TopicPartition

            self._consumer.incremental_unassign([TopicPartition(*cursor.split.topic_partition)])

    def _settle(self, batch: RecordsBySplits[Positioned[pa.RecordBatch | None]]) -> None:
        """Finish slices read to their limit, or that the broker has nothing more for.

        A slice whose partition is at its end (``eof_at``) before the limit: if that end is
        at or past the limit, the offsets left hold no record (transaction markers,
        compaction) and never will, so the split moves to the limit; if it is below, the
        broker reports less than was planned: data loss (see the module doc), and with
        ``failOnDataLoss=false`` the split moves to the limit too, skipping what is lost.
        """
        for cursor in list(self._cursors.values()):
            if cursor.limit is None:
                continue
            if cursor.position < cursor.limit and cursor.eof_at is not None:
                if cursor.eof_at < cursor.limit:
                    self._lost(
                        cursor,
                        f"the broker's end offset is now {cursor.eof_at}, below the planned "
                        f"{cursor.limit}",
                    )
                # offsets up to the limit hold no record, or are lost and skipped
                batch.add(cursor.split_id, Positioned(None, cursor.limit))
                cursor.position = cursor.limit
            if cursor.position >= cursor.limit:
                self._finish(cursor, batch)

    def _finish(
        self, cursor: _Cursor, batch: RecordsBySplits[Positioned[pa.RecordBatch | None]]
    ) -> None:
        if cursor.ends_split and cursor.position >= (cursor.split.end or 0):
            batch.mark_ended(cursor.split_id)
        else:
            batch.mark_finished(cursor.split_id)
        self._drop(cursor)

    def wake_up(self) -> None:
        self._woken = True

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def create_kafka_reader(
    source: KafkaSource, context: SourceReaderContext
) -> SourceReader[pa.RecordBatch, KafkaSplit]:
    """The reader :meth:`KafkaSource.create_reader` returns."""
    return SourceReaderBase(lambda: KafkaSplitReader(source), KafkaEmitter(), context)


__all__ = [
    "SCHEMA",
    "SCHEMA_WITH_HEADERS",
    "SPARK_HEADERS",
    "SPARK_SCHEMA",
    "KafkaEmitter",
    "KafkaSplitReader",
    "create_kafka_reader",
    "to_record_batch",
]
