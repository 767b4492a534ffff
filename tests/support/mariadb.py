"""A throw-away MariaDB server on loopback, for tests and benchmarks.

The server comes from the Debian package ``mariadb-server`` (10.11): ``mariadb-install-db``
makes a fresh data directory and ``mariadbd`` serves it, both run with ``--no-defaults`` so
nothing in ``/etc/mysql`` applies. ``mariadbd`` refuses to run as root, so when the tests
run as root both get ``--user=mysql`` and the server drops to that user itself (it does not
fork, so the PID we start is the server's).

The server writes a row-based binlog with whole rows and column names, the way change data
capture needs it (:data:`BASE_OPTIONS`: ``--log-bin --binlog-format=ROW
--binlog-row-image=FULL --binlog-row-metadata=FULL --server-id=1 --gtid-strict-mode``).
MariaDB always has GTIDs (``domain-server-seq``, here ``0-1-N``); the set-up statements
are not binlogged, so the first transaction a test commits is ``0-1-1``. Durability is
traded for speed (``innodb_flush_log_at_trx_commit=2``, ``sync_binlog=0``). It listens on
``127.0.0.1`` at a free port, with its Unix socket next to its data directory. A
``splitflow`` user (password ``s3cret-pw``) has what a CDC reader needs on every database
(``SELECT, RELOAD, SHOW DATABASES, SHOW VIEW, LOCK TABLES, REPLICATION SLAVE, BINLOG
MONITOR``) and everything on the ``splitflow`` database. ``root`` has no password and can
connect only through the socket (``admin=True`` below, or ``mariadb -S <socket> -u root``).

Starts in 0.6 to 0.8 s (``mariadb-install-db`` ~0.45 s, the server ~0.2 s). Used by
``tests/connectors/mysql`` (``mariadb`` fixture)::

    with MariaDB.start(tmp_path) as db:
        db.execute("CREATE TABLE t (id INT PRIMARY KEY, v TEXT)")
        db.execute("INSERT INTO t VALUES (%s, %s)", (1, "a"))
        with db.connect() as conn:          # a pymysql connection, autocommit
            ...
        BinLogStreamReader(db.connection_settings(), server_id=100, is_mariadb=True, ...)
        db.restart({"binlog-row-metadata": "MINIMAL"})

The data directory, socket and PID file live in a fresh ``/dev/shm/splitflow-mariadb-*``
directory (tmpfs: on this machine's disk ``mariadb-install-db`` alone takes 0.6 to 3 s),
linked from ``<directory>/mariadb`` and removed by :meth:`MariaDB.stop` or by the watchdog.
With ``tmpfs=False`` (or no ``/dev/shm``) they live in ``<directory>/mariadb`` when the
``mysql`` user can reach it, else in a fresh ``/tmp/splitflow-mariadb-*`` (pytest's
``/tmp/pytest-of-root`` is mode 0700). The server log is always ``<directory>/mariadb.log``.
What both test servers share (directories, port retries, the watchdog, stopping) is
:mod:`splitflow.testing.dbserver`'s.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import suppress
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import quote

from splitflow.testing.dbserver import LoopbackServer, as_root
from splitflow.testing.dbserver import free_port as free_port  # the tests' import

USER = "splitflow"
PASSWORD = "s3cret-pw"
DATABASE = "splitflow"
SERVER_ID = 1

#: What the ``splitflow`` user may do on every database: read tables (snapshot chunks),
#: ``FLUSH TABLES``/``LOCK TABLES`` and read the binlog (``REPLICATION SLAVE``: the dump
#: protocol; ``BINLOG MONITOR``, formerly ``REPLICATION CLIENT``: ``SHOW MASTER STATUS``,
#: ``SHOW BINARY LOGS``).
CDC_PRIVILEGES = (
    "SELECT, RELOAD, SHOW DATABASES, SHOW VIEW, LOCK TABLES, REPLICATION SLAVE, BINLOG MONITOR"
)

#: Options every server starts with (``--name=value``; a None value is a bare ``--name``).
#: ``port``, the socket, PID file and data directory are added per start.
BASE_OPTIONS: dict[str, str | None] = {
    "bind-address": "127.0.0.1",
    "skip-name-resolve": None,
    "log-bin": "binlog",  # <data>/binlog.000001, ...
    "binlog-format": "ROW",
    "binlog-row-image": "FULL",
    "binlog-row-metadata": "FULL",  # without it row events carry no column names
    "server-id": str(SERVER_ID),
    "gtid-domain-id": "0",
    "gtid-strict-mode": "ON",
    "character-set-server": "utf8mb4",
    "collation-server": "utf8mb4_general_ci",
    "innodb-log-file-size": "32M",  # the default 96M makes mariadb-install-db take 2 s
    "innodb-buffer-pool-size": "128M",
    "innodb-flush-log-at-trx-commit": "2",
    "innodb-doublewrite": "OFF",
    "sync-binlog": "0",
    "performance-schema": "OFF",
    "max-connections": "100",
}

# Options mariadb-install-db must share with the server (the InnoDB files it creates).
_INSTALL_OPTIONS = ("innodb-log-file-size",)


def mariadb_binaries() -> tuple[str, str] | None:
    """The paths of ``mariadbd`` and ``mariadb-install-db``, or None when not installed."""
    server = shutil.which("mariadbd") or shutil.which("mariadbd", path="/usr/sbin:/usr/bin")
    install = shutil.which("mariadb-install-db", path="/usr/bin:/usr/sbin:/usr/local/bin")
    return (server, install) if server and install else None


def _option_args(options: Mapping[str, str | None]) -> list[str]:
    return [f"--{key}" if value is None else f"--{key}={value}" for key, value in options.items()]


class Secret(str):
    """A password that shows as ``'***'`` in reprs (a dict of connection settings in a
    traceback, pytest's argument dumps), and is the password everywhere else."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "'***'"


def _quote_string(value: str) -> str:
    """A MariaDB string literal (``NO_BACKSLASH_ESCAPES`` is off by default)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _quote_name(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class MariaDB(LoopbackServer):
    """One MariaDB server on ``127.0.0.1:port``; stop it with :meth:`stop`.

    Create it with :meth:`start`. ``host``/``port``, :meth:`connection_settings` and
    :meth:`url` describe the TCP endpoint; :meth:`connect` and :meth:`execute` use it as the
    ``splitflow`` user (``admin=True``: as ``root`` through the Unix socket).
    """

    product = "MariaDB"
    package = "mariadb-server"
    system_user = "mysql"
    base_name = "mariadb"
    log_name = "mariadb.log"
    port_taken: ClassVar[tuple[str, ...]] = (
        "Address already in use",
        "Do you already have another",
    )

    def __init__(
        self, binaries: tuple[str, str], directory: Path, base: Path, owns_base: bool
    ) -> None:
        super().__init__(directory, base, owns_base)
        self.mariadbd, self.install_db = binaries
        self.data = base / "data"
        self.socket = base / "mariadbd.sock"
        self.pid_file = base / "mariadbd.pid"
        self.server_id = SERVER_ID
        self.options: dict[str, str | None] = {}
        self._process: subprocess.Popen[bytes] | None = None

    # -- lifecycle ------------------------------------------------------------------------

    @classmethod
    def installed(cls) -> bool:
        return mariadb_binaries() is not None

    @classmethod
    def start(
        cls,
        directory: Path,
        options: Mapping[str, str | None] | None = None,
        timeout: float = 60.0,
        *,
        tmpfs: bool = True,
    ) -> MariaDB:
        """Install a fresh data directory, start the server with :data:`BASE_OPTIONS` and
        ``options`` on top, create the ``splitflow`` user and database; return the server.

        With ``tmpfs`` (the default) the data directory is made in ``/dev/shm`` when it is
        writable (see the module's docstring). Takes 0.6 to 0.8 s; raises RuntimeError with
        the log's tail on failure.
        """
        binaries = mariadb_binaries()
        if binaries is None:
            raise RuntimeError("no MariaDB server (mariadbd, mariadb-install-db) on PATH")
        directories = cls._new_directories(directory, tmpfs)
        with cls(binaries, *directories)._stop_on_failure() as server:
            server._install_db(dict(options or {}), timeout)
            server._start(dict(options or {}), timeout, new_port=True)
            server._create_user_and_database()
        return server

    def _user_args(self) -> list[str]:
        return [f"--user={self.system_user}"] if as_root() else []

    def _install_db(self, options: dict[str, str | None], timeout: float) -> None:
        merged = {**BASE_OPTIONS, **options}
        shared = {key: merged[key] for key in _INSTALL_OPTIONS if key in merged}
        args = [
            self.install_db,
            "--no-defaults",
            f"--datadir={self.data}",
            *self._user_args(),
            "--auth-root-authentication-method=normal",  # root without a password
            "--skip-test-db",
            "--skip-name-resolve",
            *_option_args(shared),
        ]
        result = self._run(args, timeout)
        if result.returncode != 0:
            raise RuntimeError(
                f"mariadb-install-db failed ({result.returncode}):\n{self.log_tail()}"
            )

    def _start(self, extra: dict[str, str | None], timeout: float, new_port: bool) -> None:
        """Start ``mariadbd`` and wait until its socket answers; on a port collision, retry
        on another free port."""

        def launch() -> str | None:
            self.options = {**BASE_OPTIONS, **extra}
            args = [
                self.mariadbd,
                "--no-defaults",
                *self._user_args(),
                f"--datadir={self.data}",
                f"--socket={self.socket}",
                f"--pid-file={self.pid_file}",
                f"--port={self.port}",
                *_option_args(self.options),
            ]
            # The server logs to stderr, into our log file, which we open: the server user
            # need not be able to reach ``directory``.
            with open(self.log, "ab") as out:
                self._process = subprocess.Popen(
                    args,
                    stdout=out,
                    stderr=out,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            self._start_watchdog()  # it does not fork: the PID is the server's
            if self._wait_ready(timeout):
                return None
            self._kill()
            return ""

        self._start_on_free_port(launch, new_port)

    def _wait_ready(self, timeout: float) -> bool:
        """True once the server answers on its socket; False if it exited or timed out."""
        import pymysql

        assert self._process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                return False
            if self.socket.exists():
                with suppress(pymysql.err.OperationalError):
                    pymysql.connect(unix_socket=str(self.socket), user="root").close()
                    return True
            time.sleep(0.02)
        return False

    def _create_user_and_database(self) -> None:
        """Make the ``splitflow`` user and database, and limit ``root`` to the socket, all
        without writing to the binlog (so the first test transaction is GTID ``0-1-1``)."""
        with contextlib.closing(self._connect_admin(None)) as conn, conn.cursor() as cur:
            cur.execute("SET SESSION sql_log_bin = 0")
            cur.execute("SELECT host FROM mysql.user WHERE user = 'root' AND host <> 'localhost'")
            for (host,) in cur.fetchall():
                cur.execute(f"DROP USER 'root'@{_quote_string(host)}")
            cur.execute(f"CREATE DATABASE {_quote_name(DATABASE)}")
            cur.execute(f"CREATE USER {_quote_string(USER)}@'%%' IDENTIFIED BY %s", (PASSWORD,))
            cur.execute(f"GRANT {CDC_PRIVILEGES} ON *.* TO {_quote_string(USER)}@'%'")
            cur.execute(f"GRANT ALL ON {_quote_name(DATABASE)}.* TO {_quote_string(USER)}@'%'")

    def restart(
        self,
        extra_options: Mapping[str, str | None] | None = None,
        timeout: float = 60.0,
        *,
        crash: bool = False,
    ) -> None:
        """Stop and start again on the same port, with ``extra_options`` on top of
        :data:`BASE_OPTIONS` (they replace any earlier extras; None: the base options).

        ``crash=False`` shuts down cleanly (SIGTERM, which waits for InnoDB); ``crash=True``
        kills the server (SIGKILL), so it starts with crash recovery of InnoDB and the
        binlog. Either way the server opens a new binlog file.
        """
        self._close_clients()
        if crash:
            self._kill()
        else:
            self._terminate(timeout)
        self._start(dict(extra_options or {}), timeout, new_port=False)

    def _terminate(self, timeout: float) -> None:
        process = self._process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._kill()

    def _kill(self) -> None:
        process = self._process
        if process is not None and process.poll() is None:
            with suppress(ProcessLookupError):
                process.kill()
            with suppress(subprocess.TimeoutExpired):
                process.wait(10)

    def _halt(self) -> None:
        """Kill the server (SIGKILL: it is thrown away)."""
        self._kill()
        self._process = None

    def address(self) -> str:
        return f"{self.host}:{self.port} user {USER} database {DATABASE}; socket {self.socket}"

    # -- clients --------------------------------------------------------------------------

    def connection_settings(
        self, user: str = USER, password: str = PASSWORD, database: str | None = DATABASE
    ) -> dict[str, Any]:
        """Keyword arguments for ``pymysql.connect`` over TCP to ``127.0.0.1:port``; also
        what ``BinLogStreamReader(connection_settings=...)`` takes (pass ``database=None``
        there). A fresh dict each call (the reader modifies the one it gets). The password
        is a :class:`Secret`: printing the dict shows ``'***'``."""
        settings: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "user": user,
            "password": Secret(password),
            "charset": "utf8mb4",
        }
        if database is not None:
            settings["database"] = database
        return settings

    def url(self, user: str = USER, password: str = PASSWORD, database: str = DATABASE) -> str:
        """``mysql://user:password@127.0.0.1:port/database`` (e.g. for connectorx)."""
        auth = f"{quote(user, safe='')}:{quote(password, safe='')}"
        return f"mysql://{auth}@{self.host}:{self.port}/{quote(database, safe='')}"

    def connect(
        self,
        user: str = USER,
        password: str = PASSWORD,
        database: str | None = DATABASE,
        **kwargs: Any,
    ) -> Any:
        """A new ``pymysql.Connection`` (autocommit unless ``autocommit=False`` is given);
        other ``kwargs`` go to ``pymysql.connect`` (``cursorclass=pymysql.cursors.SSCursor``
        to stream a large result)."""
        import pymysql

        kwargs.setdefault("autocommit", True)
        return pymysql.connect(**self.connection_settings(user, password, database), **kwargs)

    def _connect_admin(self, database: str | None) -> Any:
        import pymysql

        return pymysql.connect(
            unix_socket=str(self.socket),
            user="root",
            database=database,
            charset="utf8mb4",
            autocommit=True,
        )

    def execute(
        self,
        sql: str,
        params: Any = None,
        *,
        database: str | None = DATABASE,
        admin: bool = False,
    ) -> list[tuple[Any, ...]]:
        """Run one statement (autocommit) as ``splitflow``, or as ``root`` through the
        socket with ``admin=True``; return its rows ([] if none). ``params`` are
        ``pymysql``'s (``%s`` placeholders).

        Reuses one connection per (database, admin) until :meth:`restart` or :meth:`stop`.
        """
        key = (database, admin)
        conn = self._clients.get(key)
        if conn is None or not conn.open:
            conn = self._clients[key] = (
                self._connect_admin(database) if admin else self.connect(database=database)
            )
        with conn.cursor() as cursor:
            cursor.execute(sql, params)
            return list(cursor.fetchall()) if cursor.description is not None else []

    def create_database(self, name: str) -> dict[str, Any]:
        """Create database ``name`` with every privilege on it for ``splitflow``; return its
        :meth:`connection_settings`."""
        self.execute(f"CREATE DATABASE {_quote_name(name)}", admin=True, database=None)
        self.execute(
            f"GRANT ALL ON {_quote_name(name)}.* TO {_quote_string(USER)}@'%'",
            admin=True,
            database=None,
        )
        return self.connection_settings(database=name)


running_mariadb = MariaDB.start
"""``with running_mariadb(directory) as server``: a server is its own context manager."""


def mariadb_fixture(tmp_path_factory: Any) -> Iterator[MariaDB]:
    """Body of a session-scoped ``mariadb`` fixture (skips when MariaDB or PyMySQL is
    missing)."""
    import pytest

    pytest.importorskip("pymysql", reason="pip install -e '.[mysql]'")
    yield from MariaDB.session_fixture(tmp_path_factory)


if __name__ == "__main__":  # python -m tests.support.mariadb: start one, print how to reach it
    MariaDB.main()
