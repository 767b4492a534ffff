"""What the throw-away database servers of the tests share: :class:`LoopbackServer`.

:mod:`splitflow.testing.postgres` and :mod:`tests.support.mariadb` each start a server from its
Debian package on ``127.0.0.1`` at a free port, for one test session or one benchmark. Both
refuse to run as root, so as root the server runs as its package's system user
(:attr:`LoopbackServer.system_user`). Both keep their data directory in a ``base``
directory that user can reach, and both leave nothing behind: :meth:`LoopbackServer.stop`
stops the server and removes a base made outside ``directory``, and a watchdog process
does the same when the process that started the server dies without calling it (a test
run killed by a timeout).

A server class implements the start of its server (:meth:`LoopbackServer.start`, on top of
:meth:`~LoopbackServer._new_directories`, :meth:`~LoopbackServer._start_on_free_port` and
:meth:`~LoopbackServer._stop_on_failure`) and :meth:`~LoopbackServer._halt`; the rest is
here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, Self

# Run by the watchdog process: argv = owner PID, the server's PID file, the signal to stop
# it with, the directory to remove (or ""). SIGKILL follows 10 s after a gentler signal.
_WATCHDOG = """
import os, shutil, signal, sys, time
owner, pidfile, first, base = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
def server():
    try:
        with open(pidfile) as f:
            return int(f.readline())
    except (OSError, ValueError):
        return None
while alive(owner):
    time.sleep(0.5)
pid = server()
if pid is not None and alive(pid):
    os.kill(pid, first)
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(pid):
        os.kill(pid, signal.SIGKILL)
if base:
    shutil.rmtree(base, ignore_errors=True)
"""


def free_port() -> int:
    """A TCP port on ``127.0.0.1`` that nothing listens on now (it may be taken by the time
    it is used: a server start retries on another)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def as_root() -> bool:
    return os.geteuid() == 0


