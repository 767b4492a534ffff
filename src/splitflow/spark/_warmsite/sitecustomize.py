"""Run by Python at the start of every Python process Spark starts for a splitflow data
source (its directory is on their ``PYTHONPATH``): a streaming source runner or a Python
worker daemon is handed to the driver's warm process (:mod:`splitflow.spark.warmstart`),
which forks it with pyspark, pandas, pyarrow and splitflow already imported; this process
stands in for it until it exits. Any other process, or one that cannot be handed over, goes
on as usual, after the environment's own ``sitecustomize`` (the next one on ``sys.path``).
The launcher of a local session's sources runs :func:`launch` instead, in a Python that
ignores ``PYTHONPATH``: before it reads any of the archives Spark puts there.

Standard library only, imported on use: every such process pays for this module.
"""

from __future__ import annotations

import _socket
import os
import sys

RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"
"""The module Spark runs as a streaming source's driver-side process."""
DAEMON = "pyspark.daemon"
"""The module Spark runs as the daemon that forks Python workers (for tasks and planning)."""
HANDED = {RUNNER: "the streaming source runner", DAEMON: "the Python worker daemon"}
"""The modules handed to the warm process (``python -m MODULE ...``), and what they are."""
SOCKET_ENV = "SPLITFLOW_WARM_RUNNER_SOCKET"
"""The warm process's socket (set by ``splitflow.spark.register``)."""
PID_FILE = "pid"
"""The warm process's pid, in its socket's directory (written by the driver that starts it)."""
PASSED_ON = (15, 2, 1)
"""SIGTERM, SIGINT and SIGHUP (their numbers on Linux: ``signal`` is imported on use): the
signals Spark sends a process to stop it, which a stand-in passes on to the process it
stands in for."""
WAIT = {RUNNER: 5.0, DAEMON: 30.0}
"""Seconds a process waits for a warm process that is still importing (then starts cold):
a runner well inside the 10 s Spark waits for it to connect back; a daemon, which serves
the application from then on (and Spark waits for without a limit), longer."""


def hand_over(socket_path: str, module: str, args: list[str], path: list[str]) -> int | None:
    """Have the warm process at ``socket_path`` run ``python -m module *args`` for this process,
    with ``path`` for its ``sys.path``; its exit code once it exited (killed by a signal, the
    stand-in is killed by it too), or None when nothing was handed over (it starts here). The
    request is ``marshal``-ed, over ``_socket``: built into the interpreter, which ``json`` and
    ``socket`` are not (7 ms of imports, in every runner's start)."""
    import marshal
    import signal
    import struct

    # Spark's signals wait until the stand-in can pass them on (it needs the child's pid):
    # a SIGTERM that ended the stand-in alone would leave the warm process to SIGKILL the
    # child, and a daemon killed so leaves its workers running. (The process has one
    # thread yet, so the thread's mask is the process's.)
    signal.pthread_sigmask(signal.SIG_BLOCK, PASSED_ON)
    connection = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    pid = 0
    try:
        _wait_ready(socket_path, WAIT[module])
        connection.connect(socket_path)
        request = {
            "pid": os.getpid(),
            "python": [sys.prefix, sys.version],  # the warm process runs only its own
            "module": module,
            "args": args,
            "cwd": os.getcwd(),
            "env": dict(os.environ),
            "path": path,
            # pyspark launches the JVM with SIGINT ignored (a terminal's Ctrl-C is the
            # driver's), nohup ignores SIGHUP; the processes it starts inherit that: the
            # process forked for this one ignores the same
            "ignored": [s for s in PASSED_ON if signal.getsignal(s) == signal.SIG_IGN],
        }
        body = marshal.dumps(request)
        streams = (_socket.SOL_SOCKET, _socket.SCM_RIGHTS, struct.pack("3i", 0, 1, 2))
        connection.sendmsg([struct.pack("!I", len(body))], [streams])
        connection.sendall(body)
        pid = int(_line(connection))
    except FileNotFoundError:  # no warm process
        pass
    except (OSError, ValueError) as exc:  # Spark shows a worker's stderr in the driver's log
        print(f"splitflow: {HANDED[module]} starts cold: {exc!r}", file=sys.stderr)
    finally:
        if not pid:  # no warm process, not ready, or it runs another Python: start here
            connection.close()
            signal.pthread_sigmask(signal.SIG_UNBLOCK, PASSED_ON)
    if not pid:
        return None

    try:
        return _stand_in(pid, connection)
    except BaseException:  # never start a second one beside the one handed over
        os._exit(1)


