"""What the snapshot benchmarks share (``pg_snapshot.py``, ``cdc_snapshot.py``): one quiet
``local[2]`` session, a read timed around the noop sink with the CPU seconds of each kind of
process, and the score's last lines.

A :class:`Timed` reader prints one line per read: its time, rows/s and the CPU seconds of
Spark's JVM, of Python (its workers, and this script, where a client loop runs), of the
database server (:class:`ServerCpu`) and of the rest of the machine (``other``: another job
on the two cores shows there).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.spark.support import spark_env

from _proc_cpu import cpu_seconds, spark_cpu_used, spark_processes

CPU_HEADER = (
    f"{'round':>5} {'reader':<22} {'time':>8} {'rows/s':>11} {'jvm':>7} "
    f"{'python':>7} {'server':>7} {'other':>7}  (CPU seconds; other: the rest of the machine)"
)


def local_session(jars: Path | None = None) -> Any:
    """A ``local[2]`` session (UI off, UTC, 2 shuffle partitions) made as the README says
    (``splitflow.spark.session``, splitflow's sources registered) with ``jars`` on its class
    path. Call it before anything starts the JVM."""
    os.environ.update(spark_env())  # its Python workers inherit the environment
    from pyspark.sql import SparkSession

    from splitflow.spark import session

    builder = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
    )
    if jars is not None:
        builder = builder.config("spark.jars", str(jars))
    spark = session(builder)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def noop_rows(frame: Any) -> int:
    """Write ``frame`` to the noop sink; the rows it wrote, counted in the same job by an
    ``Observation`` (a count in the JVM, the same cost for every reader)."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as f

    seen = Observation("rows")
    frame.observe(seen, f.count(f.lit(1)).alias("rows")).write.format("noop").mode(
        "overwrite"
    ).save()
    return int(seen.get["rows"])


def _stat(pid: int | str) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


class ServerCpu:
    """CPU seconds of a database server: its main process's own and its children's, the
    ended ones (reaped: in its ``cutime``/``cstime``) and the live ones (PostgreSQL's
    backends; MariaDB serves with threads of the one process)."""

    def __init__(self, pid_file: Path) -> None:
        self.pid = int(pid_file.read_text().split()[0])

    def __call__(self) -> float:
        fields = _stat(self.pid)
        total = sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if int(_stat(pid)[1]) == self.pid:
                    total += cpu_seconds(pid)
            except (OSError, IndexError, ValueError):  # it ended meanwhile
                continue
        return total


def machine_busy() -> float:
    """CPU seconds all CPUs spent not idle since boot (``/proc/stat``)."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


class Timed:
    """One reader's reads: rows/s of each, and the CPU seconds of each kind of process."""

    def __init__(self, label: str, read: Callable[[], int], expected: int, server: ServerCpu):
        self.label, self.read, self.expected, self.server = label, read, expected, server
        self.rates: list[float] = []
        self.cpu: list[dict[str, float]] = []

    def once(self, round_: int | str) -> float:
        before, server, busy = spark_processes(), self.server(), machine_busy()
        driver = time.process_time()
        began = time.perf_counter()
        rows = self.read()
        took = time.perf_counter() - began
        used = spark_cpu_used(before)
        used["python"] += time.process_time() - driver  # a client loop runs here
        used["server"] = self.server() - server
        used["other"] = machine_busy() - busy - sum(used.values())
        if rows != self.expected:
            raise SystemExit(f"{self.label} read {rows:,} rows, the table has {self.expected:,}")
        rate = rows / took
        self.rates.append(rate)
        self.cpu.append(used)
        print(
            f"{round_!s:>5} {self.label:<22} {took:7.2f}s {rate:>11,.0f} "
            + " ".join(f"{used[k]:6.1f}s" for k in ("jvm", "python", "server", "other")),
            flush=True,
        )
        return rate

    def forget(self) -> None:
        """Drop what was measured so far (a warm-up's)."""
        self.rates.clear()
        self.cpu.clear()

    @property
    def median(self) -> float:
        return statistics.median(self.rates)

    def cpu_per_million(self) -> str:
        """Median CPU seconds per million rows, by kind of process."""
        kinds = ("jvm", "python", "server")
        each = {k: statistics.median(c[k] for c in self.cpu) * 1e6 / self.expected for k in kinds}
        return f"{sum(each.values()):.2f} (" + ", ".join(f"{k} {each[k]:.2f}" for k in kinds) + ")"


def run_rounds(readers: tuple[Timed, ...], rounds: int) -> None:
    """``rounds`` reads of each reader, in turn, the order reversed every other round so
    that noise hits them all."""
    for round_ in range(rounds):
        for reader in readers if round_ % 2 == 0 else readers[::-1]:
            reader.once(round_)


def report(ratio: float, target: float) -> None:
    """The score's last lines: ``MISS`` when below ``target``, then ``RESULT``."""
    if ratio < target:
        print(f"MISS ratio_vs_baseline={ratio:.3f} is below the target {target}")
    print(f"RESULT ratio_vs_baseline={ratio:.3f} target={target}")
