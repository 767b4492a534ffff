"""Streaming source runners and worker daemons forked from the driver's warm process
(splitflow.spark.warmstart).

Without Spark: a process started as Spark starts a runner (``python -m
pyspark.sql.streaming.python_streaming_source_runner``, the warm start's variables in its
environment) talks to a stand-in for the JVM here, which reads the pid the runner sends
once connected; one started as Spark starts a worker daemon (``python -m pyspark.daemon
MODULE``) tells its port on stdout and forks a worker for each connection. With Spark
(slow): a real query's runner and its tasks' daemon are the warm process's children, and
stopping the query ends the runner.
"""

from __future__ import annotations

import contextlib
import functools
import json
import marshal
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time
import zipfile
import zipimport
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pyspark
import pytest
from tests.spark.sources import OwnDaemonGeneratorDataSource

from splitflow.spark import register, session, warmstart
from splitflow.spark._warmsite import sitecustomize
from splitflow.spark._warmsite.sitecustomize import DAEMON, PID_FILE, RUNNER, WAIT
from splitflow.spark.warmstart import (
    _CANNOT_FORK,
    _ONE_THREAD,
    _READY_WITHIN,
    SITE_DIR,
    SOCKET_ENV,
    WarmStart,
    _answers,
    _archives,
    _launch_directory,
    _private_directory,
    launcher,
    registering,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

SECRET = "not-a-secret"
SPARK_ZIPS = sorted(
    str(p) for p in (Path(pyspark.__file__).parent / "python" / "lib").glob("*.zip")
)  # what Spark puts first on a Python worker's path


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WarmStart]:
    """A warm process of this module's own (the driver's serves the Spark tests' sources)."""
    started = WarmStart.launch(str(tmp_path_factory.mktemp("warm")))
    assert started.ready(timeout=60), f"the warm process did not get ready: {_state(started)}"
    yield started
    assert _stop(started) == 0
    assert "the driver's end of stdin closed" in started.what_it_said()


def _stop(warm: WarmStart) -> int:
    """Stop a warm process as the driver's exit does (it removes its directory); its exit code."""
    assert warm.process.stdin is not None
    warm.process.stdin.close()
    return warm.process.wait(timeout=30)


def _state(warm: WarmStart) -> str:
    """What a warm process that does not serve is doing: its exit code, or where it waits
    (from /proc), and what its directory holds."""
    pid = warm.process.pid
    if warm.process.poll() is not None:
        state = f"exit code {warm.process.returncode}"
    else:
        proc = Path(f"/proc/{pid}")
        status = [
            line
            for line in (proc / "status").read_text().splitlines()
            if line[:6] in ("State:", "Thread")
        ]
        state = f"{status}, wchan {(proc / 'wchan').read_text()!r}"
        with contextlib.suppress(OSError):  # root only
            state += f", kernel stack {(proc / 'stack').read_text()!r}"
    try:
        held = sorted(os.listdir(warm.directory))
    except OSError as exc:
        held = [repr(exc)]
    return f"pid {pid}: {state}; {warm.directory}: {held}{warm.what_it_said()}"


