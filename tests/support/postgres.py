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
:meth:`Postgres.stop`). The server log is always ``<directory>/postgres.log``.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

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


# Run by the watchdog process: argv = owner PID, data directory, directory to remove (or "").
_WATCHDOG = """
import os, shutil, signal, sys, time
owner, data, base = int(sys.argv[1]), sys.argv[2], sys.argv[3]
def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
def postmaster():
    try:
        with open(os.path.join(data, "postmaster.pid")) as f:
            return int(f.readline())
    except (OSError, ValueError):
        return None
while alive(owner):
    time.sleep(0.5)
pid = postmaster()
if pid is not None and alive(pid):
    os.kill(pid, signal.SIGQUIT)
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(pid):
        os.kill(pid, signal.SIGKILL)
if base:
    shutil.rmtree(base, ignore_errors=True)
"""


def postgres_bin_dir() -> Path | None:
    """The newest ``/usr/lib/postgresql/<version>/bin`` that holds a server, or None."""

    def version(path: str) -> tuple[int, ...]:
        name = Path(path).parent.name
        return tuple(int(part) for part in re.findall(r"\d+", name))

    found = [p for p in glob.glob("/usr/lib/postgresql/*/bin") if os.path.isfile(f"{p}/postgres")]
    return Path(max(found, key=version)) if found else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_root() -> bool:
    return os.geteuid() == 0


def _server_command(args: list[str]) -> list[str]:
    """``args`` as the ``postgres`` user when we are root (the server refuses root)."""
    return ["runuser", "-u", "postgres", "--", *args] if _as_root() else args


def _chown_to_postgres(path: Path) -> None:
    if _as_root():
        shutil.chown(path, "postgres", "postgres")


