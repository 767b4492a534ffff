"""Fault schedules: drawn from a seed, so a failing one can be replayed.

A schedule is two or three *runs* of the driver, each at its own ``parallelism`` (so every
restart may rescale), with faults *during* the run at given seconds after its first trigger,
and an *end*: the driver's whole process group SIGKILLed at a moment
(``driver-kill``) or while a batch is planned and not committed (``driver-kill-in-flight``:
the sink may have written its files, Spark has not committed the batch). Then a final run
reads everything left with ``trigger(availableNow=True)``.

Faults during a run: ``worker-kill`` (a Python worker SIGKILLed while a batch is in flight;
Spark retries its task) and the workload's own kinds (files or topics appearing and
vanishing, the broker or database stopped and started, a database's connections killed,
a full disk).

A fault of the whole schedule: ``evaluate-twice``, a sink that reads every batch twice
(a ``foreachBatch`` that writes the batch and counts it, in an order drawn from the seed:
``write-count`` or ``count-write``, see ``tests.spark.jobs.ForeachBatchSink``), as a job
with several actions on a batch, a ``MERGE`` or a recomputed stage does. Drawn only for
a workload whose recount reads such a sink (CDC), in about half of its schedules.

>>> draw(7, "files", ("file-vanish",)) == draw(7, "files", ("file-vanish",))
True
>>> for part in draw(1, "generator", ()).describe().split(" | "):
...     print(part)
generator seed 1: run 1 p=2 [worker-kill@2.0s] end driver-kill-in-flight@3.3s
run 2 p=2 [worker-kill@1.3s] end driver-kill-in-flight@4.3s
run 3 p=1 [] end driver-kill@1.7s
final p=3
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

ENDS = ("driver-kill", "driver-kill-in-flight")
"""How a run ends (every run but the final one ends by a fault)."""
COMMON = ("worker-kill",)
"""Faults any workload takes during a run."""
TWICE = "evaluate-twice"
"""The fault of a schedule whose sink reads every batch twice (:attr:`Schedule.sink`)."""
FILE_SINK = "parquet"
"""Spark's file sink: each batch read once."""


@dataclass(frozen=True)
class Step:
    """Fault ``kind`` at ``at`` seconds after the run's first completed batch."""

    at: float
    kind: str

    def __str__(self) -> str:
        return f"{self.kind}@{self.at:.1f}s"


@dataclass(frozen=True)
class Run:
    parallelism: int
    steps: tuple[Step, ...]
    end: Step
    """``driver-kill`` at ``at`` seconds (after the last step), or ``driver-kill-in-flight``
    once ``at`` seconds have passed and a batch is in flight."""


@dataclass(frozen=True)
class Schedule:
    seed: int
    workload: str
    runs: tuple[Run, ...]
    final_parallelism: int
    sink: str = FILE_SINK
    """The driver's ``--sink`` (``tests.spark.jobs``): :data:`FILE_SINK`, or a mode that
    reads every batch twice (``write-count``, ``count-write``: fault :data:`TWICE`)."""

    def kinds(self) -> list[str]:
        """Every fault of the schedule, in order (:data:`TWICE` first, run ends included)."""
        twice = [] if self.sink == FILE_SINK else [TWICE]
        runs = [k for run in self.runs for k in [*(s.kind for s in run.steps), run.end.kind]]
        return [*twice, *runs]

    def describe(self) -> str:
        runs = " | ".join(
            f"run {i} p={run.parallelism} [{', '.join(map(str, run.steps))}] end {run.end}"
            for i, run in enumerate(self.runs, 1)
        )
        sink = "" if self.sink == FILE_SINK else f" | sink {self.sink} ({TWICE})"
        return f"{self.workload} seed {self.seed}: {runs} | final p={self.final_parallelism}{sink}"


def draw(
    seed: int,
    workload: str,
    kinds: Sequence[str],
    extra: Sequence[str] = (),
    sinks: Sequence[str] = (),
) -> Schedule:
    """The schedule of ``seed`` for ``workload``, whose own fault kinds are ``kinds``.

    Each run has up to two faults during it (``worker-kill`` or one of ``kinds``), at most
    4 s after its first trigger, and ends within 4 s after its last fault. ``extra``: kinds
    that depend on the machine (a disk to mount, a cluster's executors), drawn from a
    stream of their own, so that the rest of a seed's schedule is the same with or without
    them: one of them, at a time before the run's end, in about half of the runs.
    ``sinks``: the sinks that read every batch twice which the workload can recount; one
    of them (fault :data:`TWICE`) in about half of the schedules, from a stream of its own
    too.

    >>> [draw(s, "cdc", (), sinks=("write-count", "count-write")).sink for s in (2, 3, 9)]
    ['count-write', 'parquet', 'write-count']
    """
    rnd = random.Random(f"{workload}:{seed}")
    more = random.Random(f"{workload}:{seed}:extra")
    twice = random.Random(f"{workload}:{seed}:sink")
    during = (*COMMON, *kinds)
    runs = []
    for _ in range(rnd.randint(2, 3)):
        times = sorted(round(rnd.uniform(0, 4), 1) for _ in range(rnd.randint(0, 2)))
        steps = [Step(at, rnd.choice(during)) for at in times]
        end = Step(round((times[-1] if times else 0) + rnd.uniform(0.5, 4), 1), rnd.choice(ENDS))
        if extra and more.random() < 0.5:
            steps.append(Step(round(more.uniform(0, end.at), 1), more.choice(extra)))
        runs.append(Run(rnd.randint(1, 3), tuple(sorted(steps, key=lambda s: s.at)), end))
    sink = twice.choice(sinks) if sinks and twice.random() < 0.5 else FILE_SINK
    return Schedule(seed, workload, tuple(runs), rnd.randint(1, 3), sink)
