"""A few fault schedules per connector, every record counted (the long run: bench/faults.py).

Each seed draws its schedule (``tests.faults.schedule``): driver SIGKILLs at a moment and
with a batch in flight, Python workers killed mid-task, restarts at another parallelism,
a full or read-only disk under the checkpoint and the state directory, and the connector's
own faults, while the source keeps receiving data. The seeds are chosen so that every kind
of fault runs at least once. A failure prints the schedule, what each fault did and
examples of the records lost or duplicated; replay it with
``python bench/faults.py --connectors NAME --seed N --schedules 1 --verbose``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.faults import disk
from tests.faults.harness import Outcome, extra_kinds, run_schedule
from tests.faults.schedule import draw
from tests.faults.workloads import GeneratorWorkload, workload
from tests.spark.cluster import StandaloneCluster, standalone_cluster
from tests.support.mariadb import mariadb_binaries

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("java") is None, reason="Spark needs Java 17 on PATH"),
]

NEEDS = {
    "mysql": pytest.mark.skipif(
        mariadb_binaries() is None or importlib.util.find_spec("pymysqlreplication") is None,
        reason="needs mariadb-server (mariadbd) and the mysql extra (pip install -e '.[mysql]')",
    )
}
"""What a workload needs besides Java, where it may be missing."""
SEEDS = [
    ("generator", 3, {"disk-full"}),
    ("files", 12, {"file-vanish", "files-burst"}),
    ("kafka", 1, {"broker-pause", "topic-create"}),
    ("cdc", 9, {"db-restart", "evaluate-twice"}),
    ("mysql", 0, {"connections-kill", "evaluate-twice"}),
]
"""Seeds and the faults each must apply. With a disk to mount their schedules hold, besides:
generator 3 the disk full and read-only, workers killed; files 12 (Parquet) every fault of
files and the disk's, its last run without a disk fault (a read-only or full disk may fail
the query before its end's kill); kafka 1 topics deleted, the disk full; cdc 9 (a sink that
writes then counts every batch) the disk full, workers killed. mysql 0 (MariaDB; a sink that
counts then writes every batch) has no disk fault: every connection the source opens killed
for 3.8 s in run 1 at parallelism 1 (which may end the query: the driver's table discovery
and its pin of a batch's binlog position fail on a killed connection), run 2 at 2 without
faults, the final runs at 3. Without a disk, the same schedules without the disk's faults.
Every seed applies a driver SIGKILL (at a moment or with a batch in flight)."""


def check(outcome: Outcome) -> None:
    report = "\n".join([outcome.line(), *outcome.notes, *outcome.count.examples, *outcome.leaks])
    assert outcome.ok, report
    assert outcome.count.records > 0, report
    assert sum(outcome.applied.values()) >= len(outcome.schedule.runs), report


@pytest.mark.parametrize(
    ("name", "seed", "faults"),
    [
        pytest.param(name, seed, faults, id=f"{name}-{seed}", marks=NEEDS.get(name, ()))
        for name, seed, faults in SEEDS
    ],
)
def test_a_fault_schedule_loses_and_repeats_no_record(
    name: str, seed: int, faults: set[str], tmp_path: Path
) -> None:
    source = workload(name, seed)
    schedule = draw(seed, name, source.kinds, extra_kinds(), source.sinks)
    outcome = run_schedule(schedule, source, tmp_path)
    check(outcome)
    assert faults & set(schedule.kinds()) <= set(outcome.applied), outcome.notes
    assert {"driver-kill", "driver-kill-in-flight"} & set(outcome.applied), outcome.notes


def test_the_schedule_that_found_the_rescale_bug(tmp_path: Path) -> None:
    """Files seed 2 drawn without disk faults, as when it failed: run 3 restarted 3 slots
    as 1, applied reader events of a slot gone and failed ('reader 1 is not registered'),
    see ``tests/spark/test_events.py``, the test of events of a slot a rescale removed."""
    source = workload("files", 2)
    schedule = draw(2, "files", source.kinds)
    assert [run.parallelism for run in schedule.runs] == [2, 3, 1]
    check(run_schedule(schedule, source, tmp_path))


@pytest.mark.parametrize("kind", ["s3", "azure"])
def test_a_fault_schedule_with_the_state_on_an_object_store(kind: str, tmp_path: Path) -> None:
    """Generator seed 0's first run (a worker killed, then the driver with a batch in
    flight) with ``stateDir`` on moto's S3 or on Azurite: reader events, the ledger and the
    owner token all on the store; every record once, no store secret anywhere. About two
    minutes each; ``bench/faults.py --state-store s3|azure`` runs whole schedules."""
    from tests.support.objectstores import (
        Azurite,
        MotoS3,
        StoreUnderTest,
        azurite_installed,
        moto_installed,
    )

    if not (moto_installed() if kind == "s3" else azurite_installed()):
        pytest.skip(f"no {kind} server installed (pip install -e '.[objectstore]', bootstrap)")
    source = GeneratorWorkload(rows=300)
    schedule = draw(0, "generator", source.kinds, (), source.sinks)
    schedule = dataclasses.replace(schedule, runs=schedule.runs[:1])
    with MotoS3.start(tmp_path) if kind == "s3" else Azurite.start(tmp_path) as server:
        store = StoreUnderTest(kind, server)
        outcome = run_schedule(schedule, source, tmp_path / "run", state_store=store)
        objects = store.fs.find(store.url("state-generator-0"))
    check(outcome)
    assert any(o.endswith("owner.json") for o in objects), objects


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    with standalone_cluster(root=tmp_path_factory.mktemp("cluster")) as running:
        yield running


def test_on_a_standalone_cluster_with_executors_killed(
    cluster: StandaloneCluster, tmp_path: Path
) -> None:
    """Files 2 (CSV) on a master and two workers: executors and Python workers killed,
    files vanishing and bursting, drivers killed."""
    source = workload("files", 2)
    schedule = draw(2, "files", source.kinds, extra_kinds(cluster=True))
    assert "executor-kill" in schedule.kinds()
    outcome = run_schedule(
        schedule, source, tmp_path, master=cluster.master_url, executors=cluster.pids
    )
    check(outcome)
    assert outcome.applied["executor-kill"] >= 1, outcome.notes


def test_disk_faults_are_drawn_where_a_disk_can_be_mounted() -> None:
    """The disk faults need a tmpfs mount (root here); say so where they cannot run."""
    if not disk.available():
        pytest.skip("this process may not mount a tmpfs: no disk faults are drawn")
    assert {"disk-full", "disk-read-only"} <= set(extra_kinds())
