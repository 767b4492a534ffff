"""Run a fault schedule against a workload and count every record.

:func:`run_schedule` starts the workload (its data keeps arriving), runs each of the
schedule's runs as a driver subprocess (``python -m tests.spark.jobs``, its own process
group, ``local[2,4]`` so that Spark retries a task whose Python worker died, with the
schedule's sink: Spark's file sink, or one that reads every batch twice), applies the
run's faults at their times after its first trigger (a batch, or a trigger that found
nothing new) and ends it by its fault, stops the workload's data, reads what is left with
``trigger(availableNow=True)`` at the final parallelism, and recounts the sink (the files
Spark's sink log lists, or the folders of the batches a ``foreachBatch`` sink wrote) against
the data with :meth:`~tests.faults.workloads.Workload.recount`. Linux only (tmpfs, process
groups).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from tests.faults import disk
from tests.faults.schedule import FILE_SINK, TWICE, Schedule, Step
from tests.faults.workloads import Count, Workload
from tests.spark.support import Job, log_ids, wait_until

MASTER = "local[2,4]"
"""Two cores, and up to four attempts of a task (a killed Python worker fails only one)."""
DISK_KINDS = ("disk-full", "disk-read-only")
"""Faults of the disk that holds the checkpoint and the state directory."""
KILLS = ("worker-kill", "executor-kill")
"""Faults of a running query's processes (not applied once the query stopped)."""


def extra_kinds(cluster: bool = False) -> tuple[str, ...]:
    """The faults this machine adds to every workload's: the disk's where this process may
    mount one, and ``executor-kill`` on a cluster (see :func:`~tests.faults.schedule.draw`)."""
    return (*(DISK_KINDS if disk.available() else ()), *(("executor-kill",) if cluster else ()))


@dataclass
class Outcome:
    """What a schedule did to the records."""

    schedule: Schedule
    count: Count
    applied: Counter[str] = field(default_factory=Counter)
    """Faults applied, by kind (a run's end counts once it killed a live driver;
    ``evaluate-twice`` once per schedule, when its last run completed)."""
    notes: list[str] = field(default_factory=list)
    """What happened besides: injected details, runs whose query failed by itself."""
    seconds: float = 0.0
    error: str | None = None
    """Why the schedule could not be counted: a run that never got a first trigger, or a
    final run that did not read everything (the count is then empty)."""
    leaks: list[str] = field(default_factory=list)
    """Where the workload's secret was found: files of the checkpoint, the state directory
    or the sink, and lines of the drivers' output and logs."""

    @property
    def ok(self) -> bool:
        no_loss = self.count.lost == 0 and self.count.duplicated == 0
        return self.error is None and no_loss and not self.leaks

    def line(self) -> str:
        c = self.count
        result = (
            f"ERROR {self.error}"
            if self.error
            else f"{c.records} records, lost={c.lost} duplicated={c.duplicated} skipped={c.skipped}"
        )
        leaks = f", the secret in {len(self.leaks)} places" if self.leaks else ""
        return (
            f"{'ok  ' if self.ok else 'FAIL'} {self.schedule.describe()} -> {result}{leaks} "
            f"({self.seconds:.0f}s)"
        )