def _line(connection: _socket.socket) -> bytes:
    """The next line the warm process sends on ``connection`` (empty: it closed it)."""
    line = b""
    while not line.endswith(b"\n"):
        byte = connection.recv(1)
        if not byte:
            break
        line += byte
    return line


def _stand_in(pid: int, connection: _socket.socket) -> int:
    """Stand in for process ``pid`` (the runner or daemon forked for this one) until it exits;
    its exit code (``connection``: where the warm process tells it)."""
    import contextlib
    import signal

    def forward(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):  # ended meanwhile
            os.kill(pid, signum)  # Spark stopping this process: stop the real one

    for sig in PASSED_ON:
        if signal.getsignal(sig) != signal.SIG_IGN:  # ignored, it stays so: as in the child
            signal.signal(sig, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, PASSED_ON)  # any sent meanwhile: passed on now
    line = _line(connection)
    if not line:  # the warm process went away: the process is nobody's child to wait for
        import time

        while alive(pid):
            time.sleep(0.1)
        return 1
    code = int(line)
    if code < 0:  # the process was killed by a signal: so is its stand-in
        with contextlib.suppress(OSError, ValueError):  # SIGKILL has no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code  # a signal that does not end a process
    return code


def _wait_ready(socket_path: str, wait: float) -> None:
    """Wait up to ``wait`` seconds while the warm process lives but is not ready yet (its
    socket appears once it is): the query that follows ``register`` at once finds it still
    importing, and a process started cold here would compete with it for the CPU. Still not
    ready then: :class:`TimeoutError`."""
    import time

    try:
        with open(os.path.join(os.path.dirname(socket_path), PID_FILE)) as file:
            pid = int(file.read())
    except (OSError, ValueError):
        return  # none started (or gone): connecting says so
    deadline = time.monotonic() + wait
    while not os.path.exists(socket_path) and alive(pid):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the warm process (pid {pid}) did not get ready in {wait:g} s")
        time.sleep(0.02)


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a zombie does, until its parent waits for it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _next_sitecustomize() -> None:
    """Run the ``sitecustomize`` this one shadows, if any."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _module(argv: list[str]) -> tuple[str, list[str]] | None:
    """The module Python's arguments ``argv`` run and its arguments, when it is one to hand
    over (Spark starts them as ``PYTHON_EXEC -m MODULE ARGS...``)."""
    if len(argv) < 2 or argv[0] != "-m" or argv[1] not in HANDED:
        return None
    return argv[1], argv[2:]


def launch(python: str, argv: list[str]) -> None:
    """Run by the launcher Spark starts instead of ``python`` (a data source's
    ``pythonExec``; see :func:`splitflow.spark.warmstart.launcher`) with ``argv``: hand
    ``-m MODULE ARGS`` over to the warm process as :func:`hand_over` does, or, when it is not
    a module to hand over or nothing was handed over, become ``python argv``, the process
    Spark would have started. This process's Python ignores ``PYTHONPATH`` (``-E``): it
    reads none of the archives Spark puts on it, whose directories every Python process
    Spark starts reads first (about 30 ms of CPU, in ``zipimport``)."""
    warm = os.environ.get(SOCKET_ENV)
    run = _module(argv) if warm else None
    if warm and run is not None:
        code = None
        try:
            code = hand_over(warm, *run, _path_of_m())
        except Exception as exc:
            print(f"splitflow: {HANDED[run[0]]} starts cold: {exc!r}", file=sys.stderr)
        if code is not None:
            os._exit(code)
        del os.environ[SOCKET_ENV]  # tried: the process this one becomes does not again
    os.execvp(python, [python, *argv])


def _path_of_m() -> list[str]:
    """The ``sys.path`` Python gives ``python -m`` in this environment: the working
    directory, the ``PYTHONPATH``'s entries made absolute, then the interpreter's own (as
    here, less this script's directory), each once (as ``site`` leaves it)."""
    given = os.environ.get("PYTHONPATH")
    entries = [os.path.abspath(p) for p in given.split(os.pathsep)] if given else []
    rest = sys.path[1:]
    if os.environ.get("PYTHONNOUSERSITE"):  # which -E ignored
        import site

        rest = [p for p in rest if p != site.USER_SITE]
    return [os.getcwd(), *dict.fromkeys([*entries, *rest])]


if __name__ == "sitecustomize":  # not when imported as splitflow.spark._warmsite.sitecustomize
    _warm = os.environ.get(SOCKET_ENV)
    _run = _module(sys.orig_argv[1:]) if _warm else None
    if _warm and _run is not None:
        # What `python -m` gives the module: the working directory first on its path.
        _code = hand_over(_warm, *_run, [os.getcwd(), *sys.path])
        if _code is not None:
            os._exit(_code)
    _next_sitecustomize()