class FakeJvm:
    """Where a runner connects back to: answers its authentication, reads its pid."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(30)
        self.port = self.server.getsockname()[1]
        self.connection: socket.socket | None = None

    def runner_pid(self) -> int:
        connection, _ = self.server.accept()
        connection.settimeout(30)
        self.connection = connection
        (size,) = struct.unpack("!i", _read(connection, 4))
        assert _read(connection, size).decode() == SECRET
        connection.sendall(struct.pack("!i", 2) + b"ok")
        (pid,) = struct.unpack("!i", _read(connection, 4))
        return int(pid)

    def fail(self) -> str:
        """Send the runner a Python version it cannot match; the error it sends back."""
        assert self.connection is not None
        self.connection.sendall(struct.pack("!i", 3) + b"0.0")
        (special,) = struct.unpack("!i", _read(self.connection, 4))
        assert special == -2  # an exception follows
        (size,) = struct.unpack("!i", _read(self.connection, 4))
        return _read(self.connection, size).decode()

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
        self.server.close()


def _read(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        assert chunk, "the runner closed its connection"
        data += chunk
    return data


@pytest.fixture(params=["python", "launcher"])
def started_by(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """What Spark starts a data source's Python processes with (its ``pythonExec``) for a
    Python: the Python itself (a cluster's sources, whose processes the ``sitecustomize``
    hands over), or its launcher (a local session's sources)."""
    return (lambda python: python) if request.param == "python" else launcher


@pytest.fixture
def jvm() -> Iterator[FakeJvm]:
    fake = FakeJvm()
    yield fake
    fake.close()


def _env(socket_path: str | None, **extra: str) -> dict[str, str]:
    """The environment Spark gives a Python process of a data source registered with warm
    start (``socket_path``; None: without)."""
    env = {k: v for k, v in os.environ.items() if k not in (SOCKET_ENV, "PYTHONPATH")}
    env.update(
        PYTHON_WORKER_FACTORY_SECRET=SECRET,
        # as Spark puts them; this Python's packages for another Python
        PYTHONPATH=os.pathsep.join([*SPARK_ZIPS, SITE_DIR, sysconfig.get_paths()["purelib"]]),
        **extra,
    )
    if socket_path is not None:
        env[SOCKET_ENV] = socket_path
    return env


def start_runner(
    jvm: FakeJvm, socket_path: str | None, python: str = sys.executable, ignore: int = 0
) -> subprocess.Popen[bytes]:
    """A runner started as Spark starts one, by ``python`` (Spark's ``pythonExec``), with
    signal ``ignore`` ignored (as the JVM that pyspark launches ignores SIGINT): set by a
    shell that then becomes the runner, not by Python code run after a fork of this
    process, which has threads."""
    env = _env(socket_path, PYTHON_WORKER_FACTORY_PORT=str(jvm.port))
    command = [python, "-m", RUNNER]
    if ignore:
        name = signal.Signals(ignore).name.removeprefix("SIG")
        command = ["sh", "-c", f"trap '' {name}; exec \"$@\"", "sh", *command]
    return subprocess.Popen(command, env=env, stderr=subprocess.PIPE, cwd=os.getcwd())


def _ignores(pid: int, sig: int) -> bool:
    """Whether process ``pid`` ignores signal ``sig`` (its ``SigIgn`` mask in /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    (mask,) = [line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")]
    return bool(int(mask, 16) >> (sig - 1) & 1)


class Daemon:
    """A worker daemon started as Spark starts one (``python -m pyspark.daemon MODULE``):
    it writes its port to stdout, forks a worker for each connection and ends when its
    stdin closes."""

    def __init__(
        self, socket_path: str | None, python: str = sys.executable, module: str = "pyspark.worker"
    ) -> None:
        self.stand_in = subprocess.Popen(
            [python, "-m", DAEMON, module],
            env=_env(socket_path),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert self.stand_in.stdout is not None
        (self.port,) = struct.unpack("!i", self.stand_in.stdout.read(4))
        self.workers: list[socket.socket] = []

    def worker(self) -> int:
        """Connect as Spark does; the pid of the worker forked for the connection."""
        connection = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        self.workers.append(connection)
        (pid,) = struct.unpack("!i", _read(connection, 4))
        connection.sendall(struct.pack("!i", len(SECRET)) + SECRET.encode())
        (size,) = struct.unpack("!i", _read(connection, 4))
        assert _read(connection, size) == b"ok"
        return int(pid)

    def close(self) -> None:
        for connection in self.workers:
            connection.close()
        if self.stand_in.poll() is None:
            self.stand_in.kill()
        self.stand_in.wait(timeout=30)
        for stream in (self.stand_in.stdin, self.stand_in.stdout, self.stand_in.stderr):
            if stream is not None:
                stream.close()


def _has_pyarrow(pid: int) -> bool:
    """Whether process ``pid`` has pyarrow's library loaded (imported it, or its parent did
    before it forked)."""
    return "libarrow" in Path(f"/proc/{pid}/maps").read_text()


def _gone(pid: int, timeout: float = 10.0) -> bool:
    try:
        psutil.Process(pid).wait(timeout)
    except psutil.NoSuchProcess:
        return True
    except psutil.TimeoutExpired:
        return False
    return True


def test_a_runner_is_forked_by_the_warm_process_and_fails_as_a_cold_one_would(
    warm: WarmStart, jvm: FakeJvm, started_by: Callable[[str], str]
) -> None:
    stand_in = start_runner(jvm, warm.socket_path, started_by(sys.executable))
    pid = jvm.runner_pid()  # it found the fake JVM from the stand-in's environment
    assert pid != stand_in.pid, "the runner ran in the process Spark started"
    assert psutil.Process(pid).ppid() == warm.process.pid
    for fd in (0, 1, 2):  # it has the stand-in's standard streams
        assert os.readlink(f"/proc/{pid}/fd/{fd}") == os.readlink(f"/proc/{stand_in.pid}/fd/{fd}")
    warm_error = jvm.fail()
    stand_in.communicate(timeout=30)

    cold_jvm = FakeJvm()
    try:
        cold = start_runner(cold_jvm, None, started_by(sys.executable))
        assert cold_jvm.runner_pid() == cold.pid
        cold_error = cold_jvm.fail()
        cold.communicate(timeout=60)
    finally:
        cold_jvm.close()
    assert stand_in.returncode == cold.returncode != 0
    assert "PYTHON_VERSION_MISMATCH" in warm_error
    assert "PYTHON_VERSION_MISMATCH" in cold_error
    # the cold runner compiled pyspark from pyspark.zip; the warm one had it imported
    assert "pyspark.zip" in cold_error
    assert "pyspark.zip" not in warm_error


def test_the_warm_process_forks_single_threaded(warm: WarmStart) -> None:
    """Its imports (pyarrow, numpy) started no thread: a fork would copy their locks, not
    them (why Spark's worker daemon imports neither before it forks)."""
    assert os.listdir(f"/proc/{warm.process.pid}/task") == [str(warm.process.pid)]


def test_without_a_warm_process_the_runner_starts_in_the_process_spark_started(
    tmp_path: Path, jvm: FakeJvm, started_by: Callable[[str], str]
) -> None:
    stand_in = start_runner(jvm, str(tmp_path / "nobody-listens.sock"), started_by(sys.executable))
    assert jvm.runner_pid() == stand_in.pid
    stand_in.terminate()
    _, err = stand_in.communicate(timeout=30)
    assert b"starts cold" not in err  # not ready yet: the usual start of a first query


def test_a_runner_that_cannot_be_handed_over_says_so_and_starts_cold(
    tmp_path: Path, jvm: FakeJvm, started_by: Callable[[str], str]
) -> None:
    stale = tmp_path / "stale.sock"  # a socket file nobody listens on (a warm process killed)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as left:
        left.bind(str(stale))
    stand_in = start_runner(jvm, str(stale), started_by(sys.executable))
    assert jvm.runner_pid() == stand_in.pid
    stand_in.terminate()
    _, err = stand_in.communicate(timeout=30)
    said = "splitflow: the streaming source runner starts cold: ConnectionRefusedError"
    assert err.decode().count(said) == 1  # tried once: not again in the process it became


@pytest.mark.slow
def test_a_runner_waits_for_a_warm_process_that_never_gets_ready_then_says_so_and_starts_cold(
    tmp_path: Path, jvm: FakeJvm
) -> None:
    """Alive (its pid file names a live process) and no socket: hung in its imports, say."""
    hung = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        (tmp_path / PID_FILE).write_text(str(hung.pid))
        began = time.monotonic()
        stand_in = start_runner(jvm, str(tmp_path / "runner.sock"))
        assert jvm.runner_pid() == stand_in.pid
        waited = time.monotonic() - began
        stand_in.terminate()
        _, err = stand_in.communicate(timeout=30)
    finally:
        hung.kill()
        hung.wait()
    assert WAIT[RUNNER] <= waited < 30, waited
    said = f"the warm process (pid {hung.pid}) did not get ready in {WAIT[RUNNER]:g} s"
    assert f"splitflow: the streaming source runner starts cold: TimeoutError('{said}')" in (
        err.decode()
    )


def test_a_runner_of_another_python_starts_where_spark_started_it(
    tmp_path: Path, warm: WarmStart, jvm: FakeJvm, started_by: Callable[[str], str]
) -> None:
    """``PYSPARK_PYTHON`` names another Python than the driver's: not the warm process's."""
    venv = tmp_path / "other"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    stand_in = start_runner(jvm, warm.socket_path, started_by(str(venv / "bin" / "python")))
    assert jvm.runner_pid() == stand_in.pid
    stand_in.terminate()
    stand_in.communicate(timeout=30)


def test_a_runner_keeps_the_string_hashing_spark_gave_it(
    warm: WarmStart, jvm: FakeJvm, monkeypatch: pytest.MonkeyPatch, started_by: Callable[[str], str]
) -> None:
    """Spark's Python processes get ``PYTHONHASHSEED`` (the driver's, or 0), which Python
    reads only when it starts: the warm process starts with it, and a process that asks for
    another starts cold."""
    environ = Path(f"/proc/{warm.process.pid}/environ").read_bytes().split(b"\0")
    assert f"PYTHONHASHSEED={os.environ.get('PYTHONHASHSEED', '0')}".encode() in environ
    monkeypatch.setenv("PYTHONHASHSEED", "7")
    stand_in = start_runner(jvm, warm.socket_path, started_by(sys.executable))
    assert jvm.runner_pid() == stand_in.pid
    stand_in.terminate()
    stand_in.communicate(timeout=30)


def test_killing_the_stand_in_kills_the_runner(
    warm: WarmStart, jvm: FakeJvm, started_by: Callable[[str], str]
) -> None:
    stand_in = start_runner(jvm, warm.socket_path, started_by(sys.executable))
    pid = jvm.runner_pid()
    stand_in.kill()
    stand_in.communicate(timeout=30)
    assert _gone(pid), "the runner outlived its stand-in"


def test_without_pidfd_a_runner_still_dies_with_its_stand_in(tmp_path: Path, jvm: FakeJvm) -> None:
    """A kernel before 5.3 has no ``pidfd_open``: the warm process looks for each stand-in
    every half second instead."""
    script = textwrap.dedent(
        f"""
        import os
        from splitflow.spark import warmstart

        def no_pidfd(pid):
            raise OSError(38, "Function not implemented")

        os.pidfd_open = no_pidfd
        warmstart.main([{str(tmp_path)!r}])
        """
    )
    env = {**os.environ, **_ONE_THREAD}
    warm = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, env=env)
    try:
        served = WarmStart(warm, str(tmp_path))
        assert served.ready(timeout=60), "not ready"
        stand_in = start_runner(jvm, served.socket_path)
        pid = jvm.runner_pid()
        assert psutil.Process(pid).ppid() == warm.pid
        stand_in.kill()
        stand_in.wait(timeout=30)  # reaped, as the JVM reaps its children: a zombie lives
        assert _gone(pid, 5), "the runner outlived its stand-in"
        stand_in.communicate(timeout=30)
    finally:
        warm.kill()
        warm.wait()


