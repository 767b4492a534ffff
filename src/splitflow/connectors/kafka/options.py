"""The options of the Kafka source, named and shaped as Spark's built-in Kafka source.

=====================================  ===========  =========================================
option                                 default      meaning
=====================================  ===========  =========================================
``subscribe``                          \\-          comma-separated topics
``subscribePattern``                   \\-          a regular expression over topic names
``assign``                             \\-          JSON ``{"topic": [0, 1]}``
``startingOffsets``                    latest /     ``earliest``, ``latest`` or JSON
                                       earliest     ``{"t": {"0": 23, "1": -2}}`` (-2 earliest,
                                       (batch)      -1 latest); first start only
``startingOffsetsByTimestamp``         \\-          JSON ``{"t": {"0": 1700000000000}}`` (ms)
``startingTimestamp``                  \\-          one timestamp (ms) for every partition
``startingOffsetsByTimestampStrategy`` error        no record at or after the timestamp:
                                                    ``error`` or ``latest``
``endingOffsets``                      latest       batch reads: ``latest`` or JSON (-1 latest)
``failOnDataLoss``                     true         fail on lost records (deleted partitions,
                                                    offsets out of range or going backwards)
``includeHeaders``                     false        add the ``headers`` column
``discoveryInterval``                  30s          how often new topics and partitions are
                                                    looked for (streaming)
``splitAssignment``                    balanced     ``balanced`` or ``hash`` (Flink's owner)
``requestTimeout``                     30s          bound of every metadata and offset request
``kafka.*``                            \\-          client settings (``kafka.bootstrap.servers``
                                                    is required), passed to confluent-kafka
=====================================  ===========  =========================================

Exactly one of ``subscribe``, ``subscribePattern`` and ``assign``. For the first start,
``startingTimestamp`` wins over ``startingOffsetsByTimestamp``, which wins over
``startingOffsets``; partitions found later start at their earliest offset.

Secrets: client settings are kept apart (:class:`ClientConfig`), whose ``repr`` shows only
the keys that are not secret; nothing of them goes into offsets or log lines.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from splitflow.api.options import parse_duration, parse_flag
from splitflow.errors import ConfigurationError

EARLIEST = -2
"""Spark's JSON code for "the earliest offset"."""
LATEST = -1
"""Spark's JSON code for "the latest offset" (the end)."""

TopicPartition = tuple[str, int]
Subscription = tuple[Literal["subscribe", "subscribePattern", "assign"], Any]

# Client settings the source manages itself: setting them would break exactly-once.
_MANAGED = {
    "group.id": "the source assigns partitions itself and commits nothing",
    "enable.auto.commit": "the source commits nothing to Kafka: Spark's checkpoint holds offsets",
    "auto.offset.reset": "use startingOffsets; out-of-range offsets follow failOnDataLoss",
    "enable.partition.eof": "the reader needs partition EOF to end a slice early",
    "key.deserializer": "keys are always bytes",
    "value.deserializer": "values are always bytes",
}
_SECRET = re.compile(r"(password|secret|token|jaas|credential|key\.pem|keystore|\.key$)", re.I)


def is_secret(key: str) -> bool:
    """Whether a client setting may hold a credential (never printed, logged or stored)."""
    return bool(_SECRET.search(key))


@dataclass(frozen=True)
class ClientConfig:
    """The ``kafka.*`` settings, without the prefix, for confluent-kafka.

    Its ``repr`` and ``str`` hide the values of secret settings (``sasl.password``,
    ``ssl.key.password``, ...): a log line or an error that shows the config shows no secret.

    >>> ClientConfig({"bootstrap.servers": "b:9092", "sasl.password": "s3cret"})
    ClientConfig(bootstrap.servers='b:9092', sasl.password=<redacted>)
    """

    settings: Mapping[str, str] = field(default_factory=dict)

    @property
    def bootstrap_servers(self) -> str:
        return self.settings.get("bootstrap.servers", "")

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{k}=<redacted>" if is_secret(k) else f"{k}={v!r}"
            for k, v in sorted(self.settings.items())
        )
        return f"ClientConfig({shown})"

    __str__ = __repr__

    def to_dict(self) -> dict[str, str]:
        """The settings, secrets included, for building a client (never for printing)."""
        return dict(self.settings)


