"""A Spark standalone cluster on 127.0.0.1, started from the pip-installed PySpark.

``with standalone_cluster() as cluster:`` starts one master and ``workers`` workers with
``bin/spark-class`` from the ``pyspark`` package folder (which is a complete ``SPARK_HOME``),
waits until every worker has registered with the master, and yields a
:class:`StandaloneCluster` (``cluster.master_url`` is ``spark://127.0.0.1:<port>``).

Guarantees:

* Every daemon runs in its own process group (``start_new_session``). Executors are
  children of a worker and stay in its group; their Python worker daemons leave it
  (PySpark's ``daemon.py`` calls ``setpgid``) but run in the executor's working folder,
  under the cluster's folder.
* On exit, normal or by an exception, every group started here gets SIGTERM; whatever is
  left after ``stop_timeout`` seconds (in those groups, or working under the cluster's
  folder) gets SIGKILL by process group and by PID; each daemon is reaped. Nothing else is
  signalled. :meth:`StandaloneCluster.leftovers` lists what is still alive; tests assert it
  is empty after exit.
* Ports are free ports of 127.0.0.1 picked just before the start (should another process
  take one meanwhile, the daemon exits and the start fails with its log).
* Logs (stdout and stderr of every daemon) and the workers' work folders (one folder per
  executor, ``<work>/<app id>/<executor id>``) are kept under ``cluster.root`` (a fresh
  temporary folder unless ``root`` is given), for the test to read and for post-mortems.

Linux only (process groups), like the rest of the Spark tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pyspark

SPARK_HOME = Path(pyspark.__file__).resolve().parent
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""JVM options that start short-lived JVMs sooner on a small machine (also for drivers)."""


class ClusterError(RuntimeError):
    """The cluster did not come up; the message ends with the tail of the daemons' logs."""


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def daemon_env(root: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for Spark processes: this interpreter for Python, loopback, empty conf."""
    conf_dir = root / "conf"
    conf_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    for name in ("SPARK_MASTER_HOST", "SPARK_MASTER_PORT", "SPARK_WORKER_OPTS"):
        env.pop(name, None)
    env.update(
        SPARK_HOME=str(SPARK_HOME),
        SPARK_CONF_DIR=str(conf_dir),  # nothing from a user's spark-defaults.conf
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOG_DIR=str(root / "logs"),
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        # Daemons do little work: C1 only and one GC thread leave the 2 cores to the test.
        SPARK_DAEMON_JAVA_OPTS=f"{QUICK_JVM} -Dspark.master.rest.enabled=false",
    )
    env.update(extra or {})
    return env


@dataclass
class Daemon:
    """One process started here: the leader of its own process group."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, lines: int = 25) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()[-lines:]
        except OSError as exc:
            text = [f"(no log: {exc})"]
        return f"--- {self.name} (pid {self.pid}), {self.log}:\n" + "\n".join(text)


@dataclass
class StandaloneCluster:
    """A running cluster: where it listens, what it started, where its files are."""

    root: Path
    master_url: str = ""
    web_ui_url: str = ""
    daemons: list[Daemon] = field(default_factory=list)

    @property
    def pids(self) -> list[int]:
        return [d.pid for d in self.daemons]

    def work_dir(self, worker: int) -> Path:
        return self.root / f"work-{worker}"

    def state(self) -> dict[str, object]:
        """The master's JSON status (workers, applications), from its web UI."""
        with urllib.request.urlopen(f"{self.web_ui_url}/json/", timeout=5) as response:
            data: dict[str, object] = json.load(response)
        return data

    def master_alive(self) -> bool:
        return self.state().get("status") == "ALIVE"

    def alive_workers(self) -> int:
        workers = self.state().get("workers", [])
        assert isinstance(workers, list)
        return sum(1 for w in workers if w.get("state") == "ALIVE")

    def leftovers(self) -> list[str]:
        """Processes of this cluster still alive: ``"pid command"`` for each."""
        return [f"{pid} {cmd}" for pid, cmd in find_processes(self.pids, self.root)]

    def logs(self) -> str:
        return "\n".join(d.log_tail() for d in self.daemons)


def find_processes(groups: Iterable[int], root: Path) -> list[tuple[int, str]]:
    """Live processes in one of ``groups`` or working in a folder under ``root``.

    The folder catches what leaves the group: PySpark's worker daemon calls ``setpgid``, so
    an executor's (or a driver's) Python workers are in a group of their own, but they run
    in their JVM's working folder. Returns ``(pid, command)`` pairs; zombies are left out.
    """
    groups = set(groups)
    prefix = str(root.resolve())
    found = []
    for process in psutil.process_iter():
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                continue
            cwd = process.cwd()
            if (
                os.getpgid(process.pid) in groups
                or cwd == prefix
                or cwd.startswith(prefix + os.sep)
            ):
                found.append((process.pid, " ".join(process.cmdline())[:200].strip()))
        except (psutil.Error, OSError):
            continue  # gone meanwhile, or not ours to inspect
    return found


def stop_processes(groups: Sequence[int], root: Path, timeout: float = 10.0) -> list[str]:
    """Stop process groups ``groups`` (started here) and whatever of theirs works under ``root``.

    SIGTERM to every group, up to ``timeout`` s for them to go, then SIGKILL to the groups
    and to each process :func:`find_processes` still finds (by PID). Returns what is still
    alive after that (nothing, unless a process ignores SIGKILL for 30 s).
    """
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 30.0)):
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
        if sig == signal.SIGKILL:
            for pid, _ in find_processes(groups, root):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + wait
        while find_processes(groups, root) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not find_processes(groups, root):
            break
    return [f"{pid} {cmd}" for pid, cmd in find_processes(groups, root)]


