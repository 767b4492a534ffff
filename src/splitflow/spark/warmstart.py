"""Streaming source runners and Python worker daemons forked from a warm process instead of
started cold.

For every streaming query, Spark starts a new ``python -m
pyspark.sql.streaming.python_streaming_source_runner`` on the driver and waits for it before
the first trigger. That interpreter imports pyspark from ``pyspark.zip`` (first on its
``PYTHONPATH``, with no bytecode inside, so every module is compiled from source), pandas,
pyarrow and the connector: about a second of CPU per query start, against 0.07 s for the
start of Spark's own file source (``bench/fixed_costs.py``). The first query of an
application also starts a Python worker daemon (``python -m pyspark.daemon MODULE``) for
each kind of Python process it needs: one to create the data source (``load()``), one to
plan its read, one for the tasks that read. Each compiles pyspark from ``pyspark.zip``
too, and each worker it forks imports pyarrow and the connector anew
(``bench/first_query.py``).

:func:`splitflow.spark.register` starts one *warm process* per driver process: it imports
all of that once, then waits on a private Unix socket. The splitflow data sources are
registered with two environment variables for their Python processes: ``PYTHONPATH`` gets
a directory holding a ``sitecustomize`` module, and :data:`SOCKET_ENV` names the socket.
When Spark starts a runner or a daemon for one of them on a machine where the socket is
(the driver's: local mode, or a cluster's worker on the same machine), that
``sitecustomize`` (which Python runs before the module) hands the process's standard
streams, arguments, environment, working directory and ``sys.path`` to the warm process,
which forks a child that runs the module with them; a daemon's workers are forked from that
child, with everything imported. The started process stays as the child's stand-in for
Spark: it passes on the signals Spark sends it (stopping a query, a daemon) and exits with
the child's status, and the warm process kills the child when the stand-in ends (killed,
say). A process that finds the warm process still importing waits for it, up to
:data:`~splitflow.spark._warmsite.sitecustomize.WAIT` seconds (a runner 5, a daemon 30),
then starts cold and says so on its standard error.
Any other Python process goes on as usual, as do a runner or daemon when the warm process
is not there (another machine) or not ready: they start cold, as without this module. The
next ``sitecustomize`` on the path (the environment's own) runs in every process that does
not hand over.

Linux only (it forks a process that imported pyarrow and numpy; see :data:`_ONE_THREAD`).
``SPLITFLOW_WARM_START=0`` in the driver's environment turns it off.
"""

from __future__ import annotations

import atexit
import faulthandler
import fcntl
import functools
import logging
import marshal
import os
import select
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import zipimport
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any

from splitflow.spark._warmsite.sitecustomize import HANDED, PID_FILE, SOCKET_ENV, alive

log = logging.getLogger("splitflow.spark")

SWITCH_ENV = "SPLITFLOW_WARM_START"
SITE_DIR = str(Path(__file__).with_name("_warmsite"))
"""The directory of the ``sitecustomize`` that hands a process over to the warm process."""
_PREFIX = "splitflow-warm-"
"""Of the warm processes' directories, in the temporary directory."""
_SOCKET = "runner.sock"
"""The warm process's socket, in its private directory."""
_HEADER = struct.Struct("!I")
_WORKERS = (
    "pyspark.worker",
    "pyspark.sql.worker.create_data_source",
    "pyspark.sql.worker.plan_data_source_read",
    "encodings.idna",  # the codec of the host name a runner connects to the JVM with
)
"""What the daemons of a Python data source run in the workers they fork (besides its own
module), and what those and the runner import on their way: imported by the warm process,
so no child imports them."""
_SEED = "PYTHONHASHSEED"
"""Read by Python only when it starts: the processes Spark starts get the driver's, or "0"
(pyspark's ``SparkContext`` puts it in their environment), and so does the warm process,
whose children hash strings as it does."""
_READY_WITHIN = 60.0
"""Seconds a warm process may take to import before the next ``start()`` replaces it (it
takes one to two)."""
_CANNOT_FORK = 3
"""The warm process's exit code when an import left it with threads (it says so)."""
_ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "JE_ARROW_MALLOC_CONF": "background_thread:false"}
"""The warm process's environment besides the driver's: numpy's OpenBLAS and pyarrow's
jemalloc start no thread of their own, so that the process that forks is single-threaded
(why Spark's worker daemon imports neither before it forks), and so are the daemons it
forks, which fork workers in turn."""