def run_schedule(
    schedule: Schedule,
    workload: Workload,
    workdir: Path,
    *,
    master: str = MASTER,
    executors: Sequence[int] = (),
    state_store: Any = None,
) -> Outcome:
    """Run ``schedule`` on ``workload`` in ``workdir`` (created); see the module doc.

    ``master``: Spark's master (a standalone cluster's ``spark://...``); ``executors``: the
    PIDs under which its executors run (a cluster's worker daemons), where ``worker-kill``
    and ``executor-kill`` look for their victims besides the driver's own processes.
    ``state_store``: a ``tests.support.objectstores.StoreUnderTest`` to hold the query's
    ``stateDir`` (under ``state-<workload>-<seed>/``) instead of the local folder; the
    disk's faults do not apply then (draw the schedule without them), and the store's
    secrets must appear nowhere either.
    """
    if state_store is not None and set(DISK_KINDS) & set(schedule.kinds()):
        raise ValueError("the disk's faults do not apply with the state on an object store")
    began = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    rnd = random.Random(f"{schedule.workload}:{schedule.seed}:inject")
    out, log = workdir / "out", workdir / "jobs.log"
    applied: Counter[str] = Counter()
    notes: list[str] = []

    def outcome(count: Count, error: str | None = None, leaks: Sequence[str] = ()) -> Outcome:
        seconds = time.monotonic() - began
        return Outcome(schedule, count, applied, notes, seconds, error, list(leaks))

    with contextlib.ExitStack() as stack:
        drive = None
        if set(DISK_KINDS) & set(schedule.kinds()):
            drive = stack.enter_context(disk.Disk(workdir / "disk"))
        where = drive.path if drive else workdir
        checkpoint, local_state = where / "checkpoint", where / "state"
        state: Path | str = local_state
        if state_store is not None:
            state = state_store.url(f"state-{schedule.workload}-{schedule.seed}")
            workload.state_options = dict(state_store.options)

        def job(parallelism: int, trigger: str) -> Job:
            driver = Job(
                [
                    *workload.job_args(),
                    f"--out={out}",
                    f"--checkpoint={checkpoint}",
                    f"--parallelism={parallelism}",
                    f"--trigger={trigger}",
                    f"--master={master}",
                    f"--sink={schedule.sink}",
                    "--timeout=600",
                ],
                log,
            )
            stack.callback(driver.close)
            return driver

        try:
            stack.callback(workload.close)
            workload.start(workdir / "data", state)
            roots = (0, *executors)  # 0: each run's driver
            _runs(schedule, workload, job, checkpoint, rnd, applied, notes, roots, drive)
            workload.stop()
            for _ in range(workload.final_runs):
                final = job(schedule.final_parallelism, "availableNow")
                code = final.finish(600)
                final.close()
                if code != 0 or "TERMINATED" not in final.lines:
                    raise AssertionError(f"the final run failed ({code}): {final.lines[-3:]}")
            if schedule.sink != FILE_SINK:
                applied[TWICE] += 1
                notes.append(f"{TWICE}: every batch read twice ({schedule.sink})")
            count = workload.recount(out)
            leaks = _leaks(workload.secret, [checkpoint, local_state, out], log)
            if state_store is not None:
                leaks += _store_leaks(workload.secret, state_store, str(state))
                for secret in state_store.secrets():
                    leaks += _leaks(secret, [checkpoint, out], log)
        except (AssertionError, subprocess.TimeoutExpired) as failure:
            return outcome(Count(0, 0, 0), str(failure).replace("\n", " | ")[:2000])
    return outcome(count, None, leaks)


def _leaks(secret: str | None, folders: Sequence[Path], log: Path) -> list[str]:
    """Files under ``folders`` and lines of ``log`` that hold ``secret``; the lines that
    start the drivers (``$ jobs ...``: the harness passes it as an option) do not count."""
    if secret is None:
        return []
    found = [
        str(path)
        for folder in folders
        for path in (folder.rglob("*") if folder.is_dir() else [])
        if path.is_file() and secret.encode() in path.read_bytes()
    ]
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    found += [
        f"{log}: {line[:200]}" for line in lines if secret in line and not line.startswith("$ jobs")
    ]
    return found


def _store_leaks(secret: str | None, store: Any, url: str) -> list[str]:
    """Objects of the state directory ``url`` on ``store`` that hold ``secret``."""
    if secret is None:
        return []
    return [
        str(path)
        for path in store.fs.find(url)
        if secret.encode() in bytes(store.fs.cat_file(path))
    ]


def _runs(
    schedule: Schedule,
    workload: Workload,
    job: Callable[[int, str], Job],
    checkpoint: Path,
    rnd: random.Random,
    applied: Counter[str],
    notes: list[str],
    roots: Sequence[int],
    drive: disk.Disk | None,
) -> None:
    """The schedule's runs, each ended by its fault (see :func:`run_schedule`); ``roots``:
    where Spark's processes run (0 stands for the run's driver)."""
    for number, run in enumerate(schedule.runs, 1):
        driver = job(run.parallelism, "500ms")
        try:
            wait_until(
                f"run {number}'s first trigger",
                lambda driver=driver: driver.check_alive() and driver.triggered(),
                240,
            )
            first = time.monotonic()
            for step in run.steps:
                _sleep_until(first + step.at)
                if driver.process.poll() is not None and step.kind in KILLS:
                    done = f"{step.kind}: not applied: the query had stopped"
                else:  # the source's and the disk's faults hit a stopped query too
                    where = [root or driver.process.pid for root in roots]
                    done = _apply(step, workload, where, checkpoint, rnd, drive)
                notes.append(f"run {number}: {done}")
                if ": not applied: " not in done:
                    applied[step.kind] += 1
            ended = _end(run.end, first, driver, checkpoint)
            if ended is not None:
                applied[ended] += 1
            else:
                last = driver.lines[-1] if driver.lines else ""
                notes.append(f"run {number} ended by itself: {last[:300]}")
        finally:
            driver.close()