def test_a_signal_to_the_stand_in_reaches_the_runner_and_ends_both(
    warm: WarmStart, jvm: FakeJvm, started_by: Callable[[str], str]
) -> None:
    stand_in = start_runner(jvm, warm.socket_path, started_by(sys.executable))
    pid = jvm.runner_pid()
    stand_in.send_signal(signal.SIGTERM)  # what Spark's stop of a Python worker sends
    stand_in.communicate(timeout=30)
    assert _gone(pid)
    assert stand_in.returncode == -signal.SIGTERM  # as a cold runner's would be


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP])
def test_a_runner_ignores_a_signal_the_process_spark_started_ignores(
    warm: WarmStart, jvm: FakeJvm, sig: signal.Signals, started_by: Callable[[str], str]
) -> None:
    """pyspark launches the JVM with SIGINT ignored, and the processes the JVM starts inherit
    that (``nohup`` does the same with SIGHUP): a Ctrl-C in the driver's terminal is the
    driver's to handle. A runner forked warm ignores it too, and its stand-in passes none on;
    else a Ctrl-C to the driver's process group killed the runner under a running query."""
    stand_in = start_runner(jvm, warm.socket_path, started_by(sys.executable), ignore=sig)
    pid = jvm.runner_pid()
    assert _ignores(stand_in.pid, sig)
    assert _ignores(pid, sig), "the runner forked warm does not ignore it"
    assert not _ignores(pid, signal.SIGTERM)  # Spark stops it with that
    stand_in.send_signal(sig)
    os.kill(pid, sig)  # the driver's process group gets it: so does the runner
    time.sleep(0.5)
    assert stand_in.poll() is None
    assert _ignores(stand_in.pid, sig), "the stand-in took it up to pass it on"
    assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE  # alive
    stand_in.send_signal(signal.SIGTERM)
    stand_in.communicate(timeout=30)
    assert _gone(pid)