class WarmStart:
    """The driver's warm process (started by :meth:`start`, stopped with the driver)."""

    _current: WarmStart | None = None
    _detached = False  # asked for once: a replacement runs in a session of its own too

    def __init__(
        self, process: subprocess.Popen[bytes], directory: str, said: IO[bytes] | None = None
    ) -> None:
        self.process = process
        self.directory = directory
        self.said = said
        """The file the process writes why it stopped serving to (its stdout)."""
        self.socket_path = os.path.join(directory, _SOCKET)
        self.started = time.monotonic()

    @classmethod
    def start(cls, detached: bool = False) -> WarmStart | None:
        """The driver's warm process, started on the first call, and again in the same
        directory when it ended, stopped serving or did not get ready in
        :data:`_READY_WITHIN` seconds, so that the data sources registered with the one
        before find it (None: turned off or not supported here); ``detached``: one started
        from now on runs in a session of its own (see :meth:`launch`)."""
        cls._detached = cls._detached or detached
        current = cls._current
        if current is not None:
            alive = current.process.poll() is None
            importing = (
                alive
                and os.path.isdir(current.directory)
                and time.monotonic() - current.started < _READY_WITHIN
            )
            if importing or current.ready():
                return current
            if current.process.returncode == _CANNOT_FORK:
                return None  # said why; another would too
            log.warning(
                "splitflow: the warm process (pid %d) %s: starting another%s",
                current.process.pid,
                "does not serve" if alive else f"ended with exit code {current.process.returncode}",
                current.what_it_said(),
            )
            current.process.kill()
            current.process.wait()
        if os.environ.get(SWITCH_ENV, "1") == "0" or not sys.platform.startswith("linux"):
            return None
        directory = ""
        try:
            directory = _private_directory(current.directory if current else None)
            cls._current = cls.launch(directory, cls._detached)
        except OSError as exc:  # no writable temporary directory, no interpreter to run
            log.warning("splitflow: streaming source runners start cold (no warm start): %s", exc)
            if directory:
                shutil.rmtree(directory, ignore_errors=True)
            cls._current = None
            return None
        return cls._current

    @classmethod
    def launch(cls, directory: str, detached: bool = False) -> WarmStart:
        """A warm process serving on a socket in ``directory`` (private to this user); in the
        driver's process group, as the JVM that pyspark launches is, so that a signal to
        the group reaches the processes it forks as it reaches those the JVM starts cold;
        ``detached``: in a session of its own, for a JVM launched in one."""
        with suppress(FileNotFoundError):  # one that ended left it: nobody answers there
            os.unlink(os.path.join(directory, _SOCKET))
        said = tempfile.TemporaryFile(prefix=_PREFIX)  # noqa: SIM115 (kept: read later)
        process = subprocess.Popen(
            [sys.executable, "-m", __name__, directory],
            env={**os.environ, **_ONE_THREAD, _SEED: os.environ.get(_SEED, "0")},
            stdin=subprocess.PIPE,  # its end of the pipe closes when the driver exits
            stdout=said,
            close_fds=True,
            start_new_session=detached,
        )
        with suppress(OSError):  # gone already: the processes it would serve start cold
            Path(directory, PID_FILE).write_text(str(process.pid))
        return cls(process, directory, said)

    def ready(self, timeout: float = 0.0) -> bool:
        """Whether it serves runners (waiting up to ``timeout`` seconds for its imports)."""
        deadline = time.monotonic() + timeout
        while self.process.poll() is None:
            if os.path.exists(self.socket_path):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return False

    def what_it_said(self) -> str:
        """Why it stopped serving and, when it is still alive, where it is (its Python
        stack, asked for with SIGUSR1): for the warning that replaces it."""
        if self.said is None:
            return ""
        if self.process.poll() is None:
            size = os.fstat(self.said.fileno()).st_size
            with suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGUSR1)
                deadline = time.monotonic() + 1.0
                while os.fstat(self.said.fileno()).st_size == size:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.02)
        self.said.seek(0)
        text = self.said.read()[-4000:].decode(errors="replace").strip()
        return f"; it said:\n{text}" if text else ""


def _private_directory(before: str | None) -> str:
    """``before`` if it is, or can be made again, a directory of this user's that no one
    else may use; else a new one."""
    if before is not None:
        with suppress(FileExistsError):
            os.mkdir(before, 0o700)  # the warm process that ended removed it
        with suppress(OSError):
            found = os.lstat(before)
            if (
                stat.S_ISDIR(found.st_mode)
                and found.st_uid == os.getuid()
                and stat.S_IMODE(found.st_mode) == 0o700
            ):
                return before
    _remove_left_behind()
    return tempfile.mkdtemp(prefix=_PREFIX)  # private: mode 0700


