"""Planning time and state bytes written per micro-batch, with ``stateDir`` on a local folder,
on S3 (moto's server) and on Azure Blob (Azurite), at 1k and 10k splits, side by side.

Runs the real :class:`~splitflow.spark.planner.Planner` (no Spark, no pyspark import), as
``bench/planning_scale.py`` does, on the :class:`~splitflow.testing.sequence.SequenceSource`
over ``N`` splits with 8 reader slots, its state directory a
:class:`~splitflow.spark.statedir.StateStore` on one of the three stores. The object stores
are real servers on ``127.0.0.1`` (``tests/support/objectstores.py``): every state request
is an HTTP request through s3fs or adlfs, as on a cluster, minus the network's latency.

Each batch, as a files query that keeps receiving data: 10% of the splits (a window that
moves) get 10 records more, and 10 new splits arrive already complete (sealed), so the
enumerator finishes splits every batch and its ledger changes every batch (a delta object
per batch, a snapshot every 10). One batch is what Spark's driver does, timed as
``planning`` (the sum):

=================  ===========================================================================
``latestOffset``   ``Planner.latest_offset`` with JSON in and out: the owner token is read,
                   the last batch's reader events are listed and read, the ledger delta or
                   snapshot is written
``partitions``     the end offset handed back, ``plan_partitions``
``commit``         ``Planner.commit`` of the batch before: the applied events and the ledger
                   files older than the snapshot are deleted
=================  ===========================================================================

Then each task of the batch writes its reader events (``events/<batch>/<task>``, as
``SplitflowDataSource`` does on an executor): timed apart as ``tasks`` (on a cluster the
executors write them in parallel, not the driver), but their bytes count.

Every request to the store is counted by wrapping the ``StateStore``'s methods (``put``,
``create``, ``get``, ``names``, ``delete``), with the bytes ``put`` and ``create`` write.
Each size runs ``--reps`` times (3) with the stores interleaved in alternating order;
``--batches`` (8) timed batches per run after a first (untimed) batch that reads the initial
records. Tables show medians over repetitions of the per-run medians.

The last line is ``RESULT planning_ratio_10k=<worst object store / local> target=<=2.0``:
planning time per batch on the slower object store over the local folder, at 10k splits.
``--quick`` (under a minute) runs 1k splits only and reports ``planning_ratio_1k``, which
is not the 10k figure (at 1k the fixed cost of the requests weighs ten times more: no
``MISS`` is printed for it). A missed target at 10k prints ``MISS`` before ``RESULT``; the
exit code is 0 either way (a failed correctness check exits 1). A store whose server is
not installed is skipped, and said.

Usage::

    python bench/state_store.py            # 1k and 10k splits, local vs S3 vs Azure
    python bench/state_store.py --quick    # 1k splits, 2 repetitions of 4 batches
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support

from tests.support.objectstores import Azurite, MotoS3, azurite_installed, moto_installed

from splitflow.api.assigner import AssignerState
from splitflow.spark.events import EventStore
from splitflow.spark.limits import ReadAll
from splitflow.spark.offset import plan_partitions
from splitflow.spark.planner import Planner, collect_garbage_less_often
from splitflow.spark.statedir import StateStore
from splitflow.testing.sequence import SequenceCatalog, SequenceSource, SequenceSplit

TARGET_RATIO = 2.0
PARALLELISM = 8
INITIAL_RECORDS = 100
APPEND_RECORDS = 10
APPEND_FRACTION = 0.10
NEW_SPLITS = 10
PHASES = ("latestOffset", "partitions", "commit")
REQUESTS = ("get", "names", "put", "create", "delete")
State = AssignerState[SequenceSplit]


class BenchError(Exception):
    """The planner did not do what the benchmark needs (a correctness failure)."""


class CountingStore(StateStore):
    """A StateStore that counts its requests and the bytes it writes."""

    def __init__(self, url: str, options: dict[str, Any]) -> None:
        super().__init__(url, options)
        self.calls: dict[str, int] = dict.fromkeys(REQUESTS, 0)
        self.written = 0

    def put(self, path: str, content: bytes) -> None:
        self.calls["put"] += 1
        self.written += len(content)
        super().put(path, content)

    def create(self, path: str, content: bytes) -> bool:
        self.calls["create"] += 1
        self.written += len(content)
        return super().create(path, content)

    def get(self, path: str) -> bytes | None:
        self.calls["get"] += 1
        return super().get(path)

    def names(self, folder: str) -> list[str]:
        self.calls["names"] += 1
        return super().names(folder)

    def delete(self, path: str, *, folder: bool = False) -> None:
        self.calls["delete"] += 1
        super().delete(path, folder=folder)

    def snapshot(self) -> tuple[dict[str, int], int]:
        return dict(self.calls), self.written


@dataclass
class Store:
    """One kind of state directory: ``new(name)`` gives a fresh, empty one."""

    name: str
    new: Callable[[str], CountingStore]


@dataclass
class Run:
    """One run of one store at one size: medians over its batches."""

    store: str
    splits: int
    times: dict[str, float] = field(default_factory=dict)  # phase -> seconds
    bytes_planning: float = 0.0  # bytes the driver writes per batch
    bytes_tasks: float = 0.0  # bytes the tasks write per batch
    requests: dict[str, float] = field(default_factory=dict)  # per batch, driver + tasks

    @property
    def planning(self) -> float:
        return sum(self.times[p] for p in PHASES)


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run_once(store: Store, n_splits: int, batches: int, tag: str) -> Run:
    """One query of ``batches`` timed batches on a fresh state directory of ``store``."""
    names = [f"topic-{i:06d}" for i in range(n_splits)]
    catalog = SequenceCatalog(dict.fromkeys(names, INITIAL_RECORDS))
    source = SequenceSource(catalog, discovery_interval=1.0)
    state = store.new(tag)
    clock = Clock()
    planner: Planner[SequenceSplit, State] = Planner(
        source, PARALLELISM, clock=clock, state_dir=state
    )
    events = EventStore(state)

    def tasks(end: dict[str, Any]) -> int:
        offset = planner.planned(end)
        planned = plan_partitions(offset, None)
        for index, (slot, _slices) in enumerate(planned):
            events.write(offset.seq, index, slot, [])  # what every task writes
        return len(planned)

    def plan(start: str) -> str:
        return json.dumps(planner.latest_offset(json.loads(start), ReadAll()))

    def partitions(end: str) -> int:
        return len(plan_partitions(planner.planned(json.loads(end)), None))

    def commit(end: str) -> None:
        planner.commit(json.loads(end))

    start = json.dumps(planner.initial_offset())
    clock.now += 1.0
    end = json.dumps(planner.latest_offset(json.loads(start), ReadAll()))
    tasks(json.loads(end))  # the first batch reads the initial records: not timed
    previous, start = start, end
    samples: dict[str, list[float]] = {p: [] for p in (*PHASES, "tasks")}
    written: dict[str, list[int]] = {"planning": [], "tasks": []}
    requests: dict[str, list[int]] = {r: [] for r in REQUESTS}
    count = max(1, int(n_splits * APPEND_FRACTION))
    for batch in range(batches):
        for i in range(batch * count, (batch + 1) * count):
            catalog.append(names[i % n_splits], APPEND_RECORDS)
        for i in range(NEW_SPLITS):
            name = f"new-{batch:04d}-{i:02d}"
            catalog.add(name, APPEND_RECORDS)
            catalog.seal(name)
        clock.now += 1.0
        calls0, bytes0 = state.snapshot()
        t, end = _timed(partial(plan, start))
        samples["latestOffset"].append(t)
        if end == start:
            raise BenchError(f"{store.name}: batch {batch} planned nothing, data was appended")
        parsed = json.loads(end)
        samples["partitions"].append(_timed(partial(partitions, end))[0])
        # Spark commits batch k after it planned batch k + 1
        samples["commit"].append(_timed(partial(commit, previous))[0])
        _, bytes1 = state.snapshot()
        t, _ = _timed(partial(tasks, parsed))
        samples["tasks"].append(t)
        calls2, bytes2 = state.snapshot()
        written["planning"].append(bytes1 - bytes0)
        written["tasks"].append(bytes2 - bytes1)
        for r in REQUESTS:
            requests[r].append(calls2[r] - calls0[r])
        previous, start = start, end
    planner.close()
    if json.loads(start)["ledger"]["size"] < NEW_SPLITS * (batches - 1):
        raise BenchError(f"{store.name}: the ledger does not hold the finished splits")
    run = Run(store.name, n_splits)
    run.times = {p: statistics.median(ts) for p, ts in samples.items()}
    run.bytes_planning = statistics.median(written["planning"])
    run.bytes_tasks = statistics.median(written["tasks"])
    run.requests = {r: statistics.mean(c) for r, c in requests.items()}
    return run


def _label(n: int) -> str:
    return f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else str(n)


def _phase_ms(run: Run, phase: str) -> float:
    return run.times[phase] * 1e3


def _requests(run: Run, request: str) -> float:
    return run.requests[request]


def print_table(n: int, by_store: dict[str, list[Run]]) -> None:
    reps = len(next(iter(by_store.values())))
    print(f"\n== {n:,} splits, parallelism {PARALLELISM} (median of {reps} runs)")
    names = list(by_store)
    print(f"{'per batch':<22}" + "".join(f"{s:>12}" for s in names))

    def row(label: str, of: Callable[[Run], float], fmt: str) -> None:
        values = [statistics.median(of(r) for r in by_store[s]) for s in names]
        print(f"{label:<22}" + "".join(format(v, fmt).rjust(12) for v in values))

    for phase in PHASES:
        row(f"  {phase} ms", partial(_phase_ms, phase=phase), ".1f")
    row("planning ms", lambda r: r.planning * 1e3, ".1f")
    row("tasks' writes ms", lambda r: r.times["tasks"] * 1e3, ".1f")
    row("bytes written, driver", lambda r: r.bytes_planning, ",.0f")
    row("bytes written, tasks", lambda r: r.bytes_tasks, ",.0f")
    for req in REQUESTS:
        row(f"requests: {req}", partial(_requests, request=req), ".1f")
    local = by_store.get("local")
    if local:
        for s in names[1:]:
            ratio = ratio_of(by_store[s], local)
            print(f"planning time {s}/local: {ratio:.2f}")


def ratio_of(runs: Sequence[Run], local: Sequence[Run]) -> float:
    """Median over repetitions of planning time on the store over local."""
    return statistics.median(r.planning / b.planning for r, b in zip(runs, local, strict=True))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="1k splits, 2 reps of 4 batches")
    parser.add_argument("--reps", type=int, default=None, help="repetitions (default 3)")
    parser.add_argument("--batches", type=int, default=None, help="timed batches (default 8)")
    parser.add_argument("--sizes", help="comma-separated split counts (default 1000,10000)")
    args = parser.parse_args(argv)
    reps = args.reps or (2 if args.quick else 3)
    batches = args.batches or (4 if args.quick else 8)
    sizes = [1_000] if args.quick else [1_000, 10_000]
    if args.sizes:
        sizes = sorted(int(n) for n in args.sizes.split(","))
    collect_garbage_less_often()  # what the streaming runner does

    print(f"$ {' '.join(['python', 'bench/state_store.py', *sys.argv[1:]])}")
    print(
        f"state_store: {', '.join(f'{n:,}' for n in sizes)} splits, parallelism {PARALLELISM}, "
        f"{reps} repetitions of {batches} batches; python {platform.python_version()}, "
        f"{os.cpu_count()} cpus, {platform.machine()}"
    )
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        stores = [Store("local", lambda tag: CountingStore(str(workdir / "local" / tag), {}))]
        if moto_installed():
            s3 = stack.enter_context(MotoS3.start(workdir))
            bucket = s3.create_bucket("state")
            s3_options = {**s3.storage_options(), "skip_instance_cache": True}
            stores.append(Store("s3", lambda tag: CountingStore(s3.url(bucket, tag), s3_options)))
        else:
            print("s3: skipped, moto's server is not installed (pip install -e '.[objectstore]')")
        if azurite_installed():
            az = stack.enter_context(Azurite.start(workdir))
            container = az.create_container("state")
            az_options = {**az.storage_options(), "skip_instance_cache": True}
            stores.append(
                Store("azure", lambda tag: CountingStore(az.url(container, tag), az_options))
            )
        else:
            print("azure: skipped, Azurite is not installed (run scripts/bootstrap.sh)")
        results: dict[int, dict[str, list[Run]]] = {}
        try:
            for store in stores:  # warm-up: imports, clients, first-call costs
                run_once(store, 100, 2, "warmup")
            for n in sizes:
                by_store: dict[str, list[Run]] = {s.name: [] for s in stores}
                for rep in range(reps):
                    for store in stores if rep % 2 == 0 else reversed(stores):
                        gc.collect()
                        by_store[store.name].append(run_once(store, n, batches, f"{n}-{rep}"))
                results[n] = by_store
                print_table(n, by_store)
        except BenchError as exc:
            print(f"FAILED: {exc}")
            return 1
    biggest = sizes[-1]
    by_store = results[biggest]
    ratios = {s: ratio_of(runs, by_store["local"]) for s, runs in by_store.items() if s != "local"}
    if not ratios:
        print("no object store ran: nothing to compare")
        return 0
    worst = max(ratios, key=lambda s: ratios[s])
    metric = f"planning_ratio_{_label(biggest)}"
    print(f"\nslower object store at {biggest:,} splits: {worst}")
    if biggest < 10_000:
        print(
            f"(the target is for 10k splits; at {_label(biggest)}, "
            "a batch's fixed requests weigh more)"
        )
    elif ratios[worst] > TARGET_RATIO:
        print(f"MISS {metric}={ratios[worst]:.2f} is above the target of {TARGET_RATIO:g}")
    print(f"RESULT {metric}={ratios[worst]:.2f} target=<={TARGET_RATIO:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