def _quote_conninfo(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _quote_setting(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


class Postgres:
    """One PostgreSQL server on ``127.0.0.1:port``; stop it with :meth:`stop`.

    Create it with :meth:`start`. ``host``/``port`` and :meth:`conninfo` describe the TCP
    endpoint; :meth:`connect` and :meth:`execute` use it as the ``splitflow`` role.
    """

    def __init__(self, bin_dir: Path, directory: Path, base: Path, owns_base: bool) -> None:
        self.bin_dir = bin_dir
        self.directory = directory
        self.base = base  # holds data/ and the Unix socket; owned by the server's user
        self.data = base / "data"
        self.socket_dir = base
        self.log = directory / "postgres.log"
        self.host = "127.0.0.1"
        self.port = 0
        self.settings: dict[str, str] = {}
        self._owns_base = owns_base
        self._admin: Any = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._running = False

    # -- lifecycle ------------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        directory: Path,
        settings: Mapping[str, str] | None = None,
        timeout: float = 60.0,
    ) -> Postgres:
        """initdb a new cluster under ``directory``, start it, create role and database.

        ``settings`` are extra ``postgresql.conf`` settings (over :data:`BASE_SETTINGS`).
        Takes about 1 s (initdb); raises RuntimeError with the log's tail on failure.
        """
        bin_dir = postgres_bin_dir()
        if bin_dir is None:
            raise RuntimeError("no PostgreSQL server in /usr/lib/postgresql/*/bin")
        directory = Path(directory).resolve()
        directory.mkdir(parents=True, exist_ok=True)
        base, owns_base = cls._make_base(directory)
        server = cls(bin_dir, directory, base, owns_base)
        try:
            server._initdb(timeout)
            server._start(dict(settings or {}), timeout, new_port=True)
            server._create_role_and_database()
        except BaseException:
            server.stop()
            raise
        return server

    @staticmethod
    def _make_base(directory: Path) -> tuple[Path, bool]:
        if not _as_root():
            base = directory / "pg"
            base.mkdir()
            return base, False
        probe = ["test", "-w", str(directory), "-a", "-x", str(directory)]
        reachable = subprocess.run(_server_command(probe), check=False).returncode == 0
        if reachable:
            base = directory / "pg"
            base.mkdir()
            owns = False
        else:  # e.g. under pytest's /tmp/pytest-of-root (mode 0700)
            base = Path(tempfile.mkdtemp(prefix="splitflow-pg-"))
            (directory / "pg").symlink_to(base)
            owns = True
        _chown_to_postgres(base)
        return base, owns

    def _run(self, args: list[str], timeout: float) -> subprocess.CompletedProcess[bytes]:
        with open(self.log, "ab") as out:
            return subprocess.run(
                _server_command(args),
                stdout=out,
                stderr=out,
                stdin=subprocess.DEVNULL,
                timeout=timeout,
                check=False,
            )

    def _initdb(self, timeout: float) -> None:
        result = self._run(
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
            ],
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
        _chown_to_postgres(path)

    def _start(self, extra: dict[str, str], timeout: float, new_port: bool) -> None:
        """pg_ctl start -w; on a port collision, retry on another free port."""
        for attempt in range(10):
            if new_port or attempt > 0:
                self.port = free_port()
            self.settings = {
                **BASE_SETTINGS,
                "port": str(self.port),
                "unix_socket_directories": str(self.socket_dir),
                **extra,
            }
            self._write_settings()
            mark = self.log.stat().st_size if self.log.exists() else 0
            # pg_ctl's output (and the postmaster's, inherited) goes to our log file, which
            # we open: the server user need not be able to reach ``directory``.
            result = self._run(
                [
                    str(self.bin_dir / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-w",
                    "-t",
                    str(int(timeout)),
                    "start",
                ],
                timeout + 5,
            )
            if result.returncode == 0:
                self._running = True
                self._start_watchdog()
                return
            with open(self.log, "rb") as f:
                f.seek(mark)
                output = f.read().decode(errors="replace")
            if "could not bind" in output or "already in use" in output:
                continue
            raise RuntimeError(f"PostgreSQL did not start ({result.returncode}):\n{output}")
        raise RuntimeError(f"PostgreSQL found no free port:\n{self.log_tail()}")

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
        self._close_admin()
        if self._running:
            self._pg_ctl_stop("fast", timeout)
        self._start(dict(extra_settings or {}), timeout, new_port=False)

    def _pg_ctl_stop(self, mode: str, timeout: float) -> bool:
        result = self._run(
            [str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-w", "-m", mode, "stop"],
            timeout,
        )
        self._running = result.returncode != 0 and self._postmaster_pid() is not None
        return not self._running

    def _postmaster_pid(self) -> int | None:
        with suppress(OSError, ValueError, IndexError):
            pid = int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
            os.kill(pid, 0)
            return pid
        return None

    def _start_watchdog(self) -> None:
        """A process that stops the server if this process dies without :meth:`stop` (a test
        run killed by a timeout), so no server outlives its owner."""
        if self._watchdog is not None and self._watchdog.poll() is None:
            return
        self._watchdog = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _WATCHDOG,
                str(os.getpid()),
                str(self.data),
                str(self.base) if self._owns_base else "",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def stop(self) -> None:
        """Stop the server now (``pg_ctl stop -m immediate``; SIGKILL to its PID if that
        fails) and remove a data directory that was made outside ``directory``."""
        self._close_admin()
        if self._watchdog is not None:
            self._watchdog.kill()
            self._watchdog.wait(10)
            self._watchdog = None
        stopped = False
        with suppress(Exception):
            stopped = self._pg_ctl_stop("immediate", 30)
        if not stopped:
            pid = self._postmaster_pid()
            if pid is not None:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + 10
                while self._postmaster_pid() is not None and time.monotonic() < deadline:
                    time.sleep(0.02)
        self._running = False
        if self._owns_base:
            shutil.rmtree(self.base, ignore_errors=True)
            self._owns_base = False

    def __enter__(self) -> Postgres:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

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
        if self._admin is None:
            self._admin = {}
        conn = self._admin.get(dbname)
        if conn is None or conn.closed:
            conn = self._admin[dbname] = self.connect(dbname=dbname)
        cursor = conn.execute(sql, params)
        return list(cursor.fetchall()) if cursor.description is not None else []

    def create_database(self, name: str) -> str:
        """Create database ``name`` owned by ``splitflow``; return its :meth:`conninfo`."""
        from psycopg import sql

        statement = sql.SQL("CREATE DATABASE {} OWNER {}")
        self.execute(statement.format(sql.Identifier(name), sql.Identifier(USER)))
        return self.conninfo(dbname=name)

    def _close_admin(self) -> None:
        for conn in (self._admin or {}).values():
            with contextlib.suppress(Exception):
                conn.close()
        self._admin = None


@contextmanager
def running_postgres(directory: Path) -> Iterator[Postgres]:
    server = Postgres.start(directory)
    try:
        yield server
    finally:
        server.stop()


def postgres_fixture(tmp_path_factory: Any) -> Iterator[Postgres]:
    """Body of the session-scoped ``postgres`` fixture (skips when PostgreSQL is missing)."""
    import pytest

    if postgres_bin_dir() is None:
        pytest.skip("no PostgreSQL server in /usr/lib/postgresql/*/bin (apt install postgresql-15)")
    server = Postgres.start(tmp_path_factory.mktemp("postgres"))
    try:
        yield server
    finally:
        server.stop()


if __name__ == "__main__":  # python -m tests.support.postgres: start one, print its conninfo
    with running_postgres(Path(tempfile.mkdtemp(prefix="splitflow-pg-run-"))) as pg:
        print(pg.conninfo(), flush=True)
        with suppress(KeyboardInterrupt):
            sys.stdin.read()