def _remove_left_behind() -> None:
    """Remove this user's warm process directories whose process is gone without removing
    its own (killed with its driver's process group, say): the process in its pid file is
    not alive and nothing answers on its socket (a process of another pid namespace
    sharing the temporary directory would)."""
    root = tempfile.gettempdir()
    with suppress(OSError):
        for entry in os.scandir(root):
            if not entry.name.startswith(_PREFIX):
                continue
            with suppress(OSError, ValueError):
                if entry.stat(follow_symlinks=False).st_uid != os.getuid() or not entry.is_dir(
                    follow_symlinks=False
                ):
                    continue
                pid = int(Path(entry.path, PID_FILE).read_text())
                if alive(pid) or _answers(os.path.join(entry.path, _SOCKET)):
                    continue
                shutil.rmtree(entry.path, ignore_errors=True)


def _answers(socket_path: str) -> bool:
    """Whether a warm process listens on ``socket_path`` (it takes the empty connection
    for what it is)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(socket_path)
        except OSError:  # no socket, or nobody listening on it
            return False
    return True


@contextmanager
def registering(spark: Any) -> Iterator[None]:
    """Data sources registered with ``spark`` in this block hand their runners to the warm
    process (started now if it is not running): the variables go into the context's
    ``environment`` (what a data source registered keeps for its Python processes), and in
    local mode the :func:`launcher` into its ``pythonExec`` (which it keeps too), both back
    as they were after the block. With Spark Connect (no context here: the server starts the
    runners) or warm start off, the block registers them as they are."""
    try:
        sc = spark.sparkContext
    except Exception:  # Spark Connect
        sc = None
    warm = WarmStart.start() if sc is not None else None
    if warm is None:
        yield
        return
    with _REGISTERING:  # one block at a time: each restores what it found
        before = dict(sc.environment)
        python = sc.pythonExec
        sc.environment.update(_variables(warm, before))
        if sc.master.startswith("local"):  # every process it starts is on this machine
            sc.pythonExec = launcher(_LAUNCHED.get(python, python), sc.environment)
        try:
            yield
        finally:
            sc.environment.clear()
            sc.environment.update(before)
            sc.pythonExec = python


@contextmanager
def starting_spark(detached: bool = False) -> Iterator[None]:
    """Spark started in this block hands every runner and worker daemon it starts on this
    machine to the warm process (started now if it is not running), for any Python code:
    the variables are in the driver's environment (which the JVM that pyspark launches
    inherits, and every process it starts) during the block, and back as they were after
    it. That includes the daemon Spark starts at the first use of a Python data source to
    look up installed ones, whose environment is the JVM's own. Other threads of the driver
    that start processes in the block hand them over too. ``detached``: for a JVM launched
    in a session of its own, a warm process started from now on runs in one too."""
    warm = WarmStart.start(detached)
    if warm is None:
        yield
        return
    before = {name: os.environ.get(name) for name in (SOCKET_ENV, "PYTHONPATH")}
    os.environ.update(_variables(warm, os.environ))
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


_LAUNCHER = """#!{interpreter} -E
# splitflow's launcher of {python!r} for Spark (splitflow.spark.warmstart.launcher)
import sys
with open({script!r}) as file:
    code = compile(file.read(), {script!r}, "exec")
stand_in = {{"__name__": "splitflow_stand_in"}}
exec(code, stand_in)
stand_in["launch"]({python!r}, sys.argv[1:])
"""
_LAUNCH_PREFIX = "splitflow-launch-"
"""Of the launchers' directories, in the temporary directory."""
_LOCK = "lock"
"""A launchers' directory's lock file: locked by its driver as long as it lives."""
_LOCKED_WITHIN = 60.0
"""Seconds within which a launchers' directory just made is locked (left alone till then)."""
_LAUNCHERS: dict[str, str] = {}
"""What Spark starts for each Python (by ``pythonExec``): its launcher, or the Python itself
when it has none."""
_LAUNCHED: dict[str, str] = {}
"""The Python of each launcher."""
_REGISTERING = threading.RLock()
_HELD: list[int] = []
"""The lock this driver holds on its launchers' directory (a file descriptor)."""