def test_without_a_python_to_start_it_there_is_no_warm_process(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(WarmStart, "_current", None)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))
    assert WarmStart.start() is None
    assert "start cold" in caplog.text


def test_warm_start_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(WarmStart, "_current", None)
    monkeypatch.setenv("SPLITFLOW_WARM_START", "0")
    assert WarmStart.start() is None


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_runner_killed_ends_its_stand_in_by_the_same_signal_and_nothing_restarts_it(
    warm: WarmStart, jvm: FakeJvm, sig: signal.Signals, started_by: Callable[[str], str]
) -> None:
    stand_in = start_runner(jvm, warm.socket_path, started_by(sys.executable))
    os.kill(jvm.runner_pid(), sig)  # the OOM killer, say
    stand_in.communicate(timeout=30)
    assert stand_in.returncode == -sig
    jvm.server.settimeout(1)
    with pytest.raises(TimeoutError):
        jvm.server.accept()  # no runner started cold after it


def test_a_signal_sent_before_the_stand_in_knows_its_child_is_passed_on_to_it(
    tmp_path: Path,
) -> None:
    """Spark may stop a daemon right after it started (as
    ``test_a_daemon_stops_as_a_cold_one_and_takes_its_workers_along`` does). Sent before
    the warm process answered with the child's pid, the SIGTERM waits in the stand-in and
    reaches the child once the pid arrives: it ending the stand-in alone would leave the
    warm process to SIGKILL the child, and a daemon killed so leaves its workers running.
    A fake warm process here."""
    path = str(tmp_path / "warm.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    server.settimeout(30)
    stand_in = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import importlib.util, os, sys\n"  # one thread, as at a process's start
            "spec = importlib.util.spec_from_file_location('stand_in', sys.argv[2])\n"
            "site = importlib.util.module_from_spec(spec)\n"
            "spec.loader.exec_module(site)\n"
            "code = site.hand_over(sys.argv[1], site.DAEMON, [], sys.path)\n"
            "os._exit(99 if code is None else code)\n",
            path,
            sitecustomize.__file__,
        ]
    )
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        connection, _ = server.accept()
        with connection:
            _, fds, _, _ = socket.recv_fds(connection, 4, 3)  # the request's size, its streams
            for fd in fds:
                os.close(fd)
            assert stand_in.poll() is None
            os.kill(stand_in.pid, signal.SIGTERM)  # before the stand-in knows the child
            time.sleep(0.5)
            assert stand_in.poll() is None, "the SIGTERM ended the stand-in alone"
            connection.sendall(f"{child.pid}\n".encode())
            assert child.wait(timeout=30) == -signal.SIGTERM  # passed on
            connection.sendall(f"{child.returncode}\n".encode())
            assert stand_in.wait(timeout=30) == -signal.SIGTERM  # as its child ended
    finally:
        child.kill()
        stand_in.kill()
        server.close()


def test_a_daemon_is_forked_warm_and_forks_workers_with_everything_imported(
    warm: WarmStart, started_by: Callable[[str], str]
) -> None:
    daemon = Daemon(warm.socket_path, started_by(sys.executable))
    cold = Daemon(None, started_by(sys.executable))
    try:
        worker = daemon.worker()
        forked = psutil.Process(worker).ppid()
        assert forked != daemon.stand_in.pid, "the daemon ran in the process Spark started"
        assert psutil.Process(forked).ppid() == warm.process.pid
        assert _has_pyarrow(worker)
        cold_worker = cold.worker()
        assert psutil.Process(cold_worker).ppid() == cold.stand_in.pid
        assert not _has_pyarrow(cold_worker)  # it imports pyarrow itself, later
        assert os.listdir(f"/proc/{forked}/task") == [str(forked)]  # forks single-threaded
    finally:
        daemon.close()
        cold.close()


