"""A throw-away PostgreSQL server on loopback, for tests and benchmarks.

The server binaries come from the Debian package ``postgresql-15`` (the newest
``/usr/lib/postgresql/*/bin`` is used). ``initdb`` and ``postgres`` refuse to run as root, so
when the tests run as root every server command runs through ``runuser -u postgres --``.

The server is configured for logical decoding (``wal_level=logical``, 32 replication slots
and WAL senders), with ``fsync=off`` for speed and ``synchronous_commit=on`` (with it off,
logical decoding sees a commit only ~200 ms later). It listens on ``127.0.0.1`` at a free
port, with its Unix socket next to its data directory. A ``splitflow`` role (``LOGIN
REPLICATION SUPERUSER``, password ``s3cret-pw``, checked with SCRAM over TCP) owns a
``splitflow`` database.

Used by ``tests/connectors/postgres`` (``postgres`` fixture)::

    with Postgres.start(tmp_path) as pg:
        pg.execute("CREATE TABLE t (id int PRIMARY KEY)")
        with pg.connect() as conn:
            conn.execute("INSERT INTO t VALUES (1)")
        pg.restart({"wal_level": "replica"})

The data directory lives in the given directory when the ``postgres`` user can reach it;
pytest's ``/tmp/pytest-of-root`` is mode 0700, so as root it usually lives in a fresh
``/tmp/splitflow-pg-*`` directory instead (linked from ``<directory>/pg``, removed by
:meth:`Postgres.stop`). The server log is always ``<directory>/postgres.log``. What both
test servers share (directories, port retries, the watchdog, stopping) is
:mod:`splitflow.testing.dbserver`'s.
"""

from __future__ import annotations

import glob
import os
import re
import signal
import time
from collections.abc import Iterator, Mapping
from contextlib import suppress
from pathlib import Path
from typing import Any, ClassVar

from splitflow.testing.dbserver import LoopbackServer
from splitflow.testing.dbserver import free_port as free_port  # the tests' import

USER = "splitflow"
PASSWORD = "s3cret-pw"
DATABASE = "splitflow"

#: Settings every server starts with (``port`` is added per start).
BASE_SETTINGS: dict[str, str] = {
    "listen_addresses": "127.0.0.1",
    "wal_level": "logical",
    "max_replication_slots": "32",
    "max_wal_senders": "32",
    "fsync": "off",
    "full_page_writes": "off",
    "synchronous_commit": "on",
    "max_connections": "100",
    "shared_buffers": "32MB",
}


def postgres_bin_dir() -> Path | None:
    """The newest ``/usr/lib/postgresql/<version>/bin`` that holds a server, or None."""

    def version(path: str) -> tuple[int, ...]:
        name = Path(path).parent.name
        return tuple(int(part) for part in re.findall(r"\d+", name))

    found = [p for p in glob.glob("/usr/lib/postgresql/*/bin") if os.path.isfile(f"{p}/postgres")]
    return Path(max(found, key=version)) if found else None