def launcher(python: str, environment: Mapping[str, str] | None = None) -> str:
    """An executable Spark can start instead of ``python`` (a data source's ``pythonExec``)
    that hands a streaming source runner or worker daemon over to the warm process without
    what every Python process Spark starts spends first: reading the directories of the
    archives Spark puts ahead of the standard library on its ``PYTHONPATH`` (``pyspark.zip``,
    py4j's, the 16 MB jar Spark runs from), about 30 ms of CPU before a ``sitecustomize``
    could run.

    A script for ``python -E`` (which ignores ``PYTHONPATH``): the kernel starts it, with
    Spark's arguments and environment as they are, on the stand-in
    (:func:`~splitflow.spark._warmsite.sitecustomize.launch`), which asks the warm process
    for what ``python`` started by Spark would have run, or becomes that process. Written
    once per driver process and Python, in a private directory that lives as long as the
    driver (another driver removes it once it is gone), and tried once, with the variables
    ``environment`` adds (Spark's for the sources). ``python`` itself when it cannot be
    written or run there (a temporary directory mounted ``noexec``, a Python that needs
    ``PYTHONHOME``), or when its path cannot be a script's interpreter (not found, or with
    white space). Only a local session's sources use it (:func:`registering`): a cluster's
    executors elsewhere would not find it."""
    with _REGISTERING:
        found = _LAUNCHERS.get(python)
        if found is None:
            found = _LAUNCHERS[python] = _launcher(python, environment or {})
            _LAUNCHED[found] = python
        return found


def _launcher(python: str, environment: Mapping[str, str]) -> str:
    interpreter = shutil.which(python) or ""
    if (
        not os.path.isabs(interpreter)
        or len(interpreter) > 200
        or interpreter.split() != [interpreter]
    ):
        log.warning(
            "splitflow: Python processes start as Spark starts them: %r cannot be a "
            "script's interpreter",
            python,
        )
        return python
    try:
        path = os.path.join(_launch_directory(), f"python-{len(_LAUNCHERS)}")
        script = os.path.join(SITE_DIR, "sitecustomize.py")
        text = _LAUNCHER.format(interpreter=interpreter, python=python, script=script)
        with open(path + ".new", "w") as file:
            file.write(text)
        os.chmod(path + ".new", 0o700)
        os.rename(path + ".new", path)
        env = {k: v for k, v in {**os.environ, **environment}.items() if k != SOCKET_ENV}
        tried = subprocess.run(
            [path, "-c", "pass"], env=env, capture_output=True, text=True, timeout=60
        )
        if tried.returncode != 0:
            os.unlink(path)
            said = tried.stderr.strip()[-2000:] or f"exit code {tried.returncode}"
            raise OSError(f"{path} did not run: {said}")
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("splitflow: Python processes start as Spark starts them: %s", exc)
        return python
    return path


