"""How the Kafka reader sorts one ``consume()`` result (``KafkaSplitReader._take``).

The broker tests (``test_kafka_reader.py``) cannot force the order in which a consumer
returns messages, so these feed hand-made messages in the orders that matter: partitions
alternating (A, B, A), a client-level error between runs, a run that only says "end of
partition", a vanished partition in the middle of a run, records past a slice's stop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from splitflow.connectors.kafka import KafkaOptions, KafkaSource
from splitflow.connectors.kafka.reader import KafkaSplitReader
from splitflow.connectors.kafka.splits import KafkaSplit
from splitflow.errors import DataLossError
from splitflow.reader import SplitSlice


@dataclass
class Error:
    code: str

    def name(self) -> str:
        return self.code

    def str(self) -> str:
        return self.code.lower()

    def fatal(self) -> bool:
        return False


@dataclass
class Message:
    where: tuple[str | None, int]
    at: int
    failure: Error | None = None

    def topic(self) -> str | None:
        return self.where[0]

    def partition(self) -> int:
        return self.where[1]

    def offset(self) -> int:
        return self.at

    def error(self) -> Error | None:
        return self.failure


class Consumer:
    """Takes (un)assignments and nothing else: ``_take`` never calls the consumer."""

    def incremental_assign(self, partitions: Any) -> None:
        pass

    def incremental_unassign(self, partitions: Any) -> None:
        pass


A, B, C = ("t", 0), ("t", 1), ("t", 2)


def reader(stops: dict[tuple[str, int], int | None], **extra: str) -> KafkaSplitReader:
    options = KafkaOptions.parse(
        {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t", **extra}
    )
    split_reader = KafkaSplitReader(KafkaSource(options))
    split_reader._consumer = Consumer()
    split_reader.handle_splits_changes(
        [SplitSlice(KafkaSplit(t, p), stop=stop) for (t, p), stop in stops.items()]
    )
    return split_reader


def taken(got: dict[str, list[Any]]) -> dict[str, list[int]]:
    return {split_id: [m.offset() for m in messages] for split_id, messages in got.items()}


def test_alternating_partitions_and_a_client_error_between_runs() -> None:
    split_reader = reader({A: None, B: None})
    got: dict[str, list[Any]] = {}
    split_reader._take(
        [
            Message(A, 0),
            Message(A, 1),
            Message(B, 0),
            Message((None, -1), -1, Error("_TRANSPORT")),  # no partition: logged, skipped
            Message(A, 2),
            Message(B, 1),
        ],
        got,
    )
    assert taken(got) == {"t-0": [0, 1, 2], "t-1": [0, 1]}
    assert all(c.heard for c in split_reader._cursors.values())


def test_a_run_that_only_says_end_of_partition_adds_no_records() -> None:
    split_reader = reader({A: 5, C: 5})
    got: dict[str, list[Any]] = {}
    split_reader._take([Message(C, 3, Error("_PARTITION_EOF")), Message(A, 0)], got)
    assert taken(got) == {"t-0": [0]}  # no empty entry: fetch() stops on any key in got
    assert split_reader._cursors["t-2"].eof_at == 3


def test_records_at_or_past_the_stop_are_not_taken_and_mark_the_slice_complete() -> None:
    split_reader = reader({A: 2})
    got: dict[str, list[Any]] = {}
    split_reader._take([Message(A, 0), Message(A, 1), Message(A, 2), Message(A, 3)], got)
    assert taken(got) == {"t-0": [0, 1]}
    assert split_reader._cursors["t-0"].eof_at == 3


def test_a_partition_gone_in_the_middle_of_a_run_is_skipped_without_fail_on_data_loss() -> None:
    split_reader = reader({A: 9, B: 9}, failOnDataLoss="false")
    got: dict[str, list[Any]] = {}
    split_reader._take(
        [Message(A, 0), Message(A, 1, Error("UNKNOWN_TOPIC_OR_PART")), Message(B, 0)], got
    )
    assert taken(got) == {"t-0": [0], "t-1": [0]}
    assert split_reader._cursors["t-0"].lost
    assert not split_reader._cursors["t-1"].lost


def test_a_partition_gone_in_the_middle_of_a_run_is_data_loss_naming_it() -> None:
    split_reader = reader({A: 9, B: 9})
    with pytest.raises(DataLossError, match="partition t-1: records from offset 0"):
        split_reader._take([Message(A, 0), Message(B, 0, Error("UNKNOWN_TOPIC_OR_PART"))], {})
