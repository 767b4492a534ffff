"""Run by Python at the start of every Python process Spark starts for a splitflow data
source (its directory is on their ``PYTHONPATH``): a streaming source runner is handed to
the driver's warm process (:mod:`splitflow.spark.warmstart`), which forks it with pyspark,
pandas, pyarrow and splitflow already imported; this process stands in for it until it
exits. Any other process, or a runner that cannot be handed over, goes on as usual, after
the environment's own ``sitecustomize`` (the next one on ``sys.path``).

Standard library only, imported on use: every such process pays for this module.
"""

from __future__ import annotations

import io  # loaded at every start anyway (the standard streams)
import os
import sys

RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"
"""The module Spark runs as a streaming source's driver-side process."""
SOCKET_ENV = "SPLITFLOW_WARM_RUNNER_SOCKET"
"""The warm process's socket (set by ``splitflow.spark.register``)."""


def hand_over(socket_path: str) -> int | None:
    """Have the warm process at ``socket_path`` run this process's runner; its exit code
    once it exited (killed by a signal, the stand-in is killed by it too), or None when
    nothing was handed over (the runner starts here)."""
    import json
    import socket
    import struct

    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(socket_path)
        # What `python -m` would give the runner: the working directory first on its path.
        request = {
            "pid": os.getpid(),
            "python": [sys.prefix, sys.version],  # the warm process runs only its own
            "cwd": os.getcwd(),
            "env": dict(os.environ),
            "path": [os.getcwd(), *sys.path],
        }
        body = json.dumps(request).encode()
        socket.send_fds(connection, [struct.pack("!I", len(body))], [0, 1, 2])
        connection.sendall(body)
        answers = connection.makefile("rb")
        pid = int(answers.readline())
    except FileNotFoundError:  # no warm process, or not ready yet
        pid = 0
    except (OSError, ValueError) as exc:  # Spark shows a worker's stderr in the driver's log
        print(f"splitflow: the streaming source runner starts cold: {exc!r}", file=sys.stderr)
        pid = 0
    if not pid:  # no warm process, not ready, or it runs another Python: start here
        connection.close()
        return None

    try:
        return _stand_in(pid, answers)
    except BaseException:  # never start a second runner beside the one handed over
        os._exit(1)


def _stand_in(pid: int, answers: io.BufferedReader) -> int:
    """Stand in for runner ``pid`` until it exits; its exit code (``answers``: where the warm
    process tells it)."""
    import contextlib
    import signal

    def forward(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):  # ended meanwhile
            os.kill(pid, signum)  # Spark stopping the runner: stop the real one

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    line = answers.readline()
    if not line:  # the warm process went away: the runner is nobody's child to wait for
        import time

        while alive(pid):
            time.sleep(0.1)
        return 1
    code = int(line)
    if code < 0:  # the runner was killed by a signal: so is its stand-in
        with contextlib.suppress(OSError, ValueError):  # SIGKILL has no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code  # a signal that does not end a process
    return code


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


if __name__ == "sitecustomize":  # not when imported as splitflow.spark._warmsite.sitecustomize
    _socket = os.environ.get(SOCKET_ENV)
    if _socket and sys.orig_argv[-2:] == ["-m", RUNNER]:
        _code = hand_over(_socket)
        if _code is not None:
            os._exit(_code)
    _next_sitecustomize()
