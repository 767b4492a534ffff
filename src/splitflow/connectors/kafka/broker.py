"""What the enumerator asks of a Kafka cluster, and its confluent-kafka implementation.

:class:`Broker` is the enumerator's whole view of the cluster: topics with their partition
counts and offsets by spec (earliest, latest, first at or after a timestamp), each one
batched round trip. Unit tests give the enumerator a fake; :class:`ConfluentBroker` asks a
real cluster through confluent-kafka's ``AdminClient``, every request bounded by
``request_timeout``, every failure translated into a :class:`~splitflow.errors.ConnectorError`
that names ``kafka.bootstrap.servers`` (never a secret setting).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, Literal

from splitflow.connectors.kafka.options import ClientConfig, TopicPartition
from splitflow.errors import ConnectorError

OffsetQuery = Literal["earliest", "latest"] | int
"""``earliest``, ``latest``, or a timestamp in ms (the first offset at or after it)."""


class Broker(ABC):
    """A Kafka cluster, as the enumerator sees it.

    Called by: the enumerator's worker thread (discovery) and its coordinator thread
    (``latest_positions``); implementations must be thread-safe.
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
    committed transactions), as a consumer with that isolation level sees it.
    """

    def __init__(self, client: ClientConfig, *, request_timeout: float = 30.0) -> None:
        from confluent_kafka.admin import AdminClient

        settings: dict[str, Any] = {
            k: v for k, v in client.to_dict().items() if not k.startswith(("fetch.", "isolation."))
        }
        settings.setdefault("socket.timeout.ms", str(int(request_timeout * 1000)))
        self._servers = client.bootstrap_servers
        self._timeout = request_timeout
        self._read_committed = client.settings.get("isolation.level") == "read_committed"
        try:
            self._admin: Any = AdminClient(settings)
        except Exception as exc:
            raise _client_error(exc, "create a Kafka client") from exc

    def _fail(self, what: str, error: BaseException) -> ConnectorError:
        return ConnectorError(
            f"Kafka at kafka.bootstrap.servers={self._servers} did not {what} within "
            f"{self._timeout:g}s (option requestTimeout): {describe_kafka_error(error)}. "
            "Check that the brokers are reachable and that kafka.security.protocol and the "
            "kafka.sasl.* / kafka.ssl.* options match the cluster (a refused login looks "
            "like a transport failure)"
        )

    def topics(self) -> dict[str, int]:
        try:
            metadata = self._admin.list_topics(timeout=self._timeout)
        except Exception as exc:
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

        request = {Tp(t, p): spec(q) for (t, p), q in queries.items()}
        isolation = (
            IsolationLevel.READ_COMMITTED
            if self._read_committed
            else IsolationLevel.READ_UNCOMMITTED
        )
        try:
            futures = self._admin.list_offsets(
                request, isolation_level=isolation, request_timeout=self._timeout
            )
        except Exception as exc:
            raise self._fail("answer an offsets request", exc) from exc
        result: dict[TopicPartition, int | None] = {}
        for tp, future in futures.items():
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
            result[(tp.topic, tp.partition)] = None if offset < 0 else offset
        return result

    def close(self) -> None:
        self._admin = None


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
