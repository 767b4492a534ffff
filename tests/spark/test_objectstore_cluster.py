"""The files source on a standalone cluster whose workers share no disk: the landing zone, the
source's state (``stateDir``) and the sink on the object store, a driver SIGKILL between a
batch's output and its commit, every record once.

The cluster: the master of :func:`tests.spark.cluster.standalone_cluster`, plus two workers
started here, each on a loopback address of its own (``127.0.0.2``, ``127.0.0.3``) with its
own work folder (``SPARK_WORKER_DIR``), local folders (``SPARK_LOCAL_DIRS``, where its
executors keep their block manager files) and ``TMPDIR``, and one core, so that a query with
``spark.cores.max=2`` gets one executor on each. Only the driver has a local folder of
splitflow's: the query's ``checkpointLocation``.

The driver is this file run as a script (``python <this file> <config.json>``, a
:class:`~tests.spark.cluster.ScriptDriver`). It streams ``splitflow-files`` (JSON files
under ``<store>/landing``, byte-range splits, ``cleanSource=delete``, ``stateDir`` at
``<store>/state``) through ``foreachBatch``: each batch's rows are collected to the driver,
each row tagged with the working folder of the executor that read it, and written as one
object ``<store>/out/<batch id>.json``; a replayed batch writes the same name again, so the
sink is exactly-once if the source is. (The installed Spark has no hadoop-aws or
hadoop-azure jars, so neither the checkpoint nor a file sink can be on the store.)

1. run 1 reads the first files; more land. After its first batch with rows and an id of at
   least 2 has written its output, the driver holds that batch (it sleeps inside
   ``foreachBatch``): the batch's tasks have finished, it is not committed. The test lists
   the batch's reader events on the store, keeps its output, and SIGKILLs the driver;
2. run 2, on the same checkpoint, replays that batch and reads the rest while more files
   land; then it stops;
3. every landed row is in the outputs of committed batches exactly once; the replay read the
   same rows as the killed attempt; rows were read on both workers; the tasks' reader events
   were on the store; and nothing of splitflow's state was ever seen under the workers'
   folders (watched during the runs: Spark deletes an application's local folders when it
   ends) nor anywhere under the test's folder but the checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from tests.spark.cluster import (
    StandaloneCluster,
    _start,
    _wait_until,
    daemon_env,
    free_port,
    script_driver,
    standalone_cluster,
)
from tests.spark.support import log_ids, wait_until
from tests.spark.test_files_e2e import SCHEMA_DDL, expected_rows, rows_of

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("java") is None, reason="Spark needs Java 17 on PATH"),
]

FILES = 12
"""JSON files of 20 rows each: 4 before run 1, 4 during run 1, 4 during run 2."""
HOLD_FROM = 2
"""Run 1 holds (and the test kills it at) its first batch with rows and an id >= this."""

Row = tuple[str, int, str]

# -- the driver: this file run as a script ---------------------------------------------------


def run_driver(config: dict[str, Any]) -> None:
    """Stream the landing zone into ``<store>/out`` until ``<control>/stop`` (see module doc)."""
    import fsspec  # type: ignore[import-untyped]
    from pyspark.sql import functions as F
    from tests.spark.support import driver_session

    run, control = int(config["run"]), Path(config["control"])
    spark = driver_session(f"splitflow-objectstore-cluster-run-{run}", config["master"])
    out_fs, out_root = fsspec.core.url_to_fs(config["out"], **config["out_options"])

    # The working folder of the executor that runs the task: <work>/<app id>/<executor id>.
    where = F.udf(lambda _: os.getcwd(), "string")

    def sink(batch: Any, batch_id: int) -> None:
        rows = batch.select(
            "file", "n", "pad", where("n").alias("cwd"), F.spark_partition_id().alias("task")
        ).collect()
        body = {"run": run, "batch": batch_id, "rows": [list(r) for r in rows]}
        out_fs.pipe_file(f"{out_root}/{batch_id:06d}.json", json.dumps(body).encode())
        if config["hold_from"] is not None and rows and batch_id >= config["hold_from"]:
            (control / f"held-{batch_id}").touch()
            time.sleep(600)  # the test kills the driver now: the batch is never committed

    reader = spark.readStream.format("splitflow-files").schema(SCHEMA_DDL)
    for key, value in config["source"].items():
        reader = reader.option(key, value)
    query = (
        reader.load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", config["checkpoint"])
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    (control / f"started-{run}").touch()

    def stop_requested() -> bool:
        if query.exception() is not None:
            raise RuntimeError(f"the query failed: {query.exception()}")
        return (control / "stop").exists()

    wait_until("a stop request", stop_requested, 600, 0.1)
    query.processAllAvailable()
    query.stop()
    spark.stop()


# -- the cluster: a master, and two workers that share no folder -------------------------------


def worker_folders(cluster: StandaloneCluster, worker: int) -> dict[str, Path]:
    """Worker ``worker``'s own folders: ``work`` (``cluster.work_dir``), ``local``, ``tmp``."""
    return {
        "work": cluster.work_dir(worker),
        "local": cluster.root / f"local-{worker}",
        "tmp": cluster.root / f"tmp-{worker}",
    }


