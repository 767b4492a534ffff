"""Exactly-once under random fault schedules: every record counted, per connector.

For each connector, ``--schedules`` schedules are drawn from consecutive seeds
(:mod:`tests.faults.schedule`) and run against real Spark (local mode) while the source
keeps receiving data (:mod:`tests.faults.harness`): driver SIGKILLs (also with a batch in
flight), Python workers killed mid-task, restarts at another parallelism, the
connector's own faults (:mod:`tests.faults.workloads`) and, for CDC, a sink that reads
every batch twice (``evaluate-twice``). After each, the sink is recounted against the
source. A failing schedule prints its seed; replay it with ``--seed N --schedules 1``.

    python bench/faults.py --schedules 50            # every connector
    python bench/faults.py --connectors files --seed 7 --schedules 1
    python bench/faults.py --quick                   # seed 0's first run, a small generator
    python bench/faults.py --state-store s3          # stateDir on moto's S3 (or: azure)

One line per connector, the fault kinds applied with their counts, then
``RESULT lost=<n> duplicated=<n> schedules=<n> target=0`` (the target is for lost and
duplicated).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.faults

from tests.faults.harness import DISK_KINDS, extra_kinds, run_schedule
from tests.faults.schedule import draw
from tests.faults.workloads import WORKLOADS, GeneratorWorkload, workload
from tests.spark.cluster import standalone_cluster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--schedules", type=int, default=5, help="schedules per connector")
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--connectors", default=",".join(WORKLOADS))
    parser.add_argument(
        "--quick",
        action="store_true",
        help="the first run of seed 0 on a small generator (under a minute)",
    )
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--verbose", action="store_true", help="print what each fault did")
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="on a local standalone cluster (a master, two workers), with executor kills too",
    )
    parser.add_argument(
        "--state-store",
        choices=("s3", "azure"),
        help="stateDir on an object store on loopback (moto's S3, Azurite) instead of the "
        "local folder; the disk's faults are not drawn then",
    )
    args = parser.parse_args()
    names = ["generator"] if args.quick else args.connectors.split(",")
    count = 1 if args.quick else args.schedules
    root = args.workdir or Path(tempfile.mkdtemp(prefix="splitflow-faults-"))
    with contextlib.ExitStack() as stack:
        spark: dict[str, Any] = {}
        if args.cluster:
            cluster = stack.enter_context(standalone_cluster(root=root / "cluster"))
            spark = {"master": cluster.master_url, "executors": cluster.pids}
        if args.state_store:
            spark["state_store"] = stack.enter_context(state_store(args.state_store, root))
        run_all(args, names, count, root, spark)


@contextlib.contextmanager
def state_store(kind: str, root: Path) -> Any:
    """A bucket on moto's S3 server or a container on Azurite, on loopback, for stateDir."""
    from tests.support.objectstores import Azurite, MotoS3, StoreUnderTest

    root.mkdir(parents=True, exist_ok=True)
    server: Any = MotoS3.start(root) if kind == "s3" else Azurite.start(root)
    with server:
        yield StoreUnderTest(kind, server)


def run_all(
    args: argparse.Namespace, names: list[str], count: int, root: Path, spark: dict[str, Any]
) -> None:
    """Run the schedules; print a line each, one per connector, the faults, and RESULT
    (after a MISS line naming the failing schedules, if any)."""
    lost = duplicated = schedules = 0
    applied: Counter[str] = Counter()
    failing: list[str] = []
    for name in names:
        per = Counter[str]()
        began = time.monotonic()
        for seed in range(args.seed, args.seed + count):
            source = GeneratorWorkload(rows=300) if args.quick else workload(name, seed)
            extra = extra_kinds(cluster="master" in spark)
            if "state_store" in spark:  # the state is not on the disk the faults hit
                extra = tuple(k for k in extra if k not in DISK_KINDS)
            schedule = draw(seed, name, source.kinds, extra, source.sinks)
            if args.quick:
                schedule = dataclasses.replace(schedule, runs=schedule.runs[:1])
            outcome = run_schedule(schedule, source, root / f"{name}-{seed}", **spark)
            print(outcome.line(), flush=True)
            if args.verbose or not outcome.ok:
                for note in [*outcome.notes, *outcome.count.examples, *outcome.leaks[:5]]:
                    print(f"    {note}", flush=True)
            per.update(lost=outcome.count.lost, duplicated=outcome.count.duplicated)
            per.update(records=outcome.count.records, skipped=outcome.count.skipped)
            applied.update(outcome.applied)
            if outcome.error is None:
                schedules += 1
            if not outcome.ok:
                failing.append(f"{name} seed {seed}")
        lost += per["lost"]
        duplicated += per["duplicated"]
        print(
            f"{name}: {count} schedules, {per['records']:,} records, lost={per['lost']} "
            f"duplicated={per['duplicated']} skipped={per['skipped']} "
            f"({time.monotonic() - began:.0f}s)",
            flush=True,
        )
    print("faults applied: " + ", ".join(f"{k} {n}" for k, n in sorted(applied.items())))
    if failing:
        print(
            "MISS failing schedules (replay with --connectors NAME --seed N --schedules 1 "
            "--verbose): " + "; ".join(failing)
        )
    print(f"RESULT lost={lost} duplicated={duplicated} schedules={schedules} target=0")


if __name__ == "__main__":
    main()
