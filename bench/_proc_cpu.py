"""CPU seconds of processes, from Linux ``/proc``: how the benchmarks say who used the CPU."""

from __future__ import annotations

import os
from pathlib import Path


def _stat(pid: int | str) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name (field 3 is index 0)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int | str) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far."""
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def spark_processes() -> dict[int, tuple[str, float]]:
    """This process's descendants: pid -> ("jvm" or "python", CPU seconds so far).

    Spark's JVM (local mode: driver and executors) and its Python workers all descend from
    the Python driver, so other jobs on the machine are not counted. A process that starts
    and ends between two calls (a short-lived planning worker) is never seen.
    """
    parents: dict[int, int] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            parents[int(entry)] = int(_stat(entry)[1])
        except (OSError, IndexError, ValueError):  # it ended meanwhile
            continue
    mine, found = {os.getpid()}, True
    while found:
        found = False
        for pid, parent in parents.items():
            if parent in mine and pid not in mine:
                mine.add(pid)
                found = True
    seen: dict[int, tuple[str, float]] = {}
    for pid in mine - {os.getpid()}:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            seen[pid] = ("jvm" if command.endswith(b"java") else "python", cpu_seconds(pid))
        except OSError:
            continue
    return seen


def spark_cpu_used(before: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds by kind since ``before`` (a :func:`spark_processes` result).

    Per process: what it used since ``before``, or all it used if it started since. A
    process that ended since ``before`` is left out (its last seconds are lost).
    """
    used = {"jvm": 0.0, "python": 0.0}
    for pid, (kind, seconds) in spark_processes().items():
        used[kind] += seconds - before.get(pid, (kind, 0.0))[1]
    return used


RUNNER = b"pyspark.sql.streaming.python_streaming_source_runner"
WARM = b"splitflow.spark.warmstart"


def is_runner(pid: int) -> bool:
    """Whether ``pid`` is a streaming source runner: the process Spark starts (with
    splitflow's warm start, a stand-in), or one the warm process forked (a child of it that
    is not a worker daemon: a daemon leads a process group of its own)."""
    command = Path(f"/proc/{pid}/cmdline").read_bytes()
    if RUNNER in command:
        return True
    forked = WARM in command and WARM in Path(f"/proc/{_stat(pid)[1]}/cmdline").read_bytes()
    return forked and os.getpgid(pid) != pid


def warm_processes() -> list[int]:
    """This process's warm processes (``splitflow.spark.warmstart``): the parents of the
    runners and daemons they fork, whose CPU time counts in theirs once they ended."""
    found = []
    for pid in spark_processes():
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            if WARM in command and int(_stat(pid)[1]) == os.getpid():
                found.append(pid)
        except (OSError, ValueError):
            continue
    return found
