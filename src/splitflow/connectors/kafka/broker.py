"""What the enumerator asks of a Kafka cluster, and its confluent-kafka implementation.

:class:`Broker` is the enumerator's whole view of the cluster: topics with their partition
counts and offsets by spec (earliest, latest, first at or after a timestamp), each one
batched round trip, and a peek at the first record at given offsets (Kafka has no index of
record timestamps by offset). Unit tests give the enumerator a fake; :class:`ConfluentBroker`
asks a real cluster through confluent-kafka's ``AdminClient`` (and, to peek, a
``Consumer``), every request bounded by ``request_timeout``, every failure translated into a
:class:`~splitflow.errors.ConnectorError` that names ``kafka.bootstrap.servers`` (never a
secret setting).

Tansu (the tests' broker) answers a look-up by timestamp from the time it appended each
record, not from the record's own timestamp, and answers "no record reaches it" with offset
0 and timestamp -1 (Kafka: offset -1): :meth:`ConfluentBroker.offsets` reads an answer whose
timestamp is below the query as "none", as the protocol means it.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from contextlib import suppress
from typing import Any, Literal, NamedTuple

from splitflow.connectors.kafka.options import ClientConfig, TopicPartition
from splitflow.errors import ConnectorError

log = logging.getLogger("splitflow.kafka")

OffsetQuery = Literal["earliest", "latest"] | int
"""``earliest``, ``latest``, or a timestamp in ms (the first offset at or after it)."""


class PeekedRecord(NamedTuple):
    """The first record at or after an offset: its offset, and its timestamp in ms."""

    offset: int
    timestamp: int


class Broker(ABC):
    """A Kafka cluster, as the enumerator sees it.

    Called by: the enumerator's worker thread (discovery) and its coordinator thread
    (``latest_positions``, ``event_times``, ``positions_after``); implementations must be
    thread-safe.
    Blocking: every method is one bounded round trip.
    """

    @abstractmethod
    def topics(self) -> Mapping[str, int]:
        """Every topic that exists now (internal ones excluded) -> its number of partitions."""

    @abstractmethod
    def offsets(
        self, queries: Mapping[TopicPartition, OffsetQuery]
    ) -> dict[TopicPartition, int | None]:
        """The offset each query resolves to.

        A partition that does not exist is left out of the result. A timestamp that no
        record reaches resolves to ``None``.
        """

    @abstractmethod
    def peek(self, positions: Mapping[TopicPartition, int]) -> dict[TopicPartition, PeekedRecord]:
        """The first record at or after each partition's offset, read and not committed.

        Sees what a reader with the same settings sees: with ``isolation.level=
        read_committed``, committed records only. Left out: a partition with no record
        there yet (the offset is its end), one that does not exist or whose offset is out
        of range, one that said nothing within the request timeout, and a record without a
        timestamp (``NOT_AVAILABLE``).
        Blocking: one consume loop for all partitions, bounded by the request timeout.
        """

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Release the connection."""


def describe_kafka_error(error: BaseException) -> str:
    """A one-line description of a confluent-kafka error."""
    args = getattr(error, "args", ())
    inner = args[0] if args else error
    name = getattr(inner, "name", None)
    text = inner.str() if hasattr(inner, "str") else str(inner)
    return f"{name()}: {text}" if callable(name) else str(text)