def _sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.monotonic()))


def _in_flight(checkpoint: Path) -> int | None:
    """A batch whose offset is written and whose commit is not, if any."""
    pending = set(log_ids(checkpoint, "offsets")) - set(log_ids(checkpoint, "commits"))
    return min(pending, default=None)


def _end(end: Step, first: float, driver: Job, checkpoint: Path) -> str | None:
    """End the run by its fault; the kind applied (``driver-kill-in-flight`` only when a
    batch was in flight, else ``driver-kill``), or None when the driver had exited."""
    _sleep_until(first + end.at)
    if end.kind == "driver-kill-in-flight":
        with contextlib.suppress(AssertionError):  # none for a minute: killed at any moment
            wait_until(
                "a batch in flight",
                lambda: driver.process.poll() is not None or _in_flight(checkpoint) is not None,
                60,
                step=0.01,
            )
    if driver.process.poll() is not None:
        return None
    in_flight = _in_flight(checkpoint) is not None
    driver.kill()
    return "driver-kill-in-flight" if in_flight and end.kind != "driver-kill" else "driver-kill"


def _apply(
    step: Step,
    workload: Workload,
    roots: Sequence[int],
    checkpoint: Path,
    rnd: random.Random,
    drive: disk.Disk | None,
) -> str:
    if step.kind in DISK_KINDS and drive is not None:
        seconds = round(rnd.uniform(2, 4), 1)
        return drive.full_for(seconds) if step.kind == "disk-full" else drive.read_only_for(seconds)
    if step.kind == "worker-kill":
        return _kill(step.kind, python_workers(roots), checkpoint, rnd, busy=True)
    if step.kind == "executor-kill":
        return _kill(step.kind, executors_under(roots), checkpoint, rnd)
    return workload.inject(step.kind, rnd)


def _kill(
    kind: str,
    candidates: Callable[[], list[int]],
    checkpoint: Path,
    rnd: random.Random,
    *,
    busy: bool = False,
) -> str:
    """SIGKILL one of ``candidates()``, once a batch is in flight if one comes within 10 s
    (Spark retries the tasks that ran in it); with ``busy``, one that used CPU in the
    last 0.2 s (a Python worker between tasks sleeps: killing it fails no task)."""
    with contextlib.suppress(AssertionError):
        wait_until("a batch in flight", lambda: _in_flight(checkpoint) is not None, 10, step=0.01)
    victims = candidates()
    if busy:
        before = {pid: _cpu_seconds(pid) for pid in victims}
        time.sleep(0.2)
        victims = [pid for pid in victims if _cpu_seconds(pid) > before[pid]]
    if not victims:
        return f"{kind}: not applied: none {'busy' if busy else 'alive'}"
    victim = rnd.choice(sorted(victims))
    try:
        os.kill(victim, signal.SIGKILL)
    except ProcessLookupError:
        return f"{kind}: not applied: {victim} had exited"
    return f"{kind}: killed {victim} (batch in flight: {_in_flight(checkpoint)})"


def _cpu_seconds(pid: int) -> float:
    """CPU time process ``pid`` used so far (user + system); -1 if it is gone."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return -1.0
    return float(times.user + times.system)


def _under(roots: Sequence[int], matches: Callable[[psutil.Process], bool]) -> list[int]:
    """The PIDs of the processes below ``roots`` (or one of them) that ``matches`` takes."""
    found = set()
    for root in roots:
        try:
            process = psutil.Process(root)
            family = [process, *process.children(recursive=True)]
        except psutil.Error:
            continue
        for process in family:
            with contextlib.suppress(psutil.Error):  # gone meanwhile
                if matches(process):
                    found.add(process.pid)
    return sorted(found)


def _runs_daemon(process: psutil.Process | None) -> bool:
    return process is not None and "pyspark.daemon" in " ".join(process.cmdline())


def python_workers(roots: Sequence[int]) -> Callable[[], list[int]]:
    """PySpark Python workers under ``roots``: children of a ``pyspark.daemon`` process that
    run the daemon's code too (the workers it forked; the daemon itself is spared)."""

    return lambda: _under(roots, lambda p: _runs_daemon(p) and _runs_daemon(p.parent()))


def executors_under(roots: Sequence[int]) -> Callable[[], list[int]]:
    """Executor JVMs (``CoarseGrainedExecutorBackend``) under ``roots``."""
    return lambda: _under(roots, lambda p: "CoarseGrainedExecutorBackend" in " ".join(p.cmdline()))
