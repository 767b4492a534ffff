"""Fixed costs of a streaming query: splitflow's files source vs Spark's own file source.

Both read the same Parquet files (``id bigint, value bigint``, narrow rows), in one
``local[2]`` SparkSession, with the schema given (``.schema(...)``): ``splitflow-files``
(``format`` parquet, default options) against ``spark.readStream.parquet``. Every query
runs with ``trigger(availableNow=True)`` into the noop sink (``writeStream.format("noop")``)
with a fresh checkpoint, and is timed from ``start()`` to its termination; its rows (the
sum of ``numInputRows`` over ``query.recentProgress``) must be the files' rows. Three
workloads:

* **2 files**: two small files, 2,000 rows in all: the query's fixed costs alone;
* **16 files**: 16 files of 500k rows (8M rows; ``--quick``: 50k rows a file): fixed costs
  beside a read of some seconds;
* **batches**: 40 files of 50 rows with ``maxFilesPerTrigger=10`` for both (Spark runs 4
  batches): each side's number of batches and how many of them read 0 rows.

A warm-up round runs the first two workloads once with each reader (JVM, Python workers,
file cache); then the two readers alternate, round after round, the first of a round
switching each round. A round's ratio is Spark's time / splitflow's (above 1: splitflow is
faster); the score of a workload is the median of its rounds' ratios.

To say where the time goes, each query's progress reports (``durationMs`` of every batch)
are summed by phase, and the wall time is cut into ``start`` (from ``start()`` to the first
batch's trigger: the source's creation; for splitflow, the streaming source runner below
and its planner), the batches (``triggerExecution``), and ``end`` (from the last batch's
end to ``awaitTermination()`` returning); the medians over the rounds are printed per reader, with
the CPU seconds each query used (``_proc_cpu``; processes of this script only): the JVM's,
Spark's Python workers', and those of the processes the JVM started that ended meanwhile
(its ``cutime``: the streaming source runner below, and Hadoop's ``chmod`` shell-outs), plus
those of the runners splitflow's warm process forked (its ``cutime``). CPU seconds depend
much less than wall times on what else runs on the machine. Also printed: the command, the
load average at the start and each round's times and batches.

For a Python source, Spark starts one fresh Python process per query run, the streaming
source runner (``python -m pyspark.sql.streaming.python_streaming_source_runner``), and
waits for it before the first batch; Spark puts its own ``pyspark.zip`` first on that
process's ``PYTHONPATH``. splitflow hands that process over to a warm one that forks the
runner with everything imported (``splitflow.spark.warmstart``); ``SPLITFLOW_WARM_START=0``
measures the cold start. The script also measures (not in the score) the CPU seconds of a
fresh interpreter importing what a cold runner imports: the runner module alone and with
``splitflow.spark.files``, with ``pyspark.zip`` first as Spark starts it, and from
site-packages (cached bytecode) for comparison.

    python bench/fixed_costs.py            # 16 files x 500k rows, 7 rounds
    python bench/fixed_costs.py --quick    # 16 files x 50k rows, 3 rounds (< 1 minute)

Last line: ``RESULT speed_vs_spark_2_files=<ratio> speed_vs_spark_16_files=<ratio>
target=>=0.9,>=0.8``; a ``MISS`` line comes before it for each target missed and when the
batch counts differ (the exit code is still 0).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.spark (in _snapshot)

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from _proc_cpu import is_runner, spark_cpu_used, spark_processes, warm_processes
from _snapshot import local_session

SCHEMA = "id bigint, value bigint"
READERS = ("splitflow", "spark")
TARGETS = {"2 files": 0.9, "16 files": 0.8}
PHASES = ("latestOffset", "queryPlanning", "addBatch", "walCommit", "commitOffsets")
RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"


def write_files(directory: Path, files: int, rows: int) -> int:
    """``files`` Parquet files of ``rows`` rows each under ``directory``; their rows."""
    directory.mkdir(parents=True)
    for f in range(files):
        ids = pa.array(range(f * rows, (f + 1) * rows), pa.int64())
        table = pa.table({"id": ids, "value": pc.multiply(ids, 7)})
        pq.write_table(table, directory / f"part-{f:04d}.parquet")
    return files * rows


@dataclass
class Run:
    """One query: its wall time, batches, and where the time went (seconds)."""

    seconds: float
    rows: int
    batches: int
    empty: int  # batches that read 0 rows
    start: float  # start() -> first batch's trigger
    end: float  # last batch's end -> termination
    phases: dict[str, float]  # durationMs summed over the batches, in seconds
    cpu: dict[str, float]  # CPU seconds: jvm, python (workers), ended (the JVM's children)

    PARTS = ("wall", "start", "in batches", "end")

    def parts(self) -> dict[str, float]:
        """Seconds of the wall time's parts (:attr:`PARTS`) and of each progress phase."""
        return {
            "wall": self.seconds,
            "start": self.start,
            "in batches": self.phases["triggerExecution"],
            "end": self.end,
            **self.phases,
        }

    def describe(self) -> str:
        empty = f", {self.empty} empty" if self.empty else ""
        return (
            f"{self.seconds:6.2f} s ({self.batches} batch{'es' if self.batches > 1 else ''}{empty})"
        )