def worker_host(worker: int) -> str:
    return f"127.0.0.{worker + 2}"


@contextmanager
def cluster_without_shared_folders(root: Path, workers: int = 2) -> Iterator[StandaloneCluster]:
    """:func:`standalone_cluster`'s master (and its clean-up of every process it started),
    plus ``workers`` one-core workers, each on its own loopback address with its own folders
    (:func:`worker_folders`)."""
    with standalone_cluster(workers=0, root=root) as cluster:
        for worker in range(workers):
            folders = worker_folders(cluster, worker)
            for folder in folders.values():
                folder.mkdir(parents=True, exist_ok=True)
            env = daemon_env(
                cluster.root,
                {
                    "SPARK_LOCAL_IP": worker_host(worker),
                    "SPARK_WORKER_DIR": str(folders["work"]),
                    "SPARK_LOCAL_DIRS": str(folders["local"]),
                    "TMPDIR": str(folders["tmp"]),
                },
            )
            args = [
                *("--host", worker_host(worker), "--port", str(free_port())),
                *("--webui-port", str(free_port()), "--work-dir", str(folders["work"])),
                *("--cores", "1", "--memory", "1g"),
            ]
            _start(
                cluster,
                f"worker-{worker}",
                ["org.apache.spark.deploy.worker.Worker", cluster.master_url, *args],
                env,
            )
        _wait_until(
            f"{workers} ALIVE workers", lambda: cluster.alive_workers() >= workers, cluster, 90
        )
        yield cluster


STATE_NAMES = re.compile(
    r"(^|/)(events|ledger|owner\.json|snapshot-\d+\.json|delta-\d+\.json)(/|$)|\.\d+\.tmp$"
)
"""A path of splitflow's state-directory layout (``statedir.py``, ``events.py``,
``ledger.py``), or a local state write's temporary file."""


def state_paths(root: Path, skip: Path | None = None) -> list[str]:
    """Paths under ``root`` (but not under ``skip``) that look like splitflow's state."""
    found = []
    for folder, dirs, files in os.walk(root):
        if skip is not None and Path(folder) == skip:
            dirs.clear()
            continue
        for name in [*dirs, *files]:
            relative = (Path(folder) / name).relative_to(root).as_posix()
            if STATE_NAMES.search(relative):
                found.append(relative)
    return found


class FolderWatch:
    """Every path seen under ``folders`` (relative, prefixed with the folder's name), polled
    every 0.2 s on a daemon thread while the ``with`` block runs."""

    def __init__(self, folders: list[Path]) -> None:
        self.folders = folders
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _scan(self) -> None:
        for root in self.folders:
            for folder, dirs, files in os.walk(root):
                for name in [*dirs, *files]:
                    relative = (Path(folder) / name).relative_to(root.parent).as_posix()
                    self.seen.add(relative)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self._scan()

    def __enter__(self) -> FolderWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._scan()