class ConfluentBroker(Broker):
    """:class:`Broker` over confluent-kafka's ``AdminClient``.

    ``isolation``: ``read_committed`` makes ``latest`` the last stable offset (the end of
    committed transactions), as a consumer with that isolation level sees it; :meth:`peek`
    reads with a consumer of the readers' settings (:func:`consumer_settings`).
    """

    request_partitions = 1_000
    """Partitions per ListOffsets request of :meth:`offsets` (all in flight at once), and
    assigned at once to the consumer of :meth:`peek`. A request's cost in the client grows
    with the square of its partitions (50,000: 14.1 s in one request, 0.86 s in requests of
    1,000), and a consumer assigned more than about 1,000 partitions of Tansu takes seconds
    to tens of seconds to answer (``bench/kafka_offsets.py``)."""

    def __init__(self, client: ClientConfig, *, request_timeout: float = 30.0) -> None:
        from confluent_kafka.admin import AdminClient

        settings: dict[str, Any] = {
            k: v for k, v in client.to_dict().items() if not k.startswith(("fetch.", "isolation."))
        }
        settings.setdefault("socket.timeout.ms", str(int(request_timeout * 1000)))
        self._servers = client.bootstrap_servers
        self._client = client
        self._timeout = request_timeout
        self._read_committed = client.settings.get("isolation.level") == "read_committed"
        self._refused: Any = None  # the last login refusal librdkafka reported, if any
        settings["error_cb"] = self._client_error_reported
        try:
            self._admin: Any = AdminClient(settings)
        except Exception as exc:
            raise _client_error(exc, "create a Kafka client") from exc

    def _client_error_reported(self, error: Any) -> None:
        """librdkafka's ``error_cb``: served by ``poll``, in the polling thread."""
        if error.name() in AUTH_FAILED:
            self._refused = error

    def _login_refused(self) -> ConnectorError | None:
        """The error for a login the cluster refused since the last call, if any."""
        with suppress(Exception):
            self._admin.poll(0)  # serves error_cb
        refused, self._refused = self._refused, None
        return None if refused is None else refused_error(self._servers, refused)

    def _fail(self, what: str, error: BaseException) -> ConnectorError:
        refused = self._login_refused()
        if refused is not None:
            return refused
        return ConnectorError(
            f"Kafka at kafka.bootstrap.servers={self._servers} did not {what} within "
            f"{self._timeout:g}s (option requestTimeout): {describe_kafka_error(error)}. "
            "Check that the brokers are reachable and that kafka.security.protocol and the "
            "kafka.sasl.* / kafka.ssl.* options match the cluster (a cluster that wants a "
            "login the client does not offer closes the connection: a transport failure)"
        )

    def topics(self) -> dict[str, int]:
        """See :meth:`Broker.topics`. Asks in slices of a second, so that a login the
        cluster refuses fails within a second rather than after ``request_timeout``."""
        from confluent_kafka import KafkaException

        deadline = time.monotonic() + self._timeout
        while True:
            left = deadline - time.monotonic()
            try:
                metadata = self._admin.list_topics(timeout=max(0.1, min(left, 1.0)))
                break
            except KafkaException as exc:
                refused = self._login_refused()
                if refused is not None:
                    raise refused from exc
                if left <= 1.0:
                    raise self._fail("list its topics", exc) from exc
        result = {}
        for name, topic in metadata.topics.items():
            if name.startswith("__") or topic.error is not None:
                continue  # internal, or being deleted
            result[name] = len(topic.partitions)
        return result

    def offsets(
        self, queries: Mapping[TopicPartition, OffsetQuery]
    ) -> dict[TopicPartition, int | None]:
        if not queries:
            return {}
        from confluent_kafka import IsolationLevel, KafkaError
        from confluent_kafka import TopicPartition as Tp
        from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

        def spec(query: OffsetQuery) -> Any:
            if query == "earliest":
                return OffsetSpec.earliest()  # type: ignore[no-untyped-call]
            if query == "latest":
                return OffsetSpec.latest()  # type: ignore[no-untyped-call]
            return OffsetSpec.for_timestamp(int(query))

        request = [(Tp(t, p), spec(q)) for (t, p), q in queries.items()]
        isolation = (
            IsolationLevel.READ_COMMITTED
            if self._read_committed
            else IsolationLevel.READ_UNCOMMITTED
        )
        futures: dict[Any, Any] = {}
        size = self.request_partitions
        try:
            for start in range(0, len(request), size):
                futures.update(
                    self._admin.list_offsets(
                        dict(request[start : start + size]),
                        isolation_level=isolation,
                        request_timeout=self._timeout,
                    )
                )
        except Exception as exc:
            raise self._fail("answer an offsets request", exc) from exc
        result: dict[TopicPartition, int | None] = {}
        for tp, future in futures.items():
            query = queries[(tp.topic, tp.partition)]
            try:
                info = future.result(timeout=self._timeout + 5)
            except Exception as exc:
                error = exc.args[0] if exc.args else None
                if getattr(error, "code", lambda: None)() in (
                    KafkaError.UNKNOWN_TOPIC_OR_PART,
                    KafkaError._UNKNOWN_PARTITION,
                    KafkaError._UNKNOWN_TOPIC,
                ):
                    continue  # deleted: left out
                raise self._fail(f"tell the offsets of {tp.topic}-{tp.partition}", exc) from exc
            offset = int(info.offset)
            if isinstance(query, int) and int(info.timestamp) < query:
                offset = -1  # a record before the query is no answer (Tansu's "none")
            result[(tp.topic, tp.partition)] = None if offset < 0 else offset
        return result

    def peek(self, positions: Mapping[TopicPartition, int]) -> dict[TopicPartition, PeekedRecord]:
        """See :meth:`Broker.peek`: one consumer per call, assigned the partitions at their
        offsets :attr:`request_partitions` at a time, closed after it.

        A consumer per call, not one kept: a kept librdkafka handle keeps (and refreshes)
        every topic it ever read, and once one of them is deleted its next fetch crashes the
        process on Tansu (librdkafka 2.16). A new one costs a connection, under 10 ms here.
        """
        if not positions:
            return {}
        from confluent_kafka import Consumer

        client_errors: list[Any] = []  # librdkafka reports these to a callback only
        settings = consumer_settings(self._client)
        settings["fetch.wait.max.ms"] = 10  # a partition at its end answers at once
        settings["error_cb"] = client_errors.append
        try:
            consumer = Consumer(settings)
        except Exception as exc:
            raise _client_error(exc, "create a Kafka consumer") from exc
        try:
            return self._peek(consumer, positions, client_errors)
        finally:
            with suppress(Exception):
                consumer.close()

    def _peek(
        self, consumer: Any, positions: Mapping[TopicPartition, int], client_errors: list[Any]
    ) -> dict[TopicPartition, PeekedRecord]:
        """Consume until every partition gave a record or an end, or time is up; the next
        partitions are assigned once those assigned all answered.

        Fails when the client cannot log in, or when no partition answered and the client
        could not reach the cluster; partitions silent until then are left out.
        """
        from confluent_kafka import TIMESTAMP_NOT_AVAILABLE
        from confluent_kafka import TopicPartition as Tp

        found: dict[TopicPartition, PeekedRecord] = {}
        queue = list(positions.items())
        assigned = 0  # partitions of the queue assigned so far
        waiting: set[TopicPartition] = set()
        checked = 0  # client errors looked at
        deadline = time.monotonic() + self._timeout
        while (waiting or assigned < len(queue)) and (left := deadline - time.monotonic()) > 0:
            if not waiting:
                window = queue[assigned : assigned + self.request_partitions]
                assigned += len(window)
                waiting = {tp for tp, _ in window}
                try:
                    consumer.assign([Tp(t, p, offset) for (t, p), offset in window])
                except Exception as exc:
                    raise self._fail("accept a consumer's assignment", exc) from exc
            try:
                messages = consumer.consume(500, timeout=min(left, 0.005))
            except Exception as exc:
                raise self._fail("return records", exc) from exc
            for error in client_errors[checked:]:
                self._peek_error(error, None)  # raises if the client cannot log in
            checked = len(client_errors)
            for message in messages:
                tp = (message.topic(), message.partition())
                error = message.error()
                if error is not None and not self._peek_error(error, tp):
                    continue  # transient
                if tp not in waiting:
                    continue  # already answered
                waiting.discard(tp)
                kind, timestamp = message.timestamp()
                if error is None and kind != TIMESTAMP_NOT_AVAILABLE:
                    found[tp] = PeekedRecord(message.offset(), timestamp)
        silent = [*waiting, *(tp for tp, _ in queue[assigned:])]
        down = [e for e in client_errors if e.name() in _DOWN]
        if down and len(silent) == len(positions):
            raise self._fail("return records", Exception(down[-1]))
        if silent:  # e.g. deleted meanwhile: a consumer hears nothing of a deleted topic
            log.debug("splitflow: no record or end within %gs for %s", self._timeout, silent)
        return found

    def _peek_error(self, error: Any, tp: tuple[str, int] | None) -> bool:
        """Whether ``error`` answers for ``tp`` (no record there); raises if it is fatal.

        ``tp``: None for an error of the client, not of a partition.
        """
        name = error.name()
        if name in _NO_RECORD:
            return True
        if name in AUTH_FAILED or error.fatal():
            raise refused_error(self._servers, error)
        log.debug("splitflow: transient Kafka error while peeking %s: %s", tp, error.str())
        return False

    def close(self) -> None:
        self._admin = None