def _clock(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def _ended_children(pids: list[int]) -> float:
    """CPU seconds of the processes ``pids`` started that have ended and been waited for
    (``cutime`` + ``cstime``): for the JVM, its streaming source runners and shell-outs."""
    total = 0.0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")
    return total


def _runner_alive(before: dict[int, tuple[str, float]]) -> bool:
    """Whether a streaming source runner started since ``before`` still runs."""
    for pid in spark_processes().keys() - before.keys():
        try:
            if is_runner(pid):
                return True
        except OSError:  # it ended meanwhile
            continue
    return False


def _cpu_since(
    before: dict[int, tuple[str, float]], parents: list[int], ended: float
) -> dict[str, float]:
    """CPU seconds since ``before`` by kind, once the query's runner has ended (soon after
    the query): ``jvm``, ``python`` (Spark's Python workers), ``ended`` (the runner)."""
    deadline = time.monotonic() + 5
    while _runner_alive(before) and time.monotonic() < deadline:
        time.sleep(0.05)
    used = spark_cpu_used(before)
    used["ended"] = _ended_children(parents) - ended
    return used


def _warm_start() -> str:
    """Whether splitflow's runners start warm (``splitflow.spark.warmstart``), once its
    warm process is ready: a run says which way it measured."""
    from splitflow.spark.warmstart import WarmStart

    warm = WarmStart.start()
    if warm is None:
        return "off"
    if not warm.ready(timeout=60):
        raise SystemExit("the warm process did not get ready: runners would start cold")
    return "on"


def run_query(
    spark: Any, reader: str, directory: Path, checkpoints: Path, options: dict[str, str]
) -> Run:
    """One ``availableNow`` query of ``reader`` over ``directory`` into the noop sink."""
    stream = spark.readStream.schema(SCHEMA).options(**options)
    if reader == "splitflow":
        frame = stream.format("splitflow-files").option("format", "parquet").load(str(directory))
    else:
        frame = stream.parquet(str(directory))
    checkpoint = tempfile.mkdtemp(prefix=f"{reader}-", dir=checkpoints)
    writer = (
        frame.writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
    )
    processes = spark_processes()
    # the runner is the JVM's child, or (warm start) the warm process's
    parents = [pid for pid, (kind, _) in processes.items() if kind == "jvm"] + warm_processes()
    ended = _ended_children(parents)
    began_at = time.time()
    began = time.perf_counter()
    query = writer.start()
    query.awaitTermination()
    seconds = time.perf_counter() - began
    ended_at = began_at + seconds
    cpu = _cpu_since(processes, parents, ended)
    if query.exception() is not None:
        raise SystemExit(f"{reader} over {directory.name}: the query failed: {query.exception()}")
    progress = [p for p in query.recentProgress if "batchId" in p]
    if not progress:
        raise SystemExit(f"{reader} over {directory.name}: no batch ran")
    phases = {
        phase: sum(p["durationMs"].get(phase, 0) for p in progress) / 1e3
        for phase in (*PHASES, "triggerExecution")
    }
    last = progress[-1]
    return Run(
        seconds=seconds,
        rows=sum(int(p["numInputRows"]) for p in progress),
        batches=len({p["batchId"] for p in progress}),
        empty=sum(1 for p in progress if int(p["numInputRows"]) == 0),
        start=_clock(progress[0]["timestamp"]) - began_at,
        end=ended_at - _clock(last["timestamp"]) - last["durationMs"]["triggerExecution"] / 1e3,
        phases=phases,
        cpu=cpu,
    )


class Workload:
    """The Parquet files of one workload, and the runs of both readers over them."""

    def __init__(self, name: str, directory: Path, rows: int, options: dict[str, str]):
        self.name, self.directory, self.rows, self.options = name, directory, rows, options
        self.runs: dict[str, list[Run]] = {reader: [] for reader in READERS}

    def run(self, spark: Any, reader: str, checkpoints: Path) -> Run:
        done = run_query(spark, reader, self.directory, checkpoints, self.options)
        if done.rows != self.rows:
            raise SystemExit(f"{reader} over {self.name} read {done.rows:,} rows of {self.rows:,}")
        self.runs[reader].append(done)
        return done

    def forget(self) -> None:
        """Drop what was measured so far (a warm-up's)."""
        for runs in self.runs.values():
            runs.clear()

    def ratios(self) -> list[float]:
        """Spark's time / splitflow's, per round."""
        pairs = zip(self.runs["spark"], self.runs["splitflow"], strict=True)
        return [spark.seconds / ours.seconds for spark, ours in pairs]

    def breakdown(self) -> str:
        """Median seconds per part of the wall time and per progress phase, by reader."""
        columns = (*Run.PARTS, *PHASES)
        lines = [
            f"{self.name + ', median s':<20}"
            + "".join(f"{c:>14}" for c in columns)
            + f"{'batches':>9}{'empty':>6}"
        ]
        for reader, runs in self.runs.items():
            parts = [r.parts() for r in runs]
            lines.append(
                f"  {reader:<18}"
                + "".join(f"{statistics.median(p[c] for p in parts):14.3f}" for c in columns)
                + f"{statistics.median(r.batches for r in runs):9g}"
                + f"{statistics.median(r.empty for r in runs):6g}"
            )
        kinds = ("jvm", "python", "ended")
        lines.append(
            f"{self.name + ', median cpu s':<20}"
            + "".join(f"{k:>14}" for k in (*kinds, "total"))
            + "   (python: Spark's workers; ended: the JVM's children, e.g. the runner)"
        )
        for reader, runs in self.runs.items():
            cpu = [statistics.median(r.cpu[k] for r in runs) for k in kinds]
            total = statistics.median(sum(r.cpu.values()) for r in runs)
            lines.append(f"  {reader:<18}" + "".join(f"{v:14.2f}" for v in (*cpu, total)))
        return "\n".join(lines)


def runner_start_cpu(repeats: int) -> str:
    """CPU seconds (median of ``repeats``) of a fresh interpreter importing what Spark's
    streaming source runner imports before it can call the source, on a ``PYTHONPATH`` as
    Spark gives it (its zips first, then this process's) or without the zips."""
    from pyspark.find_spark_home import _find_spark_home

    zips = [str(p) for p in sorted((Path(_find_spark_home()) / "python" / "lib").glob("*.zip"))]
    ours = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    cases = {
        "pyspark.zip: runner": (zips, f"import {RUNNER}"),
        "+ splitflow": (zips, f"import {RUNNER}, splitflow.spark.files"),
        "site-packages: runner + splitflow": ([], f"import {RUNNER}, splitflow.spark.files"),
    }
    found = []
    for label, (path, code) in cases.items():
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, *ours])}
        used = []
        for _ in range(repeats):
            before = os.times()
            subprocess.run([sys.executable, "-c", code], env=env, check=True)
            after = os.times()
            used.append(
                after.children_user
                + after.children_system
                - before.children_user
                - before.children_system
            )
        found.append(f"{label} {statistics.median(used):.2f}")
    return ", ".join(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small run, under a minute")
    parser.add_argument("--rounds", type=int, help="rounds after the warm-up (7; --quick 3)")
    parser.add_argument("--rows", type=int, help="rows per file of 16 (500k; --quick 50k)")
    args = parser.parse_args()
    rounds = args.rounds or (3 if args.quick else 7)
    big_rows = args.rows or (50_000 if args.quick else 500_000)
    print(f"$ python bench/fixed_costs.py {' '.join(sys.argv[1:])}".rstrip())
    print(
        f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
        f"({os.cpu_count()} cpus)"
    )
    with tempfile.TemporaryDirectory(prefix="fixed_costs-") as work:
        root = Path(work)
        workloads = [
            Workload("2 files", root / "small", write_files(root / "small", 2, 1_000), {}),
            Workload("16 files", root / "big", write_files(root / "big", 16, big_rows), {}),
        ]
        batches = Workload(
            "batches",
            root / "many",
            write_files(root / "many", 40, 50),
            {"maxFilesPerTrigger": "10"},
        )
        checkpoints = root / "checkpoints"
        checkpoints.mkdir()
        started = time.perf_counter()
        spark = local_session()
        warm = _warm_start()
        print(
            f"fixed_costs: 2 files x 1,000 rows; 16 files x {big_rows:,} rows; 40 files x 50 "
            f"rows at maxFilesPerTrigger=10; schema '{SCHEMA}'; {rounds} rounds after a "
            f"warm-up; local[2], pyspark {spark.version}, warm start {warm}, session started in "
            f"{time.perf_counter() - started:.1f} s"
        )
        for workload in workloads:  # warm-up: JVM, Python workers, file cache
            for reader in READERS:
                print(
                    f"warm-up {workload.name:>8}: {reader} "
                    f"{workload.run(spark, reader, checkpoints).describe()}",
                    flush=True,
                )
            workload.forget()
        for round_ in range(rounds):
            order = READERS if round_ % 2 == 0 else READERS[::-1]
            for workload in workloads:
                runs = {reader: workload.run(spark, reader, checkpoints) for reader in order}
                print(
                    f"round {round_} {workload.name:>8}: "
                    f"splitflow {runs['splitflow'].describe()}   "
                    f"spark {runs['spark'].describe()}   "
                    f"ratio {workload.ratios()[-1]:.3f}",
                    flush=True,
                )
        for reader in READERS:
            batches.run(spark, reader, checkpoints)
        spark.stop()
    counts = {reader: batches.runs[reader][-1] for reader in READERS}
    print(
        "batches, 40 files at maxFilesPerTrigger=10: "
        + ", ".join(
            f"{reader} {run.batches} ({run.empty} read 0 rows, {run.seconds:.2f} s)"
            for reader, run in counts.items()
        )
    )
    for workload in workloads:
        print(workload.breakdown())
    print(
        "start of the streaming source runner, CPU s of a fresh interpreter's imports "
        f"(median of {1 if args.quick else 3}): {runner_start_cpu(1 if args.quick else 3)}"
    )
    scores = {w.name: statistics.median(w.ratios()) for w in workloads}
    for workload in workloads:
        ratios = ", ".join(f"{r:.3f}" for r in workload.ratios())
        print(f"speed vs Spark, {workload.name}: median {scores[workload.name]:.3f} ({ratios})")
    metrics = {name: f"speed_vs_spark_{name.replace(' ', '_')}" for name in scores}
    for name, score in scores.items():
        if score < TARGETS[name]:
            print(f"MISS {metrics[name]}={score:.3f} is below the target {TARGETS[name]}")
    for workload in (*workloads, batches):
        pairs = zip(workload.runs["splitflow"], workload.runs["spark"], strict=True)
        if any((a.batches, a.empty) != (b.batches, b.empty) for a, b in pairs):
            print(f"MISS batches, {workload.name}: splitflow's differ from Spark's (see above)")
    print(
        "RESULT "
        + " ".join(f"{metrics[name]}={score:.3f}" for name, score in scores.items())
        + " target="
        + ",".join(f">={TARGETS[name]}" for name in scores)
    )


if __name__ == "__main__":
    main()