@pytest.mark.parametrize("stop", ["stdin", "SIGTERM"])
def test_a_daemon_stops_as_a_cold_one_and_takes_its_workers_along(
    warm: WarmStart, stop: str, started_by: Callable[[str], str]
) -> None:
    """Spark stops a daemon by closing its stdin (the JVM exits) or with SIGTERM."""
    codes = []
    for socket_path in (warm.socket_path, None):
        daemon = Daemon(socket_path, started_by(sys.executable))
        try:
            worker = daemon.worker()
            forked = psutil.Process(worker).ppid()
            assert daemon.stand_in.stdin is not None
            if stop == "stdin":
                daemon.stand_in.stdin.close()
            else:
                daemon.stand_in.terminate()
            daemon.stand_in.wait(timeout=30)
            codes.append(daemon.stand_in.returncode)
            assert _gone(forked)
            assert _gone(worker)
        finally:
            daemon.close()
    warm_code, cold_code = codes
    assert warm_code == cold_code


def test_a_runner_waits_for_a_warm_process_still_importing(
    monkeypatch: pytest.MonkeyPatch, jvm: FakeJvm
) -> None:
    """The query that follows ``register`` at once: its runner is forked warm all the same."""
    monkeypatch.setattr(WarmStart, "_current", None)
    starting = WarmStart.start()
    assert starting is not None
    try:
        assert not starting.ready(), "ready at once: nothing to wait for"
        stand_in = start_runner(jvm, starting.socket_path)
        pid = jvm.runner_pid()
        assert psutil.Process(pid).ppid() == starting.process.pid
        stand_in.terminate()
        stand_in.communicate(timeout=30)
    finally:
        _stop(starting)


@pytest.mark.parametrize("end", ["killed", "stopped serving"])
def test_a_warm_process_that_ended_is_replaced_where_the_sources_registered_before_look(
    monkeypatch: pytest.MonkeyPatch, jvm: FakeJvm, caplog: pytest.LogCaptureFixture, end: str
) -> None:
    """A data source keeps the socket path it was registered with: the next ``start()``
    (a ``register``) starts a warm process there again, and its runners are forked warm."""
    monkeypatch.setattr(WarmStart, "_current", None)
    first = WarmStart.start()
    assert first is not None
    assert first.ready(timeout=60), _state(first)
    if end == "killed":
        first.process.kill()  # the OOM killer, say
        first.process.wait()
    else:  # its directory gone (what the end of serving leaves), the process not yet
        shutil.rmtree(first.directory)
    second = WarmStart.start()
    assert second is not None
    try:
        assert first.process.poll() is not None
        assert f"the warm process (pid {first.process.pid})" in caplog.text
        if end == "stopped serving":  # where it was: serving, as far as it knew
            assert "in _accept" in caplog.text
        assert second.process.pid != first.process.pid
        assert second.socket_path == first.socket_path
        stand_in = start_runner(jvm, first.socket_path)  # registered with the first
        pid = jvm.runner_pid()
        assert psutil.Process(pid).ppid() == second.process.pid, _state(second)
        stand_in.terminate()
        stand_in.communicate(timeout=30)
    finally:
        _stop(second)


def test_a_warm_process_that_does_not_get_ready_is_replaced_after_a_while(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Alive, never serving (hung, say): left alone while it may still be importing."""
    hung = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        stuck = WarmStart(hung, str(tmp_path))
        monkeypatch.setattr(WarmStart, "_current", stuck)
        assert WarmStart.start() is stuck
        stuck.started -= _READY_WITHIN
        replaced = WarmStart.start()
        assert replaced is not None
        assert replaced is not stuck
        assert hung.poll() is not None
        assert replaced.socket_path == stuck.socket_path
        assert replaced.ready(timeout=60), _state(replaced)
        _stop(replaced)
    finally:
        hung.kill()
        hung.wait()


def test_a_warm_process_that_could_not_fork_is_not_started_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """One whose imports left threads said so and exited; another would do the same."""
    declined = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({_CANNOT_FORK})"])
    declined.wait(timeout=30)
    monkeypatch.setattr(WarmStart, "_current", WarmStart(declined, str(tmp_path)))
    assert WarmStart.start() is None
    monkeypatch.setattr(WarmStart, "_current", WarmStart(declined, str(tmp_path)))
    declined.returncode = 1  # ended otherwise: replaced
    replaced = WarmStart.start()
    assert replaced is not None
    _stop(replaced)


def test_directories_of_warm_processes_gone_without_removing_them_are_removed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, warm: WarmStart, jvm: FakeJvm
) -> None:
    """Killed with their driver's process group, say: the next driver to start a warm process
    removes them, and only them."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()  # its pid is free: no process has it

    def left(name: str, pid: int | None, listening: bool = False) -> socket.socket:
        folder = tmp_path / name
        folder.mkdir(mode=0o700)
        if pid is not None:
            (folder / "pid").write_text(str(pid))
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(folder / "runner.sock"))  # stays as a file when closed
        if listening:
            server.listen(1)
        else:
            server.close()
        return server

    listening = left("splitflow-warm-answers", ended.pid, listening=True)
    try:
        left("splitflow-warm-gone", ended.pid)
        left("splitflow-warm-alive", os.getpid())
        left("splitflow-warm-no-pid", None)
        left("elsewhere", ended.pid)
        made = _private_directory(None)
        found = sorted(p.name for p in tmp_path.iterdir())
        assert found == sorted(
            [
                "elsewhere",
                "splitflow-warm-alive",
                "splitflow-warm-answers",
                "splitflow-warm-no-pid",
                os.path.basename(made),
            ]
        )
    finally:
        listening.close()
    assert _answers(warm.socket_path)  # a warm process takes the probe and serves on
    stand_in = start_runner(jvm, warm.socket_path)
    assert psutil.Process(jvm.runner_pid()).ppid() == warm.process.pid
    stand_in.terminate()
    stand_in.communicate(timeout=30)