@functools.cache
def _launch_directory() -> str:
    """This driver's directory of launchers, made on first use: locked (:data:`_LOCK`) as
    long as the driver lives, removed when it exits, or by another driver once it is gone
    (killed, say). Those of other drivers that are gone are removed now."""
    with suppress(OSError):
        for entry in os.scandir(tempfile.gettempdir()):
            if entry.name.startswith(_LAUNCH_PREFIX):
                with suppress(OSError):
                    _remove_if_gone(entry)
    directory = tempfile.mkdtemp(prefix=_LAUNCH_PREFIX)
    fd = os.open(os.path.join(directory, _LOCK), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    _HELD.append(fd)
    atexit.register(_remove_launchers, directory, os.getpid())
    return directory


def _remove_if_gone(entry: os.DirEntry[str]) -> None:
    """Remove another driver's launchers' directory ``entry`` if that driver is gone (its
    lock is free), and it is not one just made (locked a moment after)."""
    found = entry.stat(follow_symlinks=False)
    if (
        not stat.S_ISDIR(found.st_mode)
        or found.st_uid != os.getuid()
        or time.time() - found.st_mtime < _LOCKED_WITHIN
    ):
        return
    fd = os.open(os.path.join(entry.path, _LOCK), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises while its driver lives
        shutil.rmtree(entry.path, ignore_errors=True)
    finally:
        os.close(fd)


def _remove_launchers(directory: str, pid: int) -> None:
    if os.getpid() == pid:  # not in a forked child exiting
        shutil.rmtree(directory, ignore_errors=True)


def _variables(warm: WarmStart, environment: Mapping[str, str]) -> dict[str, str]:
    """What processes started with ``environment`` need to be handed to ``warm``."""
    path = [SITE_DIR, *filter(None, [environment.get("PYTHONPATH")])]  # the site directory first
    return {SOCKET_ENV: warm.socket_path, "PYTHONPATH": os.pathsep.join(path)}


# -- the warm process ---------------------------------------------------------------------------


def _serve(directory: str) -> None:
    """Import what the runners and daemons import, then fork one for each request until the
    driver's end of stdin closes."""
    try:
        if not _warm_up():
            sys.exit(_CANNOT_FORK)
        _accept(os.path.join(directory, _SOCKET))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _warm_up() -> bool:
    """Import what the runners, daemons and workers need; whether this process may fork."""
    for module in (*HANDED, *_WORKERS):
        __import__(module)
    import splitflow.spark

    splitflow.spark.built_in()  # every built-in connector, so no child imports one
    threads = len(os.listdir("/proc/self/task"))
    if threads > 1:  # a fork copies no thread but their locks: all start cold
        log.warning(
            "splitflow: streaming source runners and worker daemons start cold (no warm "
            "start): an import started %d threads in the process that would fork them",
            threads - 1,
        )
    return threads == 1


class _Child:
    """A runner or daemon forked for a stand-in, and how the stand-in is watched."""

    def __init__(self, connection: socket.socket, stand_in: int) -> None:
        self.connection = connection
        self.stand_in = stand_in
        try:
            self.handle: int | None = os.pidfd_open(stand_in)
        except ProcessLookupError:
            self.handle = None  # gone already: the next look finds it so
        except OSError:  # a kernel before 5.3: looked for every half second
            self.handle = None
        self.looked = time.monotonic()
        self.killed = False  # killed since its stand-in ended

    def stand_in_gone(self, readable: list[Any]) -> bool:
        """Whether the stand-in ended (its pidfd readable, or not found when looked for)."""
        if self.handle is not None:
            return self.handle in readable
        now = time.monotonic()
        if now - self.looked < 0.5:
            return False
        self.looked = now
        return not alive(self.stand_in)

    def close(self) -> None:
        self.connection.close()
        if self.handle is not None:
            os.close(self.handle)
            self.handle = None


def _accept(path: str) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with suppress(FileNotFoundError):  # left by a warm process killed before it was ready
        os.unlink(path + ".new")
    listener.bind(path + ".new")
    listener.listen(16)
    os.rename(path + ".new", path)  # ready: a process that finds the socket is served
    children: dict[int, _Child] = {}
    try:
        while True:
            watched = [c for c in children.values() if not c.killed]
            handles = [c.handle for c in watched if c.handle is not None]
            ready, _, _ = select.select([listener, sys.stdin, *handles], [], [], 0.05)
            if sys.stdin in ready and not os.read(sys.stdin.fileno(), 512):
                print("stopped serving: the driver's end of stdin closed", flush=True)
                return  # the driver exited
            if listener in ready:
                try:
                    connection, _ = listener.accept()
                    forked = _fork(connection, listener, children.values())
                    if forked is None:
                        connection.close()
                    else:
                        children[forked[0]] = _Child(connection, forked[1])
                except Exception:
                    log.exception("splitflow: the warm process could not start a process")
                    connection.close()
            for pid, child in children.items():
                if not child.killed and child.stand_in_gone(ready):  # Spark's process killed
                    child.killed = True
                    with suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            _reap(children)
    finally:
        listener.close()
        for child in children.values():
            child.close()


def _reap(children: dict[int, _Child]) -> None:
    """Tell each stand-in whose process exited its exit status."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        child = children.pop(pid, None)
        if child is not None:
            with suppress(OSError):  # the stand-in is gone: nobody waits for the status
                child.connection.sendall(b"%d\n" % os.waitstatus_to_exitcode(status))
            child.close()


class _Archive(zipimport.zipimporter):
    """The importer of a zip archive on the path of the processes the warm process forks
    (Spark puts ``pyspark.zip`` and py4j's first on it), which reads the archive's directory
    again only when the archive changed. A runner and every task's worker call
    ``importlib.invalidate_caches()`` as they start (``setup_spark_files``), which has
    Python's own importer read the whole directory again: about 35 ms of CPU in each."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.read = _stamp(self.archive)

    def invalidate_caches(self) -> None:
        stamp = _stamp(self.archive)
        if stamp != self.read:
            self.read = stamp
            super().invalidate_caches()


def _stamp(path: str) -> tuple[int, int, int] | None:
    with suppress(OSError):
        found = os.stat(path)
        return found.st_ino, found.st_size, found.st_mtime_ns
    return None


_ARCHIVES: dict[str, _Archive] = {}
"""The importers of the archives on the paths of the processes forked so far, by entry."""


def _archives(path: list[str]) -> dict[str, _Archive]:
    """The importers of the zip archives among the entries of ``path``, read here once and
    again when changed, for the child's ``sys.path_importer_cache``."""
    found = {}
    for entry in path:
        archive = _ARCHIVES.get(entry)
        if archive is not None:
            archive.invalidate_caches()
        elif os.path.isfile(entry):
            with suppress(zipimport.ZipImportError):  # not a zip archive: Python's hooks decide
                archive = _ARCHIVES[entry] = _Archive(entry)
        if archive is not None:
            found[entry] = archive
    return found


def _receive(connection: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """A stand-in's request: its streams' descriptors, and what else its process needs
    (None: closed at once, by a driver looking for warm processes that are gone)."""
    header, fds, _, _ = socket.recv_fds(connection, _HEADER.size, 3)
    if not header and not fds:
        return None
    if len(header) != _HEADER.size or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        raise ConnectionError("a request without its header or its three streams")
    (size,) = _HEADER.unpack(header)
    body = b""
    while len(body) < size:
        chunk = connection.recv(size - len(body))
        if not chunk:
            raise ConnectionError("a request ended early")
        body += chunk
    request: dict[str, Any] = marshal.loads(body)
    return request, fds


def _fork(
    connection: socket.socket, listener: socket.socket, children: Iterable[_Child]
) -> tuple[int, int] | None:
    """Fork the process the request on ``connection`` asks for; its pid (sent to the
    stand-in) and the stand-in's, or None when the stand-in runs another Python than this
    one or another ``PYTHONHASHSEED`` (it starts the process itself), or sent nothing. The
    child closes the warm process's ``listener`` and what it holds for its other
    ``children``."""
    received = _receive(connection)
    if received is None:
        return None
    request, fds = received
    seed = request["env"].get(_SEED, "random")
    if (
        request["python"] != [sys.prefix, sys.version]  # PYSPARK_PYTHON is another Python
        or request["module"] not in HANDED
        or seed not in ("random", os.environ.get(_SEED))  # it must hash strings otherwise
    ):
        for fd in fds:  # start it there, cold
            os.close(fd)
        connection.sendall(b"0\n")
        return None
    archives = _archives(request["path"])
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the runner or daemon
        code = 1
        try:
            connection.close()
            listener.close()
            for child in children:
                child.close()
            _become(request, fds, archives)
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
        except BaseException:
            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                with suppress(Exception):
                    stream.flush()
            os._exit(code)
    for fd in fds:
        os.close(fd)
    connection.sendall(b"%d\n" % pid)
    return pid, int(request["pid"])


def _become(request: dict[str, Any], fds: list[int], archives: dict[str, _Archive]) -> None:
    """In the forked child: take the stand-in's streams and settings, run its module
    (``archives``: the importers of the zip archives on its path)."""
    import runpy

    faulthandler.unregister(signal.SIGUSR1)
    faulthandler.disable()  # as in a process started cold
    ignored = request.get("ignored", ())  # by the stand-in, as Spark started it
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_IGN if sig in ignored else signal.SIG_DFL)
    interrupt = signal.SIG_IGN if signal.SIGINT in ignored else signal.default_int_handler
    signal.signal(signal.SIGINT, interrupt)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[:] = request["path"]
    sys.path_importer_cache.update(archives)
    module = request["module"]
    sys.argv[:] = [module, *request["args"]]  # run_module puts the module's file first
    sys.modules.pop(module, None)  # imported to warm up; run anew as __main__
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def main(argv: list[str]) -> None:
    """``python -m splitflow.spark.warmstart DIRECTORY``: the warm process. What it says
    for the driver (why it stopped; its stack on a fatal error or when asked with SIGUSR1)
    goes to its stdout. It ends without the interpreter's shutdown: it has nothing to
    finish, and a process stuck there would be alive without serving."""
    (directory,) = argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver's ^C is the driver's
    faulthandler.enable(sys.stdout)
    faulthandler.register(signal.SIGUSR1, sys.stdout)
    code = 1
    try:
        _serve(directory)
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:
        traceback.print_exc(file=sys.stdout)
    finally:
        for stream in (sys.stdout, sys.stderr):
            with suppress(Exception):
                stream.flush()
        os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
