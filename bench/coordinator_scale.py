"""How the source coordinator scales with the number of splits: 10k vs 100k over 1,000 readers.

Runs the real :class:`~splitflow.coordinator.SourceCoordinator` on a
:class:`~splitflow.coordinator.ManualScheduler` (everything on this thread, virtual clock)
with the :class:`~splitflow.testing.sequence.SequenceSource` enumerator (balanced
assignment) over a :class:`~splitflow.testing.sequence.SequenceCatalog` of ``N`` splits, and
times four phases end to end:

1. ``start+register``: start the coordinator (its first discovery finds an empty catalog)
   and register every reader.
2. ``assign``: the catalog gets ``N`` splits (not timed); the next periodic discovery finds
   them and the enumerator assigns all of them (one ``AddSplits`` per reader).
3. ``checkpoint``: ``coordinator.checkpoint(id)``, encode the full
   :class:`~splitflow.coordinator.Checkpoint` (enumerator state and every reader's splits)
   with ``to_json``, release the held messages, ``notify_checkpoint_complete``.
4. ``restore``: a global restore at the same parallelism: decode the checkpoint, start a new
   coordinator with the enumerator state, every reader registers with the splits
   :func:`~splitflow.coordinator.redistribute_reader_states` gives it, and the enumerator
   redistributes them (the new coordinator's first discovery, which finds nothing new, runs
   too).

No reader runs: the gateway counts messages and keeps the splits each reader was sent, which
stands in for that reader's state. At the checkpoint every reader has "read" its splits to a
seven-digit position (done outside the timed phases: readers snapshot in parallel, not on the
coordinator thread), so the checkpoint size per split is that of a realistic split.

Each size is run ``--reps`` times, the sizes interleaved within a repetition so that machine
noise hits both, with ``gc.collect()`` before every run. Times are medians; a ratio is the
median over repetitions of the ratio of the two runs of that repetition.

Output: one table per size (phase times, total, time per split, checkpoint bytes per split,
splits moved by the restore, load spread after assignment and after the restore), the ratios
side by side, and a last line ``RESULT growth_100k_over_10k=<total time ratio> target=<=15``.
Linear growth gives 10. A ratio above 15 prints a ``MISS`` line before ``RESULT``; the exit
code is 0 either way (a failed correctness check, e.g. a split lost, exits 1).

``--quick`` (under a minute, for ``make bench-quick``) runs 1k vs 10k splits over 100
readers and ends with ``RESULT growth_10k_over_1k=<ratio> target=<=15``: the
same metric (ten times the splits, the same splits per reader as the full run) under a name
that states the sizes it used.

Usage::

    python bench/coordinator_scale.py            # 10k vs 100k splits, 1,000 readers
    python bench/coordinator_scale.py --quick    # 1k vs 10k splits, 100 readers
    python bench/coordinator_scale.py --quick --readers 4000 --reps 1   # vary parallelism
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TypeVar

from splitflow.api.assigner import AssignerState
from splitflow.api.split import with_position
from splitflow.coordinator import (
    AddSplits,
    Checkpoint,
    ManualScheduler,
    ReaderMessage,
    SourceCoordinator,
    redistribute_reader_states,
)
from splitflow.testing.sequence import SequenceCatalog, SequenceSource, SequenceSplit

T = TypeVar("T")
State = AssignerState[SequenceSplit]
Coordinator = SourceCoordinator[SequenceSplit, State]

TARGET = 15.0
DISCOVERY_INTERVAL = 60.0  # virtual seconds; phase 2 advances the clock by this much
PHASES = ("start+register", "assign", "checkpoint", "restore")


class CountingGateway:
    """Counts messages; keeps the splits each reader was sent (the stand-in for its state)."""

    def __init__(self, parallelism: int) -> None:
        self.messages = 0
        self.splits: dict[int, list[SequenceSplit]] = {r: [] for r in range(parallelism)}

    def send(self, reader_id: int, message: ReaderMessage[SequenceSplit]) -> None:
        self.messages += 1
        if isinstance(message, AddSplits):
            self.splits[reader_id].extend(message.splits)

    def owners(self) -> dict[str, int]:
        return {s.split_id: r for r, ss in self.splits.items() for s in ss}

    def spread(self) -> int:
        counts = [len(ss) for ss in self.splits.values()]
        return max(counts) - min(counts)


@dataclass(frozen=True)
class Run:
    """One measured run of one size. Times in seconds."""

    splits: int
    readers: int
    times: Mapping[str, float]
    checkpoint_bytes: int
    moved: int
    spread_assigned: int
    spread_restored: int
    messages: int

    @property
    def total(self) -> float:
        return sum(self.times.values())


class BenchError(Exception):
    """The coordinator did not do what the benchmark needs (a correctness failure)."""


def _run_until_idle(scheduler: ManualScheduler, futures: Sequence[Future[T]]) -> list[T]:
    """Run the coordinator until idle; every future must then have completed successfully."""
    scheduler.run_until_idle()
    for future in futures:
        if not future.done():
            raise BenchError("a coordinator call did not complete on run_until_idle()")
    return [future.result() for future in futures]


def _timed(times: dict[str, float], phase: str, fn: Callable[[], T]) -> T:
    start = time.perf_counter()
    value = fn()
    times[phase] = time.perf_counter() - start
    return value


def run_once(n_splits: int, readers: int, checkpoint_id: int = 1) -> Run:
    names = [f"topic-{i:06d}" for i in range(n_splits)]
    catalog = SequenceCatalog()
    source = SequenceSource(catalog, discovery_interval=DISCOVERY_INTERVAL)
    times: dict[str, float] = {}

    # 1. start + register every reader (the first discovery finds an empty catalog).
    scheduler = ManualScheduler()
    gateway = CountingGateway(readers)
    coordinator: Coordinator = SourceCoordinator(source, readers, gateway, scheduler=scheduler)

    def start_and_register() -> None:
        futures = [coordinator.start()]
        futures += [coordinator.register_reader(r, f"host-{r % 50}") for r in range(readers)]
        _run_until_idle(scheduler, futures)

    _timed(times, "start+register", start_and_register)

    # 2. discover and assign every split.
    for name in names:  # the external system gets its splits: not the coordinator's work
        catalog.add(name)
    _timed(times, "assign", lambda: scheduler.advance(DISCOVERY_INTERVAL))
    if coordinator.failure is not None:
        raise BenchError(f"assignment failed: {coordinator.failure!r}") from coordinator.failure
    owners = gateway.owners()
    if len(owners) != n_splits or sum(map(len, gateway.splits.values())) != n_splits:
        raise BenchError(f"{len(owners)} of {n_splits} splits assigned (or some twice)")
    spread_assigned = gateway.spread()

    # Readers read and snapshot their splits (in parallel, on their executors: not timed).
    reader_states = {
        r: tuple(with_position(s, 1_000_000 + i) for i, s in enumerate(ss))
        for r, ss in gateway.splits.items()
    }

    # 3. checkpoint: snapshot, encode everything, release held messages, complete.
    def checkpoint() -> str:
        (state,) = _run_until_idle(scheduler, [coordinator.checkpoint(checkpoint_id)])
        encoded = Checkpoint(checkpoint_id, state, reader_states).to_json(source)
        _run_until_idle(
            scheduler,
            [
                coordinator.release_held_messages(),
                coordinator.notify_checkpoint_complete(checkpoint_id),
            ],
        )
        return encoded

    encoded = _timed(times, "checkpoint", checkpoint)
    coordinator.close()

    # 4. global restore at the same parallelism.
    restored_gateway = CountingGateway(readers)
    restored_scheduler = ManualScheduler()

    def restore() -> Coordinator:
        decoded = Checkpoint.decode(json.loads(encoded), source)
        states = redistribute_reader_states(decoded.readers, readers)
        restored: Coordinator = SourceCoordinator(
            source,
            readers,
            restored_gateway,
            scheduler=restored_scheduler,
            restored_state=decoded.enumerator,
        )
        futures = [restored.start()]
        futures += [
            restored.register_reader(r, f"host-{r % 50}", states[r]) for r in range(readers)
        ]
        _run_until_idle(restored_scheduler, futures)
        return restored

    restored = _timed(times, "restore", restore)
    if restored.failure is not None:
        raise BenchError(f"restore failed: {restored.failure!r}") from restored.failure
    restored_owners = restored_gateway.owners()
    if restored_owners.keys() != owners.keys():
        raise BenchError(f"restore assigned {len(restored_owners)} of {n_splits} splits")
    moved = sum(1 for sid, r in restored_owners.items() if owners[sid] != r)
    restored.close()

    return Run(
        splits=n_splits,
        readers=readers,
        times=times,
        checkpoint_bytes=len(encoded.encode()),
        moved=moved,
        spread_assigned=spread_assigned,
        spread_restored=restored_gateway.spread(),
        messages=gateway.messages + restored_gateway.messages,
    )


def _label(n: int) -> str:
    return f"{n // 1000}k" if n % 1000 == 0 else str(n)


def _median_time(runs: Sequence[Run], phase: str) -> float:
    return statistics.median(run.total if phase == "total" else run.times[phase] for run in runs)


def print_table(runs: Sequence[Run]) -> None:
    n, readers = runs[0].splits, runs[0].readers
    print(f"\n== {n:,} splits over {readers:,} readers (median of {len(runs)} runs)")
    print(f"{'phase':<16}{'ms':>10}{'us/split':>10}")
    for phase in (*PHASES, "total"):
        t = _median_time(runs, phase)
        print(f"{phase:<16}{t * 1e3:10.1f}{t / n * 1e6:10.2f}")
    size = runs[0].checkpoint_bytes
    print(f"checkpoint JSON: {size:,} bytes, {size / n:.1f} bytes/split")
    print(f"messages to readers (assign + restore): {max(run.messages for run in runs):,}")
    print(f"splits moved by the restore: {max(run.moved for run in runs)} (expected 0)")
    print(
        "load spread, max-min splits per reader: "
        f"after assignment {max(run.spread_assigned for run in runs)}, "
        f"after restore {max(run.spread_restored for run in runs)} (expected <= 1)"
    )


def paired_ratio(small: Sequence[Run], big: Sequence[Run], of: Callable[[Run], float]) -> float:
    """Median over repetitions of ``of(big) / of(small)``, the two runs of one repetition."""
    return statistics.median(of(b) / of(s) for s, b in zip(small, big, strict=True))


def print_ratios(small: Sequence[Run], big: Sequence[Run]) -> float:
    """Print every phase of both sizes side by side; return the total time ratio."""
    s_label, b_label = _label(small[0].splits), _label(big[0].splits)
    scale = big[0].splits / small[0].splits
    print(f"\n== {b_label} vs {s_label}: linear = {scale:g}; ratio: median of per-repetition ones")
    print(f"{'phase':<16}{s_label + ' ms':>10}{b_label + ' ms':>10}{'ratio':>8}")
    for phase in (*PHASES, "total"):

        def of(run: Run, phase: str = phase) -> float:
            return run.total if phase == "total" else run.times[phase]

        print(
            f"{phase:<16}{_median_time(small, phase) * 1e3:10.1f}"
            f"{_median_time(big, phase) * 1e3:10.1f}{paired_ratio(small, big, of):8.2f}"
        )
    size_ratio = big[0].checkpoint_bytes / small[0].checkpoint_bytes
    print(f"{'checkpoint bytes':<36}{size_ratio:8.2f}")
    return paired_ratio(small, big, lambda run: run.total)


def balance_misses(runs: Sequence[Run]) -> list[str]:
    """What went against the balance expectations, worst case over ``runs``."""
    n = runs[0].splits
    moved = max(run.moved for run in runs)
    spreads = {
        "assignment": max(run.spread_assigned for run in runs),
        "restore": max(run.spread_restored for run in runs),
    }
    misses = [f"{n:,} splits: the restore moved {moved} splits, expected 0"] if moved else []
    misses += [
        f"{n:,} splits: load spread {spread} after {after}, expected <= 1"
        for after, spread in spreads.items()
        if spread > 1
    ]
    return misses


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="1k vs 10k splits, 100 readers")
    parser.add_argument("--reps", type=int, default=5, help="repetitions per size (default 5)")
    parser.add_argument("--readers", type=int, help="parallelism (default 1,000; 100 quick)")
    args = parser.parse_args(argv)
    small_n, big_n, readers = (1_000, 10_000, 100) if args.quick else (10_000, 100_000, 1_000)
    readers = args.readers or readers

    command = " ".join(["python", "bench/coordinator_scale.py", *sys.argv[1:]])
    print(f"$ {command}")
    print(
        f"coordinator_scale: {small_n:,} vs {big_n:,} splits over {readers:,} readers, "
        f"{args.reps} repetitions; python {platform.python_version()}, "
        f"{os.cpu_count()} cpus, {platform.machine()}"
    )
    small: list[Run] = []
    big: list[Run] = []
    try:
        run_once(small_n, readers)  # warm-up: imports and first-call costs
        for rep in range(args.reps):
            order = [(small_n, small), (big_n, big)]
            if rep % 2:
                order.reverse()  # interleave, so that slow moments of the machine hit both
            for n, runs in order:
                gc.collect()
                runs.append(run_once(n, readers))
    except BenchError as exc:
        print(f"FAILED: {exc}")
        return 1
    print_table(small)
    print_table(big)
    growth = print_ratios(small, big)

    metric = f"growth_{_label(big_n)}_over_{_label(small_n)}"
    misses = balance_misses(small) + balance_misses(big)
    if growth > TARGET:
        misses.append(f"{metric}={growth:.2f} is above {TARGET:g}: super-linear growth")
    for miss in misses:
        print(f"MISS {miss}")
    print(f"RESULT {metric}={growth:.2f} target=<={TARGET:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