def test_the_environment_s_own_sitecustomize_still_runs(tmp_path: Path) -> None:
    own = tmp_path / "site"
    own.mkdir()
    marker = tmp_path / "ran"
    (own / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SITE_DIR, str(own)])}
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True, timeout=60)
    assert marker.exists()


def _request(command: list[str], env: dict[str, str], cwd: Path, warm: socket.socket) -> Any:
    """What a stand-in started with ``command`` asks the (fake) warm process listening on
    ``warm`` for."""
    stand_in = subprocess.Popen(command, env=env, cwd=cwd, stdin=subprocess.DEVNULL)
    try:
        connection, _ = warm.accept()
        with connection:
            header, fds, _, _ = socket.recv_fds(connection, 4, 3)
            for fd in fds:
                os.close(fd)
            (size,) = struct.unpack("!I", header)
            return marshal.loads(_read(connection, size))
    finally:
        stand_in.kill()
        stand_in.wait(timeout=30)


def test_the_launcher_asks_for_what_python_started_by_spark_would(tmp_path: Path) -> None:
    """The same module, arguments, working directory, environment (Spark's ``PYTHONPATH``
    in it) and ``sys.path``: the launcher starts its stand-in without Spark's ``PYTHONPATH``
    and makes the path as Python makes it from one (entries absolute, each once, before the
    interpreter's own). A fake warm process here."""
    path = str(tmp_path / "warm.sock")
    warm = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    warm.bind(path)
    warm.listen(2)
    warm.settimeout(30)
    env = _env(path)
    purelib = sysconfig.get_paths()["purelib"]  # also where site puts the packages
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], "relative", "", purelib])
    (tmp_path / "work").mkdir()
    args = ["-m", RUNNER, "an argument"]
    try:
        asked = _request([sys.executable, *args], env, tmp_path / "work", warm)
        launched = _request([launcher(sys.executable), *args], env, tmp_path / "work", warm)
    finally:
        warm.close()
    assert asked["path"][0] == str(tmp_path / "work")  # `python -m`'s first entry
    assert SITE_DIR in asked["path"]
    assert str(tmp_path / "work" / "relative") in asked["path"]
    assert asked["path"].count(purelib) == 1
    del asked["pid"], launched["pid"]
    assert launched == asked


_SHOW = "import json, os, sys; print(json.dumps([sys.argv, dict(os.environ), sys.path]))"


def test_the_launcher_becomes_the_process_spark_would_have_started(tmp_path: Path) -> None:
    """One not to hand over (not ``-m`` a runner or daemon), in the same process: with
    Spark's arguments, environment (also variables whose names a shell would drop) and
    path."""
    env = _env(str(tmp_path / "warm.sock"), **{"MY.VAR": "1", "my-var": "2"})  # no shell's
    (tmp_path / "shown.py").write_text(_SHOW)
    for command in (["-c", _SHOW, "an argument"], ["-m", "shown", "an argument"]):
        shown = [
            subprocess.run(
                [python, *command], env=env, cwd=tmp_path, capture_output=True, check=True
            ).stdout
            for python in (sys.executable, launcher(sys.executable))
        ]
        argv, environment, _ = json.loads(shown[0])
        assert argv[1:] == ["an argument"]
        assert environment[SOCKET_ENV] == env[SOCKET_ENV]  # not handed over: left as it was
        assert shown[1] == shown[0]


class _Context:
    def __init__(self, master: str) -> None:
        self.master = master
        self.pythonExec = sys.executable
        self.environment: dict[str, str] = {}


class _Spark:
    def __init__(self, master: str) -> None:
        self.sparkContext = _Context(master)


@pytest.mark.parametrize(
    ("master", "launched"),
    [
        ("local[2]", True),
        ("local-cluster[2,1,1024]", True),
        ("spark://127.0.0.1:7077", False),  # its workers may be on other machines
        ("yarn", False),
    ],
)
def test_sources_registered_with_a_local_session_start_their_processes_by_the_launcher(
    master: str, launched: bool
) -> None:
    spark = _Spark(master)
    with registering(spark):
        during = spark.sparkContext.pythonExec
        assert spark.sparkContext.environment[SOCKET_ENV]
    assert spark.sparkContext.pythonExec == sys.executable  # as it was after
    assert spark.sparkContext.environment == {}
    if not launched:
        assert during == sys.executable
        return
    assert during == launcher(sys.executable) != sys.executable
    assert os.access(during, os.X_OK)
    assert Path(during).read_text().startswith(f"#!{shutil.which(sys.executable)} -E\n")
    spark.sparkContext.pythonExec = during  # registered again while it is the launcher
    with registering(spark):
        assert spark.sparkContext.pythonExec == during  # not a launcher of the launcher
    assert spark.sparkContext.pythonExec == during


_LAUNCHING_DRIVER = """
import os, sys
from splitflow.spark.warmstart import launcher
print(launcher(sys.executable), flush=True)
if sys.argv[1] == "killed":
    os._exit(0)  # no atexit: as a driver killed
if sys.argv[1] == "alive":
    sys.stdin.read()  # until the test closes it
"""