@dataclass(frozen=True)
class StartSpec:
    """Where partitions start on the first start of a query.

    ``kind``: ``earliest``, ``latest``, ``offsets`` (``per_partition`` holds offsets, -2
    earliest, -1 latest), ``timestamps`` (``per_partition`` holds timestamps in ms) or
    ``timestamp`` (``timestamp`` for every partition). ``no_match``: what a timestamp that no
    record reaches resolves to, ``error`` or ``latest``.
    """

    kind: Literal["earliest", "latest", "offsets", "timestamps", "timestamp"] = "latest"
    per_partition: Mapping[TopicPartition, int] = field(default_factory=dict)
    timestamp: int | None = None
    no_match: Literal["error", "latest"] = "error"
    option: str = "startingOffsets"


@dataclass(frozen=True)
class EndSpec:
    """Where a batch read ends: at the latest offset, or at ``per_partition`` (-1 latest)."""

    per_partition: Mapping[TopicPartition, int] | None = None


@dataclass(frozen=True)
class KafkaOptions:
    """The parsed options of one Kafka source (see the module doc)."""

    subscription: Subscription
    client: ClientConfig
    start: StartSpec = StartSpec()
    end: EndSpec | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    discovery_interval: float | None = 30.0
    assignment: Literal["balanced", "hash"] = "balanced"
    request_timeout: float = 30.0

    @classmethod
    def parse(cls, options: Mapping[str, str], *, batch: bool = False) -> KafkaOptions:
        """Read Spark-style options (keys in any case); ``batch``: a batch read's defaults.

        Raises :class:`~splitflow.errors.ConfigurationError` naming the option at fault.
        """
        lowered = {k.lower(): v for k, v in options.items()}

        def get(name: str) -> str | None:
            value = lowered.get(name.lower())
            return None if value is None or value.strip() == "" else value.strip()

        client = {
            k[len("kafka.") :]: v for k, v in options.items() if k.lower().startswith("kafka.")
        }
        client = {k.lower(): v for k, v in client.items()}
        if not client.get("bootstrap.servers"):
            raise ConfigurationError(
                "option kafka.bootstrap.servers is required: host:port of the Kafka brokers",
                option="kafka.bootstrap.servers",
            )
        for key, why in _MANAGED.items():
            if key in client:
                raise ConfigurationError(
                    f"option kafka.{key} is not supported: {why}", option=f"kafka.{key}"
                )
        end_text = get("endingOffsets")
        if end_text is not None and not batch:
            raise ConfigurationError(
                "option endingOffsets is for batch reads (spark.read) only", option="endingOffsets"
            )
        interval = get("discoveryInterval")
        return cls(
            subscription=_subscription(get("subscribe"), get("subscribePattern"), get("assign")),
            client=ClientConfig(client),
            start=_start_spec(
                get("startingOffsets"),
                get("startingOffsetsByTimestamp"),
                get("startingTimestamp"),
                get("startingOffsetsByTimestampStrategy"),
                batch=batch,
            ),
            end=None if end_text is None else _end_spec(end_text),
            fail_on_data_loss=parse_flag("failOnDataLoss", get("failOnDataLoss"), True),
            include_headers=parse_flag("includeHeaders", get("includeHeaders"), False),
            discovery_interval=(
                None
                if batch
                else (
                    30.0
                    if interval is None
                    else parse_duration("discoveryInterval", interval, above_zero=True)
                )
            ),
            assignment=_choice("splitAssignment", get("splitAssignment"), ("balanced", "hash")),
            request_timeout=(
                30.0
                if get("requestTimeout") is None
                else parse_duration("requestTimeout", str(get("requestTimeout")), above_zero=True)
            ),
        )

    def matches(self, topic: str) -> bool:
        """Whether ``topic`` is read (for ``assign``: named in it)."""
        kind, value = self.subscription
        if kind == "subscribe":
            return topic in value
        if kind == "subscribePattern":
            return bool(value.fullmatch(topic))
        return topic in value

    def __repr__(self) -> str:
        kind, value = self.subscription
        shown = value.pattern if kind == "subscribePattern" else value
        return f"KafkaOptions({kind}={shown!r}, client={self.client!r})"