# librdkafka's error names, by what they mean for a partition being read or peeked
GONE = frozenset({"UNKNOWN_TOPIC_OR_PART", "_UNKNOWN_PARTITION", "_UNKNOWN_TOPIC"})
OUT_OF_RANGE = frozenset({"OFFSET_OUT_OF_RANGE", "_AUTO_OFFSET_RESET"})
AUTH_FAILED = frozenset(
    {
        "_AUTHENTICATION",
        "SASL_AUTHENTICATION_FAILED",
        "TOPIC_AUTHORIZATION_FAILED",
        "CLUSTER_AUTHORIZATION_FAILED",
        "_SSL",
    }
)
_NO_RECORD = GONE | OUT_OF_RANGE | {"_PARTITION_EOF"}
_DOWN = {"_TRANSPORT", "_ALL_BROKERS_DOWN", "_RESOLVE"}


def refused_error(servers: str, error: Any) -> ConnectorError:
    """The cluster refused the client's login or its reads (``error``: a KafkaError)."""
    return ConnectorError(
        f"Kafka at kafka.bootstrap.servers={servers} refused the client: "
        f"{error.name()}: {error.str()} (check kafka.security.protocol and the "
        "kafka.sasl.* / kafka.ssl.* options)"
    )


def _client_error(exc: BaseException, what: str) -> ConnectorError:
    """A client could not be made: almost always a bad ``kafka.*`` setting."""
    from splitflow.errors import ConfigurationError

    text = describe_kafka_error(exc)
    if "configuration property" in text.lower() or "invalid value" in text.lower():
        raise ConfigurationError(
            f"a kafka.* option is not a valid confluent-kafka (librdkafka) setting: {text}",
            option="kafka.*",
        ) from exc
    return ConnectorError(f"could not {what}: {text}")


def check_client_config(client: ClientConfig) -> None:
    """Build (and drop) a consumer with ``client``: a bad ``kafka.*`` setting fails here.

    Raises :class:`~splitflow.errors.ConfigurationError` naming the setting (librdkafka
    names it in its message). Opens no connection.
    """
    from confluent_kafka import Consumer

    try:
        consumer = Consumer(consumer_settings(client))
    except Exception as exc:
        raise _client_error(exc, "create a Kafka consumer") from exc
    consumer.close()


def consumer_settings(client: ClientConfig) -> dict[str, Any]:
    """Settings of a reader's consumer: the user's, plus what the source manages."""
    settings: dict[str, Any] = dict(client.to_dict())
    settings.update(
        {
            "group.id": "splitflow-unused",  # required by librdkafka; nothing is committed
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
        }
    )
    return settings