def test_the_launcher_s_directory_goes_with_its_driver(tmp_path: Path) -> None:
    """Removed when the driver exits; left while it lives, whatever its pid means to another
    driver (one in another pid namespace sharing the temporary directory); removed by
    another driver once it is gone (killed, say) and was made a while before."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}

    def driver(way: str) -> Path:
        done = subprocess.run(
            [sys.executable, "-c", _LAUNCHING_DRIVER, way],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        return Path(done.stdout.strip())

    alive = subprocess.Popen(
        [sys.executable, "-c", _LAUNCHING_DRIVER, "alive"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert alive.stdout is not None
    living = Path(alive.stdout.readline().strip()).parent
    killed = driver("killed").parent
    assert not driver("exits").parent.exists()
    assert killed.exists()  # gone a moment ago: left, as one just made is
    long_ago = time.time() - 3600
    for made in (living, killed):
        os.utime(made, (long_ago, long_ago))
    assert not driver("exits").parent.exists()
    assert not killed.exists()
    assert living.exists()  # its driver holds its lock
    alive.communicate("", timeout=60)
    assert not living.exists()


@pytest.mark.parametrize("why", ["no directory", "cannot run", "no interpreter"])
def test_without_a_launcher_that_runs_python_is_left_as_it_is(
    why: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Without a writable temporary directory, with a launcher that does not run (a
    temporary directory mounted noexec, say: here an interpreter that fails), or with a
    Python whose path cannot be a script's interpreter, Spark starts Python as before:
    said once."""
    monkeypatch.setattr(warmstart, "_LAUNCHERS", {})
    monkeypatch.setattr(
        warmstart, "_launch_directory", functools.cache(_launch_directory.__wrapped__)
    )
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    python = sys.executable
    if why == "no directory":
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "not-there"))
        said = str(tmp_path / "not-there")
    elif why == "cannot run":
        python = str(tmp_path / "python")
        Path(python).write_text("#!/bin/sh\necho 'not this one' >&2\nexit 3\n")
        os.chmod(python, 0o700)
        said = "did not run: not this one"
    else:
        python = "no-such-python"
        said = "'no-such-python' cannot be a script's interpreter"
    assert launcher(python) == python
    assert launcher(python) == python
    warnings = [r.getMessage() for r in caplog.records if "as Spark starts them" in r.getMessage()]
    assert len(warnings) == 1  # once: the answer is kept
    assert "splitflow: Python processes start as Spark starts them: " in warnings[0]
    assert said in warnings[0]
    assert not list(tmp_path.glob("splitflow-launch-*/python-*"))


def test_a_zip_archive_on_a_forked_process_s_path_is_read_again_only_once_it_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runner and every worker call ``importlib.invalidate_caches()`` as they start; the
    importers the warm process gives them read an archive's directory again only when the
    archive changed, and what they find is then what is in it."""
    reads: list[str] = []
    read_directory = zipimport._read_directory  # type: ignore[attr-defined]

    def counted(read: str) -> Any:
        if read == str(archive):
            reads.append(read)
        return read_directory(read)

    monkeypatch.setattr(zipimport, "_read_directory", counted)
    archive = tmp_path / "lib.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("one.py", "")
    other = tmp_path / "other.txt"
    other.write_text("not an archive")
    path = [str(tmp_path), str(archive), str(other), str(tmp_path / "missing.zip")]

    (importer,) = _archives(path).values()  # only the zip archive has one
    assert importer.find_spec("one") is not None
    assert reads == [str(archive)]
    importer.invalidate_caches()
    assert _archives(path) == {str(archive): importer}  # kept for the next process
    assert reads == [str(archive)], "read again though unchanged"

    with zipfile.ZipFile(archive, "a") as zipped:
        zipped.writestr("two.py", "")
    importer.invalidate_caches()
    assert reads == [str(archive)] * 2
    assert importer.find_spec("two") is not None
    archive.unlink()
    assert _archives(path) == {str(archive): importer}
    assert importer.find_spec("one") is None  # gone: nothing found there, as Python's own


class _Builder:
    """A session builder as ``session`` uses one (its options, ``config``, ``getOrCreate``),
    whose session is the tests' own."""

    def __init__(self, spark: Any, **options: str) -> None:
        self.spark = spark
        self._options = dict(options)

    def config(self, key: str, value: str) -> _Builder:
        self._options[key] = value
        return self

    def getOrCreate(self) -> Any:
        return self.spark


UNIX_SOCKETS = "spark.python.unix.domain.socket.enabled"


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, "true"),
        ({UNIX_SOCKETS: "false"}, "false"),  # the builder's own choice
        ({"spark.remote": "sc://localhost"}, None),  # Spark Connect: the server's choice
    ],
)
def test_a_session_made_by_splitflow_talks_to_python_over_unix_sockets(
    spark: Any, options: dict[str, str], expected: str | None
) -> None:
    builder = _Builder(spark, **options)
    assert session(builder) is spark
    assert builder._options.get(UNIX_SOCKETS) == expected