def _start(cluster: StandaloneCluster, name: str, args: list[str], env: dict[str, str]) -> Daemon:
    log = cluster.root / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cluster.root,
            start_new_session=True,  # its own process group: killpg reaches its children
        )
    daemon = Daemon(name, process, log)
    cluster.daemons.append(daemon)
    return daemon


def _wait_until(
    what: str, ready: Callable[[], bool], cluster: StandaloneCluster, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        for daemon in cluster.daemons:
            if daemon.process.poll() is not None:
                raise ClusterError(
                    f"{daemon.name} exited with {daemon.process.returncode} while waiting "
                    f"for {what}\n{cluster.logs()}"
                )
        with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
            if ready():
                return
        if time.monotonic() > deadline:
            raise ClusterError(f"no {what} after {timeout:g}s\n{cluster.logs()}")
        time.sleep(0.2)


@contextlib.contextmanager
def standalone_cluster(
    workers: int = 2,
    cores: int = 1,
    memory: str = "1g",
    *,
    root: str | os.PathLike[str] | None = None,
    start_timeout: float = 90.0,
    stop_timeout: float = 10.0,
) -> Iterator[StandaloneCluster]:
    """Start a master and ``workers`` workers on 127.0.0.1; stop all of them on exit.

    Yields once every worker is ALIVE in the master's status. ``cores`` and ``memory`` are
    per worker (``--cores``, ``--memory``); each executor of an application takes them all.
    """
    with contextlib.ExitStack() as stack:
        if root is None:
            root = stack.enter_context(tempfile.TemporaryDirectory(prefix="spark-cluster-"))
        cluster = StandaloneCluster(Path(root))
        env = daemon_env(cluster.root)
        try:
            port, ui_port = free_port(), free_port()
            cluster.master_url = f"spark://127.0.0.1:{port}"
            cluster.web_ui_url = f"http://127.0.0.1:{ui_port}"
            _start(
                cluster,
                "master",
                [
                    "org.apache.spark.deploy.master.Master",
                    *("--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui_port)),
                ],
                env,
            )
            # A worker that registers before the master is ALIVE retries only 5 to 15 s later.
            _wait_until("ALIVE master", cluster.master_alive, cluster, start_timeout)
            for index in range(workers):
                work = cluster.work_dir(index)
                work.mkdir(parents=True, exist_ok=True)
                _start(
                    cluster,
                    f"worker-{index}",
                    [
                        "org.apache.spark.deploy.worker.Worker",
                        cluster.master_url,
                        *("--host", "127.0.0.1", "--cores", str(cores), "--memory", memory),
                        *("--webui-port", str(free_port()), "--work-dir", str(work)),
                    ],
                    env,
                )
            _wait_until(
                f"{workers} ALIVE workers",
                lambda: cluster.alive_workers() >= workers,
                cluster,
                start_timeout,
            )
            yield cluster
        finally:
            left = stop_processes(cluster.pids, cluster.root, stop_timeout)
            for daemon in cluster.daemons:  # reap the leaders (our children)
                daemon.process.wait(timeout=30)
            if left:
                raise ClusterError(f"processes of the cluster survived SIGKILL: {left}")


class ScriptDriver:
    """``python SCRIPT CONFIG.json`` as a Spark driver in a process group (and a working
    folder) of its own, run ``run`` of a test: tests kill it and start the next run."""

    def __init__(self, script: str, tmp: Path, run: int, config: Mapping[str, object]) -> None:
        self.run = run
        self.folder = tmp / f"driver-{run}"  # its working folder, and its children's
        self.folder.mkdir()
        self.log = tmp / f"driver-{run}.log"
        config_file = tmp / f"driver-{run}.json"
        config_file.write_text(json.dumps(config))
        repo = Path(__file__).resolve().parents[2]
        env = daemon_env(tmp, {"PYTHONPATH": os.pathsep.join([str(repo / "src"), str(repo)])})
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, script, str(config_file)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.folder,
                start_new_session=True,
            )

    def check_alive(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(
                f"driver {self.run} exited with {self.process.returncode}\n{self.tail()}"
            )
        return True

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace").splitlines()[-lines:]
        return f"--- {self.log}:\n" + "\n".join(text)

    def kill(self) -> None:
        """SIGKILL the whole group (driver, its JVM, the streaming runner), then reap.

        PySpark's Python worker daemon leaves the group (``setpgid``); it exits when its
        JVM's pipe closes, and :func:`stop_processes` makes sure of it.
        """
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        left = stop_processes([self.process.pid], self.folder)
        assert not left, f"driver {self.run} left processes behind: {left}"


@contextlib.contextmanager
def script_driver(
    script: str, tmp: Path, run: int, config: Mapping[str, object]
) -> Iterator[ScriptDriver]:
    """A :class:`ScriptDriver` that is killed whatever happens in the block."""
    process = ScriptDriver(script, tmp, run, config)
    try:
        yield process
    finally:
        process.kill()