class LoopbackServer(ABC):
    """One throw-away server on ``127.0.0.1:port``: its directories, log, watchdog and
    clients; stop it with :meth:`stop` (or use it as a context manager).

    ``directory`` is the caller's and holds the log; ``base`` holds the data directory (and
    whatever else the server writes) and belongs to :attr:`system_user` when we are root.
    """

    product: ClassVar[str]
    """The server's name in messages: ``PostgreSQL``, ``MariaDB``."""
    package: ClassVar[str]
    """The Debian package that installs the server (named when it is missing)."""
    system_user: ClassVar[str]
    """The user the server runs as when the tests run as root."""
    base_name: ClassVar[str]
    """``<directory>/<base_name>`` is (or links to) the base directory."""
    log_name: ClassVar[str]
    """``<directory>/<log_name>`` is the server's log."""
    port_taken: ClassVar[tuple[str, ...]]
    """What the log says when the port was taken: the start is retried on another one."""
    stop_signal: ClassVar[int] = signal.SIGKILL
    """What the watchdog stops an orphaned server with (SIGKILL 10 s later if it lives)."""

    pid_file: Path
    """The file the server writes its PID to (read by the watchdog)."""

    def __init__(self, directory: Path, base: Path, owns_base: bool) -> None:
        self.directory = directory
        self.base = base
        self.log = directory / self.log_name
        self.host = "127.0.0.1"
        self.port = 0
        self._owns_base = owns_base
        self._clients: dict[Any, Any] = {}
        self._watchdog: subprocess.Popen[bytes] | None = None

    # -- what a server class implements ---------------------------------------------------

    @classmethod
    @abstractmethod
    def installed(cls) -> bool:
        """Whether the server's binaries are on this machine."""

    @classmethod
    @abstractmethod
    def start(cls, directory: Path) -> Self:
        """Make a fresh server under ``directory``, start it and return it."""

    @abstractmethod
    def _halt(self) -> None:
        """Stop the server now: it is thrown away."""

    @abstractmethod
    def execute(self, sql: Any, params: Any = None) -> list[tuple[Any, ...]]:
        """Run one statement (autocommit, ``%s`` placeholders) as the tests' user; return
        its rows ([] if none). Reuses one connection until a restart or the stop."""

    def address(self) -> str:
        """How to reach the server, printed by :meth:`main`."""
        return f"{self.host}:{self.port}"

    # -- starting -------------------------------------------------------------------------

    @classmethod
    def _check_system_user(cls) -> None:
        if not as_root():
            return
        import pwd

        try:
            pwd.getpwnam(cls.system_user)
        except KeyError:
            raise RuntimeError(
                f"as root the server runs as the {cls.system_user!r} user, which does not"
                f" exist (apt install {cls.package} creates it)"
            ) from None

    @classmethod
    def _new_directories(cls, directory: Path, tmpfs: bool = False) -> tuple[Path, Path, bool]:
        """``directory`` (made if need be), the base directory and whether the server owns
        it (it is outside ``directory``, and :meth:`stop` removes it).

        With ``tmpfs`` the base is a fresh ``/dev/shm/splitflow-<base_name>-*`` when
        ``/dev/shm`` is writable. Otherwise it is ``<directory>/<base_name>`` when the
        server's user can reach ``directory``, else (as root under pytest's
        ``/tmp/pytest-of-root``, mode 0700) a fresh ``/tmp/splitflow-<base_name>-*``; a base
        made elsewhere is linked from ``<directory>/<base_name>``.
        """
        cls._check_system_user()
        directory = Path(directory).resolve()
        directory.mkdir(parents=True, exist_ok=True)
        inside = directory / cls.base_name
        prefix = f"splitflow-{cls.base_name}-"
        shm = Path("/dev/shm")
        if tmpfs and shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
            base, owns = Path(tempfile.mkdtemp(prefix=prefix, dir=shm)), True
        elif not as_root():
            base, owns = inside, False
        else:
            probe = ["test", "-w", str(directory), "-a", "-x", str(directory)]
            reachable = subprocess.run(cls._as_server_user(probe), check=False).returncode == 0
            if reachable:
                base, owns = inside, False
            else:
                base, owns = Path(tempfile.mkdtemp(prefix=prefix)), True
        if owns:
            inside.symlink_to(base)
        else:
            base.mkdir()
        cls._give_to_server_user(base)
        return directory, base, owns

    @classmethod
    def _give_to_server_user(cls, path: Path) -> None:
        """Make :attr:`system_user` own ``path`` when we are root."""
        if as_root():
            shutil.chown(path, cls.system_user, cls.system_user)

    @classmethod
    def _as_server_user(cls, args: list[str]) -> list[str]:
        """``args`` as :attr:`system_user` when we are root."""
        return ["runuser", "-u", cls.system_user, "--", *args] if as_root() else args

    def _run(self, args: list[str], timeout: float) -> subprocess.CompletedProcess[bytes]:
        """Run a command to its end, its output appended to the log (which we open: the
        server's user need not be able to reach ``directory``)."""
        with open(self.log, "ab") as out:
            return subprocess.run(
                args,
                stdout=out,
                stderr=out,
                stdin=subprocess.DEVNULL,
                timeout=timeout,
                check=False,
            )

    @contextmanager
    def _stop_on_failure(self) -> Iterator[Self]:
        """Around the steps of :meth:`start`: on any failure the server is stopped (and its
        base removed) before the error goes on."""
        try:
            yield self
        except BaseException:
            self.stop()
            raise

    def _start_on_free_port(self, launch: Callable[[], str | None], new_port: bool) -> None:
        """Start the server with ``launch`` on :attr:`port` (a free one first when
        ``new_port``); when the log says the port was taken, again on another free port.

        ``launch`` returns None once the server answers, else what failed (``" (1)"``),
        having stopped what it started. Raises RuntimeError with the log of the attempt.
        """
        for attempt in range(10):
            if new_port or attempt > 0:
                self.port = free_port()
            mark = self.log.stat().st_size if self.log.exists() else 0
            failure = launch()
            if failure is None:
                self._start_watchdog()
                return
            with open(self.log, "rb") as f:
                f.seek(mark)
                output = f.read().decode(errors="replace")
            if any(text in output for text in self.port_taken):
                continue
            raise RuntimeError(f"{self.product} did not start{failure}:\n{output[-4000:]}")
        raise RuntimeError(f"{self.product} found no free port:\n{self.log_tail()}")

    def _start_watchdog(self) -> None:
        """A process that stops the server if this process dies without :meth:`stop`, so no
        server outlives its owner."""
        if self._watchdog is not None and self._watchdog.poll() is None:
            return
        self._watchdog = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _WATCHDOG,
                str(os.getpid()),
                str(self.pid_file),
                str(int(self.stop_signal)),
                str(self.base) if self._owns_base else "",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    # -- stopping -------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop the server now (:meth:`_halt`) and remove a base made outside
        ``directory``."""
        self._close_clients()
        if self._watchdog is not None:
            self._watchdog.kill()
            self._watchdog.wait(10)
            self._watchdog = None
        self._halt()
        if self._owns_base:
            shutil.rmtree(self.base, ignore_errors=True)
            self._owns_base = False

    def _close_clients(self) -> None:
        """Close the connections :meth:`execute` keeps (before a restart or the stop)."""
        for conn in self._clients.values():
            with contextlib.suppress(Exception):
                conn.close()
        self._clients = {}

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # -- for tests and by hand ------------------------------------------------------------

    @classmethod
    def session_fixture(cls, tmp_path_factory: Any) -> Iterator[Self]:
        """Body of a session-scoped fixture: a server in a fresh temporary directory,
        stopped after the session; skips when the server is not installed."""
        import pytest

        if not cls.installed():
            pytest.skip(f"no {cls.product} server installed (apt install {cls.package})")
        with cls.start(tmp_path_factory.mktemp(cls.base_name)) as server:
            yield server

    @classmethod
    def main(cls) -> None:
        """Start one, print how to reach it, stop it at the end of standard input."""
        directory = Path(tempfile.mkdtemp(prefix=f"splitflow-{cls.base_name}-run-"))
        with cls.start(directory) as server:
            print(server.address(), flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                sys.stdin.read()