def _quote_conninfo(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _quote_setting(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


class Postgres(LoopbackServer):
    """One PostgreSQL server on ``127.0.0.1:port``; stop it with :meth:`stop`.

    Create it with :meth:`start`. ``host``/``port`` and :meth:`conninfo` describe the TCP
    endpoint; :meth:`connect` and :meth:`execute` use it as the ``splitflow`` role.
    """

    product = "PostgreSQL"
    package = "postgresql-15"
    system_user = "postgres"
    base_name = "pg"
    log_name = "postgres.log"
    port_taken: ClassVar[tuple[str, ...]] = ("could not bind", "already in use")
    stop_signal = signal.SIGQUIT  # an immediate shutdown

    def __init__(self, bin_dir: Path, directory: Path, base: Path, owns_base: bool) -> None:
        super().__init__(directory, base, owns_base)
        self.bin_dir = bin_dir
        self.data = base / "data"
        self.socket_dir = base  # the Unix socket's
        self.pid_file = self.data / "postmaster.pid"
        self.settings: dict[str, str] = {}
        self._running = False
        self._kept = False  # start(keep=True): stopped cleanly, its data left

    # -- lifecycle ------------------------------------------------------------------------

    @classmethod
    def installed(cls) -> bool:
        return postgres_bin_dir() is not None

    @classmethod
    def start(
        cls,
        directory: Path,
        settings: Mapping[str, str] | None = None,
        timeout: float = 60.0,
        *,
        keep: bool = False,
    ) -> Postgres:
        """initdb a new cluster under ``directory``, start it, create role and database.

        ``settings`` are extra ``postgresql.conf`` settings (over :data:`BASE_SETTINGS`).
        Takes about 1 s (initdb); raises RuntimeError with the log's tail on failure.
        ``keep``: the cluster outlives the server (:meth:`stop` shuts it down cleanly and
        leaves its data), and a later start with ``keep`` on the same ``directory`` starts
        it again as it was left.
        """
        bin_dir = postgres_bin_dir()
        if bin_dir is None:
            raise RuntimeError("no PostgreSQL server in /usr/lib/postgresql/*/bin")
        kept = Path(directory).resolve() / cls.base_name
        if keep and (kept / "data" / "PG_VERSION").exists():
            server = cls(bin_dir, kept.parent, kept.resolve(), owns_base=False)
            server._kept = True
            with server._stop_on_failure():
                server._start(dict(settings or {}), timeout, new_port=True)
            return server
        with cls(bin_dir, *cls._new_directories(directory))._stop_on_failure() as server:
            if keep:
                server._owns_base, server._kept = False, True
            server._initdb(timeout)
            server._start(dict(settings or {}), timeout, new_port=True)
            server._create_role_and_database()
        return server

    def _initdb(self, timeout: float) -> None:
        result = self._run(
            self._as_server_user(
                [
                    str(self.bin_dir / "initdb"),
                    "-D",
                    str(self.data),
                    "--auth-local=trust",
                    "--auth-host=scram-sha-256",
                    "-U",
                    "postgres",
                    "-E",
                    "UTF8",
                    "--locale=C",
                    "--no-sync",
                    "--no-instructions",
                ]
            ),
            timeout,
        )
        if result.returncode != 0:
            raise RuntimeError(f"initdb failed ({result.returncode}):\n{self.log_tail()}")
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write("\ninclude_if_exists 'splitflow.conf'\n")

    def _write_settings(self) -> None:
        path = self.data / "splitflow.conf"
        lines = [f"{key} = {_quote_setting(str(value))}" for key, value in self.settings.items()]
        path.write_text("\n".join(lines) + "\n")
        self._give_to_server_user(path)

    def _start(self, extra: dict[str, str], timeout: float, new_port: bool) -> None:
        """pg_ctl start -w; on a port collision, retry on another free port."""

        def launch() -> str | None:
            self.settings = {
                **BASE_SETTINGS,
                "port": str(self.port),
                "unix_socket_directories": str(self.socket_dir),
                **extra,
            }
            self._write_settings()
            # pg_ctl's output (and the postmaster's, inherited) goes to our log file.
            args = [str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-w"]
            result = self._run(
                self._as_server_user([*args, "-t", str(int(timeout)), "start"]), timeout + 5
            )
            self._running = result.returncode == 0
            return None if self._running else f" ({result.returncode})"

        self._start_on_free_port(launch, new_port)

    def _create_role_and_database(self) -> None:
        import psycopg

        with psycopg.connect(
            host=str(self.socket_dir),
            port=self.port,
            user="postgres",
            dbname="postgres",
            autocommit=True,
        ) as conn:
            conn.execute(
                f"CREATE ROLE {USER} LOGIN REPLICATION SUPERUSER PASSWORD "
                f"{_quote_setting(PASSWORD)}"
            )
            conn.execute(f"CREATE DATABASE {DATABASE} OWNER {USER}")

    def restart(
        self, extra_settings: Mapping[str, str] | None = None, timeout: float = 60.0
    ) -> None:
        """Stop (fast) and start again on the same port, with ``extra_settings`` on top of
        :data:`BASE_SETTINGS` (they replace any earlier extras; None: the base settings).

        PostgreSQL 15 refuses to start with ``wal_level`` below ``logical`` while a logical
        replication slot exists: that raises RuntimeError with the log's tail.
        """
        self._close_clients()
        if self._running:
            self._pg_ctl_stop("fast", timeout)
        self._start(dict(extra_settings or {}), timeout, new_port=False)

    def _pg_ctl_stop(self, mode: str, timeout: float) -> bool:
        result = self._run(
            self._as_server_user(
                [str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-w", "-m", mode, "stop"]
            ),
            timeout,
        )
        self._running = result.returncode != 0 and self._postmaster_pid() is not None
        return not self._running

    def _postmaster_pid(self) -> int | None:
        with suppress(OSError, ValueError, IndexError):
            pid = int(self.pid_file.read_text().split("\n", 1)[0])
            os.kill(pid, 0)
            return pid
        return None

    def _halt(self) -> None:
        """``pg_ctl stop -m immediate`` (``fast`` for a kept cluster); SIGKILL to the
        postmaster if that fails."""
        stopped = False
        with suppress(Exception):
            stopped = self._pg_ctl_stop("fast" if self._kept else "immediate", 30)
        if not stopped:
            pid = self._postmaster_pid()
            if pid is not None:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + 10
                while self._postmaster_pid() is not None and time.monotonic() < deadline:
                    time.sleep(0.02)
        self._running = False

    def address(self) -> str:
        return self.conninfo()

    # -- clients --------------------------------------------------------------------------

    def conninfo(self, user: str = USER, password: str = PASSWORD, dbname: str = DATABASE) -> str:
        """A libpq conninfo string for ``user`` over TCP to ``127.0.0.1:port``."""
        parts = {
            "host": self.host,
            "port": str(self.port),
            "user": user,
            "password": password,
            "dbname": dbname,
        }
        return " ".join(f"{key}={_quote_conninfo(value)}" for key, value in parts.items())

    def connect(
        self,
        user: str = USER,
        password: str = PASSWORD,
        dbname: str = DATABASE,
        **kwargs: Any,
    ) -> Any:
        """A new ``psycopg.Connection`` (autocommit unless ``autocommit=False`` is given);
        other ``kwargs`` go to ``psycopg.connect``."""
        import psycopg

        kwargs.setdefault("autocommit", True)
        return psycopg.connect(self.conninfo(user, password, dbname), **kwargs)

    def execute(
        self, sql: Any, params: Any = None, *, dbname: str = DATABASE
    ) -> list[tuple[Any, ...]]:
        """Run one statement as ``splitflow`` (autocommit); return its rows ([] if none).

        Reuses one connection per database until :meth:`restart` or :meth:`stop`.
        """
        conn = self._clients.get(dbname)
        if conn is None or conn.closed:
            conn = self._clients[dbname] = self.connect(dbname=dbname)
        cursor = conn.execute(sql, params)
        return list(cursor.fetchall()) if cursor.description is not None else []

    def create_database(self, name: str) -> str:
        """Create database ``name`` owned by ``splitflow``; return its :meth:`conninfo`."""
        from psycopg import sql

        statement = sql.SQL("CREATE DATABASE {} OWNER {}")
        self.execute(statement.format(sql.Identifier(name), sql.Identifier(USER)))
        return self.conninfo(dbname=name)


running_postgres = Postgres.start
"""``with running_postgres(directory) as server``: a server is its own context manager."""


def postgres_fixture(tmp_path_factory: Any) -> Iterator[Postgres]:
    """Body of the session-scoped ``postgres`` fixture (skips when PostgreSQL is missing)."""
    yield from Postgres.session_fixture(tmp_path_factory)


if __name__ == "__main__":  # python -m splitflow.testing.postgres: start one, print its conninfo
    Postgres.main()