# -- the test -----------------------------------------------------------------------------------


def outputs(store: Any) -> dict[int, dict[str, Any]]:
    """The sink's objects, by batch id."""
    store.fs.invalidate_cache()
    if not store.fs.exists(store.url("out")):
        return {}
    found = {}
    for name in store.fs.ls(store.url("out"), detail=False):
        body = json.loads(store.fs.cat_file(name))
        found[int(body["batch"])] = body
    return found


def data_rows(body: dict[str, Any]) -> list[Row]:
    return sorted((str(r[0]), int(r[1]), str(r[2])) for r in body["rows"])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """One cluster for both stores (each test is an application of its own)."""
    with cluster_without_shared_folders(tmp_path_factory.mktemp("cluster")) as running:
        yield running


@pytest.mark.timeout(480)
def test_files_and_state_on_the_store_on_two_workers_sharing_no_disk_are_read_exactly_once(
    tmp_path: Path, object_store: Any, cluster: StandaloneCluster
) -> None:
    store = object_store
    names = [f"f{i:03d}.json" for i in range(FILES)]

    def land(batch: list[str]) -> None:  # one PUT each: a file appears whole
        for name in batch:
            body = "".join(json.dumps(r) + "\n" for r in rows_of(name)).encode()
            store.fs.pipe_file(store.url("landing", name), body)

    control, checkpoint = tmp_path / "control", tmp_path / "checkpoint"
    control.mkdir()
    source = {
        "path": store.url("landing"),
        "format": "json",
        "parallelism": "2",
        "maxSplitBytes": "400",
        "maxFilesPerBatch": "2",
        "discoveryInterval": "200ms",
        "cleanSource": "delete",
        "stateDir": store.url("state"),
        **store.spark_options("path"),
        **store.spark_options("stateDir"),
    }
    config = {
        "control": str(control),
        "checkpoint": str(checkpoint),
        "source": source,
        "out": store.url("out"),
        "out_options": store.options,
    }

    def committed() -> list[int]:
        return log_ids(checkpoint, "commits")

    land(names[:4])
    config["master"] = cluster.master_url
    work = {w: cluster.work_dir(w).resolve() for w in range(2)}
    with FolderWatch([f for w in range(2) for f in worker_folders(cluster, w).values()]) as watch:
        # Run 1: reads, more files land; killed holding a batch whose output is written.
        with script_driver(
            __file__, tmp_path, 1, {**config, "run": 1, "hold_from": HOLD_FROM}
        ) as run1:
            wait_until("run 1's first commit", lambda: run1.check_alive() and committed(), 180)
            land(names[4:8])

            def held() -> list[int]:  # the batch run 1 holds, once it holds one
                run1.check_alive()
                return sorted(int(p.name.split("-")[1]) for p in control.glob("held-*"))

            killed = wait_until("run 1 to hold a batch", held, 120)[0]
            store.fs.invalidate_cache()
            event_folders = store.fs.ls(store.url("state", "events"), detail=False)
            last = max(event_folders, key=lambda f: int(f.rstrip("/").rsplit("/", 1)[-1]))
            event_tasks = {int(n.rsplit("/", 1)[-1]) for n in store.fs.ls(last, detail=False)}
            killed_attempt = outputs(store)[killed]
            run1.kill()
        assert killed not in committed(), (killed, committed())

        # Run 2: replays the killed batch, reads the rest, stops once every row is out.
        with script_driver(__file__, tmp_path, 2, {**config, "run": 2, "hold_from": None}) as run2:
            wait_until(
                "run 2", lambda: run2.check_alive() and (control / "started-2").exists(), 180
            )
            land(names[8:])

            def all_rows_out() -> bool:
                run2.check_alive()
                seen = {row for body in outputs(store).values() for row in data_rows(body)}
                return seen >= set(expected_rows(names))

            wait_until("every landed row in the sink", all_rows_out, 180, step=0.5)
            (control / "stop").touch()
            run2.process.wait(timeout=120)
            assert run2.process.returncode == 0, run2.tail()

    # Exactly once, over the outputs of committed batches (all of them: run 2 stopped cleanly).
    written = outputs(store)
    assert set(written) <= set(committed()), (sorted(written), committed())
    rows = [row for body in written.values() for row in data_rows(body)]
    twice = sorted(r for r, n in Counter(rows).items() if n > 1)
    missing = sorted(set(expected_rows(names)) - set(rows))
    assert not twice, f"{len(twice)} rows more than once, e.g. {twice[:5]}"
    assert not missing, f"{len(missing)} rows missing, e.g. {missing[:5]}"
    assert sorted(rows) == expected_rows(names)

    # The killed batch was replayed by run 2, with the rows its killed attempt read.
    assert killed in committed()
    assert written[killed]["run"] == 2
    assert data_rows(written[killed]) == data_rows(killed_attempt)

    # Both workers read rows (each row names the executor folder that read it) ...
    def worker_of(cwd: str) -> int:
        return next(w for w, folder in work.items() if Path(cwd).resolve().is_relative_to(folder))

    cwds = [str(r[3]) for body in written.values() for r in body["rows"]]
    per_worker = Counter(worker_of(cwd) for cwd in cwds)
    executors = sorted({"/".join(Path(cwd).parts[-2:]) for cwd in cwds})  # <app id>/<exec id>
    print(
        f"{len(rows)} rows exactly once; batch {killed} killed and replayed; "
        f"rows per worker {dict(per_worker)}; executors {executors}"
    )
    assert set(per_worker) == {0, 1}, per_worker

    # ... and their tasks' reader events were on the store (one object per task of the held
    # batch, whichever worker ran it).
    tasks_with_rows = {int(r[4]) for r in killed_attempt["rows"]}
    assert tasks_with_rows <= event_tasks, (tasks_with_rows, event_tasks)
    store.fs.invalidate_cache()
    assert store.fs.exists(store.url("state", "owner.json"))

    # Nothing of splitflow's state under the workers' folders, ever, nor anywhere local but
    # the driver's checkpoint; the workers' executors did use their own local folders.
    assert not [p for p in watch.seen if STATE_NAMES.search(p)], sorted(watch.seen)
    for worker in range(2):
        local = f"local-{worker}/"
        assert any(p.startswith(local) and "blockmgr-" in p for p in watch.seen), sorted(watch.seen)
    assert state_paths(cluster.root) == []
    assert state_paths(tmp_path, skip=checkpoint) == []


def test_the_state_check_finds_a_state_directory_left_in_a_workers_folder(tmp_path: Path) -> None:
    """What splitflow writes to a local ``stateDir`` (here, as a relative stateDir would end
    up, under an executor's working folder) is what the cluster test looks for."""
    from splitflow.spark.events import EventStore
    from splitflow.spark.ledger import LedgerStore
    from splitflow.spark.statedir import Owner

    state = tmp_path / "work-0" / "app-1" / "0" / "state"
    owner = Owner(str(state))
    owner.begin(None)
    owner.check()
    EventStore(str(state)).write(3, 1, 0, [])
    LedgerStore(str(state)).write(3, frozenset({"a"}))
    found = state_paths(tmp_path)
    tops = {p.removeprefix("work-0/app-1/0/state/").split("/")[0] for p in found}
    assert tops == {"owner.json", "events", "ledger"}, found
    assert state_paths(tmp_path, skip=state) == []


if __name__ == "__main__":
    run_driver(json.loads(Path(sys.argv[1]).read_text()))
