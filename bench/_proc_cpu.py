"""CPU seconds of processes, from Linux ``/proc``: how the benchmarks say who used the CPU."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_seconds(pid: int | str) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def spark_cpu_seconds() -> dict[str, float]:
    """CPU seconds used so far by Spark's JVMs and by its Python workers on this machine."""
    used = {"jvm": 0.0, "python": 0.0}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            kind = (
                "jvm"
                if command[0].endswith(b"java")
                else "python"
                if b"pyspark.daemon" in command
                else None
            )
            if kind:
                used[kind] += cpu_seconds(pid)
        except OSError:  # it ended meanwhile
            continue
    return used