def _choice(option: str, text: str | None, allowed: tuple[str, ...]) -> Any:
    if text is None:
        return allowed[0]
    if text.lower() not in allowed:
        raise ConfigurationError(
            f"option {option}: {text!r} is not one of {', '.join(allowed)}", option=option
        )
    return text.lower()


def _json(option: str, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"option {option}: not valid JSON: {exc}", option=option) from None


def _subscription(subscribe: str | None, pattern: str | None, assign: str | None) -> Subscription:
    given = [
        name
        for name, v in (("subscribe", subscribe), ("subscribePattern", pattern), ("assign", assign))
        if v is not None
    ]
    if len(given) != 1:
        raise ConfigurationError(
            "exactly one of the options subscribe, subscribePattern and assign is required, "
            f"got {', '.join(given) or 'none'}",
            option=given[-1] if given else "subscribe",
        )
    if subscribe is not None:
        topics = frozenset(t.strip() for t in subscribe.split(",") if t.strip())
        if not topics:
            raise ConfigurationError("option subscribe: no topic named", option="subscribe")
        return ("subscribe", topics)
    if pattern is not None:
        try:
            return ("subscribePattern", re.compile(pattern))
        except re.error as exc:
            raise ConfigurationError(
                f"option subscribePattern: {pattern!r} is not a regular expression: {exc}",
                option="subscribePattern",
            ) from None
    data = _json("assign", str(assign))
    if not isinstance(data, dict) or not all(
        isinstance(ps, list) and all(isinstance(p, int) and p >= 0 for p in ps)
        for ps in data.values()
    ):
        raise ConfigurationError(
            'option assign: expected JSON like {"topic": [0, 1]}', option="assign"
        )
    return ("assign", {str(t): frozenset(ps) for t, ps in data.items()})


def _per_partition(option: str, text: str, *, lowest: int) -> dict[TopicPartition, int]:
    data = _json(option, text)
    example = '{"topic": {"0": 23, "1": -1}}'
    if not isinstance(data, dict):
        raise ConfigurationError(f"option {option}: expected JSON like {example}", option=option)
    result: dict[TopicPartition, int] = {}
    for topic, parts in data.items():
        if not isinstance(parts, dict):
            raise ConfigurationError(
                f"option {option}: topic {topic!r} needs an object of partition -> value, "
                f"like {example}",
                option=option,
            )
        for part, value in parts.items():
            if not str(part).isdigit() or not isinstance(value, int) or value < lowest:
                raise ConfigurationError(
                    f"option {option}: {topic}-{part}: {value!r} is not a valid value "
                    f"(whole numbers >= {lowest})",
                    option=option,
                )
            result[(str(topic), int(part))] = value
    return result


def _start_spec(
    offsets: str | None,
    by_timestamp: str | None,
    timestamp: str | None,
    strategy: str | None,
    *,
    batch: bool,
) -> StartSpec:
    no_match = _choice("startingOffsetsByTimestampStrategy", strategy, ("error", "latest"))
    if timestamp is not None:
        if not timestamp.isdigit():
            raise ConfigurationError(
                f"option startingTimestamp: {timestamp!r} is not a timestamp in milliseconds",
                option="startingTimestamp",
            )
        return StartSpec(
            "timestamp", timestamp=int(timestamp), no_match=no_match, option="startingTimestamp"
        )
    if by_timestamp is not None:
        return StartSpec(
            "timestamps",
            _per_partition("startingOffsetsByTimestamp", by_timestamp, lowest=0),
            no_match=no_match,
            option="startingOffsetsByTimestamp",
        )
    if offsets is None:
        return StartSpec("earliest" if batch else "latest")
    if offsets.lower() in ("earliest", "latest"):
        return StartSpec(offsets.lower())  # type: ignore[arg-type]
    return StartSpec("offsets", _per_partition("startingOffsets", offsets, lowest=EARLIEST))


def _end_spec(text: str) -> EndSpec:
    if text.lower() == "latest":
        return EndSpec()
    if text.lower() == "earliest":
        raise ConfigurationError(
            "option endingOffsets: earliest is not allowed (it would read nothing)",
            option="endingOffsets",
        )
    return EndSpec(_per_partition("endingOffsets", text, lowest=LATEST))


__all__ = [
    "EARLIEST",
    "LATEST",
    "ClientConfig",
    "EndSpec",
    "KafkaOptions",
    "StartSpec",
    "TopicPartition",
    "is_secret",
]