@pytest.mark.slow
def test_a_query_s_runner_and_its_tasks_daemon_are_the_warm_process_s_children(
    spark: Any, tmp_path: Path
) -> None:
    """The runner ends when the query stops; the daemons (each its own process group, as
    Spark's daemon makes itself) stay for the session, the tasks' one with its workers.
    The source is registered with an environment of its own, so Spark starts its tasks'
    daemon now, while the warm process serves (earlier tests' daemon may have started
    cold, or from a warm process replaced since)."""
    warm = WarmStart.start()  # the driver's, which the session's sources were registered with
    assert warm is not None
    assert warm.ready(timeout=60), f"the warm process does not serve: {_state(warm)}"
    environment = spark.sparkContext.environment
    environment[OWN_DAEMON] = str(tmp_path)
    try:
        register(spark, OwnDaemonGeneratorDataSource)
    finally:
        del environment[OWN_DAEMON]

    def children() -> tuple[set[int], set[int]]:
        """The warm process's children: runners, and daemons."""
        pids = {p.pid for p in psutil.Process(warm.process.pid).children()}
        daemons = {pid for pid in pids if os.getpgid(pid) == pid}
        return pids - daemons, daemons

    runners_before, _ = children()
    query = (
        spark.readStream.format(OwnDaemonGeneratorDataSource.name())
        .option("splits", "2")
        .option("rowsPerSecond", "100")
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 120
        while not any(p.get("numInputRows", 0) > 0 for p in query.recentProgress):
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, "no rows read"
            time.sleep(0.2)
        runners, daemons = children()
        assert len(runners - runners_before) == 1, _state(warm)
        (runner,) = runners - runners_before
        jvm = psutil.Process(spark.sparkContext._gateway.proc.pid)
        stand_ins = [cmdline(p) for p in jvm.children() if RUNNER in cmdline(p)]
        assert stand_ins, _tree(spark)
        for command in stand_ins:  # started by the launcher (a local session's sources)
            assert command[1] == "-E", command
            assert command[2] in warmstart._LAUNCHERS.values(), command
        workers = [w.pid for d in daemons for w in psutil.Process(d).children()]
        assert workers, f"no daemon of the warm process forked the tasks' workers: {_tree(spark)}"
    finally:
        query.stop()
    assert _gone(runner, 30), "the runner outlived its query"


def cmdline(process: psutil.Process) -> list[str]:
    """``process``'s command line (none once it ended)."""
    try:
        return list(process.cmdline())
    except psutil.Error:
        return []


OWN_DAEMON = "SPLITFLOW_TEST_OWN_DAEMON"
"""A variable only the environment of :class:`OwnDaemonGeneratorDataSource` has."""


def _tree(spark: Any) -> str:
    """The JVM's and the warm process's descendants: pid, parent, command."""
    warm = WarmStart._current  # as it is: start() would replace one that ended
    pids = [spark.sparkContext._gateway.proc.pid, *([warm.process.pid] if warm else [])]
    found = []
    for pid in pids:
        try:
            root = psutil.Process(pid)
            processes = [root, *root.children(recursive=True)]
        except psutil.Error:
            processes = []
            found.append(f"{pid} (gone)")
        for process in processes:
            try:
                command = " ".join(process.cmdline()[:4])
                found.append(f"{process.pid}<-{process.ppid()} {command}")
            except psutil.Error:
                found.append(f"{process.pid} (gone)")
    return "; ".join(found)


_SESSION_DRIVER = """
import json, os, sys
import psutil
from pyspark.sql import SparkSession
from splitflow.spark import register, session
from splitflow.spark.warmstart import WarmStart
builder = (
    SparkSession.builder.master("local[1]")
    .config("spark.ui.enabled", "false")
    .config("spark.driver.host", "127.0.0.1")
)
if sys.argv[1] == "session":
    spark = session(builder)
else:
    spark = builder.getOrCreate()
    register(spark)
warm = WarmStart.start()
children = psutil.Process(warm.process.pid).children()
daemons = [c.pid for c in children if os.getpgid(c.pid) == c.pid]
jvm = psutil.Process(spark.sparkContext._gateway.proc.pid)
def cmdline(process):
    try:
        return process.cmdline()
    except psutil.Error:  # ended meanwhile (Hadoop's shell-outs)
        return []
lookups = [p for p in jvm.children() if "pyspark.sql.worker.lookup_data_sources" in cmdline(p)]
print(json.dumps({"daemons": len(daemons), "lookups": len(lookups),
                  "environment": [os.environ.get(n) for n in ("PYTHONPATH", SOCKET_ENV)],
                  "unix sockets": spark.sparkContext.getConf().get(UNIX_SOCKETS)}))
spark.stop()
"""


@pytest.mark.slow
@pytest.mark.parametrize("way", ["session", "register"])
def test_a_session_made_by_splitflow_forks_the_lookup_of_python_data_sources_warm(
    way: str,
) -> None:
    """Spark looks installed Python data sources up once per application, at the first
    registration, in a daemon started with the JVM's own environment: forked warm only when
    the JVM was started with the warm start's variables (``session``), and the driver's
    environment is as it was after."""
    from tests.spark.support import spark_env

    env = spark_env()
    env.pop(SOCKET_ENV, None)
    driver = _SESSION_DRIVER.replace("SOCKET_ENV", repr(SOCKET_ENV)).replace(
        "UNIX_SOCKETS", repr(UNIX_SOCKETS)
    )
    done = subprocess.run(
        [sys.executable, "-c", driver, way], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["lookups"] == 1, found  # the lookup's daemon, as Spark started it
    assert found["daemons"] == (1 if way == "session" else 0), found
    assert found["environment"] == [env["PYTHONPATH"], None], found
    assert found["unix sockets"] == ("true" if way == "session" else None), found
