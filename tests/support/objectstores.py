"""Throw-away object-store servers on loopback, for tests and benchmarks: an S3 server
(moto's standalone server, ``moto[server]`` from PyPI, the one s3fs's own tests use) and
Azurite (Microsoft's Azure Storage emulator, from the npm registry, installed by
``scripts/bootstrap.sh`` into ``.tools/azurite``).

Each server is started on a free ``127.0.0.1`` port in its own process group, with a
watchdog process that kills it when the process that started it dies (a test run killed
hard leaves nothing behind); :meth:`stop` kills it by its PID.

What each does with a conditional create (checked by ``tests/spark/test_state_store.py``):

* moto 5.2.5: ``PutObject`` with ``If-None-Match: *`` on an existing key answers
  ``412 PreconditionFailed`` (s3fs raises ``FileExistsError``), as AWS S3 does.
* Azurite 3.37.0: ``Put Blob`` / ``Put Block List`` with ``If-None-Match: *`` on an existing
  blob answers ``409 BlobAlreadyExists`` (adlfs raises ``FileExistsError``), as Azure does.

Used as fixtures (``s3_server``, ``azurite``, ``object_store``)::

    with MotoS3.start(tmp_path) as s3:
        s3.create_bucket("state")
        url, options = s3.url("state", "q1"), s3.storage_options()
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
AZURITE = REPO / ".tools" / "azurite" / "node_modules" / ".bin" / "azurite-blob"

AZURE_ACCOUNT = "devstoreaccount1"
AZURE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
"""Azurite's well-known development account and key (public, not a secret)."""

S3_KEY, S3_SECRET = "splitflow-test-key", "splitflow-test-secret"
"""Any credentials pass moto's server (it does not check signatures unless told to)."""

