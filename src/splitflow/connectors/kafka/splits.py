"""The Kafka source's split type: one topic partition (its own module, so that the reader
and the source both import it and not each other)."""

from __future__ import annotations

from dataclasses import dataclass

from splitflow.connectors.kafka.options import TopicPartition


@dataclass(frozen=True)
class KafkaSplit:
    """Partition ``partition`` of ``topic``, read from offset ``position``.

    ``end``: a bounded read stops before this offset. ``first_end``: the end offset when
    the partition was first seen (the backlog boundary).

    >>> KafkaSplit("orders", 3, position=42).split_id
    'orders-3'
    """

    topic: str
    partition: int
    position: int = 0
    end: int | None = None
    first_end: int | None = None

    @property
    def split_id(self) -> str:
        return f"{self.topic}-{self.partition}"

    @property
    def topic_partition(self) -> TopicPartition:
        return (self.topic, self.partition)