# Run by the watchdog: argv = owner PID, server PID. Kills the server's process group
# when the owner is gone.
_WATCHDOG = """
import os, signal, sys, time
owner, server = int(sys.argv[1]), int(sys.argv[2])
def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
while alive(owner) and alive(server):
    time.sleep(0.5)
if alive(server):
    try:
        os.killpg(server, signal.SIGKILL)
    except OSError:
        pass
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def azurite_installed() -> bool:
    return AZURITE.exists() and shutil.which("node") is not None


def moto_installed() -> bool:
    try:
        import moto.server  # noqa: F401
    except ImportError:
        return False
    return True


class _Server:
    """A server process on ``127.0.0.1:port`` with a watchdog; stop it by its PID."""

    name = "server"

    def __init__(self, process: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.process = process
        self.port = port
        self.log = log
        self._watchdog = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(process.pid)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    @classmethod
    def _launch(cls, argv: list[str], port: int, log: Path, env: dict[str, str] | None) -> Any:
        out = open(log, "ab")  # noqa: SIM115
        process = subprocess.Popen(
            argv,
            stdout=out,
            stderr=out,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        out.close()
        server = cls(process, port, log)
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return server
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    server.stop()
                    raise RuntimeError(
                        f"{cls.name} did not start on port {port}:\n{server.log_tail()}"
                    ) from None
                time.sleep(0.05)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 30) -> str:
        with suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.process.poll() is None:
            with suppress(OSError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        if self._watchdog.poll() is None:
            self._watchdog.kill()
            self._watchdog.wait(10)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_ALLOW_ALL = ["*"]
S3_READ_ONLY = ["s3:GetObject", "s3:ListBucket", "s3:GetBucketLocation"]
"""The actions of a read-only S3 credential (:meth:`MotoS3.create_user`)."""


class MotoS3(_Server):
    """moto's S3 server. ``auth=True`` makes it check credentials and IAM policies, as AWS
    does (moto's ``INITIAL_NO_AUTH_ACTION_COUNT``: the first 3 requests pass unchecked, and
    :meth:`start` spends them creating an ``admin`` user allowed everything, whose key the
    server's :meth:`storage_options` and :meth:`client` then use); :meth:`create_user` makes
    other users (a read-only one for the tests of bad credentials). Without ``auth`` any
    credentials pass."""

    name = "moto S3 server"
    key, secret = S3_KEY, S3_SECRET

    @classmethod
    def start(cls, directory: Path, *, auth: bool = False) -> MotoS3:
        port = free_port()
        env = {"MOTO_ALLOW_NONEXISTENT_REGION": "true", "AWS_DEFAULT_REGION": "us-east-1"}
        if auth:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = "3"  # the admin user's 3 requests below
        server: MotoS3 = cls._launch(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            port,
            Path(directory) / f"moto-{port}.log",
            env,
        )
        if auth:
            try:
                server.key, server.secret = server.create_user("admin", _ALLOW_ALL)
            except Exception:
                server.stop()
                raise
        return server

    def create_user(self, name: str, actions: list[str]) -> tuple[str, str]:
        """An IAM user allowed ``actions`` on every resource: its access key and secret."""
        iam = self.client("iam")
        iam.create_user(UserName=name)
        policy = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}],
        }
        iam.put_user_policy(UserName=name, PolicyName=name, PolicyDocument=json.dumps(policy))
        created = iam.create_access_key(UserName=name)["AccessKey"]
        return str(created["AccessKeyId"]), str(created["SecretAccessKey"])

    def storage_options(self, key: str | None = None, secret: str | None = None) -> dict[str, str]:
        """The s3fs options for this server, as strings (as Spark options carry them)."""
        return {
            "endpoint_url": self.endpoint,
            "key": key or self.key,
            "secret": secret or self.secret,
        }

    def filesystem(self, **options: Any) -> Any:
        import s3fs  # type: ignore[import-untyped]

        return s3fs.S3FileSystem(**{**self.storage_options(), **options}, skip_instance_cache=True)

    def create_bucket(self, name: str | None = None) -> str:
        name = name or f"b-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def url(self, bucket: str, *parts: str) -> str:
        return "s3://" + "/".join((bucket, *parts))

    def client(self, service: str = "s3", key: str | None = None, secret: str | None = None) -> Any:
        import boto3

        return boto3.client(
            service,
            endpoint_url=self.endpoint,
            aws_access_key_id=key or self.key,
            aws_secret_access_key=secret or self.secret,
            region_name="us-east-1",
        )


class Azurite(_Server):
    """Azurite's blob service (``--skipApiVersionCheck``: current Azure SDKs speak a newer
    API version than it announces), account ``devstoreaccount1``, data in memory
    (``--inMemoryPersistence``)."""

    name = "Azurite"

    @classmethod
    def start(cls, directory: Path) -> Azurite:
        if not azurite_installed():
            raise RuntimeError("Azurite is not installed: run scripts/bootstrap.sh")
        port = free_port()
        server: Azurite = cls._launch(
            [
                str(AZURITE),
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                str(port),
                "--skipApiVersionCheck",
                "--inMemoryPersistence",
                "--silent",
            ],
            port,
            Path(directory) / f"azurite-{port}.log",
            None,
        )
        return server

    @property
    def blob_endpoint(self) -> str:
        return f"{self.endpoint}/{AZURE_ACCOUNT}"

    def connection_string(self, key: str = AZURE_KEY) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={AZURE_ACCOUNT};AccountKey={key};"
            f"BlobEndpoint={self.blob_endpoint};"
        )

    def storage_options(self, key: str = AZURE_KEY) -> dict[str, str]:
        """The adlfs options for this server, as strings."""
        return {"connection_string": self.connection_string(key)}

    def filesystem(self, **options: Any) -> Any:
        import adlfs  # type: ignore[import-untyped]

        return adlfs.AzureBlobFileSystem(
            **{**self.storage_options(), **options}, skip_instance_cache=True
        )

    def service(self) -> Any:
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(self.connection_string())

    def create_container(self, name: str | None = None) -> str:
        name = name or f"c-{uuid.uuid4().hex[:12]}"
        self.service().create_container(name)
        return name

    def read_only_sas(self, container: str) -> str:
        """A SAS token for ``container`` that may read and list, not write or delete."""
        from datetime import UTC, datetime, timedelta

        from azure.storage.blob import ContainerSasPermissions, generate_container_sas

        return str(
            generate_container_sas(
                AZURE_ACCOUNT,
                container,
                account_key=AZURE_KEY,
                permission=ContainerSasPermissions(read=True, list=True),
                expiry=datetime.now(UTC) + timedelta(hours=2),
            )
        )

    def url(self, container: str, *parts: str) -> str:
        return "abfs://" + "/".join((container, *parts))


class Outage:
    """A TCP forwarder on ``127.0.0.1:port`` to ``target_port``, to make a store unreachable
    and back: :meth:`cut` closes the listening socket and every open connection (clients
    get "connection refused"), :meth:`restore` listens on the same port again. Runs on
    daemon threads of this process; :attr:`endpoint` is what the clients are given."""

    def __init__(self, target_port: int) -> None:
        import threading

        self.target_port = target_port
        self.port = free_port()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.restore()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def restore(self) -> None:
        import threading

        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            sockets, self._sockets = self._sockets, set()
        for sock in [*sockets, *([listener] if listener else [])]:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with suppress(OSError):
                sock.close()

    def _accept(self, listener: socket.socket) -> None:
        import threading

        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self._sockets.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.cut()


def server_fixture(kind: str, tmp_path_factory: Any) -> Iterator[Any]:
    """Body of the session-scoped ``s3_server`` and ``azurite`` fixtures (skip when the
    server is not installed)."""
    import pytest

    if kind == "s3":
        if not moto_installed():
            pytest.skip("moto's S3 server is not installed: pip install -e '.[objectstore]'")
        server: Any = MotoS3.start(tmp_path_factory.mktemp("moto"))
    else:
        if not azurite_installed():
            pytest.skip("Azurite is not installed: run scripts/bootstrap.sh")
        server = Azurite.start(tmp_path_factory.mktemp("azurite"))
    try:
        yield server
    finally:
        server.stop()


class StoreUnderTest:
    """A fresh bucket or container on one server, and what a test needs to use it:
    ``url(*parts)``, ``options`` (the storage options as strings), ``spark_options(name)``
    (the same as ``<name>.<key>`` Spark options) and ``fs`` (an fsspec filesystem)."""

    def __init__(self, kind: str, server: Any) -> None:
        self.kind = kind
        self.server = server
        self.bucket = server.create_bucket() if kind == "s3" else server.create_container()
        self.options: dict[str, str] = server.storage_options()
        self.fs = server.filesystem()

    def url(self, *parts: str) -> str:
        return str(self.server.url(self.bucket, *parts))

    def spark_options(self, name: str = "stateDir") -> dict[str, str]:
        return {f"{name}.{key}": value for key, value in self.options.items()}

    def secrets(self) -> list[str]:
        """The values a log, an offset or a repr must never show."""
        if self.kind == "s3":
            return [self.options["secret"]]
        return [AZURE_KEY]

    def __repr__(self) -> str:
        return f"StoreUnderTest({self.kind})"


if __name__ == "__main__":  # python -m tests.support.objectstores: start both, print them
    import tempfile

    with (
        MotoS3.start(Path(tempfile.mkdtemp())) as s3,
        Azurite.start(Path(tempfile.mkdtemp())) as az,
    ):
        print("s3", s3.endpoint, "azurite", az.blob_endpoint, flush=True)
        with suppress(KeyboardInterrupt):
            sys.stdin.read()
